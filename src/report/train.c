/* train.c - weft run: a plan trained on a backend. The run layer every
 * backend shares: batches from token files, the learning-rate schedule,
 * clipping, evaluation, logs and checkpoints during the run; with --check
 * the same passes on one device and the two compared. */
#include <fnmatch.h>
#include <sys/stat.h>
#include <time.h>

#include "common.h"
#include "data.h"
#include "run_trace.h"
#include "schedule.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int run_fail(const char *what, const char *msg) {
  fprintf(stderr, "weft run: %s%s%s\n", what ? what : "", what ? ": " : "", msg);
  return WEFT_REJECTED;
}

/* ---- what a run records ------------------------------------------------------ */

/* One training step (or, with --steps 0, one evaluation). */
typedef struct record {
  int64_t step;
  double loss, lr, norm, time, val;   /* val: NaN when not measured */
  double setup;                       /* of time, the backend's one-time work */
} record;

typedef struct run_log {
  int n, cap;
  record *r;
} run_log;

static void log_add(run_log *l, record r) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 16;
    l->r = realloc(l->r, (size_t)l->cap * sizeof(record));
    if (!l->r) weft_oom();
  }
  l->r[l->n++] = r;
}

/* What the backend measured its devices' buffers at (backend_memory_fn). */
typedef struct mem_log {
  int ndev;
  bool *seen;             /* per device */
  int64_t *peak, *role;   /* per device; role: LB_ROLE_COUNT each */
} mem_log;

/* What the backend's calls report to (backend_opts.ctx). */
typedef struct run_obs {
  mem_log *mem;
  run_trace *trace;       /* NULL: no step traced */
  const weft_program *pr; /* the program run, to name its instructions */
} run_obs;

static void mem_on_memory(void *ctx, int device, int64_t peak, const int64_t *by_role) {
  mem_log *m = ((run_obs *)ctx)->mem;
  if (device < 0 || device >= m->ndev) return;
  m->seen[device] = true;
  m->peak[device] = peak;
  memcpy(&m->role[(size_t)device * LB_ROLE_COUNT], by_role, sizeof(int64_t) * LB_ROLE_COUNT);
}

static void obs_on_trace(void *ctx, int device, int ins, const char *lane, double start, double end) {
  run_obs *ob = ctx;
  if (ob->trace) run_trace_add(ob->trace, device, ins, lane, start, end);
}

static void obs_label(void *ctx, int device, int ins, backend_label *out) {
  const weft_program *pr = ((run_obs *)ctx)->pr;
  *out = (backend_label){.category = "memory", .cat = -1, .rgb = 0xbab0ac};
  if (device < 0 || device >= pr->nprogs || ins < 0 || ins >= pr->progs[device].n || !pr->progs[device].ins) {
    snprintf(out->name, sizeof out->name, "?");
    return;
  }
  const lins *in = &pr->progs[device].ins[ins];
  lower_event_name(pr, in, out->name, sizeof out->name);
  int c = lower_category(pr, in);
  if (c >= 0) out->category = lower_category_names[c], out->cat = c, out->rgb = lower_category_rgb[c];
}

/* ---- the settings of a run ---------------------------------------------------- */

typedef struct trainer {
  const weft_opts *o;
  const weft_graph *g;
  bool speak;             /* process 0: prints, logs and saves */
  bool has_lr;            /* the optimizer has an lr setting to schedule */
  lr_schedule sched;
  bool scheduled;         /* an lr is given to every step (else the model's) */
  bool lr_other;          /* the peak is not the model's (--lr, a checkpoint's) */
  double clip;            /* 0: none */
  /* data */
  token_data *data, *val;
  int tokens, labels;     /* the inputs they fill */
  int64_t batch, seq, vocab;
  uint64_t seed;           /* the run's (--seed, else the checkpoint's) */
  uint64_t data_seed;
  int64_t data_pos;       /* sequences the run has read */
  int64_t eval_every, eval_steps;
  void *kept[2];          /* the fixed inputs, put back after an evaluation */
  /* the main run's outputs */
  FILE *log;
  bool progress, drew;
  int64_t first_step, last_step;
  double t_start;
  int64_t items;
  const char *unit;
  /* sharded checkpoints: the program and where this process stands */
  const weft_program *pr;
  int rank, nprocs;
  /* --trace: the step traced, this process's file, what it wrote */
  int64_t trace_step;
  const char *trace_path;
  run_trace *trace;
  run_trace_about about;
  bool traced;
  double trace_cat[LCAT_COUNT], trace_span;
  int trace_ins;          /* the instructions traced (in run_trace_count pieces) */
  bool bad_option;        /* an option's value the run cannot take (exit 2) */
} trainer;

/* A backend's plan run, or its one-device reference (run NULL). */
typedef struct runner {
  const weft_backend *bk;
  backend_run *run;
  const weft_graph *g;
  backend_opts bo;
} runner;

static bool pass(runner *rn, weft_world *w, const backend_step *s, backend_result *out, char *err, size_t n) {
  return rn->run ? rn->bk->run(rn->run, s, out, err, n) : rn->bk->reference(rn->g, w, s, out, &rn->bo, err, n);
}

/* The number in the optimizer's settings called key, or NaN. */
static double optimizer_setting(const weft_graph *g, const char *key) {
  const vrecord *r = g->optimizer_args;
  for (int i = 0; r && i < r->n; i++)
    if (strcmp(r->keys[i], key) == 0) {
      const value *v = &r->vals[i];
      return v->kind == V_FLOAT ? v->f : v->kind == V_INT ? (double)v->i : NAN;
    }
  return NAN;
}

static const char *meta_num(char *buf, size_t n, double x) {
  snprintf(buf, n, "%.17g", x);
  return buf;
}

/* A number a checkpoint records under key: *out unchanged when absent;
 * false with a message when it is not a number at least lo (above lo when
 * strict; a whole one when integral). */
static bool meta_number(const trainer *t, const weft_world *w, const char *key, double lo, bool strict,
                        bool integral, double *out, char *err, size_t errlen) {
  const char *s = world_meta(w, key);
  if (!s) return true;
  char *end;
  errno = 0;
  double x = strtod(s, &end);
  if (*end || end == s || errno || !isfinite(x) || x < lo || (strict && x == lo) || (integral && x != floor(x)) ||
      (integral && x > 9e15)) {
    snprintf(err, errlen, "%s: %s '%s' in its metadata is not a %s %s", t->o->resume, key, s,
             strict ? "positive" : "non-negative", integral ? "count" : "number");
    return false;
  }
  *out = x;
  return true;
}

static bool meta_count(const trainer *t, const weft_world *w, const char *key, int64_t *out, char *err,
                       size_t errlen) {
  double x = (double)*out;
  if (!meta_number(t, w, key, 0, false, true, &x, err, errlen)) return false;
  *out = (int64_t)x;
  return true;
}

/* The schedule: the command line's settings, else the checkpoint's, else
 * the defaults (the model's lr, constant, no warmup, decay over this run). */
static bool settings(trainer *t, weft_world *w, char *err, size_t errlen) {
  const weft_opts *o = t->o;
  double model_lr = optimizer_setting(t->g, "lr");
  t->has_lr = !isnan(model_lr);
  lr_schedule *s = &t->sched;
  s->kind = LR_CONSTANT;
  s->lr = model_lr;
  s->lr_min = 0;
  s->warmup = 0;
  s->decay = w->step + o->steps;
  t->clip = 0;
  const char *k = world_meta(w, "train.lr_schedule");
  if (k && !lr_kind_parse(k, &s->kind)) {
    snprintf(err, errlen, "%s: train.lr_schedule '%s' in its metadata is not a schedule", o->resume, k);
    return false;
  }
  if (!meta_number(t, w, "train.lr", 0, true, false, &s->lr, err, errlen) ||
      !meta_number(t, w, "train.lr_min", 0, false, false, &s->lr_min, err, errlen) ||
      !meta_count(t, w, "train.warmup", &s->warmup, err, errlen) ||
      !meta_count(t, w, "train.decay_steps", &s->decay, err, errlen) ||
      !meta_number(t, w, "train.clip", 0, false, false, &t->clip, err, errlen))
    return false;
  if (o->lr_schedule) lr_kind_parse(o->lr_schedule, &s->kind);
  if (o->lr_set) s->lr = o->lr;
  if (o->lr_min_set) s->lr_min = o->lr_min;
  if (o->warmup_set) s->warmup = o->warmup;
  if (o->decay_set) s->decay = o->decay_steps;
  if (o->clip_set) t->clip = o->clip;
  t->scheduled = t->has_lr || o->lr_set;
  t->lr_other = s->lr != model_lr;
  if (!t->scheduled && (o->lr_schedule || o->lr_min_set || o->warmup_set || o->decay_set)) {
    snprintf(err, errlen, "the optimizer %s of model %s has no lr setting to schedule", t->g->optimizer, t->g->name);
    return false;
  }
  if (t->scheduled && s->kind != LR_CONSTANT && s->lr_min > s->lr) {
    snprintf(err, errlen, "--lr-min %g is above the learning rate %g", s->lr_min, s->lr);
    return false;
  }
  return true;
}

/* The data of --data and --val-data, and where the run starts in it. */
static bool open_data(trainer *t, weft_world *w, char *err, size_t errlen) {
  const weft_opts *o = t->o;
  const weft_graph *g = t->g;
  t->eval_every = o->eval_every;
  t->eval_steps = o->eval_steps > 0 ? o->eval_steps : 10;
  if (!o->data && !o->val_data) return true;
  t->tokens = graph_find(g, "tokens");
  t->labels = graph_find(g, "labels");
  for (int k = 0; k < 2; k++) {
    int x = k ? t->labels : t->tokens;
    const gtensor *tt = x >= 0 ? &g->tensors[x] : NULL;
    if (!tt || tt->role != TENSOR_INPUT || tt->dtype != DT_I32 || tt->ndims != 2) {
      snprintf(err, errlen, "%s: model %s has no input %s, i32[batch, seq], to fill with token ids",
               o->data ? "--data" : "--val-data", g->name, k ? "labels" : "tokens");
      return false;
    }
  }
  const gtensor *tk = &g->tensors[t->tokens], *lb = &g->tensors[t->labels];
  if (tk->dims[0].size != lb->dims[0].size || tk->dims[1].size != lb->dims[1].size) {
    snprintf(err, errlen, "model %s: its inputs tokens and labels differ in shape", g->name);
    return false;
  }
  t->batch = tk->dims[0].size;
  t->seq = tk->dims[1].size;
  t->vocab = world_id_bound(g, t->tokens);
  if (world_id_bound(g, t->labels) < t->vocab) t->vocab = world_id_bound(g, t->labels);
  int bytes = o->data_bytes ? o->data_bytes : 2;
  if (o->data && !(t->data = data_open(o->data, t->seq, bytes, err, errlen))) return false;
  if (o->val_data && !(t->val = data_open(o->val_data, t->seq, bytes, err, errlen))) return false;
  if (t->val && data_sequences(t->val) < t->batch) {
    snprintf(err, errlen, "%s: %" PRId64 " sequences of %" PRId64 " tokens; one batch needs %" PRId64, o->val_data,
             data_sequences(t->val), t->seq, t->batch);
    return false;
  }
  if (t->val && t->eval_steps > data_sequences(t->val) / t->batch) t->eval_steps = data_sequences(t->val) / t->batch;
  /* the order of the sequences is the first run's seed's; the position where the checkpoint left it */
  const char *ds = world_meta(w, "train.data_seed");
  t->data_seed = t->seed;
  if (ds) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(ds, &end, 10);
    if (*end || end == ds || errno || ds[0] == '-') {
      snprintf(err, errlen, "%s: train.data_seed '%s' in its metadata is not a seed", o->resume, ds);
      return false;
    }
    t->data_seed = x;
  }
  t->data_pos = 0;
  if (!meta_count(t, w, "train.data_pos", &t->data_pos, err, errlen)) return false;
  if (!t->data) {
    /* evaluations overwrite the inputs the steps train on */
    for (int k = 0; k < 2; k++) {
      int x = k ? t->labels : t->tokens;
      size_t n = (size_t)tensor_numel(&g->tensors[x]) * 4;
      t->kept[k] = malloc(n);
      if (!t->kept[k]) weft_oom();
      memcpy(t->kept[k], w->input[x], n);
    }
  }
  return true;
}

/* The run's settings into the world, for a checkpoint. */
static void record_settings(const trainer *t, weft_world *w) {
  char b[64];
  if (t->scheduled) {
    world_set_meta(w, "train.lr", meta_num(b, sizeof b, t->sched.lr));
    world_set_meta(w, "train.lr_schedule", lr_kind_name(t->sched.kind));
    world_set_meta(w, "train.lr_min", meta_num(b, sizeof b, t->sched.lr_min));
    snprintf(b, sizeof b, "%" PRId64, t->sched.warmup);
    world_set_meta(w, "train.warmup", b);
    /* (constant: the default decay, the end of each run, would differ
     * between a run and the same run resumed) */
    if (t->sched.kind != LR_CONSTANT) {
      snprintf(b, sizeof b, "%" PRId64, t->sched.decay);
      world_set_meta(w, "train.decay_steps", b);
    }
  }
  world_set_meta(w, "train.clip", meta_num(b, sizeof b, t->clip));
  if (t->data) {
    snprintf(b, sizeof b, "%" PRIu64, t->data_seed);
    world_set_meta(w, "train.data_seed", b);
    snprintf(b, sizeof b, "%" PRId64, t->data_pos);
    world_set_meta(w, "train.data_pos", b);
  }
}

/* The validation loss: the mean over the first eval_steps batches of the
 * validation data, in order. */
static bool evaluate(trainer *t, runner *rn, weft_world *w, double *loss, char *err, size_t errlen) {
  double sum = 0;
  backend_step s = {.lr = NAN, .eval = true};
  for (int64_t k = 0; k < t->eval_steps; k++) {
    backend_result r;
    if (!data_batch(t->val, k * t->batch, t->batch, false, 0, t->vocab, w->input[t->tokens], w->input[t->labels], err,
                    errlen) ||
        !pass(rn, w, &s, &r, err, errlen))
      return false;
    sum += r.loss;
  }
  *loss = sum / (double)t->eval_steps;
  if (t->kept[0])
    for (int k = 0; k < 2; k++) {
      int x = k ? t->labels : t->tokens;
      memcpy(w->input[x], t->kept[k], (size_t)tensor_numel(&t->g->tensors[x]) * 4);
    }
  return true;
}

/* "1h02m", "3m05s", "12s" */
static const char *duration(char *b, size_t n, double s) {
  long x = (long)(s + 0.5);
  if (x >= 3600) snprintf(b, n, "%ldh%02ldm", x / 3600, x / 60 % 60);
  else if (x >= 60) snprintf(b, n, "%ldm%02lds", x / 60, x % 60);
  else snprintf(b, n, "%lds", x);
  return b;
}

/* back to the start of the line, cleared */
static const char line_clear[] = "\r\033[K";

static void progress_clear(trainer *t) {
  if (t->drew) fputs(line_clear, stderr), t->drew = false;
}

static void progress_draw(trainer *t, const record *r) {
  int64_t done = r->step - t->first_step + 1, total = t->last_step - t->first_step + 1;
  double spent = now_s() - t->t_start;
  char eta[32];
  duration(eta, sizeof eta, total > done ? spent / (double)done * (double)(total - done) : 0);
  char line[256];
  snprintf(line, sizeof line, "%sstep %" PRId64 "/%" PRId64 " (%d%%)  loss %.4f  ETA %s", line_clear, r->step,
           t->last_step, (int)(100 * done / total), r->loss, eta);
  fputs(line, stderr);
  fflush(stderr);
  t->drew = true;
}

static void print_step(trainer *t, const record *r) {
  char b[32];
  printf("step %-4" PRId64 " loss %.6f", r->step, r->loss);
  if (!isnan(r->lr)) printf("  lr %.2e", r->lr);
  printf("  norm %.4f  %.3f s  %s %s/s", r->norm, r->time,
         report_grouped(b, (int64_t)(r->time > 0 ? (double)t->items / r->time : 0)), t->unit);
  if (r->setup >= 0.0005) printf("  (%.3f s of it choosing kernels, once)", r->setup);
  printf("\n");
}

static void log_line(trainer *t, const record *r) {
  json j;
  json_init(&j, t->log);
  json_obj(&j);
  json_key(&j, "step"), json_int(&j, r->step);
  if (!isnan(r->loss)) {
    json_key(&j, "loss"), json_num(&j, r->loss);
    json_key(&j, "lr"), isnan(r->lr) ? json_null(&j) : json_num(&j, r->lr);
    json_key(&j, "grad_norm"), json_num(&j, r->norm);
    json_key(&j, t->unit[0] == 't' ? "tokens_per_s" : "samples_per_s");
    json_num(&j, r->time > 0 ? (double)t->items / r->time : 0);
    json_key(&j, "time_s"), json_num(&j, r->time);
    if (r->setup > 0) json_key(&j, "setup_s"), json_num(&j, r->setup);
  }
  json_key(&j, "elapsed_s"), json_num(&j, now_s() - t->t_start);
  if (!isnan(r->val)) json_key(&j, "val_loss"), json_num(&j, r->val);
  json_end_obj(&j);  /* and the end of the line */
  fflush(t->log);
}

/* PATH with "-stepN" before its extension: run.st -> run-step100.st; a
 * sharded set's directory gets it at its end: run/ -> run-step100/ */
static char *suffixed_name(const char *path, const char *what, int64_t n);

static char *periodic_name(const char *path, int64_t step) { return suffixed_name(path, "step", step); }

/* path with -WHATn before its extension: "ck.st" -> "ck-step5.st" (a
 * set's "ck/" -> "ck-step5/"), "run.json" -> "run-rank1.json". */
static char *suffixed_name(const char *path, const char *what, int64_t num) {
  if (world_sharded_path(path)) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    char *s = malloc(n + 48);
    if (!s) weft_oom();
    snprintf(s, n + 48, "%.*s-%s%" PRId64 "/", (int)n, path, what, num);
    return s;
  }
  const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
  if (dot && (dot == path || (slash && dot < slash) || dot[-1] == '/')) dot = NULL;
  size_t stem = dot ? (size_t)(dot - path) : strlen(path);
  size_t n = strlen(path) + 48;
  char *s = malloc(n);
  if (!s) weft_oom();
  snprintf(s, n, "%.*s-%s%" PRId64 "%s", (int)stem, path, what, num, dot ? dot : "");
  return s;
}

static bool agree(void *ctx, bool ok) {
  runner *rn = ctx;
  return rn->bk->agree && rn->run ? rn->bk->agree(rn->run, ok) : ok;
}

/* A checkpoint of the main run now: every process gathers; process 0
 * writes a file, or every process its shard of a set. */
static bool save_now(trainer *t, runner *rn, weft_world *w, const char *path, uint64_t seed, char *err,
                     size_t errlen) {
  if (!rn->bk->read(rn->run, err, errlen)) return false;
  record_settings(t, w);
  if (world_sharded_path(path))
    return world_save_sharded(w, t->pr, t->rank, t->nprocs, path, seed, agree, rn, err, errlen);
  return !t->speak || world_save(w, path, seed, err, errlen);
}

/* After the traced step: the file written (each process writes its own
 * devices, process 0 to --trace's file, process R to FILE-rankR), the
 * totals kept for the lines. A file that cannot be written loses the
 * trace, not the run. */
static void trace_done(trainer *t, int64_t step) {
  t->about.step = step;
  run_trace_totals(t->trace, t->trace_cat, &t->trace_span, &t->trace_ins);
  char err[PATH_MAX + 256];
  if (run_trace_write(t->trace, t->trace_path, &t->about, err, sizeof err)) t->traced = true;
  else fprintf(stderr, "weft run: --trace %s (the run goes on without it)\n", err);
}

/* The line that says what --trace wrote. */
static void print_trace(const trainer *t) {
  char pieces[64] = "";
  if (run_trace_count(t->trace) != t->trace_ins) snprintf(pieces, sizeof pieces, " in %d pieces", run_trace_count(t->trace));
  char others[PATH_MAX + 96] = "";
  if (t->nprocs > 1) {
    char *last = suffixed_name(t->o->trace, "rank", t->nprocs - 1);
    snprintf(others, sizeof others, " of process 0's devices (the other processes': %s%s)",
             t->nprocs > 2 ? "... " : "", last);
    free(last);
  }
  printf("trace of step %" PRId64 " written to %s: %d instructions%s%s, %.3f ms from the first to the last;",
         t->about.step, t->o->trace, t->trace_ins, pieces, others, t->trace_span * 1e3);
  bool any = false;
  for (int c = 0; c < LCAT_COUNT; c++)
    if (t->trace_cat[c] > 0)
      printf("%s %s %.3f ms", any ? "," : "", lower_category_names[c], t->trace_cat[c] * 1e3), any = true;
  printf("%s\n", any ? " (summed over devices)" : " none timed");
}

/* The training steps of a run, or of its reference: the batch, the
 * learning rate and clipping of each step, evaluations; for the main run
 * (main) also its lines, log, progress and periodic checkpoints. */
static bool train_loop(trainer *t, runner *rn, weft_world *w, bool main, run_log *log, uint64_t seed, char *err,
                       size_t errlen) {
  const weft_opts *o = t->o;
  int64_t print_every = o->print_every > 0 ? o->print_every : 1;
  for (int i = 0; i < o->steps; i++) {
    if (t->data &&
        !data_batch(t->data, t->data_pos, t->batch, true, t->data_seed, t->vocab, w->input[t->tokens],
                    w->input[t->labels], err, errlen))
      return false;
    backend_step s = {.lr = t->scheduled ? lr_at(&t->sched, w->step) : NAN, .clip = t->clip,
                      .trace = main && t->trace && w->step + 1 == t->trace_step};
    backend_result res;
    if (s.trace) {
      /* the wall clock at the step's start: what lines up the files of
       * several processes (bench/trace_merge.py) */
      struct timespec now;
      clock_gettime(CLOCK_REALTIME, &now);
      t->about.epoch_us = (int64_t)now.tv_sec * 1000000 + now.tv_nsec / 1000;
    }
    if (!pass(rn, w, &s, &res, err, errlen)) return false;
    if (s.trace) trace_done(t, w->step);
    if (t->data) t->data_pos += t->batch;
    record r = {w->step, res.loss, s.lr, res.grad_norm, res.seconds, NAN, res.setup_seconds};
    if ((!isfinite(res.loss) || !isfinite(res.grad_norm)) && !o->allow_nonfinite) {
      snprintf(err, errlen, "step %" PRId64 ": the %s is %g%s", r.step, isfinite(res.loss) ? "gradient norm" : "loss",
               isfinite(res.loss) ? res.grad_norm : res.loss,
               t->scheduled ? " (a learning rate too high? --lr, --warmup, --clip)" : "");
      return false;
    }
    bool last = i == o->steps - 1;
    if (t->val && ((t->eval_every > 0 && w->step % t->eval_every == 0) || last) &&
        !evaluate(t, rn, w, &r.val, err, errlen))
      return false;
    log_add(log, r);
    if (!main) continue;
    if (t->speak && !o->json && (i % print_every == print_every - 1 || last || !isnan(r.val))) {
      progress_clear(t);
      if (i % print_every == print_every - 1 || last) print_step(t, &r);
      if (!isnan(r.val)) printf("step %-4" PRId64 " val loss %.6f (%" PRId64 " batch%s)\n", r.step, r.val,
                                t->eval_steps, t->eval_steps == 1 ? "" : "es");
      fflush(stdout);
    }
    if (t->speak && !o->json && s.trace && t->traced) {
      progress_clear(t);
      print_trace(t);
      fflush(stdout);
    }
    if (t->log) log_line(t, &r);
    if (t->progress && !last) progress_draw(t, &r);
    if (o->save && o->save_every > 0 && w->step % o->save_every == 0) {
      char *p = periodic_name(o->save, w->step);
      bool ok = save_now(t, rn, w, p, seed, err, errlen);
      if (ok && t->speak && o->keep > 0 && w->step > o->keep * o->save_every) {
        char *old = periodic_name(o->save, w->step - o->keep * o->save_every);
        char e2[256];
        if (world_sharded_path(old)) world_remove_sharded(old, e2, sizeof e2);
        else unlink(old);
        free(old);
      }
      free(p);
      if (!ok) return false;
    }
  }
  if (o->steps == 0 && t->val) {
    /* no step: the validation loss of the parameters as they are */
    record r = {w->step, NAN, NAN, NAN, 0, NAN, 0};
    if (!evaluate(t, rn, w, &r.val, err, errlen)) return false;
    log_add(log, r);
    if (main && t->speak && !o->json)
      printf("step %-4" PRId64 " val loss %.6f (%" PRId64 " batch%s)\n", r.step, r.val, t->eval_steps,
             t->eval_steps == 1 ? "" : "es");
    if (main && t->log) log_line(t, &r);
  }
  if (main) progress_clear(t);
  return true;
}

/* The lines before the steps: the data and the schedule, when given. */
static void print_settings(const trainer *t) {
  char a[32], b[32];
  if (t->data)
    printf("data %s: %d file%s, %s tokens (%s), %s sequences of %" PRId64 " tokens; from sequence %" PRId64 "\n", t->o->data,
           data_file_count(t->data), data_file_count(t->data) == 1 ? "" : "s", report_grouped(a, data_tokens(t->data)),
           data_format(t->data), report_grouped(b, data_sequences(t->data)), t->seq, t->data_pos);
  if (t->val) {
    printf("validation %s: %s tokens, %" PRId64 " batch%s ", t->o->val_data, report_grouped(a, data_tokens(t->val)),
           t->eval_steps, t->eval_steps == 1 ? "" : "es");
    if (t->eval_every > 0) printf("every %" PRId64 " step%s and ", t->eval_every, t->eval_every == 1 ? "" : "s");
    printf("after the last\n");
  }
  if (t->scheduled && (t->sched.kind != LR_CONSTANT || t->sched.warmup > 0 || t->lr_other)) {
    printf("lr %g, %s", t->sched.lr, lr_kind_name(t->sched.kind));
    if (t->sched.warmup > 0) printf(" after %" PRId64 " warmup step%s", t->sched.warmup, t->sched.warmup == 1 ? "" : "s");
    if (t->sched.kind != LR_CONSTANT) printf(" to %g at step %" PRId64, t->sched.lr_min, t->sched.decay);
    printf("\n");
  }
  if (t->clip > 0) printf("gradients clipped to norm %g\n", t->clip);
}

/* ---- the task -------------------------------------------------------------------- */

/* The longest wait of a device for another, unless --timeout says. */
#define RUN_TIMEOUT_S 600.0

/* Whether the run fits the memory budget, before any of it is allocated:
 * every device's buffers at their peak, held as f32 (bf16 and f16 take
 * twice their bytes), and the whole parameters, optimizer state and inputs
 * (twice, and the one-device step's tensors, with --check). A backend whose
 * devices have memory of their own (a GPU's, which it checks itself) counts
 * the parameters, state and inputs alone. */
static bool run_fits(const weft_program *pr, const weft_graph *g, const weft_opts *o, const weft_backend *bk,
                     bool speak) {
  double devices = 0, world = 0, whole = 0;
  bool narrow = false;
  int copies = g->optimizer && strcmp(g->optimizer, "adamw") == 0 ? 2 : 1;
  for (int t = 0; t < g->ntensors; t++) {
    const gtensor *x = &g->tensors[t];
    double n = (double)tensor_numel(x) * 4;
    narrow |= dtype_bytes[x->dtype] == 2;
    if (x->role == TENSOR_PARAM) world += n * (1 + copies);
    else if (x->role == TENSOR_INPUT) world += n;
    whole += 2 * n;
  }
  for (int d = 0; d < pr->nprogs && !bk->devices_apart; d++) devices += (double)pr->progs[d].peak * (narrow ? 2 : 1);
  double need = devices + world + (o->run_check ? world + (bk->devices_apart ? 0 : whole) : 0);
  size_t budget = arena_budget();
  if (!budget || need <= (double)budget) return true;
  if (speak) {
    char b1[32], b2[32], b3[32], b4[32];
    char dev[80] = "";
    if (!bk->devices_apart)
      snprintf(dev, sizeof dev, "the devices' buffers at their peak %s, ",
               unit_bytes_human((int64_t)fmin(devices, 9e18), b2, sizeof b2));
    fprintf(stderr, "weft run: the run needs about %s of memory (%sthe model's parameters, optimizer state and inputs "
            "%s%s), more than the budget of %s (--max-memory)\n",
            unit_bytes_human((int64_t)fmin(need, 9e18), b1, sizeof b1), dev,
            unit_bytes_human((int64_t)fmin(world, 9e18), b3, sizeof b3), o->run_check ? ", twice with --check" : "",
            unit_bytes_human((int64_t)budget, b4, sizeof b4));
  }
  return false;
}


/* The step --trace times: --trace-step's, else the run's last; false
 * with a message when the run does not run it. */
static bool trace_step(trainer *t, const weft_world *w, char *err, size_t errlen) {
  const weft_opts *o = t->o;
  if (!o->trace) return true;
  int64_t first = w->step + 1, last = w->step + o->steps;
  t->trace_step = o->trace_step > 0 ? o->trace_step : last;
  if (t->trace_step >= first && t->trace_step <= last) return true;
  t->bad_option = true;
  if (first == last) snprintf(err, errlen, "--trace-step %" PRId64 ": this run runs step %" PRId64, t->trace_step, first);
  else snprintf(err, errlen, "--trace-step %" PRId64 ": this run runs steps %" PRId64 " to %" PRId64, t->trace_step,
                first, last);
  return false;
}

/* Whether path is the file (or, for a pattern of --data, one of the
 * files) that `file` names. */
static bool same_file(const char *path, const char *file) {
  return strcmp(path, file) == 0 || file_same(path, file) ||
         (strpbrk(file, "*?[") && fnmatch(file, path, FNM_PATHNAME) == 0);
}

/* The files a run writes as it goes (--log, --trace) are none of those
 * it reads (--load, --resume, --data, --val-data; report_output_ok checks
 * the plan and --inputs) nor each other, nor --save's; --save is none of
 * the token files. (--save over --load or --resume replaces the
 * checkpoint the run started from, atomically, once it has finished.) */
static bool outputs_apart(const weft_opts *o, bool speak) {
  const char *outs[][2] = {{"--log", o->log}, {"--trace", o->trace}, {"--save", o->save}};
  const char *reads[][2] = {{"--load", o->load}, {"--resume", o->resume}, {"--data", o->data}, {"--val-data", o->val_data}};
  for (int i = 0; i < 3; i++) {
    if (!outs[i][1]) continue;
    for (int k = i == 2 ? 2 : 0; k < 4; k++)
      if (reads[k][1] && same_file(outs[i][1], reads[k][1])) {
        if (speak)
          fprintf(stderr, "weft: error: %s %s: the run reads that file (%s %s); weft never writes over its inputs\n",
                  outs[i][0], outs[i][1], reads[k][0], reads[k][1]);
        return false;
      }
    for (int k = i + 1; k < 3; k++)
      if (outs[k][1] && same_file(outs[i][1], outs[k][1])) {
        if (speak) fprintf(stderr, "weft: error: %s %s: %s writes that file too\n", outs[i][0], outs[i][1], outs[k][0]);
        return false;
      }
  }
  return true;
}

/* --trace FILE, checked before any work: a file (standard output has the
 * steps), which the task may write, and a backend that traces. */
static bool trace_wanted(const weft_opts *o, const weft_backend *bk, const char *path, bool speak) {
  const char *why = NULL;
  if (strcmp(o->trace, "-") == 0) why = "weft run prints its steps on standard output: name a file";
  else if (!bk->trace_about) why = "this backend does not time instructions";
  else if (o->steps < 1) why = "--steps 0 runs no step to trace";
  if (why) {
    if (speak) fprintf(stderr, "weft: error: --trace %s: %s\n", o->trace, why);
    return false;
  }
  /* each process its own file (the others' errors are theirs to say) */
  return report_output_ok(o, "--trace", path, true);
}

int report_run(const weft_opts *o) {
  int nbuiltin;
  const weft_backend *bk = o->backend ? o->backend : backend_builtin(&nbuiltin)[0];
  if (o->run_check && !bk->reference) {
    fprintf(stderr, "weft run: backend %s has no one-device reference for --check\n", bk->name);
    return WEFT_FAILED;
  }
  char err[1024] = "";
  /* Under mpirun, process 0 speaks for all. */
  int rank, nprocs;
  bk->procs(&rank, &nprocs);
  bool speak = rank == 0;
  /* the files it writes are checked before any work */
  bool sharded = o->save && world_sharded_path(o->save);
  if (sharded && !world_sharded_target(o->save, err, sizeof err)) {
    if (speak) fprintf(stderr, "weft: error: --save %s\n", err);
    return WEFT_FAILED;
  }
  if ((o->save && !sharded && !report_output_ok(o, "--save", o->save, speak)) ||
      (o->log && !report_output_ok(o, "--log", o->log, speak)))
    return WEFT_FAILED;
  /* the file of this process's trace: --trace's, or FILE-rankR */
  char trace_path[PATH_MAX + 64] = "";
  if (o->trace) {
    char *p = rank == 0 ? NULL : suffixed_name(o->trace, "rank", rank);
    snprintf(trace_path, sizeof trace_path, "%s", p ? p : o->trace);
    free(p);
  }
  if ((o->trace && !trace_wanted(o, bk, trace_path, speak)) || !outputs_apart(o, speak)) return WEFT_FAILED;
  if (o->trace_step > 0 && !o->trace) {
    if (speak) fprintf(stderr, "weft: error: --trace-step %" PRId64 " needs --trace FILE\n", o->trace_step);
    return WEFT_FAILED;
  }
  weft_ctx *c = report_ctx(o);
  int rc = WEFT_OK;
  weft_plan *p = report_plan(c, o, &rc, NULL);
  if ((p && o->save && !sharded && !report_output_not_source(c, "--save", o->save, speak)) ||
      (p && o->log && !report_output_not_source(c, "--log", o->log, speak)) ||
      (p && o->trace && !report_output_not_source(c, "--trace", trace_path, true))) {
    weft_free(c);
    return WEFT_FAILED;
  }
  lower_opts lo = {.full_programs = true};  /* run */
  weft_program *pr = p ? lower_plan(p, &lo, &c->arena, &c->diags) : NULL;
  if (pr && !validate_program(pr, NULL, &c->diags)) pr = NULL;
  if (p && !pr) rc = WEFT_REJECTED;
  if (speak) report_diags(c, o);
  if (!pr) {
    if (o->json && speak) {
      diag_print_json(&c->diags, stdout);
      printf("\n");
    }
    weft_free(c);
    return rc;
  }
  const weft_graph *g = lower_graph(pr);
  /* Native code runs only when the command line allows it; then every
   * kernel is loaded now, so that a missing one is reported where it is named. */
  for (int i = 0; i < g->nops; i++) {
    const opdecl *d = g->ops[i].decl;
    bool seen = false;
    for (int j = 0; j < i && !seen; j++) seen = g->ops[j].decl == d;
    if (!d || !d->native_fwd || seen) continue;
    if (!o->allow_native) {
      weft_diag *e = report_error(c, d->native_loc, "operator %s runs native code from \"%s\"", d->name, d->native_fwd);
      diag_hint(e, &c->diags, "weft run loads native kernels only with --allow-native");
      rc = WEFT_REJECTED;
      continue;
    }
    if (!bk->load_native) {
      report_error(c, d->native_loc, "operator %s runs native code, which the %s backend does not run", d->name, bk->name);
      rc = WEFT_REJECTED;
      continue;
    }
    for (int k = 0; k < 2; k++) {
      const char *spec = k ? d->native_bwd : d->native_fwd;
      if (!spec) continue;
      if (!bk->load_native(spec, d->native_dir, err, sizeof err)) {
        report_error(c, k ? d->native_bwd_loc : d->native_loc, "cannot load the kernel of operator %s: %s", d->name, err);
        rc = WEFT_REJECTED;
      }
    }
  }
  if (rc != WEFT_OK) {
    if (speak) report_diags(c, o);
    weft_free(c);
    return rc;
  }
  if (!run_fits(pr, g, o, bk, speak)) {
    weft_free(c);
    return WEFT_FAILED;
  }
  weft_world *w = world_new(g);
  w->allow_nonfinite = o->allow_nonfinite;
  uint64_t seed = o->seed;
  bool ok = true;
  if (!g->optimizer) ok = run_fail(NULL, "the plan's model has no `train` statement: nothing to run") == 0;
  struct stat rs;
  bool resume_set = o->resume && (world_sharded_path(o->resume) || (stat(o->resume, &rs) == 0 && S_ISDIR(rs.st_mode)));
  /* a set: this process reads what its devices hold, unless the run needs
   * the whole (one process, or the one-device reference of --check) */
  if (ok && resume_set)
    ok = world_resume_sharded(w, pr, rank, nprocs, nprocs == 1 || o->run_check, o->resume,
                              o->seed_given ? NULL : &seed, err, sizeof err);
  else if (ok && o->resume) ok = world_resume(w, o->resume, o->seed_given ? NULL : &seed, err, sizeof err);
  else if (ok && o->load) ok = world_load_params(w, o->load, err, sizeof err);
  else if (ok) world_init_params(w, seed);
  if (ok && o->inputs) ok = world_load_inputs(w, o->inputs, err, sizeof err);
  else if (ok) world_init_inputs(w, seed);
  trainer t = {.o = o, .g = g, .speak = speak, .tokens = -1, .labels = -1, .seed = seed,
               .pr = pr, .rank = rank, .nprocs = nprocs};
  ok = ok && settings(&t, w, err, sizeof err) && open_data(&t, w, err, sizeof err) &&
       trace_step(&t, w, err, sizeof err);
  if (ok && o->log && speak) {
    /* a resumed run goes on with the log of the run it continues */
    t.log = fopen(o->log, o->resume ? "a" : "w");
    if (!t.log) {
      snprintf(err, sizeof err, "--log %s: %s", o->log, strerror(errno));
      ok = false;
    }
  }
  if (!ok) {
    if (err[0] && speak) run_fail(NULL, err);
    if (t.log) fclose(t.log);
    data_close(t.data), data_close(t.val);
    free(t.kept[0]), free(t.kept[1]);
    world_free(w);
    weft_free(c);
    return t.bad_option ? WEFT_FAILED : WEFT_REJECTED;
  }
  weft_world *ref = o->run_check ? world_clone(w) : NULL;
  int64_t start_pos = t.data_pos;
  t.items = world_step_items(g, &t.unit);
  t.first_step = w->step + 1;
  t.last_step = w->step + o->steps;
  if (o->trace) {
    t.trace = run_trace_new(pr);
    t.trace_path = trace_path;
    t.about = (run_trace_about){
        .plan = p->name, .backend = bk->name, .times = bk->trace_about, .rank = rank, .processes = nprocs};
  }
  t.progress = speak && !o->json && o->steps > 1 && (o->progress > 0 || (o->progress < 0 && isatty(2)));
  int active = 0;
  for (int d = 0; d < pr->nprogs; d++) active += pr->progs[d].n > 0;
  char procs[64] = "";
  if (nprocs > 1) snprintf(procs, sizeof procs, " in %d processes", nprocs);
  mem_log mem = {.ndev = pr->nprogs};
  mem.seen = calloc((size_t)pr->nprogs + 1, sizeof(bool));
  mem.peak = calloc((size_t)pr->nprogs + 1, sizeof(int64_t));
  mem.role = calloc(((size_t)pr->nprogs + 1) * LB_ROLE_COUNT, sizeof(int64_t));
  if (!mem.seen || !mem.peak || !mem.role) weft_oom();
  run_obs obs = {.mem = &mem, .trace = t.trace, .pr = pr};
  runner rn = {.bk = bk, .g = g,
               .bo = {.allow_native = o->allow_native, .deterministic = o->deterministic,
                      .allow_nonfinite = o->allow_nonfinite, .timeout_s = o->timeout > 0 ? o->timeout : RUN_TIMEOUT_S,
                      .on_memory = mem_on_memory, .ctx = &obs, .rendezvous = o->rendezvous,
                      .on_trace = t.trace ? obs_on_trace : NULL, .label = obs_label}};
  rn.run = bk->open(pr, w, &rn.bo, err, sizeof err);
  char machine[512] = "";
  if (rn.run && bk->describe) bk->describe(rn.run, machine, sizeof machine);
  t.about.machine = machine;
  /* the header once the backend is up (under mpirun: once MPI is) */
  if (rn.run && !o->json && speak) {
    printf("plan %s (model %s): %d device%s%s, %d micro-batch%s, %s backend, %d step%s from step %" PRId64 "\n",
           p->name, g->name, active, active == 1 ? "" : "s", procs, pr->nmb, pr->nmb == 1 ? "" : "es", bk->name,
           o->steps, o->steps == 1 ? "" : "s", w->step + 1);
    if (machine[0]) printf("on %s\n", machine);
    print_settings(&t);
    fflush(stdout);
  }
  run_log log = {0};
  t.t_start = now_s();
  ok = rn.run && train_loop(&t, &rn, w, true, &log, seed, err, sizeof err) && bk->read(rn.run, err, sizeof err);
  /* a set is written while the processes can still meet */
  bool saved = false;
  char save_err[1024] = "";
  if (ok && sharded) {
    record_settings(&t, w);
    saved = world_save_sharded(w, pr, rank, nprocs, o->save, seed, agree, &rn, save_err, sizeof save_err);
  }
  if (rn.run) bk->close(rn.run);
  if (!ok) {
    run_fail(NULL, err);
    rc = bk->failure ? bk->failure() : WEFT_REJECTED;
  }
  /* --check: the same passes on one device. */
  run_log rlog = {0};
  double loss_err = 0, norm_err = 0, param_err = 0, tensor_err = 0, tol = bk->tolerance ? bk->tolerance(g) : 1e-5;
  const char *worst = NULL;
  bool check_ok = true;
  if (ok && ref) {
    runner rr = {.bk = bk, .g = g, .bo = rn.bo};
    trainer rt = t;
    rt.data_pos = start_pos;
    rt.log = NULL;
    rt.progress = false;
    ok = train_loop(&rt, &rr, ref, false, &rlog, seed, err, sizeof err);
    if (!ok) {
      run_fail("one-device reference", err);
      rc = bk->failure ? bk->failure() : WEFT_REJECTED;
    }
  }
  if (ok && ref) {
    /* losses (and validation losses), gradient norms */
    for (int i = 0; i < log.n && i < rlog.n; i++)
      for (int k = 0; k < 3; k++) {
        const record *x = &log.r[i], *y = &rlog.r[i];
        double a = k == 0 ? x->loss : k == 1 ? x->val : x->norm, b = k == 0 ? y->loss : k == 1 ? y->val : y->norm;
        if (isnan(a) && isnan(b)) continue;
        double e = fabs(a - b) / (fabs(b) > 0 ? fabs(b) : 1.0), *m = k == 2 ? &norm_err : &loss_err;
        if (!(e <= *m)) *m = e;
      }
    param_err = world_diff_all(w, ref);
    tensor_err = world_diff(w, ref, false, &worst);
    check_ok = log.n == rlog.n && loss_err <= tol && norm_err <= tol && param_err <= tol;
    /* "1e-5", not "1e-05" */
    char mismatch[64], tt[32];
    snprintf(tt, sizeof tt, "%g", tol);
    char *z = strstr(tt, "e-0");
    if (z) memmove(z + 2, z + 3, strlen(z + 3) + 1);
    snprintf(mismatch, sizeof mismatch, "MISMATCH (tolerance %s)", tt);
    if (!o->json && speak) {
      printf("check against one device: losses within %.2g, gradient norms within %.2g, parameters within %.2g "
             "(relative L2; worst tensor %s %.2g): %s\n",
             loss_err, norm_err, param_err, worst ? worst : "-", tensor_err, check_ok ? "match" : mismatch);
      if (!check_ok)
        for (int i = 0; i < log.n && i < rlog.n; i++)
          printf("  step %" PRId64 ": loss %.9g, one device %.9g; gradient norm %.9g, one device %.9g\n",
                 log.r[i].step, log.r[i].loss, rlog.r[i].loss, log.r[i].norm, rlog.r[i].norm);
    }
    if (!check_ok) rc = WEFT_REJECTED;
  }
  if (ok && sharded) {
    if (!saved) rc = speak ? run_fail("--save", save_err) : WEFT_REJECTED;
    else if (!o->json && speak) printf("saved %s (step %" PRId64 ")\n", o->save, w->step);
  } else if (ok && o->save) {
    record_settings(&t, w);
    if (!speak) saved = true;
    else if (world_save(w, o->save, seed, err, sizeof err)) {
      saved = true;
      if (!o->json) printf("saved %s (step %" PRId64 ")\n", o->save, w->step);
    } else {
      rc = run_fail("--save", err);
    }
  }
  if (o->json && speak) {
    json j;
    json_init(&j, stdout);
    json_obj(&j);
    json_key(&j, "plan"), json_str(&j, p->name);
    json_key(&j, "model"), json_str(&j, g->name);
    json_key(&j, "backend"), json_str(&j, bk->name);
    if (machine[0]) json_key(&j, "machine"), json_str(&j, machine);
    json_key(&j, "devices"), json_int(&j, active);
    json_key(&j, "micro_batches"), json_int(&j, pr->nmb);
    json_key(&j, "ok"), json_bool(&j, ok && check_ok && rc == WEFT_OK);
    if (!ok) json_key(&j, "error"), json_str(&j, err);
    json_key(&j, "steps");
    json_arr(&j);
    for (int i = 0; i < log.n; i++) {
      const record *r = &log.r[i];
      json_obj(&j);
      json_key(&j, "step"), json_int(&j, r->step);
      if (!isnan(r->loss)) {
        json_key(&j, "loss"), json_num(&j, r->loss);
        json_key(&j, "lr"), isnan(r->lr) ? json_null(&j) : json_num(&j, r->lr);
        json_key(&j, "grad_norm"), json_num(&j, r->norm);
        json_key(&j, "time_s"), json_num(&j, r->time);
        if (r->setup > 0) json_key(&j, "setup_s"), json_num(&j, r->setup);
        json_key(&j, t.unit[0] == 't' ? "tokens_per_s" : "samples_per_s");
        json_num(&j, r->time > 0 ? (double)t.items / r->time : 0);
        if (ref && i < rlog.n) {
          json_key(&j, "reference_loss"), json_num(&j, rlog.r[i].loss);
          json_key(&j, "reference_grad_norm"), json_num(&j, rlog.r[i].norm);
        }
      }
      if (!isnan(r->val)) {
        json_key(&j, "val_loss"), json_num(&j, r->val);
        if (ref && i < rlog.n) json_key(&j, "reference_val_loss"), json_num(&j, rlog.r[i].val);
      }
      json_end_obj(&j);
    }
    json_end_arr(&j);
    /* the buffers each device held at their peak, as the backend measured them */
    json_key(&j, "memory");
    json_arr(&j);
    for (int d = 0; d < mem.ndev; d++) {
      if (!mem.seen[d]) continue;
      json_obj(&j);
      json_key(&j, "device"), json_int(&j, d);
      json_key(&j, "peak_bytes"), json_int(&j, mem.peak[d]);
      json_key(&j, "by_role");
      json_obj(&j);
      for (int i = 0; i < LB_ROLE_COUNT; i++) {
        int r = lbuf_role_order[i];
        json_key(&j, lbuf_role_names[r]), json_int(&j, mem.role[(size_t)d * LB_ROLE_COUNT + r]);
      }
      json_end_obj(&j);
      json_end_obj(&j);
    }
    json_end_arr(&j);
    if (ref && ok) {
      json_key(&j, "check");
      json_obj(&j);
      json_key(&j, "match"), json_bool(&j, check_ok);
      json_key(&j, "tolerance"), json_num(&j, tol);
      json_key(&j, "max_loss_rel_err"), json_num(&j, loss_err);
      json_key(&j, "max_grad_norm_rel_err"), json_num(&j, norm_err);
      json_key(&j, "max_param_rel_err"), json_num(&j, param_err);
      json_key(&j, "worst_tensor"), worst ? json_str(&j, worst) : json_null(&j);
      json_key(&j, "worst_tensor_rel_err"), json_num(&j, tensor_err);
      json_end_obj(&j);
    }
    if (saved) json_key(&j, "saved"), json_str(&j, o->save);
    if (t.traced) {
      json_key(&j, "trace");
      json_obj(&j);
      json_key(&j, "file"), json_str(&j, o->trace);
      json_key(&j, "step"), json_int(&j, t.about.step);
      json_key(&j, "instructions"), json_int(&j, t.trace_ins);
      json_key(&j, "events"), json_int(&j, run_trace_count(t.trace));
      json_key(&j, "span_s"), json_num(&j, t.trace_span);
      json_key(&j, "seconds");
      json_obj(&j);
      for (int k = 0; k < LCAT_COUNT; k++) json_key(&j, lower_category_names[k]), json_num(&j, t.trace_cat[k]);
      json_end_obj(&j);
      json_end_obj(&j);
    }
    json_end_obj(&j);
    printf("\n");
  }
  if (t.log) fclose(t.log);
  data_close(t.data), data_close(t.val);
  free(t.kept[0]), free(t.kept[1]);
  free(log.r), free(rlog.r);
  free(mem.seen), free(mem.peak), free(mem.role);
  run_trace_free(t.trace);
  world_free(ref);
  world_free(w);
  weft_free(c);
  return rc;
}
