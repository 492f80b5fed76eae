/* deps.h - data-dependency preservation: the communication a plan needs so
 * that every consumer sees what its single-device counterpart would. */
#ifndef WEFT_DEPS_H
#define WEFT_DEPS_H

#include "weft/plan.h"

/* One data-parallel replica of a plan (docs/design/plans.md, section 8):
 * every operator is split into P parts along one level, the sub-operators
 * at coordinate j of it are those at coordinate c moved to other devices
 * (renamed in the same order, node for node) and, for every tensor that
 * is communicated, shifted along one dimension by one offset; parameters
 * do not move. Then the communication of replica j is replica c's renamed
 * and shifted, and deps_derive need only derive replica c's. */
typedef struct deps_view {
  int P, c;
  const int *level;       /* per operator: its level along the replicas' axis */
  const int *stride;      /* per operator: from coordinate j to j + 1 of that
                           * level, the distance in its sub-operators */
  /* deps_derive's own: per sub-operator of the replica, its index among
   * every sub-operator (subs) */
  const int *full;
  const psub *subs;
} deps_view;

/* Fills p->comms: forward activations between sub-operators, the gradients
 * of activations back to their producers, the reduction of parameter
 * gradients across the devices that use them, and the statistics that the
 * vocabulary shards of a cross entropy gather (pcomm.stats). With a view
 * (NULL: every device), the activations' communication and the statistics
 * are replica c's alone, p->comm_copies = P says how many replicas each
 * stands for, and the parameters' gradients are summed over every replica
 * as without it. */
void deps_derive(arena *a, weft_plan *p, const deps_view *view);

/* The idim along which the parts of operator op gather per-row statistics
 * (a cross entropy split along its vocabulary, v), or -1. */
int deps_stats_idim(const weft_plan *p, int op);

/* Per kind: how many communications and the bytes they carry (the size of
 * the buffers: an all-reduce of a 4 MB gradient counts 4 MB). */
void deps_totals(const weft_plan *p, int64_t bytes[COMM_KIND_COUNT], int counts[COMM_KIND_COUNT], comm_phase phase);

#endif
