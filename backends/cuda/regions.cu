/* regions.cu - copies of strided parts of tensors between packed buffers,
 * with conversion and accumulation, and the rank-ordered sums that the
 * collectives of virtual devices reduce with. CPU reference: region_move
 * and sum_members in backends/cpu/exec.c. */
#include "common.cuh"

/* The holder offset of element e of the move on one side. */
DEV int64_t side_offset(const gpu_side &sd, const gpu_rmove &m, int64_t e) {
  int64_t off = 0;
  for (int d = m.nd - 1; d >= 0; d--) {
    int64_t len = m.len[d], i = e % len;
    e /= len;
    int64_t pos = sd.table[d] ? (int64_t)sd.table[d][i] : sd.base[d] + i;
    off += pos * sd.stride[d];
  }
  return off;
}

template <class TD, class TS>
__global__ void k_move(TD *dst, const TS *src, gpu_rmove m, bool add) {
  GRID_STRIDE(e, m.total) {
    int64_t os = m.contiguous ? e : side_offset(m.src, m, e);
    int64_t od = m.contiguous ? e : side_offset(m.dst, m, e);
    put(&dst[od], to_f(src[os]), add);
  }
}

__global__ void k_move_i32(int32_t *dst, const int32_t *src, gpu_rmove m) {
  GRID_STRIDE(e, m.total) {
    int64_t os = m.contiguous ? e : side_offset(m.src, m, e);
    int64_t od = m.contiguous ? e : side_offset(m.dst, m, e);
    dst[od] = src[os];
  }
}

template <class TD, class TS>
__global__ void k_sum(TD *dst, gpu_srcs src, gpu_rmove m, bool add) {
  GRID_STRIDE(e, m.total) {
    int64_t os = m.contiguous ? e : side_offset(m.src, m, e);
    int64_t od = m.contiguous ? e : side_offset(m.dst, m, e);
    float v = 0.0f;
    for (int i = 0; i < src.n; i++) {
      float x = to_f(((const TS *)src.p[i])[os]);
      v = i == 0 ? x : v + x;
    }
    put(&dst[od], v, add);
  }
}

template <class TD, class TS>
__global__ void k_convert(TD *dst, const TS *src, int64_t n, bool add) {
  GRID_STRIDE(i, n) put(&dst[i], to_f(src[i]), add);
}

void gpu_move(gpu_stream *s, void *dst, int dst_dt, const void *src, int src_dt, const gpu_rmove *m, bool add) {
  unsigned g = blocks_for(m->total, 256);
  if (dst_dt == GPU_I32 || src_dt == GPU_I32) {
    launch(k_move_i32, g, 256, 0, s, (int32_t *)dst, (const int32_t *)src, *m);
    return;
  }
  DISPATCH(dst_dt, TD, DISPATCH(src_dt, TS, launch(k_move<TD, TS>, g, 256, 0, s, (TD *)dst, (const TS *)src, *m, add)));
}

void gpu_sum(gpu_stream *s, void *dst, int dst_dt, const gpu_srcs *src, int src_dt, const gpu_rmove *m, bool add) {
  unsigned g = blocks_for(m->total, 256);
  DISPATCH(dst_dt, TD, DISPATCH(src_dt, TS, launch(k_sum<TD, TS>, g, 256, 0, s, (TD *)dst, *src, *m, add)));
}

void gpu_convert(gpu_stream *s, void *dst, int dst_dt, const void *src, int src_dt, int64_t n, bool add) {
  unsigned g = blocks_for(n, 256);
  if (dst_dt == GPU_I32 || src_dt == GPU_I32) {
    gpu_rmove m;
    memset(&m, 0, sizeof m);
    m.nd = 1, m.total = n, m.len[0] = n, m.contiguous = true;
    launch(k_move_i32, g, 256, 0, s, (int32_t *)dst, (const int32_t *)src, m);
    return;
  }
  DISPATCH(dst_dt, TD, DISPATCH(src_dt, TS, launch(k_convert<TD, TS>, g, 256, 0, s, (TD *)dst, (const TS *)src, n, add)));
}
