"""GPT-2 small (124M) trained on the GPU with zmuon.Muon from an installed wheel, in plain torch
(no transformers, no download): the check that the release wheel works where users run it.

    python wheel_gpt2_cuda.py [--steps 60] [--batch 8] [--seq 256] [--config JSON]

Run it from outside the checkout, with the wheel installed (bench/dev/gpu-wheel-check.sh does).
It checks that zmuon comes from site-packages with the CUDA library loaded (libzmuon.so, not
libzmuon_cpu.so), and that the loss on one batch of random tokens, trained on again and again,
falls by at least 1 nat (mean of the last 10 steps against the first 5); it prints the median
optimizer step time. Without
--config, zmuon.Muon gets no backend setting: it must pick the GPU from the tensors.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import zmuon
from zmuon import _capi


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT2(nn.Module):
    """GPT-2 small's shapes: 12 layers, width 768, 12 heads, vocabulary 50257, tied head."""

    def __init__(self, vocab=50257, ctx=1024, d=768, layers=12, heads=12):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for p in (self.wte.weight, self.wpe.weight):
            nn.init.normal_(p, std=0.02)  # GPT-2's: the first loss is about ln V

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--config", default=None, help="a zmuon config as JSON (default: none)")
    args = ap.parse_args()

    print(f"zmuon {zmuon.version()} from {os.path.dirname(zmuon.__file__)}")
    print(f"library {_capi.library_path}; CUDA library missing: {_capi.cuda_missing}")
    installed = os.environ.get("ZMUON_WHEEL_SITE", "site-packages")  # where pip put it
    if installed not in zmuon.__file__:
        sys.exit(f"FAIL: zmuon is not the installed wheel's (not under {installed})")
    if os.path.basename(_capi.library_path) != "libzmuon.so":
        sys.exit("FAIL: the wheel's CUDA library did not load")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")

    torch.manual_seed(0)
    model = GPT2().cuda()
    print(f"parameters: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M")
    config = json.loads(args.config) if args.config else None
    opt = zmuon.Muon(model.named_parameters(), config, lr=0.02, adam_lr=3e-3)
    vocab = model.wte.num_embeddings
    gen = torch.Generator(device="cuda").manual_seed(1)

    fixed = torch.randint(0, vocab, (args.batch, args.seq + 1), device="cuda", generator=gen)

    def batch():
        # One batch of random tokens, every step: memorised in a few dozen steps.
        return fixed

    losses, step_ms = [], []
    for step in range(args.steps):
        tokens = batch()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab).float(), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.step()
        torch.cuda.synchronize()
        step_ms.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
        if step % 5 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {losses[-1]:.4f}  opt.step {step_ms[-1]:.2f} ms")
    median = statistics.median(step_ms[3:])
    first, last = statistics.mean(losses[:5]), statistics.mean(losses[-10:])
    print(f"mean loss of the first 5 steps {first:.3f}, of the last 10 {last:.3f} "
          f"(ln V = {math.log(vocab):.3f}); median opt.step {median:.2f} ms over steps "
          f"3..{args.steps - 1}")
    if not all(math.isfinite(x) for x in losses) or last > first - 1.0:
        sys.exit("FAIL: the loss did not fall by 1 nat")
    print("PASS")


if __name__ == "__main__":
    main()
