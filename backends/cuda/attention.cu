/* attention.cu - causal self-attention, FlashAttention's way: no s x s
 * scores in memory. CPU reference: k_causal_attention, k_gqa_attention and
 * their backwards in backends/cpu/kernels.c (scores as s x s matrices).
 *
 * Forward: a block takes 16 query rows of one head (4 warps of 4 rows);
 * key and value tiles of 32 rows stream through shared memory; lane j
 * scores key j against the warp's rows, the rows keep a running maximum
 * and sum, and each lane accumulates its dimensions (lane + 32 c) of the
 * result. Only the tiles up to the block's last row are read (causal).
 *
 * The forward may keep each row's log-sum-exp (lse, f32 [b, hq, sq]) for
 * the backward. Backward: each row's D = dout . out from the forward's
 * result (k_attn_dsum), with the kept log-sum-exp; where the forward kept
 * nothing, the same pass as the forward gives both instead. Then, for a
 * tile of 32 keys,
 * the rows from the tile on give dv += p dout and dk += ds q (each warp
 * owns 8 of the keys, so no two threads add into one element); then, for
 * 16 query rows, dq += ds k over the key tiles. ds = p (dout . v - D).
 * For grouped-query attention a key tile sums the query heads of its group
 * in order. No atomics: two runs give the same bits.
 *
 * Attention without a mask (gpu_attention_full, T5's; CPU reference
 * k_attention) runs these kernels with every key in view of every row. */
#include "attention.cuh"
#include "common.cuh"

enum { ROWS = 4, WARPS = 4, BQ = ROWS * WARPS, BK = 32, THREADS = 32 * WARPS };

size_t attention_smem_limit(void) {
#ifdef WEFT_CUDA_EMU
  return emu_device().smem_most;
#else
  int dev = 0, v = 0;
  cudaGetDevice(&dev);
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return 48 << 10;
  return (size_t)v;
#endif
}

/* K and V rows [k0, k0 + BK) of one head into shared memory, f32, rows
 * beyond the keys zero; row stride dh + 1 against bank conflicts. */
template <class T>
DEV void load_kv(float *Ks, float *Vs, const T *kb, const T *vb, int64_t k0, const gpu_attn &a) {
  int dh = (int)a.dh, ld = dh + 1;
  for (int e = threadIdx.x; e < BK * dh; e += blockDim.x) {
    int j = e / dh, d = e % dh;
    int64_t kj = k0 + j;
    bool in = kj < a.sk;
    Ks[j * ld + d] = in ? to_f(kb[kj * a.kv_row + d]) : 0.0f;
    Vs[j * ld + d] = in ? to_f(vb[kj * a.kv_row + d]) : 0.0f;
  }
}

/* MODE 0: out, and lse = max + log(sum) per row when lse is not NULL.
 * MODE 1: per row, lse and dsum = dout . out (the backward's recompute). */
template <class T, int DC, int MODE>
__global__ void __launch_bounds__(THREADS)
    k_attn_fwd(T *out, const T *q, const T *k, const T *v, gpu_attn a, float scale, const T *dout, float *lse,
               float *dsum) {
  DYN_SMEM(float, sm);
  const int dh = (int)a.dh, ld = dh + 1;
  float *Ks = sm, *Vs = Ks + BK * ld, *Qs = Vs + BK * ld, *Ps = Qs + BQ * dh;
  const int64_t bi = blockIdx.z, h = blockIdx.y, q0 = (int64_t)blockIdx.x * BQ;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const T *qb = q + bi * a.q_batch + h * a.dh;
  const T *kb = k + bi * a.kv_batch + (h / a.r) * a.dh, *vb = v + bi * a.kv_batch + (h / a.r) * a.dh;
  for (int e = threadIdx.x; e < BQ * dh; e += blockDim.x) {
    int64_t qi = q0 + e / dh;
    Qs[e] = qi < a.sq ? to_f(qb[qi * a.q_row + e % dh]) * scale : 0.0f;
  }
  float m[ROWS], l[ROWS], acc[ROWS][DC];
  for (int r = 0; r < ROWS; r++) {
    m[r] = -INFINITY, l[r] = 0.0f;
    for (int c = 0; c < DC; c++) acc[r][c] = 0.0f;
  }
  int64_t last = last_key(a, q0 + BQ);
  for (int64_t k0 = 0; k0 <= last; k0 += BK) {
    __syncthreads();
    load_kv(Ks, Vs, kb, vb, k0, a);
    __syncthreads();
    float sc[ROWS];
    for (int r = 0; r < ROWS; r++) sc[r] = 0.0f;
    for (int d = 0; d < dh; d++) {
      float kd = Ks[lane * ld + d];
      for (int r = 0; r < ROWS; r++) sc[r] += Qs[(w * ROWS + r) * dh + d] * kd;
    }
    int64_t kj = k0 + lane;
    for (int r = 0; r < ROWS; r++) {
      int64_t qi = q0 + w * ROWS + r;
      bool ok = kj <= a.qpos + qi && kj < a.sk;
      float sv = ok ? sc[r] : -INFINITY;
      float mnew = fmaxf(m[r], warp_max(sv));
      float p = ok ? fexp(sv - mnew) : 0.0f, corr = fexp(m[r] - mnew);
      l[r] = l[r] * corr + warp_sum(p);
      m[r] = mnew;
      for (int c = 0; c < DC; c++) acc[r][c] *= corr;
      Ps[(w * ROWS + r) * BK + lane] = p;
    }
    __syncwarp();
    for (int j = 0; j < BK; j++)
      for (int c = 0; c < DC; c++) {
        int d = lane + 32 * c;
        float vv = d < dh ? Vs[j * ld + d] : 0.0f;
        for (int r = 0; r < ROWS; r++) acc[r][c] += Ps[(w * ROWS + r) * BK + j] * vv;
      }
  }
  for (int r = 0; r < ROWS; r++) {
    int64_t qi = q0 + w * ROWS + r;
    if (qi >= a.sq) continue;  /* the same for every lane of the warp */
    float inv = 1.0f / l[r];
    int64_t o = bi * a.o_batch + h * a.dh + qi * a.o_row;
    if (MODE == 0) {
      for (int c = 0; c < DC; c++) {
        int d = lane + 32 * c;
        if (d < dh) out[o + d] = from_f<T>(acc[r][c] * inv);
      }
      if (lse && lane == 0) lse[(bi * a.hq + h) * a.sq + qi] = m[r] + logf(l[r]);
    } else {
      float dot = 0.0f;
      for (int c = 0; c < DC; c++) {
        int d = lane + 32 * c;
        if (d < dh) dot += acc[r][c] * inv * to_f(dout[o + d]);
      }
      dot = warp_sum(dot);
      if (lane == 0) {
        int64_t at = (bi * a.hq + h) * a.sq + qi;
        lse[at] = m[r] + logf(l[r]);
        dsum[at] = dot;
      }
    }
  }
}

static size_t fwd_smem(int64_t dh) { return (size_t)(2 * BK * (dh + 1) + BQ * dh + BQ * BK) * sizeof(float); }

/* dsum = dout . out of every row (b, h, row in [b, hq, sq] order), one warp
 * a row, from the result the forward wrote (dout's layout); the lanes' sums
 * add in a fixed order. */
template <class T>
__global__ void __launch_bounds__(THREADS) k_attn_dsum(float *dsum, const T *dout, const T *out, gpu_attn a) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t row = (int64_t)blockIdx.x * WARPS + w;
  const bool in = row < a.b * a.hq * a.sq;
  float dot = 0.0f;
  if (in) {
    const int64_t qi = row % a.sq, h = row / a.sq % a.hq, bi = row / (a.sq * a.hq);
    const int64_t o = bi * a.o_batch + h * a.dh + qi * a.o_row;
    for (int64_t d = lane; d < a.dh; d += 32) dot += to_f(dout[o + d]) * to_f(out[o + d]);
  }
  dot = warp_sum(dot);
  if (in && lane == 0) dsum[row] = dot;
}

/* dk, dv of the keys [k0, k0 + BK) of key/value head hk. */
template <class T, int DC>
__global__ void __launch_bounds__(THREADS)
    k_attn_dkv(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, gpu_attn a, float scale,
               const float *lse, const float *dsum, bool acc) {
  DYN_SMEM(float, sm);
  const int dh = (int)a.dh, ld = dh + 1;
  float *Ks = sm, *Vs = Ks + BK * ld, *Qs = Vs + BK * ld, *Os = Qs + WARPS * dh;
  float *Ps = Os + WARPS * dh, *Ds = Ps + WARPS * BK, *Ls = Ds + WARPS * BK, *Dd = Ls + WARPS;
  const int64_t bi = blockIdx.z, hk = blockIdx.y, k0 = (int64_t)blockIdx.x * BK;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t kvoff = bi * a.kv_batch + hk * a.dh;
  load_kv(Ks, Vs, k + kvoff, v + kvoff, k0, a);
  enum { KEYS = BK / WARPS };
  float gk[KEYS][DC], gv[KEYS][DC];
  for (int jj = 0; jj < KEYS; jj++)
    for (int c = 0; c < DC; c++) gk[jj][c] = gv[jj][c] = 0.0f;
  for (int64_t rr = 0; rr < a.r; rr++) {
    const int64_t h = hk * a.r + rr;
    const T *qb = q + bi * a.q_batch + h * a.dh, *ob = dout + bi * a.o_batch + h * a.dh;
    for (int64_t i0 = k0 > a.qpos ? k0 - a.qpos : 0; i0 < a.sq; i0 += WARPS) {
      __syncthreads();
      for (int e = threadIdx.x; e < WARPS * dh; e += blockDim.x) {
        int64_t i = i0 + e / dh;
        int d = e % dh;
        bool in = i < a.sq;
        Qs[e] = in ? to_f(qb[i * a.q_row + d]) : 0.0f;
        Os[e] = in ? to_f(ob[i * a.o_row + d]) : 0.0f;
      }
      if (threadIdx.x < WARPS) {
        int64_t i = i0 + threadIdx.x;
        bool in = i < a.sq;
        Ls[threadIdx.x] = in ? lse[(bi * a.hq + h) * a.sq + i] : 0.0f;
        Dd[threadIdx.x] = in ? dsum[(bi * a.hq + h) * a.sq + i] : 0.0f;
      }
      __syncthreads();
      {
        /* warp w: row i0 + w against key k0 + lane */
        int64_t i = i0 + w, kj = k0 + lane;
        bool ok = i < a.sq && kj < a.sk && kj <= a.qpos + i;
        float s = 0.0f, dp = 0.0f;
        for (int d = 0; d < dh; d++) {
          s += Qs[w * dh + d] * Ks[lane * ld + d];
          dp += Os[w * dh + d] * Vs[lane * ld + d];
        }
        float p = ok ? fexp(s * scale - Ls[w]) : 0.0f;
        Ps[w * BK + lane] = p;
        Ds[w * BK + lane] = ok ? p * (dp - Dd[w]) : 0.0f;
      }
      __syncthreads();
      for (int jj = 0; jj < KEYS; jj++) {
        int j = w * KEYS + jj;
        for (int r = 0; r < WARPS; r++) {
          float pj = Ps[r * BK + j], dsj = Ds[r * BK + j];
          for (int c = 0; c < DC; c++) {
            int d = lane + 32 * c;
            if (d < dh) {
              gv[jj][c] += pj * Os[r * dh + d];
              gk[jj][c] += dsj * Qs[r * dh + d];
            }
          }
        }
      }
    }
  }
  for (int jj = 0; jj < KEYS; jj++) {
    int64_t kj = k0 + w * KEYS + jj;
    if (kj >= a.sk) continue;
    for (int c = 0; c < DC; c++) {
      int d = lane + 32 * c;
      if (d >= dh) continue;
      if (dk) put(&dk[kvoff + kj * a.kv_row + d], gk[jj][c] * scale, acc);
      if (dv) put(&dv[kvoff + kj * a.kv_row + d], gv[jj][c], acc);
    }
  }
}

static size_t dkv_smem(int64_t dh) {
  return (size_t)(2 * BK * (dh + 1) + 2 * WARPS * dh + 2 * WARPS * BK + 2 * WARPS) * sizeof(float);
}

/* dq of the query rows [q0, q0 + BQ) of head h. */
template <class T, int DC>
__global__ void __launch_bounds__(THREADS)
    k_attn_dq(T *dq, const T *dout, const T *q, const T *k, const T *v, gpu_attn a, float scale, const float *lse,
              const float *dsum, bool acc) {
  DYN_SMEM(float, sm);
  const int dh = (int)a.dh, ld = dh + 1;
  float *Ks = sm, *Vs = Ks + BK * ld, *Qs = Vs + BK * ld, *Os = Qs + BQ * dh, *Ds = Os + BQ * dh;
  float *Ls = Ds + BQ * BK, *Dd = Ls + BQ;
  const int64_t bi = blockIdx.z, h = blockIdx.y, q0 = (int64_t)blockIdx.x * BQ;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const T *qb = q + bi * a.q_batch + h * a.dh, *ob = dout + bi * a.o_batch + h * a.dh;
  const T *kb = k + bi * a.kv_batch + (h / a.r) * a.dh, *vb = v + bi * a.kv_batch + (h / a.r) * a.dh;
  for (int e = threadIdx.x; e < BQ * dh; e += blockDim.x) {
    int64_t qi = q0 + e / dh;
    int d = e % dh;
    bool in = qi < a.sq;
    Qs[e] = in ? to_f(qb[qi * a.q_row + d]) * scale : 0.0f;
    Os[e] = in ? to_f(ob[qi * a.o_row + d]) : 0.0f;
  }
  if (threadIdx.x < BQ) {
    int64_t qi = q0 + threadIdx.x;
    bool in = qi < a.sq;
    Ls[threadIdx.x] = in ? lse[(bi * a.hq + h) * a.sq + qi] : 0.0f;
    Dd[threadIdx.x] = in ? dsum[(bi * a.hq + h) * a.sq + qi] : 0.0f;
  }
  float g[ROWS][DC];
  for (int r = 0; r < ROWS; r++)
    for (int c = 0; c < DC; c++) g[r][c] = 0.0f;
  int64_t last = last_key(a, q0 + BQ);
  for (int64_t k0 = 0; k0 <= last; k0 += BK) {
    __syncthreads();
    load_kv(Ks, Vs, kb, vb, k0, a);
    __syncthreads();
    float sc[ROWS], dp[ROWS];
    for (int r = 0; r < ROWS; r++) sc[r] = dp[r] = 0.0f;
    for (int d = 0; d < dh; d++) {
      float kd = Ks[lane * ld + d], vd = Vs[lane * ld + d];
      for (int r = 0; r < ROWS; r++) {
        sc[r] += Qs[(w * ROWS + r) * dh + d] * kd;
        dp[r] += Os[(w * ROWS + r) * dh + d] * vd;
      }
    }
    int64_t kj = k0 + lane;
    for (int r = 0; r < ROWS; r++) {
      int row = w * ROWS + r;
      int64_t qi = q0 + row;
      bool ok = qi < a.sq && kj <= a.qpos + qi && kj < a.sk;
      float p = ok ? fexp(sc[r] - Ls[row]) : 0.0f;
      Ds[row * BK + lane] = ok ? p * (dp[r] - Dd[row]) : 0.0f;
    }
    __syncwarp();
    for (int j = 0; j < BK; j++)
      for (int c = 0; c < DC; c++) {
        int d = lane + 32 * c;
        float kd = d < dh ? Ks[j * ld + d] : 0.0f;
        for (int r = 0; r < ROWS; r++) g[r][c] += Ds[(w * ROWS + r) * BK + j] * kd;
      }
  }
  for (int r = 0; r < ROWS; r++) {
    int64_t qi = q0 + w * ROWS + r;
    if (qi >= a.sq) continue;
    for (int c = 0; c < DC; c++) {
      int d = lane + 32 * c;
      if (d < dh) put(&dq[bi * a.q_batch + h * a.dh + qi * a.q_row + d], g[r][c] * scale, acc);
    }
  }
}

static size_t dq_smem(int64_t dh) {
  return (size_t)(2 * BK * (dh + 1) + 2 * BQ * dh + BQ * BK + 2 * BQ) * sizeof(float);
}

/* The lanes' share of a head: dimensions lane + 32 c for c < DC. */
static int dc_for(int64_t dh) {
  int dc = (int)((dh + 31) / 32);
  return dc <= 4 ? dc : dc <= 6 ? 6 : 8;
}

#define WITH_DC(dh, DCV, ...)                                                                  \
  do {                                                                                         \
    switch (dc_for(dh)) {                                                                      \
    case 1: { enum { DCV = 1 }; __VA_ARGS__; } break;                                          \
    case 2: { enum { DCV = 2 }; __VA_ARGS__; } break;                                          \
    case 3: { enum { DCV = 3 }; __VA_ARGS__; } break;                                          \
    case 4: { enum { DCV = 4 }; __VA_ARGS__; } break;                                          \
    case 6: { enum { DCV = 6 }; __VA_ARGS__; } break;                                          \
    default: { enum { DCV = 8 }; __VA_ARGS__; } break;                                         \
    }                                                                                          \
  } while (0)

/* The forward on CUDA cores. */
static void core_forward(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v,
                         const gpu_attn *a, float *lse) {
  dim3 grid((unsigned)((a->sq + BQ - 1) / BQ), (unsigned)a->hq, (unsigned)a->b);
  float scale = (float)(1.0 / sqrt((double)a->dh));
  size_t sm = fwd_smem(a->dh);
  DISPATCH(dt, T, WITH_DC(a->dh, DC, {
    allow_smem(k_attn_fwd<T, DC, 0>, sm);
    launch(k_attn_fwd<T, DC, 0>, grid, THREADS, sm, s, (T *)out, (const T *)q, (const T *)k, (const T *)v, *a, scale,
           (const T *)NULL, lse, (float *)NULL);
  }));
}

bool attention_way_takes(int way, int dt, const gpu_attn *a, bool causal, bool bwd) {
  switch (way) {
  case ATTN_FA: return causal && (bwd ? attention_fa_bwd_takes(dt, a) : attention_fa_fwd_takes(dt, a));
  case ATTN_WMMA: return causal && attention_tc_takes(dt, a);
  case ATTN_CUDNN: return attention_cudnn_ready(dt, a, causal, bwd);
  case ATTN_CORE: return true;
  case ATTN_FA_ATOMIC: return causal && bwd && attention_fa_atomic_takes(dt, a);
  case ATTN_FA_WG: return causal && attention_wg_takes(dt, a);
  case ATTN_FA_WGP: return causal && bwd && attention_wg_takes(dt, a);
  case ATTN_FA_DS: return causal && bwd && attention_fa_ds_takes(dt, a);
  default: return false;
  }
}

/* Every key in view: the causal bound qpos + p of query row p put at the
 * last key, so that every row sees every key (the kernels on CUDA cores
 * only). */
static gpu_attn unmasked(const gpu_attn *a) {
  gpu_attn f = *a;
  f.qpos = f.sk - 1;
  return f;
}

bool attention_forward_by(int way, gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v,
                          const gpu_attn *a, float *lse, bool causal) {
  if (way == ATTN_CUDNN) return attention_cudnn_forward(s, dt, out, q, k, v, a, lse, causal);
  if (way == ATTN_CORE) {
    gpu_attn f = causal ? *a : unmasked(a);
    core_forward(s, dt, out, q, k, v, &f, lse);
    return true;
  }
  if (!attention_way_takes(way, dt, a, causal, false)) return false;
  if (way == ATTN_FA_WG)
    attention_wg_forward(s, dt, out, q, k, v, a, lse);
  else if (way == ATTN_FA)
    attention_fa_forward(s, dt, out, q, k, v, a, lse);
  else
    attention_tc_forward(s, dt, out, q, k, v, a, lse);
  return true;
}

/* The forward: the way chosen, else the plugin's first kernels that take
 * the heads. */
static void forward(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v, const gpu_attn *a,
                    float *lse, bool causal) {
  if (a->dh <= 0 || a->dh > GPU_ATTN_MAX_DH || a->r <= 0 || a->sk <= 0) return;
  int way = attention_pick_forward(s, dt, out, q, k, v, a, lse, causal);
  if (way >= 0 && attention_forward_by(way, s, dt, out, q, k, v, a, lse, causal)) return;
  for (int w = ATTN_FA; w <= ATTN_CORE; w++)
    if (w != ATTN_CUDNN && attention_forward_by(w, s, dt, out, q, k, v, a, lse, causal)) return;
}

void gpu_attention(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v, const gpu_attn *a,
                   float *lse) {
  forward(s, dt, out, q, k, v, a, lse, true);
}

size_t gpu_attention_stats_bytes(const gpu_attn *a) { return (size_t)(a->b * a->hq * a->sq) * sizeof(float); }

/* lse and D of every row (attention_fa_bwd.cu's and the others'), or
 * cuDNN's workspace where it takes the backward, whichever is larger. */
static size_t own_ws(const gpu_attn *a) { return (size_t)(2 * a->b * a->hq * a->sq + 1) * sizeof(float); }

/* Where the f32 sums of dq by atomics (fa-atomic) or the stored dS^T
 * (fa-ds) start in the workspace: after lse and D. */
static size_t atomic_at(const gpu_attn *a) { return (own_ws(a) + 255) / 256 * 256; }

static size_t backward_ws(int dt, const gpu_attn *a, bool acc, bool causal) {
  size_t own = own_ws(a);
  if (attention_fa_atomic_considered(dt, a, causal, acc)) own = atomic_at(a) + attention_fa_atomic_ws(a);
  if (attention_fa_ds_considered(dt, a, causal, acc) && atomic_at(a) + attention_fa_ds_ws(a) > own)
    own = atomic_at(a) + attention_fa_ds_ws(a);
  size_t lib = acc || !attention_cudnn_considered(dt, a, causal) ? 0 : attention_cudnn_backward_ws(dt, a, causal);
  return lib > own ? lib : own;
}

size_t gpu_attention_backward_ws(int dt, const gpu_attn *a, bool acc) { return backward_ws(dt, a, acc, true); }

/* Each row's log-sum-exp and D: the forward's kept lse and D from its
 * result out (the return: true), else the workspace's, filled by the
 * backward's pass of the forward (false). */
static bool backward_stats(gpu_stream *s, int dt, const void *dout, const gpu_attn *a, const float *lse_kept,
                           const void *out, void *ws, float **lse, float **dsum) {
  *lse = (float *)ws, *dsum = *lse + a->b * a->hq * a->sq;
  const bool kept = lse_kept && out;
  if (kept) {
    *lse = (float *)lse_kept;
    dim3 grid((unsigned)((a->b * a->hq * a->sq + WARPS - 1) / WARPS));
    DISPATCH(dt, T, launch(k_attn_dsum<T>, grid, THREADS, 0, s, *dsum, (const T *)dout, (const T *)out, *a));
  }
  return kept;
}

/* The backward on CUDA cores. */
static void core_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                          const void *k, const void *v, const gpu_attn *a, bool acc, float *lse, float *dsum,
                          bool kept) {
  float scale = (float)(1.0 / sqrt((double)a->dh));
  dim3 gq((unsigned)((a->sq + BQ - 1) / BQ), (unsigned)a->hq, (unsigned)a->b);
  dim3 gk((unsigned)((a->sk + BK - 1) / BK), (unsigned)(a->hq / a->r), (unsigned)a->b);
  size_t s1 = fwd_smem(a->dh), s2 = dkv_smem(a->dh), s3 = dq_smem(a->dh);
  DISPATCH(dt, T, WITH_DC(a->dh, DC, {
    if (!kept) {
      allow_smem(k_attn_fwd<T, DC, 1>, s1);
      launch(k_attn_fwd<T, DC, 1>, gq, THREADS, s1, s, (T *)NULL, (const T *)q, (const T *)k, (const T *)v, *a, scale,
             (const T *)dout, lse, dsum);
    }
    if (dk || dv) {
      allow_smem(k_attn_dkv<T, DC>, s2);
      launch(k_attn_dkv<T, DC>, gk, THREADS, s2, s, (T *)dk, (T *)dv, (const T *)dout, (const T *)q, (const T *)k,
             (const T *)v, *a, scale, (const float *)lse, (const float *)dsum, acc);
    }
    if (dq) {
      allow_smem(k_attn_dq<T, DC>, s3);
      launch(k_attn_dq<T, DC>, gq, THREADS, s3, s, (T *)dq, (const T *)dout, (const T *)q, (const T *)k,
             (const T *)v, *a, scale, (const float *)lse, (const float *)dsum, acc);
    }
  }));
}

bool attention_backward_by(int way, gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout,
                           const void *q, const void *k, const void *v, const gpu_attn *a, bool acc,
                           const float *lse_kept, const void *out, void *ws, bool causal) {
  if (way == ATTN_CUDNN)
    return lse_kept && out && attention_cudnn_backward(s, dt, dq, dk, dv, dout, q, k, v, a, acc, lse_kept, out, ws, causal);
  const bool wg = way == ATTN_FA_WG || way == ATTN_FA_WGP,
             fa = way == ATTN_FA || way == ATTN_FA_ATOMIC || way == ATTN_FA_DS || wg;
  if (!attention_way_takes(way, dt, a, causal, true) || (fa && !(lse_kept && out))) return false;
  gpu_attn f = causal ? *a : unmasked(a);
  float *lse, *dsum;
  const bool kept = backward_stats(s, dt, dout, &f, lse_kept, out, ws, &lse, &dsum);
  if (wg) /* fa-wg: the shape WEFT_ATTN_FA_BWD_SHAPE names, by default wg; fa-wgp: pipelined */
    attention_wg_backward(s, dt, dq, dk, dv, dout, q, k, v, a, acc, lse, dsum, attention_rows16(a, dout, q, k, v),
                          way == ATTN_FA_WGP ? 1 : 0);
  else if (way == ATTN_FA_DS)
    attention_fa_ds_backward(s, dt, dq, dk, dv, dout, q, k, v, a, acc, lse, dsum, (char *)ws + atomic_at(a));
  else if (fa)
    attention_fa_backward(s, dt, dq, dk, dv, dout, q, k, v, a, acc, lse, dsum,
                          way == ATTN_FA_ATOMIC ? (float *)((char *)ws + atomic_at(a)) : NULL);
  else if (way == ATTN_WMMA)
    attention_tc_backward(s, dt, dq, dk, dv, dout, q, k, v, a, acc, lse, dsum, kept);
  else
    core_backward(s, dt, dq, dk, dv, dout, q, k, v, &f, acc, lse, dsum, kept);
  return true;
}

static void backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                     const void *k, const void *v, const gpu_attn *a, bool acc, const float *lse_kept,
                     const void *out, void *ws, bool causal) {
  if (a->dh <= 0 || a->dh > GPU_ATTN_MAX_DH || a->r <= 0 || a->sk <= 0 || (!dq && !dk && !dv)) return;
  int way = attention_pick_backward(s, dt, dq, dk, dv, dout, q, k, v, a, acc, lse_kept, out, ws, causal);
  if (way >= 0 && attention_backward_by(way, s, dt, dq, dk, dv, dout, q, k, v, a, acc, lse_kept, out, ws, causal))
    return;
  for (int w = ATTN_FA; w <= ATTN_CORE; w++)
    if (w != ATTN_CUDNN && attention_backward_by(w, s, dt, dq, dk, dv, dout, q, k, v, a, acc, lse_kept, out, ws, causal))
      return;
}

void gpu_attention_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                            const void *k, const void *v, const gpu_attn *a, bool acc, const float *lse_kept,
                            const void *out, void *ws) {
  backward(s, dt, dq, dk, dv, dout, q, k, v, a, acc, lse_kept, out, ws, true);
}

/* Without a mask (T5's): cuDNN where it is chosen, else the kernels on
 * CUDA cores with every key in view of every row. */
void gpu_attention_full(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v,
                        const gpu_attn *a, float *lse) {
  forward(s, dt, out, q, k, v, a, lse, false);
}

size_t gpu_attention_full_backward_ws(int dt, const gpu_attn *a, bool acc) { return backward_ws(dt, a, acc, false); }

void gpu_attention_full_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout,
                                 const void *q, const void *k, const void *v, const gpu_attn *a, bool acc,
                                 const float *lse_kept, const void *out, void *ws) {
  backward(s, dt, dq, dk, dv, dout, q, k, v, a, acc, lse_kept, out, ws, false);
}
