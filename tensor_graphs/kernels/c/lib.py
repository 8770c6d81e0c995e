"""Loading the C backend's own libraries (one per ``*.c`` file here), lazily, once.

``library("elementwise")`` reads ``elementwise.c``, inlines the local headers it includes (so
the build cache key covers them), compiles it through ``build.load_library`` on first use and
registers it with ``tensor_graphs.threads``. ``func(lib_name, symbol, *argtypes)`` returns a
ctypes function with its argument types set. A library that fails to build is remembered, and
``failure(lib_name)`` returns the reason: the kernels' ``where`` constraints report it, so the
planner uses other backends rather than crash.

``recording``: while a compiled program records its C calls for the native loop
(``runtime/native.py``), ``func`` returns the recorder's wrapper of the ctypes function, which
notes the function, its argument types and values and then calls it. Kernels that call a ctypes
function of their own (generated C) ask ``recording.wrap`` the same way.
"""

from __future__ import annotations

import ctypes
import re
import threading
from pathlib import Path

import numpy as np

from tensor_graphs import threads  # sets the pools' spin defaults before any library loads
from tensor_graphs.errors import CCompileError
from tensor_graphs.kernels.c import build

HERE = Path(__file__).parent
_lock = threading.RLock()
_libs: dict[str, ctypes.CDLL] = {}
_failed: dict[str, str] = {}
_funcs: dict[tuple[str, str], object] = {}
_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_.]+)"\s*$', re.M)

P = ctypes.c_void_p  # pointers are passed as integers (array.ctypes.data)
I64 = ctypes.c_int64
I32 = ctypes.c_int
F32 = ctypes.c_float
F64 = ctypes.c_double


def source(name: str) -> str:
    """The C source of library ``name`` with its local includes inlined."""
    seen: set[str] = set()

    def expand(text: str) -> str:
        def sub(m: re.Match) -> str:
            header = m.group(1)
            if header in seen:
                return ""
            seen.add(header)
            return expand((HERE / header).read_text())
        return _INCLUDE.sub(sub, text)

    return expand((HERE / f"{name}.c").read_text())


_EXTRA_FLAGS: dict[str, object] = {}  # lib name -> callable returning extra compiler flags


def library(name: str) -> ctypes.CDLL:
    with _lock:
        lib = _libs.get(name)
        if lib is not None:
            return lib
        if name in _failed:
            raise CCompileError(f"C library '{name}' is unavailable: {_failed[name]}")
        try:
            flags = _EXTRA_FLAGS[name]() if name in _EXTRA_FLAGS else ()
            lib = build.load_library(f"tg_{name}", source(name), flags)
        except CCompileError as e:
            _failed[name] = str(e)
            raise
        threads.register_library(lib)
        _libs[name] = lib
        return lib


def failure(name: str) -> str | None:
    """Why library ``name`` (or the whole C backend) cannot be used, or None."""
    reason = build.unavailable_reason()
    if reason is not None:
        return f"the C backend is unavailable: {reason}"
    if name in _failed:
        return f"C library '{name}' failed to build: {_failed[name].splitlines()[0]}"
    if name in _EXTRA_FLAGS and name not in _libs:
        try:
            _EXTRA_FLAGS[name]()  # e.g. the BLAS package is missing
        except CCompileError as e:
            return f"C library '{name}' cannot be built: {e}"
    return None


recording = None  # a runtime.native.Recorder while a program records its C calls


def func(lib_name: str, symbol: str, *argtypes):
    key = (lib_name, symbol)
    f = _funcs.get(key)
    if f is None:
        f = getattr(library(lib_name), symbol)
        f.argtypes = list(argtypes)
        f.restype = None
        _funcs[key] = f
    rec = recording
    return f if rec is None else rec.wrap(f)


_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof


def output(out: np.ndarray | None, shape, dtype) -> np.ndarray:
    """The buffer a kernel writes its result to: ``out`` when the caller gave one (the
    ``writes_out`` contract: C-contiguous, of the result's shape and dtype), else a new one."""
    return np.empty(shape, dtype) if out is None else out


def aligned(count: int, dtype, align: int = 64) -> np.ndarray:
    """A 1-D array of ``count`` elements of ``dtype`` whose data starts on an ``align``-byte
    boundary: packed weights are read with aligned vector loads."""
    dtype = np.dtype(dtype)
    raw = np.empty(count + align // dtype.itemsize, dtype)
    skip = (-raw.ctypes.data % align) // dtype.itemsize
    return raw[skip:skip + count]


def ptr(a: np.ndarray | None) -> int | None:
    """The address of an array's data (None for None). ``a.ctypes.data`` costs ~3 us a call;
    this ~1 us for a writable contiguous array, falling back for the others."""
    if a is None:
        return None
    try:
        return _addressof(_from_buffer(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data
