#!/bin/sh
# diag_coverage.sh - checks that every diagnostic weft can print is shown by
# at least one golden test (tests/golden/*/*.expected).
#
# The message format of every call to eval_error, report_error, diag_add, diag_hint and
# lex_error, of the Lua scripts' errors (script_error, lib_fail, luaL_error),
# and of every fprintf/fputs to stderr, is taken from the sources
# (src/*/*.c grammar/*.l grammar/*.y): the first string literal of the call
# (adjacent literals and PRId64-style macros joined; both branches of
# `cond ? "a" : "b"`). printf conversions (%s %d %lld %.3g %" PRId64 " ...)
# become wildcards; what is left must occur, in order, on one line of some
# expected file (a format with \n: each of its lines). A format that is only
# conversions ("%s", msg) is computed elsewhere and not counted.
#
# Messages that cannot be reached are listed in tests/golden/unreachable.txt,
# one a line: the format as this script prints it, two spaces, "#", a reason.
#
# usage: sh tests/diag_coverage.sh [-v]     -v: show every format and its status
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 2
verbose=0
[ "${1:-}" = -v ] && verbose=1
allow=tests/golden/unreachable.txt
formats=$(mktemp) || exit 2
trap 'rm -f "$formats"' EXIT
trap 'exit 2' INT TERM

# ---- 1. formats: FILE:LINE <TAB> FORMAT (C escapes as written) ------------
for f in src/*/*.c grammar/*.l grammar/*.y; do
  awk -v file="$f" '
  { src = src $0 "\n" }
  END {
    # the code without comments; ln[i]: the line of byte i
    n = length(src); code = ""; cl = 0; line = 1; st = 0
    for (i = 1; i <= n; i++) {
      ch = substr(src, i, 1)
      if (st == 3) {                         # in /* */
        if (substr(src, i, 2) == "*/") { st = 0; i++ }
        else if (ch == "\n") { code = code ch; ln[++cl] = line; line++ }
        continue
      }
      if (st == 4) {                         # in //
        if (ch != "\n") continue
        st = 0
      } else if (st == 0) {
        two = substr(src, i, 2)
        if (two == "/*") { st = 3; i++; continue }
        if (two == "//") { st = 4; i++; continue }
        if (ch == "\"") st = 1
        else if (ch == "\047") st = 2
      } else {                               # in a string or a character
        if (ch == "\\") { code = code ch; ln[++cl] = line; i++; ch = substr(src, i, 1) }
        else if ((st == 1 && ch == "\"") || (st == 2 && ch == "\047")) st = 0
      }
      code = code ch; ln[++cl] = line
      if (ch == "\n") line++
    }
    off = 0; rest = code
    while (match(rest, /(eval_error|report_error|diag_add|diag_hint|lex_error|script_error|lib_fail|luaL_error|fprintf|fputs)[ \t\n]*\(/)) {
      start = off + RSTART; name = substr(rest, RSTART, RLENGTH)
      sub(/[ \t\n]*\($/, "", name)
      at = off + RSTART + RLENGTH            # the byte after "("
      off = at - 1; rest = substr(code, at)
      if (start > 1 && substr(code, start - 1, 1) ~ /[A-Za-z0-9_]/) continue
      # the arguments, up to the closing parenthesis
      args = ""; depth = 1; st = 0
      for (j = at; j <= cl; j++) {
        ch = substr(code, j, 1)
        if (st) {
          if (ch == "\\") { args = args ch substr(code, j + 1, 1); j++; continue }
          if ((st == 1 && ch == "\"") || (st == 2 && ch == "\047")) st = 0
        } else if (ch == "\"") st = 1
        else if (ch == "\047") st = 2
        else if (ch == "(") depth++
        else if (ch == ")") { if (--depth == 0) break }
        else if (ch == ";") break
        args = args ch
      }
      if (depth != 0) continue               # a definition or a prototype
      if (name == "fprintf" && args !~ /^[ \t\n]*stderr[ \t\n]*,/) continue
      if (name == "fputs" && args !~ /,[ \t\n]*stderr[ \t\n]*$/) continue
      p = index(args, "\"")
      if (!p) continue                       # the format is a variable
      before = substr(args, 1, p - 1)
      printf "%s:%d\t%s\n", file, ln[start], read_lit(substr(args, p))
      if (before ~ /\?[ \t\n]*$/ && match(substr(args, p + litlen), /^[ \t\n]*:[ \t\n]*"/))
        printf "%s:%d\t%s\n", file, ln[start], read_lit(substr(args, p + litlen + RLENGTH - 1))
    }
  }
  # the literal "..." "..." PRId64 "..." at the start of s; sets litlen
  function read_lit(s,   out, i, ch, m) {
    out = ""; i = 1
    while (substr(s, i, 1) == "\"") {
      i++
      while (i <= length(s)) {
        ch = substr(s, i, 1)
        if (ch == "\\") { out = out ch substr(s, i + 1, 1); i += 2; continue }
        i++
        if (ch == "\"") break
        out = out ch
      }
      litlen = i - 1
      m = substr(s, i)
      if (match(m, /^[ \t\n]*PRI[diouxX][0-9A-Z]*/)) { out = out "d"; i += RLENGTH; litlen = i - 1; m = substr(s, i) }
      if (match(m, /^[ \t\n]*"/)) i += RLENGTH - 1
    }
    return out
  }
  ' "$f"
done > "$formats"

# ---- 2. each format against the expected files -----------------------------
[ -f "$allow" ] || allow=/dev/null
set -- tests/golden/*/*.expected
[ -f "$1" ] || set --
awk -v verbose="$verbose" -v allowf="$allow" -v fmtf="$formats" '
  FILENAME == allowf {
    if ($0 ~ /^[ \t]*(#|$)/) next
    p = index($0, "  #")
    if (!p || substr($0, p + 3) ~ /^[ \t]*$/) { print "unreachable.txt:" FNR ": no reason given: " $0; bad++; next }
    allowed[substr($0, 1, p - 1)] = FNR
    next
  }
  FILENAME == fmtf {
    t = index($0, "\t")
    nf_++; where[nf_] = substr($0, 1, t - 1); fmt[nf_] = substr($0, t + 1)
    next
  }
  { golden[++ng] = $0 }
  END {
    for (i = 1; i <= nf_; i++) {
      f = fmt[i]
      if (f in seen) continue
      seen[f] = 1
      if (f in allowed) { nallow++; used[f] = 1; if (verbose) print "unreachable: " f; continue }
      if (!split_format(f)) { computed++; if (verbose) print "computed:    " where[i] ": " f; continue }
      ok = 1
      for (s = 1; s <= nsegs && ok; s++) ok = covered(s)
      if (ok) { pass++; if (verbose) print "covered:     " f }
      else { fail++; print "uncovered: " where[i] ": " f }
    }
    for (a in allowed)
      if (!(a in used)) { print "unreachable.txt:" allowed[a] ": not a message of the sources: " a; bad++ }
    printf "diag-coverage: %d passed, %d failed (%d listed unreachable, %d computed)\n", pass, fail + bad, nallow, computed
    exit (fail + bad) > 0
  }
  # splits f at \n into segments and each into its literal pieces (C escapes
  # decoded); returns the number of literal characters in all
  function split_format(f,   t, segs, i, total, rest, lit) {
    t = f
    gsub(/\\\\/, "\001", t)
    gsub(/\\"/, "\"", t)
    gsub(/\\t/, "\t", t)
    gsub(/%%/, "\002", t)
    nsegs = split(t, segs, /\\n/)
    total = 0
    for (i = 1; i <= nsegs; i++) {
      rest = segs[i]; npc[i] = 0
      while (1) {
        if (match(rest, /%[-+ #0]*[0-9*]*(\.[0-9*]+)?(hh|h|ll|l|z|j|t)?[diouxXeEfgGcsp]/)) {
          lit = substr(rest, 1, RSTART - 1); rest = substr(rest, RSTART + RLENGTH)
        } else { lit = rest; rest = "" }
        gsub(/\001/, "\\", lit); gsub(/\002/, "%", lit)
        if (lit != "") { pc[i, ++npc[i]] = lit; total += length(lit) }
        if (rest == "") break
      }
    }
    return total
  }
  # whether one golden line holds the pieces of segment s, in order
  function covered(s,   g, k, pos, p, line) {
    if (npc[s] == 0) return 1
    for (g = 1; g <= ng; g++) {
      line = golden[g]; pos = 1
      for (k = 1; k <= npc[s]; k++) {
        p = index(substr(line, pos), pc[s, k])
        if (!p) break
        pos += p - 1 + length(pc[s, k])
      }
      if (k > npc[s]) return 1
    }
    return 0
  }
' "$allow" "$formats" "$@"
