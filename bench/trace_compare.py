#!/usr/bin/env python3
"""trace_compare.py - a step as it ran (`weft run --trace`) beside the same
step as the cost model simulated it (`weft estimate --trace`), operator by
operator, on one device.

usage: trace_compare.py RUN_TRACE ESTIMATE_TRACE [DEVICE] [TOP]

Both traces name an instruction alike (lower_print.c); the layers of the
repeated blocks are folded (h.3.attn.core and h.7.attn.core are
h.*.attn.core) and micro-batches summed, as trace_summary.py does. Prints,
for DEVICE (default 0), the measured and the simulated time of each
category, then of the TOP (default 20) operators with the most measured
time, and their ratio: above 1, the step ran slower there than the model
predicts. The simulation is of the plan's cluster, not the machine that
ran it: the header says which ran.
"""
import json
import re
import sys

LAYER = re.compile(r"\.\d+(?=\.|$| )")
MB = re.compile(r" mb\d+$")


def fold(name):
    return LAYER.sub(".*", MB.sub("", name))


def load(path, device):
    tr = json.load(open(path))
    ev = [e for e in tr["traceEvents"] if e.get("ph") == "X" and e["pid"] == device]
    cats, ops = {}, {}
    for e in ev:
        cats[e["cat"]] = cats.get(e["cat"], 0.0) + e["dur"]
        ops[fold(e["name"])] = ops.get(fold(e["name"]), 0.0) + e["dur"]
    span = (max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)) if ev else 0.0
    return tr.get("otherData", {}), cats, ops, span


def ratio(a, b):
    return "%.2f" % (a / b) if b > 0 else "-"


def main():
    run_path, sim_path = sys.argv[1], sys.argv[2]
    device = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    about, rc, ro, rspan = load(run_path, device)
    _, sc, so, sspan = load(sim_path, device)
    if not ro or not so:
        print("trace_compare: device %d is in %s" % (device, "neither trace" if not ro and not so else
                                                     "only the simulated trace" if not ro else "only the run's trace"))
        return 1
    print("device %d, step %s of plan %s as it ran on %s (%s backend) and as weft estimate simulates it on the plan's cluster"
          % (device, about.get("step", "?"), about.get("plan", "?"), about.get("machine") or "this machine",
             about.get("backend", "?")))
    print("%-40s %11s %11s %7s" % ("", "ran ms", "simulated", "ratio"))
    print("%-40s %11.3f %11.3f %7s" % ("the step, first start to last end", rspan / 1e3, sspan / 1e3, ratio(rspan, sspan)))
    for c in sorted(set(rc) | set(sc), key=lambda c: -rc.get(c, 0.0)):
        print("%-40s %11.3f %11.3f %7s" % (c, rc.get(c, 0.0) / 1e3, sc.get(c, 0.0) / 1e3, ratio(rc.get(c, 0.0), sc.get(c, 0.0))))
    print("the operators with the most time as it ran (layers folded):")
    for name, t in sorted(ro.items(), key=lambda x: -x[1])[:top]:
        s = so.get(name, 0.0)
        print("%-40s %11.3f %11.3f %7s" % (name[:40], t / 1e3, s / 1e3, ratio(t, s)))
    return 0


sys.exit(main())
