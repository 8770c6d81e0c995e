"""Selection and scatter: what depends on the values' order or writes through an index.

Two atomic ops carry the whole family (``atomic.py``): ``argsort`` (stable, ascending or
descending) and ``scatter`` (gather's adjoint: updates combined by sum, prod, amax or amin
into the places an index names; repeated indices all count). Everything else is built on them
so that its meaning is exact, also for ties and repeated indices:

- sort, topk and kthvalue (plain functions returning values and indices) are the stable order
  sliced and gathered, so ties come out in torch's stable order;
- ``take_along_axis`` is torch's ``gather`` (an index per element), a ``gather`` of the
  flattened tensor at the linear index;
- ``index_copy`` (writes, numpy's take form) gives each place its *last* writer: a scatter of
  positions by ``amax`` picks it, so repeated indices have one defined result (torch leaves the
  winner unspecified);
- ``put_along_axis`` is torch's scatter / scatter_add / scatter_reduce (every reduce,
  include_self) on the flattened tensor.
"""

from __future__ import annotations

import builtins
import math

from tensor_graphs.errors import DTypeError, ShapeError
from tensor_graphs.ir import builder as tg
from tensor_graphs.ir.composite import composite
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops import OPS
from tensor_graphs.ir.ops.atomic import SCATTER_REDUCE
from tensor_graphs.ir.ops.elementwise import div, logical_not
from tensor_graphs.ir.ops.names import ARGSORT, SLICE
from tensor_graphs.ir.ops.reductions import prod
from tensor_graphs.ir.shapes import dims_equal, format_shape, normalize_axes, normalize_axis

__all__ = ["argsort", "scatter", "sort", "topk", "kthvalue", "take_along_axis",
           "put_along_axis", "index_copy", "index_add", "cumprod", "any", "all"]

PUT_REDUCE = ("replace", *SCATTER_REDUCE, "mean")  # put_along_axis's reduce values


def _make(op: str, inputs, **attrs) -> Node:
    return Node.make(OPS[op], tuple(inputs), attrs)


# ---------------------------------------------------------------------------- atomic builders
def argsort(x: tg.TensorLike, axis: int = -1, descending: bool = False) -> Node:
    """The stable sort order along an axis (int64); a 0-d tensor's order is 0."""
    x = tg.as_node(x)
    if x.ndim == 0:
        return tg.constant(0, "int64")
    axis = normalize_axis(axis, x.ndim, "argsort")
    return _make("argsort", (x,), axis=axis, descending=bool(descending))


def scatter(x: tg.TensorLike, indices: tg.TensorLike, updates: tg.TensorLike, axis: int = 0,
            reduce: str = "sum") -> Node:
    """gather's adjoint: ``x`` with ``updates[..., p, ...]`` combined into
    ``x[..., indices[p], ...]``; updates has x's shape with ``axis`` replaced by the indices'
    shape. ``reduce="sum"`` is scatter-add (an embedding's gradient, torch's index_add)."""
    x, indices = tg.as_node(x), tg.as_node(indices)
    updates = tg.cast(tg.as_node(updates, x.dtype), x.dtype)
    if not indices.dtype.is_int:
        raise DTypeError(f"scatter: indices must have an int dtype, got {indices.dtype.name}")
    return _make("scatter", (x, indices, updates), axis=normalize_axis(axis, x.ndim, "scatter"),
                 reduce=reduce)


# ---------------------------------------------------------------------------- helpers
def _x():
    return (tg.input("x", (3, 4)),)


def _xi():
    return (tg.input("x", (3, 4)), tg.input("i", (3, 2), "int64"))


def _xiu():
    return (tg.input("x", (4, 3)), tg.input("i", (2,), "int64"), tg.input("u", (2, 3)))


def _full(shape, value, dtype) -> Node:
    return tg.expand(tg.constant(value, dtype), tuple(shape)) if shape else \
        tg.constant(value, dtype)


def _linear_index(shape, indices: Node, axis: int) -> Node:
    """The row-major position in a tensor of ``shape`` of every element of ``indices``, read
    as ``indices`` on ``axis`` and the element's own coordinate on every other axis."""
    total = None
    stride = 1
    for k in range(len(shape) - 1, -1, -1):
        if k == axis:
            coord = tg.cast(indices, "int64")
        else:
            n = indices.shape[k]
            view = [1] * indices.ndim
            view[k] = n
            coord = tg.reshape(tg.iota(n), tuple(view))
        term = coord if isinstance(stride, int) and stride == 1 else tg.mul(coord,
                                                                            tg.size(stride))
        total = term if total is None else tg.add(term, total)
        stride = stride * shape[k]
    total = tg.expand(total, indices.shape) if total.shape != indices.shape else total
    return total if _in_range_by_construction(indices) else \
        _outside_made_invalid(total, indices, shape[axis])


def _in_range_by_construction(indices: Node) -> bool:
    """Whether ``indices`` are an argsort's (or a leading slice of one: sort, topk), so in
    range by construction and not worth a guard."""
    while indices.op.name == SLICE:
        indices = indices.inputs[0]
    return indices.op.name == ARGSORT


def _outside_made_invalid(linear: Node, indices: Node, size) -> Node:
    """``linear`` where ``indices`` lie in [0, size), else -1: an index past its row's end
    (or a negative one) would otherwise land in a neighbouring row of the flattened x and
    be read or written there silently; -1 is out of range of the flat gather or scatter, so
    their own range checks refuse it."""
    idx = tg.cast(indices, "int64")
    inside = tg.mul(tg.less(-1, idx), tg.less(idx, tg.size(size)))  # (mul: and, on bools)
    return tg.where(inside, linear, tg.constant(-1, "int64"))


def _check_along(op: str, x: Node, indices: Node, axis: int) -> None:
    if not indices.dtype.is_int:
        raise DTypeError(f"{op}: indices must have an int dtype, got {indices.dtype.name}")
    if indices.ndim != x.ndim:
        raise ShapeError(f"{op}: indices {format_shape(indices.shape)} must have the rank of x "
                         f"{format_shape(x.shape)}")
    for k, (a, b) in enumerate(zip(indices.shape, x.shape)):
        if k != axis and isinstance(a, int) and isinstance(b, int) and a > b:
            raise ShapeError(f"{op}: indices {format_shape(indices.shape)} are larger than x "
                             f"{format_shape(x.shape)} on axis {k} (only axis {axis} may be)")


# ---------------------------------------------------------------------------- gathers
@composite(example=_xi)
def take_along_axis(x, indices, *, axis=-1):
    """torch.gather (numpy's take_along_axis): ``out[i][j] = x[i][indices[i][j]]`` for axis 1,
    indices no larger than x on the other axes, each in [0, size) as torch's (one outside is
    refused, not wrapped); a gather of x flattened at the linear index."""
    _check_along("take_along_axis", x, indices, axis)
    return tg.gather(tg.reshape(x, (-1,)), _linear_index(x.shape, indices, axis), axis=0)


def sort(x: tg.TensorLike, axis: int = -1, descending: bool = False) -> tuple[Node, Node]:
    """(values, indices) in torch's stable order: nan last ascending, first descending."""
    x = tg.as_node(x)
    if x.ndim == 0:
        return x, tg.constant(0, "int64")
    order = argsort(x, axis, descending)
    return take_along_axis(x, order, axis=axis), order


def topk(x: tg.TensorLike, k: int, axis: int = -1, largest: bool = True) -> tuple[Node, Node]:
    """(values, indices) of the k largest (or smallest), sorted, ties in their original order."""
    x = tg.as_node(x)
    if x.ndim == 0:
        if k not in (0, 1):
            raise ShapeError(f"topk: k={k} is out of range for a 0-d tensor")
        return (x, tg.constant(0, "int64")) if k else (tg.reshape(x, (1,))[:0],) * 2
    axis = normalize_axis(axis, x.ndim, "topk")
    n = x.shape[axis]
    if isinstance(n, int) and not 0 <= k <= n:
        raise ShapeError(f"topk: k={k} is out of range for axis {axis} of "
                         f"{format_shape(x.shape)} (0 <= k <= {n})")
    order = tg.slice_axis(argsort(x, axis, largest), axis, 0, k)
    return take_along_axis(x, order, axis=axis), order


def kthvalue(x: tg.TensorLike, k: int, axis: int = -1,
             keepdims: bool = False) -> tuple[Node, Node]:
    """(value, index) of the k-th smallest (1-based) along an axis, in the stable order."""
    x = tg.as_node(x)
    if x.ndim == 0:
        if k != 1:
            raise ShapeError(f"kthvalue: k={k} is out of range for a 0-d tensor")
        return x, tg.constant(0, "int64")
    axis = normalize_axis(axis, x.ndim, "kthvalue")
    n = x.shape[axis]
    if isinstance(n, int) and not 1 <= k <= n:
        raise ShapeError(f"kthvalue: k={k} is out of range for axis {axis} of "
                         f"{format_shape(x.shape)} (1 <= k <= {n})")
    at = tg.slice_axis(argsort(x, axis), axis, k - 1, k)
    value = take_along_axis(x, at, axis=axis)
    if keepdims:
        return value, at
    return tg.squeeze(value, axis), tg.squeeze(at, axis)


# ---------------------------------------------------------------------------- writes
@composite(example=_xiu)
def index_copy(x, indices, updates, *, axis=0):
    """``x[..., indices[p], ...] = updates[..., p, ...]`` (numpy's take form, torch's
    index_copy); a place written twice keeps its last writer (positions in row-major order)."""
    axis_size = x.shape[axis]
    flat_idx = tg.reshape(tg.cast(indices, "int64"), (-1,))
    m = flat_idx.shape[0]
    if isinstance(m, int) and m == 0:
        return x
    # the last position writing each place (-1: none), by a scatter of positions
    winner = scatter(_full((axis_size,), -1, "int64"), flat_idx, tg.iota(m), axis=0,
                     reduce="amax")
    rows = tg.reshape(updates, x.shape[:axis] + (m,) + x.shape[axis + 1:])
    picked = tg.gather(rows, tg.maximum(winner, 0), axis=axis)
    view = [1] * x.ndim
    view[axis] = axis_size
    written = tg.reshape(logical_not(tg.less(winner, 0)), tuple(view))
    return tg.where(written, picked, x)


def index_add(x: tg.TensorLike, indices: tg.TensorLike, updates: tg.TensorLike,
              axis: int = 0, alpha=1) -> Node:
    """torch.index_add: ``x[..., indices[p], ...] += alpha * updates[..., p, ...]``."""
    x = tg.as_node(x)
    updates = tg.as_node(updates, x.dtype)
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        updates = tg.mul(updates, alpha)
    return scatter(x, indices, updates, axis, "sum")


def _identity(reduce: str, dtype):
    """The value a reduce starts from when x itself is left out (include_self=False)."""
    if reduce in ("sum", "mean"):
        return False if dtype.is_bool else 0
    if reduce == "prod":
        return True if dtype.is_bool else 1
    low = reduce == "amax"
    if dtype.is_bool:
        return not low
    if dtype.is_float:
        return -math.inf if low else math.inf
    import numpy as np

    info = np.iinfo(dtype.np_dtype)
    return int(info.min if low else info.max)


@composite(example=lambda: (*_xi(), tg.input("v", (3, 2))))
def put_along_axis(x, indices, values, *, axis=-1, reduce="replace", include_self=True):
    """torch's scatter family: ``values[i][j]`` goes to ``x[i][indices[i][j]]`` (axis 1), and
    is written (``replace``) or combined (``sum``, ``prod``, ``amax``, ``amin``, ``mean``;
    ``include_self=False`` leaves x's own value out where something lands); a scalar values
    fills. Repeated indices: every one counts; under replace the last in row-major order
    wins (torch leaves it unspecified). An index outside [0, size) is refused."""
    if reduce not in PUT_REDUCE:
        raise ShapeError(f"put_along_axis: reduce must be one of {', '.join(PUT_REDUCE)}, "
                         f"got {reduce!r}")
    _check_along("put_along_axis", x, indices, axis)
    if values.ndim == 0:
        values = tg.expand(tg.reshape(values, (1,) * indices.ndim), indices.shape)
    elif values.ndim != indices.ndim:
        raise ShapeError(f"put_along_axis: values {format_shape(values.shape)} must have the "
                         f"rank of indices {format_shape(indices.shape)}")
    elif not builtins.all(dims_equal(a, b) for a, b in zip(values.shape, indices.shape)):
        values = tg.getitem(values, tuple(builtins.slice(0, n) for n in indices.shape))
    values = tg.cast(values, x.dtype)
    flat = tg.reshape(x, (-1,))
    where_to = tg.reshape(_linear_index(x.shape, indices, axis), (-1,))
    updates = tg.reshape(values, (-1,))
    if reduce == "replace":
        return tg.reshape(index_copy(flat, where_to, updates, axis=0), x.shape)
    if reduce == "mean" and not x.dtype.is_float:
        raise DTypeError(f"put_along_axis: reduce='mean' of {x.dtype.name} values (torch floors "
                         "the quotient); cast x and values to a float dtype first")
    n = flat.shape[0]
    base = flat
    if not include_self or reduce == "mean":
        counts = scatter(_full((n,), 0, "int64"), where_to,
                         _full(updates.shape, 1, "int64"), axis=0, reduce="sum")
        hit = tg.less(0, counts)
    if not include_self:
        base = tg.where(hit, tg.cast(_identity(reduce, x.dtype), x.dtype), flat)
    out = scatter(base, where_to, updates, axis=0,
                  reduce="sum" if reduce == "mean" else reduce)
    if reduce == "mean":
        count = counts if not include_self else tg.add(counts, 1)
        count = tg.where(tg.less(0, count), count, 1)
        out = div(out, tg.cast(count, x.dtype))
    return tg.reshape(out, x.shape)


# ---------------------------------------------------------------------------- scans, logic
@composite(example=_x)
def cumprod(x, *, axis=0):
    """Running product along an axis: ``out[i] = prod(x[j] for j <= i)``, each a balanced
    tree of products over the prefix (a masked prod, as cumsum is a masked sum)."""
    if x.dtype.is_bool:
        x = tg.cast(x, "int64")
    n = x.shape[axis]
    if not isinstance(n, int):
        raise ShapeError(f"cumprod: axis {axis} of {format_shape(x.shape)} must be concrete")
    moved = tg.unsqueeze(tg.transpose(x, axis, -1), -2)  # (..., 1, n): j on the last axis
    i = tg.reshape(tg.iota(n), (n, 1))
    j = tg.reshape(tg.iota(n), (1, n))
    masked = tg.where(tg.less(i, j), tg.cast(1, x.dtype), moved)  # (..., n, n)
    return tg.transpose(prod(masked, axis=-1), axis, -1)


def _truth(x: Node) -> Node:
    return x if x.dtype.is_bool else tg.cast(x, "bool")


def _empty_reduction(x: Node, axes, keepdims: bool, value: bool) -> Node | None:
    """any/all over an empty axis: the reduction's identity (max refuses empty axes)."""
    if not builtins.any(isinstance(x.shape[a], int) and x.shape[a] == 0 for a in axes):
        return None
    shape = tuple(1 if a in axes else d for a, d in enumerate(x.shape)) if keepdims else \
        tuple(d for a, d in enumerate(x.shape) if a not in axes)
    return _full(shape, value, "bool")


@composite(example=_x, name="any")
def any(x, *, axis=None, keepdims=False):  # noqa: A001 - torch's name
    """True where any element over the axes is nonzero (nan counts as nonzero)."""
    axes = normalize_axes(axis, x.ndim, "any")
    empty = _empty_reduction(x, axes, keepdims, False)
    return empty if empty is not None else tg.max(_truth(x), axes, keepdims)


@composite(example=_x, name="all")
def all(x, *, axis=None, keepdims=False):  # noqa: A001 - torch's name
    """True where every element over the axes is nonzero."""
    axes = normalize_axes(axis, x.ndim, "all")
    empty = _empty_reduction(x, axes, keepdims, True)
    if empty is not None:
        return empty
    return logical_not(tg.max(logical_not(_truth(x)), axes, keepdims))
