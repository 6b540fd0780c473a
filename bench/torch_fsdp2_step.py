#!/usr/bin/env python3
"""A training step under FSDP2 (fully_shard per block and at the root) with zmuon.Muon and with
torch.optim.Muon + AdamW on the same sharded model: the model of examples/torch_train.py (by
default GPT-2-sized: 12 layers of 768), the same batches, medians over the steps after a
warm-up, of the whole step (forward, backward, optimizer) and of the optimizer's step alone
(between synchronizations). Both start from the same weights; the last losses are printed as a
sanity check (the two differ by torch's bf16 Newton-Schulz against zmuon's).

    torchrun --nproc-per-node 1 bench/torch_fsdp2_step.py --device cuda    # nccl, one GPU
    torchrun --nproc-per-node 2 bench/torch_fsdp2_step.py --device cpu \\
        --d-model 64 --heads 4 --layers 2 --seq 32 --batch 8 --steps 6     # gloo, a smoke run

With --tp N, zmuon.Muon on the model placed by tensor parallelism over N processes (each MLP's
fc ColwiseParallel, proj RowwiseParallel) and FSDP2 over the other world / N, beside zmuon.Muon
under plain FSDP2 (torch's optimizers are left out).

With PYTHONPATH=python and ZMUON_LIBRARY=build/src/embed/libzmuon.so (the cuda backend's build
for --device cuda: examples/torch_train_gpu.sh carries one to the GPU machine).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, "..", "examples"))
import torch_train as tt  # noqa: E402  (sets up zmuon's import path and library)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def sharded_model(args, device, tp=0):
    """The model under FSDP2, or (tp > 0) tensor parallel over "tp" then FSDP2 over "dp"; and
    this process's data share (index, count)."""
    torch.manual_seed(args.seed)
    model = tt.TinyLM(args.vocab, args.d_model, args.heads, args.layers, args.seq).to(device)
    rank, world = dist.get_rank(), dist.get_world_size()
    if not tp:
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model, (rank, world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    mesh = init_device_mesh(device.split(":")[0], (world // tp, tp), mesh_dim_names=("dp", "tp"))
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], {"fc": ColwiseParallel(),
                                               "proj": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model, (mesh["dp"].get_local_rank(), mesh["dp"].size())


def run(name, model, opt, args, device, share_of):
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    rank, world = share_of
    share = args.batch // world
    whole, opt_only, loss = [], [], None
    for step in range(args.warmup + args.steps):
        x, y = tt.synthetic_batch(args, step, device)
        sync()
        t0 = time.perf_counter()
        loss = tt.loss_of(model, (x[rank * share:(rank + 1) * share],
                                  y[rank * share:(rank + 1) * share]))
        loss.backward()
        sync()
        t1 = time.perf_counter()
        for o in opt:
            o.step()
        for o in opt:
            o.zero_grad()
        sync()
        t2 = time.perf_counter()
        if step >= args.warmup:
            whole.append(t2 - t0)
            opt_only.append(t2 - t1)
    if dist.get_rank() == 0:
        print(f"{name:28s} step {median(whole) * 1e3:9.2f} ms   optimizer {median(opt_only) * 1e3:9.2f}"
              f" ms   last loss {loss.item():.4f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--tp", type=int, default=0,
                    help="tensor parallel over this many processes, FSDP2 over the rest")
    tt.add_model_args(ap, d_model=768, heads=12, layers=12, seq=128, batch=8)  # GPT-2-sized
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    hyper = dict(lr=0.02, adam_lr=3e-3, weight_decay=0.01)
    if rank == 0:
        n = sum(p.numel() for p in sharded_model(args, device)[0].parameters())
        print(f"# FSDP2, {world} process(es), {args.device}, {n / 1e6:.1f}M parameters, batch "
              f"{args.batch} x {args.seq}; medians of {args.steps} steps after {args.warmup}")

    overrides = ["zmuon.backend=cuda"] if cuda else []
    for tp in ([0, args.tp] if args.tp else [0]):
        model, share = sharded_model(args, device, tp)
        opt = tt.zmuon.Muon(model.named_parameters(), overrides=overrides, **hyper)
        name = f"zmuon.Muon, TP {tp} x FSDP2 {world // tp}" if tp else "zmuon.Muon"
        run(name + (" (moved)" if opt._mesh is not None else ""), model, [opt], args, device,
            share)
        opt.close()
    if args.tp:
        dist.destroy_process_group()
        return

    model, share = sharded_model(args, device)
    named = list(model.named_parameters())
    hidden = [p for n, p in named if p.ndim == 2 and "embed" not in n and "lm_head" not in n]
    rest = [p for n, p in named if not (p.ndim == 2 and "embed" not in n and "lm_head" not in n)]
    torch_opts = [torch.optim.Muon(hidden, lr=hyper["lr"], weight_decay=hyper["weight_decay"],
                                   adjust_lr_fn="original"),
                  torch.optim.AdamW(rest, lr=hyper["adam_lr"], betas=(0.9, 0.95), eps=1e-10,
                                    weight_decay=hyper["weight_decay"])]
    run("torch.optim.Muon + AdamW", model, torch_opts, args, device, share)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
