/* mpi_load.c - finds and loads libweft_mpi.so (mpi_load.h). */
#include "mpi_load.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

mpi_load_status mpi_load(const char *dir, void **lib, const weft_mpi_api **api, char *tried, size_t triedlen,
                         char *why, size_t whylen) {
  *lib = NULL, *api = NULL;
  if (triedlen) tried[0] = 0;
  if (whylen) why[0] = 0;
  const char *env = getenv("WEFT_MPI_PLUGIN");
  char path[PATH_MAX + 64];
  if (env && *env) {
    snprintf(tried, triedlen, "%s", env);
    snprintf(path, sizeof path, "%s", env);
    *lib = dlopen(env, RTLD_NOW | RTLD_GLOBAL);
  } else {
    char exe[PATH_MAX] = "";
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
      exe[len] = 0;
      char *slash = strrchr(exe, '/');
      if (slash) *slash = 0;
    } else {
      exe[0] = 0;
    }
    const char *dirs[4] = {getenv("WEFT_PLUGIN_DIR"), dir, exe[0] ? exe : NULL, exe[0] ? exe : NULL};
    size_t k = 0;
    for (int i = 0; i < 4 && !*lib; i++) {
      if (!dirs[i] || !*dirs[i]) continue;
      snprintf(path, sizeof path, i == 3 ? "%s/../lib/weft/libweft_mpi.so" : "%s/libweft_mpi.so", dirs[i]);
      if (strstr(tried, path)) continue;
      k += (size_t)snprintf(tried + k, k < triedlen ? triedlen - k : 0, "%s%s", k ? ", " : "", path);
      if (access(path, F_OK) != 0) continue;
      *lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
      if (!*lib) break;
    }
  }
  if (!*lib) {
    const char *e = dlerror();
    snprintf(why, whylen, "%s", e ? e : "not found");
    return MPI_LOAD_MISSING;
  }
  const weft_mpi_api *(*get)(void) = (const weft_mpi_api *(*)(void))dlsym(*lib, "weft_mpi_plugin");
  const weft_mpi_api *a = get ? get() : NULL;
  if (!a || a->version != WEFT_MPI_VERSION) {
    snprintf(why, whylen, "%s is not a weft MPI plugin of version %d", path, WEFT_MPI_VERSION);
    dlclose(*lib);
    *lib = NULL;
    return MPI_LOAD_WRONG;
  }
  *api = a;
  return MPI_LOAD_OK;
}
