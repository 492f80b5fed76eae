#!/usr/bin/env python3
"""trace_merge.py - the files of one `weft run --trace` under mpirun (or
srun) as one timeline: process 0's FILE and process R's FILE-rankR, each
timed from its own start of the step, put on one clock by the wall-clock
time each file gives for its start (otherData's epoch_us), so that the
processes' devices open side by side in Perfetto.

usage: trace_merge.py OUT TRACE [TRACE...]

With one TRACE, the files of the other processes are found beside it
(TRACE's name with -rank1, -rank2, ... before its extension, as many as
its otherData's processes). Every event keeps its device (its pid: the
plan's devices are each in one process's file); the events of a file
whose step started later are moved later by the difference. Refuses
(exit 2) files of different plans or steps, two files of one process, a
device in two files, and (with one TRACE) a process's missing file. Prints one line: the files, the
events, and each process's offset. The wall clocks of several machines
agree only as far as their synchronisation does (NTP: about a
millisecond), which bounds how well the timelines line up across nodes.
"""
import json
import os
import sys


def rank_name(path, r):
    root, ext = os.path.splitext(path)
    return "%s-rank%d%s" % (root, r, ext)


def fail(msg):
    print("trace_merge.py: %s" % msg, file=sys.stderr)
    sys.exit(2)


def load(path):
    try:
        with open(path) as f:
            tr = json.load(f)
    except (OSError, ValueError) as e:
        fail("%s: %s" % (path, e))
    about = tr.get("otherData", {})
    if "epoch_us" not in about or "rank" not in about:
        fail("%s: no epoch_us or rank in otherData (a trace of weft run --trace?)" % path)
    return tr


def main():
    if len(sys.argv) < 3:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    out, paths = sys.argv[1], sys.argv[2:]
    traces = [load(p) for p in paths]
    if len(paths) == 1:
        n = int(traces[0]["otherData"].get("processes", 1))
        for r in range(1, n):
            p = rank_name(paths[0], r)
            if not os.path.exists(p):
                fail("%s: process %d of %d wrote no %s" % (paths[0], r, n, p))
            paths.append(p)
            traces.append(load(p))
    about = [t["otherData"] for t in traces]
    for key in ("plan", "step"):
        if len({str(a.get(key)) for a in about}) > 1:
            fail("the files are of different %ss: %s" % (key, ", ".join(str(a.get(key)) for a in about)))
    ranks = [int(a["rank"]) for a in about]
    if len(set(ranks)) != len(ranks):
        fail("two files of one process (ranks %s)" % ranks)
    start = min(int(a["epoch_us"]) for a in about)
    seen, events, offsets = {}, [], []
    for path, tr, a in sorted(zip(paths, traces, about), key=lambda x: int(x[2]["rank"])):
        shift = int(a["epoch_us"]) - start
        offsets.append((int(a["rank"]), shift))
        for e in tr["traceEvents"]:
            pid = e.get("pid")
            if e.get("ph") == "X":
                if seen.setdefault(pid, path) != path:
                    fail("device %s is in both %s and %s" % (pid, seen[pid], path))
                e = dict(e, ts=e["ts"] + shift)
            events.append(e)
    merged = dict(about[0])
    merged.update(command="trace_merge.py", rank=None, epoch_us=start,
                  files=[{"file": p, "rank": int(a["rank"]), "offset_us": int(a["epoch_us"]) - start}
                         for p, a in zip(paths, about)])
    with open(out, "w") as f:
        json.dump({"displayTimeUnit": "ms", "otherData": merged, "traceEvents": events}, f)
        f.write("\n")
    nx = sum(1 for e in events if e.get("ph") == "X")
    print("%s: %d files, %d events of %d devices; process offsets %s" %
          (out, len(paths), nx, len(seen), ", ".join("%d: %.3f ms" % (r, s / 1e3) for r, s in offsets)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
