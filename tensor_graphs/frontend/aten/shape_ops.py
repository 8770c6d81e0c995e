"""ATen views, shapes, identities, casts and size arithmetic."""

from __future__ import annotations

import operator

import tensor_graphs as tg
from tensor_graphs.errors import ShapeError
from tensor_graphs.frontend.aten.common import cast, same, slice_end, unary


def _slice(x, dim, start, end, step):
    start = None if start == 0 else start
    return tg.slice_axis(x, dim, start, slice_end(end), step)


def _select(x, dim, index):
    stop = None if index == -1 else index + 1
    return tg.squeeze(tg.slice_axis(x, dim, index, stop), dim)


def _split(x, sizes, dim):
    out, start = [], 0
    for size in sizes:
        out.append(tg.slice_axis(x, dim, start, start + size))
        start = start + size
    return out


def _split_size(x, size, dim):
    n = x.shape[dim if dim >= 0 else x.ndim + dim]
    if not isinstance(n, int):
        raise ShapeError(f"split: axis {dim} of {x.shape} is symbolic; split by explicit sizes")
    return _split(x, [min(size, n - s) for s in range(0, n, size)], dim)


def _chunk(x, chunks, dim):
    n = x.shape[dim if dim >= 0 else x.ndim + dim]
    return _split_size(x, -(-n // chunks), dim)


def _unbind(x, dim):
    n = x.shape[dim if dim >= 0 else x.ndim + dim]
    return [_select(x, dim, i) for i in range(n)]


def _squeeze(x, dims):
    keep = [d % x.ndim for d in dims if x.shape[d] == 1] if x.ndim else []
    return tg.squeeze(x, tuple(keep)) if keep else x


def table(aten) -> dict:
    return {
        # shapes and views
        aten.view.default: lambda a, kw: tg.reshape(kw["self"], tuple(kw["size"])),
        aten._unsafe_view: lambda a, kw: tg.reshape(kw["self"], tuple(kw["size"])),
        aten.reshape: lambda a, kw: tg.reshape(kw["self"], tuple(kw["shape"])),
        aten.flatten.using_ints: lambda a, kw: tg.flatten(kw["self"], kw["start_dim"],
                                                          kw["end_dim"]),
        aten.permute: lambda a, kw: tg.permute(kw["self"], tuple(kw["dims"])),
        aten.transpose.int: lambda a, kw: tg.transpose(kw["self"], kw["dim0"], kw["dim1"]),
        aten.t: lambda a, kw: tg.permute(kw["self"], tuple(range(kw["self"].ndim))[::-1]),
        aten.expand: lambda a, kw: tg.expand(kw["self"], tuple(kw["size"])),
        aten.unsqueeze: lambda a, kw: tg.unsqueeze(kw["self"], kw["dim"]),
        aten.squeeze.default: lambda a, kw: tg.squeeze(kw["self"]),
        aten.squeeze.dim: lambda a, kw: _squeeze(kw["self"], [kw["dim"]]),
        aten.squeeze.dims: lambda a, kw: _squeeze(kw["self"], kw["dim"]),
        aten.slice.Tensor: lambda a, kw: _slice(kw["self"], kw["dim"], kw["start"], kw["end"],
                                                kw["step"]),
        aten.select.int: lambda a, kw: _select(kw["self"], kw["dim"], kw["index"]),
        aten.cat: lambda a, kw: tg.concat(list(kw["tensors"]), axis=kw["dim"]),
        aten.split.Tensor: lambda a, kw: _split_size(kw["self"], kw["split_size"], kw["dim"]),
        aten.split_with_sizes: lambda a, kw: _split(kw["self"], kw["split_sizes"], kw["dim"]),
        aten.chunk: lambda a, kw: _chunk(kw["self"], kw["chunks"], kw["dim"]),
        aten.unbind.int: lambda a, kw: _unbind(kw["self"], kw["dim"]),
        # identities and casts
        aten.contiguous: unary(same),
        aten.clone: unary(same),
        aten.alias: unary(same),
        aten.detach: unary(same),
        aten.detach_: unary(same),
        aten.lift_fresh_copy: unary(same),
        aten._assert_tensor_metadata: lambda a, kw: None,
        aten._to_copy: lambda a, kw: cast(kw["self"], kw["dtype"]),
        aten.to.dtype: lambda a, kw: cast(kw["self"], kw["dtype"]),
        aten.to.dtype_layout: lambda a, kw: cast(kw["self"], kw["dtype"]),
        aten.to.device: lambda a, kw: cast(kw["self"], kw["dtype"]),
        aten.type_as: lambda a, kw: tg.cast(kw["self"], kw["other"].dtype),
        # sizes
        aten.sym_size.int: lambda a, kw: kw["self"].shape[kw["dim"]],
        operator.getitem: lambda a, kw: a[0][a[1]],
        operator.add: lambda a, kw: a[0] + a[1],
        operator.sub: lambda a, kw: a[0] - a[1],
        operator.mul: lambda a, kw: a[0] * a[1],
        operator.floordiv: lambda a, kw: a[0] // a[1],
        operator.neg: lambda a, kw: -a[0],


    }
