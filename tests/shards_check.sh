#!/bin/sh
# shards_check.sh - sharded checkpoints of weft run on the CPU backend: a
# set saved by 4 processes under one plan resumes under other plans with 2
# processes and with one, to the losses of a run without a stop; a save
# killed at any point leaves the previous set whole and loadable.
WEFT=$1
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT

GPT="--set layers=12 --set hidden=64 --set heads=4 --set seq=16 --set vocab=256 --set batch=8"
A="examples/gpt2.plan $GPT --seed 7"

# losses FILE: the losses of a --json run, one a line
losses() { python3 -c 'import json, sys; [print(repr(s["loss"])) for s in json.load(open(sys.argv[1]))["steps"]]' "$1"; }
# close A B: every loss of B within 1e-5 relative of A's last ones (--check's tolerance)
close() {
  python3 - "$1" "$2" <<'PY'
import json, sys
a = [s["loss"] for s in json.load(open(sys.argv[1]))["steps"]]
b = [s["loss"] for s in json.load(open(sys.argv[2]))["steps"]]
a = a[len(a) - len(b):]
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print("%.2g" % worst)
sys.exit(0 if b and worst <= 1e-5 else 1)
PY
}

# the run without a stop: 4 steps on one device
"$WEFT" run $A --plan single --steps 4 --json >"$tmp/straight.json" || bad "the straight run"
"$WEFT" run $A --plan tp2_pp2 --steps 4 --save "$tmp/tp2pp2_4.st" >/dev/null || bad "the straight tp2_pp2 run"

if command -v mpirun >/dev/null 2>&1; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  asan_mpi="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
  # tp2 x pp2 over 4 processes, 2 steps, a set of 4 shards
  if ASAN_OPTIONS=$asan_mpi mpirun -np 4 "$WEFT" run $A --plan tp2_pp2 --steps 2 --save "$tmp/set/" >"$tmp/np4.out" 2>&1 &&
     [ "$(ls "$tmp/set" | grep -c '^model-0000[1-4]-of-00004\.safetensors$')" = 4 ] && [ -f "$tmp/set/model.safetensors.index.json" ] &&
     grep -q "in 4 processes" "$tmp/np4.out"; then ok; echo "shards: mpirun -np 4 tp2_pp2 saved 4 shards and the index"
  else bad "mpirun -np 4 sharded save"; cat "$tmp/np4.out"; ls -A "$tmp/set"; fi
  # resumed by 2 processes under tp2, 2 more steps
  if ASAN_OPTIONS=$asan_mpi mpirun -np 2 "$WEFT" run $A --plan tp2 --steps 2 --resume "$tmp/set/" --json >"$tmp/np2.json" 2>"$tmp/np2.err" &&
     e=$(close "$tmp/straight.json" "$tmp/np2.json"); then ok
    echo "shards: 4 shards of tp2_pp2, resumed by mpirun -np 2 under tp2: steps 3 and 4 within $e of 4 steps on one device"
  else bad "mpirun -np 2 tp2 resume of the set ($e)"; cat "$tmp/np2.err"; fi
  # 3 processes under tp2_pp2 again: the bytes of 4 steps straight
  if ASAN_OPTIONS=$asan_mpi mpirun -np 3 "$WEFT" run $A --plan tp2_pp2 --steps 2 --resume "$tmp/set/" --save "$tmp/np3.st" >"$tmp/np3.out" 2>&1 &&
     cmp -s "$tmp/np3.st" "$tmp/tp2pp2_4.st"; then ok
    echo "shards: resumed by mpirun -np 3 under tp2_pp2: 2 + 2 steps == 4 steps, byte for byte"
  else bad "mpirun -np 3 tp2_pp2 resume of the set"; cat "$tmp/np3.out"; fi
else
  echo "shards: mpirun not installed, the set is saved by one process (make deps installs openmpi-bin)"
  "$WEFT" run $A --plan tp2_pp2 --steps 2 --save "$tmp/set/" >/dev/null || bad "the sharded save"
fi
# resumed by one process under dp (ZeRO-3: state cut another way), 2 more steps
if "$WEFT" run $A --plan dp_zero3 --steps 2 --resume "$tmp/set/" --json >"$tmp/np1.json" 2>"$tmp/np1.err" &&
   e=$(close "$tmp/straight.json" "$tmp/np1.json"); then ok
  echo "shards: the set resumed by one process under dp_zero3: steps 3 and 4 within $e of 4 steps on one device"
else bad "one-process dp_zero3 resume of the set ($e)"; cat "$tmp/np1.err"; fi

# killed while it saves, before the index and after it (before the set is
# renamed into place): the previous set stays as it was, and loads
"$WEFT" run $A --plan tp2_pp2 --steps 1 --save "$tmp/k/" >/dev/null || bad "a one-process sharded save"
cp -r "$tmp/k" "$tmp/k.before"
for when in "its shards" "its shards and index, before the rename"; do
  WEFT_TEST_SAVE_PAUSE=3000 "$WEFT" run $A --plan tp2_pp2 --steps 1 --resume "$tmp/k/" --save "$tmp/k/" >/dev/null 2>&1 &
  pid=$!
  n=0
  if [ "$when" = "its shards" ]; then
    while [ $n -lt 100 ] && ! ls -A "$tmp/.k.partial" 2>/dev/null | grep -q '\.tmp$'; do sleep 0.05; n=$((n+1)); done
  else
    while [ $n -lt 200 ] && [ ! -f "$tmp/.k.partial/model.safetensors.index.json" ]; do sleep 0.05; n=$((n+1)); done
  fi
  kill -9 $pid 2>/dev/null
  wait $pid 2>/dev/null
  if [ -d "$tmp/.k.partial" ] && diff -r "$tmp/k" "$tmp/k.before" >/dev/null &&
     "$WEFT" run $A --plan tp2 --steps 0 --resume "$tmp/k/" >/dev/null 2>&1; then ok
    echo "shards: killed while writing $when, the previous set is intact and loads"
  else bad "killed while writing $when: $(ls -A "$tmp" "$tmp/.k.partial" 2>&1 | tr '\n' ' ')"; fi
done
# the next save removes what the killed one left, and replaces the set
"$WEFT" run $A --plan tp2_pp2 --steps 1 --resume "$tmp/k/" --save "$tmp/k/" >/dev/null 2>&1
if [ ! -e "$tmp/.k.partial" ] && [ ! -e "$tmp/.k.old" ] && grep -q '"step": "2"' "$tmp/k/model.safetensors.index.json"; then ok
  echo "shards: the next save removes a killed save's directory and replaces the set"
else bad "the save after a killed one: $(ls -A "$tmp" | tr '\n' ' ')"; fi
# periodic sets, the last 2 kept
"$WEFT" run $A --plan tp2 --steps 3 --save "$tmp/p/" --save-every 1 --keep 2 >/dev/null 2>&1
if [ "$(ls -d "$tmp"/p-step* | tr '\n' ' ')" = "$tmp/p-step2 $tmp/p-step3 " ] && [ -f "$tmp/p-step3/model.safetensors.index.json" ]; then ok
  echo "shards: --save-every 1 --keep 2 keeps the sets of steps 2 and 3"
else bad "periodic sets: $(ls -A "$tmp" | tr '\n' ' ')"; fi

echo "shards: $pass passed, $fail failed"
[ "$fail" = 0 ]
