/* tables.c - what scripts read, as Lua tables: the model (operators,
 * tensors, dimensions) and the cluster (devices, links) read-only, the
 * search's candidates and space, and the figures of weft.estimate read
 * from the JSON `weft estimate --json` prints. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "script_int.h"
#include "weft/cost.h"

static void set_str(lua_State *L, const char *k, const char *v) {
  if (!v) return;
  lua_pushstring(L, v);
  lua_setfield(L, -2, k);
}

static void set_int(lua_State *L, const char *k, int64_t v) {
  lua_pushinteger(L, v);
  lua_setfield(L, -2, k);
}

static void set_num(lua_State *L, const char *k, double v) {
  lua_pushnumber(L, v);
  lua_setfield(L, -2, k);
}

static void set_bool(lua_State *L, const char *k, bool v) {
  lua_pushboolean(L, v);
  lua_setfield(L, -2, k);
}

/* Replaces the table on top by its read-only view. */
static void seal(lua_State *L) {
  sandbox_push_readonly(L, -1);
  lua_remove(L, -2);
}

/* ---- the model ---------------------------------------------------------------- */

static const char *const role_names[] = {"input", "parameter", "activation"};

static void push_tensor(lua_State *L, const gtensor *t) {
  lua_createtable(L, 0, 8);
  set_str(L, "name", t->name);
  set_str(L, "role", role_names[t->role]);
  set_str(L, "dtype", dtype_names[t->dtype]);
  lua_createtable(L, t->ndims, 0);
  for (int d = 0; d < t->ndims; d++) {
    lua_pushinteger(L, t->dims[d].size);
    lua_rawseti(L, -2, d + 1);
  }
  seal(L);
  lua_setfield(L, -2, "shape");
  lua_createtable(L, t->ndims, 0);
  for (int d = 0; d < t->ndims; d++) {
    if (t->dims[d].name) lua_pushstring(L, t->dims[d].name);
    else lua_pushboolean(L, 0);
    lua_rawseti(L, -2, d + 1);
  }
  seal(L);
  lua_setfield(L, -2, "dims");
  lua_newtable(L);
  for (int d = 0; d < t->ndims; d++)
    if (t->dims[d].name) set_int(L, t->dims[d].name, t->dims[d].size);
  seal(L);
  lua_setfield(L, -2, "sizes");
  set_int(L, "elements", tensor_numel(t));
  set_int(L, "bytes", tensor_numel(t) * dtype_bytes[t->dtype]);
  seal(L);
}

int tables_blocks(const weft_graph *g, char *name, size_t n) {
  /* the prefix of the most operators named PREFIX.N.REST, counted from 0 */
  const char *best = NULL;
  int best_n = 0, best_ops = 0;
  name[0] = 0;
  for (int op = 0; op < g->nops; op++) {
    const char *nm = g->ops[op].name, *dot = strchr(nm, '.');
    if (!dot || !isdigit((unsigned char)dot[1])) continue;
    size_t pl = (size_t)(dot - nm);
    if (best && strlen(best) == pl && strncmp(best, nm, pl) == 0) continue;
    int count = 0, ops = 0;
    for (int k = 0; k < g->nops; k++) {
      const char *o = g->ops[k].name;
      if (strncmp(o, nm, pl) != 0 || o[pl] != '.' || !isdigit((unsigned char)o[pl + 1])) continue;
      int idx = atoi(o + pl + 1);
      if (idx + 1 > count) count = idx + 1;
      ops++;
    }
    if (ops > best_ops) {
      best_ops = ops, best_n = count;
      snprintf(name, n, "%.*s", (int)pl, nm);
      best = name;
    }
  }
  return best ? best_n : 0;
}

void tables_push_model(lua_State *L, const weft_graph *g, arena *a) {
  lua_createtable(L, g->ntensors, 0);
  int T = lua_gettop(L);
  for (int t = 0; t < g->ntensors; t++) {
    push_tensor(L, &g->tensors[t]);
    lua_rawseti(L, T, t + 1);
  }
  lua_createtable(L, 0, 16);
  set_str(L, "name", g->name);
  /* operators */
  lua_createtable(L, g->nops, 0);
  for (int op = 0; op < g->nops; op++) {
    const gop *o = &g->ops[op];
    lua_createtable(L, 0, 12);
    set_str(L, "name", o->name);
    set_str(L, "op", o->decl ? o->decl->name : NULL);
    set_str(L, "kind", o->kind);
    set_int(L, "index", op + 1);
    set_num(L, "flops", o->flops);
    set_num(L, "bytes", o->bytes);
    lua_createtable(L, o->ninputs, 0);
    for (int i = 0; i < o->ninputs; i++) {
      lua_rawgeti(L, T, o->inputs[i] + 1);
      lua_rawseti(L, -2, i + 1);
    }
    seal(L);
    lua_setfield(L, -2, "inputs");
    lua_rawgeti(L, T, o->output + 1);
    lua_setfield(L, -2, "output");
    /* its iteration space: each dimension, how a plan names it, whether it splits */
    arena_mark mk = arena_here(a);
    opspace *sp = opspace_build(a, g, op);
    lua_createtable(L, sp ? sp->nidims : 0, 0);
    lua_newtable(L);  /* sizes */
    for (int i = 0; sp && i < sp->nidims; i++) {
      const idim *d = &sp->idims[i];
      lua_createtable(L, 0, 5);
      set_str(L, "name", d->sig);
      set_str(L, "dim", d->dim_name);
      set_int(L, "size", d->size);
      set_bool(L, "reduce", d->reduce);
      set_bool(L, "splittable", !d->nosplit);
      seal(L);
      lua_rawseti(L, -3, i + 1);
      int same = 0;
      for (int k = 0; k < sp->nidims; k++) same += strcmp(sp->idims[k].sig, d->sig) == 0;
      if (same == 1) set_int(L, d->sig, d->size);
      if (d->dim_name) set_int(L, d->dim_name, d->size);
    }
    seal(L);
    lua_setfield(L, -3, "sizes");
    seal(L);
    lua_setfield(L, -2, "dims");
    arena_rewind(a, mk);
    seal(L);
    lua_rawseti(L, -2, op + 1);
  }
  seal(L);
  lua_setfield(L, -2, "operators");
  /* parameters and inputs, the dimensions by name */
  lua_newtable(L);
  lua_newtable(L);
  lua_newtable(L);
  int np = 0, ni = 0;
  for (int t = 0; t < g->ntensors; t++) {
    const gtensor *x = &g->tensors[t];
    if (x->role == TENSOR_PARAM) {
      lua_rawgeti(L, T, t + 1);
      lua_rawseti(L, -4, ++np);
    } else if (x->role == TENSOR_INPUT) {
      lua_rawgeti(L, T, t + 1);
      lua_rawseti(L, -3, ++ni);
    }
    for (int d = 0; d < x->ndims; d++)
      if (x->dims[d].name) set_int(L, x->dims[d].name, x->dims[d].size);
  }
  seal(L);
  lua_setfield(L, -4, "dims");
  seal(L);
  lua_setfield(L, -3, "inputs");
  seal(L);
  lua_setfield(L, -2, "parameters");
  set_int(L, "parameter_count", graph_param_count(g));
  set_int(L, "parameter_bytes", graph_param_bytes(g));
  set_num(L, "flops", graph_forward_flops(g));
  /* the batch: the first dimension of the first input */
  for (int t = 0; t < g->ntensors; t++)
    if (g->tensors[t].role == TENSOR_INPUT && g->tensors[t].ndims > 0) {
      set_int(L, "batch", g->tensors[t].dims[0].size);
      set_str(L, "batch_dim", g->tensors[t].dims[0].name);
      break;
    }
  char bname[128];
  int nb = tables_blocks(g, bname, sizeof bname);
  if (nb > 0) {
    lua_createtable(L, 0, 2);
    set_str(L, "name", bname);
    set_int(L, "count", nb);
    seal(L);
    lua_setfield(L, -2, "blocks");
  }
  set_str(L, "optimizer", g->optimizer);
  if (g->loss >= 0) {
    lua_rawgeti(L, T, g->loss + 1);
    lua_setfield(L, -2, "loss");
  }
  seal(L);
  lua_remove(L, T);
}

/* ---- the cluster ---------------------------------------------------------------- */

static void push_link(lua_State *L, const hw_link *l) {
  lua_createtable(L, 0, 4);
  set_str(L, "name", l->name);
  set_num(L, "bandwidth", l->bandwidth);
  set_num(L, "latency", l->latency);
  set_num(L, "efficiency", l->efficiency);
  seal(L);
}

void tables_push_cluster(lua_State *L, const weft_cluster *cl, const weft_graph *g) {
  lua_createtable(L, 0, 8);
  set_str(L, "name", cl->name);
  set_int(L, "devices", cl->ndevices);
  int dpn = cl->devices_per_node > 0 ? cl->devices_per_node : 1;
  set_int(L, "devices_per_node", dpn);
  set_int(L, "nodes", (cl->ndevices + dpn - 1) / dpn);
  hw_model hw;
  weft_loc none = {0};
  bool rates = hw_from_cluster(NULL, g, cl, "the scripts' cluster", none, &hw);
  lua_createtable(L, 0, 6);
  set_int(L, "memory", cl->device_memory);
  if (rates) {
    set_str(L, "name", hw.device);
    set_num(L, "memory_bandwidth", hw.mem_bw);
    set_num(L, "vector_flops", hw.vector_rate);
    lua_newtable(L);
    for (int d = 0; d < DT_COUNT; d++)
      if (hw.peak[d] > 0) set_num(L, dtype_names[d], hw.peak[d]);
    seal(L);
    lua_setfield(L, -2, "flops");
  }
  seal(L);
  lua_setfield(L, -2, "device");
  lua_newtable(L);
  if (rates && hw.node.present) {
    push_link(L, &hw.node);
    lua_setfield(L, -2, "node");
  }
  if (rates && hw.net.present) {
    push_link(L, &hw.net);
    lua_setfield(L, -2, "cluster");
  }
  seal(L);
  lua_setfield(L, -2, "links");
  seal(L);
}

/* ---- candidates ------------------------------------------------------------------ */

static const char *const recompute_names[] = {"none", "selective", "full"};

void tables_push_candidate(lua_State *L, const weft_graph *g, const search_plan *c) {
  lua_createtable(L, 0, 24);
  set_int(L, "tp", c->tp);
  set_int(L, "pp", c->pp);
  set_int(L, "dp", c->dp);
  set_int(L, "cp", c->cp);
  set_int(L, "ep", c->ep > 1 ? c->ep : 1);
  set_int(L, "micro_batches", c->micro_batches);
  set_int(L, "micro_batch_size", c->micro_batch_size);
  set_str(L, "schedule", sched_kind_names[c->schedule]);
  set_int(L, "interleave", c->interleave);
  set_str(L, "recompute", recompute_names[c->recompute >= 0 && c->recompute < 3 ? c->recompute : 0]);
  set_int(L, "zero", c->zero);
  set_bool(L, "sequence_parallel", c->sequence_parallel);
  set_bool(L, "uniform", !c->nonuniform);
  set_int(L, "bucket_bytes", c->bucket_bytes);
  set_int(L, "devices", (int64_t)c->tp * c->pp * c->cp * (c->ep > 1 ? c->ep : 1) * c->dp);
  lua_createtable(L, c->nstages, 0);
  for (int k = 0; k < c->nstages; k++) {
    const search_stage *st = &c->stages[k];
    lua_createtable(L, 0, 4);
    lua_createtable(L, 2, 0);
    if (st->first_op >= 0 && st->first_op < g->nops) lua_pushstring(L, g->ops[st->first_op].name);
    else lua_pushboolean(L, 0);
    lua_rawseti(L, -2, 1);
    if (st->last_op >= 0 && st->last_op < g->nops) lua_pushstring(L, g->ops[st->last_op].name);
    else lua_pushboolean(L, 0);
    lua_rawseti(L, -2, 2);
    lua_setfield(L, -2, "ops");
    set_int(L, "layers", st->layers);
    set_int(L, "position", st->position);
    set_str(L, "recompute", recompute_names[st->recompute >= 0 && st->recompute < 3 ? st->recompute : 0]);
    int tp = c->nonuniform ? st->tp : c->tp, dp = c->nonuniform ? st->dp : c->dp;
    set_int(L, "devices", (int64_t)tp * c->cp * (c->ep > 1 ? c->ep : 1) * dp);
    set_int(L, "tp", tp);
    set_int(L, "dp", dp);
    lua_rawseti(L, -2, k + 1);
  }
  lua_setfield(L, -2, "stages");
  if (c->analytic_time > 0) {
    set_num(L, "analytic_time_s", c->analytic_time);
    set_int(L, "analytic_memory_bytes", c->analytic_memory);
  }
  set_bool(L, "simulated", c->simulated);
  if (c->simulated) {
    set_num(L, "step_time_s", c->step_time);
    set_int(L, "peak_memory_bytes", c->peak_memory);
    set_bool(L, "fits", c->fits);
  }
  set_num(L, "rank", c->rank);
  if (c->decisions.name) set_str(L, "policy", c->decisions.name);
}

/* ---- the space ------------------------------------------------------------------- */

static void push_values(lua_State *L, const search_values *v) {
  lua_createtable(L, v->n, 0);
  for (int i = 0; i < v->n; i++) {
    lua_pushinteger(L, v->v[i]);
    lua_rawseti(L, -2, i + 1);
  }
}

static const sched_kind space_scheds[] = {SCHED_1F1B, SCHED_GPIPE, SCHED_INTERLEAVED};

void tables_push_space(lua_State *L, const search_space *s) {
  lua_createtable(L, 0, 8);
  push_values(L, &s->tp);
  lua_setfield(L, -2, "tp");
  push_values(L, &s->pp);
  lua_setfield(L, -2, "pp");
  push_values(L, &s->cp);
  lua_setfield(L, -2, "cp");
  push_values(L, &s->ep);
  lua_setfield(L, -2, "ep");
  push_values(L, &s->mbs);
  lua_setfield(L, -2, "micro_batch_size");
  lua_newtable(L);
  int n = 0;
  for (int i = 0; i < 3; i++)
    if (s->schedule[space_scheds[i]]) {
      lua_pushstring(L, sched_kind_names[space_scheds[i]]);
      lua_rawseti(L, -2, ++n);
    }
  lua_setfield(L, -2, "schedule");
  push_values(L, &s->interleave);
  lua_setfield(L, -2, "interleave");
  lua_newtable(L);
  n = 0;
  for (int i = 0; i < 3; i++)
    if (s->recompute[i]) {
      lua_pushstring(L, recompute_names[i]);
      lua_rawseti(L, -2, ++n);
    }
  lua_setfield(L, -2, "recompute");
  lua_newtable(L);
  n = 0;
  for (int i = 0; i < 4; i++)
    if (s->zero[i]) {
      lua_pushinteger(L, i);
      lua_rawseti(L, -2, ++n);
    }
  lua_setfield(L, -2, "zero");
  set_bool(L, "uneven", s->uneven);
  set_bool(L, "nonuniform", s->nonuniform);
  set_bool(L, "frontier", s->frontier);
}

/* Field k of the space table at idx: a list of integers in [lo, hi], into
 * out (unchanged when the field is nil). */
static bool read_ints(script_one *one, int idx, const char *k, int lo, int hi, search_values *out, arena *a) {
  lua_State *L = one->L;
  int t = lua_getfield(L, idx, k);
  if (t == LUA_TNIL) {
    lua_pop(L, 1);
    return true;
  }
  const char *want = arena_printf(a, "a list of integers from %d to %d", lo, hi);
  int n = t == LUA_TTABLE ? (int)lua_rawlen(L, -1) : 0;
  bool ok = t == LUA_TTABLE && n > 0 && n <= 4096;
  search_values v = {0, ok ? arena_alloc(a, sizeof(int) * (size_t)n) : NULL};
  for (int i = 1; ok && i <= n; i++) {
    lua_rawgeti(L, -1, i);
    int isnum;
    lua_Integer x = lua_tointegerx(L, -1, &isnum);
    lua_pop(L, 1);
    ok = isnum && x >= lo && x <= hi;
    if (ok) v.v[v.n++] = (int)x;
  }
  lua_pop(L, 1);
  if (!ok) {
    script_error(one, one->entry_line, "the space hook set %s to %s; it takes %s", k,
                 t == LUA_TTABLE && n == 0 ? "an empty list" : t == LUA_TTABLE ? "a list with other values" : lua_typename(L, t),
                 want);
    return false;
  }
  *out = v;
  return true;
}

/* Field k: a list of names from names[0..n), into on[] (by index). */
static bool read_names(script_one *one, int idx, const char *k, const char *const *names, int n, bool *on) {
  lua_State *L = one->L;
  int t = lua_getfield(L, idx, k);
  if (t == LUA_TNIL) {
    lua_pop(L, 1);
    return true;
  }
  bool got[8] = {0};
  int len = t == LUA_TTABLE ? (int)lua_rawlen(L, -1) : 0;
  bool ok = t == LUA_TTABLE && len > 0;
  for (int i = 1; ok && i <= len; i++) {
    lua_rawgeti(L, -1, i);
    const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    int found = -1;
    for (int j = 0; s && j < n && found < 0; j++)
      if (strcmp(s, names[j]) == 0) found = j;
    lua_pop(L, 1);
    ok = found >= 0;
    if (ok) got[found] = true;
  }
  lua_pop(L, 1);
  if (!ok) {
    char want[160] = "";
    for (int j = 0; j < n; j++)
      snprintf(want + strlen(want), sizeof want - strlen(want), "%s\"%s\"", j ? ", " : "", names[j]);
    script_error(one, one->entry_line, "the space hook set %s to %s; it takes a list of %s", k,
                 t == LUA_TTABLE && len == 0 ? "an empty list" : t == LUA_TTABLE ? "a list with other values" : lua_typename(L, t),
                 want);
    return false;
  }
  for (int j = 0; j < n; j++) on[j] = got[j];
  return true;
}

bool tables_read_space(script_one *one, int idx, search_space *s, arena *a) {
  lua_State *L = one->L;
  idx = lua_absindex(L, idx);
  int nd = one->S->w.cl->ndevices;
  if (!read_ints(one, idx, "tp", 1, nd, &s->tp, a) || !read_ints(one, idx, "pp", 1, nd, &s->pp, a) ||
      !read_ints(one, idx, "cp", 1, nd, &s->cp, a) || !read_ints(one, idx, "ep", 1, nd, &s->ep, a) ||
      !read_ints(one, idx, "micro_batch_size", 1, 1 << 20, &s->mbs, a) ||
      !read_ints(one, idx, "interleave", 2, 64, &s->interleave, a))
    return false;
  const char *sn[3];
  bool son[3], ron[3], zon[4];
  for (int i = 0; i < 3; i++) sn[i] = sched_kind_names[space_scheds[i]], son[i] = s->schedule[space_scheds[i]];
  if (!read_names(one, idx, "schedule", sn, 3, son)) return false;
  for (int i = 0; i < 3; i++) s->schedule[space_scheds[i]] = son[i];
  for (int i = 0; i < 3; i++) ron[i] = s->recompute[i];
  if (!read_names(one, idx, "recompute", recompute_names, 3, ron)) return false;
  for (int i = 0; i < 3; i++) s->recompute[i] = ron[i];
  search_values z = {0};
  for (int i = 0; i < 4; i++) zon[i] = s->zero[i];
  if (lua_getfield(L, idx, "zero") != LUA_TNIL) {
    lua_pop(L, 1);
    if (!read_ints(one, idx, "zero", 0, 3, &z, a)) return false;
    for (int i = 0; i < 4; i++) zon[i] = false;
    for (int i = 0; i < z.n; i++) zon[z.v[i]] = true;
  } else lua_pop(L, 1);
  for (int i = 0; i < 4; i++) s->zero[i] = zon[i];
  static const char *const flags[] = {"uneven", "nonuniform", "frontier"};
  bool *const on[] = {&s->uneven, &s->nonuniform, &s->frontier};
  for (int i = 0; i < 3; i++) {
    int t = lua_getfield(L, idx, flags[i]);
    if (t != LUA_TNIL && t != LUA_TBOOLEAN) {
      script_error(one, one->entry_line, "the space hook set %s to %s; it takes %s", flags[i], lua_typename(L, t),
                   "true or false");
      lua_pop(L, 1);
      return false;
    }
    if (t == LUA_TBOOLEAN) *on[i] = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  return true;
}

/* ---- JSON ------------------------------------------------------------------------ */

typedef struct jparse {
  const char *p;
  int depth;
} jparse;

static void jspace(jparse *j) {
  while (*j->p == ' ' || *j->p == '\n' || *j->p == '\t' || *j->p == '\r') j->p++;
}

static bool jvalue(lua_State *L, jparse *j);

static bool jstring(lua_State *L, jparse *j) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  j->p++;
  while (*j->p && *j->p != '"') {
    if (*j->p != '\\') {
      luaL_addchar(&b, *j->p++);
      continue;
    }
    j->p++;
    char c = *j->p++;
    switch (c) {
    case 'n': luaL_addchar(&b, '\n'); break;
    case 't': luaL_addchar(&b, '\t'); break;
    case 'r': luaL_addchar(&b, '\r'); break;
    case 'b': luaL_addchar(&b, '\b'); break;
    case 'f': luaL_addchar(&b, '\f'); break;
    case 'u': {
      unsigned v = 0;
      for (int i = 0; i < 4; i++) {
        char h = *j->p++;
        if (!isxdigit((unsigned char)h)) return false;
        v = v * 16 + (unsigned)(isdigit((unsigned char)h) ? h - '0' : (tolower(h) - 'a' + 10));
      }
      /* what the writer escapes: control characters */
      if (v < 0x80) luaL_addchar(&b, (char)v);
      else if (v < 0x800) luaL_addchar(&b, (char)(0xc0 | (v >> 6))), luaL_addchar(&b, (char)(0x80 | (v & 0x3f)));
      else {
        luaL_addchar(&b, (char)(0xe0 | (v >> 12)));
        luaL_addchar(&b, (char)(0x80 | ((v >> 6) & 0x3f)));
        luaL_addchar(&b, (char)(0x80 | (v & 0x3f)));
      }
      break;
    }
    case 0: return false;
    default: luaL_addchar(&b, c);
    }
  }
  if (*j->p != '"') return false;
  j->p++;
  luaL_pushresult(&b);
  return true;
}

static bool jvalue(lua_State *L, jparse *j) {
  jspace(j);
  if (j->depth > 64 || !lua_checkstack(L, 4)) return false;
  char c = *j->p;
  if (c == '{' || c == '[') {
    bool obj = c == '{';
    j->p++;
    j->depth++;
    lua_newtable(L);
    int n = 0;
    jspace(j);
    if (*j->p == (obj ? '}' : ']')) {
      j->p++;
      j->depth--;
      return true;
    }
    for (;;) {
      if (obj) {
        jspace(j);
        if (*j->p != '"' || !jstring(L, j)) return false;
        jspace(j);
        if (*j->p++ != ':') return false;
      }
      if (!jvalue(L, j)) return false;
      if (obj) lua_rawset(L, -3);  /* null: the key is left out */
      else lua_rawseti(L, -2, ++n);
      jspace(j);
      if (*j->p == ',') {
        j->p++;
        continue;
      }
      if (*j->p++ != (obj ? '}' : ']')) return false;
      j->depth--;
      return true;
    }
  }
  if (c == '"') return jstring(L, j);
  if (strncmp(j->p, "true", 4) == 0) return j->p += 4, lua_pushboolean(L, 1), true;
  if (strncmp(j->p, "false", 5) == 0) return j->p += 5, lua_pushboolean(L, 0), true;
  if (strncmp(j->p, "null", 4) == 0) return j->p += 4, lua_pushnil(L), true;
  char *end;
  double v = strtod(j->p, &end);
  if (end == j->p) return false;
  /* integers as integers, as the writer printed them */
  bool integral = true;
  for (const char *q = j->p; q < end; q++) integral &= *q != '.' && *q != 'e' && *q != 'E';
  if (integral && fabs(v) < 9e15) lua_pushinteger(L, (lua_Integer)v);
  else lua_pushnumber(L, v);
  j->p = end;
  return true;
}

bool tables_push_json(lua_State *L, const char *text) {
  int top = lua_gettop(L);
  jparse j = {text, 0};
  if (!jvalue(L, &j)) {
    lua_settop(L, top);
    return false;
  }
  return true;
}
