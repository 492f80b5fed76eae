/* attention_tc.cu - causal attention of 16-bit tensors on the tensor cores
 * (warp matrix products, nvcuda::wmma, bf16 or f16 operands, f32 sums), for
 * heads of 32, 64, 96 or 128; attention.cu takes the rest and calls these.
 * Same algorithm as attention.cu's, on tiles of 64 queries by 64 keys:
 *
 * Forward: 4 warps, 16 query rows each. Per key tile, a warp's scores
 * S = Q K^T go through shared memory, where its lanes (two per row) mask,
 * update the row's maximum and sum, write P = exp(S - max) in 16 bits and
 * rescale the row's output; then O += P V. The output stays in shared
 * memory in f32, since rows are rescaled.
 *
 * Backward: the forward again for each row's log-sum-exp and D = dout .
 * out; then per tile of 64 keys (each warp 16 of them) over the query
 * tiles from it on: S^T = K Q^T, P^T, dP^T = V dout^T, dS^T = P^T (dP^T -
 * D), dv += P^T dout and dk += dS^T q, both in registers; then per tile of
 * 64 queries over the key tiles: S, P, dP = dout V^T, dS, dq += dS k. */
#include "attention.cuh"
#include "common.cuh"

#ifndef WEFT_CUDA_EMU
#include <mma.h>
#endif

using namespace nvcuda;

enum { TW = 4, TQ = 64, TK = 64, TT = 128 };

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc_t;
template <class T> using a_row = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <class T> using b_row = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <class T> using b_col = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;

/* Shared memory carved in pieces aligned for wmma (32 bytes; 128 here). */
struct carve {
  unsigned char *p;
  size_t off;
  template <class X> DEV X *take(size_t n) {
    X *r = (X *)(p + off);
    off += (n * sizeof(X) + 127) / 128 * 128;
    return r;
  }
};

static size_t piece(size_t bytes) { return (bytes + 127) / 128 * 128; }

/* Rows [r0, r0 + 64) of a head into shared memory, zero from row n on
 * (the query rows or the keys). */
template <class T>
DEV void load_rows(T *dst, const T *src, int64_t r0, int64_t row, int64_t n, const gpu_attn &a) {
  int dh = (int)a.dh;
  for (int e = threadIdx.x; e < 64 * dh; e += blockDim.x) {
    int64_t r = r0 + e / dh;
    dst[e] = r < n ? src[r * row + e % dh] : from_f<T>(0.0f);
  }
}

/* A 16 x 64 f32 tile of a warp: x = A (16 x dh, row-major in shared
 * memory) times B^T (B: 64 rows of dh, row-major), k over dh. */
template <class T, int D16>
DEV void tile_abt(float *x, const T *A, const T *B, int dh) {
  for (int j = 0; j < 4; j++) {
    acc_t c;
    wmma::fill_fragment(c, 0.0f);
    for (int kk = 0; kk < D16; kk++) {
      a_row<T> fa;
      b_col<T> fb;
      wmma::load_matrix_sync(fa, A + kk * 16, dh);
      wmma::load_matrix_sync(fb, B + j * 16 * dh + kk * 16, dh);
      wmma::mma_sync(c, fa, fb, c);
    }
    wmma::store_matrix_sync(x + j * 16, c, 64, wmma::mem_row_major);
  }
}

/* MODE 0: out. MODE 1: lse and dsum per row. */
template <class T, int D16, int MODE>
__global__ void __launch_bounds__(TT)
    k_attn_fwd_tc(T *out, const T *q, const T *k, const T *v, gpu_attn a, float scale, const T *dout, float *lse,
                  float *dsum) {
  const int dh = D16 * 16;
  DYN_SMEM(unsigned char, raw);
  carve cv = {raw, 0};
  T *Qs = cv.take<T>(TQ * dh), *Ks = cv.take<T>(TK * dh), *Vs = cv.take<T>(TK * dh);
  float *Ss = cv.take<float>(TW * 16 * 64);
  T *Ps = cv.take<T>(TW * 16 * 64);
  float *Os = cv.take<float>(TW * 16 * dh);
  float *ms = cv.take<float>(TQ), *ls = cv.take<float>(TQ);
  const int64_t bi = blockIdx.z, h = blockIdx.y, q0 = (int64_t)blockIdx.x * TQ;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const T *qb = q + bi * a.q_batch + h * a.dh;
  const T *kb = k + bi * a.kv_batch + (h / a.r) * a.dh, *vb = v + bi * a.kv_batch + (h / a.r) * a.dh;
  load_rows(Qs, qb, q0, a.q_row, a.sq, a);
  float *S = Ss + w * 16 * 64, *O = Os + w * 16 * dh;
  T *P = Ps + w * 16 * 64;
  for (int e = lane; e < 16 * dh; e += 32) O[e] = 0.0f;
  if (threadIdx.x < TQ) ms[threadIdx.x] = -INFINITY, ls[threadIdx.x] = 0.0f;
  /* lanes 2r and 2r + 1 take row r of the warp, half of its columns each */
  const int r = lane >> 1, half = lane & 1, row = w * 16 + r;
  const int64_t qi = q0 + row;
  int64_t last = last_key(a, q0 + TQ);
  for (int64_t k0 = 0; k0 <= last; k0 += TK) {
    __syncthreads();
    load_rows(Ks, kb, k0, a.kv_row, a.sk, a);
    load_rows(Vs, vb, k0, a.kv_row, a.sk, a);
    __syncthreads();
    tile_abt<T, D16>(S, Qs + w * 16 * dh, Ks, dh);
    __syncwarp();
    float mold = ms[row], mx = -INFINITY;
    for (int c = half * 32; c < half * 32 + 32; c++) {
      int64_t kj = k0 + c;
      if (kj <= a.qpos + qi && kj < a.sk) mx = fmaxf(mx, S[r * 64 + c] * scale);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    float mnew = fmaxf(mold, mx), sum = 0.0f;
    for (int c = half * 32; c < half * 32 + 32; c++) {
      int64_t kj = k0 + c;
      T pt = from_f<T>(kj <= a.qpos + qi && kj < a.sk ? fexp(S[r * 64 + c] * scale - mnew) : 0.0f);
      P[r * 64 + c] = pt;
      sum += to_f(pt);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    float corr = fexp(mold - mnew);
    for (int c = half * (dh / 2); c < (half + 1) * (dh / 2); c++) O[r * dh + c] *= corr;
    __syncwarp();
    if (!half) ms[row] = mnew, ls[row] = ls[row] * corr + sum;
    for (int d16 = 0; d16 < D16; d16++) {
      acc_t c;
      wmma::load_matrix_sync(c, O + d16 * 16, dh, wmma::mem_row_major);
      for (int j = 0; j < 4; j++) {
        a_row<T> fa;
        b_row<T> fb;
        wmma::load_matrix_sync(fa, P + j * 16, 64);
        wmma::load_matrix_sync(fb, Vs + j * 16 * dh + d16 * 16, dh);
        wmma::mma_sync(c, fa, fb, c);
      }
      wmma::store_matrix_sync(O + d16 * 16, c, dh, wmma::mem_row_major);
    }
    __syncwarp();
  }
  float inv = 1.0f / ls[row], dot = 0.0f;
  int64_t o = bi * a.o_batch + h * a.dh + qi * a.o_row;
  for (int c = half * (dh / 2); c < (half + 1) * (dh / 2); c++) {
    float x = O[r * dh + c] * inv;
    if (MODE == 0) {
      if (qi < a.sq) out[o + c] = from_f<T>(x);
    } else if (qi < a.sq) {
      dot += x * to_f(dout[o + c]);
    }
  }
  if (MODE == 1) {
    dot += __shfl_xor_sync(0xffffffffu, dot, 1);
    if (!half && qi < a.sq) {
      int64_t at = (bi * a.hq + h) * a.sq + qi;
      lse[at] = ms[row] + logf(ls[row]);
      dsum[at] = dot;
    }
  }
}

static size_t fwd_tc_smem(int64_t dh) {
  return piece(TQ * dh * 2) + 2 * piece(TK * dh * 2) + piece(TW * 16 * 64 * 4) + piece(TW * 16 * 64 * 2) +
         piece(TW * 16 * dh * 4) + 2 * piece(TQ * 4);
}

/* dk and dv of keys [k0, k0 + 64) of key/value head hk; warp w owns 16. */
template <class T, int D16>
__global__ void __launch_bounds__(TT)
    k_attn_dkv_tc(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, gpu_attn a, float scale,
                  const float *lse, const float *dsum, bool acc) {
  const int dh = D16 * 16;
  DYN_SMEM(unsigned char, raw);
  carve cv = {raw, 0};
  T *Ks = cv.take<T>(TK * dh), *Vs = cv.take<T>(TK * dh), *Qs = cv.take<T>(TQ * dh), *Do = cv.take<T>(TQ * dh);
  float *Ss = cv.take<float>(TW * 16 * 64);
  T *Ps = cv.take<T>(TW * 16 * 64), *dSs = cv.take<T>(TW * 16 * 64);
  float *Ls = cv.take<float>(TQ), *Dd = cv.take<float>(TQ);
  const int64_t bi = blockIdx.z, hk = blockIdx.y, k0 = (int64_t)blockIdx.x * TK;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t kvoff = bi * a.kv_batch + hk * a.dh;
  load_rows(Ks, k + kvoff, k0, a.kv_row, a.sk, a);
  load_rows(Vs, v + kvoff, k0, a.kv_row, a.sk, a);
  float *St = Ss + w * 16 * 64;
  T *Pt = Ps + w * 16 * 64, *dSt = dSs + w * 16 * 64;
  acc_t gk[D16], gv[D16];
#pragma unroll
  for (int d = 0; d < D16; d++) wmma::fill_fragment(gk[d], 0.0f), wmma::fill_fragment(gv[d], 0.0f);
  const int r = lane >> 1, half = lane & 1;
  const int64_t kj = k0 + w * 16 + r;
  for (int64_t rr = 0; rr < a.r; rr++) {
    const int64_t h = hk * a.r + rr;
    const T *qb = q + bi * a.q_batch + h * a.dh, *ob = dout + bi * a.o_batch + h * a.dh;
    for (int64_t q0 = k0 > a.qpos ? k0 - a.qpos : 0; q0 < a.sq; q0 += TQ) {
      __syncthreads();
      load_rows(Qs, qb, q0, a.q_row, a.sq, a);
      load_rows(Do, ob, q0, a.o_row, a.sq, a);
      if (threadIdx.x < TQ) {
        int64_t i = q0 + threadIdx.x;
        bool in = i < a.sq;
        Ls[threadIdx.x] = in ? lse[(bi * a.hq + h) * a.sq + i] : 0.0f;
        Dd[threadIdx.x] = in ? dsum[(bi * a.hq + h) * a.sq + i] : 0.0f;
      }
      __syncthreads();
      /* S^T = K_w Q^T, then P^T */
      tile_abt<T, D16>(St, Ks + w * 16 * dh, Qs, dh);
      __syncwarp();
      for (int c = half * 32; c < half * 32 + 32; c++) {
        int64_t qi = q0 + c;
        bool ok = qi < a.sq && kj <= a.qpos + qi && kj < a.sk;
        Pt[r * 64 + c] = from_f<T>(ok ? fexp(St[r * 64 + c] * scale - Ls[c]) : 0.0f);
      }
      __syncwarp();
      /* dP^T = V_w dout^T, then dS^T = P^T (dP^T - D) */
      tile_abt<T, D16>(St, Vs + w * 16 * dh, Do, dh);
      __syncwarp();
      for (int c = half * 32; c < half * 32 + 32; c++)
        dSt[r * 64 + c] = from_f<T>(to_f(Pt[r * 64 + c]) * (St[r * 64 + c] - Dd[c]));
      __syncwarp();
#pragma unroll
      for (int d16 = 0; d16 < D16; d16++)
        for (int j = 0; j < 4; j++) {
          a_row<T> fp, fs;
          b_row<T> fo, fq;
          wmma::load_matrix_sync(fp, Pt + j * 16, 64);
          wmma::load_matrix_sync(fo, Do + j * 16 * dh + d16 * 16, dh);
          wmma::mma_sync(gv[d16], fp, fo, gv[d16]);
          wmma::load_matrix_sync(fs, dSt + j * 16, 64);
          wmma::load_matrix_sync(fq, Qs + j * 16 * dh + d16 * 16, dh);
          wmma::mma_sync(gk[d16], fs, fq, gk[d16]);
        }
    }
  }
  /* out through the warp's scratch, 16 x 16 at a time */
#pragma unroll
  for (int d16 = 0; d16 < D16; d16++)
    for (int which = 0; which < 2; which++) {
      T *dst = which ? dv : dk;
      __syncwarp();
      wmma::store_matrix_sync(St, which ? gv[d16] : gk[d16], 16, wmma::mem_row_major);
      __syncwarp();
      if (!dst) continue;
      for (int e = lane; e < 256; e += 32) {
        int64_t key = k0 + w * 16 + e / 16;
        if (key < a.sk)
          put(&dst[kvoff + key * a.kv_row + d16 * 16 + e % 16], St[e] * (which ? 1.0f : scale), acc);
      }
    }
}

static size_t dkv_tc_smem(int64_t dh) {
  return 4 * piece(64 * dh * 2) + piece(TW * 16 * 64 * 4) + 2 * piece(TW * 16 * 64 * 2) + 2 * piece(TQ * 4);
}

/* dq of query rows [q0, q0 + 64) of head h; warp w owns 16. */
template <class T, int D16>
__global__ void __launch_bounds__(TT)
    k_attn_dq_tc(T *dq, const T *dout, const T *q, const T *k, const T *v, gpu_attn a, float scale, const float *lse,
                 const float *dsum, bool acc) {
  const int dh = D16 * 16;
  DYN_SMEM(unsigned char, raw);
  carve cv = {raw, 0};
  T *Qs = cv.take<T>(TQ * dh), *Os = cv.take<T>(TQ * dh), *Ks = cv.take<T>(TK * dh), *Vs = cv.take<T>(TK * dh);
  float *Ss = cv.take<float>(TW * 16 * 64);
  T *Ps = cv.take<T>(TW * 16 * 64), *dSs = cv.take<T>(TW * 16 * 64);
  float *Ls = cv.take<float>(TQ), *Dd = cv.take<float>(TQ);
  const int64_t bi = blockIdx.z, h = blockIdx.y, q0 = (int64_t)blockIdx.x * TQ;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const T *qb = q + bi * a.q_batch + h * a.dh, *ob = dout + bi * a.o_batch + h * a.dh;
  const T *kb = k + bi * a.kv_batch + (h / a.r) * a.dh, *vb = v + bi * a.kv_batch + (h / a.r) * a.dh;
  load_rows(Qs, qb, q0, a.q_row, a.sq, a);
  load_rows(Os, ob, q0, a.o_row, a.sq, a);
  if (threadIdx.x < TQ) {
    int64_t i = q0 + threadIdx.x;
    bool in = i < a.sq;
    Ls[threadIdx.x] = in ? lse[(bi * a.hq + h) * a.sq + i] : 0.0f;
    Dd[threadIdx.x] = in ? dsum[(bi * a.hq + h) * a.sq + i] : 0.0f;
  }
  float *S = Ss + w * 16 * 64;
  T *P = Ps + w * 16 * 64, *dS = dSs + w * 16 * 64;
  acc_t g[D16];
#pragma unroll
  for (int d = 0; d < D16; d++) wmma::fill_fragment(g[d], 0.0f);
  const int r = lane >> 1, half = lane & 1, row = w * 16 + r;
  const int64_t qi = q0 + row;
  int64_t last = last_key(a, q0 + TQ);
  for (int64_t k0 = 0; k0 <= last; k0 += TK) {
    __syncthreads();
    load_rows(Ks, kb, k0, a.kv_row, a.sk, a);
    load_rows(Vs, vb, k0, a.kv_row, a.sk, a);
    __syncthreads();
    tile_abt<T, D16>(S, Qs + w * 16 * dh, Ks, dh);
    __syncwarp();
    for (int c = half * 32; c < half * 32 + 32; c++) {
      int64_t kj = k0 + c;
      bool ok = qi < a.sq && kj <= a.qpos + qi && kj < a.sk;
      P[r * 64 + c] = from_f<T>(ok ? fexp(S[r * 64 + c] * scale - Ls[row]) : 0.0f);
    }
    __syncwarp();
    tile_abt<T, D16>(S, Os + w * 16 * dh, Vs, dh);
    __syncwarp();
    for (int c = half * 32; c < half * 32 + 32; c++)
      dS[r * 64 + c] = from_f<T>(to_f(P[r * 64 + c]) * (S[r * 64 + c] - Dd[row]));
    __syncwarp();
#pragma unroll
    for (int d16 = 0; d16 < D16; d16++)
      for (int j = 0; j < 4; j++) {
        a_row<T> fs;
        b_row<T> fk;
        wmma::load_matrix_sync(fs, dS + j * 16, 64);
        wmma::load_matrix_sync(fk, Ks + j * 16 * dh + d16 * 16, dh);
        wmma::mma_sync(g[d16], fs, fk, g[d16]);
      }
  }
#pragma unroll
  for (int d16 = 0; d16 < D16; d16++) {
    __syncwarp();
    wmma::store_matrix_sync(S, g[d16], 16, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      int64_t i = q0 + w * 16 + e / 16;
      if (i < a.sq) put(&dq[bi * a.q_batch + h * a.dh + i * a.q_row + d16 * 16 + e % 16], S[e] * scale, acc);
    }
  }
}

static size_t dq_tc_smem(int64_t dh) {
  return 4 * piece(64 * dh * 2) + piece(TW * 16 * 64 * 4) + 2 * piece(TW * 16 * 64 * 2) + 2 * piece(TQ * 4);
}

template <typename... KArgs>
static void allow_smem(void (*k)(KArgs...), size_t bytes) {
#ifndef WEFT_CUDA_EMU
  if (bytes > (48 << 10)) cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
#else
  (void)k, (void)bytes;
#endif
}

bool attention_tc_takes(int dt, const gpu_attn *a) {
  return (dt == GPU_BF16 || dt == GPU_F16) && a->dh % 32 == 0 && a->dh >= 32 && a->dh <= 128 &&
         fwd_tc_smem(a->dh) <= attention_smem_limit();
}

#define WITH_D16(dh, D, ...)                                                                   \
  do {                                                                                         \
    switch ((dh) / 16) {                                                                       \
    case 2: { enum { D = 2 }; __VA_ARGS__; } break;                                            \
    case 4: { enum { D = 4 }; __VA_ARGS__; } break;                                            \
    case 6: { enum { D = 6 }; __VA_ARGS__; } break;                                            \
    default: { enum { D = 8 }; __VA_ARGS__; } break;                                           \
    }                                                                                          \
  } while (0)

#define DISPATCH16(dt, T, ...)                                                                 \
  do {                                                                                         \
    if ((dt) == GPU_F16) { typedef f16 T; __VA_ARGS__; }                                       \
    else { typedef bf16 T; __VA_ARGS__; }                                                      \
  } while (0)

void attention_tc_forward(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v,
                          const gpu_attn *a) {
  dim3 grid((unsigned)((a->sq + TQ - 1) / TQ), (unsigned)a->hq, (unsigned)a->b);
  float scale = (float)(1.0 / sqrt((double)a->dh));
  size_t sm = fwd_tc_smem(a->dh);
  DISPATCH16(dt, T, WITH_D16(a->dh, D, {
    allow_smem(k_attn_fwd_tc<T, D, 0>, sm);
    launch(k_attn_fwd_tc<T, D, 0>, grid, TT, sm, s, (T *)out, (const T *)q, (const T *)k, (const T *)v, *a, scale,
           (const T *)NULL, (float *)NULL, (float *)NULL);
  }));
}

void attention_tc_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                           const void *k, const void *v, const gpu_attn *a, bool acc, float *lse, float *dsum) {
  float scale = (float)(1.0 / sqrt((double)a->dh));
  dim3 gq((unsigned)((a->sq + TQ - 1) / TQ), (unsigned)a->hq, (unsigned)a->b);
  dim3 gk((unsigned)((a->sk + TK - 1) / TK), (unsigned)(a->hq / a->r), (unsigned)a->b);
  size_t s1 = fwd_tc_smem(a->dh), s2 = dkv_tc_smem(a->dh), s3 = dq_tc_smem(a->dh);
  DISPATCH16(dt, T, WITH_D16(a->dh, D, {
    allow_smem(k_attn_fwd_tc<T, D, 1>, s1);
    launch(k_attn_fwd_tc<T, D, 1>, gq, TT, s1, s, (T *)NULL, (const T *)q, (const T *)k, (const T *)v, *a, scale,
           (const T *)dout, lse, dsum);
    if (dk || dv) {
      allow_smem(k_attn_dkv_tc<T, D>, s2);
      launch(k_attn_dkv_tc<T, D>, gk, TT, s2, s, (T *)dk, (T *)dv, (const T *)dout, (const T *)q, (const T *)k,
             (const T *)v, *a, scale, (const float *)lse, (const float *)dsum, acc);
    }
    if (dq) {
      allow_smem(k_attn_dq_tc<T, D>, s3);
      launch(k_attn_dq_tc<T, D>, gq, TT, s3, s, (T *)dq, (const T *)dout, (const T *)q, (const T *)k, (const T *)v,
             *a, scale, (const float *)lse, (const float *)dsum, acc);
    }
  }));
}
