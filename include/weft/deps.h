/* deps.h - data-dependency preservation: the communication a plan needs so
 * that every consumer sees what its single-device counterpart would. */
#ifndef WEFT_DEPS_H
#define WEFT_DEPS_H

#include "weft/plan.h"

/* Fills p->comms: forward activations between sub-operators, the gradients
 * of activations back to their producers, the reduction of parameter
 * gradients across the devices that use them, and the statistics that the
 * vocabulary shards of a cross entropy gather (pcomm.stats). */
void deps_derive(arena *a, weft_plan *p);

/* The idim along which the parts of operator op gather per-row statistics
 * (a cross entropy split along its vocabulary, v), or -1. */
int deps_stats_idim(const weft_plan *p, int op);

/* Per kind: how many communications and the bytes they carry (the size of
 * the buffers: an all-reduce of a 4 MB gradient counts 4 MB). */
void deps_totals(const weft_plan *p, int64_t bytes[COMM_KIND_COUNT], int counts[COMM_KIND_COUNT], comm_phase phase);

#endif
