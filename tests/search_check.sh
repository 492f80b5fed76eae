#!/bin/sh
# search_check.sh - weft search is never worse than a hand-tuned plan: for
# the Megatron-LM configurations of docs/estimate.md's calibration (and
# GPT-3 175B as Narayanan et al. ran it: tp 8, pp 16, interleaved 2, on
# 1024 A100s), the plan the search writes for the same model, cluster and
# global batch simulates at least as fast as the published configuration.
#   sh tests/search_check.sh WEFT
WEFT=${1:-build/weft}
here=$(cd "$(dirname "$0")" && pwd)
PLAN="$here/../examples/gpt_megatron.plan"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0

# case NAME LAYERS HIDDEN HEADS GPUS TP PP GLOBAL_BATCH MICRO_BATCH INTERLEAVE RECOMPUTE
case_() {
  name=$1 l=$2 h=$3 a=$4 n=$5 tp=$6 pp=$7 B=$8 mb=$9; shift 9
  v=$1 rc=$2
  dp=$((n / (tp * pp))); nodes=$((n / 8))
  M="--set layers=$l --set hidden=$h --set heads=$a --set seq=2048 --set vocab=51200 --set global_batch=$B --set dtype=bf16"
  if ! "$WEFT" estimate "$PLAN" $M --set tp=$tp --set pp=$pp --set dp=$dp --set nodes=$nodes --set micro_batch=$mb \
       --set interleave=$v --set "recompute=\"$rc\"" --json >"$tmp/pub.json" 2>"$tmp/err"; then
    echo "FAIL: $name: the published configuration does not estimate"; cat "$tmp/err"; fail=$((fail + 1)); return
  fi
  if ! "$WEFT" search "$PLAN" $M --cluster "a100_dgx(nodes = $nodes)" --json -o "$tmp/searched.plan" >"$tmp/s.json" 2>"$tmp/err"; then
    echo "FAIL: $name: weft search"; cat "$tmp/err"; fail=$((fail + 1)); return
  fi
  if python3 - "$tmp/pub.json" "$tmp/s.json" "$name" "$tp" "$pp" "$dp" "$v" "$rc" <<'PY'
import json, sys
pub = json.load(open(sys.argv[1])); s = json.load(open(sys.argv[2]))
name, tp, pp, dp, v, rc = sys.argv[3:9]
p = s["plans"][s["best"]]
ok = p["step_time_s"] <= pub["step_time_s"] * 1.0001
print("search: %s: %.3f s per step searched (tp %d, pp %d, dp %d, %d micro-batches of %d, %s, recompute %s, zero %d), "
      "%.3f s published (tp %s, pp %s, dp %s, interleave %s, recompute %s): %s"
      % (name, p["step_time_s"], p["tp"], p["pp"], p["dp"], p["micro_batches"], p["micro_batch_size"], p["schedule"],
         p["recompute"], p["zero"], pub["step_time_s"], tp, pp, dp, v, rc, "not worse" if ok else "WORSE"))
sys.exit(0 if ok else 1)
PY
  then pass=$((pass + 1)); else fail=$((fail + 1)); fi
}

case_ "GPT 1.7B on 32 A100s" 24 2304 24 32 1 1 512 4 1 full
case_ "GPT 145.6B on 1536 A100s" 80 12288 96 1536 8 8 2304 1 2 full
case_ "GPT-3 175B on 1024 A100s" 96 12288 96 1024 8 16 1536 1 2 none
# A sequence that fits only split: a Llama of 2 layers at sequence 32768,
# batch 2, on two DGX A100 nodes under 1 GiB a device. Tensor parallelism
# stops at a node and the batch gives two replicas at most: without context
# parallelism no plan fits (a space narrowed to cp 1 finds none); with it
# the search writes a cp plan that weft check accepts and weft estimate
# puts at the search's figure.
LL="$here/../examples/llama.plan"
LM="--set layers=2 --set hidden=512 --set heads=8 --set kv_heads=2 --set ffn=1376 --set seq=32768 --set vocab=32000 --set batch=2"
printf 'return {\n  space = function(s, model, cluster)\n    s.cp = {1}\n  end,\n}\n' >"$tmp/no_cp.lua"
if "$WEFT" search "$LL" $LM --cluster 'a100_dgx(nodes = 2)' --max-memory '1 GiB' --heuristic "$tmp/no_cp.lua" \
     -o "$tmp/no_cp.plan" >/dev/null 2>"$tmp/err"; then
  echo "FAIL: long sequence: a plan without context parallelism fits 1 GiB"; fail=$((fail + 1))
elif ! grep -q "fits" "$tmp/err"; then
  echo "FAIL: long sequence without context parallelism:"; cat "$tmp/err"; fail=$((fail + 1))
elif ! "$WEFT" search "$LL" $LM --cluster 'a100_dgx(nodes = 2)' --max-memory '1 GiB' --json -o "$tmp/cp.plan" \
     >"$tmp/cp.json" 2>"$tmp/err"; then
  echo "FAIL: long sequence: weft search"; cat "$tmp/err"; fail=$((fail + 1))
elif ! "$WEFT" check "$tmp/cp.plan" --allow-path "$here/../examples" >/dev/null 2>"$tmp/err"; then
  echo "FAIL: long sequence: weft check of the searched plan"; cat "$tmp/err"; fail=$((fail + 1))
elif ! "$WEFT" estimate "$tmp/cp.plan" --allow-path "$here/../examples" --json >"$tmp/est.json" 2>"$tmp/err"; then
  echo "FAIL: long sequence: weft estimate of the searched plan"; cat "$tmp/err"; fail=$((fail + 1))
elif python3 - "$tmp/cp.json" "$tmp/est.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); e = json.load(open(sys.argv[2]))
p = s["plans"][s["best"]]
close = abs(e["step_time_s"] - p["step_time_s"]) <= 0.01 * p["step_time_s"]
ok = p["cp"] > 1 and p["fits"] and p["peak_memory_bytes"] <= 2**30 and close
print("search: long sequence: tp %d, cp %d, dp %d, %s recompute: %.1f ms, %.0f MiB per device searched, %.1f ms estimated: %s"
      % (p["tp"], p["cp"], p["dp"], p["recompute"], p["step_time_s"] * 1e3, p["peak_memory_bytes"] / 2**20,
         e["step_time_s"] * 1e3, "ok" if ok else "WRONG"))
sys.exit(0 if ok else 1)
PY
then pass=$((pass + 1)); else fail=$((fail + 1)); fi

# A mixture of experts: Mixtral-8x7B's shape on eight DGX H100 nodes. The
# searched plan (expert parallelism among its dimensions) is at least as
# fast as the hand-written ep 8 x tp 2 x pp 4 of examples/mixtral.plan,
# weft check accepts it, and weft estimate puts it at the search's figure.
MX="$here/../examples/mixtral.plan"
if ! "$WEFT" estimate "$MX" --json >"$tmp/mx_hand.json" 2>"$tmp/err"; then
  echo "FAIL: Mixtral: the hand-written plan does not estimate"; cat "$tmp/err"; fail=$((fail + 1))
elif ! "$WEFT" search "$MX" --cluster 'h100_dgx(nodes = 8)' --json -o "$tmp/mx.plan" >"$tmp/mx.json" 2>"$tmp/err"; then
  echo "FAIL: Mixtral: weft search"; cat "$tmp/err"; fail=$((fail + 1))
elif ! "$WEFT" check "$tmp/mx.plan" --allow-path "$here/../examples" >/dev/null 2>"$tmp/err"; then
  echo "FAIL: Mixtral: weft check of the searched plan"; cat "$tmp/err"; fail=$((fail + 1))
elif ! "$WEFT" estimate "$tmp/mx.plan" --allow-path "$here/../examples" --json >"$tmp/mx_est.json" 2>"$tmp/err"; then
  echo "FAIL: Mixtral: weft estimate of the searched plan"; cat "$tmp/err"; fail=$((fail + 1))
elif python3 - "$tmp/mx_hand.json" "$tmp/mx.json" "$tmp/mx_est.json" <<'PY'
import json, sys
hand = json.load(open(sys.argv[1])); s = json.load(open(sys.argv[2])); e = json.load(open(sys.argv[3]))
p = s["plans"][s["best"]]
close = abs(e["step_time_s"] - p["step_time_s"]) <= 0.01 * p["step_time_s"]
ok = p["fits"] and p["step_time_s"] <= hand["step_time_s"] * 1.0001 and close
print("search: Mixtral 8x7B on 64 H100: %.3f s per step searched (tp %d, pp %d, ep %d, dp %d, %d micro-batches of %d, %s, "
      "recompute %s, zero %d), %.3f s estimated again, %.3f s hand-written (ep 8, tp 2, pp 4): %s"
      % (p["step_time_s"], p["tp"], p["pp"], p["ep"], p["dp"], p["micro_batches"], p["micro_batch_size"], p["schedule"],
         p["recompute"], p["zero"], e["step_time_s"], hand["step_time_s"], "not worse" if ok else "WRONG"))
sys.exit(0 if ok else 1)
PY
then pass=$((pass + 1)); else fail=$((fail + 1)); fi
# Its frontier's memory end (the candidates simulated beyond the 24 fastest
# by the analytic cost) takes a pipeline in another schedule than one
# simulated only for under 95% of that one's analytic memory: its plans of
# 64 micro-batches, every device lowered, are the dearest to simulate.
if [ -s "$tmp/mx.json" ] && python3 - "$tmp/mx.json" <<'PY'
import json, re, sys
s = json.load(open(sys.argv[1]))
sims = sorted(s["simulated"], key=lambda q: q["analytic_time_s"])
def pipeline(q):  # the description without its schedule
    return re.sub(r", (one_f_one_b|gpipe|interleaved \d+)", "", q["plan"])
again = [(a["plan"], b["plan"]) for i, b in enumerate(sims) if i >= 24 for a in sims[:i]
         if pipeline(a) == pipeline(b) and a["plan"] != b["plan"] and b["analytic_memory_bytes"] >= 0.95 * a["analytic_memory_bytes"]]
print("search: Mixtral 8x7B on 64 H100: %d of %d simulated on the frontier's memory end, %s" % (
    max(len(sims) - 24, 0), len(sims), "each pipeline once but for a step of memory" if not again else
    "WRONG: simulated again in another schedule: " + "; ".join("%s after %s" % (b, a) for a, b in again)))
sys.exit(0 if not again else 1)
PY
then pass=$((pass + 1)); else fail=$((fail + 1)); fi

# A small mixture of experts on four CPU devices, the space narrowed to
# ep 2 by a heuristic: the searched plan trains as one device does.
printf 'return {\n  space = function(s, model, cluster)\n    s.ep = {2}\n  end,\n}\n' >"$tmp/ep2.lua"
MO="$here/../examples/moe.plan"
if ! "$WEFT" search "$MO" --cluster 'cpus(4)' --heuristic "$tmp/ep2.lua" --json -o "$tmp/moe.plan" >"$tmp/moe.json" 2>"$tmp/err"; then
  echo "FAIL: small MoE: weft search"; cat "$tmp/err"; fail=$((fail + 1))
elif ! python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if d["plans"][d["best"]]["ep"] == 2 else 1)' "$tmp/moe.json"; then
  echo "FAIL: small MoE: the searched plan has no ep 2"; fail=$((fail + 1))
elif ! "$WEFT" run "$tmp/moe.plan" --allow-path "$here/../examples" --steps 2 --check >"$tmp/moe.out" 2>&1 || \
     ! grep -q "match$" "$tmp/moe.out"; then
  echo "FAIL: small MoE: weft run --check of the searched plan"; cat "$tmp/moe.out"; fail=$((fail + 1))
else
  echo "search: small MoE on cpus(4), ep 2: $(tail -1 "$tmp/moe.out")"; pass=$((pass + 1))
fi

# Two searches of one model on one cluster, each with its heuristics
# (space-separated files, or none): the first written to $tmp/PREFIX.plan
# and checked and estimated again; the JSON of each in $tmp/PREFIX.json,
# $tmp/PREFIX_other.json and $tmp/PREFIX_est.json. Fails, saying why, at
# the first step that does.
two_searches() {
  what=$1 prefix=$2 model=$3 cluster=$4 first=$5 other=$6
  h1=; for h in $first; do h1="$h1 --heuristic $h"; done
  h2=; for h in $other; do h2="$h2 --heuristic $h"; done
  # shellcheck disable=SC2086
  if ! "$WEFT" search "$model" --cluster "$cluster" $h1 --json -o "$tmp/$prefix.plan" >"$tmp/$prefix.json" 2>"$tmp/err"; then
    echo "FAIL: $what: weft search"
  elif ! "$WEFT" search "$model" --cluster "$cluster" $h2 --json >"$tmp/${prefix}_other.json" 2>"$tmp/err"; then
    echo "FAIL: $what: weft search of the other space"
  elif ! "$WEFT" check "$tmp/$prefix.plan" >/dev/null 2>"$tmp/err"; then
    echo "FAIL: $what: weft check of the searched plan"
  elif ! "$WEFT" estimate "$tmp/$prefix.plan" --json >"$tmp/${prefix}_est.json" 2>"$tmp/err"; then
    echo "FAIL: $what: weft estimate of the searched plan"
  else
    return 0
  fi
  cat "$tmp/err"
  return 1
}

# A pipeline whose stages have meshes of different shapes: a Llama with a
# large vocabulary on two DGX A100 nodes, the space narrowed to two stages
# without ZeRO. The first stage, three blocks, takes tp 8 on its node, the
# one with the last block and the head tp 4 x dp 2; weft check accepts the plan, weft estimate
# puts it at the search's figure, and it is faster than the best plan of
# the same space with every stage on one shape (nonuniform = false).
cat >"$tmp/nu.plan" <<'EOF2'
use std
model g = llama(layers = 4, hidden = 1024, heads = 16, kv_heads = 8, ffn = 2816, seq = 512, vocab = 65536, batch = 8)
EOF2
printf 'return {\n  space = function(s, model, cluster)\n    s.pp = {2}\n    s.zero = {0}\n  end,\n}\n' >"$tmp/pp2.lua"
printf 'return {\n  space = function(s, model, cluster)\n    s.nonuniform = false\n  end,\n}\n' >"$tmp/uniform.lua"
if two_searches "stages of different meshes" nu_s "$tmp/nu.plan" 'a100_dgx(nodes = 2)' "$tmp/pp2.lua" \
     "$tmp/pp2.lua $tmp/uniform.lua" && python3 - "$tmp/nu_s.json" "$tmp/nu_s_other.json" "$tmp/nu_s_est.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); u = json.load(open(sys.argv[2])); e = json.load(open(sys.argv[3]))
p = s["plans"][s["best"]]; q = u["plans"][u["best"]]
close = abs(e["step_time_s"] - p["step_time_s"]) <= 0.01 * p["step_time_s"]
shapes = sorted(set((st["tp"], st["dp"]) for st in p["stages"]))
ok = not p["uniform"] and len(shapes) > 1 and q["uniform"] and p["step_time_s"] < q["step_time_s"] and close
print("search: stages of different meshes: %.2f ms (stages %s), %.2f ms estimated again; one mesh for all: %.2f ms "
      "(tp %d, dp %d): %s" % (p["step_time_s"] * 1e3, ", ".join("tp %d x dp %d" % (st["tp"], st["dp"]) for st in p["stages"]),
      e["step_time_s"] * 1e3, q["step_time_s"] * 1e3, q["tp"], q["dp"], "faster" if ok else "WRONG"))
sys.exit(0 if ok else 1)
PY
then pass=$((pass + 1)); else fail=$((fail + 1)); fi

# Stages of different sizes: the same Llama on three DGX A100 nodes (no two
# stages of 12 devices lie inside a node or on whole nodes), the whole
# space. The best plan puts the stage with the head on two nodes and the
# first stage on one; weft check accepts it, weft estimate puts it at the
# search's figure, and it is faster than the best plan whose stages share
# one mesh shape (nonuniform = false).
if two_searches "stages of different sizes" sz "$tmp/nu.plan" 'a100_dgx(nodes = 3)' "" "$tmp/uniform.lua" &&
   python3 - "$tmp/sz.json" "$tmp/sz_other.json" "$tmp/sz_est.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); u = json.load(open(sys.argv[2])); e = json.load(open(sys.argv[3]))
p = s["plans"][s["best"]]; q = u["plans"][u["best"]]
close = abs(e["step_time_s"] - p["step_time_s"]) <= 0.01 * p["step_time_s"]
sizes = [st["devices"] for st in p["stages"]]
ok = not p["uniform"] and len(set(sizes)) > 1 and sum(sizes) == 24 and p["step_time_s"] < q["step_time_s"] and close
print("search: stages of different sizes: %.2f ms (stages %s), %.2f ms estimated again; stages of one shape: %.2f ms "
      "(tp %d, pp %d, dp %d): %s" % (p["step_time_s"] * 1e3, ", ".join("%d devices tp %d x dp %d" % (st["devices"], st["tp"], st["dp"])
      for st in p["stages"]), e["step_time_s"] * 1e3, q["step_time_s"] * 1e3, q["tp"], q["pp"], q["dp"], "faster" if ok else "WRONG"))
sys.exit(0 if ok else 1)
PY
then pass=$((pass + 1)); else fail=$((fail + 1)); fi

# A deeper pipeline whose stages have different sizes: the Llama with a
# vocabulary of 131072 on three DGX A100 nodes, the space narrowed to three
# stages. The best plan puts the stage with the head on two nodes and the
# two stages before it on half a node each; weft check accepts it, weft
# estimate puts it at the search's figure, and it is at least as fast as
# the best plan of the same space whose stages all have as many devices
# (a prune hook that drops the others).
sed 's/vocab = 65536/vocab = 131072/' "$tmp/nu.plan" >"$tmp/deep.plan"
printf 'return {\n  space = function(s, model, cluster)\n    s.pp = {3}\n  end,\n}\n' >"$tmp/pp3.lua"
cat >"$tmp/equal.lua" <<'EOF2'
return {
  prune = function(c)
    for _, st in ipairs(c.stages) do
      if st.devices ~= c.stages[1].devices then return false end
    end
  end,
}
EOF2
if two_searches "three stages of different sizes" deep_s "$tmp/deep.plan" 'a100_dgx(nodes = 3)' "$tmp/pp3.lua" \
     "$tmp/pp3.lua $tmp/equal.lua" && python3 - "$tmp/deep_s.json" "$tmp/deep_s_other.json" "$tmp/deep_s_est.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); u = json.load(open(sys.argv[2])); e = json.load(open(sys.argv[3]))
p = s["plans"][s["best"]]; q = u["plans"][u["best"]]
close = abs(e["step_time_s"] - p["step_time_s"]) <= 0.01 * p["step_time_s"]
sizes = [st["devices"] for st in p["stages"]]
qsizes = [st["devices"] for st in q["stages"]] or [24 // q["pp"]] * q["pp"]
ok = (not p["uniform"] and p["pp"] == 3 and len(sizes) == 3 and len(set(sizes)) > 1 and sum(sizes) == 24 and
      len(set(qsizes)) == 1 and q["pp"] == 3 and p["step_time_s"] <= q["step_time_s"] and close)
print("search: three stages of different sizes: %.2f ms (stages %s), %.2f ms estimated again; three stages of %d devices: "
      "%.2f ms: %s" % (p["step_time_s"] * 1e3, ", ".join("%d devices tp %d x dp %d" % (st["devices"], st["tp"], st["dp"])
      for st in p["stages"]), e["step_time_s"] * 1e3, qsizes[0], q["step_time_s"] * 1e3, "not slower" if ok else "WRONG"))
sys.exit(0 if ok else 1)
PY
then pass=$((pass + 1)); else fail=$((fail + 1)); fi

echo "search: $pass passed, $fail failed"
[ $fail -eq 0 ]
