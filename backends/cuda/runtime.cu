/* runtime.cu - devices, memory, streams and events (gpu.h) on the CUDA
 * runtime, or on the CPU emulation (emu.h) when built for the tests. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.cuh"
#ifndef WEFT_CUDA_EMU
#include <cuda_profiler_api.h>
#endif

const char *const gpu_kernel_lines[] = {
    "matmul, matmul_t, linear, qkv_linear  cuBLASLt: f32 (32F compute), bf16 and f16 with f32 accumulation; bias epilogue; bias gradients by column sums",
    "embedding                             forward gather; backward by vocabulary partitions, each partition's tokens listed in token order (no atomics)",
    "add_position                          forward; backward sums over the batch",
    "layernorm                             forward and backward (row statistics recomputed; weight and bias gradients in two passes)",
    "rmsnorm                               forward and backward",
    "gelu                                  tanh approximation, forward and backward",
    "silu, swiglu                          forward and backward",
    "rotary                                rotate_half pairs, angles in double; backward the inverse rotation",
    "causal_attention, gqa_attention       FlashAttention-style: key tiles in shared memory, running max and sum, no s x s scores; gqa_attention also a part of the queries against all the keys (context parallelism); backward from the forward's log-sum-exp and dout.out (recomputed where the forward kept nothing), then dk/dv per key tile and dq per query tile; bf16 and f16 heads of 32, 64, 96 or 128 on tensor cores (mma.sync, softmax in registers), the rest on CUDA cores; on compute capability 9.0, bf16 and f16 heads of 64 also on Hopper's warpgroup products (wgmma; the ways fa-wg, fa-wgp)",
    "attention                             without a mask (T5's encoder self-attention and cross attention, keys of their own length): the kernels of causal_attention on CUDA cores with every key in view of every row; backward from the forward's log-sum-exp",
    "patchify, patch_merge                 permutations, a thread per element written; backward the inverse permutation (no atomics)",
    "window_partition, window_reverse      windows of the grid after a cyclic shift and back, a thread per element written; backward the inverse",
    "window_attention                      a block per window and head, keys and values in shared memory, a warp per query row; relative position bias, shifted windows' mask; backward per chunk of windows (P and dS in shared memory), the bias table's gradient summed over the chunks in order",
    "mean_pool                             a thread per channel summing the tokens in order; backward spread over the tokens",
    "softmax                               forward and backward, one block per row",
    "cross_entropy                         loss per row summed in double; backward fused (softmax and the label in one pass); vocabulary shards: statistics, combination, shard backward",
    "mse                                   loss and backward",
    "moe_dispatch, moe_combine             routing on the GPU (top k per token, slots by a warp per expert in the CPU's order, no atomics); dispatch and the experts' gradient as gathers; combine and its backward over each token's choices",
    "expert_matmul                         a cuBLASLt product per expert; the weights' gradient in f32 where asked",
    "moe_aux_loss                          load-balancing loss per group summed in double; backward from the experts' counts",
    "add                                   residual add; gradients copied or added",
    "adamw, sgd                            f32 state; f32 master weights for 16-bit parameters; gradients scaled by the clipping coefficient",
    "regions                               strided copies, conversions and rank-ordered sums for sends and collectives; sums of squares for the gradient norm",
    NULL,
};

#ifdef WEFT_CUDA_EMU

#include <map>
#include <string>
#include <vector>

extern std::string emu_error;
emu_stream *emu_stream_new();
void emu_stream_free(emu_stream *s);
uint64_t emu_record(emu_stream *s);
void emu_wait(emu_stream *s, uint64_t id);
void emu_drain();
bool emu_progress();
bool emu_recorded(uint64_t id);

struct gpu_event {
  uint64_t last;
  bool timed;
  double t;   /* seconds, when a timed event's point of the queue ran */
};

static std::map<void *, size_t> allocations;
static int64_t allocated;

static int64_t emu_memory() {
  const char *s = getenv("WEFT_CUDA_EMU_MEMORY");
  return s ? (int64_t)strtoll(s, NULL, 10) : (int64_t)8 << 30;
}

int gpu_emulated(void) { return 1; }

int gpu_count(char *err, size_t errlen) {
  if (!emu_device().known) {
    snprintf(err, errlen, "WEFT_CUDA_EMU_CC=%s: not a compute capability the emulation knows (%s)",
             getenv("WEFT_CUDA_EMU_CC"), emu_device_names().c_str());
    return -1;
  }
  const char *s = getenv("WEFT_CUDA_EMU_DEVICES");
  int n = s ? atoi(s) : 1;
  if (n <= 0) {
    snprintf(err, errlen, "no CUDA device (cudaGetDeviceCount: no CUDA-capable device is detected)");
    return -1;
  }
  return n;
}

bool gpu_properties(int dev, gpu_props *p, char *err, size_t errlen) {
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "CPU emulation of a CUDA device");
  const emu_gpu g = emu_device();
  p->major = g.major, p->minor = g.minor, p->sms = 4;
  p->total = emu_memory();
  p->free = p->total - allocated;
  p->smem_optin = g.smem_most;
  return true;
}

bool gpu_use(int dev, char *err, size_t errlen) { return true; }

void *gpu_alloc(size_t bytes, char *err, size_t errlen) {
  if ((int64_t)bytes > emu_memory() - allocated) {
    snprintf(err, errlen, "cudaMalloc of %zu bytes: out of memory (cudaErrorMemoryAllocation)", bytes);
    return NULL;
  }
  size_t n = (bytes + 255) / 256 * 256;
  void *p = aligned_alloc(256, n ? n : 256);
  if (!p) {
    snprintf(err, errlen, "cudaMalloc of %zu bytes: out of memory (cudaErrorMemoryAllocation)", bytes);
    return NULL;
  }
  memset(p, 0xff, n ? n : 256);  /* NaNs: a read of what nothing wrote shows */
  allocations[p] = bytes;
  allocated += (int64_t)bytes;
  return p;
}

void gpu_free(void *p) {
  if (!p) return;
  emu_drain();
  auto it = allocations.find(p);
  if (it != allocations.end()) {
    allocated -= (int64_t)it->second;
    allocations.erase(it);
  }
  free(p);
}

gpu_stream *gpu_stream_new(char *err, size_t errlen) { return (gpu_stream *)emu_stream_new(); }
void gpu_stream_free(gpu_stream *s) {
  if (s) emu_stream_free((emu_stream *)s);
}

static bool emu_ok(char *err, size_t errlen) {
  if (emu_error.empty()) return true;
  snprintf(err, errlen, "%s", emu_error.c_str());
  emu_error.clear();
  return false;
}

bool gpu_stream_sync(gpu_stream *s, char *err, size_t errlen) {
  emu_drain();
  return emu_ok(err, errlen);
}

gpu_event *gpu_event_new(char *err, size_t errlen) { return new gpu_event{0, false, 0.0}; }
gpu_event *gpu_event_timed(char *err, size_t errlen) { return new gpu_event{0, true, 0.0}; }
void gpu_event_free(gpu_event *e) { delete e; }
void gpu_record(gpu_event *e, gpu_stream *s) {
  if (e->timed)
    emu_enqueue((emu_stream *)s, [e]() {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      e->t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    });
  e->last = emu_record((emu_stream *)s);
}
double gpu_elapsed_ms(gpu_event *a, gpu_event *b, char *err, size_t errlen) {
  emu_drain();
  if (!emu_ok(err, errlen)) return -1.0;
  if (!a->timed || !b->timed) {
    snprintf(err, errlen, "gpu_elapsed_ms: an event without times");
    return -1.0;
  }
  return 1e3 * (b->t - a->t);
}
void gpu_wait(gpu_stream *s, gpu_event *e) { emu_wait((emu_stream *)s, e->last); }
/* WEFT_CUDA_EMU_HANG: the work never finishes, as with a kernel that hangs. */
int gpu_event_done(gpu_event *e, char *err, size_t errlen) {
  const char *hang = getenv("WEFT_CUDA_EMU_HANG");
  if (hang && *hang && strcmp(hang, "0") != 0) return 0;
  emu_progress();
  if (!emu_ok(err, errlen)) return -1;
  return emu_recorded(e->last) ? 1 : 0;
}

bool gpu_upload(void *dst, const void *src, size_t bytes, gpu_stream *s, char *err, size_t errlen) {
  std::vector<unsigned char> copy((const unsigned char *)src, (const unsigned char *)src + bytes);
  emu_enqueue((emu_stream *)s, [dst, copy] { memcpy(dst, copy.data(), copy.size()); });
  emu_drain();
  return emu_ok(err, errlen);
}

bool gpu_download(void *dst, const void *src, size_t bytes, gpu_stream *s, char *err, size_t errlen) {
  emu_drain();
  memcpy(dst, src, bytes);
  return emu_ok(err, errlen);
}

void gpu_zero(void *dst, size_t bytes, gpu_stream *s) {
  emu_count((const void *)&gpu_zero);
  emu_enqueue((emu_stream *)s, [dst, bytes] { memset(dst, 0, bytes); });
}

void gpu_raise(const char *msg) {
  if (emu_error.empty()) emu_error = msg;
}

void *gpu_alloc_on(size_t bytes, gpu_stream *s, char *err, size_t errlen) {
  (void)s;
  return gpu_alloc(bytes, err, errlen);
}
void gpu_free_on(void *p, gpu_stream *s) {
  (void)s;
  gpu_free(p);
}

bool gpu_check(const char *what, char *err, size_t errlen) {
  if (emu_error.empty()) return true;
  snprintf(err, errlen, "%s: %s", what, emu_error.c_str());
  emu_error.clear();
  return false;
}

bool gpu_sync(char *err, size_t errlen) {
  emu_drain();
  return emu_ok(err, errlen);
}

void gpu_profiler(bool on) { (void)on; }

#else

static bool failed(cudaError_t e, const char *what, char *err, size_t errlen) {
  if (e == cudaSuccess) return false;
  snprintf(err, errlen, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
  return true;
}

int gpu_emulated(void) { return 0; }

int gpu_count(char *err, size_t errlen) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "no CUDA device (cudaGetDeviceCount: %s)", cudaGetErrorString(e));
    cudaGetLastError();
    return -1;
  }
  if (n == 0) {
    snprintf(err, errlen, "no CUDA device (cudaGetDeviceCount found none)");
    return -1;
  }
  return n;
}

bool gpu_properties(int dev, gpu_props *p, char *err, size_t errlen) {
  memset(p, 0, sizeof *p);
  cudaDeviceProp pr;
  if (failed(cudaGetDeviceProperties(&pr, dev), "cudaGetDeviceProperties", err, errlen)) return false;
  snprintf(p->name, sizeof p->name, "%s", pr.name);
  p->major = pr.major, p->minor = pr.minor, p->sms = pr.multiProcessorCount;
  p->smem_optin = pr.sharedMemPerBlockOptin;
  int cur = 0;
  cudaGetDevice(&cur);
  size_t fr = 0, tot = 0;
  if (failed(cudaSetDevice(dev), "cudaSetDevice", err, errlen)) return false;
  cudaError_t e = cudaMemGetInfo(&fr, &tot);
  cudaSetDevice(cur);
  if (failed(e, "cudaMemGetInfo", err, errlen)) return false;
  p->total = (int64_t)tot, p->free = (int64_t)fr;
  return true;
}

bool gpu_use(int dev, char *err, size_t errlen) { return !failed(cudaSetDevice(dev), "cudaSetDevice", err, errlen); }

void *gpu_alloc(size_t bytes, char *err, size_t errlen) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "cudaMalloc of %zu bytes: %s (%s)", bytes, cudaGetErrorString(e), cudaGetErrorName(e));
    cudaGetLastError();
    return NULL;
  }
  return p;
}

void gpu_free(void *p) {
  if (p) cudaFree(p);
}

gpu_stream *gpu_stream_new(char *err, size_t errlen) {
  cudaStream_t s;
  if (failed(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate", err, errlen)) return NULL;
  return (gpu_stream *)s;
}

void gpu_stream_free(gpu_stream *s) {
  if (s) cudaStreamDestroy((cudaStream_t)s);
}

bool gpu_stream_sync(gpu_stream *s, char *err, size_t errlen) {
  return !failed(cudaStreamSynchronize((cudaStream_t)s), "cudaStreamSynchronize", err, errlen);
}

gpu_event *gpu_event_new(char *err, size_t errlen) {
  cudaEvent_t e;
  if (failed(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate", err, errlen)) return NULL;
  return (gpu_event *)e;
}

gpu_event *gpu_event_timed(char *err, size_t errlen) {
  cudaEvent_t e;
  if (failed(cudaEventCreate(&e), "cudaEventCreate", err, errlen)) return NULL;
  return (gpu_event *)e;
}

double gpu_elapsed_ms(gpu_event *a, gpu_event *b, char *err, size_t errlen) {
  float ms = 0.0f;
  if (failed(cudaEventSynchronize((cudaEvent_t)b), "cudaEventSynchronize", err, errlen) ||
      failed(cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b), "cudaEventElapsedTime", err, errlen))
    return -1.0;
  return ms;
}

void gpu_event_free(gpu_event *e) {
  if (e) cudaEventDestroy((cudaEvent_t)e);
}

void gpu_record(gpu_event *e, gpu_stream *s) { cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s); }

int gpu_event_done(gpu_event *e, char *err, size_t errlen) {
  cudaError_t c = cudaEventQuery((cudaEvent_t)e);
  if (c == cudaErrorNotReady) return 0;
  return failed(c, "cudaEventQuery", err, errlen) ? -1 : 1;
}
void gpu_wait(gpu_stream *s, gpu_event *e) { cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0); }

bool gpu_upload(void *dst, const void *src, size_t bytes, gpu_stream *s, char *err, size_t errlen) {
  if (failed(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)s), "cudaMemcpy to the device",
             err, errlen))
    return false;
  return gpu_stream_sync(s, err, errlen);
}

bool gpu_download(void *dst, const void *src, size_t bytes, gpu_stream *s, char *err, size_t errlen) {
  if (failed(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)s), "cudaMemcpy from the device",
             err, errlen))
    return false;
  return gpu_stream_sync(s, err, errlen);
}

void gpu_zero(void *dst, size_t bytes, gpu_stream *s) { cudaMemsetAsync(dst, 0, bytes, (cudaStream_t)s); }

static char raised[512];

void gpu_raise(const char *msg) {
  if (!raised[0]) snprintf(raised, sizeof raised, "%s", msg);
}

void *gpu_alloc_on(size_t bytes, gpu_stream *s, char *err, size_t errlen) {
  void *p = NULL;
  cudaError_t e = cudaMallocAsync(&p, bytes ? bytes : 256, (cudaStream_t)s);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "cudaMallocAsync of %zu bytes: %s (%s)", bytes, cudaGetErrorString(e), cudaGetErrorName(e));
    cudaGetLastError();
    return NULL;
  }
  return p;
}

void gpu_free_on(void *p, gpu_stream *s) {
  if (p) cudaFreeAsync(p, (cudaStream_t)s);
}

bool gpu_check(const char *what, char *err, size_t errlen) {
  if (raised[0]) {
    snprintf(err, errlen, "%s: %s", what, raised);
    raised[0] = 0;
    return false;
  }
  return !failed(cudaGetLastError(), what, err, errlen);
}

bool gpu_sync(char *err, size_t errlen) {
  return !failed(cudaDeviceSynchronize(), "cudaDeviceSynchronize", err, errlen);
}

void gpu_profiler(bool on) {
  if (on) cudaProfilerStart();
  else cudaProfilerStop();
}

#endif
