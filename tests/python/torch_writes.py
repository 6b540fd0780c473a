"""Writes made to the parameters outside the optimizer, the same in every run: a model and its
optimizers go through them step by step (test_torch_parameters at one process,
test_torch_distributed under FSDP2 at two). `put` writes a whole tensor's values into a
parameter (under FSDP2 this process's rows of it)."""

import io
import zlib

import torch
from torch.utils._pytree import tree_map_only

from test_torch_optim import batches, lm_loss

STEPS = 10
BATCH_OF_WRITES = 8  # sequences a step, split over the processes


def values(name, shape, salt):
    """Fixed values for parameter `name` (a layer re-initialised, a weight copied in)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}/{salt}".encode()))
    return 0.05 * torch.randn(shape, generator=g)


def copied(tree):
    """A dict that shares no memory with the model or the optimizer (as torch.save and
    torch.load make it)."""
    tree = tree_map_only(torch.Tensor, lambda t: t.detach().clone(), tree)
    buf = io.BytesIO()
    torch.save(tree, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def put_data(p, v):
    p.data.copy_(v)  # torch's version counter does not move


def put_no_grad(p, v):
    with torch.no_grad():
        p.copy_(v)  # the version counter moves


def save(ctx):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    ctx.saved["model"] = copied(ctx.model.state_dict())
    ctx.saved["opts"] = [copied(o.state_dict()) for o in ctx.opts]
    ctx.saved["dcp"] = copied(get_state_dict(ctx.model, ctx.opts))


def data_copy(ctx):
    named = dict(ctx.model.named_parameters())
    for n in ("fc.weight", "ln1.bias"):
        ctx.put(named[n], values(n, named[n].shape, "copy"), put_data)


def reinit_layer(ctx):
    named = dict(ctx.model.named_parameters())
    for n in ("proj.weight", "proj.bias"):
        ctx.put(named[n], values(n, named[n].shape, "init"), put_no_grad)


def ema_swap(ctx):
    """Evaluation with the EMA weights (here half the weights), then the weights back."""
    params = list(ctx.model.parameters())
    kept = [p.detach().clone() for p in params]
    for p in params:
        p.data.copy_(0.5 * p.detach())
    with torch.no_grad():
        lm_loss(ctx.model, batches(1, seed=99, batch=2)[0])
    for p, k in zip(params, kept):
        p.data.copy_(k)


def ema_by_pointer(ctx):
    """EMA weights swapped in by storage (p.data = ...), training goes on from them."""
    for p in ctx.model.parameters():
        p.data = 0.5 * p.detach()


def load_optimizer_then_model(ctx):
    for o, sd in zip(ctx.opts, ctx.saved["opts"]):
        o.load_state_dict(sd)
    ctx.model.load_state_dict(ctx.saved["model"])


def dcp_set_state_dict(ctx):
    from torch.distributed.checkpoint.state_dict import set_state_dict
    msd, osd = ctx.saved["dcp"]
    set_state_dict(ctx.model, ctx.opts, model_state_dict=msd, optim_state_dict=osd)


# (before step, label, write): every write at its own step; save before them all.
SCRIPT = [(2, "save", save),
          (3, "p.data.copy_()", data_copy),
          (4, "a layer re-initialised", reinit_layer),
          (5, "EMA swapped in and back", ema_swap),
          (6, "opt.load_state_dict, then model.load_state_dict", load_optimizer_then_model),
          (7, "DCP set_state_dict with copied dicts", dcp_set_state_dict),
          (8, "EMA swapped in by pointer", ema_by_pointer)]
ALL = [label for _, label, _ in SCRIPT if label != "save"]


class Context:
    def __init__(self, model, opts, put):
        self.model, self.opts, self.put, self.saved = model, opts, put, {}


def run(model, opts, writes, rank=0, world=1, put=None, before_step=None):
    """STEPS steps of this process's share of each batch, making `writes` (labels of SCRIPT)
    before their steps; the saves happen whenever a load is among them."""
    ctx = Context(model, opts, put or (lambda p, v, how: how(p, v)))
    loads = {"opt.load_state_dict, then model.load_state_dict",
             "DCP set_state_dict with copied dicts"}
    wanted = set(writes) | ({"save"} if loads & set(writes) else set())
    share = BATCH_OF_WRITES // world
    for step, tokens in enumerate(batches(STEPS, seed=4, batch=BATCH_OF_WRITES)):
        for at, label, write in SCRIPT:
            if at == step and label in wanted:
                write(ctx)
        if before_step is not None:
            before_step(step)
        for o in opts:
            o.zero_grad()
        lm_loss(model, tokens[rank * share:(rank + 1) * share]).backward()
        for o in opts:
            o.step()
