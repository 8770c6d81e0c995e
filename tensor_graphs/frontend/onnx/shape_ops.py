"""ONNX's shape and movement ops: Shape, Reshape, Transpose, (Un)Squeeze, Concat, Split,
Slice, Gather, Expand, Tile, Pad, Constant(OfShape), Range. Each folds on static inputs,
symbolic dims included, so shape subgraphs (Shape -> Gather -> Concat -> Reshape) end as
the static or symbolic shape of a reshape, not as run-time values. Attributes that became
inputs between opsets are read from whichever the node's opset has."""

from __future__ import annotations

import math

import numpy as np
import sympy

from tensor_graphs.errors import ShapeError
from tensor_graphs.frontend.onnx.common import (
    FOLD_LIMIT,
    Ctx,
    Static,
    dtype_of,
    fold,
    ints,
    norm_axis,
    product,
    torch_pads,
)
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.shapes import format_shape

_TO_END = 2 ** 62  # ONNX writes "to the end" as INT64_MAX (or INT64_MIN going backwards)


def shape_of(v) -> tuple:
    return tuple(v.shape) if isinstance(v, Node) else v.array.shape


def _dims_array(dims) -> np.ndarray:
    if all(isinstance(d, int) for d in dims):
        return np.asarray(dims, dtype=np.int64).reshape(len(dims))
    out = np.empty(len(dims), dtype=object)
    out[:] = [sympy.sympify(d) for d in dims]
    return out


def _shape(c: Ctx):
    dims = shape_of(c.inputs[0])
    start, end = c.a("start", 0), c.a("end")
    return Static(_dims_array(dims[slice(start, end)]))


def _size(c: Ctx):
    n = 1
    for d in shape_of(c.inputs[0]):
        n = n * d
    return Static(_dims_array([n]).reshape(()))


def _reshape_target(c: Ctx, in_shape: tuple, shape: list) -> list:
    out = list(shape)
    if not c.a("allowzero", 0):
        out = [in_shape[i] if d == 0 else d for i, d in enumerate(out)]
    return out


# sizes at which two spellings of a symbolic dim are compared: consecutive, so a floor of a
# stride up to 32 meets every residue, each symbol offset from the others
_SAMPLES = range(64, 128)


def _same_size(a, b) -> bool:
    """Whether two symbolic sizes agree at every sample of their symbols."""
    diff = sympy.expand(sympy.sympify(a) - sympy.sympify(b))
    if diff == 0:
        return True
    symbols = sorted(diff.free_symbols, key=str)
    return all(diff.subs({s: v + 37 * i for i, s in enumerate(symbols)}) == 0
               for v in _SAMPLES)


def _spelled_as_input(in_shape: tuple, target: list) -> list:
    """``target`` with each symbolic size that makes the element counts differ as written
    spelled as the input's dim it equals: a run of adjacent dims, or a factor of one. The
    dynamo exporter writes a size in torch's own formula (floor((h - 1)/8) + 1 after two
    strided convolutions), equal at every size to ours (floor(floor((h - 1)/4)/2) + 1) but
    not provably so, and reshape refused the counts as different; ONNX Runtime checks them
    per call. A size none equals is kept as written."""
    spelled = {sympy.sympify(d) for d in in_shape}
    if all(isinstance(d, int) or sympy.sympify(d) in spelled for d in target) or \
            sympy.expand(sympy.sympify(product(in_shape)) - product(target)) == 0:
        return target  # as written: the input's own dims, or counts equal as written
    runs = [product(in_shape[i:j]) for i in range(len(in_shape))
            for j in range(i + 1, len(in_shape) + 1)]
    runs += [f for d in in_shape if not isinstance(d, int)
             for f in sympy.Mul.make_args(sympy.sympify(d))]  # a flattened plane's sides
    out = list(target)
    for k, d in enumerate(target):
        if isinstance(d, int) or sympy.sympify(d) in spelled:
            continue
        out[k] = next((r for r in runs if not isinstance(r, int) and _same_size(r, d)), d)
    return out


def _reshape(c: Ctx):
    shape = ints(c.s(1, "shape")) if c.opset >= 5 else list(c.a("shape"))
    target = _reshape_target(c, shape_of(c.inputs[0]), shape)
    target = _spelled_as_input(shape_of(c.inputs[0]), target)
    if isinstance(c.inputs[0], Static) and all(isinstance(d, int) for d in target) \
            and c.inputs[0].array.size <= 4096:
        return Static(c.inputs[0].array.reshape(target))  # symbolic dims stay in it
    return tg.reshape(c.t(0), tuple(target))


def _flatten(c: Ctx):
    x = c.t(0)
    axis = norm_axis(c.a("axis", 1), x.ndim)
    lead = 1
    for d in x.shape[:axis]:
        lead = lead * d
    return tg.reshape(x, (lead, -1) if axis < x.ndim else (lead, 1))


def _transpose(c: Ctx):
    rank = len(shape_of(c.inputs[0]))
    perm = list(c.a("perm", list(range(rank))[::-1]))
    folded = fold(c, lambda a: np.transpose(a, perm))
    return folded if folded is not None else tg.permute(c.t(0), *perm)


def _axes(c: Ctx, since: int) -> list | None:
    if c.opset >= since:
        return ints(c.s(1, "axes")) if c.has(1) else None
    return c.a("axes")


def _squeeze(c: Ctx):
    axes = _axes(c, 13)
    shape = shape_of(c.inputs[0])
    if axes is None:  # every dim of size 1; a symbolic one is taken as not 1, checked per call
        axes = [i for i, d in enumerate(shape) if d == 1]
        for d in shape:
            if isinstance(d, sympy.Symbol):
                c.not_one.setdefault(str(d), f"{c.op} node '{c.name}'")
    axes = sorted(norm_axis(a, len(shape)) for a in axes)
    folded = fold(c, lambda a, *_: np.squeeze(a, tuple(axes)))
    if folded is not None:
        return folded
    return tg.squeeze(c.t(0), tuple(axes)) if axes else c.t(0)


def _unsqueeze(c: Ctx):
    axes = _axes(c, 13)
    rank = len(shape_of(c.inputs[0])) + len(axes)
    axes = sorted(norm_axis(a, rank) for a in axes)
    folded = fold(c, lambda a, *_: np.expand_dims(a, tuple(axes)))
    if folded is not None:
        return folded
    x = c.t(0)
    for a in axes:
        x = tg.unsqueeze(x, a)
    return x


def _concat(c: Ctx):
    """Inputs of one rank joined along ``axis``. Inputs of different ranks are invalid ONNX
    (ONNX Runtime refuses them, an empty 1-D one too), refused naming each input's shape:
    before, only those of the largest rank were joined and the others silently dropped."""
    axis = c.a("axis")
    shapes = [shape_of(v) for v in c.inputs if v is not None]
    if len({len(s) for s in shapes}) > 1:
        shown = ", ".join(f"input {i} {format_shape(tuple(s))} (rank {len(s)})"
                          for i, s in enumerate(shapes))
        raise ShapeError(f"Concat node '{c.name}': its inputs have different ranks ({shown}); "
                         "ONNX joins tensors of one rank (the model is invalid: ONNX Runtime "
                         "refuses it too); reshape or unsqueeze the inputs to one rank where "
                         "the model is made, and export it again")
    folded = fold(c, lambda *xs: np.concatenate([x for x in xs if x is not None], axis=axis))
    if folded is not None:
        return folded
    return tg.concat(c.tensors(), axis)


def _split(c: Ctx):
    x = c.t(0)
    axis = norm_axis(c.a("axis", 0), x.ndim)
    if c.opset >= 13 and c.has(1):
        sizes = ints(c.s(1, "split"))
    elif c.opset < 13 and c.a("split"):
        sizes = list(c.a("split"))
    else:
        n = c.a("num_outputs") or c.outputs
        dim = x.shape[axis]
        if not isinstance(dim, int):
            raise c.refuse(f"an even split of the symbolic axis {axis} ({dim})")
        each = -(-dim // n)
        sizes = [min(each, dim - i * each) for i in range(n)]
    return tuple(tg.split(x, list(sizes), axis))


def _clamped(v, dim, step):
    if isinstance(v, int) and v >= _TO_END:
        return None if step > 0 else v
    if isinstance(v, int) and v <= -_TO_END:
        return None if step < 0 else -_TO_END
    return v


def _slice(c: Ctx):
    rank = len(shape_of(c.inputs[0]))
    if c.opset < 10:
        starts, ends = list(c.a("starts")), list(c.a("ends"))
        axes = list(c.a("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = ints(c.s(1, "starts")), ints(c.s(2, "ends"))
        axes = ints(c.s(3, "axes")) if c.has(3) else list(range(len(starts)))
        steps = ints(c.s(4, "steps")) if c.has(4) else [1] * len(starts)
    per = {}
    shape = shape_of(c.inputs[0])
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = norm_axis(axis, rank)
        dim = shape[axis]
        if isinstance(dim, int) and all(isinstance(v, int) for v in (start, end)):
            start, end = max(min(start, 2 ** 62), -2 ** 62), max(min(end, 2 ** 62), -2 ** 62)
            lo, hi, st = slice(start, end, step).indices(dim)
            if st < 0 and hi < 0:
                hi = None
            per[axis] = (lo, hi, st)
        else:
            per[axis] = (_clamped(start, dim, step), _clamped(end, dim, step), step)
    concrete = all(isinstance(v, (int, type(None))) for bounds in per.values() for v in bounds)
    if isinstance(c.inputs[0], Static) and c.inputs[0].array.size <= 4096 and concrete:
        idx = tuple(slice(*per[a]) if a in per else slice(None) for a in range(rank))
        return Static(c.inputs[0].array[idx])
    x = c.t(0)
    for axis, (lo, hi, st) in per.items():
        x = tg.slice_axis(x, axis, lo, hi, st)
    return x


def _in_range(c: Ctx, idx: np.ndarray, dim, axis: int) -> None:
    """Refuse, naming the node and the index, an import-time index past ``dim`` (ONNX's
    Gather takes [-dim, dim - 1]; ONNX Runtime fails on it): before, numpy's bare IndexError
    named neither the node nor the model."""
    if not isinstance(dim, int) or idx.dtype == object:
        return
    bad = idx[(idx < -dim) | (idx >= dim)]
    if bad.size:
        held = c.inputs[1].weight
        where = f"the initializer '{held}'" if held else "its indices"
        raise ShapeError(f"Gather node '{c.name}': index {int(bad.flat[0])} ({bad.size} of "
                         f"{idx.size} indices in {where}) is out of range for axis {axis} of "
                         f"size {dim} (ONNX's indices are in [{-dim}, {dim - 1}]); the model is "
                         "invalid: check how its indices are made, and export it again")


def _gather(c: Ctx):
    axis = c.a("axis", 0)
    # indices holding symbolic dims (a cache's positions, past_len + Range(seq), as the dynamo
    # exporter writes them) are known only per call: gathered in the graph, never folded
    known = c.is_static(1) and not c.inputs[1].symbolic
    if c.is_static(0) and known and c.inputs[0].array.size <= 4096:
        data = c.inputs[0].array
        _in_range(c, c.inputs[1].array, data.shape[norm_axis(axis, data.ndim)],
                  norm_axis(axis, data.ndim))
        return Static(np.take(data, c.inputs[1].array.astype(np.int64), axis=axis))
    x = c.t(0)
    axis = norm_axis(axis, x.ndim)
    if known:
        idx = c.inputs[1].array.astype(np.int64)
        dim = x.shape[axis]
        if isinstance(dim, int):
            _in_range(c, idx, dim, axis)
            idx = np.where(idx < 0, idx + dim, idx)
            return tg.gather(x, tg.constant(idx), axis)
        if (idx >= 0).all():
            return tg.gather(x, tg.constant(idx), axis)
    idx = c.t(1)
    if idx.dtype.name != "int64":
        idx = tg.cast(idx, "int64")
    size = tg.size(x.shape[axis]) if not isinstance(x.shape[axis], int) else x.shape[axis]
    idx = tg.where(tg.less(idx, 0), tg.add(idx, size), idx)
    return tg.gather(x, idx, axis)


def _broadcast_shape(a: tuple, b: list) -> list:
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + tuple(a)
    b = [1] * (rank - len(b)) + list(b)
    return [x if isinstance(y, int) and y == 1 else y for x, y in zip(a, b)]


def _small(shape) -> bool:
    """Whether a shape is static and small enough to fold into an array at import. Python's
    product, not numpy's: np.prod of [2**32, 2**32] wraps to 0 in int64, and numpy was then
    asked for 2**64 values at import (a bare ValueError naming no node); a large shape goes
    to the graph, where tg.compile's memory plan sizes it."""
    return all(isinstance(d, int) for d in shape) and math.prod(shape) <= FOLD_LIMIT


def _sizes(c: Ctx, shape: list) -> list:
    """A shape input's dims, refused naming the node when one is negative: ONNX sizes are
    >= 0 (ONNX Runtime refuses the model), while our broadcast_to reads -1 as torch's "keep
    this axis", so Expand to (2, -1) gave an answer and ConstantOfShape crashed."""
    bad = [d for d in shape if isinstance(d, int) and d < 0]
    if bad:
        raise ShapeError(f"{c.op} node '{c.name}': its shape {format_shape(tuple(shape))} has "
                         f"the negative size {bad[0]} (ONNX's sizes are >= 0; ONNX Runtime "
                         "refuses it too); the model is invalid: check how its shape is made, "
                         "and export it again")
    return shape


def _expand(c: Ctx):
    target = _broadcast_shape(shape_of(c.inputs[0]), _sizes(c, ints(c.s(1, "shape"))))
    if isinstance(c.inputs[0], Static) and _small(target):
        return Static(np.broadcast_to(c.inputs[0].array, target).copy())
    x = c.t(0)
    return tg.broadcast_to(x, *target)


def _tile(c: Ctx):
    reps = ints(c.s(1, "repeats"))
    return tg.tile(c.t(0), reps=tuple(reps))


def _pad_widths(c: Ctx, x) -> dict:
    """axis -> (before, after): the pads of the node's opset (an attribute before 11, an
    input after, over the ``axes`` input from 18)."""
    if c.opset < 11:
        pads, axes = list(c.a("pads")), list(range(x.ndim))
    else:
        pads = ints(c.s(1, "pads"))
        axes = ints(c.s(3, "axes")) if c.n > 3 and c.has(3) else list(range(x.ndim))
    n = len(axes)
    return {norm_axis(a, x.ndim): (pads[i], pads[i + n]) for i, a in enumerate(axes)}


def _torch_pads(per: dict, rank: int) -> list:
    """Per-axis (before, after) pads in tg.pad's order."""
    both = [per.get(a, (0, 0)) for a in range(rank)]
    return torch_pads([lo for lo, _ in both] + [hi for _, hi in both])


def _pad(c: Ctx):
    mode = c.a("mode", "constant")
    x = c.t(0)
    per = _pad_widths(c, x)
    if mode in ("reflect", "edge", "wrap"):
        return _pad_from_itself(c, x, per, mode)
    if mode != "constant":
        raise c.refuse(f"mode '{mode}' (ONNX's modes are constant, reflect, edge and wrap)")
    flat = _torch_pads(per, x.ndim)
    value = c.a("value", 0.0) if c.opset < 11 else 0
    if c.opset >= 11 and c.has(2) and c.is_static(2):
        value = c.s(2, "constant_value").reshape(-1)[0].item()
    elif c.opset >= 11 and c.has(2):  # a value known at run time: the pad band selected from it
        value = tg.reshape(c.t(2), ())
    if not isinstance(value, Node):
        return tg.pad(x, flat, value)
    inside = tg.pad(tg.broadcast_to(tg.constant(np.array(True)), *x.shape), flat, False)
    return tg.where(inside, tg.pad(x, flat), value)


def _pad_from_itself(c: Ctx, x, per: dict, mode: str):
    """Pad's reflect, edge and wrap modes: negative pads crop first (as ONNX Runtime does:
    the kept part is what is reflected or wrapped), then each padded axis is one gather of
    itself at the source position of every output position (``_pad_source``)."""
    x = tg.pad(x, _torch_pads({a: (min(lo, 0), min(hi, 0)) for a, (lo, hi) in per.items()},
                              x.ndim))
    for axis, (lo, hi) in per.items():
        lo, hi = max(lo, 0), max(hi, 0)
        n = x.shape[axis]
        if mode == "reflect" and isinstance(n, int) and max(lo, hi) >= n:
            raise ShapeError(f"Pad node '{c.name}': mode reflect pads axis {axis} of "
                             f"{format_shape(tuple(x.shape))} by ({lo}, {hi}), but a reflection "
                             f"of {n} elements gives at most {n - 1} (ONNX Runtime refuses it "
                             "too); use mode 'edge' or 'wrap', or smaller pads")
        if lo or hi:
            x = tg.gather(x, _pad_source(n, lo, hi, mode), axis)
    return x


def _pad_source(n, lo: int, hi: int, mode: str) -> Node:
    """Which of an axis' ``n`` elements each of its ``lo + n + hi`` padded positions
    copies: position p (from -lo) clamped for edge, taken modulo n for wrap, and mirrored
    about both ends (period 2(n - 1), the ends not repeated) for reflect. Computed in the
    graph so that a symbolic ``n`` works."""
    size = tg.size(n)
    p = tg.sub(tg.iota(n + lo + hi), lo)
    if mode == "edge":
        return tg.minimum(tg.maximum(p, 0), tg.sub(size, 1))
    if mode == "wrap":
        return tg.remainder(p, size)
    period = tg.mul(tg.sub(size, 1), 2)
    m = tg.remainder(p, period)
    return tg.where(tg.less(m, size), m, tg.sub(period, m))


def _constant(c: Ctx):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in c.attrs:
            v = c.attrs[key]
            if key.startswith("value_int"):
                return Static(np.asarray(v, dtype=np.int64))
            if key.startswith("value_float"):
                return Static(np.asarray(v, dtype=np.float32))
            return Static(v)
    raise c.refuse(f"attribute(s) {sorted(c.attrs)} (sparse or string constants are not mapped)")


def _constant_of_shape(c: Ctx):
    shape = _sizes(c, ints(c.s(0, "shape")))
    value = c.a("value")
    value = np.zeros(1, np.float32) if value is None else value.reshape(-1)
    if _small(shape):
        return Static(np.full(shape, value[0], dtype=value.dtype))
    return tg.broadcast_to(tg.constant(value.reshape(())), *shape)


def _range(c: Ctx):
    """start, start + delta, ... before limit: max(ceil((limit - start) / delta), 0) values.
    Folded at import up to ``FOLD_LIMIT`` values; a longer one is built in the graph (iota *
    delta + start), so nothing of its size is allocated while importing: a program that
    cannot hold it is refused by tg.compile's memory plan (OutOfMemory, before anything
    runs), where a Range of 10**12 values was a numpy MemoryError from the importer. A delta
    of 0 (no length: ONNX Runtime refuses it) is refused naming the node."""
    if not c.all_static():
        raise c.refuse("start, limit and delta computed at run time (the length would be data)")
    start, limit, delta = (c.s(i).reshape(()).item() for i in range(3))
    if isinstance(delta, sympy.Expr) and not delta.is_number:
        raise c.refuse(f"a symbolic delta ({delta}): the length would not be a size")
    if delta == 0:
        raise ShapeError(f"Range node '{c.name}': delta is 0, so start {start} never reaches "
                         f"limit {limit} (ONNX Runtime refuses it too); the model is invalid: "
                         "check how its delta is made, and export it again")
    dtype = c.inputs[0].array.dtype
    if dtype.kind != "O" and all(isinstance(v, (int, float)) for v in (start, limit, delta)):
        if all(isinstance(v, int) for v in (start, limit, delta)):
            n = max(-((start - limit) // delta), 0)  # ceil((limit - start) / delta), exactly
        else:
            n = max(math.ceil((limit - start) / delta), 0)
        if n <= FOLD_LIMIT:
            return Static(np.arange(start, limit, delta, dtype=dtype))
        kind = np.int64 if dtype.kind in "iu" else np.float64
        steps = tg.add(tg.mul(tg.iota(n, kind.__name__), tg.constant(np.array(delta, kind))),
                       tg.constant(np.array(start, kind)))
        return steps if steps.dtype.name == dtype.name else tg.cast(steps, dtype.name)
    start, limit, delta = (sympy.sympify(v) for v in (start, limit, delta))
    if start == 0 and delta == 1:
        return tg.iota(limit, "int64")
    n = sympy.ceiling((limit - start) / delta)
    return tg.add(tg.mul(tg.iota(n, "int64"), int(delta)), tg.size(start))


def _identity(c: Ctx):
    return c.inputs[0]


def _dropout(c: Ctx):
    if c.opset >= 12 and c.has(2) and bool(c.s(2, "training_mode").reshape(-1)[0]):
        raise c.refuse("training_mode=True (dropout is random; import the eval-mode graph)")
    x = c.inputs[0]
    if c.outputs > 1:  # inference keeps every element: the mask is all True
        return x, tg.broadcast_to(tg.constant(np.array(True)), *shape_of(x))
    return x


def _space_depth(to_depth: bool):
    def mapped(c: Ctx):
        x = c.t(0)
        b = c.a("blocksize")
        n, ch, h, w = x.shape
        if to_depth:  # DCR: the block offsets lead the new channels; CRD: they follow
            y = tg.reshape(x, (n, ch, h // b, b, w // b, b))
            perm = (0, 3, 5, 1, 2, 4) if c.a("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
            return tg.reshape(tg.permute(y, *perm), (n, ch * b * b, h // b, w // b))
        if c.a("mode", "DCR") == "DCR":
            y = tg.reshape(x, (n, b, b, ch // (b * b), h, w))
            y = tg.permute(y, 0, 3, 4, 1, 5, 2)
        else:
            y = tg.reshape(x, (n, ch // (b * b), b, b, h, w))
            y = tg.permute(y, 0, 1, 4, 2, 5, 3)
        return tg.reshape(y, (n, ch // (b * b), h * b, w * b))
    return mapped


def _eye_like(c: Ctx):
    x = c.t(0)
    rows, cols = x.shape
    k = c.a("k", 0)
    to = dtype_of(c.a("dtype"), f"EyeLike node '{c.name}'") if c.a("dtype") is not None \
        else x.dtype
    diagonal = tg.equal(tg.add(tg.reshape(tg.iota(rows), (-1, 1)), k),
                        tg.reshape(tg.iota(cols), (1, -1)))
    return tg.cast(diagonal, to)


def _center_crop_pad(c: Ctx):
    """Each axis cropped or zero-padded to its target size around the centre (the odd
    element goes to the end)."""
    x = c.t(0)
    target = ints(c.s(1, "shape"))
    axes = [norm_axis(a, x.ndim) for a in c.a("axes", range(x.ndim))]
    for axis, size in zip(axes, target):
        dim = x.shape[axis]
        if not isinstance(dim, int) or not isinstance(size, int):
            raise c.refuse(f"symbolic sizes on axis {axis} ({dim} to {size})")
        if size < dim:
            x = tg.slice_axis(x, axis, (dim - size) // 2, (dim - size) // 2 + size)
        elif size > dim:
            before = (size - dim) // 2
            flat = [0, 0] * (x.ndim - 1 - axis) + [before, size - dim - before]
            x = tg.pad(x, flat)
    return x


def table() -> dict:
    return {
        "Shape": _shape, "Size": _size, "Reshape": _reshape, "Flatten": _flatten,
        "Transpose": _transpose, "Squeeze": _squeeze, "Unsqueeze": _unsqueeze,
        "Concat": _concat, "Split": _split, "Slice": _slice, "Gather": _gather,
        "Expand": _expand, "Tile": _tile, "Pad": _pad, "Constant": _constant,
        "ConstantOfShape": _constant_of_shape, "Range": _range, "Identity": _identity,
        "Dropout": _dropout, "SpaceToDepth": _space_depth(True),
        "DepthToSpace": _space_depth(False), "EyeLike": _eye_like,
        "CenterCropPad": _center_crop_pad,
    }


__all__ = ["table", "dtype_of"]
