/* optim.h - the optimizers of the CPU backend: one table holds, per
 * optimizer operator of stdlib/ops.plan, its state and its step. */
#ifndef WEFT_OPTIM_H
#define WEFT_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "weft/graph.h"

typedef struct xoptim xoptim;

/* One optimizer. Its state tensors lie one after the other, each a packed
 * copy of the parameter region (AdamW: m, then v). */
typedef struct xoptimizer {
  const char *name;                   /* the optimizer operator */
  int (*state)(const xoptim *o);      /* state tensors per element */
  const char *state_names[2];         /* each one's name in a checkpoint
                                       * (optim.NAME.PARAM, PyTorch's names) */
  void (*step)(const xoptim *o, float *param, float *state, const float *grad, int64_t n, int64_t step);
} xoptimizer;

/* An optimizer with the settings of the model's `train` statement. */
struct xoptim {
  const xoptimizer *kind;
  double lr, beta1, beta2, eps, weight_decay, momentum;
};

/* Reads the graph's optimizer; false when the model does not train or
 * trains with an optimizer the table lacks. */
bool xoptim_from_graph(const weft_graph *g, xoptim *o);

/* State tensors per element of a parameter. */
int xoptim_state(const xoptim *o);

/* One step on n elements in place; step counts from 1. */
void xoptim_step(const xoptim *o, float *param, float *state, const float *grad, int64_t n, int64_t step);

/* Mixed precision: the CPU backend holds every float in f32, and a 16-bit
 * parameter's values are rounded to its dtype (to nearest, ties to even)
 * when they are loaded and after each step; with master weights the step
 * updates the f32 master and the parameter is rounded from it. n values
 * in place; nothing for f32. */
void xoptim_round(float *v, int64_t n, weft_dtype dt);

#endif
