/* gpu.h - the CUDA backend's device side behind a plain C header: the
 * runtime (devices, memory, streams, events) and one launcher per kernel.
 *
 * The .cu files behind it are built twice: by nvcc for the GPU
 * (libweft_cuda.so), and by a C++ compiler against emu.h, which runs the
 * same kernels on the CPU for the tests (build/cudaemu/libweft_cuda.so).
 *
 * Conventions, as the CPU kernels' (backends/cpu/kernels.h):
 * - tensors are packed row-major in one storage type (gpu_dtype); a kernel
 *   computes in f32 whatever it stores; ids are int32; statistics f32;
 * - outputs first, then inputs, then sizes; `acc`: add to the output
 *   instead of overwriting it; a NULL gradient output is not computed;
 * - every launcher enqueues on its stream and returns at once: errors are
 *   read afterwards with gpu_check;
 * - a launcher that needs scratch memory takes it from `ws` (device
 *   memory of at least the bytes its *_ws function says), so that a run
 *   allocates nothing while it steps;
 * - no kernel uses atomics on floats: every sum is taken in one order, so
 *   two runs give the same bits. */
#ifndef WEFT_CUDA_GPU_H
#define WEFT_CUDA_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Storage types: the values of weft_dtype (weft/value.h). */
typedef enum { GPU_F32 = 0, GPU_BF16 = 1, GPU_F16 = 2, GPU_I32 = 3 } gpu_dtype;

static inline int gpu_dtype_size(int dt) { return dt == GPU_BF16 || dt == GPU_F16 ? 2 : 4; }

/* ---- the runtime ------------------------------------------------------------ */

typedef struct gpu_stream gpu_stream;
typedef struct gpu_event gpu_event;

typedef struct gpu_props {
  char name[256];
  int major, minor;        /* compute capability */
  int sms;                 /* multiprocessors */
  int64_t total, free;     /* bytes of device memory */
  size_t smem_optin;       /* shared memory a block may ask for */
} gpu_props;

/* Whether this library runs kernels on a GPU (0) or emulates them on the CPU (1). */
int gpu_emulated(void);
/* Devices there are; -1 with a message (no driver, no device). */
int gpu_count(char *err, size_t errlen);
bool gpu_properties(int dev, gpu_props *p, char *err, size_t errlen);
/* Makes dev current for this thread: every call below acts on it. */
bool gpu_use(int dev, char *err, size_t errlen);
/* Device memory; NULL with a message. */
void *gpu_alloc(size_t bytes, char *err, size_t errlen);
void gpu_free(void *p);
gpu_stream *gpu_stream_new(char *err, size_t errlen);
void gpu_stream_free(gpu_stream *s);
bool gpu_stream_sync(gpu_stream *s, char *err, size_t errlen);
gpu_event *gpu_event_new(char *err, size_t errlen);
void gpu_event_free(gpu_event *e);
/* Records e at this point of s; a later gpu_wait makes a stream wait for it. */
void gpu_record(gpu_event *e, gpu_stream *s);
void gpu_wait(gpu_stream *s, gpu_event *e);
/* Whether the work before e's record has finished: 1 yes, 0 not yet, -1
 * with a message when it failed. */
int gpu_event_done(gpu_event *e, char *err, size_t errlen);
/* An event that also takes the time it is reached, for gpu_elapsed_ms. */
gpu_event *gpu_event_timed(char *err, size_t errlen);
/* Milliseconds from timed event a's record to b's, once b is reached (it
 * waits); -1 with a message. Emulated: the host's time between the two
 * points of the queue running. */
double gpu_elapsed_ms(gpu_event *a, gpu_event *b, char *err, size_t errlen);
/* Copies that return when done (host memory need not be pinned). */
bool gpu_upload(void *dst, const void *src, size_t bytes, gpu_stream *s, char *err, size_t errlen);
bool gpu_download(void *dst, const void *src, size_t bytes, gpu_stream *s, char *err, size_t errlen);
void gpu_zero(void *dst, size_t bytes, gpu_stream *s);
/* The first error since the last call, as "what: CUDA's message"; true
 * when there is none. Errors of kernels that ran asynchronously show at
 * the next synchronisation. */
bool gpu_check(const char *what, char *err, size_t errlen);
/* Has the next gpu_check report msg (where no error is pending): for a
 * caller that read an error it cannot handle and must not lose. */
void gpu_raise(const char *msg);
/* Device memory allocated and freed in stream s's order (cudaMallocAsync,
 * cudaFreeAsync): neither waits for other streams' work. */
void *gpu_alloc_on(size_t bytes, gpu_stream *s, char *err, size_t errlen);
void gpu_free_on(void *p, gpu_stream *s);
/* Waits for all work of the current device. */
bool gpu_sync(char *err, size_t errlen);
/* Starts (on) or stops the collection of a profiler started with
 * collection off (ncu --profile-from-start off); nothing on the
 * emulation. */
void gpu_profiler(bool on);

/* ---- regions: copies and sums of strided parts ------------------------------- */

enum { GPU_MAX_DIMS = 16, GPU_MAX_SRCS = 64 };

/* A move of the elements of region R from one packed holder to another
 * (docs/program.md, regions). Along dimension d, element i of R sits at
 * position pos(d, i) of the holder, which is base[d] + i or, for a strided
 * dimension, table[d][i]; the offset is the sum of pos(d, i) * stride[d].
 * gpu_rmove_build (rmove.c) fills one and merges dimensions that are
 * contiguous on both sides. The tables are device memory. */
typedef struct gpu_side {
  int64_t stride[GPU_MAX_DIMS];
  int64_t base[GPU_MAX_DIMS];
  const int32_t *table[GPU_MAX_DIMS];   /* NULL: base + i */
} gpu_side;

typedef struct gpu_rmove {
  int nd;                 /* dimensions after merging, at least 1 */
  int64_t total;          /* elements moved */
  int64_t len[GPU_MAX_DIMS];
  gpu_side src, dst;
  bool contiguous;        /* both sides hold R whole, packed alike: a plain copy */
} gpu_rmove;

/* dst (+)= src over the move (src and dst of the given types; i32 only
 * copies). */
void gpu_move(gpu_stream *s, void *dst, int dst_dt, const void *src, int src_dt, const gpu_rmove *m, bool add);
/* dst = the sum of the sources in their order (zeros when there are none),
 * each source a holder of m.src's layout; computed in f32. */
typedef struct gpu_srcs {
  int n;
  const void *p[GPU_MAX_SRCS];
} gpu_srcs;
void gpu_sum(gpu_stream *s, void *dst, int dst_dt, const gpu_srcs *src, int src_dt, const gpu_rmove *m, bool add);
/* dst[i] (+)= src[i], with conversion. */
void gpu_convert(gpu_stream *s, void *dst, int dst_dt, const void *src, int src_dt, int64_t n, bool add);

/* ---- matrix products (cuBLASLt) ----------------------------------------------- */

/* Row-major C[m,n] (+)= op(A) op(B) (+ bias[n]), op(A) [m,k] (A stored
 * [k,m] when ta), op(B) [k,n] (B stored [n,k] when tb); A, B and C with
 * their own types, accumulated in f32; bias of C's type or NULL. ws:
 * cuBLASLt's workspace. False with a message when cuBLASLt refuses. */
bool gpu_gemm(gpu_stream *s, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
              const void *a, int64_t lda, int adt, const void *b, int64_t ldb, int bdt,
              void *c, int64_t ldc, int cdt, const void *bias, bool acc,
              void *ws, size_t ws_bytes, bool deterministic, char *err, size_t errlen);
/* What a product's epilogue does after the bias (gpu_gemm_epi). */
typedef enum {
  GPU_EPI_NONE,
  GPU_EPI_GELU,  /* C = gelu(P) and aux = P, P = op(A) op(B) + bias: a linear and the GELU after it */
  GPU_EPI_DGELU, /* C = op(A) op(B) * gelu'(aux): the backward of both, aux the GELU's input */
  GPU_EPI_RESID, /* C = op(A) op(B) + bias + aux, aux read (C's shape, not C): a linear and the
                  * residual's add after it */
  GPU_EPI_DBIAS, /* C = op(A) op(B), and aux[j] = the sum over p of op(B)[p][j] (gpu_gemm_dbias) */
} gpu_epi;
/* gpu_gemm with an epilogue (GELU with the tanh approximation, or a
 * residual's add), C and aux packed (ldc == n) of C's type, nothing
 * accumulated. cuBLASLt fuses it when every operand's rows and pointers
 * are 16-byte aligned and n is a multiple of 8; otherwise the product,
 * then the GELU's kernel or the add's. */
bool gpu_gemm_epi(gpu_stream *s, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                  const void *a, int64_t lda, int adt, const void *b, int64_t ldb, int bdt,
                  void *c, int cdt, const void *bias, int epi, void *aux,
                  void *ws, size_t ws_bytes, bool deterministic, char *err, size_t errlen);
/* A linear's weight and bias gradients in one product: C[m,n] =
 * op(A) op(B), written, and dbias[n] (of type bias_dt) = the column sums
 * of B [k,n] (not transposed: tb false), written, where cuBLASLt takes it
 * (rows and pointers on 16 bytes, m, n and k multiples of 8, C packed):
 * *fused then says so. Otherwise nothing is done and *fused is false (the
 * caller runs the product and the column sums); a combination of types
 * cuBLASLt refused is not asked again, and gpu_gemm_dbias_refused says
 * why (empty: never). False with a message only on an error. */
bool gpu_gemm_dbias(gpu_stream *s, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                    int adt, const void *b, int64_t ldb, int bdt, void *c, int cdt, void *dbias, int bias_dt,
                    void *ws, size_t ws_bytes, bool *fused, char *err, size_t errlen);
const char *gpu_gemm_dbias_refused(void);
/* How many products ran with their epilogue fused (since the start). */
int64_t gpu_gemm_fused(void);
/* The workspace a gemm is given (bytes): cuBLASLt's, then the area where
 * a large product whose rows (or pointers) are not 16-byte aligned is
 * staged in chunks with padded rows. */
size_t gpu_gemm_ws(void);
/* How many products went through the staging area (since the start). */
int64_t gpu_gemm_staged(void);
/* dst[r][c] = src[r][c], rows x cols elements of dt as bits, the rows ldd
 * and lds elements apart (either may be off 16 bytes): the copies that
 * stage a product's operands and results. */
void gpu_copy2d(gpu_stream *s, int dt, void *dst, int64_t ldd, const void *src, int64_t lds, int64_t rows,
                int64_t cols);
/* dbias[n] (+)= column sums of dy[m,n]. */
size_t gpu_colsum_ws(int64_t m, int64_t n);
void gpu_colsum(gpu_stream *s, int dt, void *dbias, int bias_dt, const void *dy, int64_t m, int64_t n, bool acc,
                void *ws);

/* ---- embeddings ------------------------------------------------------------------ */

void gpu_embedding(gpu_stream *s, int dt, void *out, const int32_t *ids, const void *table,
                   int64_t t, int64_t h, int64_t v_lo, int64_t v_local, bool acc);
/* Sums in f32 (a 16-bit table's gradient goes through ws first), and the
 * t tokens listed by partition of the table's rows. */
size_t gpu_embedding_backward_ws(int dt, int64_t v_local, int64_t h, int64_t t);
void gpu_embedding_backward(gpu_stream *s, int dt, void *dtable, int gdt, const void *dout, const int32_t *ids,
                            int64_t t, int64_t h, int64_t v_lo, int64_t v_local, bool acc, void *ws);
void gpu_add_position(gpu_stream *s, int dt, void *y, const void *x, const void *table,
                      int64_t b, int64_t sq, int64_t h);
void gpu_add_position_backward(gpu_stream *s, int dt, void *dx, void *dtable, int gdt, const void *dy,
                               int64_t b, int64_t sq, int64_t h, bool acc);

/* ---- normalisation ---------------------------------------------------------------- */

void gpu_layernorm(gpu_stream *s, int dt, void *y, const void *x, const void *w, const void *b,
                   int64_t rows, int64_t h, double eps);
size_t gpu_layernorm_backward_ws(int64_t rows, int64_t h);
/* dx added to when acc_dx, dw and db when acc; dw and db of type gdt. */
void gpu_layernorm_backward(gpu_stream *s, int dt, void *dx, void *dw, void *db, int gdt, const void *dy,
                            const void *x, const void *w, int64_t rows, int64_t h, double eps, bool acc_dx,
                            bool acc, void *ws);
void gpu_rmsnorm(gpu_stream *s, int dt, void *y, const void *x, const void *w, int64_t rows, int64_t h,
                 double eps);
size_t gpu_rmsnorm_backward_ws(int64_t rows, int64_t h);
void gpu_rmsnorm_backward(gpu_stream *s, int dt, void *dx, void *dw, const void *dy, const void *x,
                          const void *w, int64_t rows, int64_t h, double eps, bool acc, void *ws);

/* ---- activations and sums ----------------------------------------------------------- */

void gpu_gelu(gpu_stream *s, int dt, void *y, const void *x, int64_t n);
void gpu_gelu_backward(gpu_stream *s, int dt, void *dx, const void *dy, const void *x, int64_t n, bool acc);
void gpu_silu(gpu_stream *s, int dt, void *y, const void *x, int64_t n);
void gpu_silu_backward(gpu_stream *s, int dt, void *dx, const void *dy, const void *x, int64_t n, bool acc);
void gpu_swiglu(gpu_stream *s, int dt, void *y, const void *gate, const void *up, int64_t n);
void gpu_swiglu_backward(gpu_stream *s, int dt, void *dgate, void *dup, const void *dy, const void *gate,
                         const void *up, int64_t n, bool acc);
/* y = a + b (the residual add); in place allowed. */
void gpu_add(gpu_stream *s, int dt, void *y, const void *a, const void *b, int64_t n);
/* da, db (+)= dy, either NULL: not wanted; one launch. */
void gpu_add_backward(gpu_stream *s, int dt, void *da, void *db, const void *dy, int64_t n, bool acc);

/* ---- rotary embedding --------------------------------------------------------------- */

/* As k_rotary: x[b,s,heads*dh], angles in double; sign -1 is the backward. */
void gpu_rotary(gpu_stream *s, int dt, void *y, const void *x, int64_t b, int64_t sq, int64_t heads, int64_t dh,
                int64_t pos0, double base, double sign, bool acc);

/* ---- causal attention ------------------------------------------------------------------ */

/* Where the heads are: query head h of batch i at q + i * q_batch + h * dh,
 * query row p a further p * q_row; its key and value head h / r (r query
 * heads per key/value head: 1 for causal_attention's fused q|k|v); the
 * result of head h at o + i * o_batch + h * dh + p * o_row. sq query rows,
 * sk key rows; query row p is position qpos + p of the sequence and
 * attends to keys 0 to qpos + p (qpos 0 and sk = sq for the whole
 * sequence; a part of the queries against all the keys under context
 * parallelism). */
typedef struct gpu_attn {
  int64_t b, sq, hq, dh, r;
  int64_t q_row, kv_row, o_row;
  int64_t q_batch, kv_batch, o_batch;
  int64_t sk, qpos;
  /* --deterministic: no path whose sums' order depends on timing (cuDNN's
   * backward, attention_cudnn.cu) */
  bool det;
} gpu_attn;

/* The largest head the kernels take. */
enum { GPU_ATTN_MAX_DH = 256 };
/* out = softmax(q k^T / sqrt(dh), causal) v, FlashAttention's way: key
 * tiles streamed through shared memory with a running maximum and sum, no
 * s x s scores anywhere. lse (NULL: none) gets each row's log-sum-exp of
 * its scaled scores, f32 [b, hq, sq] (gpu_attention_stats_bytes), which
 * the backward takes instead of running the forward again. */
void gpu_attention(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v, const gpu_attn *a,
                   float *lse);
size_t gpu_attention_stats_bytes(const gpu_attn *a);
/* The backward's workspace for heads of type dt, acc: whether it adds to
 * the gradients (a cuDNN plan's, when WEFT_ATTN=cudnn takes the heads and
 * the backward writes, is built here: a call on the device it runs on). */
size_t gpu_attention_backward_ws(int dt, const gpu_attn *a, bool acc);
/* dq, dk, dv (+)= the gradients from dout: each row's log-sum-exp (lse,
 * from the forward) and D = dout . out (out: the result the forward wrote,
 * laid out as dout), or, when lse or out is NULL, both from a pass of the
 * forward first; then one pass per key tile for dk and dv and one per
 * query tile for dq (no atomics), or, where fa-atomic runs (WEFT_ATTN, or
 * chosen by time; never under --deterministic), dq summed by atomics in
 * the pass for dk and dv (attention_fa_bwd.cu). */
void gpu_attention_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                            const void *k, const void *v, const gpu_attn *a, bool acc, const float *lse,
                            const void *out, void *ws);
/* Attention without a mask (T5's): every query row sees all sk keys, sq
 * and sk apart (a.qpos is not read); the kernels on CUDA cores, each sum
 * in one order. The arguments, lse and the backward's workspace are
 * gpu_attention's and gpu_attention_backward's. */
void gpu_attention_full(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v,
                        const gpu_attn *a, float *lse);
/* Whether the cuDNN that WEFT_ATTN=cudnn would load is there and of a
 * version it uses: "cuDNN 9.19.0 at PATH", else why not (`weft backends`).
 * Loads nothing of it but the library. */
bool gpu_cudnn_about(char *buf, size_t n);
/* Which kernels run attention, as WEFT_ATTN sets it (attention_pick.cu):
 * "the plugin's, cuDNN timed against them for heads of 2^32 flops and
 * more", ... */
void gpu_attention_about(char *buf, size_t n);
/* How that choice measures a way's output against the reference's: the
 * relative L2 error and the worst element's difference over its bound
 * 10 tol rms + 5 tol |want| (both INFINITY where got is not finite and
 * want is), over b x s rows of width elements of type dt (rows row
 * elements apart, the b groups batch apart), both on the host, in 16
 * parts added in order, on `threads` threads (0: as the choice takes
 * them, one below 2^22 elements); exported for the tests. */
void gpu_attention_compare(const void *want, const void *got, int dt, int64_t b, int64_t batch, int64_t s,
                           int64_t row, int64_t width, double tol, unsigned threads, double *rel, double *worst);
/* Whether cuDNN (attention_cudnn.cu, WEFT_ATTN=cudnn) builds a plan of the
 * forward or backward graph of these heads, causal or not, for the device
 * described by device_json (cuDNN's device properties: no GPU needed), and
 * the plan's workspace; false with cuDNN's message. */
bool gpu_attention_cudnn_offline(const char *device_json, int dt, const gpu_attn *a, bool causal, bool bwd, int64_t *ws,
                                 char *err, size_t errlen);
/* gpu_attention_backward_ws of gpu_attention_full_backward */
size_t gpu_attention_full_backward_ws(int dt, const gpu_attn *a, bool acc);
void gpu_attention_full_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout,
                                 const void *q, const void *k, const void *v, const gpu_attn *a, bool acc,
                                 const float *lse, const void *out, void *ws);

/* mma.cu: d[0, 256) = A B and d[256, 512) = the same with B stored [k][n],
 * d[512, 768) = (A B rounded to dt) B, d[768, 1024) and d[1024, 1280) = A B
 * through ldmatrix (B stored [k][n], then [n][k]), all 16 x 16 row-major,
 * through the warp product of mma.cuh (dt bf16 or f16): a check of its
 * layouts. */
void gpu_mma_check(gpu_stream *s, int dt, float *d, const void *a, const void *b_nk, const void *b_kn);
/* attention_wg.cu: d[0, 4096) = A B and d[4096, 8192) = the same with B
 * stored [k][n], A 64 x 64 and B 64 x 64 row-major (16-bit, dt bf16 or
 * f16), d f32 row-major, through the warpgroup product of wgmma.cuh over
 * swizzled tiles: a check of its layouts and descriptors; then, as
 * diagnostics, d[8192, 12288) = A B with A read from shared memory too,
 * d[12288, 16384) = A B (B [k][n]) with the descriptor's offsets swapped
 * (16384 floats in all). False (nothing run) where the GPU does not run it
 * (compute capability other than 9.0) or WEFT_ATTN_WG=off. */
bool gpu_wgmma_check(gpu_stream *s, int dt, float *d, const void *a, const void *b_nk, const void *b_kn);
/* Why the kernels on the warpgroup products (attention_wg.cu) do not run
 * these heads on the current device, NULL where they do: they take 16-bit
 * heads of 64 on compute capability 9.0 where the product's self-check
 * passed, unless WEFT_ATTN_WG=off. */
const char *gpu_attention_wg_refusal(int dt, const gpu_attn *a);

/* ---- softmax -------------------------------------------------------------------------- */

void gpu_softmax(gpu_stream *s, int dt, void *y, const void *x, int64_t rows, int64_t cols);
void gpu_softmax_backward(gpu_stream *s, int dt, void *dx, const void *dy, const void *x, int64_t rows,
                          int64_t cols, bool acc);

/* ---- the Swin Transformer (swin.cu; as backends/cpu/kernels_swin.h) ----------------- */

/* Patches of p x p pixels: to_patches, dst[b][hn][wn][c p p] from the
 * image src[b][c][hn p][wn p] (patchify); else the image from the patches
 * (its backward). */
void gpu_patch_move(gpu_stream *s, int dt, void *dst, const void *src, int64_t b, int64_t c, int64_t hn, int64_t wn,
                    int64_t p, bool to_patches, bool acc);
/* Windows of ws x ws tokens after a cyclic shift: to_windows, dst[b][hn][wn]
 * [ws ws][c] from the grid src[b][hn ws][wn ws][c] (window_partition, and
 * window_reverse's backward); else the grid from the windows, the shift
 * undone (window_reverse, and window_partition's backward). */
void gpu_window_move(gpu_stream *s, int dt, void *dst, const void *src, int64_t b, int64_t hn, int64_t wn, int64_t ws,
                     int64_t c, int64_t shift, bool to_windows, bool acc);
/* Patch merging: to_merged, dst[b][hn][wn][4 c] from src[b][2 hn][2 wn][c]
 * (patch_merge); else the grid from the merged (its backward). */
void gpu_patch_merge(gpu_stream *s, int dt, void *dst, const void *src, int64_t b, int64_t hn, int64_t wn, int64_t c,
                     bool to_merged, bool acc);
/* out[b][c] (+)= the sum over hw tokens of x[b][hw][c] / count; the
 * backward dx (+)= dout / count. */
void gpu_mean_pool(gpu_stream *s, int dt, void *out, const void *x, int64_t b, int64_t hw, int64_t c, int64_t count,
                   bool acc);
void gpu_mean_pool_backward(gpu_stream *s, int dt, void *dx, const void *dout, int64_t b, int64_t hw, int64_t c,
                            int64_t count, bool acc);
/* Window attention, as swin_attn_dims: qkv[b][hn][wn][ws ws][3 heads dh],
 * the bias table[(2 ws - 1)^2][heads], windows hn0.. and wn0.. of a grid of
 * hn_all x wn_all, the mask of shifted windows when shift > 0. */
typedef struct gpu_swin_attn {
  int64_t b, hn, wn, ws, heads, dh;
  int64_t hn0, wn0, hn_all, wn_all, shift;
} gpu_swin_attn;
/* Whether the kernels take windows of ws x ws with heads of dh on the
 * current device (a window's tensors in shared memory); need: the bytes. */
bool gpu_window_attention_takes(int64_t ws, int64_t dh, size_t *need);
void gpu_window_attention(gpu_stream *s, int dt, void *out, const void *qkv, const void *table,
                          const gpu_swin_attn *z);
size_t gpu_window_attention_backward_ws(const gpu_swin_attn *z);
/* dqkv (+)= its gradient; dtable (+)= the bias's gradient summed over the
 * windows and the batch, of type table_dt (f32 or dt); either NULL: not
 * wanted. */
void gpu_window_attention_backward(gpu_stream *s, int dt, void *dqkv, void *dtable, int table_dt, const void *dout,
                                   const void *qkv, const void *table, const gpu_swin_attn *z, bool acc, void *ws);

/* ---- losses ----------------------------------------------------------------------------- */

/* A loss's share is written to *slot (double, device; NULL: not wanted)
 * and to out (one value of dt; added when acc). */
size_t gpu_loss_ws(int64_t rows);
void gpu_cross_entropy(gpu_stream *s, int dt, double *slot, void *out, const void *logits, int64_t ld,
                       const int32_t *labels, int64_t t, int64_t v, int64_t t_total, bool acc, void *ws);
/* dlogits (+)= (softmax(logits) - onehot(labels)) / t_total: one kernel,
 * one read of each row for its maximum and sum, one pass that writes.
 * ld, ldd: elements from a row of logits, of dlogits, to the next (rows
 * padded to 16 bytes; 0: v). */
void gpu_cross_entropy_backward(gpu_stream *s, int dt, void *dlogits, int64_t ldd, const void *logits, int64_t ld,
                                const int32_t *labels, int64_t t, int64_t v, int64_t t_total, bool acc);
/* gpu_cross_entropy and gpu_cross_entropy_backward (written, not added
 * to) at once, the gradient over the logits: one read of each row. The
 * gradient's bits are the backward's; the loss may differ from
 * gpu_cross_entropy's in its last bits (a row's sums taken by another
 * number of threads). */
void gpu_cross_entropy_in_place(gpu_stream *s, int dt, double *slot, void *out, void *logits, int64_t ld,
                                const int32_t *labels, int64_t t, int64_t v, int64_t t_total, bool acc, void *ws);
/* A shard of the vocabulary, columns [v_lo, v_lo + v_local): its
 * statistics of each row (f32 [t][3]), the loss from the gathered ones
 * (f32 [t][nshards][3]; `first` the shard that adds it), and its part of
 * dlogits. */
void gpu_cross_entropy_stats(gpu_stream *s, int dt, float *stats, const void *logits, const int32_t *labels,
                             int64_t t, int64_t v_lo, int64_t v_local);
void gpu_cross_entropy_combine(gpu_stream *s, int dt, double *slot, void *out, const float *stats, int nshards,
                               int64_t t, int64_t t_total, bool first, bool acc, void *ws);
void gpu_cross_entropy_shard_backward(gpu_stream *s, int dt, void *dlogits, const void *logits,
                                      const int32_t *labels, const float *stats, int nshards, int64_t t,
                                      int64_t v_lo, int64_t v_local, int64_t t_total, bool acc);
void gpu_mse(gpu_stream *s, int dt, double *slot, void *out, const void *a, const void *b, int64_t n,
             int64_t n_total, bool acc, void *ws);
void gpu_mse_backward(gpu_stream *s, int dt, void *da, void *db, const void *a, const void *b, int64_t n,
                      int64_t n_total, bool acc);

/* ---- mixture of experts (moe.cu) ---------------------------------------------------------- */

/* The sizes of a routed layer as k_moe_*: g groups of s tokens of h
 * features, e experts, k choices per token, c slots per expert and group;
 * normalize: combine divides a token's weights by the sum of its k chosen
 * probabilities. Each launcher routes the tokens again from probs
 * [g][s][e], into ws (gpu_moe_ws bytes). */
typedef struct gpu_moe {
  int64_t g, s, h, e, k, c;
  bool normalize;
} gpu_moe;
size_t gpu_moe_ws(const gpu_moe *z);
/* expert and slot [g][s][k] as k_moe_route's (device memory). */
void gpu_moe_route(gpu_stream *s, int dt, int32_t *expert, int32_t *slot, const void *probs, const gpu_moe *z,
                   void *ws);
/* out [e][g][c][h] as k_moe_dispatch; its backward dx (+)= as
 * k_moe_dispatch_backward and dprobs (NULL: none) zeros, or unchanged when
 * acc. */
void gpu_moe_dispatch(gpu_stream *s, int dt, void *out, const void *x, const void *probs, const gpu_moe *z,
                      void *ws);
void gpu_moe_dispatch_backward(gpu_stream *s, int dt, void *dx, void *dprobs, const void *dout, const void *probs,
                               const gpu_moe *z, bool acc, void *ws);
/* y [g][s][h] from the experts' rows ye [e][g][c][h], as k_moe_combine. */
void gpu_moe_combine(gpu_stream *s, int dt, void *y, const void *ye, const void *probs, const gpu_moe *z, void *ws);
void gpu_moe_combine_backward(gpu_stream *s, int dt, void *dye, void *dprobs, const void *dy, const void *ye,
                              const void *probs, const gpu_moe *z, bool acc, void *ws);
/* The load-balancing loss of the g groups, divided by g_total, as
 * k_moe_aux_loss: to *slot and out as a loss's share (see the losses);
 * the backward's gradient of the loss is *dloss (one value of dt), 1 when
 * dloss is NULL. */
void gpu_moe_aux_loss(gpu_stream *s, int dt, double *slot, void *out, const void *probs, const gpu_moe *z,
                      int64_t g_total, double alpha, bool acc, void *ws);
void gpu_moe_aux_loss_backward(gpu_stream *s, int dt, void *dprobs, const void *dloss, const void *probs,
                               const gpu_moe *z, int64_t g_total, double alpha, bool acc, void *ws);

/* ---- optimizers --------------------------------------------------------------------------- */

/* One step on n elements as k_adamw and k_sgd: param of its type; master
 * f32 or NULL: with it, the step works on the master and rounds it into
 * param; without, on param's value, rounded back into its type; state f32;
 * grad of its type, multiplied by *scale first when scale is not NULL (a
 * device f32: the clipping factor). */
typedef struct gpu_optim {
  double lr, beta1, beta2, eps, weight_decay, momentum;
} gpu_optim;
void gpu_adamw(gpu_stream *s, void *param, int pdt, float *master, float *m, float *v, const void *grad, int gdt,
               const float *scale, int64_t n, int64_t step, const gpu_optim *o);
void gpu_sgd(gpu_stream *s, void *param, int pdt, float *master, float *buf, const void *grad, int gdt,
             const float *scale, int64_t n, const gpu_optim *o);
/* *acc += the sum of squares of x's n elements (those whose mask byte is
 * not 0, when mask is not NULL), in double. */
size_t gpu_sumsq_ws(void);
void gpu_sumsq(gpu_stream *s, int dt, double *acc, const void *x, const uint8_t *mask, int64_t n, void *ws);
/* *coef = min(1, clip / (sqrt(the sum of norms[0 .. n), in order) + 1e-6)),
 * and *norm that square root: the clipping factor of a step. */
void gpu_clip_coef(gpu_stream *s, float *coef, double *norm, const double *norms, int n, double clip);

/* Several tensors' steps and sums of squares in one launch: a table of
 * entries in device memory, each a step as gpu_adamw's or gpu_sgd's
 * (GPU_MS_STEP), the sum of squares of its gradient as gpu_sumsq's
 * (GPU_MS_SQ), or both from one read of the gradient; the same bits as
 * those launches one tensor at a time, in the table's order. */
enum { GPU_MS_STEP = 1, GPU_MS_SQ = 2 };
typedef struct gpu_mstep {
  void *param;            /* of type pdt */
  float *master;          /* NULL: none */
  float *state;           /* AdamW: m then v, n each; SGD: the momentum buffer, NULL none */
  const void *grad;       /* of type gdt */
  const uint8_t *mask;    /* the elements the sum counts, NULL all */
  int64_t n;
  int32_t pdt, gdt, what; /* what: GPU_MS_* */
  int32_t tag;            /* the caller's */
  /* gpu_msteps_layout's: */
  int32_t first, blocks;  /* its blocks of the launch */
  int32_t part, rank;     /* GPU_MS_SQ: where its blocks' sums go, and its place among the sums */
} gpu_mstep;
typedef struct gpu_mslayout {
  int64_t blocks;         /* of the launch */
  int64_t parts;          /* the doubles of scratch it needs */
  int nsq;                /* entries that count their gradient */
} gpu_mslayout;
/* Lays out a table (host memory, before it is uploaded): reorders its
 * entries (the largest first) and fills their blocks; the sums of squares
 * keep the order they came in. */
gpu_mslayout gpu_msteps_layout(gpu_mstep *t, int n);
/* Runs table t (device memory, laid out) of n entries: AdamW's steps
 * (adamw) or SGD's with settings o, the gradients scaled by *scale when it
 * is not NULL; *acc += the sums of squares in order (when l->nsq). parts:
 * device scratch of l->parts doubles. */
void gpu_msteps(gpu_stream *s, bool adamw, const gpu_mstep *t, int n, const gpu_mslayout *l, int64_t step,
                const gpu_optim *o, const float *scale, double *parts, double *acc);

/* ---- what this library holds ---------------------------------------------------------------- */

/* One line per kernel family: what `weft backends --kernels` prints. */
extern const char *const gpu_kernel_lines[];

#ifdef __cplusplus
}
#endif

#endif
