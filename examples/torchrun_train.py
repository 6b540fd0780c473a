#!/usr/bin/env python3
"""zmuon.Muon in a job of one process per GPU, as torchrun starts them: every process trains the
TinyLM of torch_train.py on its own share of each step's batch, and zmuon reduce-scatters the
gradients across the processes (no DDP, no torch.distributed) and writes the same new weights
into every process's model.

    PYTHONPATH=python ZMUON_LIBRARY=build/src/embed/libzmuon.so \\
        torchrun --nproc_per_node 2 examples/torchrun_train.py --steps 30 --check

torchrun's WORLD_SIZE, RANK and MASTER_ADDR say which process this is and where node 0's
rendezvous listens (MASTER_PORT + 1: torch's own store keeps MASTER_PORT). --device cuda puts
process r on cuda:LOCAL_RANK with zmuon's cuda backend; the comm is then nccl when every process
has a GPU of its own (with fewer GPUs than processes they share them, and the comm is caf). --check: process 0 then runs the same job in one process with WORLD_SIZE
ranks (each rank's share handed over with accumulate(rank=r)) and compares the parameters.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train import TinyLM, add_model_args, loss_of, synthetic_batch, zmuon  # noqa: E402


def config(args):
    return {"optimizer": {"type": "Muon", "params": {"muon_lr": args.muon_lr,
                                                     "adam_lr": args.adam_lr}},
            "zmuon": {"backend": "cuda" if args.device == "cuda" else "host"}}


def share(batch, rank, world):
    """Rows [rank * b / world, (rank + 1) * b / world) of every tensor of the batch."""
    rows = batch[0].shape[0] // world
    return tuple(t[rank * rows:(rank + 1) * rows] for t in batch)


def train(args, rank, world, device, **job):
    """Trains a fresh model; `job`: nodes/node_rank/master (this process is `rank`), or ranks
    (one process hands over every rank's share). Returns the model and the last losses."""
    torch.manual_seed(args.seed)
    model = TinyLM(args.vocab, args.d_model, args.heads, args.layers, args.seq).to(device)
    opt = zmuon.Muon(model.named_parameters(), config(args), **job)
    mine = [rank] if "nodes" in job else list(range(world))
    for step in range(1, args.steps + 1):
        batch = synthetic_batch(args, step, device)
        for r in mine:
            loss = loss_of(model, share(batch, r, world))
            loss.backward()
            opt.accumulate(rank=r)
            opt.zero_grad()
        opt.step()
        if "nodes" in job and (step % 10 == 0 or step == 1):
            job_loss = opt.sum_over_processes([loss.item()])[0] / world  # every process calls it
            if rank == 0:
                print(f"step {step:4d}  loss {job_loss:.6f}", flush=True)
    opt.close()
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (cuda:LOCAL_RANK)")
    add_model_args(ap)  # --batch: the job's batch, split over the processes
    ap.add_argument("--muon-lr", type=float, default=0.02)
    ap.add_argument("--adam-lr", type=float, default=3e-3)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    master = f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:" \
             f"{int(os.environ.get('MASTER_PORT', '29500')) + 1}"
    if args.batch % world:
        sys.exit(f"--batch {args.batch} does not split over {world} processes")
    device = "cpu"
    if args.device == "cuda":
        # cuda:LOCAL_RANK; with fewer GPUs than processes they share them (comm auto: caf).
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    if rank == 0:
        print(f"# {world} processes, batch {args.batch} ({args.batch // world} each), "
              f"device {args.device}, rendezvous {master}", flush=True)
    model = train(args, rank, world, device, nodes=world, node_rank=rank, master=master)
    if not args.check or rank != 0:
        return
    reference = train(args, rank, world, device, ranks=world)
    worst = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
                for a, b in zip(model.parameters(), reference.parameters()))
    print(f"# {world} processes vs {world} ranks in one process: largest relative parameter "
          f"difference {worst:.3g}", flush=True)
    sys.exit(0 if worst <= 1e-6 else 1)


if __name__ == "__main__":
    main()
