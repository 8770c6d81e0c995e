"""ATen views, shapes, identities, casts and size arithmetic."""

from __future__ import annotations

import math
import operator

import numpy as np
import sympy

from tensor_graphs.errors import ArgumentError, ShapeError
from tensor_graphs.frontend.aten.common import (
    Unavailable,
    cast,
    guarded,
    ints,
    same,
    scalar_dims,
    slice_end,
    torch_module,
    unary,
)
from tensor_graphs.frontend.aten.random_ops import training
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.node import Node


def _detach(a, kw):
    """``tensor.detach()``: in an import for training a ``stop_gradient`` (a straight-through
    estimator, a stop-gradient target: tg.grad must not flow through it, as torch's autograd
    does not); in an inference import the value itself, nothing being differentiated."""
    x = kw["self"]
    if training() and isinstance(x, Node) and x.dtype.is_float:
        return tg.stop_gradient(x)
    return x


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
    """A reversed slice on a concrete axis; on a symbolic one (Wav2Vec2's feature mask over
    the length), a gather at n-1, n-2, ..., 0, which one plan serves at every length."""
    for d in ints(dims):
        n = x.shape[d]
        if isinstance(n, int):
            x = tg.slice_axis(x, d, None, None, -1)
        else:
            x = tg.gather(x, tg.size(n - 1) - tg.iota(n), axis=d)
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


def _repeat_interleave(x, repeats, dim):
    """``x.repeat_interleave(n, dim)`` with one repeat count for every element (attention
    masks and rotary tables repeated per head): each element followed by its n-1 copies is
    an expand along a new axis after ``dim``, merged into it. Without ``dim`` the input is
    flattened first, as torch does. torch's decomposition of it needs a retrace."""
    if dim is None:
        x, dim = tg.reshape(x, (-1,)), 0
    dim = dim % max(x.ndim, 1)
    shape = tuple(x.shape)
    spread = tg.expand(tg.unsqueeze(x, dim + 1),
                       shape[:dim + 1] + (repeats,) + shape[dim + 1:])
    return tg.reshape(spread, shape[:dim] + (shape[dim] * repeats,) + shape[dim + 1:])


def _unflatten(x, dim, sizes):
    """``x.unflatten(dim, sizes)``: axis ``dim`` split into ``sizes`` (one may be -1)."""
    dim = dim % x.ndim
    shape = tuple(x.shape)
    return tg.reshape(x, shape[:dim] + tuple(sizes) + shape[dim + 1:])


def _as_strided(x, size, stride, offset, layout):
    """torch.as_strided (what torch's diagonal and einsum traces decompose to) as one gather
    of constant indices. ``size``, ``stride`` and ``offset`` address the storage ``x`` is a
    view of; ``layout`` is x's own (strides, storage offset), from the exported graph, so
    each storage position read is found among x's elements."""
    x_stride, x_offset = layout
    if not all(isinstance(d, int) for d in (*x.shape, *size, *stride)):
        raise ShapeError(f"as_strided: sizes {tuple(size)} of an input {x.shape} must be "
                         "concrete")
    offset = x_offset if offset is None else offset
    numel = int(np.prod(x.shape, dtype=np.int64))
    where = x_offset + sum((np.indices(tuple(x.shape), dtype=np.int64)[k] * s
                            for k, s in enumerate(x_stride)), np.zeros(x.shape, np.int64))
    read = offset + sum((np.indices(tuple(size), dtype=np.int64)[k] * s
                         for k, s in enumerate(stride)), np.zeros(tuple(size), np.int64))
    lookup = np.full(int(max(where.max(initial=0), read.max(initial=0))) + 1, -1, np.int64)
    lookup[where.ravel()] = np.arange(numel, dtype=np.int64)
    index = lookup[read] if read.size else read
    if read.size and (read.min() < 0 or (index < 0).any()):
        raise ShapeError(f"as_strided: size {tuple(size)}, stride {tuple(stride)}, offset "
                         f"{offset} reads memory outside its input {x.shape}")
    return tg.gather(tg.reshape(x, (-1,)), tg.constant(index), axis=0)


def _as_strided_fn(a, kw):
    return _as_strided(kw["self"], kw["size"], kw["stride"], kw["storage_offset"],
                       kw["self_layout"])


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
        if before < 0 or after < 0:  # torch crops first, then pads what is left
            x = tg.slice_axis(x, axis, max(-before, 0), n - max(-after, 0))
            n, before, after = n - max(-before, 0) - max(-after, 0), max(before, 0), \
                max(after, 0)
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


def _size_fn(concrete, symbolic, *values):
    """A Python size function on ints, its sympy counterpart on symbolic dims."""
    if any(isinstance(v, sympy.Expr) for v in values):
        return symbolic(*values)
    return concrete(*values)


def torch_sym(name: str):
    """torch's SymInt function of that name (torch.sym_max...), which export records as is."""
    return getattr(torch_module(), name)


def _diagonal_scatter(x, src, offset, dim1, dim2):
    """torch.diagonal_scatter: x with the diagonal torch.diagonal(x, offset, dim1, dim2)
    replaced by src (its last axis runs along the diagonal). The two axes are moved last;
    each of their places takes src's element at its diagonal position (a gather of constant
    indices) where a constant mask marks the diagonal, x's own element elsewhere."""
    nd = x.ndim
    if nd < 2:
        raise ShapeError(f"diagonal_scatter: the input {x.shape} needs at least 2 dims")
    d1, d2 = dim1 % nd, dim2 % nd
    if d1 == d2:
        raise ShapeError(f"diagonal_scatter: dim1 and dim2 ({dim1}, {dim2}) name the same "
                         f"axis of {x.shape}")
    n1, n2 = x.shape[d1], x.shape[d2]
    if not isinstance(n1, int) or not isinstance(n2, int):
        raise ShapeError(f"diagonal_scatter: axes {d1} and {d2} of {x.shape} must be concrete")
    length = max(0, min(n1 + min(offset, 0), n2 - max(offset, 0)))
    others = [a for a in range(nd) if a not in (d1, d2)]
    want = tuple(x.shape[a] for a in others) + (length,)
    if src.ndim != len(want) or not all(
            not (isinstance(a, int) and isinstance(b, int)) or a == b
            for a, b in zip(src.shape, want)):
        raise ShapeError(f"diagonal_scatter: src {src.shape} must have the diagonal's shape "
                         f"{want}")
    if length == 0:
        return x
    rows = np.arange(length) + max(-offset, 0)
    cols = np.arange(length) + max(offset, 0)
    mask = np.zeros((n1, n2), bool)
    mask[rows, cols] = True
    place = np.zeros((n1, n2), np.int64)
    place[rows, cols] = np.arange(length)
    perm = tuple(others) + (d1, d2)
    moved = tg.permute(x, perm)
    spread = tg.gather(tg.cast(src, x.dtype), tg.constant(place.reshape(-1)), axis=-1)
    spread = tg.reshape(spread, tuple(moved.shape))
    out = tg.where(tg.constant(mask), spread, moved)
    return tg.permute(out, tuple(int(i) for i in np.argsort(perm)))


def _copy(x, src):
    """The functional ``copy`` (what ``y[..] = src`` and ``copy_`` are, made functional):
    src in x's dtype, broadcast to x's shape."""
    return tg.broadcast_to(tg.cast(src, x.dtype), tuple(x.shape))


def _slice_scatter(x, src, dim, start, end, step):
    """torch.slice_scatter (``y[:, 1:] = src`` made functional): x with its slice
    ``start:end:step`` along ``dim`` replaced by src. A step of 1 joins x's parts on either
    side of the slice to src (one concat, symbolic sizes included); a longer step, on a
    concrete axis, takes each sliced place's element of src by a gather of constant indices
    where a constant mask marks the slice."""
    dim = dim % x.ndim
    src = tg.cast(src, x.dtype)
    n, end = x.shape[dim], slice_end(end)
    if step == 1:
        if isinstance(n, int) and all(isinstance(v, (int, type(None))) for v in (start, end)):
            start, end, _ = slice(start, end).indices(n)
            end = max(start, end)  # an empty slice: src is empty and goes at start
            end = None if end == n else end
        parts = [tg.slice_axis(x, dim, None, start)] if start else []
        parts.append(src)
        if end is not None:
            parts.append(tg.slice_axis(x, dim, end, None))
        return tg.concat(parts, axis=dim) if len(parts) > 1 else src
    if not isinstance(n, int):
        raise ShapeError(f"slice_scatter: a step of {step} on the symbolic axis {dim} of "
                         f"{x.shape}; only a step of 1 takes a symbolic axis")
    places = np.arange(n)[slice(start, slice_end(end), step)]
    mask = np.zeros(n, bool)
    mask[places] = True
    index = np.zeros(n, np.int64)
    index[places] = np.arange(len(places))
    shape = [1] * x.ndim
    shape[dim] = n
    spread = tg.gather(src, tg.constant(index), axis=dim)
    return tg.where(tg.constant(mask.reshape(shape)), spread, x)


def _select_scatter(x, src, dim, index):
    """torch.select_scatter (``y[:, 0] = src`` made functional): a slice_scatter of one
    place."""
    dim = dim % x.ndim
    stop = None if index == -1 else index + 1
    return _slice_scatter(x, tg.unsqueeze(src, dim), dim, index, stop, 1)


def _read_value(a, kw):
    """``t.item()`` (``aten._local_scalar_dense``; ``.tolist()`` and ``int(t)`` too): a
    tensor's value as a Python number, known only when the program runs. torch.export's
    own checks on it (``assert n <= seq``: a comparison and ``_assert_scalar``) pass it
    through and are dropped as its other size checks are; a use that needs the number (a
    size, a scalar argument) is refused there, naming the fix."""
    return Unavailable(
        "a tensor's value read as a Python number (.item(), .tolist(), int(t): "
        "aten::_local_scalar_dense) sets a size or a scalar argument here; a compiled "
        "program's sizes and constants are fixed before it sees any value. Keep it a "
        "tensor (torch.where, a mask, a comparison's result in arithmetic), or pass the "
        "number as a static argument")


def _on_sizes(fn):
    """A Python operator on sizes; a value read from a tensor (``_read_value``) passes
    through it unchanged, to be refused only where an op uses the result."""
    def call(a, kw):
        found = next((v for v in a if isinstance(v, Unavailable)), None)
        return found if found is not None else fn(a, kw)
    return call


def _size_ops(aten) -> dict:
    """Python arithmetic on sizes (``operator.mul`` on ``sym_size`` results; sympy on our
    symbolic dims) and torch.export's checks on them."""
    def two(op):
        return _on_sizes(lambda a, kw: op(a[0], a[1]))

    return {
        **{op: two(op) for op in (operator.add, operator.sub, operator.mul,
                                  operator.floordiv, operator.mod, operator.truediv,
                                  operator.pow)},
        operator.neg: _on_sizes(lambda a, kw: -a[0]),
        math.ceil: _on_sizes(lambda a, kw: _size_fn(math.ceil, sympy.ceiling, a[0])),
        math.floor: _on_sizes(lambda a, kw: _size_fn(math.floor, sympy.floor, a[0])),
        torch_sym("sym_float"): _on_sizes(
            lambda a, kw: a[0] if isinstance(a[0], sympy.Expr) else float(a[0])),
        torch_sym("sym_int"): _on_sizes(lambda a, kw: _size_fn(int, sympy.floor, a[0])),
        torch_sym("sym_max"): _on_sizes(lambda a, kw: _size_fn(max, sympy.Max, *a)),
        torch_sym("sym_min"): _on_sizes(lambda a, kw: _size_fn(min, sympy.Min, *a)),
        torch_sym("sym_sum"): _on_sizes(lambda a, kw: sum(a[0], 0)),  # (a list of sizes)
        # comparisons of sizes feed only torch's own checks (below): evaluated, never used
        **{op: two(op) for op in (operator.eq, operator.ne, operator.lt, operator.le,
                                  operator.gt, operator.ge)},
        torch_sym("sym_not"): _on_sizes(
            lambda a, kw: not a[0] if isinstance(a[0], bool) else sympy.Not(a[0])),
        # the checks torch.export inserts on sizes (a dim's range, a data-dependent size's
        # sign) are dropped: the dims' bounds carry the ranges, and a call is checked
        # against its leaves' shapes
        aten._assert_scalar: lambda a, kw: None,
        aten.sym_constrain_range_for_size: lambda a, kw: None,
        aten.sym_constrain_range: lambda a, kw: None,
    }


def table(aten) -> dict:
    return {**guarded({
        # shapes and views
        aten.diagonal_scatter: lambda a, kw: _diagonal_scatter(
            kw["self"], kw["src"], kw["offset"], kw["dim1"], kw["dim2"]),
        aten.view.default: lambda a, kw: tg.reshape(kw["self"], tuple(kw["size"])),
        aten._unsafe_view: lambda a, kw: tg.reshape(kw["self"], tuple(kw["size"])),
        aten.reshape: lambda a, kw: tg.reshape(kw["self"], tuple(kw["shape"])),
        aten.flatten.using_ints: lambda a, kw: tg.flatten(kw["self"], kw["start_dim"],
                                                          kw["end_dim"]),
        aten.permute: lambda a, kw: tg.permute(kw["self"], tuple(kw["dims"])),
        aten.transpose.int: scalar_dims(lambda a, kw: tg.transpose(kw["self"], kw["dim0"],
                                                                   kw["dim1"]),
                                        dims=("dim0", "dim1")),
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
        aten.slice_scatter: lambda a, kw: _slice_scatter(kw["self"], kw["src"], kw["dim"],
                                                         kw["start"], kw["end"], kw["step"]),
        aten.select_scatter: lambda a, kw: _select_scatter(kw["self"], kw["src"], kw["dim"],
                                                           kw["index"]),
        **dict.fromkeys((aten.cat, aten.concat, aten.concatenate),
                        lambda a, kw: _cat(list(kw["tensors"]), kw["dim"])),
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
        aten.repeat_interleave.self_int: lambda a, kw: _repeat_interleave(
            kw["self"], kw["repeats"], kw["dim"]),
        aten.unflatten.int: lambda a, kw: _unflatten(kw["self"], kw["dim"], kw["sizes"]),
        aten.broadcast_to: lambda a, kw: tg.expand(kw["self"], tuple(kw["size"])),
        aten.as_strided: _as_strided_fn,
        aten.as_strided_copy: _as_strided_fn,
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
        aten.detach: _detach,
        aten.detach_: _detach,
        aten.lift_fresh_copy: unary(same),
        aten._assert_tensor_metadata: lambda a, kw: None,
        aten._to_copy: lambda a, kw: cast(kw["self"], kw["dtype"]),
        aten.to.dtype: lambda a, kw: cast(kw["self"], kw["dtype"]),
        aten.to.dtype_layout: lambda a, kw: cast(kw["self"], kw["dtype"]),
        aten.to.device: lambda a, kw: cast(kw["self"], kw["dtype"]),
        aten.type_as: lambda a, kw: tg.cast(kw["self"], kw["other"].dtype),
        aten.copy: lambda a, kw: _copy(kw["self"], kw["src"]),
        aten.fill.Tensor: lambda a, kw: _copy(kw["self"], kw["value"]),
        aten.fill.Scalar: lambda a, kw: _copy(kw["self"], tg.constant(kw["value"],
                                                                      kw["self"].dtype)),
        # sizes
        aten.sym_size.int: lambda a, kw: kw["self"].shape[kw["dim"]],
        aten.sym_numel: lambda a, kw: math.prod(kw["self"].shape),
        # a tensor's value read as a Python number
        aten._local_scalar_dense: _read_value,
        aten.item: _read_value,
    }),
        **_size_ops(aten),
        # picking an output of a multi-output op, Unavailable ones too (a use raises)
        operator.getitem: lambda a, kw: a[0][a[1]],
    }
