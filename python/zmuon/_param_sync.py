"""The parameters and the engine's fp32 masters, kept in step: the new values into the
parameters after each step, and any write made to a parameter elsewhere (a model load, an EMA
swap, p.data.copy_()) back into the engine before the next.

In a job of one rank, an fp32 contiguous parameter on the engine's device becomes a view of its
master at the end of the first step (`p.data` is the engine's own memory from then on, one
storage change): the step writes it in place, a write elsewhere is a write into the master, and
neither a write-back nor a check is needed. Only a new storage (`p.data = ...`, `model.to(...)`)
is looked for, by data pointer. Before the engine's memory goes (close(), garbage collection,
add_param_group's new engine) each such parameter gets a storage of its own again, with its
values. Under FSDP2's rows (a process of one rank), the local shard of each fp32 parameter
becomes a view of the rank's master the same way, and FSDP2's own record of
it (what its all-gather reads, the shard's padding with it: the engine's rank shard ends in the
same rows of padding) is pointed there too; a torch whose FSDP2 records are not found has its
shards written back and checked.

A parameter the engine cannot read in place (bf16 or fp16, not contiguous, or a CUDA tensor with
host_staging) gets an fp32 staging buffer: the engine reads and writes that, and the new values
are rounded to nearest into the parameter. A write elsewhere shows as a new version counter, a
new data pointer or a new content fingerprint (p.data.copy_() leaves torch's version counter as
it was, so the content is fingerprinted too). The fingerprint of a floating-point tensor is its
L2 norm in fp32, all parameters in a few multi-tensor kernels (torch._foreach_norm) and one
read-back a step: a write that keeps every norm (a permutation, a sign flip) goes unnoticed."""

import ctypes
import zlib

from . import _distributed, _mesh
from ._buffers import (buffer_of, current_stream, dtype_of, entries_devices, is_torch,
                       local_tensor_of, synchronize_torch)
from ._capi import HOST
from ._rounding import is_a_rounding

try:
    import torch
except ImportError:  # the numpy path: arrays are read in place, never staged
    torch = None

_INT_OF_SIZE = {}  # element size -> the integer dtype a fingerprint views it as
if torch is not None:
    _INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _is_tensor(t):
    """A real torch tensor (not merely one with data_ptr, as test doubles are)."""
    return torch is not None and isinstance(t, torch.Tensor)


def local_of(p):
    """The tensor this process holds of parameter `p`: FSDP2's local shard, else `p`."""
    return _distributed.local_tensor(p)


class _CudaMemory:
    """Device memory of the engine's as __cuda_array_interface__ describes it to torch (which
    keeps this object, and never frees the memory)."""

    def __init__(self, ptr, numel):
        self.__cuda_array_interface__ = {"shape": (numel,), "typestr": "<f4",
                                         "data": (ptr, False), "version": 3, "strides": None}


def master_view(ptr, numel, device, shape):
    """A torch tensor of `shape` over the engine's master at `ptr` (its memory stays the
    engine's)."""
    if device == HOST:
        flat = torch.frombuffer((ctypes.c_float * numel).from_address(ptr), dtype=torch.float32)
    else:
        flat = torch.as_tensor(_CudaMemory(ptr, numel), device=f"cuda:{device}")
    return flat.view(shape)


def needs_staging(local, host_staging):
    """Whether the engine cannot read and write `local` in place."""
    if not is_torch(local):
        return False
    if _is_tensor(local) and (local.dtype != torch.float32 or not local.is_contiguous()):
        return True
    return local.is_cuda and host_staging


def _staged_copy(local, host_staging):
    if not _is_tensor(local):  # a torch-like CUDA buffer with host_staging
        return local.detach().to("cpu").contiguous()
    device = "cpu" if host_staging else local.device
    return local.detach().to(device, torch.float32, copy=True).contiguous()


class Binding:
    """One parameter as the engine sees it: the user's tensor, the fp32 contiguous buffer the
    engine reads and writes (the local tensor itself or its staging copy), and the marks of
    the last values the two agreed on."""

    __slots__ = ("name", "param", "shape", "host_staging", "staging", "marks", "fingerprint",
                 "master", "master_key", "whole")
    masters_changed = 0  # counts every new binding and master change: MasterViews' cache key

    def __init__(self, name, param, host_staging):
        Binding.masters_changed += 1
        self.name, self.param = name, param
        self.whole = not _distributed.is_dtensor(param)  # the tensor is its own local part
        self.shape = tuple(param.shape)
        self.host_staging = host_staging
        self.staging = None
        self.restage()
        self.marks = None
        self.fingerprint = None
        self.master = None  # the view of the engine's master that is the parameter's storage
        self.master_key = None  # (master, its data_ptr, dtype, shape): in_master's, read once

    def restage(self):
        """A staging buffer where the tensor needs one now (model.to(torch.bfloat16) after
        the optimizer was made swaps each parameter's storage), none where it does not.
        Returns whether the buffer changed (then its values are the tensor's)."""
        local = local_of(self.param)
        if not needs_staging(local, self.host_staging):
            changed, self.staging = self.staging is not None, None
            return changed
        if self.staging is None or tuple(self.staging.shape) != tuple(local.shape):
            self.staging = _staged_copy(local, self.host_staging)
            return True
        return False

    @property
    def local(self):
        return self.param if self.whole else local_of(self.param)

    @property
    def buffer(self):
        """What the engine reads and writes: fp32, contiguous."""
        return self.staging if self.staging is not None else self.local

    @property
    def low_precision(self):
        return self.staging is not None and _is_tensor(self.local) \
            and self.local.dtype != torch.float32

    def current_marks(self):
        """Version counters and data pointer: free to read, moved by most writes."""
        local = self.local
        if not _is_tensor(local):
            return (buffer_of(local, f"parameter '{self.name}'")[0],)
        return (local._version, self.param._version, local.data_ptr())

    def host_values(self):
        """The parameter's values as fp32 on the host, refreshing the staging copy."""
        local = self.local
        if self.staging is not None and _is_tensor(local):
            with torch.no_grad():
                self.staging.copy_(local)
            values = self.staging
        elif self.staging is not None:
            values = self.staging = _staged_copy(local, True)
        else:
            values = local
        if _is_tensor(values):
            return values.detach().to("cpu").contiguous()
        return values

    def unchanged_after_rounding(self, rounding=None):
        """A bf16 / fp16 parameter that holds its master rounded, as written last (a model load
        of the same weights): the master stays."""
        local = self.local
        if not self.low_precision:
            return False
        if rounding is not None and rounding.applies_to(local):
            return is_a_rounding(local, self.staging)
        return torch.equal(local, self.staging.to(local.dtype))

    def copy_into_param(self, rounding=None):
        if self.staging is None:
            return
        if rounding is not None and rounding.applies_to(self.local):
            rounding.into(self.local, self.staging)
        else:  # rounded to nearest where the dtype is narrower
            self.local.data.copy_(self.staging)

    def shareable(self, device, numel, fsdp, world):
        """How many elements of the engine's master, `numel` of them this parameter's (on
        `device`: HOST or a CUDA ordinal), its storage can view; 0: none. A plain fp32
        contiguous torch tensor there, read in place: numel. The local shard of an FSDP2
        parameter (`fsdp`: FSDP2's records by id, from _distributed.fsdp_params) on FSDP2's rows
        over `world` processes: its padded length, where the engine's rank shard ends in the
        same padding (both ceil(rows / world) rows), so that FSDP2's all-gather reads it."""
        p, local = self.param, self.local
        if self.staging is not None or not _is_tensor(local) or local.numel() != numel:
            return 0
        if device == HOST and local.device.type != "cpu" \
                or device != HOST and not (local.is_cuda and (local.device.index or 0) == device):
            return 0
        if local is p:
            return numel if type(p) in (torch.Tensor, torch.nn.Parameter) else 0
        data = getattr(fsdp.get(id(p)), "_sharded_param_data", None)
        if type(data) is not torch.Tensor or type(local) is not torch.Tensor or not self.shape:
            return 0
        row = numel // local.shape[0] if local.shape[0] else 0
        padded = -(-self.shape[0] // world) * row
        return padded if data.numel() == padded and row > 0 else 0

    def share_master(self, view, fsdp):
        """The parameter's storage becomes `view` (flat), the engine's master, which holds its
        values (an FSDP2 parameter's local shard, its padding with it: the buffer FSDP2
        all-gathers from)."""
        if self.local is self.param:
            self.master = view.view(self.param.shape)
            self.param.data = self.master
        else:
            self.master = _set_fsdp_local(fsdp[id(self.param)], self.param, view)
        self.marks = self.fingerprint = None
        Binding.masters_changed += 1

    def drop_master(self):
        """The parameter's storage is its own (again): no master to compare with."""
        self.master = self.master_key = None
        Binding.masters_changed += 1

    def in_master(self):
        """Whether the parameter's storage is still the engine's master (the master's side
        read once per master). A step asks MasterViews, which asks this only where a data
        pointer or dtype moved."""
        master = self.master
        if master is None:
            return False
        key = self.master_key
        if key is None or key[0] is not master:
            key = self.master_key = (master, master.data_ptr(), master.dtype, master.shape)
        local = self.param if self.whole else local_of(self.param)
        return local.data_ptr() == key[1] and local.dtype == key[2] and local.shape == key[3]

    def own_storage(self, fsdp):
        """A storage of its own again, with the master's values (before the master goes)."""
        if self.in_master():
            if self.local is self.param:
                self.param.data = self.master.detach().clone()
            elif id(self.param) in fsdp:
                record = fsdp[id(self.param)]
                _set_fsdp_local(record, self.param, record._sharded_param_data.clone())
        self.drop_master()


def copy_into_params(bindings, rounding):
    """Binding.copy_into_param for each of `bindings`: those rounded to nearest whose staging
    buffer lies on their tensor's device in one torch._foreach_copy_ (a multi-tensor pass, not a
    copy_ a parameter; the same bits), the others each."""
    together = []
    for b in bindings:
        if b.staging is None:
            continue
        if b.host_staging or not _is_tensor(b.local) or rounding.applies_to(b.local):
            b.copy_into_param(rounding)
        else:
            together.append(b)
    if together:
        with torch.no_grad():
            torch._foreach_copy_([b.local for b in together], [b.staging for b in together])


class MasterViews:
    """Which bindings are views of their masters (in_master), for all of them at once: the
    parameters' (FSDP2: their local shards') data pointers and dtypes each read in one map()
    and compared with their masters' (a few C calls instead of one Python call a parameter).
    A data pointer or dtype that moved sends every binding through in_master (a view of the
    master in another shape at its address counts as one still: the parameter's gradient then
    has that shape, which the hand-over refuses). Rebuilt where a binding or a master changed
    (Binding.masters_changed)."""

    def __init__(self, bindings):
        self.key = (Binding.masters_changed, len(bindings))
        self.plain = [b for b in bindings if b.master is None]
        whole = [b for b in bindings if b.master is not None and b.whole]
        shards = [b for b in bindings if b.master is not None and not b.whole]
        self.held = whole + shards
        self.params = [b.param for b in whole]
        self.sharded = [b.param for b in shards]
        self.ptrs = [b.master.data_ptr() for b in self.held]
        self.dtypes = [b.master.dtype for b in self.held]

    def moved(self):
        """The bindings with a master that their parameter no longer views."""
        if not self.held:
            return []
        try:
            local = self.params + list(map(local_tensor_of, self.sharded))
            if list(map(torch.Tensor.data_ptr, local)) == self.ptrs \
                    and list(map(dtype_of, local)) == self.dtypes:
                return []
        except (AttributeError, TypeError):  # a DTensor without a local tensor of its own
            pass
        return [b for b in self.held if not b.in_master()]


def _set_fsdp_local(record, param, flat):
    """FSDP2 parameter `param`'s buffer made `flat` (its padded length) and its local shard the
    first rows of it, which it returns: what FSDP2's `reset_sharded_param` sets, set directly,
    since that reads the module's current attribute (an unsharded parameter after a forward of
    the root, or with reshard_after_backward off)."""
    local = param._local_tensor
    param._local_tensor = flat.view(-1, *local.shape[1:]).narrow(0, 0, local.shape[0])
    record._sharded_param_data = flat
    return param._local_tensor


def _own_storages(bindings, mode):
    """Each parameter that is a view of its master gets a storage of its own again."""
    fsdp = _distributed.fsdp_params() if mode == _distributed.FSDP else {}
    for b in bindings:
        b.own_storage(fsdp)


def _bit_sum(t):
    """The wrapping sum of a tensor's bits as 64-bit words (a 0-d tensor on its device): a
    contiguous one read as int64 (the tail bytes added apart); a strided one by element."""
    if t.is_contiguous():
        raw = t.reshape(-1).view(torch.uint8)
        whole = raw.numel() // 8 * 8
        try:
            total = raw[:whole].view(torch.int64).sum()
        except RuntimeError:  # a storage offset not 8-byte aligned
            return t.view(_INT_OF_SIZE[t.element_size()]).sum(dtype=torch.int64)
        if whole < raw.numel():
            total = total + raw[whole:].sum(dtype=torch.int64)
        return total
    return t.view(_INT_OF_SIZE[t.element_size()]).sum(dtype=torch.int64)


class _Norm:
    """A floating-point tensor's fingerprint: element k of `vec`, the fp32 L2 norms of the
    tensors fingerprinted together on one device."""

    __slots__ = ("vec", "k")

    def __init__(self, vec, k):
        self.vec, self.k = vec, k

    def item(self):
        return self.vec[self.k].item()


def fingerprints(tensors):
    """One value per tensor that a write elsewhere changes: for floating-point torch tensors the
    fp32 L2 norm (_Norm), all of them in a few multi-tensor launches per device and one stack
    (no wait for the GPU); the wrapping sum of the bits for other torch tensors, crc32 for numpy
    arrays, None for other buffers."""
    out = [None] * len(tensors)
    floats = {}  # device -> [(index, tensor)]
    for i, t in enumerate(tensors):
        if _is_tensor(t):
            if t.numel() == 0:
                out[i] = 0
            elif t.is_floating_point():
                floats.setdefault(t.device, []).append((i, t))
            else:
                out[i] = _bit_sum(t.detach())
        elif hasattr(t, "__array_interface__"):
            out[i] = zlib.crc32(memoryview(t).cast("B"))
    if floats:
        with torch.no_grad():
            for items in floats.values():
                vec = torch.stack(torch._foreach_norm([t for _, t in items], 2,
                                                      dtype=torch.float32))
                for k, (i, _) in enumerate(items):
                    out[i] = _Norm(vec, k)
    return out


def _values_of(prints):
    """The norms of `prints` (_Norm of one device) as one tensor: their own vector where they
    are all of it in order (the common case), else gathered."""
    vec = prints[0].vec
    if all(p.vec is vec for p in prints):
        if len(prints) == vec.numel() and all(p.k == k for k, p in enumerate(prints)):
            return vec
        return vec[torch.tensor([p.k for p in prints], device=vec.device)]
    return torch.stack([p.vec[p.k] for p in prints])


def same_fingerprints(old, new):
    """Which pairs agree (a NaN agrees with a NaN); one read-back per device."""
    out = [None] * len(old)
    by_device = {}
    for i, (a, b) in enumerate(zip(old, new)):
        if isinstance(a, _Norm) and isinstance(b, _Norm) and a.vec.device == b.vec.device:
            by_device.setdefault(a.vec.device, []).append(i)
        elif _is_tensor(a) and _is_tensor(b) and a.device == b.device and a.dtype == b.dtype:
            out[i] = bool(a == b)
        else:
            value = (lambda x: x.item() if isinstance(x, _Norm) or _is_tensor(x) else x)
            out[i] = value(a) == value(b)
    for indices in by_device.values():
        a = _values_of([old[i] for i in indices])
        b = _values_of([new[i] for i in indices])
        for i, e in zip(indices, ((a == b) | (a.isnan() & b.isnan())).tolist()):
            out[i] = e
    return out


class ParamSync:
    """zmuon.Muon's half that keeps the parameters and the engine in step."""

    def _local_ranks(self):
        return range(self._first_rank, self._first_rank + len(self._micro))

    def _mark_in_step(self, bindings=None):
        """The parameters agree with the engine now: their marks are the reference (none for
        a parameter that is its master)."""
        bindings = list(self._bindings.values()) if bindings is None else bindings
        bindings = [b for b in bindings if b.master is None]
        prints = fingerprints([b.local for b in bindings])
        for b, f in zip(bindings, prints):
            b.marks, b.fingerprint = b.current_marks(), f

    def _reload_written(self):
        """Loads every parameter written outside zmuon since the engine last agreed with it,
        per shard into this process's ranks (no collective; DTensors placed otherwise than
        FSDP2's rows: all of them, once some process saw a write). Returns their names."""
        if not self._bindings:
            return []
        views = self._master_views()
        moved = views.moved()
        watched = views.plain
        for b in moved:  # a new storage: its values are loaded, it is shared again after the step
            b.drop_master()
        prints = fingerprints([b.local for b in watched])
        same = same_fingerprints([b.fingerprint for b in watched], prints)
        written = moved + [b for b, s in zip(watched, same)
                           if not s or b.current_marks() != b.marks]
        if self._mesh is not None:
            if not _mesh.any_process(written):
                return []
            self._load_mesh_shards()
            self.state.invalidate()
            self._mark_in_step()
            return [b.name for b in written]
        restaged = {b.name for b in written  # new storage: maybe a new dtype
                    if (b.marks is None or b.current_marks()[-1:] != b.marks[-1:])
                    and b.restage()}
        reload = [b for b in written
                  if b.name in restaged or not b.unchanged_after_rounding(self._rounding)]
        if reload:
            values = [(b, b.host_values()) for b in reload]
            entries = [(b.name, *buffer_of(v, f"parameter '{b.name}'")[:3]) for b, v in values]
            for rank in self._local_ranks():
                self._engine.load_shard_params(rank, entries)
            self.state.invalidate()
        if written:
            self._mark_in_step(written)
        return [b.name for b in reload]

    def _master_views(self):
        """MasterViews of the bindings, kept while none changed."""
        views = getattr(self, "_views", None)
        if views is None or views.key != (Binding.masters_changed, len(self._bindings)):
            views = self._views = MasterViews(list(self._bindings.values()))
        return views

    def _share_masters(self, bindings):
        """Where this process runs the one rank of a job of one, or one rank of FSDP2's rows,
        each parameter that can be becomes a view of its master (of its shard under FSDP2)."""
        # fp32 ones read in place (a staged one, bf16 say, cannot be a view of its master)
        candidates = [b for b in bindings if b.master is None and b.staging is None]
        if not candidates:
            return
        engine = self._engine
        if not hasattr(engine, "_master_device"):  # decided once an engine: None, no masters
            shares = torch is not None and (
                (self._mode == _distributed.PLAIN and self._node is None and engine.world == 1)
                or (self._mode == _distributed.FSDP and self._mesh is None
                    and len(self._micro) == 1))
            # every master of this process lives in its one rank's memory, each in one place
            # until the engine closes: asked once a parameter
            engine._masters = {}
            engine._master_device = self._master_of(candidates[0].name)[2] if shares else None
            if shares:
                engine.before_close(lambda bs=self._bindings, mode=self._mode:
                                    _own_storages(bs.values(), mode))
        if engine._master_device is None:
            return
        fsdp = _distributed.fsdp_params() if self._mode == _distributed.FSDP else {}
        for b in candidates:
            ptr, numel, device = self._master_of(b.name)
            span = b.shareable(engine._master_device, numel, fsdp, engine.world) if numel else 0
            if span:
                b.share_master(master_view(ptr, span, device, (span,)), fsdp)

    def _master_of(self, name):
        """engine.master(name), asked once an engine."""
        masters = self._engine._masters
        if name not in masters:
            masters[name] = self._engine.master(name)
        return masters[name]

    def _mesh_shards(self, shards=None):
        """`shards` (name -> this rank's fp32 flat shard of a DTensor parameter), or else where
        the write-back has the engine write them: the local tensor itself where the shard is a
        run of it (MeshLayout.own_view, HSDP: no copy after), else buffers it keeps (on the host
        with host_staging); with the engine's entries."""
        if shards is None:
            buffers = self._mesh_buffers = getattr(self, "_mesh_buffers", None) or {}
            shards = {}
            for name, b in self._bindings.items():
                # a view taken each time (the storage may have moved), a buffer made once
                view = None if self._host_staging else self._mesh.own_view(name, b.local)
                if view is None and name not in buffers:
                    buffers[name] = torch.zeros(
                        self._mesh.engine_len(name), dtype=torch.float32,
                        device="cpu" if self._host_staging else b.local.device)
                shards[name] = buffers[name] if view is None else view
        entries = [(name, *buffer_of(t, f"parameter '{name}'", writable=True)[:3])
                   for name, t in shards.items()]
        return shards, entries

    def _load_mesh_shards(self):
        """Every process's local tensors, moved to the engine's shards, into this rank (the
        C call reads host buffers)."""
        shards = self._mesh.to_engine({b.name: b.local for b in self._bindings.values()})
        shards = {name: t.to("cpu") for name, t in shards.items()}
        self._engine.load_shard_params(self._first_rank, self._mesh_shards(shards)[1])

    def _write_back(self):
        """The engine's new values into the parameters (whole, or the DTensors' local
        tensors); a parameter that is its master has them already."""
        bindings = list(self._bindings.values())
        self._rounding.begin()
        if self._mesh is not None:
            shards, entries = self._mesh_shards()
            synchronize_torch(list(shards.values()))  # the C call takes no stream as "write now"
            self._engine.shard_params(self._first_rank, entries)
            self._mesh.from_engine(shards, {b.name: b.local for b in bindings})
            self._mark_in_step(bindings)
            return
        self._share_masters(bindings)
        views = self._master_views()
        bindings = views.plain + views.moved()
        if not bindings:
            return
        entries, targets = [], []
        for b in bindings:
            targets.append(b.buffer)
            ptr, numel, device, _ = buffer_of(b.buffer, f"parameter '{b.name}'", writable=True)
            entries.append((b.name, ptr, numel, device))
        if self._mode == _distributed.FSDP:
            # The local shards, in place: no collective (FSDP2 all-gathers at the next forward).
            devices = entries_devices(entries)
            stream = current_stream(devices)
            if not stream and devices:
                synchronize_torch(targets)  # the C call takes no stream as "write now"
            self._engine.shard_params(self._first_rank, entries, stream=stream)
        else:
            # The engine writes device parameters on its own stream, after PyTorch's queued work
            # that may still read them and before PyTorch's next (stream-ordered: no waiting),
            # where this process runs one rank and the parameters share one device; otherwise
            # that work ends first.
            devices = entries_devices(entries)
            stream = current_stream(devices) if len(self._micro) == 1 else None
            if stream is None and devices:
                synchronize_torch(targets)
            self._engine.gather_params(entries, stream=stream)
        copy_into_params(bindings, self._rounding)
        self._mark_in_step(bindings)
