#!/bin/sh
# symbolic_order.sh - how well `weft estimate --cost symbolic`'s step on the
# nominal machine orders plans as the roofline model of their cluster does:
# for groups of plans of one model on one cluster, every pair is counted as
# ordered alike or not (pairs within 2% on the roofline are ties and left
# out). Prints the agreement per group and in all (docs/estimate.md quotes
# it); fails when fewer than 80% of the pairs agree.
WEFT=${1:-./weft}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$tmp/rows"
row() {  # group, label, then weft arguments
  g=$1; l=$2; shift 2
  r=$("$WEFT" estimate "$@" --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["step_time_s"])') || return 1
  s=$("$WEFT" estimate "$@" --cost symbolic --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["symbolic_step_s"])') || return 1
  echo "$g|$l|$r|$s" >>"$tmp/rows"
}
for p in dp dp_zero3 tp2 tp2_pp2 ulysses single; do row "gpt2 (12 layers) on one DGX H100" "$p" examples/gpt2.plan --plan $p; done
M="examples/gpt_megatron.plan --set layers=8 --set hidden=2048 --set heads=16 --set seq=1024 --set vocab=32000 --set global_batch=64 --set micro_batch=2 --set dtype=bf16"
for c in "8 1 1" "4 2 1" "4 1 2" "2 2 2" "2 4 1" "2 1 4" "1 2 4" "1 1 8" "1 4 2" "1 8 1"; do
  set -- $c
  row "GPT 8 x 2048 on one DGX A100" "tp $1 pp $2 dp $3" $M --set tp=$1 --set pp=$2 --set dp=$3
done
L="examples/llama_megatron.plan --set layers=8 --set hidden=2048 --set heads=16 --set kv_heads=8 --set ffn=5504 --set seq=2048 --set vocab=32000 --set global_batch=32 --set micro_batch=1 --set dtype=bf16 --set nodes=2"
for c in "8 1 1 2" "8 2 1 1" "4 2 2 1" "4 1 2 2" "2 2 2 2" "8 1 2 1" "2 4 2 1" "4 4 1 1"; do
  set -- $c
  row "Llama 8 x 2048 on two DGX A100" "tp $1 pp $2 cp $3 dp $4" $L --set tp=$1 --set pp=$2 --set cp=$3 --set dp=$4
done
python3 - "$tmp/rows" <<'PY'
import sys
rows = [l.rstrip("\n").split("|") for l in open(sys.argv[1]) if l.strip()]
groups = {}
for g, label, r, s in rows:
    groups.setdefault(g, []).append((label, float(r), float(s)))
agree = total = 0
for g, items in groups.items():
    a = t = 0
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            r1, r2 = items[i][1], items[j][1]
            if abs(r1 - r2) <= 0.02 * max(r1, r2):
                continue
            t += 1
            a += (r1 < r2) == (items[i][2] < items[j][2])
    best_r = min(items, key=lambda x: x[1])[0]
    best_s = min(items, key=lambda x: x[2])[0]
    print(f"symbolic order: {g}: {a} of {t} pairs as the roofline orders them; fastest {best_r} (roofline), {best_s} (symbolic)")
    agree += a
    total += t
print(f"symbolic order: {agree} of {total} pairs in all ({100 * agree / max(total, 1):.0f}%)")
sys.exit(0 if total and agree >= 0.8 * total else 1)
PY
