"""zmuon.Muon with a DeepSpeed config: its scheduler shown in param_groups and used by the update,
DeepSpeed's lr rule, "auto" from the keywords, and each step's metrics forwarded (docs/CONFIG.md).
Run by ctest (python_test_torch_deepspeed) with .venv's torch."""

import copy
import importlib.util
import math
import unittest

import torch

import zmuon


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batches(n):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(6, 8, generator=g) for _ in range(n)]


def loss_of(m, x):
    return m(x).square().mean()


def warmup_decay(k, lo, hi, warmup, total):
    """DeepSpeed's WarmupDecayLR (linear warmup) at scheduler iteration k. The scheduler steps
    after the optimizer, and its first rate (k = -1) is the minimum: optimizer step i uses
    iteration i - 1."""
    if k < 0:
        return lo
    if k < warmup:
        return lo + (hi - lo) * k / warmup
    return hi * max(0.0, (total - k) / max(1, total - warmup))


class SchedulerInParamGroups(unittest.TestCase):
    def test_param_groups_show_the_schedule_and_the_update_uses_it(self):
        lo, hi, warmup, total = 0.0, 0.01, 3, 8
        config = {"scheduler": {"type": "WarmupDecayLR", "params": {
            "warmup_min_lr": lo, "warmup_max_lr": hi, "warmup_num_steps": warmup,
            "total_num_steps": total, "warmup_type": "linear"}}}
        scheduled, manual = model(), model()
        opt = zmuon.Muon(scheduled.named_parameters(), config=config)
        ref = zmuon.Muon(manual.named_parameters())  # no scheduler: lr written by the test
        worst_lr, worst_weight = 0.0, 0.0
        for k, x in enumerate(batches(total)):
            want = warmup_decay(k - 1, lo, hi, warmup, total)
            for g in opt.param_groups:
                worst_lr = max(worst_lr, abs(g["lr"] - want))
            for g_ref, g in zip(ref.param_groups, opt.param_groups):
                g_ref["lr"] = g["lr"]
            before = [p.detach().clone() for p in scheduled.parameters()]
            for m, o in ((scheduled, opt), (manual, ref)):
                o.zero_grad()
                loss_of(m, x).backward()
                o.step()
            if want == 0.0:  # a zero rate must leave the weights as they were
                for b, p in zip(before, scheduled.parameters()):
                    self.assertTrue(torch.equal(b, p), f"step {k}: lr 0 changed a weight")
            for p, q in zip(scheduled.parameters(), manual.parameters()):
                worst_weight = max(worst_weight, (p - q).abs().max().item())
        print(f"scheduled lr vs DeepSpeed's formula: worst {worst_lr:.2e}; weights vs the same "
              f"lr written by hand: worst {worst_weight:.2e}")
        self.assertLess(worst_lr, 1e-8)  # float32 rates
        self.assertEqual(worst_weight, 0.0)

    def test_a_group_the_caller_sets_is_left_to_the_caller(self):
        config = {"scheduler": {"type": "WarmupLR", "params": {
            "warmup_min_lr": 0.0, "warmup_max_lr": 0.01, "warmup_num_steps": 4}}}
        m = model()
        opt = zmuon.Muon(m.named_parameters(), config=config)
        opt.param_groups[1]["lr"] = 1e-3  # e.g. a torch scheduler on the AdamW group
        for x in batches(3):
            opt.zero_grad()
            loss_of(m, x).backward()
            opt.step()
        self.assertEqual(opt.param_groups[1]["lr"], 1e-3)
        # the fourth step uses iteration 2 of the default (log) warmup: log(3) / log(4)
        self.assertAlmostEqual(opt.param_groups[0]["lr"], 0.01 * math.log(3) / math.log(4),
                               places=7)


class LrRule(unittest.TestCase):
    def lrs(self, params, **keywords):
        opt = zmuon.Muon(model().named_parameters(),
                         config={"optimizer": {"type": "Muon", "params": params}}, **keywords)
        return {g["use_muon"]: round(g["lr"], 9) for g in opt.param_groups}  # float32 rates

    def test_lr_alone_applies_to_both_groups_as_in_deepspeed(self):
        self.assertEqual(self.lrs({"lr": 0.005}), {True: 0.005, False: 0.005})

    def test_muon_lr_and_adam_lr_each_their_own(self):
        self.assertEqual(self.lrs({"lr": 0.005, "muon_lr": 0.02, "adam_lr": 1e-3}),
                         {True: 0.02, False: 1e-3})

    def test_auto_takes_the_keyword(self):
        got = self.lrs({"lr": "auto", "weight_decay": "auto"}, lr=0.004, weight_decay=0.1)
        self.assertEqual(got, {True: 0.004, False: 0.004})


class Metrics(unittest.TestCase):
    def test_one_record_per_step_with_the_closures_loss(self):
        records = []
        m = model()
        opt = zmuon.Muon(m.named_parameters(), on_metrics=records.append)
        losses = []
        for x in batches(4):
            def closure():
                opt.zero_grad()
                loss = loss_of(m, x)
                loss.backward()
                return loss
            losses.append(opt.step(closure).item())
        self.assertEqual([r["step"] for r in records], [1, 2, 3, 4])
        for r, loss in zip(records, losses):
            self.assertAlmostEqual(r["loss"], loss, places=6)
            self.assertTrue(math.isfinite(r["grad_norm"]))
            self.assertEqual(set(r["lr"]), {"muon", "adamw"})

    def test_tensorboard_writes_or_says_what_is_missing(self):
        config = {"tensorboard": {"enabled": True, "output_path": self.tmp(), "job_name": "j"}}
        if importlib.util.find_spec("tensorboard") is None:
            with self.assertRaisesRegex(zmuon.InvalidArgument, "tensorboard"):
                zmuon.Muon(model().named_parameters(), config=copy.deepcopy(config))
            return
        m = model()
        opt = zmuon.Muon(m.named_parameters(), config=config)
        opt.zero_grad()
        loss_of(m, batches(1)[0]).backward()
        opt.step()
        import os
        files = os.listdir(os.path.join(config["tensorboard"]["output_path"], "j"))
        self.assertTrue(any(f.startswith("events.out.tfevents") for f in files), files)

    def test_comet_is_refused_by_name(self):
        with self.assertRaisesRegex(zmuon.InvalidArgument, "comet"):
            zmuon.Muon(model().named_parameters(), config={"comet": {"enabled": True}})

    def tmp(self):
        import tempfile
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        return d.name


if __name__ == "__main__":
    unittest.main()
