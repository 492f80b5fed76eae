#!/usr/bin/env python3
"""tokens.py - a token file for `weft run --data` from any text, with a
byte-level tokenizer: every byte of the text is one token (ids 0 to 255,
so a model with vocab = 256 reads them).

    python3 examples/tokens.py TEXT OUT.bin [--val VAL.bin] [--val-fraction F] [--raw]

Writes llm.c's format: a header of 256 little-endian int32 (magic 20240520,
version 1, the token count), then the tokens as little-endian uint16. With
--raw, the tokens alone (nanoGPT's format). With --val, the last fraction F
of the text (default 0.1) goes to VAL.bin instead of OUT.bin.
"""
import argparse
import struct
import sys

MAGIC, VERSION = 20240520, 1


def write(path, data, raw):
    with open(path, "wb") as f:
        if not raw:
            f.write(struct.pack("<256i", MAGIC, VERSION, len(data), *([0] * 253)))
        f.write(struct.pack("<%dH" % len(data), *data))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("text")
    ap.add_argument("out")
    ap.add_argument("--val")
    ap.add_argument("--val-fraction", type=float, default=0.1)
    ap.add_argument("--raw", action="store_true")
    a = ap.parse_args()
    if not 0 < a.val_fraction < 1:
        sys.exit("tokens.py: --val-fraction must lie between 0 and 1")
    with open(a.text, "rb") as f:
        data = f.read()
    cut = len(data) - int(len(data) * a.val_fraction) if a.val else len(data)
    write(a.out, data[:cut], a.raw)
    if a.val:
        write(a.val, data[cut:], a.raw)
    print("%s: %d tokens%s" % (a.out, cut, ", %s: %d tokens" % (a.val, len(data) - cut) if a.val else ""))


if __name__ == "__main__":
    main()
