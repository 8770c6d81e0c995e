"""C gather and embedding: slices of a tensor picked by int32/int64 indices, any dtype.

``c_embedding`` is ``embedding(ids, table)``: a row of the (rows, dim) table per id, any ids
shape, float tables (float16, bfloat16, float32, float64). ``c_gather`` is the atomic
``gather(x, indices, axis)`` (numpy.take along one axis), any dtype. Both copy bytes (bit-exact).
``c_embedding_add`` is ``embedding(ids, table) + x`` (float32/float64) with x of the result's
shape or its trailing rows repeated: a transformer's token + position embeddings in one pass
(GPT-2's first add, which would otherwise keep a numpy or torch add in the program). All take
C-contiguous inputs, write into ``out=`` when given one (``writes_out``: see the registry) and
work on rows in parallel (OpenMP) when there are enough bytes (see gather.c).

An index out of range makes the C function return 1 before it writes anything; the wrapper then
raises ``EvaluationError`` naming the index and the size, as ``numpy_embedding`` and
``numpy_gather`` do. In the native loop a nonzero result stops the runner and the Python loop
runs that call again, so the error is this one.
"""

from __future__ import annotations

import ctypes
import inspect
import math

import numpy as np

from tensor_graphs.errors import EvaluationError
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.dtypes import FLOATS
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.c.lib import I64, P, ptr
from tensor_graphs.kernels.registry import kernel
from tensor_graphs.kernels.signatures import Spec

LIB = "gather"
SOURCE = lib.source(LIB)
NONE = 1e-12  # no rounding: bit-exact
_INDEX = {np.dtype(np.int32): "i32", np.dtype(np.int64): "i64"}


def _index_ok(dtype) -> str | None:
    if dtype.name not in ("int32", "int64"):
        return f"indices must be int32 or int64, got {dtype.name}"
    return None


def _embedding_fits(shapes, dtypes, attrs):
    reason = lib.failure(LIB) or _index_ok(dtypes[0])
    if reason is not None:
        return reason
    if dtypes[1] not in FLOATS:
        return (f"the table must be a float tensor ({', '.join(d.name for d in FLOATS)}), got "
                f"{dtypes[1].name}")
    if len(shapes[1]) != 2:
        return f"the table must be 2-D (rows, dim), got {tuple(shapes[1])}"
    return True


def _gather_fits(shapes, dtypes, attrs):
    reason = lib.failure(LIB) or _index_ok(dtypes[1])
    if reason is not None:
        return reason
    if len(shapes[0]) == 0:
        return "x must have at least one axis"
    return True


def _native(a: np.ndarray) -> np.ndarray:
    """``a`` C-contiguous in native byte order (itself when it already is)."""
    if a.flags.c_contiguous and a.dtype.isnative:
        return a
    return np.ascontiguousarray(a, a.dtype.newbyteorder("="))


_ARGS = (P, I64, P, P, I64, I64, I64)
_SYMBOL = {dt: f"tg_gather_{suffix}" for dt, suffix in _INDEX.items()}
_INT = ctypes.c_int


def _gather(idx: np.ndarray, x: np.ndarray, axis: int, out) -> np.ndarray | None:
    """``np.take(x, idx, axis)`` in C (into ``out`` when given); None when an index is out of
    range (nothing written). Kept lean: a GPT-2 row is a few microseconds of copying."""
    if not (idx.flags.c_contiguous and idx.dtype.isnative):
        idx = _native(idx)
    if not (x.flags.c_contiguous and x.dtype.isnative):
        x = _native(x)
    shape = x.shape
    out = lib.output(out, shape[:axis] + idx.shape + shape[axis + 1:], x.dtype)
    fn = lib.func(LIB, _SYMBOL[idx.dtype], *_ARGS)
    if fn.restype is not _INT:
        fn.restype = _INT
    inner = x.itemsize if axis == len(shape) - 1 else math.prod(shape[axis + 1:]) * x.itemsize
    if fn(ptr(idx), idx.size, ptr(x), ptr(out), math.prod(shape[:axis]) if axis else 1,
          shape[axis], inner):
        return None
    return out


def _first_bad(idx: np.ndarray, size: int):
    return idx[(idx < 0) | (idx >= size)].flat[0]


def _src(fn):
    """The C source and the shared wrapper go into the kernel's source hash."""
    fn.source_text = SOURCE + inspect.getsource(_gather) + inspect.getsource(_native)
    return fn


@kernel("embedding", backend="c", name="c_embedding", contiguous=True, where=_embedding_fits,
        tolerance=NONE, writes_out=True)
@_src
def c_embedding(ids, table, *, out=None):
    """Rows of the table picked by int32/int64 ids (any shape); an id out of range raises."""
    got = _gather(ids, table, 0, out)
    if got is None:
        rows = table.shape[0]
        raise EvaluationError(f"c_embedding: id {_first_bad(ids, rows)} is out of range for a "
                              f"table of {rows} rows")
    return got


@kernel("gather", backend="c", name="c_gather", contiguous=True, where=_gather_fits,
        tolerance=NONE, writes_out=True)
@_src
def c_gather(x, indices, axis, *, out=None):
    """numpy.take along one axis with int32/int64 indices, any dtype; out of range raises."""
    got = _gather(indices, x, axis, out)
    if got is None:
        size = x.shape[axis]
        raise EvaluationError(f"c_gather: index {_first_bad(indices, size)} is out of range "
                              f"for axis {axis} of size {size}")
    return got


_ADD_SYMBOL = {(i, f): f"tg_embedding_add_{si}_{sf}" for i, si in _INDEX.items()
               for f, sf in ((np.dtype(np.float32), "f32"), (np.dtype(np.float64), "f64"))}
_ADD_ARGS = (P, I64, P, P, I64, P, I64, I64)


def _strip_ones(shape) -> tuple:
    """``shape`` without its leading 1s (the last axis is kept)."""
    shape = tuple(shape)
    while len(shape) > 1 and shape[0] == 1:
        shape = shape[1:]
    return shape


def _embedding_add_fits(shapes, dtypes, attrs):
    reason = lib.failure(LIB) or _index_ok(dtypes[0])
    if reason is not None:
        return reason
    if dtypes[1].name not in ("float32", "float64") or dtypes[2] != dtypes[1]:
        return f"table and x must both be float32 or both float64, got {dtypes[1].name} and " \
               f"{dtypes[2].name}"
    ids, table, x = (tuple(s) for s in shapes)
    if len(table) != 2:
        return f"the table must be 2-D (rows, dim), got {table}"
    result = ids + table[1:]
    tail = _strip_ones(x)
    if len(x) > len(result) or not tail or tail != result[len(result) - len(tail):]:
        return f"x {x} must be the result's shape {result} or a trailing part of it (rows " \
               f"repeated over the leading axes), with at least the last axis"
    return True


def _embedding_add_signatures() -> list[dict]:
    out = []
    for ids, it, table, x, dt in (((7,), "int64", (33, 5), (7, 5), "float32"),
                                  ((2, 3), "int32", (7, 4), (2, 3, 4), "float32"),
                                  ((2, 3), "int64", (7, 4), (1, 3, 4), "float32"),
                                  ((4, 33), "int64", (50, 16), (33, 16), "float32"),
                                  ((1, 129), "int32", (1025, 3), (1, 129, 3), "float32"),
                                  ((3,), "int64", (9, 1025), (1025,), "float32"),
                                  ((1,), "int64", (1, 1), (1, 1), "float32"),
                                  ((2, 3), "int32", (7, 4), (3, 4), "float64")):
        out.append({"ids": Spec(ids, it, "index", table[0]), "table": (table, dt), "x": (x, dt)})
    return out


@kernel(lambda ids, table, x: tg.embedding(ids, table) + x, backend="c",
        name="c_embedding_add", contiguous=True, where=_embedding_add_fits, tolerance=1e-7,
        signatures=_embedding_add_signatures, writes_out=True)
@_src
def c_embedding_add(ids, table, x, *, out=None):
    """embedding(ids, table) + x in one pass (x: the result's shape, or its trailing rows
    repeated: token + position embeddings); an id out of range raises."""
    ids, table, x = _native(ids), _native(table), _native(x)
    rows, dim = table.shape
    out = lib.output(out, ids.shape + (dim,), table.dtype)
    fn = lib.func(LIB, _ADD_SYMBOL[ids.dtype, table.dtype], *_ADD_ARGS)
    if fn.restype is not _INT:
        fn.restype = _INT
    if fn(ptr(ids), ids.size, ptr(table), ptr(x), x.size // dim if dim else 1, ptr(out),
          rows, dim):
        raise EvaluationError(f"c_embedding_add: id {_first_bad(ids, rows)} is out of range "
                              f"for a table of {rows} rows")
    return out
