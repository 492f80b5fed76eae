/* cx.c - the CUDA backend's host helpers (cx.h): regions, region moves and
 * the pool allocator its planning uses. */
#include "cx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft/value.h"

void *cx_alloc(size_t n) {
  void *p = calloc(n ? n : 1, 1);
  if (!p) {
    fprintf(stderr, "weft: error: out of memory\n");
    abort();
  }
  return p;
}

void *cx_grow(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) {
    fprintf(stderr, "weft: error: out of memory\n");
    abort();
  }
  return q;
}

/* ---- regions ---------------------------------------------------------------------- */

int64_t cx_dlen(const dregion *d) {
  int64_t n = 0;
  for (int i = 0; i < d->n; i++) n += d->iv[i].hi - d->iv[i].lo;
  return n;
}

int64_t cx_numel(const tregion *r) {
  int64_t n = 1;
  for (int d = 0; d < r->ndims; d++) n *= cx_dlen(&r->dims[d]);
  return n;
}

bool cx_equal(const tregion *a, const tregion *b) {
  if (a->ndims != b->ndims) return false;
  for (int d = 0; d < a->ndims; d++) {
    if (a->dims[d].n != b->dims[d].n) return false;
    for (int i = 0; i < a->dims[d].n; i++)
      if (a->dims[d].iv[i].lo != b->dims[d].iv[i].lo || a->dims[d].iv[i].hi != b->dims[d].iv[i].hi) return false;
  }
  return true;
}

int64_t cx_tensor_numel(const gtensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndims; d++) n *= t->dims[d].size;
  return n;
}

tregion cx_whole(const gtensor *t, dregion *dims, irange *iv) {
  for (int d = 0; d < t->ndims; d++) {
    iv[d].lo = 0;
    iv[d].hi = t->dims[d].size;
    dims[d].n = 1;
    dims[d].iv = &iv[d];
  }
  return (tregion){t->ndims, dims};
}

bool cx_intersect(const tregion *a, const tregion *b, tregion *out) {
  out->ndims = a->ndims;
  out->dims = cx_alloc(sizeof(dregion) * (size_t)(a->ndims + 1));
  bool any = true;
  for (int d = 0; d < a->ndims; d++) {
    const dregion *x = &a->dims[d], *y = &b->dims[d];
    irange *iv = cx_alloc(sizeof(irange) * (size_t)(x->n + y->n + 1));
    int n = 0;
    for (int i = 0, j = 0; i < x->n && j < y->n;) {
      int64_t lo = x->iv[i].lo > y->iv[j].lo ? x->iv[i].lo : y->iv[j].lo;
      int64_t hi = x->iv[i].hi < y->iv[j].hi ? x->iv[i].hi : y->iv[j].hi;
      if (lo < hi) iv[n++] = (irange){lo, hi};
      if (x->iv[i].hi < y->iv[j].hi) i++;
      else j++;
    }
    out->dims[d].n = n;
    out->dims[d].iv = iv;
    if (n == 0) any = false;
  }
  return any;
}

void cx_region_free(tregion *r) {
  for (int d = 0; r->dims && d < r->ndims; d++) free(r->dims[d].iv);
  free(r->dims);
  r->dims = NULL;
}

double cx_attr(const weft_graph *g, int op, const char *name, double dflt) {
  return graph_op_attr(g, op, name, dflt);
}

/* ---- region moves ------------------------------------------------------------------- */

/* Positions of r's indices of one dimension in the packed dimension of its
 * holder; -1 where the holder lacks one. */
static void positions(const dregion *holder, const dregion *r, int64_t *out) {
  int64_t k = 0, base = 0;
  int h = 0;
  for (int i = 0; i < r->n; i++)
    for (int64_t x = r->iv[i].lo; x < r->iv[i].hi; x++) {
      while (h < holder->n && holder->iv[h].hi <= x) base += holder->iv[h].hi - holder->iv[h].lo, h++;
      out[k++] = h < holder->n && x >= holder->iv[h].lo ? base + (x - holder->iv[h].lo) : -1;
    }
}

static int64_t push_table(cx_tables *t, const int64_t *pos, int64_t n) {
  if (t->n + n > t->cap) {
    while (t->n + n > t->cap) t->cap = t->cap ? 2 * t->cap : 1024;
    t->v = cx_grow(t->v, (size_t)t->cap * sizeof(int32_t));
  }
  int64_t at = t->n;
  for (int64_t i = 0; i < n; i++) t->v[at + i] = (int32_t)pos[i];
  t->n += n;
  return at;
}

/* One side of a dimension: base + i, or a table. */
typedef struct side_dim {
  int64_t stride, base, tab;  /* tab -1: none */
  int64_t extent;             /* the holder's extent in this dimension */
} side_dim;

bool cx_move_build(cx_move *mv, cx_tables *t, const tregion *r, const tregion *src, const tregion *dst, char *err,
                   size_t errlen) {
  memset(mv, 0, sizeof *mv);
  int nd = r->ndims;
  if (src->ndims != nd || dst->ndims != nd) {
    snprintf(err, errlen, "a region of %d dimensions moved between holders of %d and %d", nd, src->ndims, dst->ndims);
    return false;
  }
  if (nd > GPU_MAX_DIMS) {
    snprintf(err, errlen, "a region of %d dimensions (at most %d)", nd, GPU_MAX_DIMS);
    return false;
  }
  int64_t len[GPU_MAX_DIMS];
  side_dim sd[2][GPU_MAX_DIMS];
  const tregion *hold[2] = {src, dst};
  int64_t total = 1;
  for (int d = 0; d < nd; d++) total *= len[d] = cx_dlen(&r->dims[d]);
  for (int s = 0; s < 2; s++) {
    int64_t stride = 1;
    for (int d = nd - 1; d >= 0; d--) {
      side_dim *x = &sd[s][d];
      x->extent = cx_dlen(&hold[s]->dims[d]);
      x->stride = stride;
      stride *= x->extent;
      x->tab = -1;
      x->base = 0;
      if (len[d] == 0) continue;
      int64_t *pos = cx_alloc(sizeof(int64_t) * (size_t)len[d]);
      positions(&hold[s]->dims[d], &r->dims[d], pos);
      bool run = true;
      for (int64_t i = 0; i < len[d]; i++) {
        if (pos[i] < 0) {
          free(pos);
          snprintf(err, errlen, "a region outside the buffer it is moved %s", s ? "to" : "from");
          return false;
        }
        if (pos[i] != pos[0] + i) run = false;
      }
      if (!run && x->extent > INT32_MAX) {
        free(pos);
        snprintf(err, errlen, "a strided dimension of %lld elements (at most 2^31)", (long long)x->extent);
        return false;
      }
      if (run) x->base = pos[0];
      else x->tab = push_table(t, pos, len[d]);
      free(pos);
    }
  }
  /* merge an inner dimension into the one outside it when, on both sides,
   * neither has a table and the inner one is whole in its holder */
  int m = 0;
  int64_t ml[GPU_MAX_DIMS];
  side_dim ms[2][GPU_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    bool merge = m > 0;
    for (int s = 0; s < 2 && merge; s++) {
      const side_dim *o = &ms[s][m - 1], *in = &sd[s][d];
      merge = o->tab < 0 && in->tab < 0 && in->base == 0 && len[d] == in->extent;
    }
    if (merge) {
      for (int s = 0; s < 2; s++) {
        side_dim *o = &ms[s][m - 1];
        o->base = o->base * len[d];
        o->stride = sd[s][d].stride;
        o->extent = o->extent * sd[s][d].extent;
      }
      ml[m - 1] *= len[d];
    } else {
      for (int s = 0; s < 2; s++) ms[s][m] = sd[s][d];
      ml[m++] = len[d];
    }
  }
  if (m == 0) ml[m] = 1, ms[0][m] = ms[1][m] = (side_dim){1, 0, -1, 1}, m = 1;
  mv->m.nd = m;
  mv->m.total = total;
  for (int d = 0; d < m; d++) {
    mv->m.len[d] = ml[d];
    mv->m.src.stride[d] = ms[0][d].stride, mv->m.src.base[d] = ms[0][d].base, mv->tab[0][d] = ms[0][d].tab;
    mv->m.dst.stride[d] = ms[1][d].stride, mv->m.dst.base[d] = ms[1][d].base, mv->tab[1][d] = ms[1][d].tab;
  }
  for (int d = m; d < GPU_MAX_DIMS; d++) mv->tab[0][d] = mv->tab[1][d] = -1;
  mv->m.contiguous = m == 1 && mv->tab[0][0] < 0 && mv->tab[1][0] < 0 && mv->m.src.base[0] == 0 &&
                     mv->m.dst.base[0] == 0 && mv->m.src.stride[0] == 1 && mv->m.dst.stride[0] == 1;
  return true;
}

gpu_rmove cx_move_at(const cx_move *mv, const int32_t *tables) {
  gpu_rmove m = mv->m;
  for (int d = 0; d < m.nd; d++) {
    m.src.table[d] = mv->tab[0][d] >= 0 ? tables + mv->tab[0][d] : NULL;
    m.dst.table[d] = mv->tab[1][d] >= 0 ? tables + mv->tab[1][d] : NULL;
  }
  return m;
}

static int64_t host_offset(const gpu_side *sd, const gpu_rmove *m, int64_t e) {
  int64_t off = 0;
  for (int d = m->nd - 1; d >= 0; d--) {
    int64_t i = e % m->len[d];
    e /= m->len[d];
    off += (sd->table[d] ? (int64_t)sd->table[d][i] : sd->base[d] + i) * sd->stride[d];
  }
  return off;
}

void cx_move_host(float *dst, const float *src, const cx_move *mv, const cx_tables *t, bool add) {
  gpu_rmove m = cx_move_at(mv, t->v);
  if (m.total == 0) return;
  /* rows of the innermost dimension: a run on both sides unless strided */
  int in = m.nd - 1;
  int64_t len = m.len[in];
  bool run = !m.src.table[in] && !m.dst.table[in] && m.src.stride[in] == 1 && m.dst.stride[in] == 1;
  for (int64_t row = 0; row < m.total / len; row++) {
    int64_t e = row * len;
    int64_t os = m.contiguous ? e : host_offset(&m.src, &m, e);
    int64_t od = m.contiguous ? e : host_offset(&m.dst, &m, e);
    if (run && !add) {
      memcpy(&dst[od], &src[os], (size_t)len * 4);
      continue;
    }
    for (int64_t i = 0; i < len; i++) {
      int64_t a = run ? os + i : host_offset(&m.src, &m, e + i), b = run ? od + i : host_offset(&m.dst, &m, e + i);
      if (add) dst[b] += src[a];
      else memcpy(&dst[b], &src[a], 4);
    }
  }
}

/* ---- the pool allocator ---------------------------------------------------------------- */

void cx_pool_init(cx_pool *p, int64_t base) {
  memset(p, 0, sizeof *p);
  p->base = base;
  p->top = 0;
}

void cx_pool_free_all(cx_pool *p) {
  for (int i = 0; i < p->nfr; i++) free(p->fr[i].ev);
  free(p->fr);
  memset(p, 0, sizeof *p);
}

static void add_events(int **ev, int *nev, int *cap, const int *add, int nadd) {
  for (int i = 0; i < nadd; i++) {
    bool seen = false;
    for (int j = 0; j < *nev && !seen; j++) seen = (*ev)[j] == add[i];
    if (seen) continue;
    if (*nev == *cap) {
      *cap = *cap ? 2 * *cap : 8;
      *ev = cx_grow(*ev, sizeof(int) * (size_t)*cap);
    }
    (*ev)[(*nev)++] = add[i];
  }
}

static void insert_free(cx_pool *p, int at, int64_t lo, int64_t hi, const int *ev, int nev) {
  if (p->nfr == p->cap) {
    p->cap = p->cap ? 2 * p->cap : 16;
    p->fr = cx_grow(p->fr, sizeof(cx_free) * (size_t)p->cap);
  }
  memmove(&p->fr[at + 1], &p->fr[at], sizeof(cx_free) * (size_t)(p->nfr - at));
  p->nfr++;
  cx_free *f = &p->fr[at];
  memset(f, 0, sizeof *f);
  f->lo = lo, f->hi = hi;
  add_events(&f->ev, &f->nev, &f->cap, ev, nev);
}

static void remove_free(cx_pool *p, int at) {
  free(p->fr[at].ev);
  memmove(&p->fr[at], &p->fr[at + 1], sizeof(cx_free) * (size_t)(p->nfr - at - 1));
  p->nfr--;
}

int64_t cx_pool_alloc(cx_pool *p, int64_t bytes, int **ev, int *nev, int *cap) {
  int64_t need = (bytes + CX_ALIGN - 1) / CX_ALIGN * CX_ALIGN;
  if (need == 0) need = CX_ALIGN;
  for (int i = 0; i < p->nfr; i++) {
    cx_free *f = &p->fr[i];
    bool last = f->hi == p->top;
    if (f->hi - f->lo < need && !last) continue;
    int64_t at = f->lo;
    add_events(ev, nev, cap, f->ev, f->nev);
    if (f->hi - f->lo > need) {
      f->lo += need;  /* the rest keeps its events */
    } else {
      if (at + need > p->top) p->top = at + need;
      remove_free(p, i);
    }
    return p->base + at;
  }
  int64_t at = p->top;
  p->top += need;
  return p->base + at;
}

void cx_pool_release(cx_pool *p, int64_t off, int64_t bytes, const int *ev, int nev) {
  int64_t lo = off - p->base, need = (bytes + CX_ALIGN - 1) / CX_ALIGN * CX_ALIGN;
  if (need == 0) need = CX_ALIGN;
  int64_t hi = lo + need;
  int at = 0;
  while (at < p->nfr && p->fr[at].lo < lo) at++;
  insert_free(p, at, lo, hi, ev, nev);
  /* merge with the neighbours; the events of both guard the whole */
  if (at + 1 < p->nfr && p->fr[at].hi == p->fr[at + 1].lo) {
    cx_free *a = &p->fr[at], *b = &p->fr[at + 1];
    add_events(&a->ev, &a->nev, &a->cap, b->ev, b->nev);
    a->hi = b->hi;
    remove_free(p, at + 1);
  }
  if (at > 0 && p->fr[at - 1].hi == p->fr[at].lo) {
    cx_free *a = &p->fr[at - 1], *b = &p->fr[at];
    add_events(&a->ev, &a->nev, &a->cap, b->ev, b->nev);
    a->hi = b->hi;
    remove_free(p, at);
  }
}
