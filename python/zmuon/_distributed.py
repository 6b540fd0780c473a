"""zmuon.Muon under torch.distributed: joining the job from the process group, and the models
PyTorch distributes, DDP (whole parameters, gradients averaged over the processes) and DTensor
parameters of any placement (FSDP2's `fully_shard`, HSDP, tensor and expert parallel: their
placements are read by zmuon._mesh)."""

import os
import secrets
import socket

from . import _mesh
from ._capi import InvalidArgument

try:
    import torch
    import torch.distributed as dist
except ImportError:  # the numpy path: no torch.distributed
    torch = None
    dist = None

# How a process hands its gradients over and gets its parameters back.
PLAIN = "plain"  # its own gradient (the engine averages over ranks), whole parameters back
DDP = "ddp"      # the gradient averaged by DDP already: no second reduce; whole parameters back
FSDP = "fsdp"    # DTensors: their local tensors in, the local tensors back, in place

_SECRET_KEYS = ("ZMUON_JOB_SECRET", "ZMUON_JOB_SECRET_FILE", "ZMUON_INSECURE")


def is_dtensor(p):
    return torch is not None and type(p).__name__ == "DTensor" and hasattr(p, "to_local")


def local_tensor(t):
    """A DTensor's local tensor, else `t`. The DTensor's own `_local_tensor` where it has one:
    the storage to_local() views, without to_local()'s autograd node (several times cheaper,
    and the step reads every parameter's a few times)."""
    if not is_dtensor(t):
        return t
    local = getattr(t, "_local_tensor", None)
    return local if local is not None else t.to_local()


def module_params(params):
    """model.named_parameters() for a torch.nn.Module (DDP's with the "module." prefix taken
    off, so that names match the unwrapped model's), and whether it is a DDP model."""
    if torch is None or not isinstance(params, torch.nn.Module):
        return params, False
    ddp = isinstance(params, torch.nn.parallel.DistributedDataParallel)
    if ddp:
        return list(params.module.named_parameters()), True
    return list(params.named_parameters()), False


def check_fsdp(named):
    """Every parameter a DTensor (FSDP2, HSDP, tensor or expert parallel): their placements
    are read when the engine starts (zmuon._mesh)."""
    for name, p in named:
        if not is_dtensor(p):
            raise InvalidArgument(f"'{name}' is a plain tensor while others are DTensors: "
                                  "place every parameter (fully_shard, parallelize_module, "
                                  "distribute_tensor), or none")
        _mesh.check_placements(name, p)


def mode_of(named, ddp_module, averaged_grads):
    """PLAIN, DDP or FSDP for these parameters: FSDP2's DTensors, a DDP model or
    averaged_grads=True (the gradients are already averaged over the processes)."""
    if any(is_dtensor(p) for _, p in named):
        check_fsdp(named)
        return FSDP
    if ddp_module or averaged_grads:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            raise InvalidArgument("averaged gradients (a DDP model) need torch.distributed "
                                  "initialized (init_process_group)")
        return DDP
    return PLAIN


def job_of(mode, nodes, node_rank, master, ranks, distributed, engine_of=None):
    """(nodes, node_rank, master) of this process's job: as given; else, where
    torch.distributed runs more than one process (and distributed is not False), the job of its
    default group, a node of one rank per process; else (None, None, None): this process alone.
    DDP and FSDP2 run in the default group's job only."""
    explicit = nodes is not None or node_rank is not None or master is not None
    if mode != PLAIN and (explicit or distributed is False):
        raise InvalidArgument(f"{mode.upper()} runs in the job of torch.distributed's default "
                              "group: leave nodes, node_rank, master and distributed unset")
    if mode != PLAIN and ranks not in (None, 1):
        raise InvalidArgument(f"ranks={ranks}: under {mode.upper()} each process is one rank")
    if explicit or distributed is False or not joined_process_group():
        return nodes, node_rank, master
    if ranks not in (None, 1):
        raise InvalidArgument(f"ranks={ranks}: under torch.distributed each process is one rank "
                              "(or pass distributed=False)")
    return node_from_process_group(engine_of)


def joined_process_group():
    return dist is not None and dist.is_available() and dist.is_initialized() \
        and dist.get_world_size() > 1


def node_from_process_group(engine_of=None):
    """(nodes, node_rank, master) of the zmuon job of torch.distributed's default group: one
    zmuon node a process, process r running rank engine_of[r] (default: r; _mesh.MeshLayout).
    The process of rank 0 picks the rendezvous address (its host, a free port) and, where no
    process was given a secret ($ZMUON_JOB_SECRET, $ZMUON_JOB_SECRET_FILE) nor told
    $ZMUON_INSECURE, a fresh 32-byte secret; both go to every process over the process group
    (docs/SECURITY.md: as private as torch.distributed's own traffic)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    engine_of = list(range(world)) if engine_of is None else list(engine_of)
    first = engine_of.index(0)  # the process that runs rank 0
    mine = [any(os.environ.get(k) for k in _SECRET_KEYS)]
    told = [None] * world
    dist.all_gather_object(told, mine[0])
    if any(told) and not all(told):
        missing = [r for r, t in enumerate(told) if not t]
        raise InvalidArgument(f"processes {missing} have no job secret while others do: set "
                              "$ZMUON_JOB_SECRET or $ZMUON_JOB_SECRET_FILE in every process, "
                              "or in none")
    message = [None, None]
    if rank == first:
        host = os.environ.get("MASTER_ADDR") or socket.gethostname()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        message = [f"{host}:{port}", None if all(told) else secrets.token_hex(32)]
    dist.broadcast_object_list(message, src=first)
    if message[1] is not None:
        os.environ["ZMUON_JOB_SECRET"] = message[1]
    return world, engine_of[rank], message[0]


def fsdp_params():
    """FSDP2's record of each of its parameters (FSDPParam), by id of the parameter: found
    through the state torch.distributed keeps for every fully_shard module. These are
    torch's private structures: where they changed, none is found (and nothing is shared)."""
    try:
        from torch.distributed._composable_state import _module_state_mapping
        out = {}
        for ref in list(_module_state_mapping.values()):
            state = ref()
            groups = getattr(state, "_fsdp_param_groups", None)
            if groups is None:
                group = getattr(state, "_fsdp_param_group", None)
                groups = [group] if group is not None else []
            for group in groups:
                for fp in group.fsdp_params:
                    out[id(fp.sharded_param)] = fp
        return out
    except Exception:  # noqa: BLE001 - a torch without these internals: share nothing
        return {}
