"""DeepSpeed's ZeRO-3 configs through the C ABI from Python (zmuon._capi): the shapes HF
transformers, accelerate, DeepSpeedExamples and DeepSpeed's Muon page document build an engine
with their notes; "auto" takes the host's lr and weight decay; DeepSpeed's lr rule on the update;
the scheduler's rates as param_groups would show them; a step record per step.

Run by ctest (tests/python/CMakeLists.txt): Debian's /usr/bin/python3, PYTHONPATH=python,
ZMUON_LIBRARY=libzmuon.so.
"""

import ctypes
import json
import unittest

import numpy as np

from zmuon import _capi

HF_ZERO3 = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "Muon", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                             "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto",
                                                 "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "none", "pin_memory": True},
        "offload_param": {"device": "none", "pin_memory": True}, "overlap_comm": True,
        "contiguous_gradients": True, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}

ACCELERATE_ZERO3 = {
    "fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "Muon", "params": {"lr": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR",
                  "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                             "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {
        "stage": 3, "overlap_comm": True, "contiguous_gradients": True,
        "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto", "sub_group_size": 1e9,
        "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": "auto"},
    "gradient_accumulation_steps": 1, "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}

DEEPSPEED_EXAMPLES = {
    "train_batch_size": 16, "steps_per_print": 2000,
    "optimizer": {"type": "Muon", "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8,
                                             "weight_decay": 3e-7}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
                                                 "warmup_num_steps": 1000}},
    "gradient_clipping": 1.0, "prescale_gradients": False,
    "fp16": {"enabled": True, "fp16_master_weights_and_grads": False, "loss_scale": 0,
             "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 1,
             "initial_scale_power": 15},
    "wall_clock_breakdown": False,
    "zero_optimization": {"stage": 3, "allgather_partitions": True, "reduce_scatter": True,
                          "allgather_bucket_size": 50000000, "reduce_bucket_size": 50000000,
                          "overlap_comm": True, "contiguous_gradients": True,
                          "cpu_offload": False},
}

DEEPSPEED_MUON = {
    "optimizer": {"type": "Muon", "params": {"lr": 0.001, "momentum": 0.9, "weight_decay": 0.0,
                                             "muon_lr": 0.001, "ns_method": "gram"}},
    "zero_optimization": {"stage": 3, "save_muon_momentum_buffer_in_memory": True},
}

# The Python call's values, as HF's Trainer resolves "auto" from its TrainingArguments.
HOST = {"host": "python", "lr": 0.01, "weight_decay": 0.1, "total_num_steps": 10,
        "warmup_num_steps": 4}


def make(config, ranks=1, host=HOST):
    config = dict(config, zmuon={"ranks": ranks})
    return _capi.engine_with_host(json.dumps(config), (), host)


def register(eng):
    """A Muon matrix and an AdamW vector, with their buffers."""
    w = np.full((8, 4), 0.5, np.float32)
    b = np.full(4, 0.25, np.float32)
    for name, a, group in (("w", w, _capi.GROUP_MUON), ("b", b, _capi.GROUP_ADAMW)):
        eng.add_parameter(name, a.shape, group, 0, a.ctypes.data, a.size)
    return w, b


def step(eng, params, grads, rank=0):
    keep = [np.ascontiguousarray(g, np.float32) for g in grads]
    eng.reduce(rank, [(n, g.ctypes.data, g.size, _capi.HOST)
                      for n, g in zip(("w", "b"), keep)])
    info = eng.step()
    eng.gather_params([(n, p.ctypes.data, p.size, _capi.HOST) for n, p in zip(("w", "b"), params)])
    return info


GW = np.sin(0.7 * np.arange(32, dtype=np.float32)).reshape(8, 4) + 0.1
GB = np.array([0.5, -1.0, 2.0, -0.25], np.float32)


class DeepSpeedConfigs(unittest.TestCase):

    def test_four_configs_build_an_engine_with_their_notes(self):
        cases = {
            "hf": (HF_ZERO3, ["zero_optimization.overlap_comm",
                              "optimizer.params.lr = 0.01 (the host's lr)",
                              "optimizer.params.weight_decay = 0.1 (the host's weight_decay)",
                              "scheduler.params.warmup_max_lr = 0.01 (the host's lr)"]),
            "accelerate": (ACCELERATE_ZERO3, [
                "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                "scheduler.params.total_num_steps = 10 (the host's total_num_steps)"]),
            "examples": (DEEPSPEED_EXAMPLES, ["prescale_gradients",
                                              "zero_optimization.allgather_bucket_size"]),
            "muon": (DEEPSPEED_MUON, ["zero_optimization.save_muon_momentum_buffer_in_memory"]),
        }
        for name, (config, notes) in cases.items():
            with self.subTest(config=name):
                eng = make(config, ranks=2 if name == "examples" else 1)
                text = "\n".join(_capi.engine_notes(eng))
                for note in notes:
                    self.assertIn(note, text)
                params = register(eng)
                for _ in range(2):
                    for rank in range(eng.world):
                        keep = [GW, GB]
                        eng.reduce(rank, [(n, g.ctypes.data, g.size, _capi.HOST)
                                          for n, g in zip(("w", "b"), keep)])
                    info = eng.step()
                self.assertEqual(info["step"], 2)
                eng.close()

    def test_a_typo_is_an_error_naming_the_key(self):
        with self.assertRaises(_capi.InvalidArgument) as cm:
            make({"zero_optimization": {"stage3_prefetch_bucket": 1}, "steps_per_prnt": 1})
        message = str(cm.exception)
        self.assertIn("the config has 2 problems:", message)
        self.assertIn("(did you mean 'stage3_prefetch_bucket_size'?)", message)
        self.assertIn("(did you mean 'steps_per_print'?)", message)

    def test_lr_rule_on_the_update(self):
        """Only lr: both groups take it; AdamW's first step moves b by lr * g / (|g| + eps)."""
        def run(params_section):
            eng = make({"optimizer": {"params": params_section}}, host=None)
            w, b = register(eng)
            w0, b0 = w.copy(), b.copy()
            step(eng, (w, b), (GW, GB))
            eng.close()
            return w0 - w, b0 - b
        dw1, db1 = run({"lr": 0.01})
        np.testing.assert_allclose(db1, 0.01 * GB / (np.abs(GB) + 1e-10), rtol=1e-5)
        dw4, db4 = run({"lr": 0.5, "muon_lr": 0.04, "adam_lr": 0.002})
        np.testing.assert_allclose(db4, 0.002 * GB / (np.abs(GB) + 1e-10), rtol=1e-5)
        np.testing.assert_allclose(dw4, 4 * dw1, rtol=1e-4, atol=1e-9)
        self.assertGreater(float(np.abs(dw1).sum()), 0)

    def test_the_scheduler_shows_in_the_next_rates(self):
        """WarmupLR, linear over 4 steps from 0 to each group's lr: what param_groups show."""
        eng = make({"optimizer": {"params": {"muon_lr": 0.02, "adam_lr": 0.002}},
                    "scheduler": {"type": "WarmupLR",
                                  "params": {"warmup_type": "linear", "warmup_num_steps": 4}}},
                   host=None)
        params = register(eng)
        seen = []
        for s in range(1, 7):
            seen.append(_capi.engine_next_lrs(eng))
            step(eng, params, (GW, GB))
        for s, (muon, adam) in enumerate(seen, start=1):
            k = max(0, s - 2)  # DeepSpeed's iteration: applied steps - 1, 0 before the first
            self.assertAlmostEqual(muon, 0.02 * min(k, 4) / 4, places=7)
            self.assertAlmostEqual(adam, 0.002 * min(k, 4) / 4, places=7)
        eng.close()

    def test_one_record_per_step_reaches_the_callback(self):
        eng = make({"optimizer": {"params": {"muon_lr": 0.02, "adam_lr": 0.002}}}, host=None)
        params = register(eng)
        records = []
        _capi.set_metrics_callback(eng, records.append)
        for s in range(3):
            _capi.log_loss(eng, 1.5 - s)
            step(eng, params, (GW, GB))
        self.assertEqual([r["step"] for r in records], [1, 2, 3])
        self.assertEqual([r["loss"] for r in records], [1.5, 0.5, -0.5])
        for r in records:
            self.assertAlmostEqual(r["lr"]["muon"], 0.02, places=7)
            self.assertAlmostEqual(r["lr"]["adamw"], 0.002, places=7)
            self.assertGreater(r["grad_norm"], 0)
            self.assertFalse(r["skipped"])
        eng.close()


if __name__ == "__main__":
    unittest.main()
