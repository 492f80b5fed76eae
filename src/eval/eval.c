/* eval.c - the evaluator: modules, top-level items, expressions, functions
 * and built-ins. Models are evaluated to graphs by model.c. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "weft/decisions.h"
#include "eval.h"


/* ---- errors --------------------------------------------------------------- */

weft_diag *eval_error(weft_ctx *c, weft_loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  weft_diag *g = diag_vadd(&c->diags, DIAG_ERROR, loc, fmt, ap);
  va_end(ap);
  return g;
}

bool eval_step(weft_ctx *c, weft_loc loc) { return eval_steps(c, loc, 1); }

bool eval_steps(weft_ctx *c, weft_loc loc, int64_t n) {
  int64_t before = c->steps;
  c->steps += n;
  if (c->steps <= EVAL_MAX_STEPS) return true;
  if (before <= EVAL_MAX_STEPS) {
    weft_diag *g = eval_error(c, loc, "evaluation takes more than %d steps", EVAL_MAX_STEPS);
    diag_hint(g, &c->diags, "a loop or a recursion is too long, or does not end");
  }
  return false;
}

/* ---- names ----------------------------------------------------------------- */

bool eval_is_ident(const char *s, size_t n) {
  if (n == 0 || n > 256) return false;
  if (!(s[0] == '_' || (s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z'))) return false;
  for (size_t i = 1; i < n; i++)
    if (!(s[i] == '_' || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
          (s[i] >= '0' && s[i] <= '9')))
      return false;
  return true;
}

/* ---- built-ins ------------------------------------------------------------ */

typedef value (*builtin_fn)(weft_ctx *c, int n, value *args, weft_loc loc);

static bool is_num(value v) { return v.kind == V_INT || v.kind == V_FLOAT; }
static double num(value v) { return v.kind == V_INT ? (double)v.i : v.f; }

static value finite_num(weft_ctx *c, double f, weft_loc loc) {
  if (!isfinite(f)) {
    eval_error(c, loc, "the result is not a finite number");
    return v_error();
  }
  return v_float(f);
}

static value quantity(weft_ctx *c, double v, unit_dim d, weft_loc loc) {
  if (!isfinite(v)) {
    eval_error(c, loc, "the result is not a finite number");
    return v_error();
  }
  if (unit_is_none(d)) return v_float(v);
  value r = {.kind = V_QUANTITY};
  r.q.v = v;
  r.q.d = d;
  return r;
}

static value arg_type_error(weft_ctx *c, weft_loc loc, const char *fn, const char *want, value got) {
  eval_error(c, loc, "%s() needs %s, got %s %s", fn, want, value_kind_name(got.kind), value_repr(&c->arena, got));
  return v_error();
}

/* min/max over numbers or quantities of one dimension, or over one list. */
static value bi_minmax(weft_ctx *c, int n, value *a, weft_loc loc, bool want_max) {
  const char *fn = want_max ? "max" : "min";
  if (n == 1 && a[0].kind == V_LIST) {
    if (a[0].list->n == 0) { eval_error(c, loc, "%s() of an empty list", fn); return v_error(); }
    return bi_minmax(c, a[0].list->n, a[0].list->items, loc, want_max);
  }
  if (n == 1 && a[0].kind == V_RANGE) {
    if (a[0].r.hi <= a[0].r.lo) { eval_error(c, loc, "%s() of an empty range", fn); return v_error(); }
    return v_int(want_max ? a[0].r.hi - 1 : a[0].r.lo);
  }
  value best = a[0];
  for (int i = 0; i < n; i++) {
    bool q = a[i].kind == V_QUANTITY;
    if (!is_num(a[i]) && !q) return arg_type_error(c, loc, fn, "numbers or quantities", a[i]);
    if (q != (best.kind == V_QUANTITY) || (q && !unit_eq(a[i].q.d, best.q.d))) {
      eval_error(c, loc, "%s() of values with different units", fn);
      return v_error();
    }
    double x = q ? a[i].q.v : num(a[i]), y = q ? best.q.v : num(best);
    if (want_max ? x > y : x < y) best = a[i];
  }
  return best;
}
static value bi_min(weft_ctx *c, int n, value *a, weft_loc l) { return bi_minmax(c, n, a, l, false); }
static value bi_max(weft_ctx *c, int n, value *a, weft_loc l) { return bi_minmax(c, n, a, l, true); }

static value bi_abs(weft_ctx *c, int n, value *a, weft_loc loc) {
  if (a[0].kind == V_INT) {
    if (a[0].i == INT64_MIN) { eval_error(c, loc, "integer overflow in abs()"); return v_error(); }
    return v_int(a[0].i < 0 ? -a[0].i : a[0].i);
  }
  if (a[0].kind == V_FLOAT) return v_float(fabs(a[0].f));
  if (a[0].kind == V_QUANTITY) { value r = a[0]; r.q.v = fabs(r.q.v); return r; }
  return arg_type_error(c, loc, "abs", "a number", a[0]);
}

static value bi_len(weft_ctx *c, int n, value *a, weft_loc loc) {
  switch (a[0].kind) {
  case V_LIST: return v_int(a[0].list->n);
  case V_RECORD: return v_int(a[0].rec->n);
  case V_STRING: return v_int((int64_t)strlen(a[0].s));
  case V_RANGE: return v_int(a[0].r.hi > a[0].r.lo ? a[0].r.hi - a[0].r.lo : 0);
  default: return arg_type_error(c, loc, "len", "a list, record, string or range", a[0]);
  }
}

static value bi_str(weft_ctx *c, int n, value *a, weft_loc loc) {
  return v_string(value_show(&c->arena, a[0]));
}

static value bi_int(weft_ctx *c, int n, value *a, weft_loc loc) {
  if (a[0].kind == V_INT) return a[0];
  if (a[0].kind == V_BOOL) return v_int(a[0].i);
  if (a[0].kind == V_FLOAT) {
    double t = trunc(a[0].f);
    if (!(t >= -9.2e18 && t <= 9.2e18)) { eval_error(c, loc, "int() of %g is out of range", a[0].f); return v_error(); }
    return v_int((int64_t)t);
  }
  if (a[0].kind == V_STRING) {
    char *end;
    errno = 0;
    long long v = strtoll(a[0].s, &end, 10);
    if (errno || end == a[0].s || *end) { eval_error(c, loc, "int() cannot read \"%s\"", a[0].s); return v_error(); }
    return v_int(v);
  }
  return arg_type_error(c, loc, "int", "a number", a[0]);
}

static value bi_float(weft_ctx *c, int n, value *a, weft_loc loc) {
  if (is_num(a[0])) return v_float(num(a[0]));
  return arg_type_error(c, loc, "float", "a number", a[0]);
}

static value round_fn(weft_ctx *c, value v, weft_loc loc, const char *fn, double (*f)(double)) {
  if (v.kind == V_INT) return v;
  if (v.kind != V_FLOAT) return arg_type_error(c, loc, fn, "a number", v);
  double r = f(v.f);
  if (!(r >= -9.2e18 && r <= 9.2e18)) { eval_error(c, loc, "%s() of %g is out of range", fn, v.f); return v_error(); }
  return v_int((int64_t)r);
}
static value bi_ceil(weft_ctx *c, int n, value *a, weft_loc l) { return round_fn(c, a[0], l, "ceil", ceil); }
static value bi_floor(weft_ctx *c, int n, value *a, weft_loc l) { return round_fn(c, a[0], l, "floor", floor); }

static value bi_sqrt(weft_ctx *c, int n, value *a, weft_loc loc) {
  if (!is_num(a[0])) return arg_type_error(c, loc, "sqrt", "a number", a[0]);
  if (num(a[0]) < 0) { eval_error(c, loc, "sqrt() of a negative number"); return v_error(); }
  return v_float(sqrt(num(a[0])));
}

static value bi_log2(weft_ctx *c, int n, value *a, weft_loc loc) {
  if (!is_num(a[0])) return arg_type_error(c, loc, "log2", "a number", a[0]);
  if (num(a[0]) <= 0) { eval_error(c, loc, "log2() of a number that is not positive"); return v_error(); }
  return v_float(log2(num(a[0])));
}

static value bi_range(weft_ctx *c, int n, value *a, weft_loc loc) {
  for (int i = 0; i < n; i++)
    if (a[i].kind != V_INT) return arg_type_error(c, loc, "range", "integers", a[i]);
  value r = {.kind = V_RANGE};
  r.r.lo = n == 2 ? a[0].i : 0;
  r.r.hi = n == 2 ? a[1].i : a[0].i;
  return r;
}

/* Folds + or * over a list or range; integers stay exact. */
static value fold(weft_ctx *c, value xs, weft_loc loc, bool product) {
  const char *fn = product ? "product" : "sum";
  int64_t ia = product ? 1 : 0;
  double fa = product ? 1 : 0;
  bool isf = false;
  if (xs.kind == V_RANGE) {
    for (int64_t i = xs.r.lo; i < xs.r.hi; i++) {
      if (!eval_step(c, loc)) return v_error();
      bool ovf = product ? __builtin_mul_overflow(ia, i, &ia) : __builtin_add_overflow(ia, i, &ia);
      if (ovf) { eval_error(c, loc, "integer overflow in %s()", fn); return v_error(); }
    }
    return v_int(ia);
  }
  if (xs.kind != V_LIST) return arg_type_error(c, loc, fn, "a list or a range", xs);
  for (int i = 0; i < xs.list->n; i++) {
    value v = xs.list->items[i];
    if (!is_num(v)) return arg_type_error(c, loc, fn, "a list of numbers", v);
    if (v.kind == V_FLOAT && !isf) { isf = true; fa = (double)ia; }
    if (isf) fa = product ? fa * num(v) : fa + num(v);
    else {
      bool ovf = product ? __builtin_mul_overflow(ia, v.i, &ia) : __builtin_add_overflow(ia, v.i, &ia);
      if (ovf) { eval_error(c, loc, "integer overflow in %s()", fn); return v_error(); }
    }
  }
  return isf ? finite_num(c, fa, loc) : v_int(ia);
}
static value bi_sum(weft_ctx *c, int n, value *a, weft_loc l) { return fold(c, a[0], l, false); }
static value bi_product(weft_ctx *c, int n, value *a, weft_loc l) { return fold(c, a[0], l, true); }

/* numel(x) and bytes(x) of a tensor: the model evaluator provides shapes. */
/* A tensor's elements and element bytes, when t is one of the model being built. */
static bool model_tensor_size(weft_ctx *c, value t, int64_t *numel, int *elem_bytes) {
  if (!c->model || t.kind != V_TENSOR || t.tensor < 0 || t.tensor >= c->model->g->ntensors) return false;
  const gtensor *g = &c->model->g->tensors[t.tensor];
  *numel = tensor_numel(g);
  *elem_bytes = dtype_bytes[g->dtype];
  return true;
}

static value bi_numel(weft_ctx *c, int n, value *a, weft_loc loc) {
  int64_t ne; int eb;
  if (a[0].kind != V_TENSOR || !model_tensor_size(c, a[0], &ne, &eb))
    return arg_type_error(c, loc, "numel", "a tensor", a[0]);
  return v_int(ne);
}

static value bi_bytes(weft_ctx *c, int n, value *a, weft_loc loc) {
  int64_t ne; int eb;
  if (a[0].kind != V_TENSOR || !model_tensor_size(c, a[0], &ne, &eb))
    return arg_type_error(c, loc, "bytes", "a tensor", a[0]);
  return quantity(c, (double)ne * eb, (unit_dim){.byte = 1}, loc);
}

/* matches("GLOB"): whether the model of the plan being evaluated has an
 * operator the selector would select, so that a strategy can serve
 * several model families (megatron_tp: gpt and llama). */
static value bi_matches(weft_ctx *c, int n, value *a, weft_loc loc) {
  if (a[0].kind != V_STRING) return arg_type_error(c, loc, "matches", "a selector as a string (\"**.attn.c_attn\")", a[0]);
  if (!c->plan_graph) {
    weft_diag *g = eval_error(c, loc, "matches() asks the model of a plan: it is only available in plans and strategies");
    diag_hint(g, &c->diags, "call it in a `plan` or `strategy` body");
    return v_error();
  }
  return v_bool(dec_select(&c->arena, c->plan_graph, a[0].s).n > 0);
}

static const builtin builtins[] = {
    {"min", 1, -1, bi_min},     {"max", 1, -1, bi_max},       {"abs", 1, 1, bi_abs},
    {"len", 1, 1, bi_len},      {"str", 1, 1, bi_str},        {"int", 1, 1, bi_int},
    {"float", 1, 1, bi_float},  {"ceil", 1, 1, bi_ceil},      {"floor", 1, 1, bi_floor},
    {"sqrt", 1, 1, bi_sqrt},    {"log2", 1, 1, bi_log2},      {"range", 1, 2, bi_range},
    {"sum", 1, 1, bi_sum},      {"product", 1, 1, bi_product}, {"numel", 1, 1, bi_numel},
    {"bytes", 1, 1, bi_bytes},  {"matches", 1, 1, bi_matches},
};


static env *builtin_env(weft_ctx *c) {
  static const weft_loc none;
  env *e = env_new(&c->arena, NULL);
  for (int d = 0; d < DT_COUNT; d++) {
    value v = {.kind = V_DTYPE, .dt = (weft_dtype)d};
    env_define(&c->arena, e, dtype_names[d], v, none, true);
  }
  for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++) {
    value v = {.kind = V_BUILTIN, .bi = &builtins[i]};
    env_define(&c->arena, e, builtins[i].name, v, none, true);
  }
  return e;
}

/* ---- names ---------------------------------------------------------------- */

/* Every name visible from e, for "did you mean". */
static int visible_names(env *e, const char **out, int max) {
  int n = 0;
  for (; e; e = e->parent)
    for (int i = 0; i < e->n && n < max; i++) out[n++] = e->items[i].name;
  return n;
}

/* A tensor of the model being built by its name relative to the block being
 * evaluated, or an enclosing one; -1 when there is none. */
static int model_lookup_tensor(weft_ctx *c, const char *path) {
  model_scope *m = c->model;
  if (!m) return -1;
  for (int i = m->nprefix - 1; i >= 0; i--) {
    const char *full = *m->prefixes[i] ? arena_printf(&c->arena, "%s%s", m->prefixes[i], path) : path;
    int t = graph_find(m->g, full);
    if (t >= 0) return t;
  }
  return -1;
}

/* Tensor names visible from the current block, relative to it. */
static int model_tensor_names(weft_ctx *c, const char **out, int max) {
  model_scope *m = c->model;
  if (!m) return 0;
  const char *pre = m->prefixes[m->nprefix - 1];
  size_t pl = strlen(pre);
  int n = 0;
  for (int i = m->g->ntensors - 1; i >= 0 && n < max; i--) {
    const char *nm = m->g->tensors[i].name;
    if (strncmp(nm, pre, pl) == 0) out[n++] = nm + pl;
  }
  return n;
}

static value unknown_name(weft_ctx *c, env *e, const char *name, weft_loc loc) {
  const char *names[512];
  int n = visible_names(e, names, 512);
  if (c->model) n += model_tensor_names(c, names + n, 512 - n);
  const char *best = diag_closest(name, names, n);
  weft_diag *g = eval_error(c, loc, c->model ? "unknown name or tensor '%s'" : "unknown name '%s'", name);
  if (best) diag_hint(g, &c->diags, "did you mean '%s'?", best);
  else if (c->import_failed) diag_hint(g, &c->diags, "a module imported by `use` failed to load (see above)");
  return v_error();
}

const char *eval_path(weft_ctx *c, env *e, const ast *n, bool *failed) {
  if (n->kind == E_NAME) return n->name;
  if (n->kind != E_MEMBER) return NULL;
  const char *base = eval_path(c, e, n->a, failed);
  if (!base) return NULL;
  if (n->name) return arena_printf(&c->arena, "%s.%s", base, n->name);
  if (n->b->kind == E_INT && n->op != '{')
    return arena_printf(&c->arena, "%s.%" PRId64, base, n->b->ival);
  value v = eval_expr(c, e, n->b);
  if (v.kind == V_ERROR) { *failed = true; return NULL; }
  if (v.kind == V_INT) return arena_printf(&c->arena, "%s.%" PRId64, base, v.i);
  if (v.kind == V_STRING && eval_is_ident(v.s, strlen(v.s))) return arena_printf(&c->arena, "%s.%s", base, v.s);
  eval_error(c, n->b->loc, "a name segment must be an integer or an identifier, got %s %s",
             value_kind_name(v.kind), value_repr(&c->arena, v));
  *failed = true;
  return NULL;
}

/* ---- arithmetic ----------------------------------------------------------- */


static value type_error2(weft_ctx *c, weft_loc loc, int op, value a, value b) {
  weft_diag *g = eval_error(c, loc, "cannot apply '%s' to %s and %s", ast_op_name(op),
                            value_kind_name(a.kind), value_kind_name(b.kind));
  if (a.kind == V_TENSOR || b.kind == V_TENSOR)
    diag_hint(g, &c->diags, "tensors are combined by operators, e.g. add(x, y)");
  return v_error();
}

static char *dim_name(unit_dim d, char *buf) { unit_dim_name(d, buf, 64); return buf; }

static value compare(weft_ctx *c, int op, value a, value b, weft_loc loc) {
  if (op == T_EQ || op == T_NE) {
    bool same_kind = a.kind == b.kind || (is_num(a) && is_num(b));
    if (!same_kind) return type_error2(c, loc, op, a, b);
    if (a.kind == V_QUANTITY && !unit_eq(a.q.d, b.q.d)) {
      char x[64], y[64];
      eval_error(c, loc, "cannot compare %s with %s", dim_name(a.q.d, x), dim_name(b.q.d, y));
      return v_error();
    }
    bool eq = value_equal(a, b);
    return v_bool(op == T_EQ ? eq : !eq);
  }
  int cmp;
  if (is_num(a) && is_num(b)) {
    if (a.kind == V_INT && b.kind == V_INT) cmp = (a.i > b.i) - (a.i < b.i);
    else cmp = (num(a) > num(b)) - (num(a) < num(b));
  } else if (a.kind == V_QUANTITY && b.kind == V_QUANTITY) {
    if (!unit_eq(a.q.d, b.q.d)) {
      char x[64], y[64];
      eval_error(c, loc, "cannot compare %s with %s", dim_name(a.q.d, x), dim_name(b.q.d, y));
      return v_error();
    }
    cmp = (a.q.v > b.q.v) - (a.q.v < b.q.v);
  } else if (a.kind == V_STRING && b.kind == V_STRING) {
    cmp = strcmp(a.s, b.s);
    cmp = (cmp > 0) - (cmp < 0);
  } else {
    return type_error2(c, loc, op, a, b);
  }
  switch (op) {
  case '<': return v_bool(cmp < 0);
  case T_LE: return v_bool(cmp <= 0);
  case '>': return v_bool(cmp > 0);
  default: return v_bool(cmp >= 0);
  }
}

static value int_arith(weft_ctx *c, int op, int64_t x, int64_t y, weft_loc loc) {
  int64_t r;
  bool ovf = false;
  switch (op) {
  case '+': ovf = __builtin_add_overflow(x, y, &r); break;
  case '-': ovf = __builtin_sub_overflow(x, y, &r); break;
  case '*': ovf = __builtin_mul_overflow(x, y, &r); break;
  case '/': case T_IDIV: case '%':
    if (y == 0) { eval_error(c, loc, "division by zero"); return v_error(); }
    if (x == INT64_MIN && y == -1) { ovf = true; break; }
    if (op == '/') {
      if (x % y == 0) return v_int(x / y);
      return v_float((double)x / (double)y);
    }
    if (op == '%') { r = x % y; if (r != 0 && ((r < 0) != (y < 0))) r += y; break; }
    r = x / y;
    if ((x % y != 0) && ((x < 0) != (y < 0))) r--;  /* floor division */
    break;
  default: return v_error();
  }
  if (ovf) { eval_error(c, loc, "integer overflow in '%s'", ast_op_name(op)); return v_error(); }
  return v_int(r);
}

static value arith(weft_ctx *c, int op, value a, value b, weft_loc loc) {
  if (a.kind == V_INT && b.kind == V_INT) return int_arith(c, op, a.i, b.i, loc);
  if (is_num(a) && is_num(b)) {
    double x = num(a), y = num(b);
    switch (op) {
    case '+': return finite_num(c, x + y, loc);
    case '-': return finite_num(c, x - y, loc);
    case '*': return finite_num(c, x * y, loc);
    case '/': case T_IDIV: case '%':
      if (y == 0) { eval_error(c, loc, "division by zero"); return v_error(); }
      if (op == '/') return finite_num(c, x / y, loc);
      if (op == T_IDIV) return finite_num(c, floor(x / y), loc);
      return finite_num(c, x - y * floor(x / y), loc);
    }
  }
  if (a.kind == V_QUANTITY || b.kind == V_QUANTITY) {
    bool qa = a.kind == V_QUANTITY, qb = b.kind == V_QUANTITY;
    if ((!qa && !is_num(a)) || (!qb && !is_num(b))) return type_error2(c, loc, op, a, b);
    double x = qa ? a.q.v : num(a), y = qb ? b.q.v : num(b);
    unit_dim da = qa ? a.q.d : (unit_dim){0}, db = qb ? b.q.d : (unit_dim){0};
    char bx[64], by[64];
    switch (op) {
    case '+': case '-':
      if (!unit_eq(da, db)) {
        weft_diag *g = eval_error(c, loc, "cannot %s %s %s %s", op == '+' ? "add" : "subtract",
                                  dim_name(db, by), op == '+' ? "to" : "from", dim_name(da, bx));
        diag_hint(g, &c->diags, "both sides of '%s' need the same unit dimension", ast_op_name(op));
        return v_error();
      }
      return quantity(c, op == '+' ? x + y : x - y, da, loc);
    case '*': case '/': {
      unit_dim d;
      bool ok = op == '*' ? unit_mul_checked(da, db, &d) : unit_div_checked(da, db, &d);
      if (!ok) { eval_error(c, loc, "unit exponent out of range"); return v_error(); }
      if (op == '/' && y == 0) { eval_error(c, loc, "division by zero"); return v_error(); }
      return quantity(c, op == '*' ? x * y : x / y, d, loc);
    }
    default:
      eval_error(c, loc, "'%s' is not defined for quantities", ast_op_name(op));
      return v_error();
    }
  }
  if (op == '+' && a.kind == V_STRING && b.kind == V_STRING)
    return v_string(arena_printf(&c->arena, "%s%s", a.s, b.s));
  if (op == '+' && a.kind == V_LIST && b.kind == V_LIST) {
    vlist *l = arena_alloc(&c->arena, sizeof *l);
    l->n = a.list->n + b.list->n;
    if (l->n > EVAL_MAX_LIST) { eval_error(c, loc, "list too long"); return v_error(); }
    l->items = arena_alloc(&c->arena, sizeof(value) * (size_t)(l->n ? l->n : 1));
    memcpy(l->items, a.list->items, sizeof(value) * (size_t)a.list->n);
    memcpy(l->items + a.list->n, b.list->items, sizeof(value) * (size_t)b.list->n);
    return (value){.kind = V_LIST, .list = l};
  }
  return type_error2(c, loc, op, a, b);
}

static bool truth(weft_ctx *c, value v, weft_loc loc, bool *out) {
  if (v.kind != V_BOOL) {
    eval_error(c, loc, "a condition must be a boolean, got %s %s", value_kind_name(v.kind), value_repr(&c->arena, v));
    return false;
  }
  *out = v.i != 0;
  return true;
}

/* ---- calls ---------------------------------------------------------------- */

/* Binds call arguments to parameters (N_PARAM list): positional first, then
 * by name; defaults are evaluated in `defenv`. Already-bound values in
 * `bound` count as given. */
static bool bind_params(weft_ctx *c, const char *what, const ast_list *params, vrecord *bound,
                        int nargs, const ast *const *args, env *argenv, env *target,
                        env *defenv, weft_loc loc, bool partial, vrecord **out_bound) {
  int np = params->n;
  value *vals = arena_alloc(&c->arena, sizeof(value) * (size_t)(np ? np : 1));
  bool *have = arena_alloc(&c->arena, sizeof(bool) * (size_t)(np ? np : 1));
  for (int i = 0; i < np; i++) {
    const value *b = record_get(bound, params->items[i]->name);
    if (b) { vals[i] = *b; have[i] = true; }
  }
  int pos = 0;
  bool ok = true, named_seen = false;
  for (int k = 0; k < nargs; k++) {
    const ast *a = args[k];
    int idx = -1;
    if (a->name) {
      named_seen = true;
      for (int i = 0; i < np; i++)
        if (strcmp(params->items[i]->name, a->name) == 0) idx = i;
      if (idx < 0) {
        const char *names[256];
        int nn = 0;
        for (int i = 0; i < np && nn < 256; i++) names[nn++] = params->items[i]->name;
        const char *best = diag_closest(a->name, names, nn);
        weft_diag *g = eval_error(c, a->loc, "%s has no parameter '%s'", what, a->name);
        if (best) diag_hint(g, &c->diags, "did you mean '%s'?", best);
        ok = false;
        continue;
      }
    } else {
      if (named_seen) {
        eval_error(c, a->loc, "a positional argument cannot follow a named one");
        ok = false;
        continue;
      }
      while (pos < np && have[pos] && record_get(bound, params->items[pos]->name)) pos++;
      if (pos >= np) {
        eval_error(c, a->loc, "too many arguments to %s (it takes %d)", what, np);
        ok = false;
        continue;
      }
      idx = pos++;
    }
    value v = eval_expr(c, argenv, a->a);
    if (v.kind == V_ERROR) { ok = false; continue; }
    if (have[idx] && !record_get(bound, params->items[idx]->name)) {
      eval_error(c, a->loc, "parameter '%s' of %s is given twice", params->items[idx]->name, what);
      ok = false;
      continue;
    }
    vals[idx] = v;
    have[idx] = true;
  }
  if (!ok) return false;
  if (partial) {
    vrecord *r = arena_alloc(&c->arena, sizeof *r);
    r->keys = arena_alloc(&c->arena, sizeof(char *) * (size_t)(np ? np : 1));
    r->vals = arena_alloc(&c->arena, sizeof(value) * (size_t)(np ? np : 1));
    for (int i = 0; i < np; i++)
      if (have[i]) { r->keys[r->n] = params->items[i]->name; r->vals[r->n++] = vals[i]; }
    *out_bound = r;
    return true;
  }
  for (int i = 0; i < np; i++) {
    const ast *p = params->items[i];
    if (!have[i]) {
      if (!p->a) {
        weft_diag *g = eval_error(c, loc, "%s needs a value for parameter '%s'", what, p->name);
        diag_hint(g, &c->diags, "pass it by name: %s = ...", p->name);
        ok = false;
        continue;
      }
      /* defaults may refer to earlier parameters */
      env *de = env_new(&c->arena, defenv);
      for (int j = 0; j < i; j++)
        if (have[j]) env_define(&c->arena, de, params->items[j]->name, vals[j], params->items[j]->loc, false);
      vals[i] = eval_expr(c, de, p->a);
      if (vals[i].kind == V_ERROR) { ok = false; continue; }
      have[i] = true;
    }
    env_define(&c->arena, target, p->name, vals[i], p->loc, false);
  }
  return ok;
}

static value call_fn(weft_ctx *c, vdecl *d, int nargs, const ast *const *args, weft_loc loc, env *e) {
  if (c->depth >= EVAL_MAX_DEPTH) {
    weft_diag *g = eval_error(c, loc, "calls nested more than %d deep", EVAL_MAX_DEPTH);
    diag_hint(g, &c->diags, "a recursion that does not end?");
    return v_error();
  }
  env *fe = env_new(&c->arena, d->closure);
  const char *what = arena_printf(&c->arena, "function %s", d->name);
  if (!bind_params(c, what, &d->node->list, NULL, nargs, args, e, fe, d->closure, loc, false, NULL))
    return v_error();
  c->depth++;
  value r = eval_expr(c, fe, d->node->a);
  c->depth--;
  return r;
}

/* Binding some parameters of a model or cluster gives a new one: the full
 * evaluation happens when a graph or cluster is built. */
static value bind_decl(weft_ctx *c, value callee, int nargs, const ast *const *args, weft_loc loc, env *e) {
  vdecl *d = callee.decl;
  const char *what = arena_printf(&c->arena, "%s %s", value_kind_name(callee.kind), d->name);
  vrecord *bound = NULL;
  if (!bind_params(c, what, &d->node->list, d->bound, nargs, args, e, NULL, d->closure, loc, true, &bound))
    return v_error();
  vdecl *nd = arena_alloc(&c->arena, sizeof *nd);
  *nd = *d;
  nd->bound = bound;
  value r = callee;
  r.decl = nd;
  return r;
}

/* Binds the parameters of a model or cluster into env target (defaults
 * evaluated); used by model.c and cluster building. */
static const char *decl_kind(const vdecl *d) {
  switch (d->node->kind) {
  case S_CLUSTER: return "cluster";
  case S_PLAN: return "plan";
  case S_STRATEGY: return "strategy";
  case S_FN: return "function";
  default: return "model";
  }
}

bool eval_bind_decl(weft_ctx *c, vdecl *d, env *target, weft_loc loc) {
  const char *what = arena_printf(&c->arena, "%s %s", decl_kind(d), d->name);
  return bind_params(c, what, &d->node->list, d->bound, 0, NULL, target, target, d->closure, loc, false, NULL);
}

/* Binds the named arguments of a sub-model call (its tensor arguments are
 * positional and bound by model.c) and the defaults. */
bool eval_bind_named(weft_ctx *c, vdecl *d, int nargs, const ast *const *args, env *argenv,
                     env *target, weft_loc loc) {
  const char *what = arena_printf(&c->arena, "%s %s", decl_kind(d), d->name);
  return bind_params(c, what, &d->node->list, d->bound, nargs, args, argenv, target, d->closure,
                     loc, false, NULL);
}

value eval_call_value(weft_ctx *c, value f, int nargs, const ast *const *args, weft_loc loc, env *e) {
  switch (f.kind) {
  case V_FN: return call_fn(c, f.decl, nargs, args, loc, e);
  case V_MODEL: case V_CLUSTER: case V_PLAN: return bind_decl(c, f, nargs, args, loc, e);
  case V_STRATEGY: {
    weft_diag *g = eval_error(c, loc, "strategy %s can only be called as a statement of a plan", f.decl->name);
    diag_hint(g, &c->diags, "write %s(...) on a line of its own inside a plan", f.decl->name);
    return v_error();
  }
  case V_BUILTIN: {
    const builtin *b = f.bi;
    if (nargs < b->min || (b->max >= 0 && nargs > b->max)) {
      if (b->min == b->max) eval_error(c, loc, "%s() takes %d argument%s, got %d", b->name, b->min, b->min == 1 ? "" : "s", nargs);
      else if (b->max < 0) eval_error(c, loc, "%s() takes at least %d argument%s, got %d", b->name, b->min, b->min == 1 ? "" : "s", nargs);
      else eval_error(c, loc, "%s() takes %d to %d arguments, got %d", b->name, b->min, b->max, nargs);
      return v_error();
    }
    value *vals = arena_alloc(&c->arena, sizeof(value) * (size_t)(nargs ? nargs : 1));
    for (int i = 0; i < nargs; i++) {
      if (args[i]->name) {
        eval_error(c, args[i]->loc, "%s() takes no named arguments", b->name);
        return v_error();
      }
      vals[i] = eval_expr(c, e, args[i]->a);
      if (vals[i].kind == V_ERROR) return v_error();
    }
    return b->fn(c, nargs, vals, loc);
  }
  case V_OPDECL: {
    weft_diag *g = eval_error(c, loc, "operator %s can only be called in a model body", f.op->name);
    diag_hint(g, &c->diags, "write NAME = %s(...) inside a model", f.op->name);
    return v_error();
  }
  default:
    eval_error(c, loc, "%s %s cannot be called", value_kind_name(f.kind), value_repr(&c->arena, f));
    return v_error();
  }
}

/* ---- expressions ---------------------------------------------------------- */

static value eval_string(weft_ctx *c, env *e, const ast *n) {
  size_t cap = 64, len = 0;
  char *buf = arena_alloc(&c->arena, cap);
  for (int i = 0; i < n->list.n; i++) {
    const ast *p = n->list.items[i];
    const char *piece;
    if (p->kind == E_STRPART) piece = p->text;
    else {
      value v = eval_expr(c, e, p);
      if (v.kind == V_ERROR) return v;
      piece = value_show(&c->arena, v);
    }
    size_t pl = strlen(piece);
    if (len + pl + 1 > cap) {
      while (len + pl + 1 > cap) cap *= 2;
      char *nb = arena_alloc(&c->arena, cap);
      memcpy(nb, buf, len);
      buf = nb;
    }
    memcpy(buf + len, piece, pl);
    len += pl;
  }
  buf[len] = 0;
  return v_string(buf);
}

static value eval_member(weft_ctx *c, env *e, const ast *n) {
  if (c->model) {
    bool failed = false;
    const char *path = eval_path(c, e, n, &failed);
    if (failed) return v_error();
    if (path) {
      int t = model_lookup_tensor(c, path);
      if (t >= 0) return v_tensor(t);
      /* a path whose root is not a value can only mean a tensor */
      const ast *root = n;
      while (root->kind == E_MEMBER) root = root->a;
      if (root->kind == E_NAME && !env_lookup(e, root->name)) return unknown_name(c, e, path, n->loc);
    }
  }
  value base = eval_expr(c, e, n->a);
  if (base.kind == V_ERROR) return base;
  if (!n->name) {
    eval_error(c, n->loc, "%s %s has no numbered members", value_kind_name(base.kind), value_repr(&c->arena, base));
    return v_error();
  }
  if (base.kind == V_RECORD) {
    const value *v = record_get(base.rec, n->name);
    if (v) return *v;
    const char *best = diag_closest(n->name, base.rec->keys, base.rec->n);
    weft_diag *g = eval_error(c, n->loc, "record has no field '%s'", n->name);
    if (best) diag_hint(g, &c->diags, "did you mean '%s'?", best);
    else diag_hint(g, &c->diags, "its fields: %s", value_show(&c->arena, base));
    return v_error();
  }
  eval_error(c, n->loc, "%s %s has no field '%s'", value_kind_name(base.kind), value_repr(&c->arena, base), n->name);
  return v_error();
}

static value eval_mesh_index(weft_ctx *c, env *e, const ast *n, const pmesh *m) {
  int k = n->b ? 1 : n->list.n;
  if (k != m->naxes) {
    eval_error(c, n->loc, "mesh %s has %d axes, indexed with %d", m->name, m->naxes, k);
    return v_error();
  }
  int64_t flat = 0;
  for (int i = 0; i < k; i++) {
    const ast *ix = n->b ? n->b : n->list.items[i];
    value v = eval_expr(c, e, ix);
    if (v.kind == V_ERROR) return v;
    if (v.kind != V_INT || v.i < 0 || v.i >= m->sizes[i]) {
      eval_error(c, ix->loc, "index %d of mesh %s must be 0 to %d (axis %s), got %s", i, m->name, m->sizes[i] - 1,
                 m->axes[i], value_repr(&c->arena, v));
      return v_error();
    }
    flat = flat * m->sizes[i] + v.i;
  }
  return v_int(m->devices[flat]);
}

static value eval_index(weft_ctx *c, env *e, const ast *n) {
  value a = eval_expr(c, e, n->a);
  if (a.kind == V_ERROR) return a;
  if (a.kind == V_MESH) return eval_mesh_index(c, e, n, a.mesh);
  if (!n->b) {
    eval_error(c, n->loc, "%s takes one index", value_kind_name(a.kind));
    return v_error();
  }
  value i = eval_expr(c, e, n->b);
  if (i.kind == V_ERROR) return i;
  if (a.kind == V_RECORD && i.kind == V_STRING) {
    const value *v = record_get(a.rec, i.s);
    if (v) return *v;
    eval_error(c, n->b->loc, "record has no field '%s'", i.s);
    return v_error();
  }
  if (i.kind == V_RANGE && a.kind == V_LIST) {
    /* a slice: xs[lo..hi] */
    int64_t lo = i.r.lo, hi = i.r.hi, len = a.list->n;
    if (lo < 0 || hi > len || lo > hi) {
      eval_error(c, n->b->loc, "slice %" PRId64 "..%" PRId64 " is out of range (length %" PRId64 ")", lo, hi, len);
      return v_error();
    }
    vlist *l = arena_alloc(&c->arena, sizeof *l);
    l->n = (int)(hi - lo);
    l->items = a.list->items + lo;
    return (value){.kind = V_LIST, .list = l};
  }
  if (i.kind != V_INT) {
    eval_error(c, n->b->loc, "an index must be an integer, got %s", value_kind_name(i.kind));
    return v_error();
  }
  int64_t len;
  if (a.kind == V_LIST) len = a.list->n;
  else if (a.kind == V_RANGE) len = a.r.hi > a.r.lo ? a.r.hi - a.r.lo : 0;
  else {
    eval_error(c, n->loc, "%s %s cannot be indexed", value_kind_name(a.kind), value_repr(&c->arena, a));
    return v_error();
  }
  int64_t k = i.i < 0 ? i.i + len : i.i;
  if (k < 0 || k >= len) {
    eval_error(c, n->b->loc, "index %" PRId64 " is out of range (length %" PRId64 ")", i.i, len);
    return v_error();
  }
  return a.kind == V_LIST ? a.list->items[k] : v_int(a.r.lo + k);
}

value eval_expr(weft_ctx *c, env *e, const ast *n) {
  if (!eval_step(c, n->loc)) return v_error();
  switch (n->kind) {
  case E_INT: return v_int(n->ival);
  case E_FLOAT: return v_float(n->fval);
  case E_BOOL: return v_bool(n->ival != 0);
  case E_HOLE: {
    /* filled by the search, which evaluates the plan once per filling */
    for (int i = 0; i < c->nfills; i++)
      if (c->fills[i].loc.file == n->loc.file && c->fills[i].loc.line == n->loc.line && c->fills[i].loc.col == n->loc.col)
        return v_int(c->fills[i].value);
    weft_diag *g = eval_error(c, n->loc, "? is an open decision");
    diag_hint(g, &c->diags, "weft search fills it (docs/search.md); or write a number here");
    return v_error();
  }
  case E_QUANTITY: {
    double scale;
    unit_dim d;
    if (!unit_lookup(n->name, &scale, &d)) {
      eval_error(c, n->loc, "unknown unit '%s'", n->name);
      return v_error();
    }
    if (!isfinite(n->fval * scale)) {
      eval_error(c, n->loc, "the quantity %s %s is out of range", n->text, n->name);
      return v_error();
    }
    return quantity(c, n->fval * scale, d, n->loc);
  }
  case E_STRING: return eval_string(c, e, n);
  case E_STRPART: return v_string(n->text);
  case E_PAREN: return eval_expr(c, e, n->a);
  case E_NAME: {
    binding *b = env_lookup(e, n->name);
    if (b) return b->val;  /* V_ERROR for a definition that failed: reported once */
    if (c->model) {
      int t = model_lookup_tensor(c, n->name);
      if (t >= 0) return v_tensor(t);
    }
    return unknown_name(c, e, n->name, n->loc);
  }
  case E_MEMBER: return eval_member(c, e, n);
  case E_INDEX: return eval_index(c, e, n);
  case E_CALL: {
    value f = eval_expr(c, e, n->a);
    if (f.kind == V_ERROR) return f;
    if (c->model && (f.kind == V_OPDECL || f.kind == V_MODEL)) {
      weft_diag *g = eval_error(c, n->loc, "%s %s must be called as a statement of its own",
                                f.kind == V_OPDECL ? "operator" : "model",
                                f.kind == V_OPDECL ? f.op->name : f.decl->name);
      diag_hint(g, &c->diags, "write NAME = %s(...), so that it has a name",
                f.kind == V_OPDECL ? f.op->name : f.decl->name);
      return v_error();
    }
    return eval_call_value(c, f, n->list.n, (const ast *const *)n->list.items, n->loc, e);
  }
  case E_UNARY: {
    value a = eval_expr(c, e, n->a);
    if (a.kind == V_ERROR) return a;
    if (n->op == T_NOT) {
      bool t;
      if (!truth(c, a, n->a->loc, &t)) return v_error();
      return v_bool(!t);
    }
    if (a.kind == V_INT) {
      if (a.i == INT64_MIN) { eval_error(c, n->loc, "integer overflow in '-'"); return v_error(); }
      return v_int(-a.i);
    }
    if (a.kind == V_FLOAT) return v_float(-a.f);
    if (a.kind == V_QUANTITY) { a.q.v = -a.q.v; return a; }
    eval_error(c, n->loc, "cannot negate a %s", value_kind_name(a.kind));
    return v_error();
  }
  case E_BINARY: {
    value a = eval_expr(c, e, n->a);
    if (a.kind == V_ERROR) return a;
    if (n->op == T_AND || n->op == T_OR) {
      bool t;
      if (!truth(c, a, n->a->loc, &t)) return v_error();
      if (n->op == T_AND && !t) return v_bool(false);
      if (n->op == T_OR && t) return v_bool(true);
      value b = eval_expr(c, e, n->b);
      if (b.kind == V_ERROR) return b;
      if (!truth(c, b, n->b->loc, &t)) return v_error();
      return v_bool(t);
    }
    value b = eval_expr(c, e, n->b);
    if (b.kind == V_ERROR) return b;
    switch (n->op) {
    case T_EQ: case T_NE: case '<': case T_LE: case '>': case T_GE:
      return compare(c, n->op, a, b, n->loc);
    default: return arith(c, n->op, a, b, n->loc);
    }
  }
  case E_RANGE: {
    value a = eval_expr(c, e, n->a);
    if (a.kind == V_ERROR) return a;
    value b = eval_expr(c, e, n->b);
    if (b.kind == V_ERROR) return b;
    if (a.kind != V_INT || b.kind != V_INT) {
      eval_error(c, n->loc, "a range needs integers, got %s..%s", value_kind_name(a.kind), value_kind_name(b.kind));
      return v_error();
    }
    value r = {.kind = V_RANGE};
    r.r.lo = a.i;
    r.r.hi = b.i;
    return r;
  }
  case E_IF: {
    value cnd = eval_expr(c, e, n->a);
    if (cnd.kind == V_ERROR) return cnd;
    bool t;
    if (!truth(c, cnd, n->a->loc, &t)) return v_error();
    return eval_expr(c, e, t ? n->b : n->c);
  }
  case E_LIST: {
    vlist *l = arena_alloc(&c->arena, sizeof *l);
    l->n = n->list.n;
    l->items = arena_alloc(&c->arena, sizeof(value) * (size_t)(l->n ? l->n : 1));
    for (int i = 0; i < l->n; i++) {
      l->items[i] = eval_expr(c, e, n->list.items[i]);
      if (l->items[i].kind == V_ERROR) return v_error();
    }
    return (value){.kind = V_LIST, .list = l};
  }
  case E_RECORD: {
    vrecord *r = arena_alloc(&c->arena, sizeof *r);
    int m = n->list.n;
    r->keys = arena_alloc(&c->arena, sizeof(char *) * (size_t)(m ? m : 1));
    r->vals = arena_alloc(&c->arena, sizeof(value) * (size_t)(m ? m : 1));
    for (int i = 0; i < m; i++) {
      const ast *f = n->list.items[i];
      for (int j = 0; j < r->n; j++)
        if (strcmp(r->keys[j], f->name) == 0) {
          eval_error(c, f->loc, "field '%s' is given twice", f->name);
          return v_error();
        }
      value v = eval_expr(c, e, f->a);
      if (v.kind == V_ERROR) return v;
      r->keys[r->n] = f->name;
      r->vals[r->n++] = v;
    }
    return (value){.kind = V_RECORD, .rec = r};
  }
  default:
    eval_error(c, n->loc, "internal error: %s is not an expression", ast_kind_names[n->kind]);
    return v_error();
  }
}

bool eval_condition(weft_ctx *c, env *e, const ast *x, bool *out) {
  value v = eval_expr(c, e, x);
  if (v.kind == V_ERROR) return false;
  return truth(c, v, x->loc, out);
}

/* `assert COND, MESSAGE` in any body. */
bool eval_assert(weft_ctx *c, env *e, const ast *s) {
  value v = eval_expr(c, e, s->a);
  if (v.kind == V_ERROR) return false;
  bool t;
  if (!truth(c, v, s->a->loc, &t)) return false;
  if (t) return true;
  const char *msg = "assertion failed";
  if (s->b) {
    value mv = eval_expr(c, e, s->b);
    if (mv.kind == V_ERROR) return false;
    msg = arena_printf(&c->arena, "assertion failed: %s", value_show(&c->arena, mv));
  }
  eval_error(c, s->loc, "%s", msg);
  return false;
}

/* The environment of built-ins every module's scope starts from. */
env *eval_global_env(weft_ctx *c) {
  if (!c->builtins) c->builtins = builtin_env(c);
  return c->builtins;
}
