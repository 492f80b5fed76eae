#!/bin/sh
# docs_check.sh - runs the weft examples of documents: each ```weft block
# must pass `weft check`; each ```weft-error block must be rejected (exit 1)
# with a message containing the text of its first line, "# error: TEXT".
# (tests/docs_examples.py runs the commands the documents show.)
#   sh tests/docs_check.sh WEFT DOC.md...
WEFT=$1; shift
tmp=$(mktemp -d)
pass=0; fail=0
for doc in "$@"; do
  rm -f "$tmp"/*.plan
  awk -v dir="$tmp" '
    /^```weft(-error)?[ \t]*$/ { n++; kind = ($0 ~ /error/) ? "error" : "ok"; file = sprintf("%s/%03d-%s.plan", dir, n, kind); inb = 1; next }
    /^```/ && inb { inb = 0; close(file); next }
    inb { print > file }
  ' "$doc"
  for f in "$tmp"/*.plan; do
    [ -e "$f" ] || continue
    case "$f" in
    *-ok.plan)
      if "$WEFT" check "$f" >/dev/null 2>"$tmp/err"; then pass=$((pass+1)); else
        fail=$((fail+1)); echo "FAIL: example $(basename "$f") of $doc is rejected:"; sed 's/^/  /' "$f"; cat "$tmp/err"; fi ;;
    *-error.plan)
      want=$(sed -n '1s/^# error: //p' "$f")
      "$WEFT" check "$f" >/dev/null 2>"$tmp/err"; code=$?
      if [ "$code" = 1 ] && [ -n "$want" ] && grep -qF -- "$want" "$tmp/err"; then pass=$((pass+1)); else
        fail=$((fail+1)); echo "FAIL: example $(basename "$f") of $doc: exit $code, wanted 1 and \"$want\":"; cat "$tmp/err"; fi ;;
    esac
  done
done
rm -rf "$tmp"
echo "docs: $pass passed, $fail failed"
[ "$fail" = 0 ]
