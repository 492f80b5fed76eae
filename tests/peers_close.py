#!/usr/bin/env python3
"""peers_close.py ALL.json PEERS.json - `weft check --json` of a plan with
every device lowered (WEFT_REPS=never) against the default, where one
device of each tensor-parallel group stands for its peers. Same files,
plans, devices and verdicts; the largest peak memory the same; each
device's peak at least its own and within 1% above it; the step time and
MFU within 0.5%; instructions within 5% (the representative's program
counted for each peer). Prints what differs; exit 1 if anything does."""
import json
import sys


def plans(path):
    with open(path) as f:
        doc = json.load(f)
    out = {}
    for fi in doc.get("files", []):
        for p in fi.get("plans", []):
            out[(fi.get("file"), p.get("name"))] = p
    return doc, out


def main():
    a_doc, a = plans(sys.argv[1])
    b_doc, b = plans(sys.argv[2])
    bad = []
    if set(a) != set(b):
        bad.append(f"plans differ: {sorted(a)} vs {sorted(b)}")
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        name = f"{key[0]} plan {key[1]}"
        for k in sorted(set(x) | set(y)):
            u, v = x.get(k), y.get(k)
            if k == "instructions":
                if u and abs(v - u) > 0.05 * u:
                    bad.append(f"{name}: instructions {u} vs {v}")
            elif k == "peak_memory_bytes":
                if len(u) != len(v) or max(u) != max(v):
                    bad.append(f"{name}: largest peak {max(u)} vs {max(v)}")
                for d, (p, q) in enumerate(zip(u, v)):
                    if q < p or q > p * 1.01:
                        bad.append(f"{name}: device {d} peak {p} vs {q}")
            elif k in ("step_time_s", "mfu"):
                if abs(v - u) > 0.005 * max(abs(u), 1e-12) and abs(v - u) > 1e-9:
                    bad.append(f"{name}: {k} {u} vs {v}")
            elif k in ("estimate",) and isinstance(u, dict):
                for e in u:
                    p, q = u[e], v.get(e)
                    if isinstance(p, float):
                        if abs(q - p) > 0.005 * max(abs(p), 1e-12):
                            bad.append(f"{name}: estimate.{e} {p} vs {q}")
                    elif p != q:
                        bad.append(f"{name}: estimate.{e} {p} vs {q}")
            elif u != v:
                bad.append(f"{name}: {k} {u} vs {v}")
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
