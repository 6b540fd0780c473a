"""zmuon: the Muon optimizer under ZeRO-3 sharding (a C++ actor engine), for Python hosts.

zmuon.Muon is a torch.optim.Optimizer where PyTorch is importable (docs/PYTORCH.md), a plain
class on numpy arrays otherwise; zmuon.Engine is the C ABI one call per method; zmuon.newton_schulz
(and zmuon.Orthogonalizer) is zmuon's Newton-Schulz alone, without an engine. Buffers go over by
data pointer; PyTorch is imported when installed, numpy never.
"""

from ._capi import (HOST, BadState, CommFailure, DeviceFailure, DuplicateParameter, Engine,
                    InternalError,
                    InvalidArgument, IOFailure, ShapeMismatch, Timeout, UnknownParameter,
                    Unsupported, ZmuonError, version)
from .optim import Muon, buffer_of
from .orthogonalize import Orthogonalizer, newton_schulz
from ._log import set_log_level  # and the library's log goes to logging.getLogger("zmuon")

__all__ = ["Muon", "Engine", "buffer_of", "newton_schulz", "Orthogonalizer", "version",
           "set_log_level", "HOST",
           "ZmuonError", "InvalidArgument",
           "UnknownParameter", "DuplicateParameter", "ShapeMismatch", "BadState", "CommFailure",
           "Timeout", "IOFailure", "InternalError", "Unsupported", "DeviceFailure"]
