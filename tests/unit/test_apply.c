/* test_apply.c - plans built as data, as the search builds them: decision
 * lists made in C, applied, lowered, validated and estimated against one
 * graph and one cluster, each candidate in an arena reset between them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include <cmocka.h>

#include "weft/plan.h"
#include "weft/sim.h"
#include "weft/validate.h"
#include "weft/workspace.h"

static const char *const text =
    "use std\n"
    "model g = gpt(layers = 2, hidden = 64, heads = 8, seq = 32, vocab = 256, batch = 32)\n";

typedef struct shape {
  int dp, tp, pp, mb, zero, recompute;
  bool bad;               /* a tensor split that the model's sizes forbid */
} shape;

static dec_ops join(arena *a, const weft_graph *g, const char *const *pats, int n) {
  dec_ops out = {0, arena_alloc(a, sizeof(int) * (size_t)g->nops)};
  for (int i = 0; i < n; i++) {
    dec_ops x = dec_select(a, g, pats[i]);
    for (int k = 0; k < x.n; k++) out.ops[out.n++] = x.ops[k];
  }
  return out;
}

/* Megatron's plan of shape s, written as decisions. */
static void megatron(arena *a, const weft_graph *g, shape s, weft_decisions *d) {
  const char *axes[] = {"dp", "pp", "tp"};
  int sizes[] = {s.dp, s.pp, s.tp};
  dec_mesh(a, d, "m", 3, axes, sizes, 0);
  int tp = s.bad ? 3 : s.tp;
  if (tp > 1) {
    static const char *const col[][2] = {{"h.*.attn.c_attn", "n"}, {"h.*.attn.core", "n"}, {"h.*.mlp.c_fc", "n"},
                                         {"h.*.mlp.act", "ffn"}, {"h.*.attn.c_proj", "k"}, {"h.*.mlp.c_proj", "k"}};
    for (int i = 0; i < 6; i++) dec_split(a, d, dec_select(a, g, col[i][0]), col[i][1], tp, "tp");
    const char *rest[] = {"tok", "emb", "h.*.ln_1", "h.*.res_1", "h.*.ln_2", "h.*.res_2", "ln_f", "lm_head", "loss"};
    dec_replicate(a, d, join(a, g, rest, 9), tp, "tp");
  }
  if (s.dp > 1) dec_split(a, d, dec_select(a, g, "all"), "batch", s.dp, "dp");
  if (s.mb > 1) dec_split(a, d, dec_select(a, g, "all"), "batch", s.mb, "mb")->in_time = true;
  if (s.zero) {
    decision *z = dec_add(a, d, DEC_SHARD);
    z->ops = dec_select(a, g, "all");
    z->state = s.zero;
    z->axis = "dp";
  }
  dec_index at[3] = {{s.dp > 1 ? "dp" : NULL, 0}, {NULL, 0}, {tp > 1 ? "tp" : NULL, 0}};
  if (s.pp > 1) {
    const char *s0[] = {"tok", "emb", "h.0"}, *s1[] = {"h.1", "ln_f", "lm_head", "loss"};
    decision *st = dec_add(a, d, DEC_STAGE);
    st->name = "s0";
    st->ops = join(a, g, s0, 3);
    dec_assign(a, d, st->ops, 0, 3, at);
    st = dec_add(a, d, DEC_STAGE);
    st->name = "s1";
    st->ops = join(a, g, s1, 4);
    at[1].value = 1;
    dec_assign(a, d, st->ops, 0, 3, at);
    dec_add(a, d, DEC_SCHEDULE)->sched = SCHED_1F1B;
  } else {
    dec_assign(a, d, dec_select(a, g, "all"), 0, 3, at);
  }
  if (s.recompute) {
    decision *r = dec_add(a, d, DEC_RECOMPUTE);
    r->ops = dec_select(a, g, "h");
    r->mode = 2;
    r->keys = arena_alloc(a, sizeof(char *) * (size_t)r->ops.n);
    for (int k = 0; k < r->ops.n; k++) r->keys[k] = strncmp(g->ops[r->ops.ops[k]].name, "h.0", 3) == 0 ? "h.0" : "h.1";
  }
}

static long rss_kib(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

static void test_thousand_candidates(void **state) {
  (void)state;
  weft_ctx *c = weft_new();
  assert_int_equal(weft_load_text(c, "t.plan", text, strlen(text)), WEFT_OK);
  weft_loc none = {0};
  weft_graph *g = weft_build_graph(c, env_lookup(c->main->env, "g")->val, none);
  assert_non_null(g);
  value cv = weft_build_cluster(c, env_lookup(c->main->env, "a100_dgx")->val, none);
  assert_int_equal(cv.kind, V_RECORD);
  weft_cluster cl = weft_cluster_of(cv.rec);
  assert_int_equal(cl.ndevices, 8);

  /* every shape of dp x pp x tp <= 8 devices, some made invalid */
  shape shapes[512];
  int nshapes = 0;
  for (int dp = 1; dp <= 8; dp *= 2)
    for (int tp = 1; tp <= 8; tp *= 2)
      for (int pp = 1; pp <= 2; pp++)
        for (int mb = 1; mb <= 4; mb *= 2)
          for (int zero = 0; zero <= (dp > 1 ? 2 : 0); zero++)
            for (int rc = 0; rc <= 1; rc++) {
              if (dp * tp * pp > 8) continue;
              shapes[nshapes++] = (shape){dp, tp, pp, mb, zero, rc, false};
              if (tp == 2 && mb == 1 && zero == 0) shapes[nshapes++] = (shape){dp, tp, pp, mb, zero, rc, true};
            }
  assert_true(nshapes > 50 && nshapes <= 500);

  arena cand;
  arena_init(&cand);
  int diags_before = c->diags.n;
  int accepted = 0, rejected = 0, bad = 0;
  long rss_100 = 0;
  size_t arena_100 = 0;
  double best = 0;
  for (int i = 0; i < 1000; i++) {
    shape s = shapes[i % nshapes];
    arena_reset(&cand);
    weft_diags sink = {.arena = &cand, .srcs = &c->srcs, .max_errors = 50};
    weft_decisions d = {0};
    megatron(&cand, g, s, &d);
    weft_plan *p = plan_apply(g, &cl, &d, &(plan_opts){.reps = true}, &cand, &sink);
    weft_program *pr = p ? lower_plan(p, NULL, &cand, &sink) : NULL;
    if (pr && !validate_program(pr, &(validate_opts){.skip_memory = true}, &sink)) pr = NULL;
    hw_model hw;
    bool ok = pr && hw_from_plan(&sink, p, pr, &hw);
    if (ok) {
      weft_sim *sim = sim_run(pr, &hw);
      assert_non_null(sim);
      ok = validate_memory_sim(sim, &sink);
      weft_estimate e;
      sim_estimate(sim, &e);
      assert_true(e.step_time > 0);
      if (ok && (best == 0 || e.step_time < best)) best = e.step_time;
      sim_free(sim);
    }
    bad += s.bad;
    if (ok) {
      accepted++;
      assert_false(s.bad);
      assert_int_equal(sink.errors, 0);
    } else {
      /* a rejected candidate says why, in the sink it was given */
      rejected++;
      assert_true(sink.errors > 0);
      assert_true(s.bad);
    }
    if (i == 499) rss_100 = rss_kib(), arena_100 = cand.total;
  }
  long rss_1000 = rss_kib();
  printf("1000 candidates of %d shapes: %d accepted, %d rejected; best step %.3g ms; peak RSS %ld KiB after 500, %ld "
         "after 1000; the candidates' arena %zu bytes after 500, %zu after 1000\n",
         nshapes, accepted, rejected, best * 1e3, rss_100, rss_1000, arena_100, (size_t)cand.total);
  assert_int_equal(rejected, bad);
  assert_true(accepted > 500);
  /* nothing went to the workspace's diagnostics */
  assert_int_equal(c->diags.n, diags_before);
  /* memory stays flat: what the first 500 (more than two rounds of the
   * shapes) needed serves the other 500 (the candidates' arena does not
   * grow; AddressSanitizer keeps freed memory in quarantine, so resident
   * memory is only measured without it) */
  assert_true(cand.total <= arena_100);
#ifndef __SANITIZE_ADDRESS__
  assert_true(rss_1000 - rss_100 < 8 * 1024);
#endif
  arena_free(&cand);
  weft_free(c);
}

/* A decision list refers to operators the graph has, and is checked as
 * the language is: an unknown dimension is an error in the sink. */
static void test_bad_decisions(void **state) {
  (void)state;
  weft_ctx *c = weft_new();
  assert_int_equal(weft_load_text(c, "t.plan", text, strlen(text)), WEFT_OK);
  weft_loc none = {0};
  weft_graph *g = weft_build_graph(c, env_lookup(c->main->env, "g")->val, none);
  value cv = weft_build_cluster(c, env_lookup(c->main->env, "a100_dgx")->val, none);
  weft_cluster cl = weft_cluster_of(cv.rec);
  arena a;
  arena_init(&a);
  weft_diags sink = {.arena = &a, .srcs = &c->srcs, .max_errors = 50};
  weft_decisions d = {0};
  dec_split(&a, &d, dec_select(&a, g, "h.*.mlp.c_fc"), "nonesuch", 2, "tp");
  assert_null(plan_apply(g, &cl, &d, NULL, &a, &sink));
  assert_int_equal(sink.errors, 1);
  assert_non_null(strstr(sink.items[0].msg, "has no dimension 'nonesuch'"));
  /* an operator that is not placed */
  sink = (weft_diags){.arena = &a, .srcs = &c->srcs, .max_errors = 50};
  d = (weft_decisions){0};
  dec_assign(&a, &d, dec_select(&a, g, "h"), -1, 1, &(dec_index){NULL, 0});
  assert_null(plan_apply(g, &cl, &d, NULL, &a, &sink));
  assert_true(sink.errors >= 1);
  assert_non_null(strstr(sink.items[0].msg, "is not placed"));
  /* the whole model on device 3 */
  sink = (weft_diags){.arena = &a, .srcs = &c->srcs, .max_errors = 50};
  d = (weft_decisions){0};
  dec_assign(&a, &d, dec_select(&a, g, "all"), -1, 1, &(dec_index){NULL, 3});
  weft_plan *p = plan_apply(g, &cl, &d, NULL, &a, &sink);
  assert_non_null(p);
  assert_int_equal(p->used_devices, 1);
  assert_int_equal(p->subs[0].device, 3);
  assert_int_equal(p->decisions.n, 1);
  arena_free(&a);
  weft_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_decisions),
      cmocka_unit_test(test_thousand_candidates),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
