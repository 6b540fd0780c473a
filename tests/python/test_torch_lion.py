"""A param group with algorithm="lion" (Dion's key; Lion: arXiv:2302.06675, as Dion's
scalar_opts.lion_update) on the CPU against a float64 Lion written here: its lr, betas and
weight_decay, decoupled decay, the Muon group beside it unchanged by the choice.

Run by ctest with the venv's python (.venv); without PyTorch it fails.
"""

import unittest

import torch

import zmuon
from test_torch_cautious_normuon import data, model  # the same small net and batches

torch.set_num_threads(2)

TOL = 1e-6  # relative Frobenius error per parameter; a flipped sign would cost 2*lr, ~1e-2


def groups(net, algorithm, lr=0.003, betas=(0.9, 0.99), weight_decay=0.5):
    weights = [(n, p) for n, p in net.named_parameters() if p.ndim == 2]
    biases = [(n, p) for n, p in net.named_parameters() if p.ndim == 1]
    return [{"params": weights, "use_muon": True},
            {"params": biases, "use_muon": False, "algorithm": algorithm, "lr": lr,
             "betas": betas, "weight_decay": weight_decay}]


def train(algorithm, steps=4, **rule):
    """The model after `steps` steps, and a float64 Lion of its biases from the same gradients."""
    net = model()
    opt = zmuon.Muon(groups(net, algorithm, **rule), lr=0.05, ns_variant="standard")
    lr, (b1, b2), wd = rule.get("lr", 0.003), rule.get("betas", (0.9, 0.99)), \
        rule.get("weight_decay", 0.5)
    ref = {n: p.detach().double().clone() for n, p in net.named_parameters() if p.ndim == 1}
    m = {n: torch.zeros_like(p) for n, p in ref.items()}
    for x, y in data(steps):
        opt.zero_grad()
        ((net(x) - y) ** 2).mean().backward()
        grads = {n: p.grad.detach().double().clone() for n, p in net.named_parameters()}
        opt.step()
        for n, p in ref.items():
            u = torch.sign(b1 * m[n] + (1 - b1) * grads[n])
            m[n] = b2 * m[n] + (1 - b2) * grads[n]
            ref[n] = p * (1 - lr * wd) - lr * u
    return net, ref


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


class Lion(unittest.TestCase):
    def test_lion_group_matches_the_reference(self):
        net, ref = train("lion")
        params = dict(net.named_parameters())
        for n, want in ref.items():
            e = rel(params[n].detach(), want)
            print(f"  lion {n:10s} param rel {e:.2e}")
            self.assertLessEqual(e, TOL)

    def test_the_rule_reads_its_groups_betas(self):
        # Lion moves each element by +-lr: other betas change the weights only once some sign
        # differs, here after 12 steps (0.02 relative in the reference).
        net, ref = train("lion", steps=12, betas=(0.5, 0.9))
        other, other_ref = train("lion", steps=12)
        params, others = dict(net.named_parameters()), dict(other.named_parameters())
        for n, want in ref.items():
            self.assertLessEqual(rel(params[n].detach(), want), TOL)
            self.assertLessEqual(rel(others[n].detach(), other_ref[n]), TOL)
            self.assertGreater(rel(want, other_ref[n]), 1e-3, n)

    def test_the_muon_group_does_not_see_the_choice(self):
        # After one step (the same gradients) the Muon weights are the same bits; Lion's first
        # step is AdamW's sign-like one, so the rules part only later.
        lion, _ = train("lion", steps=1)
        adamw, _ = train("adamw", steps=1)
        for (n, a), (_, b) in zip(lion.named_parameters(), adamw.named_parameters()):
            if a.ndim == 2:
                self.assertTrue(torch.equal(a, b), n)
        lion, _ = train("lion", steps=12)
        adamw, _ = train("adamw", steps=12)
        for (n, a), (_, b) in zip(lion.named_parameters(), adamw.named_parameters()):
            if a.ndim == 1:
                self.assertGreater(rel(a.detach(), b.detach()), 1e-3, n)

    def test_an_unknown_algorithm_is_named(self):
        net = model()
        with self.assertRaisesRegex(zmuon.InvalidArgument,
                                    r"\['algorithm'\] must be one of muon, adamw, lion.*"
                                    r"did you mean 'lion'"):
            opt = zmuon.Muon(groups(net, "lino"), lr=0.05)
            x, y = data(1)[0]
            ((net(x) - y) ** 2).mean().backward()
            opt.step()


if __name__ == "__main__":
    unittest.main()
