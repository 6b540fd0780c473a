"""zmuon.Muon's keywords for Muon on blocks and MuonClip, on the CPU against a float64 Muon
written here: 3-D expert stacks by default, split_sizes with heads per block, adjust_lr
"spectral" and "rms", and qk_clip with report_qk_logits.

Run by ctest with the venv's python (.venv); without PyTorch it fails.
"""

import math
import unittest

import torch
import torch.nn as nn

import zmuon

torch.set_num_threads(2)

TOL = 1e-5  # relative error of the update against the float64 reference
HYPER = dict(lr=0.02, adam_lr=3e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
             ns_variant="standard")


def ns5(g):
    """Keller Jordan's NS5 (a, b, c = 3.4445, -4.7750, 2.0315) in float64, on the wide side."""
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (x.norm() + 1e-7)
    for _ in range(5):
        a = x @ x.T
        x = 3.4445 * x + (-4.7750 * a + 2.0315 * a @ a) @ x
    return x.T if tall else x


def scale_of(rule, rows, cols):
    """Keller Jordan's (original); Moonlight's / Dion's rms_norm (match_rms_adamw, rms); Dion's
    spectral_norm (spectral)."""
    if rule == "original":
        return math.sqrt(max(1.0, rows / cols))
    if rule in ("match_rms_adamw", "rms"):
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(rows / cols)


def reference_step(p0, grad, blocks, rule="original", h=HYPER):
    """One Muon step from zero momentum, in float64: `blocks` are (row0, rows) of the [R, C]
    view (an expert stack [E, r, c] is E blocks of r rows)."""
    p = p0.double().reshape(-1, p0.shape[-1]).clone()
    g = grad.double().reshape(p.shape)
    beta = h["momentum"]
    m = (1 - beta) * g
    u = (1 - beta) * g + beta * m
    p *= 1 - h["lr"] * h["weight_decay"]
    for row0, rows in blocks:
        o = ns5(u[row0:row0 + rows])
        p[row0:row0 + rows] -= h["lr"] * scale_of(rule, rows, p.shape[1]) * o
    return p.reshape(p0.shape)


def rel(a, b):
    return (a.double() - b.double()).norm().item() / max(b.double().norm().item(), 1e-30)


def one_step(named, grads, **kw):
    opt = zmuon.Muon(named, **dict(HYPER, **kw))
    for name, p in named:
        p.grad = grads[name].clone()
    opt.step()
    return opt


class MuonBlocks(unittest.TestCase):

    def setUp(self):
        self.gen = torch.Generator().manual_seed(0)

    def randn(self, *shape):
        return torch.randn(*shape, generator=self.gen)

    def check_update(self, p0, p, want, what):
        err = rel(p.detach() - p0, want - p0.double())
        print(f"  {what}: update rel {err:.2e}")
        self.assertLessEqual(err, TOL)

    def test_a_3d_tensor_is_an_expert_stack_by_default(self):
        p0 = self.randn(4, 12, 20) * 0.1
        g = self.randn(4, 12, 20)
        w = nn.Parameter(p0.clone())
        one_step([("experts.w", w)], {"experts.w": g})
        want = reference_step(p0, g, [(12 * e, 12) for e in range(4)])
        self.check_update(p0, w, want, "expert stack [4, 12, 20]")
        # views={"...": "flatten"} is one [4, 240] matrix: a different update.
        flat = nn.Parameter(p0.clone())
        one_step([("experts.w", flat)], {"experts.w": g}, views={"experts.w": "flatten"})
        self.assertGreater(rel(flat.detach() - p0, want - p0.double()), 1e-2)

    def test_split_sizes_with_heads_per_block_and_spectral(self):
        p0 = self.randn(40, 16) * 0.1
        g = self.randn(40, 16)
        for rule in ("spectral", "rms"):
            w = nn.Parameter(p0.clone())
            one_step([("qkv", w)], {"qkv": g}, split_sizes={"qkv": [16, 8, 16]},
                     heads={"qkv": [2, 2, 0]}, adjust_lr=rule)
            blocks = [(0, 8), (8, 8), (16, 4), (20, 4), (24, 16)]
            self.check_update(p0, w, reference_step(p0, g, blocks, rule),
                              f"split [16 (2 heads), 8 (2 heads), 16] x 16, {rule}")

    def test_adjust_lr_names_reach_the_group(self):
        w = nn.Parameter(self.randn(8, 24))
        opt = zmuon.Muon([("w", w)], adjust_lr="spectral", **HYPER)
        self.assertEqual(opt.param_groups[0]["adjust_lr"], "spectral")
        opt.param_groups[0]["adjust_lr"] = "rms"
        opt.param_groups[0]["qk_clip_tau"] = 3.0
        w.grad = self.randn(8, 24)
        opt.step()  # the group's values are checked and taken
        opt.param_groups[0]["adjust_lr"] = "spectrum"
        w.grad = self.randn(8, 24)
        with self.assertRaises(zmuon.InvalidArgument):
            opt.step()

    def test_qk_clip_scales_heads_over_tau_by_the_max_of_all_reports(self):
        # q: 4 heads of 4 rows, k: 2 heads (GQA groups {0, 1}, {2, 3}); tau 5.
        q0, k0 = self.randn(16, 12) * 0.1, self.randn(8, 12) * 0.1
        gq, gk = self.randn(16, 12), self.randn(8, 12)

        def run(tau, reports):
            q, k = nn.Parameter(q0.clone()), nn.Parameter(k0.clone())
            opt = zmuon.Muon([("q", q), ("k", k)], qk_clip={"q": ("k", 4, 2)},
                             qk_clip_tau=tau, **HYPER)
            for r in reports:
                opt.report_qk_logits("q", torch.tensor(r))
            q.grad, k.grad = gq.clone(), gk.clone()
            opt.step()
            return q.detach().clone(), k.detach().clone()

        reports = [[1.0, 20.0, 2.0, 3.0], [2.0, 1.0, 4.0, 8.0]]  # two micro-batches
        q_plain, k_plain = run(0.0, reports)
        q_clip, k_clip = run(5.0, reports)
        f1, f3 = math.sqrt(5 / 20), math.sqrt(5 / 8)
        for got, plain, rows, f, what in ((q_clip, q_plain, slice(4, 8), f1, "q head 1"),
                                          (q_clip, q_plain, slice(12, 16), f3, "q head 3"),
                                          (k_clip, k_plain, slice(0, 4), f1, "k head 0"),
                                          (k_clip, k_plain, slice(4, 8), f3, "k head 1")):
            err = rel(got[rows], plain[rows].double() * f)
            print(f"  {what} scaled by {f:.4f}: rel {err:.2e}")
            self.assertLessEqual(err, 1e-6)
        # Heads below tau: bit for bit.
        self.assertTrue(torch.equal(q_clip[0:4], q_plain[0:4]))
        self.assertTrue(torch.equal(q_clip[8:12], q_plain[8:12]))

    def test_qk_clip_errors(self):
        q, k = nn.Parameter(self.randn(16, 12)), nn.Parameter(self.randn(8, 12))
        with self.assertRaises(zmuon.InvalidArgument):
            zmuon.Muon([("q", q), ("k", k)], qk_clip={"q": "k"})  # no head counts
        opt = zmuon.Muon([("q", q), ("k", k)], qk_clip={"q": "k"}, heads={"q": 4, "k": 2})
        with self.assertRaises(zmuon.ShapeMismatch):
            opt.report_qk_logits("q", [1.0, 2.0])
        with self.assertRaises(zmuon.InvalidArgument):
            opt.report_qk_logits("k", [1.0, 2.0])


if __name__ == "__main__":
    unittest.main()
