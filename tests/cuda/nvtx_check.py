#!/usr/bin/env python3
"""nvtx_check.py [--choices] RECORD TRACE STEPS [STREAMS]: the NVTX ranges
of a CUDA run, as tests/cuda/nvtx_record.c wrote them (RECORD), against the
run's --trace of its last step (TRACE) and its count of steps (STEPS).

- one domain, "weft"; every push popped;
- at the top, one range a pass: "step 1" ... "step STEPS", category "pass";
- inside the traced step, one range per piece of work of the trace, named
  "device D: " and the trace event's name, with D its process (the clipping
  factor, which the trace leaves out, aside); nothing deeper but the
  plugin's one-time choices of kernels (category "choosing kernels",
  backends/cuda/choice.h), which come inside an instruction's range or
  outside every pass, never directly in a pass;
- every category used named before, from those the run labels with, and
  every range of a category in its one colour, forward's and backward's
  different;
- with --choices, at least one choice, and none in the traced step;
- with STREAMS (on a GPU), the streams named "weft device 0" ... those of
  the STREAMS devices, each once.
Exit 0 when all hold, else 1 with what did not."""
import collections
import json
import sys

CATEGORIES = {"forward", "backward", "recompute", "optimizer", "collective", "send/recv", "gradient sync", "memory",
              "pass", "executor", "choosing kernels"}
CHOICE = "choosing kernels"


def main():
    args = sys.argv[1:]
    want_choices = bool(args) and args[0] == "--choices"
    if want_choices:
        args = args[1:]
    record, trace, steps = args[0], args[1], int(args[2])
    nstreams = int(args[3]) if len(args) > 3 else None
    choices = collections.Counter()  # by the pass they came in ("" outside)
    stack = []  # the categories of the ranges open
    streams = []
    bad = []
    domains, cats, colour = {}, {}, {}
    passes, inner = [], collections.defaultdict(collections.Counter)
    depth, deepest, pushes = 0, 0, 0
    with open(record) as f:
        for line in f:
            word, _, rest = line.rstrip("\n").partition(" ")
            if word == "domain":
                domains[str(len(domains) + 1)] = rest
                continue
            if word == "category":
                d, c, name = rest.split(" ", 2)
                cats[(d, c)] = name
                continue
            if word == "stream":
                streams.append(rest)
                continue
            if word == "pop":
                if not stack:
                    bad.append("a pop without its push")
                    continue
                stack.pop()
                depth = sum(1 for c in stack if c != CHOICE)
                continue
            if word != "push":
                bad.append("a line not understood: " + line.strip())
                continue
            d, c, argb, text = rest.split(" ", 3)
            pushes += 1
            if domains.get(d) != "weft":
                bad.append(f"a range outside the domain weft: {text}")
            cat = cats.get((d, c))
            stack.append(cat)
            if cat is None:
                bad.append(f"category {c} used before it was named ({text})")
            elif cat not in CATEGORIES:
                bad.append(f"category {c} named {cat!r}")
            elif colour.setdefault(cat, argb) != argb:
                bad.append(f"category {cat} in two colours, {colour[cat]} and {argb} ({text})")
            if cat == CHOICE:
                # the plugin's choices: in an instruction's range, or
                # outside every pass; they may nest in one another
                if depth == 1:
                    bad.append(f"a choice directly in the pass {passes[-1]!r}: {text}")
                choices[passes[-1] if depth > 0 else ""] += 1
                continue
            depth += 1
            deepest = max(deepest, depth)
            if depth == 1:
                passes.append(text)
                if cat != "pass":
                    bad.append(f"a pass's range {text!r} in category {cat}")
            elif depth == 2 and passes:
                inner[passes[-1]][text] += 1
    if stack:
        bad.append(f"{len(stack)} range(s) never popped")
    if list(domains.values()) != ["weft"]:
        bad.append(f"domains {list(domains.values())}, not one weft")
    if deepest > 2:
        bad.append(f"ranges {deepest} deep")
    want = [f"step {s}" for s in range(1, steps + 1)]
    if passes != want:
        bad.append(f"passes {passes[:6]}, not {want}")
    if colour.get("forward") is None or colour.get("forward") == colour.get("backward"):
        bad.append(f"forward's colour {colour.get('forward')}, backward's {colour.get('backward')}")
    with open(trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    traced = collections.Counter(f"device {e['pid']}: {e['name']}" for e in events)
    ranged = collections.Counter({k: v for k, v in inner[f"step {steps}"].items() if not k.endswith(": clipping factor")})
    if not traced:
        bad.append("the trace has no events")
    if ranged != traced:
        only_r = list((ranged - traced).items())[:4]
        only_t = list((traced - ranged).items())[:4]
        bad.append(f"the ranges of step {steps} are not the trace's events: only ranges {only_r}, only events {only_t}")
    if want_choices and not choices:
        bad.append("no range of a choice of kernels")
    if want_choices and choices[f"step {steps}"]:
        bad.append(f"{choices[f'step {steps}']} choices of kernels in the traced step {steps}")
    if nstreams is not None and sorted(streams) != sorted(f"weft device {d}" for d in range(nstreams)):
        bad.append(f"streams named {streams}, not weft device 0 .. {nstreams - 1}")
    for b in bad:
        print("nvtx_check: " + b)
    if bad:
        return 1
    where = ", ".join(f"{n} in {p}" if p else f"{n} outside the passes" for p, n in sorted(choices.items()))
    print(f"nvtx_check: {pushes} ranges, {len(passes)} passes, step {steps}: {sum(ranged.values())} ranges "
          f"= the trace's {len(events)} events; categories {sorted(colour)}"
          + (f"; choices of kernels: {where}" if choices else "")
          + (f"; streams {', '.join(sorted(streams))}" if streams else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
