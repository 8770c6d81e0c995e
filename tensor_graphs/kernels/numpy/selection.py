"""numpy kernels of the selection and scatter ops (``argsort``, ``scatter``) and the cases
every kernel of the family (the composites' exact kernels too) is verified on.

``numpy_scatter`` has two paths. ``ufunc.at`` applies the updates one after another in index
order, as the reference does, so it is bit-exact; for a sum of rows into a large table (an
embedding's gradient: a few thousand ids into 50,257 rows of 768) it is slow, because
``add.at`` walks the rows one element at a time. There the rows are sorted by destination and
summed per destination with ``add.reduceat``, then added once per distinct row: the same
terms in the same order per row, float32 sums rounded pairwise instead of serially.
"""

from __future__ import annotations

import numpy as np

from tensor_graphs.errors import EvaluationError
from tensor_graphs.ir.dtypes import ALL as ALL_DTYPES
from tensor_graphs.ir.ops.atomic import SCATTER_REDUCE
from tensor_graphs.kernels.numpy._util import into, up
from tensor_graphs.kernels.registry import kernel
from tensor_graphs.kernels.signatures import ALL, NUMBERS, OpCase, S, generator

NONE = 1e-12  # a permutation of the input, or updates applied in the reference's order
CLOSE = 1e-6  # sums in another order
ROWS_AT_LEAST = 64  # row length from which row sums beat add.at's element walk


@kernel("argsort", backend="numpy", name="numpy_argsort", dtypes=ALL_DTYPES, tolerance=NONE,
        writes_out=True)
def numpy_argsort(x, axis, descending, *, out=None):
    """Stable argsort (numpy's radix/timsort); descending sorts the reversed axis ascending
    and reverses the order back, so equal elements keep their order and nans come first."""
    a = up(x)
    if not descending:
        return into(np.argsort(a, axis=axis, kind="stable"), np.int64, out)
    order = np.argsort(np.flip(a, axis), axis=axis, kind="stable")
    return into(x.shape[axis] - 1 - np.flip(order, axis), np.int64, out)


def _index_dtype(shapes, dtypes, attrs):
    if not dtypes[1].is_int:
        return f"indices must be ints, got {dtypes[1].name}"
    if dtypes[0] != dtypes[2]:
        return f"x and updates must share one dtype, got {dtypes[0].name} and {dtypes[2].name}"
    return True


@kernel("scatter", backend="numpy", name="numpy_scatter", dtypes=ALL_DTYPES,
        where=_index_dtype, tolerance=CLOSE, writes_out=True)
def numpy_scatter(x, indices, updates, axis, reduce, *, out=None):
    """x with the updates combined in at the indices (ufunc.at; a sum of long rows along
    axis 0 by sorted row sums); an index outside [0, size) raises EvaluationError."""
    size = x.shape[axis]
    if indices.size and (indices.min() < 0 or indices.max() >= size):
        bad = indices[(indices < 0) | (indices >= size)].flat[0]
        raise EvaluationError(f"numpy_scatter: index {bad} is out of range for axis {axis} "
                              f"of size {size}")
    numbers, bools = SCATTER_REDUCE[reduce]
    direct = out is not None and x.dtype == up(x).dtype  # accumulate in out itself
    if direct:
        np.copyto(out, x)
    result = out if direct else np.array(up(x), copy=True)
    values = up(updates)
    row = int(np.prod(x.shape[1:])) if x.ndim > 1 else 1
    if (reduce == "sum" and axis == 0 and row >= ROWS_AT_LEAST and indices.size > 1
            and x.dtype != np.bool_):
        flat = indices.reshape(-1)
        order = np.argsort(flat, kind="stable")
        targets = flat[order]
        starts = np.flatnonzero(np.r_[True, targets[1:] != targets[:-1]])
        rows = values.reshape((flat.size, -1))[order]
        sums = np.add.reduceat(rows, starts, axis=0)
        view = result.reshape((size, -1))
        view[targets[starts]] += sums
    else:
        ufunc = bools if x.dtype == np.bool_ else numbers
        with np.errstate(all="ignore"):
            ufunc.at(result, (slice(None),) * axis + (indices,), values)
    return result if direct else into(result, x.dtype, out)


# ---------------------------------------------------------------------------- verification
@generator("argsort", dtypes=ALL)
def _argsort(dt, arity):
    table = [((7,), 0, False), ((7, 33), 1, True), ((33, 7), 0, False), ((1,), 0, True),
             ((2, 3, 1025), 2, False), ((5, 4, 3), 1, True)]
    return [OpCase((S(s, dt, "ties"),), {"axis": a, "descending": d}) for s, a, d in table]


SCATTERS = [((33, 7), (5,), 0), ((7, 33), (2, 3), 1), ((1025,), (2049,), 0),
            ((1,), (3,), 0), ((2, 3, 4), (9,), 2), ((257, 96), (300,), 0)]


@generator("scatter", dtypes=ALL)
def _scatter(dt, arity):
    cases = []
    for i, (s, idx, a) in enumerate(SCATTERS):
        updates = s[:a] + idx + s[a + 1:]
        for reduce in SCATTER_REDUCE if i < 2 else ("sum", list(SCATTER_REDUCE)[i % 4]):
            values = "near_one" if reduce == "prod" else "normal"
            cases.append(OpCase((S(s, dt), S(idx, "int64", "index", s[a]),
                                 S(updates, dt, values)), {"axis": a, "reduce": reduce}))
    return cases


ALONG = [((7, 33), (7, 5), 1), ((33, 7), (40, 7), 0), ((4, 5, 6), (3, 5, 2), 2),
         ((1,), (3,), 0), ((1025,), (1025,), 0)]


@generator("take_along_axis", dtypes=ALL)
def _take_along(dt, arity):
    return [OpCase((S(s, dt), S(i, "int64", "index", s[a])), {"axis": a}) for s, i, a in ALONG]


@generator("put_along_axis", dtypes=NUMBERS)
def _put_along(dt, arity):
    reduces = [("replace", True), ("sum", True), ("prod", False), ("amax", True),
               ("amin", False), ("mean", True), ("mean", False)]
    cases = []
    for k, (s, i, a) in enumerate(ALONG):
        for reduce, include in reduces[k::2] if k else reduces:
            if reduce == "mean" and dt not in ("float32", "float64", "float16", "bfloat16"):
                continue
            values = "near_one" if reduce == "prod" else "normal"
            cases.append(OpCase((S(s, dt), S(i, "int64", "index", s[a]), S(i, dt, values)),
                                {"axis": a, "reduce": reduce, "include_self": include}))
    return cases


@generator("index_copy", dtypes=ALL)
def _index_copy(dt, arity):
    return [OpCase((S(s, dt), S(idx, "int64", "index", s[a]), S(s[:a] + idx + s[a + 1:], dt)),
                   {"axis": a}) for s, idx, a in SCATTERS]


@generator("cumprod", dtypes=NUMBERS)
def _cumprod(dt, arity):
    return [OpCase((S(s, dt, "near_one"),), {"axis": a})
            for s, a in [((1,), 0), ((7, 33), 1), ((7, 33), 0), ((3, 65), 1), ((2, 3, 4), 2)]]


@generator("any", "all", dtypes=ALL)
def _any_all(dt, arity):
    table = [((1,), None, False), ((7, 33), 1, False), ((7, 33), 0, True),
             ((1025,), None, False), ((33, 7, 5), (0, 2), False)]
    return [OpCase((S(s, dt, "ties"),), {"axis": a, "keepdims": k}) for s, a, k in table]
