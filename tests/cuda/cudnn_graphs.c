/* cudnn_graphs.c - whether cuDNN takes the attention graphs of
 * backends/cuda/attention_cudnn.cu (WEFT_ATTN=cudnn) for an H100, without
 * a GPU: each graph is built, cuDNN's heuristics asked for engines and an
 * execution plan finalized against the H100's device properties (cuDNN
 * 9.8 on). cuDNN compiles these engines' kernels at run time and loads
 * them through the driver: with the toolkit's stub of libcuda (no GPU) a
 * graph counts as taken when an engine's kernels compiled and only their
 * loading failed; with a GPU, when a plan is made. Prints one line per
 * graph; exits 1 when a graph is refused, 77 when cuDNN is not there to
 * ask (the run is then skipped). tests/cudnn_graphs.sh runs it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/gpu.h"

/* An H100 SXM's properties as cuDNN's device-properties descriptor reads
 * them (compute capability 9.0, 132 multiprocessors, 227 KiB of shared
 * memory a block). */
static const char *h100 =
    "{\"cudaDeviceId\":0,\"deviceName\":\"NVIDIA H100 80GB HBM3\",\"deviceVer\":900,\"driverVer\":13000,"
    "\"isTccDriver\":0,\"l2CacheSize\":52428800,\"maxBlockSize\":[1024,1024,64],\"maxCtasPerSM\":32,"
    "\"maxGridSize\":[2147483647,65535,65535],\"maxRegistersPerSM\":65536,\"maxSharedMemoryPerBlock\":49152,"
    "\"maxSharedMemoryPerBlockOptin\":232448,\"maxThreadsPerBlock\":1024,\"maxThreadsPerSM\":2048,"
    "\"memClockRateKHz\":2619000,\"multiProcessorCount\":132,\"pciDeviceId\":0,\"regsPerBlock\":65536,"
    "\"reservedSharedMemoryPerBlock\":1024,\"smClockRateKHz\":1980000,\"supportCoopLaunch\":1,"
    "\"totalGlobalMem\":85045231616,\"warpSize\":32}";

/* causal_attention's heads: q|k|v of a token side by side in one row */
static gpu_attn packed(int64_t b, int64_t s, int64_t h, int64_t dh) {
  int64_t c = h * dh;
  gpu_attn a = {b, s, h, dh, 1, 3 * c, 3 * c, c, s * 3 * c, s * 3 * c, s * c, s, 0, false};
  return a;
}

/* gqa_attention's: q [b, s, (g r dh)], k and v [b, s, (g dh)] */
static gpu_attn grouped(int64_t b, int64_t s, int64_t g, int64_t r, int64_t dh) {
  gpu_attn a = {b, s, g * r, dh, r, g * r * dh, g * dh, g * r * dh, s * g * r * dh, s * g * dh, s * g * r * dh, s, 0,
                false};
  return a;
}

/* attention's (no mask): q [b, sq, (n dh)], k and v [b, sk, (n dh)] */
static gpu_attn unmasked(int64_t b, int64_t sq, int64_t sk, int64_t n, int64_t dh) {
  int64_t c = n * dh;
  gpu_attn a = {b, sq, n, dh, 1, c, c, c, sq * c, sk * c, sq * c, sk, 0, false};
  return a;
}

/* gqa_attention's under context parallelism: sq queries from position
 * qpos against every one of sk keys */
static gpu_attn part(int64_t b, int64_t sq, int64_t sk, int64_t qpos, int64_t g, int64_t r, int64_t dh) {
  gpu_attn a = grouped(b, sq, g, r, dh);
  a.sk = sk, a.qpos = qpos, a.kv_batch = sk * g * dh;
  return a;
}

static gpu_attn deterministic(gpu_attn a) {
  a.det = true;
  return a;
}

int main(void) {
  const char *e = getenv("WEFT_ATTN");
  if (!e || strcmp(e, "cudnn") != 0) setenv("WEFT_ATTN", "cudnn", 1);
  struct {
    const char *what;
    int dt;
    gpu_attn a;
  } cases[] = {
      {"GPT-2 124M (b8 h12 s1024 d64)", GPU_BF16, packed(8, 1024, 12, 64)},
      {"GPT-2 124M (b8 h12 s1024 d64)", GPU_F16, packed(8, 1024, 12, 64)},
      {"heads of 128 (b4 h16 s2048 d128)", GPU_BF16, packed(4, 2048, 16, 128)},
      {"a test's size (b2 h2 s70 d32)", GPU_BF16, packed(2, 70, 2, 32)},
      {"grouped queries (b2 h8 kv2 s512 d64)", GPU_BF16, grouped(2, 512, 2, 4, 64)},
      {"--deterministic (b8 h12 s1024 d64)", GPU_BF16, deterministic(packed(8, 1024, 12, 64))},
      {"a part: 256 queries from 256 of 512 keys", GPU_BF16, part(2, 256, 512, 256, 2, 4, 64)},
      {"a part: 256 queries from 0 of 512 keys", GPU_BF16, part(2, 256, 512, 0, 2, 4, 64)},
      {"no mask, 512 queries, 256 keys (T5's)", GPU_BF16, unmasked(4, 512, 256, 8, 64)},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int bwd = 0; bwd < 2; bwd++) {
      char err[1024];
      int64_t ws = -1;
      const int dt = cases[i].dt;
      bool causal = strncmp(cases[i].what, "no mask", 7) != 0;
      bool ok = gpu_attention_cudnn_offline(h100, dt, &cases[i].a, causal, bwd, &ws, err, sizeof err);
      if (!ok && strstr(err, "is not found or not to be used")) {
        printf("skipped: %s\n", err);
        return 77;
      }
      printf("%s %-42s %s %-8s %s\n", ok ? "ok  " : "FAIL", cases[i].what, dt == GPU_F16 ? "f16 " : "bf16",
             bwd ? "backward" : "forward", err);
      bad += !ok;
    }
  return bad ? 1 : 0;
}
