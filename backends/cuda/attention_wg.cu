/* attention_wg.cu - causal attention at heads of 64 on Hopper's
 * warpgroup products (wgmma.cuh; this file is built for sm_90a alone and
 * runs on GPUs of compute capability 9.0 whose product passed its
 * self-check, wg_verified). The kernels of attention_fa.cu (the forward)
 * and attention_fa_bwd.cu (the backward's two), by the same steps and
 * masks, the scores kept in registers, but each product is one wgmma of
 * the block's warpgroup over a 64 x 64 tile in shared memory (64 by 64 by
 * 16 a product) instead of each warp's mma.sync over fragments it loaded
 * by ldmatrix: the tensor cores read the streamed tile themselves, in
 * either orientation (K-major for S = Q K^T, MN-major for dV += P^T dO),
 * so the tiles are laid out once, in the 128-byte swizzle, and never
 * transposed. The ways fa-wg (forward and backward) and fa-wgp (the
 * backward pipelined) of attention_pick.cu run them; so do
 * WEFT_ATTN_FA_SHAPE=wg and WEFT_ATTN_FA_BWD_SHAPE=wg, wg2, wgp in place
 * of fa's kernels.
 *   forward: a block takes 64 queries of one head (the last first), Q rows
 *   in registers, over the key tiles up to its last row: S = Q K^T, the
 *   running maximum and sum, O += P V.
 *   dk, dv: a block of 4 warps takes 64 keys of one key/value head (warp w
 *   keys 16 w on, its K and V rows as A fragments in registers) and walks
 *   the query tiles that see them: S^T = K Q^T, P^T, dV += P^T dO,
 *   dP^T = V dO^T (these two in one group), dS^T, dK += dS^T Q.
 *   dq: a block takes 64 queries of one head (the last first), Q and dO
 *   rows in registers, over the key tiles up to its last row: S = Q K^T,
 *   P, dP = dO V^T, dS, dQ += dS K.
 * Every warp of the group takes part in every product (wgmma is the
 * group's), so the masks zero what a warp of attention_fa_bwd.cu skips.
 * No atomics: the same bits in two runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "attention.cuh"
#include "attention_bwd.cuh"
#include "wgmma.cuh"

#if defined(__CUDA_ARCH__) && !defined(WEFT_CUDA_EMU) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_wg.cu is built for sm_90a alone"
#endif

namespace {

/* threads and rows of a block; bytes of a swizzled tile (wgmma.cuh) */
constexpr int WT = 128, WB = 64, TILE = WB * 128;
static_assert(WB == STATS_ROWS && WT == 2 * STATS_ROWS, "stats_to: a thread a number");

/* Rows [0, WB) of a head of 64 from src (row stride `row` elements) into a
 * swizzled tile, 8 elements a copy (cp.async when vec, else plain loads);
 * rows from `left` on are zero. Every thread of the block calls it. */
template <class T> DEV void tile_to(unsigned char *dst, const T *src, int64_t row, int left, bool vec) {
#pragma unroll
  for (int i = 0; i < WB * 8 / WT; i++) {
    const int e = (int)threadIdx.x + i * WT, r = e >> 3, c = e & 7;
    unsigned char *d = dst + wg_at(r, c * 8);
    if (r < left) {
      const T *s = src + r * row + c * 8;
      if (vec) {
        cp16(d, s);
      } else {
#pragma unroll
        for (int j = 0; j < 8; j++) ((T *)d)[j] = s[j];
        stored16(d);
      }
    } else {
      zero16(d);
    }
  }
}

/* The key and value tiles of keys [k0, k0 + WB) of a head (at kb, vb)
 * into a stage of two tiles. */
template <class T>
DEV void kv_to(unsigned char *stage, const T *kb, const T *vb, int k0, const gpu_attn &a, bool vec) {
  tile_to<T>(stage, kb + (int64_t)k0 * a.kv_row, a.kv_row, (int)a.sk - k0, vec);
  tile_to<T>(stage + TILE, vb + (int64_t)k0 * a.kv_row, a.kv_row, (int)a.sk - k0, vec);
}

/* A streamed stage in place for the products: the copies issued (all but
 * the last group waited for), made visible to the tensor cores' reads,
 * then the block's barrier. */
DEV void stage_ready() {
  cp_commit();
  cp_wait<1>();
  wg_proxy_fence();
  __syncthreads();
}

/* The A fragment of the 16 x 16 block at (r0, c0) of a swizzled tile. */
DEV void tile_a(uint32_t a[4], const unsigned char *tile, int r0, int c0, int lane) {
  ldsm_x4<false>(a, tile + wg_at(r0 + (lane & 15), c0 + (lane >> 4) * 8));
}

/* x = A B over k = 64: A the warp's four A fragments, B the tile K-major. */
template <class T> DEV void product_k(float (*x)[4], const uint32_t (*af)[4], const unsigned char *tile) {
  const wg_desc b = wg_kmajor(tile);
#pragma unroll
  for (int kk = 0; kk < 4; kk++) wg_mma<T, false>(x, af[kk], wg_add(b, 32 * kk), kk > 0);
}
/* g += A B over k = 64: A the warp's 16 x 64 scores (pp), B the tile MN-major. */
template <class T> DEV void product_mn(float (*g)[4], const uint32_t (*pp)[4], const unsigned char *tile) {
  const wg_desc b = wg_mnmajor(tile);
#pragma unroll
  for (int j = 0; j < 4; j++) wg_mma<T, true>(g, pp[j], wg_add(b, 2048 * j), true);
}
/* Until every product issued is done, their results held in place. */
DEV void products_done(float (*x)[4]) {
  wg_commit();
  wg_wait<0>();
  wg_hold(x);
}

/* Shared memory (bytes, with 1024 to align the tiles): dk/dv's K and V
 * tiles, then two stages of a query tile, its dout tile and lse and D of
 * their rows (in 1024 bytes, so that the next stage's tiles are aligned);
 * dq's Q and dout tiles, then two stages of a key tile and its value tile. */
constexpr int DKV_STAGE = 2 * TILE + 1024, DKV_BYTES = 2 * TILE + 2 * DKV_STAGE + 1024;
constexpr int DQ_STAGE = 2 * TILE, DQ_BYTES = 2 * TILE + 2 * DQ_STAGE + 1024;

} // namespace

/* dk, dv of keys [k0, k0 + WB) of key/value head hk; warp w owns 16; MB
 * blocks a multiprocessor to keep registers for (2 or 3). PIPE: the
 * products that need no result of the exponentials run while they are
 * computed (dP^T beside P^T, dK's operand beside dV), in more registers. */
template <class T, int MB, bool PIPE>
__global__ void __launch_bounds__(WT, MB)
    k_attn_dkv_wg(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, gpu_attn a, float scale,
                  bool vec, const float *lse, const float *dsum, bool acc, bool by_tile) {
  DYN_SMEM(unsigned char, raw0);
  unsigned char *raw = wg_align(raw0);
  unsigned char *Ks = raw, *Vs = raw + TILE, *stages = raw + 2 * TILE;
  int64_t bi, hk, tile, grid_tiles;
  attention_fa_block(by_tile, bi, hk, tile, grid_tiles);
  const int k0 = (int)tile * WB, sq = (int)a.sq, qpos = (int)a.qpos;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3, kw = k0 + 16 * w;
  const int64_t kvoff = bi * a.kv_batch + hk * a.dh;
  q += bi * a.q_batch, dout += bi * a.o_batch, lse += bi * a.hq * a.sq, dsum += bi * a.hq * a.sq;
  tile_to<T>(Ks, k + kvoff + k0 * a.kv_row, a.kv_row, (int)a.sk - k0, vec);
  tile_to<T>(Vs, v + kvoff + k0 * a.kv_row, a.kv_row, (int)a.sk - k0, vec);
  cp_commit();
  /* the query rows from qs on see some of these keys: their tiles, for
   * each query head of the group; (fh, fq) the next to fetch, q0 the one
   * computed */
  const int qs = k0 > qpos ? k0 - qpos : 0;
  const int64_t steps = qs < sq ? a.r * ((sq - qs + WB - 1) / WB) : 0;
  int64_t fh = hk * a.r;
  int fq = qs, q0 = qs;
  auto fetch = [&](unsigned char *stage) {
    const int left = sq - fq;
    tile_to<T>(stage, q + fh * a.dh + fq * a.q_row, a.q_row, left, vec);
    tile_to<T>(stage + TILE, dout + fh * a.dh + fq * a.o_row, a.o_row, left, vec);
    float *Ls = (float *)(stage + 2 * TILE);
    stats_to(Ls, Ls + WB, lse + fh * a.sq + fq, dsum + fh * a.sq + fq, left);
    if ((fq += WB) >= sq) fq = qs, fh++;
  };
  if (steps > 0) fetch(stages);
  cp_commit();
  cp_wait<1>();
  __syncthreads();
  uint32_t kf[4][4], vf[4][4];
#pragma unroll
  for (int kk = 0; kk < 4; kk++) tile_a(kf[kk], Ks, 16 * w, 16 * kk, lane), tile_a(vf[kk], Vs, 16 * w, 16 * kk, lane);
  float gk[8][4], gv[8][4];
#pragma unroll
  for (int n = 0; n < 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) gk[n][e] = gv[n][e] = 0.0f;
  const float sl2 = scale * kLog2e;
  for (int64_t st = 0; st < steps; st++) {
    if (st + 1 < steps) fetch(stages + ((st + 1) & 1) * DKV_STAGE);
    stage_ready();
    const unsigned char *Qs = stages + (st & 1) * DKV_STAGE, *Os = Qs + TILE;
    const float *Ls = (const float *)(Qs + 2 * TILE), *Ds = Ls + WB;
    /* S^T: key kw + g (+ 8) against query q0 + column */
    float x[8][4], y[PIPE ? 8 : 1][4];
    wg_fence();
    product_k<T>(x, kf, Qs);
    wg_commit();
    if constexpr (PIPE) {
      product_k<T>(y, vf, Os); /* dP^T = V dO^T, while P^T is computed */
      wg_commit();
      wg_wait<1>();
    } else {
      wg_wait<0>();
    }
    wg_hold(x);
    /* P^T, masked where some key of the warp comes after the tile's first
     * query: columns below lim are not seen */
    const int rel = kw - qpos - q0, lim0 = rel + g, lim1 = lim0 + 8;
    const bool edge = rel + 15 > 0;
    uint32_t pp[4][4];
    probs_kv<T, 8>(pp, x, Ls, 0, sl2, edge, lim0, lim1, false, false, t);
    /* PIPE: a copy of P^T for dS^T, read while dV still reads pp */
    uint32_t pc[PIPE ? 4 : 1][4];
    if constexpr (PIPE) wg_copy(pc, pp);
    wg_fence(pp);
    product_mn<T>(gv, pp, Os); /* dV += P^T dO */
    if constexpr (PIPE) {
      /* dS^T = P^T (dP^T - D) from the copy into registers of its own
       * while dV runs on P^T; dK += dS^T Q */
      wg_commit();
      wg_wait<1>();
      wg_hold(y);
      uint32_t ds[4][4];
      dscores_kv<T, 8>(ds, pc, y, Ds, 0, t);
      wg_fence(ds);
      product_mn<T>(gk, ds, Qs);
      products_done(gk);
      wg_hold(gv);
    } else {
      /* and dP^T = V dO^T in one group; dS^T = P^T (dP^T - D) in place of
       * P^T; dK += dS^T Q */
      product_k<T>(x, vf, Os);
      products_done(x);
      wg_hold(gv);
      dscores_kv<T, 8>(pp, pp, x, Ds, 0, t);
      wg_fence(pp);
      product_mn<T>(gk, pp, Qs);
      products_done(gk);
    }
    if ((q0 += WB) >= sq) q0 = qs;
    __syncthreads();
  }
  store_kv<T, 8>(dk, dv, gk, gv, kvoff + (kw + g) * a.kv_row + 2 * t, a.kv_row, kw + g, a.sk, scale, acc);
}

/* dq of query rows [q0, q0 + WB) of head h, the last block the first;
 * warp w owns 16; MB as k_attn_dkv_wg's. PIPE: dP = dO V^T runs while P
 * is computed, in more registers. */
template <class T, int MB, bool PIPE>
__global__ void __launch_bounds__(WT, MB)
    k_attn_dq_wg(T *dq, const T *dout, const T *q, const T *k, const T *v, gpu_attn a, float scale, bool vec,
                 const float *lse, const float *dsum, bool acc, bool by_tile) {
  DYN_SMEM(unsigned char, raw0);
  unsigned char *raw = wg_align(raw0);
  unsigned char *Qs = raw, *Os = raw + TILE, *stages = raw + 2 * TILE;
  int64_t bi, h, tile, grid_tiles;
  attention_fa_block(by_tile, bi, h, tile, grid_tiles);
  const int q0 = (int)(grid_tiles - 1 - tile) * WB, sq = (int)a.sq, sk = (int)a.sk, qpos = (int)a.qpos;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int qw = q0 + 16 * w, qi0 = qw + g, qi1 = qi0 + 8;
  const T *kb = k + bi * a.kv_batch + (h / a.r) * a.dh, *vb = v + bi * a.kv_batch + (h / a.r) * a.dh;
  tile_to<T>(Qs, q + bi * a.q_batch + h * a.dh + q0 * a.q_row, a.q_row, sq - q0, vec);
  tile_to<T>(Os, dout + bi * a.o_batch + h * a.dh + q0 * a.o_row, a.o_row, sq - q0, vec);
  cp_commit();
  const int tiles = (int)last_key(a, q0 + WB) / WB + 1;
  kv_to<T>(stages, kb, vb, 0, a, vec);
  cp_commit();
  cp_wait<1>();
  __syncthreads();
  uint32_t qf[4][4], of[4][4];
#pragma unroll
  for (int kk = 0; kk < 4; kk++) tile_a(qf[kk], Qs, 16 * w, 16 * kk, lane), tile_a(of[kk], Os, 16 * w, 16 * kk, lane);
  const int64_t at = (bi * a.hq + h) * a.sq;
  const float l0 = qi0 < sq ? lse[at + qi0] * kLog2e : INFINITY, l1 = qi1 < sq ? lse[at + qi1] * kLog2e : INFINITY;
  const float d0 = qi0 < sq ? dsum[at + qi0] : 0.0f, d1 = qi1 < sq ? dsum[at + qi1] : 0.0f;
  /* the last key each of the lane's rows sees */
  const int see0 = qpos + qi0 < sk - 1 ? qpos + qi0 : sk - 1, see1 = qpos + qi1 < sk - 1 ? qpos + qi1 : sk - 1;
  const float sl2 = scale * kLog2e;
  float gq[8][4];
#pragma unroll
  for (int n = 0; n < 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) gq[n][e] = 0.0f;
  for (int kt = 0; kt < tiles; kt++) {
    const int k0 = kt * WB;
    if (kt + 1 < tiles) kv_to<T>(stages + ((kt + 1) & 1) * DQ_STAGE, kb, vb, k0 + WB, a, vec);
    stage_ready();
    const unsigned char *Ks = stages + (kt & 1) * DQ_STAGE, *Vs = Ks + TILE;
    float x[8][4], y[PIPE ? 8 : 1][4];
    uint32_t pp[4][4];
    wg_fence();
    product_k<T>(x, qf, Ks);
    wg_commit();
    if constexpr (PIPE) {
      product_k<T>(y, of, Vs); /* dP = dO V^T, while P is computed */
      wg_commit();
      wg_wait<1>();
    } else {
      wg_wait<0>();
    }
    wg_hold(x);
    /* P: query qi0 (qi1) against key k0 + column; masked where the tile
     * ends after the warp's first query sees, or after the keys */
    const bool edge = k0 + WB - 1 > qpos + qw || k0 + WB > sk;
    const int lim0 = see0 - k0, lim1 = see1 - k0; /* columns above are not seen */
    probs_q<T, 8>(pp, x, l0, l1, sl2, edge, lim0, lim1, t);
    /* dP = dO V^T; dS = P (dP - D); dQ += dS K */
    if constexpr (PIPE) {
      wg_wait<0>();
      wg_hold(y);
      dscores_q<T, 8>(pp, y, d0, d1);
    } else {
      wg_fence();
      product_k<T>(x, of, Vs);
      products_done(x);
      dscores_q<T, 8>(pp, x, d0, d1);
    }
    wg_fence(pp);
    product_mn<T>(gq, pp, Ks);
    products_done(gq);
    __syncthreads();
  }
  store_q<T, 8>(dq + bi * a.q_batch + h * a.dh + 2 * t, gq, qi0, qi1, a.sq, a.q_row, scale, acc);
}

/* The forward at heads of 64: out (and each row's log-sum-exp) of query
 * rows [q0, q0 + WB) of head h, the last block the first; warp w owns 16.
 * The key tiles up to the block's last row streamed through two stages;
 * S = Q K^T and O += P V one warpgroup product each, the online softmax
 * (running maximum and sum) in registers as attention_fa.cu's, in exp2
 * of scores scaled by sl2 = scale log2 e. 4 blocks an SM (within 128
 * registers; 41 KB of shared memory each). */
template <class T>
__global__ void __launch_bounds__(WT, 4)
    k_attn_fwd_wg(T *out, const T *q, const T *k, const T *v, gpu_attn a, float sl2, bool vec, float *lse,
                  bool by_tile) {
  DYN_SMEM(unsigned char, raw0);
  unsigned char *raw = wg_align(raw0);
  unsigned char *Qs = raw, *stages = raw + TILE;
  int64_t bi, h, tile, grid_tiles;
  attention_fa_block(by_tile, bi, h, tile, grid_tiles);
  const int q0 = (int)(grid_tiles - 1 - tile) * WB, sq = (int)a.sq, sk = (int)a.sk, qpos = (int)a.qpos;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3, qw = q0 + 16 * w;
  const T *kb = k + bi * a.kv_batch + (h / a.r) * a.dh, *vb = v + bi * a.kv_batch + (h / a.r) * a.dh;
  tile_to<T>(Qs, q + bi * a.q_batch + h * a.dh + q0 * a.q_row, a.q_row, sq - q0, vec);
  cp_commit();
  const int tiles = (int)last_key(a, q0 + WB) / WB + 1;
  kv_to<T>(stages, kb, vb, 0, a, vec);
  cp_commit();
  cp_wait<1>();
  __syncthreads();
  uint32_t qf[4][4];
#pragma unroll
  for (int kk = 0; kk < 4; kk++) tile_a(qf[kk], Qs, 16 * w, 16 * kk, lane);
  float o[8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  for (int kt = 0; kt < tiles; kt++) {
    const int k0 = kt * WB;
    if (kt + 1 < tiles) kv_to<T>(stages + ((kt + 1) & 1) * 2 * TILE, kb, vb, k0 + WB, a, vec);
    stage_ready();
    const unsigned char *Ks = stages + (kt & 1) * 2 * TILE, *Vs = Ks + TILE;
    float s[8][4];
    wg_fence();
    product_k<T>(s, qf, Ks);
    products_done(s);
    /* keys past a row's last: -inf (tiles across the diagonal or the end) */
    if (k0 + WB - 1 > qpos + qw || k0 + WB > sk) {
#pragma unroll
      for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int kj = k0 + n * 8 + 2 * t + (e & 1), qi = qw + g + (e >> 1) * 8;
          if (kj > qpos + qi || kj >= sk) s[n][e] = -INFINITY;
        }
    }
    /* the running maximum of each row (hf 0: row g, 1: row g + 8), P in
     * place of S, the sums, O rescaled */
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < 8; n++) mx = fmaxf(mx, fmaxf(s[n][2 * hf], s[n][2 * hf + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mnew = fmaxf(m[hf], mx * sl2), base = mnew == -INFINITY ? 0.0f : mnew;
      const float corr = exp2f(m[hf] - base);
      m[hf] = mnew;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 2 * hf; e < 2 * hf + 2; e++) {
          const float p = exp2f(fmaf(s[n][e], sl2, -base));
          s[n][e] = p;
          sum += p;
        }
      l[hf] = l[hf] * corr + sum;
#pragma unroll
      for (int n = 0; n < 8; n++) o[n][2 * hf] *= corr, o[n][2 * hf + 1] *= corr;
    }
    uint32_t pp[4][4];
#pragma unroll
    for (int nb = 0; nb < 8; nb++) pack_c<T>(pp, nb, s[nb][0], s[nb][1], s[nb][2], s[nb][3]);
    /* O += P V, O rescaled above: held before the fence */
    wg_hold(o);
    wg_fence(pp);
    product_mn<T>(o, pp, Vs);
    products_done(o);
    __syncthreads();
  }
  /* out = O / l, lse = m ln 2 + ln l; the 4 lanes of a row add their sums */
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    float sum = l[hf];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int qi = qw + g + hf * 8;
    if (qi >= sq) continue;
    const float inv = 1.0f / sum;
    T *dst = out + bi * a.o_batch + h * a.dh + (int64_t)qi * a.o_row + 2 * t;
#pragma unroll
    for (int n = 0; n < 8; n++) dst[n * 8] = from_f<T>(o[n][2 * hf] * inv), dst[n * 8 + 1] = from_f<T>(o[n][2 * hf + 1] * inv);
    if (lse && t == 0) lse[(bi * a.hq + h) * a.sq + qi] = m[hf] * 0.6931471805599453f + logf(sum);
  }
}

/* gpu_wgmma_check's products: A (64 x 64, row-major) by B stored [n][k]
 * (K-major) into d[0, 4096), and by B stored [k][n] (MN-major) into
 * d[4096, 8192), each row-major, through swizzled tiles; then two
 * diagnostics, to say which part of the layouts a GPU reads otherwise
 * where those fail: A too from shared memory (K-major) by B K-major into
 * d[8192, 12288), and B MN-major with the descriptor's two offsets
 * swapped into d[12288, 16384). */
template <class T> __global__ void __launch_bounds__(WT) k_wgmma_check(float *d, const T *a, const T *b_nk, const T *b_kn) {
  DYN_SMEM(unsigned char, raw0);
  unsigned char *raw = wg_align(raw0);
  unsigned char *As = raw, *Bn = raw + TILE, *Bk = raw + 2 * TILE;
  tile_to<T>(As, a, WB, WB, true);
  tile_to<T>(Bn, b_nk, WB, WB, true);
  tile_to<T>(Bk, b_kn, WB, WB, true);
  tile_to<T>(Bk + TILE, b_kn, WB, 0, true); /* zeros, where the swapped offsets read */
  cp_commit();
  cp_wait<0>();
  wg_proxy_fence();
  __syncthreads();
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  uint32_t af[4][4];
#pragma unroll
  for (int kk = 0; kk < 4; kk++) tile_a(af[kk], As, 16 * w, 16 * kk, lane);
  float x[8][4];
  auto store = [&](float *out) {
    for (int nb = 0; nb < 8; nb++)
      for (int e = 0; e < 4; e++) out[(16 * w + g + (e >= 2 ? 8 : 0)) * 64 + nb * 8 + 2 * t + (e & 1)] = x[nb][e];
  };
  wg_fence(af);
  product_k<T>(x, af, Bn);
  products_done(x);
  store(d);
  wg_fence(af);
  const wg_desc b = wg_mnmajor(Bk);
#pragma unroll
  for (int kk = 0; kk < 4; kk++) wg_mma<T, true>(x, af[kk], wg_add(b, 2048 * kk), kk > 0);
  products_done(x);
  store(d + 4096);
  wg_fence();
  const wg_desc sa = wg_kmajor(As), sb = wg_kmajor(Bn);
#pragma unroll
  for (int kk = 0; kk < 4; kk++) wg_mma_ss<T>(x, wg_add(sa, 32 * kk), wg_add(sb, 32 * kk), kk > 0);
  products_done(x);
  store(d + 8192);
  wg_fence(af);
  const wg_desc swapped = wg_make(Bk, 1024, 8192);
#pragma unroll
  for (int kk = 0; kk < 4; kk++) wg_mma<T, true>(x, af[kk], wg_add(swapped, 2048 * kk), kk > 0);
  products_done(x);
  store(d + 12288);
}

namespace {

/* Whether the GPU runs this file's kernels (compute capability 9.0). */
bool wg_device(void) {
#ifdef WEFT_CUDA_EMU
  return emu_device().major == 9 && emu_device().minor == 0;
#else
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
#endif
}

template <class T, int MB, bool PIPE>
void wg_dkv(gpu_stream *s, T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, const gpu_attn *a,
            bool acc, const float *lse, const float *dsum, bool vec, float scale) {
  const int64_t tiles = (a->sk + WB - 1) / WB;
  const bool by_tile = attention_fa_by_tile(tiles, a->b);
  allow_smem(k_attn_dkv_wg<T, MB, PIPE>, DKV_BYTES);
  launch(k_attn_dkv_wg<T, MB, PIPE>, attention_fa_grid(by_tile, tiles, a->hq / a->r, a->b), WT, DKV_BYTES, s, dk, dv,
         dout, q, k, v, *a, scale, vec, lse, dsum, acc, by_tile);
}

template <class T, int MB, bool PIPE>
void wg_dq(gpu_stream *s, T *dq, const T *dout, const T *q, const T *k, const T *v, const gpu_attn *a, bool acc,
           const float *lse, const float *dsum, bool vec, float scale) {
  const int64_t tiles = (a->sq + WB - 1) / WB;
  const bool by_tile = attention_fa_by_tile(tiles, a->b);
  allow_smem(k_attn_dq_wg<T, MB, PIPE>, DQ_BYTES);
  launch(k_attn_dq_wg<T, MB, PIPE>, attention_fa_grid(by_tile, tiles, a->hq, a->b), WT, DQ_BYTES, s, dq, dout, q, k, v,
         *a, scale, vec, lse, dsum, acc, by_tile);
}

/* shape: 3 (dk/dv in 3 blocks an SM), 2 (in 2), or 1 (both kernels
 * pipelined, dk/dv in 2 blocks an SM and dq in 3). */
template <class T>
void wg_backward(gpu_stream *s, T *dq, T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v,
                 const gpu_attn *a, bool acc, const float *lse, const float *dsum, bool vec, int shape) {
  const float scale = (float)(1.0 / sqrt((double)a->dh));
  if (dk || dv) {
    if (shape == 1)
      wg_dkv<T, 2, true>(s, dk, dv, dout, q, k, v, a, acc, lse, dsum, vec, scale);
    else if (shape == 2)
      wg_dkv<T, 2, false>(s, dk, dv, dout, q, k, v, a, acc, lse, dsum, vec, scale);
    else
      wg_dkv<T, 3, false>(s, dk, dv, dout, q, k, v, a, acc, lse, dsum, vec, scale);
  }
  if (dq) {
    if (shape == 1)
      wg_dq<T, 3, true>(s, dq, dout, q, k, v, a, acc, lse, dsum, vec, scale);
    else
      wg_dq<T, 3, false>(s, dq, dout, q, k, v, a, acc, lse, dsum, vec, scale);
  }
}

} // namespace

namespace {

/* The warpgroup product's self-check on the current device, once (a
 * product of 64 x 64 by 64 x 64 in bf16, then f16, of small multiples of
 * 1/8, whose f32 sums are exact, against the host's, B laid out either
 * way): a GPU
 * that reads the layouts otherwise than wgmma.cuh has them never runs the
 * kernels (said once; so is a check that could not run, out of memory
 * or a launch that failed, and that too is kept for the process).
 * WEFT_CUDA_EMU_SPOIL=wg makes the host's sums off on the emulation, to
 * try the refusal. The plugin's calls come from one host thread. */
bool wg_verified(void) {
  enum { DEVS = 64 };
  static signed char state[DEVS];
  int dev = 0;
#ifndef WEFT_CUDA_EMU
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= DEVS) return false;
#endif
  if (state[dev]) return state[dev] > 0;
  /* the 16 bits of a small multiple of 1/8 in bf16 or f16 (exact in both) */
  auto bits = [](float x, int dt) -> uint16_t {
    uint32_t b;
    memcpy(&b, &x, 4);
    if (dt == GPU_BF16 || x == 0.0f) return (uint16_t)(b >> 16);
    const int e = (int)((b >> 23) & 0xff) - 127;
    return (uint16_t)(((b >> 16) & 0x8000u) | (uint32_t)(e + 15) << 10 | ((b >> 13) & 0x3ffu));
  };
  auto val = [](int i, int k, int m) { return (float)((i * m + k * 3) % 11 - 5) * 0.125f; };
  std::vector<float> want(4096), got(16384);
  for (int i = 0; i < 64; i++)
    for (int j = 0; j < 64; j++) {
      float sum = 0;
      for (int k = 0; k < 64; k++) sum += val(i, k, 7) * val(k, j, 5);
      want[i * 64 + j] = sum;
    }
#ifdef WEFT_CUDA_EMU
  const char *spoil = getenv("WEFT_CUDA_EMU_SPOIL");
  if (spoil && strcmp(spoil, "wg") == 0) want[64 * 17 + 5] += 1.0f;
#endif
  char err[256] = "";
  bool ok = true;
  std::vector<uint16_t> in(3 * 4096);
  gpu_stream *st = gpu_stream_new(err, sizeof err);
  /* in the stream's order: no wait for the device's other work */
  void *din = st ? gpu_alloc_on(in.size() * 2, st, err, sizeof err) : NULL;
  float *dd = din ? (float *)gpu_alloc_on(got.size() * 4, st, err, sizeof err) : NULL;
  const int dts[2] = {GPU_BF16, GPU_F16};
  for (int d = 0; d < 2 && ok; d++) {
    for (int i = 0; i < 64; i++)
      for (int k = 0; k < 64; k++) {
        in[i * 64 + k] = bits(val(i, k, 7), dts[d]);            /* A, row-major */
        in[2 * 4096 + k * 64 + i] = bits(val(k, i, 5), dts[d]); /* B [k][n] */
        in[4096 + i * 64 + k] = bits(val(k, i, 5), dts[d]);     /* B [n][k] (n = i) */
      }
    if (!(dd && gpu_upload(din, in.data(), in.size() * 2, st, err, sizeof err) &&
          gpu_wgmma_check(st, dts[d], dd, din, (const char *)din + 4096 * 2, (const char *)din + 2 * 4096 * 2) &&
          gpu_check("k_wgmma_check", err, sizeof err) &&
          gpu_download(got.data(), dd, got.size() * 4, st, err, sizeof err))) {
      fprintf(stderr, "weft: CUDA device %d: the warpgroup product's self-check did not run (%s): its kernels (fa-wg) "
                      "do not run here; a fault there ends the process's use of the GPU, and WEFT_ATTN_WG=off keeps "
                      "them out\n", dev, err[0] ? err : "not on this GPU");
      ok = false;
      break;
    }
    for (int c = 0; c < 2 && ok; c++)
      for (int i = 0; i < 4096 && ok; i++) ok = got[c * 4096 + i] == want[i];
    if (!ok)
      fprintf(stderr, "weft: CUDA device %d: the warpgroup product's self-check (wgmma.cuh, %s) gave other sums than "
                      "the host's: its kernels (fa-wg) do not run here\n", dev, dts[d] == GPU_F16 ? "f16" : "bf16");
  }
  if (dd) gpu_free_on(dd, st);
  if (din) gpu_free_on(din, st);
  if (st) gpu_stream_free(st);
  state[dev] = ok ? 1 : -1;
  return ok;
}

} // namespace

/* A fault of a kernel ends the process's CUDA context, which no
 * self-check can turn away afterwards: a GPU where one faults needs a way
 * around them. */
bool attention_wg_off(void) {
  const char *e = getenv("WEFT_ATTN_WG");
  return e && (strcmp(e, "off") == 0 || strcmp(e, "0") == 0);
}

const char *attention_wg_device_refusal(void) {
  if (attention_wg_off()) return "the switch WEFT_ATTN_WG=off keeps them out";
  if (!wg_device()) return "they run on GPUs of compute capability 9.0 alone";
  if ((size_t)(DKV_BYTES > DQ_BYTES ? DKV_BYTES : DQ_BYTES) > attention_smem_limit())
    return "this GPU's shared memory per block is too small for them";
  return NULL;
}

const char *gpu_attention_wg_refusal(int dt, const gpu_attn *a) {
  if (!(dt == GPU_BF16 || dt == GPU_F16) || a->dh != 64) return "they take 16-bit heads of 64";
  if (const char *why = attention_wg_device_refusal()) return why;
  if (!wg_verified()) return "the warpgroup product failed its self-check on this GPU";
  return NULL;
}

bool attention_wg_takes(int dt, const gpu_attn *a) { return gpu_attention_wg_refusal(dt, a) == NULL; }


void attention_wg_forward(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v,
                          const gpu_attn *a, float *lse) {
  const float sl2 = (float)(1.0 / sqrt((double)a->dh)) * 1.4426950408889634f;
  const bool vec = a->q_row % 8 == 0 && a->kv_row % 8 == 0 && a->q_batch % 8 == 0 && a->kv_batch % 8 == 0 &&
                   al16(q) && al16(k) && al16(v);
  const int64_t tiles = (a->sq + WB - 1) / WB;
  const bool by_tile = attention_fa_by_tile(tiles, a->b);
  const dim3 grid = attention_fa_grid(by_tile, tiles, a->hq, a->b);
  const size_t bytes = 5 * TILE + 1024;
  if (dt == GPU_F16) {
    allow_smem(k_attn_fwd_wg<f16>, bytes);
    launch(k_attn_fwd_wg<f16>, grid, WT, bytes, s, (f16 *)out, (const f16 *)q, (const f16 *)k, (const f16 *)v, *a, sl2,
           vec, lse, by_tile);
  } else {
    allow_smem(k_attn_fwd_wg<bf16>, bytes);
    launch(k_attn_fwd_wg<bf16>, grid, WT, bytes, s, (bf16 *)out, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, *a,
           sl2, vec, lse, by_tile);
  }
}

void attention_wg_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                           const void *k, const void *v, const gpu_attn *a, bool acc, const float *lse,
                           const float *dsum, bool vec, int shape) {
  if (shape == 0) {
    const char *e = getenv("WEFT_ATTN_FA_BWD_SHAPE");
    shape = e && strcmp(e, "wg2") == 0 ? 2 : e && strcmp(e, "wgp") == 0 ? 1 : 3;
  }
  if (dt == GPU_F16)
    wg_backward<f16>(s, (f16 *)dq, (f16 *)dk, (f16 *)dv, (const f16 *)dout, (const f16 *)q, (const f16 *)k,
                     (const f16 *)v, a, acc, lse, dsum, vec, shape);
  else
    wg_backward<bf16>(s, (bf16 *)dq, (bf16 *)dk, (bf16 *)dv, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k,
                      (const bf16 *)v, a, acc, lse, dsum, vec, shape);
}

bool gpu_wgmma_check(gpu_stream *s, int dt, float *d, const void *a, const void *b_nk, const void *b_kn) {
  if (!(dt == GPU_BF16 || dt == GPU_F16) || attention_wg_off() || !wg_device()) return false;
  const size_t bytes = 4 * TILE + 1024;
  if (dt == GPU_F16) {
    allow_smem(k_wgmma_check<f16>, bytes);
    launch(k_wgmma_check<f16>, 1, WT, bytes, s, d, (const f16 *)a, (const f16 *)b_nk, (const f16 *)b_kn);
  } else {
    allow_smem(k_wgmma_check<bf16>, bytes);
    launch(k_wgmma_check<bf16>, 1, WT, bytes, s, d, (const bf16 *)a, (const bf16 *)b_nk, (const bf16 *)b_kn);
  }
  return true;
}
