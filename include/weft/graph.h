/* graph.h - the operator graph a model evaluates to: tensors with shapes and
 * dtypes, operators with their signature bindings and costs. */
#ifndef WEFT_GRAPH_H
#define WEFT_GRAPH_H

#include <stdio.h>
#include <string.h>

#include "weft/value.h"

/* ---- operator declarations (`op NAME(...) -> ... { ... }`) ---------------- */

/* A signature dimension: "m", "k+", "h^", "b..", or a group "(3 n dh)". */
typedef struct opfactor {
  const char *name;      /* NULL for an integer factor */
  int64_t value;
  int mark;              /* 0, '+' or '^' */
} opfactor;

typedef struct opdim {
  const char *name;      /* NULL for a group */
  int mark;              /* 0, '+', '^' or T_DOTDOT */
  int nfactors;
  opfactor *factors;
  weft_loc loc;
} opdim;

typedef struct oppattern {
  bool has_dtype;
  weft_dtype dtype;
  int ndims;
  opdim *dims;
} oppattern;

typedef struct oparg {
  const char *name;
  bool tensor;           /* a tensor argument (has a pattern) or an attribute */
  oppattern pat;
  const ast *def;        /* attribute default, or NULL (required) */
} oparg;

struct opdecl {
  const char *name;
  const ast *node;       /* S_OP */
  env *closure;
  int nargs;
  oparg *args;
  oppattern result;
  const char *kind;      /* "matmul", ...: the literal `kind` entry, if constant */
  /* Native kernels (docs/language.md, "Native kernels"): "LIB:SYMBOL" from
   * the `kernel` and `kernel_backward` entries, checked for form only; NULL
   * when absent. Only `weft run --allow-native` opens LIB. */
  const char *native_fwd;
  const char *native_bwd;
  weft_loc native_loc;       /* the `kernel` entry, for errors in loading it */
  weft_loc native_bwd_loc;   /* the `kernel_backward` entry */
  const char *native_dir;    /* a relative LIB is relative to this directory: the
                              * declaring file's, "" for the current one, with
                              * a trailing '/' otherwise */
};

/* ---- the graph ---------------------------------------------------------------- */

/* One dimension of a tensor: its size and, when the model named it, the
 * model's dimension name ("hidden"), which plans use to name splits. */
typedef struct gdim {
  int64_t size;
  const char *name;
} gdim;

typedef enum { TENSOR_INPUT, TENSOR_PARAM, TENSOR_ACT } tensor_role;

typedef struct gtensor {
  const char *name;      /* full path: "h.3.attn.c_attn.weight", "h.3.ln_1" */
  tensor_role role;
  weft_dtype dtype;
  int ndims;
  gdim *dims;
  int producer;          /* operator index, or -1 for inputs and parameters */
  weft_loc loc;          /* the declaration or the call that made it */
} gtensor;

/* How one signature dimension name was bound at a call. A group dimension
 * (b..) binds a list of sizes; a plain one binds one. */
typedef struct gbind {
  const char *name;      /* the signature's name: "m", "k", "b" */
  int n;                 /* number of sizes: 1, or the group's length */
  int64_t *sizes;
  const char *dim_name;  /* the model dimension name it matched, or NULL */
  const char **dim_names; /* per size: the model dimension names (or NULL) */
  const char *arg;       /* the argument (or attribute) that bound it */
} gbind;

typedef struct gop {
  const char *name;      /* full path, also the name of its result tensor */
  const opdecl *decl;
  int ninputs;
  int *inputs;           /* tensor indices, in signature order */
  int output;
  vrecord *attrs;        /* attribute values after defaults */
  int nbinds;
  gbind *binds;
  double flops;          /* forward work */
  double bytes;          /* forward memory traffic */
  const char *kind;      /* operator class for the cost model */
  weft_loc loc;
} gop;

typedef struct weft_graph {
  const char *name;      /* the model's name */
  gtensor *tensors;
  int ntensors, tcap;
  gop *ops;
  int nops, ocap;
  int loss;              /* tensor index of the loss, or -1 (no `train`) */
  const char *optimizer; /* "adamw", or NULL */
  const opdecl *optimizer_decl;
  vrecord *optimizer_args;
  int optimizer_state;    /* state tensors it keeps per parameter element (AdamW 2), from its `state` entry */
  int grad_dtype;         /* `train`'s `grads`: the dtype parameter gradients are
                           * accumulated and reduced in; -1: the default
                           * (graph_grad_dtype) */
  int master;             /* `train`'s `master`: 1 master weights in f32 for
                           * 16-bit parameters, 0 none, -1 the default (1) */
  int output;            /* tensor index of `output`, or -1 */
  /* name -> tensor index, open addressing */
  const char **hkeys;
  int *hvals;
  int hcap, hcount;
} weft_graph;

weft_graph *graph_new(arena *a, const char *name);
/* Adds a tensor; -1 if its name is taken. */
int graph_add_tensor(arena *a, weft_graph *g, const char *name, tensor_role role,
                     weft_dtype dt, int ndims, const gdim *dims, weft_loc loc);
/* Binds an extra name to an existing tensor (a sub-model's output); false if taken. */
bool graph_alias(arena *a, weft_graph *g, const char *name, int tensor);
int graph_find(const weft_graph *g, const char *name);
int gop_add(arena *a, weft_graph *g);

int64_t tensor_numel(const gtensor *t);

/* Mixed precision, as Megatron-LM keeps it by default: a bf16 parameter's
 * gradient is accumulated and reduced in f32, any other's in its own dtype,
 * unless `train` says `grads = DTYPE`. */
weft_dtype graph_grad_dtype(const weft_graph *g, int t);

/* The settings of a model's optimizer (its `train` statement's arguments),
 * with the defaults that stand in for a graph made without them
 * (docs/program.md, optimizer). Inline: the backend plugins, which link
 * nothing of weft, read them too. */
typedef struct weft_optim_settings {
  double lr, beta1, beta2, eps, weight_decay, momentum;
} weft_optim_settings;

/* Attribute `name` of operator op as a number (an int, bool or float
 * argument of its declaration), dflt when it has none: read here by the
 * CPU backend and the CUDA plugin alike. */
static inline double graph_op_attr(const weft_graph *g, int op, const char *name, double dflt) {
  const vrecord *r = g->ops[op].attrs;
  for (int i = 0; r && i < r->n; i++) {
    if (strcmp(r->keys[i], name) != 0) continue;
    const value *v = &r->vals[i];
    if (v->kind == V_INT || v->kind == V_BOOL) return (double)v->i;
    if (v->kind == V_FLOAT) return v->f;
  }
  return dflt;
}

static inline weft_optim_settings graph_optimizer_settings(const weft_graph *g) {
  weft_optim_settings o = {1e-3, 0.9, 0.999, 1e-8, 0.0, 0.0};
  const vrecord *r = g->optimizer_args;
  for (int i = 0; r && i < r->n; i++) {
    const value *v = &r->vals[i];
    double x = v->kind == V_FLOAT ? v->f : v->kind == V_INT ? (double)v->i : 0.0;
    const char *k = r->keys[i];
    if (strcmp(k, "lr") == 0) o.lr = x;
    else if (strcmp(k, "beta1") == 0) o.beta1 = x;
    else if (strcmp(k, "beta2") == 0) o.beta2 = x;
    else if (strcmp(k, "eps") == 0) o.eps = x;
    else if (strcmp(k, "weight_decay") == 0) o.weight_decay = x;
    else if (strcmp(k, "momentum") == 0) o.momentum = x;
  }
  return o;
}
/* Whether parameter t has master weights: an f32 copy that the optimizer
 * steps, from which the 16-bit parameter is rounded (16-bit parameters
 * have them unless `train` says `master = false`; f32 ones are their own). */
bool graph_has_master(const weft_graph *g, int t);
/* Elements per element of its master buffer: the f32 weight, and an f32
 * copy of the gradient when the gradient is narrower (Megatron-LM's fp16
 * runs: 20 bytes per parameter); 0 without master weights. */
int graph_master_copies(const weft_graph *g, int t);
/* Bytes per element that training keeps for parameter t: the parameter,
 * its gradient, its master weights and its optimizer state (f32): 18 for
 * bf16 with AdamW (2 + 4 + 4 + 8), 16 for f32, 20 for f16. */
int graph_train_bytes(const weft_graph *g, int t);
int64_t graph_param_count(const weft_graph *g);
int64_t graph_param_bytes(const weft_graph *g);
double graph_forward_flops(const weft_graph *g);

void graph_print_text(const weft_graph *g, FILE *out);
void graph_print_json(const weft_graph *g, FILE *out);
void graph_print_dot(const weft_graph *g, FILE *out);
/* Whether a dotted operator name matches a pattern of segments, where "*"
 * is one segment and "**" any number (zero included). */
bool graph_glob_match(const char *const *pat, int np, const char *name);
/* "f32[batch=32, hidden=4096]" */
const char *tensor_type_str(arena *a, const gtensor *t);

#endif
