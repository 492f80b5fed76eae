/* schedule.c - learning-rate schedules (schedule.h). */
#include <math.h>
#include <string.h>

#include "schedule.h"

static const char *const names[] = {"constant", "cosine", "linear"};

double lr_at(const lr_schedule *s, int64_t taken) {
  if (taken < s->warmup) return s->lr * (double)(taken + 1) / (double)s->warmup;
  if (s->kind == LR_CONSTANT) return s->lr;
  if (taken >= s->decay) return s->lr_min;
  double p = (double)(taken - s->warmup) / (double)(s->decay - s->warmup);
  if (s->kind == LR_LINEAR) return s->lr + (s->lr_min - s->lr) * p;
  return s->lr_min + (s->lr - s->lr_min) * 0.5 * (1.0 + cos(M_PI * p));
}

bool lr_kind_parse(const char *name, lr_kind *out) {
  for (int k = 0; k < 3; k++)
    if (strcmp(name, names[k]) == 0) {
      *out = (lr_kind)k;
      return true;
    }
  return false;
}

const char *lr_kind_name(lr_kind k) { return names[k]; }
