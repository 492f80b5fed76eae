/* crossentropy.cu - the losses: cross entropy (whole, or over a vocabulary
 * split in shards whose statistics the program gathers) and the mean
 * squared error, forward and backward. CPU reference: k_cross_entropy*,
 * k_mse and k_mse_backward in backends/cpu/kernels.c.
 *
 * A loss is a sum over rows: each row's term goes to the workspace, and
 * one block adds them in double, always in the same order. The backward of
 * cross entropy is one kernel: a row's maximum and sum in one pass, then
 * softmax minus the label written in the next.
 *
 * A block takes a row, read in 16-byte chunks (see "rows in chunks"
 * below); the first kernels, an element at a time, stay for comparison
 * (WEFT_CE_KERNEL=old). */
#include <stdio.h>
#include <stdlib.h>

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
__global__ void k_ce_rows(float *terms, const T *logits, const int32_t *labels, int64_t v, int64_t ld) {
  __shared__ float sh[64];
  int64_t i = blockIdx.x;
  const T *row = logits + i * ld;
  float m, s;
  row_stats(row, v, m, s, sh);
  if (threadIdx.x == 0) terms[i] = logf(s) + m - to_f(row[labels[i]]);
}

/* ---- rows in chunks --------------------------------------------------------------------- */

/* A row is cut at its 16-byte boundaries: a head and a tail of single
 * elements (fewer than 16 bytes each), and between them chunks of 16
 * bytes, each read with one aligned load. Rows need not be aligned (a
 * vocabulary of 50257 is not). A thread of the row's block takes the
 * chunks t, t + nt, ...: the first CE_HOLD of them stay in registers
 * between the row's statistics and its gradient, the rest (long rows
 * only) are read again. Each thread keeps a running maximum and sum: a
 * chunk's maximum first, so that each element costs one exp. The sums'
 * order depends only on v and the block's size: the same bits every run. */
enum { CE_HOLD = 8 };
#ifdef WEFT_CUDA_EMU
enum { CE_MAX_THREADS = 64 };
#else
enum { CE_MAX_THREADS = 1024 };
#endif

#ifdef WEFT_CUDA_EMU
struct alignas(16) ce16 {
  uint32_t x, y, z, w;
};
static inline void ce_aligned(const void *p) {
  if ((uintptr_t)p & 15) {
    fprintf(stderr, "crossentropy: a 16-byte access at %p, not aligned\n", p);
    abort();
  }
}
static inline ce16 ce_ld(const char *p) {
  ce_aligned(p);
  ce16 c;
  memcpy(&c, p, 16);
  return c;
}
static inline void ce_st(char *p, ce16 c) {
  ce_aligned(p);
  memcpy(p, &c, 16);
}
#else
typedef uint4 ce16;
DEV ce16 ce_ld(const char *p) { return *(const uint4 *)p; }
DEV void ce_st(char *p, ce16 c) { *(uint4 *)p = c; }
#endif

/* Element u of a chunk of T as f32, and its bits from an f32 (rounded). */
DEV uint32_t ce_word(const ce16 &c, int i) { return i == 0 ? c.x : i == 1 ? c.y : i == 2 ? c.z : c.w; }
#ifdef WEFT_CUDA_EMU
template <class T> static inline float ce_from_bits(uint32_t b) {
  T h;
  h.x = (uint16_t)b;
  return to_f(h);
}
template <> inline float ce_from_bits<float>(uint32_t b) { return emu_float(b); }
template <class T> static inline uint32_t ce_to_bits(float v) { return from_f<T>(v).x; }
template <> inline uint32_t ce_to_bits<float>(float v) { return emu_bits(v); }
#else
template <class T> DEV float ce_from_bits(uint32_t b);
template <> DEV float ce_from_bits<float>(uint32_t b) { return __uint_as_float(b); }
template <> DEV float ce_from_bits<bf16>(uint32_t b) {
  return __bfloat162float(__ushort_as_bfloat16((unsigned short)b));
}
template <> DEV float ce_from_bits<f16>(uint32_t b) { return __half2float(__ushort_as_half((unsigned short)b)); }
template <class T> DEV uint32_t ce_to_bits(float v);
template <> DEV uint32_t ce_to_bits<float>(float v) { return __float_as_uint(v); }
template <> DEV uint32_t ce_to_bits<bf16>(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
template <> DEV uint32_t ce_to_bits<f16>(float v) { return __half_as_ushort(__float2half_rn(v)); }
#endif
template <class T> DEV float ce_get(const ce16 &c, int u) {
  if (sizeof(T) == 4) return ce_from_bits<T>(ce_word(c, u));
  uint32_t w = ce_word(c, u >> 1);
  return ce_from_bits<T>((u & 1) ? w >> 16 : w & 0xffffu);
}

struct ce_row {
  int head, nb, tail; /* elements before the first chunk, chunks, elements after the last */
};

template <class T> DEV ce_row ce_layout(const T *row, int v) {
  const int E = 16 / (int)sizeof(T);
  ce_row r;
  r.head = (int)(((16 - ((uintptr_t)row & 15)) & 15) / sizeof(T));
  if (r.head > v) r.head = v;
  r.nb = (v - r.head) / E;
  r.tail = v - r.head - r.nb * E;
  return r;
}

/* The index of the row's e-th single element (head, then tail). */
template <class T> DEV int ce_single(ce_row r, int e) {
  return e < r.head ? e : r.head + r.nb * (16 / (int)sizeof(T)) + (e - r.head);
}

/* Threads for rows of v elements of T: enough that a thread holds at most
 * CE_HOLD chunks, a power of two from 32 to `most`, or to WEFT_CE_THREADS
 * when that is lower (a tuning knob: fewer threads a row, more rows at once
 * on a multiprocessor, more chunks read twice). The kernels that only read
 * take at most CE_READ_THREADS: on an H100, rows of 50257 bf16 logits go
 * fastest with 128 to 256 threads for the loss (nothing held for a second
 * pass) and 1024 for the gradient (every chunk held). */
#ifdef WEFT_CUDA_EMU
enum { CE_READ_THREADS = 64 };
#else
enum { CE_READ_THREADS = 256 };
#endif
static unsigned ce_threads(int64_t v, size_t size, unsigned most) {
  static const unsigned cap = [] {
    const char *e = getenv("WEFT_CE_THREADS");
    long c = e ? strtol(e, NULL, 10) : 0;
    return c >= 32 && c < CE_MAX_THREADS ? (unsigned)c : (unsigned)CE_MAX_THREADS;
  }();
  if (most > cap) most = cap;
  int64_t chunks = (v * (int64_t)size) / 16 + 1;
  unsigned nt = 32;
  while (2 * nt <= most && (int64_t)nt * CE_HOLD < chunks) nt *= 2;
  return nt;
}

/* The running (m, s) with a chunk's elements: its maximum, then one exp
 * each. */
template <class T> DEV void ce_merge16(ce16 c, float &m, float &s) {
  const int E = 16 / (int)sizeof(T);
  float x[E], cm = -INFINITY;
#pragma unroll
  for (int u = 0; u < E; u++) x[u] = ce_get<T>(c, u), cm = fmaxf(cm, x[u]);
  if (cm > m) {
    s = m == -INFINITY ? 0.0f : s * fexp(m - cm);
    m = cm;
  }
  if (m == -INFINITY) return;
  float add = 0.0f;
#pragma unroll
  for (int u = 0; u < E; u++) add += fexp(x[u] - m);
  s += add;
}

/* The row's maximum m and sum s of exp(x - m), on every thread; held gets
 * the thread's first CE_HOLD chunks. sh holds 64 values. */
template <class T> DEV void ce_stats(const T *row, ce_row r, ce16 (&held)[CE_HOLD], float &m, float &s, float *sh) {
  int t = threadIdx.x, nt = blockDim.x;
  const char *body = (const char *)(row + r.head);
  m = -INFINITY, s = 0.0f;
  if (t < r.head + r.tail) {
    float x = to_f(row[ce_single<T>(r, t)]);
    if (x > -INFINITY) m = x, s = 1.0f;
  }
#pragma unroll
  for (int k = 0; k < CE_HOLD; k++) {
    int c = t + k * nt;
    if (c < r.nb) held[k] = ce_ld(body + 16 * c);
  }
#pragma unroll
  for (int k = 0; k < CE_HOLD; k++) {
    int c = t + k * nt;
    if (c < r.nb) ce_merge16<T>(held[k], m, s);
  }
  for (int c = t + CE_HOLD * nt; c < r.nb; c += 2 * nt) {
    ce16 a = ce_ld(body + 16 * c), b = a;
    bool two = c + nt < r.nb;
    if (two) b = ce_ld(body + 16 * (c + nt));
    ce_merge16<T>(a, m, s);
    if (two) ce_merge16<T>(b, m, s);
  }
  block_softmax_stats(m, s, sh);
}

/* dst's chunk (element j0 on) (+)= (exp(x - m) * inv - [j == label]) * scale. */
template <class T>
DEV void ce_grad16(char *dst, ce16 c, int j0, float m, float inv, int label, float scale, bool acc) {
  const int E = 16 / (int)sizeof(T), PER = 4 / (int)sizeof(T);
  ce16 old = c;
  if (acc) old = ce_ld(dst);
  uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
  for (int u = 0; u < E; u++) {
    float p = (fexp(ce_get<T>(c, u) - m) * inv - (j0 + u == label ? 1.0f : 0.0f)) * scale;
    if (acc) p += ce_get<T>(old, u);
    w[u / PER] |= ce_to_bits<T>(p) << (32 / PER) * (u % PER);
  }
  ce16 out;
  out.x = w[0], out.y = w[1], out.z = w[2], out.w = w[3];
  ce_st(dst, out);
}

/* The gradient of a row whose statistics are m and s (1 / s = inv); held:
 * the thread's first CE_HOLD chunks (ce_stats). drow has row's alignment. */
template <class T>
DEV void ce_grad(T *drow, const T *row, ce_row r, const ce16 (&held)[CE_HOLD], float m, float inv, int label,
                 float scale, bool acc) {
  const int E = 16 / (int)sizeof(T);
  int t = threadIdx.x, nt = blockDim.x;
  const char *body = (const char *)(row + r.head);
  char *dbody = (char *)(drow + r.head);
  if (t < r.head + r.tail) {
    int j = ce_single<T>(r, t);
    float p = fexp(to_f(row[j]) - m) * inv - (j == label ? 1.0f : 0.0f);
    put(&drow[j], p * scale, acc);
  }
#pragma unroll
  for (int k = 0; k < CE_HOLD; k++) {
    int c = t + k * nt;
    if (c < r.nb) ce_grad16<T>(dbody + 16 * c, held[k], r.head + c * E, m, inv, label, scale, acc);
  }
  for (int c = t + CE_HOLD * nt; c < r.nb; c += 2 * nt) {
    ce16 a = ce_ld(body + 16 * c), b = a;
    bool two = c + nt < r.nb;
    if (two) b = ce_ld(body + 16 * (c + nt));
    ce_grad16<T>(dbody + 16 * c, a, r.head + c * E, m, inv, label, scale, acc);
    if (two) ce_grad16<T>(dbody + 16 * (c + nt), b, r.head + (c + nt) * E, m, inv, label, scale, acc);
  }
}

/* The row's label within [lo, lo + v), as an index there, else -1. */
DEV int ce_label(int32_t label, int64_t lo, int64_t v) {
  int64_t j = (int64_t)label - lo;
  return j >= 0 && j < v ? (int)j : -1;
}

template <class T>
__global__ void __launch_bounds__(CE_MAX_THREADS)
    k_ce_rows_vec(float *terms, const T *__restrict__ logits, const int32_t *labels, int64_t v, int64_t ld) {
  __shared__ float sh[64];
  int64_t i = blockIdx.x;
  const T *row = logits + i * ld;
  ce_row r = ce_layout(row, (int)v);
  ce16 held[CE_HOLD] = {};
  float m, s;
  ce_stats<T>(row, r, held, m, s, sh);
  if (threadIdx.x == 0) terms[i] = logf(s) + m - to_f(row[labels[i]]);
}

template <class T>
__global__ void __launch_bounds__(CE_MAX_THREADS)
    k_ce_backward_vec(T *__restrict__ dlogits, const T *__restrict__ logits, const int32_t *labels, int64_t v,
                      int64_t ldd, int64_t ld, float scale, bool acc) {
  __shared__ float sh[64];
  int64_t i = blockIdx.x;
  const T *row = logits + i * ld;
  ce_row r = ce_layout(row, (int)v);
  ce16 held[CE_HOLD] = {};
  float m, s;
  ce_stats<T>(row, r, held, m, s, sh);
  ce_grad<T>(dlogits + i * ldd, row, r, held, m, 1.0f / s, ce_label(labels[i], 0, v), scale, acc);
}

template <class T>
__global__ void __launch_bounds__(CE_MAX_THREADS)
    k_ce_stats_vec(float *stats, const T *__restrict__ logits, const int32_t *labels, int64_t v_lo, int64_t v_local) {
  __shared__ float sh[64];
  int64_t i = blockIdx.x;
  const T *row = logits + i * v_local;
  ce_row r = ce_layout(row, (int)v_local);
  ce16 held[CE_HOLD] = {};
  float m, s;
  ce_stats<T>(row, r, held, m, s, sh);
  if (threadIdx.x == 0) {
    int label = ce_label(labels[i], v_lo, v_local);
    stats[3 * i] = m;
    stats[3 * i + 1] = s;
    stats[3 * i + 2] = label >= 0 ? to_f(row[label]) : 0.0f;
  }
}

/* WEFT_CE_KERNEL=old: the first kernels, an element at a time. The new
 * ones take rows below 2^31 bytes, and a gradient with its rows aligned as
 * the logits'. */
static bool ce_old(void) {
  static const bool old = [] {
    const char *e = getenv("WEFT_CE_KERNEL");
    return e && strcmp(e, "old") == 0;
  }();
  return old;
}
static bool ce_vec(int64_t v, int dt) { return !ce_old() && v * (int64_t)gpu_dtype_size(dt) < ((int64_t)1 << 31) - 16; }
/* every row of d aligned as x's: the same offset, rows whose bytes differ
 * by a multiple of 16 */
static bool ce_vec_pair(const void *d, int64_t ldd, const void *x, int64_t ld, int64_t v, int dt) {
  return ce_vec(v, dt) && (((uintptr_t)d - (uintptr_t)x) & 15) == 0 &&
         (((ldd - ld) * (int64_t)gpu_dtype_size(dt)) & 15) == 0;
}

void gpu_cross_entropy(gpu_stream *s, int dt, double *slot, void *out, const void *logits, int64_t ld,
                       const int32_t *labels, int64_t t, int64_t v, int64_t t_total, bool acc, void *ws) {
  float *terms = (float *)ws;
  bool vec = ce_vec(v, dt);
  if (ld <= 0) ld = v;
  DISPATCH(dt, T, {
    if (vec)
      launch(k_ce_rows_vec<T>, (unsigned)t, ce_threads(v, sizeof(T), CE_READ_THREADS), 0, s, terms, (const T *)logits,
             labels, v, ld);
    else
      launch(k_ce_rows<T>, (unsigned)t, CE_THREADS, 0, s, terms, (const T *)logits, labels, v, ld);
    launch(k_loss_sum<T, float>, 1, CE_THREADS, 0, s, slot, (T *)out, (const float *)terms, t, 1.0 / (double)t_total,
           acc);
  });
}

template <class T>
__global__ void k_ce_backward(T *dlogits, const T *logits, const int32_t *labels, int64_t v, int64_t ldd, int64_t ld,
                              float scale, bool acc) {
  __shared__ float sh[64];
  int64_t i = blockIdx.x;
  const T *row = logits + i * ld;
  T *drow = dlogits + i * ldd;
  float m, s;
  row_stats(row, v, m, s, sh);
  int64_t label = labels[i];
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
    float p = fexp(to_f(row[j]) - m) / s - (j == label ? 1.0f : 0.0f);
    put(&drow[j], p * scale, acc);
  }
}

void gpu_cross_entropy_backward(gpu_stream *s, int dt, void *dlogits, int64_t ldd, const void *logits, int64_t ld,
                                const int32_t *labels, int64_t t, int64_t v, int64_t t_total, bool acc) {
  if (!dlogits) return;
  float scale = (float)(1.0 / (double)t_total);
  if (ld <= 0) ld = v;
  if (ldd <= 0) ldd = v;
  bool vec = ce_vec_pair(dlogits, ldd, logits, ld, v, dt);
  DISPATCH(dt, T, {
    if (vec)
      launch(k_ce_backward_vec<T>, (unsigned)t, ce_threads(v, sizeof(T), CE_MAX_THREADS), 0, s, (T *)dlogits,
             (const T *)logits, labels, v, ldd, ld, scale, acc);
    else
      launch(k_ce_backward<T>, (unsigned)t, CE_THREADS, 0, s, (T *)dlogits, (const T *)logits, labels, v, ldd, ld,
             scale, acc);
  });
}

/* The loss and its gradient in one pass, the gradient over the logits
 * (the executor's loss_in_place): terms as k_ce_rows_vec's, the row then
 * as k_ce_backward_vec writes it (not added to). Every thread has read
 * what it will write before the statistics' barrier; the label's logit is
 * read before it too. No __restrict__: the logits are the gradient. */
template <class T>
__global__ void __launch_bounds__(CE_MAX_THREADS)
    k_ce_in_place_vec(float *terms, T *rows, const int32_t *labels, int64_t v, int64_t ld, float scale) {
  __shared__ float sh[64];
  int64_t i = blockIdx.x;
  T *row = rows + i * ld;
  ce_row r = ce_layout(row, (int)v);
  ce16 held[CE_HOLD] = {};
  float m, s, xl = threadIdx.x == 0 ? to_f(row[labels[i]]) : 0.0f;
  ce_stats<T>(row, r, held, m, s, sh);
  if (threadIdx.x == 0) terms[i] = logf(s) + m - xl;
  ce_grad<T>(row, row, r, held, m, 1.0f / s, ce_label(labels[i], 0, v), scale, false);
}

template <class T>
__global__ void k_ce_in_place(float *terms, T *rows, const int32_t *labels, int64_t v, int64_t ld, float scale) {
  __shared__ float sh[64];
  int64_t i = blockIdx.x;
  T *row = rows + i * ld;
  int64_t label = labels[i];
  float m, s, xl = threadIdx.x == 0 ? to_f(row[label]) : 0.0f;
  row_stats(row, v, m, s, sh);
  if (threadIdx.x == 0) terms[i] = logf(s) + m - xl;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
    float p = fexp(to_f(row[j]) - m) / s - (j == label ? 1.0f : 0.0f);
    put(&row[j], p * scale, false);
  }
}

void gpu_cross_entropy_in_place(gpu_stream *s, int dt, double *slot, void *out, void *logits, int64_t ld,
                                const int32_t *labels, int64_t t, int64_t v, int64_t t_total, bool acc, void *ws) {
  float *terms = (float *)ws;
  float scale = (float)(1.0 / (double)t_total);
  if (ld <= 0) ld = v;
  DISPATCH(dt, T, {
    if (ce_vec(v, dt))
      launch(k_ce_in_place_vec<T>, (unsigned)t, ce_threads(v, sizeof(T), CE_MAX_THREADS), 0, s, terms, (T *)logits,
             labels, v, ld, scale);
    else
      launch(k_ce_in_place<T>, (unsigned)t, CE_THREADS, 0, s, terms, (T *)logits, labels, v, ld, scale);
    launch(k_loss_sum<T, float>, 1, CE_THREADS, 0, s, slot, (T *)out, (const float *)terms, t, 1.0 / (double)t_total,
           acc);
  });
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
  bool vec = ce_vec(v_local, dt);
  DISPATCH(dt, T, {
    if (vec)
      launch(k_ce_stats_vec<T>, (unsigned)t, ce_threads(v_local, sizeof(T), CE_READ_THREADS), 0, s, stats,
             (const T *)logits, labels, v_lo, v_local);
    else
      launch(k_ce_stats<T>, (unsigned)t, CE_THREADS, 0, s, stats, (const T *)logits, labels, v_lo, v_local);
  });
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

/* The same from the gathered statistics: the thread's chunks read first
 * (CE_HOLD of them in flight), then the gradient. */
template <class T>
__global__ void __launch_bounds__(CE_MAX_THREADS)
    k_ce_shard_backward_vec(T *__restrict__ dlogits, const T *__restrict__ logits, const int32_t *labels,
                            const float *stats, int nshards, int64_t v_lo, int64_t v_local, float scale, bool acc) {
  int64_t i = blockIdx.x;
  const T *row = logits + i * v_local;
  ce_row r = ce_layout(row, (int)v_local);
  const char *body = (const char *)(row + r.head);
  ce16 held[CE_HOLD] = {};
#pragma unroll
  for (int k = 0; k < CE_HOLD; k++) {
    int c = threadIdx.x + k * blockDim.x;
    if (c < r.nb) held[k] = ce_ld(body + 16 * c);
  }
  float mx, sum, tgt;
  merge_row(stats, nshards, i, mx, sum, tgt);
  ce_grad<T>(dlogits + i * v_local, row, r, held, mx, 1.0f / sum, ce_label(labels[i], v_lo, v_local), scale, acc);
}

void gpu_cross_entropy_shard_backward(gpu_stream *s, int dt, void *dlogits, const void *logits, const int32_t *labels,
                                      const float *stats, int nshards, int64_t t, int64_t v_lo, int64_t v_local,
                                      int64_t t_total, bool acc) {
  if (!dlogits) return;
  float scale = (float)(1.0 / (double)t_total);
  bool vec = ce_vec_pair(dlogits, v_local, logits, v_local, v_local, dt);
  DISPATCH(dt, T, {
    if (vec)
      launch(k_ce_shard_backward_vec<T>, (unsigned)t, ce_threads(v_local, sizeof(T), CE_MAX_THREADS), 0, s,
             (T *)dlogits, (const T *)logits, labels, stats, nshards, v_lo, v_local, scale, acc);
    else
      launch(k_ce_shard_backward<T>, (unsigned)t, CE_THREADS, 0, s, (T *)dlogits, (const T *)logits, labels, stats,
             nshards, v_lo, v_local, scale, acc);
  });
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
