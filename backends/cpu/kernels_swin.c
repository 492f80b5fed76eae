/* kernels_swin.c - the Swin Transformer's kernels; see kernels_swin.h. */
#include "kernels_swin.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "weft/arena.h"

static inline void put(float *dst, double v, bool acc) {
  *dst = acc ? *dst + (float)v : (float)v;
}

/* ---- patches --------------------------------------------------------------- */

/* Index into x[b][c][hn p][wn p] of element (ch, u, v) of patch (bi, i, j). */
static inline int64_t pix(int64_t bi, int64_t ch, int64_t i, int64_t j, int64_t u, int64_t v,
                          int64_t c, int64_t hn, int64_t wn, int64_t p) {
  return ((bi * c + ch) * hn * p + i * p + u) * wn * p + j * p + v;
}

void k_patchify(float *out, const float *x, int64_t b, int64_t c, int64_t hn, int64_t wn, int64_t p) {
  int64_t k = c * p * p;
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t i = 0; i < hn; i++)
      for (int64_t j = 0; j < wn; j++) {
        float *o = out + ((bi * hn + i) * wn + j) * k;
        for (int64_t ch = 0; ch < c; ch++)
          for (int64_t u = 0; u < p; u++)
            for (int64_t v = 0; v < p; v++) o[(ch * p + u) * p + v] = x[pix(bi, ch, i, j, u, v, c, hn, wn, p)];
      }
}

void k_patchify_backward(float *dx, const float *dout, int64_t b, int64_t c, int64_t hn, int64_t wn,
                         int64_t p, bool acc) {
  if (!dx) return;
  int64_t k = c * p * p;
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t i = 0; i < hn; i++)
      for (int64_t j = 0; j < wn; j++) {
        const float *d = dout + ((bi * hn + i) * wn + j) * k;
        for (int64_t ch = 0; ch < c; ch++)
          for (int64_t u = 0; u < p; u++)
            for (int64_t v = 0; v < p; v++) put(&dx[pix(bi, ch, i, j, u, v, c, hn, wn, p)], d[(ch * p + u) * p + v], acc);
      }
}

/* ---- windows ---------------------------------------------------------------- */

/* For each token of the windows, in window order, its row of the image:
 * rows[((bi hn + i) wn + j) s + u ws + v]. */
static int64_t *window_rows(int64_t b, int64_t hn, int64_t wn, int64_t ws, int64_t shift) {
  int64_t h = hn * ws, w = wn * ws, n = b * h * w;
  int64_t *rows = malloc((size_t)(n ? n : 1) * sizeof *rows);
  if (!rows) weft_oom();
  int64_t sh = h ? ((shift % h) + h) % h : 0, sw = w ? ((shift % w) + w) % w : 0;
  int64_t t = 0;
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t i = 0; i < hn; i++)
      for (int64_t j = 0; j < wn; j++)
        for (int64_t u = 0; u < ws; u++)
          for (int64_t v = 0; v < ws; v++) {
            int64_t y = (i * ws + u + sh) % h, xx = (j * ws + v + sw) % w;
            rows[t++] = (bi * h + y) * w + xx;
          }
  return rows;
}

/* out[t] = x[rows[t]] (gather) or out[rows[t]] = x[t] (scatter), rows of c. */
static void permute_rows(float *out, const float *x, const int64_t *rows, int64_t n, int64_t c, bool scatter,
                         bool acc) {
  for (int64_t t = 0; t < n; t++) {
    float *o = out + (scatter ? rows[t] : t) * c;
    const float *i = x + (scatter ? t : rows[t]) * c;
    if (acc) for (int64_t q = 0; q < c; q++) o[q] += i[q];
    else memcpy(o, i, (size_t)c * sizeof *o);
  }
}

/* The rows of x gathered into windows (scatter false) or scattered back
 * from them (scatter true). */
static void window_move(float *out, const float *x, int64_t b, int64_t hn, int64_t wn, int64_t ws, int64_t c,
                        int64_t shift, bool scatter, bool acc) {
  int64_t *rows = window_rows(b, hn, wn, ws, shift);
  permute_rows(out, x, rows, b * hn * wn * ws * ws, c, scatter, acc);
  free(rows);
}

void k_window_partition(float *out, const float *x, int64_t b, int64_t hn, int64_t wn, int64_t ws,
                        int64_t c, int64_t shift) {
  window_move(out, x, b, hn, wn, ws, c, shift, false, false);
}

void k_window_partition_backward(float *dx, const float *dout, int64_t b, int64_t hn, int64_t wn,
                                 int64_t ws, int64_t c, int64_t shift, bool acc) {
  if (dx) window_move(dx, dout, b, hn, wn, ws, c, shift, true, acc);
}

void k_window_reverse(float *out, const float *x, int64_t b, int64_t hn, int64_t wn, int64_t ws,
                      int64_t c, int64_t shift) {
  window_move(out, x, b, hn, wn, ws, c, shift, true, false);
}

void k_window_reverse_backward(float *dx, const float *dout, int64_t b, int64_t hn, int64_t wn,
                               int64_t ws, int64_t c, int64_t shift, bool acc) {
  if (dx) window_move(dx, dout, b, hn, wn, ws, c, shift, false, acc);
}

/* ---- window attention ------------------------------------------------------- */

/* The region of the shifted image a coordinate falls in: 0 below n - ws, 1
 * below n - shift, 2 after (one region when there is no shift). */
static int region_of(int64_t y, int64_t n, int64_t ws, int64_t shift) {
  if (shift <= 0) return 0;
  return y < n - ws ? 0 : y < n - shift ? 1 : 2;
}

/* Per token of window (i, j): its region label; per pair: the table row. */
static void window_labels(int *label, const swin_attn_dims *z, int64_t i, int64_t j) {
  int64_t h = z->hn_all * z->ws, w = z->wn_all * z->ws;
  for (int64_t u = 0; u < z->ws; u++)
    for (int64_t v = 0; v < z->ws; v++)
      label[u * z->ws + v] = 3 * region_of((z->hn0 + i) * z->ws + u, h, z->ws, z->shift) +
                             region_of((z->wn0 + j) * z->ws + v, w, z->ws, z->shift);
}

static int64_t *relative_index(int64_t ws) {
  int64_t s = ws * ws;
  int64_t *idx = malloc((size_t)(s * s) * sizeof *idx);
  if (!idx) weft_oom();
  for (int64_t a = 0; a < s; a++)
    for (int64_t c = 0; c < s; c++)
      idx[a * s + c] = (a / ws - c / ws + ws - 1) * (2 * ws - 1) + (a % ws - c % ws + ws - 1);
  return idx;
}

/* p[s][s]: the probabilities of one window and head, 0 where masked. */
static void window_probs(double *p, const float *q, const float *k, int64_t ld, const float *table,
                         int64_t heads, int64_t hd, const int64_t *idx, const int *label, int64_t s, int64_t dh) {
  double scale = 1.0 / sqrt((double)dh);
  for (int64_t a = 0; a < s; a++) {
    double *row = p + a * s, mx = -INFINITY;
    for (int64_t c = 0; c < s; c++) {
      if (label[a] != label[c]) continue;
      double dot = 0;
      for (int64_t e = 0; e < dh; e++) dot += (double)q[a * ld + e] * k[c * ld + e];
      row[c] = dot * scale + table[idx[a * s + c] * heads + hd];
      if (row[c] > mx) mx = row[c];
    }
    double sum = 0;
    for (int64_t c = 0; c < s; c++) {
      row[c] = label[a] == label[c] ? exp(row[c] - mx) : 0;
      sum += row[c];
    }
    for (int64_t c = 0; c < s; c++) row[c] /= sum;
  }
}

void k_window_attention(float *out, const float *qkv, const float *table, const swin_attn_dims *z) {
  int64_t ws = z->ws, s = ws * ws, dh = z->dh, nh = z->heads, c = nh * dh;
  int64_t *idx = relative_index(ws);
  int *label = malloc((size_t)s * sizeof *label);
  double *p = malloc((size_t)(s * s) * sizeof *p);
  if (!label || !p) weft_oom();
  for (int64_t bi = 0; bi < z->b; bi++)
    for (int64_t i = 0; i < z->hn; i++)
      for (int64_t j = 0; j < z->wn; j++) {
        window_labels(label, z, i, j);
        int64_t win = (bi * z->hn + i) * z->wn + j;
        const float *base = qkv + win * s * 3 * c;
        float *o = out + win * s * c;
        for (int64_t hd = 0; hd < nh; hd++) {
          const float *q = base + hd * dh, *k = q + c, *v = q + 2 * c;
          window_probs(p, q, k, 3 * c, table, nh, hd, idx, label, s, dh);
          for (int64_t a = 0; a < s; a++)
            for (int64_t e = 0; e < dh; e++) {
              double acc = 0;
              for (int64_t x = 0; x < s; x++) acc += p[a * s + x] * v[x * 3 * c + e];
              o[a * c + hd * dh + e] = (float)acc;
            }
        }
      }
  free(idx), free(label), free(p);
}

void k_window_attention_backward(float *dqkv, float *dtable, const float *dout, const float *qkv,
                                 const float *table, const swin_attn_dims *z, bool acc) {
  if (!dqkv && !dtable) return;
  int64_t ws = z->ws, s = ws * ws, dh = z->dh, nh = z->heads, c = nh * dh;
  int64_t r = (2 * ws - 1) * (2 * ws - 1);
  int64_t *idx = relative_index(ws);
  int *label = malloc((size_t)s * sizeof *label);
  double *p = malloc((size_t)(2 * s * s) * sizeof *p), *ds = p + s * s;
  double *dt = calloc((size_t)(r * nh), sizeof *dt);
  if (!label || !p || !dt) weft_oom();
  double scale = 1.0 / sqrt((double)dh);
  for (int64_t bi = 0; bi < z->b; bi++)
    for (int64_t i = 0; i < z->hn; i++)
      for (int64_t j = 0; j < z->wn; j++) {
        window_labels(label, z, i, j);
        int64_t win = (bi * z->hn + i) * z->wn + j;
        const float *base = qkv + win * s * 3 * c;
        const float *dob = dout + win * s * c;
        float *db = dqkv ? dqkv + win * s * 3 * c : NULL;
        for (int64_t hd = 0; hd < nh; hd++) {
          const float *q = base + hd * dh, *k = q + c, *v = q + 2 * c, *dO = dob + hd * dh;
          window_probs(p, q, k, 3 * c, table, nh, hd, idx, label, s, dh);
          /* dP = dO v^T, dS = P (dP - rowsum(P dP)) */
          for (int64_t a = 0; a < s; a++) {
            double dot = 0;
            for (int64_t x = 0; x < s; x++) {
              double d = 0;
              if (p[a * s + x] != 0)
                for (int64_t e = 0; e < dh; e++) d += (double)dO[a * c + e] * v[x * 3 * c + e];
              ds[a * s + x] = d;
              dot += p[a * s + x] * d;
            }
            for (int64_t x = 0; x < s; x++) {
              ds[a * s + x] = p[a * s + x] * (ds[a * s + x] - dot);
              dt[idx[a * s + x] * nh + hd] += ds[a * s + x];
            }
          }
          if (!db) continue;
          float *dq = db + hd * dh, *dk = dq + c, *dv = dq + 2 * c;
          for (int64_t a = 0; a < s; a++)
            for (int64_t e = 0; e < dh; e++) {
              double gq = 0, gk = 0, gv = 0;
              for (int64_t x = 0; x < s; x++) {
                gq += ds[a * s + x] * k[x * 3 * c + e];
                gk += ds[x * s + a] * q[x * 3 * c + e];
                gv += p[x * s + a] * dO[x * c + e];
              }
              put(&dq[a * 3 * c + e], gq * scale, acc);
              put(&dk[a * 3 * c + e], gk * scale, acc);
              put(&dv[a * 3 * c + e], gv, acc);
            }
        }
      }
  if (dtable)
    for (int64_t x = 0; x < r * nh; x++) put(&dtable[x], dt[x], acc);
  free(idx), free(label), free(p), free(dt);
}

/* ---- patch merging and pooling ---------------------------------------------- */

void k_patch_merge(float *out, const float *x, int64_t b, int64_t hn, int64_t wn, int64_t c) {
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t i = 0; i < hn; i++)
      for (int64_t j = 0; j < wn; j++)
        for (int64_t q = 0; q < 4; q++) {
          int64_t y = 2 * i + (q & 1), xx = 2 * j + (q >> 1);
          memcpy(out + ((bi * hn + i) * wn + j) * 4 * c + q * c, x + ((bi * 2 * hn + y) * 2 * wn + xx) * c,
                 (size_t)c * sizeof *out);
        }
}

void k_patch_merge_backward(float *dx, const float *dout, int64_t b, int64_t hn, int64_t wn, int64_t c,
                            bool acc) {
  if (!dx) return;
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t i = 0; i < hn; i++)
      for (int64_t j = 0; j < wn; j++)
        for (int64_t q = 0; q < 4; q++) {
          int64_t y = 2 * i + (q & 1), xx = 2 * j + (q >> 1);
          const float *d = dout + ((bi * hn + i) * wn + j) * 4 * c + q * c;
          float *o = dx + ((bi * 2 * hn + y) * 2 * wn + xx) * c;
          for (int64_t e = 0; e < c; e++) put(&o[e], d[e], acc);
        }
}

void k_mean_pool(float *out, const float *x, int64_t b, int64_t hw, int64_t c, int64_t count, bool acc) {
  double *sum = calloc((size_t)(c ? c : 1), sizeof *sum);
  if (!sum) weft_oom();
  for (int64_t bi = 0; bi < b; bi++) {
    memset(sum, 0, (size_t)c * sizeof *sum);
    for (int64_t t = 0; t < hw; t++)
      for (int64_t e = 0; e < c; e++) sum[e] += x[(bi * hw + t) * c + e];
    for (int64_t e = 0; e < c; e++) put(&out[bi * c + e], sum[e] / (double)count, acc);
  }
  free(sum);
}

void k_mean_pool_backward(float *dx, const float *dout, int64_t b, int64_t hw, int64_t c, int64_t count,
                          bool acc) {
  if (!dx) return;
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t t = 0; t < hw; t++)
      for (int64_t e = 0; e < c; e++) put(&dx[(bi * hw + t) * c + e], dout[bi * c + e] / (double)count, acc);
}
