/* model.c - evaluates model bodies into operator graphs: tensors, operator
 * calls checked against their signatures, sub-models, names and costs. */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "eval.h"
#include "weft/workspace.h"
#include "model.h"

enum { MODEL_MAX_DIMS = 16 };

/* The model (or sub-model) whose body is being evaluated. */
typedef struct mstate {
  model_scope sc;         /* what expressions see; first, so that c->model is both */
  struct mstate *outer;
  const char *model_name;
  int *inputs;           /* tensors passed to a sub-model, bound to its `input`s */
  int ninputs, next_input;
  const ast *call;       /* the sub-model call, for errors */
  int output;            /* `output`, or -1 */
  int last_result;       /* the last operator's result, or -1 */
  const ast *train;      /* the `train` statement, or NULL */
  env *train_env;
} mstate;

static arena *A(weft_ctx *c) { return &c->arena; }
/* The model being built: c->model is its scope, its first member. */
static mstate *M(weft_ctx *c) { return (mstate *)c->model; }

/* ---- operator declarations -------------------------------------------------- */

static bool pattern_build(weft_ctx *c, const ast *p, oppattern *out) {
  memset(out, 0, sizeof *out);
  if (p->name) {
    int d;
    for (d = 0; d < DT_COUNT; d++)
      if (strcmp(dtype_names[d], p->name) == 0) break;
    if (d == DT_COUNT) {
      weft_diag *g = eval_error(c, p->loc, "unknown dtype '%s'", p->name);
      diag_hint(g, &c->diags, "dtypes are f32, bf16, f16 and i32");
      return false;
    }
    out->has_dtype = true;
    out->dtype = (weft_dtype)d;
  }
  out->ndims = p->list.n;
  out->dims = arena_alloc(A(c), sizeof(opdim) * (size_t)(p->list.n ? p->list.n : 1));
  int groups = 0;
  for (int i = 0; i < p->list.n; i++) {
    const ast *d = p->list.items[i];
    opdim *od = &out->dims[i];
    od->loc = d->loc;
    od->name = d->name;
    od->mark = d->op;
    if (d->op == T_DOTDOT && ++groups > 1) {
      eval_error(c, d->loc, "a shape pattern may have only one `..` group");
      return false;
    }
    if (!d->name) {
      od->nfactors = d->list.n;
      od->factors = arena_alloc(A(c), sizeof(opfactor) * (size_t)(d->list.n ? d->list.n : 1));
      for (int k = 0; k < d->list.n; k++) {
        const ast *f = d->list.items[k];
        if (f->kind == E_INT) {
          if (f->ival <= 0) { eval_error(c, f->loc, "a factor must be positive"); return false; }
          od->factors[k].value = f->ival;
        } else {
          od->factors[k].name = f->name;
          od->factors[k].mark = f->op;
        }
      }
    }
  }
  return true;
}

/* Every name a pattern binds, for checking the result and cost expressions. */
static bool pattern_has(const oppattern *p, const char *name) {
  for (int i = 0; i < p->ndims; i++) {
    if (p->dims[i].name && strcmp(p->dims[i].name, name) == 0) return true;
    for (int k = 0; k < p->dims[i].nfactors; k++)
      if (p->dims[i].factors[k].name && strcmp(p->dims[i].factors[k].name, name) == 0) return true;
  }
  return false;
}

/* Whether s is a C identifier: the SYMBOL of a native kernel. */
static bool is_identifier(const char *s) {
  if (!(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z'))) return false;
  for (; *s; s++)
    if (!(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9'))) return false;
  return true;
}

/* `kernel = "LIB:SYMBOL"` or `kernel_backward = ...`: evaluated once, here,
 * in the operator's module, and checked for its form only. Opening LIB is
 * the CPU backend's work, under `weft run --allow-native`: checking a plan
 * never runs code from elsewhere. */
static bool native_entry(weft_ctx *c, env *e, opdecl *op, const ast *s) {
  const char *key = s->a->name;
  bool bwd = strcmp(key, "kernel_backward") == 0;
  const char **slot = bwd ? &op->native_bwd : &op->native_fwd;
  if (*slot) {
    eval_error(c, s->a->loc, "operator %s has two `%s` entries", op->name, key);
    return false;
  }
  value v = eval_expr(c, e, s->b);
  if (v.kind == V_ERROR) return false;
  const char *example = bwd ? "for example: kernel_backward = \"libmyops.so:my_op_backward\""
                            : "for example: kernel = \"libmyops.so:my_op_forward\"";
  if (v.kind != V_STRING) {
    weft_diag *g = eval_error(c, s->b->loc, "`%s` of %s must be a string \"LIB:SYMBOL\", got %s %s", key, op->name,
                              value_kind_name(v.kind), value_repr(A(c), v));
    diag_hint(g, &c->diags, "%s", example);
    return false;
  }
  const char *colon = strrchr(v.s, ':');
  if (!colon || colon == v.s || !is_identifier(colon + 1)) {
    weft_diag *g = eval_error(c, s->b->loc, "`%s` of %s must have the form \"LIB:SYMBOL\", got %s", key, op->name,
                              value_repr(A(c), v));
    if (!colon) diag_hint(g, &c->diags, "name the shared library and the function in it, separated by ':'; %s", example);
    else if (colon == v.s) diag_hint(g, &c->diags, "the shared library is missing before ':'; %s", example);
    else if (!colon[1]) diag_hint(g, &c->diags, "the function's name is missing after ':'; %s", example);
    else diag_hint(g, &c->diags, "'%s' is not the name of a C function; %s", colon + 1, example);
    return false;
  }
  *slot = v.s;
  if (bwd) op->native_bwd_loc = s->loc;
  else op->native_loc = s->loc;
  return true;
}

/* What a native kernel needs of the rest of the declaration. */
static bool native_check(weft_ctx *c, opdecl *op) {
  if (op->native_bwd && !op->native_fwd) {
    weft_diag *g = eval_error(c, op->native_bwd_loc, "operator %s has `kernel_backward` but no `kernel`", op->name);
    diag_hint(g, &c->diags, "add the forward: kernel = \"LIB:SYMBOL\"");
    return false;
  }
  if (!op->native_fwd) return true;
  bool ok = true;
  if (op->kind && strcmp(op->kind, "optimizer") == 0) {
    weft_diag *g = eval_error(c, op->native_loc, "optimizer %s cannot have a native kernel", op->name);
    diag_hint(g, &c->diags, "native kernels are for the operators a model calls; the backends run sgd and adamw themselves");
    ok = false;
  }
  /* the calling convention passes float pointers */
  for (int i = 0; i < op->nargs; i++)
    if (op->args[i].tensor && op->args[i].pat.has_dtype && op->args[i].pat.dtype == DT_I32) {
      eval_error(c, op->node->list.items[i]->loc, "argument %s of %s is declared i32, but a native kernel works on f32 tensors",
                 op->args[i].name, op->name);
      ok = false;
    }
  if (op->result.has_dtype && op->result.dtype == DT_I32) {
    eval_error(c, op->node->b->loc, "the result of %s is declared i32, but a native kernel works on f32 tensors", op->name);
    ok = false;
  }
  return ok;
}

opdecl *opdecl_build(weft_ctx *c, env *e, const ast *n) {
  opdecl *op = arena_alloc(A(c), sizeof *op);
  op->name = n->name;
  op->node = n;
  op->closure = e;
  op->nargs = n->list.n;
  op->args = arena_alloc(A(c), sizeof(oparg) * (size_t)(n->list.n ? n->list.n : 1));
  bool ok = true;
  for (int i = 0; i < n->list.n; i++) {
    const ast *a = n->list.items[i];
    oparg *oa = &op->args[i];
    oa->name = a->name;
    oa->def = a->a;
    for (int j = 0; j < i; j++)
      if (strcmp(op->args[j].name, a->name) == 0) {
        eval_error(c, a->loc, "operator %s has two arguments named '%s'", n->name, a->name);
        ok = false;
      }
    if (a->b) {
      oa->tensor = true;
      if (!pattern_build(c, a->b, &oa->pat)) ok = false;
    }
  }
  if (!pattern_build(c, n->b, &op->result)) return NULL;
  if (!ok) return NULL;
  /* every name of the result must be bound by an argument or an attribute */
  for (int i = 0; i < op->result.ndims; i++) {
    const opdim *d = &op->result.dims[i];
    int nf = d->name ? 1 : d->nfactors;
    for (int k = 0; k < nf; k++) {
      const char *nm = d->name ? d->name : d->factors[k].name;
      if (!nm) continue;
      bool found = false;
      for (int j = 0; j < op->nargs && !found; j++)
        found = op->args[j].tensor ? pattern_has(&op->args[j].pat, nm) : strcmp(op->args[j].name, nm) == 0;
      if (!found) {
        weft_diag *g = eval_error(c, d->loc, "dimension '%s' of the result of %s is bound by no argument", nm, n->name);
        diag_hint(g, &c->diags, "name it in an argument's shape, or add an attribute '%s'", nm);
        ok = false;
      }
    }
  }
  for (int i = 0; i < n->list2.n; i++) {
    const ast *s = n->list2.items[i];
    if (s->kind != S_ASSIGN || s->a->kind != E_NAME) {
      eval_error(c, s->loc, "an operator body holds only `key = expression` entries");
      ok = false;
      continue;
    }
    if (strcmp(s->a->name, "kind") == 0 && s->b->kind == E_STRING && s->b->list.n == 1 &&
        s->b->list.items[0]->kind == E_STRPART)
      op->kind = s->b->list.items[0]->text;
    if ((strcmp(s->a->name, "kernel") == 0 || strcmp(s->a->name, "kernel_backward") == 0) && !native_entry(c, e, op, s))
      ok = false;
  }
  op->native_dir = c->srcs.items[n->loc.file].dir;
  if (ok && !native_check(c, op)) ok = false;
  return ok ? op : NULL;
}

/* ---- names ---------------------------------------------------------------- */

static const char *full_name(weft_ctx *c, const char *rel) {
  mstate *m = M(c);
  return arena_printf(A(c), "%s%s", m->sc.prefixes[m->sc.nprefix - 1], rel);
}

static const char *tshow(weft_ctx *c, int t) { return tensor_type_str(A(c), &M(c)->sc.g->tensors[t]); }

/* ---- types ---------------------------------------------------------------- */

static bool eval_type(weft_ctx *c, env *e, const ast *ty, weft_dtype *dt, int *ndims, gdim **dims) {
  *dt = DT_F32;
  if (ty->a) {
    if (ty->a->kind == E_NAME && !env_lookup(e, ty->a->name)) {
      const char *names[DT_COUNT];
      for (int i = 0; i < DT_COUNT; i++) names[i] = dtype_names[i];
      const char *best = diag_closest(ty->a->name, names, DT_COUNT);
      weft_diag *g = eval_error(c, ty->a->loc, "unknown dtype '%s'", ty->a->name);
      if (best) diag_hint(g, &c->diags, "did you mean '%s'? dtypes are f32, bf16, f16 and i32", best);
      else diag_hint(g, &c->diags, "dtypes are f32, bf16, f16 and i32");
      return false;
    }
    value d = eval_expr(c, e, ty->a);
    if (d.kind == V_ERROR) return false;
    if (d.kind != V_DTYPE) {
      weft_diag *g = eval_error(c, ty->a->loc, "expected a dtype, got %s %s", value_kind_name(d.kind), value_repr(A(c), d));
      diag_hint(g, &c->diags, "dtypes are f32, bf16, f16 and i32");
      return false;
    }
    *dt = d.dt;
  }
  if (ty->list.n > MODEL_MAX_DIMS) {
    eval_error(c, ty->loc, "a tensor may have at most %d dimensions", MODEL_MAX_DIMS);
    return false;
  }
  *ndims = ty->list.n;
  *dims = arena_alloc(A(c), sizeof(gdim) * (size_t)(ty->list.n ? ty->list.n : 1));
  for (int i = 0; i < ty->list.n; i++) {
    const ast *x = ty->list.items[i];
    value v = eval_expr(c, e, x);
    if (v.kind == V_ERROR) return false;
    if (v.kind != V_INT || v.i <= 0) {
      eval_error(c, x->loc, "a dimension must be a positive integer, got %s %s", value_kind_name(v.kind), value_repr(A(c), v));
      return false;
    }
    (*dims)[i].size = v.i;
    (*dims)[i].name = x->kind == E_NAME ? x->name : NULL;
  }
  /* the element count must fit comfortably in 64 bits */
  double total = 1;
  for (int i = 0; i < *ndims; i++) total *= (double)(*dims)[i].size;
  if (total > 9e15) {
    eval_error(c, ty->loc, "the tensor has %.3g elements, more than weft supports", total);
    return false;
  }
  return true;
}

/* ---- operator calls --------------------------------------------------------- */

typedef struct binds {
  gbind *items;
  int n, cap;
} binds;

static gbind *bind_find(binds *b, const char *name) {
  for (int i = 0; i < b->n; i++)
    if (strcmp(b->items[i].name, name) == 0) return &b->items[i];
  return NULL;
}

static gbind *bind_add(weft_ctx *c, binds *b, const char *name, int n, const int64_t *sizes,
                       const char *const *names, const char *arg) {
  arena_grow(A(c), (void **)&b->items, &b->cap, b->n + 1, sizeof(gbind));
  gbind *g = &b->items[b->n++];
  g->name = name;
  g->n = n;
  g->sizes = arena_alloc(A(c), sizeof(int64_t) * (size_t)(n ? n : 1));
  g->dim_names = arena_alloc(A(c), sizeof(char *) * (size_t)(n ? n : 1));
  if (n) memcpy(g->sizes, sizes, sizeof(int64_t) * (size_t)n);
  if (n && names) memcpy(g->dim_names, names, sizeof(char *) * (size_t)n);
  g->dim_name = n == 1 ? g->dim_names[0] : NULL;
  g->arg = arg;
  return g;
}

static const char *signature_str(weft_ctx *c, const opdecl *op) {
  const ast *n = op->node;
  /* the signature as written: from the op's name to the end of its result */
  const weft_src *s = &c->srcs.items[n->loc.file];
  if (n->b && n->b->loc.end_line == n->loc.line) {
    int len;
    const char *line = src_line(s, n->loc.line, &len);
    int from = n->loc.col - 1 + 3, to = n->b->loc.end_col;
    while (from < len && line[from] == ' ') from++;
    if (from < to && to <= len) return arena_strndup(A(c), line + from, (size_t)(to - from));
  }
  return op->name;
}

/* Matches one tensor argument against its pattern, binding names. */
static bool match_arg(weft_ctx *c, const opdecl *op, const oparg *pa, int t, binds *b, weft_loc loc) {
  const gtensor *ten = &M(c)->sc.g->tensors[t];
  const oppattern *p = &pa->pat;
  if (p->has_dtype && ten->dtype != p->dtype) {
    weft_diag *g = eval_error(c, loc, "%s: argument %s must be %s, got %s", op->name, pa->name,
                              dtype_names[p->dtype], tshow(c, t));
    diag_hint(g, &c->diags, "signature: %s", signature_str(c, op));
    return false;
  }
  int fixed = 0, group = -1;
  for (int i = 0; i < p->ndims; i++) {
    if (p->dims[i].mark == T_DOTDOT) group = i;
    else fixed++;
  }
  int glen = ten->ndims - fixed;
  if ((group < 0 && ten->ndims != fixed) || glen < 0) {
    weft_diag *g = eval_error(c, loc, "%s: argument %s has %d dimension%s, %s, but the signature needs %s%d",
                              op->name, pa->name, ten->ndims, ten->ndims == 1 ? "" : "s", tshow(c, t),
                              group >= 0 ? "at least " : "", fixed);
    diag_hint(g, &c->diags, "signature: %s", signature_str(c, op));
    return false;
  }
  int td = 0;
  for (int i = 0; i < p->ndims; i++) {
    const opdim *d = &p->dims[i];
    if (d->mark == T_DOTDOT) {
      int64_t sizes[MODEL_MAX_DIMS];
      const char *names[MODEL_MAX_DIMS];
      for (int k = 0; k < glen; k++) { sizes[k] = ten->dims[td + k].size; names[k] = ten->dims[td + k].name; }
      gbind *have = bind_find(b, d->name);
      if (have) {
        bool same = have->n == glen;
        for (int k = 0; same && k < glen; k++) same = have->sizes[k] == sizes[k];
        if (!same) {
          weft_diag *g = eval_error(c, loc, "%s: the leading dimensions %s.. of %s differ from those of %s",
                                    op->name, d->name, pa->name, have->arg);
          diag_hint(g, &c->diags, "%s is %s", pa->name, tshow(c, t));
          return false;
        }
      } else {
        bind_add(c, b, d->name, glen, sizes, names, pa->name);
      }
      td += glen;
      continue;
    }
    const gdim *actual = &ten->dims[td++];
    if (d->name) {
      gbind *have = bind_find(b, d->name);
      if (have) {
        int64_t want = have->n == 1 ? have->sizes[0] : -1;
        if (have->n != 1 || want != actual->size) {
          const char *other = have->arg;
          weft_diag *g = eval_error(c, loc,
                                    "shape mismatch in %s: %s is %" PRId64 "%s%s%s in %s but %" PRId64 "%s%s%s in %s",
                                    op->name, d->name, want, have->dim_name ? " (" : "",
                                    have->dim_name ? have->dim_name : "", have->dim_name ? ")" : "", other,
                                    actual->size, actual->name ? " (" : "", actual->name ? actual->name : "",
                                    actual->name ? ")" : "", pa->name);
          diag_hint(g, &c->diags, "%s is %s; signature: %s", pa->name, tshow(c, t), signature_str(c, op));
          return false;
        }
        if (!have->dim_name) have->dim_name = actual->name;
      } else {
        bind_add(c, b, d->name, 1, &actual->size, &actual->name, pa->name);
      }
      continue;
    }
    /* a group (3 n dh): known factors divide the size, one unknown is solved */
    int64_t known = 1;
    int unknown = -1;
    for (int k = 0; k < d->nfactors; k++) {
      const opfactor *f = &d->factors[k];
      int64_t v = f->value;
      if (f->name) {
        gbind *have = bind_find(b, f->name);
        if (!have) {
          if (unknown >= 0) {
            weft_diag *g = eval_error(c, loc, "%s: cannot tell '%s' from '%s' in dimension %d of %s",
                                      op->name, d->factors[unknown].name, f->name, td, pa->name);
            diag_hint(g, &c->diags, "pass one of them as an attribute, e.g. %s = ...", f->name);
            return false;
          }
          unknown = k;
          continue;
        }
        v = have->sizes[0];
      }
      if (__builtin_mul_overflow(known, v, &known)) known = INT64_MAX;
    }
    if (unknown < 0 ? known != actual->size : (actual->size % known != 0)) {
      weft_diag *g = eval_error(c, loc, "%s: dimension %d of %s is %" PRId64 ", which does not %s %" PRId64,
                                op->name, td, pa->name, actual->size, unknown < 0 ? "equal" : "divide by", known);
      diag_hint(g, &c->diags, "%s is %s; signature: %s", pa->name, tshow(c, t), signature_str(c, op));
      return false;
    }
    if (unknown >= 0) {
      int64_t v = actual->size / known;
      bind_add(c, b, d->factors[unknown].name, 1, &v, NULL, pa->name);
    }
  }
  return true;
}

/* Evaluates the call arguments of an operator or sub-model: positional ones
 * (in order) and named ones, each to a value. */
typedef struct callargs {
  int n;
  const ast **nodes;
  value *vals;
} callargs;

static bool eval_args(weft_ctx *c, env *e, const ast *call, callargs *out) {
  out->n = call->list.n;
  out->nodes = arena_alloc(A(c), sizeof(ast *) * (size_t)(out->n ? out->n : 1));
  out->vals = arena_alloc(A(c), sizeof(value) * (size_t)(out->n ? out->n : 1));
  bool ok = true;
  for (int i = 0; i < out->n; i++) {
    out->nodes[i] = call->list.items[i];
    out->vals[i] = eval_expr(c, e, call->list.items[i]->a);
    if (out->vals[i].kind == V_ERROR) ok = false;
  }
  return ok;
}

/* Evaluates a key of the operator body with dimensions and attributes bound. */
static bool op_cost(weft_ctx *c, const opdecl *op, env *ce, const char *key, double *out, bool *found) {
  *found = false;
  for (int i = 0; i < op->node->list2.n; i++) {
    const ast *s = op->node->list2.items[i];
    if (strcmp(s->a->name, key) != 0) continue;
    *found = true;
    value v = eval_expr(c, ce, s->b);
    if (v.kind == V_ERROR) return false;
    unit_dim want = strcmp(key, "bytes") == 0 ? (unit_dim){.byte = 1} : (unit_dim){.flop = 1};
    if (v.kind == V_INT) *out = (double)v.i;
    else if (v.kind == V_FLOAT) *out = v.f;
    else if (v.kind == V_QUANTITY && unit_eq(v.q.d, want)) *out = v.q.v;
    else if (v.kind == V_QUANTITY) {
      char got[64];
      eval_error(c, s->b->loc, "%s of %s must be a number%s, got %s", key, op->name,
                 want.byte ? " or bytes" : " or FLOPs", unit_dim_name(v.q.d, got, sizeof got));
      return false;
    } else {
      eval_error(c, s->b->loc, "%s of %s must be a number, got %s", key, op->name, value_kind_name(v.kind));
      return false;
    }
    return true;
  }
  return true;
}

static int op_call(weft_ctx *c, env *e, const opdecl *op, const ast *call, const char *rel) {
  mstate *m = M(c);
  callargs ca;
  if (!eval_args(c, e, call, &ca)) return -1;
  int na = op->nargs;
  value *vals = arena_alloc(A(c), sizeof(value) * (size_t)(na ? na : 1));
  bool *have = arena_alloc(A(c), sizeof(bool) * (size_t)(na ? na : 1));
  weft_loc *argloc = arena_alloc(A(c), sizeof(weft_loc) * (size_t)(na ? na : 1));
  int pos = 0;
  bool named = false;
  for (int k = 0; k < ca.n; k++) {
    const ast *a = ca.nodes[k];
    int idx = -1;
    if (a->name) {
      named = true;
      for (int i = 0; i < na; i++)
        if (strcmp(op->args[i].name, a->name) == 0) idx = i;
      if (idx < 0) {
        const char *names[64];
        int nn = 0;
        for (int i = 0; i < na && nn < 64; i++) names[nn++] = op->args[i].name;
        const char *best = diag_closest(a->name, names, nn);
        weft_diag *g = eval_error(c, a->loc, "operator %s has no argument '%s'", op->name, a->name);
        if (best) diag_hint(g, &c->diags, "did you mean '%s'?", best);
        else diag_hint(g, &c->diags, "signature: %s", signature_str(c, op));
        return -1;
      }
    } else {
      if (named) { eval_error(c, a->loc, "a positional argument cannot follow a named one"); return -1; }
      if (pos >= na) {
        weft_diag *g = eval_error(c, a->loc, "too many arguments to %s (it takes %d)", op->name, na);
        diag_hint(g, &c->diags, "signature: %s", signature_str(c, op));
        return -1;
      }
      idx = pos++;
    }
    if (have[idx]) { eval_error(c, a->loc, "argument '%s' of %s is given twice", op->args[idx].name, op->name); return -1; }
    const oparg *pa = &op->args[idx];
    if (pa->tensor && ca.vals[k].kind != V_TENSOR) {
      weft_diag *g = eval_error(c, a->a->loc, "argument %s of %s must be a tensor, got %s %s", pa->name, op->name,
                                value_kind_name(ca.vals[k].kind), value_repr(A(c), ca.vals[k]));
      diag_hint(g, &c->diags, "signature: %s", signature_str(c, op));
      return -1;
    }
    if (!pa->tensor && (ca.vals[k].kind == V_TENSOR || ca.vals[k].kind == V_FN || ca.vals[k].kind == V_MODEL ||
                        ca.vals[k].kind == V_OPDECL || ca.vals[k].kind == V_CLUSTER)) {
      eval_error(c, a->a->loc, "attribute %s of %s cannot be a %s", pa->name, op->name, value_kind_name(ca.vals[k].kind));
      return -1;
    }
    vals[idx] = ca.vals[k];
    have[idx] = true;
    argloc[idx] = a->loc;
  }
  /* attributes: defaults; those named like dimensions bind them */
  binds b = {0};
  vrecord *attrs = arena_alloc(A(c), sizeof *attrs);
  attrs->keys = arena_alloc(A(c), sizeof(char *) * (size_t)(na ? na : 1));
  attrs->vals = arena_alloc(A(c), sizeof(value) * (size_t)(na ? na : 1));
  env *ce = env_new(A(c), op->closure);
  int ntens = 0;
  for (int i = 0; i < na; i++) {
    const oparg *pa = &op->args[i];
    if (pa->tensor) {
      if (!have[i]) {
        weft_diag *g = eval_error(c, call->loc, "%s needs a tensor for argument %s", op->name, pa->name);
        diag_hint(g, &c->diags, "signature: %s", signature_str(c, op));
        return -1;
      }
      ntens++;
      continue;
    }
    if (!have[i]) {
      if (!pa->def) {
        weft_diag *g = eval_error(c, call->loc, "%s needs a value for attribute %s", op->name, pa->name);
        diag_hint(g, &c->diags, "pass it by name: %s = ...", pa->name);
        return -1;
      }
      vals[i] = eval_expr(c, op->closure, pa->def);
      if (vals[i].kind == V_ERROR) return -1;
    }
    attrs->keys[attrs->n] = pa->name;
    attrs->vals[attrs->n++] = vals[i];
    env_define(A(c), ce, pa->name, vals[i], op->node->loc, false);
    bool is_dim = false;
    for (int j = 0; j < na && !is_dim; j++) is_dim = op->args[j].tensor && pattern_has(&op->args[j].pat, pa->name);
    if (is_dim || pattern_has(&op->result, pa->name)) {
      if (vals[i].kind != V_INT || vals[i].i <= 0) {
        eval_error(c, have[i] ? argloc[i] : call->loc, "attribute %s of %s names a dimension and must be a positive integer, got %s",
                   pa->name, op->name, value_show(A(c), vals[i]));
        return -1;
      }
      bind_add(c, &b, pa->name, 1, &vals[i].i, NULL, pa->name);
    }
  }
  int *inputs = arena_alloc(A(c), sizeof(int) * (size_t)(ntens ? ntens : 1));
  int ni = 0;
  weft_dtype dt = DT_F32;
  bool dt_set = false;
  for (int i = 0; i < na; i++) {
    const oparg *pa = &op->args[i];
    if (!pa->tensor) continue;
    int t = vals[i].tensor;
    if (!match_arg(c, op, pa, t, &b, argloc[i])) return -1;
    if (op->native_fwd && m->sc.g->tensors[t].dtype == DT_I32) {
      weft_diag *g = eval_error(c, argloc[i], "argument %s of %s is i32, but its native kernel works on f32 tensors", pa->name, op->name);
      diag_hint(g, &c->diags, "the kernel is called with float pointers; pass a floating-point tensor");
      return -1;
    }
    inputs[ni++] = t;
    env_define(A(c), ce, pa->name, vals[i], op->node->loc, false);
    if (!dt_set && dtype_is_float(m->sc.g->tensors[t].dtype)) { dt = m->sc.g->tensors[t].dtype; dt_set = true; }
  }
  if (op->result.has_dtype) dt = op->result.dtype;
  /* bind dimension names for the cost expressions: a group is its product */
  for (int i = 0; i < b.n; i++) {
    int64_t p = 1;
    for (int k = 0; k < b.items[i].n; k++)
      if (__builtin_mul_overflow(p, b.items[i].sizes[k], &p)) p = INT64_MAX;
    if (!env_lookup(ce, b.items[i].name) || !record_get(attrs, b.items[i].name))
      env_define(A(c), ce, b.items[i].name, v_int(p), op->node->loc, false);
  }
  /* the result's shape */
  gdim rd[MODEL_MAX_DIMS];
  int rn = 0;
  for (int i = 0; i < op->result.ndims; i++) {
    const opdim *d = &op->result.dims[i];
    if (d->name) {
      gbind *g = bind_find(&b, d->name);
      if (!g) { eval_error(c, call->loc, "%s: result dimension %s is unbound", op->name, d->name); return -1; }
      if (rn + g->n > MODEL_MAX_DIMS) { eval_error(c, call->loc, "%s: the result has too many dimensions", op->name); return -1; }
      for (int k = 0; k < g->n; k++) {
        rd[rn].size = g->sizes[k];
        rd[rn].name = g->dim_names[k];
        rn++;
      }
    } else {
      int64_t p = 1;
      const char *nm = NULL;
      for (int k = 0; k < d->nfactors; k++) {
        int64_t v = d->factors[k].value;
        if (d->factors[k].name) {
          gbind *g = bind_find(&b, d->factors[k].name);
          if (!g) { eval_error(c, call->loc, "%s: result dimension %s is unbound", op->name, d->factors[k].name); return -1; }
          v = g->sizes[0];
          if (d->nfactors == 1) nm = g->dim_name;
        }
        if (__builtin_mul_overflow(p, v, &p)) { eval_error(c, call->loc, "%s: result dimension overflows", op->name); return -1; }
      }
      if (rn >= MODEL_MAX_DIMS) { eval_error(c, call->loc, "%s: the result has too many dimensions", op->name); return -1; }
      rd[rn].size = p;
      rd[rn].name = nm;
      rn++;
    }
  }
  const char *name = full_name(c, rel);
  if (m->sc.g->nops >= MODEL_MAX_OPS) {
    weft_diag *g = eval_error(c, call->loc, "the model has more than %d operators", MODEL_MAX_OPS);
    diag_hint(g, &c->diags, "GPT-3 has about a thousand; a loop that makes many layers may count too many");
    return -1;
  }
  int t = graph_add_tensor(A(c), m->sc.g, name, TENSOR_ACT, dt, rn, rd, call->loc);
  if (t < 0) {
    int prev = graph_find(m->sc.g, name);
    weft_diag *g = eval_error(c, call->loc, "'%s' is already defined in model %s", name, m->model_name);
    if (prev >= 0) diag_hint(g, &c->diags, "the first definition is at line %d; names must be unique", m->sc.g->tensors[prev].loc.line);
    return -1;
  }
  int oi = gop_add(A(c), m->sc.g);
  gop *o = &m->sc.g->ops[oi];
  o->name = name;
  o->decl = op;
  o->ninputs = ni;
  o->inputs = inputs;
  o->output = t;
  o->attrs = attrs;
  o->nbinds = b.n;
  o->binds = b.items;
  o->loc = call->loc;
  o->kind = op->kind;
  m->sc.g->tensors[t].producer = oi;
  env_define(A(c), ce, "out", v_tensor(t), op->node->loc, false);
  bool found;
  double f = 0;
  if (!op_cost(c, op, ce, "flops", &f, &found)) return -1;
  o->flops = f;
  double by = 0;
  if (!op_cost(c, op, ce, "bytes", &by, &found)) return -1;
  if (!found) {
    by = (double)tensor_numel(&m->sc.g->tensors[t]) * dtype_bytes[dt];
    for (int i = 0; i < ni; i++) by += (double)tensor_numel(&m->sc.g->tensors[inputs[i]]) * dtype_bytes[m->sc.g->tensors[inputs[i]].dtype];
  }
  o->bytes = by;
  m->last_result = t;
  return t;
}

/* ---- statements ------------------------------------------------------------ */

static bool exec_stmt(weft_ctx *c, env *e, const ast *s);
static bool exec_body(weft_ctx *c, env *e, const ast_list *body);

static bool submodel_call(weft_ctx *c, env *e, vdecl *d, const ast *call, const char *rel) {
  mstate *m = M(c);
  if (c->depth >= 200) {
    eval_error(c, call->loc, "sub-models nested more than 200 deep");
    return false;
  }
  callargs ca;
  if (!eval_args(c, e, call, &ca)) return false;
  int *tensors = arena_alloc(A(c), sizeof(int) * (size_t)(ca.n ? ca.n : 1));
  int nt = 0, nnamed = 0;
  const ast **named = arena_alloc(A(c), sizeof(ast *) * (size_t)(ca.n ? ca.n : 1));
  for (int k = 0; k < ca.n; k++) {
    if (ca.nodes[k]->name) { named[nnamed++] = ca.nodes[k]; continue; }
    if (nnamed) { eval_error(c, ca.nodes[k]->loc, "a positional argument cannot follow a named one"); return false; }
    if (ca.vals[k].kind != V_TENSOR) {
      weft_diag *g = eval_error(c, ca.nodes[k]->loc, "positional arguments of model %s are its inputs and must be tensors, got %s",
                                d->name, value_kind_name(ca.vals[k].kind));
      diag_hint(g, &c->diags, "pass parameters by name: %s(x, NAME = ...)", d->name);
      return false;
    }
    tensors[nt++] = ca.vals[k].tensor;
  }
  env *me = env_new(A(c), d->closure);
  if (!eval_bind_named(c, d, nnamed, named, e, me, call->loc)) return false;
  mstate sub = {0};
  sub.sc.g = m->sc.g;
  sub.outer = m;
  sub.sc.prefixes[0] = arena_printf(A(c), "%s%s.", m->sc.prefixes[m->sc.nprefix - 1], rel);
  sub.sc.nprefix = 1;
  sub.model_name = d->name;
  sub.inputs = tensors;
  sub.ninputs = nt;
  sub.call = call;
  sub.output = -1;
  sub.last_result = -1;
  c->model = &sub.sc;
  c->depth++;
  bool ok = exec_body(c, me, &d->node->list2);
  c->depth--;
  c->model = &m->sc;
  if (!ok) return false;
  if (sub.next_input < nt) {
    eval_error(c, call->loc, "model %s takes %d input%s, got %d tensors", d->name, sub.next_input,
               sub.next_input == 1 ? "" : "s", nt);
    return false;
  }
  if (sub.train) {
    eval_error(c, sub.train->loc, "`train` is not allowed in model %s, used as a sub-model", d->name);
    return false;
  }
  if (sub.output < 0) {
    weft_diag *g = eval_error(c, call->loc, "model %s has no `output`, so it cannot be used as a sub-model", d->name);
    diag_hint(g, &c->diags, "add `output NAME` to its body");
    return false;
  }
  const char *name = full_name(c, rel);
  if (!graph_alias(A(c), m->sc.g, name, sub.output)) {
    eval_error(c, call->loc, "'%s' is already defined in model %s", name, m->model_name);
    return false;
  }
  m->last_result = sub.last_result;
  return true;
}

static bool model_stmt(weft_ctx *c, void *ud, env *e, const ast *s) {
  (void)ud;
  return exec_stmt(c, e, s);
}
static const eval_body model_body = {model_stmt, NULL};

static bool exec_body(weft_ctx *c, env *e, const ast_list *body) { return eval_run_body(c, &model_body, e, body); }


/* A tensor named like a value in scope could never be referred to: the
 * value would be found first. */
static bool name_free(weft_ctx *c, env *e, const ast *target) {
  if (target->kind != E_NAME) return true;
  binding *b = env_lookup(e, target->name);
  if (!b) return true;
  weft_diag *g = eval_error(c, target->loc, "'%s' already names %s %s here; a tensor cannot take its name",
                            target->name, value_kind_name(b->val.kind), value_repr(&c->arena, b->val));
  diag_hint(g, &c->diags, "choose another name, e.g. '%s_out'", target->name);
  return false;
}

static bool declare_tensor(weft_ctx *c, env *e, const ast *s) {
  mstate *m = M(c);
  bool failed = false;
  if (!name_free(c, e, s->a)) return false;
  const char *rel = eval_path(c, e, s->a, &failed);
  if (failed) return false;
  weft_dtype dt;
  int nd;
  gdim *dims;
  if (!eval_type(c, e, s->b, &dt, &nd, &dims)) return false;
  const char *name = full_name(c, rel);
  if (s->kind == S_INPUT && m->outer) {
    /* a sub-model's input is the tensor its caller passed */
    if (m->next_input >= m->ninputs) {
      weft_diag *g = eval_error(c, m->call->loc, "model %s needs a tensor for input %s", m->model_name, rel);
      diag_hint(g, &c->diags, "inputs are passed by position: %s(x, ...)", m->model_name);
      return false;
    }
    int t = m->inputs[m->next_input++];
    const gtensor *have = &m->sc.g->tensors[t];
    bool same = have->dtype == dt && have->ndims == nd;
    for (int i = 0; same && i < nd; i++) same = have->dims[i].size == dims[i].size;
    if (!same) {
      gtensor want = {.dtype = dt, .ndims = nd, .dims = dims};
      weft_diag *g = eval_error(c, m->call->loc, "input %s of model %s must be %s, got %s", rel, m->model_name,
                                tensor_type_str(A(c), &want), tensor_type_str(A(c), have));
      diag_hint(g, &c->diags, "the input is declared at %s:%d", c->srcs.items[s->loc.file].path, s->loc.line);
      return false;
    }
    if (!graph_alias(A(c), m->sc.g, name, t)) {
      eval_error(c, s->loc, "'%s' is already defined in model %s", name, m->model_name);
      return false;
    }
    return true;
  }
  if (graph_add_tensor(A(c), m->sc.g, name, s->kind == S_INPUT ? TENSOR_INPUT : TENSOR_PARAM, dt, nd, dims, s->loc) < 0) {
    int prev = graph_find(m->sc.g, name);
    weft_diag *g = eval_error(c, s->loc, "'%s' is already defined in model %s", name, m->model_name);
    if (prev >= 0) diag_hint(g, &c->diags, "the first definition is at line %d", m->sc.g->tensors[prev].loc.line);
    return false;
  }
  return true;
}

static void not_in_model(weft_ctx *c, const ast *s) {
  const char *what = ast_kind_names[s->kind];
  switch (s->kind) {
  case S_USE: what = "`use`"; break;
  case S_PARAM: what = "a top-level `param NAME = value`"; break;
  case S_FN: what = "`fn`"; break;
  case S_OP: what = "`op`"; break;
  case S_MODEL: case S_MODELDEF: what = "`model`"; break;
  case S_CLUSTER: what = "`cluster`"; break;
  case S_DEVICE: what = "`device`"; break;
  case S_LINK: what = "`link`"; break;
  case S_SEARCH: what = "`search`"; break;
  default: break;
  }
  weft_diag *g = eval_error(c, s->loc, "%s is not allowed in a model body", what);
  if (s->kind == S_SEARCH) diag_hint(g, &c->diags, "it belongs in a plan");
  else if (s->kind == S_PARAM) diag_hint(g, &c->diags, "a model parameter is `param NAME : TYPE`");
  else if (s->kind == S_USE || s->kind == S_FN || s->kind == S_OP || s->kind == S_MODEL || s->kind == S_MODELDEF ||
           s->kind == S_CLUSTER)
    diag_hint(g, &c->diags, "move it to the top level of the file");
}

static bool exec_stmt(weft_ctx *c, env *e, const ast *s) {
  mstate *m = M(c);
  if (!eval_step(c, s->loc)) return false;
  bool handled, ok = eval_control(c, &model_body, e, s, &handled);
  if (handled) return ok;
  switch (s->kind) {
  case S_INPUT: case S_TPARAM: return declare_tensor(c, e, s);
  case S_ASSIGN: {
    bool failed = false;
    if (!name_free(c, e, s->a)) return false;
    const char *rel = eval_path(c, e, s->a, &failed);
    if (failed) return false;
    if (s->b->kind == E_CALL) {
      value f = eval_expr(c, e, s->b->a);
      if (f.kind == V_ERROR) return false;
      if (f.kind == V_OPDECL) return op_call(c, e, f.op, s->b, rel) >= 0;
      if (f.kind == V_MODEL) return submodel_call(c, e, f.decl, s->b, rel);
    }
    value v = eval_expr(c, e, s->b);
    if (v.kind == V_ERROR) return false;
    if (v.kind == V_TENSOR) {
      const char *name = full_name(c, rel);
      if (!graph_alias(A(c), m->sc.g, name, v.tensor)) {
        eval_error(c, s->loc, "'%s' is already defined in model %s", name, m->model_name);
        return false;
      }
      return true;
    }
    weft_diag *g = eval_error(c, s->b->loc, "`%s = ...` in a model needs an operator call or a tensor, got %s %s", rel,
                              value_kind_name(v.kind), value_repr(A(c), v));
    diag_hint(g, &c->diags, "use `let %s = ...` for other values", rel);
    return false;
  }
  case S_BLOCK: {
    bool failed = false;
    const char *rel = eval_path(c, e, s->a, &failed);
    if (failed) return false;
    if (m->sc.nprefix >= MODEL_MAX_PREFIX) { eval_error(c, s->loc, "blocks nested too deep"); return false; }
    const char *pre = arena_printf(A(c), "%s%s.", m->sc.prefixes[m->sc.nprefix - 1], rel);
    m->sc.prefixes[m->sc.nprefix++] = pre;
    bool ok = exec_body(c, env_new(A(c), e), &s->list);
    m->sc.nprefix--;
    return ok;
  }
  case S_OUTPUT: {
    value v = eval_expr(c, e, s->a);
    if (v.kind == V_ERROR) return false;
    if (v.kind != V_TENSOR) {
      eval_error(c, s->a->loc, "`output` needs a tensor, got %s %s", value_kind_name(v.kind), value_repr(A(c), v));
      return false;
    }
    if (m->output >= 0) { eval_error(c, s->loc, "model %s has two `output` statements", m->model_name); return false; }
    m->output = v.tensor;
    return true;
  }
  case S_TRAIN:
    if (m->train) {
      eval_error(c, s->loc, "model %s has two `train` statements", m->model_name);
      return false;
    }
    m->train = s;
    m->train_env = e;
    return true;
  default:
    not_in_model(c, s);
    return false;
  }
}

/* Statement kinds are checked when a model is defined, so that a model that
 * is never built still gets its misplaced statements reported. */
static bool check_kinds(weft_ctx *c, const ast_list *body) {
  bool ok = true;
  for (int i = 0; i < body->n; i++) {
    const ast *s = body->items[i];
    switch (s->kind) {
    case S_INPUT: case S_TPARAM: case S_LET: case S_ASSIGN: case S_OUTPUT: case S_TRAIN: case S_ASSERT: break;
    case S_BLOCK: case S_FOR: if (!check_kinds(c, &s->list)) ok = false; break;
    case S_IF:
      if (!check_kinds(c, &s->list) || !check_kinds(c, &s->list2)) ok = false;
      if (s->b) { ast_list one = {(ast **)&s->b, 1, 1}; if (!check_kinds(c, &one)) ok = false; }
      break;
    default:
      not_in_model(c, s);
      ok = false;
    }
  }
  return ok;
}

bool model_check_decl(weft_ctx *c, const ast *n) { return check_kinds(c, &n->list2); }

/* ---- building a graph --------------------------------------------------------- */

/* The settings of mixed precision that every optimizer takes beside its
 * own: `grads = DTYPE` (the dtype parameter gradients are accumulated and
 * reduced in) and `master = true | false | f32` (f32 master weights for
 * 16-bit parameters). */
static bool train_precision(weft_ctx *c, mstate *m, const ast *a, int *grad_dtype, int *master) {
  bool grads = strcmp(a->name, "grads") == 0;
  if ((grads ? *grad_dtype : *master) >= 0) {
    eval_error(c, a->loc, "setting '%s' is given twice", a->name);
    return false;
  }
  value v = eval_expr(c, m->train_env, a->a);
  if (v.kind == V_ERROR) return false;
  if (grads) {
    if (v.kind != V_DTYPE || !dtype_is_float(v.dt)) {
      weft_diag *d = eval_error(c, a->a->loc, "`grads` is the dtype gradients of parameters are kept in, got %s",
                                value_show(A(c), v));
      diag_hint(d, &c->diags, "f32, bf16 or f16; without it, bf16 parameters have f32 gradients and others their own dtype");
      return false;
    }
    *grad_dtype = (int)v.dt;
    return true;
  }
  if (v.kind == V_BOOL) *master = v.i ? 1 : 0;
  else if (v.kind == V_DTYPE && v.dt == DT_F32) *master = 1;
  else {
    weft_diag *d = eval_error(c, a->a->loc, "`master` says whether 16-bit parameters have master weights in f32, got %s",
                              value_show(A(c), v));
    diag_hint(d, &c->diags, "master = true (or f32), or master = false");
    return false;
  }
  return true;
}

static bool bind_train(weft_ctx *c, mstate *m) {
  const ast *s = m->train;
  weft_graph *g = m->sc.g;
  if (s->a->kind != E_CALL) {
    weft_diag *d = eval_error(c, s->a->loc, "`train` needs an optimizer call");
    diag_hint(d, &c->diags, "for example: train adamw(lr = 3e-4)");
    return false;
  }
  value f = eval_expr(c, m->train_env, s->a->a);
  if (f.kind == V_ERROR) return false;
  if (f.kind != V_OPDECL || !f.op->kind || strcmp(f.op->kind, "optimizer") != 0) {
    weft_diag *d = eval_error(c, s->a->a->loc, "`train` needs an optimizer, got %s", value_show(A(c), f));
    diag_hint(d, &c->diags, "the standard optimizers are sgd and adamw");
    return false;
  }
  const opdecl *op = f.op;
  vrecord *r = arena_alloc(A(c), sizeof *r);
  r->keys = arena_alloc(A(c), sizeof(char *) * (size_t)(op->nargs ? op->nargs : 1));
  r->vals = arena_alloc(A(c), sizeof(value) * (size_t)(op->nargs ? op->nargs : 1));
  int grad_dtype = -1, master = -1;
  for (int k = 0; k < s->a->list.n; k++) {
    const ast *a = s->a->list.items[k];
    if (a->name && (strcmp(a->name, "grads") == 0 || strcmp(a->name, "master") == 0)) {
      if (!train_precision(c, m, a, &grad_dtype, &master)) return false;
      continue;
    }
    const oparg *pa = NULL;
    for (int i = 0; i < op->nargs; i++)
      if (!op->args[i].tensor && a->name && strcmp(op->args[i].name, a->name) == 0) pa = &op->args[i];
    if (!pa) {
      if (!a->name) eval_error(c, a->loc, "optimizer arguments are given by name: %s(lr = ...)", op->name);
      else {
        const char *names[64];
        int nn = 0;
        for (int i = 0; i < op->nargs && nn < 64; i++)
          if (!op->args[i].tensor) names[nn++] = op->args[i].name;
        const char *best = diag_closest(a->name, names, nn);
        weft_diag *d = eval_error(c, a->loc, "optimizer %s has no setting '%s'", op->name, a->name);
        if (best) diag_hint(d, &c->diags, "did you mean '%s'?", best);
      }
      return false;
    }
    if (record_get(r, a->name)) { eval_error(c, a->loc, "setting '%s' is given twice", a->name); return false; }
    value v = eval_expr(c, m->train_env, a->a);
    if (v.kind == V_ERROR) return false;
    if (v.kind != V_INT && v.kind != V_FLOAT && v.kind != V_BOOL && v.kind != V_STRING) {
      eval_error(c, a->a->loc, "setting %s of %s must be a number, got %s", a->name, op->name, value_kind_name(v.kind));
      return false;
    }
    r->keys[r->n] = a->name;
    r->vals[r->n++] = v;
  }
  for (int i = 0; i < op->nargs; i++) {
    const oparg *pa = &op->args[i];
    if (pa->tensor || record_get(r, pa->name)) continue;
    if (!pa->def) {
      eval_error(c, s->loc, "optimizer %s needs a value for %s", op->name, pa->name);
      return false;
    }
    value v = eval_expr(c, op->closure, pa->def);
    if (v.kind == V_ERROR) return false;
    r->keys[r->n] = pa->name;
    r->vals[r->n++] = v;
  }
  int loss = m->output >= 0 ? m->output : m->last_result;
  if (loss < 0) {
    eval_error(c, s->loc, "model %s has no operator whose result could be the loss", m->model_name);
    return false;
  }
  if (g->tensors[loss].ndims != 0) {
    weft_diag *d = eval_error(c, s->loc, "the loss must be a scalar, but %s is %s", g->tensors[loss].name,
                              tensor_type_str(A(c), &g->tensors[loss]));
    diag_hint(d, &c->diags, "end the model with a loss operator such as mse or cross_entropy");
    return false;
  }
  /* the state tensors it keeps per parameter element: its `state` entry,
   * evaluated with the settings (sgd keeps momentum only when it has some) */
  int state = 0;
  env *se = env_new(A(c), op->closure);
  for (int i = 0; i < r->n; i++) env_define(A(c), se, r->keys[i], r->vals[i], s->loc, false);
  for (int i = 0; i < op->node->list2.n; i++) {
    const ast *x = op->node->list2.items[i];
    if (strcmp(x->a->name, "state") != 0) continue;
    value v = eval_expr(c, se, x->b);
    if (v.kind == V_ERROR) return false;
    if (v.kind != V_INT || v.i < 0 || v.i > 8) {
      eval_error(c, x->b->loc, "state of %s counts the state tensors per parameter (0 to 8), got %s", op->name,
                 value_repr(A(c), v));
      return false;
    }
    state = (int)v.i;
  }
  g->loss = loss;
  g->optimizer_state = state;
  g->grad_dtype = grad_dtype;
  g->master = master;
  g->optimizer = op->name;
  g->optimizer_decl = op;
  g->optimizer_args = r;
  return true;
}

/* A trained model needs the backward of every operator that passes a
 * gradient on: one with a floating-point argument that is not a model input
 * (docs/program.md: the backward's outputs). A native kernel without
 * `kernel_backward` cannot give it; said once per operator declaration. */
static bool check_native_backward(weft_ctx *c, const weft_graph *g) {
  bool ok = true;
  const opdecl **said = NULL;
  int nsaid = 0, saidcap = 0;
  for (int i = 0; i < g->nops; i++) {
    const gop *o = &g->ops[i];
    const opdecl *d = o->decl;
    if (!d->native_fwd || d->native_bwd) continue;
    bool first = true;
    for (int j = 0; j < nsaid && first; j++) first = said[j] != d;
    if (!first) continue;
    const char *arg = NULL, *tensor = NULL;
    for (int k = 0, t = 0; k < d->nargs && !arg; k++) {
      if (!d->args[k].tensor) continue;
      const gtensor *x = &g->tensors[o->inputs[t++]];
      if (x->role != TENSOR_INPUT && dtype_is_float(x->dtype)) { arg = d->args[k].name; tensor = x->name; }
    }
    if (!arg) continue;
    arena_grow(A(c), (void **)&said, &saidcap, nsaid + 1, sizeof *said);
    said[nsaid++] = d;
    weft_diag *e = eval_error(c, o->loc, "operator %s has a native `kernel` but no `kernel_backward`, and model %s needs the gradient of its argument %s (%s)",
                              d->name, g->name, arg, tensor);
    diag_hint(e, &c->diags, "add kernel_backward = \"LIB:SYMBOL\" to %s at %s:%d", d->name,
              c->srcs.items[d->native_loc.file].path, d->native_loc.line);
    ok = false;
  }
  return ok;
}

/* Whether two model values are the same model with the same arguments:
 * then they build the same graph. */
static bool same_model(const vdecl *a, const vdecl *b) {
  if (a == b) return true;
  if (a->node != b->node || a->closure != b->closure || strcmp(a->name, b->name) != 0) return false;
  if (!a->bound || !b->bound) return !a->bound && !b->bound;
  value x = {.kind = V_RECORD, .rec = a->bound}, y = {.kind = V_RECORD, .rec = b->bound};
  return value_equal(x, y);
}

weft_graph *weft_build_graph(weft_ctx *c, value model, weft_loc use) {
  vdecl *d = model.decl;
  /* a graph is immutable once built: a model's plans share it */
  for (int i = 0; i < c->nbuilt; i++)
    if (same_model(c->built[i].decl, d)) return c->built[i].g;
  env *me = env_new(A(c), d->closure);
  if (!eval_bind_decl(c, d, me, use)) return NULL;
  mstate m = {0};
  m.sc.g = graph_new(A(c), d->name);
  m.sc.prefixes[0] = "";
  m.sc.nprefix = 1;
  m.model_name = d->name;
  m.output = -1;
  m.last_result = -1;
  model_scope *saved = c->model;
  c->model = &m.sc;
  int before = c->diags.errors;
  bool ok = exec_body(c, me, &d->node->list2);
  if (ok && m.train) ok = bind_train(c, &m) && check_native_backward(c, m.sc.g);
  c->model = saved;
  if (!ok || c->diags.errors > before) {
    /* errors inside an imported model: say which use of it failed */
    bool elsewhere = false;
    for (int i = 0; i < c->diags.n; i++)
      if (c->diags.items[i].seq >= 0 && c->diags.items[i].loc.line && c->diags.items[i].loc.file != use.file)
        elsewhere = true;
    if (use.line && elsewhere)
      diag_add(&c->diags, DIAG_NOTE, use, "while building model %s", d->name);
    return NULL;
  }
  m.sc.g->output = m.output;
  arena_grow(A(c), (void **)&c->built, &c->bcap, c->nbuilt + 1, sizeof(weft_built_graph));
  c->built[c->nbuilt++] = (weft_built_graph){d, m.sc.g};
  return m.sc.g;
}
