#!/usr/bin/env python3
"""Where zmuon.Muon.step()'s host time goes, on Python's clock (CLOCK_MONOTONIC, the clock of the
engine's call timeline and of its message trace): step()'s parts without a synchronize inside
(Python before the hand-over's C call, that call, Python between, the engine's step() call,
Python after, then the synchronize), medians over the timed steps; one more step with the call
timeline, placed on that clock (the hand-over's host span starts as its Python wrapper is
entered); with --trace, one more with the message trace on: every record of that step in time
order, from the moment step() was called, so that each hop between the host, the actors and the
device shows. The model is examples/torch_train.py's TinyLM (default GPT-2-sized: 12 layers of
768, vocab 50304), every .grad random.

    PYTHONPATH=python python3 bench/torch_step_latency.py --device cuda --trace
    PYTHONPATH=python ZMUON_LIBRARY=build/src/embed/libzmuon.so \\
        python3 bench/torch_step_latency.py --device cpu --d-model 16 --heads 2 --layers 18

With --idle-ms N, the host is busy N ms in Python before each timed step while the engine has
nothing to do, as through a training loop's forward and backward (the engine's threads asleep,
the host's caches holding other work).

With --after-backward, each timed step follows a forward and backward of the model on one batch
(new .grad tensors, as in a training loop, and the host's caches left holding the backward's
work): the step's host path as a training loop meets it, and as bench/peers_step.py times it.

With --fsdp, the same model under FSDP2 `fully_shard` (each block, then the root) in a process
group of one (gloo on the CPU, nccl on CUDA): the hand-over then takes DTensor gradients.
"""

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time

import torch

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, "..", "examples"))
import torch_train as tt  # noqa: E402  (sets up zmuon's import path and library)


def make_optimizer(model, args, trace_dir=None):
    config = tt.zmuon_config(args, "cuda" if args.device == "cuda" else "host")
    if trace_dir:
        config["zmuon"]["trace"] = trace_dir
    return tt.zmuon.Muon(model.named_parameters(), config)


def one_step(opt, sync, clock=time.perf_counter):
    """One optimizer step after a synchronize: the clock before it, when step() returned, and
    after the synchronize that follows."""
    sync()
    t0 = clock()
    opt.step()
    t1 = clock()
    sync()
    return t0, t1, clock()


def timed_parts(opt, sync, steps, new_grads=None, idle=None):
    """step()'s parts, from marks taken by wrapping the engine's calls: whichever of the three
    hand-over calls the step makes (on the device, hand_over), and step."""
    eng, marks = opt._engine, {}

    def wrap(name, mark):
        call = getattr(eng, name)

        def marked(*a, **k):
            marks[mark + ">"] = time.perf_counter()
            out = call(*a, **k)
            marks[mark + "<"] = time.perf_counter()
            return out
        setattr(eng, name, marked)
    for name in ("hand_over", "hand_over_reduced", "reduce"):
        wrap(name, "hand_over")
    wrap("step", "step")
    rows, ahead = [], 0
    for _ in range(steps):
        if new_grads:
            new_grads()
        if idle:
            idle()
        marks.clear()  # a hand-over ahead of the step (as the backward ended) is not step()'s
        t0, t1, t2 = one_step(opt, sync)
        if "hand_over>" not in marks:  # step() found its gradients handed over
            ahead += 1
            marks["hand_over>"] = marks["hand_over<"] = marks["step>"]
        rows.append((marks["hand_over>"] - t0, marks["hand_over<"] - marks["hand_over>"],
                     marks["step>"] - marks["hand_over<"], marks["step<"] - marks["step>"],
                     t1 - marks["step<"], t2 - t1, t2 - t0))
    if ahead:
        print(f"{ahead} of {steps} steps found their gradients handed over as the backward "
              "ended (opt.hand_over_ahead): Python before the engine's step() is the first row")
    names = ["Python before the hand-over", "the hand-over's call", "Python between",
             "the engine's step()", "Python after", "the synchronize", "the whole step"]
    for i, name in enumerate(names):
        print(f"{name:<30} median {1e6 * statistics.median(r[i] for r in rows):8.1f} us")
    return marks


def busy(ms):
    """The host busy for `ms` ms in Python while the engine has nothing to do, as in a training
    loop's forward and backward: its threads go to sleep as they would there."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def timeline_step(opt, sync, marks, idle=None):
    if idle:
        idle()
    opt.time_calls(True)  # after the backward: a hand-over made as it ended is not step()'s
    marks.clear()
    t0, _, t2 = one_step(opt, sync)
    path = os.path.join(tempfile.mkdtemp(), "calls.json")
    opt.write_call_timeline(path)
    opt.time_calls(False)
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    zero = min(e["ts"] for e in events)
    end = max(e["ts"] + e["dur"] for e in events) - zero
    entered = marks.get("hand_over>", marks["step>"])
    print(f"\none step with its call timeline: wall {1e6 * (t2 - t0):.1f} us = Python before the "
          f"hand-over {1e6 * (entered - t0):.1f} + the timeline's span {end:.1f} + after its "
          f"last call {1e6 * (t2 - entered) - end:.1f}")
    for e in sorted(events, key=lambda e: e["ts"]):
        where = "host" if e.get("tid") == -1 else f"track {e.get('tid')}"
        print(f"  {e['ts'] - zero:9.1f} +{e['dur']:8.1f} us  {where:<8} {e['name']}")


def traced_step(model, args, sync, idle=None):
    """A fresh optimizer with the message trace on; the records of its last step."""
    trace_dir = tempfile.mkdtemp()
    opt = make_optimizer(model, args, trace_dir)
    for _ in range(args.warmup):
        opt.step()
    if idle:
        idle()
    t0, t1, t2 = one_step(opt, sync, time.monotonic_ns)  # the trace's clock, in ns
    opt.close()
    records = []
    for path in glob.glob(os.path.join(trace_dir, "*.jsonl")):
        with open(path) as f:
            records += [r for r in map(json.loads, f) if t0 <= r.get("t", 0) <= t2]
    print(f"\none traced step: step() returned at {(t1 - t0) / 1e3:.1f} us, the synchronize at "
          f"{(t2 - t0) / 1e3:.1f} us; its records (us from step()'s call; +: how long)")
    for r in sorted(records, key=lambda r: r["t"]):
        dur = f"+{r['dur'] / 1e3:.1f}" if "dur" in r else ""
        what = r.get("type") or r.get("phase") or ""
        extra = " ".join(f"{k}={r[k]}" for k in ("index", "op", "track") if k in r)
        print(f"  {(r['t'] - t0) / 1e3:9.1f} {dur:>9}  {r.get('ev', ''):<5} "
              f"{r.get('actor', ''):<17} {what:<20} {extra}")


def sharded(args):
    """The model under FSDP2 as bench/torch_fsdp2_step.py shards it, at world 1: a process
    group of this process alone."""
    import torch.distributed as dist
    import torch_fsdp2_step
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=0, world_size=1)
    return torch_fsdp2_step.sharded_model(args, args.device)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--trace", action="store_true", help="also one step's message trace")
    ap.add_argument("--fsdp", action="store_true",
                    help="the model under FSDP2 fully_shard in a process group of one")
    ap.add_argument("--fresh-grads", action="store_true",
                    help="new .grad tensors before each timed step, as a training loop's "
                         "zero_grad() and backward give (else the same ones every step)")
    ap.add_argument("--idle-ms", type=float, default=0,
                    help="before each timed step, the host busy this long in Python while the "
                         "engine idles, as through a forward and backward")
    ap.add_argument("--hand-over-ahead", choices=("auto", "on", "off"), default="auto",
                    help="opt.hand_over_ahead: the gradients handed over as each backward ends "
                         "(auto: zmuon's default, off)")
    ap.add_argument("--after-backward", action="store_true",
                    help="before each timed step, a forward and backward of the model on one "
                         "batch (new .grad tensors; the host's caches hold the backward's work)")
    tt.add_model_args(ap, d_model=768, heads=12, layers=12, seq=64, batch=4)
    ap.set_defaults(vocab=50304)
    args = ap.parse_args()
    args.muon_lr, args.adam_lr, args.momentum, args.weight_decay = 0.02, 3e-3, 0.95, 0.01
    args.zmuon_comm = None
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    torch.manual_seed(0)
    if args.fsdp:
        model = sharded(args)
    else:
        model = tt.TinyLM(args.vocab, args.d_model, args.heads, args.layers,
                          args.seq).to(args.device)
    def new_grads():
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
    new_grads()
    opt = make_optimizer(model, args)
    if args.hand_over_ahead != "auto":
        opt.hand_over_ahead(args.hand_over_ahead == "on")
    print(f"{sum(1 for _ in model.parameters())} tensors, "
          f"{sum(p.numel() for p in model.parameters())} elements, on {args.device}")
    for _ in range(args.warmup):
        opt.step()
    idle = (lambda: busy(args.idle_ms)) if args.idle_ms else None
    if args.after_backward:
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq), device=args.device)

        def idle():
            model.zero_grad(set_to_none=True)
            model(tokens).float().logsumexp(-1).mean().backward()
    marks = timed_parts(opt, sync, args.steps, new_grads if args.fresh_grads else None, idle)
    timeline_step(opt, sync, marks, idle)
    opt.close()
    if args.trace:
        traced_step(model, args, sync, idle)


if __name__ == "__main__":
    main()
