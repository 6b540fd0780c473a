"""zmuon.Muon: the zmuon engine in the shape of a torch.optim optimizer.

    opt = zmuon.Muon(model.named_parameters(), {"optimizer": {"params": {"lr": 0.02}}})
    for batch in data:
        opt.zero_grad()
        loss_fn(model(batch)).backward()
        opt.step()                 # hands over p.grad, steps, writes the new values into p

With gradient accumulation, hand over each micro-batch's gradients with `opt.accumulate()` after
its backward pass (then zero the grads); `opt.step()` then steps on their mean.

Parameters are float32 and contiguous: numpy arrays (gradients then come in through
`accumulate(grads=...)`) or PyTorch tensors, both by data pointer (PyTorch is not imported).
CUDA tensors go to the engine as device pointers (the cuda compute backend reads and writes them
on the GPU). Their gradients are handed over stream-ordered: the engine reads them after the work
queued on PyTorch's current stream, and that stream's later work waits for the reads (under the
nccl comm nothing waits for the GPU; the caf comm copies them to host memory, which waits for
that work). The new values are written back the same way: after PyTorch's queued work, before
its next (one rank in the process; otherwise after torch.cuda.synchronize()). A backend without
device buffers (host) raises zmuon.Unsupported, unless
`host_staging=True` copies them through host memory. With `"zmuon": {"backend": "cuda"}` and a
GPU for each rank the comm is nccl unless the config says otherwise (`zmuon.comm`, default
auto); the caf comm moves the gradients and the Muon phase through host memory, which costs
far more than the step (a GPT-2-sized model on one H200: 1.2-1.3 s a step against 35 ms).
Inside a CUDA graph capture the hand-over is refused (zmuon.InvalidArgument).
"""

import difflib
import json
import math
import numbers
import sys
import os
import tempfile

from . import _capi
from ._capi import HOST, BadState, InvalidArgument, ShapeMismatch, UnknownParameter, Unsupported

_FLOAT32_MAX = 3.4028234663852886e38  # the engine takes learning rates as float32

_GROUPS = {"auto": _capi.GROUP_AUTO, "muon": _capi.GROUP_MUON, "adamw": _capi.GROUP_ADAMW}


def _is_torch(obj):
    return hasattr(obj, "data_ptr") and hasattr(obj, "is_cuda")


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def _synchronize_torch(tensors):
    """Waits for PyTorch's queued CUDA work when any of `tensors` is a torch CUDA tensor (then
    torch is imported), so that the engine reads finished gradients."""
    torch = sys.modules.get("torch")
    if torch is not None and any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors):
        torch.cuda.synchronize()


def _torch_stream(tensors):
    """PyTorch's current CUDA stream (an int) for the torch CUDA tensors among `tensors`, when
    they all live on one device; else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    devices = {t.device for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda}
    if len(devices) != 1:
        return None
    return torch.cuda.current_stream(devices.pop()).cuda_stream


def buffer_of(obj, what, writable=False):
    """(data pointer, numel, device, shape) of a float32 contiguous numpy array or torch tensor."""
    if _is_torch(obj):
        if str(obj.dtype) != "torch.float32":
            raise TypeError(f"{what}: zmuon takes float32 tensors, got {obj.dtype}")
        if not obj.is_contiguous():
            raise ValueError(f"{what}: the tensor is not contiguous (call .contiguous())")
        device = HOST
        if obj.is_cuda:
            device = obj.device.index if obj.device.index is not None else 0
        elif obj.device.type != "cpu":
            raise TypeError(f"{what}: tensors on '{obj.device.type}' are not supported "
                            "(cpu or cuda)")
        return obj.data_ptr(), obj.numel(), device, tuple(obj.shape)
    ai = getattr(obj, "__array_interface__", None)
    if ai is None:
        raise TypeError(f"{what}: expected a numpy array or a torch tensor, "
                        f"got {type(obj).__name__}")
    if ai["typestr"] != "<f4":
        raise TypeError(f"{what}: zmuon takes float32 arrays, got dtype '{ai['typestr']}'")
    shape = tuple(ai["shape"])
    strides = ai.get("strides")
    if strides is not None and tuple(strides) != _c_strides(shape, 4):
        raise ValueError(f"{what}: the array is not C-contiguous "
                         "(numpy.ascontiguousarray makes it so)")
    ptr, readonly = ai["data"]
    if writable and readonly:
        raise ValueError(f"{what}: the array is read-only")
    numel = 1
    for d in shape:
        numel *= d
    return ptr, numel, HOST, shape


def _hyperparameter(key, value):
    """The override a keyword hyperparameter becomes: optimizer.params.KEY=<value as JSON>."""
    def plain(v):  # numpy and torch scalars
        if hasattr(v, "item"):
            return v.item()
        raise TypeError(f"zmuon.Muon({key}=...): {type(v).__name__} is not a number, bool, "
                        "string or list of those")
    return f"optimizer.params.{key}={json.dumps(value, default=plain)}"


def _learning_rate(value, what):
    """`value` as the float the engine's set_lr takes: a finite number >= 0 (a Python, numpy or
    torch scalar); else InvalidArgument naming `what` and the value."""
    number = value
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            number = value.item()
        except (TypeError, ValueError, RuntimeError):  # not one element
            number = value
    if isinstance(number, numbers.Real) and not isinstance(number, bool):
        lr = float(number)
        if math.isfinite(lr) and lr >= 0:
            if lr > _FLOAT32_MAX:
                raise InvalidArgument(f"{what} must be a finite number >= 0, got {value!r} "
                                      "(beyond float32's range)")
            return lr
    raise InvalidArgument(f"{what} must be a finite number >= 0, got {value!r}")


def _suggestion(name, names):
    """' (did you mean 'x'?)' for the nearest of `names`, or ''."""
    close = difflib.get_close_matches(str(name), [str(n) for n in names], n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _lrs_of(config, overrides):
    """The Muon and AdamW learning rates a config sets (the engine's defaults otherwise)."""
    params = config.get("optimizer", {}).get("params", {}) if isinstance(config, dict) else {}
    muon_lr = params.get("muon_lr", params.get("lr", 0.02))
    adam_lr = params.get("adam_lr", 3e-4)
    for o in overrides:
        key, _, value = o.partition("=")
        if key in ("optimizer.params.lr", "optimizer.params.muon_lr", "muon_lr", "lr"):
            muon_lr = value
        elif key in ("optimizer.params.adam_lr", "adam_lr"):
            adam_lr = value
    try:
        return float(muon_lr), float(adam_lr)
    except (TypeError, ValueError):
        return None, None  # the engine reports the bad value


class Muon:
    """Muon for 2-D hidden matrices and AdamW for the rest (DeepSpeed's default rule: a parameter
    of ndim >= 2 whose name contains neither "embed" nor "lm_head"), run by the zmuon engine.

    params:   (name, tensor) pairs, e.g. model.named_parameters(), or a dict name -> tensor.
    config:   a DeepSpeed-style config: a dict, a path to a JSON file, or None (defaults).
              Unknown or misspelled keys raise zmuon.InvalidArgument naming the key.
    groups:   overrides the default rule: {name: "muon" | "adamw"}, or torch-style groups
              [{"params": [names or tensors], "use_muon": bool}, ...]. A tensor's own `use_muon`
              attribute (as DeepSpeed sets it) is honoured too. A name that is not a parameter
              raises zmuon.UnknownParameter.
    heads:    {name: H}: orthogonalize H row blocks of that matrix independently (q/k/v).
    overrides: "key.path=value" strings applied over the config.
    **hyperparameters: keys of the config's optimizer.params, as torch.optim optimizers take
              them: lr (Muon's; adam_lr AdamW's), momentum, nesterov, weight_decay, betas, eps
              (AdamW's), ns_steps, ns_coefficients, ns_schedule, ns_variant, ns_gram_restart,
              adjust_lr. They apply over the config and `overrides`; an unknown one raises
              zmuon.InvalidArgument naming it and the nearest key.
    ranks:    in-process ranks (default 1, or the config's zmuon.ranks); with more than one,
              hand over every rank's gradients with accumulate(rank=r).
    host_staging: copy CUDA tensors through host memory instead of handing over device pointers.
    nodes, node_rank, master: this process is node `node_rank` of a job of `nodes` processes
              (one per GPU, as torchrun starts them), running `ranks` ranks (default 1); node 0
              publishes the rendezvous at `master` ("HOST:PORT", a port of its host that
              torch.distributed does not use) and the constructor returns once every process
              has joined with the same config and parameters. Each process then hands over its
              own gradients and calls step(), which reduce-scatters them across the processes
              and writes the new values into every process's parameters. Under torchrun:
              nodes=int(os.environ["WORLD_SIZE"]), node_rank=int(os.environ["RANK"]),
              master=f"{os.environ['MASTER_ADDR']}:{int(os.environ['MASTER_PORT']) + 1}".
              save_checkpoint and load_checkpoint are collectives on a directory every process
              sees; state_dict is not available there.
    """

    def __init__(self, params, config=None, *, groups=None, heads=None, overrides=(),
                 ranks=None, host_staging=False, nodes=None, node_rank=None, master=None,
                 **hyperparameters):
        named = list(params.items()) if isinstance(params, dict) else list(params)
        for item in named:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
                raise TypeError("zmuon.Muon needs named parameters: model.named_parameters() or "
                                "(name, tensor) pairs or a dict name -> tensor")
            _capi._text(item[0], "parameter name")  # a NUL would cut the name short in C
        group_of = self._resolve_groups(named, groups)  # checked before the engine starts
        overrides = list(overrides) + [_hyperparameter(k, v) for k, v in hyperparameters.items()]
        config_file = None
        if isinstance(config, (str, os.PathLike)):
            config_file = os.fspath(config)
            _capi._path(config_file, "config file")
            with open(config_file, encoding="utf-8") as f:
                try:
                    config_dict = json.load(f)
                except ValueError:
                    config_dict = {}  # the engine names the JSON error
        elif config is None or isinstance(config, dict):
            config_dict = config or {}
        else:
            raise TypeError(f"config: expected a dict, a path or None, got {type(config).__name__}")
        has_ranks = isinstance(config_dict.get("zmuon"), dict) and "ranks" in config_dict["zmuon"]
        node = None
        if nodes is not None or node_rank is not None or master is not None:
            if nodes is None or node_rank is None or master is None:
                raise InvalidArgument("a process of a multi-process job needs nodes, node_rank "
                                      "and master")
            node = (int(nodes), int(node_rank), int(ranks) if ranks is not None else 1,
                    str(master))
        elif ranks is not None:
            overrides.append(f"zmuon.ranks={int(ranks)}")
        elif not has_ranks:
            overrides.insert(0, "zmuon.ranks=1")
        try:
            if node is not None:
                self._engine = _capi.Engine(json.dumps(config_dict) if config_file is None else "",
                                            overrides, config_file=config_file, node=node)
            elif config_file is not None:
                self._engine = _capi.Engine(overrides=overrides, config_file=config_file)
            else:
                self._engine = _capi.Engine(json.dumps(config_dict), overrides)
        except InvalidArgument as e:  # the engine names a keyword as the override it became
            message = str(e)
            for key, value in hyperparameters.items():
                written = f"--set {_hyperparameter(key, value)}: "
                if message.startswith(written):
                    raise InvalidArgument(f"zmuon.Muon({key}={value!r}): "
                                          f"{message[len(written):]}") from None
            raise

        self._host_staging = host_staging
        self._params = []  # (name, tensor-or-array, shape)
        self._staged = {}  # name -> host copy of a CUDA parameter (host_staging)
        heads = dict(heads or {})
        for name, p in named:
            ptr, numel, device, shape = buffer_of(p, f"parameter '{name}'", writable=True)
            init = p
            if device != HOST:  # registration copies the initial values from host memory
                init = p.detach().to("cpu").contiguous()
                if host_staging:
                    self._staged[name] = init
                ptr, numel, _, _ = buffer_of(init, f"parameter '{name}'")
            self._engine.add_parameter(name, shape, group_of.get(name, _capi.GROUP_AUTO),
                                       int(heads.pop(name, 0)), ptr, numel)
            self._params.append((name, p, shape))
        self._shapes = {name: tuple(shape) for name, _, shape in self._params}
        if heads:
            raise InvalidArgument(f"heads given for {sorted(heads)}, which are not parameters")
        self._node = node
        if node is not None:
            self._engine.start()  # joins the job: blocks until every process is in
        self._first_rank = self._engine.first_rank
        self._micro = [0] * (node[2] if node is not None else self._engine.world)
        muon_lr, adam_lr = _lrs_of(config_dict, overrides)
        self._lrs = (muon_lr, adam_lr)
        uses = {name: self._engine.uses_muon(name) for name, _, _ in self._params}
        self.param_groups = [
            {"params": [p for n, p, _ in self._params if uses[n]],
             "names": [n for n, _, _ in self._params if uses[n]], "lr": muon_lr, "use_muon": True},
            {"params": [p for n, p, _ in self._params if not uses[n]],
             "names": [n for n, _, _ in self._params if not uses[n]], "lr": adam_lr,
             "use_muon": False},
        ]
        self.last_step = None  # the engine's report of the last step (a dict)

    @staticmethod
    def _resolve_groups(named, groups):
        by_id = {id(p): n for n, p in named}
        out = {}
        for name, p in named:  # DeepSpeed marks parameters with `use_muon`
            flag = getattr(p, "use_muon", None)
            if flag is not None:
                out[name] = _capi.GROUP_MUON if flag else _capi.GROUP_ADAMW
        if groups is None:
            return out
        names = [n for n, _ in named]
        known = set(names)

        def known_name(name, where):
            if name not in known:
                raise UnknownParameter(f"{where} names {name!r}, which is not a parameter"
                                       f"{_suggestion(name, names)}")

        if isinstance(groups, dict):
            for name, g in groups.items():
                known_name(name, "groups")
                if not isinstance(g, str) or g not in _GROUPS:
                    raise InvalidArgument(f"group of '{name}' is {g!r}: use 'muon', 'adamw' or "
                                          "'auto'")
                out[name] = _GROUPS[g]
            return out
        if isinstance(groups, (str, bytes)):
            raise InvalidArgument("groups: expected {name: 'muon' | 'adamw' | 'auto'} or a list "
                                  "of {'params': [...], 'use_muon': bool} dicts")
        for i, group in enumerate(groups):
            if not isinstance(group, dict) or "params" not in group or "use_muon" not in group:
                raise InvalidArgument(f"parameter group {i} needs 'params' and 'use_muon'")
            members = group["params"]
            if isinstance(members, (str, bytes)):
                raise InvalidArgument(f"parameter group {i}: 'params' must be a list of names or "
                                      f"tensors, got the string {members!r}")
            for p in members:
                name = p if isinstance(p, str) else by_id.get(id(p))
                if name is None:
                    raise InvalidArgument(f"parameter group {i} holds a tensor that is not among "
                                          "the named parameters")
                known_name(name, f"groups[{i}]")
                out[name] = _capi.GROUP_MUON if group["use_muon"] else _capi.GROUP_ADAMW
        return out

    # -- torch.optim-shaped API ---------------------------------------------------------------

    @property
    def world(self):
        return self._engine.world

    def uses_muon(self, name):
        return self._engine.uses_muon(name)

    def sum_over_processes(self, values):
        """The sums of `values` (numbers, e.g. this process's loss) over the processes of a
        multi-process job: every process calls it, in the same order; in one process, the
        values. No torch.distributed needed for logging the job's loss."""
        return self._engine.sum_over_nodes([float(v) for v in values])

    def loss_scale(self):
        """The scale to multiply the next loss by (1 without fp16)."""
        return self._engine.loss_scale()

    def zero_grad(self, set_to_none=True):
        for _, p, _ in self._params:
            if _is_torch(p) and p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    def accumulate(self, grads=None, rank=None):
        """Hands over one micro-batch's gradients of rank `rank` (default: this process's first
        rank): by default each torch parameter's .grad (None counts as zero); else `grads`, a
        dict name -> array/tensor or a list in the order of the parameters. Each gradient has
        its parameter's shape (else zmuon.ShapeMismatch, and nothing of the call is handed
        over)."""
        if rank is None:
            rank = self._first_rank
        entries, keep = self._entries(grads)
        stream = _torch_stream(keep)
        if stream is None and any(device != HOST for _, _, _, device in entries):
            _synchronize_torch(keep)  # the gradients must be written before the engine reads them
        self._engine.reduce(rank, entries, stream=stream)
        if 0 <= rank - self._first_rank < len(self._micro):
            self._micro[rank - self._first_rank] += 1

    def accumulate_all(self, grads_by_rank):
        """One micro-batch of every rank of this process at once: grads_by_rank[i] is local
        rank i's (as accumulate's `grads`). The ranks hand over on a thread each inside the
        engine, within the bound on reduce buckets in flight (zmuon.max_buckets_in_flight),
        which accumulate() rank after rank cannot keep; every rank's gradients are checked
        before any is handed over."""
        grads_by_rank = list(grads_by_rank)
        entries, keep = [], []
        for i, grads in enumerate(grads_by_rank):
            try:
                e, k = self._entries(grads)
            except _capi.ZmuonError as err:
                raise type(err)(f"accumulate_all(): rank {self._first_rank + i}: {err}") from None
            entries.append(e)
            keep.extend(k)
        if any(device != HOST for e in entries for _, _, _, device in e):
            _synchronize_torch(keep)  # read during the call, after the work that wrote them
        self._engine.reduce_all(entries)
        for i in range(min(len(grads_by_rank), len(self._micro))):
            self._micro[i] += 1

    def _entries(self, grads):
        """accumulate's `grads` as the engine's (name, pointer, numel, device) entries, and the
        objects that must live until the engine has read them."""
        if grads is None:
            missing = [n for n, p, _ in self._params if not _is_torch(p)]
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
        entries, keep = [], []
        for name, g in items:
            if g is None:
                continue
            _capi._text(name, "gradient name")  # a NUL would cut the name short in C
            if _is_torch(g) and (g.is_cuda and self._host_staging):
                g = g.detach().to("cpu").contiguous()
            keep.append(g)
            ptr, numel, device, shape = buffer_of(g, f"gradient of '{name}'")
            expected = self._shapes.get(name)  # an unknown name: the engine's error names it
            if expected is not None and tuple(shape) != expected:
                raise ShapeMismatch(f"gradient of '{name}' has shape {tuple(shape)}, the "
                                    f"parameter's is {expected}")
            entries.append((name, ptr, numel, device))
        return entries, keep

    def step(self, closure=None):
        """One optimizer step on everything handed over since the last one (if nothing was,
        the parameters' current .grad first), then the new values into the parameters. The
        param groups' "lr" must be finite numbers >= 0 (else zmuon.InvalidArgument, before
        anything runs)."""
        lrs = self._group_lrs()  # checked before anything runs or is handed over
        loss = closure() if closure is not None else None
        if not any(self._micro) and all(_is_torch(p) for _, p, _ in self._params) \
                and any(p.grad is not None for _, p, _ in self._params):
            self.accumulate()
        if lrs != self._lrs:
            self._engine.set_lr(float(lrs[0]), float(lrs[1]))
            self._lrs = lrs
        self._micro = [0] * len(self._micro)
        self.last_step = self._engine.step()
        self._write_back()
        return loss

    def _group_lrs(self):
        """The param groups' learning rates as floats; InvalidArgument naming a bad one."""
        lrs = []
        for i in range(2):
            try:
                value = self.param_groups[i]["lr"]
            except (IndexError, KeyError, TypeError):
                raise InvalidArgument(f"param_groups[{i}] has no 'lr' (zmuon.Muon has two "
                                      "param groups: Muon's and AdamW's)") from None
            lrs.append(_learning_rate(value, f"param_groups[{i}]['lr']"))
        return tuple(lrs)

    def _write_back(self):
        entries, targets = [], []
        for name, p, _ in self._params:
            target = self._staged.get(name, p)
            targets.append(target)
            ptr, numel, device, _ = buffer_of(target, f"parameter '{name}'", writable=True)
            entries.append((name, ptr, numel, device))
        # The engine writes device parameters on its own stream, after PyTorch's queued work
        # that may still read them and before PyTorch's next (stream-ordered: no waiting), where
        # this process runs one rank and the parameters share one device; otherwise that work
        # ends first.
        stream = _torch_stream(targets) if len(self._micro) == 1 else None
        if stream is None and any(device != HOST for _, _, _, device in entries):
            _synchronize_torch(targets)
        self._engine.gather_params(entries, stream=stream)
        for name, p, _ in self._params:
            if name in self._staged:
                p.data.copy_(self._staged[name])

    def time_calls(self, on=True):
        """Times every compute-backend call of the following steps (off by default; on CUDA
        two events per call), for write_call_timeline."""
        self._engine.time_calls(on)

    def write_call_timeline(self, path):
        """Writes the calls timed since time_calls (or the last write) as Chrome Trace Event
        JSON, to open in ui.perfetto.dev: a process per rank, a row for the main stream and one
        per Newton-Schulz lane. Raises zmuon.BadState while timing is off."""
        self._engine.write_call_timeline(path)

    def save_checkpoint(self, directory):
        """Saves the optimizer state (parameters, momentum, Adam moments, step, loss scale) as a
        zmuon checkpoint under `directory` (between steps)."""
        self._engine.save_checkpoint(directory)

    def load_checkpoint(self, directory):
        """Restores a checkpoint saved by save_checkpoint (also one saved with another rank
        count) and writes its parameters into the tensors; returns the step it was saved at."""
        step = self._engine.load_checkpoint(directory)
        self._write_back()
        return step

    def state_dict(self):
        """The optimizer state as a picklable dict, for torch.save beside the model's: the files
        of a zmuon checkpoint (parameters, momentum, Adam moments, step, loss scale; every rank's
        shards) read into memory, and each param group's learning rate. Between steps.
        load_state_dict restores it, also into an optimizer with another rank count."""
        if self._node is not None:
            raise Unsupported("state_dict in a multi-process job: use save_checkpoint(dir) on a "
                              "directory every process sees")
        with tempfile.TemporaryDirectory() as tmp:
            self._engine.save_checkpoint(tmp)
            files = {}
            for root, _, names in os.walk(tmp):
                for n in names:
                    path = os.path.join(root, n)
                    with open(path, "rb") as f:
                        files[os.path.relpath(path, tmp)] = f.read()
        return {"zmuon_checkpoint": files, "lrs": [g["lr"] for g in self.param_groups]}

    def load_state_dict(self, state):
        """Restores a state_dict(): the checkpoint's parameters are written into the tensors,
        and the param groups' learning rates are set. A dict that is not one raises
        zmuon.InvalidArgument naming what is wrong; a damaged checkpoint, the engine's error
        (the optimizer is then unchanged)."""
        if self._node is not None:
            raise Unsupported("load_state_dict in a multi-process job: use load_checkpoint(dir) "
                              "on a directory every process sees")
        if not isinstance(state, dict) or not isinstance(state.get("zmuon_checkpoint"), dict):
            raise InvalidArgument("load_state_dict: not a zmuon.Muon state_dict (no "
                                  "'zmuon_checkpoint' dict of checkpoint files)")
        lrs = state.get("lrs")
        if not isinstance(lrs, list) or len(lrs) != len(self.param_groups):
            raise InvalidArgument(f"load_state_dict: 'lrs' must list {len(self.param_groups)} "
                                  f"learning rates, got {lrs!r}")
        for i, lr in enumerate(lrs):  # before anything is loaded
            _learning_rate(lr, f"load_state_dict: 'lrs'[{i}]")
        with tempfile.TemporaryDirectory() as tmp:
            for rel, data in state["zmuon_checkpoint"].items():
                parts = os.path.normpath(str(rel)).split(os.sep)
                if os.path.isabs(str(rel)) or ".." in parts or parts == ["."] \
                        or "\0" in str(rel) or not isinstance(data, bytes):
                    raise InvalidArgument(f"load_state_dict: checkpoint file {rel!r} is not a "
                                          "relative path inside the checkpoint with bytes")
                path = os.path.join(tmp, *parts)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
            self._engine.load_checkpoint(tmp)
        self._write_back()
        for g, lr in zip(self.param_groups, lrs):
            g["lr"] = lr

    def close(self):
        """Stops the engine (also done when the optimizer is garbage collected)."""
        self._engine.close()

    def __repr__(self):
        muon = len(self.param_groups[0]["params"])
        adam = len(self.param_groups[1]["params"])
        return f"zmuon.Muon(muon: {muon} parameters, adamw: {adam} parameters, ranks: {self.world})"
