/* test_search.c - the search: its frontier is non-dominated and fits, each
 * plan it writes builds through the language to the figures it reported,
 * and on a space small enough to enumerate its best is at least as fast as
 * the best of every Megatron-LM configuration (the standard library's
 * `megatron` strategy over every tp, pp, dp, micro-batch size, interleaving,
 * recomputation, ZeRO stage and sequence parallelism). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "weft/report.h"
#include "weft/search.h"
#include "weft/sim.h"
#include "weft/validate.h"
#include "weft/workspace.h"

static const char *const f32_sizes = "layers = 4, hidden = 128, heads = 4, seq = 64, vocab = 512, batch = 16";
static const char *sizes = f32_sizes;  /* the model the tests search */
static const char *model = "gpt";      /* its builder in the standard library */
static int batch = 16;                 /* its batch, for the enumeration */

typedef struct searched {
  weft_ctx *c;
  weft_graph *g;
  weft_cluster cl;
  search_result r;
} searched;

static const search_hooks *hooks;  /* the heuristics run_search passes, NULL none */
static int objective = SEARCH_TIME;  /* run_search's */

static void run_search(searched *s, const char *cluster, double max_memory) {
  s->c = weft_new();
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  fprintf(f, "use std\nmodel g = %s(%s)\nlet c = %s\n", model, sizes, cluster);
  fclose(f);
  assert_int_equal(weft_load_text(s->c, "t.plan", text, n), WEFT_OK);
  free(text);
  weft_loc none = {0};
  s->g = weft_build_graph(s->c, env_lookup(s->c->main->env, "g")->val, none);
  assert_non_null(s->g);
  value cv = weft_build_cluster(s->c, env_lookup(s->c->main->env, "c")->val, none);
  assert_int_equal(cv.kind, V_RECORD);
  s->cl = weft_cluster_of(cv.rec);
  search_opts o = {.max_memory = max_memory, .buckets = true, .hooks = hooks, .objective = objective};
  bool ok = search_run(s->g, &s->cl, &o, &s->c->arena, &s->c->diags, &s->r);
  if (!ok) diag_print(&s->c->diags, stderr, false);
  assert_true(ok);
  assert_true(s->r.nplans > 0);
}

/* The most bytes of parameters, gradients, master weights and optimizer
 * state any device keeps (its persistent buffers). */
static int64_t weights_kept(const weft_program *pr) {
  int64_t most = 0;
  for (int d = 0; d < pr->nprogs; d++)
    if (lower_prog(pr, d)->persistent > most) most = lower_prog(pr, d)->persistent;
  return most;
}

static int64_t last_weights;  /* estimate_text's program: weights_kept */

/* Estimates a plan written as text: the step time and peak. */
static void estimate_text(const char *text, double *time, int64_t *peak) {
  weft_ctx *c = weft_new();
  if (weft_load_text(c, "searched.plan", text, strlen(text)) != WEFT_OK) {
    diag_print(&c->diags, stderr, false);
    fail_msg("the searched plan does not load:\n%s", text);
  }
  weft_item items[8];
  int n = weft_items(c, V_PLAN, items, 8);
  assert_int_equal(n, 1);
  weft_plan *p = weft_build_plan(c, items[0].val, items[0].loc, &(plan_opts){.reps = true});
  weft_program *pr = p ? lower_plan(p, NULL, &c->arena, &c->diags) : NULL;
  if (pr && !validate_program(pr, NULL, &c->diags)) pr = NULL;
  if (!pr) {
    diag_print(&c->diags, stderr, false);
    fail_msg("the searched plan is rejected:\n%s", text);
  }
  hw_model hw;
  assert_true(hw_from_plan(&c->diags, p, pr, &hw));
  weft_sim *s = sim_run(pr, &hw);
  weft_estimate e;
  sim_estimate(s, &e);
  *time = e.step_time;
  *peak = e.peak_max;
  last_weights = weights_kept(pr);
  sim_free(s);
  weft_free(c);
}

static char *plan_text(const search_plan *p, const weft_graph *g, const char *cluster) {
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  fprintf(f, "use std\nplan searched for %s(%s) on %s {\n", model, sizes, cluster);
  search_print_body(p, g, f);
  fputs("}\n", f);
  fclose(f);
  return text;
}

/* Every plan of context or expert parallelism the search simulated, as
 * weft source, estimates at the figures the search reported; their count. */
static int cp_plans_build(const searched *s, const char *cluster) {
  int n = 0;
  for (int i = 0; i < s->r.nsimulated; i++) {
    const search_plan *p = &s->r.simulated[i];
    if (p->cp < 2 && p->ep < 2) continue;
    char *text = plan_text(p, s->g, cluster);
    double t;
    int64_t peak;
    estimate_text(text, &t, &peak);
    assert_true(t <= p->step_time * 1.01 && t >= p->step_time * 0.99);
    assert_int_equal(peak, p->peak_memory);
    free(text);
    n++;
  }
  return n;
}

static void frontier_on(const char *cluster, double max_memory, int *cp_plans) {
  searched s;
  run_search(&s, cluster, max_memory);
  const search_result *r = &s.r;
  printf("%lld candidates, %d simulated, frontier of %d\n", (long long)r->searched, r->nsimulated, r->nplans);
  for (int i = 0; i < r->nplans; i++) {
    const search_plan *p = &r->plans[i];
    assert_true(p->simulated && p->fits);
    if (i > 0) {
      /* non-dominated: slower only with less memory */
      assert_true(p->step_time > r->plans[i - 1].step_time);
      assert_true(p->peak_memory < r->plans[i - 1].peak_memory);
    }
    /* nothing simulated beats it in both */
    for (int k = 0; k < r->nsimulated; k++) {
      const search_plan *q = &r->simulated[k];
      assert_false(q->fits && q->step_time < p->step_time && q->peak_memory < p->peak_memory);
    }
    /* the plan as weft source gives the figures the search reported */
    char *text = plan_text(p, s.g, cluster);
    double t;
    int64_t peak;
    estimate_text(text, &t, &peak);
    assert_true(t <= p->step_time * 1.01 && t >= p->step_time * 0.99);
    assert_int_equal(peak, p->peak_memory);
    /* what the search counted for parameters, gradients, master weights and
     * optimizer state is what lowering keeps; under ZeRO the search cuts a
     * parameter over the devices its gradient is summed over (dp x ep; dp
     * for experts'; dp x ep x tp for one whole on every device of a tp
     * group split along a dimension of its result, as a sequence-parallel
     * layer's or an embedding tied to a head split along the sequence), and
     * lowering may cut finer (the embedding tied to the LM head of the last
     * stage, over 2 dp), never coarser */
    printf("  %s: parameters, gradients, master weights and state %lld bytes counted, %lld lowered\n",
           search_describe(&s.c->arena, p), (long long)p->analytic_weights, (long long)last_weights);
    if (p->zero == 0) assert_int_equal(p->analytic_weights, last_weights);
    else assert_true(last_weights <= p->analytic_weights && p->analytic_weights <= last_weights * 1.1);
    free(text);
  }
  assert_true(r->best >= 0 && r->best < r->nplans);
  int n = cp_plans_build(&s, cluster);
  if (cp_plans) *cp_plans = n;
  weft_free(s.c);
}

static void frontier(void) { frontier_on("a100_dgx(nodes = 1)", 0, NULL); }

static void test_frontier(void **state) {
  (void)state;
  frontier();
}

/* Mixed precision: bf16 parameters, f32 gradients and master weights */
static void test_frontier_bf16(void **state) {
  (void)state;
  sizes = "layers = 4, hidden = 128, heads = 4, seq = 64, vocab = 512, batch = 16, dtype = bf16";
  frontier();
}

static int f32_again(void **state) {
  (void)state;
  sizes = f32_sizes;
  return 0;
}

/* Context parallelism: a Llama whose sequence (32768) needs splitting
 * beyond a node to fit 1 GiB a device; every plan of the frontier, and
 * every plan with cp the search simulated, builds through the language to
 * the figures it reported, and the best splits the sequence. */
static void test_frontier_cp(void **state) {
  (void)state;
  model = "llama";
  sizes = "layers = 2, hidden = 512, heads = 8, kv_heads = 2, ffn = 1376, seq = 32768, vocab = 32000, batch = 2";
  int n = 0;
  frontier_on("a100_dgx(nodes = 2)", 1 << 30, &n);
  printf("%d plans with context parallelism simulated, each estimated again\n", n);
  assert_true(n > 0);
  searched s;
  run_search(&s, "a100_dgx(nodes = 2)", 1 << 30);
  assert_true(s.r.plans[s.r.best].cp > 1);
  weft_free(s.c);
}

/* Expert parallelism: a small mixture of experts on a DGX node; every plan
 * of the frontier, and every plan with ep the search simulated, builds
 * through the language to the figures it reported (the experts' weights
 * counted as lowering keeps them, a share of them per member of the ep
 * group). */
static void test_frontier_ep(void **state) {
  (void)state;
  model = "moe_gpt";
  sizes = "layers = 2, hidden = 256, heads = 4, seq = 128, vocab = 512, batch = 32, experts = 8, top_k = 2, "
          "capacity_factor = 1.0, ffn = 1024";
  int n = 0;
  frontier_on("h100_dgx(nodes = 1)", 0, &n);
  printf("%d plans with context or expert parallelism simulated, each estimated again\n", n);
  assert_true(n > 0);
}

static int gpt_again(void **state) {
  model = "gpt";
  batch = 16;
  return f32_again(state);
}

static void test_max_memory(void **state) {
  (void)state;
  searched s;
  run_search(&s, "a100_dgx(nodes = 1)", 0);
  /* a cap between the frontier's ends keeps what fits under it */
  int64_t lo = s.r.plans[s.r.nplans - 1].peak_memory, hi = s.r.plans[0].peak_memory;
  weft_free(s.c);
  assert_true(lo < hi);
  double cap = (double)(lo + hi) / 2;
  run_search(&s, "a100_dgx(nodes = 1)", cap);
  for (int i = 0; i < s.r.nplans; i++) assert_true((double)s.r.plans[i].peak_memory <= cap);
  weft_free(s.c);
}

/* Every Megatron-LM configuration of the model on the cluster, through the
 * standard library's strategy; the fastest one's step time. */
static double best_megatron(const char *cluster, int devices, char *best, size_t bestlen) {
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  fprintf(f, "use std\nmodel g = %s(%s)\n", model, sizes);
  int np = 0;
  static const char *const rcs[] = {"none", "selective", "full"};
  bool llama = strcmp(model, "llama") == 0;  /* context parallelism too */
  for (int tp = 1; tp <= devices; tp *= 2)
    for (int cp = 1; cp * tp <= devices && (cp == 1 || llama); cp *= 2)
    for (int pp = 1; pp * tp * cp <= devices; pp *= 2) {
      if (devices % (tp * pp * cp) || 4 % pp) continue;
      int dp = devices / (tp * pp * cp);
      for (int mbs = 1; mbs <= 16; mbs *= 2) {
        if (batch % (dp * mbs)) continue;
        int m = batch / (dp * mbs);
        for (int v = 1; v <= 2; v++) {
          if (v > 1 && (pp == 1 || 4 % (pp * v))) continue;
          for (int rc = 0; rc < 3; rc++)
            for (int z = 0; z <= 3; z++) {
              if ((z > 0 && dp == 1) || (z == 3 && pp > 1)) continue;
              for (int sp = 0; sp <= (tp > 1); sp++)
                fprintf(f, "plan p%d for g on %s {\n  megatron(layers = 4, tp = %d, pp = %d, dp = %d, micro_batches = %d, "
                           "recompute = \"%s\", sequence_parallel = %s, zero = %d, interleave = %d, cp = %d)\n}\n",
                        np++, cluster, tp, pp, dp, m, rcs[rc], sp ? "true" : "false", z, v, cp);
            }
        }
      }
    }
  fclose(f);
  weft_ctx *c = weft_new();
  assert_int_equal(weft_load_text(c, "enumerate.plan", text, n), WEFT_OK);
  free(text);
  weft_item *items = calloc((size_t)np, sizeof *items);
  assert_int_equal(weft_items(c, V_PLAN, items, np), np);
  double best_t = 0;
  int built = 0;
  for (int i = 0; i < np; i++) {
    weft_plan *p = weft_build_plan(c, items[i].val, items[i].loc, &(plan_opts){.reps = true});
    weft_program *pr = p ? lower_plan(p, NULL, &c->arena, &c->diags) : NULL;
    if (pr && !validate_program(pr, NULL, &c->diags)) pr = NULL;
    if (!pr) continue;  /* a configuration the model's sizes forbid */
    hw_model hw;
    assert_true(hw_from_plan(&c->diags, p, pr, &hw));
    weft_sim *s = sim_run(pr, &hw);
    weft_estimate e;
    sim_estimate(s, &e);
    sim_free(s);
    built++;
    if (e.fits && (best_t == 0 || e.step_time < best_t)) {
      best_t = e.step_time;
      snprintf(best, bestlen, "%s", items[i].name);
    }
  }
  printf("%d Megatron-LM configurations enumerated, %d built; the fastest %s: %.6g s\n", np, built, best, best_t);
  free(items);
  weft_free(c);
  return best_t;
}

static void test_against_enumeration(void **state) {
  (void)state;
  static const char *const clusters[] = {"a100_dgx(nodes = 1)", "cpus(4)"};
  static const int devices[] = {8, 4};
  for (int k = 0; k < 2; k++) {
    char name[64] = "";
    double enumerated = best_megatron(clusters[k], devices[k], name, sizeof name);
    searched s;
    run_search(&s, clusters[k], 0);
    const search_plan *b = &s.r.plans[s.r.best];
    printf("%s: searched %.6g s, enumerated %.6g s (%s)\n", clusters[k], b->step_time, enumerated, name);
    assert_true(enumerated > 0);
    assert_true(b->step_time <= enumerated * 1.0001);
    weft_free(s.c);
  }
}

/* The same with context parallelism: a Llama of batch 1 (no data
 * parallelism) on a DGX node and on four CPU devices, every Megatron-LM
 * configuration with cp too. (On cpus(4) Megatron-LM's tp 2, cp 2 with
 * sequence parallelism and a layout that splits the projections along the
 * sequence come within 0.1% of each other in the analytic cost: the
 * search simulates both.) */
static void test_against_enumeration_cp(void **state) {
  (void)state;
  model = "llama";
  sizes = "layers = 4, hidden = 128, heads = 4, kv_heads = 4, ffn = 344, seq = 1024, vocab = 512, batch = 1";
  batch = 1;
  static const char *const clusters[] = {"a100_dgx(nodes = 1)", "h100_dgx(nodes = 1)", "cpus(4)"};
  static const int devices[] = {8, 8, 4};
  for (int k = 0; k < 3; k++) {
    char name[64] = "";
    double enumerated = best_megatron(clusters[k], devices[k], name, sizeof name);
    searched s;
    run_search(&s, clusters[k], 0);
    const search_plan *b = &s.r.plans[s.r.best];
    printf("%s: searched %.6g s (%s), enumerated %.6g s (%s)\n", clusters[k], b->step_time,
           search_describe(&s.c->arena, b), enumerated, name);
    assert_true(enumerated > 0);
    assert_true(b->step_time <= enumerated * 1.0001);
    weft_free(s.c);
  }
}

/* Per-stage recomputation: a space of four-stage 1F1B pipelines without
 * ZeRO (stages on one mesh shape), under a memory cap where the first
 * stage, which keeps four micro-batches in flight, needs recomputation and
 * the others do not. The searched plan recomputes in some stages and not
 * in others, weft estimate of its text gives its figures, and it is faster
 * than every plan that recomputes alike in all stages and fits: the
 * search's best with each recomputation alone, and every Megatron-LM
 * configuration of four stages (tp, micro-batches, recomputation, sequence
 * parallelism) enumerated. */
static int pipeline_rc = -1;  /* the one recomputation the space allows, -1 all */
static bool pipeline_frontier = true;  /* the inter-stage pass gives each pipeline's frontier */

static bool pipeline_space(void *ctx, search_space *sp, arena *a) {
  (void)ctx, (void)a;
  sp->pp.v[0] = 4;
  sp->pp.n = 1;
  for (int z = 1; z < 4; z++) sp->zero[z] = false;
  sp->schedule[SCHED_GPIPE] = sp->schedule[SCHED_INTERLEAVED] = false;
  sp->nonuniform = false;
  for (int r = 0; r < 3; r++) sp->recompute[r] = pipeline_rc < 0 || r == pipeline_rc;
  sp->frontier = pipeline_frontier;
  return true;
}

static void test_recompute_per_stage(void **state) {
  (void)state;
  sizes = "layers = 8, hidden = 512, heads = 8, seq = 1024, vocab = 512, batch = 32";
  const char *cluster = "a100_dgx(nodes = 1)";
  double cap = 350.0 * (1 << 20);
  static const search_hooks pipeline = {.space = pipeline_space};
  hooks = &pipeline;
  /* each recomputation alike in every stage */
  double uniform = 0;
  static const char *const names[] = {"none", "selective", "full"};
  for (int rc = 0; rc < 3; rc++) {
    pipeline_rc = rc;
    searched u;
    u.c = weft_new();
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    fprintf(f, "use std\nmodel g = %s(%s)\nlet c = %s\n", model, sizes, cluster);
    fclose(f);
    assert_int_equal(weft_load_text(u.c, "t.plan", text, n), WEFT_OK);
    free(text);
    weft_loc none = {0};
    u.g = weft_build_graph(u.c, env_lookup(u.c->main->env, "g")->val, none);
    u.cl = weft_cluster_of(weft_build_cluster(u.c, env_lookup(u.c->main->env, "c")->val, none).rec);
    search_opts o = {.max_memory = cap, .buckets = true, .hooks = hooks};
    bool ok = search_run(u.g, &u.cl, &o, &u.c->arena, &u.c->diags, &u.r);
    if (ok && u.r.best >= 0) {
      const search_plan *b = &u.r.plans[u.r.best];
      for (int k = 0; k < b->nstages; k++) assert_int_equal(b->stages[k].recompute, rc);
      printf("recompute %s in every stage: %.6g s, %lld bytes\n", names[rc], b->step_time, (long long)b->peak_memory);
      if (uniform == 0 || b->step_time < uniform) uniform = b->step_time;
    } else printf("recompute %s in every stage: none fits\n", names[rc]);
    weft_free(u.c);
  }
  /* Megatron-LM's four-stage configurations */
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  fprintf(f, "use std\nmodel g = %s(%s)\n", model, sizes);
  int np = 0;
  for (int tp = 1; tp <= 2; tp *= 2)
    for (int m = 1; m <= 32; m *= 2)
      for (int rc = 0; rc < 3; rc++)
        for (int sp = 0; sp <= (tp > 1); sp++) {
          int dp = 8 / (4 * tp);
          if (32 % (dp * m)) continue;
          fprintf(f, "plan p%d for g on %s {\n  megatron(layers = 8, tp = %d, pp = 4, dp = %d, micro_batches = %d, "
                     "recompute = \"%s\", sequence_parallel = %s)\n}\n",
                  np++, cluster, tp, dp, m, names[rc], sp ? "true" : "false");
        }
  fclose(f);
  weft_ctx *c = weft_new();
  assert_int_equal(weft_load_text(c, "enumerate.plan", text, n), WEFT_OK);
  free(text);
  weft_item *items = calloc((size_t)np, sizeof *items);
  assert_int_equal(weft_items(c, V_PLAN, items, np), np);
  int built = 0;
  for (int i = 0; i < np; i++) {
    weft_plan *p = weft_build_plan(c, items[i].val, items[i].loc, &(plan_opts){.reps = true});
    weft_program *pr = p ? lower_plan(p, NULL, &c->arena, &c->diags) : NULL;
    if (pr && !validate_program(pr, NULL, &c->diags)) pr = NULL;
    if (!pr) continue;
    hw_model hw;
    assert_true(hw_from_plan(&c->diags, p, pr, &hw));
    weft_sim *sm = sim_run(pr, &hw);
    weft_estimate e;
    sim_estimate(sm, &e);
    sim_free(sm);
    built++;
    if ((double)e.peak_max <= cap && (uniform == 0 || e.step_time < uniform)) uniform = e.step_time;
  }
  printf("%d Megatron-LM configurations of four stages, %d built\n", np, built);
  free(items);
  weft_free(c);
  assert_true(uniform > 0);
  /* the stages each their own */
  pipeline_rc = -1;
  searched s;
  run_search(&s, cluster, cap);
  const search_plan *b = &s.r.plans[s.r.best];
  bool mixed = false;
  for (int k = 1; k < b->nstages; k++) mixed |= b->stages[k].recompute != b->stages[0].recompute;
  printf("searched: %s: %.6g s, %lld bytes; the best recomputing alike: %.6g s\n", search_describe(&s.c->arena, b),
         b->step_time, (long long)b->peak_memory, uniform);
  assert_true(mixed);
  assert_true(b->fits && (double)b->peak_memory <= cap);
  assert_true(b->step_time < uniform);
  char *plan = plan_text(b, s.g, cluster);
  double t;
  int64_t peak;
  estimate_text(plan, &t, &peak);
  assert_true(t <= b->step_time * 1.01 && t >= b->step_time * 0.99);
  assert_int_equal(peak, b->peak_memory);
  free(plan);
  weft_free(s.c);
}

/* The frontier of each pipeline (FT's Pareto sets in the inter-stage
 * pass): in the space of four-stage pipelines above, the fastest plan under
 * a memory cap with each pipeline's frontier is at least as fast as with
 * its fastest point only, and under some caps faster (a point that
 * recomputes in fewer stages, or deals the blocks otherwise, and that the
 * fastest-only pass, whose fastest point needs more than the cap, never
 * offers); every plan of the frontier the search reports is non-dominated;
 * and --objective memory gives a plan at least as small as without (on
 * GPT-2 small's shape, smaller). */
static bool frontier_space(void *ctx, search_space *sp, arena *a) {
  (void)ctx, (void)a;
  sp->frontier = pipeline_frontier;
  return true;
}

static void frontier_point(const char *cluster, double cap, bool on, double *time, int64_t *peak) {
  pipeline_frontier = on;
  searched s;
  run_search(&s, cluster, cap);
  const search_result *r = &s.r;
  for (int i = 0; i < r->nplans; i++)
    for (int k = 0; k < r->nsimulated; k++) {
      const search_plan *p = &r->plans[i], *q = &r->simulated[k];
      assert_false(q->fits && q->step_time < p->step_time && q->peak_memory < p->peak_memory);
      assert_false(q->fits && q->step_time <= p->step_time && q->peak_memory < p->peak_memory);
    }
  const search_plan *b = &r->plans[r->best];
  assert_true(b->fits && (cap == 0 || (double)b->peak_memory <= cap));
  *time = b->step_time;
  *peak = b->peak_memory;
  printf("%s, cap %.0f MiB, %s: %s: %.6g s, %lld bytes; %d plans in the frontier\n",
         objective == SEARCH_MEMORY ? "least memory" : "fastest", cap / (1 << 20), on ? "each pipeline's frontier" : "its fastest only",
         search_describe(&s.c->arena, b), b->step_time, (long long)b->peak_memory, r->nplans);
  weft_free(s.c);
}

static void test_stage_frontier(void **state) {
  (void)state;
  sizes = "layers = 8, hidden = 512, heads = 8, seq = 1024, vocab = 512, batch = 32";
  const char *cluster = "a100_dgx(nodes = 1)";
  static const search_hooks pipeline = {.space = pipeline_space};
  hooks = &pipeline;
  static const double caps[] = {400, 300, 250};
  int faster = 0;
  for (int i = 0; i < 3; i++) {
    double t_on, t_off;
    int64_t m_on, m_off;
    frontier_point(cluster, caps[i] * (1 << 20), true, &t_on, &m_on);
    frontier_point(cluster, caps[i] * (1 << 20), false, &t_off, &m_off);
    assert_true(t_on <= t_off * 1.0001);
    faster += t_on < t_off * 0.99;
  }
  assert_true(faster > 0);
  /* the least memory, in the whole space, of GPT-2 small's shape on a DGX
   * node (the frontier's ends that pipelines reach) */
  static const search_hooks only_frontier = {.space = frontier_space};
  hooks = &only_frontier;
  sizes = "layers = 12, hidden = 768, heads = 12, seq = 1024, vocab = 50257, batch = 8";
  objective = SEARCH_MEMORY;
  double t_on, t_off;
  int64_t m_on, m_off;
  frontier_point(cluster, 0, true, &t_on, &m_on);
  frontier_point(cluster, 0, false, &t_off, &m_off);
  assert_true(m_on <= m_off);
}

static int no_hooks(void **state) {
  hooks = NULL;
  pipeline_rc = -1;
  pipeline_frontier = true;
  objective = SEARCH_TIME;
  return f32_again(state);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_frontier),
      cmocka_unit_test_teardown(test_frontier_bf16, f32_again),
      cmocka_unit_test_teardown(test_frontier_cp, gpt_again),
      cmocka_unit_test_teardown(test_frontier_ep, gpt_again),
      cmocka_unit_test(test_max_memory),
      cmocka_unit_test(test_against_enumeration),
      cmocka_unit_test_teardown(test_against_enumeration_cp, gpt_again),
      cmocka_unit_test_teardown(test_recompute_per_stage, no_hooks),
      cmocka_unit_test_teardown(test_stage_frontier, no_hooks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
