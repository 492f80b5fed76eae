/* run.h - what `weft run` does around the executor: the world from files
 * or a seed, checkpoints, and the comparison with one device. */
#ifndef WEFT_RUN_H
#define WEFT_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "exec.h"

/* Parameters from a safetensors file by their model names: every parameter
 * present with its shape, no other tensor (entries `optim.*` aside, which
 * only --resume reads). False with a message naming the file and tensor. */
bool xworld_load_params(xworld *w, const char *path, char *err, size_t errlen);
/* Inputs by the model's input names (tokens and labels for gpt), the same
 * checks; ids must lie below the table or classes they index. */
bool xworld_load_inputs(xworld *w, const char *path, char *err, size_t errlen);
/* A checkpoint written by xworld_save: parameters, optimizer state and the
 * step count. *seed gets the seed it recorded (unchanged when absent). */
bool xworld_resume(xworld *w, const char *path, uint64_t *seed, char *err, size_t errlen);
/* Parameters as f32 by name, optimizer state as optim.exp_avg.NAME and
 * optim.exp_avg_sq.NAME (AdamW) or optim.momentum_buffer.NAME (SGD), the
 * step and seed in the metadata; written atomically. */
bool xworld_save(const xworld *w, const char *path, uint64_t seed, char *err, size_t errlen);

/* Largest per-tensor relative L2 difference of parameters (and optimizer
 * state when `state`), ||a - b|| / ||b|| (absolute when b is zero); *worst
 * names the tensor. */
double xworld_diff(const xworld *a, const xworld *b, bool state, const char **worst);

/* Relative L2 difference of all parameters taken as one vector. */
double xworld_diff_all(const xworld *a, const xworld *b);

/* Tokens (elements of the first i32 input) or samples (first dimension of
 * the first input) in a step; *unit is "tokens" or "samples". */
int64_t xworld_step_items(const weft_graph *g, const char **unit);

#endif
