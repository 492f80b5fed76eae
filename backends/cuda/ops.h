/* ops.h - one operator of the model on packed parts in device memory: the
 * table that maps the operators of stdlib/ops.plan to the kernels of gpu.h,
 * with the sizes read from the parts' regions as the CPU backend reads
 * them (backends/cpu/xops.c). */
#ifndef WEFT_CUDA_OPS_H
#define WEFT_CUDA_OPS_H

#include "cuda/cx.h"

enum { CX_MAX_INPUTS = 16 };

typedef struct ckernel ckernel;

/* The kernels of operator op; NULL with a message when this backend has
 * none (a native kernel, an operator it does not know). */
const ckernel *ckernel_find(const weft_graph *g, int op, char *err, size_t errlen);
bool ckernel_is_loss(const ckernel *k);
/* The type its kernels compute in and store every floating argument as:
 * the first floating input's (ids are i32, statistics f32). */
int ckernel_dtype(const weft_graph *g, int op);
/* Whether input arg holds ids (int32). */
bool ckernel_ids(const ckernel *k, int arg);
/* Whether its kernels write every element of what they write when not
 * accumulating (so that a buffer need not be cleared before). */
bool ckernel_overwrites(const ckernel *k);
/* Whether k is a loss whose forward can write the gradient of its first
 * input over that input, with its loss (ccall.grad_in_place): cross
 * entropy over the whole vocabulary. */
bool ckernel_grad_in_place(const ckernel *k);
/* Whether its backward gives each input its result's gradient unchanged
 * (the inputs and the result of one shape and type). */
bool ckernel_passes_grad(const ckernel *k);
/* Whether k's calls take a buffer with padded rows (ccall.pitch_*) as the
 * given ref of a call (arg: the input it is or whose gradient it is, -1 the
 * result or its gradient; out: an output of the call): a matmul_t's result
 * and its gradient, a cross entropy's logits and their gradient. */
bool ckernel_pitched(const ckernel *k, bool backward, int arg, bool out);
/* Whether the backward adds to the gradient of input arg in place; else
 * it is written (not added to) in scratch, ccall.own, and added after. */
bool ckernel_adds_in_place(const ckernel *k, int arg);
/* Whether the backward can write the gradient of input arg in f32 when it
 * computes in 16 bits (ccall.f32din), with no copy in between. */
bool ckernel_f32_grad(const ckernel *k, int arg);

/* One call, as xcall: pointers are device memory, packed row-major parts
 * of the regions given, of type dt (ids int32, stats f32). */
typedef struct ccall {
  const weft_graph *g;
  int op;
  const ckernel *k;
  bool backward;
  uint8_t part;                     /* lins_part */
  int dt;
  int nin;
  const void *in[CX_MAX_INPUTS];
  const tregion *inr[CX_MAX_INPUTS];
  void *out;                        /* forward: the result; LP_STATS: the statistics */
  const tregion *outr;
  const void *dy;                   /* backward: the gradient of the result, NULL: none */
  const tregion *dyr;
  void *din[CX_MAX_INPUTS];
  unsigned own;                     /* bit a: din[a] is scratch written whole, not added to, even
                                     * with acc (an input's gradient !ckernel_adds_in_place) */
  unsigned f32din;                  /* bit a: din[a] holds f32 (a weight's gradient kept in f32
                                     * while the operator computes in 16 bits), else dt */
  const float *stats;               /* LP_COMBINE: the gathered statistics */
  void *keep;                       /* ccall_keep bytes the forward writes and its backward reads
                                     * (attention: each row's log-sum-exp), NULL: none kept */
  const void *fwd_out;              /* backward with keep: the result its forward wrote, packed
                                     * as dy */
  const tregion *statsr;
  bool acc;
  /* a linear's call fused with the GELU after it (gpu_epi): GPU_EPI_GELU,
   * the forward writes out and gelu(out) into epi_ptr; GPU_EPI_DGELU, the
   * backward's din[0] is times gelu'(epi_ptr), the GELU's input. With the
   * residual's add after it, GPU_EPI_RESID: the forward writes its result
   * plus epi_in into epi_ptr, and not out */
  int epi;
  void *epi_ptr;
  const void *epi_in;
  /* elements from one row to the next of in[0], din[0], out and dy where
   * their buffer's rows are padded to 16 bytes (0: packed): the logits of a
   * vocabulary of 50257 (ckernel_pitched) */
  int64_t pitch_in0, pitch_din0, pitch_out, pitch_dy;
  double *slot;                     /* a loss's share, NULL: not this copy's to count */
  /* a loss's forward (ckernel_grad_in_place) that also writes din[0], the
   * gradient of its first input, over that input (din[0] == in[0]): its
   * backward then has nothing left to do (exec.c, loss_in_place) */
  bool grad_in_place;
  void *ws;                         /* ccall_ws bytes */
  void *gemm_ws;                    /* gpu_gemm_ws() bytes */
  gpu_stream *s;
  bool deterministic;
} ccall;

/* The epilogue (gpu_epi) that fuses call b into call a before it: a
 * linear's forward and a GELU's forward on its whole result, or the
 * backward of a linear and of the GELU on its input's gradient; a
 * linear's forward and a residual's add (ckernel_passes_grad) of its
 * result and a tensor of the same shape.
 * GPU_EPI_NONE: they do not fuse. The caller checks that b reads what a
 * writes (and, backward, that nothing else reads it) and what is
 * accumulated. */
int ccall_fusion(const ccall *a, const ccall *b);
/* The scratch memory the call's kernels need (the pointers may be NULL). */
size_t ccall_ws(const ccall *c);
/* Bytes the forward call can keep for the backward of the same part (its
 * keep), 0: it keeps nothing; the backward then also wants the forward's
 * result (fwd_out). */
size_t ccall_keep(const ccall *c);
/* Whether the forward of k's operator can keep anything (ccall_keep). */
bool ckernel_keeps(const ckernel *k);
/* Enqueues the call; false with a message (cuBLASLt refusing a shape, an
 * operator that cannot accumulate asked to). */
bool ccall_run(const ccall *c, char *err, size_t errlen);

#endif
