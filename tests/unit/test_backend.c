/* test_backend.c - the backend interface (weft/backend.h): the registry,
 * a plugin loaded by name, and the CPU backend driven through its table
 * only, against its one-device reference. */
#include <setjmp.h>
#include <stdarg.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "weft/backend.h"
#include "weft/lower.h"
#include "weft/report.h"
#include "weft/workspace.h"

static const char *const text =
    "use std\n"
    "model mlp(batch = 8, dim = 16, hidden = 32) {\n"
    "  input x : f32[batch, dim]\n  input y : f32[batch, dim]\n"
    "  param w1 : f32[dim, hidden]\n  param w2 : f32[hidden, dim]\n"
    "  h = matmul(x, w1)\n  a = gelu(h)\n  o = matmul(a, w2)\n  loss = mse(o, y)\n"
    "  train adamw(lr = 0.01)\n}\n"
    "plan tp_dp for mlp on cpus(4) {\n"
    "  mesh m = devices as [dp = 2, tp = 2]\n"
    "  split {h, a} on hidden into tp\n  split o on hidden into tp\n  replicate loss into tp\n"
    "  split all on batch into dp\n  assign all -> m[dp, tp]\n}\n";

static weft_program *lowered(weft_ctx *c) {
  if (weft_load_text(c, "t.plan", text, strlen(text)) != WEFT_OK) fail_msg("the text is rejected");
  binding *b = env_lookup(c->main->env, "tp_dp");
  assert_non_null(b);
  weft_loc none = {0};
  weft_plan *p = weft_build_plan(c, b->val, none, NULL);
  assert_non_null(p);
  lower_opts lo = {.full_programs = true};
  weft_program *pr = lower_plan(p, &lo, &c->arena, &c->diags);
  assert_non_null(pr);
  return pr;
}

typedef struct steps {
  int n;
  double loss[8];
} steps;

static void on_step(void *ctx, int64_t step, double loss, double seconds) {
  steps *s = ctx;
  (void)seconds;
  assert_int_equal(step, s->n + 1);
  if (s->n < 8) s->loss[s->n] = loss;
  s->n++;
}

static void test_registry(void **state) {
  (void)state;
  int n;
  const weft_backend *const *all = backend_builtin(&n);
  assert_true(n >= 1);
  assert_string_equal(all[0]->name, "cpu");
  assert_int_equal(all[0]->version, WEFT_BACKEND_VERSION);
  char err[512];
  assert_ptr_equal(backend_find("cpu", err, sizeof err), all[0]);
  assert_null(backend_find("tpu", err, sizeof err));
  assert_string_equal(err, "backend 'tpu' is not available; this build runs plans on: cpu");
  setenv("WEFT_PLUGIN_DIR", "/nonexistent", 1);
  assert_null(backend_find("cuda", err, sizeof err));
  assert_non_null(strstr(err, "libweft_cuda.so, not built beside weft"));
  unsetenv("WEFT_PLUGIN_DIR");
}

/* A plugin built here: the table a CUDA backend would export. */
static void test_plugin(void **state) {
  (void)state;
  if (system("command -v \"${CC:-cc}\" >/dev/null 2>&1") != 0) skip();
  char dir[] = "/tmp/weft-test-backend-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char src[128], lib[128], cmd[512];
  snprintf(src, sizeof src, "%s/cuda.c", dir);
  snprintf(lib, sizeof lib, "%s/libweft_cuda.so", dir);
  FILE *f = fopen(src, "w");
  assert_non_null(f);
  fputs("#include \"weft/backend.h\"\n"
        "static void procs(int *rank, int *size) { *rank = 0; *size = 1; }\n"
        "const weft_backend weft_backend_cuda = {.version = WEFT_BACKEND_VERSION, .name = \"cuda\",\n"
        "  .summary = \"a stand-in\", .procs = procs};\n", f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "\"${CC:-cc}\" -shared -fPIC -Iinclude -o '%s' '%s'", lib, src);
  assert_int_equal(system(cmd), 0);
  setenv("WEFT_PLUGIN_DIR", dir, 1);
  char err[512] = "";
  const weft_backend *b = backend_find("cuda", err, sizeof err);
  if (!b) fail_msg("%s", err);
  assert_string_equal(b->name, "cuda");
  assert_string_equal(b->summary, "a stand-in");
  int rank = -1, size = -1;
  b->procs(&rank, &size);
  assert_int_equal(size, 1);
  unsetenv("WEFT_PLUGIN_DIR");
  unlink(src);
  unlink(lib);
  rmdir(dir);
}

/* Open, run in two calls, read back, close: the same bytes as one call of
 * both steps, and within 1e-5 of the reference. */
static void test_cpu_through_table(void **state) {
  (void)state;
  char err[512] = "";
  const weft_backend *cpu = backend_find("cpu", err, sizeof err);
  assert_non_null(cpu);
  weft_ctx *c = weft_new();
  weft_program *pr = lowered(c);
  const weft_graph *g = lower_graph(pr);
  weft_world *w = world_new(g);
  world_init_params(w, 3);
  world_init_inputs(w, 3);
  weft_world *once = world_clone(w), *ref = world_clone(w);

  steps a = {0}, b = {0}, r = {0};
  backend_opts o = {.on_step = on_step, .ctx = &a};
  backend_run *run = cpu->open(pr, w, &o, err, sizeof err);
  if (!run) fail_msg("%s", err);
  assert_true(cpu->run(run, 1, err, sizeof err));
  assert_true(cpu->run(run, 1, err, sizeof err));
  assert_true(cpu->read(run, err, sizeof err));
  cpu->close(run);
  assert_int_equal(a.n, 2);
  assert_int_equal(w->step, 2);

  o.ctx = &b;
  run = cpu->open(pr, once, &o, err, sizeof err);
  assert_non_null(run);
  assert_true(cpu->run(run, 2, err, sizeof err));
  assert_true(cpu->read(run, err, sizeof err));
  cpu->close(run);
  assert_true(world_diff_all(w, once) == 0.0);
  assert_true(a.loss[1] == b.loss[1]);

  o.ctx = &r;
  assert_true(cpu->reference(g, ref, 2, &o, err, sizeof err));
  assert_int_equal(r.n, 2);
  assert_true(world_diff_all(w, ref) < 1e-5);
  for (int i = 0; i < 2; i++) assert_true(fabs(a.loss[i] - r.loss[i]) <= 1e-5 * fabs(r.loss[i]));
  world_free(w);
  world_free(once);
  world_free(ref);
  weft_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_registry),
      cmocka_unit_test(test_plugin),
      cmocka_unit_test(test_cpu_through_table),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
