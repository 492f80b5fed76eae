#!/bin/sh
# run.sh - benchmarks: how long weft takes to check models of growing size.
# Prints figures; bench/results/ keeps the ones recorded on a given machine.
WEFT=${1:-./weft}
echo "weft benchmarks on $(uname -m), $(nproc) cores, $(date -u +%Y-%m-%d)"
printf '%-50s %10s %12s\n' "case" "seconds" "max RSS KiB"
run() {
  label=$1; shift
  /usr/bin/time -f '%e %M' -o /tmp/weft-bench.time "$WEFT" "$@" >/dev/null 2>/tmp/weft-bench.err || {
    echo "FAILED: $label"; cat /tmp/weft-bench.err; return 1; }
  read -r secs rss </tmp/weft-bench.time
  printf '%-50s %10s %12s\n' "$label" "$secs" "$rss"
}
run "graph GPT-2 small (12 layers)" graph examples/gpt2.plan --json
run "graph GPT-2 XL (48 layers)" graph examples/gpt2.plan --json --set layers=48 --set hidden=1600 --set heads=25
run "graph GPT-3 175B shape (96 layers)" graph examples/gpt2.plan --json --set layers=96 --set hidden=12288 --set heads=96 --set seq=2048
run "graph GPT-3 shape, 960 layers" graph examples/gpt2.plan --json --set layers=960 --set hidden=12288 --set heads=96 --set seq=2048
run "check all examples" check examples/*.plan
M="check examples/gpt_megatron.plan --set vocab=51200 --set seq=1024 --set hidden=1024 --set heads=16"
run "plan: 24 layers, tp 8 pp 4 dp 4, 8 mb (128 dev)" $M --set layers=24 --set tp=8 --set pp=4 --set dp=4 --set nodes=16 --set global_batch=64 --set micro_batch=2
run "plan: 48 layers, tp 8 pp 4 dp 4, 8 mb (128 dev)" $M --set layers=48 --set tp=8 --set pp=4 --set dp=4 --set nodes=16 --set global_batch=64 --set micro_batch=2
run "plan: 24 layers, tp 8 pp 4 dp 4, 16 mb (128 dev)" $M --set layers=24 --set tp=8 --set pp=4 --set dp=4 --set nodes=16 --set global_batch=128 --set micro_batch=2
run "lower --json: 24 layers, 128 dev, 8 mb" lower examples/gpt_megatron.plan --json --set vocab=51200 --set seq=1024 --set hidden=1024 --set heads=16 --set layers=24 --set tp=8 --set pp=4 --set dp=4 --set nodes=16 --set global_batch=64 --set micro_batch=2
run "fmt stdlib" fmt stdlib/ops.plan stdlib/models.plan stdlib/clusters.plan
# The scale target of plans: GPT-3 175B on 1024 A100s, tp 8, pp 16, dp 8,
# 64 micro-batches. `check` lowers the plan too, and lowering still stores
# every instruction of every device (about 27 million here: tens of GB), so
# the case runs only with WEFT_BENCH_175B=1 until lowering uses the
# regularity of split trees.
[ "${WEFT_BENCH_175B:-0}" = 1 ] && run "plan: GPT-3 175B, 1024 A100, tp8 pp16 dp8, 64 mb" check examples/gpt_megatron.plan --set layers=96 --set hidden=12288 --set heads=96 --set seq=2048 --set vocab=51200 --set tp=8 --set pp=16 --set dp=8 --set nodes=128 --set global_batch=512 --set micro_batch=1
