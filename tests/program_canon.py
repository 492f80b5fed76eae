#!/usr/bin/env python3
"""program_canon.py - prints a lowered program (weft lower --json) in a form
that does not depend on the order in which communications were derived:
communications are numbered by their content, and every reference to one is
renumbered. Two programs that differ only in that order print the same.
With two files it compares them itself: exit 0 when their canonical forms
are equal, else 1 with the first lines that differ."""
import json
import sys


def canon(doc):
    comms = doc["comms"]
    keyed = []
    for c in comms:
        body = {k: v for k, v in c.items() if k != "id"}
        keyed.append((json.dumps(body, sort_keys=True), c["id"]))
    keyed.sort()
    new_id = {old: i for i, (_, old) in enumerate(keyed)}
    doc["comms"] = [json.loads(k) for k, _ in keyed]
    for prog in doc["programs"]:
        for ins in prog["instructions"]:
            if "comm" in ins:
                ins["comm"] = new_id[ins["comm"]]
    return doc


def dumps(doc):
    return json.dumps(doc, sort_keys=True, indent=0) + "\n"


def compare(path_a, path_b):
    with open(path_a) as fa, open(path_b) as fb:
        a, b = canon(json.load(fa)), canon(json.load(fb))
    if a == b:
        return 0
    la, lb = dumps(a).splitlines(), dumps(b).splitlines()
    i = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y),
             min(len(la), len(lb)))
    print("first difference at line %d of the canonical forms:" % (i + 1))
    for line in la[max(0, i - 2):i + 4]:
        print("- " + line)
    for line in lb[max(0, i - 2):i + 4]:
        print("+ " + line)
    return 1


def main():
    if len(sys.argv) == 3:
        sys.exit(compare(sys.argv[1], sys.argv[2]))
    doc = json.load(open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin)
    json.dump(canon(doc), sys.stdout, sort_keys=True, indent=0)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
