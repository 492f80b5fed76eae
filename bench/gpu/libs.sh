# libs.sh - sourced by tests/gpu/run.sh, bench/gpu.sh and
# bench/gpu_ncu_attention.sh, from the repository's root: the libraries the
# plugin (./libweft_cuda.so) needs on a GPU machine, found where the CUDA
# toolkit keeps them or where PyTorch's wheels do.

# cuBLASLt and NCCL (the plugin loads only where both are found, when it
# was built with NCCL) on LD_LIBRARY_PATH, where the loader does not find them
gpu_lib_dirs() {
  for lib in libcublasLt.so.13 libnccl.so.2; do
    if ldd libweft_cuda.so 2>/dev/null | grep -q "${lib%%.so*}.*not found"; then
      at=$(find /usr/local /usr/lib /opt -name "$lib" 2>/dev/null | head -1)
      [ -n "$at" ] && export LD_LIBRARY_PATH="$(dirname "$at")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
  done
  return 0
}

# cuDNN's libcudnn.so.9 in WEFT_CUDNN, unless that is set already: the
# plugin loads cuDNN from there before its usual names
# (backends/cuda/attention_cudnn.cu), for WEFT_ATTN=cudnn and for
# attention's choice by time, which tries cuDNN where it loads
gpu_cudnn() {
  if [ -z "${WEFT_CUDNN:-}" ]; then
    at=$(find /usr/local /usr/lib /opt -name 'libcudnn.so.9' 2>/dev/null | head -1)
    [ -n "$at" ] && export WEFT_CUDNN=$at
  fi
  return 0
}
