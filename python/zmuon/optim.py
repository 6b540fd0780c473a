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

Parameters are PyTorch tensors (float32 in place; bfloat16, float16 or strided ones through fp32
masters, the new values rounded to nearest into them) or float32 contiguous numpy arrays
(gradients then come in through `accumulate(grads=...)`), by data pointer. The parameters are
the truth: a write made to one outside zmuon (a model load, an EMA swap, p.data.copy_()) is
noticed before the next step, which starts from it. CUDA tensors go to the engine
as device pointers (the cuda compute backend reads and writes them on the GPU). Their gradients
are handed over stream-ordered: the engine reads them after the work queued on PyTorch's current
stream, and that stream's later work waits for the reads (under the nccl comm nothing waits for
the GPU; the caf comm copies them to host memory, which waits for that work). The new values are
written back the same way: after PyTorch's queued work, before its next (one rank in the
process; otherwise after torch.cuda.synchronize()). A backend without device buffers (host)
raises zmuon.Unsupported, unless `host_staging=True` copies them through host memory. CUDA
parameters choose the cuda backend unless the config names one, and the GPU they are on
(zmuon.device) unless the config names one. With the cuda backend and a GPU
for each rank the comm is nccl unless the config says
otherwise (`zmuon.comm`, default auto). Inside a CUDA graph capture the hand-over is refused
(zmuon.InvalidArgument).
"""

import math

from . import _capi, _construction, _distributed, _groups, _mesh, _param_groups, _state
from ._buffers import buffer_of, synchronize_torch
from ._capi import BadState, InvalidArgument, Unsupported
from ._construction import Construction
from ._gradients import Gradients
from ._param_groups import ParamGroups
from ._param_sync import ParamSync
from ._rounding import Rounding
from ._torch_integration import TorchIntegration

try:
    import torch
    _Optimizer = torch.optim.Optimizer
except ImportError:  # the numpy path: a plain class with the same attributes
    torch = None
    _Optimizer = object

__all__ = ["Muon", "buffer_of"]


class Muon(Construction, ParamGroups, Gradients, ParamSync, TorchIntegration, _Optimizer):
    """Muon for 2-D hidden matrices and AdamW for the rest, run by the zmuon engine; a
    torch.optim.Optimizer where PyTorch is importable (every torch.optim.lr_scheduler, GradScaler,
    Lightning and HF Trainer take it).

    params:   the model (a torch.nn.Module: its named_parameters(); a DDP model's gradients
              are taken as averaged), model.named_parameters(), (name, tensor) pairs, a dict
              name -> tensor, model.parameters() or any tensors, or torch-style param groups
              [{"params": named pairs, tensors (with "param_names" or without), "use_muon": bool
              or "algorithm": "muon" | "adamw", "lr": ..., ...}]. Without groups the default rule
              (DeepSpeed's: a parameter of ndim >= 2 whose name contains neither "embed" nor
              "lm_head" uses Muon; an unnamed one by ndim alone) makes two groups:
              param_groups[0] Muon's, param_groups[1] AdamW's.
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
    rounding: how the fp32 masters go into bfloat16 parameters after each step: "nearest"
              (default) or "stochastic" (unbiased: rounds up with the probability of the
              distance from the lower neighbour; float16 parameters stay round-to-nearest).
    rounding_seed: the seed of stochastic rounding's random bits (one generator per device).
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
                 distributed=None, averaged_grads=None, rounding="nearest", rounding_seed=0,
                 **hyperparameters):
        self._made_with = dict(config=config, groups=groups, heads=heads, overrides=overrides,
                               ranks=ranks, host_staging=host_staging, on_metrics=on_metrics,
                               split_sizes=split_sizes, views=views, qk_clip=qk_clip,
                               rounding=rounding, rounding_seed=rounding_seed,
                               **hyperparameters)  # what copy.deepcopy makes a twin with
        self._rounding = Rounding(rounding, rounding_seed)
        params, ddp_module = _distributed.module_params(params)
        user_groups, made_up = _param_groups.named_groups(params)
        named = [item for g in user_groups for item in g["params"]]
        self._mode = _distributed.mode_of(named, ddp_module, averaged_grads)
        # DTensors placed otherwise than FSDP2's rows: the moves between them (a collective)
        self._mesh = _mesh.layout_for(named, dict(views or {}),
                                      _construction.rows_in_blocks(heads, split_sizes, qk_clip)) \
            if self._mode == _distributed.FSDP else None
        nodes, node_rank, master = _distributed.job_of(
            self._mode, nodes, node_rank, master, ranks, distributed,
            self._mesh.engine_of if self._mesh is not None else None)
        group_of = _param_groups.placement(named, user_groups, made_up, groups)
        ns_eps = hyperparameters.pop("ns_eps", _groups.ENGINE_DEFAULTS["ns_eps"])
        config_dict, config_file = _construction.read_config(config)
        overrides = self._engine_overrides(overrides, hyperparameters, named, config_dict,
                                           host_staging)
        self._setup = (config_dict, config_file, list(overrides), dict(hyperparameters), ranks,
                       on_metrics)  # what a restart of the engine needs
        self._engine = self._create_engine(config_dict, config_file, overrides, hyperparameters,
                                           ranks, nodes, node_rank, master, on_metrics)
        self._gas = _construction.explicit_gas(config_dict, overrides)
        self._host_staging = host_staging
        self._group_of = group_of
        self._register_all(named, heads, split_sizes, views, qk_clip)
        self._micro = [0] * (self._node[2] if self._node is not None else self._engine.world)
        self._backward_hooks, self._pending = [], {}  # hand_over_in_backward
        self._ahead_hooks, self._ahead, self._ahead_queued = [], None, False  # hand_over_ahead
        self._applied = []  # per group, the hyperparameters the engine runs with
        self._checked = (None, None)  # groups_key of the groups last checked, their values
        self._momentum_seen = []  # per Muon group, betas[0] as the last step saw it
        self.last_step = None
        defaults = self._defaults(config_dict, overrides, ns_eps)
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
        self._start(config_dict, on_metrics)

    def step(self, closure=None):
        """One optimizer step on everything handed over since the last one (if nothing was,
        the parameters' current .grad), then the new values into the parameters. Returns the
        closure's loss (None without a closure). Where no torch parameter has a .grad and
        nothing was handed over, it changes nothing, as torch.optim's step (one process; a
        multi-process job, or numpy parameters, raise zmuon.BadState instead). The param
        groups' hyperparameters are read and checked first (zmuon.InvalidArgument naming a bad
        one, before anything changes); a parameter written outside zmuon since the last step is
        loaded into the engine first.
        The step's report is then in `last_step` (docs/PYTORCH.md)."""
        # Gradients handed over as the backward ended: their reads begin first, beside the rest.
        ahead = self._begin_ahead() if closure is None else None
        try:
            self._follow_cycled_momentum()
            values = self._group_values()
        except BaseException:
            if ahead:  # the reads begun may not outlive the call (the caller may free them)
                synchronize_torch(ahead[0])
            raise
        loss = None
        if closure is not None:
            if torch is not None:
                with torch.enable_grad():
                    loss = closure()
            else:
                loss = closure()
            ahead = self._begin_ahead()
        kept = None  # step's own hand-over: the .grad tensors, read in place until it returns
        stream = None  # and PyTorch's stream they were handed over on, the step's too
        own = not any(self._micro)  # the step hands the .grad tensors over itself
        if ahead:
            kept, stream = ahead
        elif own:
            torch_params = self._param_slots()[0]
            if not (torch_params and any(p.grad is not None for _, p, _ in self._params)):
                if torch_params and self._node is None and self._mode == _distributed.PLAIN:
                    self.last_step = None  # no gradient at all: nothing changes, as torch.optim
                    return loss
                raise BadState("step() before any gradient: call loss.backward() (or "
                               "accumulate()) first")
        elif self._gas is not None and max(self._micro) != self._gas:
            raise InvalidArgument(f"step(): {max(self._micro)} micro-batches were handed over "
                                  "since the last step (accumulate() calls), but the config's "
                                  f"gradient_accumulation_steps is {self._gas}")
        try:
            self._apply_hyperparameters(values)
            self._reload_written()
            if own and not ahead:  # last, right before the engine's step: it starts the step
                kept, stream = self._hand_over(kept=True)
            self._micro = [0] * len(self._micro)
            if loss is not None and self._host_engine:
                value = loss.detach() if hasattr(loss, "detach") else loss
                _capi.log_loss(self._engine, float(value))  # for the step's metrics record
            # On the device, stream-ordered as torch.optim's steps: PyTorch's current stream
            # waits for the step's work, and step() returns once that work is enqueued.
            info = self._engine.step(stream)
        except BaseException:
            if kept:  # no read of them may be left queued once the caller may free them
                synchronize_torch(kept)
            raise
        del kept
        if info["skipped"] and math.isfinite(info["grad_norm"]):
            info["grad_norm"] = float("nan")  # no norm of a non-finite gradient
        self.last_step = info
        self.state.invalidate()
        self._rounding.begin(info["step"])
        self._write_back()
        if self._schedule is not None:
            self._schedule.show(self.param_groups)
        return loss

    def _group_values(self):
        """engine_values of the param groups, checked again only where one changed."""
        key = _groups.groups_key(self.param_groups)
        if key is None or key != self._checked[0]:
            self._checked = (key, _groups.engine_values(self.param_groups))
        return self._checked[1]

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

    def report_qk_logits(self, query, max_logits, rank=None):
        """MuonClip: the largest pre-softmax logit of this micro-batch per head of `query`
        (a tensor or sequence of query_heads numbers; -inf for a head not computed here, as
        under tensor parallelism) on `rank` (default: this process's first rank). The step clips
        by the max over all reports of all ranks since the last."""
        if query not in self._qk_heads:
            raise InvalidArgument(f"report_qk_logits: '{query}' is not a qk_clip query"
                                  f"{_groups.suggestion(query, self._qk_heads)}")
        if hasattr(max_logits, "detach"):
            max_logits = max_logits.detach().float().cpu().reshape(-1).tolist()
        values = [float(x) for x in max_logits]
        self._engine.report_qk_logits(self._first_rank if rank is None else rank, query, values)

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
        self._check_natural_order("save_checkpoint")
        self._reload_written()
        self._engine.save_checkpoint(directory)

    def load_checkpoint(self, directory):
        """Restores a checkpoint saved by save_checkpoint (also one saved with another rank
        count) and writes its parameters into the tensors; returns the step it was saved at."""
        self._check_natural_order("load_checkpoint")
        step = self._engine.load_checkpoint(directory)
        self.state.invalidate()
        self._rounding.begin(step)
        self._write_back()
        return step

    def _check_natural_order(self, what):
        """zmuon's checkpoint files hold the engine's order of each parameter."""
        if self._mesh is not None and (self._mesh.order or self._mesh.boxes):
            name = sorted(self._mesh.order or self._mesh.boxes)[0]
            held = "rows" if name in self._mesh.order else "elements"
            raise Unsupported(f"{what}: the engine holds the {held} of '{name}' in their "
                              "holders' order (tensor or expert parallel); save with "
                              "state_dict() and torch.distributed.checkpoint")

    def local_range(self, name):
        """(offset, numel): the elements of parameter `name`'s flattened tensor that opt.state
        holds in this process (the whole tensor in one process)."""
        return _capi.state_range(self._engine, name, _capi.STATE_LOCAL)

    def close(self):
        """Stops the engine (also done when the optimizer is garbage collected) and takes its
        hooks off the parameters."""
        self._arm_ahead(False)
        self._engine.close()

    def __repr__(self):
        sizes = ", ".join(f"{'muon' if g['use_muon'] else 'adamw'}: {len(g['params'])} "
                          "parameters" for g in self.param_groups)
        return f"zmuon.Muon({sizes}, ranks: {self.world})"
