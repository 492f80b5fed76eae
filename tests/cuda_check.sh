#!/bin/sh
# cuda_check.sh - the CUDA backend on a machine without a GPU.
#   - the plugin built by nvcc (when it was) loads, lists its kernels, and
#     `weft run --backend cuda` says there is no CUDA device (exit 2);
#     without it, weft says the plugin is not built (exit 2);
#   - the same sources built against the CPU emulation of CUDA
#     (backends/cuda/emu.h): every kernel against the CPU backend's, every
#     example plan against one device (--check) with the streams run in
#     several random orders, the losses of cuda and cpu over 5 steps, f32
#     and bf16, --deterministic bit for bit, save and resume, a plan too big
#     for the device and a Swin window too big for a block's shared memory
#     refused; the NCCL path (WEFT_CUDA_COMM=nccl) on the
#     emulation's stand-in of one rank against the virtual-device path, and
#     its watchdog; several processes, one plan device each, under mpirun
#     and as srun starts them (the stand-in for NCCL across processes),
#     matching one device: all-reduces, sends, all-to-alls, ZeRO-3's
#     reduce-scatters and all-gathers on NCCL's (the calls counted), a
#     broadcast, --clip, a sharded checkpoint resumed by one process, the
#     copies of what several processes compute the same bits in each (one
#     skewed copy said; choices of kernels their timings make differently
#     agreed between them, a process that times nothing vetoing the
#     others' choices); and the watchdog when one of them stops;
#   - the plugin's one-time choices of kernels said beside step 1 and as
#     NVTX ranges, and the NVTX ranges of a traced run.
# Usage: sh tests/cuda_check.sh WEFT EMU_DIR [REAL_DIR]
# CUDA_CHECK_PART: kernels (the plugin, the kernels, the example plans) or
# runs (the rest), the halves make check runs side by side; default both.
WEFT=$1
EMU=$2
REAL=$3
PART=${CUDA_CHECK_PART:-all}
case $PART in kernels|runs) PART_SAID=" ($PART)" ;; all) PART_SAID= ;; *) echo "cuda_check: CUDA_CHECK_PART=$PART: expected kernels or runs"; exit 2 ;; esac
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
# banks_clean WHERE FILE KERNEL...: FILE, what WEFT_CUDA_EMU_BANKS wrote,
# counts the ldmatrix of each KERNEL (a pattern of its name) and none of
# its kernels took more wavefronts than it would without bank conflicts
banks_clean() {
  bwhere=$1 bfile=$2
  shift 2
  if [ ! -s "$bfile" ]; then bad "shared memory's banks${bwhere:+ $bwhere}: no ldmatrix counted (WEFT_CUDA_EMU_BANKS)"; return; fi
  sed -n 's/^\(.*\): \([0-9]*\) ldmatrix, \([0-9]*\) wavefronts, \([0-9]*\) without conflicts$/\2 \3 \4 \1/p' \
    "$bfile" >"$bfile.n"
  bk=$(wc -l <"$bfile.n") bn=$(awk '{n += $1} END {print n + 0}' "$bfile.n") bworse=$(awk '$2 != $3' "$bfile.n")
  bmissing=
  for k in "$@"; do grep -q " $k" "$bfile.n" || bmissing="$bmissing $k"; done
  if [ "$bk" = "$(wc -l <"$bfile")" ] && [ -z "$bworse" ] && [ -z "$bmissing" ]; then ok
    echo "cuda (emulated): shared memory's banks${bwhere:+ $bwhere}: $bn ldmatrix in $bk kernels, none with a conflict"
  else bad "shared memory's banks${bwhere:+ $bwhere}: not counted:${bmissing:- (all were)}; with conflicts (ldmatrix, wavefronts, without conflicts):"
    echo "$bworse" | head -5; fi
}
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT

# ---- the first half: the plugin, the kernels, the example plans ---------------------------
if [ "$PART" != runs ]; then
# ---- the plugin nvcc built, or its absence ----------------------------------------
if [ -n "$REAL" ] && [ -f "$REAL/libweft_cuda.so" ]; then
  if WEFT_PLUGIN_DIR=$REAL "$WEFT" backends --kernels >"$tmp/b.out" 2>&1 &&
     grep -q "loaded from .*libweft_cuda.so" "$tmp/b.out" && grep -q "causal_attention, gqa_attention" "$tmp/b.out"; then ok
    echo "cuda: the plugin loads and lists $(sed -n '/^cuda/,$p' "$tmp/b.out" | grep -c '^         ') kernel families"
  else bad "weft backends --kernels with the plugin"; cat "$tmp/b.out"; fi
  if grep -q "cannot run:" "$tmp/b.out"; then
    WEFT_PLUGIN_DIR=$REAL "$WEFT" run examples/mlp.plan --backend cuda >"$tmp/r.out" 2>"$tmp/r.err"
    rc=$?
    if [ $rc -eq 2 ] && grep -q "no CUDA device" "$tmp/r.err"; then ok
      echo "cuda: without a GPU, weft run --backend cuda exits 2: $(cat "$tmp/r.err")"
    else bad "weft run --backend cuda without a GPU (exit $rc)"; cat "$tmp/r.err"; fi
  else
    echo "cuda: a GPU is here ($(grep 'runs on' "$tmp/b.out" | sed 's/^ *//')): tests/gpu/run.sh checks it"
  fi
  # cuDNN's fused attention (WEFT_ATTN=cudnn): its graphs taken for an
  # H100, asked without a GPU (tests/cuda/cudnn_graphs.c) through the
  # toolkit's stub of the driver, so that cuDNN compiles the engines'
  # kernels and only their loading fails
  stub=$(ls "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")"/../lib64/stubs/libcuda.so \
         /usr/local/cuda/lib64/stubs/libcuda.so 2>/dev/null | head -1)
  if [ -x "$REAL/cudnn_graphs" ] && [ -n "$stub" ] && ! grep -q "runs on" "$tmp/b.out"; then
    mkdir -p "$tmp/stub" && ln -s "$stub" "$tmp/stub/libcuda.so.1"
    # (under SANITIZE=1 the leak checker would count what cuDNN and NVRTC
    # keep for the process's life, outside weft's code: not asked here)
    ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 \
      LD_LIBRARY_PATH=$tmp/stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$REAL/cudnn_graphs" >"$tmp/dn.out" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then ok
      echo "cuda: cuDNN takes the attention graphs for an H100: $(grep -c '^ok' "$tmp/dn.out") forward and backward graphs, kernels compiled without a GPU"
    elif [ $rc -eq 77 ]; then echo "cuda: cuDNN's graphs not asked: $(cat "$tmp/dn.out")"
    else bad "cudnn_graphs (exit $rc)"; cat "$tmp/dn.out"; fi
    # a WEFT_CUDNN that names no library: said, and nothing else tried
    WEFT_CUDNN=$tmp/none/libcudnn.so.9 "$REAL/cudnn_graphs" >"$tmp/dn.out" 2>&1
    rc=$?
    if [ $rc -eq 77 ] && grep -q "WEFT_ATTN=cudnn: WEFT_CUDNN=$tmp/none/libcudnn.so.9 does not load" "$tmp/dn.out"; then ok
    else bad "cudnn_graphs with WEFT_CUDNN naming no file (exit $rc)"; cat "$tmp/dn.out"; fi
  fi
  # the attention backward's kernels at heads of 64 in each occupancy
  # (WEFT_ATTN_FA_BWD_SHAPE, docs/run.md): ptxas's registers and spills on
  # sm_90 (sm_90a for the warpgroup kernels, wg), printed for bf16; the
  # occupancies of 4 blocks an SM may spill a little, no other instance of
  # the mma.sync attention kernels (forward, dk/dv, dq, dq from a stored
  # dS, f16 and bf16, every head width) nor of the warpgroup ones may, and
  # ptxas may not serialize
  # the warpgroup products (its warning C7512: what it does where registers
  # a product uses are touched while it may be in flight)
  if { ${NVCC:-nvcc} -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -Xptxas -v -Ibackends -c -o "$tmp/fa.o" \
         backends/cuda/attention_fa_bwd.cu &&
       ${NVCC:-nvcc} -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -Xptxas -v -Ibackends -c -o "$tmp/fa.o" \
         backends/cuda/attention_fa.cu &&
       ${NVCC:-nvcc} -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xptxas -v -Ibackends -c -o "$tmp/fa.o" \
         backends/cuda/attention_wg.cu; } 2>"$tmp/ptxas.txt"; then
    awk '
      /Compiling entry function/ { match($0, /'"'"'[^'"'"']*'"'"'/); name = substr($0, RSTART + 1, RLENGTH - 2) }
      /bytes spill stores/ { st[name] = $5; ld[name] = $9 }
      /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) if ($i == "Used") rg[name] = $(i + 1) }
      END {
        n = split("dk/dv 2 _Z13k_attn_dkv_faI13__nv_bfloat16Li4ELb1ELi64ELi2ELb0E|" \
                  "dk/dv 3 _Z13k_attn_dkv_faI13__nv_bfloat16Li4ELb0ELi32ELi3ELb0E|" \
                  "dk/dv 4 _Z13k_attn_dkv_faI13__nv_bfloat16Li4ELb0ELi32ELi4ELb0E|" \
                  "dq 3 _Z12k_attn_dq_faI13__nv_bfloat16Li4ELb1ELi3ELi2EE|dq 4 _Z12k_attn_dq_faI13__nv_bfloat16Li4ELb0ELi4ELi2EE|" \
                  "dk/dv wg _Z13k_attn_dkv_wgI13__nv_bfloat16Li3ELb0EE|dk/dv wg2 _Z13k_attn_dkv_wgI13__nv_bfloat16Li2ELb0EE|" \
                  "dk/dv wgp _Z13k_attn_dkv_wgI13__nv_bfloat16Li2ELb1EE|dq wg _Z12k_attn_dq_wgI13__nv_bfloat16Li3ELb0EE|" \
                  "dq wgp _Z12k_attn_dq_wgI13__nv_bfloat16Li3ELb1EE|forward wg _Z13k_attn_fwd_wgI13__nv_bfloat16E|" \
                  "dq fa-ds _Z12k_attn_dq_dsI13__nv_bfloat16Li4ELi2EE", v, "|")
        bad = 0; line = ""; kernels = 0
        for (i = 1; i <= n; i++) {
          split(v[i], f, " "); found = 0
          for (k in rg) if (index(k, f[3]) == 1) {
            found = 1
            line = line sprintf("%s%s %s: %d registers", line == "" ? "" : ", ", f[1], f[2], rg[k])
            if (st[k] + ld[k] > 0) line = line sprintf(" (spills %d bytes stored, %d loaded)", st[k], ld[k])
          }
          if (!found) { bad = 1; line = line ", " f[1] " " f[2] ": not found" }
        }
        for (k in rg) if (k ~ /k_attn_(fa_fwd|dkv_fa|dq_fa|dq_ds|dkv_wg|dq_wg|fwd_wg)/) {
          kernels++
          four = k ~ /^_Z13k_attn_dkv_fa.*ELi32ELi4ELb[01]E/ || k ~ /^_Z12k_attn_dq_fa.*Li4ELb0ELi4ELi2EE/
          if (!four && st[k] + ld[k] > 0) { bad = 1; line = line sprintf("; %s spills %d bytes", k, st[k] + ld[k]) }
        }
        print line sprintf("; %d instances, none of the others spilling", kernels)
        exit bad
      }' "$tmp/ptxas.txt" >"$tmp/regs.txt"
    if [ $? -eq 0 ] && ! grep -qi "serializ" "$tmp/ptxas.txt"; then ok
      echo "cuda: the attention backward at heads of 64 on sm_90 by blocks an SM, $(cat "$tmp/regs.txt")"
    else bad "the attention kernels' registers and spills, or wgmma serialized by ptxas"
      cat "$tmp/regs.txt"; grep -i "serializ" "$tmp/ptxas.txt"; fi
  else bad "nvcc -Xptxas -v of attention_fa_bwd.cu, attention_fa.cu and attention_wg.cu"; tail -5 "$tmp/ptxas.txt"; fi
else
  echo "cuda: the plugin was not built (no nvcc)"
fi
WEFT_PLUGIN_DIR=$tmp/none "$WEFT" run examples/mlp.plan --backend cuda >/dev/null 2>"$tmp/n.err"
rc=$?
if [ $rc -eq 2 ] && grep -q "libweft_cuda.so, not built beside weft" "$tmp/n.err"; then ok
else bad "weft run --backend cuda without the plugin (exit $rc)"; cat "$tmp/n.err"; fi

# ---- the emulation ---------------------------------------------------------------------
# the emulation itself: barriers, shuffles, ballots, stuck threads, warp matrix products
if "$EMU/test_emu" >"$tmp/e.out" 2>&1; then ok
  echo "cuda (emulated): the emulation itself, $(tail -1 "$tmp/e.out" | sed 's/^test_emu: //')"
else bad "test_emu"; grep -v " ok$" "$tmp/e.out"; fi
if WEFT_CUDA_EMU_BANKS=$tmp/k.banks "$EMU/test_kernels" >"$tmp/k.out" 2>&1; then ok
  echo "cuda (emulated): $(tail -1 "$tmp/k.out" | sed 's/^test_kernels: //') against the CPU kernels, f32 and bf16 (attention in f16 too)"
else bad "test_kernels"; grep -v " ok$" "$tmp/k.out"; fi
# shared memory's banks: every ldmatrix of the kernels test_kernels ran
# takes the wavefronts it would without bank conflicts (the emulation
# counts them, mma.cuh): a padding or swizzle gone wrong shows here, not
# only as time on a GPU
banks_clean "" "$tmp/k.banks" 'k_attn_fa_fwd<' 'k_attn_dkv_fa<' 'k_attn_dq_fa<' 'k_attn_fwd_wg<' 'k_attn_dkv_wg<' \
  'k_attn_dq_wg<'

# the kernel timer of bench/gpu.sh runs (its figures mean nothing here):
# attention 10, a linear 1, a linear's weight and bias gradients two ways 2,
# the LM head's three products staged, on padded
# rows, direct and with the vocabulary rounded to 128 12, cross entropy and copies 5, LayerNorm at two widths
# with both kernels 8, column sums at two widths with both kernels 4, and the
# host's comparison of attention's choice on one thread and threaded 2
if "$EMU/bench_kernels" --small >"$tmp/bk.out" 2>&1 && [ "$(grep -c ' ms ' "$tmp/bk.out")" -eq 47 ] &&
   grep -q "linear dW + db .* one product  " "$tmp/bk.out"; then ok
  echo "cuda (emulated): bench_kernels --small times $(grep -c ' ms ' "$tmp/bk.out") calls"
else bad "bench_kernels --small"; cat "$tmp/bk.out"; fi
# --attention: attention alone (what bench/gpu_ncu_attention.sh profiles),
# forward, backward, backward with the forward again, and the backward's
# dq and dk, dv each alone, at both shapes
if WEFT_ATTN=fa "$EMU/bench_kernels" --attention --small >"$tmp/ba.out" 2>&1 &&
   [ "$(grep -c ' ms ' "$tmp/ba.out")" -eq 10 ] && [ "$(grep -c '^attention backward ' "$tmp/ba.out")" -eq 2 ] &&
   [ "$(grep -c '^  dq alone\|^  dk, dv alone' "$tmp/ba.out")" -eq 4 ] &&
   ! grep -q "^linear\|^lm head" "$tmp/ba.out"; then ok
  echo "cuda (emulated): bench_kernels --attention --small times $(grep -c ' ms ' "$tmp/ba.out") calls, attention alone"
else bad "bench_kernels --attention --small"; cat "$tmp/ba.out"; fi

if sh tests/cuda/plans.sh "$WEFT" "$EMU" "cuda (emulated)" 1e-5; then ok; else bad "the example plans on the emulated GPU"; fi

fi

# ---- the second half: the executor's runs -------------------------------------------------
if [ "$PART" != kernels ]; then
# the independent PyTorch GPT-2 (tests/reference), weft on the emulated GPU
if BACKEND=cuda WEFT_PLUGIN_DIR=$EMU sh tests/reference/run.sh "$WEFT" >"$tmp/ref.out" 2>&1; then ok
  sed 's/^reference:/cuda (emulated): reference:/' "$tmp/ref.out"
else bad "tests/reference with --backend cuda"; cat "$tmp/ref.out"; fi

export WEFT_PLUGIN_DIR=$EMU
GPT="--set layers=2 --set hidden=64 --set heads=4 --set seq=16 --set vocab=256 --set batch=8"
MEG="--set layers=4 --set hidden=64 --set heads=4 --set seq=16 --set vocab=128 --set global_batch=8 --set micro_batch=2"
# The attention's backward reads the log-sum-exp its forward kept and the
# forward's result: it launches no pass of the forward (MODE 1 of
# k_attn_fwd, k_attn_fwd_tc; the forward's own launches are MODE 0 and
# k_attn_fa_fwd), one k_attn_dsum per k_attn_dq. Kernels as
# the emulation counts them (WEFT_CUDA_EMU_LAUNCHES), without --check (whose
# plan-free reference keeps nothing).
attn_launches() {
  name=$1; shift
  rm -f "$tmp/l.txt"
  if WEFT_CUDA_EMU_LAUNCHES=$tmp/l.txt "$WEFT" run "$@" --backend cuda >/dev/null 2>"$tmp/e"; then
    fwd=$(awk '($2 ~ /^k_attn_fwd/ && /, 0>$/) || $2 ~ /^k_attn_fa_fwd/ {n += $1} END {print n + 0}' "$tmp/l.txt")
    again=$(awk '$2 ~ /^k_attn_fwd/ && /, 1>$/ {n += $1} END {print n + 0}' "$tmp/l.txt")
    dsum=$(awk '$2 ~ /^k_attn_dsum/ {n += $1} END {print n + 0}' "$tmp/l.txt")
    dq=$(awk '$2 ~ /^k_attn_dq/ {n += $1} END {print n + 0}' "$tmp/l.txt")
    if [ "$again" -eq 0 ] && [ "$dsum" -gt 0 ] && [ "$dsum" -eq "$dq" ]; then ok
      echo "cuda (emulated): $name: attention launches: forward $fwd, backward $dq (k_attn_dsum, dk/dv, dq), the forward in the backward $again"
    else bad "$name: attention launches: forward $fwd, the forward in the backward $again, dsum $dsum, dq $dq"; cat "$tmp/l.txt"; fi
  else bad "$name: weft run $* --backend cuda"; cat "$tmp/e"; fi
}
attn_launches "gpt2 single, f32" examples/gpt2.plan $GPT --steps 2
attn_launches "megatron bf16 tp2 pp2 dp2 (tensor cores)" examples/gpt_megatron.plan $MEG --set hidden=128 --set dtype=bf16 --steps 2
attn_launches "megatron interleaved, full recompute" examples/gpt_megatron.plan $MEG --set interleave=2 \
  --set 'recompute="full"' --steps 2
attn_launches "llama cp2 tp2 pp2 (grouped queries, parts of the sequence)" examples/llama_megatron.plan \
  --set layers=4 --set hidden=64 --set heads=4 --set kv_heads=2 --set ffn=96 --set seq=16 --set vocab=128 \
  --set global_batch=8 --set micro_batch=2 --set cp=2 --set dp=1 --steps 2
# The choice among attention's kernels (attention_pick.cu): WEFT_ATTN=auto:W
# times the ways W against the plugin's kernels the first time a shape of
# heads runs on a device, compares their results with the plugin's, and
# keeps the fastest that agrees, one line each on stderr; the run still
# matches one device. WEFT_ATTN_TOL=0 turns away a way whose results differ
# at all (the kernels on CUDA cores round otherwise than the mma.sync
# ones); --deterministic, and the default here (no cuDNN, small heads),
# time nothing; a WEFT_ATTN of no meaning is said, and the default runs;
# weft backends says which kernels run attention; work that hangs before
# the first call is waited for no longer than --timeout, once, and the run
# then ends at its --timeout.
MB="examples/gpt_megatron.plan $MEG --set hidden=128 --set dtype=bf16 --steps 2"
if WEFT_ATTN=auto:wmma,core "$WEFT" run $MB --backend cuda --check >"$tmp/t1.out" 2>"$tmp/t1.err" &&
   WEFT_ATTN=auto:core WEFT_ATTN_TOL=0 "$WEFT" run $MB --backend cuda >/dev/null 2>"$tmp/t2.err" &&
   WEFT_ATTN=auto:wmma,core "$WEFT" run $MB --backend cuda --deterministic >/dev/null 2>"$tmp/t3.err" &&
   "$WEFT" run $MB --backend cuda >/dev/null 2>"$tmp/t4.err" &&
   WEFT_ATTN=fastest "$WEFT" run $MB --backend cuda >/dev/null 2>"$tmp/t5.err" &&
   WEFT_ATTN=auto:wmma,core "$WEFT" backends >"$tmp/t6.out" 2>&1; then
  WEFT_CUDA_EMU_HANG=1 WEFT_ATTN=auto:core "$WEFT" run $MB --backend cuda --steps 1 --timeout 2 >/dev/null 2>"$tmp/t7.err"
  rc7=$?
  f1=$(grep -c "^weft: attention forward, b2 h2 s16 d32 bf16 causal: fa [0-9.]* ms; wmma [0-9.]* ms, rel err [0-9.e+-]*, worst element [0-9.e+-]* of its bound; core [0-9.]* ms, rel err [0-9.e+-]*, worst element [0-9.e+-]* of its bound: [a-z]* runs them (tolerance 1e-02)$" "$tmp/t1.err")
  b1=$(grep -c "^weft: attention backward, b2 h2 s16 d32 bf16 causal: fa .*: [a-z]* runs them" "$tmp/t1.err")
  no=$(grep -c "^weft: attention backward, .* core [0-9.]* ms, rel err [0-9.e+-]*, worst element [0-9.e+inf-]* of its bound, over the tolerance: fa runs them (tolerance 0e+00)$" "$tmp/t2.err")
  # a pass that spent a tenth of a second or more choosing says on what
  # (heads of 256 positions: 0.9 s here, so that a machine several times
  # faster still passes the tenth); its total is the step's
  WEFT_ATTN=auto:wmma,core "$WEFT" run $MB --set seq=256 --steps 1 --backend cuda >"$tmp/t8.out" 2>"$tmp/t8.err"
  c1=$(awk '/^step 1 / && match($0, /\(([0-9.]+) s of it choosing/) { s = substr($0, RSTART + 1); sub(/ s of.*/, "", s); print s; exit }' "$tmp/t8.out")
  l1=$(grep "^weft: choosing kernels took [0-9.]* s of the pass: products [0-9.]* s, attention [0-9.]* s, cuDNN's plans apart from attention's timing [0-9.]* s$" "$tmp/t8.err" | awk '{print $5}')
  said_ok=$(awk -v c="${c1:-0}" -v l="${l1:-none}" 'BEGIN { print ((c >= 0.1 && l == c) ? 1 : 0) }')
  if [ "$f1" -ge 1 ] && [ "$b1" -ge 1 ] && grep -q ": match$" "$tmp/t1.out" && [ "$no" -ge 1 ] && [ "$said_ok" = 1 ] &&
     ! grep -q "weft: attention" "$tmp/t3.err" && ! grep -q "weft: attention" "$tmp/t4.err" &&
     grep -q "WEFT_ATTN=fastest is none of auto" "$tmp/t5.err" &&
     grep -q "; attention: the plugin's kernels, wmma, core timed against them for heads of every size (WEFT_ATTN=auto:wmma,core)$" "$tmp/t6.out" &&
     [ $rc7 -eq 2 ] && [ "$(grep -c "the work before it did not end within 2 s; nothing is timed, fa runs them$" "$tmp/t7.err")" -eq 1 ] &&
     grep -q "did not finish within 2 s (--timeout)" "$tmp/t7.err"; then ok
    echo "cuda (emulated): attention's kernels chosen by time: $(grep -m1 '^weft: attention backward' "$tmp/t1.err" | sed 's/^weft: //'); --check $(grep -o 'losses within [^,]*' "$tmp/t1.out")"
    echo "cuda (emulated): heads of 256 positions: $(sed 's/^weft: //' "$tmp/t8.err" | grep '^choosing kernels took')"
  else bad "attention's kernels chosen by time: $f1 forward lines, $b1 backward, $no turned away, step 1 chose for ${c1:-?} s, said ${l1:-nothing}"; cat "$tmp/t1.err" "$tmp/t2.err" "$tmp/t3.err" "$tmp/t4.err" "$tmp/t5.err" "$tmp/t7.err" "$tmp/t8.err"; fi
else bad "WEFT_ATTN=auto:...: weft run"; cat "$tmp/t1.err" "$tmp/t2.err" "$tmp/t3.err" "$tmp/t4.err" "$tmp/t5.err" 2>/dev/null; fi
# The mma.sync backward with dq summed by atomics in the dk/dv kernel
# (WEFT_ATTN=fa-atomic; attention_fa_bwd.cu): its kernels against the
# CPU's (test_kernels --attention), Megatron bf16 and Llama with grouped
# queries and parts of the sequence (cp2) matching one device with dq
# stored from the f32 sums (k_attn_dq_store) and no dq kernel of its own;
# --deterministic leaves it for the kernels without atomics; auto:fa-atomic
# times it against them.
LL="examples/llama_megatron.plan --set layers=4 --set hidden=128 --set heads=4 --set kv_heads=2 --set ffn=96 --set seq=16 --set vocab=128 --set global_batch=8 --set micro_batch=2 --set cp=2 --set dp=1 --set dtype=bf16 --steps 2"
fa_atomic_launches() { # FILE: "stores dq-kernels"
  awk '$2 ~ /^k_attn_dq_store/ {s += $1} $2 ~ /^k_attn_dq_fa/ {q += $1} END {print s + 0, q + 0}' "$1"
}
rm -f "$tmp/fa1.l" "$tmp/fa2.l" "$tmp/fa3.l"
if WEFT_ATTN=fa-atomic WEFT_CUDA_EMU_LAUNCHES=$tmp/fa0.l "$EMU/test_kernels" --attention >"$tmp/fa0.out" 2>&1 &&
   WEFT_ATTN=fa-atomic WEFT_CUDA_EMU_LAUNCHES=$tmp/fa1.l "$WEFT" run $MB --backend cuda --check >"$tmp/fa1.out" 2>&1 &&
   WEFT_ATTN=fa-atomic WEFT_CUDA_EMU_LAUNCHES=$tmp/fa2.l "$WEFT" run $LL --backend cuda --check >"$tmp/fa2.out" 2>&1 &&
   WEFT_ATTN=fa-atomic WEFT_CUDA_EMU_LAUNCHES=$tmp/fa3.l "$WEFT" run $MB --backend cuda --deterministic >"$tmp/fa3.out" 2>&1 &&
   WEFT_ATTN=auto:fa-atomic "$WEFT" run $MB --backend cuda >/dev/null 2>"$tmp/fa4.err"; then
  set -- $(fa_atomic_launches "$tmp/fa0.l"); k0=$1
  set -- $(fa_atomic_launches "$tmp/fa1.l"); s1=$1 q1=$2
  set -- $(fa_atomic_launches "$tmp/fa2.l"); s2=$1 q2=$2
  set -- $(fa_atomic_launches "$tmp/fa3.l"); s3=$1 q3=$2
  t4=$(grep -c "^weft: attention backward, b2 h2 s16 d32 bf16 causal: fa [0-9.]* ms; fa-atomic [0-9.]* ms, rel err [0-9.e+-]*, worst element [0-9.e+-]* of its bound: fa[-a-z]* runs them (tolerance 1e-02)$" "$tmp/fa4.err")
  if [ "$k0" -gt 0 ] && [ "$s1" -gt 0 ] && [ "$q1" -eq 0 ] && [ "$s2" -gt 0 ] && [ "$q2" -eq 0 ] &&
     [ "$s3" -eq 0 ] && [ "$q3" -gt 0 ] && [ "$t4" -ge 1 ] &&
     grep -q ": match$" "$tmp/fa1.out" && grep -q ": match$" "$tmp/fa2.out"; then ok
    echo "cuda (emulated): attention backward with dq by atomics: $(tail -1 "$tmp/fa0.out" | sed 's/^test_kernels: //') ($k0 calls took it); megatron bf16 $s1 and llama cp2 $s2 calls, --check $(grep -o 'losses within [^,]*' "$tmp/fa1.out"), $(grep -o 'losses within [^,]*' "$tmp/fa2.out"); --deterministic none; timed: $(grep -m1 '^weft: attention backward' "$tmp/fa4.err" | sed 's/^weft: attention backward, [^:]*: //')"
  else bad "attention backward with dq by atomics: test_kernels $k0 calls, megatron $s1/$q1, llama $s2/$q2, deterministic $s3/$q3, timed lines $t4"
    grep -v " ok$" "$tmp/fa0.out"; tail -n 3 "$tmp/fa1.out" "$tmp/fa2.out"; cat "$tmp/fa4.err"; fi
else bad "WEFT_ATTN=fa-atomic"; grep -v " ok$" "$tmp/fa0.out"; tail -n 5 "$tmp/fa1.out" "$tmp/fa2.out" "$tmp/fa3.out" "$tmp/fa4.err" 2>/dev/null; fi
# The mma.sync backward with dq from a stored dS (WEFT_ATTN=fa-ds;
# attention_fa_bwd.cu): its kernels against the CPU's (test_kernels
# --attention), Megatron bf16 (its batch of 2 in two parts: the buffer
# holds one) and Llama with grouped queries matching one device, dq from
# k_attn_dq_ds and none from fa's dq kernel; it has no atomics, so it runs
# under --deterministic too, and two runs there give the same losses to
# the last digit; auto:fa-ds times it against fa.
L1="examples/llama_megatron.plan --set layers=4 --set hidden=128 --set heads=4 --set kv_heads=2 --set ffn=96 --set seq=16 --set vocab=128 --set global_batch=8 --set micro_batch=2 --set cp=1 --set dp=1 --set dtype=bf16 --steps 2"
fa_ds_launches() { # FILE: "dq-from-dS dq-kernels"
  awk '$2 ~ /^k_attn_dq_ds/ {s += $1} $2 ~ /^k_attn_dq_fa/ {q += $1} END {print s + 0, q + 0}' "$1"
}
rm -f "$tmp/ds1.l" "$tmp/ds2.l" "$tmp/ds3.l"
if WEFT_ATTN=fa-ds WEFT_CUDA_EMU_LAUNCHES=$tmp/ds0.l WEFT_CUDA_EMU_BANKS=$tmp/ds0.banks "$EMU/test_kernels" --attention \
     >"$tmp/ds0.out" 2>&1 &&
   WEFT_ATTN=fa-ds WEFT_CUDA_EMU_LAUNCHES=$tmp/ds1.l "$WEFT" run $MB --backend cuda --check >"$tmp/ds1.out" 2>&1 &&
   WEFT_ATTN=fa-ds WEFT_CUDA_EMU_LAUNCHES=$tmp/ds2.l "$WEFT" run $L1 --backend cuda --check >"$tmp/ds2.out" 2>&1 &&
   WEFT_ATTN=fa-ds WEFT_CUDA_EMU_LAUNCHES=$tmp/ds3.l "$WEFT" run $MB --backend cuda --deterministic --json >"$tmp/ds3.json" 2>&1 &&
   WEFT_ATTN=fa-ds "$WEFT" run $MB --backend cuda --deterministic --json >"$tmp/ds4.json" 2>&1 &&
   WEFT_ATTN=auto:fa-ds "$WEFT" run $MB --backend cuda >/dev/null 2>"$tmp/ds5.err"; then
  set -- $(fa_ds_launches "$tmp/ds0.l"); k0=$1
  set -- $(fa_ds_launches "$tmp/ds1.l"); s1=$1 q1=$2
  set -- $(fa_ds_launches "$tmp/ds2.l"); s2=$1 q2=$2
  set -- $(fa_ds_launches "$tmp/ds3.l"); s3=$1 q3=$2
  l3=$(python3 -c 'import json,sys; print(" ".join(repr(s["loss"]) for s in json.load(open(sys.argv[1]))["steps"]))' "$tmp/ds3.json")
  l4=$(python3 -c 'import json,sys; print(" ".join(repr(s["loss"]) for s in json.load(open(sys.argv[1]))["steps"]))' "$tmp/ds4.json")
  t5=$(grep -c "^weft: attention backward, b2 h2 s16 d32 bf16 causal: fa [0-9.]* ms; fa-ds [0-9.]* ms, rel err [0-9.e+-]*, worst element [0-9.e+-]* of its bound: fa[-a-z]* runs them (tolerance 1e-02)$" "$tmp/ds5.err")
  if [ "$k0" -gt 0 ] && [ "$s1" -gt 0 ] && [ "$q1" -eq 0 ] && [ "$s2" -gt 0 ] && [ "$q2" -eq 0 ] &&
     [ "$s3" -gt 0 ] && [ "$q3" -eq 0 ] && [ -n "$l3" ] && [ "$l3" = "$l4" ] && [ "$t5" -ge 1 ] &&
     grep -q ": match$" "$tmp/ds1.out" && grep -q ": match$" "$tmp/ds2.out"; then ok
    echo "cuda (emulated): attention backward with dq from a stored dS: $(tail -1 "$tmp/ds0.out" | sed 's/^test_kernels: //') ($k0 calls took it); megatron bf16 $s1 and llama (grouped queries) $s2 calls, --check $(grep -o 'losses within [^,]*' "$tmp/ds1.out"), $(grep -o 'losses within [^,]*' "$tmp/ds2.out"); --deterministic $s3 calls, the same losses twice; timed: $(grep -m1 '^weft: attention backward' "$tmp/ds5.err" | sed 's/^weft: attention backward, [^:]*: //')"
  else bad "attention backward with dq from a stored dS: test_kernels $k0 calls, megatron $s1/$q1, llama $s2/$q2, deterministic $s3/$q3 ($l3 | $l4), timed lines $t5"
    grep -v " ok$" "$tmp/ds0.out"; tail -n 3 "$tmp/ds1.out" "$tmp/ds2.out"; cat "$tmp/ds5.err"; fi
else bad "WEFT_ATTN=fa-ds"; grep -v " ok$" "$tmp/ds0.out"; tail -n 5 "$tmp/ds1.out" "$tmp/ds2.out" "$tmp/ds3.json" "$tmp/ds5.err" 2>/dev/null; fi
banks_clean "with fa-ds" "$tmp/ds0.banks" 'k_attn_dq_ds<bf16, 4, 2>' 'k_attn_dq_ds<bf16, 8, 2>' 'k_attn_dq_ds<f16, 4, 2>'
# A way within the tolerance with an element over its bound is judged by
# core's sums in f32 (attention_pick.cu): WEFT_CUDA_EMU_SPOIL=ref moves one
# element of the reference's results as read back, and fa-atomic (the same
# bits as fa here) is taken as no further from core's sums than twice the
# reference; WEFT_CUDA_EMU_SPOIL=way moves the other way's, which is
# turned away.
if WEFT_CUDA_EMU_SPOIL=ref WEFT_ATTN=auto:fa-atomic "$WEFT" run $MB --backend cuda --steps 1 >/dev/null 2>"$tmp/j1.err" &&
   WEFT_CUDA_EMU_SPOIL=way WEFT_ATTN=auto:fa-atomic "$WEFT" run $MB --backend cuda --steps 1 >/dev/null 2>"$tmp/j2.err"; then
  j1=$(grep -c "^weft: attention backward, b2 h2 s16 d32 bf16 causal: fa [0-9.]* ms; fa-atomic [0-9.]* ms, rel err [0-9.e+-]*, worst element [0-9.e+-]* of its bound (from core's f32 sums: fa's worst element [0-9.e+-]* of its bound, rel err [0-9.e+-]*; fa-atomic's [0-9.e+-]*, rel err [0-9.e+-]*): fa[-a-z]* runs them (tolerance 1e-02)$" "$tmp/j1.err")
  j2=$(grep -c "^weft: attention backward, b2 h2 s16 d32 bf16 causal: fa [0-9.]* ms; fa-atomic [0-9.]* ms, .*fa-atomic's [0-9.e+-]*, rel err [0-9.e+-]*), further than twice the reference from the sums in f32: fa runs them (tolerance 1e-02)$" "$tmp/j2.err")
  if [ "$j1" -ge 1 ] && [ "$j2" -ge 1 ]; then ok
    echo "cuda (emulated): attention's ways judged by core's f32 sums: $(grep -m1 -o '(from core.*' "$tmp/j1.err")"
  else bad "attention's ways judged by core's sums: $j1 taken, $j2 turned away"; cat "$tmp/j1.err" "$tmp/j2.err"; fi
else bad "WEFT_CUDA_EMU_SPOIL: weft run"; cat "$tmp/j1.err" "$tmp/j2.err" 2>/dev/null; fi
# Attention on Hopper's warpgroup products as ways of their own (fa-wg,
# forward and backward, and fa-wgp, its backward pipelined;
# attention_wg.cu; heads of 64): timed against fa where asked (the same
# bits as fa's on the emulation), and named alone it runs its kernels,
# each run matching one device; a warpgroup product whose self-check fails
# (WEFT_CUDA_EMU_SPOIL=wg: the host's sums moved) is said, and its kernels
# never run; under WEFT_ATTN_WG=off nothing of them runs, not even the
# self-check (a GPU where one faults), and each place that would take them
# says why not.
WG="examples/gpt_megatron.plan $MEG --set hidden=128 --set heads=2 --set dtype=bf16 --steps 2"
if WEFT_ATTN=auto:fa-wg,fa-wgp "$WEFT" run $WG --backend cuda --check >"$tmp/wg1.out" 2>"$tmp/wg1.err" &&
   WEFT_ATTN=fa-wg WEFT_CUDA_EMU_LAUNCHES=$tmp/wg2.l "$WEFT" run $WG --backend cuda --check >"$tmp/wg2.out" 2>&1 &&
   WEFT_CUDA_EMU_SPOIL=wg WEFT_ATTN=fa-wg WEFT_CUDA_EMU_LAUNCHES=$tmp/wg3.l "$WEFT" run $WG --backend cuda --check \
     >"$tmp/wg3.out" 2>"$tmp/wg3.err" &&
   WEFT_ATTN_WG=off WEFT_ATTN=auto:fa-wg,fa-wgp WEFT_ATTN_FA_BWD_SHAPE=wg WEFT_ATTN_FA_SHAPE=wg \
     WEFT_CUDA_EMU_LAUNCHES=$tmp/wg4.l "$WEFT" run $WG --backend cuda --check >"$tmp/wg4.out" 2>"$tmp/wg4.err" &&
   WEFT_ATTN_WG=off "$WEFT" backends --kernels >"$tmp/wg5.out" 2>&1; then
  wg2=$(awk '$2 ~ /^k_attn_(dkv|dq)_wg/ {n += $1} END {print n + 0}' "$tmp/wg2.l")
  wg3=$(awk '$2 ~ /^k_attn_(dkv|dq|fwd)_wg/ {n += $1} END {print n + 0}' "$tmp/wg3.l")
  wg4=$(awk '$2 ~ /_wg|wgmma/ {n += $1} END {print n + 0}' "$tmp/wg4.l")
  fw2=$(awk '$2 ~ /^k_attn_fwd_wg/ {n += $1} END {print n + 0}' "$tmp/wg2.l")
  off=$(grep -c "^weft: WEFT_ATTN_FA_\(BWD_\)\?SHAPE=wg: the warpgroup kernels do not run here (the switch WEFT_ATTN_WG=off keeps them out): \(2,3\|the default shape\) runs$" "$tmp/wg4.err")
  if grep -q "^weft: attention forward, b2 h1 s16 d64 bf16 causal: fa [0-9.]* ms; fa-wg [0-9.]* ms, rel err [0-9.e+-]*, worst element [0-9.e+-]* of its bound: fa[-a-z]* runs them (tolerance 1e-02)$" "$tmp/wg1.err" &&
     grep -q "^weft: attention backward, b2 h1 s16 d64 bf16 causal: fa [0-9.]* ms; fa-wg [0-9.]* ms, rel err 0.0e+00, worst element 0 of its bound; fa-wgp [0-9.]* ms, rel err 0.0e+00, worst element 0 of its bound: fa[-a-z]* runs them (tolerance 1e-02)$" "$tmp/wg1.err" &&
     grep -q "match$" "$tmp/wg1.out" && grep -q "match$" "$tmp/wg2.out" && grep -q "match$" "$tmp/wg3.out" &&
     [ "$wg2" -gt 0 ] && [ "$fw2" -gt 0 ] && [ "$wg3" = 0 ] && [ "$wg4" = 0 ] && [ "$off" = 2 ] &&
     grep -q "match$" "$tmp/wg4.out" && ! grep -q "fa-wg" "$tmp/wg4.err" &&
     grep -q "; attention: the plugin's kernels, cudnn, fa-ds timed against them for heads of 2^32 flops and more (fa-wg and fa-wgp kept out: the switch WEFT_ATTN_WG=off keeps them out)$" "$tmp/wg5.out" &&
     grep -q "^weft: CUDA device 0: the warpgroup product's self-check (wgmma.cuh, bf16) gave other sums than the host's: its kernels (fa-wg) do not run here$" "$tmp/wg3.err"; then ok
    echo "cuda (emulated): fa-wg, fa-wgp: timed against fa (rel err 0), fa-wg named alone $fw2 launches of its forward and $wg2 of its backward's, none after a failed self-check, none under WEFT_ATTN_WG=off"
  else bad "fa-wg: its lines, the runs' match, $fw2, $wg2, $wg3 and $wg4 launches of its kernels, the self-check's refusal, $off lines of WEFT_ATTN_WG=off"
    cat "$tmp/wg1.err" "$tmp/wg3.err" "$tmp/wg4.err"; grep "runs on" "$tmp/wg5.out"; tail -n 2 "$tmp/wg1.out" "$tmp/wg2.out" "$tmp/wg3.out" "$tmp/wg4.out"; fi
else bad "WEFT_ATTN=fa-wg: weft run"; tail -n 5 "$tmp/wg1.err" "$tmp/wg2.out" "$tmp/wg3.err" "$tmp/wg4.err" 2>/dev/null; fi
# Other GPUs than the emulation's own (compute capability 9.0, 227 KiB of
# shared memory a block), as WEFT_CUDA_EMU_CC makes it: on 8.6 (99 KiB a
# block, as the consumer Ampere GPUs have, and at 8.9 the L4 and L40S) the
# emulation's own checks and every kernel against the CPU's, the warpgroup
# ones said not to run and none of them launched; heads of 128 in the
# backward's one-stage kernels (two stages take 103 KiB; on 9.0 too under
# WEFT_ATTN_FA_STAGES=1, as tests/gpu/run.sh checks them); GPT in bf16 with
# heads of 128 (dq by atomics too) and of 64 matching one device with fa-wg named, which says
# it does not run there and launches nothing; weft backends says why; on
# 8.0 (an A100) the same run of heads of 64; on 7.5 weft run and weft
# backends say the GPU is unsupported (exit 2); a capability the emulation
# does not know is said.
if WEFT_CUDA_EMU_CC=8.6 "$EMU/test_emu" >"$tmp/cc1.out" 2>&1 &&
   WEFT_CUDA_EMU_CC=8.6 WEFT_CUDA_EMU_LAUNCHES=$tmp/cc2.l WEFT_CUDA_EMU_BANKS=$tmp/cc2.banks "$EMU/test_kernels" \
     >"$tmp/cc2.out" 2>&1 &&
   WEFT_CUDA_EMU_CC=8.6 WEFT_ATTN=fa-wg WEFT_CUDA_EMU_LAUNCHES=$tmp/cc3.l "$WEFT" run examples/gpt_megatron.plan $MEG \
     --set hidden=256 --set heads=2 --set dtype=bf16 --steps 2 --backend cuda --check >"$tmp/cc3.out" 2>"$tmp/cc3.err" &&
   WEFT_CUDA_EMU_CC=8.6 WEFT_ATTN=fa-wg WEFT_CUDA_EMU_LAUNCHES=$tmp/cc4.l "$WEFT" run $WG --backend cuda --check \
     >"$tmp/cc4.out" 2>"$tmp/cc4.err" &&
   WEFT_CUDA_EMU_CC=8.0 WEFT_ATTN=auto:fa-wg,fa-wgp WEFT_CUDA_EMU_LAUNCHES=$tmp/cc5.l "$WEFT" run $WG --backend cuda --check \
     >"$tmp/cc5.out" 2>"$tmp/cc5.err" &&
   WEFT_CUDA_EMU_CC=8.6 "$WEFT" backends >"$tmp/cc6.out" 2>&1 &&
   WEFT_ATTN_FA_STAGES=1 WEFT_CUDA_EMU_LAUNCHES=$tmp/cc10.l "$WEFT" run examples/gpt_megatron.plan $MEG \
     --set hidden=256 --set heads=2 --set dtype=bf16 --steps 2 --backend cuda --check >"$tmp/cc10.out" 2>&1 &&
   WEFT_CUDA_EMU_CC=8.6 WEFT_ATTN=fa-atomic WEFT_CUDA_EMU_LAUNCHES=$tmp/cc11.l "$WEFT" run examples/gpt_megatron.plan \
     $MEG --set hidden=256 --set heads=2 --set dtype=bf16 --steps 2 --backend cuda --check >"$tmp/cc11.out" 2>&1; then
  wgl=$(cat "$tmp/cc2.l" "$tmp/cc3.l" "$tmp/cc4.l" "$tmp/cc5.l" | awk '$2 ~ /_wg|wgmma/ {n += $1} END {print n + 0}')
  one=$(awk '/ k_attn_(dkv_fa<bf16, 8, false, 32, 2, false|dq_fa<bf16, 8, false, 2), 1>$/ {n += $1} END {print n + 0}' "$tmp/cc3.l")
  onek=$(awk '/ k_attn_(dkv|dq)_fa<(bf16|f16), 8, .*, 1>$/ {n += $1} END {print n + 0}' "$tmp/cc2.l")
  one9=$(awk '/ k_attn_(dkv|dq)_fa<bf16, 8, .*, 1>$/ {n += $1} END {print n + 0}' "$tmp/cc10.l")
  onea=$(awk '/ k_attn_dkv_fa<bf16, 8, false, 32, 2, true, 1>$/ {n += $1} END {print n + 0}' "$tmp/cc11.l")
  said="its kernels do not run here (they run on GPUs of compute capability 9.0 alone): the plugin's others run attention"
  if grep -q "^test_emu: [0-9]* checks, 0 failed$" "$tmp/cc1.out" && grep -q "^test_kernels: [0-9]* checks, 0 failed$" "$tmp/cc2.out" &&
     [ "$(grep -c "^kernel wgmma m64n64k16 [bf16]*: not run here (compute capability 9.0 alone, .*): not checked$" "$tmp/cc2.out")" = 2 ] &&
     grep -q "^causal_attention (dh 64), WEFT_ATTN_FA_BWD_SHAPE=wg: its kernels do not run here" "$tmp/cc2.out" &&
     [ "$wgl" = 0 ] && [ "$one" -gt 0 ] && [ "$onek" -gt 0 ] && [ "$one9" = "$one" ] && grep -q "match$" "$tmp/cc10.out" &&
     [ "$onea" -gt 0 ] && grep -q "match$" "$tmp/cc11.out" &&
     grep -q "match$" "$tmp/cc3.out" && grep -q "match$" "$tmp/cc4.out" && grep -q "match$" "$tmp/cc5.out" &&
     grep -q "^weft: WEFT_ATTN=fa-wg: $said$" "$tmp/cc3.err" && ! grep -q "fa-wg" "$tmp/cc5.err" &&
     grep -q "(compute capability 8.6), .*; attention: the plugin's kernels, cudnn, fa-ds timed against them for heads of 2^32 flops and more (fa-wg and fa-wgp kept out: they run on GPUs of compute capability 9.0 alone)$" "$tmp/cc6.out"; then ok
    echo "cuda (emulated): on compute capability 8.6 (99 KiB a block) $(sed -n 's/^test_kernels: //p' "$tmp/cc2.out") (the warpgroup kernels not run), heads of 128 in one stage ($one launches in GPT, $onea with dq by atomics; on 9.0 with WEFT_ATTN_FA_STAGES=1, $one9), GPT matching one device with fa-wg named; on 8.0 likewise"
  else bad "compute capability 8.6 and 8.0: the checks, $wgl warpgroup launches, $one, $onek, $one9 and $onea of the one-stage backward, the lines said"
    grep -v " ok$" "$tmp/cc1.out" "$tmp/cc2.out" | tail -5; cat "$tmp/cc3.err" "$tmp/cc5.err"; grep "runs on" "$tmp/cc6.out"
    tail -n 1 "$tmp/cc3.out" "$tmp/cc4.out" "$tmp/cc5.out" "$tmp/cc10.out" "$tmp/cc11.out"; fi
else bad "compute capability 8.6 and 8.0 (WEFT_CUDA_EMU_CC)"; tail -n 5 "$tmp/cc1.out" "$tmp/cc2.out" "$tmp/cc3.err" "$tmp/cc4.err" "$tmp/cc5.err" "$tmp/cc6.out" 2>/dev/null; fi
# the one-stage kernels' ldmatrix on 8.6, without bank conflicts (as on
# 9.0 above)
banks_clean "on 8.6 (99 KiB a block)" "$tmp/cc2.banks" 'k_attn_dkv_fa<bf16, 8, .*, 1>' 'k_attn_dq_fa<bf16, 8, .*, 1>' \
  'k_attn_dkv_fa<f16, 8, .*, 1>' 'k_attn_dq_fa<f16, 8, .*, 1>'
WEFT_CUDA_EMU_CC=7.5 "$WEFT" run examples/mlp.plan --backend cuda --steps 1 >/dev/null 2>"$tmp/cc7.err"
rc=$?
WEFT_CUDA_EMU_CC=7.5 "$WEFT" backends >"$tmp/cc8.out" 2>&1
WEFT_CUDA_EMU_CC=7.1 "$WEFT" run examples/mlp.plan --backend cuda --steps 1 >/dev/null 2>"$tmp/cc9.err"
rc9=$?
unsupported="unsupported GPU: GPU 0 (CPU emulation of a CUDA device) has compute capability 7.5; the CUDA backend is built for 8.0 and later"
if [ $rc -eq 2 ] && grep -q "^weft run: $unsupported$" "$tmp/cc7.err" && grep -q "^ *cannot run: $unsupported$" "$tmp/cc8.out" &&
   [ $rc9 -eq 2 ] && grep -q "^weft run: WEFT_CUDA_EMU_CC=7.1: not a compute capability the emulation knows" "$tmp/cc9.err"; then ok
  echo "cuda (emulated): on compute capability 7.5, weft run exits 2: $(cat "$tmp/cc7.err")"
else bad "compute capability 7.5: weft run (exit $rc) and weft backends; 7.1 (exit $rc9)"; cat "$tmp/cc7.err" "$tmp/cc9.err"; grep "cannot run" "$tmp/cc8.out"; fi
# The steps of a stream that run back to back, and the sums of squares
# of their gradients, are one launch and one more that adds the sums
# (k_msteps, k_msteps_done); WEFT_CUDA_FUSED_STEP=0: three per tensor.
step_launches() {
  name=$1; want=$2; shift 2
  if WEFT_CUDA_FUSED_STEP=0 WEFT_CUDA_EMU_LAUNCHES=$tmp/s0.txt "$WEFT" run "$@" --backend cuda --steps 2 >/dev/null 2>"$tmp/e" &&
     WEFT_CUDA_EMU_LAUNCHES=$tmp/s1.txt "$WEFT" run "$@" --backend cuda --steps 2 >/dev/null 2>>"$tmp/e"; then
    per=$(awk '$2 ~ /^k_(adamw|sgd|sumsq_parts|sumsq_done)/ {n += $1} END {print n / 2}' "$tmp/s0.txt")
    one=$(awk '$2 ~ /^k_msteps/ {n += $1} END {print n / 2}' "$tmp/s1.txt")
    left=$(awk '$2 ~ /^k_(adamw|sgd|sumsq_parts|sumsq_done)/ {n += $1} END {print n + 0}' "$tmp/s1.txt")
    if [ "$one" = "$want" ] && [ "$left" = 0 ] && [ "$per" -gt "$want" ]; then ok
      echo "cuda (emulated): $name: the steps and the norm's sums of squares in $one launches a step (one per tensor: $per)"
    else bad "$name: $one launches of k_msteps a step (want $want), $left of one tensor"; cat "$tmp/s1.txt"; fi
  else bad "$name: weft run $* --backend cuda"; cat "$tmp/e"; fi
}
step_launches "gpt2 bf16 single" 2 bench/gpu/gpt2.plan --plan single $GPT
step_launches "gpt2 bf16 single, --clip" 3 bench/gpu/gpt2.plan --plan single $GPT --clip 0.5
step_launches "gpt2 bf16 tp2" 4 bench/gpu/gpt2.plan --plan tp2 $GPT
# A linear and the GELU after it are one product with cuBLASLt's GELU
# epilogues, forward and backward (fuse_calls in exec.c): no GELU kernel
# is launched, and the losses are those of WEFT_CUDA_FUSE=0's separate
# kernels within bf16's rounding (the fused product does not round the
# GELU's input to 16 bits before it).
gelu_fusion() {
  name=$1; shift
  if WEFT_CUDA_FUSE=0 WEFT_CUDA_EMU_LAUNCHES=$tmp/g0.txt "$WEFT" run "$@" --backend cuda --steps 3 >"$tmp/g0.out" 2>"$tmp/e" &&
     WEFT_CUDA_EMU_LAUNCHES=$tmp/g1.txt "$WEFT" run "$@" --backend cuda --steps 3 >"$tmp/g1.out" 2>>"$tmp/e"; then
    sep=$(awk '$2 ~ /^k_gelu/ {n += $1} END {print n + 0}' "$tmp/g0.txt")
    left=$(awk '$2 ~ /^k_gelu/ {n += $1} END {print n + 0}' "$tmp/g1.txt")
    l0=$(awk '$1 == "step" {l = $4} END {print l}' "$tmp/g0.out")
    l1=$(awk '$1 == "step" {l = $4} END {print l}' "$tmp/g1.out")
    said=$(sed -n 's/.*fused: \([0-9]*\) linear and GELU product.*/\1/p' "$tmp/g1.out")
    if [ "$sep" -gt 0 ] && [ "$left" -eq 0 ] && [ "${said:-0}" -gt 0 ] && ! grep -q "linear and GELU product" "$tmp/g0.out" &&
       awk -v a="$l0" -v b="$l1" 'BEGIN {d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 0.01 * a)}'; then ok
      echo "cuda (emulated): $name: linear and GELU fused ($said products a step, the run's header says): GELU kernels launched $left (separate: $sep); loss at step 3 $l1 (separate: $l0)"
    else bad "$name: GELU kernels launched fused $left, separate $sep; losses $l1 and $l0"; cat "$tmp/g1.txt"; fi
  else bad "$name: weft run $* --backend cuda"; cat "$tmp/e"; fi
}
# three_runs SWITCH P ARGS...: weft run ARGS on the emulation for 3 steps
# with SWITCH (VAR=0) set ($tmp/P0.out, its launches counted in $tmp/P0.txt),
# 3 steps as it is ($tmp/P1.out, $tmp/P1.txt), and 2 steps with --check
# ($tmp/P2.out); stderr in $tmp/e. launched RE FILE: the launches counted of
# kernels whose name matches RE.
three_runs() {
  sw=$1; p=$2; shift 2
  env "$sw" WEFT_CUDA_EMU_LAUNCHES="$tmp/${p}0.txt" "$WEFT" run "$@" --backend cuda --steps 3 >"$tmp/${p}0.out" 2>"$tmp/e" &&
    WEFT_CUDA_EMU_LAUNCHES="$tmp/${p}1.txt" "$WEFT" run "$@" --backend cuda --steps 3 >"$tmp/${p}1.out" 2>>"$tmp/e" &&
    "$WEFT" run "$@" --backend cuda --steps 2 --check >"$tmp/${p}2.out" 2>>"$tmp/e"
}
launched() { awk -v re="$1" '$2 ~ re {n += $1} END {print n + 0}' "$2"; }
# A linear and the residual's add after it are one product, the add's
# other input cuBLASLt's C (fuse_calls in exec.c): no add kernel is
# launched, the run's header says how many, the losses and gradient norms
# are those of WEFT_CUDA_FUSE_RESID=0's separate kernels within TOL (f32's
# rounding; in bf16 the product does not round the linear's result to 16
# bits before the add), and the run matches one device. Under full
# recomputation the linear's result is read again, and nothing fuses.
resid_fusion() {
  name=$1; want=$2; tol=$3; shift 3
  if three_runs WEFT_CUDA_FUSE_RESID=0 q "$@"; then
    sep=$(launched '^k_add<' "$tmp/q0.txt"); left=$(launched '^k_add<' "$tmp/q1.txt")
    l0=$(awk '$1 == "step" {l = $4} END {print l}' "$tmp/q0.out")
    l1=$(awk '$1 == "step" {l = $4} END {print l}' "$tmp/q1.out")
    said=$(sed -n 's/.*, \([0-9]*\) linear and residual product.*/\1/p' "$tmp/q1.out")
    awk '$1 == "step" {print $4, $8}' "$tmp/q0.out" >"$tmp/q0.l"; awk '$1 == "step" {print $4, $8}' "$tmp/q1.out" >"$tmp/q1.l"
    if [ "$want" = none ]; then
      good=$([ "$left" -eq "$sep" ] && [ -z "$said" ] && echo y)
    else
      good=$([ "$sep" -gt 0 ] && [ "$left" -eq 0 ] && [ "${said:-0}" -gt 0 ] && echo y)
    fi
    if [ "$good" = y ] && ! grep -q "linear and residual product" "$tmp/q0.out" && grep -q ": match$" "$tmp/q2.out" &&
       [ "$(wc -l <"$tmp/q1.l")" -eq 3 ] && paste -d ' ' "$tmp/q0.l" "$tmp/q1.l" | awk -v tol="$tol" '
         function off(a, b) { d = a - b; if (d < 0) d = -d; return !(a > 0 && d <= tol * a) }
         off($1, $3) || off($2, $4) { bad = 1 } END { exit bad }'; then ok
      echo "cuda (emulated): $name: linear and residual's add fused (${said:-no} products a step): add kernels launched $left (separate: $sep); losses and norms within $tol of the separate kernels' (step 3: $l1 against $l0); $(grep -o 'losses within [^,]*' "$tmp/q2.out") of one device"
    else bad "$name: add kernels launched fused $left, separate $sep, said ${said:-nothing}; losses $l1 and $l0"; cat "$tmp/q2.out"; fi
  else bad "$name: weft run $* --backend cuda"; cat "$tmp/e"; fi
}
# A linear's weight and bias gradients in one product whose epilogue sums
# the result's gradient's columns (gpu_gemm_dbias; cuBLASLt's BGRADA):
# with one micro-batch, where both are written, no column-sum kernel is
# launched against WEFT_GEMM_DBIAS=0's, the losses are the same within f32
# rounding, and the run matches one device; not under --deterministic.
dbias_fusion() {
  name=$1; shift
  if WEFT_GEMM_DBIAS=0 WEFT_CUDA_EMU_LAUNCHES=$tmp/b0.txt "$WEFT" run "$@" --backend cuda --steps 3 >"$tmp/b0.out" 2>"$tmp/e" &&
     WEFT_CUDA_EMU_LAUNCHES=$tmp/b1.txt "$WEFT" run "$@" --backend cuda --steps 3 >"$tmp/b1.out" 2>>"$tmp/e" &&
     WEFT_CUDA_EMU_LAUNCHES=$tmp/b2.txt "$WEFT" run "$@" --backend cuda --steps 3 --deterministic >/dev/null 2>>"$tmp/e" &&
     "$WEFT" run "$@" --backend cuda --steps 2 --check >"$tmp/b3.out" 2>>"$tmp/e"; then
    sep=$(awk '$2 ~ /^k_colsum_part/ {n += $1} END {print n + 0}' "$tmp/b0.txt")
    left=$(awk '$2 ~ /^k_colsum_part/ {n += $1} END {print n + 0}' "$tmp/b1.txt")
    det=$(awk '$2 ~ /^k_colsum_part/ {n += $1} END {print n + 0}' "$tmp/b2.txt")
    l0=$(awk '$1 == "step" {l = $4} END {print l}' "$tmp/b0.out")
    l1=$(awk '$1 == "step" {l = $4} END {print l}' "$tmp/b1.out")
    if [ "$sep" -gt 0 ] && [ "$left" -eq 0 ] && [ "$det" -eq "$sep" ] && grep -q ": match$" "$tmp/b3.out" &&
       awk -v a="$l0" -v b="$l1" 'BEGIN {d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 1e-5 * a)}'; then ok
      echo "cuda (emulated): $name: weight and bias gradients in one product: column-sum kernels launched $left in 3 steps (separate: $sep; --deterministic: $det); loss at step 3 $l1 (separate: $l0); $(grep -o 'losses within [^,]*' "$tmp/b3.out") of one device"
    else bad "$name: column sums launched $left, separate $sep, deterministic $det; losses $l1 and $l0"; cat "$tmp/b3.out"; fi
  else bad "$name: weft run $* --backend cuda"; cat "$tmp/e"; fi
}
# A backward compute whose gradients are buffers just cleared, untouched
# since, writes them instead of adding to them, and their allocs do not
# clear them (first_writes in exec.c): fewer clearings (gpu_zero, which the
# emulation counts) and the same losses and norms, to the bit, as
# WEFT_CUDA_FIRST_WRITE=0, which clears every gradient and adds to it
# (the bias gradients by the column sums' kernel both times,
# WEFT_GEMM_DBIAS=0: a product that writes them sums in its own order).
first_write() {
  name=$1; shift
  if WEFT_GEMM_DBIAS=0 WEFT_CUDA_FIRST_WRITE=0 WEFT_CUDA_EMU_LAUNCHES=$tmp/z0.txt "$WEFT" run "$@" --backend cuda --steps 3 >"$tmp/z0.out" 2>"$tmp/e" &&
     WEFT_GEMM_DBIAS=0 WEFT_CUDA_EMU_LAUNCHES=$tmp/z1.txt "$WEFT" run "$@" --backend cuda --steps 3 >"$tmp/z1.out" 2>>"$tmp/e"; then
    z0=$(awk '$2 == "gpu_zero" {print $1}' "$tmp/z0.txt"); z1=$(awk '$2 == "gpu_zero" {print $1}' "$tmp/z1.txt")
    awk '$1 == "step" {print $2, $4, $8}' "$tmp/z0.out" >"$tmp/z0.l"; awk '$1 == "step" {print $2, $4, $8}' "$tmp/z1.out" >"$tmp/z1.l"
    if [ "${z1:-0}" -lt "${z0:-0}" ] && [ -s "$tmp/z0.l" ] && cmp -s "$tmp/z0.l" "$tmp/z1.l" &&
       grep -q "fused: .*[0-9] backward computes* writing gradients first" "$tmp/z1.out" &&
       ! grep -q "writing gradients first" "$tmp/z0.out"; then ok
      echo "cuda (emulated): $name: gradients written where just cleared: $z1 clearings in 3 steps and the setup (all added: $z0), the same losses and norms"
    else bad "$name: clearings $z1 against $z0, or other losses"; cat "$tmp/z0.l" "$tmp/z1.l"; fi
  else bad "$name: weft run $* --backend cuda"; cat "$tmp/e"; fi
}
first_write "gpt2 f32 dp" examples/gpt2.plan --plan dp $GPT
first_write "megatron bf16 tp2 pp2 dp2, 2 micro-batches" examples/gpt_megatron.plan $MEG --set dtype=bf16
# Logits whose rows are not 16 bytes (a vocabulary of 257) are laid out
# with padded rows (pad_rows in exec.c): the LM head's products take them
# in place, where WEFT_CUDA_PAD_ROWS=0 stages them (WEFT_GEMM_STAGE_FLOPS=0
# stages the small products of these tests as a GPU does GPT-2's): no
# staging copy is launched, and the run matches one device (--check).
V257="--set layers=2 --set hidden=64 --set heads=4 --set seq=16 --set vocab=257 --set batch=8"
if WEFT_GEMM_STAGE_FLOPS=0 WEFT_CUDA_PAD_ROWS=0 WEFT_CUDA_EMU_LAUNCHES=$tmp/p0.txt "$WEFT" run bench/gpu/gpt2.plan --plan single $V257 \
     --backend cuda --steps 2 >/dev/null 2>"$tmp/e" &&
   WEFT_GEMM_STAGE_FLOPS=0 WEFT_CUDA_EMU_LAUNCHES=$tmp/p1.txt "$WEFT" run bench/gpu/gpt2.plan --plan single $V257 \
     --backend cuda --steps 2 >/dev/null 2>>"$tmp/e" &&
   WEFT_GEMM_STAGE_FLOPS=0 "$WEFT" run examples/gpt2.plan --plan dp $V257 --backend cuda --steps 2 --check >"$tmp/p.out" 2>>"$tmp/e"; then
  c0=$(awk '$2 ~ /^k_copy2d/ {n += $1} END {print n + 0}' "$tmp/p0.txt"); c1=$(awk '$2 ~ /^k_copy2d/ {n += $1} END {print n + 0}' "$tmp/p1.txt")
  if [ "$c0" -gt 0 ] && [ "$c1" -eq 0 ] && grep -q ": match$" "$tmp/p.out"; then ok
    echo "cuda (emulated): logits of 257 columns in padded rows: $c1 staging copies in 2 steps (packed: $c0); gpt2 f32 dp $(grep -o 'losses within [^,]*' "$tmp/p.out") of one device"
  else bad "padded rows: staging copies $c1 (packed $c0)"; cat "$tmp/p.out"; fi
else bad "padded rows: weft run"; cat "$tmp/e"; fi
# A cross entropy's forward writes its logits' gradient over them as it
# takes the loss, and its backward does nothing (loss_in_place in
# exec.c): no k_ce_rows or k_ce_backward launched, less device memory
# where the logits are at the peak (the gradient's buffer is the logits'),
# no more elsewhere (LESS: 1, 0), the same losses and norms as
# WEFT_CUDA_LOSS_IN_PLACE=0's separate kernels (on the emulation a row's
# sums are taken by as many threads either way, so to the bit), and a
# match with one device, padded rows and 2 micro-batches included.
loss_in_place() {
  name=$1; less=$2; shift 2
  if three_runs WEFT_CUDA_LOSS_IN_PLACE=0 c "$@"; then
    sep=$(launched '^k_ce_(rows|backward)' "$tmp/c1.txt")
    one=$(launched '^k_ce_in_place' "$tmp/c1.txt"); was=$(launched '^k_ce_in_place' "$tmp/c0.txt")
    m0=$(sed -n 's/.* \([0-9.]* [KMG]iB\) of device memory.*/\1/p' "$tmp/c0.out"); m1=$(sed -n 's/.* \([0-9.]* [KMG]iB\) of device memory.*/\1/p' "$tmp/c1.out")
    said=$(sed -n 's/.*, \([0-9]*\) loss.* writing the gradient over the logits.*/\1/p' "$tmp/c1.out")
    awk '$1 == "step" {print $2, $4, $8}' "$tmp/c0.out" >"$tmp/c0.l"; awk '$1 == "step" {print $2, $4, $8}' "$tmp/c1.out" >"$tmp/c1.l"
    if [ "$sep" -eq 0 ] && [ "$one" -gt 0 ] && [ "$was" -eq 0 ] && [ "${said:-0}" -gt 0 ] && [ -s "$tmp/c0.l" ] &&
       cmp -s "$tmp/c0.l" "$tmp/c1.l" && awk -v a="$m1" -v b="$m0" -v less="$less" '
         function bytes(q,  u) { split(q, u, " "); return u[1] * (u[2] == "GiB" ? 2^30 : u[2] == "MiB" ? 2^20 : 2^10) }
         BEGIN { exit !(less ? bytes(a) < bytes(b) : bytes(a) <= bytes(b)) }' && ! grep -q "over the logits" "$tmp/c0.out" &&
       grep -q ": match$" "$tmp/c2.out"; then ok
      echo "cuda (emulated): $name: $said loss(es) writing the gradient over the logits: $one launches in 3 steps, none of the separate kernels; $m1 of device memory (separate: $m0); the same losses and norms; $(grep -o 'losses within [^,]*' "$tmp/c2.out") of one device"
    else bad "$name: loss in place: separate kernels $sep, in place $one (off: $was), memory $m1 against $m0, said ${said:-nothing}"; cat "$tmp/c0.l" "$tmp/c1.l" "$tmp/c2.out"; fi
  else bad "$name: weft run $* --backend cuda"; cat "$tmp/e"; fi
}
loss_in_place "gpt2 bf16 single, logits of 257 columns" 1 bench/gpu/gpt2.plan --plan single $V257
loss_in_place "megatron bf16 pp2 dp2, 2 micro-batches, recompute" 0 examples/gpt_megatron.plan $MEG --set dtype=bf16 --set tp=1 \
  --set dp=2 --set 'recompute="full"'
# A residual's backward gives both its inputs the gradient of its result:
# their buffers take that gradient's memory and nothing is launched
# (pass_grads in exec.c): no k_add_backward in 3 steps where
# WEFT_CUDA_PASS_GRADS=0 launches them, no more device memory, the same
# losses and norms to the bit (a copy either way), said, and a match with
# one device, with tensor and pipeline parallelism, 2 micro-batches and
# recomputation included.
pass_grads() {
  name=$1; shift
  if three_runs WEFT_CUDA_PASS_GRADS=0 g "$@"; then
    n0=$(launched '^k_add_backward' "$tmp/g0.txt"); n1=$(launched '^k_add_backward' "$tmp/g1.txt")
    m0=$(sed -n 's/.* \([0-9.]* [KMG]iB\) of device memory.*/\1/p' "$tmp/g0.out"); m1=$(sed -n 's/.* \([0-9.]* [KMG]iB\) of device memory.*/\1/p' "$tmp/g1.out")
    said=$(sed -n 's/.*, \([0-9]*\) residual backwards* passing the gradient through.*/\1/p' "$tmp/g1.out")
    awk '$1 == "step" {print $2, $4, $8}' "$tmp/g0.out" >"$tmp/g0.l"; awk '$1 == "step" {print $2, $4, $8}' "$tmp/g1.out" >"$tmp/g1.l"
    if [ "$n0" -gt 0 ] && [ "$n1" -eq 0 ] && [ "${said:-0}" -gt 0 ] && [ -s "$tmp/g0.l" ] && cmp -s "$tmp/g0.l" "$tmp/g1.l" &&
       awk -v a="$m1" -v b="$m0" '
         function bytes(q,  u) { split(q, u, " "); return u[1] * (u[2] == "GiB" ? 2^30 : u[2] == "MiB" ? 2^20 : 2^10) }
         BEGIN { exit !(bytes(a) <= bytes(b)) }' && ! grep -q "passing the gradient through" "$tmp/g0.out" &&
       grep -q ": match$" "$tmp/g2.out"; then ok
      echo "cuda (emulated): $name: $said residual backward(s) passing the gradient through: no k_add_backward in 3 steps (separate: $n0); $m1 of device memory (separate: $m0); the same losses and norms; $(grep -o 'losses within [^,]*' "$tmp/g2.out") of one device"
    else bad "$name: gradients passed through: k_add_backward $n1 (off: $n0), memory $m1 against $m0, said ${said:-nothing}"; cat "$tmp/g0.l" "$tmp/g1.l" "$tmp/g2.out"; fi
  else bad "$name: weft run $* --backend cuda"; cat "$tmp/e"; fi
}
pass_grads "gpt2 f32 single" examples/gpt2.plan --plan single $GPT
pass_grads "megatron bf16 tp2 pp2 dp2, 2 micro-batches, recompute" examples/gpt_megatron.plan $MEG --set dtype=bf16 \
  --set 'recompute="full"'
# ... and where they could be told apart, not: three adds nested, the
# innermost add's input's gradient added to (by a product's backward)
# before an outer add's input's gradient, in the same memory, is read
# (tests/cuda/nested_adds.plan): two of the three pass, and the losses and
# norms are the same bits as WEFT_CUDA_PASS_GRADS=0's and one device's.
if WEFT_CUDA_PASS_GRADS=0 "$WEFT" run tests/cuda/nested_adds.plan --backend cuda --steps 3 >"$tmp/n0.out" 2>"$tmp/e" &&
   "$WEFT" run tests/cuda/nested_adds.plan --backend cuda --steps 3 >"$tmp/n1.out" 2>>"$tmp/e" &&
   "$WEFT" run tests/cuda/nested_adds.plan --backend cuda --steps 2 --check >"$tmp/n2.out" 2>>"$tmp/e"; then
  awk '$1 == "step" {print $2, $4, $8}' "$tmp/n0.out" >"$tmp/n0.l"; awk '$1 == "step" {print $2, $4, $8}' "$tmp/n1.out" >"$tmp/n1.l"
  said=$(sed -n 's/.*, \([0-9]*\) residual backwards* passing the gradient through.*/\1/p' "$tmp/n1.out")
  if [ "$said" = 2 ] && [ -s "$tmp/n0.l" ] && cmp -s "$tmp/n0.l" "$tmp/n1.l" && grep -q ": match$" "$tmp/n2.out"; then ok
    echo "cuda (emulated): nested residual adds: $said of 3 backwards passing the gradient through, the same losses and norms as none; $(grep -o 'losses within [^,]*' "$tmp/n2.out") of one device"
  else bad "nested residual adds: $said passed"; cat "$tmp/n0.l" "$tmp/n1.l" "$tmp/n2.out"; fi
else bad "nested residual adds: weft run"; cat "$tmp/e"; fi
# --trace on virtual devices: every compute of both devices' programs
# timed on its device's stream (with the loss's separate kernels and the
# residuals' backward: in place, they launch nothing), named as the program names it,
# no overlap on a stream (tests/trace_check.py), with clipping's plan.
# The same run under a profiler's stand-in (nvtx_record.c, where NVTX's
# headers were found): its NVTX ranges are the trace's pieces of work, by
# device and name, inside a range per step (tests/cuda/nvtx_check.py).
TG="examples/gpt2.plan --plan tp2 --set layers=2 --set hidden=64 --set heads=4 --set seq=16 --set vocab=256 --set batch=8"
for d in 0 1; do "$WEFT" lower $TG --device $d --json >"$tmp/tlow$d.json"; done
NVREC=
[ -f "$EMU/libnvtx_record.so" ] && NVREC=$(cd "$EMU" && pwd)/libnvtx_record.so
if env ${NVREC:+NVTX_INJECTION64_PATH=$NVREC} NVTX_RECORD="$tmp/nvtx.txt" WEFT_CUDA_LOSS_IN_PLACE=0 WEFT_CUDA_PASS_GRADS=0 \
     "$WEFT" run $TG --backend cuda --steps 2 --clip 1 --trace "$tmp/tr.json" --json >"$tmp/tr.run" 2>"$tmp/e" &&
   python3 tests/trace_check.py "$tmp/tr.json" "$tmp/tr.run" 2 computes "$tmp/tlow0.json" "$tmp/tlow1.json" >"$tmp/tr.out" &&
   python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))["otherData"]; assert d["backend"] == "cuda" and "CUDA events" in d["times"], d' "$tmp/tr.json"; then ok
  echo "cuda (emulated): --trace, gpt2 tp2 with --clip 1: $(cat "$tmp/tr.out")"
  if [ -z "$NVREC" ]; then echo "cuda (emulated): NVTX ranges: skipped, the plugin was built without NVTX's headers"
  elif python3 tests/cuda/nvtx_check.py "$tmp/nvtx.txt" "$tmp/tr.json" 2 >"$tmp/nv.out"; then ok
    echo "cuda (emulated): NVTX ranges under a profiler, the same run: $(sed 's/^nvtx_check: //' "$tmp/nv.out")"
  else bad "NVTX ranges"; cat "$tmp/nv.out"; fi
else bad "cuda --trace"; cat "$tmp/e" "$tmp/tr.out"; fi
# The plugin's one-time choices of kernels (backends/cuda/choice.h):
# attention's ways timed in step 1 (WEFT_ATTN=auto:wmma,core, bf16 heads)
# are said beside step 1's time and in its --json (setup_s), and a
# profiler sees them as ranges of the category "choosing kernels" inside
# the attention's instructions in step 1; step 2 chooses nothing.
CH="bench/gpu/gpt2.plan --plan tp2 --set layers=2 --set hidden=128 --set heads=4 --set seq=16 --set vocab=256 --set batch=4"
if WEFT_ATTN=auto:wmma,core "$WEFT" run $CH --backend cuda --steps 2 >"$tmp/ch1.out" 2>"$tmp/e" &&
   env ${NVREC:+NVTX_INJECTION64_PATH=$NVREC} NVTX_RECORD="$tmp/nvch.txt" WEFT_ATTN=auto:wmma,core \
     "$WEFT" run $CH --backend cuda --steps 2 --trace "$tmp/ch.json" --json >"$tmp/ch2.run" 2>>"$tmp/e"; then
  said=$(grep -c "s of it choosing kernels, once)$" "$tmp/ch1.out")
  s1=$(grep -c "^step 1 .* s of it choosing kernels, once)$" "$tmp/ch1.out")
  if [ "$said" = 1 ] && [ "$s1" = 1 ] &&
     python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))["steps"]; assert s[0]["setup_s"] > 0 and s[0]["setup_s"] < s[0]["time_s"] and "setup_s" not in s[1], s' "$tmp/ch2.run" &&
     { [ -z "$NVREC" ] || python3 tests/cuda/nvtx_check.py --choices "$tmp/nvch.txt" "$tmp/ch.json" 2 >"$tmp/nvch.out"; }; then ok
    prof=""
    [ -n "$NVREC" ] && prof="; under a profiler, $(sed 's/.*; choices of kernels: //' "$tmp/nvch.out"), the first \"$(grep -m1 '^push .* timing ' "$tmp/nvch.txt" | cut -d' ' -f5-)\""
    echo "cuda (emulated): choices of kernels in step 1: $(grep '^step 1 ' "$tmp/ch1.out" | sed 's/.*  (//; s/)$//')$prof"
  else bad "choices of kernels: $said lines say them"; cat "$tmp/ch1.out" "$tmp/nvch.out" 2>/dev/null; fi
else bad "choices of kernels: weft run"; cat "$tmp/e"; fi

# Evaluation passes (--val-data): the forward alone, the loss that writes
# its gradient over the logits included; the validation losses within
# bf16's rounding of the CPU backend's f32, and the same as
# WEFT_CUDA_LOSS_IN_PLACE=0's.
if python3 examples/tokens.py README.md "$tmp/text.bin" --val "$tmp/val.bin" >/dev/null; then
  EV="--data $tmp/text.bin --val-data $tmp/val.bin --eval-every 2 --eval-steps 2 --steps 4"
  for b in cpu cuda cuda0; do
    if [ $b = cuda0 ]; then WEFT_CUDA_LOSS_IN_PLACE=0 "$WEFT" run bench/gpu/gpt2.plan --plan single $V257 $EV --backend cuda
    else "$WEFT" run bench/gpu/gpt2.plan --plan single $V257 $EV --backend $b; fi 2>&1 | awk '$3 == "val" {print $2, $5}' >"$tmp/val.$b"
  done
  if [ "$(wc -l <"$tmp/val.cuda")" -eq 2 ] && cmp -s "$tmp/val.cuda" "$tmp/val.cuda0" &&
     paste "$tmp/val.cpu" "$tmp/val.cuda" | awk '{d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 0.01 * $2) bad = 1} END {exit bad}'; then ok
    echo "cuda (emulated): evaluation: validation losses at steps 2 and 4 $(awk '{print $2}' "$tmp/val.cuda" | paste -sd' ') (CPU: $(awk '{print $2}' "$tmp/val.cpu" | paste -sd' ')), the same with the loss's kernels apart"
  else bad "evaluation: validation losses"; cat "$tmp/val.cpu" "$tmp/val.cuda" "$tmp/val.cuda0"; fi
else bad "examples/tokens.py README.md"; fi
# --max-memory bounds what the host holds: the CPU backend's devices are
# this machine's memory, the GPU's buffers are the GPU's (which the plugin
# checks against the device's free memory). A plan whose buffers pass the
# budget is refused on the CPU (exit 2) and runs on the GPU.
BIG="--set layers=1 --set hidden=64 --set heads=2 --set seq=128 --set vocab=4096 --set batch=32"
if "$WEFT" run bench/gpu/gpt2.plan --plan single $BIG --steps 1 --max-memory 96MiB >/dev/null 2>"$tmp/m0"; then
  bad "budget: the CPU backend ran a plan over --max-memory"
elif [ $? -eq 2 ] && grep -q "devices' buffers at their peak" "$tmp/m0" &&
     "$WEFT" run bench/gpu/gpt2.plan --plan single $BIG --steps 1 --max-memory 96MiB --backend cuda >"$tmp/m1" 2>&1; then ok
  echo "cuda (emulated): --max-memory 96MiB: the CPU backend refuses (it needs about $(sed -n 's/.*needs about \([0-9.]* [KMG]iB\).*/\1/p' "$tmp/m0")), the GPU runs with $(grep -o "[0-9.]* MiB of device memory" "$tmp/m1")"
else bad "budget: $(cat "$tmp/m0" "$tmp/m1" 2>/dev/null | tail -3)"; fi
gelu_fusion "gpt2 bf16 single" bench/gpu/gpt2.plan --plan single $GPT
gelu_fusion "gpt2 bf16 tp2" bench/gpu/gpt2.plan --plan tp2 $GPT
gelu_fusion "megatron bf16 tp2 pp2 dp2, full recompute" examples/gpt_megatron.plan $MEG --set dtype=bf16 --set 'recompute="full"'
dbias_fusion "gpt2 f32 single" examples/gpt2.plan --plan single $GPT
dbias_fusion "gpt2 f32 tp2" examples/gpt2.plan --plan tp2 $GPT
resid_fusion "gpt2 f32 single" all 1e-5 examples/gpt2.plan --plan single $GPT
resid_fusion "gpt2 bf16 single" all 1e-2 bench/gpu/gpt2.plan --plan single $GPT
resid_fusion "megatron bf16 pp2 dp4, 2 micro-batches" all 1e-2 examples/gpt_megatron.plan $MEG --set dtype=bf16 --set tp=1 --set dp=4
resid_fusion "megatron bf16, full recompute" none 1e-2 examples/gpt_megatron.plan $MEG --set dtype=bf16 --set 'recompute="full"'
# the device's limits
WEFT_CUDA_EMU_MEMORY=1000000 "$WEFT" run examples/gpt2.plan --plan tp2 $GPT --backend cuda >/dev/null 2>"$tmp/e"
rc=$?
if [ $rc -eq 2 ] && grep -q "the plan needs .* free" "$tmp/e"; then ok; echo "cuda (emulated): refused: $(cat "$tmp/e")"
else bad "a plan bigger than the device (exit $rc)"; cat "$tmp/e"; fi
WEFT_CUDA_EMU_DEVICES=0 "$WEFT" run examples/gpt2.plan --plan tp2 $GPT --backend cuda >/dev/null 2>"$tmp/e"
rc=$?
if [ $rc -eq 2 ] && grep -q "no CUDA device" "$tmp/e"; then ok
else bad "no device (exit $rc)"; cat "$tmp/e"; fi
# a window of 12 x 12 tokens with heads of 64: more shared memory than a block has
"$WEFT" run examples/swin.plan --plan single --set image=24 --set window=12 --set embed=64 --set 'depths=[1]' --set 'heads=[1]' \
  --set batch=1 --backend cuda --steps 1 >/dev/null 2>"$tmp/e"
rc=$?
if [ $rc -eq 1 ] && grep -q "window_attention): .*: windows of 12 x 12 with heads of 64 need [0-9]* bytes of shared memory, more than the device gives a block" "$tmp/e"; then ok
  echo "cuda (emulated): refused: $(cat "$tmp/e")"
else bad "a window too large for shared memory (exit $rc)"; cat "$tmp/e"; fi

# a kernel that faults: found at the end of its step, or at its instruction
WEFT_CUDA_EMU_FAIL=20 "$WEFT" run examples/gpt2.plan --plan tp2 $GPT --backend cuda >/dev/null 2>"$tmp/e"
rc=$?
if [ $rc -eq 2 ] && grep -q "a kernel of step 1 failed: .*WEFT_CUDA_SYNC=1 names its instruction" "$tmp/e"; then ok
else bad "a faulting kernel (exit $rc)"; cat "$tmp/e"; fi
WEFT_CUDA_SYNC=1 WEFT_CUDA_EMU_FAIL=19 "$WEFT" run examples/gpt2.plan --plan tp2 $GPT --backend cuda >/dev/null 2>"$tmp/e"
rc=$?
if [ $rc -eq 2 ] && grep -q "plan device [0-9]*, instruction [0-9]* (forward .*, .*): an illegal memory access" "$tmp/e"; then ok
  echo "cuda (emulated): a faulting kernel, WEFT_CUDA_SYNC=1: $(cat "$tmp/e")"
else bad "a faulting kernel under WEFT_CUDA_SYNC=1 (exit $rc)"; cat "$tmp/e"; fi
WEFT_CUDA_EMU_HANG=1 "$WEFT" run examples/gpt2.plan --plan tp2 $GPT --backend cuda --timeout 0.5 >/dev/null 2>"$tmp/e"
rc=$?
if [ $rc -eq 2 ] && grep -q "plan device [0-9]*: step 1 did not finish within 0.5 s (--timeout)" "$tmp/e"; then ok
  echo "cuda (emulated): a kernel that hangs, --timeout 0.5: $(cat "$tmp/e")"
else bad "a kernel that hangs (exit $rc)"; cat "$tmp/e"; fi

# the NCCL path (WEFT_CUDA_COMM=nccl) on the emulation's stand-in for NCCL
# (one rank; each operation reads its input, spoils its output, then
# writes it, as separate work of NCCL's stream, so that a missing wait
# between NCCL's stream and the devices' shows): a GPT on one device whose
# products split along their reduction into two parts (co-shard) all-reduce
# their sums over the group [0]; it saves the same bytes as on the
# virtual-device path, under three stream orders, in f32 and bf16
ONE=tests/cuda/coshard_one.plan
for dt in f32 bf16; do
  "$WEFT" run $ONE --set dtype=$dt --backend cuda --steps 3 --save "$tmp/v.st" >"$tmp/v" 2>&1 ||
    bad "the virtual-device path, $dt: $(cat "$tmp/v")"
  same=0
  for seed in 1 2 3; do
    WEFT_CUDA_EMU_SEED=$seed WEFT_CUDA_COMM=nccl "$WEFT" run $ONE --set dtype=$dt --backend cuda \
      --steps 3 --save "$tmp/n.st" >"$tmp/n" 2>&1 &&
      grep -q "collectives of groups of one through the emulation's stand-in for NCCL (processes of one machine, through files), 1 communicator" "$tmp/n" &&
      cmp -s "$tmp/v.st" "$tmp/n.st" && same=$((same+1))
    rm -f "$tmp/n.st"
  done
  if [ $same = 3 ]; then ok
    echo "cuda (emulated): WEFT_CUDA_COMM=nccl, co-shard of one device, $dt: its $("$WEFT" lower $ONE --set dtype=$dt | grep -c ' all-reduce .* group \[0\]$') all-reduces of groups of one through NCCL's stand-in save the bytes of the virtual-device path (3 stream orders)"
  else bad "WEFT_CUDA_COMM=nccl, $dt: $same of 3 stream orders match the virtual-device path"; cat "$tmp/n"; fi
done
WEFT_CUDA_COMM=nccl WEFT_CUDA_EMU_HANG=1 "$WEFT" run $ONE --backend cuda --timeout 0.5 >/dev/null 2>"$tmp/e"
rc=$?
if [ $rc -eq 2 ] && grep -q "instruction [0-9]* (collective of comm [0-9]*): the NCCL all-reduce of group \[0\] did not finish within 0.5 s (--timeout) in step 1; its ranks: 0 of 1, this process; the communicators were aborted (ncclCommAbort)" "$tmp/e"; then ok
  echo "cuda (emulated): WEFT_CUDA_COMM=nccl, a collective that never ends: $(cat "$tmp/e")"
else bad "WEFT_CUDA_COMM=nccl, a collective that never ends (exit $rc)"; cat "$tmp/e"; fi
WEFT_CUDA_COMM=mpi "$WEFT" run $ONE --backend cuda >/dev/null 2>"$tmp/e"
rc=$?
if [ $rc -eq 1 ] && grep -q "WEFT_CUDA_COMM=mpi: expected \`nccl\` or \`virtual\`" "$tmp/e"; then ok
else bad "WEFT_CUDA_COMM=mpi (exit $rc)"; cat "$tmp/e"; fi
# ---- several processes, one plan device each --------------------------------------------------
# NCCL across processes is the emulation's stand-in (files in a directory
# of TMPDIR; each collective, send and receive waits for the other
# processes' files as work of the stream that waits): each run matches one
# device, the rendezvous through MPI and through a file, the watchdog
export TMPDIR=$tmp WEFT_CUDA_EMU_DEVICES=4
TP="--set layers=2 --set hidden=64 --set heads=4 --set seq=16 --set vocab=256 --set batch=8"
PP="--set layers=12 --set hidden=32 --set heads=2 --set seq=8 --set vocab=64 --set batch=4"
# srun without MPI: Slurm's variables, the id through a file
for r in 0 1; do
  SLURM_STEP_ID=0 SLURM_JOB_ID=1 SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=$r "$WEFT" run examples/gpt2.plan --plan tp2 $TP \
    --backend cuda --steps 2 --check --rendezvous "file:$tmp/rdv" --timeout 60 >"$tmp/s$r" 2>&1 &
done
wait
if grep -q "match$" "$tmp/s0" && grep -q "process 0 of 2 runs plan device 0" "$tmp/s0" && [ ! -e "$tmp/rdv" ]; then ok
  echo "cuda (emulated): 2 processes as srun starts them without MPI, the id through --rendezvous file: gpt2 tp2 $(grep -o 'losses within [^,]*' "$tmp/s0"), match"
else bad "2 processes with --rendezvous file"; cat "$tmp/s0" "$tmp/s1"; fi
SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_PROCID=1 "$WEFT" run examples/gpt2.plan --plan tp2 $TP --backend cuda >/dev/null 2>"$tmp/e"
rc=$?
if [ $rc -eq 1 ] && grep -q "process 1 of 2 was not started by mpirun: .*(--rendezvous file:PATH)" "$tmp/e"; then ok
else bad "srun without MPI and without --rendezvous (exit $rc)"; cat "$tmp/e"; fi
if command -v mpirun >/dev/null 2>&1 && [ -f "$(dirname "$WEFT")/libweft_mpi.so" ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  asan_mpi="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
  mp_ok() {
    name=$1; np=$2; shift 2
    if ASAN_OPTIONS=$asan_mpi mpirun -np "$np" "$WEFT" run "$@" --backend cuda --check --timeout 60 >"$tmp/m" 2>&1 &&
       grep -q "match$" "$tmp/m" && grep -q "in $np processes" "$tmp/m" && ! grep -q "warning: the processes' copies" "$tmp/m"; then ok
      echo "cuda (emulated): mpirun -np $np, $name: $(grep -o 'losses within [^,]*, gradient norms within [^,]*, parameters within [^ ]*' "$tmp/m"), match"
    else bad "mpirun -np $np $name"; cat "$tmp/m"; fi
  }
  mp_ok "gpt2 tp2 (all-reduces)" 2 examples/gpt2.plan --plan tp2 $TP --steps 2
  # (each mp_ok run: the copies of what its processes both compute, such
  # as tp2's embeddings and LayerNorms, the same bits in every process.)
  # Copies that differ (process 1's compared one step of rounding off,
  # WEFT_CUDA_EMU_SKEW) are said, with the parameters, and the run goes on
  if WEFT_CUDA_EMU_SKEW=1 ASAN_OPTIONS=$asan_mpi mpirun -np 2 "$WEFT" run examples/gpt2.plan --plan tp2 $TP --backend cuda \
       --timeout 60 >"$tmp/m" 2>&1 &&
     [ "$(grep -c "^weft run: warning: the processes' copies of 12 parameters (wte.weight, wpe.weight, h.0.ln_1.weight, ...) differ in [0-9]* elements, by at most 1.2e-07 relative: " "$tmp/m")" = 1 ]; then ok
    echo "cuda (emulated): mpirun -np 2, copies that differ between processes: $(grep -o "warning: .* relative" "$tmp/m")"
  else bad "mpirun -np 2, copies that differ"; cat "$tmp/m"; fi
  # Choices of kernels that differ between processes (WEFT_CUDA_EMU_PICK=1:
  # process 0 proposes the first of attention's ways that pass, wmma,
  # process 1 the last, core) are agreed after step 1
  # (backends/cuda/choice.h), the reference running meanwhile: in a model
  # each process computes whole (tests/cuda/copies.plan) both launch the
  # same attention kernels as often (the emulation's count, a file each),
  # process 1 wmma's forward in steps 2 and 3 (4 launches more than its
  # timing alone), and the copies keep the same bits; with
  # WEFT_CUDA_AGREE=0 each process keeps its own choices, and the copies
  # differ
  CP="tests/cuda/copies.plan --plan copies --steps 3 --backend cuda --timeout 60"
  two() { # two OUT [VAR=VALUE]: the run, each process counting its launches
    out=$1; shift
    env "$@" WEFT_CUDA_EMU_PICK=1 WEFT_ATTN=auto:wmma,core ASAN_OPTIONS=$asan_mpi mpirun \
      -np 1 -x WEFT_CUDA_EMU_LAUNCHES="$tmp/$out.l0" "$WEFT" run $CP : \
      -np 1 -x WEFT_CUDA_EMU_LAUNCHES="$tmp/$out.l1" "$WEFT" run $CP >"$tmp/$out" 2>&1
  }
  attn() { grep " k_attn" "$tmp/$1"; }
  wmma() { awk '/ k_attn_fwd_tc</ {n += $1} END {print n + 0}' "$tmp/$1"; }
  if two ag && two own WEFT_CUDA_AGREE=0 &&
     [ "$(grep -c ": process 0 proposes wmma, fa runs them until the processes agree" "$tmp/ag")" = 2 ] &&
     [ "$(grep -c ": process 1 proposes core, fa runs them until the processes agree" "$tmp/ag")" = 2 ] &&
     grep -q "^weft: process 1 takes another choice of kernels than its own fastest for 2 of its 2 calls" "$tmp/ag" &&
     ! grep -q "warning: the processes' copies" "$tmp/ag" && [ -n "$(attn ag.l0)" ] &&
     [ "$(attn ag.l0)" = "$(attn ag.l1)" ] &&
     [ "$(wmma ag.l1)" -eq $(($(wmma own.l1) + 4)) ] &&
     grep -q "^weft run: warning: the processes' copies of [0-9]* parameters" "$tmp/own" &&
     [ "$(attn own.l0)" != "$(attn own.l1)" ]; then ok
    echo "cuda (emulated): mpirun -np 2, choices that differ between processes agreed: $(grep -o "process 1 takes .* calls" "$tmp/ag"), the same $(attn ag.l0 | wc -l) attention kernels launched as often in each (process 1's wmma forward $(wmma ag.l1) times, $(wmma own.l1) on its own choice), no copies differ; each process's own (WEFT_CUDA_AGREE=0): $(grep -o "copies of [0-9]* parameters" "$tmp/own") differ"
  else bad "mpirun -np 2, choices agreed between processes"; cat "$tmp/ag" "$tmp/own"; fi
  # A process that times nothing (process 1: WEFT_ATTN empty, and heads
  # this small are not timed by default) proposes the reference, a veto:
  # process 0, which timed wmma and core and proposed wmma, runs the
  # reference too, and no copies differ
  if ASAN_OPTIONS=$asan_mpi mpirun -np 1 -x WEFT_ATTN=auto:wmma,core -x WEFT_CUDA_EMU_PICK=1 "$WEFT" run $CP : \
       -np 1 -x WEFT_ATTN= "$WEFT" run $CP >"$tmp/veto" 2>&1 &&
     [ "$(grep -c ": process 0 proposes wmma, fa runs them until the processes agree" "$tmp/veto")" = 2 ] &&
     grep -q "^weft: process 0 takes another choice of kernels than its own fastest for 2 of its 2 calls" "$tmp/veto" &&
     ! grep -q "process 1 proposes" "$tmp/veto" && ! grep -q "warning: the processes' copies" "$tmp/veto"; then ok
    echo "cuda (emulated): mpirun -np 2, a process that times nothing: its reference taken by the other ($(grep -o "process 0 takes .* calls" "$tmp/veto")), no copies differ"
  else bad "mpirun -np 2, a process that times nothing"; cat "$tmp/veto"; fi
  mp_ok "gpt2 tp2_pp2 (sends between stages, 4 micro-batches)" 4 examples/gpt2.plan --plan tp2_pp2 $PP --steps 1
  mp_ok "gpt2 ulysses (all-to-alls)" 4 examples/gpt2.plan --plan ulysses $TP --steps 1
  # which NCCL calls the collectives map to (the stand-in counts them,
  # WEFT_CUDA_EMU_CCL): calls of process 0, and its collectives as weft
  # lower lists them for plan device 0
  calls() { sed -n "s/^rank 0 of [0-9]*:.* $1 \([0-9]*\).*/\1/p" "$tmp/calls"; }
  lowered() { "$WEFT" lower "$@" | awk -v k="$KIND" '/^device/ {d = $2} d == "0:" && $2 == k {n++} END {print n + 0}'; }
  # ZeRO-3 over dp2 with tp2 and sequence parallelism (4 processes): the
  # gradients' reduce-scatters (and sequence parallel's of activations,
  # cut on the sequence inside a micro-batch) on ncclReduceScatter, the
  # parameters' all-gathers (and the activations') on ncclAllGather
  Z3="--set layers=2 --set hidden=64 --set heads=4 --set seq=16 --set vocab=128 --set global_batch=8 --set micro_batch=2"
  Z3="examples/gpt_megatron.plan $Z3 --set pp=1 --set zero=3 --set tp=2 --set dp=2 --set sequence_parallel=true"
  rm -f "$tmp/calls"
  export WEFT_CUDA_EMU_CCL=$tmp/calls
  mp_ok "megatron zero 3, tp2, sequence parallel" 4 $Z3 --steps 1
  unset WEFT_CUDA_EMU_CCL
  rs=$(KIND=reduce-scatter lowered $Z3); ag=$(KIND=all-gather lowered $Z3)
  if [ "$rs" -gt 0 ] && [ "$(calls ncclReduceScatter)" = "$rs" ] && [ "$(calls ncclAllGather)" = "$ag" ] &&
     [ "$(calls ncclSend)" = 0 ] && [ "$(wc -l <"$tmp/calls")" = 4 ]; then ok
    echo "cuda (emulated): mpirun -np 4, megatron zero 3, tp2, sequence parallel: process 0's $rs reduce-scatters and $ag all-gathers: $(calls ncclReduceScatter) ncclReduceScatter, $(calls ncclAllGather) ncclAllGather, $(calls ncclSend) ncclSend"
  else bad "megatron zero 3, tp2, sequence parallel: NCCL calls ($rs reduce-scatters, $ag all-gathers)"; cat "$tmp/calls"; fi
  # a hidden size of 63 over dp2: parts of 32 and 31 rows, which NCCL's
  # calls do not take: those reduce-scatters are all-reduces of the whole,
  # those all-gathers sends and receives; the even ones still NCCL's
  Z3="--set layers=1 --set hidden=63 --set heads=3 --set seq=16 --set vocab=129 --set global_batch=8 --set micro_batch=2"
  Z3="examples/gpt_megatron.plan $Z3 --set pp=1 --set zero=3 --set tp=1 --set dp=2"
  rm -f "$tmp/calls"
  export WEFT_CUDA_EMU_CCL=$tmp/calls
  mp_ok "megatron zero 3, hidden 63 (uneven parts)" 2 $Z3 --steps 1
  unset WEFT_CUDA_EMU_CCL
  rs=$(KIND=reduce-scatter lowered $Z3); ag=$(KIND=all-gather lowered $Z3)
  nrs=$(calls ncclReduceScatter); nag=$(calls ncclAllGather)
  if [ "$nrs" -gt 0 ] && [ "$nrs" -lt "$rs" ] && [ "$nag" -gt 0 ] && [ "$nag" -lt "$ag" ] && [ "$(calls ncclSend)" -gt 0 ]; then ok
    echo "cuda (emulated): mpirun -np 2, megatron zero 3, hidden 63: process 0's $rs reduce-scatters and $ag all-gathers: $nrs ncclReduceScatter, $nag ncclAllGather, the others as all-reduces and $(calls ncclSend) ncclSend"
  else bad "megatron zero 3, hidden 63: NCCL calls ($rs reduce-scatters, $ag all-gathers)"; cat "$tmp/calls"; fi
  # a stage on one device feeding a tp pair: the activations broadcast
  # (ncclBroadcast); the tied embedding's gradient summed over all three,
  # one of the pair adding nothing (NCCL gets its zeros)
  rm -f "$tmp/calls"
  export WEFT_CUDA_EMU_CCL=$tmp/calls
  mp_ok "a stage feeding a tp pair (broadcasts)" 3 tests/golden/plan/broadcast.plan --steps 1
  unset WEFT_CUDA_EMU_CCL
  bc=$(KIND=broadcast lowered tests/golden/plan/broadcast.plan)
  if [ "$bc" -gt 0 ] && [ "$(calls ncclBroadcast)" = "$bc" ]; then ok
    echo "cuda (emulated): mpirun -np 3, a stage feeding a tp pair: $bc broadcasts, $(calls ncclBroadcast) ncclBroadcast"
  else bad "broadcasts: $bc lowered"; cat "$tmp/calls"; fi
  # --clip: the global norm from every process's share, the weights'
  # copies over dp counted once; SGD, whose step scales with the gradient,
  # so that a wrong norm shows in the parameters (--check); clipping
  # changed the trajectory
  mp_ok "a small MLP, tp2 x dp2, SGD, clipped to a quarter of its gradient norm (--clip 0.02)" 4 tests/cuda/clip.plan \
    --steps 3 --clip 0.02
  "$WEFT" run tests/cuda/clip.plan --backend cpu --steps 3 >"$tmp/noclip" 2>&1
  a=$(grep "^step 3 " "$tmp/m" | awk '{print $4}'); b=$(grep "^step 3 " "$tmp/noclip" | awk '{print $4}')
  if [ -n "$a" ] && [ -n "$b" ] && [ "$a" != "$b" ]; then ok
    echo "cuda (emulated): mpirun -np 4, --clip 0.02: loss of step 3 $a, without clipping $b"
  else bad "--clip across processes did not change the losses ($a, $b)"; fi
  # a sharded checkpoint saved by 2 processes (tp2), resumed by one
  # process under another plan (single): the losses of 4 steps straight
  CK="examples/gpt2.plan $TP --seed 7"
  "$WEFT" run $CK --plan single --backend cuda --steps 4 --json >"$tmp/straight.json" 2>"$tmp/e" || bad "4 steps straight: $(cat "$tmp/e")"
  if ASAN_OPTIONS=$asan_mpi mpirun -np 2 "$WEFT" run $CK --plan tp2 --backend cuda --steps 2 --save "$tmp/set/" --timeout 60 \
       >"$tmp/m" 2>&1 && [ "$(ls "$tmp/set" | grep -c '^model-0000[12]-of-00002\.safetensors$')" = 2 ] &&
     [ -f "$tmp/set/model.safetensors.index.json" ] &&
     "$WEFT" run $CK --plan single --backend cuda --steps 2 --resume "$tmp/set/" --json >"$tmp/resumed.json" 2>"$tmp/e" &&
     e=$(python3 - "$tmp/straight.json" "$tmp/resumed.json" <<'EOF'
import json, sys
a = [s["loss"] for s in json.load(open(sys.argv[1]))["steps"]][2:]
b = [s["loss"] for s in json.load(open(sys.argv[2]))["steps"]]
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print("%.2g" % worst)
sys.exit(0 if len(a) == len(b) == 2 and worst <= 1e-5 else 1)
EOF
     ); then ok
    echo "cuda (emulated): 2 shards saved by mpirun -np 2 under tp2, resumed by one process under single: steps 3 and 4 within $e of 4 steps straight"
  else bad "a sharded checkpoint across processes ($e)"; cat "$tmp/m" "$tmp/e"; ls -A "$tmp/set"; fi
  ASAN_OPTIONS=$asan_mpi mpirun -np 3 "$WEFT" run examples/gpt2.plan --plan tp2 $TP --backend cuda >/dev/null 2>"$tmp/e"
  if grep -q "the CUDA backend runs one plan device per process: plan tp2 has 2 devices with a program, and 3 processes were started (start 2)" "$tmp/e"; then ok
  else bad "mpirun -np 3 for 2 devices"; cat "$tmp/e"; fi
  # every run above removed the stand-in's files
  if ls "$tmp" | grep -q "^weft-nccl-"; then bad "the stand-in for NCCL left its files: $(ls "$tmp" | grep weft-nccl)"; else ok; fi
  # the watchdog: a process stopped (SIGSTOP) or killed (SIGKILL) in the
  # middle of a run ends the run within --timeout, no process left; a
  # stopped one is found by whichever wait it stops (a collective of the
  # plan, or the step's exchange of losses and norms), each naming --timeout.
  # (5 s: under the sanitizers an emulated step takes seconds, and on a
  # loaded machine one process may fall 2 s behind the other unstopped.)
  for sig in STOP KILL; do
    rm -f "$tmp"/pid.* "$tmp/w.out" "$tmp/w.rc"
    (ASAN_OPTIONS=$asan_mpi mpirun -np 2 sh -c 'echo $$ >"$0/pid.$OMPI_COMM_WORLD_RANK"; exec "$@"' "$tmp" \
      "$WEFT" run examples/gpt2.plan --plan tp2 $TP --backend cuda --steps 100000 --timeout 5 >"$tmp/w.out" 2>&1
     echo $? >"$tmp/w.rc") &
    runner=$!
    n=0; while [ $n -lt 300 ] && ! grep -q "^step 2 " "$tmp/w.out" 2>/dev/null; do sleep 0.1; n=$((n+1)); done
    victim=$(cat "$tmp/pid.1" 2>/dev/null); other=$(cat "$tmp/pid.0" 2>/dev/null)
    if [ -n "$victim" ] && kill -$sig "$victim"; then
      n=0; while [ $n -lt 300 ] && [ ! -f "$tmp/w.rc" ]; do sleep 0.1; n=$((n+1)); done
      left=$(for p in $victim $other; do ps -o stat= -p "$p" 2>/dev/null | grep -qv Z && echo "$p"; done)
      if [ -f "$tmp/w.rc" ] && [ "$(cat "$tmp/w.rc")" != 0 ] && [ -z "$left" ] &&
         { [ $sig = KILL ] || grep -q "process 0: .*(--timeout)" "$tmp/w.out"; }; then ok
        echo "cuda (emulated): mpirun -np 2, process 1 gets SIG$sig: the run ends in $((n / 10)) s, exit $(cat "$tmp/w.rc"), no process left$([ $sig = STOP ] && echo ": $(grep -o 'process 0: .*(--timeout)' "$tmp/w.out" | head -1 | sed 's/^process 0: //')")"
      else bad "SIG$sig of a process: exit $(cat "$tmp/w.rc" 2>/dev/null), left: $left"; grep -v "^step" "$tmp/w.out"; fi
      for p in $victim $other; do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
    else bad "mpirun -np 2: no process to stop$([ -f "$tmp/w.rc" ] && echo ": the run ended before its step 2, exit $(cat "$tmp/w.rc")")"
      cat "$tmp/w.out"; pkill -P $runner mpirun; fi
    wait $runner 2>/dev/null
  done
else
  echo "cuda (emulated): mpirun -np 2 and 4: skipped (no mpirun or no libweft_mpi.so beside weft)"
fi

fi

echo "cuda${PART_SAID}: $pass passed, $fail failed"
[ "$fail" = 0 ]
