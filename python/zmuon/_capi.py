"""ctypes binding of zmuon's C ABI (include/zmuon/zmuon.h) and the Python exceptions.

The shared library is looked up, in order: $ZMUON_LIBRARY; libzmuon.so inside this package (a
wheel or `pip install .`); libzmuon.so next to this package as installed by `cmake --install`
(<prefix>/lib/zmuon/python/zmuon -> <prefix>/lib); the loader's search path
(ctypes.util.find_library).

A release wheel (tools/wheel/build-wheel.sh) carries two libraries: libzmuon.so with the CUDA
backend, which needs CUDA's libraries, and libzmuon_cpu.so without it. CUDA's libraries are those
of the nvidia-* wheels torch installs (nvidia/cu13/lib, nvidia/nccl/lib on sys.path), loaded
first, else the system's. Where neither is found, libzmuon_cpu.so is loaded:
`library_path` says which one is in use, `cuda_missing` why the CUDA one was not.
"""

import array
import ctypes
import ctypes.util
import functools
import os
import re
import threading

HOST = -1  # zmuon_tensor.device for host memory
HAND_OVER_REDUCED, HAND_OVER_KEPT_UNTIL_STEP, HAND_OVER_AHEAD_OF_STEP = 1, 2, 4  # its flags

FLOAT32, BFLOAT16 = 0, 1  # zmuon_array.dtype

GROUP_AUTO, GROUP_MUON, GROUP_ADAMW = 0, 1, 2


class ZmuonError(Exception):
    """An error reported by the zmuon engine; `code` is the C ABI status name."""

    code = "internal"

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code


class InvalidArgument(ZmuonError, ValueError):
    code = "invalid_argument"


class UnknownParameter(ZmuonError, ValueError):
    code = "unknown_parameter"


class DuplicateParameter(ZmuonError, ValueError):
    code = "duplicate_parameter"


class ShapeMismatch(ZmuonError, ValueError):
    code = "shape_mismatch"


class BadState(ZmuonError, RuntimeError):
    code = "bad_state"


class CommFailure(ZmuonError, RuntimeError):
    code = "comm_failure"


class Timeout(ZmuonError, TimeoutError):
    code = "timeout"


class IOFailure(ZmuonError, OSError):
    code = "io_error"


class InternalError(ZmuonError, RuntimeError):
    code = "internal"


class Unsupported(ZmuonError, NotImplementedError):
    """Valid, but not available in this build or backend (e.g. CUDA buffers on the CPU engine)."""

    code = "unsupported"


class DeviceFailure(ZmuonError, RuntimeError):
    """A CUDA, cuBLAS or NCCL call failed; the rank's GPU state is lost."""

    code = "device_failure"


# Status code -> exception class, in the order of zmuon_status.
_ERRORS = [None, InvalidArgument, UnknownParameter, DuplicateParameter, ShapeMismatch, BadState,
           CommFailure, Timeout, IOFailure, InternalError, Unsupported, DeviceFailure]


class Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("data", ctypes.c_void_p), ("numel", ctypes.c_int64),
                ("device", ctypes.c_int32)]


class Array(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("device", ctypes.c_int32)]


class StepInfo(ctypes.Structure):
    _fields_ = [("step", ctypes.c_uint64), ("skipped", ctypes.c_int32),
                ("grad_norm", ctypes.c_double), ("clip_coef", ctypes.c_float),
                ("loss_scale", ctypes.c_float), ("next_loss_scale", ctypes.c_float),
                ("micro_batches", ctypes.c_int32), ("ns_params", ctypes.c_int32),
                ("ns_matrices", ctypes.c_int64)]

    def as_dict(self):
        return {name: (bool(getattr(self, name)) if name == "skipped" else getattr(self, name))
                for name, _ in self._fields_}


NS_VARIANTS = {"standard": 0, "gram": 1, "auto": 2}  # zmuon_ns_variant
ADJUST_LR = {"original": 0, "match_rms_adamw": 1, "spectral": 2, "rms": 3}  # zmuon_adjust_lr
MATRIX_VIEWS = {"auto": 0, "expert_stack": 1, "flatten": 2}  # zmuon_matrix_view


class GroupHparams(ctypes.Structure):
    """zmuon_group_hparams: one hyperparameter group's values."""
    _fields_ = [("lr", ctypes.c_float), ("weight_decay", ctypes.c_float),
                ("momentum", ctypes.c_float), ("nesterov", ctypes.c_int32),
                ("beta1", ctypes.c_float), ("beta2", ctypes.c_float), ("eps", ctypes.c_float),
                ("ns_steps", ctypes.c_int32), ("ns_coefficients", ctypes.c_float * 3),
                ("ns_eps", ctypes.c_float), ("ns_variant", ctypes.c_int32),
                ("adjust_lr", ctypes.c_int32), ("qk_clip_tau", ctypes.c_float)]


MUON_VARIANTS = {"muon": 0, "normuon": 1}  # zmuon_muon_variant
SCALAR_ALGORITHMS = {"adamw": 0, "lion": 1}  # zmuon_scalar_algorithm: the non-Muon parameters' rule
# The update-rule keys of a group's values (zmuon_update_rule), beside GroupHparams' fields.
RULE_FIELDS = ("cautious_weight_decay", "variant", "normuon_beta2", "normuon_eps", "algorithm")


class UpdateRule(ctypes.Structure):
    """zmuon_update_rule: cautious weight decay and the Muon variant (NorMuon) of a group."""
    _fields_ = [("cautious_weight_decay", ctypes.c_int32), ("variant", ctypes.c_int32),
                ("normuon_beta2", ctypes.c_float), ("normuon_eps", ctypes.c_float),
                ("algorithm", ctypes.c_int32)]


class RowMoments(ctypes.Structure):
    """zmuon_row_moments: NorMuon's row second moments of one Muon parameter."""
    _fields_ = [("name", ctypes.c_char_p), ("values", ctypes.c_void_p), ("rows", ctypes.c_int64)]


def _find_library():
    env = os.environ.get("ZMUON_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "libzmuon.so"),
                      os.path.join(here, "..", "..", "..", "libzmuon.so")):
        if os.path.exists(candidate):
            return os.path.normpath(candidate)
    found = ctypes.util.find_library("zmuon")
    if found:
        return found
    raise ImportError("zmuon: libzmuon.so not found; set ZMUON_LIBRARY to its path "
                      "(build/src/embed/libzmuon.so in a build tree, <prefix>/lib/libzmuon.so "
                      "after cmake --install)")


# The CUDA libraries libzmuon.so links, as the nvidia-* wheels for CUDA 13 lay them out under
# site-packages/nvidia/, in load order (cuBLAS needs cuBLASLt).
_NVIDIA_LIBRARIES = ("cu13/lib/libcudart.so.13", "cu13/lib/libcublasLt.so.13",
                     "cu13/lib/libcublas.so.13", "nccl/lib/libnccl.so.2")

library_path = None  # the library loaded
cuda_missing = None  # why a wheel's CUDA library did not load (None: it did, or no wheel)


def _preload_nvidia_wheels():
    """dlopens the nvidia-* wheels' CUDA libraries found on sys.path (none imported), so that
    libzmuon.so's dependencies resolve to them by name."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return
    for base in (spec.submodule_search_locations or []) if spec else []:
        for relative in _NVIDIA_LIBRARIES:
            path = os.path.join(base, relative)
            if os.path.exists(path):
                try:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    pass  # libzmuon.so's own load then names what is missing


def _open(path):
    """The library at `path`; inside a wheel, libzmuon_cpu.so where libzmuon.so cannot load."""
    global library_path, cuda_missing
    cpu = os.path.join(os.path.dirname(path), "libzmuon_cpu.so")
    wheel = os.path.basename(path) == "libzmuon.so" and os.path.exists(cpu)
    if wheel:
        _preload_nvidia_wheels()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        if not wheel:
            raise
        cuda_missing = str(e)
        path = cpu
        lib = ctypes.CDLL(path)
    library_path = path
    return lib


def _load():
    lib = _open(_find_library())
    c_int, c_i32, c_i64, c_f, c_size = (ctypes.c_int, ctypes.c_int32, ctypes.c_int64,
                                        ctypes.c_float, ctypes.c_size_t)
    eng_p = ctypes.c_void_p
    signatures = {
        "zmuon_last_error": (ctypes.c_char_p, []),
        "zmuon_version": (ctypes.c_char_p, []),
        "zmuon_status_name": (ctypes.c_char_p, [c_int]),
        "zmuon_engine_create": (c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), c_size,
                                        ctypes.POINTER(eng_p)]),
        "zmuon_engine_create_from_file": (c_int, [ctypes.c_char_p,
                                                  ctypes.POINTER(ctypes.c_char_p), c_size,
                                                  ctypes.POINTER(eng_p)]),
        "zmuon_engine_create_node": (c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p),
                                             c_size, c_i32, c_i32, c_i32, ctypes.c_char_p,
                                             ctypes.POINTER(eng_p)]),
        "zmuon_engine_start": (c_int, [eng_p]),
        "zmuon_engine_first_rank": (c_int, [eng_p, ctypes.POINTER(c_i32)]),
        "zmuon_engine_sum_over_nodes": (c_int, [eng_p, ctypes.POINTER(ctypes.c_double), c_size]),
        "zmuon_engine_destroy": (None, [eng_p]),
        "zmuon_engine_world": (c_int, [eng_p, ctypes.POINTER(c_i32)]),
        "zmuon_engine_add_parameter": (c_int, [eng_p, ctypes.c_char_p, ctypes.POINTER(c_i64),
                                               c_i32, c_i32, c_i64, ctypes.c_void_p, c_i64]),
        "zmuon_engine_param_uses_muon": (c_int, [eng_p, ctypes.c_char_p,
                                                 ctypes.POINTER(c_i32)]),
        "zmuon_engine_reduce": (c_int, [eng_p, c_i32, ctypes.POINTER(Tensor), c_size]),
        "zmuon_engine_reduce_on_stream": (c_int, [eng_p, c_i32, ctypes.POINTER(Tensor), c_size,
                                                  ctypes.c_void_p]),
        "zmuon_engine_reduce_all": (c_int, [eng_p, ctypes.POINTER(ctypes.POINTER(Tensor)),
                                            ctypes.POINTER(c_size), c_i32]),
        "zmuon_engine_hand_over_reduced": (c_int, [eng_p, c_i32, ctypes.POINTER(Tensor), c_size,
                                                   ctypes.c_void_p]),
        "zmuon_engine_hand_over": (c_int, [eng_p, c_i32, ctypes.POINTER(Tensor), c_size,
                                           ctypes.c_void_p, ctypes.c_uint32]),
        "zmuon_engine_handed_over": (c_int, [eng_p, c_i32, ctypes.POINTER(c_i32)]),
        "zmuon_engine_begin_step": (c_int, [eng_p, ctypes.c_void_p]),
        "zmuon_engine_shard_params": (c_int, [eng_p, c_i32, ctypes.POINTER(Tensor), c_size,
                                              ctypes.c_void_p]),
        "zmuon_engine_load_shard_params": (c_int, [eng_p, c_i32, ctypes.POINTER(Tensor),
                                                   c_size]),
        "zmuon_engine_master": (c_int, [eng_p, ctypes.c_char_p, ctypes.POINTER(Tensor)]),
        "zmuon_engine_step": (c_int, [eng_p, ctypes.POINTER(StepInfo)]),
        "zmuon_engine_step_on_stream": (c_int, [eng_p, ctypes.c_void_p,
                                                ctypes.POINTER(StepInfo)]),
        "zmuon_engine_gather_params": (c_int, [eng_p, ctypes.POINTER(Tensor), c_size]),
        "zmuon_engine_gather_params_on_stream": (c_int, [eng_p, ctypes.POINTER(Tensor), c_size,
                                                         ctypes.c_void_p]),
        "zmuon_engine_loss_scale": (c_int, [eng_p, ctypes.POINTER(c_f)]),
        "zmuon_engine_set_lr": (c_int, [eng_p, c_f, c_f]),
        "zmuon_engine_set_hparam_group": (c_int, [eng_p, ctypes.c_char_p, c_i32]),
        "zmuon_engine_set_muon_blocks": (c_int, [eng_p, ctypes.c_char_p, ctypes.POINTER(c_i64),
                                                 ctypes.POINTER(c_i64), ctypes.c_size_t, c_i32]),
        "zmuon_engine_set_box_order": (c_int, [eng_p, ctypes.c_char_p, ctypes.POINTER(c_i64),
                                               ctypes.c_size_t]),
        "zmuon_engine_add_qk_clip": (c_int, [eng_p, ctypes.c_char_p, ctypes.c_char_p, c_i64,
                                             c_i64]),
        "zmuon_engine_report_qk_logits": (c_int, [eng_p, c_i32, ctypes.c_char_p,
                                                  ctypes.POINTER(ctypes.c_float),
                                                  ctypes.c_size_t]),
        "zmuon_engine_set_group_hparams": (c_int, [eng_p, c_i32, ctypes.POINTER(GroupHparams)]),
        "zmuon_engine_set_group_rule": (c_int, [eng_p, c_i32, ctypes.POINTER(GroupHparams),
                                                ctypes.POINTER(UpdateRule)]),
        "zmuon_engine_time_calls": (c_int, [eng_p, c_i32]),
        "zmuon_engine_write_call_timeline": (c_int, [eng_p, ctypes.c_char_p]),
        "zmuon_engine_save_checkpoint": (c_int, [eng_p, ctypes.c_char_p]),
        "zmuon_engine_load_checkpoint": (c_int, [eng_p, ctypes.c_char_p,
                                                 ctypes.POINTER(ctypes.c_uint64)]),
        "zmuon_orthogonalizer_create": (c_int, [ctypes.c_char_p, c_i32, ctypes.c_char_p,
                                                ctypes.POINTER(ctypes.c_void_p)]),
        "zmuon_orthogonalizer_set_options": (c_int, [ctypes.c_void_p, ctypes.c_char_p]),
        "zmuon_orthogonalizer_destroy": (None, [ctypes.c_void_p]),
        "zmuon_orthogonalize": (c_int, [ctypes.c_void_p, ctypes.POINTER(Array)]),
        "zmuon_orthogonalize_on_stream": (c_int, [ctypes.c_void_p, ctypes.POINTER(Array),
                                                  ctypes.c_void_p]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


try:  # PyTorch first, where installed: libzmuon.so's CUDA libraries (NCCL, cuBLAS) then bind,
    import torch  # noqa: F401  by soname, to the ones torch loaded. Loaded the other way round,
except ImportError:  # torch would find a toolkit's older NCCL in the process and fail to import.
    pass
_lib = _load()


def version():
    return _lib.zmuon_version().decode()


def _check(status):
    if status == 0:
        return
    message = _lib.zmuon_last_error().decode(errors="replace")
    cls = _ERRORS[status] if 0 < status < len(_ERRORS) else InternalError
    raise cls(message)


def _close_handle(obj, destroy):
    """Destroys obj._handle once. (Callers bind `destroy` as a default argument, so that closing
    at interpreter exit does not depend on module globals.)"""
    if getattr(obj, "_handle", None):
        destroy(obj._handle)
        obj._handle = None


def _init_calls(engine):
    """The guard that lets close() from another thread wait for the call in flight: the C ABI's
    calls on one engine must not overlap its destruction."""
    engine._calls_cv = threading.Condition()
    engine._calls = 0
    engine._closing = False
    engine.rank_note = ""  # appended to an error that names ranks (MeshLayout.rank_note)


_RANKS_NAMED = re.compile(r"\b(rank|node)s? \d")


def _noting_ranks(cls):
    """Every public method of `cls` (an engine) appends the engine's rank_note to an error that
    names ranks or nodes."""
    def noted(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except ZmuonError as e:
                if self.rank_note and _RANKS_NAMED.search(str(e)):
                    raise type(e)(f"{e} ({self.rank_note})", e.code) from None
                raise
        return call
    for name, attr in list(vars(cls).items()):
        if callable(attr) and not name.startswith("_"):
            setattr(cls, name, noted(attr))
    return cls


def _tracked(method):
    """An engine call that close() waits for (and that a closed engine refuses)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._calls_cv:
            if self._closing:
                raise BadState("the engine is closed")
            self._calls += 1
        try:
            return method(self, *args, **kwargs)
        finally:
            with self._calls_cv:
                self._calls -= 1
                self._calls_cv.notify_all()
    return call


def _open_handle(obj, closed_message):
    if not getattr(obj, "_handle", None):
        raise BadState(closed_message)
    return obj._handle


def _text(value, what):
    """`value` (a str) as the UTF-8 bytes of a C string; InvalidArgument, naming `what`, for one
    the C ABI would read otherwise (a NUL ends a C string: 'a\\0b' would be read as 'a')."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a string, got {type(value).__name__} {value!r}")
    if "\0" in value:
        raise InvalidArgument(f"{what} {value!r} contains a NUL character")
    try:
        return value.encode()
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} {value!r} is not valid Unicode text (a lone "
                              "surrogate)") from None


def _path(value, what):
    """A path (str, bytes or os.PathLike) as the bytes the C ABI takes; InvalidArgument for one
    with a NUL character (the C ABI would read a shorter path)."""
    try:
        encoded = os.fsencode(value)
    except TypeError:
        raise InvalidArgument(f"{what} must be a path (str, bytes or os.PathLike), got "
                              f"{type(value).__name__}") from None
    if b"\0" in encoded:
        raise InvalidArgument(f"{what} {value!r} contains a NUL character")
    return encoded


_NAMES = {}  # name -> its checked C string: the same names come every step
# (what, count, slot, thread) -> the last entries, their array, the array as 64-bit words, and
# the entries' names, sizes and devices: most steps repeat them, often with new addresses (a new
# .grad).
_ARRAYS = {}
_WORDS = ctypes.sizeof(Tensor) // 8  # a Tensor's 64-bit words, its data pointer the word at:
_DATA_WORD = Tensor.data.offset // 8


def _tensor_array(entries, what="gradient name", slot=0):
    """entries: (name, data pointer, numel, device) tuples -> a ctypes array (names kept alive).
    The C functions only read it during the call: the same entries get the same array, and the
    same tensors at new addresses the same array with its pointers rewritten. So an array is
    the calling thread's, one per `slot` (a call that passes several arrays numbers them)."""
    key = (what, len(entries), slot, threading.get_ident())
    last = _ARRAYS.get(key)
    if last is not None:
        if last[0] == entries:
            return last[1]
        layout = [(name, numel, device) for name, _, numel, device in entries]
        if layout == last[3]:
            last[2][_DATA_WORD::_WORDS] = array.array("Q", [ptr or 0 for _, ptr, _, _ in entries])
            _ARRAYS[key] = (list(entries), last[1], last[2], layout)
            return last[1]
    arr = (Tensor * max(len(entries), 1))()
    for i, (name, ptr, numel, device) in enumerate(entries):
        text = _NAMES.get(name) if type(name) is str else None
        if text is None:
            text = _text(name, what)
            if len(_NAMES) < 1 << 20:
                _NAMES[name] = text
        arr[i] = Tensor(text, ptr, numel, device)
    if key in _ARRAYS or len(_ARRAYS) < 64:
        words = memoryview(arr).cast("B").cast("Q")
        _ARRAYS[key] = (list(entries), arr, words,
                        [(name, numel, device) for name, _, numel, device in entries])
    return arr


def _check_rank(rank):
    """ctypes would wrap a rank past int32 (2**32 became rank 0): refused by value instead."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not -2**31 <= rank < 2**31:
        raise InvalidArgument(f"rank {rank!r} is not a rank (an int32)")


@_noting_ranks
class Engine:
    """The engine behind the C ABI, one method per C function. Buffers are given as
    (name, data pointer, numel, device) tuples, device = HOST or a CUDA ordinal."""

    def __init__(self, config_json="", overrides=(), config_file=None, node=None):
        """`node`: (nodes, node_rank, ranks, master) for one process of a multi-process job
        (zmuon_engine_create_node; config_file is then read here)."""
        _init_calls(self)
        handle = ctypes.c_void_p()
        ov = [_text(o, "override") for o in overrides]
        ov_arr = (ctypes.c_char_p * max(len(ov), 1))(*ov)
        if node is not None:
            if config_file is not None:
                with open(_path(config_file, "config file"), encoding="utf-8") as f:
                    config_json = f.read()
            nodes, node_rank, ranks, master = node
            _check(_lib.zmuon_engine_create_node(_text(config_json, "config JSON"), ov_arr,
                                                 len(ov), nodes, node_rank, ranks,
                                                 _text(str(master), "master"),
                                                 ctypes.byref(handle)))
        elif config_file is not None:
            _check(_lib.zmuon_engine_create_from_file(_path(config_file, "config file"), ov_arr,
                                                      len(ov), ctypes.byref(handle)))
        else:
            _check(_lib.zmuon_engine_create(_text(config_json, "config JSON"), ov_arr, len(ov),
                                            ctypes.byref(handle)))
        self._handle = handle

    def close(self, _destroy=_lib.zmuon_engine_destroy):
        """Stops the engine's ranks; later calls raise BadState. From another thread while a
        call runs (a step, say), it waits for that call to return, then stops the engine."""
        cv = getattr(self, "_calls_cv", None)
        if cv is not None:
            with cv:
                self._closing = True
                cv.wait_for(lambda: self._calls == 0)
        if getattr(self, "_handle", None):
            for release in getattr(self, "_before_close", ()):
                release()  # views of the engine's memory get their own storage first
        _close_handle(self, _destroy)

    def before_close(self, release):
        """Calls `release()` before the engine's memory goes (close, garbage collection)."""
        self._before_close = getattr(self, "_before_close", []) + [release]

    def __del__(self):
        self.close()

    def _h(self):
        return _open_handle(self, "the engine is closed")

    @property
    def world(self):
        out = ctypes.c_int32()
        _check(_lib.zmuon_engine_world(self._h(), ctypes.byref(out)))
        return out.value

    @property
    def first_rank(self):
        out = ctypes.c_int32()
        _check(_lib.zmuon_engine_first_rank(self._h(), ctypes.byref(out)))
        return out.value

    @_tracked
    def start(self):
        _check(_lib.zmuon_engine_start(self._h()))

    @_tracked
    def sum_over_nodes(self, values):
        arr = (ctypes.c_double * max(len(values), 1))(*values)
        _check(_lib.zmuon_engine_sum_over_nodes(self._h(), arr, len(values)))
        return list(arr[:len(values)])

    def add_parameter(self, name, shape, group=GROUP_AUTO, heads=0, init_ptr=None, numel=0):
        dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        _check(_lib.zmuon_engine_add_parameter(self._h(), _text(name, "parameter name"), dims,
                                               len(shape), group, heads, init_ptr, numel))

    def uses_muon(self, name):
        out = ctypes.c_int32()
        _check(_lib.zmuon_engine_param_uses_muon(self._h(), _text(name, "parameter name"),
                                                 ctypes.byref(out)))
        return bool(out.value)

    @_tracked
    def reduce(self, rank, entries, stream=None):
        """`stream`: the CUDA stream (cudaStream_t as an int) the device gradients were written
        on; the engine then orders its reads after it, and it after the reads (no waiting)."""
        _check_rank(rank)
        if stream is None:
            _check(_lib.zmuon_engine_reduce(self._h(), rank, _tensor_array(entries),
                                            len(entries)))
        else:
            _check(_lib.zmuon_engine_reduce_on_stream(self._h(), rank, _tensor_array(entries),
                                                      len(entries), ctypes.c_void_p(stream)))

    @_tracked
    def reduce_all(self, entries_by_rank):
        """One micro-batch of every local rank (entries_by_rank[i]: local rank i's), each
        handed over on a thread of its own inside the engine."""
        arrays = [_tensor_array(entries, slot=i) for i, entries in enumerate(entries_by_rank)]
        pointers = (ctypes.POINTER(Tensor) * len(arrays))(
            *[ctypes.cast(a, ctypes.POINTER(Tensor)) for a in arrays])
        counts = (ctypes.c_size_t * len(arrays))(*[len(entries) for entries in entries_by_rank])
        _check(_lib.zmuon_engine_reduce_all(self._h(), pointers, counts, len(arrays)))

    @_tracked
    def hand_over_reduced(self, rank, entries, stream=None):
        """Rank `rank`'s part of a gradient already averaged over the ranks (DDP, FSDP2): each
        entry the whole averaged tensor or the rank's shard alone; no reduce-scatter."""
        _check_rank(rank)
        _check(_lib.zmuon_engine_hand_over_reduced(self._h(), rank, _tensor_array(entries),
                                                   len(entries), ctypes.c_void_p(stream or 0)))

    @_tracked
    def hand_over(self, rank, entries, stream, reduced, kept_until_step, ahead_of_step=False):
        """reduce() (reduced False) or hand_over_reduced() (True), stream-ordered on `stream`;
        kept_until_step: the caller keeps every device gradient as it is until step() returns
        (zmuon_engine_hand_over's ZMUON_HAND_OVER_KEPT_UNTIL_STEP); ahead_of_step: handed over
        as a backward pass ends, read only once step() begins (ZMUON_HAND_OVER_AHEAD_OF_STEP)."""
        _check_rank(rank)
        flags = (HAND_OVER_REDUCED if reduced else 0) \
            | (HAND_OVER_KEPT_UNTIL_STEP if kept_until_step else 0) \
            | (HAND_OVER_AHEAD_OF_STEP if ahead_of_step else 0)
        _check(_lib.zmuon_engine_hand_over(self._h(), rank, _tensor_array(entries), len(entries),
                                           ctypes.c_void_p(stream or 0), flags))

    @_tracked
    def begin_step(self, stream):
        """The open step's reads of gradients handed over ahead of it begin, after `stream`
        (zmuon_engine_begin_step)."""
        _check(_lib.zmuon_engine_begin_step(self._h(), ctypes.c_void_p(stream or 0)))

    @_tracked
    def handed_over(self, rank):
        """The micro-batches local rank `rank` has handed over in the open step (one handed
        over ahead of the step counts until something withdraws it)."""
        out = ctypes.c_int32()
        _check(_lib.zmuon_engine_handed_over(self._h(), rank, ctypes.byref(out)))
        return out.value

    @_tracked
    def shard_params(self, rank, entries, stream=None):
        """Writes local rank `rank`'s shard of each named parameter into its buffer (of the
        shard's size): no collective."""
        _check(_lib.zmuon_engine_shard_params(self._h(), rank,
                                              _tensor_array(entries, "parameter name"),
                                              len(entries), ctypes.c_void_p(stream or 0)))

    @_tracked
    def load_shard_params(self, rank, entries):
        """Sets local rank `rank`'s shard of each named parameter from host buffers (the whole
        tensor or the shard alone): no collective."""
        _check(_lib.zmuon_engine_load_shard_params(self._h(), rank,
                                                   _tensor_array(entries, "parameter name"),
                                                   len(entries)))

    @_tracked
    def master(self, name):
        """(data pointer, numel, device) of parameter `name`'s fp32 master in the engine's own
        memory, where this process holds it whole (a job of one rank); valid until close()."""
        out = Tensor()
        _check(_lib.zmuon_engine_master(self._h(), _text(name, "parameter name"),
                                        ctypes.byref(out)))
        return out.data, out.numel, out.device

    @_tracked
    def step(self, stream=None):
        """`stream`: the CUDA stream (cudaStream_t as an int, 0 the default one) to order the
        step on: it returns once the step is decided and enqueued, and that stream's later work
        waits for it on the device (zmuon_engine_step_on_stream). None: returns once it ran."""
        info = StepInfo()
        if stream is None:
            _check(_lib.zmuon_engine_step(self._h(), ctypes.byref(info)))
        else:
            _check(_lib.zmuon_engine_step_on_stream(self._h(), ctypes.c_void_p(stream),
                                                    ctypes.byref(info)))
        return info.as_dict()

    @_tracked
    def gather_params(self, entries, stream=None):
        """`stream`: the CUDA stream (cudaStream_t as an int) that uses the device buffers; the
        engine then writes them between its queued work and its next (no waiting)."""
        if stream is None:
            _check(_lib.zmuon_engine_gather_params(self._h(),
                                                   _tensor_array(entries, "parameter name"),
                                                   len(entries)))
        else:
            _check(_lib.zmuon_engine_gather_params_on_stream(self._h(),
                                                             _tensor_array(entries,
                                                                           "parameter name"),
                                                             len(entries),
                                                             ctypes.c_void_p(stream)))

    def loss_scale(self):
        out = ctypes.c_float()
        _check(_lib.zmuon_engine_loss_scale(self._h(), ctypes.byref(out)))
        return out.value

    def set_lr(self, muon_lr=-1.0, adam_lr=-1.0):
        _check(_lib.zmuon_engine_set_lr(self._h(), muon_lr, adam_lr))

    def set_hparam_group(self, name, group):
        _check(_lib.zmuon_engine_set_hparam_group(self._h(), _text(name, "parameter name"),
                                                  group))

    def set_muon_blocks(self, name, split_sizes=(), split_heads=None, view="auto"):
        """Muon's blocks of a registered parameter: row blocks `split_sizes` with heads
        `split_heads` inside each (None: none), `view` one of MATRIX_VIEWS."""
        if view not in MATRIX_VIEWS:
            raise InvalidArgument(f"view {view!r} is not one of {sorted(MATRIX_VIEWS)}")
        n = len(split_sizes)
        sizes = (ctypes.c_int64 * max(n, 1))(*split_sizes)
        heads = None
        if split_heads is not None:
            if len(split_heads) != n:
                raise InvalidArgument(f"split_heads of '{name}' has {len(split_heads)} entries "
                                      f"for {n} split_sizes")
            heads = (ctypes.c_int64 * max(n, 1))(*split_heads)
        _check(_lib.zmuon_engine_set_muon_blocks(self._h(), _text(name, "parameter name"), sizes,
                                                 heads, n, MATRIX_VIEWS[view]))

    def set_box_order(self, name, boxes):
        """The order this process holds Muon matrix `name` in: `boxes` ((row0, rows, col0,
        cols) of its matrix view) back to back, each row-major."""
        flat = [int(v) for box in boxes for v in box]
        arr = (ctypes.c_int64 * max(len(flat), 1))(*flat)
        _check(_lib.zmuon_engine_set_box_order(self._h(), _text(name, "parameter name"), arr,
                                               len(flat) // 4))

    def add_qk_clip(self, query, key, query_heads, key_heads):
        _check(_lib.zmuon_engine_add_qk_clip(self._h(), _text(query, "parameter name"),
                                             _text(key, "parameter name"), query_heads,
                                             key_heads))

    def report_qk_logits(self, rank, query, values):
        """Rank `rank`'s largest logit per head of `query` for one micro-batch (floats)."""
        arr = (ctypes.c_float * max(len(values), 1))(*values)
        _check(_lib.zmuon_engine_report_qk_logits(self._h(), rank, _text(query, "parameter name"),
                                                  arr, len(values)))

    def set_group_hparams(self, group, values):
        """`values`: a dict of GroupHparams' fields (ns_variant and adjust_lr by name), and
        optionally of UpdateRule's (variant by name): then zmuon_engine_set_group_rule."""
        v = dict(values)
        rule = {k: v.pop(k) for k in RULE_FIELDS if k in v}
        v["ns_coefficients"] = (ctypes.c_float * 3)(*v["ns_coefficients"])
        v["ns_variant"] = NS_VARIANTS[v["ns_variant"]]
        v["adjust_lr"] = ADJUST_LR[v["adjust_lr"]]
        v["nesterov"] = 1 if v["nesterov"] else 0
        if rule:
            full = {"cautious_weight_decay": False, "variant": "muon", "normuon_beta2": 0.95,
                    "normuon_eps": 1e-8, "algorithm": "adamw"}
            full.update(rule)
            full["cautious_weight_decay"] = 1 if full["cautious_weight_decay"] else 0
            full["variant"] = MUON_VARIANTS[full["variant"]]
            full["algorithm"] = SCALAR_ALGORITHMS[full["algorithm"]]
            _check(_lib.zmuon_engine_set_group_rule(self._h(), group,
                                                    ctypes.byref(GroupHparams(**v)),
                                                    ctypes.byref(UpdateRule(**full))))
            return
        _check(_lib.zmuon_engine_set_group_hparams(self._h(), group,
                                                   ctypes.byref(GroupHparams(**v))))

    def time_calls(self, on=True):
        _check(_lib.zmuon_engine_time_calls(self._h(), 1 if on else 0))

    def write_call_timeline(self, path):
        _check(_lib.zmuon_engine_write_call_timeline(self._h(), _path(path, "timeline path")))

    @_tracked
    def save_checkpoint(self, directory):
        _check(_lib.zmuon_engine_save_checkpoint(self._h(),
                                                 _path(directory, "checkpoint directory")))

    @_tracked
    def load_checkpoint(self, directory):
        """Returns the step the checkpoint was saved at."""
        step = ctypes.c_uint64()
        _check(_lib.zmuon_engine_load_checkpoint(self._h(),
                                                 _path(directory, "checkpoint directory"),
                                                 ctypes.byref(step)))
        return step.value


class Orthogonalizer:
    """zmuon_orthogonalizer: a compute backend ("host" or "cuda" on `device`) kept for
    Newton-Schulz calls, with its workspace. `options_json`: an object of the config's NS keys
    (ns_steps, ns_coefficients, ns_schedule, ns_variant, ns_gram_restart); "" for the defaults.
    One call at a time."""

    def __init__(self, backend="host", device=0, options_json=""):
        handle = ctypes.c_void_p()
        _check(_lib.zmuon_orthogonalizer_create(_text(str(backend), "compute backend"), device,
                                                _text(options_json, "options JSON"),
                                                ctypes.byref(handle)))
        self._handle = handle
        self.backend, self.device, self.options_json = backend, device, options_json

    def close(self, _destroy=_lib.zmuon_orthogonalizer_destroy):
        _close_handle(self, _destroy)

    def __del__(self):
        self.close()

    def _h(self):
        return _open_handle(self, "the orthogonalizer is closed")

    def set_options(self, options_json):
        _check(_lib.zmuon_orthogonalizer_set_options(self._h(),
                                                     _text(options_json, "options JSON")))
        self.options_json = options_json

    def run(self, ptr, dtype, shape, device=HOST, stream=None):
        """Orthogonalizes the contiguous matrices at `ptr` ([rows, cols] or [batch, rows, cols],
        FLOAT32 or BFLOAT16) in place; `stream` (a cudaStream_t as an int) orders the work on it
        without waiting, else a cuda call returns once done."""
        dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        arr = Array(ptr, dtype, len(shape), dims, device)
        if stream is None:
            _check(_lib.zmuon_orthogonalize(self._h(), ctypes.byref(arr)))
        else:
            _check(_lib.zmuon_orthogonalize_on_stream(self._h(), ctypes.byref(arr),
                                                      ctypes.c_void_p(stream)))


# -- DeepSpeed configs: "auto" from the host, the notes, the scheduled rates, the metrics --------

MetricsCallback = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_void_p)
for _name, _argtypes in {
        "zmuon_engine_create_with_host": [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p),
                                          ctypes.c_size_t, ctypes.c_char_p,
                                          ctypes.POINTER(ctypes.c_void_p)],
        "zmuon_engine_notes": [ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p)],
        "zmuon_engine_next_lrs": [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float),
                                  ctypes.POINTER(ctypes.c_float)],
        "zmuon_engine_set_metrics_callback": [ctypes.c_void_p, MetricsCallback, ctypes.c_void_p],
        "zmuon_engine_log_loss": [ctypes.c_void_p, ctypes.c_double]}.items():
    getattr(_lib, _name).restype = ctypes.c_int
    getattr(_lib, _name).argtypes = _argtypes


def engine_with_host(config_json="", overrides=(), host_values=None):
    """An Engine from a config (JSON text) and overrides, whose "auto" values come from
    `host_values` (a dict: lr, weight_decay, betas, total_num_steps, host="python", ...; see
    zmuon_engine_create_with_host); it keeps the config's notes and runs its scheduler."""
    import json as _json
    handle = ctypes.c_void_p()
    ov = [_text(o, "override") for o in overrides]
    ov_arr = (ctypes.c_char_p * max(len(ov), 1))(*ov)
    host = _json.dumps(host_values) if host_values is not None else ""
    _check(_lib.zmuon_engine_create_with_host(_text(config_json, "config JSON"), ov_arr, len(ov),
                                              _text(host, "host values"), ctypes.byref(handle)))
    eng = Engine.__new__(Engine)
    _init_calls(eng)
    eng._handle = handle
    return eng


def engine_notes(engine):
    """The config's notes of an engine_with_host, a list of lines."""
    out = ctypes.c_char_p()
    _check(_lib.zmuon_engine_notes(engine._h(), ctypes.byref(out)))
    return [line for line in (out.value or b"").decode().split("\n") if line]


def engine_next_lrs(engine):
    """(Muon's, AdamW's) learning rate for the next step: what param_groups should show."""
    muon, adam = ctypes.c_float(), ctypes.c_float()
    _check(_lib.zmuon_engine_next_lrs(engine._h(), ctypes.byref(muon), ctypes.byref(adam)))
    return muon.value, adam.value


def set_metrics_callback(engine, fn):
    """fn(record: dict) after each step of an engine_with_host (None: none); the engine keeps
    the callback alive."""
    import json as _json
    callback = MetricsCallback(lambda text, _user: fn(_json.loads(text.decode())))
    _check(_lib.zmuon_engine_set_metrics_callback(engine._h(),
                                                  callback if fn else MetricsCallback(), None))
    engine._metrics_callback = callback


def log_loss(engine, loss):
    """The host's mean loss of the step under way, for its metrics record."""
    _check(_lib.zmuon_engine_log_loss(engine._h(), float(loss)))


# -- The optimizer state by parameter name (zmuon_engine_read_state / write_state) --------------

STATE_FULL, STATE_LOCAL = 0, 1  # zmuon_state_scope


class StateInfo(ctypes.Structure):
    _fields_ = [("step", ctypes.c_uint64), ("adam_steps", ctypes.c_int64),
                ("loss_scale", ctypes.c_float), ("scaler_iter", ctypes.c_int64),
                ("scaler_last_overflow_iter", ctypes.c_int64),
                ("scaler_hysteresis_left", ctypes.c_int32)]


class ParamState(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("offset", ctypes.c_int64), ("numel", ctypes.c_int64),
                ("param", ctypes.c_void_p), ("momentum", ctypes.c_void_p),
                ("exp_avg", ctypes.c_void_p), ("exp_avg_sq", ctypes.c_void_p),
                ("adam_step", ctypes.c_int64)]


STATE_TENSORS = ("param", "momentum", "exp_avg", "exp_avg_sq")  # zmuon_param_state's buffers

for _name, _argtypes in {
        "zmuon_engine_state_range": [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32,
                                     ctypes.POINTER(ctypes.c_int64),
                                     ctypes.POINTER(ctypes.c_int64)],
        "zmuon_engine_read_state": [ctypes.c_void_p, ctypes.c_int32, ctypes.POINTER(ParamState),
                                    ctypes.c_size_t, ctypes.POINTER(StateInfo)],
        "zmuon_engine_write_state": [ctypes.c_void_p, ctypes.POINTER(ParamState),
                                     ctypes.c_size_t, ctypes.POINTER(StateInfo)]}.items():
    getattr(_lib, _name).restype = ctypes.c_int
    getattr(_lib, _name).argtypes = _argtypes


def state_range(engine, name, scope):
    """(offset, numel) of the elements of parameter `name` that read_state gives in `scope`."""
    offset, numel = ctypes.c_int64(), ctypes.c_int64()
    _check(_lib.zmuon_engine_state_range(engine._h(), _text(name, "parameter name"), scope,
                                         ctypes.byref(offset), ctypes.byref(numel)))
    return offset.value, numel.value


def _param_states(entries):
    """entries: (name, numel, {tensor name: data pointer}, adam_step[, offset]) -> a ctypes
    array (offset: the first element the buffers hold, 0 by default)."""
    arr = (ParamState * max(len(entries), 1))()
    for i, (name, numel, pointers, adam_step, *offset) in enumerate(entries):
        arr[i] = ParamState(_text(name, "parameter name"), offset[0] if offset else 0, numel,
                            *(pointers.get(t) for t in STATE_TENSORS), adam_step)
    return arr


def read_state(engine, scope, entries):
    """Fills the host buffers of `entries` ((name, numel, {tensor name: pointer}, 0) tuples).
    Returns ([(offset, adam_step)] per entry, the engine's state info as a dict)."""
    arr, info = _param_states(entries), StateInfo()
    _check(_lib.zmuon_engine_read_state(engine._h(), scope, arr, len(entries),
                                        ctypes.byref(info)))
    return ([(arr[i].offset, arr[i].adam_step) for i in range(len(entries))],
            {name: getattr(info, name) for name, _ in StateInfo._fields_})


def write_state(engine, entries, info):
    """Loads whole tensors, or this process's elements of them (an entry's offset):
    `entries` as read_state's, `info` a dict of StateInfo's fields."""
    arr = _param_states(entries)
    _check(_lib.zmuon_engine_write_state(engine._h(), arr, len(entries),
                                         ctypes.byref(StateInfo(**info))))


# -- NorMuon's row moments (zmuon_engine_read_row_moments / write_state_rows) --------------------

for _name, _argtypes in {
        "zmuon_engine_read_row_moments": [ctypes.c_void_p, ctypes.POINTER(RowMoments),
                                          ctypes.c_size_t],
        "zmuon_engine_write_state_rows": [ctypes.c_void_p, ctypes.POINTER(ParamState),
                                          ctypes.c_size_t, ctypes.POINTER(StateInfo),
                                          ctypes.POINTER(RowMoments), ctypes.c_size_t]}.items():
    getattr(_lib, _name).restype = ctypes.c_int
    getattr(_lib, _name).argtypes = _argtypes


def _row_moments(entries):
    """entries: (name, rows, data pointer) -> a ctypes array."""
    arr = (RowMoments * max(len(entries), 1))()
    for i, (name, rows, pointer) in enumerate(entries):
        arr[i] = RowMoments(_text(name, "parameter name"), pointer, rows)
    return arr


def read_row_moments(engine, entries):
    """Fills the host buffers of `entries` ((name, rows, pointer) tuples) with NorMuon's row
    moments (read as read_state(STATE_FULL) reads)."""
    _check(_lib.zmuon_engine_read_row_moments(engine._h(), _row_moments(entries), len(entries)))


def write_state_rows(engine, entries, info, rows):
    """write_state with the row moments of `rows` ((name, rows, pointer) tuples)."""
    arr = _param_states(entries)
    _check(_lib.zmuon_engine_write_state_rows(engine._h(), arr, len(entries),
                                              ctypes.byref(StateInfo(**info)),
                                              _row_moments(rows), len(rows)))
