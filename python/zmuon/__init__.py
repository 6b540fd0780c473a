"""zmuon: the Muon optimizer under ZeRO-3 sharding (a C++ actor engine), for Python hosts.

zmuon.Muon is shaped like a torch.optim optimizer; zmuon.Engine is the C ABI one call per method;
zmuon.newton_schulz (and zmuon.Orthogonalizer) is zmuon's Newton-Schulz alone, without an engine.
None needs PyTorch or numpy to import: buffers go over by data pointer.
"""

from ._capi import (HOST, BadState, CommFailure, DeviceFailure, DuplicateParameter, Engine,
                    InternalError,
                    InvalidArgument, IOFailure, ShapeMismatch, Timeout, UnknownParameter,
                    Unsupported, ZmuonError, version)
from .optim import Muon, buffer_of
from .orthogonalize import Orthogonalizer, newton_schulz

__all__ = ["Muon", "Engine", "buffer_of", "newton_schulz", "Orthogonalizer", "version", "HOST",
           "ZmuonError", "InvalidArgument",
           "UnknownParameter", "DuplicateParameter", "ShapeMismatch", "BadState", "CommFailure",
           "Timeout", "IOFailure", "InternalError", "Unsupported", "DeviceFailure"]
