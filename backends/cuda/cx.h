/* cx.h - the CUDA backend's host side: what it reads of a program
 * (regions, attributes), region moves as the kernels take them, and the
 * pool allocator of its planning. Plain C, no CUDA: the unit tests
 * (tests/unit/test_cuda_plan.c) build it alone.
 *
 * The plugin links nothing of weft's library: it reads the program through
 * the structures and inline functions of weft/lower.h, and these helpers
 * stand in for the few functions it would otherwise call. */
#ifndef WEFT_CUDA_CX_H
#define WEFT_CUDA_CX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda/gpu.h"
#include "weft/lower.h"

void *cx_alloc(size_t n);            /* zeroed; aborts when memory runs out */
void *cx_grow(void *p, size_t n);

/* ---- regions ------------------------------------------------------------------ */

int64_t cx_dlen(const dregion *d);
int64_t cx_numel(const tregion *r);
bool cx_equal(const tregion *a, const tregion *b);
int64_t cx_tensor_numel(const gtensor *t);
/* The whole of tensor t: dims and iv hold t->ndims entries each. */
tregion cx_whole(const gtensor *t, dregion *dims, irange *iv);
/* The intersection of a and b in out (dims and intervals from a fresh
 * allocation the caller frees with cx_region_free); false when empty. */
bool cx_intersect(const tregion *a, const tregion *b, tregion *out);
void cx_region_free(tregion *r);
/* A numeric attribute of operator op, or dflt. */
double cx_attr(const weft_graph *g, int op, const char *name, double dflt);

/* ---- region moves ----------------------------------------------------------------- */

/* Positions of strided dimensions, shared by the moves of one device side:
 * uploaded once, read by the kernels through gpu_rmove's tables. */
typedef struct cx_tables {
  int32_t *v;
  int64_t n, cap;
} cx_tables;

/* A move (gpu.h, gpu_rmove) whose tables are offsets into a cx_tables. */
typedef struct cx_move {
  gpu_rmove m;             /* table pointers NULL */
  int64_t tab[2][GPU_MAX_DIMS];  /* src, dst: offset of dimension d's table, -1: none */
} cx_move;

/* The move of region r from a holder of region src to one of region dst
 * (r inside both); contiguous dimensions merged. False with a message
 * when r is not inside them or a table would pass 2^31 positions. */
bool cx_move_build(cx_move *mv, cx_tables *t, const tregion *r, const tregion *src, const tregion *dst, char *err,
                   size_t errlen);
/* The move with its tables at `tables` (device or host memory). */
gpu_rmove cx_move_at(const cx_move *mv, const int32_t *tables);
/* The move on the host: dst (+)= src for f32, or copies of 4-byte elements. */
void cx_move_host(float *dst, const float *src, const cx_move *mv, const cx_tables *t, bool add);

/* ---- the pool allocator -------------------------------------------------------------- */

/* Offsets in one device's pool, planned before anything runs. A range
 * that another stream read is freed with the events of those reads: who
 * takes it next waits for them. */
typedef struct cx_free {
  int64_t lo, hi;
  int *ev, nev, cap;
} cx_free;

typedef struct cx_pool {
  int64_t base, top;       /* offsets from base; top: the high-water mark */
  cx_free *fr;             /* free ranges below top, sorted, disjoint */
  int nfr, cap;
} cx_pool;

enum { CX_ALIGN = 256 };

void cx_pool_init(cx_pool *p, int64_t base);
void cx_pool_free_all(cx_pool *p);
/* bytes (rounded up to CX_ALIGN) at the lowest offset that fits; the
 * events its memory waits for are added to *ev (each once). */
int64_t cx_pool_alloc(cx_pool *p, int64_t bytes, int **ev, int *nev, int *cap);
void cx_pool_release(cx_pool *p, int64_t off, int64_t bytes, const int *ev, int nev);

#endif
