/* vec.h - the growable array of the library: elements, their count and the
 * room for them, grown by doubling, in an arena or (arena NULL) on the heap. */
#ifndef WEFT_VEC_H
#define WEFT_VEC_H

#include <stdlib.h>

#include "weft/arena.h"

/* A vector of T; name it with a typedef (`typedef VEC(int) ivec;`) to pass
 * it around. A zeroed one is empty. */
#define VEC(T) struct { T *v; int n, cap; }

/* Room for at least need elements of size elem at *v, which has room for
 * *cap. In an arena the old elements stay where they were (arena memory is
 * not freed alone); on the heap they move. */
static inline void vec_grow(arena *a, void **v, int *cap, int need, size_t elem) {
  if (a) {
    arena_grow(a, v, cap, need, elem);
    return;
  }
  /* doubled, or what is asked when that is more (a reservation) */
  if (*cap > (1 << 29) || need > (1 << 30)) weft_oom();
  int ncap = *cap ? 2 * *cap : 16;
  if (ncap < need) ncap = need;
  void *n = realloc(*v, (size_t)ncap * elem);
  if (!n) weft_oom();
  *v = n;
  *cap = ncap;
}

#define vec_reserve(a, x, need) \
  ((need) > (x)->cap ? vec_grow((a), (void **)&(x)->v, &(x)->cap, (need), sizeof *(x)->v) : (void)0)
/* Appends val (evaluated after the vector grew). */
#define vec_push(a, x, val) (vec_reserve((a), (x), (x)->n + 1), (void)((x)->v[(x)->n++] = (val)))
/* A heap vector's memory back; it is empty again. */
#define vec_free(x) (free((x)->v), (x)->v = NULL, (x)->n = (x)->cap = 0)

#endif
