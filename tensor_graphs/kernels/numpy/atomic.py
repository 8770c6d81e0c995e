"""numpy kernels for the atomic ops (``numpy_<op>``), at each op's own dtype semantics.

float16/bfloat16 compute in float32 and round once, as the reference does; erf, which numpy
lacks, is a vectorised float64 series / continued fraction. Movement ops (reshape, permute,
expand, slice) return views of their input (``view=True``), everything else a new array; all
but the views and ``state_update`` write into ``out=`` when given one (``writes_out``, see the
registry: ufuncs straight through their ``out=``, the rest by one ``np.copyto``).
Tolerances: 1e-12 for ops that do not round (movement, comparisons, max, neg: bit-exact),
1e-7 for correctly rounded ops (one rounding of the exact result), 1e-6 for the transcendental
functions, reductions and matmul (BLAS accumulation order).
"""

from __future__ import annotations

import numpy as np

from tensor_graphs import threads
from tensor_graphs.errors import EvaluationError
from tensor_graphs.ir.dtypes import ALL, FLOATS, NUMBERS
from tensor_graphs.ir.ops import OPS
from tensor_graphs.kernels import storage
from tensor_graphs.kernels.numpy._util import (
    LOW,
    erf,
    into,
    same_dtype,
    ufunc,
    up,
    with_signature,
)
from tensor_graphs.kernels.registry import kernel

NONE = 1e-12  # no rounding at all: the result is bit-exact
EXACT = 1e-7  # one rounding of the exact result: at most 2**-24 relative on float32
CLOSE = 1e-6


def _unary(name: str, fn, dtypes, tolerance: float, doc: str):
    direct = isinstance(fn, np.ufunc)

    def run(x, out=None):
        with np.errstate(all="ignore"):
            if direct:
                return ufunc(fn, x.dtype, out, x)
            return into(fn(up(x)), x.dtype, out)

    with_signature(run, ["x"], {}, doc, source=f"{name}: {getattr(fn, '__name__', fn)}",
                   writes_out=True)
    kernel(name, backend="numpy", name=f"numpy_{name}", dtypes=dtypes,
           tolerance=tolerance, writes_out=True)(run)


_unary("neg", np.negative, NUMBERS, NONE, "-x with numpy (ints wrap like the reference).")
_unary("exp", np.exp, FLOATS, CLOSE, "e**x with numpy.")
_unary("log", np.log, FLOATS, CLOSE, "Natural log with numpy (log 0 = -inf, log(x<0) = nan).")
_unary("sqrt", np.sqrt, FLOATS, EXACT, "Square root with numpy (correctly rounded).")
_unary("reciprocal", np.reciprocal, FLOATS, EXACT, "1/x with numpy (correctly rounded).")
# float32 sin through float64: numpy's float32 sin loses accuracy on large arguments
_unary("sin", lambda x: np.sin(x.astype(np.float64)), FLOATS, EXACT,
       "Sine computed in float64 and rounded once.")
_unary("erf", erf, FLOATS, EXACT, "erf by a float64 series / continued fraction, rounded once.")


def _add(a, b, out=None):
    if a.dtype == np.bool_:
        return ufunc(np.logical_or, a.dtype, out, a, b)
    with np.errstate(all="ignore"):
        return ufunc(np.add, a.dtype, out, a, b)


def _mul(a, b, out=None):
    if a.dtype == np.bool_:
        return ufunc(np.logical_and, a.dtype, out, a, b)
    with np.errstate(all="ignore"):
        return ufunc(np.multiply, a.dtype, out, a, b)


def _maximum(a, b, out=None):
    return ufunc(np.maximum, a.dtype, out, a, b)


def _pow(a, b, out=None):
    if a.dtype.kind in "iu" and np.any(b < 0):
        raise EvaluationError("numpy_pow: integers to negative integer powers are undefined")
    with np.errstate(all="ignore"):
        return ufunc(np.power, a.dtype, out, a, b)


def _equal(a, b, out=None):
    return ufunc(np.equal, np.bool_, out, a, b)


def _less(a, b, out=None):
    return ufunc(np.less, np.bool_, out, a, b)


for _name, _fn, _dtypes, _tol, _doc in (
    ("add", _add, ALL, EXACT, "a + b with numpy (logical or on bool)."),
    ("mul", _mul, ALL, EXACT, "a * b with numpy (logical and on bool)."),
    ("maximum", _maximum, ALL, NONE, "Elementwise max with numpy; nan propagates."),
    ("pow", _pow, NUMBERS, CLOSE, "a ** b with numpy."),
    ("equal", _equal, ALL, NONE, "a == b with numpy."),
    ("less", _less, ALL, NONE, "a < b with numpy."),
):
    with_signature(_fn, ["a", "b"], {}, _doc, source=_name, writes_out=True)
    kernel(_name, backend="numpy", name=f"numpy_{_name}", dtypes=_dtypes, where=same_dtype,
           tolerance=_tol, writes_out=True)(_fn)


def _ab_same_dtype(shapes, dtypes, attrs):
    if dtypes[1] != dtypes[2]:
        return f"a and b must share one dtype, got {dtypes[1].name} and {dtypes[2].name}"
    return True


@kernel("where", backend="numpy", name="numpy_where", where=_ab_same_dtype, tolerance=NONE,
        writes_out=True)
def numpy_where(cond, a, b, *, out=None):
    """cond ? a : b with numpy.where (broadcasting); into out by two masked copies."""
    if out is None:
        return into(np.where(cond, a, b), a.dtype)
    np.copyto(out, b)
    np.copyto(out, a, where=cond)
    return out


@kernel("cast", backend="numpy", name="numpy_cast", tolerance=EXACT, writes_out=True)
def numpy_cast(x, dtype, *, out=None):
    """Convert with astype: float to int truncates toward zero, nonzero (nan too) is True."""
    target = dtype.np_dtype
    if target.kind == "b":
        if out is not None:
            return np.not_equal(x, 0, out=out)
        return np.asarray(x != 0)
    if target.kind in "iu" and x.dtype.kind in "fV":
        with np.errstate(all="ignore"):
            return into(np.trunc(up(x)), target, out)
    if out is not None:
        np.copyto(out, x, casting="unsafe")
        return out
    return np.array(x, dtype=target, copy=True)


@kernel("sum", backend="numpy", name="numpy_sum", dtypes=NUMBERS, tolerance=CLOSE,
        writes_out=True)
def numpy_sum(x, axes, keepdims, *, out=None):
    """Sum over axes with numpy (pairwise for floats; float16/bfloat16 accumulate in float32)."""
    with np.errstate(all="ignore"):
        if out is not None and x.dtype not in LOW:
            return np.sum(x, axis=tuple(axes), keepdims=keepdims, dtype=x.dtype, out=out)
        a = up(x)
        return into(np.sum(a, axis=tuple(axes), keepdims=keepdims, dtype=a.dtype), x.dtype,
                    out)


@kernel("max", backend="numpy", name="numpy_max", tolerance=NONE, writes_out=True)
def numpy_max(x, axes, keepdims, *, out=None):
    """Maximum over axes with numpy; nan propagates."""
    if out is not None and x.dtype not in LOW:
        return np.max(x, axis=tuple(axes), keepdims=keepdims, out=out)
    if out is not None:
        return into(np.max(up(x), axis=tuple(axes), keepdims=keepdims), x.dtype, out)
    return np.array(np.max(up(x), axis=tuple(axes), keepdims=keepdims), dtype=x.dtype)


@kernel("reshape", backend="numpy", name="numpy_reshape", view=True, tolerance=NONE)
def numpy_reshape(x, shape):
    """Row-major reshape: a view when the layout allows, else a copy."""
    return np.reshape(x, tuple(shape))


@kernel("permute", backend="numpy", name="numpy_permute", view=True, tolerance=NONE)
def numpy_permute(x, perm):
    """Axis permutation: a strided view."""
    return np.transpose(x, tuple(perm))


@kernel("expand", backend="numpy", name="numpy_expand", view=True, tolerance=NONE)
def numpy_expand(x, shape):
    """Broadcast size-1 axes: a read-only view with zero strides."""
    return np.broadcast_to(x, tuple(shape))


@kernel("slice", backend="numpy", name="numpy_slice", view=True, tolerance=NONE)
def numpy_slice(x, starts, stops, steps):
    """Strided window: a view (negative steps too; a stop of -1 means before index 0)."""
    index = tuple(slice(0, 0) if a < 0 else slice(a, None if c < 0 else c, s)
                  for a, c, s in zip(starts, stops, steps))
    return x[index]


@kernel("pad", backend="numpy", name="numpy_pad", tolerance=NONE, writes_out=True)
def numpy_pad(x, pads, value, *, out=None):
    """Constant padding with numpy.pad (into out: fill, then copy x into the window)."""
    if out is None:
        return into(np.pad(up(x), [tuple(p) for p in pads], constant_values=value), x.dtype)
    fill = np.empty((), up(x[:0] if x.ndim else x).dtype)
    fill[()] = value  # as numpy.pad assigns it (in float32 for float16/bfloat16)
    out.fill(fill.astype(x.dtype))
    window = tuple(slice(lo, lo + n) for (lo, _), n in zip(pads, x.shape))
    np.copyto(out[window], x)
    return out


@kernel("concat", backend="numpy", name="numpy_concat", where=same_dtype, tolerance=NONE,
        writes_out=True)
def numpy_concat(*xs, axis, out=None):
    """Join any number of tensors along an axis (numpy.concatenate; variadic: concat(*xs))."""
    return np.concatenate(xs, axis=axis, out=out)


def _index_dtype(shapes, dtypes, attrs):
    return True if dtypes[1].is_int else f"indices must be ints, got {dtypes[1].name}"


@kernel("gather", backend="numpy", name="numpy_gather", where=_index_dtype, tolerance=NONE,
        writes_out=True)
def numpy_gather(x, indices, axis, *, out=None):
    """numpy.take along one axis; an index outside [0, size) raises EvaluationError."""
    size = x.shape[axis]
    if indices.size and (indices.min() < 0 or indices.max() >= size):
        bad = indices[(indices < 0) | (indices >= size)].flat[0]
        raise EvaluationError(f"numpy_gather: index {bad} is out of range for axis {axis} of "
                              f"size {size}")
    if out is not None:  # in range (checked): "clip" writes out without a buffered copy
        return np.take(x, indices, axis=axis, out=out, mode="clip")
    return np.take(x, indices, axis=axis)


@kernel("matmul", backend="numpy", name="numpy_matmul", dtypes=NUMBERS, where=same_dtype,
        tolerance=CLOSE, writes_out=True)
def numpy_matmul(a, b, *, out=None):
    """numpy.matmul (BLAS for float32/float64; float16/bfloat16 in float32, rounded once), its
    BLAS pool on the C kernels' team (``threads.blas_follows_team`` says why)."""
    with np.errstate(all="ignore"), threads.blas_follows_team():
        return ufunc(np.matmul, a.dtype, out, a, b)


@kernel("iota", backend="numpy", name="numpy_iota", tolerance=NONE, writes_out=True)
def numpy_iota(length, dtype, *, out=None):
    """0, 1, ..., length-1 in the given dtype."""
    return into(np.arange(length), dtype.np_dtype, out)


def _to_cpu(shapes, dtypes, attrs):
    device = str(attrs.get("device", "cpu"))
    return True if device == "cpu" else f"copies to the cpu only, not to {device}"


@kernel("copy_to", backend="numpy", name="numpy_copy_to", where=_to_cpu, tolerance=NONE,
        writes_out=True)
def numpy_copy_to(x, device, *, out=None):
    """A copy in host memory (the target device is the cpu)."""
    if out is not None:
        np.copyto(out, x)
        return out
    return np.array(x, copy=True)


@kernel("state_update", backend="numpy", name="numpy_state_update", where=same_dtype,
        tolerance=NONE)
def numpy_state_update(state, value, axis, offset):
    """A new version of the state with value written at offset along axis (may grow it).
    Appending to a state a program keeps in its own buffer (``kernels.storage``) writes in
    place and returns the longer prefix; anything else copies, as the reference does. The
    profiler times it on a state leaf (``profiler.measure.STATE_OPS``): on an input leaf the
    op's check failed, and the failure rows made decode plan the float64 reference."""
    if offset == state.shape[axis]:
        longer = storage.grown(state, axis, offset + value.shape[axis])
        if longer is not None:
            index = [slice(None)] * state.ndim
            index[axis] = slice(offset, offset + value.shape[axis])
            longer[tuple(index)] = value
            return longer
    return OPS["state_update"].reference([state, value], {"axis": axis, "offset": offset})
