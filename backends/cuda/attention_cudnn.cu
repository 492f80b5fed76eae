/* attention_cudnn.cu - causal attention through cuDNN's fused flash
 * attention, the other way to run attention_fa.cu's forward and
 * attention_fa_bwd.cu's backward: the operation graph of the scores, the
 * scale, the causal mask, the softmax with its log-sum-exp and the product
 * with V (and the backward's graph) built with cuDNN's backend API, which
 * picks its own kernels (on an H100 or H200, kernels of the Hopper tensor
 * cores' warp-group instructions that mma.sync cannot reach).
 *
 * WEFT_ATTN=cudnn asks for it, and attention_pick.cu times it against
 * the plugin's kernels by default. cuDNN is loaded at run time (dlopen of
 * libcudnn.so.9: the file WEFT_CUDNN names, and only it; else the loader's
 * search, else the toolkit's lib64), so the plugin neither links nor needs
 * it. It takes 16-bit heads of up to 128 (grouped queries too), causal
 * (queries and keys of the same positions, or under context parallelism
 * queries from position qpos against every key: the mask's row index
 * shifted by qpos, a scalar given at execution, so that every part's plan
 * is one) or with every key in view (T5's attention, gpu_attention_full),
 * rows on 16 bytes, a backward that writes (not adds to) its gradients;
 * under --deterministic the backward's graph writes dq straight from its
 * product, which has cuDNN take its kernel that sums dq in one order (the
 * default one sums it in f32 with atomics). Whatever it does not take, or
 * refuses (a library not found, a graph no engine runs), goes to the
 * plugin's kernels, with one line on stderr that says why the first time
 * (where WEFT_ATTN=cudnn, WEFT_CUDNN or WEFT_CUDNN_VERBOSE asks).
 *
 * The log-sum-exp cuDNN keeps (its "stats", natural log of the scaled
 * scores) is the one gpu_attention keeps, laid out [b, hq, sq] alike, so a
 * forward of one and a backward of the other agree. */
#include "attention.cuh"

#if defined(WEFT_CUDA_EMU) || defined(WEFT_NO_CUDNN)

bool attention_cudnn_forward(gpu_stream *, int, void *, const void *, const void *, const void *, const gpu_attn *,
                             float *, bool) {
  return false;
}
size_t attention_cudnn_backward_ws(int, const gpu_attn *, bool) { return 0; }
bool attention_cudnn_ready(int, const gpu_attn *, bool, bool) { return false; }
bool gpu_attention_cudnn_offline(const char *, int, const gpu_attn *, bool, bool, int64_t *, char *err, size_t errlen) {
  snprintf(err, errlen, "this plugin is built without cuDNN's path");
  return false;
}
bool attention_cudnn_backward(gpu_stream *, int, void *, void *, void *, const void *, const void *, const void *,
                              const void *, const gpu_attn *, bool, const float *, const void *, void *, bool) {
  return false;
}
bool gpu_cudnn_about(char *buf, size_t n) {
  snprintf(buf, n, "this plugin is built without cuDNN's path");
  return false;
}

#else

#include <dlfcn.h>
#include <cudnn_graph.h>

#include "choice.h"

namespace {

/* ---- the library ------------------------------------------------------------------------ */

struct dn_api {
  int state; /* 0: not tried, 1: loaded, -1: not to be used */
  size_t version;
  size_t (*get_version)(void);
  cudnnStatus_t (*create)(cudnnHandle_t *);
  cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t);
  cudnnStatus_t (*make)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
  cudnnStatus_t (*destroy)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*set)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t, int64_t,
                       const void *);
  cudnnStatus_t (*get)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                       int64_t, int64_t *, void *);
  cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
  const char *(*status_string)(cudnnStatus_t);
  void (*last_error)(char *, size_t);
};

dn_api dn;
cudnnHandle_t dn_handles[64];

/* Whether to say why cuDNN does not take something: when WEFT_ATTN=cudnn
 * asks for it, WEFT_CUDNN names it or WEFT_CUDNN_VERBOSE is set; the
 * automatic choice goes without it quietly. The words start with who asked. */
bool loud(void) {
  const char *named = getenv("WEFT_CUDNN");
  return attention_forced() == ATTN_CUDNN || getenv("WEFT_CUDNN_VERBOSE") || (named && *named);
}
const char *asker(void) { return attention_forced() == ATTN_CUDNN ? "WEFT_ATTN=cudnn" : "cuDNN's attention"; }

/* Says once why cuDNN's attention is not used, and stops trying it. */
void dn_off(const char *why) {
  if (dn.state != -1 && loud())
    fprintf(stderr, "weft: %s: %s; attention runs on the plugin's kernels\n", asker(), why);
  dn.state = -1;
}

template <class F> bool sym(void *lib, const char *name, F *fn) {
  *fn = (F)dlsym(lib, name);
  return *fn != NULL;
}

/* libcudnn.so.9: the file WEFT_CUDNN names, and only it; else where it
 * usually is. NULL with why. */
void *dn_open(char *why, size_t n) {
  const char *named = getenv("WEFT_CUDNN");
  if (named && !*named) named = NULL;
  const char *usual[] = {"libcudnn.so.9", "/usr/local/cuda/lib64/libcudnn.so.9",
                         "/usr/lib/x86_64-linux-gnu/libcudnn.so.9"};
  void *lib = named ? dlopen(named, RTLD_NOW | RTLD_LOCAL) : NULL;
  for (size_t i = 0; !named && i < sizeof usual / sizeof usual[0] && !lib; i++)
    lib = dlopen(usual[i], RTLD_NOW | RTLD_LOCAL);
  if (!lib && named) snprintf(why, n, "WEFT_CUDNN=%s does not load: %s", named, dlerror());
  else if (!lib) snprintf(why, n, "libcudnn.so.9 is not found (set WEFT_CUDNN to its path)");
  return lib;
}

/* Why a version of cuDNN is not used, NULL: it is. 9.10.0 and 9.10.1:
 * NVIDIA's frontend refuses their fused attention. */
const char *dn_refused(size_t v) {
  if (v < 90000) return "older than 9.0";
  if (v >= 91000 && v < 91002) return "9.10.0 or 9.10.1, whose fused attention has known faults";
  return NULL;
}

bool dn_load_now(void);

/* Loads cuDNN the first time (a choice, choice.h); whether it is there to
 * use. */
bool dn_load(void) {
  if (dn.state) return dn.state == 1;
  const choice_mark m = choice_begin(CHOICE_CUDNN, "loading cuDNN");
  const bool ok = dn_load_now();
  choice_end(m);
  return ok;
}

bool dn_load_now(void) {
  char why[768];
  void *lib = dn_open(why, sizeof why);
  if (!lib) {
    dn_off(why);
    return false;
  }
  if (!sym(lib, "cudnnGetVersion", &dn.get_version) || !sym(lib, "cudnnCreate", &dn.create) ||
      !sym(lib, "cudnnSetStream", &dn.set_stream) || !sym(lib, "cudnnBackendCreateDescriptor", &dn.make) ||
      !sym(lib, "cudnnBackendDestroyDescriptor", &dn.destroy) || !sym(lib, "cudnnBackendSetAttribute", &dn.set) ||
      !sym(lib, "cudnnBackendGetAttribute", &dn.get) || !sym(lib, "cudnnBackendFinalize", &dn.finalize) ||
      !sym(lib, "cudnnBackendExecute", &dn.execute) || !sym(lib, "cudnnGetErrorString", &dn.status_string)) {
    dn_off("libcudnn.so.9 lacks the backend API's functions");
    return false;
  }
  sym(lib, "cudnnGetLastErrorString", &dn.last_error); /* 9.0 on; may be absent */
  dn.version = dn.get_version();
  if (const char *no = dn_refused(dn.version)) {
    snprintf(why, sizeof why, "cuDNN %zu is %s", dn.version, no);
    dn_off(why);
    return false;
  }
  dn.state = 1;
  return true;
}

cudnnHandle_t dn_handle(char *err, size_t errlen) {
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) {
    snprintf(err, errlen, "device %d out of range", dev);
    return NULL;
  }
  if (!dn_handles[dev]) {
    cudnnStatus_t st = dn.create(&dn_handles[dev]);
    if (st != CUDNN_STATUS_SUCCESS) {
      snprintf(err, errlen, "cudnnCreate: %s", dn.status_string(st));
      dn_handles[dev] = NULL;
    }
  }
  return dn_handles[dev];
}

/* ---- building a graph ------------------------------------------------------------------ */

/* The descriptors of one graph under construction: the first failure is
 * kept (with cuDNN's own words where it has them), the rest is skipped. */
struct dn_build {
  bool ok;
  char err[512];
  cudnnBackendDescriptor_t all[160];
  int n;
  /* the engine configs heuristics mode A offered, and of those the ones
   * cuDNN found viable here (a plan of a runtime-compiled engine needs
   * the driver, so without a GPU none is) */
  int64_t offered, viable;
  /* built against a device's properties alone: an engine's kernels
   * compiled and only their loading failed, for want of a GPU */
  bool compiled;
};

void fail(dn_build *b, const char *what, cudnnStatus_t st) {
  if (!b->ok) return;
  b->ok = false;
  char more[256] = "";
  if (dn.last_error) dn.last_error(more, sizeof more);
  snprintf(b->err, sizeof b->err, "%s: %s%s%s", what, dn.status_string(st), *more ? ": " : "", more);
}

cudnnBackendDescriptor_t make(dn_build *b, cudnnBackendDescriptorType_t t, const char *what) {
  if (!b->ok) return NULL;
  if (b->n == (int)(sizeof b->all / sizeof b->all[0])) {
    b->ok = false;
    snprintf(b->err, sizeof b->err, "%s: too many descriptors", what);
    return NULL;
  }
  cudnnBackendDescriptor_t d = NULL;
  cudnnStatus_t st = dn.make(t, &d);
  if (st != CUDNN_STATUS_SUCCESS) {
    fail(b, what, st);
    return NULL;
  }
  b->all[b->n++] = d;
  return d;
}

void set(dn_build *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
         int64_t count, const void *v, const char *what) {
  if (!b->ok) return;
  cudnnStatus_t st = dn.set(d, name, type, count, v);
  if (st != CUDNN_STATUS_SUCCESS) fail(b, what, st);
}

void finish(dn_build *b, cudnnBackendDescriptor_t d, const char *what) {
  if (!b->ok) return;
  cudnnStatus_t st = dn.finalize(d);
  if (st != CUDNN_STATUS_SUCCESS) fail(b, what, st);
}

/* An attribute whose value is a descriptor. */
void attach(dn_build *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t v,
            const char *what) {
  set(b, d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
}

/* Destroys the descriptors, all but keep (NULL: all). */
void release(dn_build *b, cudnnBackendDescriptor_t keep) {
  for (int i = b->n - 1; i >= 0; i--)
    if (b->all[i] != keep) dn.destroy(b->all[i]);
  b->n = 0;
}

/* A tensor of four dimensions (uid 0: virtual, an intermediate of the
 * graph); by_value: a scalar given by address on the host at execution. */
cudnnBackendDescriptor_t tensor(dn_build *b, int64_t uid, int64_t virt_uid, cudnnDataType_t dt, int64_t d0,
                                int64_t d1, int64_t d2, int64_t d3, int64_t s0, int64_t s1, int64_t s2, int64_t s3,
                                bool by_value = false) {
  cudnnBackendDescriptor_t t = make(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "a tensor");
  const int64_t dims[4] = {d0, d1, d2, d3}, strides[4] = {s0, s1, s2, s3};
  const int64_t id = uid ? uid : virt_uid, align = 16;
  const bool virt = uid == 0;
  set(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "a tensor's type");
  set(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, "a tensor's dimensions");
  set(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, "a tensor's strides");
  set(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id, "a tensor's id");
  set(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "a tensor's alignment");
  set(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "whether a tensor is virtual");
  if (by_value) set(b, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "a scalar's passing");
  finish(b, t, "a tensor");
  return t;
}

/* y = mode(x, [bb, [tt]]) in f32. */
cudnnBackendDescriptor_t pointwise(dn_build *b, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                   cudnnBackendDescriptor_t bb, cudnnBackendDescriptor_t y,
                                   cudnnBackendDescriptor_t tt = NULL, int64_t axis = -1,
                                   cudnnDataType_t prec = CUDNN_DATA_FLOAT) {
  cudnnBackendDescriptor_t pw = make(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "a pointwise operator");
  set(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "a pointwise mode");
  set(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "a pointwise precision");
  if (axis >= 0) set(b, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "an index's axis");
  finish(b, pw, "a pointwise operator");
  cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "a pointwise operation");
  attach(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "a pointwise operation's operator");
  attach(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "a pointwise input");
  attach(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "a pointwise output");
  const float alpha = 1.0f;
  set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &alpha, "a pointwise scale");
  set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &alpha, "a pointwise scale");
  if (bb) attach(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, bb, "a pointwise input");
  if (tt) attach(b, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, tt, "a pointwise input");
  finish(b, op, "a pointwise operation");
  return op;
}

/* c = a b over the last two dimensions, f32 sums. */
cudnnBackendDescriptor_t matmul(dn_build *b, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t bb,
                                cudnnBackendDescriptor_t c) {
  cudnnBackendDescriptor_t mm = make(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "a product");
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  set(b, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "a product's sums");
  finish(b, mm, "a product");
  cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "a product operation");
  attach(b, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "a product's A");
  attach(b, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, bb, "a product's B");
  attach(b, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "a product's C");
  attach(b, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm, "a product's descriptor");
  finish(b, op, "a product operation");
  return op;
}

/* y = the reduction of x to y's dimensions, f32. */
cudnnBackendDescriptor_t reduction(dn_build *b, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                                   cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t rd = make(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "a reduction");
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  set(b, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "a reduction's operator");
  set(b, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "a reduction's sums");
  if (dn.version >= 91100) {
    const bool det = false;
    set(b, rd, CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &det, "a reduction's order");
  }
  finish(b, rd, "a reduction");
  cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "a reduction operation");
  attach(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "a reduction's input");
  attach(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "a reduction's output");
  attach(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd, "a reduction's descriptor");
  finish(b, op, "a reduction operation");
  return op;
}

/* Whether the engine of config cfg says it sums in no fixed order. */
bool nondeterministic(cudnnBackendDescriptor_t cfg) {
  cudnnBackendDescriptor_t eng = NULL;
  if (dn.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) != CUDNN_STATUS_SUCCESS) return false;
  bool nd = false;
  int64_t n = 0, k = 0;
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  if (dn.get(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) == CUDNN_STATUS_SUCCESS &&
      n == 1 &&
      dn.get(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &k,
             notes) == CUDNN_STATUS_SUCCESS)
    for (int64_t i = 0; i < k && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++)
      nd = nd || notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
  dn.destroy(eng);
  return nd;
}

/* The operation graph of ops, its engines by heuristics (mode A, then the
 * fallback list), the first whose plan finalizes with at most max_ws bytes
 * of workspace (-1: any) and, where det, whose engine does not say it sums
 * in no fixed order; the plan (kept: the caller destroys it) and its
 * workspace. */
cudnnBackendDescriptor_t plan_of(dn_build *b, cudnnHandle_t h, cudnnBackendDescriptor_t prop,
                                 cudnnBackendDescriptor_t *ops, int nops, int64_t max_ws, bool det, int64_t *ws) {
  cudnnBackendDescriptor_t g = make(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "the operation graph");
  if (h) set(b, g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, "the graph's handle");
  set(b, g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, nops, ops, "the graph's operations");
  finish(b, g, "the operation graph");
  if (!b->ok) return NULL;
  const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
  char first[512] = "";
  for (int m = 0; m < 2; m++) {
    cudnnBackendDescriptor_t hr = make(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "the engine heuristics");
    attach(b, hr, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g, "the heuristics' graph");
    set(b, hr, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m], "the heuristics' mode");
    if (prop) attach(b, hr, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, prop, "the device");
    finish(b, hr, "the engine heuristics");
    if (!b->ok) return NULL;
    int64_t count = 0;
    dn.get(hr, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL);
    if (count > 8) count = 8;
    if (m == 0) b->offered = count;
    cudnnBackendDescriptor_t cfgs[8];
    for (int64_t i = 0; i < count; i++) cfgs[i] = make(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "an engine config");
    if (!b->ok) return NULL;
    int64_t got = 0;
    if (count > 0) {
      cudnnStatus_t st = dn.get(hr, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs);
      if (st != CUDNN_STATUS_SUCCESS) got = 0;
    }
    if (m == 0) b->viable = got;
    for (int64_t i = 0; i < got; i++) {
      if (det && nondeterministic(cfgs[i])) {
        if (!*first) snprintf(first, sizeof first, "an engine that sums in no fixed order, under --deterministic");
        continue;
      }
      cudnnBackendDescriptor_t p = NULL;
      if (dn.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p) != CUDNN_STATUS_SUCCESS) continue;
      cudnnStatus_t st = h ? dn.set(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h)
                           : dn.set(p, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &prop);
      if (st == CUDNN_STATUS_SUCCESS)
        st = dn.set(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
      if (st == CUDNN_STATUS_SUCCESS) st = dn.finalize(p);
      if (st == CUDNN_STATUS_SUCCESS) {
        int64_t n = 0;
        *ws = 0;
        dn.get(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, ws);
        if (max_ws < 0 || *ws <= max_ws) return p;
        if (!*first) snprintf(first, sizeof first, "a plan that wants %lld bytes of workspace", (long long)*ws);
        dn.destroy(p);
        continue;
      }
      if (prop && st == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER) {
        b->compiled = true;
        dn.destroy(p);
        return NULL;
      }
      if (!*first) {
        char more[256] = "";
        if (dn.last_error) dn.last_error(more, sizeof more);
        snprintf(first, sizeof first, "%s%s%s", dn.status_string(st), *more ? ": " : "", more);
      }
      dn.destroy(p);
    }
  }
  b->ok = false;
  snprintf(b->err, sizeof b->err, "no engine runs the graph%s%s", *first ? " (the first: " : "",
           *first ? first : "");
  if (*first) strncat(b->err, ")", sizeof b->err - strlen(b->err) - 1);
  return NULL;
}

/* ---- the graphs ------------------------------------------------------------------------ */

/* The tensors' ids in the variant pack; the virtual ones count from 100. */
enum {
  U_Q = 1, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEGINF, U_DO, U_DQ, U_DK, U_DV, U_ONE, U_SUM, U_DQACC, U_QPOS,
  U_VIRT = 100
};

/* One graph's plan for one geometry on one device. */
struct dn_plan {
  int dev, dt;
  bool bwd, det; /* det: the backward of --deterministic */
  bool causal;
  int64_t b, s, sk, h, r, d, q_row, kv_row, o_row, q_batch, kv_batch, o_batch;
  cudnnBackendDescriptor_t plan;
  int64_t ws;      /* the plan's workspace */
  int64_t sum_at;  /* the backward: the row sums' and dq's f32 sums' offsets in our workspace */
  int64_t acc_at;
  int64_t lib_at;  /* and the plan's workspace's */
  int64_t total;   /* the workspace in all */
  bool ran;        /* executed once (WEFT_CUDNN_VERBOSE says so) */
  bool sized;      /* the backward: its workspace asked for (gpu_attention_backward_ws), so
                    * that a caller's workspace holds it */
  /* the graph's descriptors, kept as long as the plan made of them */
  cudnnBackendDescriptor_t kept[160];
  int nkept;
};

dn_plan dn_plans[128];
int dn_nplans;

/* The shapes of one graph: S [b, h, sq, sk] of the scores, R [b, h, sq,
 * 1] of a row's statistics, and tensors of the heads as gpu_attn lays them
 * out (a token's heads side by side in a row: strides [batch, d, row, 1]),
 * K^T and V^T the same memory with the last two dimensions swapped. */
struct dn_shapes {
  dn_build *b;
  cudnnDataType_t io;
  int64_t nb, h, sq, d;
  int64_t virt;
  int64_t hk; /* key/value heads: h / r, the query heads of a group consecutive */
  int64_t sk;
  bool causal; /* query i sees keys 0 to i (sq = sk); else every key */
  bool shifted; /* causal, query i at position qpos + i (a part of the sequence): it sees keys 0 to qpos + i */
};

/* heads of s rows each */
cudnnBackendDescriptor_t heads(dn_shapes &g, int64_t uid, int64_t row, int64_t batch, int64_t h, int64_t s) {
  return tensor(g.b, uid, 0, g.io, g.nb, h, s, g.d, batch, g.d, row, 1);
}
cudnnBackendDescriptor_t heads_t(dn_shapes &g, int64_t uid, int64_t row, int64_t batch, int64_t h, int64_t s) {
  return tensor(g.b, uid, 0, g.io, g.nb, h, g.d, s, batch, g.d, 1, row);
}
cudnnBackendDescriptor_t scores(dn_shapes &g, cudnnDataType_t dt, bool transposed = false) {
  const int64_t ss = g.sq * g.sk;
  if (transposed) return tensor(g.b, 0, g.virt++, dt, g.nb, g.h, g.sk, g.sq, g.h * ss, ss, 1, g.sk);
  return tensor(g.b, 0, g.virt++, dt, g.nb, g.h, g.sq, g.sk, g.h * ss, ss, g.sk, 1);
}
/* [b, h, sq, 1], packed; uid 0: virtual */
cudnnBackendDescriptor_t rows(dn_shapes &g, int64_t uid) {
  return tensor(g.b, uid, g.virt++, CUDNN_DATA_FLOAT, g.nb, g.h, g.sq, 1, g.h * g.sq, g.sq, 1, 1);
}
cudnnBackendDescriptor_t scalar(dn_shapes &g, int64_t uid, cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
  return tensor(g.b, uid, 0, dt, 1, 1, 1, 1, 1, 1, 1, 1, true);
}

/* Whether causal heads are a part of the sequence (context parallelism:
 * queries from position qpos, every key), whose mask is shifted by qpos. */
bool shifted(const gpu_attn *a, bool causal) { return causal && (a->sq != a->sk || a->qpos != 0); }

/* Scores of the causal mask: x where the key is not after the query (row
 * index, plus qpos for a part of the sequence, >= column index), else
 * -inf. */
cudnnBackendDescriptor_t causal(dn_shapes &g, cudnnBackendDescriptor_t *ops, int *n, cudnnBackendDescriptor_t x,
                                cudnnBackendDescriptor_t neg_inf) {
  cudnnBackendDescriptor_t row = scores(g, CUDNN_DATA_INT32), col = scores(g, CUDNN_DATA_INT32);
  cudnnBackendDescriptor_t keep = scores(g, CUDNN_DATA_BOOLEAN), y = scores(g, CUDNN_DATA_FLOAT);
  ops[(*n)++] = pointwise(g.b, CUDNN_POINTWISE_GEN_INDEX, x, NULL, row, NULL, 2);
  if (g.shifted) {
    cudnnBackendDescriptor_t at = scores(g, CUDNN_DATA_INT32);
    ops[(*n)++] = pointwise(g.b, CUDNN_POINTWISE_ADD, row, scalar(g, U_QPOS, CUDNN_DATA_INT32), at, NULL, -1,
                            CUDNN_DATA_INT32);
    row = at;
  }
  ops[(*n)++] = pointwise(g.b, CUDNN_POINTWISE_GEN_INDEX, x, NULL, col, NULL, 3);
  ops[(*n)++] = pointwise(g.b, CUDNN_POINTWISE_CMP_GE, row, col, keep, NULL, -1, CUDNN_DATA_BOOLEAN);
  ops[(*n)++] = pointwise(g.b, CUDNN_POINTWISE_BINARY_SELECT, x, neg_inf, y, keep);
  return y;
}

/* The forward: S = scale Q K^T, masked (causal); Stats = max + log sum
 * exp(S - max); O = (exp(S - max) / sum) V. */
int fwd_graph(dn_shapes &g, cudnnBackendDescriptor_t *ops, const gpu_attn *a) {
  int n = 0;
  cudnnBackendDescriptor_t q = heads(g, U_Q, a->q_row, a->q_batch, g.h, g.sq);
  cudnnBackendDescriptor_t kt = heads_t(g, U_K, a->kv_row, a->kv_batch, g.hk, g.sk);
  cudnnBackendDescriptor_t v = heads(g, U_V, a->kv_row, a->kv_batch, g.hk, g.sk);
  cudnnBackendDescriptor_t o = heads(g, U_O, a->o_row, a->o_batch, g.h, g.sq);
  cudnnBackendDescriptor_t stats = rows(g, U_STATS), scale = scalar(g, U_SCALE);
  cudnnBackendDescriptor_t s0 = scores(g, CUDNN_DATA_FLOAT), s1 = scores(g, CUDNN_DATA_FLOAT);
  ops[n++] = matmul(g.b, q, kt, s0);
  ops[n++] = pointwise(g.b, CUDNN_POINTWISE_MUL, s0, scale, s1);
  cudnnBackendDescriptor_t s2 = g.causal ? causal(g, ops, &n, s1, scalar(g, U_NEGINF)) : s1;
  cudnnBackendDescriptor_t m = rows(g, 0), z = scores(g, CUDNN_DATA_FLOAT), e = scores(g, CUDNN_DATA_FLOAT);
  cudnnBackendDescriptor_t l = rows(g, 0), lnl = rows(g, 0), p = scores(g, g.io);
  ops[n++] = reduction(g.b, CUDNN_REDUCE_TENSOR_MAX, s2, m);
  ops[n++] = pointwise(g.b, CUDNN_POINTWISE_SUB, s2, m, z);
  ops[n++] = pointwise(g.b, CUDNN_POINTWISE_EXP, z, NULL, e);
  ops[n++] = reduction(g.b, CUDNN_REDUCE_TENSOR_ADD, e, l);
  ops[n++] = pointwise(g.b, CUDNN_POINTWISE_LOG, l, NULL, lnl);
  ops[n++] = pointwise(g.b, CUDNN_POINTWISE_ADD, m, lnl, stats);
  ops[n++] = pointwise(g.b, CUDNN_POINTWISE_DIV, e, l, p);
  ops[n++] = matmul(g.b, p, v, o);
  return n;
}

/* A virtual view y of x with the last two dimensions swapped. */
cudnnBackendDescriptor_t reshape(dn_build *b, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "a transposition");
  attach(b, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "a transposition's input");
  attach(b, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "a transposition's output");
  finish(b, op, "a transposition");
  return op;
}

/* Where a product writes a key/value head's gradient: dst itself, or with
 * grouped queries (hk < h) a virtual per-query-head gradient [b, h, s, d]
 * that a reduction then sums over each group into dst. */
cudnnBackendDescriptor_t per_query_head(dn_shapes &g, cudnnBackendDescriptor_t dst) {
  if (g.hk == g.h) return dst;
  const int64_t sd = g.sk * g.d;
  return tensor(g.b, 0, g.virt++, g.io, g.nb, g.h, g.sk, g.d, g.h * sd, sd, g.d, 1);
}

/* The backward: D = rowsum(dO O) (the f32 row sums, in the workspace); P
 * = exp(scale Q K^T - Stats), masked; dV = P^T dO; dS = scale P (dO V^T
 * - D); dK = dS^T Q; dQ = dS K, summed in f32 (in the workspace) and then
 * converted. */
int bwd_graph(dn_shapes &g, cudnnBackendDescriptor_t *ops, const gpu_attn *a) {
  int n = 0;
  cudnnBackendDescriptor_t q = heads(g, U_Q, a->q_row, a->q_batch, g.h, g.sq);
  cudnnBackendDescriptor_t kt = heads_t(g, U_K, a->kv_row, a->kv_batch, g.hk, g.sk);
  cudnnBackendDescriptor_t vt = heads_t(g, U_V, a->kv_row, a->kv_batch, g.hk, g.sk);
  cudnnBackendDescriptor_t o = heads(g, U_O, a->o_row, a->o_batch, g.h, g.sq);
  cudnnBackendDescriptor_t dout = heads(g, U_DO, a->o_row, a->o_batch, g.h, g.sq);
  cudnnBackendDescriptor_t dq = heads(g, U_DQ, a->q_row, a->q_batch, g.h, g.sq);
  cudnnBackendDescriptor_t dk = heads(g, U_DK, a->kv_row, a->kv_batch, g.hk, g.sk);
  cudnnBackendDescriptor_t dv = heads(g, U_DV, a->kv_row, a->kv_batch, g.hk, g.sk);
  cudnnBackendDescriptor_t stats = rows(g, U_STATS), scale = scalar(g, U_SCALE);
  cudnnBackendDescriptor_t one = scalar(g, U_ONE), sum = rows(g, U_SUM);
  const int64_t hsd = g.h * g.sq * g.d, sd = g.sq * g.d;
  /* D */
  cudnnBackendDescriptor_t t1 = tensor(g.b, 0, g.virt++, CUDNN_DATA_FLOAT, g.nb, g.h, g.sq, g.d, hsd, sd, g.d, 1);
  cudnnBackendDescriptor_t t2 = rows(g, 0);
  ops[n++] = pointwise(g.b, CUDNN_POINTWISE_MUL, dout, o, t1);
  ops[n++] = reduction(g.b, CUDNN_REDUCE_TENSOR_ADD, t1, t2);
  ops[n++] = pointwise(g.b, CUDNN_POINTWISE_MUL, t2, one, sum);
  /* P */
  cudnnBackendDescriptor_t s0 = scores(g, CUDNN_DATA_FLOAT), s1 = scores(g, CUDNN_DATA_FLOAT);
  cudnnBackendDescriptor_t s2 = scores(g, CUDNN_DATA_FLOAT);
  ops[n++] = matmul(g.b, q, kt, s0);
  ops[n++] = pointwise(g.b, CUDNN_POINTWISE_MUL, s0, scale, s1);
  ops[n++] = pointwise(g.b, CUDNN_POINTWISE_SUB, s1, stats, s2);
  cudnnBackendDescriptor_t s3 = g.causal ? causal(g, ops, &n, s2, scalar(g, U_NEGINF)) : s2;
  cudnnBackendDescriptor_t p = scores(g, CUDNN_DATA_FLOAT);
  ops[n++] = pointwise(g.b, CUDNN_POINTWISE_EXP, s3, NULL, p);
  /* dV */
  cudnnBackendDescriptor_t pt = scores(g, g.io, true);
  ops[n++] = reshape(g.b, p, pt);
  cudnnBackendDescriptor_t dvh = per_query_head(g, dv);
  ops[n++] = matmul(g.b, pt, dout, dvh);
  if (dvh != dv) ops[n++] = reduction(g.b, CUDNN_REDUCE_TENSOR_ADD, dvh, dv);
  /* dS */
  cudnnBackendDescriptor_t dp = scores(g, CUDNN_DATA_FLOAT), u = scores(g, CUDNN_DATA_FLOAT);
  cudnnBackendDescriptor_t u2 = scores(g, CUDNN_DATA_FLOAT), ds = scores(g, CUDNN_DATA_FLOAT);
  ops[n++] = matmul(g.b, dout, vt, dp);
  ops[n++] = pointwise(g.b, CUDNN_POINTWISE_SUB, dp, sum, u);
  ops[n++] = pointwise(g.b, CUDNN_POINTWISE_MUL, u, p, u2);
  ops[n++] = pointwise(g.b, CUDNN_POINTWISE_MUL, u2, scale, ds);
  /* dK */
  cudnnBackendDescriptor_t dst = scores(g, g.io, true);
  ops[n++] = reshape(g.b, ds, dst);
  cudnnBackendDescriptor_t dkh = per_query_head(g, dk);
  ops[n++] = matmul(g.b, dst, q, dkh);
  if (dkh != dk) ops[n++] = reduction(g.b, CUDNN_REDUCE_TENSOR_ADD, dkh, dk);
  /* dQ */
  cudnnBackendDescriptor_t kn = tensor(g.b, 0, g.virt++, CUDNN_DATA_FLOAT, g.nb, g.hk, g.sk, g.d, a->kv_batch, g.d,
                                       a->kv_row, 1);
  ops[n++] = reshape(g.b, kt, kn);
  if (a->det) {
    /* straight into dq: cuDNN then takes a kernel that sums dq in one
     * order (its workspace holds dP instead) */
    ops[n++] = matmul(g.b, ds, kn, dq);
  } else {
    cudnnBackendDescriptor_t dacc = tensor(g.b, U_DQACC, 0, CUDNN_DATA_FLOAT, g.nb, g.h, g.sq, g.d, hsd, sd, g.d, 1);
    ops[n++] = matmul(g.b, ds, kn, dacc);
    ops[n++] = pointwise(g.b, CUDNN_POINTWISE_IDENTITY, dacc, NULL, dq);
  }
  return n;
}

int64_t up256(int64_t x) { return (x + 255) & ~(int64_t)255; }

/* The workspace a backward's plan may want: any, but under
 * --deterministic, whose engine keeps dP whole (b·h·sq·sk 16-bit values:
 * 805 MB for GPT-2 124M at batch 32), at most DN_DET_WS bytes; a larger
 * one runs on the plugin's kernels. */
const int64_t DN_DET_WS = (int64_t)1 << 31;
int64_t max_ws(const gpu_attn *a) { return a->det ? DN_DET_WS : -1; }

/* Whether cuDNN is asked for and takes these heads. */
bool takes(int dt, const gpu_attn *a, bool causal) {
  if (!(dt == GPU_BF16 || dt == GPU_F16)) return false;
  if (causal && (a->qpos < 0 || a->qpos + a->sq > a->sk || a->qpos > INT32_MAX)) return false;
  if (a->r < 1 || a->hq % a->r || a->sq < 2 || a->sk < 2 || a->dh % 8 || a->dh > 128 || a->b < 1) return false;
  if (a->q_row % 8 || a->kv_row % 8 || a->o_row % 8 || a->q_batch % 8 || a->kv_batch % 8 || a->o_batch % 8)
    return false;
  return dn_load();
}

dn_plan *new_plan(int dt, const gpu_attn *a, bool bwd, bool causal, int dev);

/* The plan of the forward or the backward for these heads, built the
 * first time (a choice, choice.h; its plan NULL where cuDNN refused the
 * graph, said once); NULL when cuDNN cannot be asked. */
dn_plan *plan_for(int dt, const gpu_attn *a, bool bwd, bool causal) {
  int dev = 0;
  cudaGetDevice(&dev);
  for (int i = 0; i < dn_nplans; i++) {
    dn_plan *p = &dn_plans[i];
    if (p->dev == dev && p->dt == dt && p->bwd == bwd && p->det == (bwd && a->det) && p->causal == causal &&
        p->sk == a->sk && p->b == a->b && p->s == a->sq && p->h == a->hq && p->r == a->r &&
        p->d == a->dh && p->q_row == a->q_row && p->kv_row == a->kv_row && p->o_row == a->o_row &&
        p->q_batch == a->q_batch && p->kv_batch == a->kv_batch && p->o_batch == a->o_batch)
      return p;
  }
  if (dn_nplans == (int)(sizeof dn_plans / sizeof dn_plans[0])) {
    static bool said;
    if (!said && loud())
      fprintf(stderr, "weft: %s: more than %d shapes of attention; the others run on the plugin's kernels\n", asker(),
              dn_nplans);
    said = true;
    return NULL;
  }
  char what[160];
  snprintf(what, sizeof what, "cuDNN's plan: %s, b%lld h%lld s%lld d%lld", bwd ? "backward" : "forward",
           (long long)a->b, (long long)a->hq, (long long)a->sq, (long long)a->dh);
  const choice_mark m = choice_begin(CHOICE_CUDNN, what);
  dn_plan *p = new_plan(dt, a, bwd, causal, dev);
  choice_end(m);
  return p;
}

/* plan_for's plan, built (at dn_plans' end). */
dn_plan *new_plan(int dt, const gpu_attn *a, bool bwd, bool causal, int dev) {
  char err[512];
  cudnnHandle_t h = dn_handle(err, sizeof err);
  if (!h) {
    dn_off(err);
    return NULL;
  }
  dn_build b;
  b.ok = true, b.n = 0, b.err[0] = 0, b.offered = b.viable = 0, b.compiled = false;
  dn_shapes g = {&b, dt == GPU_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF, a->b, a->hq, a->sq, a->dh, U_VIRT,
                 a->hq / a->r, a->sk, causal, shifted(a, causal)};
  cudnnBackendDescriptor_t ops[40];
  int n = bwd ? bwd_graph(g, ops, a) : fwd_graph(g, ops, a);
  int64_t ws = 0;
  /* the forward has no workspace of its own */
  cudnnBackendDescriptor_t plan = plan_of(&b, h, NULL, ops, n, bwd ? max_ws(a) : 0, bwd && a->det, &ws);
  if (!plan) release(&b, NULL);
  if (!plan && loud())
    fprintf(stderr,
            "weft: %s: cuDNN %zu takes no %s graph of b%lld h%lld s%lld d%lld (%s); these heads run on "
            "the plugin's kernels\n",
            asker(), dn.version, bwd ? "backward" : "forward", (long long)a->b, (long long)a->hq, (long long)a->sq,
            (long long)a->dh, b.err);
  dn_plan *p = &dn_plans[dn_nplans++];
  memset(p, 0, sizeof *p);
  p->dev = dev, p->dt = dt, p->bwd = bwd, p->det = bwd && a->det, p->causal = causal;
  p->b = a->b, p->s = a->sq, p->sk = a->sk, p->h = a->hq, p->r = a->r, p->d = a->dh;
  p->q_row = a->q_row, p->kv_row = a->kv_row, p->o_row = a->o_row;
  p->q_batch = a->q_batch, p->kv_batch = a->kv_batch, p->o_batch = a->o_batch;
  p->plan = plan, p->ws = ws;
  if (plan) {
    memcpy(p->kept, b.all, sizeof(b.all[0]) * (size_t)b.n);
    p->nkept = b.n;
  }
  if (bwd) {
    p->sum_at = 0;
    p->acc_at = up256(a->b * a->hq * a->sq * 4);
    p->lib_at = p->acc_at + (p->det ? 0 : up256(a->b * a->hq * a->sq * a->dh * 4));
    p->total = p->lib_at + ws;
  } else {
    p->total = ws;
  }
  if (!plan) return p; /* refused: the caller sees p->plan NULL */
  if (getenv("WEFT_CUDNN_VERBOSE"))
    fprintf(stderr, "weft: cuDNN %zu: the %s of b%lld h%lld s%lld d%lld: a plan, %lld bytes of workspace\n",
            dn.version, p->det ? "deterministic backward" : bwd ? "backward" : "forward", (long long)a->b,
            (long long)a->hq, (long long)a->sq, (long long)a->dh, (long long)ws);
  return p;
}

/* Runs the plan on stream s with the tensors of uids; false (cuDNN off,
 * said why) when cuDNN refuses. */
bool run(dn_plan *p, gpu_stream *s, const int64_t *uids, void **ptrs, int n, void *ws) {
  char err[512];
  cudnnHandle_t h = dn_handle(err, sizeof err);
  if (!h) {
    dn_off(err);
    return false;
  }
  cudnnStatus_t st = dn.set_stream(h, (cudaStream_t)s);
  dn_build b;
  b.ok = true, b.n = 0, b.err[0] = 0, b.offered = b.viable = 0, b.compiled = false;
  if (st != CUDNN_STATUS_SUCCESS) fail(&b, "cudnnSetStream", st);
  cudnnBackendDescriptor_t vp = make(&b, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "the variant pack");
  set(&b, vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws, "the workspace");
  set(&b, vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs, "the tensors' addresses");
  set(&b, vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids, "the tensors' ids");
  finish(&b, vp, "the variant pack");
  if (b.ok) {
    st = dn.execute(h, p->plan, vp);
    if (st != CUDNN_STATUS_SUCCESS) fail(&b, "cudnnBackendExecute", st);
  }
  release(&b, NULL);
  if (b.ok && !p->ran && getenv("WEFT_CUDNN_VERBOSE"))
    fprintf(stderr, "weft: cuDNN %zu: the %s of b%lld h%lld s%lld d%lld runs\n", dn.version,
            p->det ? "deterministic backward" : p->bwd ? "backward" : "forward", (long long)p->b, (long long)p->h,
            (long long)p->s, (long long)p->d);
  p->ran = p->ran || b.ok;
  if (!b.ok) {
    char why[640];
    snprintf(why, sizeof why, "the %s: %s", p->bwd ? "backward" : "forward", b.err);
    dn_off(why);
  }
  return b.ok;
}

bool aligned(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* cuDNN 9.19 packs its version as 91900: 9.19.0. */
void version_text(char *buf, size_t n, size_t v) {
  snprintf(buf, n, "%zu.%zu.%zu", v / 10000, v / 100 % 100, v % 100);
}

} // namespace

bool gpu_cudnn_about(char *buf, size_t n) {
  char why[768];
  void *lib = dn_open(why, sizeof why);
  if (!lib) {
    snprintf(buf, n, "%s", why);
    return false;
  }
  /* left open: dn_load opens the same file again when asked */
  size_t (*ver)(void) = (size_t (*)(void))dlsym(lib, "cudnnGetVersion");
  Dl_info di;
  const char *path = ver && dladdr((void *)ver, &di) && di.dli_fname ? di.dli_fname : "libcudnn.so.9";
  if (!ver) {
    snprintf(buf, n, "%s has no cudnnGetVersion", path);
    return false;
  }
  char v[32];
  version_text(v, sizeof v, ver());
  const char *no = dn_refused(ver());
  snprintf(buf, n, "cuDNN %s at %s%s%s", v, path, no ? ", not used: " : "", no ? no : "");
  return !no;
}

bool gpu_attention_cudnn_offline(const char *device_json, int dt, const gpu_attn *a, bool causal, bool bwd, int64_t *ws,
                                 char *err, size_t errlen) {
  if (!dn_load()) {
    snprintf(err, errlen, "cuDNN is not found or not to be used (the line above says why)");
    return false;
  }
  dn_build b;
  b.ok = true, b.n = 0, b.err[0] = 0, b.offered = b.viable = 0, b.compiled = false;
  cudnnBackendDescriptor_t prop = make(&b, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "the device's properties");
  set(&b, prop, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, (int64_t)strlen(device_json), device_json,
      "the device's properties");
  finish(&b, prop, "the device's properties");
  dn_shapes g = {&b, dt == GPU_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF, a->b, a->hq, a->sq, a->dh, U_VIRT,
                 a->hq / a->r, a->sk, causal, shifted(a, causal)};
  cudnnBackendDescriptor_t ops[40];
  int n = bwd ? bwd_graph(g, ops, a) : fwd_graph(g, ops, a);
  cudnnBackendDescriptor_t plan = b.ok ? plan_of(&b, NULL, prop, ops, n, bwd ? max_ws(a) : 0, bwd && a->det, ws) : NULL;
  release(&b, NULL);
  if (plan) dn.destroy(plan);
  if (plan || b.compiled)
    snprintf(err, errlen, "%lld of %lld engine configs viable, %s", (long long)b.viable, (long long)b.offered,
             plan ? "a plan" : "the first one's kernels compiled (loading them needs a GPU)");
  else
    snprintf(err, errlen, "%s; heuristics mode A offered %lld engine configs, %lld viable", b.err,
             (long long)b.offered, (long long)b.viable);
  return plan != NULL || b.compiled;
}

/* The tensors of a run: uids[] and their addresses, by-value scalars by
 * their host addresses. */
struct dn_pack {
  int64_t uids[16];
  void *ptrs[16];
  int n;
  void add(int64_t uid, const void *p) { uids[n] = uid, ptrs[n++] = (void *)p; }
};

bool attention_cudnn_forward(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v,
                             const gpu_attn *a, float *lse, bool causal) {
  if (!lse || !takes(dt, a, causal) || !aligned(out) || !aligned(q) || !aligned(k) || !aligned(v) || !aligned(lse))
    return false;
  dn_plan *p = plan_for(dt, a, false, causal);
  if (!p || !p->plan) return false;
  float scale = (float)(1.0 / sqrt((double)a->dh)), neg_inf = dn.version >= 91000 ? -INFINITY : -3.402823466e38f;
  dn_pack k5 = {{0}, {0}, 0};
  k5.add(U_Q, q), k5.add(U_K, k), k5.add(U_V, v), k5.add(U_O, out), k5.add(U_STATS, lse), k5.add(U_SCALE, &scale);
  int32_t qpos = (int32_t)a->qpos;
  if (causal) k5.add(U_NEGINF, &neg_inf);
  if (shifted(a, causal)) k5.add(U_QPOS, &qpos);
  return run(p, s, k5.uids, k5.ptrs, k5.n, NULL);
}

/* cuDNN 9.15 and before want a padding mask in the backward where the
 * keys are not a multiple of 128 (NVIDIA's frontend adds one); weft's
 * graph has none, so those stay on the plugin's kernels. From 9.16 to
 * 9.25, Hopper's backward without a mask reads the zero-filled tail of
 * keys that are not a multiple of 128 unmasked (NaN in dq for a row whose
 * log-sum-exp is very negative; NVIDIA's frontend notes it, fixed in
 * 9.26): a causal graph's mask covers that tail, an unmasked one waits
 * for 9.26. */
static bool takes_backward(int dt, const gpu_attn *a, bool causal) {
  if (!takes(dt, a, causal)) return false;
  return (a->sk % 128 == 0 || (dn.version >= 91600 && (causal || dn.version >= 92600)));
}

size_t attention_cudnn_backward_ws(int dt, const gpu_attn *a, bool causal) {
  if (!takes_backward(dt, a, causal)) return 0;
  dn_plan *p = plan_for(dt, a, true, causal);
  if (!p || !p->plan) return 0;
  p->sized = true;
  return (size_t)p->total;
}

bool attention_cudnn_ready(int dt, const gpu_attn *a, bool causal, bool bwd) {
  if (!(bwd ? takes_backward(dt, a, causal) : takes(dt, a, causal))) return false;
  dn_plan *p = plan_for(dt, a, bwd, causal);
  return p && p->plan && (!bwd || p->sized);
}

bool attention_cudnn_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                              const void *k, const void *v, const gpu_attn *a, bool acc, const float *lse,
                              const void *out, void *ws, bool causal) {
  if (acc || !dq || !dk || !dv || !ws || !takes_backward(dt, a, causal)) return false;
  const void *all[] = {dq, dk, dv, dout, q, k, v, lse, out, ws};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (!aligned(all[i])) return false;
  dn_plan *p = plan_for(dt, a, true, causal);
  /* a plan whose workspace was not asked for, on this device, before: the
   * caller's workspace is sized for the plugin's kernels */
  if (!p || !p->plan || !p->sized) return false;
  char *w = (char *)ws;
  if (dn.version < 90600 && !p->det)
    cudaMemsetAsync(w + p->acc_at, 0, (size_t)(p->lib_at - p->acc_at), (cudaStream_t)s);
  float scale = (float)(1.0 / sqrt((double)a->dh)), neg_inf = dn.version >= 91000 ? -INFINITY : -3.402823466e38f;
  float one = 1.0f;
  dn_pack k5 = {{0}, {0}, 0};
  k5.add(U_Q, q), k5.add(U_K, k), k5.add(U_V, v), k5.add(U_O, out), k5.add(U_DO, dout), k5.add(U_STATS, lse);
  k5.add(U_SCALE, &scale), k5.add(U_ONE, &one), k5.add(U_DQ, dq), k5.add(U_DK, dk), k5.add(U_DV, dv);
  k5.add(U_SUM, w + p->sum_at);
  int32_t qpos = (int32_t)a->qpos;
  if (causal) k5.add(U_NEGINF, &neg_inf);
  if (shifted(a, causal)) k5.add(U_QPOS, &qpos);
  if (!p->det) k5.add(U_DQACC, w + p->acc_at);
  return run(p, s, k5.uids, k5.ptrs, k5.n, p->ws > 0 ? w + p->lib_at : NULL);
}

#endif
