#!/bin/sh
# demo.sh - the main job on an example: check GPT-2, look at its graph,
# estimate a plan, train with it on the CPU backend and prove it computes
# what one device does, train a small GPT on a text and watch its loss
# fall, and see what weft says about a broken file.
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
# Train a small GPT on a real text: the GPL (every Debian system has it),
# one token per byte, 300 steps with warmup, cosine decay and clipping; the
# loss falls from 5.5 (a uniform guess over 256 bytes) to about 2.5.
step python3 examples/tokens.py /usr/share/common-licenses/GPL-3 /tmp/weft-demo-text.bin --val /tmp/weft-demo-val.bin
step $WEFT run examples/gpt2.plan --plan tp2 --set layers=2 --set hidden=64 --set heads=4 --set seq=64 --set vocab=256 \
  --set batch=8 --data /tmp/weft-demo-text.bin --val-data /tmp/weft-demo-val.bin --eval-every 100 --steps 300 \
  --lr 3e-3 --lr-schedule cosine --warmup 20 --lr-min 3e-4 --clip 1 --print-every 25
printf '\n\033[1m$ %s\033[0m\n' "$WEFT check tests/golden/check/shape_mismatch.plan"
$WEFT check tests/golden/check/shape_mismatch.plan || echo "(exit $?: the plan is rejected, as it should be)"
