/* search.c - weft search: plans searched for a file's model on a cluster,
 * the chosen one written as a .plan that imports the file (with the
 * frontier of step time against memory as comments), or all as JSON. */
#include <limits.h>
#include <sys/stat.h>

#include <time.h>

#include "common.h"
#include "weft/script.h"
#include "weft/search.h"

/* The text of a source span. */
static const char *span_text(weft_ctx *c, weft_loc l) {
  if (l.line == 0 || l.file < 0 || l.file >= c->srcs.n) return NULL;
  const weft_src *s = &c->srcs.items[l.file];
  if (l.end_line != l.line) return NULL;
  int len;
  const char *line = src_line(s, l.line, &len);
  if (!line || l.col < 1 || l.end_col > len) return NULL;
  return arena_strndup(&c->arena, line + l.col - 1, (size_t)(l.end_col - l.col + 1));
}

/* FILE as a path relative to the directory that will hold the plan. */
static const char *relative_to(weft_ctx *c, const char *file, const char *out) {
  char af[PATH_MAX], ad[PATH_MAX];
  if (!realpath(file, af)) return file;
  const char *dir = ".";
  if (out) {
    char *d = arena_strdup(&c->arena, out);
    char *slash = strrchr(d, '/');
    if (slash) *slash = 0, dir = d;
  }
  if (!realpath(dir, ad)) return file;
  /* the common prefix, by whole components */
  size_t i = 0, last = 0;
  while (af[i] && ad[i] && af[i] == ad[i]) {
    if (af[i] == '/') last = i;
    i++;
  }
  if (ad[i] == 0 && af[i] == '/') last = i;
  const char *rest = af + last + 1;
  int ups = 0;
  for (const char *p = ad + last; *p; p++) ups += *p == '/';
  if (ad[last] == '/' && ad[last + 1] == 0) ups = 0;
  const char *r = "";
  for (int k = 0; k < ups; k++) r = arena_printf(&c->arena, "%s../", r);
  return arena_printf(&c->arena, "%s%s", r, rest);
}

/* A plan written to -o imports FILE through `use`: when FILE is not under
 * the plan's directory, `weft check` of the plan needs --allow-path, and
 * says so here rather than later. */
static void note_outside(const weft_opts *o, const char *use) {
  if (strncmp(use, "../", 3) != 0 && use[0] != '/') return;
  char *dir = realpath(o->files[0], NULL);
  char *slash = dir ? strrchr(dir, '/') : NULL;
  if (slash) *slash = 0;
  fprintf(stderr, "weft search: note: %s imports %s from outside its directory: weft reads it with --allow-path %s\n",
          o->output, use, dir && *dir ? dir : "/");
  free(dir);
}

/* How the plan names the model: its declaration with the arguments bound
 * to it (so that --set is kept), or the file's name for it. */
static const char *model_expr(weft_ctx *c, const char *item, value m) {
  const vdecl *d = m.decl;
  if (!d->bound || d->bound->n == 0) return item;
  const char *t = arena_printf(&c->arena, "%s(", d->node->name);
  for (int i = 0; i < d->bound->n; i++)
    t = arena_printf(&c->arena, "%s%s%s = %s", t, i ? ", " : "", d->bound->keys[i],
                     value_show(&c->arena, d->bound->vals[i]));
  return arena_printf(&c->arena, "%s)", t);
}

static const char *human_time(char *b, size_t n, double s) {
  unit_format(s, (unit_dim){0, 1, 0}, b, n);
  return b;
}

static void print_plan(FILE *out, const search_result *r, int pick, const weft_graph *g, const char *header,
                       const char *use, const char *model, const char *cluster, const char *name, arena *a) {
  char b1[64], b2[64];
  fputs(header, out);
  fprintf(out, "# the frontier of %s against peak memory per device (--pick N writes plan N):\n",
          r->ranked ? "the heuristics' rank" : "step time");
  for (int i = 0; i < r->nplans; i++) {
    const search_plan *p = &r->plans[i];
    fprintf(out, "#   %d: %s, %s: %s%s\n", i, human_time(b1, sizeof b1, p->step_time),
            unit_bytes_human(p->peak_memory, b2, sizeof b2), search_describe(a, p),
            i == pick ? "  <- this plan" : "");
  }
  /* a policy's plan is named after its script */
  if (r->plans[pick].decisions.name) name = r->plans[pick].decisions.name;
  fprintf(out, "\nuse \"%s\"\n\nplan %s for %s on %s {\n", use, name, model, cluster);
  search_print_body(&r->plans[pick], g, out);
  fputs("}\n", out);
}

typedef struct progress_ctx {
  bool on;
  bool drew;
} progress_ctx;

static void on_progress(void *ctx, const search_progress *p) {
  progress_ctx *pc = ctx;
  if (!pc->on) return;
  char b[64] = "-";
  if (p->best_time > 0) human_time(b, sizeof b, p->best_time);
  fputc('\r', stderr);
  fprintf(stderr, "weft search: %s: %lld candidates, %lld pruned, best %s, %.1f s   ", p->phase,
          (long long)p->searched, (long long)p->pruned, b, p->elapsed);
  pc->drew = true;
}

/* How well the analytic cost ordered the candidates the simulator timed:
 * the fraction of pairs it put in the same order, and its median and
 * largest relative error. */
typedef struct agreement {
  double pairs, median, worst;
} agreement;

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

static agreement agree(const search_result *r) {
  agreement g = {1, 0, 0};
  int n = r->nsimulated, same = 0, pairs = 0;
  if (n == 0) return g;
  double *err = malloc(sizeof(double) * (size_t)n);
  if (!err) weft_oom();
  for (int i = 0; i < n; i++) {
    const search_plan *a = &r->simulated[i];
    err[i] = a->step_time > 0 ? fabs(a->analytic_time / a->step_time - 1) : 0;
    for (int k = i + 1; k < n; k++) {
      const search_plan *b = &r->simulated[k];
      double x = (a->analytic_time - b->analytic_time) * (a->step_time - b->step_time);
      if (a->step_time == b->step_time) continue;
      pairs++;
      same += x > 0;
    }
  }
  qsort(err, (size_t)n, sizeof *err, cmp_double);
  g.pairs = pairs ? (double)same / pairs : 1;
  g.median = err[n / 2];
  g.worst = err[n - 1];
  free(err);
  return g;
}

static const char *recompute_name(int r) { return r == 2 ? "full" : r == 1 ? "selective" : "none"; }

/* "simulated": every candidate the simulator timed, with its analytic figures */
static void json_simulated(json *j, weft_ctx *c, const search_result *r) {
  json_key(j, "simulated");
  json_arr(j);
  for (int i = 0; i < r->nsimulated; i++) {
    const search_plan *p = &r->simulated[i];
    json_obj(j);
    json_key(j, "plan"), json_str(j, search_describe(&c->arena, p));
    json_key(j, "step_time_s"), json_num(j, p->step_time);
    json_key(j, "analytic_time_s"), json_num(j, p->analytic_time);
    json_key(j, "peak_memory_bytes"), json_int(j, p->peak_memory);
    json_key(j, "analytic_memory_bytes"), json_int(j, p->analytic_memory);
    json_key(j, "fits"), json_bool(j, p->fits);
    json_end_obj(j);
  }
  json_end_arr(j);
}

static void json_plan(json *j, const search_plan *p, const weft_graph *g, const char *source) {
  json_obj(j);
  json_key(j, "step_time_s"), json_num(j, p->step_time);
  json_key(j, "peak_memory_bytes"), json_int(j, p->peak_memory);
  json_key(j, "fits"), json_bool(j, p->fits);
  json_key(j, "analytic_time_s"), json_num(j, p->analytic_time);
  json_key(j, "analytic_memory_bytes"), json_int(j, p->analytic_memory);
  json_key(j, "tp"), json_int(j, p->tp);
  json_key(j, "pp"), json_int(j, p->pp);
  json_key(j, "dp"), json_int(j, p->dp);
  json_key(j, "cp"), json_int(j, p->cp);
  json_key(j, "ep"), json_int(j, p->ep > 1 ? p->ep : 1);
  json_key(j, "micro_batches"), json_int(j, p->micro_batches);
  json_key(j, "micro_batch_size"), json_int(j, p->micro_batch_size);
  json_key(j, "schedule"), json_str(j, sched_kind_names[p->schedule]);
  json_key(j, "interleave"), json_int(j, p->interleave);
  json_key(j, "recompute"), json_str(j, recompute_name(p->recompute));
  json_key(j, "zero"), json_int(j, p->zero);
  json_key(j, "sequence_parallel"), json_bool(j, p->sequence_parallel);
  json_key(j, "uniform"), json_bool(j, !p->nonuniform);
  json_key(j, "bucket_bytes"), json_int(j, p->bucket_bytes);
  json_key(j, "rank"), json_num(j, p->rank);
  json_key(j, "stages");
  json_arr(j);
  for (int k = 0; k < p->nstages; k++) {
    const search_stage *st = &p->stages[k];
    json_obj(j);
    json_key(j, "ops");
    json_arr(j);
    json_str(j, g->ops[st->first_op].name);
    json_str(j, g->ops[st->last_op].name);
    json_end_arr(j);
    json_key(j, "layers"), json_int(j, st->layers);
    json_key(j, "position"), json_int(j, st->position);
    json_key(j, "recompute"), json_str(j, recompute_name(st->recompute));
    if (p->nonuniform) {
      json_key(j, "devices"), json_int(j, st->tp * st->dp);
      json_key(j, "tp"), json_int(j, st->tp);
      json_key(j, "dp"), json_int(j, st->dp);
      json_key(j, "micro_batch_size"), json_int(j, st->micro_batch_size);
    } else {
      json_key(j, "devices"), json_int(j, p->tp * p->cp * (p->ep > 1 ? p->ep : 1) * p->dp);
      json_key(j, "tp"), json_int(j, p->tp);
      json_key(j, "dp"), json_int(j, p->dp);
      json_key(j, "micro_batch_size"), json_int(j, p->micro_batch_size);
    }
    json_end_obj(j);
  }
  json_end_arr(j);
  json_key(j, "source"), json_str(j, source);
  json_end_obj(j);
}


/* What --json says of a search beside its plans: the simulations, the
 * analytic cost's agreement with them (null for the policies' plans, which
 * have none), the plan picked, the counts and times, the heuristics. */
static void json_summary(json *j, weft_ctx *c, const weft_opts *o, const search_result *r, agreement ag,
                         bool policies, int pick) {
  json_simulated(j, c, r);
  json_key(j, "analytic");
  if (policies) json_null(j);
  else {
    json_obj(j);
    json_key(j, "pairs_ordered_alike"), json_num(j, ag.pairs);
    json_key(j, "median_relative_error"), json_num(j, ag.median);
    json_key(j, "max_relative_error"), json_num(j, ag.worst);
    json_end_obj(j);
  }
  json_key(j, "best"), json_int(j, pick);
  json_key(j, "searched"), json_int(j, r->searched);
  json_key(j, "pruned"), json_int(j, r->pruned);
  json_key(j, "search_s"), json_num(j, r->search_s);
  json_key(j, "simulate_s"), json_num(j, r->simulate_s);
  json_key(j, "layers"), json_int(j, r->layers);
  json_key(j, "heuristics");
  json_arr(j);
  for (int i = 0; i < o->nheuristics; i++) json_str(j, o->heuristics[i]);
  json_end_arr(j);
  json_key(j, "ranked"), json_bool(j, r->ranked);
  json_key(j, "policies"), json_bool(j, policies);
}

/* ---- plans with open decisions ------------------------------------------------ */

/* A span of source as text (several lines). */
static char *source_span(weft_ctx *c, weft_loc l, size_t *start) {
  const weft_src *s = &c->srcs.items[l.file];
  size_t a = (size_t)s->line_starts[l.line - 1] + (size_t)l.col - 1;
  size_t b = (size_t)s->line_starts[l.end_line - 1] + (size_t)l.end_col;
  if (b > s->len) b = s->len;
  *start = a;
  return arena_strndup(&c->arena, s->text + a, b - a);
}

/* The numbers an open decision may take: the divisors of the devices and
 * of the batch, the counts plans are made of. */
static int fill_domain(int64_t devices, int64_t batch, int64_t *out, int max) {
  int n = 0;
  for (int64_t v = 1; v <= (devices > batch ? devices : batch) && n < max; v++)
    if ((devices % v == 0) || (batch % v == 0)) out[n++] = v;
  return n;
}

typedef struct filled {
  int64_t values[16];
  double time;
  int64_t peak;
  bool fits;
} filled;

static int by_filled_time(const void *x, const void *y) {
  const filled *a = x, *b = y;
  return a->time < b->time ? -1 : a->time > b->time;
}

/* What weft search changes in a plan's source: its holes filled by
 * values, its `on` replaced by --cluster's text, its `search` statement
 * replaced by statements. */
typedef struct plan_rewrite {
  const weft_loc *holes;
  int nh;
  const int64_t *values;
  const char *cluster;    /* in place of the plan's `on` expression, or NULL */
  weft_loc at;            /* a span replaced by text (at.line 0: none) */
  const char *text;
} plan_rewrite;

typedef struct text_edit {
  size_t a, b;            /* the bytes [a, b) of the plan's source */
  const char *text;
} text_edit;

static int by_edit_start(const void *x, const void *y) {
  const text_edit *p = x, *q = y;
  return p->a < q->a ? -1 : p->a > q->a;
}

/* The plan's source as rw changes it. */
static char *plan_text(weft_ctx *c, const weft_item *plan, const plan_rewrite *rw) {
  size_t start;
  const ast *pn = plan->val.decl->node;
  char *text = source_span(c, pn->loc, &start);
  const weft_src *s = &c->srcs.items[pn->loc.file];
  text_edit *e = arena_alloc(&c->arena, sizeof *e * (size_t)(rw->nh + 2));
  int n = 0;
  /* a hole is the one character `?` */
  for (int h = 0; h < rw->nh; h++) {
    size_t at = (size_t)s->line_starts[rw->holes[h].line - 1] + (size_t)rw->holes[h].col - 1 - start;
    e[n++] = (text_edit){at, at + 1, arena_printf(&c->arena, "%lld", (long long)rw->values[h])};
  }
  const weft_loc spans[2] = {rw->cluster ? pn->b->loc : (weft_loc){0}, rw->at};
  const char *texts[2] = {rw->cluster, rw->text};
  for (int k = 0; k < 2; k++) {
    weft_loc l = spans[k];
    if (l.line == 0) continue;
    e[n++] = (text_edit){(size_t)s->line_starts[l.line - 1] + (size_t)l.col - 1 - start,
                         (size_t)s->line_starts[l.end_line - 1] + (size_t)l.end_col - start, texts[k]};
  }
  qsort(e, (size_t)n, sizeof *e, by_edit_start);
  /* from the last edit back, so that earlier offsets stay */
  for (int k = n - 1; k >= 0; k--) {
    text[e[k].a] = 0;
    text = arena_printf(&c->arena, "%s%s%s", text, e[k].text, text + e[k].b);
  }
  return text;
}

/* The plan with its holes filled by values, as source. */
static char *fill_text(weft_ctx *c, const weft_opts *o, const weft_item *plan, const weft_loc *holes, int nh,
                       const int64_t *values) {
  return plan_text(c, plan, &(plan_rewrite){holes, nh, values, o->cluster, {0}, NULL});
}

/* The values the open decisions of a plan may take (the divisors of its
 * cluster's devices and of its model's batch) in dom; their count, 0 after
 * an error. */
static int plan_domain(weft_ctx *c, const weft_opts *o, const weft_item *plan, int nh, int64_t *dom, int max) {
  weft_loc none = {0};
  const ast *pn = plan->val.decl->node;
  const char *mtext = span_text(c, pn->a->loc), *ctext = span_text(c, pn->b->loc);
  value mv = mtext ? weft_eval_text(c, "the plan's model", mtext) : v_error();
  value cv = c->cluster_plan == plan->val.decl ? c->cluster_value
             : ctext                           ? weft_eval_text(c, "the plan's cluster", ctext)
                                               : v_error();
  weft_graph *g = mv.kind == V_MODEL ? weft_build_graph(c, mv, none) : NULL;
  value cr = cv.kind == V_CLUSTER ? weft_build_cluster(c, cv, none) : v_error();
  if (!g || cr.kind != V_RECORD) {
    weft_diag *d = report_error(c, pn->loc, "plan %s: its model and cluster must not depend on its open decisions",
                                plan->name);
    diag_hint(d, &c->diags, "weft search fills the numbers of the plan's body");
    return 0;
  }
  weft_cluster cl = weft_cluster_of(cr.rec);
  int64_t batch = 1;
  for (int t = 0; t < g->ntensors; t++)
    if (g->tensors[t].role == TENSOR_INPUT && g->tensors[t].ndims > 0) {
      batch = g->tensors[t].dims[0].size;
      break;
    }
  int nd = fill_domain(cl.ndevices, batch, dom, max);
  double combos = pow(nd, nh);
  if (nh > 16 || combos > 20000) {
    weft_diag *d = report_error(c, pn->loc, "plan %s has %d open decisions of %d values each: %.0f fillings are too many "
                                "to try", plan->name, nh, nd, combos);
    diag_hint(d, &c->diags, "write some of them, or leave the plan's numbers to weft search without a plan");
    return 0;
  }
  return nd;
}

/* One filling of a plan's holes tried quietly: its evaluation's errors
 * rule the filling out, not the user's, and what it allocates is
 * forgotten after it. */
typedef struct trial {
  arena_mark mark;
  weft_diags saved;
  int nbuilt;
  int64_t steps;
} trial;

static trial trial_begin(weft_ctx *c, const weft_fill *fills, int nh) {
  trial t = {arena_here(&c->arena), c->diags, c->nbuilt, c->steps};
  c->diags = (weft_diags){.arena = &c->arena, .srcs = &c->srcs, .max_errors = 1};
  c->fills = fills;
  c->nfills = nh;
  return t;
}

static void trial_end(weft_ctx *c, const trial *t) {
  c->fills = NULL;
  c->nfills = 0;
  c->steps = t->steps;
  c->nbuilt = t->nbuilt;
  c->diags = t->saved;
  arena_rewind(&c->arena, t->mark);
}

/* The next filling of nh holes of nd values each, as indices in idx. */
static void next_filling(int *idx, int nh, int nd) {
  for (int h = nh - 1; h >= 0; h--) {
    if (++idx[h] < nd) break;
    idx[h] = 0;
  }
}

static int search_holes(weft_ctx *c, const weft_opts *o, const weft_item *plan, weft_loc *holes, int nh) {
  weft_loc none = {0};
  const ast *pn = plan->val.decl->node;
  int64_t dom[64];
  int nd = plan_domain(c, o, plan, nh, dom, 64);
  if (nd == 0) {
    report_diags(c, o);
    return WEFT_REJECTED;
  }
  double combos = pow(nd, nh);
  double t0 = clock() / (double)CLOCKS_PER_SEC;
  filled *tried = calloc((size_t)combos + 1, sizeof *tried);
  if (!tried) weft_oom();
  int ntried = 0, total = (int)combos, built = 0;
  int idx[16] = {0};
  progress_ctx pc = {.on = o->progress > 0 || (o->progress < 0 && !o->json && isatty(2))};
  for (int k = 0; k < total; k++) {
    weft_fill fills[16];
    for (int h = 0; h < nh; h++) fills[h] = (weft_fill){holes[h], dom[idx[h]]};
    trial tr = trial_begin(c, fills, nh);
    weft_plan *p = weft_build_plan(c, plan->val, plan->loc, &(plan_opts){.reps = true});
    weft_program *pr = p ? lower_plan(p, NULL, &c->arena, &c->diags) : NULL;
    if (pr && !validate_program(pr, &(validate_opts){.skip_memory = true}, &c->diags)) pr = NULL;
    hw_model hw;
    if (pr && (o->symbolic || hw_from_plan(NULL, p, pr, &hw))) {
      weft_sim *sim = sim_run_with(pr, o->symbolic ? NULL : &hw, 0);
      if (sim) {
        weft_estimate e;
        sim_estimate(sim, &e);
        filled *f = &tried[ntried++];
        for (int h = 0; h < nh; h++) f->values[h] = dom[idx[h]];
        f->time = o->symbolic ? (double)e.peak_max : e.step_time;
        f->peak = e.peak_max;
        double cap = 0;
        if (o->max_memory) {
          value v = weft_eval_text(c, "--max-memory", o->max_memory);
          if (v.kind == V_QUANTITY) cap = v.q.v;
        }
        if (cap <= 0) cap = (double)e.device_memory;
        f->fits = cap <= 0 || (double)e.peak_max <= cap;
        built++;
        sim_free(sim);
      }
    }
    trial_end(c, &tr);
    next_filling(idx, nh, nd);
    if (pc.on && (k % 16 == 0 || k == total - 1)) {
      search_progress pg = {k + 1, k + 1 - built, 0, clock() / (double)CLOCKS_PER_SEC - t0, "fill"};
      on_progress(&pc, &pg);
    }
  }
  if (pc.drew) fputs("\n", stderr);
  qsort(tried, (size_t)ntried, sizeof *tried, by_filled_time);
  /* the frontier of what fits */
  filled *front = calloc((size_t)ntried + 1, sizeof *front);
  if (!front) weft_oom();
  int nf = 0, best = -1;
  int64_t least = -1;
  for (int i = 0; i < ntried; i++) {
    if (!tried[i].fits || (least >= 0 && tried[i].peak >= least)) continue;
    least = tried[i].peak;
    front[nf++] = tried[i];
  }
  best = nf ? 0 : -1;
  if (o->objective == SEARCH_MEMORY)
    for (int i = 0; i < nf; i++)
      if (front[i].peak < front[best].peak) best = i;
  if (o->pick >= 0) best = o->pick < nf ? o->pick : -2;
  int rc = WEFT_OK;
  if (best == -2) {
    report_error(c, none, "--pick %d: the frontier has plans 0 to %d", o->pick, nf - 1);
    rc = WEFT_REJECTED;
  } else if (best < 0) {
    weft_diag *d = report_error(c, pn->loc, "no filling of the %d open decisions of plan %s gives a plan that builds and "
                                "fits (%d tried, %d built)", nh, plan->name, total, built);
    diag_hint(d, &c->diags, "weft check with numbers in place of ? says why one does not");
    rc = WEFT_REJECTED;
  }
  report_diags(c, o);
  if (rc == WEFT_OK) {
    const char *use = relative_to(c, o->files[0], o->output);
    char b1[64], b2[64];
    char *hdr = NULL;
    size_t hlen = 0;
    FILE *h = open_memstream(&hdr, &hlen);
    fprintf(h, "# filled by: weft search %s --plan %s\n# %d fillings of %d open decisions tried, %d built\n", o->files[0],
            plan->name, total, nh, built);
    fprintf(h, "# the frontier of step time against peak memory per device (--pick N writes plan N):\n");
    for (int i = 0; i < nf; i++) {
      fprintf(h, "#   %d: %s, %s:", i, human_time(b1, sizeof b1, front[i].time),
              unit_bytes_human(front[i].peak, b2, sizeof b2));
      for (int k = 0; k < nh; k++) fprintf(h, "%s %d:%d = %lld", k ? "," : "", holes[k].line, holes[k].col,
                                           (long long)front[i].values[k]);
      fprintf(h, "%s\n", i == best ? "  <- this plan" : "");
    }
    fclose(h);
    if (o->json) {
      json j;
      json_init(&j, stdout);
      json_obj(&j);
      json_key(&j, "plans");
      json_arr(&j);
      for (int i = 0; i < nf; i++) {
        json_obj(&j);
        json_key(&j, "step_time_s"), json_num(&j, front[i].time);
        json_key(&j, "peak_memory_bytes"), json_int(&j, front[i].peak);
        json_key(&j, "fits"), json_bool(&j, front[i].fits);
        json_key(&j, "fills");
        json_arr(&j);
        for (int k = 0; k < nh; k++) {
          json_obj(&j);
          json_key(&j, "line"), json_int(&j, holes[k].line);
          json_key(&j, "col"), json_int(&j, holes[k].col);
          json_key(&j, "value"), json_int(&j, front[i].values[k]);
          json_end_obj(&j);
        }
        json_end_arr(&j);
        json_key(&j, "source"),
            json_str(&j, arena_printf(&c->arena, "use \"%s\"\n\n%s\n", use, fill_text(c, o, plan, holes, nh, front[i].values)));
        json_end_obj(&j);
      }
      json_end_arr(&j);
      json_key(&j, "best"), json_int(&j, best);
      json_key(&j, "searched"), json_int(&j, total);
      json_key(&j, "pruned"), json_int(&j, total - built);
      json_end_obj(&j);
      printf("\n");
    }
    if (o->output || !o->json) {
      char err[PATH_MAX + 256];
      file_out *out = o->output ? file_out_open(o->output, err, sizeof err) : NULL;
      FILE *f = out ? file_out_stream(out) : stdout;
      if (o->output && !out) {
        fprintf(stderr, "weft search: %s\n", err);
        rc = WEFT_FAILED;
      } else {
        fprintf(f, "%s\nuse \"%s\"\n\n%s\n", hdr, use, fill_text(c, o, plan, holes, nh, front[best].values));
        if (out && !file_out_commit(out, err, sizeof err)) {
          fprintf(stderr, "weft search: %s\n", err);
          rc = WEFT_FAILED;
        } else if (o->output && !o->json) {
          fprintf(stderr, "weft search: wrote %s: %s, %s per device\n", o->output,
                  human_time(b1, sizeof b1, front[best].time), unit_bytes_human(front[best].peak, b2, sizeof b2));
        }
        if (out) note_outside(o, use);
      }
    }
    free(hdr);
  }
  free(tried);
  free(front);
  return rc;
}

/* ---- plans with a `search` statement ------------------------------------------- */

/* The open decisions of a plan with `search` as the search filled them. */
typedef struct hole_fill {
  const weft_loc *holes;
  int nh;
  const int64_t *values;
  int tried, planned;     /* fillings tried, and those the search found plans for */
} hole_fill;

/* The plan's source with its `search` statement replaced by the statements
 * candidate sp adds, at the statement's indentation, its holes filled and
 * its `on` as --cluster says; the rest as written, comments and all. */
static const char *with_searched(weft_ctx *c, const weft_opts *o, const weft_item *plan, weft_loc at,
                                 const search_plan *sp, const weft_graph *g, const hole_fill *hf) {
  const weft_src *src = &c->srcs.items[at.file];
  /* the indentation of the statement's line */
  const char *line = src->text + src->line_starts[at.line - 1];
  int indent = 0;
  while (indent < at.col - 1 && (line[indent] == ' ' || line[indent] == '\t')) indent++;
  if (indent < at.col - 1) indent = 2;  /* `search` after another statement on its line */
  char *body = NULL;
  size_t blen = 0;
  FILE *m = open_memstream(&body, &blen);
  search_print_body(sp, g, m);
  fclose(m);
  /* each line "  stmt\n": the first in the statement's place, the others
   * at its indentation */
  const char *t = "";
  int k = 0;
  for (char *l = body; l && *l; k++) {
    char *nl = strchr(l, '\n');
    if (nl) *nl = 0;
    const char *stmt = l;
    while (*stmt == ' ') stmt++;
    t = arena_printf(&c->arena, "%s%s%*s%s", t, k ? "\n" : "", k ? indent : 0, "", stmt);
    l = nl ? nl + 1 : NULL;
  }
  free(body);
  return plan_text(c, plan, &(plan_rewrite){hf ? hf->holes : NULL, hf ? hf->nh : 0, hf ? hf->values : NULL,
                                            o->cluster, at, t});
}

/* --lua-memory's bytes in *bytes (0: the default); false after an error. */
static bool lua_memory_of(weft_ctx *c, const weft_opts *o, int64_t *bytes) {
  *bytes = 0;
  if (!o->lua_memory) return true;
  weft_loc none = {0};
  value v = weft_eval_text(c, "--lua-memory", o->lua_memory);
  if (v.kind != V_QUANTITY || !unit_eq(v.q.d, UNIT_BYTES) || v.q.v < (1 << 20) || v.q.v > 1e12) {
    if (v.kind != V_ERROR)
      report_error(c, none, "--lua-memory needs bytes from 1 MiB to 1 TB, such as '64 MiB', got %s", o->lua_memory);
    return false;
  }
  *bytes = (int64_t)v.q.v;
  return true;
}

/* The search's options from the command line's; false after an error. */
static bool stmt_opts(weft_ctx *c, const weft_opts *o, search_opts *so) {
  weft_loc none = {0};
  *so = (search_opts){.objective = o->objective, .top = o->top, .symbolic = o->symbolic, .time_limit = o->time_limit,
                      .buckets = !o->no_buckets};
  if (!o->max_memory) return true;
  value v = weft_eval_text(c, "--max-memory", o->max_memory);
  if (v.kind != V_QUANTITY || !unit_eq(v.q.d, UNIT_BYTES) || v.q.v <= 0) {
    if (v.kind != V_ERROR) report_error(c, none, "--max-memory needs bytes, such as '40 GiB', got %s", o->max_memory);
    return false;
  }
  so->max_memory = v.q.v;
  return true;
}

/* A plan with `search` (and its holes filled as hf says, or none): the
 * search around what it writes, the plan written with the search's
 * statements in place of `search`. */
static int search_statement(weft_ctx *c, const weft_opts *o, const weft_item *plan, const ast *st,
                            const hole_fill *hf) {
  weft_loc none = {0};
  search_opts so;
  int rc = stmt_opts(c, o, &so) ? WEFT_OK : WEFT_REJECTED;
  weft_plan_src src;
  search_fixed fx;
  if (rc == WEFT_OK) {
    if (!weft_eval_plan(c, plan->val, plan->loc, &src)) rc = WEFT_REJECTED;
    /* no written `assign` stands beside `search`: the placer is done */
    if (src.decisions.placer.done) src.decisions.placer.done(src.decisions.placer.ctx);
  }
  if (rc == WEFT_OK && src.search_at < 0) {
    /* a `search` that evaluation did not reach (an `if` not taken) */
    weft_diag *d = report_error(c, st->loc, "plan %s does not reach this `search` when it is evaluated", plan->name);
    diag_hint(d, &c->diags, "write `search` directly in the plan's body");
    rc = WEFT_REJECTED;
  }
  if (rc == WEFT_OK && !search_fixed_read(&src.decisions, src.search_at, src.graph, &src.cluster, &c->diags, &fx)) rc = WEFT_REJECTED;
  so.fixed = &fx;
  /* heuristics steer what is left open with their hooks (space, prune,
   * rank); a policy writes a whole plan, which would not keep the written
   * decisions */
  weft_scripts *scripts = NULL;
  search_hooks hooks;
  int64_t lua_memory = 0;
  if (rc == WEFT_OK && o->nheuristics && !lua_memory_of(c, o, &lua_memory)) rc = WEFT_REJECTED;
  if (rc == WEFT_OK && o->nheuristics) {
    script_world w = {src.graph, &src.cluster, o->symbolic, so.max_memory, c->stdlib_dir, &c->srcs, &c->diags,
                      &c->arena, o->lua_steps, lua_memory};
    scripts = scripts_new(&w);
    for (int i = 0; i < o->nheuristics && rc == WEFT_OK; i++) {
      if (!scripts_load(scripts, o->heuristics[i])) rc = WEFT_REJECTED;
      else if (scripts_has_policy(scripts)) {
        weft_diag *d = report_error(c, st->loc, "--heuristic %s writes whole plans (a policy), and plan %s writes "
                                    "decisions of its own beside `search`", o->heuristics[i], plan->name);
        diag_hint(d, &c->diags, "search the model with --model and that heuristic, or one that steers the search "
                  "(space, prune, rank)");
        rc = WEFT_REJECTED;
      }
    }
    if (rc == WEFT_OK) {
      hooks = scripts_hooks(scripts);
      so.hooks = &hooks;
    }
  }
  search_result r;
  progress_ctx pc = {.on = o->progress > 0 || (o->progress < 0 && !o->json && isatty(2))};
  so.progress = on_progress;
  so.ctx = &pc;
  if (rc == WEFT_OK && !search_run(src.graph, &src.cluster, &so, &c->arena, &c->diags, &r)) rc = WEFT_REJECTED;
  scripts_free(scripts);
  if (pc.drew) fputs("\n", stderr);
  int pick = rc == WEFT_OK ? (o->pick >= 0 ? o->pick : r.best) : -1;
  if (rc == WEFT_OK && o->pick >= r.nplans) {
    report_error(c, none, "--pick %d: the frontier has plans 0 to %d", o->pick, r.nplans - 1);
    rc = WEFT_REJECTED;
  }
  report_diags(c, o);
  if (rc != WEFT_OK) {
    if (o->json) {
      diag_print_json(&c->diags, stdout);
      printf("\n");
    }
    return rc;
  }
  const weft_graph *g = src.graph;
  const char *use = relative_to(c, o->files[0], o->output);
  agreement ag = agree(&r);
  char b1[64], b2[64];
  char *hdr = NULL;
  size_t hlen = 0;
  FILE *h = open_memstream(&hdr, &hlen);
  fprintf(h, "# searched by: weft search %s --plan %s%s", o->files[0], plan->name, o->nsets ? " (with --set)" : "");
  for (int i = 0; i < o->nheuristics; i++) fprintf(h, " --heuristic %s", o->heuristics[i]);
  if (o->cluster) fprintf(h, " --cluster '%s'", o->cluster);
  fprintf(h, "\n");
  if (hf) {
    fprintf(h, "# its %d open decision%s filled:", hf->nh, hf->nh == 1 ? "" : "s");
    for (int k = 0; k < hf->nh; k++)
      fprintf(h, "%s %d:%d = %lld", k ? "," : "", hf->holes[k].line, hf->holes[k].col, (long long)hf->values[k]);
    fprintf(h, " (the best of %d fillings tried, %d with plans)\n", hf->tried, hf->planned);
  }
  fprintf(h, "# plan %s writes %s; the search wrote the rest in place of `search`\n", plan->name,
          search_fixed_kept(&c->arena, &fx));
  fprintf(h, "# %lld candidates (%lld pruned) in %.2f s; %d simulated in %.2f s%s\n", (long long)r.searched,
          (long long)r.pruned, r.search_s, r.nsimulated, r.simulate_s,
          r.layers ? arena_printf(&c->arena, "; %d repeated blocks %s.N, searched once", r.layers, r.block) : "");
  fprintf(h, "# the analytic cost put %.0f%% of the simulated pairs in the simulator's order (median error %.1f%%)\n",
          100 * ag.pairs, 100 * ag.median);
  if (o->symbolic) fprintf(h, "# --cost symbolic: times are on the nominal device of docs/search.md, not the cluster's\n");
  fprintf(h, "# the frontier of step time against peak memory per device (--pick N writes plan N):\n");
  for (int i = 0; i < r.nplans; i++) {
    const search_plan *p = &r.plans[i];
    fprintf(h, "#   %d: %s, %s: %s%s\n", i, human_time(b1, sizeof b1, p->step_time),
            unit_bytes_human(p->peak_memory, b2, sizeof b2), search_describe(&c->arena, p),
            i == pick ? "  <- this plan" : "");
  }
  fclose(h);
  if (o->json) {
    json j;
    json_init(&j, stdout);
    json_obj(&j);
    json_key(&j, "plans");
    json_arr(&j);
    for (int i = 0; i < r.nplans; i++)
      json_plan(&j, &r.plans[i], g,
                arena_printf(&c->arena, "%s\nuse \"%s\"\n\n%s\n", hdr, use,
                             with_searched(c, o, plan, src.search_loc, &r.plans[i], g, hf)));
    json_end_arr(&j);
    json_summary(&j, c, o, &r, ag, false, pick);
    json_key(&j, "written"), json_str(&j, search_fixed_kept(&c->arena, &fx));
    if (hf) {
      json_key(&j, "fills");
      json_arr(&j);
      for (int k = 0; k < hf->nh; k++) {
        json_obj(&j);
        json_key(&j, "line"), json_int(&j, hf->holes[k].line);
        json_key(&j, "col"), json_int(&j, hf->holes[k].col);
        json_key(&j, "value"), json_int(&j, hf->values[k]);
        json_end_obj(&j);
      }
      json_end_arr(&j);
      json_key(&j, "fillings_tried"), json_int(&j, hf->tried);
      json_key(&j, "fillings_planned"), json_int(&j, hf->planned);
    }
    json_end_obj(&j);
    printf("\n");
  }
  if (o->output || !o->json) {
    char err[PATH_MAX + 256];
    file_out *out = o->output ? file_out_open(o->output, err, sizeof err) : NULL;
    FILE *f = out ? file_out_stream(out) : stdout;
    if (o->output && !out) {
      fprintf(stderr, "weft search: %s\n", err);
      rc = WEFT_FAILED;
    } else {
      fprintf(f, "%s\nuse \"%s\"\n\n%s\n", hdr, use, with_searched(c, o, plan, src.search_loc, &r.plans[pick], g, hf));
      if (out && !file_out_commit(out, err, sizeof err)) {
        fprintf(stderr, "weft search: %s\n", err);
        rc = WEFT_FAILED;
      } else if (o->output) {
        note_outside(o, use);
        if (!o->json) {
          const search_plan *p = &r.plans[pick];
          fprintf(stderr, "weft search: wrote %s: %s, %s per device: %s\n", o->output,
                  human_time(b1, sizeof b1, p->step_time), unit_bytes_human(p->peak_memory, b2, sizeof b2),
                  search_describe(&c->arena, p));
        }
      }
    }
  }
  free(hdr);
  return rc;
}

/* A plan with `search` and open decisions: every filling of the holes
 * searched around what the plan writes (quietly: a filling that does not
 * evaluate, or leaves the search nothing, is ruled out), the best by the
 * objective searched again and written. */
static int search_statement_holes(weft_ctx *c, const weft_opts *o, const weft_item *plan, const ast *st,
                                  weft_loc *holes, int nh) {
  const ast *pn = plan->val.decl->node;
  int64_t dom[64];
  int nd = plan_domain(c, o, plan, nh, dom, 64);
  search_opts so;
  if (nd == 0 || !stmt_opts(c, o, &so)) {
    report_diags(c, o);
    return WEFT_REJECTED;
  }
  int total = (int)pow(nd, nh), evaluated = 0, planned = 0, idx[16] = {0};
  int64_t *best = arena_alloc(&c->arena, sizeof(int64_t) * (size_t)nh);
  double best_key = 0;
  bool best_fits = false, have = false;
  progress_ctx pc = {.on = o->progress > 0 || (o->progress < 0 && !o->json && isatty(2))};
  double t0 = clock() / (double)CLOCKS_PER_SEC;
  for (int k = 0; k < total; k++) {
    weft_fill fills[16];
    for (int h = 0; h < nh; h++) fills[h] = (weft_fill){holes[h], dom[idx[h]]};
    /* one evaluation and search per filling */
    trial tr = trial_begin(c, fills, nh);
    weft_plan_src src;
    search_fixed fx;
    bool ok = weft_eval_plan(c, plan->val, plan->loc, &src);
    if (src.decisions.placer.done) src.decisions.placer.done(src.decisions.placer.ctx);
    ok = ok && src.search_at >= 0 &&
         search_fixed_read(&src.decisions, src.search_at, src.graph, &src.cluster, &c->diags, &fx);
    search_result r;
    search_opts one = so;
    one.fixed = &fx;
    if (ok) evaluated++;
    if (ok && search_run(src.graph, &src.cluster, &one, &c->arena, &c->diags, &r) && r.best >= 0) {
      const search_plan *p = &r.plans[r.best];
      planned++;
      double key = o->objective == SEARCH_MEMORY ? (double)p->peak_memory : p->step_time;
      /* what fits first, then the objective */
      if (!have || (p->fits && !best_fits) || (p->fits == best_fits && key < best_key)) {
        have = true, best_fits = p->fits, best_key = key;
        for (int h = 0; h < nh; h++) best[h] = fills[h].value;
      }
    }
    trial_end(c, &tr);
    next_filling(idx, nh, nd);
    if (pc.on) {
      search_progress pg = {k + 1, k + 1 - planned, best_key, clock() / (double)CLOCKS_PER_SEC - t0, "fill"};
      if (o->objective == SEARCH_MEMORY) pg.best_time = 0;
      on_progress(&pc, &pg);
    }
  }
  if (pc.drew) fputs("\n", stderr);
  if (!have) {
    weft_diag *d = report_error(c, pn->loc, "no filling of the %d open decision%s of plan %s leaves the search a plan "
                                "(%d tried, %d evaluated)", nh, nh == 1 ? "" : "s", plan->name, total, evaluated);
    diag_hint(d, &c->diags, "weft search with numbers in place of ? says why one does not");
    report_diags(c, o);
    return WEFT_REJECTED;
  }
  /* the best filling, searched again to be written: its fills stay set */
  weft_fill *fills = arena_alloc(&c->arena, sizeof *fills * (size_t)nh);
  for (int h = 0; h < nh; h++) fills[h] = (weft_fill){holes[h], best[h]};
  c->fills = fills;
  c->nfills = nh;
  hole_fill hf = {holes, nh, best, total, planned};
  int rc = search_statement(c, o, plan, st, &hf);
  c->fills = NULL;
  c->nfills = 0;
  return rc;
}

int report_search(const weft_opts *o) {
  if (o->output && !report_output_ok(o, "-o", o->output, true)) return WEFT_FAILED;
  weft_ctx *c = report_ctx(o);
  int rc = c->diags.errors ? WEFT_REJECTED : weft_load(c, o->files[0]);
  if (rc == WEFT_OK && o->output && !report_output_not_source(c, "-o", o->output, true)) {
    weft_free(c);
    return WEFT_FAILED;
  }
  weft_loc none = {0};
  weft_item items[256];
  value model = v_none(), cluster = v_none();
  const char *model_name = NULL, *cluster_text = o->cluster;
  if (rc == WEFT_OK && !o->model) {
    /* a plan with open decisions (--plan NAME, else the last one) is filled */
    int n = weft_items(c, V_PLAN, items, 256);
    if (n > 256) n = 256;
    int pick = -1;
    for (int i = 0; i < n; i++)
      if (!o->plan || strcmp(items[i].name, o->plan) == 0) pick = i;
    if (o->plan && pick < 0) {
      report_error(c, none, "%s defines no plan '%s'", o->files[0], o->plan);
      report_diags(c, o);
      weft_free(c);
      return WEFT_REJECTED;
    }
    weft_loc holes[17];
    int nh = pick >= 0 ? report_holes(items[pick].val.decl->node, holes, 17) : 0;
    const ast *st = pick >= 0 ? report_search_stmt(items[pick].val.decl->node) : NULL;
    if ((nh > 0 || st) && o->cluster) {
      /* --cluster puts the plan on another cluster: its `on` is replaced */
      value cv = weft_eval_text(c, "--cluster", o->cluster);
      if (cv.kind != V_CLUSTER) {
        if (cv.kind != V_ERROR)
          report_error(c, none, "--cluster needs a cluster, such as 'a100_dgx(nodes = 8)', got %s",
                       value_kind_name(cv.kind));
        report_diags(c, o);
        weft_free(c);
        return WEFT_REJECTED;
      }
      c->cluster_plan = items[pick].val.decl;
      c->cluster_value = cv;
    }
    /* heuristics steer the search of a whole plan or of `search`, not the
     * filling of holes */
    if (o->nheuristics && (nh > 0 || (!st && o->plan))) {
      weft_diag *d = report_error(c, items[pick].loc, "--heuristic applies to the search of whole plans, not to filling the "
                                  "open decisions of plan %s", items[pick].name);
      diag_hint(d, &c->diags, "search without the plan's holes (--model), or fill them without --heuristic");
      report_diags(c, o);
      weft_free(c);
      return WEFT_REJECTED;
    }
    if (st) {
      /* everything the plan does not write is searched around what it
       * does, for every filling of its holes */
      int r = nh > 0 ? search_statement_holes(c, o, &items[pick], st, holes, nh)
                     : search_statement(c, o, &items[pick], st, NULL);
      weft_free(c);
      return r;
    }
    if (nh > 0 || o->plan) {
      int r = nh > 0 ? search_holes(c, o, &items[pick], holes, nh) : WEFT_OK;
      if (nh == 0) {
        weft_diag *d = report_error(c, items[pick].loc, "plan %s has no open decision (?) to fill", items[pick].name);
        diag_hint(d, &c->diags, "write ? where a number is to be searched, or search without --plan");
        report_diags(c, o);
        r = WEFT_REJECTED;
      }
      weft_free(c);
      return r;
    }
  }
  if (rc == WEFT_OK) {
    /* the model: --model, else the last one the file defines */
    int n = weft_items(c, V_MODEL, items, 256);
    if (n > 256) n = 256;
    for (int i = 0; i < n; i++)
      if (!o->model || strcmp(items[i].name, o->model) == 0) model = items[i].val, model_name = items[i].name;
    if (model.kind != V_MODEL) {
      const char *names[256];
      for (int i = 0; i < n; i++) names[i] = items[i].name;
      weft_diag *d = o->model ? report_error(c, none, "%s defines no model '%s'", o->files[0], o->model)
                              : report_error(c, none, "%s defines no model to search plans for", o->files[0]);
      const char *best = o->model ? diag_closest(o->model, names, n) : NULL;
      if (best) diag_hint(d, &c->diags, "did you mean '%s'?", best);
      rc = WEFT_REJECTED;
    }
  }
  if (rc == WEFT_OK && !cluster_text) {
    /* the cluster: of the file's last plan, else its last cluster */
    int n = weft_items(c, V_PLAN, items, 256);
    if (n > 0) cluster_text = span_text(c, items[(n < 256 ? n : 256) - 1].val.decl->node->b->loc);
    if (!cluster_text) {
      n = weft_items(c, V_CLUSTER, items, 256);
      if (n > 0) cluster_text = items[(n < 256 ? n : 256) - 1].name;
    }
    if (!cluster_text) {
      weft_diag *d = report_error(c, none, "%s has no plan or cluster to take the cluster from", o->files[0]);
      diag_hint(d, &c->diags, "name one: --cluster 'a100_dgx(nodes = 8)'");
      rc = WEFT_REJECTED;
    }
  }
  if (rc == WEFT_OK) {
    cluster = weft_eval_text(c, "--cluster", cluster_text);
    if (cluster.kind != V_ERROR && cluster.kind != V_CLUSTER) {
      report_error(c, none, "--cluster needs a cluster, such as 'a100_dgx(nodes = 8)', got %s",
                   value_kind_name(cluster.kind));
      rc = WEFT_REJECTED;
    } else if (cluster.kind == V_ERROR) {
      rc = WEFT_REJECTED;
    }
  }
  search_opts so = {.objective = o->objective, .top = o->top, .symbolic = o->symbolic, .time_limit = o->time_limit,
                    .buckets = !o->no_buckets};
  if (rc == WEFT_OK && o->max_memory) {
    value v = weft_eval_text(c, "--max-memory", o->max_memory);
    if (v.kind != V_QUANTITY || !unit_eq(v.q.d, UNIT_BYTES) || v.q.v <= 0) {
      if (v.kind != V_ERROR) report_error(c, none, "--max-memory needs bytes, such as '40 GiB', got %s", o->max_memory);
      rc = WEFT_REJECTED;
    } else {
      so.max_memory = v.q.v;
    }
  }
  int64_t lua_memory = 0;
  if (rc == WEFT_OK && !lua_memory_of(c, o, &lua_memory)) rc = WEFT_REJECTED;
  weft_graph *g = NULL;
  value cr = v_none();
  weft_cluster cl = {0};
  if (rc == WEFT_OK) {
    g = weft_build_graph(c, model, none);
    cr = weft_build_cluster(c, cluster, none);
    if (!g || cr.kind != V_RECORD) rc = WEFT_REJECTED;
    else cl = weft_cluster_of(cr.rec);
  }
  search_result r;
  progress_ctx pc = {.on = o->progress > 0 || (o->progress < 0 && !o->json && isatty(2))};
  so.progress = on_progress;
  so.ctx = &pc;
  /* the heuristics: policies write the plans, or hooks steer the search */
  weft_scripts *scripts = NULL;
  search_hooks hooks;
  bool policies = false;
  if (rc == WEFT_OK && o->nheuristics) {
    script_world w = {g, &cl, o->symbolic, so.max_memory, c->stdlib_dir, &c->srcs, &c->diags, &c->arena, o->lua_steps,
                      lua_memory};
    scripts = scripts_new(&w);
    for (int i = 0; i < o->nheuristics && rc == WEFT_OK; i++)
      if (!scripts_load(scripts, o->heuristics[i])) rc = WEFT_REJECTED;
    if (rc == WEFT_OK && !scripts_policies(scripts, &so, &r)) rc = WEFT_REJECTED;
    policies = rc == WEFT_OK && r.nsimulated > 0;
    hooks = scripts_hooks(scripts);
    so.hooks = &hooks;
  }
  if (rc == WEFT_OK && !policies && !search_run(g, &cl, &so, &c->arena, &c->diags, &r)) rc = WEFT_REJECTED;
  if (pc.drew) fputs("\n", stderr);
  int pick = rc == WEFT_OK ? (o->pick >= 0 ? o->pick : r.best) : -1;
  if (rc == WEFT_OK && o->pick >= r.nplans) {
    report_error(c, none, "--pick %d: the frontier has plans 0 to %d", o->pick, r.nplans - 1);
    report_diags(c, o);
    scripts_free(scripts);
    weft_free(c);
    return WEFT_REJECTED;
  }
  report_diags(c, o);
  scripts_free(scripts);
  if (rc != WEFT_OK) {
    if (o->json) {
      diag_print_json(&c->diags, stdout);
      printf("\n");
    }
    weft_free(c);
    return rc;
  }
  /* the plan file */
  const char *use = relative_to(c, o->files[0], o->output);
  const char *mexpr = model_expr(c, model_name, model);
  agreement ag = agree(&r);
  const char *heur = "";
  for (int i = 0; i < o->nheuristics; i++) heur = arena_printf(&c->arena, "%s --heuristic %s", heur, o->heuristics[i]);
  const char *header = arena_printf(&c->arena, "# searched by: weft search %s%s%s%s%s --cluster '%s'\n", o->files[0],
                                    o->model ? " --model " : "", o->model ? o->model : "", o->nsets ? " (with --set)" : "",
                                    heur, cluster_text);
  if (policies)
    header = arena_printf(&c->arena, "%s# %lld plan%s written by the heuristics' policies (%lld pruned), simulated in %.2f s\n",
                          header, (long long)r.searched, r.searched == 1 ? "" : "s", (long long)r.pruned, r.simulate_s);
  else
    header = arena_printf(&c->arena,
                          "%s# %lld candidates (%lld pruned) in %.2f s; %d simulated in %.2f s%s\n"
                          "# the analytic cost put %.0f%% of the simulated pairs in the simulator's order "
                          "(median error %.1f%%)\n",
                          header, (long long)r.searched, (long long)r.pruned, r.search_s, r.nsimulated, r.simulate_s,
                          r.layers ? arena_printf(&c->arena, "; %d repeated blocks %s.N, searched once", r.layers, r.block)
                                   : "",
                          100 * ag.pairs, 100 * ag.median);

  if (o->symbolic)
    header = arena_printf(&c->arena, "%s# --cost symbolic: times are on the nominal device of docs/search.md, not the cluster's\n",
                          header);
  if (o->json) {
    json j;
    json_init(&j, stdout);
    json_obj(&j);
    json_key(&j, "plans");
    json_arr(&j);
    for (int i = 0; i < r.nplans; i++) {
      char *buf = NULL;
      size_t len = 0;
      FILE *m = open_memstream(&buf, &len);
      print_plan(m, &r, i, g, header, use, mexpr, cluster_text, "searched", &c->arena);
      fclose(m);
      json_plan(&j, &r.plans[i], g, buf);
      free(buf);
    }
    json_end_arr(&j);
    json_summary(&j, c, o, &r, ag, policies, pick);
    json_end_obj(&j);
    printf("\n");
  }
  if (o->output || !o->json) {
    FILE *f = stdout;
    file_out *out = NULL;
    char err[PATH_MAX + 256];
    if (o->output) {
      out = file_out_open(o->output, err, sizeof err);
      if (!out) {
        fprintf(stderr, "weft search: %s\n", err);
        weft_free(c);
        return WEFT_FAILED;
      }
      f = file_out_stream(out);
    }
    print_plan(f, &r, pick, g, header, use, mexpr, cluster_text, "searched", &c->arena);
    if (o->output) {
      if (!file_out_commit(out, err, sizeof err)) {
        fprintf(stderr, "weft search: %s\n", err);
        weft_free(c);
        return WEFT_FAILED;
      }
      note_outside(o, use);
      if (!o->json) {
        char b1[64], b2[64];
        const search_plan *p = &r.plans[pick];
        fprintf(stderr, "weft search: wrote %s: %s, %s per device: %s\n", o->output,
                human_time(b1, sizeof b1, p->step_time), unit_bytes_human(p->peak_memory, b2, sizeof b2),
                search_describe(&c->arena, p));
      }
    }
  }
  weft_free(c);
  return rc;
}
