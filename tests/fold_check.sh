#!/bin/sh
# fold_check.sh - micro-batch folding (plan.h, pfold) and data-parallel
# replicas (plan.h, rep) change how a plan is computed, never what it is.
# Every plan below is lowered with folding forced on and off, and the two
# programs must be the same up to the order in which communications were
# derived (tests/program_canon.py); and `weft check --json`, which lowers
# one replica for all, must report the same with replicas off (and close
# to it with tensor-parallel peers, check_reps below).
# Usage: sh tests/fold_check.sh ./weft
WEFT=${1:-./weft}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
compare() {  # name, then weft arguments
  name=$1
  shift
  WEFT_FOLD=never "$WEFT" lower "$@" --json >"$tmp/never.json" 2>"$tmp/never.err"
  rc1=$?
  WEFT_FOLD=always "$WEFT" lower "$@" --json >"$tmp/always.json" 2>"$tmp/always.err"
  rc2=$?
  if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ]; then
    echo "FAIL $name: exit $rc1 (never) and $rc2 (always)"
    sed 's/^/  /' "$tmp/never.err" "$tmp/always.err" | head -5
    fail=$((fail + 1))
    return
  fi
  if python3 tests/program_canon.py "$tmp/never.json" "$tmp/always.json" >"$tmp/canon.diff"; then
    pass=$((pass + 1))
  else
    echo "FAIL $name: the folded and unfolded programs differ"
    sed 's/^/  /' "$tmp/canon.diff"
    fail=$((fail + 1))
  fi
}
# Data-parallel replicas must give exactly what every device lowered
# gives. Tensor-parallel peers (on top, the default) stand for their group
# with the representative's program: the plan's figures agree within what
# a part applied once (a bias under a split sum) changes, the largest peak
# exactly, and no device is reported below its own peak
# (tests/peers_close.py). Deriving one replica's communication for all
# (deps.h, deps_view) must give what every replica's gives (WEFT_DEPS=all).
check_reps() {  # name, then weft arguments
  name=$1
  shift
  WEFT_REPS=never "$WEFT" check "$@" --json >"$tmp/all.json" 2>&1
  WEFT_REPS=replicas "$WEFT" check "$@" --json >"$tmp/reps.json" 2>&1
  "$WEFT" check "$@" --json >"$tmp/peers.json" 2>&1
  # the communication derived for one replica stands for every replica's
  WEFT_DEPS=all "$WEFT" check "$@" --json >"$tmp/deps.json" 2>&1
  if cmp -s "$tmp/deps.json" "$tmp/peers.json"; then
    pass=$((pass + 1))
  else
    echo "FAIL $name: check --json differs when every replica's communication is derived (WEFT_DEPS=all)"
    diff "$tmp/deps.json" "$tmp/peers.json" | head -10 | sed 's/^/  /'
    fail=$((fail + 1))
  fi
  if cmp -s "$tmp/all.json" "$tmp/reps.json"; then
    pass=$((pass + 1))
  else
    echo "FAIL $name: check --json differs with replicas"
    diff "$tmp/all.json" "$tmp/reps.json" | head -10 | sed 's/^/  /'
    fail=$((fail + 1))
  fi
  if python3 tests/peers_close.py "$tmp/all.json" "$tmp/peers.json" >"$tmp/peers.out"; then
    pass=$((pass + 1))
  else
    echo "FAIL $name: check --json with tensor-parallel peers is not close to every device lowered"
    sed 's/^/  /' "$tmp/peers.out" | head -10
    fail=$((fail + 1))
  fi
}
# weft lower --device N lowers N's classes only, N standing for its own:
# its program must be the one the full lowering gives it
device_eq() {  # name, device, then weft arguments
  name=$1
  dev=$2
  shift 2
  "$WEFT" lower "$@" --json --device "$dev" >"$tmp/one.json" 2>&1
  WEFT_REPS=never "$WEFT" lower "$@" --json --device "$dev" >"$tmp/full.json" 2>&1
  if python3 tests/program_device.py "$tmp/one.json" "$tmp/full.json" >"$tmp/dev.out" 2>&1; then
    pass=$((pass + 1))
  else
    echo "FAIL $name: weft lower --device $dev differs from the full lowering's device $dev"
    sed 's/^/  /' "$tmp/dev.out" | head -8
    fail=$((fail + 1))
  fi
}
for f in examples/*.plan; do
  # the Mixtral-sized example at a smaller size (64 devices whole, every
  # device lowered, are 140 MB of JSON): 2 stages of ep 4 x tp 2
  small=
  [ "$f" = examples/mixtral.plan ] && small="--set layers=4 --set hidden=256 --set heads=8 --set kv_heads=2 --set ffn=512
    --set seq=64 --set vocab=512 --set global_batch=16 --set micro_batches=4 --set ep=4 --set pp=2 --set nodes=2"
  # shellcheck disable=SC2086
  check_reps "$f (replicas)" "$f" $small
  # shellcheck disable=SC2086
  for plan in $("$WEFT" check "$f" $small --json 2>/dev/null |
    python3 -c 'import json,sys; print(" ".join(p["name"] for f in json.load(sys.stdin)["files"] for p in f["plans"] if p.get("built")))'); do
    compare "$f --plan $plan" "$f" --plan "$plan" $small
  done
done
M=examples/gpt_megatron.plan
compare "megatron interleaved" $M --set interleave=2 --set micro_batch=2 --set layers=8
compare "megatron zero 1" $M --set zero=1
compare "megatron zero 2" $M --set zero=2 --set pp=1 --set tp=2 --set dp=4
compare "megatron zero 3" $M --set zero=3 --set pp=1
compare "megatron sequence parallel, full recomputation" $M --set sequence_parallel=true --set 'recompute="full"'
compare "megatron selective recomputation, pp 4" $M --set 'recompute="selective"' --set pp=4 --set dp=1 --set micro_batch=1
compare "megatron pp 2 dp 4, 8 micro-batches" $M --set tp=1 --set pp=2 --set dp=4 --set micro_batch=1 --set global_batch=32
check_reps "megatron pp 2 dp 4 (replicas)" $M --set tp=1 --set pp=2 --set dp=4 --set micro_batch=1 --set global_batch=32
check_reps "megatron sequence parallel, dp 2 (replicas)" $M --set sequence_parallel=true --set 'recompute="full"'
# ZeRO: replicas keep their own parts of what is sharded; equal parts give
# the same figures, parts of one index more or less (dp 3) figures within
# what a row changes, the representative's the largest
check_reps "megatron bf16 zero 1, tp 2 pp 2 dp 2 (replicas)" $M --set dtype=bf16 --set zero=1
check_reps "megatron zero 2, tp 2 dp 4 (replicas)" $M --set zero=2 --set pp=1 --set tp=2 --set dp=4
check_reps "megatron zero 3, tp 2 dp 4 (replicas)" $M --set zero=3 --set pp=1 --set tp=2 --set dp=4
for z in 1 3; do
  WEFT_REPS=never "$WEFT" check $M --set dtype=bf16 --set zero=$z --set tp=2 --set pp=1 --set dp=3 --set global_batch=12 --json >"$tmp/all.json" 2>&1
  "$WEFT" check $M --set dtype=bf16 --set zero=$z --set tp=2 --set pp=1 --set dp=3 --set global_batch=12 --json >"$tmp/reps.json" 2>&1
  if python3 tests/peers_close.py "$tmp/all.json" "$tmp/reps.json" >"$tmp/peers.out"; then
    pass=$((pass + 1))
  else
    echo "FAIL megatron zero $z, dp 3: replicas with uneven ZeRO parts are not close to every device lowered"
    sed 's/^/  /' "$tmp/peers.out" | head -10
    fail=$((fail + 1))
  fi
done
for d in 0 3 6 7; do device_eq "megatron, device $d" $d $M; done
device_eq "megatron interleaved, sequence parallel, device 5" 5 $M --set interleave=2 --set layers=8 --set sequence_parallel=true
device_eq "gpt2 tp2_pp2, device 3" 3 examples/gpt2.plan --plan tp2_pp2
device_eq "megatron bf16 zero 1, dp 3 (uneven parts), device 5" 5 $M --set dtype=bf16 --set zero=1 --set tp=2 --set pp=1 \
  --set dp=3 --set global_batch=12
device_eq "gpt2 ulysses, device 2" 2 examples/gpt2.plan --plan ulysses
device_eq "llama megatron 6 layers in 4 stages, device 5" 5 examples/llama_megatron.plan --set layers=6 --set pp=4 --set dp=1
device_eq "scatter-gather across nodes, dp 2, device 6" 6 tests/golden/explain/stage_scatter_gather.plan --set nodes=4 --set dp=2
# a replicated consumer's copies left out of an all-reduce (pcomm.omit), a
# gradient's pieces sent from their own buffers (pcomm.from), and the parts
# of a gradient read in two pipeline stages sent to the producer
R=tests/golden/explain/grads_replicated_consumer.plan
S=tests/golden/explain/grads_across_stages.plan
for v in rep k; do
  compare "value projection $v, cp 2 tp 2 dp 2" $R --set "v=\"$v\"" --set dp=2
  check_reps "value projection $v, cp 2 tp 2 dp 2 (replicas)" $R --set "v=\"$v\"" --set dp=2
  check_reps "value projection $v, sequence parallel, cp 2 tp 2 dp 2 (replicas)" $R --set "v=\"$v\"" --set sp=true --set dp=2
done
device_eq "value projection replicated, device 5 (leaves its copy out)" 5 $R --set 'v="rep"' --set dp=2
compare "gradient read in two stages, tp 2 dp 2" $S --plan skip_tp --set dp=2
check_reps "gradients read in two stages, tp 2 dp 2 (replicas)" $S --set dp=2
# a tied parameter's replicated lookup leaving its copy out of the sum
T=tests/golden/explain/grads_tied_replicated_lookup.plan
compare "tied lookup replicated, tp 2 dp 2" $T --set dp=2
check_reps "tied lookup replicated, tp 2 dp 2 (replicas)" $T --set dp=2
check_reps "tied lookup replicated, tp 2 on 2 replicas, dp 2 (replicas)" $T --set dp=2 --set rep=2
device_eq "tied lookup replicated, device 3 (leaves its copy out)" 3 $T --set dp=2
export WEFT_FOLD=always
check_reps "megatron interleaved, tp 2 pp 2 dp 2, 16 micro-batches (replicas, folded)" $M --set interleave=2 --set layers=8 --set micro_batch=1 --set global_batch=32
check_reps "gpt2 (replicas, folded)" examples/gpt2.plan
unset WEFT_FOLD
echo "fold: $pass passed, $fail failed (folding and replicas)"
[ $fail -eq 0 ]
