/* bench_kernels.c - the CUDA backend's tensor-core attention timed with
 * CUDA events through the plugin (backends/cuda/gpu.h): forward (keeping
 * each row's log-sum-exp) and backward (from the kept log-sum-exp and the
 * forward's result, and, for comparison, with the forward run again, as
 * when nothing is kept) at GPT-2 124M's heads (batch 8, 12 heads of 64, sequence 1024,
 * causal, bf16, q|k|v fused as causal_attention has them) and at heads of
 * 128 (batch 4, 16 heads, sequence 2048), and a cuBLASLt linear of
 * 8192 x 768 -> 2304 (bf16, bias) for the GPU's ceiling, a linear's
 * weight and bias gradients as a product and the column sums or as one
 * product (weight_grads, at GPT-2's q|k|v and MLP-output shapes), and GPT-2's LM
 * head (8192 tokens x 768 -> a vocabulary of 50257, bf16: the logits,
 * their gradient's two products), whose rows of 50257 elements are off 16
 * bytes: staged through the padded area, on rows padded to 16 bytes (as
 * the executor lays out logits, pad_rows), then each as one direct call
 * (WEFT_GEMM_STAGE_FLOPS above its size), then with the vocabulary
 * rounded up to a multiple of 128 (50304, as llm.c pads it), and the loss on those logits
 * (cross entropy forward and backward) and their staging copy alone, in
 * GB/s (losses_and_copies), and LayerNorm forward and backward at GPT-2's
 * widths of 768 and 1024 (norms) and the column sums of a bias's
 * gradient (colsums), and the token embedding's table gradient at batch 32
 * (embeddings), in GB/s. Prints ms per
 * call (the mean of the timed calls after two untimed) and TFLOP/s:
 * causal forward 2 b h s^2 dh (half of 4 b h s^2 dh), backward 2.5 times
 * that (then its dq alone, 1.5 times, and its dk and dv alone, 2 times:
 * the products each of its kernels computes), linear 2 m k n.
 *
 * Last, the host's comparison of outputs that attention's choice makes.
 *
 * Usage: bench_kernels [--small] [--lm-head] [--attention] [--compare]
 * (--small: tiny shapes, for the CPU emulation, whose figures mean
 * nothing; --lm-head: the LM head's products and the losses alone;
 * --attention: attention alone, as bench/gpu_ncu_attention.sh profiles it;
 * --compare: the host's comparison alone, whose figures hold on any
 * machine). Exit 1 when a call fails. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/gpu.h"

static gpu_stream *S;

static void die(const char *what, const char *err) {
  fprintf(stderr, "bench_kernels: %s: %s\n", what, err);
  exit(1);
}

/* n values of type dt, uniform in [-1, 1) (a fixed sequence). */
static void *filled(int64_t n, int dt) {
  char e[400];
  float *h = malloc(sizeof(float) * (size_t)n);
  uint64_t x = 88172645463325252ull;
  for (int64_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    h[i] = (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
  void *f = gpu_alloc((size_t)n * 4, e, sizeof e), *d = gpu_alloc((size_t)n * gpu_dtype_size(dt), e, sizeof e);
  if (!f || !d) die("gpu_alloc", e);
  if (!gpu_upload(f, h, (size_t)n * 4, S, e, sizeof e)) die("gpu_upload", e);
  gpu_convert(S, d, dt, f, GPU_F32, n, false);
  if (!gpu_stream_sync(S, e, sizeof e)) die("convert", e);
  gpu_free(f), free(h);
  return d;
}

static void *zeros(size_t bytes) {
  char e[400];
  void *d = gpu_alloc(bytes ? bytes : 1, e, sizeof e);
  if (!d) die("gpu_alloc", e);
  gpu_zero(d, bytes, S);
  return d;
}

/* What one timed call runs. */
typedef struct job {
  int kind;   /* 0 attention forward, 1 attention backward, 2 linear, 3 product, 4 backward that recomputes,
                 5 the backward's dq alone, 6 its dk and dv alone */
  gpu_attn a;
  void *qkv, *out, *dout, *g, *ws, *lse;
  int64_t m, k, n;
  void *x, *w, *bias, *y, *gws;
  bool ta, tb;  /* 3: y[m,n] = op(x) op(w), leading dimensions lx, lw, ly */
  int64_t lx, lw, ly;
} job;

static void run(job *j) {
  char e[400];
  size_t t = 2, c = (size_t)(j->a.hq * j->a.dh);
  if (j->kind == 0)
    gpu_attention(S, GPU_BF16, j->out, j->qkv, (char *)j->qkv + c * t, (char *)j->qkv + 2 * c * t, &j->a, j->lse);
  else if (j->kind == 1 || j->kind == 4 || j->kind == 5 || j->kind == 6)
    gpu_attention_backward(S, GPU_BF16, j->kind == 6 ? NULL : j->g, j->kind == 5 ? NULL : (char *)j->g + c * t,
                           j->kind == 5 ? NULL : (char *)j->g + 2 * c * t, j->dout, j->qkv, (char *)j->qkv + c * t,
                           (char *)j->qkv + 2 * c * t, &j->a, false, j->kind == 4 ? NULL : j->lse,
                           j->kind == 4 ? NULL : j->out, j->ws);
  else if (j->kind == 3) {
    if (!gpu_gemm(S, j->ta, j->tb, j->m, j->n, j->k, j->x, j->lx, GPU_BF16, j->w, j->lw, GPU_BF16, j->y, j->ly,
                  GPU_BF16, NULL, false, j->gws, gpu_gemm_ws(), false, e, sizeof e))
      die("gpu_gemm", e);
  } else if (!gpu_gemm(S, false, true, j->m, j->n, j->k, j->x, j->k, GPU_BF16, j->w, j->k, GPU_BF16, j->y, j->n, GPU_BF16,
                     j->bias, false, j->gws, gpu_gemm_ws(), false, e, sizeof e))
    die("gpu_gemm", e);
}

/* ms per call of j over `reps` calls after two untimed. */
static double timed(job *j, int reps) {
  char e[400];
  gpu_event *a = gpu_event_timed(e, sizeof e), *b = gpu_event_timed(e, sizeof e);
  if (!a || !b) die("gpu_event_timed", e);
  run(j), run(j);
  gpu_record(a, S);
  for (int i = 0; i < reps; i++) run(j);
  gpu_record(b, S);
  double ms = gpu_elapsed_ms(a, b, e, sizeof e);
  if (ms < 0 || !gpu_check("bench", e, sizeof e)) die("timing", e);
  gpu_event_free(a), gpu_event_free(b);
  return ms / reps;
}

static void attention(int64_t b, int64_t heads, int64_t dh, int64_t s, int reps) {
  int64_t c = heads * dh;
  job j;
  memset(&j, 0, sizeof j);
  j.a = (gpu_attn){b, s, heads, dh, 1, 3 * c, 3 * c, c, s * 3 * c, s * 3 * c, s * c, s, 0, false};
  j.qkv = filled(b * s * 3 * c, GPU_BF16);
  j.dout = filled(b * s * c, GPU_BF16);
  j.out = zeros((size_t)(b * s * c) * 2);
  j.g = zeros((size_t)(b * s * 3 * c) * 2);
  j.ws = zeros(gpu_attention_backward_ws(GPU_BF16, &j.a, false));
  j.lse = zeros(gpu_attention_stats_bytes(&j.a));
  double flop = 2.0 * (double)b * heads * (double)s * s * dh;
  char shape[96];
  snprintf(shape, sizeof shape, "b%lld h%lld s%lld dh%lld bf16 causal", (long long)b, (long long)heads, (long long)s,
           (long long)dh);
  j.kind = 0;
  double f = timed(&j, reps);
  printf("attention forward   %-36s %9.3f ms %8.1f TFLOP/s\n", shape, f, flop / (f * 1e-3) / 1e12);
  j.kind = 1;
  double g = timed(&j, reps);
  printf("attention backward  %-36s %9.3f ms %8.1f TFLOP/s\n", shape, g, 2.5 * flop / (g * 1e-3) / 1e12);
  j.kind = 4;
  double gr = timed(&j, reps);
  printf("%-56s %9.3f ms %8.1f TFLOP/s\n", "  the same with the forward again (nothing kept)", gr,
         2.5 * flop / (gr * 1e-3) / 1e12);
  /* the backward's two parts, each asked for alone (with D = dout . out
   * each time): what the dq kernel and the dk/dv kernel take of it;
   * TFLOP/s of the products each computes, three and four of a tile's */
  j.kind = 5;
  double gq = timed(&j, reps);
  printf("%-56s %9.3f ms %8.1f TFLOP/s\n", "  dq alone (3 products)", gq, 1.5 * flop / (gq * 1e-3) / 1e12);
  j.kind = 6;
  double gkv = timed(&j, reps);
  printf("%-56s %9.3f ms %8.1f TFLOP/s\n", "  dk, dv alone (4 products)", gkv, 2.0 * flop / (gkv * 1e-3) / 1e12);
  fflush(stdout);
  gpu_free(j.qkv), gpu_free(j.dout), gpu_free(j.out), gpu_free(j.g), gpu_free(j.ws), gpu_free(j.lse);
}

static void linear(int64_t m, int64_t k, int64_t n, int reps) {
  job j;
  memset(&j, 0, sizeof j);
  j.kind = 2, j.m = m, j.k = k, j.n = n;
  j.x = filled(m * k, GPU_BF16), j.w = filled(n * k, GPU_BF16), j.bias = filled(n, GPU_BF16);
  j.y = zeros((size_t)(m * n) * 2), j.gws = zeros(gpu_gemm_ws());
  char shape[96];
  snprintf(shape, sizeof shape, "%lldx%lld -> %lld bf16 +bias", (long long)m, (long long)k, (long long)n);
  double t = timed(&j, reps);
  printf("linear (cuBLASLt)   %-36s %9.3f ms %8.1f TFLOP/s\n", shape, t, 2.0 * m * k * n / (t * 1e-3) / 1e12);
  gpu_free(j.x), gpu_free(j.w), gpu_free(j.bias), gpu_free(j.y), gpu_free(j.gws);
}

/* The LM head's products: x [t,h], W [v,h], logits and their gradient
 * [t,v]: logits = x W^T, dx = dlogits W, dW = dlogits^T x. */
static void lm_head(int64_t t, int64_t h, int64_t v, int reps) {
  job j;
  memset(&j, 0, sizeof j);
  j.kind = 3;
  void *x = filled(t * h, GPU_BF16), *w = filled(v * h, GPU_BF16), *dl = filled(t * v, GPU_BF16);
  void *logits = zeros((size_t)(t * v) * 2), *dx = zeros((size_t)(t * h) * 2), *dw = zeros((size_t)(v * h) * 2);
  /* the logits and their gradient in rows padded to 16 bytes */
  int64_t vp = (v + 7) / 8 * 8;
  void *dlp = filled(t * vp, GPU_BF16), *logitsp = zeros((size_t)(t * vp) * 2);
  j.gws = zeros(gpu_gemm_ws());
  struct {
    const char *name;
    bool ta, tb;
    int64_t m, n, k;
    void *x, *w, *y;
    int64_t lx, lw, ly;
  } p[3] = {{"logits = x W^T", false, true, t, v, h, x, w, logits, h, h, v},
            {"dx = dlogits W", false, false, t, h, v, dl, w, dx, v, h, h},
            {"dW = dlogits^T x", true, false, v, h, t, dl, x, dw, v, h, h}};
  char shape[96];
  /* the vocabulary rounded up to a multiple of 128, every operand of v
   * rows or columns that long (what a model whose vocabulary is padded
   * so would run; TFLOP/s still of v's products) */
  int64_t vr = (v + 127) / 128 * 128;
  char rounded[32];
  snprintf(rounded, sizeof rounded, "rounded to %lld", (long long)vr);
  void *wr = filled(vr * h, GPU_BF16), *dlr = filled(t * vr, GPU_BF16), *logitsr = zeros((size_t)(t * vr) * 2);
  void *dwr = zeros((size_t)(vr * h) * 2);
  const char *how[4] = {"staged", "padded", "direct", rounded};
  for (int mode = 0; mode < 4; mode++) {
    if (mode == 2) setenv("WEFT_GEMM_STAGE_FLOPS", "9223372036854775807", 1);
    for (int i = 0; i < 3; i++) {
      j.ta = p[i].ta, j.tb = p[i].tb, j.m = p[i].m, j.n = p[i].n, j.k = p[i].k;
      j.x = p[i].x, j.w = p[i].w, j.y = p[i].y, j.lx = p[i].lx, j.lw = p[i].lw, j.ly = p[i].ly;
      if (mode == 1) {
        /* the operand or result of v columns is the padded one */
        if (i == 0) j.y = logitsp, j.ly = vp;
        else j.x = dlp, j.lx = vp;
      }
      if (mode == 3) {
        if (i == 0) j.n = vr, j.w = wr, j.y = logitsr, j.ly = vr;
        if (i == 1) j.k = vr, j.x = dlr, j.lx = vr, j.w = wr;
        if (i == 2) j.m = vr, j.x = dlr, j.lx = vr, j.y = dwr;
      }
      snprintf(shape, sizeof shape, "%s %lldx%lldx%lld %s", p[i].name, (long long)t, (long long)h, (long long)v,
               how[mode]);
      double ms = timed(&j, reps);
      printf("lm head (cuBLASLt)  %-36s %9.3f ms %8.1f TFLOP/s\n", shape, ms, 2.0 * t * h * v / (ms * 1e-3) / 1e12);
      fflush(stdout);
    }
  }
  unsetenv("WEFT_GEMM_STAGE_FLOPS");
  gpu_free(x), gpu_free(w), gpu_free(dl), gpu_free(logits), gpu_free(dx), gpu_free(dw), gpu_free(j.gws);
  gpu_free(dlp), gpu_free(logitsp), gpu_free(wr), gpu_free(dlr), gpu_free(logitsr), gpu_free(dwr);
}

/* GPT-2's loss at t tokens and a vocabulary of v (bf16 logits, rows of v
 * elements off 16 bytes): cross entropy forward, backward and both, then
 * the staging copy of the logits into rows padded to 16 bytes and back
 * (gpu_copy2d). ms per call (the mean of `reps` after two untimed) and
 * GB/s of the bytes each must move (forward: the logits read; backward:
 * read and the gradient written; a copy: read and written). WEFT_CE_KERNEL=old
 * and WEFT_COPY2D=old time the first kernels. */
static void losses_and_copies(int64_t t, int64_t v, int reps) {
  char e[400];
  int64_t vp = (v + 7) / 8 * 8;
  void *logits = filled(t * v, GPU_BF16), *dlogits = zeros((size_t)(t * v) * 2), *padded = zeros((size_t)(t * vp) * 2);
  void *ws = zeros(gpu_loss_ws(t)), *slot = zeros(8);
  int32_t *lab = malloc(sizeof(int32_t) * (size_t)t);
  for (int64_t i = 0; i < t; i++) lab[i] = (int32_t)((i * 7919) % v);
  int32_t *dlab = gpu_alloc((size_t)t * 4, e, sizeof e);
  if (!dlab || !gpu_upload(dlab, lab, (size_t)t * 4, S, e, sizeof e)) die("labels", e);
  gpu_event *a = gpu_event_timed(e, sizeof e), *b = gpu_event_timed(e, sizeof e);
  if (!a || !b) die("gpu_event_timed", e);
  double bytes = (double)(t * v) * 2;
  const char *what[6] = {"cross entropy forward", "cross entropy backward", "cross entropy forward+backward",
                         "staging copy into padded rows", "staging copy out of padded rows",
                         "cross entropy, gradient in place"};
  double moved[6] = {bytes, 2 * bytes, 3 * bytes, 2 * bytes, 2 * bytes, 2 * bytes};
  for (int k = 0; k < 6; k++) {
    double ms = 0;
    for (int r = -2; r < reps; r++) {
      if (r == 0) gpu_record(a, S);
      if (k == 0 || k == 2)
        gpu_cross_entropy(S, GPU_BF16, slot, NULL, logits, 0, dlab, t, v, t, false, ws);
      if (k == 1 || k == 2)
        gpu_cross_entropy_backward(S, GPU_BF16, dlogits, 0, logits, 0, dlab, t, v, t, false);
      if (k == 3) gpu_copy2d(S, GPU_BF16, padded, vp, logits, v, t, v);
      if (k == 4) gpu_copy2d(S, GPU_BF16, dlogits, v, padded, vp, t, v);
      /* the loss and its gradient over the logits (over a copy: the
       * logits above stay as they were) */
      if (k == 5) gpu_cross_entropy_in_place(S, GPU_BF16, slot, NULL, dlogits, 0, dlab, t, v, t, false, ws);
    }
    gpu_record(b, S);
    ms = gpu_elapsed_ms(a, b, e, sizeof e) / reps;
    if (ms < 0 || !gpu_check("bench", e, sizeof e)) die("timing", e);
    char shape[96];
    snprintf(shape, sizeof shape, "t%lld v%lld bf16%s", (long long)t, (long long)v,
             k < 3 || k == 5 ? (getenv("WEFT_CE_KERNEL") ? " (old)" : "")
                             : (getenv("WEFT_COPY2D") ? " (old)" : ""));
    printf("%-32s %-24s %9.3f ms %8.1f GB/s\n", what[k], shape, ms, moved[k] / (ms * 1e-3) / 1e9);
    fflush(stdout);
  }
  gpu_event_free(a), gpu_event_free(b), free(lab);
  gpu_free(logits), gpu_free(dlogits), gpu_free(padded), gpu_free(ws), gpu_free(slot), gpu_free(dlab);
}

/* The token embedding's table gradient, as GPT-2's tied table has it: t
 * tokens of h (bf16, ids spread over v) added to an f32 gradient of v rows,
 * then with the first kernel (WEFT_EMB_KERNEL=old). GB/s of dout read and
 * the table's rows read and written. */
static void embeddings(int64_t t, int64_t h, int64_t v, int reps) {
  char e[400];
  void *dout = filled(t * h, GPU_BF16), *dtab = zeros((size_t)(v * h) * 4);
  void *ws = zeros(gpu_embedding_backward_ws(GPU_BF16, v, h, t) + 4);
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)t);
  uint64_t x = 2463534242ull;
  for (int64_t i = 0; i < t; i++) x ^= x << 13, x ^= x >> 7, x ^= x << 17, ids[i] = (int32_t)(x % (uint64_t)v);
  int32_t *dids = gpu_alloc((size_t)t * 4, e, sizeof e);
  if (!dids || !gpu_upload(dids, ids, (size_t)t * 4, S, e, sizeof e)) die("ids", e);
  gpu_event *a = gpu_event_timed(e, sizeof e), *z = gpu_event_timed(e, sizeof e);
  if (!a || !z) die("gpu_event_timed", e);
  for (int old = 0; old < 2; old++) {
    if (old) setenv("WEFT_EMB_KERNEL", "old", 1);
    for (int r = -2; r < reps; r++) {
      if (r == 0) gpu_record(a, S);
      gpu_embedding_backward(S, GPU_BF16, dtab, GPU_F32, dout, dids, t, h, 0, v, true, ws);
    }
    gpu_record(z, S);
    double ms = gpu_elapsed_ms(a, z, e, sizeof e) / reps;
    if (ms < 0 || !gpu_check("bench", e, sizeof e)) die("timing", e);
    char shape[96];
    snprintf(shape, sizeof shape, "t%lld h%lld v%lld%s", (long long)t, (long long)h, (long long)v, old ? " (old)" : "");
    printf("%-32s %-24s %9.3f ms %8.1f GB/s\n", "embedding backward", shape, ms,
           (double)(t * h) * 10 / (ms * 1e-3) / 1e9);
    fflush(stdout);
  }
  unsetenv("WEFT_EMB_KERNEL");
  gpu_event_free(a), gpu_event_free(z), free(ids);
  gpu_free(dout), gpu_free(dtab), gpu_free(ws), gpu_free(dids);
}

/* LayerNorm at t rows of h (bf16): forward, and backward writing dx and
 * adding the weight's and bias's gradients in f32, with the kernels that
 * read rows in 16-byte chunks, then the first ones (WEFT_LN_KERNEL=old).
 * GB/s of the bytes each must move: forward x read and y written;
 * backward x and dy read and dx written. */
static void norms(int64_t t, int64_t h, int reps) {
  char e[400];
  void *x = filled(t * h, GPU_BF16), *dy = filled(t * h, GPU_BF16), *w = filled(h, GPU_BF16), *b = filled(h, GPU_BF16);
  void *y = zeros((size_t)(t * h) * 2), *dx = zeros((size_t)(t * h) * 2), *dw = zeros((size_t)h * 4),
       *db = zeros((size_t)h * 4), *ws = zeros(gpu_layernorm_backward_ws(t, h));
  gpu_event *a = gpu_event_timed(e, sizeof e), *z = gpu_event_timed(e, sizeof e);
  if (!a || !z) die("gpu_event_timed", e);
  const double bytes = (double)(t * h) * 2;
  for (int old = 0; old < 2; old++) {
    if (old) setenv("WEFT_LN_KERNEL", "old", 1);
    for (int k = 0; k < 2; k++) {
      for (int r = -2; r < reps; r++) {
        if (r == 0) gpu_record(a, S);
        if (k == 0) gpu_layernorm(S, GPU_BF16, y, x, w, b, t, h, 1e-5);
        else gpu_layernorm_backward(S, GPU_BF16, dx, dw, db, GPU_F32, dy, x, w, t, h, 1e-5, false, true, ws);
      }
      gpu_record(z, S);
      double ms = gpu_elapsed_ms(a, z, e, sizeof e) / reps;
      if (ms < 0 || !gpu_check("bench", e, sizeof e)) die("timing", e);
      char shape[96];
      snprintf(shape, sizeof shape, "t%lld h%lld bf16%s", (long long)t, (long long)h, old ? " (old)" : "");
      printf("%-32s %-24s %9.3f ms %8.1f GB/s\n", k ? "layernorm backward" : "layernorm forward", shape, ms,
             (k ? 3 : 2) * bytes / (ms * 1e-3) / 1e9);
      fflush(stdout);
    }
  }
  unsetenv("WEFT_LN_KERNEL");
  gpu_event_free(a), gpu_event_free(z);
  gpu_free(x), gpu_free(dy), gpu_free(w), gpu_free(b), gpu_free(y), gpu_free(dx), gpu_free(dw), gpu_free(db);
  gpu_free(ws);
}

/* A bias's gradient: the column sums of t rows of n (bf16) into f32, with
 * the kernel of 16-byte loads, then the first (WEFT_COLSUM_KERNEL=old);
 * GB/s of the rows read. */
static void colsums(int64_t t, int64_t n, int reps) {
  char e[400];
  void *dy = filled(t * n, GPU_BF16), *db = zeros((size_t)n * 4), *ws = zeros(gpu_colsum_ws(t, n) + 4);
  gpu_event *a = gpu_event_timed(e, sizeof e), *z = gpu_event_timed(e, sizeof e);
  if (!a || !z) die("gpu_event_timed", e);
  for (int old = 0; old < 2; old++) {
    if (old) setenv("WEFT_COLSUM_KERNEL", "old", 1);
    for (int r = -2; r < reps; r++) {
      if (r == 0) gpu_record(a, S);
      gpu_colsum(S, GPU_BF16, db, GPU_F32, dy, t, n, true, ws);
    }
    gpu_record(z, S);
    double ms = gpu_elapsed_ms(a, z, e, sizeof e) / reps;
    if (ms < 0 || !gpu_check("bench", e, sizeof e)) die("timing", e);
    char shape[96];
    snprintf(shape, sizeof shape, "t%lld n%lld bf16%s", (long long)t, (long long)n, old ? " (old)" : "");
    printf("%-32s %-24s %9.3f ms %8.1f GB/s\n", "column sums (bias gradient)", shape, ms,
           (double)(t * n) * 2 / (ms * 1e-3) / 1e9);
    fflush(stdout);
  }
  unsetenv("WEFT_COLSUM_KERNEL");
  gpu_event_free(a), gpu_event_free(z);
  gpu_free(dy), gpu_free(db), gpu_free(ws);
}

/* A linear's weight and bias gradients from t rows: dW = x^T dy (bf16
 * operands, f32 result, as the weights' gradients are kept) and db = dy's
 * column sums, as the product then the column-sum kernel, and as one
 * product whose epilogue takes the sums (gpu_gemm_dbias, where cuBLASLt
 * takes it; the line says when it did not). */
static void weight_grads(int64_t t, int64_t k, int64_t n, int reps) {
  char e[400];
  void *x = filled(t * k, GPU_BF16), *dy = filled(t * n, GPU_BF16), *dw = zeros((size_t)(k * n) * 4);
  void *db = zeros((size_t)n * 4), *cs = zeros(gpu_colsum_ws(t, n) + 4), *gws = zeros(gpu_gemm_ws());
  gpu_event *a = gpu_event_timed(e, sizeof e), *z = gpu_event_timed(e, sizeof e);
  if (!a || !z) die("gpu_event_timed", e);
  bool taken = false;
  for (int one = 0; one < 2; one++) {
    for (int r = -2; r < reps; r++) {
      if (r == 0) gpu_record(a, S);
      bool fused = false;
      if (one && !gpu_gemm_dbias(S, true, false, k, n, t, x, k, GPU_BF16, dy, n, GPU_BF16, dw, GPU_F32, db, GPU_F32,
                                 gws, gpu_gemm_ws(), &fused, e, sizeof e))
        die("gemm_dbias", e);
      if (one) taken = fused;
      if (!fused) {
        if (!gpu_gemm(S, true, false, k, n, t, x, k, GPU_BF16, dy, n, GPU_BF16, dw, n, GPU_F32, NULL, false, gws,
                      gpu_gemm_ws(), false, e, sizeof e))
          die("gemm", e);
        gpu_colsum(S, GPU_BF16, db, GPU_F32, dy, t, n, false, cs);
      }
    }
    gpu_record(z, S);
    double ms = gpu_elapsed_ms(a, z, e, sizeof e) / reps;
    if (ms < 0 || !gpu_check("bench", e, sizeof e)) die("timing", e);
    char shape[96];
    snprintf(shape, sizeof shape, "t%lld %lld -> %lld %s", (long long)t, (long long)k, (long long)n,
             !one ? "product, sums" : taken ? "one product" : "one product refused");
    printf("%-24s %-32s %9.3f ms %8.1f TFLOP/s\n", "linear dW + db", shape, ms,
           2.0 * (double)t * k * n / (ms * 1e-3) / 1e12);
    if (one && !taken && *gpu_gemm_dbias_refused()) printf("  (refused: %s)\n", gpu_gemm_dbias_refused());
    fflush(stdout);
  }
  gpu_event_free(a), gpu_event_free(z);
  gpu_free(x), gpu_free(dy), gpu_free(dw), gpu_free(db), gpu_free(cs), gpu_free(gws);
}

/* The host's comparison of two outputs that attention's choice makes
 * (gpu_attention_compare): a fused q|k|v's gradients of b batches of s
 * positions and 3 x 768 bf16 values (GPT-2 124M's backward: 150 million
 * elements at batch 64), on one thread and on as many as the choice
 * takes; ms per comparison and elements per ns. Host work alone. */
static void comparison(int64_t b, int64_t s, int reps) {
  const int64_t width = 3 * 768, n = b * s * width;
  uint16_t *w = malloc(2 * (size_t)n), *g = malloc(2 * (size_t)n);
  if (!w || !g) die("comparison", "out of memory");
  uint64_t x = 88172645463325252ull;
  for (int64_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    w[i] = (uint16_t)(0x3f00 | (x & 0xff)), g[i] = (uint16_t)(w[i] ^ ((x >> 20) & 1));
  }
  for (unsigned threads = 1; threads < 3; threads++) {
    double rel = 0, worst = 0, ms = 0;
    for (int r = 0; r < reps; r++) {
      struct timespec t0, t1;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      gpu_attention_compare(w, g, GPU_BF16, b, s * width, s, width, width, 1e-2, threads == 1 ? 1 : 0, &rel, &worst);
      clock_gettime(CLOCK_MONOTONIC, &t1);
      ms += ((double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6) / reps;
    }
    printf("attention's host comparison  b%lld s%lld 2304 bf16, %-9s %10.3f ms %8.3f elements/ns\n", (long long)b,
           (long long)s, threads == 1 ? "1 thread" : "threaded", ms, (double)n / (ms * 1e6));
  }
  free(w), free(g);
}

int main(int argc, char **argv) {
  char e[512];
  bool small = false, head_only = false, compare_only = false, attention_only = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--small") == 0)
      small = true;
    else if (strcmp(argv[i], "--lm-head") == 0)
      head_only = true;
    else if (strcmp(argv[i], "--compare") == 0)
      compare_only = true;
    else if (strcmp(argv[i], "--attention") == 0)
      attention_only = true;
    else {
      fprintf(stderr, "usage: bench_kernels [--small] [--lm-head] [--attention] [--compare]\n");
      return 2;
    }
  }
  if (compare_only) {
    comparison(small ? 2 : 64, small ? 64 : 1024, small ? 1 : 3);
    return 0;
  }
  if (gpu_count(e, sizeof e) < 0) die("gpu_count", e);
  gpu_props p;
  if (!gpu_properties(0, &p, e, sizeof e) || !gpu_use(0, e, sizeof e)) die("device 0", e);
  if (!(S = gpu_stream_new(e, sizeof e))) die("stream", e);
  printf("bench_kernels on %s (compute capability %d.%d, %d SMs)%s\n", p.name, p.major, p.minor, p.sms,
         gpu_emulated() ? ", emulated on the CPU: the figures mean nothing" : "");
  /* attention at GPT-2 124M's heads and at heads of 128 (tiny with --small) */
  if (!head_only) {
    if (small)
      attention(1, 2, 64, 160, 1), attention(1, 1, 128, 130, 1);
    else
      attention(8, 12, 64, 1024, 20), attention(4, 16, 128, 2048, 10);
  }
  if (attention_only) {
    if (!gpu_sync(e, sizeof e)) die("sync", e);
    gpu_stream_free(S);
    return 0;
  }
  if (small) {
    if (!head_only) {
      linear(64, 96, 80, 1);
      weight_grads(64, 48, 40, 1);
    }
    setenv("WEFT_GEMM_STAGE_FLOPS", "0", 1);
    lm_head(64, 48, 257, 1);
  } else {
    if (!head_only) {
      linear(8192, 768, 2304, 50);
      weight_grads(8192, 768, 2304, 20);
      weight_grads(8192, 3072, 768, 20);
    }
    lm_head(8192, 768, 50257, 20);
  }
  losses_and_copies(small ? 64 : 8192, small ? 257 : 50257, small ? 1 : 20);
  if (!head_only) {
    norms(small ? 64 : 8192, 768, small ? 1 : 20);
    norms(small ? 64 : 8192, 1024, small ? 1 : 20);
    colsums(small ? 64 : 8192, 768, small ? 1 : 20);
    colsums(small ? 64 : 8192, 3072, small ? 1 : 20);
    embeddings(small ? 600 : 32768, small ? 40 : 768, small ? 300 : 50257, small ? 1 : 10);
    comparison(small ? 2 : 64, small ? 64 : 1024, small ? 1 : 3);
  }
  if (!gpu_sync(e, sizeof e)) die("sync", e);
  gpu_stream_free(S);
  return 0;
}
