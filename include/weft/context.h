/* context.h - the state of one evaluation (weft_ctx): its files and
 * modules, diagnostics, overrides from --set, and the arena that holds
 * what it evaluates. workspace.h loads files into it; src/eval reads and
 * writes it. */
#ifndef WEFT_CONTEXT_H
#define WEFT_CONTEXT_H

#include <stdbool.h>
#include <stdint.h>

#include "weft/ast.h"
#include "weft/value.h"

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


/* A graph built once: the plans of a file share their models' graphs. */
typedef struct weft_built_graph {
  const vdecl *decl;      /* the model value's: its syntax, scope, name and bound arguments */
  struct weft_graph *g;
} weft_built_graph;

/* A filling of an open decision (`?`): the number the search tries there. */
typedef struct weft_fill {
  weft_loc loc;           /* the `?` */
  int64_t value;
} weft_fill;

typedef struct weft_ctx {
  arena arena;
  weft_srcs srcs;
  weft_diags diags;
  const char *stdlib_dir;        /* NULL: the embedded standard library */
  const char *tree;              /* the main file's directory, a real path: `use`
                                  * reads under it (NULL until a file is loaded) */
  const char **allowed;          /* more directories `use` may read under
                                  * (--allow-path), real paths */
  int nallowed, acap;
  weft_override *overrides;
  int noverrides, ocap;
  weft_module *modules;
  int nmodules, mcap;
  weft_module *main;             /* modules[0], set once loading ends */
  env *builtins;                 /* dtypes and built-in functions */
  bool import_failed;            /* some `use` failed: unknown names may follow */
  int64_t steps;                 /* evaluation steps, bounded */
  int depth;                     /* function and sub-model call depth */
  struct model_scope *model;     /* the model under construction, or NULL */
  const struct weft_graph *plan_graph; /* the model of the plan being evaluated, or NULL */
  weft_built_graph *built;       /* graphs built so far (weft_build_graph) */
  int nbuilt, bcap;
  const weft_fill *fills;        /* values of the `?` of a plan under search, or NULL */
  int nfills;
  const vdecl *cluster_plan;     /* a plan whose `on` is replaced (weft search --cluster), or NULL */
  value cluster_value;           /* the cluster it is on instead */
} weft_ctx;

#endif
