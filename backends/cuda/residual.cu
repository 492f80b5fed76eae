/* residual.cu - the residual add. CPU reference: k_add and k_add_backward
 * in backends/cpu/kernels.c; the backward copies or adds dy into both
 * gradients in one launch. */
#include "common.cuh"

template <class T>
__global__ void k_add(T *y, const T *a, const T *b, int64_t n) {
  GRID_STRIDE(i, n) y[i] = from_f<T>(to_f(a[i]) + to_f(b[i]));
}

void gpu_add(gpu_stream *s, int dt, void *y, const void *a, const void *b, int64_t n) {
  DISPATCH(dt, T, launch(k_add<T>, blocks_for(n, 256), 256, 0, s, (T *)y, (const T *)a, (const T *)b, n));
}

template <class T>
__global__ void k_add_backward(T *da, T *db, const T *dy, int64_t n, bool acc) {
  GRID_STRIDE(i, n) {
    float g = to_f(dy[i]);
    if (da) put(&da[i], g, acc);
    if (db) put(&db[i], g, acc);
  }
}

void gpu_add_backward(gpu_stream *s, int dt, void *da, void *db, const void *dy, int64_t n, bool acc) {
  if (!da && !db) return;
  DISPATCH(dt, T, launch(k_add_backward<T>, blocks_for(n, 256), 256, 0, s, (T *)da, (T *)db, (const T *)dy, n, acc));
}
