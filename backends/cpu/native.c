/* native.c - native kernels: dlopen and dlsym once per kernel, one libffi
 * call interface per shape of call, shared by every thread (native.h). */
#include "native.h"

#include <dlfcn.h>
#include <ffi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft/arena.h"

/* A prepared call interface for one shape of call of one kernel. */
typedef struct native_cif {
  bool backward;              /* the backward's argument list, or the forward's */
  int nin, nsizes;            /* tensor inputs and sizes it passes */
  ffi_cif cif;                /* what ffi_call needs of the shape, prepared once */
  ffi_type **types;           /* the argument types, which cif points into */
  struct native_cif *next;
} native_cif;

struct native_kernel {
  char *spec;                 /* "LIB:SYMBOL" as given */
  char *path;                 /* LIB joined to its directory: what dlopen was given */
  char *symbol;
  void *handle;               /* the dlopen handle, never closed */
  void (*fn)(void);           /* the symbol */
  /* prepared interfaces, newest first: added under native_lock, read without
   * it (a node is complete before it is published and is never changed) */
  _Atomic(native_cif *) cifs;
  native_kernel *next;        /* the next loaded kernel */
};

/* dlopen's handles belong to the process, and so does this table of the
 * kernels found in them; native_lock guards it and every prep of a cif. */
static pthread_mutex_t native_lock = PTHREAD_MUTEX_INITIALIZER;
static native_kernel *native_loaded;

static void *native_alloc(size_t n) {
  void *p = calloc(1, n ? n : 1);
  if (!p) weft_oom();
  return p;
}

static char *native_strndup(const char *s, size_t n) {
  char *p = native_alloc(n + 1);
  memcpy(p, s, n);
  return p;
}

/* LIB relative to dir: "./LIB" in the current directory, so that dlopen
 * never searches the system's library path for it. */
static char *native_join(const char *dir, const char *lib, size_t liblen) {
  if (lib[0] == '/') return native_strndup(lib, liblen);
  if (!dir || !*dir) dir = ".";
  size_t dl = strlen(dir);
  bool slash = dir[dl - 1] == '/';
  char *p = native_alloc(dl + 1 + liblen + 1);
  memcpy(p, dir, dl);
  if (!slash) p[dl++] = '/';
  memcpy(p + dl, lib, liblen);
  return p;
}

native_kernel *native_load(const char *spec, const char *dir, char *err, size_t errlen) {
  if (errlen) err[0] = 0;
  if (!spec) spec = "";
  const char *colon = strrchr(spec, ':');
  if (!colon || colon == spec || !colon[1]) {
    if (errlen) snprintf(err, errlen, "%s: not of the form LIB:SYMBOL", spec);
    return NULL;
  }
  char *path = native_join(dir, spec, (size_t)(colon - spec));
  const char *symbol = colon + 1;
  pthread_mutex_lock(&native_lock);
  native_kernel *k;
  for (k = native_loaded; k; k = k->next)
    if (strcmp(k->path, path) == 0 && strcmp(k->symbol, symbol) == 0) break;
  if (k) {
    pthread_mutex_unlock(&native_lock);
    free(path);
    return k;
  }
  /* dlerror's text is per thread; the lock keeps it paired with our call */
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    if (errlen) snprintf(err, errlen, "%s: cannot load the library: %s", spec, why ? why : "unknown error");
    pthread_mutex_unlock(&native_lock);
    free(path);
    return NULL;
  }
  dlerror();
  void *sym = dlsym(h, symbol);
  if (!sym) {
    if (errlen) snprintf(err, errlen, "%s: %s has no symbol '%s'", spec, path, symbol);
    pthread_mutex_unlock(&native_lock);
    dlclose(h);
    free(path);
    return NULL;
  }
  k = native_alloc(sizeof *k);
  k->spec = native_strndup(spec, strlen(spec));
  k->path = path;
  k->symbol = native_strndup(symbol, strlen(symbol));
  k->handle = h;
  /* POSIX guarantees that a data pointer from dlsym converts to a function pointer */
  memcpy(&k->fn, &sym, sizeof k->fn);
  atomic_init(&k->cifs, NULL);
  k->next = native_loaded;
  native_loaded = k;
  pthread_mutex_unlock(&native_lock);
  return k;
}

const char *native_spec(const native_kernel *k) { return k->spec; }
const char *native_path(const native_kernel *k) { return k->path; }

static native_cif *native_cif_find(native_cif *c, bool backward, int nin, int nsizes) {
  for (; c; c = c->next)
    if (c->backward == backward && c->nin == nin && c->nsizes == nsizes) return c;
  return NULL;
}

/* The call interface for this shape, prepared on first use. */
static native_cif *native_cif_get(native_kernel *k, bool backward, int nin, int nsizes) {
  if (nin < 0 || nin > NATIVE_MAX_INPUTS || nsizes < 0 || nsizes > NATIVE_MAX_SIZES) {
    fprintf(stderr, "weft: native kernel %s called with %d inputs and %d sizes (at most %d and %d)\n",
            k->spec, nin, nsizes, NATIVE_MAX_INPUTS, NATIVE_MAX_SIZES);
    abort();
  }
  native_cif *c = native_cif_find(atomic_load_explicit(&k->cifs, memory_order_acquire), backward, nin, nsizes);
  if (c) return c;
  pthread_mutex_lock(&native_lock);
  native_cif *head = atomic_load_explicit(&k->cifs, memory_order_relaxed);
  c = native_cif_find(head, backward, nin, nsizes);
  if (!c) {
    int nptr = backward ? 2 * nin + 1 : nin + 1;
    c = native_alloc(sizeof *c);
    c->backward = backward;
    c->nin = nin;
    c->nsizes = nsizes;
    c->types = native_alloc(sizeof(ffi_type *) * (size_t)(nptr + nsizes));
    for (int i = 0; i < nptr; i++) c->types[i] = &ffi_type_pointer;
    for (int i = 0; i < nsizes; i++) c->types[nptr + i] = &ffi_type_sint64;
    if (ffi_prep_cif(&c->cif, FFI_DEFAULT_ABI, (unsigned)(nptr + nsizes), &ffi_type_void, c->types) != FFI_OK) {
      fprintf(stderr, "weft: libffi cannot prepare a call of %s with %d arguments\n", k->spec, nptr + nsizes);
      abort();
    }
    c->next = head;
    atomic_store_explicit(&k->cifs, c, memory_order_release);
  }
  pthread_mutex_unlock(&native_lock);
  return c;
}

/* ffi_call reads each argument through a pointer to it: ptrs[] holds the
 * pointer arguments, sizes[] the integers. */
static void native_call(native_kernel *k, native_cif *c, void **ptrs, int nptr, const int64_t *sizes) {
  void *args[2 * NATIVE_MAX_INPUTS + 1 + NATIVE_MAX_SIZES];
  for (int i = 0; i < nptr; i++) args[i] = &ptrs[i];
  for (int i = 0; i < c->nsizes; i++) args[nptr + i] = (void *)&sizes[i];
  ffi_arg ret;
  ffi_call(&c->cif, k->fn, &ret, args);
}

void native_forward(native_kernel *k, float *out, int nin, const float *const *in,
                    int nsizes, const int64_t *sizes) {
  native_cif *c = native_cif_get(k, false, nin, nsizes);
  void *ptrs[NATIVE_MAX_INPUTS + 1];
  ptrs[0] = out;
  for (int i = 0; i < nin; i++) ptrs[1 + i] = (void *)in[i];
  native_call(k, c, ptrs, nin + 1, sizes);
}

void native_backward(native_kernel *k, float *const *din, int nin, const float *dout,
                     const float *const *in, int nsizes, const int64_t *sizes) {
  native_cif *c = native_cif_get(k, true, nin, nsizes);
  void *ptrs[2 * NATIVE_MAX_INPUTS + 1];
  for (int i = 0; i < nin; i++) ptrs[i] = din[i];
  ptrs[nin] = (void *)dout;
  for (int i = 0; i < nin; i++) ptrs[nin + 1 + i] = (void *)in[i];
  native_call(k, c, ptrs, 2 * nin + 1, sizes);
}
