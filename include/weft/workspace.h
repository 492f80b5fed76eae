/* workspace.h - a loaded workspace: the files of a .plan and everything it
 * imports, their top-level items and diagnostics; models built into graphs
 * and clusters into records. The first stages of the pipeline (docs/design/architecture.md). */
#ifndef WEFT_WORKSPACE_H
#define WEFT_WORKSPACE_H

#include <stdbool.h>
#include <stdio.h>

#include "weft/cluster.h"
#include "weft/context.h"
#include "weft/decisions.h"
#include "weft/graph.h"

weft_ctx *weft_new(void);
void weft_free(weft_ctx *c);
/* Records --set NAME=VALUE; false (and a diagnostic) when malformed. */
bool weft_set(weft_ctx *c, const char *assignment);
/* Lets `use` read files under dir too (--allow-path); false (and a
 * diagnostic) when dir is not a directory. */
bool weft_allow_path(weft_ctx *c, const char *dir);
/* Parses and evaluates a file and everything it imports. A `use` reads
 * only under the file's own directory, the standard library's and those
 * weft_allow_path gave: an absolute path, a `..` or a symbolic link that
 * leaves them is an error at the `use`, and the file is not opened.
 * Returns WEFT_OK, WEFT_REJECTED (diagnostics in c->diags) or WEFT_FAILED
 * (file unreadable). */
int weft_load(weft_ctx *c, const char *path);
/* Same, for text in memory (fuzzing, tests); its `use` reads under the
 * current directory. */
int weft_load_text(weft_ctx *c, const char *name, const char *text, size_t len);

/* Top-level definitions of the main file, in source order. */
typedef struct weft_item {
  const char *name;
  value val;
  weft_loc loc;
} weft_item;
int weft_items(weft_ctx *c, value_kind kind, weft_item *out, int max);
/* An expression given as text (--cluster 'a100_dgx(nodes = 8)'), evaluated
 * in the main file's scope; V_ERROR after diagnostics located in the text,
 * which label names. */
value weft_eval_text(weft_ctx *c, const char *label, const char *text);

/* Builds the operator graph of a model value (all parameters bound or
 * defaulted); NULL after diagnostics. */
weft_graph *weft_build_graph(weft_ctx *c, value model, weft_loc use);
/* Evaluates a cluster value to its record (fields checked); V_ERROR after
 * diagnostics. weft_cluster_of (cluster.h) reads it. */
value weft_build_cluster(weft_ctx *c, value cluster, weft_loc use);
/* A plan value evaluated: its model's graph, its cluster, and its body as
 * a list of decisions, for plan_apply (plan.h). The list's placer
 * evaluates the device expressions of `assign` when apply asks. A plan
 * with a `search` statement is not complete: search_at says where weft
 * search puts the decisions it writes. */
typedef struct weft_plan_src {
  weft_graph *graph;
  weft_cluster cluster;
  weft_decisions decisions;
  int search_at;          /* decisions[0..search_at) stand before `search`; -1: no `search` */
  weft_loc search_loc;
} weft_plan_src;

/* False after diagnostics. Everything lives in c's arena. */
bool weft_eval_plan(weft_ctx *c, value plan, weft_loc use, weft_plan_src *out);

#endif
