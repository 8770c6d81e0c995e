"""ATen tensor creation and indexing: arange, ones/full, advanced indexing, gather, diff.

Masks built at run time (transformers' causal and padding masks) are spelled with these:
aranges over the symbolic sequence length, ``x[idx0, idx1]`` with broadcast index tensors,
``new_ones``. All of them lower to our atomic ``iota``, ``gather`` and arithmetic.
"""

from __future__ import annotations

import math

from tensor_graphs.errors import ArgumentError, DTypeError, ShapeError
from tensor_graphs.frontend.aten.common import dtype_name, guarded, scalar_dims, torch_module
from tensor_graphs.ir import api as tg


def _arange(start, end, step, dtype):
    return tg.arange(start, end, step, dtype=None if dtype is None else dtype_name(dtype))


def _full(size, value, dtype, like=None):
    """A tensor of one value: a constant expanded to ``size`` (no memory of its own)."""
    name = dtype_name(dtype) if dtype is not None else (
        like.dtype.name if like is not None else
        "bool" if isinstance(value, bool) else "int64" if isinstance(value, int) else "float32")
    scalar = tg.constant(value, name)
    size = tuple(size)
    return tg.expand(scalar, size) if size else scalar


def _size(n):
    """A size (int or symbolic) as a 0-d int64 tensor."""
    return tg.size(n) if not isinstance(n, int) else tg.constant(n, "int64")


def _wrap(idx, n):
    """torch's negative indices count from the end: idx + n where idx < 0."""
    return tg.where(tg.less(idx, 0), tg.add(idx, _size(n)), idx)


def _index(x, indices):
    """``x[i0, i1, ...]`` with int index tensors broadcast together (``None``: a whole axis).

    The indexed axes move to the front and are flattened into one, so the lookup is one
    ``gather`` of the linear index sum(i_k * stride_k). As in torch and numpy, the broadcast
    index dims take the place of the first indexed axis when the indexed axes are adjacent,
    else they come first.
    """
    indices = list(indices) + [None] * (x.ndim - len(indices))
    axes = [k for k, i in enumerate(indices) if i is not None]
    if not axes:
        return x
    for k in axes:
        if indices[k].dtype.name == "bool":
            raise ArgumentError("index: boolean mask indexing gives a data-dependent shape; "
                                "use torch.where(mask, x, other) in the model instead")
        if not indices[k].dtype.is_int:
            raise DTypeError(f"index: indices must be int tensors, got {indices[k].dtype.name}")
    rest = [k for k in range(x.ndim) if k not in axes]
    moved = tg.permute(x, tuple(axes + rest)) if axes != list(range(len(axes))) else x
    sizes = [x.shape[k] for k in axes]
    linear = None
    for j, k in enumerate(axes):
        stride = math.prod(sizes[j + 1:])
        term = _wrap(tg.cast(indices[k], "int64"), sizes[j])
        if stride != 1:
            term = tg.mul(term, _size(stride))
        linear = term if linear is None else tg.add(linear, term)
    flat = tg.reshape(moved, (-1,) + tuple(x.shape[k] for k in rest)) if len(axes) > 1 \
        else moved
    out = tg.gather(flat, linear, axis=0)
    adjacent = axes == list(range(axes[0], axes[-1] + 1))
    if adjacent and axes[0] > 0:  # the index dims go back where the first indexed axis was
        nb, lead = linear.ndim, axes[0]
        order = tuple(range(nb, nb + lead)) + tuple(range(nb)) + tuple(
            range(nb + lead, out.ndim))
        out = tg.permute(out, order)
    return out


def _gather(x, dim, index):
    """torch.gather: out[i][j][k] = x[i][index[i][j][k]][k] (for dim 1), index as large as
    x or smaller on every axis but ``dim``: an index of x over aranges on the other axes."""
    if x.ndim == 0 or index.ndim == 0:  # torch's 0-d convention: dim 0 or -1, one axis
        if dim not in (0, -1) or max(x.ndim, index.ndim) > 1:
            raise ShapeError(f"gather: dim {dim} with an input of shape {x.shape} and an "
                             f"index of shape {index.shape}")
        out = _gather(tg.reshape(x, (1,)) if x.ndim == 0 else x, 0,
                      tg.reshape(index, (1,)) if index.ndim == 0 else index)
        return tg.reshape(out, tuple(index.shape))
    dim = dim % x.ndim
    if index.ndim != x.ndim and 0 in tuple(index.shape):  # torch reads nothing: no rank check
        return tg.expand(tg.constant(0, x.dtype.name), tuple(index.shape))
    if index.ndim != x.ndim:
        raise ShapeError(f"gather: index of rank {index.ndim} for an input of rank {x.ndim}")
    indices = []
    for k in range(x.ndim):
        if k == dim:
            indices.append(index)
            continue
        shape = [1] * x.ndim
        shape[k] = index.shape[k]
        indices.append(tg.reshape(tg.iota(index.shape[k]), tuple(shape)))
    return _index(x, indices)


def _diff(x, n, dim, prepend, append):
    """torch.diff: n times x[1:] - x[:-1] along ``dim`` after attaching prepend/append."""
    if n == 0:  # torch returns the input as it is, prepend and append unused
        return x
    parts = [p for p in (prepend, x, append) if p is not None]
    y = tg.concat(parts, axis=dim) if len(parts) > 1 else x
    for _ in range(n):
        length = y.shape[dim % y.ndim]
        y = tg.sub(tg.slice_axis(y, dim, 1, None), tg.slice_axis(y, dim, 0, length - 1))
    return y


def table(aten) -> dict:
    return guarded({
        # creation
        aten.arange.default: lambda a, kw: _arange(0, kw["end"], 1, kw["dtype"]),
        aten.arange.start: lambda a, kw: _arange(kw["start"], kw["end"], 1, kw["dtype"]),
        aten.arange.start_step: lambda a, kw: _arange(kw["start"], kw["end"], kw["step"],
                                                      kw["dtype"]),
        aten.ones.default: lambda a, kw: _full(kw["size"], 1, kw["dtype"]),
        aten.zeros.default: lambda a, kw: _full(kw["size"], 0, kw["dtype"]),
        aten.full.default: lambda a, kw: _full(kw["size"], kw["fill_value"], kw["dtype"]),
        aten.new_ones: lambda a, kw: _full(kw["size"], 1, kw["dtype"], kw["self"]),
        aten.new_zeros: lambda a, kw: _full(kw["size"], 0, kw["dtype"], kw["self"]),
        aten.new_full: lambda a, kw: _full(kw["size"], kw["fill_value"], kw["dtype"],
                                           kw["self"]),
        # torch.scalar_tensor's default dtype is float32 whatever the value's type
        aten.scalar_tensor: lambda a, kw: _full((), kw["s"], kw["dtype"] or "float32"),
        torch_module().ops.prims.scalar_tensor: lambda a, kw: _full((), kw["s"],
                                                                    kw["dtype"] or "float32"),
        aten.ones_like: lambda a, kw: _full(kw["self"].shape, 1, kw["dtype"], kw["self"]),
        aten.zeros_like: lambda a, kw: _full(kw["self"].shape, 0, kw["dtype"], kw["self"]),
        aten.full_like: lambda a, kw: _full(kw["self"].shape, kw["fill_value"], kw["dtype"],
                                            kw["self"]),
        # indexing
        aten.index.Tensor: lambda a, kw: _index(kw["self"], kw["indices"]),
        aten.gather: lambda a, kw: _gather(kw["self"], kw["dim"], kw["index"]),
        aten.index_select: scalar_dims(lambda a, kw: tg.gather(kw["self"], kw["index"],
                                                               axis=kw["dim"])),
        aten.diff: lambda a, kw: _diff(kw["self"], kw["n"], kw["dim"], kw["prepend"],
                                       kw["append"]),
        # bool logic (the bitwise operators, bools and ints: pointwise_ops)
        aten.logical_and: lambda a, kw: tg.logical_and(kw["self"], kw["other"]),
        aten.logical_or: lambda a, kw: tg.logical_or(kw["self"], kw["other"]),
    })
