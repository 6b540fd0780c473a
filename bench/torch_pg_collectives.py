#!/usr/bin/env python3
"""Bytes/s of torch.distributed's collectives that zmuon's Muon phase and reduce would run on
if its comm wrapped torch's process group instead of its own: all_to_all_single (the gather and
the scatter of Muon's matrices) and reduce_scatter_tensor (the gradient's reduce), between
processes on this machine, with bench/comm/bench_caf_comm's conventions (nccl-tests'):
size = bytes of each rank's input; algbw = size / time; busbw = algbw * (n-1)/n, which is also
what each rank sends per second. The two benches side by side choose zmuon's transport
(docs/PERFORMANCE.md, "Transport under torch.distributed").

    .venv/bin/python bench/torch_pg_collectives.py [--world 2] [--backend gloo]
        [--sizes-mb 1,16,64] [--reps 5]

It starts --world processes itself (torch.multiprocessing) on a free loopback port. gloo has no
reduce_scatter_tensor on the CPU in every release; where it lacks it the row says so.
"""

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def timed(fn, reps):
    fn()  # warm-up (connections, buffers)
    dist.barrier()
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]  # the median, as bench_caf_comm


def run(rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(args.backend, rank=rank, world_size=args.world)
    n = args.world
    rows = []
    for mb in args.sizes_mb:
        elements = int(mb * 2**20 / 4) // n * n
        size = elements * 4
        x = torch.randn(elements)
        y = torch.empty_like(x)
        t = timed(lambda: dist.all_to_all_single(y, x), args.reps)
        rows.append(("all_to_all fp32", size, t))
        xb, yb = x.bfloat16(), torch.empty(elements, dtype=torch.bfloat16)
        try:
            t = timed(lambda: dist.all_to_all_single(yb, xb), args.reps)
            rows.append(("all_to_all bf16", size, t))
        except RuntimeError as e:
            rows.append(("all_to_all bf16", size, str(e).splitlines()[0]))
        out = torch.empty(elements // n)
        try:
            t = timed(lambda: dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.AVG
                                                         if args.backend == "nccl"
                                                         else dist.ReduceOp.SUM), args.reps)
            rows.append(("reduce_scatter", size, t))
        except RuntimeError as e:
            rows.append(("reduce_scatter", size, str(e).splitlines()[0]))
    if rank == 0:
        print(f"# torch.distributed {args.backend}, {n} processes, median of {args.reps}")
        print(f"{'collective':18s} {'size':>10s} {'time ms':>10s} {'algbw MB/s':>11s} "
              f"{'busbw MB/s':>11s}")
        for name, size, t in rows:
            if isinstance(t, str):
                print(f"{name:18s} {size / 2**20:8.0f}MB  unsupported: {t}")
                continue
            moved = size / 2 if "bf16" in name else size
            alg = moved / t / 1e6
            print(f"{name:18s} {size / 2**20:8.0f}MB {t * 1e3:10.2f} {alg:11.0f} "
                  f"{alg * (n - 1) / n:11.0f}")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--sizes-mb", default="1,16,64",
                    type=lambda s: [float(v) for v in s.split(",")])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run, args=(args, port), nprocs=args.world, start_method="spawn")


if __name__ == "__main__":
    main()
