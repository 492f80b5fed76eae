/* cpu.c - the CPU backend's entry in the registry (backend.h): every device
 * of the plan a thread, real numerics in f32, MPI between processes. */
#include "cpu.h"
#include "exec.h"
#include "kernels.h"
#include "native.h"
#include "net.h"

static bool cpu_load_native(const char *spec, const char *dir, char *err, size_t errlen) {
  return native_load(spec, dir, err, errlen) != NULL;
}

static const char *const cpu_kernels[] = {
    "every operator of stdlib/ops.plan, forward and backward, in f32; matrix products through OpenBLAS "
    "(backends/cpu/kernels.c)",
    "operators with native kernels, through libffi (weft run --allow-native)",
    NULL,
};

const weft_backend weft_backend_cpu = {
  .version = WEFT_BACKEND_VERSION,
  .name = "cpu",
  .summary = "every device a thread of this machine, kernels in f32 (OpenBLAS); processes under mpirun",
  .procs = xnet_procs,
  .load_native = cpu_load_native,
  .open = xrun_open,
  .run = xrun_steps,
  .read = xrun_read,
  .close = xrun_close,
  .reference = xrun_reference,
  .startup = k_blas_single,
  .kernels = cpu_kernels,
  .agree = xrun_agree,
};
