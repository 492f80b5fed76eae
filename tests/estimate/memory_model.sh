#!/bin/sh
# memory_model.sh - weft check's memory rule and weft estimate use one
# memory model: for every plan of every example, the per-device peaks that
# `weft check --json` reports (and compares with the device's memory) are
# the peaks `weft estimate --json` reports. Prints one line; exits 1 on a
# difference. Usage: sh tests/estimate/memory_model.sh ./weft
WEFT=${1:-./weft}
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
for f in examples/*.plan; do
  "$WEFT" check "$f" --json >"$tmp/check.json" 2>/dev/null || continue
  for plan in $(python3 -c 'import json, sys
for f in json.load(open(sys.argv[1]))["files"]:
    for p in f.get("plans", []):
        if "peak_memory_bytes" in p: print(p["name"])' "$tmp/check.json"); do
    n=$((n + 1))
    "$WEFT" estimate "$f" --plan "$plan" --json >"$tmp/est.json" 2>/dev/null
    python3 -c 'import json, sys
check = [p for f in json.load(open(sys.argv[1]))["files"] for p in f["plans"] if p["name"] == sys.argv[3]][0]
est = json.load(open(sys.argv[2]))
a, b = check["peak_memory_bytes"], est["peak_memory_bytes"]["per_device"]
if a != b:
    print("DIFFERENT: %s plan %s: check %s, estimate %s" % (sys.argv[4], sys.argv[3], a[:8], b[:8]))
    sys.exit(1)' "$tmp/check.json" "$tmp/est.json" "$plan" "$f" || echo "fail" >>"$tmp/failed"
  done
done
if [ -f "$tmp/failed" ]; then exit 1; fi
[ $n -gt 0 ] || { echo "no example plan was lowered"; exit 1; }
echo "memory model: weft check and weft estimate give every device of every example plan the same peak"
