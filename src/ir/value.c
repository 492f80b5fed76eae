/* value.c - dtypes, environments, and showing and comparing values.
 * Values are plain structs; everything they point to is arena memory. */
#include "weft/value.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "weft/decisions.h"

const char *const dtype_names[DT_COUNT] = {"f32", "bf16", "f16", "i32"};
const int dtype_bytes[DT_COUNT] = {4, 2, 2, 4};

bool dtype_is_float(weft_dtype d) { return d != DT_I32; }

const char *value_kind_name(value_kind k) {
  static const char *const names[] = {
      [V_ERROR] = "error",     [V_NONE] = "nothing",   [V_INT] = "integer",
      [V_FLOAT] = "float",     [V_BOOL] = "boolean",   [V_STRING] = "string",
      [V_QUANTITY] = "quantity", [V_RANGE] = "range",  [V_LIST] = "list",
      [V_RECORD] = "record",   [V_DTYPE] = "dtype",    [V_FN] = "function",
      [V_BUILTIN] = "function", [V_OPDECL] = "operator", [V_MODEL] = "model",
      [V_CLUSTER] = "cluster", [V_TENSOR] = "tensor",     [V_PLAN] = "plan",
      [V_STRATEGY] = "strategy", [V_MESH] = "mesh",
  };
  return names[k];
}

typedef struct sbuf { arena *a; char *p; int n, cap; } sbuf;

static void sb_puts(sbuf *b, const char *s) {
  int len = (int)strlen(s);
  arena_grow(b->a, (void **)&b->p, &b->cap, b->n + len + 1, 1);
  memcpy(b->p + b->n, s, (size_t)len + 1);
  b->n += len;
}

static void show(sbuf *b, value v, int depth) {
  char tmp[96];
  if (depth > 8) { sb_puts(b, "..."); return; }
  switch (v.kind) {
  case V_INT: snprintf(tmp, sizeof tmp, "%" PRId64, v.i); sb_puts(b, tmp); break;
  case V_FLOAT:
    snprintf(tmp, sizeof tmp, "%.6g", v.f);
    if (!strpbrk(tmp, ".eEn")) strcat(tmp, ".0");
    sb_puts(b, tmp);
    break;
  case V_BOOL: sb_puts(b, v.i ? "true" : "false"); break;
  case V_STRING:
    if (depth > 0) sb_puts(b, "\"");  /* inside a list or record: as written */
    sb_puts(b, v.s);
    if (depth > 0) sb_puts(b, "\"");
    break;
  case V_QUANTITY: unit_format(v.q.v, v.q.d, tmp, sizeof tmp); sb_puts(b, tmp); break;
  case V_RANGE:
    snprintf(tmp, sizeof tmp, "%" PRId64 "..%" PRId64, v.r.lo, v.r.hi);
    sb_puts(b, tmp);
    break;
  case V_LIST:
    sb_puts(b, "[");
    for (int i = 0; i < v.list->n; i++) {
      if (i) sb_puts(b, ", ");
      if (i >= 16) { sb_puts(b, "..."); break; }
      show(b, v.list->items[i], depth + 1);
    }
    sb_puts(b, "]");
    break;
  case V_RECORD:
    sb_puts(b, "{ ");
    for (int i = 0; i < v.rec->n; i++) {
      if (i) sb_puts(b, ", ");
      sb_puts(b, v.rec->keys[i]);
      sb_puts(b, " = ");
      show(b, v.rec->vals[i], depth + 1);
    }
    sb_puts(b, v.rec->n ? " }" : "}");
    break;
  case V_DTYPE: sb_puts(b, dtype_names[v.dt]); break;
  case V_FN: case V_MODEL: case V_CLUSTER: case V_PLAN: case V_STRATEGY:
    sb_puts(b, value_kind_name(v.kind));
    sb_puts(b, " ");
    sb_puts(b, v.decl->name);
    break;
  case V_OPDECL: sb_puts(b, "operator "); sb_puts(b, v.op->name); break;
  case V_BUILTIN: sb_puts(b, "built-in function"); break;
  case V_TENSOR: sb_puts(b, "tensor"); break;
  case V_MESH: sb_puts(b, "mesh"); break;
  case V_NONE: sb_puts(b, "nothing"); break;
  case V_ERROR: sb_puts(b, "<error>"); break;
  }
}

const char *value_show(arena *a, value v) {
  sbuf b = {a, NULL, 0, 0};
  sb_puts(&b, "");
  show(&b, v, 0);
  return b.p;
}

const char *value_repr(arena *a, value v) {
  switch (v.kind) {
  case V_STRING: return arena_printf(a, "\"%s\"", v.s);
  /* after "got function": the name alone */
  case V_FN: case V_MODEL: case V_CLUSTER: case V_PLAN: case V_STRATEGY: return v.decl->name;
  case V_OPDECL: return v.op->name;
  case V_BUILTIN: return v.bi->name;
  case V_MESH: return ((const pmesh *)v.mesh)->name;
  default: return value_show(a, v);
  }
}

bool value_equal(value a, value b) {
  if (a.kind == V_INT && b.kind == V_FLOAT) return (double)a.i == b.f;
  if (a.kind == V_FLOAT && b.kind == V_INT) return a.f == (double)b.i;
  if (a.kind != b.kind) return false;
  switch (a.kind) {
  case V_INT: case V_BOOL: return a.i == b.i;
  case V_FLOAT: return a.f == b.f;
  case V_STRING: return strcmp(a.s, b.s) == 0;
  case V_QUANTITY: return unit_eq(a.q.d, b.q.d) && a.q.v == b.q.v;
  case V_RANGE: return a.r.lo == b.r.lo && a.r.hi == b.r.hi;
  case V_LIST:
    if (a.list->n != b.list->n) return false;
    for (int i = 0; i < a.list->n; i++)
      if (!value_equal(a.list->items[i], b.list->items[i])) return false;
    return true;
  case V_RECORD:
    if (a.rec->n != b.rec->n) return false;
    for (int i = 0; i < a.rec->n; i++) {
      const value *o = record_get(b.rec, a.rec->keys[i]);
      if (!o || !value_equal(a.rec->vals[i], *o)) return false;
    }
    return true;
  case V_DTYPE: return a.dt == b.dt;
  case V_FN: case V_MODEL: case V_CLUSTER: case V_PLAN: case V_STRATEGY: return a.decl == b.decl;
  case V_MESH: return a.mesh == b.mesh;
  case V_OPDECL: return a.op == b.op;
  case V_BUILTIN: return a.bi == b.bi;
  case V_TENSOR: return a.tensor == b.tensor;
  default: return true;
  }
}

const value *record_get(const vrecord *r, const char *key) {
  if (!r) return NULL;
  for (int i = 0; i < r->n; i++)
    if (strcmp(r->keys[i], key) == 0) return &r->vals[i];
  return NULL;
}

env *env_new(arena *a, env *parent) {
  env *e = arena_alloc(a, sizeof *e);
  e->parent = parent;
  return e;
}

binding *env_define(arena *a, env *e, const char *name, value v, weft_loc loc, bool imported) {
  for (int i = 0; i < e->n; i++) {
    if (strcmp(e->items[i].name, name) == 0) {
      binding *prev = arena_alloc(a, sizeof *prev);
      *prev = e->items[i];
      e->items[i].val = v;
      e->items[i].loc = loc;
      e->items[i].imported = imported;
      return prev;
    }
  }
  arena_grow(a, (void **)&e->items, &e->cap, e->n + 1, sizeof(binding));
  e->items[e->n++] = (binding){.name = name, .val = v, .loc = loc, .imported = imported};
  return NULL;
}

binding *env_lookup(env *e, const char *name) {
  for (; e; e = e->parent)
    for (int i = e->n - 1; i >= 0; i--)
      if (strcmp(e->items[i].name, name) == 0) return &e->items[i];
  return NULL;
}
