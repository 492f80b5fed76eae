/* estimate.c - weft estimate: a plan lowered and simulated on its cluster;
 * the figures as text or JSON, the timeline as a trace or a picture. */
#include "common.h"

/* Writes a picture or trace of the rows to path, atomically; false (and
 * a message) when it cannot. */
static bool write_file(const char *path, const weft_sim *s, const sim_row *rows, int nrows,
                       void (*print)(const weft_sim *, const sim_row *, int, FILE *)) {
  if (strcmp(path, "-") == 0) {
    print(s, rows, nrows, stdout);
    return fflush(stdout) == 0;
  }
  char err[PATH_MAX + 256];
  file_out *out = file_out_open(path, err, sizeof err);
  if (out) {
    print(s, rows, nrows, file_out_stream(out));
    if (file_out_commit(out, err, sizeof err)) return true;
  }
  fprintf(stderr, "weft estimate: %s\n", err);
  return false;
}

/* --devices LIST: "all", or numbers and ranges A..B (A to B - 1) separated
 * by commas, each below ndev. Sets *want (NULL for the default rows) and
 * *n; false after a message. */
static bool parse_devices(const char *spec, int ndev, int **want, int *n) {
  *want = NULL;
  *n = 0;
  if (!spec) return true;
  if (strcmp(spec, "all") == 0) {
    *want = malloc(sizeof(int) * (size_t)(ndev ? ndev : 1));
    if (!*want) weft_oom();
    for (int d = 0; d < ndev; d++) (*want)[d] = d;
    *n = ndev;
    return true;
  }
  int cap = 16;
  int *w = malloc(sizeof(int) * (size_t)cap);
  if (!w) weft_oom();
  const char *at = spec;
  for (;;) {
    char *end;
    errno = 0;
    long lo = strtol(at, &end, 10), hi;
    bool ok = end != at && errno == 0 && lo >= 0 && lo < ndev;
    if (ok && end[0] == '.' && end[1] == '.') {
      const char *h = end + 2;
      hi = strtol(h, &end, 10);
      ok = end != h && errno == 0 && hi > lo && hi <= ndev;
    } else {
      hi = lo + 1;
    }
    if (!ok || (*end != ',' && *end != 0)) {
      fprintf(stderr, "weft estimate: error: --devices %s: give device numbers 0 to %d, ranges such as 0..8 (devices 0 to 7) "
                      "separated by commas, or all\n", spec, ndev - 1);
      free(w);
      return false;
    }
    for (long d = lo; d < hi; d++) {
      if (*n == cap) {
        cap *= 2;
        int *nw = realloc(w, sizeof(int) * (size_t)cap);
        if (!nw) weft_oom();
        w = nw;
      }
      w[(*n)++] = (int)d;
    }
    if (*end == 0) break;
    at = end + 1;
  }
  *want = w;
  return true;
}

int report_estimate(const weft_opts *o) {
  /* the files it writes are checked before any work */
  bool trace = o->trace && strcmp(o->trace, "-") != 0, svg = o->svg && strcmp(o->svg, "-") != 0;
  if ((trace && !report_output_ok(o, "--trace", o->trace, true)) || (svg && !report_output_ok(o, "--svg", o->svg, true)))
    return WEFT_FAILED;
  weft_ctx *c = report_ctx(o);
  int rc = WEFT_OK;
  prof_mark("start");
  weft_plan *p = report_plan(c, o, &rc, &(plan_opts){.reps = true});
  if ((p && trace && !report_output_not_source(c, "--trace", o->trace, true)) ||
      (p && svg && !report_output_not_source(c, "--svg", o->svg, true))) {
    weft_free(c);
    return WEFT_FAILED;
  }
  /* a plan that does not fit is estimated all the same, and rejected */
  weft_program *pr = p ? lower_plan(p, NULL, &c->arena, &c->diags) : NULL;
  if (pr && !validate_program(pr, &(validate_opts){.skip_memory = true}, &c->diags)) pr = NULL;
  if (p && !pr) rc = WEFT_REJECTED;
  hw_model hw;
  if (pr && !o->symbolic && !hw_from_plan(&c->diags, p, pr, &hw)) {
    rc = WEFT_REJECTED;
    pr = NULL;
  }
  weft_sim *s = NULL;
  if (pr) {
    /* per-instruction times only for the pictures that draw them */
    s = sim_run_with(pr, o->symbolic ? NULL : &hw, o->trace || o->svg ? SIM_TIMELINE : 0);
    prof_mark("simulate");
    if (s && !validate_memory_sim(s, &c->diags)) rc = WEFT_REJECTED;
  }
  report_diags(c, o);
  if (o->json && !pr) {
    diag_print_json(&c->diags, stdout);
    printf("\n");
  }
  if (pr) {
    if (!s) {
      fprintf(stderr, "weft estimate: the programs of plan %s do not finish in the simulation\n", p->name);
      rc = WEFT_FAILED;
    } else {
      weft_estimate e;
      sim_estimate(s, &e);
      if (o->symbolic) {
        /* the scalar of symbolic costs: the step on the nominal machine */
        hw_model nominal;
        hw_nominal(p, &nominal);
        weft_sim *ns = sim_run_with(pr, &nominal, 0);
        if (ns) {
          weft_estimate ne;
          sim_estimate(ns, &ne);
          e.symbolic_step = ne.step_time;
          e.symbolic_bubble = ne.bubble_fraction;
          sim_free(ns);
        }
      }
      if (o->json) estimate_print_json(s, &e, stdout);
      else estimate_print_text(s, &e, stdout);
      if (o->trace || o->svg) {
        int *want, nwant;
        if (!parse_devices(o->devices, pr->nprogs, &want, &nwant)) {
          rc = WEFT_REJECTED;
        } else {
          sim_row *rows = malloc(sizeof(sim_row) * (size_t)(want ? nwant + 1 : SIM_ROWS_DEFAULT + 1));
          if (!rows) weft_oom();
          int nrows = sim_rows(s, want, nwant, rows);
          if (o->trace && !write_file(o->trace, s, rows, nrows, estimate_print_trace)) rc = WEFT_FAILED;
          if (o->svg && !write_file(o->svg, s, rows, nrows, estimate_print_svg)) rc = WEFT_FAILED;
          free(rows);
          free(want);
        }
      }
      prof_mark("report");
      sim_free(s);
    }
  }
  weft_free(c);
  prof_mark("free");
  return rc;
}

