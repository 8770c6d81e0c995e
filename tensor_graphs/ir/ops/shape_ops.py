"""Shape composites and helpers: triu/tril, tile, split/chunk/stack.

triu/tril and tile are composite ops (an iota mask with a where; reshape + expand + reshape).
split, chunk and stack are plain builder functions, not ops: they return tuples of slices or
one concat of the atomic movement ops, following torch's semantics (with numpy's ``axis=``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import sympy

from tensor_graphs.errors import ShapeError
from tensor_graphs.ir import builder as tg
from tensor_graphs.ir.composite import composite
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.shapes import as_dim, dims_equal, format_shape, normalize_axis

__all__ = ["triu", "tril", "tile", "split", "chunk", "stack"]


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _x():
    return (tg.input("x", (3, 4)),)


def _band(x, diagonal, op: str, upper: bool):
    if x.ndim < 2:
        raise ShapeError(f"{op}: expected a tensor with at least 2 dims (the matrix is the last "
                         f"two), got {format_shape(x.shape)}")
    if not _is_int(diagonal):
        raise ShapeError(f"{op}: diagonal must be an int, got {diagonal!r}")
    rows, cols = x.shape[-2:]
    i = tg.reshape(tg.iota(rows), (rows, 1))
    j = tg.reshape(tg.iota(cols), (1, cols))
    i = tg.add(i, int(diagonal)) if diagonal else i
    # triu keeps j >= i + diagonal (drops j < i + d); tril keeps j <= i + d (drops i + d < j)
    drop = tg.less(j, i) if upper else tg.less(i, j)
    return tg.where(drop, tg.constant(0, x.dtype), x)


@composite(example=_x)
def triu(x, *, diagonal=0):
    """The upper triangle of the last two axes: x[..., i, j] where j - i >= diagonal, else 0."""
    return _band(x, diagonal, "triu", upper=True)


@composite(example=_x)
def tril(x, *, diagonal=0):
    """The lower triangle of the last two axes: x[..., i, j] where j - i <= diagonal, else 0."""
    return _band(x, diagonal, "tril", upper=False)


@composite(example=lambda: {"x": tg.input("x", (3, 4)), "reps": (2, 1)})
def tile(x, *, reps):
    """Repeat the whole tensor reps[i] times along axis i (torch.tile / numpy.tile; short reps
    are padded with leading 1s, long ones add leading axes), as reshape + expand + reshape.
    A rep may be a symbolic size (``x.repeat(batch, 1, 1)``: DeBERTa-v2's relative
    embeddings per batch row), since expand and reshape take symbolic dims."""
    if _is_int(reps) or isinstance(reps, sympy.Expr):
        reps = (reps,)
    if not isinstance(reps, tuple) or not all(
            _is_int(r) and r >= 0 or isinstance(r, sympy.Expr) and not r.is_number
            for r in reps):
        raise ShapeError(f"tile: reps must be an int, a size or a tuple of them (ints >= 0), "
                         f"got {reps!r}")
    reps = tuple(as_dim(r) for r in reps)
    if len(reps) < x.ndim:
        reps = (1,) * (x.ndim - len(reps)) + reps
    if len(reps) > x.ndim:
        x = tg.reshape(x, (1,) * (len(reps) - x.ndim) + x.shape)
    split_shape, expanded, final = [], [], []
    for r, d in zip(reps, x.shape):
        if r != 1:
            split_shape.append(1)
            expanded.append(r)
        split_shape.append(d)
        expanded.append(d)
        final.append(as_dim(r * d))
    return tg.reshape(tg.expand(tg.reshape(x, tuple(split_shape)), tuple(expanded)), tuple(final))


# ---------------------------------------------------------------------------- plain helpers
def split(x, split_size_or_sections, axis: int = 0) -> tuple[Node, ...]:
    """torch.split: pieces of ``split_size`` along ``axis`` (the last one may be smaller), or
    pieces of the given sizes, which must add up to the axis size. Returns a tuple of slices."""
    x = tg.as_node(x)
    axis = normalize_axis(axis, x.ndim, "split")
    dim = x.shape[axis]
    if _is_int(split_size_or_sections):
        size = int(split_size_or_sections)
        if not isinstance(dim, int):
            raise ShapeError(f"split: axis {axis} of {format_shape(x.shape)} is symbolic, so the "
                             f"number of pieces of size {size} is unknown; give the sizes "
                             "as a list")
        if size < 0 or (size == 0 and dim > 0):
            raise ShapeError(f"split: split_size must be positive, got {size}")
        sizes = [size] * (dim // size) + ([dim % size] if dim % size else []) if dim else [0]
    elif isinstance(split_size_or_sections, (list, tuple)):
        sizes = [as_dim(s) for s in split_size_or_sections]
        total = sum(sizes[1:], sizes[0]) if sizes else 0
        if not sizes or not dims_equal(total, dim):
            raise ShapeError(f"split: sizes {tuple(split_size_or_sections)} add up to {total}, "
                             f"but axis {axis} of {format_shape(x.shape)} has size {dim}")
    else:
        raise ShapeError(f"split: expected an int or a list of sizes, got "
                         f"{split_size_or_sections!r}")
    pieces, start = [], 0
    for s in sizes:
        stop = as_dim(start + s)
        pieces.append(tg.slice_axis(x, axis, start, stop))
        start = stop
    return tuple(pieces)


def chunk(x, chunks: int, axis: int = 0) -> tuple[Node, ...]:
    """torch.chunk: split into pieces of size ceil(n / chunks), so there may be fewer than
    ``chunks`` pieces. A symbolic axis must be an exact multiple (``2*seq`` in 2 chunks)."""
    x = tg.as_node(x)
    if not _is_int(chunks) or chunks < 1:
        raise ShapeError(f"chunk: chunks must be a positive int, got {chunks!r}")
    axis = normalize_axis(axis, x.ndim, "chunk")
    dim = x.shape[axis]
    if isinstance(dim, int):
        if dim == 0:
            return (x,) * chunks
        return split(x, -(-dim // chunks), axis)
    size = sympy.cancel(sympy.sympify(dim) / chunks)
    if chunks == 1 or size.is_integer:
        return split(x, [size] * chunks, axis)
    raise ShapeError(f"chunk: the symbolic axis {axis} of {format_shape(x.shape)} is not a "
                     f"known multiple of {chunks}; split it with explicit sizes")


def stack(xs: Sequence, axis: int = 0) -> Node:
    """torch.stack: join tensors of one shape along a new axis (unsqueeze + concat)."""
    if isinstance(xs, Node) or not isinstance(xs, (list, tuple)) or not xs:
        raise ShapeError("stack: expected a non-empty list of tensors")
    xs = tg.promote(*xs, op="stack")
    first = xs[0]
    for k, other in enumerate(xs[1:], 1):
        if other.ndim != first.ndim or not all(dims_equal(a, b) for a, b
                                               in zip(first.shape, other.shape)):
            raise ShapeError(f"stack: all tensors need one shape; tensor 0 has "
                             f"{format_shape(first.shape)}, tensor {k} has "
                             f"{format_shape(other.shape)}")
    axis = normalize_axis(axis, first.ndim + 1, "stack")
    return tg.concat([tg.unsqueeze(t, axis) for t in xs], axis=axis)
