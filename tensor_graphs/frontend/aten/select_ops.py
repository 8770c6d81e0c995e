"""ATen's selection and scatter families (sort, topk, scatter_add, index_put, ...): ops whose
result depends on the values' order or writes through an index.

Every mapping lowers to the two atomic ops of the family, ``argsort`` and ``scatter``
(``ir/ops/selection.py``). Ops whose result has as many elements as the data selects
(``nonzero``, ``masked_select``, boolean-mask assignment of a tensor) have no fixed size; a
tensor_graphs program's sizes follow its inputs' shapes, so they are refused by name with
the rewrite that avoids them.
"""

from __future__ import annotations

import math

from tensor_graphs.errors import DTypeError, ShapeError
from tensor_graphs.frontend.aten.common import UnsupportedOpError, dtype_name, guarded
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.shapes import broadcast_shapes, format_shape, normalize_axis, numel

# torch's legacy scatter(reduce=...) names and scatter_reduce's, as put_along_axis's reduce
REDUCE = {"add": "sum", "multiply": "prod", "sum": "sum", "prod": "prod", "amax": "amax",
          "amin": "amin", "mean": "mean"}


def _as0d(x: Node) -> Node:
    """torch treats a 0-d tensor as one element along its (only) dim 0 / -1."""
    return tg.reshape(x, (1,)) if x.ndim == 0 else x


def _dim(x: Node, dim, op: str) -> int:
    return normalize_axis(dim, max(x.ndim, 1), op)


def _sort(x, dim, descending, op="sort"):
    if x.ndim == 0:
        return x, tg.constant(0, "int64")
    return tg.sort(x, axis=_dim(x, dim, op), descending=bool(descending))


def _argsort(x, dim, descending):
    return _sort(x, dim, descending, "argsort")[1]


def _topk(x, k, dim, largest):
    if x.ndim == 0:
        return tg.topk(x, k)
    return tg.topk(x, k, axis=_dim(x, dim, "topk"), largest=bool(largest))


def _kthvalue(x, k, dim, keepdim):
    if x.ndim == 0:
        return tg.kthvalue(x, k)
    return tg.kthvalue(x, k, axis=_dim(x, dim, "kthvalue"), keepdims=bool(keepdim))


def _logic(fn):
    """any/all over dims (None or []: all of them); a 0-d tensor accepts dim 0 / -1."""
    def reduce(x, dim=None, keepdim=False):
        if dim is not None and not isinstance(dim, (list, tuple)):
            dim = [dim]
        axes = None if not dim else tuple(_dim(x, d, fn.__name__) for d in dim)
        if x.ndim == 0:
            return fn(x)
        return fn(x, axis=axes, keepdims=bool(keepdim))
    return reduce


def _cumprod(x, dim, dtype):
    x = x if dtype is None else tg.cast(x, dtype_name(dtype))
    if x.ndim == 0:
        return x
    if x.dtype.is_bool or x.dtype.name in ("uint8", "int8", "int32"):
        x = tg.cast(x, "int64")  # torch's cumprod of bools and small ints gives int64
    return tg.cumprod(x, axis=_dim(x, dim, "cumprod"))


# ---------------------------------------------------------------------------- scatter family
def _scatter(x, dim, index, src, reduce="replace", include_self=True, op="scatter"):
    """torch.scatter / scatter_add / scatter_reduce: src (or a scalar) along dim."""
    if not isinstance(src, Node):
        src = tg.constant(src, x.dtype.name)
    zero_d = x.ndim == 0
    x, index = _as0d(x), _as0d(index)
    if index.ndim != x.ndim:
        raise ShapeError(f"{op}: index {format_shape(index.shape)} must have the rank of self "
                         f"{format_shape(x.shape)}")
    if reduce == "mean" and not x.dtype.is_float:
        raise DTypeError(f"{op}: reduce='mean' of {x.dtype.name} values is not supported "
                         "(torch floors the quotient); scatter float values, then cast")
    out = tg.put_along_axis(x, index, src, axis=_dim(x, dim, op), reduce=reduce,
                            include_self=bool(include_self))
    return tg.reshape(out, ()) if zero_d else out


def _scatter_value(x, dim, index, value, reduce="replace"):
    return _scatter(x, dim, index, tg.constant(value, x.dtype.name), reduce,
                    op="scatter_value")


def _index_add(x, dim, index, source, alpha):
    x1, src = _as0d(x), _as0d(source)
    axis = _dim(x1, dim, "index_add")
    out = tg.index_add(x1, tg.reshape(index, (-1,)), tg.cast(src, x.dtype.name), axis=axis,
                       alpha=alpha)
    return tg.reshape(out, ()) if x.ndim == 0 else out


def _index_copy(x, dim, index, source):
    x1, src = _as0d(x), _as0d(source)
    axis = _dim(x1, dim, "index_copy")
    out = tg.index_copy(x1, tg.reshape(index, (-1,)), tg.cast(src, x.dtype.name), axis=axis)
    return tg.reshape(out, ()) if x.ndim == 0 else out


def _index_fill(x, dim, index, value):
    x1 = _as0d(x)
    axis = _dim(x1, dim, "index_fill")
    idx = tg.reshape(index, (-1,))
    shape = x1.shape[:axis] + idx.shape + x1.shape[axis + 1:]
    fill = value if isinstance(value, Node) else tg.constant(value, x.dtype.name)
    src = tg.expand(tg.reshape(tg.cast(fill, x.dtype.name), (1,) * len(shape)), shape)
    out = tg.index_copy(x1, idx, src, axis=axis)
    return tg.reshape(out, ()) if x.ndim == 0 else out


def _index_reduce(x, dim, index, source, reduce, include_self):
    """torch.index_reduce (take form, 1-D index) as put_along_axis with the index spread
    over source's shape."""
    x1, src = _as0d(x), _as0d(source)
    axis = _dim(x1, dim, "index_reduce")
    view = [1] * src.ndim
    view[axis] = index.shape[0]
    spread = tg.expand(tg.reshape(index, tuple(view)), src.shape)
    out = _scatter(x1, axis, spread, tg.cast(src, x.dtype.name), REDUCE[reduce], include_self,
                   op="index_reduce")
    return tg.reshape(out, ()) if x.ndim == 0 else out


def _wrap(idx: Node, n) -> Node:
    """torch's negative indices count from the end: idx + n where idx < 0."""
    size = tg.size(n) if not isinstance(n, int) else tg.constant(n, "int64")
    return tg.where(tg.less(idx, 0), tg.add(idx, size), idx)


def _index_put(x, indices, values, accumulate):
    """``x[indices] = values`` (``+=`` with accumulate), torch's advanced indexing layout: the
    indexed axes are flattened into one, written with one scatter (accumulate: every repeat
    adds) or index_copy (the last writer of a repeated place wins)."""
    indices = list(indices) + [None] * (x.ndim - len(indices))
    values = values if isinstance(values, Node) else tg.constant(values, x.dtype.name)
    values = tg.cast(values, x.dtype.name)
    masks = [k for k, i in enumerate(indices) if i is not None and i.dtype.is_bool]
    if masks:
        return _masked_put(x, indices, values, accumulate, masks)
    axes = [k for k, i in enumerate(indices) if i is not None]
    if not axes:
        return tg.add(x, values) if accumulate else tg.expand(values, x.shape)
    rest = [k for k in range(x.ndim) if k not in axes]
    sizes = [x.shape[k] for k in axes]
    linear = None
    for j, k in enumerate(axes):
        if not indices[k].dtype.is_int:
            raise DTypeError(f"index_put: indices must be int or bool tensors, got "
                             f"{indices[k].dtype.name}")
        stride = math.prod(sizes[j + 1:])
        term = _wrap(tg.cast(indices[k], "int64"), sizes[j])
        if stride != 1:
            term = tg.mul(term, tg.size(stride))
        linear = term if linear is None else tg.add(linear, term)
    batch = linear.shape
    rest_shape = tuple(x.shape[k] for k in rest)
    adjacent = axes == list(range(axes[0], axes[-1] + 1))
    lead = axes[0] if adjacent else 0
    # x[indices]'s shape: the index dims where the first indexed axis was (adjacent axes),
    # else first; values broadcast to it, then laid out as (index dims, other axes)
    target = rest_shape[:lead] + batch + rest_shape[lead:]
    values = tg.expand(values, target)
    if lead:
        nb = len(batch)
        order = tuple(range(lead, lead + nb)) + tuple(range(lead)) + tuple(
            range(lead + nb, len(target)))
        values = tg.permute(values, order)
    perm = tuple(axes + rest)
    moved = tg.permute(x, perm) if perm != tuple(range(x.ndim)) else x
    flat = tg.reshape(moved, (numel(sizes),) + rest_shape)
    where_to = tg.reshape(linear, (-1,))
    updates = tg.reshape(values, (numel(batch),) + rest_shape)
    out = tg.scatter(flat, where_to, updates, axis=0, reduce="sum") if accumulate else \
        tg.index_copy(flat, where_to, updates, axis=0)
    out = tg.reshape(out, tuple(sizes) + rest_shape)
    inverse = tuple(perm.index(k) for k in range(x.ndim))
    return tg.permute(out, inverse) if perm != tuple(range(x.ndim)) else out


def _masked_put(x, indices, values, accumulate, masks):
    """``x[mask] = v`` with one boolean index and a single value: a where (its result has
    x's shape whatever the mask holds). Several values would be placed in mask order, a
    count known only at run time: refused."""
    if len(masks) != 1 or any(i is not None for k, i in enumerate(indices) if k not in masks):
        raise UnsupportedOpError("index_put: a boolean mask mixed with other indices selects a "
                                 "data-dependent number of elements; use torch.where(mask, "
                                 "value, x) in the model", [("aten::index_put", "mask")])
    k = masks[0]
    mask = indices[k]
    trail = x.shape[k + mask.ndim:]
    shape = tuple(values.shape)
    while shape and shape[0] == 1 and len(shape) > len(trail):
        shape = shape[1:]  # a leading 1 broadcasts over the selected rows
    if k == 0 and len(shape) <= len(trail) and numel(values.shape) != 1:
        # every selected row gets the same values (x[mask] = row): a where over the rows
        cond = tg.reshape(mask, tuple(mask.shape) + (1,) * len(trail))
        row = tg.reshape(values, shape)
        if accumulate:
            return tg.add(x, tg.where(cond, row, tg.cast(0, x.dtype.name)))
        return tg.where(cond, row, x)
    if numel(values.shape) != 1:
        raise UnsupportedOpError(
            f"index_put: x[mask] = values with {format_shape(values.shape)} values places them "
            "in the order of the mask's True elements, whose count is known only at run time; "
            "assign one value (x[mask] = v), or use torch.where(mask, values, x) with values "
            "of x's shape", [("aten::index_put", "mask")])
    view = (1,) * k + tuple(mask.shape) + (1,) * (x.ndim - k - mask.ndim)
    cond = tg.reshape(mask, view)
    v = tg.reshape(values, ())
    if accumulate:
        return tg.add(x, tg.where(cond, v, tg.cast(0, x.dtype.name)))
    return tg.where(cond, v, x)


def _histc(x, bins, low, high):
    """torch.histc: counts of x in ``bins`` equal bins over [low, high] (x == high in the
    last), as a scatter-add of ones; low == high uses the data's min and max."""
    if not x.dtype.is_float:
        raise DTypeError(f"histc: needs a float tensor, got {x.dtype.name}")
    flat = tg.reshape(x, (-1,))
    if isinstance(flat.shape[0], int) and flat.shape[0] == 0:
        return tg.expand(tg.constant(0.0, x.dtype.name), (bins,))
    lo = tg.constant(float(low), x.dtype.name)
    hi = tg.constant(float(high), x.dtype.name)
    if low == high:
        lo, hi = tg.min(flat), tg.max(flat)
        same = tg.equal(lo, hi)
        lo, hi = tg.where(same, tg.sub(lo, 1), lo), tg.where(same, tg.add(hi, 1), hi)
    inside = tg.logical_and(tg.less_equal(lo, flat), tg.less_equal(flat, hi))
    place = tg.cast(tg.div(tg.mul(tg.sub(flat, lo), float(bins)), tg.sub(hi, lo)), "int64")
    place = tg.where(inside, tg.minimum(place, bins - 1), bins)  # outside: one bin past the end
    counts = tg.scatter(tg.expand(tg.constant(0.0, x.dtype.name), (bins + 1,)), place,
                        tg.expand(tg.constant(1.0, x.dtype.name), flat.shape))
    return tg.slice_axis(counts, 0, 0, bins)


def _take_along_dim(x, indices, dim):
    """torch.take_along_dim: x and indices broadcast against each other on every axis but
    dim (gather's rule is "no larger"); dim None reads x flattened."""
    if dim is None:
        flat = tg.reshape(x, (-1,))
        return tg.take_along_axis(flat, _wrap(tg.reshape(tg.cast(indices, "int64"), (-1,)),
                                              flat.shape[0]), axis=0)
    if x.ndim != indices.ndim:
        raise ShapeError(f"take_along_dim: indices {format_shape(indices.shape)} must have the "
                         f"rank of self {format_shape(x.shape)}")
    axis = _dim(x, dim, "take_along_dim")
    indices = _wrap(tg.cast(indices, "int64"), x.shape[axis])
    sizes = [b if a == 1 else a for a, b in zip(x.shape, indices.shape)]
    x_shape = tuple(x.shape[k] if k == axis else sizes[k] for k in range(x.ndim))
    i_shape = tuple(indices.shape[k] if k == axis else sizes[k] for k in range(x.ndim))
    return tg.take_along_axis(tg.expand(x, x_shape), tg.expand(indices, i_shape), axis=axis)


def _grouped_mm(x, w, offs, op="grouped_mm"):
    """A matrix product per group of rows (MoE experts): rows ``[offs[e-1], offs[e])`` of x
    (S, K) times w[e] (E, K, N); rows past ``offs[-1]`` are zero. Every expert's product is
    computed and each row picks its own: E times the flops of the grouped product, but no
    size that depends on the routing (one plan for every routing), and no (S, K, N) copy of
    the weights that a per-row gather would make."""
    if x.ndim != 2 or w.ndim != 3 or offs is None or offs.ndim != 1:
        raise UnsupportedOpError(
            f"{op}: only (S, K) rows times (E, K, N) experts with 1-D offsets are supported, "
            f"got {format_shape(x.shape)} and {format_shape(w.shape)}",
            [(f"aten::{op}", "")])
    s, e = x.shape[0], w.shape[0]
    row = tg.reshape(tg.iota(s), (s, 1))
    group = tg.sum(tg.cast(tg.less_equal(tg.reshape(tg.cast(offs, "int64"), (1, e)), row),
                           "int64"), axis=1)  # (S,): the groups that ended at or before row
    every = tg.matmul(tg.cast(x, w.dtype.name), w)  # (E, S, N)
    pick = tg.add(tg.mul(tg.minimum(group, e - 1), tg.size(s)), tg.reshape(row, (s,)))
    rows = tg.gather(tg.reshape(every, (-1, w.shape[2])), pick, axis=0)
    inside = tg.reshape(tg.less(group, e), (s, 1))
    return tg.where(inside, rows, tg.cast(0, w.dtype.name))


# ops outside ATen that libraries register with torch.library, by schema name: the table
# keys ATen ops by overload object, and these exist only once their library is imported
NAMED = {
    # transformers' MoE experts (its default experts_implementation on the CPU): the grouped
    # product as a torch custom op, rows sorted by expert, offsets cumulative
    "transformers::grouped_mm_fallback": lambda a, kw: _grouped_mm(
        kw["input"], kw["weight"], kw["offs"], "grouped_mm_fallback"),
}


def _empty(size, dtype, like=None):
    """An uninitialised tensor (torch.empty*): any content is torch's, so zeros; what the
    model reads was written first (``inv[perm] = arange`` fills an empty_like)."""
    name = dtype_name(dtype) if dtype is not None else (
        like.dtype.name if like is not None else "float32")
    size = tuple(size)
    zero = tg.constant(0, name)
    return tg.expand(zero, size) if size else zero


def _take(x, index):
    """torch.take: x read flattened, negative indices from the end, the index's shape."""
    flat = tg.reshape(x, (-1,))
    return tg.gather(flat, _wrap(tg.cast(index, "int64"), flat.shape[0]), axis=0)


def _median(x, dim=None, keepdim=False, ignore_nan=False):
    """torch.median / nanmedian: the lower median ((n - 1) // 2-th smallest, in the stable
    order). median: a nan in the line makes the value nan and the index the first nan's;
    nanmedian counts only the numbers (the line's k follows its count). ``dim`` None: the
    value over x flattened."""
    whole = dim is None or x.ndim == 0  # a 0-d x keeps its shape, keepdim or not
    if whole:
        zero_d = x.ndim == 0
        x, axis = tg.reshape(x, (-1,)), 0
    else:
        axis = _dim(x, dim, "median")
    n = x.shape[axis]
    if not isinstance(n, int):
        raise UnsupportedOpError(f"median: the reduced axis {axis} of {format_shape(x.shape)} "
                                 "must be concrete", [("aten::median", "")])
    order = tg.argsort(x, axis)  # ascending, nans last
    floats = x.dtype.is_float
    if ignore_nan and floats:
        valid = tg.sum(tg.logical_not(tg.isnan(x)), axis=axis, keepdims=True)  # int64
        half = tg.cast(tg.mul(tg.cast(tg.maximum(tg.sub(valid, 1), 0), "float64"), 0.5), "int64")
        at = tg.take_along_axis(order, half, axis=axis)
    else:
        at = tg.slice_axis(order, axis, (n - 1) // 2, (n - 1) // 2 + 1)
    value = tg.take_along_axis(x, at, axis=axis)
    if floats and not ignore_nan:
        nan = tg.isnan(x)
        has = tg.any(nan, axis=axis, keepdims=True)
        value = tg.where(has, tg.cast(math.nan, x.dtype.name), value)
        at = tg.where(has, tg.argmax(nan, axis=axis, keepdims=True), at)
    if whole:
        value = tg.reshape(value, ())
        return value if dim is None else (value, tg.reshape(at, ()) if zero_d else at)
    if not keepdim:
        value, at = tg.squeeze(value, axis), tg.squeeze(at, axis)
    return value, at


def _searchsorted(seq, values, right=False, out_int32=False, sorter=None, side=None):
    """torch.searchsorted: per value, how many of the sorted sequence's elements lie before
    it (``< v``; right: ``<= v``), a nan value after all of them; counted by a comparison with
    every element (``len(seq)`` work per value, no binary search to unroll)."""
    if not isinstance(values, Node):
        values = tg.constant(values, seq.dtype.name)
    right = right or side == "right"
    if sorter is not None:
        seq = tg.take_along_axis(seq, tg.cast(sorter, "int64"), axis=-1)
    if seq.ndim == 1:
        s, v = seq, tg.unsqueeze(values, -1)  # (m,) against (..., 1)
    else:
        s, v = tg.unsqueeze(seq, -2), tg.unsqueeze(values, -1)  # (..., 1, m), (..., k, 1)
    before = tg.less_equal(s, v) if right else tg.less(s, v)
    if values.dtype.is_float:
        before = tg.logical_or(before, tg.isnan(v))
    count = tg.sum(before, axis=-1)
    return tg.cast(count, "int32" if out_int32 else "int64")


def _masked_scatter(x, mask, source):
    """torch.masked_scatter: the source's elements, in order, into x's True places (x and
    mask broadcast together); each place's element is the number of True places before it (a running
    sum of the mask), so the result keeps x's shape whatever the mask holds."""
    shape = broadcast_shapes(x.shape, mask.shape, op="masked_scatter")
    x, mask = tg.expand(x, shape), tg.expand(mask, shape)
    flat = tg.reshape(mask, (-1,))
    rank = tg.sub(tg.cumsum(tg.cast(flat, "int64"), axis=0), 1)
    picked = tg.gather(tg.reshape(tg.cast(source, x.dtype.name), (-1,)),
                       tg.maximum(rank, 0), axis=0)
    return tg.where(mask, tg.reshape(picked, x.shape), x)


def _extreme(dtype, low: bool):
    """The value below (low) or above every other of a dtype: a masked reduction's fill."""
    if dtype.is_bool:
        return not low
    if dtype.is_float:
        return -math.inf if low else math.inf
    import numpy as np

    info = np.iinfo(dtype.np_dtype)
    return int(info.min if low else info.max)


def _prefixes(x: Node, axis: int):
    """x with axis moved last and repeated per position, (..., n, n) with j on the last axis,
    and the mask of the places past each prefix (j > i)."""
    n = x.shape[axis]
    moved = tg.unsqueeze(tg.transpose(x, axis, -1), -2)
    past = tg.less(tg.reshape(tg.iota(n), (n, 1)), tg.reshape(tg.iota(n), (1, n)))
    return moved, past, n


def _cum_extreme(x, dim, pick_max: bool):
    """torch.cummax / cummin: the running extreme (nan propagates) and the last index where
    it was reached (a nan's index once the running value is nan), over masked prefixes."""
    if x.ndim == 0:
        return x, tg.constant(0, "int64")
    axis = _dim(x, dim, "cummax" if pick_max else "cummin")
    moved, past, n = _prefixes(x, axis)
    masked = tg.where(past, tg.cast(_extreme(x.dtype, pick_max), x.dtype.name), moved)
    values = tg.max(masked, -1) if pick_max else tg.min(masked, axis=-1)  # (..., n)
    v = tg.unsqueeze(values, -1)
    hit = tg.equal(moved, v)
    if x.dtype.is_float:
        hit = tg.logical_or(hit, tg.logical_and(tg.isnan(moved), tg.isnan(v)))
    j = tg.reshape(tg.iota(n), (1, n))
    index = tg.max(tg.where(tg.logical_and(hit, tg.logical_not(past)), j, -1), -1)
    return tg.transpose(values, axis, -1), tg.transpose(index, axis, -1)


def _logcumsumexp(x, dim):
    """log(cumsum(exp(x))) as a logsumexp over each masked prefix (stable for large x)."""
    if x.ndim == 0:
        return x
    axis = _dim(x, dim, "logcumsumexp")
    moved, past, _ = _prefixes(x, axis)
    masked = tg.where(past, tg.cast(-math.inf, x.dtype.name), moved)
    return tg.transpose(tg.logsumexp(masked, axis=-1), axis, -1)


def _mode(x, dim, keepdim):
    """torch.mode: the most frequent value along dim (the smallest among equally frequent
    ones) and the last index holding it, by counting equal pairs."""
    if x.ndim == 0:
        return x, tg.constant(0, "int64")
    axis = _dim(x, dim, "mode")
    moved = tg.transpose(x, axis, -1)  # (..., n)
    n = moved.shape[-1]
    counts = tg.sum(tg.equal(tg.unsqueeze(moved, -1), tg.unsqueeze(moved, -2)), axis=-1)
    best = tg.max(counts, -1, keepdims=True)
    top = tg.cast(_extreme(x.dtype, False), x.dtype.name)
    value = tg.min(tg.where(tg.equal(counts, best), moved, top), axis=-1, keepdims=True)
    index = tg.max(tg.where(tg.equal(moved, value), tg.iota(n), -1), -1, keepdims=True)
    value, index = tg.transpose(value, axis, -1), tg.transpose(index, axis, -1)
    if not keepdim:
        value, index = tg.squeeze(value, axis), tg.squeeze(index, axis)
    return value, index


def _data_dependent(op: str, instead: str):
    def refuse(a, kw):
        raise UnsupportedOpError(
            f"{op}: its result has as many elements as the data selects, a size known only "
            f"at run time; tensor_graphs programs have sizes fixed by their inputs' shapes. "
            f"{instead}", [(f"aten::{op}", "")])
    return refuse


def table(aten) -> dict:
    return guarded({
        # order
        aten.sort.default: lambda a, kw: _sort(kw["self"], kw["dim"], kw["descending"]),
        aten.sort.stable: lambda a, kw: _sort(kw["self"], kw["dim"], kw["descending"]),
        aten.argsort.default: lambda a, kw: _argsort(kw["self"], kw["dim"], kw["descending"]),
        aten.argsort.stable: lambda a, kw: _argsort(kw["self"], kw["dim"], kw["descending"]),
        aten.topk.default: lambda a, kw: _topk(kw["self"], kw["k"], kw["dim"], kw["largest"]),
        aten.kthvalue.default: lambda a, kw: _kthvalue(kw["self"], kw["k"], kw["dim"],
                                                       kw["keepdim"]),
        aten.cumprod.default: lambda a, kw: _cumprod(kw["self"], kw["dim"], kw["dtype"]),
        # logic reductions
        aten.any.default: lambda a, kw: _logic(tg.any)(kw["self"]),
        aten.any.dim: lambda a, kw: _logic(tg.any)(kw["self"], kw["dim"], kw["keepdim"]),
        aten.any.dims: lambda a, kw: _logic(tg.any)(kw["self"], kw["dim"], kw["keepdim"]),
        aten.all.default: lambda a, kw: _logic(tg.all)(kw["self"]),
        aten.all.dim: lambda a, kw: _logic(tg.all)(kw["self"], kw["dim"], kw["keepdim"]),
        aten.all.dims: lambda a, kw: _logic(tg.all)(kw["self"], kw["dim"], kw["keepdim"]),
        # torch's scatter family (an index per element)
        aten.scatter.src: lambda a, kw: _scatter(kw["self"], kw["dim"], kw["index"],
                                                 kw["src"]),
        aten.scatter.value: lambda a, kw: _scatter_value(kw["self"], kw["dim"], kw["index"],
                                                         kw["value"]),
        aten.scatter.reduce: lambda a, kw: _scatter(kw["self"], kw["dim"], kw["index"],
                                                    kw["src"], REDUCE[kw["reduce"]]),
        aten.scatter.value_reduce: lambda a, kw: _scatter_value(
            kw["self"], kw["dim"], kw["index"], kw["value"], REDUCE[kw["reduce"]]),
        aten.scatter_add.default: lambda a, kw: _scatter(kw["self"], kw["dim"], kw["index"],
                                                         kw["src"], "sum"),
        aten.scatter_reduce.two: lambda a, kw: _scatter(
            kw["self"], kw["dim"], kw["index"], kw["src"], REDUCE[kw["reduce"]],
            kw["include_self"], op="scatter_reduce"),
        aten.take_along_dim.default: lambda a, kw: _take_along_dim(kw["self"], kw["indices"],
                                                                   kw["dim"]),
        # index writes (an index along one dim, or advanced indexing)
        aten.index_put.default: lambda a, kw: _index_put(kw["self"], kw["indices"],
                                                         kw["values"], kw["accumulate"]),
        aten.index_add.default: lambda a, kw: _index_add(kw["self"], kw["dim"], kw["index"],
                                                         kw["source"], kw["alpha"]),
        aten.index_copy.default: lambda a, kw: _index_copy(kw["self"], kw["dim"], kw["index"],
                                                           kw["source"]),
        aten.index_fill.int_Scalar: lambda a, kw: _index_fill(kw["self"], kw["dim"],
                                                              kw["index"], kw["value"]),
        aten.index_fill.int_Tensor: lambda a, kw: _index_fill(kw["self"], kw["dim"],
                                                              kw["index"], kw["value"]),
        aten.index_reduce.default: lambda a, kw: _index_reduce(
            kw["self"], kw["dim"], kw["index"], kw["source"], kw["reduce"],
            kw["include_self"]),
        # uninitialised buffers that index writes fill
        aten.empty_like.default: lambda a, kw: _empty(kw["self"].shape, kw["dtype"], kw["self"]),
        aten.empty.memory_format: lambda a, kw: _empty(kw["size"], kw["dtype"]),
        aten.empty_permuted.default: lambda a, kw: _empty(kw["size"], kw["dtype"]),
        aten.median.default: lambda a, kw: _median(kw["self"]),
        aten.median.dim: lambda a, kw: _median(kw["self"], kw["dim"], kw["keepdim"]),
        aten.nanmedian.default: lambda a, kw: _median(kw["self"], ignore_nan=True),
        aten.nanmedian.dim: lambda a, kw: _median(kw["self"], kw["dim"], kw["keepdim"], True),
        aten.searchsorted.Tensor: lambda a, kw: _searchsorted(
            kw["sorted_sequence"], kw["self"], kw["right"], kw["out_int32"], kw["sorter"],
            kw["side"]),
        aten.searchsorted.Scalar: lambda a, kw: _searchsorted(
            kw["sorted_sequence"], kw["self"], kw["right"], kw["out_int32"], kw["sorter"],
            kw["side"]),
        aten.bucketize.Tensor: lambda a, kw: _searchsorted(kw["boundaries"], kw["self"],
                                                           kw["right"], kw["out_int32"]),
        aten.masked_scatter.default: lambda a, kw: _masked_scatter(kw["self"], kw["mask"],
                                                                   kw["source"]),
        aten.cummax.default: lambda a, kw: _cum_extreme(kw["self"], kw["dim"], True),
        aten.cummin.default: lambda a, kw: _cum_extreme(kw["self"], kw["dim"], False),
        aten.logcumsumexp.default: lambda a, kw: _logcumsumexp(kw["self"], kw["dim"]),
        aten.mode.default: lambda a, kw: _mode(kw["self"], kw["dim"], kw["keepdim"]),
        aten.take.default: lambda a, kw: _take(kw["self"], kw["index"]),
        aten.histc.default: lambda a, kw: _histc(kw["self"], kw["bins"], kw["min"], kw["max"]),
        aten._grouped_mm.default: lambda a, kw: _grouped_mm(kw["self"], kw["mat2"], kw["offs"])
        if kw["bias"] is None else tg.add(_grouped_mm(kw["self"], kw["mat2"], kw["offs"]),
                                          kw["bias"]),
        # sizes that depend on the data (torch.export's guards on their unbacked size, size
        # comparisons and _assert_scalar, pass through shape_ops, so these are reached)
        aten.nonzero.default: _data_dependent(
            "nonzero", "Use a mask instead: torch.where(cond, x, other), or (x != 0) in "
                       "arithmetic."),
        aten.argwhere.default: _data_dependent(
            "argwhere", "Use a mask instead: torch.where(cond, x, other)."),
        aten.masked_select.default: _data_dependent(
            "masked_select", "Keep the shape: torch.where(mask, x, 0), or a masked sum "
                             "(x * mask).sum()."),
        aten.unique_consecutive.default: _data_dependent(
            "unique_consecutive", "Keep the shape: mark each run's first element, "
                                  "torch.cat([x[:1] == x[:1], x[1:] != x[:-1]]), and mask."),
        aten._unique2.default: _data_dependent(
            "unique", "Keep the shape: torch.sort(x) and a mask of each value's first "
                      "place (sorted[1:] != sorted[:-1])."),
        aten.unique_dim.default: _data_dependent(
            "unique", "Keep the shape: sort and mask the first place of each value."),
    })
