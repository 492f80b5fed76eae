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
import st  # noqa: E402

SIZE_FLAGS = ("layers", "hidden", "heads", "seq", "vocab", "batch")

# Training hyperparameters: stdlib/models.plan `train adamw(lr = 6e-4)` with the
# defaults of stdlib/ops.plan `op adamw` (those of torch.optim.AdamW).
LR = 6e-4
BETAS = (0.9, 0.999)
EPS = 1e-8
WEIGHT_DECAY = 0.01
LN_EPS = 1e-5


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
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, LN_EPS)


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


def import_torch():
    try:
        import torch
    except ImportError:
        raise SystemExit("gpt2_torch: PyTorch is not installed (make deps-torch installs it)")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return torch


def make_adamw(torch, params, lr=LR):
    kw = dict(lr=lr, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, amsgrad=False)
    try:  # the plain per-tensor loop: the formula as documented, nothing fused
        return torch.optim.AdamW(params, foreach=False, **kw)
    except TypeError:
        return torch.optim.AdamW(params, **kw)


class Schedule:
    """The learning rate of each step and gradient clipping, as `weft run`
    documents them (docs/run.md): a linear warmup over `warmup` steps, then
    constant, or cosine or linear decay from lr to lr_min, reached at step
    `decay`; clipping to a global L2 norm of `clip` (0: none)."""

    def __init__(self, lr=LR, kind="constant", warmup=0, decay=0, lr_min=0.0, clip=0.0):
        self.lr, self.kind, self.warmup, self.decay = lr, kind, warmup, decay
        self.lr_min, self.clip = lr_min, clip

    def factor(self, s):
        """lr of the step after s steps, over lr: the function LambdaLR takes."""
        if s < self.warmup:
            return (s + 1) / self.warmup
        if self.kind == "constant":
            return 1.0
        if s >= self.decay:
            return self.lr_min / self.lr
        p = (s - self.warmup) / (self.decay - self.warmup)
        if self.kind == "linear":
            return (self.lr + (self.lr_min - self.lr) * p) / self.lr
        return (self.lr_min + (self.lr - self.lr_min) * 0.5 * (1 + math.cos(math.pi * p))) / self.lr

    def scheduler(self, torch, opt):
        """torch's own scheduler where it is one (cosine without warmup is
        CosineAnnealingLR), else LambdaLR with factor(); None for a constant lr."""
        if self.kind == "cosine" and self.warmup == 0:
            return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=self.decay, eta_min=self.lr_min)
        if self.kind == "constant" and self.warmup == 0:
            return None
        return torch.optim.lr_scheduler.LambdaLR(opt, self.factor)


def train(cfg, weights, inputs, steps, micro_batches=1, dtype="float32", schedule=None):
    """`steps` AdamW steps on one batch. The loss of a step is that of the
    forward before its update. micro_batches > 1 accumulates the gradient over
    equal slices of the batch (same mathematics, another summation order: the
    tolerance study in README.md). With a Schedule, each step's learning rate
    comes from torch's scheduler and the gradients are clipped by
    torch.nn.utils.clip_grad_norm_. Returns ({name: array}, [loss, ...],
    [(lr, grad norm), ...])."""
    schedule = schedule or Schedule()
    torch = import_torch()
    tdtype = getattr(torch, dtype)
    names = [name for name, _, _ in param_specs(cfg)]
    P = {n: torch.tensor(np.asarray(weights[n]), dtype=tdtype, requires_grad=True) for n in names}
    tokens = torch.from_numpy(np.asarray(inputs["tokens"]).astype(np.int64))
    labels = torch.from_numpy(np.asarray(inputs["labels"]).astype(np.int64))
    if cfg.batch % micro_batches:
        raise SystemExit(f"gpt2_torch: batch {cfg.batch} does not split into {micro_batches} micro-batches")
    mb = cfg.batch // micro_batches
    opt = make_adamw(torch, [P[n] for n in names], schedule.lr)
    sched = schedule.scheduler(torch, opt)
    losses, stats = [], []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        if micro_batches == 1:
            loss = forward(torch, P, tokens, labels, cfg)
            loss.backward()
            losses.append(float(loss.detach()))
        else:
            total = 0.0
            for j in range(micro_batches):
                sl = slice(j * mb, (j + 1) * mb)
                loss = forward(torch, P, tokens[sl], labels[sl], cfg) / micro_batches
                loss.backward()
                total += float(loss.detach())
            losses.append(total)
        lr = opt.param_groups[0]["lr"]
        if schedule.clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_([P[n] for n in names], schedule.clip))
        else:
            norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(P[n].grad) for n in names])))
        stats.append((lr, norm))
        opt.step()
        if sched:
            sched.step()
    npdtype = np.dtype(dtype)  # float64 runs keep their precision in the file
    out = {}
    for n in names:
        out[n] = P[n].detach().numpy().astype(npdtype)
    for key in ("exp_avg", "exp_avg_sq"):
        for n in names:
            state = opt.state[P[n]]
            out[f"optim.{key}.{n}"] = (
                state[key].detach().numpy().astype(npdtype) if state else np.zeros(P[n].shape, npdtype)
            )
    return out, losses, stats


# ---------------------------------------------------------------- compare


def rel_l2(ours, ref):
    """||ours - ref|| / ||ref|| in float64; the absolute norm when ref is zero."""
    a = np.asarray(ours, dtype=np.float64)
    b = np.asarray(ref, dtype=np.float64)
    diff = float(np.linalg.norm((a - b).ravel()))
    scale = float(np.linalg.norm(b.ravel()))
    err = diff / scale if scale > 0 else diff
    return math.inf if math.isnan(err) else err


def read_steps(path, key="loss"):
    """{step: value of key} of a JSON {"steps": [...]}; key "loss" must be in
    every step, others (grad_norm, lr) are taken where present."""
    with open(path) as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            raise SystemExit(f"compare: {path}: not JSON: {e}")
    try:
        return {int(s["step"]): float(s[key]) for s in doc["steps"] if key == "loss" or s.get(key) is not None}
    except (KeyError, TypeError, ValueError):
        raise SystemExit(f"compare: {path}: expected {{\"steps\": [{{\"step\": N, \"loss\": X}}, ...]}}")


def read_losses(path):
    return read_steps(path)


def name_list(names, most=20):
    text = ", ".join(names[:most])
    return text + (f", ... ({len(names) - most} more)" if len(names) > most else "")


def load_tensors(path):
    try:
        return st.load(path)[0]
    except (OSError, st.FormatError) as e:
        raise SystemExit(f"compare: {e}")


def compare(args):
    """Exit status 0 when every tensor and loss is within its tolerance, 1 when
    not (or when names, shapes or steps differ). The tolerance of an entry is
    --rtol, or with --noise (the same training in float64) the larger of --rtol
    and --noise-factor times the reference's own float32 error on that entry."""
    ours, ref = load_tensors(args.ours), load_tensors(args.ref)
    noise = load_tensors(args.noise) if args.noise else None
    problems = []
    missing = [n for n in ref if n not in ours]
    extra = [n for n in ours if n not in ref]
    if missing:
        problems.append(f"{len(missing)} tensor(s) missing from {args.ours}: " + name_list(missing))
    if extra:
        problems.append(f"{len(extra)} tensor(s) in {args.ours} that {args.ref} lacks: " + name_list(extra))
    if noise is not None and sorted(noise) != sorted(ref):
        raise SystemExit(f"compare: {args.noise} and {args.ref} hold different tensors")

    def tolerance(rtol, floor):
        return max(rtol, args.noise_factor * floor)

    rows = []  # (err, tolerance, name, detail)
    for name in ref:
        if name not in ours:
            continue
        if tuple(ours[name].shape) != tuple(ref[name].shape):
            problems.append(f"{name}: shape {list(ours[name].shape)}, the reference has {list(ref[name].shape)}")
            continue
        floor = rel_l2(ref[name], noise[name]) if noise is not None else 0.0
        rows.append((rel_l2(ours[name], ref[name]), tolerance(args.rtol, floor), name, list(ref[name].shape)))
    nloss = 0
    if (args.ours_json is None) != (args.ref_json is None):
        raise SystemExit("compare: --ours-json and --ref-json go together")
    if args.ours_json:
        ol, rl = read_losses(args.ours_json), read_losses(args.ref_json)
        nl = read_losses(args.noise_json) if args.noise_json else {}
        if sorted(ol) != sorted(rl):
            problems.append(f"loss steps {sorted(ol)} in {args.ours_json}, {sorted(rl)} in {args.ref_json}")
        for s in sorted(rl):
            if s in ol:
                floor = rel_l2(rl[s], nl[s]) if s in nl else 0.0
                tol = tolerance(args.loss_rtol, floor)
                rows.append((rel_l2(ol[s], rl[s]), tol, f"loss step {s}", f"{ol[s]:.9g} vs {rl[s]:.9g}"))
                nloss += 1
        # the learning rate and the gradient norm of each step, where both give them
        for key, what, rtol in (("lr", "lr", 1e-12), ("grad_norm", "gradient norm", args.loss_rtol)):
            ov, rv = read_steps(args.ours_json, key), read_steps(args.ref_json, key)
            for s in sorted(rv):
                if s in ov:
                    rows.append((rel_l2(ov[s], rv[s]), rtol, f"{what} step {s}", f"{ov[s]:.9g} vs {rv[s]:.9g}"))
                    nloss += 1

    def ratio(r):
        return r[0] / r[1] if r[1] > 0 else (math.inf if r[0] > 0 else 0.0)

    rows.sort(key=lambda r: -ratio(r))
    structural = len(problems)
    for p in problems:  # names, shapes, steps: before the numbers
        print(f"compare: error: {p}")
    for err, tol, name, _ in rows:
        if err > tol:
            problems.append(f"{name}: relative error {err:.3g} exceeds {tol:.3g}")
    if rows:
        print(f"{'rel L2 error':>12} {'tolerance':>10}  name (the {min(10, len(rows))} nearest their tolerance, of {len(rows)})")
        for err, tol, name, detail in rows[:10]:
            print(f"{err:12.3e} {tol:10.2e}  {name} {detail}{'  FAIL' if err > tol else ''}")
    numeric = problems[structural:]
    for p in numeric[:10]:
        print(f"compare: error: {p}")
    if len(numeric) > 10:
        print(f"compare: ... and {len(numeric) - 10} more over their tolerance")
    worst = max(rows, key=lambda r: r[0]) if rows else (0.0, 0.0, "-", "")
    nearest = rows[0] if rows else (0.0, 1.0, "-", "")
    tol_text = f"rtol {args.rtol:g}" + (f", losses {args.loss_rtol:g}" if args.loss_rtol != args.rtol else "")
    if noise is not None:
        tol_text += f", or {args.noise_factor:g}x the float32 reference's own error"
    print(
        f"compare: {'FAIL' if problems else 'ok'}: {len(rows) - nloss} tensors and {nloss} per-step figures: losses, learning rates, gradient norms ({tol_text}), "
        f"{len(problems)} problem(s); max rel err {worst[0]:.3e} ({worst[2]}); "
        f"worst error/tolerance {ratio(nearest):.2f} ({nearest[2]})"
    )
    return 1 if problems else 0


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
    p.add_argument("--weights", required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--json", help="write the per-step losses here as well")
    p.add_argument("--micro-batches", type=int, default=1, help="accumulate gradients over this many slices")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--lr-schedule", choices=("constant", "cosine", "linear"), default="constant")
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--decay-steps", type=int, help="the step the decay ends at (default: --steps)")
    p.add_argument("--lr-min", type=float, default=0.0)
    p.add_argument("--clip", type=float, default=0.0, help="clip_grad_norm_ to this (0: none)")

    p = sub.add_parser("compare", help="weft's results against the reference")
    p.add_argument("--ours", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--ours-json")
    p.add_argument("--ref-json")
    p.add_argument("--rtol", type=float, default=1e-5)
    p.add_argument("--loss-rtol", type=float, help="tolerance for losses (default: --rtol)")
    p.add_argument("--noise", help="the same training in float64 (train --dtype float64): widens each "
                   "tolerance to --noise-factor times the float32 reference's own error")
    p.add_argument("--noise-json", help="its losses")
    p.add_argument("--noise-factor", type=float, default=10.0)

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
        try:
            weights, wmeta = st.load(args.weights)
            inputs, imeta = st.load(args.inputs)
        except (OSError, st.FormatError) as e:
            raise SystemExit(f"gpt2_torch: {e}")
        cfg = config_from(args, [wmeta, imeta])
        check_weights(cfg, weights, inputs, f"{args.weights}, {args.inputs}")
        schedule = Schedule(args.lr, args.lr_schedule, args.warmup,
                            args.decay_steps if args.decay_steps is not None else args.steps, args.lr_min, args.clip)
        out, losses, stats = train(cfg, weights, inputs, args.steps, args.micro_batches, args.dtype, schedule)
        import torch

        meta = {
            "weft.config": json.dumps(cfg.as_dict()),
            "weft.steps": str(args.steps),
            "weft.reference": f"torch {torch.__version__} {args.dtype} AdamW(lr={args.lr}, betas={BETAS}, "
            f"eps={EPS}, weight_decay={WEIGHT_DECAY}), micro_batches={args.micro_batches}, "
            f"schedule {args.lr_schedule} warmup {args.warmup} decay {schedule.decay} lr_min {args.lr_min}, "
            f"clip {args.clip}",
        }
        st.save(args.out, out, meta)
        doc = {"steps": [{"step": i + 1, "loss": l, "lr": lr, "grad_norm": gn}
                         for i, (l, (lr, gn)) in enumerate(zip(losses, stats))]}
        text = json.dumps(doc)
        print(text)
        if args.json:
            with open(args.json, "w") as f:
                f.write(text + "\n")
        return 0
    if args.loss_rtol is None:
        args.loss_rtol = args.rtol
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
