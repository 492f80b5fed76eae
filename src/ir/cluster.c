/* cluster.c - a cluster's record, checked by the evaluator
 * (src/eval/cluster_eval.c), read into the fields later stages use. */
#include "weft/cluster.h"

weft_cluster weft_cluster_of(const vrecord *r) {
  weft_cluster cl = {.rec = r};
  const value *v = record_get(r, "name");
  cl.name = v && v->kind == V_STRING ? v->s : "";
  if ((v = record_get(r, "devices")) && v->kind == V_INT) cl.ndevices = (int)v->i;
  if ((v = record_get(r, "devices_per_node")) && v->kind == V_INT) cl.devices_per_node = (int)v->i;
  const value *dev = record_get(r, "device");
  if (dev && dev->kind == V_RECORD && (v = record_get(dev->rec, "memory")) && v->kind == V_QUANTITY)
    cl.device_memory = (int64_t)v->q.v;
  return cl;
}
