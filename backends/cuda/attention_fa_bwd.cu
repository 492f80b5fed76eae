/* attention_fa_bwd.cu - the backward of causal attention on the tensor cores
 * through mma.sync (mma.cuh), FlashAttention-2's way, for 16-bit heads of
 * 32, 64, 96 or 128 whose forward kept each row's log-sum-exp (and its
 * result, for D = dout . out). Scores never leave the registers: a
 * product's result fragments, exponentiated and packed to 16 bits, are the
 * A operand of the next product (see mma.cuh).
 *
 * Two kernels of 4 warps, each warp 16 rows of 64 a block; the streamed
 * operand's tiles of 64 rows go to shared memory by cp.async (rows of
 * dh + 8 elements, so ldmatrix hits distinct banks), the next tile while
 * the current one is computed (heads of 128 on GPUs of 99 KiB of shared
 * memory a block: one tile after another, two stages not fitting).
 *   dk, dv: a block takes 64 keys of one key/value head; its warps keep
 *   their K and V rows in registers (heads up to 64; wider ones read them
 *   from shared memory, the registers going to the sums) and walk the
 *   query tiles that see them, over the query heads of the group in order:
 *   S^T = K Q^T, P^T = exp(scale S^T - lse), dV += P^T dO, dP^T = V dO^T,
 *   dS^T = P^T (dP^T - D), dK += dS^T Q; dK takes the scale at the end.
 *   dq: a block takes 64 queries of one head (the last ones first: they see
 *   the most keys), Q and dO rows in registers likewise, over the key tiles
 *   up to its last row: S = Q K^T, P, dP = dO V^T, dS, dQ += dS K.
 * Only tiles on the diagonal (or at the sequences' ends) are masked; query
 * rows past the end get lse = +inf, so P = 0 there. No atomics: each sum
 * has one owner and adds in a fixed order, so two runs give the same bits.
 * With dq by atomics (fa-atomic, never under --deterministic) the dk/dv
 * kernel computes dq as well, FlashAttention-2's way: each chunk's dS^T
 * goes to shared memory, the four warps take dQ = dS K for its queries
 * (dS read transposed by ldmatrix .trans, K already there) and add it to
 * f32 sums by atomics, and k_attn_dq_store writes dq from them: five
 * products a tile instead of the two kernels' seven.
 * Rows whose start is not on 16 bytes go through plain loads instead.
 * WEFT_ATTN=wmma leaves the backward to attention_tc.cu (to time both). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"
#include "attention_bwd.cuh"

namespace {

/* warps, threads, rows of a block and of a streamed tile */
enum { FW = 4, FT = 32 * FW, FB = 64 };
static_assert(FT == 2 * STATS_ROWS && FB == STATS_ROWS, "stats_to: a thread a number");

/* FB rows of a head from src (row stride `row` elements) into shared rows
 * of dh + 8 elements, 8 elements a copy (cp.async when vec, else plain
 * loads); rows from `left` on are zero. Every thread of the block calls it. */
template <class T, int D16>
DEV void rows_to(T *dst, const T *src, int64_t row, int left, bool vec) {
  enum { C = D16 * 2, LD = D16 * 16 + 8, N = FB * C / FT };
  static_assert(FB * C % FT == 0, "whole copies per thread");
#pragma unroll
  for (int i = 0; i < N; i++) {
    int e = (int)threadIdx.x + i * FT, rr = e / C, c = e % C;
    T *d = dst + rr * LD + c * 8;
    if (rr < left) {
      const T *s = src + rr * row + c * 8;
      if (vec) {
        cp16(d, s);
      } else {
#pragma unroll
        for (int j = 0; j < 8; j++) d[j] = s[j];
      }
    } else {
      zero16(d);
    }
  }
}

/* ---- fragments ------------------------------------------------------------------------ */

/* The A operand of the 16 x 16 tile at p (row stride LD). */
template <int LD> DEV void ld_a(uint32_t a[4], const void *p, int lane) {
  ldsm_x4<false>(a, (const char *)p + ((lane & 15) * LD + (lane >> 4) * 8) * 2);
}
/* B of two n-blocks from a tile stored [n][k] at p (16 rows n, 16 k). */
template <int LD> DEV void ld_b_nk(uint32_t b[4], const void *p, int lane) {
  ldsm_x4<false>(b, (const char *)p + ((((lane & 7) + (lane >> 4) * 8) * LD) + ((lane >> 3) & 1) * 8) * 2);
}
/* B of two n-blocks from a tile stored [k][n] at p (16 rows k, 16 n). */
template <int LD> DEV void ld_b_kn(uint32_t b[4], const void *p, int lane) {
  ldsm_x4<true>(b, (const char *)p + ((lane & 15) * LD + (lane >> 4) * 8) * 2);
}

/* x[nb] = A B^T over 16 rows of A against NQ rows of B (row stride LD,
 * 16-bit), A in registers (af, HOLD) or at As in shared memory. */
template <class T, int D16, bool HOLD, int NQ>
DEV void scores(float (*x)[4], const uint32_t (*af)[4], const T *As, const T *B, int lane) {
  enum { LD = D16 * 16 + 8 };
#pragma unroll
  for (int nb = 0; nb < NQ / 8; nb++) x[nb][0] = x[nb][1] = x[nb][2] = x[nb][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D16; kk++) {
    uint32_t a[4];
    if constexpr (HOLD)
      a[0] = af[kk][0], a[1] = af[kk][1], a[2] = af[kk][2], a[3] = af[kk][3];
    else
      ld_a<LD>(a, As + kk * 16, lane);
#pragma unroll
    for (int j = 0; j < NQ / 16; j++) {
      uint32_t b[4];
      ld_b_nk<LD>(b, B + j * 16 * LD + kk * 16, lane);
      mma16816<T>(x[2 * j], a, b, x[2 * j]);
      mma16816<T>(x[2 * j + 1], a, b + 2, x[2 * j + 1]);
    }
  }
}

/* g[n] += X B: X the warp's 16 x NQ 16-bit scores as A fragments (pp[j]:
 * columns 16 j to 16 j + 15), B NQ rows of dh in shared memory. */
template <class T, int D16, int NQ>
DEV void accumulate(float (*g)[4], const uint32_t (*pp)[4], const T *B, int lane) {
  enum { LD = D16 * 16 + 8 };
#pragma unroll
  for (int j = 0; j < NQ / 16; j++)
#pragma unroll
    for (int d16 = 0; d16 < D16; d16++) {
      uint32_t b[4];
      ld_b_kn<LD>(b, B + j * 16 * LD + d16 * 16, lane);
      mma16816<T>(g[2 * d16], pp[j], b, g[2 * d16]);
      mma16816<T>(g[2 * d16 + 1], pp[j], b + 2, g[2 * d16 + 1]);
    }
}

/* ---- dk and dv ------------------------------------------------------------------------ */

/* Shared memory: K and V rows of the block, then NST stages of a query
 * tile, its dout tile, and lse and D of their rows; with dq summed here
 * (dq_by_atomics), then dS^T of QC queries: rows of the block's keys.
 * Two stages, the next tile fetched while the current one is computed; one
 * where two do not fit a block's shared memory (heads of 128 on GPUs of 99
 * KiB a block, as compute capability 8.6 and 8.9 have: 103 KiB, 69 with
 * one). */
template <int D16, int NST = 2> struct dkv_layout {
  enum { LD = D16 * 16 + 8, ROWS = FB * LD * 2, STAGE = 2 * ROWS + 2 * FB * 4, BYTES = 2 * ROWS + NST * STAGE };
  static constexpr size_t bytes(bool dq, int qc) { return BYTES + (dq ? (size_t)FB * (qc + 8) * 2 : 0); }
};

/* The query tile of rows [q0, q0 + FB) of query head h (q, dout, lse and
 * dsum at the batch already) into stage buffers. */
template <class T, int D16>
DEV void fetch_q(unsigned char *stage, int64_t h, int q0, const T *q, const T *dout, const gpu_attn &a,
                 const float *lse, const float *dsum, bool vec) {
  typedef dkv_layout<D16> L;
  const int left = (int)a.sq - q0;
  rows_to<T, D16>((T *)stage, q + h * a.dh + q0 * a.q_row, a.q_row, left, vec);
  rows_to<T, D16>((T *)(stage + L::ROWS), dout + h * a.dh + q0 * a.o_row, a.o_row, left, vec);
  float *Ls = (float *)(stage + 2 * L::ROWS);
  const int64_t at = h * a.sq + q0;
  stats_to(Ls, Ls + FB, lse + at, dsum + at, left);
}

/* dq of a chunk of QC queries from dS^T (the block's FB keys by QC
 * queries, 16-bit, rows of QC + 8 at dS) and the block's keys Ks: dQ = dS
 * K, split over the 4 warps by 16 queries, then by parts of the head where
 * the chunk has fewer than 64 queries; each sum added to dqa (f32 rows of
 * dh, row qb the chunk's first) by atomics, rows from sq on left out. */
template <class T, int D16, int QC>
DEV void dq_by_atomics(float *dqa, const T *dS, const T *Ks, int64_t dh, int qb, int sq, int w, int lane) {
  enum { LD = D16 * 16 + 8, LDS = QC + 8, RB = QC / 16, CG = FW / RB, DC = D16 / CG };
  static_assert(FW % RB == 0 && D16 % CG == 0, "the warps share the chunk evenly");
  const int rb = w % RB, cg = w / RB, g = lane >> 2, t = lane & 3;
  float acc[2 * DC][4];
#pragma unroll
  for (int n = 0; n < 2 * DC; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int kb = 0; kb < FB / 16; kb++) {
    /* A = dS (16 queries by 16 keys) from its transpose: ldmatrix .trans
     * of the rows (keys) kb*16 + 0..15 at the warp's queries */
    uint32_t a[4];
    ldsm_x4<true>(a, dS + (kb * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + rb * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
    for (int dd = 0; dd < DC; dd++) {
      uint32_t b[4];
      ld_b_kn<LD>(b, Ks + kb * 16 * LD + (cg * DC + dd) * 16, lane);
      mma16816<T>(acc[2 * dd], a, b, acc[2 * dd]);
      mma16816<T>(acc[2 * dd + 1], a, b + 2, acc[2 * dd + 1]);
    }
  }
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int qi = qb + rb * 16 + g + 8 * hh;
    if (qi >= sq) continue;
    float *row = dqa + (int64_t)qi * dh + cg * DC * 16 + 2 * t;
#pragma unroll
    for (int n = 0; n < 2 * DC; n++) {
      atomicAdd(&row[n * 8], acc[n][2 * hh]);
      atomicAdd(&row[n * 8 + 1], acc[n][2 * hh + 1]);
    }
  }
}

} // namespace

/* The kernels' names are seen outside (the emulation counts launches by
 * name): k_attn_ as attention.cu's. */

/* dk, dv of keys [k0, k0 + FB) of key/value head hk; warp w owns 16.
 * DQ: dq too, each chunk's part of it added to dqa (f32 [b, hq, sq, dh],
 * zero before, without the scale) by atomics; or, where dsT is not NULL
 * (fa-ds), dS^T of each tile stored there for k_attn_dq_ds (16-bit, key
 * rows of the head's query positions rounded up to FB: [b, hq, key tile,
 * FB keys, sqp]; a.qpos 0), dqa not read. */
template <class T, int D16, bool HOLD, int QC, int MB, bool DQ, int NST>
__global__ void __launch_bounds__(FT, MB)
    k_attn_dkv_fa(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, gpu_attn a, float scale,
                  bool vec, const float *lse, const float *dsum, bool acc, float *dqa, bool by_tile, T *dsT) {
  typedef dkv_layout<D16, NST> L;
  enum { LD = L::LD };
  DYN_SMEM(unsigned char, raw);
  T *Ks = (T *)raw, *Vs = (T *)(raw + L::ROWS);
  unsigned char *stages = raw + 2 * L::ROWS;
  T *dSs = (T *)(raw + L::BYTES); /* DQ: dS^T of a chunk, rows of QC + 8 */
  /* the first key tile first: the most queries see it */
  int64_t bi, hk, tile, grid_tiles;
  attention_fa_block(by_tile, bi, hk, tile, grid_tiles);
  const int k0 = (int)tile * FB, sq = (int)a.sq, qpos = (int)a.qpos;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3, kw = k0 + 16 * w;
  const int64_t kvoff = bi * a.kv_batch + hk * a.dh;
  q += bi * a.q_batch, dout += bi * a.o_batch, lse += bi * a.hq * a.sq, dsum += bi * a.hq * a.sq;
  rows_to<T, D16>(Ks, k + kvoff + k0 * a.kv_row, a.kv_row, (int)a.sk - k0, vec);
  rows_to<T, D16>(Vs, v + kvoff + k0 * a.kv_row, a.kv_row, (int)a.sk - k0, vec);
  cp_commit();
  /* the query rows from qs on see some of these keys: tiles from there
   * to the end, for each query head of the group; (fh, fq) the next to
   * fetch, q0 the one computed */
  const int qs = k0 > qpos ? k0 - qpos : 0;
  const int64_t steps = qs < sq ? a.r * ((sq - qs + FB - 1) / FB) : 0;
  int64_t fh = hk * a.r, ch = fh; /* ch: the head of the tile computed */
  int fq = qs, q0 = qs;
  if (steps > 0) {
    fetch_q<T, D16>(stages, fh, fq, q, dout, a, lse, dsum, vec);
    if ((fq += FB) >= sq) fq = qs, fh++;
  }
  cp_commit();
  cp_wait<1>();
  __syncthreads();
  uint32_t kf[HOLD ? D16 : 1][4], vf[HOLD ? D16 : 1][4];
  if constexpr (HOLD) {
#pragma unroll
    for (int kk = 0; kk < D16; kk++) {
      ld_a<LD>(kf[kk], Ks + 16 * w * LD + kk * 16, lane);
      ld_a<LD>(vf[kk], Vs + 16 * w * LD + kk * 16, lane);
    }
  }
  float gk[2 * D16][4], gv[2 * D16][4];
#pragma unroll
  for (int n = 0; n < 2 * D16; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) gk[n][e] = gv[n][e] = 0.0f;
  const float sl2 = scale * kLog2e;
  const bool real = kw < a.sk;
  for (int64_t st = 0; st < steps; st++) {
    if constexpr (NST == 2) {
      if (st + 1 < steps) {
        fetch_q<T, D16>(stages + ((st + 1) & 1) * L::STAGE, fh, fq, q, dout, a, lse, dsum, vec);
        if ((fq += FB) >= sq) fq = qs, fh++;
      }
      cp_commit();
      cp_wait<1>();
    } else {
      /* one stage: this tile into it, once the last one's readers are past
       * the loop's final barrier */
      if (st > 0) {
        fetch_q<T, D16>(stages, fh, fq, q, dout, a, lse, dsum, vec);
        if ((fq += FB) >= sq) fq = qs, fh++;
      }
      cp_commit();
      cp_wait<0>();
    }
    __syncthreads();
    const unsigned char *sg = stages + (NST == 2 ? (st & 1) : 0) * L::STAGE;
    const T *Qs = (const T *)sg, *Os = (const T *)(sg + L::ROWS);
    const float *Ls = (const float *)(sg + 2 * L::ROWS), *Ds = Ls + FB;
    /* the warp's first key less the position of the tile's first query */
    const int rel = kw - qpos - q0;
    /* QC queries at a time (fewer registers for the widest heads) */
#pragma unroll 1
    for (int c0 = 0; c0 < FB; c0 += QC) {
      /* the warp's keys: some seen by the chunk's last query, and real;
       * with DQ every warp goes on while any of them does (the block's
       * first keys are seen), the others giving zeros for dq */
      const bool on = rel <= c0 + QC - 1 && real;
      if (DQ ? rel - 16 * w > c0 + QC - 1 : !on) continue;
      uint32_t pp[QC / 16][4];
      if (on) {
        float x[QC / 8][4];
        scores<T, D16, HOLD, QC>(x, kf, Ks + 16 * w * LD, Qs + c0 * LD, lane);
        /* P^T: key kw + g (+ 8) against query q0 + c0 + column; masked
         * where some key of the warp comes after the chunk's first query */
        const bool edge = rel + 15 > c0;
        const int lim0 = rel + g - c0, lim1 = lim0 + 8; /* columns below are not seen */
        /* dq: keys past the end give nothing, whatever the mask (dk and dv
         * of them are not stored) */
        probs_kv<T, QC / 8>(pp, x, Ls, c0, sl2, edge, lim0, lim1, DQ && kw + g >= a.sk, DQ && kw + g + 8 >= a.sk, t);
        accumulate<T, D16, QC>(gv, pp, Os + c0 * LD, lane);
        /* dP^T = V dO^T; dS^T = P^T (dP^T - D) in place of P^T */
        scores<T, D16, HOLD, QC>(x, vf, Vs + 16 * w * LD, Os + c0 * LD, lane);
        dscores_kv<T, QC / 8>(pp, pp, x, Ds, c0, t);
        accumulate<T, D16, QC>(gk, pp, Qs + c0 * LD, lane);
      } else {
#pragma unroll
        for (int j = 0; j < QC / 16; j++) pp[j][0] = pp[j][1] = pp[j][2] = pp[j][3] = 0u;
      }
      if constexpr (DQ) {
        /* pp[j][e] is the word of dS^T at key g (+ 8 for odd e), queries
         * 16 j + 2 t (+ 8 from e = 2) */
        if (dsT) {
          /* to the buffer: the tile's key rows, from the chunk's first query */
          const int64_t sqp = (a.sq + FB - 1) / FB * FB;
          T *at = dsT + ((bi * a.hq + ch) * grid_tiles + tile) * FB * sqp + q0 + c0;
#pragma unroll
          for (int j = 0; j < QC / 16; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
              *(uint32_t *)(at + (16 * w + g + (e & 1) * 8) * sqp + 16 * j + (e >> 1) * 8 + 2 * t) = pp[j][e];
        } else {
          /* to shared memory, then dq by atomics */
#pragma unroll
          for (int j = 0; j < QC / 16; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
              *(uint32_t *)(dSs + (16 * w + g + (e & 1) * 8) * (QC + 8) + 16 * j + (e >> 1) * 8 + 2 * t) = pp[j][e];
          __syncthreads();
          dq_by_atomics<T, D16, QC>(dqa + ((bi * a.hq + ch) * a.sq) * a.dh, dSs, Ks, a.dh, q0 + c0, sq, w, lane);
          __syncthreads();
        }
      }
    }
    if ((q0 += FB) >= sq) q0 = qs, ch++;
    __syncthreads();
  }
  store_kv<T, 2 * D16>(dk, dv, gk, gv, kvoff + (kw + g) * a.kv_row + 2 * t, a.kv_row, kw + g, a.sk, scale, acc);
}

/* ---- dq -------------------------------------------------------------------------------- */

/* Shared memory: the block's Q and dout rows, then NST stages (as
 * dkv_layout's) of a key tile and its value tile. */
namespace {
template <int D16, int NST = 2> struct dq_layout {
  enum { LD = D16 * 16 + 8, ROWS = FB * LD * 2, STAGE = 2 * ROWS, BYTES = 2 * ROWS + NST * STAGE };
};
} // namespace

/* dq of query rows [q0, q0 + FB) of head h, the last block the first;
 * warp w owns 16. */
template <class T, int D16, bool HOLD, int MB, int NST>
__global__ void __launch_bounds__(FT, MB)
    k_attn_dq_fa(T *dq, const T *dout, const T *q, const T *k, const T *v, gpu_attn a, float scale, bool vec,
                 const float *lse, const float *dsum, bool acc, bool by_tile) {
  typedef dq_layout<D16, NST> L;
  enum { LD = L::LD, NB = FB / 8, J = FB / 16 };
  DYN_SMEM(unsigned char, raw);
  T *Qs = (T *)raw, *Os = (T *)(raw + L::ROWS);
  unsigned char *stages = raw + 2 * L::ROWS;
  int64_t bi, h, tile, grid_tiles;
  attention_fa_block(by_tile, bi, h, tile, grid_tiles);
  const int q0 = (int)(grid_tiles - 1 - tile) * FB, sq = (int)a.sq, sk = (int)a.sk, qpos = (int)a.qpos;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int qw = q0 + 16 * w, qi0 = qw + g, qi1 = qi0 + 8;
  const T *kb = k + bi * a.kv_batch + (h / a.r) * a.dh, *vb = v + bi * a.kv_batch + (h / a.r) * a.dh;
  rows_to<T, D16>(Qs, q + bi * a.q_batch + h * a.dh + q0 * a.q_row, a.q_row, sq - q0, vec);
  rows_to<T, D16>(Os, dout + bi * a.o_batch + h * a.dh + q0 * a.o_row, a.o_row, sq - q0, vec);
  cp_commit();
  const int tiles = (int)last_key(a, q0 + FB) / FB + 1;
  rows_to<T, D16>((T *)stages, kb, a.kv_row, sk, vec);
  rows_to<T, D16>((T *)(stages + L::ROWS), vb, a.kv_row, sk, vec);
  cp_commit();
  cp_wait<1>();
  __syncthreads();
  uint32_t qf[HOLD ? D16 : 1][4], of[HOLD ? D16 : 1][4];
  if constexpr (HOLD) {
#pragma unroll
    for (int kk = 0; kk < D16; kk++) {
      ld_a<LD>(qf[kk], Qs + 16 * w * LD + kk * 16, lane);
      ld_a<LD>(of[kk], Os + 16 * w * LD + kk * 16, lane);
    }
  }
  const int64_t at = (bi * a.hq + h) * a.sq;
  const float l0 = qi0 < sq ? lse[at + qi0] * kLog2e : INFINITY, l1 = qi1 < sq ? lse[at + qi1] * kLog2e : INFINITY;
  const float d0 = qi0 < sq ? dsum[at + qi0] : 0.0f, d1 = qi1 < sq ? dsum[at + qi1] : 0.0f;
  /* the last key each of the lane's rows sees */
  const int see0 = qpos + qi0 < sk - 1 ? qpos + qi0 : sk - 1, see1 = qpos + qi1 < sk - 1 ? qpos + qi1 : sk - 1;
  const float sl2 = scale * kLog2e;
  float gq[2 * D16][4];
#pragma unroll
  for (int n = 0; n < 2 * D16; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) gq[n][e] = 0.0f;
  for (int kt = 0; kt < tiles; kt++) {
    const int k0 = kt * FB;
    if constexpr (NST == 2) {
      if (kt + 1 < tiles) {
        unsigned char *nx = stages + ((kt + 1) & 1) * L::STAGE;
        rows_to<T, D16>((T *)nx, kb + (k0 + FB) * a.kv_row, a.kv_row, sk - k0 - FB, vec);
        rows_to<T, D16>((T *)(nx + L::ROWS), vb + (k0 + FB) * a.kv_row, a.kv_row, sk - k0 - FB, vec);
      }
      cp_commit();
      cp_wait<1>();
    } else {
      /* one stage: this tile into it (the first came before the loop) */
      if (kt > 0) {
        rows_to<T, D16>((T *)stages, kb + k0 * a.kv_row, a.kv_row, sk - k0, vec);
        rows_to<T, D16>((T *)(stages + L::ROWS), vb + k0 * a.kv_row, a.kv_row, sk - k0, vec);
      }
      cp_commit();
      cp_wait<0>();
    }
    __syncthreads();
    const unsigned char *sg = stages + (NST == 2 ? (kt & 1) : 0) * L::STAGE;
    const T *Ks = (const T *)sg, *Vs = (const T *)(sg + L::ROWS);
    /* the warp's rows: real, and the first key seen by the last of them */
    if (qw < sq && k0 <= qpos + qw + 15) {
      float x[NB][4];
      uint32_t pp[J][4];
      scores<T, D16, HOLD, FB>(x, qf, Qs + 16 * w * LD, Ks, lane);
      /* P: query qi0 (qi1) against key k0 + column; masked where the tile
       * ends after the warp's first query sees, or after the keys */
      const bool edge = k0 + FB - 1 > qpos + qw || k0 + FB > sk;
      const int lim0 = see0 - k0, lim1 = see1 - k0; /* columns above are not seen */
      /* P as probs_q (attention_bwd.cuh) computes it, written out here:
       * called, it leaves the heads of 64 in 3 blocks an SM a few bytes
       * of spill (ptxas of nvcc 13, sm_90; tests/cuda_check.sh) */
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
      /* dP = dO V^T; dS = P (dP - D) */
      scores<T, D16, HOLD, FB>(x, of, Os + 16 * w * LD, Vs, lane);
      dscores_q<T, NB>(pp, x, d0, d1);
      accumulate<T, D16, FB>(gq, pp, Ks, lane);
    }
    __syncthreads();
  }
  store_q<T, 2 * D16>(dq + bi * a.q_batch + h * a.dh + 2 * t, gq, qi0, qi1, a.sq, a.q_row, scale, acc);
}

/* dq (+)= scale dqa, dqa f32 [b, hq, sq, dh] (dq by atomics). */
template <class T>
__global__ void k_attn_dq_store(T *dq, const float *dqa, gpu_attn a, float scale, bool acc) {
  const int64_t n = a.b * a.hq * a.sq * a.dh;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t c = i % a.dh, p = i / a.dh % a.sq, h = i / (a.dh * a.sq) % a.hq, bi = i / (a.dh * a.sq * a.hq);
    put(&dq[bi * a.q_batch + h * a.dh + p * a.q_row + c], dqa[i] * scale, acc);
  }
}

/* ---- dq from a stored dS (fa-ds) --------------------------------------------------------- */

/* Shared memory: two stages of a tile of dS^T (FB keys by FB queries, rows
 * of FB + 8) and its key tile (rows of dh + 8). */
namespace {
template <int D16> struct ds_layout {
  enum { LD = D16 * 16 + 8, LDS = FB + 8, DS = FB * LDS * 2, STAGE = DS + FB * LD * 2, BYTES = 2 * STAGE };
};
} // namespace

/* dq (+)= scale dS K of query rows [q0, q0 + FB) of head h, the last block
 * the first, from the dS^T that k_attn_dkv_fa stored (dsT, its layout;
 * a.qpos 0): over the key tiles up to the rows' last, the next tile while
 * the current one is computed; warp w owns 16 rows, the whole head. Each
 * sum has one owner and one order: the same bits every run. */
template <class T, int D16, int MB>
__global__ void __launch_bounds__(FT, MB)
    k_attn_dq_ds(T *dq, const T *dsT, const T *k, gpu_attn a, float scale, bool vec, bool acc, bool by_tile) {
  typedef ds_layout<D16> L;
  enum { LD = L::LD, LDS = L::LDS };
  DYN_SMEM(unsigned char, raw);
  int64_t bi, h, tile, grid_tiles;
  attention_fa_block(by_tile, bi, h, tile, grid_tiles);
  const int q0 = (int)(grid_tiles - 1 - tile) * FB, sk = (int)a.sk;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t sqp = (a.sq + FB - 1) / FB * FB, nkt = (a.sk + FB - 1) / FB;
  const T *kb = k + bi * a.kv_batch + (h / a.r) * a.dh, *db = dsT + (bi * a.hq + h) * nkt * FB * sqp + q0;
  const int tiles = (int)last_key(a, q0 + FB) / FB + 1;
  rows_to<T, FB / 16>((T *)raw, db, sqp, FB, true);
  rows_to<T, D16>((T *)(raw + L::DS), kb, a.kv_row, sk, vec);
  cp_commit();
  float gq[2 * D16][4];
#pragma unroll
  for (int n = 0; n < 2 * D16; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) gq[n][e] = 0.0f;
  for (int kt = 0; kt < tiles; kt++) {
    if (kt + 1 < tiles) {
      unsigned char *nx = raw + ((kt + 1) & 1) * L::STAGE;
      const int k1 = (kt + 1) * FB;
      rows_to<T, FB / 16>((T *)nx, db + (int64_t)k1 * sqp, sqp, FB, true);
      rows_to<T, D16>((T *)(nx + L::DS), kb + (int64_t)k1 * a.kv_row, a.kv_row, sk - k1, vec);
    }
    cp_commit();
    cp_wait<1>();
    __syncthreads();
    const unsigned char *sg = raw + (kt & 1) * L::STAGE;
    const T *Ds = (const T *)sg, *Ks = (const T *)(sg + L::DS);
    if (q0 + 16 * w < a.sq) {
      /* A = dS (the warp's 16 queries by 16 keys) from its transpose */
      uint32_t pp[FB / 16][4];
#pragma unroll
      for (int j = 0; j < FB / 16; j++)
        ldsm_x4<true>(pp[j], Ds + (j * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + 16 * w + ((lane >> 3) & 1) * 8);
      accumulate<T, D16, FB>(gq, pp, Ks, lane);
    }
    __syncthreads();
  }
  const int qi0 = q0 + 16 * w + g;
  store_q<T, 2 * D16>(dq + bi * a.q_batch + h * a.dh + 2 * t, gq, qi0, qi0 + 8, a.sq, a.q_row, scale, acc);
}

/* ---- launches -------------------------------------------------------------------------- */

namespace {

/* The larger shared memory of the two kernels for heads of 16 D16 in NST
 * stages. */
template <int D16, int NST> size_t fa_bytes16() {
  size_t x = dkv_layout<D16, NST>::BYTES, y = dq_layout<D16, NST>::BYTES;
  return x > y ? x : y;
}
size_t fa_bytes(int64_t dh, int nst) {
  if (nst == 1) return dh == 128 ? fa_bytes16<8, 1>() : SIZE_MAX; /* (one stage: heads of 128 alone) */
  return dh == 32   ? fa_bytes16<2, 2>()
         : dh == 64 ? fa_bytes16<4, 2>()
         : dh == 96 ? fa_bytes16<6, 2>()
                    : fa_bytes16<8, 2>();
}
/* Queries at a time in dk/dv for heads of 16 D16 (fa_backward's runs):
 * 64 for heads up to 64, whose rows stay in registers; 32 above. */
constexpr int fa_qc(int D16) { return D16 <= 4 ? 64 : 32; }
/* The dk/dv kernel's with dq by atomics. */
size_t fa_atomic_bytes(int64_t dh, int nst) {
  if (nst == 1) return dh == 128 ? dkv_layout<8, 1>::bytes(true, fa_qc(8)) : SIZE_MAX;
  return dh == 32   ? dkv_layout<2>::bytes(true, fa_qc(2))
         : dh == 64 ? dkv_layout<4>::bytes(true, fa_qc(4))
         : dh == 96 ? dkv_layout<6>::bytes(true, fa_qc(6))
                    : dkv_layout<8>::bytes(true, fa_qc(8));
}
/* The stages the backward's kernels take for heads of dh with dq by
 * atomics or not: two where they fit the GPU's shared memory a block,
 * else one where that fits, else 0 (fa does not take the heads).
 * WEFT_ATTN_FA_STAGES=1 asks for one wherever the kernels have it, so that
 * a GPU with room for two checks them too (read at each call). */
int fa_stages(int64_t dh, bool atomic) {
  const size_t lim = attention_smem_limit();
  const char *e = getenv("WEFT_ATTN_FA_STAGES");
  const bool one = e && strcmp(e, "1") == 0;
  static bool said;
  if (e && *e && !one && !said) {
    said = true;
    fprintf(stderr, "weft: WEFT_ATTN_FA_STAGES=%s is not 1: the stages that fit run\n", e);
  }
  if (one && (atomic ? fa_atomic_bytes(dh, 1) : fa_bytes(dh, 1)) <= lim) return 1;
  for (int nst = 2; nst >= 1; nst--)
    if ((atomic ? fa_atomic_bytes(dh, nst) : fa_bytes(dh, nst)) <= lim) return nst;
  return 0;
}


/* WEFT_ATTN=wmma: the kernels of attention_tc.cu for everything. */
bool wmma_only(void) { return attention_forced() == ATTN_WMMA; }

} // namespace

bool attention_fa_bwd_takes(int dt, const gpu_attn *a) {
  if (!(dt == GPU_BF16 || dt == GPU_F16) || wmma_only()) return false;
  if (!(a->dh == 32 || a->dh == 64 || a->dh == 96 || a->dh == 128)) return false;
  return fa_stages(a->dh, false) > 0;
}

bool attention_fa_atomic_takes(int dt, const gpu_attn *a) {
  return !a->det && attention_fa_bwd_takes(dt, a) && fa_stages(a->dh, true) > 0;
}

size_t attention_fa_atomic_ws(const gpu_attn *a) { return (size_t)(a->b * a->hq * a->sq * a->dh) * sizeof(float); }

namespace {
/* fa-ds's buffer of dS^T: bytes a batch element takes (16-bit, every key
 * tile's rows over the query positions rounded up to FB), and the batch
 * elements it holds at once: as many as take no more than q, k and v of
 * the whole batch would (at least one), so that it grows with the batch
 * no faster than they do; the backward runs the batch in parts of that
 * many. */
size_t fa_ds_per_b(const gpu_attn *a) {
  return (size_t)(a->hq * ((a->sk + FB - 1) / FB) * FB * ((a->sq + FB - 1) / FB) * FB) * 2;
}
int64_t fa_ds_part(const gpu_attn *a) {
  const size_t qkv = (size_t)(3 * a->b * a->sq * a->hq * a->dh) * 2;
  const int64_t n = (int64_t)(qkv / fa_ds_per_b(a));
  return n < 1 ? 1 : n > a->b ? a->b : n;
}
} // namespace

bool attention_fa_ds_takes(int dt, const gpu_attn *a) {
  return a->qpos == 0 && a->sq == a->sk && attention_fa_bwd_takes(dt, a) &&
         (size_t)ds_layout<8>::BYTES <= attention_smem_limit();
}

/* (16 bytes more: the buffer starts on 16 bytes, fa_ds_backward) */
size_t attention_fa_ds_ws(const gpu_attn *a) { return (size_t)fa_ds_part(a) * fa_ds_per_b(a) + 16; }

namespace {

/* dk and dv (dq too with dqa: attention_fa_atomic) for heads of 16 D16:
 * HOLD, the warps keep their K and V rows in registers; QC, queries at a
 * time; MB, blocks per multiprocessor to keep registers for; NST, stages
 * (dkv_layout). */
template <class T, int D16, bool HOLD, int QC, int MB, int NST = 2>
void fa_dkv(gpu_stream *s, T *dq, T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, const gpu_attn *a,
            bool acc, const float *lse, const float *dsum, bool vec, float *dqa, float scale, T *dsT = NULL) {
  const int64_t tiles = (a->sk + FB - 1) / FB;
  const bool by_tile = attention_fa_by_tile(tiles, a->b);
  const dim3 grid = attention_fa_grid(by_tile, tiles, a->hq / a->r, a->b);
  if (dsT) { /* fa-ds: dS^T stored, no shared memory for it */
    const size_t bytes = dkv_layout<D16, NST>::BYTES;
    allow_smem(k_attn_dkv_fa<T, D16, HOLD, QC, MB, true, NST>, bytes);
    launch(k_attn_dkv_fa<T, D16, HOLD, QC, MB, true, NST>, grid, FT, bytes, s, dk, dv, dout, q, k, v, *a, scale, vec, lse,
           dsum, acc, (float *)NULL, by_tile, dsT);
    return;
  }
  if (dqa) {
    const size_t bytes = dkv_layout<D16, NST>::bytes(true, QC);
    gpu_zero(dqa, attention_fa_atomic_ws(a), s);
    allow_smem(k_attn_dkv_fa<T, D16, HOLD, QC, MB, true, NST>, bytes);
    launch(k_attn_dkv_fa<T, D16, HOLD, QC, MB, true, NST>, grid, FT, bytes, s, dk, dv, dout, q, k, v, *a, scale, vec, lse,
           dsum, acc, dqa, by_tile, (T *)NULL);
    launch(k_attn_dq_store<T>, blocks_for(a->b * a->hq * a->sq * a->dh, 256), 256, 0, s, dq, (const float *)dqa, *a,
           scale, acc);
    return;
  }
  const size_t bytes = dkv_layout<D16, NST>::BYTES;
  allow_smem(k_attn_dkv_fa<T, D16, HOLD, QC, MB, false, NST>, bytes);
  launch(k_attn_dkv_fa<T, D16, HOLD, QC, MB, false, NST>, grid, FT, bytes, s, dk, dv, dout, q, k, v, *a, scale, vec, lse,
         dsum, acc, (float *)NULL, by_tile, (T *)NULL);
}

/* dq for heads of 16 D16: HOLD, the warps keep their Q and dout rows in
 * registers; MB and NST as fa_dkv's. */
template <class T, int D16, bool HOLD, int MB, int NST = 2>
void fa_dq(gpu_stream *s, T *dq, const T *dout, const T *q, const T *k, const T *v, const gpu_attn *a, bool acc,
           const float *lse, const float *dsum, bool vec, float scale) {
  const int64_t tiles = (a->sq + FB - 1) / FB;
  const bool by_tile = attention_fa_by_tile(tiles, a->b);
  const dim3 grid = attention_fa_grid(by_tile, tiles, a->hq, a->b);
  const size_t bytes = dq_layout<D16, NST>::BYTES;
  allow_smem(k_attn_dq_fa<T, D16, HOLD, MB, NST>, bytes);
  launch(k_attn_dq_fa<T, D16, HOLD, MB, NST>, grid, FT, bytes, s, dq, dout, q, k, v, *a, scale, vec, lse, dsum, acc,
         by_tile);
}

/* The occupancy of the two kernels for heads of 64, in blocks of 4 warps
 * per multiprocessor that their registers leave room for: dk/dv 2 (K and
 * V rows in registers, 64 queries at once: over 240 registers on sm_90),
 * 3 (the rows read from shared memory, 32 queries at once: within 168)
 * or 4 (likewise within 128, a few spilled); dq 3 (Q and dout rows in
 * registers) or 4 (read from shared memory, within 128, a few spilled);
 * tests/cuda_check.sh checks the fit with ptxas. All give the same bits:
 * the products add the same fragments in the same order.
 * WEFT_ATTN_FA_BWD_SHAPE=K,Q picks them (read at each call, so that a
 * test or a benchmark runs each); by default 2,3. =wg, wg2 or wgp ask for
 * the kernels on Hopper's warpgroup products (attention_wg.cu, which reads
 * which of them), which give other bits: kv = 0 here. */
struct fa_occupancy {
  int kv, q;
};
fa_occupancy fa_bwd_shape(void) {
  const char *e = getenv("WEFT_ATTN_FA_BWD_SHAPE");
  fa_occupancy o = {2, 3};
  if (!e || !*e) return o;
  if (strcmp(e, "wg") == 0 || strcmp(e, "wg2") == 0 || strcmp(e, "wgp") == 0) return fa_occupancy{0, 0};
  if (strlen(e) == 3 && e[0] >= '2' && e[0] <= '4' && e[1] == ',' && (e[2] == '3' || e[2] == '4')) {
    o.kv = e[0] - '0', o.q = e[2] - '0';
    return o;
  }
  static bool said;
  if (!said) {
    said = true;
    fprintf(stderr, "weft: WEFT_ATTN_FA_BWD_SHAPE=%s is not K,Q (K 2, 3 or 4; Q 3 or 4), wg, wg2 nor wgp: 2,3 runs\n", e);
  }
  return o;
}

template <class T>
void fa_backward(gpu_stream *s, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                 const void *v, const gpu_attn *a, bool acc, const float *lse, const float *dsum, bool vec,
                 float *dqa, T *dsT = NULL) {
  T *gq = (T *)dq, *gk = (T *)dk, *gv = (T *)dv;
  const T *o = (const T *)dout, *qq = (const T *)q, *kk = (const T *)k, *vv = (const T *)v;
  const float scale = (float)(1.0 / sqrt((double)a->dh));
  /* heads up to 64: rows in registers, dk/dv over 64 queries at once, dq
   * within 168 registers (3 blocks a multiprocessor); wider: rows from
   * shared memory, 32 queries at once, up to 255 registers. dk/dv of 32
   * queries at once with the rows in 168 registers spills (heads of 64),
   * and on an H100 was within 2% of these. Heads of 64 in the other
   * occupancies of fa_bwd_shape where it asks. */
  fa_occupancy sh = a->dh == 64 ? fa_bwd_shape() : fa_occupancy{2, 3};
  if (sh.kv == 0) sh = fa_occupancy{2, 3}; /* wg where it could not run (attention_fa_backward) */
  if (dk || dv || dqa || dsT) {
    switch (a->dh) {
    case 32: fa_dkv<T, 2, true, fa_qc(2), 2>(s, gq, gk, gv, o, qq, kk, vv, a, acc, lse, dsum, vec, dqa, scale, dsT); break;
    case 64:
      if (sh.kv == 3)
        fa_dkv<T, 4, false, 32, 3>(s, gq, gk, gv, o, qq, kk, vv, a, acc, lse, dsum, vec, dqa, scale, dsT);
      else if (sh.kv == 4)
        fa_dkv<T, 4, false, 32, 4>(s, gq, gk, gv, o, qq, kk, vv, a, acc, lse, dsum, vec, dqa, scale, dsT);
      else
        fa_dkv<T, 4, true, fa_qc(4), 2>(s, gq, gk, gv, o, qq, kk, vv, a, acc, lse, dsum, vec, dqa, scale, dsT);
      break;
    case 96: fa_dkv<T, 6, false, fa_qc(6), 2>(s, gq, gk, gv, o, qq, kk, vv, a, acc, lse, dsum, vec, dqa, scale, dsT); break;
    default:
      if (fa_stages(128, dqa != NULL) == 1)
        fa_dkv<T, 8, false, fa_qc(8), 2, 1>(s, gq, gk, gv, o, qq, kk, vv, a, acc, lse, dsum, vec, dqa, scale, dsT);
      else
        fa_dkv<T, 8, false, fa_qc(8), 2>(s, gq, gk, gv, o, qq, kk, vv, a, acc, lse, dsum, vec, dqa, scale, dsT);
      break;
    }
  }
  if (!dq || dqa) return;
  if (dsT) { /* fa-ds: dq from the dS^T the dk/dv kernel stored */
    const int64_t tiles = (a->sq + FB - 1) / FB;
    const bool by_tile = attention_fa_by_tile(tiles, a->b);
    const dim3 grid = attention_fa_grid(by_tile, tiles, a->hq, a->b);
    WITH_D16(a->dh, D, {
      allow_smem(k_attn_dq_ds<T, D, 2>, ds_layout<D>::BYTES);
      launch(k_attn_dq_ds<T, D, 2>, grid, FT, ds_layout<D>::BYTES, s, gq, (const T *)dsT, kk, *a, scale, vec, acc,
             by_tile);
    });
    return;
  }
  switch (a->dh) {
  case 32: fa_dq<T, 2, true, 3>(s, gq, o, qq, kk, vv, a, acc, lse, dsum, vec, scale); break;
  case 64:
    if (sh.q == 4)
      fa_dq<T, 4, false, 4>(s, gq, o, qq, kk, vv, a, acc, lse, dsum, vec, scale);
    else
      fa_dq<T, 4, true, 3>(s, gq, o, qq, kk, vv, a, acc, lse, dsum, vec, scale);
    break;
  case 96: fa_dq<T, 6, false, 2>(s, gq, o, qq, kk, vv, a, acc, lse, dsum, vec, scale); break;
  default:
    if (fa_stages(128, false) == 1)
      fa_dq<T, 8, false, 2, 1>(s, gq, o, qq, kk, vv, a, acc, lse, dsum, vec, scale);
    else
      fa_dq<T, 8, false, 2>(s, gq, o, qq, kk, vv, a, acc, lse, dsum, vec, scale);
    break;
  }
}

/* fa-ds: fa_backward with dS^T stored by the dk/dv kernel and dq from it,
 * a part of the batch at a time (fa_ds_part). */
template <class T>
void fa_ds_backward(gpu_stream *s, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                    const void *v, const gpu_attn *a, bool acc, const float *lse, const float *dsum, bool vec,
                    void *buf) {
  const int64_t part = fa_ds_part(a);
  T *ds = (T *)(((uintptr_t)buf + 15) & ~(uintptr_t)15); /* its rows are moved 16 bytes at a time */
  for (int64_t b0 = 0; b0 < a->b; b0 += part) {
    gpu_attn c = *a;
    c.b = a->b - b0 < part ? a->b - b0 : part;
    fa_backward<T>(s, (T *)dq + b0 * a->q_batch, dk ? (T *)dk + b0 * a->kv_batch : NULL,
                   dv ? (T *)dv + b0 * a->kv_batch : NULL, (const T *)dout + b0 * a->o_batch,
                   (const T *)q + b0 * a->q_batch, (const T *)k + b0 * a->kv_batch, (const T *)v + b0 * a->kv_batch,
                   &c, acc, lse + b0 * a->hq * a->sq, dsum + b0 * a->hq * a->sq, vec, NULL, ds);
  }
}

} // namespace

void attention_fa_ds_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                              const void *k, const void *v, const gpu_attn *a, bool acc, const float *lse,
                              const float *dsum, void *buf) {
  const bool vec = attention_rows16(a, dout, q, k, v);
  if (!dq || !(dk || dv)) { /* dq alone, or no dq: the two kernels' way is the shorter */
    attention_fa_backward(s, dt, dq, dk, dv, dout, q, k, v, a, acc, lse, dsum, NULL);
    return;
  }
  if (dt == GPU_F16)
    fa_ds_backward<f16>(s, dq, dk, dv, dout, q, k, v, a, acc, lse, dsum, vec, buf);
  else
    fa_ds_backward<bf16>(s, dq, dk, dv, dout, q, k, v, a, acc, lse, dsum, vec, buf);
}

void attention_fa_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                           const void *k, const void *v, const gpu_attn *a, bool acc, const float *lse,
                           const float *dsum, float *dqa) {
  /* dq by atomics only with dk or dv to sum beside it */
  if (!dq || !(dk || dv)) dqa = NULL;
  const bool vec = attention_rows16(a, dout, q, k, v);
  const fa_occupancy sh = fa_bwd_shape();
  if (!dqa && a->dh == 64 && sh.kv == 0) {
    const char *no = gpu_attention_wg_refusal(dt, a);
    if (!no) {
      attention_wg_backward(s, dt, dq, dk, dv, dout, q, k, v, a, acc, lse, dsum, vec, 0);
      return;
    }
    static bool said;
    if (!said) {
      said = true;
      fprintf(stderr, "weft: WEFT_ATTN_FA_BWD_SHAPE=%s: the warpgroup kernels do not run here (%s): 2,3 runs\n",
              getenv("WEFT_ATTN_FA_BWD_SHAPE"), no);
    }
  }
  if (dt == GPU_F16)
    fa_backward<f16>(s, dq, dk, dv, dout, q, k, v, a, acc, lse, dsum, vec, dqa);
  else
    fa_backward<bf16>(s, dq, dk, dv, dout, q, k, v, a, acc, lse, dsum, vec, dqa);
}
