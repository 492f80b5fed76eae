/* matmul.cu - matrix products through cuBLASLt (f32 with 32F compute; bf16
 * and f16 operands with f32 accumulation; the bias as cuBLASLt's epilogue)
 * and the column sums that give bias gradients. CPU reference: gemm,
 * k_linear and k_linear_backward in backends/cpu/kernels.c.
 *
 * cuBLASLt is column-major: the row-major C[m,n] = op(A) op(B) is computed
 * as the column-major C^T[n,m] = op(B)^T op(A)^T, each row-major matrix
 * read as its column-major transpose. The emulation computes exactly what
 * cuBLASLt is asked (column-major, its operands and ops), so that the
 * tests on the CPU check this mapping. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "choice.h"
#include "common.cuh"

/* A row-major matrix whose k is 0 (or the product's rows): C = 0 unless
 * acc, plus the bias. */
template <class T>
__global__ void k_fill_rows(T *c, int64_t m, int64_t n, int64_t ldc, const T *bias, bool acc) {
  GRID_STRIDE(e, m * n) {
    int64_t i = e / n, j = e % n;
    float v = acc ? to_f(c[i * ldc + j]) : 0.0f;
    if (bias) v += to_f(bias[j]);
    c[i * ldc + j] = from_f<T>(v);
  }
}

/* The workspace is cuBLASLt's (32 MiB on a GPU) followed by the staging
 * area for operands whose rows are not 16-byte aligned (see gpu_gemm). */
static size_t lt_ws(void) { return gpu_emulated() ? 0 : (size_t)32 << 20; }
static size_t stage_ws(void) { return gpu_emulated() ? (size_t)4 << 20 : (size_t)64 << 20; }
size_t gpu_gemm_ws(void) { return lt_ws() + stage_ws(); }

/* ---- the staging copies ------------------------------------------------------------------ */

/* dst[r][c] = src[r][c], rows x cols of 2- or 4-byte elements, as bits:
 * the first way, one element per thread of a flattened grid-stride loop
 * (WEFT_COPY2D=old selects it). */
template <class T>
__global__ void k_copy2d(T *dst, int64_t ldd, const T *src, int64_t lds, int64_t rows, int64_t cols) {
  GRID_STRIDE(e, rows * cols) {
    int64_t i = e / cols, j = e % cols;
    dst[i * ldd + j] = src[i * lds + j];
  }
}

/* 16 bytes in four words; loads and stores of them must be aligned (the
 * emulation checks). */
#ifdef WEFT_CUDA_EMU
struct alignas(16) cp16 {
  uint32_t x, y, z, w;
};
static inline cp16 cp_ld(const char *p) {
  if ((uintptr_t)p & 15) {
    fprintf(stderr, "matmul: a 16-byte load at %p, not aligned\n", (const void *)p);
    abort();
  }
  cp16 c;
  memcpy(&c, p, 16);
  return c;
}
static inline void cp_st(char *p, cp16 c) {
  if ((uintptr_t)p & 15) {
    fprintf(stderr, "matmul: a 16-byte store at %p, not aligned\n", (void *)p);
    abort();
  }
  memcpy(p, &c, 16);
}
#else
typedef uint4 cp16;
DEV cp16 cp_ld(const char *p) { return *(const uint4 *)p; }
DEV void cp_st(char *p, cp16 c) { *(uint4 *)p = c; }
#endif

/* The 16-byte chunk of a row that starts `off` bytes after its start s
 * (off a multiple of 2, from -14 on), the row being len bytes: one aligned
 * load when the chunk lies in the row, else the row's 2-byte units one by
 * one and zeros outside it (nothing outside the row is read). */
DEV cp16 cp_chunk(const char *s, int off, int len) {
  if (off >= 0 && off + 16 <= len) return cp_ld(s + off);
  uint16_t h[8];
#pragma unroll
  for (int u = 0; u < 8; u++) {
    int o = off + 2 * u;
    h[u] = o >= 0 && o < len ? *(const uint16_t *)(s + o) : (uint16_t)0;
  }
  cp16 c;
  memcpy(&c, h, 16);
  return c;
}

/* Bytes [r, r + 16) of the 32 bytes a then b (r even, 0 to 14). */
DEV uint32_t cp_funnel(uint32_t lo, uint32_t hi, int bits) {
  return (uint32_t)((((uint64_t)hi << 32) | lo) >> bits);
}
DEV cp16 cp_shift(cp16 a, cp16 b, int r) {
  uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  if (r & 8) {
#pragma unroll
    for (int i = 0; i < 6; i++) w[i] = w[i + 2];
  }
  if (r & 4) {
#pragma unroll
    for (int i = 0; i < 5; i++) w[i] = w[i + 1];
  }
  int bits = (r & 3) * 8;
  cp16 c;
  c.x = cp_funnel(w[0], w[1], bits);
  c.y = cp_funnel(w[1], w[2], bits);
  c.z = cp_funnel(w[2], w[3], bits);
  c.w = cp_funnel(w[3], w[4], bits);
  return c;
}

/* A warp copies a segment of a row: CP_SEG chunks of 16 bytes, CP_UNROLL
 * per lane, consecutive lanes on consecutive chunks. */
enum { CP_THREADS = 256, CP_UNROLL = 4, CP_SEG = 32 * CP_UNROLL };

/* The rows as bytes (len of them a row, an even number below 2^31; ldd
 * and lds in bytes, even): each warp takes (row, segment) items, `segs` a
 * row. dst's row is cut at its 16-byte boundaries: a head and a tail of
 * 2-byte units (at most 7 each), and between them chunks that are stored
 * with one 16-byte store each; each is made from the two aligned 16-byte
 * chunks of src that hold its bytes, shifted by src's offset from dst's
 * alignment. All index arithmetic within a row is 32-bit. */
__global__ void __launch_bounds__(CP_THREADS)
    k_copy2d_vec(char *__restrict__ dst, int64_t ldd, const char *__restrict__ src, int64_t lds, int64_t rows,
                 int len, int64_t segs) {
  int lane = threadIdx.x & 31;
  int64_t warps = (int64_t)gridDim.x * (CP_THREADS / 32);
  for (int64_t w = (int64_t)blockIdx.x * (CP_THREADS / 32) + (threadIdx.x >> 5); w < rows * segs; w += warps) {
    int64_t row = w / segs;
    int seg = (int)(w - row * segs);
    char *d = dst + row * ldd;
    const char *s = src + row * lds;
    int head = (int)((16 - ((uintptr_t)d & 15)) & 15);
    if (head > len) head = len;
    int nb = (len - head) >> 4, tail = len - head - 16 * nb;
    /* body chunk c of dst is src's bytes [head + 16c, +16), in src's
     * aligned chunks q = c and c + 1 counted from s + head - r */
    int r = (int)(((uintptr_t)s + head) & 15), from = head - r;
    int c0 = seg * CP_SEG + lane;
    cp16 a[CP_UNROLL] = {}, b[CP_UNROLL] = {};
#pragma unroll
    for (int u = 0; u < CP_UNROLL; u++) {
      int c = c0 + 32 * u;
      if (c < nb) {
        a[u] = cp_chunk(s, from + 16 * c, len);
        if (r) b[u] = cp_chunk(s, from + 16 * c + 16, len);
      }
    }
#pragma unroll
    for (int u = 0; u < CP_UNROLL; u++) {
      int c = c0 + 32 * u;
      if (c < nb) cp_st(d + head + 16 * c, r ? cp_shift(a[u], b[u], r) : a[u]);
    }
    if (seg == 0 && 2 * lane < head) *(uint16_t *)(d + 2 * lane) = *(const uint16_t *)(s + 2 * lane);
    if (seg == segs - 1 && 2 * lane < tail) {
      int o = head + 16 * nb + 2 * lane;
      *(uint16_t *)(d + o) = *(const uint16_t *)(s + o);
    }
  }
}

/* WEFT_COPY2D=old: the first kernel (for comparison). */
static bool copy2d_old(void) {
  static const bool old = [] {
    const char *v = getenv("WEFT_COPY2D");
    return v && strcmp(v, "old") == 0;
  }();
  return old;
}

static void copy2d(gpu_stream *s, int dt, void *dst, int64_t ldd, const void *src, int64_t lds, int64_t rows,
                   int64_t cols) {
  if (rows == 0 || cols == 0) return;
  int64_t es = gpu_dtype_size(dt), len = cols * es;
  if (!copy2d_old() && len < ((int64_t)1 << 31) - 16) {
    int64_t segs = ((len >> 4) + CP_SEG - 1) / CP_SEG;
    if (segs < 1) segs = 1;
    launch(k_copy2d_vec, blocks_for(rows * segs * 32, CP_THREADS), CP_THREADS, 0, s, (char *)dst, ldd * es,
           (const char *)src, lds * es, rows, (int)len, segs);
    return;
  }
  if (es == 2)
    launch(k_copy2d<uint16_t>, blocks_for(rows * cols, 256), 256, 0, s, (uint16_t *)dst, ldd, (const uint16_t *)src,
           lds, rows, cols);
  else
    launch(k_copy2d<uint32_t>, blocks_for(rows * cols, 256), 256, 0, s, (uint32_t *)dst, ldd, (const uint32_t *)src,
           lds, rows, cols);
}

void gpu_copy2d(gpu_stream *s, int dt, void *dst, int64_t ldd, const void *src, int64_t lds, int64_t rows,
                int64_t cols) {
  copy2d(s, dt, dst, ldd, src, lds, rows, cols);
}

#ifdef WEFT_CUDA_EMU

static float load(const void *p, int dt, int64_t i) {
  if (dt == GPU_BF16) return to_f(((const bf16 *)p)[i]);
  if (dt == GPU_F16) return to_f(((const f16 *)p)[i]);
  return ((const float *)p)[i];
}

static void store(void *p, int dt, int64_t i, float v) {
  if (dt == GPU_BF16) ((bf16 *)p)[i] = from_f<bf16>(v);
  else if (dt == GPU_F16) ((f16 *)p)[i] = from_f<f16>(v);
  else ((float *)p)[i] = v;
}

/* Column-major D[M,N] = op(X) op(Y) (+ D, or + aux for GPU_EPI_RESID)
 * (+ bias[M]), then the epilogue (aux ldd apart), as cublasLtMatmul: the
 * operands read as cuBLASLt reads them into f32 copies, then summed over
 * p in order. */
static void emu_lt_matmul(bool tx, bool ty, int64_t M, int64_t N, int64_t K, const void *x, int64_t ldx, int xdt,
                          const void *y, int64_t ldy, int ydt, void *d, int64_t ldd, int ddt, const void *bias,
                          bool beta, int epi, void *aux, int auxdt) {
  /* op(X) stored by columns, [K][M], so that M sums go on together: each
   * still adds its K products in order */
  float *a = (float *)malloc(sizeof(float) * (size_t)(M * K + 1));   /* op(X)^T [K][M] */
  float *b = (float *)malloc(sizeof(float) * (size_t)(N * K + 1));   /* op(Y)^T [N][K] */
  float *acc = (float *)malloc(sizeof(float) * (size_t)(M + 1));
  if (!a || !b || !acc) abort();
  for (int64_t p = 0; p < K; p++)
    for (int64_t i = 0; i < M; i++) a[p * M + i] = load(x, xdt, tx ? p + i * ldx : i + p * ldx);
  for (int64_t j = 0; j < N; j++)
    for (int64_t p = 0; p < K; p++) b[j * K + p] = load(y, ydt, ty ? j + p * ldy : p + j * ldy);
  /* the bias gradient from X (cuBLASLt's BGRADA): each row of op(X) summed over K */
  if (epi == GPU_EPI_DBIAS) {
    for (int64_t i = 0; i < M; i++) acc[i] = 0.0f;
    for (int64_t p = 0; p < K; p++)
      for (int64_t i = 0; i < M; i++) acc[i] += a[p * M + i];
    for (int64_t i = 0; i < M; i++) store(aux, auxdt, i, acc[i]);
  }
  for (int64_t j = 0; j < N; j++) {
    const float *bj = b + j * K;
    for (int64_t i = 0; i < M; i++) acc[i] = 0.0f;
    for (int64_t p = 0; p < K; p++) {
      const float bv = bj[p], *ap = a + p * M;
      for (int64_t i = 0; i < M; i++) acc[i] += ap[i] * bv;
    }
    for (int64_t i = 0; i < M; i++) {
      float v = acc[i];
      if (beta) v += load(d, ddt, i + j * ldd);
      if (epi == GPU_EPI_RESID) v += load(aux, ddt, i + j * ldd);
      if (bias) v += load(bias, ddt, i);
      if (epi == GPU_EPI_GELU) store(aux, ddt, i + j * ldd, v), v = gelu_f(v);
      else if (epi == GPU_EPI_DGELU) v *= gelu_grad_f(load(aux, ddt, i + j * ldd));
      store(d, ddt, i + j * ldd, v);
    }
  }
  free(a), free(b), free(acc);
}

#else

#include <cublasLt.h>

static cudaDataType_t lt_type(int dt) { return dt == GPU_BF16 ? CUDA_R_16BF : dt == GPU_F16 ? CUDA_R_16F : CUDA_R_32F; }

/* Everything cuBLASLt's choice of algorithm depends on. */
typedef struct gemm_key {
  int dev;
  int tx, ty;
  int64_t M, N, K, ldx, ldy, ldd;
  int xdt, ydt, ddt;
  int bias, beta, det, epi, auxdt;
  uint32_t align[5];      /* X, Y, C, D, aux */
  size_t ws;
} gemm_key;

enum { MAX_CANDIDATES = 8 };

typedef struct gemm_plan {
  gemm_key key;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t lx, ly, ld;
  cublasLtMatmulAlgo_t algo;
  /* the heuristic's candidates, timed once at the first call (see tune) */
  cublasLtMatmulAlgo_t cand[MAX_CANDIDATES];
  int ncand;
  bool tuned;
} gemm_plan;

static gemm_plan *plans;
static int nplans, capplans;
enum { MAX_GPUS = 64 };
static cublasLtHandle_t handles[MAX_GPUS];

static uint32_t alignment(const void *p) {
  uintptr_t a = (uintptr_t)p;
  uint32_t al = 256;
  while (al > 1 && a % al) al >>= 1;
  return al;
}

static bool lt_failed(cublasStatus_t st, const char *what, char *err, size_t errlen) {
  if (st == CUBLAS_STATUS_SUCCESS) return false;
  snprintf(err, errlen, "cuBLASLt %s: status %d", what, (int)st);
  return true;
}

static gemm_plan *new_plan(const gemm_key *k, char *err, size_t errlen) {
  if (k->dev < 0 || k->dev >= MAX_GPUS) {
    snprintf(err, errlen, "cuBLASLt: device %d out of range", k->dev);
    return NULL;
  }
  if (!handles[k->dev] && lt_failed(cublasLtCreate(&handles[k->dev]), "create", err, errlen)) return NULL;
  if (nplans == capplans) {
    capplans = capplans ? 2 * capplans : 32;
    gemm_plan *np = (gemm_plan *)realloc(plans, (size_t)capplans * sizeof *plans);
    if (!np) {
      snprintf(err, errlen, "cuBLASLt: out of host memory");
      return NULL;
    }
    plans = np;
  }
  gemm_plan *p = &plans[nplans];
  memset(p, 0, sizeof *p);
  memcpy(&p->key, k, sizeof *k); /* padding and all: plan_for compares bytes */
  cublasOperation_t ox = k->tx ? CUBLAS_OP_T : CUBLAS_OP_N, oy = k->ty ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (lt_failed(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "descriptor", err, errlen) ||
      lt_failed(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ox, sizeof ox), "transa", err,
                errlen) ||
      lt_failed(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &oy, sizeof oy), "transb", err,
                errlen))
    return NULL;
  /* the residual's add is cuBLASLt's C (beta 1), not an epilogue; the
   * bias gradient comes from X, cuBLASLt's A, into the bias pointer */
  bool aux = k->epi == GPU_EPI_GELU || k->epi == GPU_EPI_DGELU;
  if (k->epi == GPU_EPI_DBIAS) {
    cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BGRADA;
    cudaDataType_t bt = lt_type(k->auxdt);
    if (lt_failed(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep), "epilogue",
                  err, errlen) ||
        lt_failed(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt),
                  "bias gradient's type", err, errlen))
      return NULL;
  } else if (k->bias || aux) {
    cublasLtEpilogue_t ep = k->epi == GPU_EPI_GELU    ? (k->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                            : k->epi == GPU_EPI_DGELU ? CUBLASLT_EPILOGUE_DGELU
                                                      : CUBLASLT_EPILOGUE_BIAS;
    if (lt_failed(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep), "epilogue",
                  err, errlen))
      return NULL;
    int64_t ld = k->ldd;
    if (aux &&
        lt_failed(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld),
                  "epilogue's leading dimension", err, errlen))
      return NULL;
    /* the heuristic reads the aux pointer's alignment from its value: one
     * of the key's alignment until each call sets the real one */
    void *hint = (void *)(uintptr_t)k->align[4];
    if (aux &&
        lt_failed(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &hint, sizeof hint),
                  "epilogue's input", err, errlen))
      return NULL;
  }
  /* stored shapes: X is M x K (K x M when transposed), Y is K x N (N x K) */
  if (lt_failed(cublasLtMatrixLayoutCreate(&p->lx, lt_type(k->xdt), k->tx ? k->K : k->M, k->tx ? k->M : k->K, k->ldx),
                "layout", err, errlen) ||
      lt_failed(cublasLtMatrixLayoutCreate(&p->ly, lt_type(k->ydt), k->ty ? k->N : k->K, k->ty ? k->K : k->N, k->ldy),
                "layout", err, errlen) ||
      lt_failed(cublasLtMatrixLayoutCreate(&p->ld, lt_type(k->ddt), k->M, k->N, k->ldd), "layout", err, errlen))
    return NULL;
  cublasLtMatmulPreference_t pref;
  if (lt_failed(cublasLtMatmulPreferenceCreate(&pref), "preference", err, errlen)) return NULL;
  uint64_t ws = k->ws;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  const cublasLtMatmulPreferenceAttributes_t al[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; i++) cublasLtMatmulPreferenceSetAttribute(pref, al[i], &k->align[i], sizeof k->align[i]);
  if (k->det) {
    uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &none, sizeof none);
  }
  cublasLtMatmulHeuristicResult_t res[MAX_CANDIDATES];
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handles[k->dev], p->desc, p->lx, p->ly, p->ld, p->ld, pref,
                                                     MAX_CANDIDATES, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  for (int i = 0; i < found; i++)
    if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= k->ws) p->cand[p->ncand++] = res[i].algo;
  if (st != CUBLAS_STATUS_SUCCESS || p->ncand == 0) {
    snprintf(err, errlen,
             "cuBLASLt has no algorithm for a %lld x %lld x %lld product (types %d %d %d, epilogue %d, status %d)",
             (long long)k->N, (long long)k->M, (long long)k->K, k->xdt, k->ydt, k->ddt, k->epi, (int)st);
    return NULL;
  }
  p->algo = p->cand[0];
  p->tuned = p->ncand == 1;
  nplans++;
  return p;
}

/* The plan of a product, made the first time (a choice, choice.h). */
static gemm_plan *plan_for(const gemm_key *k, char *err, size_t errlen) {
  for (int i = 0; i < nplans; i++)
    if (memcmp(&plans[i].key, k, sizeof *k) == 0) return &plans[i];
  char what[128];
  snprintf(what, sizeof what, "cuBLASLt's algorithms for %lld x %lld x %lld", (long long)k->N, (long long)k->M,
           (long long)k->K);
  choice_mark m = choice_begin(CHOICE_GEMM, what);
  gemm_plan *p = new_plan(k, err, errlen);
  choice_end(m);
  return p;
}

/* WEFT_GEMM_TUNE: 0 takes the heuristic's first algorithm, 1 (the
 * default) times its candidates, 2 also prints their times on stderr. */
static int tune_level(void) {
  const char *v = getenv("WEFT_GEMM_TUNE");
  return v && *v ? atoi(v) : 1;
}

static void describe(const cublasLtMatmulAlgo_t *a, char *out, size_t n) {
  int id = 0, tile = 0, stages = 0, splitk = 0;
  size_t w;
  cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
  cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
  cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
  cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
  snprintf(out, n, "algo %d tile %d stages %d split-k %d", id, tile, stages, splitk);
}

/* choice_propose's taker: the candidate agreed for plans[ctx]. */
static void take_algo(void *ctx, int i) {
  gemm_plan *p = &plans[(intptr_t)ctx];
  if (i >= 0 && i < p->ncand) p->algo = p->cand[i];
}

/* The choice of candidate i (the ones that ran: ok, a bit each) for plan
 * p: taken now, or, in a run of several processes, proposed to them
 * (choice.h) with the heuristic's first run until they agree, so that a
 * product they replicate runs one algorithm, and gives the same bits, in
 * every process. The key: the product and its candidates, not the
 * device. */
static void choose_algo(gemm_plan *p, unsigned ok, int i) {
  gemm_key k;
  memcpy(&k, &p->key, sizeof k); /* its padding too, zero (direct_gemm) */
  k.dev = 0;
  unsigned long long key = choice_hash(CHOICE_HASH0, &k, sizeof k);
  key = choice_hash(key, &p->ncand, sizeof p->ncand);
  key = choice_hash(key, p->cand, sizeof p->cand[0] * (size_t)p->ncand);
  choice_propose(CHOICE_GEMM, key, ok, i, 0, take_algo, (void *)(intptr_t)(p - plans));
}

/* The heuristic's first choice is often not the fastest for shapes off
 * its beaten track (a vocabulary of 50257 columns); a large product that
 * overwrites its result (no accumulation, so running it again changes
 * nothing; a residual's add reads cin, not its result) times each
 * candidate the first time it runs, two calls after one untimed, and
 * keeps the fastest for the run (in a run of several processes, the one
 * they agree: choose_algo). Not under --deterministic, whose bits must
 * not depend on a timing. */
static void tune(gemm_plan *p, cublasLtHandle_t h, const void *b, const void *a, const void *cin, void *c, void *ws,
                 size_t ws_bytes, cudaStream_t s) {
  p->tuned = true;
  int level = tune_level();
  if (level <= 0 || p->key.det || (p->key.beta && p->key.epi != GPU_EPI_RESID)) return;
  /* the work before it done, waited for within a bound (choice.h); else
   * the heuristic's first */
  if (!choice_settled((gpu_stream *)s)) {
    choose_algo(p, 0, 0);
    return;
  }
  cudaEvent_t e0, e1;
  if (cudaEventCreate(&e0) != cudaSuccess) {
    choose_algo(p, 0, 0);
    return;
  }
  if (cudaEventCreate(&e1) != cudaSuccess) {
    cudaEventDestroy(e0);
    choose_algo(p, 0, 0);
    return;
  }
  char what[160];
  snprintf(what, sizeof what, "timing cuBLASLt's %d algorithms for %lld x %lld x %lld", p->ncand,
           (long long)p->key.N, (long long)p->key.M, (long long)p->key.K);
  choice_mark mark = choice_begin(CHOICE_GEMM, what);
  float alpha = 1.0f, beta = p->key.beta ? 1.0f : 0.0f, best = -1.0f;
  int besti = 0;
  unsigned ran = 0;
  for (int i = 0; i < p->ncand; i++) {
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    for (int r = 0; r < 3 && st == CUBLAS_STATUS_SUCCESS; r++) {
      if (r == 1) cudaEventRecord(e0, s);
      st = cublasLtMatmul(h, p->desc, &alpha, b, p->lx, a, p->ly, &beta, cin, p->ld, c, p->ld, &p->cand[i], ws,
                          ws_bytes, s);
    }
    cudaEventRecord(e1, s);
    float ms = -1.0f;
    if (st != CUBLAS_STATUS_SUCCESS || cudaEventSynchronize(e1) != cudaSuccess ||
        cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
      ms = -1.0f;
    cudaGetLastError();
    if (level >= 2) {
      char d[96];
      describe(&p->cand[i], d, sizeof d);
      fprintf(stderr, "weft gemm tune: %lld x %lld x %lld (ld %lld %lld %lld): candidate %d, %s: %.4f ms\n",
              (long long)p->key.M, (long long)p->key.N, (long long)p->key.K, (long long)p->key.ldx,
              (long long)p->key.ldy, (long long)p->key.ldd, i, d, ms >= 0 ? ms / 2 : -1.0);
    }
    if (ms >= 0) ran |= 1u << i;
    if (ms >= 0 && (best < 0 || ms < best)) best = ms, besti = i;
  }
  choose_algo(p, ran, besti);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  choice_end(mark);
}

#endif

/* One product as one cublasLtMatmul (k > 0). */
static bool direct_gemm(gpu_stream *s, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                        int adt, const void *b, int64_t ldb, int bdt, void *c, int64_t ldc, int cdt, const void *bias,
                        bool acc, int epi, void *aux, void *ws, size_t ws_bytes, bool deterministic, char *err,
                        size_t errlen, int auxdt = -1) {
  /* column-major: M = n, N = m; X = B (op tb), Y = A (op ta), D = C */
#ifdef WEFT_CUDA_EMU
  (void)ws, (void)ws_bytes, (void)deterministic;
  emu_enqueue((emu_stream *)s, [=] {
    emu_lt_matmul(tb, ta, n, m, k, b, ldb, bdt, a, lda, adt, c, ldc, cdt, bias, acc, epi, aux, auxdt);
  });
  return true;
#else
  gemm_key key;
  memset(&key, 0, sizeof key);
  cudaGetDevice(&key.dev);
  key.tx = tb, key.ty = ta, key.M = n, key.N = m, key.K = k;
  key.ldx = ldb, key.ldy = lda, key.ldd = ldc;
  key.xdt = bdt, key.ydt = adt, key.ddt = cdt;
  /* a residual's add: C is aux, D the result (beta 1) */
  bool resid = epi == GPU_EPI_RESID;
  const void *cin = resid ? aux : c;
  key.bias = bias != NULL, key.beta = acc || resid, key.det = deterministic, key.epi = epi;
  key.auxdt = epi == GPU_EPI_DBIAS ? auxdt : 0;
  key.align[0] = alignment(b), key.align[1] = alignment(a), key.align[2] = alignment(cin), key.align[3] = alignment(c);
  key.align[4] = epi != GPU_EPI_NONE && !resid ? alignment(aux) : 0;
  key.ws = ws_bytes;
  gemm_plan *p = plan_for(&key, err, errlen);
  if (!p) return false;
  if (bias && lt_failed(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                       sizeof bias),
                        "bias", err, errlen))
    return false;
  if (epi == GPU_EPI_DBIAS &&
      lt_failed(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &aux, sizeof aux),
                "bias gradient", err, errlen))
    return false;
  if (epi != GPU_EPI_NONE && !resid && epi != GPU_EPI_DBIAS &&
      lt_failed(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                                      &aux, sizeof aux),
                                       "epilogue's input", err, errlen))
    return false;
  if (!p->tuned && 2.0 * (double)m * (double)n * (double)k >= (double)((int64_t)1 << 30))
    tune(p, handles[key.dev], b, a, cin, c, ws, ws_bytes, (cudaStream_t)s);
  float alpha = 1.0f, beta = key.beta ? 1.0f : 0.0f;
  return !lt_failed(cublasLtMatmul(handles[key.dev], p->desc, &alpha, b, p->lx, a, p->ly, &beta, cin, p->ld, c, p->ld,
                                   &p->algo, ws, ws_bytes, (cudaStream_t)s),
                    "matmul", err, errlen);
#endif
}

/* ---- staging misaligned rows ---------------------------------------------------------- */

/* cuBLASLt runs its fast kernels only on pointers and leading dimensions
 * that are multiples of 16 bytes; a row of an odd number of 16-bit
 * elements (logits over a vocabulary of 50257) gets a generic kernel
 * several times slower. A large product with such an operand or result
 * goes through the staging area of the workspace instead, in chunks of
 * the rows (or columns) of C: each chunk of a misaligned operand is
 * copied there with its rows padded to 16 bytes, a misaligned result is
 * computed there and copied out. Every element of C is still one product
 * over the whole of k, in one call, so the sums and --deterministic keep
 * their meaning. */

static int64_t env_i64(const char *name, int64_t dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  char *end;
  long long x = strtoll(v, &end, 10);
  return *end || x < 0 ? dflt : (int64_t)x;
}

static bool misaligned(const void *p, int64_t ld, int dt) {
  return (uintptr_t)p % 16 != 0 || (ld * gpu_dtype_size(dt)) % 16 != 0;
}

/* cols rounded up to 16 bytes of elements of dt */
static int64_t pad(int64_t cols, int dt) {
  int64_t q = 16 / gpu_dtype_size(dt);
  return (cols + q - 1) / q * q;
}

static int64_t up256(int64_t x) { return (x + 255) / 256 * 256; }

/* The chunk (a multiple of 8, or the whole of dim) that fits `room` with
 * `whole` bytes staged once and `per` bytes a unit of the chunk; 0 when
 * none does. */
static int64_t chunk_of(int64_t dim, int64_t room, int64_t whole, int64_t per) {
  int64_t left = room - up256(whole) - 2 * 256;
  if (left <= 0) return 0;
  if (per == 0) return dim;
  /* padded chunks take at most a multiple of 8 units */
  int64_t r = left / per / 8 * 8;
  return r >= (dim + 7) / 8 * 8 ? dim : r;
}

static const void *at(const void *p, int dt, int64_t ld, int64_t i, int64_t j) {
  return (const char *)p + (i * ld + j) * gpu_dtype_size(dt);
}

/* A staged product (every operand's rows aligned) whose m, n or k is not
 * a multiple of 8 (the vocabulary's 50257) is split in two: the bulk, of
 * a multiple of 8, which cuBLASLt runs on its tiled kernels, and the few
 * rows or columns (of C, or of the sum over k, then accumulated) left
 * over. WEFT_GEMM_EVEN=0 runs it whole. */
static bool even_gemm(gpu_stream *s, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                      int adt, const void *b, int64_t ldb, int bdt, void *c, int64_t ldc, int cdt, const void *bias,
                      bool acc, void *ws, size_t ws_bytes, bool deterministic, char *err, size_t errlen) {
  bool even = env_i64("WEFT_GEMM_EVEN", 1) != 0;
  int64_t n8 = n / 8 * 8, k8 = k / 8 * 8;
  if (even && n % 8 && n8 >= 64) {
    /* C's columns [0, n8) and [n8, n): op(B)'s columns, the bias's entries */
    const void *b2 = tb ? at(b, bdt, ldb, n8, 0) : at(b, bdt, ldb, 0, n8);
    return even_gemm(s, ta, tb, m, n8, k, a, lda, adt, b, ldb, bdt, c, ldc, cdt, bias, acc, ws, ws_bytes,
                     deterministic, err, errlen) &&
           even_gemm(s, ta, tb, m, n - n8, k, a, lda, adt, b2, ldb, bdt, (void *)at(c, cdt, ldc, 0, n8), ldc, cdt,
                     bias ? at(bias, cdt, 0, 0, n8) : NULL, acc, ws, ws_bytes, deterministic, err, errlen);
  }
  if (even && m % 8 && m / 8 * 8 >= 64) {
    /* C's rows [0, m8) and [m8, m): op(A)'s rows */
    const int64_t m8 = m / 8 * 8;
    const void *a2 = ta ? at(a, adt, lda, 0, m8) : at(a, adt, lda, m8, 0);
    return even_gemm(s, ta, tb, m8, n, k, a, lda, adt, b, ldb, bdt, c, ldc, cdt, bias, acc, ws, ws_bytes,
                     deterministic, err, errlen) &&
           even_gemm(s, ta, tb, m - m8, n, k, a2, lda, adt, b, ldb, bdt, (void *)at(c, cdt, ldc, m8, 0), ldc, cdt,
                     bias, acc, ws, ws_bytes, deterministic, err, errlen);
  }
  if (even && k % 8 && k8 >= 64) {
    /* the sum over [0, k8), then [k8, k) added: op(A)'s columns, op(B)'s rows */
    const void *a2 = ta ? at(a, adt, lda, k8, 0) : at(a, adt, lda, 0, k8);
    const void *b2 = tb ? at(b, bdt, ldb, 0, k8) : at(b, bdt, ldb, k8, 0);
    return direct_gemm(s, ta, tb, m, n, k8, a, lda, adt, b, ldb, bdt, c, ldc, cdt, bias, acc, GPU_EPI_NONE, NULL, ws,
                       ws_bytes, deterministic, err, errlen) &&
           direct_gemm(s, ta, tb, m, n, k - k8, a2, lda, adt, b2, ldb, bdt, c, ldc, cdt, NULL, true, GPU_EPI_NONE,
                       NULL, ws, ws_bytes, deterministic, err, errlen);
  }
  return direct_gemm(s, ta, tb, m, n, k, a, lda, adt, b, ldb, bdt, c, ldc, cdt, bias, acc, GPU_EPI_NONE, NULL, ws,
                     ws_bytes, deterministic, err, errlen);
}

static int64_t nstaged;
int64_t gpu_gemm_staged(void) { return nstaged; }

bool gpu_gemm(gpu_stream *s, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda, int adt,
              const void *b, int64_t ldb, int bdt, void *c, int64_t ldc, int cdt, const void *bias, bool acc,
              void *ws, size_t ws_bytes, bool deterministic, char *err, size_t errlen) {
  if (m == 0 || n == 0) return true;
  if (k == 0) {
    DISPATCH(cdt, T, launch(k_fill_rows<T>, blocks_for(m * n, 256), 256, 0, s, (T *)c, m, n, ldc, (const T *)bias, acc));
    return true;
  }
  size_t lt = ws_bytes < lt_ws() ? ws_bytes : lt_ws();
  bool am = misaligned(a, lda, adt), bm = misaligned(b, ldb, bdt), cm = misaligned(c, ldc, cdt);
  /* WEFT_GEMM_STAGE_FLOPS and WEFT_GEMM_STAGE_BYTES lower the size from
   * which a product is staged and the room it takes (for tests) */
  double flops = 2.0 * (double)m * (double)n * (double)k;
  int64_t room = 0;
  char *area = NULL;
  if (ws && ws_bytes > lt) {
    area = (char *)ws + lt;
    area = (char *)(((uintptr_t)area + 255) / 256 * 256);
    room = (int64_t)((char *)ws + ws_bytes - area);
    int64_t cap = env_i64("WEFT_GEMM_STAGE_BYTES", room);
    if (cap < room) room = cap;
  }
  bool large = flops >= (double)env_i64("WEFT_GEMM_STAGE_FLOPS", (int64_t)1 << 30);
  /* aligned rows (a buffer of padded rows, pad_rows in exec.c) of an odd
   * width: split as a staged product is, off the generic kernel */
  if (!(am || bm || cm) && large)
    return even_gemm(s, ta, tb, m, n, k, a, lda, adt, b, ldb, bdt, c, ldc, cdt, bias, acc, ws, lt, deterministic, err,
                     errlen);
  if (!(am || bm || cm) || !large || room <= 0)
    return direct_gemm(s, ta, tb, m, n, k, a, lda, adt, b, ldb, bdt, c, ldc, cdt, bias, acc, GPU_EPI_NONE, NULL, ws,
                       lt, deterministic, err, errlen);
  int64_t as = gpu_dtype_size(adt), bs = gpu_dtype_size(bdt), cs = gpu_dtype_size(cdt);
  /* over the rows of C: B whole; a row of C's chunk takes a row of C and
   * one of op(A) (a row of A, or a column of A stored [k,m]) */
  int64_t wb = bm ? (tb ? n * pad(k, bdt) : k * pad(n, bdt)) * bs : 0;
  int64_t rm = chunk_of(m, room, wb, (cm ? pad(n, cdt) * cs : 0) + (am ? (ta ? k : pad(k, adt)) * as : 0));
  /* over the columns of C: A whole */
  int64_t wa = am ? (ta ? k * pad(m, adt) : m * pad(k, adt)) * as : 0;
  int64_t rn = chunk_of(n, room, wa, (cm ? m * cs : 0) + (bm ? (tb ? pad(k, bdt) : k) * bs : 0));
  if (rm == 0 && rn == 0)
    return direct_gemm(s, ta, tb, m, n, k, a, lda, adt, b, ldb, bdt, c, ldc, cdt, bias, acc, GPU_EPI_NONE, NULL, ws,
                       lt, deterministic, err, errlen);
  nstaged++;
  /* fewer chunks is larger products */
  bool rows = rm > 0 && (rn == 0 || (m + rm - 1) / rm <= (n + rn - 1) / rn);
  int64_t step = rows ? rm : rn, dim = rows ? m : n;
  /* the areas: the whole operand, then the chunk's operand, then C's */
  char *whole = area, *part = whole + up256(rows ? wb : wa);
  if (rows && bm) {
    int64_t r = tb ? n : k, cols = tb ? k : n;
    copy2d(s, bdt, whole, pad(cols, bdt), b, ldb, r, cols);
    b = whole, ldb = pad(cols, bdt);
  }
  if (!rows && am) {
    int64_t r = ta ? k : m, cols = ta ? m : k;
    copy2d(s, adt, whole, pad(cols, adt), a, lda, r, cols);
    a = whole, lda = pad(cols, adt);
  }
  for (int64_t i0 = 0; i0 < dim; i0 += step) {
    int64_t r = dim - i0 < step ? dim - i0 : step;
    const void *ca = a, *cb = b, *cbias = bias;
    int64_t clda = lda, cldb = ldb, cldc = ldc;
    void *cc;
    char *next = part;
    if (rows) {
      /* op(A)'s rows i0.. : A's rows, or the columns of A stored [k,m] */
      int64_t ar = ta ? k : r, acols = ta ? r : k;
      ca = ta ? at(a, adt, lda, 0, i0) : at(a, adt, lda, i0, 0);
      if (am) {
        copy2d(s, adt, next, pad(acols, adt), ca, lda, ar, acols);
        ca = next, clda = pad(acols, adt);
        next += up256(ar * clda * as);
      }
      cc = (void *)at(c, cdt, ldc, i0, 0);
    } else {
      int64_t br = tb ? r : k, bcols = tb ? k : r;
      cb = tb ? at(b, bdt, ldb, i0, 0) : at(b, bdt, ldb, 0, i0);
      if (bm) {
        copy2d(s, bdt, next, pad(bcols, bdt), cb, ldb, br, bcols);
        cb = next, cldb = pad(bcols, bdt);
        next += up256(br * cldb * bs);
      }
      cc = (void *)at(c, cdt, ldc, 0, i0);
      if (bias) cbias = at(bias, cdt, 0, 0, i0);
    }
    int64_t cr = rows ? r : m, ccols = rows ? n : r;
    void *dst = cc;
    if (cm) {
      cldc = pad(ccols, cdt);
      if (acc) copy2d(s, cdt, next, cldc, dst, ldc, cr, ccols);
      cc = next;
    }
    if (!even_gemm(s, ta, tb, cr, ccols, k, ca, clda, adt, cb, cldb, bdt, cc, cldc, cdt, cbias, acc, ws, lt,
                   deterministic, err, errlen))
      return false;
    if (cm) copy2d(s, cdt, dst, ldc, cc, cldc, cr, ccols);
  }
  return true;
}

/* ---- products with an epilogue ------------------------------------------------------------ */

static int64_t nfused;
int64_t gpu_gemm_fused(void) { return nfused; }

bool gpu_gemm_epi(gpu_stream *s, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                  int adt, const void *b, int64_t ldb, int bdt, void *c, int cdt, const void *bias, int epi, void *aux,
                  void *ws, size_t ws_bytes, bool deterministic, char *err, size_t errlen) {
  if (epi == GPU_EPI_NONE)
    return gpu_gemm(s, ta, tb, m, n, k, a, lda, adt, b, ldb, bdt, c, n, cdt, bias, false, ws, ws_bytes, deterministic,
                    err, errlen);
  if (epi < 0 || epi > GPU_EPI_RESID) {
    snprintf(err, errlen, "gemm: epilogue %d unknown", epi);
    return false;
  }
  if (m == 0 || n == 0) return true;
  if (epi == GPU_EPI_RESID && aux && (const char *)aux < (const char *)c + m * n * gpu_dtype_size(cdt) &&
      (const char *)c < (const char *)aux + m * n * gpu_dtype_size(cdt)) {
    snprintf(err, errlen, "gemm: a residual's add whose input meets its result");
    return false;
  }
  /* cuBLASLt's GELU epilogues want the aux matrix's leading dimension a
   * multiple of 8 and, as its fast kernels, aligned rows; where it has no
   * algorithm for one (refused), that epilogue is not asked again */
  static bool refused[4];
  if (k > 0 && n % 8 == 0 && !refused[epi] && !misaligned(a, lda, adt) && !misaligned(b, ldb, bdt) &&
      !misaligned(c, n, cdt) && !misaligned(aux, n, cdt)) {
    size_t lt = ws_bytes < lt_ws() ? ws_bytes : lt_ws();
    char e2[400];
    if (direct_gemm(s, ta, tb, m, n, k, a, lda, adt, b, ldb, bdt, c, n, cdt, bias, false, epi, aux, ws, lt,
                    deterministic, e2, sizeof e2)) {
      nfused++;
      return true;
    }
    refused[epi] = true;
  }
  if (epi == GPU_EPI_GELU)
    return gpu_gemm(s, ta, tb, m, n, k, a, lda, adt, b, ldb, bdt, aux, n, cdt, bias, false, ws, ws_bytes,
                    deterministic, err, errlen) &&
           (gpu_gelu(s, cdt, c, aux, m * n), true);
  if (epi == GPU_EPI_RESID)
    return gpu_gemm(s, ta, tb, m, n, k, a, lda, adt, b, ldb, bdt, c, n, cdt, bias, false, ws, ws_bytes,
                    deterministic, err, errlen) &&
           (gpu_add(s, cdt, c, c, aux, m * n), true);
  return gpu_gemm(s, ta, tb, m, n, k, a, lda, adt, b, ldb, bdt, c, n, cdt, NULL, false, ws, ws_bytes, deterministic,
                  err, errlen) &&
         (gpu_gelu_backward(s, cdt, c, c, aux, m * n, false), true);
}

static char dbias_why[400];
const char *gpu_gemm_dbias_refused(void) { return dbias_why; }

bool gpu_gemm_dbias(gpu_stream *s, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                    int adt, const void *b, int64_t ldb, int bdt, void *c, int cdt, void *dbias, int bias_dt,
                    void *ws, size_t ws_bytes, bool *fused, char *err, size_t errlen) {
  *fused = false;
  /* where cuBLASLt refuses a combination of types (no algorithm, or the
   * call fails), that combination is not asked again; a failure that is
   * not cuBLASLt's shows again in the product the caller then runs */
  static uint64_t refused;
  if (adt < 0 || adt > 3 || cdt < 0 || cdt > 3 || bias_dt < 0 || bias_dt > 3) return true;
  uint64_t bit = (uint64_t)1 << (adt + 4 * (cdt + 4 * bias_dt));
  if (refused & bit || tb || m <= 0 || n <= 0 || k <= 0 || m % 8 || n % 8 || k % 8 || misaligned(a, lda, adt) ||
      misaligned(b, ldb, bdt) || misaligned(c, n, cdt) || (uintptr_t)dbias % 16)
    return true;
  size_t lt = ws_bytes < lt_ws() ? ws_bytes : lt_ws();
  char e2[400];
  if (!direct_gemm(s, ta, tb, m, n, k, a, lda, adt, b, ldb, bdt, c, n, cdt, NULL, false, GPU_EPI_DBIAS, dbias, ws, lt,
                   false, e2, sizeof e2, bias_dt)) {
    refused |= bit;
    snprintf(dbias_why, sizeof dbias_why, "%s", e2);
    if (getenv("WEFT_GEMM_TUNE") && atoi(getenv("WEFT_GEMM_TUNE")) >= 2)
      fprintf(stderr, "weft gemm: the bias gradient's epilogue not taken: %s\n", e2);
    return true;
  }
  (void)err, (void)errlen;
  nfused++;
  *fused = true;
  return true;
}

/* ---- column sums ------------------------------------------------------------------------ */

/* Rows per chunk: at most 128 chunks, each of at least 64 rows. */
static int64_t colsum_rows(int64_t m) {
  int64_t r = (m + 127) / 128;
  return r < 64 ? 64 : r;
}

size_t gpu_colsum_ws(int64_t m, int64_t n) {
  int64_t chunks = (m + colsum_rows(m) - 1) / colsum_rows(m);
  return (size_t)((chunks < 1 ? 1 : chunks) * n) * sizeof(float);
}

/* Columns of 16 bytes (E elements of T) a thread, the rows of a chunk
 * split over the block's warps (warp w: rows w, w + warps, ...), which add
 * theirs in order in shared memory (32 E floats): one load of 16
 * bytes where the first kernel makes E loads of one element, and the
 * chunk's rows in flight at once. For rows whose width is a multiple of 16
 * bytes, at an address on 16 bytes; WEFT_COLSUM_KERNEL=old times the
 * first. */
template <class T>
__global__ void k_colsum_part_vec(float *part, const T *dy, int64_t m, int64_t n, int64_t rows) {
  enum { E = pack16<T>::E };
  DYN_SMEM(float, red);
  const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int64_t c = blockIdx.y, col = ((int64_t)blockIdx.x * 32 + lane) * E;
  const int64_t lo = c * rows, hi = lo + rows < m ? lo + rows : m;
  float sum[E];
#pragma unroll
  for (int i = 0; i < E; i++) sum[i] = 0.0f;
  if (col < n)
    for (int64_t r = lo + wi; r < hi; r += nw) {
      const pack16<T> v = ld16(dy + r * n + col);
#pragma unroll
      for (int i = 0; i < E; i++) sum[i] += to_f(v.e[i]);
    }
  for (int k = 0; k < nw; k++) {
    if (wi == k)
#pragma unroll
      for (int i = 0; i < E; i++) red[lane * E + i] = k ? red[lane * E + i] + sum[i] : sum[i];
    __syncthreads();
  }
  for (int j = threadIdx.x; j < 32 * E; j += blockDim.x)
    if (blockIdx.x * 32 * E + j < n) part[c * n + blockIdx.x * 32 * E + j] = red[j];
}

static bool colsum_old(void) {
  const char *e = getenv("WEFT_COLSUM_KERNEL");
  return e && strcmp(e, "old") == 0;
}

/* part[c][j] = the sum of column j over chunk c of the rows. */
template <class T>
__global__ void k_colsum_part(float *part, const T *dy, int64_t m, int64_t n, int64_t rows) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y;
  if (j >= n) return;
  int64_t lo = c * rows, hi = lo + rows < m ? lo + rows : m;
  float sum = 0.0f;
  for (int64_t i = lo; i < hi; i++) sum += to_f(dy[i * n + j]);
  part[c * n + j] = sum;
}

void gpu_colsum(gpu_stream *s, int dt, void *dbias, int bias_dt, const void *dy, int64_t m, int64_t n, bool acc,
                void *ws) {
  if (n == 0) return;
  int64_t rows = colsum_rows(m), chunks = (m + rows - 1) / rows;
  float *part = (float *)ws;
  const int64_t e = 16 / (int64_t)gpu_dtype_size(dt);
  if (chunks > 0 && n % e == 0 && !((uintptr_t)dy & 15) && !colsum_old()) {
    /* a warp takes 32 chunks of 16 bytes of the columns */
    const unsigned bx = (unsigned)((n / e + 31) / 32);
    DISPATCH(dt, T, launch(k_colsum_part_vec<T>, dim3(bx, (unsigned)chunks), 32 * ROW_WARPS,
                           (size_t)(32 * e) * sizeof(float), s, part, (const T *)dy, m, n, rows));
    DISPATCH(bias_dt, T, chunks_done<T>(s, (T *)dbias, part, (T *)NULL, (const float *)NULL, chunks, n, acc));
    return;
  }
  DISPATCH(dt, T, {
    if (chunks > 0)
      launch(k_colsum_part<T>, dim3((unsigned)((n + 255) / 256), (unsigned)chunks), 256, 0, s, part, (const T *)dy, m,
             n, rows);
  });
  DISPATCH(bias_dt, T, chunks_done<T>(s, (T *)dbias, part, (T *)NULL, (const float *)NULL, chunks, n, acc));
}
