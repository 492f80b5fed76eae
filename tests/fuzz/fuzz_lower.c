/* fuzz_lower.c - libFuzzer target: every plan of the input that builds is
 * lowered, validated, simulated on its cluster's hardware and printed as
 * weft lower and weft estimate print it (text, JSON, trace, picture); the
 * answer is diagnostics or figures, never a crash. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "weft/cost.h"
#include "weft/lower.h"
#include "weft/report.h"
#include "weft/sim.h"
#include "weft/validate.h"
#include "weft/workspace.h"

/* Whether every parameter of the plan has a value. */
static bool bound(const vdecl *d) {
  const ast_list *ps = &d->node->list;
  for (int k = 0; k < ps->n; k++)
    if (!ps->items[k]->a) return false;
  return true;
}

/* As weft lower prints it (full programs), and as weft estimate simulates
 * it (every other build). */
static void lower_and_estimate(weft_ctx *c, weft_plan *p, bool full, FILE *sink) {
  lower_opts lo = {.full_programs = full};
  weft_program *pr = lower_plan(p, &lo, &c->arena, &c->diags);
  if (!pr || !validate_program(pr, &(validate_opts){.skip_memory = true}, &c->diags)) return;
  if (full) {
    lower_print_text(pr, -1, sink);
    lower_print_json(pr, -1, sink);
    lower_print_grid(pr, sink);
    return;
  }
  hw_model hw;
  bool symbolic = !hw_from_plan(&c->diags, p, pr, &hw);
  weft_sim *s = sim_run_with(pr, symbolic ? NULL : &hw, SIM_TIMELINE);
  if (!s) return;
  validate_memory_sim(s, &c->diags);
  weft_estimate e;
  sim_estimate(s, &e);
  estimate_print_text(s, &e, sink);
  estimate_print_json(s, &e, sink);
  sim_row *rows = malloc(sizeof(sim_row) * (SIM_ROWS_DEFAULT + 1));
  if (rows) {
    int nrows = sim_rows(s, NULL, 0, rows);
    estimate_print_trace(s, rows, nrows, sink);
    estimate_print_svg(s, rows, nrows, sink);
    free(rows);
  }
  sim_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* what a pathological input may take before weft refuses it */
  arena_budget_set((size_t)1 << 30);
  weft_ctx *c = weft_new();
  c->diags.max_errors = 20;
  FILE *sink = fopen("/dev/null", "w");
  if (sink && weft_load_text(c, "fuzz.plan", (const char *)data, size) == WEFT_OK) {
    weft_item items[8];
    int n = weft_items(c, V_PLAN, items, 8);
    for (int i = 0; i < n && i < 8; i++) {
      if (!bound(items[i].val.decl)) continue;
      weft_plan *p = weft_build_plan(c, items[i].val, items[i].loc, &(plan_opts){.reps = true});
      if (p) lower_and_estimate(c, p, false, sink);
      p = weft_build_plan(c, items[i].val, items[i].loc, NULL);
      if (p) lower_and_estimate(c, p, true, sink);
    }
  }
  if (sink) {
    diag_print(&c->diags, sink, false);
    diag_print_json(&c->diags, sink);
    fclose(sink);
  }
  weft_free(c);
  return 0;
}
