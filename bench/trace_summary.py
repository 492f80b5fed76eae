#!/usr/bin/env python3
"""trace_summary.py - where the time of a `weft run --trace` step went, by
operator: the repeated blocks' layers folded into one row (h.3.attn.core
and h.7.attn.core are h.*.attn.core), micro-batches summed.

usage: trace_summary.py TRACE [TOP]

Prints the step, what the times cover, the span from the first start to
the last end, how long each device ran no instruction within its own span
(the most idle first), the time of each category summed over devices, then the TOP
(default 20) rows with the most time: ms, the share of all instructions'
time, calls, and the name. The rows' times add up to the categories'.
"""
import json
import re
import sys

LAYER = re.compile(r"\.\d+(?=\.|$| )")
MB = re.compile(r" mb\d+$")


def fold(name):
    return LAYER.sub(".*", MB.sub("", name))


def idle_said(ev):
    """How long each device ran no instruction between its first start and
    its last end (the union of its instructions' times taken from its span:
    a host that launches late, or waits for other devices), the most idle
    first, at most four."""
    by = {}
    for e in ev:
        by.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"]))
    idle = []
    for pid, spans in by.items():
        spans.sort()
        busy, end = 0.0, None
        start = spans[0][0]
        for a, b in spans:
            if end is None or a > end:
                busy += b - a
                end = b
            elif b > end:
                busy += b - end
                end = b
        span = end - start
        idle.append((span - busy, span, pid))
    idle.sort(key=lambda x: (-x[0], x[2]))
    said = ", ".join("device %s %.3f ms (%.1f%%)" % (pid, t / 1e3, 100 * t / span if span > 0 else 0)
                     for t, span, pid in idle[:4])
    more = " and %d more" % (len(idle) - 4) if len(idle) > 4 else ""
    return "idle between instructions: " + said + more


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    tr = json.load(open(path))
    about = tr.get("otherData", {})
    ev = [e for e in tr["traceEvents"] if e.get("ph") == "X"]
    if not ev:
        print("%s: no events" % path)
        return 1
    lo = min(e["ts"] for e in ev)
    hi = max(e["ts"] + e["dur"] for e in ev)
    cats, rows = {}, {}
    for e in ev:
        cats[e["cat"]] = cats.get(e["cat"], 0.0) + e["dur"]
        r = rows.setdefault(fold(e["name"]), [0.0, 0])
        r[0] += e["dur"]
        r[1] += 1
    total = sum(cats.values())
    print("step %s of plan %s on %s (%s backend): %d instructions on %d devices, %.3f ms from the first to the last; %s"
          % (about.get("step", "?"), about.get("plan", "?"), about.get("machine") or "this machine",
             about.get("backend", "?"), len(ev), len({e["pid"] for e in ev}), (hi - lo) / 1e3, idle_said(ev)))
    if about.get("times"):
        print("times: " + about["times"])
    print("by category (summed over devices): " +
          ", ".join("%s %.3f ms" % (c, t / 1e3) for c, t in sorted(cats.items(), key=lambda x: -x[1])))
    print("%10s %7s %6s  %s" % ("ms", "share", "calls", "operator (layers folded)"))
    ranked = sorted(rows.items(), key=lambda x: -x[1][0])
    for name, (t, n) in ranked[:top]:
        print("%10.3f %6.1f%% %6d  %s" % (t / 1e3, 100 * t / total if total else 0, n, name))
    if len(ranked) > top:
        t = sum(r[0] for _, r in ranked[top:])
        n = sum(r[1] for _, r in ranked[top:])
        print("%10.3f %6.1f%% %6d  the other %d" % (t / 1e3, 100 * t / total if total else 0, n, len(ranked) - top))
    return 0


sys.exit(main())
