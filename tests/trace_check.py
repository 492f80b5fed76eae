#!/usr/bin/env python3
"""trace_check.py - checks a `weft run --trace` file against the programs
`weft lower --json` printed for the same plan.

usage: trace_check.py TRACE RUN_JSON STEP MODE LOWER_JSON...

MODE "every": every instruction but allocations and frees is in the trace
exactly once (a backend that times each instruction, the CPU's); MODE
"computes": every compute is there at least once (a backend that times
what it launches, the CUDA backend's). Always: each event names its
instruction as the program has it (operator, direction, micro-batch;
step; communication kind), its category fits, and a lane's events do not
overlap and end within the step's time. Prints one line; exit 1 on the
first fault.
"""
import json
import sys


def fail(msg):
    print("trace_check: " + msg)
    sys.exit(1)


def main():
    trace_path, run_path, step, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    progs, ops, tensors = {}, None, None
    for path in sys.argv[5:]:
        low = json.load(open(path))
        ops = [o["name"] for o in low["ops"]]
        tensors = [t["name"] for t in low["tensors"]]
        for p in low["programs"]:
            progs[p["device"]] = p["instructions"]
    run = json.load(open(run_path))
    tr = json.load(open(trace_path))
    if tr["otherData"]["step"] != step:
        fail("the file says step %s, not %d" % (tr["otherData"]["step"], step))
    if run.get("trace", {}).get("step") != step:
        fail("weft run --json says step %s, not %d" % (run.get("trace", {}).get("step"), step))
    step_s = [s for s in run["steps"] if s["step"] == step][0]["time_s"]
    events = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    if len(events) != run["trace"]["events"]:
        fail("%d events, but weft run --json counts %d" % (len(events), run["trace"]["events"]))
    if len({(e["pid"], e["args"]["ins"]) for e in events}) != run["trace"]["instructions"]:
        fail("%d instructions in the events, but weft run --json counts %d"
             % (len({(e["pid"], e["args"]["ins"]) for e in events}), run["trace"]["instructions"]))
    seen = {}
    lanes = {}
    for e in events:
        d, i = e["pid"], e["args"]["ins"]
        if d not in progs:
            fail("an event of device %d, whose program was not given" % d)
        if not 0 <= i < len(progs[d]):
            fail("device %d has no instruction %d" % (d, i))
        ins = progs[d][i]
        kind, name, cat = ins["i"], e["name"], e["cat"]
        if kind == "compute":
            want = "%s %s mb%d" % (ops[ins["op"]], "recompute" if ins["recompute"] else ins["dir"], ins["mb"])
            if name != want or cat != ("recompute" if ins["recompute"] else ins["dir"]) or e["args"]["mb"] != ins["mb"]:
                fail("device %d instruction %d: %r (%s), but the program has %r" % (d, i, name, cat, want))
        elif kind == "step":
            if cat != "optimizer" or not name.startswith("step "):
                fail("device %d instruction %d, a step: %r (%s)" % (d, i, name, cat))
        elif kind in ("send", "recv"):
            if cat != "send/recv" or not name.startswith(kind + " "):
                fail("device %d instruction %d, a %s: %r (%s)" % (d, i, kind, name, cat))
        elif kind == "collective":
            if cat not in ("collective", "gradient sync") or "bytes" not in e["args"]:
                fail("device %d instruction %d, a collective: %r (%s)" % (d, i, name, cat))
        elif kind in ("alloc", "free"):
            if mode == "every" or cat != "memory":
                fail("device %d instruction %d, an %s, in the trace as %r (%s)" % (d, i, kind, name, cat))
        if e["dur"] < 0 or e["ts"] < 0:
            fail("device %d instruction %d: a negative time" % (d, i))
        if e["ts"] + e["dur"] > step_s * 1e6 * 1.001 + 50:
            fail("device %d instruction %d ends at %.1f us, after the step's %.1f us" % (d, i, e["ts"] + e["dur"], step_s * 1e6))
        seen[(d, i)] = seen.get((d, i), 0) + 1
        lanes.setdefault((d, e["tid"]), []).append(e)
    for d, prog in progs.items():
        for i, ins in enumerate(prog):
            n = seen.get((d, i), 0)
            if mode == "every" and ins["i"] not in ("alloc", "free") and n != 1:
                fail("device %d instruction %d (%s) is in the trace %d times" % (d, i, ins["i"], n))
            if mode == "computes" and ins["i"] == "compute" and n < 1:
                fail("device %d instruction %d (a compute) is not in the trace" % (d, i))
    for (d, tid), evs in lanes.items():
        evs.sort(key=lambda e: e["ts"])
        for a, b in zip(evs, evs[1:]):
            if b["ts"] < a["ts"] + a["dur"] - 0.002:
                fail("device %d lane %d: %r and %r overlap" % (d, tid, a["name"], b["name"]))
    names = {m["args"]["name"] for m in tr["traceEvents"] if m["name"] == "thread_name"}
    print("trace: step %d, %d events on %d devices, lanes %s, each named as its program's instruction, "
          "no overlap within a lane" % (step, len(events), len(progs), "/".join(sorted(names))))


main()
