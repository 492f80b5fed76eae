/* kernels.h - the numeric kernels of the CPU backend: forward and backward of
 * every operator of stdlib/ops.plan, the optimizers, and parameter init.
 *
 * Conventions (docs/design/cpu-kernels.md says more):
 * - Tensors are f32, row-major, dense and contiguous: the packed buffers of
 *   docs/program.md. A group of leading dimensions (`b..`, `m..`) is passed
 *   flattened, as one size. Sizes are int64_t; matrix sizes passed to BLAS
 *   must be below 2^31.
 * - Arguments: outputs first, then inputs, then sizes, then settings.
 * - No kernel keeps state between calls. A backward takes the gradient of
 *   the forward's output (dy) and the forward's inputs, never its output:
 *   what it needs more (norm statistics, attention probabilities) it
 *   recomputes.
 * - Gradient outputs may each be NULL: that gradient is not computed. With
 *   `acc` false a gradient output is overwritten, with `acc` true the
 *   gradient is added to it (micro-batches, co-sharded parts, a tensor read
 *   by several operators). To overwrite one gradient and add to another,
 *   call twice with NULL for the other.
 * - Forwards of operators with a reduction dimension (matmul, matmul_t,
 *   linear, embedding) take `acc` too: parts of a split reduction held on
 *   one device add into one buffer.
 * - Outputs never overlap inputs, except that the elementwise and row-wise
 *   forwards marked "in place" accept y == x.
 * - Losses return a double and are normalised by a count the caller gives
 *   (the whole batch's, when the call sees only a part), so that the shares
 *   of a loss split along its batch add up to the loss.
 * - Temporary memory (attention scores, rows of double sums) is allocated
 *   per call and freed before returning; when allocation fails the kernel
 *   calls weft_oom(). Kernels are safe to call from several threads at once. */
#ifndef WEFT_KERNELS_H
#define WEFT_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

/* ---- matrix products (cblas_sgemm) --------------------------------------- */

/* OpenBLAS on one thread, its pool of threads stopped: the CPU backend runs
 * one device per thread, and the other commands use no BLAS at all (a
 * pool started by OpenBLAS's constructor would spin beside them). */
void k_blas_single(void);

/* c[m,n] (+)= a[m,k] @ b[k,n]. */
void k_matmul(float *c, const float *a, const float *b,
              int64_t m, int64_t k, int64_t n, bool acc);
/* da[m,k] = dc @ b^T, db[k,n] = a^T @ dc. */
void k_matmul_backward(float *da, float *db, const float *dc,
                       const float *a, const float *b,
                       int64_t m, int64_t k, int64_t n, bool acc);

/* c[m,n] (+)= a[m,k] @ b[n,k]^T: weights stored [out, in]. */
void k_matmul_t(float *c, const float *a, const float *b,
                int64_t m, int64_t k, int64_t n, bool acc);
/* da[m,k] = dc @ b, db[n,k] = dc^T @ a. */
void k_matmul_t_backward(float *da, float *db, const float *dc,
                         const float *a, const float *b,
                         int64_t m, int64_t k, int64_t n, bool acc);

/* y[m,n] (+)= x[m,k] @ w[k,n] + bias[n] (GPT-2's Conv1D layout). bias may be
 * NULL: the parts of a split reduction but the first add no bias. The fused
 * q|k|v projection (qkv_linear) is this with n = 3 * heads * dh. */
void k_linear(float *y, const float *x, const float *w, const float *bias,
              int64_t m, int64_t k, int64_t n, bool acc);
/* dx = dy @ w^T, dw = x^T @ dy, dbias = column sums of dy. */
void k_linear_backward(float *dx, float *dw, float *dbias, const float *dy,
                       const float *x, const float *w,
                       int64_t m, int64_t k, int64_t n, bool acc);

/* ---- embeddings ---------------------------------------------------------- */

/* out[t,h] (+)= table[ids[t] - v_lo] for ids in [v_lo, v_lo + v_local), zero
 * (nothing added) for other ids: table holds rows v_lo.. of the vocabulary,
 * and the shards' outputs sum to the whole embedding. */
void k_embedding(float *out, const int32_t *ids, const float *table,
                 int64_t t, int64_t h, int64_t v_lo, int64_t v_local, bool acc);
/* dtable[v_local,h] (+)= the rows of dout scattered by id, in token order;
 * ids outside the shard are ignored. With acc false, dtable is zeroed first. */
void k_embedding_backward(float *dtable, const float *dout, const int32_t *ids,
                          int64_t t, int64_t h, int64_t v_lo, int64_t v_local,
                          bool acc);

/* y[b,s,h] = x[b,s,h] + table[s,h], broadcast over b. For a part of the
 * sequence, pass the table's rows of that part. In place. */
void k_add_position(float *y, const float *x, const float *table,
                    int64_t b, int64_t s, int64_t h);
/* dx = dy; dtable[s,h] = sum over b of dy. */
void k_add_position_backward(float *dx, float *dtable, const float *dy,
                             int64_t b, int64_t s, int64_t h, bool acc);

/* ---- normalisation ------------------------------------------------------- */

/* Over the last dimension of x[rows,h]: (x - mean) / sqrt(var + eps) * w + b,
 * var the biased variance; statistics in double. In place. */
void k_layernorm(float *y, const float *x, const float *w, const float *b,
                 int64_t rows, int64_t h, double eps);
/* Recomputes the statistics of each row. */
void k_layernorm_backward(float *dx, float *dw, float *db, const float *dy,
                          const float *x, const float *w,
                          int64_t rows, int64_t h, double eps, bool acc);

/* x / sqrt(mean(x^2) + eps) * w over the last dimension. In place. */
void k_rmsnorm(float *y, const float *x, const float *w,
               int64_t rows, int64_t h, double eps);
void k_rmsnorm_backward(float *dx, float *dw, const float *dy,
                        const float *x, const float *w,
                        int64_t rows, int64_t h, double eps, bool acc);

/* ---- activations (elementwise over n values) ----------------------------- */

/* GELU, tanh approximation (GPT-2's gelu_new):
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). In place. */
void k_gelu(float *y, const float *x, int64_t n);
void k_gelu_backward(float *dx, const float *dy, const float *x, int64_t n, bool acc);

/* x * sigmoid(x). In place. */
void k_silu(float *y, const float *x, int64_t n);
void k_silu_backward(float *dx, const float *dy, const float *x, int64_t n, bool acc);

/* silu(gate) * up. In place (y == gate or y == up). */
void k_swiglu(float *y, const float *gate, const float *up, int64_t n);
void k_swiglu_backward(float *dgate, float *dup, const float *dy,
                       const float *gate, const float *up, int64_t n, bool acc);

/* ---- rotary position embedding ------------------------------------------- */

/* x[b,s,heads*dh] (heads of dh, dh even), rotate_half pairing as in Hugging
 * Face Llama: element i < dh/2 of a head pairs with element i + dh/2, and
 * the pair turns by the angle pos * base^(-2i/dh):
 *   y[i]        = x[i] cos - x[i + dh/2] sin
 *   y[i + dh/2] = x[i + dh/2] cos + x[i] sin
 * pos = pos0 + the index along s: pos0 is where a part of a sequence split
 * starts. Angles in double. In place. */
void k_rotary(float *y, const float *x, int64_t b, int64_t s, int64_t heads,
              int64_t dh, int64_t pos0, double base);
/* The inverse rotation of dy (the forward is linear: x is not needed). */
void k_rotary_backward(float *dx, const float *dy, int64_t b, int64_t s,
                       int64_t heads, int64_t dh, int64_t pos0, double base,
                       bool acc);

/* ---- causal attention ---------------------------------------------------- */

/* qkv[b,s,3*heads*dh] laid out (3, heads, dh) in its last dimension (the q
 * block, then k, then v, each heads of dh); out[b,s,heads*dh] laid out
 * (heads, dh): softmax(q k^T / sqrt(dh), causal mask) v for every head.
 * Works on s x s scores per head (cblas_sgemm), allocated per call. */
void k_causal_attention(float *out, const float *qkv,
                        int64_t b, int64_t s, int64_t heads, int64_t dh);
/* dqkv[b,s,3*heads*dh]: recomputes the probabilities. */
void k_causal_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                 int64_t b, int64_t s, int64_t heads, int64_t dh,
                                 bool acc);

/* Grouped-query attention: q[b,sq,g*r*dh] laid out (g, r, dh), k and v
 * [b,sk,g*dh] laid out (g, dh); query head (i, j) attends with key/value head
 * i, as Hugging Face's repeat_kv does (query head i * r + j, kv head i).
 * Query row i is position q0 + i of the sequence and attends to keys 0 to
 * q0 + i (a part of the queries against all keys: context parallelism;
 * sq = sk, q0 = 0 for the whole). */
void k_gqa_attention(float *out, const float *q, const float *k, const float *v,
                     int64_t b, int64_t sq, int64_t sk, int64_t q0, int64_t g, int64_t r, int64_t dh);
void k_gqa_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                              const float *q, const float *k, const float *v,
                              int64_t b, int64_t sq, int64_t sk, int64_t q0, int64_t g, int64_t r,
                              int64_t dh, bool acc);

/* ---- softmax and elementwise sums ---------------------------------------- */

/* Softmax over the last dimension of x[rows,cols]; sums in double. In place. */
void k_softmax(float *y, const float *x, int64_t rows, int64_t cols);
/* dx = y * (dy - sum(dy * y)), y recomputed from x. */
void k_softmax_backward(float *dx, const float *dy, const float *x,
                        int64_t rows, int64_t cols, bool acc);

/* y = a + b. In place. */
void k_add(float *y, const float *a, const float *b, int64_t n);
/* da = dy, db = dy. */
void k_add_backward(float *da, float *db, const float *dy, int64_t n, bool acc);
/* y += alpha * x: the step that adds one gradient into another. */
void k_axpy(float *y, float alpha, const float *x, int64_t n);

/* ---- losses -------------------------------------------------------------- */

/* sum over the t rows of -log softmax(logits[row])[labels[row]], divided by
 * t_total (t for the mean over this call's rows). labels in [0, v). */
double k_cross_entropy(const float *logits, const int32_t *labels,
                       int64_t t, int64_t v, int64_t t_total);
/* dlogits = (softmax(logits) - onehot(labels)) * dloss / t_total. */
void k_cross_entropy_backward(float *dlogits, const float *logits,
                              const int32_t *labels, int64_t t, int64_t v,
                              int64_t t_total, double dloss, bool acc);

/* Cross entropy over a vocabulary split into shards: a shard holds columns
 * [v_lo, v_lo + v_local) of the logits, labels are global. Each shard
 * computes three statistics of each of its rows (k_cross_entropy_stats),
 * the shards of the same rows gather them (an all-gather of f32 values),
 * k_cross_entropy_merge turns the gathered ones into each row's maximum,
 * sum of exponentials and label logit, from which k_cross_entropy_combine
 * gives the loss of the rows, the same on every shard, and
 * k_cross_entropy_shard_backward each shard's part of dlogits. */
/* stats[t][3]: per row, the maximum of the shard's logits, the sum over the
 * shard of exp(logit - that maximum), and the label's logit if the label
 * is in the shard, else 0. */
void k_cross_entropy_stats(float *stats, const float *logits, const int32_t *labels,
                           int64_t t, int64_t v_lo, int64_t v_local);
/* From stats[t][nshards][3], every shard's statistics of each row in
 * vocabulary order: row_max = max over shards of their maxima, row_sum = sum
 * over shards of their sum * exp(their maximum - row_max), target = sum of
 * their label logits. */
void k_cross_entropy_merge(float *row_max, float *row_sum, float *target, const float *stats,
                           int nshards, int64_t t);
/* sum over rows of log(row_sum) + row_max - target, divided by t_total. */
double k_cross_entropy_combine(const float *row_max, const float *row_sum,
                               const float *target, int64_t t, int64_t t_total);
void k_cross_entropy_shard_backward(float *dlogits, const float *logits,
                                    const int32_t *labels, const float *row_max,
                                    const float *row_sum, int64_t t,
                                    int64_t v_lo, int64_t v_local,
                                    int64_t t_total, double dloss, bool acc);

/* sum of (a - b)^2 over n elements, divided by n_total. */
double k_mse(const float *a, const float *b, int64_t n, int64_t n_total);
/* da = 2 (a - b) dloss / n_total, db = -da. */
void k_mse_backward(float *da, float *db, const float *a, const float *b,
                    int64_t n, int64_t n_total, double dloss, bool acc);

/* ---- mixture of experts -------------------------------------------------- */

/* Routing of a mixture of experts (GShard, Switch Transformer): in each of
 * g groups of s tokens, a token's k choices are the k largest of its
 * probs[g][s][e] (ties to the lower expert), expert[g][s][k] in that
 * order. Slots are handed out choice by choice (every token's first
 * choice, in token order, then every token's second, ...), each expert
 * taking at most c tokens per group; slot[g][s][k] is the token's slot in
 * its expert, or -1 when the expert was full (the choice is dropped). */
void k_moe_route(int32_t *expert, int32_t *slot, const float *probs,
                 int64_t g, int64_t s, int64_t e, int64_t k, int64_t c);
/* out[e][g][c][h]: token (g, s)'s row x[g][s] in its experts' slots, zeros
 * in the slots no token took. */
void k_moe_dispatch(float *out, const float *x, const float *probs,
                    int64_t g, int64_t s, int64_t h, int64_t e, int64_t k, int64_t c);
/* dx[g][s] = sum of dout over the slots the token took (the routing has no
 * gradient). */
void k_moe_dispatch_backward(float *dx, const float *dout, const float *probs,
                             int64_t g, int64_t s, int64_t h, int64_t e, int64_t k,
                             int64_t c, bool acc);
/* y[g][s] = sum over the token's kept choices j of w_j ye[e_j][g][slot_j],
 * w_j = probs[g][s][e_j], divided by the sum of the k chosen probabilities
 * when normalize (dropped choices count in that sum). */
void k_moe_combine(float *y, const float *ye, const float *probs,
                   int64_t g, int64_t s, int64_t h, int64_t e, int64_t k, int64_t c,
                   bool normalize);
void k_moe_combine_backward(float *dye, float *dprobs, const float *dy,
                            const float *ye, const float *probs,
                            int64_t g, int64_t s, int64_t h, int64_t e, int64_t k,
                            int64_t c, bool normalize, bool acc);
/* out[e] = x[e] w[e] for each of e experts: x[e] is [m, k], w[e] [k, n]. */
void k_expert_matmul(float *out, const float *x, const float *w,
                     int64_t e, int64_t m, int64_t k, int64_t n, bool acc);
void k_expert_matmul_backward(float *dx, float *dw, const float *dout,
                              const float *x, const float *w,
                              int64_t e, int64_t m, int64_t k, int64_t n, bool acc);
/* Switch Transformer's load-balancing loss over g groups of s tokens:
 * alpha * e * sum_e f_e P_e per group, f_e the share of the group's k s
 * choices that picked expert e (before dropping), P_e the mean of
 * probs[.][.][e] over its tokens; summed over the groups and divided by
 * g_total (the mean over groups when the call sees all of them). */
double k_moe_aux_loss(const float *probs, int64_t g, int64_t s, int64_t e, int64_t k,
                      int64_t g_total, double alpha);
/* dprobs = dloss * alpha * e * f_e / (s g_total): f_e is piecewise
 * constant in the probabilities. */
void k_moe_aux_loss_backward(float *dprobs, const float *probs, int64_t g, int64_t s,
                             int64_t e, int64_t k, int64_t g_total, double alpha,
                             double dloss, bool acc);

/* ---- optimizers (one step on n elements, in place) ------------------------ */

/* torch.optim.SGD (dampening 0, no Nesterov): d = g + weight_decay * p;
 * with momentum, buf = momentum * buf + d and d = buf; p -= lr * d. buf
 * (NULL when momentum is 0) starts zeroed, which makes the first step's
 * buf = d as in PyTorch. */
void k_sgd(float *p, float *buf, const float *g, int64_t n,
           double lr, double momentum, double weight_decay);

/* torch.optim.AdamW (no amsgrad): p *= 1 - lr * weight_decay; m and v move
 * toward g and g^2; p -= lr / (1 - beta1^step) * m / (sqrt(v) /
 * sqrt(1 - beta2^step) + eps). step counts from 1; m and v start zeroed.
 * PyTorch's defaults: lr 1e-3, betas 0.9 and 0.999, eps 1e-8, weight decay
 * 0.01. */
void k_adamw(float *p, float *m, float *v, const float *g, int64_t n,
             int64_t step, double lr, double beta1, double beta2, double eps,
             double weight_decay);

/* ---- deterministic random numbers ---------------------------------------- */

/* Counter-based: the value for element i of stream `stream` (a tensor's
 * number) under `seed` depends on nothing else, so any part of a tensor is
 * initialised exactly as the same part of the whole tensor. */
uint64_t k_rng_u64(uint64_t seed, uint64_t stream, uint64_t i);
/* A standard normal value (Box-Muller on two 53-bit uniforms). */
double k_rng_normal(uint64_t seed, uint64_t stream, uint64_t i);
/* out[j] = mean + std * k_rng_normal(seed, stream, first + j), j < n: a run
 * of consecutive row-major indices of the whole tensor. */
void k_init_normal(float *out, int64_t first, int64_t n, uint64_t seed,
                   uint64_t stream, double mean, double std);
/* The box [lo[d], hi[d]) of a tensor of the given shape, packed row-major
 * into out: the same values as the box of the whole tensor's init. */
void k_init_normal_box(float *out, int rank, const int64_t *shape,
                       const int64_t *lo, const int64_t *hi, uint64_t seed,
                       uint64_t stream, double mean, double std);

/* ---- attention without a mask ------------------------------------------- */

/* softmax(q k^T / sqrt(dh)) v for n heads of dh, every query to every key:
 * q [b, sq, n dh], k and v [b, sk, n dh] (T5's encoder self-attention with
 * sk = sq, its cross-attention from sq decoder positions to sk encoder
 * positions). */
void k_attention(float *out, const float *q, const float *k, const float *v,
                 int64_t b, int64_t sq, int64_t sk, int64_t n, int64_t dh);
void k_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                          const float *q, const float *k, const float *v,
                          int64_t b, int64_t sq, int64_t sk, int64_t n, int64_t dh, bool acc);

#endif
