/* control.c - the statements every kind of body shares (let, for, if,
 * assert), interpreted once for models, plans and clusters: the caller runs
 * the statements of its own kind, this file the control around them. */
#include <math.h>

#include "eval.h"
#include "weft/units.h"

bool eval_run_body(weft_ctx *c, const eval_body *b, env *e, const ast_list *body) {
  for (int i = 0; i < body->n; i++)
    if (!b->stmt(c, b->ud, e, body->items[i])) return false;
  return true;
}

/* What a loop found when it began: evaluation steps, memory, operators. */
typedef struct loop_start {
  int64_t steps;
  size_t held;
  int ops;
} loop_start;

/* Whether a loop whose first `done` of n iterations cost what c shows
 * since start would stay within the limits at its end, at the same cost
 * per iteration: the work that a large range asks for (a million layers)
 * is refused at once, with its figures, not after it took the time and
 * memory it is not allowed. */
static bool loop_fits(weft_ctx *c, const ast *s, const loop_start *start, int64_t done, int64_t n) {
  double left = (double)(n - done), per;
  per = (double)(c->steps - start->steps) / (double)done;
  double steps = (double)c->steps + per * left;
  if (steps > EVAL_MAX_STEPS) {
    weft_diag *g = eval_error(c, s->loc, "this loop would take about %.3g evaluation steps (%lld iterations of about %.0f), "
                              "more than weft allows (%d)", steps, (long long)n, per, EVAL_MAX_STEPS);
    diag_hint(g, &c->diags, "a smaller range, or fewer steps in each iteration");
    return false;
  }
  if (c->model) {
    per = (double)(c->model->g->nops - start->ops) / (double)done;
    double ops = (double)c->model->g->nops + per * left;
    if (ops > MODEL_MAX_OPS) {
      weft_diag *g = eval_error(c, s->loc, "this loop would make about %.3g operators (%lld iterations of about %.0f), more "
                                "than a model may have (%d)", ops, (long long)n, per, MODEL_MAX_OPS);
      diag_hint(g, &c->diags, "GPT-3 has about a thousand operators; is the range what was meant?");
      return false;
    }
  }
  size_t budget = arena_budget(), held = arena_held();
  per = held > start->held ? (double)(held - start->held) / (double)done : 0;
  double mem = (double)held + per * left;
  if (budget && mem > (double)budget) {
    char b1[32], b2[32], b3[32];
    weft_diag *g = eval_error(c, s->loc, "this loop would need about %s of memory (%lld iterations of about %s), more than "
                              "the budget of %s", unit_bytes_human((int64_t)fmin(mem, 9e18), b1, sizeof b1), (long long)n,
                              unit_bytes_human((int64_t)per, b2, sizeof b2), unit_bytes_human((int64_t)budget, b3, sizeof b3));
    diag_hint(g, &c->diags, "a smaller range, or a larger budget (--max-memory)");
    return false;
  }
  return true;
}

bool eval_control(weft_ctx *c, const eval_body *b, env *e, const ast *s, bool *handled) {
  *handled = true;
  switch (s->kind) {
  case S_LET: {
    value v = eval_expr(c, e, s->a);
    if (v.kind == V_ERROR) return false;
    env_define(&c->arena, e, s->name, v, s->loc, false);
    return true;
  }
  case S_ASSERT:
    return eval_assert(c, e, s);
  case S_FOR: {
    value it = eval_expr(c, e, s->a);
    if (it.kind == V_ERROR) return false;
    if (it.kind != V_RANGE && it.kind != V_LIST) {
      eval_error(c, s->a->loc, "`for` needs a range or a list, got %s %s", value_kind_name(it.kind),
                 value_repr(&c->arena, it));
      return false;
    }
    /* a scope per iteration: what a plan decides in one (a device
     * expression of `assign`) keeps the scope and reads it later */
    int64_t n = it.kind == V_RANGE ? (it.r.hi > it.r.lo ? it.r.hi - it.r.lo : 0) : it.list->n;
    loop_start start = {c->steps, arena_held(), c->model ? c->model->g->nops : 0};
    for (int64_t i = 0; i < n; i++) {
      if (!eval_step(c, s->loc)) return false;
      env *le = env_new(&c->arena, e);
      env_define(&c->arena, le, s->name, it.kind == V_RANGE ? v_int(it.r.lo + i) : it.list->items[i], s->loc, false);
      if (!eval_run_body(c, b, le, &s->list)) return false;
      /* after 16, 32, 64... iterations: would the whole loop fit? */
      int64_t done = i + 1;
      if (done >= EVAL_LOOP_PROBE && (done & (done - 1)) == 0 && done < n && !loop_fits(c, s, &start, done, n)) return false;
    }
    return true;
  }
  case S_IF: {
    bool cnd;
    if (!eval_condition(c, e, s->a, &cnd)) return false;
    if (cnd) return eval_run_body(c, b, env_new(&c->arena, e), &s->list);
    if (s->b) return b->stmt(c, b->ud, e, s->b);  /* else if */
    return eval_run_body(c, b, env_new(&c->arena, e), &s->list2);
  }
  default:
    *handled = false;
    return true;
  }
}
