/* emit.c - a searched candidate as a decision list, the same primitives a
 * written plan evaluates to, and as weft source a person can read and
 * edit: operators grouped by the selectors a person would write (h.*.mlp.c_fc
 * for a block's operator in every layer), stages as h[0..6] ranges. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "search_int.h"

/* A growing selector: "{a, b, c}", or "a" alone. */
typedef struct selbuf {
  char *text;
  int n;
} selbuf;

static void sel_add(arena *a, selbuf *s, const char *item) {
  for (const char *p = s->text; p && (p = strstr(p, item)); p++) {
    /* the same item already there (whole, between separators) */
    size_t len = strlen(item);
    bool start = p == s->text || p[-1] == ' ' || p[-1] == '{';
    bool end = p[len] == 0 || p[len] == ',' || p[len] == '}';
    if (start && end) return;
  }
  s->text = s->n ? arena_printf(a, "%s, %s", s->text, item) : arena_strdup(a, item);
  s->n++;
}

static const char *sel_text(arena *a, const selbuf *s) {
  return s->n > 1 ? arena_printf(a, "{%s}", s->text) : s->n ? s->text : "all";
}

/* How a person selects op in every block: "h.*.attn.c_attn"; an operator
 * outside the blocks by its name. */
static const char *op_pattern(arena *a, const sshape *s, int op) {
  const char *name = s->g->ops[op].name;
  if (s->layers == 0 || op < s->head_end || op >= s->tail_start) return name;
  size_t pl = strlen(s->block_name);
  const char *rest = strchr(name + pl + 1, '.');
  return rest ? arena_printf(a, "%s.*%s", s->block_name, rest) : arena_printf(a, "%s.*", s->block_name);
}

typedef struct emitter {
  arena *a;
  const sshape *s;
  const search_fixed *f;  /* what the plan writes beside `search`, or NULL */
  search_plan *sp;
  int cap;
} emitter;

/* Whether the plan writes it (the search does not, then). */
static bool written_mesh(const emitter *E) { return E->f && E->f->mesh >= 0; }
static bool written_schedule(const emitter *E) { return E->f && E->f->schedule >= 0; }
static bool written_zero(const emitter *E) { return E->f && E->f->zero >= 0; }
static bool written_micro_batches(const emitter *E) { return E->f && E->f->micro_batches >= 0; }

static decision *add(emitter *E, dec_kind k, const char *sel) {
  decision *d = dec_add(E->a, &E->sp->decisions, k);
  arena_grow(E->a, (void **)&E->sp->selectors, &E->cap, E->sp->decisions.n, sizeof(char *));
  E->sp->selectors[E->sp->decisions.n - 1] = sel;
  return d;
}

static dec_ops all_ops(emitter *E) {
  dec_ops o = {E->s->g->nops, arena_alloc(E->a, sizeof(int) * (size_t)(E->s->g->nops ? E->s->g->nops : 1))};
  for (int i = 0; i < o.n; i++) o.ops[i] = i;
  return o;
}

/* The operators of layers [l0, l1) and, when asked, the head or the tail. */
static void stage_ops(emitter *E, int l0, int l1, bool head, bool tail, dec_ops *ops, selbuf *sel) {
  const sshape *s = E->s;
  const weft_graph *g = s->g;
  ops->ops = arena_alloc(E->a, sizeof(int) * (size_t)(g->nops ? g->nops : 1));
  ops->n = 0;
  if (head)
    for (int op = 0; op < s->head_end; op++) {
      ops->ops[ops->n++] = op;
      sel_add(E->a, sel, g->ops[op].name);
    }
  if (s->layers > 0 && l1 > l0) {
    for (int op = s->block_start[l0]; op < s->block_start[l1]; op++) ops->ops[ops->n++] = op;
    sel_add(E->a, sel, l1 - l0 == 1 ? arena_printf(E->a, "%s.%d", s->block_name, l0)
                                    : arena_printf(E->a, "%s[%d..%d]", s->block_name, l0, l1));
  }
  if (tail)
    for (int op = s->tail_start; op < g->nops; op++) {
      ops->ops[ops->n++] = op;
      sel_add(E->a, sel, g->ops[op].name);
    }
}

/* The batch over the data-parallel replicas and into micro-batches. */
static void batch_splits(emitter *E) {
  search_plan *sp = E->sp;
  if (sp->dp > 1) {
    decision *d = add(E, DEC_SPLIT, "all");
    d->ops = all_ops(E);
    d->name = E->s->batch;
    d->parts = sp->dp;
    d->axis = "dp";
  }
  if (sp->micro_batches > 1 && !written_micro_batches(E)) {
    decision *d = add(E, DEC_SPLIT, "all");
    d->ops = all_ops(E);
    d->name = E->s->batch;
    d->parts = sp->micro_batches;
    d->axis = "mb";
    d->in_time = true;
  }
}

/* Recomputation and buckets, as every plan writes them. */
static void emit_tail(emitter *E) {
  arena *a = E->a;
  const sshape *s = E->s;
  const weft_graph *g = s->g;
  search_plan *sp = E->sp;
  /* recomputation of the blocks: each layer as one segment (full), or
   * their attention kernels (selective); a layer takes its stage's */
  if (s->layers > 0 && !(E->f && E->f->recompute >= 0)) {
    int *lmode = arena_alloc(a, sizeof(int) * (size_t)s->layers);
    bool mixed = false;
    for (int l = 0; l < s->layers; l++) {
      lmode[l] = sp->recompute;
      for (int k = 0; k < sp->nstages; k++)
        if (sp->stages[k].first_op <= s->block_start[l] && s->block_start[l] <= sp->stages[k].last_op)
          lmode[l] = sp->stages[k].recompute;
      mixed |= lmode[l] != lmode[0];
    }
    for (int mode = 1; mode <= 2; mode++) {
      selbuf sel = {0};
      dec_ops ops = {0, arena_alloc(a, sizeof(int) * (size_t)g->nops)};
      const char **keys = arena_alloc(a, sizeof(char *) * (size_t)g->nops);
      for (int l = 0; l < s->layers; l++) {
        if (lmode[l] != mode) continue;
        /* full, where layers differ: h[l..e) for each run of its layers */
        if (mixed && mode == 2 && (l == 0 || lmode[l - 1] != mode)) {
          int e = l;
          while (e < s->layers && lmode[e] == mode) e++;
          sel_add(a, &sel, e - l == 1 ? arena_printf(a, "%s.%d", s->block_name, l)
                                      : arena_printf(a, "%s[%d..%d]", s->block_name, l, e));
        }
        for (int op = s->block_start[l]; op < s->block_start[l + 1]; op++) {
          const char *kind = g->ops[op].kind;
          bool att = kind && strcmp(kind, "attention") == 0;
          if (mode == 1 && !att) continue;
          ops.ops[ops.n] = op;
          keys[ops.n++] = mode == 2 ? arena_printf(a, "%s.%d", s->block_name, l) : g->ops[op].name;
          if (!mixed) sel_add(a, &sel, mode == 2 ? arena_printf(a, "%s.*", s->block_name) : op_pattern(a, s, op));
          else if (mode == 1) sel_add(a, &sel, g->ops[op].name);
        }
      }
      if (ops.n) {
        decision *d = add(E, DEC_RECOMPUTE, sel_text(a, &sel));
        d->ops = ops;
        d->keys = keys;
        d->mode = mode;
      }
    }
  }
  if (E->f && E->f->buckets >= 0) sp->bucket_bytes = E->f->buckets;
  else if (sp->bucket_bytes != PLAN_DEFAULT_BUCKET) {
    decision *d = add(E, DEC_BUCKETS, NULL);
    d->bytes = sp->bucket_bytes;
  }
}

/* A pipeline whose stages have meshes of their own shapes: a mesh per
 * stage ([dp, tp] on its own devices), the stages named first so that the
 * splits may select them, the micro-batches cut before each stage's
 * data-parallel split (micro-batch k is the same rows in every stage),
 * each stage's tensor-parallel splits over its own operators. */
static void emit_nonuniform(emitter *E) {
  search_plan *sp = E->sp;
  const sshape *s = E->s;
  const weft_graph *g = s->g;
  arena *a = E->a;
  static const char *const axes[] = {"dp", "tp"};
  int first = 0;
  for (int k = 0; k < sp->nstages; k++) {
    const search_stage *st = &sp->stages[k];
    int sizes[2] = {st->dp, st->tp};
    dec_mesh(a, &sp->decisions, arena_printf(a, "m%d", k), 2, axes, sizes, first);
    arena_grow(a, (void **)&sp->selectors, &E->cap, sp->decisions.n, sizeof(char *));
    sp->selectors[sp->decisions.n - 1] = NULL;
    first += st->dp * st->tp;
  }
  dec_ops *stage_of = arena_alloc(a, sizeof(dec_ops) * (size_t)sp->nstages);
  for (int k = 0; k < sp->nstages; k++) {
    const search_stage *st = &sp->stages[k];
    selbuf sel = {0};
    int l0 = 0, l1 = 0;
    for (int l = 0; l < s->layers; l++) {
      if (s->block_start[l] < st->first_op) l0 = l + 1;
      if (s->block_start[l] <= st->last_op) l1 = l + 1;
    }
    stage_ops(E, l0, l1, st->first_op == 0, st->last_op == g->nops - 1, &stage_of[k], &sel);
    decision *d = add(E, DEC_STAGE, sel_text(a, &sel));
    d->name = arena_printf(a, "s%d", k);
    d->ops = stage_of[k];
  }
  if (sp->micro_batches > 1 && !written_micro_batches(E)) {
    decision *d = add(E, DEC_SPLIT, "all");
    d->ops = all_ops(E);
    d->name = s->batch;
    d->parts = sp->micro_batches;
    d->axis = "mb";
    d->in_time = true;
  }
  for (int k = 0; k < sp->nstages; k++) {
    const search_stage *st = &sp->stages[k];
    if (st->dp > 1) {
      decision *d = add(E, DEC_SPLIT, arena_printf(a, "s%d", k));
      d->ops = stage_of[k];
      d->name = s->batch;
      d->parts = st->dp;
      d->axis = "dp";
    }
    if (st->tp < 2) continue;
    /* one statement per dimension, splits first, replication last */
    for (int pass = 0; pass < 2; pass++)
      for (int i = 0; i < stage_of[k].n; i++) {
        int op0 = stage_of[k].ops[i];
        const char *dim = sp->op_split[op0];
        bool rep = dim[0] == 0, seen = false;
        if (rep != (pass == 1)) continue;
        for (int q = 0; q < i && !seen; q++) seen = strcmp(sp->op_split[stage_of[k].ops[q]], dim) == 0;
        if (seen) continue;
        selbuf sel = {0};
        dec_ops ops = {0, arena_alloc(a, sizeof(int) * (size_t)stage_of[k].n)};
        for (int q = i; q < stage_of[k].n; q++) {
          int op = stage_of[k].ops[q];
          if (strcmp(sp->op_split[op], dim) != 0) continue;
          ops.ops[ops.n++] = op;
          sel_add(a, &sel, g->ops[op].name);
        }
        decision *d = add(E, rep ? DEC_REPLICATE : DEC_SPLIT, sel_text(a, &sel));
        d->ops = ops;
        d->name = rep ? NULL : dim;
        d->parts = st->tp;
        d->axis = "tp";
      }
  }
  for (int z = 1; z <= sp->zero && !written_zero(E); z++) {
    decision *d = add(E, DEC_SHARD, "all");
    d->ops = all_ops(E);
    d->state = z;
    d->axis = "dp";
  }
  for (int k = 0; k < sp->nstages; k++) {
    const search_stage *st = &sp->stages[k];
    decision *d = add(E, DEC_ASSIGN, arena_printf(a, "s%d", k));
    d->ops = stage_of[k];
    d->mesh = k;
    d->nidx = 2;
    d->idx = arena_alloc(a, sizeof(dec_index) * 2);
    d->idx[0] = (dec_index){st->dp > 1 ? "dp" : NULL, 0};
    d->idx[1] = (dec_index){st->tp > 1 ? "tp" : NULL, 0};
  }
  if (written_schedule(E)) return;
  decision *d = add(E, DEC_SCHEDULE, NULL);
  d->sched = sp->schedule;
}

/* Decisions [from, to) of the plan's written ones, as they are. */
static void copy_written(emitter *E, int from, int to) {
  for (int i = from; i < to; i++) {
    decision *d = dec_add(E->a, &E->sp->decisions, E->f->written->items[i].kind);
    *d = E->f->written->items[i];
    arena_grow(E->a, (void **)&E->sp->selectors, &E->cap, E->sp->decisions.n, sizeof(char *));
    E->sp->selectors[E->sp->decisions.n - 1] = NULL;
  }
}

static void emit_searched(emitter *E);

void emit_plan(arena *a, const sshape *s, const search_fixed *f, search_plan *sp) {
  emitter E = {a, s, f, sp, 0};
  sp->decisions = (weft_decisions){0};
  sp->selectors = NULL;
  /* the plan's statements before `search`, the search's, those after */
  if (f) copy_written(&E, 0, f->at);
  sp->body_from = sp->decisions.n;
  emit_searched(&E);
  sp->body_to = sp->decisions.n;
  if (f) copy_written(&E, f->at, f->written->n);
  if (!f) sp->body_from = sp->body_to = 0;
}

static void emit_searched(emitter *E0) {
  emitter E = *E0;
  arena *a = E.a;
  const sshape *s = E.s;
  search_plan *sp = E.sp;
  const weft_graph *g = s->g;
  if (sp->nonuniform) {
    emit_nonuniform(&E);
    emit_tail(&E);
    E0->cap = E.cap;
    return;
  }
  /* the mesh: data-parallel replicas of pipelines of tensor-parallel
   * groups (with context parallelism, cp of them per stage; with expert
   * parallelism, ep) */
  bool cp = sp->cp > 1, ep = sp->ep > 1;
  static const char *const axes3[] = {"dp", "pp", "tp"}, *const axes4[] = {"dp", "pp", "cp", "tp"},
                           *const axes4e[] = {"dp", "pp", "ep", "tp"};
  int sizes3[3] = {sp->dp, sp->pp, sp->tp}, sizes4[4] = {sp->dp, sp->pp, cp ? sp->cp : sp->ep, sp->tp};
  int mesh = 0;
  if (written_mesh(&E)) {
    /* the plan's own mesh: the meshes before it are none (one mesh) */
    mesh = 0;
  } else {
    dec_mesh(a, &sp->decisions, "m", cp || ep ? 4 : 3, cp ? axes4 : ep ? axes4e : axes3, cp || ep ? sizes4 : sizes3, 0);
    arena_grow(a, (void **)&sp->selectors, &E.cap, sp->decisions.n, sizeof(char *));
    sp->selectors[sp->decisions.n - 1] = NULL;
  }
  /* the sequence into cp parts first, so that tensor parallelism splits
   * each part further */
  if (cp) {
    decision *d = add(&E, DEC_SPLIT, "all");
    d->ops = all_ops(&E);
    d->name = s->seq;
    d->parts = sp->cp;
    d->axis = "cp";
  }
  /* expert parallelism: the batch over the replicas and into micro-batches
   * first (so that the experts' micro-batch k holds the rows every member
   * dispatches in its micro-batch k), then the experts' operators along the
   * experts and every other one along the batch, as expert_parallel(ep)
   * writes them; tensor parallelism splits each part further */
  if (ep) {
    batch_splits(&E);
    for (int pass = 0; pass < 2; pass++) {
      selbuf sel = {0};
      dec_ops ops = {0, arena_alloc(a, sizeof(int) * (size_t)g->nops)};
      for (int op = 0; op < g->nops; op++) {
        if (s->expert[op] != (pass == 0)) continue;
        ops.ops[ops.n++] = op;
        sel_add(a, &sel, op_pattern(a, s, op));
      }
      if (!ops.n) continue;
      decision *d = add(&E, DEC_SPLIT, sel_text(a, &sel));
      d->ops = ops;
      d->name = pass == 0 ? "experts" : s->batch;
      d->parts = sp->ep;
      d->axis = "ep";
    }
  }
  /* tensor parallelism: one statement per dimension, over every operator
   * split along it (a block's in every layer) */
  if (sp->tp > 1) {
    const char **dims = arena_alloc(a, sizeof(char *) * (size_t)(g->nops + 1));
    int nd = 0;
    for (int op = 0; op < g->nops; op++) {
      const char *d = sp->op_split[op];
      bool seen = false;
      for (int i = 0; i < nd && !seen; i++) seen = strcmp(dims[i], d) == 0;
      if (!seen) dims[nd++] = d;
    }
    /* splits first, replication last, as people write them */
    for (int pass = 0; pass < 2; pass++)
      for (int i = 0; i < nd; i++) {
        bool rep = dims[i][0] == 0;
        if (rep != (pass == 1)) continue;
        selbuf sel = {0};
        dec_ops ops = {0, arena_alloc(a, sizeof(int) * (size_t)g->nops)};
        for (int op = 0; op < g->nops; op++) {
          if (strcmp(sp->op_split[op], dims[i]) != 0) continue;
          if (E.f && E.f->tp_from && E.f->tp_from[op] >= 0) continue;  /* the plan writes it */
          ops.ops[ops.n++] = op;
          sel_add(a, &sel, op_pattern(a, s, op));
        }
        if (!ops.n) continue;
        decision *d = add(&E, rep ? DEC_REPLICATE : DEC_SPLIT, sel_text(a, &sel));
        d->ops = ops;
        d->name = rep ? NULL : dims[i];
        d->parts = sp->tp;
        d->axis = "tp";
      }
  }
  if (!ep) batch_splits(&E);
  for (int z = 1; z <= sp->zero && !written_zero(&E); z++) {
    decision *d = add(&E, DEC_SHARD, "all");
    d->ops = all_ops(&E);
    d->state = z;
    d->axis = "dp";
  }
  /* stages and their places on the mesh */
  dec_index at[5] = {{sp->dp > 1 ? "dp" : NULL, 0}, {NULL, 0}, {sp->tp > 1 ? "tp" : NULL, 0}, {NULL, 0}, {NULL, 0}};
  int nidx = 3, pp_at = 1;
  if (cp || ep) at[3] = at[2], at[2] = (dec_index){cp ? "cp" : "ep", 0}, nidx = 4;
  if (written_mesh(&E)) {
    /* indexed in the written mesh's order of axes; one it lacks has size 1 */
    const decision *m = &E.f->written->items[E.f->mesh];
    nidx = m->naxes < 5 ? m->naxes : 5;
    pp_at = -1;
    for (int k = 0; k < nidx; k++) {
      const char *ax = m->axes[k];
      int size = strcmp(ax, "dp") == 0 ? sp->dp : strcmp(ax, "tp") == 0 ? sp->tp : strcmp(ax, "cp") == 0 ? sp->cp
                 : strcmp(ax, "ep") == 0 ? sp->ep : 1;
      at[k] = (dec_index){strcmp(ax, "pp") != 0 && size > 1 ? ax : NULL, 0};
      if (strcmp(ax, "pp") == 0) pp_at = k;
    }
  }
  bool written_stages = E.f && E.f->nstages > 0;
  if (sp->nstages > 0) {
    for (int k = 0; k < sp->nstages && !written_stages; k++) {
      const search_stage *st = &sp->stages[k];
      selbuf sel = {0};
      dec_ops ops;
      int l0 = 0, l1 = 0;
      if (s->layers > 0) {
        /* the layers of the stage: those of its operators' range */
        for (int l = 0; l < s->layers; l++) {
          if (s->block_start[l] < st->first_op) l0 = l + 1;
          if (s->block_start[l] <= st->last_op) l1 = l + 1;
        }
        stage_ops(&E, l0, l1, st->first_op == 0, st->last_op == g->nops - 1, &ops, &sel);
      } else {
        ops.n = st->last_op - st->first_op + 1;
        ops.ops = arena_alloc(a, sizeof(int) * (size_t)ops.n);
        for (int i = 0; i < ops.n; i++) {
          ops.ops[i] = st->first_op + i;
          sel_add(a, &sel, g->ops[st->first_op + i].name);
        }
      }
      decision *d = add(&E, DEC_STAGE, sel_text(a, &sel));
      d->name = arena_printf(a, "s%d", k);
      d->ops = ops;
    }
    int first_stage = sp->decisions.n - sp->nstages;
    for (int k = 0; k < sp->nstages; k++) {
      /* the plan's own stages where it writes them */
      const decision *sd = written_stages ? &E.f->written->items[E.f->stages[k]]
                                          : &sp->decisions.items[first_stage + k];
      decision *d = add(&E, DEC_ASSIGN, written_stages ? sd->name : arena_printf(a, "s%d", k));
      d->ops = sd->ops;
      if (pp_at >= 0) at[pp_at].value = sp->stages[k].position;
      d->mesh = mesh;
      d->nidx = nidx;
      d->idx = arena_alloc(a, sizeof at);
      memcpy(d->idx, at, sizeof at);
    }
    if (!written_schedule(&E)) {
      decision *d = add(&E, DEC_SCHEDULE, NULL);
      d->sched = sp->schedule;
    }
  } else {
    decision *d = add(&E, DEC_ASSIGN, "all");
    d->ops = all_ops(&E);
    d->mesh = mesh;
    d->nidx = nidx;
    d->idx = arena_alloc(a, sizeof at);
    memcpy(d->idx, at, sizeof at);
  }
  emit_tail(&E);
  E0->cap = E.cap;
}

static void print_index(const decision *d, const char *mesh, FILE *out) {
  fprintf(out, "%s[", mesh);
  for (int i = 0; i < d->nidx; i++) {
    if (i) fputs(", ", out);
    if (d->idx[i].axis) fputs(d->idx[i].axis, out);
    else fprintf(out, "%d", d->idx[i].value);
  }
  fputs("]", out);
}

void search_print_body(const search_plan *sp, const weft_graph *g, FILE *out) {
  (void)g;
  const char *meshes[64];
  int nmeshes = 0;
  int from = sp->body_to > 0 ? sp->body_from : 0, to = sp->body_to > 0 ? sp->body_to : sp->decisions.n;
  for (int i = 0; i < to; i++) {
    const decision *d = &sp->decisions.items[i];
    const char *sel = sp->selectors ? sp->selectors[i] : NULL;
    if (d->kind == DEC_MESH && nmeshes < 64) meshes[nmeshes++] = d->name;
    if (i < from) continue;  /* the plan's own, written as they were */
    switch (d->kind) {
    case DEC_MESH: {
      /* devices[a..b] when they follow each other, else their list */
      bool run = true;
      for (int k = 1; k < d->ndevices && run; k++) run = d->devices[k] == d->devices[0] + k;
      int first = d->ndevices ? d->devices[0] : 0;
      if (run) fprintf(out, "  mesh %s = devices[%d..%d] as [", d->name, first, first + d->ndevices);
      else {
        fprintf(out, "  mesh %s = [", d->name);
        for (int k = 0; k < d->ndevices; k++) fprintf(out, "%s%d", k ? ", " : "", d->devices[k]);
        fputs("] as [", out);
      }
      for (int k = 0; k < d->naxes; k++) fprintf(out, "%s%s = %d", k ? ", " : "", d->axes[k], d->sizes[k]);
      fputs("]\n", out);
      break;
    }
    case DEC_SPLIT:
      fprintf(out, "  split %s on %s into %d as %s%s\n", sel, d->name, d->parts, d->axis, d->in_time ? " in time" : "");
      break;
    case DEC_REPLICATE: fprintf(out, "  replicate %s into %d as %s\n", sel, d->parts, d->axis); break;
    case DEC_SHARD: {
      static const char *const states[] = {"", "optimizer", "gradients", "parameters"};
      fprintf(out, "  shard %s %s over %s\n", states[d->state], sel, d->axis);
      break;
    }
    case DEC_STAGE: fprintf(out, "  stage %s = %s\n", d->name, sel); break;
    case DEC_ASSIGN:
      fprintf(out, "  assign %s -> ", sel);
      if (d->mesh < 0 && d->nidx == 1) fprintf(out, "%d", d->idx[0].value);
      else print_index(d, d->mesh >= 0 && d->mesh < nmeshes ? meshes[d->mesh] : "m", out);
      fputs("\n", out);
      break;
    case DEC_SCHEDULE: fprintf(out, "  schedule %s\n", sched_kind_names[d->sched]); break;
    case DEC_RECOMPUTE: fprintf(out, "  recompute %s %s\n", sel, d->mode == 2 ? "full" : "selective"); break;
    case DEC_BUCKETS:
      if (d->bytes % (1 << 20) == 0) fprintf(out, "  buckets %" PRId64 " MiB\n", d->bytes >> 20);
      else fprintf(out, "  buckets %" PRId64 " B\n", d->bytes);
      break;
    default: break;
    }
  }
}

const char *search_describe(arena *a, const search_plan *sp) {
  const char *rc[] = {"no recompute", "selective recompute", "full recompute"};
  /* stages that recompute differently: "recompute full, full, none" */
  bool mixed = false;
  for (int k = 1; k < sp->nstages; k++) mixed |= sp->stages[k].recompute != sp->stages[0].recompute;
  const char *per = "recompute";
  static const char *const modes[] = {"none", "selective", "full"};
  for (int k = 0; mixed && k < sp->nstages; k++)
    per = arena_printf(a, "%s%s %s", per, k ? "," : "", modes[sp->stages[k].recompute]);
  const char *rcs[3];
  for (int r = 0; r < 3; r++) rcs[r] = mixed ? per : rc[r];
  const char *sched = sp->schedule == SCHED_DEFAULT ? "" : arena_printf(a, ", %s", sched_kind_names[sp->schedule]);
  if (sp->nonuniform) {
    /* each stage's mesh: "stages tp 2 x dp 2 (5 blocks), tp 4 x dp 1 (3 blocks)" */
    const char *st = "";
    for (int k = 0; k < sp->nstages; k++)
      st = arena_printf(a, "%s%stp %d x dp %d (%d block%s)", st, k ? ", " : "", sp->stages[k].tp, sp->stages[k].dp,
                        sp->stages[k].layers, sp->stages[k].layers == 1 ? "" : "s");
    return arena_printf(a, "pp %d, stages %s, %d micro-batch%s%s, %s, zero %d%s", sp->pp, st, sp->micro_batches,
                        sp->micro_batches == 1 ? "" : "es", sched, rcs[sp->recompute], sp->zero,
                        sp->sequence_parallel ? ", sequence parallel" : "");
  }
  if (sp->schedule == SCHED_INTERLEAVED) sched = arena_printf(a, "%s %d", sched, sp->interleave);
  if (sp->ep > 1)
    return arena_printf(a, "tp %d, pp %d, ep %d, dp %d, %d micro-batch%s of %d%s, %s, zero %d%s", sp->tp, sp->pp,
                        sp->ep, sp->dp, sp->micro_batches, sp->micro_batches == 1 ? "" : "es", sp->micro_batch_size,
                        sched, rcs[sp->recompute], sp->zero, sp->sequence_parallel ? ", sequence parallel" : "");
  if (sp->cp > 1)
    return arena_printf(a, "tp %d, pp %d, cp %d, dp %d, %d micro-batch%s of %d%s, %s, zero %d%s", sp->tp, sp->pp,
                        sp->cp, sp->dp, sp->micro_batches, sp->micro_batches == 1 ? "" : "es", sp->micro_batch_size,
                        sched, rcs[sp->recompute], sp->zero, sp->sequence_parallel ? ", sequence parallel" : "");
  return arena_printf(a, "tp %d, pp %d, dp %d, %d micro-batch%s of %d%s, %s, zero %d%s", sp->tp, sp->pp, sp->dp,
                      sp->micro_batches, sp->micro_batches == 1 ? "" : "es", sp->micro_batch_size, sched,
                      rcs[sp->recompute], sp->zero, sp->sequence_parallel ? ", sequence parallel" : "");
}
