/* cost.c - the hardware model of a cluster and the cost of each instruction
 * of a lowered program: FLOPs and bytes first, then seconds through a
 * roofline with shape-dependent efficiency (docs/estimate.md). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft/cost.h"

/* ---- reading the cluster record ---------------------------------------- */

static double num_field(const vrecord *r, const char *key, double dflt) {
  const value *v = r ? record_get(r, key) : NULL;
  if (!v) return dflt;
  switch (v->kind) {
  case V_INT: return (double)v->i;
  case V_FLOAT: return v->f;
  case V_QUANTITY: return v->q.v;
  default: return dflt;
  }
}

static const vrecord *rec_field(const vrecord *r, const char *key) {
  const value *v = r ? record_get(r, key) : NULL;
  return v && v->kind == V_RECORD ? v->rec : NULL;
}

static void read_link(const vrecord *l, hw_link *out) {
  const value *nm = record_get(l, "name");
  out->present = true;
  out->name = nm && nm->kind == V_STRING ? nm->s : "link";
  out->bandwidth = num_field(l, "bandwidth", 0);
  out->latency = num_field(l, "latency", 0);
  out->efficiency = num_field(l, "efficiency", 1.0);
}

/* The dtype an operator computes in: its first floating-point input (the
 * activations of a matrix product), else its result. */
static weft_dtype op_dtype(const weft_graph *g, int op) {
  const gop *o = &g->ops[op];
  for (int i = 0; i < o->ninputs; i++)
    if (dtype_is_float(g->tensors[o->inputs[i]].dtype)) return g->tensors[o->inputs[i]].dtype;
  return g->tensors[o->output].dtype;
}

/* ---- operator kinds --------------------------------------------------------
 * What the cost model knows of an operator kind, the name a graph operator
 * calls (stdlib/ops.plan). A kind not listed is a streaming kernel
 * (elementwise, norms, losses): its time is the larger of its FLOPs at the
 * vector rate and its bytes at the memory's. */

/* How a kind's kernels are timed. */
enum { OPK_MATMUL, OPK_ATTENTION, OPK_STREAM };

/* kind_cost.bwd of a kind whose backward is one product per operand that
 * gets a gradient. */
#define BWD_PER_GRAD (-1.0)

typedef struct kind_cost {
  const char *kind;
  int model;              /* OPK_* */
  bool tensor_cores;      /* runs at the dtype's matrix rate, which the cluster must give */
  double bwd;             /* backward FLOPs per forward FLOP, or BWD_PER_GRAD */
} kind_cost;

static const kind_cost kind_costs[] = {
    {"matmul", OPK_MATMUL, true, BWD_PER_GRAD},
    {"attention", OPK_ATTENTION, true, 2},     /* four products against the forward's two */
    {"embedding", OPK_STREAM, false, 0},       /* a scatter-add: traffic, no arithmetic counted */
    {"optimizer", OPK_STREAM, false, 0},
};

/* Every other kind: a backward of about twice the forward's FLOPs. */
static const kind_cost stream_kind = {NULL, OPK_STREAM, false, 2};

static const kind_cost *kind_cost_of(const char *kind) {
  for (size_t i = 0; kind && i < sizeof kind_costs / sizeof kind_costs[0]; i++)
    if (strcmp(kind_costs[i].kind, kind) == 0) return &kind_costs[i];
  return &stream_kind;
}

bool hw_from_cluster(weft_diags *dg, const weft_graph *g, const weft_cluster *c, const char *what, weft_loc loc,
                     hw_model *hw) {
  memset(hw, 0, sizeof *hw);
  const vrecord *cl = c->rec;
  const value *nm = record_get(cl, "name");
  hw->cluster = nm && nm->kind == V_STRING ? nm->s : "cluster";
  hw->devices_per_node = c->devices_per_node > 0 ? c->devices_per_node : 1;
  const vrecord *dev = rec_field(cl, "device");
  const value *dn = dev ? record_get(dev, "name") : NULL;
  hw->device = dn && dn->kind == V_STRING ? dn->s : hw->cluster;
  hw->memory = num_field(dev, "memory", 0);
  hw->mem_bw = num_field(dev, "memory_bandwidth", 0);
  const vrecord *comp = rec_field(dev, "compute");
  for (int t = 0; t < DT_COUNT; t++) hw->peak[t] = num_field(comp, dtype_names[t], 0);
  hw->vector_rate = hw->peak[DT_F32];
  hw->matmul_eff = num_field(dev, "matmul_efficiency", 1.0);
  hw->units = (int)num_field(dev, "sms", 0);
  const value *tile = dev ? record_get(dev, "matmul_tile") : NULL;
  if (tile && tile->kind == V_LIST && tile->list->n == 2 && tile->list->items[0].kind == V_INT &&
      tile->list->items[1].kind == V_INT) {
    hw->tile_m = (int)tile->list->items[0].i;
    hw->tile_n = (int)tile->list->items[1].i;
  }
  hw->tile_k_overhead = num_field(dev, "matmul_tile_k_overhead", 0);
  hw->memory_eff = num_field(dev, "memory_efficiency", 1.0);
  hw->launch = num_field(dev, "kernel_launch", 0);
  const value *sp = dev ? record_get(dev, "attention_score_passes") : NULL;
  if (sp && sp->kind == V_LIST && sp->list->n == 2) {
    const value *f = &sp->list->items[0], *b = &sp->list->items[1];
    hw->score_passes = f->kind == V_INT ? (double)f->i : f->kind == V_FLOAT ? f->f : 0;
    hw->score_passes_bwd = b->kind == V_INT ? (double)b->i : b->kind == V_FLOAT ? b->f : 0;
  }
  const value *links = record_get(cl, "links");
  if (links && links->kind == V_LIST)
    for (int i = 0; i < links->list->n; i++) {
      const vrecord *l = links->list->items[i].rec;
      const value *lv = record_get(l, "level");
      if (!lv || lv->kind != V_STRING) continue;
      hw_link *to = strcmp(lv->s, "node") == 0 ? &hw->node : &hw->net;
      if (!to->present) read_link(l, to);
    }
  /* a single-level cluster: its one link serves both levels */
  if (!hw->net.present && hw->node.present) hw->net = hw->node;
  if (!hw->node.present && hw->net.present) hw->node = hw->net;
  /* every dtype the plan computes in needs a rate */
  bool ok = true;
  bool seen[DT_COUNT] = {0};
  for (int op = 0; op < g->nops; op++) {
    weft_dtype dt = op_dtype(g, op);
    if (!kind_cost_of(g->ops[op].kind)->tensor_cores || seen[dt]) continue;
    seen[dt] = true;
    if (hw->peak[dt] <= 0) {
      ok = false;
      if (!dg) break;
      weft_diag *d = diag_add(dg, DIAG_ERROR, loc, "cannot estimate %s: the device of cluster %s (%s) has no compute rate for %s, which %s computes in",
                                what, hw->cluster, hw->device, dtype_names[dt], g->ops[op].name);
      diag_hint(d, dg, "give the model another dtype, or add `%s = ... TFLOP/s` to the device's compute", dtype_names[dt]);
    }
  }
  if (hw->vector_rate <= 0)
    for (int t = 0; t < DT_COUNT; t++)
      if (hw->peak[t] > hw->vector_rate) hw->vector_rate = hw->peak[t];
  if (hw->mem_bw <= 0 || hw->vector_rate <= 0) {
    if (dg) diag_add(dg, DIAG_ERROR, loc, "cannot estimate %s: cluster %s gives no memory bandwidth or compute rate", what, hw->cluster);
    ok = false;
  }
  return ok;
}

void hw_nominal(const weft_plan *p, hw_model *hw) {
  memset(hw, 0, sizeof *hw);
  weft_cluster cl = weft_cluster_of(p->cluster);
  hw->cluster = "nominal";
  hw->device = "nominal";
  hw->devices_per_node = p->devices_per_node;
  hw->memory = (double)cl.device_memory;
  hw->mem_bw = SYM_MEM_BW;
  for (int t = 0; t < DT_COUNT; t++) hw->peak[t] = SYM_FLOPS;
  hw->vector_rate = SYM_FLOPS;
  hw->matmul_eff = hw->memory_eff = 1;
  hw->node = (hw_link){true, "nominal node", SYM_NODE_BW, 0, 1};
  hw->net = (hw_link){true, "nominal network", SYM_NET_BW, 0, 1};
}

bool hw_from_plan(weft_diags *dg, const weft_plan *p, const weft_program *pr, hw_model *hw) {
  (void)pr;
  weft_cluster cl = weft_cluster_of(p->cluster);
  cl.devices_per_node = p->devices_per_node;
  char what[256];
  snprintf(what, sizeof what, "plan %s", p->name);
  return hw_from_cluster(dg, p->g, &cl, dg ? arena_strdup(dg->arena, what) : "", p->loc, hw);
}

/* ---- kernels ------------------------------------------------------------- */

double cost_matmul_efficiency(const hw_model *hw, double batch, double m, double n, double k) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return hw->matmul_eff;
  double e = hw->matmul_eff;
  double slice = k; /* the reduction one tile runs */
  if (hw->tile_m > 0 && hw->tile_n > 0) {
    double tiles = batch * ceil(m / hw->tile_m) * ceil(n / hw->tile_n);
    /* split-K: a product of fewer tiles than processors whose reduction is
     * longer than a tile's side cuts the reduction into slices, one tile per
     * slice, so that the idle processors take a share (cuBLAS and CUTLASS
     * do; the slices' partial sums, m n each, are small beside k) */
    double split = 1;
    if (hw->units > 0 && tiles < hw->units) {
      split = fmin(floor(hw->units / tiles), floor(k / hw->tile_m));
      if (split < 1) split = 1;
    }
    tiles *= split;
    slice = k / split;
    double slots = tiles;
    if (hw->units > 0) slots = ceil(tiles / hw->units) * hw->units;
    e *= batch * m * n * split / (slots * (double)hw->tile_m * hw->tile_n);
  }
  if (hw->tile_k_overhead > 0) e *= slice / (slice + hw->tile_k_overhead);
  return e;
}

/* One matrix product's time: the roofline of its FLOPs at the shape's
 * efficiency and of its operands' traffic. */
static double gemm_time(const hw_model *hw, weft_dtype dt, double batch, double m, double n, double k, double *flops,
                        double *bytes) {
  double f = 2 * batch * m * n * k;
  double b = batch * (m * k + k * n + m * n) * dtype_bytes[dt];
  *flops += f;
  *bytes += b;
  if (!hw) return 0;
  double rate = hw->peak[dt] * cost_matmul_efficiency(hw, batch, m, n, k);
  double tc = rate > 0 ? f / rate : 0;
  double tm = b / (hw->mem_bw * hw->memory_eff);
  return hw->launch + (tc > tm ? tc : tm);
}

static double stream_time(const hw_model *hw, double flops, double bytes, int kernels) {
  if (!hw) return 0;
  double tc = flops / hw->vector_rate;
  double tm = bytes / (hw->mem_bw * hw->memory_eff);
  return kernels * hw->launch + (tc > tm ? tc : tm);
}

/* Size of the part of idim i a sub-operator covers. */
static double span(const psub *s, int i) { return (double)(s->range[i].hi - s->range[i].lo); }

static bool tmap_has(const tmap *m, int idim) {
  for (int d = 0; d < m->ndims; d++)
    for (int f = 0; f < m->nfactors[d]; f++)
      if (m->factors[d][f] == idim) return true;
  return false;
}

double cost_backward_factor(const char *kind, int grads, int inputs) {
  const kind_cost *k = kind_cost_of(kind);
  (void)inputs;
  return k->bwd == BWD_PER_GRAD ? grads : k->bwd;
}

/* Matrix operands of a matmul-kind operator: its first two inputs. */
static int matmul_grads_graph(const weft_graph *g, const gop *o) {
  int n = 0;
  for (int i = 0; i < o->ninputs && i < 2; i++) {
    const gtensor *t = &g->tensors[o->inputs[i]];
    n += t->role != TENSOR_INPUT && dtype_is_float(t->dtype);
  }
  return n;
}

double cost_model_flops(const weft_graph *g) {
  double total = 0;
  for (int i = 0; i < g->nops; i++) {
    const gop *o = &g->ops[i];
    int grads = kind_cost_of(o->kind)->bwd == BWD_PER_GRAD ? matmul_grads_graph(g, o) : 1;
    total += o->flops * (1 + cost_backward_factor(o->kind, grads, o->ninputs));
  }
  return total;
}

weft_dtype cost_model_dtype(const weft_graph *g) {
  for (int i = 0; i < g->nops; i++)
    if (kind_cost_of(g->ops[i].kind)->model == OPK_MATMUL)
      for (int k = 0; k < g->ops[i].ninputs; k++)
        if (dtype_is_float(g->tensors[g->ops[i].inputs[k]].dtype)) return g->tensors[g->ops[i].inputs[k]].dtype;
  return DT_F32;
}

/* What the cost of a compute instruction takes from its sub-operator and
 * operator: the same for every instruction that runs the sub-operator
 * (each micro-batch, forward, recomputation and backward). */
typedef struct subgeo {
  int op;                 /* -1: not filled yet */
  int model;              /* OPK_*, of its kind */
  weft_dtype dt;
  double frac;            /* the part of the operator's iteration space it covers */
  double a, b, c;         /* matmul: m, n, k; attention: sq, dh, batch */
  double d;               /* attention: sk, the keys (sq unless a part of the queries attends to all) */
} subgeo;

/* The geometry of a part of an operator's iteration space, ext[i] its
 * extent along idim i. */
static void subgeo_of(const weft_graph *gr, const opspace *sp, int op, const double *ext, subgeo *g) {
  const gop *o = &gr->ops[op];
  g->op = op;
  double frac = 1;
  for (int i = 0; i < sp->nidims; i++)
    if (sp->idims[i].size > 0) frac *= ext[i] / (double)sp->idims[i].size;
  g->frac = frac;
  g->dt = op_dtype(gr, op);
  g->a = g->b = g->c = g->d = 0;
  int model = kind_cost_of(o->kind)->model;
  if (model == OPK_MATMUL && sp->ninputs >= 2) {
    /* m: result idims the first operand has; n: the others; k: reductions */
    double m = 1, n = 1, kk = 1;
    for (int i = 0; i < sp->nidims; i++) {
      if (sp->idims[i].reduce) kk *= ext[i];
      else if (tmap_has(&sp->output, i)) {
        if (tmap_has(&sp->inputs[0], i)) m *= ext[i];
        else n *= ext[i];
      }
    }
    g->model = OPK_MATMUL;
    g->a = m; g->b = n; g->c = kk;
  } else if (model == OPK_ATTENTION) {
    double sq = 0, sk = -1, dh = 0, batch = 1;
    for (int i = 0; i < sp->nidims; i++) {
      const char *sig = sp->idims[i].sig;
      if (strcmp(sig, "s") == 0) sq = ext[i];
      else if (strcmp(sig, "t") == 0) sk = ext[i];
      else if (strcmp(sig, "dh") == 0) dh = ext[i];
      else if (tmap_has(&sp->output, i)) batch *= ext[i];
    }
    g->model = OPK_ATTENTION;
    g->a = sq; g->b = dh; g->c = batch; g->d = sk < 0 ? sq : sk;
  } else {
    g->model = OPK_STREAM;
  }
}

static void subgeo_fill(const weft_plan *p, const psub *s, subgeo *g) {
  const opspace *sp = p->ops[s->op].space;
  double ext[64];
  for (int i = 0; i < sp->nidims && i < 64; i++) ext[i] = span(s, i);
  subgeo_of(p->g, sp, s->op, ext, g);
}

static kcost compute_cost_geo(const hw_model *hw, const weft_graph *gr, const lwork *w, const subgeo *g) {
  kcost k = {0};
  const gop *o = &gr->ops[g->op];
  double frac = g->frac;
  weft_dtype dt = g->dt;
  bool bwd = w->bwd;
  double t = 0;
  if (g->model == OPK_MATMUL) {
    double m = g->a, n = g->b, kk = g->c;
    if (!bwd) {
      t += gemm_time(hw, dt, 1, m, n, kk, &k.flops, &k.bytes);
      k.kernels = 1;
    } else {
      if (w->grad0) { t += gemm_time(hw, dt, 1, m, kk, n, &k.flops, &k.bytes); k.kernels++; }
      if (w->grad1) { t += gemm_time(hw, dt, 1, kk, n, m, &k.flops, &k.bytes); k.kernels++; }
    }
    /* the operator's own count (bias terms and the like) is what the model says */
    double own = o->flops * frac * (bwd ? cost_backward_factor(o->kind, w->grad0 + w->grad1, 0) : 1);
    if (own > k.flops) k.flops = own;
  } else if (g->model == OPK_ATTENTION) {
    /* softmax(q k^T) v per batch element and head: two batched products,
     * with the scores between them in memory unless the kernel is fused */
    double sq = g->a, dh = g->b, batch = g->c, sk = g->d;
    if (sq > 0 && dh > 0) {
      /* forward: scores q k^T, then the weighted values; backward: dP = dO v^T,
       * then dV = P^T dO, dQ = dS k, dK = dS^T q (a part of the queries
       * against all the keys: sq rows of sk scores) */
      t += gemm_time(hw, dt, batch, sq, sk, dh, &k.flops, &k.bytes);
      for (int r = 0; r < (bwd ? 3 : 1); r++) t += gemm_time(hw, dt, batch, sq, dh, sk, &k.flops, &k.bytes);
      double scores = batch * sq * sk * dtype_bytes[dt];
      double passes = hw ? (bwd ? hw->score_passes_bwd : hw->score_passes) : 0;
      k.bytes += passes * scores;
      if (hw) t += stream_time(hw, 0, passes * scores, passes > 0 ? 1 : 0);
      k.kernels = bwd ? 5 : 3;
    } else {
      k.flops = o->flops * frac * (bwd ? 2 : 1);
      k.bytes = w->bytes;
      k.kernels = 1;
      if (hw) {
        double rate = hw->peak[dt] * hw->matmul_eff;
        double tc = rate > 0 ? k.flops / rate : 0, tm = k.bytes / (hw->mem_bw * hw->memory_eff);
        t = hw->launch + (tc > tm ? tc : tm);
      }
    }
  } else {
    k.flops = o->flops * frac * (bwd ? cost_backward_factor(o->kind, 1, o->ninputs) : 1);
    k.bytes = w->bytes;
    k.kernels = 1;
    t = stream_time(hw, k.flops, k.bytes, 1);
  }
  k.seconds = hw ? t : 0;
  return k;
}

kcost cost_op(const hw_model *hw, const weft_graph *g, const opspace *sp, int op, const double *ext, bool bwd,
              bool grad0, bool grad1, double bytes) {
  subgeo geo;
  subgeo_of(g, sp, op, ext, &geo);
  lwork w = {.kind = LI_COMPUTE, .bwd = bwd, .grad0 = grad0, .grad1 = grad1, .bytes = bytes};
  return compute_cost_geo(hw, g, &w, &geo);
}

kcost cost_work(const hw_model *hw, const weft_program *pr, const lwork *w) {
  kcost k = {0};
  switch (w->kind) {
  case LI_COMPUTE: {
    subgeo g;
    subgeo_fill(pr->p, &pr->p->subs[w->sub], &g);
    return compute_cost_geo(hw, pr->p->g, w, &g);
  }
  case LI_COPY:
    k.bytes = w->bytes;
    k.kernels = w->kernels;
    k.seconds = stream_time(hw, 0, k.bytes, k.kernels);
    return k;
  case LI_STEP:
    /* its arithmetic is a few operations per byte: the traffic is the cost */
    k.bytes = w->bytes;
    k.kernels = 1;
    k.seconds = stream_time(hw, k.flops, k.bytes, 1);
    return k;
  default:
    return k;
  }
}

kcost cost_compute(const hw_model *hw, const weft_program *pr, const lins *ins) {
  if (ins->kind != LI_COMPUTE && ins->kind != LI_COPY && ins->kind != LI_STEP) return (kcost){0};
  lwork w = lower_work_measure(pr, ins);
  return cost_work(hw, pr, &w);
}

/* ---- communication ------------------------------------------------------- */

typedef struct placement {
  int p;                  /* members */
  int nodes;              /* nodes they span */
  int per_node;           /* most members on one node */
} placement;

static placement place(const weft_plan *p, const int *group, int n) {
  placement pl = {n, 0, 0};
  int dpn = p->devices_per_node > 0 ? p->devices_per_node : 1;
  /* groups in rank order (as the planner makes them): a node's members
   * are one run, counted in one pass */
  bool sorted = true;
  for (int i = 1; i < n && sorted; i++) sorted = group[i - 1] <= group[i];
  if (sorted) {
    for (int i = 0; i < n;) {
      int node = group[i] / dpn, j = i;
      while (j < n && group[j] / dpn == node) j++;
      pl.nodes++;
      if (j - i > pl.per_node) pl.per_node = j - i;
      i = j;
    }
    return pl;
  }
  /* otherwise by scanning, for each member, the members of its node */
  for (int i = 0; i < n; i++) {
    int node = group[i] / dpn, seen = 0, here = 0;
    for (int j = 0; j < n; j++) {
      if (group[j] / dpn != node) continue;
      if (j < i) seen = 1;
      here++;
    }
    if (!seen) pl.nodes++;
    if (here > pl.per_node) pl.per_node = here;
  }
  return pl;
}

static double bw(const hw_link *l) { return l->bandwidth * l->efficiency; }

static kcost coll_cost(const hw_model *hw, comm_kind kind, double S, double B, placement pl, const char **algo) {
  kcost k = {0};
  const char *name = "none";
  if (kind == COMM_BROADCAST && pl.p > 2) {
    /* a binomial tree: ceil(log2 P) rounds, each one message of S */
    bool net = pl.nodes > 1;
    double rounds = ceil(log2((double)pl.p));
    k.net_bytes[net] = S;
    name = "tree";
    if (hw) {
      const hw_link *l = net ? &hw->net : &hw->node;
      k.seconds = rounds * (l->latency + S / bw(l));
    }
    if (algo) *algo = name;
    return k;
  }
  if (kind == COMM_SEND || kind == COMM_BROADCAST) {
    bool net = pl.nodes > 1;
    k.net_bytes[net] = S;
    name = "p2p";
    if (hw) {
      const hw_link *l = net ? &hw->net : &hw->node;
      k.seconds = l->latency + S / bw(l);
    }
    if (algo) *algo = name;
    return k;
  }
  int P = pl.p;
  if (P <= 1) {
    if (algo) *algo = name;
    return k;
  }
  if (kind == COMM_ALL_TO_ALL) {
    /* pairwise: each member sends its P - 1 pieces (cm->bytes in all, the
     * most any member sends), one latency each, over the slowest link used */
    bool net = pl.nodes > 1;
    k.net_bytes[net] = B;
    name = "pairwise";
    if (hw) {
      const hw_link *l = net ? &hw->net : &hw->node;
      k.seconds = (P - 1) * l->latency + B / bw(l);
    }
    if (algo) *algo = name;
    return k;
  }
  bool reduce = kind == COMM_ALL_REDUCE;
  double phases = reduce ? 2 : 1;   /* all-reduce: reduce-scatter then all-gather */
  if (pl.nodes <= 1) {
    k.net_bytes[0] = phases * (P - 1) / P * S;
    name = "ring";
    if (hw) {
      double ring = phases * (P - 1) * hw->node.latency + phases * (P - 1) / P * S / bw(&hw->node);
      k.seconds = ring;
      if (reduce) {
        double tree = 2 * ceil(log2((double)P)) * hw->node.latency + 2 * S / bw(&hw->node);
        if (tree < ring) { k.seconds = tree; name = "tree"; }
      }
    }
  } else {
    /* hierarchical: inside each node among g members, across nodes on S/g
     * per device (each device has its own path to the network) */
    double g = pl.per_node, nn = pl.nodes;
    k.net_bytes[0] = phases * (g - 1) / g * S;
    k.net_bytes[1] = phases * (nn - 1) / nn * S / g;
    name = g > 1 ? "hierarchical" : "ring";
    if (hw) {
      double intra = g > 1 ? phases * (g - 1) * hw->node.latency + phases * (g - 1) / g * S / bw(&hw->node) : 0;
      double inter = phases * (nn - 1) * hw->net.latency + phases * (nn - 1) / nn * (S / g) / bw(&hw->net);
      k.seconds = intra + inter;
      /* a flat ring over every member crosses the network on every hop
       * that leaves a node; its bandwidth is the network's */
      double flat = phases * (P - 1) * hw->net.latency + phases * (P - 1) / P * S / bw(&hw->net);
      if (flat < k.seconds) { k.seconds = flat; name = "ring"; }
      if (reduce) {
        double tree = intra + 2 * ceil(log2(nn)) * hw->net.latency + 2 * (S / g) / bw(&hw->net);
        if (tree < k.seconds) { k.seconds = tree; name = "tree"; }
      }
    }
  }
  if (algo) *algo = name;
  return k;
}

kcost cost_comm(const hw_model *hw, const weft_plan *p, const pcomm *cm, const char **algo) {
  placement pl;
  if (cm->kind == COMM_SEND || (cm->kind == COMM_BROADCAST && cm->ngroup <= 2)) {
    int pair[2] = {cm->src, cm->dst};
    pl = place(p, pair, 2);
  } else {
    pl = place(p, cm->group, cm->ngroup);
  }
  return coll_cost(hw, cm->kind, (double)cm->size, (double)cm->bytes, pl, algo);
}

kcost cost_collective(const hw_model *hw, comm_kind kind, double size, double bytes, int members, int nodes,
                      int per_node) {
  placement pl = {members, nodes, per_node};
  return coll_cost(hw, kind, size, bytes, pl, NULL);
}
