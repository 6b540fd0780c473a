"""On the GPU machine: zmuon.Muon takes its device from the tensors. The small transformer of
test_torch_optim on CUDA with no config trains on the cuda backend (against the same model with
config={"zmuon": {"backend": "cuda"}}: within 1e-6, both being the same path), a bf16 copy of it
trains with fp32 masters (within bf16's rounding of the fp32 run, GPU_BF16_TOL, default 5e-2),
a write outside zmuon (p.data.copy_()) is where the next step starts (against
torch.optim.AdamW making the same write: GPU_PARITY_TOL, default 5e-2, the bf16 NS noise of
gpu_torch_parity), and parameters on the CPU and the GPU are refused naming both. With two GPUs,
the model on cuda:1 without a config trains on GPU 1 as on cuda:0 (within 1e-6), and parameters on
cuda:0 and cuda:1 are refused naming both. Exit 1 on a
failure. Run by bench/dev/gpu-check.sh:

    ZMUON_LIBRARY=.../libzmuon.so PYTHONPATH=python python3 tests/python/gpu_torch_device.py
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_torch_optim as t  # noqa: E402  (the model, the data, the hyperparameters)
from gpu_torch_parity import CudaTransformer  # noqa: E402

import zmuon  # noqa: E402

PARITY_TOL = float(os.environ.get("GPU_PARITY_TOL", "5e-2"))
BF16_TOL = float(os.environ.get("GPU_BF16_TOL", "5e-2"))


def model(dtype=torch.float32, device="cuda"):
    torch.manual_seed(0)
    return CudaTransformer().to(device, dtype)


def train(m, opts, steps=10, write_at=None, device="cuda"):
    for step, tokens in enumerate(t.batches(steps)):
        if step == write_at:
            m.fc.weight.data.copy_(0.01 * torch.ones_like(m.fc.weight))
            m.ln1.bias.data.copy_(0.5 * torch.ones_like(m.ln1.bias))
        for o in opts:
            o.zero_grad()
        t.lm_loss(m, tokens.to(device)).backward()
        for o in opts:
            o.step()
    torch.cuda.synchronize()
    return {n: p.detach().float() for n, p in m.named_parameters()}


def worst(a, b):
    return max(t.rel(a[n], b[n]) for n in a)


def main():
    if not torch.cuda.is_available():
        print("gpu_torch_device: no GPU")
        return 77
    failed = []
    h = dict(t.HYPER)
    plain = model()
    opt = zmuon.Muon(plain.named_parameters(), **h)
    ours = train(plain, [opt])
    named = model()
    theirs = train(named, [zmuon.Muon(named.named_parameters(),
                                      config={"zmuon": {"backend": "cuda"}}, **h)])
    e = worst(ours, theirs)
    print(f"CUDA tensors without a config vs backend cuda named: {e:.2e} (tolerance 1e-6)")
    if e > 1e-6:
        failed.append("no config")

    if torch.cuda.device_count() > 1:  # cuda:1 runs on GPU 1's cuda backend (zmuon.device=1)
        second = model(device="cuda:1")
        there = train(second, [zmuon.Muon(second.named_parameters(), **h)], device="cuda:1")
        e = worst({n: v.to("cuda:0") for n, v in there.items()}, ours)
        print(f"the same model on cuda:1 without a config vs on cuda:0: {e:.2e} "
              "(tolerance 1e-6)")
        if e > 1e-6 or any(p.device != torch.device("cuda:1") for p in second.parameters()):
            failed.append("cuda:1")
        pair = [("w0", torch.nn.Parameter(torch.zeros(4, 4, device="cuda:0"))),
                ("w1", torch.nn.Parameter(torch.zeros(4, 4, device="cuda:1")))]
        try:
            zmuon.Muon(pair)
            failed.append("two GPUs accepted")
        except zmuon.InvalidArgument as err:
            if "'w0' on cuda:0" not in str(err) or "'w1' on cuda:1" not in str(err):
                failed.append("two GPUs message")
    else:
        print("one GPU: the cuda:1 check needs two")

    bf16 = model(torch.bfloat16)
    low = train(bf16, [zmuon.Muon(bf16.named_parameters(), **h)])
    e = worst(low, ours)
    print(f"bf16 parameters, fp32 masters, 10 steps vs fp32: {e:.2e} (tolerance {BF16_TOL:g})")
    if not all(p.dtype == torch.bfloat16 for p in bf16.parameters()) or e > BF16_TOL:
        failed.append("bf16")

    written = model()
    with_write = train(written, [zmuon.Muon(written.named_parameters(), **h)], write_at=5)
    ref = model()
    ref_opts = t.torch_pair(ref)
    e = worst(with_write, train(ref, ref_opts, write_at=5))
    print(f"p.data.copy_() before step 5 vs torch's optimizers: {e:.2e} "
          f"(tolerance {PARITY_TOL:g})")
    if e > PARITY_TOL:
        failed.append("write")

    mixed = [("cpu_w", torch.nn.Parameter(torch.zeros(4, 4))),
             ("gpu_w", torch.nn.Parameter(torch.zeros(4, 4, device="cuda")))]
    try:
        zmuon.Muon(mixed)
        failed.append("mixed devices accepted")
    except zmuon.InvalidArgument as err:
        print(f"mixed devices: {err}")
        if "'cpu_w' on cpu" not in str(err) or "'gpu_w' on cuda:0" not in str(err):
            failed.append("mixed devices message")
    print("gpu_torch_device:", "FAILED " + ", ".join(failed) if failed else "ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
