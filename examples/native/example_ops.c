/* example_ops.c - the native kernels of examples/native.plan: LeCun's scaled
 * tanh, y = 1.7159 tanh(2x/3), forward and backward, for weft's CPU backend.
 *
 * weft calls them through libffi with the convention of docs/language.md
 * ("Native kernels"): f32 tensors packed row-major, outputs first, then
 * inputs, then one int64_t per dimension of the operator's iteration space
 * (here b and h of `scaled_tanh(x: [b, h])`), for the part being computed.
 * Build: sh examples/native/build.sh examples/native */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define EXAMPLE_A 1.7159f
#define EXAMPLE_S (2.0f / 3.0f)

/* out[b, h] = A tanh(S x[b, h]). */
void scaled_tanh_forward(float *out, const float *x, int64_t b, int64_t h) {
  int64_t n = b * h;
  for (int64_t i = 0; i < n; i++) out[i] = EXAMPLE_A * tanhf(EXAMPLE_S * x[i]);
}

/* dx = dout A S (1 - tanh(S x)^2); dx NULL: the gradient is not wanted. */
void scaled_tanh_backward(float *dx, const float *dout, const float *x, int64_t b, int64_t h) {
  if (!dx) return;
  int64_t n = b * h;
  for (int64_t i = 0; i < n; i++) {
    float t = tanhf(EXAMPLE_S * x[i]);
    dx[i] = dout[i] * EXAMPLE_A * EXAMPLE_S * (1.0f - t * t);
  }
}
