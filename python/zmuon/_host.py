"""What a DeepSpeed config asks of its Python host (docs/CONFIG.md): "auto" values taken from
zmuon.Muon's keywords, the config's scheduler shown in param_groups, and each step's metrics
forwarded to a callback, TensorBoard or Weights & Biases."""

import numbers
import os

from . import _capi
from ._capi import InvalidArgument

# Sections that need an engine made with the host's values (zmuon_engine_create_with_host).
HOST_SECTIONS = ("scheduler", "tensorboard", "wandb", "comet", "csv_monitor")
# zmuon.Muon keywords that resolve a config's "auto" (the C ABI's host_json keys).
HOST_KEYS = ("lr", "muon_lr", "adam_lr", "weight_decay", "momentum", "betas", "eps",
             "gradient_clipping")


def _has_auto(value):
    if isinstance(value, dict):
        return any(_has_auto(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_auto(v) for v in value)
    return value == "auto"


def needs_host(config, on_metrics):
    """Whether the engine must be made with the host's values: the config has "auto", a
    scheduler, a monitor or a metrics file, or the caller wants the metrics."""
    zmuon_section = config.get("zmuon") if isinstance(config.get("zmuon"), dict) else {}
    return (on_metrics is not None or _has_auto(config)
            or any(k in config for k in HOST_SECTIONS) or "metrics_file" in zmuon_section)


def host_values(hyperparameters):
    """The host_json of zmuon_engine_create_with_host: the keywords that can resolve "auto"."""
    values = {"host": "python"}
    for key in HOST_KEYS:
        if key in hyperparameters:
            v = hyperparameters[key]
            values[key] = list(v) if isinstance(v, (tuple, list)) else \
                (v.item() if hasattr(v, "item") else v)
    return values


def _enabled(config, section):
    s = config.get(section)
    return isinstance(s, dict) and bool(s.get("enabled", False))


def _scalars(record):
    """(name, value) of a metrics record's numbers, with the lr per group flattened."""
    for key, value in record.items():
        if key == "lr" and isinstance(value, dict):
            for group, lr in value.items():
                yield f"lr/{group}", lr
        elif isinstance(value, numbers.Number) and not isinstance(value, bool) and key != "step":
            yield key, value
        elif isinstance(value, bool):
            yield key, int(value)


def _tensorboard(section):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise InvalidArgument("the config enables tensorboard, but torch.utils.tensorboard "
                              f"cannot be imported here ({e}): install the tensorboard package "
                              "or set tensorboard.enabled to false") from None
    writer = SummaryWriter(os.path.join(section.get("output_path") or "runs",
                                        section.get("job_name") or "zmuon"))

    def write(record):
        for name, value in _scalars(record):
            writer.add_scalar(f"Train/{name}", value, record["step"])
        writer.flush()
    return write


def _wandb(section):
    try:
        import wandb
    except ImportError as e:
        raise InvalidArgument(f"the config enables wandb, but wandb cannot be imported here "
                              f"({e}): install it or set wandb.enabled to false") from None
    if wandb.run is None:
        wandb.init(project=section.get("project"), group=section.get("group"),
                   entity=section.get("team"))

    def write(record):
        wandb.log(dict(_scalars(record)), step=record["step"])
    return write


def metrics_sinks(config, on_metrics):
    """The callables each step's record goes to: `on_metrics` and the config's monitors that
    live in Python (tensorboard, wandb). comet is refused by name: zmuon has no writer for it."""
    sinks = [] if on_metrics is None else [on_metrics]
    if _enabled(config, "tensorboard"):
        sinks.append(_tensorboard(config["tensorboard"]))
    if _enabled(config, "wandb"):
        sinks.append(_wandb(config["wandb"]))
    if _enabled(config, "comet"):
        raise InvalidArgument("the config enables comet: zmuon.Muon forwards metrics to "
                              "on_metrics=, tensorboard and wandb only")
    return sinks


def forward_metrics(engine, sinks):
    """Each step's record (a dict) to every sink, from inside engine.step()."""
    if not sinks:
        return

    def forward(record):
        for sink in sinks:
            sink(record)
    _capi.set_metrics_callback(engine, forward)


class ScheduleView:
    """Keeps each param group's "lr" equal to the config scheduler's rate for its algorithm, so
    that a logger or a torch scheduler reads what the next step uses. A group whose "lr" the
    caller has changed since is left to the caller from then on."""

    def __init__(self, engine):
        self._engine = engine
        self._shown = {}  # group index -> the lr last written there

    def show(self, param_groups):
        muon_lr, adam_lr = _capi.engine_next_lrs(self._engine)
        for i, group in enumerate(param_groups):
            if i in self._shown and group["lr"] != self._shown[i]:
                self._shown[i] = None  # the caller drives this group now
            if self._shown.get(i, 0.0) is None:
                continue
            group["lr"] = muon_lr if group.get("use_muon") else adam_lr
            self._shown[i] = group["lr"]
