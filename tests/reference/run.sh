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
# AdamW's eps for every training below, torch's and weft's: 1e-6, not the
# default 1e-8, so that no element's update is decided by rounding alone
# (README.md: "AdamW's eps").
EPS=1e-6

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# stopped (a time limit's TERM): the scratch goes, and nothing runs on
trap 'echo "reference: stopped by a signal"; exit 2' INT TERM
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
# The tolerance rule below, tried on torch alone: correct reorderings of the
# sums pass it, simulated bugs fail it (tolerance.py); on the CPU backend's
# run also with torch's default eps, which README.md compares.
for eps in "$EPS" $([ "$BACKEND" = cpu ] && echo 1e-8); do
  if "$PY" "$here/tolerance.py" --eps "$eps" >"$tmp/tol.log" 2>&1; then
    echo "reference: $(tail -n 1 "$tmp/tol.log" | sed 's/^tolerance: /tolerance rule, /')"
  else
    echo "reference: FAIL the tolerance rule (tolerance.py --eps $eps)"
    indent "$tmp/tol.log"
    exit 1
  fi
done

# Inputs, the float32 reference, and the same training in float64, which
# measures how far float32 rounding alone moves each tensor, for each
# schedule below.
# shellcheck disable=SC2086
if ! "$PY" "$here/gpt2_torch.py" make-inputs $sizes --seed 1 \
       --weights "$tmp/weights.safetensors" --inputs "$tmp/inputs.safetensors" >"$tmp/ref.log" 2>&1; then
  echo "reference: FAIL the PyTorch reference did not run"
  indent "$tmp/ref.log"
  exit 1
fi
reference() {  # NAME OPTIONS...: ref-NAME.safetensors/json and ref64-NAME.*
  name=$1; shift
  "$PY" "$here/gpt2_torch.py" train --weights "$tmp/weights.safetensors" --inputs "$tmp/inputs.safetensors" \
       --steps $STEPS --eps $EPS "$@" --out "$tmp/ref-$name.safetensors" --json "$tmp/ref-$name.json" >>"$tmp/ref.log" 2>&1 &&
  "$PY" "$here/gpt2_torch.py" train --weights "$tmp/weights.safetensors" --inputs "$tmp/inputs.safetensors" \
       --steps $STEPS --eps $EPS "$@" --dtype float64 --out "$tmp/ref64-$name.safetensors" --json "$tmp/ref64-$name.json" \
       >>"$tmp/ref.log" 2>&1
}
# the options of both gpt2_torch.py train and weft run: torch's
# CosineAnnealingLR (cosine without warmup) and LambdaLR, clip_grad_norm_
COSINE="--lr-schedule cosine --clip 0.5"
LINEAR="--lr-schedule linear --warmup 1 --lr-min 6e-5 --clip 0.3"
# shellcheck disable=SC2086
if ! reference plain || ! reference cosine $COSINE || ! reference linear $LINEAR ||
   ! reference cosine-unclipped --lr-schedule cosine; then
  echo "reference: FAIL the PyTorch reference did not run"
  indent "$tmp/ref.log"
  exit 1
fi

# compare OURS REF: weft's files against the reference's, within tolerance
compare() {
  "$PY" "$here/gpt2_torch.py" compare --ours "$tmp/$1.safetensors" --ref "$tmp/ref-$2.safetensors" \
       --ours-json "$tmp/$1.json" --ref-json "$tmp/ref-$2.json" \
       --noise "$tmp/ref64-$2.safetensors" --noise-json "$tmp/ref64-$2.json" \
       --rtol 1e-5 --noise-factor 10 >"$tmp/$1.cmp" 2>&1
}

# the plan, the schedule's name, weft run's options for it
while read -r plan name opts; do
  label="$plan${opts:+ ($opts)}"
  # shellcheck disable=SC2086
  "$WEFT" run examples/gpt2.plan --plan $plan $sets --set eps=$EPS --backend "$BACKEND" \
    --load "$tmp/weights.safetensors" --inputs "$tmp/inputs.safetensors" --steps $STEPS $opts \
    --save "$tmp/$plan-$name.safetensors" --json >"$tmp/$plan-$name.json" 2>"$tmp/$plan.err"
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "reference: $label on $BACKEND FAIL (weft run exited $rc)"
    indent "$tmp/$plan.err"
    fail=1
    continue
  fi
  if compare "$plan-$name" "$name"; then
    worst=$(sed -n 's/^compare: ok: .*; max rel err \([^ ]*\) .*; worst error\/tolerance \([^ ]*\) .*/\1, at most \2 of a tolerance/p' "$tmp/$plan-$name.cmp")
    echo "reference: $label on $BACKEND ok (max rel err $worst)"
  else
    echo "reference: $label on $BACKEND FAIL (weft's numerics differ from PyTorch's)"
    indent "$tmp/$plan-$name.cmp"
    fail=1
  fi
done <<EOF
tp2_pp2 plain
dp plain
tp2_pp2 cosine $COSINE
dp linear $LINEAR
EOF

# Clipping is measured, not assumed: torch's gradient norm exceeded the
# bound at every step of the clipped schedules, and weft's clipped cosine
# run is out of tolerance of torch's cosine without clipping.
if "$PY" - "$tmp/ref-cosine.json" 0.5 "$tmp/ref-linear.json" 0.3 <<'EOF'
import json, sys
for path, bound in zip(sys.argv[1::2], sys.argv[2::2]):
    with open(path) as f:
        norms = [s["grad_norm"] for s in json.load(f)["steps"]]
    if not all(n > float(bound) for n in norms):
        sys.exit(f"{path}: gradient norms {norms} do not all exceed {bound}")
EOF
then
  if compare tp2_pp2-cosine cosine-unclipped; then
    echo "reference: FAIL weft's clipped run matches torch's unclipped one: the comparison cannot see clipping"
    fail=1
  else
    ratio=$(sed -n 's/^compare: FAIL: .*; worst error\/tolerance \([^ ]*\) .*/\1/p' "$tmp/tp2_pp2-cosine.cmp")
    echo "reference: clipping is active at every step; without it torch is $ratio tolerances away"
  fi
else
  echo "reference: FAIL the clipped schedules never clipped"
  fail=1
fi

# The mixture of experts (moe_torch.py): examples/moe.plan's moe_gpt trained
# 3 AdamW steps by PyTorch and by weft under three plans, with a capacity
# factor that drops most choices and one that drops none; the loss includes
# the load-balancing losses. The comparison sees both: weft's run is out of
# tolerance of torch's without the auxiliary loss, and of torch's with the
# other capacity.
MOE="--layers 2 --hidden 64 --heads 4 --seq 16 --vocab 128 --batch 8 --experts 8 --top-k 2 --ffn 128 --aux-loss 0.01"
for cf in 0.5 4; do
  m="$tmp/moe$cf"
  # shellcheck disable=SC2086
  if ! "$PY" "$here/moe_torch.py" make-inputs $MOE --capacity-factor $cf --seed 2 --weights "$m-w.safetensors" \
         --inputs "$m-i.safetensors" >"$tmp/moe.log" 2>&1 ||
     ! "$PY" "$here/moe_torch.py" train --weights "$m-w.safetensors" --inputs "$m-i.safetensors" --steps $STEPS --eps $EPS \
         --out "$tmp/ref-moe$cf.safetensors" --json "$tmp/ref-moe$cf.json" >>"$tmp/moe.log" 2>&1 ||
     ! "$PY" "$here/moe_torch.py" train --weights "$m-w.safetensors" --inputs "$m-i.safetensors" --steps $STEPS --eps $EPS \
         --dtype float64 --out "$tmp/ref64-moe$cf.safetensors" --json "$tmp/ref64-moe$cf.json" >>"$tmp/moe.log" 2>&1 ||
     ! "$PY" "$here/moe_torch.py" train --weights "$m-w.safetensors" --inputs "$m-i.safetensors" --steps $STEPS --eps $EPS \
         --aux-loss 0 --out "$tmp/ref-moe$cf-noaux.safetensors" --json "$tmp/ref-moe$cf-noaux.json" >>"$tmp/moe.log" 2>&1 ||
     ! "$PY" "$here/moe_torch.py" train --weights "$m-w.safetensors" --inputs "$m-i.safetensors" --steps $STEPS --eps $EPS \
         --aux-loss 0 --dtype float64 --out "$tmp/ref64-moe$cf-noaux.safetensors" --json "$tmp/ref64-moe$cf-noaux.json" \
         >>"$tmp/moe.log" 2>&1 ||
     ! share=$("$PY" "$here/moe_torch.py" dropped --weights "$m-w.safetensors" --inputs "$m-i.safetensors" 2>>"$tmp/moe.log")
  then
    echo "reference: FAIL the PyTorch MoE reference did not run"
    indent "$tmp/moe.log"
    exit 1
  fi
  for plan in single ep2 ep2_tp2_dp2; do
    label="moe $plan, capacity factor $cf ($share of the first layer's choices dropped)"
    "$WEFT" run examples/moe.plan --plan $plan --set capacity_factor=$cf --set eps=$EPS --backend "$BACKEND" \
      --load "$m-w.safetensors" --inputs "$m-i.safetensors" --steps $STEPS \
      --save "$tmp/moe$cf-$plan.safetensors" --json >"$tmp/moe$cf-$plan.json" 2>"$tmp/moe.err"
    rc=$?
    if [ $rc -ne 0 ]; then
      echo "reference: $label on $BACKEND FAIL (weft run exited $rc)"
      indent "$tmp/moe.err"
      fail=1
    elif compare "moe$cf-$plan" "moe$cf"; then
      worst=$(sed -n 's/^compare: ok: .*; max rel err \([^ ]*\) .*; worst error\/tolerance \([^ ]*\) .*/\1, at most \2 of a tolerance/p' "$tmp/moe$cf-$plan.cmp")
      echo "reference: $label on $BACKEND ok (max rel err $worst)"
    else
      echo "reference: $label on $BACKEND FAIL (weft's numerics differ from PyTorch's)"
      indent "$tmp/moe$cf-$plan.cmp"
      fail=1
    fi
  done
done
# the comparison can tell: without the auxiliary loss, or with the other
# capacity, torch's training is out of tolerance of weft's (each with the
# tolerances of its own float64 run)
for other in "moe0.5-noaux without the load-balancing loss" "moe4 with a capacity that drops nothing"; do
  set -- $other
  name=$1; shift
  if compare moe0.5-single "$name"; then
    echo "reference: FAIL weft's MoE run matches torch's $*: the comparison cannot see it"
    fail=1
  else
    ratio=$(sed -n 's/^compare: FAIL: .*; worst error\/tolerance \([^ ]*\) .*/\1/p' "$tmp/moe0.5-single.cmp")
    echo "reference: $*, torch is $ratio tolerances away from weft's run"
  fi
done

# The Swin Transformer (swin_torch.py): examples/swin.plan's swin_small
# trained 3 AdamW steps by PyTorch and by weft under its plans, from weft's
# own initial parameters (`--steps 0 --save`; make-inputs perturbs the
# biases and norms and scales the bias tables). Three stages (the third's
# grid no larger than its window: one window, no shift) under `single`,
# `megatron` and `coshard`; `windows` splits every stage's rows of windows
# in two, so it runs the example's two stages. Torch's training with the
# windows never shifted, without the relative position bias, or shifted
# without the mask must be out of tolerance of weft's.
swin_model() {  # TAG DEPTHS HEADS [VARIANT...]: weft's initial parameters, then ref-TAG and ref64-TAG (and -VARIANT)
  tag=$1 depths=$2 heads=$3; shift 3
  s="$tmp/$tag"
  "$WEFT" run examples/swin.plan --plan single --set "depths=[$depths]" --set "heads=[$heads]" --steps 0 \
       --save "$s-init.safetensors" >>"$tmp/swin.log" 2>&1 &&
  "$PY" "$here/swin_torch.py" make-inputs --image 32 --patch 2 --channels 3 --embed 32 --depths "$depths" \
       --heads "$heads" --window 4 --mlp-ratio 4 --classes 10 --batch 4 --seed 3 --init "$s-init.safetensors" \
       --weights "$s-w.safetensors" --inputs "$s-i.safetensors" >>"$tmp/swin.log" 2>&1 || return 1
  for variant in "" "$@"; do
    for dtype in float32 float64; do
      out=ref$([ $dtype = float64 ] && echo 64)-$tag${variant:+-$variant}
      "$PY" "$here/swin_torch.py" train --weights "$s-w.safetensors" --inputs "$s-i.safetensors" --steps $STEPS --eps $EPS \
           ${variant:+--variant $variant} --dtype $dtype --out "$tmp/$out.safetensors" --json "$tmp/$out.json" \
           >>"$tmp/swin.log" 2>&1 || return 1
    done
  done
}
: >"$tmp/swin.log"
if ! swin_model swin 2,2,2 4,8,16 no-shift no-bias no-mask || ! swin_model swin2 2,2 4,8; then
  echo "reference: FAIL the PyTorch Swin reference did not run"
  indent "$tmp/swin.log"
  exit 1
fi
while read -r tag plan depths heads opts; do
  label="swin $plan, depths [$depths]${opts:+ ($opts)}"
  # shellcheck disable=SC2086
  "$WEFT" run examples/swin.plan --plan $plan --set "depths=[$depths]" --set "heads=[$heads]" --set eps=$EPS $opts \
    --backend "$BACKEND" --load "$tmp/$tag-w.safetensors" --inputs "$tmp/$tag-i.safetensors" --steps $STEPS \
    --save "$tmp/$tag-$plan.safetensors" --json >"$tmp/$tag-$plan.json" 2>"$tmp/swin.err"
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "reference: $label on $BACKEND FAIL (weft run exited $rc)"
    indent "$tmp/swin.err"
    fail=1
  elif compare "$tag-$plan" "$tag"; then
    worst=$(sed -n 's/^compare: ok: .*; max rel err \([^ ]*\) .*; worst error\/tolerance \([^ ]*\) .*/\1, at most \2 of a tolerance/p' "$tmp/$tag-$plan.cmp")
    echo "reference: $label on $BACKEND ok (max rel err $worst)"
  else
    echo "reference: $label on $BACKEND FAIL (weft's numerics differ from PyTorch's)"
    indent "$tmp/$tag-$plan.cmp"
    fail=1
  fi
done <<EOF
swin single 2,2,2 4,8,16
swin megatron 2,2,2 4,8,16 --set tp=2
swin coshard 2,2,2 4,8,16 --set tp=2 --set parts=4
swin2 windows 2,2 4,8
EOF
for other in "no-shift with the windows never shifted" "no-bias without the relative position bias" \
             "no-mask with shifted windows but no mask"; do
  set -- $other
  name=$1; shift
  if compare swin-single "swin-$name"; then
    echo "reference: FAIL weft's Swin run matches torch's $*: the comparison cannot see it"
    fail=1
  else
    ratio=$(sed -n 's/^compare: FAIL: .*; worst error\/tolerance \([^ ]*\) .*/\1/p' "$tmp/swin-single.cmp")
    echo "reference: swin $*, torch is $ratio tolerances away from weft's run"
  fi
done
exit $fail

