/* nvtx_record.c - a profiler's stand-in for tests/cuda_check.sh: an NVTX
 * injection library (what Nsight Systems gives a process through
 * NVTX_INJECTION64_PATH) that writes every domain, category, range pushed
 * and pop it is given, one a line, to the file NVTX_RECORD names:
 *     domain NAME
 *     category DOMAIN ID NAME
 *     push DOMAIN CATEGORY AARRGGBB TEXT
 *     pop DOMAIN
 *     stream NAME
 * DOMAIN is the domain's number in the order they were created (0: none);
 * a stream's line is a CUDA stream named (nvtxNameCuStreamA). The NVTX
 * calls of other modules are left unanswered (no-ops). */
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *out;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int ndomains;

/* a domain is its number; a registered string, a copy of it */
static uintptr_t dom_id(nvtxDomainHandle_t d) { return (uintptr_t)d; }

static nvtxDomainHandle_t NVTX_API domain_create(const char *name) {
  pthread_mutex_lock(&lock);
  int id = ++ndomains;
  fprintf(out, "domain %s\n", name ? name : "");
  pthread_mutex_unlock(&lock);
  return (nvtxDomainHandle_t)(uintptr_t)id;
}

static void NVTX_API name_category(nvtxDomainHandle_t d, uint32_t c, const char *name) {
  pthread_mutex_lock(&lock);
  fprintf(out, "category %lu %u %s\n", (unsigned long)dom_id(d), c, name ? name : "");
  pthread_mutex_unlock(&lock);
}

/* the registered strings, kept until the process ends (as a tool keeps them) */
static char **strings;
static size_t nstrings, cap;

static nvtxStringHandle_t NVTX_API register_string(nvtxDomainHandle_t d, const char *s) {
  pthread_mutex_lock(&lock);
  char *copy = NULL;
  if (nstrings == cap) {
    size_t more = cap ? 2 * cap : 256;
    char **p = realloc(strings, more * sizeof *p);
    if (p) strings = p, cap = more;
  }
  if (nstrings < cap && (copy = strdup(s ? s : ""))) strings[nstrings++] = copy;
  pthread_mutex_unlock(&lock);
  return (nvtxStringHandle_t)copy;
}

static int NVTX_API push(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
  const char *text = "?";
  if (a->messageType == NVTX_MESSAGE_TYPE_ASCII && a->message.ascii) text = a->message.ascii;
  else if (a->messageType == NVTX_MESSAGE_TYPE_REGISTERED && a->message.registered)
    text = (const char *)a->message.registered;
  pthread_mutex_lock(&lock);
  fprintf(out, "push %lu %u %08x %s\n", (unsigned long)dom_id(d), a->category,
          a->colorType == NVTX_COLOR_ARGB ? a->color : 0, text);
  pthread_mutex_unlock(&lock);
  return 0;
}

static int NVTX_API pop(nvtxDomainHandle_t d) {
  pthread_mutex_lock(&lock);
  fprintf(out, "pop %lu\n", (unsigned long)dom_id(d));
  pthread_mutex_unlock(&lock);
  return 0;
}

static void NVTX_API name_stream(void *stream, const char *name) {
  pthread_mutex_lock(&lock);
  fprintf(out, "stream %s\n", name ? name : "");
  pthread_mutex_unlock(&lock);
}

static void close_out(void) {
  if (out) fclose(out);
  out = NULL;
  for (size_t i = 0; i < nstrings; i++) free(strings[i]);
  free(strings);
  strings = NULL, nstrings = cap = 0;
}

int NVTX_API InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get) {
  const char *path = getenv("NVTX_RECORD");
  if (!path || !(out = fopen(path, "w"))) return 0;
  atexit(close_out);
  const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)get(NVTX_ETID_CALLBACKS);
  NvtxFunctionTable t = NULL;
  unsigned int n = 0;
  if (!cb || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &t, &n) || !t || n <= NVTX_CBID_CORE2_DomainCreateA)
    return 0;
  *t[NVTX_CBID_CORE2_DomainCreateA] = (NvtxFunctionPointer)domain_create;
  *t[NVTX_CBID_CORE2_DomainNameCategoryA] = (NvtxFunctionPointer)name_category;
  *t[NVTX_CBID_CORE2_DomainRegisterStringA] = (NvtxFunctionPointer)register_string;
  *t[NVTX_CBID_CORE2_DomainRangePushEx] = (NvtxFunctionPointer)push;
  *t[NVTX_CBID_CORE2_DomainRangePop] = (NvtxFunctionPointer)pop;
  if (cb->GetModuleFunctionTable(NVTX_CB_MODULE_CUDA, &t, &n) && t && n > NVTX_CBID_CUDA_NameCuStreamA)
    *t[NVTX_CBID_CUDA_NameCuStreamA] = (NvtxFunctionPointer)name_stream;
  return 1;
}
