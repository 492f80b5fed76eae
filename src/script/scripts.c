/* scripts.c - the heuristics of one search: loading each script (a file,
 * or one of stdlib/heuristics by name) and reading its table of hooks;
 * the search's hooks, which call every script's in order; the policies,
 * whose plans go through apply, lowering, validation and the simulator
 * like written ones, and make a result as the search's does. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "heuristic_files.h"
#include "script_int.h"
#include "weft/sim.h"
#include "weft/units.h"
#include "weft/validate.h"

const char *const hook_names[HOOK_COUNT] = {"space", "prune", "rank", "policy"};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

weft_scripts *scripts_new(const script_world *w) {
  weft_scripts *S = calloc(1, sizeof *S);
  if (!S) weft_oom();
  S->w = *w;
  arena_init(&S->tmp);
  arena_init(&S->keep);
  return S;
}

void scripts_free(weft_scripts *S) {
  if (!S) return;
  for (int i = 0; i < S->n; i++) sandbox_close(S->items[i]);
  arena_free(&S->tmp);
  arena_free(&S->keep);
  free(S);
}

/* A plan name made of a file's: "megatron" of ".../megatron.lua". */
static const char *plan_name(arena *a, const char *path) {
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  size_t n = strlen(base);
  if (n > 4 && strcmp(base + n - 4, ".lua") == 0) n -= 4;
  char *s = arena_printf(a, "%s%.*s", n == 0 || isdigit((unsigned char)base[0]) ? "h_" : "", (int)n, base);
  for (char *p = s; *p; p++)
    if (!isalnum((unsigned char)*p) && *p != '_') *p = '_';
  return weft_lib_is_name(s) ? s : arena_printf(a, "%s_plan", s);  /* "plan.lua" */
}

static const weft_embedded_file *builtin_heuristic(const char *name) {
  for (int i = 0; i < weft_heuristic_count; i++) {
    const char *f = weft_heuristic_files[i].name;
    size_t n = strlen(name);
    if (strncmp(f, name, n) == 0 && strcmp(f + n, ".lua") == 0) return &weft_heuristic_files[i];
  }
  return NULL;
}

/* The text of heuristic `name` as a source of the world; -1 after a diagnostic. */
static int find_script(weft_scripts *S, const char *name) {
  weft_loc none = {0};
  size_t n = strlen(name);
  bool path = strchr(name, '/') || (n > 4 && strcmp(name + n - 4, ".lua") == 0);
  if (path) {
    char why[256];
    int f = src_read(S->w.srcs, S->w.a, name, why, sizeof why);
    if (f < 0) diag_add(S->w.dg, DIAG_ERROR, none, "cannot read heuristic %s: %s", name, why);
    return f;
  }
  if (S->w.stdlib_dir) {
    const char *p = arena_printf(S->w.a, "%s/heuristics/%s.lua", S->w.stdlib_dir, name);
    char why[256];
    int f = src_read(S->w.srcs, S->w.a, p, why, sizeof why);
    if (f < 0) {
      weft_diag *d = diag_add(S->w.dg, DIAG_ERROR, none, "cannot read heuristic %s: %s", p, why);
      diag_hint(d, S->w.dg, "the standard library is read from %s (--stdlib or WEFT_STDLIB)", S->w.stdlib_dir);
    }
    return f;
  }
  const weft_embedded_file *e = builtin_heuristic(name);
  if (!e) {
    const char **names = arena_alloc(S->w.a, sizeof(char *) * (size_t)(weft_heuristic_count + 1));
    const char *list = "";
    for (int i = 0; i < weft_heuristic_count; i++) {
      const char *f = weft_heuristic_files[i].name;
      names[i] = arena_strndup(S->w.a, f, strlen(f) - 4);
      list = arena_printf(S->w.a, "%s%s%s", list, i ? ", " : "", names[i]);
    }
    weft_diag *d = diag_add(S->w.dg, DIAG_ERROR, none, "unknown heuristic '%s': the standard library has %s", name, list);
    const char *best = diag_closest(name, names, weft_heuristic_count);
    if (best) diag_hint(d, S->w.dg, "did you mean '%s'?", best);
    else diag_hint(d, S->w.dg, "a file of your own is named by its path: --heuristic ./%s.lua", name);
    return -1;
  }
  return src_add(S->w.srcs, S->w.a, arena_printf(S->w.a, "<std>/heuristics/%s", e->name), "<std>/", e->text, e->len);
}

/* Reading the table a script's chunk returned (on top of the stack). */
typedef struct load_ctx {
  script_one *one;
  int last;               /* the script's last line that holds anything */
  int hooks;
  bool ok;
} load_ctx;

static int body_load(lua_State *L) {
  load_ctx *x = lua_touserdata(L, 1);
  script_one *one = x->one;
  weft_scripts *S = one->S;
  lua_settop(L, 2);  /* what the chunk returned */
  if (lua_type(L, -1) != LUA_TTABLE) {
    weft_diag *d = script_error(one, x->last, "a heuristic returns a table of its hooks (space, prune, rank, policy), "
                                "got %s", luaL_typename(L, -1));
    diag_hint(d, S->w.dg, "end the script with: return { prune = function(c) return c.tp <= 4 end }");
    return 0;
  }
  for (int h = 0; h < HOOK_COUNT; h++) {
    lua_pushstring(L, hook_names[h]);
    int t = lua_rawget(L, -2);
    if (t == LUA_TNIL) {
      lua_pop(L, 1);
      continue;
    }
    if (t != LUA_TFUNCTION) {
      script_error(one, x->last, "the %s hook must be a function, got %s", hook_names[h], lua_typename(L, t));
      return 0;
    }
    lua_Debug ar;
    lua_pushvalue(L, -1);
    lua_getinfo(L, ">S", &ar);
    one->hook_line[h] = ar.linedefined > 0 && strcmp(ar.source, one->chunk) == 0 ? ar.linedefined : x->last;
    one->hook[h] = luaL_ref(L, LUA_REGISTRYINDEX);
    x->hooks++;
  }
  /* functions under other names: a misspelt hook does nothing, so say so */
  lua_pushnil(L);
  while (lua_next(L, -2)) {
    if (lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TFUNCTION) {
      const char *k = lua_tostring(L, -2);
      bool known = false;
      for (int h = 0; h < HOOK_COUNT && !known; h++) known = strcmp(k, hook_names[h]) == 0;
      if (!known) {
        /* at the function's first line */
        lua_Debug ar;
        lua_pushvalue(L, -1);
        lua_getinfo(L, ">S", &ar);
        int line = ar.linedefined > 0 && strcmp(ar.source, one->chunk) == 0 ? ar.linedefined : x->last;
        const weft_src *src = &S->w.srcs->items[one->file];
        int len = 0, col = 0;
        const char *text = src_line(src, line, &len);
        while (text && col < len && (text[col] == ' ' || text[col] == '\t')) col++;
        weft_loc at = {one->file, line, col < len ? col + 1 : 1, line, len > 0 ? len : 1};
        weft_diag *d = diag_add(S->w.dg, DIAG_WARNING, at, "'%s' is not a hook: weft calls space, prune, rank and policy", k);
        const char *best = diag_closest(k, hook_names, HOOK_COUNT);
        if (best) diag_hint(d, S->w.dg, "did you mean '%s'?", best);
      }
    }
    lua_pop(L, 1);
  }
  if (x->hooks == 0) {
    weft_diag *d = script_error(one, x->last, "the heuristic's table has none of the hooks space, prune, rank and policy");
    diag_hint(d, S->w.dg, "docs/lua.md says what each hook does");
    return 0;
  }
  x->ok = true;
  return 0;
}

/* Loads the script that is source `file` of the world. */
static bool load_file(weft_scripts *S, int file) {
  weft_loc none = {0};
  const weft_src *src = &S->w.srcs->items[file];
  script_one *one = arena_alloc(&S->keep, sizeof *one);
  one->S = S;
  one->path = src->path;
  one->chunk = arena_printf(&S->keep, "@%s", src->path);
  one->file = file;
  one->name = plan_name(S->w.a, src->path);  /* the plan keeps it after the scripts are gone */
  one->ref_model = one->ref_cluster = one->ref_weft = LUA_NOREF;
  for (int h = 0; h < HOOK_COUNT; h++) one->hook[h] = LUA_NOREF;
  S->items[S->n++] = one;
  if (!sandbox_open(one) || S->dead == DEAD_MEMORY) {
    diag_add(S->w.dg, DIAG_ERROR, none, "cannot start Lua for heuristic %s: the scripts' memory budget is spent "
             "(--lua-memory)", one->path);
    S->failed = true;
    return false;
  }
  if (!sandbox_run_chunk(one, src->text, src->len)) return false;
  /* where a `return` would stand: the last line that holds anything */
  load_ctx x = {one, src->nlines, 0, false};
  for (int len; x.last > 1; x.last--) {
    const char *t = src_line(src, x.last, &len);
    bool blank = true;
    for (int i = 0; t && i < len && blank; i++) blank = isspace((unsigned char)t[i]);
    if (!blank) break;
  }
  return sandbox_protected(one, NULL, x.last, body_load, &x, 1) && x.ok;
}

static bool room(weft_scripts *S) {
  weft_loc none = {0};
  if (S->failed) return false;
  if (S->n < SCRIPT_MAX) return true;
  diag_add(S->w.dg, DIAG_ERROR, none, "at most %d heuristics, got more", SCRIPT_MAX);
  return false;
}

bool scripts_load(weft_scripts *S, const char *name) {
  if (!room(S)) return false;
  int file = find_script(S, name);
  return file >= 0 && load_file(S, file);
}

bool scripts_load_text(weft_scripts *S, const char *name, const char *text, size_t len) {
  if (!room(S)) return false;
  return load_file(S, src_add(S->w.srcs, S->w.a, name, "", text, len));
}

/* ---- the search's hooks -------------------------------------------------------- */

/* Pushes one's hook h. */
static void push_hook(script_one *one, hook_kind h) { lua_rawgeti(one->L, LUA_REGISTRYINDEX, one->hook[h]); }

/* Pushes the model and the cluster. */
static void push_world(script_one *one) {
  lua_rawgeti(one->L, LUA_REGISTRYINDEX, one->ref_model);
  lua_rawgeti(one->L, LUA_REGISTRYINDEX, one->ref_cluster);
}

/* A call of a hook: what it is given, and what came of it. */
typedef struct hook_ctx {
  script_one *one;
  search_space *space;
  arena *a;
  const search_plan *cand;
  bool ok;
  bool keep;
  double rank;
} hook_ctx;

static int body_space(lua_State *L) {
  hook_ctx *x = lua_touserdata(L, 1);
  script_one *one = x->one;
  tables_push_space(L, x->space);
  int st = lua_gettop(L);
  push_hook(one, HOOK_SPACE);
  lua_pushvalue(L, st);
  push_world(one);
  lua_call(L, 3, 1);
  int t = lua_type(L, -1);
  if (t == LUA_TNIL) x->ok = tables_read_space(one, st, x->space, x->a);
  else if (t == LUA_TTABLE) x->ok = tables_read_space(one, -1, x->space, x->a);
  else script_error(one, one->hook_line[HOOK_SPACE], "the space hook returns nothing or a table, got %s", lua_typename(L, t));
  return 0;
}

static bool hk_space(void *ctx, search_space *s, arena *a) {
  weft_scripts *S = ctx;
  for (int i = 0; i < S->n; i++) {
    script_one *one = S->items[i];
    if (one->hook[HOOK_SPACE] == LUA_NOREF) continue;
    hook_ctx x = {.one = one, .space = s, .a = a};
    if (!sandbox_protected(one, "space", one->hook_line[HOOK_SPACE], body_space, &x, 0) || !x.ok) return false;
  }
  return true;
}

static int body_prune(lua_State *L) {
  hook_ctx *x = lua_touserdata(L, 1);
  script_one *one = x->one;
  push_hook(one, HOOK_PRUNE);
  tables_push_candidate(L, one->S->w.g, x->cand);
  push_world(one);
  lua_call(L, 3, 1);
  int t = lua_type(L, -1);
  if (t != LUA_TNIL && t != LUA_TBOOLEAN) {
    script_error(one, one->hook_line[HOOK_PRUNE], "the prune hook returns true, false or nothing, got %s", lua_typename(L, t));
    return 0;
  }
  x->keep = t == LUA_TNIL || lua_toboolean(L, -1);
  x->ok = true;
  return 0;
}

static int hk_prune(void *ctx, const search_plan *c) {
  weft_scripts *S = ctx;
  for (int i = 0; i < S->n; i++) {
    script_one *one = S->items[i];
    if (one->hook[HOOK_PRUNE] == LUA_NOREF) continue;
    hook_ctx x = {.one = one, .cand = c};
    if (!sandbox_protected(one, "prune", one->hook_line[HOOK_PRUNE], body_prune, &x, 0) || !x.ok) return -1;
    if (!x.keep) return 0;
  }
  return 1;
}

static int body_rank(lua_State *L) {
  hook_ctx *x = lua_touserdata(L, 1);
  script_one *one = x->one;
  push_hook(one, HOOK_RANK);
  tables_push_candidate(L, one->S->w.g, x->cand);
  push_world(one);
  lua_call(L, 3, 1);
  int t = lua_type(L, -1);
  double v = t == LUA_TNUMBER ? lua_tonumber(L, -1) : 0;
  if (t != LUA_TNUMBER || v != v) {
    script_error(one, one->hook_line[HOOK_RANK], "the rank hook returns a number, got %s",
                 t == LUA_TNUMBER ? "nan" : lua_typename(L, t));
    return 0;
  }
  x->rank = v;
  x->ok = true;
  return 0;
}

static bool hk_rank(void *ctx, const search_plan *c, double *rank) {
  weft_scripts *S = ctx;
  search_plan cc = *c;
  for (int i = 0; i < S->n; i++) {
    script_one *one = S->items[i];
    if (one->hook[HOOK_RANK] == LUA_NOREF) continue;
    hook_ctx x = {.one = one, .cand = &cc};
    if (!sandbox_protected(one, "rank", one->hook_line[HOOK_RANK], body_rank, &x, 0) || !x.ok) return false;
    cc.rank = x.rank;
  }
  *rank = cc.rank;
  return true;
}

static bool any_hook(const weft_scripts *S, hook_kind h) {
  for (int i = 0; i < S->n; i++)
    if (S->items[i]->hook[h] != LUA_NOREF) return true;
  return false;
}

bool scripts_has_policy(const weft_scripts *S) { return any_hook(S, HOOK_POLICY); }

search_hooks scripts_hooks(weft_scripts *S) {
  search_hooks h = {.ctx = S};
  if (any_hook(S, HOOK_SPACE)) h.space = hk_space;
  if (any_hook(S, HOOK_PRUNE)) h.prune = hk_prune;
  if (any_hook(S, HOOK_RANK)) h.rank = hk_rank;
  return h;
}

/* ---- policies -------------------------------------------------------------------- */

/* Applies, lowers, validates and simulates a policy's plan with the
 * world's diagnostics: its figures in sp; false after diagnostics. */
static bool simulate_policy(weft_scripts *S, script_one *one, search_plan *sp, double max_memory) {
  const weft_graph *g = S->w.g;
  arena *a = &S->tmp;
  arena_reset(a);
  plan_opts po = {.reps = true};
  weft_plan *p = plan_apply(g, S->w.cl, &sp->decisions, &po, a, S->w.dg);
  weft_program *pr = p ? lower_plan(p, NULL, a, S->w.dg) : NULL;
  if (pr && !validate_program(pr, &(validate_opts){.skip_memory = true}, S->w.dg)) pr = NULL;
  hw_model hw;
  if (pr && !S->w.symbolic && !hw_from_plan(S->w.dg, p, pr, &hw)) pr = NULL;
  weft_sim *sim = pr ? sim_run_with(pr, S->w.symbolic ? NULL : &hw, 0) : NULL;
  if (!sim) {
    weft_loc none = {0};
    if (pr) diag_add(S->w.dg, DIAG_ERROR, none, "the programs of the plan of %s do not finish in the simulation", one->path);
    S->failed = true;
    return false;
  }
  weft_estimate e;
  sim_estimate(sim, &e);
  sp->simulated = true;
  sp->step_time = e.step_time;
  sp->peak_memory = e.peak_max;
  double cap = max_memory > 0 ? max_memory : (double)e.device_memory;
  sp->fits = cap <= 0 || (double)e.peak_max <= cap;
  sim_free(sim);
  arena_reset(a);
  return true;
}

/* A call of a policy: the plan it wrote. */
typedef struct policy_ctx {
  script_one *one;
  arena *a;
  search_plan sp;
  bool wrote;             /* it returned a decision list */
  bool ok;                /* which reads as a plan */
} policy_ctx;

static int body_policy(lua_State *L) {
  policy_ctx *x = lua_touserdata(L, 1);
  script_one *one = x->one;
  int line = one->hook_line[HOOK_POLICY];
  push_hook(one, HOOK_POLICY);
  push_world(one);
  lua_rawgeti(L, LUA_REGISTRYINDEX, one->ref_weft);
  lua_call(L, 3, 1);
  int t = lua_type(L, -1);
  if (t == LUA_TNIL) return 0;
  x->wrote = true;
  if (t != LUA_TTABLE) {
    script_error(one, line, "the policy hook returns a decision list or nothing, got %s", lua_typename(L, t));
    return 0;
  }
  char msg[512];
  int at = line;
  if (!weft_lib_decisions(one, L, -1, x->a, &x->sp.decisions, &x->sp.selectors, &at, msg, sizeof msg)) {
    weft_diag *d = script_error(one, at, "%s", msg);
    diag_hint(d, one->S->w.dg, "in the decision list the policy hook returned");
    return 0;
  }
  x->ok = true;
  return 0;
}

static int by_rank(const void *x, const void *y) {
  const search_plan *a = x, *b = y;
  if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
  return a->step_time < b->step_time ? -1 : a->step_time > b->step_time;
}

bool scripts_policies(weft_scripts *S, const search_opts *o, search_result *out) {
  memset(out, 0, sizeof *out);
  out->best = -1;
  if (!any_hook(S, HOOK_POLICY)) return true;
  weft_loc none = {0};
  const weft_graph *g = S->w.g;
  double t0 = now(), simulate_s = 0;
  search_plan *plans = arena_alloc(S->w.a, sizeof(search_plan) * (size_t)S->n);
  int n = 0, written = 0, dropped = 0;
  bool ranked = any_hook(S, HOOK_RANK);
  for (int i = 0; i < S->n; i++) {
    script_one *one = S->items[i];
    if (one->hook[HOOK_POLICY] == LUA_NOREF) continue;
    int line = one->hook_line[HOOK_POLICY];
    policy_ctx x = {one, S->w.a, {0}, false, false};
    if (!sandbox_protected(one, "policy", line, body_policy, &x, 0)) return false;
    if (!x.wrote) continue;
    if (!x.ok) return false;
    search_plan sp = x.sp;
    sp.decisions.name = one->name;
    written++;
    weft_lib_describe(g, &sp.decisions, &sp, S->w.a);
    double t1 = now();
    if (!simulate_policy(S, one, &sp, o->max_memory)) return false;
    simulate_s += now() - t1;
    sp.rank = sp.step_time;
    int keep = any_hook(S, HOOK_PRUNE) ? hk_prune(S, &sp) : 1;
    if (keep < 0) return false;
    if (keep == 0) {
      dropped++;
      continue;
    }
    if (ranked && !hk_rank(S, &sp, &sp.rank)) return false;
    plans[n++] = sp;
  }
  if (written == 0) return true;  /* the search's, then */
  out->searched = written;
  out->pruned = dropped;
  out->search_s = now() - t0 - simulate_s;
  out->simulate_s = simulate_s;
  out->ranked = ranked;
  if (n == 0) {
    diag_add(S->w.dg, DIAG_ERROR, none, "the heuristics pruned every plan the policies wrote (%d)", written);
    return false;
  }
  qsort(plans, (size_t)n, sizeof *plans, by_rank);
  out->simulated = plans;
  out->nsimulated = n;
  out->plans = arena_alloc(S->w.a, sizeof(search_plan) * (size_t)n);
  int64_t least = -1;
  for (int i = 0; i < n; i++) {
    if (!plans[i].fits || (least >= 0 && plans[i].peak_memory >= least)) continue;
    least = plans[i].peak_memory;
    out->plans[out->nplans++] = plans[i];
  }
  if (out->nplans == 0) {
    char b1[64], b2[64];
    double cap = o->max_memory > 0 ? o->max_memory : (double)S->w.cl->device_memory;
    int64_t small = plans[0].peak_memory;
    for (int i = 1; i < n; i++)
      if (plans[i].peak_memory < small) small = plans[i].peak_memory;
    weft_diag *d = diag_add(S->w.dg, DIAG_ERROR, none, "none of the %d plans the policies wrote fits: the smallest needs %s "
                            "per device, more than %s", n, unit_bytes_human(small, b1, sizeof b1),
                            unit_bytes_human((int64_t)cap, b2, sizeof b2));
    diag_hint(d, S->w.dg, "weft estimate of the plan says where its memory goes");
    return false;
  }
  out->best = 0;
  if (o->objective == SEARCH_MEMORY)
    for (int i = 0; i < out->nplans; i++)
      if (out->plans[i].peak_memory < out->plans[out->best].peak_memory) out->best = i;
  return true;
}
