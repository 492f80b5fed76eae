/* mma.cu - a check of mma.cuh's layouts on the device: one warp multiplies
 * a 16 x 16 tile by a 16 x 16 one (two products of 16 x 8), B read both as
 * stored [n][k] and as stored [k][n], and the first result again through
 * its registers taken as the A operand of a second product (the way a
 * kernel feeds P to P V); then A B again with the operands through
 * ldmatrix from shared memory, B stored [k][n] (.trans) and [n][k].
 * test_kernels compares the five with the CPU's. */
#include "mma.cuh"

template <class T>
__global__ void k_mma_check(float *d, const T *a, const T *b_nk, const T *b_kn) {
  int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  uint32_t fa[4], fb[2], pa[4];
  float c[2][4], z[4] = {0, 0, 0, 0};
  load_a(fa, a, 16, lane);
  for (int h = 0; h < 2; h++) {
    load_b_nk(fb, b_nk + h * 8 * 16, 16, lane);
    mma16816<T>(c[h], fa, fb, z);
    d[(g)*16 + h * 8 + 2 * t] = c[h][0], d[(g)*16 + h * 8 + 2 * t + 1] = c[h][1];
    d[(g + 8) * 16 + h * 8 + 2 * t] = c[h][2], d[(g + 8) * 16 + h * 8 + 2 * t + 1] = c[h][3];
    float e[4];
    load_b_kn(fb, b_kn + h * 8, 16, lane);
    mma16816<T>(e, fa, fb, z);
    float *d2 = d + 256;
    d2[(g)*16 + h * 8 + 2 * t] = e[0], d2[(g)*16 + h * 8 + 2 * t + 1] = e[1];
    d2[(g + 8) * 16 + h * 8 + 2 * t] = e[2], d2[(g + 8) * 16 + h * 8 + 2 * t + 1] = e[3];
  }
  /* the result, rounded to T, as an A operand: (A B) B */
  pa[0] = pack2<T>(c[0][0], c[0][1]), pa[1] = pack2<T>(c[0][2], c[0][3]);
  pa[2] = pack2<T>(c[1][0], c[1][1]), pa[3] = pack2<T>(c[1][2], c[1][3]);
  for (int h = 0; h < 2; h++) {
    float e[4];
    load_b_kn(fb, b_kn + h * 8, 16, lane);
    mma16816<T>(e, pa, fb, z);
    float *d3 = d + 512;
    d3[(g)*16 + h * 8 + 2 * t] = e[0], d3[(g)*16 + h * 8 + 2 * t + 1] = e[1];
    d3[(g + 8) * 16 + h * 8 + 2 * t] = e[2], d3[(g + 8) * 16 + h * 8 + 2 * t + 1] = e[3];
  }
  /* through shared memory, rows of 24 elements (48 bytes: 16-byte aligned) */
  __align__(16) __shared__ T sa[16 * 24], skn[16 * 24], snk[16 * 24];
  for (int i = lane; i < 256; i += 32) {
    sa[i / 16 * 24 + i % 16] = a[i];
    skn[i / 16 * 24 + i % 16] = b_kn[i];
    snk[i / 16 * 24 + i % 16] = b_nk[i];
  }
  __syncwarp();
  uint32_t la[4], lb[4];
  ldsm_x4<false>(la, sa + (lane % 16) * 24 + (lane / 16) * 8);
  for (int v = 0; v < 2; v++) {
    if (v == 0) ldsm_x4<true>(lb, skn + (lane % 16) * 24 + (lane / 16) * 8);
    else ldsm_x4<false>(lb, snk + ((lane % 8) + (lane / 16) * 8) * 24 + ((lane / 8) % 2) * 8);
    float *d4 = d + 768 + 256 * v;
    for (int h = 0; h < 2; h++) {
      float e[4];
      mma16816<T>(e, la, lb + 2 * h, z);
      d4[(g)*16 + h * 8 + 2 * t] = e[0], d4[(g)*16 + h * 8 + 2 * t + 1] = e[1];
      d4[(g + 8) * 16 + h * 8 + 2 * t] = e[2], d4[(g + 8) * 16 + h * 8 + 2 * t + 1] = e[3];
    }
  }
}

void gpu_mma_check(gpu_stream *s, int dt, float *d, const void *a, const void *b_nk, const void *b_kn) {
  if (dt == GPU_F16)
    launch(k_mma_check<f16>, 1, 32, 0, s, d, (const f16 *)a, (const f16 *)b_nk, (const f16 *)b_kn);
  else
    launch(k_mma_check<bf16>, 1, 32, 0, s, d, (const bf16 *)a, (const bf16 *)b_nk, (const bf16 *)b_kn);
}
