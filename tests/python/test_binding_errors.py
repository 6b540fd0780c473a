"""The Python binding's answers to bad arguments (python/zmuon): each raises the zmuon exception
that names what is wrong (the engine's message, or the binding's own check before anything is
handed over), and a failed call changes nothing.

Run by ctest as test_binding is (tests/embed.cmake): Debian's /usr/bin/python3,
PYTHONPATH=python, ZMUON_LIBRARY=libzmuon.so.
"""

import os
import tempfile
import unittest

import numpy as np

import zmuon
from test_binding import (CONFIG, TABLE, FakeCudaTensor, make_grads, make_params, run_steps,
                          same_params)


class BadArguments(unittest.TestCase):

    def setUp(self):
        self.params = make_params(5)
        self.opt = zmuon.Muon(self.params)

    def test_wrong_gradient_size_is_a_shape_error(self):
        with self.assertRaises(zmuon.ShapeMismatch) as cm:
            self.opt.accumulate({"blocks.0.mlp.fc": np.zeros(5, np.float32)})
        self.assertIsInstance(cm.exception, ValueError)
        self.assertEqual(str(cm.exception),
                         "gradient of 'blocks.0.mlp.fc' has shape (5,), the parameter's is (16, 8)")
        # The engine's own check of the element count, under the binding's (through the C ABI).
        g = np.zeros(5, np.float32)
        with self.assertRaises(zmuon.ShapeMismatch) as cm:
            self.opt._engine.reduce(0, [("blocks.0.mlp.fc", g.ctypes.data, g.size, zmuon.HOST)])
        self.assertEqual(str(cm.exception),
                         "gradient of 'blocks.0.mlp.fc' has 5 elements, expected 128")

    def test_close_from_another_thread_waits_for_the_step_in_flight(self):
        # close() while another thread steps: it waits for that step (not for the step's
        # timeout, here 10 minutes), and the stepping thread's next call says the engine is closed.
        import threading
        import time
        opt = zmuon.Muon(make_params(5), {"zmuon": {"timeout_ms": 600000}})
        seen, steps = [], [0]

        def train():
            try:
                while True:
                    opt.accumulate(make_grads(5, steps[0], 0, 0))
                    opt.step()
                    steps[0] += 1
            except zmuon.BadState as e:
                seen.append(str(e))

        worker = threading.Thread(target=train)
        worker.start()
        while steps[0] < 3:
            time.sleep(0.01)
        opt.close()
        worker.join(60)
        self.assertFalse(worker.is_alive(), "the stepping thread still runs a minute after close()")
        self.assertEqual(seen, ["the engine is closed"])

    def test_a_rank_past_int32_is_refused_not_wrapped(self):
        # ctypes wrapped 2**32 to rank 0: the gradients went to another rank.
        grads = make_grads(5, 1, 0, 0)
        for rank in (2**32, 2**31, -2**31 - 1):
            with self.assertRaisesRegex(zmuon.InvalidArgument, "is not a rank"):
                self.opt.accumulate(grads, rank=rank)

    def test_gradient_of_another_shape_with_the_same_size_is_refused(self):
        # A (2, 8) or a flat (16,) gradient of an (8, 2) parameter: ShapeMismatch naming both
        # shapes, and nothing of that call handed over (the good gradient beside it neither).
        params = {"w": np.zeros((8, 2), np.float32), "b": np.zeros(4, np.float32)}
        opt = zmuon.Muon(params)
        for bad in (np.ones((2, 8), np.float32), np.ones(16, np.float32),
                    np.ones((1, 8, 2), np.float32)):
            with self.subTest(shape=bad.shape):
                with self.assertRaises(zmuon.ShapeMismatch) as cm:
                    opt.accumulate(grads={"b": np.ones(4, np.float32), "w": bad})
                self.assertEqual(str(cm.exception), f"gradient of 'w' has shape {bad.shape}, "
                                 "the parameter's is (8, 2)")
                with self.assertRaises(zmuon.ShapeMismatch):  # a list in parameter order too
                    opt.accumulate(grads=[bad, np.ones(4, np.float32)])
        with self.assertRaises(zmuon.BadState):  # nothing was handed over
            opt.step()
        two = zmuon.Muon({"w": np.zeros((8, 2), np.float32)}, ranks=2)
        with self.assertRaisesRegex(zmuon.ShapeMismatch, r"^accumulate_all\(\): rank 1: "
                                    r"gradient of 'w' has shape \(2, 8\), the parameter's is "
                                    r"\(8, 2\)$"):
            two.accumulate_all([{"w": np.ones((8, 2), np.float32)},
                                {"w": np.ones((2, 8), np.float32)}])
        with self.assertRaises(zmuon.BadState):
            two.step()
        opt.accumulate(grads={"w": np.ones((8, 2), np.float32), "b": np.ones(4, np.float32)})
        opt.step()
        self.assertEqual(opt.last_step["micro_batches"], 1)
        self.assertGreater(np.abs(params["w"]).max(), 0)

    def test_unknown_gradient_name(self):
        with self.assertRaises(zmuon.UnknownParameter) as cm:
            self.opt.accumulate({"blocks.9.mlp.fc": np.zeros(128, np.float32)})
        self.assertIn("'blocks.9.mlp.fc', which is not a registered parameter",
                      str(cm.exception))

    def test_misspelled_config_key_names_the_key(self):
        with self.assertRaises(zmuon.InvalidArgument) as cm:
            zmuon.Muon(self.params, {"optimizer": {"params": {"momentun": 0.9}}})
        self.assertIn("unknown key 'optimizer.params.momentun' (did you mean 'momentum'?)",
                      str(cm.exception))

    def test_misspelled_or_bad_keyword_hyperparameter_names_it(self):
        with self.assertRaises(zmuon.InvalidArgument) as cm:
            zmuon.Muon(self.params, momentun=0.9)
        self.assertEqual(str(cm.exception), "zmuon.Muon(momentun=0.9): unknown key "
                         "'optimizer.params.momentun' (did you mean 'momentum'?)")
        with self.assertRaises(zmuon.InvalidArgument) as cm:
            zmuon.Muon(self.params, lr=0.02, momentum=1.5)
        self.assertTrue(str(cm.exception).startswith("optimizer.params.momentum"),
                        str(cm.exception))
        with self.assertRaises(TypeError) as cm:
            zmuon.Muon(self.params, betas={0.9, 0.95})
        self.assertIn("zmuon.Muon(betas=...)", str(cm.exception))

    def test_out_of_range_config_value(self):
        with self.assertRaises(zmuon.InvalidArgument) as cm:
            zmuon.Muon(self.params, {"optimizer": {"params": {"momentum": 1.5}}})
        self.assertIn("optimizer.params.momentum", str(cm.exception))

    def test_bad_json_file(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            f.write('{"zmuon": ')
        try:
            with self.assertRaises(zmuon.InvalidArgument) as cm:
                zmuon.Muon(self.params, f.name)
            self.assertIn("invalid JSON", str(cm.exception))
        finally:
            os.unlink(f.name)

    def test_accumulate_all_checks_every_rank_first(self):
        opt = zmuon.Muon(make_params(5), CONFIG)  # two ranks
        good = make_grads(2, 1, 0, 0)
        short = dict(make_grads(2, 1, 1, 0))
        short["norm.weight"] = short["norm.weight"][:-1]
        with self.assertRaisesRegex(zmuon.ShapeMismatch,
                                    r"accumulate_all\(\): rank 1: .*'norm\.weight' has shape"):
            opt.accumulate_all([good, short])
        with self.assertRaisesRegex(zmuon.InvalidArgument, "1 gradient sets for 2 local rank"):
            opt.accumulate_all([good])
        opt.accumulate_all([good, make_grads(2, 1, 1, 0)])  # nothing was handed over before
        opt.step()
        self.assertEqual(opt.last_step["micro_batches"], 1)

    def test_step_before_any_gradient(self):
        with self.assertRaises(zmuon.BadState) as cm:
            self.opt.step()
        self.assertEqual("step() before any gradient: call loss.backward() (or accumulate()) "
                         "first", str(cm.exception))

    def test_heads_that_do_not_divide_rows(self):
        with self.assertRaises(zmuon.InvalidArgument) as cm:
            zmuon.Muon(self.params, heads={"blocks.0.attn.qkv": 5})
        self.assertIn("heads=5 do not divide rows=12", str(cm.exception))

    def test_duplicate_name(self):
        with self.assertRaises(zmuon.DuplicateParameter) as cm:
            zmuon.Muon([("w", self.params["blocks.0.mlp.fc"]),
                        ("w", self.params["blocks.0.mlp.proj"])])
        self.assertIn("'w' is registered twice", str(cm.exception))

    def test_wrong_dtype_and_layout_are_caught_before_the_engine(self):
        with self.assertRaises(TypeError):
            self.opt.accumulate({"norm.weight": np.zeros(8, np.float64)})
        with self.assertRaises(ValueError):
            self.opt.accumulate({"blocks.0.mlp.fc": np.zeros((8, 16), np.float32).T})
        with self.assertRaises(TypeError):
            zmuon.Muon([np.zeros(8)])  # float64, no fp32 masters for numpy arrays
        with self.assertRaises(TypeError):
            zmuon.Muon([1.5])  # not a tensor

    def test_cuda_buffers_get_the_engines_unsupported_error(self):
        w = FakeCudaTensor((0.1 * np.ones((8, 4))).astype(np.float32))
        opt = zmuon.Muon([("w", w)])
        with self.assertRaises(zmuon.Unsupported) as cm:
            opt.accumulate({"w": FakeCudaTensor(np.ones((8, 4), np.float32))})
        self.assertIsInstance(cm.exception, NotImplementedError)
        self.assertIn("'w' is a CUDA device buffer (device 0), which compute backend 'host' "
                      "cannot read", str(cm.exception))

    def test_bad_learning_rate_in_param_groups_is_refused_before_the_step(self):
        # inf, nan, a negative number, a string, a bool: InvalidArgument naming the group and the
        # value, before anything runs; the state is untouched and a valid lr then works.
        before = {n: p.copy() for n, p in self.params.items()}
        self.opt.accumulate(make_grads(5, 1, 0, 0))
        for group, bad, shown in ((1, float("inf"), "inf"), (0, float("nan"), "nan"),
                                  (0, -0.01, "-0.01"), (1, "0.1", "'0.1'"), (0, None, "None"),
                                  (1, True, "True"), (0, 1e39, "1e+39")):
            with self.subTest(group=group, lr=bad):
                good = self.opt.param_groups[group]["lr"]
                self.opt.param_groups[group]["lr"] = bad
                with self.assertRaises(zmuon.InvalidArgument) as cm:
                    self.opt.step()
                self.assertTrue(str(cm.exception).startswith(
                    f"param_groups[{group}]['lr'] must be a finite number >= 0, got {shown}"),
                    str(cm.exception))
                self.opt.param_groups[group]["lr"] = good
                for n, _ in TABLE:
                    self.assertTrue(np.array_equal(self.params[n], before[n]), n)
        self.opt.param_groups[1]["lr"] = np.float32(0.002)  # numpy scalars are numbers
        self.opt.step()  # the micro-batch handed over before is still there
        self.assertEqual(self.opt.last_step["micro_batches"], 1)
        self.assertTrue(all(np.isfinite(p).all() for p in self.params.values()))
        self.assertFalse(np.array_equal(self.params["norm.weight"], before["norm.weight"]))

    def test_a_value_changed_in_place_is_checked_again(self):
        # step() checks the groups again only where a value changed since the last check: a
        # list or a 0-d array written in place counts as a change.
        adam = next(i for i, g in enumerate(self.opt.param_groups) if not g.get("use_muon"))
        group = self.opt.param_groups[adam]
        group["betas"] = [0.9, 0.95]
        group["lr"] = np.array(0.002, dtype=np.float32)
        self.opt.accumulate(make_grads(5, 1, 0, 0))
        self.opt.step()
        for value, key, shown in (("betas", "betas", "1.5"), ("lr", "lr", "inf")):
            with self.subTest(key=key):
                self.opt.accumulate(make_grads(5, 2, 0, 0))
                before = {n: p.copy() for n, p in self.params.items()}
                if key == "betas":
                    group["betas"][0] = 1.5
                else:
                    group["lr"][...] = np.inf
                with self.assertRaises(zmuon.InvalidArgument) as cm:
                    self.opt.step()
                self.assertIn(f"param_groups[{adam}]['{key}']", str(cm.exception))
                self.assertIn(shown, str(cm.exception))
                for n, _ in TABLE:
                    self.assertTrue(np.array_equal(self.params[n], before[n]), n)
                if key == "betas":
                    group["betas"][0] = 0.9
                else:
                    group["lr"][...] = 0.002
                self.opt.step()

    def test_groups_naming_an_unknown_parameter(self):
        with self.assertRaises(zmuon.UnknownParameter) as cm:
            zmuon.Muon(self.params, groups={"blocks.0.mlp.fx": "adamw"})
        self.assertEqual(str(cm.exception), "groups names 'blocks.0.mlp.fx', which is not a "
                         "parameter (did you mean 'blocks.0.mlp.fc'?)")
        with self.assertRaises(zmuon.UnknownParameter) as cm:
            zmuon.Muon(self.params, groups=[{"params": ["nope"], "use_muon": False}])
        self.assertEqual(str(cm.exception), "groups[0] names 'nope', which is not a parameter")
        with self.assertRaises(zmuon.UnknownParameter) as cm:
            zmuon.Muon({"w": np.zeros((8, 2), np.float32)}, groups={"wx": "adamw"})
        self.assertEqual(str(cm.exception),
                         "groups names 'wx', which is not a parameter (did you mean 'w'?)")
        with self.assertRaisesRegex(zmuon.InvalidArgument, "group of 'w' is \\['adamw'\\]"):
            zmuon.Muon({"w": np.zeros((8, 2), np.float32)}, groups={"w": ["adamw"]})
        with self.assertRaisesRegex(zmuon.InvalidArgument, "'params' must be a list"):
            zmuon.Muon({"w": np.zeros((8, 2), np.float32)},
                       groups=[{"params": "w", "use_muon": False}])

    def test_load_state_dict_refuses_bad_learning_rates_before_loading(self):
        other = make_params(13)
        source = zmuon.Muon(other)
        run_steps(source, 13, (1,))
        state = source.state_dict()
        for lrs, shown in ((["a", "b"], "'a'"), ([float("nan")] * 2, "nan"), ([-1, -1], "-1"),
                           ([0.02, float("inf")], "inf")):
            with self.subTest(lrs=lrs):
                with self.assertRaises(zmuon.InvalidArgument) as cm:
                    self.opt.load_state_dict(dict(state, param_groups=[
                        dict(g, lr=lr) for g, lr in zip(state["param_groups"], lrs)]))
                self.assertIn("param_groups[", str(cm.exception))
                self.assertIn(f"got {shown}", str(cm.exception))
                self.assertEqual([g["lr"] for g in self.opt.param_groups], [0.02, 3e-4])
                self.assertEqual(same_params(self.params, make_params(5)), [])  # nothing loaded
        self.opt.load_state_dict(state)
        self.assertEqual(same_params(self.params, other), [])

    def test_names_and_paths_with_a_nul_character(self):
        x = np.zeros((4, 4), np.float32)
        with self.assertRaises(zmuon.InvalidArgument) as cm:
            zmuon.Muon({"a\0b": x})
        self.assertEqual(str(cm.exception), "parameter name 'a\\x00b' contains a NUL character")
        opt = zmuon.Muon({"a": x})
        with self.assertRaises(zmuon.InvalidArgument) as cm:  # would be read as 'a'
            opt.accumulate(grads={"a\0junk": np.ones((4, 4), np.float32)})
        self.assertEqual(str(cm.exception), "gradient name 'a\\x00junk' contains a NUL character")
        with self.assertRaises(zmuon.BadState):  # nothing was handed over
            opt.step()
        with tempfile.TemporaryDirectory() as tmp:
            cut = os.path.join(tmp, "ckpt")
            for call, what in ((opt.save_checkpoint, "checkpoint directory"),
                               (opt.load_checkpoint, "checkpoint directory"),
                               (opt.write_call_timeline, "timeline path")):
                with self.assertRaises(zmuon.InvalidArgument) as cm:
                    call(cut + "\0.old")
                self.assertIn(f"{what} ", str(cm.exception))
                self.assertIn("contains a NUL character", str(cm.exception))
            self.assertEqual(os.listdir(tmp), [])  # nothing written at the shorter path
            with self.assertRaisesRegex(zmuon.InvalidArgument,
                                        "config file .* contains a NUL character"):
                zmuon.Muon({"a": x}, os.path.join(tmp, "c.json\0x"))
        with self.assertRaisesRegex(zmuon.InvalidArgument,
                                    "override 'zmuon.ranks=1\\\\x002' contains a NUL"):
            zmuon.Muon({"a": x}, overrides=["zmuon.ranks=1\0" "2"])
        with self.assertRaisesRegex(zmuon.InvalidArgument, "override must be a string, got int"):
            zmuon.Muon({"a": x}, overrides=[3])
        with self.assertRaisesRegex(zmuon.InvalidArgument, "gradient name must be a string"):
            opt.accumulate(grads={3: np.ones((4, 4), np.float32)})
        state = opt.state_dict()
        bad = dict(state, param_groups=[dict(g, param_names=[n + "\0x" for n in g["param_names"]])
                                        for g in state["param_groups"]])
        with self.assertRaisesRegex(zmuon.InvalidArgument, "param_names"):
            opt.load_state_dict(bad)
        with self.assertRaisesRegex(zmuon.InvalidArgument, "options JSON .* NUL"):
            zmuon._capi.Orthogonalizer("host", 0, '{"ns_steps": 5}\0junk')

    def test_a_failed_call_changes_nothing(self):
        before = {n: p.copy() for n, p in self.params.items()}
        with self.assertRaises(zmuon.ShapeMismatch):
            self.opt.accumulate({"norm.weight": np.ones(8, np.float32),
                                 "blocks.0.mlp.fc": np.ones(3, np.float32)})
        # Nothing was handed over: a step now is still "before any gradient".
        with self.assertRaises(zmuon.BadState):
            self.opt.step()
        for n, _ in TABLE:
            self.assertTrue(np.array_equal(self.params[n], before[n]))


if __name__ == "__main__":
    unittest.main()
