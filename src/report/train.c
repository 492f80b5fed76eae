/* train.c - weft run: a plan trained on a backend, its losses reported, with
 * --check the same steps on one device and the two compared. */
#include "common.h"

/* The longest wait of a device for another, unless --timeout says. */
#define RUN_TIMEOUT_S 600.0

/* Losses of a run, step by step. */
typedef struct run_log {
  bool print;             /* a line per step on stdout */
  int64_t items;          /* tokens (or samples) per step */
  const char *unit;
  int n, cap;
  int64_t *step;
  double *loss, *time;
} run_log;

static void run_on_step(void *ctx, int64_t step, double loss, double seconds) {
  run_log *l = ctx;
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 16;
    l->step = realloc(l->step, (size_t)l->cap * sizeof(int64_t));
    l->loss = realloc(l->loss, (size_t)l->cap * sizeof(double));
    l->time = realloc(l->time, (size_t)l->cap * sizeof(double));
    if (!l->step || !l->loss || !l->time) weft_oom();
  }
  l->step[l->n] = step, l->loss[l->n] = loss, l->time[l->n] = seconds, l->n++;
  if (l->print) {
    char b[32];
    printf("step %-4" PRId64 " loss %.6f  %.3f s  %s %s/s\n", step, loss, seconds,
           report_grouped(b, (int64_t)(seconds > 0 ? (double)l->items / seconds : 0)), l->unit);
    fflush(stdout);
  }
}

static void run_log_free(run_log *l) { free(l->step), free(l->loss), free(l->time); }

static int run_fail(const char *what, const char *msg) __attribute__((unused));
static int run_fail(const char *what, const char *msg) {
  fprintf(stderr, "weft run: %s%s%s\n", what ? what : "", what ? ": " : "", msg);
  return WEFT_REJECTED;
}

/* Whether the run fits the memory budget, before any of it is allocated:
 * every device's buffers at their peak, held as f32 (bf16 and f16 take
 * twice their bytes), and the whole parameters, optimizer state and inputs
 * (twice, and the one-device step's tensors, with --check). */
static bool run_fits(const weft_program *pr, const weft_graph *g, const weft_opts *o, bool speak) {
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
  for (int d = 0; d < pr->nprogs; d++) devices += (double)pr->progs[d].peak * (narrow ? 2 : 1);
  double need = devices + world + (o->run_check ? world + whole : 0);
  size_t budget = arena_budget();
  if (!budget || need <= (double)budget) return true;
  if (speak) {
    char b1[32], b2[32], b3[32], b4[32];
    fprintf(stderr, "weft run: the run needs about %s of memory (the devices' buffers at their peak %s, the model's "
            "parameters, optimizer state and inputs %s%s), more than the budget of %s (--max-memory)\n",
            unit_bytes_human((int64_t)fmin(need, 9e18), b1, sizeof b1), unit_bytes_human((int64_t)fmin(devices, 9e18), b2, sizeof b2),
            unit_bytes_human((int64_t)fmin(world, 9e18), b3, sizeof b3), o->run_check ? ", twice with --check" : "",
            unit_bytes_human((int64_t)budget, b4, sizeof b4));
  }
  return false;
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
  /* where the checkpoint goes is checked before any work */
  if (o->save && !report_output_ok(o, "--save", o->save, speak)) return WEFT_FAILED;
  weft_ctx *c = report_ctx(o);
  int rc = WEFT_OK;
  weft_plan *p = report_plan(c, o, &rc, NULL);
  if (p && o->save && !report_output_not_source(c, "--save", o->save, speak)) {
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
  if (!run_fits(pr, g, o, speak)) {
    weft_free(c);
    return WEFT_FAILED;
  }
  weft_world *w = world_new(g);
  w->allow_nonfinite = o->allow_nonfinite;
  uint64_t seed = o->seed;
  bool ok = true;
  if (!g->optimizer) ok = run_fail(NULL, "the plan's model has no `train` statement: nothing to run") == 0;
  if (ok && o->resume) ok = world_resume(w, o->resume, o->seed_given ? NULL : &seed, err, sizeof err);
  else if (ok && o->load) ok = world_load_params(w, o->load, err, sizeof err);
  else if (ok) world_init_params(w, seed);
  if (ok && o->inputs) ok = world_load_inputs(w, o->inputs, err, sizeof err);
  else if (ok) world_init_inputs(w, seed);
  if (!ok) {
    if (err[0] && speak) run_fail(NULL, err);
    world_free(w);
    weft_free(c);
    return WEFT_REJECTED;
  }
  weft_world *ref = o->run_check ? world_clone(w) : NULL;
  run_log log = {0};
  log.print = !o->json && speak;
  log.items = world_step_items(g, &log.unit);
  int active = 0;
  for (int d = 0; d < pr->nprogs; d++) active += pr->progs[d].n > 0;
  char procs[64] = "";
  if (nprocs > 1) snprintf(procs, sizeof procs, " in %d processes", nprocs);
  backend_opts bo = {.allow_native = o->allow_native, .allow_nonfinite = o->allow_nonfinite,
                     .timeout_s = o->timeout > 0 ? o->timeout : RUN_TIMEOUT_S, .on_step = run_on_step, .ctx = &log};
  backend_run *run = bk->open(pr, w, &bo, err, sizeof err);
  /* the header once the backend is up (under mpirun: once MPI is) */
  if (run && !o->json && speak) {
    printf("plan %s (model %s): %d device%s%s, %d micro-batch%s, %s backend, %d step%s from step %" PRId64 "\n",
           p->name, g->name, active, active == 1 ? "" : "s", procs, pr->nmb, pr->nmb == 1 ? "" : "es", bk->name,
           o->steps, o->steps == 1 ? "" : "s", w->step + 1);
    fflush(stdout);
  }
  ok = run && bk->run(run, o->steps, err, sizeof err) && bk->read(run, err, sizeof err);
  if (run) bk->close(run);
  if (!ok) rc = run_fail(NULL, err);
  /* --check: the same steps on one device. */
  run_log rlog = {0};
  double loss_err = 0, param_err = 0, tensor_err = 0;
  const char *worst = NULL;
  bool check_ok = true;
  if (ok && ref) {
    backend_opts rbo = {.allow_native = o->allow_native, .allow_nonfinite = o->allow_nonfinite, .on_step = run_on_step,
                        .ctx = &rlog};
    ok = bk->reference(g, ref, o->steps, &rbo, err, sizeof err);
    if (!ok) rc = run_fail("one-device reference", err);
  }
  if (ok && ref) {
    for (int i = 0; i < log.n && i < rlog.n; i++) {
      double e = fabs(log.loss[i] - rlog.loss[i]) / (fabs(rlog.loss[i]) > 0 ? fabs(rlog.loss[i]) : 1.0);
      if (e > loss_err) loss_err = e;
    }
    param_err = world_diff_all(w, ref);
    tensor_err = world_diff(w, ref, false, &worst);
    check_ok = log.n == rlog.n && loss_err <= 1e-5 && param_err <= 1e-5;
    if (!o->json && speak) {
      printf("check against one device: losses within %.2g, parameters within %.2g (relative L2; worst tensor %s "
             "%.2g): %s\n",
             loss_err, param_err, worst ? worst : "-", tensor_err, check_ok ? "match" : "MISMATCH (tolerance 1e-5)");
      if (!check_ok)
        for (int i = 0; i < log.n && i < rlog.n; i++)
          printf("  step %" PRId64 ": plan %.9g, one device %.9g\n", log.step[i], log.loss[i], rlog.loss[i]);
    }
    if (!check_ok) rc = WEFT_REJECTED;
  }
  bool saved = false;
  if (ok && o->save && speak) {
    if (world_save(w, o->save, seed, err, sizeof err)) {
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
    json_key(&j, "devices"), json_int(&j, active);
    json_key(&j, "micro_batches"), json_int(&j, pr->nmb);
    json_key(&j, "ok"), json_bool(&j, ok && check_ok && rc == WEFT_OK);
    if (!ok) json_key(&j, "error"), json_str(&j, err);
    json_key(&j, "steps");
    json_arr(&j);
    for (int i = 0; i < log.n; i++) {
      json_obj(&j);
      json_key(&j, "step"), json_int(&j, log.step[i]);
      json_key(&j, "loss"), json_num(&j, log.loss[i]);
      json_key(&j, "time_s"), json_num(&j, log.time[i]);
      json_key(&j, log.unit[0] == 't' ? "tokens_per_s" : "samples_per_s");
      json_num(&j, log.time[i] > 0 ? (double)log.items / log.time[i] : 0);
      if (ref && i < rlog.n) json_key(&j, "reference_loss"), json_num(&j, rlog.loss[i]);
      json_end_obj(&j);
    }
    json_end_arr(&j);
    if (ref && ok) {
      json_key(&j, "check");
      json_obj(&j);
      json_key(&j, "match"), json_bool(&j, check_ok);
      json_key(&j, "tolerance"), json_num(&j, 1e-5);
      json_key(&j, "max_loss_rel_err"), json_num(&j, loss_err);
      json_key(&j, "max_param_rel_err"), json_num(&j, param_err);
      json_key(&j, "worst_tensor"), worst ? json_str(&j, worst) : json_null(&j);
      json_key(&j, "worst_tensor_rel_err"), json_num(&j, tensor_err);
      json_end_obj(&j);
    }
    if (saved) json_key(&j, "saved"), json_str(&j, o->save);
    json_end_obj(&j);
    printf("\n");
  }
  run_log_free(&log);
  run_log_free(&rlog);
  world_free(ref);
  world_free(w);
  weft_free(c);
  return rc;
}

