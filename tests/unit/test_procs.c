/* test_procs.c - where a process of `weft run` stands among those its
 * launcher started (backends/cpu/net.h, xnet_env): from MPI's variables,
 * from Slurm's under srun without MPI, MPI's first when both are there. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "cpu/net.h"

static const char *const all_vars[] = {
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_SIZE", "PMIX_RANK",
    "PMIX_LOCAL_RANK", "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "SLURM_STEP_ID", "SLURM_STEPID",
    "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID",
};

static int clean(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof all_vars / sizeof *all_vars; i++) unsetenv(all_vars[i]);
  return 0;
}

static void expect(int rank, int size, int local, xprocs_from from) {
  xprocs p = xnet_env();
  assert_int_equal(p.rank, rank);
  assert_int_equal(p.size, size);
  assert_int_equal(p.local, local);
  assert_int_equal(p.from, from);
  int r = -1, s = -1;
  xnet_procs(&r, &s);
  assert_int_equal(r, rank);
  assert_int_equal(s, size);
}

static void test_alone(void **state) {
  (void)state;
  expect(0, 1, 0, XPROCS_ALONE);
}

static void test_open_mpi(void **state) {
  (void)state;
  setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
  setenv("OMPI_COMM_WORLD_RANK", "5", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  expect(5, 8, 1, XPROCS_MPI);
}

static void test_pmix(void **state) {
  (void)state;
  setenv("PMIX_SIZE", "4", 1);
  setenv("PMIX_RANK", "3", 1);
  expect(3, 4, 0, XPROCS_MPI);  /* no local rank given */
  setenv("PMIX_LOCAL_RANK", "2", 1);
  expect(3, 4, 2, XPROCS_MPI);
}

static void test_slurm(void **state) {
  (void)state;
  setenv("SLURM_NTASKS", "16", 1);
  setenv("SLURM_PROCID", "9", 1);
  setenv("SLURM_LOCALID", "1", 1);
  /* a batch script is one process, whatever SLURM_NTASKS says */
  expect(0, 1, 0, XPROCS_ALONE);
  setenv("SLURM_STEP_ID", "0", 1);
  expect(9, 16, 1, XPROCS_SLURM);
  unsetenv("SLURM_STEP_ID");
  setenv("SLURM_STEPID", "2", 1);
  expect(9, 16, 1, XPROCS_SLURM);
}

static void test_mpi_first(void **state) {
  (void)state;
  setenv("SLURM_STEP_ID", "0", 1);
  setenv("SLURM_NTASKS", "16", 1);
  setenv("SLURM_PROCID", "9", 1);
  setenv("SLURM_LOCALID", "1", 1);
  /* srun --mpi=pmix sets both: MPI's rank is the one MPI_Init gives */
  setenv("PMIX_SIZE", "16", 1);
  setenv("PMIX_RANK", "12", 1);
  setenv("PMIX_LOCAL_RANK", "0", 1);
  expect(12, 16, 0, XPROCS_MPI);
  /* MPI's variables that name one process leave Slurm's */
  setenv("PMIX_SIZE", "1", 1);
  setenv("PMIX_RANK", "0", 1);
  expect(9, 16, 1, XPROCS_SLURM);
}

static void test_malformed(void **state) {
  (void)state;
  setenv("SLURM_STEP_ID", "0", 1);
  setenv("SLURM_NTASKS", "4", 1);
  const char *bad[] = {"", "-1", "x", "2x", " 2", "99999999999", "4"};  /* "4": not below the size */
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    setenv("SLURM_PROCID", bad[i], 1);
    expect(0, 1, 0, XPROCS_ALONE);
  }
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_LOCALID", "y", 1);
  expect(3, 4, 0, XPROCS_SLURM);
  setenv("SLURM_NTASKS", "1", 1);
  setenv("SLURM_PROCID", "0", 1);
  expect(0, 1, 0, XPROCS_ALONE);
  /* a malformed MPI size falls through to Slurm */
  setenv("SLURM_NTASKS", "4", 1);
  setenv("SLURM_PROCID", "2", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "four", 1);
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  expect(2, 4, 0, XPROCS_SLURM);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_alone, clean),       cmocka_unit_test_setup(test_open_mpi, clean),
      cmocka_unit_test_setup(test_pmix, clean),        cmocka_unit_test_setup(test_slurm, clean),
      cmocka_unit_test_setup(test_mpi_first, clean),   cmocka_unit_test_setup(test_malformed, clean),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
