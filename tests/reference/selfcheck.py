#!/usr/bin/python3
"""selfcheck.py - checks the PyTorch reference against implementations that
share none of its code, so that weft is compared with something trustworthy.

1. forward: a plain numpy float64 GPT-2 (written from the formulas, not from
   gpt2_torch.py) gives the same loss as gpt2_torch.forward in float64;
2. backward: every parameter's autograd gradient (float64) matches central
   finite differences of the numpy loss, at sampled elements (the tied wte
   included) and along a random direction per tensor;
3. optimizer: torch.optim.AdamW as gpt2_torch.train drives it matches AdamW
   written out in numpy (decoupled weight decay, bias corrections) over
   three steps, parameters and both moments;
4. float32: the float32 reference stays within 1e-4 of the float64 one.

Exit status 0 when all hold. Usage: /usr/bin/python3 tests/reference/selfcheck.py
"""

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_torch as ref  # noqa: E402

# ---------------------------------------------------------------- numpy GPT-2


def np_layernorm(x, w, b, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)  # biased, as torch
    return (x - mu) / np.sqrt(var + eps) * w + b


def np_gelu(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def np_loss(W, tokens, labels, layers, heads):
    """GPT-2 loss in numpy, float64, one head and one batch row at a time."""
    B, S = tokens.shape
    H = W["wte.weight"].shape[1]
    dh = H // heads
    x = W["wte.weight"][tokens] + W["wpe.weight"][np.arange(S)][None]
    for i in range(layers):
        p = f"h.{i}."
        a = np_layernorm(x, W[p + "ln_1.weight"], W[p + "ln_1.bias"])
        qkv = np.einsum("bsk,kn->bsn", a, W[p + "attn.c_attn.weight"]) + W[p + "attn.c_attn.bias"]
        core = np.zeros((B, S, H))
        for b in range(B):
            for h in range(heads):
                cols = slice(h * dh, (h + 1) * dh)
                q = qkv[b, :, 0 * H :][:, cols]
                k = qkv[b, :, 1 * H :][:, cols]
                v = qkv[b, :, 2 * H :][:, cols]
                scores = q @ k.T / math.sqrt(dh)
                for t in range(S):  # position t attends to 0..t
                    row = scores[t, : t + 1]
                    e = np.exp(row - row.max())
                    core[b, t, cols] = (e / e.sum()) @ v[: t + 1]
        x = x + np.einsum("bsk,kn->bsn", core, W[p + "attn.c_proj.weight"]) + W[p + "attn.c_proj.bias"]
        m = np_layernorm(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"])
        f = np_gelu(np.einsum("bsk,kn->bsn", m, W[p + "mlp.c_fc.weight"]) + W[p + "mlp.c_fc.bias"])
        x = x + np.einsum("bsk,kn->bsn", f, W[p + "mlp.c_proj.weight"]) + W[p + "mlp.c_proj.bias"]
    x = np_layernorm(x, W["ln_f.weight"], W["ln_f.bias"])
    logits = np.einsum("bsh,vh->bsv", x, W["wte.weight"])
    top = logits.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(axis=-1)) + top[..., 0]
    picked = np.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return float((lse - picked).mean())


def np_adamw(p, g, m, v, step, lr=6e-4, b1=0.9, b2=0.999, eps=1e-8, wd=0.01):
    """AdamW (Loshchilov & Hutter) as torch documents it; returns (p, m, v)."""
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    mhat = m / (1 - b1**step)
    vhat = v / (1 - b2**step)
    return p - lr * mhat / (np.sqrt(vhat) + eps), m, v


# ---------------------------------------------------------------- checks

failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def tiny_model(seed):
    cfg = ref.Config(layers=2, hidden=16, heads=2, seq=8, vocab=32, batch=3)
    weights, inputs = ref.make_inputs(cfg, seed)
    rng = np.random.default_rng(seed + 100)
    W = {}
    for name, shape, kind in ref.param_specs(cfg):
        w = weights[name].astype(np.float64)
        if kind == "matrix":
            w = w * 10.0  # std 0.2: peaked attention, GELU off its linear part
        elif kind == "bias":
            w = w + rng.normal(0.0, 0.1, shape)
        W[name] = w
    return cfg, W, inputs["tokens"].astype(np.int64), inputs["labels"].astype(np.int64)


def torch_loss_and_grads(torch, cfg, W, tokens, labels):
    P = {n: torch.tensor(w, dtype=torch.float64, requires_grad=True) for n, w in W.items()}
    loss = ref.forward(torch, P, torch.from_numpy(tokens), torch.from_numpy(labels), cfg)
    loss.backward()
    return float(loss), {n: t.grad.numpy().copy() for n, t in P.items()}


def main():
    torch = ref.import_torch()
    cfg, W, tokens, labels = tiny_model(seed=7)

    # 1. forward
    lt, grads = torch_loss_and_grads(torch, cfg, W, tokens, labels)
    ln = np_loss(W, tokens, labels, cfg.layers, cfg.heads)
    check(abs(lt - ln) <= 1e-12 * abs(ln), f"forward: torch loss {lt:.15g}, numpy loss {ln:.15g}")

    # 2. backward, by central differences of the numpy loss
    rng = np.random.default_rng(11)
    h = 1e-5
    worst_el, worst_dir = (0.0, ""), (0.0, "")
    for name, w in W.items():
        g = grads[name]
        flat = w.reshape(-1)
        idx = rng.choice(flat.size, size=min(6, flat.size), replace=False)
        if name.endswith("c_attn.bias"):
            idx = np.append(idx, [cfg.hidden + 1])  # a key bias: zero gradient
        for j in idx:
            saved = flat[j]
            flat[j] = saved + h
            up = np_loss(W, tokens, labels, cfg.layers, cfg.heads)
            flat[j] = saved - h
            down = np_loss(W, tokens, labels, cfg.layers, cfg.heads)
            flat[j] = saved
            fd = (up - down) / (2 * h)
            err = abs(fd - g.reshape(-1)[j]) / (abs(fd) + 1e-6)
            if err > worst_el[0]:
                worst_el = (err, f"{name}[{j}] autograd {g.reshape(-1)[j]:.6g} fd {fd:.6g}")
        d = rng.normal(size=w.shape)
        W[name] = w + h * d
        up = np_loss(W, tokens, labels, cfg.layers, cfg.heads)
        W[name] = w - h * d
        down = np_loss(W, tokens, labels, cfg.layers, cfg.heads)
        W[name] = w
        fd = (up - down) / (2 * h)
        ad = float((g * d).sum())
        err = abs(fd - ad) / (abs(fd) + 1e-6)
        if err > worst_dir[0]:
            worst_dir = (err, f"{name}: autograd {ad:.6g} fd {fd:.6g}")
    check(worst_el[0] < 1e-5, f"gradient elements vs finite differences: worst {worst_el[0]:.2e} ({worst_el[1]})")
    check(worst_dir[0] < 1e-5, f"gradient directions vs finite differences: worst {worst_dir[0]:.2e} ({worst_dir[1]})")

    # 3. AdamW: gpt2_torch.train (float64) against numpy AdamW on autograd gradients
    steps = 3
    weights = {n: w for n, w in W.items()}
    inputs = {"tokens": tokens.astype(np.int32), "labels": labels.astype(np.int32)}
    out, losses, _ = ref.train(cfg, weights, inputs, steps, dtype="float64")
    p = {n: w.copy() for n, w in W.items()}
    m = {n: np.zeros_like(w) for n, w in W.items()}
    v = {n: np.zeros_like(w) for n, w in W.items()}
    np_losses = []
    for step in range(1, steps + 1):
        loss, g = torch_loss_and_grads(torch, cfg, p, tokens, labels)
        np_losses.append(np_loss(p, tokens, labels, cfg.layers, cfg.heads))
        for n in p:
            p[n], m[n], v[n] = np_adamw(p[n], g[n], m[n], v[n], step)
    worst = max(
        [(rel(out[n], p[n]), n) for n in p]
        + [(rel(out["optim.exp_avg." + n], m[n]), "optim.exp_avg." + n) for n in p]
        + [(rel(out["optim.exp_avg_sq." + n], v[n]), "optim.exp_avg_sq." + n) for n in p]
    )
    check(worst[0] < 1e-10, f"AdamW {steps} steps vs numpy AdamW: worst rel err {worst[0]:.2e} ({worst[1]})")
    lw = max(abs(a - b) / abs(b) for a, b in zip(losses, np_losses))
    check(lw < 1e-12, f"per-step losses (before each update) vs numpy: worst rel err {lw:.2e}")
    moved = min(rel(out[n], W[n]) for n in W)
    check(moved > 0, f"every parameter moved (least relative change {moved:.2e})")

    # 4. the float32 reference against float64, on the suite's shapes
    cfg = ref.Config(layers=2, hidden=64, heads=4, seq=32, vocab=256, batch=8)
    weights, inputs = ref.make_inputs(cfg, 3)
    r32, l32, _ = ref.train(cfg, weights, inputs, 3)
    r64, l64, _ = ref.train(cfg, weights, inputs, 3, dtype="float64")
    worst = max((rel(r32[n], r64[n]), n) for n in r64)
    lw = max(abs(a - b) / abs(b) for a, b in zip(l32, l64))
    check(worst[0] < 1e-4 and lw < 1e-6, f"float32 vs float64 training: worst {worst[0]:.2e} ({worst[1]}), losses {lw:.2e}")

    # 5. the schedules as weft documents them (Schedule.factor) against
    # torch's own schedulers: cosine (CosineAnnealingLR), linear decay and
    # linear warmup (LinearLR), for every step and past the end
    def torch_lrs(make, n):
        t = torch.zeros(1, requires_grad=True)
        opt = torch.optim.SGD([t], lr=6e-4)
        sch = make(opt)
        out = []
        for _ in range(n):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sch.step()
        return out

    lrs = torch.optim.lr_scheduler
    cases = [
        ("cosine", ref.Schedule(6e-4, "cosine", 0, 10, 6e-5),
         lambda o: lrs.CosineAnnealingLR(o, T_max=10, eta_min=6e-5), 10),
        ("linear", ref.Schedule(6e-4, "linear", 0, 10, 6e-5),
         lambda o: lrs.LinearLR(o, start_factor=1.0, end_factor=0.1, total_iters=10), 14),
        ("warmup", ref.Schedule(6e-4, "constant", 5, 20),
         lambda o: lrs.LinearLR(o, start_factor=1 / 5, end_factor=1.0, total_iters=4), 9),
    ]
    for name, sc, make, n in cases:
        want = torch_lrs(make, n)
        got = [6e-4 * sc.factor(k) for k in range(n)]
        err = max(abs(a - b) / b for a, b in zip(got, want))
        check(err < 1e-12, f"schedule {name}: Schedule.factor against torch's scheduler over {n} steps: {err:.1e}")

    # 6. clipping: clip_grad_norm_ returns the norm of all gradients together
    # and scales them to max_norm (numpy, float64)
    gs = [rng.normal(size=(3, 4)), rng.normal(size=(5,))]
    ts = [torch.tensor(g, dtype=torch.float64, requires_grad=True) for g in gs]
    for t, g in zip(ts, gs):
        t.grad = torch.tensor(g)
    norm = float(torch.nn.utils.clip_grad_norm_(ts, 0.5))
    np_norm = math.sqrt(sum(float((g * g).sum()) for g in gs))
    scaled = max(rel(t.grad.numpy(), g * 0.5 / (np_norm + 1e-6)) for t, g in zip(ts, gs))
    check(abs(norm - np_norm) / np_norm < 1e-12 and scaled < 1e-12,
          f"clip_grad_norm_: norm {norm:.6g} (numpy {np_norm:.6g}), gradients scaled by 0.5 / (norm + 1e-6): {scaled:.1e}")

    if failures:
        print(f"selfcheck: {len(failures)} check(s) failed")
        return 1
    print("selfcheck: the reference agrees with numpy, finite differences and AdamW by hand")
    return 0


if __name__ == "__main__":
    sys.exit(main())
