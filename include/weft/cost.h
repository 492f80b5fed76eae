/* cost.h - what a lowered program's works and communication cost on its
 * cluster: a hardware model read from the cluster record, a roofline cost
 * per work with shape-dependent efficiency, and collective costs by
 * algorithm and group placement. The assumptions are in docs/estimate.md. */
#ifndef WEFT_COST_H
#define WEFT_COST_H

#include <stdbool.h>

#include "weft/lower.h"

/* One level of links: what one device can send in one direction. */
typedef struct hw_link {
  bool present;
  const char *name;
  double bandwidth;       /* bytes/s, per device, per direction */
  double latency;         /* seconds per message (per step of an algorithm) */
  double efficiency;      /* fraction of bandwidth large transfers reach (1 when not given) */
} hw_link;

/* The hardware model of one plan's cluster. Every number comes from the
 * cluster record; a field the record leaves out takes the ideal value (no
 * loss), never a figure chosen in C. */
typedef struct hw_model {
  const char *cluster;
  const char *device;
  int devices_per_node;
  double memory;          /* bytes per device */
  double mem_bw;          /* bytes/s */
  double peak[DT_COUNT];  /* dense FLOP/s per dtype, 0 when the device has none */
  double vector_rate;     /* FLOP/s of kernels that are not matrix products (compute.f32) */
  /* device.kernels */
  double matmul_eff;      /* fraction of peak a large, tile-aligned matrix product reaches */
  int units;              /* processors a matrix product's tiles are dealt to (SMs); 0: no waves */
  int tile_m, tile_n;     /* output tile of one processor; 0: no tiling */
  double tile_k_overhead; /* fixed cost of one tile in units of k (pipeline fill, epilogue) */
  double memory_eff;      /* fraction of mem_bw streaming kernels reach */
  double launch;          /* seconds of fixed cost per kernel */
  double score_passes;    /* attention: times each score crosses memory forward (0: fused) */
  double score_passes_bwd;
  hw_link node, net;      /* level "node" and level "cluster" */
} hw_model;

/* Reads the model from the plan's cluster; false when the cluster lacks what
 * the plan's dtypes need (with a diagnostic at the plan when dg is not NULL). */
bool hw_from_plan(weft_diags *dg, const weft_plan *p, const weft_program *pr, hw_model *hw);
/* The same for graph g on cluster c before any plan (the search); errors
 * name `what` at loc. */
bool hw_from_cluster(weft_diags *dg, const weft_graph *g, const weft_cluster *c, const char *what, weft_loc loc,
                     hw_model *hw);

/* The nominal machine of symbolic costs: units that weigh FLOPs against the
 * bytes kernels move and links carry, without a cluster's figures
 * (docs/estimate.md, docs/search.md): 1 PFLOP/s, 2 TB/s of memory, 100 GB/s
 * inside a node and 10 GB/s across, every rate reached, no latency. */
#define SYM_FLOPS 1e15
#define SYM_MEM_BW 2e12
#define SYM_NODE_BW 1e11
#define SYM_NET_BW 1e10

/* The nominal machine with the plan's nodes (devices per node and memory
 * of its cluster): `--cost symbolic`'s step, a scalar that orders plans. */
void hw_nominal(const weft_plan *p, hw_model *hw);

/* The cost of one instruction. */
typedef struct kcost {
  double flops;           /* floating-point work */
  double bytes;           /* memory traffic of the device */
  double seconds;         /* 0 in the symbolic model */
  double net_bytes[2];    /* bytes this device sends: inside its node, across nodes */
  int kernels;            /* kernels launched (compute) or 0 */
} kcost;

/* The cost of a work on hw (NULL: symbolic, no time). */
kcost cost_work(const hw_model *hw, const weft_program *pr, const lwork *w);
/* Cost of a compute, copy or step instruction on hw. */
kcost cost_compute(const hw_model *hw, const weft_program *pr, const lins *ins);

/* Cost of a collective or a send for one member (NULL hw: bytes only).
 * The algorithm is the fastest of ring, tree and hierarchical that the
 * group allows; *algo gets its name. */
kcost cost_comm(const hw_model *hw, const weft_plan *p, const pcomm *cm, const char **algo);

/* The cost of one run of operator op over a part of its iteration space
 * (sp: the operator's space, ext[i]: the part's extent along idim i), its
 * forward or backward (grad0, grad1: whether the first two operands get a
 * gradient), moving bytes of memory: what the simulator charges the
 * instruction that runs it. For analytic costs (the search). */
kcost cost_op(const hw_model *hw, const weft_graph *g, const opspace *sp, int op, const double *ext, bool bwd,
              bool grad0, bool grad1, double bytes);

/* A collective of kind over members devices on nodes nodes (per_node at
 * most on one), of a region of size bytes (all-to-all: bytes, the most a
 * member sends): the cost cost_comm gives such a communication. */
kcost cost_collective(const hw_model *hw, comm_kind kind, double size, double bytes, int members, int nodes,
                      int per_node);

/* Shape efficiency of a (batched) matrix product of m x k times k x n,
 * `batch` times: the matmul fraction, reduced by tile padding, partial
 * waves and the per-tile overhead. */
double cost_matmul_efficiency(const hw_model *hw, double batch, double m, double n, double k);

/* Backward FLOPs per forward FLOP of an operator kind, given how many of
 * its inputs get a gradient (the rule per kind is in docs/estimate.md). */
double cost_backward_factor(const char *kind, int grads, int inputs);

/* Model FLOPs of one step: forward and backward of every operator once
 * (no recomputation), for the whole batch. */
double cost_model_flops(const weft_graph *g);
/* The dtype of the model's matrix products, the one MFU is measured
 * against (f32 without any). */
weft_dtype cost_model_dtype(const weft_graph *g);

#endif
