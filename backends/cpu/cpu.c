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

/* --check's tolerance: 1e-5, and 1e-4 for a model whose parameters are
 * 16-bit. Those are rounded to their dtype after every step, so where the
 * plan's sums and the reference's differ in f32's last bits on either side
 * of a rounding boundary, the two parameters differ by a step of the
 * 16-bit type (2^-8 relative for bf16), and the next steps' losses and
 * norms by up to about 1e-5, depending on the machine's BLAS kernels. */
static double cpu_tolerance(const weft_graph *g) {
  for (int t = 0; t < g->ntensors; t++)
    if (g->tensors[t].role == TENSOR_PARAM && (g->tensors[t].dtype == DT_BF16 || g->tensors[t].dtype == DT_F16))
      return 1e-4;
  return 1e-5;
}

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
  .tolerance = cpu_tolerance,
  .trace_about = "wall time of the device's thread in each instruction, waits for messages and collectives included",
};
