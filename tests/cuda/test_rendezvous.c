/* test_rendezvous.c - one process of a rendezvous (backends/cuda/rendezvous.h)
 * as the CUDA backend holds it, for tests/rendezvous_check.sh:
 *   test_rendezvous file:PATH RANK NPROCS TIMEOUT [DELAY]
 *   test_rendezvous mpi DIR TIMEOUT          (under mpirun; DIR: libweft_mpi.so's)
 * Process 0 draws an id of 128 random bytes (after DELAY seconds) and
 * shares it; every process prints "process R of N: id HEX" and exits 0, or
 * prints the message and exits 2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/rendezvous.h"

enum { ID_BYTES = 128 };

static void random_id(unsigned char *id) {
  FILE *f = fopen("/dev/urandom", "rb");
  if (!f || fread(id, 1, ID_BYTES, f) != ID_BYTES) {
    fprintf(stderr, "test_rendezvous: cannot read /dev/urandom\n");
    exit(2);
  }
  fclose(f);
}

static void print_id(int rank, int nprocs, const unsigned char *id) {
  printf("process %d of %d: id ", rank, nprocs);
  for (int i = 0; i < ID_BYTES; i++) printf("%02x", id[i]);
  printf("\n");
}

int main(int argc, char **argv) {
  char err[1024];
  unsigned char id[ID_BYTES];
  memset(id, 0, sizeof id);
  rdv r;
  if (argc < 2 || !rdv_parse(argv[1], &r, err, sizeof err)) {
    fprintf(stderr, "%s\n", argc < 2 ? "usage: test_rendezvous file:PATH RANK NPROCS TIMEOUT [DELAY] | mpi DIR TIMEOUT" : err);
    return 2;
  }
  if (r.kind == RDV_MPI) {
    if (argc != 4) return fprintf(stderr, "usage: test_rendezvous mpi DIR TIMEOUT\n"), 2;
    int rank = 0, size = 1;
    rdv_mpi *m = rdv_mpi_open(argv[2], atof(argv[3]), &rank, &size, err, sizeof err);
    if (!m) return fprintf(stderr, "test_rendezvous: %s\n", err), 2;
    if (rank == 0) random_id(id);
    if (!rdv_share(&r, rank, size, id, sizeof id, atof(argv[3]), rdv_mpi_bcast, m, err, sizeof err)) {
      fprintf(stderr, "test_rendezvous: %s\n", err);
      rdv_mpi_abort(m, 2);
    }
    print_id(rank, size, id);
    rdv_mpi_close(m);
    return 0;
  }
  if (argc < 5) return fprintf(stderr, "usage: test_rendezvous file:PATH RANK NPROCS TIMEOUT [DELAY]\n"), 2;
  int rank = atoi(argv[2]), nprocs = atoi(argv[3]);
  double timeout = atof(argv[4]);
  if (rank == 0) {
    double delay = argc > 5 ? atof(argv[5]) : 0;
    struct timespec ts = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
    nanosleep(&ts, NULL);
    random_id(id);
  }
  if (!rdv_share(&r, rank, nprocs, id, sizeof id, timeout, NULL, NULL, err, sizeof err)) {
    fprintf(stderr, "test_rendezvous: %s\n", err);
    return 2;
  }
  print_id(rank, nprocs, id);
  return 0;
}
