/* test_script.c - Lua heuristics through the script stage's API: hooks
 * that change what search_run returns (a prune of tp > 4, a rank by
 * memory, a space of one tensor-parallel degree), a policy whose plan,
 * printed as weft source, evaluates to the figures the policy's result
 * reports, and budgets that stop a runaway script and leave the process
 * to go on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "weft/report.h"
#include "weft/script.h"
#include "weft/search.h"
#include "weft/sim.h"
#include "weft/validate.h"
#include "weft/workspace.h"

/* A small GPT with a batch of one on a DGX A100 node: alone, the search
 * picks tp 8 (tests/lua_check.sh shows the same from the command line). */
static const char *const model_text =
    "use std\nmodel g = gpt(layers = 4, hidden = 1024, heads = 16, seq = 512, vocab = 8192, batch = 1)\n"
    "let c = a100_dgx(nodes = 1)\n";

typedef struct world {
  weft_ctx *c;
  weft_graph *g;
  weft_cluster cl;
  weft_scripts *s;
} world;

static void open_world(world *w, int64_t steps, int64_t memory) {
  memset(w, 0, sizeof *w);
  w->c = weft_new();
  assert_int_equal(weft_load_text(w->c, "t.plan", model_text, strlen(model_text)), WEFT_OK);
  weft_loc none = {0};
  w->g = weft_build_graph(w->c, env_lookup(w->c->main->env, "g")->val, none);
  assert_non_null(w->g);
  value cv = weft_build_cluster(w->c, env_lookup(w->c->main->env, "c")->val, none);
  assert_int_equal(cv.kind, V_RECORD);
  w->cl = weft_cluster_of(cv.rec);
  script_world sw = {.g = w->g, .cl = &w->cl, .srcs = &w->c->srcs, .dg = &w->c->diags, .a = &w->c->arena,
                     .steps = steps, .memory = memory};
  w->s = scripts_new(&sw);
}

static void close_world(world *w) {
  scripts_free(w->s);
  weft_free(w->c);
}

static void load(world *w, const char *text) {
  bool ok = scripts_load_text(w->s, "h.lua", text, strlen(text));
  if (!ok) diag_print(&w->c->diags, stderr, false);
  assert_true(ok);
}

/* The search with the scripts' hooks (none when hooked is false). */
static search_result search(world *w, bool hooked) {
  search_hooks h = scripts_hooks(w->s);
  search_opts o = {.buckets = false, .hooks = hooked ? &h : NULL};
  search_result r;
  bool ok = search_run(w->g, &w->cl, &o, &w->c->arena, &w->c->diags, &r);
  if (!ok) diag_print(&w->c->diags, stderr, false);
  assert_true(ok);
  assert_true(r.best >= 0);
  return r;
}

static void prune_forbids_wide_tp(void **state) {
  (void)state;
  world w;
  open_world(&w, 0, 0);
  load(&w, "return { prune = function(c) return c.tp <= 2 end }\n");
  search_result plain = search(&w, false), pruned = search(&w, true);
  assert_int_equal(plain.plans[plain.best].tp, 8);
  assert_true(pruned.plans[pruned.best].tp <= 2);
  for (int i = 0; i < pruned.nsimulated; i++) assert_true(pruned.simulated[i].tp <= 2);
  assert_true(pruned.pruned > plain.pruned);
  close_world(&w);
}

static void rank_by_memory(void **state) {
  (void)state;
  world w;
  open_world(&w, 0, 0);
  load(&w, "return { rank = function(c) return c.peak_memory_bytes or c.analytic_memory_bytes end }\n");
  search_result plain = search(&w, false), ranked = search(&w, true);
  assert_true(ranked.ranked);
  const search_plan *b = &ranked.plans[ranked.best];
  assert_true(b->peak_memory < plain.plans[plain.best].peak_memory);
  for (int i = 0; i < ranked.nsimulated; i++)
    if (ranked.simulated[i].fits) assert_true(b->peak_memory <= ranked.simulated[i].peak_memory);
  assert_true(b->rank == (double)b->peak_memory);
  close_world(&w);
}

static void space_of_one_tp(void **state) {
  (void)state;
  world w;
  open_world(&w, 0, 0);
  load(&w, "return { space = function(s) s.tp = {2}; s.recompute = {'none'} end }\n");
  search_result plain = search(&w, false), narrow = search(&w, true);
  assert_true(narrow.searched < plain.searched);
  for (int i = 0; i < narrow.nsimulated; i++) {
    assert_int_equal(narrow.simulated[i].tp, 2);
    assert_int_equal(narrow.simulated[i].recompute, 0);
  }
  close_world(&w);
}

/* Estimates a plan written as text: its step time. */
static double estimate_text(const char *text) {
  weft_ctx *c = weft_new();
  if (weft_load_text(c, "p.plan", text, strlen(text)) != WEFT_OK) {
    diag_print(&c->diags, stderr, false);
    fail_msg("the policy's plan does not load:\n%s", text);
  }
  weft_item items[8];
  assert_int_equal(weft_items(c, V_PLAN, items, 8), 1);
  weft_plan *p = weft_build_plan(c, items[0].val, items[0].loc, &(plan_opts){.reps = true});
  weft_program *pr = p ? lower_plan(p, NULL, &c->arena, &c->diags) : NULL;
  assert_non_null(pr);
  assert_true(validate_program(pr, &(validate_opts){.skip_memory = true}, &c->diags));
  hw_model hw;
  assert_true(hw_from_plan(&c->diags, p, pr, &hw));
  weft_sim *s = sim_run(pr, &hw);
  weft_estimate e;
  sim_estimate(s, &e);
  sim_free(s);
  weft_free(c);
  return e.step_time;
}

static void policy_plan_is_a_plan(void **state) {
  (void)state;
  world w;
  open_world(&w, 0, 0);
  load(&w,
       "return { policy = function(model, cluster, weft)\n"
       "  return { weft.mesh('m', {{'pp', 2}, {'tp', 4}}),\n"
       "    weft.split({'h.*.attn.c_attn', 'h.*.attn.core', 'h.*.mlp.c_fc'}, 'n', 4, 'tp'),\n"
       "    weft.split('h.*.mlp.act', 'ffn', 4, 'tp'),\n"
       "    weft.replicate({'tok', 'emb', 'h.*.ln_1', 'h.*.attn.c_proj', 'h.*.res_1', 'h.*.ln_2', 'h.*.mlp.c_proj',\n"
       "                    'h.*.res_2', 'ln_f', 'lm_head', 'loss'}, 4, 'tp'),\n"
       "    weft.stage('s0', {'tok', 'emb', 'h[0..2]'}), weft.stage('s1', {'h[2..4]', 'ln_f', 'lm_head', 'loss'}),\n"
       "    weft.assign('s0', 'm', {0, 'tp'}), weft.assign('s1', 'm', {1, 'tp'}),\n"
       "    weft.schedule('one_f_one_b'), weft.recompute('h.*', 'full') }\n"
       "end }\n");
  search_opts o = {0};
  search_result r;
  bool ok = scripts_policies(w.s, &o, &r);
  if (!ok) diag_print(&w.c->diags, stderr, false);
  assert_true(ok);
  assert_int_equal(r.nsimulated, 1);
  const search_plan *p = &r.plans[r.best];
  assert_int_equal(p->tp, 4);
  assert_int_equal(p->pp, 2);
  assert_int_equal(p->recompute, 2);
  assert_int_equal(p->schedule, SCHED_1F1B);
  /* printed as weft source, it evaluates to the same step */
  char *body = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&body, &n);
  fprintf(f, "use std\nplan h for gpt(layers = 4, hidden = 1024, heads = 16, seq = 512, vocab = 8192, batch = 1) "
             "on a100_dgx(nodes = 1) {\n");
  search_print_body(p, w.g, f);
  fputs("}\n", f);
  fclose(f);
  double t = estimate_text(body);
  free(body);
  assert_true(p->step_time > 0);
  assert_float_equal(t, p->step_time, p->step_time * 1e-9);
  close_world(&w);
}

static void runaway_stops(void **state) {
  (void)state;
  world w;
  open_world(&w, 100000, 0);
  load(&w, "return { prune = function(c) while true do end end }\n");
  search_hooks h = scripts_hooks(w.s);
  search_opts o = {.hooks = &h};
  search_result r;
  assert_false(search_run(w.g, &w.cl, &o, &w.c->arena, &w.c->diags, &r));
  bool found = false;
  for (int i = 0; i < w.c->diags.n; i++)
    found |= strstr(w.c->diags.items[i].msg, "budget of 100,000 instructions") && w.c->diags.items[i].loc.line == 1;
  assert_true(found);
  /* a second load after a failure is refused, quietly: the first error stands */
  assert_false(scripts_load_text(w.s, "again.lua", "return {}", 9));
  close_world(&w);
}

static void memory_stops(void **state) {
  (void)state;
  world w;
  open_world(&w, 0, 4 << 20);
  const char *text = "local t = {}\nfor i = 1, 1e9 do t[i] = {} end\nreturn {}\n";
  assert_false(scripts_load_text(w.s, "grow.lua", text, strlen(text)));
  bool found = false;
  for (int i = 0; i < w.c->diags.n; i++) found |= strstr(w.c->diags.items[i].msg, "memory budget of 4.0 MiB") != NULL;
  assert_true(found);
  close_world(&w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(prune_forbids_wide_tp), cmocka_unit_test(rank_by_memory),
      cmocka_unit_test(space_of_one_tp),       cmocka_unit_test(policy_plan_is_a_plan),
      cmocka_unit_test(runaway_stops),         cmocka_unit_test(memory_stops),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
