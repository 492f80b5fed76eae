/* arena.h - bump allocation for everything whose lifetime is one stage.
 * Ownership rule: nothing allocated from an arena is freed alone; the arena is. */
#ifndef WEFT_ARENA_H
#define WEFT_ARENA_H

#include <stddef.h>
#include <stdlib.h>

typedef struct arena_block arena_block;

typedef struct arena {
  arena_block *head;   /* newest block; older ones follow through ->next */
  arena_block *spare;  /* blocks kept by arena_reset for reuse */
  size_t total;        /* bytes obtained from malloc, for --stats and limits */
} arena;

void arena_init(arena *a);
void arena_free(arena *a);
/* Forgets everything allocated but keeps the memory for what follows: a
 * scratch arena reused in a loop costs no page faults after the first turn. */
void arena_reset(arena *a);
/* A point in an arena's life, to come back to: what was allocated after it
 * is forgotten by arena_rewind (its memory kept for what follows). */
typedef struct arena_mark {
  arena_block *head;
  size_t used;
} arena_mark;
arena_mark arena_here(const arena *a);
void arena_rewind(arena *a, arena_mark m);
/* Moves every block of src into dst (src is left empty). */
void arena_adopt(arena *dst, arena *src);
/* Zeroed memory; aborts through weft_oom() when malloc fails. */
void *arena_alloc(arena *a, size_t n);
char *arena_strdup(arena *a, const char *s);
char *arena_strndup(arena *a, const char *s, size_t n);
char *arena_printf(arena *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Grows *items (of *cap elements of size elem) to hold at least need. */
void arena_grow(arena *a, void **items, int *cap, int need, size_t elem);

/* The memory budget of the process: all arenas together hold at most
 * bytes (0: no limit). Past it weft stops with a message naming the budget,
 * exit 2; the stages estimate what they build and refuse it earlier, with
 * its figures (arena_budget tells them the limit). */
void arena_budget_set(size_t bytes);
size_t arena_budget(void);
/* Bytes all arenas hold now, and the most they held. */
size_t arena_held(void);
size_t arena_held_peak(void);
/* Half of the machine's physical memory: the default budget. */
size_t arena_default_budget(void);

/* Called when memory runs out: prints a message and exits with status 2. */
_Noreturn void weft_oom(void);

/* malloc and calloc (zeroed bytes) of at least one byte, or weft_oom. */
static inline void *weft_xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) weft_oom();
  return p;
}
static inline void *weft_xcalloc(size_t n) {
  void *p = calloc(n ? n : 1, 1);
  if (!p) weft_oom();
  return p;
}

#endif
