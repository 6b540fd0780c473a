#!/usr/bin/env python3
"""The optimizer step of zmuon.Muon beside the peers a user would pick instead, in one process on
one GPU: torch.optim.Muon + AdamW, and Dion's Muon (eager, Triton NS, Triton NS under Dion's
CudaGraphOptimizer). The same model, batch and seed for every optimizer. For each it prints the
optimizer step alone (host wall time between two synchronizes), the whole training step, both as
medians of the timed steps, the loss after the last step, and the GPU memory in use at the end of
the run (cudaMemGetInfo, so zmuon's own allocations count too) beside torch's allocator peak.

    PYTHONPATH=python ZMUON_LIBRARY=<libzmuon.so with CUDA> \\
        python3 bench/peers_step.py --model gpt2 --dion <checkout of microsoft/dion>
    ... --model gpt2 --fsdp      # every model fully_shard-ed per block, a process group of one
    ... --model llama1b          # d 2048, 16 layers, GQA 16/4, ff 8192, vocab 32000 (836M)
    ... --profile DIR            # also where each optimizer's step goes (see profile_steps)
    ... --curve 300 --only torch,zmuon-auto   # the loss over 300 steps instead of the timings:
                                 # a fresh batch each step from a fixed Markov chain of tokens

Dion is never vendored: `fetch github:microsoft/dion` brings a snapshot, carried to the GPU
machine beside the tree (bench/dev/peers.sh). Without --dion, its rows are left out.
"""

import argparse
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
import zmuon  # noqa: E402

MODELS = {  # vocab, d, layers, heads, kv heads, ff, seq, batch
    "gpt2": dict(vocab=50304, d=768, layers=12, heads=12, kv_heads=12, ff=3072, seq=1024, batch=8),
    "llama1b": dict(vocab=32000, d=2048, layers=16, heads=16, kv_heads=4, ff=8192, seq=1024,
                    batch=4),
    # GPT-2's 87 tensors at d 64: the GPU work is microseconds, the step its host path
    "gpt2-tiny": dict(vocab=512, d=64, layers=12, heads=4, kv_heads=4, ff=256, seq=128, batch=8),
}
ZMUON_SET = []  # --zmuon-set: more config overrides for zmuon's rows
HYPER = dict(lr=0.02, adam_lr=3e-3, momentum=0.95, weight_decay=0.01, betas=(0.9, 0.95))


class Block(nn.Module):
    def __init__(self, d, heads, kv_heads, ff):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * kv_heads * self.head_dim, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.kv_heads != self.heads)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class LM(nn.Module):
    def __init__(self, vocab, d, layers, heads, kv_heads, ff):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, kv_heads, ff) for _ in range(layers))
        self.norm = nn.RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def is_hidden_matrix(name, p):
    return p.ndim == 2 and "embed" not in name and "lm_head" not in name


def make_model(spec, name, fsdp, device):
    torch.manual_seed(0)
    model = LM(spec["vocab"], spec["d"], spec["layers"], spec["heads"], spec["kv_heads"],
               spec["ff"]).to(device)
    if fsdp:
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    return model


# -- the optimizers, each a function (model, fsdp) -> (optimizer list, zero_grad kwargs) --------

def torch_muon_adamw(model, fsdp):
    named = list(model.named_parameters())
    hidden = [p for n, p in named if is_hidden_matrix(n, p)]
    rest = [p for n, p in named if not is_hidden_matrix(n, p)]
    return [torch.optim.Muon(hidden, lr=HYPER["lr"], momentum=HYPER["momentum"],
                             weight_decay=HYPER["weight_decay"], adjust_lr_fn="original"),
            torch.optim.AdamW(rest, lr=HYPER["adam_lr"], betas=HYPER["betas"], eps=1e-10,
                              weight_decay=HYPER["weight_decay"])], {}


def zmuon_muon(variant, ahead=False):
    def make(model, fsdp):
        overrides = ["zmuon.backend=cuda", f"optimizer.params.ns_variant={variant}"] \
            + ZMUON_SET
        opt = zmuon.Muon(model.named_parameters(), overrides=overrides, lr=HYPER["lr"],
                         adam_lr=HYPER["adam_lr"], weight_decay=HYPER["weight_decay"])
        if ahead:  # the gradients handed over as each backward ends
            opt.hand_over_ahead()
        return [opt], {}
    return make


def dion_muon(use_triton, graph):
    def make(model, fsdp):
        import dion
        named = list(model.named_parameters())
        groups = [dict(params=[p for n, p in named if is_hidden_matrix(n, p)]),
                  dict(params=[p for n, p in named if not is_hidden_matrix(n, p)],
                       algorithm="adamw", lr=HYPER["adam_lr"])]
        mesh = None
        if fsdp:
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh("cuda", (1,))
        opt = dion.Muon(groups, distributed_mesh=mesh, lr=HYPER["lr"], mu=HYPER["momentum"],
                        betas=HYPER["betas"], weight_decay=HYPER["weight_decay"],
                        nesterov=True, use_triton=use_triton)
        if graph:
            from dion.cuda_graph import CudaGraphOptimizer
            return [CudaGraphOptimizer(opt, warmup_steps=3)], {"set_to_none": False}
        return [opt], {}
    return make


OPTIMIZERS = {
    "torch": ("torch.optim.Muon + AdamW", torch_muon_adamw),
    "zmuon-standard": ("zmuon standard", zmuon_muon("standard")),
    "zmuon-auto": ("zmuon auto", zmuon_muon("auto")),
    "zmuon-auto-ahead": ("zmuon auto, hand-over ahead", zmuon_muon("auto", ahead=True)),
    "dion-eager": ("Dion eager", dion_muon(False, False)),
    "dion-triton": ("Dion Triton", dion_muon(True, False)),
    "dion-graph": ("Dion Triton + CudaGraphOptimizer", dion_muon(True, True)),
}


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def profile_steps(key, opts, backward, dir_):
    """Where the step goes: one more optimizer step under torch.profiler (host ops and every
    CUDA kernel of the process, zmuon's own included), three under cProfile (the Python
    functions), each after its own backward(), written to DIR/<key>.{kernels,host,python}.txt
    and DIR/<key>.trace.json (ui.perfetto.dev)."""
    import cProfile
    import io
    import pstats
    from torch.profiler import ProfilerActivity, profile
    os.makedirs(dir_, exist_ok=True)
    backward()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for o in opts:
            o.step()
        torch.cuda.synchronize()
    prof.export_chrome_trace(os.path.join(dir_, f"{key}.trace.json"))
    table = prof.key_averages()
    with open(os.path.join(dir_, f"{key}.kernels.txt"), "w") as f:
        f.write(table.table(sort_by="self_cuda_time_total", row_limit=40, max_name_column_width=90))
    with open(os.path.join(dir_, f"{key}.host.txt"), "w") as f:
        f.write(table.table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=90))
    pr = cProfile.Profile()
    for _ in range(3):
        backward()
        torch.cuda.synchronize()
        pr.enable()
        for o in opts:
            o.step()
        torch.cuda.synchronize()
        pr.disable()
    text = io.StringIO()
    pstats.Stats(pr, stream=text).sort_stats("cumulative").print_stats(45)
    with open(os.path.join(dir_, f"{key}.python.txt"), "w") as f:
        f.write(text.getvalue())


def timeline_step(key, opts, backward, dir_):
    """One more step with zmuon's own call timing on (CUDA events around each backend call, no
    profiler in the process): DIR/<key>.calls.json (`bench/dev/trace_gaps.py` reads it) and the
    step's host wall time beside it. Only zmuon's optimizers time their calls."""
    timed = [o for o in opts if hasattr(o, "time_calls")]
    if not timed:
        return
    os.makedirs(dir_, exist_ok=True)
    backward()
    torch.cuda.synchronize()
    for o in timed:
        o.time_calls(True)
    t0 = time.perf_counter()
    for o in opts:
        o.step()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    path = os.path.join(dir_, f"{key}.calls.json")
    timed[0].write_call_timeline(path)
    for o in timed:
        o.time_calls(False)
    print(f"# {key}: the timed step took {1e3 * wall:.3f} ms of host wall time; its calls: "
          f"{path}", flush=True)


def forward_backward(model, opts, zero_kwargs, x, y):
    """One training step's gradients: zero_grad, the bf16-autocast forward, the loss, backward."""
    for o in opts:
        o.zero_grad(**zero_kwargs)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(x)
    loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
    loss.backward()
    return loss


def close_all(opts):
    """Each optimizer's engine or CUDA graph let go of (zmuon's close(), Dion's release())."""
    for o in opts:
        if hasattr(o, "release"):
            o.release()
        if hasattr(o, "close"):
            o.close()


def run(key, args, spec, batch):
    label, make = OPTIMIZERS[key]
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    free0, _ = torch.cuda.mem_get_info()
    torch.cuda.reset_peak_memory_stats()
    model = make_model(spec, args.model, args.fsdp, "cuda")
    opts, zero_kwargs = make(model, args.fsdp)
    x, y = batch
    whole, opt_only, loss = [], [], None

    def backward():
        return forward_backward(model, opts, zero_kwargs, x, y)

    for step in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = backward()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        for o in opts:
            o.step()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if step >= args.warmup:
            whole.append(t2 - t0)
            opt_only.append(t2 - t1)
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    if args.profile:
        profile_steps(key + ("-fsdp" if args.fsdp else "") + "-" + args.model, opts, backward,
                      args.profile)
    if args.timeline:
        timeline_step(key + ("-fsdp" if args.fsdp else "") + "-" + args.model, opts, backward,
                      args.timeline)
    row = dict(label=label, opt_ms=1e3 * median(opt_only), step_ms=1e3 * median(whole),
               loss=loss.item(), used_gib=(free0 - free1) / 2**30,
               torch_peak_gib=torch.cuda.max_memory_allocated() / 2**30)
    close_all(opts)
    del opts, model
    return row


def markov_batches(spec, seed=7, support=4096, choices=4):
    """Batches of a fixed random Markov chain over the first `support` tokens, each token
    followed by one of `choices` successors at random: learnable, with a loss floor of
    ln(choices) nats. The same batches for every optimizer."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    table = torch.randint(0, support, (support, choices), device="cuda", generator=g)
    while True:
        b, t = spec["batch"], spec["seq"] + 1
        seq = torch.empty(b, t, dtype=torch.int64, device="cuda")
        seq[:, 0] = torch.randint(0, support, (b,), device="cuda", generator=g)
        pick = torch.randint(0, choices, (b, t), device="cuda", generator=g)
        for i in range(1, t):
            seq[:, i] = table[seq[:, i - 1], pick[:, i]]
        yield seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def curve(key, args, spec, every):
    """The loss of optimizer `key` at every `every`-th of args.curve steps, on markov_batches."""
    _, make = OPTIMIZERS[key]
    model = make_model(spec, args.model, args.fsdp, "cuda")
    opts, zero_kwargs = make(model, args.fsdp)
    losses, batches = [], markov_batches(spec)
    for step in range(1, args.curve + 1):
        loss = forward_backward(model, opts, zero_kwargs, *next(batches))
        for o in opts:
            o.step()
        if step % every == 0:
            losses.append(loss.item())
    close_all(opts)
    del opts, model
    torch.cuda.empty_cache()
    return losses


def main_curve(args, keys, spec):
    every = max(1, args.curve // 12)
    print(f"# {args.model}{' FSDP2 world 1' if args.fsdp else ''}: loss at every {every}th of "
          f"{args.curve} steps (markov_batches: floor ln 4 = {math.log(4):.3f}); "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}, zmuon {zmuon.version()}",
          flush=True)
    curves = {}
    for key in keys:
        curves[key] = curve(key, args, spec, every)
        print(f"{OPTIMIZERS[key][0]:34s} " + " ".join(f"{v:.3f}" for v in curves[key]), flush=True)
    first = keys[0]
    for key in keys[1:]:
        gap = max(abs(a - b) for a, b in zip(curves[key], curves[first]))
        print(f"{OPTIMIZERS[key][0]:34s} largest gap to {OPTIMIZERS[first][0]}: {gap:.4f}; at "
              f"the end {curves[key][-1]:.4f} against {curves[first][-1]:.4f}", flush=True)
    if any(math.isnan(v) for c in curves.values() for v in c):
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    ap.add_argument("--fsdp", action="store_true", help="fully_shard, a process group of one")
    ap.add_argument("--dion", help="a checkout of microsoft/dion (its rows are left out without)")
    ap.add_argument("--only", help="comma-separated keys of: " + ",".join(OPTIMIZERS))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=6)
    ap.add_argument("--markdown", help="append the table to this file")
    ap.add_argument("--profile", metavar="DIR", help="also profile each optimizer's step into DIR")
    ap.add_argument("--timeline", metavar="DIR",
                    help="also time one step of zmuon's backend calls into DIR (CUDA events, no "
                         "profiler: its host gaps undistorted)")
    ap.add_argument("--curve", type=int, metavar="N",
                    help="the loss over N steps of fresh batches instead of the timings")
    ap.add_argument("--zmuon-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for zmuon's rows (repeatable), e.g. "
                         "zero_optimization.reduce_bucket_size=200000000")
    args = ap.parse_args()
    ZMUON_SET.extend(args.zmuon_set)
    keys = args.only.split(",") if args.only else list(OPTIMIZERS)
    if args.dion:
        sys.path.insert(0, args.dion)
    else:
        keys = [k for k in keys if not k.startswith("dion")]
    if args.fsdp:
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl", rank=0, world_size=1)
    spec = MODELS[args.model]
    if args.curve:
        main_curve(args, keys, spec)
        return
    torch.manual_seed(1)
    x = torch.randint(0, spec["vocab"], (spec["batch"], spec["seq"]), device="cuda")
    y = torch.roll(x, -1, dims=1)
    n = sum(p.numel() for p in make_model(spec, args.model, False, "meta").parameters())
    title = (f"{args.model}{' FSDP2 world 1' if args.fsdp else ''}: {n / 1e6:.0f}M parameters, "
             f"batch {spec['batch']} x {spec['seq']}, bf16 autocast; {torch.cuda.get_device_name()}, "
             f"torch {torch.__version__}, zmuon {zmuon.version()}; medians of {args.steps} steps "
             f"after {args.warmup}")
    print("# " + title, flush=True)
    rows = []
    for key in keys:
        try:
            rows.append(run(key, args, spec, (x, y)))
            r = rows[-1]
            print(f"{r['label']:34s} optimizer {r['opt_ms']:8.2f} ms  step {r['step_ms']:8.2f} ms  "
                  f"loss {r['loss']:.4f}  GPU in use {r['used_gib']:.2f} GiB  "
                  f"(torch peak {r['torch_peak_gib']:.2f})", flush=True)
        except Exception as e:  # a peer that fails here is named, the others still run
            print(f"{OPTIMIZERS[key][0]:34s} failed: {type(e).__name__}: {e}", flush=True)
    if args.markdown and rows:
        with open(args.markdown, "a") as f:
            f.write(f"\n{title}\n\n| optimizer | step (ms) | whole step (ms) | loss | GPU in use "
                    "(GiB) |\n| --- | ---: | ---: | ---: | ---: |\n")
            for r in rows:
                f.write(f"| {r['label']} | {r['opt_ms']:.2f} | {r['step_ms']:.2f} | "
                        f"{r['loss']:.4f} | {r['used_gib']:.2f} |\n")
    if math.isnan(sum(r["loss"] for r in rows)):
        sys.exit(1)


if __name__ == "__main__":
    main()
