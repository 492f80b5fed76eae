/* weft_lib.c - the `weft` library of scripts: the language's primitives
 * (weft.mesh, weft.split, ... ) as decisions, Lua tables a policy puts in
 * a list; the list as a decision list for plan_apply, with the selectors
 * it was written with so that it prints as weft source; weft.estimate,
 * the figures of `weft estimate --json` for a list; weft.source. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "script_int.h"
#include "weft/cost.h"
#include "weft/sim.h"
#include "weft/validate.h"

/* Steps a weft.estimate counts per instruction of the programs it lowers
 * and simulates: about the time a Lua instruction takes. */
enum { ESTIMATE_STEPS = 20 };

/* ---- names and selectors ------------------------------------------------------------ */

/* Words of the language a name cannot be (its keywords). */
static const char *const keywords[] = {
    "use",   "param",  "let",     "fn",     "op",       "model", "cluster",  "device",    "link",
    "input", "output", "block",   "for",    "in",       "if",    "then",     "else",      "train",
    "assert", "true",  "false",   "and",    "or",       "not",   "plan",     "strategy",  "mesh",
    "split", "replicate", "assign", "stage", "order",   "schedule", "recompute", "shard", "buckets",
    "on",    "into",   "as",      "time",   "before",   "selective", "full", "over",     "all",
    NULL};

bool weft_lib_is_name(const char *s) {
  if (!s || !(isalpha((unsigned char)*s) || *s == '_')) return false;
  for (const char *p = s; *p; p++)
    if (!isalnum((unsigned char)*p) && *p != '_') return false;
  for (int i = 0; keywords[i]; i++)
    if (strcmp(s, keywords[i]) == 0) return false;
  return strlen(s) < 128;
}

/* A selector atom: "all", a name, a glob of segments (names, numbers, *,
 * **) joined by dots, optionally ending in a range [lo..hi]. Its path
 * segments in segs, the range in lo, hi (lo -1: none). */
static bool parse_atom(const char *s, char *buf, size_t nbuf, const char **segs, int *ns, long *lo, long *hi) {
  size_t len = strlen(s);
  if (len == 0 || len >= nbuf) return false;
  memcpy(buf, s, len + 1);
  *lo = *hi = -1;
  char *br = strchr(buf, '[');
  if (br) {
    char *end;
    *lo = strtol(br + 1, &end, 10);
    if (end == br + 1 || strncmp(end, "..", 2) != 0) return false;
    char *e2;
    *hi = strtol(end + 2, &e2, 10);
    if (e2 == end + 2 || strcmp(e2, "]") != 0 || *lo < 0 || *hi < *lo) return false;
    *br = 0;
  }
  *ns = 0;
  for (char *p = buf;;) {
    char *dot = strchr(p, '.');
    if (dot) *dot = 0;
    if (!*p || *ns >= 64) return false;
    bool star = strcmp(p, "*") == 0 || strcmp(p, "**") == 0;
    for (char *q = p; *q && !star; q++)
      if (!isalnum((unsigned char)*q) && *q != '_') return false;
    segs[(*ns)++] = p;
    if (!dot) break;
    p = dot + 1;
  }
  return true;
}

typedef struct opset {
  int n;
  int *ops;
  bool *in;
} opset;

static void opset_add(opset *s, int op) {
  if (s->in[op]) return;
  s->in[op] = true;
  s->ops[s->n++] = op;
}

static int select_glob(const weft_graph *g, const char **segs, int ns, opset *out) {
  const char *pat[66];
  for (int i = 0; i < ns; i++) pat[i] = segs[i];
  int found = 0;
  for (int op = 0; op < g->nops; op++) {
    bool m = graph_glob_match(pat, ns, g->ops[op].name);
    if (!m) {
      pat[ns] = "**";
      m = graph_glob_match(pat, ns + 1, g->ops[op].name);
    }
    if (m) opset_add(out, op), found++;
  }
  return found;
}

/* ---- decisions ------------------------------------------------------------------------ */

/* A conversion of decision tables, or a check of one (out NULL). */
typedef struct conv {
  script_one *one;
  lua_State *L;
  const weft_graph *g;
  arena *a;
  weft_decisions *out;
  const char **sels;
  int scap;
  const char *meshes[64];  /* the meshes decided so far */
  int mesh_axes[64];
  int nmeshes;
  int line;                /* of the decision at hand */
  char *msg;
  size_t nmsg;
} conv;

static bool lib_fail(conv *cv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool lib_fail(conv *cv, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cv->msg, cv->nmsg, fmt, ap);
  va_end(ap);
  return false;
}

static const char *type_of(lua_State *L, int idx) { return luaL_typename(L, idx); }

/* Field k of the decision at idx as a string (NULL, and a message, when
 * it is not one). */
static const char *field_str(conv *cv, int idx, const char *k, const char *kind, bool name) {
  lua_State *L = cv->L;
  lua_getfield(L, idx, k);
  const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
  if (!s) lib_fail(cv, "weft.%s: %s must be a string, got %s", kind, k, type_of(L, -1));
  else if (name && !weft_lib_is_name(s)) {
    lib_fail(cv, "weft.%s: %s '%s' is not a name a plan can use (letters, digits and _, not a keyword)", kind, k, s);
    s = NULL;
  }
  if (s) s = arena_strdup(cv->a, s);
  lua_pop(L, 1);
  return s;
}

static bool field_int(conv *cv, int idx, const char *k, const char *kind, int64_t lo, int64_t hi, int64_t *out) {
  lua_State *L = cv->L;
  lua_getfield(L, idx, k);
  int isnum;
  lua_Integer v = lua_tointegerx(L, -1, &isnum);
  bool ok = isnum && v >= lo && v <= hi;
  if (!ok) lib_fail(cv, "weft.%s: %s must be an integer from %lld to %lld, got %s", kind, k, (long long)lo, (long long)hi,
                isnum ? lua_tostring(L, -1) : type_of(L, -1));
  lua_pop(L, 1);
  *out = v;
  return ok;
}

/* Field "ops", a selector (a string or a list of them): its text as the
 * language writes it, and, when converting, its operators. */
static bool field_ops(conv *cv, int idx, const char *kind, const char **text, dec_ops *ops, const char ***atoms_out,
                      int *natoms_out) {
  lua_State *L = cv->L;
  const weft_graph *g = cv->g;
  int t = lua_getfield(L, idx, "ops");
  int n = t == LUA_TSTRING ? 1 : t == LUA_TTABLE ? (int)lua_rawlen(L, -1) : 0;
  if (n == 0 || n > 4096) {
    lua_pop(L, 1);
    return lib_fail(cv, "weft.%s: ops must be a selector (\"h.*.mlp\", \"all\", \"h[0..6]\", a stage) or a list of them, got %s",
                kind, t == LUA_TTABLE ? "an empty list" : lua_typename(L, t));
  }
  const char **atoms = arena_alloc(cv->a, sizeof(char *) * (size_t)n);
  for (int i = 0; i < n; i++) {
    if (t == LUA_TTABLE) lua_rawgeti(L, -1, i + 1);
    else lua_pushvalue(L, -1);
    const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    char buf[1024];
    const char *segs[66];
    int ns;
    long lo, hi;
    if (!s || !parse_atom(s, buf, sizeof buf, segs, &ns, &lo, &hi)) {
      lib_fail(cv, "weft.%s: '%s' is not a selector (\"h.*.mlp\", \"all\", \"h[0..6]\", a stage)", kind,
           s ? s : lua_typename(L, lua_type(L, -1)));
      lua_pop(L, 2);
      return false;
    }
    atoms[i] = arena_strdup(cv->a, s);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  if (n == 1) *text = atoms[0];
  else {
    const char *x = "{";
    for (int i = 0; i < n; i++) x = arena_printf(cv->a, "%s%s%s", x, i ? ", " : "", atoms[i]);
    *text = arena_printf(cv->a, "%s}", x);
  }
  if (atoms_out) *atoms_out = atoms, *natoms_out = n;
  if (!cv->out) return true;
  /* the operators, atom by atom */
  opset set = {0, arena_alloc(cv->a, sizeof(int) * (size_t)(g->nops ? g->nops : 1)),
               arena_alloc(cv->a, (size_t)(g->nops ? g->nops : 1))};
  for (int i = 0; i < n; i++) {
    char buf[1024];
    const char *segs[66];
    int ns;
    long lo, hi;
    parse_atom(atoms[i], buf, sizeof buf, segs, &ns, &lo, &hi);
    if (strcmp(atoms[i], "all") == 0) {
      for (int op = 0; op < g->nops; op++) opset_add(&set, op);
      continue;
    }
    const decision *st = NULL;
    for (int k = 0; k < cv->out->n && !st && lo < 0; k++)
      if (cv->out->items[k].kind == DEC_STAGE && strcmp(cv->out->items[k].name, atoms[i]) == 0) st = &cv->out->items[k];
    if (st) {
      for (int k = 0; k < st->ops.n; k++) opset_add(&set, st->ops.ops[k]);
      continue;
    }
    int found = 0;
    if (lo >= 0) {
      if (hi > lo + g->nops) hi = lo + g->nops;
      for (long k = lo; k < hi && ns < 64; k++) {
        segs[ns] = arena_printf(cv->a, "%ld", k);
        found += select_glob(g, segs, ns + 1, &set);
      }
    } else found = select_glob(g, segs, ns, &set);
    if (!found) return lib_fail(cv, "weft.%s: '%s' matches no operator of model %s", kind, atoms[i], g->name);
  }
  *ops = (dec_ops){set.n, set.ops};
  return true;
}

/* recompute's segments: the operators an atom matches, cut by the name
 * segments it fixes (h.* and h[0..6]: each layer h.N is one), as the
 * language cuts them. */
static int atom_fixed(conv *cv, const char *atom) {
  if (strcmp(atom, "all") == 0) return 0;
  for (int k = 0; cv->out && k < cv->out->n; k++)
    if (cv->out->items[k].kind == DEC_STAGE && strcmp(cv->out->items[k].name, atom) == 0) return 0;
  char buf[1024];
  const char *segs[66];
  int ns;
  long lo, hi;
  parse_atom(atom, buf, sizeof buf, segs, &ns, &lo, &hi);
  for (int i = 0; i < ns; i++)
    if (strcmp(segs[i], "**") == 0) return -1;
  return lo >= 0 ? ns + 1 : ns;
}

static const char *segment_key(arena *a, const char *name, int fixed) {
  if (fixed < 0) return name;
  if (fixed == 0) return "";
  const char *q = name;
  for (int seg = 0; seg < fixed && q; seg++) {
    q = strchr(q, '.');
    if (q && seg + 1 < fixed) q++;
  }
  return q ? arena_strndup(a, name, (size_t)(q - name)) : name;
}

static decision *emit(conv *cv, dec_kind k, const char *sel) {
  if (!cv->out) return NULL;
  decision *d = dec_add(cv->a, cv->out, k);
  /* the line, from its first character, as script_error marks it */
  const weft_src *src = &cv->one->S->w.srcs->items[cv->one->file];
  int len = 0, col = 0;
  const char *text = cv->line > 0 && cv->line <= src->nlines ? src_line(src, cv->line, &len) : NULL;
  while (text && col < len && (text[col] == ' ' || text[col] == '\t')) col++;
  d->loc = text ? (weft_loc){cv->one->file, cv->line, col < len ? col + 1 : 1, cv->line, len > 0 ? len : 1} : (weft_loc){0};
  arena_grow(cv->a, (void **)&cv->sels, &cv->scap, cv->out->n, sizeof(char *));
  cv->sels[cv->out->n - 1] = sel;
  return d;
}

static const char *const shard_states[] = {"optimizer", "gradients", "parameters"};

/* One decision table, at idx. */
static bool convert_one(conv *cv, int idx) {
  lua_State *L = cv->L;
  idx = lua_absindex(L, idx);
  lua_getfield(L, idx, "line");
  cv->line = lua_isinteger(L, -1) ? (int)lua_tointeger(L, -1) : cv->line;
  lua_pop(L, 1);
  const char *kind = field_str(cv, idx, "kind", "decision", false);
  if (!kind) return lib_fail(cv, "a decision is a table made by weft.mesh, weft.split, ...: it has no kind");
  const char *text;
  dec_ops ops = {0};
  int64_t v;
  if (strcmp(kind, "mesh") == 0) {
    const char *name = field_str(cv, idx, "name", kind, true);
    if (!name) return false;
    int t = lua_getfield(L, idx, "axes");
    int na = t == LUA_TTABLE ? (int)lua_rawlen(L, -1) : 0;
    if (na < 1 || na > 8) {
      lua_pop(L, 1);
      return lib_fail(cv, "weft.mesh: axes must be a list of 1 to 8 {name, size} pairs, such as {{\"dp\", 2}, {\"tp\", 4}}");
    }
    const char **axes = arena_alloc(cv->a, sizeof(char *) * (size_t)na);
    int *sizes = arena_alloc(cv->a, sizeof(int) * (size_t)na);
    int64_t total = 1;
    for (int i = 0; i < na; i++) {
      lua_rawgeti(L, -1, i + 1);
      bool ok = lua_type(L, -1) == LUA_TTABLE;
      if (ok) {
        lua_rawgeti(L, -1, 1);
        lua_rawgeti(L, -2, 2);
        int isnum;
        lua_Integer sz = lua_tointegerx(L, -1, &isnum);
        const char *an = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
        ok = an && weft_lib_is_name(an) && isnum && sz >= 1 && sz <= 1000000;
        if (ok) axes[i] = arena_strdup(cv->a, an), sizes[i] = (int)sz, total = total * sz > 1 << 30 ? 1 << 30 : total * sz;
        lua_pop(L, 2);
      }
      lua_pop(L, 1);
      if (!ok) {
        lua_pop(L, 1);
        return lib_fail(cv, "weft.mesh: axis %d must be a {name, size} pair such as {\"tp\", 4}", i + 1);
      }
      for (int k = 0; k < i; k++)
        if (strcmp(axes[k], axes[i]) == 0) {
          lua_pop(L, 1);
          return lib_fail(cv, "weft.mesh: axis %s is named twice", axes[i]);
        }
    }
    lua_pop(L, 1);
    int nd = cv->one->S->w.cl->ndevices;
    if (total > nd) return lib_fail(cv, "weft.mesh: a mesh of %lld devices, but the cluster has %d", (long long)total, nd);
    int *devs = arena_alloc(cv->a, sizeof(int) * (size_t)total);
    t = lua_getfield(L, idx, "devices");
    if (t == LUA_TNIL) {
      for (int i = 0; i < total; i++) devs[i] = i;
    } else {
      int n = t == LUA_TTABLE ? (int)lua_rawlen(L, -1) : -1;
      if (n != total) {
        lua_pop(L, 1);
        return lib_fail(cv, "weft.mesh: devices must be a list of the mesh's %lld device numbers, got %s", (long long)total,
                    t == LUA_TTABLE ? arena_printf(cv->a, "%d of them", n) : lua_typename(L, t));
      }
      bool *seen = arena_alloc(cv->a, (size_t)nd);
      for (int i = 0; i < n; i++) {
        lua_rawgeti(L, -1, i + 1);
        int isnum;
        lua_Integer dv = lua_tointegerx(L, -1, &isnum);
        lua_pop(L, 1);
        if (!isnum || dv < 0 || dv >= nd) {
          lua_pop(L, 1);
          return lib_fail(cv, "weft.mesh: device %d of the list does not exist: the cluster has devices 0 to %d", i + 1, nd - 1);
        }
        if (seen[dv]) {
          lua_pop(L, 1);
          return lib_fail(cv, "weft.mesh: device %d is in the mesh twice", (int)dv);
        }
        seen[dv] = true;
        devs[i] = (int)dv;
      }
    }
    lua_pop(L, 1);
    for (int i = 0; i < cv->nmeshes; i++)
      if (strcmp(cv->meshes[i], name) == 0) return lib_fail(cv, "weft.mesh: mesh %s is defined twice", name);
    if (cv->nmeshes >= 64) return lib_fail(cv, "weft.mesh: a plan has at most 64 meshes");
    if (cv->out) {
      cv->meshes[cv->nmeshes] = name;
      cv->mesh_axes[cv->nmeshes++] = na;
    }
    decision *d = emit(cv, DEC_MESH, NULL);
    if (d) {
      d->name = name;
      d->naxes = na;
      d->axes = axes;
      d->sizes = sizes;
      d->ndevices = (int)total;
      d->devices = devs;
    }
    return true;
  }
  if (strcmp(kind, "split") == 0 || strcmp(kind, "replicate") == 0) {
    bool split = kind[0] == 's';
    const char *dim = NULL, *axis;
    int64_t parts;
    if (!field_ops(cv, idx, kind, &text, &ops, NULL, NULL)) return false;
    if (split && !(dim = field_str(cv, idx, "dim", kind, true))) return false;
    if (!field_int(cv, idx, "parts", kind, 1, 1000000, &parts)) return false;
    if (!(axis = field_str(cv, idx, "axis", kind, true))) return false;
    lua_getfield(L, idx, "in_time");
    bool in_time = lua_toboolean(L, -1);
    lua_pop(L, 1);
    decision *d = emit(cv, split ? DEC_SPLIT : DEC_REPLICATE, text);
    if (d) {
      d->ops = ops;
      d->name = dim;
      d->parts = (int)parts;
      d->axis = axis;
      d->in_time = split && in_time;
    }
    return true;
  }
  if (strcmp(kind, "stage") == 0) {
    const char *name = field_str(cv, idx, "name", kind, true);
    if (!name) return false;
    for (int k = 0; cv->out && k < cv->out->n; k++)
      if (cv->out->items[k].kind == DEC_STAGE && strcmp(cv->out->items[k].name, name) == 0)
        return lib_fail(cv, "weft.stage: stage %s is defined twice", name);
    if (!field_ops(cv, idx, kind, &text, &ops, NULL, NULL)) return false;
    decision *d = emit(cv, DEC_STAGE, text);
    if (d) d->name = name, d->ops = ops;
    return true;
  }
  if (strcmp(kind, "assign") == 0) {
    if (!field_ops(cv, idx, kind, &text, &ops, NULL, NULL)) return false;
    if (lua_getfield(L, idx, "device") != LUA_TNIL) {
      lua_pop(L, 1);
      int nd = cv->one->S->w.cl->ndevices;
      if (!field_int(cv, idx, "device", kind, 0, nd - 1, &v)) return false;
      decision *d = emit(cv, DEC_ASSIGN, text);
      if (d) {
        d->ops = ops;
        d->nidx = 1;
        d->idx = arena_alloc(cv->a, sizeof(dec_index));
        d->idx[0] = (dec_index){NULL, (int)v};
      }
      return true;
    }
    lua_pop(L, 1);
    const char *mesh = field_str(cv, idx, "mesh", kind, true);
    if (!mesh) return false;
    int m = -1;
    for (int i = 0; i < cv->nmeshes; i++)
      if (strcmp(cv->meshes[i], mesh) == 0) m = i;
    if (m < 0 && cv->out) return lib_fail(cv, "weft.assign: no mesh %s is defined before this assignment", mesh);
    int t = lua_getfield(L, idx, "index");
    int n = t == LUA_TTABLE ? (int)lua_rawlen(L, -1) : -1;
    if (n < 1 || n > 8 || (m >= 0 && n != cv->mesh_axes[m])) {
      lua_pop(L, 1);
      return lib_fail(cv, "weft.assign: index must be a list of one entry per axis of mesh %s (an axis name or a number), got %s",
                  mesh, t == LUA_TTABLE ? arena_printf(cv->a, "%d entries", n) : lua_typename(L, t));
    }
    dec_index *ix = arena_alloc(cv->a, sizeof(dec_index) * (size_t)n);
    for (int i = 0; i < n; i++) {
      lua_rawgeti(L, -1, i + 1);
      int isnum;
      lua_Integer x = lua_tointegerx(L, -1, &isnum);
      const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
      bool ok = (isnum && x >= 0 && x < 1000000) || (s && weft_lib_is_name(s));
      if (ok && s) ix[i] = (dec_index){arena_strdup(cv->a, s), 0};
      else if (ok) ix[i] = (dec_index){NULL, (int)x};
      lua_pop(L, 1);
      if (!ok) {
        lua_pop(L, 1);
        return lib_fail(cv, "weft.assign: index entry %d must be an axis name or a number from 0", i + 1);
      }
    }
    lua_pop(L, 1);
    decision *d = emit(cv, DEC_ASSIGN, text);
    if (d) {
      d->ops = ops;
      d->mesh = m;
      d->nidx = n;
      d->idx = ix;
    }
    return true;
  }
  if (strcmp(kind, "schedule") == 0) {
    const char *s = field_str(cv, idx, "schedule", kind, false);
    if (!s) return false;
    static const sched_kind kinds[] = {SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED, SCHED_INTERLACED};
    int k = -1;
    for (int i = 0; i < 4; i++)
      if (strcmp(s, sched_kind_names[kinds[i]]) == 0) k = i;
    if (k < 0) return lib_fail(cv, "weft.schedule: unknown schedule '%s' (gpipe, one_f_one_b, interleaved or interlaced)", s);
    decision *d = emit(cv, DEC_SCHEDULE, NULL);
    if (d) d->sched = kinds[k];
    return true;
  }
  if (strcmp(kind, "recompute") == 0) {
    const char **atoms;
    int natoms;
    if (!field_ops(cv, idx, kind, &text, &ops, &atoms, &natoms)) return false;
    const char *mode = field_str(cv, idx, "mode", kind, false);
    if (!mode) return false;
    if (strcmp(mode, "selective") != 0 && strcmp(mode, "full") != 0)
      return lib_fail(cv, "weft.recompute: mode is \"selective\" or \"full\", got \"%s\"", mode);
    decision *d = emit(cv, DEC_RECOMPUTE, text);
    if (!d) return true;
    d->mode = mode[0] == 'f' ? 2 : 1;
    /* the operators again, atom by atom, each with its segment */
    const weft_graph *g = cv->g;
    d->ops = (dec_ops){0, arena_alloc(cv->a, sizeof(int) * (size_t)(g->nops * natoms + 1))};
    d->keys = arena_alloc(cv->a, sizeof(char *) * (size_t)(g->nops * natoms + 1));
    for (int i = 0; i < natoms; i++) {
      lua_createtable(L, 0, 1);
      lua_pushstring(L, atoms[i]);
      lua_setfield(L, -2, "ops");
      dec_ops one;
      const char *t1;
      /* the decision just added is not a stage: resolving again is safe */
      bool ok = field_ops(cv, lua_gettop(L), kind, &t1, &one, NULL, NULL);
      lua_pop(L, 1);
      if (!ok) return false;
      int fixed = atom_fixed(cv, atoms[i]);
      for (int k = 0; k < one.n; k++) {
        d = &cv->out->items[cv->out->n - 1];
        d->keys[d->ops.n] = segment_key(cv->a, g->ops[one.ops[k]].name, fixed);
        d->ops.ops[d->ops.n++] = one.ops[k];
      }
    }
    return true;
  }
  if (strcmp(kind, "shard") == 0) {
    const char *state = field_str(cv, idx, "state", kind, false);
    if (!state) return false;
    int st = 0;
    for (int i = 0; i < 3; i++)
      if (strcmp(state, shard_states[i]) == 0) st = i + 1;
    if (!st) return lib_fail(cv, "weft.shard: state is \"optimizer\", \"gradients\" or \"parameters\", got \"%s\"", state);
    if (!field_ops(cv, idx, kind, &text, &ops, NULL, NULL)) return false;
    const char *axis = field_str(cv, idx, "axis", kind, true);
    if (!axis) return false;
    decision *d = emit(cv, DEC_SHARD, text);
    if (d) d->ops = ops, d->state = st, d->axis = axis;
    return true;
  }
  if (strcmp(kind, "buckets") == 0) {
    if (!field_int(cv, idx, "bytes", kind, 0, (int64_t)1000000000000000, &v)) return false;
    decision *d = emit(cv, DEC_BUCKETS, NULL);
    if (d) d->bytes = v;
    return true;
  }
  return lib_fail(cv, "a decision of kind '%s': weft makes mesh, split, replicate, stage, assign, schedule, recompute, "
                  "shard and buckets", kind);
}

/* The list at idx, nested lists flattened. */
static bool convert_list(conv *cv, int idx, int depth) {
  lua_State *L = cv->L;
  idx = lua_absindex(L, idx);
  if (depth > 16 || !lua_checkstack(L, 8)) return lib_fail(cv, "decision lists nested more than 16 deep");
  int n = (int)lua_rawlen(L, idx);
  for (int i = 1; i <= n; i++) {
    if (cv->out && cv->out->n >= 100000) return lib_fail(cv, "a plan of more than 100,000 decisions");
    lua_rawgeti(L, idx, i);
    bool ok;
    if (lua_type(L, -1) != LUA_TTABLE)
      ok = lib_fail(cv, "entry %d of the decision list is a %s, not a decision (weft.split, ...) or a list of them", i,
                type_of(L, -1));
    else if (lua_getfield(L, -1, "kind") != LUA_TNIL) {
      lua_pop(L, 1);
      ok = convert_one(cv, -1);
    } else {
      lua_pop(L, 1);
      ok = convert_list(cv, -1, depth + 1);
    }
    lua_pop(L, 1);
    if (!ok) return false;
  }
  return true;
}

bool weft_lib_decisions(script_one *one, lua_State *L, int idx, arena *a, weft_decisions *out,
                        const char ***selectors, int *line, char *msg, size_t nmsg) {
  conv cv = {.one = one, .L = L, .g = one->S->w.g, .a = a, .out = out, .line = *line, .msg = msg, .nmsg = nmsg};
  *out = (weft_decisions){0};
  msg[0] = 0;
  bool ok = convert_list(&cv, idx, 0);
  if (ok && out->n == 0) ok = lib_fail(&cv, "the decision list is empty");
  *line = cv.line;
  *selectors = cv.sels;
  return ok;
}

/* ---- the constructors ------------------------------------------------------------------- */

/* The decision table on top, checked, with the line that made it. */
static int made(lua_State *L, const char *kind) {
  script_one *one = sandbox_one(L);
  lua_pushstring(L, kind);
  lua_setfield(L, -2, "kind");
  lua_pushinteger(L, sandbox_line(one, L));
  lua_setfield(L, -2, "line");
  char msg[512];
  conv cv = {.one = one, .L = L, .g = one->S->w.g, .a = &one->S->tmp, .msg = msg, .nmsg = sizeof msg};
  arena_mark mk = arena_here(&one->S->tmp);
  bool ok = convert_one(&cv, -1);
  arena_rewind(&one->S->tmp, mk);
  if (!ok) return luaL_error(L, "%s", msg);
  return 1;
}

/* Sets field k of the table on top to argument i. */
static void arg_field(lua_State *L, int i, const char *k) {
  lua_pushvalue(L, i);
  lua_setfield(L, -2, k);
}

/* The constructors that only name their arguments: weft.KIND(a, b, ...)
 * is the decision {kind = KIND, FIELD1 = a, FIELD2 = b, ...}, nil where not
 * given. */
typedef struct plain_ctor {
  const char *kind;
  const char *fields[4];
} plain_ctor;

static const plain_ctor plain_ctors[] = {
    {"mesh", {"name", "axes", "devices"}},    {"replicate", {"ops", "parts", "axis"}},
    {"stage", {"name", "ops"}},               {"schedule", {"schedule"}},
    {"shard", {"state", "ops", "axis"}},      {"buckets", {"bytes"}},
};

static int w_plain(lua_State *L) {
  const plain_ctor *c = (const plain_ctor *)lua_touserdata(L, lua_upvalueindex(1));
  int n = 0;
  while (n < 4 && c->fields[n]) n++;
  lua_settop(L, n);
  lua_createtable(L, 0, n + 2);
  for (int i = 0; i < n; i++) arg_field(L, i + 1, c->fields[i]);
  return made(L, c->kind);
}

static int w_split(lua_State *L) {
  lua_settop(L, 5);  /* the arguments, nil where not given */
  lua_createtable(L, 0, 7);
  arg_field(L, 1, "ops");
  arg_field(L, 2, "dim");
  arg_field(L, 3, "parts");
  arg_field(L, 4, "axis");
  lua_pushboolean(L, lua_toboolean(L, 5));
  lua_setfield(L, -2, "in_time");
  return made(L, "split");
}

static int w_assign(lua_State *L) {
  lua_settop(L, 3);  /* the arguments, nil where not given */
  lua_createtable(L, 0, 5);
  arg_field(L, 1, "ops");
  if (lua_isinteger(L, 2)) arg_field(L, 2, "device");
  else {
    arg_field(L, 2, "mesh");
    arg_field(L, 3, "index");
  }
  return made(L, "assign");
}

static int w_recompute(lua_State *L) {
  lua_settop(L, 2);  /* the arguments, nil where not given */
  lua_createtable(L, 0, 4);
  arg_field(L, 1, "ops");
  if (lua_isnoneornil(L, 2)) lua_pushliteral(L, "selective");
  else lua_pushvalue(L, 2);
  lua_setfield(L, -2, "mode");
  return made(L, "recompute");
}

/* weft.zero(stage [, axis [, ops]]): ZeRO as the standard library's zero(stage) writes it. */
static int w_zero(lua_State *L) {
  lua_settop(L, 3);  /* the arguments, nil where not given */
  lua_Integer stage = luaL_checkinteger(L, 1);
  luaL_argcheck(L, stage >= 0 && stage <= 3, 1, "ZeRO's stage is 0, 1, 2 or 3");
  if (lua_isnoneornil(L, 2)) lua_pushliteral(L, "dp");
  else lua_pushvalue(L, 2);
  if (lua_isnoneornil(L, 3)) lua_pushliteral(L, "all");
  else lua_pushvalue(L, 3);
  int axis = lua_gettop(L) - 1, ops = lua_gettop(L);
  lua_createtable(L, (int)stage, 0);
  for (int s = 1; s <= stage; s++) {
    lua_createtable(L, 0, 5);
    lua_pushstring(L, shard_states[s - 1]);
    lua_setfield(L, -2, "state");
    arg_field(L, ops, "ops");
    arg_field(L, axis, "axis");
    made(L, "shard");
    lua_rawseti(L, -2, s);
  }
  return 1;
}

/* ---- weft.estimate and weft.source ------------------------------------------------------ */

/* Converts the list of argument 1 into S->tmp (which it resets); raises
 * the error at the line of the decision at fault. */
static weft_decisions to_decisions(lua_State *L, const char ***sels) {
  script_one *one = sandbox_one(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  arena_reset(&one->S->tmp);
  weft_decisions d;
  char msg[512];
  int line = sandbox_line(one, L);
  if (!weft_lib_decisions(one, L, 1, &one->S->tmp, &d, sels, &line, msg, sizeof msg)) {
    lua_pushfstring(L, "%s:%d: %s", one->short_src, line, msg);
    lua_error(L);
  }
  d.name = one->name;
  return d;
}

static int push_text(lua_State *L) {
  lua_pushstring(L, lua_touserdata(L, 1));
  return 1;
}

/* text (malloc'd), pushed as a string or, as JSON, as tables; freed even
 * when Lua fails for want of memory. */
static void push_owned(lua_State *L, char *text, bool json) {
  lua_pushcfunction(L, push_text);
  lua_pushlightuserdata(L, text);
  int status = lua_pcall(L, 1, 1, 0);
  free(text);
  if (status == LUA_ERRMEM) sandbox_out_of_memory(L);
  if (status != LUA_OK) lua_error(L);
  if (json) {
    const char *s = lua_tostring(L, -1);
    bool ok = tables_push_json(L, s);
    lua_remove(L, ok ? -2 : -1);
    if (!ok) luaL_error(L, "weft.estimate: the estimate's JSON does not read back");
  }
}

static int w_estimate(lua_State *L) {
  script_one *one = sandbox_one(L);
  weft_scripts *S = one->S;
  const char **sels;
  weft_decisions d = to_decisions(L, &sels);
  arena *a = &S->tmp;
  weft_diags sink = {.arena = a, .srcs = S->w.srcs, .max_errors = 4};
  plan_opts po = {.reps = true};
  weft_plan *p = plan_apply(S->w.g, S->w.cl, &d, &po, a, &sink);
  weft_program *pr = p ? lower_plan(p, NULL, a, &sink) : NULL;
  if (pr && !validate_program(pr, &(validate_opts){.skip_memory = true}, &sink)) pr = NULL;
  hw_model hw;
  if (pr && !S->w.symbolic && !hw_from_plan(&sink, p, pr, &hw)) pr = NULL;
  weft_sim *sim = pr ? sim_run_with(pr, S->w.symbolic ? NULL : &hw, 0) : NULL;
  if (!sim) {
    /* the plan does not build: nil and why, where */
    const weft_diag *e = NULL;
    for (int i = 0; i < sink.n && !e; i++)
      if (sink.items[i].sev == DIAG_ERROR) e = &sink.items[i];
    luaL_pushfail(L);
    if (e && e->loc.line > 0 && e->loc.file >= 0 && e->loc.file < S->w.srcs->n)
      lua_pushfstring(L, "%s:%d: %s", S->w.srcs->items[e->loc.file].path, e->loc.line, e->msg);
    else lua_pushstring(L, e ? e->msg : "the plan's programs do not finish");
    sandbox_charge(L, 0);
    return 2;
  }
  weft_estimate e;
  sim_estimate(sim, &e);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) weft_oom();
  estimate_print_json(sim, &e, f);
  fclose(f);
  sim_free(sim);
  int64_t work = pr->instructions;
  arena_reset(a);
  push_owned(L, text, true);
  sandbox_charge(L, work * ESTIMATE_STEPS);
  return 1;
}

static int w_source(lua_State *L) {
  const char **sels;
  weft_decisions d = to_decisions(L, &sels);
  search_plan sp = {.decisions = d, .selectors = sels};
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) weft_oom();
  search_print_body(&sp, sandbox_one(L)->S->w.g, f);
  fclose(f);
  push_owned(L, text, false);
  return 1;
}

void weft_lib_push(lua_State *L, script_one *one) {
  static const luaL_Reg fns[] = {{"split", w_split},         {"assign", w_assign}, {"recompute", w_recompute},
                                 {"zero", w_zero},           {"estimate", w_estimate}, {"source", w_source},
                                 {NULL, NULL}};
  luaL_newlib(L, fns);
  for (size_t i = 0; i < sizeof plain_ctors / sizeof plain_ctors[0]; i++) {
    lua_pushlightuserdata(L, (void *)&plain_ctors[i]);
    lua_pushcclosure(L, w_plain, 1);
    lua_setfield(L, -2, plain_ctors[i].kind);
  }
  tables_push_model(L, one->S->w.g, &one->S->tmp);
  lua_pushvalue(L, -1);
  one->ref_model = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_setfield(L, -2, "model");
  tables_push_cluster(L, one->S->w.cl, one->S->w.g);
  lua_pushvalue(L, -1);
  one->ref_cluster = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_setfield(L, -2, "cluster");
  sandbox_push_readonly(L, -1);
  lua_remove(L, -2);
}

/* ---- what a decision list decides, as a candidate's fields --------------------------------- */

/* The stages of a decision list: each stage's operators, the repeated
 * blocks it holds, and its place on the pipeline (the pp index of the last
 * assignment that places its first operator; -1 when no number says). */
static void describe_stages(const weft_graph *g, const weft_decisions *d, search_plan *sp, arena *a) {
  int n = 0;
  for (int i = 0; i < d->n; i++) n += d->items[i].kind == DEC_STAGE;
  if (n == 0) return;
  char block[128];
  int nblocks = tables_blocks(g, block, sizeof block);
  size_t bl = strlen(block);
  bool *seen = arena_alloc(a, (size_t)(nblocks + 1));
  sp->stages = arena_alloc(a, sizeof(search_stage) * (size_t)n);
  for (int i = 0; i < d->n; i++) {
    const decision *x = &d->items[i];
    if (x->kind != DEC_STAGE || x->ops.n == 0) continue;
    search_stage *st = &sp->stages[sp->nstages++];
    *st = (search_stage){.first_op = x->ops.ops[0], .last_op = x->ops.ops[0], .position = -1};
    memset(seen, 0, (size_t)(nblocks + 1));
    for (int k = 0; k < x->ops.n; k++) {
      int op = x->ops.ops[k];
      if (op < st->first_op) st->first_op = op;
      if (op > st->last_op) st->last_op = op;
      const char *nm = g->ops[op].name;
      if (nblocks > 0 && strncmp(nm, block, bl) == 0 && nm[bl] == '.') {
        int b = atoi(nm + bl + 1);
        if (b >= 0 && b < nblocks && !seen[b]) seen[b] = true, st->layers++;
      }
    }
    /* its recomputation: the most any recompute statement asks of its operators */
    for (int j = 0; j < d->n; j++) {
      const decision *y = &d->items[j];
      if (y->kind != DEC_RECOMPUTE || y->mode <= st->recompute) continue;
      bool touches = false;
      for (int k = 0; k < y->ops.n && !touches; k++)
        for (int q = 0; q < x->ops.n && !touches; q++) touches = y->ops.ops[k] == x->ops.ops[q];
      if (touches) st->recompute = y->mode;
    }
    for (int j = 0; j < d->n; j++) {
      const decision *y = &d->items[j];
      if (y->kind != DEC_ASSIGN || y->mesh < 0) continue;
      bool places = false;
      for (int k = 0; k < y->ops.n && !places; k++) places = y->ops.ops[k] == st->first_op;
      const decision *m = NULL;
      for (int k = 0, seen_m = 0; k < d->n && !m; k++)
        if (d->items[k].kind == DEC_MESH && seen_m++ == y->mesh) m = &d->items[k];
      for (int ax = 0; places && m && ax < m->naxes && ax < y->nidx; ax++)
        if (strcmp(m->axes[ax], "pp") == 0 && !y->idx[ax].axis) st->position = y->idx[ax].value;
    }
  }
}

void weft_lib_describe(const weft_graph *g, const weft_decisions *d, search_plan *sp, arena *a) {
  sp->tp = sp->pp = sp->dp = sp->cp = sp->ep = 1;
  sp->micro_batches = 1;
  sp->interleave = 1;
  sp->bucket_bytes = PLAN_DEFAULT_BUCKET;
  const decision *mesh = NULL;
  int64_t batch = 1;
  for (int t = 0; t < g->ntensors; t++)
    if (g->tensors[t].role == TENSOR_INPUT && g->tensors[t].ndims > 0) {
      batch = g->tensors[t].dims[0].size;
      break;
    }
  int nstages = 0;
  for (int i = 0; i < d->n; i++) {
    const decision *x = &d->items[i];
    switch (x->kind) {
    case DEC_MESH:
      if (!mesh) {
        mesh = x;
        for (int k = 0; k < x->naxes; k++) {
          if (strcmp(x->axes[k], "tp") == 0) sp->tp = x->sizes[k];
          if (strcmp(x->axes[k], "pp") == 0) sp->pp = x->sizes[k];
          if (strcmp(x->axes[k], "dp") == 0) sp->dp = x->sizes[k];
          if (strcmp(x->axes[k], "cp") == 0) sp->cp = x->sizes[k];
          if (strcmp(x->axes[k], "ep") == 0) sp->ep = x->sizes[k];
        }
      }
      break;
    case DEC_SPLIT:
      if (x->in_time) sp->micro_batches *= x->parts;
      if (x->name && (strcmp(x->name, "seq") == 0 || strcmp(x->name, "sequence") == 0) && x->parts > 1 &&
          !(x->axis && strcmp(x->axis, "cp") == 0))
        sp->sequence_parallel = true;
      break;
    case DEC_STAGE: nstages++; break;
    case DEC_SCHEDULE: sp->schedule = x->sched; break;
    case DEC_RECOMPUTE: if (x->mode > sp->recompute) sp->recompute = x->mode; break;
    case DEC_SHARD: if (x->state > sp->zero) sp->zero = x->state; break;
    case DEC_BUCKETS: sp->bucket_bytes = x->bytes; break;
    default: break;
    }
  }
  int64_t per = (int64_t)sp->dp * sp->ep * sp->micro_batches;
  sp->micro_batch_size = per > 0 && batch % per == 0 ? (int)(batch / per) : 0;
  if (sp->pp > 0 && nstages > sp->pp && nstages % sp->pp == 0) sp->interleave = nstages / sp->pp;
  describe_stages(g, d, sp, a);
}
