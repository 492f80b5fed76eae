/* fuzz_lua.c - libFuzzer target: any bytes as a Lua heuristic, loaded in
 * the sandbox with small budgets, its policy run or its hooks given to
 * the search of a small model, must end in a plan or diagnostics, never a
 * crash, a leak or a hang. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft/script.h"
#include "weft/workspace.h"

static const char *const model_text =
    "use std\nmodel m(batch = 8, dim = 32, hidden = 64) {\n  input x : f32[batch, dim]\n  input y : f32[batch, dim]\n"
    "  param w1 : f32[dim, hidden]\n  param w2 : f32[hidden, dim]\n  h = matmul(x, w1)\n  a = gelu(h)\n"
    "  o = matmul(a, w2)\n  loss = mse(o, y)\n  train sgd(lr = 0.01)\n}\nlet c = cpus(4)\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  weft_ctx *c = weft_new();
  if (weft_load_text(c, "m.plan", model_text, strlen(model_text)) != WEFT_OK) abort();
  weft_loc none = {0};
  weft_graph *g = weft_build_graph(c, env_lookup(c->main->env, "m")->val, none);
  value cv = weft_build_cluster(c, env_lookup(c->main->env, "c")->val, none);
  if (!g || cv.kind != V_RECORD) abort();
  weft_cluster cl = weft_cluster_of(cv.rec);
  script_world w = {.g = g, .cl = &cl, .srcs = &c->srcs, .dg = &c->diags, .a = &c->arena,
                    .steps = 2000000, .memory = 16 << 20};
  weft_scripts *s = scripts_new(&w);
  if (scripts_load_text(s, "fuzz.lua", (const char *)data, size)) {
    search_opts o = {.top = 4};
    search_result r;
    if (scripts_policies(s, &o, &r) && r.nsimulated == 0) {
      search_hooks h = scripts_hooks(s);
      o.hooks = &h;
      search_run(g, &cl, &o, &c->arena, &c->diags, &r);
    }
  }
  FILE *devnull = fopen("/dev/null", "w");
  if (devnull) {
    diag_print(&c->diags, devnull, false);
    fclose(devnull);
  }
  scripts_free(s);
  weft_free(c);
  return 0;
}
