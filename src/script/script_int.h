/* script_int.h - what the files of src/script share: a script's Lua state
 * and the sandbox around it (sandbox.c), the tables scripts read
 * (tables.c), the `weft` library and decision lists (weft_lib.c). */
#ifndef WEFT_SCRIPT_INT_H
#define WEFT_SCRIPT_INT_H

#include <lauxlib.h>
#include <lua.h>

#include "weft/plan.h"
#include "weft/script.h"

enum { SCRIPT_MAX = 32, SCRIPT_FRAMES = 12 };

/* The hooks a script's table may hold. */
typedef enum { HOOK_SPACE, HOOK_PRUNE, HOOK_RANK, HOOK_POLICY, HOOK_COUNT } hook_kind;
extern const char *const hook_names[HOOK_COUNT];

/* Why the scripts were stopped. */
typedef enum { DEAD_NO, DEAD_STEPS, DEAD_MEMORY } dead_kind;

/* One frame of a traceback, taken where an error was raised. */
typedef struct script_frame {
  int line;
  bool mine;              /* in the script's own file (else a chunk it loaded) */
  char where[96];         /* "function 'helper'", "the main chunk" */
  char src[64];           /* the chunk, as Lua names it in messages */
} script_frame;

typedef struct script_one {
  weft_scripts *S;
  lua_State *L;
  const char *path;       /* as given, or "<std>/heuristics/NAME.lua" */
  const char *chunk;      /* "@" path: the chunk's source as Lua keeps it */
  char short_src[LUA_IDSIZE]; /* how Lua names it at the start of messages */
  int file;               /* its index in the world's sources */
  int nlines;
  const char *name;       /* a plan name made of the file's ("megatron") */
  int hook[HOOK_COUNT];   /* registry references, LUA_NOREF where absent */
  int hook_line[HOOK_COUNT]; /* where each was defined */
  int ref_model, ref_cluster, ref_weft;
  const char *calling;    /* the hook being called, NULL at load */
  int entry_line;         /* the line of what is being called */
  int last_line;          /* the line the count hook last saw running */
  int kill_line;          /* where a budget stopped it */
  int nframes;
  script_frame frames[SCRIPT_FRAMES];
} script_one;

struct weft_scripts {
  script_world w;
  int64_t steps_used;     /* instructions run, by all scripts */
  int64_t mem_used;       /* bytes held, by all scripts */
  dead_kind dead;
  bool failed;            /* a script error was reported: nothing more runs */
  int n;
  script_one *items[SCRIPT_MAX];
  arena tmp;              /* weft.estimate's plans, reset after each */
  arena keep;             /* the scripts' own */
};

/* ---- sandbox.c ------------------------------------------------------------ */

/* A Lua state with the sandbox's libraries, budgets and read-only globals
 * (the `weft` library among them); NULL when Lua cannot start. */
lua_State *sandbox_open(script_one *one);
void sandbox_close(script_one *one);
/* Loads text as the script's chunk and runs it, leaving its one result on
 * the stack; false after a diagnostic. */
bool sandbox_run_chunk(script_one *one, const char *text, size_t len);
/* Runs body(L) with ud and the nargs values on top of the stack (which it
 * takes) as its arguments, protected: whatever body does with Lua (calling
 * a hook, making or reading tables) may fail, and is reported as the
 * script's error (hook names what is called, line where it was defined).
 * False after a diagnostic. */
bool sandbox_protected(script_one *one, const char *hook, int line, lua_CFunction body, void *ud, int nargs);
/* A read-only view of the table at idx, pushed. */
void sandbox_push_readonly(lua_State *L, int idx);
/* An error at line of one's file (0: the file), as a diagnostic; marks
 * the scripts failed. */
weft_diag *script_error(script_one *one, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Stops the scripts when their instructions are past the budget after
 * counting n more (weft.estimate's work); raises the error when so. */
void sandbox_charge(lua_State *L, int64_t n);
/* The line of one's file the innermost function of L runs at, or 0. */
int sandbox_line(script_one *one, lua_State *L);
/* Stops the scripts for want of memory (a call that failed with LUA_ERRMEM). */
void sandbox_out_of_memory(lua_State *L);
script_one *sandbox_one(lua_State *L);

/* ---- tables.c ------------------------------------------------------------- */

/* The read-only tables of the model and the cluster, pushed. */
void tables_push_model(lua_State *L, const weft_graph *g, arena *a);
void tables_push_cluster(lua_State *L, const weft_cluster *cl, const weft_graph *g);
/* A candidate of the search as a table, pushed. */
void tables_push_candidate(lua_State *L, const weft_graph *g, const search_plan *c);
/* The search's space as a table, pushed; read back into s (new lists in
 * a) from the table at idx, false after a diagnostic. */
void tables_push_space(lua_State *L, const search_space *s);
bool tables_read_space(script_one *one, int idx, search_space *s, arena *a);
/* JSON text as Lua values, pushed; false (nothing pushed) on malformed text. */
bool tables_push_json(lua_State *L, const char *text);
/* The repeated blocks of g (NAME.0 ... NAME.{n-1}): their count (0: none),
 * their name in name[0..n). */
int tables_blocks(const weft_graph *g, char *name, size_t n);

/* ---- weft_lib.c ----------------------------------------------------------- */

/* The `weft` library, pushed as a read-only table. */
void weft_lib_push(lua_State *L, script_one *one);
/* A decision list (the table at idx, nested lists flattened) as decisions
 * and the selectors they were written with, in a. On an error: false and
 * *line, msg say where and what. */
bool weft_lib_decisions(script_one *one, lua_State *L, int idx, arena *a, weft_decisions *out,
                        const char ***selectors, int *line, char *msg, size_t nmsg);
/* Whether s can name a mesh, an axis, a stage or a plan: letters, digits
 * and _, not a keyword of the language. */
bool weft_lib_is_name(const char *s);
/* The fields of a candidate (tp, pp, ..., its stages in a) read off a decision list. */
void weft_lib_describe(const weft_graph *g, const weft_decisions *d, search_plan *sp, arena *a);

#endif
