#!/bin/sh
# gpu_session.sh - what one GPU session runs, in the order of what matters
# most, inside a time budget, so that one call of the device tool does it:
#   1. tests/gpu/run.sh checks 1 2 8: the plugin finds the GPU, every kernel
#      against the CPU's, cuDNN's fused attention (what a change to kernels
#      must pass before anything is timed);
#   2. bench/gpu.sh kernels 124m 350m cudnn: the kernels alone, GPT-2 124M
#      and 350M at the largest batch beside PyTorch eager and torch.compile,
#      and with cuDNN's attention;
#   3. bench/gpu.sh trace tp2 switches: one step timed instruction by
#      instruction beside weft estimate's simulation, tp2 on two virtual
#      devices against one, then the executor's fusions one at a time;
#   4. tests/gpu/run.sh checks 4 5 6 7: PyTorch's GPT-2, memcheck, NCCL,
#      the fusions at GPT-2's vocabulary;
#   5. tests/gpu/run.sh check 3: the plans (over 250 s on an H200);
#   6. bench/gpu_ncu_attention.sh: Nsight Compute's sections for the
#      plugin's attention kernels at 124M's heads (not in the default
#      PARTS: a session that asks where the backward's time goes), at
#      most MAX6 seconds (default 150), so that it can go first.
# A part starts only with at least its least time left (MIN1..MIN6, in
# seconds), and is stopped at the end of the budget; what it printed is
# kept. Each part's file is renamed with the part's name
# (gpu-check-DATE-DEVICE-part-kernels.txt ...), so that the parts of one
# day do not write over each other: at most 8 files (the device tool
# brings back 8).
#
# Usage, from the repository root, with what tests/gpu/run.sh and
# bench/gpu.sh need (make weft cuda where nvcc is; or make gpu-pack, whose
# build/gpu-pack.tar.gz, PACK, this script unpacks first):
#     BUDGET=540 sh bench/gpu_session.sh [DIR]
# DIR: where the files go (default bench/results; on the device tool, $OUT).
# PARTS: the parts to run, in that order (default "1 2 4 3 5"); RUN_SH
# and GPU_SH name the two scripts (for trying this one with stand-ins).
# A lease of 15 minutes of an H200 held two calls on 2026-12-04: the
# first, with the machine's start, ran BUDGET=545 PARTS="1 2" (parts 1
# and 2 took 150 s and over 400); the second, at once while the machine
# was warm, BUDGET=255 with what was left.
DIR=${1:-bench/results}
BUDGET=${BUDGET:-540}
PARTS=${PARTS:-1 2 4 3 5}
RUN_SH=${RUN_SH:-tests/gpu/run.sh}
GPU_SH=${GPU_SH:-bench/gpu.sh}
mkdir -p "$DIR" || exit 2
start=$(date +%s)
# the binaries, packed where they were built (make gpu-pack)
PACK=${PACK:-build/gpu-pack.tar.gz}
if [ -f "$PACK" ]; then
  tar -xzf "$PACK" || { echo "gpu_session: cannot unpack $PACK"; exit 2; }
  echo "gpu_session: unpacked $PACK"
fi
left() { echo $((BUDGET - ($(date +%s) - start))); }
status=0

# part NUMBER NAME MIN KIND COMMAND...: runs the command for at most the
# time left, then renames the file it wrote (DIR/gpu-KIND-*.txt, and a
# trace's .json) after NAME
part() {
  n=$1; name=$2; least=$3; kind=$4; shift 4
  t=$(left)
  if [ "$t" -lt "$least" ]; then
    echo "gpu_session: part $n ($name) not started: $t s left of $BUDGET, it needs at least $least"
    status=1
    return
  fi
  echo "gpu_session: part $n ($name), $t s left"
  mark=$DIR/.gpu_session.mark
  touch "$mark"
  timeout "$t" "$@"
  rc=$?
  [ $rc -eq 124 ] && echo "gpu_session: part $n ($name) stopped at the end of its time (the budget's, or MAX6 for part 6)"
  [ $rc -ne 0 ] && status=1
  # the files this part wrote: newer than the mark
  for f in "$DIR"/gpu-"$kind"-*.txt "$DIR"/gpu-trace-*.json; do
    [ -f "$f" ] && [ "$f" -nt "$mark" ] || continue
    case "$f" in *-part-*) continue ;; esac
    mv "$f" "${f%.*}-part-$name.${f##*.}"
  done
  rm -f "$mark"
}

# the parts, run in the order PARTS names them
for which in $PARTS; do
  case $which in
  1) part 1 kernels "${MIN1:-60}" check env CHECKS="1 2 8" sh "$RUN_SH" "$DIR" ;;
  2) part 2 models "${MIN2:-180}" bench env PARTS="kernels 124m 350m cudnn" sh "$GPU_SH" "$DIR" ;;
  3) part 3 switches "${MIN3:-90}" bench env PARTS="trace tp2 switches" sh "$GPU_SH" "$DIR" ;;
  4) part 4 more "${MIN4:-60}" check env CHECKS="4 5 6 7" sh "$RUN_SH" "$DIR" ;;
  5) part 5 plans "${MIN5:-120}" check env CHECKS="3" sh "$RUN_SH" "$DIR" ;;
  6) part 6 ncu "${MIN6:-60}" ncu timeout "${MAX6:-150}" sh "${NCU_SH:-bench/gpu_ncu_attention.sh}" "$DIR" ;;
  *) echo "gpu_session: no part $which (parts: 1 to 6)"; status=1 ;;
  esac
done
echo "gpu_session: $(( $(date +%s) - start )) s of $BUDGET; files in $DIR:"
ls -l "$DIR" | grep -- "-part-"
exit $status
