/* cluster.h - a cluster as the stages after evaluation read it: devices,
 * nodes and memory as fields, every other figure (rates, links) in the
 * record the evaluator checked (src/eval/cluster.c). */
#ifndef WEFT_CLUSTER_H
#define WEFT_CLUSTER_H

#include <stdint.h>

#include "weft/value.h"

typedef struct weft_cluster {
  const char *name;
  int ndevices;
  int devices_per_node;
  int64_t device_memory;  /* bytes per device, 0 when unknown */
  const vrecord *rec;     /* the record of weft_build_cluster */
} weft_cluster;

/* The cluster of a record weft_build_cluster made. */
weft_cluster weft_cluster_of(const vrecord *rec);

#endif
