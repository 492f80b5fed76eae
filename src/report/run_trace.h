/* run_trace.h - weft run --trace (run_trace.c): the timeline of one step,
 * as the backend measured it. */
#ifndef WEFT_REPORT_RUN_TRACE_H
#define WEFT_REPORT_RUN_TRACE_H

#include "common.h"

typedef struct run_trace run_trace;

/* What the file says of the run beside its events. */
typedef struct run_trace_about {
  const char *plan, *backend, *machine;
  const char *times;      /* what the backend's times cover */
  int64_t step;
  int rank, processes;    /* this process of the run's (0 of 1 alone) */
  int64_t epoch_us;       /* the wall clock at the step's start (ts 0), microseconds since 1970 */
} run_trace_about;

run_trace *run_trace_new(const weft_program *pr);
void run_trace_free(run_trace *t);
/* One instruction as backend_trace_fn reports it. */
void run_trace_add(run_trace *t, int device, int ins, const char *lane, double start, double end);
int run_trace_count(const run_trace *t);   /* the pieces reported */
/* Writes the events as Chrome trace JSON to path, atomically (one process
 * per device, one thread per lane, events named as weft estimate names
 * them); false with a message. */
bool run_trace_write(run_trace *t, const char *path, const run_trace_about *ab, char *err, size_t errlen);
/* The seconds of its instructions by category (lower_category; summed
 * over devices and lanes), from the first start to the last end, and the
 * instructions its pieces are of. */
void run_trace_totals(run_trace *t, double *by_cat, double *span, int *instructions);

#endif
