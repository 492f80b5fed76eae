/* attention_fa.cu - the forward of causal attention of 16-bit tensors
 * (bf16 or f16) on the tensor cores' warp product mma.sync (mma.cuh), the
 * way FlashAttention-2 computes it: the scores never leave registers.
 * Heads of 32, 64, 96 and 128; WEFT_ATTN=wmma sends them back to
 * attention_tc.cu.
 *
 * A block has NW warps; warp w owns MT tiles of 16 query rows, whose Q
 * fragments it loads once (ldmatrix from a staging copy). Key and value
 * tiles of 64 rows stream through shared memory in two buffers: the next
 * tile is copied in (cp.async, 16 bytes a thread at a time) while the
 * current one is computed. Shared rows are dh + 8 elements long, so the
 * eight rows one ldmatrix reads start in eight distinct bank quads.
 *
 * Per key tile a warp computes S = Q K^T in accumulator fragments (16 x 64
 * per query tile: eight n-blocks of 8 keys), masks the keys past its rows'
 * last (only on the tiles that cross the diagonal or the end of the keys),
 * keeps each row's running maximum (scores scaled by log2 e / sqrt(dh), so
 * exp2) with a max over the 4 lanes of a row, turns S into P in place,
 * repacks P's accumulator pairs as the A operand of O += P V (mma.cuh), and
 * rescales O row by row. Each lane sums its own share of a row; the lanes
 * of a row add theirs once at the end. out = O / l; lse = m ln 2 + ln l,
 * the natural log-sum-exp of the scaled scores, as attention_tc.cu writes
 * it. Blocks run in reverse order of their queries: the longest first. A
 * warp whose rows end before a tile skips it; the block still waits at the
 * tile's barriers. No atomics: the same bits every run. */
#include "attention.cuh"
#include "cpasync.cuh"
#include "mma.cuh"

#ifdef WEFT_CUDA_EMU
#include <cstdio>
#include <cstdlib>
#endif

#include <stdlib.h>
#include <string.h>

#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

namespace {

enum { BK = 64 };

/* Rows [r0, r0 + R) of a head (row stride `row` elements, rows from n on
 * zero) into shared memory with rows of LD elements, by all NT threads of
 * the block: 16-byte copies when vec (every row 16-byte aligned), else
 * element by element. */
template <class T, int R, int DH, int NT>
DEV void fetch_rows(T *dst, const T *base, int64_t r0, int64_t row, int64_t n, bool vec) {
  enum { C = DH / 8, LD = DH + 8 };
  if (vec) {
#pragma unroll
    for (int e = (int)threadIdx.x; e < R * C; e += NT) {
      int rr = e / C, c = e % C;
      T *d = dst + rr * LD + c * 8;
      if (r0 + rr < n) {
        cp16(d, base + (r0 + rr) * row + c * 8);
      } else {
#ifdef WEFT_CUDA_EMU
        memset(d, 0, 16);
#else
        *(uint4 *)d = make_uint4(0, 0, 0, 0);
#endif
      }
    }
  } else {
    for (int e = (int)threadIdx.x; e < R * DH; e += NT) {
      int rr = e / DH, c = e % DH;
      dst[rr * LD + c] = r0 + rr < n ? base[(r0 + rr) * row + c] : from_f<T>(0.0f);
    }
  }
}

/* The word w at p (4-byte aligned). */
template <class T> DEV void st_pair(T *p, uint32_t w) {
#ifdef WEFT_CUDA_EMU
  memcpy(p, &w, 4);
#else
  *(uint32_t *)p = w;
#endif
}

/* The shape of a forward: NW warps of MT query tiles of 16 rows each. */
template <int D16, int MT_, int NW_> struct fa_shape {
  enum { MT = MT_, NW = NW_, NT = 32 * NW, BQ = 16 * MT * NW, LD = D16 * 16 + 8 };
  static_assert(BQ <= 2 * BK, "the query tile is staged in the second K/V buffer");
};

/* Shared memory: two buffers of a K tile and a V tile, BK rows of LD each. */
size_t fa_fwd_smem(int64_t dh) { return (size_t)4 * BK * (size_t)(dh + 8) * 2; }

}  // namespace

/* The kernel outside the file's anonymous namespace, so that it has a name
 * where launches are counted (the emulation's WEFT_CUDA_EMU_LAUNCHES). */
template <class T, int D16, int MT_, int NW_>
__global__ void __launch_bounds__(32 * NW_)
    k_attn_fa_fwd(T *out, const T *q, const T *k, const T *v, gpu_attn a, float sl2, bool vec, bool pairs,
                  float *lse, bool by_tile) {
  typedef fa_shape<D16, MT_, NW_> S;
  enum { MT = S::MT, NW = S::NW, NT = S::NT, BQ = S::BQ, LD = S::LD, DH = D16 * 16, NB = BK / 8, OB = D16 * 2 };
  DYN_SMEM(T, sm);
  /* buffer x: K at sm + 2 x BK LD, V after it */
  /* the last query tile first: it sees the most keys */
  int64_t bi, h, tile, tiles;
  attention_fa_block(by_tile, bi, h, tile, tiles);
  const int64_t q0 = (tiles - 1 - tile) * BQ;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const T *qb = q + bi * a.q_batch + h * a.dh;
  const T *kb = k + bi * a.kv_batch + (h / a.r) * a.dh, *vb = v + bi * a.kv_batch + (h / a.r) * a.dh;
  const int64_t last = last_key(a, q0 + BQ), ntiles = last / BK + 1;

  /* the query tile into the second buffer, the first key tile into the first */
  fetch_rows<T, BQ, DH, NT>(sm + 2 * BK * LD, qb, q0, a.q_row, a.sq, vec);
  fetch_rows<T, BK, DH, NT>(sm, kb, 0, a.kv_row, a.sk, vec);
  fetch_rows<T, BK, DH, NT>(sm + BK * LD, vb, 0, a.kv_row, a.sk, vec);
  cp_commit();
  cp_wait<0>();
  __syncthreads();
  const int64_t wq0 = q0 + (int64_t)w * 16 * MT;
  uint32_t qf[MT][D16][4];
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
    for (int kk = 0; kk < D16; kk++)
      ldsm_x4<false>(qf[i][kk], sm + 2 * BK * LD + (w * 16 * MT + i * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
  __syncthreads();

  /* the warp's rows: none from sq on; its last key; the keys every row of
   * it sees (up to qpos + wq0) need no mask */
  const bool active = wq0 < a.sq;
  const int64_t wend = wq0 + 16 * MT < a.sq ? wq0 + 16 * MT : a.sq;
  const int64_t wlast = last_key(a, wend), wfree = a.qpos + wq0;
  float o[MT][OB][4], m[MT][2], l[MT][2];
#pragma unroll
  for (int i = 0; i < MT; i++) {
#pragma unroll
    for (int n = 0; n < OB; n++) o[i][n][0] = o[i][n][1] = o[i][n][2] = o[i][n][3] = 0.0f;
    m[i][0] = m[i][1] = -INFINITY;
    l[i][0] = l[i][1] = 0.0f;
  }

  for (int64_t j = 0; j < ntiles; j++) {
    const int64_t k0 = j * BK;
    const int cur = (int)(j & 1);
    if (j + 1 < ntiles) {
      T *nxt = sm + (cur ^ 1) * 2 * BK * LD;
      fetch_rows<T, BK, DH, NT>(nxt, kb, k0 + BK, a.kv_row, a.sk, vec);
      fetch_rows<T, BK, DH, NT>(nxt + BK * LD, vb, k0 + BK, a.kv_row, a.sk, vec);
    }
    cp_commit();
    cp_wait<1>();
    __syncthreads();
    if (active && k0 <= wlast) {
      const T *Ks = sm + cur * 2 * BK * LD, *Vs = Ks + BK * LD;
      /* S = Q K^T: keys in 4 pairs of n-blocks, through ldmatrix of [n][k] */
      float s[MT][NB][4];
#pragma unroll
      for (int i = 0; i < MT; i++)
#pragma unroll
        for (int n = 0; n < NB; n++) s[i][n][0] = s[i][n][1] = s[i][n][2] = s[i][n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D16; kk++)
#pragma unroll
        for (int n2 = 0; n2 < NB / 2; n2++) {
          uint32_t b[4];
          ldsm_x4<false>(b, Ks + (n2 * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
          for (int i = 0; i < MT; i++) {
            mma16816<T>(s[i][2 * n2], qf[i][kk], b, s[i][2 * n2]);
            mma16816<T>(s[i][2 * n2 + 1], qf[i][kk], b + 2, s[i][2 * n2 + 1]);
          }
        }
      /* keys past a row's last: -inf (tiles across the diagonal or the end) */
      if (k0 + BK - 1 > wfree || k0 + BK > a.sk) {
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
          for (int n = 0; n < NB; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
              int64_t kj = k0 + n * 8 + 2 * t + (e & 1), qi = wq0 + i * 16 + g + (e >> 1) * 8;
              if (kj > a.qpos + qi || kj >= a.sk) s[i][n][e] = -INFINITY;
            }
      }
      /* the running maximum of each row (half 0: row g, 1: row g + 8) */
#pragma unroll
      for (int i = 0; i < MT; i++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
          float mx = -INFINITY;
#pragma unroll
          for (int n = 0; n < NB; n++) mx = fmaxf(mx, fmaxf(s[i][n][2 * hf], s[i][n][2 * hf + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float mnew = fmaxf(m[i][hf], mx * sl2), base = mnew == -INFINITY ? 0.0f : mnew;
          const float corr = exp2f(m[i][hf] - base);
          m[i][hf] = mnew;
          float sum = 0.0f;
#pragma unroll
          for (int n = 0; n < NB; n++)
#pragma unroll
            for (int e = 2 * hf; e < 2 * hf + 2; e++) {
              float p = exp2f(fmaf(s[i][n][e], sl2, -base));
              s[i][n][e] = p;
              sum += p;
            }
          l[i][hf] = l[i][hf] * corr + sum;
#pragma unroll
          for (int n = 0; n < OB; n++) o[i][n][2 * hf] *= corr, o[i][n][2 * hf + 1] *= corr;
        }
      /* O += P V: P's pairs of n-blocks are A operands over 16 keys; V
       * stored [k][n], through ldmatrix .trans */
#pragma unroll
      for (int kc = 0; kc < BK / 16; kc++) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int i = 0; i < MT; i++) {
          pa[i][0] = pack2<T>(s[i][2 * kc][0], s[i][2 * kc][1]);
          pa[i][1] = pack2<T>(s[i][2 * kc][2], s[i][2 * kc][3]);
          pa[i][2] = pack2<T>(s[i][2 * kc + 1][0], s[i][2 * kc + 1][1]);
          pa[i][3] = pack2<T>(s[i][2 * kc + 1][2], s[i][2 * kc + 1][3]);
        }
#pragma unroll
        for (int d16 = 0; d16 < D16; d16++) {
          uint32_t b[4];
          ldsm_x4<true>(b, Vs + (kc * 16 + (lane & 15)) * LD + d16 * 16 + (lane >> 4) * 8);
#pragma unroll
          for (int i = 0; i < MT; i++) {
            mma16816<T>(o[i][2 * d16], pa[i], b, o[i][2 * d16]);
            mma16816<T>(o[i][2 * d16 + 1], pa[i], b + 2, o[i][2 * d16 + 1]);
          }
        }
      }
    }
    __syncthreads();
  }

  /* out = O / l, lse = m ln 2 + ln l; the 4 lanes of a row add their sums */
  if (!active) return;
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      float sum = l[i][hf];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int64_t qi = wq0 + i * 16 + g + hf * 8;
      if (qi >= a.sq) continue;
      const float inv = 1.0f / sum;
      T *dst = out + bi * a.o_batch + h * a.dh + qi * a.o_row + 2 * t;
#pragma unroll
      for (int n = 0; n < OB; n++) {
        float x0 = o[i][n][2 * hf] * inv, x1 = o[i][n][2 * hf + 1] * inv;
        if (pairs) {
          st_pair(dst + n * 8, pack2<T>(x0, x1));
        } else {
          dst[n * 8] = from_f<T>(x0);
          dst[n * 8 + 1] = from_f<T>(x1);
        }
      }
      if (lse && t == 0) lse[(bi * a.hq + h) * a.sq + qi] = m[i][hf] * FA_LN2 + logf(sum);
    }
}

namespace {

/* WEFT_ATTN=wmma: the wmma kernels of attention_tc.cu instead. */
bool fa_off() { return attention_forced() == ATTN_WMMA; }

}  // namespace

bool attention_fa_by_tile(int64_t tiles, int64_t b) {
  const char *e = getenv("WEFT_ATTN_FA_ORDER");
  bool heads = false;
  if (e && *e) {
    heads = strcmp(e, "heads") == 0;
    static bool said;
    if (!heads && strcmp(e, "tiles") != 0 && !said) {
      said = true;
      fprintf(stderr, "weft: WEFT_ATTN_FA_ORDER=%s is neither tiles nor heads: tiles runs (heads where the grid "
                      "cannot)\n", e);
    }
  }
  return !heads && tiles <= 65535 && b <= 65535;
}

bool attention_fa_fwd_takes(int dt, const gpu_attn *a) {
  if (fa_off() || !(dt == GPU_BF16 || dt == GPU_F16)) return false;
  if (!(a->dh == 32 || a->dh == 64 || a->dh == 96 || a->dh == 128)) return false;
  return fa_fwd_smem(a->dh) <= attention_smem_limit();
}

namespace {

/* The forward's shape for heads of dh: 2: two query tiles a warp, 4 warps
 * (heads up to 64); 8: one a warp, 8 warps; 4: one a warp, 4 warps. By
 * default 2 up to 64, else 8 (the fastest on an H100: at batch 8, 12 heads
 * of 64, 1024 keys, 0.092 ms against 0.099 and 0.117; at batch 4, 16 heads
 * of 128, 2048 keys, 0.373 ms against 0.437 for 4). WEFT_ATTN_FA_SHAPE (2,
 * 4 or 8) picks one for every head (read at each call, so that a test
 * runs all three); =wg, the forward on Hopper's warpgroup products
 * (attention_wg.cu) where it runs. */
int fa_shape_for(int64_t dh) {
  const char *e = getenv("WEFT_ATTN_FA_SHAPE");
  const int forced = e && (strcmp(e, "2") == 0 || strcmp(e, "4") == 0 || strcmp(e, "8") == 0) ? atoi(e) : 0;
  int shape = forced ? forced : dh <= 64 ? 2 : 8;
  return shape == 2 && dh > 64 ? 4 : shape;
}

template <int D, int MT, int NW>
void fa_launch(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v, const gpu_attn *a,
               float *lse, float sl2, bool vec, bool pairs) {
  typedef fa_shape<D, MT, NW> S;
  const size_t sm = fa_fwd_smem(a->dh);
  const int64_t tiles = (a->sq + S::BQ - 1) / S::BQ;
  const bool by_tile = attention_fa_by_tile(tiles, a->b);
  const dim3 grid = attention_fa_grid(by_tile, tiles, a->hq, a->b);
  if (dt == GPU_F16) {
    allow_smem(k_attn_fa_fwd<f16, D, MT, NW>, sm);
    launch(k_attn_fa_fwd<f16, D, MT, NW>, grid, S::NT, sm, s, (f16 *)out, (const f16 *)q, (const f16 *)k,
           (const f16 *)v, *a, sl2, vec, pairs, lse, by_tile);
  } else {
    allow_smem(k_attn_fa_fwd<bf16, D, MT, NW>, sm);
    launch(k_attn_fa_fwd<bf16, D, MT, NW>, grid, S::NT, sm, s, (bf16 *)out, (const bf16 *)q, (const bf16 *)k,
           (const bf16 *)v, *a, sl2, vec, pairs, lse, by_tile);
  }
}

}  // namespace


void attention_fa_forward(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v,
                          const gpu_attn *a, float *lse) {
  const float sl2 = (float)(1.0 / sqrt((double)a->dh)) * FA_LOG2E;
  /* 16-byte copies need every row of q, k, v on 16 bytes; pair stores of
   * out every row of it on 4 */
  const bool vec = a->q_row % 8 == 0 && a->kv_row % 8 == 0 && a->q_batch % 8 == 0 && a->kv_batch % 8 == 0 &&
                   al16(q) && al16(k) && al16(v);
  const bool pairs = a->o_row % 2 == 0 && a->o_batch % 2 == 0 && ((uintptr_t)out & 3) == 0;
  const char *e = getenv("WEFT_ATTN_FA_SHAPE");
  if (e && strcmp(e, "wg") == 0) {
    /* the forward on Hopper's warpgroup products (attention_wg.cu) */
    const char *no = gpu_attention_wg_refusal(dt, a);
    if (!no) {
      attention_wg_forward(s, dt, out, q, k, v, a, lse);
      return;
    }
    static bool said;
    if (!said) {
      said = true;
      fprintf(stderr, "weft: WEFT_ATTN_FA_SHAPE=wg: the warpgroup kernels do not run here (%s): the default shape "
                      "runs\n", no);
    }
  }
  const int shape = fa_shape_for(a->dh);
  WITH_D16(a->dh, D, {
    if constexpr (D <= 4) {
      if (shape == 2) {
        fa_launch<D, 2, 4>(s, dt, out, q, k, v, a, lse, sl2, vec, pairs);
        break;
      }
    }
    if (shape == 8)
      fa_launch<D, 1, 8>(s, dt, out, q, k, v, a, lse, sl2, vec, pairs);
    else
      fa_launch<D, 1, 4>(s, dt, out, q, k, v, a, lse, sl2, vec, pairs);
  });
}
