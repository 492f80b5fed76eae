#!/bin/sh
# run_check.sh - weft run on the CPU backend: every example plan matches one
# device (--check), resume is bit-exact, mpirun gives what one process does,
# a checkpoint survives SIGKILL while it is written, bad files are refused.
WEFT=$1
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT

# run_ok NAME ARGS...: weft run ARGS --check --json must match one device
run_ok() {
  name=$1; shift
  if "$WEFT" run "$@" --check --json >"$tmp/out.json" 2>"$tmp/err"; then
    if grep -q '"match":true' "$tmp/out.json"; then ok
      le=$(sed -n 's/.*"max_loss_rel_err":\([^,]*\),.*/\1/p' "$tmp/out.json")
      pe=$(sed -n 's/.*"max_param_rel_err":\([^,]*\),.*/\1/p' "$tmp/out.json")
      printf 'run: %s: matches one device (losses within %.2g, parameters within %.2g)\n' "$name" "$le" "$pe"
    else bad "$name: no match"; cat "$tmp/out.json"; fi
  else
    bad "$name: weft run $* --check (exit $?)"; cat "$tmp/err" "$tmp/out.json"
  fi
}

GPT="--set layers=12 --set hidden=64 --set heads=4 --set seq=16 --set vocab=256 --set batch=8"
MEG="--set layers=4 --set hidden=64 --set heads=4 --set seq=16 --set vocab=128 --set global_batch=8 --set micro_batch=2"

run_ok "mlp tp2_dp2" examples/mlp.plan --steps 2
for p in dp dp_zero3 tp2 tp2_pp2 ulysses single; do run_ok "gpt2 $p" examples/gpt2.plan --plan $p $GPT --steps 2; done
run_ok "coshard" examples/coshard.plan --set layers=2 --set hidden=64 --set heads=16 --set seq=16 --set batch=4 --steps 2
run_ok "grid" examples/grid.plan --steps 1
run_ok "llama tp2" examples/llama.plan --set layers=2 --set hidden=64 --set heads=4 --set kv_heads=2 --set ffn=96 \
  --set seq=16 --set vocab=128 --set batch=2 --steps 2
run_ok "llama megatron_tp, sequence parallel, dp2" examples/llama.plan --plan megatron_sp --set layers=2 --set hidden=64 \
  --set heads=4 --set kv_heads=2 --set ffn=96 --set seq=16 --set vocab=128 --set batch=2 --steps 2
# plans written by weft search train like written ones
searched() {  # name, then weft search arguments
  name=$1; shift
  if "$WEFT" search "$@" -o "$tmp/searched.plan" 2>"$tmp/err"; then
    # the plan imports the example from outside its directory
    run_ok "$name: $(sed -n 's/^#   [0-9]*: [^:]*: \(.*\)  <- this plan$/\1/p' "$tmp/searched.plan")" "$tmp/searched.plan" \
      --allow-path examples --steps 2
  else
    bad "$name: weft search $* (exit $?)"; cat "$tmp/err"
  fi
}
searched "searched mlp" examples/mlp.plan --cluster 'cpus(4)'
searched "searched gpt2" examples/gpt2.plan $GPT --set layers=2 --cluster 'cpus(4)'
# with symbolic costs: the embedding split along hidden, its readers along
# the sequence, their gradients summed in place before they go back
searched "searched llama, symbolic costs" examples/llama.plan --set layers=4 --set hidden=64 --set heads=4 --set kv_heads=2 \
  --set ffn=96 --set seq=16 --set vocab=128 --set batch=4 --cluster 'cpus(8)' --cost symbolic
searched "searched llama" examples/llama.plan --set layers=2 --set hidden=64 --set heads=4 --set kv_heads=2 --set ffn=96 \
  --set seq=16 --set vocab=128 --set batch=4 --cluster 'cpus(4)'
# the router split along the sequence and its probabilities replicated:
# the producer sums their gradients, given back in different layouts
searched "searched moe" examples/moe.plan --cluster 'cpus(4)'
# context parallelism with tensor parallelism and a pipeline: a space
# narrowed to cp 2 and tp 2 on eight devices
printf 'return {\n  space = function(s, model, cluster)\n    s.cp = {2}\n    s.tp = {2}\n  end,\n}\n' >"$tmp/cp2.lua"
searched "searched llama, context parallel" examples/llama.plan --set layers=2 --set hidden=64 --set heads=4 --set kv_heads=2 \
  --set ffn=96 --set seq=16 --set vocab=128 --set batch=4 --cluster 'cpus(8)' --heuristic "$tmp/cp2.lua"
if ! grep -q 'as \[dp = 1, pp = 2, cp = 2, tp = 2\]' "$tmp/searched.plan"; then
  bad "searched llama, context parallel: not a cp 2 plan"; grep mesh "$tmp/searched.plan"
fi
# a pipeline whose stages have meshes of different shapes (each its own
# tp and dp): a space narrowed to two stages, candidates kept only when
# their stages differ
printf 'return {\n  space = function(s, model, cluster)\n    s.pp = {2}\n  end,\n  prune = function(c)\n    return not c.uniform\n  end,\n}\n' >"$tmp/nonuniform.lua"
searched "searched llama, stages of different meshes" examples/llama.plan --set layers=4 --set hidden=64 --set heads=4 \
  --set kv_heads=2 --set ffn=96 --set seq=16 --set vocab=4096 --set batch=8 --cluster 'cpus(8)' --heuristic "$tmp/nonuniform.lua"
if [ "$(grep -c '^  mesh m[01] = devices' "$tmp/searched.plan")" != 2 ]; then
  bad "searched llama, stages of different meshes: not a mesh per stage"; grep mesh "$tmp/searched.plan"
fi
# three stages on eight devices (not three of as many):
# stages of different sizes, each its own mesh
printf 'return {\n  space = function(s, model, cluster)\n    s.pp = {3}\n  end,\n}\n' >"$tmp/pp3.lua"
searched "searched llama, three stages of different sizes" examples/llama.plan --set layers=4 --set hidden=64 --set heads=4 \
  --set kv_heads=2 --set ffn=96 --set seq=16 --set vocab=4096 --set batch=8 --cluster 'cpus(8)' --heuristic "$tmp/pp3.lua"
if [ "$(grep -c '^  mesh m[012] = devices' "$tmp/searched.plan")" != 3 ] || \
   [ "$(sed -n 's/^  mesh m[012] = devices\[\([0-9]*\)\.\.\([0-9]*\)\].*/\1 \2/p' "$tmp/searched.plan" | \
        awk '{print $2 - $1}' | sort -u | wc -l)" -lt 2 ]; then
  bad "searched llama, three stages of different sizes: not a mesh per stage of two sizes"; grep mesh "$tmp/searched.plan"
fi
run_ok "megatron tp2 pp2 dp2" examples/gpt_megatron.plan $MEG --steps 2
run_ok "megatron interleaved, sequence parallel, full recompute, zero 1" examples/gpt_megatron.plan $MEG \
  --set interleave=2 --set sequence_parallel=true --set 'recompute="full"' --set zero=1 --steps 2
run_ok "megatron zero 2, selective recompute" examples/gpt_megatron.plan $MEG --set zero=2 --set 'recompute="selective"' --steps 2
run_ok "megatron zero 3" examples/gpt_megatron.plan $MEG --set pp=1 --set zero=3 --steps 2
run_ok "megatron tp4" examples/gpt_megatron.plan $MEG --set tp=4 --set pp=1 --steps 2
run_ok "tied parameter on uneven copies" tests/golden/plan/tied_uneven.plan --steps 3
# one consumer split along the sequence, another replicated: the producer
# sums the pieces of its gradient
for p in norm_seq gate_seq; do run_ok "llama $p: gradients in different layouts" tests/golden/explain/grads_mixed_layouts.plan \
  --plan $p --steps 2; done
# a replicated consumer beside split ones: its copies count once in the
# all-reduce of the others' partial sums; a consumer split along its
# input's hidden dimension gives pieces each sent from its own buffer; a
# reduction split into one part gives complete values
R=tests/golden/explain/grads_replicated_consumer.plan
run_ok "llama cp2 tp2, value projection replicated over tp" $R --set 'v="rep"' --steps 2
run_ok "llama cp2 tp2, value projection split along its input" $R --set 'v="k"' --steps 2
run_ok "llama cp2, value projection split along its input into one part" $R --set 'v="k"' --set tp=1 --steps 2
run_ok "llama cp2 tp2 dp2, sequence parallel, value projection replicated over tp" $R --set 'v="rep"' --set sp=true --set dp=2 --steps 2
run_ok "llama cp2 tp2, sequence parallel, value projection split along its input" $R --set 'v="k"' --set sp=true --steps 2
# a tied parameter read by a lookup replicated over tp and by a head split
# along the sequence: the lookup's copies count once in the tp group's sum
T=tests/golden/explain/grads_tied_replicated_lookup.plan
run_ok "gpt tied embedding, lookup replicated over tp 2, head split on seq" $T --steps 2
run_ok "gpt tied embedding, lookup replicated, tp 2 dp 4" $T --set dp=4 --steps 2
run_ok "gpt tied embedding, lookup replicated, tp 2 on 2 replicas, dp 2" $T --set rep=2 --set dp=2 --steps 2
# consumers of an activation in different pipeline stages send their parts
# of its gradient to the producer
for p in skip skip_tp t5_cross; do
  run_ok "gradient of an activation read in two stages: $p" tests/golden/explain/grads_across_stages.plan --plan $p --steps 2
done
run_ok "tp2 pp2 across nodes: scatter-gather between stages" tests/golden/explain/stage_scatter_gather.plan --steps 2
run_ok "tp2 pp4 across nodes" tests/golden/explain/stage_scatter_gather.plan --set nodes=4 --set pp=4 --set layers=4 --steps 2
run_ok "tp2 pp2 dp2 across nodes" tests/golden/explain/stage_scatter_gather.plan --set nodes=4 --set dp=2 --steps 2
run_ok "megatron pp4" examples/gpt_megatron.plan $MEG --set tp=1 --set pp=4 --steps 2
# mixed precision: bf16 and f16 parameters stepped through f32 master
# weights, and ZeRO over data-parallel sizes that divide no dimension
run_ok "megatron bf16, master weights, zero 1" examples/gpt_megatron.plan $MEG --set dtype=bf16 --set zero=1 --steps 3
run_ok "megatron f16, zero 2" examples/gpt_megatron.plan $MEG --set dtype=f16 --set zero=2 --steps 2
run_ok "megatron bf16, zero 1, clipped, cosine schedule" examples/gpt_megatron.plan $MEG --set dtype=bf16 --set zero=1 \
  --clip 0.5 --lr-schedule cosine --warmup 1 --steps 3
for z in 1 2 3; do
  run_ok "megatron bf16 dp 3, zero $z, uneven shards" examples/gpt_megatron.plan $MEG --set dtype=bf16 --set tp=1 --set pp=1 \
    --set dp=3 --set global_batch=6 --set zero=$z --steps 2
done
run_ok "megatron tp 2, pp 2, dp 3, zero 1, uneven shards" examples/gpt_megatron.plan $MEG --set nodes=2 --set dp=3 \
  --set global_batch=12 --set zero=1 --steps 2
run_ok "ZeRO-3 parts empty on some devices" tests/golden/plan/shard_empty.plan --steps 3
# mixtures of experts: expert parallelism alone and with tp, dp, pp and
# ZeRO; a capacity factor of 0.5 (2 slots per expert and sequence for 32
# choices) drops at least half of the choices, 4 (the whole sequence) none
for cf in 0.5 4; do
  for p in single ep2 ep4 ep2_tp2_dp2 ep2_pp2 ep2_dp2_zero2; do
    run_ok "moe $p, capacity factor $cf" examples/moe.plan --plan $p --set capacity_factor=$cf --steps 2
  done
done
run_ok "moe with a shared expert and a dense layer, ep2" examples/moe.plan --plan ep2 --set shared_experts=1 --set layers=2 \
  --set moe_every=2 --steps 2
run_ok "moe top 1 (Switch), ep4" examples/moe.plan --plan ep4 --set top_k=1 --steps 2
run_ok "mixtral-shaped moe_llama, ep2 tp2 pp2" examples/mixtral.plan --set layers=2 --set hidden=64 --set heads=4 --set kv_heads=2 \
  --set ffn=96 --set seq=16 --set vocab=128 --set global_batch=8 --set micro_batches=2 --set ep=2 --set tp=2 --set pp=2 \
  --set nodes=1 --set dtype=f32 --steps 2
# T5 (encoder-decoder): a plain four-stage pipeline, and the interlaced one
# whose shared embedding is split by vocabulary over the four devices
for p in pipeline interlaced; do
  run_ok "t5 $p" examples/t5.plan --plan $p --steps 2
done
run_ok "t5 interlaced, three encoder layers on the first stage" examples/t5.plan --plan interlaced --set layers=4 \
  --set enc_split=3 --steps 2
run_ok "t5 interlaced, 8 micro-batches" examples/t5.plan --plan interlaced --set micro_batches=8 --steps 2
run_ok "t5 interlaced, 1 micro-batch" examples/t5.plan --plan interlaced --set micro_batches=1 --steps 2

# Swin Transformer: tensor parallelism, co-shard (two parts per device, and
# four on one device: the parts of the recomputed attention and MLP run as
# chains, each recomputed right before its backward) and window attention
# split by rows of windows (shifted windows' masks)
for p in megatron coshard windows; do run_ok "swin $p" examples/swin.plan --plan $p --steps 2; done
run_ok "swin coshard, 4 devices of 2 parts" examples/swin.plan --plan coshard --set tp=4 --set parts=8 --set 'heads=[8, 16]' \
  --set batch=2 --steps 2
run_ok "swin coshard, 4 parts on one device" examples/swin.plan --plan coshard --set tp=1 --set parts=4 --steps 2

# the buffers the CPU backend holds, as it measures them, are what the
# estimate counts: every device's peak in program order (the estimate with
# --cost symbolic) and the bytes live there by role; the roles that live
# the whole step (KEPT: parameters, master weights, optimizer state, and
# gradients but under ZeRO-2 and 3) also at the simulated peak. Every
# device is lowered for the estimate (WEFT_REPS=never): a tensor-parallel
# peer's figures are otherwise its representative's, which may hold a few
# bytes more (a row-parallel bias that only the first peer adds)
mem_ok() {
  name=$1; kept=$2; shift 2
  if "$WEFT" run "$@" --steps 2 --json >"$tmp/mem_run.json" 2>"$tmp/err" &&
     WEFT_REPS=never "$WEFT" estimate "$@" --cost symbolic --json >"$tmp/mem_sym.json" 2>>"$tmp/err" &&
     WEFT_REPS=never "$WEFT" estimate "$@" --json >"$tmp/mem_est.json" 2>>"$tmp/err" &&
     python3 - "$tmp/mem_run.json" "$tmp/mem_sym.json" "$tmp/mem_est.json" "$name" "$kept" <<'PY'
import json, sys
run, sym, est = (json.load(open(f)) for f in sys.argv[1:4])
sdev = {d["device"]: d for d in sym["per_device"]}
edev = {d["device"]: d for d in est["per_device"]}
kept = tuple(sys.argv[5].split())
bad = []
for m in run["memory"]:
    d = m["device"]
    if m["peak_bytes"] != sym["peak_memory_bytes"]["per_device"][d]:
        bad.append("device %d: measured peak %d, estimated %d" % (d, m["peak_bytes"], sym["peak_memory_bytes"]["per_device"][d]))
    if d in sdev and m["by_role"] != sdev[d]["peak_by_role"]:
        bad.append("device %d: measured %s, estimated %s" % (d, m["by_role"], sdev[d]["peak_by_role"]))
    if d in edev and any(m["by_role"][r] != edev[d]["peak_by_role"][r] for r in kept):
        bad.append("device %d: measured %s, at the simulated peak %s" % (d, m["by_role"], edev[d]["peak_by_role"]))
if bad or not run["memory"]:
    print("\n".join(bad) or "no memory measured")
    sys.exit(1)
peak = max(run["memory"], key=lambda m: m["peak_bytes"])
print("run: %s: the CPU backend's buffers are the estimate's on %d devices (device %d: peak %d bytes, %s)" % (
    sys.argv[4], len(run["memory"]), peak["device"], peak["peak_bytes"],
    ", ".join("%s %d" % (r, peak["by_role"][r]) for r in ("param", "master", "grad", "state", "comm"))))
PY
  then ok; else bad "$name: measured memory differs from the estimate"; cat "$tmp/err"; fi
}
ALL="param master grad state"
mem_ok "megatron bf16 tp2 pp2 dp2, zero 1" "$ALL" examples/gpt_megatron.plan $MEG --set dtype=bf16 --set zero=1
mem_ok "megatron f16 tp2 pp2 dp2" "$ALL" examples/gpt_megatron.plan $MEG --set dtype=f16
mem_ok "megatron bf16 dp 3, zero 3" "param master state" examples/gpt_megatron.plan $MEG --set dtype=bf16 --set tp=1 \
  --set pp=1 --set dp=3 --set global_batch=6 --set zero=3
mem_ok "gpt2 tp2_pp2" "$ALL" examples/gpt2.plan --plan tp2_pp2 $GPT
LMEG="--set layers=4 --set hidden=64 --set heads=4 --set kv_heads=2 --set ffn=96 --set seq=16 --set vocab=128 --set global_batch=8 --set micro_batch=2"
run_ok "llama megatron tp2 pp2 dp2" examples/llama_megatron.plan $LMEG --steps 2
run_ok "llama megatron sequence parallel, interleaved, selective recompute, zero 1" examples/llama_megatron.plan $LMEG \
  --set sequence_parallel=true --set interleave=2 --set 'recompute="selective"' --set zero=1 --steps 2
run_ok "llama megatron 6 layers in 4 stages (the first and last one fewer), full recompute" examples/llama_megatron.plan $LMEG \
  --set layers=6 --set pp=4 --set dp=1 --set 'recompute="full"' --steps 2
run_ok "llama context parallel cp2 tp2 pp2, sequence parallel" examples/llama_megatron.plan $LMEG --set cp=2 --set dp=1 \
  --set sequence_parallel=true --steps 2
run_ok "llama context parallel cp4 dp2, full recompute" examples/llama_megatron.plan $LMEG --set cp=4 --set tp=1 --set pp=1 \
  --set 'recompute="full"' --steps 2

# an operator with a native kernel, built here, through libffi
if command -v cc >/dev/null 2>&1 && sh examples/native/build.sh "$tmp" >/dev/null; then
  mkdir -p "$tmp/ex/native" && cp examples/native.plan "$tmp/ex/" && cp "$tmp/libweft_example_ops.so" "$tmp/ex/native/"
  run_ok "native tp2" "$tmp/ex/native.plan" --plan tp2 --steps 2 --allow-native
  run_ok "native dp2" "$tmp/ex/native.plan" --plan dp2 --steps 2 --allow-native
else
  bad "examples/native/build.sh"
fi

# fusing gradient all-reduces into buckets changes no bit: the sums of a
# bucket are taken in the same order as one by one
B=tests/golden/plan/buckets.plan
if "$WEFT" run $B --plan small --steps 2 --check --save "$tmp/bk.st" >"$tmp/bk.out" 2>&1 && grep -q "match$" "$tmp/bk.out" &&
   "$WEFT" run $B --plan none --steps 2 --save "$tmp/nb.st" >/dev/null 2>&1 && cmp -s "$tmp/bk.st" "$tmp/nb.st"; then ok
  echo "run: buckets of gradient all-reduces match one device and give the same bytes as none"
else bad "buckets change the result"; cat "$tmp/bk.out"; fi

# N steps, save, resume, M steps == N+M steps, byte for byte
A="examples/gpt2.plan --plan tp2_pp2 $GPT --seed 7"
"$WEFT" run $A --steps 2 --save "$tmp/a2.st" >/dev/null &&
"$WEFT" run $A --steps 1 --resume "$tmp/a2.st" --save "$tmp/a3.st" >/dev/null &&
"$WEFT" run $A --steps 3 --save "$tmp/b3.st" >/dev/null || bad "save and resume runs"
if cmp -s "$tmp/a3.st" "$tmp/b3.st"; then ok; echo "run: 2 steps + resume + 1 step == 3 steps, byte for byte"
else bad "resume is not bit-exact"; fi

# the same run spread over 2 processes by mpirun saves the same bytes
if command -v mpirun >/dev/null 2>&1; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  # Open MPI keeps what it allocates at MPI_Init until exit, in components it
  # unloads: under AddressSanitizer the processes of mpirun skip the leak
  # report (one-process runs above keep it; only net.c is MPI-only)
  asan_mpi="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
  if ASAN_OPTIONS=$asan_mpi mpirun -np 2 "$WEFT" run $A --steps 3 --save "$tmp/m3.st" >"$tmp/mpi.out" 2>&1; then
    if cmp -s "$tmp/m3.st" "$tmp/b3.st" && grep -q "in 2 processes" "$tmp/mpi.out"; then ok; echo "run: mpirun -np 2 == one process, byte for byte"
    else bad "mpirun -np 2 differs from one process"; cat "$tmp/mpi.out"; fi
  else bad "mpirun -np 2 weft run"; cat "$tmp/mpi.out"; fi
  if ASAN_OPTIONS=$asan_mpi mpirun -np 2 "$WEFT" run examples/gpt_megatron.plan $MEG --steps 2 --check >"$tmp/mpi.out" 2>&1 &&
     grep -q "match$" "$tmp/mpi.out"; then ok; echo "run: mpirun -np 2 megatron tp2 pp2 dp2 matches one device"
  else bad "mpirun -np 2 megatron --check"; cat "$tmp/mpi.out"; fi
  # --trace under mpirun: each process writes what its devices ran,
  # process 0 to the file named, process 1 to FILE-rank1; between them
  # every device, and process 0's file every instruction of its devices
  if ASAN_OPTIONS=$asan_mpi mpirun -np 2 "$WEFT" run examples/gpt_megatron.plan $MEG --steps 1 --trace "$tmp/mtr.json" \
       --json >"$tmp/mtr.run" 2>"$tmp/mpi.out" &&
     python3 -c '
import json, sys
pids = [sorted({e["pid"] for e in json.load(open(f))["traceEvents"] if e["ph"] == "X"}) for f in sys.argv[1:]]
assert not set(pids[0]) & set(pids[1]) and sorted(pids[0] + pids[1]) == list(range(8)), pids
print(" ".join(map(str, pids[0])))' "$tmp/mtr.json" "$tmp/mtr-rank1.json" >"$tmp/mtr.d" &&
     for d in $(cat "$tmp/mtr.d"); do "$WEFT" lower examples/gpt_megatron.plan $MEG --device $d --json >"$tmp/mlow$d.json"; done &&
     python3 tests/trace_check.py "$tmp/mtr.json" "$tmp/mtr.run" 1 every $(for d in $(cat "$tmp/mtr.d"); do echo "$tmp/mlow$d.json"; done) \
       >"$tmp/mtr.out"; then ok
    echo "run: mpirun -np 2 --trace: process 0 wrote devices $(cat "$tmp/mtr.d"), process 1 the others to mtr-rank1.json; $(cat "$tmp/mtr.out")"
  else bad "mpirun -np 2 --trace"; cat "$tmp/mpi.out" "$tmp/mtr.out" 2>/dev/null; fi
  # the two files as one timeline (bench/trace_merge.py): every event of
  # both, each process's moved by its start's wall clock less the first's;
  # a file given twice is refused
  if [ -f "$tmp/mtr-rank1.json" ] && python3 bench/trace_merge.py "$tmp/mtrm.json" "$tmp/mtr.json" >"$tmp/mtrm.out" &&
     python3 -c '
import json, sys
m, a, b = (json.load(open(f)) for f in sys.argv[1:4])
x = lambda t: [e for e in t["traceEvents"] if e["ph"] == "X"]
assert len(x(m)) == len(x(a)) + len(x(b)), (len(x(m)), len(x(a)), len(x(b)))
assert sorted({e["pid"] for e in x(m)}) == list(range(8))
ea, eb = a["otherData"]["epoch_us"], b["otherData"]["epoch_us"]
off = {f["rank"]: f["offset_us"] for f in m["otherData"]["files"]}
assert off == {0: ea - min(ea, eb), 1: eb - min(ea, eb)} and 0 <= abs(ea - eb) < 60e6, (off, ea, eb)
first = {}
for e in x(b): first.setdefault(e["pid"], e["ts"])
for e in x(m):
  if e["pid"] in first: assert abs(e["ts"] - first.pop(e["pid"]) - off[1]) < 1e-3, e
' "$tmp/mtrm.json" "$tmp/mtr.json" "$tmp/mtr-rank1.json" &&
     ! python3 bench/trace_merge.py "$tmp/mtrm2.json" "$tmp/mtr.json" "$tmp/mtr.json" 2>"$tmp/mtrm.err" &&
     grep -q "two files of one process" "$tmp/mtrm.err"; then ok
    echo "run: bench/trace_merge.py: $(sed "s|$tmp/||" "$tmp/mtrm.out")"
  else bad "bench/trace_merge.py of the mpirun trace"; cat "$tmp/mtrm.out" "$tmp/mtrm.err" 2>/dev/null; fi
  # a stopped process: the other gives up after --timeout, and MPI_Abort
  # ends the run; no process is left behind. Which wait finds it depends on
  # where it stopped: a receive, a collective, or a send whose message the
  # stopped one does not take; each names --timeout
  (ASAN_OPTIONS=$asan_mpi mpirun -np 2 "$WEFT" run $A --steps 100000 --timeout 2 >"$tmp/stop.out" 2>&1; echo "$?" >"$tmp/stop.rc") &
  runner=$!
  ranks=""; n=0
  while [ $n -lt 100 ] && ! grep -q "^step 2 " "$tmp/stop.out" 2>/dev/null; do sleep 0.1; n=$((n+1)); done
  mp=$(pgrep -P $runner mpirun | head -1)
  [ -n "$mp" ] && ranks=$(pgrep -P "$mp")
  victim=$(echo "$ranks" | tail -1)
  if [ -n "$victim" ] && kill -STOP "$victim"; then
    n=0; while [ $n -lt 150 ] && [ ! -f "$tmp/stop.rc" ]; do sleep 0.1; n=$((n+1)); done
    # the stopped one ends once it may run again
    kill -CONT "$victim" 2>/dev/null
    n=0; left=x
    while [ $n -lt 80 ] && [ -n "$left" ]; do
      left=$(for r in $ranks; do kill -0 "$r" 2>/dev/null && echo "$r"; done); sleep 0.1; n=$((n+1))
    done
    if [ -f "$tmp/stop.rc" ] && [ "$(cat "$tmp/stop.rc")" != 0 ] && grep -qE "waited [0-9.]+ s .*\(--timeout\)|it did not come \(--timeout\)" "$tmp/stop.out" && [ -z "$left" ]; then
      ok; echo "run: mpirun -np 2 with a process stopped: the other gives up after --timeout 2, every process ends"
    else bad "a stopped process under mpirun: $(cat "$tmp/stop.rc" 2>/dev/null), left: $left"; grep -v "^step" "$tmp/stop.out"; fi
    for r in $ranks; do kill -CONT "$r" 2>/dev/null; kill -9 "$r" 2>/dev/null; done
  else bad "mpirun -np 2: no process to stop"; cat "$tmp/stop.out"; fi
  wait $runner 2>/dev/null
  # mpirun killed: its processes see it gone and end
  ASAN_OPTIONS=$asan_mpi mpirun -np 2 "$WEFT" run $A --steps 100000 >"$tmp/orphan.out" 2>&1 &
  runner=$!
  n=0; while [ $n -lt 100 ] && ! grep -q "^step 2 " "$tmp/orphan.out" 2>/dev/null; do sleep 0.1; n=$((n+1)); done
  ranks=$(pgrep -P $runner)
  kill -9 $runner
  wait $runner 2>/dev/null
  n=0; left=x
  while [ $n -lt 100 ] && [ -n "$left" ]; do
    left=$(for r in $ranks; do kill -0 "$r" 2>/dev/null && echo "$r"; done); sleep 0.1; n=$((n+1))
  done
  if [ -n "$ranks" ] && [ -z "$left" ]; then ok; echo "run: mpirun killed: its processes end within $((n / 10)) s"
  else bad "mpirun killed: processes left ($left of $ranks)"; for r in $left; do kill -9 "$r"; done; fi
else
  echo "run: mpirun not installed, the 2-process case is skipped (make deps installs openmpi-bin)"
fi

# SIGKILL while the checkpoint is written leaves the old one intact
cp "$tmp/a2.st" "$tmp/k.st"
WEFT_TEST_SAVE_PAUSE=5000 "$WEFT" run $A --steps 1 --save "$tmp/k.st" >/dev/null 2>&1 &
pid=$!
sleep 1.5
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
if cmp -s "$tmp/k.st" "$tmp/a2.st" && "$WEFT" run $A --steps 0 --resume "$tmp/k.st" >/dev/null 2>&1; then ok
  echo "run: killed while saving, the previous checkpoint is intact and loads"
else bad "a run killed while saving damaged the checkpoint"; fi

# the temporary of a save killed with SIGKILL is removed by the next save
# to the same name; a SIGTERM during a save removes its own
ls -A "$tmp" | grep -q '^\.k\.st\..*\.tmp$' || bad "the killed save left no temporary to clean"
"$WEFT" run $A --steps 0 --resume "$tmp/k.st" --save "$tmp/k.st" >/dev/null 2>&1
if ls -A "$tmp" | grep -q '^\.k\.st\..*\.tmp$'; then bad "the next save left the stale temporary"; ls -A "$tmp"
else ok; echo "run: the next save to the name removes a killed save's temporary"; fi
WEFT_TEST_SAVE_PAUSE=5000 "$WEFT" run $A --steps 0 --resume "$tmp/k.st" --save "$tmp/k.st" >/dev/null 2>&1 &
pid=$!
n=0; while [ $n -lt 50 ] && ! ls -A "$tmp" | grep -q '^\.k\.st\..*\.tmp$'; do sleep 0.1; n=$((n+1)); done
kill -TERM $pid 2>/dev/null
wait $pid 2>/dev/null
if [ $n -lt 50 ] && ! ls -A "$tmp" | grep -q '^\.k\.st\..*\.tmp$' && cmp -s "$tmp/k.st" "$tmp/a2.st"; then ok
  echo "run: SIGTERM while saving removes the temporary, the checkpoint stays as it was"
else bad "SIGTERM while saving: $(ls -A "$tmp")"; fi

# expect_err MESSAGE ARGS...: weft run ARGS fails, saying MESSAGE
expect_err() {
  want=$1; shift
  if "$WEFT" run "$@" >"$tmp/out" 2>"$tmp/err"; then bad "weft run $* succeeded"; return; fi
  if grep -qF -- "$want" "$tmp/err"; then ok; else bad "weft run $*: expected '$want' in"; cat "$tmp/err"; fi
}
# ---- training from token files -------------------------------------------
# A token file made from a text with a byte-level tokenizer (ids < 256):
# the GPL's text, which every Debian system has (base-files).
TEXT=/usr/share/common-licenses/GPL-3
if python3 examples/tokens.py "$TEXT" "$tmp/text.bin" --val "$tmp/val.bin" >/dev/null &&
   python3 examples/tokens.py "$TEXT" "$tmp/text_all.bin" >/dev/null &&
   python3 examples/tokens.py "$TEXT" "$tmp/text_raw.bin" --raw >/dev/null; then ok
else bad "examples/tokens.py $TEXT"; fi
# the same tokens as raw uint32, and cut in two shards
python3 - "$tmp/text_raw.bin" "$tmp" <<'EOF'
import struct, sys
data = open(sys.argv[1], "rb").read()
toks = struct.unpack("<%dH" % (len(data) // 2), data)
open(sys.argv[2] + "/text32.bin", "wb").write(struct.pack("<%dI" % len(toks), *toks))
half = len(toks) // 2
open(sys.argv[2] + "/shard_0.bin", "wb").write(struct.pack("<%dH" % half, *toks[:half]))
open(sys.argv[2] + "/shard_1.bin", "wb").write(struct.pack("<%dH" % (len(toks) - half), *toks[half:]))
EOF
D="--data $tmp/text.bin --val-data $tmp/val.bin --eval-every 2 --eval-steps 2"
SCHED="--lr-schedule cosine --warmup 2 --decay-steps 6 --lr-min 6e-5 --clip 0.5"
# batches from the file, the schedule, clipping and evaluation under plans:
# every loss, validation loss and gradient norm matches one device
run_ok "gpt2 tp2_pp2 on a token file, cosine, clipping, evaluation" examples/gpt2.plan --plan tp2_pp2 $GPT $D $SCHED --steps 4
run_ok "gpt2 dp_zero3 on a token file, cosine, clipping, evaluation" examples/gpt2.plan --plan dp_zero3 $GPT $D $SCHED --steps 4
run_ok "megatron interleaved, zero 1, on a token file, clipping" examples/gpt_megatron.plan $MEG --set vocab=256 \
  --set interleave=2 --set zero=1 --set sequence_parallel=true $D $SCHED --steps 4

# llm.c's header, raw uint16, raw uint32 and two shards hold the same
# tokens: the same training, byte for byte; two shards are counted file
# after file, each cut into sequences of its own
T="examples/gpt2.plan --plan tp2 $GPT --steps 3 --seed 5"
"$WEFT" run $T --data "$tmp/text_all.bin" --save "$tmp/llmc.st" >/dev/null &&
"$WEFT" run $T --data "$tmp/text_raw.bin" --save "$tmp/raw.st" >/dev/null &&
"$WEFT" run $T --data "$tmp/text32.bin" --data-dtype uint32 --save "$tmp/raw32.st" >/dev/null || bad "runs on each format"
"$WEFT" run $T --data "$tmp/shard_*.bin" --save "$tmp/shards.st" >"$tmp/shards.out" || bad "a run on shards"
if cmp -s "$tmp/llmc.st" "$tmp/raw.st" && cmp -s "$tmp/llmc.st" "$tmp/raw32.st" &&
   grep -q "2 files, 35,149 tokens (raw uint16), 2,196 sequences of 16 tokens" "$tmp/shards.out"; then ok
  echo "run: llm.c's format, raw uint16 and raw uint32 train alike; shards are read file after file"
else bad "token formats differ"; cat "$tmp/shards.out"; fi

# stopping after 2 steps and resuming for 3 more gives the bytes of 5 steps
# straight, the position in the data and the schedule included, under two
# plans of 4 devices; the resumed run needs only --resume
for p in tp2_pp2 ulysses; do
  R="examples/gpt2.plan --plan $p $GPT --seed 11"
  "$WEFT" run $R $D $SCHED --steps 2 --save "$tmp/r2.st" >/dev/null &&
  "$WEFT" run $R --data "$tmp/text.bin" --steps 3 --resume "$tmp/r2.st" --save "$tmp/r5.st" >"$tmp/r.out" &&
  "$WEFT" run $R $D $SCHED --steps 5 --save "$tmp/s5.st" >/dev/null || bad "$p: resumed runs"
  if cmp -s "$tmp/r5.st" "$tmp/s5.st" && grep -q "from sequence 16" "$tmp/r.out"; then ok
    echo "run: $p: 2 steps + resume + 3 steps == 5 steps, byte for byte, with the data position and the schedule"
  else bad "$p: resuming a run on a token file is not bit-exact"; cat "$tmp/r.out"; fi
done
# (R is now ulysses's; s5.st its 5 steps)
# the same under mpirun, and a periodic checkpoint resumes as well
if command -v mpirun >/dev/null 2>&1; then
  if ASAN_OPTIONS=$asan_mpi mpirun -np 2 "$WEFT" run $R $D $SCHED --steps 5 --save "$tmp/m5.st" --check \
       >"$tmp/mpi.out" 2>&1 && grep -q "match$" "$tmp/mpi.out" && cmp -s "$tmp/m5.st" "$tmp/s5.st"; then ok
    echo "run: mpirun -np 2 on a token file with evaluation matches one device and saves the bytes of one process"
  else bad "mpirun -np 2 on a token file"; cat "$tmp/mpi.out"; fi
fi
"$WEFT" run $R $D $SCHED --steps 5 --save "$tmp/ck.st" --save-every 2 --keep 1 --print-every 5 >"$tmp/ck.out" &&
"$WEFT" run $R --data "$tmp/text.bin" --steps 1 --resume "$tmp/ck-step4.st" --save "$tmp/ck5.st" >/dev/null || bad "periodic checkpoints"
if [ ! -e "$tmp/ck-step2.st" ] && [ -e "$tmp/ck-step4.st" ] && cmp -s "$tmp/ck5.st" "$tmp/s5.st" && cmp -s "$tmp/ck.st" "$tmp/s5.st" &&
   [ "$(grep -c '^step ' "$tmp/ck.out")" = 4 ]; then ok
  echo "run: --save-every 2 --keep 1 keeps step 4's checkpoint, which resumes to the bytes of 5 steps"
else bad "--save-every and --keep"; ls "$tmp"; cat "$tmp/ck.out"; fi

# an evaluation measures the parameters as they are: --steps 0 on the
# checkpoint of step 4 gives the validation loss the run logged after step 4
"$WEFT" run $R --val-data "$tmp/val.bin" --eval-steps 2 --steps 0 --resume "$tmp/ck-step4.st" >"$tmp/ev.out" || bad "--steps 0 --val-data"
if grep -q "^step 4    val loss $(sed -n 's/^step 4    val loss \([0-9.]*\) .*/\1/p' "$tmp/ck.out") (2 batches)$" "$tmp/ev.out"; then ok
  echo "run: the validation loss of step 4's checkpoint is the one measured after step 4"
else bad "evaluating a checkpoint"; cat "$tmp/ck.out" "$tmp/ev.out"; fi

# the learning rate of every step, as --log and --json report it, against
# the documented formula; the log has one object per step and the
# validation loss where it was measured
L="examples/gpt2.plan --plan tp2 $GPT --data $tmp/text.bin --steps 9"
for s in "cosine --warmup 3 --lr-min 1e-4" "linear --warmup 2 --decay-steps 7 --lr-min 2e-5" "constant --warmup 4"; do
  # shellcheck disable=SC2086
  "$WEFT" run $L --lr 1e-3 --lr-schedule $s --val-data "$tmp/val.bin" --eval-every 4 --eval-steps 1 \
    --log "$tmp/lr.jsonl" --json >"$tmp/lr.json" || bad "a run with --lr-schedule $s"
  # shellcheck disable=SC2086
  if python3 - "$tmp/lr.jsonl" "$tmp/lr.json" $s <<'EOF'
import json, math, sys
log, out, kind = sys.argv[1], sys.argv[2], sys.argv[3]
opts = dict(zip(sys.argv[4::2], sys.argv[5::2]))
lr, lr_min = 1e-3, float(opts.get("--lr-min", 0))
warmup, decay = int(opts.get("--warmup", 0)), int(opts.get("--decay-steps", 9))
def want(t):  # t: the steps taken before this one
    if t < warmup: return lr * (t + 1) / warmup
    if kind == "constant": return lr
    if t >= decay: return lr_min
    p = (t - warmup) / (decay - warmup)
    return lr + (lr_min - lr) * p if kind == "linear" else lr_min + (lr - lr_min) * (1 + math.cos(math.pi * p)) / 2
lines = [json.loads(l) for l in open(log)]
steps = json.load(open(out))["steps"]
assert [l["step"] for l in lines] == list(range(1, 10)), "one log line per step"
for l, s in zip(lines, steps):
    assert abs(l["lr"] - want(l["step"] - 1)) <= 1e-12 * lr, (l["step"], l["lr"], want(l["step"] - 1))
    assert l["lr"] == s["lr"] and l["loss"] == s["loss"] and l["grad_norm"] == s["grad_norm"] > 0
    assert ("val_loss" in l) == (l["step"] in (4, 8, 9)), l
    assert l["tokens_per_s"] > 0 and l["time_s"] > 0
EOF
  then ok; echo "run: --lr-schedule $s: every step's learning rate is the formula's"
  else bad "--lr-schedule $s: learning rates or the log"; fi
done

# clipping changes the trajectory, as one device computes it: SGD (where
# the step scales with the gradient) under tp2 x dp2
C="examples/mlp.plan --steps 3"
run_ok "mlp tp2_dp2 clipped to a quarter of the gradient norm" $C --clip 0.12
"$WEFT" run $C --save "$tmp/noclip.st" >/dev/null && "$WEFT" run $C --clip 1e9 --save "$tmp/loose.st" >/dev/null &&
"$WEFT" run $C --clip 0.12 --save "$tmp/clip.st" >/dev/null || bad "mlp runs with --clip"
# same_tensors A B: the same tensors, bit for bit (the metadata, which
# records --clip, aside)
same_tensors() {
  python3 - "$1" "$2" <<'EOF'
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    head.pop("__metadata__", None)
    return head, b[8 + n:]
sys.exit(0 if tensors(sys.argv[1]) == tensors(sys.argv[2]) else 1)
EOF
}
if same_tensors "$tmp/noclip.st" "$tmp/loose.st" && ! same_tensors "$tmp/noclip.st" "$tmp/clip.st"; then ok
  echo "run: a bound above the norm changes no byte; one below it changes the parameters"
else bad "clipping: a loose bound changed the run, or a tight one did not"; fi

# a small GPT learns the text: seeded, 300 steps, the validation loss from
# 5.5 (uniform over 256 bytes) to below 3.0
if "$WEFT" run examples/gpt2.plan --plan tp2 --set layers=2 --set hidden=64 --set heads=4 --set seq=64 --set vocab=256 \
     --set batch=8 --data "$tmp/text.bin" --val-data "$tmp/val.bin" --eval-every 100 --steps 300 --lr 3e-3 \
     --lr-schedule cosine --warmup 20 --lr-min 3e-4 --clip 1 --print-every 100 --log "$tmp/learn.jsonl" >"$tmp/learn.out" &&
   v=$(sed -n 's/^step 300  val loss \([0-9.]*\) .*/\1/p' "$tmp/learn.out") && [ -n "$v" ] &&
   awk -v v="$v" 'BEGIN { exit !(v < 3.0) }' && [ "$(grep -c val_loss "$tmp/learn.jsonl")" = 3 ]; then ok
  echo "run: a 2-layer GPT on the GPL's text: validation loss $v after 300 steps (below 3.0; 5.55 at the start)"
else bad "a small GPT did not learn the text"; cat "$tmp/learn.out"; fi

# token files that do not fit are refused with the file and the reason
printf 'abc' >"$tmp/odd.bin"
python3 -c 'import struct,sys; open(sys.argv[1],"wb").write(struct.pack("<256i", 20240520, 1, 99, *[0]*253) + bytes(20))' "$tmp/hdr.bin"
python3 -c 'import struct,sys; open(sys.argv[1],"wb").write(struct.pack("<40H", *range(5), 300, *range(34)))' "$tmp/big.bin"
expect_err "odd.bin: 3 bytes are not a whole number of uint16 tokens" $T --data "$tmp/odd.bin"
expect_err "hdr.bin: its llm.c header says 99 tokens of 2 bytes, but 20 bytes follow the header" $T --data "$tmp/hdr.bin"
expect_err "big.bin: token 5 is 300; ids must lie below the model's vocabulary, 256" examples/gpt2.plan --plan tp2 $GPT \
  --set batch=2 --data "$tmp/big.bin" --steps 2
expect_err "odd.bin: 3 bytes are not a whole number of uint16 tokens" $T --val-data "$tmp/odd.bin"
python3 -c 'import struct,sys; open(sys.argv[1],"wb").write(struct.pack("<40H", *range(40)))' "$tmp/short.bin"
expect_err "short.bin: 2 sequences of 16 tokens; one batch needs 8" $T --val-data "$tmp/short.bin"
# a checkpoint whose recorded settings are not numbers is refused, naming them
for kv in "train.lr=nan" "train.data_pos=-3" "train.warmup=2.5"; do
  python3 - "$tmp/ck-step4.st" "$tmp/badmeta.st" "$kv" <<'EOF'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
head = json.loads(b[8:8 + n])
key, value = sys.argv[3].split("=")
head["__metadata__"][key] = value
text = json.dumps(head, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + b[8 + n:])
EOF
  expect_err "badmeta.st: ${kv%%=*} '${kv#*=}' in its metadata is not a" $R --data "$tmp/text.bin" --resume "$tmp/badmeta.st"
done

# --trace: every instruction of the traced step on each device's thread,
# named as its program names it, without overlap (tests/trace_check.py);
# with clipping the devices run their programs in two parts
G4="examples/gpt2.plan --plan tp2_pp2 --set layers=12 --set hidden=64 --set heads=4 --set seq=16 --set vocab=256 --set batch=8"
for d in 0 1 2 3; do "$WEFT" lower $G4 --device $d --json >"$tmp/low$d.json" || bad "weft lower --device $d --json"; done
for clip in "" "--clip 1"; do
  if "$WEFT" run $G4 --steps 3 --trace "$tmp/tr.json" --trace-step 2 $clip --json >"$tmp/tr.run" 2>"$tmp/err" &&
     python3 tests/trace_check.py "$tmp/tr.json" "$tmp/tr.run" 2 every "$tmp"/low[0-3].json >"$tmp/tr.out"; then ok
    echo "run: --trace, gpt2 tp2_pp2${clip:+ with $clip}: $(cat "$tmp/tr.out")"
  else bad "weft run --trace${clip:+ $clip}"; cat "$tmp/err" "$tmp/tr.out"; fi
done
# bench/trace_summary.py: its categories are weft's (--json, summed in C),
# its operators' rows add up to them, each device's idle time is within
# its span; bench/trace_compare.py: the run
# beside weft estimate's simulation
if python3 bench/trace_summary.py "$tmp/tr.json" 1000 >"$tmp/sum.out" &&
   python3 - "$tmp/sum.out" "$tmp/tr.run" <<'PY' && "$WEFT" estimate $G4 --trace "$tmp/est.json" >/dev/null &&
import json, re, sys
lines = open(sys.argv[1]).read().splitlines()
cats = {c.strip(): float(t) for c, t in re.findall(r"([a-z/ ]+?) ([0-9.]+) ms", lines[2].split(": ", 1)[1])}
weft = {c: 1e3 * t for c, t in json.load(open(sys.argv[2]))["trace"]["seconds"].items() if t > 0}
assert set(cats) == set(weft) and all(abs(cats[c] - weft[c]) <= 2e-3 for c in weft), (cats, weft)
rows = sum(float(l.split()[0]) for l in lines[4:])
assert abs(sum(cats.values()) - rows) <= 1e-3 * len(lines), (cats, rows)
# each of the four devices' time without an instruction, within its span
idle = re.findall(r"device (\d+) ([0-9.]+) ms \(([0-9.]+)%\)", lines[0].split("; idle between instructions: ", 1)[1])
span = float(re.search(r"([0-9.]+) ms from the first to the last", lines[0]).group(1))
assert sorted(d for d, _, _ in idle) == ["0", "1", "2", "3"] and all(0 <= float(t) <= span for _, t, _ in idle), lines[0]
PY
   python3 bench/trace_compare.py --merge "$tmp/both.json" "$tmp/tr.json" "$tmp/est.json" 0 5 >"$tmp/cmp.out" &&
   python3 -c 'import json, sys; n = {e["args"]["name"] for e in json.load(open(sys.argv[1]))["traceEvents"] if e["name"] == "process_name"}; assert {"device 0, ran", "device 0, simulated", "device 3, ran"} <= n, n' "$tmp/both.json" &&
   grep -q "^forward  *[0-9.]*  *[0-9.]*  *[0-9.]*$" "$tmp/cmp.out" && [ "$(grep -c "mb" "$tmp/cmp.out")" = 0 ]; then ok
  echo "run: bench/trace_summary.py's operators add up to its categories; trace_compare.py: $(sed -n 3p "$tmp/cmp.out" | tr -s ' ')"
else bad "bench/trace_summary.py or trace_compare.py"; cat "$tmp/sum.out" "$tmp/cmp.out"; fi
# names longer than the printers' 512-byte buffer (sub-models nested three
# deep, each named with 250 letters): whole in both traces, the same names
a=$(printf '%0250d' 0 | tr 0 a); b=$(printf '%0250d' 0 | tr 0 b); c=$(printf '%0250d' 0 | tr 0 c)
cat >"$tmp/long.plan" <<PLAN
use std
model inner(dim) {
  input x : f32[4, dim]
  param w : f32[dim, dim]
  $c = matmul(x, w)
  output $c
}
model mid(dim) {
  input x : f32[4, dim]
  $b = inner(x, dim = dim)
  output $b
}
model top(dim = 8) {
  input x : f32[4, dim]
  input y : f32[4, dim]
  $a = mid(x, dim = dim)
  loss = mse($a, y)
  train sgd(lr = 0.01)
}
plan one for top on cpus(1) {
  assign all -> 0
}
PLAN
if "$WEFT" estimate "$tmp/long.plan" --trace "$tmp/long_est.json" >/dev/null 2>"$tmp/err" &&
   "$WEFT" run "$tmp/long.plan" --trace "$tmp/long_run.json" >/dev/null 2>>"$tmp/err" &&
   python3 - "$tmp/long_est.json" "$tmp/long_run.json" "$a.$b.$c" >"$tmp/long.out" <<'PY'; then ok
import json, sys
names = [sorted(e["name"] for e in json.load(open(f))["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("a"))
         for f in sys.argv[1:3]]
want = sorted(sys.argv[3] + " " + d + " mb0" for d in ("forward", "backward"))
assert names[0] == want and names[1] == want, (names, want)
print(", ".join(f"{len(n)} bytes" for n in want))
PY
  echo "run: names of any length in traces (estimate's and run's): $(cat "$tmp/long.out")"
else bad "long names in traces"; cat "$tmp/err" "$tmp/long.out"; fi
# the trace's folder removed during the run: a warning, the run goes on
mkdir "$tmp/gone"
("$WEFT" run examples/gpt2.plan --plan tp2 --set layers=2 --set hidden=64 --set heads=4 --set seq=16 --set vocab=256 \
   --set batch=8 --steps 400 --print-every 1 --trace "$tmp/gone/t.json" >"$tmp/gone.out" 2>"$tmp/gone.err"; echo $? >"$tmp/gone.rc") &
n=0; while [ $n -lt 300 ] && ! grep -q "^step 1 " "$tmp/gone.out" 2>/dev/null; do sleep 0.1; n=$((n+1)); done
rm -rf "$tmp/gone"; wait
if [ "$(cat "$tmp/gone.rc")" = 0 ] && grep -q "^step 400 " "$tmp/gone.out" && grep -q "the run goes on without it" "$tmp/gone.err" &&
   ! grep -q "^trace of step" "$tmp/gone.out"; then ok; echo "run: --trace's folder removed during the run: $(cat "$tmp/gone.err")"
else bad "--trace's folder removed: exit $(cat "$tmp/gone.rc")"; cat "$tmp/gone.err"; tail -2 "$tmp/gone.out"; fi
expect_err "--trace $tmp/x.json: the run reads that file (--resume $tmp/x.json)" $G4 --steps 1 --trace "$tmp/x.json" \
  --resume "$tmp/x.json"
expect_err "--trace-step 2 needs --trace FILE" $G4 --steps 2 --trace-step 2
# the line after the traced step's, printed or not (--print-every)
if "$WEFT" run $G4 --steps 3 --print-every 2 --trace "$tmp/tr3.json" --trace-step 1 >"$tmp/tr3.out" 2>"$tmp/err" &&
   [ "$(grep -c "^trace of step 1 written" "$tmp/tr3.out")" = 1 ] && ! grep -q "^step 1 " "$tmp/tr3.out"; then ok
else bad "--trace-step 1 with --print-every 2"; cat "$tmp/tr3.out" "$tmp/err"; fi
# the line says what it wrote; the default step is the run's last
if "$WEFT" run $G4 --steps 2 --trace "$tmp/tr2.json" >"$tmp/tr2.out" 2>"$tmp/err" &&
   grep -q "^trace of step 2 written to $tmp/tr2.json: [0-9]* instructions, .* ms from the first to the last; forward" "$tmp/tr2.out" &&
   python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))["otherData"]; assert d["step"] == 2 and d["backend"] == "cpu" and "thread" in d["times"], d' "$tmp/tr2.json"; then ok
else bad "weft run --trace: its line or the file's step"; cat "$tmp/tr2.out" "$tmp/err"; fi
expect_err "--trace -: weft run prints its steps on standard output" $G4 --steps 1 --trace -
expect_err "--trace-step 4: this run runs steps 1 to 3" $G4 --steps 3 --trace "$tmp/x.json" --trace-step 4
expect_err "--trace $tmp/x.json: --steps 0 runs no step to trace" $G4 --steps 0 --trace "$tmp/x.json"
expect_err "--trace-step needs a positive count" $G4 --steps 1 --trace "$tmp/x.json" --trace-step 0
cp examples/gpt2.plan "$tmp/own.plan"
expect_err "--trace $tmp/own.plan" "$tmp/own.plan" --plan tp2 --set layers=2 --steps 1 --trace "$tmp/own.plan"
if cmp -s examples/gpt2.plan "$tmp/own.plan" && [ ! -e "$tmp/x.json" ]; then ok
else bad "a refused --trace wrote a file"; fi

# bad files: each refused with a message naming the tensor
G="examples/gpt2.plan --plan tp2 --set hidden=64 --set heads=4 --set seq=16 --set batch=8"
"$WEFT" run $G --set layers=12 --set vocab=256 --steps 0 --save "$tmp/w12.st" >/dev/null &&
"$WEFT" run $G --set layers=11 --set vocab=256 --steps 0 --save "$tmp/w11.st" >/dev/null &&
"$WEFT" run $G --set layers=12 --set vocab=128 --steps 0 --save "$tmp/v128.st" >/dev/null || bad "weft run --steps 0 --save"
S="$G --set layers=12 --set vocab=256"
expect_err "tensor wte.weight has shape [128, 64]; the model needs [256, 64]" $S --load "$tmp/v128.st"
expect_err "no tensor h.11.ln_1.weight" $S --load "$tmp/w11.st"
expect_err "tensor h.11.attn.c_attn.bias is not a parameter of model gpt2" $G --set layers=11 --set vocab=256 --load "$tmp/w12.st"
expect_err "nonexistent.st" $S --resume "$tmp/nonexistent.st"
expect_err "no tensor tokens" $S --inputs "$tmp/w12.st"
expect_err "backend 'cuda' is not available" $S --backend cuda
expect_err "--load and --resume exclude each other" $S --load "$tmp/w12.st" --resume "$tmp/w12.st"
expect_err "--steps needs a number" $S --steps -1

echo "run: $pass passed, $fail failed"
[ "$fail" = 0 ]
