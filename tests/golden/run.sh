#!/bin/sh
# run.sh - golden CLI tests: each tests/golden/DIR/NAME.plan is run through
# weft and its stdout, stderr and exit status compared with NAME.expected.
# NAME.args (optional) holds the arguments; default "check NAME.plan". The
# shell evaluates them in DIR: they may redirect stdin ("fmt - < x.plan"),
# and a test that needs a generated input may pipe it into "$WEFT" (see
# syntax/nesting_parser.args). Paths under this directory are printed as
# <golden>/... in the comparison.
# UPDATE=1 rewrites the expected files from what weft prints now; ONLY=DIR
# limits the run (and the rewrite) to tests/golden/DIR.
WEFT=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
root=$(cd "$(dirname "$0")" && pwd)
pass=0; fail=0
for plan in "$root"/${ONLY:-*}/*.plan; do
  dir=$(dirname "$plan"); name=$(basename "$plan" .plan)
  exp="$dir/$name.expected"
  args="check $name.plan"
  [ -f "$dir/$name.args" ] && args=$(cat "$dir/$name.args")
  out=$(mktemp); err=$(mktemp)
  (cd "$dir" && NO_COLOR=1 WEFT_STDLIB= eval "\"$WEFT\" $args" >"$out" 2>"$err" </dev/null)
  code=$?
  actual=$(mktemp)
  # absolute paths of the test tree (weft prints some, e.g. in an import
  # cycle) are shown as <golden>/..., so that the output does not depend
  # on where the tree is checked out
  { echo "exit: $code"; echo "--- stdout"; cat "$out"; echo "--- stderr"; cat "$err"; } |
    LC_ALL=C sed "s|$root/|<golden>/|g" >"$actual"
  if [ "${UPDATE:-0}" = 1 ]; then cp "$actual" "$exp"; fi
  if [ -f "$exp" ] && cmp -s "$actual" "$exp"; then
    pass=$((pass+1))
  else
    fail=$((fail+1))
    echo "FAIL: ${dir#$root/}/$name ($args)"
    if [ -f "$exp" ]; then diff -u "$exp" "$actual" | head -40; else echo "  missing $exp"; cat "$actual"; fi
  fi
  # a crash is never an acceptable answer, whatever the expected file says
  if [ "$code" -gt 2 ]; then echo "CRASH: ${dir#$root/}/$name exited $code"; fail=$((fail+1)); fi
  rm -f "$out" "$err" "$actual"
done
echo "golden: $pass passed, $fail failed"
[ "$fail" = 0 ]
