/* test_native.c - native kernels (backends/cpu/native.c): a small library is
 * compiled at test time with `cc -shared -fPIC`, then loaded and called with
 * 0 to 3 inputs and up to 6 sizes, forward and backward, from several
 * threads, and the errors for bad specs, libraries and symbols are checked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/native.h"

/* The kernels under test, with the calling convention of native.h. */
static const char test_source[] =
    "#include <stdint.h>\n"
    "#include <string.h>\n"
    "/* out = 2 a + 1 */\n"
    "void one_fwd(float *out, const float *a, int64_t n) {\n"
    "  for (int64_t i = 0; i < n; i++) out[i] = 2 * a[i] + 1;\n"
    "}\n"
    "void one_bwd(float *da, const float *dout, const float *a, int64_t n) {\n"
    "  if (da) for (int64_t i = 0; i < n; i++) da[i] = 2 * dout[i];\n"
    "}\n"
    "/* out[i, j] = a[i, j] b[i, j] + j */\n"
    "void two_fwd(float *out, const float *a, const float *b, int64_t m, int64_t n) {\n"
    "  for (int64_t i = 0; i < m; i++)\n"
    "    for (int64_t j = 0; j < n; j++) out[i * n + j] = a[i * n + j] * b[i * n + j] + (float)j;\n"
    "}\n"
    "void two_bwd(float *da, float *db, const float *dout, const float *a, const float *b,\n"
    "             int64_t m, int64_t n) {\n"
    "  for (int64_t i = 0; i < m * n; i++) {\n"
    "    if (da) da[i] = dout[i] * b[i];\n"
    "    if (db) db[i] = dout[i] * a[i];\n"
    "  }\n"
    "}\n"
    "/* out = a + 2 b + 3 c over x * y * z elements */\n"
    "void three_fwd(float *out, const float *a, const float *b, const float *c,\n"
    "               int64_t x, int64_t y, int64_t z) {\n"
    "  for (int64_t i = 0; i < x * y * z; i++) out[i] = a[i] + 2 * b[i] + 3 * c[i];\n"
    "}\n"
    "void three_bwd(float *da, float *db, float *dc, const float *dout, const float *a,\n"
    "               const float *b, const float *c, int64_t x, int64_t y, int64_t z) {\n"
    "  for (int64_t i = 0; i < x * y * z; i++) {\n"
    "    if (da) da[i] = dout[i];\n"
    "    if (db) db[i] = 2 * dout[i];\n"
    "    if (dc) dc[i] = 3 * dout[i];\n"
    "  }\n"
    "}\n"
    "/* the sizes it was given and the pointers' order, as int64 words of out */\n"
    "void sizes_fwd(float *out, int64_t s0, int64_t s1, int64_t s2, int64_t s3,\n"
    "               int64_t s4, int64_t s5) {\n"
    "  int64_t s[6] = {s0, s1, s2, s3, s4, s5};\n"
    "  memcpy(out, s, sizeof s);\n"
    "}\n"
    "void order_bwd(float *d0, float *d1, const float *dout, const float *i0, const float *i1,\n"
    "               int64_t n) {\n"
    "  d0[0] = dout[0]; d0[1] = i0[0]; d0[2] = i1[0]; d0[3] = (float)n;\n"
    "  d1[0] = -1;\n"
    "}\n"
    "/* a kernel first called from several threads at once */\n"
    "void race_fwd(float *out, const float *a, int64_t n, int64_t k) {\n"
    "  for (int64_t i = 0; i < n; i++) out[i] = a[i] * (float)k;\n"
    "}\n"
    "int not_a_kernel_but_exported;\n";

static char test_dir[64];        /* the temporary directory with the library */
static char test_lib[128];       /* its full path */
static bool test_no_cc;          /* no C compiler: every test is skipped */

static int group_setup(void **state) {
  (void)state;
  if (system("command -v \"${CC:-cc}\" >/dev/null 2>&1") != 0) {
    fprintf(stderr, "test_native: no C compiler (cc or $CC) to build the test library; skipping\n");
    test_no_cc = true;
    return 0;
  }
  strcpy(test_dir, "/tmp/weft-test-native-XXXXXX");
  if (!mkdtemp(test_dir)) return -1;
  char src[128], cmd[512];
  snprintf(src, sizeof src, "%s/kernels.c", test_dir);
  snprintf(test_lib, sizeof test_lib, "%s/libtestkernels.so", test_dir);
  FILE *f = fopen(src, "w");
  if (!f) return -1;
  fputs(test_source, f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "\"${CC:-cc}\" -shared -fPIC -O1 -o '%s' '%s'", test_lib, src);
  if (system(cmd) != 0) {
    fprintf(stderr, "test_native: cannot build the test library: %s\n", cmd);
    return -1;
  }
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  if (test_no_cc) return 0;
  char path[160];
  snprintf(path, sizeof path, "%s/kernels.c", test_dir);
  unlink(path);
  unlink(test_lib);
  rmdir(test_dir);
  return 0;
}

#define NEED_CC() do { if (test_no_cc) skip(); } while (0)

static native_kernel *load_ok(const char *symbol) {
  char spec[160], err[512];
  snprintf(spec, sizeof spec, "libtestkernels.so:%s", symbol);
  native_kernel *k = native_load(spec, test_dir, err, sizeof err);
  if (!k) fprintf(stderr, "native_load(%s): %s\n", spec, err);
  assert_non_null(k);
  return k;
}

/* ---- loading ----------------------------------------------------------------- */

static void test_load_cache(void **state) {
  (void)state;
  NEED_CC();
  char err[512], dir_slash[80], spec_abs[200];
  native_kernel *a = load_ok("one_fwd");
  native_kernel *b = load_ok("one_fwd");
  assert_ptr_equal(a, b);
  assert_string_equal(native_spec(a), "libtestkernels.so:one_fwd");
  /* "dir" and "dir/" name the same file */
  snprintf(dir_slash, sizeof dir_slash, "%s/", test_dir);
  assert_ptr_equal(native_load("libtestkernels.so:one_fwd", dir_slash, err, sizeof err), a);
  /* an absolute library ignores dir */
  snprintf(spec_abs, sizeof spec_abs, "%s:one_fwd", test_lib);
  native_kernel *c = native_load(spec_abs, "/nonexistent", err, sizeof err);
  assert_non_null(c);
  assert_string_equal(native_path(c), test_lib);
  /* another symbol of the same library is another kernel */
  native_kernel *d = load_ok("one_bwd");
  assert_ptr_not_equal(a, d);
  /* dir NULL: the current directory, not the system's search path */
  char cwd[4096];
  assert_non_null(getcwd(cwd, sizeof cwd));
  assert_int_equal(chdir(test_dir), 0);
  native_kernel *e = native_load("libtestkernels.so:two_fwd", NULL, err, sizeof err);
  assert_int_equal(chdir(cwd), 0);
  assert_non_null(e);
  assert_string_equal(native_path(e), "./libtestkernels.so");
}

static void test_load_errors(void **state) {
  (void)state;
  NEED_CC();
  char err[512];
  assert_null(native_load("libnosuch.so:f", test_dir, err, sizeof err));
  assert_true(strncmp(err, "libnosuch.so:f: cannot load the library: ", 41) == 0);
  assert_non_null(strstr(err, "libnosuch.so"));

  assert_null(native_load("libtestkernels.so:no_such_symbol", test_dir, err, sizeof err));
  char want[300];
  snprintf(want, sizeof want, "libtestkernels.so:no_such_symbol: %s/libtestkernels.so has no symbol 'no_such_symbol'",
           test_dir);
  assert_string_equal(err, want);

  assert_null(native_load("no_colon", test_dir, err, sizeof err));
  assert_string_equal(err, "no_colon: not of the form LIB:SYMBOL");
  assert_null(native_load(":f", test_dir, err, sizeof err));
  assert_string_equal(err, ":f: not of the form LIB:SYMBOL");
  assert_null(native_load("lib.so:", test_dir, err, sizeof err));
  assert_string_equal(err, "lib.so:: not of the form LIB:SYMBOL");

  /* a short buffer is truncated, not overrun */
  char small[12];
  memset(small, 'x', sizeof small);
  assert_null(native_load("libnosuch.so:f", test_dir, small, sizeof small));
  assert_int_equal(strlen(small), sizeof small - 1);
  /* a failure is not remembered: a later load tries again */
  assert_null(native_load("libtestkernels.so:no_such_symbol", test_dir, err, sizeof err));
}

/* ---- calls ------------------------------------------------------------------- */

static void test_one_input(void **state) {
  (void)state;
  NEED_CC();
  native_kernel *f = load_ok("one_fwd"), *b = load_ok("one_bwd");
  static const int64_t ns[] = {1, 7, 1000};
  for (int t = 0; t < 3; t++) {
    int64_t n = ns[t];
    float *a = malloc(sizeof(float) * (size_t)n), *out = malloc(sizeof(float) * (size_t)n);
    float *dout = malloc(sizeof(float) * (size_t)n), *da = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) { a[i] = (float)i * 0.5f - 3; out[i] = 99; dout[i] = (float)(i % 5); }
    const float *in[] = {a};
    native_forward(f, out, 1, in, 1, &n);
    for (int64_t i = 0; i < n; i++) assert_true(out[i] == 2 * a[i] + 1);
    float *din[] = {da};
    native_backward(b, din, 1, dout, in, 1, &n);
    for (int64_t i = 0; i < n; i++) assert_true(da[i] == 2 * dout[i]);
    /* NULL: the gradient is not wanted, and nothing is written */
    float *none[] = {NULL};
    native_backward(b, none, 1, dout, in, 1, &n);
    free(a); free(out); free(dout); free(da);
  }
}

static void test_two_inputs(void **state) {
  (void)state;
  NEED_CC();
  native_kernel *f = load_ok("two_fwd"), *b = load_ok("two_bwd");
  static const int64_t shapes[][2] = {{1, 1}, {3, 5}, {16, 33}};
  for (int t = 0; t < 3; t++) {
    int64_t m = shapes[t][0], n = shapes[t][1], sz[] = {m, n};
    size_t len = (size_t)(m * n);
    float *a = malloc(sizeof(float) * len), *bb = malloc(sizeof(float) * len), *out = malloc(sizeof(float) * len);
    float *dout = malloc(sizeof(float) * len), *da = malloc(sizeof(float) * len), *db = malloc(sizeof(float) * len);
    for (size_t i = 0; i < len; i++) { a[i] = (float)i; bb[i] = (float)(i % 3) - 1; dout[i] = 0.25f * (float)i; }
    const float *in[] = {a, bb};
    native_forward(f, out, 2, in, 2, sz);
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) assert_true(out[i * n + j] == a[i * n + j] * bb[i * n + j] + (float)j);
    float *din[] = {da, db};
    native_backward(b, din, 2, dout, in, 2, sz);
    for (size_t i = 0; i < len; i++) {
      assert_true(da[i] == dout[i] * bb[i]);
      assert_true(db[i] == dout[i] * a[i]);
    }
    /* only the second gradient: the first buffer is left alone */
    for (size_t i = 0; i < len; i++) { da[i] = 7; db[i] = 7; }
    float *only_b[] = {NULL, db};
    native_backward(b, only_b, 2, dout, in, 2, sz);
    for (size_t i = 0; i < len; i++) {
      assert_true(da[i] == 7);
      assert_true(db[i] == dout[i] * a[i]);
    }
    free(a); free(bb); free(out); free(dout); free(da); free(db);
  }
}

static void test_three_inputs(void **state) {
  (void)state;
  NEED_CC();
  native_kernel *f = load_ok("three_fwd"), *b = load_ok("three_bwd");
  static const int64_t shapes[][3] = {{1, 1, 1}, {2, 3, 4}, {5, 1, 9}};
  for (int t = 0; t < 3; t++) {
    const int64_t *sz = shapes[t];
    size_t len = (size_t)(sz[0] * sz[1] * sz[2]);
    float *x[3], *d[3], *out = malloc(sizeof(float) * len), *dout = malloc(sizeof(float) * len);
    for (int k = 0; k < 3; k++) {
      x[k] = malloc(sizeof(float) * len);
      d[k] = malloc(sizeof(float) * len);
      for (size_t i = 0; i < len; i++) x[k][i] = (float)(i + 10 * (size_t)k);
    }
    for (size_t i = 0; i < len; i++) dout[i] = (float)i - 2;
    const float *in[] = {x[0], x[1], x[2]};
    native_forward(f, out, 3, in, 3, sz);
    for (size_t i = 0; i < len; i++) assert_true(out[i] == x[0][i] + 2 * x[1][i] + 3 * x[2][i]);
    native_backward(b, d, 3, dout, in, 3, sz);
    for (size_t i = 0; i < len; i++) {
      assert_true(d[0][i] == dout[i]);
      assert_true(d[1][i] == 2 * dout[i]);
      assert_true(d[2][i] == 3 * dout[i]);
    }
    for (int k = 0; k < 3; k++) { free(x[k]); free(d[k]); }
    free(out); free(dout);
  }
}

/* Sizes arrive in order and whole (64 bits, negative ones too), with no
 * tensor input; backward pointers come as din..., dout, in.... */
static void test_sizes_and_order(void **state) {
  (void)state;
  NEED_CC();
  native_kernel *f = load_ok("sizes_fwd");
  int64_t sz[6] = {1, (int64_t)1 << 40, -3, INT64_MAX, 0, 12345};
  int64_t got[6] = {0};
  native_forward(f, (float *)got, 0, NULL, 6, sz);
  for (int i = 0; i < 6; i++) assert_true(got[i] == sz[i]);

  native_kernel *b = load_ok("order_bwd");
  float d0[4] = {0}, d1[1] = {0}, dout[1] = {5}, i0[1] = {6}, i1[1] = {7};
  float *din[] = {d0, d1};
  const float *in[] = {i0, i1};
  int64_t n = 8;
  native_backward(b, din, 2, dout, in, 1, &n);
  assert_true(d0[0] == 5 && d0[1] == 6 && d0[2] == 7 && d0[3] == 8);
  assert_true(d1[0] == -1);
}

/* ---- threads ----------------------------------------------------------------- */

enum { THREADS = 4, ROUNDS = 2000, LEN = 257 };

typedef struct worker {
  int id;
  native_kernel *k;           /* the kernel to call; NULL: load it first */
  int failures;
} worker;

static void *work(void *arg) {
  worker *w = arg;
  char err[256];
  native_kernel *k = w->k ? w->k : native_load("libtestkernels.so:race_fwd", test_dir, err, sizeof err);
  if (!k) { w->failures++; return NULL; }
  if (!w->k) w->k = k;
  float a[LEN], out[LEN];
  for (int r = 0; r < ROUNDS; r++) {
    for (int i = 0; i < LEN; i++) a[i] = (float)(i + w->id * 1000 + r % 7);
    int64_t sz[] = {LEN, w->id + 1 + r % 3};
    const float *in[] = {a};
    native_forward(k, out, 1, in, 2, sz);
    for (int i = 0; i < LEN; i++)
      if (out[i] != a[i] * (float)sz[1]) { w->failures++; break; }
  }
  return NULL;
}

/* Four threads load the same kernel and make its first calls at once (the
 * call interface is prepared under contention), then call it many times. */
static void test_threads(void **state) {
  (void)state;
  NEED_CC();
  pthread_t th[THREADS];
  worker w[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker){.id = i};
    assert_int_equal(pthread_create(&th[i], NULL, work, &w[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
  for (int i = 0; i < THREADS; i++) {
    assert_int_equal(w[i].failures, 0);
    assert_ptr_equal(w[i].k, w[0].k);
  }
  /* and a kernel already warm, called from all four again */
  for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_create(&th[i], NULL, work, &w[i]), 0);
  for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
  for (int i = 0; i < THREADS; i++) assert_int_equal(w[i].failures, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_load_cache),
      cmocka_unit_test(test_load_errors),
      cmocka_unit_test(test_one_input),
      cmocka_unit_test(test_two_inputs),
      cmocka_unit_test(test_three_inputs),
      cmocka_unit_test(test_sizes_and_order),
      cmocka_unit_test(test_threads),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
