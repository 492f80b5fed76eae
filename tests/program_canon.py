#!/usr/bin/env python3
"""program_canon.py - prints a lowered program (weft lower --json) in a form
that does not depend on the order in which communications were derived:
communications are numbered by their content, and every reference to one is
renumbered. Two programs that differ only in that order print the same."""
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


def main():
    doc = json.load(open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin)
    json.dump(canon(doc), sys.stdout, sort_keys=True, indent=0)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
