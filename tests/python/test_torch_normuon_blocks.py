"""zmuon.Muon's variant="normuon" on Muon blocks, on the CPU against a float64 NorMuon written
here (arXiv:2510.05491 with Dion's Frobenius restore, per NS matrix): a 3-D expert stack and a
split_sizes matrix with heads, each block normalized with its own row moments; state_dict()'s
"variance_neuron" of an expert stack is (E, r, 1), and a state_dict taken at 3 ranks resumes at
2 ranks as the original run.

Run by ctest with the venv's python (.venv); without PyTorch it fails.
"""

import copy
import math
import unittest

import torch

import zmuon

torch.set_num_threads(2)

TOL = 1e-5  # relative Frobenius error against the float64 reference
HYPER = dict(lr=0.02, adam_lr=3e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
             ns_variant="standard", variant="normuon", normuon_beta2=0.9)


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


class Reference:
    """Muon + NorMuon in float64 on one parameter's [R, C] view; `matrices` are the (row0, rows)
    Newton-Schulz sees (an expert, a head of a split block)."""

    def __init__(self, p0, matrices, h=HYPER):
        self.shape = p0.shape
        self.p = p0.double().reshape(-1, p0.shape[-1]).clone()
        self.m = torch.zeros_like(self.p)
        self.v = torch.zeros(self.p.shape[0], dtype=torch.float64)
        self.matrices, self.h = matrices, h

    def step(self, grad):
        h, beta, b2 = self.h, self.h["momentum"], self.h["normuon_beta2"]
        g = grad.double().reshape(self.p.shape)
        self.m = beta * self.m + (1 - beta) * g
        u = (1 - beta) * g + beta * self.m
        self.p *= 1 - h["lr"] * h["weight_decay"]
        cols = self.p.shape[1]
        for row0, rows in self.matrices:
            o = ns5(u[row0:row0 + rows])
            v = self.v[row0:row0 + rows]
            v.mul_(b2).add_((1 - b2) * (o * o).mean(dim=1))
            n = o / (v.sqrt() + 1e-8)[:, None]
            n = n * (o.norm() / max(n.norm().item(), 1e-8))
            self.p[row0:row0 + rows] -= h["lr"] * math.sqrt(max(1.0, rows / cols)) * n
        return self.p.reshape(self.shape)


def rel(a, b):
    return (a.double() - b.double()).norm().item() / max(b.double().norm().item(), 1e-30)


class NorMuonBlocks(unittest.TestCase):

    def setUp(self):
        self.gen = torch.Generator().manual_seed(0)

    def randn(self, *shape):
        return torch.randn(*shape, generator=self.gen)

    def run_steps(self, opt, params, grads):
        """Every rank hands over the same gradient, so that each step's mean is it."""
        for g in grads:
            opt.accumulate_all([{name: g[name].clone() for name, _ in params}] * opt.world)
            opt.step()

    def test_expert_stack_and_split_blocks_match_a_float64_normuon_per_block(self):
        experts = torch.nn.Parameter(0.1 * self.randn(4, 12, 20))
        qkv = torch.nn.Parameter(0.1 * self.randn(40, 16))
        named = [("experts", experts), ("qkv", qkv)]
        refs = {"experts": Reference(experts.detach(), [(12 * e, 12) for e in range(4)]),
                "qkv": Reference(qkv.detach(), [(0, 8), (8, 8), (16, 8), (24, 16)])}
        opt = zmuon.Muon(named, ranks=3, split_sizes={"qkv": [16, 8, 16]},
                         heads={"qkv": [2, 1, 0]}, **HYPER)
        grads = [{"experts": self.randn(4, 12, 20), "qkv": self.randn(40, 16)} for _ in range(3)]
        self.run_steps(opt, named, grads)
        for name, p in named:
            for g in grads:
                want = refs[name].step(g[name])
            err = rel(p.detach(), want)
            print(f"NorMuon on {name} {tuple(p.shape)}, 3 ranks, 3 steps vs float64: {err:.2e}")
            self.assertLessEqual(err, TOL)
        sd = opt.state_dict()
        rows = sd["state"][0]["variance_neuron"]
        self.assertEqual(tuple(rows.shape), (4, 12, 1))
        err = rel(rows.reshape(-1), refs["experts"].v)
        print(f"variance_neuron of the expert stack vs float64: {err:.2e}")
        self.assertLessEqual(err, TOL)
        self.assertEqual(tuple(sd["state"][1]["variance_neuron"].shape), (40, 1))
        self.assertLessEqual(rel(sd["state"][1]["variance_neuron"].reshape(-1), refs["qkv"].v),
                             TOL)

    def test_state_dict_of_an_expert_stack_resumes_at_another_rank_count(self):
        experts = torch.nn.Parameter(0.1 * self.randn(6, 8, 12))
        grads = [{"experts": self.randn(6, 8, 12)} for _ in range(5)]
        opt = zmuon.Muon([("experts", experts)], ranks=3, **HYPER)
        self.run_steps(opt, [("experts", experts)], grads[:2])
        sd = copy.deepcopy(opt.state_dict())
        start = experts.detach().clone()
        self.run_steps(opt, [("experts", experts)], grads[2:])
        twin = torch.nn.Parameter(start.clone())
        opt2 = zmuon.Muon([("experts", twin)], ranks=2, **HYPER)
        opt2.load_state_dict(copy.deepcopy(sd))
        self.assertTrue(torch.equal(opt2.state_dict()["state"][0]["variance_neuron"],
                                    sd["state"][0]["variance_neuron"]))
        self.run_steps(opt2, [("experts", twin)], grads[2:])
        err = rel(twin.detach(), experts.detach())
        print(f"expert stack state_dict from 3 ranks resumed at 2: {err:.2e}")
        self.assertLessEqual(err, 1e-6)
        # Without the row moments the resumed run differs: the check can fail.
        dropped = copy.deepcopy(sd)
        dropped["state"][0].pop("variance_neuron")
        third = torch.nn.Parameter(start.clone())
        opt3 = zmuon.Muon([("experts", third)], ranks=2, **HYPER)
        opt3.load_state_dict(dropped)
        self.run_steps(opt3, [("experts", third)], grads[2:])
        self.assertGreaterEqual(rel(third.detach(), experts.detach()), 1e-4)
        bad = copy.deepcopy(sd)
        bad["state"][0]["variance_neuron"] = bad["state"][0]["variance_neuron"].reshape(-1, 1)
        with self.assertRaisesRegex(zmuon.ShapeMismatch, "variance_neuron"):
            opt3.load_state_dict(bad)


if __name__ == "__main__":
    unittest.main()
