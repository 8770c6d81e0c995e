"""ATen views, shapes, identities, casts and size arithmetic."""

from __future__ import annotations

import operator

import numpy as np

from tensor_graphs.errors import ArgumentError, ShapeError
from tensor_graphs.frontend.aten.common import cast, guarded, ints, same, slice_end, unary
from tensor_graphs.ir import api as tg


def _slice(x, dim, start, end, step):
    start = None if start == 0 else start
    return tg.slice_axis(x, dim, start, slice_end(end), step)


def _select(x, dim, index):
    stop = None if index == -1 else index + 1
    return tg.squeeze(tg.slice_axis(x, dim, index, stop), dim)


def _cat(tensors, dim):
    """torch's cat: the result's dtype is promoted over every tensor, skipped ones included."""
    xs = tg.promote(*tensors, op="cat")
    # torch skips 1-D size-0 tensors whatever the others' rank (ATen cat_should_skip_tensor)
    kept = [x for x in xs if tuple(x.shape) != (0,)]
    return tg.concat(kept, axis=dim) if kept else xs[0]


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


def _movedim(x, source, destination):
    source = [d % x.ndim for d in ints(source)]
    destination = [d % x.ndim for d in ints(destination)]
    rest = iter(d for d in range(x.ndim) if d not in source)
    where = dict(zip(destination, source))
    return tg.permute(x, tuple(where[i] if i in where else next(rest) for i in range(x.ndim)))


def _flip(x, dims):
    for d in ints(dims):
        x = tg.slice_axis(x, d, None, None, -1)
    return x


def _roll(x, shifts, dims):
    shifts, dims = ints(shifts), ints(dims)
    if not dims:  # roll the flattened tensor
        return tg.reshape(_roll(tg.reshape(x, (-1,)), shifts, (0,)), tuple(x.shape))
    if len(shifts) != len(dims):
        raise ArgumentError(f"roll: shifts {shifts} and dims {dims} must have the same length")
    for shift, d in zip(shifts, dims):
        n = x.shape[d]
        if not isinstance(n, int):
            raise ShapeError(f"roll: axis {d} of {x.shape} must be concrete")
        k = shift % n if n else 0
        if k:
            x = tg.concat([tg.slice_axis(x, d, n - k, None), tg.slice_axis(x, d, None, n - k)],
                          axis=d)
    return x


def _repeat(x, repeats):
    repeats = tuple(repeats)
    if len(repeats) < x.ndim:
        raise ArgumentError(f"repeat: {len(repeats)} repeats for a {x.ndim}-d tensor; torch "
                            "needs at least one per dim")
    return tg.tile(x, reps=repeats)


def _pixel_shuffle(x, r):
    *lead, c, h, w = x.shape
    y = tg.reshape(x, (*lead, c // (r * r), r, r, h, w))
    n = len(lead)
    y = tg.permute(y, tuple(range(n)) + (n, n + 3, n + 1, n + 4, n + 2))
    return tg.reshape(y, (*lead, c // (r * r), h * r, w * r))


def _pixel_unshuffle(x, r):
    *lead, c, h, w = x.shape
    y = tg.reshape(x, (*lead, c, h // r, r, w // r, r))
    n = len(lead)
    y = tg.permute(y, tuple(range(n)) + (n, n + 2, n + 4, n + 1, n + 3))
    return tg.reshape(y, (*lead, c * r * r, h // r, w // r))


_PAD_INDEX = {
    "reflect": lambda i, n: np.where(np.abs(i) > n - 1, 2 * (n - 1) - np.abs(i), np.abs(i)),
    "replicate": lambda i, n: np.clip(i, 0, n - 1),
    "circular": lambda i, n: i % n,
}


def _pad(op, x, pad, mode="constant", value=None):
    """torch's pad: constant padding is our pad op; reflect / replicate / circular gather each
    padded axis with a constant index array (concrete sizes)."""
    pad = ints(pad)
    if mode == "constant":
        return tg.pad(x, pad, 0.0 if value is None else value)
    if mode not in _PAD_INDEX:
        raise ArgumentError(f"{op}: mode={mode!r} is not supported; use 'constant', 'reflect', "
                            "'replicate' or 'circular'")
    for k in range(len(pad) // 2):
        axis, before, after = x.ndim - 1 - k, pad[2 * k], pad[2 * k + 1]
        n = x.shape[axis]
        if not isinstance(n, int):
            raise ShapeError(f"{op}: {mode} padding needs a concrete axis {axis}, got {x.shape}")
        if mode == "reflect" and max(before, after) >= n:
            raise ShapeError(f"{op}: reflect padding ({before}, {after}) must be smaller than "
                             f"the axis size {n}")
        if before == 0 and after == 0:
            continue
        index = _PAD_INDEX[mode](np.arange(-before, n + after), n).astype(np.int64)
        x = tg.gather(x, tg.constant(index), axis=axis)
    return x


def _pad_fn(op, mode):
    return lambda a, kw: _pad(op, kw["self"], kw["padding"], mode)


def table(aten) -> dict:
    return {**guarded({
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
        aten.expand_as: lambda a, kw: tg.broadcast_to(kw["self"], tuple(kw["other"].shape)),
        aten.view_as: lambda a, kw: tg.reshape(kw["self"], tuple(kw["other"].shape)),
        aten.reshape_as: lambda a, kw: tg.reshape(kw["self"], tuple(kw["other"].shape)),
        aten.unsqueeze: lambda a, kw: tg.unsqueeze(kw["self"], kw["dim"]),
        aten.squeeze.default: lambda a, kw: tg.squeeze(kw["self"]),
        aten.squeeze.dim: lambda a, kw: _squeeze(kw["self"], [kw["dim"]]),
        aten.squeeze.dims: lambda a, kw: _squeeze(kw["self"], kw["dim"]),
        aten.slice.Tensor: lambda a, kw: _slice(kw["self"], kw["dim"], kw["start"], kw["end"],
                                                kw["step"]),
        aten.select.int: lambda a, kw: _select(kw["self"], kw["dim"], kw["index"]),
        aten.cat: lambda a, kw: _cat(list(kw["tensors"]), kw["dim"]),
        aten.split.Tensor: lambda a, kw: _split_size(kw["self"], kw["split_size"], kw["dim"]),
        aten.split_with_sizes: lambda a, kw: _split(kw["self"], kw["split_sizes"], kw["dim"]),
        aten.chunk: lambda a, kw: _chunk(kw["self"], kw["chunks"], kw["dim"]),
        aten.unbind.int: lambda a, kw: _unbind(kw["self"], kw["dim"]),
        aten.stack: lambda a, kw: tg.stack(list(kw["tensors"]), axis=kw["dim"]),
        aten.narrow: lambda a, kw: tg.slice_axis(kw["self"], kw["dim"], kw["start"],
                                                 kw["start"] + kw["length"]),
        aten.movedim: lambda a, kw: _movedim(kw["self"], kw["source"], kw["destination"]),
        aten.flip: lambda a, kw: _flip(kw["self"], kw["dims"]),
        aten.roll: lambda a, kw: _roll(kw["self"], kw["shifts"], kw["dims"]),
        aten.repeat: lambda a, kw: _repeat(kw["self"], kw["repeats"]),
        aten.pixel_shuffle: lambda a, kw: _pixel_shuffle(kw["self"], kw["upscale_factor"]),
        aten.pixel_unshuffle: lambda a, kw: _pixel_unshuffle(kw["self"],
                                                             kw["downscale_factor"]),
        # padding
        aten.constant_pad_nd: lambda a, kw: tg.pad(kw["self"], ints(kw["pad"]), kw["value"]),
        aten.pad: lambda a, kw: _pad("pad", kw["self"], kw["pad"], kw["mode"], kw["value"]),
        aten.reflection_pad1d: _pad_fn("reflection_pad1d", "reflect"),
        aten.reflection_pad2d: _pad_fn("reflection_pad2d", "reflect"),
        aten.replication_pad1d: _pad_fn("replication_pad1d", "replicate"),
        aten.replication_pad2d: _pad_fn("replication_pad2d", "replicate"),
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
        operator.add: lambda a, kw: a[0] + a[1],
        operator.sub: lambda a, kw: a[0] - a[1],
        operator.mul: lambda a, kw: a[0] * a[1],
        operator.floordiv: lambda a, kw: a[0] // a[1],
        operator.neg: lambda a, kw: -a[0],
    }),
        # picking an output of a multi-output op, Unavailable ones too (a use raises)
        operator.getitem: lambda a, kw: a[0][a[1]],
    }
