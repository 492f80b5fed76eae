/* htab.c - the hash table of htab.h: linear probing, at most half full,
 * doubled (and every entry placed again, in order) when it would be more. */
#include <stdlib.h>

#include "base/htab.h"
#include "base/vec.h"

/* Entry e at the first free position of its probe. */
static void place(htab *t, int e, uint64_t h) {
  size_t mask = (size_t)t->cap - 1, q = htab_home(t, h);
  while (t->slot[q].e >= 0) q = (q + 1) & mask;
  t->slot[q] = (htab_slot){h, e};
  t->at[e] = (int)q;
}

void htab_reserve(htab *t, int n) {
  vec_grow(t->a, (void **)&t->at, &t->atcap, n, sizeof(int));
  if (2 * (int64_t)n <= t->cap) return;
  int cap = 16, bits = 4;
  for (; cap < 2 * (int64_t)n; cap *= 2, bits++)
    if (cap > (1 << 29)) weft_oom();
  htab_slot *old = t->slot;
  t->slot = t->a ? arena_alloc(t->a, sizeof(htab_slot) * (size_t)cap) : malloc(sizeof(htab_slot) * (size_t)cap);
  if (!t->slot) weft_oom();
  for (int q = 0; q < cap; q++) t->slot[q].e = -1;
  t->cap = cap;
  t->shift = 64 - bits;
  /* in the order they were added, so that the table stays what adding
   * them in order makes (htab_truncate relies on it); an entry's hash is
   * in its old position */
  for (int e = 0; e < t->n; e++) place(t, e, old[t->at[e]].hash);
  if (!t->a) free(old);
}

int htab_add(htab *t, uint64_t h) {
  if (2 * (t->n + 1) > t->cap) htab_reserve(t, t->cap ? t->cap : 8);
  if (t->n + 1 > t->atcap) vec_grow(t->a, (void **)&t->at, &t->atcap, t->n + 1, sizeof(int));
  place(t, t->n, h);
  return t->n++;
}

/* Last added, first forgotten: each entry's probe passed only entries
 * added before it, which are still there when it goes. */
void htab_truncate(htab *t, int n) {
  for (int e = t->n - 1; e >= n; e--) t->slot[t->at[e]].e = -1;
  if (n < t->n) t->n = n;
}

void htab_free(htab *t) {
  if (!t->a) {
    free(t->slot);
    free(t->at);
  }
  *t = (htab){.a = t->a};
}
