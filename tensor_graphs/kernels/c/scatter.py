"""C scatter-add of rows: the atomic ``scatter`` with reduce "sum" along axis 0, float32 or
float64, int32/int64 indices (an embedding's gradient: ids' rows added into the table).

Copying x into the result is most of the work for a large table (154 MB for GPT-2's 50,257 x
768); the additions themselves are ids x dim. numpy's kernel sorts the ids and sums rows per
id (``add.reduceat``), which costs as much again as the copy; here each thread adds a band of
columns for every id in index order, so the sums are the reference's, bit for bit. Measured
numbers are in the commit that added this file. An index out of range makes the C function
return before writing; the wrapper raises ``EvaluationError`` naming it, as ``numpy_scatter``
does.
"""

from __future__ import annotations

import ctypes
import inspect
import math

import numpy as np

from tensor_graphs.errors import EvaluationError
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.c.lib import I64, P, ptr
from tensor_graphs.kernels.registry import kernel
from tensor_graphs.kernels.signatures import Spec

LIB = "scatter"
SOURCE = lib.source(LIB)
NONE = 1e-12  # every element sums its updates in the reference's order
_SYMBOL = {(i, f): f"tg_scatter_add_rows_{si}_{sf}"
           for i, si in ((np.dtype(np.int32), "i32"), (np.dtype(np.int64), "i64"))
           for f, sf in ((np.dtype(np.float32), "f32"), (np.dtype(np.float64), "f64"))}
_ARGS = (P, P, I64, P, P, I64, I64)


def _fits(shapes, dtypes, attrs):
    reason = lib.failure(LIB)
    if reason is not None:
        return reason
    if attrs.get("reduce") != "sum" or attrs.get("axis") != 0:
        return f"adds rows (reduce='sum', axis=0), not reduce={attrs.get('reduce')!r} " \
               f"axis={attrs.get('axis')}"
    if dtypes[1].name not in ("int32", "int64"):
        return f"indices must be int32 or int64, got {dtypes[1].name}"
    if dtypes[0].name not in ("float32", "float64") or dtypes[2] != dtypes[0]:
        return f"x and updates must both be float32 or both float64, got {dtypes[0].name} " \
               f"and {dtypes[2].name}"
    if len(shapes[0]) == 0:
        return "x must have at least one axis"
    return True


def _signatures() -> list[dict]:
    out = []
    for x, idx, it, dt in (((33, 7), (5,), "int64", "float32"),
                           ((50, 16), (4, 33), "int32", "float32"),
                           ((1025, 96), (300,), "int64", "float32"),
                           ((7,), (9,), "int64", "float64"),
                           ((9, 2, 3), (2, 2), "int32", "float64"),
                           ((1, 1), (1,), "int64", "float32")):
        out.append({"x": (x, dt), "indices": Spec(idx, it, "index", x[0]),
                    "updates": (idx + x[1:], dt), "axis": 0, "reduce": "sum"})
    return out


def _native(a: np.ndarray) -> np.ndarray:
    if a.flags.c_contiguous and a.dtype.isnative:
        return a
    return np.ascontiguousarray(a, a.dtype.newbyteorder("="))


def _src(fn):
    fn.source_text = SOURCE + inspect.getsource(_native)
    return fn


@kernel("scatter", backend="c", name="c_scatter_add_rows", contiguous=True, where=_fits,
        signatures=_signatures, tolerance=NONE, writes_out=True)
@_src
def c_scatter_add_rows(x, indices, updates, axis, reduce, *, out=None):
    """x with updates[i] added into row indices[i] (every repeat adds), float32/float64; an
    index out of range raises."""
    x, indices, updates = _native(x), _native(indices), _native(updates)
    rows = x.shape[0]
    dim = math.prod(x.shape[1:])
    out = lib.output(out, x.shape, x.dtype)
    fn = lib.func(LIB, _SYMBOL[indices.dtype, x.dtype], *_ARGS)
    if fn.restype is not ctypes.c_int:
        fn.restype = ctypes.c_int
    if fn(ptr(x), ptr(indices), indices.size, ptr(updates), ptr(out), rows, dim):
        bad = indices[(indices < 0) | (indices >= rows)].flat[0]
        raise EvaluationError(f"c_scatter_add_rows: index {bad} is out of range for axis 0 of "
                              f"size {rows}")
    return out
