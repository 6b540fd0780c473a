#!/usr/bin/env python3
"""A 2-layer transformer on synthetic tokens, trained twice from the same initial weights on the
same batches: with zmuon.Muon, and with torch.optim.Muon + torch.optim.AdamW configured to the
same contract (same lr, momentum, Nesterov, weight decay, update scale rule, same parameter
groups). Prints per-step loss and wall time of both, the largest loss gap, and the relative
difference of one step's update on the same gradients.

    PYTHONPATH=python ZMUON_LIBRARY=build/src/embed/libzmuon.so \\
        python3 examples/torch_train.py --steps 200 --device cpu

--device cuda runs both on the GPU. zmuon takes CUDA tensors by device pointer; a build or
backend that cannot (--zmuon-staging auto notices the engine's Unsupported error) copies them
through host memory instead, which the output says.

Note: torch.optim.Muon runs Newton-Schulz in bf16 (also on the CPU); zmuon's host backend runs it
in fp32 and its CUDA backend in bf16, so one step's Muon update differs by bf16 NS noise
(about 1e-2 relative); AdamW updates agree to fp32 rounding.
"""

import argparse
import copy
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

_here = os.path.dirname(os.path.abspath(__file__))
# zmuon from $ZMUON_PYTHON (another python/ folder, for an A/B of two trees), else this tree's
sys.path.insert(0, os.environ.get("ZMUON_PYTHON") or os.path.join(_here, "..", "python"))
_built = os.path.join(_here, "..", "build", "src", "embed", "libzmuon.so")
if "ZMUON_LIBRARY" not in os.environ and os.path.exists(_built):
    os.environ["ZMUON_LIBRARY"] = _built
import zmuon  # noqa: E402


# -- the model --------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.proj = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        y = att.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.o_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab, d, heads, layers, seq):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos_embed = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.pos_embed(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def add_model_args(ap, d_model=128, heads=4, layers=2, seq=64, batch=16):
    """The options of the model (TinyLM) and its data (synthetic_batch), with these defaults."""
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--d-model", type=int, default=d_model)
    ap.add_argument("--heads", type=int, default=heads)
    ap.add_argument("--layers", type=int, default=layers)
    ap.add_argument("--seq", type=int, default=seq)
    ap.add_argument("--batch", type=int, default=batch)


def synthetic_batch(args, step, device):
    """Tokens from a fixed sparse Markov chain (4 likely successors per token): learnable, so
    the loss falls well below log(vocab). The same batch for a given (seed, step)."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + 17)
    successors = torch.randint(0, args.vocab, (args.vocab, 4), generator=g)
    g.manual_seed(args.seed * 1_000_003 + step)
    tokens = torch.empty(args.batch, args.seq + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, args.vocab, (args.batch,), generator=g)
    for t in range(args.seq):
        choice = torch.randint(0, 4, (args.batch,), generator=g)
        tokens[:, t + 1] = successors[tokens[:, t], choice]
    tokens = tokens.to(device)
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(model, batch):
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


# -- the two optimizers -----------------------------------------------------------------------

def zmuon_config(args, backend):
    return {"optimizer": {"type": "Muon", "params": {
        "muon_lr": args.muon_lr, "adam_lr": args.adam_lr, "momentum": args.momentum,
        "nesterov": True, "weight_decay": args.weight_decay, "betas": [0.9, 0.95],
        "eps": 1e-10, "ns_steps": 5, "adjust_lr": "original"}},
        "zmuon": {"ranks": 1, "backend": backend, **({"comm": args.zmuon_comm}
                                                     if args.zmuon_comm else {})}}


def make_zmuon(model, args):
    """zmuon.Muon; with CUDA tensors, device pointers first and host staging if this build or
    backend does not take them (--zmuon-staging auto)."""
    staging = args.zmuon_staging
    if args.device.startswith("cuda") and staging == "auto":
        opt = zmuon.Muon(model.named_parameters(), zmuon_config(args, args.zmuon_backend))
        try:  # writing the (unchanged) parameters back probes whether device pointers work
            opt._write_back()
            return opt, "device pointers"
        except zmuon.Unsupported as e:
            print(f"# zmuon: {e}\n# zmuon: falling back to host staging", flush=True)
            opt.close()
            staging = "host"
    host = staging == "host" and args.device.startswith("cuda")
    opt = zmuon.Muon(model.named_parameters(), zmuon_config(args, args.zmuon_backend),
                     host_staging=host)
    return opt, ("host staging" if host else "device pointers" if args.device.startswith("cuda")
                 else "host memory")


class ZmuonStep:
    def __init__(self, model, args):
        self.opt, self.path = make_zmuon(model, args)
        self.muon_names = [n for n, _ in model.named_parameters() if self.opt.uses_muon(n)]

    def zero_grad(self):
        self.opt.zero_grad(set_to_none=True)

    def step(self):
        self.opt.step()


class ContractMuon(torch.optim.Optimizer):
    """torch.optim.Muon's step for torch versions without it: EMA momentum, Nesterov by lerp,
    Newton-Schulz in bf16 on the (wide) matrix normalized by its Frobenius norm, decoupled
    weight decay, lr scaled by sqrt(max(1, rows/cols))."""

    def __init__(self, params, lr, weight_decay, momentum, nesterov, ns_coefficients, eps,
                 ns_steps, adjust_lr_fn, ns_dtype=torch.bfloat16):
        assert adjust_lr_fn == "original"
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum,
                                      nesterov=nesterov, abc=ns_coefficients, eps=eps,
                                      ns_steps=ns_steps, ns_dtype=ns_dtype))

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.lerp_(p.grad, 1 - g["momentum"])
                u = p.grad.lerp(buf, g["momentum"]) if g["nesterov"] else buf
                x = u.to(g["ns_dtype"])
                tall = x.shape[0] > x.shape[1]
                x = x.T if tall else x
                x = x / x.norm().clamp(min=g["eps"])
                a, b, c = g["abc"]
                for _ in range(g["ns_steps"]):
                    m = x @ x.T
                    x = a * x + (b * m + c * m @ m) @ x
                x = x.T if tall else x
                p.mul_(1 - g["lr"] * g["weight_decay"])
                p.add_(x.to(p.dtype), alpha=-g["lr"] * max(1, p.shape[0] / p.shape[1]) ** 0.5)


class TorchStep:
    """torch.optim.Muon on the Muon group, torch.optim.AdamW on the rest."""

    def __init__(self, model, args, muon_names, fp32_ns_reference=False):
        named = dict(model.named_parameters())
        muon = [named[n] for n in muon_names]
        rest = [p for n, p in named.items() if n not in set(muon_names)]
        muon_class = getattr(torch.optim, "Muon", None)
        extra = {}
        if fp32_ns_reference:
            muon_class, extra = ContractMuon, {"ns_dtype": torch.float32}
        elif muon_class is None:
            print(f"# torch {torch.__version__} has no torch.optim.Muon (2.9+): using this "
                  "script's ContractMuon, which follows torch.optim.Muon's step")
            muon_class = ContractMuon
        self.opts = [
            muon_class(muon, lr=args.muon_lr, weight_decay=args.weight_decay,
                       momentum=args.momentum, nesterov=True,
                       ns_coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7, ns_steps=5,
                       adjust_lr_fn="original", **extra),
            torch.optim.AdamW(rest, lr=args.adam_lr, betas=(0.9, 0.95), eps=1e-10,
                              weight_decay=args.weight_decay)]

    def zero_grad(self):
        for o in self.opts:
            o.zero_grad(set_to_none=True)

    def step(self):
        for o in self.opts:
            o.step()


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def one_step_update_difference(base, args, device):
    """Each optimizer takes one step from the same weights on the same gradients. Returns the
    relative difference ||d_zmuon - d_ref|| / ||d_ref|| of the updates, Muon and AdamW groups
    apart, for ref = torch.optim (Muon + AdamW) and ref = the contract with fp32 Newton-Schulz
    (ContractMuon + AdamW), which separates bf16 NS noise from a difference of contract."""
    grads_model = copy.deepcopy(base)
    loss_of(grads_model, synthetic_batch(args, 0, device)).backward()
    grads = {n: p.grad.detach().clone() for n, p in grads_model.named_parameters()}
    models = [copy.deepcopy(base) for _ in range(3)]
    z = ZmuonStep(models[0], args)
    opts = [z, TorchStep(models[1], args, z.muon_names),
            TorchStep(models[2], args, z.muon_names, fp32_ns_reference=True)]
    deltas = []
    for model, opt in zip(models, opts):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.zero_grad()
        for n, p in model.named_parameters():
            p.grad = grads[n].clone()
        opt.step()
        sync(device)
        deltas.append({n: (p.detach() - before[n]).double() for n, p in model.named_parameters()})
    out = {}
    groups = (("muon", z.muon_names), ("adamw", [n for n in grads if n not in set(z.muon_names)]))
    for ref, name in ((1, "torch"), (2, "fp32")):
        for group, names in groups:
            num = sum(float((deltas[0][n] - deltas[ref][n]).norm() ** 2) for n in names)
            den = sum(float(deltas[ref][n].norm() ** 2) for n in names)
            out[name, group] = math.sqrt(num / den) if den > 0 else float("nan")
    z.opt.close()
    return out, z.path


def train(model, opt, args, device):
    losses, times = [], []
    for step in range(1, args.steps + 1):
        batch = synthetic_batch(args, step, device)
        sync(device)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_of(model, batch)
        loss.backward()
        opt.step()
        sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    return losses, times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    add_model_args(ap)
    ap.add_argument("--muon-lr", type=float, default=0.02)
    ap.add_argument("--adam-lr", type=float, default=3e-3)
    ap.add_argument("--momentum", type=float, default=0.95)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--zmuon-backend", default="host", help="zmuon compute backend: host | cuda")
    ap.add_argument("--zmuon-comm", default=None,
                    help="zmuon comm backend: caf | nccl (default: the engine's)")
    ap.add_argument("--zmuon-staging", default="auto", choices=["auto", "device", "host"],
                    help="CUDA tensors: device pointers, host copies, or device if supported")
    args = ap.parse_args()
    device = args.device
    torch.manual_seed(args.seed)
    base = TinyLM(args.vocab, args.d_model, args.heads, args.layers, args.seq).to(device)
    n_params = sum(p.numel() for p in base.parameters())
    print(f"# torch {torch.__version__}, zmuon {zmuon.version()}, device {device}, "
          f"{n_params} parameters, {args.steps} steps")

    rel, path = one_step_update_difference(base, args, device)
    print(f"# one step on the same gradients, update relative difference zmuon vs torch.optim: "
          f"Muon group {rel['torch', 'muon']:.3e}, AdamW group {rel['torch', 'adamw']:.3e}")
    print(f"# the same, zmuon vs the contract with fp32 Newton-Schulz: "
          f"Muon group {rel['fp32', 'muon']:.3e}, AdamW group {rel['fp32', 'adamw']:.3e}")

    model_z, model_t = copy.deepcopy(base), copy.deepcopy(base)
    z = ZmuonStep(model_z, args)
    print(f"# zmuon buffers: {path}; Muon group ({len(z.muon_names)}): "
          f"{', '.join(z.muon_names)}")
    t = TorchStep(model_t, args, z.muon_names)
    loss_z, time_z = train(model_z, z, args, device)
    loss_t, time_t = train(model_t, t, args, device)

    print(f"{'step':>5} {'loss_zmuon':>11} {'loss_torch':>11} {'gap':>10} "
          f"{'ms_zmuon':>9} {'ms_torch':>9}")
    for i in range(args.steps):
        print(f"{i + 1:5d} {loss_z[i]:11.6f} {loss_t[i]:11.6f} {loss_z[i] - loss_t[i]:10.6f} "
              f"{1e3 * time_z[i]:9.2f} {1e3 * time_t[i]:9.2f}")
    gaps = [abs(a - b) for a, b in zip(loss_z, loss_t)]
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    skip = min(5, args.steps - 1)  # the first steps carry one-off setup costs

    def median(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2]

    print(f"# largest loss gap {gaps[worst]:.6f} at step {worst + 1} "
          f"(relative {gaps[worst] / abs(loss_t[worst]):.3e}); final loss zmuon "
          f"{loss_z[-1]:.6f}, torch {loss_t[-1]:.6f}")
    print(f"# wall time per step (median after step {skip}): zmuon "
          f"{1e3 * median(time_z[skip:]):.2f} ms, torch.optim {1e3 * median(time_t[skip:]):.2f} ms")
    z.opt.close()


if __name__ == "__main__":
    main()
