"""On a GPU machine with PyTorch: zmuon.Muon as the one process of a one-process job (nodes=1,
the torchrun shape) against the plain zmuon.Muon, on the same model, data and steps. Both run
the nccl comm at world 1; the node's write-back goes over NCCL on PyTorch's stream
(gather_over_nccl), the plain one's through the store's buffers. The parameters must be equal
bit for bit; exit status 1 otherwise.

    DEVICES=cuda BENCH=tests/python/gpu_node_check.py bash examples/torch_train_gpu.sh
"""

import argparse
import sys

import torch

import zmuon


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--zmuon-backend", default="cuda")
    args, _ = parser.parse_known_args()
    cfg = {"zmuon": {"backend": args.zmuon_backend}}
    results = []
    for node in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 64)).to(args.device)
        extra = {"nodes": 1, "node_rank": 0, "master": "127.0.0.1:0"} if node else {}
        opt = zmuon.Muon(model.named_parameters(), cfg, **extra)
        gen = torch.Generator(device=args.device).manual_seed(1)
        for _ in range(args.steps):
            x = torch.randn(32, 64, device=args.device, generator=gen)
            loss = (model(x) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        results.append([p.detach().cpu().clone() for p in model.parameters()])
        print(f"{'node (nodes=1)' if node else 'plain'}: loss after {args.steps} steps "
              f"{loss.item():.6f}")
        opt.close()
    same = all(torch.equal(a, b) for a, b in zip(*results))
    print("node vs plain parameters: " + ("bit-identical" if same else "DIFFERENT"))
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
