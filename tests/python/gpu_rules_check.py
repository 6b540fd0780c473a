"""On the GPU machine: zmuon.Muon with every update rule on (expert stack, split_sizes with
heads, MuonClip, adjust_lr spectral, cautious weight decay, NorMuon) on the cuda backend with
CUDA tensors, against the same job on the host backend (fp32 Newton-Schulz, the CPU tests'
reference path), 10 steps. The cuda backend runs NS in bf16, so the figure is bf16 NS noise.
Prints the worst relative error per parameter; exit 1 over GPU_RULES_TOL (default 5e-2), or if
the rules move the weights less than twice that against plain Muon (then the check would prove nothing). Run by
bench/dev/gpu-check.sh:

    ZMUON_LIBRARY=.../libzmuon.so PYTHONPATH=python python3 tests/python/gpu_rules_check.py
"""

import os
import sys

import torch

import zmuon

TOL = float(os.environ.get("GPU_RULES_TOL", "5e-2"))
STEPS = 10
SHAPES = {"experts": (4, 48, 64), "qkv": (96, 64), "q": (32, 64), "k": (32, 64),
          "w": (64, 80), "bias": (80,)}
RULES = dict(split_sizes={"qkv": [48, 24, 24]}, heads={"qkv": [4, 2, 0], "q": 4, "k": 2},
             qk_clip={"q": "k"}, qk_clip_tau=0.5, adjust_lr="spectral",
             cautious_weight_decay=True, variant="normuon")


def run(device, backend, rules):
    torch.manual_seed(0)
    params = {n: (torch.randn(s) * 0.1).to(device) for n, s in SHAPES.items()}  # same on both
    opt = zmuon.Muon(list(params.items()), {"zmuon": {"backend": backend}}, lr=0.02,
                     adam_lr=3e-3, weight_decay=0.5, ns_variant="standard",
                     **(RULES if rules else {}))
    g = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        grads = {n: torch.randn(s, generator=g).to(device) for n, s in SHAPES.items()}
        if rules:  # head 1 of q exceeds tau from step 2 on: MuonClip acts
            logits = torch.tensor([0.1, 1.0 + step, 0.2, 0.3])
            opt.report_qk_logits("q", logits)
        opt.accumulate(grads={n: grads[n] for n in SHAPES})
        opt.step()
    opt.close()
    return {n: p.detach().cpu() for n, p in params.items()}


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def main():
    if not torch.cuda.is_available():
        print("gpu_rules_check: no GPU")
        return 77
    host = run("cpu", "host", True)
    cuda = run("cuda", "cuda", True)
    plain = run("cpu", "host", False)
    worst = 0.0
    for n in SHAPES:
        e = rel(cuda[n], host[n])
        print(f"  {n:8s} cuda vs host {e:.2e}  (rules vs plain Muon on the host "
              f"{rel(host[n], plain[n]):.2e})")
        worst = max(worst, e)
    moved = min(rel(host[n], plain[n]) for n in ("experts", "qkv", "q", "k", "w"))
    print(f"every rule on, {STEPS} steps ({torch.cuda.get_device_name()}): worst cuda vs host "
          f"{worst:.2e} (tolerance {TOL:g}); the rules move the Muon weights by at least "
          f"{moved:.2e} against plain Muon")
    return 0 if worst <= TOL and moved > 2 * worst else 1


if __name__ == "__main__":
    sys.exit(main())
