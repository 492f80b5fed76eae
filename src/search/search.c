/* search.c - the search: every shape of the mesh (tensor, pipeline and data
 * parallelism), micro-batch size, schedule, recomputation and ZeRO stage,
 * each costed analytically from the blocks' best configurations
 * (space.c) and the pipeline's stages (a balance of the blocks over the
 * stages, uneven where the embedding or the head weighs); the frontier of
 * step time against memory; its fastest candidates built as decision lists
 * (emit.c), applied, lowered, validated and simulated like any plan, so
 * that the figures reported are the simulator's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "search_int.h"
#include "weft/sim.h"
#include "weft/units.h"
#include "weft/validate.h"

void emit_plan(arena *a, const sshape *s, const search_fixed *f, search_plan *sp);

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- the cost of the model's parts under one tensor-parallel degree -------------- */

/* The head (operators before the blocks), one block, the tail, for a tp
 * degree and a micro-batch size, with the layout of the tensor that runs
 * from block to block chosen for the whole. */
typedef struct parts {
  bool ok;
  rangecost head, block, tail;
  layout b;
} parts;

/* The layouts the tensor between blocks may have: whole, or split along
 * one of its dimensions other than the batch. */
static int boundary_layouts(const sshape *s, int tp, layout *out) {
  int n = 0;
  out[n++] = (layout){L_R, 0, 0};
  if (tp < 2 || s->layers == 0) return n;
  int producer = s->block_start[0] - 1;
  if (producer < 0) return n;
  const gtensor *t = &s->g->tensors[s->g->ops[producer].output];
  for (int d = 1; d < t->ndims && n < 8; d++)
    if (t->dims[d].size % tp == 0) out[n++] = (layout){L_D, d, 1};
  return n;
}

static double range_time(const rangecost *r) { return r->fwd + r->bwd; }

/* The parts' time for one micro-batch and the gradient sums over the
 * tensor-parallel group they add once a step, and their parameters' bytes
 * as the dynamic program weighs them: how layouts compare. */
static double parts_time(const sshape *s, const parts *p) {
  return range_time(&p->head) + s->layers * range_time(&p->block) + range_time(&p->tail) + p->head.tpsum +
         s->layers * p->block.tpsum + p->tail.tpsum +
         (p->head.params + s->layers * p->block.params + p->tail.params) * s->param_weight;
}

static parts cost_parts_tied(arena *a, const sshape *s, const hw_model *hw, bool symbolic, int tp, int mbs) {
  parts best = {0};
  const weft_graph *g = s->g;
  layout R = {L_R, 0, 0};
  if (s->layers == 0) {
    best.ok = range_best(a, s, hw, symbolic, 0, g->nops, tp, mbs, R, R, &best.head);
    best.b = R;
    return best;
  }
  layout bs[8];
  int nb = boundary_layouts(s, tp, bs);
  double besttime = 0;
  for (int i = 0; i < nb; i++) {
    parts p = {.b = bs[i]};
    if (!range_best(a, s, hw, symbolic, 0, s->head_end, tp, mbs, R, bs[i], &p.head)) continue;
    if (!range_best(a, s, hw, symbolic, s->block_start[0], s->block_start[1], tp, mbs, bs[i], bs[i], &p.block)) continue;
    if (!range_best(a, s, hw, symbolic, s->tail_start, g->nops, tp, mbs, bs[i], R, &p.tail)) continue;
    double t = parts_time(s, &p);
    if (!best.ok || t < besttime) {
      p.ok = true;
      best = p;
      besttime = t;
    }
  }
  return best;
}

/* The best parts over the ways tied parameters (an embedding that the head
 * reads too) may be read: all their readers alike, whole or split along
 * one dimension. */
static parts cost_parts(arena *a, sshape *s, const hw_model *hw, bool symbolic, int tp, int cp, int ep, int mbs) {
  s->cp = cp;
  s->ep = ep;
  bool any = false;
  for (int t = 0; t < s->g->ntensors && !any; t++) any = s->tied[t];
  static const layout ways[] = {{L_R, 0, 0}, {L_D, 0, 1}, {L_D, 1, 1}};
  parts best = {0};
  for (int w = 0; w < (any && tp > 1 && !s->tied_whole ? 3 : 1); w++) {
    s->tied_layout = ways[w];
    parts p = cost_parts_tied(a, s, hw, symbolic, tp, mbs);
    if (!p.ok) continue;
    if (!best.ok || parts_time(s, &p) < parts_time(s, &best)) best = p;
  }
  return best;
}

/* The dimension op's tensor-parallel level splits in parts p ("" replicated). */
static const char *parts_dim(const sshape *s, const parts *p, int op) {
  const rangecost *r;
  int i;
  if (s->layers == 0 || op < s->head_end) r = &p->head, i = op;
  else if (op >= s->tail_start) r = &p->tail, i = op - s->tail_start;
  else r = &p->block, i = (op - s->head_end) % s->block_ops;
  const opcfg *x = &r->cfgs[i][r->cfg[i]];
  return x->dim ? x->dim : "";
}

/* Whether two parts split every operator alike. */
static bool same_parts(const sshape *s, const parts *x, const parts *y) {
  for (int op = 0; op < s->g->nops; op++)
    if (strcmp(parts_dim(s, x, op), parts_dim(s, y, op)) != 0) return false;
  return true;
}

/* The layouts of tp > 1 worth simulating: the dynamic program's best, and
 * its best when the gradients' sums over the tensor-parallel group of the
 * weights that split operators read whole weigh double (their cost is per
 * step, the program's per micro-batch: where the two come close, which
 * is faster is the simulator's to say), when that differs; under a memory
 * cap (memory_too) also the layout that keeps the fewest parameter bytes
 * per device, the fastest of those (a head split along the vocabulary
 * rather than the sequence, its weight in parts: slower, and what fits). */
static int cost_parts_all(arena *a, sshape *s, const hw_model *hw, bool symbolic, int tp, int cp, int ep, int mbs,
                          bool memory_too, parts out[3]) {
  out[0] = cost_parts(a, s, hw, symbolic, tp, cp, ep, mbs);
  if (!out[0].ok) return 0;
  if (tp < 2) return 1;
  int n = 1;
  s->tpsum_weight = 2;
  out[n] = cost_parts(a, s, hw, symbolic, tp, cp, ep, mbs);
  s->tpsum_weight = 1;
  if (out[n].ok && !same_parts(s, &out[0], &out[n])) n++;
  if (memory_too) {
    /* a second a byte: bytes first, time to break ties */
    s->param_weight = 1.0;
    out[n] = cost_parts(a, s, hw, symbolic, tp, cp, ep, mbs);
    s->param_weight = 0;
    bool fresh = out[n].ok;
    for (int i = 0; i < n && fresh; i++) fresh = !same_parts(s, &out[i], &out[n]);
    if (fresh) n++;
  }
  return n;
}

/* ---- memory of the parameters ------------------------------------------------- */

/* Bytes per parameter element of its value, its gradient and of what the
 * optimizer keeps (its state and master weights, in f32), as lowering
 * allocates them (graph_train_bytes: 2 + 4 + 12 for bf16 with AdamW). */
static void bytes_per_elem(const weft_graph *g, double *param, double *grad, double *state) {
  *param = *grad = 4;
  *state = dtype_bytes[DT_F32] * g->optimizer_state;
  for (int t = 0; t < g->ntensors; t++)
    if (g->tensors[t].role == TENSOR_PARAM) {
      *param = dtype_bytes[g->tensors[t].dtype];
      *grad = dtype_bytes[graph_grad_dtype(g, t)];
      *state = dtype_bytes[DT_F32] * (g->optimizer_state + graph_master_copies(g, t));
      break;
    }
}

/* ---- one candidate ---------------------------------------------------------------- */

typedef struct space {
  const sshape *s;
  const hw_model *hw;
  bool symbolic;
  int ndevices, per_node;
  double max_memory;      /* 0: no limit */
  double param_b, grad_b, state_b; /* per parameter element; state_b: optimizer state and master weights */
  bool uneven;            /* stages may hold different numbers of blocks */
  bool rc_ok[3];          /* the recomputations a stage may take (none, selective, full) */
  const int *fixed_layers; /* the blocks of each stage a plan writes, or NULL */
  int nfixed;             /* their count: the pipeline's pp x interleave */
} space;

/* The time of a collective of kind over n devices spaced `stride` apart. */
static double group_cost(const space *sp, comm_kind k, double bytes, int n, int stride) {
  if (n < 2 || bytes <= 0) return 0;
  int dpn = sp->per_node > 0 ? sp->per_node : 1;
  int per_node = stride >= dpn ? 1 : dpn / stride;
  if (per_node > n) per_node = n;
  int nodes = (n + per_node - 1) / per_node;
  if (sp->symbolic) return bytes * 2 / (nodes > 1 ? SYM_NET_BW : SYM_NODE_BW);
  return cost_collective(sp->hw, k, bytes, bytes, n, nodes, per_node).seconds;
}

/* The time of a collective of kind over the replicas of a parameter: cp
 * devices tp apart in each of dp groups tp * pp * cp apart. */
static double replica_cost(const space *sp, comm_kind k, double bytes, int dp, int cp, int tp, int pp) {
  int n = dp * cp;
  if (n < 2 || bytes <= 0) return 0;
  if (cp == 1) return group_cost(sp, k, bytes, dp, tp * pp);
  int dpn = sp->per_node > 0 ? sp->per_node : 1;
  int per_node = tp >= dpn ? 1 : dpn / tp;
  if (per_node > cp) per_node = cp;
  /* dp groups that share a node, when a cp group fills less than one */
  int span = tp * pp * cp;
  if (per_node == cp && span < dpn) per_node *= dpn / span < dp ? dpn / span : dp;
  int nodes = (n + per_node - 1) / per_node;
  if (sp->symbolic) return bytes * 2 / (nodes > 1 ? SYM_NET_BW : SYM_NODE_BW);
  return cost_collective(sp->hw, k, bytes, bytes, n, nodes, per_node).seconds;
}

/* The bytes a device keeps for layers of a stage (parameters, their
 * gradients and optimizer state, under ZeRO stage z over the devices their
 * gradients are summed over: dp x ep, but dp for the experts' and dp x ep
 * x tp for those whole on every device of a tp group that splits another
 * dimension, such as a sequence-parallel layer's); moved: elements of
 * parameters other operators read too that one of those sums over the tp
 * group (an embedding tied to a head split along the sequence). */
static double weights_bytes_moved(const space *sp, const rangecost *r, int z, int dp, int ep, int tp, double moved) {
  double xelems = r->xparam_elems, selems = r->tpsum_elems + moved, elems = r->param_elems - xelems - selems;
  double pb = r->param_elems > 0 ? r->params / r->param_elems : sp->param_b;
  double groups[3][2] = {{elems, (double)dp * ep}, {xelems, dp}, {selems, (double)dp * ep * tp}};
  double bytes = 0;
  for (int i = 0; i < 3; i++) {
    double e = groups[i][0], n = groups[i][1];
    bytes += e * (pb / (z >= 3 ? n : 1) + sp->grad_b / (z >= 2 ? n : 1) + sp->state_b / (z >= 1 ? n : 1));
  }
  return bytes;
}

static double weights_bytes(const space *sp, const rangecost *r, int z, int dp, int ep, int tp) {
  return weights_bytes_moved(sp, r, z, dp, ep, tp, 0);
}

/* The recomputation most of n stages take (the flat field of a plan whose
 * stages differ), the lesser of two as common. */
static int common_recompute(const int *rk, int n) {
  int count[3] = {0}, best = 0;
  for (int k = 0; k < n; k++) count[rk[k] >= 0 && rk[k] < 3 ? rk[k] : 0]++;
  for (int r = 1; r < 3; r++)
    if (count[r] > count[best]) best = r;
  return best;
}

/* The gradient live beside what stage k of last + 1 keeps during its
 * backward: the largest result of one of its operators (the logits' in the
 * stage of the head), per micro-batch. */
static double stage_peak(const parts *pt, int k, int last, bool blocks, int r) {
  double p = blocks ? pt->block.peak_act : 0;
  if (k == 0 && pt->head.peak_act > p) p = pt->head.peak_act;
  if (k == last && pt->tail.peak_act > p) p = pt->tail.peak_act;
  /* a block recomputed: its activations of one micro-batch, again */
  if (blocks && r > 0) p += pt->block.act[0] - pt->block.act[r];
  return p;
}

/* What a stage at pipeline position k keeps in flight (micro-batches
 * whose activations it holds at once) under the schedule. */
static double stage_inflight(const search_plan *c, int pos) {
  int pp = c->pp, m = c->micro_batches, v = c->interleave;
  double inflight;
  if (c->schedule == SCHED_GPIPE) inflight = m;
  else if (v > 1) inflight = (double)((pp - pos - 1) * 2 + (v - 1) * pp + 1) / v;
  else inflight = m < pp - pos ? m : pp - pos;
  if (inflight > m) inflight = m;
  if (pp == 1 && c->schedule == SCHED_DEFAULT) inflight = m;
  return inflight;
}

/* Fills the stages, time and memory of candidate c from the parts' costs;
 * false when it cannot fit. With mixed, each stage of a pipeline (one
 * stage per position) takes its own recomputation among those the space
 * allows: the blocks are dealt with, for each stage, the recomputation
 * that lets it hold the most, then each takes the fastest that fits what
 * it holds (false when they all take the same: a uniform candidate). */
/* What bounds the blocks of a stage of a pipeline on one mesh shape: per
 * recomputation, the time and activations per micro-batch of a block, the
 * head and the tail; the weights' bytes of each; a send between stages. */
typedef struct bound_in {
  const space *sp;
  const parts *pt;
  const search_plan *c;
  const int *rcs;
  int nrc;
  const double *tb, *th, *tt, *ab, *ah, *at;
  double wb, wh, wt, p2p;
} bound_in;

/* The most blocks stage k holds under step time T and in memory, over the
 * recomputations it may take (that one in *rk; -1 none). strict: none
 * when the stage's head, tail and sends alone take longer than T. */
static int stage_bound(const bound_in *b, int k, double T, bool strict, int *rk) {
  const search_plan *c = b->c;
  int pp = c->pp, m = c->micro_batches, L = b->sp->s->layers, best = -1;
  double inflight = c->schedule == SCHED_GPIPE ? m : (m < pp - k ? m : pp - k);
  for (int q = 0; q < b->nrc; q++) {
    int r = b->rcs[q];
    double extra = (k == 0 ? b->th[r] : 0) + (k == pp - 1 ? b->tt[r] : 0) + (pp > 1 ? b->p2p : 0);
    int bytime = b->tb[r] > 0 ? (int)floor((T - extra) / b->tb[r] + (strict ? 0 : 1e-9)) : L;
    if (strict && T < extra) bytime = -1;
    double fixed = (k == 0 ? b->wh + b->ah[r] * inflight : 0) + (k == pp - 1 ? b->wt + b->at[r] * inflight : 0) +
                   stage_peak(b->pt, k, pp - 1, true, r);
    double per = b->wb + b->ab[r] * inflight;
    int bymem = b->sp->max_memory > 0 ? (int)floor((b->sp->max_memory - fixed) / per) : L;
    int n = bytime < bymem ? bytime : bymem;
    if (n > L) n = L;
    if (n > best) best = n, *rk = r;
  }
  return best;
}

static bool cost_candidate(const space *sp, const parts *pt, search_plan *c, arena *a, bool mixed) {
  const sshape *s = sp->s;
  int pp = c->pp, m = c->micro_batches, v = c->interleave, L = s->layers;
  int z = c->zero, dp = c->dp, tp = c->tp, ep = c->ep > 1 ? c->ep : 1;
  const rangecost *H = &pt->head, *B = &pt->block, *T = &pt->tail;
  /* per recomputation r: time and activations per micro-batch of a block,
   * the head and the tail */
  double tb[3], th[3], tt[3], ab[3], ah[3], at[3];
  /* (plans recompute the blocks only: the head and the tail keep theirs) */
  for (int r = 0; r < 3; r++) {
    tb[r] = range_time(B) + B->recompute[r], th[r] = range_time(H), tt[r] = range_time(T);
    ab[r] = B->act[r], ah[r] = H->act[0], at[r] = T->act[0];
  }
  int rcs[3], nrc = 0;
  if (mixed) {
    if (pp < 2 || v > 1 || L == 0) return false;
    for (int r = 0; r < 3; r++)
      if (sp->rc_ok[r]) rcs[nrc++] = r;
    if (nrc < 2) return false;
  } else rcs[nrc++] = c->recompute;
  /* a parameter several operators read on the same devices, one of them
   * replicated over the tp group and another split along a dimension of
   * its result (an embedding's lookup copied, the head tied to it split
   * along the sequence): lowering would add each copy's gradient to the
   * sum of the parts, once per member; such a plan is not offered */
  bool copies = H->tied_copy_elems > 0 || T->tied_copy_elems > 0 || (L > 0 && B->tied_copy_elems > 0);
  bool sums = H->tied_sum_elems > 0 || T->tied_sum_elems > 0 || (L > 0 && B->tied_sum_elems > 0);
  if (pp == 1 && copies && sums) return false;
  /* one stage: a parameter read by several operators (an embedding tied
   * to the head) is summed over the tp group too when a later reader
   * sums it so (a head split along the sequence) */
  double tied = pp == 1 && tp > 1 ? L * B->tied_tpsum_elems + H->tied_tpsum_elems + T->tied_tpsum_elems : 0;
  double mh = fmin(H->tied_elems, tied), mb = L > 0 ? fmin(B->tied_elems, (tied - mh) / L) : 0;
  double mt = fmin(T->tied_elems, tied - mh - L * mb);
  double wb = weights_bytes_moved(sp, B, z, dp, ep, tp, mb);
  double wh = weights_bytes_moved(sp, H, z, dp, ep, tp, mh);
  double wt = weights_bytes_moved(sp, T, z, dp, ep, tp, mt);
  /* a send between stages, each way, per micro-batch */
  double p2p = 0;
  if (pp > 1) {
    bool across = tp * c->cp * ep * 2 > sp->per_node;
    p2p = sp->symbolic ? 2 * B->out_bytes / (across ? SYM_NET_BW : SYM_NODE_BW)
                       : 2 * cost_collective(sp->hw, COMM_SEND, B->out_bytes, B->out_bytes, 2, across ? 2 : 1, 1).seconds;
  }
  int chunks = pp * v;
  int *layers = arena_alloc(a, sizeof(int) * (size_t)chunks);
  int *rk = arena_alloc(a, sizeof(int) * (size_t)chunks);  /* per chunk: its recomputation */
  double *time = arena_alloc(a, sizeof(double) * (size_t)chunks);
  for (int k = 0; k < chunks; k++) rk[k] = rcs[0];
  double mem_max = 0;
  if (sp->fixed_layers && chunks != sp->nfixed) return false;
  if (L == 0) {
    if (chunks != 1) return false;
    layers[0] = 0;
    time[0] = th[rk[0]];
  } else if (sp->fixed_layers) {
    /* the stages the plan writes */
    for (int k = 0; k < chunks; k++) layers[k] = sp->fixed_layers[k];
  } else if (v > 1 || !sp->uneven) {
    if (L % chunks) return false;
    for (int k = 0; k < chunks; k++) layers[k] = L / chunks;
  } else {
    /* the fewest layers per stage that keep every stage under a step time
     * T and in memory; T found by bisection */
    bound_in sb = {sp, pt, c, rcs, nrc, tb, th, tt, ab, ah, at, wb, wh, wt, p2p};
    double lo = 0, hi = 0;
    for (int q = 0; q < nrc; q++) {
      int r = rcs[q];
      double t = th[r] + tt[r] + L * tb[r] + pp * p2p + 1e-12;
      if (t > hi) hi = t;
    }
    int *cap = arena_alloc(a, sizeof(int) * (size_t)pp);
    for (int it = 0; it < 60; it++) {
      double mid = (lo + hi) / 2;
      int total = 0;
      for (int k = 0; k < pp; k++) {
        int r;
        cap[k] = stage_bound(&sb, k, mid, true, &r);
        /* a stage between the first and the last needs a block to hold */
        if (cap[k] < 1 && k > 0 && k < pp - 1) cap[k] = -1;
        if (cap[k] < 0) { total = -1; break; }
        total += cap[k];
      }
      if (total >= L) hi = mid;
      else lo = mid;
    }
    /* the layers: each stage's bound at hi, trimmed to L from the slowest */
    int total = 0;
    for (int k = 0; k < pp; k++) {
      layers[k] = stage_bound(&sb, k, hi, false, &rk[k]);
      if (layers[k] < 0) return false;
      total += layers[k];
    }
    if (total < L) return false;
    while (total > L) {
      int w = -1;
      double wt_ = -1;
      for (int k = 0; k < pp; k++) {
        if (layers[k] == 0 || (layers[k] == 1 && k > 0 && k < pp - 1)) continue;
        int r = rk[k];
        double t = layers[k] * tb[r] + (k == 0 ? th[r] : 0) + (k == pp - 1 ? tt[r] : 0);
        if (t > wt_) wt_ = t, w = k;
      }
      if (w < 0) return false;
      layers[w]--;
      total--;
    }
    for (int k = 0; k < pp; k++)
      if (layers[k] == 0 && !(k == 0 && pp > 1 && s->head_end > 0) && !(k == pp - 1 && pp > 1)) return false;
  }
  /* each stage the fastest recomputation that fits what it holds */
  if (mixed) {
    bool same = true;
    for (int k = 0; k < pp; k++) {
      double inflight = stage_inflight(c, k), best = -1;
      for (int q = 0; q < nrc; q++) {
        int r = rcs[q];
        double t = layers[k] * tb[r] + (k == 0 ? th[r] : 0) + (k == pp - 1 ? tt[r] : 0);
        double mem = layers[k] * (wb + ab[r] * inflight) + (k == 0 ? wh + ah[r] * inflight : 0) +
                     stage_peak(pt, k, pp - 1, layers[k] > 0, r) +
                     (k == pp - 1 ? wt + at[r] * inflight : 0);
        if (sp->max_memory > 0 && mem > sp->max_memory) continue;
        if (best < 0 || t < best) best = t, rk[k] = r;
      }
      if (best < 0) return false;
      same &= rk[k] == rk[0];
    }
    if (same) return false;
  }
  /* per chunk: its time per micro-batch; per device (position): memory */
  double tmax = 0, per_mb_device = 0;
  for (int k = 0; k < chunks; k++) {
    int r = rk[k];
    time[k] = layers[k] * tb[r] + (k == 0 ? th[r] : 0) + (k == chunks - 1 ? tt[r] : 0) + (pp > 1 ? p2p : 0);
    if (L == 0) time[k] = th[r];
    if (time[k] > tmax) tmax = time[k];
  }
  double weights_max = 0;
  for (int pos = 0; pos < pp; pos++) {
    double dev_time = 0, mem = 0, weights = 0, peak = 0;
    for (int k = pos; k < chunks; k += pp) {
      double pk = stage_peak(pt, k, chunks - 1, layers[k] > 0, rk[k]);
      if (pk > peak) peak = pk;
      dev_time += time[k];
      double inflight = stage_inflight(c, pos);
      int r = rk[k];
      mem += layers[k] * (wb + ab[r] * inflight);
      weights += layers[k] * wb;
      if (k == 0) mem += wh + ah[r] * inflight, weights += wh;
      if (k == chunks - 1) mem += wt + at[r] * inflight, weights += wt;
      if (L == 0) mem = wh + ah[r] * inflight, weights = wh;
    }
    mem += peak;
    if (dev_time > per_mb_device) per_mb_device = dev_time;
    if (mem > mem_max) mem_max = mem;
    if (weights > weights_max) weights_max = weights;
  }
  double pipe;
  if (pp == 1) pipe = m * per_mb_device;
  else pipe = m * per_mb_device + (pp - 1) * tmax;
  /* gradients summed over the data-parallel replicas, during the last
   * backward; ZeRO gathers the parameters after the step (1, 2) or before
   * each use (3) */
  double elems = (L * B->param_elems + H->param_elems + T->param_elems) / pp;
  double xelems = (L * B->xparam_elems + H->xparam_elems + T->xparam_elems) / pp;
  double telems = tp > 1 ? (L * B->tpsum_elems + H->tpsum_elems + T->tpsum_elems) / pp : 0;
  double grad_bytes = (elems - xelems - telems) * sp->grad_b, xgrad_bytes = xelems * sp->grad_b;
  double tgrad_bytes = telems * sp->grad_b;
  double sync = 0;
  int cp = c->cp;
  if (dp * cp * ep > 1 || tgrad_bytes > 0) {
    /* the replicas of a parameter: dp of them tp * pp * cp * ep apart,
     * each with cp (or ep) tp apart (context parallelism sums gradients
     * over its group too, and so does expert parallelism but for the
     * experts' own, which have dp replicas only) */
    int stride = tp * pp * cp * ep;
    comm_kind k = z == 0 ? COMM_ALL_REDUCE : COMM_REDUCE_SCATTER;
    double ar = replica_cost(sp, k, grad_bytes, dp, cp * ep, tp, pp) + group_cost(sp, k, xgrad_bytes, dp, stride);
    /* the gradients of weights read whole by a split operator: summed
     * over the tensor-parallel group as well */
    if (tgrad_bytes > 0) ar += replica_cost(sp, k, tgrad_bytes, dp, cp * ep * tp, 1, pp);
    double overlap = range_time(B) * (L > 0 ? layers[0] : 1) / 2;
    sync = ar > overlap ? ar - overlap : 0;
    double xbytes = xelems * sp->param_b, wbytes = (L * B->params + H->params + T->params) / pp - xbytes;
    double gather = replica_cost(sp, COMM_ALL_GATHER, wbytes, dp, cp * ep, tp, pp) +
                    group_cost(sp, COMM_ALL_GATHER, xbytes, dp, stride);
    if (z == 1 || z == 2) sync += gather;
    if (z == 3) sync += m * gather;
  }
  /* the optimizer step: its traffic */
  double step_bytes = ((elems - xelems) / (z >= 1 ? dp * ep : 1) + xelems / (z >= 1 ? dp : 1)) *
                      (sp->grad_b + 2 * sp->state_b + 2 * sp->param_b);
  double opt = sp->symbolic ? step_bytes / SYM_MEM_BW : step_bytes / (sp->hw->mem_bw * sp->hw->memory_eff);
  c->analytic_time = pipe + sync + opt;
  c->analytic_memory = (int64_t)mem_max;
  c->analytic_weights = (int64_t)weights_max;
  if (sp->max_memory > 0 && mem_max > sp->max_memory) return false;
  /* the stages as ranges of operators */
  c->nstages = pp > 1 || c->schedule != SCHED_DEFAULT ? chunks : 0;
  if (c->nstages) {
    c->stages = arena_alloc(a, sizeof(search_stage) * (size_t)c->nstages);
    int l = 0;
    for (int k = 0; k < c->nstages; k++) {
      search_stage *st = &c->stages[k];
      st->layers = layers[k];
      st->position = k % pp;
      st->recompute = rk[k];
      st->first_op = k == 0 || L == 0 ? 0 : s->block_start[l];
      l += layers[k];
      st->last_op = k == c->nstages - 1 || L == 0 ? s->g->nops - 1 : s->block_start[l] - 1;
    }
  }
  if (mixed) c->recompute = common_recompute(rk, pp);
  return true;
}

/* ---- non-uniform pipelines ------------------------------------------------------ */

/* A pipeline whose stages have meshes of different shapes (as Alpa's
 * inter-operator pass gives each stage its own sub-mesh): pp stages,
 * stage k on D_k devices of its own that follow those of stage k - 1, as
 * [dp_k, tp_k] with tp_k dp_k = D_k, every stage splitting the same m
 * micro-batches over its own dp_k replicas. A stage's mesh lies inside
 * one node or on whole nodes. One tensor-parallel way of each stage
 * (opt[j]: its tp, dp and the parts' costs at its micro-batch size). */
typedef struct nuopt {
  int tp, dp, mbs;
  const parts *pt;
} nuopt;

/* The time, weights and activations per micro-batch of a stage with way
 * o holding n blocks (and the head when first, the tail when last). */
typedef struct nustage {
  double extra, tb, fixed, per;
  int bymem; /* the most blocks it holds in memory (set by nu_stage_cap) */
} nustage;

static nustage nu_stage(const space *sp, const nuopt *o, const search_plan *c, int k, int pp, double p2p, int rc) {
  const parts *pt = o->pt;
  int z = c->zero;
  double inflight = c->schedule == SCHED_GPIPE ? c->micro_batches
                                               : (c->micro_batches < pp - k ? c->micro_batches : pp - k);
  nustage st;
  st.tb = range_time(&pt->block) + pt->block.recompute[rc];
  /* (plans recompute the blocks only: the head and the tail keep theirs) */
  st.extra = p2p + (k == 0 ? range_time(&pt->head) : 0) + (k == pp - 1 ? range_time(&pt->tail) : 0);
  double wb = weights_bytes(sp, &pt->block, z, o->dp, 1, o->tp);
  st.per = wb + pt->block.act[rc] * inflight;
  st.fixed = stage_peak(pt, k, pp - 1, true, rc) + (k == 0 ? weights_bytes(sp, &pt->head, z, o->dp, 1, o->tp) + pt->head.act[0] * inflight : 0) +
             (k == pp - 1 ? weights_bytes(sp, &pt->tail, z, o->dp, 1, o->tp) + pt->tail.act[0] * inflight : 0);
  return st;
}

/* The most blocks stage k holds with way o under a micro-batch time T and
 * in memory; -1 none. */
static int nu_cap(const nustage *st, double T, int L) {
  if (T < st->extra) return -1;
  int bytime = st->tb > 0 ? (int)floor((T - st->extra) / st->tb + 1e-9) : L;
  int n = bytime < st->bymem ? bytime : st->bymem;
  return n > L ? L : n;
}

/* Sets st's bound in memory (the same under every step time). */
static void nu_stage_cap(const space *sp, nustage *st, int L) {
  double n = sp->max_memory > 0 ? floor((sp->max_memory - st->fixed) / st->per) : L;
  st->bymem = n >= L ? L : n < 0 ? -1 : (int)n;
}

/* Fills a non-uniform candidate from its stages' ways: the blocks dealt by
 * bisection on the micro-batch time, each stage taking the way that holds
 * the most, then the fastest way for what it holds; false when it cannot
 * fit or every stage took the same way (a uniform plan). A way is a mesh
 * shape of opt and, with mixed, one of the recomputations the space
 * allows (else the candidate's): false too when every stage then takes
 * the same recomputation (a candidate of one). */
static bool cost_nonuniform_in(const space *sp, const nuopt *const *opts, const int *nopts, search_plan *c, arena *a,
                               bool mixed) {
  const sshape *s = sp->s;
  int pp = c->pp, L = s->layers, m = c->micro_batches;
  int rcs[3], nrc = 0;
  if (mixed) {
    for (int r = 0; r < 3; r++)
      if (sp->rc_ok[r]) rcs[nrc++] = r;
    if (nrc < 2) return false;
  } else rcs[nrc++] = c->recompute;
  /* stage k's way j: shape opts[k][j / nrc], recomputation rcs[j % nrc];
   * st[off[k] + j] */
  int *off = arena_alloc(a, sizeof(int) * (size_t)(pp + 1)), *nw = arena_alloc(a, sizeof(int) * (size_t)pp);
  off[0] = 0;
  for (int k = 0; k < pp; k++) nw[k] = nopts[k] * nrc, off[k + 1] = off[k] + nw[k];
  nustage *st = arena_alloc(a, sizeof(nustage) * (size_t)(off[pp] ? off[pp] : 1));
  double lo = 0, hi = 0;
  int dpn = sp->per_node > 0 ? sp->per_node : 1;
  for (int k = 0, first = 0; k < pp; k++) {
    double most = 0;
    /* the stage's devices, [first, end): every way of it has as many */
    int end = first + (nopts[k] > 0 ? opts[k][0].tp * opts[k][0].dp : 0);
    /* its sends cross nodes where a neighbour starts on another node */
    bool across = (k > 0 && first % dpn == 0) || (k < pp - 1 && end % dpn == 0);
    first = end;
    for (int j = 0; j < nw[k]; j++) {
      const nuopt *o = &opts[k][j / nrc];
      double ob = o->pt->block.out_bytes;
      double p2p = sp->symbolic ? 2 * ob / (across ? SYM_NET_BW : SYM_NODE_BW)
                                : 2 * cost_collective(sp->hw, COMM_SEND, ob, ob, 2, across ? 2 : 1, 1).seconds;
      st[off[k] + j] = nu_stage(sp, o, c, k, pp, p2p, rcs[j % nrc]);
      nu_stage_cap(sp, &st[off[k] + j], L);
      double t = st[off[k] + j].extra + L * st[off[k] + j].tb;
      if (t > most) most = t;
    }
    hi += most;
  }
  hi += 1e-12;
  int *layers = arena_alloc(a, sizeof(int) * (size_t)pp), *way = arena_alloc(a, sizeof(int) * (size_t)pp);
  for (int it = 0; it < 40; it++) {
    double mid = (lo + hi) / 2;
    int total = 0;
    for (int k = 0; k < pp && total >= 0 && total < L; k++) {
      int best = -1;
      for (int j = 0; j < nw[k]; j++) {
        int n = nu_cap(&st[off[k] + j], mid, L);
        if (n > best) best = n;
      }
      if (best < 1 && k > 0 && k < pp - 1) best = -1;
      total = best < 0 ? -1 : total + best;
    }
    if (total >= L) hi = mid;
    else lo = mid;
  }
  int total = 0;
  for (int k = 0; k < pp; k++) {
    layers[k] = -1;
    for (int j = 0; j < nw[k]; j++) {
      int n = nu_cap(&st[off[k] + j], hi, L);
      if (n > layers[k]) layers[k] = n, way[k] = j;
    }
    if (layers[k] < 0) return false;
    total += layers[k];
  }
  if (total < L) return false;
  while (total > L) {
    int w = -1;
    double wt = -1;
    for (int k = 0; k < pp; k++) {
      if (layers[k] == 0 || (layers[k] == 1 && k > 0 && k < pp - 1)) continue;
      const nustage *x = &st[off[k] + way[k]];
      double t = layers[k] * x->tb + x->extra;
      if (t > wt) wt = t, w = k;
    }
    if (w < 0) return false;
    layers[w]--;
    total--;
  }
  for (int k = 0; k < pp; k++)
    if (layers[k] == 0 && !(k == 0 && s->head_end > 0) && k != pp - 1) return false;
  /* each stage's fastest way for the blocks it holds */
  double tmax = 0, mem_max = 0, weights_max = 0, sync = 0, opt_time = 0;
  bool same = true, same_rc = true;
  for (int k = 0; k < pp; k++) {
    double bt = -1;
    for (int j = 0; j < nw[k]; j++) {
      const nustage *x = &st[off[k] + j];
      double t = layers[k] * x->tb + x->extra, mem = x->fixed + layers[k] * x->per;
      if (sp->max_memory > 0 && mem > sp->max_memory) continue;
      if (bt < 0 || t < bt) bt = t, way[k] = j;
    }
    if (bt < 0) return false;
    const nuopt *o = &opts[k][way[k] / nrc], *o0 = &opts[0][way[0] / nrc];
    same &= o->tp == o0->tp && o->dp == o0->dp;
    same_rc &= way[k] % nrc == way[0] % nrc;
    const nustage *x = &st[off[k] + way[k]];
    const parts *pt = o->pt;
    if (bt > tmax) tmax = bt;
    double mem = x->fixed + layers[k] * x->per;
    if (mem > mem_max) mem_max = mem;
    int z = c->zero;
    double weights = layers[k] * weights_bytes(sp, &pt->block, z, o->dp, 1, o->tp) +
                     (k == 0 ? weights_bytes(sp, &pt->head, z, o->dp, 1, o->tp) : 0) +
                     (k == pp - 1 ? weights_bytes(sp, &pt->tail, z, o->dp, 1, o->tp) : 0);
    if (weights > weights_max) weights_max = weights;
    /* the stage's gradients summed over its dp replicas (tp apart), those
     * of weights read whole by split operators over dp x tp */
    double elems = layers[k] * pt->block.param_elems + (k == 0 ? pt->head.param_elems : 0) +
                   (k == pp - 1 ? pt->tail.param_elems : 0);
    double telems = o->tp < 2 ? 0 : layers[k] * pt->block.tpsum_elems + (k == 0 ? pt->head.tpsum_elems : 0) +
                                    (k == pp - 1 ? pt->tail.tpsum_elems : 0);
    double pbytes = layers[k] * pt->block.params + (k == 0 ? pt->head.params : 0) + (k == pp - 1 ? pt->tail.params : 0);
    comm_kind kind = z == 0 ? COMM_ALL_REDUCE : COMM_REDUCE_SCATTER;
    double ar = group_cost(sp, kind, (elems - telems) * sp->grad_b, o->dp, o->tp) +
                group_cost(sp, kind, telems * sp->grad_b, o->dp * o->tp, 1);
    double overlap = range_time(&pt->block) * layers[k] / 2;
    double sk = ar > overlap ? ar - overlap : 0;
    if (z == 1 || z == 2) sk += group_cost(sp, COMM_ALL_GATHER, pbytes, o->dp, o->tp);
    if (sk > sync) sync = sk;
    double step_bytes = elems / (z >= 1 ? o->dp : 1) * (sp->grad_b + 2 * sp->state_b + 2 * sp->param_b);
    double ot = sp->symbolic ? step_bytes / SYM_MEM_BW : step_bytes / (sp->hw->mem_bw * sp->hw->memory_eff);
    if (ot > opt_time) opt_time = ot;
  }
  if (same || (mixed && same_rc)) return false;
  c->analytic_time = (m + pp - 1) * tmax + sync + opt_time;
  c->analytic_memory = (int64_t)mem_max;
  c->analytic_weights = (int64_t)weights_max;
  if (sp->max_memory > 0 && mem_max > sp->max_memory) return false;
  /* the most common way gives the flat fields */
  const nuopt *mode = &opts[0][way[0] / nrc];
  int best_count = 0;
  int *rk = arena_alloc(a, sizeof(int) * (size_t)pp);
  for (int k = 0; k < pp; k++) {
    int n = 0;
    const nuopt *o = &opts[k][way[k] / nrc];
    for (int q = 0; q < pp; q++) n += opts[q][way[q] / nrc].tp == o->tp && opts[q][way[q] / nrc].dp == o->dp;
    if (n > best_count) best_count = n, mode = o;
    rk[k] = rcs[way[k] % nrc];
  }
  c->recompute = common_recompute(rk, pp);
  c->tp = mode->tp;
  c->dp = mode->dp;
  c->micro_batch_size = mode->mbs;
  c->nonuniform = true;
  c->nstages = pp;
  c->stages = arena_alloc(a, sizeof(search_stage) * (size_t)pp);
  c->op_split = arena_alloc(a, sizeof(char *) * (size_t)s->g->nops);
  int l = 0;
  for (int k = 0; k < pp; k++) {
    search_stage *x = &c->stages[k];
    const nuopt *o = &opts[k][way[k] / nrc];
    x->layers = layers[k];
    x->position = k;
    x->recompute = rk[k];
    x->tp = o->tp;
    x->dp = o->dp;
    x->micro_batch_size = o->mbs;
    x->first_op = k == 0 ? 0 : s->block_start[l];
    l += layers[k];
    x->last_op = k == pp - 1 ? s->g->nops - 1 : s->block_start[l] - 1;
    for (int op = x->first_op; op <= x->last_op; op++) {
      const char *dim = parts_dim(s, o->pt, op);
      c->op_split[op] = o->tp == 1 ? NULL : dim;
      if (o->tp > 1 && s->seq && strcmp(dim, s->seq) == 0) c->sequence_parallel = true;
    }
  }
  return true;
}

/* cost_nonuniform_in, what it allocates in a given back when it fails
 * (most candidates of deep pipelines do). */
static bool cost_nonuniform(const space *sp, const nuopt *const *opts, const int *nopts, search_plan *c, arena *a,
                            bool mixed) {
  arena_mark m = arena_here(a);
  if (cost_nonuniform_in(sp, opts, nopts, c, a, mixed)) return true;
  arena_rewind(a, m);
  return false;
}

/* Whether D devices from first lie inside one node or on whole nodes. */
static bool nu_fits_node(int first, int D, int dpn) {
  if (D <= 0) return false;
  if (D <= dpn) return dpn % D == 0 && first % dpn + D <= dpn;
  return D % dpn == 0 && first % dpn == 0;
}

/* A way of dealing N devices to the stages of a pipeline: the first j on
 * A devices each, the last pp - j on B each (j = pp: A each). */
typedef struct nusizes {
  int j, A, B;
} nusizes;

/* Whether the stages of sizes z, placed one after the other from device
 * 0, each lie inside a node or on whole nodes. */
static bool nu_sizes_fit(nusizes z, int pp, int dpn) {
  for (int k = 0, first = 0; k < pp; k++) {
    int D = k < z.j ? z.A : z.B;
    if (!nu_fits_node(first, D, dpn)) return false;
    first += D;
  }
  return true;
}

/* The ways of dealing N devices to pp stages that the search tries, in
 * *out; their count. N / pp each; and, of two sizes, the first j stages
 * (0 < j < pp) on A devices each and the last pp - j on B != A, one of A
 * and B a power of two: the stage of the head (last) or of the embedding
 * (first) may take more devices, or fewer, than the others. Deeper than
 * four stages, only the first stage or the last differs (j = 1 or pp - 1).
 * A family of O(pp log N) ways (O(log N) beyond four stages), not every
 * composition of N (which grows exponentially with pp). Every stage lies inside a node or on whole
 * nodes. */
static int nu_sizes(arena *a, int N, int pp, int dpn, nusizes **out) {
  int cap = 1, n = 0;
  for (int x = 1; x < N; x *= 2) cap += 2 * (pp - 1);
  nusizes *z = arena_alloc(a, sizeof(nusizes) * (size_t)cap);
  if (N % pp == 0 && nu_sizes_fit((nusizes){pp, N / pp, N / pp}, pp, dpn)) z[n++] = (nusizes){pp, N / pp, N / pp};
  for (int j = 1; j < pp; j++)
    for (int x = 1; x < N && (pp <= 4 || j == 1 || j == pp - 1); x *= 2)
      for (int side = 0; side < 2; side++) {
        /* side 0: A = x; side 1: B = x */
        int64_t rest = N - (int64_t)(side == 0 ? j : pp - j) * x;
        int parts = side == 0 ? pp - j : j;
        if (rest <= 0 || rest % parts) continue;
        int y = (int)(rest / parts);
        nusizes w = side == 0 ? (nusizes){j, x, y} : (nusizes){j, y, x};
        if (w.A == w.B || !nu_sizes_fit(w, pp, dpn)) continue;
        bool seen = false;
        for (int i = 0; i < n && !seen; i++) seen = z[i].j == w.j && z[i].A == w.A && z[i].B == w.B;
        if (!seen) z[n++] = w;
      }
  *out = z;
  return n;
}

/* The ways [dp, tp] of a stage of D devices for m micro-batches under ZeRO
 * z (the parts' costs of each tp and micro-batch size computed once, in
 * tab); their count. */
static int nu_ways(arena *a, sshape *s, const hw_model *hw, bool symbolic, const search_space *spc, parts *tab,
                   bool *have, int D, int64_t m, int z, nuopt *out) {
  int ntp = spc->tp.n, nmb = spc->mbs.n, n = 0;
  int64_t Bsz = s->batch_size;
  for (int ti = 0; ti < ntp; ti++) {
    int tp = spc->tp.v[ti];
    if (tp < 1 || D % tp) continue;
    int dp = D / tp;
    if ((z > 0 && dp < 2) || Bsz % (m * dp)) continue;
    int mbs = (int)(Bsz / (m * dp)), mi = 0;
    while (mi < nmb && spc->mbs.v[mi] != mbs) mi++;
    if (mi == nmb) continue;
    if (!have[ti * nmb + mi]) {
      /* a parameter that stages of different meshes read (an embedding
       * tied to the head) is read whole by each: its gradients, summed
       * across the stages, then have one layout */
      s->tied_whole = true;
      tab[ti * nmb + mi] = cost_parts(a, s, hw, symbolic, tp, 1, 1, mbs);
      s->tied_whole = false;
      have[ti * nmb + mi] = true;
    }
    if (!tab[ti * nmb + mi].ok) continue;
    out[n++] = (nuopt){tp, dp, mbs, &tab[ti * nmb + mi]};
  }
  return n;
}

/* ---- the frontier --------------------------------------------------------------- */

static int by_time(const void *x, const void *y) {
  const search_plan *a = x, *b = y;
  double ta = a->simulated ? a->step_time : a->analytic_time, tb = b->simulated ? b->step_time : b->analytic_time;
  if (ta != tb) return ta < tb ? -1 : 1;
  /* as fast: the one with less memory first, which dominates the other */
  int64_t ma = a->simulated ? a->peak_memory : a->analytic_memory, mb = b->simulated ? b->peak_memory : b->analytic_memory;
  return ma < mb ? -1 : ma > mb;
}

/* The hooks' order; ties by time. */
static int by_rank(const void *x, const void *y) {
  const search_plan *a = x, *b = y;
  if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
  return by_time(x, y);
}

/* Whether every stage of c recomputes alike. */
static bool uniform_recompute(const search_plan *c) {
  for (int k = 0; k < c->nstages; k++)
    if (c->stages[k].recompute != c->recompute) return false;
  return true;
}

/* Whether a and b are one pipeline that differs at most in its schedule
 * (1F1B, GPipe, interleaved with a chunk count) and its stages' layers: the
 * same meshes, the same layout of every operator, micro-batches,
 * recomputation (alike in every stage) and ZeRO stage. A non-uniform plan
 * is a pipeline of its own. */

static bool same_pipeline(const weft_graph *g, const search_plan *a, const search_plan *b) {
  if (a->nonuniform || b->nonuniform) return false;
  if (a->tp != b->tp || a->pp != b->pp || a->dp != b->dp || a->cp != b->cp || a->ep != b->ep ||
      a->micro_batches != b->micro_batches || a->micro_batch_size != b->micro_batch_size ||
      a->recompute != b->recompute || a->zero != b->zero || a->sequence_parallel != b->sequence_parallel ||
      a->bucket_bytes != b->bucket_bytes)
    return false;
  if (!uniform_recompute(a) || !uniform_recompute(b)) return false;
  if (!a->op_split != !b->op_split) return false;
  for (int op = 0; a->op_split && op < g->nops; op++) {
    const char *x = a->op_split[op], *y = b->op_split[op];
    if (!x != !y || (x && strcmp(x, y) != 0)) return false;
  }
  return true;
}

/* ---- building and simulating a candidate ------------------------------------------ */

static bool simulate(const weft_graph *g, const weft_cluster *cl, const hw_model *hw, bool symbolic, double max_memory,
                     search_plan *c, arena *tmp) {
  arena_reset(tmp);
  weft_srcs none = {0};
  weft_diags sink = {.arena = tmp, .srcs = &none, .max_errors = 4};
  plan_opts po = {.reps = true};
  weft_plan *p = plan_apply(g, cl, &c->decisions, &po, tmp, &sink);
  weft_program *pr = p ? lower_plan(p, NULL, tmp, &sink) : NULL;
  if (pr && !validate_program(pr, &(validate_opts){.skip_memory = true}, &sink)) pr = NULL;
  if (!pr) {
    if (getenv("WEFT_SEARCH_DEBUG") && sink.n > 0) {
      fprintf(stderr, "weft search: candidate rejected: %s\n", sink.items[0].msg);
      search_print_body(c, g, stderr);
    }
    return false;
  }
  weft_sim *s = sim_run_with(pr, symbolic ? NULL : hw, 0);
  if (!s) return false;
  weft_estimate e;
  sim_estimate(s, &e);
  c->simulated = true;
  c->step_time = symbolic ? c->analytic_time : e.step_time;
  c->peak_memory = e.peak_max;
  double cap = max_memory > 0 ? max_memory : (double)e.device_memory;
  c->fits = cap <= 0 || (double)e.peak_max <= cap;
  sim_free(s);
  return true;
}

/* ---- the space ------------------------------------------------------------------ */

static search_values values_new(arena *a, int cap) {
  return (search_values){0, arena_alloc(a, sizeof(int) * (size_t)(cap > 0 ? cap : 1))};
}

/* What the search tries unless a hook says otherwise: tensor parallelism
 * over powers of two inside a node, pipelines as deep as the blocks allow,
 * micro-batches of up to 64, every schedule, recomputation and ZeRO stage. */
static void default_space(sshape *s, int N, int dpn, arena *a, search_space *out) {
  memset(out, 0, sizeof *out);
  out->tp = values_new(a, 32);
  for (int tp = 1; tp <= dpn && tp <= N; tp *= 2)
    if (N % tp == 0) out->tp.v[out->tp.n++] = tp;
  out->pp = values_new(a, N);
  for (int pp = 1; pp <= N; pp++)
    if (N % pp == 0 && (pp == 1 || (s->layers > 0 && pp <= s->layers))) out->pp.v[out->pp.n++] = pp;
  out->cp = values_new(a, 8);
  out->cp.v[out->cp.n++] = 1;
  for (int cp = 2; cp <= 64 && cp <= N && s->cp_ok; cp *= 2)
    if (N % cp == 0 && cp_divides(s, cp)) out->cp.v[out->cp.n++] = cp;
  out->ep = values_new(a, 64);
  out->ep.v[out->ep.n++] = 1;
  for (int ep = 2; ep <= s->experts && ep <= N && ep <= 64; ep++)
    if (N % ep == 0 && ep_divides(s, ep)) out->ep.v[out->ep.n++] = ep;
  out->mbs = values_new(a, 64);
  for (int64_t mbs = 1; mbs <= s->batch_size && mbs <= 64; mbs++)
    if (s->batch_size % mbs == 0) out->mbs.v[out->mbs.n++] = (int)mbs;
  out->schedule[SCHED_1F1B] = out->schedule[SCHED_GPIPE] = out->schedule[SCHED_INTERLEAVED] = true;
  out->interleave = values_new(a, 2);
  out->interleave.v[out->interleave.n++] = 2;
  out->interleave.v[out->interleave.n++] = 4;
  for (int i = 0; i < 3; i++) out->recompute[i] = true;
  for (int i = 0; i < 4; i++) out->zero[i] = true;
  out->uneven = true;
  out->nonuniform = true;
  out->frontier = true;
}

/* A list of one value. */
static search_values one_value(arena *a, int v) {
  search_values r = values_new(a, 1);
  r.v[r.n++] = v;
  return r;
}

/* What a plan writes beside `search` narrows the space to it: a written
 * mesh fixes tp, pp, cp and ep (dp follows, and its stages share it), a
 * written schedule the pipelines' (pipelines only), recomputation (of the
 * blocks, in the costs) and the ZeRO stage. */
static void fix_space(const search_fixed *f, const sshape *s, arena *a, search_space *spc) {
  if (!f) return;
  if (f->mesh >= 0) {
    spc->tp = one_value(a, f->tp);
    spc->pp = one_value(a, f->pp);
    spc->cp = one_value(a, f->cp);
    spc->ep = one_value(a, f->ep);
    spc->nonuniform = false;
  }
  if (f->nstages) {
    /* written stages: pp x interleave of them, on one mesh shape */
    search_values pp = values_new(a, spc->pp.n + 1), il = values_new(a, spc->pp.n + 1);
    for (int i = 0; i < spc->pp.n; i++) {
      int x = spc->pp.v[i];
      if (x < 1 || f->nstages % x || (f->mesh >= 0 && x != f->pp)) continue;
      pp.v[pp.n++] = x;
      bool seen = false;
      for (int q = 0; q < il.n; q++) seen |= il.v[q] == f->nstages / x;
      if (!seen) il.v[il.n++] = f->nstages / x;
    }
    spc->pp = pp;
    spc->interleave = il;
    spc->nonuniform = false;
  }
  if (f->tp_parts) {
    /* a written tensor-parallel layout: on one mesh shape, without cp or ep */
    spc->tp = one_value(a, f->tp_parts);
    spc->cp = one_value(a, 1);
    spc->ep = one_value(a, 1);
    spc->nonuniform = false;
  }
  if (f->schedule >= 0) {
    for (int k = 0; k <= SCHED_INTERLEAVED; k++) spc->schedule[k] = k == f->schedule;
    int n = 0;
    for (int i = 0; i < spc->pp.n; i++)
      if (spc->pp.v[i] > 1) spc->pp.v[n++] = spc->pp.v[i];
    spc->pp.n = n;
  }
  if (f->recompute >= 0)
    for (int i = 0; i < 3; i++) spc->recompute[i] = i == (s->layers > 0 ? f->recompute : 0);
  if (f->zero >= 0)
    for (int z = 0; z < 4; z++) spc->zero[z] = z == f->zero;
}

/* ---- the search ----------------------------------------------------------------- */

/* The points of a pipeline's frontier of time against memory the
 * inter-stage pass gives beyond its fastest. */
enum { FRONTIER_STEPS = 4 };

/* The frontier's memory end simulates a pipeline in another schedule (or
 * with other layers per stage) than one already simulated only where the
 * analytic cost puts it at less than this share of that one's memory. */
#define SIBLING_MEMORY 0.95

static void report(const search_opts *o, int64_t searched, int64_t pruned, double best, double t0, const char *phase) {
  if (!o->progress) return;
  search_progress pg = {searched, pruned, best, now() - t0, phase};
  o->progress(o->ctx, &pg);
}

/* Candidate c ranked by its analytic time, kept unless the heuristics'
 * prune hook drops it (counted as pruned and dropped; failed when the hook
 * fails). */
static void add_candidate(const search_hooks *hk, search_plan *c, arena *a, search_plan **cands, int *ccap,
                          int *ncand, int64_t *pruned, int64_t *dropped, bool *failed) {
  c->rank = c->analytic_time;
  if (hk && hk->prune) {
    int keep = hk->prune(hk->ctx, c);
    if (keep < 0) *failed = true;
    if (keep <= 0) {
      (*pruned)++, (*dropped)++;
      return;
    }
  }
  arena_grow(a, (void **)cands, ccap, *ncand + 1, sizeof(search_plan));
  (*cands)[(*ncand)++] = *c;
}

bool search_run(const weft_graph *g, const weft_cluster *cl, const search_opts *o, arena *a, weft_diags *dg,
                search_result *out) {
  memset(out, 0, sizeof *out);
  out->best = -1;
  double t0 = now();
  weft_loc none = {0};
  hw_model hw;
  if (!hw_from_cluster(o->symbolic ? NULL : dg, g, cl, "the search's plans", none, &hw) && !o->symbolic) return false;
  hw.devices_per_node = cl->devices_per_node > 0 ? cl->devices_per_node : 1;
  sshape s;
  const char *why = "";
  if (!sshape_build(a, g, &s, &why)) {
    diag_add(dg, DIAG_ERROR, none, "cannot search plans of model %s: %s", g->name, why);
    return false;
  }
  if (o->fixed && o->fixed->tp_written && !search_fixed_want(a, &s, o->fixed, dg)) return false;
  out->layers = s.layers;
  out->block = s.block_name;
  space sp = {&s, &hw, o->symbolic, cl->ndevices, hw.devices_per_node, o->max_memory, 0, 0, 0, true, {false, false, false},
              NULL, 0};
  if (o->fixed && o->fixed->nstages) {
    int *fl;
    if (!search_fixed_layers(a, &s, o->fixed, dg, &fl)) return false;
    sp.fixed_layers = fl;
    sp.nfixed = o->fixed->nstages;
  }
  if (sp.max_memory <= 0) sp.max_memory = (double)cl->device_memory;
  bytes_per_elem(g, &sp.param_b, &sp.grad_b, &sp.state_b);
  int N = cl->ndevices, dpn = hw.devices_per_node;
  int64_t Bsz = s.batch_size;
  const search_hooks *hk = o->hooks;
  search_space spc;
  default_space(&s, N, dpn, a, &spc);
  if (hk && hk->space && !hk->space(hk->ctx, &spc, a)) return false;
  fix_space(o->fixed, &s, a, &spc);
  sp.uneven = spc.uneven;
  int nrc_ok = 0;
  for (int r = 0; r < 3; r++) nrc_ok += sp.rc_ok[r] = spc.recompute[r];
  /* the schedules of pipelines, with their stages per device */
  sched_kind scheds[2 + 64];
  int vs[2 + 64], nsched = 0;
  if (spc.schedule[SCHED_1F1B]) scheds[nsched] = SCHED_1F1B, vs[nsched++] = 1;
  if (spc.schedule[SCHED_GPIPE]) scheds[nsched] = SCHED_GPIPE, vs[nsched++] = 1;
  for (int i = 0; i < spc.interleave.n && spc.schedule[SCHED_INTERLEAVED] && nsched < 2 + 64; i++)
    if (spc.interleave.v[i] > 1) scheds[nsched] = SCHED_INTERLEAVED, vs[nsched++] = spc.interleave.v[i];
  arena work;
  arena_init(&work);
  /* the candidates, in a's memory */
  search_plan *cands = NULL;
  int ncand = 0, ccap = 0;
  int64_t searched = 0, pruned = 0, dropped = 0;  /* dropped: by the prune hook */
  bool out_of_time = false, failed = false;
  for (int ti = 0; ti < spc.tp.n && !out_of_time && !failed; ti++) {
    int tp = spc.tp.v[ti];
    if (tp < 1 || N % tp) continue;
    for (int ci = 0; ci < spc.cp.n * spc.ep.n && !out_of_time && !failed; ci++) {
      int cp = spc.cp.v[ci / spc.ep.n], ep = spc.ep.v[ci % spc.ep.n];
      if (cp < 1 || (N / tp) % cp || !cp_divides(&s, cp)) continue;
      /* expert parallelism: not with context parallelism */
      if (ep < 1 || (N / tp / cp) % ep || !ep_divides(&s, ep) || (ep > 1 && cp > 1)) continue;
      /* the configurations of each micro-batch size, for this tp and cp */
      for (int mi = 0; mi < spc.mbs.n && !out_of_time && !failed; mi++) {
        int mbs = spc.mbs.v[mi];
        if (mbs < 1 || Bsz % mbs) continue;
        arena_reset(&work);
        parts pts[3];
        int npt = cost_parts_all(a, &s, &hw, o->symbolic, tp, cp, ep, mbs, o->max_memory > 0, pts);
        for (int vi = 0; vi < npt && !failed; vi++) {
        const parts pt = pts[vi];
        for (int pi = 0; pi < spc.pp.n && !failed; pi++) {
          int pp = spc.pp.v[pi];
          if (pp < 1 || (N / tp / cp / ep) % pp) continue;
          if (pp > 1 && (s.layers == 0 || pp > s.layers)) continue;
          int dp = N / tp / cp / ep / pp;
          if (Bsz % ((int64_t)dp * ep * mbs)) continue;
          int m = (int)(Bsz / ((int64_t)dp * ep * mbs));
          if (m > 4096 || (o->fixed && o->fixed->micro_batches > 0 && m != o->fixed->micro_batches)) continue;
          /* one stage: gradient accumulation over the micro-batches, whatever the schedules */
          for (int si = 0; si < (pp == 1 ? 1 : nsched) && !failed; si++) {
            sched_kind sched = pp == 1 ? (m > 1 ? SCHED_1F1B : SCHED_DEFAULT) : scheds[si];
            int v = pp == 1 ? 1 : vs[si];
            if (v > 1 && (s.layers % (pp * v) || m < pp)) continue;
            /* rc 3: each stage its own recomputation */
            for (int rc = 0; rc < 4 && !failed; rc++) {
              if (rc > 0 && s.layers == 0) break;
              if (rc < 3 ? !spc.recompute[rc] : pp < 2 || v > 1 || nrc_ok < 2) continue;
              for (int z = 0; z <= 3 && !failed; z++) {
                if (z > 0 && dp == 1) break;
                if (z == 3 && pp > 1) break;
                if (!spc.zero[z]) continue;
                searched++;
                const search_plan c0 = {.tp = tp, .pp = pp, .dp = dp, .cp = cp, .ep = ep, .micro_batches = m,
                                        .micro_batch_size = mbs, .schedule = sched, .interleave = v, .recompute = rc % 3,
                                        .zero = z, .bucket_bytes = PLAN_DEFAULT_BUCKET};
                search_plan c = c0;
                if (!cost_candidate(&sp, &pt, &c, a, rc == 3)) {
                  pruned++;
                  continue;
                }
                /* the operators' tensor-parallel dimensions */
                c.op_split = arena_alloc(a, sizeof(char *) * (size_t)g->nops);
                for (int op = 0; op < g->nops; op++) {
                  const char *dim = parts_dim(&s, &pt, op);
                  c.op_split[op] = tp == 1 ? NULL : dim;
                  if (tp > 1 && s.seq && strcmp(dim, s.seq) == 0) c.sequence_parallel = true;
                }
                add_candidate(hk, &c, a, &cands, &ccap, &ncand, &pruned, &dropped, &failed);
                /* the pipeline's frontier (FT): its fastest under a cap just
                 * below the memory of the last, while that gives less */
                space tight = sp;
                for (int f = 0; f < FRONTIER_STEPS && spc.frontier && pp > 1 && !failed; f++) {
                  tight.max_memory = (double)c.analytic_memory * (1 - 1e-9);
                  search_plan d = c0;
                  if (!cost_candidate(&tight, &pt, &d, a, rc == 3) || d.analytic_memory >= c.analytic_memory) break;
                  d.op_split = c.op_split;
                  d.sequence_parallel = c.sequence_parallel;
                  add_candidate(hk, &d, a, &cands, &ccap, &ncand, &pruned, &dropped, &failed);
                  c = d;
                }
              }
            }
          }
        }
        }
        if (o->time_limit > 0 && now() - t0 > o->time_limit) out_of_time = true;
        double best = 0;
        for (int i = 0; i < ncand; i++)
          if (best == 0 || cands[i].analytic_time < best) best = cands[i].analytic_time;
        report(o, searched, pruned, best, t0, "search");
      }
    }
  }
  /* pipelines whose stages have meshes of their own shapes: stage k of pp
   * on D_k devices of its own (N / pp each, or the first j stages on A
   * each and the last pp - j on B: nu_sizes), as [dp_k, tp_k]; the same
   * micro-batches in every stage */
  if (spc.nonuniform && !failed && !out_of_time && s.layers > 1) {
    int ntp = spc.tp.n, nmb = spc.mbs.n;
    parts *tab = arena_alloc(a, sizeof(parts) * (size_t)(ntp * nmb + 1));
    bool *have = arena_alloc(a, sizeof(bool) * (size_t)(ntp * nmb + 1));
    nuopt *optv[2] = {arena_alloc(a, sizeof(nuopt) * (size_t)(ntp + 1)), arena_alloc(a, sizeof(nuopt) * (size_t)(ntp + 1))};
    for (int pi = 0; pi < spc.pp.n && !failed && !out_of_time; pi++) {
      int pp = spc.pp.v[pi];
      if (pp < 2 || pp > s.layers) continue;
      const nuopt **opts = arena_alloc(a, sizeof(nuopt *) * (size_t)pp);
      int *nopts = arena_alloc(a, sizeof(int) * (size_t)pp);
      nusizes *sizes = NULL;
      int nsizes = nu_sizes(a, N, pp, dpn, &sizes);
      for (int di = 0; di < nsizes && !failed; di++) {
        int j = sizes[di].j, D = sizes[di].A, D1 = sizes[di].B;
        for (int64_t m = 1; m <= Bsz && m <= 4096 && !failed; m++) {
          if (Bsz % m || m < 1 || (o->fixed && o->fixed->micro_batches > 0 && m != o->fixed->micro_batches)) continue;
          for (int si = 0; si < nsched && !failed; si++) {
            if (vs[si] != 1) continue;
            /* rc 3: each stage its own recomputation */
            for (int rc = 0; rc < 4 && !failed; rc++) {
              if (rc < 3 ? !spc.recompute[rc] : nrc_ok < 2) continue;
              for (int z = 0; z <= 2 && !failed; z++) {
                if (!spc.zero[z]) continue;
                int n0 = nu_ways(a, &s, &hw, o->symbolic, &spc, tab, have, D, m, z, optv[0]);
                int n1 = D1 == D ? n0 : nu_ways(a, &s, &hw, o->symbolic, &spc, tab, have, D1, m, z, optv[1]);
                if (D1 == D ? n0 < 2 : n0 < 1 || n1 < 1) continue;
                for (int k = 0; k < pp; k++) {
                  bool second = D1 != D && k >= j;
                  opts[k] = optv[second];
                  nopts[k] = second ? n1 : n0;
                }
                searched++;
                const search_plan c0 = {.pp = pp, .cp = 1, .ep = 1, .micro_batches = (int)m, .schedule = scheds[si],
                                        .interleave = 1, .recompute = rc % 3, .zero = z, .bucket_bytes = PLAN_DEFAULT_BUCKET};
                search_plan c = c0;
                if (!cost_nonuniform(&sp, opts, nopts, &c, a, rc == 3)) {
                  pruned++;
                  continue;
                }
                add_candidate(hk, &c, a, &cands, &ccap, &ncand, &pruned, &dropped, &failed);
                /* its frontier, as for a pipeline on one mesh shape */
                space tight = sp;
                for (int f = 0; f < FRONTIER_STEPS && spc.frontier && !failed; f++) {
                  tight.max_memory = (double)c.analytic_memory * (1 - 1e-9);
                  search_plan d = c0;
                  if (!cost_nonuniform(&tight, opts, nopts, &d, a, rc == 3) || d.analytic_memory >= c.analytic_memory) break;
                  add_candidate(hk, &d, a, &cands, &ccap, &ncand, &pruned, &dropped, &failed);
                  c = d;
                }
              }
            }
          }
        }
      }
      if (o->time_limit > 0 && now() - t0 > o->time_limit) out_of_time = true;
    }
  }
  s.cp = 1;
  s.ep = 1;
  out->searched = searched;
  out->pruned = pruned;
  out->search_s = now() - t0;
  if (failed) {
    arena_free(&work);
    return false;
  }
  /* the hooks' order in place of the analytic step time */
  out->ranked = hk && hk->rank;
  for (int i = 0; i < ncand && out->ranked; i++)
    if (!hk->rank(hk->ctx, &cands[i], &cands[i].rank)) {
      arena_free(&work);
      return false;
    }
  if (ncand == 0 && dropped > 0) {
    arena_free(&work);
    weft_diag *d = diag_add(dg, DIAG_ERROR, none, "the heuristics pruned every candidate of model %s on %d devices of %s "
                            "that fits (%lld of %lld)", g->name, N, cl->name, (long long)dropped, (long long)searched);
    diag_hint(d, dg, "a prune hook returns false for the candidates to drop, nothing or true for the others");
    return false;
  }
  if (ncand == 0 && o->fixed && searched == 0) {
    arena_free(&work);
    const char *name = o->fixed->written->name ? o->fixed->written->name : "plan";
    weft_diag *d = diag_add(dg, DIAG_ERROR, o->fixed->written->loc, "the search has no plan of model %s on %d devices "
                            "that keeps what plan %s writes (%s)", g->name, N, name,
                            search_fixed_kept(a, o->fixed));
    diag_hint(d, dg, "the sizes and stages the search tries are in docs/search.md; leave more of plan %s to it", name);
    return false;
  }
  if (ncand == 0) {
    arena_free(&work);
    diag_add(dg, DIAG_ERROR, none, "no plan of model %s fits %d devices of %s: every one of %lld candidates needs more "
             "memory than a device has", g->name, N, cl->name, (long long)searched);
    return false;
  }
  /* the frontier of (time, memory), and the fastest: simulated */
  qsort(cands, (size_t)ncand, sizeof *cands, out->ranked ? by_rank : by_time);
  /* each simulation of a large plan takes seconds: few of them, the
   * fastest (on many devices the frontier's memory end is left out) */
  int top = o->top > 0 ? o->top : (N <= 64 ? 24 : 3);
  bool *pick = arena_alloc(a, (size_t)ncand);
  int npick = 0;
  /* ZeRO-3 plans are lowered for every tensor-parallel peer (plan.h, rep):
   * on many devices only plans without it are simulated */
  bool big = N > 64;
  for (int i = 0; i < ncand && npick < top; i++)
    if (!big || cands[i].zero < 3) pick[i] = true, npick++;
  /* the frontier's memory end: the least memory at each step of time. A
   * pipeline already simulated in another schedule is simulated again only
   * for a clear step of memory (SIBLING_MEMORY): the memory end holds the
   * plans of most micro-batches, and one of them (every device lowered
   * where tensor-parallel peers exchange parts, plan.h rep) costs as much
   * to simulate as many of the top. Under --objective memory or
   * --max-memory, where the memory end may be the answer, every step is
   * simulated. */
  bool once = o->objective != SEARCH_MEMORY && !(o->max_memory > 0);
  int64_t least = -1;
  for (int i = 0; i < ncand && npick < top + top / 2 && !big; i++) {
    if (least >= 0 && cands[i].analytic_memory >= least) continue;
    bool sibling = false;
    for (int j = 0; j < i && once && !sibling && !pick[i]; j++)
      sibling = pick[j] && (double)cands[i].analytic_memory >= SIBLING_MEMORY * (double)cands[j].analytic_memory &&
                same_pipeline(g, &cands[i], &cands[j]);
    if (sibling) continue;
    least = cands[i].analytic_memory;
    if (!pick[i]) pick[i] = true, npick++;
  }
  double t1 = now();
  int nsim = 0, rejected = 0, dropped_sim = 0;
  search_plan *sims = arena_alloc(a, sizeof(search_plan) * (size_t)(2 * npick + 1));
  double best_time = 0;
  for (int i = 0; i < ncand; i++) {
    if (!pick[i]) continue;
    search_plan c = cands[i];
    emit_plan(a, &s, o->fixed, &c);
    if (!simulate(g, cl, &hw, o->symbolic, o->max_memory, &c, &work)) {
      /* a candidate the pipeline refuses gives its place to the next one
       * (up to as many again as were picked) */
      rejected++;
      for (int k = i + 1; k < ncand && rejected <= npick; k++)
        if (!pick[k] && (!big || cands[k].zero < 3)) {
          pick[k] = true;
          break;
        }
      continue;
    }
    /* the hooks again, with the simulator's figures */
    c.rank = c.step_time;
    int keep = hk && hk->prune ? hk->prune(hk->ctx, &c) : 1;
    if (keep > 0 && out->ranked && !hk->rank(hk->ctx, &c, &c.rank)) keep = -1;
    if (keep < 0) {
      arena_free(&work);
      return false;
    }
    if (keep == 0) {
      out->pruned = ++pruned;
      dropped_sim++;
      continue;
    }
    sims[nsim++] = c;
    if (c.fits && (best_time == 0 || c.step_time < best_time)) best_time = c.step_time;
    report(o, searched, pruned, best_time, t0, "simulate");
  }
  out->rejected = rejected;
  /* gradient buckets of the best, with the simulator as the oracle (DisCo):
   * halving and doubling from the default while it helps */
  int (*order)(const void *, const void *) = out->ranked ? by_rank : by_time;
  qsort(sims, (size_t)nsim, sizeof *sims, order);
  int bi = -1;
  for (int i = 0; i < nsim && bi < 0; i++)
    if (sims[i].fits) bi = i;
  if (o->buckets && bi >= 0 && sims[bi].dp > 1 && !(o->fixed && o->fixed->buckets >= 0)) {
    for (int dir = 0; dir < 2; dir++) {
      int64_t size = sims[bi].bucket_bytes;
      for (int step = 0; step < 4; step++) {
        size = dir == 0 ? size / 4 : size * 4;
        search_plan c = sims[bi];
        c.bucket_bytes = size;
        emit_plan(a, &s, o->fixed, &c);
        if (!simulate(g, cl, &hw, o->symbolic, o->max_memory, &c, &work) || c.step_time >= sims[bi].step_time) break;
        c.rank = c.step_time;
        if (out->ranked && !hk->rank(hk->ctx, &c, &c.rank)) {
          arena_free(&work);
          return false;
        }
        sims[bi] = c;
        report(o, searched, pruned, c.step_time, t0, "buckets");
      }
    }
  }
  out->simulate_s = now() - t1;
  arena_free(&work);
  /* the non-dominated ones, fastest (or first in the hooks' order) first */
  qsort(sims, (size_t)nsim, sizeof *sims, order);
  out->simulated = sims;
  out->nsimulated = nsim;
  out->plans = arena_alloc(a, sizeof(search_plan) * (size_t)(nsim ? nsim : 1));
  int64_t least_mem = -1;
  for (int i = 0; i < nsim; i++) {
    if (!sims[i].fits) continue;  /* the frontier of what trains */
    if (least_mem >= 0 && sims[i].peak_memory >= least_mem) continue;
    least_mem = sims[i].peak_memory;
    out->plans[out->nplans++] = sims[i];
  }
  for (int i = 0; i < out->nplans && out->best < 0; i++)
    if (out->plans[i].fits) out->best = i;
  if (o->objective == SEARCH_MEMORY) {
    out->best = -1;
    for (int i = 0; i < out->nplans; i++)
      if (out->plans[i].fits && (out->best < 0 || out->plans[i].peak_memory < out->plans[out->best].peak_memory))
        out->best = i;
  }
  if (nsim == 0 && dropped_sim > 0) {
    diag_add(dg, DIAG_ERROR, none, "the heuristics pruned every one of the %d candidates of model %s simulated",
             dropped_sim, g->name);
    return false;
  }
  if (nsim == 0) {
    diag_add(dg, DIAG_ERROR, none, "none of the %d best candidates of model %s could be built into a plan", npick,
             g->name);
    return false;
  }
  if (out->nplans == 0) {
    int64_t least = sims[0].peak_memory;
    for (int i = 1; i < nsim; i++)
      if (sims[i].peak_memory < least) least = sims[i].peak_memory;
    char b1[64], b2[64];
    double cap = o->max_memory > 0 ? o->max_memory : (double)cl->device_memory;
    unit_bytes_human(least, b1, sizeof b1);
    unit_bytes_human((int64_t)cap, b2, sizeof b2);
    /* figures that round alike are given in bytes */
    if (strcmp(b1, b2) == 0) {
      snprintf(b1, sizeof b1, "%lld bytes", (long long)least);
      snprintf(b2, sizeof b2, "%lld", (long long)cap);
    }
    weft_diag *d = nsim == 1 ? diag_add(dg, DIAG_ERROR, none, "the one plan of model %s simulated does not fit: it "
                                        "needs %s per device, more than %s", g->name, b1, b2)
                             : diag_add(dg, DIAG_ERROR, none, "none of the %d plans of model %s simulated fits: the "
                                        "smallest needs %s per device, more than %s", nsim, g->name, b1, b2);
    diag_hint(d, dg, "more devices, a larger --max-memory, or --objective memory");
    return false;
  }
  return true;
}
