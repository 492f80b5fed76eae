/* decisions.c - decision lists: appending decisions, selecting operators
 * by name, and the shorthands that search and tests build lists with. */
#include <stdio.h>
#include <string.h>

#include "weft/decisions.h"

const char *const sched_kind_names[] = {"default", "gpipe", "one_f_one_b", "interleaved", "grid", "interlaced"};

const char *const dec_kind_names[DEC_KIND_COUNT] = {"mesh",     "split",    "replicate", "stage",  "assign",
                                                    "order",    "schedule", "recompute", "shard",  "buckets"};

decision *dec_add(arena *a, weft_decisions *d, dec_kind k) {
  arena_grow(a, (void **)&d->items, &d->cap, d->n + 1, sizeof(decision));
  decision *x = &d->items[d->n++];
  memset(x, 0, sizeof *x);
  x->kind = k;
  x->mesh = -1;
  return x;
}

dec_ops dec_select(arena *a, const weft_graph *g, const char *pattern) {
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", pattern);
  const char *segs[66];
  int ns = 0;
  for (char *tok = strtok(buf, "."); tok && ns < 64; tok = strtok(NULL, ".")) segs[ns++] = tok;
  dec_ops out = {0, arena_alloc(a, sizeof(int) * (size_t)(g->nops ? g->nops : 1))};
  bool all = strcmp(pattern, "all") == 0;
  for (int op = 0; op < g->nops; op++) {
    const char *name = g->ops[op].name;
    bool m = all || graph_glob_match(segs, ns, name);
    if (!m) {
      segs[ns] = "**";
      m = graph_glob_match(segs, ns + 1, name);
    }
    if (m) out.ops[out.n++] = op;
  }
  return out;
}

decision *dec_mesh(arena *a, weft_decisions *d, const char *name, int naxes, const char *const *axes,
                   const int *sizes, int first_device) {
  decision *x = dec_add(a, d, DEC_MESH);
  x->name = name;
  x->naxes = naxes;
  x->axes = arena_alloc(a, sizeof(char *) * (size_t)(naxes ? naxes : 1));
  x->sizes = arena_alloc(a, sizeof(int) * (size_t)(naxes ? naxes : 1));
  int n = 1;
  for (int i = 0; i < naxes; i++) {
    x->axes[i] = axes[i];
    x->sizes[i] = sizes[i];
    n *= sizes[i];
  }
  x->ndevices = n;
  x->devices = arena_alloc(a, sizeof(int) * (size_t)(n > 0 ? n : 1));
  for (int i = 0; i < n; i++) x->devices[i] = first_device + i;
  return x;
}

decision *dec_split(arena *a, weft_decisions *d, dec_ops ops, const char *dim, int parts, const char *axis) {
  decision *x = dec_add(a, d, DEC_SPLIT);
  x->ops = ops;
  x->name = dim;
  x->parts = parts;
  x->axis = axis;
  return x;
}

decision *dec_replicate(arena *a, weft_decisions *d, dec_ops ops, int parts, const char *axis) {
  decision *x = dec_add(a, d, DEC_REPLICATE);
  x->ops = ops;
  x->parts = parts;
  x->axis = axis;
  return x;
}

decision *dec_assign(arena *a, weft_decisions *d, dec_ops ops, int mesh, int nidx, const dec_index *idx) {
  decision *x = dec_add(a, d, DEC_ASSIGN);
  x->ops = ops;
  x->mesh = mesh;
  x->nidx = nidx;
  x->idx = arena_alloc(a, sizeof(dec_index) * (size_t)(nidx ? nidx : 1));
  memcpy(x->idx, idx, sizeof(dec_index) * (size_t)nidx);
  return x;
}
