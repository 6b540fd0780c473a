"""On a GPU machine with PyTorch and a CUDA build of libzmuon: zmuon.newton_schulz on CUDA tensors
(the cuda backend, ordered on PyTorch's current stream, here a side stream) in float32 and
bfloat16, new and in place, against the same input on the CPU (host backend, fp32). The bound is
the CUDA backend's bf16 NS5 against the host's fp32 (tests/cuda_test_env.hpp, kNs5ToHost); exit
status 1 past it.

    PYTHONPATH=python ZMUON_LIBRARY=.../libzmuon.so python3 tests/python/gpu_newton_schulz_check.py
"""

import sys

import torch

import zmuon

NS5_TO_HOST = 3e-2
SHAPES = [(256, 256), (128, 512), (512, 128), (4, 96, 160), (2048, 8192), (48, 768, 768)]


def rel(a, b):
    a, b = a.float().cpu(), b.float().cpu()
    return ((a - b).norm() / b.norm()).item()


def main():
    torch.manual_seed(0)
    failed = False
    side = torch.cuda.Stream()
    for shape in SHAPES:
        x = torch.randn(shape)
        want = zmuon.newton_schulz(x)  # host backend, fp32
        for dtype in (torch.float32, torch.bfloat16):
            g = x.to("cuda", dtype)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                got = zmuon.newton_schulz(g)
                inplace = g.clone()
                zmuon.newton_schulz(inplace, out=inplace)
                got_host = got.to("cpu", non_blocking=False)
            torch.cuda.synchronize()
            d, d_inplace = rel(got_host, want), rel(inplace, want)
            ok = d < NS5_TO_HOST and d_inplace < NS5_TO_HOST and got.dtype == dtype and d > 0
            failed |= not ok
            print(f"{tuple(shape)} {dtype}: relative distance to the host {d:.3e} (in place "
                  f"{d_inplace:.3e}) {'ok' if ok else 'FAILED'}", flush=True)
    try:
        zmuon.newton_schulz(torch.randn(8, 8, device="cuda", dtype=torch.float16))
        print("float16 was accepted: FAILED")
        failed = True
    except TypeError as e:
        print(f"float16 refused: {e}")
    print("FAILED" if failed else "all ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
