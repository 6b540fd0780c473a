#!/usr/bin/env python3
"""zmuon.Muon over many small numpy matrices ([4, 4], one process of one rank): the time to
construct it (every matrix registered and its group set) and of one accumulate() + step().

    PYTHONPATH=python ZMUON_LIBRARY=build/src/embed/libzmuon.so python3 bench/many_matrices.py \\
        --matrices 100000
"""

import argparse
import time

import numpy as np

import zmuon


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrices", type=int, default=100_000)
    args = ap.parse_args()
    params = {f"m{i}.weight": np.full((4, 4), 0.5, dtype=np.float32)
              for i in range(args.matrices)}
    grads = {n: np.full((4, 4), 0.1, dtype=np.float32) for n in params}
    # Processor time beside the wall clock: on a shared machine the wall clock counts others' work.
    t0, c0 = time.perf_counter(), time.process_time()
    opt = zmuon.Muon(params)
    t1, c1 = time.perf_counter(), time.process_time()
    opt.accumulate(grads=grads)
    opt.step()
    t2, c2 = time.perf_counter(), time.process_time()
    opt.close()
    print(f"{args.matrices} matrices [4, 4]: construct {t1 - t0:.2f} s ({c1 - c0:.2f} s CPU), "
          f"accumulate + step {t2 - t1:.2f} s ({c2 - c1:.2f} s CPU)")


if __name__ == "__main__":
    main()
