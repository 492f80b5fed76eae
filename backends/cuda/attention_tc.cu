/* attention_tc.cu - causal attention of 16-bit tensors on the tensor cores
 * (warp matrix products, nvcuda::wmma, bf16 or f16 operands, f32 sums), for
 * heads of 32, 64, 96 or 128; attention.cu takes the rest and calls these.
 * Same algorithm as attention.cu's. A block has 8 warps; a warp owns 16
 * rows (queries, or keys in the dk/dv pass) and the block's other operand
 * streams through shared memory in tiles of 64 rows, read from global
 * memory 16 bytes at a time into registers while the tile before is
 * computed (heads up to 64; above, the registers go to the sums instead).
 * Shared rows are padded (dh + 8 elements, scores 68 floats, 16-bit scores
 * 72) so that the tensor cores' loads and the lanes' row walks hit distinct
 * banks; a lane pair takes one row of a warp's scores, each lane every
 * other column, starting at a column rotated by the row.
 *
 * Forward: 128 queries per block, the warp's 16 queries in fragments for
 * the whole pass. Per key tile, S = Q K^T goes to shared memory, where the
 * lane pairs mask, update the row's maximum and sum (scores pre-scaled by
 * log2 e, so exp2) and write P in 16 bits; the output O stays in
 * accumulator fragments, rescaled row by row: which row an element of a
 * fragment is, the lanes learn once by loading a tile of row numbers into
 * a fragment of the same kind. Then O += P V.
 *
 * The forward may keep each row's log-sum-exp for the backward.
 * Backward: with it, D = dout . out from the forward's result (attention.cu
 * launches that); else the forward again for each row's log-sum-exp and D;
 * then per 128 keys (each warp 16, with its K and V rows in
 * fragments for heads of 32) over the query tiles from them on: S^T = K
 * Q^T, P^T, dv += P^T dout, dP^T = V dout^T, dS^T = P^T (dP^T - D), dk +=
 * dS^T q, sums in registers; then per 128 queries over the key tiles: S,
 * P, dP = dout V^T, dS, dq += dS k. No atomics: two runs give the same
 * bits. */
#include "attention.cuh"
#include "common.cuh"

#ifndef WEFT_CUDA_EMU
#include <mma.h>
#endif

using namespace nvcuda;

/* NW warps of 16 rows; tiles of TK rows; shared row strides of the f32 and
 * 16-bit scores. */
enum { NW = 8, NT = 32 * NW, TQ = 16 * NW, TK = 64, LDS = 68, LDP = 72 };
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc_t;
template <class T> using a_row = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <class T> using b_row = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <class T> using b_col = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;

/* Shared memory carved in pieces aligned for wmma (32 bytes; 128 here). */
HD size_t piece(size_t bytes) { return (bytes + 127) / 128 * 128; }
struct carve {
  unsigned char *p;
  size_t off;
  template <class X> DEV X *take(size_t n) {
    X *r = (X *)(p + off);
    off += (n * sizeof(X) + 127) / 128 * 128;
    return r;
  }
};

/* 16 bytes: 8 elements of a row. */
#ifdef WEFT_CUDA_EMU
struct alignas(16) chunk16 {
  uint32_t u[4];
};
#include <cstdio>
#include <cstdlib>
static inline void emu_aligned(const void *p) {
  if ((uintptr_t)p & 15) {
    fprintf(stderr, "attention_tc: a 16-byte access at %p, not aligned\n", p);
    abort();
  }
}
#else
typedef uint4 chunk16;
#endif

/* Elements p[0, 8): one 16-byte load when vec (p aligned), else 8. */
template <class T> DEV chunk16 ld8(const T *p, bool vec) {
  chunk16 c;
  if (vec) {
#ifdef WEFT_CUDA_EMU
    emu_aligned(p);
    memcpy(&c, p, 16);
#else
    c = *(const chunk16 *)p;
#endif
    return c;
  }
  T t[8];
#pragma unroll
  for (int i = 0; i < 8; i++) t[i] = p[i];
  memcpy(&c, t, 16);
  return c;
}

/* p[0, 8) = t: one 16-byte store when vec, else 8. */
template <class T> DEV void st8(T *p, const T *t, bool vec) {
  if (vec) {
#ifdef WEFT_CUDA_EMU
    emu_aligned(p);
    memcpy(p, t, 16);
#else
    chunk16 c;
    memcpy(&c, t, 16);
    *(chunk16 *)p = c;
#endif
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; i++) p[i] = t[i];
}

/* R rows of a head through registers: load() takes rows [r0, r0 + R) from
 * base (row stride `row`), zero from row n on; store() puts them in shared
 * memory with rows of dh + 8. Every thread of the block calls both. */
template <class T, int R, int D16> struct tile {
  enum { C = D16 * 2, N = R * C / NT, LD = D16 * 16 + 8 };
  static_assert(R * C % NT == 0, "whole chunks per thread");
  chunk16 u[N];
  DEV void load(const T *base, int64_t r0, int64_t row, int64_t n, bool vec) {
#pragma unroll
    for (int i = 0; i < N; i++) {
      int e = (int)threadIdx.x + i * NT, rr = e / C, c = e % C;
      if (r0 + rr < n)
        u[i] = ld8(base + (r0 + rr) * row + c * 8, vec);
      else
        memset(&u[i], 0, sizeof u[i]);
    }
  }
  DEV void store(T *dst) const {
#pragma unroll
    for (int i = 0; i < N; i++) {
      int e = (int)threadIdx.x + i * NT, rr = e / C, c = e % C;
#ifdef WEFT_CUDA_EMU
      emu_aligned(dst + rr * LD + c * 8);
      memcpy(dst + rr * LD + c * 8, &u[i], 16);
#else
      *(chunk16 *)(dst + rr * LD + c * 8) = u[i];
#endif
    }
  }
};

/* Column t of the 32 a lane takes in row r of a warp's scores (half: which
 * of the pair): every other column, the start rotated by the row, so that
 * the 32 lanes read 32 banks. */
DEV int col_of(int t, int r, int half) { return 2 * ((t + r) & 31) + half; }

/* x within [lo, hi]. */
DEV int clampi(int64_t x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : (int)x; }

/* Which row of the tile each element of an accumulator fragment is in
 * (idx: the 16 x 16 tile of row numbers in shared memory). */
DEV void rows_of(int *rw, const float *idx) {
  acc_t f;
  wmma::load_matrix_sync(f, idx, 16, wmma::mem_row_major);
#pragma unroll
  for (int e = 0; e < f.num_elements; e++) rw[e] = (int)f.x[e];
}

/* c[row] *= by[row] over the fragment's elements. */
DEV void scale_rows(acc_t &c, const int *rw, const float *by) {
#pragma unroll
  for (int e = 0; e < c.num_elements; e++) c.x[e] *= by[rw[e]];
}

/* 16 x 64 f32 scores of a warp: x = A B^T, A 16 rows of dh in fragments,
 * B 64 rows of dh in shared memory (row stride ld). */
template <class T, int D16, int U = (D16 > 4 ? 1 : 4)>
DEV void scores(float *x, const a_row<T> *fa, const T *B, int ld) {
#pragma unroll(U)
  for (int j = 0; j < 4; j++) {
    acc_t c;
    wmma::fill_fragment(c, 0.0f);
#pragma unroll
    for (int kk = 0; kk < D16; kk++) {
      b_col<T> fb;
      wmma::load_matrix_sync(fb, B + j * 16 * ld + kk * 16, ld);
      wmma::mma_sync(c, fa[kk], fb, c);
    }
    wmma::store_matrix_sync(x + j * 16, c, LDS, wmma::mem_row_major);
  }
}

/* The same with A's 16 rows in shared memory (row stride ld too), for the
 * widest heads, whose registers go to the sums. */
template <class T, int D16, int U = (D16 > 4 ? 1 : 4)>
DEV void scores_sm(float *x, const T *A, const T *B, int ld) {
#pragma unroll(U)
  for (int j = 0; j < 4; j++) {
    acc_t c;
    wmma::fill_fragment(c, 0.0f);
#pragma unroll
    for (int kk = 0; kk < D16; kk++) {
      a_row<T> fa;
      b_col<T> fb;
      wmma::load_matrix_sync(fa, A + kk * 16, ld);
      wmma::load_matrix_sync(fb, B + j * 16 * ld + kk * 16, ld);
      wmma::mma_sync(c, fa, fb, c);
    }
    wmma::store_matrix_sync(x + j * 16, c, LDS, wmma::mem_row_major);
  }
}

/* g[d16] += X B: X the warp's 16 x 64 16-bit scores, B 64 rows of dh in
 * shared memory (row stride ld). */
template <class T, int D16, int U = (D16 > 4 ? 1 : 4)>
DEV void accumulate(acc_t *g, const T *X, const T *B, int ld) {
#pragma unroll(U)
  for (int j = 0; j < 4; j++) {
    a_row<T> fx;
    wmma::load_matrix_sync(fx, X + j * 16, LDP);
#pragma unroll
    for (int d16 = 0; d16 < D16; d16++) {
      b_row<T> fb;
      wmma::load_matrix_sync(fb, B + j * 16 * ld + d16 * 16, ld);
      wmma::mma_sync(g[d16], fx, fb, g[d16]);
    }
  }
}

/* A warp's 16 rows of a tile (row stride ld) into fragments. */
template <class T, int D16> DEV void rows_in(a_row<T> *f, const T *src, int ld) {
#pragma unroll
  for (int kk = 0; kk < D16; kk++) wmma::load_matrix_sync(f[kk], src + kk * 16, ld);
}

/* Heads up to 64 fetch the next tile into registers during this one. */
template <int D16> struct pipe {
  enum { PF = D16 <= 4 };
};

/* Shared memory of the forward: K and V tiles, the row numbers, a number
 * per row, then the query tile, which the warps' scores take over once
 * the queries are in fragments. */
static size_t stage_bytes(size_t rows_bytes) {
  size_t sp = piece(NW * 16 * LDS * 4) + piece(NW * 16 * LDP * 2);
  return rows_bytes > sp ? rows_bytes : sp;
}
static size_t fwd_tc_smem(int64_t dh) {
  return 2 * piece(TK * (dh + 8) * 2) + piece(256 * 4) + piece(TQ * 4) + stage_bytes(piece(TQ * (dh + 8) * 2));
}

/* MODE 0: out, and lse per row when lse is not NULL. MODE 1: lse and dsum
 * per row. Blocks in reverse order of their queries: the longest first. */
template <class T, int D16, int MODE>
__global__ void __launch_bounds__(NT, D16 <= 4 ? 2 : 1)
    k_attn_fwd_tc(T *out, const T *q, const T *k, const T *v, gpu_attn a, float scale, bool vec, const T *dout,
                  float *lse, float *dsum) {
  enum { LD = D16 * 16 + 8, PF = pipe<D16>::PF };
  DYN_SMEM(unsigned char, raw);
  carve cv = {raw, 0};
  T *Ks = cv.take<T>(TK * LD), *Vs = cv.take<T>(TK * LD);
  float *idx = cv.take<float>(256), *cs = cv.take<float>(TQ);
  unsigned char *stage = raw + cv.off;
  T *Qs = (T *)stage;
  const int64_t bi = blockIdx.z, h = blockIdx.y, q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * TQ;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, r = lane >> 1, half = lane & 1, row = w * 16 + r;
  const int64_t qi = q0 + row;
  float *S = (float *)stage + w * 16 * LDS;
  T *P = (T *)(stage + piece(NW * 16 * LDS * 4)) + w * 16 * LDP;
  float *cw = cs + w * 16;
  const T *qb = q + bi * a.q_batch + h * a.dh;
  const T *kb = k + bi * a.kv_batch + (h / a.r) * a.dh, *vb = v + bi * a.kv_batch + (h / a.r) * a.dh;
  {
    tile<T, TQ, D16> qt;
    qt.load(qb, q0, a.q_row, a.sq, vec);
    qt.store(Qs);
  }
  for (int e = threadIdx.x; e < 256; e += NT) idx[e] = (float)(e / 16);
  __syncthreads();
  a_row<T> qf[D16];
  rows_in<T, D16>(qf, Qs + w * 16 * LD, LD);
  int rw[acc_t::num_elements];
  rows_of(rw, idx);
  __syncthreads();
  acc_t o[D16];
#pragma unroll
  for (int d = 0; d < D16; d++) wmma::fill_fragment(o[d], 0.0f);
  const float sl2 = scale * LOG2E;
  float m = -INFINITY, l = 0.0f;
  const int64_t last = last_key(a, q0 + TQ), see = a.qpos + qi < a.sk - 1 ? a.qpos + qi : a.sk - 1;
  tile<T, TK, D16> kt, vt;
  if (PF && last >= 0) kt.load(kb, 0, a.kv_row, a.sk, vec), vt.load(vb, 0, a.kv_row, a.sk, vec);
  for (int64_t k0 = 0; k0 <= last; k0 += TK) {
    __syncthreads();
    if (!PF) kt.load(kb, k0, a.kv_row, a.sk, vec), vt.load(vb, k0, a.kv_row, a.sk, vec);
    kt.store(Ks), vt.store(Vs);
    __syncthreads();
    if (PF && k0 + TK <= last) kt.load(kb, k0 + TK, a.kv_row, a.sk, vec), vt.load(vb, k0 + TK, a.kv_row, a.sk, vec);
    scores<T, D16>(S, qf, Ks, LD);
    __syncwarp();
    /* columns c <= lim are keys this row sees */
    const int lim = clampi(see - k0, -1, TK - 1);
    float mx = -INFINITY;
#pragma unroll 8
    for (int t = 0; t < 32; t++) {
      int c = col_of(t, r, half);
      if (c <= lim) mx = fmaxf(mx, S[r * LDS + c]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float mnew = fmaxf(m, mx * sl2), base = mnew == -INFINITY ? 0.0f : mnew;
    const float corr = exp2f(m - base);
    float sum = 0.0f;
#pragma unroll 8
    for (int t = 0; t < 32; t++) {
      int c = col_of(t, r, half);
      T pt = from_f<T>(c <= lim ? exp2f(S[r * LDS + c] * sl2 - base) : 0.0f);
      P[r * LDP + c] = pt;
      sum += to_f(pt);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * corr + sum, m = mnew;
    if (!half) cw[r] = corr;
    __syncwarp();
#pragma unroll
    for (int d = 0; d < D16; d++) scale_rows(o[d], rw, cw);
    accumulate<T, D16>(o, P, Vs, LD);
  }
  __syncwarp();
  if (!half) cw[r] = l > 0.0f ? 1.0f / l : 0.0f;
  __syncwarp();
  const int64_t at = bi * a.o_batch + h * a.dh + qi * a.o_row + half * 8;
  float dot = 0.0f;
#pragma unroll
  for (int d16 = 0; d16 < D16; d16++) {
    scale_rows(o[d16], rw, cw);
    wmma::store_matrix_sync(S, o[d16], LDS, wmma::mem_row_major);
    __syncwarp();
    const float *x = S + r * LDS + half * 8;
    if (qi < a.sq) {
      if (MODE == 0) {
        T t[8];
#pragma unroll
        for (int i = 0; i < 8; i++) t[i] = from_f<T>(x[i]);
        st8(out + at + d16 * 16, t, vec);
      } else {
        chunk16 c = ld8(dout + at + d16 * 16, vec);
        T t[8];
        memcpy(t, &c, 16);
#pragma unroll
        for (int i = 0; i < 8; i++) dot += x[i] * to_f(t[i]);
      }
    }
    __syncwarp();
  }
  if (MODE == 1) {
    dot += __shfl_xor_sync(0xffffffffu, dot, 1);
    if (!half && qi < a.sq) {
      int64_t e = (bi * a.hq + h) * a.sq + qi;
      lse[e] = m * LN2 + logf(l);
      dsum[e] = dot;
    }
  } else if (lse && !half && qi < a.sq) {
    lse[(bi * a.hq + h) * a.sq + qi] = m * LN2 + logf(l);
  }
}

/* Shared memory of dq: K and V tiles, then the query and dout tiles, which
 * the warps' scores take over (heads up to 64; above, the dout tile stays,
 * its rows not held in fragments). */
static size_t dq_tc_smem(int64_t dh) {
  size_t rows = piece(TQ * (dh + 8) * 2);
  return 2 * piece(TK * (dh + 8) * 2) + (dh <= 64 ? stage_bytes(2 * rows) : rows + stage_bytes(rows));
}

/* dq of query rows [q0, q0 + 128) of head h; warp w owns 16. */
template <class T, int D16>
__global__ void __launch_bounds__(NT, D16 <= 4 ? 2 : 1)
    k_attn_dq_tc(T *dq, const T *dout, const T *q, const T *k, const T *v, gpu_attn a, float scale, bool vec,
                 const float *lse, const float *dsum, bool acc) {
  enum { LD = D16 * 16 + 8, PF = pipe<D16>::PF };
  constexpr bool HOLD = D16 <= 4;
  DYN_SMEM(unsigned char, raw);
  carve cv = {raw, 0};
  T *Ks = cv.take<T>(TK * LD), *Vs = cv.take<T>(TK * LD), *Os;
  unsigned char *stage;
  if constexpr (HOLD) {
    stage = raw + cv.off;
    Os = (T *)(stage + piece(TQ * LD * 2));
  } else {
    Os = cv.take<T>(TQ * LD);
    stage = raw + cv.off;
  }
  T *Qs = (T *)stage;
  const int64_t bi = blockIdx.z, h = blockIdx.y, q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * TQ;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, r = lane >> 1, half = lane & 1, row = w * 16 + r;
  const int64_t qi = q0 + row;
  float *S = (float *)stage + w * 16 * LDS;
  T *P = (T *)(stage + piece(NW * 16 * LDS * 4)) + w * 16 * LDP;
  const T *qb = q + bi * a.q_batch + h * a.dh, *ob = dout + bi * a.o_batch + h * a.dh;
  const T *kb = k + bi * a.kv_batch + (h / a.r) * a.dh, *vb = v + bi * a.kv_batch + (h / a.r) * a.dh;
  {
    tile<T, TQ, D16> t;
    t.load(qb, q0, a.q_row, a.sq, vec);
    t.store(Qs);
    t.load(ob, q0, a.o_row, a.sq, vec);
    t.store(Os);
  }
  __syncthreads();
  a_row<T> qf[D16], of[HOLD ? D16 : 1];
  rows_in<T, D16>(qf, Qs + w * 16 * LD, LD);
  if constexpr (HOLD) rows_in<T, D16>(of, Os + w * 16 * LD, LD);
  __syncthreads();
  const bool in = qi < a.sq;
  const float sl2 = scale * LOG2E;
  const float L2 = in ? lse[(bi * a.hq + h) * a.sq + qi] * LOG2E : 0.0f;
  const float Dr = in ? dsum[(bi * a.hq + h) * a.sq + qi] : 0.0f;
  acc_t g[D16];
#pragma unroll
  for (int d = 0; d < D16; d++) wmma::fill_fragment(g[d], 0.0f);
  const int64_t last = last_key(a, q0 + TQ), see = a.qpos + qi < a.sk - 1 ? a.qpos + qi : a.sk - 1;
  tile<T, TK, D16> kt, vt;
  if (PF && last >= 0) kt.load(kb, 0, a.kv_row, a.sk, vec), vt.load(vb, 0, a.kv_row, a.sk, vec);
  for (int64_t k0 = 0; k0 <= last; k0 += TK) {
    __syncthreads();
    if (!PF) kt.load(kb, k0, a.kv_row, a.sk, vec), vt.load(vb, k0, a.kv_row, a.sk, vec);
    kt.store(Ks), vt.store(Vs);
    __syncthreads();
    if (PF && k0 + TK <= last) kt.load(kb, k0 + TK, a.kv_row, a.sk, vec), vt.load(vb, k0 + TK, a.kv_row, a.sk, vec);
    scores<T, D16>(S, qf, Ks, LD);
    __syncwarp();
    const int lim = in ? clampi(see - k0, -1, TK - 1) : -1;
#pragma unroll 8
    for (int t = 0; t < 32; t++) {
      int c = col_of(t, r, half);
      P[r * LDP + c] = from_f<T>(c <= lim ? exp2f(S[r * LDS + c] * sl2 - L2) : 0.0f);
    }
    __syncwarp();
    if constexpr (HOLD)
      scores<T, D16>(S, of, Vs, LD);
    else
      scores_sm<T, D16>(S, Os + w * 16 * LD, Vs, LD);
    __syncwarp();
#pragma unroll 8
    for (int t = 0; t < 32; t++) {
      int c = col_of(t, r, half);
      P[r * LDP + c] = from_f<T>(to_f(P[r * LDP + c]) * (S[r * LDS + c] - Dr));
    }
    __syncwarp();
    accumulate<T, D16, 1>(g, P, Ks, LD);
  }
  __syncwarp();
  T *dst = dq + bi * a.q_batch + h * a.dh + qi * a.q_row + half * 8;
#pragma unroll
  for (int d16 = 0; d16 < D16; d16++) {
    wmma::store_matrix_sync(S, g[d16], LDS, wmma::mem_row_major);
    __syncwarp();
    if (in)
      for (int i = 0; i < 8; i++) put(&dst[d16 * 16 + i], S[r * LDS + half * 8 + i] * scale, acc);
    __syncwarp();
  }
}

/* Shared memory of dk/dv: the query and dout tiles, lse and D of their
 * rows, then the block's K and V rows, which the warps' scores take over
 * where the warps hold their rows in fragments (heads of 32; above, the
 * sums take the registers, and two blocks of heads of 64 fit one
 * multiprocessor of 228 KiB). */
static size_t dkv_tc_smem(int64_t dh) {
  size_t kv = 2 * piece(TQ * (dh + 8) * 2), sp = stage_bytes(0);
  return 2 * piece(TK * (dh + 8) * 2) + 2 * piece(TK * 4) + (dh <= 32 ? stage_bytes(kv) : kv + sp);
}

/* The query tile `step` of a dk/dv block (query head hk r + step / nqt,
 * rows from qs + (step % nqt) TK) into registers. */
template <class T, int D16>
DEV void fetch_q(tile<T, TK, D16> &qt, tile<T, TK, D16> &ot, float &pl, float &pd, int64_t step, int64_t nqt,
                 int64_t qs, int64_t hk, int64_t bi, const T *q, const T *dout, const gpu_attn &a, const float *lse,
                 const float *dsum, bool vec) {
  const int64_t h = hk * a.r + step / nqt, q0 = qs + step % nqt * TK;
  qt.load(q + bi * a.q_batch + h * a.dh, q0, a.q_row, a.sq, vec);
  ot.load(dout + bi * a.o_batch + h * a.dh, q0, a.o_row, a.sq, vec);
  if (threadIdx.x < TK) {
    int64_t i = q0 + threadIdx.x;
    bool in = i < a.sq;
    pl = in ? lse[(bi * a.hq + h) * a.sq + i] * LOG2E : 0.0f;
    pd = in ? dsum[(bi * a.hq + h) * a.sq + i] : 0.0f;
  }
}

/* dk and dv of keys [k0, k0 + 128) of key/value head hk; warp w owns 16. */
template <class T, int D16>
__global__ void __launch_bounds__(NT, D16 <= 4 ? 2 : 1)
    k_attn_dkv_tc(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, gpu_attn a, float scale, bool vec,
                  const float *lse, const float *dsum, bool acc) {
  enum { LD = D16 * 16 + 8, PF = pipe<D16>::PF };
  constexpr bool HOLD = D16 <= 2;
  DYN_SMEM(unsigned char, raw);
  carve cv = {raw, 0};
  T *Qs = cv.take<T>(TK * LD), *Do = cv.take<T>(TK * LD);
  float *Ls = cv.take<float>(TK), *Dd = cv.take<float>(TK);
  T *Ks, *Vs;
  unsigned char *stage;
  if constexpr (HOLD) {
    stage = raw + cv.off;
    Ks = (T *)stage, Vs = (T *)(stage + piece(TQ * LD * 2));
  } else {
    Ks = cv.take<T>(TQ * LD), Vs = cv.take<T>(TQ * LD);
    stage = raw + cv.off;
  }
  const int64_t bi = blockIdx.z, hk = blockIdx.y, k0 = (int64_t)blockIdx.x * TQ;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, r = lane >> 1, half = lane & 1;
  const int64_t kvoff = bi * a.kv_batch + hk * a.dh, kj = k0 + w * 16 + r;
  float *S = (float *)stage + w * 16 * LDS;
  T *P = (T *)(stage + piece(NW * 16 * LDS * 4)) + w * 16 * LDP;
  {
    tile<T, TQ, D16> t;
    t.load(k + kvoff, k0, a.kv_row, a.sk, vec);
    t.store(Ks);
    t.load(v + kvoff, k0, a.kv_row, a.sk, vec);
    t.store(Vs);
  }
  __syncthreads();
  a_row<T> kf[HOLD ? D16 : 1], vf[HOLD ? D16 : 1];
  if constexpr (HOLD) rows_in<T, D16>(kf, Ks + w * 16 * LD, LD), rows_in<T, D16>(vf, Vs + w * 16 * LD, LD);
  __syncthreads();
  acc_t gk[D16], gv[D16];
#pragma unroll
  for (int d = 0; d < D16; d++) wmma::fill_fragment(gk[d], 0.0f), wmma::fill_fragment(gv[d], 0.0f);
  const float sl2 = scale * LOG2E;
  /* the query rows from qs on see some of these keys */
  const int64_t qs = k0 > a.qpos ? k0 - a.qpos : 0, nqt = qs < a.sq ? (a.sq - qs + TK - 1) / TK : 0;
  const int64_t steps = a.r * nqt;
  tile<T, TK, D16> qt, ot;
  float pl = 0.0f, pd = 0.0f;
  if (PF && steps > 0) fetch_q<T, D16>(qt, ot, pl, pd, 0, nqt, qs, hk, bi, q, dout, a, lse, dsum, vec);
  for (int64_t st = 0; st < steps; st++) {
    const int64_t q0 = qs + st % nqt * TK;
    __syncthreads();
    if (!PF) fetch_q<T, D16>(qt, ot, pl, pd, st, nqt, qs, hk, bi, q, dout, a, lse, dsum, vec);
    qt.store(Qs), ot.store(Do);
    if (threadIdx.x < TK) Ls[threadIdx.x] = pl, Dd[threadIdx.x] = pd;
    __syncthreads();
    if (PF && st + 1 < steps) fetch_q<T, D16>(qt, ot, pl, pd, st + 1, nqt, qs, hk, bi, q, dout, a, lse, dsum, vec);
    /* S^T = K_w Q^T, then P^T: query q0 + c sees key kj when c >= lo; rows
     * from the queries' end on, and keys from sk on, none */
    if constexpr (HOLD)
      scores<T, D16, 1>(S, kf, Qs, LD);
    else
      scores_sm<T, D16, 1>(S, Ks + w * 16 * LD, Qs, LD);
    __syncwarp();
    const int lo = clampi(kj - a.qpos - q0, 0, TK), hi = kj < a.sk ? clampi(a.sq - 1 - q0, -1, TK - 1) : -1;
#pragma unroll 8
    for (int t = 0; t < 32; t++) {
      int c = col_of(t, r, half);
      P[r * LDP + c] = from_f<T>(c >= lo && c <= hi ? exp2f(S[r * LDS + c] * sl2 - Ls[c]) : 0.0f);
    }
    __syncwarp();
    accumulate<T, D16, 1>(gv, P, Do, LD);
    /* dP^T = V_w dout^T, then dS^T = P^T (dP^T - D) in place of P^T */
    if constexpr (HOLD)
      scores<T, D16, 1>(S, vf, Do, LD);
    else
      scores_sm<T, D16, 1>(S, Vs + w * 16 * LD, Do, LD);
    __syncwarp();
#pragma unroll 8
    for (int t = 0; t < 32; t++) {
      int c = col_of(t, r, half);
      P[r * LDP + c] = from_f<T>(to_f(P[r * LDP + c]) * (S[r * LDS + c] - Dd[c]));
    }
    __syncwarp();
    accumulate<T, D16, 1>(gk, P, Qs, LD);
  }
  /* out through the warp's scores, 16 x 16 at a time */
  __syncwarp();
#pragma unroll
  for (int d16 = 0; d16 < D16; d16++)
    for (int which = 0; which < 2; which++) {
      T *dst = which ? dv : dk;
      wmma::store_matrix_sync(S, which ? gv[d16] : gk[d16], LDS, wmma::mem_row_major);
      __syncwarp();
      if (dst && kj < a.sk)
        for (int i = 0; i < 8; i++)
          put(&dst[kvoff + kj * a.kv_row + d16 * 16 + half * 8 + i], S[r * LDS + half * 8 + i] * (which ? 1.0f : scale),
              acc);
      __syncwarp();
    }
}

bool attention_tc_takes(int dt, const gpu_attn *a) {
  if (!((dt == GPU_BF16 || dt == GPU_F16) && a->dh % 32 == 0 && a->dh >= 32 && a->dh <= 128)) return false;
  size_t lim = attention_smem_limit();
  return fwd_tc_smem(a->dh) <= lim && dq_tc_smem(a->dh) <= lim && dkv_tc_smem(a->dh) <= lim;
}

/* Whether every row of the heads starts on 16 bytes (8 elements), so that
 * tiles move 16 bytes at a time. */
static bool rows16(const gpu_attn *a, const void *p1, const void *p2, const void *p3, const void *p4) {
  return a->dh % 8 == 0 && a->q_row % 8 == 0 && a->kv_row % 8 == 0 && a->o_row % 8 == 0 && a->q_batch % 8 == 0 &&
         a->kv_batch % 8 == 0 && a->o_batch % 8 == 0 && al16(p1) && al16(p2) && al16(p3) && al16(p4);
}


#define DISPATCH16(dt, T, ...)                                                                 \
  do {                                                                                         \
    if ((dt) == GPU_F16) { typedef f16 T; __VA_ARGS__; }                                       \
    else { typedef bf16 T; __VA_ARGS__; }                                                      \
  } while (0)

void attention_tc_forward(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v,
                          const gpu_attn *a, float *lse) {
  dim3 grid((unsigned)((a->sq + TQ - 1) / TQ), (unsigned)a->hq, (unsigned)a->b);
  float scale = (float)(1.0 / sqrt((double)a->dh));
  size_t sm = fwd_tc_smem(a->dh);
  bool vec = rows16(a, out, q, k, v);
  DISPATCH16(dt, T, WITH_D16(a->dh, D, {
    allow_smem(k_attn_fwd_tc<T, D, 0>, sm);
    launch(k_attn_fwd_tc<T, D, 0>, grid, NT, sm, s, (T *)out, (const T *)q, (const T *)k, (const T *)v, *a, scale,
           vec, (const T *)NULL, lse, (float *)NULL);
  }));
}

void attention_tc_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                           const void *k, const void *v, const gpu_attn *a, bool acc, float *lse, float *dsum,
                           bool kept) {
  float scale = (float)(1.0 / sqrt((double)a->dh));
  dim3 gq((unsigned)((a->sq + TQ - 1) / TQ), (unsigned)a->hq, (unsigned)a->b);
  dim3 gk((unsigned)((a->sk + TQ - 1) / TQ), (unsigned)(a->hq / a->r), (unsigned)a->b);
  size_t s1 = fwd_tc_smem(a->dh), s2 = dkv_tc_smem(a->dh), s3 = dq_tc_smem(a->dh);
  bool vec = rows16(a, dout, q, k, v);
  DISPATCH16(dt, T, WITH_D16(a->dh, D, {
    if (!kept) {
      allow_smem(k_attn_fwd_tc<T, D, 1>, s1);
      launch(k_attn_fwd_tc<T, D, 1>, gq, NT, s1, s, (T *)NULL, (const T *)q, (const T *)k, (const T *)v, *a, scale,
             vec, (const T *)dout, lse, dsum);
    }
    if (dk || dv) {
      allow_smem(k_attn_dkv_tc<T, D>, s2);
      launch(k_attn_dkv_tc<T, D>, gk, NT, s2, s, (T *)dk, (T *)dv, (const T *)dout, (const T *)q, (const T *)k,
             (const T *)v, *a, scale, vec, (const float *)lse, (const float *)dsum, acc);
    }
    if (dq) {
      allow_smem(k_attn_dq_tc<T, D>, s3);
      launch(k_attn_dq_tc<T, D>, gq, NT, s3, s, (T *)dq, (const T *)dout, (const T *)q, (const T *)k, (const T *)v,
             *a, scale, vec, (const float *)lse, (const float *)dsum, acc);
    }
  }));
}
