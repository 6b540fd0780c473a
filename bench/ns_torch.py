#!/usr/bin/env python3
"""PyTorch's Newton-Schulz (NS5) on the shapes of bench_ns, and the final comparison table.

Times, on the GPU, with the same method as bench_ns (stream idle, CUDA events around one call,
median of --reps): the published reference NS5 (Keller Jordan's Muon, written out below) in
eager mode and under torch.compile, and one step of torch.optim.Muon (momentum, NS, update) on
parameters of the same shapes (48 parameters for the batch). Then, reading bench_ns's JSON,
prints one table: ms, TFLOP/s counting full-GEMM FLOPs, fraction of the GEMM ceiling, and
zmuon's speed-up over each PyTorch variant, with the issue's targets checked.

    bench/ns_torch.py --zmuon OUT/bench_ns.json [--reps 20] [--out OUT/ns_table.md]

With --step-json (zmuon-bench-step --json outputs), it prints instead the whole-step
table: per table and world/comm, zmuon's step() time, its NS phase from the trace (on CUDA the
time to enqueue NS), zmuon's NS kernel time for the whole table from bench_ns (--zmuon, CUDA
events; optional), PyTorch's NS5 over the same table batched by shape (as Dion runs it, the
strongest PyTorch baseline) and per matrix, timed here in the same run, and the step's actor
plumbing share and Muon-phase bytes against DeepSpeed's ZeRO-3 scheme.

    bench/ns_torch.py --step-json OUT/step_*.json [--zmuon OUT/bench_ns.json] [--out FILE]

With --interleave (needs `import zmuon` to work, on a CUDA build of libzmuon, and a GPU) it times
zmuon.newton_schulz itself in this process instead of reading bench_ns: per shape, bf16 in and
out, in place on a fresh copy of one bf16 input, against eager NS5 on the same input, one timed
call of each per round (CUDA events, the order alternating), after a warm-up; the medians, the
ratio eager / zmuon and the 1.5x verdict. zmuon's time includes the Python call (ctypes) that
launches it.

    PYTHONPATH=python ZMUON_LIBRARY=build/src/embed/libzmuon.so bench/ns_torch.py --interleave \
        [--rounds 10] [--out FILE]
"""

import argparse
import json
import statistics
import sys

import torch

NS5_COEFFICIENTS = (3.4445, -4.7750, 2.0315)

SHAPES = [  # label, batch, rows, cols (as bench_ns)
    ("768x768", 1, 768, 768),
    ("768x3072", 1, 768, 3072),
    ("2048x8192", 1, 2048, 8192),
    ("4096x4096", 1, 4096, 4096),
    ("4096x11008", 1, 4096, 11008),
    ("8192x8192", 1, 8192, 8192),
    ("48x768x768", 48, 768, 768),
]


def ns5_reference(G, steps=5, eps=1e-7):
    """The published NS5 (KellerJordan/Muon zeropower_via_newtonschulz5): bf16 throughout,
    X / (||X|| + eps), transposed to wide when rows > cols, batched over leading dimensions."""
    a, b, c = NS5_COEFFICIENTS
    X = G.bfloat16()
    tall = G.size(-2) > G.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + eps)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if tall:
        X = X.mT
    return X


def ns_flops(batch, rows, cols, steps=5):
    """Full-GEMM FLOPs: A = X X^T, A*A and B*X on the wide [m, n] view, per iteration."""
    m, n = min(rows, cols), max(rows, cols)
    return batch * steps * (2 * m * m * n + 2 * m * m * m + 2 * m * m * n)


def time_once(body, before=lambda: None):
    """One call of `body` on an idle stream, in ms (CUDA events)."""
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    before()
    torch.cuda.synchronize()
    start.record()
    body()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop)


def median_ms(body, reps, before=lambda: None):
    return statistics.median(time_once(body, before) for _ in range(reps))


def time_ns(fn, batch, rows, cols, reps, warmup=3, dtype=torch.float32):
    shape = (batch, rows, cols) if batch > 1 else (rows, cols)
    G = torch.randn(shape, device="cuda", dtype=dtype)
    for _ in range(warmup):
        fn(G)
    return median_ms(lambda: fn(G), reps)


def time_muon_step(batch, rows, cols, reps, warmup=3):
    params = [torch.nn.Parameter(torch.randn(rows, cols, device="cuda")) for _ in range(batch)]
    opt = torch.optim.Muon(params, lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.0,
                           ns_coefficients=NS5_COEFFICIENTS, ns_steps=5)

    def fresh_grads():
        for p in params:
            p.grad = torch.randn_like(p)

    for _ in range(warmup):
        fresh_grads()
        opt.step()
    return median_ms(opt.step, reps, before=fresh_grads)


def torch_gemm_tflops(reps):
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    return 2 * n**3 / (median_ms(lambda: a @ b, reps) * 1e-3) / 1e12


TABLES = {  # as bench_ns: (batch, rows, cols) groups of the Muon matrices
    "gpt2-124m": [(48, 768, 768), (12, 3072, 768), (12, 768, 3072)],
    "llama-1b": [(32, 2048, 2048), (32, 512, 2048), (32, 8192, 2048), (16, 2048, 8192)],
}


def time_table(groups, reps):
    """PyTorch eager NS5 over a table: one call per matrix (as DeepSpeed and the reference
    Muon run it) and one batched call per same-shape group (as Dion does)."""
    xs = [torch.randn(b, r, c, device="cuda") for b, r, c in groups]

    def per_matrix():
        for x in xs:
            for k in range(x.size(0)):
                ns5_reference(x[k])

    def batched():
        for x in xs:
            ns5_reference(x)

    for _ in range(2):
        per_matrix()
        batched()
    reps = max(3, reps // 4)
    return median_ms(per_matrix, reps), median_ms(batched, reps)


def interleave_table(rounds, only=None, warmup=3):
    """zmuon.newton_schulz against eager NS5 on the same bf16 inputs, timed alternately (the
    shapes whose labels are in `only`, when given)."""
    try:
        import zmuon  # pylint: disable=import-outside-toplevel
    except (ImportError, OSError) as e:
        sys.exit(f"--interleave needs the zmuon package and libzmuon (PYTHONPATH, "
                 f"ZMUON_LIBRARY): {e}")
    if not torch.cuda.is_available():
        sys.exit("--interleave needs a CUDA device")
    lines = [f"device: {torch.cuda.get_device_name()} (torch {torch.__version__}, zmuon "
             f"{zmuon.version()}); bf16 in and out, NS5, the engine's default variant; "
             f"median of {rounds} rounds, each one timed call of each (CUDA events), "
             f"after {warmup} warm-up calls of each",
             "",
             "| shape | zmuon ms | eager ms | x eager | relative difference |",
             "| --- | ---: | ---: | ---: | ---: |"]
    verdicts = []
    for label, batch, rows, cols in SHAPES:
        if only and label not in only:
            continue
        shape = (batch, rows, cols) if batch > 1 else (rows, cols)
        G = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        work = torch.empty_like(G)

        def refill():
            work.copy_(G)

        def ours():
            zmuon.newton_schulz(work, out=work)

        def eager():
            ns5_reference(G)

        for _ in range(warmup):
            refill()
            ours()
            eager()
        ours_ms, eager_ms = [], []
        for r in range(rounds):
            if r % 2 == 0:
                ours_ms.append(time_once(ours, refill))
                eager_ms.append(time_once(eager))
            else:
                eager_ms.append(time_once(eager))
                ours_ms.append(time_once(ours, refill))
        refill()
        ours()
        want = ns5_reference(G).float()
        diff = ((work.float() - want).norm() / want.norm()).item()
        z, e = statistics.median(ours_ms), statistics.median(eager_ms)
        ratio = e / z
        print(f"{label}: zmuon {z:.3f} ms, eager {e:.3f} ms, {ratio:.2f}x", flush=True)
        lines.append(f"| {label} | {z:.3f} | {e:.3f} | {ratio:.2f} | {diff:.2e} |")
        verdicts.append(f"{label}, zmuon.newton_schulz bf16: {ratio:.2f}x eager (target >= 1.5x):"
                        f" {'met' if ratio >= 1.5 else 'BELOW'}")
    lines.append("")
    lines.append("relative difference: ||zmuon - eager||_F / ||eager||_F of one call's results "
                 "(both bf16 NS5; a few 1e-2 is bf16 noise)")
    lines.append("")
    lines.extend(verdicts)
    return "\n".join(lines)


def fmt(value, spec):
    return "n/a" if value is None else format(value, spec)


def step_table(paths, zmuon_ns, reps):
    """The whole-step table from zmuon-bench-step --json files, PyTorch timed here."""
    torch_ms = {}
    lines = [f"device: {torch.cuda.get_device_name()} (torch {torch.__version__}); zmuon: "
             "medians of the steps after a warm-up, tracing on; torch NS5 eager, bf16, "
             f"median of {max(3, reps // 4)}",
             "",
             "| table | world, comm | zmuon step ms | zmuon NS in the step ms | zmuon NS kernels ms | "
             "torch batched NS ms | torch per-matrix NS ms | plumbing % | Muon-phase MB zmuon "
             "/ DeepSpeed | peak transient device MB |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for path in paths:
        with open(path) as f:
            z = json.load(f)
        name = z["table"]
        if name not in TABLES:
            continue
        if name not in torch_ms:
            torch_ms[name] = time_table(TABLES[name], reps)
        loop_ms, batched_ms = torch_ms[name]
        kernels = zmuon_ns.get(f"{name} table", {}).get("ms") if zmuon_ns else None
        ns_phase = z["phase_ms"].get("ns")
        enq = " (enqueue)" if z.get("phases_are_enqueue_times") else ""
        ns_calls = z.get("call_ms", {}).get("newton_schulz")
        if ns_calls is not None:  # --call-times: the NS calls' own time (CUDA: device, events)
            ns_phase = ns_calls["busy_ms"]
            enq = " (device)" if z.get("compute") == "cuda" else " (calls)"
        r0 = z["ranks"][0]
        peak = z.get("peak_transient_device_bytes")
        chunk = z.get("chunk_bytes") or 0
        peak = "n/a" if peak is None else (
            f"{peak / 1e6:.1f} ({peak / chunk:.2f} chunks)" if chunk else f"{peak / 1e6:.1f}")
        lines.append(
            f"| {name} | {z['world']}, {z['comm']} | {z['step_ms']:.2f} | "
            f"{fmt(ns_phase, '.2f')}{enq} | {fmt(kernels, '.2f')} | {batched_ms:.2f} | "
            f"{loop_ms:.2f} | {100 * z['plumbing_fraction_max_rank']:.2f} | "
            f"{r0['zmuon_muon_bytes'] / 1e6:.1f} / {r0['deepspeed_muon_bytes'] / 1e6:.1f} | "
            f"{peak} |")
    lines.append("")
    lines.append("zmuon step ms: step() (the vote with the norm, momentum, gather/NS/scatter, apply, AdamW; "
                 "reduce() hand-over not included). NS in the step: with --call-times the "
                 "time per step during which a newton_schulz call ran on the phase table's rank "
                 "(CUDA: events around each call on its lane), else the trace's ns phase (on CUDA only the "
                 "enqueue)."
                 " plumbing: "
                 "host time in the coordinator's, loss scaler's and reducer's handlers outside "
                 "compute, trace cost taken out, over the step's wall time (largest rank; target "
                 "<= 2 % for llama-1b). Muon-phase bytes: rank 0's gather + scatter against "
                 "DeepSpeed's 4 all-gathers. Peak transient memory: the most a rank's backend "
                 "held during a step above its state between steps (engine::memory), in chunks "
                 "of that rank's largest chunk.")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zmuon", help="bench_ns --json output")
    parser.add_argument("--step-json", nargs="+", help="zmuon-bench-step --json outputs")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", help="also write the table (markdown) here")
    parser.add_argument("--interleave", action="store_true",
                        help="time zmuon.newton_schulz (this process) against eager NS5, "
                             "alternating, on the same bf16 inputs")
    parser.add_argument("--rounds", type=int, default=10, help="--interleave: timed rounds")
    parser.add_argument("--only", help="--interleave: these shapes only, comma-separated labels "
                                       "(" + ",".join(label for label, *_ in SHAPES) + ")")
    args = parser.parse_args()
    only = None
    if args.only:
        only = set(args.only.split(","))
        unknown = only - {label for label, *_ in SHAPES}
        if unknown:
            parser.error(f"--only: unknown shape {', '.join(sorted(unknown))}")

    if args.interleave:
        table = interleave_table(args.rounds, only)
        print("\n" + table)
        if args.out:
            with open(args.out, "w") as f:
                f.write(table + "\n")
        return

    if args.step_json:
        zmuon_ns = None
        if args.zmuon:
            with open(args.zmuon) as f:
                zmuon_ns = {r["label"]: r for r in json.load(f)["ns"]}
        table = step_table(args.step_json, zmuon_ns, args.reps)
        print("\n" + table)
        if args.out:
            with open(args.out, "w") as f:
                f.write(table + "\n")
        return
    if not args.zmuon:
        parser.error("--zmuon, --step-json or --interleave is needed")

    with open(args.zmuon) as f:
        zmuon = json.load(f)
    ours = {r["label"]: r for r in zmuon["ns"]}
    ceiling = zmuon["gemm_tflops"]

    torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
    compiled = torch.compile(ns5_reference)
    has_muon = hasattr(torch.optim, "Muon")

    torch_ceiling = torch_gemm_tflops(args.reps)
    rows_out = []
    bf16_rows = []  # (label, zmuon bf16 ms, eager on a bf16 input ms)
    for label, batch, rows, cols in SHAPES:
        if label not in ours:  # bench_ns --only
            continue
        eager_ms = time_ns(ns5_reference, batch, rows, cols, args.reps)
        if ours[label].get("bf16_ms"):
            bf16_rows.append((label, ours[label]["bf16_ms"],
                              time_ns(ns5_reference, batch, rows, cols, args.reps,
                                      dtype=torch.bfloat16)))
        try:
            compiled_ms = time_ns(compiled, batch, rows, cols, args.reps)
        except Exception as e:  # a compile failure is reported, not fatal
            print(f"torch.compile failed on {label}: {e}", file=sys.stderr)
            compiled_ms = None
        muon_ms = time_muon_step(batch, rows, cols, args.reps) if has_muon else None
        print(f"{label}: eager {eager_ms:.3f} ms, compile {fmt(compiled_ms, '.3f')} ms, "
              f"Muon step {fmt(muon_ms, '.3f')} ms", flush=True)
        rows_out.append((label, batch, rows, cols, eager_ms, compiled_ms, muon_ms))

    lines = []
    lines.append(f"device: {zmuon['device']} (torch {torch.__version__})")
    lines.append(f"ceiling: bf16 GEMM 8192^3 cuBLAS {ceiling:.1f} TFLOP/s "
                 f"(torch matmul {torch_ceiling:.1f}); device copy {zmuon['copy_tbps']:.2f} TB/s"
                 f" (read + write); NS5 full-GEMM FLOPs; median of {args.reps}")
    lines.append("")
    lines.append("zmuon's rows time the engine's default variant (named where it is Gram, "
                 "with the standard iteration on the row below); the targets are checked on it.")
    lines.append("")
    lines.append("| shape | zmuon ms | TFLOP/s | of ceiling | eager ms | x eager | "
                 "compile ms | x compile | Muon step ms | x Muon |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    verdicts = []
    for label, batch, rows, cols, eager_ms, compiled_ms, muon_ms in rows_out:
        z = ours[label]
        tflops = ns_flops(batch, rows, cols) / (z["ms"] * 1e-3) / 1e12
        frac = tflops / ceiling
        x_eager = eager_ms / z["ms"]
        x_compile = compiled_ms / z["ms"] if compiled_ms else None
        x_muon = muon_ms / z["ms"] if muon_ms else None
        variant = z.get("variant", "standard")
        shown = label if variant == "standard" else f"{label} ({variant})"
        lines.append(f"| {shown} | {z['ms']:.3f} | {tflops:.0f} | {100 * frac:.0f}% | "
                     f"{eager_ms:.3f} | {x_eager:.2f} | {fmt(compiled_ms, '.3f')} | "
                     f"{fmt(x_compile, '.2f')} | {fmt(muon_ms, '.3f')} | {fmt(x_muon, '.2f')} |")
        if z.get("standard_ms"):
            lines.append(f"| {label} (standard) | {z['standard_ms']:.3f} | | | | "
                         f"{eager_ms / z['standard_ms']:.2f} | | "
                         f"{fmt(compiled_ms / z['standard_ms'] if compiled_ms else None, '.2f')}"
                         f" | | |")
        m = min(rows, cols)
        ok = x_eager >= 1.5  # the target, on every shape
        verdicts.append(f"{label}: {x_eager:.2f}x eager (target >= 1.5x): "
                        f"{'met' if ok else 'BELOW'}")
        if m >= 4096 and batch == 1:
            slowest = min(x for x in (x_eager, x_compile) if x is not None)
            ok = slowest >= 1.0 and frac >= 0.8
            verdicts.append(f"{label}: {slowest:.2f}x the fastest PyTorch NS, {100 * frac:.0f}% "
                            f"of ceiling (targets >= 1x, >= 80%): {'met' if ok else 'BELOW'}")
        if batch > 1 and f"{label} loop" in ours:
            loop = ours[f"{label} loop"]
            loop_tflops = ns_flops(batch, rows, cols) / (loop["ms"] * 1e-3) / 1e12
            lines.append(f"| {label} (48 calls) | {loop['ms']:.3f} | {loop_tflops:.0f} | "
                         f"{100 * loop_tflops / ceiling:.0f}% | | | | | | |")
            ratio = loop["ms"] / z["ms"]
            verdicts.append(f"{label}: batch {ratio:.2f}x the per-matrix loop (target >= 5x): "
                            f"{'met' if ratio >= 5 else 'BELOW'}")
    if bf16_rows:
        lines.append("")
        lines.append("bf16 in and out (what the step runs: the coordinator hands NS the gathered "
                     "bf16 matrices and scatters bf16): zmuon's newton_schulz_bf16 against eager "
                     "NS5 on a bf16 input (its G.bfloat16() then copies nothing)")
        lines.append("")
        lines.append("| shape | zmuon bf16 ms | eager bf16 ms | x eager |")
        lines.append("| --- | ---: | ---: | ---: |")
        for label, ours_ms, eager16_ms in bf16_rows:
            ratio = eager16_ms / ours_ms
            lines.append(f"| {label} | {ours_ms:.3f} | {eager16_ms:.3f} | {ratio:.2f} |")
            verdicts.append(f"{label}, bf16 in and out: {ratio:.2f}x eager (target >= 1.5x): "
                            f"{'met' if ratio >= 1.5 else 'BELOW'}")
    lines.append("")
    lines.append("Whole tables (all Muon matrices, NS5): zmuon batched by shape against PyTorch "
                 "eager per matrix and batched by shape")
    lines.append("")
    lines.append("| table | matrices | zmuon ms | full-GEMM floor ms | torch per-matrix ms | "
                 "x | torch batched ms | x |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, groups in TABLES.items():
        z = ours.get(f"{name} table")
        if z is None:
            continue
        loop_ms, batched_ms = time_table(groups, args.reps)
        lines.append(f"| {name} | {z['batch']} | {z['ms']:.3f} | {z['graph_ms']:.3f} | "
                     f"{loop_ms:.3f} | {loop_ms / z['ms']:.2f} | {batched_ms:.3f} | "
                     f"{batched_ms / z['ms']:.2f} |")
    lines.append("")
    lines.extend(verdicts)
    table = "\n".join(lines)
    print("\n" + table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
