#!/bin/sh
# limits_check.sh - what is legal but huge, or a file that would block, is
# answered at once: each case below ends within 5 s and 1 GB of address
# space (not under AddressSanitizer, whose shadow memory needs more), with
# the exit status and the message it names. The cases are those of plans
# and files from elsewhere that used to cost minutes and gigabytes, or to
# wait forever.
#   sh tests/limits_check.sh WEFT
WEFT=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0

# case NAME STATUS MESSAGE ARGS...
case_() {
  name=$1 want=$2 msg=$3; shift 3
  start=$(date +%s%N)
  (if [ -z "${LIMITS_NO_ULIMIT:-}" ]; then ulimit -v 1000000 2>/dev/null; fi
   cd "$tmp" && timeout 5 "$WEFT" "$@") >"$tmp/out" 2>&1 </dev/null
  rc=$?
  t=$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')
  if [ $rc -eq "$want" ] && grep -qF -- "$msg" "$tmp/out"; then
    pass=$((pass + 1)); printf 'limits: %s: exit %d in %s s: %s\n' "$name" $rc "$t" "$msg"
  else
    fail=$((fail + 1)); echo "FAIL: $name: exit $rc (wanted $want with '$msg') in $t s"; head -5 "$tmp/out"
  fi
}

cat >"$tmp/tiny.plan" <<'PLAN'
use std
model tiny(batch = 1000000, dim = 4) {
  input x : f32[batch, dim]
  input y : f32[batch, dim]
  param w1 : f32[dim, dim]
  h = matmul(x, w1)
  loss = mse(h, y)
  train sgd(lr = 0.01)
}
PLAN
{ cat "$tmp/tiny.plan"; cat <<'PLAN'
plan pipe for tiny on cpus(2) {
  mesh m = devices as [pp = 2]
  split all on batch into 1000000 as mb in time
  stage s0 = {h}, s1 = {loss}
  assign s0 -> m[0], s1 -> m[1]
  schedule one_f_one_b
}
PLAN
} >"$tmp/microbatches.plan"
{ cat "$tmp/tiny.plan"; printf 'plan sp for tiny on cpus(1) {\n  split all on batch into 1000000\n  assign all -> 0\n}\n'; } >"$tmp/split.plan"
for n in 1000000 100000; do
  { cat "$tmp/tiny.plan"; printf 'plan dp for tiny on cpus(%d) {\n  mesh m = devices as [dp = %d]\n  split all on batch into dp\n  assign all -> m[dp]\n}\n' $n $n; } >"$tmp/mesh$n.plan"
done
cp "$root/examples/gpt2.plan" "$tmp/"
mkfifo "$tmp/fifo.plan" "$tmp/fifo.st"
printf 'use "./fifo.plan"\n' >"$tmp/use_fifo.plan"
{ cat "$tmp/tiny.plan"; printf 'plan one for tiny on cpus(1) {\n  assign all -> 0\n}\n'; } | sed 's/batch = 1000000/batch = 8/' >"$tmp/one.plan"

case_ "--set layers=1000000" 1 "this loop would take about" check gpt2.plan --set layers=1000000
case_ "--set layers=100000" 1 "more than a model may have (100000)" check gpt2.plan --set layers=100000
case_ "a million micro-batches in 1F1B" 1 "1000000 micro-batches, more than weft supports" check microbatches.plan
case_ "a split into a million parts" 1 "would have 1000000 sub-operators, more than weft supports" check split.plan
case_ "a mesh of a million devices" 1 "has 1000000 devices, more than weft supports" check mesh1000000.plan
case_ "estimate of a 100,000-device mesh" 1 "has 100000 devices, more than weft supports" estimate mesh100000.plan
case_ "a FIFO as the plan" 2 "a FIFO, not a regular file" check fifo.plan
case_ "a FIFO as a module" 1 "a FIFO, not a regular file" check use_fifo.plan
case_ "a FIFO as --load" 1 "a FIFO, not a regular file" run one.plan --load fifo.st
case_ "a FIFO as --inputs" 1 "a FIFO, not a regular file" run one.plan --inputs fifo.st
case_ "a FIFO as --resume" 1 "a FIFO, not a regular file" run one.plan --resume fifo.st
case_ "a FIFO as --data" 1 "a FIFO, not a regular file" run "$root/tests/golden/run/train_data_dir.plan" --data fifo.st
case_ "a FIFO as --save" 2 "a FIFO, not a regular file" run one.plan --save fifo.st
case_ "/dev/null as --svg" 2 "a character device, not a regular file" estimate one.plan --svg /dev/null
case_ "a checkpoint's step of 2^63 - 1" 1 "is not a count of steps" run "$root/tests/golden/untrusted/tiny.plan" \
  --resume "$root/tests/golden/untrusted/data/step_int64_max.safetensors"
case_ "weights of 3e38" 1 "training stops before the optimizer takes it" run "$root/tests/golden/untrusted/tiny.plan" \
  --resume "$root/tests/golden/untrusted/data/huge_weight.safetensors"
echo "limits: $pass passed, $fail failed"
[ $fail -eq 0 ]
