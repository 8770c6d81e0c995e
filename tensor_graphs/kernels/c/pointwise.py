"""C kernels for the mask and position steps of a decode: iota, cast, sin, cos, add, mul, less,
where.

A decode step builds its causal mask (``where(less(row, iota(past + 1)), -inf, 0)``), adds
the position's embedding to the token's (where the fused ``c_embedding_add`` is not chosen:
its estimate reads a whole 50k-row table) and, in a rotary model, builds its cos/sin tables
(``cos(concat([cast(pos) * inv_freq] * 2))``) per call. With only numpy kernels for those
steps the program was never all C, so it could not run in the native loop
(``runtime/native.py``), which replays C calls only. ``concat.py`` has the concat.

add, mul, less and where broadcast as numpy does and read their inputs through their strides (a
view is never copied first): the wrapper passes the result's shape and, per input, a stride in
elements for each axis of the result, 0 where the input has extent 1 (broadcast, or an axis
whose stride is never used). The arguments are products of the shapes and strides with no
branch on a size, which the native loop relies on to replay a call at other dims (see
``native.SYMBOLIC_KERNELS``). iota, cast, sin and cos take contiguous inputs. All write into
``out=`` when given one (``writes_out``: see the registry) and follow the numpy kernels' rounding
(see pointwise.c).
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from tensor_graphs.ir.ops.names import ADD, CAST, COS, IOTA, LESS, MUL, SIN, WHERE
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.c.lib import I64, P, ptr
from tensor_graphs.kernels.registry import kernel

LIB = "pointwise"
SOURCE = lib.source(LIB)
NONE = 1e-12  # bit-exact: no rounding
EXACT = 1e-7  # one rounding of the exact result
MAX_RANK = 16  # broadcasting kernels: axes of the result (ctypes layout arrays stay small)
_SUFFIX = {np.dtype(np.int32): "i32", np.dtype(np.int64): "i64",
           np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
_FLOATS = ("float32", "float64")
_NUMBERS = ("int32", "int64", "float32", "float64")


def _src(fn):
    fn.source_text = SOURCE + f"\n/* {fn.__name__} */"
    return fn


def _library_ok():
    return lib.failure(LIB)


def _same_dtype_of(allowed: tuple[str, ...], skip: int = 0):
    """A ``where`` constraint: the library builds, inputs from ``skip`` on share one dtype of
    ``allowed``, and the result has at most MAX_RANK axes."""

    def where(shapes, dtypes, attrs):
        reason = _library_ok()
        if reason is not None:
            return reason
        kept = dtypes[skip:]
        if len(set(kept)) > 1:
            return f"inputs must share one dtype, got {', '.join(d.name for d in kept)}"
        if kept and kept[0].name not in allowed:
            return f"takes {', '.join(allowed)}, got {kept[0].name}"
        if max((len(s) for s in shapes), default=0) > MAX_RANK:
            return f"at most {MAX_RANK} axes"
        return True

    return where


_LAYOUTS: dict[tuple, tuple] = {}  # the inputs' shapes, strides, itemsizes -> the call layout
_ARGTYPES = {n: (*([P] * (n + 1)), I64, ctypes.POINTER(ctypes.c_int64)) for n in (2, 3)}


def _plan(arrays) -> tuple:
    """(result shape, its size, the layout: the shape and each input's element strides over
    the result's axes, 0 where the input has extent 1, as one int64 ctypes array; rank; which
    inputs must be made dense, their strides not whole elements)."""
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    nd = len(shape)
    parts, copy = list(shape), []
    for a in arrays:
        item = a.itemsize
        copy.append(any(s % item for s in a.strides))
        strides = np.ascontiguousarray(a).strides if copy[-1] else a.strides
        parts.extend(0 for _ in range(nd - a.ndim))
        parts.extend(0 if n == 1 else s // item for n, s in zip(a.shape, strides))
    layout = (ctypes.c_int64 * max(len(parts), 1))(*parts)
    return shape, math.prod(shape), layout, nd, tuple(copy)


def _broadcast(symbol: str, out_dtype, arrays, out):
    """The C call of a broadcasting kernel; its layout is computed once per input shapes and
    strides (a decode step meets the same ones every call): the Python side of a call is a few
    microseconds, as numpy's."""
    arrays = [a if type(a) is np.ndarray else np.asarray(a) for a in arrays]
    key = tuple((a.shape, a.strides, a.itemsize) for a in arrays)
    found = _LAYOUTS.get(key)
    if found is None:
        if len(_LAYOUTS) >= 512:
            _LAYOUTS.clear()
        found = _LAYOUTS[key] = _plan(arrays)
    shape, size, layout, nd, copy = found
    out = lib.output(out, shape, out_dtype)
    if not size:
        return out
    if any(copy):
        arrays = [np.ascontiguousarray(a) if c else a for a, c in zip(arrays, copy)]
    fn = lib.func(LIB, symbol, *_ARGTYPES[len(arrays)])
    fn(*[ptr(a) for a in arrays], ptr(out), nd, layout)
    return out


@kernel(ADD, backend="c", name="c_add", where=_same_dtype_of(_FLOATS), tolerance=EXACT,
        writes_out=True)
@_src
def c_add(a, b, *, out=None):
    """a + b, float32/float64, broadcasting, inputs read through their strides."""
    return _broadcast(f"tg_add_{_SUFFIX[a.dtype]}", a.dtype, (a, b), out)


@kernel(MUL, backend="c", name="c_mul", where=_same_dtype_of(_FLOATS), tolerance=EXACT,
        writes_out=True)
@_src
def c_mul(a, b, *, out=None):
    """a * b, float32/float64, broadcasting, inputs read through their strides."""
    return _broadcast(f"tg_mul_{_SUFFIX[a.dtype]}", a.dtype, (a, b), out)


@kernel(LESS, backend="c", name="c_less", where=_same_dtype_of(_NUMBERS), tolerance=NONE,
        writes_out=True)
@_src
def c_less(a, b, *, out=None):
    """a < b (bool; false on NaN), int32/int64/float32/float64, broadcasting, strided inputs."""
    return _broadcast(f"tg_less_{_SUFFIX[a.dtype]}", np.bool_, (a, b), out)


def _where_fits(shapes, dtypes, attrs):
    reason = _same_dtype_of(tuple(d.name for d in dtypes[1:]), skip=1)(shapes, dtypes, attrs)
    if reason is not True:
        return reason
    if dtypes[0].name != "bool":
        return f"cond must be bool, got {dtypes[0].name}"
    if dtypes[1].itemsize not in (1, 2, 4, 8):
        return f"elements of {dtypes[1].itemsize} bytes are not handled"
    return True


@kernel(WHERE, backend="c", name="c_where", where=_where_fits, tolerance=NONE, writes_out=True)
@_src
def c_where(cond, a, b, *, out=None):
    """cond ? a : b (any dtype of 1, 2, 4 or 8 bytes: copied as bytes), broadcasting, strided
    inputs: a causal mask from a comparison and two scalars."""
    return _broadcast(f"tg_where_{a.itemsize}", a.dtype, (cond, a, b), out)


def _iota_fits(shapes, dtypes, attrs):
    reason = _library_ok()
    if reason is not None:
        return reason
    dtype = attrs.get("dtype")
    if getattr(dtype, "name", None) not in _NUMBERS:
        return f"iota of {', '.join(_NUMBERS)}, got {getattr(dtype, 'name', dtype)}"
    return True


@kernel(IOTA, backend="c", name="c_iota", where=_iota_fits, tolerance=NONE, writes_out=True)
@_src
def c_iota(length, dtype, *, out=None):
    """0, 1, ..., length - 1 as int32/int64/float32/float64 (a decode mask's key positions)."""
    target = dtype.np_dtype
    out = lib.output(out, (int(length),), target)
    lib.func(LIB, f"tg_iota_{_SUFFIX[target]}", P, I64)(ptr(out), out.size)
    return out


def _cast_fits(shapes, dtypes, attrs):
    reason = _library_ok()
    if reason is not None:
        return reason
    target = getattr(attrs.get("dtype"), "name", None)
    if dtypes[0].name not in _NUMBERS or target not in _FLOATS:
        return f"casts {', '.join(_NUMBERS)} to float32/float64, not {dtypes[0].name} to " \
               f"{target}"
    return True


@kernel(CAST, backend="c", name="c_cast", contiguous=True, where=_cast_fits, tolerance=EXACT,
        writes_out=True)
@_src
def c_cast(x, dtype, *, out=None):
    """int32/int64/float32/float64 to float32/float64, rounded once to nearest (a position
    turned into a rotary angle)."""
    target = dtype.np_dtype
    out = lib.output(out, x.shape, target)
    fn = lib.func(LIB, f"tg_cast_{_SUFFIX[x.dtype]}_{_SUFFIX[target]}", P, P, I64)
    fn(ptr(x), ptr(out), x.size)
    return out


def _float_fits(shapes, dtypes, attrs):
    reason = _library_ok()
    if reason is not None:
        return reason
    return True if dtypes[0].name in _FLOATS else f"takes float32/float64, got {dtypes[0].name}"


def _map(symbol: str, doc: str):
    def run(x, *, out=None):
        out = lib.output(out, x.shape, x.dtype)
        lib.func(LIB, f"tg_{symbol}_{_SUFFIX[x.dtype]}", P, P, I64)(ptr(x), ptr(out), x.size)
        return out

    run.__name__ = run.__qualname__ = f"c_{symbol}"
    run.__doc__ = doc
    return _src(run)


kernel(SIN, backend="c", name="c_sin", contiguous=True, where=_float_fits, tolerance=EXACT,
       writes_out=True)(_map("sin", "sin through double, rounded once (numpy_sin's rounding)."))
kernel(COS, backend="c", name="c_cos", contiguous=True, where=_float_fits, tolerance=EXACT,
       writes_out=True)(_map("cos", "cos as the op defines it, sin(pi/2 - x), through double, "
                                    "rounded once."))
