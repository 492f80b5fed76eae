/* attention.cuh - the implementations of attention (attention.cu on CUDA
 * cores, attention_tc.cu and attention_fa*.cu on tensor cores,
 * attention_cudnn.cu through cuDNN) and the choice among them
 * (attention_pick.cu), as each calls the others. */
#ifndef WEFT_CUDA_ATTENTION_CUH
#define WEFT_CUDA_ATTENTION_CUH

#include "common.cuh"
#include "gpu.h"

/* The last key that query rows [0, end) see: query row p sees keys 0 to
 * qpos + p, at most the last key. */
DEV int64_t last_key(const gpu_attn &a, int64_t end) {
  int64_t last = a.qpos + (end < a.sq ? end : a.sq) - 1;
  return last < a.sk - 1 ? last : a.sk - 1;
}

/* Whether p starts on 16 bytes (a tile may move 16 bytes at a time). */
static inline bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Runs body with D the head's width in 16-element tiles (heads of 32, 64,
 * 96 or 128). */
#define WITH_D16(dh, D, ...)                                                                   \
  do {                                                                                         \
    switch ((dh) / 16) {                                                                       \
    case 2: { enum { D = 2 }; __VA_ARGS__; } break;                                            \
    case 4: { enum { D = 4 }; __VA_ARGS__; } break;                                            \
    case 6: { enum { D = 6 }; __VA_ARGS__; } break;                                            \
    default: { enum { D = 8 }; __VA_ARGS__; } break;                                           \
    }                                                                                          \
  } while (0)

/* The order of the mma.sync kernels' blocks (attention_fa*.cu), whose
 * tiles of a causal head differ in work (a query tile sees the keys up to
 * it, a key tile the queries from it): blocks start in the order of their
 * index, x first, then y, then z (what NVIDIA's GPUs do, not a promise of
 * CUDA's), and by tile (the default) the grid is heads by batches by
 * tiles, the heaviest tile of every head first, so that the longest
 * blocks start first and the last to start are the shortest (a head's
 * tiles together leave, near the end, a few SMs on long blocks that
 * started late while the rest idle, most where the grid is a few waves,
 * as at batch 8 of 124M's heads). Each index is a block coordinate of its
 * own, so that finding them costs no division. by_tile
 * false (WEFT_ATTN_FA_ORDER=heads, or more tiles or batches than a grid's
 * y and z hold): tiles by heads by batches, a head's tiles together. The
 * same bits either way. */
bool attention_fa_by_tile(int64_t tiles, int64_t b);
static inline dim3 attention_fa_grid(bool by_tile, int64_t tiles, int64_t heads, int64_t b) {
  return by_tile ? dim3((unsigned)heads, (unsigned)b, (unsigned)tiles) : dim3((unsigned)tiles, (unsigned)heads, (unsigned)b);
}
/* A block's batch, head and tile in a grid of attention_fa_grid's; tiles:
 * the grid's. */
DEV void attention_fa_block(bool by_tile, int64_t &bi, int64_t &h, int64_t &tile, int64_t &tiles) {
  if (by_tile)
    h = blockIdx.x, bi = blockIdx.y, tile = blockIdx.z, tiles = gridDim.z;
  else
    bi = blockIdx.z, h = blockIdx.y, tile = blockIdx.x, tiles = gridDim.x;
}

/* Shared memory a block may have on the current GPU. */
size_t attention_smem_limit(void);
/* Whether the tensor-core kernels take these heads in this type. */
bool attention_tc_takes(int dt, const gpu_attn *a);
void attention_tc_forward(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v,
                          const gpu_attn *a, float *lse);
/* Whether attention_fa.cu's forward (mma.sync) takes these heads in this
 * type (not under WEFT_ATTN=wmma); its arguments are attention_tc_forward's. */
bool attention_fa_fwd_takes(int dt, const gpu_attn *a);
void attention_fa_forward(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v,
                          const gpu_attn *a, float *lse);
/* lse, dsum: each row's log-sum-exp and dout . out; kept: they are there
 * (the forward's log-sum-exp, D from its result), else the forward runs
 * again into them (the workspace of gpu_attention_backward). */
void attention_tc_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                           const void *k, const void *v, const gpu_attn *a, bool acc, float *lse, float *dsum,
                           bool kept);
/* The backward on mma.sync (attention_fa_bwd.cu) from the forward's lse and
 * D = dout . out: whether it takes these heads, and the run. */
bool attention_fa_bwd_takes(int dt, const gpu_attn *a);
void attention_fa_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                           const void *k, const void *v, const gpu_attn *a, bool acc, const float *lse,
                           const float *dsum, float *dqa);
/* The same with dq summed in the dk/dv kernel by atomics, FlashAttention-2's
 * way (not under --deterministic: the sums' order is the blocks'), into
 * dqa (f32 [b, hq, sq, dh], attention_fa_atomic_ws bytes of the
 * backward's workspace), then stored: whether it takes these heads. */
bool attention_fa_atomic_takes(int dt, const gpu_attn *a);
size_t attention_fa_atomic_ws(const gpu_attn *a);
/* The same with dq from a stored dS (fa-ds): the dk/dv kernel writes each
 * tile's dS^T to buf (16-bit; attention_fa_ds_ws bytes of the backward's
 * workspace, for a part of the batch at a time), and a kernel of its own
 * takes dQ = dS K from it: five products a tile as with atomics, each sum
 * in one order (the same bits every run). It takes self-attention's heads
 * (queries and keys the same positions) that fa takes. */
bool attention_fa_ds_takes(int dt, const gpu_attn *a);
size_t attention_fa_ds_ws(const gpu_attn *a);
void attention_fa_ds_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                              const void *k, const void *v, const gpu_attn *a, bool acc, const float *lse,
                              const float *dsum, void *buf);

/* Whether the mma.sync and warpgroup kernels may move the rows of these
 * tensors 16 bytes at a time (cp.async): every row and batch on 16 bytes. */
static inline bool attention_rows16(const gpu_attn *a, const void *dout, const void *q, const void *k, const void *v) {
  return a->dh % 8 == 0 && a->q_row % 8 == 0 && a->kv_row % 8 == 0 && a->o_row % 8 == 0 && a->q_batch % 8 == 0 &&
         a->kv_batch % 8 == 0 && a->o_batch % 8 == 0 && al16(dout) && al16(q) && al16(k) && al16(v);
}

/* The backward at heads of 64 on Hopper's warpgroup products
 * (attention_wg.cu; the way fa-wg, or WEFT_ATTN_FA_BWD_SHAPE=wg under fa):
 * whether it takes these heads (16-bit, heads of 64, a GPU of compute
 * capability 9.0 whose warpgroup product passed its self-check on the
 * device, unless WEFT_ATTN_WG=off), and the run, attention_fa_backward's without dq by atomics;
 * vec: attention_rows16; shape: 3, dk/dv in 3 blocks a multiprocessor
 * (within 168 registers); 2, in 2 (within 255); 1, both kernels pipelined
 * (the products that need no exponentials run while they are computed;
 * dk/dv in 2 blocks, dq in 3); 0, as WEFT_ATTN_FA_BWD_SHAPE says (wg2: 2,
 * wgp: 1, else 3). */
bool attention_wg_takes(int dt, const gpu_attn *a);
/* WEFT_ATTN_WG=off (or 0): the warpgroup kernels and their self-check
 * kept out everywhere. */
bool attention_wg_off(void);
/* Why this GPU runs none of them whatever the heads (the switch, a compute
 * capability other than 9.0, too little shared memory a block), or NULL.
 * (Why they do not take some heads, for a message: gpu_attention_wg_refusal,
 * gpu.h.) */
const char *attention_wg_device_refusal(void);
/* The forward on the same products, where attention_wg_takes: the
 * arguments are attention_fa_forward's. */
void attention_wg_forward(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v,
                          const gpu_attn *a, float *lse);
void attention_wg_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                           const void *k, const void *v, const gpu_attn *a, bool acc, const float *lse,
                           const float *dsum, bool vec, int shape);

/* The implementations of attention that WEFT_ATTN names and
 * attention_pick.cu chooses among: the mma.sync kernels (attention_fa*.cu),
 * the wmma ones (attention_tc.cu), cuDNN's fused attention
 * (attention_cudnn.cu), the kernels on CUDA cores (attention.cu) and the
 * mma.sync backward with dq by atomics, the backward on Hopper's
 * warpgroup products, its groups of products waited for in turn or
 * pipelined, and the mma.sync backward with dq from a stored dS
 * (backwards only; never fallbacks: the plugin's default is ATTN_FA to
 * ATTN_CORE but cuDNN). */
enum { ATTN_FA, ATTN_WMMA, ATTN_CUDNN, ATTN_CORE, ATTN_FA_ATOMIC, ATTN_FA_WG, ATTN_FA_WGP, ATTN_FA_DS, ATTN_WAYS };
extern const char *const attention_way_names[ATTN_WAYS];
/* The way WEFT_ATTN names alone (WEFT_ATTN=cudnn, ...), -1 where it names
 * none (unset, or auto). */
int attention_forced(void);
/* Whether cuDNN is to be asked for these heads: forced, or among the ways
 * the automatic choice times for them (so that the backward's workspace
 * makes room for its plan). */
bool attention_cudnn_considered(int dt, const gpu_attn *a, bool causal);
/* Likewise for the backward with dq by atomics (its f32 sums); acc: a
 * backward that adds, which is not timed (so only WEFT_ATTN=fa-atomic
 * runs it). */
bool attention_fa_atomic_considered(int dt, const gpu_attn *a, bool causal, bool acc);
/* Likewise for the backward with dq from a stored dS (its buffer). */
bool attention_fa_ds_considered(int dt, const gpu_attn *a, bool causal, bool acc);
/* The way that runs this call: WEFT_ATTN's, or the one chosen for these
 * heads on this device the first time they ran, timed against the
 * plugin's default where more than one takes them (attention_pick.cu);
 * -1: the plugin's default. The arguments are gpu_attention's and
 * gpu_attention_backward's (the backward's full: whether it is T5's). */
int attention_pick_forward(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v,
                           const gpu_attn *a, float *lse, bool causal);
int attention_pick_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                            const void *k, const void *v, const gpu_attn *a, bool acc, const float *lse,
                            const void *out, void *ws, bool causal);
/* One way of attention.cu's calls: false where it does not take them
 * (these heads, these tensors), having run nothing. */
bool attention_forward_by(int way, gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v,
                          const gpu_attn *a, float *lse, bool causal);
bool attention_backward_by(int way, gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout,
                           const void *q, const void *k, const void *v, const gpu_attn *a, bool acc,
                           const float *lse, const void *out, void *ws, bool causal);
/* Whether a way takes these heads at all (the tensors aside). */
bool attention_way_takes(int way, int dt, const gpu_attn *a, bool causal, bool bwd);

/* cuDNN's fused attention (attention_cudnn.cu), causal (sq = sk, qpos 0)
 * or with every key in view (causal false): false where it does not take
 * the call (the caller runs its kernels).
 * The backward takes the forward's lse and out and a workspace of
 * gpu_attention_backward_ws's bytes (or the full attention's), asked for
 * these heads on this device before (it is not taken otherwise), of which
 * it wants attention_cudnn_backward_ws (0: it does not take these heads). */
bool attention_cudnn_forward(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v,
                             const gpu_attn *a, float *lse, bool causal);
size_t attention_cudnn_backward_ws(int dt, const gpu_attn *a, bool causal);
/* Whether cuDNN is there and has a plan of these heads' forward (bwd
 * false) or backward (true; its workspace asked for on this device). */
bool attention_cudnn_ready(int dt, const gpu_attn *a, bool causal, bool bwd);
bool attention_cudnn_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                              const void *k, const void *v, const gpu_attn *a, bool acc, const float *lse,
                              const void *out, void *ws, bool causal);

#endif
