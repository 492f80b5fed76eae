/* nvtx.h - the executor's ranges for NVIDIA's profilers, through NVTX (the
 * toolkit's header-only NVIDIA Tools Extension): a range for each pass and,
 * inside it, one for each instruction's launches, named as `weft run
 * --trace` names them and coloured by category, in the domain "weft", so
 * that Nsight Systems shows the program beside its kernels and Nsight
 * Compute can pick kernels by instruction. NVTX calls cost nothing unless
 * a tool collects them (it names its library in NVTX_INJECTION64_PATH);
 * then the names are registered once each. Built without NVTX's headers,
 * every call here does nothing. */
#ifndef WEFT_CUDA_NVTX_H
#define WEFT_CUDA_NVTX_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda/gpu.h"

typedef struct cnvtx cnvtx;

/* Categories: lower.h's (lower_category, 0 .. LCAT_COUNT - 1, as the
 * run's labels give them), then an allocation that clears its buffer, a
 * pass, the executor's own work (the clipping factor), and the plugin's
 * one-time choices of kernels (choice.h). */
enum { NVTX_MEMORY = 16, NVTX_PASS, NVTX_EXEC, NVTX_CHOICE, NVTX_CATEGORIES };

/* Room for the names of nkeys ranges; NULL when no tool collects ranges
 * (or NVTX is not built in), and every call below takes NULL. */
cnvtx *nvtx_new(int nkeys);
void nvtx_free(cnvtx *n);
/* Whether key's name is registered; registering it (once). */
/* cat below NVTX_CATEGORIES, named `category` where first seen; rgb its
 * colour, 0xRRGGBB. */
bool nvtx_named(const cnvtx *n, int key);
void nvtx_name(cnvtx *n, int key, int cat, const char *category, uint32_t rgb, const char *name);
/* A range of key's name, or of text (a pass's), on this thread until the
 * next pop. */
void nvtx_push(cnvtx *n, int key);
void nvtx_push_text(cnvtx *n, int cat, const char *category, uint32_t rgb, const char *text);
void nvtx_pop(cnvtx *n);
/* A range of one-time work (choice.h), wherever it comes: in the category
 * "choosing kernels", on this thread until nvtx_pop_choice; nothing when
 * no tool collects ranges. */
void nvtx_push_choice(const char *text);
void nvtx_pop_choice(void);
/* The name Nsight Systems gives a stream (on a GPU only). */
void nvtx_name_stream(cnvtx *n, gpu_stream *s, const char *name);

#endif
