"""Parameter groups: which algorithm each parameter uses, and each group's hyperparameters as
the engine takes them at every step."""

import difflib
import json
import math
import numbers

from . import _capi
from ._capi import InvalidArgument, UnknownParameter

FLOAT32_MAX = 3.4028234663852886e38  # the engine takes hyperparameters as float32

GROUPS = {"auto": _capi.GROUP_AUTO, "muon": _capi.GROUP_MUON, "adamw": _capi.GROUP_ADAMW}

# The keys every param group carries. Which algorithm reads which:
MUON_KEYS = ("lr", "weight_decay", "momentum", "nesterov", "eps", "ns_steps", "ns_coefficients",
             "ns_variant", "adjust_lr", "qk_clip_tau")
ADAMW_KEYS = ("lr", "weight_decay", "betas", "eps")
GROUP_KEYS = ("lr", "weight_decay", "momentum", "nesterov", "betas", "eps", "ns_steps",
              "ns_coefficients", "ns_variant", "adjust_lr", "qk_clip_tau")

NS_VARIANTS = ("standard", "gram", "auto")
ADJUST_LR = tuple(_capi.ADJUST_LR)

# The engine's defaults (zmuon/options.hpp), for keys a config leaves out.
ENGINE_DEFAULTS = {"lr": 0.02, "adam_lr": 3e-4, "weight_decay": 0.0, "momentum": 0.95,
                   "nesterov": True, "betas": (0.9, 0.95), "eps": 1e-10, "ns_eps": 1e-7,
                   "ns_steps": 5, "ns_coefficients": (3.4445, -4.7750, 2.0315),
                   "ns_variant": "auto", "adjust_lr": "original", "qk_clip_tau": 0.0}

# The update rule per group (zmuon_update_rule): cautious weight decay (arXiv:2510.12402; both
# algorithms read it) and the Muon variant with NorMuon's beta2 and eps (arXiv:2510.05491).
RULE_KEYS = _capi.RULE_FIELDS
MUON_VARIANTS = tuple(_capi.MUON_VARIANTS)
ENGINE_DEFAULTS.update({"cautious_weight_decay": False, "variant": "muon", "normuon_beta2": 0.95,
                        "normuon_eps": 1e-8, "algorithm": "adamw"})
# A group's `algorithm` (Dion's key): "muon", or the rule of its non-Muon parameters.
SCALAR_ALGORITHMS = tuple(_capi.SCALAR_ALGORITHMS)
ALGORITHMS = ("muon",) + SCALAR_ALGORITHMS
MUON_KEYS = MUON_KEYS + RULE_KEYS
ADAMW_KEYS = ADAMW_KEYS + ("cautious_weight_decay", "algorithm")
GROUP_KEYS = GROUP_KEYS + RULE_KEYS


UNNAMED = "param.{}"  # the name of an unnamed parameter: its index as torch numbers them


def is_made_up(name):
    """Whether `name` is one zmuon gave an unnamed tensor (UNNAMED, primed where taken)."""
    head, _, index = str(name).rstrip("'").partition(".")
    return head == "param" and index.isdigit()


def suggestion(name, names):
    """' (did you mean 'x'?)' for the nearest of `names`, or ''."""
    close = difflib.get_close_matches(str(name), [str(n) for n in names], n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def hyperparameter_override(key, value):
    """The override a keyword hyperparameter becomes: optimizer.params.KEY=<value as JSON>."""
    def plain(v):  # numpy and torch scalars
        if hasattr(v, "item"):
            count = v.numel() if callable(getattr(v, "numel", None)) else getattr(v, "size", 1)
            if count != 1:
                raise InvalidArgument(f"zmuon.Muon({key}=...): a tensor or array must hold one "
                                      f"element, got shape {tuple(v.shape)}")
            return v.item()
        raise TypeError(f"zmuon.Muon({key}=...): {type(v).__name__} is not a number, bool, "
                        "string or list of those")
    return f"optimizer.params.{key}={json.dumps(value, default=plain)}"


def defaults_of(config, overrides):
    """The optimizer defaults a config and its overrides set (the engine checked them)."""
    params = dict(config.get("optimizer", {}).get("params", {})) if isinstance(config, dict) \
        else {}
    for o in overrides:
        key, _, value = o.partition("=")
        key = key[len("optimizer.params."):] if key.startswith("optimizer.params.") else key
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value
    # DeepSpeed's rule: "lr" for both algorithms, unless muon_lr / adam_lr say otherwise.
    # ("auto" the engine resolves; the caller takes the engine's rates over these.)
    common = params.get("lr")
    params["lr"] = params.get("muon_lr", common)
    params["adam_lr"] = params.get("adam_lr", common)
    params = {k: v for k, v in params.items() if v is not None and v != "auto"}
    out = dict(ENGINE_DEFAULTS)
    for key in out:
        if key in params and key != "ns_eps":
            out[key] = params[key]
    out["betas"] = tuple(out["betas"])
    out["ns_coefficients"] = tuple(out["ns_coefficients"])
    if out["ns_variant"] == "automatic":
        out["ns_variant"] = "auto"
    if isinstance(out["variant"], str):
        out["variant"] = out["variant"].lower()  # the config takes any case
    return out


def _real(value):
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):  # not one element
            pass
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return None


def number(value, what, low=0.0, high=None, low_open=False):
    """`value` (a Python, numpy or torch scalar) as a float32-sized float in range; else
    InvalidArgument naming `what` and the value."""
    x = _real(value)
    ok = x is not None and math.isfinite(x) and (x > low if low_open else x >= low) \
        and (high is None or x < high)
    if not ok:
        rule = f"> {low}" if low_open else f">= {low:g}"
        if high is not None:
            rule += f" and < {high:g}"
        raise InvalidArgument(f"{what} must be a finite number {rule}, got {value!r}")
    if abs(x) > FLOAT32_MAX:
        raise InvalidArgument(f"{what} must be a finite number {'>= 0' if low == 0 else ''}, "
                              f"got {value!r} (beyond float32's range)")
    return x


def learning_rate(value, what):
    return number(value, what)


def checked_group(group, i):
    """Group i's hyperparameters, checked, as plain values of the keys its algorithm reads."""
    where = f"param_groups[{i}]"

    def get(key):
        if key not in group:
            raise InvalidArgument(f"{where} has no '{key}'")
        return group[key]

    out = {"lr": number(get("lr"), f"{where}['lr']"),
           "weight_decay": number(get("weight_decay"), f"{where}['weight_decay']")}
    if group.get("use_muon"):
        out["momentum"] = number(get("momentum"), f"{where}['momentum']", high=1.0)
        nesterov = get("nesterov")
        if not isinstance(nesterov, bool):
            raise InvalidArgument(f"{where}['nesterov'] must be True or False, got {nesterov!r}")
        out["nesterov"] = nesterov
        out["eps"] = number(get("eps"), f"{where}['eps']")
        steps = get("ns_steps")
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) \
                or not 1 <= int(steps) <= 100:
            raise InvalidArgument(f"{where}['ns_steps'] must be an integer in [1, 100], "
                                  f"got {steps!r}")
        out["ns_steps"] = int(steps)
        coefficients = get("ns_coefficients")
        try:
            coefficients = tuple(coefficients)
        except TypeError:
            coefficients = ()
        if len(coefficients) != 3:
            raise InvalidArgument(f"{where}['ns_coefficients'] must be (a, b, c), got "
                                  f"{group['ns_coefficients']!r}")
        out["ns_coefficients"] = tuple(
            number(c, f"{where}['ns_coefficients'][{k}]", low=-FLOAT32_MAX)
            for k, c in enumerate(coefficients))
        for key, allowed in (("ns_variant", NS_VARIANTS), ("adjust_lr", ADJUST_LR)):
            value = get(key)
            if value not in allowed:
                raise InvalidArgument(f"{where}['{key}'] must be one of {', '.join(allowed)}; "
                                      f"got {value!r}{suggestion(value, allowed)}")
            out[key] = value
        out["qk_clip_tau"] = number(group.get("qk_clip_tau", 0.0), f"{where}['qk_clip_tau']")
    else:
        betas = get("betas")
        try:
            betas = tuple(betas)
        except TypeError:
            betas = ()
        if len(betas) != 2:
            raise InvalidArgument(f"{where}['betas'] must be (beta1, beta2), got "
                                  f"{group['betas']!r}")
        out["betas"] = tuple(number(b, f"{where}['betas'][{k}]", high=1.0)
                             for k, b in enumerate(betas))
        out["eps"] = number(get("eps"), f"{where}['eps']", low_open=True)
    out.update(checked_rule(group, where))
    return out


def checked_rule(group, where):
    """A group's update rule, checked (a group without these keys runs the engine's defaults)."""
    d = ENGINE_DEFAULTS
    cautious = group.get("cautious_weight_decay", d["cautious_weight_decay"])
    if not isinstance(cautious, bool):
        raise InvalidArgument(f"{where}['cautious_weight_decay'] must be True or False, got "
                              f"{cautious!r}")
    variant = group.get("variant", d["variant"])
    if variant not in MUON_VARIANTS:
        raise InvalidArgument(f"{where}['variant'] must be one of {', '.join(MUON_VARIANTS)}; "
                              f"got {variant!r}{suggestion(variant, MUON_VARIANTS)}")
    algorithm = group.get("algorithm", d["algorithm"])
    if isinstance(algorithm, str):  # Dion's spelling ("AdamW") as torch's group key
        algorithm = algorithm.lower()
    if algorithm not in ALGORITHMS:
        raise InvalidArgument(f"{where}['algorithm'] must be one of {', '.join(ALGORITHMS)}; "
                              f"got {algorithm!r}{suggestion(algorithm, ALGORITHMS)}")
    if algorithm == "muon":  # a Muon group's non-Muon parameters (if any) take AdamW
        algorithm = "adamw"
    return {"cautious_weight_decay": cautious, "variant": variant, "algorithm": algorithm,
            "normuon_beta2": number(group.get("normuon_beta2", d["normuon_beta2"]),
                                    f"{where}['normuon_beta2']", high=1.0),
            "normuon_eps": number(group.get("normuon_eps", d["normuon_eps"]),
                                  f"{where}['normuon_eps']", low_open=True)}


_PLAIN = frozenset((float, int, bool, str, type(None)))
_SEQUENCES = frozenset((tuple, list))


def groups_key(param_groups):
    """The groups' hyperparameters as one value that compares equal while none changed, to
    skip engine_values' checks on a step whose groups are those of the last; None where a
    value is not a plain Python one (a tensor's or an array's, which can change in place)."""
    key = []
    for group in param_groups:
        values = dict(group)
        values.pop("params", None)
        kinds = set(map(type, values.values()))
        if not kinds <= _PLAIN:
            if not kinds <= _PLAIN | _SEQUENCES:
                return None
            for k, v in values.items():
                if type(v) in _SEQUENCES:
                    if not _PLAIN.issuperset(map(type, v)):
                        return None
                    values[k] = tuple(v)  # a list's later change in place shows
        key.append(values)
    return key


def engine_values(param_groups):
    """Every group's hyperparameters as the engine takes them (zmuon_group_hparams fields, by
    group index), checked: InvalidArgument names a bad one. A Muon group's `eps` is Newton-Schulz's;
    the keys its algorithm does not read go over as the engine's defaults (unused)."""
    d = ENGINE_DEFAULTS
    out = []
    for i, group in enumerate(param_groups):
        v = checked_group(group, i)
        values = {"lr": v["lr"], "weight_decay": v["weight_decay"],
                  "momentum": d["momentum"], "nesterov": d["nesterov"],
                  "beta1": d["betas"][0], "beta2": d["betas"][1], "eps": d["eps"],
                  "ns_steps": d["ns_steps"], "ns_coefficients": d["ns_coefficients"],
                  "ns_eps": d["ns_eps"], "ns_variant": d["ns_variant"],
                  "adjust_lr": d["adjust_lr"], "qk_clip_tau": d["qk_clip_tau"]}
        if group.get("use_muon"):
            values.update(momentum=v["momentum"], nesterov=v["nesterov"], ns_steps=v["ns_steps"],
                          ns_coefficients=v["ns_coefficients"], ns_eps=v["eps"],
                          ns_variant=v["ns_variant"], adjust_lr=v["adjust_lr"],
                          qk_clip_tau=v["qk_clip_tau"])
        else:
            values.update(beta1=v["betas"][0], beta2=v["betas"][1], eps=v["eps"])
        values.update({k: v[k] for k in RULE_KEYS})
        out.append(values)
    return out


def resolve_groups(named, groups):
    """{name: GROUP_*} from `groups` (zmuon.Muon's groups= argument) and the tensors' own
    `use_muon` attributes (as DeepSpeed sets them)."""
    by_id = {id(p): n for n, p in named}
    out = {}
    for name, p in named:
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
                                   f"{suggestion(name, names)}")

    if isinstance(groups, dict):
        for name, g in groups.items():
            known_name(name, "groups")
            if not isinstance(g, str) or g not in GROUPS:
                raise InvalidArgument(f"group of '{name}' is {g!r}: use 'muon', 'adamw' or "
                                      "'auto'")
            out[name] = GROUPS[g]
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
