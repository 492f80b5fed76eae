/* htab.h - the hash table of the library: open addressing over the entries
 * 0, 1, 2, ... of arrays its user keeps, found by a 64-bit hash of their key. */
#ifndef WEFT_HTAB_H
#define WEFT_HTAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether entry e has the key the caller looks for (ctx describes it).
 * NULL where the hash is the key itself: equal hashes are equal keys. */
typedef bool (*htab_same)(const void *ctx, int e);

/* A position: the hash beside its entry, so that a probe reads one place. */
typedef struct htab_slot {
  uint64_t hash;
  int e;                  /* -1: empty */
} htab_slot;

/* The table holds no keys, only where each entry is: the user's arrays,
 * indexed by entry, hold the rest (the key, the value). Entries are only
 * ever added at the end and forgotten from the end, so the table is always
 * what adding entries 0 .. n-1 in order makes. A zeroed table is empty,
 * on the heap; one made with a set is in that arena (and htab_free leaves
 * its memory to the arena). */
typedef struct htab {
  htab_slot *slot;        /* cap positions, a power of 2 */
  int *at;                /* per entry: its position */
  int cap, n, atcap;
  int shift;              /* 64 - log2(cap) */
  struct arena *a;        /* NULL: the heap */
} htab;

/* The position where hash h starts its probe: the top bits of a
 * multiplication, which mixes in every bit of a weak hash (a pointer, two
 * small numbers side by side). */
static inline size_t htab_home(const htab *t, uint64_t h) {
  return (size_t)((h * 0x9E3779B97F4A7C15ull) >> t->shift);
}

/* The entry with hash h that same(ctx, e) accepts, -1 if none. */
static inline int htab_find(const htab *t, uint64_t h, htab_same same, const void *ctx) {
  if (!t->cap) return -1;
  size_t mask = (size_t)t->cap - 1;
  for (size_t q = htab_home(t, h);; q = (q + 1) & mask) {
    const htab_slot *s = &t->slot[q];
    if (s->e < 0) return -1;
    if (s->hash == h && (!same || same(ctx, s->e))) return s->e;
  }
}

/* Entry n (the next one) with hash h, whether or not an equal key is
 * there already (the caller found none, or keeps several). */
int htab_add(htab *t, uint64_t h);
/* Room for n entries without growing (a table built at once). */
void htab_reserve(htab *t, int n);
/* Forgets entries n, n + 1, ... (all of them with n = 0), keeping the
 * memory: a table emptied for each device costs no allocation after the
 * first, and no more time than the entries it held. */
void htab_truncate(htab *t, int n);
void htab_free(htab *t);

#endif
