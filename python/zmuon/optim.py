"""zmuon.Muon: the zmuon engine as a torch.optim.Optimizer (a plain class without PyTorch).

    opt = zmuon.Muon(model.named_parameters(), {"optimizer": {"params": {"lr": 0.02}}})
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    for batch in data:
        opt.zero_grad()
        loss_fn(model(batch)).backward()
        opt.step()                 # hands over p.grad, steps, writes the new values into p
        sched.step()

docs/PYTORCH.md is the user's guide: param groups and their keys, the step report, state_dict,
gradient hand-over during backward, GradScaler, Lightning and HF Trainer.

With gradient accumulation, hand over each micro-batch's gradients with `opt.accumulate()` after
its backward pass (then zero the grads); `opt.step()` then steps on their mean.

Parameters are float32 and contiguous: numpy arrays (gradients then come in through
`accumulate(grads=...)`) or PyTorch tensors, both by data pointer. CUDA tensors go to the engine
as device pointers (the cuda compute backend reads and writes them on the GPU). Their gradients
are handed over stream-ordered: the engine reads them after the work queued on PyTorch's current
stream, and that stream's later work waits for the reads (under the nccl comm nothing waits for
the GPU; the caf comm copies them to host memory, which waits for that work). The new values are
written back the same way: after PyTorch's queued work, before its next (one rank in the
process; otherwise after torch.cuda.synchronize()). A backend without device buffers (host)
raises zmuon.Unsupported, unless `host_staging=True` copies them through host memory. With
`"zmuon": {"backend": "cuda"}` and a GPU for each rank the comm is nccl unless the config says
otherwise (`zmuon.comm`, default auto). Inside a CUDA graph capture the hand-over is refused
(zmuon.InvalidArgument).
"""

import json
import math
import os

from . import _capi, _distributed, _groups, _host, _state
from ._buffers import buffer_of, is_torch, synchronize_torch, torch_stream
from ._capi import HOST, BadState, InvalidArgument, ShapeMismatch, UnknownParameter, Unsupported
from ._groups import hyperparameter_override, learning_rate

try:
    import torch
    _Optimizer = torch.optim.Optimizer
except ImportError:  # the numpy path: a plain class with the same attributes
    torch = None
    _Optimizer = object

__all__ = ["Muon", "buffer_of"]


def _named_groups(params):
    """`params` as torch-style groups: [{"params": [(name, tensor), ...], other keys}]."""
    def pairs(members, names, where):
        if isinstance(members, dict):
            return list(members.items())
        members = list(members)
        if names is not None:
            names = list(names)
            if len(names) != len(members):
                raise InvalidArgument(f"{where}: {len(names)} param_names for {len(members)} "
                                      "params")
            members = [m[1] if isinstance(m, tuple) else m for m in members]
            return list(zip(names, members))
        for item in members:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
                raise TypeError("zmuon.Muon needs named parameters: model.named_parameters() or "
                                "(name, tensor) pairs or a dict name -> tensor (in a param group: "
                                "those, or 'params' with 'param_names')")
        return members

    if isinstance(params, dict):
        return [{"params": pairs(params, None, "params")}]
    items = list(params)
    if items and isinstance(items[0], dict):
        out = []
        for i, g in enumerate(items):
            if not isinstance(g, dict) or "params" not in g:
                raise InvalidArgument(f"param group {i} is not a dict with 'params'")
            group = dict(g)
            group["params"] = pairs(g["params"], g.get("param_names"), f"param group {i}")
            group.pop("param_names", None)
            out.append(group)
        return out
    return [{"params": pairs(items, None, "params")}]


class Muon(_Optimizer):
    """Muon for 2-D hidden matrices and AdamW for the rest, run by the zmuon engine; a
    torch.optim.Optimizer where PyTorch is importable (every torch.optim.lr_scheduler, GradScaler,
    Lightning and HF Trainer take it).

    params:   the model (a torch.nn.Module: its named_parameters(); a DDP model's gradients
              are taken as averaged), model.named_parameters(), (name, tensor) pairs, a dict
              name -> tensor, or torch-style param groups [{"params": named pairs or tensors with "param_names", "use_muon":
              bool, "lr": ..., ...}]. Without groups the default rule (DeepSpeed's: a parameter of
              ndim >= 2 whose name contains neither "embed" nor "lm_head" uses Muon) makes two
              groups: param_groups[0] Muon's, param_groups[1] AdamW's.
    config:   a DeepSpeed-style config: a dict, a path to a JSON file, or None (defaults).
              Unknown or misspelled keys raise zmuon.InvalidArgument naming the key.
    groups:   overrides the default rule: {name: "muon" | "adamw"}, or [{"params": [names or
              tensors], "use_muon": bool}, ...]. A tensor's own `use_muon` attribute (as
              DeepSpeed sets it) is honoured too.
    heads:    {name: H}: orthogonalize H row blocks of that matrix independently (q/k/v); with
              split_sizes, a list: the heads inside each block (0: the whole block).
    split_sizes: {name: [rows, ...]}: a fused matrix (QKV [q + k + v, in]) orthogonalized per
              row block, each with its own scale. A 3-D tensor [E, rows, cols] is E expert
              matrices by default; views={name: "flatten"} makes it one [E, rows * cols] matrix
              (or "expert_stack" for ndim > 3).
    qk_clip:  {query_name: key_name} (head counts from `heads`) or {query_name: (key_name,
              query_heads, key_heads)}: MuonClip on those pairs with tau qk_clip_tau (a
              hyperparameter, 0 = off); report each micro-batch's per-head max logits with
              report_qk_logits(query_name, max_logits).
    overrides: "key.path=value" strings applied over the config.
    **hyperparameters: the defaults (keys of the config's optimizer.params): lr (Muon's),
              adam_lr, weight_decay, momentum, nesterov, betas, eps (AdamW's), ns_steps,
              ns_coefficients, ns_variant, adjust_lr; and ns_eps (Muon's normalization).
    ranks:    in-process ranks (default 1, or the config's zmuon.ranks); with more than one,
              hand over every rank's gradients with accumulate(rank=r).
    host_staging: copy CUDA tensors through host memory instead of handing over device pointers.
    nodes, node_rank, master: this process is node `node_rank` of a job of `nodes` processes
              (one per GPU, as torchrun starts them), running `ranks` ranks (default 1); node 0
              publishes the rendezvous at `master` ("HOST:PORT", a port torch.distributed does
              not use). Under torchrun: nodes=int(os.environ["WORLD_SIZE"]),
              node_rank=int(os.environ["RANK"]),
              master=f"{os.environ['MASTER_ADDR']}:{int(os.environ['MASTER_PORT']) + 1}".
              Without them, where torch.distributed is initialized with more than one process,
              every process of its default group is a node of one rank (docs/PYTORCH.md:
              "torch.distributed: DDP and FSDP2"); distributed=False keeps this process alone.
    averaged_grads: the .grad of every process is already averaged over the processes (DDP):
              each hands over its shard of it, no second reduce. A DDP model passed as `params`
              sets it; FSDP2's DTensor parameters are taken as their local shards, in place.

    Every param group carries lr, weight_decay, momentum, nesterov, betas, eps, ns_steps,
    ns_coefficients, ns_variant, adjust_lr, use_muon and param_names; step() reads them each
    time (docs/PYTORCH.md has the table of which algorithm reads which).
    """

    def __init__(self, params, config=None, *, groups=None, heads=None, overrides=(),
                 ranks=None, host_staging=False, nodes=None, node_rank=None, master=None,
                 on_metrics=None, split_sizes=None, views=None, qk_clip=None,
                 distributed=None, averaged_grads=None, **hyperparameters):
        params, ddp_module = _distributed.module_params(params)
        user_groups = _named_groups(params)
        named = [item for g in user_groups for item in g["params"]]
        self._mode = _distributed.mode_of(named, ddp_module, averaged_grads)
        overrides = list(overrides)
        nodes, node_rank, master = _distributed.job_of(self._mode, nodes, node_rank, master,
                                                       ranks, distributed)
        if self._mode == _distributed.FSDP:  # the plan cuts the parameters as FSDP2 does
            overrides.append("zmuon.shard_layout=rows")
        for name, _ in named:
            _capi._text(name, "parameter name")  # a NUL would cut the name short in C
        group_of = _groups.resolve_groups(named, groups)  # checked before the engine starts
        for g in user_groups:
            if "use_muon" in g and g["use_muon"] is not None:
                for name, _ in g["params"]:
                    group_of[name] = _capi.GROUP_MUON if g["use_muon"] else _capi.GROUP_ADAMW
        ns_eps = hyperparameters.pop("ns_eps", _groups.ENGINE_DEFAULTS["ns_eps"])
        overrides = overrides + [hyperparameter_override(k, v) for k, v in hyperparameters.items()]
        config_dict, config_file = self._read_config(config)
        self._engine = self._create_engine(config_dict, config_file, overrides, hyperparameters,
                                           ranks, nodes, node_rank, master, on_metrics)
        self._gas = self._explicit_gas(config_dict, overrides)
        self._host_staging = host_staging
        self._heads = dict(heads or {})
        all_heads = dict(self._heads)
        # Per-block heads (a list) go with split_sizes, not to add_parameter.
        block_heads = {n: list(h) for n, h in self._heads.items()
                       if isinstance(h, (list, tuple))}
        for n in block_heads:
            del self._heads[n]
        self._params = []       # (name, tensor or array, shape), in registration order
        self._shapes = {}       # name -> shape
        self._name_of = {}      # id(tensor) -> name
        self._staged = {}       # name -> host copy of a CUDA parameter (host_staging)
        self._group_of = group_of
        self._started = False   # the engine's table is fixed once it runs
        for name, p in named:
            self._register(name, p)
        if self._heads:
            raise InvalidArgument(f"heads given for {sorted(self._heads)}, which are not "
                                  "parameters")
        self._register_blocks(split_sizes, block_heads, views)
        self._qk_heads = self._register_qk_clip(qk_clip, all_heads)
        self._micro = [0] * (self._node[2] if self._node is not None else self._engine.world)
        self._backward_hooks, self._pending = [], {}  # hand_over_in_backward
        self._applied = []  # per group, the hyperparameters the engine runs with
        self.last_step = None
        defaults = _groups.defaults_of(config_dict, overrides)
        defaults["ns_eps"] = ns_eps
        # The engine resolved the config's lr rule (DeepSpeed's: "lr" for both algorithms unless
        # muon_lr / adam_lr), "auto" and the scheduler's first rate: param_groups show those.
        for key, lr in zip(("lr", "adam_lr"), _capi.engine_next_lrs(self._engine)):
            if abs(lr - defaults[key]) > 1e-6 * abs(defaults[key]):
                defaults[key] = lr
        groups_in = self._split_default_groups(user_groups)
        if _Optimizer is object:
            self.defaults = defaults
            self.state = {}
            self.param_groups = []
            for g in groups_in:
                self.add_param_group(g)
        else:
            super().__init__(groups_in, defaults)
        self.state = _state.ShardState(self)
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
            local = [(name, p.to_local().detach().to("cpu").contiguous()) for name, p, _ in
                     self._params]
            self._engine.load_shard_params(self._first_rank, [
                (name, *buffer_of(t, f"parameter '{name}'")[:3]) for name, t in local])
            self._started = True

    # -- construction ----------------------------------------------------------------------------

    @staticmethod
    def _read_config(config):
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
                return _capi.engine_with_host(json.dumps(config_dict), overrides,
                                              _host.host_values(hyperparameters))
            if self._node is not None:
                return _capi.Engine(json.dumps(config_dict) if config_file is None else "",
                                    overrides, config_file=config_file, node=self._node)
            if config_file is not None:
                return _capi.Engine(overrides=overrides, config_file=config_file)
            return _capi.Engine(json.dumps(config_dict), overrides)
        except InvalidArgument as e:  # the engine names a keyword as the override it became
            message = str(e)
            for key, value in hyperparameters.items():
                written = f"--set {hyperparameter_override(key, value)}: "
                if message.startswith(written):
                    raise InvalidArgument(f"zmuon.Muon({key}={value!r}): "
                                          f"{message[len(written):]}") from None
            raise

    @staticmethod
    def _explicit_gas(config_dict, overrides):
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

    def _register(self, name, p):
        if name in self._shapes:
            raise _capi.DuplicateParameter(f"parameter '{name}' is registered twice")
        if _distributed.is_dtensor(p):  # FSDP2: registered without values, loaded per shard
            buffer_of(p.to_local(), f"parameter '{name}'", writable=True)  # fp32, contiguous
            ptr, numel, shape = None, 0, tuple(p.shape)
        else:
            ptr, numel, device, shape = buffer_of(p, f"parameter '{name}'", writable=True)
            if device != HOST:  # registration copies the initial values from host memory
                init = p.detach().to("cpu").contiguous()
                if self._host_staging:
                    self._staged[name] = init
                ptr, numel, _, _ = buffer_of(init, f"parameter '{name}'")
        self._engine.add_parameter(name, shape, self._group_of.get(name, _capi.GROUP_AUTO),
                                   int(self._heads.pop(name, 0)), ptr, numel)
        self._params.append((name, p, shape))
        self._shapes[name] = tuple(shape)
        self._name_of[id(p)] = name

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

    def report_qk_logits(self, query, max_logits, rank=None):
        """MuonClip: the largest pre-softmax logit of this micro-batch per head of `query`
        (a tensor or sequence of query_heads numbers) on `rank` (default: this process's
        first rank). The step clips by the max over all reports of all ranks since the last."""
        if query not in self._qk_heads:
            raise InvalidArgument(f"report_qk_logits: '{query}' is not a qk_clip query"
                                  f"{_groups.suggestion(query, self._qk_heads)}")
        if hasattr(max_logits, "detach"):
            max_logits = max_logits.detach().float().cpu().reshape(-1).tolist()
        values = [float(x) for x in max_logits]
        self._engine.report_qk_logits(self._first_rank if rank is None else rank, query, values)

    def _split_default_groups(self, user_groups):
        """The groups handed to add_param_group: a group without use_muon becomes Muon's and
        AdamW's (the default rule decides) when it is the only one; otherwise all its parameters
        must use one algorithm."""
        out = []
        for i, g in enumerate(user_groups):
            names = [n for n, _ in g["params"]]
            uses = [self._engine.uses_muon(n) for n in names]
            rest = {k: v for k, v in g.items() if k != "params"}
            if rest.get("use_muon") is None and len(user_groups) == 1:
                for muon in (True, False):
                    members = [(n, p) for (n, p), u in zip(g["params"], uses) if u == muon]
                    out.append(dict(rest, params=members, use_muon=muon))
                return out
            if rest.get("use_muon") is None:
                if len(set(uses)) > 1:
                    raise InvalidArgument(f"param group {i} holds Muon and AdamW parameters "
                                          "under the default rule: give it 'use_muon'")
                rest["use_muon"] = uses[0] if uses else True
            out.append(dict(rest, params=list(g["params"])))
        return out

    # -- torch.optim.Optimizer -------------------------------------------------------------------

    def add_param_group(self, param_group):
        """Adds a group: {"params": named pairs, or tensors with "param_names", "use_muon": bool
        (default: the default rule, one algorithm for the whole group), hyperparameters (missing
        ones from `defaults`: lr from "lr" for Muon, "adam_lr" for AdamW; eps from "ns_eps" for
        Muon, "eps" for AdamW)}. New parameters only before the first step (the engine's table
        is fixed once it runs: zmuon.BadState)."""
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise InvalidArgument("add_param_group: expected a dict with 'params'")
        group = dict(param_group)
        members = group.pop("params")
        names = group.pop("param_names", None)
        if isinstance(members, dict):
            pairs = list(members.items())
        else:
            members = [members] if is_torch(members) else list(members)
            pairs = []
            for k, m in enumerate(members):
                if isinstance(m, tuple) and len(m) == 2 and isinstance(m[0], str):
                    pairs.append(m)
                elif names is not None:
                    pairs.append((list(names)[k], m))
                elif id(m) in self._name_of:
                    pairs.append((self._name_of[id(m)], m))
                else:
                    raise TypeError("add_param_group: a tensor without a name: give (name, "
                                    "tensor) pairs or 'param_names'")
        taken = {id(p) for g in self.param_groups for p in g["params"]}
        for name, p in pairs:
            if id(p) in taken:
                raise ValueError(f"some parameters appear in more than one parameter group "
                                 f"('{name}')")
            if id(p) not in self._name_of or self._name_of[id(p)] != name:
                if self._started:
                    raise BadState(f"add_param_group: '{name}' is new, and the engine's "
                                   "parameter table is fixed once it runs (after the first "
                                   "accumulate or step); add every group before")
                if group.get("use_muon") is not None:
                    self._group_of[name] = (_capi.GROUP_MUON if group["use_muon"]
                                            else _capi.GROUP_ADAMW)
                self._register(name, p)
        uses = {self._engine.uses_muon(n) for n, _ in pairs}
        if group.get("use_muon") is None:
            if len(uses) > 1:
                raise InvalidArgument("add_param_group: the group holds Muon and AdamW "
                                      "parameters under the default rule: give it 'use_muon'")
            group["use_muon"] = uses.pop() if uses else True
        elif uses and uses != {bool(group["use_muon"])}:
            raise InvalidArgument(f"add_param_group: use_muon={group['use_muon']} for "
                                  "parameters registered with the other algorithm")
        muon = bool(group["use_muon"])
        index = len(self.param_groups)  # the engine's hyperparameter group
        for name, _ in pairs:
            self._engine.set_hparam_group(name, index)
        d = self.defaults
        group.setdefault("lr", d["lr"] if muon else d["adam_lr"])
        group.setdefault("eps", d["ns_eps"] if muon else d["eps"])
        for key in _groups.GROUP_KEYS:
            group.setdefault(key, d[key])
        group["params"] = [p for _, p in pairs]
        group["param_names"] = [n for n, _ in pairs]
        self.param_groups.append(group)

    def zero_grad(self, set_to_none=True):
        """Sets every torch parameter's .grad to None (or zeros it)."""
        for _, p, _ in self._params:
            if is_torch(p) and p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_()
                    p.grad.zero_()

    def step(self, closure=None):
        """One optimizer step on everything handed over since the last one (if nothing was,
        the parameters' current .grad), then the new values into the parameters. Returns the
        closure's loss (None without a closure). The param groups' hyperparameters are read and
        checked first (zmuon.InvalidArgument naming a bad one, before anything runs). The step's
        report is then in `last_step` (docs/PYTORCH.md)."""
        values = _groups.engine_values(self.param_groups)
        loss = None
        if closure is not None:
            if torch is not None:
                with torch.enable_grad():
                    loss = closure()
            else:
                loss = closure()
        if not any(self._micro):
            if all(is_torch(p) for _, p, _ in self._params) \
                    and any(p.grad is not None for _, p, _ in self._params):
                self.accumulate()
            else:
                raise BadState("step() before any gradient: call loss.backward() (or "
                               "accumulate()) first")
        elif self._gas is not None and max(self._micro) != self._gas:
            raise InvalidArgument(f"step(): {max(self._micro)} micro-batches were handed over "
                                  "since the last step (accumulate() calls), but the config's "
                                  f"gradient_accumulation_steps is {self._gas}")
        self._apply_hyperparameters(values)
        self._micro = [0] * len(self._micro)
        if loss is not None and self._host_engine:
            value = loss.detach() if hasattr(loss, "detach") else loss
            _capi.log_loss(self._engine, float(value))  # for the step's metrics record
        info = self._engine.step()
        if info["skipped"] and math.isfinite(info["grad_norm"]):
            info["grad_norm"] = float("nan")  # no norm of a non-finite gradient
        self.last_step = info
        self.state.invalidate()
        self._write_back()
        if self._schedule is not None:
            self._schedule.show(self.param_groups)
        return loss

    # -- gradients -------------------------------------------------------------------------------

    def accumulate(self, grads=None, rank=None):
        """Hands over one micro-batch's gradients of rank `rank` (default: this process's first
        rank): by default each torch parameter's .grad (None: no gradient in this micro-batch);
        else `grads`, a dict name -> array/tensor or a list in the order of the parameters. A
        parameter left out here counts as zero in this micro-batch; one left out of every
        micro-batch on every rank of a step is left as it is, as torch leaves a parameter whose
        .grad is None (no momentum decay, no weight decay, no AdamW step count). Each gradient
        has its parameter's shape (else zmuon.ShapeMismatch, and nothing of the call is handed
        over)."""
        if rank is None:
            rank = self._first_rank
        entries, keep = self._entries(grads)
        stream = torch_stream(keep)
        if stream is None and any(device != HOST for _, _, _, device in entries):
            synchronize_torch(keep)  # the gradients must be written before the engine reads them
        if self._mode == _distributed.PLAIN:
            self._engine.reduce(rank, entries, stream=stream)
        else:  # averaged over the processes already (DDP, FSDP2): no second reduce
            if stream == 0 and any(device != HOST for _, _, _, device in entries):
                synchronize_torch(keep)  # the C call takes no stream as "read now"
            self._engine.hand_over_reduced(rank, entries, stream=stream)
        self._started = True
        if 0 <= rank - self._first_rank < len(self._micro):
            self._micro[rank - self._first_rank] += 1

    def accumulate_all(self, grads_by_rank):
        """One micro-batch of every rank of this process at once: grads_by_rank[i] is local
        rank i's (as accumulate's `grads`). The ranks hand over on a thread each inside the
        engine, within the bound on reduce buckets in flight (zmuon.max_buckets_in_flight);
        every rank's gradients are checked before any is handed over."""
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
            synchronize_torch(keep)  # read during the call, after the work that wrote them
        self._engine.reduce_all(entries)
        self._started = True
        for i in range(min(len(grads_by_rank), len(self._micro))):
            self._micro[i] += 1

    def hand_over_in_backward(self, on=True):
        """Hands each micro-batch's gradients over during backward (on=False: stops): a
        post-accumulate-grad hook per parameter collects its gradient as autograd finishes it,
        and when the backward pass ends they go to the engine as one micro-batch, as
        accumulate() would hand them, and each .grad is set to None. Each backward() is then a
        micro-batch; step() steps on their mean. .grad is empty after backward, so tools that
        read it (GradScaler, clip_grad_norm_) do not combine with this."""
        if torch is None:
            raise Unsupported("hand_over_in_backward needs PyTorch")
        if self._mode != _distributed.PLAIN:
            raise Unsupported(f"hand_over_in_backward with {self._mode.upper()}: it averages "
                              "the gradients as backward ends; call step() after backward")
        for handle in self._backward_hooks:
            handle.remove()
        self._backward_hooks, self._pending = [], {}
        if not on:
            return
        for name, p, _ in self._params:
            if p.requires_grad:
                self._backward_hooks.append(p.register_post_accumulate_grad_hook(
                    lambda p, name=name: self._grad_ready(name, p)))

    def _grad_ready(self, name, p):
        if not self._pending:  # the first of this backward: hand over when it ends
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        self._pending[name] = p

    def _end_of_backward(self):
        pending, self._pending = self._pending, {}
        self.accumulate(grads={name: p.grad for name, p in pending.items()})
        for p in pending.values():
            p.grad = None

    def _entries(self, grads):
        """accumulate's `grads` as the engine's (name, pointer, numel, device) entries, and the
        objects that must live until the engine has read them."""
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
        entries, keep = [], []
        for name, g in items:
            if g is None:
                continue
            _capi._text(name, "gradient name")  # a NUL would cut the name short in C
            if _distributed.is_dtensor(g):  # FSDP2: this process's shard, reduce-scattered
                local = g.to_local()
                g = local if local.is_contiguous() else local.contiguous()
                keep.append(g)
                ptr, numel, device, _ = buffer_of(g, f"gradient of '{name}'")
                entries.append((name, ptr, numel, device))
                continue
            if is_torch(g) and (g.is_cuda and self._host_staging):
                g = g.detach().to("cpu").contiguous()
            keep.append(g)
            ptr, numel, device, shape = buffer_of(g, f"gradient of '{name}'")
            expected = self._shapes.get(name)  # an unknown name: the engine's error names it
            if expected is not None and tuple(shape) != expected:
                raise ShapeMismatch(f"gradient of '{name}' has shape {tuple(shape)}, the "
                                    f"parameter's is {expected}")
            entries.append((name, ptr, numel, device))
        return entries, keep

    # -- the engine's side -----------------------------------------------------------------------

    def _apply_hyperparameters(self, values):
        """Hands each group's hyperparameters to the engine where they changed."""
        for index, v in enumerate(values):
            if index < len(self._applied) and self._applied[index] == v:
                continue
            self._engine.set_group_hparams(index, v)
            if index < len(self._applied):
                self._applied[index] = v
            else:
                self._applied.append(v)

    def _write_back(self):
        if self._mode == _distributed.FSDP:
            self._write_back_shards()
            return
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
        stream = torch_stream(targets) if len(self._micro) == 1 else None
        if stream is None and any(device != HOST for _, _, _, device in entries):
            synchronize_torch(targets)
        self._engine.gather_params(entries, stream=stream)
        for name, p, _ in self._params:
            if name in self._staged:
                p.data.copy_(self._staged[name])

    def _write_back_shards(self):
        """FSDP2: the new fp32 shard of each parameter into its local tensor, in place (no
        collective: FSDP2 all-gathers them at the next forward)."""
        entries, targets = [], []
        for name, p, _ in self._params:
            local = p.to_local()
            targets.append(local)
            ptr, numel, device, _ = buffer_of(local, f"parameter '{name}'", writable=True)
            entries.append((name, ptr, numel, device))
        stream = torch_stream(targets)
        if not stream and any(device != HOST for _, _, _, device in entries):
            synchronize_torch(targets)  # the C call takes no stream as "write now"
        self._engine.shard_params(self._first_rank, entries, stream=stream)

    # -- zmuon's own -----------------------------------------------------------------------------

    @property
    def world(self):
        """The job's rank count (a property, not a method)."""
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

    def time_calls(self, on=True):
        """Times every compute-backend call of the following steps (off by default; on CUDA
        two events per call), for write_call_timeline."""
        self._engine.time_calls(on)

    def write_call_timeline(self, path):
        """Writes the calls timed since time_calls (or the last write) as Chrome Trace Event
        JSON, to open in ui.perfetto.dev. Raises zmuon.BadState while timing is off."""
        self._engine.write_call_timeline(path)

    def save_checkpoint(self, directory):
        """Saves the optimizer state (parameters, momentum, Adam moments, step, loss scale) as a
        zmuon checkpoint under `directory` (between steps); a collective in a multi-process job."""
        self._engine.save_checkpoint(directory)

    def load_checkpoint(self, directory):
        """Restores a checkpoint saved by save_checkpoint (also one saved with another rank
        count) and writes its parameters into the tensors; returns the step it was saved at."""
        step = self._engine.load_checkpoint(directory)
        self.state.invalidate()
        self._write_back()
        return step

    def local_range(self, name):
        """(offset, numel): the elements of parameter `name`'s flattened tensor that opt.state
        holds in this process (the whole tensor in one process)."""
        return _capi.state_range(self._engine, name, _capi.STATE_LOCAL)

    def state_dict(self):
        """torch's shape, whole tensors (docs/PYTORCH.md): {"state": {index: {"momentum_buffer"}
        or {"exp_avg", "exp_avg_sq", "step"}}, "param_groups": [...], "zmuon": {step, loss
        scaler, fp32 masters}}. In a multi-process job a collective: every process calls it."""
        return _state.state_dict(self)

    def load_state_dict(self, state_dict):
        """Loads a state_dict (of any rank count): checked first, a bad one raises naming what is
        wrong and changes nothing. In a multi-process job a collective."""
        _state.load_state_dict(self, state_dict)

    def __getstate__(self):
        raise TypeError("zmuon.Muon cannot be pickled: it runs an engine; pickle "
                        "opt.state_dict() instead and load it with load_state_dict()")

    def close(self):
        """Stops the engine (also done when the optimizer is garbage collected)."""
        self._engine.close()

    def __repr__(self):
        sizes = ", ".join(f"{'muon' if g['use_muon'] else 'adamw'}: {len(g['params'])} "
                          "parameters" for g in self.param_groups)
        return f"zmuon.Muon({sizes}, ranks: {self.world})"
