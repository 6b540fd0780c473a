"""zmuon.newton_schulz: zmuon's Newton-Schulz on numpy arrays and torch tensors, no engine.

    o = zmuon.newton_schulz(g)                       # a new array/tensor, g unchanged
    zmuon.newton_schulz(g, out=g)                    # in place
    zmuon.newton_schulz(g, steps=5, variant="standard", coefficients=(3.4445, -4.775, 2.0315))

`x` is [rows, cols] or [batch, rows, cols]: a float32 numpy array (numpy has no bfloat16), or a
torch tensor of float32 or bfloat16 on the CPU (host backend, fp32 arithmetic) or on a GPU (cuda
backend, bf16 arithmetic with fp32 sums, ordered on PyTorch's current stream without waiting).
The options are the config's NS keys without the "ns_", checked by the config's schema (a bad
value raises zmuon.InvalidArgument naming it); None keeps the engine's default. A backend per
(backend, device) is kept for the process, so repeated calls reuse its workspace. An input with
a NaN or an infinity raises zmuon.InvalidArgument naming the first one's index (numpy arrays and
CPU tensors, checked before anything runs; `out` is then untouched). CUDA tensors are not
checked (that would wait for the GPU): there a matrix with a NaN or an infinity comes back all
NaN.
"""

import json
import sys
import threading

from . import _capi
from ._capi import BFLOAT16, FLOAT32, HOST
from ._buffers import is_torch as _is_torch

_cache = {}  # (backend, device) -> (Orthogonalizer, lock)
_cache_lock = threading.Lock()

_OPTION_KEYS = (("steps", "ns_steps"), ("coefficients", "ns_coefficients"),
                ("schedule", "ns_schedule"), ("variant", "ns_variant"),
                ("gram_restart", "ns_gram_restart"))


def _plain(v):
    """numpy and torch scalars as Python numbers (for json); lists and tuples element-wise."""
    if isinstance(v, (list, tuple)):
        return [_plain(e) for e in v]
    return v.item() if hasattr(v, "item") else v


def _options_json(**options):
    """The options given (not None) as the JSON of the config's NS keys; the engine's schema
    checks their types and values."""
    ns = {name: _plain(options[key]) for key, name in _OPTION_KEYS
          if options.get(key) is not None}
    return json.dumps(ns, sort_keys=True)


def _describe(x, what):
    """(data pointer, dtype code, shape, device, backend, is_torch, writable) of x."""
    if _is_torch(x):
        dtype = {"torch.float32": FLOAT32, "torch.bfloat16": BFLOAT16}.get(str(x.dtype))
        if dtype is None:
            raise TypeError(f"{what}: zmuon.newton_schulz takes float32 or bfloat16 tensors, "
                            f"got {x.dtype}")
        if x.is_cuda:
            device = x.device.index if x.device.index is not None else 0
            return x.data_ptr(), dtype, tuple(x.shape), device, "cuda", True, True
        if x.device.type != "cpu":
            raise TypeError(f"{what}: tensors on '{x.device.type}' are not supported (cpu or cuda)")
        return x.data_ptr(), dtype, tuple(x.shape), HOST, "host", True, True
    ai = getattr(x, "__array_interface__", None)
    if ai is None:
        raise TypeError(f"{what}: expected a numpy array or a torch tensor, got "
                        f"{type(x).__name__}")
    if ai["typestr"] != "<f4":
        raise TypeError(f"{what}: zmuon.newton_schulz takes float32 numpy arrays (numpy has no "
                        f"bfloat16; torch.bfloat16 tensors are taken), got dtype "
                        f"'{ai['typestr']}'")
    ptr, readonly = ai["data"]
    return ptr, FLOAT32, tuple(ai["shape"]), HOST, "host", False, not readonly


def _contiguous(x):
    if _is_torch(x):
        return x.is_contiguous()
    strides = x.__array_interface__.get("strides")
    if strides is None:
        return True
    expected, step = [], 4
    for d in reversed(x.shape):
        expected.append(step)
        step *= d
    return tuple(strides) == tuple(reversed(expected))


def _orthogonalizer(backend, device):
    key = (backend, device)
    with _cache_lock:
        if key not in _cache:
            _cache[key] = (_capi.Orthogonalizer(backend, device), threading.Lock())
        return _cache[key]


def _check_finite(x, torch_like, device, who):
    """InvalidArgument naming the first NaN or infinity of a host input (numpy array or CPU
    tensor); CUDA tensors are not checked (that would wait for the GPU)."""
    if device != HOST:
        return
    if torch_like:
        finite = sys.modules["torch"].isfinite(x.detach())
        if bool(finite.all()):
            return
        first = (~finite).nonzero()[0].tolist()
    else:
        import numpy  # pylint: disable=import-outside-toplevel  # x is a numpy array
        finite = numpy.isfinite(numpy.asarray(x))
        if finite.all():
            return
        first = numpy.argwhere(~finite)[0].tolist()
    index = tuple(int(i) for i in first)
    raise _capi.InvalidArgument(f"{who}: the input has non-finite values (first at index "
                                f"{index})")


def _prepare(x, out, who="newton_schulz"):
    """The contiguous buffer the call works on and x's description: `out` (x copied into it
    unless it is x) or a new contiguous copy of x. A host x with a NaN or an infinity raises
    zmuon.InvalidArgument first."""
    ptr, dtype, shape, device, backend, torch_like, _ = _describe(x, "x")
    _check_finite(x, torch_like, device, who)
    if out is None:
        if torch_like:
            out = x.detach().clone(memory_format=sys.modules["torch"].contiguous_format)
        else:
            out = x.copy(order="C")
        return out, dtype, shape, device, backend
    _, odtype, oshape, odevice, _, _, writable = _describe(out, "out")
    if (odtype, oshape, odevice) != (dtype, shape, device):
        raise ValueError(f"out: expected the dtype, shape and device of x "
                         f"({dtype}, {shape}, {device}), got ({odtype}, {oshape}, {odevice})")
    if not _contiguous(out):
        raise ValueError("out: not contiguous (zmuon works on contiguous memory)")
    if not writable:
        raise ValueError("out: the array is read-only")
    if out is not x:
        if torch_like:
            out.copy_(x)
        else:
            out[...] = x
    return out, dtype, shape, device, backend


def _run(ortho, out, dtype, shape, device):
    """One call on `out` (already prepared); torch CUDA tensors on PyTorch's current stream."""
    stream = None
    if device != HOST:
        stream = sys.modules["torch"].cuda.current_stream(out.device).cuda_stream
    ortho.run(_describe(out, "out")[0], dtype, shape, device, stream)


def newton_schulz(x, *, steps=None, coefficients=None, schedule=None, variant=None,
                  gram_restart=None, out=None):
    """Orthogonalizes x's matrices with zmuon's Newton-Schulz; returns `out` (by default a new
    contiguous array/tensor like x; `out=x` works in place). Options: `steps` (ns_steps),
    `coefficients` (a, b, c), `schedule` ("none", "polar_express" or one (a, b, c) per step),
    `variant` ("standard", "gram", "auto"), `gram_restart`; see the README's config keys."""
    options = _options_json(steps=steps, coefficients=coefficients, schedule=schedule,
                            variant=variant, gram_restart=gram_restart)
    out, dtype, shape, device, backend = _prepare(x, out)
    ortho, lock = _orthogonalizer(backend, 0 if device == HOST else device)
    with lock:
        if ortho.options_json != options:
            ortho.set_options(options)
        _run(ortho, out, dtype, shape, device)
    return out


class Orthogonalizer(_capi.Orthogonalizer):
    """A backend of its own with fixed options, called like newton_schulz:
    `ns = zmuon.Orthogonalizer("cuda", 0, steps=5); ns(x, out=x)`."""

    def __init__(self, backend="host", device=0, *, steps=None, coefficients=None,
                 schedule=None, variant=None, gram_restart=None):
        super().__init__(backend, device, _options_json(
            steps=steps, coefficients=coefficients, schedule=schedule, variant=variant,
            gram_restart=gram_restart))
        self._lock = threading.Lock()

    def __call__(self, x, out=None):
        out, dtype, shape, device, _ = _prepare(x, out, "Orthogonalizer")
        with self._lock:
            _run(self, out, dtype, shape, device)
        return out
