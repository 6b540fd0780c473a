#!/usr/bin/env python3
"""Where a PyTorch training step's time goes with zmuon.Muon and with torch.optim.Muon + AdamW:
the model of examples/torch_train.py (by default GPT-2-sized: 12 layers of 768), the same
batches, medians over the steps after a warm-up. zmuon.Muon's step is timed in its parts:
accumulate() (the gradients' hand-over), the engine's step(), and the write-back of the new
parameters (_write_back: the synchronize and gather_params), and the check for writes made to
the parameters outside zmuon (_reload_written before the step, the marks taken after the
write-back: version counters and a content sum per parameter); each part between
torch.cuda.synchronize() calls, so the parts add up to more than the step alone.
`--write-check off` runs without that check, for the step time before and after it.

    PYTHONPATH=python ZMUON_LIBRARY=build/src/embed/libzmuon.so python3 bench/torch_optim_step.py

On the GPU machine: `DEVICES=cuda BENCH=bench/torch_optim_step.py bash
examples/torch_train_gpu.sh` (the carried libzmuon; see that script).
"""

import argparse
import copy
import os
import sys
import time

import torch

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, "..", "examples"))
import torch_train as tt  # noqa: E402  (sets up zmuon's import path and library)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    tt.add_model_args(ap, d_model=768, heads=12, layers=12, seq=128, batch=8)  # GPT-2-sized
    ap.add_argument("--zmuon-comm", default=None, help="caf | nccl (default: the engine's)")
    ap.add_argument("--zmuon-backend", default=None, help="host | cuda (default: the device's)")
    ap.add_argument("--write-check", choices=("on", "off"), default="on",
                    help="off: zmuon.Muon without the check for writes outside it")
    args = ap.parse_args()
    # What examples/torch_train.py's optimizers read from its arguments.
    args.muon_lr, args.adam_lr, args.momentum, args.weight_decay = 0.02, 3e-3, 0.95, 0.01
    if args.zmuon_backend is None:
        args.zmuon_backend = "cuda" if args.device.startswith("cuda") else "host"
    args.zmuon_staging = "auto"
    device = args.device
    sync = (lambda: torch.cuda.synchronize()) if device.startswith("cuda") else (lambda: None)

    torch.manual_seed(0)
    base = tt.TinyLM(args.vocab, args.d_model, args.heads, args.layers, args.seq).to(device)
    batches = [tt.synthetic_batch(args, s, device) for s in range(args.steps)]
    n_params = sum(p.numel() for p in base.parameters())

    model_z, model_t = copy.deepcopy(base), copy.deepcopy(base)
    z = tt.ZmuonStep(model_z, args)
    t = tt.TorchStep(model_t, args, z.muon_names)
    opt = z.opt

    # zmuon.Muon.step() in its parts: the engine's step and the write-back, each timed.
    parts = {"accumulate": [], "engine step": [], "write-back": [], "write check": [],
             "marks": []}

    def timed(name, fn):
        def run(*a, **k):
            sync()
            t0 = time.perf_counter()
            out = fn(*a, **k)
            sync()
            parts[name].append(time.perf_counter() - t0)
            return out
        return run

    opt._engine.step = timed("engine step", opt._engine.step)
    opt._write_back = timed("write-back", opt._write_back)
    if args.write_check == "off":
        opt._reload_written = lambda: []
        opt._mark_in_step = lambda bindings=None: None
    else:
        opt._reload_written = timed("write check", opt._reload_written)
        opt._mark_in_step = timed("marks", opt._mark_in_step)

    def train(model, step_fn):
        fwd_bwd, optim = [], []
        for batch in batches:
            sync()
            t0 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            tt.loss_of(model, batch).backward()
            sync()
            t1 = time.perf_counter()
            step_fn()
            sync()
            fwd_bwd.append(t1 - t0)
            optim.append(time.perf_counter() - t1)
        return fwd_bwd, optim

    def zmuon_step():
        timed("accumulate", opt.accumulate)()
        opt.step()

    fb_z, opt_z = train(model_z, zmuon_step)
    fb_t, opt_t = train(model_t, t.step)
    w = args.warmup
    ms = lambda xs: 1e3 * median(xs[w:]) if xs[w:] else 0.0  # noqa: E731  (a part never run: 0)
    print(f"# torch {torch.__version__}, zmuon {tt.zmuon.version()}, device {device}, "
          f"{n_params} parameters ({len(z.muon_names)} Muon matrices), comm "
          f"{args.zmuon_comm or 'default'}, write check {args.write_check}; medians of steps "
          f"{w + 1}..{args.steps}, ms")
    print(f"forward + backward: zmuon run {ms(fb_z):.2f}, torch run {ms(fb_t):.2f}")
    print(f"optimizer step: zmuon.Muon {ms(opt_z):.2f} (accumulate {ms(parts['accumulate']):.2f}, "
          f"engine step {ms(parts['engine step']):.2f}, write-back {ms(parts['write-back']):.2f}"
          + (f", write check {ms(parts['write check']):.2f}, marks {ms(parts['marks']):.2f}"
             if args.write_check == "on" else "") + f"); torch.optim.Muon + AdamW {ms(opt_t):.2f}")
    opt.close()


if __name__ == "__main__":
    main()
