/* nvtx.c - NVTX ranges of the executor (nvtx.h). WEFT_NVTX is defined
 * where the build found NVTX's headers (the CUDA toolkit's nvtx3). */
#include "nvtx.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef WEFT_NVTX

#include <nvtx3/nvToolsExt.h>
#ifndef WEFT_CUDA_EMU
#include <nvtx3/nvToolsExtCuda.h>
#endif

struct cnvtx {
  nvtxDomainHandle_t dom;
  int nkeys;
  nvtxStringHandle_t *name; /* per key, 0 until named */
  uint8_t *cat;             /* per key */
  uint32_t *rgb;            /* per key */
};

/* The domain of every run of the process, created at the first; NULL
 * when no tool collects ranges. Its categories are named once each. */
static nvtxDomainHandle_t dom;
static bool named_cat[NVTX_CATEGORIES];

static nvtxDomainHandle_t domain(void) {
  static bool tried;
  if (!tried) tried = true, dom = nvtxDomainCreateA("weft");
  return dom;
}

/* cat within the categories, named `category` the first time it comes */
static int category_id(int cat, const char *category) {
  if (cat < 0 || cat >= NVTX_CATEGORIES) cat = NVTX_EXEC;
  if (!named_cat[cat]) named_cat[cat] = true, nvtxDomainNameCategoryA(dom, (uint32_t)cat + 1, category);
  return cat;
}

static void attrs(nvtxEventAttributes_t *a, int cat, uint32_t rgb) {
  *a = (nvtxEventAttributes_t){0};
  a->version = NVTX_VERSION;
  a->size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a->category = (uint32_t)cat + 1;
  a->colorType = NVTX_COLOR_ARGB;
  a->color = 0xff000000u | rgb;
}

cnvtx *nvtx_new(int nkeys) {
  nvtxDomainHandle_t dom = domain();
  if (!dom || nkeys < 0) return NULL;
  cnvtx *n = calloc(1, sizeof *n);
  if (!n) return NULL;
  n->dom = dom, n->nkeys = nkeys;
  n->name = calloc((size_t)nkeys + 1, sizeof *n->name);
  n->cat = calloc((size_t)nkeys + 1, sizeof *n->cat);
  n->rgb = calloc((size_t)nkeys + 1, sizeof *n->rgb);
  if (!n->name || !n->cat || !n->rgb) {
    nvtx_free(n);
    return NULL;
  }
  return n;
}

void nvtx_free(cnvtx *n) {
  if (!n) return;
  free(n->name), free(n->cat), free(n->rgb);
  free(n);
}

bool nvtx_named(const cnvtx *n, int key) { return n && key >= 0 && key < n->nkeys && n->name[key]; }

void nvtx_name(cnvtx *n, int key, int cat, const char *category, uint32_t rgb, const char *name) {
  if (!n || key < 0 || key >= n->nkeys || n->name[key]) return;
  n->name[key] = nvtxDomainRegisterStringA(n->dom, name);
  n->cat[key] = (uint8_t)category_id(cat, category), n->rgb[key] = rgb;
}

void nvtx_push(cnvtx *n, int key) {
  if (!n || key < 0 || key >= n->nkeys) return;
  nvtxEventAttributes_t a;
  attrs(&a, n->cat[key], n->rgb[key]);
  a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  a.message.registered = n->name[key];
  nvtxDomainRangePushEx(n->dom, &a);
}

void nvtx_push_text(cnvtx *n, int cat, const char *category, uint32_t rgb, const char *text) {
  if (!n) return;
  nvtxEventAttributes_t a;
  attrs(&a, category_id(cat, category), rgb);
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = text;
  nvtxDomainRangePushEx(n->dom, &a);
}

void nvtx_pop(cnvtx *n) {
  if (n) nvtxDomainRangePop(n->dom);
}

void nvtx_push_choice(const char *text) {
  if (!domain()) return;
  nvtxEventAttributes_t a;
  attrs(&a, category_id(NVTX_CHOICE, "choosing kernels"), 0xedc948);
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = text;
  nvtxDomainRangePushEx(dom, &a);
}

void nvtx_pop_choice(void) {
  if (domain()) nvtxDomainRangePop(dom);
}

void nvtx_name_stream(cnvtx *n, gpu_stream *s, const char *name) {
#ifndef WEFT_CUDA_EMU
  /* a gpu_stream is the runtime's cudaStream_t, which is the driver's CUstream */
  if (n && s) nvtxNameCuStreamA((CUstream)s, name);
#endif
}

#else /* no NVTX */

cnvtx *nvtx_new(int nkeys) { return NULL; }
void nvtx_free(cnvtx *n) {}
bool nvtx_named(const cnvtx *n, int key) { return false; }
void nvtx_name(cnvtx *n, int key, int cat, const char *category, uint32_t rgb, const char *name) {}
void nvtx_push(cnvtx *n, int key) {}
void nvtx_push_text(cnvtx *n, int cat, const char *category, uint32_t rgb, const char *text) {}
void nvtx_pop(cnvtx *n) {}
void nvtx_push_choice(const char *text) {}
void nvtx_pop_choice(void) {}
void nvtx_name_stream(cnvtx *n, gpu_stream *s, const char *name) {}

#endif
