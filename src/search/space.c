/* space.c - the model as the search sees it, and the cost of a block.
 *
 * Repeated blocks (h.0 ... h.95) are found by their names and checked to
 * be the same (SMSG's homomorphism: a block is searched once and its
 * answer holds for all). Each operator may be split over a tensor-parallel
 * group along any dimension its signature lets split, or replicated: the
 * result is whole, partial sums or split, and so is each input it needs
 * and each gradient it gives back. A dynamic program over a block's
 * operators in order (PaSE) keeps, for each choice of the operators whose
 * results are still to be read, the cheapest way there: compute, plus
 * changing each tensor's layout to what its reader needs (the collectives
 * of dependency preservation: D to R an all-gather, V to R an all-reduce,
 * V to D a reduce-scatter, D to D an all-to-all), forward and backward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "search_int.h"

/* ---- the model's shape ---------------------------------------------------------- */

/* The first segment of a dotted name that is a number: its position in
 * characters, and the number; -1 when none. */
static int numbered_segment(const char *name, long *num) {
  const char *p = name;
  while (*p) {
    const char *end = strchr(p, '.');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    bool digits = len > 0;
    for (size_t i = 0; i < len; i++) digits &= p[i] >= '0' && p[i] <= '9';
    if (digits) {
      *num = strtol(p, NULL, 10);
      return (int)(p - name);
    }
    if (!end) break;
    p = end + 1;
  }
  return -1;
}

/* The name of op without its block's prefix and number ("attn.c_attn"). */
static const char *rel_name(const char *name, int at) {
  const char *dot = strchr(name + at, '.');
  return dot ? dot + 1 : "";
}

static void find_blocks(arena *a, const weft_graph *g, sshape *s) {
  s->layers = 0;
  s->head_end = s->tail_start = g->nops;
  /* the prefix with the most numbered instances */
  const char *best = NULL;
  int bestlen = 0;
  long bestmax = -1;
  for (int op = 0; op < g->nops; op++) {
    long num;
    int at = numbered_segment(g->ops[op].name, &num);
    if (at <= 0) continue;
    if (num > bestmax) {
      best = g->ops[op].name;
      bestlen = at - 1;
      bestmax = num;
    }
  }
  if (!best || bestmax < 1) return;
  int L = (int)bestmax + 1;
  int *start = arena_alloc(a, sizeof(int) * (size_t)(L + 1));
  int *count = arena_alloc(a, sizeof(int) * (size_t)L);
  for (int l = 0; l < L; l++) start[l] = -1;
  int last = -1;
  for (int op = 0; op < g->nops; op++) {
    long num;
    const char *name = g->ops[op].name;
    int at = numbered_segment(name, &num);
    bool in = at == bestlen + 1 && strncmp(name, best, (size_t)bestlen) == 0 && num >= 0 && num < L;
    if (!in) continue;
    int l = (int)num;
    if (start[l] < 0) start[l] = op;
    else if (last != op - 1 || (l > 0 && start[l] < start[l - 1])) return;  /* not contiguous */
    if (start[l] != op && last != op - 1) return;
    count[l]++;
    last = op;
  }
  for (int l = 0; l < L; l++) {
    if (start[l] < 0 || count[l] != count[0]) return;
    if (l > 0 && start[l] != start[l - 1] + count[0]) return;
  }
  /* the same block: names, operators and FLOPs */
  for (int l = 1; l < L; l++)
    for (int i = 0; i < count[0]; i++) {
      const gop *x = &g->ops[start[0] + i], *y = &g->ops[start[l] + i];
      long n0, n1;
      int a0 = numbered_segment(x->name, &n0), a1 = numbered_segment(y->name, &n1);
      if (strcmp(rel_name(x->name, a0), rel_name(y->name, a1)) != 0 || x->decl != y->decl || x->flops != y->flops)
        return;
    }
  s->layers = L;
  s->block_ops = count[0];
  s->block_start = start;
  start[L] = start[L - 1] + count[0];
  s->block_name = arena_strndup(a, best, (size_t)bestlen);
  s->head_end = start[0];
  s->tail_start = start[L];
}

/* The idim of an operator that `split all on SEQ` splits, as the plan
 * resolves the name (its signature name, else the one model dimension of
 * that name, else the one of them that may split: attention's queries, not
 * its keys); -1 when none may split along the sequence, or splitting it
 * would leave partial sums anywhere but in a loss. */
static int seq_idim(const opspace *sp, const char *seq) {
  int sig = -1, model = -1, nmodel = 0, free_one = -1, nfree = 0;
  for (int i = 0; i < sp->nidims; i++) {
    const idim *d = &sp->idims[i];
    if (strcmp(d->sig, seq) == 0 && d->elem == 0 && sig < 0) sig = i;
    if (d->dim_name && strcmp(d->dim_name, seq) == 0) {
      if (model < 0) model = i;
      nmodel++;
      if (!d->nosplit) free_one = i, nfree++;
    }
  }
  int i = sig >= 0 ? sig : nmodel == 1 ? model : nfree == 1 ? free_one : -1;
  if (i < 0) return -1;
  const idim *d = &sp->idims[i];
  if (d->nosplit || strchr(d->sig, '@')) return -1;
  if (d->reduce && sp->output.ndims > 0) return -1;
  return i;
}

bool sshape_build(arena *a, const weft_graph *g, sshape *s, const char **why) {
  memset(s, 0, sizeof *s);
  s->g = g;
  for (int t = 0; t < g->ntensors && !s->batch; t++) {
    const gtensor *x = &g->tensors[t];
    if (x->role != TENSOR_INPUT || x->ndims < 1 || !x->dims[0].name) continue;
    s->batch = x->dims[0].name;
    s->batch_size = x->dims[0].size;
  }
  /* the sequence: the second dimension of token ids (an integer input) */
  for (int t = 0; t < g->ntensors && !s->seq; t++) {
    const gtensor *x = &g->tensors[t];
    if (x->role == TENSOR_INPUT && x->ndims >= 2 && !dtype_is_float(x->dtype) && x->dims[0].name &&
        strcmp(x->dims[0].name, s->batch) == 0)
      s->seq = x->dims[1].name;
  }
  if (!s->batch) {
    *why = "its inputs have no named first dimension to split into data-parallel parts and micro-batches";
    return false;
  }
  if (!g->optimizer) {
    *why = "it has no `train` statement: the search plans training steps";
    return false;
  }
  int n = g->nops ? g->nops : 1;
  s->space = arena_alloc(a, sizeof(opspace *) * (size_t)n);
  s->producer_of_input = arena_alloc(a, sizeof(int) * (size_t)n * SEARCH_MAX_INPUTS);
  s->first_reader = arena_alloc(a, sizeof(bool) * (size_t)n * SEARCH_MAX_INPUTS);
  s->last_use = arena_alloc(a, sizeof(int) * (size_t)n);
  bool *read = arena_alloc(a, sizeof(bool) * (size_t)(g->ntensors ? g->ntensors : 1));
  s->tied = arena_alloc(a, sizeof(bool) * (size_t)(g->ntensors ? g->ntensors : 1));
  for (int op = 0; op < g->nops; op++) {
    s->space[op] = opspace_build(a, g, op);
    s->last_use[op] = -1;
    if (g->ops[op].ninputs > SEARCH_MAX_INPUTS) {
      *why = "an operator has more inputs than the search handles";
      return false;
    }
  }
  for (int op = 0; op < g->nops; op++)
    for (int k = 0; k < g->ops[op].ninputs; k++) {
      int t = g->ops[op].inputs[k];
      int p = g->tensors[t].producer;
      s->producer_of_input[op * SEARCH_MAX_INPUTS + k] = p;
      if (p >= 0 && op > s->last_use[p]) s->last_use[p] = op;
      if (g->tensors[t].role == TENSOR_PARAM && read[t]) s->tied[t] = true;
      if (g->tensors[t].role == TENSOR_PARAM && !read[t]) {
        read[t] = true;
        s->first_reader[op * SEARCH_MAX_INPUTS + k] = true;
      }
    }
  find_blocks(a, g, s);
  s->tpsum_weight = 1;
  s->param_weight = 0;
  s->cp = 1;
  s->cp_idim = arena_alloc(a, sizeof(int) * (size_t)n);
  s->cp_ok = s->seq != NULL && g->nops > 0;
  for (int op = 0; op < g->nops; op++) {
    s->cp_idim[op] = s->seq ? seq_idim(s->space[op], s->seq) : -1;
    if (s->cp_idim[op] < 0) s->cp_ok = false;
  }
  /* experts: operators whose result and some input lead with a dimension
   * named `experts` (the experts' MLPs, not dispatch, which makes that
   * tensor from tokens) */
  s->ep = 1;
  s->expert = arena_alloc(a, sizeof(bool) * (size_t)n);
  s->expert_exit = arena_alloc(a, sizeof(bool) * (size_t)n);
  for (int op = 0; op < g->nops; op++) {
    const gtensor *y = &g->tensors[g->ops[op].output];
    if (y->ndims < 1 || !y->dims[0].name || strcmp(y->dims[0].name, "experts") != 0) continue;
    for (int k = 0; k < g->ops[op].ninputs && !s->expert[op]; k++) {
      const gtensor *x = &g->tensors[g->ops[op].inputs[k]];
      if (x->ndims > 0 && x->dims[0].name && strcmp(x->dims[0].name, "experts") == 0 &&
          x->dims[0].size == y->dims[0].size)
        s->expert[op] = true;
    }
    if (s->expert[op]) {
      if (s->experts && s->experts != y->dims[0].size) s->experts = -1;  /* two counts: not searched */
      else if (!s->experts) s->experts = (int)y->dims[0].size;
    }
  }
  for (int op = 0; op < g->nops; op++)
    for (int k = 0; k < g->ops[op].ninputs; k++) {
      int p = s->producer_of_input[op * SEARCH_MAX_INPUTS + k];
      if (p >= 0 && s->expert[p] && !s->expert[op]) s->expert_exit[p] = true;
    }
  /* an expert's operator needs its batch dimension to take the ep group's rows */
  for (int op = 0; op < g->nops && s->experts > 0; op++) {
    if (!s->expert[op]) continue;
    bool batch = false;
    for (int i = 0; i < s->space[op]->nidims; i++)
      batch |= s->space[op]->idims[i].dim_name && strcmp(s->space[op]->idims[i].dim_name, s->batch) == 0;
    if (!batch) s->experts = -1;
  }
  if (s->experts < 0) s->experts = 0;
  return true;
}

bool ep_divides(const sshape *s, int ep) {
  return ep <= 1 || (s->experts > 0 && s->experts % ep == 0);
}

bool cp_divides(const sshape *s, int cp) {
  if (cp <= 1) return true;
  if (!s->cp_ok) return false;
  for (int op = 0; op < s->g->nops; op++)
    if (s->space[op]->idims[s->cp_idim[op]].size % cp) return false;
  return true;
}

double tensor_mb_bytes(const sshape *s, int t, int mbs) {
  const gtensor *x = &s->g->tensors[t];
  double b = (double)tensor_numel(x) * dtype_bytes[x->dtype];
  if (x->ndims > 0 && x->dims[0].name && strcmp(x->dims[0].name, s->batch) == 0 && x->dims[0].size == s->batch_size)
    b = b * mbs / (double)s->batch_size;
  if (s->cp > 1 && x->role != TENSOR_PARAM)
    for (int d = 0; d < x->ndims; d++)
      if (x->dims[d].name && strcmp(x->dims[d].name, s->seq) == 0) {
        b /= s->cp;
        break;
      }
  return b;
}

/* ---- configurations of one operator ------------------------------------------- */

static bool same_layout(layout x, layout y) {
  return x.kind == y.kind && (x.kind != L_D || (x.dim == y.dim && x.inner == y.inner));
}


/* Where idim i lies in a tensor's map: its dimension and the product of the
 * sizes of the factors inside it; false when the tensor lacks it. */
static bool place_of(const opspace *sp, const tmap *m, int i, layout *l) {
  for (int d = 0; d < m->ndims; d++)
    for (int f = 0; f < m->nfactors[d]; f++) {
      if (m->factors[d][f] != i) continue;
      /* the outermost factor cut into parts cuts the dimension into the
       * same contiguous parts as a cut of the whole: the same layout */
      int64_t inner = 1;
      for (int q = f + 1; q < m->nfactors[d] && f > 0; q++) inner *= sp->idims[m->factors[d][q]].size;
      *l = (layout){L_D, d, inner};
      return true;
    }
  return false;
}

/* Elements of a tensor's part when each idim covers ext[i]. */
static double part_numel(const tmap *m, const double *ext) {
  double n = 1;
  for (int d = 0; d < m->ndims; d++)
    for (int f = 0; f < m->nfactors[d]; f++) n *= ext[m->factors[d][f]];
  return n;
}

static double run_cost(const hw_model *hw, bool symbolic, kcost k) {
  return symbolic ? k.flops / SYM_FLOPS + k.bytes / SYM_MEM_BW : k.seconds;
}

/* How a plan names idim i of an operator's space: its model dimension name
 * when no other idim has it, else its signature name when that is
 * unambiguous; NULL when neither is. */
static const char *idim_name(const opspace *sp, int i) {
  const idim *d = &sp->idims[i];
  if (d->dim_name) {
    int same = 0;
    for (int j = 0; j < sp->nidims; j++) same += sp->idims[j].dim_name && strcmp(sp->idims[j].dim_name, d->dim_name) == 0;
    if (same == 1) return d->dim_name;
  }
  if (d->elem != 0) return NULL;
  for (int j = 0; j < sp->nidims; j++)
    if (j != i && strcmp(sp->idims[j].sig, d->sig) == 0) return NULL;
  return d->sig;
}

/* A collective over the cp group of a tensor-parallel group of tp: cp
 * devices tp apart, as many in a node as fit. */
static double cp_collective(const hw_model *hw, bool symbolic, comm_kind k, double bytes, int cp, int tp) {
  if (cp < 2 || bytes <= 0) return 0;
  int dpn = hw && hw->devices_per_node > 0 ? hw->devices_per_node : 1;
  int per_node = tp >= dpn ? 1 : dpn / tp;
  if (per_node > cp) per_node = cp;
  int nodes = (cp + per_node - 1) / per_node;
  if (symbolic) return bytes * (cp - 1) / cp / (nodes > 1 ? SYM_NET_BW : SYM_NODE_BW);
  return cost_collective(hw, k, bytes, bytes, cp, nodes, per_node).seconds;
}

/* An all-to-all over the ep group of a tensor-parallel group of tp: ep
 * devices tp apart, as many in a node as fit; each sends bytes, all but
 * its own share to the others. */
static double ep_all_to_all(const hw_model *hw, bool symbolic, double bytes, int ep, int tp) {
  if (ep < 2 || bytes <= 0) return 0;
  int dpn = hw && hw->devices_per_node > 0 ? hw->devices_per_node : 1;
  int per_node = tp >= dpn ? 1 : dpn / tp;
  if (per_node > ep) per_node = ep;
  int nodes = (ep + per_node - 1) / per_node;
  double moved = bytes * (ep - 1) / ep;
  if (symbolic) return moved / (nodes > 1 ? SYM_NET_BW : SYM_NODE_BW);
  return cost_collective(hw, COMM_ALL_TO_ALL, bytes, moved, ep, nodes, per_node).seconds;
}

bool idim_is(const opspace *sp, int c, const char *dim) {
  if (!*dim || c < 0) return !*dim && c < 0;
  const idim *d = &sp->idims[c];
  const char *name = idim_name(sp, c);
  return (name && strcmp(name, dim) == 0) || strcmp(d->sig, dim) == 0 ||
         (d->dim_name && strcmp(d->dim_name, dim) == 0);
}

int op_configs(arena *a, const sshape *s, const hw_model *hw, bool symbolic, int op, int tp, int mbs, opcfg **out) {
  const weft_graph *g = s->g;
  const gop *o = &g->ops[op];
  const opspace *sp = s->space[op];
  int ni = sp->nidims;
  opcfg *cfg = arena_alloc(a, sizeof(opcfg) * (size_t)(ni + 1));
  double *base = arena_alloc(a, sizeof(double) * (size_t)(ni ? ni : 1));
  double *ext = arena_alloc(a, sizeof(double) * (size_t)(ni ? ni : 1));
  int cpi = s->cp > 1 ? s->cp_idim[op] : -1;
  for (int i = 0; i < ni; i++) {
    base[i] = (double)sp->idims[i].size;
    if (sp->idims[i].dim_name && strcmp(sp->idims[i].dim_name, s->batch) == 0 && sp->idims[i].size == s->batch_size)
      base[i] = base[i] * mbs / (double)s->batch_size;
    if (i == cpi) base[i] /= s->cp;
    /* an expert's operator under ep: its experts' share, of the rows of
     * the whole ep group */
    if (s->ep > 1 && s->expert[op] && sp->idims[i].dim_name) {
      if (strcmp(sp->idims[i].dim_name, "experts") == 0) base[i] /= s->ep;
      else if (strcmp(sp->idims[i].dim_name, s->batch) == 0) base[i] *= s->ep;
    }
  }
  bool xop = s->ep > 1 && s->expert[op];
  /* which inputs get a gradient */
  bool grad[SEARCH_MAX_INPUTS] = {0};
  for (int k = 0; k < o->ninputs && k < SEARCH_MAX_INPUTS; k++) {
    const gtensor *t = &g->tensors[o->inputs[k]];
    grad[k] = t->role != TENSOR_INPUT && dtype_is_float(t->dtype);
  }
  int n = 0;
  for (int c = -1; c < ni; c++) {
    if (c >= 0) {
      const idim *d = &sp->idims[c];
      int64_t size = (int64_t)(d->size / (c == cpi ? s->cp : 1));
      if (xop && d->dim_name && strcmp(d->dim_name, "experts") == 0) size = d->size / s->ep;
      if (tp < 2 || d->nosplit || strchr(d->sig, '@') || size % tp != 0) continue;
      if (d->dim_name && strcmp(d->dim_name, s->batch) == 0) continue;
      if (!idim_name(sp, c)) continue;
    }
    /* what the plan writes of it */
    if (tp > 1 && s->want && s->want[op] && !idim_is(sp, c, s->want[op])) continue;
    opcfg *x = &cfg[n];
    memset(x, 0, sizeof *x);
    x->idim = c;
    x->dim = c >= 0 ? idim_name(sp, c) : NULL;
    for (int i = 0; i < ni; i++) ext[i] = base[i] / (i == c ? tp : 1);
    layout whole = {L_R, 0, 0};
    x->out = x->gout = whole;
    if (c >= 0 && !place_of(sp, &sp->output, c, &x->out)) x->out = (layout){L_V, 0, 0};
    if (x->out.kind == L_D) x->gout = x->out;
    double bytes = part_numel(&sp->output, ext) * dtype_bytes[g->tensors[sp->output.tensor].dtype];
    x->act = bytes;
    for (int k = 0; k < sp->ninputs && k < SEARCH_MAX_INPUTS; k++) {
      const tmap *m = &sp->inputs[k];
      const gtensor *t = &g->tensors[m->tensor];
      double pb = part_numel(m, ext) * dtype_bytes[t->dtype];
      bytes += pb;
      x->in[k] = x->gin[k] = whole;
      if (c >= 0) {
        if (place_of(sp, m, c, &x->in[k])) x->gin[k] = x->in[k];
        else x->gin[k] = (layout){L_V, 0, 0};
      }
      /* a parameter read whole by each part of a split along a dimension
       * of the result (not a reduction, whose first part alone applies
       * what lacks it): its gradient is a sum over the group */
      bool tpsum = c >= 0 && x->gin[k].kind == L_V && x->out.kind != L_V;
      if (t->role == TENSOR_PARAM && s->first_reader[op * SEARCH_MAX_INPUTS + k]) {
        x->params += pb;
        x->param_elems += part_numel(m, ext);
        if (s->expert[op]) x->xparam_elems += part_numel(m, ext);
        else if (tpsum) x->tpsum_elems += part_numel(m, ext);
        else if (s->tied[m->tensor]) x->tied_elems += part_numel(m, ext);
        if (tpsum) {
          double gb = part_numel(m, ext) * dtype_bytes[graph_grad_dtype(g, m->tensor)];
          x->tpsum += relayout(hw, symbolic, (layout){L_V, 0, 0}, (layout){L_R, 0, 0}, gb, tp);
        }
      } else if (t->role == TENSOR_PARAM && tpsum && !s->expert[op])
        x->tied_tpsum_elems += part_numel(m, ext);
      if (t->role == TENSOR_PARAM && s->tied[m->tensor] && tp > 1) {
        if (c < 0) x->tied_copy_elems += part_numel(m, ext);
        if (tpsum) x->tied_sum_elems += part_numel(m, ext);
      }
    }
    bool ok = true;
    for (int k = 0; k < sp->ninputs && k < SEARCH_MAX_INPUTS; k++)
      if (s->tied[sp->inputs[k].tensor] && !same_layout(x->in[k], s->tied_layout)) ok = false;
    if (!ok) continue;
    kcost f = cost_op(symbolic ? NULL : hw, g, sp, op, ext, false, false, false, bytes);
    kcost b = cost_op(symbolic ? NULL : hw, g, sp, op, ext, true, grad[0], grad[1], 2 * bytes);
    x->fwd = run_cost(hw, symbolic, f);
    x->bwd = run_cost(hw, symbolic, b);
    /* context parallelism: an input this operator reads whole along the
     * sequence (attention's keys and values) is gathered over the cp group
     * and kept for the backward, its gradient reduce-scattered back */
    for (int k = 0; cpi >= 0 && k < sp->ninputs && k < SEARCH_MAX_INPUTS; k++) {
      const tmap *m = &sp->inputs[k];
      if (s->producer_of_input[op * SEARCH_MAX_INPUTS + k] < 0) continue;
      bool has_seq = false, split = false;
      const gtensor *t = &g->tensors[m->tensor];
      for (int d = 0; d < t->ndims; d++) has_seq |= t->dims[d].name && strcmp(t->dims[d].name, s->seq) == 0;
      for (int d = 0; d < m->ndims; d++)
        for (int q = 0; q < m->nfactors[d]; q++) split |= m->factors[d][q] == cpi;
      if (!has_seq || split) continue;
      double whole = part_numel(m, ext) * dtype_bytes[t->dtype];
      x->fwd += cp_collective(hw, symbolic, COMM_ALL_GATHER, whole, s->cp, tp);
      if (grad[k]) x->bwd += cp_collective(hw, symbolic, COMM_REDUCE_SCATTER, whole, s->cp, tp);
      x->act += whole;
      x->cp_gather |= 1u << k;
    }
    /* expert parallelism: the rows an expert's operator reads from a
     * non-expert one (dispatch) come from every member of the ep group, and
     * the rows a non-expert one reads of it (combine) go back: an
     * all-to-all each way, forward, and another for each gradient */
    x->expert = xop;
    for (int k = 0; xop && k < sp->ninputs && k < SEARCH_MAX_INPUTS; k++) {
      int p = s->producer_of_input[op * SEARCH_MAX_INPUTS + k];
      if (p < 0 || s->expert[p]) continue;
      const gtensor *t = &g->tensors[sp->inputs[k].tensor];
      double pb = part_numel(&sp->inputs[k], ext) * dtype_bytes[t->dtype];
      x->fwd += ep_all_to_all(hw, symbolic, pb, s->ep, tp);
      if (grad[k]) x->bwd += ep_all_to_all(hw, symbolic, pb, s->ep, tp);
    }
    if (xop && s->expert_exit[op]) {
      double ob = part_numel(&sp->output, ext) * dtype_bytes[g->tensors[sp->output.tensor].dtype];
      x->fwd += ep_all_to_all(hw, symbolic, ob, s->ep, tp);
      x->bwd += ep_all_to_all(hw, symbolic, ob, s->ep, tp);
    }
    n++;
  }
  *out = cfg;
  return n;
}

/* ---- changing layouts ---------------------------------------------------------- */

int relayout_kind(layout from, layout to) {
  if (same_layout(from, to) || to.kind == L_V || from.kind == L_R) return -1;
  if (from.kind == L_D && to.kind == L_R) return COMM_ALL_GATHER;
  if (from.kind == L_V && to.kind == L_R) return COMM_ALL_REDUCE;
  if (from.kind == L_V && to.kind == L_D) return COMM_REDUCE_SCATTER;
  return COMM_ALL_TO_ALL;
}

double relayout(const hw_model *hw, bool symbolic, layout from, layout to, double bytes, int tp) {
  int kind = relayout_kind(from, to);
  if (tp < 2 || kind < 0) return 0;
  comm_kind k = (comm_kind)kind;
  /* what one member sends, for the symbolic count */
  double moved = k == COMM_ALL_GATHER || k == COMM_REDUCE_SCATTER ? bytes * (tp - 1) / tp
                 : k == COMM_ALL_REDUCE                          ? 2 * bytes * (tp - 1) / tp
                                                                 : bytes / tp * (tp - 1) / tp;
  /* a group wider than a node (a heuristic's space may ask for one) spans nodes */
  int dpn = hw && hw->devices_per_node > 0 ? hw->devices_per_node : tp;
  int nodes = tp > dpn ? (tp + dpn - 1) / dpn : 1;
  if (symbolic) return moved / (nodes > 1 ? SYM_NET_BW : SYM_NODE_BW);
  return cost_collective(hw, k, bytes, k == COMM_ALL_TO_ALL ? moved : bytes, tp, nodes, nodes > 1 ? dpn : tp).seconds;
}

/* ---- the best configurations of a range of operators ---------------------------- */

/* ---- the order of the dynamic program (PaSE's GenerateSeq) ----------------------- */

/* An edge of a range's graph: input k of operator cons is the result of
 * prod, both in the range. */
typedef struct redge {
  int prod, cons, k;
} redge;

/* A range's operators as an undirected graph: its edges, and each
 * operator's (offsets into the range). */
typedef struct rgraph {
  int n, nedges;
  redge *edges;
  int *first, *count, *list; /* operator i's edges: list[first[i] .. first[i] + count[i]) */
} rgraph;

static void range_graph(arena *a, const sshape *s, int lo, int hi, rgraph *rg) {
  const weft_graph *g = s->g;
  int n = hi - lo;
  rg->n = n;
  rg->nedges = 0;
  rg->edges = arena_alloc(a, sizeof(redge) * (size_t)(n * SEARCH_MAX_INPUTS + 1));
  for (int i = 0; i < n; i++)
    for (int k = 0; k < g->ops[lo + i].ninputs && k < SEARCH_MAX_INPUTS; k++) {
      int pr = s->producer_of_input[(lo + i) * SEARCH_MAX_INPUTS + k];
      if (pr >= lo && pr < hi) rg->edges[rg->nedges++] = (redge){pr - lo, i, k};
    }
  rg->first = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  rg->count = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  rg->list = arena_alloc(a, sizeof(int) * (size_t)(2 * rg->nedges + 1));
  for (int i = 0; i < n; i++) rg->count[i] = 0;
  for (int e = 0; e < rg->nedges; e++) rg->count[rg->edges[e].prod]++, rg->count[rg->edges[e].cons]++;
  for (int i = 0, at = 0; i < n; i++) rg->first[i] = at, at += rg->count[i], rg->count[i] = 0;
  for (int e = 0; e < rg->nedges; e++) {
    int p = rg->edges[e].prod, c = rg->edges[e].cons;
    rg->list[rg->first[p] + rg->count[p]++] = e;
    rg->list[rg->first[c] + rg->count[c]++] = e;
  }
}

static int other_end(const redge *e, int i) { return e->prod == i ? e->cons : e->prod; }

int range_order(arena *a, const sshape *s, int lo, int hi, bool program, int *order) {
  rgraph rg;
  range_graph(a, s, lo, hi, &rg);
  int n = rg.n, dep = 0, widest = 0;
  bool *done = arena_alloc(a, sizeof(bool) * (size_t)(n + 1));
  int *open = arena_alloc(a, sizeof(int) * (size_t)(n + 1)); /* edges to operators not yet visited */
  for (int i = 0; i < n; i++) done[i] = false, open[i] = rg.count[i];
  for (int step = 0; step < n; step++) {
    /* the next operator: the one after which the fewest visited operators
     * still have edges to unvisited ones (the dependent set), among those
     * next to a visited one (else the first unvisited); program order
     * breaks ties */
    int pick = -1, best = 0;
    bool touching = false;
    for (int v = 0; v < n && !program; v++)
      if (!done[v])
        for (int q = 0; q < rg.count[v] && !touching; q++) touching = done[other_end(&rg.edges[rg.list[rg.first[v] + q]], v)];
    for (int v = 0; v < n; v++) {
      if (done[v]) continue;
      if (program) {
        pick = v;
        break;
      }
      int removed = 0, adj = 0;
      for (int q = 0; q < rg.count[v]; q++) {
        int u = other_end(&rg.edges[rg.list[rg.first[v] + q]], v);
        if (!done[u]) continue;
        adj = 1;
        /* u leaves the set when every edge it has left goes to v */
        int to_v = 0;
        for (int r = 0; r < rg.count[u]; r++) to_v += other_end(&rg.edges[rg.list[rg.first[u] + r]], u) == v;
        bool first_seen = true;
        for (int r = 0; r < q; r++) first_seen &= other_end(&rg.edges[rg.list[rg.first[v] + r]], v) != u;
        if (first_seen && open[u] == to_v) removed++;
      }
      if (touching && !adj) continue;
      /* v joins the set when it has edges to unvisited operators */
      int mine = 0;
      for (int q = 0; q < rg.count[v]; q++) mine += !done[other_end(&rg.edges[rg.list[rg.first[v] + q]], v)];
      int size = dep - removed + (mine > 0 ? 1 : 0);
      if (pick < 0 || size < best) pick = v, best = size;
    }
    order[step] = pick;
    done[pick] = true;
    for (int q = 0; q < rg.count[pick]; q++) {
      int u = other_end(&rg.edges[rg.list[rg.first[pick] + q]], pick);
      if (done[u] && u != pick) open[u]--, open[pick]--;
    }
    dep = 0;
    for (int v = 0; v < n; v++) dep += done[v] && open[v] > 0;
    if (dep > widest) widest = dep;
  }
  return widest;
}

/* A way to have visited the operators so far: the configuration of each
 * visited one with an edge to an unvisited one (the dependent set), and
 * the cost to get here. */
typedef struct dpstate {
  int *live;              /* configurations, in the order of step.ops */
  double cost;
  double act[3], recompute[3], params, param_elems, xparam_elems, tpsum_elems, tpsum;
  double tied_elems, tied_tpsum_elems, tied_copy_elems, tied_sum_elems;
  int parent;             /* in the previous step */
  int choice;             /* the configuration of this step's operator */
} dpstate;

typedef struct dpstep {
  int nlive;
  int *ops;               /* the dependent set after this step (offsets into the range) */
  dpstate *st;
  int n, cap;
} dpstep;

static int find_state(const dpstep *s, const int *live) {
  for (int i = 0; i < s->n; i++)
    if (memcmp(s->st[i].live, live, sizeof(int) * (size_t)s->nlive) == 0) return i;
  return -1;
}

static layout grad_need(layout l) { return l.kind == L_D ? l : (layout){L_R, 0, 0}; }

static bool is_attention(const gop *o) { return o->kind && strcmp(o->kind, "attention") == 0; }

/* The cost of edge e between configurations px (its producer's) and cx
 * (its consumer's): the layout changes each way; fwd the forward's; -1 for
 * a pair that lowering does not build. */
static double edge_cost(const sshape *s, const hw_model *hw, bool symbolic, int tp, int mbs, int cons_op, int k,
                        layout pout, layout pgneed, const opcfg *cx, double *fwd) {
  /* a tensor gathered over the cp group keeps its layout in the
   * tensor-parallel group, or is gathered whole there too: the plans
   * lowering builds (a change of parts or a sum in the same step as the
   * gather is refused by validation) */
  if ((cx->cp_gather >> k & 1) && !same_layout(pout, cx->in[k]) && !(pout.kind == L_D && cx->in[k].kind == L_R))
    return -1;
  double bytes = tensor_mb_bytes(s, s->g->ops[cons_op].inputs[k], mbs);
  *fwd = relayout(hw, symbolic, pout, cx->in[k], bytes, tp);
  return *fwd + relayout(hw, symbolic, cx->gin[k], pgneed, bytes, tp);
}

bool range_best(arena *a, const sshape *s, const hw_model *hw, bool symbolic, int lo, int hi, int tp, int mbs,
                layout in, layout out, rangecost *rc) {
  const weft_graph *g = s->g;
  memset(rc, 0, sizeof *rc);
  int nr = hi - lo;
  if (nr <= 0) return true;
  opcfg **cfgs = arena_alloc(a, sizeof(opcfg *) * (size_t)nr);
  int *ncfg = arena_alloc(a, sizeof(int) * (size_t)nr);
  for (int i = 0; i < nr; i++) {
    ncfg[i] = op_configs(a, s, hw, symbolic, lo + i, tp, mbs, &cfgs[i]);
    if (ncfg[i] == 0) return false;
  }
  rgraph rg;
  range_graph(a, s, lo, hi, &rg);
  int *order = arena_alloc(a, sizeof(int) * (size_t)nr);
  range_order(a, s, lo, hi, s->program_order, order);
  int *pos = arena_alloc(a, sizeof(int) * (size_t)nr); /* each operator's step */
  for (int i = 0; i < nr; i++) pos[order[i]] = i;
  dpstep *steps = arena_alloc(a, sizeof(dpstep) * (size_t)(nr + 1));
  /* before the first operator: nothing visited, nothing spent */
  steps[0].st = arena_alloc(a, sizeof(dpstate));
  steps[0].n = steps[0].cap = 1;
  steps[0].st[0].parent = -1;
  steps[0].nlive = 0;
  int *live = arena_alloc(a, sizeof(int) * (size_t)(nr + 1));
  int *slot = arena_alloc(a, sizeof(int) * (size_t)(nr + 1)); /* per operator: its place in prev->ops, -1 */
  for (int i = 0; i < nr; i++) slot[i] = -1;
  for (int i = 0; i < nr; i++) {
    int v = order[i], op = lo + v;
    const gop *o = &g->ops[op];
    dpstep *prev = &steps[i], *cur = &steps[i + 1];
    for (int q = 0; q < prev->nlive; q++) slot[prev->ops[q]] = q;
    /* the dependent set after this step: visited operators with an edge to
     * one not visited after it */
    cur->ops = arena_alloc(a, sizeof(int) * (size_t)(prev->nlive + 1));
    cur->nlive = 0;
    for (int q = 0; q <= prev->nlive; q++) {
      int u = q < prev->nlive ? prev->ops[q] : v;
      bool open = false;
      for (int r = 0; r < rg.count[u] && !open; r++) open = pos[other_end(&rg.edges[rg.list[rg.first[u] + r]], u)] > i;
      if (open) cur->ops[cur->nlive++] = u;
    }
    for (int p = 0; p < prev->n; p++) {
      const dpstate *ps = &prev->st[p];
      for (int c = 0; c < ncfg[v]; c++) {
        const opcfg *x = &cfgs[v][c];
        double cost = x->fwd + x->bwd + x->tpsum * s->tpsum_weight + x->params * s->param_weight;
        double rc1 = is_attention(o) ? x->fwd : 0, rc2 = x->fwd;
        /* inputs from before the range, in the layout they come in */
        for (int k = 0; k < o->ninputs && k < SEARCH_MAX_INPUTS && cost >= 0; k++) {
          int pr = s->producer_of_input[op * SEARCH_MAX_INPUTS + k];
          if (pr < 0 || pr >= lo) continue;  /* inputs and parameters are where they are read */
          double f, e = edge_cost(s, hw, symbolic, tp, mbs, op, k, in, grad_need(in), x, &f);
          if (e < 0) cost = -1;
          else cost += e, rc2 += f, rc1 += is_attention(o) ? f : 0;
        }
        /* edges to operators visited before, whichever way they go */
        for (int r = 0; r < rg.count[v] && cost >= 0; r++) {
          const redge *ed = &rg.edges[rg.list[rg.first[v] + r]];
          int u = other_end(ed, v);
          if (pos[u] >= i) continue;
          const opcfg *ux = &cfgs[u][ps->live[slot[u]]];
          bool mine = ed->cons == v;
          const opcfg *px = mine ? ux : x, *cx = mine ? x : ux;
          double f, e = edge_cost(s, hw, symbolic, tp, mbs, lo + ed->cons, ed->k, px->out, px->gout, cx, &f);
          if (e < 0) cost = -1;
          else cost += e, rc2 += f, rc1 += is_attention(&g->ops[lo + ed->cons]) ? f : 0;
        }
        if (cost < 0) continue;
        /* what leaves the range goes out in the layout asked */
        if (s->last_use[op] >= hi) {
          double bytes = tensor_mb_bytes(s, o->output, mbs);
          cost += relayout(hw, symbolic, x->out, out, bytes, tp) + relayout(hw, symbolic, out, x->gout, bytes, tp);
        }
        for (int q = 0; q < cur->nlive; q++) live[q] = cur->ops[q] == v ? c : ps->live[slot[cur->ops[q]]];
        double total = ps->cost + cost;
        int at = find_state(cur, live);
        if (at >= 0 && cur->st[at].cost <= total) continue;
        if (at < 0) {
          arena_grow(a, (void **)&cur->st, &cur->cap, cur->n + 1, sizeof(dpstate));
          at = cur->n++;
          cur->st[at].live = arena_alloc(a, sizeof(int) * (size_t)(cur->nlive ? cur->nlive : 1));
          memcpy(cur->st[at].live, live, sizeof(int) * (size_t)cur->nlive);
        }
        dpstate *ns = &cur->st[at];
        ns->cost = total;
        ns->parent = p;
        ns->choice = c;
        /* what recomputation keeps and redoes: all (none), all but the
         * attention kernels (selective), the range's inputs only (full) */
        for (int r = 0; r < 3; r++) {
          ns->act[r] = ps->act[r];
          ns->recompute[r] = ps->recompute[r];
        }
        ns->act[0] += x->act;
        if (!is_attention(o)) ns->act[1] += x->act;
        ns->recompute[1] += rc1;
        ns->recompute[2] += rc2;
        ns->params = ps->params + x->params;
        ns->param_elems = ps->param_elems + x->param_elems;
        ns->xparam_elems = ps->xparam_elems + x->xparam_elems;
        ns->tpsum_elems = ps->tpsum_elems + x->tpsum_elems;
        ns->tpsum = ps->tpsum + x->tpsum;
        ns->tied_elems = ps->tied_elems + x->tied_elems;
        ns->tied_tpsum_elems = ps->tied_tpsum_elems + x->tied_tpsum_elems;
        ns->tied_copy_elems = ps->tied_copy_elems + x->tied_copy_elems;
        ns->tied_sum_elems = ps->tied_sum_elems + x->tied_sum_elems;
      }
    }
    for (int q = 0; q < prev->nlive; q++) slot[prev->ops[q]] = -1;
    if (cur->n == 0) return false;
  }
  /* the cheapest end, and the way there */
  dpstep *last = &steps[nr];
  int best = 0;
  for (int i = 1; i < last->n; i++)
    if (last->st[i].cost < last->st[best].cost) best = i;
  const dpstate *b = &last->st[best];
  rc->cfg = arena_alloc(a, sizeof(int) * (size_t)nr);
  rc->cfgs = cfgs;
  for (int i = nr, at = best; i > 0; i--) {
    rc->cfg[order[i - 1]] = steps[i].st[at].choice;
    at = steps[i].st[at].parent;
  }
  double fwd = 0, bwd = 0;
  for (int i = 0; i < nr; i++) {
    fwd += cfgs[i][rc->cfg[i]].fwd, bwd += cfgs[i][rc->cfg[i]].bwd;
    if (cfgs[i][rc->cfg[i]].act > rc->peak_act) rc->peak_act = cfgs[i][rc->cfg[i]].act;
  }
  /* communication split like the compute: half each way is close enough
   * for the pipeline's stages, which add both */
  double comm = b->cost - fwd - bwd - b->tpsum * s->tpsum_weight - b->params * s->param_weight;
  rc->fwd = fwd + comm / 2;
  rc->bwd = bwd + comm / 2;
  for (int r = 0; r < 3; r++) rc->act[r] = b->act[r], rc->recompute[r] = b->recompute[r];
  rc->params = b->params;
  rc->param_elems = b->param_elems;
  rc->xparam_elems = b->xparam_elems;
  rc->tpsum_elems = b->tpsum_elems;
  rc->tpsum = b->tpsum;
  rc->tied_elems = b->tied_elems;
  rc->tied_tpsum_elems = b->tied_tpsum_elems;
  rc->tied_copy_elems = b->tied_copy_elems;
  rc->tied_sum_elems = b->tied_sum_elems;
  /* the range's input, kept when everything else is recomputed */
  for (int i = 0; i < nr; i++) {
    const gop *o = &g->ops[lo + i];
    for (int k = 0; k < o->ninputs; k++)
      if (s->producer_of_input[(lo + i) * SEARCH_MAX_INPUTS + k] >= 0 &&
          s->producer_of_input[(lo + i) * SEARCH_MAX_INPUTS + k] < lo) {
        double bytes = tensor_mb_bytes(s, o->inputs[k], mbs) / (in.kind == L_D ? tp : 1);
        rc->act[2] += bytes;
        i = nr;
        break;
      }
  }
  int lastop = hi - 1;
  double ob = tensor_mb_bytes(s, g->ops[lastop].output, mbs);
  rc->out_bytes = out.kind == L_D ? ob / tp : ob;
  return true;
}
