"""Where one optimizer step's time goes on the GPU, from a torch.profiler Chrome trace (the
<key>.trace.json that `peers_step.py --profile DIR` writes): the span from the first host event to
the last GPU event, the time some kernel or copy runs (the union over streams), the gaps where
none runs with the kernels around them and the host calls that overlap them, and the kernel time
by name. Also reads zmuon's own call timeline (`peers_step.py --timeline DIR`: <key>.calls.json,
each backend call's span between two CUDA events, no profiler in the process, and the engine
calls' host spans beside them).

    python3 bench/dev/trace_gaps.py DIR/zmuon-auto-gpt2.trace.json [--gap-us 15] [--top 25]
    python3 bench/dev/trace_gaps.py DIR/zmuon-auto-gpt2.calls.json
    python3 bench/dev/trace_gaps.py --phases RUN1/zmuon-auto-gpt2.calls.json RUN2/...   # a line
        each: when the momentum's first call and the Newton-Schulz window begin and end, and
        what runs after the last NS (ms from the first engine call), for comparing builds
"""

import argparse
import collections
import json

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "call"}  # "call": zmuon's call timeline


def load(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    gpu = sorted((e for e in spans if e.get("cat") in GPU_CATS), key=lambda e: e["ts"])
    host = [e for e in spans if e.get("cat") not in GPU_CATS]
    return gpu, host


def union(gpu):
    """The busy intervals (start, end) of the GPU, merged over streams."""
    out = []
    for e in gpu:
        s, t = e["ts"], e["ts"] + e["dur"]
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], t)
        else:
            out.append([s, t])
    return out


def short(name, n=60):
    return name if len(name) <= n else name[:n - 3] + "..."


def phases(path):
    """One line of a zmuon call timeline: ms from its first event."""
    gpu, host = load(path)
    start = min(e["ts"] for e in host + gpu)
    end = max(e["ts"] + e["dur"] for e in gpu)
    ms = lambda t: 1e-3 * (t - start)  # noqa: E731
    momentum = [e["ts"] for e in gpu if e["name"].startswith("momentum")]
    ns = [e for e in gpu if e["name"] == "newton_schulz"]
    if not momentum or not ns:
        return f"{path}: no momentum or no newton_schulz call"
    ns_start = min(e["ts"] for e in ns)
    ns_end = max(e["ts"] + e["dur"] for e in ns)
    return (f"first kernel {ms(min(e['ts'] for e in gpu)):6.3f}  momentum {ms(min(momentum)):6.3f}"
            f"  NS {ms(ns_start):6.3f}-{ms(ns_end):6.3f} ({1e-3 * (ns_end - ns_start):5.3f}, "
            f"{len(ns)} calls)  after it {1e-3 * (end - ns_end):5.3f}  end {ms(end):6.3f}  "
            f"momentum to end {1e-3 * (end - min(momentum)):5.3f}  {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", nargs="+")
    ap.add_argument("--gap-us", type=float, default=15.0, help="list gaps at least this long")
    ap.add_argument("--top", type=int, default=25, help="kernel names to list")
    ap.add_argument("--phases", action="store_true",
                    help="a line per zmuon call timeline: the step's phases (ms)")
    args = ap.parse_args()
    if args.phases:
        for path in args.trace:
            print(phases(path))
        return
    if len(args.trace) > 1:
        raise SystemExit("several traces: with --phases only")
    args.trace = args.trace[0]
    gpu, host = load(args.trace)
    if not gpu:
        raise SystemExit(f"{args.trace}: no GPU events (was CUDA profiled?)")
    start = min(e["ts"] for e in host + gpu)
    end = max(e["ts"] + e["dur"] for e in gpu)
    busy = union(gpu)
    busy_us = sum(t - s for s, t in busy)
    print(f"# {args.trace}")
    print(f"span {1e-3 * (end - start):.3f} ms from the first host event to the last GPU event; "
          f"GPU busy {1e-3 * busy_us:.3f} ms; idle {1e-3 * (end - start - busy_us):.3f} ms "
          f"(before the first GPU event {1e-3 * (busy[0][0] - start):.3f})")
    engine_calls = sorted((e for e in host if e.get("cat") == "host"), key=lambda e: e["ts"])
    if engine_calls:  # zmuon's timeline: its engine calls' host time beside the device's
        print("\n## engine calls on the host (ms from the span's start)")
        for e in engine_calls:
            print(f"{1e-3 * (e['ts'] - start):8.3f} +{1e-3 * e['dur']:7.3f} ms  {e['name']}")
    runtime = [e for e in host if e.get("cat") in ("cuda_runtime", "host")]
    print(f"\n## gaps of at least {args.gap_us:g} us (ms from the span's start)")
    prev_end, prev_name = start, "(step begins)"
    for s, t in busy:
        gap = s - prev_end
        if gap >= args.gap_us:
            after = next(e["name"] for e in gpu if e["ts"] == s)
            calls = collections.Counter(e["name"] for e in runtime
                                        if e["ts"] < s and e["ts"] + e["dur"] > prev_end)
            waits = ", ".join(f"{n} x{c}" for n, c in calls.most_common(3))
            print(f"{1e-3 * (prev_end - start):8.3f} +{gap:7.1f} us  after {short(prev_name, 40)}"
                  f"  before {short(after, 40)}  [{waits}]")
        last = max((e for e in gpu if e["ts"] < t and e["ts"] + e["dur"] <= t + 1e-3),
                   key=lambda e: e["ts"] + e["dur"])
        prev_end, prev_name = t, last["name"]
    by_name = collections.defaultdict(lambda: [0.0, 0])
    streams = collections.defaultdict(float)
    for e in gpu:
        by_name[e["name"]][0] += e["dur"]
        by_name[e["name"]][1] += 1
        streams[e.get("args", {}).get("stream", "?")] += e["dur"]
    total = sum(v[0] for v in by_name.values())
    print(f"\n## GPU time by name: {1e-3 * total:.3f} ms in {len(gpu)} events")
    for name, (us, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"{1e-3 * us:8.3f} ms {n:5d}x  {short(name, 90)}")
    print("\n## by stream: " + ", ".join(f"{k}: {1e-3 * v:.3f} ms"
                                         for k, v in sorted(streams.items(), key=str)))


if __name__ == "__main__":
    main()
