"""zmuon.Muon where torch.optim.Optimizer's protocol reaches past step(): zero_grad, the
state-dict hooks called as torch calls them, and the hand-over of gradients during backward."""

import copy

from . import _distributed, _state
from ._buffers import is_torch
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
        return twin

    def __getstate__(self):
        raise TypeError("zmuon.Muon cannot be pickled: it runs an engine; pickle "
                        "opt.state_dict() instead and load it with load_state_dict()")
