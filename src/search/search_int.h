/* search_int.h - what the files of src/search share: the model's shape as
 * the search sees it (repeated blocks, the batch and sequence dimensions),
 * the ways each operator may be split by tensor parallelism, and the cost
 * of a block under one choice of them. */
#ifndef WEFT_SEARCH_INT_H
#define WEFT_SEARCH_INT_H

#include "weft/plan.h"
#include "weft/search.h"

/* How a tensor lies on the devices of a tensor-parallel group: whole on
 * each (R), partial sums (V), or split along one of its dimensions (D:
 * dimension dim, at the factor whose inner factors multiply to inner). */
enum { L_R, L_V, L_D };

typedef struct layout {
  int kind;
  int dim;
  int64_t inner;
} layout;

enum { SEARCH_MAX_INPUTS = 8 };

/* SYM_FLOPS and the other rates of the nominal machine: weft/cost.h */

/* One way to split an operator over a group of t devices. */
typedef struct opcfg {
  int idim;               /* the idim split, -1: replicated */
  const char *dim;        /* how a plan names it (signature or model name), NULL replicated */
  layout out;             /* its result */
  layout gout;            /* the gradient of its result its backward needs */
  layout in[SEARCH_MAX_INPUTS];  /* what it needs of each input */
  layout gin[SEARCH_MAX_INPUTS]; /* the gradient of each input it gives */
  unsigned cp_gather;     /* bit k: input k is gathered whole along the sequence over the cp group */
  bool expert;            /* split along the experts over the ep group */
  double fwd, bwd;        /* seconds (symbolic: units) per micro-batch */
  double act;             /* bytes of its result per device per micro-batch */
  double params;          /* bytes of the parameters it is the first to read, per device */
  double param_elems;     /* their elements per device */
  double xparam_elems;    /* of which experts' (split over ep, summed over dp only) */
  double tpsum_elems;     /* of which, but for experts', whole on every member of the
                           * tensor-parallel group while the operator is split along a
                           * dimension of its result: their gradients are partial sums,
                           * summed over the group with the replicas' (along a reduction,
                           * the first part alone applies them) */
  double tied_elems;      /* of param_elems, those of parameters other operators read too,
                           * not in tpsum_elems */
  double tied_tpsum_elems; /* elements per device of parameters an earlier operator reads
                            * first, whole on every member of the tensor-parallel group
                            * while this one is split along its result: summed over the
                            * group with the replicas' */
  double tied_copy_elems; /* elements of parameters other operators read too that this
                           * one, replicated over the tensor-parallel group, reads on
                           * every member (copies of one gradient) */
  double tied_sum_elems;  /* those that this one sums over the group (parts of one) */
  double tpsum;           /* seconds (symbolic: units) of that sum, once a step: the
                           * dynamic program weighs it, the stage's time leaves it to
                           * the step's gradient sums */
} opcfg;

/* The model's shape, for one tensor-parallel degree and micro-batch size. */
typedef struct sshape {
  const weft_graph *g;
  opspace **space;        /* per op */
  const char *batch;      /* the batch dimension's name */
  const char *seq;        /* the sequence dimension's name, or NULL */
  int64_t batch_size;
  int *producer_of_input; /* per op, per input: the producing op, -1 */
  int *last_use;          /* per op: the last op reading its result */
  bool *first_reader;     /* per op, per input: the first op to read this parameter */
  /* repeated blocks: ops [block_start[l], block_start[l] + block_ops) */
  int layers;
  int block_ops;
  int *block_start;
  const char *block_name;
  bool *tied;             /* per tensor: a parameter more than one operator reads */
  bool tied_whole;        /* tied parameters are read whole (tied_layout R only) */
  layout tied_layout;     /* how every reader of a tied parameter must read it
                           * (one layout for all of them: their gradients are
                           * then summed like those of one reader) */
  /* context parallelism: every operator split along the sequence into
   * cp parts (its queries, for attention), what an operator needs whole
   * along the sequence gathered over the cp group */
  int *cp_idim;           /* per op: the idim a split on the sequence takes, -1 none */
  bool cp_ok;             /* every operator has one: the model takes context parallelism */
  int cp;                 /* the degree the costs are for (1: none) */
  /* expert parallelism: the experts' operators (those that read and give
   * tensors whose first dimension is `experts`) split along it into ep
   * parts, every other operator along the batch, so that the ep group is
   * data-parallel for them; all-to-alls where the two meet */
  bool *expert;           /* per op: an expert's operator */
  bool *expert_exit;      /* per op: an expert's operator that a non-expert one reads */
  int experts;            /* the experts' count (0: the model has none) */
  int ep;                 /* the degree the costs are for (1: none) */
  double tpsum_weight;    /* how much the dynamic program weighs the sums over the
                           * tensor-parallel group of the gradients of weights a
                           * split operator reads whole (1: as the step pays them) */
  double param_weight;    /* seconds the dynamic program adds per byte of parameters
                           * a device keeps (0: time alone; large: the fewest bytes,
                           * then the time) */
  const char **want;      /* per op: the dimension a written split along tp gives it
                           * ("" replicated), NULL: any (NULL: none written) */
  bool program_order;     /* the dynamic program visits operators in their order
                           * (tests compare it with GenerateSeq's) */
  int head_end;           /* ops [0, head_end): before the blocks */
  int tail_start;         /* ops [tail_start, nops): after */
} sshape;

bool sshape_build(arena *a, const weft_graph *g, sshape *s, const char **why);

/* The configurations of op for tp devices and micro-batches of mbs. */
int op_configs(arena *a, const sshape *s, const hw_model *hw, bool symbolic, int op, int tp, int mbs, opcfg **out);

/* The collective that changes layout from into to (a comm_kind), -1 when
 * nothing moves (the same layout, whole to split, or to partial sums,
 * which the reader makes itself): the rules of dependency preservation
 * that lowering applies (src/plan/deps.c), as tests/unit/test_relayout.c
 * checks against it. */
int relayout_kind(layout from, layout to);

/* The cost of changing a layout, fwd or bwd direction alike: seconds
 * (symbolic: units) for a tensor of bytes spread over tp devices in a node. */
double relayout(const hw_model *hw, bool symbolic, layout from, layout to, double bytes, int tp);

/* A range of operators costed under the best choice of configurations. */
typedef struct rangecost {
  double fwd, bwd;        /* per micro-batch, compute and tensor-parallel communication */
  double recompute[3];    /* per micro-batch: extra forward under recompute none, selective, full */
  double act[3];          /* bytes kept per micro-batch under recompute none, selective, full */
  double params, param_elems; /* per device */
  double xparam_elems;    /* of which experts' */
  double tpsum_elems;     /* of which summed over the tensor-parallel group too */
  double tied_elems;      /* of which read by other operators too, not in tpsum_elems */
  double tied_tpsum_elems; /* of parameters first read before, summed over the
                            * tensor-parallel group here (not in param_elems) */
  double tied_copy_elems, tied_sum_elems; /* as opcfg's, summed */
  double tpsum;           /* that sum's time, once a step (not in fwd, bwd) */
  double out_bytes;       /* the range's result per device per micro-batch (what a stage sends) */
  double peak_act;        /* the largest result of one of its operators per device per
                           * micro-batch: its gradient is live beside what is kept */
  int *cfg;               /* per op of the range: the configuration chosen */
  opcfg **cfgs;           /* per op of the range: its configurations */
} rangecost;

/* The order in which the dynamic program visits ops [lo, hi), as offsets
 * from lo, in order[0..hi-lo): PaSE's GenerateSeq (each next operator the
 * one that leaves the fewest visited operators with edges to unvisited
 * ones), or the operators' own order with program. Returns the largest
 * such set (the dependent set, whose configurations the program's states
 * tell apart). */
int range_order(arena *a, const sshape *s, int lo, int hi, bool program, int *order);

/* The best choice for ops [lo, hi) with the tensors that come from before
 * lo in layout in, and the result leaving in layout out (L_R for none). */
bool range_best(arena *a, const sshape *s, const hw_model *hw, bool symbolic, int lo, int hi, int tp, int mbs,
                layout in, layout out, rangecost *rc);

/* Whether op's configuration over idim c (-1: replicated) is the one
 * split along the dimension a plan names dim ("": replicated). */
bool idim_is(const opspace *sp, int c, const char *dim);

/* s->want from the tensor-parallel splits a plan writes beside `search`
 * (a block's operator takes what any block's writes); false after
 * diagnostics in dg (two blocks that differ, a dimension the search
 * does not split). */
bool search_fixed_want(arena *a, sshape *s, const search_fixed *f, weft_diags *dg);

/* The blocks of each of the nstages stages a plan writes beside `search`,
 * in layers[0..nstages); false after diagnostics in dg (a stage that is
 * not a run of whole blocks in order, the head outside the first). */
bool search_fixed_layers(arena *a, const sshape *s, const search_fixed *f, weft_diags *dg, int **layers);

/* Whether the experts split into ep equal parts (ep 1: always). */
bool ep_divides(const sshape *s, int ep);

/* Whether every operator's sequence splits into cp equal parts. */
bool cp_divides(const sshape *s, int cp);

/* Tensor bytes per micro-batch of mbs (its batch dimension scaled), on
 * one device of a cp group when it has the sequence. */
double tensor_mb_bytes(const sshape *s, int t, int mbs);

#endif
