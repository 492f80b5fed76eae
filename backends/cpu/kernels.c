/* kernels.c - forward and backward kernels of the CPU backend, the
 * optimizers and the counter-based init; see kernels.h. */
#include "kernels.h"

#include <assert.h>
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "weft/arena.h"

/* ---- BLAS threads -------------------------------------------------------- */

void openblas_set_num_threads(int num_threads);
/* Exported by OpenBLAS's threaded builds; absent from others. */
int blas_thread_shutdown_(void) __attribute__((weak));

void k_blas_single(void) {
  openblas_set_num_threads(1);
  if (blas_thread_shutdown_) blas_thread_shutdown_();
}

/* ---- helpers ------------------------------------------------------------- */

static void *scratch(size_t count, size_t size) {
  if (count == 0) count = 1;
  void *p = calloc(count, size);
  if (!p) weft_oom();
  return p;
}

/* dst = v, or dst += v. */
static inline void put(float *dst, double v, bool acc) {
  *dst = acc ? *dst + (float)v : (float)v;
}

static void zero_rows(float *c, int64_t rows, int64_t cols, int64_t ldc) {
  for (int64_t i = 0; i < rows; i++) memset(c + i * ldc, 0, (size_t)cols * sizeof *c);
}

/* Row-major C[m,n] = alpha op(A) op(B) + beta C, where op(A) is [m,k] and
 * op(B) is [k,n]; beta is 0 (C not read) or 1. Handles the empty sizes that
 * BLAS implementations treat differently. */
static void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                 const float *a, int64_t lda, const float *b, int64_t ldb,
                 float beta, float *c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0) zero_rows(c, m, n, ldc);
    return;
  }
  assert(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX);
  assert(lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* ---- matrix products ----------------------------------------------------- */

void k_matmul(float *c, const float *a, const float *b,
              int64_t m, int64_t k, int64_t n, bool acc) {
  gemm(false, false, m, n, k, 1, a, k, b, n, acc ? 1 : 0, c, n);
}

void k_matmul_backward(float *da, float *db, const float *dc,
                       const float *a, const float *b,
                       int64_t m, int64_t k, int64_t n, bool acc) {
  if (da) gemm(false, true, m, k, n, 1, dc, n, b, n, acc ? 1 : 0, da, k);
  if (db) gemm(true, false, k, n, m, 1, a, k, dc, n, acc ? 1 : 0, db, n);
}

void k_matmul_t(float *c, const float *a, const float *b,
                int64_t m, int64_t k, int64_t n, bool acc) {
  gemm(false, true, m, n, k, 1, a, k, b, k, acc ? 1 : 0, c, n);
}

void k_matmul_t_backward(float *da, float *db, const float *dc,
                         const float *a, const float *b,
                         int64_t m, int64_t k, int64_t n, bool acc) {
  if (da) gemm(false, false, m, k, n, 1, dc, n, b, k, acc ? 1 : 0, da, k);
  if (db) gemm(true, false, n, k, m, 1, dc, n, a, k, acc ? 1 : 0, db, k);
}

void k_linear(float *y, const float *x, const float *w, const float *bias,
              int64_t m, int64_t k, int64_t n, bool acc) {
  gemm(false, false, m, n, k, 1, x, k, w, n, acc ? 1 : 0, y, n);
  if (!bias) return;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) y[i * n + j] += bias[j];
}

void k_linear_backward(float *dx, float *dw, float *dbias, const float *dy,
                       const float *x, const float *w,
                       int64_t m, int64_t k, int64_t n, bool acc) {
  k_matmul_backward(dx, dw, dy, x, w, m, k, n, acc);
  if (!dbias) return;
  double *sum = scratch((size_t)n, sizeof *sum);
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) sum[j] += dy[i * n + j];
  for (int64_t j = 0; j < n; j++) put(&dbias[j], sum[j], acc);
  free(sum);
}

/* ---- embeddings ---------------------------------------------------------- */

void k_embedding(float *out, const int32_t *ids, const float *table,
                 int64_t t, int64_t h, int64_t v_lo, int64_t v_local, bool acc) {
  for (int64_t i = 0; i < t; i++) {
    float *o = out + i * h;
    int64_t row = (int64_t)ids[i] - v_lo;
    if (row < 0 || row >= v_local) {
      if (!acc) memset(o, 0, (size_t)h * sizeof *o);
      continue;
    }
    const float *src = table + row * h;
    if (acc)
      for (int64_t j = 0; j < h; j++) o[j] += src[j];
    else
      memcpy(o, src, (size_t)h * sizeof *o);
  }
}

void k_embedding_backward(float *dtable, const float *dout, const int32_t *ids,
                          int64_t t, int64_t h, int64_t v_lo, int64_t v_local,
                          bool acc) {
  if (!dtable) return;
  if (!acc) memset(dtable, 0, (size_t)(v_local * h) * sizeof *dtable);
  for (int64_t i = 0; i < t; i++) {
    int64_t row = (int64_t)ids[i] - v_lo;
    if (row < 0 || row >= v_local) continue;
    for (int64_t j = 0; j < h; j++) dtable[row * h + j] += dout[i * h + j];
  }
}

void k_add_position(float *y, const float *x, const float *table,
                    int64_t b, int64_t s, int64_t h) {
  int64_t plane = s * h;
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t j = 0; j < plane; j++) y[bi * plane + j] = x[bi * plane + j] + table[j];
}

void k_add_position_backward(float *dx, float *dtable, const float *dy,
                             int64_t b, int64_t s, int64_t h, bool acc) {
  int64_t plane = s * h;
  if (dx) k_add_backward(dx, NULL, dy, b * plane, acc);
  if (!dtable) return;
  for (int64_t j = 0; j < plane; j++) {
    double sum = 0;
    for (int64_t bi = 0; bi < b; bi++) sum += dy[bi * plane + j];
    put(&dtable[j], sum, acc);
  }
}

/* ---- normalisation ------------------------------------------------------- */

/* Mean and 1/sqrt(var + eps) of one row, two passes in double. */
static void row_stats(const float *x, int64_t h, double eps, double *mean, double *rstd) {
  double sum = 0;
  for (int64_t j = 0; j < h; j++) sum += x[j];
  double mu = sum / (double)h, var = 0;
  for (int64_t j = 0; j < h; j++) {
    double d = x[j] - mu;
    var += d * d;
  }
  *mean = mu;
  *rstd = 1.0 / sqrt(var / (double)h + eps);
}

void k_layernorm(float *y, const float *x, const float *w, const float *b,
                 int64_t rows, int64_t h, double eps) {
  for (int64_t i = 0; i < rows; i++) {
    const float *xr = x + i * h;
    float *yr = y + i * h;
    double mean, rstd;
    row_stats(xr, h, eps, &mean, &rstd);
    for (int64_t j = 0; j < h; j++) yr[j] = (float)((xr[j] - mean) * rstd * w[j] + b[j]);
  }
}

void k_layernorm_backward(float *dx, float *dw, float *db, const float *dy,
                          const float *x, const float *w,
                          int64_t rows, int64_t h, double eps, bool acc) {
  double *sw = dw ? scratch((size_t)h, sizeof *sw) : NULL;
  double *sb = db ? scratch((size_t)h, sizeof *sb) : NULL;
  for (int64_t i = 0; i < rows; i++) {
    const float *xr = x + i * h, *dyr = dy + i * h;
    double mean, rstd;
    row_stats(xr, h, eps, &mean, &rstd);
    double sum_g = 0, sum_gx = 0;   /* sums of g = dy * w and g * xhat */
    for (int64_t j = 0; j < h; j++) {
      double xhat = (xr[j] - mean) * rstd, g = (double)dyr[j] * w[j];
      sum_g += g;
      sum_gx += g * xhat;
      if (sw) sw[j] += dyr[j] * xhat;
      if (sb) sb[j] += dyr[j];
    }
    if (!dx) continue;
    double mg = sum_g / (double)h, mgx = sum_gx / (double)h;
    for (int64_t j = 0; j < h; j++) {
      double xhat = (xr[j] - mean) * rstd, g = (double)dyr[j] * w[j];
      put(&dx[i * h + j], rstd * (g - mg - xhat * mgx), acc);
    }
  }
  for (int64_t j = 0; sw && j < h; j++) put(&dw[j], sw[j], acc);
  for (int64_t j = 0; sb && j < h; j++) put(&db[j], sb[j], acc);
  free(sw);
  free(sb);
}

static double row_rms_scale(const float *x, int64_t h, double eps) {
  double ss = 0;
  for (int64_t j = 0; j < h; j++) ss += (double)x[j] * x[j];
  return 1.0 / sqrt(ss / (double)h + eps);
}

void k_rmsnorm(float *y, const float *x, const float *w,
               int64_t rows, int64_t h, double eps) {
  for (int64_t i = 0; i < rows; i++) {
    const float *xr = x + i * h;
    float *yr = y + i * h;
    double r = row_rms_scale(xr, h, eps);
    for (int64_t j = 0; j < h; j++) yr[j] = (float)(xr[j] * r * w[j]);
  }
}

void k_rmsnorm_backward(float *dx, float *dw, const float *dy,
                        const float *x, const float *w,
                        int64_t rows, int64_t h, double eps, bool acc) {
  double *sw = dw ? scratch((size_t)h, sizeof *sw) : NULL;
  for (int64_t i = 0; i < rows; i++) {
    const float *xr = x + i * h, *dyr = dy + i * h;
    double r = row_rms_scale(xr, h, eps), sum_gx = 0;
    for (int64_t j = 0; j < h; j++) {
      double xhat = xr[j] * r;
      sum_gx += (double)dyr[j] * w[j] * xhat;
      if (sw) sw[j] += dyr[j] * xhat;
    }
    if (!dx) continue;
    double mgx = sum_gx / (double)h;
    for (int64_t j = 0; j < h; j++) {
      double xhat = xr[j] * r;
      put(&dx[i * h + j], r * ((double)dyr[j] * w[j] - xhat * mgx), acc);
    }
  }
  for (int64_t j = 0; sw && j < h; j++) put(&dw[j], sw[j], acc);
  free(sw);
}

/* ---- activations --------------------------------------------------------- */

#define GELU_C 0.7978845608028654f   /* sqrt(2 / pi) */
#define GELU_A 0.044715f

void k_gelu(float *y, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(GELU_C * (v + GELU_A * v * v * v)));
  }
}

void k_gelu_backward(float *dx, const float *dy, const float *x, int64_t n, bool acc) {
  if (!dx) return;
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    float t = tanhf(GELU_C * (v + GELU_A * v * v * v));
    float du = GELU_C * (1.0f + 3.0f * GELU_A * v * v);
    float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
    put(&dx[i], dy[i] * d, acc);
  }
}

static inline float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

void k_silu(float *y, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * sigmoid(x[i]);
}

/* d silu(v) / dv = s (1 + v (1 - s)), s = sigmoid(v). */
static inline float silu_grad(float v) {
  float s = sigmoid(v);
  return s * (1.0f + v * (1.0f - s));
}

void k_silu_backward(float *dx, const float *dy, const float *x, int64_t n, bool acc) {
  if (!dx) return;
  for (int64_t i = 0; i < n; i++) put(&dx[i], dy[i] * silu_grad(x[i]), acc);
}

void k_swiglu(float *y, const float *gate, const float *up, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float gv = gate[i];
    y[i] = gv * sigmoid(gv) * up[i];
  }
}

void k_swiglu_backward(float *dgate, float *dup, const float *dy,
                       const float *gate, const float *up, int64_t n, bool acc) {
  for (int64_t i = 0; i < n; i++) {
    float gv = gate[i];
    if (dgate) put(&dgate[i], dy[i] * up[i] * silu_grad(gv), acc);
    if (dup) put(&dup[i], dy[i] * (gv * sigmoid(gv)), acc);
  }
}

/* ---- rotary -------------------------------------------------------------- */

/* Rotates every pair of x[b,s,heads*dh] by sign * its angle. */
static void rotate(float *y, const float *x, int64_t b, int64_t s, int64_t heads,
                   int64_t dh, int64_t pos0, double base, double sign, bool acc) {
  assert(dh % 2 == 0);
  int64_t half = dh / 2, width = heads * dh;
  double *freq = scratch((size_t)half, sizeof *freq);
  for (int64_t i = 0; i < half; i++) freq[i] = pow(base, -2.0 * (double)i / (double)dh);
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t si = 0; si < s; si++) {
      double pos = (double)(pos0 + si);
      const float *xr = x + (bi * s + si) * width;
      float *yr = y + (bi * s + si) * width;
      for (int64_t i = 0; i < half; i++) {
        double angle = pos * freq[i];
        double c = cos(angle), sn = sign * sin(angle);
        for (int64_t hd = 0; hd < heads; hd++) {
          double x1 = xr[hd * dh + i], x2 = xr[hd * dh + i + half];
          put(&yr[hd * dh + i], x1 * c - x2 * sn, acc);
          put(&yr[hd * dh + i + half], x2 * c + x1 * sn, acc);
        }
      }
    }
  free(freq);
}

void k_rotary(float *y, const float *x, int64_t b, int64_t s, int64_t heads,
              int64_t dh, int64_t pos0, double base) {
  rotate(y, x, b, s, heads, dh, pos0, base, 1.0, false);
}

void k_rotary_backward(float *dx, const float *dy, int64_t b, int64_t s,
                       int64_t heads, int64_t dh, int64_t pos0, double base,
                       bool acc) {
  if (dx) rotate(dx, dy, b, s, heads, dh, pos0, base, -1.0, acc);
}

/* ---- attention ----------------------------------------------------------- */

/* One head: q is sq rows of dh, k and v sk rows, at row strides ldq, ldk,
 * ldv (views into fused or grouped layouts); q's row i is position q0 + i
 * of the sequence, k's and v's row j position j. */
typedef struct head_view {
  const float *q, *k, *v;
  int64_t ldq, ldk, ldv;
  int64_t sq, sk, q0;
  bool full;          /* every query attends to every key (no causal mask) */
} head_view;

/* The last key query row i attends to: causal, position q0 + i within
 * the keys; every key when the view is full. */
static int64_t last_key(const head_view *hv, int64_t i) {
  if (hv->full) return hv->sk - 1;
  int64_t j = hv->q0 + i;
  return j < hv->sk ? j : hv->sk - 1;
}

/* p[sq,sk] = causal softmax(q k^T / sqrt(dh)): row i over columns j <=
 * q0 + i, the rest zero. */
static void head_probs(float *p, const head_view *hv, int64_t dh) {
  int64_t sq = hv->sq, sk = hv->sk;
  float scale = (float)(1.0 / sqrt((double)dh));
  gemm(false, true, sq, sk, dh, scale, hv->q, hv->ldq, hv->k, hv->ldk, 0, p, sk);
  for (int64_t i = 0; i < sq; i++) {
    float *row = p + i * sk;
    int64_t last = last_key(hv, i);
    float mx = row[0];
    for (int64_t j = 1; j <= last; j++) mx = row[j] > mx ? row[j] : mx;
    double sum = 0;
    for (int64_t j = 0; j <= last; j++) sum += exp((double)row[j] - mx);
    for (int64_t j = 0; j <= last; j++) row[j] = (float)(exp((double)row[j] - mx) / sum);
    for (int64_t j = last + 1; j < sk; j++) row[j] = 0;
  }
}

/* out rows (stride ldo) = P v. */
static void head_forward(float *out, int64_t ldo, const head_view *hv, int64_t dh, float *p) {
  head_probs(p, hv, dh);
  gemm(false, false, hv->sq, dh, hv->sk, 1, p, hv->sk, hv->v, hv->ldv, 0, out, ldo);
}

/* Gradients of one head given dout (stride lddo); a NULL output is skipped,
 * beta_k and beta_v are 0 or 1 (several query heads share k and v). */
static void head_backward(float *dq, int64_t lddq, float *dk, int64_t lddk, float beta_k,
                          float *dv, int64_t lddv, float beta_v, float beta_q,
                          const float *dout, int64_t lddo, const head_view *hv,
                          int64_t dh, float *p, float *ds) {
  int64_t sq = hv->sq, sk = hv->sk;
  float scale = (float)(1.0 / sqrt((double)dh));
  head_probs(p, hv, dh);
  if (dv) gemm(true, false, sk, dh, sq, 1, p, sk, dout, lddo, beta_v, dv, lddv);
  if (!dq && !dk) return;
  /* dP = dout v^T, then dS = P (dP - rowsum(P dP)). */
  gemm(false, true, sq, sk, dh, 1, dout, lddo, hv->v, hv->ldv, 0, ds, sk);
  for (int64_t i = 0; i < sq; i++) {
    float *pr = p + i * sk, *dr = ds + i * sk;
    int64_t last = last_key(hv, i);
    double dot = 0;
    for (int64_t j = 0; j <= last; j++) dot += (double)pr[j] * dr[j];
    for (int64_t j = 0; j <= last; j++) dr[j] = (float)(pr[j] * (dr[j] - dot));
    for (int64_t j = last + 1; j < sk; j++) dr[j] = 0;
  }
  if (dq) gemm(false, false, sq, dh, sk, scale, ds, sk, hv->k, hv->ldk, beta_q, dq, lddq);
  if (dk) gemm(true, false, sk, dh, sq, scale, ds, sk, hv->q, hv->ldq, beta_k, dk, lddk);
}

void k_causal_attention(float *out, const float *qkv,
                        int64_t b, int64_t s, int64_t heads, int64_t dh) {
  int64_t c = heads * dh;
  float *p = scratch((size_t)(s * s), sizeof *p);
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t hd = 0; hd < heads; hd++) {
      const float *q = qkv + bi * s * 3 * c + hd * dh;
      head_view hv = {q, q + c, q + 2 * c, 3 * c, 3 * c, 3 * c, s, s, 0, false};
      head_forward(out + bi * s * c + hd * dh, c, &hv, dh, p);
    }
  free(p);
}

void k_causal_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                 int64_t b, int64_t s, int64_t heads, int64_t dh,
                                 bool acc) {
  if (!dqkv) return;
  int64_t c = heads * dh;
  float beta = acc ? 1 : 0;
  float *p = scratch((size_t)(2 * s * s), sizeof *p);
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t hd = 0; hd < heads; hd++) {
      int64_t off = bi * s * 3 * c + hd * dh;
      const float *q = qkv + off;
      head_view hv = {q, q + c, q + 2 * c, 3 * c, 3 * c, 3 * c, s, s, 0, false};
      float *dq = dqkv + off;
      head_backward(dq, 3 * c, dq + c, 3 * c, beta, dq + 2 * c, 3 * c, beta, beta,
                    dout + bi * s * c + hd * dh, c, &hv, dh, p, p + s * s);
    }
  free(p);
}

void k_gqa_attention(float *out, const float *q, const float *k, const float *v,
                     int64_t b, int64_t sq, int64_t sk, int64_t q0, int64_t g, int64_t r, int64_t dh) {
  int64_t cq = g * r * dh, ckv = g * dh;
  float *p = scratch((size_t)(sq * sk), sizeof *p);
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t gi = 0; gi < g; gi++)
      for (int64_t ri = 0; ri < r; ri++) {
        int64_t qoff = bi * sq * cq + (gi * r + ri) * dh, kvoff = bi * sk * ckv + gi * dh;
        head_view hv = {q + qoff, k + kvoff, v + kvoff, cq, ckv, ckv, sq, sk, q0, false};
        head_forward(out + qoff, cq, &hv, dh, p);
      }
  free(p);
}

void k_gqa_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                              const float *q, const float *k, const float *v,
                              int64_t b, int64_t sq, int64_t sk, int64_t q0, int64_t g, int64_t r,
                              int64_t dh, bool acc) {
  if (!dq && !dk && !dv) return;
  int64_t cq = g * r * dh, ckv = g * dh;
  float beta = acc ? 1 : 0;
  float *p = scratch((size_t)(2 * sq * sk), sizeof *p);
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t gi = 0; gi < g; gi++)
      for (int64_t ri = 0; ri < r; ri++) {
        int64_t qoff = bi * sq * cq + (gi * r + ri) * dh, kvoff = bi * sk * ckv + gi * dh;
        head_view hv = {q + qoff, k + kvoff, v + kvoff, cq, ckv, ckv, sq, sk, q0, false};
        float beta_kv = ri == 0 ? beta : 1;   /* the first query head of a group sets */
        head_backward(dq ? dq + qoff : NULL, cq, dk ? dk + kvoff : NULL, ckv, beta_kv,
                      dv ? dv + kvoff : NULL, ckv, beta_kv, beta,
                      dout + qoff, cq, &hv, dh, p, p + sq * sk);
      }
  free(p);
}

/* ---- softmax and sums ---------------------------------------------------- */

/* Maximum of a row and the sum of exp(x - max) in double. */
static void row_softmax_stats(const float *x, int64_t cols, float *mx, double *sum) {
  float m = x[0];
  for (int64_t j = 1; j < cols; j++) m = x[j] > m ? x[j] : m;
  double acc = 0;
  for (int64_t j = 0; j < cols; j++) acc += exp((double)x[j] - m);
  *mx = m;
  *sum = acc;
}

void k_softmax(float *y, const float *x, int64_t rows, int64_t cols) {
  if (cols == 0) return;
  for (int64_t i = 0; i < rows; i++) {
    const float *xr = x + i * cols;
    float *yr = y + i * cols;
    float mx;
    double sum;
    row_softmax_stats(xr, cols, &mx, &sum);
    for (int64_t j = 0; j < cols; j++) yr[j] = (float)(exp((double)xr[j] - mx) / sum);
  }
}

void k_softmax_backward(float *dx, const float *dy, const float *x,
                        int64_t rows, int64_t cols, bool acc) {
  if (!dx || cols == 0) return;
  double *y = scratch((size_t)cols, sizeof *y);
  for (int64_t i = 0; i < rows; i++) {
    const float *xr = x + i * cols, *dyr = dy + i * cols;
    float mx;
    double sum, dot = 0;
    row_softmax_stats(xr, cols, &mx, &sum);
    for (int64_t j = 0; j < cols; j++) {
      y[j] = exp((double)xr[j] - mx) / sum;
      dot += y[j] * dyr[j];
    }
    for (int64_t j = 0; j < cols; j++) put(&dx[i * cols + j], y[j] * (dyr[j] - dot), acc);
  }
  free(y);
}

void k_add(float *y, const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

void k_add_backward(float *da, float *db, const float *dy, int64_t n, bool acc) {
  if (da) {
    if (acc) k_axpy(da, 1, dy, n);
    else memcpy(da, dy, (size_t)n * sizeof *da);
  }
  if (db) {
    if (acc) k_axpy(db, 1, dy, n);
    else memcpy(db, dy, (size_t)n * sizeof *db);
  }
}

void k_axpy(float *y, float alpha, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

/* ---- losses -------------------------------------------------------------- */

double k_cross_entropy(const float *logits, const int32_t *labels,
                       int64_t t, int64_t v, int64_t t_total) {
  double loss = 0;
  for (int64_t i = 0; i < t; i++) {
    const float *row = logits + i * v;
    assert(labels[i] >= 0 && labels[i] < v);
    float mx;
    double sum;
    row_softmax_stats(row, v, &mx, &sum);
    loss += log(sum) + mx - row[labels[i]];
  }
  return loss / (double)t_total;
}

void k_cross_entropy_backward(float *dlogits, const float *logits,
                              const int32_t *labels, int64_t t, int64_t v,
                              int64_t t_total, double dloss, bool acc) {
  if (!dlogits) return;
  double scale = dloss / (double)t_total;
  for (int64_t i = 0; i < t; i++) {
    const float *row = logits + i * v;
    assert(labels[i] >= 0 && labels[i] < v);
    float mx;
    double sum;
    row_softmax_stats(row, v, &mx, &sum);
    for (int64_t j = 0; j < v; j++) {
      double pj = exp((double)row[j] - mx) / sum - (j == labels[i] ? 1.0 : 0.0);
      put(&dlogits[i * v + j], pj * scale, acc);
    }
  }
}

void k_cross_entropy_stats(float *stats, const float *logits, const int32_t *labels,
                           int64_t t, int64_t v_lo, int64_t v_local) {
  for (int64_t i = 0; i < t; i++) {
    const float *row = logits + i * v_local;
    float mx = -INFINITY;
    for (int64_t j = 0; j < v_local; j++) mx = row[j] > mx ? row[j] : mx;
    double sum = 0;
    for (int64_t j = 0; j < v_local; j++) sum += exp((double)row[j] - mx);
    int64_t label = (int64_t)labels[i] - v_lo;
    stats[3 * i] = mx;
    stats[3 * i + 1] = (float)sum;
    stats[3 * i + 2] = label >= 0 && label < v_local ? row[label] : 0.0f;
  }
}

void k_cross_entropy_merge(float *row_max, float *row_sum, float *target, const float *stats,
                           int nshards, int64_t t) {
  for (int64_t i = 0; i < t; i++) {
    const float *s = stats + i * 3 * nshards;
    float mx = -INFINITY;
    for (int p = 0; p < nshards; p++) mx = s[3 * p] > mx ? s[3 * p] : mx;
    double sum = 0;
    float tgt = 0.0f;
    for (int p = 0; p < nshards; p++) {
      if (s[3 * p + 1] > 0)   /* an empty shard has max -inf and sum 0 */
        sum += s[3 * p + 1] * exp((double)s[3 * p] - mx);
      tgt += s[3 * p + 2];
    }
    row_max[i] = mx;
    row_sum[i] = (float)sum;
    target[i] = tgt;
  }
}

double k_cross_entropy_combine(const float *row_max, const float *row_sum,
                               const float *target, int64_t t, int64_t t_total) {
  double loss = 0;
  for (int64_t i = 0; i < t; i++)
    loss += log((double)row_sum[i]) + row_max[i] - (double)target[i];
  return loss / (double)t_total;
}

void k_cross_entropy_shard_backward(float *dlogits, const float *logits,
                                    const int32_t *labels, const float *row_max,
                                    const float *row_sum, int64_t t,
                                    int64_t v_lo, int64_t v_local,
                                    int64_t t_total, double dloss, bool acc) {
  if (!dlogits) return;
  double scale = dloss / (double)t_total;
  for (int64_t i = 0; i < t; i++) {
    const float *row = logits + i * v_local;
    int64_t label = (int64_t)labels[i] - v_lo;
    double sum = row_sum[i];
    for (int64_t j = 0; j < v_local; j++) {
      double pj = exp((double)row[j] - row_max[i]) / sum - (j == label ? 1.0 : 0.0);
      put(&dlogits[i * v_local + j], pj * scale, acc);
    }
  }
}

double k_mse(const float *a, const float *b, int64_t n, int64_t n_total) {
  double sum = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = (double)a[i] - b[i];
    sum += d * d;
  }
  return sum / (double)n_total;
}

void k_mse_backward(float *da, float *db, const float *a, const float *b,
                    int64_t n, int64_t n_total, double dloss, bool acc) {
  double scale = 2.0 * dloss / (double)n_total;
  for (int64_t i = 0; i < n; i++) {
    double g = ((double)a[i] - b[i]) * scale;
    if (da) put(&da[i], g, acc);
    if (db) put(&db[i], -g, acc);
  }
}

/* ---- mixture of experts -------------------------------------------------- */

/* The k largest of p[0..e), ties to the lower index, largest first. */
static void top_k(int32_t *pick, const float *p, int64_t e, int64_t k) {
  for (int64_t j = 0; j < k; j++) {
    int64_t best = -1;
    for (int64_t x = 0; x < e; x++) {
      bool taken = false;
      for (int64_t q = 0; q < j && !taken; q++) taken = pick[q] == x;
      if (!taken && (best < 0 || p[x] > p[best])) best = x;
    }
    pick[j] = (int32_t)best;
  }
}

void k_moe_route(int32_t *expert, int32_t *slot, const float *probs,
                 int64_t g, int64_t s, int64_t e, int64_t k, int64_t c) {
  int64_t *used = scratch((size_t)e, sizeof *used);
  for (int64_t gi = 0; gi < g; gi++) {
    for (int64_t t = 0; t < s; t++)
      top_k(expert + (gi * s + t) * k, probs + (gi * s + t) * e, e, k);
    memset(used, 0, (size_t)e * sizeof *used);
    for (int64_t j = 0; j < k; j++)
      for (int64_t t = 0; t < s; t++) {
        int64_t at = (gi * s + t) * k + j, x = expert[at];
        slot[at] = used[x] < c ? (int32_t)used[x]++ : -1;
      }
  }
  free(used);
}

typedef struct moe_routes {
  int32_t *expert, *slot;
} moe_routes;

static moe_routes routes(const float *probs, int64_t g, int64_t s, int64_t e, int64_t k, int64_t c) {
  moe_routes r = {scratch((size_t)(g * s * k), sizeof(int32_t)), scratch((size_t)(g * s * k), sizeof(int32_t))};
  k_moe_route(r.expert, r.slot, probs, g, s, e, k, c);
  return r;
}

static void free_routes(moe_routes *r) {
  free(r->expert);
  free(r->slot);
}

/* The row of slot (x, gi, sl) in an [e][g][c][h] tensor. */
static inline int64_t slot_row(int64_t x, int64_t gi, int64_t sl, int64_t g, int64_t c) {
  return (x * g + gi) * c + sl;
}

void k_moe_dispatch(float *out, const float *x, const float *probs,
                    int64_t g, int64_t s, int64_t h, int64_t e, int64_t k, int64_t c) {
  moe_routes r = routes(probs, g, s, e, k, c);
  memset(out, 0, (size_t)(e * g * c * h) * sizeof *out);
  for (int64_t gi = 0; gi < g; gi++)
    for (int64_t t = 0; t < s; t++)
      for (int64_t j = 0; j < k; j++) {
        int64_t at = (gi * s + t) * k + j;
        if (r.slot[at] < 0) continue;
        memcpy(out + slot_row(r.expert[at], gi, r.slot[at], g, c) * h, x + (gi * s + t) * h, (size_t)h * sizeof *out);
      }
  free_routes(&r);
}

void k_moe_dispatch_backward(float *dx, const float *dout, const float *probs,
                             int64_t g, int64_t s, int64_t h, int64_t e, int64_t k,
                             int64_t c, bool acc) {
  if (!dx) return;
  moe_routes r = routes(probs, g, s, e, k, c);
  for (int64_t gi = 0; gi < g; gi++)
    for (int64_t t = 0; t < s; t++) {
      float *d = dx + (gi * s + t) * h;
      for (int64_t q = 0; q < h; q++) {
        double sum = 0;
        for (int64_t j = 0; j < k; j++) {
          int64_t at = (gi * s + t) * k + j;
          if (r.slot[at] >= 0) sum += dout[slot_row(r.expert[at], gi, r.slot[at], g, c) * h + q];
        }
        put(&d[q], sum, acc);
      }
    }
  free_routes(&r);
}

/* The weight of each of a token's k choices (w[k]) and the divisor it was
 * normalised by (1 without normalize). */
static double choice_weights(double *w, const float *p, const int32_t *pick, int64_t k, bool normalize) {
  double sum = 0;
  for (int64_t j = 0; j < k; j++) sum += p[pick[j]];
  double div = normalize && sum > 0 ? sum : 1;
  for (int64_t j = 0; j < k; j++) w[j] = p[pick[j]] / div;
  return div;
}

void k_moe_combine(float *y, const float *ye, const float *probs,
                   int64_t g, int64_t s, int64_t h, int64_t e, int64_t k, int64_t c,
                   bool normalize) {
  moe_routes r = routes(probs, g, s, e, k, c);
  double *w = scratch((size_t)k, sizeof *w);
  for (int64_t gi = 0; gi < g; gi++)
    for (int64_t t = 0; t < s; t++) {
      int64_t base = (gi * s + t) * k;
      choice_weights(w, probs + (gi * s + t) * e, r.expert + base, k, normalize);
      float *o = y + (gi * s + t) * h;
      for (int64_t q = 0; q < h; q++) {
        double sum = 0;
        for (int64_t j = 0; j < k; j++)
          if (r.slot[base + j] >= 0) sum += w[j] * ye[slot_row(r.expert[base + j], gi, r.slot[base + j], g, c) * h + q];
        o[q] = (float)sum;
      }
    }
  free(w);
  free_routes(&r);
}

void k_moe_combine_backward(float *dye, float *dprobs, const float *dy,
                            const float *ye, const float *probs,
                            int64_t g, int64_t s, int64_t h, int64_t e, int64_t k,
                            int64_t c, bool normalize, bool acc) {
  moe_routes r = routes(probs, g, s, e, k, c);
  double *w = scratch((size_t)k, sizeof *w), *a = scratch((size_t)k, sizeof *a);
  if (dye && !acc) memset(dye, 0, (size_t)(e * g * c * h) * sizeof *dye);
  for (int64_t gi = 0; gi < g; gi++)
    for (int64_t t = 0; t < s; t++) {
      int64_t base = (gi * s + t) * k;
      const float *p = probs + (gi * s + t) * e, *d = dy + (gi * s + t) * h;
      double div = choice_weights(w, p, r.expert + base, k, normalize);
      for (int64_t j = 0; j < k; j++) {
        a[j] = 0;
        if (r.slot[base + j] < 0) continue;
        int64_t row = slot_row(r.expert[base + j], gi, r.slot[base + j], g, c) * h;
        for (int64_t q = 0; q < h; q++) {
          a[j] += (double)d[q] * ye[row + q];
          if (dye) dye[row + q] += (float)(w[j] * d[q]);
        }
      }
      if (!dprobs) continue;
      float *dp = dprobs + (gi * s + t) * e;
      if (!acc) memset(dp, 0, (size_t)e * sizeof *dp);
      /* y = sum_j p_j a_j / div: with normalize, div is the sum of the p_j */
      double mix = 0;
      for (int64_t j = 0; j < k; j++) mix += w[j] * a[j];
      for (int64_t j = 0; j < k; j++) {
        double g_j = a[j] / div;
        if (normalize) g_j -= mix / div;
        dp[r.expert[base + j]] += (float)g_j;
      }
    }
  free(w);
  free(a);
  free_routes(&r);
}

void k_expert_matmul(float *out, const float *x, const float *w,
                     int64_t e, int64_t m, int64_t k, int64_t n, bool acc) {
  for (int64_t x0 = 0; x0 < e; x0++) k_matmul(out + x0 * m * n, x + x0 * m * k, w + x0 * k * n, m, k, n, acc);
}

void k_expert_matmul_backward(float *dx, float *dw, const float *dout,
                              const float *x, const float *w,
                              int64_t e, int64_t m, int64_t k, int64_t n, bool acc) {
  for (int64_t x0 = 0; x0 < e; x0++)
    k_matmul_backward(dx ? dx + x0 * m * k : NULL, dw ? dw + x0 * k * n : NULL, dout + x0 * m * n,
                      x + x0 * m * k, w + x0 * k * n, m, k, n, acc);
}

/* Per group: the share of its k s choices that picked each expert (f) and
 * the mean probability of each expert (pm), both [e]. */
static void aux_stats(double *f, double *pm, const float *probs, const int32_t *expert,
                      int64_t s, int64_t e, int64_t k) {
  for (int64_t x = 0; x < e; x++) f[x] = pm[x] = 0;
  for (int64_t t = 0; t < s; t++) {
    for (int64_t j = 0; j < k; j++) f[expert[t * k + j]] += 1.0 / (double)(s * k);
    for (int64_t x = 0; x < e; x++) pm[x] += probs[t * e + x] / (double)s;
  }
}

double k_moe_aux_loss(const float *probs, int64_t g, int64_t s, int64_t e, int64_t k,
                      int64_t g_total, double alpha) {
  moe_routes r = routes(probs, g, s, e, k, s * k);
  double *f = scratch((size_t)e, sizeof *f), *pm = scratch((size_t)e, sizeof *pm), loss = 0;
  for (int64_t gi = 0; gi < g; gi++) {
    aux_stats(f, pm, probs + gi * s * e, r.expert + gi * s * k, s, e, k);
    for (int64_t x = 0; x < e; x++) loss += f[x] * pm[x];
  }
  free(f);
  free(pm);
  free_routes(&r);
  return alpha * (double)e * loss / (double)g_total;
}

void k_moe_aux_loss_backward(float *dprobs, const float *probs, int64_t g, int64_t s,
                             int64_t e, int64_t k, int64_t g_total, double alpha,
                             double dloss, bool acc) {
  if (!dprobs) return;
  moe_routes r = routes(probs, g, s, e, k, s * k);
  double *f = scratch((size_t)e, sizeof *f), *pm = scratch((size_t)e, sizeof *pm);
  for (int64_t gi = 0; gi < g; gi++) {
    aux_stats(f, pm, probs + gi * s * e, r.expert + gi * s * k, s, e, k);
    for (int64_t t = 0; t < s; t++)
      for (int64_t x = 0; x < e; x++)
        put(&dprobs[(gi * s + t) * e + x], dloss * alpha * (double)e * f[x] / ((double)s * (double)g_total), acc);
  }
  free(f);
  free(pm);
  free_routes(&r);
}

/* ---- optimizers ---------------------------------------------------------- */

/* The arithmetic follows PyTorch's single-tensor implementations in f32,
 * with the scalar factors computed in double and rounded to f32 once. */

void k_sgd(float *p, float *buf, const float *g, int64_t n,
           double lr, double momentum, double weight_decay) {
  float lr_f = (float)lr, mom = (float)momentum, wd = (float)weight_decay;
  assert(momentum == 0 || buf);
  for (int64_t i = 0; i < n; i++) {
    float d = g[i];
    if (weight_decay != 0) d += wd * p[i];
    if (momentum != 0) {
      buf[i] = buf[i] * mom + d;
      d = buf[i];
    }
    p[i] -= lr_f * d;
  }
}

void k_adamw(float *p, float *m, float *v, const float *g, int64_t n,
             int64_t step, double lr, double beta1, double beta2, double eps,
             double weight_decay) {
  assert(step >= 1);
  float decay = (float)(1.0 - lr * weight_decay);
  float w1 = (float)(1.0 - beta1), b2 = (float)beta2, w2 = (float)(1.0 - beta2);
  double bc1 = 1.0 - pow(beta1, (double)step), bc2 = 1.0 - pow(beta2, (double)step);
  float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2), eps_f = (float)eps;
  for (int64_t i = 0; i < n; i++) {
    float gi = g[i];
    p[i] *= decay;
    /* torch.lerp: the form depends on the weight, for accuracy near 1 */
    m[i] = w1 < 0.5f ? m[i] + w1 * (gi - m[i]) : gi - (gi - m[i]) * (1.0f - w1);
    v[i] = v[i] * b2 + w2 * gi * gi;
    float denom = sqrtf(v[i]) / bc2_sqrt + eps_f;
    p[i] -= step_size * (m[i] / denom);
  }
}

/* ---- random numbers ------------------------------------------------------ */

#define GOLDEN 0x9e3779b97f4a7c15ULL   /* 2^64 / golden ratio, splitmix64's increment */

/* splitmix64's output function. */
static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* Output i of a splitmix64 generator whose state starts at a key made from
 * seed and stream. */
uint64_t k_rng_u64(uint64_t seed, uint64_t stream, uint64_t i) {
  uint64_t key = mix64(mix64(seed + GOLDEN) + (stream + 1) * GOLDEN);
  return mix64(key + (i + 1) * GOLDEN);
}

double k_rng_normal(uint64_t seed, uint64_t stream, uint64_t i) {
  uint64_t h1 = k_rng_u64(seed, stream, i), h2 = mix64(h1 + GOLDEN);
  double u1 = ((double)(h1 >> 11) + 0.5) * 0x1p-53;   /* in (0, 1) */
  double u2 = (double)(h2 >> 11) * 0x1p-53;           /* in [0, 1) */
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void k_init_normal(float *out, int64_t first, int64_t n, uint64_t seed,
                   uint64_t stream, double mean, double std) {
  for (int64_t j = 0; j < n; j++)
    out[j] = (float)(mean + std * k_rng_normal(seed, stream, (uint64_t)(first + j)));
}

void k_init_normal_box(float *out, int rank, const int64_t *shape,
                       const int64_t *lo, const int64_t *hi, uint64_t seed,
                       uint64_t stream, double mean, double std) {
  if (rank == 0) {
    k_init_normal(out, 0, 1, seed, stream, mean, std);
    return;
  }
  int64_t runs = 1, len = hi[rank - 1] - lo[rank - 1];
  for (int d = 0; d < rank - 1; d++) runs *= hi[d] - lo[d];
  if (runs <= 0 || len <= 0) return;
  /* run r: the outer indices are r in mixed radix over the box's extents */
  for (int64_t r = 0; r < runs; r++) {
    int64_t rem = r, flat = lo[rank - 1], stride = shape[rank - 1];
    for (int d = rank - 2; d >= 0; d--) {
      int64_t ext = hi[d] - lo[d];
      flat += (lo[d] + rem % ext) * stride;
      rem /= ext;
      stride *= shape[d];
    }
    k_init_normal(out + r * len, flat, len, seed, stream, mean, std);
  }
}

/* ---- attention without a mask (encoder self-attention, cross-attention) -- */

void k_attention(float *out, const float *q, const float *k, const float *v,
                 int64_t b, int64_t sq, int64_t sk, int64_t n, int64_t dh) {
  int64_t c = n * dh;
  float *p = scratch((size_t)(sq * sk), sizeof *p);
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t hd = 0; hd < n; hd++) {
      int64_t qoff = bi * sq * c + hd * dh, kvoff = bi * sk * c + hd * dh;
      head_view hv = {q + qoff, k + kvoff, v + kvoff, c, c, c, sq, sk, 0, true};
      head_forward(out + qoff, c, &hv, dh, p);
    }
  free(p);
}

void k_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                          const float *q, const float *k, const float *v,
                          int64_t b, int64_t sq, int64_t sk, int64_t n, int64_t dh, bool acc) {
  if (!dq && !dk && !dv) return;
  int64_t c = n * dh;
  float beta = acc ? 1 : 0;
  float *p = scratch((size_t)(2 * sq * sk), sizeof *p);
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t hd = 0; hd < n; hd++) {
      int64_t qoff = bi * sq * c + hd * dh, kvoff = bi * sk * c + hd * dh;
      head_view hv = {q + qoff, k + kvoff, v + kvoff, c, c, c, sq, sk, 0, true};
      head_backward(dq ? dq + qoff : NULL, c, dk ? dk + kvoff : NULL, c, beta,
                    dv ? dv + kvoff : NULL, c, beta, beta, dout + qoff, c, &hv, dh, p, p + sq * sk);
    }
  free(p);
}
