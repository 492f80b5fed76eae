#!/bin/sh
# fmt_check.sh WEFT - every .plan file under examples/, stdlib/ and tests/
# (tracked or untracked, not ignored) must be in canonical form
# (`WEFT fmt --check FILE`) and survive `WEFT fmt --roundtrip FILE`: parse,
# format, parse again to the same tree with the same comments, and formatting
# once more changes nothing.
#
# Intentionally malformed files are skipped:
#   - tests/golden/**/syntax_*.plan  (golden tests of syntax errors)
#   - any file named *.bad.plan      (malformed on purpose, anywhere)
#   - tests/fuzz/**                  (fuzzer seeds and crashers)
# tests/fmt/*.plan are formatter inputs, not canonical on purpose: they get
# the roundtrip check only (their canonical forms are tests/fmt/*.expected,
# compared by tests/unit/test_fmt.c).
set -u
WEFT=${1:?usage: tests/fmt_check.sh WEFT}
case $WEFT in /*) ;; *) WEFT=$(pwd)/$WEFT ;; esac
cd "$(dirname "$0")/.." || exit 2

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  list=$( { git ls-files -- '*.plan'; git ls-files --others --exclude-standard -- '*.plan'; } | sort -u)
else
  list=$(find examples stdlib tests -name '*.plan' 2>/dev/null | sort)
fi

pass=0
fail=0
while IFS= read -r f; do
  [ -n "$f" ] || continue
  case $f in examples/*|stdlib/*|tests/*) ;; *) continue ;; esac
  [ -f "$f" ] || continue            # deleted, still in the index
  base=${f##*/}
  case $f in tests/golden/*) case $base in syntax_*) continue ;; esac ;; esac
  case $base in *.bad.plan) continue ;; esac
  case $f in tests/fuzz/*) continue ;; esac
  ok=1
  case $f in
    tests/fmt/*) ;;
    *) "$WEFT" fmt --check "$f" || ok=0 ;;
  esac
  "$WEFT" fmt --roundtrip "$f" || ok=0
  if [ $ok = 1 ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "fmt-check: FAILED $f (see above; 'weft fmt -w $f' rewrites it in canonical form)"
  fi
done <<EOF
$list
EOF

echo "fmt-check: $pass passed, $fail failed"
[ $fail = 0 ]
