/* plan_eval.c - evaluates `plan` blocks and strategies: every statement
 * becomes a primitive decision (decisions.h) that the plan builder (plan.h)
 * applies at once, so that a later statement sees the stages and splits of
 * those before it. Device expressions of `assign` are evaluated here, for
 * every sub-operator, when the builder places them. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/prof.h"
#include "eval.h"
#include "weft/workspace.h"
#include "weft/cluster.h"
#include "weft/decisions.h"

/* An assign's device expression and the scope it was written in. */
typedef struct pexpr {
  const ast *x;
  env *e;
} pexpr;

static arena *A(weft_ctx *c) { return &c->arena; }

/* The plan under evaluation. */
typedef struct pstate {
  weft_ctx *c;
  const weft_graph *g;    /* its model's */
  int ndevices;           /* its cluster's */
  weft_decisions *d;      /* what it decided so far */
  int unnamed;            /* counter for "#1", "#2" axes */
  int depth;              /* strategy call depth */
  arena scratch;          /* device expressions, evaluated once per sub-operator */
  int *by_name;           /* the operators in the byte order of their names */
  const ast_list *body;   /* the plan's own statements */
  int search_at;          /* the decisions before its `search` statement (-1: none) */
  weft_loc search_loc;
  struct {                /* while sub-operators are placed (device_fast) */
    const pexpr *of;      /* the device expression m[...] evaluated last */
    value mesh;           /* its mesh (V_NONE: not one) */
    int64_t mesh_steps;   /* the steps it took */
    value v[16];          /* per index that reads no axis: its value */
    int64_t steps[16];    /* ... and the steps it took; -1: none kept */
    /* what device_fast found of the names for the levels it saw last (the
     * same for every sub-operator of an operator): whether it applies, the
     * level each index reads (-1: none) and the steps it counts */
    const char *const *axes, *const *levels;
    int nsplits, nlevels;
    bool ok;
    int at[16];
    int64_t nsteps;
  } fast;
} pstate;

static void decide(weft_ctx *c, pstate *ps, const decision *d) { *dec_add(A(c), ps->d, d->kind) = *d; }

/* The stage decided so far under that name, or NULL. */
static const decision *stage_named(const pstate *ps, const char *name) {
  for (int i = 0; i < ps->d->n; i++)
    if (ps->d->items[i].kind == DEC_STAGE && strcmp(ps->d->items[i].name, name) == 0) return &ps->d->items[i];
  return NULL;
}


/* ---- selectors ---------------------------------------------------------------- */

static int by_name_cmp(const void *a, const void *b, void *graph) {
  const weft_graph *g = graph;
  return strcmp(g->ops[*(const int *)a].name, g->ops[*(const int *)b].name);
}

typedef struct opset {
  int n, cap;
  int *ops;
  bool *in;               /* per graph operator */
} opset;

static void opset_init(weft_ctx *c, const pstate *ps, opset *s) {
  memset(s, 0, sizeof *s);
  s->in = arena_alloc(A(c), sizeof(bool) * (size_t)(ps->g->nops ? ps->g->nops : 1));
}

static void opset_add(weft_ctx *c, opset *s, int op) {
  if (s->in[op]) return;
  s->in[op] = true;
  arena_grow(A(c), (void **)&s->ops, &s->cap, s->n + 1, sizeof(int));
  s->ops[s->n++] = op;
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

/* The first operator of by_name whose name is not below key (the first
 * n bytes of key, when n >= 0). */
static int name_bound(const pstate *ps, const char *key, int n) {
  int lo = 0, hi = ps->g->nops;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    const char *name = ps->g->ops[ps->by_name[mid]].name;
    if ((n < 0 ? strcmp(name, key) : strncmp(name, key, (size_t)n)) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static int int_cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* A selector of plain segments (h.3.attn, no '*'): the operator of that
 * name and, with prefix, those under it, found in by_name without a scan
 * of every operator (megatron's `assign h.{i}` for each of a thousand
 * layers would take seconds). -1 when the selector is not plain. */
static int select_plain(weft_ctx *c, const pstate *ps, const char **segs, int ns, bool prefix, opset *out) {
  size_t len = 0;
  for (int i = 0; i < ns; i++) {
    if (!*segs[i] || strpbrk(segs[i], "*.")) return -1;
    len += strlen(segs[i]) + 1;
  }
  if (ns == 0) return -1;
  char *key = arena_alloc(A(c), len + 1);
  for (int i = 0; i < ns; i++) { if (i) strcat(key, "."); strcat(key, segs[i]); }
  int n = (int)strlen(key), at = 0, cap = 16;
  int *ops = arena_alloc(A(c), sizeof(int) * (size_t)cap);
  int i = name_bound(ps, key, -1);
  if (i < ps->g->nops && strcmp(ps->g->ops[ps->by_name[i]].name, key) == 0) ops[at++] = ps->by_name[i];
  if (prefix) {
    key[n] = '.', key[n + 1] = 0;
    for (i = name_bound(ps, key, n + 1); i < ps->g->nops && strncmp(ps->g->ops[ps->by_name[i]].name, key, (size_t)n + 1) == 0; i++) {
      arena_grow(A(c), (void **)&ops, &cap, at + 1, sizeof(int));
      ops[at++] = ps->by_name[i];
    }
  }
  /* in the order of the operators, as a scan would add them */
  qsort(ops, (size_t)at, sizeof(int), int_cmp);
  for (int k = 0; k < at; k++) opset_add(c, out, ops[k]);
  return at;
}

/* The operators a selector matches, added to out: their count, -1 when
 * the evaluation reached its step limit (a glob's scan of every operator
 * counts a step per operator). */
static int select_pattern(weft_ctx *c, const pstate *ps, const char **segs, int ns, bool prefix, opset *out, weft_loc loc) {
  int plain = select_plain(c, ps, segs, ns, prefix, out);
  if (plain >= 0) return plain;
  if (!eval_steps(c, loc, ps->g->nops)) return -1;
  int found = 0;
  const char *pat[66];
  for (int i = 0; i < ns; i++) pat[i] = segs[i];
  for (int op = 0; op < ps->g->nops; op++) {
    const char *name = ps->g->ops[op].name;
    bool m = graph_glob_match(pat, ns, name);
    if (!m && prefix) {
      pat[ns] = "**";
      m = graph_glob_match(pat, ns + 1, name);
    }
    if (m) { opset_add(c, out, op); found++; }
  }
  return found;
}

/* What a selector that matches nothing may have meant: the operator names
 * (and their leading parts, which select what lies under them) seen in the
 * selector's shape, each '*' segment kept as '*' and a leading '**' as the
 * last segments, so that "h.*.mlp.c_fcc" is answered "h.*.mlp.c_fc"; and
 * the stages. NULL when nothing is close. */
static const char *closest_selector(weft_ctx *c, const pstate *ps, const char *const *segs, int ns) {
  size_t len = 0;
  for (int i = 0; i < ns; i++) len += strlen(segs[i]) + 1;
  char *text = arena_alloc(A(c), len + 1);
  for (int i = 0; i < ns; i++) { if (i) strcat(text, "."); strcat(text, segs[i]); }
  bool lead = ns > 0 && strcmp(segs[0], "**") == 0;
  for (int i = lead ? 1 : 0; i < ns; i++)
    if (strcmp(segs[i], "**") == 0) lead = false, ns = -1;  /* ** inside: the names themselves */
  int cap = ps->g->nops * 4 + ps->d->n + 1, nn = 0;
  const char **names = arena_alloc(A(c), sizeof(char *) * (size_t)cap);
  for (int op = 0; op < ps->g->nops; op++) {
    const char *name = ps->g->ops[op].name;
    if (ns < 0) { names[nn++] = name; continue; }
    /* the name's segments */
    const char *seg[64];
    size_t sl[64];
    int k = 0;
    for (const char *q = name; *q && k < 64;) {
      const char *dot = strchr(q, '.');
      seg[k] = q;
      sl[k++] = dot ? (size_t)(dot - q) : strlen(q);
      if (!dot) break;
      q = dot + 1;
    }
    int want = lead ? ns - 1 : ns;
    /* leading parts of the name with as many segments as the selector
     * (a leading ** matches any prefix: the last segments of each part) */
    for (int end = want; end <= k; end++) {
      if (!lead && end != want) break;
      char *t = arena_alloc(A(c), strlen(name) + 8);
      if (lead) strcpy(t, "**");
      for (int i = 0; i < want; i++) {
        const char *pat = segs[lead ? i + 1 : i];
        if (*t) strcat(t, ".");
        if (strcmp(pat, "*") == 0) strcat(t, "*");
        else strncat(t, seg[end - want + i], sl[end - want + i]);
      }
      bool dup = false;
      for (int j = nn - 1; j >= 0 && j >= nn - 8 && !dup; j--) dup = strcmp(names[j], t) == 0;
      if (!dup && nn < cap - ps->d->n - 1) names[nn++] = t;
    }
  }
  for (int i = 0; i < ps->d->n; i++)
    if (ps->d->items[i].kind == DEC_STAGE) names[nn++] = ps->d->items[i].name;
  return diag_closest(text, names, nn);
}

static bool select_atom(weft_ctx *c, env *e, const pstate *ps, const ast *atom, opset *out) {
  const char *segs[66];
  int ns = 0;
  if (atom->kind == E_NAME && strcmp(atom->name, "all") == 0) {
    for (int op = 0; op < ps->g->nops; op++) opset_add(c, out, op);
    return true;
  }
  const decision *st = atom->kind == E_NAME ? stage_named(ps, atom->name) : NULL;
  if (st) {
    for (int k = 0; k < st->ops.n; k++) opset_add(c, out, st->ops.ops[k]);
    return true;
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
    if (hi > lo + ps->g->nops) hi = lo + ps->g->nops;
    for (int64_t i = lo; i < hi && ns < 64; i++) {
      segs[ns] = arena_printf(A(c), "%" PRId64, i);
      int k = select_pattern(c, ps, segs, ns + 1, true, out, atom->loc);
      if (k < 0) return false;
      found += k;
    }
    if (!found) {
      weft_diag *g = eval_error(c, atom->loc, "selector matches no operator");
      /* the numbered parts the path has, if it names anything */
      int64_t first = -1, last = -1;
      bool named = false;
      size_t plen = 0;
      char *path = arena_alloc(A(c), 64 * 66);
      for (int i = 0; i < ns; i++) plen += (size_t)sprintf(path + plen, "%s%s", i ? "." : "", segs[i]);
      for (int op = 0; op < ps->g->nops; op++) {
        const char *name = ps->g->ops[op].name;
        if (strncmp(name, path, plen) != 0 || (name[plen] != '.' && name[plen] != 0)) continue;
        named = true;
        char *end;
        if (name[plen] == '.' && name[plen + 1] >= '0' && name[plen + 1] <= '9') {
          int64_t k = strtoll(name + plen + 1, &end, 10);
          if (*end == '.' || *end == 0) {
            if (first < 0 || k < first) first = k;
            if (k > last) last = k;
          }
        }
      }
      const char *best = named ? NULL : closest_selector(c, ps, segs, ns);
      if (named && first >= 0)
        diag_hint(g, &c->diags, "%s has the numbered parts %s.%" PRId64 " to %s.%" PRId64, path, path, first, path, last);
      else if (named)
        diag_hint(g, &c->diags, "%s has no numbered parts (%s.0, %s.1, ...) for a range to select", path, path, path);
      else if (best)
        diag_hint(g, &c->diags, "did you mean %s[...]?", best);
      else
        diag_hint(g, &c->diags, "`weft graph` lists the operators; h[0..6] selects h.0 to h.5");
      return false;
    }
    return true;
  }
  if (!path_segments(c, e, atom, segs, &ns)) return false;
  int k = select_pattern(c, ps, segs, ns, true, out, atom->loc);
  if (k < 0) return false;
  if (k) return true;
  /* nothing: suggest the closest selector */
  size_t len = 0;
  for (int i = 0; i < ns; i++) len += strlen(segs[i]) + 1;
  char *text = arena_alloc(A(c), len + 1);
  for (int i = 0; i < ns; i++) { if (i) strcat(text, "."); strcat(text, segs[i]); }
  const char *best = closest_selector(c, ps, segs, ns);
  weft_diag *g = eval_error(c, atom->loc, "'%s' matches no operator of model %s", text, ps->g->name);
  if (best) diag_hint(g, &c->diags, "did you mean '%s'?", best);
  else diag_hint(g, &c->diags, "`weft graph` lists the operators; globs: h.*.mlp, h.**");
  return false;
}

static bool select_ops(weft_ctx *c, env *e, const pstate *ps, const ast *sel, opset *out) {
  opset_init(c, ps, out);
  bool ok = true;
  for (int i = 0; i < sel->list.n; i++)
    if (!select_atom(c, e, ps, sel->list.items[i], out)) ok = false;
  return ok;
}

/* ---- statements ------------------------------------------------------------------ */

static bool exec_plan_body(weft_ctx *c, pstate *ps, env *e, const ast_list *body);
static bool exec_plan_stmt(weft_ctx *c, pstate *ps, env *e, const ast *s);

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

static bool exec_split(weft_ctx *c, pstate *ps, env *e, const ast *s) {
  opset set;
  if (!select_ops(c, e, ps, s->a, &set)) return false;
  decision d = {.kind = s->kind == S_SPLIT ? DEC_SPLIT : DEC_REPLICATE, .loc = s->loc, .ops = {set.n, set.ops},
                .mesh = -1};
  if (!count_of(c, e, s->b, &d.parts)) return false;
  d.axis = axis_name(ps, c, s);
  d.name = s->kind == S_SPLIT ? s->name : NULL;
  d.in_time = s->kind == S_SPLIT && s->ival;
  decide(c, ps, &d);
  return true;
}

static bool exec_mesh(weft_ctx *c, pstate *ps, env *e, const ast *s) {
  int ndevices = ps->ndevices;
  value set = eval_expr(c, e, s->a);
  if (set.kind == V_ERROR) return false;
  int n = 0;
  int *devs = NULL;
  if (set.kind == V_RANGE) {
    if (set.r.lo < 0 || set.r.hi > ndevices) {
      eval_error(c, s->a->loc, "devices %" PRId64 "..%" PRId64 " do not exist: the cluster has devices 0 to %d", set.r.lo,
                 set.r.hi, ndevices - 1);
      return false;
    }
    n = set.r.hi > set.r.lo ? (int)(set.r.hi - set.r.lo) : 0;
    devs = arena_alloc(A(c), sizeof(int) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) devs[i] = (int)(set.r.lo + i);
  } else if (set.kind == V_LIST) {
    if (set.list->n > ndevices) {
      eval_error(c, s->a->loc, "a mesh of %d devices, but the cluster has %d", set.list->n, ndevices);
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
      if (dv < 0 || dv >= ndevices) {
        eval_error(c, s->a->loc, "device %" PRId64 " does not exist: the cluster has devices 0 to %d", dv, ndevices - 1);
        return false;
      }
      devs[i] = (int)dv;
    }
  } else {
    eval_error(c, s->a->loc, "a mesh needs a list of devices (devices, devices[0..8]), got %s", value_kind_name(set.kind));
    return false;
  }
  bool *seen = arena_alloc(A(c), sizeof(bool) * (size_t)(ndevices ? ndevices : 1));
  for (int i = 0; i < n; i++) {
    if (seen[devs[i]]) { eval_error(c, s->a->loc, "device %d is in the mesh twice", devs[i]); return false; }
    seen[devs[i]] = true;
  }
  decision d = {.kind = DEC_MESH, .loc = s->loc, .name = s->name, .naxes = s->list.n, .ndevices = n, .devices = devs,
                .mesh = -1};
  d.axes = arena_alloc(A(c), sizeof(char *) * (size_t)(d.naxes ? d.naxes : 1));
  d.sizes = arena_alloc(A(c), sizeof(int) * (size_t)(d.naxes ? d.naxes : 1));
  for (int i = 0; i < d.naxes; i++) {
    const ast *f = s->list.items[i];
    d.axes[i] = f->name;
    if (!count_of(c, e, f->a, &d.sizes[i])) return false;
  }
  decide(c, ps, &d);
  pmesh *pm = arena_alloc(A(c), sizeof *pm);
  *pm = (pmesh){d.name, d.naxes, d.axes, d.sizes, d.devices, d.loc};
  env_define(A(c), e, s->name, (value){.kind = V_MESH, .mesh = pm}, s->loc, false);
  for (int i = 0; i < d.naxes; i++) env_define(A(c), e, d.axes[i], v_int(d.sizes[i]), s->loc, false);
  return true;
}

static bool exec_stage(weft_ctx *c, pstate *ps, env *e, const ast *s) {
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
    if (stage_named(ps, name)) {
      eval_error(c, f->loc, "stage %s is defined twice", name);
      return false;
    }
    opset set;
    if (!select_ops(c, e, ps, f->a, &set)) return false;
    decision d = {.kind = DEC_STAGE, .loc = f->loc, .name = name, .ops = {set.n, set.ops}, .mesh = -1};
    decide(c, ps, &d);
  }
  return true;
}

/* The number of leading name segments an atom of a `recompute` selector
 * fixes: h.* and h[0..6] fix two (each layer h.N is recomputed on its own),
 * `all` and stages none (one segment), a glob with ** one per operator. */
static int atom_fixed_segments(const pstate *ps, const ast *atom) {
  if (atom->kind == E_NAME) {
    if (strcmp(atom->name, "all") == 0) return 0;
    if (stage_named(ps, atom->name)) return 0;
    return strcmp(atom->name, "**") == 0 ? -1 : 1;
  }
  if (atom->kind == E_INDEX) {
    int k = atom_fixed_segments(ps, atom->a);
    return k < 0 ? -1 : k + 1;
  }
  if (atom->kind == E_MEMBER) {
    if (atom->name && strcmp(atom->name, "**") == 0) return -1;
    int k = atom_fixed_segments(ps, atom->a);
    return k < 0 ? -1 : k + 1;
  }
  return -1;
}

/* `recompute SEL [selective | full]`: the operators an atom of SEL matches
 * are cut into segments by the name segments the atom fixes (h.* and
 * h[0..6]: each layer h.N is a segment); the builder recomputes each
 * segment as one. */
static bool exec_recompute(weft_ctx *c, pstate *ps, env *e, const ast *s) {
  const ast *sel = s->a;
  decision d = {.kind = DEC_RECOMPUTE, .loc = s->loc, .mode = s->name && strcmp(s->name, "full") == 0 ? 2 : 1,
                .mesh = -1};
  int cap = 0, kcap = 0;
  for (int i = 0; i < sel->list.n; i++) {
    opset set;
    opset_init(c, ps, &set);
    if (!select_atom(c, e, ps, sel->list.items[i], &set)) return false;
    int fixed = atom_fixed_segments(ps, sel->list.items[i]);
    for (int k = 0; k < set.n; k++) {
      const char *name = ps->g->ops[set.ops[k]].name;
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
      arena_grow(A(c), (void **)&d.ops.ops, &cap, d.ops.n + 1, sizeof(int));
      arena_grow(A(c), (void **)&d.keys, &kcap, d.ops.n + 1, sizeof(char *));
      d.keys[d.ops.n] = key;
      d.ops.ops[d.ops.n++] = set.ops[k];
    }
  }
  decide(c, ps, &d);
  return true;
}

static bool exec_shard(weft_ctx *c, pstate *ps, env *e, const ast *s) {
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
  if (!select_ops(c, e, ps, s->a, &set)) return false;
  decision d = {.kind = DEC_SHARD, .loc = s->loc, .ops = {set.n, set.ops}, .state = stage, .axis = s->text, .mesh = -1};
  decide(c, ps, &d);
  return true;
}

/* The names an expression mentions (the axes it may read). */
static void expr_names(weft_ctx *c, const ast *x, decision *d, int *cap) {
  if (!x) return;
  if (x->kind == E_NAME && x->name) {
    arena_grow(A(c), (void **)&d->names, cap, d->nnames + 1, sizeof(char *));
    d->names[d->nnames++] = x->name;
  }
  expr_names(c, x->a, d, cap);
  expr_names(c, x->b, d, cap);
  expr_names(c, x->c, d, cap);
  for (int i = 0; i < x->list.n; i++) expr_names(c, x->list.items[i], d, cap);
  for (int i = 0; i < x->list2.n; i++) expr_names(c, x->list2.items[i], d, cap);
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

/* `search`: where the statements weft search writes go. It stands once,
 * directly in the plan's body, so that the written plan has one place for
 * them. */
static bool exec_search(weft_ctx *c, pstate *ps, const ast *s) {
  bool top = false;
  for (int i = 0; i < ps->body->n && !top; i++) top = ps->body->items[i] == s;
  if (ps->depth > 0 || !top) {
    weft_diag *g = eval_error(c, s->loc, "`search` stands directly in a plan's body, not in a %s",
                              ps->depth > 0 ? "strategy" : "loop or condition");
    diag_hint(g, &c->diags, "weft search writes its statements in its place: write `search` once, in the plan");
    return false;
  }
  if (ps->search_at >= 0) {
    weft_diag *g = eval_error(c, s->loc, "plan %s has a second `search`", ps->d->name ? ps->d->name : "plan");
    diag_hint(g, &c->diags, "the first is at %d:%d; one `search` stands for everything the plan does not write",
              ps->search_loc.line, ps->search_loc.col);
    return false;
  }
  ps->search_at = ps->d->n;
  ps->search_loc = s->loc;
  return true;
}

static bool plan_stmt(weft_ctx *c, void *ud, env *e, const ast *s) { return exec_plan_stmt(c, ud, e, s); }

static bool exec_plan_stmt(weft_ctx *c, pstate *ps, env *e, const ast *s) {
  if (!eval_step(c, s->loc)) return false;
  eval_body body = {plan_stmt, ps};
  bool handled, ok = eval_control(c, &body, e, s, &handled);
  if (handled) return ok;
  switch (s->kind) {
  case S_MESH: return exec_mesh(c, ps, e, s);
  case S_SPLIT: case S_REPLICATE: return exec_split(c, ps, e, s);
  case S_STAGE: return exec_stage(c, ps, e, s);
  case S_CALL: return exec_call(c, ps, e, s);
  case S_PLACE:
    for (int i = 0; i < s->list.n; i++) {
      const ast *pl = s->list.items[i];
      opset set;
      if (!select_ops(c, e, ps, pl->a, &set)) return false;
      pexpr *x = arena_alloc(A(c), sizeof *x);
      *x = (pexpr){pl->b, e};
      decision d = {.kind = DEC_ASSIGN, .loc = pl->loc, .ops = {set.n, set.ops}, .expr = x, .mesh = -1};
      int cap = 0;
      expr_names(c, pl->b, &d, &cap);
      decide(c, ps, &d);
    }
    return true;
  case S_RECOMPUTE: return exec_recompute(c, ps, e, s);
  case S_SHARD: return exec_shard(c, ps, e, s);
  case S_SEARCH: return exec_search(c, ps, s);
  case S_BUCKETS: {
    value v = eval_expr(c, e, s->a);
    if (v.kind == V_ERROR) return false;
    if (v.kind != V_QUANTITY || !unit_eq(v.q.d, UNIT_BYTES) || v.q.v < 0 || v.q.v > 1e15) {
      weft_diag *g = eval_error(c, s->a->loc, "buckets needs a size in bytes, got %s", value_repr(A(c), v));
      diag_hint(g, &c->diags, "for example `buckets 25 MiB`; `buckets 0 B` fuses nothing");
      return false;
    }
    decision d = {.kind = DEC_BUCKETS, .loc = s->loc, .bytes = (int64_t)v.q.v, .mesh = -1};
    decide(c, ps, &d);
  return true;
  }
  case S_ORDER: {
    opset a, b;
    if (!select_ops(c, e, ps, s->a, &a) || !select_ops(c, e, ps, s->b, &b)) return false;
    decision d = {.kind = DEC_ORDER, .loc = s->loc, .ops = {a.n, a.ops}, .after = {b.n, b.ops}, .mesh = -1};
    decide(c, ps, &d);
  return true;
  }
  case S_SCHEDULE: {
    static const sched_kind kinds[] = {SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED, SCHED_INTERLACED};
    sched_kind k = SCHED_GRID;
    if (s->name) {
      int found = -1;
      for (int i = 0; i < 4; i++)
        if (strcmp(s->name, sched_kind_names[kinds[i]]) == 0) found = i;
      if (found < 0) {
        weft_diag *g = eval_error(c, s->loc, "unknown schedule '%s'", s->name);
        const char *names[] = {"gpipe", "one_f_one_b", "interleaved", "interlaced"};
        const char *best = diag_closest(s->name, names, 4);
        if (best) diag_hint(g, &c->diags, "did you mean '%s'?", best);
        else diag_hint(g, &c->diags, "the schedules are gpipe, one_f_one_b, interleaved and interlaced, or a grid: schedule { s0: f0 f1 b0 b1 }");
        return false;
      }
      k = kinds[found];
    }
    decision d = {.kind = DEC_SCHEDULE, .loc = s->loc, .sched = k, .grid = k == SCHED_GRID ? s : NULL, .mesh = -1};
    decide(c, ps, &d);
  return true;
  }
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
  eval_body b = {plan_stmt, ps};
  return eval_run_body(c, &b, e, body);
}
/* "h.0.attn.c_attn at tp = 1 (of 4)": a sub-operator by its coordinates. */
static const char *sub_where(weft_ctx *c, const pstate *ps, const dec_sub *s) {
  const char *t = arena_printf(A(c), "%s", ps->g->ops[s->op].name);
  for (int i = 0; i < s->nsplits; i++)
    t = arena_printf(A(c), "%s%s %s = %d (of %d)", t, i ? "," : " at", s->axes[i][0] == '#' ? "level" : s->axes[i],
                     s->coord[i], s->parts[i]);
  return t;
}

/* Indexes a mesh with the coordinates of a sub-operator: m[dp, tp]. */
static bool mesh_device(weft_ctx *c, const pstate *ps, const dec_sub *s, const pmesh *m, const value *idx, int n,
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
      diag_hint(g, &c->diags, "for the sub-operator of %s", sub_where(c, ps, s));
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
/* The coordinate that axis name binds to in sub-operator s's scope (the
 * last level of that axis), or -1 when it binds to none (an axis of other
 * operators only, or another name). */
static int axis_level(const dec_sub *s, const char *name) {
  int at = -1;
  for (int i = 0; i < s->nsplits; i++)
    if (strcmp(s->axes[i], name) == 0) at = i;
  return at;
}

/* Whether expression x reads only names that are not sub-operator s's axes
 * or levels, through arithmetic: its value is the same for every
 * sub-operator the scope of its assignment places. */
static bool axis_free(const ast *x, const dec_sub *s) {
  switch (x->kind) {
  case E_INT: return true;
  case E_PAREN: case E_UNARY: return axis_free(x->a, s);
  case E_BINARY: return axis_free(x->a, s) && axis_free(x->b, s);
  case E_NAME:
    for (int k = 0; k < s->nlevels; k++)
      if (strcmp(s->levels[k], x->name) == 0) return false;
    return axis_level(s, x->name) < 0;
  default: return false;
  }
}

/* The common device expression m[a, b, ...]: a mesh indexed by the
 * sub-operator's axes and by expressions that read none of them. What
 * device_of found for the first sub-operator an assignment placed (the
 * mesh, each axis-free index's value and the steps it took) stands for the
 * others: the same steps are counted and the same device found, without a
 * scope per sub-operator. False with *done false when it cannot (device_of
 * evaluates the expression then). */
static bool device_fast(weft_ctx *c, pstate *ps, const pexpr *as, const dec_sub *s, int *dev, bool *done) {
  *done = false;
  const ast *x = as->x;
  if (ps->fast.of != as || ps->fast.mesh.kind != V_MESH) return false;
  int n = x->b ? 1 : x->list.n, *at = ps->fast.at;
  if (ps->fast.axes != s->axes || ps->fast.levels != s->levels || ps->fast.nsplits != s->nsplits ||
      ps->fast.nlevels != s->nlevels) {
    /* the names are read once per operator's levels */
    ps->fast.axes = s->axes;
    ps->fast.levels = s->levels;
    ps->fast.nsplits = s->nsplits;
    ps->fast.nlevels = s->nlevels;
    ps->fast.ok = axis_free(x->a, s);
    int64_t steps = ps->fast.mesh_steps;
    for (int i = 0; i < n && ps->fast.ok; i++) {
      const ast *ix = x->b ? x->b : x->list.items[i];
      at[i] = ix->kind == E_NAME ? axis_level(s, ix->name) : -1;
      if (at[i] >= 0) steps++;
      else if (ps->fast.steps[i] >= 0 && axis_free(ix, s)) steps += ps->fast.steps[i];
      else ps->fast.ok = false;
    }
    ps->fast.nsteps = steps;
  }
  if (!ps->fast.ok) return false;
  int64_t steps = ps->fast.nsteps;
  if (c->steps + steps > EVAL_MAX_STEPS) return false;
  *done = true;
  eval_steps(c, x->a->loc, ps->fast.mesh_steps);
  value idx[16];
  for (int i = 0; i < n; i++) {
    const ast *ix = x->b ? x->b : x->list.items[i];
    eval_steps(c, ix->loc, at[i] >= 0 ? 1 : ps->fast.steps[i]);
    idx[i] = at[i] >= 0 ? v_int(s->coord[at[i]]) : ps->fast.v[i];
  }
  return mesh_device(c, ps, s, ps->fast.mesh.mesh, idx, n, x, dev);
}

static bool device_of(weft_ctx *c, pstate *ps, const pexpr *as, weft_loc loc, const dec_sub *s, int *dev) {
  bool done;
  bool ok = device_fast(c, ps, as, s, dev, &done);
  if (done) return ok;
  ps->fast.axes = NULL;   /* what follows may keep more for device_fast */
  env *e = env_new(A(c), as->e);
  /* an axis other operators are split along, but not this one */
  for (int k = 0; k < s->nlevels; k++) env_define(A(c), e, s->levels[k], v_none(), loc, false);
  for (int i = 0; i < s->nsplits; i++) env_define(A(c), e, s->axes[i], v_int(s->coord[i]), loc, false);
  const ast *x = as->x;
  if (x->kind == E_INDEX) {
    /* what device_fast reuses: kept when it reads no axis of this
     * sub-operator and says nothing */
    bool keep = x->a->kind == E_NAME && (x->b ? 1 : x->list.n) <= 16 && axis_free(x->a, s);
    if (keep && ps->fast.of != as) {
      ps->fast.of = as;
      ps->fast.mesh = v_none();
      for (int i = 0; i < 16; i++) ps->fast.steps[i] = -1;
    }
    int64_t steps0 = c->steps;
    int diags0 = c->diags.n;
    value m = eval_expr(c, e, x->a);
    if (m.kind == V_ERROR) return false;
    if (keep && m.kind == V_MESH && c->diags.n == diags0) {
      ps->fast.mesh = m;
      ps->fast.mesh_steps = c->steps - steps0;
    }
    if (m.kind == V_MESH) {
      int n = x->b ? 1 : x->list.n;
      value idx[16];
      if (n > 16) n = 16;
      for (int i = 0; i < n; i++) {
        const ast *ix = x->b ? x->b : x->list.items[i];
        steps0 = c->steps;
        diags0 = c->diags.n;
        idx[i] = eval_expr(c, e, ix);
        if (keep && ps->fast.of == as && idx[i].kind == V_INT && c->diags.n == diags0 && axis_free(ix, s)) {
          ps->fast.v[i] = idx[i];
          ps->fast.steps[i] = c->steps - steps0;
        }
        if (idx[i].kind == V_ERROR) return false;
        if (idx[i].kind == V_NONE) {
          char levels[256];
          size_t o = 0;
          levels[0] = 0;
          for (int k = 0; k < s->nsplits && o < sizeof levels - 32; k++)
            o += (size_t)snprintf(levels + o, sizeof levels - o, "%s%s", k ? ", " : "", s->axes[k]);
          weft_diag *g = eval_error(c, ix->loc, "operator %s is not split along axis '%s'", ps->g->ops[s->op].name,
                                    ix->kind == E_NAME ? ix->name : "?");
          diag_hint(g, &c->diags, s->nsplits ? "its levels: %s; split or replicate it along this axis, or assign it apart"
                                               : "it is not split at all%s; split or replicate it, or assign it apart",
                    levels);
          return false;
        }
      }
      return mesh_device(c, ps, s, m.mesh, idx, n, x, dev);
    }
  }
  value v = eval_expr(c, e, x);
  if (v.kind == V_ERROR) return false;
  if (v.kind == V_NONE && x->kind == E_NAME) {
    eval_error(c, x->loc, "operator %s is not split along axis '%s'", ps->g->ops[s->op].name, x->name);
    return false;
  }
  if (v.kind != V_INT) {
    eval_error(c, x->loc, "a device is a number or a mesh element such as m[dp, tp], got %s %s", value_kind_name(v.kind),
               value_repr(A(c), v));
    return false;
  }
  if (v.i < 0 || v.i >= ps->ndevices) {
    eval_error(c, x->loc, "device %" PRId64 " does not exist: the cluster has devices 0 to %d", v.i, ps->ndevices - 1);
    return false;
  }
  *dev = (int)v.i;
  return true;
}


/* How plan_apply places an assignment given as an expression: evaluated
 * in a scratch arena, kept only when it reports an error (its messages
 * live there). */
static bool place_expr(void *ctx, const decision *d, const dec_sub *s, int *dev) {
  pstate *ps = ctx;
  weft_ctx *c = ps->c;
  arena main = c->arena;
  c->arena = ps->scratch;
  int before = c->diags.n;
  bool ok = eval_step(c, d->loc) && device_of(c, ps, d->expr, d->loc, s, dev);
  if (c->diags.n == before) arena_reset(&c->arena);
  else arena_adopt(&main, &c->arena);
  ps->scratch = c->arena;
  c->arena = main;
  return ok;
}

static void place_done(void *ctx) {
  pstate *ps = ctx;
  arena_adopt(&ps->c->arena, &ps->scratch);
  ps->fast.of = NULL;
  ps->fast.axes = NULL;
}

/* ---- a plan's decisions ------------------------------------------------------------ */

bool weft_eval_plan(weft_ctx *c, value plan, weft_loc use, weft_plan_src *out) {
  memset(out, 0, sizeof *out);
  out->search_at = -1;
  vdecl *d = plan.decl;
  const ast *n = d->node;
  env *e = env_new(A(c), d->closure);
  if (!eval_bind_decl(c, d, e, use)) return false;
  int before = c->diags.errors;
  value mv = eval_expr(c, e, n->a);
  if (mv.kind == V_ERROR) return false;
  if (mv.kind != V_MODEL) {
    eval_error(c, n->a->loc, "a plan is `for` a model, got %s %s", value_kind_name(mv.kind), value_repr(A(c), mv));
    return false;
  }
  /* weft search --cluster puts the plan on a cluster of the user's */
  value cv = c->cluster_plan == d ? c->cluster_value : eval_expr(c, e, n->b);
  if (cv.kind == V_ERROR) return false;
  if (cv.kind != V_CLUSTER) {
    eval_error(c, n->b->loc, "a plan is `on` a cluster, got %s %s", value_kind_name(cv.kind), value_repr(A(c), cv));
    return false;
  }
  weft_graph *g = weft_build_graph(c, mv, n->a->loc);
  if (!g) return false;
  value cr = weft_build_cluster(c, cv, n->b->loc);
  if (cr.kind != V_RECORD) return false;
  out->graph = g;
  out->cluster = weft_cluster_of(cr.rec);
  out->decisions.name = d->name;
  out->decisions.loc = n->loc;
  /* the placer's state outlives this call: plan_apply uses it */
  pstate *ps = arena_alloc(A(c), sizeof *ps);
  *ps = (pstate){.c = c, .g = g, .ndevices = out->cluster.ndevices, .d = &out->decisions, .body = &n->list2,
                 .search_at = -1};
  arena_init(&ps->scratch);
  ps->by_name = arena_alloc(A(c), sizeof(int) * (size_t)(g->nops ? g->nops : 1));
  for (int i = 0; i < g->nops; i++) ps->by_name[i] = i;
  qsort_r(ps->by_name, (size_t)g->nops, sizeof(int), by_name_cmp, g);
  out->decisions.placer = (dec_placer){place_expr, place_done, ps};
  /* the plan body sees `devices`: the cluster's device numbers */
  vlist *dl = arena_alloc(A(c), sizeof *dl);
  dl->n = ps->ndevices;
  dl->items = arena_alloc(A(c), sizeof(value) * (size_t)(dl->n ? dl->n : 1));
  for (int i = 0; i < dl->n; i++) dl->items[i] = v_int(i);
  env_define(A(c), e, "devices", (value){.kind = V_LIST, .list = dl}, n->loc, false);
  const weft_graph *outer = c->plan_graph;
  c->plan_graph = g;
  bool ok = exec_plan_body(c, ps, e, &n->list2);
  c->plan_graph = outer;
  out->search_at = ps->search_at;
  out->search_loc = ps->search_loc;
  if (!ok || c->diags.errors > before) return false;
  prof_mark("plan body");
  return true;
}
