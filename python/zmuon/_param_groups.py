"""Parameter groups as torch.optim takes them: named or unnamed tensors, groups with `use_muon`
or `algorithm` (Dion's key), add_param_group, and the keys a scheduler cycles."""

import logging
import warnings

from . import _capi, _distributed, _groups, _mesh
from ._buffers import is_torch
from ._capi import InvalidArgument, Unsupported
from ._param_sync import local_of

logger = logging.getLogger("zmuon")

# A group's `algorithm` as the group keys it means. A new rule for the non-Muon group is one
# more line here (its rule key and value beside use_muon False).
ALGORITHMS = {
    "muon": {"use_muon": True},
    "adamw": {"use_muon": False},
    "lion": {"use_muon": False},
}

UNNAMED = _groups.UNNAMED


def _is_tensor(obj):
    return is_torch(obj) or hasattr(obj, "__array_interface__")


def with_algorithm(group, where):
    """`group` with its `algorithm` spelled out as the keys it means (the key itself stays)."""
    algorithm = group.get("algorithm")
    if algorithm is None:
        return group
    key = algorithm.lower() if isinstance(algorithm, str) else None
    if key not in ALGORITHMS:
        raise InvalidArgument(f"{where}['algorithm'] must be one of {', '.join(ALGORITHMS)}; got "
                              f"{algorithm!r}{_groups.suggestion(algorithm, ALGORITHMS)}")
    means = ALGORITHMS[key]
    for k, v in means.items():
        if group.get(k) is not None and group[k] != v:
            raise InvalidArgument(f"{where}: algorithm={algorithm!r} and {k}={group[k]!r} "
                                  "disagree")
    return dict(group, **means)


def _check_collection(params):
    """torch.optim's rules for the collection itself: a bare tensor or None is refused
    (TypeError), a set warned about (FutureWarning: its order changes between runs)."""
    if params is None or _is_tensor(params):
        raise TypeError("params: expected an iterable of tensors, (name, tensor) pairs or param "
                        f"groups, or a dict name -> tensor; got {type(params).__name__}"
                        + (" (pass [tensor])" if params is not None else ""))
    if isinstance(params, (set, frozenset)):
        warnings.warn("zmuon.Muon: params is a set, whose order changes between runs; pass a "
                      "list (optimizer parameters need to be organized in ordered collections)",
                      FutureWarning, stacklevel=3)


def named_groups(params):
    """`params` as torch-style groups [{"params": [(name, tensor), ...], other keys}], and the
    names made up for unnamed tensors (UNNAMED with torch's index)."""
    _check_collection(params)
    made_up = []
    index = [0]  # torch's index of the next parameter, over all groups

    def pairs(members, names, where):
        if isinstance(members, dict):
            index[0] += len(members)
            return list(members.items())
        members = [members] if _is_tensor(members) else list(members)
        if names is not None:
            names = list(names)
            if len(names) != len(members):
                raise InvalidArgument(f"{where}: {len(names)} param_names for {len(members)} "
                                      "params")
            index[0] += len(members)
            members = [m[1] if isinstance(m, tuple) else m for m in members]
            return list(zip(names, members))
        out = []
        for item in members:
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
                out.append(item)
            elif _is_tensor(item):
                out.append((UNNAMED.format(index[0]), item))
                made_up.append(out[-1][0])
            else:
                raise TypeError(f"{where}: expected tensors, (name, tensor) pairs or a dict "
                                f"name -> tensor, got a {type(item).__name__}")
            index[0] += 1
        return out

    if isinstance(params, dict):
        return [{"params": pairs(params, None, "params")}], made_up
    items = list(params)
    if items and isinstance(items[0], dict):
        out = []
        for i, g in enumerate(items):
            if not isinstance(g, dict) or "params" not in g:
                raise InvalidArgument(f"param group {i} is not a dict with 'params'")
            group = with_algorithm(dict(g), f"param group {i}")
            group["params"] = pairs(g["params"], g.get("param_names"), f"param group {i}")
            group.pop("param_names", None)
            out.append(group)
        return out, made_up
    return [{"params": pairs(items, None, "params")}], made_up


def placement(named, user_groups, made_up, groups):
    """{name: GROUP_*} before the engine starts: zmuon.Muon's groups= and the tensors' own
    use_muon, then each group's use_muon, then the dimension rule for unnamed tensors."""
    for name, _ in named:
        _capi._text(name, "parameter name")  # a NUL would cut the name short in C
    group_of = _groups.resolve_groups(named, groups)
    for g in user_groups:
        if g.get("use_muon") is not None:
            for name, _ in g["params"]:
                group_of[name] = _capi.GROUP_MUON if g["use_muon"] else _capi.GROUP_ADAMW
    rule_by_dimension(named, made_up, group_of)
    return group_of


def rule_by_dimension(named, made_up, group_of):
    """Unnamed parameters that nothing else placed: ndim >= 2 Muon, the rest AdamW (the name
    rule cannot tell embeddings apart without names); one info line with the counts."""
    shapes = {n: tuple(local_of(p).shape) if not hasattr(p, "device_mesh") else tuple(p.shape)
              for n, p in named}
    placed = {"muon": 0, "adamw": 0}
    for name in made_up:
        if name in group_of:
            continue
        muon = len(shapes[name]) >= 2
        group_of[name] = _capi.GROUP_MUON if muon else _capi.GROUP_ADAMW
        placed["muon" if muon else "adamw"] += 1
    if placed["muon"] + placed["adamw"]:
        logger.info("zmuon.Muon: %d parameters without names, by dimension: %d Muon (ndim >= 2), "
                    "%d AdamW; pass model.named_parameters() to keep embeddings and heads on "
                    "AdamW", placed["muon"] + placed["adamw"], placed["muon"], placed["adamw"])


class ParamGroups:
    """zmuon.Muon's half that holds the param groups."""

    def _split_default_groups(self, user_groups):
        """The groups handed to add_param_group: a group without use_muon becomes Muon's and
        AdamW's (the default rule decides) when it is the only one; otherwise all its parameters
        must use one algorithm."""
        out = []
        for i, g in enumerate(user_groups):
            uses = [self._uses_muon(n) for n, _ in g["params"]]
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

    def _uses_muon(self, name):
        if name in self._params_outside:  # zero-size: out of the engine, AdamW as torch's
            return self._group_of.get(name) == _capi.GROUP_MUON
        return self._engine.uses_muon(name)

    def _pairs_of(self, members, names):
        """add_param_group's members as (name, tensor) pairs (an unnamed new one gets
        UNNAMED with its torch index), and the names made up."""
        if isinstance(members, dict):
            return list(members.items()), []
        members = [members] if _is_tensor(members) else list(members)
        names = list(names) if names is not None else None
        pairs, made_up = [], []
        next_index = sum(len(g["params"]) for g in self.param_groups)
        for k, m in enumerate(members):
            if isinstance(m, tuple) and len(m) == 2 and isinstance(m[0], str):
                pairs.append(m)
            elif names is not None:
                pairs.append((names[k], m))
            elif id(m) in self._name_of:
                pairs.append((self._name_of[id(m)], m))
            elif _is_tensor(m):
                name = UNNAMED.format(next_index + k)
                while name in self._shapes:
                    name += "'"
                pairs.append((name, m))
                made_up.append(name)
            else:
                raise TypeError(f"add_param_group: expected tensors or (name, tensor) pairs, "
                                f"got a {type(m).__name__}")
        return pairs, made_up

    def add_param_group(self, param_group):
        """Adds a group: {"params": tensors, named pairs, or tensors with "param_names",
        "use_muon": bool or "algorithm": "muon" | "adamw" (default: the default rule by name,
        or by dimension for unnamed tensors; one algorithm for the whole group),
        hyperparameters (missing ones from `defaults`: lr from "lr" for Muon, "adam_lr" for
        AdamW; eps from "ns_eps" for Muon, "eps" for AdamW)}. At any step: once the engine
        runs, a new parameter restarts it with every state kept (in a torch.distributed job a
        collective: every process adds the same group)."""
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise InvalidArgument("add_param_group: expected a dict with 'params'")
        group = with_algorithm(dict(param_group), "add_param_group")
        members = group.pop("params")
        pairs, made_up = self._pairs_of(members, group.pop("param_names", None))
        taken = {id(p) for g in self.param_groups for p in g["params"]}
        new = []
        for name, p in pairs:
            if id(p) in taken:
                raise ValueError(f"some parameters appear in more than one parameter group "
                                 f"('{name}')")
            if id(p) not in self._name_of or self._name_of[id(p)] != name:
                new.append((name, p))
        if new:
            self._add_parameters(new, group.get("use_muon"), made_up)
        uses = {self._uses_muon(n) for n, _ in pairs}
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
        for name, _ in pairs:  # a restart placed them already
            if name not in self._params_outside and not self._started:
                self._engine.set_hparam_group(name, index)
        d = self.defaults
        group.setdefault("lr", d["lr"] if muon else d["adam_lr"])
        group.setdefault("eps", d["ns_eps"] if muon else d["eps"])
        for key in _groups.GROUP_KEYS:
            group.setdefault(key, d[key])
        if muon:  # a scheduler's cycle_momentum writes betas[0]: Muon's momentum follows it
            group["betas"] = (group["momentum"],) + tuple(group["betas"])[1:]
        group["params"] = [p for _, p in pairs]
        group["param_names"] = [n for n, _ in pairs]
        self.param_groups.append(group)
        self._momentum_seen.append(group["betas"][0] if muon else None)

    def _add_parameters(self, new, use_muon, made_up):
        """Registers `new` (name, tensor) pairs: directly before the engine runs, else by
        restarting it with the state it holds."""
        if self._started and self._mode == _distributed.FSDP:
            self._check_placed_as_rows(new)
        for name, p in new:
            if use_muon is not None:
                self._group_of[name] = _capi.GROUP_MUON if use_muon else _capi.GROUP_ADAMW
        rule_by_dimension(new, made_up, self._group_of)
        if self._started:
            self._restart_engine(new)
            return
        for name, p in new:
            self._register(name, p)

    def _check_placed_as_rows(self, new):
        """A restart of a running engine takes new DTensor parameters only where every one is
        FSDP2's Shard(0) on a 1-D mesh of every process (the placements of the others are read
        once, at construction): else zmuon.Unsupported naming one, before anything changes (in
        every process alike: reading the new placements is a collective)."""
        dtensors = [(n, p) for n, p in new if _distributed.is_dtensor(p)]
        views = dict(self._made_with.get("views") or {})
        if self._mesh is None and _mesh.layout_for(dtensors, views) is None:
            return
        name, p = dtensors[0] if dtensors else new[0]
        where = f"{_mesh.placement_text(p.placements)} on a mesh of " \
            f"{tuple(p.device_mesh.shape)}" if _distributed.is_dtensor(p) else "not a DTensor"
        what = f"'{name}' is placed {where}, not as FSDP2's Shard(0) on a 1-D mesh of every " \
            "process like the other parameters" if self._mesh is None else \
            "the parameters are placed otherwise than FSDP2's Shard(0) on a 1-D mesh of every " \
            f"process ('{name}': {where})"
        raise Unsupported(
            f"add_param_group after the first step: {what}. zmuon reads such placements (HSDP, "
            "tensor and expert parallel) once, when it is made: pass every parameter to "
            "zmuon.Muon (a group at lr 0 keeps some still until their turn)")

    def _follow_cycled_momentum(self):
        """A Muon group's momentum and betas[0] are one value: a scheduler that cycles betas[0]
        (OneCycleLR, CyclicLR with cycle_momentum, as torch.optim.AdamW's) moves Muon's
        momentum, and a momentum set by hand shows in betas[0]."""
        for i, group in enumerate(self.param_groups):
            if not group.get("use_muon"):
                continue
            betas = tuple(group.get("betas", ()))
            seen = self._momentum_seen[i] if i < len(self._momentum_seen) else None
            if betas and seen is not None and betas[0] != seen:
                group["momentum"] = betas[0]
            elif betas and betas[0] != group.get("momentum"):
                group["betas"] = (group["momentum"],) + betas[1:]
            if i < len(self._momentum_seen):
                self._momentum_seen[i] = tuple(group.get("betas", (None,)))[0]
