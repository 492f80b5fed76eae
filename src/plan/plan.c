/* plan.c - evaluates `plan` blocks and strategies into the plan IR: meshes,
 * split trees, stages, and the device of every sub-operator. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "weft/deps.h"
#include "weft/plan.h"
#include "base/prof.h"
#include "eval/eval.h"

/* A recorded `assign`: applied once every split is known. */
typedef struct passign {
  int nops;
  int *ops;
  const ast *expr;
  env *e;
  weft_loc loc;
} passign;

/* The plan under evaluation. */
typedef struct pstate {
  weft_plan *p;
  passign *assigns;
  int nassigns, acap;
  int unnamed;            /* counter for "#1", "#2" axes */
  int depth;              /* strategy call depth */
} pstate;

static arena *A(weft_ctx *c) { return &c->arena; }

enum { PLAN_MAX_SUBS = 1 << 20, PLAN_MAX_TOTAL_SUBS = 1 << 24 };

/* ---- selectors ---------------------------------------------------------------- */

typedef struct opset {
  int n, cap;
  int *ops;
  bool *in;               /* per graph operator */
} opset;

static void opset_init(weft_ctx *c, const weft_plan *p, opset *s) {
  memset(s, 0, sizeof *s);
  s->in = arena_alloc(A(c), sizeof(bool) * (size_t)(p->g->nops ? p->g->nops : 1));
}

static void opset_add(weft_ctx *c, opset *s, int op) {
  if (s->in[op]) return;
  s->in[op] = true;
  arena_grow(A(c), (void **)&s->ops, &s->cap, s->n + 1, sizeof(int));
  s->ops[s->n++] = op;
}

/* Matches a dotted name against a pattern of segments, where "*" is one
 * segment and "**" any number (zero included). */
static bool glob_match(const char *const *pat, int np, const char *name) {
  if (np == 0) return *name == 0;
  if (strcmp(pat[0], "**") == 0) {
    if (glob_match(pat + 1, np - 1, name)) return true;
    for (const char *s = name; *s; s++)
      if (*s == '.' && glob_match(pat, np, s + 1)) return true;
    return *name && glob_match(pat + 1, np - 1, "");
  }
  const char *dot = strchr(name, '.');
  size_t len = dot ? (size_t)(dot - name) : strlen(name);
  if (*name == 0) return false;
  if (strcmp(pat[0], "*") != 0 && (strlen(pat[0]) != len || strncmp(pat[0], name, len) != 0)) return false;
  return glob_match(pat + 1, np - 1, dot ? dot + 1 : name + len);
}

/* The segments of a selector path; NULL after a diagnostic. */
static bool path_segments(weft_ctx *c, env *e, const ast *n, const char **segs, int *ns) {
  if (n->kind == E_NAME) {
    if (*ns >= 64) return false;
    segs[(*ns)++] = n->name;
    return true;
  }
  if (n->kind != E_MEMBER) {
    eval_error(c, n->loc, "a selector is an operator name, a glob such as h.*.mlp, all, a stage, or h[0..6]");
    return false;
  }
  if (!path_segments(c, e, n->a, segs, ns)) return false;
  if (*ns >= 64) { eval_error(c, n->loc, "a selector has too many segments"); return false; }
  if (n->name) { segs[(*ns)++] = n->name; return true; }
  if (n->b->kind == E_INT && n->op != '{') { segs[(*ns)++] = arena_printf(A(c), "%" PRId64, n->b->ival); return true; }
  value v = eval_expr(c, e, n->b);
  if (v.kind == V_ERROR) return false;
  if (v.kind != V_INT && v.kind != V_STRING) {
    eval_error(c, n->b->loc, "a selector segment must be an integer or a name, got %s", value_kind_name(v.kind));
    return false;
  }
  segs[(*ns)++] = v.kind == V_INT ? arena_printf(A(c), "%" PRId64, v.i) : v.s;
  return true;
}

static int select_pattern(weft_ctx *c, const weft_plan *p, const char **segs, int ns, bool prefix, opset *out) {
  int found = 0;
  const char *pat[66];
  for (int i = 0; i < ns; i++) pat[i] = segs[i];
  for (int op = 0; op < p->g->nops; op++) {
    const char *name = p->g->ops[op].name;
    bool m = glob_match(pat, ns, name);
    if (!m && prefix) {
      pat[ns] = "**";
      m = glob_match(pat, ns + 1, name);
    }
    if (m) { opset_add(c, out, op); found++; }
  }
  return found;
}

static bool select_atom(weft_ctx *c, env *e, const weft_plan *p, const ast *atom, opset *out) {
  const char *segs[66];
  int ns = 0;
  if (atom->kind == E_NAME && strcmp(atom->name, "all") == 0) {
    for (int op = 0; op < p->g->nops; op++) opset_add(c, out, op);
    return true;
  }
  if (atom->kind == E_NAME) {
    for (int i = 0; i < p->nstages; i++)
      if (strcmp(p->stages[i].name, atom->name) == 0) {
        for (int k = 0; k < p->stages[i].nops; k++) opset_add(c, out, p->stages[i].ops[k]);
        return true;
      }
  }
  if (atom->kind == E_INDEX) {
    /* h[0..6]: the instances h.0 ... h.5 */
    if (!atom->b) { eval_error(c, atom->loc, "a selector takes one range: h[0..6]"); return false; }
    if (!path_segments(c, e, atom->a, segs, &ns)) return false;
    value r = eval_expr(c, e, atom->b);
    if (r.kind == V_ERROR) return false;
    int64_t lo, hi;
    if (r.kind == V_RANGE) { lo = r.r.lo; hi = r.r.hi; }
    else if (r.kind == V_INT) { lo = r.i; hi = r.i + 1; }
    else {
      eval_error(c, atom->b->loc, "a selector index must be a range or an integer, got %s", value_kind_name(r.kind));
      return false;
    }
    int found = 0;
    /* no model has more instances than operators: a huge range ends there */
    if (lo < 0) lo = 0;
    if (hi > lo + p->g->nops) hi = lo + p->g->nops;
    for (int64_t i = lo; i < hi && ns < 64; i++) {
      segs[ns] = arena_printf(A(c), "%" PRId64, i);
      found += select_pattern(c, p, segs, ns + 1, true, out);
    }
    if (!found) {
      eval_error(c, atom->loc, "selector matches no operator");
      return false;
    }
    return true;
  }
  if (!path_segments(c, e, atom, segs, &ns)) return false;
  if (select_pattern(c, p, segs, ns, true, out)) return true;
  /* nothing: suggest the closest operator name */
  size_t len = 0;
  for (int i = 0; i < ns; i++) len += strlen(segs[i]) + 1;
  char *text = arena_alloc(A(c), len + 1);
  for (int i = 0; i < ns; i++) { if (i) strcat(text, "."); strcat(text, segs[i]); }
  const char **names = arena_alloc(A(c), sizeof(char *) * (size_t)(p->g->nops + p->nstages + 1));
  int nn = 0;
  for (int op = 0; op < p->g->nops; op++) names[nn++] = p->g->ops[op].name;
  for (int i = 0; i < p->nstages; i++) names[nn++] = p->stages[i].name;
  const char *best = diag_closest(text, names, nn);
  weft_diag *g = eval_error(c, atom->loc, "'%s' matches no operator of model %s", text, p->g->name);
  if (best) diag_hint(g, &c->diags, "did you mean '%s'?", best);
  else diag_hint(g, &c->diags, "`weft graph` lists the operators; globs: h.*.mlp, h.**");
  return false;
}

static bool select_ops(weft_ctx *c, env *e, const weft_plan *p, const ast *sel, opset *out) {
  opset_init(c, p, out);
  bool ok = true;
  for (int i = 0; i < sel->list.n; i++)
    if (!select_atom(c, e, p, sel->list.items[i], out)) ok = false;
  return ok;
}

/* ---- statements ------------------------------------------------------------------ */

static bool exec_plan_body(weft_ctx *c, pstate *ps, env *e, const ast_list *body);

static bool count_of(weft_ctx *c, env *e, const ast *x, int *out) {
  value v = eval_expr(c, e, x);
  if (v.kind == V_ERROR) return false;
  if (v.kind != V_INT || v.i < 1 || v.i > 1000000) {
    eval_error(c, x->loc, "a count must be a positive integer, got %s %s", value_kind_name(v.kind), value_repr(A(c), v));
    return false;
  }
  *out = (int)v.i;
  return true;
}

/* The axis a level is named by: `as AXIS`, else the count when it is a plain
 * name (`into tp`), else "#k". */
static const char *axis_name(pstate *ps, weft_ctx *c, const ast *s) {
  if (s->text) return s->text;
  if (s->b->kind == E_NAME) return s->b->name;
  return arena_printf(A(c), "#%d", ++ps->unnamed);
}

static void add_split(weft_ctx *c, popplan *pp, psplit sp) {
  psplit *n = arena_alloc(A(c), sizeof(psplit) * (size_t)(pp->nsplits + 1));
  if (pp->nsplits) memcpy(n, pp->splits, sizeof(psplit) * (size_t)pp->nsplits);
  n[pp->nsplits++] = sp;
  pp->splits = n;
}

/* The idim of op that DIM names: a signature name, or a model dimension name. */
static int find_idim(weft_ctx *c, const weft_plan *p, int op, const char *dim, weft_loc loc) {
  const opspace *sp = p->ops[op].space;
  int sig = -1, model = -1, nmodel = 0;
  for (int i = 0; i < sp->nidims; i++) {
    const idim *d = &sp->idims[i];
    if (strcmp(d->sig, dim) == 0 && d->elem == 0 && sig < 0) sig = i;
    if (d->dim_name && strcmp(d->dim_name, dim) == 0) { if (model < 0) model = i; nmodel++; }
  }
  if (sig >= 0) {
    /* a group `b..` is named by its elements' model names, not by b */
    bool group = false;
    for (int i = 0; i < sp->nidims; i++) group |= strcmp(sp->idims[i].sig, dim) == 0 && sp->idims[i].elem > 0;
    if (!group) return sig;
  }
  if (nmodel == 1) return model;
  char list[512];
  size_t o = 0;
  list[0] = 0;
  for (int i = 0; i < sp->nidims && o < sizeof list - 64; i++) {
    const idim *d = &sp->idims[i];
    if (d->nosplit && !d->dim_name && strchr(d->sig, '@')) continue;
    const char *nm = nmodel > 1 ? (d->elem ? arena_printf(A(c), "%s[%d]", d->sig, d->elem) : d->sig)
                                 : (d->dim_name ? d->dim_name : d->sig);
    o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", o ? ", " : "", nm);
  }
  weft_diag *g = nmodel > 1
      ? eval_error(c, loc, "operator %s has several dimensions named '%s'", p->g->ops[op].name, dim)
      : eval_error(c, loc, "operator %s has no dimension '%s'", p->g->ops[op].name, dim);
  diag_hint(g, &c->diags, nmodel > 1 ? "name it by the operator's signature instead: %s" : "its dimensions: %s", list);
  return -1;
}

/* The size of the part of idim d that the levels so far leave to a leaf. */
static int64_t part_size(const popplan *pp, int d) {
  int64_t size = pp->space->idims[d].size;
  for (int i = 0; i < pp->nsplits; i++)
    if (pp->splits[i].idim == d) size /= pp->splits[i].parts;
  return size;
}

static bool exec_split(weft_ctx *c, pstate *ps, env *e, const ast *s) {
  weft_plan *p = ps->p;
  opset set;
  if (!select_ops(c, e, p, s->a, &set)) return false;
  int parts;
  if (!count_of(c, e, s->b, &parts)) return false;
  const char *axis = s->kind == S_REPLICATE ? axis_name(ps, c, s) : axis_name(ps, c, s);
  for (int k = 0; k < set.n; k++) {
    int op = set.ops[k];
    popplan *pp = &p->ops[op];
    for (int i = 0; i < pp->nsplits; i++)
      if (strcmp(pp->splits[i].axis, axis) == 0) {
        weft_diag *g = eval_error(c, s->loc, "operator %s is already split along axis '%s'", p->g->ops[op].name, axis);
        diag_hint(g, &c->diags, "the first split is at line %d; name this level with `as AXIS`", pp->splits[i].loc.line);
        return false;
      }
    int64_t count = parts;
    for (int i = 0; i < pp->nsplits; i++) count *= pp->splits[i].parts;
    if (count > PLAN_MAX_SUBS) {
      weft_diag *g = eval_error(c, s->loc, "operator %s would have %" PRId64 " sub-operators, more than weft supports (%d)",
                                p->g->ops[op].name, count, PLAN_MAX_SUBS);
      diag_hint(g, &c->diags, "the product of the parts of an operator's levels is its number of sub-operators");
      return false;
    }
    psplit sp = {.kind = SPLIT_REPLICA, .idim = -1, .parts = parts, .axis = axis, .loc = s->loc};
    if (s->kind == S_SPLIT) {
      int d = find_idim(c, p, op, s->name, s->loc);
      if (d < 0) return false;
      const idim *id = &pp->space->idims[d];
      if (id->nosplit) {
        weft_diag *g = eval_error(c, s->loc, "dimension %s of %s cannot be split", id->dim_name ? id->dim_name : id->sig,
                                  p->g->ops[op].name);
        diag_hint(g, &c->diags, "its signature marks it '^': %s needs it whole", p->g->ops[op].decl->name);
        return false;
      }
      if (id->reduce && s->ival) {
        eval_error(c, s->loc, "dimension %s of %s is a reduction: it cannot be split in time",
                   id->dim_name ? id->dim_name : id->sig, p->g->ops[op].name);
        return false;
      }
      int64_t size = part_size(pp, d);
      if (size % parts != 0) {
        weft_diag *g = eval_error(c, s->loc, "%s: %s = %" PRId64 " is not divisible by %d", p->g->ops[op].name,
                                  id->dim_name ? id->dim_name : id->sig, size, parts);
        diag_hint(g, &c->diags, "every part of a split has the same size");
        return false;
      }
      /* a dimension the result lacks is summed over (k+ of matmul, the batch
       * of a loss): its parts hold partial sums */
      bool in_result = false;
      const tmap *om = &pp->space->output;
      for (int t = 0; t < om->ndims && !in_result; t++)
        for (int f = 0; f < om->nfactors[t] && !in_result; f++) in_result = om->factors[t][f] == d;
      sp.idim = d;
      sp.kind = s->ival ? SPLIT_TIME : (id->reduce || !in_result) ? SPLIT_VALUE : SPLIT_DIM;
    }
    add_split(c, pp, sp);
  }
  return true;
}

static bool exec_mesh(weft_ctx *c, pstate *ps, env *e, const ast *s) {
  weft_plan *p = ps->p;
  value set = eval_expr(c, e, s->a);
  if (set.kind == V_ERROR) return false;
  int n = 0;
  int *devs = NULL;
  if (set.kind == V_RANGE) {
    if (set.r.lo < 0 || set.r.hi > p->ndevices) {
      eval_error(c, s->a->loc, "devices %" PRId64 "..%" PRId64 " do not exist: the cluster has devices 0 to %d", set.r.lo,
                 set.r.hi, p->ndevices - 1);
      return false;
    }
    n = set.r.hi > set.r.lo ? (int)(set.r.hi - set.r.lo) : 0;
    devs = arena_alloc(A(c), sizeof(int) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) devs[i] = (int)(set.r.lo + i);
  } else if (set.kind == V_LIST) {
    if (set.list->n > p->ndevices) {
      eval_error(c, s->a->loc, "a mesh of %d devices, but the cluster has %d", set.list->n, p->ndevices);
      return false;
    }
    n = set.list->n;
    devs = arena_alloc(A(c), sizeof(int) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) {
      if (set.list->items[i].kind != V_INT) {
        eval_error(c, s->a->loc, "a mesh is made of device numbers, got %s", value_kind_name(set.list->items[i].kind));
        return false;
      }
      int64_t dv = set.list->items[i].i;
      devs[i] = dv < 0 || dv >= p->ndevices ? -1 : (int)dv;
      if (devs[i] < 0) {
        eval_error(c, s->a->loc, "device %" PRId64 " does not exist: the cluster has devices 0 to %d", dv, p->ndevices - 1);
        return false;
      }
    }
  } else {
    eval_error(c, s->a->loc, "a mesh needs a list of devices (devices, devices[0..8]), got %s", value_kind_name(set.kind));
    return false;
  }
  bool *seen = arena_alloc(A(c), sizeof(bool) * (size_t)(p->ndevices ? p->ndevices : 1));
  for (int i = 0; i < n; i++) {
    if (devs[i] < 0 || devs[i] >= p->ndevices) {
      eval_error(c, s->a->loc, "device %d does not exist: the cluster has devices 0 to %d", devs[i], p->ndevices - 1);
      return false;
    }
    if (seen[devs[i]]) { eval_error(c, s->a->loc, "device %d is in the mesh twice", devs[i]); return false; }
    seen[devs[i]] = true;
  }
  pmesh m = {.name = s->name, .naxes = s->list.n, .devices = devs, .loc = s->loc};
  m.axes = arena_alloc(A(c), sizeof(char *) * (size_t)(m.naxes ? m.naxes : 1));
  m.sizes = arena_alloc(A(c), sizeof(int) * (size_t)(m.naxes ? m.naxes : 1));
  int64_t prod = 1;
  for (int i = 0; i < m.naxes; i++) {
    const ast *f = s->list.items[i];
    m.axes[i] = f->name;
    if (!count_of(c, e, f->a, &m.sizes[i])) return false;
    prod *= m.sizes[i];
  }
  if (prod != n) {
    weft_diag *g = eval_error(c, s->loc, "mesh %s has %" PRId64 " positions but %d devices", s->name, prod, n);
    diag_hint(g, &c->diags, "the product of the axis sizes must equal the number of devices");
    return false;
  }
  arena_grow(A(c), (void **)&p->meshes, &p->mcap, p->nmeshes + 1, sizeof(pmesh));
  pmesh *pm = arena_alloc(A(c), sizeof *pm);
  *pm = m;
  p->meshes[p->nmeshes++] = m;
  env_define(A(c), e, s->name, (value){.kind = V_MESH, .mesh = pm}, s->loc, false);
  for (int i = 0; i < m.naxes; i++) env_define(A(c), e, m.axes[i], v_int(m.sizes[i]), s->loc, false);
  return true;
}

static bool exec_stage(weft_ctx *c, pstate *ps, env *e, const ast *s) {
  weft_plan *p = ps->p;
  for (int i = 0; i < s->list.n; i++) {
    const ast *f = s->list.items[i];
    const char *name = f->name;
    if (!name) {
      value v = eval_expr(c, e, f->b);
      if (v.kind == V_ERROR) return false;
      if (v.kind != V_STRING || !v.s[0]) {
        eval_error(c, f->b->loc, "a stage name must be a non-empty string, got %s", value_repr(A(c), v));
        return false;
      }
      name = v.s;
    }
    for (int k = 0; k < p->nstages; k++)
      if (strcmp(p->stages[k].name, name) == 0) {
        eval_error(c, f->loc, "stage %s is defined twice", name);
        return false;
      }
    opset set;
    if (!select_ops(c, e, p, f->a, &set)) return false;
    for (int k = 0; k < set.n; k++) {
      popplan *pp = &p->ops[set.ops[k]];
      if (pp->stage >= 0) {
        eval_error(c, f->loc, "operator %s is already in stage %s", p->g->ops[set.ops[k]].name, p->stages[pp->stage].name);
        return false;
      }
      pp->stage = p->nstages;
    }
    arena_grow(A(c), (void **)&p->stages, &p->stcap, p->nstages + 1, sizeof(pstage));
    p->stages[p->nstages++] = (pstage){name, set.n, set.ops, f->loc};
  }
  return true;
}

/* The number of leading name segments an atom of a `recompute` selector
 * fixes: h.* and h[0..6] fix two (each layer h.N is recomputed on its own),
 * `all` and stages none (one segment), a glob with ** one per operator. */
static int atom_fixed_segments(const weft_plan *p, const ast *atom) {
  if (atom->kind == E_NAME) {
    if (strcmp(atom->name, "all") == 0) return 0;
    for (int i = 0; i < p->nstages; i++)
      if (strcmp(p->stages[i].name, atom->name) == 0) return 0;
    return strcmp(atom->name, "**") == 0 ? -1 : 1;
  }
  if (atom->kind == E_INDEX) {
    int k = atom_fixed_segments(p, atom->a);
    return k < 0 ? -1 : k + 1;
  }
  if (atom->kind == E_MEMBER) {
    if (atom->name && strcmp(atom->name, "**") == 0) return -1;
    int k = atom_fixed_segments(p, atom->a);
    return k < 0 ? -1 : k + 1;
  }
  return -1;
}

/* `recompute SEL [selective | full]`: the operators of one segment (a layer
 * matched by h.*, one operator matched through **) are recomputed together,
 * right before the backward of the segment's last operator; what flows into
 * a segment from outside it is kept. `selective` (Korthikanti et al., 2022)
 * recomputes only the selected operators that are cheap for the memory they
 * free: all but the matrix products (kind "matmul"), whose results are kept. */
static bool exec_recompute(weft_ctx *c, pstate *ps, env *e, const ast *s) {
  weft_plan *p = ps->p;
  int mode = s->name && strcmp(s->name, "full") == 0 ? 2 : 1;
  const ast *sel = s->a;
  const char **keys = arena_alloc(A(c), sizeof(char *) * (size_t)(p->g->nops ? p->g->nops : 1));
  int nkeys = 0, base = p->nsegs;
  for (int i = 0; i < sel->list.n; i++) {
    opset set;
    opset_init(c, p, &set);
    if (!select_atom(c, e, p, sel->list.items[i], &set)) return false;
    int fixed = atom_fixed_segments(p, sel->list.items[i]);
    for (int k = 0; k < set.n; k++) {
      popplan *pp = &p->ops[set.ops[k]];
      const char *kind = p->g->ops[set.ops[k]].kind;
      if (mode == 1 && kind && strcmp(kind, "matmul") == 0) continue;
      const char *name = p->g->ops[set.ops[k]].name;
      const char *key = name;
      if (fixed >= 0) {
        const char *q = name;
        for (int seg = 0; seg < fixed && q; seg++) {
          q = strchr(q, '.');
          if (q && seg + 1 < fixed) q++;
        }
        key = q ? arena_strndup(A(c), name, (size_t)(q - name)) : name;
        if (fixed == 0) key = "";
      }
      int id = -1;
      for (int j = 0; j < nkeys && id < 0; j++)
        if (strcmp(keys[j], key) == 0) id = j;
      if (id < 0) { keys[nkeys] = key; id = nkeys++; }
      pp->recompute = mode;
      pp->rseg = base + id;
    }
  }
  p->nsegs = base + nkeys;
  return true;
}

/* How many parts of the gradient of parameter t are summed, as far as the
 * splits so far tell: the parts of the levels along dimensions t lacks (the
 * batch of data parallelism, the sequence of sequence parallelism), for the
 * reader with the most. Placement decides the devices of the sum; two parts
 * on one device make the group smaller, and deps_derive keeps an all-reduce
 * for a group that does not divide the parameter. */
static int64_t grad_parts(const weft_plan *p, int t) {
  int64_t most = 1;
  for (int op = 0; op < p->g->nops; op++) {
    const popplan *pp = &p->ops[op];
    for (int k = 0; k < pp->space->ninputs; k++) {
      const tmap *m = &pp->space->inputs[k];
      if (m->tensor != t) continue;
      int64_t n = 1;
      for (int i = 0; i < pp->nsplits; i++) {
        if (pp->splits[i].kind != SPLIT_DIM) continue;
        bool has = false;
        for (int d = 0; d < m->ndims && !has; d++)
          for (int f = 0; f < m->nfactors[d] && !has; f++) has = m->factors[d][f] == pp->splits[i].idim;
        if (!has) n *= pp->splits[i].parts;
      }
      if (n > most) most = n;
    }
  }
  return most;
}

/* Whether the part of parameter input k of op that one sub-operator reads
 * has a dimension divisible by n; its extents go to text for messages. */
static bool shardable(weft_ctx *c, const popplan *pp, int k, int64_t n, const char **text) {
  const tmap *m = &pp->space->inputs[k];
  bool ok = false;
  const char *t = "";
  for (int d = 0; d < m->ndims; d++) {
    int64_t len = 1;
    for (int f = 0; f < m->nfactors[d]; f++) len *= part_size(pp, m->factors[d][f]);
    ok |= len % n == 0;
    t = arena_printf(A(c), "%s%s%" PRId64, t, d ? ", " : "", len);
  }
  *text = t;
  return ok;
}

/* `shard STATE SEL over AXIS` (ZeRO): each parameter the selected operators
 * read keeps one part of its optimizer state (stage 1), and also of its
 * gradient (2) and of its values (3), on each device of the group that sums
 * its gradient. The stages nest: a parameter keeps the highest asked. AXIS
 * is the axis its copies differ along, so the statement follows the splits
 * that make them. */
static bool exec_shard(weft_ctx *c, pstate *ps, env *e, const ast *s) {
  weft_plan *p = ps->p;
  static const char *const states[] = {"optimizer", "gradients", "parameters"};
  int stage = 0;
  for (int i = 0; i < 3; i++)
    if (strcmp(s->name, states[i]) == 0) stage = i + 1;
  if (!stage) {
    weft_diag *g = eval_error(c, s->loc, "unknown state '%s' to shard", s->name);
    const char *best = diag_closest(s->name, states, 3);
    if (best) diag_hint(g, &c->diags, "did you mean '%s'?", best);
    else diag_hint(g, &c->diags, "ZeRO shards the optimizer state (stage 1), gradients (2) or parameters (3)");
    return false;
  }
  opset set;
  if (!select_ops(c, e, p, s->a, &set)) return false;
  for (int k = 0; k < set.n; k++) {
    const popplan *pp = &p->ops[set.ops[k]];
    bool along = false;
    for (int i = 0; i < pp->nsplits && !along; i++) along = strcmp(pp->splits[i].axis, s->text) == 0;
    if (!along) {
      weft_diag *g = eval_error(c, s->loc, "operator %s is not split along axis '%s'", p->g->ops[set.ops[k]].name,
                                s->text);
      diag_hint(g, &c->diags, "`shard` divides the copies of parameters made along an axis: "
                              "split the operator along it first");
      return false;
    }
    for (int a = 0; a < pp->space->ninputs; a++) {
      int t = pp->space->inputs[a].tensor;
      const gtensor *gt = &p->g->tensors[t];
      if (gt->role != TENSOR_PARAM) continue;
      int64_t n = grad_parts(p, t);
      /* every reader's part, a tied weight's too, is cut into n equal parts */
      for (int op = 0; op < p->g->nops; op++)
        for (int r = 0; r < p->ops[op].space->ninputs; r++) {
          const char *ext;
          if (p->ops[op].space->inputs[r].tensor != t || shardable(c, &p->ops[op], r, n, &ext)) continue;
          weft_diag *g = eval_error(c, s->loc, "cannot shard parameter %s %s over %" PRId64
                                    " devices: no dimension of its part [%s] is divisible by %" PRId64,
                                    gt->name, tensor_type_str(A(c), gt), n, ext, n);
          diag_hint(g, &c->diags, "ZeRO gives each device that sums a gradient an equal part of one dimension; "
                                  "leave %s out of the selector, or change the sizes", gt->name);
          return false;
        }
      pzero *z = &p->zero[t];
      if (stage >= z->stage) *z = (pzero){stage, s->text, s->loc};
    }
  }
  return true;
}

static bool exec_call(weft_ctx *c, pstate *ps, env *e, const ast *s) {
  const ast *call = s->a;
  value f = eval_expr(c, e, call->a);
  if (f.kind == V_ERROR) return false;
  if (f.kind != V_STRATEGY) {
    weft_diag *g = eval_error(c, call->loc, "only a strategy can be called as a statement of a plan, got %s %s",
                              value_kind_name(f.kind), value_repr(A(c), f));
    diag_hint(g, &c->diags, "strategies are declared with `strategy NAME(...) { ... }`");
    return false;
  }
  if (ps->depth >= 64) {
    eval_error(c, call->loc, "strategies nested more than 64 deep");
    return false;
  }
  /* a strategy sees the plan's names (meshes, axes, stages) and its own */
  env *se = env_new(A(c), e);
  if (!eval_bind_named(c, f.decl, call->list.n, (const ast *const *)call->list.items, e, se, call->loc)) return false;
  ps->depth++;
  bool ok = exec_plan_body(c, ps, se, &f.decl->node->list2);
  ps->depth--;
  return ok;
}

static bool exec_plan_stmt(weft_ctx *c, pstate *ps, env *e, const ast *s) {
  weft_plan *p = ps->p;
  if (!eval_step(c, s->loc)) return false;
  switch (s->kind) {
  case S_MESH: return exec_mesh(c, ps, e, s);
  case S_SPLIT: case S_REPLICATE: return exec_split(c, ps, e, s);
  case S_STAGE: return exec_stage(c, ps, e, s);
  case S_CALL: return exec_call(c, ps, e, s);
  case S_PLACE:
    for (int i = 0; i < s->list.n; i++) {
      const ast *pl = s->list.items[i];
      opset set;
      if (!select_ops(c, e, p, pl->a, &set)) return false;
      arena_grow(A(c), (void **)&ps->assigns, &ps->acap, ps->nassigns + 1, sizeof(passign));
      ps->assigns[ps->nassigns++] = (passign){set.n, set.ops, pl->b, e, pl->loc};
    }
    return true;
  case S_RECOMPUTE: return exec_recompute(c, ps, e, s);
  case S_SHARD: return exec_shard(c, ps, e, s);
  case S_BUCKETS: {
    value v = eval_expr(c, e, s->a);
    if (v.kind == V_ERROR) return false;
    if (v.kind != V_QUANTITY || !unit_eq(v.q.d, UNIT_BYTES) || v.q.v < 0 || v.q.v > 1e15) {
      weft_diag *g = eval_error(c, s->a->loc, "buckets needs a size in bytes, got %s", value_repr(A(c), v));
      diag_hint(g, &c->diags, "for example `buckets 25 MiB`; `buckets 0 B` fuses nothing");
      return false;
    }
    p->bucket_bytes = (int64_t)v.q.v;
    p->bucket_loc = s->loc;
    return true;
  }
  case S_ORDER: {
    opset a, b;
    if (!select_ops(c, e, p, s->a, &a) || !select_ops(c, e, p, s->b, &b)) return false;
    for (int k = 0; k < a.n; k++)
      if (b.in[a.ops[k]]) {
        eval_error(c, s->loc, "operator %s is on both sides of `order`", p->g->ops[a.ops[k]].name);
        return false;
      }
    arena_grow(A(c), (void **)&p->orders, &p->orcap, p->norders + 1, sizeof(porder));
    p->orders[p->norders++] = (porder){a.n, b.n, a.ops, b.ops, s->loc};
    return true;
  }
  case S_SCHEDULE: {
    static const sched_kind kinds[] = {SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED};
    sched_kind k = SCHED_GRID;
    if (s->name) {
      int found = -1;
      for (int i = 0; i < 3; i++)
        if (strcmp(s->name, sched_kind_names[kinds[i]]) == 0) found = i;
      if (found < 0) {
        weft_diag *g = eval_error(c, s->loc, "unknown schedule '%s'", s->name);
        const char *names[] = {"gpipe", "one_f_one_b", "interleaved"};
        const char *best = diag_closest(s->name, names, 3);
        if (best) diag_hint(g, &c->diags, "did you mean '%s'?", best);
        else diag_hint(g, &c->diags, "the schedules are gpipe, one_f_one_b and interleaved, or a grid: schedule { s0: f0 f1 b0 b1 }");
        return false;
      }
      k = kinds[found];
    }
    p->sched = k;
    p->sched_loc = s->loc;
    p->grid = k == SCHED_GRID ? s : NULL;
    return true;
  }
  case S_LET: {
    value v = eval_expr(c, e, s->a);
    if (v.kind == V_ERROR) return false;
    env_define(A(c), e, s->name, v, s->loc, false);
    return true;
  }
  case S_FOR: {
    value it = eval_expr(c, e, s->a);
    if (it.kind == V_ERROR) return false;
    if (it.kind != V_RANGE && it.kind != V_LIST) {
      eval_error(c, s->a->loc, "`for` needs a range or a list, got %s", value_kind_name(it.kind));
      return false;
    }
    int64_t n = it.kind == V_RANGE ? (it.r.hi > it.r.lo ? it.r.hi - it.r.lo : 0) : it.list->n;
    for (int64_t i = 0; i < n; i++) {
      if (!eval_step(c, s->loc)) return false;
      env *le = env_new(A(c), e);
      env_define(A(c), le, s->name, it.kind == V_RANGE ? v_int(it.r.lo + i) : it.list->items[i], s->loc, false);
      if (!exec_plan_body(c, ps, le, &s->list)) return false;
    }
    return true;
  }
  case S_IF: {
    bool cnd;
    if (!eval_condition(c, e, s->a, &cnd)) return false;
    if (cnd) return exec_plan_body(c, ps, env_new(A(c), e), &s->list);
    if (s->b) return exec_plan_stmt(c, ps, e, s->b);
    return exec_plan_body(c, ps, env_new(A(c), e), &s->list2);
  }
  case S_ASSERT:
    return eval_assert(c, e, s);

  default: {
    static const char *const what[AST_KIND_COUNT] = {
        [S_USE] = "`use`", [S_PARAM] = "`param`", [S_FN] = "`fn`", [S_OP] = "`op`", [S_MODEL] = "`model`",
        [S_MODELDEF] = "`model`", [S_CLUSTER] = "`cluster`", [S_INPUT] = "`input`", [S_TPARAM] = "`param`",
        [S_ASSIGN] = "an assignment", [S_BLOCK] = "`block`", [S_OUTPUT] = "`output`", [S_TRAIN] = "`train`",
        [S_DEVICE] = "`device`", [S_LINK] = "`link`", [S_PLAN] = "`plan`", [S_STRATEGY] = "`strategy`"};
    weft_diag *g = eval_error(c, s->loc, "%s is not allowed in a plan", what[s->kind] ? what[s->kind] : ast_kind_names[s->kind]);
    diag_hint(g, &c->diags, "a plan holds mesh, split, replicate, assign, stage, order, schedule, recompute, shard, buckets, let, for, if, assert and strategy calls");
    return false;
  }
  }
}

static bool exec_plan_body(weft_ctx *c, pstate *ps, env *e, const ast_list *body) {
  for (int i = 0; i < body->n; i++)
    if (!exec_plan_stmt(c, ps, e, body->items[i])) return false;
  return true;
}

/* ---- micro-batch folding ------------------------------------------------------- */

/* Whether expression x names `axis` anywhere (a device expression that does
 * may place micro-batches differently). */
static bool names_axis(const ast *x, const char *axis) {
  if (!x) return false;
  if (x->kind == E_NAME && x->name && strcmp(x->name, axis) == 0) return true;
  if (names_axis(x->a, axis) || names_axis(x->b, axis) || names_axis(x->c, axis)) return true;
  for (int i = 0; i < x->list.n; i++)
    if (names_axis(x->list.items[i], axis)) return true;
  for (int i = 0; i < x->list2.n; i++)
    if (names_axis(x->list2.items[i], axis)) return true;
  return false;
}

/* Folding pays when there are many sub-operators; WEFT_FOLD=always or
 * never overrides (the tests compare both). */
enum { FOLD_MIN_SUBS = 1 << 16 };

/* Sets p->fold when micro-batches differ only by a shift (see plan.h). */
static void fold_setup(weft_ctx *c, pstate *ps) {
  weft_plan *p = ps->p;
  const weft_graph *g = p->g;
  const char *mode = getenv("WEFT_FOLD");
  if (mode && strcmp(mode, "never") == 0) return;
  bool always = mode && strcmp(mode, "always") == 0;
  int nmb = 0;
  int64_t total = 0;
  int *tlevel = arena_alloc(A(c), sizeof(int) * (size_t)(g->nops ? g->nops : 1));
  int64_t *step = arena_alloc(A(c), sizeof(int64_t) * (size_t)(g->nops ? g->nops : 1));
  for (int op = 0; op < g->nops; op++) {
    const popplan *pp = &p->ops[op];
    int64_t count = 1;
    tlevel[op] = -1;
    for (int i = 0; i < pp->nsplits; i++) {
      count *= pp->splits[i].parts;
      if (pp->splits[i].kind != SPLIT_TIME) continue;
      if (tlevel[op] >= 0) return;  /* two time levels */
      tlevel[op] = i;
    }
    total += count;
    if (tlevel[op] < 0) return;
    const psplit *ts = &pp->splits[tlevel[op]];
    if (nmb == 0) nmb = ts->parts;
    if (ts->parts != nmb || nmb < 2) return;
    /* the part size at the time level */
    int64_t size = pp->space->idims[ts->idim].size;
    for (int i = 0; i <= tlevel[op]; i++) {
      if (pp->splits[i].idim != ts->idim) continue;
      if (size % pp->splits[i].parts) return;
      size /= pp->splits[i].parts;
    }
    step[op] = size;
  }
  if (nmb < 2 || (!always && total < FOLD_MIN_SUBS)) return;
  /* every tensor moves along one dimension, by the same offset for all its operators */
  int *tdim = arena_alloc(A(c), sizeof(int) * (size_t)(g->ntensors ? g->ntensors : 1));
  int64_t *tstep = arena_alloc(A(c), sizeof(int64_t) * (size_t)(g->ntensors ? g->ntensors : 1));
  bool *seen = arena_alloc(A(c), (size_t)(g->ntensors ? g->ntensors : 1));
  for (int op = 0; op < g->nops; op++) {
    const popplan *pp = &p->ops[op];
    int ti = pp->splits[tlevel[op]].idim;
    for (int k = -1; k < pp->space->ninputs; k++) {
      const tmap *m = k < 0 ? &pp->space->output : &pp->space->inputs[k];
      int dim = -1;
      int64_t st = 0;
      for (int d = 0; d < m->ndims; d++)
        for (int f = 0; f < m->nfactors[d]; f++) {
          if (m->factors[d][f] != ti) continue;
          if (dim >= 0) return;
          dim = d;
          st = step[op];
          for (int q = f + 1; q < m->nfactors[d]; q++) st *= pp->space->idims[m->factors[d][q]].size;
        }
      if (dim >= 0 && g->tensors[m->tensor].role == TENSOR_PARAM) return;
      if (seen[m->tensor] && (tdim[m->tensor] != dim || (dim >= 0 && tstep[m->tensor] != st))) return;
      seen[m->tensor] = true;
      tdim[m->tensor] = dim;
      tstep[m->tensor] = st;
    }
  }
  for (int t = 0; t < g->ntensors; t++)
    if (!seen[t]) tdim[t] = -1;
  /* device expressions that read the time axis place micro-batches apart */
  for (int a = 0; a < ps->nassigns; a++)
    for (int k = 0; k < ps->assigns[a].nops; k++) {
      int op = ps->assigns[a].ops[k];
      if (names_axis(ps->assigns[a].expr, p->ops[op].splits[tlevel[op]].axis)) return;
    }
  p->fold = (pfold){nmb, nmb, tlevel, step, tdim, tstep, NULL};
}

/* ---- replicas ------------------------------------------------------------------ */

/* Data-parallel replicas run the same program with devices renamed. Finds
 * an axis along which every operator is split the same way (P parts of a
 * dimension, or of a sum), such that the sub-operators at coordinate j of that
 * axis sit on devices that are an image of those at coordinate 0 under one
 * renaming pi_j; point-to-point communication stays inside a replica; a
 * collective that leaves a replica reduces parameter gradients over whole
 * orbits {d, pi_1(d), ...}. Then the devices at coordinate 0 represent the
 * others: deps derived the same communication for each replica (in the
 * same order), so lowering them alone decides rules 3 to 5 for all.
 * Sets p->rep, or leaves it NULL. */
static void find_reps(weft_ctx *c, weft_plan *p) {
  const weft_graph *g = p->g;
  const char *mode = getenv("WEFT_REPS");
  if (!c->reps || (mode && strcmp(mode, "never") == 0) || g->nops == 0) return;
  for (int t = 0; t < g->ntensors; t++)
    if (p->zero[t].stage > 0) return;  /* ZeRO parts differ per replica */
  int D = p->ndevices;
  int *cls = malloc(sizeof(int) * (size_t)D);
  int *inv = malloc(sizeof(int) * (size_t)D);
  int *rep = arena_alloc(A(c), sizeof(int) * (size_t)D);
  if (!cls || !inv) weft_oom();
  const popplan *p0 = &p->ops[0];
  for (int cand = 0; cand < p0->nsplits; cand++) {
    const psplit *cs = &p0->splits[cand];
    if ((cs->kind != SPLIT_DIM && cs->kind != SPLIT_VALUE) || cs->parts < 2) continue;
    const char *axis = cs->axis;
    int P = cs->parts;
    bool ok = true;
    for (int d = 0; d < D; d++) cls[d] = inv[d] = -1;
    for (int op = 0; op < g->nops && ok; op++) {
      const popplan *pp = &p->ops[op];
      int lv = -1;
      for (int i = 0; i < pp->nsplits; i++)
        if (strcmp(pp->splits[i].axis, axis) == 0) lv = i;
      /* a dimension split, or the batch of a loss (partial sums nobody reads) */
      if (lv < 0 || (pp->splits[lv].kind != SPLIT_DIM && pp->splits[lv].kind != SPLIT_VALUE) ||
          pp->splits[lv].parts != P) {
        ok = false;
        break;
      }
      int tl = p->fold.nmb ? p->fold.tlevel[op] : -1;
      int stride = 1;
      for (int i = lv + 1; i < pp->nsplits; i++)
        if (i != tl) stride *= pp->splits[i].parts;
      for (int f = 0; f < pp->count && ok; f++) {
        const psub *s = &p->subs[pp->first + f];
        if (s->coord[lv] != 0) continue;
        int r = s->device;
        if (r < 0 || (cls[r] >= 0 && cls[r] != 0)) { ok = false; break; }
        cls[r] = 0;
        for (int j = 1; j < P && ok; j++) {
          int q = p->subs[pp->first + f + j * stride].device;
          if (q < 0 || (cls[q] >= 0 && cls[q] != j) || (inv[q] >= 0 && inv[q] != r)) { ok = false; break; }
          cls[q] = j;
          inv[q] = r;
        }
      }
    }
    if (!ok) continue;
    /* pi_j is one-to-one: every representative has one image per j */
    int *images = calloc((size_t)D, sizeof(int));
    if (!images) weft_oom();
    for (int d = 0; d < D; d++) {
      rep[d] = cls[d] > 0 ? inv[d] : d;
      if (cls[d] > 0) images[inv[d]]++;
    }
    for (int d = 0; d < D && ok; d++)
      if (cls[d] == 0 && images[d] != P - 1) ok = false;
    /* communication stays in a replica, or sums gradients over whole orbits */
    char *in = calloc((size_t)D, 1);
    if (!in) weft_oom();
    for (int i = 0; i < p->ncomms && ok; i++) {
      const pcomm *cm = &p->comms[i];
      bool inside = true;
      for (int k = 0; k < cm->ngroup; k++) inside &= cls[cm->group[k]] == cls[cm->group[0]];
      if (inside) continue;
      if (cm->kind == COMM_SEND || cm->phase != PHASE_WEIGHTS) { ok = false; break; }
      for (int k = 0; k < cm->ngroup; k++) in[cm->group[k]] = 1;
      for (int k = 0; k < cm->ngroup && ok; k++) {
        int r = rep[cm->group[k]];
        if (!in[r]) ok = false;
        else if (cm->group[k] == r) {
          int have = 0;
          for (int m = 0; m < cm->ngroup; m++) have += rep[cm->group[m]] == r;
          if (have != P) ok = false;
        }
      }
      for (int k = 0; k < cm->ngroup; k++) in[cm->group[k]] = 0;
    }
    free(in);
    free(images);
    if (ok) {
      p->rep = rep;
      break;
    }
  }
  free(cls);
  free(inv);
}

/* ---- sub-operators and placement ------------------------------------------------ */

static bool make_subs(weft_ctx *c, weft_plan *p) {
  int64_t total = 0;
  for (int op = 0; op < p->g->nops; op++) {
    int64_t count = 1;
    for (int i = 0; i < p->ops[op].nsplits; i++) count *= p->ops[op].splits[i].parts;
    total += count;
  }
  if (total > PLAN_MAX_TOTAL_SUBS) {
    weft_diag *g = eval_error(c, p->loc, "the plan has %" PRId64 " sub-operators, more than weft supports (%d)", total,
                              PLAN_MAX_TOTAL_SUBS);
    diag_hint(g, &c->diags, "fewer parts, or fewer micro-batches");
    return false;
  }
  arena_grow(A(c), (void **)&p->subs, &p->scap, (int)total + 1, sizeof(psub));
  p->nsubs_all = total;
  if (p->fold.nmb) total /= p->fold.nmb;
  for (int op = 0; op < p->g->nops; op++) {
    popplan *pp = &p->ops[op];
    int tl = p->fold.nmb ? p->fold.tlevel[op] : -1;
    int64_t count = 1;
    for (int i = 0; i < pp->nsplits; i++) count *= i == tl ? 1 : pp->splits[i].parts;
    pp->first = p->nsubs;
    pp->count = (int)count;
    int *coord = arena_alloc(A(c), sizeof(int) * (size_t)(pp->nsplits ? pp->nsplits : 1));
    for (int64_t k = 0; k < count; k++) {
      arena_grow(A(c), (void **)&p->subs, &p->scap, p->nsubs + 1, sizeof(psub));
      psub *s = &p->subs[p->nsubs++];
      memset(s, 0, sizeof *s);
      s->op = op;
      s->dir = DIR_FORWARD;
      s->device = -1;
      s->order = -1;
      s->coord = arena_alloc(A(c), sizeof(int) * (size_t)(pp->nsplits ? pp->nsplits : 1));
      memcpy(s->coord, coord, sizeof(int) * (size_t)pp->nsplits);
      s->range = arena_alloc(A(c), sizeof(irange) * (size_t)(pp->space->nidims ? pp->space->nidims : 1));
      for (int d = 0; d < pp->space->nidims; d++) s->range[d] = (irange){0, pp->space->idims[d].size};
      int mb = 0;
      for (int i = 0; i < pp->nsplits; i++) {
        const psplit *sp = &pp->splits[i];
        if (sp->kind == SPLIT_TIME) mb = mb * sp->parts + coord[i];
        if (sp->idim < 0) continue;
        irange *r = &s->range[sp->idim];
        int64_t part = (r->hi - r->lo) / sp->parts;
        r->lo += part * coord[i];
        r->hi = r->lo + part;
      }
      s->microbatch = mb;
      for (int i = pp->nsplits - 1; i >= 0; i--) {
        if (i != tl && ++coord[i] < pp->splits[i].parts) break;
        coord[i] = 0;
      }
    }
  }
  return true;
}

/* "h.0.attn.c_attn at part = 4, tp = 1": a sub-operator by its coordinates. */
static const char *sub_where(weft_ctx *c, const weft_plan *p, const psub *s) {
  const popplan *pp = &p->ops[s->op];
  const char *t = arena_printf(A(c), "%s", p->g->ops[s->op].name);
  for (int i = 0; i < pp->nsplits; i++)
    t = arena_printf(A(c), "%s%s %s = %d (of %d)", t, i ? "," : " at", pp->splits[i].axis[0] == '#' ? "level" : pp->splits[i].axis,
                     s->coord[i], pp->splits[i].parts);
  return t;
}

/* Indexes a mesh with the coordinates of a sub-operator: m[dp, tp]. */
static bool mesh_device(weft_ctx *c, const weft_plan *p, const psub *s, const pmesh *m, const value *idx, int n,
                        const ast *at, int *dev) {
  if (n != m->naxes) {
    eval_error(c, at->loc, "mesh %s has %d axes, indexed with %d", m->name, m->naxes, n);
    return false;
  }
  int64_t flat = 0;
  for (int i = 0; i < n; i++) {
    if (idx[i].kind != V_INT || idx[i].i < 0 || idx[i].i >= m->sizes[i]) {
      weft_diag *g = eval_error(c, at->loc, "index %d of mesh %s must be 0 to %d (axis %s), got %s", i, m->name,
                                m->sizes[i] - 1, m->axes[i], value_repr(&c->arena, idx[i]));
      diag_hint(g, &c->diags, "for the sub-operator of %s", sub_where(c, p, s));
      return false;
    }
    flat = flat * m->sizes[i] + idx[i].i;
  }
  *dev = m->devices[flat];
  return true;
}

/* Evaluates an assign's device expression for one sub-operator. Axis names
 * bind to the sub-operator's coordinates; a mesh axis the operator is not
 * split along is an error, not its size. */
static bool device_of(weft_ctx *c, weft_plan *p, const passign *as, const psub *s, int *dev,
                      const char *const *levels, int nlevels) {
  const popplan *pp = &p->ops[s->op];
  env *e = env_new(A(c), as->e);
  /* an axis other operators are split along, but not this one */
  for (int k = 0; k < nlevels; k++) env_define(A(c), e, levels[k], v_none(), as->loc, false);
  for (int i = 0; i < pp->nsplits; i++) env_define(A(c), e, pp->splits[i].axis, v_int(s->coord[i]), as->loc, false);
  const ast *x = as->expr;
  if (x->kind == E_INDEX) {
    value m = eval_expr(c, e, x->a);
    if (m.kind == V_ERROR) return false;
    if (m.kind == V_MESH) {
      int n = x->b ? 1 : x->list.n;
      value idx[16];
      if (n > 16) n = 16;
      for (int i = 0; i < n; i++) {
        const ast *ix = x->b ? x->b : x->list.items[i];
        idx[i] = eval_expr(c, e, ix);
        if (idx[i].kind == V_ERROR) return false;
        if (idx[i].kind == V_NONE) {
          char levels[256];
          size_t o = 0;
          levels[0] = 0;
          for (int k = 0; k < pp->nsplits && o < sizeof levels - 32; k++)
            o += (size_t)snprintf(levels + o, sizeof levels - o, "%s%s", k ? ", " : "", pp->splits[k].axis);
          weft_diag *g = eval_error(c, ix->loc, "operator %s is not split along axis '%s'", p->g->ops[s->op].name,
                                    ix->kind == E_NAME ? ix->name : "?");
          diag_hint(g, &c->diags, pp->nsplits ? "its levels: %s; split or replicate it along this axis, or assign it apart"
                                               : "it is not split at all%s; split or replicate it, or assign it apart",
                    levels);
          return false;
        }
      }
      return mesh_device(c, p, s, m.mesh, idx, n, x, dev);
    }
  }
  value v = eval_expr(c, e, x);
  if (v.kind == V_ERROR) return false;
  if (v.kind == V_NONE && x->kind == E_NAME) {
    eval_error(c, x->loc, "operator %s is not split along axis '%s'", p->g->ops[s->op].name, x->name);
    return false;
  }
  if (v.kind != V_INT) {
    eval_error(c, x->loc, "a device is a number or a mesh element such as m[dp, tp], got %s %s", value_kind_name(v.kind),
               value_repr(A(c), v));
    return false;
  }
  if (v.i < 0 || v.i >= p->ndevices) {
    eval_error(c, x->loc, "device %" PRId64 " does not exist: the cluster has devices 0 to %d", v.i, p->ndevices - 1);
    return false;
  }
  *dev = (int)v.i;
  return true;
}

static bool place(weft_ctx *c, pstate *ps) {
  weft_plan *p = ps->p;
  /* the names of all split levels, for device_of */
  const char **levels = NULL;
  int nlevels = 0, lcap = 0;
  for (int op = 0; op < p->g->nops; op++)
    for (int i = 0; i < p->ops[op].nsplits; i++) {
      const char *ax = p->ops[op].splits[i].axis;
      bool seen = false;
      for (int k = 0; k < nlevels && !seen; k++) seen = strcmp(levels[k], ax) == 0;
      if (seen) continue;
      arena_grow(A(c), (void **)&levels, &lcap, nlevels + 1, sizeof(char *));
      levels[nlevels++] = ax;
    }
  /* a device expression is evaluated once per sub-operator, in a scratch
   * arena: kept only when it reports an error (its messages live there) */
  arena main = c->arena;
  arena_init(&c->arena);
  bool ok_all = true;
  for (int a = 0; a < ps->nassigns && ok_all; a++) {
    const passign *as = &ps->assigns[a];
    for (int k = 0; k < as->nops && ok_all; k++) {
      popplan *pp = &p->ops[as->ops[k]];
      for (int i = 0; i < pp->count; i++) {
        psub *s = &p->subs[pp->first + i];
        int before = c->diags.n;
        if (!eval_step(c, as->loc) || !device_of(c, p, as, s, &s->device, levels, nlevels)) {
          ok_all = false;
          break;
        }
        if (c->diags.n == before) arena_reset(&c->arena);
        else { arena_adopt(&main, &c->arena); }
      }
      pp->assigned = true;
      pp->assign_loc = as->loc;
    }
  }
  arena_adopt(&main, &c->arena);
  c->arena = main;
  if (!ok_all) return false;
  /* rule 2: every sub-operator on exactly one device */
  bool ok = true;
  int unplaced = 0;
  for (int op = 0; op < p->g->nops && unplaced < 5; op++) {
    if (p->ops[op].assigned) continue;
    weft_diag *g = eval_error(c, p->loc, "operator %s is not placed: no `assign` selects it", p->g->ops[op].name);
    diag_hint(g, &c->diags, "add `assign %s -> DEVICE`, or `assign all -> m[...]`", p->g->ops[op].name);
    ok = false;
    unplaced++;
  }
  return ok;
}

/* ---- building a plan -------------------------------------------------------------- */

weft_plan *weft_build_plan(weft_ctx *c, value plan, weft_loc use) {
  vdecl *d = plan.decl;
  const ast *n = d->node;
  env *e = env_new(A(c), d->closure);
  if (!eval_bind_decl(c, d, e, use)) return NULL;
  int before = c->diags.errors;
  value mv = eval_expr(c, e, n->a);
  if (mv.kind == V_ERROR) return NULL;
  if (mv.kind != V_MODEL) {
    eval_error(c, n->a->loc, "a plan is `for` a model, got %s %s", value_kind_name(mv.kind), value_repr(A(c), mv));
    return NULL;
  }
  value cv = eval_expr(c, e, n->b);
  if (cv.kind == V_ERROR) return NULL;
  if (cv.kind != V_CLUSTER) {
    eval_error(c, n->b->loc, "a plan is `on` a cluster, got %s %s", value_kind_name(cv.kind), value_repr(A(c), cv));
    return NULL;
  }
  weft_graph *g = weft_build_graph(c, mv, n->a->loc);
  if (!g) return NULL;
  value cr = weft_build_cluster(c, cv, n->b->loc);
  if (cr.kind != V_RECORD) return NULL;
  weft_plan *p = arena_alloc(A(c), sizeof *p);
  p->name = d->name;
  p->bucket_bytes = PLAN_DEFAULT_BUCKET;
  p->loc = n->loc;
  p->g = g;
  p->cluster = cr.rec;
  p->ndevices = (int)record_get(cr.rec, "devices")->i;
  p->devices_per_node = (int)record_get(cr.rec, "devices_per_node")->i;
  p->ops = arena_alloc(A(c), sizeof(popplan) * (size_t)(g->nops ? g->nops : 1));
  p->zero = arena_alloc(A(c), sizeof(pzero) * (size_t)(g->ntensors ? g->ntensors : 1));
  for (int op = 0; op < g->nops; op++) {
    p->ops[op].space = opspace_build(A(c), g, op);
    p->ops[op].stage = -1;
    p->ops[op].rseg = -1;
  }
  /* the plan body sees `devices`: the cluster's device numbers */
  vlist *dl = arena_alloc(A(c), sizeof *dl);
  dl->n = p->ndevices;
  dl->items = arena_alloc(A(c), sizeof(value) * (size_t)(dl->n ? dl->n : 1));
  for (int i = 0; i < dl->n; i++) dl->items[i] = v_int(i);
  env_define(A(c), e, "devices", (value){.kind = V_LIST, .list = dl}, n->loc, false);
  pstate ps = {.p = p};
  if (!exec_plan_body(c, &ps, e, &n->list2)) return NULL;
  fold_setup(c, &ps);
  prof_mark("plan body");
  if (!make_subs(c, p)) return NULL;
  if (!place(c, &ps)) return NULL;
  if (c->diags.errors > before) return NULL;
  prof_mark("sub-operators");
  deps_derive(A(c), p);
  prof_mark("communication");
  p->used_devices = plan_devices_used(p);
  find_reps(c, p);
  bool *keep = NULL;
  if (p->rep) {
    keep = arena_alloc(A(c), (size_t)p->ndevices);
    for (int dv = 0; dv < p->ndevices; dv++) keep[dv] = p->rep[dv] == dv;
  }
  plan_unfold(A(c), p, keep);
  prof_mark("unfold");
  prof_note("%d sub-operators and %d communications kept, of %d devices", p->nsubs, p->ncomms, p->ndevices);
  return p;
}

/* ---- reports ------------------------------------------------------------------------- */

int plan_devices_used(const weft_plan *p) {
  bool *used = calloc((size_t)(p->ndevices ? p->ndevices : 1), 1);
  if (!used) weft_oom();
  int n = 0;
  for (int i = 0; i < p->nsubs; i++)
    if (p->subs[i].device >= 0 && !used[p->subs[i].device]) { used[p->subs[i].device] = true; n++; }
  free(used);
  return n;
}

int plan_select_text(const weft_plan *p, const char *pattern, int *ops, int max) {
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", pattern);
  const char *segs[66];
  int ns = 0;
  for (char *tok = strtok(buf, "."); tok && ns < 64; tok = strtok(NULL, ".")) segs[ns++] = tok;
  int n = 0;
  for (int op = 0; op < p->g->nops; op++) {
    const char *name = p->g->ops[op].name;
    bool m = strcmp(pattern, "all") == 0 || glob_match(segs, ns, name);
    if (!m) {
      segs[ns] = "**";
      m = glob_match(segs, ns + 1, name);
    }
    if (m && n < max) ops[n++] = op;
  }
  return n;
}
