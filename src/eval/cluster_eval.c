/* cluster_eval.c - evaluates `cluster` declarations to records and checks them:
 * required fields, units, and links for every level the cluster spans. */
#include <string.h>

#include "eval.h"

/* A work limit: ten times the devices of the largest published runs
 * (Megatron-LM's 1T model on 3072 GPUs). */
enum { CLUSTER_MAX_DEVICES = 32768 };
#include "weft/workspace.h"

/* A record being built, with where each field was written (for errors)
 * and where its block starts (for missing fields). */
typedef struct fields {
  vrecord *rec;
  weft_loc *locs;
  int cap;
  weft_loc at;
} fields;

static void field_set_at(weft_ctx *c, fields *f, const char *key, value v, weft_loc loc) {
  for (int i = 0; i < f->rec->n; i++)
    if (strcmp(f->rec->keys[i], key) == 0) { f->rec->vals[i] = v; f->locs[i] = loc; return; }
  int cap = f->cap, cap2 = f->cap, cap3 = f->cap;
  arena_grow(&c->arena, (void **)&f->rec->keys, &cap, f->rec->n + 1, sizeof(char *));
  arena_grow(&c->arena, (void **)&f->rec->vals, &cap2, f->rec->n + 1, sizeof(value));
  arena_grow(&c->arena, (void **)&f->locs, &cap3, f->rec->n + 1, sizeof(weft_loc));
  f->cap = cap;
  f->rec->keys[f->rec->n] = key;
  f->locs[f->rec->n] = loc;
  f->rec->vals[f->rec->n++] = v;
}

static void field_set(weft_ctx *c, fields *f, const char *key, value v) { field_set_at(c, f, key, v, f->at); }

/* Where field key was written; the block's start when it was not. */
static weft_loc field_loc(const fields *f, const char *key) {
  for (int i = 0; i < f->rec->n; i++)
    if (strcmp(f->rec->keys[i], key) == 0) return f->locs[i];
  return f->at;
}

static fields fields_new(weft_ctx *c, weft_loc at) {
  fields f = {arena_alloc(&c->arena, sizeof(vrecord)), NULL, 0, at};
  return f;
}

static value as_record(fields f) { return (value){.kind = V_RECORD, .rec = f.rec}; }

/* Runs `key = expr` and `let` statements; nested device/link blocks when
 * allowed. Each field is visible to the statements after it. */
typedef struct parts {
  fields device, links;
  int nlinks;
  bool device_seen;
  fields *link_fields;   /* per link, for the positions of its fields */
  int lcap;
} parts;

static bool exec_fields(weft_ctx *c, env *e, const ast_list *body, fields *f, parts *pt, const char *where) {
  bool ok = true;
  for (int i = 0; i < body->n; i++) {
    const ast *s = body->items[i];
    switch (s->kind) {
    case S_ASSIGN: {
      if (s->a->kind != E_NAME) {
        eval_error(c, s->a->loc, "a %s field name is a plain name", where);
        ok = false;
        break;
      }
      if (record_get(f->rec, s->a->name)) {
        eval_error(c, s->a->loc, "field '%s' is given twice", s->a->name);
        ok = false;
        break;
      }
      value v = eval_expr(c, e, s->b);
      if (v.kind == V_ERROR) { ok = false; break; }
      field_set_at(c, f, s->a->name, v, s->b->loc);
      env_define(&c->arena, e, s->a->name, v, s->loc, false);
      break;
    }
    case S_LET: case S_ASSERT: {
      /* the control statements a cluster allows: no loops or branches
       * among its fields */
      bool handled;
      if (!eval_control(c, NULL, e, s, &handled)) ok = false;
      break;
    }

    case S_DEVICE:
      if (!pt) goto misplaced;
      if (pt->device_seen) {
        eval_error(c, s->loc, "a cluster has one `device` block");
        ok = false;
        break;
      }
      pt->device_seen = true;
      pt->device.at = s->loc;
      if (!exec_fields(c, env_new(&c->arena, e), &s->list, &pt->device, NULL, "device")) ok = false;
      break;
    case S_LINK: {
      if (!pt) goto misplaced;
      fields *links = &pt->links;
      fields lf = fields_new(c, s->loc);
      field_set(c, &lf, "name", v_string(s->name));
      for (int k = 0; k < links->rec->n; k++) {
        const value *nm = record_get(links->rec->vals[k].rec, "name");
        if (nm && strcmp(nm->s, s->name) == 0) {
          eval_error(c, s->loc, "link '%s' is declared twice", s->name);
          ok = false;
        }
      }
      if (!exec_fields(c, env_new(&c->arena, e), &s->list, &lf, NULL, "link")) ok = false;
      field_set_at(c, links, arena_printf(&c->arena, "%d", pt->nlinks++), as_record(lf), s->loc);
      arena_grow(&c->arena, (void **)&pt->link_fields, &pt->lcap, pt->nlinks, sizeof(fields));
      pt->link_fields[pt->nlinks - 1] = lf;
      break;
    }
    default:
    misplaced: {
      const char *what = s->kind == S_DEVICE ? "`device`" : s->kind == S_LINK ? "`link`" : ast_kind_names[s->kind];
      static const char *const kw[AST_KIND_COUNT] = {
          [S_USE] = "`use`", [S_PARAM] = "`param`", [S_FN] = "`fn`", [S_OP] = "`op`", [S_MODEL] = "`model`",
          [S_MODELDEF] = "`model`", [S_CLUSTER] = "`cluster`", [S_INPUT] = "`input`", [S_TPARAM] = "`param`",
          [S_BLOCK] = "`block`", [S_FOR] = "`for`", [S_IF] = "`if`", [S_OUTPUT] = "`output`", [S_TRAIN] = "`train`"};
      if (kw[s->kind]) what = kw[s->kind];
      weft_diag *g = eval_error(c, s->loc, "%s is not allowed in a %s", what, where);
      diag_hint(g, &c->diags, "a %s holds `key = value` fields%s", where,
                strcmp(where, "cluster") == 0 ? ", one `device { ... }` and `link NAME { ... }` blocks" : "");
      ok = false;
    }
    }
  }
  return ok;
}

static const value *need(weft_ctx *c, const vrecord *r, const char *key, const char *where, weft_loc loc) {
  const value *v = record_get(r, key);
  if (!v) {
    weft_diag *g = eval_error(c, loc, "%s has no field '%s'", where, key);
    diag_hint(g, &c->diags, "add `%s = ...`", key);
  }
  return v;
}

static bool check_quantity(weft_ctx *c, const value *v, unit_dim want, const char *what, weft_loc loc) {
  if (!v) return false;
  char w[64], h[64];
  unit_dim_name(want, w, sizeof w);
  if (v->kind != V_QUANTITY || !unit_eq(v->q.d, want)) {
    const char *got = v->kind == V_QUANTITY ? unit_dim_name(v->q.d, h, sizeof h) : value_kind_name(v->kind);
    weft_diag *g = eval_error(c, loc, "%s must be in %s, got %s (%s)", what, w, value_show(&c->arena, *v), got);
    diag_hint(g, &c->diags, "write it with a unit, e.g. %s",
              want.byte == 1 && want.sec == 0 ? "80 GiB" : want.byte == 1 ? "900 GB/s" : want.flop ? "312 TFLOP/s" : "2 us");
    return false;
  }
  if (v->q.v <= 0) {
    eval_error(c, loc, "%s must be positive, got %s", what, value_show(&c->arena, *v));
    return false;
  }
  return true;
}

static bool check_count(weft_ctx *c, const value *v, const char *what, weft_loc loc) {
  if (!v) return false;
  if (v->kind != V_INT || v->i <= 0 || v->i > 1000000) {
    eval_error(c, loc, "%s must be a positive integer (at most 1000000), got %s", what, value_show(&c->arena, *v));
    return false;
  }
  return true;
}

/* A number in (0, 1]: an achievable fraction of a peak. */
static bool check_fraction(weft_ctx *c, const value *v, const char *what, weft_loc loc) {
  double x = v->kind == V_FLOAT ? v->f : v->kind == V_INT ? (double)v->i : -1;
  if ((v->kind != V_FLOAT && v->kind != V_INT) || !(x > 0 && x <= 1)) {
    weft_diag *g = eval_error(c, loc, "%s must be a fraction in (0, 1], got %s", what, value_show(&c->arena, *v));
    diag_hint(g, &c->diags, "it is the share of the peak that real kernels or transfers reach, e.g. 0.8");
    return false;
  }
  return true;
}

static bool check_nonneg(weft_ctx *c, const value *v, const char *what, weft_loc loc) {
  double x = v->kind == V_FLOAT ? v->f : v->kind == V_INT ? (double)v->i : -1;
  if ((v->kind != V_FLOAT && v->kind != V_INT) || !(x >= 0 && x < 1e9)) {
    eval_error(c, loc, "%s must be a number of at least 0, got %s", what, value_show(&c->arena, *v));
    return false;
  }
  return true;
}

/* The optional fields of the cost model (docs/estimate.md). */
static bool check_kernels(weft_ctx *c, const fields *dv) {
  bool ok = true;
  const value *v;
  if ((v = record_get(dv->rec, "matmul_efficiency"))) ok &= check_fraction(c, v, "matmul_efficiency", field_loc(dv, "matmul_efficiency"));
  if ((v = record_get(dv->rec, "memory_efficiency"))) ok &= check_fraction(c, v, "memory_efficiency", field_loc(dv, "memory_efficiency"));
  if ((v = record_get(dv->rec, "sms"))) ok &= check_count(c, v, "sms", field_loc(dv, "sms"));
  if ((v = record_get(dv->rec, "matmul_tile_k_overhead")))
    ok &= check_nonneg(c, v, "matmul_tile_k_overhead", field_loc(dv, "matmul_tile_k_overhead"));
  if ((v = record_get(dv->rec, "kernel_launch")) &&
      !(v->kind == V_QUANTITY && unit_eq(v->q.d, (unit_dim){.sec = 1}) && v->q.v == 0))
    ok &= check_quantity(c, v, (unit_dim){.sec = 1}, "kernel_launch", field_loc(dv, "kernel_launch"));
  if ((v = record_get(dv->rec, "matmul_tile"))) {
    weft_loc at = field_loc(dv, "matmul_tile");
    if (v->kind != V_LIST || v->list->n != 2) {
      eval_error(c, at, "matmul_tile must be a list [m, n] of two tile sizes, got %s", value_show(&c->arena, *v));
      ok = false;
    } else {
      ok &= check_count(c, &v->list->items[0], "matmul_tile[0]", at);
      ok &= check_count(c, &v->list->items[1], "matmul_tile[1]", at);
    }
  }
  if ((v = record_get(dv->rec, "attention_score_passes"))) {
    weft_loc at = field_loc(dv, "attention_score_passes");
    if (v->kind != V_LIST || v->list->n != 2) {
      eval_error(c, at, "attention_score_passes must be a list [forward, backward], got %s", value_show(&c->arena, *v));
      ok = false;
    } else {
      ok &= check_nonneg(c, &v->list->items[0], "attention_score_passes[0]", at);
      ok &= check_nonneg(c, &v->list->items[1], "attention_score_passes[1]", at);
    }
  }
  return ok;
}

value weft_build_cluster(weft_ctx *c, value cl, weft_loc use) {
  vdecl *d = cl.decl;
  const ast *n = d->node;
  weft_loc loc = use.line ? use : n->loc;
  env *e = env_new(&c->arena, d->closure);
  if (!eval_bind_decl(c, d, e, loc)) return v_error();
  fields f = fields_new(c, n->loc);
  parts pt = {fields_new(c, n->loc), fields_new(c, n->loc), 0, false, NULL, 0};
  field_set(c, &f, "name", v_string(d->name));
  const value *p = NULL;
  for (int i = 0; i < e->n; i++)
    if (strcmp(e->items[i].name, "nodes") == 0) p = &e->items[i].val;
  int before = c->diags.errors;
  if (!exec_fields(c, e, &n->list2, &f, &pt, "cluster") || c->diags.errors > before)
    return v_error();
  if (p && !record_get(f.rec, "nodes")) field_set(c, &f, "nodes", *p);
  if (!record_get(f.rec, "nodes")) field_set(c, &f, "nodes", v_int(1));
  const char *where = arena_printf(&c->arena, "cluster %s", d->name);
  bool ok = true;
  const value *nodes = record_get(f.rec, "nodes");
  const value *dpn = need(c, f.rec, "devices_per_node", where, n->loc);
  ok &= check_count(c, nodes, "nodes", record_get(f.rec, "nodes") && field_loc(&f, "nodes").line ? field_loc(&f, "nodes") : loc);
  ok &= check_count(c, dpn, "devices_per_node", field_loc(&f, "devices_per_node"));
  if (!pt.device_seen) {
    weft_diag *g = eval_error(c, n->loc, "%s has no `device` block", where);
    diag_hint(g, &c->diags, "add device { name = ..., memory = ..., memory_bandwidth = ..., compute = { ... } }");
    return v_error();
  }
  fields *dv = &pt.device;
  const char *dwhere = arena_printf(&c->arena, "the device of cluster %s", d->name);
  ok &= check_quantity(c, need(c, dv->rec, "memory", dwhere, dv->at), (unit_dim){.byte = 1}, "memory",
                       field_loc(dv, "memory"));
  ok &= check_quantity(c, need(c, dv->rec, "memory_bandwidth", dwhere, dv->at), (unit_dim){.byte = 1, .sec = -1},
                       "memory_bandwidth", field_loc(dv, "memory_bandwidth"));
  const value *comp = need(c, dv->rec, "compute", dwhere, dv->at);
  if (comp && comp->kind != V_RECORD) {
    eval_error(c, field_loc(dv, "compute"), "compute must be a record of rates per dtype, e.g. { bf16 = 312 TFLOP/s }");
    ok = false;
  } else if (comp) {
    for (int i = 0; i < comp->rec->n; i++) {
      const char *w = arena_printf(&c->arena, "compute.%s", comp->rec->keys[i]);
      ok &= check_quantity(c, &comp->rec->vals[i], (unit_dim){.flop = 1, .sec = -1}, w, field_loc(dv, "compute"));
    }
  }
  ok &= check_kernels(c, dv);
  fields dev = pt.device, links = pt.links;
  if (!record_get(dev.rec, "name")) field_set(c, &dev, "name", v_string(d->name));
  bool has_node = false, has_cluster = false;
  for (int i = 0; i < links.rec->n; i++) {
    const fields *lf = &pt.link_fields[i];
    const vrecord *l = lf->rec;
    const char *lw = arena_printf(&c->arena, "link %s", record_get(l, "name")->s);
    const value *lv = need(c, l, "level", lw, lf->at);
    if (lv && (lv->kind != V_STRING || (strcmp(lv->s, "node") != 0 && strcmp(lv->s, "cluster") != 0))) {
      weft_diag *g = eval_error(c, field_loc(lf, "level"), "%s: level must be \"node\" or \"cluster\", got %s", lw,
                                value_repr(&c->arena, *lv));
      diag_hint(g, &c->diags, "\"node\" links join devices of one node, \"cluster\" links join nodes");
      ok = false;
    } else if (lv) {
      if (strcmp(lv->s, "node") == 0) has_node = true; else has_cluster = true;
    }
    ok &= check_quantity(c, need(c, l, "bandwidth", lw, lf->at), (unit_dim){.byte = 1, .sec = -1},
                         arena_printf(&c->arena, "%s: bandwidth", lw), field_loc(lf, "bandwidth"));
    ok &= check_quantity(c, need(c, l, "latency", lw, lf->at), (unit_dim){.sec = 1},
                         arena_printf(&c->arena, "%s: latency", lw), field_loc(lf, "latency"));
    if (record_get(l, "efficiency"))
      ok &= check_fraction(c, record_get(l, "efficiency"), arena_printf(&c->arena, "%s: efficiency", lw),
                           field_loc(lf, "efficiency"));
  }
  if (!ok) return v_error();
  if (dpn->i > 1 && !has_node) {
    weft_diag *g = eval_error(c, loc, "%s has %lld devices per node but no link with level = \"node\"", where, (long long)dpn->i);
    diag_hint(g, &c->diags, "add link NAME { level = \"node\", bandwidth = ..., latency = ... }");
    return v_error();
  }
  if (nodes->i > 1 && !has_cluster) {
    weft_diag *g = eval_error(c, loc, "%s has %lld nodes but no link with level = \"cluster\"", where, (long long)nodes->i);
    diag_hint(g, &c->diags, "add link NAME { level = \"cluster\", bandwidth = ..., latency = ... }");
    return v_error();
  }
  if (nodes->i * dpn->i > CLUSTER_MAX_DEVICES) {
    weft_diag *g = eval_error(c, loc, "%s has %lld devices, more than weft supports (%d)", where,
                              (long long)(nodes->i * dpn->i), CLUSTER_MAX_DEVICES);
    diag_hint(g, &c->diags, "the communication of a plan and its simulation grow with the square of its devices; "
              "published runs use a few thousand");
    return v_error();
  }
  field_set(c, &f, "devices", v_int(nodes->i * dpn->i));
  field_set(c, &f, "device", as_record(dev));
  vlist *ll = arena_alloc(&c->arena, sizeof *ll);
  ll->n = links.rec->n;
  ll->items = links.rec->vals;
  field_set(c, &f, "links", (value){.kind = V_LIST, .list = ll});
  return as_record(f);
}
