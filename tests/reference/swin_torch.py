#!/usr/bin/python3
"""swin_torch.py - the PyTorch reference for weft's Swin Transformer.

weft's stdlib `swin` written as the original implementation computes it
(Liu et al. 2021): the patch embedding as a strided convolution, the grid
rolled by torch.roll and cut into windows by views, the relative position
bias gathered from its table by the original's index of relative
coordinates, the shifted windows' mask built from the original's nine
regions (-100 on pairs of different regions), patch merging by strided
slices; GELU is weft's (the tanh approximation). It shares no code or loop
structure with weft's kernels; trained with torch.optim.AdamW.

  make-inputs  from weft's initial parameters (`weft run --steps 0 --save`),
               checked against this model's names and shapes: the weights
               and a random batch (safetensors)
  train        N AdamW steps on one batch: final parameters, optimizer state
               and the per-step losses; --variant no-shift, no-bias or
               no-mask trains a model that differs from weft's on purpose
  compare      relative L2 error of every tensor and every step's figures

Run with /usr/bin/python3 (Debian's python3-torch). See README.md.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import gpt2_torch as g2  # noqa: E402
import st  # noqa: E402

INT_FLAGS = ("image", "patch", "channels", "embed", "window", "mlp_ratio", "classes", "batch")
LIST_FLAGS = ("depths", "heads")
# stdlib/models.plan swin: train adamw(lr = 1e-3, weight_decay = 0.05), torch's betas and eps
ADAM = common.Adam(1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)
VARIANTS = ("", "no-shift", "no-bias", "no-mask")


class Config:
    def __init__(self, **kw):
        for k in INT_FLAGS:
            setattr(self, k, int(kw[k]))
        for k in LIST_FLAGS:
            setattr(self, k, [int(v) for v in kw[k]])
        if len(self.depths) != len(self.heads) or not self.depths:
            raise SystemExit("swin_torch: depths and heads need one entry per stage")
        if self.image % self.patch:
            raise SystemExit("swin_torch: image must be divisible by patch")
        self.grid = self.image // self.patch
        for i in range(len(self.depths)):
            res, dim = self.res(i), self.dim(i)
            if self.grid % (1 << i) or res % self.win(i) or dim % self.heads[i]:
                raise SystemExit(f"swin_torch: stage {i} does not divide into windows or heads")

    def dim(self, i):
        return self.embed << i

    def res(self, i):
        return self.grid >> i

    def win(self, i):
        """A stage whose grid is no larger than the window attends over it all."""
        return min(self.window, self.res(i))

    def shift(self, i, j):
        """Every second block's windows shift by half a window, unless the
        stage's grid is no larger than the window."""
        return self.win(i) // 2 if j % 2 == 1 and self.res(i) > self.window else 0

    def as_dict(self):
        return {k: getattr(self, k) for k in INT_FLAGS + LIST_FLAGS}

    def __str__(self):
        return " ".join(f"{k}={getattr(self, k)}" for k in INT_FLAGS + LIST_FLAGS)


def param_specs(cfg):
    """Ordered (name, shape, kind), the names of weft's swin; linear weights
    [in, out]. kind: matrix, bias, norm or table."""
    C, E = cfg.channels, cfg.embed
    specs = [
        ("patch_embed.proj.weight", (C * cfg.patch * cfg.patch, E), "matrix"),
        ("patch_embed.proj.bias", (E,), "bias"),
        ("patch_embed.norm.weight", (E,), "norm"),
        ("patch_embed.norm.bias", (E,), "bias"),
    ]
    for i, depth in enumerate(cfg.depths):
        d, n, w = cfg.dim(i), cfg.heads[i], cfg.win(i)
        for j in range(depth):
            p = f"layers.{i}.blocks.{j}."
            specs += [
                (p + "attn.norm.weight", (d,), "norm"),
                (p + "attn.norm.bias", (d,), "bias"),
                (p + "attn.qkv.weight", (d, 3 * d), "matrix"),
                (p + "attn.qkv.bias", (3 * d,), "bias"),
                (p + "attn.relative_position_bias_table", ((2 * w - 1) ** 2, n), "table"),
                (p + "attn.proj.weight", (d, d), "matrix"),
                (p + "attn.proj.bias", (d,), "bias"),
                (p + "mlp.norm.weight", (d,), "norm"),
                (p + "mlp.norm.bias", (d,), "bias"),
                (p + "mlp.fc1.weight", (d, cfg.mlp_ratio * d), "matrix"),
                (p + "mlp.fc1.bias", (cfg.mlp_ratio * d,), "bias"),
                (p + "mlp.fc2.weight", (cfg.mlp_ratio * d, d), "matrix"),
                (p + "mlp.fc2.bias", (d,), "bias"),
            ]
        if i < len(cfg.depths) - 1:
            p = f"layers.{i}.downsample."
            specs += [
                (p + "norm.weight", (4 * d,), "norm"),
                (p + "norm.bias", (4 * d,), "bias"),
                (p + "reduction.weight", (4 * d, 2 * d), "matrix"),
            ]
    last = cfg.dim(len(cfg.depths) - 1)
    specs += [
        ("norm.weight", (last,), "norm"),
        ("norm.bias", (last,), "bias"),
        ("head.weight", (last, cfg.classes), "matrix"),
        ("head.bias", (cfg.classes,), "bias"),
    ]
    return specs


# ---------------------------------------------------------------- inputs


def check_names(cfg, weights, what):
    """weights must hold exactly this model's parameters, by name and shape."""
    problems = []
    specs = param_specs(cfg)
    for name, shape, _ in specs:
        if name not in weights:
            problems.append(f"missing parameter {name}")
        elif tuple(weights[name].shape) != shape:
            problems.append(f"{name}: shape {list(weights[name].shape)}, expected {list(shape)}")
    known = {n for n, _, _ in specs}
    problems += [f"unexpected tensor {n}" for n in weights if n not in known and not n.startswith("optim.")]
    if problems:
        more = f"; ... ({len(problems) - 8} more)" if len(problems) > 8 else ""
        raise SystemExit(f"swin_torch: {what}: " + "; ".join(problems[:8]) + more + f" (model {cfg})")


def make_inputs(cfg, seed, init):
    """weft's initial parameters (init: matrices and tables normal 0.02,
    biases 0, norm weights 1), then the biases and norms perturbed as
    gpt2_torch.py's (normal 0.02 and 1 + normal 0.1) so that a backend that
    drops one fails, and the relative position bias tables scaled by 25
    (std 0.5) so that the bias moves the attention by as much as the
    scores do; a batch of standard normal images and uniform labels."""
    check_names(cfg, init, "weft's initial parameters")
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape, kind in param_specs(cfg):
        w = np.asarray(init[name], dtype=np.float64)
        if kind == "bias":
            w = w + rng.normal(0.0, 0.02, shape)
        elif kind == "norm":
            w = w + rng.normal(0.0, 0.1, shape)
        elif kind == "table":
            w = w * 25.0
        weights[name] = w.astype(np.float32)
    inputs = {
        "images": rng.normal(0.0, 1.0, (cfg.batch, cfg.channels, cfg.image, cfg.image)).astype(np.float32),
        "labels": rng.integers(0, cfg.classes, (cfg.batch,)).astype(np.int32),
    }
    return weights, inputs


# ---------------------------------------------------------------- the model


def partition(x, ws):
    """[b, h, w, c] -> [b * windows, ws * ws, c], windows row by row."""
    b, h, w, c = x.shape
    x = x.view(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, ws * ws, c)


def unpartition(x, ws, b, h, w):
    c = x.shape[-1]
    x = x.view(b, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, w, c)


def relative_index(torch, ws):
    """[ws ws, ws ws]: the table row of each pair of a window's tokens, from
    their relative coordinates shifted to start at 0."""
    coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (ws - 1)
    return rel[:, :, 0] * (2 * ws - 1) + rel[:, :, 1]


def shift_mask(torch, res, ws, shift, dtype):
    """[windows, ws ws, ws ws]: 0 for pairs of one region of the rolled
    grid, -100 for pairs of different regions (the original's mask)."""
    regions = torch.zeros(res, res)
    cuts = (slice(0, -ws), slice(-ws, -shift), slice(-shift, None))
    label = 0
    for rows in cuts:
        for cols in cuts:
            regions[rows, cols] = label
            label += 1
    r = partition(regions.view(1, res, res, 1), ws).squeeze(-1)
    mask = r[:, None, :] - r[:, :, None]
    return torch.where(mask != 0, -100.0, 0.0).to(dtype)


def block(torch, P, p, x, heads, ws, shift, variant):
    F = torch.nn.functional
    b, res, _, d = x.shape
    dh = d // heads
    if variant == "no-shift":
        shift = 0
    h = g2.layer_norm(torch, x, P[p + "attn.norm.weight"], P[p + "attn.norm.bias"])
    if shift:
        h = torch.roll(h, shifts=(-shift, -shift), dims=(1, 2))
    win = partition(h, ws)                                        # [B, N, d]
    B, N, _ = win.shape
    qkv = (win @ P[p + "attn.qkv.weight"] + P[p + "attn.qkv.bias"]).view(B, N, 3, heads, dh)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)                          # [B, heads, N, dh] each
    scores = (q * dh ** -0.5) @ k.transpose(-2, -1)               # [B, heads, N, N]
    if variant != "no-bias":
        table = P[p + "attn.relative_position_bias_table"]
        bias = table[relative_index(torch, ws).reshape(-1)].view(N, N, heads).permute(2, 0, 1)
        scores = scores + bias.unsqueeze(0)
    if shift and variant != "no-mask":
        mask = shift_mask(torch, res, ws, shift, scores.dtype)    # [windows, N, N]
        nw = mask.shape[0]
        scores = (scores.view(b, nw, heads, N, N) + mask[None, :, None]).view(B, heads, N, N)
    out = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, N, d)
    out = out @ P[p + "attn.proj.weight"] + P[p + "attn.proj.bias"]
    out = unpartition(out, ws, b, res, res)
    if shift:
        out = torch.roll(out, shifts=(shift, shift), dims=(1, 2))
    x = x + out
    m = g2.layer_norm(torch, x, P[p + "mlp.norm.weight"], P[p + "mlp.norm.bias"])
    f = g2.gelu_tanh(torch, m @ P[p + "mlp.fc1.weight"] + P[p + "mlp.fc1.bias"])
    return x + (f @ P[p + "mlp.fc2.weight"] + P[p + "mlp.fc2.bias"])


def forward(torch, P, images, labels, cfg, variant=""):
    """The mean cross entropy of the classifier's logits against labels."""
    F = torch.nn.functional
    E, ps = cfg.embed, cfg.patch
    # the patch embedding: a convolution of kernel and stride `patch`, its
    # weight [c p p, embed] flattened (channel, row, column)
    kernel = P["patch_embed.proj.weight"].t().reshape(E, cfg.channels, ps, ps)
    x = F.conv2d(images, kernel, P["patch_embed.proj.bias"], stride=ps).permute(0, 2, 3, 1)
    x = g2.layer_norm(torch, x, P["patch_embed.norm.weight"], P["patch_embed.norm.bias"])
    for i, depth in enumerate(cfg.depths):
        for j in range(depth):
            x = block(torch, P, f"layers.{i}.blocks.{j}.", x, cfg.heads[i], cfg.win(i), cfg.shift(i, j), variant)
        if i < len(cfg.depths) - 1:
            p = f"layers.{i}.downsample."
            x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1)
            x = g2.layer_norm(torch, x, P[p + "norm.weight"], P[p + "norm.bias"]) @ P[p + "reduction.weight"]
    x = g2.layer_norm(torch, x, P["norm.weight"], P["norm.bias"]).mean(dim=(1, 2))
    logits = x @ P["head.weight"] + P["head.bias"]
    return F.cross_entropy(logits, labels)


def train(cfg, weights, inputs, steps, dtype="float32", variant="", eps=None):
    torch = common.import_torch("swin_torch")
    names = [name for name, _, _ in param_specs(cfg)]
    batch = {k: inputs[k] for k in ("images", "labels")}
    return common.train(torch, lambda P, b: forward(torch, P, b["images"], b["labels"], cfg, variant), names,
                        weights, batch, steps, ADAM.with_eps(eps), dtype)


def check_inputs(cfg, inputs, what):
    problems = []
    shapes = {"images": (cfg.batch, cfg.channels, cfg.image, cfg.image), "labels": (cfg.batch,)}
    for n, shape in shapes.items():
        if n not in inputs:
            problems.append(f"missing input {n}")
        elif tuple(inputs[n].shape) != shape:
            problems.append(f"{n}: shape {list(inputs[n].shape)}, expected {list(shape)}")
    if not problems and not (0 <= inputs["labels"].min() and inputs["labels"].max() < cfg.classes):
        problems.append(f"labels outside [0, {cfg.classes})")
    if problems:
        raise SystemExit(f"swin_torch: {what}: " + "; ".join(problems) + f" (model {cfg})")


# ---------------------------------------------------------------- command line


def main(argv=None):
    ap = argparse.ArgumentParser(prog="swin_torch.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("make-inputs", help="weights from weft's initial ones, and a random batch")
    for k in INT_FLAGS:
        p.add_argument(f"--{k.replace('_', '-')}", dest=k, type=int, required=True)
    for k in LIST_FLAGS:
        p.add_argument(f"--{k}", required=True, help="comma-separated, one per stage")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init", required=True, help="weft's initial parameters (weft run --steps 0 --save FILE)")
    p.add_argument("--weights", required=True)
    p.add_argument("--inputs", required=True)

    p = sub.add_parser("train", help="AdamW steps on one batch")
    common.add_train_args(p)
    p.add_argument("--variant", choices=VARIANTS[1:], help="a model unlike weft's: the windows not shifted, "
                   "no relative position bias, or shifted windows without their mask")

    common.add_compare_args(sub.add_parser("compare", help="weft's results against the reference"))

    args = ap.parse_args(argv)
    if args.cmd == "compare":
        return common.compare(args)
    if args.cmd == "make-inputs":
        conf = {k: getattr(args, k) for k in INT_FLAGS}
        try:
            conf.update({k: [int(v) for v in getattr(args, k).split(",")] for k in LIST_FLAGS})
        except ValueError:
            ap.error("--depths and --heads take comma-separated integers")
        cfg = Config(**conf)
        ((init, _),) = common.load_files("swin_torch", args.init)
        weights, inputs = make_inputs(cfg, args.seed, init)
        meta = {"weft.config": json.dumps(cfg.as_dict()), "weft.seed": str(args.seed)}
        st.save(args.weights, weights, meta)
        st.save(args.inputs, inputs, meta)
        return 0
    (weights, wmeta), (inputs, _) = common.load_files("swin_torch", args.weights, args.inputs)
    if "weft.config" not in wmeta:
        raise SystemExit(f"swin_torch: {args.weights}: no weft.config in its metadata (make-inputs writes it)")
    cfg = Config(**json.loads(wmeta["weft.config"]))
    check_names(cfg, weights, args.weights)
    check_inputs(cfg, inputs, args.inputs)
    out, losses, stats = train(cfg, weights, inputs, args.steps, args.dtype, args.variant or "", args.eps)
    import torch

    meta = {
        "weft.config": json.dumps(cfg.as_dict()),
        "weft.steps": str(args.steps),
        "weft.reference": f"torch {torch.__version__} {args.dtype} {ADAM.with_eps(args.eps)}" + (f", {args.variant}" if args.variant else ""),
    }
    common.write_results(args, out, losses, stats, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
