/* test_kernels.c - every kernel of the CUDA backend (backends/cuda/gpu.h)
 * against the CPU backend's kernel it replaces (backends/cpu/kernels.h),
 * in f32 and bf16 (attention in f16 too), on random inputs of sizes that
 * do not divide the kernels' tiles. Linked with a libweft_cuda.so: the
 * emulated one in make check, the real one on a GPU (tests/gpu/run.sh);
 * WEFT_TEST_BIG=1 adds the large attention cases to the emulated run.
 *
 * Each check prints its relative L2 error ||gpu - cpu|| / ||cpu|| and its
 * tolerance: 2e-5 in f32 (the same arithmetic summed in another order),
 * 1e-2 in bf16 (inputs rounded to bf16 for both sides, the GPU's outputs
 * rounded once more, 2^-9 relative). Outputs are filled with NaN first, so
 * an element a kernel does not write fails the check. Exit 1 on a failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/kernels.h"
#include "cpu/kernels_swin.h"
#include "cuda/choice.h"
#include "cuda/cx.h"
#include "cuda/gpu.h"

static gpu_stream *S;
static int failures, checks;
static uint64_t rng_state = 12345;

static double urand(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng_state >> 11) * 0x1p-53;
}

static float *randn(int64_t n, double scale) {
  float *x = malloc(sizeof(float) * (size_t)(n + 1));
  for (int64_t i = 0; i < n; i++) {
    double u1 = urand() + 1e-12, u2 = urand();
    x[i] = (float)(scale * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
  }
  return x;
}

static float *copy(const float *x, int64_t n) {
  float *y = malloc(sizeof(float) * (size_t)(n + 1));
  memcpy(y, x, sizeof(float) * (size_t)n);
  return y;
}

/* x rounded to bf16 (to nearest, ties to even), as the GPU stores it */
static float round_bf16(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return v;
  u += 0x7fffu + ((u >> 16) & 1);
  u &= 0xffff0000u;
  memcpy(&v, &u, 4);
  return v;
}

static void round_all(float *x, int64_t n, int dt) {
  if (dt == GPU_BF16)
    for (int64_t i = 0; i < n; i++) x[i] = round_bf16(x[i]);
  if (dt == GPU_F16)
    for (int64_t i = 0; i < n; i++) x[i] = (float)(_Float16)x[i];
}

static void die(const char *what, const char *err) {
  fprintf(stderr, "test_kernels: %s: %s\n", what, err);
  exit(2);
}

/* A device copy of x in type dt. */
static void *up(const float *x, int64_t n, int dt) {
  char e[400];
  void *f = gpu_alloc((size_t)(n + 1) * 4, e, sizeof e), *d = gpu_alloc((size_t)(n + 1) * 4, e, sizeof e);
  if (!f || !d) die("gpu_alloc", e);
  if (!gpu_upload(f, x, (size_t)n * 4, S, e, sizeof e)) die("gpu_upload", e);
  gpu_convert(S, d, dt, f, GPU_F32, n, false);
  if (!gpu_stream_sync(S, e, sizeof e)) die("convert", e);
  gpu_free(f);
  return d;
}

static int32_t *up_ids(const int32_t *x, int64_t n) {
  char e[400];
  int32_t *d = gpu_alloc((size_t)(n + 1) * 4, e, sizeof e);
  if (!d || !gpu_upload(d, x, (size_t)n * 4, S, e, sizeof e)) die("ids", e);
  return d;
}

/* n NaNs of type dt: what a kernel leaves unwritten shows. */
static void *poisoned(int64_t n, int dt) {
  float *nan = malloc(sizeof(float) * (size_t)(n + 1));
  for (int64_t i = 0; i < n; i++) nan[i] = NAN;
  void *d = up(nan, n, dt);
  free(nan);
  return d;
}

static float *down(const void *d, int64_t n, int dt) {
  char e[400];
  float *h = malloc(sizeof(float) * (size_t)(n + 1));
  void *f = gpu_alloc((size_t)(n + 1) * 4, e, sizeof e);
  if (!f) die("gpu_alloc", e);
  gpu_convert(S, f, GPU_F32, d, dt, n, false);
  if (!gpu_check("kernel", e, sizeof e) || !gpu_download(h, f, (size_t)n * 4, S, e, sizeof e)) die("download", e);
  gpu_free(f);
  return h;
}

static double tol_of(int dt) { return dt == GPU_F32 ? 2e-5 : 1e-2; }
static const char *dt_name(int dt) { return dt == GPU_F32 ? "f32" : dt == GPU_BF16 ? "bf16" : "f16"; }

/* Compares; frees got. */
static void expect(const char *what, int dt, float *got, const float *want, int64_t n) {
  double num = 0, den = 0;
  int64_t bad = -1;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(got[i]) && bad < 0) bad = i;
    double d = (double)got[i] - want[i];
    num += d * d;
    den += (double)want[i] * want[i];
  }
  double rel = den > 0 ? sqrt(num / den) : sqrt(num);
  double tol = tol_of(dt);
  bool ok = bad < 0 && rel <= tol;
  checks++;
  if (!ok) failures++;
  if (bad >= 0)
    printf("kernel %-44s %-4s FAIL: element %lld is %g (not written, or not finite)\n", what, dt_name(dt), (long long)bad,
           (double)got[bad]);
  else
    printf("kernel %-44s %-4s rel err %.2e (tolerance %.0e) %s\n", what, dt_name(dt), rel, tol, ok ? "ok" : "FAIL");
  free(got);
}

static void expect_dev(const char *what, int dt, const void *d, const float *want, int64_t n) {
  expect(what, dt, down(d, n, dt), want, n);
}

static void expect_loss(const char *what, int dt, const double *slot, double want) {
  char e[400];
  double got = 0;
  if (!gpu_download(&got, slot, 8, S, e, sizeof e)) die("loss", e);
  float g = (float)got, w = (float)want;
  expect(what, dt, copy(&g, 1), &w, 1);
}

/* ---- the checks --------------------------------------------------------------------------- */

static void check_gemm(int dt, int64_t m, int64_t k, int64_t n) {
  char e[400], what[80];
  size_t wsb = gpu_gemm_ws();
  void *ws = wsb ? gpu_alloc(wsb, e, sizeof e) : NULL;
  float *a = randn(m * k, 1), *b = randn(k * n, 1), *bt = randn(n * k, 1), *bias = randn(n, 1), *c0 = randn(m * n, 1);
  round_all(a, m * k, dt), round_all(b, k * n, dt), round_all(bt, n * k, dt), round_all(bias, n, dt), round_all(c0, m * n, dt);
  void *da = up(a, m * k, dt), *db = up(b, k * n, dt), *dbt = up(bt, n * k, dt), *dbias = up(bias, n, dt);
  /* linear: c = c0 + a b + bias */
  float *want = copy(c0, m * n);
  k_linear(want, a, b, bias, m, k, n, true);
  void *dc = up(c0, m * n, dt);
  if (!gpu_gemm(S, false, false, m, n, k, da, k, dt, db, n, dt, dc, n, dt, dbias, true, ws, wsb, false, e, sizeof e))
    die("gemm", e);
  snprintf(what, sizeof what, "linear %lldx%lldx%lld, bias, acc", (long long)m, (long long)k, (long long)n);
  expect_dev(what, dt, dc, want, m * n);
  gpu_free(dc);
  /* matmul_t: c = a bt^T */
  k_matmul_t(want, a, bt, m, k, n, false);
  dc = poisoned(m * n, dt);
  if (!gpu_gemm(S, false, true, m, n, k, da, k, dt, dbt, k, dt, dc, n, dt, NULL, false, ws, wsb, false, e, sizeof e))
    die("gemm", e);
  snprintf(what, sizeof what, "matmul_t %lldx%lldx%lld", (long long)m, (long long)k, (long long)n);
  expect_dev(what, dt, dc, want, m * n);
  gpu_free(dc);
  /* matmul backward: da = dc b^T, db = a^T dc */
  float *g = randn(m * n, 1);
  round_all(g, m * n, dt);
  void *dg = up(g, m * n, dt);
  float *wa = malloc(sizeof(float) * (size_t)(m * k)), *wb = malloc(sizeof(float) * (size_t)(k * n));
  k_matmul_backward(wa, wb, g, a, b, m, k, n, false);
  void *ga = poisoned(m * k, dt), *gb = poisoned(k * n, dt);
  if (!gpu_gemm(S, false, true, m, k, n, dg, n, dt, db, n, dt, ga, k, dt, NULL, false, ws, wsb, false, e, sizeof e) ||
      !gpu_gemm(S, true, false, k, n, m, da, k, dt, dg, n, dt, gb, n, dt, NULL, false, ws, wsb, false, e, sizeof e))
    die("gemm", e);
  expect_dev("matmul backward da", dt, ga, wa, m * k);
  expect_dev("matmul backward db", dt, gb, wb, k * n);
  /* matmul_t backward: da = dc bt, dbt = dc^T a */
  float *wbt = malloc(sizeof(float) * (size_t)(n * k));
  k_matmul_t_backward(wa, wbt, g, a, bt, m, k, n, false);
  void *gbt = poisoned(n * k, dt);
  gpu_free(ga);
  ga = poisoned(m * k, dt);
  if (!gpu_gemm(S, false, false, m, k, n, dg, n, dt, dbt, k, dt, ga, k, dt, NULL, false, ws, wsb, false, e, sizeof e) ||
      !gpu_gemm(S, true, false, n, k, m, dg, n, dt, da, k, dt, gbt, k, dt, NULL, false, ws, wsb, false, e, sizeof e))
    die("gemm", e);
  expect_dev("matmul_t backward da", dt, ga, wa, m * k);
  expect_dev("matmul_t backward db", dt, gbt, wbt, n * k);
  /* bias gradient: column sums, added */
  float *wbias = copy(bias, n);
  k_linear_backward(NULL, NULL, wbias, g, a, b, m, k, n, true);
  void *cs = gpu_alloc(gpu_colsum_ws(m, n) + 4, e, sizeof e);
  gpu_colsum(S, dt, dbias, dt, dg, m, n, true, cs);
  expect_dev("linear backward dbias (column sums), acc", dt, dbias, wbias, n);
  if (dt != GPU_F32) {
    /* a weight's gradient kept in f32 while the product computes in 16
     * bits: written, then added, in f32 (no rounding to 16 bits between) */
    float *w32 = malloc(sizeof(float) * (size_t)(k * n)), *b32 = calloc((size_t)n, sizeof(float));
    k_matmul_backward(NULL, w32, g, a, b, m, k, n, false);
    k_matmul_backward(NULL, w32, g, a, b, m, k, n, true);
    k_linear_backward(NULL, NULL, b32, g, a, b, m, k, n, true);
    k_linear_backward(NULL, NULL, b32, g, a, b, m, k, n, true);
    float *zero = calloc((size_t)n, sizeof(float));
    void *g32 = poisoned(k * n, GPU_F32), *bias32 = up(zero, n, GPU_F32);
    if (!gpu_gemm(S, true, false, k, n, m, da, k, dt, dg, n, dt, g32, n, GPU_F32, NULL, false, ws, wsb, false, e,
                  sizeof e) ||
        !gpu_gemm(S, true, false, k, n, m, da, k, dt, dg, n, dt, g32, n, GPU_F32, NULL, true, ws, wsb, false, e,
                  sizeof e))
      die("gemm", e);
    gpu_colsum(S, dt, bias32, GPU_F32, dg, m, n, false, cs);
    gpu_colsum(S, dt, bias32, GPU_F32, dg, m, n, true, cs);
    snprintf(what, sizeof what, "matmul backward db into f32, twice (%s operands)", dt_name(dt));
    expect_dev(what, GPU_F32, g32, w32, k * n);
    snprintf(what, sizeof what, "column sums into f32, twice (%s operands)", dt_name(dt));
    expect_dev(what, GPU_F32, bias32, b32, n);
    gpu_free(g32), gpu_free(bias32), free(w32), free(b32), free(zero);
  }
  gpu_free(cs), gpu_free(da), gpu_free(db), gpu_free(dbt), gpu_free(dbias), gpu_free(dg), gpu_free(ga), gpu_free(gb);
  gpu_free(gbt), gpu_free(ws);
  free(a), free(b), free(bt), free(bias), free(c0), free(want), free(g), free(wa), free(wb), free(wbt), free(wbias);
}

/* A linear and the GELU after it as one product (gpu_gemm_epi), forward
 * and backward, against k_linear, k_gelu, k_matmul_backward and
 * k_gelu_backward; fused by cuBLASLt when the shapes allow (n and k
 * multiples of 8 here), else the product and the GELU kernel. */
static void check_gemm_gelu(int dt, int64_t m, int64_t k, int64_t n) {
  char e[400], what[96];
  size_t wsb = gpu_gemm_ws();
  void *ws = wsb ? gpu_alloc(wsb, e, sizeof e) : NULL;
  float *a = randn(m * k, 1), *b = randn(k * n, 1), *bias = randn(n, 1), *g = randn(m * n, 1), *x = randn(m * k, 2);
  round_all(a, m * k, dt), round_all(b, k * n, dt), round_all(bias, n, dt), round_all(g, m * n, dt);
  round_all(x, m * k, dt);
  void *da = up(a, m * k, dt), *db = up(b, k * n, dt), *dbias = up(bias, n, dt), *dg = up(g, m * n, dt);
  void *dx = up(x, m * k, dt);
  /* forward: pre = a b + bias, y = gelu(pre) */
  float *pre = malloc(sizeof(float) * (size_t)(m * n)), *y = malloc(sizeof(float) * (size_t)(m * n));
  k_linear(pre, a, b, bias, m, k, n, false);
  k_gelu(y, pre, m * n);
  void *dpre = poisoned(m * n, dt), *dy = poisoned(m * n, dt);
  int64_t before = gpu_gemm_fused();
  if (!gpu_gemm_epi(S, false, false, m, n, k, da, k, dt, db, n, dt, dy, dt, dbias, GPU_EPI_GELU, dpre, ws, wsb,
                    false, e, sizeof e))
    die("gemm_epi", e);
  const char *how = gpu_gemm_fused() > before ? "fused" : "unfused";
  bool want_fused = n % 8 == 0 && (k * gpu_dtype_size(dt)) % 16 == 0;
  snprintf(what, sizeof what, "linear+gelu %lldx%lldx%lld %s: its input", (long long)m, (long long)k, (long long)n,
           how);
  expect_dev(what, dt, dpre, pre, m * n);
  snprintf(what, sizeof what, "linear+gelu %lldx%lldx%lld %s: gelu", (long long)m, (long long)k, (long long)n, how);
  expect_dev(what, dt, dy, y, m * n);
  /* backward: dx = (g b^T) gelu'(x) */
  float *gx = malloc(sizeof(float) * (size_t)(m * k)), *want = malloc(sizeof(float) * (size_t)(m * k));
  k_matmul_backward(gx, NULL, g, a, b, m, k, n, false);
  k_gelu_backward(want, gx, x, m * k, false);
  void *dgx = poisoned(m * k, dt);
  int64_t mid = gpu_gemm_fused();
  if (!gpu_gemm_epi(S, false, true, m, k, n, dg, n, dt, db, n, dt, dgx, dt, NULL, GPU_EPI_DGELU, dx, ws, wsb, false,
                    e, sizeof e))
    die("gemm_epi", e);
  const char *how2 = gpu_gemm_fused() > mid ? "fused" : "unfused";
  snprintf(what, sizeof what, "linear+gelu backward %lldx%lldx%lld %s", (long long)m, (long long)k, (long long)n, how2);
  expect_dev(what, dt, dgx, want, m * k);
  /* cuBLASLt fuses where its rules allow, and only there */
  bool want_fused2 = k % 8 == 0 && (n * gpu_dtype_size(dt)) % 16 == 0;
  checks++;
  if ((strcmp(how, "fused") == 0) != want_fused || (strcmp(how2, "fused") == 0) != want_fused2) {
    failures++;
    printf("kernel %-44s %-4s FAIL: forward %s, backward %s\n", "linear+gelu fused where aligned", dt_name(dt), how,
           how2);
  } else {
    printf("kernel %-44s %-4s ok\n", "linear+gelu fused where aligned", dt_name(dt));
  }
  gpu_free(da), gpu_free(db), gpu_free(dbias), gpu_free(dg), gpu_free(dx), gpu_free(dpre), gpu_free(dy);
  gpu_free(dgx), gpu_free(ws);
  free(a), free(b), free(bias), free(g), free(x), free(pre), free(y), free(gx), free(want);
}

/* A linear and the residual's add after it as one product (gpu_gemm_epi,
 * GPU_EPI_RESID: y = a b + bias + r, r cuBLASLt's C), against k_linear and
 * k_add; fused where the shapes allow (n and k multiples of 8 here), else
 * the product and the add kernel. r is left as it was. */
static void check_gemm_resid(int dt, int64_t m, int64_t k, int64_t n) {
  char e[400], what[96];
  size_t wsb = gpu_gemm_ws();
  void *ws = wsb ? gpu_alloc(wsb, e, sizeof e) : NULL;
  float *a = randn(m * k, 1), *b = randn(k * n, 1), *bias = randn(n, 1), *res = randn(m * n, 3);
  round_all(a, m * k, dt), round_all(b, k * n, dt), round_all(bias, n, dt), round_all(res, m * n, dt);
  void *da = up(a, m * k, dt), *db = up(b, k * n, dt), *dbias = up(bias, n, dt), *dr = up(res, m * n, dt);
  float *lin = malloc(sizeof(float) * (size_t)(m * n)), *want = malloc(sizeof(float) * (size_t)(m * n));
  k_linear(lin, a, b, bias, m, k, n, false);
  k_add(want, lin, res, m * n);
  void *dy = poisoned(m * n, dt);
  int64_t before = gpu_gemm_fused();
  if (!gpu_gemm_epi(S, false, false, m, n, k, da, k, dt, db, n, dt, dy, dt, dbias, GPU_EPI_RESID, dr, ws, wsb, false,
                    e, sizeof e))
    die("gemm_epi", e);
  bool fused = gpu_gemm_fused() > before, want_fused = n % 8 == 0 && (k * gpu_dtype_size(dt)) % 16 == 0;
  snprintf(what, sizeof what, "linear+residual %lldx%lldx%lld %s", (long long)m, (long long)k, (long long)n,
           fused ? "fused" : "unfused");
  expect_dev(what, dt, dy, want, m * n);
  expect_dev("linear+residual: the residual as it was", dt, dr, res, m * n);
  checks++;
  if (fused != want_fused) {
    failures++;
    printf("kernel %-44s %-4s FAIL: %s\n", "linear+residual fused where aligned", dt_name(dt), fused ? "fused" : "unfused");
  } else {
    printf("kernel %-44s %-4s ok\n", "linear+residual fused where aligned", dt_name(dt));
  }
  gpu_free(da), gpu_free(db), gpu_free(dbias), gpu_free(dr), gpu_free(dy), gpu_free(ws);
  free(a), free(b), free(bias), free(res), free(lin), free(want);
}

/* A linear's weight and bias gradients in one product (gpu_gemm_dbias:
 * dW = x^T dy, db = dy's column sums, cuBLASLt's BGRADA epilogue), against
 * k_matmul_backward and k_linear_backward, into the gradients' type (f32
 * for a 16-bit product, as the weights' gradients are kept). Taken where
 * the shapes allow on the emulation; on a GPU cuBLASLt may refuse, and the
 * line says which ran. */
static bool emulated;
static void check_gemm_dbias(int dt, int odt, int64_t m, int64_t k, int64_t n) {
  char e[400], what[96];
  size_t wsb = gpu_gemm_ws();
  void *ws = wsb ? gpu_alloc(wsb, e, sizeof e) : NULL;
  float *x = randn(m * k, 1), *g = randn(m * n, 2), *b = randn(k * n, 3);
  round_all(x, m * k, dt), round_all(g, m * n, dt);
  void *dx = up(x, m * k, dt), *dg = up(g, m * n, dt);
  float *ww = malloc(sizeof(float) * (size_t)(k * n)), *wb = calloc((size_t)n, sizeof(float));
  k_matmul_backward(NULL, ww, g, x, b, m, k, n, false);
  k_linear_backward(NULL, NULL, wb, g, x, b, m, k, n, false);
  void *dw = poisoned(k * n, odt), *db = poisoned(n, odt);
  bool fused = false;
  if (!gpu_gemm_dbias(S, true, false, k, n, m, dx, k, dt, dg, n, dt, dw, odt, db, odt, ws, wsb, &fused, e, sizeof e))
    die("gemm_dbias", e);
  bool want = m % 8 == 0 && n % 8 == 0 && k % 8 == 0;
  if (!fused) {
    /* not taken: what the caller then runs */
    void *cs = gpu_alloc(gpu_colsum_ws(m, n) + 4, e, sizeof e);
    if (!gpu_gemm(S, true, false, k, n, m, dx, k, dt, dg, n, dt, dw, n, odt, NULL, false, ws, wsb, false, e, sizeof e))
      die("gemm", e);
    gpu_colsum(S, dt, db, odt, dg, m, n, false, cs);
    if (!gpu_sync(e, sizeof e)) die("sync", e);
    gpu_free(cs);
  }
  snprintf(what, sizeof what, "linear dW+db %lldx%lldx%lld%s %s", (long long)m, (long long)k, (long long)n,
           odt == dt ? "" : " to f32", fused ? "one product" : "product, sums");
  expect_dev(what, odt, dw, ww, k * n);
  snprintf(what, sizeof what, "linear db from the product's epilogue %lldx%lld", (long long)m, (long long)n);
  expect_dev(fused ? what : "linear db, column sums", odt, db, wb, n);
  checks++;
  if (fused && !want) {
    failures++;
    printf("kernel %-44s %-4s FAIL: taken for a shape it should not be\n", "linear dW+db in one product", dt_name(dt));
  } else if (emulated && want && !fused) {
    failures++;
    printf("kernel %-44s %-4s FAIL: not taken on the emulation\n", "linear dW+db in one product", dt_name(dt));
  } else {
    printf("kernel %-44s %-4s ok (%s%s%s)\n", "linear dW+db in one product", dt_name(dt), fused ? "taken" : "not taken",
           !fused && *gpu_gemm_dbias_refused() ? ": " : "", !fused ? gpu_gemm_dbias_refused() : "");
  }
  gpu_free(dx), gpu_free(dg), gpu_free(dw), gpu_free(db), gpu_free(ws);
  free(x), free(g), free(b), free(ww), free(wb);
}

/* The table's gradient with many tokens to a partition (40,000 tokens over
 * 128 partitions of 600 rows: two chunks of the block's list each, runs of
 * four tokens of four rows and of repeated rows), into f32: the CPU's sums
 * to the bit, each row's tokens added in token order; then with the first
 * kernel (WEFT_EMB_KERNEL=old). */
static void check_embedding_tokens(int dt);
static void check_embedding_many(int dt) {
  for (int old = 0; old < 2; old++) {
    if (old) setenv("WEFT_EMB_KERNEL", "old", 1);
    check_embedding_tokens(dt);
  }
  unsetenv("WEFT_EMB_KERNEL");
}

static void check_embedding_tokens(int dt) {
  char e[400], what[96];
  int64_t t = 40000, h = 40, v_local = 600;
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)t);
  for (int64_t i = 0; i < t; i++) ids[i] = (int32_t)(urand() * v_local);
  for (int64_t i = 100; i < 140; i++) ids[i] = 5;  /* a run of one row */
  float *dout = randn(t * h, 1), *dt0 = randn(v_local * h, 1);
  round_all(dout, t * h, dt);
  int32_t *dids = up_ids(ids, t);
  void *ddout = up(dout, t * h, dt), *ws = gpu_alloc(gpu_embedding_backward_ws(dt, v_local, h, t) + 4, e, sizeof e);
  if (!ws) die("gpu_alloc", e);
  for (int acc = 0; acc < 2; acc++) {
    float *wt = copy(dt0, v_local * h);
    k_embedding_backward(wt, dout, ids, t, h, 0, v_local, acc);
    void *g = acc ? up(dt0, v_local * h, GPU_F32) : poisoned(v_local * h, GPU_F32);
    gpu_embedding_backward(S, dt, g, GPU_F32, ddout, dids, t, h, 0, v_local, acc, ws);
    float *got = down(g, v_local * h, GPU_F32);
    bool same = memcmp(got, wt, sizeof(float) * (size_t)(v_local * h)) == 0;
    checks++;
    if (!same) failures++;
    snprintf(what, sizeof what, "embedding backward, 40000 tokens, into f32%s%s", acc ? ", acc" : "",
             getenv("WEFT_EMB_KERNEL") ? " (old)" : "");
    printf("kernel %-44s %-4s %s\n", what, dt_name(dt), same ? "the CPU's bits ok" : "FAIL: not the CPU's bits");
    free(got), free(wt), gpu_free(g);
  }
  gpu_free(dids), gpu_free(ddout), gpu_free(ws);
  free(ids), free(dout), free(dt0);
}

static void check_embedding(int dt) {
  int64_t t = 600, h = 40, vocab = 300, v_lo = 100, v_local = 150;  /* tokens in three chunks of 256 */
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)t);
  for (int64_t i = 0; i < t; i++) ids[i] = (int32_t)(urand() * vocab);
  ids[3] = ids[7] = ids[11] = 120;  /* repeated rows sum in token order */
  float *table = randn(v_local * h, 1), *out0 = randn(t * h, 1), *dout = randn(t * h, 1), *dt0 = randn(v_local * h, 1);
  round_all(table, v_local * h, dt), round_all(out0, t * h, dt), round_all(dout, t * h, dt), round_all(dt0, v_local * h, dt);
  int32_t *dids = up_ids(ids, t);
  void *dtab = up(table, v_local * h, dt), *ddout = up(dout, t * h, dt);
  float *want = copy(out0, t * h);
  k_embedding(want, ids, table, t, h, v_lo, v_local, false);
  void *o = poisoned(t * h, dt);
  gpu_embedding(S, dt, o, dids, dtab, t, h, v_lo, v_local, false);
  expect_dev("embedding, a shard of the vocabulary", dt, o, want, t * h);
  gpu_free(o);
  memcpy(want, out0, sizeof(float) * (size_t)(t * h));
  k_embedding(want, ids, table, t, h, v_lo, v_local, true);
  o = up(out0, t * h, dt);
  gpu_embedding(S, dt, o, dids, dtab, t, h, v_lo, v_local, true);
  expect_dev("embedding, acc", dt, o, want, t * h);
  char e[400];
  void *ws = gpu_alloc(gpu_embedding_backward_ws(dt, v_local, h, t) + 4, e, sizeof e);
  for (int acc = 0; acc < 2; acc++) {
    float *wt = copy(dt0, v_local * h);
    k_embedding_backward(wt, dout, ids, t, h, v_lo, v_local, acc);
    void *g = acc ? up(dt0, v_local * h, dt) : poisoned(v_local * h, dt);
    gpu_embedding_backward(S, dt, g, dt, ddout, dids, t, h, v_lo, v_local, acc, ws);
    expect_dev(acc ? "embedding backward, acc" : "embedding backward", dt, g, wt, v_local * h);
    gpu_free(g);
    if (dt != GPU_F32) {
      /* the gradient of a 16-bit table kept in f32: summed there, not rounded to 16 bits */
      memcpy(wt, dt0, sizeof(float) * (size_t)(v_local * h));
      k_embedding_backward(wt, dout, ids, t, h, v_lo, v_local, acc);
      g = acc ? up(dt0, v_local * h, GPU_F32) : poisoned(v_local * h, GPU_F32);
      gpu_embedding_backward(S, dt, g, GPU_F32, ddout, dids, t, h, v_lo, v_local, acc, ws);
      expect_dev(acc ? "embedding backward into f32, acc" : "embedding backward into f32", GPU_F32, g, wt,
                 v_local * h);
      gpu_free(g);
    }
    free(wt);
  }
  /* learned positions */
  int64_t b = 3, s = 17;
  float *x = randn(b * s * h, 1), *pos = randn(s * h, 1), *dy = randn(b * s * h, 1);
  round_all(x, b * s * h, dt), round_all(pos, s * h, dt), round_all(dy, b * s * h, dt);
  float *wy = malloc(sizeof(float) * (size_t)(b * s * h)), *wdpos = copy(pos, s * h), *wdx = copy(x, b * s * h);
  k_add_position(wy, x, pos, b, s, h);
  k_add_position_backward(wdx, wdpos, dy, b, s, h, true);
  void *dx = up(x, b * s * h, dt), *dpos = up(pos, s * h, dt), *ddy = up(dy, b * s * h, dt), *y = poisoned(b * s * h, dt);
  gpu_add_position(S, dt, y, dx, dpos, b, s, h);
  expect_dev("add_position", dt, y, wy, b * s * h);
  gpu_add_position_backward(S, dt, dx, dpos, dt, ddy, b, s, h, true);
  expect_dev("add_position backward dx, acc", dt, dx, wdx, b * s * h);
  expect_dev("add_position backward dtable, acc", dt, dpos, wdpos, s * h);
  if (dt != GPU_F32) {
    /* the table's gradient kept in f32 */
    float *w32 = calloc((size_t)(s * h), sizeof(float));
    k_add_position_backward(NULL, w32, dy, b, s, h, false);
    void *p32 = poisoned(s * h, GPU_F32);
    gpu_add_position_backward(S, dt, NULL, p32, GPU_F32, ddy, b, s, h, false);
    expect_dev("add_position backward dtable into f32", GPU_F32, p32, w32, s * h);
    gpu_free(p32), free(w32);
  }
  gpu_free(dids), gpu_free(dtab), gpu_free(ddout), gpu_free(o), gpu_free(ws), gpu_free(dx), gpu_free(dpos), gpu_free(ddy);
  gpu_free(y);
  free(ids), free(table), free(out0), free(dout), free(dt0), free(want), free(x), free(pos), free(dy), free(wy);
  free(wdpos), free(wdx);
}

/* Rows of h elements: 100 takes the first LayerNorm kernels; multiples of
 * 16 bytes the kernels that read rows in chunks (1, 2, 4 and 8 chunks a
 * lane at 64, 512, 768 and 2048 16-bit elements; 1, 4 and 8 at 64, 512
 * and 768 f32; 2048 f32 are more chunks than those kernels take). */
static const char *shaped(char *buf, const char *what, int64_t rows, int64_t h) {
  snprintf(buf, 160, "%s %lldx%lld", what, (long long)rows, (long long)h);
  return buf;
}

static void check_norms_at(int dt, int64_t rows, int64_t h) {
  char e[400], what[160];
  float *x = randn(rows * h, 1), *w = randn(h, 1), *b = randn(h, 1), *dy = randn(rows * h, 1);
  float *dx0 = randn(rows * h, 1), *dw0 = randn(h, 1), *db0 = randn(h, 1);
  for (int64_t i = 0; i < rows * h; i++) x[i] += 0.5f;
  round_all(x, rows * h, dt), round_all(w, h, dt), round_all(b, h, dt), round_all(dy, rows * h, dt);
  round_all(dx0, rows * h, dt), round_all(dw0, h, dt), round_all(db0, h, dt);
  void *dX = up(x, rows * h, dt), *dW = up(w, h, dt), *dB = up(b, h, dt), *dDY = up(dy, rows * h, dt);
  float *want = malloc(sizeof(float) * (size_t)(rows * h));
  k_layernorm(want, x, w, b, rows, h, 1e-5);
  void *y = poisoned(rows * h, dt);
  gpu_layernorm(S, dt, y, dX, dW, dB, rows, h, 1e-5);
  expect_dev(shaped(what, "layernorm", rows, h), dt, y, want, rows * h);
  float *wdx = copy(dx0, rows * h), *wdw = copy(dw0, h), *wdb = copy(db0, h);
  k_layernorm_backward(wdx, wdw, wdb, dy, x, w, rows, h, 1e-5, true);
  void *gx = up(dx0, rows * h, dt), *gw = up(dw0, h, dt), *gb = up(db0, h, dt);
  void *ws = gpu_alloc(gpu_layernorm_backward_ws(rows, h), e, sizeof e);
  gpu_layernorm_backward(S, dt, gx, gw, gb, dt, dDY, dX, dW, rows, h, 1e-5, true, true, ws);
  expect_dev(shaped(what, "layernorm backward dx, acc", rows, h), dt, gx, wdx, rows * h);
  expect_dev(shaped(what, "layernorm backward dw, acc", rows, h), dt, gw, wdw, h);
  expect_dev(shaped(what, "layernorm backward db, acc", rows, h), dt, gb, wdb, h);
  {
    /* no dx; the weight's and bias's gradients written in f32 */
    float *s3 = malloc(sizeof(float) * (size_t)h), *s4 = malloc(sizeof(float) * (size_t)h);
    k_layernorm_backward(NULL, s3, s4, dy, x, w, rows, h, 1e-5, false);
    void *gw32 = poisoned(h, GPU_F32), *gb32 = poisoned(h, GPU_F32);
    gpu_layernorm_backward(S, dt, NULL, gw32, gb32, GPU_F32, dDY, dX, dW, rows, h, 1e-5, false, false, ws);
    expect_dev(shaped(what, "layernorm backward, no dx: dw in f32", rows, h), GPU_F32, gw32, s3, h);
    expect_dev(shaped(what, "layernorm backward, no dx: db in f32", rows, h), GPU_F32, gb32, s4, h);
    gpu_free(gw32), gpu_free(gb32), free(s3), free(s4);
  }
  k_rmsnorm(want, x, w, rows, h, 1e-6);
  gpu_rmsnorm(S, dt, y, dX, dW, rows, h, 1e-6);
  expect_dev(shaped(what, "rmsnorm", rows, h), dt, y, want, rows * h);
  free(wdx), free(wdw);
  wdx = malloc(sizeof(float) * (size_t)(rows * h)), wdw = malloc(sizeof(float) * (size_t)h);
  k_rmsnorm_backward(wdx, wdw, dy, x, w, rows, h, 1e-6, false);
  gpu_free(gx), gpu_free(gw), gpu_free(ws);
  gx = poisoned(rows * h, dt), gw = poisoned(h, dt);
  ws = gpu_alloc(gpu_rmsnorm_backward_ws(rows, h), e, sizeof e);
  gpu_rmsnorm_backward(S, dt, gx, gw, dDY, dX, dW, rows, h, 1e-6, false, ws);
  expect_dev(shaped(what, "rmsnorm backward dx", rows, h), dt, gx, wdx, rows * h);
  expect_dev(shaped(what, "rmsnorm backward dw", rows, h), dt, gw, wdw, h);
  gpu_free(dX), gpu_free(dW), gpu_free(dB), gpu_free(dDY), gpu_free(y), gpu_free(gx), gpu_free(gw), gpu_free(gb);
  gpu_free(ws);
  free(x), free(w), free(b), free(dy), free(dx0), free(dw0), free(db0), free(want), free(wdx), free(wdw), free(wdb);
}

static void check_norms(int dt) {
  check_norms_at(dt, 37, 100);
  check_norms_at(dt, 70, 64);
  check_norms_at(dt, 20, 512);
  check_norms_at(dt, 45, 768);
  check_norms_at(dt, 33, 2048);
}

/* The backward kernels of the operators that write gradients over
 * uncleared buffers when they are the first to write them (first_writes
 * in exec.c, ckernel_overwrites in ops.c), not accumulating, on poisoned
 * outputs: every element written. (The products, attention, embedding,
 * softmax, silu, rmsnorm and cross entropy are checked so above and
 * below.) */

static void check_overwrites(int dt) {
  char e[400];
  int64_t rows = 37, h = 100, n = rows * h, b = 2, sq = 5;
  float *x = randn(n, 1), *u = randn(n, 1), *w = randn(h, 1), *dy = randn(n, 1);
  for (int64_t i = 0; i < n; i++) x[i] += 0.5f;
  round_all(x, n, dt), round_all(u, n, dt), round_all(w, h, dt), round_all(dy, n, dt);
  void *dX = up(x, n, dt), *dU = up(u, n, dt), *dW = up(w, h, dt), *dDY = up(dy, n, dt);
  float *w1 = malloc(sizeof(float) * (size_t)n), *w2 = malloc(sizeof(float) * (size_t)n), *w3 = malloc(sizeof(float) * (size_t)h);
  void *g1 = poisoned(n, dt), *g2 = poisoned(n, dt), *g3 = poisoned(h, dt);
  void *ws = gpu_alloc(gpu_layernorm_backward_ws(rows, h), e, sizeof e);
  float *w4 = malloc(sizeof(float) * (size_t)h);
  k_layernorm_backward(w1, w3, w4, dy, x, w, rows, h, 1e-5, false);
  gpu_layernorm_backward(S, dt, g1, g3, g2, dt, dDY, dX, dW, rows, h, 1e-5, false, false, ws);
  expect_dev("layernorm backward dx, written", dt, g1, w1, n);
  expect_dev("layernorm backward dw, written", dt, g3, w3, h);
  expect_dev("layernorm backward db, written", dt, g2, w4, h);
  {
    /* dx written in scratch (ccall.own) while the weight's and bias's
     * gradients, kept in f32, are added to */
    float *a3 = randn(h, 1), *a4 = randn(h, 1), *wdx = malloc(sizeof(float) * (size_t)n);
    float *s3 = copy(a3, h), *s4 = copy(a4, h);
    k_layernorm_backward(wdx, s3, s4, dy, x, w, rows, h, 1e-5, false);
    for (int64_t j = 0; j < h; j++) s3[j] += a3[j], s4[j] += a4[j];
    k_layernorm_backward(wdx, NULL, NULL, dy, x, w, rows, h, 1e-5, false);
    void *gx = poisoned(n, dt), *gw = up(a3, h, GPU_F32), *gb = up(a4, h, GPU_F32);
    gpu_layernorm_backward(S, dt, gx, gw, gb, GPU_F32, dDY, dX, dW, rows, h, 1e-5, false, true, ws);
    expect_dev("layernorm backward dx written, dw and db added", dt, gx, wdx, n);
    expect_dev("  dw added in f32", GPU_F32, gw, s3, h);
    expect_dev("  db added in f32", GPU_F32, gb, s4, h);
    gpu_free(gx), gpu_free(gw), gpu_free(gb), free(a3), free(a4), free(wdx), free(s3), free(s4);
  }
  gpu_free(g1), gpu_free(g2), g1 = poisoned(n, dt), g2 = poisoned(n, dt);
  k_gelu_backward(w1, dy, x, n, false);
  gpu_gelu_backward(S, dt, g1, dDY, dX, n, false);
  expect_dev("gelu backward, written", dt, g1, w1, n);
  gpu_free(g1), g1 = poisoned(n, dt);
  k_swiglu_backward(w1, w2, dy, x, u, n, false);
  gpu_swiglu_backward(S, dt, g1, g2, dDY, dX, dU, n, false);
  expect_dev("swiglu backward dgate, written", dt, g1, w1, n);
  expect_dev("swiglu backward dup, written", dt, g2, w2, n);
  gpu_free(g1), gpu_free(g2), g1 = poisoned(n, dt), g2 = poisoned(n, dt);
  k_add_backward(w1, w2, dy, n, false);
  gpu_add_backward(S, dt, g1, g2, dDY, n, false);
  expect_dev("add backward da, written", dt, g1, w1, n);
  expect_dev("add backward db, written", dt, g2, w2, n);
  /* rows = b x sq positions of h */
  gpu_free(g1), gpu_free(g3), g1 = poisoned(b * sq * h, dt), g3 = poisoned(sq * h, dt);
  float *wp = malloc(sizeof(float) * (size_t)(sq * h));
  k_add_position_backward(w1, wp, dy, b, sq, h, false);
  gpu_add_position_backward(S, dt, g1, g3, dt, dDY, b, sq, h, false);
  expect_dev("add_position backward dx, written", dt, g1, w1, b * sq * h);
  expect_dev("add_position backward dtable, written", dt, g3, wp, sq * h);
  gpu_free(dX), gpu_free(dU), gpu_free(dW), gpu_free(dDY), gpu_free(g1), gpu_free(g2), gpu_free(g3), gpu_free(ws);
  free(x), free(u), free(w), free(dy), free(w1), free(w2), free(w3), free(w4), free(wp);
}

static void check_elementwise(int dt) {
  int64_t n = 1000;
  float *x = randn(n, 2), *u = randn(n, 1), *dy = randn(n, 1), *g0 = randn(n, 1);
  round_all(x, n, dt), round_all(u, n, dt), round_all(dy, n, dt), round_all(g0, n, dt);
  void *dX = up(x, n, dt), *dU = up(u, n, dt), *dDY = up(dy, n, dt);
  float *want = malloc(sizeof(float) * (size_t)n), *want2 = malloc(sizeof(float) * (size_t)n);
  void *y = poisoned(n, dt);
  k_gelu(want, x, n);
  gpu_gelu(S, dt, y, dX, n);
  expect_dev("gelu (tanh)", dt, y, want, n);
  memcpy(want, g0, sizeof(float) * (size_t)n);
  k_gelu_backward(want, dy, x, n, true);
  void *g = up(g0, n, dt);
  gpu_gelu_backward(S, dt, g, dDY, dX, n, true);
  expect_dev("gelu backward, acc", dt, g, want, n);
  k_silu(want, x, n);
  gpu_silu(S, dt, y, dX, n);
  expect_dev("silu", dt, y, want, n);
  k_silu_backward(want, dy, x, n, false);
  gpu_silu_backward(S, dt, g, dDY, dX, n, false);
  expect_dev("silu backward", dt, g, want, n);
  k_swiglu(want, x, u, n);
  gpu_swiglu(S, dt, y, dX, dU, n);
  expect_dev("swiglu", dt, y, want, n);
  memcpy(want, g0, sizeof(float) * (size_t)n), memcpy(want2, g0, sizeof(float) * (size_t)n);
  k_swiglu_backward(want, want2, dy, x, u, n, true);
  void *g2 = up(g0, n, dt);
  gpu_free(g);
  g = up(g0, n, dt);
  gpu_swiglu_backward(S, dt, g, g2, dDY, dX, dU, n, true);
  expect_dev("swiglu backward dgate, acc", dt, g, want, n);
  expect_dev("swiglu backward dup, acc", dt, g2, want2, n);
  k_add(want, x, u, n);
  gpu_add(S, dt, y, dX, dU, n);
  expect_dev("add", dt, y, want, n);
  memcpy(want, g0, sizeof(float) * (size_t)n), memcpy(want2, g0, sizeof(float) * (size_t)n);
  k_add_backward(want, want2, dy, n, true);
  gpu_free(g), gpu_free(g2);
  g = up(g0, n, dt), g2 = up(g0, n, dt);
  gpu_add_backward(S, dt, g, g2, dDY, n, true);
  expect_dev("add backward da (gradient added)", dt, g, want, n);
  expect_dev("add backward db (gradient added)", dt, g2, want2, n);
  k_add_backward(want, NULL, dy, n, false);
  gpu_add_backward(S, dt, g, NULL, dDY, n, false);
  expect_dev("add backward da alone", dt, g, want, n);
  gpu_free(dX), gpu_free(dU), gpu_free(dDY), gpu_free(y), gpu_free(g), gpu_free(g2);
  free(x), free(u), free(dy), free(g0), free(want), free(want2);
}

static void check_rotary(int dt) {
  int64_t b = 2, s = 19, heads = 3, dh = 16, pos0 = 5, n = b * s * heads * dh;
  float *x = randn(n, 1), *g0 = randn(n, 1);
  round_all(x, n, dt), round_all(g0, n, dt);
  float *want = malloc(sizeof(float) * (size_t)n);
  k_rotary(want, x, b, s, heads, dh, pos0, 10000.0);
  void *dX = up(x, n, dt), *y = poisoned(n, dt);
  gpu_rotary(S, dt, y, dX, b, s, heads, dh, pos0, 10000.0, 1.0, false);
  expect_dev("rotary", dt, y, want, n);
  memcpy(want, g0, sizeof(float) * (size_t)n);
  k_rotary_backward(want, x, b, s, heads, dh, pos0, 10000.0, true);
  void *g = up(g0, n, dt);
  gpu_rotary(S, dt, g, dX, b, s, heads, dh, pos0, 10000.0, -1.0, true);
  expect_dev("rotary backward, acc", dt, g, want, n);
  gpu_free(dX), gpu_free(y), gpu_free(g);
  free(x), free(g0), free(want);
}

static void check_attention(int dt, int64_t b, int64_t s, int64_t heads, int64_t dh) {
  char e[400], what[96];
  int64_t c = heads * dh, nq = b * s * 3 * c, no = b * s * c;
  float *qkv = randn(nq, 1), *dout = randn(no, 1), *g0 = randn(nq, 1);
  round_all(qkv, nq, dt), round_all(dout, no, dt), round_all(g0, nq, dt);
  float *want = malloc(sizeof(float) * (size_t)no), *wg = copy(g0, nq);
  k_causal_attention(want, qkv, b, s, heads, dh);
  k_causal_attention_backward(wg, dout, qkv, b, s, heads, dh, true);
  gpu_attn a = {b, s, heads, dh, 1, 3 * c, 3 * c, c, s * 3 * c, s * 3 * c, s * c, s, 0, false};
  void *dqkv = up(qkv, nq, dt), *dO = up(dout, no, dt), *o = poisoned(no, dt);
  size_t t = gpu_dtype_size(dt);
  float *lse = gpu_alloc(gpu_attention_stats_bytes(&a), e, sizeof e);
  gpu_attention(S, dt, o, dqkv, (char *)dqkv + c * t, (char *)dqkv + 2 * c * t, &a, lse);
  snprintf(what, sizeof what, "causal_attention b%lld s%lld heads%lld dh%lld", (long long)b, (long long)s,
           (long long)heads, (long long)dh);
  expect_dev(what, dt, o, want, no);
  void *ws = gpu_alloc(gpu_attention_backward_ws(dt, &a, false), e, sizeof e);
  /* from the forward's log-sum-exp and result, then with the forward again */
  for (int kept = 1; kept >= 0; kept--) {
    void *g = up(g0, nq, dt);
    gpu_attention_backward(S, dt, g, (char *)g + c * t, (char *)g + 2 * c * t, dO, dqkv, (char *)dqkv + c * t,
                           (char *)dqkv + 2 * c * t, &a, true, kept ? lse : NULL, kept ? o : NULL, ws);
    snprintf(what, sizeof what, "causal_attention backward dqkv, acc (dh %lld)%s", (long long)dh,
             kept ? ", the forward's log-sum-exp" : ", the forward again");
    expect_dev(what, dt, g, wg, nq);
    gpu_free(g);
  }
  /* written, not added to: the call cuDNN's path takes too (WEFT_ATTN=cudnn) */
  float *wz = calloc((size_t)nq, sizeof(float));
  k_causal_attention_backward(wz, dout, qkv, b, s, heads, dh, false);
  void *gz = poisoned(nq, dt);
  gpu_attention_backward(S, dt, gz, (char *)gz + c * t, (char *)gz + 2 * c * t, dO, dqkv, (char *)dqkv + c * t,
                         (char *)dqkv + 2 * c * t, &a, false, lse, o, ws);
  snprintf(what, sizeof what, "causal_attention backward dqkv, written (dh %lld), the forward's log-sum-exp",
           (long long)dh);
  expect_dev(what, dt, gz, wz, nq);
  gpu_free(gz), free(wz);
  gpu_free(dqkv), gpu_free(dO), gpu_free(o), gpu_free(ws), gpu_free(lse);
  free(qkv), free(dout), free(g0), free(want), free(wg);
}

static void check_gqa_at(int dt, int64_t sq, int64_t sk, int64_t q0, int64_t dh, int64_t shift);

/* Queries [q0, q0 + sq) of a sequence of sk against all its keys (sq = sk,
 * q0 = 0: the whole; else a part, as context parallelism gives). */
static void check_gqa(int dt, int64_t sq, int64_t sk, int64_t q0, int64_t dh) {
  check_gqa_at(dt, sq, sk, q0, dh, 0);
}

/* A device copy of x with `shift` elements before it (so that its rows
 * need not start on 16 bytes); *base: what to free. */
static void *up_shifted(const float *x, int64_t n, int dt, int64_t shift, void **base) {
  float *y = calloc((size_t)(n + shift), sizeof(float));
  memcpy(y + shift, x, sizeof(float) * (size_t)n);
  *base = up(y, n + shift, dt);
  free(y);
  return (char *)*base + shift * gpu_dtype_size(dt);
}

/* check_gqa with every tensor `shift` elements off the allocation's start. */
static void check_gqa_at(int dt, int64_t sq, int64_t sk, int64_t q0, int64_t dh, int64_t shift) {
  char e[400], what[160];
  int64_t b = 2, g = 2, r = 2, nq = b * sq * g * r * dh, nk = b * sk * g * dh;
  float *q = randn(nq, 1), *k = randn(nk, 1), *v = randn(nk, 1), *dout = randn(nq, 1);
  round_all(q, nq, dt), round_all(k, nk, dt), round_all(v, nk, dt), round_all(dout, nq, dt);
  float *want = malloc(sizeof(float) * (size_t)nq), *wq = malloc(sizeof(float) * (size_t)nq);
  float *wk = malloc(sizeof(float) * (size_t)nk), *wv = malloc(sizeof(float) * (size_t)nk);
  k_gqa_attention(want, q, k, v, b, sq, sk, q0, g, r, dh);
  k_gqa_attention_backward(wq, wk, wv, dout, q, k, v, b, sq, sk, q0, g, r, dh, false);
  gpu_attn a = {b,         sq, g * r, dh, r, g * r * dh, g * dh, g * r * dh, sq * g * r * dh, sk * g * dh,
                sq * g * r * dh, sk, q0, false};
  void *bq, *bk, *bv, *bo, *bO, *bgq, *bgk, *bgv;
  void *dq = up_shifted(q, nq, dt, shift, &bq), *dk = up_shifted(k, nk, dt, shift, &bk);
  void *dv = up_shifted(v, nk, dt, shift, &bv), *dO = up_shifted(dout, nq, dt, shift, &bO);
  float *nan = malloc(sizeof(float) * (size_t)(nq > nk ? nq : nk));
  for (int64_t i = 0; i < (nq > nk ? nq : nk); i++) nan[i] = NAN;
  void *o = up_shifted(nan, nq, dt, shift, &bo);
  float *lse = gpu_alloc(gpu_attention_stats_bytes(&a), e, sizeof e);
  gpu_attention(S, dt, o, dq, dk, dv, &a, lse);
  snprintf(what, sizeof what, "gqa_attention g2 r2 dh%lld, queries [%lld, %lld) of %lld%s", (long long)dh, (long long)q0,
           (long long)(q0 + sq), (long long)sk, shift ? ", rows off 16 bytes" : "");
  expect_dev(what, dt, o, want, nq);
  void *ws = gpu_alloc(gpu_attention_backward_ws(dt, &a, false), e, sizeof e);
  /* from the forward's log-sum-exp and result, then with the forward again */
  for (int kept = 1; kept >= 0; kept--) {
    const char *how = kept ? ", the forward's log-sum-exp" : ", the forward again";
    void *gq = up_shifted(nan, nq, dt, shift, &bgq), *gk = up_shifted(nan, nk, dt, shift, &bgk);
    void *gv = up_shifted(nan, nk, dt, shift, &bgv);
    gpu_attention_backward(S, dt, gq, gk, gv, dO, dq, dk, dv, &a, false, kept ? lse : NULL, kept ? o : NULL, ws);
    snprintf(what, sizeof what, "gqa_attention backward dq, queries [%lld, %lld) dh%lld%s", (long long)q0,
             (long long)(q0 + sq), (long long)dh, how);
    expect_dev(what, dt, gq, wq, nq);
    snprintf(what, sizeof what, "gqa_attention backward dk (query heads summed), queries [%lld, %lld)%s", (long long)q0,
             (long long)(q0 + sq), how);
    expect_dev(what, dt, gk, wk, nk);
    snprintf(what, sizeof what, "gqa_attention backward dv (query heads summed), queries [%lld, %lld)%s", (long long)q0,
             (long long)(q0 + sq), how);
    expect_dev(what, dt, gv, wv, nk);
    gpu_free(bgq), gpu_free(bgk), gpu_free(bgv);
  }
  free(nan);
  gpu_free(bq), gpu_free(bk), gpu_free(bv), gpu_free(bO), gpu_free(bo), gpu_free(ws), gpu_free(lse);
  free(q), free(k), free(v), free(dout), free(want), free(wq), free(wk), free(wv);
}

/* The tensor-core kernels (16-bit heads of 32 to 128) at sizes that cut
 * their tiles (128 queries or keys a block, tiles of 64): sequences not a
 * multiple of them, grouped queries, parts of a sequence (context
 * parallelism), rows that do not start on 16 bytes. big: sequences of 1024
 * too. */
static void check_attention_tc(int dt, bool big) {
  for (int64_t dh = dt == GPU_F16 ? 64 : 32; dh <= 128; dh += dt == GPU_F16 ? 64 : 32) check_attention(dt, 1, 150, 2, dh);
  check_gqa(dt, 100, 260, 130, 96);  /* a middle part: 130 is not on a tile */
  check_gqa_at(dt, 65, 65, 0, 128, 3);
  if (dt == GPU_BF16 || big) { /* f16 runs the same code as bf16: a few */
    check_gqa(dt, 150, 150, 0, 128);
    check_gqa(dt, 70, 200, 130, 64); /* the last part */
    check_gqa(dt, 129, 129, 0, 32);  /* one row past a block */
    check_gqa_at(dt, 90, 150, 40, 64, 1);
  }
  if (big) check_attention(dt, 1, 1024, 2, 64), check_attention(dt, 1, 1024, 1, 128), check_gqa(dt, 512, 1024, 512, 64);
}

/* The mma.sync forward's other shapes (WEFT_ATTN_FA_SHAPE: 4 or 8 warps of
 * one query tile for heads up to 64, 4 above): a middle part of a
 * sequence, rows off 16 bytes, a head of 128. */
static void check_attention_fa_shapes(void) {
  const char *shapes[2] = {"4", "8"};
  for (int i = 0; i < 2; i++) {
    setenv("WEFT_ATTN_FA_SHAPE", shapes[i], 1);
    check_gqa(GPU_BF16, 100, 260, 130, 64);
    check_gqa_at(GPU_F16, 65, 65, 0, 32, 3);
  }
  setenv("WEFT_ATTN_FA_SHAPE", "4", 1);
  check_gqa(GPU_BF16, 70, 200, 130, 128);
  unsetenv("WEFT_ATTN_FA_SHAPE");
}

/* The warpgroup product of wgmma.cuh (attention_wg.cu), A 64 x 64 by B
 * laid out either way in swizzled tiles, against sums in double of the
 * same 16-bit inputs (f32 sums of 64 exact products: f32's tolerance).
 * Where the GPU does not run it (compute capability other than 9.0, or
 * WEFT_ATTN_WG=off) it says so and checks nothing; returns whether it ran. */
static bool check_wgmma(int dt) {
  char e[400];
  float *a = randn(4096, 1), *bkn = randn(4096, 1), *bnk = malloc(4096 * 4), *want = malloc(8192 * 4);
  round_all(a, 4096, dt), round_all(bkn, 4096, dt);
  for (int k = 0; k < 64; k++)
    for (int n = 0; n < 64; n++) bnk[n * 64 + k] = bkn[k * 64 + n];
  for (int i = 0; i < 64; i++)
    for (int j = 0; j < 64; j++) {
      double sum = 0;
      for (int k = 0; k < 64; k++) sum += (double)a[i * 64 + k] * bkn[k * 64 + j];
      want[i * 64 + j] = want[4096 + i * 64 + j] = (float)sum;
    }
  void *da = up(a, 4096, dt), *dnk = up(bnk, 4096, dt), *dkn = up(bkn, 4096, dt);
  float *d = gpu_alloc(16384 * 4, e, sizeof e), *got = malloc(16384 * 4);
  if (!d) die("gpu_alloc", e);
  bool ran = gpu_wgmma_check(S, dt, d, da, dnk, dkn);
  if (!ran) {
    printf("kernel wgmma m64n64k16 %s: not run here (compute capability 9.0 alone, and not under WEFT_ATTN_WG=off): "
           "not checked\n", dt_name(dt));
  } else {
    if (!gpu_check("wgmma", e, sizeof e) || !gpu_download(got, d, 16384 * 4, S, e, sizeof e)) die("wgmma", e);
    char what[2][80];
    snprintf(what[0], sizeof what[0], "wgmma m64n64k16 (%s): A B, B K-major", dt_name(dt));
    snprintf(what[1], sizeof what[1], "wgmma m64n64k16 (%s): A B, B MN-major", dt_name(dt));
    for (int c = 0; c < 2; c++) expect(what[c], GPU_F32, copy(got + 4096 * c, 4096), want + 4096 * c, 4096);
    /* the diagnostics: which reading of the layouts the GPU makes, where
     * the two above fail (A from shared memory rules out or in the
     * registers' layout; the MN-major offsets swapped, their order) */
    const char *diag[2] = {"A too from shared memory, B K-major", "B MN-major, the descriptor's offsets swapped"};
    for (int c = 0; c < 2; c++) {
      double num = 0, den = 0;
      for (int i = 0; i < 4096; i++) {
        double x = (double)got[8192 + 4096 * c + i] - want[i];
        num += x * x, den += (double)want[i] * want[i];
      }
      double rel = sqrt(num / den);
      printf("wgmma m64n64k16 (%s), a diagnostic: %s: rel err %.2e, %s\n", dt_name(dt), diag[c], rel,
             rel <= 2e-5 ? "the product" : "not the product");
    }
  }
  free(got), free(a), free(bkn), free(bnk), free(want);
  gpu_free(d), gpu_free(da), gpu_free(dnk), gpu_free(dkn);
  return ran;
}

/* The forward's result, then q|k|v's gradients (written, from the
 * forward's log-sum-exp) of causal attention in type dt at b, s, heads of 64, with
 * the backward's occupancy `shape` (WEFT_ATTN_FA_BWD_SHAPE) and the
 * blocks' `order` (WEFT_ATTN_FA_ORDER), as floats on the host. */
static float *fa_results(int dt, const char *shape, const char *order, const float *qkv, const float *dout, int64_t b,
                         int64_t s, int64_t heads) {
  char e[400];
  int64_t dh = 64, c = heads * dh, nq = b * s * 3 * c, no = b * s * c;
  size_t t = gpu_dtype_size(dt);
  gpu_attn a = {b, s, heads, dh, 1, 3 * c, 3 * c, c, s * 3 * c, s * 3 * c, s * c, s, 0, false};
  void *dqkv = up(qkv, nq, dt), *dO = up(dout, no, dt), *o = poisoned(no, dt), *g = poisoned(nq, dt);
  float *lse = gpu_alloc(gpu_attention_stats_bytes(&a), e, sizeof e);
  void *ws = gpu_alloc(gpu_attention_backward_ws(dt, &a, false), e, sizeof e);
  if (!lse || !ws) die("gpu_alloc", e);
  setenv("WEFT_ATTN_FA_BWD_SHAPE", shape, 1), setenv("WEFT_ATTN_FA_ORDER", order, 1);
  gpu_attention(S, dt, o, dqkv, (char *)dqkv + c * t, (char *)dqkv + 2 * c * t, &a, lse);
  gpu_attention_backward(S, dt, g, (char *)g + c * t, (char *)g + 2 * c * t, dO, dqkv, (char *)dqkv + c * t,
                         (char *)dqkv + 2 * c * t, &a, false, lse, o, ws);
  unsetenv("WEFT_ATTN_FA_BWD_SHAPE"), unsetenv("WEFT_ATTN_FA_ORDER");
  float *h = malloc(sizeof(float) * (size_t)(no + nq)), *ho = down(o, no, dt), *hg = down(g, nq, dt);
  memcpy(h, ho, sizeof(float) * (size_t)no), memcpy(h + no, hg, sizeof(float) * (size_t)nq);
  free(ho), free(hg);
  gpu_free(dqkv), gpu_free(dO), gpu_free(o), gpu_free(g), gpu_free(lse), gpu_free(ws);
  return h;
}

/* The mma.sync kernels at heads of 64 in the backward's other occupancies
 * (WEFT_ATTN_FA_BWD_SHAPE=K,Q: dk/dv's rows from shared memory in 3 or 4
 * blocks an SM, dq's in 4) and in the blocks' other order
 * (WEFT_ATTN_FA_ORDER=heads): against the CPU's (batches and heads,
 * grouped queries, a middle part of a sequence, rows off 16 bytes, f16),
 * then bit for bit the default's (2,3, by tiles) at two tiles and a cut
 * one of 150 positions, 2 batches of 3 heads: the forward's result and
 * the gradients, dq left out where atomics sum it (WEFT_ATTN=fa-atomic,
 * whose order varies); not where WEFT_ATTN names a way not of these
 * kernels. */
static void check_attention_fa_bwd_shapes(void) {
  const char *shapes[4] = {"3,3", "4,4", "2,4", "2,3"}, *orders[4] = {"tiles", "tiles", "heads", "heads"};
  for (int i = 0; i < 4; i++) {
    setenv("WEFT_ATTN_FA_BWD_SHAPE", shapes[i], 1), setenv("WEFT_ATTN_FA_ORDER", orders[i], 1);
    check_attention(GPU_BF16, 2, 150, 3, 64);
    check_gqa(GPU_BF16, 100, 260, 130, 64);
    check_gqa_at(GPU_F16, 90, 150, 40, 64, 1);
  }
  unsetenv("WEFT_ATTN_FA_BWD_SHAPE"), unsetenv("WEFT_ATTN_FA_ORDER");
  /* the bits are the mma.sync kernels': where WEFT_ATTN (read once, when
   * the plugin first runs attention) names another way, it runs these
   * heads and the comparison would say nothing of them */
  const char *way = getenv("WEFT_ATTN");
  const bool atomic = way && strcmp(way, "fa-atomic") == 0;
  if (way && *way && strcmp(way, "fa") != 0 && !atomic) {
    printf("causal_attention (dh 64), the occupancies and orders bit for bit: not compared under WEFT_ATTN=%s\n", way);
    return;
  }
  int64_t b = 2, s = 150, heads = 3, c = heads * 64, nq = b * s * 3 * c, no = b * s * c;
  /* bf16, then f16, whose 10 bits of mantissa show more of a sum's order */
  for (int d = 0; d < 2; d++) {
    const int dt = d ? GPU_F16 : GPU_BF16;
    float *qkv = randn(nq, 1), *dout = randn(no, 1);
    round_all(qkv, nq, dt), round_all(dout, no, dt);
    float *base = fa_results(dt, "2,3", "tiles", qkv, dout, b, s, heads);
    for (int i = 0; i < 4; i++) {
      float *got = fa_results(dt, shapes[i], orders[i], qkv, dout, b, s, heads);
      int64_t differ = 0, n = 0;
      for (int64_t j = 0; j < no + nq; j++) {
        if (atomic && j >= no && (j - no) % (3 * c) < c) continue; /* dq */
        n++;
        if (memcmp(&got[j], &base[j], sizeof(float)) != 0) differ++;
      }
      checks++;
      if (differ) failures++;
      printf("causal_attention (dh 64) %s, WEFT_ATTN_FA_BWD_SHAPE=%s WEFT_ATTN_FA_ORDER=%s against 2,3 by tiles: %lld "
             "of %lld elements (out, %s) differ in their bits %s\n", dt_name(dt), shapes[i], orders[i], (long long)differ,
             (long long)n, atomic ? "dk, dv" : "dq, dk, dv", differ ? "FAIL" : "ok");
      free(got);
    }
    free(base), free(qkv), free(dout);
  }
}

/* The backward on Hopper's warpgroup products (WEFT_ATTN_FA_BWD_SHAPE=wg),
 * where the GPU runs it (else the default would run in its place, and pass
 * for it): the product itself, then the kernels against the CPU's in the
 * cases of the occupancies above, and how many bits differ from the
 * default's (other products, other roundings: said, not required; the
 * checks against the CPU's are its checks). The last of the checks, so
 * that a fault of these on a GPU loses no other. */
static void check_attention_wg(void) {
  const bool wg_bf16 = check_wgmma(GPU_BF16), wg = check_wgmma(GPU_F16) && wg_bf16;
  /* the kernels run where the plugin takes them (its self-check passed):
   * elsewhere the default would run under their name, and pass for them */
  gpu_attn probe = {2, 150, 3, 64, 1, 576, 576, 192, 150 * 576, 150 * 576, 150 * 192, 150, 0, false};
  const char *why = wg ? gpu_attention_wg_refusal(GPU_BF16, &probe) : "not on this GPU";
  if (why) {
    printf("causal_attention (dh 64), WEFT_ATTN_FA_BWD_SHAPE=wg: its kernels do not run here (%s): not checked\n", why);
    return;
  }
  /* the backward's three shapes, with the forward on the same products
   * (WEFT_ATTN_FA_SHAPE=wg) */
  const char *shapes[3] = {"wg", "wg2", "wgp"};
  setenv("WEFT_ATTN_FA_SHAPE", "wg", 1);
  for (int i = 0; i < 3; i++) {
    setenv("WEFT_ATTN_FA_BWD_SHAPE", shapes[i], 1);
    check_attention(GPU_BF16, 2, 150, 3, 64);
    check_gqa(GPU_BF16, 100, 260, 130, 64);
    check_gqa_at(GPU_F16, 90, 150, 40, 64, 1);
  }
  unsetenv("WEFT_ATTN_FA_BWD_SHAPE"), unsetenv("WEFT_ATTN_FA_SHAPE");
  const char *way = getenv("WEFT_ATTN");
  if (way && *way && strcmp(way, "fa") != 0) {
    printf("causal_attention (dh 64), wg against 2,3: not compared under WEFT_ATTN=%s\n", way);
    return;
  }
  int64_t b = 2, s = 150, heads = 3, c = heads * 64, nq = b * s * 3 * c, no = b * s * c;
  for (int d = 0; d < 2; d++) {
    const int dt = d ? GPU_F16 : GPU_BF16;
    float *qkv = randn(nq, 1), *dout = randn(no, 1);
    round_all(qkv, nq, dt), round_all(dout, no, dt);
    float *base = fa_results(dt, "2,3", "tiles", qkv, dout, b, s, heads);
    float *got[3];
    for (int i = 0; i < 3; i++) {
      got[i] = fa_results(dt, shapes[i], "tiles", qkv, dout, b, s, heads);
      int64_t differ = 0;
      double worst = 0;
      for (int64_t j = 0; j < no + nq; j++) {
        if (memcmp(&got[i][j], &base[j], sizeof(float)) != 0) differ++;
        double rel = fabs((double)got[i][j] - base[j]) / (fabs((double)base[j]) + 1e-3);
        worst = rel > worst ? rel : worst;
      }
      printf("causal_attention (dh 64) %s, WEFT_ATTN_FA_BWD_SHAPE=%s against 2,3: %lld of %lld elements differ in "
             "their bits, by at most %.1e of the element (+ 1e-3)\n", dt_name(dt), shapes[i], (long long)differ,
             (long long)(no + nq), worst);
    }
    /* the forward on the warpgroup products: its result against fa's */
    setenv("WEFT_ATTN_FA_SHAPE", "wg", 1);
    float *fw = fa_results(dt, "2,3", "tiles", qkv, dout, b, s, heads);
    unsetenv("WEFT_ATTN_FA_SHAPE");
    int64_t fdiffer = 0;
    for (int64_t j = 0; j < no; j++)
      if (memcmp(&fw[j], &base[j], sizeof(float)) != 0) fdiffer++;
    printf("causal_attention (dh 64) %s, WEFT_ATTN_FA_SHAPE=wg (the forward) against fa's: %lld of %lld elements of "
           "out differ in their bits\n", dt_name(dt), (long long)fdiffer, (long long)no);
    free(fw);
    /* wg2 and wgp differ from wg in registers and order of issue alone:
     * the same products of the same operands, the same bits */
    for (int i = 1; i < 3; i++) {
      int64_t differ = 0;
      for (int64_t j = 0; j < no + nq; j++)
        if (memcmp(&got[0][j], &got[i][j], sizeof(float)) != 0) differ++;
      checks++;
      if (differ) failures++;
      printf("causal_attention (dh 64) %s, WEFT_ATTN_FA_BWD_SHAPE=%s against wg: %lld of %lld elements differ in their "
             "bits %s\n", dt_name(dt), shapes[i], (long long)differ, (long long)(no + nq), differ ? "FAIL" : "ok");
    }
    free(got[0]), free(got[1]), free(got[2]), free(base), free(qkv), free(dout);
  }
}

/* The backward asked for part of the gradients (dq alone; dk and dv
 * alone), adding into gradients that hold values, from the forward's
 * log-sum-exp: grouped queries, a middle part of a sequence. The part not
 * asked for stays as it was. */
static void check_attention_parts(int dt, int64_t dh) {
  char e[400], what[160];
  int64_t b = 1, g = 2, r = 2, sq = 100, sk = 230, q0 = 70, nq = b * sq * g * r * dh, nk = b * sk * g * dh;
  float *q = randn(nq, 1), *k = randn(nk, 1), *v = randn(nk, 1), *dout = randn(nq, 1);
  float *gq0 = randn(nq, 0.1), *gk0 = randn(nk, 0.1), *gv0 = randn(nk, 0.1);
  float *all[7] = {q, k, v, dout, gq0, gk0, gv0};
  int64_t len[7] = {nq, nk, nk, nq, nq, nk, nk};
  for (int i = 0; i < 7; i++) round_all(all[i], len[i], dt);
  float *want = malloc(sizeof(float) * (size_t)nq), *wq = copy(gq0, nq), *wk = copy(gk0, nk), *wv = copy(gv0, nk);
  k_gqa_attention(want, q, k, v, b, sq, sk, q0, g, r, dh);
  k_gqa_attention_backward(wq, wk, wv, dout, q, k, v, b, sq, sk, q0, g, r, dh, true);
  gpu_attn a = {b,         sq, g * r, dh, r, g * r * dh, g * dh, g * r * dh, sq * g * r * dh, sk * g * dh,
                sq * g * r * dh, sk, q0, false};
  void *dq = up(q, nq, dt), *dk = up(k, nk, dt), *dv = up(v, nk, dt), *dO = up(dout, nq, dt), *o = poisoned(nq, dt);
  float *lse = gpu_alloc(gpu_attention_stats_bytes(&a), e, sizeof e);
  void *ws = gpu_alloc(gpu_attention_backward_ws(dt, &a, true), e, sizeof e);
  gpu_attention(S, dt, o, dq, dk, dv, &a, lse);
  for (int part = 0; part < 2; part++) {
    void *gq = up(gq0, nq, dt), *gk = up(gk0, nk, dt), *gv = up(gv0, nk, dt);
    gpu_attention_backward(S, dt, part ? NULL : gq, part ? gk : NULL, part ? gv : NULL, dO, dq, dk, dv, &a, true, lse,
                           o, ws);
    const char *how = part ? "dk and dv alone, acc" : "dq alone, acc";
    snprintf(what, sizeof what, "gqa_attention backward dq, %s (dh %lld)", how, (long long)dh);
    expect_dev(what, dt, gq, part ? gq0 : wq, nq);
    snprintf(what, sizeof what, "gqa_attention backward dk, %s (dh %lld)", how, (long long)dh);
    expect_dev(what, dt, gk, part ? wk : gk0, nk);
    snprintf(what, sizeof what, "gqa_attention backward dv, %s (dh %lld)", how, (long long)dh);
    expect_dev(what, dt, gv, part ? wv : gv0, nk);
    gpu_free(gq), gpu_free(gk), gpu_free(gv);
  }
  gpu_free(dq), gpu_free(dk), gpu_free(dv), gpu_free(dO), gpu_free(o), gpu_free(lse), gpu_free(ws);
  for (int i = 0; i < 7; i++) free(all[i]);
  free(want), free(wq), free(wk), free(wv);
}

/* Attention without a mask (T5's): sq queries against sk keys of another
 * length, n heads of dh; the backward from the forward's log-sum-exp and
 * result, then with the forward again, adding into gradients that hold
 * values. */
static void check_attention_full(int dt, int64_t b, int64_t sq, int64_t sk, int64_t n, int64_t dh) {
  char e[400], what[160];
  int64_t c = n * dh, nq = b * sq * c, nk = b * sk * c;
  float *q = randn(nq, 1), *k = randn(nk, 1), *v = randn(nk, 1), *dout = randn(nq, 1);
  float *gq0 = randn(nq, 0.1), *gk0 = randn(nk, 0.1), *gv0 = randn(nk, 0.1);
  round_all(q, nq, dt), round_all(k, nk, dt), round_all(v, nk, dt), round_all(dout, nq, dt);
  round_all(gq0, nq, dt), round_all(gk0, nk, dt), round_all(gv0, nk, dt);
  float *want = malloc(sizeof(float) * (size_t)nq), *wq = copy(gq0, nq), *wk = copy(gk0, nk), *wv = copy(gv0, nk);
  k_attention(want, q, k, v, b, sq, sk, n, dh);
  k_attention_backward(wq, wk, wv, dout, q, k, v, b, sq, sk, n, dh, true);
  gpu_attn a = {b, sq, n, dh, 1, c, c, c, sq * c, sk * c, sq * c, sk, 0, false};
  void *dq = up(q, nq, dt), *dk = up(k, nk, dt), *dv = up(v, nk, dt), *dO = up(dout, nq, dt), *o = poisoned(nq, dt);
  float *lse = gpu_alloc(gpu_attention_stats_bytes(&a), e, sizeof e);
  void *ws = gpu_alloc(gpu_attention_full_backward_ws(dt, &a, false), e, sizeof e);
  if (!lse || !ws) die("gpu_alloc", e);
  gpu_attention_full(S, dt, o, dq, dk, dv, &a, lse);
  snprintf(what, sizeof what, "attention (no mask) b%lld, %lld queries, %lld keys, heads%lld dh%lld", (long long)b,
           (long long)sq, (long long)sk, (long long)n, (long long)dh);
  expect_dev(what, dt, o, want, nq);
  for (int kept = 1; kept >= 0; kept--) {
    const char *how = kept ? "the forward's log-sum-exp" : "the forward again";
    void *gq = up(gq0, nq, dt), *gk = up(gk0, nk, dt), *gv = up(gv0, nk, dt);
    gpu_attention_full_backward(S, dt, gq, gk, gv, dO, dq, dk, dv, &a, true, kept ? lse : NULL, kept ? o : NULL, ws);
    snprintf(what, sizeof what, "attention (no mask) backward dq, acc, %lld of %lld keys, %s", (long long)sq,
             (long long)sk, how);
    expect_dev(what, dt, gq, wq, nq);
    snprintf(what, sizeof what, "attention (no mask) backward dk, acc, %s", how);
    expect_dev(what, dt, gk, wk, nk);
    snprintf(what, sizeof what, "attention (no mask) backward dv, acc, %s", how);
    expect_dev(what, dt, gv, wv, nk);
    gpu_free(gq), gpu_free(gk), gpu_free(gv);
  }
  /* written, not added to, from the forward's log-sum-exp: the call
   * cuDNN's path takes too (WEFT_ATTN=cudnn) */
  float *zq = calloc((size_t)nq, sizeof(float)), *zk = calloc((size_t)nk, sizeof(float));
  float *zv = calloc((size_t)nk, sizeof(float));
  k_attention_backward(zq, zk, zv, dout, q, k, v, b, sq, sk, n, dh, false);
  void *gq = poisoned(nq, dt), *gk = poisoned(nk, dt), *gv = poisoned(nk, dt);
  gpu_attention_full_backward(S, dt, gq, gk, gv, dO, dq, dk, dv, &a, false, lse, o, ws);
  expect_dev("attention (no mask) backward dq, written, the forward's log-sum-exp", dt, gq, zq, nq);
  expect_dev("attention (no mask) backward dk, written", dt, gk, zk, nk);
  expect_dev("attention (no mask) backward dv, written", dt, gv, zv, nk);
  gpu_free(gq), gpu_free(gk), gpu_free(gv), free(zq), free(zk), free(zv);
  gpu_free(dq), gpu_free(dk), gpu_free(dv), gpu_free(dO), gpu_free(o), gpu_free(lse), gpu_free(ws);
  free(q), free(k), free(v), free(dout), free(gq0), free(gk0), free(gv0), free(want), free(wq), free(wk), free(wv);
}

/* The moves of the Swin Transformer (patches, windows, merging) and mean
 * pooling, forward, and backward adding into gradients that hold values
 * (window_reverse's overwriting). */
static void check_swin_moves(int dt) {
  char what[120];
  /* patches: 2 images of 3 channels, 3 x 5 patches of 2 x 2 */
  int64_t b = 2, c = 3, hn = 3, wn = 5, p = 2, n = b * c * hn * p * wn * p;
  float *x = randn(n, 1), *dy = randn(n, 1), *g0 = randn(n, 1);
  round_all(x, n, dt), round_all(dy, n, dt), round_all(g0, n, dt);
  float *want = malloc(sizeof(float) * (size_t)n), *wg = copy(g0, n);
  k_patchify(want, x, b, c, hn, wn, p);
  k_patchify_backward(wg, dy, b, c, hn, wn, p, true);
  void *dx = up(x, n, dt), *ddy = up(dy, n, dt), *o = poisoned(n, dt), *g = up(g0, n, dt);
  gpu_patch_move(S, dt, o, dx, b, c, hn, wn, p, true, false);
  expect_dev("patchify", dt, o, want, n);
  gpu_patch_move(S, dt, g, ddy, b, c, hn, wn, p, false, true);
  expect_dev("patchify backward, acc", dt, g, wg, n);
  gpu_free(dx), gpu_free(ddy), gpu_free(o), gpu_free(g), free(x), free(dy), free(g0), free(want), free(wg);
  /* windows of 3 x 3 on a grid of 3 x 2 windows, shifted by 0 and 1 */
  int64_t ws = 3, ch = 5;
  hn = 3, wn = 2, n = b * hn * ws * wn * ws * ch;
  x = randn(n, 1), dy = randn(n, 1), g0 = randn(n, 1);
  round_all(x, n, dt), round_all(dy, n, dt), round_all(g0, n, dt);
  want = malloc(sizeof(float) * (size_t)n), wg = malloc(sizeof(float) * (size_t)n);
  dx = up(x, n, dt), ddy = up(dy, n, dt), o = poisoned(n, dt);
  for (int64_t shift = 0; shift < 2; shift++) {
    k_window_partition(want, x, b, hn, wn, ws, ch, shift);
    gpu_window_move(S, dt, o, dx, b, hn, wn, ws, ch, shift, true, false);
    snprintf(what, sizeof what, "window_partition, shift %lld", (long long)shift);
    expect_dev(what, dt, o, want, n);
    k_window_reverse(want, x, b, hn, wn, ws, ch, shift);
    gpu_window_move(S, dt, o, dx, b, hn, wn, ws, ch, shift, false, false);
    snprintf(what, sizeof what, "window_reverse, shift %lld", (long long)shift);
    expect_dev(what, dt, o, want, n);
    memcpy(wg, g0, sizeof(float) * (size_t)n);
    k_window_partition_backward(wg, dy, b, hn, wn, ws, ch, shift, true);
    g = up(g0, n, dt);
    gpu_window_move(S, dt, g, ddy, b, hn, wn, ws, ch, shift, false, true);
    snprintf(what, sizeof what, "window_partition backward, acc, shift %lld", (long long)shift);
    expect_dev(what, dt, g, wg, n);
    gpu_free(g);
    k_window_reverse_backward(wg, dy, b, hn, wn, ws, ch, shift, false);
    g = poisoned(n, dt);
    gpu_window_move(S, dt, g, ddy, b, hn, wn, ws, ch, shift, true, false);
    snprintf(what, sizeof what, "window_reverse backward, shift %lld", (long long)shift);
    expect_dev(what, dt, g, wg, n);
    gpu_free(g);
  }
  gpu_free(dx), gpu_free(ddy), gpu_free(o), free(x), free(dy), free(g0), free(want), free(wg);
  /* merging: a grid of 6 x 4 tokens of 7 channels into 3 x 2 */
  hn = 3, wn = 2, ch = 7, n = b * 4 * hn * wn * ch;
  x = randn(n, 1), dy = randn(n, 1), g0 = randn(n, 1);
  round_all(x, n, dt), round_all(dy, n, dt), round_all(g0, n, dt);
  want = malloc(sizeof(float) * (size_t)n), wg = copy(g0, n);
  k_patch_merge(want, x, b, hn, wn, ch);
  k_patch_merge_backward(wg, dy, b, hn, wn, ch, true);
  dx = up(x, n, dt), ddy = up(dy, n, dt), o = poisoned(n, dt), g = up(g0, n, dt);
  gpu_patch_merge(S, dt, o, dx, b, hn, wn, ch, true, false);
  expect_dev("patch_merge", dt, o, want, n);
  gpu_patch_merge(S, dt, g, ddy, b, hn, wn, ch, false, true);
  expect_dev("patch_merge backward, acc", dt, g, wg, n);
  gpu_free(dx), gpu_free(ddy), gpu_free(o), gpu_free(g), free(x), free(dy), free(g0), free(want), free(wg);
  /* mean pooling: 37 of a grid's 50 tokens (a partial sum), added */
  int64_t hw = 37, count = 50;
  b = 3, ch = 20, n = b * hw * ch;
  x = randn(n, 1), dy = randn(b * ch, 1), g0 = randn(n, 1);
  float *o0 = randn(b * ch, 1);
  round_all(x, n, dt), round_all(dy, b * ch, dt), round_all(g0, n, dt), round_all(o0, b * ch, dt);
  want = copy(o0, b * ch), wg = copy(g0, n);
  k_mean_pool(want, x, b, hw, ch, count, true);
  k_mean_pool_backward(wg, dy, b, hw, ch, count, true);
  dx = up(x, n, dt), ddy = up(dy, b * ch, dt), o = up(o0, b * ch, dt), g = up(g0, n, dt);
  gpu_mean_pool(S, dt, o, dx, b, hw, ch, count, true);
  expect_dev("mean_pool, 37 of 50 tokens, acc", dt, o, want, b * ch);
  gpu_mean_pool_backward(S, dt, g, ddy, b, hw, ch, count, true);
  expect_dev("mean_pool backward, acc", dt, g, wg, n);
  gpu_free(dx), gpu_free(ddy), gpu_free(o), gpu_free(g);
  free(x), free(dy), free(g0), free(o0), free(want), free(wg);
}

/* Window attention on windows hn0.. and wn0.. of a grid of hn_all x wn_all
 * windows of ws x ws: forward, then the backward adding into dqkv and the
 * bias table's gradient (into f32 when the tensors are 16-bit). */
static void check_window_attention(int dt, int64_t ws, int64_t heads, int64_t dh, int64_t hn, int64_t wn,
                                   int64_t hn0, int64_t wn0, int64_t hn_all, int64_t wn_all, int64_t shift) {
  char e[400], what[200];
  int64_t b = 2, s = ws * ws, c = heads * dh, nr = (2 * ws - 1) * (2 * ws - 1);
  int64_t nq = b * hn * wn * s * 3 * c, no = b * hn * wn * s * c, nt = nr * heads;
  swin_attn_dims cz = {b, hn, wn, ws, heads, dh, hn0, wn0, hn_all, wn_all, shift};
  gpu_swin_attn z = {b, hn, wn, ws, heads, dh, hn0, wn0, hn_all, wn_all, shift};
  float *qkv = randn(nq, 1), *table = randn(nt, 1), *dout = randn(no, 1), *g0 = randn(nq, 0.1), *t0 = randn(nt, 0.1);
  /* the table's gradient kept in f32 (as a 16-bit model's weight): its start is not rounded */
  round_all(qkv, nq, dt), round_all(table, nt, dt), round_all(dout, no, dt), round_all(g0, nq, dt);
  float *want = malloc(sizeof(float) * (size_t)no), *wg = copy(g0, nq), *wt = copy(t0, nt);
  k_window_attention(want, qkv, table, &cz);
  k_window_attention_backward(wg, wt, dout, qkv, table, &cz, true);
  void *dqkv = up(qkv, nq, dt), *dtab = up(table, nt, dt), *dO = up(dout, no, dt), *o = poisoned(no, dt);
  gpu_window_attention(S, dt, o, dqkv, dtab, &z);
  snprintf(what, sizeof what, "window_attention ws%lld heads%lld dh%lld, windows (%lld, %lld) of %lldx%lld, shift %lld",
           (long long)ws, (long long)heads, (long long)dh, (long long)hn0, (long long)wn0, (long long)hn_all,
           (long long)wn_all, (long long)shift);
  expect_dev(what, dt, o, want, no);
  void *ws_mem = gpu_alloc(gpu_window_attention_backward_ws(&z), e, sizeof e);
  if (!ws_mem) die("gpu_alloc", e);
  void *g = up(g0, nq, dt), *gt = up(t0, nt, GPU_F32);
  gpu_window_attention_backward(S, dt, g, gt, GPU_F32, dO, dqkv, dtab, &z, true, ws_mem);
  snprintf(what, sizeof what, "window_attention backward dqkv, acc (ws%lld, shift %lld)", (long long)ws, (long long)shift);
  expect_dev(what, dt, g, wg, nq);
  snprintf(what, sizeof what, "window_attention backward dtable into f32, acc (ws%lld)", (long long)ws);
  expect(what, dt, down(gt, nt, GPU_F32), wt, nt);
  /* the table's gradient alone, overwritten */
  gpu_free(gt);
  gt = poisoned(nt, dt);
  k_window_attention_backward(NULL, wt, dout, qkv, table, &cz, false);
  gpu_window_attention_backward(S, dt, NULL, gt, dt, dO, dqkv, dtab, &z, false, ws_mem);
  snprintf(what, sizeof what, "window_attention backward dtable alone (ws%lld)", (long long)ws);
  expect_dev(what, dt, gt, wt, nt);
  gpu_free(dqkv), gpu_free(dtab), gpu_free(dO), gpu_free(o), gpu_free(g), gpu_free(gt), gpu_free(ws_mem);
  free(qkv), free(table), free(dout), free(g0), free(t0), free(want), free(wg), free(wt);
}

static void check_softmax(int dt) {
  int64_t rows = 23, cols = 300;
  float *x = randn(rows * cols, 2), *dy = randn(rows * cols, 1);
  round_all(x, rows * cols, dt), round_all(dy, rows * cols, dt);
  float *want = malloc(sizeof(float) * (size_t)(rows * cols));
  void *dX = up(x, rows * cols, dt), *dDY = up(dy, rows * cols, dt), *y = poisoned(rows * cols, dt);
  k_softmax(want, x, rows, cols);
  gpu_softmax(S, dt, y, dX, rows, cols);
  expect_dev("softmax", dt, y, want, rows * cols);
  k_softmax_backward(want, dy, x, rows, cols, false);
  gpu_softmax_backward(S, dt, y, dDY, dX, rows, cols, false);
  expect_dev("softmax backward", dt, y, want, rows * cols);
  gpu_free(dX), gpu_free(dDY), gpu_free(y);
  free(x), free(dy), free(want);
}

/* Cross entropy over rows at every alignment, as the kernels read them
 * in 16-byte chunks (a head, chunks, a tail): t = 9 rows of v elements,
 * so that with v odd the rows of 2-byte elements start at each of the 8
 * offsets from 16 bytes (f32: 4), the logits at a 16-byte boundary or one
 * element after it; v below one chunk, a few chunks, and more than the
 * chunks a block holds in registers (4501: read again for the gradient).
 * The loss, the gradient (written, and added to), a shard's statistics and
 * its gradient (labels partly outside the shard, which starts at 2), and
 * once a gradient whose rows are aligned otherwise than the logits'. */
static void *up_off(const float *x, int64_t n, int dt, void **base);

static void check_ce_rows(int dt) {
  char e[400], what[96];
  const int64_t vs[] = {1, 7, 8, 9, 300, 4501}, t = 9, lo = 2;
  double *slot = gpu_alloc(8, e, sizeof e);
  void *ws = gpu_alloc(gpu_loss_ws(t), e, sizeof e);
  if (!slot || !ws) die("gpu_alloc", e);
  for (size_t vi = 0; vi < sizeof vs / sizeof vs[0]; vi++)
    for (int off = 0; off < 2; off++) {
      int64_t v = vs[vi], n = t * v;
      float *x = randn(n, 3), *g0 = randn(n, 1), *want = malloc(sizeof(float) * (size_t)n);
      round_all(x, n, dt), round_all(g0, n, dt);
      int32_t lab[9], glab[9];
      for (int64_t i = 0; i < t; i++) lab[i] = (int32_t)(urand() * v), glab[i] = (int32_t)(urand() * (v + 4));
      int32_t *dlab = up_ids(lab, t), *dglab = up_ids(glab, t);
      void *bx = NULL, *bg = NULL, *bp = NULL;
      void *dx = off ? up_off(x, n, dt, &bx) : (bx = up(x, n, dt));
      void *dg = off ? up_off(g0, n, dt, &bg) : (bg = up(g0, n, dt));
      float *nan = malloc(sizeof(float) * (size_t)n);
      for (int64_t i = 0; i < n; i++) nan[i] = NAN;
      void *dp = off ? up_off(nan, n, dt, &bp) : (bp = up(nan, n, dt));
      snprintf(what, sizeof what, "cross_entropy, rows of %lld%s", (long long)v, off ? ", +1 element" : "");
      gpu_cross_entropy(S, dt, slot, NULL, dx, 0, dlab, t, v, t, false, ws);
      expect_loss(what, dt, slot, k_cross_entropy(x, lab, t, v, t));
      k_cross_entropy_backward(want, x, lab, t, v, t, 1.0, false);
      gpu_cross_entropy_backward(S, dt, dp, 0, dx, 0, dlab, t, v, t, false);
      snprintf(what, sizeof what, "  its backward%s", off ? ", +1 element" : "");
      expect_dev(what, dt, dp, want, n);
      /* the loss and the gradient at once, over the logits (the executor's
       * loss_in_place): the backward's very bits */
      void *bi = NULL, *di = off ? up_off(x, n, dt, &bi) : (bi = up(x, n, dt));
      gpu_cross_entropy_in_place(S, dt, slot, NULL, di, 0, dlab, t, v, t, false, ws);
      snprintf(what, sizeof what, "  in place: the loss%s", off ? ", +1 element" : "");
      expect_loss(what, dt, slot, k_cross_entropy(x, lab, t, v, t));
      snprintf(what, sizeof what, "  in place: the gradient%s", off ? ", +1 element" : "");
      expect_dev(what, dt, di, want, n);
      float *gi = down(di, n, dt), *gb = down(dp, n, dt);
      checks++;
      bool same = memcmp(gi, gb, sizeof(float) * (size_t)n) == 0;
      if (!same) failures++;
      printf("kernel %-44s %-4s %s\n", off ? "  in place: the backward's bits, +1 element" : "  in place: the backward's bits",
             dt_name(dt), same ? "ok" : "FAIL");
      free(gi), free(gb), gpu_free(bi);
      memcpy(want, g0, sizeof(float) * (size_t)n);
      k_cross_entropy_backward(want, x, lab, t, v, t, 1.0, true);
      gpu_cross_entropy_backward(S, dt, dg, 0, dx, 0, dlab, t, v, t, true);
      snprintf(what, sizeof what, "  its backward, acc%s", off ? ", +1 element" : "");
      expect_dev(what, dt, dg, want, n);
      if (v == 300) {
        /* the gradient one element off the logits' alignment */
        void *bq = NULL, *dq = off ? (bq = up(nan, n, dt)) : up_off(nan, n, dt, &bq);
        k_cross_entropy_backward(want, x, lab, t, v, t, 1.0, false);
        gpu_cross_entropy_backward(S, dt, dq, 0, dx, 0, dlab, t, v, t, false);
        expect_dev("  its backward, aligned otherwise than the logits", dt, dq, want, n);
        gpu_free(bq);
      }
      /* one shard of a vocabulary, from lo on */
      float st[27], mx[9], sm[9], tg[9];
      k_cross_entropy_stats(st, x, glab, t, lo, v);
      float *ds = poisoned(t * 3, GPU_F32);
      gpu_cross_entropy_stats(S, dt, ds, dx, dglab, t, lo, v);
      snprintf(what, sizeof what, "  a shard's statistics (f32)%s", off ? ", +1 element" : "");
      expect_dev(what, GPU_F32, ds, st, t * 3);
      gpu_free(ds);
      k_cross_entropy_merge(mx, sm, tg, st, 1, t);
      float *dst = up(st, t * 3, GPU_F32);
      memcpy(want, g0, sizeof(float) * (size_t)n);
      k_cross_entropy_shard_backward(want, x, glab, mx, sm, t, lo, v, t, 1.0, true);
      void *bh = NULL, *dh = off ? up_off(g0, n, dt, &bh) : (bh = up(g0, n, dt));
      gpu_cross_entropy_shard_backward(S, dt, dh, dx, dglab, dst, 1, t, lo, v, t, true);
      snprintf(what, sizeof what, "  a shard's backward, acc%s", off ? ", +1 element" : "");
      expect_dev(what, dt, dh, want, n);
      gpu_free(bx), gpu_free(bg), gpu_free(bp), gpu_free(bh), gpu_free(dst), gpu_free(dlab), gpu_free(dglab);
      free(x), free(g0), free(want), free(nan);
    }
  gpu_free(slot), gpu_free(ws);
}

/* t rows of v elements every ld on the device against want (packed), and
 * the padding after each row still NaN. */
static void expect_rows(void *dev, const char *what, const char *pads_what, int dt, const float *want, int64_t t,
                        int64_t v, int64_t ld) {
  float *got = down(dev, t * ld, dt), *rows = malloc(sizeof(float) * (size_t)(t * v));
  bool pads = true;
  for (int64_t i = 0; i < t; i++) {
    memcpy(rows + i * v, got + i * ld, sizeof(float) * (size_t)v);
    for (int64_t j = v; j < ld; j++) pads &= isnan(got[i * ld + j]);
  }
  expect(what, dt, rows, want, t * v); /* takes rows */
  checks++;
  if (!pads) failures++;
  printf("kernel %-44s %-4s %s\n", pads_what, dt_name(dt), pads ? "ok" : "FAIL");
  free(got);
}

/* Cross entropy on rows padded to 16 bytes (a row of 257 elements every
 * 264, or 260 in f32), as the CUDA backend lays out logits whose rows are
 * not (pad_rows in exec.c): the loss and the gradient the same as packed,
 * the padding untouched. */
static void check_ce_pitch(int dt) {
  char e[400];
  int64_t t = 6, v = 257, q = 16 / gpu_dtype_size(dt), ld = (v + q - 1) / q * q;
  float *x = randn(t * v, 2), *xp = malloc(sizeof(float) * (size_t)(t * ld)), *nan = malloc(sizeof(float) * (size_t)(t * ld));
  round_all(x, t * v, dt);
  int32_t lab[6];
  for (int64_t i = 0; i < t; i++) lab[i] = (int32_t)(urand() * v);
  for (int64_t i = 0; i < t * ld; i++) nan[i] = NAN;
  memcpy(xp, nan, sizeof(float) * (size_t)(t * ld));
  for (int64_t i = 0; i < t; i++) memcpy(xp + i * ld, x + i * v, sizeof(float) * (size_t)v);
  int32_t *dlab = up_ids(lab, t);
  void *dx = up(xp, t * ld, dt), *dg = up(nan, t * ld, dt), *ws = gpu_alloc(gpu_loss_ws(t), e, sizeof e);
  double *slot = gpu_alloc(8, e, sizeof e);
  gpu_cross_entropy(S, dt, slot, NULL, dx, ld, dlab, t, v, t, false, ws);
  expect_loss("cross_entropy, rows of 257 padded", dt, slot, k_cross_entropy(x, lab, t, v, t));
  float *want = malloc(sizeof(float) * (size_t)(t * v));
  k_cross_entropy_backward(want, x, lab, t, v, t, 1.0, false);
  gpu_cross_entropy_backward(S, dt, dg, ld, dx, ld, dlab, t, v, t, false);
  expect_rows(dg, "  its backward, padded rows", "  its backward leaves the padding", dt, want, t, v, ld);
  /* the loss and the gradient at once over padded rows */
  void *di = up(xp, t * ld, dt);
  gpu_cross_entropy_in_place(S, dt, slot, NULL, di, ld, dlab, t, v, t, false, ws);
  expect_loss("  in place over padded rows: the loss", dt, slot, k_cross_entropy(x, lab, t, v, t));
  expect_rows(di, "  in place over padded rows: the gradient", "  in place leaves the padding", dt, want, t, v, ld);
  gpu_free(di);
  free(x), free(xp), free(nan), free(want);
  gpu_free(dlab), gpu_free(dx), gpu_free(dg), gpu_free(ws), gpu_free(slot);
}

static void check_losses(int dt) {
  char e[400];
  int64_t t = 37, v = 300, t_total = 2 * t, split = 130;
  float *logits = randn(t * v, 2), *g0 = randn(t * v, 1);
  round_all(logits, t * v, dt), round_all(g0, t * v, dt);
  int32_t *labels = malloc(sizeof(int32_t) * (size_t)t);
  for (int64_t i = 0; i < t; i++) labels[i] = (int32_t)(urand() * v);
  void *dl = up(logits, t * v, dt), *ws = gpu_alloc(gpu_loss_ws(t), e, sizeof e);
  int32_t *dlab = up_ids(labels, t);
  double *slot = gpu_alloc(8, e, sizeof e);
  void *out = poisoned(1, dt);
  double want = k_cross_entropy(logits, labels, t, v, t_total);
  gpu_cross_entropy(S, dt, slot, out, dl, 0, dlab, t, v, t_total, false, ws);
  expect_loss("cross_entropy (loss share)", dt, slot, want);
  float wantf = (float)want;
  expect_dev("cross_entropy (its output)", dt, out, &wantf, 1);
  float *wg = copy(g0, t * v);
  k_cross_entropy_backward(wg, logits, labels, t, v, t_total, 1.0, true);
  void *g = up(g0, t * v, dt);
  gpu_cross_entropy_backward(S, dt, g, 0, dl, 0, dlab, t, v, t_total, true);
  expect_dev("cross_entropy backward (fused), acc", dt, g, wg, t * v);
  /* two shards of the vocabulary: statistics, gathered [t][2][3], loss, backward */
  float *part[2] = {malloc(sizeof(float) * (size_t)(t * split)), malloc(sizeof(float) * (size_t)(t * (v - split)))};
  for (int64_t i = 0; i < t; i++) {
    memcpy(part[0] + i * split, logits + i * v, sizeof(float) * (size_t)split);
    memcpy(part[1] + i * (v - split), logits + i * v + split, sizeof(float) * (size_t)(v - split));
  }
  int64_t lo[2] = {0, split}, len[2] = {split, v - split};
  float *stats = malloc(sizeof(float) * (size_t)(t * 6)), *st = malloc(sizeof(float) * (size_t)(t * 3));
  float *gathered = malloc(sizeof(float) * (size_t)(t * 6));
  for (int p = 0; p < 2; p++) {
    k_cross_entropy_stats(st, part[p], labels, t, lo[p], len[p]);
    void *dp = up(part[p], t * len[p], dt);
    float *ds = poisoned(t * 3, GPU_F32);
    gpu_cross_entropy_stats(S, dt, ds, dp, dlab, t, lo[p], len[p]);
    expect_dev(p ? "cross_entropy statistics (f32), shard 2" : "cross_entropy statistics (f32), shard 1", GPU_F32, ds,
               st, t * 3);
    float *got = down(ds, t * 3, GPU_F32);
    for (int64_t i = 0; i < t; i++)
      for (int j = 0; j < 3; j++) stats[i * 6 + p * 3 + j] = st[i * 3 + j], gathered[i * 6 + p * 3 + j] = got[i * 3 + j];
    free(got);
    gpu_free(dp), gpu_free(ds);
  }
  float *mx = malloc(sizeof(float) * (size_t)t), *sm = malloc(sizeof(float) * (size_t)t), *tg = malloc(sizeof(float) * (size_t)t);
  k_cross_entropy_merge(mx, sm, tg, stats, 2, t);
  want = k_cross_entropy_combine(mx, sm, tg, t, t_total);
  float *dstats = up(gathered, t * 6, GPU_F32);
  gpu_cross_entropy_combine(S, dt, slot, out, dstats, 2, t, t_total, true, false, ws);
  expect_loss("cross_entropy from the shards' statistics", dt, slot, want);
  for (int p = 0; p < 2; p++) {
    float *wsh = malloc(sizeof(float) * (size_t)(t * len[p]));
    k_cross_entropy_shard_backward(wsh, part[p], labels, mx, sm, t, lo[p], len[p], t_total, 1.0, false);
    void *dp = up(part[p], t * len[p], dt), *gs = poisoned(t * len[p], dt);
    gpu_cross_entropy_shard_backward(S, dt, gs, dp, dlab, dstats, 2, t, lo[p], len[p], t_total, false);
    expect_dev(p ? "cross_entropy shard backward, shard 2" : "cross_entropy shard backward, shard 1", dt, gs, wsh,
               t * len[p]);
    gpu_free(dp), gpu_free(gs), free(wsh);
  }
  /* mean squared error */
  int64_t n = 777;
  float *a = randn(n, 1), *b = randn(n, 1);
  round_all(a, n, dt), round_all(b, n, dt);
  void *da = up(a, n, dt), *db = up(b, n, dt);
  want = k_mse(a, b, n, 2 * n);
  gpu_mse(S, dt, slot, out, da, db, n, 2 * n, false, ws);
  expect_loss("mse (loss share)", dt, slot, want);
  float *wa = malloc(sizeof(float) * (size_t)n), *wb = malloc(sizeof(float) * (size_t)n);
  k_mse_backward(wa, wb, a, b, n, 2 * n, 1.0, false);
  void *ga = poisoned(n, dt), *gb = poisoned(n, dt);
  gpu_mse_backward(S, dt, ga, gb, da, db, n, 2 * n, false);
  expect_dev("mse backward da", dt, ga, wa, n);
  expect_dev("mse backward db", dt, gb, wb, n);
  gpu_free(dl), gpu_free(ws), gpu_free(dlab), gpu_free(slot), gpu_free(out), gpu_free(g), gpu_free(dstats);
  gpu_free(da), gpu_free(db), gpu_free(ga), gpu_free(gb);
  free(logits), free(g0), free(labels), free(wg), free(part[0]), free(part[1]), free(stats), free(st), free(gathered);
  free(mx), free(sm), free(tg), free(a), free(b), free(wa), free(wb);
  check_ce_rows(dt);
  if (dt == GPU_BF16) check_ce_rows(GPU_F16);
}

/* The mixture of experts: routing (bit for bit), dispatch, combine (with
 * and without normalize) and the load-balancing loss, forward and
 * backward, against k_moe_*; probabilities from a softmax of random
 * logits, a capacity that drops some choices. */
static void check_moe_case(int dt, int64_t g, int64_t s, int64_t h, int64_t e, int64_t k, int64_t c, bool normalize) {
  char e2[400], what[96];
  gpu_moe z = {g, s, h, e, k, c, normalize};
  int64_t nt = g * s * h, np = g * s * e, nr = e * g * c * h, gsk = g * s * k;
  float *logit = randn(np, 2), *x = randn(nt, 1), *ye = randn(nr, 1), *dy = randn(nt, 1), *dout = randn(nr, 1);
  float *probs = malloc(sizeof(float) * (size_t)np);
  k_softmax(probs, logit, g * s, e);
  round_all(probs, np, dt), round_all(x, nt, dt), round_all(ye, nr, dt), round_all(dy, nt, dt), round_all(dout, nr, dt);
  void *dp = up(probs, np, dt), *dx = up(x, nt, dt), *dye = up(ye, nr, dt), *ddy = up(dy, nt, dt), *ddout = up(dout, nr, dt);
  void *ws = gpu_alloc(gpu_moe_ws(&z), e2, sizeof e2);
  double *slot = gpu_alloc(8, e2, sizeof e2);
  if (!ws || !slot) die("gpu_alloc", e2);
  const char *how = normalize ? "" : ", not normalized";
  /* routing: the same experts and slots */
  int32_t *we = malloc(sizeof(int32_t) * (size_t)gsk), *wsl = malloc(sizeof(int32_t) * (size_t)gsk);
  k_moe_route(we, wsl, probs, g, s, e, k, c);
  int32_t *ge = gpu_alloc((size_t)gsk * 4 + 4, e2, sizeof e2), *gsl = gpu_alloc((size_t)gsk * 4 + 4, e2, sizeof e2);
  int32_t *he = malloc(sizeof(int32_t) * (size_t)gsk), *hsl = malloc(sizeof(int32_t) * (size_t)gsk);
  gpu_moe_route(S, dt, ge, gsl, dp, &z, ws);
  if (!gpu_download(he, ge, (size_t)gsk * 4, S, e2, sizeof e2) || !gpu_download(hsl, gsl, (size_t)gsk * 4, S, e2, sizeof e2))
    die("download", e2);
  int64_t diff = 0, dropped = 0;
  for (int64_t i = 0; i < gsk; i++) diff += he[i] != we[i] || hsl[i] != wsl[i], dropped += wsl[i] < 0;
  checks++;
  if (diff) failures++;
  snprintf(what, sizeof what, "moe routing g%lld s%lld e%lld k%lld c%lld", (long long)g, (long long)s, (long long)e,
           (long long)k, (long long)c);
  printf("kernel %-44s %-4s %lld of %lld choices differ (%lld dropped) %s\n", what, dt_name(dt), (long long)diff,
         (long long)gsk, (long long)dropped, diff ? "FAIL" : "ok");
  /* dispatch and its backward (dprobs zeros) */
  float *want = malloc(sizeof(float) * (size_t)(nr > np ? nr : np) + 4);
  k_moe_dispatch(want, x, probs, g, s, h, e, k, c);
  void *o = poisoned(nr, dt);
  gpu_moe_dispatch(S, dt, o, dx, dp, &z, ws);
  expect_dev("moe_dispatch", dt, o, want, nr);
  float *wdx = copy(x, nt);
  k_moe_dispatch_backward(wdx, dout, probs, g, s, h, e, k, c, true);
  void *gx = up(x, nt, dt), *gp = poisoned(np, dt);
  gpu_moe_dispatch_backward(S, dt, gx, gp, ddout, dp, &z, true, ws);
  expect_dev("moe_dispatch backward dx, acc", dt, gx, wdx, nt);
  gpu_moe_dispatch_backward(S, dt, gx, gp, ddout, dp, &z, false, ws);
  k_moe_dispatch_backward(wdx, dout, probs, g, s, h, e, k, c, false);
  expect_dev("moe_dispatch backward dx", dt, gx, wdx, nt);
  memset(want, 0, sizeof(float) * (size_t)np);
  expect_dev("moe_dispatch backward dprobs (zeros)", dt, gp, want, np);
  /* combine and its backward */
  k_moe_combine(want, ye, probs, g, s, h, e, k, c, normalize);
  gpu_free(o);
  o = poisoned(nt, dt);
  gpu_moe_combine(S, dt, o, dye, dp, &z, ws);
  snprintf(what, sizeof what, "moe_combine%s", how);
  expect_dev(what, dt, o, want, nt);
  float *wye = malloc(sizeof(float) * (size_t)nr), *wpr = malloc(sizeof(float) * (size_t)np);
  k_moe_combine_backward(wye, wpr, dy, ye, probs, g, s, h, e, k, c, normalize, false);
  void *gye = poisoned(nr, dt);
  gpu_free(gp);
  gp = poisoned(np, dt);
  gpu_moe_combine_backward(S, dt, gye, gp, ddy, dye, dp, &z, false, ws);
  snprintf(what, sizeof what, "moe_combine backward dye%s", how);
  expect_dev(what, dt, gye, wye, nr);
  snprintf(what, sizeof what, "moe_combine backward dprobs%s", how);
  expect_dev(what, dt, gp, wpr, np);
  float *acc_ye = copy(dout, nr), *acc_pr = copy(logit, np);
  round_all(acc_pr, np, dt);
  k_moe_combine_backward(acc_ye, acc_pr, dy, ye, probs, g, s, h, e, k, c, normalize, true);
  void *aye = up(dout, nr, dt), *apr = up(acc_pr, np, dt);
  float *start = copy(logit, np);
  round_all(start, np, dt);
  gpu_free(apr);
  apr = up(start, np, dt);
  gpu_moe_combine_backward(S, dt, aye, apr, ddy, dye, dp, &z, true, ws);
  snprintf(what, sizeof what, "moe_combine backward, acc%s", how);
  expect_dev(what, dt, aye, acc_ye, nr);
  expect_dev("  its dprobs, acc", dt, apr, acc_pr, np);
  /* the load-balancing loss over 3 g groups, and its backward */
  double loss = k_moe_aux_loss(probs, g, s, e, k, 3 * g, 0.01);
  void *lo = poisoned(1, dt);
  gpu_moe z0 = z;
  z0.c = 0;
  gpu_moe_aux_loss(S, dt, slot, lo, dp, &z0, 3 * g, 0.01, false, ws);
  expect_loss("moe_aux_loss (loss share)", dt, slot, loss);
  float lf = (float)loss;
  expect_dev("moe_aux_loss (its output)", dt, lo, &lf, 1);
  float dl = 0.75f;
  void *ddl = up(&dl, 1, dt);
  memcpy(wpr, start, sizeof(float) * (size_t)np);
  k_moe_aux_loss_backward(wpr, probs, g, s, e, k, 3 * g, 0.01, 0.75, true);
  gpu_free(gp);
  gp = up(start, np, dt);
  gpu_moe_aux_loss_backward(S, dt, gp, ddl, dp, &z0, 3 * g, 0.01, true, ws);
  expect_dev("moe_aux_loss backward (dloss 0.75), acc", dt, gp, wpr, np);
  k_moe_aux_loss_backward(wpr, probs, g, s, e, k, 3 * g, 0.01, 1.0, false);
  gpu_free(gp);
  gp = poisoned(np, dt);
  gpu_moe_aux_loss_backward(S, dt, gp, NULL, dp, &z0, 3 * g, 0.01, false, ws);
  expect_dev("moe_aux_loss backward", dt, gp, wpr, np);
  if (!gpu_sync(e2, sizeof e2)) die("moe", e2);
  void *dev[] = {dp, dx, dye, ddy, ddout, ws, slot, ge, gsl, o, gx, gp, gye, aye, apr, lo, ddl};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) gpu_free(dev[i]);
  float *host[] = {logit, x, ye, dy, dout, probs, want, wdx, wye, wpr, acc_ye, acc_pr, start};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
  free(we), free(wsl), free(he), free(hsl);
}

/* expert_matmul is a product per expert (ops.c): out[x] = in[x] w[x]
 * through gpu_gemm at the experts' offsets, against k_expert_matmul. */
static void check_expert_matmul(int dt) {
  char e[400];
  const int64_t ne = 3, m = 10, k = 7, n = 9;
  size_t wsb = gpu_gemm_ws();
  void *ws = wsb ? gpu_alloc(wsb, e, sizeof e) : NULL;
  float *x = randn(ne * m * k, 1), *w = randn(ne * k * n, 1), *g = randn(ne * m * n, 1);
  round_all(x, ne * m * k, dt), round_all(w, ne * k * n, dt), round_all(g, ne * m * n, dt);
  float *want = malloc(sizeof(float) * (size_t)(ne * m * n)), *wx = malloc(sizeof(float) * (size_t)(ne * m * k)),
        *ww = malloc(sizeof(float) * (size_t)(ne * k * n));
  k_expert_matmul(want, x, w, ne, m, k, n, false);
  k_expert_matmul_backward(wx, ww, g, x, w, ne, m, k, n, false);
  void *dx = up(x, ne * m * k, dt), *dw = up(w, ne * k * n, dt), *dg = up(g, ne * m * n, dt);
  void *o = poisoned(ne * m * n, dt), *gx = poisoned(ne * m * k, dt), *gw = poisoned(ne * k * n, GPU_F32);
  int sz = gpu_dtype_size(dt);
  for (int64_t i = 0; i < ne; i++) {
    const char *xi = (const char *)dx + i * m * k * sz, *wi = (const char *)dw + i * k * n * sz,
               *gi = (const char *)dg + i * m * n * sz;
    if (!gpu_gemm(S, false, false, m, n, k, xi, k, dt, wi, n, dt, (char *)o + i * m * n * sz, n, dt, NULL, false, ws,
                  wsb, false, e, sizeof e) ||
        !gpu_gemm(S, false, true, m, k, n, gi, n, dt, wi, n, dt, (char *)gx + i * m * k * sz, k, dt, NULL, false, ws,
                  wsb, false, e, sizeof e) ||
        !gpu_gemm(S, true, false, k, n, m, xi, k, dt, gi, n, dt, (char *)gw + i * k * n * 4, n, GPU_F32, NULL, false,
                  ws, wsb, false, e, sizeof e))
      die("gemm", e);
  }
  expect_dev("expert_matmul (a product per expert)", dt, o, want, ne * m * n);
  expect_dev("expert_matmul backward dx", dt, gx, wx, ne * m * k);
  expect("expert_matmul backward dw (f32)", dt, down(gw, ne * k * n, GPU_F32), ww, ne * k * n);
  gpu_free(o), gpu_free(gx), gpu_free(gw), gpu_free(dx), gpu_free(dw), gpu_free(dg), gpu_free(ws);
  free(x), free(w), free(g), free(want), free(wx), free(ww);
}

static void check_moe(int dt) {
  check_moe_case(dt, 3, 37, 20, 8, 2, 7, true);    /* a capacity that drops some choices */
  check_moe_case(dt, 2, 45, 33, 5, 3, 40, false);  /* none dropped; 45 tokens: a ballot across two warps' worth */
  check_moe_case(dt, 2, 20, 16, 40, 1, 2, false);  /* more experts than a warp has lanes, top 1 */
  check_expert_matmul(dt);
}

static void check_optimizers(int dt) {
  int64_t n = 1000;
  gpu_optim o = {1e-2, 0.9, 0.999, 1e-8, 0.01, 0.0};
  float *p = randn(n, 1), *m = calloc((size_t)n, 4), *v = calloc((size_t)n, 4);
  round_all(p, n, dt);
  void *dp = up(p, n, dt);
  char e[400];
  float *state = gpu_alloc((size_t)(2 * n) * 4, e, sizeof e);
  gpu_zero(state, (size_t)(2 * n) * 4, S);
  float *master = dt == GPU_F32 ? NULL : up(p, n, GPU_F32);
  for (int step = 1; step <= 3; step++) {
    float *g = randn(n, 1);
    round_all(g, n, dt);
    void *dg = up(g, n, dt);
    k_adamw(p, m, v, g, n, step, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay);
    gpu_adamw(S, dp, dt, master, state, state + n, dg, dt, NULL, n, step, &o);
    gpu_free(dg), free(g);
  }
  expect_dev("adamw, 3 steps (the master weights when 16-bit)", GPU_F32, master ? (void *)master : dp, p, n);
  float *rounded = copy(p, n);
  round_all(rounded, n, dt);
  expect_dev("adamw, the parameter", dt, dp, rounded, n);
  expect_dev("adamw, exp_avg_sq", GPU_F32, state + n, v, n);
  /* SGD with momentum and weight decay, the gradients scaled (clipping) */
  gpu_optim so = {0.05, 0, 0, 0, 0.1, 0.9};
  float *buf = calloc((size_t)n, 4), half = 0.375f;
  float *dhalf = up(&half, 1, GPU_F32);
  gpu_zero(state, (size_t)n * 4, S);
  for (int step = 1; step <= 3; step++) {
    float *g = randn(n, 1);
    round_all(g, n, dt);
    void *dg = up(g, n, dt);
    for (int64_t i = 0; i < n; i++) g[i] *= half;
    k_sgd(p, buf, g, n, so.lr, so.momentum, so.weight_decay);
    gpu_sgd(S, dp, dt, master, state, dg, dt, dhalf, n, &so);
    gpu_free(dg), free(g);
  }
  expect_dev("sgd with momentum, 3 steps, gradients scaled", GPU_F32, master ? (void *)master : dp, p, n);
  /* the sum of squares of a gradient, every element or those of a mask */
  float *g = randn(n, 1);
  round_all(g, n, dt);
  uint8_t *mask = malloc((size_t)n);
  double all = 0, some = 0;
  for (int64_t i = 0; i < n; i++) {
    mask[i] = i % 3 != 0;
    all += (double)g[i] * g[i];
    if (mask[i]) some += (double)g[i] * g[i];
  }
  void *dg = up(g, n, dt);
  uint8_t *dmask = gpu_alloc((size_t)n, e, sizeof e);
  double *acc = gpu_alloc(16, e, sizeof e);
  void *sws = gpu_alloc(gpu_sumsq_ws(), e, sizeof e);
  if (!dmask || !acc || !sws || !gpu_upload(dmask, mask, (size_t)n, S, e, sizeof e)) die("sumsq", e);
  gpu_zero(acc, 16, S);
  gpu_sumsq(S, dt, acc, dg, NULL, n, sws);
  gpu_sumsq(S, dt, acc + 1, dg, dmask, n, sws);
  gpu_sumsq(S, dt, acc + 1, dg, dmask, n, sws);
  double got[2];
  if (!gpu_download(got, acc, 16, S, e, sizeof e)) die("sumsq", e);
  float fg[2] = {(float)got[0], (float)(got[1] / 2)}, fw[2] = {(float)all, (float)some};
  expect("gradient norm: sums of squares, whole and masked", GPU_F32, copy(fg, 2), fw, 2);
  gpu_free(dg), gpu_free(dmask), gpu_free(acc), gpu_free(sws), gpu_free(dhalf);
  free(g), free(mask);
  gpu_free(dp), gpu_free(state), gpu_free(master);
  free(p), free(m), free(v), free(rounded), free(buf);
}

/* Device buffers a and b hold the same bytes. */
static void expect_same(const char *what, int dt, const void *a, const void *b, size_t bytes) {
  char e[400];
  char *ha = malloc(bytes + 1), *hb = malloc(bytes + 1);
  if (!gpu_download(ha, a, bytes, S, e, sizeof e) || !gpu_download(hb, b, bytes, S, e, sizeof e)) die(what, e);
  size_t at = 0;
  while (at < bytes && ha[at] == hb[at]) at++;
  checks++;
  if (at < bytes) failures++;
  if (at < bytes)
    printf("kernel %-44s %-4s FAIL: byte %zu of %zu differs\n", what, dt_name(dt), at, bytes);
  else
    printf("kernel %-44s %-4s the same bits (%zu bytes) ok\n", what, dt_name(dt), bytes);
  free(ha), free(hb);
}

/* Several tensors' steps and sums of squares in one launch (gpu_msteps)
 * against one launch per tensor (gpu_adamw, gpu_sgd, gpu_sumsq), bit for
 * bit over 3 steps: tensors of sizes around the blocks' strides, in an
 * order the layout changes, with and without masters, gradients f32 (the
 * accumulated ones of a 16-bit model) or dt, masks, entries with a step
 * only and with a sum only; SGD's with momentum and a clipping factor. In
 * f32 the steps also give the CPU's k_adamw bits (the same operations,
 * each rounded). */
static void check_msteps(int dt) {
  enum { NT = 6 };
  static const int64_t sizes[NT] = {1000, 300007, 5000, 70001, 1, 37};
  static const int what[NT] = {GPU_MS_STEP | GPU_MS_SQ, GPU_MS_STEP | GPU_MS_SQ, GPU_MS_STEP, GPU_MS_SQ,
                               GPU_MS_STEP | GPU_MS_SQ, GPU_MS_SQ};
  static const bool f32grad[NT] = {false, true, false, true, true, false}, masked[NT] = {true, false, false, true, false, false};
  char e[400], name[96];
  for (int opt = 0; opt < 2; opt++) {
    bool adamw = opt == 0;
    gpu_optim o = adamw ? (gpu_optim){1e-2, 0.9, 0.999, 1e-8, 0.01, 0.0} : (gpu_optim){0.05, 0, 0, 0, 0.1, 0.9};
    int copies = adamw ? 2 : 1;
    gpu_mstep tab[NT];
    void *param[2][NT], *grad[NT];
    float *master[2][NT], *state[2][NT], *cpu_p[NT], *cpu_m[NT], *cpu_v[NT];
    uint8_t *mask[NT];
    for (int t = 0; t < NT; t++) {
      int64_t n = sizes[t];
      int gdt = f32grad[t] ? GPU_F32 : dt;
      float *p = randn(n, 1);
      round_all(p, n, dt);
      cpu_p[t] = copy(p, n), cpu_m[t] = calloc((size_t)n, 4), cpu_v[t] = calloc((size_t)n, 4);
      for (int k = 0; k < 2; k++) {
        param[k][t] = up(p, n, dt);
        master[k][t] = dt == GPU_F32 ? NULL : up(p, n, GPU_F32);
        state[k][t] = gpu_alloc((size_t)(copies * n) * 4, e, sizeof e);
        if (!state[k][t]) die("msteps", e);
        gpu_zero(state[k][t], (size_t)(copies * n) * 4, S);
      }
      grad[t] = gpu_alloc((size_t)n * 4, e, sizeof e);
      mask[t] = NULL;
      if (masked[t]) {
        uint8_t *mb = malloc((size_t)n);
        for (int64_t i = 0; i < n; i++) mb[i] = (i * 7 + t) % 5 != 0;
        mask[t] = gpu_alloc((size_t)n, e, sizeof e);
        if (!mask[t] || !gpu_upload(mask[t], mb, (size_t)n, S, e, sizeof e)) die("msteps", e);
        free(mb);
      }
      if (!grad[t]) die("msteps", e);
      memset(&tab[t], 0, sizeof tab[t]);
      tab[t].param = param[1][t], tab[t].master = master[1][t], tab[t].state = state[1][t];
      tab[t].grad = grad[t], tab[t].mask = mask[t], tab[t].n = n;
      tab[t].pdt = dt, tab[t].gdt = gdt, tab[t].what = what[t], tab[t].tag = t;
      free(p);
    }
    gpu_mslayout l = gpu_msteps_layout(tab, NT);
    gpu_mstep *dtab = gpu_alloc(sizeof tab, e, sizeof e);
    double *parts = gpu_alloc((size_t)l.parts * 8, e, sizeof e), *acc = gpu_alloc(16, e, sizeof e);
    void *sws = gpu_alloc(gpu_sumsq_ws(), e, sizeof e);
    float *dscale = NULL, scale = 0.625f;
    if (!adamw) dscale = up(&scale, 1, GPU_F32);
    if (!dtab || !parts || !acc || !sws || !gpu_upload(dtab, tab, sizeof tab, S, e, sizeof e)) die("msteps", e);
    gpu_zero(acc, 16, S);
    for (int step = 1; step <= 3; step++) {
      for (int t = 0; t < NT; t++) {
        int64_t n = sizes[t];
        float *g = randn(n, 1);
        int gdt = f32grad[t] ? GPU_F32 : dt;
        round_all(g, n, gdt);
        void *dg = up(g, n, gdt);
        gpu_convert(S, grad[t], gdt, dg, gdt, n, false);
        gpu_free(dg);
        if (adamw && (what[t] & GPU_MS_STEP))
          k_adamw(cpu_p[t], cpu_m[t], cpu_v[t], g, n, step, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay);
        free(g);
      }
      /* one launch per tensor, in the table's first order */
      for (int t = 0; t < NT; t++) {
        int gdt = f32grad[t] ? GPU_F32 : dt;
        if (what[t] & GPU_MS_SQ) gpu_sumsq(S, gdt, acc, grad[t], mask[t], sizes[t], sws);
        if (!(what[t] & GPU_MS_STEP)) continue;
        if (adamw)
          gpu_adamw(S, param[0][t], dt, master[0][t], state[0][t], state[0][t] + sizes[t], grad[t], gdt, NULL,
                    sizes[t], step, &o);
        else
          gpu_sgd(S, param[0][t], dt, master[0][t], state[0][t], grad[t], gdt, dscale, sizes[t], &o);
      }
      gpu_msteps(S, adamw, dtab, NT, &l, step, &o, dscale, parts, acc + 1);
    }
    for (int t = 0; t < NT; t++) {
      if (!(what[t] & GPU_MS_STEP)) continue;
      int64_t n = sizes[t];
      snprintf(name, sizeof name, "%s in one launch: tensor of %lld, parameter", adamw ? "adamw" : "sgd", (long long)n);
      expect_same(name, dt, param[0][t], param[1][t], (size_t)n * (size_t)gpu_dtype_size(dt));
      if (master[0][t]) {
        snprintf(name, sizeof name, "%s in one launch: tensor of %lld, master", adamw ? "adamw" : "sgd", (long long)n);
        expect_same(name, dt, master[0][t], master[1][t], (size_t)n * 4);
      }
      snprintf(name, sizeof name, "%s in one launch: tensor of %lld, state", adamw ? "adamw" : "sgd", (long long)n);
      expect_same(name, dt, state[0][t], state[1][t], (size_t)(copies * n) * 4);
      if (adamw && dt == GPU_F32) {
        snprintf(name, sizeof name, "adamw in one launch: tensor of %lld, the CPU's", (long long)n);
        float *got = malloc(sizeof(float) * (size_t)(n + 1));
        if (!gpu_download(got, param[1][t], (size_t)n * 4, S, e, sizeof e)) die("msteps", e);
        checks++;
        int64_t bad = -1;
        for (int64_t i = 0; i < n && bad < 0; i++)
          if (memcmp(&got[i], &cpu_p[t][i], 4) != 0) bad = i;
        if (bad >= 0) failures++;
        if (bad >= 0)
          printf("kernel %-44s %-4s FAIL: element %lld is %.9g, the CPU's %.9g\n", name, dt_name(dt), (long long)bad,
                 (double)got[bad], (double)cpu_p[t][bad]);
        else
          printf("kernel %-44s %-4s the same bits ok\n", name, dt_name(dt));
        free(got);
      }
    }
    snprintf(name, sizeof name, "%s in one launch: the sums of squares", adamw ? "adamw" : "sgd");
    expect_same(name, dt, acc, acc + 1, 8);
    for (int t = 0; t < NT; t++) {
      for (int k = 0; k < 2; k++) gpu_free(param[k][t]), gpu_free(master[k][t]), gpu_free(state[k][t]);
      gpu_free(grad[t]), gpu_free(mask[t]);
      free(cpu_p[t]), free(cpu_m[t]), free(cpu_v[t]);
    }
    gpu_free(dtab), gpu_free(parts), gpu_free(acc), gpu_free(sws), gpu_free(dscale);
  }
}

/* A strided part of a 3-d tensor moved between holders, and a rank-ordered
 * sum of three members' copies. */
static void check_regions(int dt) {
  char e[400];
  irange hiv[3][3] = {{{0, 6}}, {{2, 9}}, {{0, 4}, {8, 12}, {16, 20}}};
  irange riv[3][2] = {{{1, 5}}, {{3, 7}}, {{8, 12}, {17, 19}}};
  dregion hd[3] = {{1, hiv[0]}, {1, hiv[1]}, {3, hiv[2]}};
  dregion rd[3] = {{1, riv[0]}, {1, riv[1]}, {2, riv[2]}};
  tregion holder = {3, hd}, r = {3, rd};
  int64_t hn = cx_numel(&holder), rn = cx_numel(&r);
  cx_tables tab = {0};
  cx_move in, out;
  if (!cx_move_build(&in, &tab, &r, &holder, &r, e, sizeof e) || !cx_move_build(&out, &tab, &r, &r, &holder, e, sizeof e))
    die("cx_move_build", e);
  int32_t *dtab = up_ids(tab.v, tab.n ? tab.n : 1);
  float *h = randn(hn, 1), *packed = calloc((size_t)rn, 4);
  round_all(h, hn, dt);
  cx_move_host(packed, h, &in, &tab, false);
  void *dh = up(h, hn, dt), *dp = poisoned(rn, dt);
  gpu_rmove m = cx_move_at(&in, dtab);
  gpu_move(S, dp, dt, dh, dt, &m, false);
  expect_dev("regions: a strided part packed", dt, dp, packed, rn);
  float *back = copy(h, hn);
  cx_move_host(back, packed, &out, &tab, true);
  m = cx_move_at(&out, dtab);
  gpu_move(S, dh, dt, dp, dt, &m, true);
  expect_dev("regions: added back into its holder", dt, dh, back, hn);
  gpu_srcs srcs = {3, {0}};
  float *x[3], *sum = calloc((size_t)rn, 4);
  for (int i = 0; i < 3; i++) {
    x[i] = randn(rn, 1);
    round_all(x[i], rn, dt);
    srcs.p[i] = up(x[i], rn, dt);
    for (int64_t j = 0; j < rn; j++) sum[j] = i ? sum[j] + x[i][j] : x[i][j];
  }
  float *want = copy(h, hn);
  cx_move_host(want, sum, &out, &tab, false);
  gpu_free(dh);
  dh = up(h, hn, dt);
  gpu_sum(S, dh, dt, &srcs, dt, &m, false);
  expect_dev("regions: the members' sum, in rank order", dt, dh, want, hn);
  for (int i = 0; i < 3; i++) gpu_free((void *)srcs.p[i]), free(x[i]);
  gpu_free(dtab), gpu_free(dh), gpu_free(dp);
  free(tab.v), free(h), free(packed), free(back), free(sum), free(want);
}

/* x after one element of padding, in type dt: a device pointer 2 or 4
 * bytes past a 16-byte boundary (*base is the allocation). */
static void *up_off(const float *x, int64_t n, int dt, void **base) {
  float *y = malloc(sizeof(float) * (size_t)(n + 1));
  y[0] = 0;
  memcpy(y + 1, x, sizeof(float) * (size_t)n);
  *base = up(y, n + 1, dt);
  free(y);
  return (char *)*base + (dt == GPU_F32 ? 4 : 2);
}

/* The staging copies (rows of 2-byte units cut at dst's 16-byte
 * boundaries, src read in aligned chunks and shifted): products whose
 * operands and results have rows of 1 to 9 elements (at most a head and a
 * tail), and of 2100 (several segments of a row), every row at another
 * offset, each operand at a 16-byte boundary or one element after it;
 * c += a b, so that c is copied into the staging area and back. */
static void check_staging_copies(int dt) {
  char e[400];
  const int64_t shapes[][3] = {{13, 1, 3}, {13, 3, 5}, {21, 7, 9}, {9, 9, 1}, {11, 5, 2100}, {6, 2100, 3}};
  size_t wsb = gpu_gemm_ws();
  void *ws = gpu_alloc(wsb, e, sizeof e);
  if (!ws) die("gpu_alloc", e);
  setenv("WEFT_GEMM_STAGE_BYTES", "1048576", 1);
  int64_t calls = 0, before = gpu_gemm_staged();
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
    for (int offs = 0; offs < 8; offs++) {
      int64_t m = shapes[si][0], k = shapes[si][1], n = shapes[si][2];
      float *a = randn(m * k, 1), *b = randn(k * n, 1), *c = randn(m * n, 1), *want = malloc(sizeof(float) * (size_t)(m * n));
      round_all(a, m * k, dt), round_all(b, k * n, dt), round_all(c, m * n, dt);
      void *ba = NULL, *bb = NULL, *bc = NULL;
      void *da = offs & 1 ? up_off(a, m * k, dt, &ba) : (ba = up(a, m * k, dt));
      void *db = offs & 2 ? up_off(b, k * n, dt, &bb) : (bb = up(b, k * n, dt));
      void *dc = offs & 4 ? up_off(c, m * n, dt, &bc) : (bc = up(c, m * n, dt));
      memcpy(want, c, sizeof(float) * (size_t)(m * n));
      k_matmul(want, a, b, m, k, n, true);
      if (!gpu_gemm(S, false, false, m, n, k, da, k, dt, db, n, dt, dc, n, dt, NULL, true, ws, wsb, false, e, sizeof e))
        die("gemm", e);
      calls++;
      char what[96];
      snprintf(what, sizeof what, "staged c += a b, %lldx%lldx%lld, offsets %d%d%d", (long long)m, (long long)k,
               (long long)n, offs & 1, (offs >> 1) & 1, (offs >> 2) & 1);
      expect_dev(what, dt, dc, want, m * n);
      gpu_free(ba), gpu_free(bb), gpu_free(bc);
      free(a), free(b), free(c), free(want);
    }
  /* every product but those with all three aligned (k, n multiples of 8) */
  int64_t staged = gpu_gemm_staged() - before;
  checks++;
  if (staged != calls) failures++;
  printf("kernel %-44s %-4s %lld of %lld products staged %s\n", "staging copies", dt_name(dt), (long long)staged,
         (long long)calls, staged == calls ? "ok" : "FAIL");
  setenv("WEFT_GEMM_STAGE_BYTES", "65536", 1);
  gpu_free(ws);
}

/* Products with rows or pointers off 16 bytes, staged in chunks: the size
 * from which products are staged lowered to 0 and the room to 64 KiB, so
 * that a 300 x 40 x 257 product takes many chunks. */
/* The LM head's products over logits in rows padded to 16 bytes (pad_rows
 * in exec.c): 257 columns in rows of 264, aligned, which a product of
 * 2^30 flops and more (here every one: WEFT_GEMM_STAGE_FLOPS=0) splits
 * into 256 and 1 without staging: logits = x W^T (n 257), dx = dlogits W
 * (k 257), dW = dlogits^T x (m 257); the padding left as it was. */
static void check_gemm_pitched(int dt) {
  char e[400], what[96];
  const int64_t t = 70, hd = 40, v = 257, ld = 264;
  setenv("WEFT_GEMM_STAGE_FLOPS", "0", 1);
  size_t wsb = gpu_gemm_ws();
  void *ws = gpu_alloc(wsb, e, sizeof e);
  float *x = randn(t * hd, 1), *w = randn(v * hd, 1), *g = randn(t * ld, 1);
  round_all(x, t * hd, dt), round_all(w, v * hd, dt), round_all(g, t * ld, dt);
  void *dx_in = up(x, t * hd, dt), *dw_in = up(w, v * hd, dt), *dg = up(g, t * ld, dt);
  /* the reference's dlogits: the first v of each row of g */
  float *gp = malloc(sizeof(float) * (size_t)(t * v));
  for (int64_t i = 0; i < t; i++) memcpy(gp + i * v, g + i * ld, sizeof(float) * (size_t)v);
  int64_t before = gpu_gemm_staged();
  /* logits = x W^T into rows of ld, poisoned */
  float *want = malloc(sizeof(float) * (size_t)(t * v));
  k_matmul_t(want, x, w, t, hd, v, false);
  void *lg = poisoned(t * ld, dt);
  if (!gpu_gemm(S, false, true, t, v, hd, dx_in, hd, dt, dw_in, hd, dt, lg, ld, dt, NULL, false, ws, wsb, false, e,
                sizeof e))
    die("gemm", e);
  float *got = down(lg, t * ld, dt), *packed = malloc(sizeof(float) * (size_t)(t * v));
  bool pad_kept = true;
  for (int64_t i = 0; i < t; i++) {
    memcpy(packed + i * v, got + i * ld, sizeof(float) * (size_t)v);
    for (int64_t j = v; j < ld; j++) pad_kept = pad_kept && isnan(got[i * ld + j]);
  }
  void *pk = up(packed, t * v, dt);
  snprintf(what, sizeof what, "gemm into rows of %lld of %lld: logits", (long long)v, (long long)ld);
  expect_dev(what, dt, pk, want, t * v);
  checks++;
  if (!pad_kept) failures++;
  printf("kernel %-44s %-4s %s\n", "  the padding left as it was", dt_name(dt), pad_kept ? "ok" : "FAIL");
  /* dx = dlogits W, dW = dlogits^T x */
  float *wdx = malloc(sizeof(float) * (size_t)(t * hd)), *wdw = malloc(sizeof(float) * (size_t)(v * hd));
  k_matmul_t_backward(wdx, wdw, gp, x, w, t, hd, v, false);
  void *gx = poisoned(t * hd, dt), *gw = poisoned(v * hd, dt);
  if (!gpu_gemm(S, false, false, t, hd, v, dg, ld, dt, dw_in, hd, dt, gx, hd, dt, NULL, false, ws, wsb, false, e,
                sizeof e) ||
      !gpu_gemm(S, true, false, v, hd, t, dg, ld, dt, dx_in, hd, dt, gw, hd, dt, NULL, false, ws, wsb, false, e,
                sizeof e))
    die("gemm", e);
  snprintf(what, sizeof what, "gemm from rows of %lld of %lld: dx", (long long)v, (long long)ld);
  expect_dev(what, dt, gx, wdx, t * hd);
  snprintf(what, sizeof what, "gemm from rows of %lld of %lld: dW", (long long)v, (long long)ld);
  expect_dev(what, dt, gw, wdw, v * hd);
  int64_t staged = gpu_gemm_staged() - before;
  checks++;
  if (staged != 0) failures++;
  printf("kernel %-44s %-4s %lld staged %s\n", "  none of the three staged", dt_name(dt), (long long)staged,
         staged == 0 ? "ok" : "FAIL");
  unsetenv("WEFT_GEMM_STAGE_FLOPS");
  gpu_free(ws), gpu_free(dx_in), gpu_free(dw_in), gpu_free(dg), gpu_free(lg), gpu_free(pk), gpu_free(gx), gpu_free(gw);
  free(x), free(w), free(g), free(gp), free(want), free(got), free(packed), free(wdx), free(wdw);
}

/* Column sums (the bias gradient) of m rows of n: n a multiple of 16
 * bytes takes the kernel of 16-byte loads, then one element off 16 bytes
 * the first kernel; written, then added, into dt and into f32. */
static void check_colsum(int dt, int64_t m, int64_t n) {
  char e[400], what[96];
  float *g = randn((m + 1) * n, 1), *b0 = randn(n, 1);
  round_all(g, (m + 1) * n, dt), round_all(b0, n, dt);
  void *dg = up(g, (m + 1) * n, dt);
  void *cs = gpu_alloc(gpu_colsum_ws(m, n) + 4, e, sizeof e);
  for (int off = 0; off < 2; off++) {
    const void *rows = (const char *)dg + (size_t)off * gpu_dtype_size(dt);
    float *want = copy(b0, n);
    k_linear_backward(NULL, NULL, want, g + off, NULL, NULL, m, 0, n, true);
    void *db = up(b0, n, dt);
    gpu_colsum(S, dt, db, dt, rows, m, n, true, cs);
    snprintf(what, sizeof what, "column sums %lldx%lld%s, acc", (long long)m, (long long)n, off ? ", off 16 bytes" : "");
    expect_dev(what, dt, db, want, n);
    float *w32 = calloc((size_t)n, sizeof(float));
    k_linear_backward(NULL, NULL, w32, g + off, NULL, NULL, m, 0, n, false);
    void *p32 = poisoned(n, GPU_F32);
    gpu_colsum(S, dt, p32, GPU_F32, rows, m, n, false, cs);
    snprintf(what, sizeof what, "column sums %lldx%lld%s into f32", (long long)m, (long long)n, off ? ", off 16 bytes" : "");
    expect_dev(what, GPU_F32, p32, w32, n);
    gpu_free(db), gpu_free(p32), free(want), free(w32);
  }
  gpu_free(dg), gpu_free(cs), free(g), free(b0);
}

static void check_gemm_staged(int dt) {
  char e[400];
  setenv("WEFT_GEMM_STAGE_FLOPS", "0", 1);
  setenv("WEFT_GEMM_STAGE_BYTES", "65536", 1);
  int64_t before = gpu_gemm_staged();
  check_gemm(dt, 300, 40, 257);  /* rows of 257: the products of check_gemm (six, and two into f32) */
  checks++;
  int64_t staged = gpu_gemm_staged() - before, all = dt == GPU_F32 ? 6 : 8;
  if (staged != all) failures++;
  printf("kernel %-44s %-4s %lld of %lld products staged %s\n", "gemm, rows of 257 elements", dt_name(dt),
         (long long)staged, (long long)all, staged == all ? "ok" : "FAIL");
  /* aligned rows (264), pointers one element off: c = a b + bias, then
   * c += a b; db = a^T g with g off */
  int64_t m = 300, k = 40, n = 264;
  size_t wsb = gpu_gemm_ws();
  void *ws = gpu_alloc(wsb, e, sizeof e);
  float *a = randn(m * k, 1), *b = randn(k * n, 1), *bias = randn(n, 1), *g = randn(m * n, 1);
  round_all(a, m * k, dt), round_all(b, k * n, dt), round_all(bias, n, dt), round_all(g, m * n, dt);
  void *ba, *bb, *bg, *bc, *bc2;
  void *da = up_off(a, m * k, dt, &ba), *db = up_off(b, k * n, dt, &bb), *dg = up_off(g, m * n, dt, &bg);
  void *dbias = up(bias, n, dt);
  float *want = malloc(sizeof(float) * (size_t)(m * n)), *zero = calloc((size_t)(m * n), sizeof(float));
  void *dc = up_off(zero, m * n, dt, &bc), *dc2 = up_off(zero, m * n, dt, &bc2);
  k_linear(want, a, b, bias, m, k, n, false);
  before = gpu_gemm_staged();
  if (!gpu_gemm(S, false, false, m, n, k, da, k, dt, db, n, dt, dc, n, dt, dbias, false, ws, wsb, false, e, sizeof e))
    die("gemm", e);
  expect_dev("linear, pointers off 16 bytes, bias", dt, dc, want, m * n);
  /* the same again: the same bytes */
  if (!gpu_gemm(S, false, false, m, n, k, da, k, dt, db, n, dt, dc2, n, dt, dbias, false, ws, wsb, true, e, sizeof e))
    die("gemm", e);
  size_t bytes = (size_t)(m * n) * (dt == GPU_F32 ? 4 : 2);
  char *h1 = malloc(bytes), *h2 = malloc(bytes);
  if (!gpu_download(h1, dc, bytes, S, e, sizeof e) || !gpu_download(h2, dc2, bytes, S, e, sizeof e)) die("download", e);
  checks++;
  bool same = memcmp(h1, h2, bytes) == 0;
  if (!same) failures++;
  printf("kernel %-44s %-4s %s\n", "linear staged twice: the same bytes", dt_name(dt), same ? "ok" : "FAIL");
  k_matmul(want, a, b, m, k, n, true);
  if (!gpu_gemm(S, false, false, m, n, k, da, k, dt, db, n, dt, dc, n, dt, NULL, true, ws, wsb, false, e, sizeof e))
    die("gemm", e);
  expect_dev("linear, pointers off 16 bytes, acc", dt, dc, want, m * n);
  float *wa = malloc(sizeof(float) * (size_t)(m * k)), *wb = malloc(sizeof(float) * (size_t)(k * n));
  k_matmul_backward(wa, wb, g, a, b, m, k, n, false);
  void *gb = poisoned(k * n, dt);
  if (!gpu_gemm(S, true, false, k, n, m, da, k, dt, dg, n, dt, gb, n, dt, NULL, false, ws, wsb, false, e, sizeof e))
    die("gemm", e);
  expect_dev("matmul backward db, pointers off 16 bytes", dt, gb, wb, k * n);
  checks++;
  staged = gpu_gemm_staged() - before;
  if (staged != 4) failures++;
  printf("kernel %-44s %-4s %lld of 4 products staged %s\n", "gemm, pointers off 16 bytes", dt_name(dt),
         (long long)staged, staged == 4 ? "ok" : "FAIL");
  free(h1), free(h2), free(a), free(b), free(bias), free(g), free(want), free(zero), free(wa), free(wb);
  gpu_free(ba), gpu_free(bb), gpu_free(bg), gpu_free(bc), gpu_free(bc2), gpu_free(dbias), gpu_free(gb), gpu_free(ws);
  check_staging_copies(dt);
  unsetenv("WEFT_GEMM_STAGE_FLOPS");
  unsetenv("WEFT_GEMM_STAGE_BYTES");
}

/* The warp product of mma.cuh: its fragment layouts on this device (a
 * wrong layout puts the sums in the wrong places: far off, not just
 * rounded). B[k][n] = b_kn[k * 16 + n] = b_nk[n * 16 + k]. */
static void check_mma(int dt) {
  char e[400];
  float *a = randn(256, 1), *bkn = randn(256, 1), bnk[256], want[1280], ab[256];
  round_all(a, 256, dt), round_all(bkn, 256, dt);
  for (int k = 0; k < 16; k++)
    for (int n = 0; n < 16; n++) bnk[n * 16 + k] = bkn[k * 16 + n];
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      double sum = 0;
      for (int k = 0; k < 16; k++) sum += (double)a[i * 16 + k] * bkn[k * 16 + j];
      want[i * 16 + j] = want[256 + i * 16 + j] = want[768 + i * 16 + j] = want[1024 + i * 16 + j] = (float)sum;
      ab[i * 16 + j] = (float)sum;
    }
  round_all(ab, 256, dt);
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      double sum = 0;
      for (int k = 0; k < 16; k++) sum += (double)ab[i * 16 + k] * bkn[k * 16 + j];
      want[512 + i * 16 + j] = (float)sum;
    }
  void *da = up(a, 256, dt), *dnk = up(bnk, 256, dt), *dkn = up(bkn, 256, dt);
  float *d = gpu_alloc(1280 * 4, e, sizeof e), *got = malloc(1280 * 4), *part = malloc(256 * 4);
  if (!d) die("gpu_alloc", e);
  gpu_mma_check(S, dt, d, da, dnk, dkn);
  if (!gpu_check("mma", e, sizeof e) || !gpu_download(got, d, 1280 * 4, S, e, sizeof e)) die("mma", e);
  const char *what[5] = {"mma m16n8k16: A B, B stored [n][k]", "mma m16n8k16: A B, B stored [k][n]",
                         "mma m16n8k16: (A B) B, a result as operand", "mma m16n8k16: ldmatrix, B [k][n] .trans",
                         "mma m16n8k16: ldmatrix, B [n][k]"};
  for (int c = 0; c < 5; c++) {
    float *g = malloc(256 * 4);
    memcpy(g, got + 256 * c, 256 * 4);
    expect(what[c], dt, g, want + 256 * c, 256);
  }
  free(got), free(part), free(a), free(bkn);
  gpu_free(d), gpu_free(da), gpu_free(dnk), gpu_free(dkn);
}

/* The causal attention checks alone (test_kernels --attention: these,
 * one head of f16 and check_attention_tc's): the backward's ways that
 * WEFT_ATTN forces (fa-atomic) against the CPU's, without the rest. */
static void check_attention_all(int dt) {
  check_attention(dt, 2, 37, 3, 24);
  check_attention(dt, 1, 70, 2, 64);
  check_gqa(dt, 40, 40, 0, 32);
  check_gqa(dt, 24, 100, 70, 32); /* the last part of a sequence, across two tiles */
  check_gqa(dt, 30, 100, 8, 64);  /* a middle part: the keys after it get no gradient */
}

/* The clock of the plugin's one-time choices (choice.h): a bracket inside
 * another counts once, in the outer one's kind; a take gives what was
 * counted and starts again from 0; the work of an idle stream is done. */
static void check_choices(void) {
  const struct timespec nap = {0, 20000000}; /* 20 ms, at least */
  choice_take(NULL);
  choice_mark outer = choice_begin(CHOICE_ATTENTION, "timing attention's ways (a test)");
  nanosleep(&nap, NULL);
  choice_mark inner = choice_begin(CHOICE_CUDNN, "cuDNN's plan (a test)");
  nanosleep(&nap, NULL);
  choice_end(inner);
  choice_end(outer);
  choice_mark alone = choice_begin(CHOICE_GEMM, "cuBLASLt's algorithms (a test)");
  nanosleep(&nap, NULL);
  choice_end(alone);
  double by[CHOICE_KINDS];
  const double all = choice_take(by), again = choice_take(NULL);
  char e[256];
  const bool idle = gpu_stream_sync(S, e, sizeof e) && choice_settled(S);
  const bool ok = by[CHOICE_ATTENTION] >= 0.04 && by[CHOICE_CUDNN] == 0 && by[CHOICE_GEMM] >= 0.02 &&
                  all == by[CHOICE_ATTENTION] + by[CHOICE_GEMM] && again == 0 && idle && choice_waits();
  checks++;
  if (!ok) failures++;
  printf("choices of kernels: attention %.3f s (cuDNN's inside it %.3f s), cuBLASLt %.3f s, in all %.3f s, then %g; "
         "an idle stream settled: %s %s\n", by[CHOICE_ATTENTION], by[CHOICE_CUDNN], by[CHOICE_GEMM], all, again,
         idle ? "yes" : "no", ok ? "ok" : "FAIL");
}

/* The agreement of choices between processes (choice.h), as process 1 of
 * 3 sees it: its proposals wait (the reference runs meanwhile) and are
 * settled by every process's records: the lowest proposer's fastest
 * where every proposer passed it, else the reference; its own where no
 * other process proposed for the key. Without agreement (one process,
 * WEFT_CUDA_AGREE=0) a proposal is taken at once. */
static void take_int(void *ctx, int v) { *(int *)ctx = v; }

static void check_agreement(void) {
  enum { PER = 3 };
  int got[4] = {-1, -1, -1, -1}, now[4];
  const unsigned long long k[4] = {choice_hash(CHOICE_HASH0, "a", 1), choice_hash(CHOICE_HASH0, "b", 1),
                                   choice_hash(CHOICE_HASH0, "c", 1), choice_hash(CHOICE_HASH0, "d", 1)};
  unsetenv("WEFT_CUDA_AGREE");
  choice_among(1, 3);
  /* key a: fastest 2 of {0, 2}; b: 1 of {0, 1, 3}; c: 3 of {0, 3}; d: 1 */
  now[0] = choice_propose(CHOICE_ATTENTION, k[0], 0x5, 2, 0, take_int, &got[0]);
  now[1] = choice_propose(CHOICE_GEMM, k[1], 0xb, 1, 0, take_int, &got[1]);
  now[2] = choice_propose(CHOICE_GEMM, k[2], 0x9, 3, 0, take_int, &got[2]);
  now[3] = choice_propose(CHOICE_GEMM, k[3], 0x3, 1, 0, take_int, &got[3]);
  const int waiting = choice_pending();
  int all[3 * PER * CHOICE_INTS];
  memset(all, 0, sizeof all);
  choice_proposals(all + PER * CHOICE_INTS, PER); /* the first PER of this process's four */
  /* the records: process 0 proposed 3 for key b (which this process
   * passed) and 2 for key c (which it did not); process 2 proposed 2 for
   * key a, passing 2 alone; nobody else proposed for key d */
  int *p0 = all, *p2 = all + 2 * PER * CHOICE_INTS;
  const int r0[2][CHOICE_INTS] = {{CHOICE_GEMM + 1, (int)(unsigned)k[1], (int)(unsigned)(k[1] >> 32), 0xf, 3},
                                  {CHOICE_GEMM + 1, (int)(unsigned)k[2], (int)(unsigned)(k[2] >> 32), 0x5, 2}};
  const int r2[CHOICE_INTS] = {CHOICE_ATTENTION + 1, (int)(unsigned)k[0], (int)(unsigned)(k[0] >> 32), 0x4, 2};
  memcpy(p0, r0, sizeof r0), memcpy(p2, r2, sizeof r2);
  /* key d's record is past PER: settled by this process's own alone */
  const int other = choice_settle(all, 3, PER);
  int single = -1;
  choice_among(-1, 0);
  const int at_once = choice_propose(CHOICE_GEMM, k[0], 0x3, 1, 0, take_int, &single);
  const bool ok = now[0] == 0 && now[1] == 0 && now[2] == 0 && now[3] == 0 && waiting == 4 && got[0] == 2 &&
                  got[1] == 3 && got[2] == 0 && got[3] == 1 && other == 2 && choice_pending() == 0 && at_once == 1 &&
                  single == 1;
  checks++;
  if (!ok) failures++;
  printf("choices agreed between processes: %d waiting, then a %d, b %d, c %d, d %d (2 others' taken: %d); one "
         "process: taken at once %d %s\n",
         waiting, got[0], got[1], got[2], got[3], other, single, ok ? "ok" : "FAIL");
}

/* The measure attention's choice compares ways by (gpu_attention_compare)
 * against a plain loop here, at 6.3 million elements (its threads), on
 * one thread and on eight: the same bits both ways (16 parts added in
 * order), the loop's worst element and L2 error within rounding; a got not finite where want is gives INFINITY, also in the
 * last part alone; f32 and bf16 rows strided as a fused q|k|v's. */
static void check_compare(void) {
  const int64_t b = 3, s = 700, width = 3000, row = 3 * width + 8, batch = s * row + 16;
  const int64_t n = (b - 1) * batch + (s - 1) * row + width;
  float *w = malloc(sizeof(float) * (size_t)n), *g = malloc(sizeof(float) * (size_t)n);
  uint16_t *wb = malloc(2 * (size_t)n), *gb = malloc(2 * (size_t)n);
  if (!w || !g || !wb || !gb) die("check_compare", "out of memory");
  uint64_t x = 88172645463325252ull;
  for (int64_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    w[i] = (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    g[i] = w[i] * (1.0f + 1e-3f * (float)(int)((x >> 3) % 7 - 3));
  }
  g[batch + 350 * row + 1500] += 0.3f; /* one element past its bound */
  for (int64_t i = 0; i < n; i++) {
    uint32_t u, v;
    memcpy(&u, &w[i], 4), memcpy(&v, &g[i], 4);
    wb[i] = (uint16_t)(u >> 16), gb[i] = (uint16_t)(v >> 16);
  }
  for (int t = 0; t < 2; t++) {
    const int dt = t ? GPU_BF16 : GPU_F32;
    const void *pw = t ? (const void *)wb : w, *pg = t ? (const void *)gb : g;
    /* the plain loop */
    double num = 0, den = 0, worst = 0;
    int64_t count = 0;
    for (int pass = 0; pass < 2; pass++) {
      const double rms = count ? sqrt(den / (double)count) : 0;
      for (int64_t bi = 0; bi < b; bi++)
        for (int64_t i = 0; i < s; i++)
          for (int64_t c = 0; c < width; c++) {
            const int64_t at = bi * batch + i * row + c;
            double xv, yv;
            if (t) {
              uint32_t u = (uint32_t)wb[at] << 16, v = (uint32_t)gb[at] << 16;
              float fx, fy;
              memcpy(&fx, &u, 4), memcpy(&fy, &v, 4);
              xv = fx, yv = fy;
            } else {
              xv = w[at], yv = g[at];
            }
            const double d = fabs(yv - xv);
            if (pass == 0) {
              num += d * d, den += xv * xv, count++;
            } else if (d > 0) {
              const double e = d / (10 * 1e-2 * rms + 5 * 1e-2 * fabs(xv));
              worst = e > worst ? e : worst;
            }
          }
    }
    const double rel = sqrt(num / den);
    double r1, w1, r8, w8, rl, wl;
    gpu_attention_compare(pw, pg, dt, b, batch, s, row, width, 1e-2, 1, &r1, &w1);
    gpu_attention_compare(pw, pg, dt, b, batch, s, row, width, 1e-2, 8, &r8, &w8);
    /* a NaN in the last part's last element */
    const int64_t last = (b - 1) * batch + (s - 1) * row + width - 1;
    if (t) {
      const uint16_t keep = gb[last];
      gb[last] = 0x7fc0;
      gpu_attention_compare(pw, pg, dt, b, batch, s, row, width, 1e-2, 8, &rl, &wl);
      gb[last] = keep;
    } else {
      const float keep = g[last];
      g[last] = NAN;
      gpu_attention_compare(pw, pg, dt, b, batch, s, row, width, 1e-2, 8, &rl, &wl);
      g[last] = keep;
    }
    const bool ok = r1 == r8 && w1 == w8 && fabs(w1 - worst) <= 1e-9 * worst && fabs(r1 - rel) <= 1e-9 * rel && worst > 1 &&
                    isinf(rl) && isinf(wl);
    checks++;
    if (!ok) failures++;
    printf("attention's measure of a difference, %s, %lld elements: rel err %.6e, worst element %.4f of its bound "
           "(the loop's %.6e, %.4f); 8 threads the same bits: %s; a NaN in the last part: %g %g %s\n",
           t ? "bf16" : "f32", (long long)(b * s * width), r1, w1, rel, worst, r1 == r8 && w1 == w8 ? "yes" : "no",
           rl, wl, ok ? "ok" : "FAIL");
  }
  free(w), free(g), free(wb), free(gb);
}

int main(int argc, char **argv) {
  char e[512];
  const bool only_attention = argc > 1 && strcmp(argv[1], "--attention") == 0;
  if (argc > 1 && !only_attention) {
    fprintf(stderr, "usage: test_kernels [--attention]\n");
    return 2;
  }
  int n = gpu_count(e, sizeof e);
  if (n < 0) die("gpu_count", e);
  gpu_props p;
  if (!gpu_properties(0, &p, e, sizeof e) || !gpu_use(0, e, sizeof e)) die("device 0", e);
  emulated = strstr(p.name, "emulation") != NULL;
  printf("test_kernels on %s (compute capability %d.%d)%s\n", p.name, p.major, p.minor,
         gpu_emulated() ? ", emulated on the CPU" : "");
  if (!(S = gpu_stream_new(e, sizeof e))) die("stream", e);
  if (!only_attention) check_choices(), check_agreement(), check_compare();
  bool big = !gpu_emulated();
  int dts[2] = {GPU_F32, GPU_BF16};
  for (int i = 0; i < 2 && !only_attention; i++) {
    int dt = dts[i];
    check_gemm(dt, 37, 19, 23);
    check_gemm_staged(dt);
    check_gemm_pitched(dt);
    check_colsum(dt, 300, 64);
    check_colsum(dt, 129, 768);
    check_gemm_gelu(dt, 37, 19, 23);
    check_gemm_gelu(dt, 48, 64, 40);
    if (big) check_gemm_gelu(dt, 1024, 768, 3072), check_gemm_gelu(dt, 1024, 3072, 768);
    check_gemm_resid(dt, 37, 19, 23);
    check_gemm_resid(dt, 48, 64, 40);
    if (big) check_gemm_resid(dt, 1024, 768, 768), check_gemm_resid(dt, 1024, 3072, 768);
    check_gemm_dbias(dt, GPU_F32, 37, 19, 23);
    check_gemm_dbias(dt, GPU_F32, 64, 48, 40);
    if (dt != GPU_F32) check_gemm_dbias(dt, dt, 64, 48, 40);
    if (big) check_gemm_dbias(dt, GPU_F32, 8192, 768, 2304), check_gemm_dbias(dt, GPU_F32, 8192, 3072, 768);
    if (big) {
      check_gemm(dt, 512, 768, 1024);
      /* products of 2^30 flops and more: their algorithms timed (tune in
       * matmul.cu), one of them staged with 1031 columns split 1024 + 7 */
      check_gemm(dt, 1024, 512, 1024);
      setenv("WEFT_GEMM_STAGE_FLOPS", "0", 1);
      check_gemm(dt, 1024, 520, 1031);
      unsetenv("WEFT_GEMM_STAGE_FLOPS");
    }
    check_embedding(dt);
    check_embedding_many(dt);
    check_norms(dt);
    check_elementwise(dt);
    check_overwrites(dt);
    check_rotary(dt);
    check_attention_all(dt);
    if (big) check_attention(dt, 2, 1024, 4, 64), check_attention(dt, 1, 300, 2, 128);
    check_attention_full(dt, 2, 37, 50, 3, 24);  /* T5's cross attention: keys of another length */
    check_attention_full(dt, 1, 70, 45, 2, 64);
    check_swin_moves(dt);
    check_window_attention(dt, 4, 2, 32, 2, 3, 0, 0, 2, 3, 0);
    check_window_attention(dt, 7, 3, 24, 2, 3, 2, 0, 4, 3, 3);  /* 49 tokens; the last row and column wrap */
    check_softmax(dt);
    check_losses(dt);
    check_ce_pitch(dt);
    check_moe(dt);
    check_optimizers(dt);
    check_msteps(dt);
    check_regions(dt);
  }
  /* WEFT_TEST_BIG=1: the large attention cases in the emulation too (minutes) */
  const char *bigenv = getenv("WEFT_TEST_BIG");
  bool tcbig = big || (bigenv && strcmp(bigenv, "1") == 0);
  if (only_attention) check_attention_all(GPU_BF16), check_attention_fa_bwd_shapes();
  if (!only_attention) check_mma(GPU_BF16), check_mma(GPU_F16);
  check_attention(GPU_F16, 1, 70, 2, 64);
  if (!only_attention) {
    check_attention_full(GPU_F16, 2, 37, 50, 3, 24);
    check_window_attention(GPU_F16, 7, 3, 24, 2, 3, 2, 0, 4, 3, 3);
  }
  check_attention_tc(GPU_BF16, tcbig);
  check_attention_tc(GPU_F16, tcbig);
  if (!only_attention) {
    check_attention_fa_shapes();
    check_attention_fa_bwd_shapes();
    check_attention_parts(GPU_BF16, 64);
    check_attention_parts(GPU_BF16, 128);
    check_attention_parts(GPU_F16, 96);
  }
  check_attention_wg();
  if (!gpu_sync(e, sizeof e)) die("sync", e);
  gpu_stream_free(S);
  printf("test_kernels: %d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
