#!/bin/sh
# plans.sh - the CUDA backend on every example plan: each against one device
# (--check), with the streams' work run in several orders under the
# emulation; cuda against cpu over 5 steps in f32 and bf16; --deterministic
# bit for bit; save and resume. Shared by tests/cuda_check.sh (the CPU
# emulation, in make check) and tests/gpu/run.sh (a GPU).
# Usage: sh tests/cuda/plans.sh WEFT PLUGIN_DIR LABEL F32_TOLERANCE
WEFT=$1
export WEFT_PLUGIN_DIR=$2
LABEL=$3
F32_TOL=${4:-1e-5}
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT

# run_ok NAME ARGS...: weft run ARGS --backend cuda --check --json matches one device
run_ok() {
  name=$1; shift
  if "$WEFT" run "$@" --backend cuda --check --json >"$tmp/out.json" 2>"$tmp/err"; then
    if grep -q '"match":true' "$tmp/out.json"; then ok
      le=$(sed -n 's/.*"max_loss_rel_err":\([^,]*\),.*/\1/p' "$tmp/out.json")
      pe=$(sed -n 's/.*"max_param_rel_err":\([^,]*\),.*/\1/p' "$tmp/out.json")
      printf '%s: %s: matches one device (losses within %.2g, parameters within %.2g)\n' "$LABEL" "$name" "$le" "$pe"
    else bad "$name: no match"; cat "$tmp/out.json"; fi
  else
    bad "$name: weft run $* --backend cuda --check (exit $?)"; cat "$tmp/err" "$tmp/out.json"
  fi
}

GPT="--set layers=2 --set hidden=64 --set heads=4 --set seq=16 --set vocab=256 --set batch=8"
MEG="--set layers=4 --set hidden=64 --set heads=4 --set seq=16 --set vocab=128 --set global_batch=8 --set micro_batch=2"
LLAMA="--set layers=2 --set hidden=64 --set heads=4 --set kv_heads=2 --set ffn=96 --set seq=16 --set vocab=128 --set batch=2"
run_ok "mlp tp2_dp2" examples/mlp.plan --steps 1
for p in single dp dp_zero3 tp2 ulysses; do run_ok "gpt2 $p" examples/gpt2.plan --plan $p $GPT --steps 2; done
for seed in 1 2 3; do
  WEFT_CUDA_EMU_SEED=$seed run_ok "gpt2 tp2_pp2, stream order $seed" examples/gpt2.plan --plan tp2_pp2 $GPT \
    --set layers=8 --steps 2
done
run_ok "coshard" examples/coshard.plan --set layers=2 --set hidden=64 --set heads=16 --set seq=16 --set batch=4 --steps 2
run_ok "grid" examples/grid.plan --set hidden=64 --set heads=4 --set seq=16 --set vocab=256 --steps 1
run_ok "llama tp2" examples/llama.plan $LLAMA --steps 2
run_ok "llama megatron_tp, sequence parallel" examples/llama.plan --plan megatron_sp $LLAMA --steps 2
run_ok "megatron tp2 pp2 dp2" examples/gpt_megatron.plan $MEG --steps 2
run_ok "megatron interleaved, sequence parallel, full recompute, zero 1" examples/gpt_megatron.plan $MEG \
  --set interleave=2 --set sequence_parallel=true --set 'recompute="full"' --set zero=1 --steps 2
run_ok "megatron zero 3" examples/gpt_megatron.plan $MEG --set pp=1 --set zero=3 --steps 2
run_ok "megatron tp4, vocabulary-parallel loss" examples/gpt_megatron.plan $MEG --set tp=4 --set pp=1 --steps 2
run_ok "megatron bf16 (f32 masters; attention on tensor cores, heads of 32)" examples/gpt_megatron.plan $MEG \
  --set hidden=128 --set dtype=bf16 --steps 3
LMEG="--set layers=4 --set hidden=64 --set heads=4 --set kv_heads=2 --set ffn=96 --set seq=16 --set vocab=128 --set global_batch=8 --set micro_batch=2"
run_ok "llama megatron tp2 pp2 dp2" examples/llama_megatron.plan $LMEG --steps 2
run_ok "llama context parallel cp2 tp2 pp2, sequence parallel" examples/llama_megatron.plan $LMEG --set cp=2 --set dp=1 \
  --set sequence_parallel=true --steps 2
run_ok "llama context parallel cp4 dp2, full recompute" examples/llama_megatron.plan $LMEG --set cp=4 --set tp=1 --set pp=1 \
  --set 'recompute="full"' --steps 2
run_ok "llama bf16 cp2 (queries from the middle of the sequence on tensor cores, heads of 32)" examples/llama_megatron.plan \
  $LMEG --set hidden=128 --set dtype=bf16 --set cp=2 --set pp=1 --set dp=1 --steps 2
run_ok "buckets of gradient all-reduces" tests/golden/plan/buckets.plan --plan small --steps 2
# the mixture of experts (examples/moe.plan, small by default): expert
# parallelism's all-to-alls, with tensor and data parallelism, in a
# pipeline; a capacity that drops half the choices, and top 1
run_ok "moe ep2 (all-to-alls of expert parallelism)" examples/moe.plan --plan ep2 --steps 2
run_ok "moe ep2 tp2 dp2, capacity factor 0.5" examples/moe.plan --plan ep2_tp2_dp2 --set capacity_factor=0.5 --steps 2
run_ok "moe ep2 pp2, top 1" examples/moe.plan --plan ep2_pp2 --set top_k=1 --steps 2
MIX="--set layers=2 --set hidden=64 --set heads=4 --set kv_heads=2 --set ffn=96 --set seq=16 --set vocab=128 --set global_batch=8 --set micro_batches=2 --set ep=2 --set tp=2 --set pp=2 --set nodes=1"
run_ok "mixtral-shaped moe_llama ep2 tp2 pp2, f32" examples/mixtral.plan $MIX --set dtype=f32 --steps 2
run_ok "mixtral-shaped moe_llama ep2 tp2 pp2, bf16" examples/mixtral.plan $MIX --set hidden=128 --steps 2
# the Swin Transformer (shifted windows at stage 0) and T5 (attention without a mask, cross attention)
SWIN="--set image=16 --set batch=2"
run_ok "swin megatron (heads and the bias table's columns split)" examples/swin.plan --plan megatron $SWIN --steps 2
run_ok "swin windows (rows of windows on two devices, each part's shifted-window mask)" examples/swin.plan \
  --plan windows --set batch=1 --set embed=16 --steps 2
run_ok "t5 pipeline (cross attention on stages apart from the encoder)" examples/t5.plan --plan pipeline --steps 2
run_ok "swin bf16 tp2 (the bias tables' gradients in f32)" tests/cuda/swin_bf16.plan --plan tp2 --steps 2

# cuda against cpu: the same weights and batch, 5 steps
compare() {  # name, tolerance, then weft run arguments
  name=$1; tol=$2; shift 2
  if "$WEFT" run "$@" --backend cuda --steps 5 --json >"$tmp/c.json" 2>"$tmp/err" &&
     "$WEFT" run "$@" --backend cpu --steps 5 --json >"$tmp/p.json" 2>>"$tmp/err" &&
     python3 - "$tmp/c.json" "$tmp/p.json" "$tol" >"$tmp/cmp" 2>&1 <<'EOF'
import json, sys
c, p = (json.load(open(f))["steps"] for f in sys.argv[1:3])
tol = float(sys.argv[3])
worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(c, p))
print(f"losses of 5 steps within {worst:.2g} of the CPU backend's (tolerance {tol:g})")
sys.exit(0 if len(c) == len(p) == 5 and worst <= tol else 1)
EOF
  then ok; echo "$LABEL: $name: $(cat "$tmp/cmp")"
  else bad "$name: cuda against cpu"; cat "$tmp/err" "$tmp/cmp"; fi
}
compare "gpt2 tp2, f32" "$F32_TOL" examples/gpt2.plan --plan tp2 $GPT
compare "moe ep4, f32" "$F32_TOL" examples/moe.plan --plan ep4
compare "mixtral-shaped moe_llama bf16 ep2 tp2 pp2 against the CPU's f32" 1e-2 examples/mixtral.plan $MIX --set hidden=128
compare "swin single, f32" "$F32_TOL" examples/swin.plan --plan single $SWIN
compare "t5 single, f32" "$F32_TOL" examples/t5.plan --plan single
compare "t5 bf16 against the CPU's f32" 1e-2 examples/t5.plan --plan single --set dtype=bf16
compare "swin bf16 against the CPU's f32" 1e-2 tests/cuda/swin_bf16.plan --plan single
# a vocabulary of 257: the logits' rows are off 16 bytes, and their products
# are staged through the padded area, here from any size and in chunks of
# a few rows
ODD="--set layers=2 --set hidden=64 --set heads=4 --set seq=16 --set vocab=257 --set batch=8"
export WEFT_GEMM_STAGE_FLOPS=0 WEFT_GEMM_STAGE_BYTES=16384
run_ok "gpt2 dp, vocabulary of 257 (staged products)" examples/gpt2.plan --plan dp $ODD --steps 2
compare "gpt2 single, vocabulary of 257 (staged products), f32" "$F32_TOL" examples/gpt2.plan --plan single $ODD
compare "megatron bf16, vocabulary of 257 (staged products)" 1e-2 examples/gpt_megatron.plan $MEG --set hidden=128 \
  --set dtype=bf16 --set vocab=257 --set tp=1 --set pp=1
unset WEFT_GEMM_STAGE_FLOPS WEFT_GEMM_STAGE_BYTES
compare "megatron bf16 against the CPU's f32" 1e-2 examples/gpt_megatron.plan $MEG --set hidden=128 --set dtype=bf16

# --deterministic: two runs, the same bytes; save, resume and go on: the same as at once
if "$WEFT" run examples/gpt2.plan --plan tp2 $GPT --backend cuda --deterministic --steps 3 --save "$tmp/a.st" >/dev/null 2>&1 &&
   WEFT_CUDA_EMU_SEED=7 "$WEFT" run examples/gpt2.plan --plan tp2 $GPT --backend cuda --deterministic --steps 3 \
     --save "$tmp/b.st" >/dev/null 2>&1 && cmp -s "$tmp/a.st" "$tmp/b.st"; then ok
  echo "$LABEL: --deterministic: two runs give the same bytes"
else bad "--deterministic runs differ"; fi
# (deterministic too: on a GPU, cuBLASLt's fastest algorithms and those
# without split reductions round differently)
if "$WEFT" run examples/gpt2.plan --plan tp2 $GPT --backend cuda --deterministic --steps 2 --save "$tmp/c.st" \
     >/dev/null 2>&1 &&
   "$WEFT" run examples/gpt2.plan --plan tp2 $GPT --backend cuda --deterministic --resume "$tmp/c.st" --steps 1 \
     --save "$tmp/d.st" \
     >/dev/null 2>&1 && cmp -s "$tmp/a.st" "$tmp/d.st"; then ok
  echo "$LABEL: 2 steps, save, resume, 1 step: the same bytes as 3 steps"
else bad "save and resume on cuda"; fi

# the steps of a stream in one launch (the default) and one launch per
# tensor (WEFT_CUDA_FUSED_STEP=0): the same bytes saved, the same losses
# and gradient norms, clipped or not, on masters, on ZeRO's parts, by SGD
fused_same() {
  name=$1; shift
  if WEFT_CUDA_FUSED_STEP=0 "$WEFT" run "$@" --backend cuda --deterministic --steps 3 --json --save "$tmp/f0.st" \
       >"$tmp/f0.json" 2>"$tmp/err" &&
     WEFT_CUDA_FUSED_STEP=1 "$WEFT" run "$@" --backend cuda --deterministic --steps 3 --json --save "$tmp/f1.st" \
       >"$tmp/f1.json" 2>>"$tmp/err" &&
     cmp -s "$tmp/f0.st" "$tmp/f1.st" &&
     python3 - "$tmp/f0.json" "$tmp/f1.json" >"$tmp/cmp" 2>&1 <<'EOF'
import json, sys
a, b = (json.load(open(f))["steps"] for f in sys.argv[1:3])
same = len(a) == len(b) == 3 and all(x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"] for x, y in zip(a, b))
print(f"last loss {b[-1]['loss']!r}, gradient norm {b[-1]['grad_norm']!r}")
sys.exit(0 if same else 1)
EOF
  then ok; echo "$LABEL: $name: the steps in one launch and one per tensor give the same bytes ($(cat "$tmp/cmp"))"
  else bad "$name: the steps in one launch and one per tensor differ"; cat "$tmp/err" "$tmp/cmp"; fi
}
fused_same "gpt2 bf16 single" bench/gpu/gpt2.plan --plan single $GPT
fused_same "gpt2 bf16 single, --clip" bench/gpu/gpt2.plan --plan single $GPT --clip 0.5
fused_same "gpt2 dp_zero3, --clip" examples/gpt2.plan --plan dp_zero3 $GPT --clip 0.3
fused_same "megatron bf16 zero 1" examples/gpt_megatron.plan $MEG --set zero=1 --set dtype=bf16
fused_same "SGD tp2 dp2, --clip" tests/cuda/clip.plan --clip 0.02

echo "$LABEL: $pass passed, $fail failed"
[ "$fail" = 0 ]
