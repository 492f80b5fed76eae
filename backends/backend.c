/* backend.c - the registry of backends (backend.h): those built into weft,
 * and plugins, libweft_NAME.so beside the binary, loaded by name. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/cpu.h"
#include "weft/backend.h"

/* The backends of this build, the default first. */
static const weft_backend *const builtins[] = {&weft_backend_cpu};

/* Backends that need libraries weft must run without live in plugins: the
 * table is the symbol weft_backend_NAME of libweft_NAME.so (backends/cuda). */
static const char *const plugins[] = {"cuda"};

enum { NBUILTIN = sizeof builtins / sizeof builtins[0], NPLUGINS = sizeof plugins / sizeof plugins[0] };

const weft_backend *const *backend_builtin(int *n) {
  *n = NBUILTIN;
  return builtins;
}

const char *const *backend_plugins(int *n) {
  *n = NPLUGINS;
  return plugins;
}

void backend_origin(const weft_backend *b, char *path, size_t n) {
  Dl_info info;
  if (n) path[0] = 0;
  for (int i = 0; i < NBUILTIN; i++)
    if (builtins[i] == b) return;
  if (dladdr(b, &info) && info.dli_fname) snprintf(path, n, "%s", info.dli_fname);
}

void backend_startup(void) {
  for (int i = 0; i < NBUILTIN; i++)
    if (builtins[i]->startup) builtins[i]->startup();
}

/* "cpu, ..." */
static void names(char *buf, size_t n) {
  size_t k = 0;
  buf[0] = 0;
  for (int i = 0; i < NBUILTIN && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%s", i ? ", " : "", builtins[i]->name);
}

void *backend_dlopen(const char *file, int flags, char *tried, size_t n, bool *found) {
  char exe[PATH_MAX];
  const char *dirs[3];
  int nd = 0;
  const char *env = getenv("WEFT_PLUGIN_DIR");
  if (env && *env) dirs[nd++] = env;
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    dirs[nd++] = exe;
    dirs[nd++] = NULL;  /* exe/../lib/weft */
  }
  size_t k = 0;
  if (n) tried[0] = 0;
  *found = false;
  for (int i = 0; i < nd; i++) {
    char path[PATH_MAX + 64];
    if (dirs[i]) snprintf(path, sizeof path, "%s/%s", dirs[i], file);
    else snprintf(path, sizeof path, "%s/../lib/weft/%s", exe, file);
    k += (size_t)snprintf(tried + k, k < n ? n - k : 0, "%s%s", i ? ", " : "", path);
    if (access(path, F_OK) != 0) continue;
    *found = true;
    return dlopen(path, flags);
  }
  return NULL;
}

static const weft_backend *load_plugin(const char *name, char *err, size_t errlen) {
  char list[256], file[128], sym[128], tried[3 * PATH_MAX + 64];
  names(list, sizeof list);
  snprintf(file, sizeof file, "libweft_%s.so", name);
  bool found;
  void *lib = backend_dlopen(file, RTLD_NOW | RTLD_LOCAL, tried, sizeof tried, &found);
  if (!lib) {
    if (!found)
      snprintf(err, errlen, "backend '%s' is not available; this build runs plans on: %s (%s is a plugin, %s, "
               "not built beside weft)", name, list, name, file);
    else snprintf(err, errlen, "backend '%s': %s", name, dlerror());
    return NULL;
  }
  snprintf(sym, sizeof sym, "weft_backend_%s", name);
  const weft_backend *b = dlsym(lib, sym);
  if (!b || b->version != WEFT_BACKEND_VERSION) {
    snprintf(err, errlen, "backend '%s': %s has no %s of version %d (looked in %s)", name, file, sym,
             WEFT_BACKEND_VERSION, tried);
    dlclose(lib);
    return NULL;
  }
  /* the library stays loaded: the table and its functions live in it */
  return b;
}

const weft_backend *backend_find(const char *name, char *err, size_t errlen) {
  for (int i = 0; i < NBUILTIN; i++)
    if (strcmp(builtins[i]->name, name) == 0) return builtins[i];
  for (int i = 0; i < NPLUGINS; i++)
    if (strcmp(plugins[i], name) == 0) return load_plugin(name, err, errlen);
  char list[256];
  names(list, sizeof list);
  snprintf(err, errlen, "backend '%s' is not available; this build runs plans on: %s", name, list);
  return NULL;
}
