"""C kernels of the random ops: ``c_random_bits`` (the Philox words) and ``c_dropout``, the
mask drawn and applied in the one pass that scales x (float32, float64); and ``c_add_int64``,
the generator's step advance (an int64 add of equal shapes), without which that one numpy step
kept a program with dropout out of the native loop.

The key is passed as a pointer to its two int64s, never as numbers read in Python: the program
advances the generator's state in place, and the native loop replays a recorded call with the
pointers it saw, so values read at record time would repeat one step's masks forever. The words
are the reference's bit for bit (``random.c``), so both kernels are declared exact but for the
one rounding of x * (1 / (1 - p)).
"""

from __future__ import annotations

import ctypes

import numpy as np

from tensor_graphs.ir.ops.random import scale, threshold
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.c.lib import F32, F64, I64, P, ptr
from tensor_graphs.kernels.registry import kernel

LIB = "random"
SOURCE = lib.source(LIB)
NONE = 1e-12
ROUNDED = 1e-7
U64 = ctypes.c_uint64
_DROPOUT = {np.dtype(np.float32): ("tg_dropout_f32", F32),
            np.dtype(np.float64): ("tg_dropout_f64", F64)}


def _key_ok(shapes, dtypes, attrs):
    reason = lib.failure(LIB)
    if reason is not None:
        return reason
    if dtypes[-1].name != "int64" or tuple(shapes[-1]) != (2,):
        return f"the key must be int64 (2,), got {tuple(shapes[-1])} {dtypes[-1].name}"
    return True


def _dropout_ok(shapes, dtypes, attrs):
    if dtypes[0].name not in ("float32", "float64"):
        return f"x must be float32 or float64, got {dtypes[0].name}"
    return _key_ok(shapes, dtypes, attrs)


def _dense(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous and a.dtype.isnative else np.ascontiguousarray(a)


def _src(fn):
    """The C source is part of what the kernel is (its hash keys the measurements)."""
    fn.source_text = SOURCE
    return fn


@kernel("random_bits", backend="c", name="c_random_bits", where=_key_ok, contiguous=True,
        tolerance=NONE, writes_out=True)
@_src
def c_random_bits(key, shape, stream, *, out=None):
    """Philox-4x32-10 words in element order, 64 blocks per vector pass, threads over chunks."""
    key = _dense(key)
    out = lib.output(out, tuple(shape), np.int64)
    fn = lib.func(LIB, "tg_random_bits", P, I64, P, I64)
    fn(ptr(key), stream, ptr(out), out.size)
    return out


@kernel("dropout", backend="c", name="c_dropout", where=_dropout_ok, contiguous=True,
        tolerance=ROUNDED, writes_out=True)
@_src
def c_dropout(x, key, p, stream, *, out=None):
    """Inverted dropout with the mask drawn in the same pass (nothing stored)."""
    x, key = _dense(x), _dense(key)
    symbol, ftype = _DROPOUT[x.dtype]
    out = lib.output(out, x.shape, x.dtype)
    fn = lib.func(LIB, symbol, P, P, I64, U64, ftype, P, I64)
    fn(ptr(x), ptr(key), stream, threshold(p), scale(p), ptr(out), x.size)
    return out


def _same_int64(shapes, dtypes, attrs):
    reason = lib.failure(LIB)
    if reason is not None:
        return reason
    if len({tuple(s) for s in shapes}) > 1:
        return f"adds equal shapes only (no broadcasting), got {list(map(tuple, shapes))}"
    return True


@kernel("add", backend="c", name="c_add_int64", dtypes=("int64",), where=_same_int64,
        contiguous=True, tolerance=NONE, writes_out=True)
@_src
def c_add_int64(a, b, *, out=None):
    """a + b over int64, wrapping as numpy does (the generator's step advance)."""
    a, b = _dense(a), _dense(b)
    out = lib.output(out, a.shape, np.int64)
    lib.func(LIB, "tg_add_i64", P, P, P, I64)(ptr(a), ptr(b), ptr(out), a.size)
    return out
