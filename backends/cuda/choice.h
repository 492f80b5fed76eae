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
#include <stddef.h>

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

/* ---- choices agreed between processes ----
 *
 * In a run of several processes, a computation they replicate (tp2's
 * LayerNorms and LM head, in every process of the tensor-parallel group)
 * gives the same bits in each only if each runs it with the same kernels,
 * and a choice by timing is each process's own: two GPUs can time two
 * algorithms in opposite order. So, once the executor has said the run
 * spans several processes (choice_among), a chooser does not take its
 * choice at once: it proposes it (choice_propose: a key that names the
 * call the same way in every process, the options that passed its
 * checks, the fastest, the reference) and the reference runs meanwhile.
 * After the pass the executor gathers every process's proposals
 * (choice_proposals) and gives them to choice_settle: for each key, every
 * process that proposed for it takes the choice of the lowest process
 * that did, if each of them accepted that option, else the reference.
 * The same rule over the same records, so the same option everywhere.
 * A key is settled once: a replicated call is new in every process in
 * the same pass, and so proposed by each in it. WEFT_CUDA_AGREE=0 leaves
 * each process its own choices. */

/* The ints of one proposal in choice_proposals' records: kind + 1 (0: no
 * proposal), the key's low and high halves, the options that passed (a
 * bit each), the fastest. */
#define CHOICE_INTS 5

/* The run's process and count: choices are proposed and agreed when
 * nprocs > 1 (and WEFT_CUDA_AGREE is not 0); rank < 0 ends that. */
void choice_among(int rank, int nprocs);
/* This process's rank in a run of several processes; -1 otherwise. */
int choice_rank(void);
/* Whether choices are proposed and agreed. */
bool choice_agreeing(void);
/* A key's hash: h (CHOICE_HASH0 to start) extended by n bytes at p. */
#define CHOICE_HASH0 1469598103934665603ull
unsigned long long choice_hash(unsigned long long h, const void *p, size_t n);
/* A choice of kind for key: options `ok` (a bit each, the reference's
 * among them) passed, `best` is the fastest, `ref` the reference. While
 * choices are agreed it waits for choice_settle, which calls take(ctx,
 * option) with the option agreed; otherwise take(ctx, best) now. Returns
 * the option to run until then (ref while agreeing, else best). */
int choice_propose(int kind, unsigned long long key, unsigned ok, int best, int ref, void (*take)(void *, int),
                   void *ctx);
/* Proposals not settled yet. */
int choice_pending(void);
/* This process's proposals as records of CHOICE_INTS ints, at most max
 * of them, into out (max * CHOICE_INTS ints, zeros past the last). */
void choice_proposals(int *out, int max);
/* Settles every proposal by the records of all nprocs processes (per
 * records each, process p's at all + p * per * CHOICE_INTS); the number
 * of proposals that took another option than their own fastest. */
int choice_settle(const int *all, int nprocs, int per);

#ifdef __cplusplus
}
#endif

#endif
