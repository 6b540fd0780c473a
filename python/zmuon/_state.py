"""The optimizer state in torch's shape: opt.state (per parameter, its momentum or Adam moments)
and state_dict() / load_state_dict()."""

import os
import tempfile

from ._capi import InvalidArgument, Unsupported
from ._groups import GROUP_KEYS, learning_rate


class ShardState(dict):
    """opt.state: parameter -> {"momentum_buffer"} (Muon) or {"exp_avg", "exp_avg_sq", "step"}
    (AdamW), read from the engine when asked."""

    def __init__(self, opt):
        super().__init__()
        self._opt = opt


def _group_entries(opt):
    out, index = [], 0
    for g in opt.param_groups:
        entry = {k: v for k, v in g.items() if k != "params"}
        entry["params"] = list(range(index, index + len(g["params"])))
        index += len(g["params"])
        out.append(entry)
    return out


def state_dict(opt):
    """{"state": {index: {...}}, "param_groups": [...]} as torch's, plus "zmuon_checkpoint"."""
    if opt._node is not None:
        raise Unsupported("state_dict in a multi-process job: use save_checkpoint(dir) on a "
                          "directory every process sees")
    with tempfile.TemporaryDirectory() as tmp:
        opt._engine.save_checkpoint(tmp)
        files = {}
        for root, _, names in os.walk(tmp):
            for n in names:
                path = os.path.join(root, n)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, tmp)] = f.read()
    return {"state": {}, "param_groups": _group_entries(opt), "zmuon_checkpoint": files}


def load_state_dict(opt, state):
    if opt._node is not None:
        raise Unsupported("load_state_dict in a multi-process job: use load_checkpoint(dir) "
                          "on a directory every process sees")
    if not isinstance(state, dict) or not isinstance(state.get("zmuon_checkpoint"), dict):
        raise InvalidArgument("load_state_dict: not a zmuon.Muon state_dict (no "
                              "'zmuon_checkpoint' dict of checkpoint files)")
    groups = state.get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(opt.param_groups):
        raise InvalidArgument(f"load_state_dict: 'param_groups' must list "
                              f"{len(opt.param_groups)} groups, got {groups!r}")
    for i, g in enumerate(groups):
        learning_rate(g.get("lr") if isinstance(g, dict) else None,
                      f"load_state_dict: param_groups[{i}]['lr']")
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
        opt._engine.load_checkpoint(tmp)
    opt._write_back()
    for g, saved in zip(opt.param_groups, groups):
        for key in GROUP_KEYS:
            if key in saved:
                g[key] = saved[key]
