/* gelu.cu - GELU with the tanh approximation (GPT-2's gelu_new, gelu_f in
 * common.cuh), forward and backward; a linear's product fuses it where
 * cuBLASLt can (gpu_gemm_epi, matmul.cu). CPU reference: k_gelu and k_gelu_backward in
 * backends/cpu/kernels.c. */
#include "common.cuh"

template <class T>
__global__ void k_gelu(T *y, const T *x, int64_t n) {
  GRID_STRIDE(i, n) {
    y[i] = from_f<T>(gelu_f(to_f(x[i])));
  }
}

template <class T>
__global__ void k_gelu_backward(T *dx, const T *dy, const T *x, int64_t n, bool acc) {
  GRID_STRIDE(i, n) {
    put(&dx[i], to_f(dy[i]) * gelu_grad_f(to_f(x[i])), acc);
  }
}

void gpu_gelu(gpu_stream *s, int dt, void *y, const void *x, int64_t n) {
  DISPATCH(dt, T, launch(k_gelu<T>, blocks_for(n, 256), 256, 0, s, (T *)y, (const T *)x, n));
}

void gpu_gelu_backward(gpu_stream *s, int dt, void *dx, const void *dy, const void *x, int64_t n, bool acc) {
  if (!dx) return;
  DISPATCH(dt, T, launch(k_gelu_backward<T>, blocks_for(n, 256), 256, 0, s, (T *)dx, (const T *)dy, (const T *)x, n, acc));
}
