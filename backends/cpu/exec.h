/* exec.h - the CPU backend: runs the lowered program of a plan (lower.h),
 * every device a thread with its own memory, and a plan-free reference. */
#ifndef WEFT_EXEC_H
#define WEFT_EXEC_H

#include <stdbool.h>
#include <stdint.h>

#include "optim.h"
#include "weft/lower.h"

/* The whole tensors a run starts from and ends with ("the world"): what a
 * single device would hold. Indexed by graph tensor; NULL where a tensor
 * has no such role. Floating tensors are f32 whatever their dtype (bf16 and
 * f16 are stored as f32 on the CPU); i32 inputs are int32_t. */
typedef struct xworld {
  const weft_graph *g;
  float **param;          /* per parameter: numel values */
  float **state;          /* per parameter: optimizer state, copies x numel
                           * (AdamW: m then v; SGD with momentum: the buffer) */
  const xoptimizer *optimizer; /* the model's, NULL when it does not train */
  int state_copies;       /* state tensors per element: 2 AdamW, 1 SGD with momentum, 0 none */
  void **input;           /* per model input: float or int32_t, numel values */
  int64_t step;           /* optimizer steps taken so far */
} xworld;

xworld *xworld_new(const weft_graph *g);
void xworld_free(xworld *w);
/* Parameters initialised from the seed: matrices and embeddings normal with
 * std 0.02, biases 0, norm weights 1 (by the operator argument that reads
 * them); inputs: token ids uniform below the table or logits size they
 * index, floating inputs standard normal. Each tensor has its own stream
 * (k_rng), so values depend only on the seed and the tensor's name. */
void xworld_init_params(xworld *w, uint64_t seed);
void xworld_init_inputs(xworld *w, uint64_t seed);
/* The bound of the ids i32 input t holds: the rows of the table an
 * embedding looks them up in, or the classes of a cross entropy. */
int64_t xworld_id_bound(const weft_graph *g, int t);
/* An exact copy. */
xworld *xworld_clone(const xworld *w);

/* Called after each step with its loss and wall time. */
typedef void (*xstep_fn)(void *ctx, int64_t step, double loss, double seconds);

typedef struct xnet xnet;  /* several processes (net.h) */

typedef struct xrun_opts {
  int steps;
  xstep_fn on_step;       /* called by one thread after each step */
  void *ctx;
  bool allow_native;      /* operators with native kernels may load them */
  xnet *net;              /* under mpirun: this process runs its share of
                           * the devices; NULL: one process runs them all */
} xrun_opts;

/* Runs `steps` training steps of the programs on w (parameters, state and
 * inputs read at the first step; parameters and state written back after
 * the last). Returns false with a message in err (a kernel that cannot run,
 * a native kernel not allowed, copies of a parameter that diverged). */
bool xrun_program(const weft_program *pr, xworld *w, const xrun_opts *o, char *err, size_t errlen);

/* The same steps on one device without the plan: every operator on whole
 * tensors in graph order, the backward in reverse, then the optimizer. */
bool xrun_reference(const weft_graph *g, xworld *w, const xrun_opts *o, char *err, size_t errlen);

#endif
