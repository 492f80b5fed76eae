#!/usr/bin/env python3
"""layers_check.py - the pipeline is one-way (docs/design/architecture.md).

Reads every `#include "..."` of the library, the backends and the command
line, and fails when
  - a file includes the header of a later stage (the stage order below);
  - the includes make a cycle (a .c file and the private header beside it
    named like it count as one file);
  - a .c file declares a function `extern` (a dependency the includes hide).
Usage: python3 tests/layers_check.py [-v]
"""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(ROOT)

# Stages in pipeline order: a file may include headers of its own stage and
# of earlier ones.
STAGES = ["base", "front", "ir", "eval", "plan", "lower", "cost", "validate", "search", "script", "backends", "report",
          "cli"]

# The stage of each public header: where what it declares is implemented.
PUBLIC = {
    "arena": "base", "diag": "base", "units": "base",
    "ast": "front",
    "value": "ir", "graph": "ir", "cluster": "ir", "decisions": "ir",
    "context": "eval", "workspace": "eval",
    "plan": "plan", "deps": "plan",
    "lower": "lower",
    "cost": "cost", "sim": "cost",
    "validate": "validate",
    "search": "search",
    "script": "script",
    "backend": "backends",
    "report": "report",
}

GENERATED = {"parser.h", "lexer.h"}


def stage_of(path):
    parts = path.split("/")
    if parts[0] == "src":
        return parts[1]
    if parts[0] == "include":
        stem = os.path.splitext(parts[-1])[0]
        return PUBLIC.get(stem)
    if parts[0] == "backends":
        return "backends"
    if parts[0] == "grammar":
        return "front"
    return None


def files():
    out = []
    for pat in ["src/*/*.c", "src/*/*.h", "include/weft/*.h", "backends/*.c", "backends/*.h",
                "backends/*/*.c", "backends/*/*.h", "grammar/*.y", "grammar/*.l"]:
        out += glob.glob(pat)
    return sorted(out)


def resolve(src, name):
    for d in [os.path.dirname(src), "include", "src", "backends"]:
        p = os.path.normpath(os.path.join(d, name))
        if os.path.isfile(p):
            return p
    return None


def module_of(path):
    """A file, with a .c and the private header beside it named like it as one."""
    stem, ext = os.path.splitext(path)
    if ext == ".h" and os.path.isfile(stem + ".c"):
        return stem
    return stem if ext == ".c" else path


def main():
    verbose = "-v" in sys.argv
    fs = files()
    problems = []
    edges = {}
    nincl = 0
    for f in fs:
        text = open(f, encoding="utf-8", errors="replace").read()
        code = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
        st = stage_of(f)
        if st not in STAGES:
            problems.append(f"{f}: not in a stage folder ({', '.join(STAGES)})")
            continue
        if f.endswith(".c"):
            for m in re.finditer(r"^\s*extern\s+[^;(]*\(", code, flags=re.M):
                line = code[:m.start()].count("\n") + 1
                problems.append(f"{f}:{line}: a function declared extern: include the header that declares it")
        for m in re.finditer(r'^\s*#\s*include\s+"([^"]+)"', code, flags=re.M):
            name = m.group(1)
            if os.path.basename(name) in GENERATED:
                continue
            line = code[:m.start()].count("\n") + 1
            h = resolve(f, name)
            nincl += 1
            if not h:
                problems.append(f'{f}:{line}: "{name}" is not in the tree')
                continue
            hs = stage_of(h)
            if hs not in STAGES:
                problems.append(f"{f}:{line}: {h} belongs to no stage")
                continue
            if STAGES.index(hs) > STAGES.index(st):
                problems.append(f"{f}:{line}: stage {st} includes {h} of the later stage {hs}")
            a, b = module_of(f), module_of(h)
            if a != b:
                edges.setdefault(a, set()).add(b)
            if verbose:
                print(f"{f} -> {h} ({st} -> {hs})")
    # cycles among modules
    state = {}
    stack = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                cyc = stack[stack.index(m):] + [m]
                problems.append("include cycle: " + " -> ".join(cyc))
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n)
    for p in problems:
        print("layers: " + p)
    mods = len(set(edges) | {m for v in edges.values() for m in v})
    print(f"layers: {len(fs)} files, {nincl} includes, {mods} modules, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
