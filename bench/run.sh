#!/bin/sh
# run.sh - benchmarks: how long weft takes to check models of growing size.
# Prints figures; bench/results/ keeps the ones recorded on a given machine.
WEFT=${1:-./weft}
echo "weft benchmarks on $(uname -m), $(nproc) cores, $(date -u +%Y-%m-%d)"
# seconds: wall clock; cpu: user + system seconds (weft runs on one core)
printf '%-50s %8s %8s %12s\n' "case" "seconds" "cpu" "max RSS KiB"
# weft is single-threaded: pinned to one core where taskset exists
PIN=
command -v taskset >/dev/null 2>&1 && taskset -c 0 true 2>/dev/null && PIN="taskset -c 0"
run() {
  label=$1; shift
  $PIN /usr/bin/time -f '%e %U %S %M' -o /tmp/weft-bench.time "$WEFT" "$@" >/dev/null 2>/tmp/weft-bench.err || {
    echo "FAILED: $label"; cat /tmp/weft-bench.err; return 1; }
  read -r secs user sys rss </tmp/weft-bench.time
  printf '%-50s %8s %8s %12s\n' "$label" "$secs" "$(awk "BEGIN { printf \"%.2f\", $user + $sys }")" "$rss"
}
# A scale target: five runs (one machine's noise is not the program's),
# then the least, the median and the most CPU seconds against the target.
runs() {
  label=$1; target=$2; shift 2
  : >/tmp/weft-bench.runs
  for i in 1 2 3 4 5; do
    $PIN /usr/bin/time -f '%e %U %S %M' -o /tmp/weft-bench.time "$WEFT" "$@" >/dev/null 2>/tmp/weft-bench.err || {
      echo "FAILED: $label"; cat /tmp/weft-bench.err; return 1; }
    read -r secs user sys rss </tmp/weft-bench.time
    awk "BEGIN { printf \"%.2f %s %s\\n\", $user + $sys, $secs, $rss }" >>/tmp/weft-bench.runs
  done
  sort -n /tmp/weft-bench.runs | awk -v label="$label" -v target="$target" '
    { cpu[NR] = $1; wall[NR] = $2; if ($3 > rss) rss = $3 }
    END {
      printf "%-50s %8s %8s %12s\n", label, wall[3], cpu[3], rss
      printf "  5 runs, cpu seconds: least %.2f, median %.2f, most %.2f; target under %s s: %s\n",
             cpu[1], cpu[3], cpu[5], target, cpu[3] < target ? "met" : "NOT met"
    }'
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
# The scale target of plans: GPT-3 175B (96 layers, hidden 12288, 96 heads,
# seq 2048) on 1024 A100s, tp 8, pp 16, dp 8, 64 micro-batches, interleaved
# 1F1B with full recomputation. `check` builds the plan (folded over
# micro-batches), lowers the programs of one data-parallel replica (the
# others are the same renamed: docs/design/plans.md, section 8) and runs
# every rule on them. The three sizes before it grow layers x micro-batches
# x devices by 8 and 6 times.
G="check examples/gpt_megatron.plan --set hidden=12288 --set heads=96 --set seq=2048 --set vocab=51200 --set tp=8 --set pp=16 --set interleave=2 --set recompute=\"full\" --set micro_batch=1"
run "plan: GPT-3 shape, 32 layers, 16 mb, 256 dev" $G --set layers=32 --set dp=2 --set nodes=32 --set global_batch=32
run "plan: GPT-3 shape, 64 layers, 32 mb, 512 dev" $G --set layers=64 --set dp=4 --set nodes=64 --set global_batch=128
runs "plan: GPT-3 175B, 1024 A100, tp8 pp16 dp8, 64 mb" 5 $G --set layers=96 --set dp=8 --set nodes=128 --set global_batch=512
# The estimate of the same plan, mixed precision (the scale target of
# estimate: under 2 s on one core).
runs "estimate: GPT-3 175B, 1024 A100, 64 mb, bf16" 2 $(echo "$G" | sed 's/^check/estimate/') --set layers=96 --set dp=8 --set nodes=128 --set global_batch=512 --set dtype=bf16
# The search's scale target: GPT-3 175B (global batch 1536, bf16) on 128
# DGX A100 nodes, the search proper under 1 s and everything, final
# simulations included, under 10 s; and its best plan beside the estimate
# of Megatron-LM's published configuration (tp 8, pp 16, interleaved 2).
S="examples/gpt_megatron.plan --set hidden=12288 --set heads=96 --set seq=2048 --set vocab=51200 --set layers=96 --set global_batch=1536 --set dtype=bf16"
runs "search: GPT-3 175B, 1024 A100, batch 1536, bf16" 10 search $S --cluster 'a100_dgx(nodes = 128)'
$PIN "$WEFT" search $S --cluster 'a100_dgx(nodes = 128)' --json 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
p = d["plans"][d["best"]]
print("  search proper %.2f s (target under 1 s: %s), final simulations %.2f s; best: %.3f s per step, %.1f GiB: tp %d, pp %d, dp %d, %d micro-batches of %d, %s %d, recompute %s, zero %d" % (
    d["search_s"], "met" if d["search_s"] < 1 else "NOT met", d["simulate_s"], p["step_time_s"], p["peak_memory_bytes"] / 2**30,
    p["tp"], p["pp"], p["dp"], p["micro_batches"], p["micro_batch_size"], p["schedule"], p["interleave"], p["recompute"], p["zero"]))'
"$WEFT" estimate $S --set nodes=128 --set tp=8 --set pp=16 --set dp=8 --set interleave=2 --set micro_batch=1 --json 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
print("  Megatron-LM published (tp 8, pp 16, dp 8, interleaved 2, 192 micro-batches of 1): %.3f s per step, %.1f GiB" % (d["step_time_s"], d["peak_memory_bytes"]["max"] / 2**30))'
# An encoder-decoder's search: the T5 of examples/t5.plan on one DGX A100,
# whose decoder blocks (self- and cross-attention) the intra-block dynamic
# program visits in GenerateSeq's order (docs/search.md; target under 1 s).
runs "search: T5 (examples/t5.plan), 8 A100" 1 search examples/t5.plan --cluster 'a100_dgx(nodes = 1)'
# The largest published runs (issue targets: each estimate under 2 s and
# 2 GB on one core): Megatron-LM's 530B on 2,520 and 1T on 3,072 A100s
# (Narayanan et al. 2021, Table 1), and Llama 3 405B on 16,384 H100s (tp 8,
# pp 16, dp 128, sequence 8192, 126 layers: the first and last stage one
# layer fewer). Each device's program is its pipeline stage's
# representative's (docs/design/plans.md, section 8).
# (and each within a memory budget of 2 GiB, --max-memory)
B="estimate examples/gpt_megatron.plan --max-memory 2GiB --set dtype=bf16 --set recompute=\"full\" --set seq=2048 --set vocab=51200 --set micro_batch=1"
runs "estimate: GPT 530B, 2520 A100, tp8 pp35 dp9" 2 $B --set layers=105 --set hidden=20480 --set heads=128 --set tp=8 --set pp=35 --set dp=9 --set nodes=315 --set global_batch=2520
runs "estimate: GPT 1T, 3072 A100, tp8 pp64 dp6" 2 $B --set layers=128 --set hidden=25600 --set heads=160 --set tp=8 --set pp=64 --set dp=6 --set nodes=384 --set global_batch=3072
L="estimate examples/llama_megatron.plan --max-memory 2GiB --set layers=126 --set hidden=16384 --set heads=128 --set kv_heads=8 --set ffn=53248 --set vocab=128256 --set dtype=bf16 --set cluster=\"h100\" --set micro_batch=1"
runs "estimate: Llama 3 405B, 16384 H100, tp8 pp16 dp128" 2 $L --set seq=8192 --set global_batch=2048 --set tp=8 --set pp=16 --set dp=128 --set nodes=2048 --set sequence_parallel=true --set recompute=\"full\"
runs "estimate: Llama 3 405B, seq 131072, tp8 cp16 pp16 dp8" 2 $L --set seq=131072 --set global_batch=128 --set tp=8 --set cp=16 --set pp=16 --set dp=8 --set nodes=2048 --set sequence_parallel=true --set recompute=\"full\"
# One rank's program of GPT-3 175B on 1024 A100s (issue target: under 1 s
# and 1 GB), beside every device's.
T="examples/gpt_megatron.plan --set dtype=bf16 --set hidden=12288 --set heads=96 --set seq=2048 --set vocab=51200 --set layers=96 --set tp=8 --set pp=16 --set dp=8 --set nodes=128 --set global_batch=512 --set micro_batch=1"
runs "lower --device 0 --json: GPT-3 175B, 1024 A100" 1 lower $T --device 0 --json
run "lower --json (every device): GPT-3 175B, 1024 A100" lower $T --json
# A mixture of experts (docs/moe.md): Mixtral-8x7B's shape on eight DGX
# H100 nodes, ep 8 x tp 2 per stage, pp 4, 8 micro-batches; the all-to-alls
# of dispatch and combine cross nodes (target: under 2 s on one core).
runs "estimate: Mixtral 8x7B, 64 H100, ep8 tp2 pp4" 2 estimate examples/mixtral.plan --max-memory 2GiB
# Its search (docs/moe.md): expert parallelism beside the other dimensions,
# the search and its final simulations under 10 s; its best plan beside
# the hand-written ep 8 x tp 2 x pp 4. Most of the final simulations' time
# goes to the frontier's memory end: tp 8 x pp 8 plans of 16 to 64
# micro-batches, lowered for all 64 devices (their tensor-parallel peers
# exchange parts point to point), 1.3 to 1.5 s each at 64 micro-batches;
# the search simulates such a pipeline in one schedule but for a step of
# memory (docs/search.md; bench/results/2026-11-26-mixtral-search.txt).
runs "search: Mixtral 8x7B, 64 H100" 10 search examples/mixtral.plan --cluster 'h100_dgx(nodes = 8)'
$PIN "$WEFT" search examples/mixtral.plan --cluster 'h100_dgx(nodes = 8)' --json 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
p = d["plans"][d["best"]]
print("  search proper %.2f s, final simulations %.2f s; best: %.3f s per step, %.1f GiB: tp %d, pp %d, ep %d, dp %d, %d micro-batches of %d, %s %d, recompute %s, zero %d" % (
    d["search_s"], d["simulate_s"], p["step_time_s"], p["peak_memory_bytes"] / 2**30, p["tp"], p["pp"], p["ep"], p["dp"],
    p["micro_batches"], p["micro_batch_size"], p["schedule"], p["interleave"], p["recompute"], p["zero"]))'
"$WEFT" estimate examples/mixtral.plan --json 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
print("  hand-written (ep 8, tp 2, pp 4, 8 micro-batches, one_f_one_b): %.3f s per step, %.1f GiB" % (d["step_time_s"], d["peak_memory_bytes"]["max"] / 2**30))'
