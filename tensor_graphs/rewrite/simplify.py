"""Simplification: rule tables that make a graph smaller without changing what it computes,
and ``simplify``, which applies them all to a fixed point.

    pm_movement   identity reshape/permute/expand/slice/pad/concat/reduce, and chains of them
    pm_cast       identity casts; cast chains whose inner cast is lossless
    pm_algebra    0/1 algebra, double negation, x - x on ints, where with equal branches; an
                  attention's explicit scale equal to its default, 1/sqrt(head dim), -> None
    pm_fold       constant folding: a node whose inputs are all constants becomes a constant
    pm_marks      stop_gradient(x) -> x (a mark for tg.grad, which ran before)
    pm_simplify = pm_movement + pm_cast + pm_algebra + pm_fold + pm_marks

CSE needs no rule: nodes are hash-consed, so rebuilding a rewritten graph reuses every node
that already exists and two expressions that become equal become one node. Dead-node
elimination needs none either: a graph is what its outputs reach, so a node no output reaches
after a rewrite is gone. State updates are outputs and no rule matches ``state_update``, so
they are never dropped or merged.

Semantic choices (also in docs/ARCHITECTURE.md, "Rewriting: simplification"):

- **Sign of zero.** +0.0 and -0.0 count as one value (they compare equal; among our ops only
  ``reciprocal`` and ``pow`` with a negative exponent tell them apart, by the sign of an
  infinite result). So ``x + 0 -> x`` and ``sum over size-1 axes -> x`` fold for floats too,
  although IEEE gives ``-0.0 + 0.0 = +0.0`` and numpy's sum of ``[-0.0]`` is ``+0.0``.
  ``x + (-0.0)``, ``x * 1`` and everything else here are bit-exact.
- **An attention's scale within 2 ulps of 1/sqrt(d) becomes the default** (``d ** -0.5`` is
  one ulp off for d = 32, 128): scores change by 1e-16 relative, not bit-exact in float64.
- **x * 0 -> 0 only for int and bool dtypes.** For floats ``nan * 0`` and ``inf * 0`` are nan
  and ``-1 * 0`` is -0.0, so a float product with zero is kept.
- **x - x -> 0 only for ints** (``x + -x``): ``inf - inf`` is nan.
- **reciprocal(reciprocal(x)) is not folded.** ``1/(1/x)`` is not ``x`` in binary floating
  point: float32 gives 6.9999995 for 7, float64 gives 49.00000000000001 for 49, and a
  subnormal x gives ``1/inf = 0``. Constant folding still evaluates it for constants.
- **Gradient marks are dropped.** ``stop_gradient(x)`` is x: what it marks is for
  ``tg.grad``, which built its graphs before anything is compiled, so a training step plans
  as if the mark were never there (no fusion or recomposition stops at one). Simplify a graph
  after taking its gradient, not before.
- **Constant folding** evaluates the node with the float64 reference (``tg.evaluate(...,
  dtype="float64")``) and keeps the value exactly, as the builder keeps Python floats: in the
  node's own dtype when the value fits it exactly, otherwise in float64 storage under the
  node's dtype. A float64 evaluation of the folded graph therefore equals that of the original;
  a run in the graph's own dtypes rounds a folded value once instead of after each op.
- **Folding never creates much more data than it consumes:** a node is folded only when its
  result has at most ``max(FOLD_MIN_ELEMENTS, elements of its constant inputs)`` elements, so
  an ``iota`` or ``expand`` of a large size stays an op (and so does everything computed from
  it). Never folded: nodes with a symbolic shape or attribute (they depend on a dim), nodes
  that depend on an input, weight, state or dim leaf, ``copy_to`` (a placement) and
  ``state_update``; an evaluation that fails (an index out of range) leaves the node as it is.

Simplify does not canonicalize: run ``tg.canonicalize`` first (or after) so that ``a + b`` and
``b + a`` are one node too. Rules see atomic ops; composites are folded when their inputs are
constants, otherwise left alone (``tg.decompose`` first to simplify inside them).
"""

from __future__ import annotations

import math

import numpy as np
import sympy

from tensor_graphs.errors import TensorGraphsError
from tensor_graphs.ir import builder, dtypes
from tensor_graphs.ir.dtypes import DType
from tensor_graphs.ir.evaluate import evaluate
from tensor_graphs.ir.graph import _as_list, nodes
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import (
    CONSTANT,
    COPY_TO,
    EXPAND,
    RESHAPE,
    SCALED_DOT_PRODUCT_ATTENTION,
    STATE_UPDATE,
)
from tensor_graphs.ir.shapes import dims_equal
from tensor_graphs.rewrite import pattern as pat

FOLD_MIN_ELEMENTS = 256  # a folded constant may always have this many elements
NEVER_FOLD = frozenset({COPY_TO, STATE_UPDATE})

# Every value of the key dtype is exactly representable in each dtype of its set.
LOSSLESS: dict[str, frozenset[str]] = {
    "bool": frozenset(d.name for d in dtypes.ALL),
    "uint8": frozenset({"int32", "int64", "float16", "bfloat16", "float32", "float64"}),
    "int8": frozenset({"int32", "int64", "float16", "bfloat16", "float32", "float64"}),
    "int32": frozenset({"int64", "float64"}),
    "int64": frozenset(),
    "float16": frozenset({"float32", "float64"}),
    "bfloat16": frozenset({"float32", "float64"}),
    "float32": frozenset({"float64"}),
    "float64": frozenset(),
}


def lossless(src: DType, dst: DType) -> bool:
    """True when casting ``src`` to ``dst`` keeps every value exactly (and back recovers it)."""
    return src == dst or dst.name in LOSSLESS[src.name]


# ---------------------------------------------------------------------------- helpers
def _splat(node: Node):
    """The single value of a constant whose elements are all equal, seen through reshape and
    expand (as ``_zeros`` builds them); None for anything else."""
    while node.op.name in (RESHAPE, EXPAND):
        node = node.inputs[0]
    if node.op.name != CONSTANT:
        return None
    arr = node.attrs["value"].array
    if arr.size == 0:
        return None
    first = arr.flat[0]
    if not np.all(arr == first):  # a nan anywhere makes this False: no splat
        return None
    return first.item()


def _is_zero(node: Node) -> bool:
    value = _splat(node)
    return value is not None and value == 0  # +0.0 and -0.0 (and False)


def _is_one(node: Node) -> bool:
    value = _splat(node)
    return value is not None and value == 1  # 1, 1.0 and True


def _broadcast(x: Node, like: Node) -> Node:
    """``x`` broadcast to the shape of ``like`` (x's shape broadcasts to it)."""
    if x.ndim == like.ndim and all(dims_equal(a, b) for a, b in zip(x.shape, like.shape)):
        return x
    if x.ndim < like.ndim:
        x = builder.reshape(x, (1,) * (like.ndim - x.ndim) + x.shape)
    return builder.expand(x, like.shape)


def _zeros(like: Node) -> Node:
    """Zeros of the shape and dtype of ``like`` (a broadcast scalar; folding makes small ones
    full constants)."""
    return _broadcast(builder.constant(0, like.dtype), like)


def _is_identity(perm) -> bool:
    return tuple(perm) == tuple(range(len(perm)))


def _compose(inner, outer) -> tuple[int, ...]:
    """permute(permute(x, inner), outer) == permute(x, _compose(inner, outer))."""
    return tuple(inner[i] for i in outer)


def _all_zero(values) -> bool:
    return all(isinstance(v, int) and v == 0 for v in values)


def _all_one(values) -> bool:
    return all(isinstance(v, int) and v == 1 for v in values)


def _no_pads(pads) -> bool:
    return all(_all_zero(p) for p in pads)


def _reduce_size_one(x: Node, r: Node) -> Node | None:
    """A sum/max over axes that all have size 1 is a reshape (or nothing)."""
    if all(isinstance(x.shape[a], int) and x.shape[a] == 1 for a in r.attrs["axes"]):
        return builder.reshape(x, r.shape)
    return None


def _symbolic(value) -> bool:
    if isinstance(value, sympy.Basic):
        return True
    if isinstance(value, tuple):
        return any(_symbolic(v) for v in value)
    return False


def foldable(node: Node) -> bool:
    """True when constant folding may replace ``node``: an op (not a leaf) whose inputs are all
    constants, static, not a placement or a state update, and not much bigger than its inputs."""
    if node.op.is_leaf or node.op.name in NEVER_FOLD:
        return False
    inputs = node.inputs
    for i in inputs:
        if i.op.name != CONSTANT:
            return False
    if not all(isinstance(d, int) for d in node.shape):
        return False
    if any(_symbolic(v) for v in node.attrs.values()):
        return False
    consumed = sum(i.attrs["value"].array.size for i in inputs)
    return math.prod(node.shape) <= max(FOLD_MIN_ELEMENTS, consumed)


def as_constant(value: np.ndarray, dtype: DType) -> Node:
    """A constant node of ``dtype`` holding ``value`` exactly (narrow storage when it fits)."""
    value = np.asarray(value)
    if dtype.is_float and dtype != dtypes.float64:
        with np.errstate(over="ignore", invalid="ignore"):
            narrow = value.astype(dtype.np_dtype)
        if np.array_equal(narrow.astype(np.float64), value, equal_nan=True):
            value = narrow
    return builder.constant(value, dtype)


def fold(x: Node) -> Node | None:
    """The constant that ``x`` computes (float64 reference semantics), or None if it fails."""
    try:
        value = evaluate(x, {}, dtype="float64")
    except TensorGraphsError:
        return None  # e.g. a gather index out of range: leave it for run time to report
    return as_constant(value, x.dtype)


# ---------------------------------------------------------------------------- rule tables
# A rule whose replacement is ``x`` itself (reshape(x) -> x) relies on Rule.rewrite, which
# declines any replacement of another shape or dtype: it fires only where it is an identity.
x, y, c = pat.var("x"), pat.var("y"), pat.var("c")
ix = pat.var("x", dtype="int")
ibx = pat.var("x", dtype=("int", "bool"))
bx = pat.var("x", dtype="bool")
zero = pat.var("zero", where=_is_zero)
one = pat.var("one", where=_is_one)

pm_movement = pat.RuleTable("movement", [
    # reshape(x) to x's own shape -> x
    pat.rule(pat.reshape(x), lambda x: x),
    # reshape(reshape(x)) -> reshape(x)
    pat.rule(pat.reshape(pat.reshape(x)).bind("r"), lambda x, r: builder.reshape(x, r.shape)),
    # permute(x) by the identity permutation -> x
    pat.rule(pat.permute(x, perm=_is_identity), lambda x: x),
    # permute(permute(x, p), q) -> permute(x, p[q]); x when they cancel
    pat.rule(pat.permute(pat.permute(x).bind("p")).bind("q"),
             lambda x, p, q: builder.permute(x, _compose(p.attrs["perm"], q.attrs["perm"]))),
    # expand(x) to x's own shape -> x
    pat.rule(pat.expand(x), lambda x: x),
    # expand(expand(x)) -> expand(x)
    pat.rule(pat.expand(pat.expand(x)).bind("e"), lambda x, e: builder.expand(x, e.shape)),
    # slice(x) from 0 to the end with step 1 on every axis -> x
    pat.rule(pat.slice(x, starts=_all_zero, steps=_all_one), lambda x: x),
    # pad(x) by zero on every side -> x
    pat.rule(pat.pad(x, pads=_no_pads), lambda x: x),
    # concat([x]) -> x
    pat.rule(pat.concat(x), lambda x: x),
    # sum(x) over no axes or size-1 axes only -> reshape(x)  (sign of zero: see the docstring)
    pat.rule(pat.op("sum", x).bind("r"), _reduce_size_one),
    # max(x) over no axes or size-1 axes only -> reshape(x)
    pat.rule(pat.op("max", x).bind("r"), _reduce_size_one),
])

pm_cast = pat.RuleTable("cast", [
    # cast(x) to x's own dtype -> x
    pat.rule(pat.cast(x), lambda x: x),
    # cast(cast(x, a), b) -> cast(x, b) when x's dtype -> a is lossless
    pat.rule(pat.cast(pat.cast(x).bind("a")).bind("b"),
             lambda x, a, b: builder.cast(x, b.dtype) if lossless(x.dtype, a.dtype) else None),
])

def _default_scale(n: Node) -> bool:
    """An attention whose explicit scale is its default 1/sqrt(d) to within 2 ulps: GPT-2
    passes 1/sqrt(64) = 0.125, transformers' BERT and Qwen ``d ** -0.5``, one ulp off
    1/sqrt(d) for d = 32 and 128 (a relative change of 1e-16 in the scores, below float64's
    own rounding of the softmax; both round to the same float32). Kernels that match
    ``scale=None`` only, such as the heads-last C attention, can then take it."""
    if n.op.name != SCALED_DOT_PRODUCT_ATTENTION or n.attrs.get("scale") is None:
        return False
    d = n.inputs[0].shape[-1]
    if not (isinstance(d, int) and d > 0):
        return False
    default = 1.0 / math.sqrt(d)
    return abs(float(n.attrs["scale"]) - default) <= 2 * math.ulp(default)


pm_algebra = pat.RuleTable("algebra", [
    # x * 1 -> x  (also True & x on bool)
    pat.rule((x * one).bind("r"), lambda x, r, one: _broadcast(x, r)),
    # x + 0 -> x  (either sign of zero; also False | x on bool)
    pat.rule((x + zero).bind("r"), lambda x, r, zero: _broadcast(x, r)),
    # x * 0 -> 0 for int and bool x only (float: nan*0, inf*0 are nan; -1*0 is -0.0)
    pat.rule((ibx * zero).bind("r"), lambda x, r, zero: _zeros(r)),
    # x + -x -> 0 for int x only (x - x; float: inf - inf is nan)
    pat.rule((ix + pat.neg(ix)).bind("r"), lambda x, r: _zeros(r)),
    # --x -> x
    pat.rule(pat.neg(pat.neg(x)), lambda x: x),
    # maximum(x, x) -> x
    pat.rule(pat.maximum(x, x), lambda x: x),
    # x | x -> x on bool (add of bools)
    pat.rule(bx + bx, lambda x: x),
    # x & x -> x on bool (mul of bools)
    pat.rule(bx * bx, lambda x: x),
    # pow(x, 1) -> x
    pat.rule(pat.pow(x, one), lambda x, one: x),
    # where(c, x, x) -> x
    pat.rule(pat.where(c, x, x).bind("r"), lambda c, x, r: _broadcast(x, r)),
    # where(true, x, y) -> x
    pat.rule(pat.where(one, x, y).bind("r"), lambda one, x, y, r: _broadcast(x, r)),
    # where(false, x, y) -> y
    pat.rule(pat.where(zero, x, y).bind("r"), lambda zero, x, y, r: _broadcast(y, r)),
    # scaled_dot_product_attention(..., scale=1/sqrt(d)) -> its default, scale=None
    pat.rule(pat.var("a", where=_default_scale),
             lambda a: Node.make(a.op, a.inputs, {**a.attrs, "scale": None})),
])

pm_fold = pat.RuleTable("fold", [
    # op(constants...) -> the constant it computes  (small results only; see FOLD_MIN_ELEMENTS)
    pat.rule(pat.var("x", where=foldable), fold),
])

pm_marks = pat.RuleTable("marks", [
    # stop_gradient(x) -> x  (the gradient it stops was taken before compiling)
    pat.rule(pat.stop_gradient(x), lambda x: x),
])

pm_simplify = pm_movement + pm_cast + pm_algebra + pm_fold + pm_marks


def simplify(outputs, table: pat.RuleTable = pm_simplify, max_steps: int | None = None):
    """The graph simplified to a fixed point: identity and chained movement ops, cast chains,
    0/1 algebra and constant folding (``table``, by default ``pm_simplify``); CSE and dead-node
    elimination come with rebuilding. Returns the structure it was given (a node or a list).
    Raises ``RewriteError`` after ``max_steps`` rewrites (default: 10,000 + 10 per node)."""
    if max_steps is None:
        max_steps = 10_000 + 10 * len(nodes(_as_list(outputs)))
    return pat.apply(outputs, table, max_steps=max_steps)


__all__ = ["simplify", "pm_movement", "pm_cast", "pm_algebra", "pm_fold", "pm_marks",
           "pm_simplify", "foldable", "fold", "lossless", "FOLD_MIN_ELEMENTS"]
