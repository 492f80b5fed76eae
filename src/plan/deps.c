/* deps.c - data-dependency preservation: from what producers hold and what
 * consumers need, the communication of a plan (forward activations and the
 * reduction of parameter gradients). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/htab.h"
#include "base/prof.h"
#include "base/vec.h"
#include "weft/deps.h"
#include "weft/workspace.h"

/* A piece of a tensor on a device: a region, and for partial sums the
 * coordinates that tell one partial from another (-1: complete values). */
typedef struct piece {
  tregion region;
  int device;
  int64_t partial;       /* -1 for complete values, else a key of the V coordinates */
  int sub;               /* the sub-operator that holds it */
  int read;              /* gradient contributions: the read (treads) */
} piece;

typedef VEC(piece) pieces;

static void pieces_add(arena *a, pieces *ps, piece p) { vec_push(a, ps, p); }

static int node_of(const weft_plan *p, int dev) { return p->devices_per_node ? dev / p->devices_per_node : 0; }

static int group_level(const weft_plan *p, const int *devs, int n) {
  for (int i = 1; i < n; i++)
    if (node_of(p, devs[i]) != node_of(p, devs[0])) return 1;
  return 0;
}

/* Bytes of region r of a tensor as phase moves it: a parameter's gradient
 * in the dtype it is accumulated in (graph_grad_dtype). */
static int64_t region_bytes(const weft_plan *p, int tensor, comm_phase phase, const tregion *r) {
  weft_dtype dt = phase == PHASE_WEIGHTS ? graph_grad_dtype(p->g, tensor) : p->g->tensors[tensor].dtype;
  return tregion_numel(r) * dtype_bytes[dt];
}

static pcomm *comm_add(arena *a, weft_plan *p, comm_kind kind, int tensor, comm_phase phase, const int *devs, int n,
                       const tregion *r) {
  arena_grow(a, (void **)&p->comms, &p->ccap, p->ncomms + 1, sizeof(pcomm));
  pcomm *cm = &p->comms[p->ncomms++];
  memset(cm, 0, sizeof *cm);
  cm->kind = kind;
  cm->tensor = tensor;
  cm->phase = phase;
  cm->ngroup = n;
  cm->group = arena_alloc(a, sizeof(int) * (size_t)(n ? n : 1));
  memcpy(cm->group, devs, sizeof(int) * (size_t)n);
  cm->src = cm->dst = -1;
  cm->producer_sub = cm->consumer_sub = -1;
  cm->consumer_op = -1;
  cm->input = -1;
  cm->region = *r;
  cm->parts = NULL;
  cm->from = NULL;
  cm->dir = DIR_FORWARD;
  cm->mb = -1;
  int64_t b = region_bytes(p, tensor, phase, r);
  cm->size = b;
  switch (kind) {
  case COMM_ALL_REDUCE: cm->bytes = n > 1 ? 2 * b * (n - 1) / n : 0; break;
  case COMM_REDUCE_SCATTER: case COMM_ALL_GATHER: cm->bytes = n > 1 ? b * (n - 1) / n : 0; break;
  case COMM_ALL_TO_ALL: cm->bytes = n > 1 ? b * (n - 1) / ((int64_t)n * n) : 0; break;
  default: cm->bytes = b;
  }
  cm->level = group_level(p, devs, n);
  return cm;
}

/* The key of a sub-operator's coordinates on its value (V) levels; a
 * reduction split into one part leaves complete values (-1). */
static int64_t partial_key(const popplan *pp, const psub *s) {
  int64_t key = 0;
  bool any = false;
  for (int i = 0; i < pp->nsplits; i++)
    if (pp->splits[i].kind == SPLIT_VALUE && pp->splits[i].parts > 1) {
      key = key * pp->splits[i].parts + s->coord[i];
      any = true;
    }
  return any ? key : -1;
}

static int int_cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* qsort, but an array already in order (most lists of devices and pieces
 * come so) is left as it is after one pass, and a short one is sorted by
 * insertion: either way the order a stable sort gives. */
static void sort_items(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *)) {
  char *v = base;
  size_t i = 1;
  while (i < n && cmp(v + (i - 1) * size, v + i * size) <= 0) i++;
  if (i >= n) return;
  if (n > 16 || size > 32) {
    qsort(base, n, size, cmp);
    return;
  }
  char x[32];
  for (; i < n; i++) {
    memcpy(x, v + i * size, size);
    size_t j = i;
    while (j > 0 && cmp(x, v + (j - 1) * size) < 0) {
      memcpy(v + j * size, v + (j - 1) * size, size);
      j--;
    }
    memcpy(v + j * size, x, size);
  }
}

/* Ints in increasing order: left as they are when they are so already,
 * else by insertion when few, else by qsort. */
static void sort_ints(int *v, int n) {
  int i = 1;
  while (i < n && v[i - 1] <= v[i]) i++;
  if (i >= n) return;
  if (n > 32) {
    qsort(v, (size_t)n, sizeof(int), int_cmp);
    return;
  }
  for (; i < n; i++) {
    int x = v[i], j = i;
    for (; j > 0 && x < v[j - 1]; j--) v[j] = v[j - 1];
    v[j] = x;
  }
}

/* Sorted distinct devices; returns the count. Many devices within a
 * narrow range (a group's members) are marked in a bitmap of the range
 * and read back in order. */
static int distinct(int *devs, int n) {
  if (n > 32) {
    int lo = devs[0], hi = devs[0];
    for (int i = 1; i < n; i++) {
      if (devs[i] < lo) lo = devs[i];
      if (devs[i] > hi) hi = devs[i];
    }
    int64_t span = (int64_t)hi - lo + 1;
    if (span <= 64 * (int64_t)n) {
      size_t nw = (size_t)((span + 63) / 64);
      uint64_t *bits = calloc(nw, sizeof(uint64_t));
      if (!bits) weft_oom();
      for (int i = 0; i < n; i++) {
        int64_t o = (int64_t)devs[i] - lo;
        bits[o >> 6] |= (uint64_t)1 << (o & 63);
      }
      int m = 0;
      for (size_t w = 0; w < nw; w++)
        for (uint64_t x = bits[w]; x; x &= x - 1) devs[m++] = (int)(lo + (int64_t)w * 64 + __builtin_ctzll(x));
      free(bits);
      return m;
    }
  }
  sort_ints(devs, n);
  int m = 0;
  for (int i = 0; i < n; i++)
    if (m == 0 || devs[m - 1] != devs[i]) devs[m++] = devs[i];
  return m;
}

/* Regions by their extent along one dimension, for the regions that overlap
 * a given one without testing them all: a need split along the sequence
 * against thousands of pieces split by batch and micro-batch. The dimension
 * is the one whose extents start at the most places; each region is taken
 * by its bounding range there (first to last interval). */
typedef struct sweep_index {
  int dim;
  int n;
  int64_t span;          /* the longest bounding range */
  struct sweep_at { int64_t lo; int i; } *at;  /* sorted by lo */
  const tregion *const *regions;
} sweep_index;

static int sweep_at_cmp(const void *a, const void *b) {
  const struct sweep_at *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : x->i - y->i;
}

static void sweep_build(arena *s, sweep_index *x, const tregion *const *regions, int n) {
  x->n = n;
  x->regions = regions;
  x->at = arena_alloc(s, sizeof(struct sweep_at) * (size_t)(n ? n : 1));
  x->dim = -1;
  int ndims = n ? regions[0]->ndims : 0, most = 0;
  for (int d = 0; d < ndims; d++) {
    int m = 0;
    for (int i = 0; i < n; i++) {
      const dregion *r = d < regions[i]->ndims ? &regions[i]->dims[d] : NULL;
      if (r && r->n) x->at[m++] = (struct sweep_at){r->iv[0].lo, i};
    }
    sort_items(x->at, (size_t)m, sizeof *x->at, sweep_at_cmp);
    int starts = 0;
    for (int i = 0; i < m; i++) starts += i == 0 || x->at[i].lo != x->at[i - 1].lo;
    if (starts > most) { most = starts; x->dim = d; }
  }
  /* the chosen dimension; regions without it (or empty there) meet nothing.
   * Without one (scalars), every region is kept, to be tested one by one. */
  int m = 0;
  x->span = 0;
  for (int i = 0; i < n && x->dim < 0; i++) x->at[m++] = (struct sweep_at){0, i};
  for (int i = 0; i < n && x->dim >= 0; i++) {
    const dregion *r = x->dim < regions[i]->ndims ? &regions[i]->dims[x->dim] : NULL;
    if (!r || !r->n) continue;
    x->at[m++] = (struct sweep_at){r->iv[0].lo, i};
    if (r->iv[r->n - 1].hi - r->iv[0].lo > x->span) x->span = r->iv[r->n - 1].hi - r->iv[0].lo;
  }
  sort_items(x->at, (size_t)m, sizeof *x->at, sweep_at_cmp);
  x->n = m;
}

/* The indices of the regions that intersect r, in increasing order, into
 * out; returns how many. */
static int sweep_find(const sweep_index *x, const tregion *r, int *out) {
  if (x->dim < 0 || x->dim >= r->ndims || !r->dims[x->dim].n) {
    /* no dimension to sweep along: every region is a candidate */
    int n = 0;
    for (int i = 0; i < x->n; i++)
      if (tregion_overlaps(x->regions[x->at[i].i], r)) out[n++] = x->at[i].i;
    sort_ints(out, n);
    return n;
  }
  const dregion *q = &r->dims[x->dim];
  int64_t lo = q->iv[0].lo, hi = q->iv[q->n - 1].hi;
  /* the first region that starts after lo - span: one starting earlier ends before lo */
  int a = 0, b = x->n;
  while (a < b) {
    int mid = a + (b - a) / 2;
    if (x->at[mid].lo > lo - x->span) b = mid;
    else a = mid + 1;
  }
  int n = 0;
  for (int k = a; k < x->n && x->at[k].lo < hi; k++)
    if (tregion_overlaps(x->regions[x->at[k].i], r)) out[n++] = x->at[k].i;
  sort_ints(out, n);
  return n;
}

/* ---- parts of a region ------------------------------------------------------------- */

/* Part i of n of one tensor dimension: the i-th n-th of its elements in index
 * order (a strided dimension is cut through its intervals). */
/* Part i of n of a dimension's region: of its len indices, the first
 * len % n parts take len / n + 1 and the others len / n, so that the parts
 * differ by at most one index, the larger first (some are empty when
 * len < n): a data-parallel representative, which comes before its
 * replicas in a group, holds at least as much as they do. */
static void dregion_part(arena *a, const dregion *r, int64_t i, int64_t n, dregion *out) {
  int64_t len = 0;
  for (int k = 0; k < r->n; k++) len += r->iv[k].hi - r->iv[k].lo;
  int64_t q = len / n, extra = len % n;
  int64_t lo = i * q + (i < extra ? i : extra), hi = lo + q + (i < extra ? 1 : 0), at = 0;
  out->iv = arena_alloc(a, sizeof(irange) * (size_t)(r->n ? r->n : 1));
  out->n = 0;
  for (int k = 0; k < r->n; k++) {
    int64_t w = r->iv[k].hi - r->iv[k].lo;
    int64_t from = lo > at ? lo - at : 0, to = hi - at < w ? hi - at : w;
    if (from < to) out->iv[out->n++] = (irange){r->iv[k].lo + from, r->iv[k].lo + to};
    at += w;
  }
}

/* Cuts r into n parts along one tensor dimension, the one whose largest
 * part is smallest: one whose length n divides when there is one (the
 * outermost, so that each part is one contiguous block of a row-major
 * tensor), else one cut into parts that differ by an index, as FSDP
 * shards a parameter that does not divide. Part i is member i's. NULL for
 * a region without dimensions. */
static tregion *region_parts(arena *a, const tregion *r, int n) {
  int cut = -1;
  int64_t numel = tregion_numel(r), best = 0;
  for (int d = 0; d < r->ndims; d++) {
    int64_t len = 0;
    for (int k = 0; k < r->dims[d].n; k++) len += r->dims[d].iv[k].hi - r->dims[d].iv[k].lo;
    if (len == 0) continue;
    int64_t most = (len + n - 1) / n * (numel / len);
    if (cut < 0 || most < best) cut = d, best = most;
  }
  if (cut < 0) return NULL;
  tregion *parts = arena_alloc(a, sizeof(tregion) * (size_t)n);
  for (int i = 0; i < n; i++) {
    parts[i].ndims = r->ndims;
    parts[i].dims = arena_alloc(a, sizeof(dregion) * (size_t)(r->ndims ? r->ndims : 1));
    for (int d = 0; d < r->ndims; d++) {
      if (d == cut) dregion_part(a, &r->dims[d], i, n, &parts[i].dims[d]);
      else parts[i].dims[d] = r->dims[d];
    }
  }
  return parts;
}

/* Whether the regions parts[0..n) lie in whole, are disjoint, and together
 * cover it: each member of a scatter or a gather has its own part. */
static bool tiles(const tregion *whole, const tregion *const *parts, int n) {
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    if (!tregion_contains(whole, parts[i])) return false;
    total += tregion_numel(parts[i]);
    for (int j = 0; j < i; j++)
      if (tregion_overlaps(parts[i], parts[j])) return false;
  }
  return total == tregion_numel(whole);
}

/* Index of device d in the sorted group g, or -1. */
static int member_of(const int *g, int n, int d) {
  const int *at = bsearch(&d, g, (size_t)n, sizeof(int), int_cmp);
  return at ? (int)(at - g) : -1;
}

/* The part of `whole` each member of the sorted group g takes in a scatter
 * or a gather: the regions of x (consumers' needs, or what producers wrote;
 * dev[i] the device of region i) that meet whole must lie in it, on
 * members, one region per member (equal ones may share a device), and tile
 * it. parts gets one per member; hit[0..*nhit) the regions found (hit holds
 * one int per region of x). */
static bool member_parts(const sweep_index *x, const int *dev, const tregion *whole, const int *g, int n,
                         const tregion **parts, int *hit, int *nhit) {
  *nhit = sweep_find(x, whole, hit);
  for (int m = 0; m < n; m++) parts[m] = NULL;
  for (int k = 0; k < *nhit; k++) {
    const tregion *r = x->regions[hit[k]];
    int m = member_of(g, n, dev[hit[k]]);
    if (m < 0 || !tregion_contains(whole, r) || (parts[m] && !tregion_equal(parts[m], r))) return false;
    parts[m] = r;
  }
  for (int m = 0; m < n; m++)
    if (!parts[m]) return false;
  return tiles(whole, parts, n);
}

/* ---- forward edges ---------------------------------------------------------------- */

/* What consumer sub-operator t needs of input k, on its device. */
static void need_of(arena *a, const weft_plan *p, const psub *t, int k, tregion *out) {
  tregion_of(a, p, t, &p->ops[t->op].space->inputs[k], out);
}

static uint64_t region_hash(const tregion *r) {
  uint64_t h = 1469598103934665603ull;
  for (int d = 0; d < r->ndims; d++)
    for (int i = 0; i < r->dims[d].n; i++) {
      h = (h ^ (uint64_t)r->dims[d].iv[i].lo) * 1099511628211ull;
      h = (h ^ (uint64_t)r->dims[d].iv[i].hi) * 1099511628211ull;
    }
  return h;
}

/* Regions by value: the regions equal to a given one, in index order. */
typedef struct region_index {
  const tregion *const *regions;
  htab by;                /* one entry per value */
  int *first;             /* per entry: the first region of that value */
  int *next;              /* per region: the next one equal to it, -1: none */
} region_index;

typedef struct region_lookup {
  const region_index *x;
  const tregion *r;
} region_lookup;

static bool region_is(const void *ctx, int e) {
  const region_lookup *k = ctx;
  return tregion_equal(k->x->regions[k->x->first[e]], k->r);
}

/* The first region equal to r, -1 if none. */
static int region_index_find(const region_index *x, const tregion *r) {
  region_lookup k = {x, r};
  int e = htab_find(&x->by, region_hash(r), region_is, &k);
  return e < 0 ? -1 : x->first[e];
}

static void region_index_build(arena *a, region_index *x, const tregion *const *regions, int n) {
  x->regions = regions;
  x->by = (htab){.a = a};
  htab_reserve(&x->by, n);
  x->first = arena_alloc(a, sizeof(int) * (size_t)(n ? n : 1));
  x->next = arena_alloc(a, sizeof(int) * (size_t)(n ? n : 1));
  int *last = arena_alloc(a, sizeof(int) * (size_t)(n ? n : 1));  /* per entry: its last region so far */
  for (int i = 0; i < n; i++) {
    uint64_t h = region_hash(regions[i]);
    region_lookup k = {x, regions[i]};
    int e = htab_find(&x->by, h, region_is, &k);
    x->next[i] = -1;
    if (e < 0) {
      e = htab_add(&x->by, h);
      x->first[e] = i;
    } else {
      x->next[last[e]] = i;
    }
    last[e] = i;
  }
}

/* A copy of part, a region inside whole, sharing whole's intervals in the
 * dimensions where they are the same: a part of a scatter or a gather
 * differs from the region in one dimension, and plans hold many of them. */
static tregion part_copy(arena *a, const tregion *whole, const tregion *part) {
  tregion c = {part->ndims, arena_alloc(a, sizeof(dregion) * (size_t)(part->ndims ? part->ndims : 1))};
  for (int d = 0; d < part->ndims; d++) {
    const dregion *w = d < whole->ndims ? &whole->dims[d] : NULL;
    const dregion *x = &part->dims[d];
    bool same = w && w->n == x->n;
    for (int i = 0; i < x->n && same; i++) same = w->iv[i].lo == x->iv[i].lo && w->iv[i].hi == x->iv[i].hi;
    if (same) { c.dims[d] = *w; continue; }
    c.dims[d].n = x->n;
    c.dims[d].iv = arena_alloc(a, sizeof(irange) * (size_t)(x->n ? x->n : 1));
    memcpy(c.dims[d].iv, x->iv, sizeof(irange) * (size_t)x->n);
  }
  return c;
}

/* The sends made so far, by (tensor, destination, region): a tensor read by
 * two operators on one device is sent there once. A broadcast is there
 * once per destination. */
typedef struct sendset {
  htab by;                /* by send_key */
  VEC(int) comm;          /* per entry: the communication */
} sendset;

static uint64_t send_key(int tensor, int dst, const tregion *r) {
  return (region_hash(r) ^ ((uint64_t)tensor * 0x9e3779b97f4a7c15ull)) * 1099511628211ull ^ (uint64_t)dst;
}

typedef struct send_lookup {
  const sendset *ss;
  const weft_plan *p;
  int tensor, dst;
  const tregion *r;
} send_lookup;

static bool send_is(const void *ctx, int e) {
  const send_lookup *k = ctx;
  const pcomm *o = &k->p->comms[k->ss->comm.v[e]];
  bool to = o->dst == k->dst;  /* a send to dst, or a broadcast dst takes part in */
  for (int m = 0; o->kind == COMM_BROADCAST && m < o->ngroup && !to; m++) to = o->group[m] == k->dst && k->dst != o->src;
  return o->kind != COMM_ALL_REDUCE && o->kind != COMM_REDUCE_SCATTER && o->kind != COMM_ALL_GATHER &&
         o->tensor == k->tensor && to &&
         tregion_equal(&o->region, k->r);
}

static int sendset_find(const sendset *ss, const weft_plan *p, uint64_t key, int tensor, int dst, const tregion *r) {
  send_lookup k = {ss, p, tensor, dst, r};
  int e = htab_find(&ss->by, key, send_is, &k);
  return e < 0 ? -1 : ss->comm.v[e];
}

/* A reduction of partial sums of tensor's region r whose group holds every
 * device of g[0..n): its index in p->comms, or -1. */
typedef struct reduction_lookup {
  const sendset *ss;
  const weft_plan *p;
  int tensor;
  const tregion *r;
  const int *g;
  int n;
  const tregion *parts;   /* a reduce-scatter's: the part of each member of g */
  comm_kind kind;         /* COMM_ALL_REDUCE, COMM_REDUCE_SCATTER or COMM_ALL_GATHER */
} reduction_lookup;

static bool reduction_is(const void *ctx, int e) {
  const reduction_lookup *k = ctx;
  const pcomm *o = &k->p->comms[k->ss->comm.v[e]];
  if (o->kind != k->kind || o->tensor != k->tensor ||
      !tregion_equal(&o->region, k->r))
    return false;
  for (int i = 0; i < k->n; i++) {
    int m = member_of(o->group, o->ngroup, k->g[i]);
    if (m < 0 || (k->kind == COMM_REDUCE_SCATTER && !tregion_equal(&o->parts[m], &k->parts[i]))) return false;
  }
  return k->kind != COMM_REDUCE_SCATTER || o->ngroup == k->n;
}

/* A collective of tensor's region r, made for another consumer, that
 * leaves each device of g[0..n) what it needs: the sum of partial sums (an
 * all-reduce whose group holds g), its part of the sum (the same
 * reduce-scatter, given the parts), or the whole from parts (an all-gather
 * whose group holds g). Its index in p->comms, or -1. */
static int reduction_find(const sendset *ss, const weft_plan *p, uint64_t key, comm_kind kind, int tensor,
                          const tregion *r, const int *g, int n, const tregion *parts) {
  reduction_lookup k = {ss, p, tensor, r, g, n, parts, kind};
  int e = htab_find(&ss->by, key, reduction_is, &k);
  return e < 0 ? -1 : ss->comm.v[e];
}

static void sendset_add(sendset *ss, uint64_t key, int comm) {
  htab_add(&ss->by, key);
  vec_push(NULL, &ss->comm, comm);
}

/* Partial sums held split otherwise than the consumers read them (the
 * experts' row-parallel product under tensor parallelism, read by combine
 * through expert parallelism's all-to-all): the pieces hsel[0..ns) that meet
 * need hold several regions, each one device per key. The holders of each
 * region all-reduce it (once: another consumer's reduction is found), and
 * each consumer on cdevs[0..nc) that holds no piece of a region receives
 * its part of the sum from the nearest holder, among equally near ones its
 * peer (rank to rank).
 * False, adding nothing, when the pieces are all one region or a region's
 * holders are not one device per key. */
static int nearest_peer(const weft_plan *p, const int *hold, int n, int d, int rank);

static bool feed_reduce_regions(arena *a, arena *s, weft_plan *p, int tensor, const tregion *need,
                                const pieces *have, const int *hsel, int ns, const int *cdevs, int nc, sendset *ss) {
  bool mixed = false;
  for (int q = 0; q < ns && !mixed; q++) mixed = !tregion_equal(&have->v[hsel[q]].region, &have->v[hsel[0]].region);
  if (!mixed) return false;
  int nk = -1;
  int *grp = arena_alloc(s, sizeof(int) * (size_t)ns);
  int64_t *keys = arena_alloc(s, sizeof(int64_t) * (size_t)ns);
  for (int pass = 0; pass < 2; pass++)
    for (int q = 0; q < ns; q++) {
      const piece *pc = &have->v[hsel[q]];
      bool first = pc->partial >= 0;
      for (int e = 0; e < q && first; e++) first = !tregion_equal(&have->v[hsel[e]].region, &pc->region);
      if (pc->partial < 0) return false;
      if (!first) continue;
      int ng = 0;
      for (int e = q; e < ns; e++) {
        const piece *o = &have->v[hsel[e]];
        if (!tregion_equal(&o->region, &pc->region)) continue;
        for (int r = 0; r < ng; r++)
          if (keys[r] == o->partial || grp[r] == o->device) return false;
        keys[ng] = o->partial;
        grp[ng++] = o->device;
      }
      if (nk < 0) nk = ng;
      if (ng != nk || ng < 2) return false;
      if (pass == 0) continue;
      int *hold = arena_alloc(s, sizeof(int) * (size_t)ng);
      memcpy(hold, grp, sizeof(int) * (size_t)ng);
      ng = distinct(grp, ng);
      uint64_t rkey = send_key(tensor, -2, &pc->region);
      if (reduction_find(ss, p, rkey, COMM_ALL_REDUCE, tensor, &pc->region, grp, ng, NULL) < 0) {
        tregion r = tregion_copy(a, &pc->region);
        pcomm *cm = comm_add(a, p, COMM_ALL_REDUCE, tensor, PHASE_FORWARD, grp, ng, &r);
        sendset_add(ss, rkey, p->ncomms - 1);
        cm->why = "the producers hold partial sums split otherwise than the consumers read them; each part's holders reduce it";
      }
      tregion x;
      if (!tregion_intersect(s, &pc->region, need, &x)) continue;
      for (int c = 0; c < nc; c++) {
        int dst = cdevs[c], src;
        bool held = false;
        for (int r = 0; r < ng && !held; r++) held = hold[r] == dst;
        if (held) continue;
        src = nearest_peer(p, grp, ng, dst, c);
        uint64_t key = send_key(tensor, dst, &x);
        if (sendset_find(ss, p, key, tensor, dst, &x) >= 0) continue;
        int pair[2] = {src, dst};
        tregion r = tregion_copy(a, &x);
        pcomm *cm = comm_add(a, p, COMM_SEND, tensor, PHASE_FORWARD, pair, 2, &r);
        sendset_add(ss, key, p->ncomms - 1);
        cm->src = src;
        cm->dst = dst;
        cm->producer_sub = pc->sub;
        cm->why = "the consumer runs on another device than the producer";
      }
    }
  return true;
}

/* Sequence parallelism after a row-parallel layer: the producers hold partial
 * sums of one region, one piece on each device of a group, and the consumers
 * on the group each need their own part of it, the parts tiling it. One
 * reduce-scatter leaves each member the sum of its part, half the bytes of
 * the all-reduce that the sum everywhere would take. nsweep indexes the
 * consumers' needs, cdev their devices; hit is a buffer of one int per
 * consumer. The consumers it feeds are marked done. */
static bool feed_scatter(arena *a, arena *s, weft_plan *p, int tensor, const tregion *need, const pieces *have,
                         const int *hsel, int ns, const int *hdevs, int nh, const sweep_index *nsweep,
                         const int *cdev, int *hit, bool *done, sendset *ss) {
  if (nh < 2 || nh != ns) return false;
  const tregion *whole = &have->v[hsel[0]].region;
  for (int q = 0; q < ns; q++)
    if (have->v[hsel[q]].partial < 0 || !tregion_equal(&have->v[hsel[q]].region, whole)) return false;
  if (tregion_equal(whole, need) || !tregion_contains(whole, need)) return false;
  const tregion **parts = arena_alloc(s, sizeof(tregion *) * (size_t)nh);
  int nhit;
  if (!member_parts(nsweep, cdev, whole, hdevs, nh, parts, hit, &nhit)) return false;
  for (int k = 0; k < nhit; k++) done[hit[k]] = true;
  /* the same reduce-scatter, made for another consumer, already left each
   * member its part of the sum */
  tregion *rel = arena_alloc(s, sizeof(tregion) * (size_t)nh);
  for (int m = 0; m < nh; m++) rel[m] = part_copy(s, whole, parts[m]);
  uint64_t rkey = send_key(tensor, -3, whole);
  if (reduction_find(ss, p, rkey, COMM_REDUCE_SCATTER, tensor, whole, hdevs, nh, rel) >= 0) return true;
  tregion r = tregion_copy(a, whole);
  pcomm *cm = comm_add(a, p, COMM_REDUCE_SCATTER, tensor, PHASE_FORWARD, hdevs, nh, &r);
  cm->parts = arena_alloc(a, sizeof(tregion) * (size_t)nh);
  for (int m = 0; m < nh; m++) cm->parts[m] = part_copy(a, &cm->region, parts[m]);
  sendset_add(ss, rkey, p->ncomms - 1);
  cm->why = "the producers hold partial sums; each consumer needs the sum of its own part";
  return true;
}

/* ---- all-to-all ---------------------------------------------------------------------- */

/* The sends ids[0..ns) become one all-to-all (appended; the sends are
 * marked COMM_NONE for regroup_sends to drop) when they are a complete
 * exchange among their devices: every ordered pair once, device dev[i]
 * starting with from[i] and ending with to[i], each send the sender's from
 * meeting the receiver's to, and every to made of the pieces and what its
 * device holds already. from and to come from the caller (NULL where a
 * device has no single such region: then nothing changes). */
static void make_all_to_all(arena *a, arena *s, weft_plan *p, const int *ids, int ns, const int *dev,
                            const tregion *const *from, const tregion *const *to, int n, const char *why) {
  if (n < 2 || ns != n * (n - 1)) return;
  for (int i = 0; i < n; i++)
    if (!from[i] || !to[i]) return;
  const pcomm *c0 = &p->comms[ids[0]];
  int64_t *sent = arena_alloc(s, sizeof(int64_t) * (size_t)n), *got = arena_alloc(s, sizeof(int64_t) * (size_t)n);
  bool *seen = arena_alloc(s, sizeof(bool) * (size_t)(n * n));
  for (int i = 0; i < n; i++) sent[i] = got[i] = 0;
  for (int i = 0; i < n * n; i++) seen[i] = false;
  for (int q = 0; q < ns; q++) {
    const pcomm *cm = &p->comms[ids[q]];
    if (cm->kind != COMM_SEND || cm->tensor != c0->tensor || cm->phase != c0->phase) return;
    int i = -1, j = -1;
    for (int m = 0; m < n; m++) {
      if (dev[m] == cm->src) i = m;
      if (dev[m] == cm->dst) j = m;
    }
    if (i < 0 || j < 0 || seen[i * n + j]) return;
    seen[i * n + j] = true;
    tregion x;
    if (!tregion_intersect(s, from[i], to[j], &x) || !tregion_equal(&x, &cm->region)) return;
    sent[i] += cm->size;
    got[j] += tregion_numel(&cm->region);
  }
  for (int j = 0; j < n; j++) {
    tregion x;
    int64_t own = tregion_intersect(s, from[j], to[j], &x) ? tregion_numel(&x) : 0;
    if (own + got[j] != tregion_numel(to[j])) return;
  }
  /* group order: by device */
  int *order = arena_alloc(s, sizeof(int) * (size_t)n), *g = arena_alloc(s, sizeof(int) * (size_t)n);
  for (int i = 0; i < n; i++) g[i] = dev[i];
  sort_ints(g, n);
  for (int i = 0; i < n; i++)
    for (int m = 0; m < n; m++)
      if (dev[m] == g[i]) order[i] = m;
  /* the region: the smallest box around every part */
  int nd = to[0]->ndims;
  tregion box = {nd, arena_alloc(a, sizeof(dregion) * (size_t)(nd ? nd : 1))};
  for (int d = 0; d < nd; d++) {
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int i = 0; i < n; i++)
      for (int side = 0; side < 2; side++) {
        const dregion *r = &(side ? from[i] : to[i])->dims[d];
        if (r->n && r->iv[0].lo < lo) lo = r->iv[0].lo;
        if (r->n && r->iv[r->n - 1].hi > hi) hi = r->iv[r->n - 1].hi;
      }
    box.dims[d].n = 1;
    box.dims[d].iv = arena_alloc(a, sizeof(irange));
    box.dims[d].iv[0] = (irange){lo, hi};
  }
  pcomm keep = *c0;
  for (int q = 0; q < ns; q++) p->comms[ids[q]].kind = COMM_NONE;
  pcomm *cm = comm_add(a, p, COMM_ALL_TO_ALL, keep.tensor, keep.phase, g, n, &box);
  cm->parts = arena_alloc(a, sizeof(tregion) * (size_t)n);
  cm->sources = arena_alloc(a, sizeof(tregion) * (size_t)n);
  int64_t total = 0, most = 0;
  for (int i = 0; i < n; i++) {
    cm->parts[i] = tregion_copy(a, to[order[i]]);
    cm->sources[i] = tregion_copy(a, from[order[i]]);
    total += sent[order[i]];
    if (sent[order[i]] > most) most = sent[order[i]];
  }
  cm->size = total;
  cm->bytes = most;
  cm->consumer_op = keep.consumer_op;
  cm->input = keep.input;
  cm->dir = keep.dir;
  cm->why = why;
}

/* The representative of x's group in the union-find forest up. */
static int group_root(int *up, int x) {
  while (up[x] != x) x = up[x] = up[up[x]];
  return x;
}

/* Orders the sends ids[0..ns) by the groups of devices they connect (sends
 * that share a device are in one group), group after group in the order of
 * their first send; starts[0..n] bounds each group, n returned. Disjoint
 * groups (the expert groups of tensor-parallel peers) exchange separately:
 * one all-to-all each. */
static int send_groups(arena *s, const weft_plan *p, int *ids, int ns, int *starts) {
  int nd = p->ndevices > 0 ? p->ndevices : 1;
  int *up = arena_alloc(s, sizeof(int) * (size_t)nd);
  for (int d = 0; d < nd; d++) up[d] = d;
  for (int q = 0; q < ns; q++) {
    int a = p->comms[ids[q]].src, b = p->comms[ids[q]].dst;
    if (a < 0 || b < 0 || a >= nd || b >= nd) continue;
    a = group_root(up, a), b = group_root(up, b);
    if (a != b) up[a] = b;
  }
  int *root = arena_alloc(s, sizeof(int) * (size_t)(ns ? ns : 1)), *out = arena_alloc(s, sizeof(int) * (size_t)(ns ? ns : 1));
  bool *took = arena_alloc(s, (size_t)(ns ? ns : 1));
  for (int q = 0; q < ns; q++) {
    int d = p->comms[ids[q]].src;
    root[q] = d >= 0 && d < nd ? group_root(up, d) : -1 - q;
  }
  int n = 0, m = 0;
  for (int q = 0; q < ns; q++) {
    if (took[q]) continue;
    starts[n++] = m;
    for (int r = q; r < ns; r++)
      if (!took[r] && root[r] == root[q]) took[r] = true, out[m++] = ids[r];
  }
  starts[n] = m;
  memcpy(ids, out, sizeof(int) * (size_t)ns);
  return n;
}

/* Regions by device for make_all_to_all: what each device starts with or
 * ends with, when it is one region (NULL otherwise). */
typedef struct layout {
  int n;
  int *dev;
  const tregion **from, **to;
} layout;

static void layout_init(arena *s, layout *l, const weft_plan *p, const int *ids, int ns) {
  l->dev = arena_alloc(s, sizeof(int) * (size_t)(2 * ns + 1));
  int n = 0;
  for (int q = 0; q < ns; q++) l->dev[n++] = p->comms[ids[q]].src, l->dev[n++] = p->comms[ids[q]].dst;
  l->n = distinct(l->dev, n);
  l->from = arena_alloc(s, sizeof(tregion *) * (size_t)(l->n + 1));
  l->to = arena_alloc(s, sizeof(tregion *) * (size_t)(l->n + 1));
  for (int m = 0; m < l->n; m++) l->from[m] = l->to[m] = NULL;
}

/* Sets what device d starts (side 0) or ends (side 1) with; a second,
 * different region makes it unusable. */
static void layout_put(layout *l, int d, int side, const tregion *r, bool *bad) {
  for (int m = 0; m < l->n; m++) {
    if (l->dev[m] != d) continue;
    const tregion **slot = side ? &l->to[m] : &l->from[m];
    if (*slot && !tregion_equal(*slot, r)) bad[m] = true;
    *slot = r;
  }
}

static void layout_finish(layout *l, const bool *bad) {
  for (int m = 0; m < l->n; m++)
    if (bad[m]) l->from[m] = NULL;
}

/* Drops the sends make_all_to_all took (COMM_NONE) from comms[first..]; the
 * sendset forgets them and learns where the others moved. */
static void regroup_sends(weft_plan *p, int first, sendset *ss) {
  int m = first;
  for (int i = first; i < p->ncomms; i++)
    if (p->comms[i].kind != COMM_NONE) p->comms[m++] = p->comms[i];
  if (m == p->ncomms) return;
  p->ncomms = m;
  if (!ss) return;
  /* the sends from first on were added last: they are forgotten from the
   * end, and those that stay added again */
  int keep = ss->comm.n;
  while (keep > 0 && ss->comm.v[keep - 1] >= first) keep--;
  htab_truncate(&ss->by, keep);
  ss->comm.n = keep;
  for (int i = first; i < p->ncomms; i++) {
    const pcomm *cm = &p->comms[i];
    for (int m = 0; m < (cm->kind == COMM_BROADCAST ? cm->ngroup : 1); m++) {
      int dst = cm->kind == COMM_BROADCAST ? cm->group[m] : cm->dst;
      if ((cm->kind != COMM_SEND && cm->kind != COMM_BROADCAST) || dst == cm->src) continue;
      sendset_add(ss, send_key(cm->tensor, dst, &cm->region), i);
    }
  }
}


/* How near device src is to dst: 0 itself, 1 on its node, 2 elsewhere. */
static int nearness(const weft_plan *p, int src, int dst) {
  return src == dst ? 0 : node_of(p, src) == node_of(p, dst) ? 1 : 2;
}

/* The piece (an index into hsel) that sends part x to dst, the rank-th of
 * its consumers: of the pieces holding x, the nearest to dst, and among
 * equally near ones the rank-th (modulo their count), so that a group
 * reading what a group holds is fed pair by pair. */
static int pick_holder(const weft_plan *p, const pieces *have, const int *hsel, int ns, const tregion *x, int dst,
                       int rank) {
  int best = 3, count = 0;
  for (int q = 0; q < ns; q++) {
    const piece *o = &have->v[hsel[q]];
    if (!tregion_contains(&o->region, x)) continue;
    int n = nearness(p, o->device, dst);
    if (n < best) best = n, count = 0;
    if (n == best) count++;
  }
  if (count == 0) return -1;
  int want = rank % count;
  for (int q = 0; q < ns; q++) {
    const piece *o = &have->v[hsel[q]];
    if (tregion_contains(&o->region, x) && nearness(p, o->device, dst) == best && want-- == 0) return q;
  }
  return -1;
}

/* Scatter-gather between pipeline stages: the consumers cdevs[0..nc), all
 * on one node, need the whole of `need`, which at least nc devices on other
 * nodes hold whole. Consumer i receives part i from its peer, one nc-th of
 * the bytes over the slow links, and the consumers all-gather the parts
 * over their node's links. False (nothing added) when the layout is not
 * that one. */
static bool feed_scatter_gather(arena *a, arena *s, weft_plan *p, int tensor, const tregion *need,
                                const pieces *have, const int *hsel, int ns, const int *cdevs, int nc,
                                sendset *ss) {
  if (nc < 2 || ns < nc) return false;
  for (int i = 1; i < nc; i++)
    if (node_of(p, cdevs[i]) != node_of(p, cdevs[0])) return false;
  for (int q = 0; q < ns; q++) {
    const piece *o = &have->v[hsel[q]];
    if (o->partial >= 0 || !tregion_equal(&o->region, need) || node_of(p, o->device) == node_of(p, cdevs[0]))
      return false;
  }
  /* gathered for another consumer on the same devices already */
  uint64_t gkey = send_key(tensor, -4, need);
  if (reduction_find(ss, p, gkey, COMM_ALL_GATHER, tensor, need, cdevs, nc, NULL) >= 0) return true;
  tregion *parts = region_parts(s, need, nc);
  if (!parts) return false;
  int *src = arena_alloc(s, sizeof(int) * (size_t)nc);
  for (int i = 0; i < nc; i++) {
    int q = pick_holder(p, have, hsel, ns, need, cdevs[i], i);
    if (q < 0) return false;
    src[i] = q;
    for (int j = 0; j < i; j++)
      if (have->v[hsel[src[j]]].device == have->v[hsel[q]].device) return false;  /* one part per holder */
  }
  tregion whole = tregion_copy(a, need);
  for (int i = 0; i < nc; i++) {
    const piece *pc = &have->v[hsel[src[i]]];
    int pair[2] = {pc->device, cdevs[i]};
    tregion r = part_copy(a, &whole, &parts[i]);
    pcomm *cm = comm_add(a, p, COMM_SEND, tensor, PHASE_FORWARD, pair, 2, &r);
    cm->src = pc->device;
    cm->dst = cdevs[i];
    cm->producer_sub = pc->sub;
    cm->stage_edge = true;
    cm->why = "scatter-gather: each device of the next stage receives its part from its peer";
  }
  pcomm *cm = comm_add(a, p, COMM_ALL_GATHER, tensor, PHASE_FORWARD, cdevs, nc, &whole);
  sendset_add(ss, gkey, p->ncomms - 1);
  cm->parts = arena_alloc(a, sizeof(tregion) * (size_t)nc);
  for (int i = 0; i < nc; i++) cm->parts[i] = part_copy(a, &cm->region, &parts[i]);
  cm->stage_edge = true;
  cm->why = "scatter-gather: the next stage's devices gather the parts their peers sent";
  return true;
}

/* Feeds input k of operator op from the producer's pieces. Regions live in
 * the scratch arena s; what a communication keeps is copied into a. dhead
 * has one entry per device, -1 on entry and again on return. */
static void feed_edge(arena *a, arena *s, weft_plan *p, int op, int k, const pieces *have, sendset *ss, int *dhead) {
  arena_reset(s);
  int first_comm = p->ncomms;
  const popplan *cp = &p->ops[op];
  int tensor = cp->space->inputs[k].tensor;
  int nc_all = cp->count;
  tregion *needs = arena_alloc(s, sizeof(tregion) * (size_t)(nc_all ? nc_all : 1));
  const tregion **nptr = arena_alloc(s, sizeof(tregion *) * (size_t)(nc_all ? nc_all : 1));
  for (int i = 0; i < nc_all; i++) {
    need_of(s, p, &p->subs[cp->first + i], k, &needs[i]);
    nptr[i] = &needs[i];
  }
  const tregion **hptr = arena_alloc(s, sizeof(tregion *) * (size_t)(have->n ? have->n : 1));
  for (int h = 0; h < have->n; h++) hptr[h] = &have->v[h].region;
  region_index nx, hx;
  region_index_build(s, &nx, nptr, nc_all);
  region_index_build(s, &hx, hptr, have->n);
  sweep_index hsweep = {0};  /* made when a need is held by no piece exactly */
  /* the pieces on each device, for the local check */
  int *dnext = arena_alloc(s, sizeof(int) * (size_t)(have->n ? have->n : 1));
  for (int h = have->n - 1; h >= 0; h--) {
    int d = have->v[h].device;
    if (d < 0 || d >= p->ndevices) continue;
    dnext[h] = dhead[d];
    dhead[d] = h;
  }
  bool *done = arena_alloc(s, sizeof(bool) * (size_t)(nc_all ? nc_all : 1));
  /* the consumers by extent, for feed_scatter: made when first needed */
  sweep_index nsweep = {0};
  int *cdev = NULL, *hit = NULL;
  int *cdevs = arena_alloc(s, sizeof(int) * (size_t)(nc_all ? nc_all : 1));
  int *hdevs = arena_alloc(s, sizeof(int) * (size_t)(have->n ? have->n : 1));
  int *g = arena_alloc(s, sizeof(int) * (size_t)(have->n + nc_all + 1));
  int *hsel = arena_alloc(s, sizeof(int) * (size_t)(have->n ? have->n : 1));
  for (int i = 0; i < nc_all; i++) {
    if (done[i]) continue;
    const psub *t = &p->subs[cp->first + i];
    const tregion *need = &needs[i];
    /* complete values already on the device */
    bool local = false;
    if (t->device >= 0 && t->device < p->ndevices)
      for (int h = dhead[t->device]; h >= 0 && !local; h = dnext[h])
        local = have->v[h].partial < 0 && tregion_contains(&have->v[h].region, need);
    if (local) { done[i] = true; continue; }
    /* the consumers that need the same region */
    int nc = 0;
    for (int j = i; j >= 0; j = nx.next[j])
      if (!done[j]) {
        cdevs[nc++] = p->subs[cp->first + j].device;
        done[j] = true;
      }
    nc = distinct(cdevs, nc);
    /* the pieces that hold it: the same region when there are such, else
     * every piece that overlaps it */
    int ns = 0;
    for (int h = region_index_find(&hx, need); h >= 0; h = hx.next[h]) hsel[ns++] = h;
    if (ns == 0) {
      if (!hsweep.at) sweep_build(s, &hsweep, hptr, have->n);
      ns = sweep_find(&hsweep, need, hsel);
    }
    int nh = 0, npartial = 0;
    for (int q = 0; q < ns; q++) {
      hdevs[nh++] = have->v[hsel[q]].device;
      if (have->v[hsel[q]].partial >= 0) npartial++;
    }
    nh = distinct(hdevs, nh);
    bool same = nh == nc && memcmp(hdevs, cdevs, sizeof(int) * (size_t)nc) == 0;
    if (npartial > 0) {
      if (!nsweep.at) {
        sweep_build(s, &nsweep, nptr, nc_all);
        cdev = arena_alloc(s, sizeof(int) * (size_t)(nc_all ? nc_all : 1));
        hit = arena_alloc(s, sizeof(int) * (size_t)(nc_all ? nc_all : 1));
        for (int j = 0; j < nc_all; j++) cdev[j] = p->subs[cp->first + j].device;
      }
      if (feed_scatter(a, s, p, tensor, need, have, hsel, ns, hdevs, nh, &nsweep, cdev, hit, done, ss)) continue;
      if (feed_reduce_regions(a, s, p, tensor, need, have, hsel, ns, cdevs, nc, ss)) continue;
      /* partial sums of the region: reduce them where they are needed */
      memcpy(g, hdevs, sizeof(int) * (size_t)nh);
      memcpy(g + nh, cdevs, sizeof(int) * (size_t)nc);
      int ng = distinct(g, nh + nc);
      /* another consumer's reduction of the same partial sums left the
       * sum on every device of its group: summing again would double it */
      uint64_t rkey = send_key(tensor, -2, need);
      if (reduction_find(ss, p, rkey, COMM_ALL_REDUCE, tensor, need, g, ng, NULL) >= 0) continue;
      tregion r = tregion_copy(a, need);
      pcomm *cm = comm_add(a, p, COMM_ALL_REDUCE, tensor, PHASE_FORWARD, g, ng, &r);
      sendset_add(ss, rkey, p->ncomms - 1);
      cm->why = same ? "the producers hold partial sums; every consumer needs the sum"
                     : "the producers hold partial sums; the group reduces them for consumers elsewhere";
      continue;
    }
    if (same && nh > 1) {
      /* gathered for another consumer on the same devices already */
      uint64_t gkey = send_key(tensor, -4, need);
      if (reduction_find(ss, p, gkey, COMM_ALL_GATHER, tensor, need, hdevs, nh, NULL) >= 0) continue;
      tregion r = tregion_copy(a, need);
      pcomm *cm = comm_add(a, p, COMM_ALL_GATHER, tensor, PHASE_FORWARD, hdevs, nh, &r);
      sendset_add(ss, gkey, p->ncomms - 1);
      cm->why = "each device holds a part; every consumer needs the whole";
      /* what each member brings: the part of the region its piece holds */
      cm->parts = arena_alloc(a, sizeof(tregion) * (size_t)nh);
      for (int m = 0; m < nh; m++) {
        cm->parts[m] = (tregion){0};
        for (int q = 0; q < ns; q++) {
          tregion x;
          if (have->v[hsel[q]].device != hdevs[m] || !tregion_intersect(s, &have->v[hsel[q]].region, need, &x))
            continue;
          cm->parts[m] = part_copy(a, &cm->region, &x);
          break;
        }
      }
      continue;
    }
    /* a group on one node reading what a group on other nodes holds whole:
     * each holder sends its peer a part over the slow links, and the peers
     * all-gather over the fast ones (Megatron-LM's scatter-gather) */
    if (npartial == 0 && feed_scatter_gather(a, s, p, tensor, need, have, hsel, ns, cdevs, nc, ss)) continue;
    /* from the nearest holder of each part to each consumer */
    for (int cdi = 0; cdi < nc; cdi++) {
      int dst = cdevs[cdi];
      for (int q = 0; q < ns; q++) {
        int h = hsel[q];
        const piece *pc = &have->v[h];
        tregion x;
        if (pc->device == dst) continue;
        if (tregion_equal(&pc->region, need)) x = *need;
        else if (!tregion_intersect(s, &pc->region, need, &x)) continue;
        /* one holder per part: the nearest, and among equally near ones the
         * consumer's peer (rank to rank), so that no holder sends to all */
        bool dup = pick_holder(p, have, hsel, ns, &x, dst, cdi) != q;
        bool local_part = false;
        if (dst >= 0 && dst < p->ndevices)
          for (int h2 = dhead[dst]; h2 >= 0 && !local_part; h2 = dnext[h2])
            local_part = tregion_contains(&have->v[h2].region, &x);
        if (dup || local_part) continue;
        /* the same part to the same device once, whoever reads it there */
        uint64_t key = send_key(tensor, dst, &x);
        if (sendset_find(ss, p, key, tensor, dst, &x) >= 0) continue;
        int pair[2] = {pc->device, dst};
        tregion r = tregion_copy(a, &x);
        pcomm *cm = comm_add(a, p, COMM_SEND, tensor, PHASE_FORWARD, pair, 2, &r);
        sendset_add(ss, key, p->ncomms - 1);
        cm->src = pc->device;
        cm->dst = dst;
        cm->producer_sub = pc->sub;
        cm->why = "the consumer runs on another device than the producer";
      }
    }
  }
  for (int i = first_comm; i < p->ncomms; i++) {
    p->comms[i].consumer_op = op;
    p->comms[i].input = k;
  }
  /* a layout change inside one group (sequence to heads): one all-to-all
   * per micro-batch */
  int nsend = p->ncomms - first_comm;
  if (nsend >= 2) {
    int *ids = arena_alloc(s, sizeof(int) * (size_t)nsend);
    /* (sends only: the all-to-all and broadcast below are made of them) */
    bool *used = arena_alloc(s, (size_t)nsend);
    for (int i = 0; i < nsend; i++) used[i] = false;
    for (int i = 0; i < nsend; i++) {
      const pcomm *ci = &p->comms[first_comm + i];
      if (used[i] || ci->kind != COMM_SEND || ci->producer_sub < 0) continue;
      int mb = p->subs[ci->producer_sub].microbatch, ns = 0;
      for (int j = i; j < nsend; j++) {
        const pcomm *cj = &p->comms[first_comm + j];
        if (!used[j] && cj->kind == COMM_SEND && cj->producer_sub >= 0 && p->subs[cj->producer_sub].microbatch == mb) {
          used[j] = true;
          ids[ns++] = first_comm + j;
        }
      }
      int *starts = arena_alloc(s, sizeof(int) * (size_t)(ns + 1));
      int ngroups = send_groups(s, p, ids, ns, starts);
      for (int gi = 0; gi < ngroups; gi++) {
        int *gids = ids + starts[gi], gn = starts[gi + 1] - starts[gi];
        layout l;
        layout_init(s, &l, p, gids, gn);
        bool *bad = arena_alloc(s, (size_t)(l.n + 1));
        for (int m = 0; m < l.n; m++) bad[m] = false;
        for (int h = 0; h < have->n; h++) {
          const piece *pc = &have->v[h];
          if (pc->sub < 0 || p->subs[pc->sub].microbatch != mb) continue;
          layout_put(&l, pc->device, 0, &pc->region, bad);
          if (pc->partial >= 0)  /* partial sums: a reduction, not a move */
            for (int m = 0; m < l.n; m++) bad[m] |= l.dev[m] == pc->device;
        }
        for (int q = 0; q < nc_all; q++) {
          const psub *t = &p->subs[cp->first + q];
          if (t->microbatch == mb) layout_put(&l, t->device, 1, &needs[q], bad);
        }
        layout_finish(&l, bad);
        make_all_to_all(a, s, p, gids, gn, l.dev, l.from, l.to, l.n,
                        "the group holds the tensor split one way; its consumers read it split another");
      }
    }
    /* one holder sending the same region to several devices: a broadcast */
    for (int i = 0; i < nsend; i++) {
      pcomm *ci = &p->comms[first_comm + i];
      if (ci->kind != COMM_SEND) continue;
      int *grp = arena_alloc(s, sizeof(int) * (size_t)(nsend + 1)), *ids2 = arena_alloc(s, sizeof(int) * (size_t)nsend);
      int ng = 0, nid = 0;
      grp[ng++] = ci->src;
      for (int j = i; j < nsend; j++) {
        const pcomm *cj = &p->comms[first_comm + j];
        if (cj->kind == COMM_SEND && cj->src == ci->src && cj->producer_sub == ci->producer_sub &&
            tregion_equal(&cj->region, &ci->region))
          grp[ng++] = cj->dst, ids2[nid++] = first_comm + j;
      }
      if (nid < 2) continue;
      pcomm keep = *ci;
      for (int q = 0; q < nid; q++) p->comms[ids2[q]].kind = COMM_NONE;
      int n = distinct(grp, ng);
      pcomm *cm = comm_add(a, p, COMM_BROADCAST, keep.tensor, keep.phase, grp, n, &keep.region);
      cm->src = keep.src;
      cm->producer_sub = keep.producer_sub;
      cm->consumer_op = keep.consumer_op;
      cm->input = keep.input;
      cm->bytes = keep.size;
      cm->why = "one device holds what several devices of the next stage read";
    }
    regroup_sends(p, first_comm, ss);
  }
  for (int h = 0; h < have->n; h++)
    if (have->v[h].device >= 0 && have->v[h].device < p->ndevices) dhead[have->v[h].device] = -1;
}

/* ---- parameter gradients ------------------------------------------------------------ */

static bool tensor_has_idim(const tmap *m, int idim) {
  for (int d = 0; d < m->ndims; d++)
    for (int f = 0; f < m->nfactors[d]; f++)
      if (m->factors[d][f] == idim) return true;
  return false;
}

/* Whether sub-operator s contributes to the gradient of tensor m. Under a
 * value split (k+), an argument without k (a bias) is applied once, by the
 * first part, so only that part contributes. */
static bool contributes_but(const popplan *pp, const psub *s, const tmap *m, int skip) {
  for (int i = 0; i < pp->nsplits; i++)
    if (i != skip && pp->splits[i].kind == SPLIT_VALUE && s->coord[i] != 0 && !tensor_has_idim(m, pp->splits[i].idim))
      return false;
  return true;
}

static bool contributes(const popplan *pp, const psub *s, const tmap *m) { return contributes_but(pp, s, m, -1); }

/* Which part of a sum a sub-operator's gradient of tensor m is: its
 * coordinates on levels along idims that m does not contain (the same key:
 * copies made by replicas; time levels accumulate in place). -1: not a part. */
static int64_t grad_key(const popplan *pp, const psub *s, const tmap *m) {
  int64_t key = 0;
  bool any = false;
  for (int i = 0; i < pp->nsplits; i++) {
    const psplit *sp = &pp->splits[i];
    if (sp->kind == SPLIT_REPLICA || sp->kind == SPLIT_TIME) continue;
    if (sp->kind == SPLIT_VALUE && !tensor_has_idim(m, sp->idim)) continue;  /* applied once */
    if (!tensor_has_idim(m, sp->idim)) { key = key * sp->parts + s->coord[i]; any = true; }
  }
  return any ? key : -1;
}

/* Every sub-operator that reads tensor t contributes to its gradient over
 * the region it read. Two operators reading it (a tied embedding, a
 * residual) give two parts of the sum, so the operator is part of the key.
 * False when nothing reads t. */
/* The reads of each tensor: (operator, input) pairs in operator order. */
typedef struct treads {
  int *start;             /* per tensor: its reads are [start[t], start[t + 1]) */
  int *op, *input;
} treads;

static void treads_make(arena *a, const weft_plan *p, treads *rd) {
  const weft_graph *g = p->g;
  rd->start = arena_alloc(a, sizeof(int) * (size_t)(g->ntensors + 1));
  int n = 0;
  for (int op = 0; op < g->nops; op++)
    for (int k = 0; k < p->ops[op].space->ninputs; k++) rd->start[p->ops[op].space->inputs[k].tensor + 1]++, n++;
  for (int t = 0; t < g->ntensors; t++) rd->start[t + 1] += rd->start[t];
  rd->op = arena_alloc(a, sizeof(int) * (size_t)(n ? n : 1));
  rd->input = arena_alloc(a, sizeof(int) * (size_t)(n ? n : 1));
  int *fill = arena_alloc(a, sizeof(int) * (size_t)(g->ntensors ? g->ntensors : 1));
  for (int op = 0; op < g->nops; op++)
    for (int k = 0; k < p->ops[op].space->ninputs; k++) {
      int t = p->ops[op].space->inputs[k].tensor;
      int at = rd->start[t] + fill[t]++;
      rd->op[at] = op;
      rd->input[at] = k;
    }
}

/* With a view, the replica's sub-operators whose images contribute: the
 * level of the replicas is left out of the test, as each image has its
 * own coordinate there. */
static bool grad_contributions(arena *s, const weft_plan *p, const treads *rd, int t, pieces *out, region_index *ix,
                               const deps_view *v) {
  memset(out, 0, sizeof *out);
  for (int r = rd->start[t]; r < rd->start[t + 1]; r++) {
    int op = rd->op[r];
    const popplan *pp = &p->ops[op];
    const tmap *m = &pp->space->inputs[rd->input[r]];
    for (int i = 0; i < pp->count; i++) {
      const psub *sb = &p->subs[pp->first + i];
      if (!contributes_but(pp, sb, m, v ? v->level[op] : -1)) continue;
      int64_t key = ((int64_t)op << 32) | (grad_key(pp, sb, m) + 1);
      piece pc = {.device = sb->device, .partial = key, .sub = pp->first + i, .read = r};
      tregion_of(s, p, sb, m, &pc.region);
      pieces_add(s, out, pc);
    }
  }
  if (out->n == 0) return false;
  const tregion **ptr = arena_alloc(s, sizeof(tregion *) * (size_t)out->n);
  for (int i = 0; i < out->n; i++) ptr[i] = &out->v[i].region;
  region_index_build(s, ix, ptr, out->n);
  return true;
}

/* One contribution to a parameter's gradient over one region: which part of
 * the sum it is (grad_key, with its operator), on which device. */
typedef struct gpart {
  int64_t key;
  int device;
  int op;
} gpart;

static int gpart_cmp(const void *x, const void *y) {
  const gpart *a = x, *b = y;
  if (a->key != b->key) return a->key < b->key ? -1 : 1;
  return (a->device > b->device) - (a->device < b->device);
}

/* ZeRO for the gradient of parameter t summed over the group g (sorted) in
 * region r: a reduce-scatter leaves each member the sum of its part, the
 * part whose optimizer state it keeps. After the step, stages 1 and 2 gather
 * the updated parts back into the whole parameter on every member; stage 3
 * keeps only the parts and gathers the whole before each use, forward and
 * again backward. The readers are the operators of the contributions
 * gp[0..n) (in operator order) on the group's devices. False for a scalar,
 * which has no dimension to cut: its gradient is then all-reduced as
 * without ZeRO. */
static bool zero_comms(arena *a, arena *sc, weft_plan *p, int t, const int *g, int ng, const tregion *r,
                       const gpart *gp, int n) {
  tregion *parts = region_parts(a, r, ng);
  if (!parts) return false;
  pcomm *cm = comm_add(a, p, COMM_REDUCE_SCATTER, t, PHASE_WEIGHTS, g, ng, r);
  cm->parts = parts;
  cm->why = "parts of the gradient are computed on several devices: ZeRO sums each device's part of it there";
  if (p->zero[t].stage < 3) {
    cm = comm_add(a, p, COMM_ALL_GATHER, t, PHASE_PARAMS, g, ng, r);
    cm->parts = parts;
    cm->dir = DIR_OPTIMIZER;
    cm->why = "each device updates its part of the parameter (ZeRO): the updated parts are gathered";
    return true;
  }
  /* the readers, each once, in operator order (contributions are) */
  int *ops = arena_alloc(sc, sizeof(int) * (size_t)(n ? n : 1));
  int nops = 0;
  for (int q = 0; q < n; q++) {
    int op = gp[q].op;
    if (member_of(g, ng, gp[q].device) < 0 || (nops && ops[nops - 1] == op)) continue;
    bool seen = false;
    for (int o = 0; o < nops && !seen; o++) seen = ops[o] == op;
    if (!seen) ops[nops++] = op;
  }
  for (int o = 0; o < nops; o++) {
    const opspace *sp = p->ops[ops[o]].space;
    for (int k = 0; k < sp->ninputs; k++) {
      if (sp->inputs[k].tensor != t) continue;
      for (int dir = DIR_FORWARD; dir <= DIR_BACKWARD; dir++) {
        cm = comm_add(a, p, COMM_ALL_GATHER, t, PHASE_PARAMS, g, ng, r);
        cm->parts = parts;
        cm->consumer_op = ops[o];
        cm->input = k;
        cm->dir = (sub_dir)dir;
        cm->why = dir == DIR_FORWARD
                      ? "each device keeps only its part of the parameter (ZeRO-3): it is gathered before use"
                      : "each device keeps only its part of the parameter (ZeRO-3): it is gathered again for backward";
      }
    }
  }
  return true;
}

/* The reductions of one region r of parameter t's gradient from its
 * contributions gp[0..n) (in operator order): contributions with the same
 * key are copies (replicas compute the same gradient) and those with
 * different keys are parts of a sum: each set of copies takes part in its
 * own reduction, one device per key. In a sum each part counts once: a
 * part on more devices than another (a replicated reader beside split
 * ones) is brought by one of its devices already in the group where there
 * is one, and its copies on the group's other devices are left out of what
 * they add (pcomm.omit). mark is a scratch flag per device, all false,
 * left so. */
static void reduce_region(arena *a, arena *sc, weft_plan *p, int t, const tregion *region, const gpart *gp, int n,
                          bool *mark) {
  /* distinct (key, device), sorted: each key's devices in increasing order */
  gpart *o = arena_alloc(sc, sizeof(gpart) * (size_t)(n ? n : 1));
  memcpy(o, gp, sizeof(gpart) * (size_t)n);
  sort_items(o, (size_t)n, sizeof(gpart), gpart_cmp);
  int m = 0;
  for (int q = 0; q < n; q++)
    if (m == 0 || o[m - 1].key != o[q].key || o[m - 1].device != o[q].device) o[m++] = o[q];
  /* each key's run: start[r], nd[r] devices */
  int *start = arena_alloc(sc, sizeof(int) * (size_t)(m + 1)), *nd = arena_alloc(sc, sizeof(int) * (size_t)(m + 1));
  int nk = 0, copies = -1;
  for (int q = 0; q < m; q++) {
    if (q == 0 || o[q].key != o[q - 1].key) start[nk] = q, nd[nk++] = 0;
    nd[nk - 1]++;
  }
  if (nk < 2) return;  /* copies only: every device computed the whole gradient */
  for (int r = 0; r < nk; r++)
    if (copies < 0 || nd[r] < copies) copies = nd[r];
  /* rep[r * copies + j]: the device that brings key r to group j. The keys
   * on the fewest devices give group j its members, the j-th device of
   * each; the groups' devices are marked */
  int *rep = arena_alloc(sc, sizeof(int) * (size_t)nk * (size_t)copies);
  int **base = arena_alloc(sc, sizeof(int *) * (size_t)copies);
  int *nbase = arena_alloc(sc, sizeof(int) * (size_t)copies);
  for (int j = 0; j < copies; j++) {
    base[j] = arena_alloc(sc, sizeof(int) * (size_t)nk);
    nbase[j] = 0;
    for (int r = 0; r < nk; r++)
      if (nd[r] == copies) base[j][nbase[j]++] = rep[r * copies + j] = o[start[r] + j].device;
    nbase[j] = distinct(base[j], nbase[j]);
    for (int q = 0; q < nbase[j]; q++) mark[base[j][q]] = true;
  }
  /* a key on more devices: in each group, its first device already there,
   * else its first device in no group yet (else its j-th) */
  for (int r = 0; r < nk; r++) {
    if (nd[r] == copies) continue;
    for (int j = 0; j < copies; j++) {
      int d = -1;
      for (int i = 0; i < nd[r] && d < 0; i++)
        if (member_of(base[j], nbase[j], o[start[r] + i].device) >= 0) d = o[start[r] + i].device;
      for (int i = 0; i < nd[r] && d < 0; i++)
        if (!mark[o[start[r] + i].device]) d = o[start[r] + i].device;
      if (d < 0) d = o[start[r] + j].device;
      mark[d] = true;
      rep[r * copies + j] = d;
    }
  }
  /* the other devices of a key: in a group, they leave their copy out of
   * what they add (unless the same operator's other part there is to be
   * added); in none, they take the first group's sum without adding */
  int *extra = arena_alloc(sc, sizeof(int) * (size_t)(m + 1));
  int *omit = arena_alloc(sc, sizeof(int) * 2 * (size_t)(m + 1));
  int nx = 0, nomit = 0;
  for (int r = 0; r < nk; r++)
    for (int i = 0; i < nd[r]; i++) {
      const gpart *c = &o[start[r] + i];
      bool brings = false;
      for (int r2 = 0; r2 < nk && !brings; r2++)
        if (r2 == r || o[start[r2]].op == c->op)
          for (int j = 0; j < copies && !brings; j++) brings = rep[r2 * copies + j] == c->device;
      if (brings) continue;
      if (!mark[c->device]) {
        extra[nx++] = c->device;
        continue;
      }
      bool listed = false;
      for (int q = 0; q < nomit && !listed; q++) listed = omit[2 * q] == c->device && omit[2 * q + 1] == c->op;
      if (!listed) omit[2 * nomit] = c->device, omit[2 * nomit++ + 1] = c->op;
    }
  for (int q = 0; q < m; q++) mark[o[q].device] = false;
  nx = distinct(extra, nx);
  int *g = arena_alloc(sc, sizeof(int) * (size_t)(nk + nx));
  for (int j = 0; j < copies; j++) {
    for (int r = 0; r < nk; r++) g[r] = rep[r * copies + j];
    int ng = distinct(g, nk);
    int nadd = ng;
    if (j == 0) {
      memcpy(g + ng, extra, sizeof(int) * (size_t)nx);
      ng = distinct(g, ng + nx);
    }
    if (ng < 2) continue;  /* all parts on one device: summed in place */
    tregion r = tregion_copy(a, region);
    int first = p->ncomms;
    if (!(nadd == ng && p->zero[t].stage > 0 && zero_comms(a, sc, p, t, g, ng, &r, gp, n))) {
      pcomm *cm = comm_add(a, p, COMM_ALL_REDUCE, t, PHASE_WEIGHTS, g, ng, &r);
      cm->why = "parts of the gradient are computed on several devices: they are summed";
      if (nadd < ng) {
        cm->silent = arena_alloc(a, sizeof(bool) * (size_t)ng);
        for (int q = 0; q < ng; q++) {
          cm->silent[q] = false;
          for (int x = 0; x < nx; x++) cm->silent[q] |= g[q] == extra[x];
        }
        cm->why = "parts of the gradient are computed on several devices: they are summed, and the further "
                  "copies of a part take the sum without adding theirs";
      }
    }
    /* the group's members that leave a copy out: named on its first
     * communication, where the lowering looks for them */
    pcomm *cm = &p->comms[first];
    for (int q = 0; q < nomit; q++) {
      if (member_of(g, ng, omit[2 * q]) < 0) continue;
      int *w = arena_alloc(a, sizeof(int) * 2 * (size_t)(cm->nomit + 1));
      if (cm->nomit) memcpy(w, cm->omit, sizeof(int) * 2 * (size_t)cm->nomit);
      w[2 * cm->nomit] = omit[2 * q];
      w[2 * cm->nomit + 1] = omit[2 * q + 1];
      cm->omit = w;
      cm->nomit++;
      if (cm->kind == COMM_ALL_REDUCE && !cm->silent)
        cm->why = "parts of the gradient are computed on several devices: they are summed, and a replicated "
                  "reader's copies add theirs once";
    }
  }
}

/* Sums the gradients of parameters over the devices that compute parts of
 * them. With a view (deps_view: the sub-operators of one data-parallel
 * replica), each contribution of the replica stands for its images in
 * every replica: the sub-operators at the other coordinates of the
 * replicas' level, whose region of the parameter is the same (parameters
 * do not move with the replica), on their own devices. */
static void reduce_param_grads(arena *a, arena *sc, weft_plan *p, const treads *rd, const deps_view *v) {
  const weft_graph *g = p->g;
  bool *mark = calloc((size_t)(p->ndevices ? p->ndevices : 1), 1);
  if (!mark) weft_oom();
  for (int t = 0; t < g->ntensors; t++) {
    if (g->tensors[t].role != TENSOR_PARAM) continue;
    arena_reset(sc);
    pieces contrib;
    region_index cx;
    if (!grad_contributions(sc, p, rd, t, &contrib, &cx, v)) continue;
    /* group the contributions by region */
    bool *done = arena_alloc(sc, sizeof(bool) * (size_t)contrib.n);
    int *idx = arena_alloc(sc, sizeof(int) * (size_t)contrib.n);
    VEC(gpart) gp = {0};
    for (int i = 0; i < contrib.n; i++) {
      if (done[i]) continue;
      int ni = 0;
      for (int j = i; j >= 0; j = cx.next[j])
        if (!done[j]) {
          idx[ni++] = j;
          done[j] = true;
        }
      gp.n = 0;
      for (int q = 0; q < ni; q++) {
        const piece *pc = &contrib.v[idx[q]];
        int op = p->subs[pc->sub].op;
        if (!v) {
          vec_push(sc, &gp, ((gpart){pc->partial, pc->device, op}));
          continue;
        }
        /* the images of the replica's sub-operator, in every replica */
        const popplan *pp = &p->ops[op];
        const tmap *m = &pp->space->inputs[rd->input[pc->read]];
        int f0 = v->full[pc->sub];
        for (int j = 0; j < v->P; j++) {
          const psub *img = &v->subs[f0 + (j - v->c) * v->stride[op]];
          if (!contributes(pp, img, m)) continue;
          vec_push(sc, &gp, ((gpart){((int64_t)op << 32) | (grad_key(pp, img, m) + 1), img->device, op}));
        }
      }
      reduce_region(a, sc, p, t, &contrib.v[i].region, gp.v, gp.n, mark);
    }
  }
  free(mark);
}

/* ---- gradients of activations ------------------------------------------------------ */

/* The backward of a reduce-scatter into sequence-parallel consumers: they
 * sent back the gradients of their own parts of `need`, one part per device,
 * the parts tiling it, and the producers on the same devices (nn of them,
 * needdevs sorted) each wrote the whole: an all-gather gives each of them the
 * gradient of all of it. With several consumers (nk keys) of the same
 * layout, each device first sums theirs for its part. */
static bool grads_gather(arena *a, arena *s, weft_plan *p, int t, int prod, const tregion *need,
                         const int *needdevs, int nn, const pieces *contrib, const int *idx, int ni, int nk) {
  /* nk consumers (keys), each with one part on every device: a device
   * sums what its consumers sent for its part, all of one region */
  if (nk < 1 || ni < 2 || ni != nk * nn) return false;
  int *g = arena_alloc(s, sizeof(int) * (size_t)ni);
  for (int q = 0; q < ni; q++) g[q] = contrib->v[idx[q]].device;
  if (distinct(g, ni) != nn || memcmp(g, needdevs, sizeof(int) * (size_t)nn) != 0) return false;
  const tregion **parts = arena_alloc(s, sizeof(tregion *) * (size_t)nn);
  for (int m = 0; m < nn; m++) parts[m] = NULL;
  for (int q = 0; q < ni; q++) {
    const tregion **at = &parts[member_of(g, nn, contrib->v[idx[q]].device)];
    if (*at && !tregion_equal(*at, &contrib->v[idx[q]].region)) return false;
    *at = &contrib->v[idx[q]].region;
  }
  if (!tiles(need, parts, nn)) return false;
  tregion r = tregion_copy(a, need);
  pcomm *cm = comm_add(a, p, COMM_ALL_GATHER, t, PHASE_BACKWARD, g, nn, &r);
  cm->parts = arena_alloc(a, sizeof(tregion) * (size_t)nn);
  for (int m = 0; m < nn; m++) cm->parts[m] = part_copy(a, &cm->region, parts[m]);
  cm->consumer_op = prod;
  cm->why = "its consumers hold the gradients of their own parts; every producer needs the whole";
  return true;
}

/* The backward of an all-gather into a column-parallel layer: the consumers,
 * one key per device of a group, sent back partial sums of the gradient of
 * one whole region, and the producers on the group each wrote a part of it,
 * the parts tiling it. One reduce-scatter leaves each producer the sum for
 * its part. wsweep indexes what the producers wrote, pdev their devices; hit
 * is a buffer of one int per producer. The producers it serves are marked
 * done. */
static bool grads_scatter(arena *a, arena *s, weft_plan *p, int t, int prod, const tregion *need,
                          const pieces *contrib, const int *idx, int ni, int nk, int *const *devs, const int *ndev,
                          const sweep_index *wsweep, const int *pdev, int *hit, bool *done) {
  if (nk < 2) return false;
  const tregion *whole = &contrib->v[idx[0]].region;
  for (int q = 0; q < ni; q++)
    if (!tregion_equal(&contrib->v[idx[q]].region, whole)) return false;
  if (!tregion_contains(whole, need)) return false;
  /* each key on one device; a device with several (the partial sums of
   * several consumers, q, k and v of one input) sums them in place first */
  int *g = arena_alloc(s, sizeof(int) * (size_t)nk);
  for (int r = 0; r < nk; r++) {
    if (ndev[r] != 1) return false;
    g[r] = devs[r][0];
  }
  int ng = distinct(g, nk);
  if (ng < 2) return false;
  const tregion **parts = arena_alloc(s, sizeof(tregion *) * (size_t)ng);
  int nhit;
  if (!member_parts(wsweep, pdev, whole, g, ng, parts, hit, &nhit)) return false;
  tregion r = tregion_copy(a, whole);
  pcomm *cm = comm_add(a, p, COMM_REDUCE_SCATTER, t, PHASE_BACKWARD, g, ng, &r);
  cm->parts = arena_alloc(a, sizeof(tregion) * (size_t)ng);
  for (int m = 0; m < ng; m++) cm->parts[m] = part_copy(a, &cm->region, parts[m]);
  for (int k = 0; k < nhit; k++) done[hit[k]] = true;
  cm->consumer_op = prod;
  cm->why = "its consumers' gradients are partial sums of the whole; each producer needs the sum of its part";
  return true;
}

/* Of the devices hold[0..n), the nearest to d, and among equally near ones
 * the rank-th (modulo their count). */
static int nearest_peer(const weft_plan *p, const int *hold, int n, int d, int rank) {
  int best = 3, count = 0;
  for (int q = 0; q < n; q++) {
    int k = nearness(p, hold[q], d);
    if (k < best) best = k, count = 0;
    if (k == best) count++;
  }
  int want = count ? rank % count : 0;
  for (int q = 0; q < n; q++)
    if (nearness(p, hold[q], d) == best && want-- == 0) return hold[q];
  return hold[0];
}

/* The backward of scatter-gather between pipeline stages: the devices
 * miss[0..nm), on one node, each need the whole gradient r, which devices
 * hold[0..nh) on other nodes each hold summed. Device miss[i] receives part
 * i from its peer and they all-gather the parts. */
static bool grads_scatter_gather(arena *a, arena *s, weft_plan *p, int t, int prod, const tregion *r,
                                 const int *hold, int nh, const int *miss, int nm) {
  if (nm < 2 || nh < nm) return false;
  for (int i = 0; i < nm; i++)
    if (node_of(p, miss[i]) != node_of(p, miss[0])) return false;
  for (int q = 0; q < nh; q++)
    if (node_of(p, hold[q]) == node_of(p, miss[0])) return false;
  tregion *parts = region_parts(s, r, nm);
  if (!parts) return false;
  int *src = arena_alloc(s, sizeof(int) * (size_t)nm);
  for (int i = 0; i < nm; i++) {
    src[i] = nearest_peer(p, hold, nh, miss[i], i);
    for (int j = 0; j < i; j++)
      if (src[j] == src[i]) return false;
  }
  for (int i = 0; i < nm; i++) {
    int pair[2] = {src[i], miss[i]};
    tregion part = part_copy(a, r, &parts[i]);
    pcomm *cm = comm_add(a, p, COMM_SEND, t, PHASE_BACKWARD, pair, 2, &part);
    cm->src = src[i];
    cm->dst = miss[i];
    cm->consumer_op = prod;
    cm->stage_edge = true;
    cm->why = "scatter-gather: each device of the stage before receives its part of the gradient from its peer";
  }
  pcomm *cm = comm_add(a, p, COMM_ALL_GATHER, t, PHASE_BACKWARD, miss, nm, r);
  cm->parts = arena_alloc(a, sizeof(tregion) * (size_t)nm);
  for (int i = 0; i < nm; i++) cm->parts[i] = part_copy(a, &cm->region, &parts[i]);
  cm->consumer_op = prod;
  cm->stage_edge = true;
  cm->why = "scatter-gather: the stage before gathers the parts of the gradient its peers sent";
  return true;
}

/* Partial sums that come back split otherwise than the producers wrote
 * them (a tensor-parallel product of expert parallelism's experts, read
 * through an all-to-all): each region the contributions idx[0..ni) hold
 * has every key of the nk on one device (a device may hold several, which
 * it sums in place); those devices all-reduce it (once per tensor: reduced
 * marks the contributions done), after which every holder has the sum and
 * the gradient moves as complete values do. False, adding nothing, when a
 * region lacks a key or holds one on two devices. */
static bool grads_reduce_regions(arena *a, arena *s, weft_plan *p, int t, int prod, const pieces *contrib,
                                 const int *idx, int ni, int nk, bool *reduced) {
  int *grp = arena_alloc(s, sizeof(int) * (size_t)(ni ? ni : 1));
  int64_t *keys = arena_alloc(s, sizeof(int64_t) * (size_t)(ni ? ni : 1));
  int *kdev = arena_alloc(s, sizeof(int) * (size_t)(ni ? ni : 1));
  for (int pass = 0; pass < 2; pass++)
    for (int q = 0; q < ni; q++) {
      const piece *pc = &contrib->v[idx[q]];
      bool first = true;
      for (int e = 0; e < q && first; e++) first = !tregion_equal(&contrib->v[idx[e]].region, &pc->region);
      if (!first) continue;
      int ng = 0, nkeys = 0;
      bool done = false;
      for (int e = q; e < ni; e++) {
        const piece *o = &contrib->v[idx[e]];
        if (!tregion_equal(&o->region, &pc->region)) continue;
        done |= reduced[idx[e]];
        int r;
        for (r = 0; r < nkeys && keys[r] != o->partial; r++) {}
        if (r < nkeys && kdev[r] != o->device) return false;
        if (r == nkeys) keys[nkeys] = o->partial, kdev[nkeys++] = o->device;
        grp[ng++] = o->device;
      }
      ng = distinct(grp, ng);
      if (nkeys != nk || ng < 2) return false;
      if (pass == 0 || done) continue;
      for (int e = q; e < ni; e++)
        if (tregion_equal(&contrib->v[idx[e]].region, &pc->region)) reduced[idx[e]] = true;
      tregion r = tregion_copy(a, &pc->region);
      pcomm *cm = comm_add(a, p, COMM_ALL_REDUCE, t, PHASE_BACKWARD, grp, ng, &r);
      cm->why = "its consumers' gradients are parts of a sum on several devices, split otherwise than the producer wrote its result";
      cm->consumer_op = prod;
    }
  return true;
}

/* Whether key k has a piece of region r on device d among pieces idx[0..ni). */
static bool holds_key(const pieces *contrib, const int *idx, int ni, int64_t k, const tregion *r, int d) {
  for (int q = 0; q < ni; q++) {
    const piece *o = &contrib->v[idx[q]];
    if (o->device == d && o->partial == k && tregion_equal(&o->region, r)) return true;
  }
  return false;
}

/* Consumers whose gradients meet the region a producer wrote in different
 * layouts (one split along the sequence, another replicated), or lie in
 * different pipeline stages (why says which): every
 * producer device gets, for each region of the pieces that meet its own,
 * what it lacks of that region's sum. A device holds one buffer per region,
 * the sum of the consumers it runs there, so the senders are chosen, the
 * nearest first, so that no consumer counts twice. The producer then sums
 * what it holds of its region (p->sum_grads marks the tensor for lowering).
 * False, adding nothing, when some device cannot be served so. */
static bool grads_sum_pieces(arena *a, arena *s, weft_plan *p, int t, int prod, const tregion *need,
                             const int *needdevs, int nn, const pieces *contrib, const int *idx, int ni,
                             const char *why) {
  int64_t *keys = arena_alloc(s, sizeof(int64_t) * (size_t)(ni ? ni : 1));
  bool *got = arena_alloc(s, (size_t)(ni ? ni : 1));
  int *cand = arena_alloc(s, sizeof(int) * (size_t)(ni ? ni : 1));
  for (int pass = 0; pass < 2; pass++)
    for (int w = 0; w < nn; w++) {
      int d = needdevs[w];
      for (int q = 0; q < ni; q++) {
        const tregion *rq = &contrib->v[idx[q]].region;
        bool seen = false;  /* the region of an earlier piece */
        for (int e = 0; e < q && !seen; e++) seen = tregion_equal(&contrib->v[idx[e]].region, rq);
        tregion x;
        if (seen || !tregion_intersect(s, rq, need, &x)) continue;
        /* the consumers (keys) with a piece of this region, and its holders */
        int nk = 0, nc = 0;
        for (int e = q; e < ni; e++) {
          const piece *o = &contrib->v[idx[e]];
          if (!tregion_equal(&o->region, rq)) continue;
          int r;
          for (r = 0; r < nk && keys[r] != o->partial; r++) {}
          if (r == nk) keys[nk++] = o->partial;
          if (o->device != d) cand[nc++] = o->device;
        }
        nc = distinct(cand, nc);
        int left = 0;
        for (int r = 0; r < nk; r++) {
          got[r] = holds_key(contrib, idx, ni, keys[r], rq, d);
          left += !got[r];
        }
        /* senders by nearness, each adding only keys not yet had */
        for (int near = 0; near < 3 && left; near++)
          for (int c = 0; c < nc && left; c++) {
            int src = cand[c];
            if (nearness(p, src, d) != near) continue;
            bool clash = false, adds = false;
            for (int r = 0; r < nk; r++)
              if (holds_key(contrib, idx, ni, keys[r], rq, src)) {
                clash |= got[r];
                adds = true;
              }
            if (clash || !adds) continue;
            for (int r = 0; r < nk; r++)
              if (holds_key(contrib, idx, ni, keys[r], rq, src)) got[r] = true, left--;
            if (pass == 0) continue;
            int pair[2] = {src, d};
            tregion rr = tregion_copy(a, &x);
            pcomm *cm = comm_add(a, p, COMM_SEND, t, PHASE_BACKWARD, pair, 2, &rr);
            cm->src = src;
            cm->dst = d;
            /* from the buffer of region rq: the sender may hold a larger
             * one that contains x too (another consumer's) */
            cm->from = arena_alloc(a, sizeof(tregion));
            *cm->from = tregion_copy(a, rq);
            cm->consumer_op = prod;
            cm->why = why;
          }
        if (left) return false;
      }
    }
  if (!p->sum_grads) {
    p->sum_grads = arena_alloc(a, sizeof(bool) * (size_t)(p->g->ntensors ? p->g->ntensors : 1));
    memset(p->sum_grads, 0, sizeof(bool) * (size_t)(p->g->ntensors ? p->g->ntensors : 1));
  }
  p->sum_grads[t] = true;
  return true;
}

/* Whether the consumers of the keys keys[0..nk) (grad_contributions: the
 * operator in the high bits) lie in more than one pipeline stage. */
static bool across_stages(const weft_plan *p, const int64_t *keys, int nk) {
  int stage = -1;
  for (int r = 0; r < nk; r++) {
    int st = p->ops[keys[r] >> 32].stage;
    if (st < 0) continue;
    if (stage >= 0 && st != stage) return true;
    stage = st;
  }
  return false;
}

/* Every consumer of an activation sends back the gradient of what it read;
 * the producer's sub-operators need the sum over consumers (and over the
 * parts of each consumer split along dimensions the activation lacks) for
 * the regions they wrote. Copies made by `replicate` are not summed. */
static void reduce_activation_grads(arena *a, arena *s, weft_plan *p, const treads *rd) {
  const weft_graph *g = p->g;
  for (int t = 0; t < g->ntensors; t++) {
    int prod = g->tensors[t].producer;
    if (prod < 0) continue;
    arena_reset(s);
    int first_t = p->ncomms;
    pieces contrib;
    region_index cx;
    if (!grad_contributions(s, p, rd, t, &contrib, &cx, NULL)) continue;
    const popplan *pp = &p->ops[prod];
    /* what each producer sub-operator wrote, indexed by region */
    tregion *wrote = arena_alloc(s, sizeof(tregion) * (size_t)(pp->count ? pp->count : 1));
    const tregion **wptr = arena_alloc(s, sizeof(tregion *) * (size_t)(pp->count ? pp->count : 1));
    for (int i = 0; i < pp->count; i++) {
      tregion_of(s, p, &p->subs[pp->first + i], &pp->space->output, &wrote[i]);
      wptr[i] = &wrote[i];
    }
    region_index wx;
    region_index_build(s, &wx, wptr, pp->count);
    bool *done = arena_alloc(s, sizeof(bool) * (size_t)(pp->count ? pp->count : 1));
    int *idx = arena_alloc(s, sizeof(int) * (size_t)contrib.n);
    int64_t *keys = arena_alloc(s, sizeof(int64_t) * (size_t)contrib.n);
    int *ndev = arena_alloc(s, sizeof(int) * (size_t)contrib.n);
    int **devs = arena_alloc(s, sizeof(int *) * (size_t)contrib.n);
    int *needdevs = arena_alloc(s, sizeof(int) * (size_t)(pp->count ? pp->count : 1));
    /* the contributions and what the producers wrote by extent, for the
     * regions that meet a given one: made when first needed */
    sweep_index csweep = {0}, wsweep = {0};
    int *pdev = NULL, *hit = NULL;
    int mixed = -1;          /* some contribution's region is no producer's: unknown yet */
    bool regrouped = false;  /* gradients sent piece by piece to another layout */
    bool *reduced = NULL;    /* contributions summed by grads_reduce_regions */
    bool *omitted = NULL;    /* copies of a replicated consumer's contribution left out */
    VEC(int) sendmb = {0};  /* per comm from first_t: its micro-batch */
    for (int i = 0; i < pp->count; i++) {
      if (done[i]) continue;
      tregion need = wrote[i];
      /* the producers that wrote the same region */
      int nn = 0;
      for (int j = i; j >= 0; j = wx.next[j]) {
        if (done[j]) continue;
        done[j] = true;
        needdevs[nn++] = p->subs[pp->first + j].device;
      }
      nn = distinct(needdevs, nn);
      /* the contributions for it, by key */
      int ni = 0;
      for (int q = region_index_find(&cx, &need); q >= 0; q = cx.next[q]) idx[ni++] = q;
      bool exact = ni > 0;
      /* other consumers' gradients that meet the region without being it
       * (one consumer split along the sequence, another replicated) */
      if (exact && mixed < 0) {
        mixed = 0;
        for (int q = 0; q < contrib.n && !mixed; q++) mixed = region_index_find(&wx, &contrib.v[q].region) < 0;
      }
      if (exact && mixed) {
        if (!csweep.at) {
          const tregion **cptr = arena_alloc(s, sizeof(tregion *) * (size_t)contrib.n);
          for (int q = 0; q < contrib.n; q++) cptr[q] = &contrib.v[q].region;
          sweep_build(s, &csweep, cptr, contrib.n);
        }
        int nm = sweep_find(&csweep, &need, idx);
        bool other = false;
        for (int q = 0; q < nm && !other; q++) other = !tregion_equal(&contrib.v[idx[q]].region, &need);
        if (other && grads_sum_pieces(a, s, p, t, prod, &need, needdevs, nn, &contrib, idx, nm,
                                      "its consumers' gradients come back in different layouts; the producer sums the pieces"))
          continue;
        /* else as before: the consumers whose gradient is the region */
        for (int q = region_index_find(&cx, &need), w = 0; q >= 0; q = cx.next[q]) idx[w++] = q;
      }
      if (!exact) {
        if (!csweep.at) {
          const tregion **cptr = arena_alloc(s, sizeof(tregion *) * (size_t)contrib.n);
          for (int q = 0; q < contrib.n; q++) cptr[q] = &contrib.v[q].region;
          sweep_build(s, &csweep, cptr, contrib.n);
        }
        ni = sweep_find(&csweep, &need, idx);
      }
      int nk = 0;
      for (int q = 0; q < ni; q++) {
        int64_t k = contrib.v[idx[q]].partial;
        int r;
        for (r = 0; r < nk && keys[r] != k; r++) {}
        if (r == nk) { keys[nk] = k; ndev[nk] = 0; devs[nk] = arena_alloc(s, sizeof(int) * (size_t)ni); nk++; }
        devs[r][ndev[r]++] = contrib.v[idx[q]].device;
      }
      /* a consumer replicated beside split ones (whose gradients come back
       * split otherwise than the producers wrote them), each copy with the
       * whole of its part: the first copy gives it and the devices of the
       * others leave theirs out (attached below to the communication made
       * for the tensor) */
      bool alike_holders = true;  /* every key on the same devices: nothing is summed across them */
      for (int r = 1; r < nk && alike_holders; r++) {
        int n0 = distinct(devs[0], ndev[0]), nr = distinct(devs[r], ndev[r]);
        ndev[0] = n0, ndev[r] = nr;
        alike_holders = n0 == nr && memcmp(devs[0], devs[r], sizeof(int) * (size_t)n0) == 0;
      }
      if (!exact && nk > 1 && !alike_holders) {
        int w = 0;
        for (int q = 0; q < ni; q++) {
          const piece *pc = &contrib.v[idx[q]];
          bool copy = false;
          for (int e = 0; e < w && !copy; e++) {
            const piece *o = &contrib.v[idx[e]];
            copy = o->partial == pc->partial && o->device != pc->device && tregion_equal(&o->region, &pc->region);
          }
          if (!copy) { idx[w++] = idx[q]; continue; }
          if (!omitted) omitted = arena_alloc(s, (size_t)contrib.n);
          omitted[idx[q]] = true;
        }
        if (w < ni) {
          ni = w;
          for (int r = 0; r < nk; r++) ndev[r] = 0;
          for (int q = 0; q < ni; q++) {
            int r;
            for (r = 0; r < nk && keys[r] != contrib.v[idx[q]].partial; r++) {}
            devs[r][ndev[r]++] = contrib.v[idx[q]].device;
          }
        }
      }
      int copies = -1;
      for (int r = 0; r < nk; r++) {
        ndev[r] = distinct(devs[r], ndev[r]);
        if (copies < 0 || ndev[r] < copies) copies = ndev[r];
      }
      /* sequence parallelism: the gradients come back split otherwise than
       * the producers wrote them */
      if (!exact && ni > 1) {
        if (grads_gather(a, s, p, t, prod, &need, needdevs, nn, &contrib, idx, ni, nk)) continue;
        if (!wsweep.at) {
          sweep_build(s, &wsweep, wptr, pp->count);
          pdev = arena_alloc(s, sizeof(int) * (size_t)(pp->count ? pp->count : 1));
          hit = arena_alloc(s, sizeof(int) * (size_t)(pp->count ? pp->count : 1));
          for (int j = 0; j < pp->count; j++) pdev[j] = p->subs[pp->first + j].device;
        }
        if (grads_scatter(a, s, p, t, prod, &need, &contrib, idx, ni, nk, devs, ndev, &wsweep, pdev, hit, done))
          continue;
      }
      /* several consumers whose gradients come back in one layout (the same
       * region on the same devices for each): each device sums them in
       * place, and what follows moves the sum as one consumer's */
      if (!exact && nk > 1 && ni % nk == 0) {
        bool alike = true;
        for (int q = 0; q < ni && alike; q++) {
          const piece *pc = &contrib.v[idx[q]];
          if (pc->partial != keys[0]) continue;
          for (int r = 1; r < nk && alike; r++) {
            bool found = false;
            for (int e = 0; e < ni && !found; e++) {
              const piece *o = &contrib.v[idx[e]];
              found = o->partial == keys[r] && o->device == pc->device && tregion_equal(&o->region, &pc->region);
            }
            alike = found;
          }
        }
        if (alike) {
          int w = 0;
          for (int q = 0; q < ni; q++)
            if (contrib.v[idx[q]].partial == keys[0]) idx[w++] = idx[q];
          ni = w;
          nk = 1;
        }
      }
      if (!exact && nk > 1) {
        if (!reduced) reduced = arena_alloc(s, (size_t)contrib.n);
        if (grads_reduce_regions(a, s, p, t, prod, &contrib, idx, ni, nk, reduced)) nk = 1;
      }
      /* partial sums of some consumers beside others' pieces (one split
       * along its input's features): each producer sums the pieces */
      if (!exact && nk > 1 &&
          grads_sum_pieces(a, s, p, t, prod, &need, needdevs, nn, &contrib, idx, ni,
                           "its consumers' gradients come back in different layouts; the producer sums the pieces"))
        continue;
      /* complete gradients split otherwise than the producers wrote them
       * (attention by heads after a sequence split): each producer gets the
       * pieces that meet its region, from one holder each */
      if (!exact && nk == 1) {
        for (int w = 0; w < nn; w++) {
          int d = needdevs[w];
          for (int q = 0; q < ni; q++) {
            const piece *pc = &contrib.v[idx[q]];
            bool seen = false;  /* the same region from an earlier holder (a copy) */
            for (int e = 0; e < q && !seen; e++) seen = tregion_equal(&contrib.v[idx[e]].region, &pc->region);
            tregion x;
            if (seen || !tregion_intersect(s, &pc->region, &need, &x)) continue;
            /* a holder on d itself, else the nearest, and among equally
             * near ones d's peer (rank to rank, as when a tensor-parallel
             * group's summed parts go back) */
            int src = -1, nhold = 0;
            int *hold = arena_alloc(s, sizeof(int) * (size_t)ni);
            for (int e = q; e < ni; e++) {
              const piece *o = &contrib.v[idx[e]];
              if (!tregion_equal(&o->region, &pc->region)) continue;
              if (o->device == d) { src = d; break; }
              hold[nhold++] = o->device;
            }
            if (src < 0) src = nearest_peer(p, hold, distinct(hold, nhold), d, w);
            if (src == d) continue;
            int pair[2] = {src, d};
            tregion r = tregion_copy(a, &x);
            pcomm *cm = comm_add(a, p, COMM_SEND, t, PHASE_BACKWARD, pair, 2, &r);
            cm->src = src;
            cm->dst = d;
            cm->consumer_op = prod;
            cm->why = "the gradient comes back split otherwise than the producer wrote its result";
            while (sendmb.n < p->ncomms - first_t - 1) vec_push(s, &sendmb, -1);
            vec_push(s, &sendmb, pc->sub >= 0 ? p->subs[pc->sub].microbatch : 0);
          }
        }
        regrouped = true;
        continue;
      }
      /* consumers in different pipeline stages (a residual that skips a
       * stage, an encoder's output read by several decoder stages): an
       * all-reduce among them would join blocks that the schedule runs at
       * different times on each device, and a member would wait there
       * before the sends another member waits for. Their parts go to the
       * producers, which add them */
      if (exact && nk > 1 && across_stages(p, keys, nk) &&
          grads_sum_pieces(a, s, p, t, prod, &need, needdevs, nn, &contrib, idx, ni,
                           "its consumers are in different pipeline stages: each stage's part of the gradient goes "
                           "to the producer, which sums them"))
        continue;
      /* a device that holds every key sums in place */
      for (int w = 0; w < nn; w++) {
        int d = needdevs[w];
        bool all = nk > 0;
        for (int r = 0; r < nk && all; r++) {
          bool has = false;
          for (int q = 0; q < ndev[r] && !has; q++) has = devs[r][q] == d;
          all = has;
        }
        if (all) needdevs[w] = -1;
      }
      bool any_missing = false;
      for (int w = 0; w < nn; w++) any_missing |= needdevs[w] >= 0;
      if (!any_missing) continue;
      tregion r = tregion_copy(a, &need);
      if (nk > 1 && exact) {
        /* parts of a sum on several devices: one reduction per set of
         * copies. The keys held on the fewest devices pair by rank; a key
         * held on more (a consumer replicated where the others are split,
         * each copy with the whole of its part) is given by the first
         * member that holds it, and the other members holding it leave
         * their copy out of the sum */
        int *grp = arena_alloc(s, sizeof(int) * (size_t)nk);
        int *omit = arena_alloc(s, sizeof(int) * 2 * (size_t)ni);
        for (int j = 0; j < copies; j++) {
          int ng = 0, nomit = 0;
          for (int q = 0; q < nk; q++)
            if (ndev[q] == copies) grp[ng++] = devs[q][j];
          int nbase = ng = distinct(grp, ng);
          for (int q = 0; q < nk; q++) {
            if (ndev[q] == copies) continue;
            bool given = false;
            for (int e = 0; e < ndev[q]; e++) {
              if (member_of(grp, nbase, devs[q][e]) < 0) continue;
              if (given) omit[2 * nomit] = devs[q][e], omit[2 * nomit++ + 1] = (int)(keys[q] >> 32);
              given = true;
            }
            if (!given) grp[ng++] = devs[q][j];
          }
          ng = distinct(grp, ng);
          if (ng < 2) continue;
          pcomm *cm = comm_add(a, p, COMM_ALL_REDUCE, t, PHASE_BACKWARD, grp, ng, &r);
          cm->why = "its consumers' gradients are parts of a sum on several devices";
          if (nomit) {
            cm->nomit = nomit;
            cm->omit = arena_alloc(a, sizeof(int) * 2 * (size_t)nomit);
            memcpy(cm->omit, omit, sizeof(int) * 2 * (size_t)nomit);
            cm->why = "its consumers' gradients are parts of a sum on several devices; a replicated consumer's "
                      "copies add theirs once";
          }
          cm->consumer_op = prod;
          for (int w = 0; w < nn; w++)
            for (int q = 0; q < ng; q++)
              if (needdevs[w] == grp[q]) needdevs[w] = -1;
        }
      }
      /* producers on devices without the gradient: sent from a holder of
       * the sum (every device of a reduction's group, or of the one key),
       * the nearest, and among equally near ones the producer's peer */
      if (nk == 0) continue;
      int nhold = nk > 1 ? copies : ndev[0], nmiss = 0;
      int *miss = arena_alloc(s, sizeof(int) * (size_t)nn);
      for (int w = 0; w < nn; w++)
        if (needdevs[w] >= 0) miss[nmiss++] = needdevs[w];
      if (grads_scatter_gather(a, s, p, t, prod, &r, devs[0], nhold, miss, nmiss)) continue;
      for (int w = 0; w < nmiss; w++) {
        int d = miss[w];
        int src = nearest_peer(p, devs[0], nhold, d, w);
        int pair[2] = {src, d};
        pcomm *cm = comm_add(a, p, COMM_SEND, t, PHASE_BACKWARD, pair, 2, &r);
        cm->src = src;
        cm->dst = d;
        cm->consumer_op = prod;
        cm->why = "the producer runs on another device than the consumers of its result";
      }
    }
    /* the pieces of a layout change inside one group: one all-to-all per
     * micro-batch */
    int nsend = p->ncomms - first_t;
    if (regrouped && nsend >= 2) {
      int *ids = arena_alloc(s, sizeof(int) * (size_t)nsend);
      bool *used = arena_alloc(s, (size_t)nsend);
      for (int i = 0; i < nsend; i++) used[i] = i >= sendmb.n || sendmb.v[i] < 0;
      for (int i = 0; i < nsend; i++) {
        if (used[i]) continue;
        int mb = sendmb.v[i], ns = 0;
        for (int j = i; j < nsend; j++)
          if (!used[j] && sendmb.v[j] == mb) used[j] = true, ids[ns++] = first_t + j;
        int *starts = arena_alloc(s, sizeof(int) * (size_t)(ns + 1));
        int ngroups = send_groups(s, p, ids, ns, starts);
        for (int gi = 0; gi < ngroups; gi++) {
          int *gids = ids + starts[gi], gn = starts[gi + 1] - starts[gi];
          layout l;
          layout_init(s, &l, p, gids, gn);
          bool *bad = arena_alloc(s, (size_t)(l.n + 1));
          for (int m = 0; m < l.n; m++) bad[m] = false;
          for (int q = 0; q < contrib.n; q++) {
            const piece *pc = &contrib.v[q];
            if (pc->sub >= 0 && p->subs[pc->sub].microbatch == mb) layout_put(&l, pc->device, 0, &pc->region, bad);
          }
          for (int q = 0; q < pp->count; q++) {
            const psub *w = &p->subs[pp->first + q];
            if (w->microbatch == mb) layout_put(&l, w->device, 1, &wrote[q], bad);
          }
          layout_finish(&l, bad);
          make_all_to_all(a, s, p, gids, gn, l.dev, l.from, l.to, l.n,
                          "the gradient comes back split otherwise than the producer wrote its result");
        }
      }
      regroup_sends(p, first_t, NULL);
    }
    /* the copies left out: named on the communication of the tensor that
     * meets each, where the lowering looks for them */
    for (int q = 0; omitted && q < contrib.n; q++) {
      if (!omitted[q]) continue;
      const piece *pc = &contrib.v[q];
      for (int c = first_t; c < p->ncomms; c++) {
        pcomm *cm = &p->comms[c];
        if (!tregion_overlaps(&cm->region, &pc->region)) continue;
        int *o = arena_alloc(a, sizeof(int) * 2 * (size_t)(cm->nomit + 1));
        if (cm->nomit) memcpy(o, cm->omit, sizeof(int) * 2 * (size_t)cm->nomit);
        o[2 * cm->nomit] = pc->device;
        o[2 * cm->nomit + 1] = (int)(pc->partial >> 32);
        cm->omit = o;
        cm->nomit++;
        break;
      }
    }
  }
}

/* ---- statistics of a vocabulary-parallel cross entropy ------------------------- */

int deps_stats_idim(const weft_plan *p, int op) {
  const opdecl *d = p->g->ops[op].decl;
  if (!d || strcmp(d->name, "cross_entropy") != 0) return -1;
  const popplan *pp = &p->ops[op];
  for (int i = 0; i < pp->nsplits; i++) {
    int k = pp->splits[i].idim;
    if (k >= 0 && pp->splits[i].parts > 1 && strcmp(pp->space->idims[k].sig, "v") == 0) return k;
  }
  return -1;
}

typedef struct shard {
  int64_t rows;           /* its coordinates on the levels that do not split the vocabulary */
  int64_t v_lo;
  int sub;
} shard;

static int shard_cmp(const void *x, const void *y) {
  const shard *a = x, *b = y;
  if (a->rows != b->rows) return a->rows < b->rows ? -1 : 1;
  return a->v_lo < b->v_lo ? -1 : a->v_lo > b->v_lo;
}

/* The region of the statistics: the rows of the logits region r, columns
 * [lo, hi) of the statistics (docs/program.md). */
static tregion stats_region(arena *a, const tregion *r, int64_t lo, int64_t hi) {
  tregion x = tregion_copy(a, r);
  dregion *last = &x.dims[x.ndims - 1];
  last->n = 1;
  last->iv[0] = (irange){lo, hi};
  return x;
}

/* The shards of a cross entropy split along its vocabulary hold parts of
 * each row's logits, and the loss of a row needs all of them: each shard
 * computes three statistics per row (maximum, sum of exponentials, label
 * logit), and the shards of the same rows gather them, once for the
 * forward (again when it is recomputed) and once for the backward. Shards
 * of one group on one device get no gather; lowering reports them. */
static void exchange_stats(arena *a, arena *sc, weft_plan *p) {
  for (int op = 0; op < p->g->nops; op++) {
    int vi = deps_stats_idim(p, op);
    if (vi < 0) continue;
    const popplan *pp = &p->ops[op];
    arena_reset(sc);
    shard *sh = arena_alloc(sc, sizeof(shard) * (size_t)(pp->count ? pp->count : 1));
    for (int f = 0; f < pp->count; f++) {
      const psub *s = &p->subs[pp->first + f];
      int64_t key = 0;
      for (int i = 0; i < pp->nsplits; i++)
        if (pp->splits[i].idim != vi) key = key * pp->splits[i].parts + s->coord[i];
      sh[f] = (shard){key, s->range[vi].lo, pp->first + f};
    }
    qsort(sh, (size_t)pp->count, sizeof(shard), shard_cmp);
    for (int lo = 0, hi; lo < pp->count; lo = hi) {
      for (hi = lo + 1; hi < pp->count && sh[hi].rows == sh[lo].rows;) hi++;
      int n = hi - lo;
      int *devs = arena_alloc(sc, sizeof(int) * (size_t)n);
      for (int k = 0; k < n; k++) devs[k] = p->subs[sh[lo + k].sub].device;
      if (n < 2 || distinct(devs, n) != n) continue;
      tregion lr;
      tregion_of(sc, p, &p->subs[sh[lo].sub], &pp->space->inputs[0], &lr);
      tregion whole = stats_region(a, &lr, 0, 3 * (int64_t)n);
      tregion *parts = arena_alloc(a, sizeof(tregion) * (size_t)n);
      for (int k = 0; k < n; k++)
        parts[member_of(devs, n, p->subs[sh[lo + k].sub].device)] = stats_region(a, &lr, 3 * (int64_t)k, 3 * (int64_t)k + 3);
      for (int ph = 0; ph < 2; ph++) {
        pcomm *cm = comm_add(a, p, COMM_ALL_GATHER, pp->space->inputs[0].tensor, ph ? PHASE_BACKWARD : PHASE_FORWARD,
                             devs, n, &whole);
        cm->stats = true;
        cm->parts = parts;
        cm->size = tregion_numel(&whole) * (int64_t)sizeof(float);
        cm->bytes = cm->size * (n - 1) / n;
        cm->consumer_op = op;
        cm->input = 0;
        cm->why = ph ? "the vocabulary shards gather each row's statistics again for the backward"
                     : "the vocabulary shards gather each row's maximum, sum of exponentials and label logit";
      }
    }
  }
}

/* ---- the whole plan ---------------------------------------------------------------- */

void deps_derive(arena *a, weft_plan *p, const deps_view *view) {
  const weft_graph *g = p->g;
  /* a view: the replica's sub-operators stand in p->subs (each operator's
   * in their order) while the communication is derived */
  deps_view v = {0};
  psub *all = p->subs, *vsubs = NULL;
  int nall = p->nsubs, *first = NULL, *count = NULL, *full = NULL;
  int64_t *ints = NULL;   /* the replica's coordinates and ranges */
  if (view) {
    v = *view;
    vsubs = malloc(sizeof(psub) * (size_t)(nall ? nall : 1));
    full = malloc(sizeof(int) * (size_t)(nall ? nall : 1));
    first = malloc(sizeof(int) * (size_t)(g->nops ? g->nops : 1));
    count = malloc(sizeof(int) * (size_t)(g->nops ? g->nops : 1));
    if (!vsubs || !full || !first || !count) weft_oom();
    int n = 0;
    int64_t nint = 0;
    for (int op = 0; op < g->nops; op++) {
      popplan *pp = &p->ops[op];
      first[op] = pp->first;
      count[op] = pp->count;
      int at = n;
      for (int f = 0; f < pp->count; f++)
        if (all[pp->first + f].coord[v.level[op]] == v.c) {
          vsubs[n] = all[pp->first + f];
          full[n++] = pp->first + f;
          nint += pp->nsplits + 2 * pp->space->nidims;
        }
      pp->first = at;
      pp->count = n - at;
    }
    /* their coordinates and ranges side by side (they are read several
     * times each, and among every replica's they lie far apart) */
    ints = malloc(sizeof(int64_t) * (size_t)(nint ? nint : 1));
    if (!ints) weft_oom();
    int64_t *at = ints;
    for (int i = 0; i < n; i++) {
      const popplan *pp = &p->ops[vsubs[i].op];
      irange *r = (irange *)at;
      memcpy(r, vsubs[i].range, sizeof(irange) * (size_t)pp->space->nidims);
      vsubs[i].range = r;
      at += 2 * pp->space->nidims;
      int *c = (int *)at;
      memcpy(c, vsubs[i].coord, sizeof(int) * (size_t)pp->nsplits);
      vsubs[i].coord = c;
      at += pp->nsplits;
    }
    v.full = full;
    v.subs = all;
    p->subs = vsubs;
    p->nsubs = n;
    p->comm_copies = v.P;
  }
  /* what each tensor's producer holds */
  arena hold;  /* what producers hold: needed until every edge is fed */
  arena_init(&hold);
  pieces *held = arena_alloc(&hold, sizeof(pieces) * (size_t)(g->ntensors ? g->ntensors : 1));
  for (int op = 0; op < g->nops; op++) {
    const popplan *pp = &p->ops[op];
    for (int i = 0; i < pp->count; i++) {
      const psub *s = &p->subs[pp->first + i];
      piece pc = {.device = s->device, .partial = partial_key(pp, s), .sub = pp->first + i};
      tregion_of(&hold, p, s, &pp->space->output, &pc.region);
      pieces_add(&hold, &held[pp->space->output.tensor], pc);
    }
  }
  sendset ss = {0};
  arena scratch;
  arena_init(&scratch);
  int *dhead = malloc(sizeof(int) * (size_t)(p->ndevices ? p->ndevices : 1));
  if (!dhead) weft_oom();
  for (int d = 0; d < p->ndevices; d++) dhead[d] = -1;
  for (int op = 0; op < g->nops; op++) {
    const popplan *pp = &p->ops[op];
    for (int k = 0; k < pp->space->ninputs; k++) {
      int t = pp->space->inputs[k].tensor;
      if (g->tensors[t].producer < 0) continue;  /* inputs and parameters live where they are read */
      feed_edge(a, &scratch, p, op, k, &held[t], &ss, dhead);
    }
  }
  free(dhead);
  arena_free(&hold);
  prof_mark("deps: forward edges");
  arena reads;
  arena_init(&reads);
  treads rd;
  treads_make(&reads, p, &rd);
  reduce_activation_grads(a, &scratch, p, &rd);
  prof_mark("deps: activation gradients");
  reduce_param_grads(a, &scratch, p, &rd, view ? &v : NULL);
  prof_mark("deps: parameter gradients");
  exchange_stats(a, &scratch, p);
  htab_free(&ss.by);
  vec_free(&ss.comm);
  arena_free(&reads);
  arena_free(&scratch);
  if (view) {
    /* every sub-operator again, and the communication's by their index there */
    for (int op = 0; op < g->nops; op++) {
      p->ops[op].first = first[op];
      p->ops[op].count = count[op];
    }
    p->subs = all;
    p->nsubs = nall;
    for (int i = 0; i < p->ncomms; i++) {
      pcomm *cm = &p->comms[i];
      if (cm->producer_sub >= 0) cm->producer_sub = full[cm->producer_sub];
      if (cm->consumer_sub >= 0) cm->consumer_sub = full[cm->consumer_sub];
    }
    free(vsubs);
    free(ints);
    free(full);
    free(first);
    free(count);
  }
}

void deps_totals(const weft_plan *p, int64_t bytes[COMM_KIND_COUNT], int counts[COMM_KIND_COUNT], comm_phase phase) {
  for (int k = 0; k < COMM_KIND_COUNT; k++) {
    bytes[k] = p->comm_bytes[phase][k];
    counts[k] = p->comm_count[phase][k];
  }
}
