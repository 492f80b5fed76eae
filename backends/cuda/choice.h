/* choice.h - the one-time work of a run's first passes, where the plugin
 * chooses its kernels: cuBLASLt's algorithms timed for a large product,
 * attention's ways timed for a shape of heads (attention_pick.cu), cuDNN
 * loaded and its plans built. Later passes reuse what was chosen, so a
 * pass's wall time is its steady one plus this work: each piece is
 * bracketed by choice_begin and choice_end, which add its host time to its
 * kind's total (the executor gives a pass's sum as backend_result's
 * setup_seconds; weft run prints it beside the step) and show it to a
 * profiler as an NVTX range in the category "choosing kernels". A bracket
 * inside another (cuDNN's plan built while attention's ways are timed)
 * is a range of its own but counts once, in the outer one's time.
 *
 * Timing a kernel needs the work queued before it done first; that wait
 * is not counted (the queued work is the pass's own), and it is bounded:
 * choice_settled waits at most CHOICE_WAIT_S (or the run's --timeout, if
 * shorter), so that a run whose earlier work hangs (a peer process that
 * stopped) is left to the executor's watchdog instead of held here; once
 * a wait has run out nothing more is timed in the run.
 *
 * Host code of one thread (the executor's). */
#ifndef WEFT_CUDA_CHOICE_H
#define WEFT_CUDA_CHOICE_H

#include <stdbool.h>

#include "cuda/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { CHOICE_GEMM, CHOICE_ATTENTION, CHOICE_CUDNN, CHOICE_KINDS };

#define CHOICE_WAIT_S 30.0

typedef struct choice_mark {
  double t0;  /* the host clock at the start, seconds */
  int kind;
  bool outer; /* not inside another bracket: its time counts */
} choice_mark;

/* Starts a piece of one-time work of a kind, `what` its range's name. */
choice_mark choice_begin(int kind, const char *what);
void choice_end(choice_mark m);
/* The seconds counted since the last call, in all and (by_kind, when not
 * NULL, CHOICE_KINDS of them) by kind; the counts start again from 0. */
double choice_take(double *by_kind);

/* Whether the work stream s had before now is done, waited for at most
 * the limit below; false also once a wait has run out before (and, for a
 * GPU's error, after gpu_raise). */
bool choice_settled(gpu_stream *s);
/* The run's --timeout: the limit becomes the shorter of it and
 * CHOICE_WAIT_S; and whether no wait has run out yet. */
void choice_wait_limit(double seconds);
double choice_wait_s(void);
bool choice_waits(void);

#ifdef __cplusplus
}
#endif

#endif
