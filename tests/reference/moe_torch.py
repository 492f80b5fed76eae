#!/usr/bin/python3
"""moe_torch.py - the PyTorch reference for weft's mixture of experts.

weft's stdlib `moe_gpt` (GPT-2 attention, routed GELU experts, Switch's
load-balancing loss) written with PyTorch tensor operations in GShard's
vectorised form (one-hot dispatch and combine masks, positions by cumulative
sums), which shares no code or loop structure with weft's kernels; trained
with torch.optim.AdamW.

  make-inputs  random weights and a random batch (safetensors)
  train        N AdamW steps on one batch: final parameters, optimizer state
               and the per-step losses (cross entropy plus the auxiliary
               losses)
  compare      as gpt2_torch.py compare

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
import gpt2_torch as g2  # noqa: E402
import st  # noqa: E402

INT_FLAGS = ("layers", "hidden", "heads", "seq", "vocab", "batch", "experts", "top_k", "ffn")
FLOAT_FLAGS = ("capacity_factor", "aux_loss")


class Config:
    def __init__(self, **kw):
        for k in INT_FLAGS:
            setattr(self, k, int(kw[k]))
        for k in FLOAT_FLAGS:
            setattr(self, k, float(kw[k]))
        if not 1 <= self.top_k <= self.experts:
            raise SystemExit("moe_torch: top_k must be between 1 and experts")
        # stdlib/models.plan moe_gpt: max(1, int(ceil(capacity_factor * seq * top_k / experts)))
        self.capacity = max(1, int(math.ceil(self.capacity_factor * self.seq * self.top_k / self.experts)))

    def as_dict(self):
        return {k: getattr(self, k) for k in INT_FLAGS + FLOAT_FLAGS}

    def __str__(self):
        return " ".join(f"{k}={getattr(self, k)}" for k in INT_FLAGS + FLOAT_FLAGS)


def param_specs(cfg):
    """Ordered (name, shape, kind), the names of weft's moe_gpt."""
    H, V, S, E, F = cfg.hidden, cfg.vocab, cfg.seq, cfg.experts, cfg.ffn
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
            (p + "moe.router.weight", (E, H), "router"),
            (p + "moe.c_fc.weight", (E, H, F), "matrix"),
            (p + "moe.c_proj.weight", (E, F, H), "matrix"),
        ]
    specs += [("ln_f.weight", (H,), "norm"), ("ln_f.bias", (H,), "bias")]
    return specs


def make_inputs(cfg, seed):
    """As gpt2_torch.py's, with a router of std 0.5, so that its
    probabilities are far from uniform and top-k choices far from ties."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape, kind in param_specs(cfg):
        if kind == "matrix":
            w = rng.normal(0.0, 0.02, shape)
        elif kind == "router":
            w = rng.normal(0.0, 0.5, shape)
        elif kind == "bias":
            w = rng.normal(0.0, 0.02, shape)
        else:
            w = np.ones(shape) + rng.normal(0.0, 0.1, shape)
        weights[name] = w.astype(np.float32)
    shape = (cfg.batch, cfg.seq)
    inputs = {
        "tokens": rng.integers(0, cfg.vocab, shape).astype(np.int32),
        "labels": rng.integers(0, cfg.vocab, shape).astype(np.int32),
    }
    return weights, inputs


def moe_layer(torch, cfg, x, wr, w1, w2):
    """The routed layer on x [b, s, h]: its result and its load-balancing loss."""
    F = torch.nn.functional
    B, S, H = x.shape
    E, K, C = cfg.experts, cfg.top_k, cfg.capacity
    probs = F.softmax(x @ wr.t(), dim=-1)                       # [b, s, e]
    top_p, top_i = torch.topk(probs, K, dim=-1)                 # largest first
    masks = [F.one_hot(top_i[..., j], E).to(x.dtype) for j in range(K)]  # [b, s, e] each
    # positions: choice j of token t comes after every earlier choice's
    # tokens of its expert and this choice's earlier tokens
    before = torch.zeros(B, 1, E, dtype=x.dtype)
    dispatch = torch.zeros(B, S, E, C, dtype=x.dtype)
    kept = []
    for m in masks:
        pos = torch.cumsum(m, dim=1) - m + before               # [b, s, e]
        before = before + m.sum(dim=1, keepdim=True)
        keep = m * (pos < C).to(x.dtype)
        slot = F.one_hot(pos.clamp(max=C - 1).long(), C).to(x.dtype)  # [b, s, e, c]
        d = keep.unsqueeze(-1) * slot
        dispatch = dispatch + d
        kept.append(d)
    weights = top_p / top_p.sum(dim=-1, keepdim=True) if K > 1 else top_p
    combine = sum(weights[..., j, None, None] * kept[j] for j in range(K))
    xe = torch.einsum("bsec,bsh->ebch", dispatch, x)
    he = g2.gelu_tanh(torch, torch.einsum("ebch,ehf->ebcf", xe, w1))
    ye = torch.einsum("ebcf,efh->ebch", he, w2)
    out = torch.einsum("bsec,ebch->bsh", combine, ye)
    f = sum(masks).sum(dim=1) / (S * K)                         # [b, e], before dropping
    p_mean = probs.mean(dim=1)
    aux = cfg.aux_loss * E * (f * p_mean).sum(dim=-1).mean()
    return out, aux


def forward(torch, P, tokens, labels, cfg):
    """The cross entropy plus every layer's load-balancing loss."""
    F = torch.nn.functional
    B, S = tokens.shape
    H, n = cfg.hidden, cfg.heads
    dh = H // n
    x = P["wte.weight"][tokens] + P["wpe.weight"][:S]
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    aux_total = 0.0
    for i in range(cfg.layers):
        p = f"h.{i}."
        a = g2.layer_norm(torch, x, P[p + "ln_1.weight"], P[p + "ln_1.bias"])
        qkv = a @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]
        q, k, v = (t.reshape(B, S, n, dh).transpose(1, 2) for t in qkv.split(H, dim=-1))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(dh)
        scores = scores.masked_fill(~causal, float("-inf"))
        core = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, S, H)
        x = x + (core @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"])
        m = g2.layer_norm(torch, x, P[p + "ln_2.weight"], P[p + "ln_2.bias"])
        y, aux = moe_layer(torch, cfg, m, P[p + "moe.router.weight"], P[p + "moe.c_fc.weight"],
                           P[p + "moe.c_proj.weight"])
        x = x + y
        aux_total = aux_total + aux
    x = g2.layer_norm(torch, x, P["ln_f.weight"], P["ln_f.bias"])
    logits = x @ P["wte.weight"].t()
    return F.cross_entropy(logits.reshape(-1, cfg.vocab), labels.reshape(-1)) + aux_total


def train(cfg, weights, inputs, steps, dtype="float32", eps=None):
    torch = common.import_torch("moe_torch")
    names = [name for name, _, _ in param_specs(cfg)]
    batch = {k: inputs[k] for k in ("tokens", "labels")}
    return common.train(torch, lambda P, b: forward(torch, P, b["tokens"], b["labels"], cfg), names, weights, batch,
                        steps, g2.ADAM.with_eps(eps), dtype)


def dropped(cfg, weights, inputs):
    """The share of the first layer's choices over capacity at the initial
    weights (the forward of weft's routing, for the suite to report)."""
    torch = common.import_torch("moe_torch")
    P = {n: torch.tensor(np.asarray(weights[n])) for n, _, _ in param_specs(cfg)}
    tokens = torch.from_numpy(np.asarray(inputs["tokens"]).astype(np.int64))
    S = cfg.seq
    x = P["wte.weight"][tokens] + P["wpe.weight"][:S]
    # the first layer's router reads ln_2 of the attention's result: recompute it
    with torch.no_grad():
        y = forward_to_router(torch, P, x, cfg)
        probs = torch.softmax(y @ P["h.0.moe.router.weight"].t(), dim=-1)
        counts = torch.nn.functional.one_hot(torch.topk(probs, cfg.top_k, dim=-1)[1], cfg.experts).sum(dim=(1, 2))
        over = (counts - cfg.capacity).clamp(min=0).sum()
    return float(over) / float(tokens.numel() * cfg.top_k)


def forward_to_router(torch, P, x, cfg):
    F = torch.nn.functional
    B, S, H = x.shape
    n = cfg.heads
    dh = H // n
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    a = g2.layer_norm(torch, x, P["h.0.ln_1.weight"], P["h.0.ln_1.bias"])
    qkv = a @ P["h.0.attn.c_attn.weight"] + P["h.0.attn.c_attn.bias"]
    q, k, v = (t.reshape(B, S, n, dh).transpose(1, 2) for t in qkv.split(H, dim=-1))
    scores = ((q @ k.transpose(-1, -2)) / math.sqrt(dh)).masked_fill(~causal, float("-inf"))
    core = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, S, H)
    x = x + (core @ P["h.0.attn.c_proj.weight"] + P["h.0.attn.c_proj.bias"])
    return g2.layer_norm(torch, x, P["h.0.ln_2.weight"], P["h.0.ln_2.bias"])


def main(argv=None):
    ap = argparse.ArgumentParser(prog="moe_torch.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def sizes(p):
        for k in INT_FLAGS:
            p.add_argument(f"--{k.replace('_', '-')}", dest=k, type=int)
        for k in FLOAT_FLAGS:
            p.add_argument(f"--{k.replace('_', '-')}", dest=k, type=float)

    p = sub.add_parser("make-inputs", help="random weights and inputs")
    sizes(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weights", required=True)
    p.add_argument("--inputs", required=True)

    p = sub.add_parser("train", help="AdamW steps on one batch")
    common.add_train_args(p)
    p.add_argument("--capacity-factor", type=float, help="instead of the one the weights record")
    p.add_argument("--aux-loss", type=float, help="instead of the one the weights record")

    p = sub.add_parser("dropped", help="the share of the first layer's choices over capacity")
    p.add_argument("--weights", required=True)
    p.add_argument("--inputs", required=True)

    common.add_compare_args(sub.add_parser("compare", help="weft's results against the reference"))

    args = ap.parse_args(argv)
    if args.cmd == "make-inputs":
        missing = [k for k in INT_FLAGS + FLOAT_FLAGS if getattr(args, k) is None]
        if missing:
            ap.error("make-inputs needs " + ", ".join("--" + k.replace("_", "-") for k in missing))
        cfg = Config(**{k: getattr(args, k) for k in INT_FLAGS + FLOAT_FLAGS})
        weights, inputs = make_inputs(cfg, args.seed)
        meta = {"weft.config": json.dumps(cfg.as_dict()), "weft.seed": str(args.seed)}
        st.save(args.weights, weights, meta)
        st.save(args.inputs, inputs, meta)
        return 0
    if args.cmd == "compare":
        return common.compare(args)
    (weights, wmeta), (inputs, _) = common.load_files("moe_torch", args.weights, args.inputs)
    conf = json.loads(wmeta["weft.config"])
    for k in FLOAT_FLAGS:
        if getattr(args, k, None) is not None:
            conf[k] = getattr(args, k)
    cfg = Config(**conf)
    if args.cmd == "dropped":
        print(f"{dropped(cfg, weights, inputs):.4f}")
        return 0
    out, losses, stats = train(cfg, weights, inputs, args.steps, args.dtype, args.eps)
    common.write_results(args, out, losses, stats, {"weft.config": json.dumps(cfg.as_dict()), "weft.steps": str(args.steps)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
