"""ONNX's indexing and selection: GatherElements, GatherND, ScatterElements, ScatterND,
TopK, Trilu, on our take_along_axis, gather, put_along_axis, topk and triangular masks."""

from __future__ import annotations

from tensor_graphs.frontend.onnx.common import Ctx, ints, norm_axis, product
from tensor_graphs.ir import api as tg


def _wrapped(idx, dim):
    """ONNX indices may count from the end."""
    if idx.dtype.name != "int64":
        idx = tg.cast(idx, "int64")
    size = tg.size(dim) if not isinstance(dim, int) else dim
    return tg.where(tg.less(idx, 0), tg.add(idx, size), idx)


def _gather_elements(c: Ctx):
    x = c.t(0)
    axis = norm_axis(c.a("axis", 0), x.ndim)
    return tg.take_along_axis(x, _wrapped(c.t(1), x.shape[axis]), axis=axis)


# ScatterElements' reduction -> put_along_axis's
_REDUCE = {"none": "replace", "add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _scatter_elements(c: Ctx):
    x = c.t(0)
    axis = norm_axis(c.a("axis", 0), x.ndim)
    idx = _wrapped(c.t(1), x.shape[axis])
    return tg.put_along_axis(x, idx, c.t(2), axis=axis,
                             reduce=_REDUCE[c.a("reduction", "none")])


def _dim(d):
    """A size as an operand: an int as it is, a symbolic one as its 0-d value."""
    return d if isinstance(d, int) else tg.size(d)


def _linear_index(c: Ctx, x, idx, batch: int):
    """ONNX's index tuples (last axis of ``idx``) into the flattened axes of ``x`` after
    its ``batch`` leading ones, each batch's tuples offset to its own block of the
    flattened data (GatherND's batch_dims), so one gather on axis 0 reads them all."""
    k = idx.shape[-1]
    if not isinstance(k, int):
        raise c.refuse(f"indices {idx.shape} of symbolic depth (the last axis sizes the "
                       "index tuples); export the model with a static last axis")
    dims = x.shape[batch:batch + k]
    strides = [product(dims[j + 1:]) for j in range(k)]
    idx = tg.cast(idx, "int64") if idx.dtype.name != "int64" else idx
    parts = []
    for j in range(k):
        one = tg.squeeze(tg.slice_axis(idx, -1, j, j + 1), idx.ndim - 1)
        one = _wrapped(one, dims[j])
        parts.append(one if strides[j] == 1 else tg.mul(one, _dim(strides[j])))
    if batch:
        lead = x.shape[:batch]
        block = tg.reshape(tg.iota(product(lead)), (*lead, *(1,) * (idx.ndim - 1 - batch)))
        parts.append(tg.mul(block, _dim(product(dims))))
    linear = parts[0]
    for p in parts[1:]:
        linear = tg.add(linear, p)
    flat = tg.reshape(x, (product(x.shape[:batch + k]), *x.shape[batch + k:]))
    return flat, linear


def _gather_nd(c: Ctx):
    x, idx = c.t(0), c.t(1)
    flat, linear = _linear_index(c, x, idx, c.a("batch_dims", 0))
    return tg.gather(flat, linear, 0)


def _scatter_nd(c: Ctx):
    x, idx, upd = c.t(0), c.t(1), c.t(2)
    flat, linear = _linear_index(c, x, idx, 0)
    reduce = _REDUCE[c.a("reduction", "none")]
    rest = flat.shape[1:]
    lin = tg.reshape(linear, (-1,) + (1,) * len(rest))
    lin = tg.broadcast_to(lin, -1, *rest) if rest else tg.reshape(linear, (-1,))
    values = tg.reshape(upd, (-1, *rest))
    out = tg.put_along_axis(flat, lin, values, axis=0, reduce=reduce)
    return tg.reshape(out, x.shape)


def _topk(c: Ctx):
    x = c.t(0)
    k = ints(c.s(1, "K"))[0] if c.opset >= 10 else c.a("k")
    axis = c.a("axis", -1)
    values, indices = tg.topk(x, int(k), axis, bool(c.a("largest", 1)))
    return values, indices


def _trilu(c: Ctx):
    k = int(ints(c.s(1, "k"))[0]) if c.has(1) else 0
    fn = tg.triu if c.a("upper", 1) else tg.tril
    return fn(c.t(0), diagonal=k)


def table() -> dict:
    return {
        "GatherElements": _gather_elements, "ScatterElements": _scatter_elements,
        "Scatter": _scatter_elements, "GatherND": _gather_nd, "ScatterND": _scatter_nd,
        "TopK": _topk, "Trilu": _trilu,
    }


__all__ = ["table"]
