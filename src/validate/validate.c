/* validate.c - the validate stage: the rules of a sound plan (DESIGN.md,
 * "Semantics the checker must enforce") that are checked on its lowered
 * programs. Rule 5, memory, is the simulated step's: the simulator is run
 * here, after lowering, never by it. */
#include <stdio.h>

#include "weft/validate.h"

bool validate_memory_sim(const weft_sim *s, weft_diags *dg) {
  const weft_program *pr = s->pr;
  const weft_plan *p = pr->p;
  int64_t cap = lower_device_memory(p);
  if (cap <= 0) return true;
  /* the first simulated device with the most (weft estimate's peak
   * device); replicas count with their representative */
  int wk = -1, over = 0;
  for (int k = 0; k < s->ndev; k++) {
    if (s->dev[k].peak <= cap) continue;
    over += s->dev[k].weight;
    if (wk < 0 || s->dev[k].peak > s->dev[wk].peak) wk = k;
  }
  if (wk < 0) return true;
  const sim_dev *D = &s->dev[wk];
  char b1[64], b2[64], overs[64] = "", where[600], roles[400];
  if (over > 1) snprintf(overs, sizeof overs, " (%d devices do not fit)", over);
  weft_diag *g = diag_add(dg, DIAG_ERROR, p->loc, "device %d needs %s at its peak, more than its %s of memory%s", D->device,
                            unit_bytes_human(D->peak, b1, sizeof b1), unit_bytes_human(cap, b2, sizeof b2), overs);
  diag_hint(g, dg, "split more (tensor or pipeline parallelism), recompute activations, use more "
                          "micro-batches, or shard with ZeRO");
  sim_peak_where(s, D, where, sizeof where);
  diag_add(dg, DIAG_NOTE, p->loc, "at the peak of device %d%s%s: %s", D->device, where[0] ? ", reached at " : "",
           where, sim_roles_text(D->peak_by_role, roles, sizeof roles));
  return false;
}

bool validate_memory(const weft_program *pr, weft_diags *dg) {
  if (lower_device_memory(pr->p) <= 0) return true;
  weft_sim *s = sim_run_plan(pr, 0);
  bool fits = !s || validate_memory_sim(s, dg);
  sim_free(s);
  return fits;
}
