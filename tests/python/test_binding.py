"""The Python binding (python/zmuon) on the CPU with numpy: a job through zmuon.Muon gives
bit-identical parameters to the same job through the C++ engine (tests/embed_reference.cpp); one
step matches a float64 numpy reference of the contract; bad arguments raise Python exceptions
carrying the engine's message.

Run by ctest with Debian's /usr/bin/python3, PYTHONPATH=python, ZMUON_LIBRARY=libzmuon.so and
ZMUON_REFERENCE=embed_reference.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile
import types
import unittest

import numpy as np

import zmuon

try:  # PyTorch is optional: CI has none; where it is installed, the torch path is checked too
    import torch
except ImportError:
    if os.environ.get("ZMUON_TEST_TORCH") == "required":  # python_test_binding_torch
        raise
    torch = None

NS_ABC = (3.4445, -4.7750, 2.0315)


def write_safetensors(path, tensors, metadata=None):
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name, arr in tensors:
        blob = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + begin:8 + n + end], dtype="<f4").reshape(
            info["shape"])
    return out


def ns5_float64(g):
    x = g.astype(np.float64)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (np.linalg.norm(x) + 1e-7)
    a, b, c = NS_ABC
    for _ in range(5):
        m = x @ x.T
        x = a * x + (b * m + c * m @ m) @ x
    return x.T if tall else x


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


# A small model's table: (name, shape). The default rule puts the two matrices of the block in
# Muon and embed/lm_head/vectors in AdamW.
TABLE = [("embed.weight", (20, 8)), ("blocks.0.attn.qkv", (12, 8)), ("blocks.0.mlp.fc", (16, 8)),
         ("blocks.0.mlp.proj", (8, 16)), ("norm.weight", (8,)), ("lm_head.weight", (20, 8))]

CONFIG = {"gradient_clipping": 1.0,
          "optimizer": {"type": "Muon",
                        "params": {"muon_lr": 0.02, "adam_lr": 0.001, "weight_decay": 0.1}},
          "zmuon": {"ranks": 2}}


def make_params(seed):
    rng = np.random.default_rng(seed)
    return {n: (0.1 * rng.standard_normal(s)).astype(np.float32) for n, s in TABLE}


def make_grads(seed, step, rank, micro):
    rng = np.random.default_rng([seed, step, rank, micro])
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in TABLE}


def run_steps(opt, seed, steps):
    """One micro-batch of rank 0 and a step, for each of `steps`."""
    for step in steps:
        opt.accumulate(make_grads(seed, step, 0, 0))
        opt.step()


def same_params(got, want):
    """The names whose values differ in any bit."""
    return [n for n, _ in TABLE if not np.array_equal(got[n], want[n])]


class FakeCudaTensor:
    """What the binding reads of a CUDA torch.Tensor (data_ptr, is_cuda, device, dtype, ...),
    backed by host memory: enough to show that a CUDA buffer goes to the engine as a device
    pointer and comes back as the engine's 'not supported' error."""

    class _Device:
        type = "cuda"

        def __init__(self, index):
            self.index = index

        def __eq__(self, other):  # as torch.device: by value
            return (self.type, self.index) == (other.type, other.index)

        def __hash__(self):
            return hash((self.type, self.index))

    def __init__(self, arr, device=0):
        self.arr, self.shape, self.dtype = arr, arr.shape, "torch.float32"
        self.is_cuda, self.device, self.grad = True, self._Device(device), None

    def data_ptr(self):
        return self.arr.__array_interface__["data"][0]

    def is_contiguous(self):
        return True

    def numel(self):
        return self.arr.size

    def get_device(self):
        return self.device.index

    def detach(self):
        return self

    def to(self, device):
        assert device == "cpu"
        return self

    def contiguous(self):
        return self.arr.copy()

    @property
    def data(self):
        return self

    def copy_(self, src):
        np.copyto(self.arr, src)


class BindingMatchesEngine(unittest.TestCase):

    def test_job_matches_the_cpp_engine_bit_for_bit(self):
        # 2 ranks, 2 micro-batches, 2 steps; per-head Muon on qkv; proj moved to AdamW.
        params = make_params(1)
        initial = {n: p.copy() for n, p in params.items()}
        opt = zmuon.Muon(params, CONFIG, groups={"blocks.0.mlp.proj": "adamw"},
                         heads={"blocks.0.attn.qkv": 3})
        self.assertEqual(opt.world, 2)
        grads = {}
        for step in (1, 2):
            for micro in (0, 1):
                for rank in (0, 1):
                    grads[(step, rank, micro)] = make_grads(7, step, rank, micro)
                if step == 1:  # rank after rank
                    for rank in (0, 1):
                        opt.accumulate(grads[(step, rank, micro)], rank=rank)
                else:  # both ranks at once, a thread each in the engine
                    opt.accumulate_all([grads[(step, rank, micro)] for rank in (0, 1)])
            opt.step()
            self.assertEqual(opt.last_step["micro_batches"], 2)
            self.assertEqual(opt.last_step["ns_matrices"], 3 + 1)  # qkv's 3 heads + fc
        with tempfile.TemporaryDirectory() as tmp:
            cfg, src, dst = (os.path.join(tmp, f) for f in
                             ("config.json", "in.safetensors", "out.safetensors"))
            with open(cfg, "w") as f:
                json.dump(CONFIG, f)
            tensors = [(f"param/{n}", initial[n]) for n, _ in TABLE]
            tensors += [(f"grad/{s}/{r}/{k}/{n}", a) for (s, r, k), g in grads.items()
                        for n, a in g.items()]
            write_safetensors(src, tensors, {"group/blocks.0.mlp.proj": "adamw",
                                             "heads/blocks.0.attn.qkv": "3"})
            subprocess.run([os.environ["ZMUON_REFERENCE"], cfg, src, dst], check=True)
            ref = read_safetensors(dst)
        for name, _ in TABLE:
            with self.subTest(name=name):
                self.assertTrue(np.array_equal(params[name].view(np.uint32),
                                               ref[f"param/{name}"].view(np.uint32)),
                                f"{name}: largest difference "
                                f"{np.abs(params[name] - ref[f'param/{name}']).max()}")
                self.assertGreater(np.abs(params[name] - initial[name]).max(), 1e-4)

    def test_one_step_matches_a_float64_reference(self):
        rng = np.random.default_rng(3)
        w = (0.1 * rng.standard_normal((24, 10))).astype(np.float32)
        b = (0.1 * rng.standard_normal(10)).astype(np.float32)
        gw = rng.standard_normal(w.shape).astype(np.float32)
        gb = rng.standard_normal(b.shape).astype(np.float32)
        w0, b0 = w.astype(np.float64), b.astype(np.float64)
        lr, adam_lr, wd, beta = 0.02, 0.001, 0.1, 0.95
        opt = zmuon.Muon({"w": w, "b": b}, {"optimizer": {"params": {
            "muon_lr": lr, "adam_lr": adam_lr, "weight_decay": wd}}})
        opt.accumulate({"w": gw, "b": gb})
        opt.step()
        # Muon, Nesterov, EMA momentum from zero: u = (1-beta) g + beta (1-beta) g.
        u = (1 - beta) * gw + beta * (1 - beta) * gw.astype(np.float64)
        scale = max(1.0, 24 / 10) ** 0.5
        w_ref = w0 * (1 - lr * wd) - lr * scale * ns5_float64(u)
        # AdamW step 1, bias-corrected: the update is g / (|g| + eps).
        b_ref = b0 * (1 - adam_lr * wd) - adam_lr * gb / (np.abs(gb) + 1e-10)
        print(f"\none step vs float64: Muon update {rel(w - w0, w_ref - w0):.2e}, "
              f"AdamW update {rel(b - b0, b_ref - b0):.2e}")
        self.assertLess(rel(w - w0, w_ref - w0), 1e-4)
        self.assertLess(rel(b - b0, b_ref - b0), 1e-5)

    def test_host_staging_of_cuda_tensors_matches_host_memory(self):
        # host_staging=True copies CUDA tensors through host memory: the same result as a run
        # on host arrays.
        host = make_params(6)
        cuda = {n: FakeCudaTensor(p.copy()) for n, p in host.items()}
        opt_host, opt_cuda = zmuon.Muon(host), zmuon.Muon(cuda, host_staging=True)
        for step in (1, 2):
            g = make_grads(6, step, 0, 0)
            opt_host.accumulate(g)
            opt_host.step()
            opt_cuda.accumulate({n: FakeCudaTensor(a) for n, a in g.items()})
            opt_cuda.step()
        for n, _ in TABLE:
            self.assertTrue(np.array_equal(cuda[n].arr, host[n]), n)
        self.assertGreater(np.abs(host["blocks.0.mlp.fc"] - make_params(6)["blocks.0.mlp.fc"])
                           .max(), 1e-3)

    def test_checkpoint_resume_is_bit_identical(self):
        # 4 steps straight vs 2 steps, save, a new optimizer on other initial values, load,
        # 2 more steps: the same parameters bit for bit (checkpoint through the C ABI).
        straight = make_params(8)
        run_steps(zmuon.Muon(straight), 8, (1, 2, 3, 4))
        with tempfile.TemporaryDirectory() as tmp:
            first = make_params(8)
            opt = zmuon.Muon(first)
            run_steps(opt, 8, (1, 2))
            opt.save_checkpoint(tmp)
            resumed = make_params(9)  # other values: the load must overwrite them
            opt2 = zmuon.Muon(resumed)
            self.assertEqual(opt2.load_checkpoint(tmp), 2)
            self.assertEqual(same_params(resumed, first), [])
            run_steps(opt2, 8, (3, 4))
            self.assertEqual(same_params(resumed, straight), [])
            with self.assertRaises(zmuon.IOFailure) as cm:
                opt2.load_checkpoint(os.path.join(tmp, "missing"))
            self.assertIn("missing", str(cm.exception))

    def test_state_dict_round_trip_is_bit_identical(self):
        # As the checkpoint test, through state_dict (pickled, as torch.save would) and
        # load_state_dict; the learning rates travel with it.
        import pickle
        straight = make_params(10)
        opt = zmuon.Muon(straight)
        run_steps(opt, 10, (1, 2))
        opt.param_groups[0]["lr"] = 0.01
        run_steps(opt, 10, (3, 4))
        first = make_params(10)
        opt = zmuon.Muon(first)
        run_steps(opt, 10, (1, 2))
        opt.param_groups[0]["lr"] = 0.01
        state = pickle.loads(pickle.dumps(opt.state_dict()))
        fc = state["param_groups"][0]["param_names"].index("blocks.0.mlp.fc")
        self.assertEqual(state["state"][fc]["momentum_buffer"].shape, (16, 8))  # numpy arrays
        self.assertIsInstance(state["state"][fc]["momentum_buffer"], np.ndarray)
        self.assertTrue(np.array_equal(opt.state["blocks.0.mlp.fc"]["momentum_buffer"],
                                       state["state"][fc]["momentum_buffer"]))
        resumed = make_params(11)
        opt2 = zmuon.Muon(resumed)
        broken = dict(state, state=dict(state["state"]))
        broken["state"][fc] = {"momentum_buffer": state["state"][fc]["momentum_buffer"][:3]}
        with self.assertRaises(zmuon.ShapeMismatch):  # a cut momentum: nothing changes
            opt2.load_state_dict(broken)
        self.assertTrue(np.array_equal(resumed["blocks.0.mlp.fc"], make_params(11)["blocks.0.mlp.fc"]))
        self.assertEqual(opt2.param_groups[0]["lr"], 0.02)
        opt2.load_state_dict(state)
        self.assertEqual(opt2.param_groups[0]["lr"], 0.01)
        self.assertEqual(same_params(resumed, first), [])
        run_steps(opt2, 10, (3, 4))
        self.assertEqual(same_params(resumed, straight), [])
        other = make_params(12)  # two ranks load what one rank saved
        opt3 = zmuon.Muon(other, {"zmuon": {"ranks": 2}})
        self.assertEqual(opt3.world, 2)
        opt3.load_state_dict(state)
        self.assertEqual(same_params(other, first), [])
        for bad, what in (({}, "'state'"), (dict(state, param_groups=state["param_groups"][:1]), "param_groups"),
                          (dict(state, param_groups=[{k: v for k, v in g.items() if k != "zmuon"}
                                                     for g in state["param_groups"]]),
                           "has no 'step'"),
                          (dict(state, state={}), "no entry 0")):
            with self.assertRaises(zmuon.InvalidArgument) as cm:
                opt2.load_state_dict(bad)
            self.assertIn(what, str(cm.exception))

    def test_default_rule_and_user_groups(self):
        params = make_params(2)
        opt = zmuon.Muon(params)
        muon = {n for n, _ in TABLE if opt.uses_muon(n)}
        self.assertEqual(muon, {"blocks.0.attn.qkv", "blocks.0.mlp.fc", "blocks.0.mlp.proj"})
        self.assertEqual(opt.param_groups[0]["param_names"],
                         ["blocks.0.attn.qkv", "blocks.0.mlp.fc", "blocks.0.mlp.proj"])
        opt = zmuon.Muon(params, groups=[
            {"params": [params["blocks.0.mlp.fc"], "blocks.0.mlp.proj"], "use_muon": False}])
        muon = {n for n, _ in TABLE if opt.uses_muon(n)}
        self.assertEqual(muon, {"blocks.0.attn.qkv"})

    def test_lr_from_param_groups(self):
        # Changing param_groups[i]["lr"] (what an LR schedule does) changes the step: lr 0 on
        # both groups leaves the parameters as they were (weight decay 0).
        params = make_params(4)
        before = {n: p.copy() for n, p in params.items()}
        opt = zmuon.Muon(params)
        for group in opt.param_groups:
            group["lr"] = 0.0
        opt.accumulate(make_grads(4, 1, 0, 0))
        opt.step()
        for n, _ in TABLE:
            self.assertTrue(np.array_equal(params[n], before[n]), n)
        opt.param_groups[0]["lr"] = 0.02
        opt.accumulate(make_grads(4, 2, 0, 0))
        opt.step()
        self.assertGreater(np.abs(params["blocks.0.mlp.fc"] - before["blocks.0.mlp.fc"]).max(),
                           1e-3)
        self.assertTrue(np.array_equal(params["norm.weight"], before["norm.weight"]))

    def test_keyword_hyperparameters_are_the_configs_keys(self):
        # torch.optim's way: zmuon.Muon(params, lr=..., momentum=...) runs what the config with
        # those optimizer.params runs, bit for bit; keywords apply over the config; and they
        # change the step (the default-config run differs).
        hyper = {"lr": 0.05, "adam_lr": 0.002, "momentum": 0.9, "nesterov": False,
                 "weight_decay": 0.1, "betas": (0.8, 0.99), "ns_steps": 4}
        config = {"optimizer": {"params": dict(hyper, betas=list(hyper["betas"]))}}
        runs = {}
        for how in ("keywords", "config", "keywords over config", "defaults"):
            params = make_params(7)
            if how == "keywords":
                opt = zmuon.Muon(params, **hyper)
            elif how == "config":
                opt = zmuon.Muon(params, config)
            elif how == "keywords over config":
                opt = zmuon.Muon(params, {"optimizer": {"params": {
                    "momentum": 0.5, "lr": 0.3, "ns_steps": 7}}}, **hyper)
            else:
                opt = zmuon.Muon(params)
            for step in range(2):
                opt.accumulate(make_grads(7, step, 0, 0))
                opt.step()
            runs[how] = (params, [g["lr"] for g in opt.param_groups])
        for how in ("config", "keywords over config"):
            self.assertEqual(runs[how][1], [0.05, 0.002], how)
            for n, _ in TABLE:
                self.assertTrue(np.array_equal(runs[how][0][n], runs["keywords"][0][n]),
                                f"{how}: {n}")
        self.assertEqual(runs["keywords"][1], [0.05, 0.002])
        for n, _ in TABLE:
            self.assertFalse(np.array_equal(runs["defaults"][0][n], runs["keywords"][0][n]), n)

    def test_call_timeline_lists_every_call_of_the_timed_steps(self):
        params = make_params(6)
        opt = zmuon.Muon(params)
        opt.accumulate(make_grads(6, 1, 0, 0))
        opt.step()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "timeline.json")
            with self.assertRaises(zmuon.BadState) as cm:  # timing is off
                opt.write_call_timeline(path)
            self.assertIn("call timing is off", str(cm.exception))
            opt.time_calls(True)
            for step in (2, 3):
                opt.accumulate(make_grads(6, step, 0, 0))
                opt.step()
            opt.write_call_timeline(path)
            with open(path) as f:
                events = json.load(f)["traceEvents"]
        calls = [e for e in events if e["ph"] == "X"]
        muon = sum(1 for n, _ in TABLE if opt.uses_muon(n))
        # Two steps: one momentum call and one update per Muon shard each, one AdamW call per
        # other parameter each (the host backend's per-parameter calls).
        self.assertEqual(sum(1 for e in calls if e["name"] == "momentum"), 2 * muon)
        self.assertEqual(sum(1 for e in calls if e["name"] == "adamw"), 2 * (len(TABLE) - muon))
        self.assertTrue(all(e["dur"] >= 0 and e["ts"] >= 0 for e in calls))
        threads = [e["args"]["name"] for e in events if e["name"] == "thread_name"]
        self.assertEqual(threads, ["engine calls", "host calls"])
        # the engine's own calls on the caller's thread, one hand-over and one step a step
        engine_calls = sorted(e["name"] for e in calls if e["cat"] == "host")
        self.assertEqual(engine_calls, ["hand_over", "hand_over", "step", "step"])


def fake_torch_module():
    """A stand-in for `torch` in sys.modules: its Tensor is FakeCudaTensor, and torch.cuda records
    current_stream() and synchronize() calls."""
    mod = types.ModuleType("torch")
    mod.Tensor = FakeCudaTensor
    calls = {"synchronize": [], "current_stream": []}

    class Stream:
        def __init__(self, index):
            self.cuda_stream = 0x5000 + index

    def current_stream(device):  # as torch's: a device or its index
        index = getattr(device, "index", device)
        calls["current_stream"].append(index)
        return Stream(index)

    def synchronize(device):
        calls["synchronize"].append(device.index)

    mod.cuda = types.SimpleNamespace(current_stream=current_stream, synchronize=synchronize)
    return mod, calls


class TorchStreamHandOver(unittest.TestCase):
    """zmuon.Muon hands CUDA gradients over on PyTorch's current stream (no synchronize) when
    they are on one device, and falls back to synchronize + the plain reduce() otherwise."""

    def setUp(self):
        self.saved = sys.modules.get("torch")
        self.fake, self.calls = fake_torch_module()
        sys.modules["torch"] = self.fake

    def tearDown(self):
        if self.saved is None:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = self.saved

    def test_the_stream_of_one_device_or_none(self):
        b = zmuon._buffers
        one_device = [("a", 0x10, 32, 0), ("b", 0x20, 32, 0)]
        self.assertEqual(b.current_stream(b.entries_devices(one_device)), 0x5000)
        self.assertEqual(self.calls["current_stream"], [0])
        two_devices = [("a", 0x10, 32, 0), ("b", 0x20, 32, 1)]
        self.assertEqual(b.entries_devices(two_devices), {0, 1})
        self.assertIsNone(b.current_stream(b.entries_devices(two_devices)))
        host_only = [("a", 0x10, 32, zmuon._capi.HOST)]
        self.assertEqual(b.entries_devices(host_only), set())
        self.assertIsNone(b.current_stream(b.entries_devices(host_only)))
        mixed = host_only + [("b", 0x20, 32, 1)]  # the one CUDA device's stream
        self.assertEqual(b.current_stream(b.entries_devices(mixed)), 0x5001)
        self.assertEqual(self.calls["current_stream"], [0, 1])

    def test_cuda_gradients_go_to_the_stream_ordered_reduce_without_synchronize(self):
        params = [(n, FakeCudaTensor((0.1 * np.ones((8, 4))).astype(np.float32))) for n in "ab"]
        opt = zmuon.Muon(params)
        streams, reduce = [], opt._engine.reduce

        def recording(rank, entries, stream=None):
            streams.append(stream)
            return reduce(rank, entries, stream=stream)

        opt._engine.reduce = recording
        grad = np.ones((8, 4), np.float32)
        with self.assertRaises(zmuon.Unsupported):  # the host backend reads no device memory
            opt.accumulate({"a": FakeCudaTensor(grad), "b": FakeCudaTensor(grad.copy())})
        self.assertEqual(streams, [0x5000])
        self.assertEqual(self.calls["synchronize"], [])
        with self.assertRaises(zmuon.Unsupported):  # two devices: synchronize, plain reduce()
            opt.accumulate({"a": FakeCudaTensor(grad), "b": FakeCudaTensor(grad.copy(), 1)})
        self.assertEqual(streams, [0x5000, None])
        self.assertEqual(sorted(self.calls["synchronize"]), [0, 1])  # each tensor's GPU

    def test_the_step_of_cuda_grads_is_ordered_on_the_current_stream(self):
        """step()'s own hand-over of CUDA .grad runs the engine's step on PyTorch's current
        stream (zmuon_engine_step_on_stream), which returns once the step is enqueued; here the
        fake device memory is host memory, handed to the host engine as such."""
        params = [(n, FakeCudaTensor((0.1 * np.ones((8, 4))).astype(np.float32))) for n in "ab"]
        opt = zmuon.Muon(params)
        engine, steps = opt._engine, []
        hand_over, step = engine.hand_over, engine.step

        def host_hand_over(rank, entries, stream, reduced, kept_until_step):
            entries = [(n, ptr, numel, zmuon._capi.HOST) for n, ptr, numel, _ in entries]
            return hand_over(rank, entries, stream, reduced, kept_until_step)

        def recording(stream=None):
            steps.append(stream)
            return step(stream)

        engine.hand_over, engine.step = host_hand_over, recording
        for _, p in params:
            p.grad = FakeCudaTensor(np.ones((8, 4), np.float32))
        with self.assertRaises(zmuon.Unsupported):  # the write-back: no device memory here
            opt.step()
        self.assertEqual(steps, [0x5000])
        self.assertEqual(opt.last_step["step"], 1)  # the step ran on the gradients handed over
        self.assertFalse(opt.last_step["skipped"])
        self.assertAlmostEqual(opt.last_step["grad_norm"], 8.0, places=5)  # 64 ones

    def test_the_write_back_is_stream_ordered_for_one_rank(self):
        for ranks, expected_stream, expected_syncs in ((1, 0x5000, []), (2, None, [0])):
            params = [(n, FakeCudaTensor((0.1 * np.ones((8, 4))).astype(np.float32)))
                      for n in "ab"]
            opt = zmuon.Muon(params, ranks=ranks)
            streams, gather = [], opt._engine.gather_params

            def recording(entries, stream=None, gather=gather, streams=streams):
                streams.append(stream)
                return gather(entries, stream=stream)

            opt._engine.gather_params = recording
            self.calls["synchronize"] = []
            with self.assertRaises(zmuon.Unsupported):  # the host backend writes no device memory
                opt._write_back()
            self.assertEqual(streams, [expected_stream], f"ranks {ranks}")
            self.assertEqual(self.calls["synchronize"], expected_syncs, f"ranks {ranks}")


class HandOverArrays(unittest.TestCase):
    """The C array of a hand-over's entries, reused across calls (zmuon._capi._tensor_array)."""

    def test_new_addresses_are_written_and_other_tensors_get_their_own(self):
        from zmuon._capi import _tensor_array
        entries = [(f"layer.{i}.weight", 0x1000 + 64 * i, 10 + i, -1) for i in range(5)]
        first = _tensor_array(entries, "array test")
        moved = [(n, ptr + 8, numel, dev) for n, ptr, numel, dev in entries]
        again = _tensor_array(moved, "array test")  # a new backward's .grad: new addresses
        self.assertIs(again, first)
        self.assertEqual([again[i].data for i in range(5)], [e[1] for e in moved])
        self.assertEqual([again[i].numel for i in range(5)], [e[2] for e in moved])
        self.assertEqual(again[4].name, b"layer.4.weight")
        resized = moved[:4] + [("layer.4.weight", 0x9000, 99, -1)]
        other = _tensor_array(resized, "array test")  # not the same tensors: built anew
        self.assertIsNot(other, first)
        self.assertEqual((other[4].data, other[4].numel), (0x9000, 99))
        self.assertEqual(_tensor_array(moved, "array test")[4].numel, 14)
        # One call's several arrays (reduce_all: a rank each) are slots of their own.
        ranks = [[(n, ptr + 4096 * r, numel, dev) for n, ptr, numel, dev in entries]
                 for r in range(2)]
        arrays = [_tensor_array(e, "array test", slot=r) for r, e in enumerate(ranks)]
        self.assertIsNot(arrays[0], arrays[1])
        self.assertEqual([a[2].data for a in arrays], [ranks[0][2][1], ranks[1][2][1]])


@unittest.skipIf(torch is None, "PyTorch is not installed")
class TorchTensors(unittest.TestCase):
    """Run with torch by python_test_binding_torch."""

    def test_accumulate_of_numpy_parameters_without_grads_names_one(self):
        # With torch imported, the one-pass hand-over of .grad tensors leaves numpy parameters
        # (which have none) to the general path, which names the first.
        opt = zmuon.Muon(make_params(2))
        with self.assertRaisesRegex(TypeError, "has no .grad"):
            opt.accumulate()
        opt.close()

    def test_torch_parameters_and_grads_match_numpy_arrays(self):
        host = make_params(8)
        model = {n: torch.nn.Parameter(torch.from_numpy(p.copy())) for n, p in host.items()}
        opt_np, opt_torch = zmuon.Muon(host), zmuon.Muon(model.items())
        for step in (1, 2):
            g = make_grads(8, step, 0, 0)
            opt_np.accumulate(g)
            opt_np.step()
            for n, p in model.items():
                p.grad = torch.from_numpy(g[n].copy())
            opt_torch.step()  # hands over the .grads itself
            opt_torch.zero_grad()
            self.assertTrue(all(p.grad is None for p in model.values()))
        for n, _ in TABLE:
            self.assertTrue(np.array_equal(model[n].detach().numpy(), host[n]), n)
        with self.assertRaises(TypeError):
            zmuon.Muon([("w", torch.zeros(4, 4, dtype=torch.float64))])


if __name__ == "__main__":
    unittest.main()
