/* residual.cu - the residual add. CPU reference: k_add in
 * backends/cpu/kernels.c; its backward copies or adds dy (gpu_convert). */
#include "common.cuh"

template <class T>
__global__ void k_add(T *y, const T *a, const T *b, int64_t n) {
  GRID_STRIDE(i, n) y[i] = from_f<T>(to_f(a[i]) + to_f(b[i]));
}

void gpu_add(gpu_stream *s, int dt, void *y, const void *a, const void *b, int64_t n) {
  DISPATCH(dt, T, launch(k_add<T>, blocks_for(n, 256), 256, 0, s, (T *)y, (const T *)a, (const T *)b, n));
}
