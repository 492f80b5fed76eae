/* test_kernels.c - the CPU backend's kernels (backends/cpu/kernels.c):
 * forwards against naive references in double, every backward against
 * central differences of those references, accumulation, sharded embedding
 * and cross entropy, the optimizers against PyTorch's formulas, and init. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "cpu/kernels_swin.h"

/* ---- inputs -------------------------------------------------------------- */

enum { SEED = 20240611 };

static float *alloc_f(int64_t n) {
  float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
  assert_non_null(p);
  return p;
}

static double *alloc_d(int64_t n) {
  double *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
  assert_non_null(p);
  return p;
}

static float *filled(int64_t n, float v) {
  float *p = alloc_f(n);
  for (int64_t i = 0; i < n; i++) p[i] = v;
  return p;
}

/* Random normal values; each caller passes its own stream. */
static float *randn(int64_t n, uint64_t stream, double std) {
  float *p = alloc_f(n);
  k_init_normal(p, 0, n, SEED, stream, 0, std);
  return p;
}

static double *to_double(const float *x, int64_t n) {
  double *d = alloc_d(n);
  for (int64_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

static float *copy_f(const float *x, int64_t n) {
  float *p = alloc_f(n);
  memcpy(p, x, (size_t)n * sizeof *p);
  return p;
}

static double max_abs(const double *x, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
  return m;
}

/* |got - want| <= tol * (|want| + max |want|): relative, with a floor at the
 * scale of the tensor for elements near zero. */
static void expect_close(const char *what, const float *got, const double *want,
                         int64_t n, double tol) {
  double scale = max_abs(want, n);
  for (int64_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - want[i]);
    if (!(err <= tol * (fabs(want[i]) + scale)))
      fail_msg("%s[%lld] = %.9g, want %.9g (tolerance %g)", what, (long long)i,
               (double)got[i], want[i], tol);
  }
}

static void expect_same(const char *what, const float *got, const float *want, int64_t n) {
  if (memcmp(got, want, (size_t)n * sizeof *got) != 0)
    for (int64_t i = 0; i < n; i++)
      if (memcmp(&got[i], &want[i], sizeof *got) != 0)
        fail_msg("%s[%lld] = %.9g, want exactly %.9g", what, (long long)i,
                 (double)got[i], (double)want[i]);
}

/* ---- references and fixtures --------------------------------------------- */

/* Sizes and settings of one operator instance; each op reads its fields. */
typedef struct op_args {
  int64_t m, k, n;                  /* matrix sizes; rows (m) and width (n) */
  int64_t b, s, heads, dh, g, r;    /* sequences and attention */
  int64_t v_lo, v_local, total;     /* vocabulary shard; loss normaliser */
  int64_t pos0;
  double eps, base;
  const int32_t *ids;               /* token ids or labels */
  int64_t e, topk, cap;             /* mixture of experts: experts, choices, capacity */
  bool normalize;
  double alpha;
  int64_t t;                        /* attention without a mask: keys */
  const swin_attn_dims *swin;       /* Swin Transformer: window attention */
} op_args;

typedef struct fixture fixture;
/* The reference forward in double, from the inputs in[] to out[]. */
typedef void (*ref_fn)(const op_args *a, double *const *in, double *out);
/* The kernel's forward into y (a loss writes its value to y[0]). */
typedef void (*fw_fn)(const fixture *f, float *y);
/* The kernel's backward: d[i] the gradient of input i, or NULL. */
typedef void (*bw_fn)(const fixture *f, float *const *d, bool acc);

enum { MAX_IN = 4 };

/* An operator, its inputs (in float for the kernel, the same values in
 * double for the reference) and the gradient of its output. */
struct fixture {
  const char *name;
  op_args a;
  int nin;
  float *x[MAX_IN];
  double *xd[MAX_IN];
  int64_t len[MAX_IN];
  int64_t ny;
  float *dy;
  double *dyd;
  ref_fn ref;
  fw_fn fw;
  bw_fn bw;
};

static uint64_t next_stream = 1;

/* A fixture with random inputs of the given lengths (0 ends the list). */
static fixture make(const char *name, op_args a, int64_t ny, ref_fn ref, fw_fn fw,
                    bw_fn bw, const int64_t *lens) {
  fixture f = {.name = name, .a = a, .ny = ny, .ref = ref, .fw = fw, .bw = bw};
  for (int i = 0; i < MAX_IN && lens[i] > 0; i++) {
    f.len[i] = lens[i];
    f.x[i] = randn(lens[i], next_stream++, 1.0);
    f.xd[i] = to_double(f.x[i], lens[i]);
    f.nin++;
  }
  f.dy = randn(ny, next_stream++, 1.0);
  f.dyd = to_double(f.dy, ny);
  return f;
}

static void release(fixture *f) {
  for (int i = 0; i < f->nin; i++) {
    free(f->x[i]);
    free(f->xd[i]);
  }
  free(f->dy);
  free(f->dyd);
}

/* sum(dy * ref(in)): the scalar whose gradient the backward computes. */
static double project(const fixture *f, double *out) {
  memset(out, 0, (size_t)f->ny * sizeof *out);
  f->ref(&f->a, f->xd, out);
  double sum = 0;
  for (int64_t i = 0; i < f->ny; i++) sum += f->dyd[i] * out[i];
  return sum;
}

/* The gradient of input `which` against central differences of the double
 * reference: |g - fd| <= tol (|fd| + 0.01 max |fd|), so that a gradient off
 * by a factor, transposed or misplaced fails, and a zero gradient fails. */
static void check_grad(const fixture *f, int which, const float *g, double tol) {
  int64_t n = f->len[which];
  double *fd = alloc_d(n), *out = alloc_d(f->ny), *x = f->xd[which];
  for (int64_t j = 0; j < n; j++) {
    double x0 = x[j], h = 1e-5 * fmax(1.0, fabs(x0));
    x[j] = x0 + h;
    double up = project(f, out);
    x[j] = x0 - h;
    double down = project(f, out);
    x[j] = x0;
    fd[j] = (up - down) / (2 * h);
  }
  double scale = max_abs(fd, n);
  if (!(scale > 0)) fail_msg("%s: the gradient of input %d is zero", f->name, which);
  for (int64_t j = 0; j < n; j++)
    if (!(fabs(g[j] - fd[j]) <= tol * (fabs(fd[j]) + 0.01 * scale)))
      fail_msg("%s: d input %d [%lld] = %.9g, finite differences give %.9g",
               f->name, which, (long long)j, (double)g[j], fd[j]);
  free(fd);
  free(out);
}

/* Everything about one operator: the forward against the reference (and
 * overwriting whatever its output held), the backward against finite
 * differences, each gradient alone, and accumulation. */
static void check_op(fixture *f, double fwd_tol, double grad_tol) {
  float *y = filled(f->ny, NAN), *y0 = filled(f->ny, 0);
  f->fw(f, y);
  f->fw(f, y0);
  expect_same(f->name, y, y0, f->ny);
  double *want = alloc_d(f->ny);
  f->ref(&f->a, f->xd, want);
  expect_close(f->name, y, want, f->ny, fwd_tol);

  float *g[MAX_IN] = {0};
  for (int i = 0; i < f->nin; i++) g[i] = filled(f->len[i], NAN);
  f->bw(f, g, false);
  for (int i = 0; i < f->nin; i++) check_grad(f, i, g[i], grad_tol);

  for (int i = 0; i < f->nin; i++) {
    float *d[MAX_IN] = {0};
    d[i] = filled(f->len[i], NAN);
    f->bw(f, d, false);
    expect_same(f->name, d[i], g[i], f->len[i]);
    free(d[i]);
  }

  float *d[MAX_IN] = {0}, *before[MAX_IN] = {0};
  for (int i = 0; i < f->nin; i++) {
    d[i] = randn(f->len[i], next_stream++, 1.0);
    before[i] = copy_f(d[i], f->len[i]);
  }
  f->bw(f, d, true);
  for (int i = 0; i < f->nin; i++) {
    for (int64_t j = 0; j < f->len[i]; j++) {
      double want_j = (double)before[i][j] + g[i][j];
      if (!(fabs(d[i][j] - want_j) <= 1e-6 * (fabs(before[i][j]) + fabs(g[i][j]))))
        fail_msg("%s: accumulated d input %d [%lld] = %.9g, want %.9g", f->name, i,
                 (long long)j, (double)d[i][j], want_j);
    }
    free(d[i]);
    free(before[i]);
    free(g[i]);
  }
  free(y);
  free(y0);
  free(want);
}

/* ---- matrix products ----------------------------------------------------- */

static void ref_matmul(const op_args *a, double *const *in, double *out) {
  for (int64_t i = 0; i < a->m; i++)
    for (int64_t j = 0; j < a->n; j++) {
      double s = 0;
      for (int64_t p = 0; p < a->k; p++) s += in[0][i * a->k + p] * in[1][p * a->n + j];
      out[i * a->n + j] = s;
    }
}

static void ref_matmul_t(const op_args *a, double *const *in, double *out) {
  for (int64_t i = 0; i < a->m; i++)
    for (int64_t j = 0; j < a->n; j++) {
      double s = 0;
      for (int64_t p = 0; p < a->k; p++) s += in[0][i * a->k + p] * in[1][j * a->k + p];
      out[i * a->n + j] = s;
    }
}

static void ref_linear(const op_args *a, double *const *in, double *out) {
  ref_matmul(a, in, out);
  for (int64_t i = 0; i < a->m; i++)
    for (int64_t j = 0; j < a->n; j++) out[i * a->n + j] += in[2][j];
}

static void fw_matmul(const fixture *f, float *y) {
  k_matmul(y, f->x[0], f->x[1], f->a.m, f->a.k, f->a.n, false);
}
static void bw_matmul(const fixture *f, float *const *d, bool acc) {
  k_matmul_backward(d[0], d[1], f->dy, f->x[0], f->x[1], f->a.m, f->a.k, f->a.n, acc);
}
static void fw_matmul_t(const fixture *f, float *y) {
  k_matmul_t(y, f->x[0], f->x[1], f->a.m, f->a.k, f->a.n, false);
}
static void bw_matmul_t(const fixture *f, float *const *d, bool acc) {
  k_matmul_t_backward(d[0], d[1], f->dy, f->x[0], f->x[1], f->a.m, f->a.k, f->a.n, acc);
}
static void fw_linear(const fixture *f, float *y) {
  k_linear(y, f->x[0], f->x[1], f->x[2], f->a.m, f->a.k, f->a.n, false);
}
static void bw_linear(const fixture *f, float *const *d, bool acc) {
  k_linear_backward(d[0], d[1], d[2], f->dy, f->x[0], f->x[1], f->a.m, f->a.k, f->a.n, acc);
}

static void test_matmul(void **state) {
  (void)state;
  int64_t sizes[][3] = {{3, 5, 4}, {1, 7, 2}, {6, 1, 3}, {17, 33, 9}};
  for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
    int64_t m = sizes[c][0], k = sizes[c][1], n = sizes[c][2];
    op_args a = {.m = m, .k = k, .n = n};
    fixture f = make("matmul", a, m * n, ref_matmul, fw_matmul, bw_matmul,
                     (int64_t[]){m * k, k * n, 0});
    check_op(&f, 1e-6, 1e-3);
    release(&f);
    f = make("matmul_t", a, m * n, ref_matmul_t, fw_matmul_t, bw_matmul_t,
             (int64_t[]){m * k, n * k, 0});
    check_op(&f, 1e-6, 1e-3);
    release(&f);
    f = make("linear", a, m * n, ref_linear, fw_linear, bw_linear,
             (int64_t[]){m * k, k * n, n, 0});
    check_op(&f, 1e-6, 1e-3);
    release(&f);
  }
}

/* Forwards with a reduction add into their output with acc; linear without
 * bias is the product alone. */
static void test_matmul_forward_acc(void **state) {
  (void)state;
  int64_t m = 4, k = 6, n = 5;
  float *a = randn(m * k, 901, 1), *b = randn(k * n, 902, 1), *bt = alloc_f(n * k);
  float *bias = randn(n, 903, 1);
  for (int64_t i = 0; i < k; i++)
    for (int64_t j = 0; j < n; j++) bt[j * k + i] = b[i * n + j];
  float *c = filled(m * n, NAN), *ct = filled(m * n, NAN), *y = filled(m * n, NAN);
  k_matmul(c, a, b, m, k, n, false);
  k_matmul_t(ct, a, bt, m, k, n, false);
  k_linear(y, a, b, NULL, m, k, n, false);
  double *cd = to_double(c, m * n);
  expect_close("matmul_t vs matmul", ct, cd, m * n, 1e-6);
  expect_same("linear without bias", y, c, m * n);

  float *r = randn(m * n, 904, 1);
  double *want = alloc_d(m * n), *want_b = alloc_d(m * n);
  for (int64_t i = 0; i < m * n; i++) {
    want[i] = (double)r[i] + c[i];
    want_b[i] = want[i] + bias[i % n];
  }
  float *acc = copy_f(r, m * n);
  k_matmul(acc, a, b, m, k, n, true);
  expect_close("matmul acc", acc, want, m * n, 1e-6);
  memcpy(acc, r, (size_t)(m * n) * sizeof *acc);
  k_matmul_t(acc, a, bt, m, k, n, true);
  expect_close("matmul_t acc", acc, want, m * n, 1e-6);
  memcpy(acc, r, (size_t)(m * n) * sizeof *acc);
  k_linear(acc, a, b, bias, m, k, n, true);
  expect_close("linear acc", acc, want_b, m * n, 1e-6);

  /* a reduction split in two parts, the bias with the first only */
  float *a0 = alloc_f(m * 2), *a1 = alloc_f(m * (k - 2)), *part = filled(m * n, NAN);
  for (int64_t i = 0; i < m; i++) {
    memcpy(a0 + i * 2, a + i * k, 2 * sizeof *a);
    memcpy(a1 + i * (k - 2), a + i * k + 2, (size_t)(k - 2) * sizeof *a);
  }
  float *ref_y = alloc_f(m * n);
  k_linear(ref_y, a, b, bias, m, k, n, false);
  k_linear(part, a0, b, bias, m, 2, n, false);
  k_linear(part, a1, b + 2 * n, NULL, m, k - 2, n, true);
  double *ref_yd = to_double(ref_y, m * n);
  expect_close("linear by parts", part, ref_yd, m * n, 1e-6);
  free(a); free(b); free(bt); free(bias); free(c); free(ct); free(y); free(r);
  free(want); free(want_b); free(acc); free(a0); free(a1); free(part); free(ref_y);
  free(ref_yd); free(cd);
}

/* Empty sizes: a product over k = 0 is zero; acc leaves the output alone. */
static void test_matmul_empty(void **state) {
  (void)state;
  float a[1] = {1}, b[1] = {1}, c[6], dc[6] = {1, 2, 3, 4, 5, 6}, da[1] = {7};
  for (int i = 0; i < 6; i++) c[i] = NAN;
  k_matmul(c, a, b, 2, 0, 3, false);
  for (int i = 0; i < 6; i++) assert_true(c[i] == 0);
  for (int i = 0; i < 6; i++) c[i] = 5;
  k_matmul_t(c, a, b, 2, 0, 3, true);
  for (int i = 0; i < 6; i++) assert_true(c[i] == 5);
  k_matmul(c, a, b, 0, 4, 3, false);   /* no rows: nothing to write */
  k_matmul_backward(da, NULL, dc, a, b, 2, 0, 3, false);
  assert_true(da[0] == 7);
}

/* ---- embeddings ---------------------------------------------------------- */

static void ref_embedding(const op_args *a, double *const *in, double *out) {
  for (int64_t t = 0; t < a->m; t++) {
    int64_t row = a->ids[t] - a->v_lo;
    for (int64_t j = 0; j < a->n; j++)
      out[t * a->n + j] = row >= 0 && row < a->v_local ? in[0][row * a->n + j] : 0;
  }
}
static void fw_embedding(const fixture *f, float *y) {
  k_embedding(y, f->a.ids, f->x[0], f->a.m, f->a.n, f->a.v_lo, f->a.v_local, false);
}
static void bw_embedding(const fixture *f, float *const *d, bool acc) {
  k_embedding_backward(d[0], f->dy, f->a.ids, f->a.m, f->a.n, f->a.v_lo, f->a.v_local, acc);
}

static void test_embedding(void **state) {
  (void)state;
  /* ids repeat (the backward adds), and a shard [3, 8) misses some */
  static const int32_t ids[] = {4, 0, 9, 4, 7, 3, 4, 8, 1};
  int64_t t = 9, h = 5;
  op_args whole = {.m = t, .n = h, .v_lo = 0, .v_local = 10, .ids = ids};
  fixture f = make("embedding", whole, t * h, ref_embedding, fw_embedding, bw_embedding,
                   (int64_t[]){10 * h, 0});
  check_op(&f, 0, 1e-6);
  release(&f);
  op_args shard = {.m = t, .n = h, .v_lo = 3, .v_local = 5, .ids = ids};
  f = make("embedding shard", shard, t * h, ref_embedding, fw_embedding, bw_embedding,
           (int64_t[]){5 * h, 0});
  check_op(&f, 0, 1e-6);
  release(&f);
}

/* The shards of a vocabulary split sum to the whole embedding (an executor's
 * all-reduce), and their table gradients are the rows of the whole's. */
static void test_embedding_shards(void **state) {
  (void)state;
  static const int32_t ids[] = {5, 9, 0, 3, 3, 6, 2, 9, 4, 7, 1, 8};
  int64_t t = 12, h = 3, v = 10;
  static const int64_t lo[] = {0, 4, 7, 10};
  float *table = randn(v * h, 910, 1), *dout = randn(t * h, 911, 1);
  float *whole = filled(t * h, NAN), *sum = filled(t * h, NAN);
  k_embedding(whole, ids, table, t, h, 0, v, false);
  for (int p = 0; p < 3; p++)
    k_embedding(sum, ids, table + lo[p] * h, t, h, lo[p], lo[p + 1] - lo[p], p > 0);
  expect_same("embedding shards summed", sum, whole, t * h);

  float *dwhole = filled(v * h, NAN), *dshard = filled(v * h, NAN);
  k_embedding_backward(dwhole, dout, ids, t, h, 0, v, false);
  for (int p = 0; p < 3; p++)
    k_embedding_backward(dshard + lo[p] * h, dout, ids, t, h, lo[p], lo[p + 1] - lo[p], false);
  expect_same("embedding shard gradients", dshard, dwhole, v * h);
  /* token 3 occurs twice: its row is the sum of both output gradients */
  for (int64_t j = 0; j < h; j++) assert_true(dwhole[3 * h + j] == dout[3 * h + j] + dout[4 * h + j]);
  free(table); free(dout); free(whole); free(sum); free(dwhole); free(dshard);
}

static void ref_add_position(const op_args *a, double *const *in, double *out) {
  int64_t plane = a->s * a->n;
  for (int64_t b = 0; b < a->b; b++)
    for (int64_t j = 0; j < plane; j++) out[b * plane + j] = in[0][b * plane + j] + in[1][j];
}
static void fw_add_position(const fixture *f, float *y) {
  k_add_position(y, f->x[0], f->x[1], f->a.b, f->a.s, f->a.n);
}
static void bw_add_position(const fixture *f, float *const *d, bool acc) {
  k_add_position_backward(d[0], d[1], f->dy, f->a.b, f->a.s, f->a.n, acc);
}

static void test_add_position(void **state) {
  (void)state;
  op_args a = {.b = 3, .s = 4, .n = 5};
  fixture f = make("add_position", a, 60, ref_add_position, fw_add_position, bw_add_position,
                   (int64_t[]){60, 20, 0});
  check_op(&f, 1e-7, 1e-6);
  release(&f);
}

/* ---- normalisation ------------------------------------------------------- */

static void ref_norm(const op_args *a, double *const *in, double *out, bool rms) {
  int64_t h = a->n;
  for (int64_t i = 0; i < a->m; i++) {
    const double *x = in[0] + i * h;
    double mean = 0, var = 0;
    if (!rms) {
      for (int64_t j = 0; j < h; j++) mean += x[j];
      mean /= (double)h;
    }
    for (int64_t j = 0; j < h; j++) var += (x[j] - mean) * (x[j] - mean);
    var /= (double)h;
    for (int64_t j = 0; j < h; j++)
      out[i * h + j] = (x[j] - mean) / sqrt(var + a->eps) * in[1][j] + (rms ? 0 : in[2][j]);
  }
}
static void ref_layernorm(const op_args *a, double *const *in, double *out) {
  ref_norm(a, in, out, false);
}
static void ref_rmsnorm(const op_args *a, double *const *in, double *out) {
  ref_norm(a, in, out, true);
}
static void fw_layernorm(const fixture *f, float *y) {
  k_layernorm(y, f->x[0], f->x[1], f->x[2], f->a.m, f->a.n, f->a.eps);
}
static void bw_layernorm(const fixture *f, float *const *d, bool acc) {
  k_layernorm_backward(d[0], d[1], d[2], f->dy, f->x[0], f->x[1], f->a.m, f->a.n, f->a.eps, acc);
}
static void fw_rmsnorm(const fixture *f, float *y) {
  k_rmsnorm(y, f->x[0], f->x[1], f->a.m, f->a.n, f->a.eps);
}
static void bw_rmsnorm(const fixture *f, float *const *d, bool acc) {
  k_rmsnorm_backward(d[0], d[1], f->dy, f->x[0], f->x[1], f->a.m, f->a.n, f->a.eps, acc);
}

static void test_norms(void **state) {
  (void)state;
  op_args a = {.m = 5, .n = 7, .eps = 1e-5};
  fixture f = make("layernorm", a, 35, ref_layernorm, fw_layernorm, bw_layernorm,
                   (int64_t[]){35, 7, 7, 0});
  check_op(&f, 1e-6, 1e-3);
  release(&f);
  f = make("rmsnorm", a, 35, ref_rmsnorm, fw_rmsnorm, bw_rmsnorm, (int64_t[]){35, 7, 0});
  check_op(&f, 1e-6, 1e-3);
  release(&f);
  a.eps = 0.5;   /* eps large enough to matter */
  f = make("layernorm eps", a, 35, ref_layernorm, fw_layernorm, bw_layernorm,
           (int64_t[]){35, 7, 7, 0});
  check_op(&f, 1e-6, 1e-3);
  release(&f);
}

static void test_norm_values(void **state) {
  (void)state;
  float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 1, 1}, b[4] = {0}, y[4];
  k_layernorm(y, x, w, b, 1, 4, 0);   /* mean 2.5, variance 1.25 */
  double want[4] = {-1.5 / sqrt(1.25), -0.5 / sqrt(1.25), 0.5 / sqrt(1.25), 1.5 / sqrt(1.25)};
  expect_close("layernorm [1 2 3 4]", y, want, 4, 1e-7);
  k_rmsnorm(y, x, w, 1, 4, 0);        /* mean square 7.5 */
  double want_rms[4] = {1 / sqrt(7.5), 2 / sqrt(7.5), 3 / sqrt(7.5), 4 / sqrt(7.5)};
  expect_close("rmsnorm [1 2 3 4]", y, want_rms, 4, 1e-7);
}

/* ---- activations --------------------------------------------------------- */

static void ref_gelu(const op_args *a, double *const *in, double *out) {
  for (int64_t i = 0; i < a->n; i++) {
    double x = in[0][i];
    out[i] = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  }
}
static void ref_silu(const op_args *a, double *const *in, double *out) {
  for (int64_t i = 0; i < a->n; i++) out[i] = in[0][i] / (1 + exp(-in[0][i]));
}
static void ref_swiglu(const op_args *a, double *const *in, double *out) {
  for (int64_t i = 0; i < a->n; i++) out[i] = in[0][i] / (1 + exp(-in[0][i])) * in[1][i];
}
static void fw_gelu(const fixture *f, float *y) { k_gelu(y, f->x[0], f->a.n); }
static void bw_gelu(const fixture *f, float *const *d, bool acc) {
  k_gelu_backward(d[0], f->dy, f->x[0], f->a.n, acc);
}
static void fw_silu(const fixture *f, float *y) { k_silu(y, f->x[0], f->a.n); }
static void bw_silu(const fixture *f, float *const *d, bool acc) {
  k_silu_backward(d[0], f->dy, f->x[0], f->a.n, acc);
}
static void fw_swiglu(const fixture *f, float *y) { k_swiglu(y, f->x[0], f->x[1], f->a.n); }
static void bw_swiglu(const fixture *f, float *const *d, bool acc) {
  k_swiglu_backward(d[0], d[1], f->dy, f->x[0], f->x[1], f->a.n, acc);
}

static void test_activations(void **state) {
  (void)state;
  op_args a = {.n = 40};
  fixture f = make("gelu", a, 40, ref_gelu, fw_gelu, bw_gelu, (int64_t[]){40, 0});
  for (int i = 0; i < 40; i++) f.xd[0][i] = f.x[0][i] *= 2.5f;   /* into the tails */
  check_op(&f, 1e-6, 1e-3);
  release(&f);
  f = make("silu", a, 40, ref_silu, fw_silu, bw_silu, (int64_t[]){40, 0});
  for (int i = 0; i < 40; i++) f.xd[0][i] = f.x[0][i] *= 3.0f;
  check_op(&f, 1e-6, 1e-3);
  release(&f);
  f = make("swiglu", a, 40, ref_swiglu, fw_swiglu, bw_swiglu, (int64_t[]){40, 40, 0});
  check_op(&f, 1e-6, 1e-3);
  release(&f);
}

/* Values of the formulas, computed independently. */
static void test_activation_values(void **state) {
  (void)state;
  float x[6] = {1, -1, 0.5f, 3, -3, 0}, y[6];
  double gelu[6] = {0.8411919906082768, -0.15880800939172324, 0.34571400982514394,
                    2.996362607918227, -0.0036373920817729943, 0};
  k_gelu(y, x, 6);
  for (int i = 0; i < 6; i++)
    if (fabs(y[i] - gelu[i]) > 1e-6) fail_msg("gelu(%g) = %.9g, want %.9g", x[i], y[i], gelu[i]);
  k_silu(y, x, 6);
  assert_true(fabs(y[0] - 0.7310585786300049) < 1e-7);
  assert_true(fabs(y[1] + 0.2689414213699951) < 1e-7);
  assert_true(y[5] == 0);
  float up[6] = {2, 2, 2, 2, 2, 2};
  k_swiglu(y, x, up, 6);
  assert_true(fabs(y[0] - 2 * 0.7310585786300049) < 2e-7);
  /* silu of large negative values underflows to zero, not NaN */
  float big[2] = {-200, 200}, out[2], dout[2], one[2] = {1, 1};
  k_silu(out, big, 2);
  k_silu_backward(dout, one, big, 2, false);
  assert_true(out[0] == 0 && out[1] == 200 && dout[0] == 0 && dout[1] == 1);
}

/* ---- rotary -------------------------------------------------------------- */

/* Hugging Face Llama's form: x * cos + rotate_half(x) * sin, with cos and
 * sin of cat(freqs, freqs) and rotate_half(x) = cat(-x2, x1). */
static void ref_rotary(const op_args *a, double *const *in, double *out) {
  int64_t dh = a->dh, half = dh / 2;
  double *rot = alloc_d(dh), *cs = alloc_d(dh), *sn = alloc_d(dh);
  for (int64_t b = 0; b < a->b; b++)
    for (int64_t s = 0; s < a->s; s++) {
      for (int64_t i = 0; i < dh; i++) {
        double inv_freq = 1.0 / pow(a->base, (double)(2 * (i % half)) / (double)dh);
        cs[i] = cos((double)(a->pos0 + s) * inv_freq);
        sn[i] = sin((double)(a->pos0 + s) * inv_freq);
      }
      for (int64_t hd = 0; hd < a->heads; hd++) {
        int64_t off = ((b * a->s + s) * a->heads + hd) * dh;
        const double *x = in[0] + off;
        for (int64_t i = 0; i < half; i++) {
          rot[i] = -x[i + half];
          rot[i + half] = x[i];
        }
        for (int64_t i = 0; i < dh; i++) out[off + i] = x[i] * cs[i] + rot[i] * sn[i];
      }
    }
  free(rot);
  free(cs);
  free(sn);
}
static void fw_rotary(const fixture *f, float *y) {
  k_rotary(y, f->x[0], f->a.b, f->a.s, f->a.heads, f->a.dh, f->a.pos0, f->a.base);
}
static void bw_rotary(const fixture *f, float *const *d, bool acc) {
  k_rotary_backward(d[0], f->dy, f->a.b, f->a.s, f->a.heads, f->a.dh, f->a.pos0, f->a.base, acc);
}

static void test_rotary(void **state) {
  (void)state;
  op_args a = {.b = 2, .s = 5, .heads = 3, .dh = 8, .pos0 = 0, .base = 10000};
  fixture f = make("rotary", a, 240, ref_rotary, fw_rotary, bw_rotary, (int64_t[]){240, 0});
  check_op(&f, 1e-6, 1e-4);
  release(&f);
  a.pos0 = 37;
  a.base = 100;
  f = make("rotary pos0", a, 240, ref_rotary, fw_rotary, bw_rotary, (int64_t[]){240, 0});
  check_op(&f, 1e-6, 1e-4);
  release(&f);
}

static void test_rotary_values(void **state) {
  (void)state;
  /* dh 4: element 0 pairs with 2 (rotate_half), angle pos; 1 with 3, angle
   * pos / 100 */
  float x[4] = {1, 0, 0, 0}, y[4];
  k_rotary(y, x, 1, 1, 1, 4, 2, 10000);
  double want[4] = {cos(2.0), 0, sin(2.0), 0};
  expect_close("rotary (1,0,0,0) at 2", y, want, 4, 1e-7);
  float x2[4] = {0, 1, 0, 0};
  k_rotary(y, x2, 1, 1, 1, 4, 2, 10000);
  double want2[4] = {0, cos(0.02), 0, sin(0.02)};
  expect_close("rotary (0,1,0,0) at 2", y, want2, 4, 1e-7);

  /* position 0 is the identity; a sequence split with pos0 is the whole */
  int64_t b = 2, s = 6, heads = 2, dh = 6, w = heads * dh;
  float *in = randn(b * s * w, 920, 1), *whole = alloc_f(b * s * w), *part = alloc_f(b * s * w);
  k_rotary(whole, in, b, s, heads, dh, 0, 10000);
  for (int64_t bi = 0; bi < b; bi++) expect_same("rotary at 0", whole + bi * s * w, in + bi * s * w, w);
  float *lo = alloc_f(b * 2 * w), *hi = alloc_f(b * 4 * w);
  for (int64_t bi = 0; bi < b; bi++) {
    memcpy(lo + bi * 2 * w, in + bi * s * w, (size_t)(2 * w) * sizeof *in);
    memcpy(hi + bi * 4 * w, in + (bi * s + 2) * w, (size_t)(4 * w) * sizeof *in);
  }
  k_rotary(lo, lo, b, 2, heads, dh, 0, 10000);
  k_rotary(hi, hi, b, 4, heads, dh, 2, 10000);
  for (int64_t bi = 0; bi < b; bi++) {
    memcpy(part + bi * s * w, lo + bi * 2 * w, (size_t)(2 * w) * sizeof *in);
    memcpy(part + (bi * s + 2) * w, hi + bi * 4 * w, (size_t)(4 * w) * sizeof *in);
  }
  expect_same("rotary by sequence parts", part, whole, b * s * w);
  free(in); free(whole); free(part); free(lo); free(hi);
}

/* ---- attention ----------------------------------------------------------- */

/* softmax over j <= i of q_i . k_j / sqrt(dh), times v, by plain loops. */
static void naive_head(double *out, int64_t ldo, const double *q, int64_t ldq,
                       const double *k, const double *v, int64_t ldkv,
                       int64_t s, int64_t dh) {
  double *w = alloc_d(s);
  for (int64_t i = 0; i < s; i++) {
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j <= i; j++) {
      double dot = 0;
      for (int64_t d = 0; d < dh; d++) dot += q[i * ldq + d] * k[j * ldkv + d];
      w[j] = dot / sqrt((double)dh);
      mx = fmax(mx, w[j]);
    }
    for (int64_t j = 0; j <= i; j++) sum += w[j] = exp(w[j] - mx);
    for (int64_t d = 0; d < dh; d++) {
      double o = 0;
      for (int64_t j = 0; j <= i; j++) o += w[j] / sum * v[j * ldkv + d];
      out[i * ldo + d] = o;
    }
  }
  free(w);
}

static void ref_causal_attention(const op_args *a, double *const *in, double *out) {
  int64_t c = a->heads * a->dh;
  for (int64_t b = 0; b < a->b; b++)
    for (int64_t hd = 0; hd < a->heads; hd++) {
      const double *q = in[0] + b * a->s * 3 * c + hd * a->dh;
      /* k and v share a row stride here, 3c */
      naive_head(out + b * a->s * c + hd * a->dh, c, q, 3 * c, q + c, q + 2 * c, 3 * c,
                 a->s, a->dh);
    }
}

/* Query head i * r + j uses kv head i (repeat_kv). */
static void ref_gqa_attention(const op_args *a, double *const *in, double *out) {
  int64_t cq = a->g * a->r * a->dh, ckv = a->g * a->dh;
  for (int64_t b = 0; b < a->b; b++)
    for (int64_t hq = 0; hq < a->g * a->r; hq++) {
      int64_t kv = hq / a->r;
      naive_head(out + b * a->s * cq + hq * a->dh, cq, in[0] + b * a->s * cq + hq * a->dh, cq,
                 in[1] + b * a->s * ckv + kv * a->dh, in[2] + b * a->s * ckv + kv * a->dh, ckv,
                 a->s, a->dh);
    }
}
static void fw_causal_attention(const fixture *f, float *y) {
  k_causal_attention(y, f->x[0], f->a.b, f->a.s, f->a.heads, f->a.dh);
}
static void bw_causal_attention(const fixture *f, float *const *d, bool acc) {
  k_causal_attention_backward(d[0], f->dy, f->x[0], f->a.b, f->a.s, f->a.heads, f->a.dh, acc);
}
static void fw_gqa_attention(const fixture *f, float *y) {
  k_gqa_attention(y, f->x[0], f->x[1], f->x[2], f->a.b, f->a.s, f->a.s, 0, f->a.g, f->a.r, f->a.dh);
}
static void bw_gqa_attention(const fixture *f, float *const *d, bool acc) {
  k_gqa_attention_backward(d[0], d[1], d[2], f->dy, f->x[0], f->x[1], f->x[2], f->a.b,
                           f->a.s, f->a.s, 0, f->a.g, f->a.r, f->a.dh, acc);
}

static void test_causal_attention(void **state) {
  (void)state;
  op_args a = {.b = 2, .s = 5, .heads = 2, .dh = 4};
  fixture f = make("causal_attention", a, 2 * 5 * 8, ref_causal_attention, fw_causal_attention,
                   bw_causal_attention, (int64_t[]){2 * 5 * 24, 0});
  check_op(&f, 1e-5, 1e-3);
  release(&f);
  a = (op_args){.b = 1, .s = 19, .heads = 3, .dh = 6};
  f = make("causal_attention s19", a, 19 * 18, ref_causal_attention, fw_causal_attention,
           bw_causal_attention, (int64_t[]){19 * 54, 0});
  check_op(&f, 1e-5, 1e-3);
  release(&f);
}

/* A longer sequence, forward only, and the first position sees only itself. */
static void test_attention_long(void **state) {
  (void)state;
  int64_t b = 2, s = 200, heads = 3, dh = 16, c = heads * dh;
  float *qkv = randn(b * s * 3 * c, 930, 1), *out = filled(b * s * c, NAN);
  k_causal_attention(out, qkv, b, s, heads, dh);
  double *in = to_double(qkv, b * s * 3 * c), *want = alloc_d(b * s * c);
  op_args a = {.b = b, .s = s, .heads = heads, .dh = dh};
  ref_causal_attention(&a, &in, want);
  expect_close("causal_attention s200", out, want, b * s * c, 1e-5);
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t j = 0; j < c; j++)
      assert_true(fabs(out[bi * s * c + j] - qkv[bi * s * 3 * c + 2 * c + j]) <= 1e-6);

  /* scores in the thousands: the softmax must take the row's maximum out;
   * f32 scores that large carry absolute errors near 1e-3 */
  for (int64_t i = 0; i < b * s * 3 * c; i++) in[i] = qkv[i] *= 30.0f;
  k_causal_attention(out, qkv, b, s, heads, dh);
  ref_causal_attention(&a, &in, want);
  expect_close("causal_attention, large scores", out, want, b * s * c, 1e-3);
  free(qkv); free(out); free(in); free(want);
}

static void test_gqa_attention(void **state) {
  (void)state;
  op_args a = {.b = 2, .s = 4, .g = 2, .r = 3, .dh = 4};
  fixture f = make("gqa_attention", a, 2 * 4 * 24, ref_gqa_attention, fw_gqa_attention,
                   bw_gqa_attention, (int64_t[]){2 * 4 * 24, 2 * 4 * 8, 2 * 4 * 8, 0});
  check_op(&f, 1e-5, 1e-3);
  release(&f);
  a = (op_args){.b = 1, .s = 7, .g = 1, .r = 2, .dh = 6};
  f = make("gqa_attention g1", a, 7 * 12, ref_gqa_attention, fw_gqa_attention,
           bw_gqa_attention, (int64_t[]){7 * 12, 7 * 6, 7 * 6, 0});
  check_op(&f, 1e-5, 1e-3);
  release(&f);
}

/* With r = 1, grouped-query attention is causal attention on q|k|v. */
static void test_gqa_is_mha(void **state) {
  (void)state;
  int64_t b = 2, s = 6, n = 3, dh = 4, c = n * dh;
  float *q = randn(b * s * c, 940, 1), *k = randn(b * s * c, 941, 1), *v = randn(b * s * c, 942, 1);
  float *qkv = alloc_f(b * s * 3 * c), *o1 = alloc_f(b * s * c), *o2 = alloc_f(b * s * c);
  for (int64_t row = 0; row < b * s; row++) {
    memcpy(qkv + row * 3 * c, q + row * c, (size_t)c * sizeof *q);
    memcpy(qkv + row * 3 * c + c, k + row * c, (size_t)c * sizeof *q);
    memcpy(qkv + row * 3 * c + 2 * c, v + row * c, (size_t)c * sizeof *q);
  }
  k_causal_attention(o1, qkv, b, s, n, dh);
  k_gqa_attention(o2, q, k, v, b, s, s, 0, n, 1, dh);
  double *o1d = to_double(o1, b * s * c);
  expect_close("gqa r=1 vs causal_attention", o2, o1d, b * s * c, 1e-6);
  free(q); free(k); free(v); free(qkv); free(o1); free(o2); free(o1d);
}

/* Context parallelism: the queries cut into parts, each against all keys,
 * give the rows of the whole attention, and the parts' gradients of the
 * keys and values sum to the whole's. */
static void test_gqa_query_parts(void **state) {
  (void)state;
  int64_t b = 2, s = 6, g = 2, r = 2, dh = 4, cq = g * r * dh, ckv = g * dh;
  float *q = randn(b * s * cq, 950, 1), *k = randn(b * s * ckv, 951, 1), *v = randn(b * s * ckv, 952, 1);
  float *dout = randn(b * s * cq, 953, 1);
  float *whole = alloc_f(b * s * cq), *dq = alloc_f(b * s * cq), *dk = alloc_f(b * s * ckv), *dv = alloc_f(b * s * ckv);
  k_gqa_attention(whole, q, k, v, b, s, s, 0, g, r, dh);
  k_gqa_attention_backward(dq, dk, dv, dout, q, k, v, b, s, s, 0, g, r, dh, false);
  /* three parts of two positions each */
  int64_t part = 2, np = s / part;
  float *pq = alloc_f(b * part * cq), *po = alloc_f(b * part * cq), *pdo = alloc_f(b * part * cq), *pdq = alloc_f(b * part * cq);
  float *sdk = alloc_f(b * s * ckv), *sdv = alloc_f(b * s * ckv);
  double *rows = malloc(sizeof(double) * (size_t)(b * part * cq)), *rdq = malloc(sizeof(double) * (size_t)(b * part * cq));
  for (int64_t i = 0; i < np; i++) {
    for (int64_t bi = 0; bi < b; bi++) {
      memcpy(pq + bi * part * cq, q + (bi * s + i * part) * cq, sizeof(float) * (size_t)(part * cq));
      memcpy(pdo + bi * part * cq, dout + (bi * s + i * part) * cq, sizeof(float) * (size_t)(part * cq));
      for (int64_t x = 0; x < part * cq; x++) {
        rows[bi * part * cq + x] = whole[(bi * s + i * part) * cq + x];
        rdq[bi * part * cq + x] = dq[(bi * s + i * part) * cq + x];
      }
    }
    k_gqa_attention(po, pq, k, v, b, part, s, i * part, g, r, dh);
    expect_close("query part against the whole's rows", po, rows, b * part * cq, 1e-6);
    /* dq is the part's own; dk and dv add up over the parts */
    memset(pdq, 0, sizeof(float) * (size_t)(b * part * cq));
    k_gqa_attention_backward(pdq, sdk, sdv, pdo, pq, k, v, b, part, s, i * part, g, r, dh, i > 0);
    expect_close("query part's dq against the whole's rows", pdq, rdq, b * part * cq, 1e-5);
  }
  double *wdk = to_double(dk, b * s * ckv), *wdv = to_double(dv, b * s * ckv);
  expect_close("the parts' dk summed", sdk, wdk, b * s * ckv, 1e-5);
  expect_close("the parts' dv summed", sdv, wdv, b * s * ckv, 1e-5);
  free(q); free(k); free(v); free(dout); free(whole); free(dq); free(dk); free(dv);
  free(pq); free(po); free(pdo); free(pdq); free(sdk); free(sdv); free(rows); free(rdq); free(wdk); free(wdv);
}

/* ---- softmax, add -------------------------------------------------------- */

static void ref_softmax(const op_args *a, double *const *in, double *out) {
  for (int64_t i = 0; i < a->m; i++) {
    const double *x = in[0] + i * a->n;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < a->n; j++) mx = fmax(mx, x[j]);
    for (int64_t j = 0; j < a->n; j++) sum += exp(x[j] - mx);
    for (int64_t j = 0; j < a->n; j++) out[i * a->n + j] = exp(x[j] - mx) / sum;
  }
}
static void fw_softmax(const fixture *f, float *y) { k_softmax(y, f->x[0], f->a.m, f->a.n); }
static void bw_softmax(const fixture *f, float *const *d, bool acc) {
  k_softmax_backward(d[0], f->dy, f->x[0], f->a.m, f->a.n, acc);
}
static void ref_add(const op_args *a, double *const *in, double *out) {
  for (int64_t i = 0; i < a->n; i++) out[i] = in[0][i] + in[1][i];
}
static void fw_add(const fixture *f, float *y) { k_add(y, f->x[0], f->x[1], f->a.n); }
static void bw_add(const fixture *f, float *const *d, bool acc) {
  k_add_backward(d[0], d[1], f->dy, f->a.n, acc);
}

static void test_softmax_add(void **state) {
  (void)state;
  op_args a = {.m = 4, .n = 9};
  fixture f = make("softmax", a, 36, ref_softmax, fw_softmax, bw_softmax, (int64_t[]){36, 0});
  for (int i = 0; i < 36; i++) f.xd[0][i] = f.x[0][i] *= 4.0f;
  check_op(&f, 1e-6, 1e-3);
  release(&f);
  a.n = 30;
  f = make("add", a, 30, ref_add, fw_add, bw_add, (int64_t[]){30, 30, 0});
  check_op(&f, 1e-7, 1e-6);
  release(&f);

  /* large logits do not overflow */
  float x[3] = {1000, 1000, -1000}, y[3];
  k_softmax(y, x, 1, 3);
  assert_true(y[0] == 0.5f && y[1] == 0.5f && y[2] == 0);
  float acc[3] = {1, 2, 3}, dx[3] = {1, 1, 1};
  k_axpy(acc, -2, dx, 3);
  assert_true(acc[0] == -1 && acc[1] == 0 && acc[2] == 1);
}

/* Forwards marked "in place" give the same result with y == x. */
static void test_in_place(void **state) {
  (void)state;
  int64_t n = 48;
  float *x = randn(n, 950, 1), *x2 = randn(n, 951, 1), *w = randn(8, 952, 1), *bias = randn(8, 953, 1);
  float *tab = randn(24, 954, 1), *y = alloc_f(n), *z = alloc_f(n);
#define SAME(call_y, call_z, what)       \
  do {                                   \
    memcpy(z, x, (size_t)n * sizeof *z); \
    call_y;                              \
    call_z;                              \
    expect_same(what, z, y, n);          \
  } while (0)
  SAME(k_gelu(y, x, n), k_gelu(z, z, n), "gelu in place");
  SAME(k_silu(y, x, n), k_silu(z, z, n), "silu in place");
  SAME(k_swiglu(y, x, x2, n), k_swiglu(z, z, x2, n), "swiglu in place (gate)");
  SAME(k_swiglu(y, x2, x, n), k_swiglu(z, x2, z, n), "swiglu in place (up)");
  SAME(k_add(y, x, x2, n), k_add(z, z, x2, n), "add in place");
  SAME(k_add_position(y, x, tab, 2, 3, 8), k_add_position(z, z, tab, 2, 3, 8), "add_position in place");
  SAME(k_layernorm(y, x, w, bias, 6, 8, 1e-5), k_layernorm(z, z, w, bias, 6, 8, 1e-5), "layernorm in place");
  SAME(k_rmsnorm(y, x, w, 6, 8, 1e-5), k_rmsnorm(z, z, w, 6, 8, 1e-5), "rmsnorm in place");
  SAME(k_softmax(y, x, 6, 8), k_softmax(z, z, 6, 8), "softmax in place");
  SAME(k_rotary(y, x, 2, 3, 2, 4, 5, 10000), k_rotary(z, z, 2, 3, 2, 4, 5, 10000), "rotary in place");
#undef SAME
  free(x); free(x2); free(w); free(bias); free(tab); free(y); free(z);
}

/* ---- losses -------------------------------------------------------------- */

static void ref_cross_entropy(const op_args *a, double *const *in, double *out) {
  double loss = 0;
  for (int64_t t = 0; t < a->m; t++) {
    const double *x = in[0] + t * a->n;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < a->n; j++) mx = fmax(mx, x[j]);
    for (int64_t j = 0; j < a->n; j++) sum += exp(x[j] - mx);
    loss += log(sum) + mx - x[a->ids[t]];
  }
  out[0] = loss / (double)a->total;
}
static void fw_cross_entropy(const fixture *f, float *y) {
  y[0] = (float)k_cross_entropy(f->x[0], f->a.ids, f->a.m, f->a.n, f->a.total);
}
static void bw_cross_entropy(const fixture *f, float *const *d, bool acc) {
  k_cross_entropy_backward(d[0], f->x[0], f->a.ids, f->a.m, f->a.n, f->a.total, f->dyd[0], acc);
}
static void ref_mse(const op_args *a, double *const *in, double *out) {
  double sum = 0;
  for (int64_t i = 0; i < a->n; i++) sum += (in[0][i] - in[1][i]) * (in[0][i] - in[1][i]);
  out[0] = sum / (double)a->total;
}
static void fw_mse(const fixture *f, float *y) {
  y[0] = (float)k_mse(f->x[0], f->x[1], f->a.n, f->a.total);
}
static void bw_mse(const fixture *f, float *const *d, bool acc) {
  k_mse_backward(d[0], d[1], f->x[0], f->x[1], f->a.n, f->a.total, f->dyd[0], acc);
}

static void test_losses(void **state) {
  (void)state;
  static const int32_t labels[] = {3, 0, 6, 6, 1};
  op_args a = {.m = 5, .n = 7, .total = 5, .ids = labels};
  fixture f = make("cross_entropy", a, 1, ref_cross_entropy, fw_cross_entropy, bw_cross_entropy,
                   (int64_t[]){35, 0});
  for (int i = 0; i < 35; i++) f.xd[0][i] = f.x[0][i] *= 3.0f;
  check_op(&f, 1e-6, 1e-3);
  release(&f);
  a.total = 20;   /* a share of a bigger batch */
  f = make("cross_entropy share", a, 1, ref_cross_entropy, fw_cross_entropy, bw_cross_entropy,
           (int64_t[]){35, 0});
  check_op(&f, 1e-6, 1e-3);
  release(&f);
  a = (op_args){.n = 23, .total = 23};
  f = make("mse", a, 1, ref_mse, fw_mse, bw_mse, (int64_t[]){23, 23, 0});
  check_op(&f, 1e-6, 1e-4);
  release(&f);
}

static void test_loss_values(void **state) {
  (void)state;
  /* uniform logits: log V, whatever the labels */
  float logits[2 * 8] = {0};
  for (int i = 0; i < 8; i++) logits[8 + i] = 5;
  int32_t labels[2] = {2, 7};
  assert_true(fabs(k_cross_entropy(logits, labels, 2, 8, 2) - log(8.0)) < 1e-12);
  float dl[16];
  k_cross_entropy_backward(dl, logits, labels, 2, 8, 2, 1.0, false);
  assert_true(fabs(dl[0] - 0.0625) < 1e-8 && fabs(dl[2] - (0.125 - 1) / 2) < 1e-8);
  /* one sure label: zero loss */
  float sure[3] = {100, 0, 0};
  int32_t zero = 0;
  assert_true(k_cross_entropy(sure, &zero, 1, 3, 1) < 1e-40);

  /* the shares of a batch split add up to the whole */
  int64_t t = 6, v = 5;
  float *x = randn(t * v, 960, 2);
  int32_t lab[6] = {4, 1, 0, 2, 3, 4};
  double whole = k_cross_entropy(x, lab, t, v, t);
  double parts = k_cross_entropy(x, lab, 2, v, t) + k_cross_entropy(x + 2 * v, lab + 2, 4, v, t);
  assert_true(fabs(whole - parts) <= 1e-12 * whole);
  float *dw = alloc_f(t * v), *dp = alloc_f(t * v);
  k_cross_entropy_backward(dw, x, lab, t, v, t, 1.0, false);
  k_cross_entropy_backward(dp, x, lab, 2, v, t, 1.0, false);
  k_cross_entropy_backward(dp + 2 * v, x + 2 * v, lab + 2, 4, v, t, 1.0, false);
  expect_same("cross_entropy backward by batch parts", dp, dw, t * v);
  float a[2] = {1, 2}, b[2] = {3, -1};   /* (4 + 9) / 2 */
  assert_true(fabs(k_mse(a, b, 2, 2) - 6.5) < 1e-12);
  free(x); free(dw); free(dp);
}

/* A vocabulary split into shards gives the loss and gradients of the whole,
 * combined as the program does: each shard's statistics of every row, the
 * gather of them into [row][shard][3] in vocabulary order, the merge. */
static void check_vocab_shards(int nshards, const int64_t *lo) {
  int64_t t = 7, v = lo[nshards];
  static const int32_t labels[] = {0, 10, 5, 3, 7, 8, 4};
  float *x = randn(t * v, 970 + (uint64_t)nshards, 3);
  double want = k_cross_entropy(x, labels, t, v, t);
  float *dwant = alloc_f(t * v);
  k_cross_entropy_backward(dwant, x, labels, t, v, t, 1.0, false);

  float *part[4], *mine = alloc_f(3 * t), *all = filled(t * 3 * nshards, NAN);
  for (int p = 0; p < nshards; p++) {
    int64_t w = lo[p + 1] - lo[p];
    part[p] = alloc_f(t * w);
    for (int64_t i = 0; i < t; i++) memcpy(part[p] + i * w, x + i * v + lo[p], (size_t)w * sizeof *x);
    k_cross_entropy_stats(mine, part[p], labels, t, lo[p], w);
    for (int64_t i = 0; i < t; i++) memcpy(all + (i * nshards + p) * 3, mine + 3 * i, 3 * sizeof *mine);
  }
  /* the maxima merged are those of the whole rows */
  float *mx = alloc_f(t), *sum = alloc_f(t), *tgt = alloc_f(t), *wmax = filled(t, -INFINITY);
  k_cross_entropy_merge(mx, sum, tgt, all, nshards, t);
  for (int64_t i = 0; i < t; i++)
    for (int64_t j = 0; j < v; j++) wmax[i] = fmaxf(wmax[i], x[i * v + j]);
  expect_same("merged maxima", mx, wmax, t);
  for (int64_t i = 0; i < t; i++)
    if (tgt[i] != x[i * v + labels[i]]) fail_msg("%d shards: row %lld's label logit %.9g, not %.9g", nshards,
                                                 (long long)i, (double)tgt[i], (double)x[i * v + labels[i]]);
  double got = k_cross_entropy_combine(mx, sum, tgt, t, t);
  if (!(fabs(got - want) <= 1e-6 * want))
    fail_msg("%d shards: loss %.12g, unsharded %.12g", nshards, got, want);
  double *dwant_d = to_double(dwant, t * v), *dcol = alloc_d(t * v);
  for (int p = 0; p < nshards; p++) {
    int64_t w = lo[p + 1] - lo[p];
    float *d = filled(t * w, NAN);
    k_cross_entropy_shard_backward(d, part[p], labels, mx, sum, t, lo[p], w, t, 1.0, false);
    for (int64_t i = 0; i < t; i++)
      for (int64_t j = 0; j < w; j++) dcol[i * w + j] = dwant_d[i * v + lo[p] + j];
    for (int64_t j = 0; j < t * w; j++)
      if (!(fabs(d[j] - dcol[j]) <= 1e-6 * fabs(dcol[j]) + 1e-9))
        fail_msg("%d shards: shard %d dlogits[%lld] = %.9g, unsharded %.9g", nshards, p,
                 (long long)j, (double)d[j], dcol[j]);
    free(d);
    free(part[p]);
  }
  free(x); free(dwant); free(mine); free(all); free(mx); free(sum); free(tgt); free(wmax);
  free(dwant_d); free(dcol);
}

static void test_cross_entropy_vocab_parallel(void **state) {
  (void)state;
  check_vocab_shards(2, (int64_t[]){0, 6, 11});
  check_vocab_shards(3, (int64_t[]){0, 4, 8, 11});
  check_vocab_shards(3, (int64_t[]){0, 1, 10, 11});
}

/* ---- optimizers ---------------------------------------------------------- */

/* torch.optim.AdamW's documented algorithm, in double. */
static void naive_adamw(double *p, double *m, double *v, const double *g, int64_t n, int64_t t,
                        double lr, double b1, double b2, double eps, double wd) {
  for (int64_t i = 0; i < n; i++) {
    p[i] -= lr * wd * p[i];
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    double mhat = m[i] / (1 - pow(b1, (double)t)), vhat = v[i] / (1 - pow(b2, (double)t));
    p[i] -= lr * mhat / (sqrt(vhat) + eps);
  }
}

static void run_adamw(double lr, double b1, double b2, double eps, double wd, uint64_t stream) {
  int64_t n = 10, steps = 6;
  float *p = randn(n, stream, 0.5), *m = filled(n, 0), *v = filled(n, 0);
  double *pd = to_double(p, n), *md = alloc_d(n), *vd = alloc_d(n);
  for (int64_t t = 1; t <= steps; t++) {
    float *g = randn(n, stream + 100 + (uint64_t)t, 1);
    double *gd = to_double(g, n);
    k_adamw(p, m, v, g, n, t, lr, b1, b2, eps, wd);
    naive_adamw(pd, md, vd, gd, n, t, lr, b1, b2, eps, wd);
    free(g);
    free(gd);
  }
  expect_close("adamw p", p, pd, n, 1e-6);
  expect_close("adamw m", m, md, n, 1e-6);
  expect_close("adamw v", v, vd, n, 1e-6);
  free(p); free(m); free(v); free(pd); free(md); free(vd);
}

/* ---- mixture of experts -------------------------------------------------- */

/* The routing in double, written out plainly: k largest (ties to the lower
 * expert), then slots choice by choice in token order. */
static void ref_route(const op_args *a, const double *probs, int64_t *expert, int64_t *slot) {
  int64_t g = a->g, s = a->s, e = a->e, k = a->topk;
  for (int64_t t = 0; t < g * s; t++) {
    const double *p = probs + t * e;
    bool used[64] = {0};
    for (int64_t j = 0; j < k; j++) {
      int64_t best = -1;
      for (int64_t x = 0; x < e; x++)
        if (!used[x] && (best < 0 || p[x] > p[best])) best = x;
      used[best] = true;
      expert[t * k + j] = best;
    }
  }
  for (int64_t gi = 0; gi < g; gi++) {
    int64_t count[64] = {0};
    for (int64_t j = 0; j < k; j++)
      for (int64_t t = 0; t < s; t++) {
        int64_t at = (gi * s + t) * k + j;
        slot[at] = count[expert[at]] < a->cap ? count[expert[at]]++ : -1;
      }
  }
}

/* in[0] x [g, s, h], in[1] probs [g, s, e] -> out [e, g, c, h] */
static void ref_dispatch(const op_args *a, double *const *in, double *out) {
  int64_t g = a->g, s = a->s, h = a->n, k = a->topk, c = a->cap;
  int64_t expert[512], slot[512];
  ref_route(a, in[1], expert, slot);
  memset(out, 0, (size_t)(a->e * g * c * h) * sizeof *out);
  for (int64_t gi = 0; gi < g; gi++)
    for (int64_t t = 0; t < s; t++)
      for (int64_t j = 0; j < k; j++) {
        int64_t at = (gi * s + t) * k + j;
        if (slot[at] < 0) continue;
        for (int64_t q = 0; q < h; q++)
          out[((expert[at] * g + gi) * c + slot[at]) * h + q] = in[0][(gi * s + t) * h + q];
      }
}

/* in[0] ye [e, g, c, h], in[1] probs [g, s, e] -> out [g, s, h] */
static void ref_combine(const op_args *a, double *const *in, double *out) {
  int64_t g = a->g, s = a->s, h = a->n, k = a->topk, c = a->cap, e = a->e;
  int64_t expert[512], slot[512];
  ref_route(a, in[1], expert, slot);
  for (int64_t t = 0; t < g * s; t++) {
    int64_t gi = t / s;
    double sum = 0;
    for (int64_t j = 0; j < k; j++) sum += in[1][t * e + expert[t * k + j]];
    for (int64_t q = 0; q < h; q++) {
      double y = 0;
      for (int64_t j = 0; j < k; j++) {
        int64_t at = t * k + j;
        if (slot[at] < 0) continue;
        double w = in[1][t * e + expert[at]] / (a->normalize ? sum : 1.0);
        y += w * in[0][((expert[at] * g + gi) * c + slot[at]) * h + q];
      }
      out[t * h + q] = y;
    }
  }
}

/* in[0] x [e, m, k], in[1] w [e, k, n] -> out [e, m, n] */
static void ref_expert_matmul(const op_args *a, double *const *in, double *out) {
  op_args one = *a;
  for (int64_t x = 0; x < a->e; x++) {
    double *part[2] = {in[0] + x * a->m * a->k, in[1] + x * a->k * a->n};
    ref_matmul(&one, part, out + x * a->m * a->n);
  }
}

/* alpha e sum_e f_e P_e per group, the mean over g_total groups */
static void ref_aux(const op_args *a, double *const *in, double *out) {
  int64_t g = a->g, s = a->s, e = a->e, k = a->topk;
  int64_t expert[512], slot[512];
  ref_route(a, in[0], expert, slot);
  double loss = 0;
  for (int64_t gi = 0; gi < g; gi++)
    for (int64_t x = 0; x < e; x++) {
      double f = 0, p = 0;
      for (int64_t t = 0; t < s; t++) {
        for (int64_t j = 0; j < k; j++) f += expert[(gi * s + t) * k + j] == x;
        p += in[0][(gi * s + t) * e + x];
      }
      loss += (f / (double)(s * k)) * (p / (double)s);
    }
  out[0] = a->alpha * (double)e * loss / (double)a->total;
}

static void fw_dispatch(const fixture *f, float *y) {
  const op_args *a = &f->a;
  k_moe_dispatch(y, f->x[0], f->x[1], a->g, a->s, a->n, a->e, a->topk, a->cap);
}
static void fw_combine(const fixture *f, float *y) {
  const op_args *a = &f->a;
  k_moe_combine(y, f->x[0], f->x[1], a->g, a->s, a->n, a->e, a->topk, a->cap, a->normalize);
}
static void bw_combine(const fixture *f, float *const *d, bool acc) {
  const op_args *a = &f->a;
  k_moe_combine_backward(d[0], d[1], f->dy, f->x[0], f->x[1], a->g, a->s, a->n, a->e, a->topk, a->cap,
                         a->normalize, acc);
}
static void fw_expert_matmul(const fixture *f, float *y) {
  k_expert_matmul(y, f->x[0], f->x[1], f->a.e, f->a.m, f->a.k, f->a.n, false);
}
static void bw_expert_matmul(const fixture *f, float *const *d, bool acc) {
  k_expert_matmul_backward(d[0], d[1], f->dy, f->x[0], f->x[1], f->a.e, f->a.m, f->a.k, f->a.n, acc);
}
static void fw_aux(const fixture *f, float *y) {
  const op_args *a = &f->a;
  y[0] = (float)k_moe_aux_loss(f->x[0], a->g, a->s, a->e, a->topk, a->total, a->alpha);
}
static void bw_aux(const fixture *f, float *const *d, bool acc) {
  const op_args *a = &f->a;
  k_moe_aux_loss_backward(d[0], f->x[0], a->g, a->s, a->e, a->topk, a->total, a->alpha, f->dyd[0], acc);
}

/* Input `which` ([rows, e]) replaced by softmax rows of scaled normal
 * values: router probabilities, with gaps between them far above the
 * finite-difference step. */
static void make_probs(fixture *f, int which, int64_t rows, int64_t e) {
  for (int64_t r = 0; r < rows; r++) {
    float *p = f->x[which] + r * f->a.e;
    for (int64_t x = 0; x < e; x++) p[x] *= 2.0f;
    k_softmax(p, p, 1, e);
    for (int64_t x = 0; x < e; x++) f->xd[which][r * e + x] = p[x];
  }
}

static int64_t dropped(const op_args *a, const float *probs) {
  int64_t n = a->g * a->s * a->topk, count = 0;
  int32_t *expert = malloc((size_t)n * sizeof *expert), *slot = malloc((size_t)n * sizeof *slot);
  assert_non_null(expert);
  assert_non_null(slot);
  k_moe_route(expert, slot, probs, a->g, a->s, a->e, a->topk, a->cap);
  for (int64_t i = 0; i < n; i++) count += slot[i] < 0;
  free(expert);
  free(slot);
  return count;
}

static void test_moe_route(void **state) {
  (void)state;
  /* 2 groups of 3 tokens, 3 experts, 2 choices, capacity 2 */
  const float probs[] = {0.5f, 0.3f, 0.2f,  0.6f, 0.1f, 0.3f,  0.45f, 0.1f, 0.45f,
                         0.1f, 0.2f, 0.7f,  0.2f, 0.2f, 0.6f,  0.1f, 0.6f, 0.3f};
  int32_t expert[12], slot[12];
  k_moe_route(expert, slot, probs, 2, 3, 3, 2, 2);
  /* group 0: first choices 0, 0, 0 (a tie goes to the lower expert); the
   * third token's is dropped; second choices 1, 2, 2 */
  const int32_t want_e[] = {0, 1, 0, 2, 0, 2, 2, 1, 2, 0, 1, 2};
  const int32_t want_s[] = {0, 0, 1, 0, -1, 1, 0, 1, 1, 0, 0, -1};
  for (int i = 0; i < 12; i++) {
    if (expert[i] != want_e[i]) fail_msg("expert[%d] = %d, want %d", i, expert[i], want_e[i]);
    if (slot[i] != want_s[i]) fail_msg("slot[%d] = %d, want %d", i, slot[i], want_s[i]);
  }
}

static void test_moe(void **state) {
  (void)state;
  /* capacity 2 drops tokens, 8 keeps all of them */
  int64_t caps[] = {2, 8};
  for (int ci = 0; ci < 2; ci++)
    for (int norm = 0; norm < 2; norm++) {
      op_args a = {.g = 2, .s = 6, .n = 5, .e = 4, .topk = 2, .cap = caps[ci], .normalize = norm};
      int64_t nx = a.g * a.s * a.n, np = a.g * a.s * a.e, ny = a.e * a.g * a.cap * a.n;
      fixture f = make("moe_combine", a, nx, ref_combine, fw_combine, bw_combine, (int64_t[]){ny, np, 0});
      make_probs(&f, 1, a.g * a.s, a.e);
      if (ci == 0) assert_true(dropped(&a, f.x[1]) > 0);
      else assert_int_equal(dropped(&a, f.x[1]), 0);
      check_op(&f, 1e-6, 1e-3);
      release(&f);

      /* dispatch: dx against finite differences, no gradient for probs */
      f = make("moe_dispatch", a, ny, ref_dispatch, fw_dispatch, NULL, (int64_t[]){nx, np, 0});
      make_probs(&f, 1, a.g * a.s, a.e);
      float *y = filled(ny, NAN);
      fw_dispatch(&f, y);
      double *want = alloc_d(ny);
      ref_dispatch(&f.a, f.xd, want);
      expect_close("moe_dispatch", y, want, ny, 1e-7);
      float *dx = filled(nx, NAN);
      k_moe_dispatch_backward(dx, f.dy, f.x[1], a.g, a.s, a.n, a.e, a.topk, a.cap, false);
      check_grad(&f, 0, dx, 1e-4);
      float *dx2 = copy_f(dx, nx);
      k_moe_dispatch_backward(dx2, f.dy, f.x[1], a.g, a.s, a.n, a.e, a.topk, a.cap, true);
      for (int64_t i = 0; i < nx; i++) assert_true(fabsf(dx2[i] - 2 * dx[i]) <= 1e-6f * (1 + fabsf(dx[i])));
      free(y), free(want), free(dx), free(dx2);
      release(&f);
    }

  op_args a = {.g = 3, .s = 5, .e = 4, .topk = 2};
  a.m = a.s * 2, a.k = 6, a.n = 7;
  fixture f = make("expert_matmul", a, a.e * a.m * a.n, ref_expert_matmul, fw_expert_matmul, bw_expert_matmul,
                   (int64_t[]){a.e * a.m * a.k, a.e * a.k * a.n, 0});
  check_op(&f, 1e-6, 1e-3);
  release(&f);

  for (int64_t k = 1; k <= 2; k++) {
    a = (op_args){.g = 3, .s = 5, .e = 4, .topk = k, .total = 3, .alpha = 0.01};
    f = make("moe_aux_loss", a, 1, ref_aux, fw_aux, bw_aux, (int64_t[]){a.g * a.s * a.e, 0});
    make_probs(&f, 0, a.g * a.s, a.e);
    check_op(&f, 1e-6, 1e-4);
    release(&f);
    a.total = 12;   /* a share of more groups */
    f = make("moe_aux_loss share", a, 1, ref_aux, fw_aux, bw_aux, (int64_t[]){a.g * a.s * a.e, 0});
    make_probs(&f, 0, a.g * a.s, a.e);
    check_op(&f, 1e-6, 1e-4);
    release(&f);
  }
}

/* ---- Swin Transformer ----------------------------------------------------- */

/* in[0] x [b][c][hn p][wn p] (m = b, k = c, heads = hn, g = wn, n = p) ->
 * [b][hn][wn][c p p] */
static void ref_patchify(const op_args *a, double *const *in, double *out) {
  int64_t b = a->m, c = a->k, hn = a->heads, wn = a->g, p = a->n, t = 0;
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t i = 0; i < hn; i++)
      for (int64_t j = 0; j < wn; j++)
        for (int64_t ch = 0; ch < c; ch++)
          for (int64_t u = 0; u < p; u++)
            for (int64_t v = 0; v < p; v++)
              out[t++] = in[0][((bi * c + ch) * hn * p + i * p + u) * wn * p + j * p + v];
}
static void fw_patchify(const fixture *f, float *y) {
  k_patchify(y, f->x[0], f->a.m, f->a.k, f->a.heads, f->a.g, f->a.n);
}
static void bw_patchify(const fixture *f, float *const *d, bool acc) {
  k_patchify_backward(d[0], f->dy, f->a.m, f->a.k, f->a.heads, f->a.g, f->a.n, acc);
}

/* torch.roll(x, -shift) then the windows, written as the original does it:
 * the image rolled first, then cut (b = m, hn = heads, wn = g, ws = n,
 * c = k, shift = r). */
static void ref_roll(const op_args *a, const double *x, double *y, int64_t sign) {
  int64_t h = a->heads * a->n, w = a->g * a->n, c = a->k;
  for (int64_t bi = 0; bi < a->m; bi++)
    for (int64_t i = 0; i < h; i++)
      for (int64_t j = 0; j < w; j++)
        for (int64_t e = 0; e < c; e++) {
          int64_t si = ((i + sign * a->r) % h + h) % h, sj = ((j + sign * a->r) % w + w) % w;
          y[((bi * h + i) * w + j) * c + e] = x[((bi * h + si) * w + sj) * c + e];
        }
}
static void ref_window_partition(const op_args *a, double *const *in, double *out) {
  int64_t h = a->heads * a->n, w = a->g * a->n, c = a->k, ws = a->n, t = 0;
  double *rolled = alloc_d(a->m * h * w * c);
  ref_roll(a, in[0], rolled, 1);
  for (int64_t bi = 0; bi < a->m; bi++)
    for (int64_t i = 0; i < a->heads; i++)
      for (int64_t j = 0; j < a->g; j++)
        for (int64_t u = 0; u < ws; u++)
          for (int64_t v = 0; v < ws; v++)
            for (int64_t e = 0; e < c; e++) out[t++] = rolled[((bi * h + i * ws + u) * w + j * ws + v) * c + e];
  free(rolled);
}
static void ref_window_reverse(const op_args *a, double *const *in, double *out) {
  int64_t h = a->heads * a->n, w = a->g * a->n, c = a->k, ws = a->n, t = 0;
  double *grid = alloc_d(a->m * h * w * c);
  for (int64_t bi = 0; bi < a->m; bi++)
    for (int64_t i = 0; i < a->heads; i++)
      for (int64_t j = 0; j < a->g; j++)
        for (int64_t u = 0; u < ws; u++)
          for (int64_t v = 0; v < ws; v++)
            for (int64_t e = 0; e < c; e++) grid[((bi * h + i * ws + u) * w + j * ws + v) * c + e] = in[0][t++];
  ref_roll(a, grid, out, -1);
  free(grid);
}
static void fw_window_partition(const fixture *f, float *y) {
  k_window_partition(y, f->x[0], f->a.m, f->a.heads, f->a.g, f->a.n, f->a.k, f->a.r);
}
static void bw_window_partition(const fixture *f, float *const *d, bool acc) {
  k_window_partition_backward(d[0], f->dy, f->a.m, f->a.heads, f->a.g, f->a.n, f->a.k, f->a.r, acc);
}
static void fw_window_reverse(const fixture *f, float *y) {
  k_window_reverse(y, f->x[0], f->a.m, f->a.heads, f->a.g, f->a.n, f->a.k, f->a.r);
}
static void bw_window_reverse(const fixture *f, float *const *d, bool acc) {
  k_window_reverse_backward(d[0], f->dy, f->a.m, f->a.heads, f->a.g, f->a.n, f->a.k, f->a.r, acc);
}

/* Window attention as the original computes it: the mask of a shifted
 * grid from slices of an image of region labels, -100 added to the scores
 * of pairs of different regions, the bias gathered from the table. */
static void ref_window_attention(const op_args *a, double *const *in, double *out) {
  const swin_attn_dims *z = a->swin;
  int64_t ws = z->ws, s = ws * ws, nh = z->heads, dh = z->dh, c = nh * dh;
  int64_t h = z->hn_all * ws, w = z->wn_all * ws;
  int *img = calloc((size_t)(h * w), sizeof *img);
  assert_non_null(img);
  if (z->shift > 0) {
    int64_t lo[3] = {0, h - ws, h - z->shift}, hi[3] = {h - ws, h - z->shift, h};
    int64_t wlo[3] = {0, w - ws, w - z->shift}, whi[3] = {w - ws, w - z->shift, w};
    int cnt = 0;
    for (int x = 0; x < 3; x++)
      for (int y = 0; y < 3; y++, cnt++)
        for (int64_t i = lo[x]; i < hi[x]; i++)
          for (int64_t j = wlo[y]; j < whi[y]; j++) img[i * w + j] = cnt;
  }
  double *sc = alloc_d(s);
  for (int64_t bi = 0; bi < z->b; bi++)
    for (int64_t i = 0; i < z->hn; i++)
      for (int64_t j = 0; j < z->wn; j++) {
        int64_t win = (bi * z->hn + i) * z->wn + j;
        for (int64_t hd = 0; hd < nh; hd++)
          for (int64_t x = 0; x < s; x++) {
            int64_t ux = x / ws, vx = x % ws;
            int lx = img[((z->hn0 + i) * ws + ux) * w + (z->wn0 + j) * ws + vx];
            double mx = -1e300, sum = 0;
            for (int64_t y = 0; y < s; y++) {
              int64_t uy = y / ws, vy = y % ws;
              int ly = img[((z->hn0 + i) * ws + uy) * w + (z->wn0 + j) * ws + vy];
              double dot = 0;
              for (int64_t e = 0; e < dh; e++)
                dot += in[0][(win * s + x) * 3 * c + hd * dh + e] * in[0][(win * s + y) * 3 * c + c + hd * dh + e];
              int64_t row = (ux - uy + ws - 1) * (2 * ws - 1) + (vx - vy + ws - 1);
              sc[y] = dot / sqrt((double)dh) + in[1][row * nh + hd] + (lx != ly ? -100.0 : 0.0);
              mx = fmax(mx, sc[y]);
            }
            for (int64_t y = 0; y < s; y++) sum += exp(sc[y] - mx);
            for (int64_t e = 0; e < dh; e++) {
              double acc = 0;
              for (int64_t y = 0; y < s; y++)
                acc += exp(sc[y] - mx) / sum * in[0][(win * s + y) * 3 * c + 2 * c + hd * dh + e];
              out[(win * s + x) * c + hd * dh + e] = acc;
            }
          }
      }
  free(sc);
  free(img);
}
static void fw_window_attention(const fixture *f, float *y) { k_window_attention(y, f->x[0], f->x[1], f->a.swin); }
static void bw_window_attention(const fixture *f, float *const *d, bool acc) {
  k_window_attention_backward(d[0], d[1], f->dy, f->x[0], f->x[1], f->a.swin, acc);
}

/* in[0] x [b][2 hn][2 wn][c] (m = b, heads = hn, g = wn, k = c) */
static void ref_patch_merge(const op_args *a, double *const *in, double *out) {
  int64_t c = a->k, t = 0;
  const int64_t di[4] = {0, 1, 0, 1}, dj[4] = {0, 0, 1, 1};
  for (int64_t bi = 0; bi < a->m; bi++)
    for (int64_t i = 0; i < a->heads; i++)
      for (int64_t j = 0; j < a->g; j++)
        for (int q = 0; q < 4; q++)
          for (int64_t e = 0; e < c; e++)
            out[t++] = in[0][((bi * 2 * a->heads + 2 * i + di[q]) * 2 * a->g + 2 * j + dj[q]) * c + e];
}
static void fw_patch_merge(const fixture *f, float *y) { k_patch_merge(y, f->x[0], f->a.m, f->a.heads, f->a.g, f->a.k); }
static void bw_patch_merge(const fixture *f, float *const *d, bool acc) {
  k_patch_merge_backward(d[0], f->dy, f->a.m, f->a.heads, f->a.g, f->a.k, acc);
}

/* in[0] x [b][s][n] -> [b][n], divided by total */
static void ref_mean_pool(const op_args *a, double *const *in, double *out) {
  for (int64_t bi = 0; bi < a->b; bi++)
    for (int64_t e = 0; e < a->n; e++) {
      double sum = 0;
      for (int64_t t = 0; t < a->s; t++) sum += in[0][(bi * a->s + t) * a->n + e];
      out[bi * a->n + e] = sum / (double)a->total;
    }
}
static void fw_mean_pool(const fixture *f, float *y) { k_mean_pool(y, f->x[0], f->a.b, f->a.s, f->a.n, f->a.total, false); }
static void bw_mean_pool(const fixture *f, float *const *d, bool acc) {
  k_mean_pool_backward(d[0], f->dy, f->a.b, f->a.s, f->a.n, f->a.total, acc);
}

static void test_swin_layout(void **state) {
  (void)state;
  op_args a = {.m = 2, .k = 3, .heads = 2, .g = 3, .n = 2};
  fixture f = make("patchify", a, 2 * 3 * 2 * 3 * 2 * 2, ref_patchify, fw_patchify, bw_patchify,
                   (int64_t[]){2 * 3 * 4 * 6, 0});
  check_op(&f, 1e-7, 1e-4);
  release(&f);

  /* windows of 3 x 3 on a grid of 2 x 3 windows, shifted by 0 and 1 */
  for (int64_t shift = 0; shift <= 1; shift++) {
    a = (op_args){.m = 2, .heads = 2, .g = 3, .n = 3, .k = 2, .r = shift};
    int64_t n = a.m * 6 * 9 * a.k;
    f = make("window_partition", a, n, ref_window_partition, fw_window_partition, bw_window_partition,
             (int64_t[]){n, 0});
    check_op(&f, 1e-7, 1e-4);
    /* the reverse undoes the partition exactly */
    float *win = filled(n, NAN), *back = filled(n, NAN);
    fw_window_partition(&f, win);
    k_window_reverse(back, win, a.m, a.heads, a.g, a.n, a.k, a.r);
    expect_same("window_reverse(window_partition(x))", back, f.x[0], n);
    free(win), free(back);
    release(&f);
    f = make("window_reverse", a, n, ref_window_reverse, fw_window_reverse, bw_window_reverse, (int64_t[]){n, 0});
    check_op(&f, 1e-7, 1e-4);
    release(&f);
  }

  a = (op_args){.m = 2, .heads = 2, .g = 3, .k = 3};
  f = make("patch_merge", a, 2 * 2 * 3 * 4 * 3, ref_patch_merge, fw_patch_merge, bw_patch_merge,
           (int64_t[]){2 * 4 * 6 * 3, 0});
  check_op(&f, 1e-7, 1e-4);
  release(&f);

  /* the mean over 6 tokens, and a part of 6 of 12 */
  for (int64_t total = 6; total <= 12; total += 6) {
    a = (op_args){.b = 2, .s = 6, .n = 3, .total = total};
    f = make("mean_pool", a, 2 * 3, ref_mean_pool, fw_mean_pool, bw_mean_pool, (int64_t[]){2 * 6 * 3, 0});
    check_op(&f, 1e-6, 1e-4);
    release(&f);
  }
}

static void test_window_attention(void **state) {
  (void)state;
  /* windows of 3 x 3 on a grid of 2 x 2 windows, 2 heads of 4; shifted by
   * 0 and 1 (every window but the first then holds several regions) */
  for (int64_t shift = 0; shift <= 1; shift++) {
    swin_attn_dims z = {.b = 2, .hn = 2, .wn = 2, .ws = 3, .heads = 2, .dh = 4, .hn_all = 2, .wn_all = 2,
                        .shift = shift};
    op_args a = {.swin = &z};
    int64_t s = 9, nq = z.b * 4 * s * 3 * z.heads * z.dh, ny = z.b * 4 * s * z.heads * z.dh;
    fixture f = make("window_attention", a, ny, ref_window_attention, fw_window_attention, bw_window_attention,
                     (int64_t[]){nq, 25 * z.heads, 0});
    check_op(&f, 1e-5, 1e-3);

    /* a part of the windows (the second row of windows) computes what the
     * whole computes there: it places itself on the grid */
    float *whole = filled(ny, NAN);
    fw_window_attention(&f, whole);
    swin_attn_dims part = z;
    part.b = 1, part.hn = 1, part.hn0 = 1;
    int64_t win_q = s * 3 * z.heads * z.dh, win_y = s * z.heads * z.dh;
    float *q = alloc_f(2 * win_q), *y = filled(2 * win_y, NAN);
    memcpy(q, f.x[0] + 2 * win_q, (size_t)(2 * win_q) * sizeof *q);   /* batch 0, windows (1, 0) and (1, 1) */
    k_window_attention(y, q, f.x[1], &part);
    expect_same("window_attention part", y, whole + 2 * win_y, 2 * win_y);
    free(whole), free(q), free(y);
    release(&f);
  }
}

static void test_adamw(void **state) {
  (void)state;
  /* step 1 without decay moves each element by lr against its gradient's sign */
  float p[4] = {0.1f, -0.2f, 0.05f, 0}, g[4] = {0.5f, -2, 1e-3f, -0.25f};
  float m[4] = {0}, v[4] = {0}, p0[4];
  memcpy(p0, p, sizeof p);
  k_adamw(p, m, v, g, 4, 1, 1e-3, 0.9, 0.999, 1e-8, 0);
  for (int i = 0; i < 4; i++) {
    double moved = (double)p0[i] - p[i], want = g[i] > 0 ? 1e-3 : -1e-3;
    if (fabs(moved - want) > 2e-8) fail_msg("adamw step 1: element %d moved %.9g", i, moved);
    assert_true(fabs(m[i] - 0.1 * g[i]) <= 1e-7 * fabs(0.1 * g[i]));
    assert_true(fabs(v[i] - 0.001 * g[i] * g[i]) <= 1e-7 * (0.001 * g[i] * g[i]));
  }
  /* a zero gradient leaves only the decoupled decay: p (1 - lr wd) */
  float q[3] = {1, -3, 0.5f}, zero[3] = {0}, mq[3] = {0}, vq[3] = {0};
  k_adamw(q, mq, vq, zero, 3, 1, 1e-3, 0.9, 0.999, 1e-8, 0.01);
  assert_true(fabs(q[0] - (1 - 1e-5)) < 1e-7 && fabs(q[1] + 3 * (1 - 1e-5)) < 3e-7);
  /* several steps with PyTorch's defaults, then other settings */
  run_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01, 980);
  run_adamw(0.05, 0.3, 0.8, 1e-3, 0.1, 981);   /* beta1 < 0.5: torch.lerp's other form */
}

/* torch.optim.SGD's algorithm, in double: first step buf = d. */
static void test_sgd(void **state) {
  (void)state;
  int64_t n = 9;
  double lr = 0.1, mom = 0.9, wd = 0.01;
  float *p = randn(n, 990, 1), *buf = filled(n, 0), *p2 = copy_f(p, n);
  double *pd = to_double(p, n), *bd = alloc_d(n), *pd2 = to_double(p, n);
  for (int t = 1; t <= 4; t++) {
    float *g = randn(n, 991 + (uint64_t)t, 1);
    k_sgd(p, buf, g, n, lr, mom, wd);
    k_sgd(p2, NULL, g, n, lr, 0, 0);
    for (int64_t i = 0; i < n; i++) {
      double d = g[i] + wd * pd[i];
      bd[i] = t == 1 ? d : mom * bd[i] + d;
      pd[i] -= lr * bd[i];
      pd2[i] -= lr * g[i];
    }
    free(g);
  }
  expect_close("sgd momentum p", p, pd, n, 1e-6);
  expect_close("sgd momentum buf", buf, bd, n, 1e-6);
  expect_close("sgd plain p", p2, pd2, n, 1e-6);
  free(p); free(buf); free(p2); free(pd); free(bd); free(pd2);
}

/* ---- init ---------------------------------------------------------------- */

/* Any box of a tensor is initialised as the same box of the whole. */
static void test_init_shards(void **state) {
  (void)state;
  int64_t shape[3] = {5, 7, 6}, n = 210;
  float *whole = alloc_f(n);
  k_init_normal(whole, 0, n, 42, 3, 0, 0.02);
  int64_t boxes[][6] = {{1, 4, 2, 7, 0, 6}, {0, 5, 0, 7, 3, 5}, {4, 5, 6, 7, 5, 6}, {0, 5, 0, 7, 0, 6}};
  for (size_t c = 0; c < sizeof boxes / sizeof boxes[0]; c++) {
    int64_t lo[3] = {boxes[c][0], boxes[c][2], boxes[c][4]};
    int64_t hi[3] = {boxes[c][1], boxes[c][3], boxes[c][5]};
    int64_t len = (hi[0] - lo[0]) * (hi[1] - lo[1]) * (hi[2] - lo[2]);
    float *box = alloc_f(len), *want = alloc_f(len);
    k_init_normal_box(box, 3, shape, lo, hi, 42, 3, 0, 0.02);
    int64_t j = 0;
    for (int64_t a = lo[0]; a < hi[0]; a++)
      for (int64_t b = lo[1]; b < hi[1]; b++)
        for (int64_t c2 = lo[2]; c2 < hi[2]; c2++) want[j++] = whole[(a * 7 + b) * 6 + c2];
    expect_same("init box", box, want, len);
    free(box);
    free(want);
  }
  /* a run of a flat range is the same as the whole's */
  float run[17];
  k_init_normal(run, 100, 17, 42, 3, 0, 0.02);
  expect_same("init run", run, whole + 100, 17);
  free(whole);
}

static void test_init_distribution(void **state) {
  (void)state;
  int64_t n = 200000, inside = 0;
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n; i++) {
    double z = k_rng_normal(7, 1, (uint64_t)i);
    sum += z;
    sq += z * z;
    inside += fabs(z) < 1;
  }
  double mean = sum / (double)n, var = sq / (double)n - mean * mean;
  if (fabs(mean) > 0.01 || fabs(var - 1) > 0.015 || fabs((double)inside / (double)n - 0.682689) > 0.005)
    fail_msg("normal: mean %g, variance %g, P(|z| < 1) %g", mean, var, (double)inside / (double)n);
  /* seeds, streams and indices all change the value; mean and std apply */
  assert_true(k_rng_u64(1, 0, 0) != k_rng_u64(2, 0, 0));
  assert_true(k_rng_u64(1, 0, 0) != k_rng_u64(1, 1, 0));
  assert_true(k_rng_u64(1, 0, 0) != k_rng_u64(1, 0, 1));
  assert_true(k_rng_u64(0, 1, 0) != k_rng_u64(1, 0, 0));
  float x;
  k_init_normal(&x, 12, 1, 7, 1, 2.0, 0.5);
  assert_true(x == (float)(2.0 + 0.5 * k_rng_normal(7, 1, 12)));
}

/* The stream is part of the checkpoint format: these values must not change. */
static void test_init_stable(void **state) {
  (void)state;
  assert_true(k_rng_u64(0, 0, 0) == 0x238275bc38fcbe91ULL);
  assert_true(k_rng_u64(1234, 5, 678) == 0xe55d8ba903ec6ccdULL);
  assert_true(fabs(k_rng_normal(1234, 5, 678) - (-0.3219999641102245)) < 1e-15);
}

/* ---- threads ------------------------------------------------------------- */

/* The executor runs each device as a thread: kernels called at once from
 * several threads give what they give alone (no shared state; ThreadSanitizer
 * checks the rest under SANITIZE=thread). */
enum { TM = 96, TK = 160, TN = 128, TB = 2, TS = 48, TH = 3, TD = 16 };

typedef struct thread_job {
  const float *a, *b, *qkv;
  float *c, *out, *dqkv;
} thread_job;

static void *thread_run(void *arg) {
  thread_job *j = arg;
  for (int r = 0; r < 3; r++) {
    k_matmul(j->c, j->a, j->b, TM, TK, TN, false);
    k_causal_attention(j->out, j->qkv, TB, TS, TH, TD);
    k_causal_attention_backward(j->dqkv, j->out, j->qkv, TB, TS, TH, TD, false);
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  int64_t nqkv = TB * TS * 3 * TH * TD, nout = TB * TS * TH * TD;
  float *a = randn(TM * TK, 1000, 1), *b = randn(TK * TN, 1001, 1), *qkv = randn(nqkv, 1002, 1);
  thread_job alone = {a, b, qkv, alloc_f(TM * TN), alloc_f(nout), alloc_f(nqkv)};
  thread_run(&alone);
  double *c0 = to_double(alone.c, TM * TN), *o0 = to_double(alone.out, nout);
  double *d0 = to_double(alone.dqkv, nqkv);
  enum { NT = 4 };
  pthread_t th[NT];
  thread_job jobs[NT];
  for (int i = 0; i < NT; i++) {
    jobs[i] = (thread_job){a, b, qkv, filled(TM * TN, NAN), filled(nout, NAN), filled(nqkv, NAN)};
    assert_int_equal(pthread_create(&th[i], NULL, thread_run, &jobs[i]), 0);
  }
  for (int i = 0; i < NT; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
  for (int i = 0; i < NT; i++) {
    /* sgemm may split its work differently when called concurrently */
    expect_close("matmul in a thread", jobs[i].c, c0, TM * TN, 1e-6);
    expect_close("attention in a thread", jobs[i].out, o0, nout, 1e-6);
    expect_close("attention backward in a thread", jobs[i].dqkv, d0, nqkv, 1e-6);
    free(jobs[i].c); free(jobs[i].out); free(jobs[i].dqkv);
  }
  free(a); free(b); free(qkv); free(alone.c); free(alone.out); free(alone.dqkv);
  free(c0); free(o0); free(d0);
}

/* ---- attention without a mask (T5) ----------------------------------------- */

/* softmax over all t keys of q_i . k_j / sqrt(dh), times v, by plain loops:
 * q [b, s, heads dh], k and v [b, t, heads dh]. */
static void ref_attention(const op_args *a, double *const *in, double *out) {
  int64_t c = a->heads * a->dh;
  double *w = alloc_d(a->t);
  for (int64_t b = 0; b < a->b; b++)
    for (int64_t hd = 0; hd < a->heads; hd++)
      for (int64_t i = 0; i < a->s; i++) {
        const double *q = in[0] + (b * a->s + i) * c + hd * a->dh;
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < a->t; j++) {
          const double *k = in[1] + (b * a->t + j) * c + hd * a->dh;
          double dot = 0;
          for (int64_t d = 0; d < a->dh; d++) dot += q[d] * k[d];
          w[j] = dot / sqrt((double)a->dh);
          mx = fmax(mx, w[j]);
        }
        for (int64_t j = 0; j < a->t; j++) sum += w[j] = exp(w[j] - mx);
        for (int64_t d = 0; d < a->dh; d++) {
          double o = 0;
          for (int64_t j = 0; j < a->t; j++) o += w[j] / sum * in[2][(b * a->t + j) * c + hd * a->dh + d];
          out[(b * a->s + i) * c + hd * a->dh + d] = o;
        }
      }
  free(w);
}
static void fw_attention(const fixture *f, float *y) {
  k_attention(y, f->x[0], f->x[1], f->x[2], f->a.b, f->a.s, f->a.t, f->a.heads, f->a.dh);
}
static void bw_attention(const fixture *f, float *const *d, bool acc) {
  k_attention_backward(d[0], d[1], d[2], f->dy, f->x[0], f->x[1], f->x[2], f->a.b, f->a.s, f->a.t,
                       f->a.heads, f->a.dh, acc);
}

/* Forward against the reference and backward against finite differences:
 * self-attention (t = s), cross-attention with fewer and with more keys than
 * queries; then the last query sees the last key (no mask), and parts of the
 * queries give the rows and the summed key and value gradients of the whole. */
static void test_attention_unmasked(void **state) {
  (void)state;
  const op_args cases[] = {
      {.b = 2, .s = 5, .t = 5, .heads = 2, .dh = 4},
      {.b = 2, .s = 6, .t = 3, .heads = 3, .dh = 2},
      {.b = 1, .s = 3, .t = 7, .heads = 1, .dh = 5},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    op_args a = cases[i];
    int64_t c = a.heads * a.dh;
    fixture f = make("attention", a, a.b * a.s * c, ref_attention, fw_attention, bw_attention,
                     (int64_t[]){a.b * a.s * c, a.b * a.t * c, a.b * a.t * c, 0});
    check_op(&f, 1e-5, 1e-3);
    release(&f);
  }

  /* The first query of a causal attention sees only the first key; here it
   * sees them all, so its row differs from v's first row. */
  int64_t b = 1, s = 4, heads = 2, dh = 3, c = heads * dh;
  float *q = randn(b * s * c, 941, 1), *k = randn(b * s * c, 942, 1), *v = randn(b * s * c, 943, 1);
  float *out = filled(b * s * c, NAN), *causal = filled(b * s * c, NAN);
  k_attention(out, q, k, v, b, s, s, heads, dh);
  k_gqa_attention(causal, q, k, v, b, s, s, 0, heads, 1, dh);
  assert_true(fabs(out[0] - causal[0]) > 1e-4);
  for (int64_t j = 0; j < c; j++) assert_true(fabs(out[(s - 1) * c + j] - causal[(s - 1) * c + j]) <= 1e-6);

  /* Queries in two parts: each part's rows as in the whole, key and value
   * gradients summed over the parts. */
  float *dout = randn(b * s * c, 944, 1);
  float *dq = filled(b * s * c, NAN), *dk = filled(b * s * c, NAN), *dv = filled(b * s * c, NAN);
  k_attention_backward(dq, dk, dv, dout, q, k, v, b, s, s, heads, dh, false);
  float *po = filled(b * s * c, NAN), *pdq = filled(b * s * c, 0);  /* the second part accumulates */
  float *sdk = filled(b * s * c, NAN), *sdv = filled(b * s * c, NAN);
  for (int p = 0; p < 2; p++) {
    int64_t off = p * 2 * c;
    k_attention(po + off, q + off, k, v, b, 2, s, heads, dh);
    k_attention_backward(pdq + off, sdk, sdv, dout + off, q + off, k, v, b, 2, s, heads, dh, p > 0);
  }
  expect_same("attention by query parts", po, out, b * s * c);
  expect_same("attention by query parts, dq", pdq, dq, b * s * c);
  double *dkd = to_double(dk, b * s * c), *dvd = to_double(dv, b * s * c);
  expect_close("attention by query parts, dk", sdk, dkd, b * s * c, 1e-5);
  expect_close("attention by query parts, dv", sdv, dvd, b * s * c, 1e-5);
  free(q); free(k); free(v); free(out); free(causal); free(dout); free(dq); free(dk); free(dv);
  free(po); free(pdq); free(sdk); free(sdv); free(dkd); free(dvd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_matmul),
    cmocka_unit_test(test_matmul_forward_acc),
    cmocka_unit_test(test_matmul_empty),
    cmocka_unit_test(test_embedding),
    cmocka_unit_test(test_embedding_shards),
    cmocka_unit_test(test_add_position),
    cmocka_unit_test(test_norms),
    cmocka_unit_test(test_norm_values),
    cmocka_unit_test(test_activations),
    cmocka_unit_test(test_activation_values),
    cmocka_unit_test(test_rotary),
    cmocka_unit_test(test_rotary_values),
    cmocka_unit_test(test_causal_attention),
    cmocka_unit_test(test_attention_long),
    cmocka_unit_test(test_gqa_attention),
    cmocka_unit_test(test_gqa_is_mha),
    cmocka_unit_test(test_gqa_query_parts),
    cmocka_unit_test(test_softmax_add),
    cmocka_unit_test(test_in_place),
    cmocka_unit_test(test_losses),
    cmocka_unit_test(test_loss_values),
    cmocka_unit_test(test_cross_entropy_vocab_parallel),
    cmocka_unit_test(test_moe_route),
    cmocka_unit_test(test_moe),
    cmocka_unit_test(test_swin_layout),
    cmocka_unit_test(test_window_attention),
    cmocka_unit_test(test_adamw),
    cmocka_unit_test(test_sgd),
    cmocka_unit_test(test_init_shards),
    cmocka_unit_test(test_init_distribution),
    cmocka_unit_test(test_init_stable),
    cmocka_unit_test(test_threads),
    cmocka_unit_test(test_attention_unmasked),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
