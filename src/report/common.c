/* common.c - what the tasks of the report layer share: a context made
 * from the options, diagnostics printed the way the options say, the plan
 * a file names, numbers grouped for people. */
#include "common.h"

static bool use_color(const weft_opts *o) {
  if (o->color >= 0) return o->color;
  const char *term = getenv("TERM");
  return isatty(2) && !getenv("NO_COLOR") && term && strcmp(term, "dumb") != 0;
}

weft_ctx *report_ctx(const weft_opts *o) {
  weft_ctx *c = weft_new();
  if (o->stdlib_dir) c->stdlib_dir = o->stdlib_dir;
  c->diags.max_errors = o->max_errors;
  for (int i = 0; i < o->nsets; i++) weft_set(c, o->sets[i]);
  for (int i = 0; i < o->nallow_paths; i++) weft_allow_path(c, o->allow_paths[i]);
  return c;
}

void report_diags(weft_ctx *c, const weft_opts *o) {
  if (!o->json) diag_print(&c->diags, stderr, use_color(o));
}

/* Loads o->files[0] and builds the plan --plan names (default: the last
 * one the file defines). NULL with *rc set after diagnostics. */
weft_plan *report_plan(weft_ctx *c, const weft_opts *o, int *rc, const plan_opts *po) {
  *rc = c->diags.errors ? WEFT_REJECTED : weft_load(c, o->files[0]);
  weft_plan *p = NULL;
  weft_loc none = {0};
  if (*rc != WEFT_OK) return NULL;
  weft_item items[256];
  int n = weft_items(c, V_PLAN, items, 256);
  if (n > 256) n = 256;
  int pick = n - 1;
  if (o->plan) {
    pick = -1;
    for (int i = 0; i < n; i++)
      if (strcmp(items[i].name, o->plan) == 0) pick = i;
  }
  if (pick < 0) {
    weft_diag *d = o->plan ? report_error(c, none, "%s defines no plan '%s'", o->files[0], o->plan)
                           : report_error(c, none, "%s defines no plan", o->files[0]);
    const char *names[256];
    for (int i = 0; i < n; i++) names[i] = items[i].name;
    const char *best = o->plan ? diag_closest(o->plan, names, n) : NULL;
    if (best) diag_hint(d, &c->diags, "did you mean '%s'?", best);
    *rc = WEFT_REJECTED;
    return NULL;
  }
  p = weft_build_plan(c, items[pick].val, items[pick].loc, po);
  if (!p) *rc = WEFT_REJECTED;
  return p;
}

bool report_output_ok(const weft_opts *o, const char *opt, const char *path, bool say) {
  char why[PATH_MAX + 128];
  if (!file_check_output(path, why, sizeof why)) {
    if (say) fprintf(stderr, "weft: error: %s %s: %s\n", opt, path, why);
    return false;
  }
  /* a file can be made there: what access(2) allows root may still fail */
  char err[PATH_MAX + 256];
  file_out *probe = file_out_open(path, err, sizeof err);
  if (!probe) {
    if (say) fprintf(stderr, "weft: error: %s %s\n", opt, err);
    return false;
  }
  file_out_abort(probe);
  const char *reads[] = {o->nfiles ? o->files[0] : NULL, o->inputs};
  for (size_t i = 0; i < sizeof reads / sizeof reads[0]; i++)
    if (reads[i] && file_same(path, reads[i])) {
      if (say) fprintf(stderr, "weft: error: %s %s: the command reads that file (%s); weft never writes over its inputs\n",
                       opt, path, reads[i]);
      return false;
    }
  return true;
}

bool report_output_not_source(weft_ctx *c, const char *opt, const char *path, bool say) {
  for (int i = 0; i < c->nmodules; i++)
    if (file_same(path, c->modules[i].key)) {
      if (say) fprintf(stderr, "weft: error: %s %s: the plan imports that file (%s); weft never writes over its inputs\n",
                       opt, path, c->srcs.items[c->modules[i].file].path);
      return false;
    }
  return true;
}

bool report_bound(const vdecl *d) {
  const ast_list *ps = &d->node->list;
  for (int i = 0; i < ps->n; i++)
    if (!ps->items[i]->a && !record_get(d->bound, ps->items[i]->name)) return false;
  return true;
}

const char *report_grouped(char *buf, int64_t v) {
  char tmp[32];
  int n = snprintf(tmp, sizeof tmp, "%" PRId64, v);
  int o = 0;
  for (int i = 0; i < n; i++) {
    buf[o++] = tmp[i];
    if (tmp[i] != '-' && (n - i - 1) % 3 == 0 && i != n - 1) buf[o++] = ',';
  }
  buf[o] = 0;
  return buf;
}


weft_diag *report_error(weft_ctx *c, weft_loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  weft_diag *g = diag_vadd(&c->diags, DIAG_ERROR, loc, fmt, ap);
  va_end(ap);
  return g;
}

const ast *report_search_stmt(const ast *plan) {
  if (!plan) return NULL;
  const ast_list *body = plan->kind == S_PLAN ? &plan->list2 : &plan->list;
  for (int i = 0; i < body->n; i++) {
    const ast *s = body->items[i];
    if (s->kind == S_SEARCH) return s;
    const ast *in = s->kind == S_FOR || s->kind == S_IF ? report_search_stmt(s) : NULL;
    if (!in && s->kind == S_IF) {
      ast alt = {.kind = S_FOR, .list = s->list2};
      in = report_search_stmt(&alt);
      if (!in && s->b) in = report_search_stmt(s->b);
    }
    if (in) return in;
  }
  return NULL;
}

int report_holes(const ast *n, weft_loc *out, int max) {
  if (!n) return 0;
  int k = 0;
  if (n->kind == E_HOLE) {
    if (max > 0) out[0] = n->loc;
    return 1;
  }
  const ast *kids[3] = {n->a, n->b, n->c};
  for (int i = 0; i < 3; i++) k += report_holes(kids[i], out + (k < max ? k : max), max - k > 0 ? max - k : 0);
  for (int i = 0; i < n->list.n; i++) k += report_holes(n->list.items[i], out + (k < max ? k : max), max - k > 0 ? max - k : 0);
  for (int i = 0; i < n->list2.n; i++) k += report_holes(n->list2.items[i], out + (k < max ? k : max), max - k > 0 ? max - k : 0);
  return k;
}
