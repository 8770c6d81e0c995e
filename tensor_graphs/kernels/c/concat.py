"""C concat of any number of tensors along one axis, any dtype (bytes copied: bit-exact).

A rotary model's decode builds its angle table as ``concat([angles, angles], -1)`` per call;
with numpy's concat the program was not all C and never ran in the native loop. Inputs are
read densely (``contiguous``): each is ``outer`` rows of its part of the axis times the axes
after it, and the result row is their concatenation (``tg_concat`` in pointwise.c). Writes into
``out=`` when given one (``writes_out``: see the registry).
"""

from __future__ import annotations

import ctypes
import math

from tensor_graphs.ir.ops.names import CONCAT
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.c.lib import I64, P, ptr
from tensor_graphs.kernels.c.pointwise import LIB, SOURCE
from tensor_graphs.kernels.registry import kernel


def _fits(shapes, dtypes, attrs):
    reason = lib.failure(LIB)
    if reason is not None:
        return reason
    if len(set(dtypes)) > 1:
        return f"inputs must share one dtype, got {', '.join(d.name for d in dtypes)}"
    if not shapes or not len(shapes[0]):
        return "needs inputs with at least one axis"
    return True


_ARGS = (I64, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64), P, I64)


def _src(fn):
    fn.source_text = SOURCE + "\n/* c_concat */"
    return fn


@kernel(CONCAT, backend="c", name="c_concat", contiguous=True, where=_fits, tolerance=1e-12,
        writes_out=True)
@_src
def c_concat(*xs, axis, out=None):
    """Join any number of tensors along an axis (variadic: concat(*xs)), any dtype."""
    first = xs[0]
    axis = axis + first.ndim if axis < 0 else axis
    shape = list(first.shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    out = lib.output(out, tuple(shape), first.dtype)
    if out.size == 0:
        return out
    outer = math.prod(shape[:axis])
    inner = math.prod(shape[axis + 1:]) * first.itemsize
    k = len(xs)
    pointers = (ctypes.c_void_p * k)(*[ptr(x) for x in xs])
    rows = (ctypes.c_int64 * k)(*[x.shape[axis] * inner for x in xs])
    lib.func(LIB, "tg_concat", *_ARGS)(k, pointers, rows, ptr(out), outer)
    return out

