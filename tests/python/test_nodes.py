"""zmuon.Muon as one process of a multi-process job (nodes=, node_rank=, master=), the way
torchrun starts one process per GPU: two processes of one rank each give the same parameters as
one process of two ranks, every process ends with the same parameters, processes that disagree
on the config both fail naming the difference, checkpoints are collectives on a shared
directory, and MuonClip clips by the max of both processes' logits.

Run by ctest with Debian's /usr/bin/python3, PYTHONPATH=python and ZMUON_LIBRARY=libzmuon.so. The
processes are real (subprocess), joined over CAF's network layer on 127.0.0.1.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import unittest

import numpy as np

import zmuon

# The job's secret, as a user hands it to each process: the nodes authenticate each other with it
# (TLS). The worker processes inherit it.
os.environ["ZMUON_JOB_SECRET"] = "python-test-job-secret-0123456789"

SHAPES = {"layer.w": (12, 8), "layer.v": (8, 6), "head.bias": (6,)}
STEPS = 3


def initial_params():
    rng = np.random.default_rng(7)
    return {n: rng.standard_normal(s).astype(np.float32) * 0.3 for n, s in SHAPES.items()}


def grads_of(rank, step):
    rng = np.random.default_rng(1000 * step + rank)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(node_rank, master, out_path, config_json, checkpoint_dir):
    """One process of the job: STEPS steps on its own rank's gradients, then its parameters, its
    state_dict (a collective: whole tensors) and its opt.state shard into `out_path`; the state
    goes back in through load_state_dict (a collective too)."""
    params = initial_params()
    try:
        opt = zmuon.Muon(params, json.loads(config_json), nodes=2, node_rank=node_rank,
                         master=master)
    except zmuon.ZmuonError as e:
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump({"error": type(e).__name__, "message": str(e)}, f)
        return
    result = {"world": opt.world, "sums": opt.sum_over_processes([node_rank + 1, 0.25])}
    for step in range(1, STEPS + 1):
        opt.accumulate(grads=grads_of(node_rank, step))  # its own rank by default
        opt.step()
    sd = opt.state_dict()
    np.savez(out_path + ".state", **state_arrays(sd))
    offset, numel = opt.local_range("layer.w")
    result["shard"] = [offset, numel]
    np.save(out_path + ".shard.npy", opt.state["layer.w"]["momentum_buffer"])
    if checkpoint_dir:
        opt.save_checkpoint(checkpoint_dir)
        for p in params.values():  # scribbled over, then restored by the collective load
            p[...] = 0
        result["loaded_step"] = opt.load_checkpoint(checkpoint_dir)
    for p in params.values():  # scribbled over, then restored from the dict's masters
        p[...] = 0
    opt.load_state_dict(sd)
    opt.close()
    np.savez(out_path, **params)
    with open(out_path + ".json", "w", encoding="utf-8") as f:
        json.dump(result, f)


def state_arrays(sd):
    """A state_dict's tensors as flat names: "state.0.momentum_buffer", "masters.0", ..."""
    out = {f"state.{i}.{k}": np.asarray(v) for i, e in sd["state"].items() for k, v in e.items()}
    out.update({f"masters.{i}": v for i, v in sd["zmuon"]["masters"].items()})
    return out


def run_job(tmp, configs, checkpoint_dir=""):
    """Starts node 0 and node 1 (configs[i] as JSON text) and waits for both."""
    master = f"127.0.0.1:{free_port()}"
    procs, outs = [], []
    for node_rank in (0, 1):
        out = os.path.join(tmp, f"node{node_rank}")
        outs.append(out)
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "worker", str(node_rank), master, out, configs[node_rank],
             checkpoint_dir],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=120)[0] for p in procs]
    return [p.returncode for p in procs], outs, logs


class NodesTest(unittest.TestCase):
    def test_two_processes_match_two_ranks_in_one(self):
        config = {"optimizer": {"params": {"lr": 0.05}}}
        reference = initial_params()
        opt = zmuon.Muon(reference, config, ranks=2)
        self.assertEqual(opt.sum_over_processes([1.5, -2]), [1.5, -2.0])  # one process
        for step in range(1, STEPS + 1):
            for rank in (0, 1):
                opt.accumulate(grads=grads_of(rank, step), rank=rank)
            opt.step()
        reference_state = state_arrays(opt.state_dict())
        opt.close()
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = os.path.join(tmp, "ckpt")
            codes, outs, logs = run_job(tmp, [json.dumps(config)] * 2, ckpt)
            self.assertEqual(codes, [0, 0], "\n".join(logs))
            got = [np.load(o + ".npz") for o in outs]
            states = [dict(np.load(o + ".state.npz")) for o in outs]
            shards = [np.load(o + ".shard.npy") for o in outs]
            info = [read_json(o + ".json") for o in outs]
            with open(os.path.join(ckpt, "latest"), encoding="utf-8") as f:
                latest = f.read().strip()
            manifest = read_json(os.path.join(ckpt, latest, "manifest.json"))
        for i in (0, 1):
            self.assertEqual(info[i]["world"], 2)
            self.assertEqual(info[i]["sums"], [3.0, 0.5])  # 1 + 2, 0.25 + 0.25
            self.assertEqual(info[i]["loaded_step"], STEPS)
        self.assertEqual(latest, f"step_{STEPS:08d}")
        self.assertEqual([f["rank"] for f in manifest["files"]], [0, 1])
        moved, worst = 0.0, 0.0
        for name in SHAPES:
            # Every process ends with the same full parameters (after the checkpoint round trip).
            np.testing.assert_array_equal(got[0][name], got[1][name], err_msg=name)
            diff = np.abs(got[0][name] - reference[name]).max()
            scale = np.abs(reference[name]).max()
            self.assertLessEqual(diff, 1e-6 * scale, f"{name}: {diff} against {scale}")
            worst = max(worst, diff / scale)
            moved = max(moved, np.abs(reference[name] - initial_params()[name]).max())
        self.assertGreater(moved, 1e-3)  # the steps changed the parameters
        print(f"2 processes x 1 rank vs 2 ranks in one: max relative difference {worst:g}",
              file=sys.stderr)
        # state_dict: the same whole tensors on both processes, those of two ranks in one.
        self.assertEqual(sorted(states[0]), sorted(reference_state))
        worst_state = 0.0
        for key, want in reference_state.items():
            np.testing.assert_array_equal(states[0][key], states[1][key], err_msg=key)
            diff = np.abs(states[0][key] - want).max()
            scale = max(np.abs(want).max(), 1e-30)
            self.assertLessEqual(diff, 1e-6 * scale, key)
            worst_state = max(worst_state, diff / scale)
        # opt.state: each process's own elements of the flattened momentum, no collective.
        momentum = states[0]["state.0.momentum_buffer"].reshape(-1)  # layer.w: index 0
        for i in (0, 1):
            offset, numel = info[i]["shard"]
            self.assertEqual((offset, numel), (i * 48, 48))
            np.testing.assert_array_equal(shards[i], momentum[offset:offset + numel])
        print(f"state_dict of 2 processes vs 2 ranks in one: max relative difference "
              f"{worst_state:g}; opt.state holds each process's 48 of 96 elements",
              file=sys.stderr)

    def test_processes_that_disagree_both_fail_naming_the_difference(self):
        configs = [json.dumps({"optimizer": {"params": {"momentum": m}}}) for m in (0.95, 0.9)]
        with tempfile.TemporaryDirectory() as tmp:
            codes, outs, logs = run_job(tmp, configs)
            self.assertEqual(codes, [0, 0], "\n".join(logs))
            for out in outs:
                failed = read_json(out)
                self.assertEqual(failed["error"], "InvalidArgument")
                self.assertIn("the config of node 1 differs from node 0's at "
                              "'optimizer.params.momentum'", failed["message"])

    def test_a_missing_process_is_a_timeout_not_a_hang(self):
        quick = ["zmuon.timeout_ms=500"]
        with self.assertRaisesRegex(zmuon.Timeout, "not every node joined within 500 ms"):
            zmuon.Muon(initial_params(), overrides=quick, nodes=2, node_rank=0,
                       master="127.0.0.1:0")
        with self.assertRaisesRegex(zmuon.Timeout, "node 1 found no rendezvous at "
                                                   "127.0.0.1:1 within 500 ms"):
            zmuon.Muon(initial_params(), overrides=quick, nodes=2, node_rank=1,
                       master="127.0.0.1:1")

    def test_a_guessable_secret_is_refused_unless_allowed(self):
        # The same check as zmuon-launch's, on the secret from the environment.
        saved = os.environ["ZMUON_JOB_SECRET"]
        try:
            os.environ["ZMUON_JOB_SECRET"] = "llama-70b-run-07"
            with self.assertRaisesRegex(zmuon.InvalidArgument, r"the job's secret in "
                                        r"\$ZMUON_JOB_SECRET is too easy to guess"):
                zmuon.Muon(initial_params(), nodes=2, node_rank=0, master="127.0.0.1:0")
            # Allowed, the process gets as far as waiting for its peer.
            os.environ["ZMUON_WEAK_SECRET_OK"] = "1"
            with self.assertRaisesRegex(zmuon.Timeout, "not every node joined"):
                zmuon.Muon(initial_params(), overrides=["zmuon.timeout_ms=500"], nodes=2,
                           node_rank=0, master="127.0.0.1:0")
        finally:
            os.environ["ZMUON_JOB_SECRET"] = saved
            os.environ.pop("ZMUON_WEAK_SECRET_OK", None)

    def test_incomplete_node_arguments_are_refused(self):
        with self.assertRaisesRegex(zmuon.InvalidArgument, "needs nodes, node_rank and master"):
            zmuon.Muon(initial_params(), nodes=2, node_rank=0)
        with self.assertRaisesRegex(zmuon.InvalidArgument, "node rank 2 is outside"):
            zmuon.Muon(initial_params(), nodes=2, node_rank=2, master="127.0.0.1:1")
        with self.assertRaisesRegex(zmuon.InvalidArgument, "expected HOST:PORT"):
            zmuon.Muon(initial_params(), nodes=2, node_rank=0, master="nohost")


# MuonClip across processes: query "q" (4 heads of 2 rows), key "k" (2 heads); each process's rank
# reports its own logits, and only the max over both processes passes tau for heads 1 and 3.
QK_SHAPES = {"q": (8, 6), "k": (4, 6)}
QK_LOGITS = ([1.0, 9.0, 1.0, 1.0], [1.0, 1.0, 1.0, 6.0])  # by rank
QK_CONFIG = {"optimizer": {"params": {"lr": 0.05, "qk_clip_tau": 4.0}}}


def qk_initial():
    rng = np.random.default_rng(11)
    return {n: rng.standard_normal(s).astype(np.float32) * 0.3 for n, s in QK_SHAPES.items()}


def qk_grads(rank):
    rng = np.random.default_rng(50 + rank)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in QK_SHAPES.items()}


def qk_worker(node_rank, master, out_path):
    params = qk_initial()
    opt = zmuon.Muon(params, QK_CONFIG, nodes=2, node_rank=node_rank, master=master,
                     qk_clip={"q": ("k", 4, 2)})
    opt.accumulate(grads=qk_grads(node_rank))
    opt.report_qk_logits("q", QK_LOGITS[node_rank])
    opt.step()
    opt.close()
    np.savez(out_path, **params)


class QkClipAcrossProcesses(unittest.TestCase):
    def test_two_processes_clip_by_the_max_of_both(self):
        def one_process(tau):
            params = qk_initial()
            config = {"optimizer": {"params": {"lr": 0.05, "qk_clip_tau": tau}}}
            opt = zmuon.Muon(params, config, ranks=2, qk_clip={"q": ("k", 4, 2)})
            for rank in (0, 1):
                opt.accumulate(grads=qk_grads(rank), rank=rank)
                opt.report_qk_logits("q", QK_LOGITS[rank], rank=rank)
            opt.step()
            opt.close()
            return params

        reference, plain = one_process(4.0), one_process(0.0)
        with tempfile.TemporaryDirectory() as tmp:
            master = f"127.0.0.1:{free_port()}"
            procs, outs = [], []
            for node_rank in (0, 1):
                out = os.path.join(tmp, f"qk{node_rank}")
                outs.append(out)
                procs.append(subprocess.Popen(
                    [sys.executable, __file__, "qk_worker", str(node_rank), master, out],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            logs = [p.communicate(timeout=120)[0] for p in procs]
            self.assertEqual([p.returncode for p in procs], [0, 0], "\n".join(logs))
            got = [dict(np.load(o + ".npz")) for o in outs]
        for name in QK_SHAPES:
            np.testing.assert_array_equal(got[0][name], got[1][name], err_msg=name)
            np.testing.assert_allclose(got[0][name], reference[name], rtol=0, atol=1e-6)
        # Heads 1 (rank 0 saw 9) and 3 (rank 1 saw 6) are clipped on both processes' shards;
        # query heads 0 and 2 are not.
        q, q_plain = got[0]["q"], plain["q"]
        np.testing.assert_allclose(q[2:4], q_plain[2:4] * np.sqrt(4 / 9), rtol=1e-6)
        np.testing.assert_allclose(q[6:8], q_plain[6:8] * np.sqrt(4 / 6), rtol=1e-6)
        np.testing.assert_allclose(q[0:2], q_plain[0:2], rtol=1e-6)
        np.testing.assert_allclose(q[4:6], q_plain[4:6], rtol=1e-6)
        np.testing.assert_allclose(got[0]["k"][0:2], plain["k"][0:2] * np.sqrt(4 / 9), rtol=1e-6)
        np.testing.assert_allclose(got[0]["k"][2:4], plain["k"][2:4] * np.sqrt(4 / 6), rtol=1e-6)


# NorMuon across processes: an expert stack of 4 experts (NS blocks whose owners are spread over
# both processes' ranks) and a matrix. state_dict's "variance_neuron" is whole on both processes
# (each block's rows from its owner, wherever it runs), as with two ranks in one process, and
# goes back in through load_state_dict and a checkpoint.
NORMUON_SHAPES = {"moe.experts": (4, 6, 8), "layer.w": (12, 8)}
NORMUON_CONFIG = {"optimizer": {"params": {"lr": 0.05, "variant": "normuon",
                                           "normuon_beta2": 0.9}}}


def normuon_initial():
    rng = np.random.default_rng(13)
    return {n: rng.standard_normal(s).astype(np.float32) * 0.3 for n, s in NORMUON_SHAPES.items()}


def normuon_grads(rank, step):
    rng = np.random.default_rng(700 + 10 * step + rank)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in NORMUON_SHAPES.items()}


def normuon_worker(node_rank, master, out_path, checkpoint_dir):
    params = normuon_initial()
    opt = zmuon.Muon(params, NORMUON_CONFIG, nodes=2, node_rank=node_rank, master=master)
    for step in (1, 2):
        opt.accumulate(grads=normuon_grads(node_rank, step))
        opt.step()
    sd = opt.state_dict()
    opt.save_checkpoint(checkpoint_dir)
    opt.load_state_dict(sd)
    back = opt.state_dict()
    opt.load_checkpoint(checkpoint_dir)
    loaded = opt.state_dict()
    opt.close()
    np.savez(out_path, **state_arrays(sd))
    np.savez(out_path + ".back", **state_arrays(back))
    np.savez(out_path + ".loaded", **state_arrays(loaded))


class NorMuonAcrossProcesses(unittest.TestCase):
    def test_row_moments_of_an_expert_stack_are_whole_on_every_process(self):
        params = normuon_initial()
        opt = zmuon.Muon(params, NORMUON_CONFIG, ranks=2)
        for step in (1, 2):
            for rank in (0, 1):
                opt.accumulate(grads=normuon_grads(rank, step), rank=rank)
            opt.step()
        reference = state_arrays(opt.state_dict())
        opt.close()
        self.assertEqual(reference["state.0.variance_neuron"].shape, (4, 6, 1))
        with tempfile.TemporaryDirectory() as tmp:
            master = f"127.0.0.1:{free_port()}"
            procs, outs = [], []
            for node_rank in (0, 1):
                out = os.path.join(tmp, f"normuon{node_rank}")
                outs.append(out)
                procs.append(subprocess.Popen(
                    [sys.executable, __file__, "normuon_worker", str(node_rank), master, out,
                     os.path.join(tmp, "ckpt")],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            logs = [p.communicate(timeout=120)[0] for p in procs]
            self.assertEqual([p.returncode for p in procs], [0, 0], "\n".join(logs))
            got = [dict(np.load(o + ".npz")) for o in outs]
            back = [dict(np.load(o + ".back.npz")) for o in outs]
            loaded = [dict(np.load(o + ".loaded.npz")) for o in outs]
        worst = 0.0
        for key in ("state.0.variance_neuron", "state.1.variance_neuron"):
            want = reference[key]
            self.assertTrue((want > 0).all(), key)  # every expert's rows were written
            for i in (0, 1):
                self.assertEqual(got[i][key].shape, want.shape, key)
                np.testing.assert_array_equal(got[i][key], got[0][key], err_msg=key)
                np.testing.assert_array_equal(back[i][key], got[i][key], err_msg=key)
                np.testing.assert_array_equal(loaded[i][key], got[i][key], err_msg=key)
            diff = np.abs(got[0][key] - want).max() / np.abs(want).max()
            self.assertLessEqual(diff, 1e-6, key)
            worst = max(worst, diff)
        print(f"NorMuon row moments of 2 processes vs 2 ranks in one: max relative difference "
              f"{worst:g}; identical on both processes, after load_state_dict and a checkpoint",
              file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6])
    elif len(sys.argv) > 1 and sys.argv[1] == "qk_worker":
        qk_worker(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif len(sys.argv) > 1 and sys.argv[1] == "normuon_worker":
        normuon_worker(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
    else:
        unittest.main()
