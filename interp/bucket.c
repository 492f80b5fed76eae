/* bucket.c - `buckets SIZE`: the all-reduces that sum parameter gradients
 * on one group, one after another before the optimizer, fused into one. */
#include <stdlib.h>
#include <string.h>

#include "lower.h"
#include "weft.h"

/* A collective a bucket may take: an in-place all-reduce of a persistent
 * gradient (the sum data parallelism makes before the step). */
static bool eligible(const weft_program *pr, const lins *in) {
  if (in->kind != LI_COLLECTIVE || in->epoch != 0 || in->nbucket) return false;
  const pcomm *cm = &pr->p->comms[in->comm];
  if (cm->kind != COMM_ALL_REDUCE || cm->phase != PHASE_WEIGHTS) return false;
  if (in->nin != 1 || in->nout != 1 || in->in[0].buf != in->out[0].buf) return false;
  const lbuf *b = &pr->bufs[in->out[0].buf];
  return b->persistent && tregion_equal(&b->region, &in->out[0].region);
}

static bool same_group(const pcomm *a, const pcomm *b) {
  if (a->ngroup != b->ngroup) return false;
  for (int i = 0; i < a->ngroup; i++)
    if (a->group[i] != b->group[i]) return false;
  return true;
}

static bool lowered(const weft_program *pr, int d) { return !pr->p->rep || pr->p->rep[d] == d; }

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
  /* 1. successors that every device agrees on */
  for (int d = 0; d < pr->nprogs; d++) {
    if (!lowered(pr, d)) continue;
    const lprog *pg = &pr->progs[d];
    int prev = -1;
    for (int i = 0; i < pg->n; i++) {
      const lins *in = &pg->ins[i];
      if (in->kind == LI_STEP || in->kind == LI_ALLOC || in->kind == LI_FREE) {
        if (in->kind != LI_STEP) prev = -1;  /* only steps may stand between */
        continue;
      }
      bool e = eligible(pr, in);
      int c = e ? in->comm : -1;
      if (e) eligible_c[c] = true;
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
  /* 2. buckets along the chains, cut at the size from the chain's end: the
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
      if (j < end - 1 && size + p->comms[chain[j]].size > p->bucket_bytes) {
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
    for (int i = pg->n - 1; i >= 0; i--) {
      const lins *in = &pg->ins[i];
      int c = in->kind == LI_COLLECTIVE && eligible(pr, in) ? in->comm : -1;
      if (c >= 0 && bucket_of[c] >= 0 && next[c] >= 0 && bucket_of[next[c]] == bucket_of[c]) start = i;
    }
    if (start == pg->n) continue;
    int m = start, held_from = -1;  /* the instructions held back start here (in pg->ins) */
    lins *moved = malloc(sizeof(lins) * (size_t)(pg->n - start + 1));
    int nmoved = 0;
    if (!moved) weft_oom();
    for (int i = start; i < pg->n; i++) {
      lins in = pg->ins[i];
      int c = eligible(pr, &in) ? in.comm : -1;
      if (c >= 0 && bucket_of[c] >= 0 && (next[c] >= 0 && bucket_of[next[c]] == bucket_of[c])) {
        /* not the bucket's last: held back */
        if (held_from < 0) held_from = i;
        moved[nmoved++] = in;
        continue;
      }
      if (held_from >= 0 && in.kind == LI_STEP) {
        moved[nmoved++] = in;
        continue;
      }
      if (held_from >= 0 && c >= 0 && bucket_of[c] >= 0) {
        /* the last of the bucket: one collective for all, then the steps */
        int k = 1;
        for (int j = 0; j < nmoved; j++) k += moved[j].kind == LI_COLLECTIVE;
        lins b = in;
        b.comm = bucket_of[c];
        b.nbucket = k - 1;
        b.bucket = arena_alloc(a, sizeof(int) * (size_t)k);
        b.in = arena_alloc(a, sizeof(lref) * (size_t)k);
        b.out = arena_alloc(a, sizeof(lref) * (size_t)k);
        b.nin = b.nout = k;
        int q = 0;
        for (int j = 0; j < nmoved; j++)
          if (moved[j].kind == LI_COLLECTIVE) {
            if (q) b.bucket[q - 1] = moved[j].comm;
            b.in[q] = moved[j].in[0];
            b.out[q++] = moved[j].out[0];
          }
        b.bucket[q - 1] = c;
        b.in[q] = in.in[0];
        b.out[q] = in.out[0];
        pg->ins[m++] = b;
        for (int j = 0; j < nmoved; j++)
          if (moved[j].kind == LI_STEP) pg->ins[m++] = moved[j];
        buckets++;
        nmoved = 0;
        held_from = -1;
        continue;
      }
      pg->ins[m++] = in;
    }
    /* a chain cut short on this device cannot happen: successors are agreed */
    for (int j = 0; j < nmoved; j++) pg->ins[m++] = moved[j];
    pr->instructions -= pg->n - m;
    pg->n = m;
    free(moved);
  }
  (void)buckets;
  free(next), free(eligible_c), free(has_prev), free(bucket_of);
}
