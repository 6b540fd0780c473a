"""The optimizer state in torch's shape: opt.state (per parameter, its momentum or Adam moments,
read from the engine when asked) and state_dict() / load_state_dict(), without files.

Tensors are torch CPU tensors where PyTorch is importable, numpy arrays otherwise."""

import math
import numbers
import sys

from . import _capi
from ._buffers import is_torch
from ._capi import InvalidArgument, ShapeMismatch
from ._groups import is_made_up, learning_rate
from ._mesh import is_expert_stack

# The engine's tensors under torch's names (torch.optim.Muon's and AdamW's state keys).
MUON_NAMES = {"momentum": "momentum_buffer"}
ADAMW_NAMES = {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}
SCALER_KEYS = ("scale", "iter", "last_overflow_iter", "hysteresis_left")
# NorMuon's row second moments of a Muon parameter, under Dion's name and shape (rows, 1), or
# (E, r, 1) for an expert stack; in the state only while some group runs NorMuon.
ROW_MOMENTS = "variance_neuron"
# The fp32 master of a bf16 / fp16 parameter, in its state entry (where DCP keeps it).
MASTER = "master"


def _torch():
    return sys.modules.get("torch")


def _numpy():
    """numpy, imported only where the parameters are numpy arrays (zmuon imports without it)."""
    import numpy  # pylint: disable=import-outside-toplevel
    return numpy


def _empty(numel):
    torch = _torch()
    if torch is not None:
        return torch.empty(numel, dtype=torch.float32)
    return _numpy().empty(numel, _numpy().float32)


def _pointer(buf):
    return buf.data_ptr() if is_torch(buf) else buf.ctypes.data


def _step_scalar(n):
    """An AdamW step count as torch keeps it: a float32 scalar tensor (numpy: a 0-d array)."""
    torch = _torch()
    if torch is not None:
        return torch.tensor(float(n), dtype=torch.float32)
    return _numpy().array(float(n), _numpy().float32)


def _read(opt, scope, with_master, whole_rows=False):
    """{name: {torch name: tensor, "step": ...}}, {name: master} and the engine's info;
    whole_rows: NorMuon's row moments also in a multi-process job (_read_row_moments)."""
    entries, bufs = [], []
    for name, _, _ in opt._params:
        _, numel = _capi.state_range(opt._engine, name, scope)
        muon = opt._engine.uses_muon(name)
        kinds = (("param",) if with_master else ()) + tuple(MUON_NAMES if muon else ADAMW_NAMES)
        own = {k: _empty(numel) for k in kinds}
        bufs.append(own)
        entries.append((name, numel, {k: _pointer(b) for k, b in own.items()}, 0))
    placed, info = _capi.read_state(opt._engine, scope, entries)
    rows = _read_row_moments(opt, scope, whole_rows)
    full = scope == _capi.STATE_FULL or opt._node is None
    if not full and opt._mesh is not None:
        bufs = _placed_as_params(opt, bufs)
    state, masters = {}, {}
    for (name, p, shape), own, (_, adam_step) in zip(opt._params, bufs, placed):
        if full:
            shaped = {k: b.reshape(shape) for k, b in own.items()}
        elif opt._mesh is not None:
            shaped = own
        elif opt._mode == "fsdp":  # this process's rows, placed as the parameter is
            shaped = {k: _like_param(b, p) for k, b in own.items()}
        else:
            shaped = dict(own)
        if "param" in shaped:
            masters[name] = shaped.pop("param")
        if opt._engine.uses_muon(name):
            state[name] = {MUON_NAMES[k]: v for k, v in shaped.items()}
            if name in rows:
                state[name][ROW_MOMENTS] = rows[name]
        else:
            state[name] = {ADAMW_NAMES[k]: v for k, v in shaped.items()}
            state[name]["step"] = _step_scalar(adam_step)
    return state, masters, info


def _like_param(local, p):
    """This process's elements of FSDP2 parameter `p`'s state (whole dim-0 slices, as zmuon's
    "rows" layout cuts it) as a DTensor placed as `p` (DCP reshards it)."""
    from torch.distributed.tensor import DTensor
    rows = local.reshape((-1,) + tuple(p.shape[1:]))
    return DTensor.from_local(rows, p.device_mesh, p.placements, run_check=False,
                              shape=p.shape, stride=p.stride())


def _placed_as_params(opt, bufs):
    """The engine's shards of each state kind (bufs: per parameter, kind -> flat tensor) moved
    to every process's pieces, as DTensors placed as their parameters (one exchange a kind)."""
    from torch.distributed.tensor import DTensor
    torch = _torch()
    out = [{} for _ in bufs]
    for kind in sorted({k for own in bufs for k in own}):
        rows, pieces = {}, {}
        for (name, p, _), own in zip(opt._params, bufs):
            if kind in own:
                rows[name] = own[kind]
                pieces[name] = torch.zeros(p.to_local().shape, dtype=torch.float32)
        opt._mesh.from_engine(rows, pieces)
        for i, (name, p, _) in enumerate(opt._params):
            if name in pieces:
                out[i][kind] = DTensor.from_local(pieces[name], p.device_mesh, p.placements,
                                                  run_check=False, shape=p.shape,
                                                  stride=p.stride())
    return out


def _whole(value):
    """A DTensor's whole tensor (a collective every process calls in the same order)."""
    if type(value).__name__ == "DTensor" and hasattr(value, "full_tensor"):
        return value.full_tensor()
    return value


def _uses_normuon(opt):
    return any(g.get("variant") == "normuon" for g in opt.param_groups)


def _row_moments_shape(opt, name, shape):
    """NorMuon's row moments of Muon parameter `name`: one per row of its matrix view, as
    (rows, 1), or (E, r, 1) for an expert stack [E, r, ...] (the engine's E * r rows)."""
    view = getattr(opt, "_matrix_views", {}).get(name, "auto")
    shape = tuple(int(s) for s in shape)
    if is_expert_stack(shape, view):
        return shape[0] * shape[1], (shape[0], shape[1], 1)
    return shape[0], (shape[0], 1)


def _read_row_moments(opt, scope, whole=False):
    """{name: (rows, 1) or (E, r, 1) tensor} of NorMuon's row moments of every Muon parameter,
    in the parameter's own row order, while some group runs NorMuon and the state read is
    whole, or `whole` (the moments sit with each NS block's owner rank, maybe in another
    process: in a multi-process job the read is a collective, which state_dict() and a
    restart's snapshot make in every process)."""
    if not _uses_normuon(opt) or (not whole and scope != _capi.STATE_FULL
                                  and opt._node is not None):
        return {}
    entries, bufs, shapes = [], {}, {}
    for name, _, shape in opt._params:
        if opt._engine.uses_muon(name):
            rows, shapes[name] = _row_moments_shape(opt, name, shape)
            bufs[name] = _empty(rows)
            entries.append((name, rows, _pointer(bufs[name])))
    _capi.read_row_moments(opt._engine, entries)
    out = {name: b.reshape(shapes[name]) for name, b in bufs.items()}
    if opt._mesh is not None:  # an expert stack held in its holders' order: put back
        out = {name: opt._mesh.in_natural_order(name, b, moments=True)
               for name, b in out.items()}
    return out


class ShardState(dict):
    """opt.state: parameter -> {"momentum_buffer"} (Muon) or {"exp_avg", "exp_avg_sq", "step"}
    (AdamW), read from the engine on the first access after a step or a load. Keyed by the
    parameter (a torch tensor), or its name where the parameters are numpy arrays; a name or
    the array itself also finds an entry. In one process the tensors are whole and shaped like
    the parameter; in a multi-process job they are this process's elements of the flattened
    tensor (opt.local_range(name) says which), so that reading them is no collective; under
    FSDP2 they are DTensors placed as their parameters. Each read
    gives new host tensors: changing them changes nothing in the engine. Any other key (a
    hook's own, as torch.optim keeps it) stays as set, and state_dict() carries it."""

    def __init__(self, opt):
        super().__init__()
        self._opt = opt
        self._stale = True

    def invalidate(self):
        self._stale = True

    def _refresh(self):
        if not self._stale:
            return
        opt = self._opt
        state, _, _ = _read(opt, _capi.STATE_LOCAL, with_master=False)
        extra = self.extra()
        super().clear()
        super().update(extra)
        for name, p, _ in opt._params:
            key = p if getattr(p, "__hash__", None) is not None else name
            super().__setitem__(key, state[name])
        self._stale = False

    def extra(self):
        """The entries that are no parameter's (without reading the engine)."""
        own = {id(p) if getattr(p, "__hash__", None) is not None else name
               for name, p, _ in self._opt._params}
        return {k: v for k, v in super().items()
                if (id(k) if not isinstance(k, str) else k) not in own}

    def replace_extra(self, entries):
        """The other keys become `entries` (load_state_dict's, as torch loads them)."""
        for key in self.extra():
            super().__delitem__(key)
        super().update(entries)

    def _key(self, key):
        if isinstance(key, str):
            for name, p, _ in self._opt._params:
                if name == key:
                    return p if getattr(p, "__hash__", None) is not None else name
            return key
        name = self._opt._name_of.get(id(key))
        if name is not None and getattr(key, "__hash__", None) is None:
            return name
        return key

    def __getitem__(self, key):
        self._refresh()
        return super().__getitem__(self._key(key))

    def __contains__(self, key):
        self._refresh()
        try:
            return super().__contains__(self._key(key))
        except KeyError:
            return False

    def get(self, key, default=None):
        return self[key] if key in self else default

    def __iter__(self):
        self._refresh()
        return super().__iter__()

    def __len__(self):
        self._refresh()
        return super().__len__()

    def keys(self):
        self._refresh()
        return super().keys()

    def values(self):
        self._refresh()
        return super().values()

    def items(self):
        self._refresh()
        return super().items()

    def __repr__(self):
        self._refresh()
        return super().__repr__()


def _indices(opt):
    """id(tensor) -> its index as torch numbers them: by first appearance in param_groups (a
    group listed twice is packed as the first)."""
    out = {}
    for g in opt.param_groups:
        for p in g["params"]:
            out.setdefault(id(p), len(out))
    return out


def _indexed_names(opt):
    """The parameter names in torch's index order."""
    named = {id(p): opt._name_of[id(p)] for g in opt.param_groups for p in g["params"]}
    return [named[i] for i in _indices(opt)]


def _group_entries(opt):
    index, out = _indices(opt), []
    for g in opt.param_groups:
        entry = {k: v for k, v in g.items() if k != "params"}
        entry["params"] = [index[id(p)] for p in g["params"]]
        out.append(entry)
    return out


def state_dict(opt):
    """torch's shape: {"state": {index: {name: tensor}}, "param_groups": [{..., "params":
    [indices], "param_names": [...], "zmuon": {the step, the AdamW step count, the loss
    scaler}}]}, plus "zmuon": {"masters": each parameter's fp32 master by index}. The step and
    scaler ride in every group, so that torch.distributed.checkpoint (which keeps "state" and
    "param_groups" only) carries them. Whole tensors: in a multi-process job a collective (every
    process calls it and gets the same dict); under FSDP2 this process's DTensor shards, no
    collective, but for NorMuon's row moments, read whole from their owners (a collective)."""
    scope = _capi.STATE_LOCAL if opt._mode == "fsdp" else _capi.STATE_FULL
    state, masters, info = _read(opt, scope, with_master=True, whole_rows=True)
    names = _indexed_names(opt)
    counters = {"step": int(info["step"]),
                "adam_steps": int(info["adam_steps"]),
                "loss_scaler": {"scale": float(info["loss_scale"]),
                                "iter": int(info["scaler_iter"]),
                                "last_overflow_iter": int(info["scaler_last_overflow_iter"]),
                                "hysteresis_left": int(info["scaler_hysteresis_left"])}}
    groups = _group_entries(opt)
    for g in groups:
        g["zmuon"] = dict(counters, loss_scaler=dict(counters["loss_scaler"]))
    for name, b in opt._bindings.items():  # DCP keeps "state": the masters ride there
        if b.low_precision:
            state[name][MASTER] = masters[name]
    packed = {i: state[n] for i, n in enumerate(names) if n in state}
    packed.update(opt.state.extra())  # other keys as they are, as torch packs them
    return {
        "state": packed,
        "param_groups": groups,
        "zmuon": {"masters": {i: masters[n] for i, n in enumerate(names) if n in masters}},
    }


def _host_float32(value, shape, what):
    """`value` (a torch tensor or numpy array) as a contiguous float32 host buffer of `shape`,
    or a ShapeMismatch / InvalidArgument naming `what`."""
    value = _whole(value)
    if is_torch(value):
        got = tuple(value.shape)
        if got != tuple(shape):
            raise ShapeMismatch(f"load_state_dict: {what} has shape {got}, the parameter's is "
                                f"{tuple(shape)}")
        return value.detach().to("cpu", dtype=_torch().float32).contiguous()
    if not hasattr(value, "__array_interface__"):
        raise InvalidArgument(f"load_state_dict: {what} is a {type(value).__name__}, not a "
                              "tensor")
    np = _numpy()
    arr = np.ascontiguousarray(value, dtype=np.float32)
    if tuple(arr.shape) != tuple(shape):
        raise ShapeMismatch(f"load_state_dict: {what} has shape {tuple(arr.shape)}, the "
                            f"parameter's is {tuple(shape)}")
    return arr


def _local_float32(value, p, shape, lo, hi, what):
    """Elements [lo, hi) of the flattened `value` (a DTensor, placed as FSDP2 parameter `p`
    after a redistribute if need be, or a whole tensor) as a contiguous float32 host buffer."""
    torch = _torch()
    if type(value).__name__ == "DTensor":
        if tuple(value.shape) != tuple(shape):
            raise ShapeMismatch(f"load_state_dict: {what} has shape {tuple(value.shape)}, the "
                                f"parameter's is {tuple(shape)}")
        if tuple(value.placements) != tuple(p.placements) or value.device_mesh != p.device_mesh:
            value = value.redistribute(p.device_mesh, p.placements)
        rows = value.to_local().detach().to("cpu", dtype=torch.float32).reshape(-1)
        if rows.numel() != hi - lo:
            raise ShapeMismatch(f"load_state_dict: {what} holds {rows.numel()} elements here, "
                                f"this process's shard {hi - lo}")
        return rows.contiguous()
    whole = _host_float32(value, shape, what)
    return whole.reshape(-1)[lo:hi].contiguous() if is_torch(whole) \
        else _numpy().ascontiguousarray(whole.reshape(-1)[lo:hi])


def _mesh_float32(opt, value, p, name, what):
    """This rank's engine rows of DTensor `value` (placed as parameter `p` after a
    redistribute if need be), moved from every process's pieces (a collective)."""
    if tuple(value.shape) != tuple(p.shape):
        raise ShapeMismatch(f"load_state_dict: {what} has shape {tuple(value.shape)}, the "
                            f"parameter's is {tuple(p.shape)}")
    if tuple(value.placements) != tuple(p.placements) or value.device_mesh != p.device_mesh:
        value = value.redistribute(p.device_mesh, p.placements)
    rows = opt._mesh.to_engine({name: value.to_local()})[name]
    return rows.detach().to("cpu", dtype=_torch().float32).contiguous()


def _count(value, what, low=0):
    """A step count (an int, or a scalar tensor / array as torch keeps it) as an int."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or value != int(value) or value < low:
        raise InvalidArgument(f"load_state_dict: {what} must be a whole number >= {low}, got "
                              f"{value!r}")
    return int(value)


def _need(mapping, key, where):
    if not isinstance(mapping, dict) or key not in mapping:
        raise InvalidArgument(f"load_state_dict: {where} has no {key!r} (not a zmuon.Muon "
                              "state_dict)")
    return mapping[key]


def load_state_dict(opt, sd):
    """Checks everything, then loads it into the engine (and the parameters, from the masters;
    without them the parameters' current values are the masters) and the groups'
    hyperparameters. A bad dict raises naming what is wrong, and changes nothing."""
    if isinstance(sd, dict) and "zmuon_checkpoint" in sd and "zmuon" not in sd:
        raise InvalidArgument("load_state_dict: a state_dict of an older zmuon, which packed a "
                              "checkpoint's files: load those with load_checkpoint(dir)")
    saved_state = _need(sd, "state", "the state_dict")
    groups = _need(sd, "param_groups", "the state_dict")
    # The counters: in every group (torch.distributed.checkpoint keeps groups), or in "zmuon".
    extra = dict(sd.get("zmuon") or {})
    if isinstance(groups, list) and groups and isinstance(groups[0], dict) \
            and "zmuon" in groups[0]:
        extra = dict(groups[0]["zmuon"], **extra)
    for key in ("step", "adam_steps", "loss_scaler"):
        _need(extra, key, "the state_dict's param_groups[0]['zmuon']")
    if not isinstance(saved_state, dict):
        raise InvalidArgument("load_state_dict: 'state' must be a dict index -> state")
    if not isinstance(groups, list) or len(groups) != len(opt.param_groups):
        raise InvalidArgument(f"load_state_dict: 'param_groups' must list "
                              f"{len(opt.param_groups)} groups, got {groups!r}")
    for i, (g, mine) in enumerate(zip(groups, opt.param_groups)):
        where = f"param_groups[{i}]"
        learning_rate(g.get("lr") if isinstance(g, dict) else None, f"load_state_dict: {where}['lr']")
        indices = _need(g, "params", where)
        if not isinstance(indices, list) or len(indices) != len(mine["params"]):
            raise InvalidArgument(f"load_state_dict: {where} has {len(indices) if isinstance(indices, list) else indices!r} "
                                  f"params, this optimizer's {len(mine['params'])}")
        if not _names_agree(g.get("param_names"), _engine_names(opt, mine)):
            raise InvalidArgument(f"load_state_dict: {where}['param_names'] is "
                                  f"{list(g['param_names'])}, this optimizer's "
                                  f"{list(mine['param_names'])}")
    masters = extra.get("masters") if isinstance(extra, dict) else None
    if masters is not None and not isinstance(masters, dict):
        raise InvalidArgument("load_state_dict: zmuon['masters'] must be a dict index -> tensor")

    # Each parameter's saved index, as torch maps them: by position in the groups.
    names, shapes = _indexed_names(opt), opt._shapes
    # Under FSDP2 each process loads its own elements: no whole tensor is gathered.
    local, param_of = {}, {n: p for n, p, _ in opt._params}
    if opt._mode == "fsdp":
        for n in names:
            offset, numel = _capi.state_range(opt._engine, n, _capi.STATE_LOCAL)
            local[n] = (offset, offset + numel)

    def load(value, name, what):
        if opt._mode != "fsdp":
            return _host_float32(value, shapes[name], what)
        if opt._mesh is not None and type(value).__name__ == "DTensor":
            return _mesh_float32(opt, value, param_of[name], name, what)
        if opt._mesh is not None:  # a whole tensor: its experts in the engine's order
            value = opt._mesh.in_engine_order(name, _host_float32(value, shapes[name], what))
        return _local_float32(value, param_of[name], shapes[name], *local[name], what)

    saved_index = [i for g in groups for i in g["params"]]
    entries, keep, row_entries = [], [], []
    for name, index in zip(names, saved_index):
        if name in opt._params_outside:  # zero-size: no state to load
            continue
        where = f"state[{index!r}] (parameter '{name}')"
        entry = saved_state.get(index)
        if entry is None:
            raise InvalidArgument(f"load_state_dict: 'state' has no entry {index!r} for "
                                  f"parameter '{name}'")
        muon = opt._engine.uses_muon(name)
        pointers, adam_step = {}, 0
        for engine_name, torch_name in (MUON_NAMES if muon else ADAMW_NAMES).items():
            buf = load(_need(entry, torch_name, where), name, f"{where}[{torch_name!r}]")
            keep.append(buf)
            pointers[engine_name] = _pointer(buf)
        if not muon:
            adam_step = _count(_need(entry, "step", where), f"{where}['step']")
        if muon and ROW_MOMENTS in entry:
            rows, rows_shape = _row_moments_shape(opt, name, shapes[name])
            buf = _host_float32(entry[ROW_MOMENTS], rows_shape, f"{where}[{ROW_MOMENTS!r}]")
            if opt._mesh is not None:
                buf = opt._mesh.in_engine_order(name, buf, moments=True)
            keep.append(buf)
            row_entries.append((name, rows, _pointer(buf)))
        if MASTER in entry:
            buf = load(entry[MASTER], name, f"{where}[{MASTER!r}]")
        elif masters is not None:
            buf = load(_need(masters, index, "zmuon['masters']"), name,
                       f"zmuon['masters'][{index!r}]")
        else:
            buf = load(_current(opt, name), name, f"parameter '{name}'")
        keep.append(buf)
        pointers["param"] = _pointer(buf)
        if opt._mode == "fsdp":  # this process's elements only
            lo, hi = local[name]
            entries.append((name, hi - lo, pointers, adam_step, lo))
        else:
            entries.append((name, math.prod(shapes[name]), pointers, adam_step))
    scaler = _need(extra, "loss_scaler", "zmuon")
    info = {"step": _count(_need(extra, "step", "zmuon"), "zmuon['step']"),
            "adam_steps": _count(_need(extra, "adam_steps", "zmuon"), "zmuon['adam_steps']")}
    for key in SCALER_KEYS:
        _need(scaler, key, "zmuon['loss_scaler']")
    info.update(loss_scale=float(scaler["scale"]),
                scaler_iter=_count(scaler["iter"], "zmuon['loss_scaler']['iter']"),
                scaler_last_overflow_iter=_count(scaler["last_overflow_iter"],
                                                 "zmuon['loss_scaler']['last_overflow_iter']",
                                                 low=-1),
                scaler_hysteresis_left=_count(scaler["hysteresis_left"],
                                              "zmuon['loss_scaler']['hysteresis_left']", low=1))
    # checks again, all before it changes anything
    _capi.write_state_rows(opt._engine, entries, info, row_entries)
    del keep
    opt.state.invalidate()
    opt.state.replace_extra({k: v for k, v in saved_state.items() if k not in saved_index})
    opt._rounding.begin(info["step"])
    opt._write_back()
    for i, (g, saved) in enumerate(zip(opt.param_groups, groups)):
        _adopt_names(g, saved.get("param_names"))
        # Every saved key, as torch keeps them (a scheduler's own too); the algorithm stays.
        for key, value in saved.items():
            if key not in ("params", "param_names", "zmuon", "use_muon", "algorithm"):
                g[key] = value
        if g.get("use_muon") and "momentum" in g and "betas" in g:
            g["betas"] = (g["momentum"],) + tuple(g["betas"])[1:]
            opt._momentum_seen[i] = g["momentum"]


def _engine_names(opt, group):
    return [opt._name_of[id(p)] for p in group["params"]]


def _names_agree(saved, mine):
    """Whether saved param_names fit this group's: each pair equal, or one of them made up for
    an unnamed tensor (torch loads by position; zmuon checks the names it was given)."""
    if saved is None:
        return True
    saved = list(saved)
    return len(saved) == len(mine) and all(
        a == b or is_made_up(a) or is_made_up(b) for a, b in zip(saved, mine))


def _adopt_names(group, saved):
    """A saved name is shown where this optimizer had made one up (torch.optim keeps the loaded
    param_names); the engine keeps its own."""
    if saved is None:
        return
    group["param_names"] = [theirs if is_made_up(mine) else mine
                            for mine, theirs in zip(group["param_names"], list(saved))]


def _current(opt, name):
    """Parameter `name`'s current values: FSDP2's DTensor, else fp32 on the host."""
    b = opt._bindings[name]
    return b.param.detach() if opt._mode == "fsdp" else b.host_values()


def snapshot(opt):
    """Everything the engine holds, by parameter name, for a restart with more parameters:
    whole tensors (in a multi-process job a collective), under FSDP2 this process's rows."""
    return _read(opt, _capi.STATE_LOCAL if opt._mode == "fsdp" else _capi.STATE_FULL,
                 with_master=True, whole_rows=True)


def _zeros(numel):
    buf = _empty(numel)
    buf[:] = 0
    return buf


def restore(opt, snap):
    """Loads `snap` into a restarted engine: a parameter it lacks starts from its values with
    zero moments and no AdamW steps. Under FSDP2 each process loads its own rows (a shard's
    range does not depend on the other parameters)."""
    state, masters, info = snap
    fsdp = opt._mode == "fsdp"
    entries, keep, row_entries = [], [], []
    for name, p, shape in opt._params:
        lo, hi = 0, math.prod(shape)
        if fsdp:
            offset, numel = _capi.state_range(opt._engine, name, _capi.STATE_LOCAL)
            lo, hi = offset, offset + numel

        def flat(value, what):
            if fsdp:
                return _local_float32(value, p, shape, lo, hi, what)
            return _host_float32(value, shape, what).reshape(-1)

        saved = state.get(name)
        muon = opt._engine.uses_muon(name)
        pointers = {}
        for engine_name, torch_name in (MUON_NAMES if muon else ADAMW_NAMES).items():
            buf = flat(saved[torch_name], torch_name) if saved else _zeros(hi - lo)
            keep.append(buf)
            pointers[engine_name] = _pointer(buf)
        buf = flat(masters[name] if name in masters else _current(opt, name), "master")
        keep.append(buf)
        pointers["param"] = _pointer(buf)
        adam_step = _count(saved["step"], "step") if saved and not muon else 0
        if saved and ROW_MOMENTS in saved:
            rows = saved[ROW_MOMENTS]
            buf = _host_float32(rows, tuple(rows.shape), ROW_MOMENTS)
            if opt._mesh is not None:
                buf = opt._mesh.in_engine_order(name, buf, moments=True)
            buf = buf.reshape(-1)
            keep.append(buf)
            row_entries.append((name, math.prod(tuple(rows.shape)), _pointer(buf)))
        entries.append((name, hi - lo, pointers, adam_step, lo) if fsdp
                       else (name, hi - lo, pointers, adam_step))
    _capi.write_state_rows(opt._engine, entries, info, row_entries)
    del keep
