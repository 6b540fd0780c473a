"""The library's log into Python's `logging`, logger "zmuon"; set up when the package loads.

The library's levels map to error -> ERROR, warn -> WARNING, info -> INFO, debug -> DEBUG,
trace -> 5. The library passes on what its own level allows ($ZMUON_LOG_LEVEL, else info;
zmuon.set_log_level changes it); the logger's handlers and level decide the rest.
"""

import atexit
import ctypes
import logging

from ._capi import _check, _lib

logger = logging.getLogger("zmuon")

_NAMES = ["error", "warn", "info", "debug", "trace"]
_PY_LEVELS = [logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG, 5]

_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_lib.zmuon_set_log_level.restype = ctypes.c_int
_lib.zmuon_set_log_level.argtypes = [ctypes.c_int]
_lib.zmuon_set_log_callback.restype = ctypes.c_int
_lib.zmuon_set_log_callback.argtypes = [_CALLBACK, ctypes.c_void_p]


def _forward(level, message, _user):
    # Runs on the library's threads; an exception must not cross into C.
    try:
        py_level = _PY_LEVELS[level] if 0 <= level < len(_PY_LEVELS) else logging.ERROR
        if logger.isEnabledFor(py_level):
            logger.log(py_level, message.decode(errors="replace"))
    except Exception:  # pylint: disable=broad-except
        pass


_callback = _CALLBACK(_forward)  # referenced for as long as the library may call it


def set_log_level(level):
    """The least severe of the library's messages passed on: "error", "warn", "info", "debug"
    or "trace"."""
    if level not in _NAMES:
        raise ValueError(f"log level {level!r}: expected one of {', '.join(_NAMES)}")
    _check(_lib.zmuon_set_log_level(_NAMES.index(level)))


def _stop_forwarding():
    # At interpreter exit: the library's threads write to stderr again, not into Python.
    _lib.zmuon_set_log_callback(_CALLBACK(), None)


_check(_lib.zmuon_set_log_callback(_callback, None))
atexit.register(_stop_forwarding)
