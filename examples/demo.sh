#!/bin/sh
# demo.sh - the main job on an example: check GPT-2, look at its graph,
# estimate a plan, train with it on the CPU backend and prove it computes
# what one device does, and see what weft says about a broken file.
set -e
WEFT=${1:-./weft}
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

step $WEFT check examples/gpt2.plan examples/mlp.plan examples/llama.plan examples/cluster.plan examples/gpt_megatron.plan
step $WEFT explain examples/gpt2.plan --plan tp2 h.3.attn.c_proj
step $WEFT graph examples/mlp.plan
printf '\n\033[1m$ %s\033[0m\n' "$WEFT graph examples/gpt2.plan --json | head -c 300"
$WEFT graph examples/gpt2.plan --json | head -c 300; echo " ..."
step $WEFT graph examples/gpt2.plan --set layers=48 --set hidden=1600 --set heads=25 --json >/tmp/weft-demo-xl.json
printf 'GPT-2 XL parameters: '; grep -o '"parameters":[0-9]*' /tmp/weft-demo-xl.json | cut -d: -f2
step $WEFT estimate examples/gpt2.plan --plan tp2_pp2
step $WEFT run examples/gpt2.plan --plan tp2_pp2 --set layers=12 --set hidden=64 --set heads=4 --set seq=16 \
  --set vocab=256 --set batch=8 --steps 3 --check
printf '\n\033[1m$ %s\033[0m\n' "$WEFT check tests/golden/check/shape_mismatch.plan"
$WEFT check tests/golden/check/shape_mismatch.plan || echo "(exit $?: the plan is rejected, as it should be)"
