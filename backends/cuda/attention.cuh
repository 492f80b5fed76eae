/* attention.cuh - the two implementations of attention (attention.cu on
 * CUDA cores, attention_tc.cu on tensor cores) as each calls the other. */
#ifndef WEFT_CUDA_ATTENTION_CUH
#define WEFT_CUDA_ATTENTION_CUH

#include "gpu.h"

/* Shared memory a block may have on the current GPU. */
size_t attention_smem_limit(void);
/* Whether the tensor-core kernels take these heads in this type. */
bool attention_tc_takes(int dt, const gpu_attn *a);
void attention_tc_forward(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v,
                          const gpu_attn *a);
/* lse, dsum: the workspace of gpu_attention_backward. */
void attention_tc_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                           const void *k, const void *v, const gpu_attn *a, bool acc, float *lse, float *dsum);

#endif
