/* common.h - what the files of src/report share (common.c): the context of
 * a task and the reporting of its diagnostics. */
#ifndef WEFT_REPORT_COMMON_H
#define WEFT_REPORT_COMMON_H

#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <limits.h>

#include "base/files.h"
#include "base/json.h"
#include "base/prof.h"
#include "weft/deps.h"
#include "weft/lower.h"
#include "weft/report.h"
#include "weft/sim.h"
#include "weft/validate.h"

/* A workspace with the options' standard library, --set and error limit. */
weft_ctx *report_ctx(const weft_opts *o);
/* Prints c's diagnostics on stderr unless the output is JSON. */
void report_diags(weft_ctx *c, const weft_opts *o);
/* Loads o->files[0] and builds the plan --plan names (default: the last one
 * the file defines). NULL with *rc set after diagnostics. */
weft_plan *report_plan(weft_ctx *c, const weft_opts *o, int *rc, const plan_opts *po);
/* Whether every parameter of a model, cluster or plan has a value. */
bool report_bound(const vdecl *d);
/* The open decisions (`?`) in a syntax tree: their count, the first max
 * of their places in out. */
int report_holes(const ast *n, weft_loc *out, int max);
/* The `search` statement of a plan's body (in its loops and conditions
 * too, where evaluation refuses it), or NULL. */
const ast *report_search_stmt(const ast *plan);
/* "8,388,608" */
const char *report_grouped(char *buf, int64_t v);
/* Whether the task may write path, the value of option opt (--save,
 * --trace, --svg, -o), checked before any work: a regular file or a new
 * name (file_check_output), and not a file the task reads (the plan,
 * --inputs). Prints why not on stderr when say. */
bool report_output_ok(const weft_opts *o, const char *opt, const char *path, bool say);
/* The same once the plan is loaded: not a file it imports. */
bool report_output_not_source(weft_ctx *c, const char *opt, const char *path, bool say);
/* An error of the task, at loc. */
weft_diag *report_error(weft_ctx *c, weft_loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
