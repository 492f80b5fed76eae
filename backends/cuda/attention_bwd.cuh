/* attention_bwd.cuh - the steps the backward's kernels share, whichever
 * product computes their scores (mma.sync in attention_fa_bwd.cu, wgmma in
 * attention_wg.cu): from a warp's 16 rows of scores in result fragments
 * (x[nb]: columns 8 nb to 8 nb + 7, mma.cuh's C layout; lane g = lane / 4,
 * t = lane % 4) to the probabilities and the scores' gradient as 16-bit A
 * fragments (pp), and the sums' stores. The same operations in the same
 * order wherever they run, so the kernels built on them give the same
 * bits where their products do. */
#ifndef WEFT_CUDA_ATTENTION_BWD_CUH
#define WEFT_CUDA_ATTENTION_BWD_CUH

#include "cpasync.cuh"
#include "gpu.h"
#include "mma.cuh"

constexpr float kLog2e = 1.4426950408889634f;

/* dk/dv's P^T = exp(scale S^T - lse) of the warp's 16 keys (rows g, g + 8)
 * against NB * 8 queries, those from c0 of the tile whose lse (natural
 * log) Ls holds; sl2 = scale log2 e. Where edge (some key of the warp
 * comes after the chunk's first query), columns below lim0 (row g) and
 * lim1 (row g + 8) are not seen: 0; cut0 and cut1 zero rows g and g + 8
 * whole. */
template <class T, int NB>
DEV void probs_kv(uint32_t (*pp)[4], const float (*x)[4], const float *Ls, int c0, float sl2, bool edge, int lim0,
                  int lim1, bool cut0, bool cut1, int t) {
#pragma unroll
  for (int nb = 0; nb < NB; nb++) {
    const int c = nb * 8 + 2 * t;
    const float l0 = Ls[c0 + c] * kLog2e, l1 = Ls[c0 + c + 1] * kLog2e;
    float p0 = fexp2(x[nb][0] * sl2 - l0), p1 = fexp2(x[nb][1] * sl2 - l1);
    float p2 = fexp2(x[nb][2] * sl2 - l0), p3 = fexp2(x[nb][3] * sl2 - l1);
    if (edge) {
      if (c < lim0) p0 = 0.0f;
      if (c + 1 < lim0) p1 = 0.0f;
      if (c < lim1) p2 = 0.0f;
      if (c + 1 < lim1) p3 = 0.0f;
    }
    if (cut0) p0 = p1 = 0.0f;
    if (cut1) p2 = p3 = 0.0f;
    pack_c<T>(pp, nb, p0, p1, p2, p3);
  }
}

/* dk/dv's dS^T = P^T (dP^T - D) into ds from P^T in pp (the same array
 * or another), x = dP^T, D of the queries from c0 in Ds. */
template <class T, int NB>
DEV void dscores_kv(uint32_t (*ds)[4], const uint32_t (*pp)[4], const float (*x)[4], const float *Ds, int c0, int t) {
#pragma unroll
  for (int nb = 0; nb < NB; nb++) {
    const int c = c0 + nb * 8 + 2 * t;
    const float d0 = Ds[c], d1 = Ds[c + 1];
    const uint32_t u0 = pp[nb >> 1][(nb & 1) * 2], u1 = pp[nb >> 1][(nb & 1) * 2 + 1];
    pack_c<T>(ds, nb, lo16<T>(u0) * (x[nb][0] - d0), hi16<T>(u0) * (x[nb][1] - d1), lo16<T>(u1) * (x[nb][2] - d0),
              hi16<T>(u1) * (x[nb][3] - d1));
  }
}

/* dq's P = exp(scale S - lse) of the warp's 16 queries (rows g, g + 8: l0,
 * l1 their lse times log2 e) against NB * 8 keys; where edge, columns above
 * lim0 (row g) and lim1 (row g + 8) are not seen: 0. */
template <class T, int NB>
DEV void probs_q(uint32_t (*pp)[4], const float (*x)[4], float l0, float l1, float sl2, bool edge, int lim0, int lim1,
                 int t) {
#pragma unroll
  for (int nb = 0; nb < NB; nb++) {
    const int c = nb * 8 + 2 * t;
    float p0 = fexp2(x[nb][0] * sl2 - l0), p1 = fexp2(x[nb][1] * sl2 - l0);
    float p2 = fexp2(x[nb][2] * sl2 - l1), p3 = fexp2(x[nb][3] * sl2 - l1);
    if (edge) {
      if (c > lim0) p0 = 0.0f;
      if (c + 1 > lim0) p1 = 0.0f;
      if (c > lim1) p2 = 0.0f;
      if (c + 1 > lim1) p3 = 0.0f;
    }
    pack_c<T>(pp, nb, p0, p1, p2, p3);
  }
}

/* dq's dS = P (dP - D) in place of P (pp), x = dP, d0 and d1 the rows' D. */
template <class T, int NB> DEV void dscores_q(uint32_t (*pp)[4], const float (*x)[4], float d0, float d1) {
#pragma unroll
  for (int nb = 0; nb < NB; nb++) {
    const uint32_t u0 = pp[nb >> 1][(nb & 1) * 2], u1 = pp[nb >> 1][(nb & 1) * 2 + 1];
    pack_c<T>(pp, nb, lo16<T>(u0) * (x[nb][0] - d0), hi16<T>(u0) * (x[nb][1] - d0), lo16<T>(u1) * (x[nb][2] - d1),
              hi16<T>(u1) * (x[nb][3] - d1));
  }
}

/* dk (+)= scale gk and dv (+)= gv, the warp's sums over NN column blocks of
 * 8: row g of them at base (+ 8 rows of `row` for row g + 8), key index
 * key0 + g, rows from sk on left out; a NULL gradient is not asked. */
template <class T, int NN>
DEV void store_kv(T *dk, T *dv, const float (*gk)[4], const float (*gv)[4], int64_t base, int64_t row, int64_t key0,
                  int64_t sk, float scale, bool acc) {
#pragma unroll
  for (int n = 0; n < NN; n++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      if (key0 + 8 * hh >= sk) continue;
      const int64_t at = base + 8 * hh * row + n * 8;
      if (dk) put(&dk[at], gk[n][2 * hh] * scale, acc), put(&dk[at + 1], gk[n][2 * hh + 1] * scale, acc);
      if (dv) put(&dv[at], gv[n][2 * hh], acc), put(&dv[at + 1], gv[n][2 * hh + 1], acc);
    }
}

/* dq (+)= scale gq over NN column blocks of 8: rows qi0 and qi1 of dst
 * (row stride `row`), those from sq on left out. */
template <class T, int NN>
DEV void store_q(T *dst, const float (*gq)[4], int64_t qi0, int64_t qi1, int64_t sq, int64_t row, float scale,
                 bool acc) {
#pragma unroll
  for (int n = 0; n < NN; n++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int64_t qi = hh ? qi1 : qi0;
      if (qi >= sq) continue;
      T *p = dst + qi * row + n * 8;
      put(&p[0], gq[n][2 * hh] * scale, acc), put(&p[1], gq[n][2 * hh + 1] * scale, acc);
    }
}

#endif
