"""zmuon.Muon where torch.optim.Optimizer's protocol reaches past step(): zero_grad, the
state-dict hooks called as torch calls them, and the hand-over of gradients as backward ends."""

import collections
import copy
import operator
import weakref

from . import _capi, _distributed, _log, _state
from ._buffers import current_stream, entries_devices, is_torch
from ._capi import BadState, Unsupported

try:
    import torch
except ImportError:  # the numpy path: no hooks, no autograd
    torch = None


# torch.optim.Optimizer's hooks of one optimizer, which a deep copy carries.
HOOK_DICTS = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks",
              "_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks",
              "_optimizer_load_state_dict_pre_hooks", "_optimizer_load_state_dict_post_hooks")


def _hooks(opt, attribute):
    return list(getattr(opt, attribute, {}).values())


class TorchIntegration:
    """zmuon.Muon's half that speaks torch.optim.Optimizer's protocol."""

    def zero_grad(self, set_to_none=True):
        """Sets every torch parameter's .grad to None (or zeros it)."""
        self._ahead = None  # the next step() or backward hands the gradients over again
        params = [p for _, p, _ in self._params] + list(self._params_outside.values())
        for p in params:
            if is_torch(p) and p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_()
                    p.grad.zero_()

    def state_dict(self):
        """torch's shape, whole tensors (docs/PYTORCH.md): {"state": {index: {"momentum_buffer"}
        or {"exp_avg", "exp_avg_sq", "step"}, and "master" for a bf16 / fp16 parameter},
        "param_groups": [...], "zmuon": {step, loss scaler, fp32 masters}}. In a multi-process
        job a collective: every process calls it. The state-dict hooks run as torch's: each pre
        hook with the optimizer, each post hook with the dict (one that returns a dict replaces
        it)."""
        for hook in _hooks(self, "_optimizer_state_dict_pre_hooks"):
            hook(self)
        self._reload_written()  # the masters of parameters written since the last step
        sd = _state.state_dict(self)
        for hook in _hooks(self, "_optimizer_state_dict_post_hooks"):
            result = hook(self, sd)
            if result is not None:
                sd = result
        return sd

    def load_state_dict(self, state_dict):
        """Loads a state_dict (of any rank count): checked first, a bad one raises naming what
        is wrong and changes nothing. In a multi-process job a collective. The load hooks run as
        torch's: each pre hook with the optimizer and the dict (one that returns a dict
        replaces it), each post hook with the optimizer."""
        if isinstance(state_dict, dict):
            state_dict = state_dict.copy()  # shallow, as torch's: a hook may change it
        for hook in _hooks(self, "_optimizer_load_state_dict_pre_hooks"):
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        _state.load_state_dict(self, state_dict)
        for hook in _hooks(self, "_optimizer_load_state_dict_post_hooks"):
            hook(self)

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

    def hand_over_ahead(self, on=True):
        """Hands the parameters' .grad tensors over to the engine as each backward pass ends
        (on=False: stops), so that step() starts the step's work at once. What the step reads
        does not change: nothing reads them before step() begins, and then after PyTorch's
        current stream, so a gradient written in place in between (clip_grad_norm_, a
        GradScaler's unscale_) is read as written; where a .grad was replaced or set to None,
        step() hands them over itself. On by default in a job of one rank in one process whose
        parameters all lie on one CUDA device; elsewhere zmuon.Unsupported says why not."""
        if not on:
            self._arm_ahead(False)
            return
        why = self._why_not_ahead()
        if why:
            raise Unsupported(f"hand_over_ahead: {why}")
        self._arm_ahead(True)

    def _why_not_ahead(self):
        if torch is None:
            return "it needs PyTorch"
        if self._mode != _distributed.PLAIN or self._node is not None or self._engine.world != 1:
            return ("the engine reads gradients where they lie only in a job of one rank in one "
                    "process (several ranks reduce them first)")
        if self._host_staging:
            return "host_staging copies the gradients to the host"
        if not all(is_torch(p) for _, p, _ in self._params):
            return "a parameter is not a torch tensor"
        return None

    def _arm_ahead(self, on):
        for handle in self._ahead_hooks:
            handle.remove()
        self._ahead_hooks, self._ahead, self._ahead_queued = [], None, False
        if not on:
            return
        # The callback at the end of the backward pass is queued by the first of two parameters'
        # hooks (a hook on every parameter would cost a Python call each); a backward that
        # reaches neither leaves the hand-over to step().
        live = [p for _, p, _ in self._params if p.requires_grad]
        hook = _ahead_hook(weakref.ref(self))
        for p in {id(p): p for p in live[:1] + live[-1:]}.values():
            self._ahead_hooks.append(p.register_post_accumulate_grad_hook(hook))

    def _queue_ahead(self):
        if self._ahead_queued:
            return
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self._hand_over_ahead)
        except RuntimeError as err:  # a backward that takes no callbacks (compiled autograd)
            _log.logger.debug("hand_over_ahead off: %s", err)
            self._arm_ahead(False)
            return
        self._ahead_queued = True

    def _grads_now(self):
        """Every parameter's .grad (None where it has none), in table order; None where the
        parameters' names are not all str (only the general path takes them)."""
        columns = self._param_slots()[2]
        return list(map(_grad_of, columns[1])) if columns else None

    def _hand_over_ahead(self):
        """As the backward pass ends: every .grad to the engine, read when step() begins."""
        self._ahead_queued = False
        grads = self._grads_now()
        if any(self._micro) or self._backward_hooks or grads is None:
            return  # accumulate() or hand_over_in_backward in use; names the engine cannot take
        if self._still_ahead(grads):
            return  # those handed over, accumulated into by this backward
        self._ahead = None
        found = self._plain_grads()
        if found is None or not found[0]:
            return  # the general path's gradients: step() hands them over
        entries, keep = found
        devices = entries_devices(entries)
        stream = current_stream(devices)
        if devices and stream is None:
            return  # on several devices
        try:
            self._engine.hand_over(self._first_rank, entries, stream, False, True,
                                   ahead_of_step=True)
        except _capi.ZmuonError as err:  # step() hands over itself, and names a failure
            if isinstance(err, Unsupported):
                _log.logger.debug("hand_over_ahead off: %s", err)
                self._arm_ahead(False)
            return
        self._ahead = _Ahead(grads, list(map(torch.Tensor.data_ptr, keep)), keep, devices)

    def _still_ahead(self, grads):
        """Whether the gradients handed over ahead of the step are still the parameters' .grad
        `grads` (the same tensors at the same addresses) and the engine still holds them (a
        checkpoint's save or load withdraws them)."""
        ahead = self._ahead
        return ahead is not None and grads is not None and len(grads) == len(ahead.grads) \
            and all(map(operator.is_, grads, ahead.grads)) \
            and list(map(torch.Tensor.data_ptr, ahead.kept)) == ahead.addresses \
            and self._engine.handed_over(self._first_rank) == 1

    def _begin_ahead(self):
        """_take_ahead, and where it gives the gradients handed over, their reads begun after
        PyTorch's current stream (the engine's begin_step): step() then prepares the rest while
        they run. A failure after this leaves nothing taken: the next step() hands over again."""
        ahead = self._take_ahead() if not any(self._micro) else None
        if ahead:
            self._engine.begin_step(ahead[1])
        return ahead

    def _take_ahead(self):
        """step()'s hand-over where the one made ahead still stands: (the gradients it keeps,
        PyTorch's current stream, which the step's reads come after); else None, and step()
        hands over itself."""
        self._ahead_queued = False  # a backward that raised never ran its callback
        if self._ahead is None:
            return None
        ahead = self._ahead if self._still_ahead(self._grads_now()) else None
        self._ahead = None
        return ahead and (ahead.kept, current_stream(ahead.devices))

    def __deepcopy__(self, memo):
        """A new zmuon.Muon (its own engine) over deep copies of the parameters (the memo's
        where the model is copied with it), loaded with this one's state_dict and hooks: it steps
        as this one would. One process, between steps."""
        if self._node is not None or self._mode != _distributed.PLAIN:
            raise TypeError("copy.deepcopy(zmuon.Muon) in a multi-process job: make a new "
                            "optimizer on every process and load_state_dict() into it")
        if any(self._micro):
            raise BadState("copy.deepcopy(zmuon.Muon) between accumulate() and step()")
        groups = []
        for g in self.param_groups:
            pairs = [(self._name_of[id(p)], copy.deepcopy(p, memo)) for p in g["params"]]
            rule = {"use_muon": True} if g["use_muon"] else \
                {"use_muon": False, "algorithm": g["algorithm"]}
            groups.append(dict(rule, params=pairs))
        twin = type(self)(groups, distributed=False, **self._made_with)
        memo[id(self)] = twin
        twin.load_state_dict(self.state_dict())
        for attribute in HOOK_DICTS:
            if hasattr(self, attribute):
                setattr(twin, attribute, copy.deepcopy(getattr(self, attribute), memo))
        twin.last_step = copy.deepcopy(self.last_step, memo)
        twin._rounding = copy.deepcopy(self._rounding, memo)
        if self._backward_hooks:
            twin.hand_over_in_backward()
        if bool(self._ahead_hooks) != bool(twin._ahead_hooks):
            twin.hand_over_ahead(bool(self._ahead_hooks))
        return twin

    def __getstate__(self):
        raise TypeError("zmuon.Muon cannot be pickled: it runs an engine; pickle "
                        "opt.state_dict() instead and load it with load_state_dict()")


_grad_of = operator.attrgetter("grad")

# A hand-over made as the backward ended: every parameter's .grad then (None where it had none),
# the addresses of those handed over, the tensors themselves (kept until the step) and their
# CUDA devices.
_Ahead = collections.namedtuple("_Ahead", "grads addresses kept devices")


def _ahead_hook(optimizer):
    """The post-accumulate-grad hook of hand_over_ahead, holding the optimizer weakly (the
    parameters outlive it)."""
    def hook(_param):
        opt = optimizer()
        if opt is not None:
            opt._queue_ahead()
    return hook
