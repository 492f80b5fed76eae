/* test_emu.cc - the CPU emulation of CUDA (backends/cuda/emu.h) on its own:
 * barriers, shuffles and ballots (with a partial warp and lanes that have
 * ended), the fibers' switching with blocks of every size, threads stuck at
 * different barriers reported and not left to hang, and the warp matrix
 * products (emu_wmma.h) where a warp asks for more products between
 * barriers than their results are kept, and the warpgroup products
 * (wgmma.cuh) held back until their wait: a read before it sees NaNs, and
 * a write of their registers or tile before it, or no wait at all, is
 * reported; so are the copies of cp.async (cpasync.cuh), and a product's
 * tile from them read without the proxy fence; and dynamic shared memory
 * over 48 KiB refused unless the kernel was allowed it; and the passes an
 * ldmatrix takes through shared memory's banks, counted by the rows'
 * stride (4 without conflicts, up to 32). Built and run by make check
 * (tests/cuda_check.sh) wherever the emulation is. Prints a line a check
 * and "test_emu: N checks, M failed"; exit 1 if any failed. */
#include "cuda/common.cuh"
#include "cuda/wgmma.cuh"

#include <string>

extern std::string emu_error;
void emu_drain();

static int checks, failed;

static void check(bool ok, const char *what) {
  checks++;
  if (!ok) failed++;
  printf("%-72s %s\n", what, ok ? "ok" : "FAILED");
}

/* Each thread writes its index, then reads its neighbour's after the
 * barrier; twice, in the other direction, through the same memory. */
__global__ void k_neighbours(int *out, int n) {
  __shared__ int sh[1024];
  int t = (int)threadIdx.x;
  sh[t] = t * 3;
  __syncthreads();
  int right = sh[(t + 1) % n];
  __syncthreads();
  sh[t] = right;
  __syncthreads();
  out[t] = sh[(t + n - 1) % n];
}

/* A warp's sum by shuffles (xor), and each lane's value from lane 0. */
__global__ void k_shuffles(int *sum, int *first) {
  int v = (int)threadIdx.x;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  sum[threadIdx.x] = v;
  first[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x * 7, 0);
}

/* warp_sum, warp_sum_d and warp_max (one meeting in the emulation) against
 * the five xor shuffles they stand for, bit for bit, on values whose sums
 * depend on their order. */
__global__ void k_warp_sums(int *same, const float *x) {
  float v = x[threadIdx.x], s = v, m = v;
  double d = (double)v * 1e-3 + 1e12, sd = d;
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_xor_sync(0xffffffffu, s, o);
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    sd += __shfl_xor_sync(0xffffffffu, sd, o);
  }
  float ws = warp_sum(v), wm = warp_max(v);
  double wd = warp_sum_d(d);
  same[threadIdx.x] = !memcmp(&ws, &s, 4) && !memcmp(&wm, &m, 4) && !memcmp(&wd, &sd, 8);
}

/* Ballots: odd lanes, then all; then, with the lanes below `gone` ended,
 * every lane left (the ended lanes' odd bits still in the memory of the
 * first ballot, which the third uses again). */
__global__ void k_ballots(unsigned *odd, unsigned *left, int gone) {
  int lane = (int)threadIdx.x & 31;
  odd[threadIdx.x] = __ballot_sync(0xffffffffu, lane & 1);
  if (__ballot_sync(0xffffffffu, 1) != (threadIdx.x < 96 ? 0xffffffffu : 0xfu)) odd[threadIdx.x] = 0;
  if (lane < gone) return;
  left[threadIdx.x] = __ballot_sync(0xffffffffu, 1);
}

/* Threads stuck: half a warp at the warp's barrier, the other half at the
 * block's. */
__global__ void k_stuck(int *out) {
  if (threadIdx.x < 16) __syncwarp();
  else __syncthreads();
  out[threadIdx.x] = 1;
}

/* A warp's 20 products of the same tiles, one after another with no
 * barrier between them, each into its own accumulator filled with r. */
enum { PRODUCTS = 20 };
__global__ void k_products(float *out, const bf16 *a, const bf16 *b) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c[PRODUCTS];
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  for (int r = 0; r < PRODUCTS; r++) wmma::fill_fragment(c[r], (float)r);
  for (int r = 0; r < PRODUCTS; r++) wmma::mma_sync(c[r], fa, fb, c[r]);
  /* lane 5 stores the products; every lane has them all */
  if ((threadIdx.x & 31) == 5)
    for (int r = 0; r < PRODUCTS; r++) {
      float *o = out + (size_t)r * 256 + (threadIdx.x >> 5) * PRODUCTS * 256;
      for (int e = 0; e < 256; e++) o[e] = c[r].x[e];
    }
}

/* One warpgroup's product x = A B (64 x 64 x 64, bf16, B's column n row n
 * of a swizzled tile: K-major) into out, with one misuse of the product in
 * flight (mode) between its issue and its wait. */
enum {
  WG_RIGHT, WG_READ_D, WG_WRITE_D, WG_WRITE_A, WG_WRITE_TILE, WG_HOLD_EARLY, WG_COPY_A, WG_NO_WAIT, WG_TWO_GROUPS,
  WG_CP_FENCED, WG_CP_UNFENCED /* the tile by cp.async, with and without the proxy fence */
};
__global__ void k_wgmma(float *out, float *early, const bf16 *a, const bf16 *b, int mode) {
  __shared__ unsigned char raw[64 * 128 + 1024];
  unsigned char *tile = wg_align(raw);
  const int tid = (int)threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
  if (mode == WG_CP_FENCED || mode == WG_CP_UNFENCED) {
    for (int e = tid; e < 64 * 8; e += 128) cp16(tile + wg_at(e / 8, e % 8 * 8), &b[e * 8]);
    cp_commit();
    cp_wait<0>();
    if (mode == WG_CP_FENCED) wg_proxy_fence();
  } else {
    for (int e = tid; e < 64 * 64; e += 128) memcpy(tile + wg_at(e / 64, e % 64), &b[e], 2);
  }
  __syncthreads();
  /* mma.cuh's A fragments of the warp's 16 rows, k-step kk */
  uint32_t af[4][4];
  auto pair = [&](int r, int c) { return pack2<bf16>(to_f(a[r * 64 + c]), to_f(a[r * 64 + c + 1])); };
  for (int kk = 0; kk < 4; kk++) {
    const int r = 16 * w + g, c = 16 * kk + 2 * t;
    af[kk][0] = pair(r, c), af[kk][1] = pair(r + 8, c), af[kk][2] = pair(r, c + 8), af[kk][3] = pair(r + 8, c + 8);
  }
  float x[8][4], y[8][4];
  const wg_desc bd = wg_kmajor(tile);
  wg_fence();
  for (int kk = 0; kk < 4; kk++) wg_mma<bf16, false>(x, af[kk], wg_add(bd, 32 * kk), kk > 0);
  wg_commit();
  uint32_t copy[4][4];
  switch (mode) {
  case WG_READ_D: early[tid] = x[3][1]; break;
  case WG_WRITE_D: x[3][1] = 1.0f; break;
  case WG_WRITE_A: af[2][1] = 0; break;
  case WG_WRITE_TILE:
    __syncthreads();
    if (tid == 0) tile[wg_at(5, 7)] ^= 1;
    __syncthreads();
    break;
  case WG_HOLD_EARLY: wg_hold(x); break;
  case WG_COPY_A: wg_copy(copy, af); break;
  case WG_NO_WAIT: return;
  case WG_TWO_GROUPS:
    /* the same A fragments again, into y, in a group of its own */
    for (int kk = 0; kk < 4; kk++) wg_mma<bf16, false>(y, af[kk], wg_add(bd, 32 * kk), kk > 0);
    wg_commit();
    wg_wait<1>();
    early[tid] = y[3][1];
    break;
  }
  wg_wait<0>();
  wg_hold(x);
  for (int nb = 0; nb < 8; nb++)
    for (int e = 0; e < 4; e++) {
      const int at = (16 * w + g + (e >= 2 ? 8 : 0)) * 64 + nb * 8 + 2 * t + (e & 1);
      out[at] = x[nb][e];
      if (mode == WG_TWO_GROUPS) out[4096 + at] = y[nb][e];
    }
}

/* 64 threads each copy 16 bytes into shared memory by cp.async (group 1),
 * then 16 more (group 2), and read their neighbour's first copy after a
 * barrier: after wait<1> (the first landed), before any wait (mode 1), or
 * after a store into the second's bytes before its wait (mode 2). */
__global__ void k_cp(int *out, int *second, const int *src, int mode) {
  __shared__ int sh[2][64 * 4];
  const int t = (int)threadIdx.x;
  cp16(&sh[0][4 * t], &src[4 * t]);
  cp_commit();
  cp16(&sh[1][4 * t], &src[256 + 4 * t]);
  cp_commit();
  if (mode == 2) sh[1][4 * t] = 7;
  if (mode != 1) cp_wait<1>();
  __syncthreads();
  const int n = (t + 1) % 64;
  for (int i = 0; i < 4; i++) out[4 * t + i] = sh[0][4 * n + i];
  second[t] = sh[1][4 * t + 1];
  if (mode != 1) cp_wait<0>(); /* (mode 1: none land, as the block ends) */
}

/* Touches the last byte of its dynamic shared memory. */
__global__ void k_big_smem(int *out, size_t bytes) {
  DYN_SMEM(unsigned char, sm);
  sm[bytes - 1] = 1;
  out[0] = sm[bytes - 1];
}

/* One ldmatrix .x4 whose lane l gives row l at l * stride bytes into
 * shared memory (2 KiB a stride of 64 elements; 0: every lane the same
 * row). */
__global__ void k_ldsm_rows(uint32_t *out, int stride) {
  __align__(128) __shared__ unsigned char sh[32 * 256];
  for (int i = (int)threadIdx.x; i < (int)sizeof sh; i += 32) sh[i] = (unsigned char)i;
  __syncwarp();
  uint32_t r[4];
  ldsm_x4<false>(r, sh + threadIdx.x * stride);
  for (int i = 0; i < 4; i++) out[threadIdx.x * 4 + i] = r[i];
}

int main(void) {
  char what[120];
  /* blocks of 1, 31, 32, 33, 100, 256 and 1024 threads */
  const int sizes[] = {1, 31, 32, 33, 100, 256, 1024};
  for (int n : sizes) {
    int out[1024];
    launch(k_neighbours, 1, n, 0, NULL, out, n);
    emu_drain();
    bool ok = emu_error.empty();
    for (int t = 0; t < n; t++) ok = ok && out[t] == t * 3;
    snprintf(what, sizeof what, "barriers: a block of %d threads reads its neighbours' writes", n);
    check(ok, what);
  }

  {
    int sum[64], first[64];
    launch(k_shuffles, 1, 64, 0, NULL, sum, first);
    emu_drain();
    bool ok = true;
    for (int t = 0; t < 64; t++) ok = ok && sum[t] == (t < 32 ? 496 : 32 * 32 + 496) && first[t] == (t & ~31) * 7;
    check(ok, "shuffles: two warps' sums by xor, and lane 0's value in every lane");
  }

  {
    float x[64];
    int same[64];
    for (int t = 0; t < 64; t++) x[t] = (t % 3 ? 1.0f : 3.0e7f) * (t % 2 ? -1.0f : 1.0f) + (float)t * 0.37f;
    launch(k_warp_sums, 1, 64, 0, NULL, same, (const float *)x);
    emu_drain();
    bool ok = emu_error.empty();
    for (int t = 0; t < 64; t++) ok = ok && same[t];
    check(ok, "warp sums and maxima: the bits of five xor shuffles");
  }

  {
    unsigned odd[100], left[100];
    memset(left, 0, sizeof left);
    launch(k_ballots, 1, 100, 0, NULL, odd, left, 8);
    emu_drain();
    bool ok = true;
    for (int t = 0; t < 100; t++) {
      ok = ok && odd[t] == (t < 96 ? 0xaaaaaaaau : 0xau);  /* the last warp has 4 lanes, all of them ended below */
      if ((t & 31) >= 8) ok = ok && left[t] == 0xffffff00u;
    }
    check(ok, "ballots: odd lanes of a partial warp, and only the lanes that have not ended");
  }

  {
    int out[32];
    launch(k_stuck, 1, 32, 0, NULL, out);
    emu_drain();
    bool ok = emu_error.find("threads wait at barriers the others never reach") != std::string::npos;
    check(ok, "threads at different barriers: reported, not left to hang");
    emu_error.clear();
    launch(k_neighbours, 1, 32, 0, NULL, out, 32);
    emu_drain();
    check(emu_error.empty(), "the next launch after a stuck one runs");
  }

  {
    static bf16 a[256], b[256];
    static float out[2 * PRODUCTS * 256];
    for (int e = 0; e < 256; e++) a[e] = from_f<bf16>((float)(e % 7) - 3.0f), b[e] = from_f<bf16>((float)(e % 5) * 0.5f);
    launch(k_products, 1, 64, 0, NULL, out, a, b);
    emu_drain();
    bool ok = emu_error.empty();
    for (int w = 0; w < 2; w++)
      for (int r = 0; r < PRODUCTS; r++)
        for (int i = 0; i < 16; i++)
          for (int j = 0; j < 16; j++) {
            float want = (float)r;
            for (int k = 0; k < 16; k++) want += to_f(a[i * 16 + k]) * to_f(b[k * 16 + j]);
            ok = ok && out[(size_t)(w * PRODUCTS + r) * 256 + i * 16 + j] == want;
          }
    check(ok, "warp matrix products: 20 in a row without a barrier, two warps, exact");
  }

  {
    /* k/8 values: every sum exact in f32 */
    static bf16 a[4096], b[4096];
    static float want[4096], out[8192], early[128];
    for (int e = 0; e < 4096; e++)
      a[e] = from_f<bf16>((float)(e * 7 % 17 - 8) / 8), b[e] = from_f<bf16>((float)(e * 5 % 13 - 6) / 8);
    for (int i = 0; i < 64; i++)
      for (int n = 0; n < 64; n++) {
        float sum = 0.0f;
        for (int k = 0; k < 64; k++) sum += to_f(a[i * 64 + k]) * to_f(b[n * 64 + k]);
        want[i * 64 + n] = sum;
      }
    auto run = [&](int mode, int blocks) {
      for (float &v : out) v = -1.0f;
      for (float &v : early) v = 0.0f;
      emu_error.clear();
      launch(k_wgmma, blocks, 128, 0, NULL, out, early, (const bf16 *)a, (const bf16 *)b, mode);
      emu_drain();
      std::string e = emu_error;
      emu_error.clear();
      return e;
    };
    auto exact = [&](const float *o) { return !memcmp(o, want, sizeof want); };
    auto all_nan = [&]() {
      bool ok = true;
      for (float v : early) ok = ok && std::isnan(v);
      return ok;
    };
    std::string e = run(WG_RIGHT, 1);
    check(e.empty() && exact(out), "wgmma: a warpgroup's product, waited for: exact, nothing reported");
    e = run(WG_READ_D, 1);
    check(e.empty() && all_nan() && exact(out), "wgmma: D read before the wait: NaN, then the product after it");
    e = run(WG_TWO_GROUPS, 1);
    check(e.empty() && all_nan() && exact(out) && exact(out + 4096),
          "wgmma: two groups on the same A, wait<1>: the first's D, the second's NaN until wait<0>");
    const struct {
      int mode, blocks;
      const char *says, *what;
    } misuse[] = {
        {WG_WRITE_D, 1, "accumulator (D) of a product was written", "wgmma: D written before the wait: reported"},
        {WG_WRITE_A, 1, "A registers of a product were written", "wgmma: A written before the wait: reported"},
        {WG_WRITE_TILE, 1, "shared memory that a product read was written",
         "wgmma: one byte of the tile written before the wait: reported"},
        {WG_HOLD_EARLY, 1, "used before the wait", "wgmma: wg_hold on D before the wait: reported"},
        {WG_COPY_A, 1, "copied while a product reads them", "wgmma: A copied before the wait: reported"},
        {WG_NO_WAIT, 1, "still in flight when their block ended", "wgmma: no wait before the block's end: reported"},
        {WG_CP_UNFENCED, 1, "no fence.proxy.async",
         "wgmma: a tile from cp.async read with no proxy fence by its writers: reported"},
    };
    for (const auto &m : misuse) {
      e = run(m.mode, m.blocks);
      check(e.find(m.says) != std::string::npos, m.what);
      if (e.find(m.says) == std::string::npos) printf("  (reported: \"%s\")\n", e.c_str());
    }
    e = run(WG_RIGHT, 1);
    check(e.empty() && exact(out), "wgmma: the next launch after those runs clean");
    e = run(WG_CP_FENCED, 1);
    check(e.empty() && exact(out), "wgmma: a tile from cp.async, waited for and fenced: exact, nothing reported");
  }

  {
    int src[512], out[256], second[64];
    for (int i = 0; i < 512; i++) src[i] = i * 3 + 1;
    auto run = [&](int mode) {
      emu_error.clear();
      launch(k_cp, 1, 64, 0, NULL, out, second, (const int *)src, mode);
      emu_drain();
      std::string e = emu_error;
      emu_error.clear();
      return e;
    };
    auto first_landed = [&]() {
      bool ok = true;
      for (int t = 0; t < 64; t++)
        for (int i = 0; i < 4; i++) ok = ok && out[4 * t + i] == src[4 * ((t + 1) % 64) + i];
      return ok;
    };
    auto all = [&](const int *v, int n, int x) {
      bool ok = true;
      for (int i = 0; i < n; i++) ok = ok && v[i] == x;
      return ok;
    };
    std::string e = run(0);
    check(e.empty() && first_landed() && all(second, 64, -1),
          "cp.async: wait<1> lands the first group, the second reads 0xFF bytes until its wait");
    e = run(1);
    check(e.empty() && all(out, 256, -1), "cp.async: read before any wait: 0xFF bytes (NaNs), not the copy");
    e = run(2);
    check(e.find("written before the wait for the copy") != std::string::npos,
          "cp.async: a store into a copy's bytes before its wait: reported");
  }

  {
    /* dynamic shared memory over 48 KiB: refused until allowed, and over
     * the GPU's most (227 KiB on compute capability 9.0, WEFT_CUDA_EMU_CC)
     * even then */
    int out[1] = {0};
    auto run = [&](size_t bytes) {
      emu_error.clear();
      out[0] = 0;
      launch(k_big_smem, 1, 32, bytes, NULL, out, bytes);
      emu_drain();
      std::string e = emu_error;
      emu_error.clear();
      return e;
    };
    std::string e = run(64 << 10);
    check(e.find("unless cudaFuncSetAttribute allowed more") != std::string::npos && out[0] == 0,
          "shared memory: 64 KiB without the kernel's allowance: refused, not run");
    allow_smem(k_big_smem, 64 << 10);
    e = run(64 << 10);
    check(e.empty() && out[0] == 1, "shared memory: 64 KiB once allowed: runs");
    allow_smem(k_big_smem, 52 << 10);
    e = run(56 << 10);
    check(e.find("unless cudaFuncSetAttribute") != std::string::npos, "shared memory: more than allowed: refused");
    const emu_gpu g = emu_device();
    const size_t most = g.smem_most;
    allow_smem(k_big_smem, most);
    e = run(most);
    check(e.empty() && out[0] == 1, "shared memory: the GPU's most, allowed: runs");
    allow_smem(k_big_smem, most + 1024);
    e = run(most + 1024);
    char want[96];
    snprintf(want, sizeof want, "over the %zu KiB a block may have on compute capability %d.%d", most >> 10, g.major,
             g.minor);
    check(e.find(want) != std::string::npos && out[0] == 0,
          "shared memory: 1 KiB over the GPU's most, allowed or not: refused");
  }

  {
    /* shared memory's banks: the wavefronts an ldmatrix .x4 takes, by the
     * rows' stride (16-byte columns of the 128 bytes the banks span) */
    static const struct {
      int stride;
      long passes;
      const char *what;
    } cases[] = {
        {144, 4, "ldmatrix: rows 144 bytes apart (padded): 4 wavefronts"},
        {16, 4, "ldmatrix: rows side by side: 4 wavefronts"},
        {0, 4, "ldmatrix: one row in every lane (a broadcast): 4 wavefronts"},
        {64, 16, "ldmatrix: rows 64 bytes apart: 16 wavefronts (4 rows a column)"},
        {128, 32, "ldmatrix: rows 128 bytes apart: 32 wavefronts (8 rows a column)"},
        {256, 32, "ldmatrix: rows 256 bytes apart: 32 wavefronts"},
    };
    uint32_t out[128];
    long before[3] = {0, 0, 0};
    for (const auto &c : cases) {
      launch(k_ldsm_rows, 1, 32, 0, NULL, out, c.stride);
      emu_drain();
      long now[3] = {0, 0, 0};
      const bool counted = emu_smem_counts((const void *)k_ldsm_rows, now);
      /* what lane 4 read first: row 1 of matrix 0 (lane 1's), its first
       * two elements */
      uint32_t want = 0;
      for (int b = 0; b < 4; b++) want |= (uint32_t)((c.stride + b) & 255) << (8 * b);
      check(emu_error.empty() && counted && now[0] - before[0] == 1 && now[1] - before[1] == c.passes &&
                now[2] - before[2] == 4 && out[16] == want,
            c.what);
      memcpy(before, now, sizeof before);
    }
  }

  printf("test_emu: %d checks, %d failed\n", checks, failed);
  return failed ? 1 : 0;
}
