/* xops.h - one operator of the model on packed f32 parts: maps the
 * operators of stdlib/ops.plan to the kernels, forward and backward. */
#ifndef WEFT_XOPS_H
#define WEFT_XOPS_H

#include <stdbool.h>
#include <stdint.h>

#include "weft/plan.h"

enum { XOP_MAX_INPUTS = 16 };

/* The shards of a cross entropy split along the vocabulary meet through
 * this: `mine` is the shard's row maxima, sums of exponentials against
 * them, and label logits (3 t floats); *all gets those of every shard
 * ordered by vocabulary (p x 3t floats, malloc'd, the caller frees). Returns
 * p, or -1 with a message. */
typedef int (*xce_exchange)(void *ctx, int64_t v_lo, const float *mine, int64_t n, float **all);

/* One call: forward (out) or backward (din from dy). Pointers are packed
 * row-major parts whose regions (of the graph tensors) are given; a NULL
 * input is an argument this part does not apply (the bias of a later part
 * of a reduction split); a NULL din is a gradient not wanted. */
typedef struct xcall {
  const weft_graph *g;
  int op;
  bool backward;
  int nin;
  const void *in[XOP_MAX_INPUTS];
  const tregion *inr[XOP_MAX_INPUTS];
  float *out;                       /* forward: the result part */
  const tregion *outr;
  const float *dy;                  /* backward: the gradient of the result part, NULL: none */
  const tregion *dyr;
  float *din[XOP_MAX_INPUTS];       /* backward: gradients of the inputs */
  bool acc;                         /* add to out / din instead of overwriting */
  const int64_t *ranges;            /* the part's iteration ranges, lo and hi per idim (native kernels) */
  int nidims;
  bool allow_native;
  xce_exchange exchange;            /* vocabulary-split cross entropy */
  void *xctx;
  double loss;                      /* forward of a loss: this part's share */
  bool loss_counts;                 /* whether the share is one to add (not a vocabulary shard's copy) */
} xcall;

/* Runs the call; false with a message (an operator the CPU backend does
 * not know, a native kernel without --allow-native or that fails to load). */
bool xop_run(xcall *c, char *err, size_t errlen);

/* Whether operator op has a loss result (cross_entropy, mse). */
bool xop_is_loss(const weft_graph *g, int op);

/* A numeric attribute of an operator, or dflt. */
double xop_attr(const weft_graph *g, int op, const char *name, double dflt);

#endif
