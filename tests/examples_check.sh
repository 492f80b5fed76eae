#!/bin/sh
# examples_check.sh - every example is valid, the standard models have the
# parameter counts of their reference checkpoints, and every plan of every
# example lowers to JSON that parses and is the same on every run.
WEFT=$1
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
for f in examples/*.plan; do
  if "$WEFT" check "$f" >/dev/null 2>/tmp/weft-ex.err; then ok; else bad "weft check $f"; cat /tmp/weft-ex.err; fi
done
params() { "$WEFT" graph examples/gpt2.plan --json "$@" | grep -o '"parameters":[0-9]*' | cut -d: -f2; }
n=$(params)
[ "$n" = 124439808 ] && ok || bad "GPT-2 small has $n parameters, not 124439808"
n=$(params --set layers=48 --set hidden=1600 --set heads=25)
[ "$n" = 1557611200 ] && ok || bad "GPT-2 XL has $n parameters, not 1557611200"
lparams() { "$WEFT" graph examples/llama_megatron.plan --json "$@" | grep -o '"parameters":[0-9]*' | cut -d: -f2; }
n=$(lparams --set layers=126 --set hidden=16384 --set heads=128 --set kv_heads=8 --set ffn=53248 --set vocab=128256)
[ "$n" = 405853388800 ] && ok || bad "Llama 3 405B has $n parameters, not 405853388800"
n=$(lparams --set layers=32 --set hidden=4096 --set heads=32 --set kv_heads=8 --set ffn=14336 --set vocab=128256)
[ "$n" = 8030261248 ] && ok || bad "Llama 3 8B has $n parameters, not 8030261248"
# the same graph twice gives the same bytes
a=$("$WEFT" graph examples/llama.plan --json | cksum); b=$("$WEFT" graph examples/llama.plan --json | cksum)
[ "$a" = "$b" ] && ok || bad "weft graph --json is not deterministic"
# every plan of every example lowers to the same JSON twice, and it parses
if command -v python3 >/dev/null 2>&1; then json=1; else json=0; echo "examples: no python3, the lowered JSON is not parsed"; fi
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
for f in examples/*.plan; do
  for p in $(grep -o '^plan [a-z_0-9]*' "$f" | cut -d ' ' -f 2); do
    if ! "$WEFT" lower "$f" --plan "$p" --json >"$tmp/a.json" 2>"$tmp/err"; then
      bad "weft lower $f --plan $p --json"; cat "$tmp/err"; continue
    fi
    # a program of more than 16 MB (every device of a large plan) is
    # checked through device 0's own program: parsing the whole would
    # take minutes and says nothing more
    if [ "$(wc -c <"$tmp/a.json")" -gt 16777216 ]; then
      "$WEFT" lower "$f" --plan "$p" --device 0 --json >"$tmp/a.json" 2>"$tmp/err" || { bad "weft lower $f --plan $p --device 0 --json"; cat "$tmp/err"; continue; }
      "$WEFT" lower "$f" --plan "$p" --device 0 --json >"$tmp/b.json" 2>/dev/null
    else
      "$WEFT" lower "$f" --plan "$p" --json >"$tmp/b.json" 2>/dev/null
    fi
    if cmp -s "$tmp/a.json" "$tmp/b.json"; then ok; else bad "weft lower $f --plan $p --json differs between two runs"; fi
    if [ "$json" = 1 ]; then
      if python3 -m json.tool "$tmp/a.json" >/dev/null 2>"$tmp/err"; then ok
      else bad "weft lower $f --plan $p --json is not valid JSON"; head -5 "$tmp/err"; fi
    fi
  done
done
echo "examples: $pass passed, $fail failed"
[ "$fail" = 0 ]
