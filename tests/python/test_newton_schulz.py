"""zmuon.newton_schulz (zmuon's Newton-Schulz without an engine) on the CPU with numpy: results
against a float64 numpy NS5 for square, wide, tall and batched matrices, the options, in place
and `out=`, the backend kept per (backend, device), and bad arguments raising exceptions that
name the problem. Where PyTorch is installed (not in CI), CPU tensors in float32 and bfloat16 too.

Run by ctest with Debian's /usr/bin/python3, PYTHONPATH=python, ZMUON_LIBRARY=libzmuon.so.
"""

import unittest

import numpy as np

import zmuon
from zmuon import orthogonalize

try:  # PyTorch is optional: CI has none
    import torch
except ImportError:
    torch = None

NS5 = (3.4445, -4.7750, 2.0315)
# fp32 on the host against float64 (the C++ test measures 1.2e-6..1.8e-6 on the same kind of
# input); bf16 output rounding is about 1.7e-3.
FP32_TOLERANCE = 2e-5
BF16_TOLERANCE = 5e-3
SHAPES = [(64, 64), (32, 96), (96, 32), (3, 48, 80)]


def ns_reference(x, steps=5, abc=NS5):
    """float64 NS of each matrix: tall as wide, X / (||X||_F + 1e-7), `steps` quintic steps."""
    x = np.asarray(x, np.float64)
    if x.ndim == 3:
        return np.stack([ns_reference(m, steps, abc) for m in x])
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (np.linalg.norm(x) + 1e-7)
    a, b, c = abc
    for _ in range(steps):
        m = x @ x.T
        x = a * x + (b * m + c * m @ m) @ x
    return x.T if tall else x


def worst(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if want.ndim == 2:
        got, want = got[None], want[None]
    return max(float(np.linalg.norm(g - w) / np.linalg.norm(w)) for g, w in zip(got, want))


def gaussian(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class NewtonSchulzTest(unittest.TestCase):
    def test_matches_float64_ns5_for_every_shape_and_variant(self):
        for variant in (None, "standard", "gram"):
            for i, shape in enumerate(SHAPES):
                x = gaussian(shape, i)
                before = x.copy()
                got = zmuon.newton_schulz(x, variant=variant)
                d = worst(got, ns_reference(x))
                print(f"{variant} {shape}: relative distance {d:.3g}")
                self.assertLess(d, FP32_TOLERANCE, f"{variant} {shape}")
                self.assertEqual(got.dtype, np.float32)
                self.assertEqual(got.shape, x.shape)
                np.testing.assert_array_equal(x, before)  # a new array; x unchanged

    def test_steps_and_coefficients(self):
        x = gaussian((24, 56), 7)
        abc = (3.0, -3.2, 1.2)
        got = zmuon.newton_schulz(x, steps=3, coefficients=abc, variant="standard")
        self.assertLess(worst(got, ns_reference(x, 3, abc)), FP32_TOLERANCE)
        # and back to the defaults on the same cached backend
        self.assertLess(worst(zmuon.newton_schulz(x), ns_reference(x)), FP32_TOLERANCE)
        polar = zmuon.newton_schulz(x, schedule="polar_express", steps=6)
        self.assertGreater(worst(polar, ns_reference(x)), 1e-3)  # another polynomial

    def test_in_place_and_out(self):
        x = gaussian((3, 20, 30), 8)
        want = zmuon.newton_schulz(x)
        y = x.copy()
        self.assertIs(zmuon.newton_schulz(y, out=y), y)
        np.testing.assert_array_equal(y, want)
        out = np.empty_like(x)
        self.assertIs(zmuon.newton_schulz(x, out=out), out)
        np.testing.assert_array_equal(out, want)
        # a non-contiguous x is copied into a contiguous result
        wide = np.ascontiguousarray(x.transpose(0, 2, 1)).transpose(0, 2, 1)
        self.assertFalse(wide.flags["C_CONTIGUOUS"])
        np.testing.assert_array_equal(zmuon.newton_schulz(wide), want)

    def test_backend_is_kept_per_backend_and_device(self):
        x = gaussian((16, 16), 9)
        zmuon.newton_schulz(x)
        first = orthogonalize._cache[("host", 0)][0]
        zmuon.newton_schulz(x, steps=4)
        self.assertIs(orthogonalize._cache[("host", 0)][0], first)
        self.assertEqual(len([k for k in orthogonalize._cache if k[0] == "host"]), 1)

    def test_orthogonalizer_class(self):
        x = gaussian((2, 12, 36), 10)
        ns = zmuon.Orthogonalizer("host", steps=5, variant="standard")
        got = ns(x)
        self.assertLess(worst(got, ns_reference(x)), FP32_TOLERANCE)
        ns(x, out=x)
        np.testing.assert_array_equal(x, got)
        ns.close()
        with self.assertRaisesRegex(zmuon.BadState, "closed"):
            ns(x)

    def test_non_finite_input_is_refused_before_running(self):
        # A NaN or an infinity in a host input: InvalidArgument naming the first one's index,
        # before anything runs (x and `out` untouched); the cached backend stays usable.
        x = gaussian((3, 10, 14), 11)
        clean = zmuon.newton_schulz(x)
        for bad in (np.nan, np.inf, -np.inf):
            with self.subTest(value=bad):
                y = x.copy()
                y[1, 2, 3] = bad
                y[2, 0, 0] = bad
                before = y.copy()
                out = np.full_like(y, 7.0)
                with self.assertRaises(zmuon.InvalidArgument) as cm:
                    zmuon.newton_schulz(y, out=out)
                self.assertEqual(str(cm.exception), "newton_schulz: the input has non-finite "
                                 "values (first at index (1, 2, 3))")
                self.assertTrue((out == 7.0).all())
                with self.assertRaises(zmuon.InvalidArgument):
                    zmuon.newton_schulz(y, out=y)
                np.testing.assert_array_equal(y, before)
        m = gaussian((6, 5), 12)
        m[4, 1] = np.inf
        with self.assertRaisesRegex(zmuon.InvalidArgument, r"^Orthogonalizer: the input has "
                                    r"non-finite values \(first at index \(4, 1\)\)$"):
            zmuon.Orthogonalizer("host")(m)
        np.testing.assert_array_equal(zmuon.newton_schulz(x), clean)

    def test_errors_name_the_problem(self):
        x = gaussian((8, 8), 12)
        with self.assertRaisesRegex(TypeError, "float32 numpy arrays .* got dtype '<f8'"):
            zmuon.newton_schulz(x.astype(np.float64))
        with self.assertRaisesRegex(TypeError, "expected a numpy array or a torch tensor"):
            zmuon.newton_schulz([[1.0, 2.0]])
        with self.assertRaisesRegex(zmuon.InvalidArgument, "x has 1 dimensions"):
            zmuon.newton_schulz(np.ones(8, np.float32))
        with self.assertRaisesRegex(zmuon.InvalidArgument, "x has 4 dimensions"):
            zmuon.newton_schulz(np.ones((1, 1, 4, 4), np.float32))
        with self.assertRaisesRegex(zmuon.InvalidArgument, "rows 0, cols 8"):
            zmuon.newton_schulz(np.ones((0, 8), np.float32))
        with self.assertRaisesRegex(zmuon.InvalidArgument, r'did you mean "gram"'):
            zmuon.newton_schulz(x, variant="gramm")
        with self.assertRaisesRegex(zmuon.InvalidArgument,
                                    r"ns_steps: expected an integer in \[1, 100\]"):
            zmuon.newton_schulz(x, steps=0)
        with self.assertRaisesRegex(zmuon.InvalidArgument, r"ns_coefficients: expected an array"):
            zmuon.newton_schulz(x, coefficients=(1.0, 2.0))
        with self.assertRaisesRegex(TypeError, "unexpected keyword argument 'step'"):
            zmuon.newton_schulz(x, step=5)  # pylint: disable=unexpected-keyword-arg
        with self.assertRaisesRegex(zmuon.InvalidArgument, r"did you mean 'ns_steps'"):
            orthogonalize._capi.Orthogonalizer("host", 0, '{"ns_step": 5}')
        with self.assertRaisesRegex(zmuon.InvalidArgument, "unknown compute backend 'cdua'"):
            zmuon.Orthogonalizer("cdua")
        with self.assertRaisesRegex(ValueError, "out: expected the dtype, shape and device"):
            zmuon.newton_schulz(x, out=np.empty((8, 9), np.float32))
        with self.assertRaisesRegex(ValueError, "out: not contiguous"):
            zmuon.newton_schulz(x, out=np.empty((8, 8), np.float32).T)
        ro = x.copy()
        ro.flags.writeable = False
        with self.assertRaisesRegex(ValueError, "read-only"):
            zmuon.newton_schulz(ro, out=ro)
        # a failed call leaves the cached backend usable with its options
        self.assertLess(worst(zmuon.newton_schulz(x), ns_reference(x)), FP32_TOLERANCE)

    @unittest.skipIf(torch is None, "PyTorch is not installed")
    def test_torch_cpu_float32_and_bfloat16(self):
        x = gaussian((3, 24, 40), 13)
        t = torch.from_numpy(x.copy())
        np.testing.assert_array_equal(zmuon.newton_schulz(t).numpy(), zmuon.newton_schulz(x))
        b = t.to(torch.bfloat16)
        got = zmuon.newton_schulz(b)
        self.assertEqual(got.dtype, torch.bfloat16)
        want = ns_reference(b.float().numpy())
        self.assertLess(worst(got.float().numpy(), want), BF16_TOLERANCE)
        zmuon.newton_schulz(b, out=b)
        self.assertTrue(torch.equal(b, got))


if __name__ == "__main__":
    unittest.main()
