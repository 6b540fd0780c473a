#!/usr/bin/env python3
"""zmuon.Muon with a model sharded by FSDP2 (fully_shard), under torchrun: parameters and
gradients are DTensor shards (Shard(0)), and zmuon takes them as its own partition, in place.
Each process hands over its local gradient shard (FSDP2 reduce-scattered it), keeps the
optimizer state of that shard only, gathers each Muon matrix's rows to its owner for
Newton-Schulz, and writes the new rows into its local shard: no process holds a whole parameter
outside the owner's Newton-Schulz, and FSDP2 all-gathers the new weights at the next forward.

    PYTHONPATH=python ZMUON_LIBRARY=build/src/embed/libzmuon.so \\
        torchrun --nproc-per-node 2 examples/fsdp2_train.py --steps 30

--mixed-precision shards with MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32):
the forward and backward run in bf16, the sharded fp32 parameters and gradients zmuon sees stay
fp32. --checkpoint DIR saves model and optimizer with torch.distributed.checkpoint at the end
(get_state_dict), --resume DIR loads such a checkpoint first (at any process count).
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train import TinyLM, add_model_args, loss_of, synthetic_batch, zmuon  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (nccl)")
    ap.add_argument("--mixed-precision", action="store_true")
    ap.add_argument("--checkpoint", default="")
    ap.add_argument("--resume", default="")
    add_model_args(ap)  # --batch: the job's batch, split over the processes
    args = ap.parse_args()
    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    model = TinyLM(args.vocab, args.d_model, args.heads, args.layers, args.seq).to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if args.mixed_precision else MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    opt = zmuon.Muon(model.named_parameters(), lr=0.02, adam_lr=3e-3, weight_decay=0.01,
                     overrides=["zmuon.backend=cuda"] if cuda else [])
    if args.resume:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=args.resume)
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    share = args.batch // world
    for step in range(1, args.steps + 1):
        x, y = synthetic_batch(args, step, device)
        loss = loss_of(model, (x[rank * share:(rank + 1) * share],
                               y[rank * share:(rank + 1) * share]))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 10 == 0 or step == 1:
            total = loss.detach().float().clone()
            dist.all_reduce(total)  # the job's loss: the mean of the processes'
            if rank == 0:
                print(f"step {step:4d}  loss {total.item() / world:.4f}  grad_norm "
                      f"{opt.last_step['grad_norm']:.4f}", flush=True)
    if args.checkpoint:
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=args.checkpoint)
    opt.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
