"""zmuon.Muon's gradient hand-over: each micro-batch's gradients into the engine, as fp32
contiguous buffers by data pointer (a bf16, fp16 or strided gradient is copied first)."""

import itertools
import math
import operator
import sys

from . import _capi, _distributed
from ._buffers import (buffer_of, current_stream, dtype_of, entries_devices, is_torch,
                       local_tensor_of, synchronize_torch)
from ._capi import HOST, InvalidArgument, ShapeMismatch


def _as_is(name, g, shape, host_staging, torch):
    """The entry of a gradient the engine reads as it is (a plain fp32 contiguous tensor of the
    parameter's shape, where it lies), without the general path's checks; else None. `torch`:
    the imported torch module, or None."""
    fp32 = getattr(torch, "float32", None)  # None: no torch, or a stand-in without dtypes
    if fp32 is None or type(g) is not torch.Tensor or g.dtype != fp32 \
            or not g.is_contiguous() or g.shape != shape:
        return None
    if not g.is_cuda:
        return (name, g.data_ptr(), g.numel(), HOST) if g.device.type == "cpu" else None
    if host_staging:
        return None
    return (name, g.data_ptr(), g.numel(), g.get_device())


def _engine_readable(g, host_staging):
    """`g` as the engine reads it: fp32, contiguous, and on the host with host_staging."""
    if not is_torch(g):
        return g
    if str(g.dtype) != "torch.float32":
        g = g.detach().float()
    if g.is_cuda and host_staging:
        return g.detach().to("cpu").contiguous()
    return g if g.is_contiguous() else g.contiguous()


_grad_of = operator.attrgetter("grad")
_shape_of = operator.attrgetter("shape")
_is_cpu = operator.attrgetter("is_cpu")
_is_cuda = operator.attrgetter("is_cuda")


def _every_grad_plain(torch, columns, host_staging):
    """_plain_grads where every parameter's .grad is a plain fp32 contiguous tensor of its
    shape, or every one a DTensor (FSDP2) whose local shard is a plain fp32 contiguous tensor,
    and all lie on one device: each check one map() over the gradients, C calls without a
    Python call between them (about four fifths of the per-parameter loop's time); None where
    one is not. `columns`: the parameters' names, tensors, shapes and numels."""
    names, params, shapes, numels = columns
    grads = list(map(_grad_of, params))
    tensor = torch.Tensor
    kinds = set(map(type, grads))
    if kinds == {tensor}:
        if list(map(_shape_of, grads)) != shapes:
            return None
    elif len(kinds) == 1 and _distributed.is_dtensor(grads[0]):
        try:  # FSDP2's shards (local_tensor's reading)
            grads = list(map(local_tensor_of, grads))
        except AttributeError:  # a torch whose DTensor keeps it elsewhere: the general path
            return None
        if set(map(type, grads)) != {tensor}:
            return None
        numels = list(map(tensor.numel, grads))
    else:
        return None
    if set(map(dtype_of, grads)) != {torch.float32} or not all(map(tensor.is_contiguous, grads)):
        return None
    devices = set(map(tensor.get_device, grads))  # -1: not a CUDA tensor
    if len(devices) != 1:
        return None
    device = devices.pop()
    if device < 0 and all(map(_is_cpu, grads)):
        device = HOST
    elif device < 0 or host_staging or not all(map(_is_cuda, grads)):
        return None
    return list(zip(names, map(tensor.data_ptr, grads), numels, itertools.repeat(device))), grads


class Gradients:
    """zmuon.Muon's half that hands gradients to the engine."""

    def accumulate(self, grads=None, rank=None):
        """Hands over one micro-batch's gradients of rank `rank` (default: this process's first
        rank): by default each torch parameter's .grad (None: no gradient in this micro-batch);
        else `grads`, a dict name -> array/tensor or a list in the order of the parameters. A
        parameter left out here counts as zero in this micro-batch; one left out of every
        micro-batch on every rank of a step is left as it is, as torch leaves a parameter whose
        .grad is None (no momentum decay, no weight decay, no AdamW step count). Each gradient
        has its parameter's shape (else zmuon.ShapeMismatch, and nothing of the call is handed
        over)."""
        self._hand_over(grads, rank)

    def _hand_over(self, grads=None, rank=None, kept=False):
        """accumulate()'s work. kept: step()'s own hand-over of the parameters' .grad, which
        stay as they are until the engine's step returns; the engine may then read device
        gradients where they lie, without a copy and without waiting. Returns the tensors that
        must live until then (the converted copies among them) and PyTorch's current stream of
        their device (None: not on one device)."""
        if rank is None:
            rank = self._first_rank
        self._ahead = None  # the engine withdraws a hand-over made ahead of the step
        entries, keep = self._entries(grads)
        devices = entries_devices(entries)  # read off the entries: no call per tensor
        stream = current_stream(devices)
        if stream is None and devices:
            synchronize_torch(keep)  # the gradients must be written before the engine reads them
        reduced = self._mode != _distributed.PLAIN  # averaged over the processes already
        if stream is not None and (kept or reduced):  # stream-ordered, the default stream too
            self._engine.hand_over(rank, entries, stream, reduced, kept_until_step=kept)
        elif reduced:  # DDP, FSDP2 across devices: read during the call
            self._engine.hand_over_reduced(rank, entries)
        else:
            self._engine.reduce(rank, entries, stream=stream)
        self._started = True
        if 0 <= rank - self._first_rank < len(self._micro):
            self._micro[rank - self._first_rank] += 1
        return keep, stream

    def accumulate_all(self, grads_by_rank):
        """One micro-batch of every rank of this process at once: grads_by_rank[i] is local
        rank i's (as accumulate's `grads`). The ranks hand over on a thread each inside the
        engine, within the bound on reduce buckets in flight (zmuon.max_buckets_in_flight);
        every rank's gradients are checked before any is handed over."""
        grads_by_rank = list(grads_by_rank)
        self._ahead = None  # the engine withdraws a hand-over made ahead of the step
        entries, keep = [], []
        for i, grads in enumerate(grads_by_rank):
            try:
                e, k = self._entries(grads)
            except _capi.ZmuonError as err:
                raise type(err)(f"accumulate_all(): rank {self._first_rank + i}: {err}") from None
            entries.append(e)
            keep.extend(k)
        if any(device != HOST for e in entries for _, _, _, device in e):
            synchronize_torch(keep)  # read during the call, after the work that wrote them
        self._engine.reduce_all(entries)
        self._started = True
        for i in range(min(len(grads_by_rank), len(self._micro))):
            self._micro[i] += 1

    def _entries(self, grads):
        """accumulate's `grads` as the engine's (name, pointer, numel, device) entries, and the
        objects that must live until the engine has read them."""
        if grads is None and self._mesh is None:
            found = self._plain_grads()
            if found is not None:
                return found
        if grads is None:
            missing = [n for n, p, _ in self._params if not is_torch(p)]
            if missing:
                raise TypeError(f"'{missing[0]}' has no .grad (not a torch tensor): pass "
                                "accumulate(grads={name: array, ...})")
            items = [(n, p.grad) for n, p, _ in self._params]
        elif isinstance(grads, dict):
            items = list(grads.items())
        else:
            grads = list(grads)
            if len(grads) != len(self._params):
                raise InvalidArgument(f"{len(grads)} gradients for {len(self._params)} "
                                      "parameters")
            items = [(n, g) for (n, _, _), g in zip(self._params, grads)]
        entries, keep, placed = [], [], {}
        shapes, staging, torch = self._shapes, self._host_staging, sys.modules.get("torch")
        for name, g in items:
            if g is None or name in self._params_outside:  # zero-size: nothing to step
                continue
            entry = _as_is(name, g, shapes.get(name), staging, torch) \
                if type(name) is str else None
            if entry is not None:  # the common case, checked in a few attribute reads
                entries.append(entry)
                keep.append(g)
                continue
            _capi._text(name, "gradient name")  # a NUL would cut the name short in C
            if _distributed.is_dtensor(g) and self._mesh is not None:
                placed[name] = self._placed_as_param(name, g).to_local()
                continue
            if _distributed.is_dtensor(g):  # FSDP2: this process's shard, reduce-scattered
                g = _engine_readable(_distributed.local_tensor(g), self._host_staging)
                keep.append(g)
                ptr, numel, device, _ = buffer_of(g, f"gradient of '{name}'")
                entries.append((name, ptr, numel, device))
                continue
            g = _engine_readable(g, self._host_staging)
            keep.append(g)
            ptr, numel, device, shape = buffer_of(g, f"gradient of '{name}'")
            expected = self._shapes.get(name)  # an unknown name: the engine's error names it
            if expected is not None and tuple(shape) != expected:
                raise ShapeMismatch(f"gradient of '{name}' has shape {tuple(shape)}, the "
                                    f"parameter's is {expected}")
            entries.append((name, ptr, numel, device))
        if self._mesh is not None:
            self._mesh_gradients(placed, entries, keep)
        return entries, keep

    def _param_slots(self):
        """(whether every parameter is a torch tensor, [(name, parameter, shape, numel)] where
        every name is a str, else None, the same as four columns), kept until the parameters
        change."""
        params = self._params
        cached = getattr(self, "_slots", None)
        if cached is None or cached[0] is not params or cached[1] != len(params):
            plain = all(type(n) is str for n, _, _ in params)
            slots = [(n, p, shape, math.prod(shape)) for n, p, shape in params] \
                if plain else None
            cached = self._slots = (params, len(params), (
                all(is_torch(p) for _, p, _ in params), slots,
                tuple(map(list, zip(*slots))) if slots else None))
        return cached[2]

    def _plain_grads(self):
        """_entries(None) in one pass where every parameter's .grad is None, a plain fp32
        contiguous tensor of its shape, or (FSDP2, called only without a mesh of other
        placements) a DTensor whose local shard is fp32 and contiguous, that the engine reads
        where it lies (the common case, each checked in a few attribute reads); None where one
        is not: the general path."""
        torch = sys.modules.get("torch")
        if getattr(torch, "float32", None) is None:  # no torch, or a stand-in without dtypes
            return None
        all_torch, slots, columns = self._param_slots()
        if not all_torch or not slots:  # numpy parameters: accumulate() names them
            return None
        found = _every_grad_plain(torch, columns, self._host_staging)
        return found if found is not None else self._each_grad_plain(torch, slots)

    def _each_grad_plain(self, torch, slots):
        """_plain_grads a parameter at a time (.grad None and FSDP2's DTensors among them)."""
        tensor, fp32, staging = torch.Tensor, torch.float32, self._host_staging
        dtensor = None  # DTensor's class, once a gradient is one
        entries, keep = [], []
        for name, p, shape, numel in slots:
            g = getattr(p, "grad", None)
            if g is None:
                continue
            if type(g) is not tensor:
                if type(g) is not dtensor:
                    if not _distributed.is_dtensor(g):
                        return None
                    dtensor = type(g)
                g = getattr(g, "_local_tensor", None)  # FSDP2's shard (local_tensor's reading)
                if type(g) is not tensor or g.dtype is not fp32 or not g.is_contiguous():
                    return None
                numel = g.numel()  # the shard's, not the parameter's
            elif g.dtype is not fp32 or not g.is_contiguous() or g.shape != shape:
                return None
            if g.is_cuda:
                if staging:
                    return None
                entries.append((name, g.data_ptr(), numel, g.get_device()))
            elif g.is_cpu:
                entries.append((name, g.data_ptr(), numel, HOST))
            else:
                return None
            keep.append(g)
        return entries, keep

    def _placed_as_param(self, name, g):
        p = self._bindings[name].param if name in self._bindings else None
        if p is None or (tuple(g.placements) == tuple(p.placements)
                         and g.device_mesh == p.device_mesh):
            return g
        return g.redistribute(p.device_mesh, p.placements)  # a Partial gradient summed

    def _mesh_gradients(self, placed, entries, keep):
        """The DTensor gradients (name -> local tensor) moved to the engine's shards: every
        process names each parameter that some process has a gradient of (zeros where it has
        none); one that no process has is left out."""
        import torch
        names = [n for n in self._bindings if n not in self._params_outside]
        present = torch.tensor([n in placed for n in names], dtype=torch.int64)
        torch.distributed.all_reduce(present, op=torch.distributed.ReduceOp.MAX)
        shards = self._mesh.to_engine({n: placed.get(n)
                                       for n, there in zip(names, present.tolist()) if there})
        for name, t in shards.items():
            t = _engine_readable(t, self._host_staging)
            keep.append(t)
            ptr, numel, device, _ = buffer_of(t, f"gradient of '{name}'")
            entries.append((name, ptr, numel, device))
