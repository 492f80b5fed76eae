/* build.c - a plan from its source: the evaluator's decisions applied
 * against the graph and cluster it built. */
#include "weft/report.h"

weft_plan *weft_build_plan(weft_ctx *c, value plan, weft_loc use, const plan_opts *o) {
  weft_plan_src src;
  if (!weft_eval_plan(c, plan, use, &src)) {
    /* the placer's scratch memory is kept even so */
    if (src.decisions.placer.done) src.decisions.placer.done(src.decisions.placer.ctx);
    return NULL;
  }
  if (src.search_at >= 0) {
    /* what weft search is to write is not there yet */
    weft_diag *d = diag_add(&c->diags, DIAG_ERROR, src.search_loc,
                            "plan %s is not complete: `search` leaves the rest of it to weft search",
                            src.decisions.name ? src.decisions.name : "plan");
    diag_hint(d, &c->diags, "run weft search on this file first: it writes the plan complete (docs/search.md)");
    if (src.decisions.placer.done) src.decisions.placer.done(src.decisions.placer.ctx);
    return NULL;
  }
  int before = c->diags.errors;
  weft_plan *p = plan_apply(src.graph, &src.cluster, &src.decisions, o, &c->arena, &c->diags);
  return p && c->diags.errors == before ? p : NULL;
}
