/* rope.cu - rotary position embedding (rotate_half pairing, as Hugging
 * Face's Llama), forward and backward. CPU reference: k_rotary and
 * k_rotary_backward in backends/cpu/kernels.c. Angles in double: a position
 * of thousands times a frequency near 1 needs more than f32's 24 bits. */
#include "common.cuh"

template <class T>
__global__ void k_rotary(T *y, const T *x, int64_t b, int64_t sq, int64_t heads, int64_t dh, int64_t pos0,
                         double base, double sign, bool acc) {
  int64_t half = dh / 2, width = heads * dh;
  GRID_STRIDE(e, b * sq * heads * half) {
    int64_t i = e % half, r = e / half;
    int64_t hd = r % heads;
    r /= heads;
    int64_t si = r % sq, bi = r / sq;
    double angle = (double)(pos0 + si) * pow(base, -2.0 * (double)i / (double)dh);
    double c = cos(angle), sn = sign * sin(angle);
    int64_t off = (bi * sq + si) * width + hd * dh;
    double x1 = to_f(x[off + i]), x2 = to_f(x[off + i + half]);
    put(&y[off + i], (float)(x1 * c - x2 * sn), acc);
    put(&y[off + i + half], (float)(x2 * c + x1 * sn), acc);
  }
}

void gpu_rotary(gpu_stream *s, int dt, void *y, const void *x, int64_t b, int64_t sq, int64_t heads, int64_t dh,
                int64_t pos0, double base, double sign, bool acc) {
  if (!y) return;
  DISPATCH(dt, T, launch(k_rotary<T>, blocks_for(b * sq * heads * (dh / 2), 256), 256, 0, s, (T *)y, (const T *)x, b,
                         sq, heads, dh, pos0, base, sign, acc));
}
