/* exec.h - the CPU backend's executor: runs the lowered program of a plan
 * (lower.h), every device a thread with its own memory, and a plan-free
 * reference. weft reaches it through the backend table (cpu.c). */
#ifndef WEFT_EXEC_H
#define WEFT_EXEC_H

#include <stdbool.h>
#include <stddef.h>

#include "weft/backend.h"

/* A program opened on a world (backend.h, backend_run). */
typedef struct backend_run xrun;

/* Opens the program on w: finds every operator's kernels and, under
 * mpirun, joins the other processes and takes this one's share of the
 * devices. NULL with a message (a model that does not train, an operator
 * without a kernel, MPI that cannot start). */
xrun *xrun_open(const weft_program *pr, weft_world *w, const backend_opts *o, char *err, size_t errlen);

/* Runs one pass (backend.h, backend_step): a training step, or the
 * forward of an evaluation. Parameters and state are read from the world
 * at the first step of the run, inputs at every pass. With clipping, each
 * device runs the instructions that do not depend on an optimizer step
 * first (clip.h), then all meet to take the norm, then the rest. False
 * with a message (a kernel that fails, a native kernel not allowed); a run
 * that failed runs no more. */
bool xrun_steps(xrun *r, const backend_step *s, backend_result *out, char *err, size_t errlen);

/* Parameters and optimizer state back into the world, from the buffers
 * the optimizer stepped; false when copies of a parameter diverged. */
bool xrun_read(xrun *r, char *err, size_t errlen);
/* Meets every process of the run (backend.h, agree). */
bool xrun_agree(xrun *r, bool ok);

void xrun_close(xrun *r);

/* The same pass on one device without the plan: every operator on whole
 * tensors in graph order, the backward in reverse, then the norm of all
 * gradients (in tensor order), clipping and the optimizer. */
bool xrun_reference(const weft_graph *g, weft_world *w, const backend_step *s, backend_result *out,
                    const backend_opts *o, char *err, size_t errlen);

#endif
