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

#include "unit.h"

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
  weft_plan *p = unit_plan(c, text, "tp_dp");
  assert_non_null(p);
  lower_opts lo = {.full_programs = true};
  weft_program *pr = lower_plan(p, &lo, &c->arena, &c->diags);
  assert_non_null(pr);
  return pr;
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

static backend_result pass_ok(const weft_backend *cpu, backend_run *run, backend_step s) {
  char err[512] = "";
  backend_result r = {0};
  if (!cpu->run(run, &s, &r, err, sizeof err)) fail_msg("%s", err);
  return r;
}

/* Open, two steps, read back, close; the same steps with an evaluation
 * between them: the evaluation changes nothing and measures the loss the
 * next step's forward gives; the reference within 1e-5, gradient norms
 * included. */
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
  weft_world *evald = world_clone(w), *ref = world_clone(w);
  backend_step train = {.lr = NAN}, eval = {.lr = NAN, .eval = true};

  backend_opts o = {0};
  backend_run *run = cpu->open(pr, w, &o, err, sizeof err);
  if (!run) fail_msg("%s", err);
  backend_result a[2] = {pass_ok(cpu, run, train), pass_ok(cpu, run, train)};
  assert_true(cpu->read(run, err, sizeof err));
  cpu->close(run);
  assert_int_equal(w->step, 2);
  assert_true(a[0].grad_norm > 0 && isfinite(a[0].grad_norm));

  run = cpu->open(pr, evald, &o, err, sizeof err);
  assert_non_null(run);
  backend_result b0 = pass_ok(cpu, run, train), e = pass_ok(cpu, run, eval), b1 = pass_ok(cpu, run, train);
  assert_true(cpu->read(run, err, sizeof err));
  cpu->close(run);
  assert_int_equal(evald->step, 2);
  assert_true(world_diff_all(w, evald) == 0.0);
  assert_true(e.loss == a[1].loss && b1.loss == a[1].loss && b0.grad_norm == a[0].grad_norm);
  assert_true(isnan(e.grad_norm));

  backend_result r[2];
  for (int i = 0; i < 2; i++) assert_true(cpu->reference(g, ref, &train, &r[i], &o, err, sizeof err));
  assert_int_equal(ref->step, 2);
  assert_true(world_diff_all(w, ref) < 1e-5);
  for (int i = 0; i < 2; i++) {
    assert_true(fabs(a[i].loss - r[i].loss) <= 1e-5 * fabs(r[i].loss));
    assert_true(fabs(a[i].grad_norm - r[i].grad_norm) <= 1e-5 * r[i].grad_norm);
  }
  world_free(w);
  world_free(evald);
  world_free(ref);
  weft_free(c);
}

/* The learning rate of a step is the one it is given: 0 leaves every
 * parameter as it was (AdamW's decay and update both scale with it) while
 * the step still counts; clipping with a bound far above the norm changes
 * no bit, one below it scales the gradient (the first moment of AdamW is
 * (1 - beta1) g: scaled exactly by the factor). */
static void test_lr_and_clip(void **state) {
  (void)state;
  char err[512] = "";
  const weft_backend *cpu = backend_find("cpu", err, sizeof err);
  weft_ctx *c = weft_new();
  weft_program *pr = lowered(c);
  const weft_graph *g = lower_graph(pr);
  weft_world *w = world_new(g);
  world_init_params(w, 5);
  world_init_inputs(w, 5);
  weft_world *w0 = world_clone(w), *loose = world_clone(w), *tight = world_clone(w), *plain = world_clone(w);
  backend_opts o = {0};
  backend_run *run = cpu->open(pr, w, &o, err, sizeof err);
  assert_non_null(run);
  pass_ok(cpu, run, (backend_step){.lr = 0});
  assert_true(cpu->read(run, err, sizeof err));
  cpu->close(run);
  assert_int_equal(w->step, 1);
  assert_true(world_diff_all(w, w0) == 0.0);

  weft_world *ws[3] = {plain, loose, tight};
  double clip[3] = {0, 1e9, 0};
  backend_result res[3];
  for (int k = 0; k < 3; k++) {
    run = cpu->open(pr, ws[k], &o, err, sizeof err);
    assert_non_null(run);
    if (k == 2) clip[2] = res[0].grad_norm / 4;
    res[k] = pass_ok(cpu, run, (backend_step){.lr = NAN, .clip = clip[k]});
    assert_true(cpu->read(run, err, sizeof err));
    cpu->close(run);
  }
  assert_true(world_diff_all(loose, plain) == 0.0);
  assert_true(world_diff(loose, plain, true, NULL) == 0.0);
  assert_true(res[2].grad_norm == res[0].grad_norm);
  /* the first moments: m = (1 - beta1) g, so tight's are plain's times clip / norm */
  double f = clip[2] / (res[0].grad_norm + 1e-6);
  for (int t = 0; t < g->ntensors; t++) {
    if (!plain->state[t]) continue;
    int64_t n = tensor_numel(&g->tensors[t]);
    for (int64_t i = 0; i < n; i++)
      assert_true(fabs(tight->state[t][i] - f * plain->state[t][i]) <= 1e-6 * fabs(plain->state[t][i]) + 1e-12);
  }
  world_free(w), world_free(w0), world_free(loose), world_free(tight), world_free(plain);
  weft_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_registry),
      cmocka_unit_test(test_plugin),
      cmocka_unit_test(test_cpu_through_table),
      cmocka_unit_test(test_lr_and_clip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
