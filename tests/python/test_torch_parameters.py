"""zmuon.Muon takes parameters as torch.optim optimizers take them, each case against
torch.optim.Muon + AdamW doing the same (NS in fp32, zmuon's contract; PARITY_TOL relative per
parameter):

- the parameters are the truth: every write made outside the optimizer (torch_writes.SCRIPT)
  is where the next step starts, with the parameters as views of the engine's masters (a job
  of one rank) and without (the check for writes); without either, the same run is far off
  (the control);
- a parameter that is its master: its storage is the engine's after the first step, its own
  again with the same values after close() or garbage collection;
- model.parameters(), unnamed groups with use_muon or algorithm, and the info line;
- 0-d, zero-size and non-contiguous parameters; other group keys kept;
- add_param_group at step 5 (progressive unfreezing);
- OneCycleLR's cycle_momentum read back from Muon's momentum buffer;
- the four state-dict hooks called as torch.optim.AdamW calls them;
- bf16 parameters with fp32 masters: 200 steps against the fp32 run, and against
  torch.optim.AdamW on the bf16 parameters.

Run by ctest with the venv's python (.venv); without PyTorch it fails.
"""

import copy
import gc
import io
import unittest

import torch
import torch.nn as nn

import torch_writes
from test_torch_optim import (HYPER, PARITY_TOL, TinyTransformer, batches, fp32_ns, lm_loss,
                              rel, torch_pair, uses_muon)

import zmuon

torch.set_num_threads(2)


def by_dimension(_name, p):
    return p.ndim >= 2


def worst(a, b):
    """The largest relative difference over the parameters of two models."""
    named = dict(b.named_parameters())
    return max(rel(p.detach().float(), named[n].detach().float())
               for n, p in a.named_parameters())


def fresh(seed=0):
    torch.manual_seed(seed)
    return TinyTransformer()


# Writes that leave the engine's masters right (the weights come back, or the optimizer's
# state_dict brings the same masters as the model's): no control.
SAME_WEIGHTS = ("EMA swapped in and back", "opt.load_state_dict, then model.load_state_dict")


def unshared(opt):
    """`opt` with its parameters kept apart from the engine's masters (as under FSDP2, DDP or
    with bf16 parameters): written back after each step, watched for writes."""
    opt._share_masters = lambda bindings: None
    return opt


class ParametersAreTheTruth(unittest.TestCase):
    """Each write of torch_writes.SCRIPT alone, then all of them: zmuon against torch's
    optimizers making the same writes, its parameters views of the masters and not; the control
    (parameters apart from the masters and no check for writes) must be far off, so the
    comparison can fail."""

    def runs(self, writes, untouched):
        """zmuon's distances to the reference (masters shared, then not), the control's, and
        the writes' effect."""
        ref = fresh()
        with fp32_ns():
            torch_writes.run(ref, torch_pair(ref), writes)
        ours, apart = fresh(), fresh()
        torch_writes.run(ours, [zmuon.Muon(ours.named_parameters(), **HYPER)], writes)
        torch_writes.run(apart, [unshared(zmuon.Muon(apart.named_parameters(), **HYPER))],
                         writes)
        if set(writes) <= set(SAME_WEIGHTS):
            return worst(ours, ref), worst(apart, ref), float("nan"), worst(untouched, ref)
        stale = fresh()
        opt = unshared(zmuon.Muon(stale.named_parameters(), **HYPER))
        opt._reload_written = lambda: []  # the control: the masters as the engine left them
        torch_writes.run(stale, [opt], writes)
        return worst(ours, ref), worst(apart, ref), worst(stale, ref), worst(untouched, ref)

    def test_every_write_path(self):
        untouched = fresh()
        with fp32_ns():
            torch_writes.run(untouched, torch_pair(untouched), [])
        print(f"\n{'write':48s} {'shared':>9s} {'apart':>9s} {'control':>9s} {'effect':>9s}")
        for label in torch_writes.ALL + ["all of them"]:
            writes = torch_writes.ALL if label == "all of them" else [label]
            with self.subTest(write=label):
                ours, apart, stale, effect = self.runs(writes, untouched)
                print(f"{label:48s} {ours:9.2e} {apart:9.2e} {stale:9.2e} {effect:9.2e}")
                self.assertLessEqual(ours, PARITY_TOL)
                self.assertLessEqual(apart, PARITY_TOL)
                if label in SAME_WEIGHTS:
                    continue
                self.assertGreater(effect, 100 * PARITY_TOL, "the write changes too little")
                self.assertGreater(stale, 100 * PARITY_TOL, "the control matches")

    def loads_after_writes(self, opt, model, write):
        """The parameters the engine loaded values for at the step after `write`, and at the
        three steps before it (none)."""
        loads, load = [], opt._engine.load_shard_params
        opt._engine.load_shard_params = lambda rank, entries: loads.append(entries)
        for tokens in batches(3):
            opt.zero_grad()
            lm_loss(model, tokens).backward()
            opt.step()
        self.assertEqual(loads, [])
        write()
        lm_loss(model, batches(1)[0]).backward()
        opt.step()
        opt._engine.load_shard_params = load
        return [[e[0] for e in entries] for entries in loads]

    def test_only_what_was_written_is_reloaded(self):
        def halve():
            with torch.no_grad():
                model.fc.weight.mul_(0.5)

        def new_storage():
            model.fc.weight.data = model.fc.weight.detach() * 0.5

        model = fresh()
        opt = unshared(zmuon.Muon(model.named_parameters(), **HYPER))
        self.assertEqual(self.loads_after_writes(opt, model, halve), [["fc.weight"]])
        model = fresh()  # the masters shared: an in-place write is a write into the master
        opt = zmuon.Muon(model.named_parameters(), **HYPER)
        self.assertEqual(self.loads_after_writes(opt, model, halve), [])
        model = fresh()  # ... and a new storage is loaded, then shared
        opt = zmuon.Muon(model.named_parameters(), **HYPER)
        self.assertEqual(self.loads_after_writes(opt, model, new_storage), [["fc.weight"]])
        self.assertTrue(opt._bindings["fc.weight"].in_master())


class SharedMasters(unittest.TestCase):
    """In a job of one rank, an fp32 parameter becomes a view of the engine's master after the
    first step; it gets a storage of its own again, with its values, before the engine goes."""

    def trained(self):
        model = fresh()
        opt = zmuon.Muon(model.named_parameters(), **HYPER)
        for tokens in batches(2):
            opt.zero_grad()
            lm_loss(model, tokens).backward()
            opt.step()
        return model, opt

    def test_the_storage_is_the_master(self):
        model, opt = self.trained()
        for name, p in model.named_parameters():
            ptr, numel, _ = opt._engine.master(name)
            self.assertEqual((p.data_ptr(), p.numel()), (ptr, numel), name)

    def test_a_cast_after_sharing_starts_from_the_cast_values(self):
        """model.to(torch.bfloat16) after the masters were shared: a new storage, loaded and
        staged; the run is bit-equal to one whose parameters were never shared (the check for
        writes finds the cast there)."""
        runs = []
        for share in (True, False):
            torch.manual_seed(0)
            model = TinyTransformer()
            opt = zmuon.Muon(model.named_parameters(), **HYPER)
            if not share:
                unshared(opt)
            for i, tokens in enumerate(batches(4, seed=17)):
                if i == 2:
                    self.assertEqual(all(b.in_master() for b in opt._bindings.values()), share)
                    model.to(torch.bfloat16)
                opt.zero_grad()
                lm_loss(model, tokens).backward()
                opt.step()
            self.assertEqual({p.dtype for p in model.parameters()}, {torch.bfloat16})
            runs.append(model)
        for (n, a), (_, b) in zip(runs[0].named_parameters(), runs[1].named_parameters()):
            self.assertTrue(torch.equal(a, b), n)

    def test_the_moved_views_are_those_in_master_finds(self):
        """MasterViews.moved (data pointers and dtypes read for all parameters at once)
        against in_master asked of each binding: none moved, a new storage, the master viewed
        as bf16 at the same address, two at once; and rebuilt once the step shared
        the new storage again."""
        from zmuon._param_sync import MasterViews

        def reference(opt):
            return sorted(b.name for b in opt._bindings.values()
                          if b.master is not None and not b.in_master())

        def moved(opt):
            return sorted(b.name for b in MasterViews(list(opt._bindings.values())).moved())

        def new_storage(model):
            model.fc.weight.data = model.fc.weight.detach().clone()

        def as_bf16(model):
            model.lm_head.weight.data = model.lm_head.weight.detach().view(torch.bfloat16)

        def both(model):
            new_storage(model)
            model.tok_embed.weight.data = model.tok_embed.weight.detach().clone()

        for write, expected in ((lambda m: None, []), (new_storage, ["fc.weight"]),
                                (as_bf16, ["lm_head.weight"]),
                                (both, ["fc.weight", "tok_embed.weight"])):
            with self.subTest(expected=expected):
                model, opt = self.trained()
                views = opt._master_views()
                self.assertEqual(moved(opt), [])
                write(model)
                self.assertEqual(reference(opt), expected)
                self.assertEqual(moved(opt), expected)
                self.assertEqual(sorted(b.name for b in views.moved()), expected)
                if write is as_bf16:
                    model.lm_head.weight.data = model.lm_head.weight.detach().view(torch.float32)
                    continue
                lm_loss(model, batches(1)[0]).backward()
                opt.step()  # loaded, then shared again: a new cache, nothing moved
                if expected:
                    self.assertIsNot(opt._master_views(), views)
                self.assertEqual(moved(opt), [])
                self.assertEqual(reference(opt), [])

    def test_close_and_collection_give_the_storage_back(self):
        for end in ("close", "collect"):
            with self.subTest(end=end):
                model, opt = self.trained()
                values = {n: p.detach().clone() for n, p in model.named_parameters()}
                masters = {n: opt._engine.master(n)[0] for n, _ in model.named_parameters()}
                if end == "close":
                    opt.close()
                else:
                    del opt
                    gc.collect()
                for n, p in model.named_parameters():
                    self.assertNotEqual(p.data_ptr(), masters[n], n)
                    self.assertTrue(torch.equal(p.detach(), values[n]), n)
                lm_loss(model, batches(1)[0]).backward()  # the model still trains
                torch.optim.SGD(model.parameters(), lr=0.1).step()


class GradientsReadInOnePass(unittest.TestCase):
    """The hand-over's reading of every .grad through map() (_every_grad_plain) against the
    same reading a parameter at a time (_each_grad_plain): the same entries and tensors where
    every gradient is a plain fp32 contiguous tensor of its parameter's shape; no answer where
    one is not, which the per-parameter reading then takes or refuses as before."""

    def readings(self, change=None):
        from zmuon._gradients import _every_grad_plain
        model = fresh()
        opt = zmuon.Muon(model.named_parameters(), **HYPER)
        lm_loss(model, batches(1)[0]).backward()
        if change:
            change(model)
        _, slots, columns = opt._param_slots()
        return (_every_grad_plain(torch, columns, opt._host_staging),
                opt._each_grad_plain(torch, slots), model)

    def test_plain_gradients_give_the_entries_of_the_loop(self):
        every, each, model = self.readings()
        self.assertIsNotNone(every)
        self.assertEqual(every[0], each[0])
        self.assertEqual([id(g) for g in every[1]], [id(g) for g in each[1]])
        self.assertEqual(len(every[0]), len(list(model.parameters())))
        self.assertEqual({e[3] for e in every[0]}, {zmuon._capi.HOST})

    def test_a_gradient_that_is_not_plain_is_left_to_the_loop(self):
        def no_grad(model):
            model.fc.weight.grad = None

        def transposed(model):
            g = model.fc.weight.grad
            model.fc.weight.grad = g.t().contiguous().t()  # its shape, not contiguous

        def other_dtype(model):
            model.proj.bias.grad_dtype = None
            model.proj.bias.grad = model.proj.bias.grad.double()

        for change, loop_takes in ((no_grad, True), (transposed, False), (other_dtype, False)):
            with self.subTest(change=change.__name__):
                every, each, model = self.readings(change)
                self.assertIsNone(every)
                self.assertEqual(each is not None, loop_takes)
                if loop_takes:
                    self.assertNotIn("fc.weight", [e[0] for e in each[0]])
                    self.assertEqual(len(each[0]), len(list(model.parameters())) - 1)


class AnyWayOfPassingParameters(unittest.TestCase):

    def train(self, model, opts, steps=5):
        with fp32_ns():
            for tokens in batches(steps, seed=2):
                for o in opts:
                    o.zero_grad()
                lm_loss(model, tokens).backward()
                for o in opts:
                    o.step()

    def test_model_parameters_by_dimension_with_one_info_line(self):
        ref, ours = fresh(), fresh()
        with self.assertLogs("zmuon", "INFO") as logs:
            opt = zmuon.Muon(ours.parameters(), **HYPER)
        muon = sum(p.ndim >= 2 for p in ours.parameters())
        adamw = sum(p.ndim < 2 for p in ours.parameters())
        self.assertEqual([len(g["params"]) for g in opt.param_groups], [muon, adamw])
        self.assertEqual(len(logs.output), 1)
        self.assertIn(f"{muon + adamw} parameters without names, by dimension: {muon} Muon "
                      f"(ndim >= 2), {adamw} AdamW", logs.output[0])
        self.train(ref, torch_pair(ref, by_dimension))
        self.train(ours, [opt])
        print(f"\nmodel.parameters() after 5 steps: {worst(ours, ref):.2e}")
        self.assertLessEqual(worst(ours, ref), PARITY_TOL)

    def test_unnamed_groups_with_use_muon_or_algorithm(self):
        for key, muon, adamw in (("use_muon", True, False), ("algorithm", "muon", "AdamW")):
            with self.subTest(key=key):
                ref, ours = fresh(), fresh()
                named = list(ours.named_parameters())
                groups = [{"params": [p for n, p in named if uses_muon(n, p)], key: muon},
                          {"params": [p for n, p in named if not uses_muon(n, p)], key: adamw,
                           "lr": HYPER["adam_lr"], "my_key": "kept"}]
                opt = zmuon.Muon(groups, **HYPER)
                self.assertEqual([g["use_muon"] for g in opt.param_groups], [True, False])
                self.assertEqual(opt.param_groups[1]["my_key"], "kept")
                self.train(ref, torch_pair(ref))
                self.train(ours, [opt])
                self.assertLessEqual(worst(ours, ref), PARITY_TOL)
                self.assertEqual(opt.state_dict()["param_groups"][1]["my_key"], "kept")

    def test_an_algorithm_zmuon_lacks_is_named(self):
        model = fresh()
        with self.assertRaisesRegex(zmuon.InvalidArgument,
                                    r"param group 0\['algorithm'\] must be one of muon, adamw, "
                                    r"lion; "
                                    r"got 'adamww' \(did you mean 'adamw'\?\)"):
            zmuon.Muon([{"params": list(model.parameters()), "algorithm": "adamww"}])
        with self.assertRaisesRegex(zmuon.InvalidArgument, "algorithm='adamw' and "
                                    "use_muon=True disagree"):
            zmuon.Muon([{"params": list(model.parameters()), "algorithm": "adamw",
                         "use_muon": True}])


class OddParameters(nn.Module):
    """CLIP's 0-d logit_scale, a zero-size tensor, a non-contiguous matrix."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(6)
        self.logit_scale = nn.Parameter(torch.tensor(2.5))
        self.empty = nn.Parameter(torch.zeros(0, 8))
        self.wt = nn.Parameter(torch.randn(16, 8, generator=g).t())  # [8, 16], strided
        self.bias = nn.Parameter(torch.randn(16, generator=g))

    def loss(self, x):
        y = (x @ self.wt + self.bias) * self.logit_scale.exp() + self.empty.sum()
        return (y.tanh() ** 2).mean()


class ScalarsZeroSizeStrided(unittest.TestCase):

    def test_they_train_as_torch_trains_them(self):
        ref, ours = OddParameters(), OddParameters()
        self.assertFalse(ours.wt.is_contiguous())
        opt = zmuon.Muon(ours.named_parameters(), **HYPER)
        ref_opts = torch_pair(ref, by_dimension)
        xs = torch.randn(6, 4, 8, generator=torch.Generator().manual_seed(7))
        with fp32_ns():
            for x in xs:
                for m, opts in ((ref, ref_opts), (ours, [opt])):
                    for o in opts:
                        o.zero_grad()
                    m.loss(x).backward()
                    for o in opts:
                        o.step()
        for n in ("logit_scale", "wt", "bias"):
            e = rel(getattr(ours, n).detach(), getattr(ref, n).detach())
            print(f"{n:12s} {tuple(getattr(ours, n).shape)!s:8s} rel {e:.2e}")
            self.assertLessEqual(e, PARITY_TOL, n)
        self.assertEqual(ours.logit_scale.shape, ())
        self.assertFalse(ours.wt.is_contiguous())  # written in place, strides kept
        self.assertGreater(abs(ours.logit_scale.item() - 2.5), 1e-3)
        sd = opt.state_dict()
        self.assertEqual(opt.state[ours.logit_scale]["exp_avg"].shape, ())  # AdamW
        twin = OddParameters()
        opt2 = zmuon.Muon(twin.named_parameters(), **HYPER)
        opt2.load_state_dict(sd)
        self.assertTrue(torch.equal(twin.wt.detach(), ours.wt.detach()))


class ProgressiveUnfreezing(unittest.TestCase):

    def test_add_param_group_at_step_five_matches_torch(self):
        ref, ours = fresh(), fresh()
        late = ("fc.weight", "out.weight", "ln2.weight", "out.bias", "fc.bias", "ln2.bias")

        def split(model):
            named = dict(model.named_parameters())
            first = {n: p for n, p in named.items() if n not in late}
            return first, [named[n] for n in late]

        first, rest = split(ref)
        opts = torch_pair(first.items())
        first_z, rest_z = split(ours)
        opt = zmuon.Muon(list(first_z.items()), **HYPER)
        for step, tokens in enumerate(batches(9, seed=3)):
            if step == 5:
                opts[0].add_param_group({"params": rest[:2]})
                opts[1].add_param_group({"params": rest[2:]})
                opt.add_param_group({"params": rest_z[:2], "use_muon": True})
                opt.add_param_group({"params": rest_z[2:], "algorithm": "adamw",
                                     "lr": HYPER["adam_lr"]})
            with fp32_ns():
                for m, os_ in ((ref, opts), (ours, [opt])):
                    for o in os_:
                        o.zero_grad()
                    lm_loss(m, tokens).backward()
                    for o in os_:
                        o.step()
        print(f"\nadd_param_group at step 5, 9 steps: {worst(ours, ref):.2e}")
        self.assertLessEqual(worst(ours, ref), PARITY_TOL)
        self.assertEqual(len(opt.param_groups), 4)


class CycledMomentum(unittest.TestCase):
    """OneCycleLR with cycle_momentum moves AdamW's beta1 and Muon's momentum (torch.optim.Muon
    keeps it as "momentum", zmuon's Muon group as betas[0] too); the momentum buffer read back
    from zmuon's state matches torch's."""

    def run_both(self, cycle):
        ref, ours = fresh(), fresh()
        opts = torch_pair(ref)
        opt = zmuon.Muon(ours.named_parameters(), **HYPER)
        S = torch.optim.lr_scheduler
        kw = dict(total_steps=8, cycle_momentum=cycle, base_momentum=0.6, max_momentum=0.95)
        scheds = [S.OneCycleLR(o, max_lr=lr, **kw)
                  for o, lr in ((opts[0], 0.02), (opts[1], 3e-3))]
        sched = S.OneCycleLR(opt, max_lr=[0.02, 3e-3], **kw)
        momenta = []
        with fp32_ns():
            for tokens in batches(6, seed=5):
                momenta.append(opt.param_groups[0]["betas"][0])
                for m, os_, ss in ((ref, opts, scheds), (ours, [opt], [sched])):
                    for o in os_:
                        o.zero_grad()
                    lm_loss(m, tokens).backward()
                    for o in os_:
                        o.step()
                    for s in ss:
                        s.step()
        buf = max(rel(opt.state[p]["momentum_buffer"], opts[0].state[q]["momentum_buffer"])
                  for (n, p), q in zip([(n, p) for n, p in ours.named_parameters()
                                        if uses_muon(n, p)], opts[0].param_groups[0]["params"]))
        return worst(ours, ref), buf, momenta, ref

    def test_one_cycle_momentum_reaches_muon(self):
        params, buf, momenta, ref = self.run_both(True)
        _, _, _, flat = self.run_both(False)
        effect = max(rel(p.detach(), q.detach())
                     for p, q in zip(ref.parameters(), flat.parameters()))
        print(f"\nOneCycleLR cycle_momentum: params {params:.2e}, momentum buffer {buf:.2e}, "
              f"momenta {[round(m, 3) for m in momenta]}, effect {effect:.2e}")
        self.assertGreater(len(set(momenta)), 3)
        self.assertLessEqual(params, PARITY_TOL)
        self.assertLessEqual(buf, PARITY_TOL)
        self.assertGreater(effect, 100 * PARITY_TOL)


class StateDictHooks(unittest.TestCase):
    """The four hooks, called with what torch.optim.AdamW calls them with."""

    def calls(self, opt):
        seen = []
        opt.register_state_dict_pre_hook(lambda o: seen.append(("sd pre", o is opt)))

        def post(o, sd):
            seen.append(("sd post", o is opt, sorted(sd)))
            return dict(sd, extra=1)
        opt.register_state_dict_post_hook(post)

        def load_pre(o, sd):
            seen.append(("load pre", o is opt, "extra" in sd))
            sd = dict(sd)
            sd.pop("extra")
            sd["param_groups"] = [dict(g, lr=0.125) for g in sd["param_groups"]]
            return sd
        opt.register_load_state_dict_pre_hook(load_pre)
        opt.register_load_state_dict_post_hook(lambda o: seen.append(("load post", o is opt)))
        sd = opt.state_dict()
        self.assertEqual(sd["extra"], 1)
        opt.load_state_dict(sd)
        self.assertEqual({g["lr"] for g in opt.param_groups}, {0.125})
        return seen

    def test_as_torch_calls_them(self):
        model = fresh()
        ours = self.calls(zmuon.Muon(model.named_parameters(), **HYPER))
        theirs = self.calls(torch.optim.AdamW(fresh().parameters()))
        strip = [c if c[0] != "sd post" else c[:2] for c in ours]
        self.assertEqual(strip, [c if c[0] != "sd post" else c[:2] for c in theirs])
        self.assertEqual([c[0] for c in ours], ["sd pre", "sd post", "load pre", "load post"])


class LowPrecisionParameters(unittest.TestCase):
    """A bf16 model trains with fp32 masters in zmuon: it tracks the fp32 model, where
    torch.optim.AdamW on the bf16 parameters (no masters) loses the small updates."""

    STEPS = 200
    # Relative distance to the fp32 run after 200 steps. The runs differ only where bf16
    # rounds the forward and backward (8 bits of mantissa: 2**-9 = 2e-3 relative per value),
    # and Adam's normalised update carries that noise into every step: 5 % bounds it with room,
    # while losing the updates (no masters) lands far outside.
    TRACK_TOL = 0.05

    def run_model(self, dtype, make_opts):
        torch.manual_seed(0)
        model = TinyTransformer()
        with torch.no_grad():  # the same start: fp32 holds bf16's values exactly
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
        model = model.to(dtype)
        opts = make_opts(model)
        for tokens in batches(self.STEPS, seed=11):
            for o in opts:
                o.zero_grad()
            lm_loss(model, tokens).backward()
            for o in opts:
                o.step()
        return model

    def test_the_write_back_rounds_every_master_to_nearest(self):
        """After each step every bf16 parameter holds its fp32 master rounded to nearest, bit
        for bit (the masters' write-back in one multi-tensor copy), a parameter at a time
        against torch's own copy_ of the staged master."""
        torch.manual_seed(0)
        model = TinyTransformer().to(torch.bfloat16)
        opt = zmuon.Muon(model.named_parameters(), **HYPER)
        for tokens in batches(3, seed=5):
            opt.zero_grad()
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            lm_loss(model, tokens).backward()
            opt.step()
            for name, p in model.named_parameters():
                staged = opt._bindings[name].staging
                self.assertIsNotNone(staged, name)
                expected = torch.empty_like(p).copy_(staged)
                self.assertTrue(torch.equal(p.detach(), expected), name)
            self.assertTrue(any(not torch.equal(before[n], p) for n, p in
                                model.named_parameters()), "the step moved the parameters")

    def test_bf16_tracks_fp32_and_beats_adamw_without_masters(self):
        kw = dict(HYPER, adam_lr=3e-4)

        def zmuon_opt(m):
            return [zmuon.Muon(m.named_parameters(), **kw)]

        def zmuon_adamw(m):
            return [zmuon.Muon([{"params": list(m.parameters()), "algorithm": "adamw"}],
                               **dict(kw, lr=kw["adam_lr"]))]

        def torch_adamw(m):
            return [torch.optim.AdamW(m.parameters(), lr=kw["adam_lr"], betas=kw["betas"],
                                      eps=kw["eps"], weight_decay=kw["weight_decay"])]

        fp32 = self.run_model(torch.float32, zmuon_opt)
        bf16 = self.run_model(torch.bfloat16, zmuon_opt)
        self.assertEqual({p.dtype for p in bf16.parameters()}, {torch.bfloat16})
        muon_track = worst(bf16, fp32)
        fp32_adamw = self.run_model(torch.float32, zmuon_adamw)
        ours = worst(self.run_model(torch.bfloat16, zmuon_adamw), fp32_adamw)
        theirs = worst(self.run_model(torch.bfloat16, torch_adamw), fp32_adamw)
        print(f"\nbf16 vs fp32 after {self.STEPS} steps (worst param rel): zmuon Muon + AdamW "
              f"{muon_track:.2e}; AdamW alone: zmuon {ours:.2e}, torch.optim.AdamW without "
              f"masters {theirs:.2e} (tolerance {self.TRACK_TOL})")
        self.assertLessEqual(muon_track, self.TRACK_TOL)
        self.assertLessEqual(ours, self.TRACK_TOL)
        self.assertGreater(theirs, 3 * ours)

    def test_a_model_cast_to_bf16_after_the_optimizer_was_made(self):
        # model.to(torch.bfloat16) swaps each parameter's storage: the next step starts from
        # the bf16 values, as an optimizer made on the bf16 model would.
        runs = []
        for cast_first in (True, False):
            torch.manual_seed(0)
            model = TinyTransformer()
            if cast_first:
                model = model.to(torch.bfloat16)
            opt = zmuon.Muon(model.named_parameters(), **HYPER)
            model.to(torch.bfloat16)
            for tokens in batches(3, seed=13):
                opt.zero_grad()
                lm_loss(model, tokens).backward()
                opt.step()
            runs.append(model)
        self.assertEqual({p.dtype for p in runs[1].parameters()}, {torch.bfloat16})
        differ = [n for (n, a), (_, b) in zip(runs[0].named_parameters(),
                                              runs[1].named_parameters()) if not torch.equal(a, b)]
        self.assertEqual(differ, [])

    def test_the_state_dict_carries_the_masters_and_a_resume_is_exact(self):
        def make():
            torch.manual_seed(0)
            return TinyTransformer().to(torch.bfloat16)

        def train(model, opt, data):
            for tokens in data:
                opt.zero_grad()
                lm_loss(model, tokens).backward()
                opt.step()

        data = batches(6, seed=12)
        straight = make()
        opt = zmuon.Muon(straight.named_parameters(), **HYPER)
        train(straight, opt, data[:3])
        saved = torch_writes.copied(
            __import__("torch.distributed.checkpoint.state_dict", fromlist=["x"])
            .get_state_dict(straight, opt))
        masters = [v["master"] for v in saved[1]["state"].values()]
        self.assertTrue(all(m.dtype == torch.float32 for m in masters))
        train(straight, opt, data[3:])
        resumed = make()
        opt2 = zmuon.Muon(resumed.named_parameters(), **HYPER)
        from torch.distributed.checkpoint.state_dict import set_state_dict
        set_state_dict(resumed, opt2, model_state_dict=saved[0], optim_state_dict=saved[1])
        train(resumed, opt2, data[3:])
        differ = [n for (n, a), (_, b) in zip(straight.named_parameters(),
                                              resumed.named_parameters()) if not torch.equal(a, b)]
        self.assertEqual(differ, [])


class StochasticRounding(unittest.TestCase):
    """rounding="stochastic": a master between two bf16 neighbours goes into the bf16 parameter
    as either of them, up with the probability of its distance from the lower one, so the mean of
    many roundings is the master; round-to-nearest (the default) gives the nearer one every time,
    a bias of FRACTION ulp. The tolerance is SIGMAS standard errors of the mean of N * STEPS
    Bernoulli(FRACTION) draws (ULP * sqrt(FRACTION * (1 - FRACTION) / (N * STEPS)) = 2.5e-3
    ulp): SR passes it but for a 1 in 1.7 million chance, the nearest rounding's bias is 24 times
    it."""
    N, STEPS, SIGMAS = 4096, 8, 5
    ULP = 2.0 ** -7  # bf16's spacing in [1, 2)
    FRACTION = 0.3

    def between_neighbours(self, **kw):
        """A bf16 parameter and its optimizer, the master loaded at 1 + FRACTION ulp."""
        p = nn.Parameter(torch.ones(self.N, dtype=torch.bfloat16))
        opt = zmuon.Muon([p], weight_decay=0.0, **kw)  # 1-D: AdamW, whose zero update is 0
        sd = opt.state_dict()
        sd["state"][0]["master"] = torch.full((self.N,), 1.0 + self.FRACTION * self.ULP)
        opt.load_state_dict(sd)  # the master goes into the parameter
        return p, opt

    def roundings(self, **kw):
        """The bf16 values of the parameter over STEPS steps that leave its master at 1 +
        FRACTION ulp (zero gradients, no decay), and that master after them."""
        p, opt = self.between_neighbours(**kw)
        seen = [p.detach().float().clone()]
        for step in range(self.STEPS - 1):
            if step == 3:  # a model load of its own weights: the master stays
                p.data.copy_(p.detach().clone())
            p.grad = torch.zeros_like(p)
            opt.step()
            seen.append(p.detach().float().clone())
        return torch.stack(seen), opt.state_dict()["state"][0]["master"]

    def test_stochastic_is_unbiased_and_nearest_is_not(self):
        master = 1.0 + self.FRACTION * self.ULP
        tol = self.SIGMAS * self.ULP * (self.FRACTION * (1 - self.FRACTION)
                                         / (self.N * self.STEPS)) ** 0.5
        values, kept = self.roundings(rounding="stochastic", rounding_seed=7)
        up = values == 1.0 + self.ULP
        self.assertTrue(bool((up | (values == 1.0)).all()))  # only the two neighbours
        sr_bias = values.double().mean().item() - master
        nearest, kept_nearest = self.roundings()
        rn_bias = nearest.double().mean().item() - master
        print(f"\nbf16 rounding of 1 + {self.FRACTION} ulp, {self.N * self.STEPS} values: mean "
              f"off by {sr_bias / self.ULP:+.2e} ulp stochastic, {rn_bias / self.ULP:+.2e} ulp "
              f"nearest (tolerance {tol / self.ULP:.1e} ulp)")
        self.assertLessEqual(abs(sr_bias), tol)
        self.assertTrue(torch.equal(nearest, torch.ones_like(nearest)))  # the default: nearest
        self.assertGreater(abs(rn_bias), tol)
        for m in (kept, kept_nearest):  # no step moved the masters, the model load neither
            self.assertTrue(torch.equal(m, torch.full_like(m, master)))

    def test_a_seed_repeats_its_bits(self):
        a, _ = self.roundings(rounding="stochastic", rounding_seed=1)
        b, _ = self.roundings(rounding="stochastic", rounding_seed=1)
        c, _ = self.roundings(rounding="stochastic", rounding_seed=2)
        self.assertTrue(torch.equal(a, b))
        self.assertFalse(torch.equal(a, c))

    def test_a_deep_copy_draws_the_bits_the_original_would(self):
        p, opt = self.between_neighbours(rounding="stochastic")
        for _ in range(2):  # the generator moves on
            p.grad = torch.zeros_like(p)
            opt.step()
        twin = copy.deepcopy(opt)
        q = next(t for g in twin.param_groups for t in g["params"])
        for o, t in ((opt, p), (twin, q)):
            t.grad = torch.zeros_like(t)
            o.step()
        self.assertTrue(torch.equal(p, q))
        fresh, fresh_opt = self.between_neighbours(rounding="stochastic")
        fresh.grad = torch.zeros_like(fresh)
        fresh_opt.step()
        self.assertFalse(torch.equal(p, fresh))  # a generator from the seed draws other bits

    def test_a_resumed_run_draws_the_bits_of_the_uninterrupted_one(self):
        """Saved after 3 steps (the weights and the optimizer's state_dict, through torch.save),
        resumed into a fresh parameter and optimizer: the next 3 steps give the bits the
        uninterrupted run gives (the generators are seeded from the seed and the step, which
        the state_dict carries); resumed with another seed (the control), they do not."""
        gen = torch.Generator().manual_seed(11)
        grads = [torch.randn(self.N, generator=gen).to(torch.bfloat16) for _ in range(6)]

        def steps(p, opt, gs):
            for g in gs:
                p.grad = g.clone()
                opt.step()

        p = nn.Parameter(torch.randn(self.N, generator=gen).to(torch.bfloat16))
        opt = zmuon.Muon([p], rounding="stochastic", rounding_seed=5, adam_lr=1e-3)
        steps(p, opt, grads[:3])
        saved = io.BytesIO()
        torch.save({"weights": p.detach().clone(), "optimizer": opt.state_dict()}, saved)
        steps(p, opt, grads[3:])

        def resumed(seed):
            saved.seek(0)
            ckpt = torch.load(saved)
            q = nn.Parameter(ckpt["weights"])
            o = zmuon.Muon([q], rounding="stochastic", rounding_seed=seed, adam_lr=1e-3)
            o.load_state_dict(ckpt["optimizer"])
            steps(q, o, grads[3:])
            return q

        self.assertTrue(torch.equal(resumed(5), p))
        self.assertFalse(torch.equal(resumed(6), p))

    def test_bad_options_are_named(self):
        p = nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
        with self.assertRaisesRegex(zmuon.InvalidArgument, "rounding must be one of nearest, "
                                    "stochastic, got 'up'"):
            zmuon.Muon([p], rounding="up")
        with self.assertRaisesRegex(zmuon.InvalidArgument, "rounding_seed"):
            zmuon.Muon([p], rounding="stochastic", rounding_seed=-1)


class DeviceFromTheTensors(unittest.TestCase):
    """The engine's backend and GPU from the tensors' device (device_overrides, given the
    devices as tensor_devices finds them), each case against the overrides it must give; the
    GPU runs are tests/python/gpu_torch_device.py's."""

    def overrides(self, devices, config=None, given=(), host_staging=False):
        from zmuon._construction import device_overrides
        return device_overrides(devices, config or {}, list(given), host_staging)

    def test_each_device_and_config(self):
        cases = [
            (({"cpu": "w"},), []),
            (({"cuda:0": "w"},), ["zmuon.backend=cuda"]),
            (({"cuda:3": "w"},), ["zmuon.backend=cuda", "zmuon.device=3"]),
            (({"cuda:2": "w"}, {"zmuon": {"backend": "cuda"}}), ["zmuon.device=2"]),
            (({"cuda:2": "w"}, None, ["zmuon.backend=cuda"]), ["zmuon.device=2"]),
            (({"cuda:2": "w"}, {"zmuon": {"device": 1}}), ["zmuon.backend=cuda"]),
            (({"cuda:2": "w"}, {"zmuon": {"backend": "host"}}), []),
            (({"cuda:2": "w"}, None, (), True), []),  # host_staging: the host backend
        ]
        for args, want in cases:
            with self.subTest(args=args):
                self.assertEqual(self.overrides(*args), want)

    def test_two_devices_are_refused_by_name(self):
        for devices in ({"cuda:0": "a", "cuda:1": "b"}, {"cpu": "a", "cuda:1": "b"}):
            (d1, n1), (d2, n2) = devices.items()
            with self.assertRaisesRegex(zmuon.InvalidArgument, f"'{n1}' on {d1}, '{n2}' on "
                                        f"{d2}"):
                self.overrides(devices)

    def test_the_engine_takes_the_device_key(self):
        p = nn.Parameter(torch.randn(4, 3))
        with self.assertRaisesRegex(zmuon.InvalidArgument, "zmuon.device"):
            zmuon.Muon([p], {"zmuon": {"device": -1}})
        opt = zmuon.Muon([p], {"zmuon": {"device": 1}})  # the host backend has no GPU to pick
        p.grad = torch.ones_like(p)
        opt.step()
        self.assertEqual(opt.last_step["step"], 1)


if __name__ == "__main__":
    unittest.main()
