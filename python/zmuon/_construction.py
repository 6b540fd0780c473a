"""zmuon.Muon's construction: the config, the engine it makes (its backend from the tensors'
device), and the parameters registered with it (with their Muon blocks and MuonClip pairs)."""

import json
import os

from . import _capi, _distributed, _groups, _host, _mesh, _state
from ._buffers import buffer_of
from ._capi import HOST, InvalidArgument, UnknownParameter
from ._groups import hyperparameter_override
from ._param_sync import Binding, _is_tensor, local_of

# The dtypes a torch parameter may have: fp32 in place, the others through fp32 masters.
TRAINED_DTYPES = ("torch.float32", "torch.bfloat16", "torch.float16")


def read_config(config):
    """(the config as a dict, its file or None) from a dict, a path to JSON or None."""
    if isinstance(config, (str, os.PathLike)):
        config_file = os.fspath(config)
        _capi._path(config_file, "config file")
        with open(config_file, encoding="utf-8") as f:
            try:
                return json.load(f), config_file
            except ValueError:
                return {}, config_file  # the engine names the JSON error
    if config is None or isinstance(config, dict):
        return config or {}, None
    raise TypeError(f"config: expected a dict, a path or None, got {type(config).__name__}")


def explicit_gas(config_dict, overrides):
    """gradient_accumulation_steps where the config or an override sets it, else None."""
    gas = config_dict.get("gradient_accumulation_steps") if isinstance(config_dict, dict) \
        else None
    for o in overrides:
        key, _, value = o.partition("=")
        if key == "gradient_accumulation_steps":
            gas = value
    try:
        return int(gas) if gas is not None else None
    except (TypeError, ValueError):
        return None


def rows_in_blocks(heads, split_sizes, qk_clip):
    """The names of zmuon.Muon's arguments whose rows form blocks in their order: heads,
    split_sizes, and MuonClip's queries and keys (a name, or (key, query_heads, key_heads))."""
    names = set(heads or ()) | set(split_sizes or ())
    for query, spec in dict(qk_clip or {}).items():
        key = spec if isinstance(spec, str) else \
            spec[0] if isinstance(spec, (tuple, list)) and spec else None  # else refused later
        names |= {query, key}
    return names


def tensor_devices(named):
    """{device: the first parameter's name on it} of the parameters' local torch tensors."""
    first = {}
    for name, p in named:
        local = local_of(p)
        if _is_tensor(local):
            first.setdefault(str(local.device), name)
    return first


def device_overrides(first, config_dict, overrides, host_staging):
    """The engine's backend and GPU from the tensors' device (`first`: tensor_devices' dict):
    "zmuon.backend=cuda" where they are CUDA tensors and nothing names a backend, and
    "zmuon.device=N" for cuda:N unless the config names a device. Parameters on more than one
    device are refused, naming two of them."""
    if len(first) > 1:
        (d1, n1), (d2, n2) = list(first.items())[:2]
        raise InvalidArgument(f"parameters on more than one device: '{n1}' on {d1}, '{n2}' on "
                              f"{d2}: zmuon steps the parameters of one device per process")
    device = next(iter(first), "cpu")
    if not device.startswith("cuda"):
        return []
    section = config_dict.get("zmuon") if isinstance(config_dict.get("zmuon"), dict) else {}

    def named(key):
        return key in section or any(o.startswith(f"zmuon.{key}=") for o in overrides)

    out = []
    if not named("backend") and not host_staging:
        out.append("zmuon.backend=cuda")
    given = [o.partition("=")[2] for o in overrides if o.startswith("zmuon.backend=")]
    on_cuda = out or (given[-1] if given else section.get("backend")) == "cuda"
    index = int(device.partition(":")[2] or 0)
    if on_cuda and index and not named("device"):
        out.append(f"zmuon.device={index}")
    return out


class Construction:
    """zmuon.Muon's half that makes the engine and registers the parameters."""

    def _engine_overrides(self, overrides, hyperparameters, named, config_dict, host_staging):
        """The overrides the engine is made with: the caller's, FSDP2's layout, the keyword
        hyperparameters and the backend of the tensors' device."""
        out = list(overrides)
        if self._mode == _distributed.FSDP and (self._mesh is None or self._mesh.identity):
            out.append("zmuon.shard_layout=rows")  # the plan cuts the parameters as FSDP2 does
        out += [hyperparameter_override(k, v) for k, v in hyperparameters.items()]
        return out + device_overrides(tensor_devices(named), config_dict, out, host_staging)

    def _register_all(self, named, heads, split_sizes, views, qk_clip):
        """Every parameter with its heads, then the Muon blocks and the MuonClip pairs."""
        self._heads = dict(heads or {})
        all_heads = dict(self._heads)
        # Per-block heads (a list) go with split_sizes, not to add_parameter.
        block_heads = {n: list(h) for n, h in self._heads.items()
                       if isinstance(h, (list, tuple))}
        for n in block_heads:
            del self._heads[n]
        self._int_heads = dict(self._heads)  # a restart registers them again
        self._params = []       # (name, tensor or array, shape), in registration order
        self._bindings = {}     # name -> _param_sync.Binding: what the engine reads and writes
        self._params_outside = {}  # name -> zero-size parameter: nothing to step
        self._shapes = {}       # name -> shape
        self._name_of = {}      # id(tensor) -> name
        self._started = False   # the engine's table is fixed once it runs
        for name, p in named:
            self._register(name, p)
        if self._heads:
            raise InvalidArgument(f"heads given for {sorted(self._heads)}, which are not "
                                  "parameters")
        self._blocks = (split_sizes, block_heads, views)
        self._register_blocks(split_sizes, block_heads, views)
        self._qk_clip = (qk_clip, all_heads)
        self._qk_heads = self._register_qk_clip(qk_clip, all_heads)

    def _defaults(self, config_dict, overrides, ns_eps):
        """opt.defaults: the config's and the keywords' values, with the rates the engine
        resolved (DeepSpeed's lr rule, "auto", the scheduler's first rate)."""
        defaults = _groups.defaults_of(config_dict, overrides)
        defaults["ns_eps"] = ns_eps
        for key, lr in zip(("lr", "adam_lr"), _capi.engine_next_lrs(self._engine)):
            if abs(lr - defaults[key]) > 1e-6 * abs(defaults[key]):
                defaults[key] = lr
        return defaults

    def _start(self, config_dict, on_metrics):
        """The metrics and the config's schedule; a node joins its job; FSDP2's shards go in;
        the parameters' marks are taken."""
        self._schedule = None  # the config's scheduler, shown in param_groups
        if self._host_engine:
            _host.forward_metrics(self._engine, _host.metrics_sinks(config_dict, on_metrics))
            if "scheduler" in config_dict:
                self._schedule = _host.ScheduleView(self._engine)
                self._schedule.show(self.param_groups)
        if self._node is not None:  # the hyperparameter groups are part of the table
            self._engine.start()  # joins the job: blocks until every process is in
            self._started = True
        self._first_rank = self._engine.first_rank
        if self._mode == _distributed.FSDP:  # each process's local tensors: no whole parameter
            _mesh.check_rank(self._first_rank, self._mesh)
            self._load_local_shards()
            self._started = True
        self._mark_in_step()

    def _create_engine(self, config_dict, config_file, overrides, hyperparameters, ranks,
                       nodes, node_rank, master, on_metrics):
        has_ranks = isinstance(config_dict.get("zmuon"), dict) and "ranks" in config_dict["zmuon"]
        self._node = None
        if nodes is not None or node_rank is not None or master is not None:
            if nodes is None or node_rank is None or master is None:
                raise InvalidArgument("a process of a multi-process job needs nodes, node_rank "
                                      "and master")
            self._node = (int(nodes), int(node_rank), int(ranks) if ranks is not None else 1,
                          str(master))
        elif ranks is not None:
            overrides.append(f"zmuon.ranks={int(ranks)}")
        elif not has_ranks:
            overrides.insert(0, "zmuon.ranks=1")
        self._host_engine = self._node is None and _host.needs_host(config_dict, on_metrics)
        try:
            if self._host_engine:
                engine = _capi.engine_with_host(json.dumps(config_dict), overrides,
                                                _host.host_values(hyperparameters))
            elif self._node is not None:
                engine = _capi.Engine(json.dumps(config_dict) if config_file is None else "",
                                      overrides, config_file=config_file, node=self._node)
            elif config_file is not None:
                engine = _capi.Engine(overrides=overrides, config_file=config_file)
            else:
                engine = _capi.Engine(json.dumps(config_dict), overrides)
            if self._mesh is not None:
                engine.rank_note = self._mesh.rank_note()
            return engine
        except InvalidArgument as e:  # the engine names a keyword as the override it became
            message = str(e)
            for key, value in hyperparameters.items():
                written = f"--set {hyperparameter_override(key, value)}: "
                if message.startswith(written):
                    raise InvalidArgument(f"zmuon.Muon({key}={value!r}): "
                                          f"{message[len(written):]}") from None
            raise

    def _register(self, name, p):
        """Registers parameter `name` with its values; a zero-size one stays out of the
        engine (nothing to step)."""
        if name in self._shapes:
            raise _capi.DuplicateParameter(f"parameter '{name}' is registered twice")
        local = local_of(p)
        if _is_tensor(local):
            if str(local.dtype) not in TRAINED_DTYPES:
                raise TypeError(f"parameter '{name}': zmuon trains float32, bfloat16 and "
                                f"float16 tensors (fp32 masters), got {local.dtype}")
            if p.numel() == 0:
                self._params_outside[name] = p
                self._shapes[name] = tuple(p.shape)
                self._name_of[id(p)] = name
                return
        binding = Binding(name, p, self._host_staging)
        shape = binding.shape
        keep = binding.buffer
        if self._mode == _distributed.FSDP:  # registered without values, loaded per shard
            buffer_of(keep, f"parameter '{name}'", writable=True)
            ptr, numel = None, 0
        else:
            ptr, numel, device, _ = buffer_of(keep, f"parameter '{name}'", writable=True)
            if device != HOST:  # registration copies the initial values from host memory
                keep = keep.detach().to("cpu").contiguous()
                ptr, numel, _, _ = buffer_of(keep, f"parameter '{name}'")
        self._engine.add_parameter(name, shape or (1,), self._group_of.get(name, _capi.GROUP_AUTO),
                                   int(self._heads.pop(name, 0)), ptr, numel)
        del keep
        self._params.append((name, p, shape))
        self._bindings[name] = binding
        self._shapes[name] = shape
        self._name_of[id(p)] = name
        self._mark_in_step([binding])  # the engine holds its values now

    def _register_blocks(self, split_sizes, block_heads, views):
        """Muon's blocks: split_sizes with per-block heads, and matrix views."""
        split_sizes, views = dict(split_sizes or {}), dict(views or {})
        self._matrix_views = views  # NorMuon's row moments follow the matrix view
        for name in list(block_heads) + list(split_sizes) + list(views):
            if name not in self._shapes:
                raise UnknownParameter(f"split_sizes, heads or views name {name!r}, which is "
                                       f"not a parameter{_groups.suggestion(name, self._shapes)}")
        for name in list(block_heads):
            if name not in split_sizes:
                raise InvalidArgument(f"heads of '{name}' is a list: that needs split_sizes "
                                      f"for '{name}'")
        for name in set(split_sizes) | set(views):
            sizes = [int(x) for x in split_sizes.get(name, ())]
            self._engine.set_muon_blocks(name, sizes, block_heads.get(name),
                                         views.get(name, "auto"))
        for name, boxes in (self._mesh.boxes if self._mesh is not None else {}).items():
            self._engine.set_box_order(name, boxes)  # a matrix held in rectangles (_mesh)

    def _register_qk_clip(self, qk_clip, heads):
        """MuonClip pairs: {query: key} (heads from `heads`) or {query: (key, hq, hk)}."""
        out = {}
        for query, spec in dict(qk_clip or {}).items():
            if isinstance(spec, str):
                key = spec
                if not isinstance(heads.get(query), int) or not isinstance(heads.get(key), int):
                    raise InvalidArgument(f"qk_clip pair '{query}' -> '{key}': give both head "
                                          f"counts in heads=, or ('{key}', query_heads, "
                                          "key_heads)")
                hq, hk = heads[query], heads[key]
            else:
                try:
                    key, hq, hk = spec
                except (TypeError, ValueError):
                    raise InvalidArgument(f"qk_clip of '{query}': expected a key name or (key, "
                                          f"query_heads, key_heads), got {spec!r}") from None
            self._engine.add_qk_clip(query, key, int(hq), int(hk))
            out[query] = int(hq)
        return out

    def _load_local_shards(self):
        """DTensors: each process's local tensors into its rank (no whole parameter anywhere),
        moved to the engine's shards first where they are placed otherwise."""
        if self._mesh is not None:
            self._load_mesh_shards()
            return
        entries, keep = [], []
        for b in self._bindings.values():
            values = b.host_values()
            keep.append(values)
            entries.append((b.name, *buffer_of(values, f"parameter '{b.name}'")[:3]))
        self._engine.load_shard_params(self._first_rank, entries)

    def _restart_engine(self, new):
        """add_param_group once the engine runs: a new engine with the old parameters and
        `new`, carrying the masters, moments, step counts and loss scaler over (the new ones
        start from their values with zero state). Between steps. In a job of torch.distributed
        processes every process adds the same group (a collective): the job ends, and meets
        again at a new rendezvous."""
        multi = self._node is not None
        if multi and not _distributed.joined_process_group():
            raise _capi.BadState(f"add_param_group: '{new[0][0]}' is new, and a job started with "
                                 "nodes= has no process group to meet again in: add every group "
                                 "before the first step")
        if any(self._micro):
            raise _capi.BadState("add_param_group with new parameters between accumulate() and "
                                 "step(): add them after step()")
        snapshot = _state.snapshot(self)
        old = [(n, p) for n, p, _ in self._params] + list(self._params_outside.items())
        group_index = {self._name_of[id(p)]: i for i, g in enumerate(self.param_groups)
                       for p in g["params"]}
        job = (None, None, None)
        if multi:
            self._engine.sum_over_nodes([0.0])  # every process holds its snapshot
            self._engine.close()  # the old job ends in every process before the new one meets
            job = _distributed.node_from_process_group(
                self._mesh.engine_of if self._mesh is not None else None)
        config_dict, config_file, overrides, hyperparameters, ranks, on_metrics = self._setup
        engine = self._create_engine(config_dict, config_file, list(overrides), hyperparameters,
                                     ranks, *job, on_metrics)
        retired, self._engine = self._engine, engine
        self._params, self._bindings, self._params_outside = [], {}, {}
        self._shapes, self._name_of = {}, {}
        self._heads = dict(self._int_heads)
        try:
            for name, p in old + list(new):
                self._register(name, p)
            self._register_blocks(*self._blocks)
            self._register_qk_clip(*self._qk_clip)
            for name, _ in old + list(new):
                if name not in self._params_outside:
                    self._engine.set_hparam_group(name, group_index.get(name,
                                                                        len(self.param_groups)))
            if self._host_engine:
                _host.forward_metrics(engine, _host.metrics_sinks(config_dict, on_metrics))
                if self._schedule is not None:
                    self._schedule = _host.ScheduleView(engine)
            if multi:
                engine.start()  # joins the new job
                self._first_rank = engine.first_rank
            if self._mode == _distributed.FSDP:
                self._load_local_shards()
            _state.restore(self, snapshot)
        except Exception:
            engine.close()
            raise
        retired.close()
        self._applied = []
        self.state.invalidate()
        self._write_back()
