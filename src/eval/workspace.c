/* workspace.c - a workspace: its files and modules (`use`, the embedded
 * standard library), the top-level items of each, and --set overrides. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eval.h"
#include "weft/workspace.h"
#include "model.h"
#include "stdlib_files.h"

/* ---- context -------------------------------------------------------------- */

weft_ctx *weft_new(void) {
  weft_ctx *c = calloc(1, sizeof *c);
  if (!c) weft_oom();
  arena_init(&c->arena);
  c->diags.arena = &c->arena;
  c->diags.srcs = &c->srcs;
  c->diags.max_errors = 50;
  const char *dir = getenv("WEFT_STDLIB");
  if (dir && *dir) c->stdlib_dir = dir;
  return c;
}

void weft_free(weft_ctx *c) {
  if (!c) return;
  arena_free(&c->arena);
  free(c);
}

bool weft_set(weft_ctx *c, const char *assignment) {
  const char *eq = strchr(assignment, '=');
  weft_loc none = {0};
  if (!eq || !eval_is_ident(assignment, (size_t)(eq - assignment))) {
    weft_diag *g = eval_error(c, none, "--set needs NAME=VALUE, got '%s'", assignment);
    diag_hint(g, &c->diags, "for example --set layers=24");
    return false;
  }
  arena_grow(&c->arena, (void **)&c->overrides, &c->ocap, c->noverrides + 1, sizeof(weft_override));
  weft_override *o = &c->overrides[c->noverrides++];
  o->name = arena_strndup(&c->arena, assignment, (size_t)(eq - assignment));
  o->text = arena_strdup(&c->arena, eq + 1);
  o->used = false;
  for (int i = 0; i < c->noverrides - 1; i++)
    if (strcmp(c->overrides[i].name, o->name) == 0) c->overrides[i].used = true;  /* last wins */
  return true;
}

/* ---- where a plan may read ------------------------------------------------ */

/* path made absolute and rid of "." and ".." by its text alone: where a
 * file that does not exist would be. */
static const char *lexical_path(weft_ctx *c, const char *path) {
  char cwd[PATH_MAX];
  const char *full = path;
  if (path[0] != '/') full = arena_printf(&c->arena, "%s/%s", getcwd(cwd, sizeof cwd) ? cwd : "", path);
  char *out = arena_alloc(&c->arena, strlen(full) + 2);
  size_t n = 0;
  for (const char *p = full; *p;) {
    while (*p == '/') p++;
    const char *e = p;
    while (*e && *e != '/') e++;
    size_t len = (size_t)(e - p);
    if (len == 0 || (len == 1 && p[0] == '.')) {
    } else if (len == 2 && p[0] == '.' && p[1] == '.') {
      while (n > 0 && out[n - 1] != '/') n--;
      if (n > 0) n--;
    } else {
      out[n++] = '/';
      memcpy(out + n, p, len);
      n += len;
    }
    p = e;
  }
  if (n == 0) out[n++] = '/';
  out[n] = 0;
  return out;
}

static bool under(const char *path, const char *dir) {
  size_t n = strlen(dir);
  if (n == 1 && dir[0] == '/') return path[0] == '/';
  return strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == 0);
}

/* Whether a `use` may read the file at path (a real path, or one made
 * by lexical_path): under the plan's directory, the standard library's,
 * or a directory --allow-path gave. */
static bool readable_place(weft_ctx *c, const char *path) {
  if (c->tree && under(path, c->tree)) return true;
  for (int i = 0; i < c->nallowed; i++)
    if (under(path, c->allowed[i])) return true;
  if (c->stdlib_dir) {
    char *std = realpath(c->stdlib_dir, NULL);
    bool ok = std && under(path, std);
    free(std);
    if (ok) return true;
  }
  return false;
}

bool weft_allow_path(weft_ctx *c, const char *dir) {
  char *real = realpath(dir, NULL);
  struct stat st;
  weft_loc none = {0};
  if (!real || stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
    eval_error(c, none, "--allow-path %s: %s", dir, real ? "not a directory" : strerror(errno));
    free(real);
    return false;
  }
  arena_grow(&c->arena, (void **)&c->allowed, &c->acap, c->nallowed + 1, sizeof(char *));
  c->allowed[c->nallowed++] = arena_strdup(&c->arena, real);
  free(real);
  return true;
}

/* The real path of the directory of path, the tree its `use` reads in. */
static void set_tree(weft_ctx *c, const char *path) {
  char *d = arena_strdup(&c->arena, path);
  char *slash = strrchr(d, '/');
  if (slash) slash[slash == d ? 1 : 0] = 0;
  char *real = realpath(slash ? d : ".", NULL);
  c->tree = real ? arena_strdup(&c->arena, real) : NULL;
  free(real);
}

/* ---- modules and top-level items ------------------------------------------ */

static int load_module(weft_ctx *c, const char *key, int file, weft_module **out);

static const weft_embedded_file *embedded_find(const char *name) {
  for (int i = 0; i < weft_stdlib_count; i++)
    if (strcmp(weft_stdlib_files[i].name, name) == 0) return &weft_stdlib_files[i];
  return NULL;
}

static weft_module *find_module(weft_ctx *c, const char *key) {
  for (int i = 0; i < c->nmodules; i++)
    if (strcmp(c->modules[i].key, key) == 0) return &c->modules[i];
  return NULL;
}

/* Resolves and loads the module a `use` names; returns its env or NULL. */
static env *use_module(weft_ctx *c, const char *from_dir, const ast *n) {
  const char *rel = n->name ? arena_printf(&c->arena, "%s.plan", n->name) : n->text;
  bool in_std = n->name != NULL || strncmp(from_dir, "<std>/", 6) == 0;
  if (n->name && strcmp(n->name, "std") != 0) {
    weft_diag *g = eval_error(c, n->loc, "unknown module '%s'", n->name);
    diag_hint(g, &c->diags, "`use std` imports the standard library; `use \"./file.plan\"` imports a file");
    return NULL;
  }
  char *key;
  int file = -1;
  if (in_std && !c->stdlib_dir) {
    const char *base = strrchr(rel, '/') ? strrchr(rel, '/') + 1 : rel;
    key = arena_printf(&c->arena, "<std>/%s", base);
    weft_module *m = find_module(c, key);
    if (!m) {
      const weft_embedded_file *f = embedded_find(base);
      if (!f) {
        eval_error(c, n->loc, "the standard library has no module '%s'", base);
        return NULL;
      }
      file = src_add(&c->srcs, &c->arena, key, "<std>/", f->text, f->len);
    }
  } else {
    const char *dir = in_std ? c->stdlib_dir : from_dir;
    char *path = rel[0] == '/' ? arena_strdup(&c->arena, rel)
                 : arena_printf(&c->arena, "%s%s%s", dir, (*dir && dir[strlen(dir) - 1] != '/') ? "/" : "", rel);
    char *real = realpath(path, NULL);
    int err = errno;
    /* where the file is, or would be: nothing outside the allowed
     * directories is opened, or said to exist */
    if (!readable_place(c, real ? real : lexical_path(c, path))) {
      free(real);
      c->import_failed = true;
      weft_diag *g = eval_error(c, n->loc, "`use \"%s\"` reads outside the plan's directory", rel);
      diag_hint(g, &c->diags, "a plan imports files under its own directory and the standard library; "
                "--allow-path DIR allows another");
      return NULL;
    }
    if (!real) {
      weft_diag *g = eval_error(c, n->loc, "cannot open module '%s': %s", path, strerror(err));
      if (in_std) diag_hint(g, &c->diags, "the standard library is read from %s (--stdlib or WEFT_STDLIB)", c->stdlib_dir);
      return NULL;
    }
    key = arena_strdup(&c->arena, real);
    free(real);
    if (!find_module(c, key)) {
      char why[256];
      file = src_read(&c->srcs, &c->arena, path, why, sizeof why);
      if (file < 0) {
        eval_error(c, n->loc, "cannot read module '%s': %s", path, why);
        return NULL;
      }
      if (in_std) c->srcs.items[file].dir = "<std>/";
      if (in_std && c->stdlib_dir) c->srcs.items[file].dir = arena_printf(&c->arena, "%s/", c->stdlib_dir);
    }
  }
  weft_module *m = find_module(c, key);
  if (m) {
    if (m->loading) {
      weft_diag *g = eval_error(c, n->loc, "import cycle: '%s' imports itself through this `use`",
                                c->srcs.items[m->file].path);
      diag_hint(g, &c->diags, "move what both files need into a third file");
      return NULL;
    }
    if (m->failed) { c->import_failed = true; return NULL; }
    return m->env;
  }
  if (load_module(c, key, file, &m) != WEFT_OK) { c->import_failed = true; return NULL; }
  return m->env;
}

static bool define_top(weft_ctx *c, env *e, const char *name, value v, weft_loc loc) {
  for (int i = 0; i < e->n; i++) {
    if (strcmp(e->items[i].name, name) != 0 || e->items[i].imported) continue;
    weft_diag *g = eval_error(c, loc, "'%s' is already defined", name);
    const weft_loc *p = &e->items[i].loc;
    diag_hint(g, &c->diags, "the first definition is at line %d", p->line);
    return false;
  }
  env_define(&c->arena, e, name, v, loc, false);
  return true;
}

static value eval_param(weft_ctx *c, weft_module *m, env *e, const ast *n) {
  if (m == &c->modules[0]) {
    for (int i = c->noverrides - 1; i >= 0; i--) {
      weft_override *o = &c->overrides[i];
      if (strcmp(o->name, n->name) != 0) continue;
      o->used = true;
      char *label = arena_printf(&c->arena, "--set %s", o->name);
      int file = src_add(&c->srcs, &c->arena, label, "", o->text, strlen(o->text));
      weft_parse_opts po = {&c->arena, &c->srcs, &c->diags};
      ast *x = weft_parse_expr(&po, file);
      if (!x) return v_error();
      if (x->kind == E_NAME && !env_lookup(e, x->name)) return v_string(x->name);
      value v = eval_expr(c, e, x);
      return v;
    }
  }
  return eval_expr(c, e, n->a);
}

static vdecl *new_decl(weft_ctx *c, const ast *n, env *e) {
  vdecl *d = arena_alloc(&c->arena, sizeof *d);
  d->node = n;
  d->closure = e;
  d->name = n->name;
  return d;
}

static bool eval_item(weft_ctx *c, weft_module *m, env *e, const ast *n) {
  switch (n->kind) {
  case S_USE: {
    env *me = use_module(c, c->srcs.items[m->file].dir, n);
    if (!me) return false;
    for (int i = 0; i < me->n; i++) {
      binding *cur = NULL;
      for (int j = 0; j < e->n; j++)
        if (strcmp(e->items[j].name, me->items[i].name) == 0) cur = &e->items[j];
      if (cur && !cur->imported) continue;  /* the file's own definition wins */
      env_define(&c->arena, e, me->items[i].name, me->items[i].val, me->items[i].loc, true);
    }
    return true;
  }
  case S_PARAM: case S_LET: {
    value v = n->kind == S_PARAM ? eval_param(c, m, e, n) : eval_expr(c, e, n->a);
    /* a failed definition still defines its name, as an error value, so that
     * its uses fail quietly instead of reporting an unknown name */
    bool ok = define_top(c, e, n->name, v, n->loc);
    return ok && v.kind != V_ERROR;
  }
  case S_FN: {
    value v = {.kind = V_FN, .decl = new_decl(c, n, e)};
    return define_top(c, e, n->name, v, n->loc);
  }
  case S_OP: {
    opdecl *op = opdecl_build(c, e, n);
    if (!op) return false;
    value v = {.kind = V_OPDECL, .op = op};
    return define_top(c, e, n->name, v, n->loc);
  }
  case S_PLAN: case S_STRATEGY: {
    value v = {.kind = n->kind == S_PLAN ? V_PLAN : V_STRATEGY, .decl = new_decl(c, n, e)};
    return define_top(c, e, n->name, v, n->loc);
  }
  case S_MODEL: case S_CLUSTER: {
    value v = {.kind = n->kind == S_MODEL ? V_MODEL : V_CLUSTER, .decl = new_decl(c, n, e)};
    if (n->kind == S_MODEL && !model_check_decl(c, n)) return false;
    return define_top(c, e, n->name, v, n->loc);
  }
  case S_MODELDEF: {
    value v = eval_expr(c, e, n->a);
    if (v.kind == V_ERROR) return false;
    if (v.kind != V_MODEL) {
      eval_error(c, n->a->loc, "`model %s = ...` needs a model, got %s %s", n->name,
                 value_kind_name(v.kind), value_repr(&c->arena, v));
      return false;
    }
    vdecl *d = arena_alloc(&c->arena, sizeof *d);
    *d = *v.decl;
    d->name = n->name;
    v.decl = d;
    return define_top(c, e, n->name, v, n->loc);
  }
  case S_ASSERT:
    return eval_assert(c, e, n);

  default: {
    static const char *const what[AST_KIND_COUNT] = {
        [S_INPUT] = "`input`", [S_TPARAM] = "a tensor parameter", [S_ASSIGN] = "an assignment",
        [S_BLOCK] = "`block`", [S_FOR] = "`for`", [S_IF] = "`if`", [S_OUTPUT] = "`output`",
        [S_TRAIN] = "`train`", [S_DEVICE] = "`device`", [S_LINK] = "`link`", [S_MESH] = "`mesh`",
        [S_SPLIT] = "`split`", [S_REPLICATE] = "`replicate`", [S_PLACE] = "`assign`", [S_STAGE] = "`stage`",
        [S_ORDER] = "`order`", [S_SCHEDULE] = "`schedule`", [S_RECOMPUTE] = "`recompute`",
        [S_SHARD] = "`shard`", [S_BUCKETS] = "`buckets`", [S_SEARCH] = "`search`", [S_CALL] = "a strategy call"};
    const char *w = what[n->kind] ? what[n->kind] : ast_kind_names[n->kind];
    weft_diag *g = eval_error(c, n->loc, "%s is not allowed at the top level", w);
    if (n->kind == S_ASSIGN) diag_hint(g, &c->diags, "use `let NAME = ...` or `param NAME = ...`");
    else if (n->kind == S_DEVICE || n->kind == S_LINK) diag_hint(g, &c->diags, "it belongs in a cluster");
    else if (n->kind == S_SEARCH) diag_hint(g, &c->diags, "it belongs in a plan");
    else if (n->kind >= S_MESH && n->kind <= S_CALL) diag_hint(g, &c->diags, "it belongs in a plan or a strategy");
    else diag_hint(g, &c->diags, "it belongs in a model");
    return false;
  }
  }
}

static int load_module(weft_ctx *c, const char *key, int file, weft_module **out) {
  env *parent = eval_global_env(c);
  arena_grow(&c->arena, (void **)&c->modules, &c->mcap, c->nmodules + 1, sizeof(weft_module));
  int idx = c->nmodules++;
  weft_module *m = &c->modules[idx];
  m->key = key;
  m->file = file;
  m->env = env_new(&c->arena, parent);
  m->loading = true;
  *out = m;
  weft_parse_opts po = {&c->arena, &c->srcs, &c->diags};
  ast *root = weft_parse(&po, file);
  m = &c->modules[idx];
  m->root = root;
  if (!root) {
    /* kept, with no names, so that a second `use` does not report it again */
    m->failed = true;
    m->loading = false;
    return WEFT_REJECTED;
  }
  bool ok = true;
  for (int i = 0; i < root->list.n; i++) {
    int before = c->diags.errors;
    if (!eval_item(c, &c->modules[idx], c->modules[idx].env, root->list.items[i]) ||
        c->diags.errors > before)
      ok = false;
    if (c->steps > EVAL_MAX_STEPS) break;
  }
  m = &c->modules[idx];  /* the table may have moved while importing */
  m->loading = false;
  m->failed = !ok;
  *out = m;
  return ok ? WEFT_OK : WEFT_REJECTED;
}

static int finish_load(weft_ctx *c, int file, const char *key) {
  weft_module *m;
  int rc = load_module(c, key, file, &m);
  c->main = &c->modules[0];
  for (int i = 0; i < c->noverrides; i++) {
    weft_override *o = &c->overrides[i];
    if (o->used) continue;
    const char *names[256];
    int n = 0;
    const ast *root = c->main->root;
    for (int k = 0; root && k < root->list.n && n < 256; k++)
      if (root->list.items[k]->kind == S_PARAM) names[n++] = root->list.items[k]->name;
    weft_loc none = {0};
    weft_diag *g = eval_error(c, none, "--set %s: the file has no parameter '%s'", o->name, o->name);
    const char *best = diag_closest(o->name, names, n);
    if (best) diag_hint(g, &c->diags, "did you mean '%s'?", best);
    else if (n == 0) diag_hint(g, &c->diags, "the file declares no `param`");
    else {
      size_t len = 0;
      for (int k = 0; k < n; k++) len += strlen(names[k]) + 2;
      char *list = arena_alloc(&c->arena, len + 1);
      for (int k = 0; k < n; k++) { strcat(list, names[k]); if (k + 1 < n) strcat(list, ", "); }
      diag_hint(g, &c->diags, "known parameters: %s", list);
    }
    rc = WEFT_REJECTED;
  }
  if (rc == WEFT_OK && c->diags.errors) rc = WEFT_REJECTED;
  return rc;
}

int weft_load(weft_ctx *c, const char *path) {
  char why[256];
  int file = src_read(&c->srcs, &c->arena, path, why, sizeof why);
  if (file < 0) {
    weft_loc none = {0};
    eval_error(c, none, "cannot read '%s': %s", path, why);
    return WEFT_FAILED;
  }
  set_tree(c, path);
  char *real = realpath(path, NULL);
  const char *key = arena_strdup(&c->arena, real ? real : path);
  free(real);
  return finish_load(c, file, key);
}

int weft_load_text(weft_ctx *c, const char *name, const char *text, size_t len) {
  int file = src_add(&c->srcs, &c->arena, name, "", text, len);
  set_tree(c, ".");
  return finish_load(c, file, name);
}

int weft_items(weft_ctx *c, value_kind kind, weft_item *out, int max) {
  if (!c->main) return 0;
  env *e = c->main->env;
  int n = 0;
  for (int i = 0; i < e->n; i++) {
    binding *b = &e->items[i];
    if (b->imported || b->val.kind != kind) continue;
    if (n < max) out[n] = (weft_item){b->name, b->val, b->loc};
    n++;
  }
  return n;
}

value weft_eval_text(weft_ctx *c, const char *label, const char *text) {
  int file = src_add(&c->srcs, &c->arena, label, "", text, strlen(text));
  weft_parse_opts po = {&c->arena, &c->srcs, &c->diags};
  ast *x = weft_parse_expr(&po, file);
  if (!x) return v_error();
  return eval_expr(c, c->main ? c->main->env : eval_global_env(c), x);
}
