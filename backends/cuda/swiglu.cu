/* swiglu.cu - SiLU and SwiGLU (silu(gate) * up), forward and backward.
 * CPU reference: k_silu, k_swiglu and their backwards in
 * backends/cpu/kernels.c. */
#include "common.cuh"

DEV float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

/* d silu(v) / dv = s (1 + v (1 - s)), s = sigmoid(v). */
DEV float silu_grad(float v) {
  float s = sigmoid(v);
  return s * (1.0f + v * (1.0f - s));
}

template <class T>
__global__ void k_silu(T *y, const T *x, int64_t n) {
  GRID_STRIDE(i, n) {
    float v = to_f(x[i]);
    y[i] = from_f<T>(v * sigmoid(v));
  }
}

template <class T>
__global__ void k_silu_backward(T *dx, const T *dy, const T *x, int64_t n, bool acc) {
  GRID_STRIDE(i, n) put(&dx[i], to_f(dy[i]) * silu_grad(to_f(x[i])), acc);
}

template <class T>
__global__ void k_swiglu(T *y, const T *gate, const T *up, int64_t n) {
  GRID_STRIDE(i, n) {
    float g = to_f(gate[i]);
    y[i] = from_f<T>(g * sigmoid(g) * to_f(up[i]));
  }
}

template <class T>
__global__ void k_swiglu_backward(T *dgate, T *dup, const T *dy, const T *gate, const T *up, int64_t n, bool acc) {
  GRID_STRIDE(i, n) {
    float g = to_f(gate[i]), d = to_f(dy[i]);
    if (dgate) put(&dgate[i], d * to_f(up[i]) * silu_grad(g), acc);
    if (dup) put(&dup[i], d * (g * sigmoid(g)), acc);
  }
}

void gpu_silu(gpu_stream *s, int dt, void *y, const void *x, int64_t n) {
  DISPATCH(dt, T, launch(k_silu<T>, blocks_for(n, 256), 256, 0, s, (T *)y, (const T *)x, n));
}

void gpu_silu_backward(gpu_stream *s, int dt, void *dx, const void *dy, const void *x, int64_t n, bool acc) {
  if (!dx) return;
  DISPATCH(dt, T, launch(k_silu_backward<T>, blocks_for(n, 256), 256, 0, s, (T *)dx, (const T *)dy, (const T *)x, n, acc));
}

void gpu_swiglu(gpu_stream *s, int dt, void *y, const void *gate, const void *up, int64_t n) {
  DISPATCH(dt, T, launch(k_swiglu<T>, blocks_for(n, 256), 256, 0, s, (T *)y, (const T *)gate, (const T *)up, n));
}

void gpu_swiglu_backward(gpu_stream *s, int dt, void *dgate, void *dup, const void *dy, const void *gate,
                         const void *up, int64_t n, bool acc) {
  if (!dgate && !dup) return;
  DISPATCH(dt, T, launch(k_swiglu_backward<T>, blocks_for(n, 256), 256, 0, s, (T *)dgate, (T *)dup, (const T *)dy,
                         (const T *)gate, (const T *)up, n, acc));
}
