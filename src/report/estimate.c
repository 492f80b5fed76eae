/* estimate.c - weft estimate: a plan lowered and simulated on its cluster;
 * the figures as text or JSON, the timeline as a trace or a picture. */
#include "common.h"

/* Writes a picture or trace to path, atomically; false (and a message)
 * when it cannot. */
static bool write_file(const char *path, const weft_sim *s, void (*print)(const weft_sim *, FILE *)) {
  char err[PATH_MAX + 256];
  file_out *out = file_out_open(path, err, sizeof err);
  if (out) {
    print(s, file_out_stream(out));
    if (file_out_commit(out, err, sizeof err)) return true;
  }
  fprintf(stderr, "weft estimate: %s\n", err);
  return false;
}

int report_estimate(const weft_opts *o) {
  /* the files it writes are checked before any work */
  if ((o->trace && !report_output_ok(o, "--trace", o->trace, true)) || (o->svg && !report_output_ok(o, "--svg", o->svg, true)))
    return WEFT_FAILED;
  weft_ctx *c = report_ctx(o);
  int rc = WEFT_OK;
  prof_mark("start");
  weft_plan *p = report_plan(c, o, &rc, &(plan_opts){.reps = true});
  if ((p && o->trace && !report_output_not_source(c, "--trace", o->trace, true)) ||
      (p && o->svg && !report_output_not_source(c, "--svg", o->svg, true))) {
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
      if (o->json) estimate_print_json(s, &e, stdout);
      else estimate_print_text(s, &e, stdout);
      if (o->trace && !write_file(o->trace, s, estimate_print_trace)) rc = WEFT_FAILED;
      if (o->svg && !write_file(o->svg, s, estimate_print_svg)) rc = WEFT_FAILED;
      prof_mark("report");
      sim_free(s);
    }
  }
  weft_free(c);
  prof_mark("free");
  return rc;
}

