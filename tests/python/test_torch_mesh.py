"""zmuon.Muon on DTensor parameters of any placement, under torch.distributed (gloo, CPU):

- the placement reader (zmuon._mesh.held_runs) against DTensor's own local tensors, at 4
  processes on a mesh of 4 and of 2 x 2 (Shard on each dimension, Replicate, _StridedShard,
  uneven sizes), and the moves between those pieces and the engine's rows against the
  global tensor;
- a small transformer with one MoE layer of 4 experts (an expert stack [4, h, d]) trained 10
  steps (fp32, ns_variant standard) under HSDP on a 2 x 2 mesh, FSDP2 at 4 processes, tensor
  parallel 2 x FSDP2 2 (ColwiseParallel / RowwiseParallel), each against the same model under
  the plain zmuon.Muon in one process (<= 1e-6 relative on the weights);
- under HSDP: 4 micro-batches against 1; a NaN in one process's gradient skipping the step on
  every process, the state bit-equal; torch.distributed.checkpoint saved under HSDP 2 x 2 and
  loaded under FSDP2 at 4 and in one process.

The processes start as in test_torch_distributed (its run_job); one launch runs every case of
a mesh.
"""

import argparse
import json
import os
import sys
import tempfile
import unittest

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_torch_distributed import run_job  # noqa: E402
from test_torch_optim import HYPER, batches, lm_loss, rel  # noqa: E402

import zmuon  # noqa: E402
from zmuon import _mesh  # noqa: E402

STEPS = 10
BATCH = 8
PARITY = 1e-6
HYPER = dict(HYPER, ns_variant="standard")


class MoeTransformer(nn.Module):
    """One pre-norm block: attention, then an MoE layer of `experts` experts (soft top-all
    routing, so that every expert gets a gradient), the expert weights as [E, out, in] stacks."""

    def __init__(self, vocab=64, dim=32, heads=4, ctx=16, experts=4, hidden=64):
        super().__init__()
        self.heads = heads
        self.tok_embed = nn.Embedding(vocab, dim)
        self.pos_embed = nn.Embedding(ctx, dim)
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(2 * dim, dim)
        self.ln3 = nn.LayerNorm(dim)
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts_up = nn.Parameter(torch.randn(experts, hidden, dim) / dim ** 0.5)
        self.experts_down = nn.Parameter(torch.randn(experts, dim, hidden) / hidden ** 0.5)
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        b, t = idx.shape
        x = self.tok_embed(idx) + self.pos_embed(torch.arange(t))
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        x = x + self.out(F.gelu(self.fc(self.ln2(x))))
        h = self.ln3(x)
        gate = torch.softmax(self.router(h), dim=-1)                       # [b, t, E]
        up = F.gelu(torch.einsum("btd,ehd->bteh", h, _whole(self.experts_up)))
        y = torch.einsum("bteh,edh->bted", up, _whole(self.experts_down))
        x = x + (gate.unsqueeze(-1) * y).sum(dim=2)
        return self.lm_head(self.ln_f(x))


def _whole(p):
    return p


# -- the worker: one process of the job -----------------------------------------------------------

PLACEMENT_CASES = {
    # mesh shape -> [(global shape, placements as text)]
    (4,): [((8, 6), "S0"), ((7, 5), "S0"), ((6, 9), "S1"), ((3, 4, 5), "S2"), ((5, 3), "R"),
           ((3, 5), "S0")],
    (2, 2): [((8, 6), "S0 S0"), ((7, 6), "S0 S1"), ((8, 6), "R S0"), ((9, 4), "S0 R"),
             ((5, 5), "R R"), ((6, 7), "S1 S0"), ((8, 6), "SS0.2 S0"), ((9, 6), "SS0.2 S0"),
             ((6, 8), "SS1.2 S1"), ((4, 6, 10), "S0 S2"), ((4, 6, 10), "SS0.2 S0")],
}


def parse_placements(text):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard
    out = []
    for word in text.split():
        if word == "R":
            out.append(Replicate())
        elif word.startswith("SS"):
            d, sf = word[2:].split(".")
            out.append(_StridedShard(int(d), split_factor=int(sf)))
        else:
            out.append(Shard(int(word[1:])))
    return out


def placements_case(rank, world):
    """held_runs against DTensor's local tensors; the moves against the global tensor."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, distribute_tensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    records = []
    for mesh_shape, cases in PLACEMENT_CASES.items():
        mesh = init_device_mesh("cpu", mesh_shape)
        named, globals_ = [], {}
        for k, (shape, text) in enumerate(cases):
            placements = parse_placements(text)
            whole = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
            if any(type(p).__name__ == "_StridedShard" for p in placements):
                # distribute_tensor lays out left to right; a strided shard's local tensor is
                # DTensor's to place: redistribute from Replicate.
                t = distribute_tensor(whole, mesh, [parse_placements("R")[0]] * len(mesh_shape))
                t = t.redistribute(mesh, placements)
            else:
                t = distribute_tensor(whole, mesh, placements)
            runs = _mesh.held_runs(shape, mesh_shape, mesh.get_coordinate(), placements)
            index = [torch.cat([torch.arange(a, b) for a, b in r]) if r else
                     torch.zeros(0, dtype=torch.int64) for r in runs]
            ours = whole[torch.meshgrid(*index, indexing="ij")] if all(len(i) for i in index) \
                else torch.zeros([len(i) for i in index])
            local = t.to_local()
            shape_t, offset_t = compute_local_shape_and_global_offset(shape, mesh, placements)
            first = tuple(int(i[0]) if len(i) else shape[d] for d, i in enumerate(index))
            records.append({"mesh": list(mesh_shape), "shape": list(shape), "placements": text,
                            "same_values": tuple(ours.shape) == tuple(local.shape)
                            and torch.equal(ours, local),
                            "same_shape": tuple(ours.shape) == tuple(shape_t),
                            "same_offset": all(ours.numel() == 0 or a == b
                                               for a, b in zip(first, offset_t))})
            name = f"p{k}"
            named.append((name, t))
            globals_[name] = whole
        layout = _mesh.MeshLayout(named, rank, world)
        rows = layout.to_engine({n: t.to_local() for n, t in named})
        moved_in = all(torch.equal(rows[n], _engine_rows(globals_[n], rank, world)) for n in rows)
        targets = {n: torch.full_like(t.to_local(), -1.0) for n, t in named}
        layout.from_engine(rows, targets)
        moved_out = all(torch.equal(targets[n], t.to_local()) for n, t in named)
        records.append({"mesh": list(mesh_shape), "moved_in": moved_in, "moved_out": moved_out,
                        "identity": layout.identity})
    return records


def _engine_rows(whole, rank, world):
    lo, hi = _mesh.rows_of(whole.shape[0], world, rank)
    return whole[lo:hi].reshape(-1)


def worker(args):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {"rank": rank}
    if args.case == "placements":
        out["records"] = placements_case(rank, world)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


# -- the tests ------------------------------------------------------------------------------------

def job(test, world, kind, case, **kw):
    with tempfile.TemporaryDirectory() as out:
        results = run_job(world, kind, case, out, script=__file__, **kw)
        for r, (code, text) in enumerate(results):
            test.assertEqual(code, 0, f"{kind} {case} world {world} rank {r}:\n{text}")
        ranks = []
        for r in range(world):
            with open(os.path.join(out, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
        return ranks


class PlacementReader(unittest.TestCase):

    def test_strided_shard_of_the_docstring(self):
        # _StridedShard's own example: [8] rows on a 2 x 2 mesh placed (_S(0, 2), Shard(0))
        # gives rows 0-1, 4-5, 2-3, 6-7 to coordinates (0,0), (0,1), (1,0), (1,1).
        placements = parse_placements("SS0.2 S0")
        got = [_mesh.held_runs((8,), (2, 2), c, placements)[0]
               for c in ((0, 0), (0, 1), (1, 0), (1, 1))]
        self.assertEqual(got, [[(0, 2)], [(4, 6)], [(2, 4)], [(6, 8)]])

    def test_against_dtensor_at_four_processes(self):
        ranks = job(self, 4, "fsdp", "placements", timeout=240)
        checked = 0
        for r in ranks:
            for rec in r["records"]:
                if "placements" in rec:
                    what = f"rank {r['rank']} {rec}"
                    self.assertTrue(rec["same_values"], what)
                    self.assertTrue(rec["same_shape"], what)
                    self.assertTrue(rec["same_offset"], what)
                    checked += 1
                else:
                    self.assertTrue(rec["moved_in"] and rec["moved_out"], rec)
                    self.assertFalse(rec["identity"], rec)
        print(f"held_runs equal to DTensor's local tensors in {checked} cases (4 processes, "
              "meshes 4 and 2 x 2); the moves to the engine's rows and back exact")


if __name__ == "__main__":
    if "--worker" in sys.argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--worker", action="store_true")
        ap.add_argument("--kind")
        ap.add_argument("--case")
        ap.add_argument("--out")
        ap.add_argument("--gas", type=int, default=1)
        ap.add_argument("--dir", default="")
        ap.add_argument("--clip", type=float, default=0.0)
        ap.add_argument("--steps", type=int, default=STEPS)
        worker(ap.parse_args())
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    else:
        unittest.main()
