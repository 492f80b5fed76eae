#!/bin/sh
# gpu.sh - weft's CUDA backend timed on one GPU, beside PyTorch:
#   - GPT-2 124M and 350M (bench/gpu/gpt2.plan: seq 1024, bf16 with f32
#     masters, AdamW) at the largest batch weft fits (a power of two): weft's
#     tokens/s and MFU, then PyTorch eager and torch.compile on the same model
#     and batch (bench/gpu/gpt2_torch.py); where PyTorch runs out of memory
#     at that batch, weft and PyTorch again at half of it;
#   - GPT-2 124M under Megatron's tp2 on two virtual devices of the GPU
#     against the whole model on one.
# MFU: 3 x the model's forward FLOPs per step (weft graph --json) over the
# step time and the GPU's dense bf16 peak (989.4 TFLOP/s for H100 and H200,
# 312 for A100, others below; PEAK_TFLOPS overrides; an MFU of "-" where
# the GPU's is not known). Steps: 3 warm-up, then the median of
# the rest. Prints a table and writes it to DIR/gpu-bench-DATE-DEVICE.txt.
#
# Usage, from the repository root, with ./weft and ./libweft_cuda.so built
# where nvcc is:   sh bench/gpu.sh [DIR]
# PARTS picks among "kernels 124m 350m tp2 cudnn switches trace" (default
# the first five; kernels: bench_kernels, below; cudnn: 124M and 350M again
# with attention through cuDNN's fused flash attention, WEFT_ATTN=cudnn,
# through the plugin's kernels alone, WEFT_ATTN=fa, and with the backward's
# dq from a stored dS, WEFT_ATTN=fa-ds (the first row
# takes whichever was fastest on its heads, attention_pick.cu, and says
# which; the backward summing dq by atomics, WEFT_ATTN=fa-atomic, slower
# by 2026-12-04's run, is timed by the kernels part alone);
# tp2, switches and trace find 124M's batch without its rows; trace: one step of 124M
# timed instruction by instruction, weft run --trace, summed by operator
# (bench/trace_summary.py) and set beside weft estimate's simulation of the
# same step (bench/trace_compare.py), the two timelines written to
# DIR/gpu-trace-DATE-DEVICE.json;
# switches: 124M with each of the
# executor's fusions off, WEFT_CUDA_FUSE=0, WEFT_CUDA_FIRST_WRITE=0,
# WEFT_CUDA_PAD_ROWS=0, WEFT_CUDA_LOSS_IN_PLACE=0, WEFT_CUDA_FUSE_RESID=0,
# WEFT_CUDA_PASS_GRADS=0, WEFT_GEMM_DBIAS=0, WEFT_GEMM_EVEN=0 (the LM head's
# products whole rather than their last rows split off: its weight's
# gradient took 1.49 ms split and tuned, 1.25 ms whole with cuBLASLt's
# first algorithm, on an H200 on 2026-11-26),
# then all, against all on, then with the
# first LayerNorm and column-sum kernels, WEFT_LN_KERNEL=old and
# WEFT_COLSUM_KERNEL=old, and with LayerNorm's backward adding in place,
# WEFT_CUDA_LN_IN_PLACE=1) and TORCH_MODES
# among "eager compile" (default both; empty: none).
# (SEQ=16 SETS="--set seq=16 --set vocab=256" and WEFT_PLUGIN_DIR=build/cudaemu
# KERNELS=build/cudaemu/bench_kernels KERNELS_ARGS=--small try the script on
# the emulation, at a size it can run.) It starts with the attention kernels,
# a cuBLASLt linear and GPT-2's LM head (staged and direct; then again with
# WEFT_GEMM_TUNE=0 WEFT_GEMM_EVEN=0) alone: ms per call and TFLOP/s
# (bench_kernels), the attention backward at heads of 64 in each
# occupancy of its kernels and on Hopper's warpgroup products where
# test_kernels --attention passes on the GPU (WEFT_ATTN_FA_BWD_SHAPE,
# docs/cli.md; where one is faster than the default, each model has a row
# in it after weft's), then the plugin's attention with its blocks in
# either order (WEFT_ATTN_FA_ORDER).
# Variables of the plugin's set for the run pass through to every row
# (WEFT_ATTN_FA_BWD_SHAPE=3,4 sh bench/gpu.sh: 124M in that occupancy).
DIR=${1:-bench/results}
WEFT=./weft
PY=${PY:-$(command -v python3)}
PLAN=bench/gpu/gpt2.plan
STEPS=${STEPS:-10}
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$DIR" || exit 2
say() { echo "$*" | tee -a "$log"; }
# cuBLASLt, NCCL and cuDNN (for WEFT_ATTN=cudnn) where the plugin needs them
. bench/gpu/libs.sh
gpu_lib_dirs
gpu_cudnn
export WEFT_PLUGIN_DIR=${WEFT_PLUGIN_DIR:-$(pwd)}
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
# the plan of bench/gpu/gpt2.plan whose cluster weft estimate simulates
# this GPU on: h200_dgx's on an H200, h100_dgx's on others
sim_plan=single
case "$device" in *H200*) sim_plan=single_h200 ;; esac
# dense bf16 tensor-core peaks, from NVIDIA's data sheets (half of the
# figures they give with sparsity); another GPU's MFU needs PEAK_TFLOPS
case "$device" in
  *H100*PCI[Ee]*) peak=756.5 ;;
  *H100*NVL*|*H200*NVL*) peak=835.5 ;;
  *H100*|*H200*) peak=989.4 ;;
  *A100*) peak=312 ;;
  *L40S) peak=362.05 ;;
  *L40) peak=181.05 ;;
  *" L4") peak=121 ;;
  *" A10") peak=125 ;;
  *) peak= ;;
esac
peak=${PEAK_TFLOPS:-$peak}
if [ -n "$peak" ]; then peak_said="$peak TFLOP/s"; else peak_said="unknown (PEAK_TFLOPS sets it; MFU not given)"; fi
# MFU over the peak, or "-" where the GPU's is not known (PEAK_TFLOPS)
mfu() { if [ -n "$peak" ]; then "$PY" -c "print(f'{100*$1/$2/($peak*1e12):.1f}%')"; else echo -; fi; }
# the table is written as it grows, so that an interrupted run keeps its rows
slug=$(echo "${device:-gpu}" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')
log=$DIR/gpu-bench-$(date -u +%Y-%m-%d)-$slug.txt
: >"$log" || exit 2
say "bench/gpu.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), ${device:-no nvidia-smi}, bf16 peak $peak_said," \
  "weft commit ${WEFT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}, torch $($PY -c 'import torch; print(torch.__version__)' 2>/dev/null)"

# first the attention kernels, a cuBLASLt linear and the LM head's products
# alone, timed with CUDA
# events (tests/cuda/bench_kernels.c, built by make cuda; KERNELS names
# another build, KERNELS_ARGS=--small for the emulation)
KERNELS=${KERNELS:-build/cuda/bench_kernels}
PARTS=${PARTS:-kernels 124m 350m tp2 cudnn}
if ! case " $PARTS " in *" kernels "*) true ;; *) false ;; esac; then
  :
elif [ -x "$KERNELS" ]; then
  "$KERNELS" $KERNELS_ARGS 2>&1 | tee -a "$log"
  # the LM head again with cuBLASLt's first algorithm and its odd columns
  # unsplit (what WEFT_GEMM_TUNE and WEFT_GEMM_EVEN gain)
  say "the same LM head products, WEFT_GEMM_TUNE=0 WEFT_GEMM_EVEN=0 (the heuristic's first algorithm, unsplit):"
  WEFT_GEMM_TUNE=0 WEFT_GEMM_EVEN=0 "$KERNELS" $KERNELS_ARGS --lm-head 2>&1 | grep "^lm head" | tee -a "$log"
  # attention through cuDNN's fused flash attention instead of the plugin's
  # kernels (a line of weft's says so where cuDNN refuses)
  say "the same attention, WEFT_ATTN=cudnn (cuDNN's fused attention, ${WEFT_CUDNN:-libcudnn.so.9 not found}):"
  WEFT_ATTN=cudnn "$KERNELS" $KERNELS_ARGS 2>&1 | grep "^attention\|^  the same\|WEFT_ATTN" | tee -a "$log"
  # the plugin's backward with dq summed by atomics in the dk/dv kernel
  say "the same attention backward, WEFT_ATTN=fa-atomic (dq by atomics), WEFT_ATTN=fa-ds (dq from a stored dS) and WEFT_ATTN=fa (its own kernel):"
  WEFT_ATTN=fa-atomic "$KERNELS" $KERNELS_ARGS 2>&1 | grep "^attention backward" | sed 's/$/  fa-atomic/' | tee -a "$log"
  WEFT_ATTN=fa-ds "$KERNELS" $KERNELS_ARGS 2>&1 | grep "^attention backward" | sed 's/$/  fa-ds/' | tee -a "$log"
  WEFT_ATTN=fa "$KERNELS" $KERNELS_ARGS 2>&1 | grep "^attention backward" | sed 's/$/  fa/' | tee -a "$log"
  # the same backward at heads of 64 in each occupancy of its two kernels
  # (WEFT_ATTN_FA_BWD_SHAPE=K,Q: blocks of dk/dv, of dq per multiprocessor
  # that their registers leave room for; the same bits in each)
  # and wg, the kernels on Hopper's warpgroup products (attention_wg.cu),
  # where test_kernels --attention passed their checks on this GPU (other
  # products, other bits: a way of wrong gradients is not timed); where it
  # did not, the rest of the run keeps them out (WEFT_ATTN_WG=off), also
  # from the models' automatic choice
  WG=
  TK=${TESTS:-$(dirname "$KERNELS")/test_kernels}
  if [ -x "$TK" ]; then
    WEFT_ATTN=fa "$TK" --attention >"$tmp/tk.out" 2>&1
    grep "wgmma\|SHAPE=wg" "$tmp/tk.out" | tee -a "$log"
    if grep -q "^test_kernels: [0-9]* checks, 0 failed" "$tmp/tk.out" && grep -q "SHAPE=wg against" "$tmp/tk.out"; then WG="wg wg2 wgp"
    elif [ "${WEFT_ATTN_WG:-}" != off ] && [ "${WEFT_ATTN_WG:-}" != 0 ] &&
         grep -q "^test_kernels: [0-9]* checks, 0 failed" "$tmp/tk.out" &&
         grep -q "^kernel wgmma m64n64k16 bf16: not run here (compute capability 9.0 alone" "$tmp/tk.out"; then
      say "the warpgroup kernels (wg): not timed: they run on compute capability 9.0 alone"
    else
      say "the warpgroup kernels (wg): not timed: $(grep -c FAIL "$tmp/tk.out") checks of test_kernels --attention failed, it stopped, or they do not run here; the rows below run under WEFT_ATTN_WG=off"
      # (a fault of a kernel ends the process's CUDA context: no way of
      # the automatic choice is then left to time)
      export WEFT_ATTN_WG=off
    fi
  fi
  say "the same attention backward at heads of 64, WEFT_ATTN=fa WEFT_ATTN_FA_BWD_SHAPE=K,Q (2,3 the default) or wg:"
  for sh in 2,3 3,3 4,3 2,4 3,4 4,4 $WG; do
    WEFT_ATTN=fa WEFT_ATTN_FA_BWD_SHAPE=$sh "$KERNELS" $KERNELS_ARGS --attention 2>&1 |
      awk '/^attention backward .*dh64 /{p = 1; print; next} /^attention /{p = 0} p && /^  d/' |
      sed "s/\$/  shape $sh/" | tee -a "$log" "$tmp/occupancy"
  done
  # dq by atomics in the dk/dv kernel, in the occupancies of more blocks
  # (4,4: still 3 blocks an SM, which its shared memory allows, in 128
  # registers; Q means nothing there: no dq kernel runs)
  for sh in 3,3 4,4; do
    WEFT_ATTN=fa-atomic WEFT_ATTN_FA_BWD_SHAPE=$sh "$KERNELS" $KERNELS_ARGS --attention 2>&1 |
      grep "^attention backward .*dh64 " | sed "s/\$/  fa-atomic, K,Q $sh/" | tee -a "$log"
  done
  # the forward on Hopper's warpgroup products (WEFT_ATTN_FA_SHAPE=wg),
  # where test_kernels passed it above
  if [ -n "$WG" ]; then
    say "the same attention forward, WEFT_ATTN=fa WEFT_ATTN_FA_SHAPE=wg (Hopper's warpgroup products):"
    WEFT_ATTN=fa WEFT_ATTN_FA_SHAPE=wg "$KERNELS" $KERNELS_ARGS --attention 2>&1 | grep "^attention forward" |
      sed 's/$/  wg/' | tee -a "$log"
  fi
  # the blocks' order of the plugin's kernels: the heaviest tile of every
  # head first (the default), or a head's tiles together
  say "the same attention, WEFT_ATTN=fa, its blocks by tiles (the default) and WEFT_ATTN_FA_ORDER=heads:"
  for order in tiles heads; do
    WEFT_ATTN=fa WEFT_ATTN_FA_ORDER=$order "$KERNELS" $KERNELS_ARGS --attention 2>&1 |
      grep "^attention forward\|^attention backward\|^  d[qk]" | sed "s/\$/  $order/" | tee -a "$log"
  done
  # the fastest, for a row of each model in it (bench_at) where it is not
  # the default and the run did not set one
  BEST_BWD=$(awk '/^attention backward/{for (i = 2; i <= NF; i++) if ($i == "ms") print $(i - 1), $NF}' "$tmp/occupancy" |
    sort -g | head -1 |
    awk '{print $2}')
  [ "$BEST_BWD" = 2,3 ] || [ -n "${WEFT_ATTN_FA_BWD_SHAPE:-}" ] && BEST_BWD=
  [ -n "$BEST_BWD" ] && say "the fastest: $BEST_BWD; the models' rows run in it too"
else
  say "bench_kernels: $KERNELS not built (make cuda)"
fi

# size NAME SETS...: the largest batch that fits, then weft, eager, compile
row() {
  printf '%-28s %6s %12s %9s %8s\n' "$1" "$2" "$3" "$4" "$5" | tee -a "$log"
}
row "run" "batch" "tokens/s" "step ms" "MFU"
# weft_row LABEL [VAR=VALUE...]: weft at $batch with those variables set
weft_row() {
  label=$1; shift
  if env "$@" $WEFT run $PLAN --plan single $sets --set batch=$batch --backend cuda --steps $((STEPS + 3)) --json \
      >"$tmp/w.json" 2>"$tmp/w.err"; then
    t=$("$PY" -c 'import json,statistics,sys; d=json.load(open(sys.argv[1])); print(statistics.median(s["time_s"] for s in d["steps"][3:]))' "$tmp/w.json")
    row "$label" "$batch" "$("$PY" -c "print(f'{$tokens/$t:,.0f}')")" "$("$PY" -c "print(f'{1000*$t:.1f}')")" \
      "$(mfu "$flops" "$t")"
    # the first step's one-time choices of kernels (docs/run.md)
    "$PY" -c 'import json,sys; s=json.load(open(sys.argv[1]))["steps"][0]; print("  step 1: %.2f s, of it %.2f s choosing kernels, once" % (s["time_s"], s.get("setup_s", 0)))' "$tmp/w.json" | tee -a "$log"
    grep "^weft: choosing kernels took" "$tmp/w.err" | sed 's/^weft: /  /' | tee -a "$log"
    grep "WEFT_ATTN" "$tmp/w.err" | sort -u | tee -a "$log"
    # the choice among attention's kernels, where one was timed
    grep "^weft: attention .* runs them" "$tmp/w.err" | sed 's/^weft: /  /' | sort -u | tee -a "$log"
    n=$(grep -c "weft: cuDNN .* runs$" "$tmp/w.err")
    [ "$n" -gt 0 ] && say "  (cuDNN's plans that ran: $n, $(grep -c 'forward of .* runs$' "$tmp/w.err") of them forwards)"
  else
    say "$label: failed: $(tail -3 "$tmp/w.err")"
  fi
}
bench_size() {
  name=$1; layers=$2; hidden=$3; heads=$4; rows=$5
  sets="--set layers=$layers --set hidden=$hidden --set heads=$heads ${SETS:-}"
  batch=
  for b in 64 32 16 8 4 2 1; do
    if $WEFT run $PLAN --plan single $sets --set batch=$b --backend cuda --steps 0 >"$tmp/fit" 2>&1; then batch=$b; break; fi
  done
  if [ -z "$batch" ]; then say "$name: no batch fits: $(tail -1 "$tmp/fit")"; return; fi
  [ "$name" = "GPT-2 124M" ] && TP_BATCH=$batch
  # tp2, switches and trace need 124M's batch alone, not its rows
  [ "$rows" = 1 ] || return 0
  # weft's largest batch, and where PyTorch runs out of memory there, half
  # of it for both, so that each PyTorch row has weft's at its batch
  while :; do
    bench_at "$name"
    [ "$torch_failed" = 1 ] && [ "$batch" -gt 1 ] || break
    batch=$((batch / 2))
    say "$name: PyTorch ran out of memory at batch $((batch * 2)); weft and PyTorch at batch $batch:"
  done
}
# bench_at NAME: weft's rows and PyTorch's at $batch; torch_failed=1 when a
# PyTorch mode ran out of memory
bench_at() {
  name=$1
  torch_failed=0
  flops=$($WEFT graph $PLAN $sets --set batch=$batch --json | "$PY" -c 'import json,sys; print(3*json.load(sys.stdin)["forward_flops"])')
  tokens=$((batch * ${SEQ:-1024}))
  weft_row "$name weft"
  # the same step as weft estimate simulates it (docs/estimate.md)
  if $WEFT estimate $PLAN --plan $sim_plan $sets --set batch=$batch --json >"$tmp/e.json" 2>"$tmp/e.err"; then
    t=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["step_time_s"])' "$tmp/e.json")
    row "$name weft estimate" "$batch" "$("$PY" -c "print(f'{$tokens/$t:,.0f}')")" "$("$PY" -c "print(f'{1000*$t:.1f}')")" \
      "$(mfu "$flops" "$t")"
    say "  (simulated on $("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["cluster"])' "$tmp/e.json"), not run)"
  else
    say "$name weft estimate: failed: $(tail -1 "$tmp/e.err")"
  fi
  [ -n "${BEST_BWD:-}" ] && weft_row "$name weft, bwd shape $BEST_BWD" WEFT_ATTN_FA_BWD_SHAPE=$BEST_BWD
  for mode in ${TORCH_MODES-eager compile}; do
    "$PY" bench/gpu/gpt2_torch.py --mode $mode --layers $layers --hidden $hidden --heads $heads --batch $batch \
      --steps $STEPS >"$tmp/t.json" 2>"$tmp/t.err"
    if grep -q '"tokens_per_s"' "$tmp/t.json" && ! grep -q '"error"' "$tmp/t.json"; then
      t=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["step_s"])' "$tmp/t.json")
      row "$name PyTorch $mode" "$batch" "$("$PY" -c "print(f'{$tokens/$t:,.0f}')")" "$("$PY" -c "print(f'{1000*$t:.1f}')")" \
        "$(mfu "$flops" "$t")"
    else
      grep -q '"out of memory' "$tmp/t.json" && torch_failed=1
      say "$name PyTorch $mode: $(cat "$tmp/t.json") $(tail -2 "$tmp/t.err")"
    fi
  done
  # after PyTorch's rows, so that a budget that runs out takes these first
  case " $PARTS " in *" cudnn "*)
    weft_row "$name weft, cuDNN attn" WEFT_ATTN=cudnn WEFT_CUDNN_VERBOSE=1
    weft_row "$name weft, plugin attn" WEFT_ATTN=fa
    weft_row "$name weft, fa-ds" WEFT_ATTN=fa-ds ;;
  esac
}
case " $PARTS " in *" 124m "*) bench_size "GPT-2 124M" 12 768 12 1 ;;
  *" tp2 "*|*" switches "*|*" trace "*) bench_size "GPT-2 124M" 12 768 12 0 ;; esac
case " $PARTS " in *" 350m "*) bench_size "GPT-2 350M" 24 1024 16 1 ;; esac
SW_BATCH=$TP_BATCH
TR_BATCH=$TP_BATCH
case " $PARTS " in *" trace "*) ;; *) TR_BATCH= ;; esac
case " $PARTS " in *" tp2 "*) ;; *) TP_BATCH= ;; esac
case " $PARTS " in *" switches "*) ;; *) SW_BATCH= ;; esac

# one step of 124M traced: the time of every instruction on the GPU's
# stream, summed by operator with the layers folded
if [ -n "${TR_BATCH:-}" ]; then
  tr=$DIR/gpu-trace-$(date -u +%Y-%m-%d)-$slug.json
  if $WEFT run $PLAN --plan single ${SETS:-} --set batch=$TR_BATCH --backend cuda --steps 4 --trace "$tmp/run.json" >"$tmp/w.out" 2>"$tmp/w.err"; then
    say "GPT-2 124M weft, batch $TR_BATCH, step 4 timed instruction by instruction:"
    "$PY" bench/trace_summary.py "$tmp/run.json" 30 | tee -a "$log"
    # the same step as the cost model simulates it on the plan's cluster
    # (h200_dgx's on an H200, h100_dgx's on others); both timelines in one
    # file
    say "(simulated on plan $sim_plan's cluster)"
    if $WEFT estimate $PLAN --plan $sim_plan ${SETS:-} --set batch=$TR_BATCH --trace "$tmp/sim.json" >/dev/null 2>"$tmp/w.err"; then
      "$PY" bench/trace_compare.py --merge "$tr" "$tmp/run.json" "$tmp/sim.json" 0 30 | tee -a "$log"
      say "(both timelines, ran and simulated: $tr)"
    else
      say "weft estimate --trace: failed: $(tail -3 "$tmp/w.err")"
    fi
  else
    say "GPT-2 124M weft --trace: failed: $(tail -3 "$tmp/w.err")"
  fi
fi
# tp2 on two virtual devices against one device, 124M at the same batch
if [ -n "${TP_BATCH:-}" ]; then
  for plan in single tp2; do
    if $WEFT run $PLAN --plan $plan ${SETS:-} --set batch=$TP_BATCH --backend cuda --steps $((STEPS + 3)) --json >"$tmp/w.json" 2>"$tmp/w.err"; then
      t=$("$PY" -c 'import json,statistics,sys; d=json.load(open(sys.argv[1])); print(statistics.median(s["time_s"] for s in d["steps"][3:]))' "$tmp/w.json")
      row "GPT-2 124M weft $plan" "$TP_BATCH" "$("$PY" -c "print(f'{$TP_BATCH*${SEQ:-1024}/$t:,.0f}')")" \
        "$("$PY" -c "print(f'{1000*$t:.1f}')")" "-"
    else
      say "GPT-2 124M weft $plan: failed: $(tail -3 "$tmp/w.err")"
    fi
  done
fi
# 124M on one device with the executor's fusions (docs/run.md, How it
# executes) turned off one at a time, then all, beside all on
if [ -n "${SW_BATCH:-}" ]; then
  for sw in "" WEFT_CUDA_FUSE=0 WEFT_CUDA_FIRST_WRITE=0 WEFT_CUDA_PAD_ROWS=0 WEFT_CUDA_LOSS_IN_PLACE=0 \
      WEFT_CUDA_FUSE_RESID=0 WEFT_CUDA_PASS_GRADS=0 WEFT_GEMM_DBIAS=0 WEFT_GEMM_EVEN=0 \
      "WEFT_CUDA_FUSE=0 WEFT_CUDA_FIRST_WRITE=0 WEFT_CUDA_PAD_ROWS=0 WEFT_CUDA_LOSS_IN_PLACE=0 WEFT_CUDA_PASS_GRADS=0" \
      "WEFT_LN_KERNEL=old WEFT_COLSUM_KERNEL=old" WEFT_CUDA_LN_IN_PLACE=1; do
    if env $sw $WEFT run $PLAN --plan single ${SETS:-} --set batch=$SW_BATCH --backend cuda --steps $((STEPS + 3)) --json \
        >"$tmp/w.json" 2>"$tmp/w.err"; then
      t=$("$PY" -c 'import json,statistics,sys; d=json.load(open(sys.argv[1])); print(statistics.median(s["time_s"] for s in d["steps"][3:]))' "$tmp/w.json")
      say "GPT-2 124M weft, batch $SW_BATCH, ${sw:-every fusion on}: $("$PY" -c "print(f'{1000*$t:.1f}')") ms a step"
    else
      say "GPT-2 124M weft ${sw:-every fusion on}: failed: $(tail -3 "$tmp/w.err")"
    fi
  done
fi

echo "written: $log"
