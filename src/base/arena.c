/* arena.c - bump allocator: blocks of at least 64 KiB, freed together.
 * Used by the parser, the evaluator and the graph; see arena.h. */
#include "weft/arena.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct arena_block {
  arena_block *next;
  size_t used, size;
  bool fresh;             /* from calloc and never reused: still zero */
  max_align_t data[];
};

/* Blocks grow with the arena, up to 16 MiB: large arenas (lowered programs
 * of thousands of devices) then take their memory from calloc in big,
 * already zeroed pieces, and need no memset. */
enum { ARENA_MIN_BLOCK = 64 * 1024, ARENA_MAX_BLOCK = 16 * 1024 * 1024 };

void weft_oom(void) {
  fputs("weft: error: out of memory\n", stderr);
  exit(2);
}

/* ---- the budget ---------------------------------------------------------------
 * What all arenas of the process hold, and the most they may: a process's
 * figures, shared by every arena and thread (atomic), like malloc's own. */

static size_t held, held_peak, budget;

void arena_budget_set(size_t bytes) { budget = bytes; }
size_t arena_budget(void) { return budget; }
size_t arena_held(void) { return __atomic_load_n(&held, __ATOMIC_RELAXED); }
size_t arena_held_peak(void) { return __atomic_load_n(&held_peak, __ATOMIC_RELAXED); }

size_t arena_default_budget(void) {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || size <= 0) return 0;
  return (size_t)pages / 2 * (size_t)size;
}

/* "1.5 GiB" */
static const char *gib(char *buf, size_t n, size_t bytes) {
  if (bytes >= ((size_t)1 << 30)) snprintf(buf, n, "%.1f GiB", (double)bytes / (double)((size_t)1 << 30));
  else snprintf(buf, n, "%.0f MiB", (double)bytes / (double)(1 << 20));
  return buf;
}

/* The process's resident memory, or 0 when the system does not say. */
static size_t resident(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, res = 0;
  int got = fscanf(f, "%lu %lu", &size, &res);
  fclose(f);
  long page = sysconf(_SC_PAGESIZE);
  return got == 2 && page > 0 ? (size_t)res * (size_t)page : 0;
}

/* Blocks are counted when they are made; the pages of a large one are
 * not all touched (a table a stage fills sparsely), so once the blocks
 * pass the budget the memory really in use decides. */
static void take(size_t n) {
  size_t now = __atomic_add_fetch(&held, n, __ATOMIC_RELAXED);
  size_t peak = __atomic_load_n(&held_peak, __ATOMIC_RELAXED);
  while (now > peak && !__atomic_compare_exchange_n(&held_peak, &peak, now, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
  if (!budget || now <= budget) return;
  size_t used = resident();
  if (!used) used = now - n;
  if (used + n <= budget) return;
  char a[32], b[32];
  fprintf(stderr, "weft: error: this work needs more than %s of memory, the budget (--max-memory or WEFT_MAX_MEMORY; "
          "the default is half of the machine's memory); %s were in use\n", gib(a, sizeof a, budget), gib(b, sizeof b, used));
  exit(2);
}

static void give(size_t n) { __atomic_sub_fetch(&held, n, __ATOMIC_RELAXED); }

void arena_init(arena *a) { a->head = NULL; a->spare = NULL; a->total = 0; }

static void free_blocks(arena_block *b) {
  while (b) {
    arena_block *next = b->next;
    give(b->size + sizeof *b);
    free(b);
    b = next;
  }
}

void arena_free(arena *a) {
  free_blocks(a->head);
  free_blocks(a->spare);
  a->head = a->spare = NULL;
  a->total = 0;
}

void arena_reset(arena *a) {
  arena_block *b = a->head;
  while (b) {
    arena_block *next = b->next;
    b->used = 0;
    b->fresh = false;
    b->next = a->spare;
    a->spare = b;
    b = next;
  }
  a->head = NULL;
}

arena_mark arena_here(const arena *a) { return (arena_mark){a->head, a->head ? a->head->used : 0}; }

void arena_rewind(arena *a, arena_mark m) {
  /* blocks made or taken since the mark go back to the spares */
  while (a->head && a->head != m.head) {
    arena_block *b = a->head;
    a->head = b->next;
    b->used = 0;
    b->fresh = false;
    b->next = a->spare;
    a->spare = b;
  }
  if (a->head) {
    a->head->used = m.used;
    a->head->fresh = false;
  }
}

void arena_adopt(arena *dst, arena *src) {
  for (arena_block **lists[2] = {&src->head, &src->spare}, ***l = lists; l < lists + 2; l++) {
    arena_block *b = **l;
    while (b) {
      arena_block *next = b->next;
      /* behind dst's newest block, so that dst keeps allocating where it was */
      if (dst->head) { b->next = dst->head->next; dst->head->next = b; }
      else { b->next = NULL; dst->head = b; }
      b = next;
    }
    **l = NULL;
  }
  dst->total += src->total;
  src->total = 0;
}

void *arena_alloc(arena *a, size_t n) {
  size_t align = sizeof(max_align_t);
  n = (n + align - 1) & ~(align - 1);
  if (n == 0) n = align;
  arena_block *b = a->head;
  if (!b || b->size - b->used < n) {
    /* a kept block that is large enough, else a new one */
    for (arena_block **pp = &a->spare; *pp; pp = &(*pp)->next)
      if ((*pp)->size >= n) {
        b = *pp;
        *pp = b->next;
        b->used = 0;
        b->next = a->head;
        a->head = b;
        goto have;
      }
    size_t size = a->total / 4;
    if (size < ARENA_MIN_BLOCK) size = ARENA_MIN_BLOCK;
    if (size > ARENA_MAX_BLOCK) size = ARENA_MAX_BLOCK;
    if (size < n) size = n;
    if (size > SIZE_MAX - sizeof(arena_block)) weft_oom();
    take(sizeof(arena_block) + size);
    b = calloc(1, sizeof(arena_block) + size);
    if (!b) weft_oom();
    b->size = size;
    b->fresh = true;
    b->used = 0;
    b->next = a->head;
    a->head = b;
    a->total += size;
  }
have:;
  void *p = (char *)b->data + b->used;
  b->used += n;
  if (!b->fresh) memset(p, 0, n);
  return p;
}

char *arena_strndup(arena *a, const char *s, size_t n) {
  char *p = arena_alloc(a, n + 1);
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}

char *arena_strdup(arena *a, const char *s) { return arena_strndup(a, s, strlen(s)); }

char *arena_printf(arena *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  char *p = arena_alloc(a, (size_t)n + 1);
  va_start(ap, fmt);
  vsnprintf(p, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return p;
}

void arena_grow(arena *a, void **items, int *cap, int need, size_t elem) {
  if (need <= *cap) return;
  int ncap = *cap ? *cap : 4;
  while (ncap < need) {
    if (ncap > (1 << 29)) weft_oom();
    ncap *= 2;
  }
  void *n = arena_alloc(a, (size_t)ncap * elem);
  if (*cap) memcpy(n, *items, (size_t)*cap * elem);
  *items = n;
  *cap = ncap;
}
