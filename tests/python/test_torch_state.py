"""zmuon.Muon's optimizer state in torch's shape: opt.state and state_dict() / load_state_dict().
A resume through the dict is bit-identical on the same rank count and within 1e-6 across rank
counts; the dict survives torch.save / torch.load and has torch.optim.Muon's and AdamW's keys,
shapes and values; a bad dict raises naming what is wrong and changes nothing.

Run by ctest with the venv's python (.venv, made by .ci/deps --tests); without PyTorch it fails.
"""

import copy
import io
import unittest

import torch
import torch.nn as nn

import zmuon
from test_torch_optim import fp32_newton_schulz  # zmuon's contract, in float32

torch.set_num_threads(2)

# Resharding changes the order of the gradient mean's sums: the tolerance after continuing.
RESHARD_TOL = 1e-6


class Small(nn.Module):
    """An embedding (AdamW), two hidden matrices (Muon), biases and a head (AdamW)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.fc1 = nn.Linear(16, 48)
        self.fc2 = nn.Linear(48, 16)
        self.lm_head = nn.Linear(16, 32, bias=False)

    def forward(self, idx):
        return self.lm_head(torch.tanh(self.fc2(torch.relu(self.fc1(self.embed(idx))))))


def tokens(step, rank=0):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, 32, (4, 9), generator=g)


def loss_of(model, t):
    logits = model(t[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, 32), t[:, 1:].reshape(-1))


def train(model, opt, steps, per_rank=True):
    """Steps `steps` (an iterable of step numbers): each rank its own batch (per_rank), or every
    rank the same one (then the mean over ranks is that gradient, whatever the rank count)."""
    for s in steps:
        for r in range(opt.world):
            opt.zero_grad()
            loss_of(model, tokens(s, r if per_rank else 0)).backward()
            opt.accumulate(rank=r)
        opt.zero_grad()
        opt.step()


HYPER = dict(lr=0.02, adam_lr=3e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
             betas=(0.9, 0.95), eps=1e-8, ns_steps=5)


def make(seed, ranks=1):
    torch.manual_seed(seed)
    model = Small()
    return model, zmuon.Muon(model.named_parameters(), ranks=ranks, **HYPER)


def through_bytes(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def rel(a, b):
    return (a.double() - b.double()).norm().item() / max(b.double().norm().item(), 1e-30)


def same(a, b):
    """The names of the parameters that differ in any bit."""
    return [n for (n, x), (_, y) in zip(a.named_parameters(), b.named_parameters())
            if not torch.equal(x.detach(), y.detach())]


class StateDictTest(unittest.TestCase):

    def test_resume_is_bit_identical_on_the_same_rank_count(self):
        for ranks in (1, 4):
            with self.subTest(ranks=ranks):
                straight, opt = make(0, ranks)
                train(straight, opt, range(1, 7))
                first, opt = make(0, ranks)
                train(first, opt, range(1, 4))
                sd = through_bytes(opt.state_dict())
                resumed, opt2 = make(5, ranks)  # other initial values: the masters overwrite them
                opt2.load_state_dict(sd)
                self.assertEqual(same(resumed, first), [])
                self.assertEqual(opt2.state_dict()["param_groups"][0]["zmuon"]["step"], 3)
                train(resumed, opt2, range(4, 7))
                self.assertEqual(same(resumed, straight), [])
                print(f"\n  ranks {ranks}: resumed after 3 of 6 steps, every parameter equal to "
                      "the uninterrupted run bit for bit")

    def test_resharding_four_ranks_to_two(self):
        straight, opt = make(0, 4)
        train(straight, opt, range(1, 7), per_rank=False)
        first, opt = make(0, 4)
        train(first, opt, range(1, 4), per_rank=False)
        sd = through_bytes(opt.state_dict())
        resumed, opt2 = make(5, 2)
        opt2.load_state_dict(sd)
        back = opt2.state_dict()  # the state itself moves over exactly
        for i, entry in sd["state"].items():
            for k, v in entry.items():
                self.assertTrue(torch.equal(back["state"][i][k], v), (i, k))
        train(resumed, opt2, range(4, 7), per_rank=False)
        worst = 0.0
        for (n, a), (_, b) in zip(resumed.named_parameters(), straight.named_parameters()):
            e = rel(a.detach(), b.detach())
            worst = max(worst, e)
            self.assertLessEqual(e, RESHARD_TOL, n)
        print(f"\n  4 ranks -> 2 ranks after 3 steps, 3 more: worst parameter rel {worst:.2e} "
              f"(tolerance {RESHARD_TOL:.0e}); state after the load equal bit for bit")

    def test_keys_shapes_and_values_are_torchs(self):
        import torch.optim._muon as torch_muon
        model, opt = make(0)
        ref = copy.deepcopy(model)
        muon_ps = [p for n, p in ref.named_parameters() if p.ndim == 2 and "embed" not in n
                   and "lm_head" not in n]
        adam_ps = [p for n, p in ref.named_parameters() if all(p is not q for q in muon_ps)]
        h = HYPER
        ref_opts = [torch.optim.Muon(muon_ps, lr=h["lr"], weight_decay=h["weight_decay"],
                                     momentum=h["momentum"], nesterov=True, ns_steps=5, eps=1e-7),
                    torch.optim.AdamW(adam_ps, lr=h["adam_lr"], betas=h["betas"], eps=h["eps"],
                                      weight_decay=h["weight_decay"])]
        saved = torch_muon._zeropower_via_newtonschulz
        torch_muon._zeropower_via_newtonschulz = fp32_newton_schulz
        try:
            for s in (1, 2, 3):
                for o in ref_opts:
                    o.zero_grad()
                loss_of(ref, tokens(s)).backward()
                for o in ref_opts:
                    o.step()
                opt.zero_grad()
                loss_of(model, tokens(s)).backward()
                opt.step()
        finally:
            torch_muon._zeropower_via_newtonschulz = saved
        sd = through_bytes(opt.state_dict())
        self.assertEqual(set(sd), {"state", "param_groups", "zmuon"})
        names = [n for g in sd["param_groups"] for n in g["param_names"]]
        self.assertEqual([i for g in sd["param_groups"] for i in g["params"]],
                         list(range(len(names))))
        params = dict(model.named_parameters())
        ref_state = {id(p): o.state[p] for o in ref_opts for p in o.state}
        ref_params = dict(ref.named_parameters())
        worst = 0.0
        for i, name in enumerate(names):
            mine, theirs = sd["state"][i], ref_state[id(ref_params[name])]
            self.assertEqual(set(mine), set(theirs), name)
            for k, v in mine.items():
                self.assertEqual(v.shape, theirs[k].shape, (name, k))
                self.assertEqual(v.dtype, theirs[k].dtype, (name, k))
                if k == "step":
                    self.assertEqual(v.item(), theirs[k].item())
                else:
                    worst = max(worst, rel(v, theirs[k]))
                    self.assertLess(rel(v, theirs[k]), 1e-4, (name, k))
            live = opt.state[params[name]]  # opt.state: the same values, read lazily
            for k, v in mine.items():
                self.assertTrue(torch.equal(live[k], v), (name, k))
        self.assertEqual(len(opt.state), len(names))
        self.assertTrue(torch.equal(sd["zmuon"]["masters"][0],
                                    params[names[0]].detach()))
        print(f"\n  keys, shapes and dtypes as torch.optim.Muon / AdamW; worst state rel "
              f"{worst:.2e} after 3 steps")

    def test_opt_state_follows_each_step(self):
        model, opt = make(0)
        fc1 = dict(model.named_parameters())["fc1.weight"]
        train(model, opt, (1,))
        before = opt.state[fc1]["momentum_buffer"].clone()
        self.assertGreater(before.abs().max().item(), 0)
        self.assertEqual(opt.state["fc1.weight"]["momentum_buffer"].shape, fc1.shape)
        train(model, opt, (2,))
        self.assertFalse(torch.equal(opt.state[fc1]["momentum_buffer"], before))
        self.assertEqual(opt.state[dict(model.named_parameters())["embed.weight"]]["step"].item(),
                         2.0)

    def test_a_bad_dict_raises_and_changes_nothing(self):
        model, opt = make(0)
        train(model, opt, (1, 2))
        sd = opt.state_dict()
        other, opt2 = make(7)
        train(other, opt2, (1,))
        kept = {n: p.detach().clone() for n, p in other.named_parameters()}
        kept_state = opt2.state_dict()

        def without(d, *path):
            d = copy.deepcopy(d)
            inner = d
            for k in path[:-1]:
                inner = inner[k]
            del inner[path[-1]]
            return d

        transposed = copy.deepcopy(sd)
        transposed["state"][0]["momentum_buffer"] = transposed["state"][0]["momentum_buffer"].T
        adam_index = next(i for i, e in sd["state"].items() if "exp_avg" in e)
        short = copy.deepcopy(sd)
        short["state"][adam_index]["exp_avg_sq"] = short["state"][adam_index]["exp_avg_sq"][:1]
        nan = copy.deepcopy(sd)
        nan["state"][0]["momentum_buffer"][0, 0] = float("nan")
        cases = [
            (without(sd, "param_groups", 0, "zmuon"), zmuon.InvalidArgument,
             "param_groups[0]['zmuon'] has no 'step'"),
            (without(sd, "state", adam_index, "exp_avg"), zmuon.InvalidArgument,
             f"state[{adam_index}] (parameter"),
            (without(sd, "state", 1), zmuon.InvalidArgument, "no entry 1"),
            (transposed, zmuon.ShapeMismatch, "['momentum_buffer'] has shape (16, 48)"),
            (short, zmuon.ShapeMismatch, "['exp_avg_sq'] has shape"),
            (nan, zmuon.InvalidArgument, "momentum holds nan"),
            (dict(sd, param_groups=sd["param_groups"][:1]), zmuon.InvalidArgument,
             "'param_groups' must list 2 groups"),
        ]
        for bad, error, text in cases:
            with self.assertRaises(error) as cm:
                opt2.load_state_dict(bad)
            self.assertIn(text, str(cm.exception))
            print(f"\n  {type(cm.exception).__name__}: {cm.exception}", end="")
            for n, p in other.named_parameters():
                self.assertTrue(torch.equal(p.detach(), kept[n]), n)
            now = opt2.state_dict()
            self.assertEqual(now["param_groups"][0]["zmuon"]["step"], 1)
            for i, entry in kept_state["state"].items():
                for k, v in entry.items():
                    self.assertTrue(torch.equal(now["state"][i][k], v), (text, i, k))
        opt2.load_state_dict(sd)  # the good one still loads
        self.assertEqual(same(other, model), [])
        print()


if __name__ == "__main__":
    unittest.main()
