/* xops.h - one operator of the model on packed f32 parts: the table that
 * maps the operators of stdlib/ops.plan to their kernels, forward and backward. */
#ifndef WEFT_XOPS_H
#define WEFT_XOPS_H

#include <stdbool.h>
#include <stdint.h>

#include "weft/lower.h"

enum { XOP_MAX_INPUTS = 16 };

/* An operator kind the CPU backend runs: its kernels and what else the
 * backend knows of it (xops.c holds the table). */
typedef struct xop xop;

/* The kernels of graph operator op, found by its kind (the operator's name
 * in stdlib/ops.plan), or its native kernels when it declares some. NULL
 * with a message when the CPU backend has none. Callers look each operator
 * up once and keep the answer. */
const xop *xop_find(const weft_graph *g, int op, char *err, size_t errlen);

/* Whether its result is a loss (cross_entropy, mse): the loss of a step is
 * the sum of such results, and its backward runs without a gradient of the
 * result. */
bool xop_is_loss(const xop *k);

/* One call: forward (out) or backward (din from dy), or the statistics of
 * a part (out) that the parts of its rows gather (lins_part). Pointers are
 * packed row-major parts whose regions (of the graph tensors) are given; a
 * NULL input is an argument this part does not apply (the bias of a later
 * part of a reduction split); a NULL din is a gradient not wanted. */
typedef struct xcall {
  const weft_graph *g;
  int op;
  const xop *kern;                  /* xop_find's answer for op */
  bool backward;
  uint8_t part;                     /* lins_part */
  int nin;
  const void *in[XOP_MAX_INPUTS];
  const tregion *inr[XOP_MAX_INPUTS];
  float *out;                       /* forward: the result part; LP_STATS: the statistics */
  const tregion *outr;
  const float *dy;                  /* backward: the gradient of the result part, NULL: none */
  const tregion *dyr;
  float *din[XOP_MAX_INPUTS];       /* backward: gradients of the inputs */
  const float *stats;               /* LP_COMBINE: the gathered statistics */
  const tregion *statsr;
  bool acc;                         /* add to out / din instead of overwriting */
  const int64_t *ranges;            /* the part's iteration ranges, lo and hi per idim (native kernels) */
  int nidims;
  bool allow_native;
  double loss;                      /* forward of a loss: this part's share */
} xcall;

/* Runs the call; false with a message (a native kernel without
 * --allow-native or that fails to load, an operator that cannot
 * accumulate asked to). */
bool xop_run(xcall *c, char *err, size_t errlen);

/* How a parameter read as input `arg` of operator op starts: 'n' ones (the
 * weight of a norm), 'b' zeros (a bias), 'w' normal (anything else). */
char xop_param_init(const weft_graph *g, int op, int arg);

/* For an i32 input read as input `arg` of operator op: the bound its ids
 * must lie below (the rows of the table an embedding looks them up in, the
 * classes of a cross entropy); 0 when that input holds no ids. */
int64_t xop_id_bound(const weft_graph *g, int op, int arg);

/* A numeric attribute of an operator, or dflt. */
double xop_attr(const weft_graph *g, int op, const char *name, double dflt);

#endif
