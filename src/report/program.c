/* program.c - weft lower: the program of every device, as text, JSON or
 * the schedule's grid. */
#include "common.h"

int report_lower(const weft_opts *o) {
  weft_ctx *c = report_ctx(o);
  int rc = WEFT_OK;
  /* one device: its own program exactly, the others' only as far as its
   * classes need them (docs/design/plans.md, section 8) */
  plan_opts one = {.reps = true, .rooted = true, .root = o->device};
  weft_plan *p = report_plan(c, o, &rc, o->device >= 0 && !o->grid ? &one : NULL);
  lower_opts lo = {.full_programs = true};  /* printed */
  weft_program *pr = p ? lower_plan(p, &lo, &c->arena, &c->diags) : NULL;
  if (pr && !validate_program(pr, NULL, &c->diags)) pr = NULL;
  if (p && !pr) rc = WEFT_REJECTED;
  if (pr && o->device >= pr->nprogs) {
    weft_loc none = {0};
    report_error(c, none, "--device %d: the plan's cluster has devices 0 to %d", o->device, pr->nprogs - 1);
    rc = WEFT_REJECTED;
    pr = NULL;
  }
  report_diags(c, o);
  if (o->json && !pr) {
    diag_print_json(&c->diags, stdout);
    printf("\n");
  }
  if (pr) {
    if (o->grid) lower_print_grid(pr, stdout);
    else if (o->json) lower_print_json(pr, o->device, stdout);
    else lower_print_text(pr, o->device, stdout);
  }
  weft_free(c);
  return rc;
}

