#!/usr/bin/env python3
"""zmuon.Muon with a model wrapped in DistributedDataParallel, under torchrun: DDP averages the
gradients over the processes, and zmuon takes each process's shard of that average (no second
reduce), keeps only that shard of the fp32 master, momentum and Adam moments, runs each Muon
matrix's Newton-Schulz on its owner, and writes the new weights into every process's model.

    PYTHONPATH=python ZMUON_LIBRARY=build/src/embed/libzmuon.so \\
        torchrun --nproc-per-node 2 examples/ddp_train.py --steps 30

The five lines that change from a torch.optim script: the model wrapped in DDP as usual, and
`zmuon.Muon(model, ...)` in place of the optimizer; zmuon joins the job of torch.distributed's
default group by itself (docs/PYTORCH.md, "torch.distributed: DDP and FSDP2"). --device cuda
runs process r on cuda:LOCAL_RANK with the nccl backend and zmuon's cuda backend.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train import TinyLM, add_model_args, loss_of, synthetic_batch, zmuon  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (nccl)")
    add_model_args(ap)  # --batch: the job's batch, split over the processes
    args = ap.parse_args()
    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)  # the same initial weights in every process
    model = TinyLM(args.vocab, args.d_model, args.heads, args.layers, args.seq).to(device)
    model = torch.nn.parallel.DistributedDataParallel(model)
    opt = zmuon.Muon(model, lr=0.02, adam_lr=3e-3, weight_decay=0.01,
                     overrides=["zmuon.backend=cuda"] if cuda else [])
    share = args.batch // world
    for step in range(1, args.steps + 1):
        x, y = synthetic_batch(args, step, device)
        loss = loss_of(model, (x[rank * share:(rank + 1) * share],
                               y[rank * share:(rank + 1) * share]))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 10 == 0 or step == 1:
            total = loss.detach().clone()
            dist.all_reduce(total)  # the job's loss: the mean of the processes'
            if rank == 0:
                print(f"step {step:4d}  loss {total.item() / world:.4f}  grad_norm "
                      f"{opt.last_step['grad_norm']:.4f}", flush=True)
    opt.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
