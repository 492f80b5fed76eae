/* schedule.h - the learning rate of each training step of `weft run`
 * (docs/run.md, "Learning-rate schedules"): a linear warmup, then constant,
 * cosine or linear decay to a floor. */
#ifndef WEFT_REPORT_SCHEDULE_H
#define WEFT_REPORT_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

typedef enum { LR_CONSTANT, LR_COSINE, LR_LINEAR } lr_kind;

typedef struct lr_schedule {
  lr_kind kind;
  double lr;              /* the peak */
  double lr_min;          /* the floor cosine and linear decay to */
  int64_t warmup;         /* steps of the linear warmup */
  int64_t decay;          /* the step at which the decay reaches lr_min */
} lr_schedule;

/* The learning rate of the step that follows `taken` steps (taken counts
 * from 0):
 *   taken < warmup:           lr * (taken + 1) / warmup
 *   taken >= decay:           lr_min (constant: lr)
 *   else, p = (taken - warmup) / (decay - warmup):
 *     constant lr; linear lr + (lr_min - lr) p;
 *     cosine lr_min + (lr - lr_min) (1 + cos(pi p)) / 2. */
double lr_at(const lr_schedule *s, int64_t taken);

/* "constant", "cosine", "linear"; false for another name. */
bool lr_kind_parse(const char *name, lr_kind *out);
const char *lr_kind_name(lr_kind k);

#endif
