"""zmuon.Muon's cautious_weight_decay= and variant="normuon" keywords on the CPU against a
float64 torch reference written here (cautious weight decay: arXiv:2510.12402; NorMuon:
arXiv:2510.05491 with Dion's Frobenius rescale), per param group, and state_dict() /
load_state_dict() carrying NorMuon's row moments ("variance_neuron").

Run by ctest with the venv's python (.venv); without PyTorch it fails.
"""

import copy
import math
import unittest

import torch
import torch.nn as nn

import zmuon

torch.set_num_threads(2)

TOL = 1e-5  # relative Frobenius error per parameter after the steps
NS5 = (3.4445, -4.7750, 2.0315)


def model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 20), nn.Tanh(), nn.Linear(20, 9), nn.Tanh(),
                         nn.Linear(9, 4))


def data(steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 12, generator=g), torch.randn(16, 4, generator=g))
            for _ in range(steps)]


def ns5(u):
    """Newton-Schulz in float64 as zmuon's contract states it: wide view, X / (||X|| + 1e-7),
    then 5 times X <- aX + (bA + cA^2)X with A = X X^T."""
    a, b, c = NS5
    x = u.double()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (x.norm() + 1e-7)
    for _ in range(5):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


class Reference:
    """Muon (Nesterov) for matrices and AdamW for the rest, in float64, with cautious weight decay
    (decay where p * update >= 0; Muon's update is the scaled orthogonalized one, AdamW's
    m_hat / (sqrt(v_hat) + eps)) and NorMuon (v = b2 v + (1-b2) mean_j O^2, O / (sqrt(v) + eps),
    then ||O||_F restored, then the sqrt(max(1, rows/cols)) scale)."""

    def __init__(self, net, lr, adam_lr, wd, cautious, normuon, beta2=0.95, eps=1e-8,
                 momentum=0.95, betas=(0.9, 0.95), adam_eps=1e-10):
        self.p = {n: p.detach().double().clone() for n, p in net.named_parameters()}
        self.m = {n: torch.zeros_like(p) for n, p in self.p.items()}
        self.v = {n: torch.zeros_like(p) for n, p in self.p.items()}
        self.rows = {n: torch.zeros(p.shape[0], 1, dtype=torch.float64)
                     for n, p in self.p.items() if p.ndim == 2}
        self.lr, self.adam_lr, self.wd = lr, adam_lr, wd
        self.cautious, self.normuon, self.beta2, self.eps = cautious, normuon, beta2, eps
        self.momentum, self.betas, self.adam_eps = momentum, betas, adam_eps
        self.t = 0

    def decay(self, p, update, lr):
        if not self.cautious:
            return p * (1 - lr * self.wd)
        return p - lr * self.wd * p * (p * update >= 0).double()

    def step(self, grads):
        self.t += 1
        for n, g in grads.items():
            g, p = g.double(), self.p[n]
            if p.ndim == 2:
                beta = self.momentum
                self.m[n] = beta * self.m[n] + (1 - beta) * g
                o = ns5((1 - beta) * g + beta * self.m[n])
                if self.normuon:
                    before = o.norm()
                    self.rows[n] = self.beta2 * self.rows[n] + (1 - self.beta2) * \
                        (o * o).mean(dim=1, keepdim=True)
                    o = o / (self.rows[n].sqrt() + self.eps)
                    o = o * (before / o.norm().clamp(min=1e-8))
                update = math.sqrt(max(1.0, p.shape[0] / p.shape[1])) * o
                self.p[n] = self.decay(p, update, self.lr) - self.lr * update
            else:
                b1, b2 = self.betas
                self.m[n] = b1 * self.m[n] + (1 - b1) * g
                self.v[n] = b2 * self.v[n] + (1 - b2) * g * g
                m_hat = self.m[n] / (1 - b1 ** self.t)
                v_hat = self.v[n] / (1 - b2 ** self.t)
                direction = m_hat / (v_hat.sqrt() + self.adam_eps)
                self.p[n] = self.decay(p, direction, self.adam_lr) - self.adam_lr * direction


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def keywords(cautious, normuon):
    h = dict(lr=0.05, adam_lr=0.01, weight_decay=1.5, ns_variant="standard",
             cautious_weight_decay=cautious)
    if normuon:
        h.update(variant="normuon", normuon_beta2=0.9, normuon_eps=1e-8)
    return h


def train_both(cautious, normuon, steps=4):
    net = model()
    ref = Reference(net, 0.05, 0.01, 1.5, cautious, normuon, beta2=0.9)
    opt = zmuon.Muon(net.named_parameters(), **keywords(cautious, normuon))
    for x, y in data(steps):
        opt.zero_grad()
        loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in net.named_parameters()}
        opt.step()
        ref.step(grads)
    return net, ref, opt


class CautiousAndNorMuon(unittest.TestCase):
    def check(self, cautious, normuon):
        net, ref, _ = train_both(cautious, normuon)
        worst = 0.0
        for n, p in net.named_parameters():
            e = rel(p.detach(), ref.p[n])
            print(f"  cautious={cautious} normuon={normuon} {n:10s} param rel {e:.2e}")
            worst = max(worst, e)
        self.assertLessEqual(worst, TOL)
        return ref

    def test_cautious_weight_decay_matches_the_reference(self):
        with_rule = self.check(True, False)
        plain = Reference(model(), 0.05, 0.01, 1.5, False, False)
        for x, y in data(4):
            net = model()  # the gradients of the plain run, from its own weights
            with torch.no_grad():
                for n, p in net.named_parameters():
                    p.copy_(plain.p[n])
            loss = ((net(x) - y) ** 2).mean()
            loss.backward()
            plain.step({n: p.grad for n, p in net.named_parameters()})
        effect = max(rel(with_rule.p[n], plain.p[n]) for n in plain.p)
        print(f"  cautious vs plain weight decay (reference): {effect:.3e}")
        self.assertGreater(effect, 1e-3)  # the rule changes the weights far beyond TOL

    def test_normuon_matches_the_reference(self):
        self.check(False, True)

    def test_both_match_the_reference(self):
        self.check(True, True)

    def test_param_groups_carry_the_rule(self):
        net = model()
        weights = [(n, p) for n, p in net.named_parameters() if p.ndim == 2]
        biases = [(n, p) for n, p in net.named_parameters() if p.ndim == 1]
        opt = zmuon.Muon([{"params": weights, "use_muon": True, "variant": "normuon",
                           "cautious_weight_decay": True},
                          {"params": biases, "use_muon": False}],
                         weight_decay=0.5)
        self.assertEqual(opt.param_groups[0]["variant"], "normuon")
        self.assertTrue(opt.param_groups[0]["cautious_weight_decay"])
        self.assertEqual(opt.param_groups[1]["variant"], "muon")
        self.assertFalse(opt.param_groups[1]["cautious_weight_decay"])
        self.assertEqual(opt.param_groups[0]["normuon_beta2"], 0.95)
        opt.param_groups[0]["variant"] = "normuonn"
        x, y = data(1)[0]
        ((net(x) - y) ** 2).mean().backward()
        with self.assertRaisesRegex(zmuon.InvalidArgument,
                                    r"param_groups\[0\]\['variant'\] must be one of muon, "
                                    r"normuon.*did you mean 'normuon'"):
            opt.step()
        opt.param_groups[0]["variant"] = "normuon"
        opt.param_groups[0]["normuon_beta2"] = 1.0
        with self.assertRaisesRegex(zmuon.InvalidArgument, r"normuon_beta2"):
            opt.step()
        with self.assertRaisesRegex(zmuon.InvalidArgument, r"variant"):
            zmuon.Muon(model().named_parameters(), variant="adam")

    def test_state_dict_carries_the_row_moments(self):
        net, ref, opt = train_both(True, True, steps=3)
        sd = opt.state_dict()
        names = [n for g in sd["param_groups"] for n in g["param_names"]]  # torch's index order
        for i, n in enumerate(names):
            entry = sd["state"][i]
            if n.endswith("weight"):
                rows = entry["variance_neuron"]
                self.assertEqual(tuple(rows.shape), (ref.p[n].shape[0], 1))
                self.assertLessEqual(rel(rows, ref.rows[n]), TOL)
            else:
                self.assertNotIn("variance_neuron", entry)
        # Resumed from the state_dict, a twin continues as the original.
        twin = model()
        twin.load_state_dict(net.state_dict())
        opt2 = zmuon.Muon(twin.named_parameters(), **keywords(True, True))
        opt2.load_state_dict(copy.deepcopy(sd))
        sd2 = opt2.state_dict()
        for i in sd["state"]:
            for k, v in sd["state"][i].items():
                self.assertTrue(torch.equal(v, sd2["state"][i][k]), f"state[{i}][{k!r}]")
        for x, y in data(2, seed=5):
            for o, m in ((opt, net), (opt2, twin)):
                o.zero_grad()
                ((m(x) - y) ** 2).mean().backward()
                o.step()
        for (n, a), (_, b) in zip(net.named_parameters(), twin.named_parameters()):
            self.assertTrue(torch.equal(a, b), n)
        # Dropping the row moments changes the resumed run: the check can fail.
        dropped = copy.deepcopy(sd)
        for entry in dropped["state"].values():
            entry.pop("variance_neuron", None)
        third = model()
        third.load_state_dict(net.state_dict())
        opt3 = zmuon.Muon(third.named_parameters(), **keywords(True, True))
        opt3.load_state_dict(dropped)
        self.assertTrue(all(float(e["variance_neuron"].abs().sum()) == 0.0
                            for e in opt3.state_dict()["state"].values()
                            if "variance_neuron" in e))
        bad = copy.deepcopy(sd)
        bad["state"][0]["variance_neuron"] = bad["state"][0]["variance_neuron"][:3]
        with self.assertRaisesRegex(zmuon.ShapeMismatch, "variance_neuron"):
            opt3.load_state_dict(bad)


if __name__ == "__main__":
    unittest.main()
