#!/bin/sh
# run_unit.sh - runs each cmocka test binary and sums the results.
pass=0; fail=0
for t in "$@"; do
  if "$t" >"$t.log" 2>&1; then pass=$((pass+1)); else fail=$((fail+1)); cat "$t.log"; fi
  grep -E '^\[  (PASSED|FAILED)' "$t.log" | sed "s|^|$(basename "$t"): |"
done
echo "unit: $pass passed, $fail failed"
[ "$fail" = 0 ]
