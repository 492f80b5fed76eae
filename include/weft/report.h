/* report.h - the layer the command line calls: each function drives the
 * stages (evaluate, apply, lower, validate, estimate, run) for one task and
 * reports its result, as text or JSON. Tools and tests may call it too. */
#ifndef WEFT_REPORT_H
#define WEFT_REPORT_H

#include "weft/plan.h"
#include "weft/workspace.h"

/* Evaluates a plan value and applies its decisions: the plan, or NULL after
 * diagnostics in c. o may be NULL. */
weft_plan *weft_build_plan(weft_ctx *c, value plan, weft_loc use, const plan_opts *o);

#endif
