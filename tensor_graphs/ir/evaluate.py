"""The reference interpreter: the semantic oracle every kernel and rewrite is checked against.

It validates all feeds before computing anything, expands composites into atomic ops, runs
each atomic op's numpy reference in topological order and frees every value after its last use
(like JAX's eval_jaxpr). float16/bfloat16 ops compute in float32 and round once per op;
``dtype="float64"`` lifts every float leaf and computation to float64 (int leaves stay int).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping

import numpy as np
import sympy

from tensor_graphs.errors import (
    DTypeError,
    EvaluationError,
    FeedError,
    ShapeError,
    TensorGraphsError,
)
from tensor_graphs.ir import dtypes
from tensor_graphs.ir.graph import _as_list, decompose, leaves, nodes, specialize_map
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import CONSTANT, DIM
from tensor_graphs.ir.shapes import format_shape, resolve

_LOW = (dtypes.float16.np_dtype, dtypes.bfloat16.np_dtype)


def evaluate(outputs, feeds: Mapping[str, object], dtype=None):
    """Evaluate ``outputs`` (a node or a list of nodes) on numpy ``feeds`` keyed by leaf name."""
    single = isinstance(outputs, Node)
    outs = _as_list(outputs)
    if dtype is not None and dtypes.as_dtype(dtype) != dtypes.float64:
        raise DTypeError(f"evaluate: dtype must be None or 'float64', got {dtype!r}")
    lift = dtype is not None
    arrays, dims = bind_feeds(leaves(outs), feeds, lift)
    if 0 in dims.values():  # composites decompose by their static sizes (an empty axis)
        outs = _specialized(outs, dims)
    results = _run(decompose(outs), arrays, dims, lift)
    return results[0] if single else results


def _specialized(outs: list[Node], dims) -> list[Node]:
    """The graph with its dims bound, where one is 0: a composite's decomposition may depend
    on a static size, and 0 is where they do (softmax over an empty axis is the empty result,
    as torch's, without the max that has no value there), as in a call a program without
    bounds specializes. Only then: rebuilding every node costs time on every evaluation."""
    mapped = specialize_map(outs, dims)
    return [mapped[o] for o in outs]


def storage_dtype(node: Node, lift: bool) -> np.dtype:
    return np.dtype(np.float64) if lift and node.dtype.is_float else node.dtype.np_dtype


def _feed_kind_ok(leaf: Node, given: np.dtype) -> bool:
    ours = dtypes.from_numpy(given)  # ours, or another numpy float/int (float128, int16, ...)
    kind = ours.kind if ours is not None else {"f": "float", "i": "int", "u": "int"}.get(
        given.kind)
    return kind == leaf.dtype.kind


def check_int_range(name: str, leaf: Node, array: np.ndarray) -> None:
    """Raise DTypeError where an int feed holds a value its leaf's dtype cannot: the cast that
    stores it (int64 ids for an int32 input, -1 for a uint8 one) would wrap it without a word,
    2**32 + 1 read as 1, a wrong answer instead of an error. Read only where the feed's dtype
    reaches past the leaf's (a min and a max per call)."""
    want = leaf.dtype.np_dtype
    if not leaf.dtype.is_int or array.size == 0 or np.can_cast(array.dtype, want, "safe"):
        return
    info, lo, hi = np.iinfo(want), int(array.min()), int(array.max())
    if info.min <= lo and hi <= info.max:
        return
    raise DTypeError(f"feed '{name}': {leaf.op.name} '{name}' is {leaf.dtype.name}, whose "
                     f"values lie in [{info.min}, {info.max}], but the {array.dtype} values "
                     f"given hold {lo if lo < info.min else hi}, which would wrap around; "
                     f"declare the {leaf.op.name} with a wider dtype or give values in range")


def require_feeds(leaf_nodes: Iterable[Node], given: Container[str]) -> None:
    """The one rule of what a feed set must hold, for ``tg.evaluate`` and compiled calls alike
    (the same message either way): every leaf in ``leaf_nodes``, by name."""
    missing = sorted((leaf for leaf in leaf_nodes if leaf.name not in given),
                     key=lambda leaf: leaf.name)
    if missing:
        described = ", ".join(f"{m.name} {format_shape(m.shape)} {m.dtype.name}"
                              for m in missing)
        raise FeedError(f"missing feed(s): {described}; give each an array of that shape and "
                        f"dtype under its name")


def bind_feeds(leaf_nodes: list[Node], feeds: Mapping[str, object], lift: bool):
    """Check every feed (names, kinds, shapes, dims) and return arrays and dim bindings."""
    if not isinstance(feeds, Mapping):
        raise FeedError(f"feeds must be a dict of leaf name to array, got {type(feeds).__name__}")
    by_name = {leaf.name: leaf for leaf in leaf_nodes}
    unknown = sorted(set(feeds) - set(by_name))
    if unknown:
        raise FeedError(f"unknown feed(s) {unknown}; the graph's leaves are "
                        f"{sorted(by_name) or 'none'}")
    require_feeds(leaf_nodes, feeds)
    arrays: dict[str, np.ndarray] = {}
    for name, leaf in by_name.items():
        value = feeds[name]
        try:
            array = np.asarray(value)
        except Exception as exc:  # e.g. a ragged list
            raise DTypeError(f"feed '{name}': cannot read {type(value).__name__} as an array: "
                             f"{exc}") from None
        if not _feed_kind_ok(leaf, array.dtype):
            raise DTypeError(f"feed '{name}': {leaf.op.name} '{name}' expects "
                             f"{leaf.dtype.name} ({leaf.dtype.kind}) data, got {array.dtype} "
                             f"values; convert it explicitly")
        check_int_range(name, leaf, array)
        arrays[name] = array
    dims = _bind_dims(by_name, arrays)
    for name, leaf in by_name.items():
        arrays[name] = arrays[name].astype(storage_dtype(leaf, lift), copy=False)
    return arrays, dims


def _bind_dims(by_name: dict[str, Node], arrays: dict[str, np.ndarray]) -> dict:
    dims: dict[sympy.Symbol, int] = {}
    where: dict[sympy.Symbol, str] = {}
    deferred = []
    def expected(name: str) -> str:  # only built for an error message
        return (f"expected shape {format_shape(by_name[name].shape)}, got "
                f"{format_shape(arrays[name].shape)}")

    for name, leaf in by_name.items():
        shape = arrays[name].shape
        if len(shape) != len(leaf.shape):
            raise ShapeError(f"feed '{name}': {expected(name)} (rank {len(leaf.shape)} vs "
                             f"{len(shape)})")
        for axis, (want, got) in enumerate(zip(leaf.shape, shape)):
            if isinstance(want, int):
                if want != got:
                    raise ShapeError(f"feed '{name}': {expected(name)} (axis {axis}: {want} vs "
                                     f"{got})")
            elif isinstance(want, sympy.Symbol):
                if want in dims and dims[want] != got:
                    raise ShapeError(f"feed '{name}': dim '{want}' is {got} on axis {axis}, but "
                                     f"feed '{where[want]}' bound it to {dims[want]}")
                dims.setdefault(want, got)
                where.setdefault(want, name)
            else:
                deferred.append((name, axis, want, got))
    for name, axis, want, got in deferred:
        value = want.xreplace(dims)
        free = sorted(value.free_symbols, key=str)
        if len(free) == 1:
            solutions = [s for s in sympy.solve(sympy.Eq(value, got), free[0])
                         if s.is_integer and s > 0]
            if solutions:
                dims[free[0]] = int(solutions[0])
                where[free[0]] = name
                value = want.xreplace(dims)
        if not (value.is_Integer and int(value) == got):
            raise ShapeError(f"feed '{name}': {expected(name)} (axis {axis}: {want} = {value} vs "
                             f"{got})")
    return dims


def _leaf_value(node: Node, arrays, dims, lift: bool) -> np.ndarray:
    target = storage_dtype(node, lift)
    kind = node.op.name
    if kind == CONSTANT:
        return node.attrs["value"].array.astype(target)
    if kind == DIM:
        return np.asarray(resolve(node.attrs["expr"], dims)).astype(target)
    return arrays[node.name]


def _resolved_attrs(node: Node, dims, lift: bool) -> dict:
    attrs = {}
    for key, value in node.attrs.items():
        if isinstance(value, (sympy.Basic, tuple)):
            value = resolve(value, dims)
        if lift and isinstance(value, dtypes.DType) and value.is_float:
            value = dtypes.float64
        attrs[key] = value
    return attrs


def _run(outs: list[Node], arrays, dims, lift: bool) -> list[np.ndarray]:
    order = nodes(outs)
    uses: dict[int, int] = {}
    for n in order:
        for i in n.inputs:
            uses[id(i)] = uses.get(id(i), 0) + 1
    keep = {id(o) for o in outs}
    values: dict[int, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for n in order:
            if n.op.is_leaf:
                values[id(n)] = _leaf_value(n, arrays, dims, lift)
                continue
            args = [values[id(i)] for i in n.inputs]
            values[id(n)] = _apply(n, args, dims, lift)
            for i in n.inputs:
                uses[id(i)] -= 1
                if uses[id(i)] == 0 and id(i) not in keep:
                    del values[id(i)]
    fed = {id(a) for a in arrays.values()}  # an output that is a feed must not alias it
    results = []
    for o in outs:
        v = values[id(o)]
        own = v.flags.owndata and v.base is None and id(v) not in fed
        results.append(v if own else v.copy())
    return results


def _apply(n: Node, args: list[np.ndarray], dims, lift: bool) -> np.ndarray:
    if any(a.dtype in _LOW for a in args):
        args = [a.astype(np.float32) if a.dtype in _LOW else a for a in args]
    try:
        out = n.op.reference(args, _resolved_attrs(n, dims, lift))
    except TensorGraphsError as exc:
        raise type(exc)(f"evaluating {n!r}: {exc}") from None
    except (ValueError, IndexError, TypeError, OverflowError) as exc:
        shown = ", ".join(format_shape(a.shape) for a in args)
        raise EvaluationError(f"evaluating {n.op.name} on shapes {shown}: {exc}") from None
    out = np.asarray(out).astype(storage_dtype(n, lift), copy=False)
    want = n.shape if all(isinstance(d, int) for d in n.shape) else resolve(n.shape, dims)
    if out.shape != want:  # e.g. x[:10] on a dim "seq" that turned out to be 5
        bound = ", ".join(f"{k}={v}" for k, v in sorted(dims.items(), key=str))
        raise EvaluationError(
            f"evaluating {n!r}: the result has shape {format_shape(out.shape)}, but the node's "
            f"shape {format_shape(n.shape)} is {format_shape(want)} for {bound or 'no dims'}; "
            "a slice bound or index is past the end of a symbolic dim")
    return out
