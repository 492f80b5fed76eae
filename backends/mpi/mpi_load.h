/* mpi_load.h - finding and loading libweft_mpi.so (weft_mpi.h), for weft's
 * CPU backend (backends/cpu/net.c) and the CUDA plugin's rendezvous
 * (backends/cuda/rendezvous.c) alike. Plain C, no MPI. */
#ifndef WEFT_MPI_LOAD_H
#define WEFT_MPI_LOAD_H

#include <stddef.h>

#include "weft_mpi.h"

typedef enum {
  MPI_LOAD_OK,        /* loaded, of this version */
  MPI_LOAD_MISSING,   /* no file, or dlopen refused it (why says) */
  MPI_LOAD_WRONG,     /* a library without weft_mpi_plugin of WEFT_MPI_VERSION (why names it) */
} mpi_load_status;

/* Opens the plugin: WEFT_MPI_PLUGIN when set, else libweft_mpi.so in
 * WEFT_PLUGIN_DIR, in dir (NULL: none; the directory of the library that
 * asks), beside the running binary, then in ../lib/weft from it (where
 * `make install` puts plugins), the first that exists. RTLD_GLOBAL: Open
 * MPI loads components that need libmpi's symbols. On MPI_LOAD_OK *lib and
 * *api are set; tried lists what was looked at, why says what failed. */
mpi_load_status mpi_load(const char *dir, void **lib, const weft_mpi_api **api, char *tried, size_t triedlen,
                         char *why, size_t whylen);

#endif
