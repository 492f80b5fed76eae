/* gelu.cu - GELU with the tanh approximation (GPT-2's gelu_new), forward
 * and backward. CPU reference: k_gelu and k_gelu_backward in
 * backends/cpu/kernels.c. */
#include "common.cuh"

#define GELU_C 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

template <class T>
__global__ void k_gelu(T *y, const T *x, int64_t n) {
  GRID_STRIDE(i, n) {
    float v = to_f(x[i]);
    y[i] = from_f<T>(0.5f * v * (1.0f + tanhf(GELU_C * (v + GELU_A * v * v * v))));
  }
}

template <class T>
__global__ void k_gelu_backward(T *dx, const T *dy, const T *x, int64_t n, bool acc) {
  GRID_STRIDE(i, n) {
    float v = to_f(x[i]);
    float t = tanhf(GELU_C * (v + GELU_A * v * v * v));
    float du = GELU_C * (1.0f + 3.0f * GELU_A * v * v);
    float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
    put(&dx[i], to_f(dy[i]) * d, acc);
  }
}

void gpu_gelu(gpu_stream *s, int dt, void *y, const void *x, int64_t n) {
  DISPATCH(dt, T, launch(k_gelu<T>, blocks_for(n, 256), 256, 0, s, (T *)y, (const T *)x, n));
}

void gpu_gelu_backward(gpu_stream *s, int dt, void *dx, const void *dy, const void *x, int64_t n, bool acc) {
  if (!dx) return;
  DISPATCH(dt, T, launch(k_gelu_backward<T>, blocks_for(n, 256), 256, 0, s, (T *)dx, (const T *)dy, (const T *)x, n, acc));
}
