"""zmuon.Muon under torch.distributed on the CPU (gloo): a model wrapped in DDP or sharded by
FSDP2 (fully_shard), one optimizer across the processes. Each case starts WORLD processes the
way torchrun does (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; no agent, so that a process that
dies is seen by the others and not killed for them) and compares what they wrote with references
computed here:

- DDP and FSDP2 at 2 and 4 processes against the plain zmuon.Muon in one process on the whole
  batch (<= 1e-6 relative) and against torch.optim.Muon + AdamW on the full model (<= 1e-5);
- gradient accumulation (4 micro-batches) against one micro-batch (<= 1e-6);
- gradient clipping on the norm over every process (<= 1e-6 against one process);
- FSDP2 with bf16 mixed precision against torch.optim.Muon + AdamW on the same sharded model;
- FSDP2 with bf16 parameters (fp32 masters in zmuon) at 2 processes against 1;
- writes made to the parameters outside the optimizer (torch_writes.SCRIPT) under FSDP2, against
  torch.optim.Muon + AdamW making the same writes in one process;
- a NaN in one process's gradient: the step is skipped on every process, every state bit-equal;
- one process killed before the step: the others fail naming it, within the heartbeat timeout;
- torch.distributed.checkpoint (get_state_dict / set_state_dict) saved at 2 processes, loaded
  at 1 and at 4, against the uninterrupted run (and, as the control, the weights alone with a
  fresh optimizer, which must not match);
- the memory claim: each process holds 1/world of the optimizer state; under FSDP2 each local
  shard is a view of the rank's master, and FSDP2's all-gather reads that storage (padded
  shards too, at 3 processes); after close() each owns a storage again;
- a parameter placed Partial (a part of a sum, no values) refused by name;
- add_param_group at step 5 (progressive unfreezing) under DDP and FSDP2 at 2 processes: the job
  meets again with the new parameters, against one process doing the same (<= 1e-6); under
  FSDP2 also with NorMuon, whose row moments the restart carries over; NorMuon's row moments
  through torch.distributed.checkpoint and back, bit-equal.

Run by ctest with the venv's python (.venv); without PyTorch it fails.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_torch_optim import (HYPER, TinyTransformer, batches, fp32_newton_schulz,  # noqa: E402
                              lm_loss, rel, torch_pair)

import zmuon  # noqa: E402

STEPS = 10
BATCH = 8          # the job's batch a step: 8 sequences, split over the processes
PARITY_ZMUON = 1e-6
PARITY_TORCH = 1e-5
HEARTBEAT_MS = 3000
# The writes of torch_writes.SCRIPT that FSDP2 lets a user make (p.data = ... would take the
# parameter out of FSDP2's storage).
FSDP_WRITES = ("p.data.copy_()", "a layer re-initialised", "EMA swapped in and back",
               "opt.load_state_dict, then model.load_state_dict",
               "DCP set_state_dict with copied dicts")


# -- the worker: one process of the job -----------------------------------------------------------

def build(kind):
    """The model (same initial values in every process), wrapped or sharded (partial: every
    parameter a DTensor replicated over the processes, fc.weight placed Partial)."""
    torch.manual_seed(0)
    model = TinyTransformer()
    if kind == "partial":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor
        mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
        for module in list(model.modules()):
            for name, p in list(module.named_parameters(recurse=False)):
                placed = DTensor.from_local(p.detach().clone(), mesh, [Partial()]) \
                    if module is model.fc and name == "weight" \
                    else distribute_tensor(p.detach(), mesh, [Replicate()])
                module.register_parameter(name, torch.nn.Parameter(placed))
        return model
    if kind == "fsdp_bf16":  # bf16 parameters: zmuon keeps their fp32 masters
        model = model.to(torch.bfloat16)
    if kind == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if kind in ("fsdp", "fsdp_mp", "fsdp_bf16"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if kind == "fsdp_mp" else MixedPrecisionPolicy(reduce_dtype=torch.float32)
        for block in (model.qkv, model.proj, model.fc, model.out):
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    return model


def full_params(model):
    inner = model.module if hasattr(model, "module") else model
    out = {}
    for name, p in inner.named_parameters():
        t = p.detach()
        out[name] = (t.full_tensor() if hasattr(t, "full_tensor") else t).clone()
    return out


def train_steps(model, opt, steps, rank, world, gas, first=0, poison=None):
    """Steps [first, first + steps) of the job: this process's share of each batch, in `gas`
    micro-batches. poison=(step, name): a NaN in this process's shard of that gradient."""
    data = batches(STEPS, batch=BATCH)
    share = BATCH // world
    reports = []
    for step in range(first, first + steps):
        local = data[step][rank * share:(rank + 1) * share]
        for micro in local.chunk(gas):
            lm_loss(model, micro).backward()
            if poison is not None and poison[0] == step:
                g = dict((model.module if hasattr(model, "module") else model)
                         .named_parameters())[poison[1]].grad
                local_g = g.to_local() if hasattr(g, "to_local") else g
                begin, _ = opt.local_range(poison[1])
                flat = local_g.view(-1)
                flat[0 if hasattr(g, "to_local") else begin] = float("nan")
            if gas > 1:
                opt.accumulate()
                opt.zero_grad()
        opt.step()
        opt.zero_grad()
        reports.append(opt.last_step)
    return reports


# The parameters added at step 5 (test_torch_parameters' ProgressiveUnfreezing).
LATE = ("fc.weight", "out.weight", "ln2.weight", "out.bias", "fc.bias", "ln2.bias")


def unfreeze(model, rank, world, config, **extra):
    """zmuon.Muon over all but LATE, then LATE added at step 5: a Muon group and an AdamW one."""
    inner = model.module if hasattr(model, "module") else model
    named = dict(inner.named_parameters())
    opt = zmuon.Muon([(n, p) for n, p in named.items() if n not in LATE], config, **extra,
                     **HYPER)
    train_steps(model, opt, 5, rank, world, 1)
    late = [named[n] for n in LATE]
    opt.add_param_group({"params": late[:2], "use_muon": True})
    opt.add_param_group({"params": late[2:], "algorithm": "adamw", "lr": HYPER["adam_lr"]})
    train_steps(model, opt, STEPS - 5, rank, world, 1, first=5)
    return opt


def row_moments(state_dict):
    """NorMuon's row moments in a state_dict, by parameter name."""
    names = {i: n for g in state_dict["param_groups"]
             for i, n in zip(g["params"], g["param_names"])}
    return {names[i]: e["variance_neuron"] for i, e in state_dict["state"].items()
            if "variance_neuron" in e}


def normuon_through_dcp(kind, model, rank, world, config, directory):
    """NorMuon's row moments after 3 steps, saved with torch.distributed.checkpoint and loaded
    into a fresh optimizer over a new model: whether every one came back with the same bits
    (and none is all zeros)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    opt = zmuon.Muon(model.named_parameters(), config, variant="normuon", **HYPER)
    train_steps(model, opt, 3, rank, world, 1)
    saved = row_moments(opt.state_dict())  # new host tensors: the optimizer does not change them
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=directory)
    opt.close()
    model = build(kind)
    opt = zmuon.Muon(model.named_parameters(), config, variant="normuon", **HYPER)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=directory)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    loaded = row_moments(opt.state_dict())
    opt.close()
    return bool(saved) and set(loaded) == set(saved) and all(
        torch.equal(loaded[k], v) and float(v.abs().sum()) > 0 for k, v in saved.items())


def local_state(opt):
    """This process's state, bit for bit: the local state tensors and the masters."""
    sd = opt.state_dict()
    out = {}
    for i, st in sd["state"].items():
        for k, v in st.items():
            v = v.to_local() if hasattr(v, "to_local") else v
            out[f"{i}.{k}"] = v.clone()
    for i, v in sd["zmuon"]["masters"].items():
        v = v.to_local() if hasattr(v, "to_local") else v
        out[f"master.{i}"] = v.clone()
    return out


def one_pass_takes_the_shards(model, opt, rank, world):
    """Whether the hand-over's one pass over the .grad tensors takes FSDP2's DTensor gradients
    and gives the entries of the general path (each one's local shard, by pointer and length)."""
    share = BATCH // world
    lm_loss(model, batches(STEPS, batch=BATCH)[0][rank * share:(rank + 1) * share]).backward()
    one_pass = opt._plain_grads()
    opt._plain_grads = lambda: None  # the general path, for this call only
    try:
        general, _ = opt._entries(None)
    finally:
        del opt._plain_grads
    opt.zero_grad()
    return one_pass is not None and one_pass[0] == general


def moved_shard_found(opt):
    """Whether MasterViews.moved names what in_master names, and only that, when one FSDP2
    shard's local tensor is a copy (then put back: nothing moved)."""
    from zmuon._param_sync import MasterViews

    def moved():
        return [b.name for b in MasterViews(list(opt._bindings.values())).moved()]

    shard = next(b for b in opt._bindings.values() if b.master is not None and not b.whole)
    kept = shard.param._local_tensor
    shard.param._local_tensor = kept.clone()
    try:
        found = moved()
        reference = [b.name for b in opt._bindings.values()
                     if b.master is not None and not b.in_master()]
    finally:
        shard.param._local_tensor = kept
    return found == reference == [shard.name] and moved() == []


def masters_and_close(model, opt, out):
    """Under FSDP2: which local shards are views of the rank's master with FSDP2's all-gather
    buffer (padding included) there too; then close(), after which each shard and buffer own a
    storage, and the loss of a forward before and after it."""
    from zmuon import _distributed
    records = _distributed.fsdp_params()
    out["shared"] = sorted(
        b.name for b in opt._bindings.values()
        if b.master is not None and b.in_master()
        and records[id(b.param)]._sharded_param_data.data_ptr() == b.local.data_ptr())
    out["bindings"] = len(opt._bindings)
    probe = batches(1, seed=11, batch=2)[0]
    masters = {id(b.param): b.master.data_ptr() for b in opt._bindings.values()
               if b.master is not None}
    with torch.no_grad():
        out["loss_before_close"] = lm_loss(model, probe).item()
        opt.close()
        out["loss_after_close"] = lm_loss(model, probe).item()
    out["own_after_close"] = sorted(
        b.name for b in opt._bindings.values()
        if records[id(b.param)]._sharded_param_data.data_ptr() == b.local.data_ptr()
        != masters.get(id(b.param)))


def worker(args):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {"rank": rank}
    config = {"zmuon": {"heartbeat_timeout_ms": HEARTBEAT_MS}}
    if args.clip:
        config["gradient_clipping"] = args.clip
    model = build(args.kind)
    if args.case == "refused":  # a layout zmuon does not take: the error, and nothing started
        try:
            zmuon.Muon(model.named_parameters(), config, **HYPER)
            out["error"] = None
        except zmuon.ZmuonError as e:
            out["error"] = f"{type(e).__name__}: {e}"
        finish(args, model, rank, out, params=False)
        return
    if args.case == "normuon_dcp":
        out["rows_restored"] = normuon_through_dcp(args.kind, model, rank, world, config,
                                                   args.dir)
        finish(args, model, rank, out, params=False)
        return
    if args.case in ("unfreeze", "unfreeze_normuon"):
        unfreeze(model, rank, world, config,
                 **({"averaged_grads": True} if args.kind == "ddp" else {}),
                 **({"variant": "normuon"} if args.case == "unfreeze_normuon" else {})).close()
        finish(args, model, rank, out)
        return
    if args.case == "torch_opt":  # the same sharded model with torch.optim.Muon + AdamW
        run_torch_optimizers(model, rank, world, args.steps)
        finish(args, model, rank, out)
        return
    if args.case == "resume_model_only":  # the control: the weights alone, a fresh optimizer
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                             set_model_state_dict)
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=args.dir)
        set_model_state_dict(model, state["model"])
    opt = zmuon.Muon(model if args.kind == "ddp" else model.named_parameters(), config,
                     **HYPER)
    if args.case == "writes":  # every write of torch_writes.SCRIPT but the pointer swap
        import torch_writes
        from torch.distributed.tensor import distribute_tensor

        def put(p, v, how):
            how(p, distribute_tensor(v, p.device_mesh, p.placements))
        torch_writes.run(model, [opt], FSDP_WRITES, rank, world, put=put)
    elif args.case == "same_batch":  # every process the whole batch: the same gradients
        train_steps(model, opt, args.steps, 0, 1, args.gas)
        if args.kind == "fsdp":
            masters_and_close(model, opt, out)
    elif args.case == "train":
        reports = train_steps(model, opt, args.steps, rank, world, args.gas)
        out["clip_coefs"] = [r["clip_coef"] for r in reports]
        held = sum(opt.local_range(n)[1] for n, _, _ in opt._params)
        total = sum(p.numel() for _, p in full_params(model).items())
        out["held"], out["total"] = held, total
        if args.kind == "fsdp":
            out["one_pass"] = one_pass_takes_the_shards(model, opt, rank, world)
            out["moved_shard"] = moved_shard_found(opt)
            masters_and_close(model, opt, out)
    elif args.case == "nan":
        train_steps(model, opt, 3, rank, world, 1)
        before = local_state(opt)
        report = train_steps(model, opt, 1, rank, world, 1, first=3,
                             poison=(3, "fc.weight") if rank == world - 1 else None)[0]
        after = local_state(opt)
        out["skipped"] = bool(report["skipped"])
        out["bit_equal"] = all(torch.equal(before[k], after[k]) for k in before)
        train_steps(model, opt, STEPS - 4, rank, world, 1, first=4)
    elif args.case == "kill":
        train_steps(model, opt, 2, rank, world, 1)
        lm_loss(model, batches(STEPS, batch=BATCH)[2][:2]).backward()
        if rank == world - 1:
            os._exit(9)  # dies with the step about to start
        started = time.monotonic()
        try:
            opt.step()
        except zmuon.ZmuonError as e:
            print(f"step failed after {time.monotonic() - started:.1f} s: {e}", flush=True)
            sys.exit(3)
        sys.exit(0)
    elif args.case == "resume_model_only":
        train_steps(model, opt, STEPS - STEPS // 2, rank, world, 1, first=STEPS // 2)
    elif args.case in ("save", "resume"):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        half = STEPS // 2
        if args.case == "save":
            train_steps(model, opt, half, rank, world, 1)
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=args.dir)
        else:
            msd, osd = get_state_dict(model, opt)
            state = {"model": msd, "optim": osd}
            dcp.load(state, checkpoint_id=args.dir)
            # Under FSDP2 each process loads its own rows: count the whole-tensor gathers.
            from torch.distributed.tensor import DTensor
            gather, out["gathers"] = DTensor.full_tensor, 0

            def counted(self, *a, **k):
                out["gathers"] += 1
                return gather(self, *a, **k)
            DTensor.full_tensor = counted
            try:
                set_state_dict(model, opt, model_state_dict=state["model"],
                               optim_state_dict=state["optim"])
            finally:
                DTensor.full_tensor = gather
            train_steps(model, opt, STEPS - half, rank, world, 1, first=half)
    opt.close()
    finish(args, model, rank, out, params=args.case != "save")


def finish(args, model, rank, out, params=True):
    """Process 0 writes the whole parameters (a gather every process joins); each process its
    JSON record."""
    import torch.distributed as dist
    if params:
        whole = full_params(model)
        if rank == 0:
            torch.save(whole, os.path.join(args.out, "params.pt"))
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


# -- the tests ------------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(world, kind, case, out, gas=1, directory="", clip=0.0, steps=STEPS, timeout=240,
            script=__file__):
    """Starts `world` processes of `script --worker` as torchrun would; returns their
    (returncode, output)."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    env.pop("ZMUON_JOB_SECRET", None)
    procs = []
    for r in range(world):
        cmd = [sys.executable, os.path.abspath(script), "--worker", "--kind", kind,
               "--case", case, "--out", out, "--gas", str(gas), "--dir", directory,
               "--clip", str(clip), "--steps", str(steps)]
        procs.append(subprocess.Popen(cmd, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    results = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            text, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"{kind} {case} at world {world}: no exit in {timeout} s")
        results.append((p.returncode, text))
    return results


def single_process(gas=1, steps=STEPS, clip=0.0):
    """The plain zmuon.Muon in one process on the whole batch (no torch.distributed)."""
    torch.manual_seed(0)
    model = TinyTransformer()
    config = {"gradient_clipping": clip} if clip else None
    opt = zmuon.Muon(model.named_parameters(), config, distributed=False, **HYPER)
    train_steps(model, opt, steps, 0, 1, gas)
    opt.close()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def torch_optimizers(model):
    """torch.optim.Muon (its NS in fp32: install with fp32_ns()) + AdamW, zmuon's rule."""
    return torch_pair(model.module if hasattr(model, "module") else model)


def run_torch_optimizers(model, rank, world, steps=STEPS):
    """`steps` steps of this process's share with torch's optimizers (NS in fp32)."""
    import torch.optim._muon as torch_muon
    opts = torch_optimizers(model)
    saved = torch_muon._zeropower_via_newtonschulz
    torch_muon._zeropower_via_newtonschulz = fp32_newton_schulz
    share = BATCH // world
    try:
        for tokens in batches(STEPS, batch=BATCH)[:steps]:
            for o in opts:
                o.zero_grad()
            lm_loss(model, tokens[rank * share:(rank + 1) * share]).backward()
            for o in opts:
                o.step()
    finally:
        torch_muon._zeropower_via_newtonschulz = saved


def torch_reference():
    """torch.optim.Muon (its NS in fp32, zmuon's contract) + AdamW on the full model."""
    torch.manual_seed(0)
    model = TinyTransformer()
    run_torch_optimizers(model, 0, 1)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def worst(a, b):
    return max(rel(a[n], b[n]) for n in b)


class Distributed(unittest.TestCase):
    reference = None
    torch_ref = None

    @classmethod
    def setUpClass(cls):
        cls.reference = single_process()
        cls.torch_ref = torch_reference()
        print(f"one process vs torch.optim.Muon + AdamW: {worst(cls.reference, cls.torch_ref):.2e}")

    def job(self, world, kind, case, **kw):
        with tempfile.TemporaryDirectory() as out:
            results = run_job(world, kind, case, out, **kw)
            for r, (code, text) in enumerate(results):
                self.assertEqual(code, 0, f"{kind} {case} world {world} rank {r}:\n{text}")
            ranks = []
            for r in range(world):
                with open(os.path.join(out, f"rank{r}.json")) as f:
                    ranks.append(json.load(f))
            path = os.path.join(out, "params.pt")
            params = torch.load(path) if os.path.exists(path) else None
            return params, ranks

    def test_ddp_and_fsdp2_match_one_process_and_torch(self):
        for kind in ("ddp", "fsdp"):
            for world in (2, 4):
                params, ranks = self.job(world, kind, "train")
                ours, theirs = worst(params, self.reference), worst(params, self.torch_ref)
                held = max(r["held"] for r in ranks) / ranks[0]["total"]
                print(f"{kind} world {world}: vs one process {ours:.2e}, vs torch {theirs:.2e}; "
                      f"state held per process {held:.3f} of the whole (1/world = "
                      f"{1 / world:.3f})")
                self.assertLessEqual(ours, PARITY_ZMUON, f"{kind} world {world}")
                self.assertLessEqual(theirs, PARITY_TORCH, f"{kind} world {world}")
                # Each process holds its shard of every parameter's state: 1/world of the whole,
                # plus the padding of the last shards (FSDP2's rows: up to a row a parameter).
                self.assertLessEqual(max(r["held"] for r in ranks),
                                     ranks[0]["total"] / world * 1.15)
                self.assertEqual(sum(r["held"] for r in ranks), ranks[0]["total"])
                if kind == "fsdp":
                    self.check_masters(ranks)
                    self.assertTrue(all(r["one_pass"] for r in ranks),
                                    "the hand-over's one pass took FSDP2's gradients")
                    self.assertTrue(all(r["moved_shard"] for r in ranks),
                                    "a shard's new storage found by MasterViews")

    def check_masters(self, ranks):
        """Every FSDP2 shard a view of its master, FSDP2's buffer too; each its own after
        close(), with the same forward."""
        for r in ranks:
            self.assertEqual(len(r["shared"]), r["bindings"], r["shared"])
            self.assertEqual(r["own_after_close"], r["shared"])
            self.assertEqual(r["loss_after_close"], r["loss_before_close"])

    def test_fsdp2_padded_shards_are_masters_too(self):
        """At 3 processes FSDP2 pads most shards (64 rows: 22, 22, 20 and 2 of padding); the
        engine's rank shard ends in the same padding, so each is shared as well. Every process
        steps on the whole batch: the same weights as one process."""
        params, ranks = self.job(3, "fsdp", "same_batch")
        e = worst(params, self.reference)
        print(f"fsdp world 3 (padded shards, every shard the rank's master): vs one process "
              f"{e:.2e}")
        self.assertLessEqual(e, PARITY_ZMUON)
        self.check_masters(ranks)

    def test_add_param_group_after_the_first_step(self):
        torch.manual_seed(0)
        model = TinyTransformer()
        unfreeze(model, 0, 1, None, distributed=False).close()
        alone = {n: p.detach().clone() for n, p in model.named_parameters()}
        for kind in ("ddp", "fsdp"):
            params, _ = self.job(2, kind, "unfreeze")
            e = worst(params, alone)
            print(f"{kind} world 2, add_param_group at step 5: vs one process {e:.2e}")
            self.assertLessEqual(e, PARITY_ZMUON, kind)
        # NorMuon's row moments carried over the restart under FSDP2 (read whole from their
        # owners, every process), as in one process.
        torch.manual_seed(0)
        model = TinyTransformer()
        unfreeze(model, 0, 1, None, distributed=False, variant="normuon").close()
        alone = {n: p.detach().clone() for n, p in model.named_parameters()}
        params, _ = self.job(2, "fsdp", "unfreeze_normuon")
        e = worst(params, alone)
        print(f"fsdp world 2, NorMuon, add_param_group at step 5: vs one process {e:.2e}")
        self.assertLessEqual(e, PARITY_ZMUON)

    def test_normuon_row_moments_through_dcp(self):
        with tempfile.TemporaryDirectory() as ckpt:
            _, ranks = self.job(2, "fsdp", "normuon_dcp", directory=ckpt)
        self.assertTrue(all(r["rows_restored"] for r in ranks), ranks)
        print("fsdp world 2, NorMuon: the row moments through DCP and back, bit-equal")

    def test_gradient_accumulation(self):
        for kind in ("ddp", "fsdp"):
            params, _ = self.job(2, kind, "train", gas=4)
            e = worst(params, self.reference)
            print(f"{kind} world 2, 4 micro-batches vs 1: {e:.2e}")
            self.assertLessEqual(e, PARITY_ZMUON, kind)

    def test_fsdp2_mixed_precision_matches_torch_on_the_same_model(self):
        # MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): forward and backward in
        # bf16, the sharded parameters and gradients fp32. zmuon.Muon against torch.optim.Muon
        # + AdamW on the same sharded model and data: the same gradients at the first step,
        # then trajectories apart only by rounding (amplified by the bf16 forward).
        steps = 3
        ours, _ = self.job(2, "fsdp_mp", "train", steps=steps)
        theirs, _ = self.job(2, "fsdp_mp", "torch_opt", steps=steps)
        fp32 = single_process(steps=steps)
        e, moved = worst(ours, theirs), worst(ours, fp32)
        print(f"FSDP2 bf16 mixed precision, 2 processes, {steps} steps: zmuon vs torch on the "
              f"same model {e:.2e}; vs the fp32 run {moved:.2e}")
        self.assertLessEqual(e, 1e-4)
        self.assertGreater(moved, 10 * e)  # bf16 compute moved the run, zmuon followed torch

    def test_fsdp2_bf16_parameters_at_two_processes_match_one(self):
        # bf16 parameters, fp32 masters sharded in zmuon. Each process computes the whole batch,
        # so the gradients are the same bits at 1 and 2 processes (the mean of two equal bf16
        # values in fp32 is exact): what remains is zmuon's sharding of the masters, which must
        # give the same weights bit for bit. (With the batch split, the bf16 backward rounds
        # each half differently: torch.optim's own runs then differ by up to 0.35 relative on
        # a bias near zero after one step.)
        two, _ = self.job(2, "fsdp_bf16", "same_batch")
        one, _ = self.job(1, "fsdp_bf16", "same_batch")
        e, moved = worst(two, one), worst(one, self.reference)
        equal = sum(torch.equal(two[n], one[n]) for n in one)
        print(f"FSDP2 bf16 parameters, {STEPS} steps: 2 processes vs 1 {e:.2e} ({equal} of "
              f"{len(one)} parameters bit-equal); vs the fp32 run {moved:.2e}")
        self.assertEqual({t.dtype for t in two.values()}, {torch.bfloat16})
        self.assertEqual(equal, len(one))

    def test_fsdp2_writes_outside_the_optimizer(self):
        import torch_writes
        from test_torch_optim import fp32_ns
        params, _ = self.job(2, "fsdp", "writes")
        torch.manual_seed(0)
        ref = TinyTransformer()
        with fp32_ns():
            torch_writes.run(ref, torch_optimizers(ref), FSDP_WRITES)
        ref = {n: p.detach() for n, p in ref.named_parameters()}
        e = worst(params, ref)
        print(f"FSDP2 world 2, writes outside the optimizer ({len(FSDP_WRITES)} kinds): vs "
              f"torch's optimizers making them in one process {e:.2e}")
        self.assertLessEqual(e, PARITY_TORCH)

    def test_clipping_uses_the_norm_over_every_process(self):
        clip = 0.3  # below the gradient's norm at every step: each step is clipped
        reference = single_process(clip=clip)
        for kind in ("ddp", "fsdp"):
            params, ranks = self.job(2, kind, "train", clip=clip)
            coefs = ranks[0]["clip_coefs"]
            self.assertTrue(all(c < 1.0 for c in coefs), coefs)
            self.assertEqual(coefs, ranks[1]["clip_coefs"])  # one vote, the same on both
            e, unclipped = worst(params, reference), worst(params, self.reference)
            print(f"{kind} world 2, clipped at {clip} (coefficients {min(coefs):.3f} to "
                  f"{max(coefs):.3f}): vs one process {e:.2e}, vs unclipped {unclipped:.2e}")
            self.assertLessEqual(e, PARITY_ZMUON, kind)
            self.assertGreater(unclipped, 1e-3, kind)

    def test_nan_in_one_process_skips_the_step_everywhere(self):
        for kind in ("ddp", "fsdp"):
            params, ranks = self.job(2, kind, "nan")
            self.assertTrue(all(r["skipped"] for r in ranks), f"{kind}: {ranks}")
            self.assertTrue(all(r["bit_equal"] for r in ranks), f"{kind}: {ranks}")
            # The job went on and applied the other steps: it matches one process that skipped
            # the same step (no step 3).
            self.assertGreater(worst(params, self.reference), 1e-4)
            print(f"{kind}: the NaN step was skipped on every process, state bit-equal")

    def test_killed_process_fails_the_others_naming_it(self):
        with tempfile.TemporaryDirectory() as out:
            started = time.monotonic()
            results = run_job(3, "ddp", "kill", out, timeout=120)
            took = time.monotonic() - started
        codes = [c for c, _ in results]
        self.assertEqual(codes[2], 9)
        for r in (0, 1):
            self.assertEqual(codes[r], 3, results[r][1])
            self.assertIn("node 2", results[r][1])
        print(f"a killed process: the others failed naming it, job over in {took:.1f} s")

    def test_partial_parameter_is_refused_by_name(self):
        _, ranks = self.job(2, "partial", "refused")
        for r in ranks:
            self.assertIsNotNone(r["error"])
            self.assertIn("Unsupported", r["error"])
            self.assertIn("'fc.weight' is placed (P(sum))", r["error"])
        print(f"a Partial parameter: {ranks[0]['error']}")

    def test_distributed_checkpoint_resharded(self):
        for kind in ("fsdp", "ddp"):
            with tempfile.TemporaryDirectory() as ckpt:
                self.job(2, kind, "save", directory=ckpt)
                for world in (1, 4):
                    params, ranks = self.job(world, kind, "resume", directory=ckpt)
                    e = worst(params, self.reference)
                    print(f"{kind}: saved at 2, resumed at {world}: vs uninterrupted {e:.2e}; "
                          f"whole-tensor gathers in the load {ranks[0]['gathers']}")
                    self.assertLessEqual(e, PARITY_ZMUON, f"{kind} 2 -> {world}")
                    if kind == "fsdp":
                        self.assertEqual([r["gathers"] for r in ranks], [0] * world)
                # The control: the weights without the optimizer's state go elsewhere.
                params, _ = self.job(2, kind, "resume_model_only", directory=ckpt)
                e = worst(params, self.reference)
                print(f"{kind}: the weights alone, a fresh optimizer: {e:.2e}")
                self.assertGreater(e, 1e-3, kind)


def worker_main(work, kinds=None):
    """A worker process of run_job: its arguments read, `work(args)` run, then the process
    ends. Past the records (written and closed), it ends without the interpreter's
    finalization: torch's gloo threads may still drop a tensor's Python object then
    (ProcessGroupGloo::runLoop -> decref_pyobject -> PyEval_AcquireThread during finalization),
    which aborts the process ("terminate called without an active exception") after its work
    is done, in about one FSDP2 mixed-precision job in four."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--kind", choices=kinds)
    ap.add_argument("--case")
    ap.add_argument("--out")
    ap.add_argument("--gas", type=int, default=1)
    ap.add_argument("--dir", default="")
    ap.add_argument("--clip", type=float, default=0.0)
    ap.add_argument("--steps", type=int, default=STEPS)
    work(ap.parse_args())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker_main(worker, ("ddp", "fsdp", "partial", "fsdp_mp", "fsdp_bf16"))
    else:
        unittest.main()
