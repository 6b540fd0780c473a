"""A process of a multi-process job whose peer dies: the library ends the job, never the host.

Two processes of one rank each (zmuon.Engine over the C ABI, nodes=2); node 1 kills itself
(SIGKILL) before its third step. Node 0's third step raises CommFailure naming the lost node, every later call
raises it again, the loss reaches Python's logging (logger "zmuon"), and node 0 goes on with its
own code: it waits past the time the library once took to end the process, writes what it saw
and exits 0 by itself.

Run by ctest with Debian's /usr/bin/python3, PYTHONPATH=python and ZMUON_LIBRARY=libzmuon.so.
"""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

import zmuon

SHAPES = {"layer.w": (12, 8), "head.bias": (6,)}
# The library once ended the process 5 s after a loss; the survivor outlives that.
OUTLIVE_S = 7


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append([record.levelname, record.getMessage()])


def worker(node_rank, master, out_path):
    records = Records()
    logging.getLogger("zmuon").addHandler(records)
    logging.getLogger("zmuon").setLevel(logging.DEBUG)
    eng = zmuon.Engine(node=(2, node_rank, 1, master))  # the C ABI, one call per method
    for name, shape in SHAPES.items():
        eng.add_parameter(name, shape)
    eng.start()  # joins the job
    grads = {n: np.ones(s, np.float32) for n, s in SHAPES.items()}
    entries = [(n, g.ctypes.data, g.size, zmuon.HOST) for n, g in grads.items()]
    calls = {"reduce": lambda: eng.reduce(node_rank, entries), "step": eng.step}
    result = {"errors": []}
    for step in range(1, 4):
        if node_rank == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        eng.reduce(node_rank, entries)
        try:
            eng.step()
        except zmuon.ZmuonError as e:
            result["errors"].append(["step", type(e).__name__, str(e)])
            break
    failed_at = time.monotonic()
    # Every later call says the job is over, at once and after a while.
    for when in ("at once", "later"):
        if when == "later":
            time.sleep(max(0.0, OUTLIVE_S - (time.monotonic() - failed_at)))
        for call in ("reduce", "step"):
            try:
                calls[call]()
                result["errors"].append([call, "none", ""])
            except zmuon.ZmuonError as e:
                result["errors"].append([call, type(e).__name__, str(e)])
    result["log"] = records.records
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f)
    eng.close()
    sys.exit(0)


class NodeLossTest(unittest.TestCase):
    def test_a_lost_peer_fails_the_step_and_the_host_goes_on(self):
        master = f"127.0.0.1:{free_port()}"
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "node0.json")
            env = dict(os.environ, ZMUON_JOB_SECRET=os.urandom(16).hex())  # the job's own
            procs = [subprocess.Popen([sys.executable, __file__, "worker", str(n), master, out],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=env)
                     for n in (0, 1)]
            logs = [p.communicate(timeout=120)[0] for p in procs]
            codes = [p.returncode for p in procs]
            self.assertEqual(codes, [0, -signal.SIGKILL], "\n".join(logs))
            with open(out, encoding="utf-8") as f:
                result = json.load(f)
        errors = result["errors"]
        self.assertEqual([e[0] for e in errors], ["step", "reduce", "step", "reduce", "step"],
                         errors)
        call, kind, message = errors[0]
        self.assertEqual(kind, "CommFailure", errors[0])
        self.assertRegex(message, r"^node 1 \(rank 1\) lost in step \d+: ")
        for call, kind, message in errors[1:]:
            self.assertEqual(kind, "CommFailure", (call, message))
            self.assertRegex(message, r"^the job is over \(node 1 \(rank 1\) lost in step \d+: ")
            self.assertIn("this engine takes no further call", message)
        self.assertTrue(any(level == "ERROR" and "node 1 (rank 1) lost" in text
                            for level, text in result["log"]), result["log"])


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        unittest.main()
