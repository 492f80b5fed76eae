#!/bin/sh
# run.sh - every check of the CUDA backend that needs a GPU, in one command:
#   1. the plugin loads and finds the GPU (weft backends --kernels); its
#      NVTX ranges under a profiler's stand-in (build/cuda/libnvtx_record.so,
#      where it was built): those of a traced GPT-2 tp2, the streams, and
#      the one-time choices of kernels in step 1 alone;
#   2. every kernel against the CPU backend's, f32 and bf16, at the sizes
#      of make check and at larger ones (build/cuda/test_kernels), then
#      attention's again with the backward's dq by atomics (fa-atomic)
#      and from a stored dS (fa-ds);
#      on compute capability 9.0, GPT-2 with the backward on the warpgroup
#      products (fa-wg, fa-wgp) matching one device, its loss within 1e-3
#      of the mma.sync kernels', where test_kernels passed them (else the
#      checks after it run under WEFT_ATTN_WG=off: a fault of theirs
#      costs no other check);
#   3. every example plan against one device (weft run --backend cuda
#      --check) at small sizes, cuda against cpu over 5 steps in f32 and
#      bf16, --deterministic bit for bit, save and resume (tests/cuda/plans.sh);
#   4. the PyTorch GPT-2 of tests/reference, weft on the GPU;
#   5. compute-sanitizer's memcheck on a small plan, and its racecheck on
#      a bf16 one whose attention's backward sums dq by atomics;
#   6. the NCCL path (WEFT_CUDA_COMM=nccl), one rank on the GPU: a plan whose
#      collectives have groups of one saves the bytes of the virtual-device
#      path, in f32 and bf16, and matches one device (--check); skipped,
#      with a line that says why, when the plugin has no NCCL;
#   7. the executor's fusions (docs/run.md, How it executes) where the
#      plans of step 3 do not reach them: GPT-2's vocabulary of 50257 (its
#      logits in padded rows, a linear and its GELU as one product) in bf16
#      matches one device (--check), and its losses over 3 steps are within
#      1e-2 of the same run with every fusion off;
#   8. cuDNN's fused attention (WEFT_ATTN=cudnn), where libcudnn.so.9 is
#      found: its graphs planned on the GPU (build/cuda/cudnn_graphs), the
#      kernels' checks again with attention through it, and GPT-2 of step 7
#      with it matching one device (--check) and the plugin's attention's
#      loss within 1e-2, and under --deterministic the same bits twice;
#      then the automatic choice: cuDNN timed against the plugin's kernels
#      and compared with them (WEFT_ATTN=auto with --check, and by default
#      at 1024 positions), each choice printed.
# It prints one line per check and a summary, and writes the same into
# DIR/gpu-check-DATE-DEVICE.txt (default DIR: bench/results), to commit.
#
# Usage, from the repository root, with ./weft, ./libweft_cuda.so and
# build/cuda/test_kernels (and build/cuda/cudnn_graphs) built by
# `make weft cuda` on a
# machine with nvcc (the GPU machine needs no flex, bison or Lua):
#     sh tests/gpu/run.sh [DIR]
# PY names a python3 with torch and numpy (default: python3 on the PATH);
# CHECKS the numbers of the checks to run (default "1 2 3 4 5 6 7 8");
# LIMIT the seconds each may take (default 240).
DIR=${1:-bench/results}
WEFT=./weft
PY=${PY:-$(command -v python3)}
export PY
pass=0; fail=0
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$DIR" || exit 2
say() { echo "$*" | tee -a "$log"; }
ok() { pass=$((pass+1)); say "ok: $*"; }
bad() { fail=$((fail+1)); say "FAIL: $*"; }

for f in "$WEFT" libweft_cuda.so build/cuda/test_kernels; do
  [ -e "$f" ] || { echo "tests/gpu/run.sh: $f is missing: build it with make where nvcc is"; exit 2; }
done
# cuBLASLt and NCCL where the toolkit keeps them, or where PyTorch's wheels
# do (cuDNN for check 8 alone)
. bench/gpu/libs.sh
gpu_lib_dirs
export WEFT_PLUGIN_DIR=$(pwd)
# each check stops after LIMIT seconds (a hang is a failure, not a lost log)
LIMIT=${LIMIT:-240}
# CHECKS: the numbers of the checks to run (default all, 1 to 8)
CHECKS=${CHECKS:-1 2 3 4 5 6 7 8}
want() { case " $CHECKS " in *" $1 "*) return 0 ;; esac; return 1; }
# (SECS, where set, in its place)
limit() { if command -v timeout >/dev/null 2>&1; then timeout "${SECS:-$LIMIT}" "$@"; else "$@"; fi; }

device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
# the log is written as the checks go, so that it survives an interrupted run
slug=$(echo "${device:-gpu}" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')
log=$DIR/gpu-check-$(date -u +%Y-%m-%d)-$slug.txt
: >"$log" || exit 2
say "tests/gpu/run.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), ${device:-no nvidia-smi}"
say "driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1);" \
  "$(nvcc --version 2>/dev/null | tail -1); weft $($WEFT version | sed 's/^weft //'), commit ${WEFT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"

# 1. the plugin and the GPU
if want 1; then
if $WEFT backends --kernels >"$tmp/b" 2>&1 && grep -q "runs on: GPU" "$tmp/b"; then ok "$(grep 'runs on' "$tmp/b" | sed 's/^ *//')"
else bad "weft backends: the plugin or the GPU"; cat "$tmp/b" | tee -a "$log"; fi
if [ -f build/cuda/libnvtx_record.so ]; then
  if limit env NVTX_INJECTION64_PATH="$(pwd)/build/cuda/libnvtx_record.so" NVTX_RECORD="$tmp/nvtx.txt" $WEFT run \
       examples/gpt2.plan --plan tp2 --set layers=2 --set hidden=64 --set heads=4 --set seq=16 --set vocab=256 \
       --set batch=8 --backend cuda --steps 2 --clip 1 --trace "$tmp/nvtx.json" >"$tmp/nv.run" 2>&1 &&
     "$PY" tests/cuda/nvtx_check.py --choices "$tmp/nvtx.txt" "$tmp/nvtx.json" 2 2 >"$tmp/nv.out" 2>&1; then
    ok "NVTX ranges under a profiler's stand-in, gpt2 tp2: $(sed 's/^nvtx_check: //' "$tmp/nv.out"); step 1: $(grep '^step 1 ' "$tmp/nv.run" | sed 's/.*  (//; s/)$//')"
  else bad "NVTX ranges"; cat "$tmp/nv.run" "$tmp/nv.out" | tail -20 | tee -a "$log"; fi
fi
fi

# 2. the kernels
if want 2; then
if limit build/cuda/test_kernels >"$tmp/k" 2>&1; then ok "kernels: $(tail -1 "$tmp/k" | sed 's/^test_kernels: //') against the CPU's"
else bad "kernels"; fi
grep "^kernel" "$tmp/k" >>"$log"
grep "FAIL" "$tmp/k"
# the kernels on Hopper's warpgroup products (attention_wg.cu), checked
# last by test_kernels: where the GPU runs them (compute capability 9.0)
# and a check of theirs failed, or test_kernels stopped among them (a
# fault), the checks after this one run under WEFT_ATTN_WG=off, so that
# the fault costs no other check
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)
wg=no
case "${WEFT_ATTN_WG:-}" in off|0) wg_off=1 ;; *) wg_off=0 ;; esac
if [ "$cc" = 9.0 ] && [ $wg_off = 0 ]; then
  nwg=$(awk '/wgmma m64n64k16/ {w = 1} w && /FAIL/ {n++} END {print n + 0}' "$tmp/k")
  if [ "$nwg" = 0 ] && grep -q "(dh 64) f16, WEFT_ATTN_FA_BWD_SHAPE=wgp against wg: .* ok$" "$tmp/k"; then wg=yes
  else
    bad "the warpgroup kernels in test_kernels: $nwg checks failed, or it stopped among them; the checks below run under WEFT_ATTN_WG=off"
    grep "wgmma\|SHAPE=wg" "$tmp/k" | tail -12 | tee -a "$log"
    export WEFT_ATTN_WG=off
  fi
fi
# the attention checks again with the backward's dq summed by atomics
# (WEFT_ATTN=fa-atomic, attention_fa_bwd.cu)
if limit env WEFT_ATTN=fa-atomic build/cuda/test_kernels --attention >"$tmp/ka" 2>&1; then
  ok "kernels with WEFT_ATTN=fa-atomic: $(tail -1 "$tmp/ka" | sed 's/^test_kernels: //') (attention alone)"
else bad "kernels with WEFT_ATTN=fa-atomic"; grep "FAIL" "$tmp/ka" | tee -a "$log"; fi
# and with dq from the dS the dk/dv kernel stores (WEFT_ATTN=fa-ds)
if limit env WEFT_ATTN=fa-ds build/cuda/test_kernels --attention >"$tmp/kd" 2>&1; then
  ok "kernels with WEFT_ATTN=fa-ds: $(tail -1 "$tmp/kd" | sed 's/^test_kernels: //') (attention alone)"
else bad "kernels with WEFT_ATTN=fa-ds"; grep "FAIL" "$tmp/kd" | tee -a "$log"; fi
# the backward's kernels at heads of 128 in one stage of shared memory,
# as GPUs of 99 KiB a block run them (WEFT_ATTN_FA_STAGES=1 takes them on
# any GPU)
for way in fa fa-atomic; do
  if limit env WEFT_ATTN_FA_STAGES=1 WEFT_ATTN=$way build/cuda/test_kernels --attention >"$tmp/k1" 2>&1; then
    ok "kernels with WEFT_ATTN_FA_STAGES=1 WEFT_ATTN=$way: $(tail -1 "$tmp/k1" | sed 's/^test_kernels: //') (attention alone; heads of 128 in one stage)"
  else bad "kernels with WEFT_ATTN_FA_STAGES=1 WEFT_ATTN=$way"; grep "FAIL" "$tmp/k1" | tee -a "$log"; fi
done
# the backward on Hopper's warpgroup products (fa-wg, fa-wgp), where they
# passed above: GPT-2 in bf16 at heads of 64 with each, matching one
# device (--check), its loss at step 5 within 1e-3 of the mma.sync
# kernels' (WEFT_ATTN=fa)
if [ "$wg" = yes ]; then
  W="bench/gpu/gpt2.plan --plan single --set layers=2 --set hidden=256 --set heads=4 --set seq=256 --set batch=4 --set vocab=512"
  limit env WEFT_ATTN=fa $WEFT run $W --backend cuda --steps 5 >"$tmp/w0" 2>&1; r0=$?
  limit env WEFT_ATTN=fa-wg $WEFT run $W --backend cuda --steps 5 --check >"$tmp/w1" 2>&1; r1=$?
  limit env WEFT_ATTN=fa-wgp $WEFT run $W --backend cuda --steps 5 --check >"$tmp/w2" 2>&1; r2=$?
  l0=$(awk '$1 == "step" {l = $4} END {print l}' "$tmp/w0")
  lw=$(awk '$1 == "step" {l = $4} END {print l}' "$tmp/w1")
  lp=$(awk '$1 == "step" {l = $4} END {print l}' "$tmp/w2")
  near() { awk -v a="$1" -v b="$2" 'BEGIN {d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 0.001 * a)}'; }
  if [ $r0 -eq 0 ] && [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && grep -q ": match$" "$tmp/w1" && grep -q ": match$" "$tmp/w2" &&
     ! grep -q "self-check" "$tmp/w1" "$tmp/w2" && near "$l0" "$lw" && near "$l0" "$lp"; then
    ok "GPT-2 bf16, heads of 64, WEFT_ATTN=fa-wg and fa-wgp: --check $(grep -o 'losses within [^,]*' "$tmp/w1"), $(grep -o 'losses within [^,]*' "$tmp/w2"); loss at step 5 $lw, $lp, fa's $l0"
  else bad "GPT-2 with WEFT_ATTN=fa-wg, fa-wgp (exit $r0, $r1, $r2; losses $lw, $lp, fa's $l0)"
    tail -4 "$tmp/w1" "$tmp/w2" | tee -a "$log"; fi
elif [ "$cc" = 9.0 ]; then say "fa-wg, fa-wgp: GPT-2 not run: WEFT_ATTN_WG=${WEFT_ATTN_WG:-}"
else say "fa-wg, fa-wgp: not on this GPU (compute capability ${cc:-unknown}, 9.0 runs them)"; fi
fi

# 3. the plans
if want 3; then
{ limit sh tests/cuda/plans.sh "$WEFT" "$(pwd)" cuda 1e-5 2>&1; echo $? >"$tmp/prc"; } | tee -a "$log" >"$tmp/p"
if [ "$(cat "$tmp/prc")" = 0 ]; then ok "plans: $(tail -1 "$tmp/p")"
else bad "plans (exit $(cat "$tmp/prc")): $(tail -1 "$tmp/p")"; grep "FAIL" "$tmp/p"; fi
fi

# 4. PyTorch
if want 4; then
# (GPT-2 under four plans and schedules, then the mixture of experts under
# three plans and two capacities: twice the time of a check)
SECS=$((LIMIT * 2))
limit env BACKEND=cuda sh tests/reference/run.sh "$WEFT" >"$tmp/r" 2>&1
rrc=$? SECS=
# (four GPT-2 runs and six of the mixture of experts)
if [ $rrc -eq 0 ] && [ "$(grep -c 'on cuda ok' "$tmp/r")" -ge 10 ]; then
  ok "PyTorch reference: tp2_pp2 and dp, plain, cosine and linear schedules with clipping, and the mixture of experts, agree with PyTorch's"
elif [ $rrc -eq 124 ]; then bad "PyTorch reference: stopped after $((LIMIT * 2)) s (LIMIT=$LIMIT, twice that for this check)"
else bad "PyTorch reference ($PY): $(tail -1 "$tmp/r")"; fi
cat "$tmp/r" >>"$log"
fi

# 5. memcheck
if want 5; then
GPT="--set layers=2 --set hidden=64 --set heads=4 --set seq=16 --set vocab=256 --set batch=4"
if command -v compute-sanitizer >/dev/null 2>&1; then
  limit compute-sanitizer --tool memcheck --error-exitcode 9 $WEFT run examples/gpt2.plan --plan tp2 $GPT --backend cuda \
    --steps 1 >"$tmp/m" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q "ERROR SUMMARY: 0 errors" "$tmp/m"; then ok "compute-sanitizer memcheck, gpt2 tp2: 0 errors"
  else bad "compute-sanitizer memcheck (exit $rc)"; tail -30 "$tmp/m" | tee -a "$log"; fi
  # races in shared memory: the backward with dq by atomics, whose warps
  # share each chunk's dS (attention_fa_bwd.cu), on heads of 32
  limit env WEFT_ATTN=fa-atomic compute-sanitizer --tool racecheck --error-exitcode 9 $WEFT run bench/gpu/gpt2.plan \
    --plan single $GPT --set hidden=128 --backend cuda --steps 1 >"$tmp/rc" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q "SUMMARY: 0 " "$tmp/rc"; then ok "compute-sanitizer racecheck, gpt2 bf16 with WEFT_ATTN=fa-atomic: 0 hazards"
  else bad "compute-sanitizer racecheck, WEFT_ATTN=fa-atomic (exit $rc)"; tail -30 "$tmp/rc" | tee -a "$log"; fi
  # and the backward's one stage of shared memory at heads of 128 (as GPUs
  # of 99 KiB a block run it; WEFT_ATTN_FA_STAGES=1), its stage refilled
  # after each tile's products, with dq by atomics, by its own kernel and
  # from the stored dS (whose dq kernel's two stages are raced here too)
  for way in fa fa-atomic fa-ds; do
    limit env WEFT_ATTN_FA_STAGES=1 WEFT_ATTN=$way compute-sanitizer --tool racecheck --error-exitcode 9 $WEFT run \
      bench/gpu/gpt2.plan --plan single $GPT --set hidden=256 --set heads=2 --backend cuda --steps 1 >"$tmp/rc" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && grep -q "SUMMARY: 0 " "$tmp/rc"; then
      ok "compute-sanitizer racecheck, gpt2 bf16 heads of 128 in one stage, WEFT_ATTN=$way: 0 hazards"
    else bad "compute-sanitizer racecheck, one stage, WEFT_ATTN=$way (exit $rc)"; tail -30 "$tmp/rc" | tee -a "$log"; fi
  done
else
  bad "compute-sanitizer is not on the PATH"
fi
fi

# 6. NCCL, one rank
if want 6; then
ONE=tests/cuda/coshard_one.plan  # co-shard on one device: all-reduces of the group [0]
if ! ldd libweft_cuda.so | grep -q "libnccl"; then
  say "skipped: NCCL path: libweft_cuda.so was built without NCCL (no nccl.h where nvcc is)"
elif ldd libweft_cuda.so | grep -q "libnccl.*not found"; then
  say "skipped: NCCL path: libnccl.so.2 is not found (put its directory in LD_LIBRARY_PATH)"
else
  for dt in f32 bf16; do
    limit $WEFT run $ONE --set dtype=$dt --backend cuda --steps 3 --save "$tmp/v.st" >"$tmp/v" 2>&1
    limit env WEFT_CUDA_COMM=nccl $WEFT run $ONE --set dtype=$dt --backend cuda --steps 3 \
      --check --save "$tmp/n.st" >"$tmp/n" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && grep -q "collectives of groups of one through NCCL [0-9.]*, 1 communicator" "$tmp/n" &&
       grep -q ": match$" "$tmp/n" && cmp -s "$tmp/v.st" "$tmp/n.st"; then
      ok "NCCL path, co-shard of one device $dt: $(sed -n 's/.*through \(NCCL [0-9.]*\).*/\1/p' "$tmp/n"), one rank: the bytes of the virtual-device path, --check: match"
    else bad "NCCL path, $dt (exit $rc)"; cat "$tmp/v" "$tmp/n" | tee -a "$log"; fi
    rm -f "$tmp/v.st" "$tmp/n.st"
  done
fi
fi

# 7. the fusions at GPT-2's vocabulary
V="bench/gpu/gpt2.plan --plan single --set layers=2 --set seq=128 --set batch=4"
l1=
if want 7; then
OFF="WEFT_CUDA_FUSE=0 WEFT_CUDA_FIRST_WRITE=0 WEFT_CUDA_PAD_ROWS=0"
limit $WEFT run $V --backend cuda --steps 3 --check >"$tmp/f1" 2>&1
rc1=$?
limit env $OFF $WEFT run $V --backend cuda --steps 3 >"$tmp/f0" 2>&1
rc0=$?
l1=$(awk '$1 == "step" {l = $4} END {print l}' "$tmp/f1"); l0=$(awk '$1 == "step" {l = $4} END {print l}' "$tmp/f0")
if [ $rc1 -eq 0 ] && [ $rc0 -eq 0 ] && grep -q ": match$" "$tmp/f1" &&
   awk -v a="$l0" -v b="$l1" 'BEGIN {d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 0.01 * a)}'; then
  ok "fusions, gpt2 bf16 vocabulary 50257: --check $(grep -o 'losses within [^,]*' "$tmp/f1"); loss at step 3 $l1, every fusion off $l0"
else bad "fusions, gpt2 bf16 vocabulary 50257 (exit $rc1, $rc0; losses $l1, $l0)"; cat "$tmp/f1" "$tmp/f0" | tail -20 | tee -a "$log"; fi
fi

# 8. cuDNN's fused attention (WEFT_ATTN=cudnn, backends/cuda/attention_cudnn.cu)
if want 8; then
gpu_cudnn
if [ -z "${WEFT_CUDNN:-}" ]; then
  say "skipped: cuDNN's attention: libcudnn.so.9 is not found (WEFT_CUDNN names it)"
else
  # its graphs planned on this GPU
  if [ -x build/cuda/cudnn_graphs ]; then
    if limit build/cuda/cudnn_graphs >"$tmp/dg" 2>&1; then ok "cuDNN's attention graphs: $(grep -c '^ok' "$tmp/dg") planned on this GPU ($WEFT_CUDNN)"
    else bad "cuDNN's attention graphs"; fi
    cat "$tmp/dg" >>"$log"
  fi
  # the kernels' checks again, attention through cuDNN where it takes the heads
  limit env WEFT_ATTN=cudnn WEFT_CUDNN_VERBOSE=1 build/cuda/test_kernels >"$tmp/dk" 2>&1
  rc=$?
  planned=$(grep -c "weft: cuDNN .* runs$" "$tmp/dk")
  # (a graph cuDNN refuses leaves those heads to the plugin's kernels; a
  # failed execution turns the path off: a failure here)
  if [ $rc -eq 0 ] && [ "$planned" -ge 2 ] && ! grep -q "attention runs on the plugin's kernels" "$tmp/dk"; then
    ok "kernels with WEFT_ATTN=cudnn: $(tail -1 "$tmp/dk" | sed 's/^test_kernels: //'), $planned attention plans of cuDNN's run"
  else bad "kernels with WEFT_ATTN=cudnn (exit $rc, $planned plans of cuDNN's run)"; grep "FAIL" "$tmp/dk" | tee -a "$log"; fi
  grep "weft: \|attention" "$tmp/dk" >>"$log"
  # GPT-2 at its vocabulary: one device against cpu (--check), and its
  # losses against the plugin's attention's
  if [ -z "$l1" ]; then  # (check 7 not run: the plugin's attention's loss)
    limit $WEFT run $V --backend cuda --steps 3 >"$tmp/f1" 2>&1
    l1=$(awk '$1 == "step" {l = $4} END {print l}' "$tmp/f1")
  fi
  limit env WEFT_ATTN=cudnn WEFT_CUDNN_VERBOSE=1 $WEFT run $V --backend cuda --steps 3 --check >"$tmp/c1" 2>&1
  rc1=$?
  lc=$(awk '$1 == "step" {l = $4} END {print l}' "$tmp/c1")
  if [ $rc1 -eq 0 ] && grep -q ": match$" "$tmp/c1" && grep -q "weft: cuDNN .* the backward .* runs$" "$tmp/c1" &&
     ! grep -q "WEFT_ATTN=cudnn:" "$tmp/c1" &&
     awk -v a="$l1" -v b="$lc" 'BEGIN {d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 0.01 * a)}'; then
    ok "cuDNN's attention, gpt2 bf16: --check $(grep -o 'losses within [^,]*' "$tmp/c1"); loss at step 3 $lc, the plugin's attention $l1"
  else bad "cuDNN's attention, gpt2 bf16 (exit $rc1; losses $lc, $l1)"; tail -20 "$tmp/c1" | tee -a "$log"; fi
  # --deterministic through cuDNN's backward of one order: two runs, the
  # same bits
  drc=0
  for i in 1 2; do
    limit env WEFT_ATTN=cudnn WEFT_CUDNN_VERBOSE=1 $WEFT run $V --backend cuda --steps 2 --deterministic \
      --save "$tmp/d$i.st" >"$tmp/d$i" 2>&1 || drc=$?
  done
  if [ $drc -eq 0 ] && cmp -s "$tmp/d1.st" "$tmp/d2.st" && grep -q "deterministic backward .* runs$" "$tmp/d1"; then
    ok "cuDNN's attention, gpt2 bf16 --deterministic: two runs save the same bits"
  else bad "cuDNN's attention, --deterministic (exit $drc; $(cmp "$tmp/d1.st" "$tmp/d2.st" 2>&1 | head -1))"
    tail -5 "$tmp/d1" | tee -a "$log"; fi
  # the automatic choice (attention_pick.cu): cuDNN timed against the
  # plugin's kernels and compared with them, at GPT-2's small test size
  # under WEFT_ATTN=auto (--check), and by default at 1024 positions
  limit env WEFT_ATTN=auto $WEFT run $V --backend cuda --steps 3 --check >"$tmp/a1" 2>&1
  rc1=$?
  limit $WEFT run bench/gpu/gpt2.plan --plan single --set layers=2 --set seq=1024 --set batch=4 --backend cuda \
    --steps 2 >"$tmp/a2" 2>&1
  rc2=$?
  grep "^weft: attention" "$tmp/a1" "$tmp/a2" | sed 's/^[^:]*:weft: /  /' | tee -a "$log"
  if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && grep -q ": match$" "$tmp/a1" &&
     [ "$(grep -c '^weft: attention .*; cudnn .*: [-a-z]* runs them' "$tmp/a1")" -ge 2 ] &&
     [ "$(grep -c '^weft: attention .* s1024 .*; cudnn .*: [-a-z]* runs them' "$tmp/a2")" -ge 2 ]; then
    ok "attention's kernels chosen by time (cuDNN against the plugin's): --check $(grep -o 'losses within [^,]*' "$tmp/a1"); at 1024 positions: $(grep -o '[-a-z]* runs them' "$tmp/a2" | tr '\n' ' ')"
  else bad "attention's kernels chosen by time (exit $rc1, $rc2)"; tail -8 "$tmp/a1" "$tmp/a2" | tee -a "$log"; fi
fi
fi

say "tests/gpu/run.sh: $pass passed, $fail failed"
echo "written: $log"
[ "$fail" = 0 ]
