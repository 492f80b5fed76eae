/* value.h - the values the evaluator computes with, and their environments.
 * Ownership: values are immutable and live in the weft_ctx arena until weft_free. */
#ifndef WEFT_VALUE_H
#define WEFT_VALUE_H

#include <stdbool.h>
#include <stdint.h>

#include "weft/ast.h"
#include "weft/units.h"

typedef enum {
  V_ERROR,     /* evaluation failed; the diagnostic is already reported */
  V_NONE,
  V_INT, V_FLOAT, V_BOOL, V_STRING, V_QUANTITY, V_RANGE, V_LIST, V_RECORD,
  V_DTYPE,
  V_FN,        /* fn NAME(...) = expr, with the environment it was defined in */
  V_BUILTIN,
  V_OPDECL,    /* an `op` declaration */
  V_MODEL,     /* a `model`, possibly with some parameters already bound */
  V_CLUSTER,   /* a `cluster` declaration, possibly with parameters bound */
  V_TENSOR,    /* a tensor of the model graph under construction */
  V_PLAN,      /* a `plan`, possibly with parameters bound */
  V_STRATEGY,  /* a `strategy`: a plan fragment called from plans */
  V_MESH,      /* a device mesh of the plan under evaluation */
} value_kind;

typedef enum { DT_F32, DT_BF16, DT_F16, DT_I32, DT_COUNT } weft_dtype;
extern const char *const dtype_names[DT_COUNT];
extern const int dtype_bytes[DT_COUNT];
bool dtype_is_float(weft_dtype d);

typedef struct value value;
typedef struct vlist vlist;
typedef struct vrecord vrecord;
typedef struct env env;
typedef struct opdecl opdecl;
typedef struct vdecl vdecl;
typedef struct builtin builtin;
struct pmesh;

struct value {
  value_kind kind;
  union {
    int64_t i;                              /* V_INT, V_BOOL */
    double f;                               /* V_FLOAT */
    const char *s;                          /* V_STRING */
    struct { double v; unit_dim d; } q;     /* V_QUANTITY, v in base units */
    struct { int64_t lo, hi; } r;           /* V_RANGE [lo, hi) */
    vlist *list;
    vrecord *rec;
    weft_dtype dt;
    const builtin *bi;
    opdecl *op;
    vdecl *decl;                            /* V_FN, V_MODEL, V_CLUSTER, V_PLAN, V_STRATEGY */
    struct pmesh *mesh;                     /* V_MESH */
    int tensor;                             /* V_TENSOR: index in the graph */
  };
};

struct vlist { int n; value *items; };
struct vrecord { int n; const char **keys; value *vals; };

/* A function, model or cluster: its syntax, where it was defined, and the
 * arguments bound so far (model gpt2 = gpt(layers = 12, ...)). */
struct vdecl {
  const ast *node;          /* S_FN, S_MODEL or S_CLUSTER */
  env *closure;
  vrecord *bound;           /* NULL or the bound parameters by name */
  const char *name;
};

/* An environment: one scope of names, chained to its parent. */
typedef struct binding {
  const char *name;
  value val;
  weft_loc loc;             /* where it was defined, for "defined here" notes */
  bool imported;            /* came from `use`: may be shadowed */
} binding;

struct env {
  env *parent;
  binding *items;
  int n, cap;
};

static inline value v_error(void) { value v = {.kind = V_ERROR}; return v; }
static inline value v_none(void) { value v = {.kind = V_NONE}; return v; }
static inline value v_int(int64_t i) { value v = {.kind = V_INT, .i = i}; return v; }
static inline value v_float(double f) { value v = {.kind = V_FLOAT, .f = f}; return v; }
static inline value v_bool(bool b) { value v = {.kind = V_BOOL, .i = b}; return v; }
static inline value v_string(const char *s) { value v = {.kind = V_STRING, .s = s}; return v; }
static inline value v_tensor(int t) { value v = {.kind = V_TENSOR, .tensor = t}; return v; }

/* A built-in function of the language (src/eval/eval.c defines them). */
struct weft_ctx;
struct builtin {
  const char *name;
  int min, max;           /* argument counts; max -1: any */
  value (*fn)(struct weft_ctx *c, int n, value *args, weft_loc loc);
};

const char *value_kind_name(value_kind k);
/* Appends a readable rendering (as weft source where one exists). */
const char *value_show(arena *a, value v);
/* The same for messages: strings in quotes ("a100"), so they read as values. */
const char *value_repr(arena *a, value v);
bool value_equal(value a, value b);
/* A record's field or NULL. */
const value *record_get(const vrecord *r, const char *key);

env *env_new(arena *a, env *parent);
/* Defines name in e (not its parents); returns the previous binding of
 * that name in e itself, or NULL. */
binding *env_define(arena *a, env *e, const char *name, value v, weft_loc loc, bool imported);
binding *env_lookup(env *e, const char *name);

#endif
