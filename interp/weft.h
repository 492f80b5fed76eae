/* weft.h - the library API behind the CLI: load a .plan file, evaluate it,
 * build model graphs and clusters. Tests and tools call this, not main.c. */
#ifndef WEFT_WEFT_H
#define WEFT_WEFT_H

#include <stdbool.h>
#include <stdio.h>

#include "ast.h"
#include "graph.h"
#include "value.h"

#define WEFT_VERSION "0.1.0"

/* Exit statuses: accepted, input rejected, weft itself failed. */
enum { WEFT_OK = 0, WEFT_REJECTED = 1, WEFT_FAILED = 2 };

typedef struct weft_override {
  const char *name;
  const char *text;      /* the expression as given after '=' */
  bool used;
} weft_override;

typedef struct weft_module {
  const char *key;       /* canonical path, or "<std>/NAME" */
  int file;              /* index in srcs */
  env *env;              /* its top-level names (imports included) */
  const ast *root;
  bool loading;          /* on the import stack: a second visit is a cycle */
  bool failed;           /* had errors: a second `use` fails quietly */
} weft_module;

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

typedef struct weft_ctx {
  arena arena;
  weft_srcs srcs;
  weft_diags diags;
  const char *stdlib_dir;        /* NULL: the embedded standard library */
  weft_override *overrides;
  int noverrides, ocap;
  weft_module *modules;
  int nmodules, mcap;
  weft_module *main;             /* modules[0], set once loading ends */
  env *builtins;                 /* dtypes and built-in functions */
  bool import_failed;            /* some `use` failed: unknown names may follow */
  int64_t steps;                 /* evaluation steps, bounded */
  int depth;                     /* function and sub-model call depth */
  struct mstate *model;          /* the model under construction, or NULL */
  bool reps;                     /* plans keep one program per class of
                                  * data-parallel replicas (plan.h, rep) */
  bool full_programs;            /* lowered programs keep their full
                                  * instructions (lower.h, lprog.ins): for
                                  * printing and running them */
} weft_ctx;

weft_ctx *weft_new(void);
void weft_free(weft_ctx *c);
/* Records --set NAME=VALUE; false (and a diagnostic) when malformed. */
bool weft_set(weft_ctx *c, const char *assignment);
/* Parses and evaluates a file and everything it imports. Returns WEFT_OK,
 * WEFT_REJECTED (diagnostics in c->diags) or WEFT_FAILED (file unreadable). */
int weft_load(weft_ctx *c, const char *path);
/* Same, for text in memory (fuzzing, tests). */
int weft_load_text(weft_ctx *c, const char *name, const char *text, size_t len);

/* Top-level definitions of the main file, in source order. */
typedef struct weft_item {
  const char *name;
  value val;
  weft_loc loc;
} weft_item;
int weft_items(weft_ctx *c, value_kind kind, weft_item *out, int max);

/* Builds the operator graph of a model value (all parameters bound or
 * defaulted); NULL after diagnostics. */
weft_graph *weft_build_graph(weft_ctx *c, value model, weft_loc use);
/* Evaluates a cluster value to its record (fields checked); V_ERROR after
 * diagnostics. */
value weft_build_cluster(weft_ctx *c, value cluster, weft_loc use);

/* The evaluator's internals shared between eval.c and model.c. */
value eval_expr(weft_ctx *c, env *e, const ast *n);
value eval_call_value(weft_ctx *c, value f, int nargs, const ast *const *args,
                      weft_loc loc, env *e);
bool eval_step(weft_ctx *c, weft_loc loc);
/* A boolean condition (`if`): false after a diagnostic. */
bool eval_condition(weft_ctx *c, env *e, const ast *x, bool *out);
/* `assert COND, MESSAGE`: false (and a diagnostic) when it fails. */
bool eval_assert(weft_ctx *c, env *e, const ast *s);
weft_diag *eval_error(weft_ctx *c, weft_loc loc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A dotted path (E_NAME/E_MEMBER) as a string, "h.3.attn"; NULL if n is not a
 * path or a {segment} fails (diagnostic reported, *failed set). */
const char *eval_path(weft_ctx *c, env *e, const ast *n, bool *failed);
/* Binds a model's or cluster's parameters (bound ones, then defaults) into
 * target; with args, the named arguments of a call as well. */
bool eval_bind_decl(weft_ctx *c, vdecl *d, env *target, weft_loc loc);
bool eval_bind_named(weft_ctx *c, vdecl *d, int nargs, const ast *const *args, env *argenv,
                     env *target, weft_loc loc);
/* Statement lists in model bodies (model.c). */
bool model_exec_body(weft_ctx *c, env *e, const ast_list *body);
opdecl *opdecl_build(weft_ctx *c, env *e, const ast *n);

#endif
