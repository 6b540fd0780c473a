"""zmuon.Muon as a torch.optim.Optimizer, on the CPU: parity with torch.optim.Muon +
torch.optim.AdamW on a small transformer, every lr_scheduler driving both groups (read back from
the updates), the Optimizer protocol (closure, zero_grad, hooks, add_param_group, errors),
GradScaler and torch.compile.

Run by ctest with the venv's python (.venv, made by .ci/deps --tests); without PyTorch it fails.
"""

import math
import pickle
import subprocess
import sys
import tempfile
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

import zmuon

torch.set_num_threads(2)

# The tolerance of the parity run: relative Frobenius error per parameter after 20 steps.
PARITY_TOL = 1e-5


class TinyTransformer(nn.Module):
    """Token and position embeddings, one pre-norm block (attention, MLP), a final norm and an
    untied lm_head."""

    def __init__(self, vocab=64, dim=32, heads=4, ctx=16):
        super().__init__()
        self.heads = heads
        self.tok_embed = nn.Embedding(vocab, dim)
        self.pos_embed = nn.Embedding(ctx, dim)
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)  # a key bias gets only rounding noise
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        b, t = idx.shape
        x = self.tok_embed(idx) + self.pos_embed(torch.arange(t))
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        x = x + self.out(F.gelu(self.fc(self.ln2(x))))
        return self.lm_head(self.ln_f(x))


def uses_muon(name, p):
    """zmuon's default rule."""
    return p.ndim >= 2 and "embed" not in name and "lm_head" not in name


def batches(steps, seed=0, batch=4, ctx=16, vocab=64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, ctx + 1), generator=g) for _ in range(steps)]


def lm_loss(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def fp32_newton_schulz(grad, ns_coefficients, ns_steps, eps):
    """torch.optim.Muon's Newton-Schulz as zmuon's contract states it: float32 (torch's own
    rounds to bfloat16), wide view, X / (||X|| + eps) (torch: X / max(||X||, eps), the same
    where ||X|| >> eps), then X <- aX + (bA + cA^2)X."""
    a, b, c = ns_coefficients
    x = grad.float()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (x.norm() + eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def rel(a, b):
    return (a.double() - b.double()).norm().item() / max(b.double().norm().item(), 1e-30)


HYPER = dict(lr=0.02, adam_lr=3e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
             betas=(0.9, 0.95), eps=1e-8, ns_steps=5, ns_variant="standard")


def torch_pair(model, rule=uses_muon, **overrides):
    """torch.optim.Muon + AdamW with HYPER over `model` (or (name, tensor) pairs), split by
    `rule(name, p)`: the reference every parity test steps beside zmuon.Muon."""
    h = dict(HYPER, **overrides)
    named = list(model.named_parameters() if isinstance(model, nn.Module) else model)
    muon = [p for n, p in named if rule(n, p)]
    adam = [p for n, p in named if not rule(n, p)]
    return [torch.optim.Muon(muon, lr=h["lr"], weight_decay=h["weight_decay"],
                             momentum=h["momentum"], nesterov=h["nesterov"],
                             ns_steps=h["ns_steps"], eps=1e-7),
            torch.optim.AdamW(adam, lr=h["adam_lr"], betas=h["betas"], eps=h["eps"],
                              weight_decay=h["weight_decay"])]


class ParityWithTorch(unittest.TestCase):

    def test_twenty_steps_match_torch_muon_and_adamw(self):
        import torch.optim._muon as torch_muon
        torch.manual_seed(0)
        ref = TinyTransformer()
        ours = TinyTransformer()
        ours.load_state_dict(ref.state_dict())
        start = {n: p.detach().clone() for n, p in ref.named_parameters()}
        h = HYPER
        muon_params = [p for n, p in ref.named_parameters() if uses_muon(n, p)]
        adam_params = [p for n, p in ref.named_parameters() if not uses_muon(n, p)]
        ref_opts = [torch.optim.Muon(muon_params, lr=h["lr"], weight_decay=h["weight_decay"],
                                     momentum=h["momentum"], nesterov=h["nesterov"],
                                     ns_steps=h["ns_steps"], eps=1e-7),
                    torch.optim.AdamW(adam_params, lr=h["adam_lr"], betas=h["betas"],
                                      eps=h["eps"], weight_decay=h["weight_decay"])]
        opt = zmuon.Muon(ours.named_parameters(), **h)
        self.assertEqual([len(g["params"]) for g in opt.param_groups],
                         [len(muon_params), len(adam_params)])
        saved = torch_muon._zeropower_via_newtonschulz
        torch_muon._zeropower_via_newtonschulz = fp32_newton_schulz
        try:
            for tokens in batches(20):
                for o in ref_opts:
                    o.zero_grad()
                lm_loss(ref, tokens).backward()
                for o in ref_opts:
                    o.step()
                opt.zero_grad()
                lm_loss(ours, tokens).backward()
                opt.step()
        finally:
            torch_muon._zeropower_via_newtonschulz = saved
        worst, worst_update = 0.0, 0.0
        for (n, a), (_, b) in zip(ours.named_parameters(), ref.named_parameters()):
            e = rel(a.detach(), b.detach())
            u = rel(a.detach() - start[n], b.detach() - start[n])
            print(f"  {n:18s} {'muon ' if uses_muon(n, a) else 'adamw'} param rel {e:.2e}  "
                  f"update rel {u:.2e}")
            worst, worst_update = max(worst, e), max(worst_update, u)
            self.assertLessEqual(e, PARITY_TOL, n)
        print(f"parity after 20 steps: worst param rel {worst:.2e}, worst update rel "
              f"{worst_update:.2e} (tolerance {PARITY_TOL:g} on params)")


# -- per-group hyperparameters, read at every step ------------------------------------------------

MUON_A = ("qkv.weight", "proj.weight")
MUON_B = ("fc.weight", "out.weight")
ADAMW_A = ("tok_embed.weight", "pos_embed.weight", "lm_head.weight")

# Four groups, each with its own values: two Muon (A, B) and two AdamW (A: embeddings and head,
# B: norms and biases).
GROUPS = [dict(use_muon=True, lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True),
          dict(use_muon=True, lr=0.05, weight_decay=0.02, momentum=0.8, nesterov=False),
          dict(use_muon=False, lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8),
          dict(use_muon=False, lr=1e-3, weight_decay=0.0, betas=(0.8, 0.99), eps=1e-6)]

# (group, key, new value): each changed before its own step, one after another.
CHANGES = [(0, "lr", 0.01), (0, "weight_decay", 0.3), (0, "momentum", 0.6),
           (0, "nesterov", False), (0, "ns_steps", 3), (0, "ns_coefficients", (3.0, -3.2, 1.2)),
           (0, "eps", 0.5), (0, "adjust_lr", "match_rms_adamw"),
           (2, "lr", 1e-2), (2, "weight_decay", 0.5), (2, "betas", (0.5, 0.9)), (2, "eps", 1e-3)]
WARMUP = 2  # steps before the first change


def group_members(model):
    named = dict(model.named_parameters())
    members = [[], [], [], []]
    for n, p in named.items():
        k = 0 if n in MUON_A else 1 if n in MUON_B else 2 if n in ADAMW_A else 3
        members[k].append((n, p))
    return members


def torch_groups(model):
    """torch.optim.Muon + AdamW over GROUPS, and their param groups by GROUPS index."""
    members = group_members(model)
    muon, adamw = [], []
    for g, m in zip(GROUPS, members):
        values = {k: v for k, v in g.items() if k != "use_muon"}
        if g["use_muon"]:
            muon.append(dict(values, params=[p for _, p in m], ns_steps=5, eps=1e-7,
                             ns_coefficients=(3.4445, -4.7750, 2.0315), adjust_lr_fn=None))
        else:
            adamw.append(dict(values, params=[p for _, p in m]))
    opts = [torch.optim.Muon(muon), torch.optim.AdamW(adamw)]
    return opts, opts[0].param_groups + opts[1].param_groups


def zmuon_groups(model):
    members = group_members(model)
    return [dict(g, params=m, ns_variant="standard") for g, m in zip(GROUPS, members)]


def set_torch(group, key, value):
    group["adjust_lr_fn" if key == "adjust_lr" else key] = value


def fp32_ns():
    """Runs torch.optim.Muon with fp32_newton_schulz inside the with block."""
    import contextlib
    import torch.optim._muon as torch_muon

    @contextlib.contextmanager
    def patched():
        saved = torch_muon._zeropower_via_newtonschulz
        torch_muon._zeropower_via_newtonschulz = fp32_newton_schulz
        try:
            yield
        finally:
            torch_muon._zeropower_via_newtonschulz = saved
    return patched()


def reference_run(start, data, changes, skip=None):
    """The torch reference's parameters after each step, making `changes` (as CHANGES) before
    their steps, except change number `skip`."""
    model = TinyTransformer()
    model.load_state_dict(start)
    opts, groups = torch_groups(model)
    out = []
    with fp32_ns():
        for step, tokens in enumerate(data):
            k = step - WARMUP
            if 0 <= k < len(changes) and k != skip:
                g, key, value = changes[k]
                set_torch(groups[g], key, value)
            for o in opts:
                o.zero_grad()
            lm_loss(model, tokens).backward()
            for o in opts:
                o.step()
            out.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return out


class PerGroupHyperparameters(unittest.TestCase):
    """Every group's hyperparameters reach the engine at every step: four groups with their own
    values, then each key of CHANGES changed mid-run, against torch.optim.Muon + AdamW making
    the same changes."""

    def test_each_key_changed_mid_run_matches_torch(self):
        torch.manual_seed(0)
        model = TinyTransformer()
        start = {k: v.clone() for k, v in model.state_dict().items()}
        data = batches(WARMUP + len(CHANGES) + 1, seed=7)
        ref = reference_run(start, data, CHANGES)
        opt = zmuon.Muon(zmuon_groups(model))
        self.assertEqual(len(opt.param_groups), 4)
        print(f"{'step':>4s} {'change':32s} {'worst rel':>10s} {'effect':>10s}")
        for step, tokens in enumerate(data):
            k = step - WARMUP
            label = ""
            if 0 <= k < len(CHANGES):
                g, key, value = CHANGES[k]
                opt.param_groups[g][key] = value
                label = f"group {g} {key}={value}"
            opt.zero_grad()
            lm_loss(model, tokens).backward()
            opt.step()
            worst = max(rel(p.detach(), ref[step][n]) for n, p in model.named_parameters())
            effect = float("nan")
            if label:  # how far the reference moves without this change: the test can fail
                without = reference_run(start, data[:step + 1], CHANGES, skip=k)[step]
                effect = max(rel(without[n], ref[step][n]) for n in without)
                self.assertGreater(effect, 10 * PARITY_TOL, f"{label} changes too little")
            print(f"{step:4d} {label:32s} {worst:10.2e} {effect:10.2e}")
            self.assertLessEqual(worst, PARITY_TOL, f"step {step} ({label or 'no change'})")

    def test_two_muon_groups_with_their_own_lr_wd_momentum_match_torch(self):
        torch.manual_seed(3)
        model = TinyTransformer()
        start = {k: v.clone() for k, v in model.state_dict().items()}
        data = batches(10, seed=8)
        ref = reference_run(start, data, [])[-1]
        opt = zmuon.Muon(zmuon_groups(model))
        for tokens in data:
            opt.zero_grad()
            lm_loss(model, tokens).backward()
            opt.step()
        members = group_members(model)
        for g in (0, 1):
            worst = max(rel(p.detach(), ref[n]) for n, p in members[g])
            print(f"Muon group {g} (lr {GROUPS[g]['lr']}, wd {GROUPS[g]['weight_decay']}, "
                  f"momentum {GROUPS[g]['momentum']}): worst param rel after 10 steps "
                  f"{worst:.2e}")
            self.assertLessEqual(worst, PARITY_TOL)


# -- parameters without a gradient ----------------------------------------------------------------

class UntouchedParameters(unittest.TestCase):
    """torch.optim skips a parameter whose .grad is None: no momentum decay, no weight decay, no
    AdamW step. zmuon does the same for one no rank handed a gradient in a step, and counts a
    gradient missing from some micro-batches or ranks as zero there."""

    # Steps at which these parameters have no gradient (both optimizers).
    NONE_AT = {"fc.weight": {2, 3}, "lm_head.weight": {1, 3, 4}, "ln1.bias": {2}}

    def test_grad_none_leaves_the_parameter_as_torch_does(self):
        torch.manual_seed(5)
        model = TinyTransformer()
        start = {k: v.clone() for k, v in model.state_dict().items()}
        ref_model = TinyTransformer()
        ref_model.load_state_dict(start)
        ref_opts, _ = torch_groups(ref_model)
        opt = zmuon.Muon(zmuon_groups(model))
        data = batches(7, seed=9)
        print(f"{'step':>4s} {'no gradient':40s} {'worst rel':>10s}")
        with fp32_ns():
            for step, tokens in enumerate(data):
                none = sorted(n for n, at in self.NONE_AT.items() if step in at)
                for m, opts in ((ref_model, ref_opts), (model, [opt])):
                    for o in opts:
                        o.zero_grad()
                    lm_loss(m, tokens).backward()
                    named = dict(m.named_parameters())
                    for n in none:
                        named[n].grad = None
                    before = {n: named[n].detach().clone() for n in none}
                    for o in opts:
                        o.step()
                    moved = [n for n in none if not torch.equal(before[n], named[n].detach())]
                    self.assertEqual(moved, [], f"step {step}: moved without a gradient")
                worst = max(rel(p.detach(), dict(ref_model.named_parameters())[n].detach())
                            for n, p in model.named_parameters())
                print(f"{step:4d} {', '.join(none):40s} {worst:10.2e}")
                self.assertLessEqual(worst, PARITY_TOL, f"step {step}")
        # A checkpoint keeps each AdamW parameter's own step count (ln1.bias has one fewer):
        # a resumed run continues bit for bit.
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            opt.save_checkpoint(tmp)
            twin = TinyTransformer()
            twin.load_state_dict(model.state_dict())
            opt2 = zmuon.Muon(zmuon_groups(twin))
            opt2.load_checkpoint(tmp)
        tokens = batches(1, seed=10)[0]
        for m, o in ((model, opt), (twin, opt2)):
            o.zero_grad()
            lm_loss(m, tokens).backward()
            o.step()
        differ = [n for (n, a), (_, b) in zip(model.named_parameters(), twin.named_parameters())
                  if not torch.equal(a, b)]
        print(f"resumed from a checkpoint: {16 - len(differ)} of 16 parameters bit-identical")
        self.assertEqual(differ, [])

    def test_a_gradient_on_some_micro_batches_or_ranks_counts_zero_elsewhere(self):
        w0 = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
        b0 = torch.randn(4, generator=torch.Generator().manual_seed(2))
        g = torch.Generator().manual_seed(3)
        gw, gb = torch.randn(6, 4, generator=g), torch.randn(4, generator=g)
        hyper = dict(lr=0.05, adam_lr=0.01, weight_decay=0.1, ns_variant="standard")
        for ranks, micro in ((1, 2), (2, 1)):
            w, b = nn.Parameter(w0.clone()), nn.Parameter(b0.clone())
            opt = zmuon.Muon([("w", w), ("b", b)], ranks=ranks,
                             overrides=[f"gradient_accumulation_steps={micro}"], **hyper)
            for step in range(3):
                if ranks == 1:  # micro-batch 0 has both gradients, micro-batch 1 only w's
                    opt.accumulate(grads={"w": gw, "b": gb})
                    opt.accumulate(grads={"w": gw})
                else:  # rank 0 has both, rank 1 only w's
                    opt.accumulate_all([{"w": gw, "b": gb}, {"w": gw}])
                opt.step()
            rw, rb = nn.Parameter(w0.clone()), nn.Parameter(b0.clone())
            ref = [torch.optim.Muon([rw], lr=0.05, weight_decay=0.1, eps=1e-7),
                   torch.optim.AdamW([rb], lr=0.01, betas=(0.9, 0.95), eps=1e-10,
                                     weight_decay=0.1)]
            with fp32_ns():
                for step in range(3):
                    rw.grad, rb.grad = gw.clone(), gb / 2  # the mean: b's other half is zero
                    for o in ref:
                        o.step()
            ew, eb = rel(w.detach(), rw.detach()), rel(b.detach(), rb.detach())
            print(f"ranks {ranks}, micro-batches {micro}: w rel {ew:.2e}, b rel {eb:.2e}")
            self.assertLessEqual(max(ew, eb), PARITY_TOL)


# -- schedulers ------------------------------------------------------------------------------------

def scheduler_cases():
    S = torch.optim.lr_scheduler
    return {
        "LambdaLR": lambda o: S.LambdaLR(o, lambda s: 1.0 / (1 + s)),
        "StepLR": lambda o: S.StepLR(o, step_size=3, gamma=0.5),
        "MultiStepLR": lambda o: S.MultiStepLR(o, milestones=[2, 5], gamma=0.3),
        "ExponentialLR": lambda o: S.ExponentialLR(o, gamma=0.8),
        "CosineAnnealingLR": lambda o: S.CosineAnnealingLR(o, T_max=8),
        "CosineAnnealingWarmRestarts": lambda o: S.CosineAnnealingWarmRestarts(o, T_0=3),
        "CyclicLR": lambda o: S.CyclicLR(o, base_lr=[0.001, 0.0001], max_lr=[0.02, 0.002],
                                         step_size_up=3),
        "OneCycleLR": lambda o: S.OneCycleLR(o, max_lr=[0.02, 0.002], total_steps=12),
        "LinearLR": lambda o: S.LinearLR(o, start_factor=0.25, total_iters=5),
        "ConstantLR": lambda o: S.ConstantLR(o, factor=0.5, total_iters=4),
        "PolynomialLR": lambda o: S.PolynomialLR(o, total_iters=8, power=2.0),
        "SequentialLR": lambda o: S.SequentialLR(
            o, [S.LinearLR(o, start_factor=0.1, total_iters=3),
                S.ExponentialLR(o, gamma=0.9)], milestones=[3]),
        "ChainedScheduler": lambda o: S.ChainedScheduler(
            [S.ConstantLR(o, factor=0.5, total_iters=4), S.ExponentialLR(o, gamma=0.9)]),
        "ReduceLROnPlateau": lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=1),
    }


def orthonormal_rows(rows, cols):
    g = torch.zeros(rows, cols)
    for i in range(rows):
        g[i, 2 * i] = 1.0
    return g


def adam_unit_updates(betas, eps):
    """AdamW's update per unit of lr for a gradient of ones, step by step, with the betas each
    step ran (torch's bias correction uses the step's betas): 1 / (1 + eps) while they stay."""
    m = v = 0.0
    out = []
    for t, (b1, b2) in enumerate(betas, start=1):
        m = b1 * m + (1 - b1)
        v = b2 * v + (1 - b2)
        out.append((m / (1 - b1 ** t)) / (math.sqrt(v / (1 - b2 ** t)) + eps))
    return out


class SchedulersDriveBothGroups(unittest.TestCase):
    """A constant gradient with equal singular values makes Muon's update -lr * f * G with f a
    constant of NS, and AdamW's (g = 1) -lr times adam_unit_updates of the betas the step ran
    (CyclicLR and OneCycleLR cycle beta1 too): the learning rate each update used is read back
    from the parameters' change."""

    STEPS = 10
    TOL = 2e-5  # of the learning rate read back, relative to the group's largest

    def run_schedule(self, make):
        w = nn.Parameter(torch.zeros(4, 8))
        b = nn.Parameter(torch.zeros(8))
        opt = zmuon.Muon([("w", w), ("b", b)], lr=0.02, adam_lr=0.002, weight_decay=0.0,
                         eps=1e-10)
        sched = make(opt) if make is not None else None
        g_w, g_b = orthonormal_rows(4, 8), torch.ones(8)
        used, set_, betas = [], [], []
        for step in range(self.STEPS):
            w.grad, b.grad = g_w.clone(), g_b.clone()
            before = (w.detach().clone(), b.detach().clone())
            set_.append([g["lr"] for g in opt.param_groups])
            betas.append(tuple(opt.param_groups[1]["betas"]))
            opt.step()
            used.append((-(w.detach() - before[0])[0, 0].item(),
                         -(b.detach() - before[1])[0].item()))
            if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
                sched.step(1.0)  # a constant metric: the plateau cuts the lr
            elif sched is not None:
                sched.step()
        unit = adam_unit_updates(betas, 1e-10)
        used = [(d_m, d_a / u) for (d_m, d_a), u in zip(used, unit)]
        self.beta1s = {round(b1, 12) for b1, _ in betas}
        return set_, used

    def test_every_scheduler(self):
        _, calib = self.run_schedule(None)  # f from constant lrs 0.02 and 0.002
        f_muon = calib[0][0] / 0.02
        f_adam = calib[0][1] / 0.002
        print(f"calibration: Muon update/lr {f_muon:.6f}, AdamW update/lr {f_adam:.6f}")
        print(f"{'scheduler':28s} {'steps':>5s} {'distinct lrs':>12s} {'worst rel':>10s} "
              f"{'beta1s':>6s}")
        for name, make in scheduler_cases().items():
            with self.subTest(scheduler=name):
                set_, used = self.run_schedule(make)
                worst = 0.0
                peaks = [max(s[i] for s in set_) for i in range(2)]
                for step, ((lr_m, lr_a), (d_m, d_a)) in enumerate(zip(set_, used)):
                    for want, got, peak in ((lr_m, d_m / f_muon, peaks[0]),
                                            (lr_a, d_a / f_adam, peaks[1])):
                        e = abs(got - want) / peak
                        worst = max(worst, e)
                        self.assertLessEqual(e, self.TOL, f"{name} step {step}: lr {want} "
                                             f"set, {got} used")
                distinct = len({round(s[0], 12) for s in set_})
                print(f"{name:28s} {len(set_):5d} {distinct:12d} {worst:10.2e} "
                      f"{len(self.beta1s):6d}")
                self.assertGreater(distinct, 1, f"{name} never changed the lr")
                if name in ("CyclicLR", "OneCycleLR"):  # cycle_momentum=True, the default
                    self.assertGreater(len(self.beta1s), 1, f"{name} never changed beta1")


# -- the Optimizer protocol --------------------------------------------------------------------------

class OptimizerProtocol(unittest.TestCase):

    def make(self, **kw):
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        return model, zmuon.Muon(model.named_parameters(), **kw)

    def test_is_an_optimizer_with_defaults_groups_and_state(self):
        _, opt = self.make()
        self.assertIsInstance(opt, torch.optim.Optimizer)
        self.assertEqual(opt.defaults["lr"], 0.02)
        self.assertEqual([g["use_muon"] for g in opt.param_groups], [True, False])
        self.assertEqual(opt.param_groups[0]["param_names"], ["0.weight", "2.weight"])
        for key in ("lr", "weight_decay", "momentum", "nesterov", "betas", "eps", "ns_steps",
                    "ns_coefficients", "ns_variant", "adjust_lr"):
            self.assertIn(key, opt.param_groups[1], key)
        self.assertEqual(opt.param_groups[1]["lr"], 3e-4)

    def test_step_returns_the_closures_loss_and_runs_the_hooks(self):
        model, opt = self.make()
        x = torch.randn(5, 8)
        calls = []
        opt.register_step_pre_hook(lambda o, a, k: calls.append("pre"))
        opt.register_step_post_hook(lambda o, a, k: calls.append("post"))

        def closure():
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            return loss

        first = opt.step(closure)
        second = opt.step(closure)
        self.assertIsInstance(first, torch.Tensor)
        self.assertLess(second.item(), first.item())
        self.assertEqual(calls, ["pre", "post", "pre", "post"])
        self.assertEqual(opt.last_step["step"], 2)

    def test_zero_grad(self):
        model, opt = self.make()
        model(torch.randn(2, 8)).sum().backward()
        opt.zero_grad(set_to_none=False)
        self.assertTrue(all(p.grad is not None and not p.grad.any() for p in model.parameters()))
        opt.zero_grad()
        self.assertTrue(all(p.grad is None for p in model.parameters()))

    def test_add_param_group_before_and_after_the_first_step(self):
        model, opt = self.make()
        extra = nn.Parameter(torch.randn(4, 4))
        opt.add_param_group({"params": [("extra", extra)], "lr": 0.01})
        self.assertEqual(opt.param_groups[2]["use_muon"], True)
        self.assertEqual(opt.param_groups[2]["lr"], 0.01)
        model(torch.randn(2, 8)).sum().backward()
        extra.grad = torch.ones(4, 4)
        before = extra.detach().clone()
        opt.step()  # the new group steps with its own lr
        self.assertFalse(torch.equal(before, extra.detach()))
        late = nn.Parameter(torch.randn(3))  # test_torch_parameters compares it with torch
        opt.add_param_group({"params": [("late", late)]})
        self.assertEqual(opt.param_groups[3]["use_muon"], False)
        late.grad = torch.ones(3)
        before = late.detach().clone()
        opt.step()
        self.assertFalse(torch.equal(before, late.detach()))

    def test_errors_say_what_to_do(self):
        model, opt = self.make()
        before = [p.detach().clone() for p in model.parameters()]
        self.assertIsNone(opt.step())  # no .grad anywhere: nothing changes, as in torch.optim
        self.assertIsNone(opt.last_step)
        self.assertTrue(all(torch.equal(a, p) for a, p in zip(before, model.parameters())))
        _, opt = self.make(overrides=["gradient_accumulation_steps=2"])
        opt.accumulate(grads={n: torch.zeros_like(p) for g in opt.param_groups
                              for n, p in zip(g["param_names"], g["params"])})
        with self.assertRaisesRegex(zmuon.InvalidArgument, "1 micro-batches .* "
                                    "gradient_accumulation_steps is 2"):
            opt.step()
        with self.assertRaisesRegex(TypeError, "cannot be pickled"):
            pickle.dumps(opt)

    def test_a_skipped_step_reports_a_non_finite_norm(self):
        model, opt = self.make()
        before = [p.detach().clone() for p in model.parameters()]
        model(torch.randn(2, 8)).sum().backward()
        model[0].weight.grad[0, 0] = float("inf")
        opt.step()
        self.assertTrue(opt.last_step["skipped"])
        self.assertFalse(math.isfinite(opt.last_step["grad_norm"]))
        for a, b in zip(before, model.parameters()):
            self.assertTrue(torch.equal(a, b.detach()))


class BackwardHandOver(unittest.TestCase):

    def train(self, hooks):
        torch.manual_seed(4)
        model = TinyTransformer()
        opt = zmuon.Muon(model.named_parameters(), overrides=["gradient_accumulation_steps=2"],
                         **HYPER)
        if hooks:
            opt.hand_over_in_backward()
        data = batches(6, seed=5)
        for step in range(3):
            for micro in range(2):
                lm_loss(model, data[2 * step + micro]).backward()
                if not hooks:
                    opt.accumulate()
                    opt.zero_grad()
                else:
                    self.assertTrue(all(p.grad is None for p in model.parameters()))
            opt.step()
        self.assertEqual(opt.last_step["micro_batches"], 2)
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    def test_hooks_match_explicit_accumulate_bit_for_bit(self):
        explicit, hooked = self.train(False), self.train(True)
        differ = [n for n in explicit if not torch.equal(explicit[n], hooked[n])]
        print(f"backward hand-over: {len(explicit) - len(differ)} of {len(explicit)} "
              "parameters bit-identical to accumulate()")
        self.assertEqual(differ, [])


class HandOverAhead(unittest.TestCase):
    """hand_over_ahead: the gradients go to the engine as each backward pass ends (off by
    default; switched on here on the host), and what step() reads is what it would
    have read itself, bit for bit, whatever the loop does between the backward and the step."""

    def between(self, step, model, opt, data, scratch):
        """Step `step`'s doings between its backward and its step."""
        params = list(model.parameters())
        if step == 1:  # written in place (each gradient's version moves)
            torch.nn.utils.clip_grad_norm_(params, 0.05)
        elif step == 2:  # a second backward accumulates into the same tensors
            lm_loss(model, data[-1]).backward()
        elif step == 3:  # new .grad tensors from a backward after zero_grad
            opt.zero_grad()
            lm_loss(model, data[-2]).backward()
        elif step == 4:  # one .grad replaced, one written through .data (no version bump)
            params[0].grad = params[0].grad * 3
            params[1].grad.data.mul_(0.5)
        elif step == 5:  # a checkpoint between the backward and the step
            opt.save_checkpoint(scratch)
        elif step == 6:  # a state_dict read
            opt.state_dict()
        elif step == 7:  # a step refused by a bad rate after its reads began, then made again
            lr = opt.param_groups[0]["lr"]
            opt.param_groups[0]["lr"] = float("nan")
            with self.assertRaises(zmuon.InvalidArgument):
                opt.step()
            opt.param_groups[0]["lr"] = lr

    def train(self, ahead, scratch):
        torch.manual_seed(4)
        model = TinyTransformer()
        opt = zmuon.Muon(model.named_parameters(), **HYPER)
        if ahead:
            opt.hand_over_ahead()
        data = batches(10, seed=6)
        standing = []
        for step in range(8):
            lm_loss(model, data[step]).backward()
            standing.append(opt._engine.handed_over(opt._first_rank))
            self.between(step, model, opt, data, scratch)
            opt.step()
            opt.zero_grad()
        return {n: p.detach().clone() for n, p in model.named_parameters()}, standing

    def test_the_step_reads_what_it_would_have_handed_over(self):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            itself, none = self.train(False, a)
            ahead, standing = self.train(True, b)
        self.assertEqual(none, [0] * 8)
        self.assertEqual(standing, [1] * 8)  # every backward handed them over
        differ = [n for n in itself if not torch.equal(itself[n], ahead[n])]
        print(f"hand-over ahead: {len(itself) - len(differ)} of {len(itself)} parameters "
              "bit-identical to step()'s own hand-over")
        self.assertEqual(differ, [])

    def test_switched_off_and_refused_by_name(self):
        model = TinyTransformer()
        opt = zmuon.Muon(model.named_parameters(), **HYPER)
        self.assertEqual(opt._ahead_hooks, [])  # off unless asked for
        opt.hand_over_ahead()
        opt.hand_over_ahead(False)
        lm_loss(model, batches(1)[0]).backward()
        self.assertEqual(opt._engine.handed_over(opt._first_rank), 0)
        opt.hand_over_ahead()
        opt.close()  # its hooks go with it: a later backward calls nothing of it
        self.assertTrue(all(not p._post_accumulate_grad_hooks for p in model.parameters()))
        two = zmuon.Muon(TinyTransformer().named_parameters(), ranks=2, **HYPER)
        with self.assertRaisesRegex(zmuon.Unsupported, "hand_over_ahead: .*one rank"):
            two.hand_over_ahead()

    def test_close_while_the_backward_thread_lives_on(self):
        # On a CUDA device autograd runs the backward, hooks and callbacks included, on a
        # thread of its own that outlives the optimizer. The engine's close() then returned only
        # once that thread ended (CAF kept a reference per calling thread): here, never. In a
        # child process, so that a hang fails the test by its timeout.
        script = """
import threading, time, torch, zmuon
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
opt = zmuon.Muon(model.named_parameters())
opt.hand_over_ahead()
for step in range(3):
    opt.zero_grad()
    loss = model(torch.randn(4, 16)).square().sum()
    done = threading.Event()
    def backward():
        loss.backward()
        done.set()
        time.sleep(600)
    threading.Thread(target=backward, daemon=True).start()
    done.wait()
    assert opt._ahead is not None
    opt.step()
opt.close()
print("closed", flush=True)
"""
        try:
            out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                 timeout=120)
        except subprocess.TimeoutExpired:
            self.fail("close() did not return within 120 s while the backward's thread lived")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("closed", out.stdout)


class GradScalerAndCompile(unittest.TestCase):
    ahead = False  # opt.hand_over_ahead (the subclass below)

    def run_steps(self, scaler=None, compiled=False, inf_at=None):
        torch.manual_seed(2)
        model = TinyTransformer()
        opt = zmuon.Muon(model.named_parameters(), **HYPER)
        if self.ahead:
            opt.hand_over_ahead()
        run = torch.compile(model, backend="aot_eager") if compiled else model
        for i, tokens in enumerate(batches(4, seed=3)):
            opt.zero_grad()
            loss = lm_loss(run, tokens)
            if scaler is None:
                loss.backward()
                opt.step()
                continue
            scaler.scale(loss).backward()
            if i == inf_at:
                model.fc.weight.grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
        return {n: p.detach().clone() for n, p in model.named_parameters()}, opt

    def test_grad_scaler_unscales_before_zmuon_and_skips_on_inf(self):
        plain, _ = self.run_steps()
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
        scaled, opt = self.run_steps(scaler)
        for n in plain:  # a power-of-two scale unscales exactly
            self.assertTrue(torch.equal(plain[n], scaled[n]), n)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
        skipped, opt = self.run_steps(scaler, inf_at=3)
        self.assertEqual(scaler.get_scale(), 2.0 ** 9)  # the scaler saw the inf and backed off
        self.assertEqual(opt.last_step["step"], 3)      # and zmuon never stepped on it
        print(f"GradScaler: bit-identical to the unscaled run; inf at step 4 skipped, scale "
              f"{scaler.get_scale():g}")

    def test_compiled_model(self):
        plain, _ = self.run_steps()
        compiled, opt = self.run_steps(compiled=True)
        self.assertTrue(all(n.startswith("_orig_mod.") is False for n in plain))
        worst = max(rel(compiled[n], plain[n]) for n in plain)
        print(f"torch.compile (aot_eager): worst param rel vs eager {worst:.2e}")
        self.assertLessEqual(worst, 1e-6)


class GradScalerAndCompileAhead(GradScalerAndCompile):
    """The same with the gradients handed over as each backward ends: GradScaler unscales them
    in place after that hand-over, and a step it skips leaves one standing in the engine, which
    the next backward's hand-over withdraws."""
    ahead = True


if __name__ == "__main__":
    unittest.main()
