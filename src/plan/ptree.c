/* ptree.c - iteration spaces of operators and regions of tensors: what each
 * sub-operator of a plan reads and writes (the apply stage's geometry). */
#include <inttypes.h>
#include <string.h>

#include "weft/plan.h"

const char *const comm_kind_names[COMM_KIND_COUNT] = {
    [COMM_NONE] = "none",           [COMM_SLICE] = "slice",
    [COMM_SEND] = "send",           [COMM_ALL_REDUCE] = "all-reduce",
    [COMM_REDUCE_SCATTER] = "reduce-scatter", [COMM_ALL_GATHER] = "all-gather",
    [COMM_ALL_TO_ALL] = "all-to-all", [COMM_BROADCAST] = "broadcast",
};

const char *const comm_phase_names[PHASE_COUNT] = {"forward", "backward", "weights", "params"};


/* ---- regions -------------------------------------------------------------- */

tregion tregion_copy(arena *a, const tregion *r) {
  tregion c = {r->ndims, arena_alloc(a, sizeof(dregion) * (size_t)(r->ndims ? r->ndims : 1))};
  for (int d = 0; d < r->ndims; d++) {
    c.dims[d].n = r->dims[d].n;
    c.dims[d].iv = arena_alloc(a, sizeof(irange) * (size_t)(r->dims[d].n ? r->dims[d].n : 1));
    memcpy(c.dims[d].iv, r->dims[d].iv, sizeof(irange) * (size_t)r->dims[d].n);
  }
  return c;
}

/* ---- iteration spaces -------------------------------------------------------- */

typedef struct spacebuf {
  arena *a;
  idim *items;
  int n, cap;
} spacebuf;

static int idim_find(spacebuf *b, const char *sig, int elem) {
  for (int i = 0; i < b->n; i++)
    if (strcmp(b->items[i].sig, sig) == 0 && b->items[i].elem == elem) return i;
  return -1;
}

static int idim_add(spacebuf *b, const char *sig, int elem, int64_t size, const char *dim_name, int mark) {
  int i = idim_find(b, sig, elem);
  if (i < 0) {
    arena_grow(b->a, (void **)&b->items, &b->cap, b->n + 1, sizeof(idim));
    i = b->n++;
    b->items[i] = (idim){.sig = sig, .elem = elem, .size = size, .dim_name = dim_name};
  }
  if (mark == '+') b->items[i].reduce = true;
  if (mark == '^') b->items[i].nosplit = true;
  if (!b->items[i].dim_name) b->items[i].dim_name = dim_name;
  return i;
}

static const gbind *bind_of(const gop *o, const char *name) {
  for (int i = 0; i < o->nbinds; i++)
    if (strcmp(o->binds[i].name, name) == 0) return &o->binds[i];
  return NULL;
}

/* Maps a tensor through its pattern: each tensor dimension to idims. */
static void map_tensor(spacebuf *b, const gop *o, const oppattern *pat, const gtensor *t, int tensor,
                       int arg, tmap *out) {
  arena *a = b->a;
  out->tensor = tensor;
  out->ndims = t->ndims;
  out->nfactors = arena_alloc(a, sizeof(int) * (size_t)(t->ndims ? t->ndims : 1));
  out->factors = arena_alloc(a, sizeof(int *) * (size_t)(t->ndims ? t->ndims : 1));
  int td = 0;
  for (int i = 0; i < pat->ndims && td <= t->ndims; i++) {
    const opdim *d = &pat->dims[i];
    const gbind *gb = d->name ? bind_of(o, d->name) : NULL;
    if (d->mark == T_DOTDOT) {
      int n = gb ? gb->n : 0;
      for (int k = 0; k < n && td < t->ndims; k++, td++) {
        out->nfactors[td] = 1;
        out->factors[td] = arena_alloc(a, sizeof(int));
        out->factors[td][0] = idim_add(b, d->name, k, gb->sizes[k], gb->dim_names[k], 0);
      }
      continue;
    }
    if (td >= t->ndims) break;
    if (d->name) {
      out->nfactors[td] = 1;
      out->factors[td] = arena_alloc(a, sizeof(int));
      out->factors[td][0] = idim_add(b, d->name, 0, gb ? gb->sizes[0] : t->dims[td].size, t->dims[td].name, d->mark);
      td++;
      continue;
    }
    out->nfactors[td] = d->nfactors;
    out->factors[td] = arena_alloc(a, sizeof(int) * (size_t)(d->nfactors ? d->nfactors : 1));
    for (int k = 0; k < d->nfactors; k++) {
      const opfactor *f = &d->factors[k];
      if (f->name) {
        const gbind *fb = bind_of(o, f->name);
        out->factors[td][k] = idim_add(b, f->name, 0, fb ? fb->sizes[0] : 1, NULL, f->mark);
      } else {
        /* a literal factor is its own idim, never split: keyed by position */
        const char *sig = arena_printf(a, "%" PRId64 "@%d.%d.%d", f->value, arg, i, k);
        int id = idim_add(b, sig, 0, f->value, NULL, '^');
        out->factors[td][k] = id;
      }
    }
    td++;
  }
}

opspace *opspace_build(arena *a, const weft_graph *g, int op) {
  const gop *o = &g->ops[op];
  const opdecl *d = o->decl;
  spacebuf b = {a, NULL, 0, 0};
  opspace *s = arena_alloc(a, sizeof *s);
  s->ninputs = o->ninputs;
  s->inputs = arena_alloc(a, sizeof(tmap) * (size_t)(o->ninputs ? o->ninputs : 1));
  int k = 0;
  for (int i = 0; i < d->nargs; i++) {
    if (!d->args[i].tensor) continue;
    map_tensor(&b, o, &d->args[i].pat, &g->tensors[o->inputs[k]], o->inputs[k], k, &s->inputs[k]);
    k++;
  }
  map_tensor(&b, o, &d->result, &g->tensors[o->output], o->output, k, &s->output);
  s->nidims = b.n;
  s->idims = b.items;
  return s;
}

/* ---- regions ------------------------------------------------------------------ */

enum { REGION_MAX_INTERVALS = 1 << 16 };

/* The intervals of one tensor dimension whose factors have the ranges given. */
static void dregion_of(arena *a, int nf, const int *factors, const opspace *sp, const irange *range,
                       dregion *out) {
  int64_t sizes[16], lo[16], hi[16], idx[16];
  if (nf > 16) nf = 16;
  for (int i = 0; i < nf; i++) {
    sizes[i] = sp->idims[factors[i]].size;
    lo[i] = range[factors[i]].lo;
    hi[i] = range[factors[i]].hi;
    idx[i] = lo[i];
  }
  /* outer factors enumerate; the innermost gives one contiguous interval */
  int64_t count = 1;
  for (int i = 0; i < nf - 1; i++) count *= hi[i] - lo[i];
  if (count > REGION_MAX_INTERVALS) count = REGION_MAX_INTERVALS;
  out->iv = arena_alloc(a, sizeof(irange) * (size_t)(count ? count : 1));
  out->n = 0;
  int64_t inner = nf ? hi[nf - 1] - lo[nf - 1] : 1;
  for (int64_t c = 0; c < count; c++) {
    int64_t flat = 0;
    for (int i = 0; i < nf; i++) flat = flat * sizes[i] + (i == nf - 1 ? lo[i] : idx[i]);
    if (out->n && out->iv[out->n - 1].hi == flat) out->iv[out->n - 1].hi += inner;
    else out->iv[out->n++] = (irange){flat, flat + inner};
    for (int i = nf - 2; i >= 0; i--) {
      if (++idx[i] < hi[i]) break;
      idx[i] = lo[i];
    }
  }
}

void tregion_of(arena *a, const weft_plan *p, const psub *s, const tmap *m, tregion *out) {
  const opspace *sp = p->ops[s->op].space;
  out->ndims = m->ndims;
  out->dims = arena_alloc(a, sizeof(dregion) * (size_t)(m->ndims ? m->ndims : 1));
  for (int d = 0; d < m->ndims; d++) dregion_of(a, m->nfactors[d], m->factors[d], sp, s->range, &out->dims[d]);
}

static bool dregion_equal(const dregion *x, const dregion *y) {
  if (x->n != y->n) return false;
  for (int i = 0; i < x->n; i++)
    if (x->iv[i].lo != y->iv[i].lo || x->iv[i].hi != y->iv[i].hi) return false;
  return true;
}

bool tregion_equal(const tregion *x, const tregion *y) {
  if (x->ndims != y->ndims) return false;
  for (int d = 0; d < x->ndims; d++)
    if (!dregion_equal(&x->dims[d], &y->dims[d])) return false;
  return true;
}

static int64_t dregion_len(const dregion *r) {
  int64_t n = 0;
  for (int i = 0; i < r->n; i++) n += r->iv[i].hi - r->iv[i].lo;
  return n;
}

/* Intersection of two interval lists (both sorted and disjoint). */
static void dregion_intersect(arena *a, const dregion *x, const dregion *y, dregion *out) {
  out->iv = arena_alloc(a, sizeof(irange) * (size_t)(x->n + y->n + 1));
  out->n = 0;
  int i = 0, j = 0;
  while (i < x->n && j < y->n) {
    int64_t lo = x->iv[i].lo > y->iv[j].lo ? x->iv[i].lo : y->iv[j].lo;
    int64_t hi = x->iv[i].hi < y->iv[j].hi ? x->iv[i].hi : y->iv[j].hi;
    if (lo < hi) out->iv[out->n++] = (irange){lo, hi};
    if (x->iv[i].hi < y->iv[j].hi) i++;
    else j++;
  }
}

bool tregion_intersect(arena *a, const tregion *x, const tregion *y, tregion *out) {
  out->ndims = x->ndims;
  out->dims = arena_alloc(a, sizeof(dregion) * (size_t)(x->ndims ? x->ndims : 1));
  bool nonempty = true;
  for (int d = 0; d < x->ndims && d < y->ndims; d++) {
    dregion_intersect(a, &x->dims[d], &y->dims[d], &out->dims[d]);
    if (out->dims[d].n == 0) nonempty = false;
  }
  return nonempty;
}

/* Without making the intersection: the tests that only ask whether two
 * regions meet (which tasks touch a communication's region, whether parts
 * tile a whole) are many more than those that need it. */
static bool dregion_overlaps(const dregion *a, const dregion *b) {
  for (int i = 0, j = 0; i < a->n && j < b->n;) {
    int64_t lo = a->iv[i].lo > b->iv[j].lo ? a->iv[i].lo : b->iv[j].lo;
    int64_t hi = a->iv[i].hi < b->iv[j].hi ? a->iv[i].hi : b->iv[j].hi;
    if (lo < hi) return true;
    if (a->iv[i].hi < b->iv[j].hi) i++;
    else j++;
  }
  return false;
}

bool tregion_overlaps(const tregion *x, const tregion *y) {
  for (int d = 0; d < x->ndims && d < y->ndims; d++)
    if (!dregion_overlaps(&x->dims[d], &y->dims[d])) return false;
  return true;
}

int64_t tregion_numel(const tregion *r) {
  int64_t n = 1;
  for (int d = 0; d < r->ndims; d++) n *= dregion_len(&r->dims[d]);
  return n;
}

/* Whether every interval of inner lies inside the intervals of outer (both
 * sorted and disjoint, adjacent intervals merged). */
static bool dregion_contains(const dregion *outer, const dregion *inner) {
  int j = 0;
  for (int i = 0; i < inner->n; i++) {
    const irange *r = &inner->iv[i];
    if (r->lo >= r->hi) continue;
    while (j < outer->n && outer->iv[j].hi <= r->lo) j++;
    if (j >= outer->n || outer->iv[j].lo > r->lo || outer->iv[j].hi < r->hi) return false;
  }
  return true;
}

bool tregion_contains(const tregion *outer, const tregion *inner) {
  if (outer->ndims != inner->ndims) return false;
  for (int d = 0; d < inner->ndims; d++)
    if (!dregion_contains(&outer->dims[d], &inner->dims[d])) return false;
  return true;
}

const char *tregion_str(arena *a, const tregion *r) {
  char buf[512];
  size_t o = 0;
  buf[o++] = '[';
  for (int d = 0; d < r->ndims && o < sizeof buf - 64; d++) {
    if (d) o += (size_t)snprintf(buf + o, sizeof buf - o, ", ");
    const dregion *dr = &r->dims[d];
    if (dr->n == 0) o += (size_t)snprintf(buf + o, sizeof buf - o, "0:0");  /* empty: a ZeRO part of nothing */
    for (int i = 0; i < dr->n && o < sizeof buf - 64; i++) {
      if (i == 3 && dr->n > 4) {
        o += (size_t)snprintf(buf + o, sizeof buf - o, " ... (%d intervals)", dr->n);
        break;
      }
      o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%" PRId64 ":%" PRId64, i ? " " : "", dr->iv[i].lo,
                            dr->iv[i].hi);
    }
  }
  snprintf(buf + o, sizeof buf - o, "]");
  return arena_strdup(a, buf);
}
