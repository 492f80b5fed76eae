#!/usr/bin/env python3
"""make.py - writes the damaged checkpoints and inputs of the golden tests in
this folder, from ok.safetensors (weft run tiny.plan --steps 2 --save
data/ok.safetensors). Run it in tests/golden/untrusted/data."""
import copy
import json
import struct


def read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), bytearray(b[8 + n:])


def write(path, header, data):
    h = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + bytes(data))


def put(header, data, name, index, value):
    at = header[name]["data_offsets"][0] + 4 * index
    data[at:at + 4] = struct.pack("<f", value)


h, d = read("ok.safetensors")
meta = {
    "step_int64_max": ("step", "9223372036854775807"),
    "step_huge": ("step", "99999999999999999999999"),
    "step_empty": ("step", ""),
    "step_negative": ("step", "-3"),
    "seed_word": ("seed", "abc"),
    "seed_negative": ("seed", "-1"),
    "other_model": ("model", "gpt2"),
    "other_optimizer": ("optimizer", "sgd"),
}
for name, (key, value) in meta.items():
    h2 = copy.deepcopy(h)
    h2["__metadata__"][key] = value
    write(name + ".safetensors", h2, d)

d2 = bytearray(d)
put(h, d2, "w", 1, float("nan"))
write("nan_weight.safetensors", h, d2)
d2 = bytearray(d)
for i in range(4):
    put(h, d2, "w", i, float("inf"))
write("inf_weight.safetensors", h, d2)
d2 = bytearray(d)
for i in range(4):
    put(h, d2, "w", i, 3e38)
write("huge_weight.safetensors", h, d2)
d2 = bytearray(d)
put(h, d2, "optim.exp_avg_sq.w", 2, -1.0)
write("negative_exp_avg_sq.safetensors", h, d2)
d2 = bytearray(d)
put(h, d2, "optim.exp_avg.w", 3, float("-inf"))
write("inf_state.safetensors", h, d2)

# inputs x and y of the tiny model, one element of x not a number
inputs = {"x": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
          "y": {"dtype": "F32", "shape": [2, 2], "data_offsets": [16, 32]}}
vals = [0.5, -1.0, 2.0, float("nan"), 1.0, 0.0, -0.5, 0.25]
write("nan_input.safetensors", inputs, b"".join(struct.pack("<f", v) for v in vals))
