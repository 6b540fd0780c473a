"""Buffers as the C ABI takes them: numpy arrays and torch tensors by data pointer, and the CUDA
stream PyTorch writes them on. PyTorch is never imported here: it is found in sys.modules."""

import operator
import sys

from ._capi import HOST


def is_torch(obj):
    return hasattr(obj, "data_ptr") and hasattr(obj, "is_cuda")


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def synchronize_torch(tensors):
    """Waits for PyTorch's queued CUDA work when any of `tensors` is a torch CUDA tensor (then
    torch is imported), so that the engine reads finished gradients."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    for device in {t.device for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda}:
        torch.cuda.synchronize(device)  # their GPU's, not the current one's


def entries_devices(entries):
    """The CUDA devices that the engine's (name, pointer, numel, device) entries lie on."""
    devices = set(map(_device_of, entries))
    devices.discard(HOST)
    return devices


def current_stream(devices):
    """PyTorch's current CUDA stream (an int) of the one CUDA device in `devices`; None where
    there are none or several."""
    torch = sys.modules.get("torch")
    if torch is None or len(devices) != 1:
        return None
    return torch.cuda.current_stream(next(iter(devices))).cuda_stream


_device_of = operator.itemgetter(3)
dtype_of = operator.attrgetter("dtype")
local_tensor_of = operator.attrgetter("_local_tensor")  # a DTensor's local tensor


def buffer_of(obj, what, writable=False):
    """(data pointer, numel, device, shape) of a float32 contiguous numpy array or torch tensor."""
    if is_torch(obj):
        if str(obj.dtype) != "torch.float32":
            raise TypeError(f"{what}: zmuon takes float32 tensors, got {obj.dtype}")
        if not obj.is_contiguous():
            raise ValueError(f"{what}: the tensor is not contiguous (call .contiguous())")
        device = HOST
        if obj.is_cuda:
            device = obj.device.index if obj.device.index is not None else 0
        elif obj.device.type != "cpu":
            raise TypeError(f"{what}: tensors on '{obj.device.type}' are not supported "
                            "(cpu or cuda)")
        return obj.data_ptr(), obj.numel(), device, tuple(obj.shape)
    ai = getattr(obj, "__array_interface__", None)
    if ai is None:
        raise TypeError(f"{what}: expected a numpy array or a torch tensor, "
                        f"got {type(obj).__name__}")
    if ai["typestr"] != "<f4":
        raise TypeError(f"{what}: zmuon takes float32 arrays, got dtype '{ai['typestr']}'")
    shape = tuple(ai["shape"])
    strides = ai.get("strides")
    if strides is not None and tuple(strides) != _c_strides(shape, 4):
        raise ValueError(f"{what}: the array is not C-contiguous "
                         "(numpy.ascontiguousarray makes it so)")
    ptr, readonly = ai["data"]
    if writable and readonly:
        raise ValueError(f"{what}: the array is read-only")
    numel = 1
    for d in shape:
        numel *= d
    return ptr, numel, HOST, shape
