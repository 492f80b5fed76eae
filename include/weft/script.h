/* script.h - search heuristics and policies written in Lua (weft search
 * --heuristic): scripts that narrow or widen the search's space, prune and
 * rank its candidates (through search.h's hooks), or write whole plans with
 * the language's primitives, in a sandbox that bounds their instructions
 * and memory. What scripts see and may call is in docs/lua.md. */
#ifndef WEFT_SCRIPT_H
#define WEFT_SCRIPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "weft/search.h"

/* Instructions all the scripts of one search may run together, and the
 * bytes they may hold (--lua-steps, --lua-memory). */
#define SCRIPT_DEFAULT_STEPS ((int64_t)100000000)
#define SCRIPT_DEFAULT_MEMORY ((int64_t)256 << 20)

/* What the scripts work on, and where their diagnostics go. */
typedef struct script_world {
  const weft_graph *g;
  const weft_cluster *cl;
  bool symbolic;          /* weft.estimate with symbolic costs (--cost symbolic) */
  double max_memory;      /* bytes a device may use (--max-memory); 0: the cluster's */
  const char *stdlib_dir; /* heuristics by name from DIR/heuristics; NULL: those built in */
  weft_srcs *srcs;        /* each script joins them, so that diagnostics show its lines */
  weft_diags *dg;
  arena *a;               /* the decision lists of policies, and what the search keeps */
  int64_t steps;          /* the budgets; 0: the defaults above */
  int64_t memory;
} script_world;

typedef struct weft_scripts weft_scripts;

/* The scripts of one search, none loaded yet; w is copied. */
weft_scripts *scripts_new(const script_world *w);
void scripts_free(weft_scripts *s);

/* Loads a heuristic, a path (with a '/' or ending in .lua) or the name of
 * one of stdlib/heuristics, and runs its chunk, which returns its table of
 * hooks. False after diagnostics at the script's lines. */
bool scripts_load(weft_scripts *s, const char *name);
/* The same for a script given as text, named name in its messages. */
bool scripts_load_text(weft_scripts *s, const char *name, const char *text, size_t len);

/* Whether a script loaded so far writes whole plans (a policy). */
bool scripts_has_policy(const weft_scripts *s);

/* The search's hooks, calling those of every script in the order loaded;
 * the fields of hooks no script has are NULL. */
search_hooks scripts_hooks(weft_scripts *s);

/* Runs the scripts' policies, each writing a plan with the language's
 * primitives, and fills out as search_run would: every plan applied,
 * lowered, validated and simulated, pruned and ranked by the hooks, the
 * frontier and the best by o's objective. out->nsimulated is 0 when no
 * script has a policy or every policy returned nothing (the search is
 * then theirs). False after diagnostics. */
bool scripts_policies(weft_scripts *s, const search_opts *o, search_result *out);

#endif
