#!/bin/sh
# examples_check.sh - every example is valid, and the standard models have
# the parameter counts of their reference checkpoints.
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
# the same graph twice gives the same bytes
a=$("$WEFT" graph examples/llama.plan --json | cksum); b=$("$WEFT" graph examples/llama.plan --json | cksum)
[ "$a" = "$b" ] && ok || bad "weft graph --json is not deterministic"
echo "examples: $pass passed, $fail failed"
[ "$fail" = 0 ]
