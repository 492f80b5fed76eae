/* bucket.c - `buckets SIZE`: the all-reduces that sum parameter gradients
 * on one group, one after another before the optimizer, fused into one. */
#include <stdlib.h>
#include <string.h>

#include "weft/lower.h"
#include "weft/workspace.h"

/* A collective a bucket may take: an in-place all-reduce of a whole
 * persistent gradient (the sum data parallelism makes before the step). */
static bool eligible(const weft_program *pr, const lprog *pg, int i) {
  const lop *o = &pg->ops[i];
  if (o->kind != LI_COLLECTIVE || o->epoch != 0 || !(o->flags & LOP_WHOLE) || lop_nbucket(pg->pool, o)) return false;
  const pcomm *cm = &pr->p->comms[o->id];
  return cm->kind == COMM_ALL_REDUCE && cm->phase == PHASE_WEIGHTS;
}

static bool same_group(const pcomm *a, const pcomm *b) {
  if (a->ngroup != b->ngroup) return false;
  for (int i = 0; i < a->ngroup; i++)
    if (a->group[i] != b->group[i]) return false;
  return true;
}

static bool lowered(const weft_program *pr, int d) { return !pr->p->rep || pr->p->rep[d] == d; }

/* Device pg's program with the buckets: seq[0..m) lists its instructions
 * in their new order, an instruction by its index, a bucket by -(1 + f)
 * where fused[fstart[f] .. fstart[f + 1]) are the indices of its
 * all-reduces. Written into the lops and, when kept, the full
 * instructions. */
static void rewrite(arena *a, const weft_program *pr, lprog *pg, const int *seq, int m, const int *fused,
                    const int *fstart, int nf) {
  /* the pool grows by one entry per bucket */
  int extra = 0;
  for (int f = 0; f < nf; f++) {
    int k = fstart[f + 1] - fstart[f];
    extra += lop_entry_size(k, k, k - 1);
  }
  int *pool = pg->pool;
  if (pg->npool + extra > pg->pcap) {
    pool = arena_alloc(a, sizeof(int) * (size_t)(pg->npool + extra));
    memcpy(pool, pg->pool, sizeof(int) * (size_t)pg->npool);
    pg->pcap = pg->npool + extra;
  }
  int np = pg->npool;
  lop *ops = malloc(sizeof(lop) * (size_t)(m ? m : 1));
  lins *ins = pg->ins ? malloc(sizeof(lins) * (size_t)(m ? m : 1)) : NULL;
  if (!ops || (pg->ins && !ins)) weft_oom();
  for (int j = 0; j < m; j++) {
    if (seq[j] >= 0) {
      ops[j] = pg->ops[seq[j]];
      if (ins) ins[j] = pg->ins[seq[j]];
      continue;
    }
    int f = -seq[j] - 1, k = fstart[f + 1] - fstart[f];
    const int *mem = fused + fstart[f];
    /* the bucket runs where its last all-reduce was, named by its first */
    lop o = pg->ops[mem[k - 1]];
    o.id = pg->ops[mem[0]].id;
    o.refs = np;
    int *r = lop_put_head(pool + np, k, k, k - 1);
    for (int q = 0; q < k; q++) {
      const int *b = lop_bufs(pool, &pg->ops[mem[q]]);
      r[q] = b[0];
      r[k + q] = b[1];
      if (q) r[2 * k + q - 1] = pg->ops[mem[q]].id;
    }
    np += lop_entry_size(k, k, k - 1);
    ops[j] = o;
    if (!ins) continue;
    lins b = pg->ins[mem[k - 1]];
    b.comm = o.id;
    b.nbucket = (uint16_t)(k - 1);
    b.bucket = arena_alloc(a, sizeof(int) * (size_t)k);
    b.in = arena_alloc(a, sizeof(lref) * (size_t)k);
    b.out = arena_alloc(a, sizeof(lref) * (size_t)k);
    b.nin = b.nout = k;
    for (int q = 0; q < k; q++) {
      const lins *x = &pg->ins[mem[q]];
      if (q) b.bucket[q - 1] = x->comm;
      b.in[q] = x->in[0];
      b.out[q] = x->out[0];
    }
    ins[j] = b;
  }
  memcpy(pg->ops, ops, sizeof(lop) * (size_t)m);
  if (ins) memcpy(pg->ins, ins, sizeof(lins) * (size_t)m);
  free(ops);
  free(ins);
  pg->pool = pool;
  pg->npool = np;
  pg->n = m;
}

/* Fuses gradient all-reduces into buckets of at most p->bucket_bytes. Comm
 * c is followed in a bucket by comm n when, on every device that runs both,
 * n is the next collective after c with only optimizer steps between them,
 * both eligible on the same group: then every member forms the same
 * buckets. The bucket runs where its last all-reduce was; the steps that
 * stood between move after it. Nothing else changes: the buffers are
 * persistent, and no instruction but those steps reads them. */
void lower_buckets(arena *a, weft_program *pr) {
  const weft_plan *p = pr->p;
  if (p->bucket_bytes <= 0 || p->ncomms == 0) return;
  int nc = p->ncomms;
  int *next = malloc(sizeof(int) * (size_t)nc);  /* the agreed successor; -1 none; -2 not yet seen */
  bool *eligible_c = calloc((size_t)nc, 1), *has_prev = calloc((size_t)nc, 1);
  int *bucket_of = malloc(sizeof(int) * (size_t)nc);  /* the bucket's first comm */
  if (!next || !eligible_c || !has_prev || !bucket_of) weft_oom();
  for (int c = 0; c < nc; c++) next[c] = -2, bucket_of[c] = -1;
  /* 1. successors that every device agrees on; where each device's first
   * eligible all-reduce is (nothing before it can move) */
  int *first = malloc(sizeof(int) * (size_t)(pr->nprogs ? pr->nprogs : 1));
  if (!first) weft_oom();
  for (int d = 0; d < pr->nprogs; d++) {
    first[d] = -1;
    if (!lowered(pr, d)) continue;
    const lprog *pg = &pr->progs[d];
    int prev = -1;
    for (int i = 0; i < pg->n; i++) {
      const lop *in = &pg->ops[i];
      if (in->kind == LI_STEP || in->kind == LI_ALLOC || in->kind == LI_FREE) {
        if (in->kind != LI_STEP) prev = -1;  /* only steps may stand between */
        continue;
      }
      bool e = eligible(pr, pg, i);
      int c = e ? in->id : -1;
      if (e) eligible_c[c] = true;
      if (e && first[d] < 0) first[d] = i;
      if (prev >= 0) {
        int want = c >= 0 && same_group(&p->comms[prev], &p->comms[c]) ? c : -1;
        next[prev] = next[prev] == -2 || next[prev] == want ? want : -1;
      }
      prev = c;
    }
    if (prev >= 0) next[prev] = -1;
  }
  for (int c = 0; c < nc; c++)
    if (next[c] >= 0 && eligible_c[next[c]]) has_prev[next[c]] = true;
    else if (next[c] != -1) next[c] = -1;
  /* 2. buckets along the chains, cut at the size (and at LINS_MAX_BUCKET
   * all-reduces) from the chain's end: the
   * program lists gradients in parameter order and the backward makes the
   * last ones first, so the first bucket can start while the backward goes
   * on (as DistributedDataParallel fills its buckets in reverse order) */
  int buckets = 0;
  int *chain = malloc(sizeof(int) * (size_t)nc);
  if (!chain) weft_oom();
  for (int c = 0; c < nc; c++) {
    if (!eligible_c[c] || has_prev[c]) continue;
    int n = 0;
    for (int x = c; x >= 0; x = next[x]) chain[n++] = x;
    int end = n;  /* the bucket being filled is chain[j+1 .. end) */
    int64_t size = 0;
    for (int j = n - 1; j >= 0; j--) {
      if (j < end - 1 && (size + p->comms[chain[j]].size > p->bucket_bytes || end - j > LINS_MAX_BUCKET + 1)) {
        for (int q = j + 1; q < end; q++) bucket_of[chain[q]] = chain[j + 1];
        end = j + 1;
        size = 0;
      }
      size += p->comms[chain[j]].size;
    }
    for (int q = 0; q < end; q++) bucket_of[chain[q]] = chain[0];
  }
  free(chain);
  /* 3. rewrite: members wait for the bucket's last all-reduce */
  for (int d = 0; d < pr->nprogs; d++) {
    if (!lowered(pr, d)) continue;
    lprog *pg = &pr->progs[d];
    /* the first all-reduce held back: nothing before it moves */
    int start = pg->n;
    for (int i = pg->n - 1; i >= first[d] && first[d] >= 0; i--) {
      int c = eligible(pr, pg, i) ? pg->ops[i].id : -1;
      if (c >= 0 && bucket_of[c] >= 0 && next[c] >= 0 && bucket_of[next[c]] == bucket_of[c]) start = i;
    }
    if (start == pg->n) continue;
    int n = pg->n, m = 0, nf = 0, nfused = 0, nmoved = 0;
    int *seq = malloc(sizeof(int) * (size_t)n), *fused = malloc(sizeof(int) * (size_t)n);
    int *fstart = malloc(sizeof(int) * (size_t)(n + 1)), *moved = malloc(sizeof(int) * (size_t)n);
    if (!seq || !fused || !fstart || !moved) weft_oom();
    for (int i = 0; i < start; i++) seq[m++] = i;
    bool holding = false;
    for (int i = start; i < n; i++) {
      const lop *in = &pg->ops[i];
      int c = eligible(pr, pg, i) ? in->id : -1;
      if (c >= 0 && bucket_of[c] >= 0 && (next[c] >= 0 && bucket_of[next[c]] == bucket_of[c])) {
        /* not the bucket's last: held back */
        holding = true;
        moved[nmoved++] = i;
        continue;
      }
      if (holding && in->kind == LI_STEP) {
        moved[nmoved++] = i;
        continue;
      }
      if (holding && c >= 0 && bucket_of[c] >= 0) {
        /* the last of the bucket: one collective for all, then the steps */
        fstart[nf] = nfused;
        for (int j = 0; j < nmoved; j++)
          if (pg->ops[moved[j]].kind == LI_COLLECTIVE) fused[nfused++] = moved[j];
        fused[nfused++] = i;
        seq[m++] = -(1 + nf++);
        fstart[nf] = nfused;
        for (int j = 0; j < nmoved; j++)
          if (pg->ops[moved[j]].kind == LI_STEP) seq[m++] = moved[j];
        buckets++;
        nmoved = 0;
        holding = false;
        continue;
      }
      seq[m++] = i;
    }
    /* a chain cut short on this device cannot happen: successors are agreed */
    for (int j = 0; j < nmoved; j++) seq[m++] = moved[j];
    rewrite(a, pr, pg, seq, m, fused, fstart, nf);
    pr->instructions -= n - m;
    free(seq), free(fused), free(fstart), free(moved);
  }
  (void)buckets;
  free(first);
  free(next), free(eligible_c), free(has_prev), free(bucket_of);
}
