#!/bin/sh
# lua_check.sh - weft search --heuristic (docs/lua.md):
#   - megatron.lua's policy writes the plan of the standard library's
#     megatron strategy: the same lowered program (weft lower --json) for a
#     GPT-2 on one DGX A100 node and for GPT-3 175B on sixteen;
#   - weft.estimate gives what weft estimate --json prints for the plan;
#   - heuristics change what the search returns: a prune that forbids
#     tp > 4 where the search alone picks tp 8, memory_first where it picks
#     the fastest, no_recompute, intra_node_tp and tp_then_pp;
#   - every script of tests/golden/lua/sb_*.lua (the sandbox's escapes and
#     runaways) ends in exit 1 with a message at the line marked `--> here`,
#     within 5 s and 512 MB (the memory bound is not checked under
#     SANITIZE, whose shadow memory counts too).
#   sh tests/lua_check.sh WEFT
WEFT=${1:-build/weft}
WEFT=$(cd "$(dirname "$WEFT")" && pwd)/$(basename "$WEFT")
here=$(cd "$(dirname "$0")" && pwd)
PLAN="$here/../examples/gpt_megatron.plan"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "lua: $1"; }
bad() { fail=$((fail + 1)); echo "FAIL: lua: $1"; [ -f "$tmp/err" ] && head -20 "$tmp/err"; }

# ---- megatron.lua against the megatron strategy --------------------------------
# program without the names of the plan and the model, as a digest
# (the plans weft search writes import their model from examples/)
program() { "$WEFT" lower --json --allow-path "$here/../examples" "$@" 2>"$tmp/err" | sed '1s/"plan":"[^"]*","model":"[^"]*"//' | cksum; }

megatron() {
  name=$1 nodes=$2; shift 2
  if ! "$WEFT" search "$PLAN" "$@" --cluster "a100_dgx(nodes = $nodes)" --heuristic megatron --json -o "$tmp/m.plan" \
       >"$tmp/m.json" 2>"$tmp/err"; then bad "$name: weft search --heuristic megatron"; return; fi
  set -- "$@" $(python3 -c '
import json, sys
d = json.load(open(sys.argv[1])); p = d["plans"][d["best"]]
assert d["policies"] and p["pp"] * p["tp"] * p["dp"] > 0
print("--set tp=%d --set pp=%d --set dp=%d --set micro_batch=%d --set nodes=%s"
      % (p["tp"], p["pp"], p["dp"], p["micro_batch_size"], sys.argv[2]))' "$tmp/m.json" "$nodes")
  a=$(program "$tmp/m.plan") b=$(program "$PLAN" "$@")
  if [ -n "$a" ] && [ "$a" = "$b" ] && ! grep -q error "$tmp/err"; then
    ok "$name: megatron.lua's policy and the megatron strategy lower to the same program ($(grep -o 'tp [0-9]*, pp [0-9]*, dp [0-9]*' "$tmp/m.plan" | head -1))"
  else
    bad "$name: the programs differ ($a against $b)"
  fi
}
megatron "GPT-2 124M on one node" 1 --set layers=12 --set hidden=768 --set heads=12 --set seq=1024 --set vocab=50304 \
  --set global_batch=8
megatron "GPT-3 175B on sixteen nodes" 16 --set layers=96 --set hidden=12288 --set heads=96 --set seq=2048 --set vocab=51200 \
  --set global_batch=8 --set dtype=bf16

# ---- weft.estimate is weft estimate --json ------------------------------------------
if "$WEFT" search "$here/../examples/mlp.plan" --cluster 'cpus(4)' --heuristic "$here/lua/estimate_same.lua" \
     -o "$tmp/e.plan" 2>"$tmp/e.err" >/dev/null &&
   "$WEFT" estimate --json --allow-path "$here/../examples" "$tmp/e.plan" >"$tmp/e.json" 2>"$tmp/err" &&
   python3 - "$tmp/e.err" "$tmp/e.json" <<'PY'
import json, sys
lua = [l for l in open(sys.argv[1]) if l.startswith("ESTIMATE ")]
a = json.loads(lua[0][len("ESTIMATE "):]); b = json.load(open(sys.argv[2]))
def same(x, y):  # an empty table is [] in Lua's JSON, {} or [] in weft's; null is nil, no key
    if isinstance(x, (dict, list)) and isinstance(y, (dict, list)) and not x and not y: return True
    if isinstance(x, dict) and isinstance(y, dict):
        y = {k: v for k, v in y.items() if v is not None}
        return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list): return len(x) == len(y) and all(map(same, x, y))
    return x == y and type(x) in (bool, str) or (type(x) not in (bool, str) and x == y)
sys.exit(0 if same(a, b) and len(b) > 10 else 1)
PY
then ok "weft.estimate gives the figures of weft estimate --json of the plan weft search writes"
else bad "weft.estimate and weft estimate --json differ"; fi

# ---- heuristics change what the search returns ----------------------------------------
SMALL="--set layers=4 --set hidden=1024 --set heads=16 --set seq=512 --set vocab=8192 --set global_batch=1"
search() { "$WEFT" search "$PLAN" $SMALL --cluster 'a100_dgx(nodes = 1)' --json "$@" 2>"$tmp/err"; }
search >"$tmp/plain.json" || bad "the search of a small GPT on one node"
search --heuristic "$here/lua/tp_at_most_2.lua" >"$tmp/tp2.json" || bad "the search with tp_at_most_2.lua"
search --heuristic memory_first >"$tmp/mem.json" || bad "the search with memory_first"
search --heuristic no_recompute >"$tmp/norc.json" || bad "the search with no_recompute"
search --heuristic intra_node_tp --heuristic tp_then_pp >"$tmp/rules.json" || bad "the search with intra_node_tp and tp_then_pp"
if python3 - "$tmp" <<'PY'
import json, sys
t = sys.argv[1]
def load(n):
    d = json.load(open("%s/%s.json" % (t, n)))
    return d, d["plans"][d["best"]]
plain, p = load("plain"); tp2, q = load("tp2"); mem, m = load("mem"); norc, n = load("norc"); rules, r = load("rules")
fail = []
def check(cond, what):
    print("lua:   %s: %s" % ("ok" if cond else "NOT", what))
    if not cond: fail.append(what)
check(p["tp"] == 8, "alone, the search picks tp %d" % p["tp"])
check(q["tp"] <= 2 and all(x["tp"] <= 2 for x in tp2["plans"]) and tp2["pruned"] > plain["pruned"],
      "with a prune of tp > 2: tp %d, %d of %d candidates pruned" % (q["tp"], tp2["pruned"], tp2["searched"]))
least = min(x["peak_memory_bytes"] for x in mem["simulated"] if x["fits"])
check(mem["ranked"] and m["peak_memory_bytes"] == least and m["peak_memory_bytes"] < p["peak_memory_bytes"],
      "memory_first: %.1f MiB per device, the least of those simulated, against %.1f MiB (%.2f ms against %.2f ms)"
      % (m["peak_memory_bytes"] / 2**20, p["peak_memory_bytes"] / 2**20, m["step_time_s"] * 1e3, p["step_time_s"] * 1e3))
check(all(x["recompute"] == "none" for x in norc["plans"]) and norc["searched"] < plain["searched"]
      and any(x["recompute"] != "none" for x in plain["plans"]),
      "no_recompute: %d candidates instead of %d, none recomputes" % (norc["searched"], plain["searched"]))
check(all(x["pp"] == 1 or x["tp"] == 8 for x in rules["plans"]) and any(x["pp"] > 1 and x["tp"] < 8 for x in plain["plans"]),
      "intra_node_tp and tp_then_pp: pipelines only over whole nodes of tensor parallelism")
sys.exit(1 if fail else 0)
PY
then ok "heuristics steer the search"; else bad "heuristics do not steer the search as they should"; fi

# ---- the sandbox ---------------------------------------------------------------------
for lua in "$here"/golden/lua/sb_*.lua; do
  name=$(basename "$lua" .lua)
  line=$(grep -n -- '--> here' "$lua" | head -1 | cut -d: -f1)
  start=$(date +%s%N)
  (cd "$here/golden/lua" && command time -f '%M' -o "$tmp/rss" "$WEFT" search "$name.plan" --cluster 'cpus(4)' \
     --heuristic "$name.lua" >/dev/null 2>"$tmp/err")
  code=$?
  secs=$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')
  kb=$(tail -1 "$tmp/rss")
  if [ "$code" != 1 ]; then bad "$name: exit $code, not 1"
  elif ! grep -q "^$name.lua:$line:" "$tmp/err"; then bad "$name: no message at $name.lua:$line"
  elif awk -v s="$secs" 'BEGIN { exit !(s > 5) }'; then bad "$name: $secs s"
  elif [ -z "${SANITIZE:-}" ] && [ "$kb" -gt 524288 ]; then bad "$name: $kb KB"
  else ok "$name: exit 1 at $name.lua:$line in $secs s, $((kb / 1024)) MB"; fi
done

echo "lua: $pass passed, $fail failed"
[ $fail -eq 0 ]
