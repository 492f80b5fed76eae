#!/usr/bin/env python3
"""tolerance.py - the suite's tolerance rule, tried on PyTorch alone.

The rule (README.md, "Tolerances, and why"): a tensor or loss of weft's
training is within tolerance of the float32 reference's when its relative
L2 error is at most max(1e-5, 10 x the float32 reference's own error
against the same training in float64). This script shows, on the suite's
GPT-2 and AdamW settings and three seeds, that the rule passes what a
correct backend may do and fails what a wrong one does:

  correct: the gradient accumulated over 2, 4 and 8 micro-batches (the same
           mathematics summed in another order, as data parallelism,
           pipelines and accumulation sum it): each must stay under 1;
  bugs:    no weight decay; the exact (erf) GELU instead of the tanh one;
           LayerNorm's eps 1e-6 instead of 1e-5; one bias's gradient
           halved (a partial sum not reduced); one sample of eight dropped
           from the gradient (a device's share lost): each must exceed 1.

It prints one line per case (the worst ratio of error to tolerance over the
seeds, and where), then a summary, and exits 1 when the rule fails either
way. Usage: tolerance.py [--eps 1e-6] [--seeds 1,2,3]
"""

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import gpt2_torch as g2  # noqa: E402

RTOL, FACTOR = 1e-5, 10.0
STEPS = 3
CFG = g2.Config(layers=8, hidden=64, heads=4, seq=32, vocab=256, batch=8)


def exact_gelu(torch, x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def run(torch, weights, inputs, adam, dtype="float32", micro_batches=1, bug=None):
    """common.train of the suite's GPT-2, with one simulated bug or none:
    ({name: array}, [loss, ...])."""
    names = [n for n, _, _ in g2.param_specs(CFG)]
    batch = {k: inputs[k] for k in ("tokens", "labels")}
    gelu, ln_eps = g2.gelu_tanh, common.LN_EPS
    hooked = []

    def loss_fn(P, b):
        tokens, labels = b["tokens"], b["labels"]
        if bug == "halved" and not hooked:
            hooked.append(P["h.3.mlp.c_proj.bias"].register_hook(lambda grad: grad * 0.5))
        if bug == "dropped":  # the mean over eight samples with the first one's share missing
            rows = tokens.shape[0]
            return g2.forward(torch, P, tokens[1:], labels[1:], CFG) * ((rows - 1) / rows)
        return g2.forward(torch, P, tokens, labels, CFG)

    try:
        if bug == "erf":
            g2.gelu_tanh = exact_gelu
        if bug == "ln-eps":
            common.LN_EPS = 1e-6
        if bug == "no-decay":
            adam = common.Adam(adam.lr, adam.betas, adam.eps, 0.0)
        out, losses, _ = common.train(torch, loss_fn, names, weights, batch, STEPS, adam, dtype,
                                      common.Schedule(adam.lr), micro_batches)
    finally:
        g2.gelu_tanh, common.LN_EPS = gelu, ln_eps
    return out, losses


def worst_ratio(ours, ref, noise):
    """(error / tolerance, name) of the entry nearest its tolerance."""
    rows = []
    for name in ref[0]:
        tol = max(RTOL, FACTOR * common.rel_l2(ref[0][name], noise[0][name]))
        rows.append((common.rel_l2(ours[0][name], ref[0][name]) / tol, name))
    for s, (o, r, n) in enumerate(zip(ours[1], ref[1], noise[1]), 1):
        tol = max(RTOL, FACTOR * common.rel_l2(r, n))
        rows.append((common.rel_l2(o, r) / tol, f"loss step {s}"))
    return max(rows)


CORRECT = (("2 micro-batches", dict(micro_batches=2)), ("4 micro-batches", dict(micro_batches=4)),
           ("8 micro-batches", dict(micro_batches=8)))
BUGS = (("no weight decay", dict(bug="no-decay")), ("exact (erf) GELU", dict(bug="erf")),
        ("LayerNorm eps 1e-6", dict(bug="ln-eps")), ("a bias's gradient halved", dict(bug="halved")),
        ("a sample of eight dropped", dict(bug="dropped")))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tolerance.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--eps", type=float, default=1e-6, help="AdamW's eps (the suite's: 1e-6)")
    ap.add_argument("--seeds", default="1,2,3")
    args = ap.parse_args(argv)
    torch = common.import_torch("tolerance")
    adam = g2.ADAM.with_eps(args.eps)
    worst = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        weights, inputs = g2.make_inputs(CFG, seed)
        ref = run(torch, weights, inputs, adam)
        noise = run(torch, weights, inputs, adam, "float64")
        for name, kw in CORRECT + BUGS:
            r = worst_ratio(run(torch, weights, inputs, adam, **kw), ref, noise)
            # a correct case keeps its largest ratio, a bug its smallest
            keep = max if (name, kw) in CORRECT else min
            worst[name] = keep(worst.get(name, r), r)
    bad = []
    for name, kw in CORRECT + BUGS:
        ratio, where = worst[name]
        correct = (name, kw) in CORRECT
        ok = ratio < 1.0 if correct else ratio > 1.0
        kind = "correct" if correct else "bug"
        print(f"tolerance: {kind:7} {name:26} {ratio:10.3g} of a tolerance ({where}){'' if ok else '  FAIL'}")
        if not ok:
            bad.append(name)
    most = max(worst[n][0] for n, _ in CORRECT)
    least = min(worst[n][0] for n, _ in BUGS)
    print(f"tolerance: eps {args.eps:g}, seeds {args.seeds}: correct reorderings at most {most:.2g} of a tolerance, "
          f"simulated bugs at least {least:.3g}" + (f"; FAIL: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
