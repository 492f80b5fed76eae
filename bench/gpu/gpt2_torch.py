#!/usr/bin/env python3
"""gpt2_torch.py - the PyTorch side of bench/gpu.sh: GPT-2 (weft's stdlib
`gpt`: pre-LayerNorm blocks, fused q|k|v, tanh GELU, the LM head tied to
the token embedding) trained with AdamW on one random batch, in PyTorch
eager or torch.compile, bf16 autocast over f32 parameters (PyTorch's usual
mixed precision; weft keeps bf16 parameters with f32 masters), attention by
F.scaled_dot_product_attention. Prints one JSON object:
{"mode", "batch", "steps", "step_s", "tokens_per_s"} or {"error"}.

    python3 gpt2_torch.py --mode eager|compile --layers 12 --hidden 768 \\
        --heads 12 --seq 1024 --vocab 50257 --batch 8 [--steps 10 --warmup 5]
"""

import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(h, eps=1e-5)
        self.c_attn = nn.Linear(h, 3 * h)
        self.c_proj = nn.Linear(h, h)
        self.ln_2 = nn.LayerNorm(h, eps=1e-5)
        self.c_fc = nn.Linear(h, 4 * h)
        self.mlp_proj = nn.Linear(4 * h, h)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, s, h))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, h, heads, seq, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(seq, h)
        self.h = nn.ModuleList(Block(h, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h, eps=1e-5)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe.weight[: tokens.shape[1]]
        for blk in self.h:
            x = blk(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    for k, d in (("layers", 12), ("hidden", 768), ("heads", 12), ("seq", 1024), ("vocab", 50257), ("batch", 8),
                 ("steps", 10), ("warmup", 5)):
        ap.add_argument("--" + k, type=int, default=d)
    a = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    try:
        model = GPT(a.layers, a.hidden, a.heads, a.seq, a.vocab).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.01, fused=True)
        fwd = torch.compile(model) if a.mode == "compile" else model
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
        labels = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = fwd(tokens)
            loss = F.cross_entropy(logits.float().view(-1, a.vocab), labels.view(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        for _ in range(a.warmup):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            loss = step()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / a.steps
        out = {"mode": a.mode, "batch": a.batch, "steps": a.steps, "step_s": dt,
               "tokens_per_s": a.batch * a.seq / dt, "loss": float(loss)}
        if not math.isfinite(out["loss"]):
            out["error"] = "the loss is not finite"
    except torch.cuda.OutOfMemoryError as e:
        out = {"mode": a.mode, "batch": a.batch, "error": "out of memory: " + str(e).split("\n")[0]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
