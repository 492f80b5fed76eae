#!/usr/bin/python3
"""gpt2_torch.py - the PyTorch reference for weft's GPT-2 numerics.

GPT-2 as Hugging Face's GPT2LMHeadModel computes it (weft's stdlib `gpt`),
in float32, trained with torch.optim.AdamW; weft's CPU backend must agree.

  make-inputs  random weights and a random batch (safetensors)
  train        N AdamW steps on one batch: final parameters, optimizer state
               and the per-step losses
  compare      relative L2 error of every tensor and every step's loss
               between weft's results and these

Run with /usr/bin/python3 (Debian's python3-torch). See README.md.
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import st  # noqa: E402
from common import Schedule, import_torch  # noqa: E402,F401  (selfcheck.py uses them from here)

SIZE_FLAGS = ("layers", "hidden", "heads", "seq", "vocab", "batch")

# Training hyperparameters: stdlib/models.plan `train adamw(lr = 6e-4)` with the
# defaults of stdlib/ops.plan `op adamw` (those of torch.optim.AdamW).
LR = 6e-4
ADAM = common.Adam(LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


class Config:
    def __init__(self, layers, hidden, heads, seq, vocab, batch):
        self.layers, self.hidden, self.heads = layers, hidden, heads
        self.seq, self.vocab, self.batch = seq, vocab, batch
        for k in SIZE_FLAGS:
            if getattr(self, k) < 1:
                raise SystemExit(f"gpt2_torch: --{k} must be at least 1")
        if hidden % heads:
            raise SystemExit(f"gpt2_torch: hidden ({hidden}) must be divisible by heads ({heads})")

    def as_dict(self):
        return {k: getattr(self, k) for k in SIZE_FLAGS}

    def __str__(self):
        return " ".join(f"{k}={getattr(self, k)}" for k in SIZE_FLAGS)


def param_specs(cfg):
    """Ordered (name, shape, kind): kind is 'matrix', 'bias' or 'norm'."""
    H, V, S = cfg.hidden, cfg.vocab, cfg.seq
    specs = [("wte.weight", (V, H), "matrix"), ("wpe.weight", (S, H), "matrix")]
    for i in range(cfg.layers):
        p = f"h.{i}."
        specs += [
            (p + "ln_1.weight", (H,), "norm"),
            (p + "ln_1.bias", (H,), "bias"),
            (p + "attn.c_attn.weight", (H, 3 * H), "matrix"),
            (p + "attn.c_attn.bias", (3 * H,), "bias"),
            (p + "attn.c_proj.weight", (H, H), "matrix"),
            (p + "attn.c_proj.bias", (H,), "bias"),
            (p + "ln_2.weight", (H,), "norm"),
            (p + "ln_2.bias", (H,), "bias"),
            (p + "mlp.c_fc.weight", (H, 4 * H), "matrix"),
            (p + "mlp.c_fc.bias", (4 * H,), "bias"),
            (p + "mlp.c_proj.weight", (4 * H, H), "matrix"),
            (p + "mlp.c_proj.bias", (H,), "bias"),
        ]
    specs += [("ln_f.weight", (H,), "norm"), ("ln_f.bias", (H,), "bias")]
    return specs


# ---------------------------------------------------------------- inputs


def make_inputs(cfg, seed):
    """GPT-2's initialisation (normal 0.02, zero biases, unit norms), then the
    norms and biases perturbed so that their gradients matter; numpy's PCG64,
    so the files do not depend on the torch version."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape, kind in param_specs(cfg):
        if kind == "matrix":
            w = rng.normal(0.0, 0.02, shape)
        elif kind == "bias":
            w = np.zeros(shape) + rng.normal(0.0, 0.02, shape)
        else:
            w = np.ones(shape) + rng.normal(0.0, 0.1, shape)
        weights[name] = w.astype(np.float32)
    shape = (cfg.batch, cfg.seq)
    inputs = {
        "tokens": rng.integers(0, cfg.vocab, shape).astype(np.int32),
        "labels": rng.integers(0, cfg.vocab, shape).astype(np.int32),
    }
    return weights, inputs


# ---------------------------------------------------------------- the model


def layer_norm(torch, x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, common.LN_EPS)


def gelu_tanh(torch, x):
    # Hugging Face's gelu_new (GPT-2's activation), written out.
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def forward(torch, P, tokens, labels, cfg):
    """Mean cross-entropy loss of GPT2LMHeadModel (tied head, no label shift).
    P: {name: tensor}; tokens, labels: int64 [b, seq] (b may be a micro-batch)."""
    F = torch.nn.functional
    B, S = tokens.shape
    H, n = cfg.hidden, cfg.heads
    dh = H // n
    x = P["wte.weight"][tokens] + P["wpe.weight"][:S]
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    for i in range(cfg.layers):
        p = f"h.{i}."
        a = layer_norm(torch, x, P[p + "ln_1.weight"], P[p + "ln_1.bias"])
        qkv = a @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]
        q, k, v = (t.reshape(B, S, n, dh).transpose(1, 2) for t in qkv.split(H, dim=-1))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(dh)
        scores = scores.masked_fill(~causal, float("-inf"))
        core = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, S, H)
        x = x + (core @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"])
        m = layer_norm(torch, x, P[p + "ln_2.weight"], P[p + "ln_2.bias"])
        f = gelu_tanh(torch, m @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"])
        x = x + (f @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"])
    x = layer_norm(torch, x, P["ln_f.weight"], P["ln_f.bias"])
    logits = x @ P["wte.weight"].t()
    return F.cross_entropy(logits.reshape(-1, cfg.vocab), labels.reshape(-1))


def train(cfg, weights, inputs, steps, micro_batches=1, dtype="float32", schedule=None, adam=None):
    """common.train of forward(): ({name: array}, [loss, ...], [(lr, grad
    norm), ...]); micro_batches > 1 accumulates the gradient over equal
    slices of the batch (the tolerance study in README.md)."""
    torch = import_torch("gpt2_torch")
    names = [name for name, _, _ in param_specs(cfg)]
    if cfg.batch % micro_batches:
        raise SystemExit(f"gpt2_torch: batch {cfg.batch} does not split into {micro_batches} micro-batches")
    batch = {k: inputs[k] for k in ("tokens", "labels")}
    return common.train(torch, lambda P, b: forward(torch, P, b["tokens"], b["labels"], cfg), names, weights, batch,
                        steps, adam or ADAM, dtype, schedule or Schedule(LR), micro_batches)


# ---------------------------------------------------------------- command line


def config_from(args, metadata_sources):
    """Size flags from the command line, else from a file's weft.config."""
    given = {k: getattr(args, k) for k in SIZE_FLAGS}
    stored = {}
    for meta in metadata_sources:
        if "weft.config" in meta:
            stored = json.loads(meta["weft.config"])
            break
    vals = {}
    for k in SIZE_FLAGS:
        v = given[k] if given[k] is not None else stored.get(k)
        if v is None:
            raise SystemExit(f"gpt2_torch: --{k} is needed (the input files do not record it)")
        vals[k] = int(v)
    return Config(**vals)


def check_weights(cfg, weights, inputs, args_file):
    problems = []
    specs = param_specs(cfg)
    for name, shape, _ in specs:
        if name not in weights:
            problems.append(f"missing parameter {name}")
        elif tuple(weights[name].shape) != shape:
            problems.append(f"{name}: shape {list(weights[name].shape)}, expected {list(shape)}")
    known = {n for n, _, _ in specs}
    problems += [f"unexpected tensor {n}" for n in weights if n not in known]
    for n in ("tokens", "labels"):
        if n not in inputs:
            problems.append(f"missing input {n}")
        elif tuple(inputs[n].shape) != (cfg.batch, cfg.seq):
            problems.append(f"{n}: shape {list(inputs[n].shape)}, expected {[cfg.batch, cfg.seq]}")
        elif inputs[n].size and not (0 <= inputs[n].min() and inputs[n].max() < cfg.vocab):
            problems.append(f"{n}: ids outside [0, {cfg.vocab})")
    if problems:
        more = f"; ... ({len(problems) - 8} more)" if len(problems) > 8 else ""
        raise SystemExit(f"gpt2_torch: {args_file}: " + "; ".join(problems[:8]) + more + f" (model {cfg})")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="gpt2_torch.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def sizes(p):
        for k in SIZE_FLAGS:
            p.add_argument(f"--{k}", type=int)

    p = sub.add_parser("make-inputs", help="random weights and inputs")
    sizes(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weights", required=True)
    p.add_argument("--inputs", required=True)

    p = sub.add_parser("train", help="AdamW steps on one batch")
    sizes(p)
    common.add_train_args(p)
    p.add_argument("--micro-batches", type=int, default=1, help="accumulate gradients over this many slices")
    common.add_schedule_args(p, LR)

    common.add_compare_args(sub.add_parser("compare", help="weft's results against the reference"))

    args = ap.parse_args(argv)
    if args.cmd == "make-inputs":
        missing = [k for k in SIZE_FLAGS if getattr(args, k) is None]
        if missing:
            ap.error("make-inputs needs " + ", ".join("--" + k for k in missing))
        cfg = Config(**{k: getattr(args, k) for k in SIZE_FLAGS})
        weights, inputs = make_inputs(cfg, args.seed)
        meta = {"weft.config": json.dumps(cfg.as_dict()), "weft.seed": str(args.seed)}
        st.save(args.weights, weights, meta)
        st.save(args.inputs, inputs, meta)
        return 0
    if args.cmd == "train":
        (weights, wmeta), (inputs, imeta) = common.load_files("gpt2_torch", args.weights, args.inputs)
        cfg = config_from(args, [wmeta, imeta])
        check_weights(cfg, weights, inputs, f"{args.weights}, {args.inputs}")
        schedule = common.schedule_from(args)
        out, losses, stats = train(cfg, weights, inputs, args.steps, args.micro_batches, args.dtype, schedule,
                                   ADAM.with_eps(args.eps))
        import torch

        adam = common.Adam(args.lr, ADAM.betas, ADAM.eps, ADAM.weight_decay).with_eps(args.eps)
        meta = {
            "weft.config": json.dumps(cfg.as_dict()),
            "weft.steps": str(args.steps),
            "weft.reference": f"torch {torch.__version__} {args.dtype} {adam}, "
            f"micro_batches={args.micro_batches}, {schedule}",
        }
        common.write_results(args, out, losses, stats, meta)
        return 0
    return common.compare(args)


if __name__ == "__main__":
    sys.exit(main())
