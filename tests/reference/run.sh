#!/bin/sh
# run.sh - weft's CPU backend against an independent PyTorch GPT-2.
# A small GPT-2 is trained 3 AdamW steps by PyTorch (gpt2_torch.py, itself
# checked by selfcheck.py) and by `weft run` under each plan below, and every
# parameter, both AdamW moments of every parameter and every step's loss must
# agree (README.md: what is compared, and the tolerances).
# Usage: sh tests/reference/run.sh ./weft     (from the repository root)
# BACKEND=cuda runs weft on that backend (its plugin as weft finds it, or
# in WEFT_PLUGIN_DIR); PY names another python3 with torch and numpy.
WEFT=${1:-./weft}
PY=${PY:-/usr/bin/python3}
BACKEND=${BACKEND:-cpu}
STEPS=3
PYTHONDONTWRITEBYTECODE=1
export PYTHONDONTWRITEBYTECODE

if ! "$PY" -c 'import torch, numpy' >/dev/null 2>&1; then
  echo "reference: skipped (PyTorch not installed; make deps-torch installs it)"
  exit 0
fi

here=$(cd "$(dirname "$0")" && pwd)
case $WEFT in
  /*) ;;
  */*) WEFT=$PWD/$WEFT ;;
esac
cd "$here/../.." || exit 2

# The model. tp2_pp2's stages name h[0..6] and h[6..12], so the model needs
# at least 7 layers for its second stage to hold one.
LAYERS=8 HIDDEN=64 HEADS=4 SEQ=32 VOCAB=256 BATCH=8
sizes="--layers $LAYERS --hidden $HIDDEN --heads $HEADS --seq $SEQ --vocab $VOCAB --batch $BATCH"
sets="--set layers=$LAYERS --set hidden=$HIDDEN --set heads=$HEADS --set seq=$SEQ --set vocab=$VOCAB --set batch=$BATCH"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
fail=0

indent() { sed -n '1,30s/^/  /p' "$@"; }

# The reference checks itself first: numpy forward, finite differences, AdamW.
if "$PY" "$here/selfcheck.py" >"$tmp/self.log" 2>&1; then
  echo "reference: torch self-check ok"
else
  echo "reference: FAIL torch self-check (the reference itself is wrong)"
  indent "$tmp/self.log"
  exit 1
fi

# Inputs, the float32 reference, and the same training in float64, which
# measures how far float32 rounding alone moves each tensor.
# shellcheck disable=SC2086
if ! "$PY" "$here/gpt2_torch.py" make-inputs $sizes --seed 1 \
       --weights "$tmp/weights.safetensors" --inputs "$tmp/inputs.safetensors" >"$tmp/ref.log" 2>&1 ||
   ! "$PY" "$here/gpt2_torch.py" train --weights "$tmp/weights.safetensors" --inputs "$tmp/inputs.safetensors" \
       --steps $STEPS --out "$tmp/ref.safetensors" --json "$tmp/ref.json" >>"$tmp/ref.log" 2>&1 ||
   ! "$PY" "$here/gpt2_torch.py" train --weights "$tmp/weights.safetensors" --inputs "$tmp/inputs.safetensors" \
       --steps $STEPS --dtype float64 --out "$tmp/ref64.safetensors" --json "$tmp/ref64.json" >>"$tmp/ref.log" 2>&1; then
  echo "reference: FAIL the PyTorch reference did not run"
  indent "$tmp/ref.log"
  exit 1
fi

for plan in tp2_pp2 dp; do
  # shellcheck disable=SC2086
  "$WEFT" run examples/gpt2.plan --plan $plan $sets --backend "$BACKEND" \
    --load "$tmp/weights.safetensors" --inputs "$tmp/inputs.safetensors" --steps $STEPS \
    --save "$tmp/$plan.safetensors" --json >"$tmp/$plan.json" 2>"$tmp/$plan.err"
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "reference: $plan on $BACKEND FAIL (weft run exited $rc)"
    indent "$tmp/$plan.err"
    fail=1
    continue
  fi
  if "$PY" "$here/gpt2_torch.py" compare --ours "$tmp/$plan.safetensors" --ref "$tmp/ref.safetensors" \
       --ours-json "$tmp/$plan.json" --ref-json "$tmp/ref.json" \
       --noise "$tmp/ref64.safetensors" --noise-json "$tmp/ref64.json" \
       --rtol 1e-5 --noise-factor 10 >"$tmp/$plan.cmp" 2>&1; then
    worst=$(sed -n 's/^compare: ok: .*; max rel err \([^ ]*\) .*; worst error\/tolerance \([^ ]*\) .*/\1, at most \2 of a tolerance/p' "$tmp/$plan.cmp")
    echo "reference: $plan on $BACKEND ok (max rel err $worst)"
  else
    echo "reference: $plan on $BACKEND FAIL (weft's numerics differ from PyTorch's)"
    indent "$tmp/$plan.cmp"
    fail=1
  fi
done
exit $fail
