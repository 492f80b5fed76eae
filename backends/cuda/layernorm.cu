/* layernorm.cu - LayerNorm over the last dimension, forward and backward.
 * CPU reference: k_layernorm and k_layernorm_backward in
 * backends/cpu/kernels.c (statistics there in double, here in f32 with two
 * passes over the row).
 *
 * One warp per row. The backward recomputes each row's statistics (the
 * forward keeps nothing).
 *
 * Rows of 16-bit or f32 elements whose width is a multiple of 16 bytes,
 * at most 256 such chunks, at addresses on 16 bytes (the GPT's), take
 * kernels that read a row once, in 16-byte chunks, into registers: the
 * forward, and a backward that writes dx and adds dy * xhat and dy of its
 * warp's rows into per-lane sums; a block's warps add theirs in order in
 * shared memory and write one row of partial sums, which k_chunks_done
 * (common.cuh) adds over the blocks in order. Other rows take the first
 * kernels: the backward writes dx and the statistics, then column sums
 * over chunks of rows read dy and x again. WEFT_LN_KERNEL=old takes the
 * first kernels everywhere (to time both). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

enum { LN_WARPS = ROW_WARPS };

/* ---- rows in 16-byte chunks ------------------------------------------------------------ */

/* WEFT_LN_KERNEL=old: the first kernels for every row (read at each call,
 * so that bench_kernels times both in one process). */
static bool ln_old(void) {
  const char *e = getenv("WEFT_LN_KERNEL");
  return e && strcmp(e, "old") == 0;
}

/* Chunks a lane takes (1, 2, 3, 4, 6 or 8: the kernels built; GPT-2's
 * rows of 768 and 1024 16-bit elements are 3 and 4): 0 when the rows do
 * not go in chunks. */
static int ln_chunks(int64_t h, int dt, const void *const *ptrs, int n) {
  int64_t e = 16 / (int64_t)gpu_dtype_size(dt), c = h / e;
  if (ln_old() || h % e || c > 32 * 8) return 0;
  for (int i = 0; i < n; i++)
    if (ptrs[i] && ((uintptr_t)ptrs[i] & 15)) return 0;
  int64_t per = (c + 31) / 32;
  return per <= 4 ? (int)per : per <= 6 ? 6 : 8;
}

/* A row's mean and 1 / sqrt(var + eps) from its chunks in a lane's
 * registers (chunk lane + 32 v, those below nc). */
template <class T, int V>
DEV void ln_stats(const pack16<T> (&x)[V], int nc, int64_t h, float eps, float &mean, float &rstd) {
  enum { E = pack16<T>::E };
  const int lane = threadIdx.x & 31;
  float sum = 0.0f;
#pragma unroll
  for (int v = 0; v < V; v++)
    if (lane + 32 * v < nc)
#pragma unroll
      for (int i = 0; i < E; i++) sum += to_f(x[v].e[i]);
  mean = warp_sum(sum) / (float)h;
  float var = 0.0f;
#pragma unroll
  for (int v = 0; v < V; v++)
    if (lane + 32 * v < nc)
#pragma unroll
      for (int i = 0; i < E; i++) {
        float d = to_f(x[v].e[i]) - mean;
        var += d * d;
      }
  rstd = 1.0f / sqrtf(warp_sum(var) / (float)h + eps);
}

template <class T, int V>
__global__ void k_layernorm_vec(T *y, const T *x, const T *w, const T *b, int64_t rows, int64_t h, float eps) {
  enum { E = pack16<T>::E };
  int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31, nc = (int)(h / E);
  pack16<T> xr[V];
#pragma unroll
  for (int v = 0; v < V; v++)
    if (lane + 32 * v < nc) xr[v] = ld16(x + row * h + (lane + 32 * v) * E);
  float mean, rstd;
  ln_stats<T, V>(xr, nc, h, eps, mean, rstd);
#pragma unroll
  for (int v = 0; v < V; v++) {
    const int c = lane + 32 * v;
    if (c >= nc) continue;
    const pack16<T> wv = ld16(w + c * E), bv = ld16(b + c * E);
    pack16<T> o;
#pragma unroll
    for (int i = 0; i < E; i++)
      o.e[i] = from_f<T>((to_f(xr[v].e[i]) - mean) * rstd * to_f(wv.e[i]) + to_f(bv.e[i]));
    st16(y + row * h + c * E, o);
  }
}

/* Rows a warp of the chunked backward takes: at least 4, and at most 1024
 * blocks of partial sums. */
static int64_t ln_warp_rows(int64_t rows) {
  int64_t r = (rows + (int64_t)LN_WARPS * 1024 - 1) / ((int64_t)LN_WARPS * 1024);
  return r < 4 ? 4 : r;
}
static int64_t ln_blocks(int64_t rows) {
  int64_t per = ln_warp_rows(rows) * LN_WARPS;
  return (rows + per - 1) / per;
}

/* dx (added to where acc_dx; none where NULL) of the warp's rows, and the
 * block's row of partial sums of dy * xhat (pw) and dy (pb) where pw is
 * not NULL; shared memory: 2 h floats. */
template <class T, int V>
__global__ void __launch_bounds__(ROW_THREADS, V <= 4 ? 2 : 1) k_layernorm_back_vec(T *dx, float *pw, float *pb, const T *dy, const T *x, const T *w, int64_t rows,
                                     int64_t h, int64_t per, float eps, bool acc_dx) {
  enum { E = pack16<T>::E };
  DYN_SMEM(float, red);
  const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, nw = blockDim.x >> 5, nc = (int)(h / E);
  const int64_t lo = ((int64_t)blockIdx.x * nw + wi) * per, hi = lo + per < rows ? lo + per : rows;
  /* (the weight is read again for each row, from the cache, which leaves
   * its registers to the sums) */
  float sw[V][E], sb[V][E];
#pragma unroll
  for (int v = 0; v < V; v++)
#pragma unroll
    for (int i = 0; i < E; i++) sw[v][i] = sb[v][i] = 0.0f;
  for (int64_t row = lo; row < hi; row++) {
    pack16<T> xr[V], dr[V];
#pragma unroll
    for (int v = 0; v < V; v++)
      if (lane + 32 * v < nc) {
        xr[v] = ld16(x + row * h + (lane + 32 * v) * E);
        dr[v] = ld16(dy + row * h + (lane + 32 * v) * E);
      }
    float mean, rstd;
    ln_stats<T, V>(xr, nc, h, eps, mean, rstd);
    float sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int v = 0; v < V; v++)
      if (lane + 32 * v < nc) {
        const pack16<T> wv = ld16(w + (lane + 32 * v) * E);
#pragma unroll
        for (int i = 0; i < E; i++) {
          const float xhat = (to_f(xr[v].e[i]) - mean) * rstd, d = to_f(dr[v].e[i]), g = d * to_f(wv.e[i]);
          sg += g, sgx += g * xhat;
          sw[v][i] += d * xhat, sb[v][i] += d;
        }
      }
    if (!dx) continue;
    const float mg = warp_sum(sg) / (float)h, mgx = warp_sum(sgx) / (float)h;
#pragma unroll
    for (int v = 0; v < V; v++) {
      const int c = lane + 32 * v;
      if (c >= nc) continue;
      T *at = dx + row * h + c * E;
      const pack16<T> wv = ld16(w + c * E);
      pack16<T> o;
      if (acc_dx) o = ld16(at);
#pragma unroll
      for (int i = 0; i < E; i++) {
        const float xhat = (to_f(xr[v].e[i]) - mean) * rstd, g = to_f(dr[v].e[i]) * to_f(wv.e[i]);
        const float r = rstd * (g - mg - xhat * mgx);
        o.e[i] = from_f<T>(acc_dx ? to_f(o.e[i]) + r : r);
      }
      st16(at, o);
    }
  }
  if (!pw) return;
  /* the warps' sums into shared memory, warp 0 first, then the block's row */
  for (int k = 0; k < nw; k++) {
    if (wi == k)
#pragma unroll
      for (int v = 0; v < V; v++) {
        const int c = lane + 32 * v;
        if (c >= nc) continue;
#pragma unroll
        for (int i = 0; i < E; i++) {
          float *rw = red + c * E + i, *rb = rw + h;
          *rw = k ? *rw + sw[v][i] : sw[v][i];
          *rb = k ? *rb + sb[v][i] : sb[v][i];
        }
      }
    __syncthreads();
  }
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    pw[blockIdx.x * h + j] = red[j];
    pb[blockIdx.x * h + j] = red[h + j];
  }
}

template <class T, int V>
static void ln_back_vec(gpu_stream *s, T *dx, float *pw, float *pb, const T *dy, const T *x, const T *w, int64_t rows,
                        int64_t h, float eps, bool acc_dx) {
  launch(k_layernorm_back_vec<T, V>, (unsigned)ln_blocks(rows), 32 * LN_WARPS, 2 * (size_t)h * sizeof(float), s, dx,
         pw, pb, dy, x, w, rows, h, ln_warp_rows(rows), eps, acc_dx);
}

/* ---- rows one element a lane ----------------------------------------------------------- */

template <class T>
DEV void row_stats(const T *xr, int64_t h, float eps, float &mean, float &rstd) {
  int lane = threadIdx.x & 31;
  float sum = 0.0f;
  for (int64_t j = lane; j < h; j += 32) sum += to_f(xr[j]);
  mean = warp_sum(sum) / (float)h;
  float var = 0.0f;
  for (int64_t j = lane; j < h; j += 32) {
    float d = to_f(xr[j]) - mean;
    var += d * d;
  }
  rstd = 1.0f / sqrtf(warp_sum(var) / (float)h + eps);
}

template <class T>
__global__ void k_layernorm(T *y, const T *x, const T *w, const T *b, int64_t rows, int64_t h, float eps) {
  int64_t row = (int64_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T *xr = x + row * h;
  T *yr = y + row * h;
  float mean, rstd;
  row_stats(xr, h, eps, mean, rstd);
  for (int64_t j = threadIdx.x & 31; j < h; j += 32)
    yr[j] = from_f<T>((to_f(xr[j]) - mean) * rstd * to_f(w[j]) + to_f(b[j]));
}

void gpu_layernorm(gpu_stream *s, int dt, void *y, const void *x, const void *w, const void *b, int64_t rows,
                   int64_t h, double eps) {
  const void *ptrs[4] = {y, x, w, b};
  const unsigned grid = (unsigned)((rows + LN_WARPS - 1) / LN_WARPS);
  switch (ln_chunks(h, dt, ptrs, 4)) {
#define LN_FWD(V)                                                                                                   \
  case V:                                                                                                           \
    DISPATCH(dt, T, launch(k_layernorm_vec<T, V>, grid, 32 * LN_WARPS, 0, s, (T *)y, (const T *)x, (const T *)w,     \
                           (const T *)b, rows, h, (float)eps));                                                      \
    return;
    LN_FWD(1) LN_FWD(2) LN_FWD(3) LN_FWD(4) LN_FWD(6) LN_FWD(8)
#undef LN_FWD
  default: break;
  }
  DISPATCH(dt, T, launch(k_layernorm<T>, grid, 32 * LN_WARPS, 0, s, (T *)y, (const T *)x, (const T *)w, (const T *)b,
                         rows, h, (float)eps));
}

/* Rows per chunk of the column sums: at most 128 chunks of at least 64 rows. */
static int64_t chunk_rows(int64_t rows) {
  int64_t r = (rows + 127) / 128;
  return r < 64 ? 64 : r;
}

static int64_t chunks_of(int64_t rows) { return rows > 0 ? (rows + chunk_rows(rows) - 1) / chunk_rows(rows) : 0; }

size_t gpu_layernorm_backward_ws(int64_t rows, int64_t h) {
  /* the first kernels' statistics and chunks, or the blocks' partial sums */
  int64_t first = 2 * rows + 2 * chunks_of(rows) * h, vec = 2 * ln_blocks(rows) * h;
  return (size_t)((first > vec ? first : vec) + 1) * sizeof(float);
}

template <class T>
__global__ void k_layernorm_dx(T *dx, float *stats, const T *dy, const T *x, const T *w, int64_t rows, int64_t h,
                               float eps, bool acc) {
  int64_t row = (int64_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
  if (row >= rows) return;
  int lane = threadIdx.x & 31;
  const T *xr = x + row * h, *dyr = dy + row * h;
  float mean, rstd;
  row_stats(xr, h, eps, mean, rstd);
  if (lane == 0) stats[row] = mean, stats[rows + row] = rstd;
  if (!dx) return;
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t j = lane; j < h; j += 32) {
    float xhat = (to_f(xr[j]) - mean) * rstd, g = to_f(dyr[j]) * to_f(w[j]);
    sg += g;
    sgx += g * xhat;
  }
  float mg = warp_sum(sg) / (float)h, mgx = warp_sum(sgx) / (float)h;
  for (int64_t j = lane; j < h; j += 32) {
    float xhat = (to_f(xr[j]) - mean) * rstd, g = to_f(dyr[j]) * to_f(w[j]);
    put(&dx[row * h + j], rstd * (g - mg - xhat * mgx), acc);
  }
}

/* pw[c][j], pb[c][j]: sums over chunk c of dy * xhat and dy in column j. */
template <class T>
__global__ void k_layernorm_parts(float *pw, float *pb, const float *stats, const T *dy, const T *x, int64_t rows,
                                  int64_t h, int64_t per) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y;
  if (j >= h) return;
  int64_t lo = c * per, hi = lo + per < rows ? lo + per : rows;
  float sw = 0.0f, sb = 0.0f;
  for (int64_t i = lo; i < hi; i++) {
    float d = to_f(dy[i * h + j]);
    sw += d * (to_f(x[i * h + j]) - stats[i]) * stats[rows + i];
    sb += d;
  }
  pw[c * h + j] = sw;
  if (pb) pb[c * h + j] = sb;
}

void gpu_layernorm_backward(gpu_stream *s, int dt, void *dx, void *dw, void *db, int gdt, const void *dy,
                            const void *x, const void *w, int64_t rows, int64_t h, double eps, bool acc_dx, bool acc,
                            void *ws) {
  const void *ptrs[4] = {dx, dy, x, w};
  if (int v = ln_chunks(h, dt, ptrs, 4)) {
    const int64_t blocks = ln_blocks(rows);
    float *pw = dw || db ? (float *)ws : NULL, *pb = pw ? pw + blocks * h : NULL;
#define LN_BACK(V)                                                                                                  \
  case V:                                                                                                           \
    ln_back_vec<T, V>(s, (T *)dx, pw, pb, (const T *)dy, (const T *)x, (const T *)w, rows, h, (float)eps, acc_dx);  \
    break;
    DISPATCH(dt, T, {
      switch (v) { LN_BACK(1) LN_BACK(2) LN_BACK(3) LN_BACK(4) LN_BACK(6) LN_BACK(8) default: break; }
      if (pw) {
        if (gdt == GPU_F32) chunks_done<float>(s, (float *)dw, pw, (float *)db, pb, blocks, h, acc);
        else chunks_done<T>(s, (T *)dw, pw, (T *)db, pb, blocks, h, acc);
      }
    });
#undef LN_BACK
    return;
  }
  float *stats = (float *)ws, *pw = stats + 2 * rows;
  int64_t chunks = chunks_of(rows), per = chunk_rows(rows);
  float *pb = pw + chunks * h;
  DISPATCH(dt, T, {
    launch(k_layernorm_dx<T>, (unsigned)((rows + LN_WARPS - 1) / LN_WARPS), 32 * LN_WARPS, 0, s, (T *)dx, stats,
           (const T *)dy, (const T *)x, (const T *)w, rows, h, (float)eps, acc_dx);
    if (dw || db) {
      launch(k_layernorm_parts<T>, dim3((unsigned)((h + 255) / 256), (unsigned)chunks), 256, 0, s, pw, pb,
             (const float *)stats, (const T *)dy, (const T *)x, rows, h, per);
      /* the weight's and bias's gradients in f32 where they are kept so */
      if (gdt == GPU_F32) chunks_done<float>(s, (float *)dw, pw, (float *)db, pb, chunks, h, acc);
      else chunks_done<T>(s, (T *)dw, pw, (T *)db, pb, chunks, h, acc);
    }
  });
}
