#!/usr/bin/env python3
"""trace_compare.py - a step as it ran (`weft run --trace`) beside the same
step as the cost model simulated it (`weft estimate --trace`), operator by
operator, on one device.

usage: trace_compare.py [--merge OUT] RUN_TRACE ESTIMATE_TRACE [DEVICE] [TOP]

Both traces name an instruction alike (lower_print.c); the layers of the
repeated blocks are folded (h.3.attn.core and h.7.attn.core are
h.*.attn.core) and micro-batches summed, as trace_summary.py does. Prints,
for DEVICE (default 0), the measured and the simulated time of each
category, then of the TOP (default 20) operators with the most measured
time, and their ratio: above 1, the step ran slower there than the model
predicts. The simulation is of the plan's cluster, not the machine that
ran it: the header says which ran. --merge OUT also writes both traces as
one (every device of the run as "device N, ran", of the simulation as
"device N, simulated", each simulated one sorted under its run), to open
in Perfetto and look at the two timelines of a device one above the other.
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


def merge(run_path, sim_path, out_path):
    """Both traces in one: pids 2d (ran) and 2d + 1 (simulated)."""
    events = []
    for path, side, k in ((run_path, "ran", 0), (sim_path, "simulated", 1)):
        for e in json.load(open(path))["traceEvents"]:
            e = dict(e)
            if "pid" not in e:
                continue
            d = e["pid"]
            e["pid"] = 2 * d + k
            if e.get("ph") == "M" and e.get("name") == "process_name":
                e["args"] = {"name": "device %d, %s" % (d, side)}
            elif e.get("ph") == "M" and e.get("name") == "process_sort_index":
                e["args"] = {"sort_index": 2 * d + k}
            events.append(e)
    with open(out_path, "w") as f:
        json.dump({"displayTimeUnit": "ms", "traceEvents": events}, f)


def main():
    args = sys.argv[1:]
    out = None
    if args[:1] == ["--merge"]:
        out, args = args[1], args[2:]
    run_path, sim_path = args[0], args[1]
    device = int(args[2]) if len(args) > 2 else 0
    top = int(args[3]) if len(args) > 3 else 20
    if out:
        merge(run_path, sim_path, out)
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
