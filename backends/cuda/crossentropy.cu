/* crossentropy.cu - the losses: cross entropy (whole, or over a vocabulary
 * split in shards whose statistics the program gathers) and the mean
 * squared error, forward and backward. CPU reference: k_cross_entropy*,
 * k_mse and k_mse_backward in backends/cpu/kernels.c.
 *
 * A loss is a sum over rows: each row's term goes to the workspace, and
 * one block adds them in double, always in the same order. The backward of
 * cross entropy is one kernel: a row's maximum and sum in one pass, then
 * softmax minus the label written in the next. */
#include "common.cuh"

enum { CE_THREADS = ROW_THREADS, SUM_BLOCKS = 4 * ROW_WARPS * ROW_WARPS };

size_t gpu_loss_ws(int64_t rows) {
  size_t a = (size_t)rows * sizeof(float), b = SUM_BLOCKS * sizeof(double);
  return (a > b ? a : b) + 64;
}

/* *slot = scale * the sum of the n terms; out (+)= the same. */
template <class T, class V>
__global__ void k_loss_sum(double *slot, T *out, const V *terms, int64_t n, double scale, bool acc) {
  __shared__ double sh[32];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += (double)terms[i];
  sum = block_sum_d(sum, sh);
  sum = scale == 0.0 ? 0.0 : sum * scale;
  if (threadIdx.x == 0) {
    if (slot) *slot = sum;
    if (out) put(out, (float)sum, acc);
  }
}

template <class T>
DEV void row_stats(const T *row, int64_t v, float &m, float &s, float *sh) {
  m = -INFINITY, s = 0.0f;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) softmax_merge(m, s, to_f(row[j]), 1.0f);
  block_softmax_stats(m, s, sh);
}

/* terms[i] = log(sum) + max - logit of the label. */
template <class T>
__global__ void k_ce_rows(float *terms, const T *logits, const int32_t *labels, int64_t v) {
  __shared__ float sh[64];
  int64_t i = blockIdx.x;
  const T *row = logits + i * v;
  float m, s;
  row_stats(row, v, m, s, sh);
  if (threadIdx.x == 0) terms[i] = logf(s) + m - to_f(row[labels[i]]);
}

void gpu_cross_entropy(gpu_stream *s, int dt, double *slot, void *out, const void *logits, const int32_t *labels,
                       int64_t t, int64_t v, int64_t t_total, bool acc, void *ws) {
  float *terms = (float *)ws;
  DISPATCH(dt, T, {
    launch(k_ce_rows<T>, (unsigned)t, CE_THREADS, 0, s, terms, (const T *)logits, labels, v);
    launch(k_loss_sum<T, float>, 1, CE_THREADS, 0, s, slot, (T *)out, (const float *)terms, t, 1.0 / (double)t_total,
           acc);
  });
}

template <class T>
__global__ void k_ce_backward(T *dlogits, const T *logits, const int32_t *labels, int64_t v, float scale, bool acc) {
  __shared__ float sh[64];
  int64_t i = blockIdx.x;
  const T *row = logits + i * v;
  T *drow = dlogits + i * v;
  float m, s;
  row_stats(row, v, m, s, sh);
  int64_t label = labels[i];
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
    float p = fexp(to_f(row[j]) - m) / s - (j == label ? 1.0f : 0.0f);
    put(&drow[j], p * scale, acc);
  }
}

void gpu_cross_entropy_backward(gpu_stream *s, int dt, void *dlogits, const void *logits, const int32_t *labels,
                                int64_t t, int64_t v, int64_t t_total, bool acc) {
  if (!dlogits) return;
  DISPATCH(dt, T, launch(k_ce_backward<T>, (unsigned)t, CE_THREADS, 0, s, (T *)dlogits, (const T *)logits, labels, v,
                         (float)(1.0 / (double)t_total), acc));
}

/* ---- a vocabulary split ---------------------------------------------------------------- */

template <class T>
__global__ void k_ce_stats(float *stats, const T *logits, const int32_t *labels, int64_t v_lo, int64_t v_local) {
  __shared__ float sh[64];
  int64_t i = blockIdx.x;
  const T *row = logits + i * v_local;
  float m, s;
  row_stats(row, v_local, m, s, sh);
  if (threadIdx.x == 0) {
    int64_t label = (int64_t)labels[i] - v_lo;
    stats[3 * i] = m;
    stats[3 * i + 1] = s;
    stats[3 * i + 2] = label >= 0 && label < v_local ? to_f(row[label]) : 0.0f;
  }
}

void gpu_cross_entropy_stats(gpu_stream *s, int dt, float *stats, const void *logits, const int32_t *labels, int64_t t,
                             int64_t v_lo, int64_t v_local) {
  DISPATCH(dt, T, launch(k_ce_stats<T>, (unsigned)t, CE_THREADS, 0, s, stats, (const T *)logits, labels, v_lo, v_local));
}

/* Row i's maximum, sum and label logit over every shard, from
 * stats[i][shard][3] (as k_cross_entropy_merge). */
DEV void merge_row(const float *stats, int nshards, int64_t i, float &mx, float &sum, float &tgt) {
  const float *st = stats + i * 3 * nshards;
  mx = -INFINITY;
  for (int p = 0; p < nshards; p++) mx = fmaxf(mx, st[3 * p]);
  sum = 0.0f, tgt = 0.0f;
  for (int p = 0; p < nshards; p++) {
    if (st[3 * p + 1] > 0) sum += st[3 * p + 1] * fexp(st[3 * p] - mx);
    tgt += st[3 * p + 2];
  }
}

__global__ void k_ce_combine_rows(float *terms, const float *stats, int nshards, int64_t t) {
  GRID_STRIDE(i, t) {
    float mx, sum, tgt;
    merge_row(stats, nshards, i, mx, sum, tgt);
    terms[i] = logf(sum) + mx - tgt;
  }
}

void gpu_cross_entropy_combine(gpu_stream *s, int dt, double *slot, void *out, const float *stats, int nshards,
                               int64_t t, int64_t t_total, bool first, bool acc, void *ws) {
  float *terms = (float *)ws;
  launch(k_ce_combine_rows, blocks_for(t, 256), 256, 0, s, terms, stats, nshards, t);
  /* every shard holds its rows' whole loss: the first adds it, the others 0 */
  double scale = first ? 1.0 / (double)t_total : 0.0;
  DISPATCH(dt, T, launch(k_loss_sum<T, float>, 1, CE_THREADS, 0, s, slot, (T *)out, (const float *)terms, t, scale, acc));
}

template <class T>
__global__ void k_ce_shard_backward(T *dlogits, const T *logits, const int32_t *labels, const float *stats,
                                    int nshards, int64_t v_lo, int64_t v_local, float scale, bool acc) {
  int64_t i = blockIdx.x;
  float mx, sum, tgt;
  merge_row(stats, nshards, i, mx, sum, tgt);
  int64_t label = (int64_t)labels[i] - v_lo;
  const T *row = logits + i * v_local;
  T *drow = dlogits + i * v_local;
  for (int64_t j = threadIdx.x; j < v_local; j += blockDim.x) {
    float p = fexp(to_f(row[j]) - mx) / sum - (j == label ? 1.0f : 0.0f);
    put(&drow[j], p * scale, acc);
  }
}

void gpu_cross_entropy_shard_backward(gpu_stream *s, int dt, void *dlogits, const void *logits, const int32_t *labels,
                                      const float *stats, int nshards, int64_t t, int64_t v_lo, int64_t v_local,
                                      int64_t t_total, bool acc) {
  if (!dlogits) return;
  DISPATCH(dt, T, launch(k_ce_shard_backward<T>, (unsigned)t, CE_THREADS, 0, s, (T *)dlogits, (const T *)logits, labels,
                         stats, nshards, v_lo, v_local, (float)(1.0 / (double)t_total), acc));
}

/* ---- mean squared error -------------------------------------------------------------------- */

template <class T>
__global__ void k_mse_parts(double *parts, const T *a, const T *b, int64_t n) {
  __shared__ double sh[32];
  double sum = 0.0;
  GRID_STRIDE(i, n) {
    double d = (double)to_f(a[i]) - (double)to_f(b[i]);
    sum += d * d;
  }
  sum = block_sum_d(sum, sh);
  if (threadIdx.x == 0) parts[blockIdx.x] = sum;
}

void gpu_mse(gpu_stream *s, int dt, double *slot, void *out, const void *a, const void *b, int64_t n, int64_t n_total,
             bool acc, void *ws) {
  double *parts = (double *)ws;
  DISPATCH(dt, T, {
    launch(k_mse_parts<T>, SUM_BLOCKS, ROW_THREADS, 0, s, parts, (const T *)a, (const T *)b, n);
    launch(k_loss_sum<T, double>, 1, ROW_THREADS, 0, s, slot, (T *)out, (const double *)parts, (int64_t)SUM_BLOCKS,
           1.0 / (double)n_total, acc);
  });
}

template <class T>
__global__ void k_mse_backward(T *da, T *db, const T *a, const T *b, int64_t n, double scale, bool acc) {
  GRID_STRIDE(i, n) {
    float g = (float)(((double)to_f(a[i]) - (double)to_f(b[i])) * scale);
    if (da) put(&da[i], g, acc);
    if (db) put(&db[i], -g, acc);
  }
}

void gpu_mse_backward(gpu_stream *s, int dt, void *da, void *db, const void *a, const void *b, int64_t n,
                      int64_t n_total, bool acc) {
  if (!da && !db) return;
  DISPATCH(dt, T, launch(k_mse_backward<T>, blocks_for(n, 256), 256, 0, s, (T *)da, (T *)db, (const T *)a,
                         (const T *)b, n, 2.0 / (double)n_total, acc));
}
