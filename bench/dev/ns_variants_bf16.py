#!/usr/bin/python3.11
"""Host emulation of the CUDA Newton-Schulz paths' bf16 arithmetic, standard and Gram.

Estimates, before a GPU run, what the bf16 Gram variant (kernels/cuda/gram_newton_schulz.cu) does
to accuracy: every matrix the GPU stores in bf16 (X, A, B; R, Z, T, Q) is rounded to bf16 here
after a float32 product (numpy/OpenBLAS sgemm; cuBLAS accumulates in fp32 too, in another
order). Prints the orthogonality error ||O O^T - I||_F / sqrt(m) and the distance to the exact
polar factor (numpy SVD, float64) for NS5 and Polar Express (PE), standard and Gram with
restarts every 1/2/3 steps or never, on a Gaussian input and on inputs with singular values
log-spaced over [1e-3, 1] and [1e-6, 1]. Debian's python3-numpy (no other dependency):

    /usr/bin/python3.11 bench/ns_variants_bf16.py [--m 256] [--n 1024] [--seed 1] [--gpu-cases]
"""

import argparse

import numpy as np

NS5 = (3.4445, -4.7750, 2.0315)
# Amsel et al. 2025 (arXiv:2505.16932), Implementation 1; as kernels/ns_variants.hpp.
PE_PUBLISHED = [
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
]


def pe_schedule(steps):
    out = []
    for t in range(steps):
        i = min(t, len(PE_PUBLISHED) - 1)
        a, b, c = PE_PUBLISHED[i]
        s = (1.01 if i < len(PE_PUBLISHED) - 1 else 1.0) * (1.01 if t == 0 else 1.0)
        out.append((a / s, b / s**3, c / s**5))
    return out


ROUND = True  # False: plain float32 throughout (the host backend's arithmetic)


def bf16(x):
    """Round float32 to the nearest bf16 (ties to even), kept as float32."""
    x = np.asarray(x, dtype=np.float32)
    if not ROUND:
        return x
    bits = x.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def normalize(x):
    return bf16(x / (np.linalg.norm(x.astype(np.float64)) + 1e-7))


def standard(x, coeffs):
    x = normalize(x)
    for a, b, c in coeffs:
        A = bf16(x @ x.T)
        B = bf16(np.float32(c) * (A @ A) + np.float32(b) * A)
        x = bf16(B @ x + np.float32(a) * x)
    return x


def gram(x, coeffs, restart):
    x = normalize(x)
    m = x.shape[0]
    eye = np.eye(m, dtype=np.float32)
    step = 0
    while step < len(coeffs):
        count = len(coeffs) - step if restart == 0 else min(restart, len(coeffs) - step)
        R = bf16(x @ x.T)
        for j in range(count):
            a, b, c = (np.float32(v) for v in coeffs[step + j])
            Z = bf16(c * (R @ R) + b * R)
            Q = bf16(Z + a * eye) if j == 0 else bf16(Z @ Q + a * Q)
            if j + 1 < count:
                T = bf16(Z @ R + a * R)
                R = bf16(T @ Z + a * T)
        x = bf16(Q @ x)
        step += count
    return x


def with_singular_values(m, n, smin, rng):
    u, _ = np.linalg.qr(rng.standard_normal((m, m)))
    v, _ = np.linalg.qr(rng.standard_normal((n, m)))
    s = np.logspace(0, np.log10(smin), m)
    return ((u * s) @ v.T).astype(np.float32)


def polar(x):
    u, _, vt = np.linalg.svd(x.astype(np.float64), full_matrices=False)
    return u @ vt


def errors(o, p):
    o = o.astype(np.float64)
    m = o.shape[0]
    orth = np.linalg.norm(o @ o.T - np.eye(m)) / np.sqrt(m)
    return orth, np.linalg.norm(o - p) / np.linalg.norm(p)


def fp32(fn, *args):
    """fn's result in plain float32 arithmetic."""
    global ROUND
    ROUND = False
    try:
        return fn(*args)
    finally:
        ROUND = True


def gpu_test_cases(rng):
    """What test_cuda_kernels' gram_against_standard_and_host checks, on Gaussian inputs: the
    worst relative difference of bf16 Gram (restart 3) to bf16 standard and to fp32 Gram."""
    print("\n| shape | schedule | bf16 Gram vs bf16 standard | bf16 Gram vs fp32 Gram |")
    print("|---|---|---|---|")
    for m, n in ((128, 512), (768, 3072), (64, 200)):
        x = rng.standard_normal((m, n)).astype(np.float32)
        for sname, coeffs in (("NS5", [NS5] * 5), ("PE", pe_schedule(5))):
            g = gram(x, coeffs, 3).astype(np.float64)
            s = standard(x, coeffs).astype(np.float64)
            f = fp32(gram, x, coeffs, 3).astype(np.float64)
            print(f"| {m}x{n} | {sname} | {np.linalg.norm(g - s) / np.linalg.norm(s):.3g} "
                  f"| {np.linalg.norm(g - f) / np.linalg.norm(f):.3g} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=256)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--gpu-cases", action="store_true",
                    help="also the shapes of test_cuda_kernels' gram_against_standard_and_host")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    m, n = args.m, args.n
    inputs = [
        ("gaussian", rng.standard_normal((m, n)).astype(np.float32)),
        ("sv 1e-3..1", with_singular_values(m, n, 1e-3, rng)),
        ("sv 1e-6..1", with_singular_values(m, n, 1e-6, rng)),
    ]
    schedules = [("NS5", [NS5] * 5), ("PE", pe_schedule(5))]
    print(f"| input ({m}x{n}) | method | orthogonality | polar distance | diff to standard |")
    print("|---|---|---|---|---|")
    for name, x in inputs:
        p = polar(x)
        for sname, coeffs in schedules:
            ref = standard(x, coeffs)
            rows = [(sname, ref)]
            for restart in (3, 2, 0):
                rows.append((f"Gram({sname}) r{restart}", gram(x, coeffs, restart)))
            for label, o in rows:
                orth, dist = errors(o, p)
                diff = np.linalg.norm(o.astype(np.float64) - ref) / np.linalg.norm(ref.astype(np.float64))
                print(f"| {name} | {label} | {orth:.4g} | {dist:.4g} | {diff:.3g} |")
    if args.gpu_cases:
        gpu_test_cases(rng)


if __name__ == "__main__":
    main()
