/* works.c - what each compute, copy and step instruction computes and
 * moves, without the hardware, kept once for all instructions that do the
 * same (lower.h, lwork); the cost model prices each work once.
 *
 * The cost of a compute is a function of its operator, the sizes of the
 * ranges its sub-operator covers (its FLOPs and shapes follow from them),
 * its direction, the gradients it writes and the bytes of the regions it
 * reads and writes; of a copy or a step, of the bytes it moves. That much
 * is a work; instructions that do the same work (the parts of a split,
 * every micro-batch, every layer) share one. GPT-3 on 1024 devices: 1.5
 * million computes, a few thousand works. */
#include <string.h>

#include "base/htab.h"
#include "base/vec.h"
#include "lower/works.h"

static double ref_bytes(const weft_program *pr, const lref *r) {
  if (r->buf < 0) return 0;
  const lbuf *b = &pr->bufs[r->buf];
  return (double)tregion_numel(&r->region) * dtype_bytes[b->dtype] * (b->copies > 0 ? b->copies : 1);
}

lwork lower_work_measure(const weft_program *pr, const lins *ins) {
  lwork w = {.kind = ins->kind, .sub = -1, .bwd = ins->dir == DIR_BACKWARD};
  double in = 0, out = 0;
  for (int i = 0; i < ins->nin; i++) in += ref_bytes(pr, &ins->in[i]);
  switch (ins->kind) {
  case LI_COMPUTE:
    w.sub = ins->sub;
    for (int i = 0; i < ins->nout; i++) {
      const lref *r = &ins->out[i];
      out += ref_bytes(pr, r) * (r->buf >= 0 && ins->accumulate ? 2 : 1);
      if (r->buf >= 0 && r->arg == 0) w.grad0 = true;
      if (r->buf >= 0 && r->arg == 1) w.grad1 = true;
    }
    w.bytes = in + out;
    break;
  case LI_COPY:
    /* every piece read and written once */
    w.bytes = 2 * in;
    w.kernels = ins->nin;
    break;
  case LI_STEP:
    /* reads the gradient, reads and writes the parameter and the state */
    for (int i = 0; i < ins->nout; i++) out += ref_bytes(pr, &ins->out[i]);
    w.bytes = in + 2 * out;
    w.kernels = 1;
    break;
  default: break;
  }
  return w;
}

/* The shape of a compute that decides its work: class, direction,
 * accumulation and which arguments it reads and writes. The regions, and
 * so the bytes, follow from the class (docs/program.md), so an instruction
 * whose pattern is known is not measured again. */
typedef struct wpattern {
  int cls;
  int dir_acc;            /* backward: 2, plus accumulate: 1 */
  int nin, nout;
  uint64_t inmask;        /* the inputs it reads (buf >= 0), by position */
  uint64_t outargs;       /* what it writes: the gradients of arguments (bit k), its result (bit 63) */
} wpattern;

struct lower_works {
  VEC(lwork) all;
  htab works;
  /* classes of sub-operators: those of one operator with equal sizes */
  int *cls;               /* per sub */
  int nsubs;
  VEC(int) crep;          /* per class: its first sub */
  htab classes;
  VEC(wpattern) pat;
  VEC(int) pwork;         /* per pattern: its work */
  htab patterns;
};

static uint64_t mix64(uint64_t h) {
  h ^= h >> 31;
  h *= 0x7FB5D329728EA185ull;
  h ^= h >> 27;
  h *= 0x81DADEF4BC2DD44Dull;
  h ^= h >> 33;
  return h;
}

static bool same_sizes(const weft_plan *p, int x, int y) {
  const psub *a = &p->subs[x], *b = &p->subs[y];
  if (a->op != b->op) return false;
  const opspace *sp = p->ops[a->op].space;
  for (int i = 0; i < sp->nidims; i++)
    if (a->range[i].hi - a->range[i].lo != b->range[i].hi - b->range[i].lo) return false;
  return true;
}

static uint64_t sizes_hash(const weft_plan *p, int sub) {
  const psub *s = &p->subs[sub];
  uint64_t h = mix64((uint64_t)(uint32_t)s->op + 1);
  const opspace *sp = p->ops[s->op].space;
  for (int i = 0; i < sp->nidims; i++) h = mix64(h ^ (uint64_t)(s->range[i].hi - s->range[i].lo));
  return h;
}

typedef struct class_key {
  const lower_works *ws;
  const weft_plan *p;
  int sub;
} class_key;

static bool same_class(const void *ctx, int c) {
  const class_key *k = ctx;
  return same_sizes(k->p, k->ws->crep.v[c], k->sub);
}

static int find_class(lower_works *ws, const weft_plan *p, int sub) {
  uint64_t h = sizes_hash(p, sub);
  class_key k = {ws, p, sub};
  int c = htab_find(&ws->classes, h, same_class, &k);
  if (c >= 0) return c;
  vec_push(NULL, &ws->crep, sub);
  return htab_add(&ws->classes, h);
}

/* The class of sub-operator sub. Those of all are found at the first call,
 * in the order the sub-operators lie in memory. */
static int class_of(lower_works *ws, const weft_plan *p, int sub) {
  if (ws->nsubs != p->nsubs) {
    free(ws->cls);
    ws->nsubs = p->nsubs;
    ws->cls = malloc(sizeof(int) * (size_t)(ws->nsubs ? ws->nsubs : 1));
    if (!ws->cls) weft_oom();
    /* neighbours are often of one class (the parts of a split) */
    for (int i = 0; i < ws->nsubs; i++)
      ws->cls[i] = i > 0 && same_sizes(p, i - 1, i) ? ws->cls[i - 1] : find_class(ws, p, i);
  }
  return ws->cls[sub];
}

/* A work's class is in w->sub while it is looked up: the sub-operator
 * that stands for the class goes in when the works are kept. */
static uint64_t work_hash(const lwork *w) {
  uint64_t bits;
  memcpy(&bits, &w->bytes, sizeof bits);
  uint64_t h = mix64(((uint64_t)w->kind << 3 | (uint64_t)w->bwd << 2 | (uint64_t)w->grad0 << 1 | (uint64_t)w->grad1) ^
                     (uint64_t)(uint32_t)w->sub << 8 ^ (uint64_t)(uint32_t)w->kernels << 40);
  return mix64(h ^ bits);
}

typedef struct work_key {
  const lower_works *ws;
  const lwork *w;
} work_key;

static bool same_work(const void *ctx, int e) {
  const work_key *k = ctx;
  const lwork *x = &k->ws->all.v[e], *y = k->w;
  return x->kind == y->kind && x->bwd == y->bwd && x->grad0 == y->grad0 && x->grad1 == y->grad1 &&
         x->bytes == y->bytes && x->kernels == y->kernels && x->sub == y->sub;
}

lower_works *lower_works_new(void) {
  lower_works *w = calloc(1, sizeof *w);
  if (!w) weft_oom();
  return w;
}

void lower_works_free(lower_works *w) {
  if (!w) return;
  vec_free(&w->all);
  htab_free(&w->works);
  free(w->cls);
  vec_free(&w->crep);
  htab_free(&w->classes);
  vec_free(&w->pat);
  vec_free(&w->pwork);
  htab_free(&w->patterns);
  free(w);
}

lower_works *lower_works_keep(arena *a, lower_works *w) {
  lower_works *k = arena_alloc(a, sizeof *k);
  int n = w->all.n;
  k->all.n = k->all.cap = n;
  k->all.v = arena_alloc(a, sizeof(lwork) * (size_t)(n ? n : 1));
  if (n) memcpy(k->all.v, w->all.v, sizeof(lwork) * (size_t)n);
  /* each work names the first sub-operator of its class */
  for (int i = 0; i < n; i++)
    if (k->all.v[i].sub >= 0) k->all.v[i].sub = w->crep.v[k->all.v[i].sub];
  lower_works_free(w);
  return k;
}

int lower_works_count(const lower_works *w) { return w ? w->all.n : 0; }

const lwork *lower_work_get(const lower_works *w, int id) { return &w->all.v[id]; }

/* The pattern of a compute; false when it has none (more than 63 arguments). */
static bool pattern_of(lower_works *ws, const weft_program *pr, const lins *ins, wpattern *k) {
  if (ins->kind != LI_COMPUTE || ins->nin > 64 || ins->nout > 64) return false;
  memset(k, 0, sizeof *k);
  k->cls = class_of(ws, pr->p, ins->sub);
  k->dir_acc = (ins->dir == DIR_BACKWARD ? 2 : 0) | (ins->accumulate ? 1 : 0);
  k->nin = ins->nin;
  k->nout = ins->nout;
  for (int i = 0; i < ins->nin; i++)
    if (ins->in[i].buf >= 0) k->inmask |= 1ull << i;
  for (int i = 0; i < ins->nout; i++) {
    if (ins->out[i].buf < 0) continue;
    int a = ins->out[i].arg;   /* -1: the result */
    if (a >= 63) return false;
    k->outargs |= 1ull << (a < 0 ? 63 : a);
  }
  return true;
}

static uint64_t pattern_hash(const wpattern *k) {
  return mix64(mix64((uint64_t)(uint32_t)k->cls << 8 ^ (uint64_t)k->dir_acc ^ (uint64_t)(uint32_t)k->nin << 40 ^
                     (uint64_t)(uint32_t)k->nout << 52) ^
               mix64(k->inmask) ^ k->outargs);
}

typedef struct pattern_key {
  const lower_works *ws;
  const wpattern *k;
} pattern_key;

static bool same_pattern(const void *ctx, int e) {
  const pattern_key *pk = ctx;
  const wpattern *x = &pk->ws->pat.v[e], *y = pk->k;
  return x->cls == y->cls && x->dir_acc == y->dir_acc && x->nin == y->nin && x->nout == y->nout &&
         x->inmask == y->inmask && x->outargs == y->outargs;
}

/* The work of ins, measured, among the works. */
static int intern_work(lower_works *ws, const weft_program *pr, const lins *ins) {
  lwork w = lower_work_measure(pr, ins);
  if (w.sub >= 0) w.sub = class_of(ws, pr->p, w.sub);
  uint64_t h = work_hash(&w);
  work_key k = {ws, &w};
  int e = htab_find(&ws->works, h, same_work, &k);
  if (e >= 0) return e;
  vec_push(NULL, &ws->all, w);
  return htab_add(&ws->works, h);
}

int lower_work_of(lower_works *ws, const weft_program *pr, const lins *ins) {
  if (ins->kind != LI_COMPUTE && ins->kind != LI_COPY && ins->kind != LI_STEP) return -1;
  wpattern k;
  if (!pattern_of(ws, pr, ins, &k)) return intern_work(ws, pr, ins);
  uint64_t h = pattern_hash(&k);
  pattern_key pk = {ws, &k};
  int e = htab_find(&ws->patterns, h, same_pattern, &pk);
  if (e >= 0) return ws->pwork.v[e];
  int work = intern_work(ws, pr, ins);
  vec_push(NULL, &ws->pat, k);
  vec_push(NULL, &ws->pwork, work);
  htab_add(&ws->patterns, h);
  return work;
}
