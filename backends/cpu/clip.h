/* clip.h - what the global norm of the gradients needs of a lowered
 * program: which elements of each optimizer step's gradient count in the
 * norm, and, to clip by it, which instructions must wait until it is known. */
#ifndef WEFT_CLIP_H
#define WEFT_CLIP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "weft/lower.h"

/* The elements of one step's gradient that count in the norm. Every
 * element of every parameter is counted by exactly one step instruction of
 * the whole plan: the first, by device then program order, that updates it
 * (copies of a parameter under data or tensor parallelism hold the same
 * gradient, and are counted once). */
typedef struct clip_own {
  int64_t n;              /* elements of the step's region */
  int64_t count;          /* how many of them it counts */
  uint8_t *mask;          /* per element 1 or 0; NULL when count is 0 or n */
} clip_own;

/* For each device of the plan, per instruction: the counted elements of a
 * step (n = 0 for other instructions). want[d] false: device d's entries
 * are left NULL (every device's steps are still walked). */
clip_own **clip_owners(const weft_program *pr, const bool *want);
void clip_owners_free(const weft_program *pr, clip_own **own);

/* The instructions of each device's program that must run after the norm
 * is known: every optimizer step, and every instruction that shares a
 * buffer with one of those before it in the program (a gather of updated
 * parameters, the free of a gradient), and a communication on every member
 * when it must on one (so that devices never wait for each other across
 * the point where the norm is taken). tail[d][i]. NULL with a message when
 * a step's gradient would be completed only after that point. */
bool **clip_tail(const weft_program *pr, char *err, size_t errlen);
void clip_tail_free(const weft_program *pr, bool **tail);

#endif
