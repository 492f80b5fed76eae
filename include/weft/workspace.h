/* workspace.h - a loaded workspace: the files of a .plan and everything it
 * imports, their top-level items and diagnostics; models built into graphs
 * and clusters into records. The first stages of the pipeline (docs/design/architecture.md). */
#ifndef WEFT_WORKSPACE_H
#define WEFT_WORKSPACE_H

#include <stdbool.h>
#include <stdio.h>

#include "weft/ast.h"
#include "weft/graph.h"
#include "weft/plan.h"
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
 * diagnostics. weft_cluster_of (cluster.h) reads it. */
value weft_build_cluster(weft_ctx *c, value cluster, weft_loc use);
/* Evaluates a plan value: its model's graph, its cluster, its body as a
 * list of decisions applied by the plan builder (plan.h). NULL after
 * diagnostics. o may be NULL. */
weft_plan *weft_build_plan(weft_ctx *c, value plan, weft_loc use, const plan_opts *o);

#endif
