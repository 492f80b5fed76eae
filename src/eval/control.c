/* control.c - the statements every kind of body shares (let, for, if,
 * assert), interpreted once for models, plans and clusters: the caller runs
 * the statements of its own kind, this file the control around them. */
#include "eval.h"

bool eval_run_body(weft_ctx *c, const eval_body *b, env *e, const ast_list *body) {
  for (int i = 0; i < body->n; i++)
    if (!b->stmt(c, b->ud, e, body->items[i])) return false;
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
    for (int64_t i = 0; i < n; i++) {
      if (!eval_step(c, s->loc)) return false;
      env *le = env_new(&c->arena, e);
      env_define(&c->arena, le, s->name, it.kind == V_RANGE ? v_int(it.r.lo + i) : it.list->items[i], s->loc, false);
      if (!eval_run_body(c, b, le, &s->list)) return false;
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
