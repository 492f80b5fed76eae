/* softmax.cu - softmax over the last dimension, forward and backward; one
 * block per row. CPU reference: k_softmax and k_softmax_backward in
 * backends/cpu/kernels.c (sums there in double, here in f32). */
#include "common.cuh"

template <class T>
DEV void row_max_sum(const T *xr, int64_t cols, float &m, float &s, float *sh) {
  m = -INFINITY, s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) softmax_merge(m, s, to_f(xr[j]), 1.0f);
  block_softmax_stats(m, s, sh);
}

template <class T>
__global__ void k_softmax(T *y, const T *x, int64_t cols) {
  __shared__ float sh[64];
  const T *xr = x + (int64_t)blockIdx.x * cols;
  T *yr = y + (int64_t)blockIdx.x * cols;
  float m, s;
  row_max_sum(xr, cols, m, s, sh);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = from_f<T>(fexp(to_f(xr[j]) - m) / s);
}

template <class T>
__global__ void k_softmax_backward(T *dx, const T *dy, const T *x, int64_t cols, bool acc) {
  __shared__ float sh[64];
  int64_t off = (int64_t)blockIdx.x * cols;
  float m, s;
  row_max_sum(x + off, cols, m, s, sh);
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dot += fexp(to_f(x[off + j]) - m) / s * to_f(dy[off + j]);
  dot = block_sum(dot, sh);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float yj = fexp(to_f(x[off + j]) - m) / s;
    put(&dx[off + j], yj * (to_f(dy[off + j]) - dot), acc);
  }
}

void gpu_softmax(gpu_stream *s, int dt, void *y, const void *x, int64_t rows, int64_t cols) {
  if (cols == 0) return;
  DISPATCH(dt, T, launch(k_softmax<T>, (unsigned)rows, ROW_THREADS, 0, s, (T *)y, (const T *)x, cols));
}

void gpu_softmax_backward(gpu_stream *s, int dt, void *dx, const void *dy, const void *x, int64_t rows, int64_t cols,
                          bool acc) {
  if (!dx || cols == 0) return;
  DISPATCH(dt, T, launch(k_softmax_backward<T>, (unsigned)rows, ROW_THREADS, 0, s, (T *)dx, (const T *)dy, (const T *)x, cols, acc));
}
