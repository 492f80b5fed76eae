#!/bin/sh
# run_check.sh - weft run on the CPU backend: every example plan matches one
# device (--check), resume is bit-exact, mpirun gives what one process does,
# a checkpoint survives SIGKILL while it is written, bad files are refused.
WEFT=$1
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT

# run_ok NAME ARGS...: weft run ARGS --check --json must match one device
run_ok() {
  name=$1; shift
  if "$WEFT" run "$@" --check --json >"$tmp/out.json" 2>"$tmp/err"; then
    if grep -q '"match":true' "$tmp/out.json"; then ok
      le=$(sed -n 's/.*"max_loss_rel_err":\([^,]*\),.*/\1/p' "$tmp/out.json")
      pe=$(sed -n 's/.*"max_param_rel_err":\([^,]*\),.*/\1/p' "$tmp/out.json")
      printf 'run: %s: matches one device (losses within %.2g, parameters within %.2g)\n' "$name" "$le" "$pe"
    else bad "$name: no match"; cat "$tmp/out.json"; fi
  else
    bad "$name: weft run $* --check (exit $?)"; cat "$tmp/err" "$tmp/out.json"
  fi
}

GPT="--set layers=12 --set hidden=64 --set heads=4 --set seq=16 --set vocab=256 --set batch=8"
MEG="--set layers=4 --set hidden=64 --set heads=4 --set seq=16 --set vocab=128 --set global_batch=8 --set micro_batch=2"

run_ok "mlp tp2_dp2" examples/mlp.plan --steps 2
for p in dp dp_zero3 tp2 tp2_pp2 ulysses single; do run_ok "gpt2 $p" examples/gpt2.plan --plan $p $GPT --steps 2; done
run_ok "coshard" examples/coshard.plan --set layers=2 --set hidden=64 --set heads=16 --set seq=16 --set batch=4 --steps 2
run_ok "grid" examples/grid.plan --steps 1
run_ok "llama tp2" examples/llama.plan --set layers=2 --set hidden=64 --set heads=4 --set kv_heads=2 --set ffn=96 \
  --set seq=16 --set vocab=128 --set batch=2 --steps 2
run_ok "llama megatron_tp, sequence parallel, dp2" examples/llama.plan --plan megatron_sp --set layers=2 --set hidden=64 \
  --set heads=4 --set kv_heads=2 --set ffn=96 --set seq=16 --set vocab=128 --set batch=2 --steps 2
# plans written by weft search train like written ones
searched() {  # name, then weft search arguments
  name=$1; shift
  if "$WEFT" search "$@" -o "$tmp/searched.plan" 2>"$tmp/err"; then
    # the plan imports the example from outside its directory
    run_ok "$name: $(sed -n 's/^#   [0-9]*: [^:]*: \(.*\)  <- this plan$/\1/p' "$tmp/searched.plan")" "$tmp/searched.plan" \
      --allow-path examples --steps 2
  else
    bad "$name: weft search $* (exit $?)"; cat "$tmp/err"
  fi
}
searched "searched mlp" examples/mlp.plan --cluster 'cpus(4)'
searched "searched gpt2" examples/gpt2.plan $GPT --set layers=2 --cluster 'cpus(4)'
# with symbolic costs: the embedding split along hidden, its readers along
# the sequence, their gradients summed in place before they go back
searched "searched llama, symbolic costs" examples/llama.plan --set layers=4 --set hidden=64 --set heads=4 --set kv_heads=2 \
  --set ffn=96 --set seq=16 --set vocab=128 --set batch=4 --cluster 'cpus(8)' --cost symbolic
searched "searched llama" examples/llama.plan --set layers=2 --set hidden=64 --set heads=4 --set kv_heads=2 --set ffn=96 \
  --set seq=16 --set vocab=128 --set batch=4 --cluster 'cpus(4)'
run_ok "megatron tp2 pp2 dp2" examples/gpt_megatron.plan $MEG --steps 2
run_ok "megatron interleaved, sequence parallel, full recompute, zero 1" examples/gpt_megatron.plan $MEG \
  --set interleave=2 --set sequence_parallel=true --set 'recompute="full"' --set zero=1 --steps 2
run_ok "megatron zero 2, selective recompute" examples/gpt_megatron.plan $MEG --set zero=2 --set 'recompute="selective"' --steps 2
run_ok "megatron zero 3" examples/gpt_megatron.plan $MEG --set pp=1 --set zero=3 --steps 2
run_ok "megatron tp4" examples/gpt_megatron.plan $MEG --set tp=4 --set pp=1 --steps 2
run_ok "tied parameter on uneven copies" tests/golden/plan/tied_uneven.plan --steps 3
run_ok "megatron pp4" examples/gpt_megatron.plan $MEG --set tp=1 --set pp=4 --steps 2

# an operator with a native kernel, built here, through libffi
if command -v cc >/dev/null 2>&1 && sh examples/native/build.sh "$tmp" >/dev/null; then
  mkdir -p "$tmp/ex/native" && cp examples/native.plan "$tmp/ex/" && cp "$tmp/libweft_example_ops.so" "$tmp/ex/native/"
  run_ok "native tp2" "$tmp/ex/native.plan" --plan tp2 --steps 2 --allow-native
  run_ok "native dp2" "$tmp/ex/native.plan" --plan dp2 --steps 2 --allow-native
else
  bad "examples/native/build.sh"
fi

# fusing gradient all-reduces into buckets changes no bit: the sums of a
# bucket are taken in the same order as one by one
B=tests/golden/plan/buckets.plan
if "$WEFT" run $B --plan small --steps 2 --check --save "$tmp/bk.st" >"$tmp/bk.out" 2>&1 && grep -q "match$" "$tmp/bk.out" &&
   "$WEFT" run $B --plan none --steps 2 --save "$tmp/nb.st" >/dev/null 2>&1 && cmp -s "$tmp/bk.st" "$tmp/nb.st"; then ok
  echo "run: buckets of gradient all-reduces match one device and give the same bytes as none"
else bad "buckets change the result"; cat "$tmp/bk.out"; fi

# N steps, save, resume, M steps == N+M steps, byte for byte
A="examples/gpt2.plan --plan tp2_pp2 $GPT --seed 7"
"$WEFT" run $A --steps 2 --save "$tmp/a2.st" >/dev/null &&
"$WEFT" run $A --steps 1 --resume "$tmp/a2.st" --save "$tmp/a3.st" >/dev/null &&
"$WEFT" run $A --steps 3 --save "$tmp/b3.st" >/dev/null || bad "save and resume runs"
if cmp -s "$tmp/a3.st" "$tmp/b3.st"; then ok; echo "run: 2 steps + resume + 1 step == 3 steps, byte for byte"
else bad "resume is not bit-exact"; fi

# the same run spread over 2 processes by mpirun saves the same bytes
if command -v mpirun >/dev/null 2>&1; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  # Open MPI keeps what it allocates at MPI_Init until exit, in components it
  # unloads: under AddressSanitizer the processes of mpirun skip the leak
  # report (one-process runs above keep it; only net.c is MPI-only)
  asan_mpi="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
  if ASAN_OPTIONS=$asan_mpi mpirun -np 2 "$WEFT" run $A --steps 3 --save "$tmp/m3.st" >"$tmp/mpi.out" 2>&1; then
    if cmp -s "$tmp/m3.st" "$tmp/b3.st" && grep -q "in 2 processes" "$tmp/mpi.out"; then ok; echo "run: mpirun -np 2 == one process, byte for byte"
    else bad "mpirun -np 2 differs from one process"; cat "$tmp/mpi.out"; fi
  else bad "mpirun -np 2 weft run"; cat "$tmp/mpi.out"; fi
  if ASAN_OPTIONS=$asan_mpi mpirun -np 2 "$WEFT" run examples/gpt_megatron.plan $MEG --steps 2 --check >"$tmp/mpi.out" 2>&1 &&
     grep -q "match$" "$tmp/mpi.out"; then ok; echo "run: mpirun -np 2 megatron tp2 pp2 dp2 matches one device"
  else bad "mpirun -np 2 megatron --check"; cat "$tmp/mpi.out"; fi
  # a stopped process: the other gives up after --timeout, and MPI_Abort
  # ends the run; no process is left behind
  (ASAN_OPTIONS=$asan_mpi mpirun -np 2 "$WEFT" run $A --steps 100000 --timeout 2 >"$tmp/stop.out" 2>&1; echo "$?" >"$tmp/stop.rc") &
  runner=$!
  ranks=""; n=0
  while [ $n -lt 100 ] && ! grep -q "^step 2 " "$tmp/stop.out" 2>/dev/null; do sleep 0.1; n=$((n+1)); done
  mp=$(pgrep -P $runner mpirun | head -1)
  [ -n "$mp" ] && ranks=$(pgrep -P "$mp")
  victim=$(echo "$ranks" | tail -1)
  if [ -n "$victim" ] && kill -STOP "$victim"; then
    n=0; while [ $n -lt 150 ] && [ ! -f "$tmp/stop.rc" ]; do sleep 0.1; n=$((n+1)); done
    # the stopped one ends once it may run again
    kill -CONT "$victim" 2>/dev/null
    n=0; left=x
    while [ $n -lt 80 ] && [ -n "$left" ]; do
      left=$(for r in $ranks; do kill -0 "$r" 2>/dev/null && echo "$r"; done); sleep 0.1; n=$((n+1))
    done
    if [ -f "$tmp/stop.rc" ] && [ "$(cat "$tmp/stop.rc")" != 0 ] && grep -q "it did not come (--timeout)" "$tmp/stop.out" && [ -z "$left" ]; then
      ok; echo "run: mpirun -np 2 with a process stopped: the other gives up after --timeout 2, every process ends"
    else bad "a stopped process under mpirun: $(cat "$tmp/stop.rc" 2>/dev/null), left: $left"; grep -v "^step" "$tmp/stop.out"; fi
    for r in $ranks; do kill -CONT "$r" 2>/dev/null; kill -9 "$r" 2>/dev/null; done
  else bad "mpirun -np 2: no process to stop"; cat "$tmp/stop.out"; fi
  wait $runner 2>/dev/null
  # mpirun killed: its processes see it gone and end
  ASAN_OPTIONS=$asan_mpi mpirun -np 2 "$WEFT" run $A --steps 100000 >"$tmp/orphan.out" 2>&1 &
  runner=$!
  n=0; while [ $n -lt 100 ] && ! grep -q "^step 2 " "$tmp/orphan.out" 2>/dev/null; do sleep 0.1; n=$((n+1)); done
  ranks=$(pgrep -P $runner)
  kill -9 $runner
  wait $runner 2>/dev/null
  n=0; left=x
  while [ $n -lt 100 ] && [ -n "$left" ]; do
    left=$(for r in $ranks; do kill -0 "$r" 2>/dev/null && echo "$r"; done); sleep 0.1; n=$((n+1))
  done
  if [ -n "$ranks" ] && [ -z "$left" ]; then ok; echo "run: mpirun killed: its processes end within $((n / 10)) s"
  else bad "mpirun killed: processes left ($left of $ranks)"; for r in $left; do kill -9 "$r"; done; fi
else
  echo "run: mpirun not installed, the 2-process case is skipped (make deps installs openmpi-bin)"
fi

# SIGKILL while the checkpoint is written leaves the old one intact
cp "$tmp/a2.st" "$tmp/k.st"
WEFT_TEST_SAVE_PAUSE=5000 "$WEFT" run $A --steps 1 --save "$tmp/k.st" >/dev/null 2>&1 &
pid=$!
sleep 1.5
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
if cmp -s "$tmp/k.st" "$tmp/a2.st" && "$WEFT" run $A --steps 0 --resume "$tmp/k.st" >/dev/null 2>&1; then ok
  echo "run: killed while saving, the previous checkpoint is intact and loads"
else bad "a run killed while saving damaged the checkpoint"; fi

# the temporary of a save killed with SIGKILL is removed by the next save
# to the same name; a SIGTERM during a save removes its own
ls -A "$tmp" | grep -q '^\.k\.st\..*\.tmp$' || bad "the killed save left no temporary to clean"
"$WEFT" run $A --steps 0 --resume "$tmp/k.st" --save "$tmp/k.st" >/dev/null 2>&1
if ls -A "$tmp" | grep -q '^\.k\.st\..*\.tmp$'; then bad "the next save left the stale temporary"; ls -A "$tmp"
else ok; echo "run: the next save to the name removes a killed save's temporary"; fi
WEFT_TEST_SAVE_PAUSE=5000 "$WEFT" run $A --steps 0 --resume "$tmp/k.st" --save "$tmp/k.st" >/dev/null 2>&1 &
pid=$!
n=0; while [ $n -lt 50 ] && ! ls -A "$tmp" | grep -q '^\.k\.st\..*\.tmp$'; do sleep 0.1; n=$((n+1)); done
kill -TERM $pid 2>/dev/null
wait $pid 2>/dev/null
if [ $n -lt 50 ] && ! ls -A "$tmp" | grep -q '^\.k\.st\..*\.tmp$' && cmp -s "$tmp/k.st" "$tmp/a2.st"; then ok
  echo "run: SIGTERM while saving removes the temporary, the checkpoint stays as it was"
else bad "SIGTERM while saving: $(ls -A "$tmp")"; fi

# bad files: each refused with a message naming the tensor
expect_err() {
  want=$1; shift
  if "$WEFT" run "$@" >"$tmp/out" 2>"$tmp/err"; then bad "weft run $* succeeded"; return; fi
  if grep -qF -- "$want" "$tmp/err"; then ok; else bad "weft run $*: expected '$want' in"; cat "$tmp/err"; fi
}
G="examples/gpt2.plan --plan tp2 --set hidden=64 --set heads=4 --set seq=16 --set batch=8"
"$WEFT" run $G --set layers=12 --set vocab=256 --steps 0 --save "$tmp/w12.st" >/dev/null &&
"$WEFT" run $G --set layers=11 --set vocab=256 --steps 0 --save "$tmp/w11.st" >/dev/null &&
"$WEFT" run $G --set layers=12 --set vocab=128 --steps 0 --save "$tmp/v128.st" >/dev/null || bad "weft run --steps 0 --save"
S="$G --set layers=12 --set vocab=256"
expect_err "tensor wte.weight has shape [128, 64]; the model needs [256, 64]" $S --load "$tmp/v128.st"
expect_err "no tensor h.11.ln_1.weight" $S --load "$tmp/w11.st"
expect_err "tensor h.11.attn.c_attn.bias is not a parameter of model gpt2" $G --set layers=11 --set vocab=256 --load "$tmp/w12.st"
expect_err "nonexistent.st" $S --resume "$tmp/nonexistent.st"
expect_err "no tensor tokens" $S --inputs "$tmp/w12.st"
expect_err "backend 'cuda' is not available" $S --backend cuda
expect_err "--load and --resume exclude each other" $S --load "$tmp/w12.st" --resume "$tmp/w12.st"
expect_err "--steps needs a number" $S --steps -1

echo "run: $pass passed, $fail failed"
[ "$fail" = 0 ]
