"""common.py - what the PyTorch references of tests/reference share.

Each reference (gpt2_torch.py, moe_torch.py, swin_torch.py) writes its model
as a loss function of named parameters and a batch; this module does the
rest alike for all of them:

  import_torch      torch, deterministic and on one thread
  load_files        weights and inputs from safetensors, errors as one line
  Adam, Schedule    AdamW's settings (a model's `train adamw(...)`), the
                    learning rate of each step and clipping (docs/run.md)
  train             N AdamW steps on one batch: final parameters, AdamW's
                    moments, the per-step losses, learning rates and norms
  write_results     the file and JSON `compare` reads
  compare           relative L2 error of every tensor and every step's
                    figures, within a tolerance (README.md)
  add_schedule_args, add_compare_args   the command lines' shared options
"""

import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

LN_EPS = 1e-5  # stdlib/ops.plan layernorm's eps (torch's default)


class Adam:
    """torch.optim.AdamW's settings: a model's `train adamw(...)` with the
    defaults of stdlib/ops.plan `op adamw` (those of torch)."""

    def __init__(self, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay

    def __str__(self):
        return f"AdamW(lr={self.lr}, betas={self.betas}, eps={self.eps}, weight_decay={self.weight_decay})"

    def with_eps(self, eps):
        """These settings with another eps (train --eps), or these when None."""
        return self if eps is None else Adam(self.lr, self.betas, eps, self.weight_decay)


def import_torch(prog="reference"):
    try:
        import torch
    except ImportError:
        raise SystemExit(f"{prog}: PyTorch is not installed (make deps-torch installs it)")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return torch


def make_adamw(torch, params, adam):
    kw = dict(lr=adam.lr, betas=adam.betas, eps=adam.eps, weight_decay=adam.weight_decay, amsgrad=False)
    try:  # the plain per-tensor loop: the formula as documented, nothing fused
        return torch.optim.AdamW(params, foreach=False, **kw)
    except TypeError:
        return torch.optim.AdamW(params, **kw)


class Schedule:
    """The learning rate of each step and gradient clipping, as `weft run`
    documents them (docs/run.md): a linear warmup over `warmup` steps, then
    constant, or cosine or linear decay from lr to lr_min, reached at step
    `decay`; clipping to a global L2 norm of `clip` (0: none)."""

    def __init__(self, lr, kind="constant", warmup=0, decay=0, lr_min=0.0, clip=0.0):
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

    def __str__(self):
        return (f"schedule {self.kind} warmup {self.warmup} decay {self.decay} lr_min {self.lr_min}, "
                f"clip {self.clip}")


def train(torch, loss_fn, names, weights, inputs, steps, adam, dtype="float32", schedule=None, micro_batches=1):
    """`steps` AdamW steps on one batch. loss_fn(P, batch) is the model's loss
    of parameters P ({name: tensor}) on batch ({name: tensor}: floating
    inputs in `dtype`, ids as int64, the batch along the first dimension).
    The loss of a step is that of the forward before its update.
    micro_batches > 1 accumulates the gradient over equal slices of the batch
    (the same mathematics in another summation order). With a Schedule, each
    step's learning rate comes from torch's scheduler and the gradients are
    clipped by torch.nn.utils.clip_grad_norm_. Returns ({name: array}: the
    parameters, then optim.exp_avg.NAME and optim.exp_avg_sq.NAME; [loss,
    ...]; [(lr, gradient norm before clipping), ...])."""
    schedule = schedule or Schedule(adam.lr)
    tdtype = getattr(torch, dtype)
    P = {n: torch.tensor(np.asarray(weights[n]), dtype=tdtype, requires_grad=True) for n in names}
    batch = {}
    for k, v in inputs.items():
        v = np.asarray(v)
        batch[k] = torch.from_numpy(v.astype(np.int64)) if v.dtype.kind in "iu" else torch.tensor(v, dtype=tdtype)
    rows = {int(v.shape[0]) for v in batch.values()}
    if len(rows) != 1 or rows.pop() % micro_batches:
        raise SystemExit(f"reference: the batch does not split into {micro_batches} micro-batches")
    mb = next(iter(batch.values())).shape[0] // micro_batches
    opt = make_adamw(torch, [P[n] for n in names], Adam(schedule.lr, adam.betas, adam.eps, adam.weight_decay))
    sched = schedule.scheduler(torch, opt)
    losses, stats = [], []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        if micro_batches == 1:
            loss = loss_fn(P, batch)
            loss.backward()
            losses.append(float(loss.detach()))
        else:
            total = 0.0
            for j in range(micro_batches):
                part = {k: v[j * mb:(j + 1) * mb] for k, v in batch.items()}
                loss = loss_fn(P, part) / micro_batches
                loss.backward()
                total += float(loss.detach())
            losses.append(total)
        lr = opt.param_groups[0]["lr"]
        if schedule.clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_([P[n] for n in names], schedule.clip))
        else:
            norm = float(torch.linalg.vector_norm(torch.stack(
                [torch.linalg.vector_norm(P[n].grad) for n in names if P[n].grad is not None])))
        stats.append((lr, norm))
        opt.step()
        if sched:
            sched.step()
    npdtype = np.dtype(dtype)  # float64 runs keep their precision in the file
    out = {n: P[n].detach().numpy().astype(npdtype) for n in names}
    for key in ("exp_avg", "exp_avg_sq"):
        for n in names:
            state = opt.state[P[n]]
            out[f"optim.{key}.{n}"] = (
                state[key].detach().numpy().astype(npdtype) if state else np.zeros(P[n].shape, npdtype)
            )
    return out, losses, stats


# ---------------------------------------------------------------- files


def load_files(prog, *paths):
    """[(tensors, metadata)] of each safetensors file; an error exits naming it."""
    try:
        return [st.load(p) for p in paths]
    except (OSError, st.FormatError) as e:
        raise SystemExit(f"{prog}: {e}")


def write_results(args, out, losses, stats, metadata):
    """The trained tensors to args.out, and the per-step figures as JSON on
    stdout and to args.json (when given): what `compare` reads."""
    st.save(args.out, out, metadata)
    doc = {"steps": [{"step": i + 1, "loss": l, "lr": lr, "grad_norm": gn}
                     for i, (l, (lr, gn)) in enumerate(zip(losses, stats))]}
    text = json.dumps(doc)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


def add_train_args(p):
    p.add_argument("--weights", required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--json", help="write the per-step losses here as well")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--eps", type=float, help="AdamW's eps (default: the model's, torch's 1e-8; run.sh trains with 1e-6)")


def add_schedule_args(p, lr):
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--lr-schedule", choices=("constant", "cosine", "linear"), default="constant")
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--decay-steps", type=int, help="the step the decay ends at (default: --steps)")
    p.add_argument("--lr-min", type=float, default=0.0)
    p.add_argument("--clip", type=float, default=0.0, help="clip_grad_norm_ to this (0: none)")


def schedule_from(args):
    return Schedule(args.lr, args.lr_schedule, args.warmup,
                    args.decay_steps if args.decay_steps is not None else args.steps, args.lr_min, args.clip)


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


def name_list(names, most=20):
    text = ", ".join(names[:most])
    return text + (f", ... ({len(names) - most} more)" if len(names) > most else "")


def load_tensors(path):
    try:
        return st.load(path)[0]
    except (OSError, st.FormatError) as e:
        raise SystemExit(f"compare: {e}")


def add_compare_args(p):
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


def compare(args):
    """Exit status 0 when every tensor and loss is within its tolerance, 1 when
    not (or when names, shapes or steps differ). The tolerance of an entry is
    --rtol, or with --noise (the same training in float64) the larger of --rtol
    and --noise-factor times the reference's own float32 error on that entry."""
    if args.loss_rtol is None:
        args.loss_rtol = args.rtol
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
        ol, rl = read_steps(args.ours_json), read_steps(args.ref_json)
        nl = read_steps(args.noise_json) if args.noise_json else {}
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
