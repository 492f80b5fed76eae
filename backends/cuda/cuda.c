/* cuda.c - the CUDA backend's entry in the registry (backend.h), exported
 * as weft_backend_cuda by libweft_cuda.so: every device of a plan a
 * virtual device of one GPU, kernels of its own and cuBLASLt. */
#include <stdlib.h>

#include "exec.h"
#include "gpu.h"

/* --check against the same kernels on whole tensors: f32 differs only in
 * the order of sums; 16-bit storage rounds every activation. */
static double cuda_tolerance(const weft_graph *g) {
  for (int t = 0; t < g->ntensors; t++)
    if (g->tensors[t].dtype == DT_BF16 || g->tensors[t].dtype == DT_F16) return 5e-2;
  return 1e-5;
}

const weft_backend weft_backend_cuda = {
    .version = WEFT_BACKEND_VERSION,
    .name = "cuda",
#ifdef WEFT_CUDA_EMU
    .summary = "every plan device a virtual device of one GPU, each with its stream and pool; this build emulates "
               "the GPU on the CPU, for tests",
#else
    .summary = "every plan device a virtual device of one GPU, each with its stream and pool; kernels of its own "
               "and cuBLASLt",
#endif
    .procs = crun_procs,
    .load_native = NULL,
    .open = crun_open,
    .run = crun_pass,
    .read = crun_read,
    .close = crun_close,
    .reference = crun_reference,
    .startup = NULL,
    .kernels = gpu_kernel_lines,
    .probe = crun_probe,
    .tolerance = cuda_tolerance,
    .failure = crun_failure,
    .describe = crun_describe,
    .agree = crun_agree,
    .devices_apart = true,
#ifdef WEFT_CUDA_EMU
    .trace_about = "time on the device's stream (CUDA events), from after an instruction's waits for other streams "
                   "to the end of its work; the emulation runs work in an order of its own, so its times say little",
#else
    .trace_about = "time on the device's stream (CUDA events), from after an instruction's waits for other streams "
                   "to the end of its work",
#endif
};
