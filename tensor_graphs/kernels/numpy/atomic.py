"""numpy kernels for the atomic ops (``numpy_<op>``), at each op's own dtype semantics.

float16/bfloat16 compute in float32 and round once, as the reference does; erf, which numpy
lacks, is a vectorised float64 series / continued fraction. Movement ops (reshape, permute,
expand, slice) return views of their input (``view=True``), everything else a new array.
Tolerances: 1e-12 for ops that do not round (movement, comparisons, max, neg: bit-exact),
1e-7 for correctly rounded ops (one rounding of the exact result), 1e-6 for the transcendental
functions, reductions and matmul (BLAS accumulation order).
"""

from __future__ import annotations

import numpy as np

from tensor_graphs.errors import EvaluationError
from tensor_graphs.ir.ops import OPS
from tensor_graphs.kernels.numpy._util import (
    ALL,
    FLOATS,
    NUMBERS,
    erf,
    out,
    same_dtype,
    up,
    with_signature,
)
from tensor_graphs.kernels.registry import kernel

NONE = 1e-12  # no rounding at all: the result is bit-exact
EXACT = 1e-7  # one rounding of the exact result: at most 2**-24 relative on float32
CLOSE = 1e-6


def _unary(name: str, fn, dtypes, tolerance: float, doc: str):
    def run(x):
        with np.errstate(all="ignore"):
            return out(fn(up(x)), x.dtype)

    with_signature(run, ["x"], {}, doc, source=f"{name}: {getattr(fn, '__name__', fn)}")
    kernel(name, backend="numpy", name=f"numpy_{name}", dtypes=dtypes,
           tolerance=tolerance)(run)


_unary("neg", np.negative, NUMBERS, NONE, "-x with numpy (ints wrap like the reference).")
_unary("exp", np.exp, FLOATS, CLOSE, "e**x with numpy.")
_unary("log", np.log, FLOATS, CLOSE, "Natural log with numpy (log 0 = -inf, log(x<0) = nan).")
_unary("sqrt", np.sqrt, FLOATS, EXACT, "Square root with numpy (correctly rounded).")
_unary("reciprocal", np.reciprocal, FLOATS, EXACT, "1/x with numpy (correctly rounded).")
# float32 sin through float64: numpy's float32 sin loses accuracy on large arguments
_unary("sin", lambda x: np.sin(x.astype(np.float64)), FLOATS, EXACT,
       "Sine computed in float64 and rounded once.")
_unary("erf", erf, FLOATS, EXACT, "erf by a float64 series / continued fraction, rounded once.")


def _add(a, b):
    if a.dtype == np.bool_:
        return np.logical_or(a, b)
    with np.errstate(all="ignore"):
        return out(np.add(up(a), up(b)), a.dtype)


def _mul(a, b):
    if a.dtype == np.bool_:
        return np.logical_and(a, b)
    with np.errstate(all="ignore"):
        return out(np.multiply(up(a), up(b)), a.dtype)


def _maximum(a, b):
    return out(np.maximum(up(a), up(b)), a.dtype)


def _pow(a, b):
    if a.dtype.kind in "iu" and np.any(b < 0):
        raise EvaluationError("numpy_pow: integers to negative integer powers are undefined")
    with np.errstate(all="ignore"):
        return out(np.power(up(a), up(b)), a.dtype)


def _equal(a, b):
    return out(np.equal(up(a), up(b)), np.bool_)


def _less(a, b):
    return out(np.less(up(a), up(b)), np.bool_)


for _name, _fn, _dtypes, _tol, _doc in (
    ("add", _add, ALL, EXACT, "a + b with numpy (logical or on bool)."),
    ("mul", _mul, ALL, EXACT, "a * b with numpy (logical and on bool)."),
    ("maximum", _maximum, ALL, NONE, "Elementwise max with numpy; nan propagates."),
    ("pow", _pow, NUMBERS, CLOSE, "a ** b with numpy."),
    ("equal", _equal, ALL, NONE, "a == b with numpy."),
    ("less", _less, ALL, NONE, "a < b with numpy."),
):
    with_signature(_fn, ["a", "b"], {}, _doc, source=_name)
    kernel(_name, backend="numpy", name=f"numpy_{_name}", dtypes=_dtypes, where=same_dtype,
           tolerance=_tol)(_fn)


def _ab_same_dtype(shapes, dtypes, attrs):
    if dtypes[1] != dtypes[2]:
        return f"a and b must share one dtype, got {dtypes[1].name} and {dtypes[2].name}"
    return True


@kernel("where", backend="numpy", name="numpy_where", where=_ab_same_dtype, tolerance=NONE)
def numpy_where(cond, a, b):
    """cond ? a : b with numpy.where (broadcasting)."""
    return out(np.where(cond, a, b), a.dtype)


@kernel("cast", backend="numpy", name="numpy_cast", tolerance=EXACT)
def numpy_cast(x, dtype):
    """Convert with astype: float to int truncates toward zero, nonzero (nan too) is True."""
    target = dtype.np_dtype
    if target.kind == "b":
        return np.asarray(x != 0)
    if target.kind in "iu" and x.dtype.kind in "fV":
        with np.errstate(all="ignore"):
            return np.trunc(up(x)).astype(target)
    return np.array(x, dtype=target, copy=True)


@kernel("sum", backend="numpy", name="numpy_sum", dtypes=NUMBERS, tolerance=CLOSE)
def numpy_sum(x, axes, keepdims):
    """Sum over axes with numpy (pairwise for floats; float16/bfloat16 accumulate in float32)."""
    with np.errstate(all="ignore"):
        a = up(x)
        return out(np.sum(a, axis=tuple(axes), keepdims=keepdims, dtype=a.dtype), x.dtype)


@kernel("max", backend="numpy", name="numpy_max", tolerance=NONE)
def numpy_max(x, axes, keepdims):
    """Maximum over axes with numpy; nan propagates."""
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


@kernel("pad", backend="numpy", name="numpy_pad", tolerance=NONE)
def numpy_pad(x, pads, value):
    """Constant padding with numpy.pad."""
    return out(np.pad(up(x), [tuple(p) for p in pads], constant_values=value), x.dtype)


@kernel("concat", backend="numpy", name="numpy_concat", where=same_dtype, tolerance=NONE)
def numpy_concat(*xs, axis):
    """Join any number of tensors along an axis (numpy.concatenate; variadic: concat(*xs))."""
    return np.concatenate(xs, axis=axis)


def _index_dtype(shapes, dtypes, attrs):
    return True if dtypes[1].is_int else f"indices must be ints, got {dtypes[1].name}"


@kernel("gather", backend="numpy", name="numpy_gather", where=_index_dtype, tolerance=NONE)
def numpy_gather(x, indices, axis):
    """numpy.take along one axis; an index outside [0, size) raises EvaluationError."""
    size = x.shape[axis]
    if indices.size and (indices.min() < 0 or indices.max() >= size):
        bad = indices[(indices < 0) | (indices >= size)].flat[0]
        raise EvaluationError(f"numpy_gather: index {bad} is out of range for axis {axis} of "
                              f"size {size}")
    return np.take(x, indices, axis=axis)


@kernel("matmul", backend="numpy", name="numpy_matmul", dtypes=NUMBERS, where=same_dtype,
        tolerance=CLOSE)
def numpy_matmul(a, b):
    """numpy.matmul (BLAS for float32/float64; float16/bfloat16 in float32, rounded once)."""
    with np.errstate(all="ignore"):
        return out(np.matmul(up(a), up(b)), a.dtype)


@kernel("iota", backend="numpy", name="numpy_iota", tolerance=NONE)
def numpy_iota(length, dtype):
    """0, 1, ..., length-1 in the given dtype."""
    return np.arange(length).astype(dtype.np_dtype)


def _to_cpu(shapes, dtypes, attrs):
    device = str(attrs.get("device", "cpu"))
    return True if device == "cpu" else f"copies to the cpu only, not to {device}"


@kernel("copy_to", backend="numpy", name="numpy_copy_to", where=_to_cpu, tolerance=NONE)
def numpy_copy_to(x, device):
    """A copy in host memory (the target device is the cpu)."""
    return np.array(x, copy=True)


@kernel("state_update", backend="numpy", name="numpy_state_update", where=same_dtype,
        tolerance=NONE)
def numpy_state_update(state, value, axis, offset):
    """A new version of the state with value written at offset along axis (may grow it)."""
    return OPS["state_update"].reference([state, value], {"axis": axis, "offset": offset})
