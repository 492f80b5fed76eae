/* sandbox.c - the Lua state a heuristic runs in: the string, table, math,
 * utf8 and coroutine libraries and a safe part of the base library behind
 * read-only globals; an allocator that refuses past the memory budget; a
 * count hook that stops a script past its instruction budget, wherever it
 * runs (inside pcall too: once stopped, every instruction fails); errors
 * as diagnostics at the script's lines, with a traceback. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lualib.h>

#include "script_int.h"
#include "weft/units.h"

/* The count hook runs every HOOK_STEPS instructions; bytes allocated count
 * as an instruction per ALLOC_BYTES (copying them is work a loop of
 * concatenations does in one instruction). */
enum { HOOK_STEPS = 1000, ALLOC_BYTES = 64 };
/* Room the error handling may take past the memory budget once a script is
 * stopped (its traceback, its message). */
#define MEMORY_RESERVE ((int64_t)8 << 20)
/* The worst case of a pattern match, in steps, that a script may ask for:
 * the subject's length to the power of one plus the pattern's repetitions. */
#define PATTERN_WORST 4294967296.0

script_one *sandbox_one(lua_State *L) { return *(script_one **)lua_getextraspace(L); }

static int64_t steps_budget(const weft_scripts *S) { return S->w.steps > 0 ? S->w.steps : SCRIPT_DEFAULT_STEPS; }
static int64_t memory_budget(const weft_scripts *S) { return S->w.memory > 0 ? S->w.memory : SCRIPT_DEFAULT_MEMORY; }

/* ---- budgets ---------------------------------------------------------------- */

static void *sb_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  weft_scripts *S = ud;
  size_t old = ptr ? osize : 0;
  if (nsize == 0) {
    free(ptr);
    S->mem_used -= (int64_t)old;
    return NULL;
  }
  if (nsize > old) {
    int64_t limit = memory_budget(S) + (S->dead ? MEMORY_RESERVE : 0);
    if (S->mem_used + (int64_t)(nsize - old) > limit) {
      /* the budget is reached: the scripts stop at their next instruction
       * (Lua's collector would otherwise run in full at every allocation
       * from here on, for as long as a little garbage lets one through) */
      if (!S->dead) S->dead = DEAD_MEMORY;
      return NULL;
    }
    S->steps_used += (int64_t)(nsize - old) / ALLOC_BYTES;
  }
  void *p = realloc(ptr, nsize);
  if (!p) return nsize <= old ? ptr : NULL;
  S->mem_used += (int64_t)nsize - (int64_t)old;
  return p;
}

int sandbox_line(script_one *one, lua_State *L) {
  lua_Debug ar;
  for (int level = 0; lua_getstack(L, level, &ar); level++)
    if (lua_getinfo(L, "Sl", &ar) && ar.currentline > 0 && strcmp(ar.source, one->chunk) == 0) return ar.currentline;
  return 0;
}

static void sb_hook(lua_State *L, lua_Debug *ar);

/* Stops every script: from now on each instruction fails. */
static void stop(script_one *one, lua_State *L, dead_kind why) {
  weft_scripts *S = one->S;
  if (!S->dead) S->dead = why;
  if (!one->kill_line) {
    int line = S->dead == DEAD_STEPS ? sandbox_line(one, L) : 0;
    one->kill_line = line ? line : one->last_line ? one->last_line : sandbox_line(one, L);
  }
  lua_sethook(L, sb_hook, LUA_MASKCOUNT, 1);
}

void sandbox_out_of_memory(lua_State *L) { stop(sandbox_one(L), L, DEAD_MEMORY); }

/* "100,000,000" */
static const char *grouped(int64_t v, char *buf, size_t n) {
  char digits[32];
  int len = snprintf(digits, sizeof digits, "%lld", (long long)v), o = 0;
  for (int i = 0; i < len && o + 2 < (int)n; i++) {
    if (i > 0 && (len - i) % 3 == 0) buf[o++] = ',';
    buf[o++] = digits[i];
  }
  buf[o] = 0;
  return buf;
}

static const char *dead_message(const weft_scripts *S, char *buf, size_t n) {
  char b[64];
  if (S->dead == DEAD_MEMORY)
    snprintf(buf, n, "the scripts need more than their memory budget of %s (--lua-memory)",
             unit_bytes_human(memory_budget(S), b, sizeof b));
  else
    snprintf(buf, n, "the scripts ran past their budget of %s instructions (--lua-steps)",
             grouped(steps_budget(S), b, sizeof b));
  return buf;
}

static void sb_hook(lua_State *L, lua_Debug *ar) {
  script_one *one = sandbox_one(L);
  weft_scripts *S = one->S;
  if (lua_getinfo(L, "Sl", ar) && ar->currentline > 0 && strcmp(ar->source, one->chunk) == 0)
    one->last_line = ar->currentline;
  if (!S->dead) {
    S->steps_used += HOOK_STEPS;
    if (S->steps_used <= steps_budget(S)) return;
    stop(one, L, DEAD_STEPS);
  }
  /* stopped, by this script or another, or by the allocator */
  if (!one->kill_line) one->kill_line = one->last_line ? one->last_line : sandbox_line(one, L);
  lua_sethook(L, sb_hook, LUA_MASKCOUNT, 1);
  char buf[160];
  lua_pushstring(L, dead_message(S, buf, sizeof buf));
  lua_error(L);
}

void sandbox_charge(lua_State *L, int64_t n) {
  script_one *one = sandbox_one(L);
  weft_scripts *S = one->S;
  if (n > 0) S->steps_used += n;
  if (!S->dead && S->steps_used <= steps_budget(S)) return;
  stop(one, L, S->dead ? S->dead : DEAD_STEPS);
  char buf[160];
  lua_pushstring(L, dead_message(S, buf, sizeof buf));
  lua_error(L);
}

/* ---- the base library, guarded ------------------------------------------------ */

/* After a protected call: the results, or false and the error; a stopped
 * script's error goes on up. */
static int finish_pcall(lua_State *L, int status, lua_KContext extra) {
  if (status != LUA_OK && status != LUA_YIELD) {
    script_one *one = sandbox_one(L);
    if (status == LUA_ERRMEM) stop(one, L, DEAD_MEMORY);
    if (one->S->dead) return lua_error(L);
    lua_pushboolean(L, 0);
    lua_pushvalue(L, -2);
    return 2;
  }
  return lua_gettop(L) - (int)extra;
}

static int sb_pcall(lua_State *L) {
  luaL_checkany(L, 1);
  lua_pushboolean(L, 1);
  lua_insert(L, 1);
  return finish_pcall(L, lua_pcallk(L, lua_gettop(L) - 2, LUA_MULTRET, 0, 0, finish_pcall), 0);
}

static int sb_xpcall(lua_State *L) {
  int n = lua_gettop(L);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_pushboolean(L, 1);
  lua_pushvalue(L, 1);
  lua_rotate(L, 3, 2);  /* f, handler, true, f, arguments... */
  return finish_pcall(L, lua_pcallk(L, n - 2, LUA_MULTRET, 2, 2, finish_pcall), 2);
}

/* load(chunk [, name [, mode [, env]]]): text only, in the sandbox's globals
 * unless env is given. */
static const char *read_function(lua_State *L, void *ud, size_t *size) {
  (void)ud;
  luaL_checkstack(L, 2, "too many nested functions");
  lua_pushvalue(L, 1);
  lua_call(L, 0, 1);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    *size = 0;
    return NULL;
  }
  if (!lua_isstring(L, -1)) luaL_error(L, "the reader function must return a string");
  lua_replace(L, 5);  /* kept where the collector sees it */
  return lua_tolstring(L, 5, size);
}

static int sb_load(lua_State *L) {
  size_t len;
  const char *s = lua_tolstring(L, 1, &len);
  const char *mode = luaL_optstring(L, 3, "t");
  if (strchr(mode, 'b')) return luaL_error(L, "binary chunks cannot be loaded in weft scripts (mode \"%s\")", mode);
  bool env = !lua_isnone(L, 4);
  int status;
  if (s) {
    const char *name = luaL_optstring(L, 2, s);
    status = luaL_loadbufferx(L, s, len, name, "t");
  } else {
    const char *name = luaL_optstring(L, 2, "=(load)");
    luaL_checktype(L, 1, LUA_TFUNCTION);
    lua_settop(L, 5);
    status = lua_load(L, read_function, NULL, name, "t");
  }
  if (status == LUA_ERRMEM) stop(sandbox_one(L), L, DEAD_MEMORY);
  if (sandbox_one(L)->S->dead) return lua_error(L);
  if (status == LUA_ERRSYNTAX && strstr(lua_tostring(L, -1), "binary chunk"))
    return luaL_error(L, "binary chunks cannot be loaded in weft scripts");
  if (status != LUA_OK) {
    luaL_pushfail(L);
    lua_insert(L, -2);
    return 2;
  }
  /* the chunk's one upvalue is its _ENV */
  if (env) lua_pushvalue(L, 4);
  else lua_pushvalue(L, lua_upvalueindex(1));
  if (!lua_setupvalue(L, -2, 1)) lua_pop(L, 1);
  return 1;
}

/* setmetatable without __gc: a finalizer would run when the collector
 * chooses, out of the hooks' calls. */
static int sb_setmetatable(lua_State *L) {
  if (lua_type(L, 2) == LUA_TTABLE && lua_getfield(L, 2, "__gc") != LUA_TNIL)
    return luaL_error(L, "__gc metamethods are not allowed in weft scripts");
  lua_settop(L, 2);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, 2, 1);
  return 1;
}

/* collectgarbage: the options that read or run the collector, not those
 * that tune it. */
static int sb_collectgarbage(lua_State *L) {
  static const char *const allowed[] = {"collect", "count", "step", "isrunning", NULL};
  const char *opt = luaL_optstring(L, 1, "collect");
  bool ok = false;
  for (int i = 0; allowed[i] && !ok; i++) ok = strcmp(opt, allowed[i]) == 0;
  if (!ok) return luaL_error(L, "collectgarbage(\"%s\") is not allowed in weft scripts", opt);
  int n = lua_gettop(L);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, n, LUA_MULTRET);
  return lua_gettop(L);
}

/* print: on standard error, which the plan does not share. */
static int sb_print(lua_State *L) {
  int n = lua_gettop(L);
  for (int i = 1; i <= n; i++) {
    size_t len;
    const char *s = luaL_tolstring(L, i, &len);
    if (i > 1) fputc('\t', stderr);
    fwrite(s, 1, len, stderr);
    lua_pop(L, 1);
  }
  fputc('\n', stderr);
  return 0;
}

/* ---- coroutines: resume that keeps a stopped script stopped ------------------ */

/* Resumes co with narg arguments from L's top; the number of results moved
 * to L, or -1 with the error on L. */
static int resume(lua_State *L, lua_State *co, int narg) {
  if (!lua_checkstack(co, narg)) {
    lua_pushliteral(L, "too many arguments to resume");
    return -1;
  }
  lua_xmove(L, co, narg);
  int nres;
  int status = lua_resume(co, L, narg, &nres);
  if (status == LUA_OK || status == LUA_YIELD) {
    if (!lua_checkstack(L, nres + 1)) {
      lua_pop(co, nres);
      lua_pushliteral(L, "too many results to resume");
      return -1;
    }
    lua_xmove(co, L, nres);
    return nres;
  }
  if (status == LUA_ERRMEM) stop(sandbox_one(L), L, DEAD_MEMORY);
  lua_xmove(co, L, 1);
  return -1;
}

static int sb_resume(lua_State *L) {
  lua_State *co = lua_tothread(L, 1);
  luaL_argexpected(L, co, 1, "coroutine");
  int r = resume(L, co, lua_gettop(L) - 1);
  if (r < 0) {
    if (sandbox_one(L)->S->dead) return lua_error(L);
    lua_pushboolean(L, 0);
    lua_insert(L, -2);
    return 2;
  }
  lua_pushboolean(L, 1);
  lua_insert(L, -(r + 1));
  return r + 1;
}

static int wrapped(lua_State *L) {
  lua_State *co = lua_tothread(L, lua_upvalueindex(1));
  int r = resume(L, co, lua_gettop(L));
  if (r < 0) return lua_error(L);
  return r;
}

static int sb_wrap(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_State *co = lua_newthread(L);
  lua_pushvalue(L, 1);
  lua_xmove(L, co, 1);
  lua_pushcclosure(L, wrapped, 1);
  return 1;
}

/* ---- library functions whose work is not instructions ---------------------------- */

/* How a wrapped library function's work is charged before it runs. */
typedef enum {
  CHARGE_SCAN,            /* reads its first argument, a string, once */
  CHARGE_PATTERN,         /* a pattern match: refused when its worst case is too long */
  CHARGE_REP,             /* string.rep: refused past the memory budget */
  CHARGE_SHIFT,           /* table.insert and table.remove move the elements after pos */
  CHARGE_SORT,            /* n log n comparisons */
  CHARGE_MOVE,            /* table.move: e - f + 1 elements */
} charge_kind;

/* Repetitions in a pattern (*, +, - and ? outside sets and escapes). */
static int pattern_repetitions(const char *p, size_t n) {
  int q = 0;
  for (size_t i = 0; i < n; i++) {
    if (p[i] == '%') i++;
    else if (p[i] == '[') {
      i++;
      if (i < n && p[i] == '^') i++;
      if (i < n && p[i] == ']') i++;
      while (i < n && p[i] != ']') i += p[i] == '%' ? 2 : 1;
    } else if (p[i] == '*' || p[i] == '+' || p[i] == '-' || p[i] == '?') q++;
  }
  return q;
}

/* Charges the call's work; true when it answered the call itself (its
 * result pushed). */
static bool charge(lua_State *L, charge_kind k) {
  size_t len = 0;
  switch (k) {
  case CHARGE_SCAN:
    if (lua_type(L, 1) == LUA_TSTRING) lua_tolstring(L, 1, &len);
    sandbox_charge(L, (int64_t)(len / ALLOC_BYTES));
    break;
  case CHARGE_PATTERN: {
    size_t plen = 0;
    if (lua_type(L, 1) == LUA_TSTRING) lua_tolstring(L, 1, &len);
    const char *p = lua_type(L, 2) == LUA_TSTRING ? lua_tolstring(L, 2, &plen) : NULL;
    bool plain = lua_toboolean(L, 4) && lua_type(L, 3) != LUA_TNONE;
    if (p && !plain) {
      int q = pattern_repetitions(p, plen);
      double worst = pow((double)len + 1, q + 1);
      if (q > 0 && worst > PATTERN_WORST)
        luaL_error(L, "a pattern with %d repetitions over %d bytes may take more steps than a script may run; match "
                      "shorter strings or simpler patterns", q, (int)(len > 2147483647 ? 2147483647 : len));
    }
    sandbox_charge(L, (int64_t)(len / ALLOC_BYTES));
    break;
  }
  case CHARGE_REP: {
    size_t sep = 0;
    if (lua_type(L, 1) == LUA_TSTRING) lua_tolstring(L, 1, &len);
    if (lua_type(L, 3) == LUA_TSTRING) lua_tolstring(L, 3, &sep);
    double n = lua_isnumber(L, 2) ? lua_tonumber(L, 2) : 0;
    double total = n > 0 ? n * (double)len + (n - 1) * (double)sep : 0;
    weft_scripts *S = sandbox_one(L)->S;
    /* the buffer it builds the string in, and the string: twice its size */
    int64_t left = (memory_budget(S) - S->mem_used) / 2;
    if (total > (double)left) {
      char b1[64], b2[64], b3[64];
      luaL_error(L, "string.rep would make a string of %s, more than the %s left of the scripts' memory budget of %s "
                    "(--lua-memory)", unit_bytes_human((int64_t)fmin(total, 9e18), b1, sizeof b1),
                 unit_bytes_human(left > 0 ? left : 0, b2, sizeof b2), unit_bytes_human(memory_budget(S), b3, sizeof b3));
    }
    if (len + sep == 0 && lua_isinteger(L, 2)) {  /* nothing to copy however many times: no loop */
      lua_pushliteral(L, "");
      return true;
    }
    break;
  }
  case CHARGE_SHIFT: {
    if (lua_type(L, 1) != LUA_TTABLE) break;
    int64_t n = (int64_t)lua_rawlen(L, 1);
    lua_Integer pos = lua_isinteger(L, 2) ? lua_tointeger(L, 2) : n;
    sandbox_charge(L, pos >= 0 && pos < n ? n - pos : 0);
    break;
  }
  case CHARGE_SORT: {
    if (lua_type(L, 1) != LUA_TTABLE) break;
    double n = (double)lua_rawlen(L, 1);
    sandbox_charge(L, (int64_t)(n * log2(n + 2)));
    break;
  }
  case CHARGE_MOVE: {
    lua_Integer f = luaL_checkinteger(L, 2), e = luaL_checkinteger(L, 3);
    uint64_t span = (uint64_t)e - (uint64_t)f;  /* without the overflow of e - f */
    if (e >= f) sandbox_charge(L, span < (uint64_t)INT64_MAX / 2 ? (int64_t)span + 1 : INT64_MAX / 2);
    break;
  }
  }
  return false;
}

static int charged(lua_State *L) {
  if (charge(L, (charge_kind)lua_tointeger(L, lua_upvalueindex(2)))) return 1;
  int n = lua_gettop(L);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, n, LUA_MULTRET);
  return lua_gettop(L);
}

/* Replaces field name of the table at idx by a charged wrapper of itself. */
static void wrap_charged(lua_State *L, int idx, const char *name, charge_kind k) {
  idx = lua_absindex(L, idx);
  lua_getfield(L, idx, name);
  lua_pushinteger(L, k);
  lua_pushcclosure(L, charged, 2);
  lua_setfield(L, idx, name);
}

/* ---- read-only tables ------------------------------------------------------------ */

static int ro_newindex(lua_State *L) {
  if (lua_type(L, 2) == LUA_TSTRING)
    return luaL_error(L, "'%s' is read-only in weft scripts: keep your values in locals or tables of your own",
                      lua_tostring(L, 2));
  return luaL_error(L, "this table is read-only in weft scripts");
}

static int ro_len(lua_State *L) {
  lua_getiuservalue(L, 1, 1);
  lua_pushinteger(L, (lua_Integer)lua_rawlen(L, -1));
  return 1;
}

static int ro_next(lua_State *L) {
  lua_settop(L, 2);
  if (lua_next(L, lua_upvalueindex(1))) return 2;
  lua_pushnil(L);
  return 1;
}

static int ro_pairs(lua_State *L) {
  lua_getiuservalue(L, 1, 1);
  lua_pushcclosure(L, ro_next, 1);
  lua_pushnil(L);
  lua_pushnil(L);
  return 3;
}

void sandbox_push_readonly(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  lua_newuserdatauv(L, 0, 1);
  lua_pushvalue(L, idx);
  lua_setiuservalue(L, -2, 1);
  lua_createtable(L, 0, 6);
  lua_pushvalue(L, idx);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, ro_newindex);
  lua_setfield(L, -2, "__newindex");
  lua_pushcfunction(L, ro_len);
  lua_setfield(L, -2, "__len");
  lua_pushcfunction(L, ro_pairs);
  lua_setfield(L, -2, "__pairs");
  lua_pushliteral(L, "read-only");
  lua_setfield(L, -2, "__metatable");
  lua_pushliteral(L, "read-only table");
  lua_setfield(L, -2, "__name");
  lua_setmetatable(L, -2);
}

/* ---- the state --------------------------------------------------------------- */

/* Copies the fields of the library table at lib (but those in skip) into
 * a new table, pushed. */
static void copy_library(lua_State *L, int lib, const char *const *skip) {
  lib = lua_absindex(L, lib);
  lua_newtable(L);
  lua_pushnil(L);
  while (lua_next(L, lib)) {
    bool drop = false;
    for (int i = 0; skip && skip[i] && !drop; i++) drop = lua_type(L, -2) == LUA_TSTRING && strcmp(lua_tostring(L, -2), skip[i]) == 0;
    if (drop) lua_pop(L, 1);
    else {
      lua_pushvalue(L, -2);
      lua_insert(L, -2);
      lua_settable(L, -4);
    }
  }
}

static int open_all(lua_State *L) {
  script_one *one = lua_touserdata(L, 1);
  /* the libraries, opened where only this function sees them */
  static const luaL_Reg libs[] = {{"_G", luaopen_base},    {"string", luaopen_string}, {"table", luaopen_table},
                                  {"math", luaopen_math},  {"utf8", luaopen_utf8},     {"coroutine", luaopen_coroutine},
                                  {NULL, NULL}};
  for (const luaL_Reg *l = libs; l->name; l++) {
    luaL_requiref(L, l->name, l->func, 1);
    lua_pop(L, 1);
  }
  int top = lua_gettop(L);
  lua_newtable(L);  /* the sandbox's globals */
  int env = lua_gettop(L);
  lua_pushglobaltable(L);
  int G = lua_gettop(L);
  static const char *const base[] = {"assert", "error",  "ipairs",   "next",   "pairs",  "select", "tonumber",
                                     "tostring", "type", "rawequal", "rawlen", "rawget", "rawset", "getmetatable",
                                     "_VERSION", NULL};
  for (int i = 0; base[i]; i++) {
    lua_getfield(L, G, base[i]);
    lua_setfield(L, env, base[i]);
  }
  lua_pushcfunction(L, sb_pcall);
  lua_setfield(L, env, "pcall");
  lua_pushcfunction(L, sb_xpcall);
  lua_setfield(L, env, "xpcall");
  lua_pushcfunction(L, sb_print);
  lua_setfield(L, env, "print");
  lua_getfield(L, G, "setmetatable");
  lua_pushcclosure(L, sb_setmetatable, 1);
  lua_setfield(L, env, "setmetatable");
  lua_getfield(L, G, "collectgarbage");
  lua_pushcclosure(L, sb_collectgarbage, 1);
  lua_setfield(L, env, "collectgarbage");
  /* string: patterns and repetition guarded; no dump (binary chunks) */
  static const char *const no_dump[] = {"dump", NULL};
  lua_getfield(L, G, "string");
  copy_library(L, -1, no_dump);
  int str = lua_gettop(L);
  static const char *const scans[] = {"byte", "format", "len", "lower", "upper", "reverse", "sub", "pack", "unpack", NULL};
  for (int i = 0; scans[i]; i++) wrap_charged(L, str, scans[i], CHARGE_SCAN);
  static const char *const patterns[] = {"find", "match", "gmatch", "gsub", NULL};
  for (int i = 0; patterns[i]; i++) wrap_charged(L, str, patterns[i], CHARGE_PATTERN);
  wrap_charged(L, str, "rep", CHARGE_REP);
  /* the methods of strings ("x"):rep(3) are these, and their metatable hidden */
  lua_pushliteral(L, "");
  lua_getmetatable(L, -1);
  lua_pushvalue(L, str);
  lua_setfield(L, -2, "__index");
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 2);
  sandbox_push_readonly(L, str);
  lua_setfield(L, env, "string");
  lua_pop(L, 2);
  /* table: the operations that move many elements charged */
  lua_getfield(L, G, "table");
  copy_library(L, -1, NULL);
  wrap_charged(L, -1, "insert", CHARGE_SHIFT);
  wrap_charged(L, -1, "remove", CHARGE_SHIFT);
  wrap_charged(L, -1, "sort", CHARGE_SORT);
  wrap_charged(L, -1, "move", CHARGE_MOVE);
  wrap_charged(L, -1, "concat", CHARGE_SCAN);
  sandbox_push_readonly(L, -1);
  lua_setfield(L, env, "table");
  lua_pop(L, 2);
  /* math: the same random numbers at every run */
  lua_getfield(L, G, "math");
  lua_getfield(L, -1, "randomseed");
  lua_pushinteger(L, 0);
  lua_call(L, 1, 0);
  copy_library(L, -1, NULL);
  sandbox_push_readonly(L, -1);
  lua_setfield(L, env, "math");
  lua_pop(L, 2);
  lua_getfield(L, G, "utf8");
  copy_library(L, -1, NULL);
  wrap_charged(L, -1, "len", CHARGE_SCAN);
  wrap_charged(L, -1, "offset", CHARGE_SCAN);
  sandbox_push_readonly(L, -1);
  lua_setfield(L, env, "utf8");
  lua_pop(L, 2);
  /* coroutine: resume and wrap of our own; close left out */
  static const char *const no_close[] = {"close", "resume", "wrap", NULL};
  lua_getfield(L, G, "coroutine");
  copy_library(L, -1, no_close);
  lua_pushcfunction(L, sb_resume);
  lua_setfield(L, -2, "resume");
  lua_pushcfunction(L, sb_wrap);
  lua_setfield(L, -2, "wrap");
  sandbox_push_readonly(L, -1);
  lua_setfield(L, env, "coroutine");
  lua_pop(L, 2);
  /* weft */
  weft_lib_push(L, one);
  lua_pushvalue(L, -1);
  one->ref_weft = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_setfield(L, env, "weft");
  /* the globals, read-only: _G and _ENV are the same view */
  sandbox_push_readonly(L, env);
  lua_pushvalue(L, -1);
  lua_setfield(L, env, "_G");
  lua_pushvalue(L, -1);
  lua_pushcclosure(L, sb_load, 1);
  lua_setfield(L, env, "load");
  lua_setfield(L, LUA_REGISTRYINDEX, "weft.env");
  /* nothing of the real globals stays reachable by name */
  lua_pushnil(L);
  while (lua_next(L, G)) {
    lua_pop(L, 1);
    lua_pushvalue(L, -1);
    lua_pushnil(L);
    lua_rawset(L, G);
  }
  lua_settop(L, top);
  return 0;
}

lua_State *sandbox_open(script_one *one) {
  lua_State *L = lua_newstate(sb_alloc, one->S);
  if (!L) return NULL;
  *(script_one **)lua_getextraspace(L) = one;
  one->L = L;
  lua_sethook(L, sb_hook, LUA_MASKCOUNT, HOOK_STEPS);
  lua_pushcfunction(L, open_all);
  lua_pushlightuserdata(L, one);
  if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
    lua_close(L);
    one->L = NULL;
    return NULL;
  }
  return L;
}

void sandbox_close(script_one *one) {
  if (!one->L) return;
  /* whatever runs while the state goes (to-be-closed variables) fails at once */
  if (!one->S->dead) one->S->dead = DEAD_STEPS;
  lua_close(one->L);
  one->L = NULL;
}

/* ---- errors ---------------------------------------------------------------- */

/* The message handler: the traceback where the error was raised. */
static int sb_msgh(lua_State *L) {
  script_one *one = sandbox_one(L);
  lua_Debug ar;
  one->nframes = 0;
  /* the innermost frames and the outermost (where the hook is), with a
   * mark between them for those left out */
  int lo = 0, hi = 1;  /* the depth: lo exists, hi does not (each probe walks the stack) */
  while (lua_getstack(L, hi, &ar)) lo = hi, hi *= 2;
  while (hi - lo > 1) {
    int mid = lo + (hi - lo) / 2;
    if (lua_getstack(L, mid, &ar)) lo = mid;
    else hi = mid;
  }
  int depth = lo;
  for (int level = 1; level <= depth && one->nframes < SCRIPT_FRAMES; level++) {
    if (level == SCRIPT_FRAMES - 4 && depth > SCRIPT_FRAMES) {
      script_frame *f = &one->frames[one->nframes++];
      f->line = -1;
      snprintf(f->where, sizeof f->where, "%d more", depth - SCRIPT_FRAMES + 4);
      f->src[0] = 0;
      f->mine = false;
      level = depth - 3;
    }
    if (!lua_getstack(L, level, &ar) || !lua_getinfo(L, "Snl", &ar) || ar.currentline <= 0) continue;
    script_frame *f = &one->frames[one->nframes++];
    f->line = ar.currentline;
    f->mine = strcmp(ar.source, one->chunk) == 0;
    snprintf(f->src, sizeof f->src, "%s", ar.short_src);
    if (ar.name && *ar.namewhat) snprintf(f->where, sizeof f->where, "%s '%s'", strcmp(ar.namewhat, "method") == 0 ? "method" : "function", ar.name);
    else if (strcmp(ar.what, "main") == 0) snprintf(f->where, sizeof f->where, "the main chunk");
    else snprintf(f->where, sizeof f->where, "the function of line %d", ar.linedefined);
  }
  return 1;
}

weft_diag *script_error(script_one *one, int line, const char *fmt, ...) {
  weft_scripts *S = one->S;
  S->failed = true;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  weft_loc loc = {0};
  const weft_src *src = &S->w.srcs->items[one->file];
  int len;
  const char *text = line > 0 && line <= src->nlines ? src_line(src, line, &len) : NULL;
  if (!text) return diag_add(S->w.dg, DIAG_ERROR, loc, "%s: %s", one->path, msg);
  int col = 0;
  while (col < len && (text[col] == ' ' || text[col] == '\t')) col++;
  loc = (weft_loc){one->file, line, col < len ? col + 1 : 1, line, len > 0 ? len : 1};
  return diag_add(S->w.dg, DIAG_ERROR, loc, "%s", msg);
}

/* The error on top of one's stack, after a call that failed with status,
 * as a diagnostic. */
static void report(script_one *one, int status) {
  lua_State *L = one->L;
  weft_scripts *S = one->S;
  char dead[160];
  const char *msg;
  int line = 0;
  if (S->dead) {
    msg = dead_message(S, dead, sizeof dead);
    line = one->kill_line ? one->kill_line : one->last_line;
  } else if (status == LUA_ERRMEM) {
    S->dead = DEAD_MEMORY;
    msg = dead_message(S, dead, sizeof dead);
    line = one->last_line;
  } else if (lua_type(L, -1) == LUA_TNUMBER) {
    snprintf(dead, sizeof dead, "%.14g", lua_tonumber(L, -1));
    msg = dead;
  } else if (lua_type(L, -1) == LUA_TSTRING) {
    msg = lua_tostring(L, -1);
    /* "bad.lua:12: message": the line, and the message without it */
    size_t n = strlen(one->short_src);
    if (strncmp(msg, one->short_src, n) == 0 && msg[n] == ':' && msg[n + 1] >= '0' && msg[n + 1] <= '9') {
      char *end;
      long l = strtol(msg + n + 1, &end, 10);
      if (end[0] == ':' && end[1] == ' ') line = (int)l, msg = end + 2;
    }
  } else {
    snprintf(dead, sizeof dead, "the script raised an error that is a %s, not a message", luaL_typename(L, -1));
    msg = dead;
  }
  for (int i = 0; i < one->nframes && !line; i++)
    if (one->frames[i].mine) line = one->frames[i].line;
  if (!line) line = one->entry_line;
  /* the traceback, innermost first, to whoever called the script */
  char tb[1024];
  size_t o = 0;
  tb[0] = 0;
  int last_mine = -1;
  for (int i = 0; i < one->nframes; i++)
    if (one->frames[i].mine) last_mine = i;
  for (int i = 0; i < one->nframes && o < sizeof tb - 200; i++) {
    const script_frame *f = &one->frames[i];
    const char *where = f->where;
    char hook[64];
    if (i == last_mine && one->calling && strncmp(where, "the function", 12) == 0) {
      snprintf(hook, sizeof hook, "the %s hook", one->calling);
      where = hook;
    }
    if (f->line < 0) {
      o += (size_t)snprintf(tb + o, sizeof tb - o, ", ... (%s)", f->where);
      continue;
    }
    /* a frame that calls itself (recursion) once, with its count */
    int same = 1;
    while (i + same < one->nframes && one->frames[i + same].line == f->line &&
           strcmp(one->frames[i + same].where, f->where) == 0 && strcmp(one->frames[i + same].src, f->src) == 0)
      same++;
    o += (size_t)snprintf(tb + o, sizeof tb - o, "%s%s:%d in %s", i ? ", called from " : "", f->src, f->line, where);
    if (same > 1) o += (size_t)snprintf(tb + o, sizeof tb - o, " (%d times)", same);
    i += same - 1;
  }
  const char *caller = one->calling ? "weft search" : "weft search, loading the script";
  weft_diag *d = script_error(one, line, "%s", msg);
  if (o) diag_hint(d, S->w.dg, "traceback: %s, called by %s", tb, caller);
  else diag_hint(d, S->w.dg, "traceback: called by %s", caller);
  lua_pop(L, 1);
}

static bool protected_call(script_one *one, int nargs) {
  lua_State *L = one->L;
  if (one->S->failed) {
    lua_pop(L, nargs + 1);
    return false;
  }
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, sb_msgh);
  lua_insert(L, base);
  one->nframes = 0;
  one->last_line = 0;
  int status = lua_pcall(L, nargs, 1, base);
  lua_remove(L, base);
  if (status == LUA_OK && !one->S->dead) return true;
  if (status == LUA_OK) {
    lua_pop(L, 1);
    lua_pushnil(L);
  }
  report(one, status);
  return false;
}

bool sandbox_protected(script_one *one, const char *hook, int line, lua_CFunction body, void *ud, int nargs) {
  lua_State *L = one->L;
  int top = lua_gettop(L) - nargs;
  if (one->S->failed) {
    lua_settop(L, top);
    return false;
  }
  one->calling = hook;
  one->entry_line = line;
  one->nframes = 0;
  one->last_line = 0;
  lua_pushcfunction(L, sb_msgh);
  lua_pushcfunction(L, body);
  lua_pushlightuserdata(L, ud);
  lua_rotate(L, top + 1, 3);  /* handler, body, ud, the values */
  int status = lua_pcall(L, 1 + nargs, 0, top + 1);
  if (status == LUA_OK && !one->S->dead) {
    lua_settop(L, top);
    return true;
  }
  if (status == LUA_OK) lua_pushnil(L);
  report(one, status);
  lua_settop(L, top);
  return false;
}

bool sandbox_run_chunk(script_one *one, const char *text, size_t len) {
  lua_State *L = one->L;
  one->calling = NULL;
  one->entry_line = 0;
  /* how Lua names the chunk in its messages: as it names an empty one */
  lua_Debug ar;
  if (luaL_loadbufferx(L, "", 0, one->chunk, "t") == LUA_OK && lua_getinfo(L, ">S", &ar))
    snprintf(one->short_src, sizeof one->short_src, "%s", ar.short_src);
  else lua_pop(L, 1);
  /* an error that knows no line (a binary file, memory) is put at the first */
  one->entry_line = 1;
  int status = luaL_loadbufferx(L, text, len, one->chunk, "t");
  if (status != LUA_OK) {
    one->nframes = 0;
    report(one, status);
    return false;
  }
  /* its _ENV: the sandbox's globals */
  lua_getfield(L, LUA_REGISTRYINDEX, "weft.env");
  lua_setupvalue(L, -2, 1);
  return protected_call(one, 0);
}
