#!/usr/bin/env python3
"""program_device.py A.json B.json - whether two `weft lower --json --device N`
outputs hold the same program: the same instructions in the same order, a
communication compared by what it is (kind, tensor, group, regions, not its
number) and a buffer by what it holds (device, tensor, role, region, ...,
numbered by first use). The plan's header (tensors, operators, optimizer)
must be equal too. Prints the first difference; exit 1 if there is one."""
import json
import sys


def canon(doc):
    comms = {c["id"]: {k: v for k, v in c.items() if k != "id"} for c in doc["comms"]}
    bufs = {b["id"]: {k: v for k, v in b.items() if k != "id"} for b in doc["buffers"]}
    num = {}

    def buf(i):
        if i not in num:
            num[i] = len(num)
        return [num[i], bufs.get(i)]

    def fix(x):
        if isinstance(x, dict):
            out = {}
            for k, v in x.items():
                if k == "comm":
                    out[k] = comms.get(v)
                elif k == "bucket":
                    out[k] = [comms.get(i) for i in v]
                elif k == "buf" and isinstance(v, int):
                    out[k] = buf(v)
                else:
                    out[k] = fix(v)
            return out
        if isinstance(x, list):
            return [fix(v) for v in x]
        return x

    progs = [{"device": p["device"], "instructions": fix(p["instructions"])} for p in doc["programs"]]
    head = {k: doc[k] for k in doc if k not in ("comms", "buffers", "programs")}
    return head, progs


def main():
    a = canon(json.load(open(sys.argv[1])))
    b = canon(json.load(open(sys.argv[2])))
    if a[0] != b[0]:
        for k in a[0]:
            if a[0][k] != b[0].get(k):
                print(f"header field {k} differs")
                return 1
        print("header differs")
        return 1
    if len(a[1]) != len(b[1]):
        print(f"{len(a[1])} programs against {len(b[1])}")
        return 1
    for pa, pb in zip(a[1], b[1]):
        ia, ib = pa["instructions"], pb["instructions"]
        for n, (x, y) in enumerate(zip(ia, ib)):
            if x != y:
                print(f"device {pa['device']}, instruction {n}:\n  {json.dumps(x)[:600]}\n  {json.dumps(y)[:600]}")
                return 1
        if len(ia) != len(ib):
            print(f"device {pa['device']}: {len(ia)} instructions against {len(ib)}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
