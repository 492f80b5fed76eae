#!/bin/sh
# run_cpu.sh - tokens per second of `weft run` on the CPU backend: GPT-2
# small (124M) at sequence 128, batch 2, on one device and on two (tensor
# parallel), and the same plans through mpirun in two processes. Figures
# for the record, not targets: they depend on the machine's cores and BLAS.
WEFT=${1:-./weft}
steps=3
args="--set seq=128 --set batch=2 --steps $steps --json"
echo "# weft run, CPU backend: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "# $(date -u +%Y-%m-%d), weft $("$WEFT" --version | cut -d' ' -f2)"
rate() {  # the mean tokens/s of the steps after the first (which faults memory in)
  python3 -c 'import json,sys; s=json.load(sys.stdin)["steps"][1:]; print("%.0f tokens/s, %.2f s per step, loss %.4f" % (sum(x["tokens_per_s"] for x in s)/len(s), sum(x["time_s"] for x in s)/len(s), s[-1]["loss"]))'
}
for p in single tp2; do
  printf 'gpt2 124M, plan %-7s (%s): ' "$p" "$([ $p = single ] && echo 1 device || echo 2 devices)"
  "$WEFT" run examples/gpt2.plan --plan $p $args | rate
done
if command -v mpirun >/dev/null 2>&1; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  printf 'gpt2 124M, plan tp2 in 2 processes (mpirun): '
  mpirun -np 2 "$WEFT" run examples/gpt2.plan --plan tp2 $args 2>/dev/null | rate
fi
