#!/bin/sh
# mutate_check.sh WEFT - weft check on mutated copies of the examples.
#
# For every examples/*.plan and every line that holds a split, assign,
# replicate, stage or schedule statement, mutants are made of the file:
#   - the line deleted;
#   - each integer of the line set to 0, 1, 3 and 1000000, one at a time;
#   - `in time` taken off a split that has it, put on one that has not;
#   - each name of the line (selector, dimension, axis, mesh, stage,
#     schedule) misspelt, one at a time (its last letter doubled).
# Each mutant is checked (`weft check`, 20 s at most) in a temporary
# directory, under the example's own file name, beside copies of the other
# examples. A mutant passes when weft
# accepts it (exit 0) or rejects it (exit 1) with at least one
# `FILE:LINE:COL: error:` line; it fails when weft crashes, a sanitizer
# reports, it runs out of time, or it rejects without a position.
#
# MUTATE_MAX (default 1000) bounds the number of mutants run: beyond it, an
# evenly spaced selection is taken, the same on every run.
#
# usage: sh tests/mutate_check.sh WEFT
set -u
WEFT=${1:?usage: tests/mutate_check.sh WEFT}
case $WEFT in /*) ;; *) WEFT=$(pwd)/$WEFT ;; esac
cd "$(dirname "$0")/.." || exit 2
max=${MUTATE_MAX:-1000}

tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
trap 'exit 2' INT TERM

# a crash is a failure even where a sanitizer would exit with status 1
ASAN_OPTIONS="exitcode=86:${ASAN_OPTIONS:-}"
UBSAN_OPTIONS="exitcode=87:${UBSAN_OPTIONS:-}"
export ASAN_OPTIONS UBSAN_OPTIONS

if command -v timeout >/dev/null 2>&1; then limit="timeout 20"; else limit=""; fi

# ---- 1. the mutants: FILE \001 LINE \001 WHAT \001 NEW-LINE ('' deletes) ----
for f in examples/*.plan; do
  [ -f "$f" ] || continue
  awk -v file="$f" '
  BEGIN {
    SEP = "\001"
    split("split assign replicate stage schedule on into as in time", k, " ")
    for (i in k) keyword[k[i]] = 1
    nv = split("0 1 3 1000000", vals, " ")
  }
  # the byte where a comment starts (outside strings), or length + 1
  function comment_at(s,   i, c, q) {
    q = 0
    for (i = 1; i <= length(s); i++) {
      c = substr(s, i, 1)
      if (q && c == "\\") { i++; continue }
      if (c == "\"") q = !q
      else if (c == "#" && !q) return i
    }
    return length(s) + 1
  }
  function emit(what, line) { print file SEP NR SEP what SEP line }
  $0 ~ /^[ \t]*(split|assign|replicate|stage|schedule)([^A-Za-z0-9_]|$)/ {
    cut = comment_at($0)
    code = substr($0, 1, cut - 1); rest = substr($0, cut)
    emit("delete", "")
    # integers: digit runs that are not part of a name
    s = code; off = 0
    while (match(s, /[0-9]+/)) {
      at = off + RSTART; len = RLENGTH
      before = at > 1 ? substr(code, at - 1, 1) : ""
      after = substr(code, at + len, 1)
      if (before !~ /[A-Za-z_]/ && after !~ /[A-Za-z_]/) {
        num = substr(code, at, len)
        for (v = 1; v <= nv; v++)
          if (vals[v] != num + 0)
            emit("integer " num " -> " vals[v], substr(code, 1, at - 1) vals[v] substr(code, at + len) rest)
      }
      off = at + len - 1; s = substr(code, off + 1)
    }
    # in time, off or on
    if (code ~ /[ \t]in[ \t]+time([^A-Za-z0-9_]|$)/) {
      t = code; sub(/[ \t]+in[ \t]+time/, "", t)
      emit("in time off", t rest)
    } else if (code ~ /^[ \t]*split[ \t]/) {
      t = code; sub(/[ \t]+$/, "", t)
      emit("in time on", t " in time" (rest == "" ? "" : "  " rest))
    }
    # names, each misspelt at its first occurrence
    s = code; off = 0; split("", seen)
    while (match(s, /[A-Za-z_][A-Za-z0-9_]*/)) {
      at = off + RSTART; len = RLENGTH
      name = substr(code, at, len)
      before = at > 1 ? substr(code, at - 1, 1) : ""
      off = at + len - 1; s = substr(code, off + 1)
      if (before ~ /[0-9]/ || (name in keyword) || (name in seen)) continue
      seen[name] = 1
      wrong = name substr(name, len, 1)
      emit("name " name " -> " wrong, substr(code, 1, at - 1) wrong substr(code, at + len) rest)
    }
  }' "$f"
done > "$tmp/all"

total=$(wc -l < "$tmp/all" | tr -d ' ')
if [ "$total" -gt "$max" ]; then
  # an evenly spaced selection of max mutants, the same on every run
  awk -v n="$total" -v m="$max" 'int(NR * m / n) != int((NR - 1) * m / n)' "$tmp/all" > "$tmp/run"
  echo "mutate: $total mutants made, running $max of them (MUTATE_MAX)"
else
  cp "$tmp/all" "$tmp/run"
fi

# ---- 2. each mutant through weft check, in MUTATE_JOBS (default 2) workers --
# run_part LIST DIR: the mutants of LIST; DIR/counts gets "n valid rejected
# failures", DIR/log the failures
run_part() {
  list=$1; dir=$2
  n=0; valid=0; rejected=0; failures=0
  mkdir "$dir/m" || exit 2
  # the other examples beside each mutant, for a file that imports one
  cp examples/*.plan "$dir/m/" || exit 2
  sep=$(printf '\001')
  while IFS=$sep read -r f line what new; do
    name=$(basename "$f")
    MUT_NEW=$new awk -v n="$line" -v del="$([ "$what" = delete ] && echo 1)" '
      NR == n { if (!del) print ENVIRON["MUT_NEW"]; next }
      { print }' "$f" > "$dir/m/$name"
    n=$((n + 1))
    (cd "$dir/m" && WEFT_STDLIB= $limit "$WEFT" check "$name" >/dev/null 2>"$dir/err" </dev/null)
    code=$?
    why=""
    if [ "$code" = 124 ] || [ "$code" = 137 ]; then why="timed out"
    elif [ "$code" -gt 1 ]; then why="exit status $code"
    elif grep -q -E 'Sanitizer|runtime error:' "$dir/err"; then why="sanitizer report"
    elif [ "$code" = 1 ]; then
      if grep -q -E '^[^ ]+:[0-9]+:[0-9]+: error: ' "$dir/err"; then rejected=$((rejected + 1))
      else why="rejected without a FILE:LINE:COL error"; fi
    else valid=$((valid + 1)); fi
    if [ -n "$why" ]; then
      failures=$((failures + 1))
      {
        echo "FAIL: $f:$line: $what: $why"
        sed -n "${line}p" "$dir/m/$name" | sed 's/^/  mutant line: /'
        head -20 "$dir/err" | sed 's/^/  /'
      } >> "$dir/log"
    fi
    cp "$f" "$dir/m/$name"
  done < "$list"
  echo "$n $valid $rejected $failures" > "$dir/counts"
}

jobs=${MUTATE_JOBS:-2}
j=0
while [ "$j" -lt "$jobs" ]; do
  mkdir "$tmp/w$j" || exit 2
  awk -v j="$j" -v k="$jobs" '(NR - 1) % k == j' "$tmp/run" > "$tmp/w$j/list"
  run_part "$tmp/w$j/list" "$tmp/w$j" &
  j=$((j + 1))
done
wait

n=0; valid=0; rejected=0; failures=0
j=0
while [ "$j" -lt "$jobs" ]; do
  [ -f "$tmp/w$j/log" ] && cat "$tmp/w$j/log"
  if [ -f "$tmp/w$j/counts" ]; then
    read -r a b c d < "$tmp/w$j/counts"
    n=$((n + a)); valid=$((valid + b)); rejected=$((rejected + c)); failures=$((failures + d))
  else
    echo "FAIL: worker $j did not finish"; failures=$((failures + 1))
  fi
  j=$((j + 1))
done

echo "mutate: $n mutants, $valid valid, $rejected rejected with a position, $failures failures"
[ "$failures" = 0 ] && [ "$n" -gt 0 ]
