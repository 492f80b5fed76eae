/* swin.cu - the Swin Transformer's operators: patches of an image, windows
 * of the token grid after a cyclic shift and back, window attention with a
 * relative position bias and the mask of shifted windows, patch merging and
 * mean pooling, forward and backward. CPU reference: the kernels of
 * backends/cpu/kernels_swin.c.
 *
 * The moves (patchify, window_partition, window_reverse, patch_merge) are
 * permutations: a thread takes an element of what is written and reads the
 * one element it comes from, so each backward (the inverse permutation)
 * writes every element of the gradient once, with no atomics.
 *
 * Window attention: the forward has a block per window and head, the
 * window's keys and values in shared memory, a warp per query row (lane x
 * scores key x; the row's maximum and sum over the warp; then each lane
 * its dimensions of the result). The backward has a block per head and
 * chunk of consecutive windows, which it takes one after another: per
 * window, the probabilities P in shared memory (s x s), dv = P^T dout, then
 * P becomes dS = P (dout v^T - rowsum(P dout v^T)) in place, and dq = dS k,
 * dk = dS^T q (times 1 / sqrt(dh)); thread r adds the window's dS of the
 * pairs at relative offset r into the chunk's sum for bias row r, and a
 * last pass sums the chunks in order (k_chunks_done). Every sum has one
 * order: two runs give the same bits. */
#include "attention.cuh"
#include "common.cuh"

/* ---- patches ------------------------------------------------------------------ */

/* The image's element of element e of the patches: out[b][hn][wn][c p p]
 * from x[b][c][hn p][wn p]. */
DEV int64_t image_of_patch(int64_t e, int64_t c, int64_t hn, int64_t wn, int64_t p) {
  int64_t k = c * p * p, q = e % k, rest = e / k;
  int64_t j = rest % wn, i = rest / wn % hn, bi = rest / (wn * hn);
  int64_t ch = q / (p * p), u = q / p % p, v = q % p;
  return ((bi * c + ch) * hn * p + i * p + u) * wn * p + j * p + v;
}

/* The patches' element of element e of the image. */
DEV int64_t patch_of_image(int64_t e, int64_t c, int64_t hn, int64_t wn, int64_t p) {
  int64_t w = wn * p, h = hn * p;
  int64_t xx = e % w, y = e / w % h, ch = e / (w * h) % c, bi = e / (w * h * c);
  int64_t i = y / p, u = y % p, j = xx / p, v = xx % p;
  return ((bi * hn + i) * wn + j) * c * p * p + (ch * p + u) * p + v;
}

template <class T>
__global__ void k_patch_move(T *dst, const T *src, int64_t n, int64_t c, int64_t hn, int64_t wn, int64_t p,
                             bool to_patches, bool acc) {
  GRID_STRIDE(e, n) {
    int64_t from = to_patches ? image_of_patch(e, c, hn, wn, p) : patch_of_image(e, c, hn, wn, p);
    put(&dst[e], to_f(src[from]), acc);
  }
}

void gpu_patch_move(gpu_stream *s, int dt, void *dst, const void *src, int64_t b, int64_t c, int64_t hn, int64_t wn,
                    int64_t p, bool to_patches, bool acc) {
  if (!dst || p <= 0) return;
  int64_t n = b * c * hn * p * wn * p;
  DISPATCH(dt, T, launch(k_patch_move<T>, blocks_for(n, 256), 256, 0, s, (T *)dst, (const T *)src, n, c, hn, wn, p,
                         to_patches, acc));
}

/* ---- windows -------------------------------------------------------------------- */

/* The image's row of token t of the windows ([b][hn][wn][ws ws] in order):
 * window (i, j), position (u, v), shifted by (sh, sw). */
DEV int64_t image_row_of_token(int64_t t, int64_t hn, int64_t wn, int64_t ws, int64_t sh, int64_t sw) {
  int64_t s = ws * ws, h = hn * ws, w = wn * ws;
  int64_t v = t % ws, u = t / ws % ws, j = t / s % wn, i = t / (s * wn) % hn, bi = t / (s * wn * hn);
  return (bi * h + (i * ws + u + sh) % h) * w + (j * ws + v + sw) % w;
}

/* The windows' token of row r of the image: the shift undone. */
DEV int64_t token_of_image_row(int64_t r, int64_t hn, int64_t wn, int64_t ws, int64_t sh, int64_t sw) {
  int64_t h = hn * ws, w = wn * ws;
  int64_t xx = r % w, y = r / w % h, bi = r / (w * h);
  int64_t ys = (y - sh + h) % h, xs = (xx - sw + w) % w;
  return ((bi * hn + ys / ws) * wn + xs / ws) * ws * ws + (ys % ws) * ws + xs % ws;
}

template <class T>
__global__ void k_window_move(T *dst, const T *src, int64_t n, int64_t hn, int64_t wn, int64_t ws, int64_t c,
                              int64_t sh, int64_t sw, bool to_windows, bool acc) {
  GRID_STRIDE(e, n) {
    int64_t row = e / c, ch = e % c;
    int64_t from = to_windows ? image_row_of_token(row, hn, wn, ws, sh, sw) : token_of_image_row(row, hn, wn, ws, sh, sw);
    put(&dst[e], to_f(src[from * c + ch]), acc);
  }
}

void gpu_window_move(gpu_stream *s, int dt, void *dst, const void *src, int64_t b, int64_t hn, int64_t wn, int64_t ws,
                     int64_t c, int64_t shift, bool to_windows, bool acc) {
  if (!dst || ws <= 0 || hn <= 0 || wn <= 0) return;
  int64_t h = hn * ws, w = wn * ws, n = b * h * w * c;
  int64_t sh = ((shift % h) + h) % h, sw = ((shift % w) + w) % w;
  DISPATCH(dt, T, launch(k_window_move<T>, blocks_for(n, 256), 256, 0, s, (T *)dst, (const T *)src, n, hn, wn, ws, c,
                         sh, sw, to_windows, acc));
}

/* ---- patch merging and pooling ---------------------------------------------------- */

/* The image's element of element e of the merged [b][hn][wn][4 c]: the
 * neighbour q = 0: (2i, 2j), 1: (2i + 1, 2j), 2: (2i, 2j + 1), 3: (2i +
 * 1, 2j + 1). */
DEV int64_t image_of_merged(int64_t e, int64_t hn, int64_t wn, int64_t c) {
  int64_t ch = e % c, q = e / c % 4, rest = e / (4 * c);
  int64_t j = rest % wn, i = rest / wn % hn, bi = rest / (wn * hn);
  return ((bi * 2 * hn + 2 * i + (q & 1)) * 2 * wn + 2 * j + (q >> 1)) * c + ch;
}

/* The merged element of element e of the image [b][2 hn][2 wn][c]. */
DEV int64_t merged_of_image(int64_t e, int64_t hn, int64_t wn, int64_t c) {
  int64_t ch = e % c, xx = e / c % (2 * wn), y = e / (c * 2 * wn) % (2 * hn), bi = e / (c * 4 * wn * hn);
  int64_t q = (y & 1) | (xx & 1) << 1;
  return (((bi * hn + y / 2) * wn + xx / 2) * 4 + q) * c + ch;
}

template <class T>
__global__ void k_merge_move(T *dst, const T *src, int64_t n, int64_t hn, int64_t wn, int64_t c, bool to_merged,
                             bool acc) {
  GRID_STRIDE(e, n) {
    int64_t from = to_merged ? image_of_merged(e, hn, wn, c) : merged_of_image(e, hn, wn, c);
    put(&dst[e], to_f(src[from]), acc);
  }
}

void gpu_patch_merge(gpu_stream *s, int dt, void *dst, const void *src, int64_t b, int64_t hn, int64_t wn, int64_t c,
                     bool to_merged, bool acc) {
  if (!dst) return;
  int64_t n = b * 4 * hn * wn * c;
  DISPATCH(dt, T, launch(k_merge_move<T>, blocks_for(n, 256), 256, 0, s, (T *)dst, (const T *)src, n, hn, wn, c,
                         to_merged, acc));
}

/* out[bi][e] (+)= the sum of column e of batch bi's hw rows, in order, over
 * count: a thread per column (the rows' reads coalesce across threads). */
template <class T>
__global__ void k_mean_pool(T *out, const T *x, int64_t b, int64_t hw, int64_t c, float count, bool acc) {
  GRID_STRIDE(e, b * c) {
    int64_t bi = e / c, ch = e % c;
    const T *col = x + bi * hw * c + ch;
    float sum = 0.0f;
    for (int64_t t = 0; t < hw; t++) sum += to_f(col[t * c]);
    put(&out[e], sum / count, acc);
  }
}

template <class T>
__global__ void k_mean_pool_backward(T *dx, const T *dout, int64_t b, int64_t hw, int64_t c, float count, bool acc) {
  GRID_STRIDE(e, b * hw * c) put(&dx[e], to_f(dout[e / (hw * c) * c + e % c]) / count, acc);
}

void gpu_mean_pool(gpu_stream *s, int dt, void *out, const void *x, int64_t b, int64_t hw, int64_t c, int64_t count,
                   bool acc) {
  if (count <= 0) return;
  DISPATCH(dt, T, launch(k_mean_pool<T>, blocks_for(b * c, 256), 256, 0, s, (T *)out, (const T *)x, b, hw, c,
                         (float)count, acc));
}

void gpu_mean_pool_backward(gpu_stream *s, int dt, void *dx, const void *dout, int64_t b, int64_t hw, int64_t c,
                            int64_t count, bool acc) {
  if (!dx || count <= 0) return;
  DISPATCH(dt, T, launch(k_mean_pool_backward<T>, blocks_for(b * hw * c, 256), 256, 0, s, (T *)dx, (const T *)dout,
                         b, hw, c, (float)count, acc));
}

/* ---- window attention --------------------------------------------------------------- */

enum { WA_WARPS = 4, WA_THREADS = 32 * WA_WARPS };

/* The chunks of windows the backward's blocks take for each head. */
#ifdef WEFT_CUDA_EMU
enum { WA_CHUNKS = 8 };
#else
enum { WA_CHUNKS = 128 };
#endif

/* The region of the shifted grid coordinate y falls in (n along that side):
 * 0 below n - ws, 1 below n - shift, 2 after; one region without a shift. */
DEV int wa_region(int64_t y, int64_t n, int64_t ws, int64_t shift) {
  if (shift <= 0) return 0;
  return y < n - ws ? 0 : y < n - shift ? 1 : 2;
}

/* The region label of token t of window (i, j) of the part: tokens attend
 * only to tokens of their own label. */
DEV int wa_label(const gpu_swin_attn &z, int64_t i, int64_t j, int t) {
  int64_t u = t / z.ws, v = t % z.ws;
  return 3 * wa_region((z.hn0 + i) * z.ws + u, z.hn_all * z.ws, z.ws, z.shift) +
         wa_region((z.wn0 + j) * z.ws + v, z.wn_all * z.ws, z.ws, z.shift);
}

/* The row of the bias table of query a and key x. */
DEV int64_t wa_rel(int a, int x, int64_t ws) {
  return (a / ws - x / ws + ws - 1) * (2 * ws - 1) + (a % ws - x % ws + ws - 1);
}

/* Lane's scores of query row a (its q at qrow, f32) against the keys x =
 * lane + 32 m (Ks rows of ld), scaled, plus the bias, into prow[x]; masked
 * pairs get -inf. Then prow = softmax of the row; returns nothing. Every
 * lane of the warp calls it. */
template <class T>
DEV void wa_probs(float *prow, const float *qrow, const float *Ks, int ld, const int *Lb, const T *table, int a, int s,
                  int dh, const gpu_swin_attn &z, int64_t hd, float scale) {
  const int lane = threadIdx.x & 31;
  float mx = -INFINITY;
  for (int x = lane; x < s; x += 32) {
    float sc = -INFINITY;
    if (Lb[x] == Lb[a]) {
      float dot = 0.0f;
      for (int d = 0; d < dh; d++) dot += qrow[d] * Ks[x * ld + d];
      sc = dot * scale + to_f(table[wa_rel(a, x, z.ws) * z.heads + hd]);
    }
    prow[x] = sc;
    mx = fmaxf(mx, sc);
  }
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int x = lane; x < s; x += 32) {
    float p = prow[x] == -INFINITY ? 0.0f : fexp(prow[x] - mx);
    prow[x] = p;
    sum += p;
  }
  float inv = 1.0f / warp_sum(sum);
  for (int x = lane; x < s; x += 32) prow[x] *= inv;
}

static int64_t wa_windows(const gpu_swin_attn *z) { return z->b * z->hn * z->wn; }

static size_t wa_fwd_smem(int64_t ws, int64_t dh) {
  int64_t s = ws * ws;
  return (size_t)(2 * s * (dh + 1) + WA_WARPS * dh + WA_WARPS * s + s) * sizeof(float);
}

static size_t wa_bwd_smem(int64_t ws, int64_t dh) {
  int64_t s = ws * ws, r = (2 * ws - 1) * (2 * ws - 1);
  return (size_t)(4 * s * (dh + 1) + s * s + r + s) * sizeof(float);
}

bool gpu_window_attention_takes(int64_t ws, int64_t dh, size_t *need) {
  size_t f = wa_fwd_smem(ws, dh), b = wa_bwd_smem(ws, dh);
  if (need) *need = f > b ? f : b;
  return ws > 0 && dh > 0 && f <= attention_smem_limit() && b <= attention_smem_limit();
}

/* Window blockIdx.x, head blockIdx.y. */
template <class T>
__global__ void __launch_bounds__(WA_THREADS)
    k_window_attn(T *out, const T *qkv, const T *table, gpu_swin_attn z, float scale) {
  DYN_SMEM(float, sm);
  const int s = (int)(z.ws * z.ws), dh = (int)z.dh, ld = dh + 1;
  const int64_t c = z.heads * z.dh, win = blockIdx.x, hd = blockIdx.y;
  const int64_t i = win / z.wn % z.hn, j = win % z.wn;
  float *Ks = sm, *Vs = Ks + s * ld, *Qw = Vs + s * ld, *Pw = Qw + WA_WARPS * dh;
  int *Lb = (int *)(Pw + WA_WARPS * s);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const T *q = qkv + win * s * 3 * c + hd * dh, *k = q + c, *v = q + 2 * c;
  for (int e = threadIdx.x; e < s * dh; e += blockDim.x) {
    int t = e / dh, d = e % dh;
    Ks[t * ld + d] = to_f(k[t * 3 * c + d]);
    Vs[t * ld + d] = to_f(v[t * 3 * c + d]);
  }
  for (int t = threadIdx.x; t < s; t += blockDim.x) Lb[t] = wa_label(z, i, j, t);
  __syncthreads();
  float *qrow = Qw + w * dh, *prow = Pw + w * s;
  for (int a = w; a < s; a += WA_WARPS) {
    for (int d = lane; d < dh; d += 32) qrow[d] = to_f(q[a * 3 * c + d]);
    __syncwarp();
    wa_probs(prow, qrow, Ks, ld, Lb, table, a, s, dh, z, hd, scale);
    __syncwarp();
    T *o = out + (win * s + a) * c + hd * dh;
    for (int d = lane; d < dh; d += 32) {
      float acc = 0.0f;
      for (int x = 0; x < s; x++) acc += prow[x] * Vs[x * ld + d];
      o[d] = from_f<T>(acc);
    }
    __syncwarp();
  }
}

void gpu_window_attention(gpu_stream *s, int dt, void *out, const void *qkv, const void *table,
                          const gpu_swin_attn *z) {
  if (!gpu_window_attention_takes(z->ws, z->dh, NULL) || z->heads <= 0) return;
  size_t sm = wa_fwd_smem(z->ws, z->dh);
  float scale = (float)(1.0 / sqrt((double)z->dh));
  dim3 grid((unsigned)wa_windows(z), (unsigned)z->heads);
  DISPATCH(dt, T, {
    allow_smem(k_window_attn<T>, sm);
    launch(k_window_attn<T>, grid, WA_THREADS, sm, s, (T *)out, (const T *)qkv, (const T *)table, *z, scale);
  });
}

/* Windows per chunk of the backward, and the chunks. */
static int64_t wa_per(const gpu_swin_attn *z) {
  int64_t n = wa_windows(z), most = WA_CHUNKS, chunks = n < most ? n : most;
  return chunks > 0 ? (n + chunks - 1) / chunks : 1;
}

static int64_t wa_chunks(const gpu_swin_attn *z) { return (wa_windows(z) + wa_per(z) - 1) / wa_per(z); }

static int64_t wa_rows(int64_t ws) { return (2 * ws - 1) * (2 * ws - 1); }

size_t gpu_window_attention_backward_ws(const gpu_swin_attn *z) {
  return (size_t)(wa_chunks(z) * wa_rows(z->ws) * z->heads + 1) * sizeof(float);
}

/* Chunk blockIdx.x of windows, head blockIdx.y: dqkv of its windows (when
 * not NULL), and into tparts[chunk][row][head] the chunk's sum of dS per
 * bias row (when not NULL). */
template <class T>
__global__ void __launch_bounds__(WA_THREADS)
    k_window_attn_bwd(T *dqkv, float *tparts, const T *dout, const T *qkv, const T *table, gpu_swin_attn z,
                      float scale, int64_t per, bool acc) {
  DYN_SMEM(float, sm);
  const int s = (int)(z.ws * z.ws), dh = (int)z.dh, ld = dh + 1, ws = (int)z.ws, nr = (2 * ws - 1) * (2 * ws - 1);
  const int64_t c = z.heads * z.dh, hd = blockIdx.y, nw = z.b * z.hn * z.wn;
  float *Ks = sm, *Vs = Ks + s * ld, *Qs = Vs + s * ld, *Os = Qs + s * ld, *Ps = Os + s * ld, *Tb = Ps + s * s;
  int *Lb = (int *)(Tb + nr);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int r = threadIdx.x; r < nr; r += blockDim.x) Tb[r] = 0.0f;
  const int64_t w0 = (int64_t)blockIdx.x * per, w1 = w0 + per < nw ? w0 + per : nw;
  for (int64_t win = w0; win < w1; win++) {
    const int64_t i = win / z.wn % z.hn, j = win % z.wn;
    const T *q = qkv + win * s * 3 * c + hd * dh, *k = q + c, *v = q + 2 * c;
    const T *dO = dout + win * s * c + hd * dh;
    __syncthreads();
    for (int e = threadIdx.x; e < s * dh; e += blockDim.x) {
      int t = e / dh, d = e % dh;
      Qs[t * ld + d] = to_f(q[t * 3 * c + d]);
      Ks[t * ld + d] = to_f(k[t * 3 * c + d]);
      Vs[t * ld + d] = to_f(v[t * 3 * c + d]);
      Os[t * ld + d] = to_f(dO[t * c + d]);
    }
    for (int t = threadIdx.x; t < s; t += blockDim.x) Lb[t] = wa_label(z, i, j, t);
    __syncthreads();
    for (int a = w; a < s; a += WA_WARPS) wa_probs(Ps + a * s, Qs + a * ld, Ks, ld, Lb, table, a, s, dh, z, hd, scale);
    __syncthreads();
    T *dq = dqkv ? dqkv + win * s * 3 * c + hd * dh : NULL, *dk = dq ? dq + c : NULL, *dv = dq ? dq + 2 * c : NULL;
    if (dv)
      for (int e = threadIdx.x; e < s * dh; e += blockDim.x) {
        int x = e / dh, d = e % dh;
        float g = 0.0f;
        for (int a = 0; a < s; a++) g += Ps[a * s + x] * Os[a * ld + d];
        put(&dv[x * 3 * c + d], g, acc);
      }
    __syncthreads();
    /* P becomes dS, a row a warp: dp = dout_a . v_x, D = sum_x P dp */
    for (int a = w; a < s; a += WA_WARPS) {
      float *prow = Ps + a * s, dsum = 0.0f;
      for (int x = lane; x < s; x += 32) {
        float dp = 0.0f;
        if (prow[x] != 0.0f)
          for (int d = 0; d < dh; d++) dp += Os[a * ld + d] * Vs[x * ld + d];
        dsum += prow[x] * dp;
      }
      dsum = warp_sum(dsum);
      for (int x = lane; x < s; x += 32) {
        float dp = 0.0f;
        if (prow[x] != 0.0f)
          for (int d = 0; d < dh; d++) dp += Os[a * ld + d] * Vs[x * ld + d];
        prow[x] = prow[x] * (dp - dsum);
      }
    }
    __syncthreads();
    if (dq)
      for (int e = threadIdx.x; e < s * dh; e += blockDim.x) {
        int t = e / dh, d = e % dh;
        float gq = 0.0f, gk = 0.0f;
        for (int x = 0; x < s; x++) {
          gq += Ps[t * s + x] * Ks[x * ld + d];
          gk += Ps[x * s + t] * Qs[x * ld + d];
        }
        put(&dq[t * 3 * c + d], gq * scale, acc);
        put(&dk[t * 3 * c + d], gk * scale, acc);
      }
    /* bias row r: the pairs whose offset is (du, dv), in the order of their query */
    if (tparts)
      for (int r = threadIdx.x; r < nr; r += blockDim.x) {
        int du = r / (2 * ws - 1) - (ws - 1), dvv = r % (2 * ws - 1) - (ws - 1);
        float g = 0.0f;
        for (int ua = du > 0 ? du : 0; ua < (du < 0 ? ws + du : ws); ua++)
          for (int va = dvv > 0 ? dvv : 0; va < (dvv < 0 ? ws + dvv : ws); va++)
            g += Ps[(ua * ws + va) * s + (ua - du) * ws + (va - dvv)];
        Tb[r] += g;
      }
  }
  if (tparts)
    for (int r = threadIdx.x; r < nr; r += blockDim.x) tparts[((int64_t)blockIdx.x * nr + r) * z.heads + hd] = Tb[r];
}

void gpu_window_attention_backward(gpu_stream *s, int dt, void *dqkv, void *dtable, int table_dt, const void *dout,
                                   const void *qkv, const void *table, const gpu_swin_attn *z, bool acc, void *ws) {
  if ((!dqkv && !dtable) || !gpu_window_attention_takes(z->ws, z->dh, NULL) || z->heads <= 0) return;
  size_t sm = wa_bwd_smem(z->ws, z->dh);
  float scale = (float)(1.0 / sqrt((double)z->dh));
  int64_t per = wa_per(z), chunks = wa_chunks(z), h = wa_rows(z->ws) * z->heads;
  float *tparts = dtable ? (float *)ws : NULL;
  DISPATCH(dt, T, {
    allow_smem(k_window_attn_bwd<T>, sm);
    launch(k_window_attn_bwd<T>, dim3((unsigned)chunks, (unsigned)z->heads), WA_THREADS, sm, s, (T *)dqkv, tparts,
           (const T *)dout, (const T *)qkv, (const T *)table, *z, scale, per, acc);
  });
  if (!dtable) return;
  if (wa_windows(z) == 0) {
    if (!acc) gpu_zero(dtable, (size_t)h * gpu_dtype_size(table_dt), s);
    return;
  }
  DISPATCH(table_dt, T, chunks_done<T>(s, (T *)dtable, tparts, (T *)NULL, (const float *)NULL, chunks, h, acc));
}
