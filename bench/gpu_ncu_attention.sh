#!/bin/sh
# gpu_ncu_attention.sh - what bounds the plugin's attention kernels on a GPU:
# Nsight Compute's full set of sections (speed of light, compute and memory
# workload with the shared-memory table, warp states, occupancy, launch
# statistics) for the first forward, dk/dv and dq launches of
# `bench_kernels --attention` at GPT-2 124M's heads (batch 8, 12 heads of
# 64, sequence 1024, bf16, causal), the plugin's own kernels forced
# (WEFT_ATTN=fa: nothing chosen or compared). The question it answers: is
# the backward bound by the tensor pipe, by shared memory (each ldmatrix.x4
# of a streamed tile feeds two mma.sync in the dk/dv kernel), by the
# exponentials or by occupancy (docs/run.md, "Which kernels run attention");
# then the backward's two kernels again in their occupancy of 4 blocks a
# multiprocessor (WEFT_ATTN_FA_BWD_SHAPE=4,4) and on Hopper's warpgroup
# products (=wg), fewer sections.
# Writes DIR/gpu-ncu-attention-DATE-DEVICE.txt (default DIR: bench/results):
# the kernels' names, then ncu's details page as it printed it.
#
# Usage, from the repository root, with build/cuda/bench_kernels built
# where nvcc is:   sh bench/gpu_ncu_attention.sh [DIR]
# KERNELS=PATH names another bench_kernels (the emulation's cannot be
# profiled: ncu needs a GPU); NCU=PATH another ncu.
DIR=${1:-bench/results}
KERNELS=${KERNELS:-build/cuda/bench_kernels}
NCU=${NCU:-ncu}
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
command -v "$NCU" >/dev/null 2>&1 || { echo "bench/gpu_ncu_attention.sh: $NCU (Nsight Compute) is not on the PATH"; exit 2; }
[ -x "$KERNELS" ] || { echo "bench/gpu_ncu_attention.sh: $KERNELS not built (make cuda)"; exit 2; }
mkdir -p "$DIR" || exit 2
. bench/gpu/libs.sh
gpu_lib_dirs
export WEFT_PLUGIN_DIR=${WEFT_PLUGIN_DIR:-$(pwd)}
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
slug=$(echo "${device:-gpu}" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')
out=$DIR/gpu-ncu-attention-$(date -u +%Y-%m-%d)-$slug.txt
# prof TITLE KERNEL ARGS...: ncu on the first launch of KERNEL (a part of
# its name) in `bench_kernels --attention`, with ARGS (the sections),
# added to the file at once (a part stopped at its time keeps what ran);
# the forward runs 22 times before the first backward, so each kernel has
# its own run of ncu
rc=0
echo "bench/gpu_ncu_attention.sh: ${device:-GPU}, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" >"$out"
prof() {
  title=$1; kn=$2; shift 2
  "$NCU" --clock-control none "$@" -k "regex:$kn" --launch-count 1 "$KERNELS" --attention >"$tmp/ncu.txt" 2>&1
  r=$?
  { echo; echo "== $kn, $title"; cat "$tmp/ncu.txt"; echo "ncu for $kn exited $r"; } >>"$out"
  [ $r -eq 0 ] || rc=1
}
# the forward, then the backward's two kernels: the full set
for kn in k_attn_fa_fwd k_attn_dkv_fa k_attn_dq_fa; do
  WEFT_ATTN=fa prof "the default occupancy (ncu --set full)" $kn --set full
done
# the backward's two kernels again with the most blocks per multiprocessor
# (WEFT_ATTN_FA_BWD_SHAPE=4,4: rows from shared memory, 128 registers):
# does occupancy move what bounds them
for kn in k_attn_dkv_fa k_attn_dq_fa; do
  WEFT_ATTN=fa WEFT_ATTN_FA_BWD_SHAPE=4,4 prof "WEFT_ATTN_FA_BWD_SHAPE=4,4" $kn --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis
done
# the warpgroup kernels (WEFT_ATTN_FA_BWD_SHAPE=wg, compute capability
# 9.0): what Hopper's own product changes in the same sections
for kn in k_attn_fwd_wg k_attn_dkv_wg k_attn_dq_wg; do
  WEFT_ATTN=fa WEFT_ATTN_FA_SHAPE=wg WEFT_ATTN_FA_BWD_SHAPE=wg prof "WEFT_ATTN_FA_BWD_SHAPE=wg" $kn --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis
done
echo "written: $out ($(wc -l <"$out") lines)"
# the lines that say where each kernel stands against the GPU's ceilings
grep -E "^== |^  k_attn_|Compute \(SM\) Throughput|Memory Throughput|Shared Memory|Achieved Occupancy|Registers Per Thread|Duration|Issue Slots Busy" "$out" | head -100
[ $rc -eq 0 ]
