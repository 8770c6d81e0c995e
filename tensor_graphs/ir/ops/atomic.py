"""The atomic ops: a small closed set, each with shape/dtype inference and exactly one numpy
reference. Every other op is a composite built from these.

Atomic operands share one dtype (the builder inserts casts). Elementwise ops broadcast like
numpy. References receive attributes with symbolic dims already resolved to ints; the
interpreter handles float16/bfloat16 (computed in float32, rounded once per op).
"""

from __future__ import annotations

import math

import numpy as np

from tensor_graphs.errors import DTypeError, EvaluationError, ShapeError, StateError
from tensor_graphs.ir import dtypes
from tensor_graphs.ir.node import ATOMIC, LEAF, Node, Op
from tensor_graphs.ir.ops import register
from tensor_graphs.ir.shapes import (
    as_shape,
    broadcast_shapes,
    ceil_div,
    dims_equal,
    format_shape,
    is_static,
    numel,
)

_erf = np.frompyfunc(math.erf, 1, 1)


def _shown(nodes) -> str:
    return ", ".join(f"{format_shape(n.shape)} {n.dtype.name}" for n in nodes)


def _same_dtype(op: str, inputs) -> dtypes.DType:
    first = inputs[0].dtype
    for n in inputs[1:]:
        if n.dtype != first:
            raise DTypeError(f"{op}: operands have dtypes {_shown(inputs)}; atomic ops need one "
                             "dtype (use the tg.* builder functions, which promote, or .astype)")
    return first


# ---------------------------------------------------------------------------- leaves
def _leaf_infer(inputs, attrs):
    return attrs["shape"], attrs["dtype"]


for _name, _doc in (
    ("input", "A value fed at every call."),
    ("weight", "A persistent value, bound once (model parameters)."),
    ("state", "A persistent, mutable value (a KV cache); its active length may be a named dim."),
):
    register(Op(_name, LEAF, _doc, infer=_leaf_infer, attr_defaults={"shape": (), "dtype": None}))

register(Op(
    "constant", LEAF, "A numpy value baked into the graph (Python scalars become 0-d constants).",
    infer=lambda inputs, attrs: (attrs["value"].array.shape, attrs["dtype"]),
    attr_defaults={"value": None, "dtype": None}))
register(Op(
    "dim", LEAF, "The value of a size expression (e.g. seq), so a symbolic size can enter "
    "arithmetic such as a mean over a symbolic axis.",
    infer=lambda inputs, attrs: ((), attrs["dtype"]),
    attr_defaults={"expr": None, "dtype": None}))

# ---------------------------------------------------------------------------- elementwise
#  name: (numpy function, dtype kinds accepted, meaning)
UNARY = {
    "neg": (np.negative, ("int", "float"), "-x"),
    "exp": (np.exp, ("float",), "e**x"),
    "log": (np.log, ("float",), "natural logarithm; log(0) = -inf, log(x<0) = nan"),
    "sqrt": (np.sqrt, ("float",), "square root; sqrt(x<0) = nan"),
    "reciprocal": (np.reciprocal, ("float",), "1/x; 1/0 = inf"),
    "sin": (np.sin, ("float",), "sine (radians)"),
    "erf": (lambda x: np.asarray(_erf(x), np.float64).astype(x.dtype), ("float",),
            "the error function"),
}
BINARY = {
    "add": (np.add, ("bool", "int", "float"), "a + b (logical or on bool)"),
    "mul": (np.multiply, ("bool", "int", "float"), "a * b (logical and on bool)"),
    "maximum": (np.maximum, ("bool", "int", "float"), "elementwise max; nan propagates"),
    "pow": (np.power, ("int", "float"), "a ** b"),
    "equal": (np.equal, ("bool", "int", "float"), "a == b, as bool"),
    "less": (np.less, ("bool", "int", "float"), "a < b, as bool"),
}
COMPARISONS = ("equal", "less")


def _check_kind(op: str, node: Node, kinds) -> None:
    if node.dtype.kind not in kinds:
        raise DTypeError(f"{op}: dtype {node.dtype.name} is not accepted (accepts "
                         f"{'/'.join(kinds)} dtypes); cast with .astype first")


def _unary_infer(name, kinds):
    def infer(inputs, attrs):
        _check_kind(name, inputs[0], kinds)
        return inputs[0].shape, inputs[0].dtype
    return infer


def _binary_infer(name, kinds):
    def infer(inputs, attrs):
        dtype = _same_dtype(name, inputs)
        _check_kind(name, inputs[0], kinds)
        shape = broadcast_shapes(*(i.shape for i in inputs), op=name)
        return shape, dtypes.bool_ if name in COMPARISONS else dtype
    return infer


def _bool_add(a, b):
    return np.logical_or(a, b) if a.dtype == np.bool_ else np.add(a, b)


def _bool_mul(a, b):
    return np.logical_and(a, b) if a.dtype == np.bool_ else np.multiply(a, b)


def _pow(a, b):
    if a.dtype.kind in "iu" and np.any(b < 0):
        raise EvaluationError("pow: integers to negative integer powers are undefined")
    return np.power(a, b)


_BINARY_IMPL = {"add": _bool_add, "mul": _bool_mul, "pow": _pow}

for _name, (_fn, _kinds, _doc) in UNARY.items():
    register(Op(_name, ATOMIC, _doc, params=("x",), infer=_unary_infer(_name, _kinds),
                reference=lambda arrays, attrs, fn=_fn: fn(arrays[0])))
for _name, (_fn, _kinds, _doc) in BINARY.items():
    _impl = _BINARY_IMPL.get(_name, _fn)
    register(Op(_name, ATOMIC, _doc, params=("a", "b"), infer=_binary_infer(_name, _kinds),
                reference=lambda arrays, attrs, fn=_impl: fn(arrays[0], arrays[1])))

# ------------------------------------------------------- special functions, integer division
# What no short exact combination of the ops above gives: log(1 + x) is 0 for float32
# x = 1e-10, a - trunc(a / b) * b rounds twice, bits have no arithmetic form for and, and
# rounding half to even took ~40 ops through int64 casts (every quantize has one: a MiniLM
# quantized int8-dynamic had 5x the planner's slots of the float model). Kept
# out of UNARY/BINARY (ELEMENTWISE): C and Triton fusion render only the ops they know; the
# numpy and C kernels compute these (erfc, which gelu decomposes to, is rendered too: see
# ir/algebra.py). Floats are computed in float64 and rounded once.
def _f64(fn):
    def ref(*xs):
        with np.errstate(all="ignore"):
            return np.asarray(fn(*(x.astype(np.float64) for x in xs))).astype(xs[0].dtype)
    return ref


def _int_divisor(op: str, fn):
    """fn as numpy has it; an integer zero divisor is an error, as in torch."""
    def ref(a, b):
        if a.dtype.kind in "iu" and np.any(b == 0):
            raise EvaluationError(f"{op}: integer division by zero (torch raises "
                                  "ZeroDivisionError); divide floats for inf/nan results")
        with np.errstate(all="ignore"):
            return fn(a, b)
    return ref


_erfc = np.frompyfunc(math.erfc, 1, 1)
#  name: (numpy function, dtype kinds accepted, meaning)
SPECIAL_UNARY = {
    "log1p": (_f64(np.log1p), ("float",), "log(1 + x), exact for tiny x; log1p(-1) = -inf"),
    "expm1": (_f64(np.expm1), ("float",), "e**x - 1, exact for tiny x"),
    "log2": (_f64(np.log2), ("float",), "base-2 logarithm (exact at powers of two)"),
    "log10": (_f64(np.log10), ("float",), "base-10 logarithm (exact at powers of ten)"),
    "tan": (_f64(np.tan), ("float",), "tangent (radians); sin / cos would lose its poles"),
    "erfc": (_f64(lambda x: np.asarray(_erfc(x), np.float64)), ("float",),
             "1 - erf(x) without the cancellation (erfc(10) = 2.1e-45)"),
    "round_half_even": (_f64(np.rint), ("float",),
                        "x to the nearest integer, halves to the even one (torch's round, "
                        "numpy's rint); -0.0, inf and nan kept"),
}
SPECIAL_BINARY = {
    "atan2": (_f64(np.arctan2), ("float",),
              "the angle of the point (b, a) in [-pi, pi]: atan(a / b) in the right quadrant"),
    "fmod": (_int_divisor("fmod", np.fmod), ("int", "float"),
             "C's remainder a - trunc(a / b) * b, exact, with the sign of a"),
    "floor_divide": (_int_divisor("floor_divide", np.floor_divide), ("int", "float"),
                     "floor(a / b), Python's rule: exact for ints; floats (a - fmod(a, b)) / b "
                     "rounded to an integer, a / b when b = 0"),
    "bitwise_and": (np.bitwise_and, ("int",), "a & b, bit by bit (two's complement)"),
}
for _name, (_fn, _kinds, _doc) in SPECIAL_UNARY.items():
    register(Op(_name, ATOMIC, _doc, params=("x",), infer=_unary_infer(_name, _kinds),
                reference=lambda arrays, attrs, fn=_fn: fn(arrays[0])))
for _name, (_fn, _kinds, _doc) in SPECIAL_BINARY.items():
    register(Op(_name, ATOMIC, _doc, params=("a", "b"), infer=_binary_infer(_name, _kinds),
                reference=lambda arrays, attrs, fn=_fn: fn(arrays[0], arrays[1])))



def _where_infer(inputs, attrs):
    cond, a, b = inputs
    if not cond.dtype.is_bool:
        raise DTypeError(f"where: the condition must be bool, got {cond.dtype.name}")
    dtype = _same_dtype("where", (a, b))
    return broadcast_shapes(cond.shape, a.shape, b.shape, op="where"), dtype


register(Op("where", ATOMIC, "cond ? a : b, elementwise with broadcasting",
            params=("cond", "a", "b"), infer=_where_infer,
            reference=lambda arrays, attrs: np.where(*arrays)))


def _cast_ref(arrays, attrs):
    x, target = arrays[0], attrs["dtype"].np_dtype
    if target.kind in "iu" and x.dtype.kind == "f":
        x = np.trunc(x)  # float -> int truncates toward zero, as in C and torch
    if target.kind == "b":
        return x != 0  # nonzero (nan included) is True, as in numpy and torch
    return x.astype(target)


register(Op("cast", ATOMIC, "convert to another dtype (float to int truncates toward zero; "
            "nonzero to bool is True)",
            params=("x",), attr_defaults={"dtype": None},
            infer=lambda inputs, attrs: (inputs[0].shape, attrs["dtype"]), reference=_cast_ref))


# ---------------------------------------------------------------------------- reductions
def _reduce_infer(name):
    def infer(inputs, attrs):
        (x,) = inputs
        if name == "sum" and x.dtype.is_bool:
            raise DTypeError("sum: cast bool to an int dtype first (tg.sum does this)")
        axes, keep = attrs["axes"], attrs["keepdims"]
        if any(a >= x.ndim for a in axes):
            raise ShapeError(f"{name}: axes {axes} out of range for shape {format_shape(x.shape)}")
        if name == "max" and any(x.shape[a] == 0 for a in axes):
            raise ShapeError(f"max: cannot reduce the empty axis of shape {format_shape(x.shape)}")
        shape = tuple((1 if keep else None) if i in axes else d for i, d in enumerate(x.shape))
        return tuple(d for d in shape if d is not None), x.dtype
    return infer


_REDUCE_ATTRS = {"axes": (), "keepdims": False}
register(Op("sum", ATOMIC, "sum over the given axes, keepdims optional", params=("x",),
            attr_defaults=_REDUCE_ATTRS, infer=_reduce_infer("sum"),
            reference=lambda a, attrs: np.sum(a[0], axis=attrs["axes"],
                                              keepdims=attrs["keepdims"], dtype=a[0].dtype)))
register(Op("max", ATOMIC, "maximum over the given axes, keepdims optional; nan propagates",
            params=("x",), attr_defaults=_REDUCE_ATTRS, infer=_reduce_infer("max"),
            reference=lambda a, attrs: np.max(a[0], axis=attrs["axes"],
                                              keepdims=attrs["keepdims"])))


# ---------------------------------------------------------------------------- movement
def _reshape_infer(inputs, attrs):
    (x,), shape = inputs, attrs["shape"]
    if not dims_equal(numel(x.shape), numel(shape)):
        raise ShapeError(f"reshape: cannot reshape {format_shape(x.shape)} "
                         f"({numel(x.shape)} elements) to {format_shape(shape)} "
                         f"({numel(shape)} elements)")
    return shape, x.dtype


def _permute_infer(inputs, attrs):
    (x,), perm = inputs, attrs["perm"]
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"permute: {perm} is not a permutation of the axes of "
                         f"{format_shape(x.shape)}")
    return tuple(x.shape[p] for p in perm), x.dtype


def _expand_infer(inputs, attrs):
    (x,), shape = inputs, attrs["shape"]
    if len(shape) != x.ndim:
        raise ShapeError(f"expand: target {format_shape(shape)} must have the rank of "
                         f"{format_shape(x.shape)}")
    for axis, (d, t) in enumerate(zip(x.shape, shape)):
        if not (d == 1 or dims_equal(d, t)):
            raise ShapeError(f"expand: cannot expand {format_shape(x.shape)} to "
                             f"{format_shape(shape)}: axis {axis} has size {d}, not 1 or {t}")
    return shape, x.dtype


def slice_length(start, stop, step):
    if all(isinstance(v, int) for v in (start, stop)):
        return len(range(start, stop, step))
    return ceil_div(stop - start, step) if step > 0 else ceil_div(start - stop, -step)


def _slice_infer(inputs, attrs):
    (x,) = inputs
    starts, stops, steps = attrs["starts"], attrs["stops"], attrs["steps"]
    if not len(starts) == len(stops) == len(steps) == x.ndim:
        raise ShapeError(f"slice: need one (start, stop, step) per axis of "
                         f"{format_shape(x.shape)}")
    if any(s == 0 for s in steps):
        raise ShapeError("slice: step must not be 0")
    return tuple(slice_length(*t) for t in zip(starts, stops, steps)), x.dtype


def _slice_ref(arrays, attrs):
    # bounds come from slice.indices: with a negative step, -1 means "before index 0"
    index = tuple(slice(0, 0) if a < 0 else slice(a, None if c < 0 else c, s)
                  for a, c, s in zip(attrs["starts"], attrs["stops"], attrs["steps"]))
    return arrays[0][index]


def _pad_infer(inputs, attrs):
    (x,), pads = inputs, attrs["pads"]
    if len(pads) != x.ndim or any(len(p) != 2 for p in pads):
        raise ShapeError(f"pad: need one (before, after) pair per axis of {format_shape(x.shape)}")
    if any(isinstance(v, int) and v < 0 for p in pads for v in p):
        raise ShapeError(f"pad: pads must be >= 0, got {pads} (crop with slicing instead)")
    return tuple(d + lo + hi for d, (lo, hi) in zip(x.shape, pads)), x.dtype


def _concat_infer(inputs, attrs):
    axis = attrs["axis"]
    dtype = _same_dtype("concat", inputs)
    first = inputs[0]
    for n in inputs[1:]:
        if n.ndim != first.ndim:
            raise ShapeError(f"concat: shapes {_shown(inputs)} have different ranks")
        for i, (a, b) in enumerate(zip(first.shape, n.shape)):
            if i != axis and not dims_equal(a, b):
                raise ShapeError(f"concat: shapes {_shown(inputs)} disagree on axis {i} "
                                 f"({a} vs {b}); only the concat axis {axis} may differ")
    total = first.shape[axis]
    for n in inputs[1:]:
        total = total + n.shape[axis]
    shape = list(first.shape)
    shape[axis] = as_shape((total,))[0]
    return tuple(shape), dtype


def _gather_infer(inputs, attrs):
    x, idx = inputs
    if not idx.dtype.is_int:
        raise DTypeError(f"gather: indices must have an int dtype, got {idx.dtype.name}")
    axis = attrs["axis"]
    return x.shape[:axis] + idx.shape + x.shape[axis + 1:], x.dtype


def _gather_ref(arrays, attrs):
    x, idx = arrays
    axis, size = attrs["axis"], x.shape[attrs["axis"]]
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        bad = idx[(idx < 0) | (idx >= size)].flat[0]
        raise EvaluationError(f"gather: index {bad} is out of range for axis {axis} of size "
                              f"{size} (indices must be in [0, {size}))")
    return np.take(x, idx, axis=axis)


register(Op("reshape", ATOMIC, "same elements, row-major, new shape", params=("x",),
            attr_defaults={"shape": ()}, infer=_reshape_infer,
            reference=lambda a, attrs: np.reshape(a[0], attrs["shape"])))
register(Op("permute", ATOMIC, "reorder axes: out.shape[i] = x.shape[perm[i]]", params=("x",),
            attr_defaults={"perm": ()}, infer=_permute_infer,
            reference=lambda a, attrs: np.transpose(a[0], attrs["perm"])))
register(Op("expand", ATOMIC, "broadcast size-1 axes to a larger size (same rank)",
            params=("x",), attr_defaults={"shape": ()}, infer=_expand_infer,
            reference=lambda a, attrs: np.broadcast_to(a[0], attrs["shape"])))
register(Op("slice", ATOMIC, "x[start:stop:step] on every axis (bounds already normalised)",
            params=("x",), attr_defaults={"starts": (), "stops": (), "steps": ()},
            infer=_slice_infer, reference=_slice_ref))
register(Op("pad", ATOMIC, "constant padding: pads[i] = (before, after) on axis i",
            params=("x",), attr_defaults={"pads": (), "value": 0.0}, infer=_pad_infer,
            reference=lambda a, attrs: np.pad(a[0], attrs["pads"], constant_values=attrs["value"])))
register(Op("concat", ATOMIC, "join tensors along an axis", params=("xs",), variadic=True,
            attr_defaults={"axis": 0}, infer=_concat_infer,
            reference=lambda a, attrs: np.concatenate(a, axis=attrs["axis"])))
register(Op("gather", ATOMIC, "take along one axis: out = x[..., idx, ...] (numpy take; "
            "indices in [0, size))", params=("x", "indices"), attr_defaults={"axis": 0},
            infer=_gather_infer, reference=_gather_ref))


# ------------------------------------------------------------ selection and scatter (order, writes)
def _argsort_infer(inputs, attrs):
    (x,) = inputs
    if x.ndim == 0 or not 0 <= attrs["axis"] < x.ndim:
        raise ShapeError(f"argsort: axis {attrs['axis']} is out of range for shape "
                         f"{format_shape(x.shape)} (reshape a 0-d tensor to (1,) first)")
    return x.shape, dtypes.int64


def _argsort_ref(arrays, attrs):
    x, axis = arrays[0], attrs["axis"]
    if not attrs["descending"]:
        return np.argsort(x, axis=axis, kind="stable").astype(np.int64)
    # descending and stable: the ascending order of the reversed axis, reversed, keeps equal
    # elements (and nans, which sort first) in their original order
    n = x.shape[axis]
    order = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
    return (n - 1 - np.flip(order, axis)).astype(np.int64)


register(Op("argsort", ATOMIC, "stable sort order along an axis (int64): ascending puts nan "
            "last, descending first; equal elements keep their order (torch's stable sort)",
            params=("x",), attr_defaults={"axis": 0, "descending": False},
            infer=_argsort_infer, reference=_argsort_ref))

# reduce: (numpy ufunc for numbers, for bool) of scatter; nan propagates through amax/amin
SCATTER_REDUCE = {
    "sum": (np.add, np.logical_or),        # scatter-add: a gather's adjoint (accumulate all)
    "prod": (np.multiply, np.logical_and),  # products of every update landing on a place
    "amax": (np.maximum, np.logical_or),   # the largest update (or the base)
    "amin": (np.minimum, np.logical_and),  # the smallest
}


def _scatter_infer(inputs, attrs):
    x, idx, updates = inputs
    axis, reduce = attrs["axis"], attrs["reduce"]
    if reduce not in SCATTER_REDUCE:
        raise ShapeError(f"scatter: reduce must be one of {', '.join(SCATTER_REDUCE)}, "
                         f"got {reduce!r}")
    if not idx.dtype.is_int:
        raise DTypeError(f"scatter: indices must have an int dtype, got {idx.dtype.name}")
    if x.ndim == 0 or not 0 <= axis < x.ndim:
        raise ShapeError(f"scatter: axis {axis} is out of range for shape "
                         f"{format_shape(x.shape)}")
    _same_dtype("scatter", (x, updates))
    want = x.shape[:axis] + idx.shape + x.shape[axis + 1:]
    if len(want) != updates.ndim or not all(dims_equal(a, b) for a, b in
                                            zip(want, updates.shape)):
        raise ShapeError(f"scatter: updates {format_shape(updates.shape)} must have shape "
                         f"{format_shape(want)} (x {format_shape(x.shape)} with axis {axis} "
                         f"replaced by the indices' shape {format_shape(idx.shape)})")
    return x.shape, x.dtype


def _scatter_ref(arrays, attrs):
    x, idx, updates = arrays
    axis, size = attrs["axis"], x.shape[attrs["axis"]]
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        bad = idx[(idx < 0) | (idx >= size)].flat[0]
        raise EvaluationError(f"scatter: index {bad} is out of range for axis {axis} of size "
                              f"{size} (indices must be in [0, {size}))")
    numbers, bools = SCATTER_REDUCE[attrs["reduce"]]
    out = np.array(x, copy=True)
    (bools if x.dtype == np.bool_ else numbers).at(out, (slice(None),) * axis + (idx,), updates)
    return out


register(Op("scatter", ATOMIC, "gather's adjoint: x with each update combined (reduce: sum, "
            "prod, amax, amin) into x[..., indices[p], ...]; repeated indices all count",
            params=("x", "indices", "updates"), attr_defaults={"axis": 0, "reduce": "sum"},
            infer=_scatter_infer, reference=_scatter_ref))


# ---------------------------------------------------------------------------- matmul
def _matmul_infer(inputs, attrs):
    a, b = inputs
    dtype = _same_dtype("matmul", inputs)
    if dtype.is_bool:
        raise DTypeError("matmul: bool operands are not accepted; cast them first")
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul: operands must have rank >= 1, got {_shown(inputs)}")
    ash = a.shape if a.ndim > 1 else (1,) + a.shape
    bsh = b.shape if b.ndim > 1 else b.shape + (1,)
    if not dims_equal(ash[-1], bsh[-2]):
        raise ShapeError(f"matmul: contraction sizes differ: {format_shape(a.shape)} @ "
                         f"{format_shape(b.shape)} (axis -1 of a is {ash[-1]}, axis "
                         f"{-2 if b.ndim > 1 else -1} of b is {bsh[-2]})")
    batch = broadcast_shapes(ash[:-2], bsh[:-2], op="matmul")
    shape = batch + ((ash[-2],) if a.ndim > 1 else ()) + ((bsh[-1],) if b.ndim > 1 else ())
    return shape, dtype


register(Op("matmul", ATOMIC, "matrix product with numpy's batching and broadcasting rules",
            params=("a", "b"), infer=_matmul_infer,
            reference=lambda a, attrs: np.matmul(a[0], a[1])))


# ---------------------------------------------------------------- generators, devices, state
register(Op("iota", ATOMIC, "0, 1, ..., length-1 (length may be symbolic)",
            attr_defaults={"length": 0, "dtype": None},
            infer=lambda inputs, attrs: ((attrs["length"],), attrs["dtype"]),
            reference=lambda a, attrs: np.arange(attrs["length"]).astype(attrs["dtype"].np_dtype)))
register(Op("copy_to", ATOMIC, "the same value on another device", params=("x",),
            attr_defaults={"device": "cpu"},
            infer=lambda inputs, attrs: (inputs[0].shape, inputs[0].dtype),
            reference=lambda a, attrs: np.array(a[0], copy=True)))


def _state_update_infer(inputs, attrs):
    state, value = inputs
    axis, offset = attrs["axis"], attrs["offset"]
    if state.op.name not in ("state", "state_update"):
        raise StateError(f"state_update: the first operand must be a tg.state or a version of "
                         f"one, got {state.op.name} {format_shape(state.shape)}")
    _same_dtype("state_update", inputs)
    if value.ndim != state.ndim or any(not dims_equal(a, b) for i, (a, b)
                                        in enumerate(zip(state.shape, value.shape)) if i != axis):
        raise ShapeError(f"state_update: value {format_shape(value.shape)} must match state "
                         f"{format_shape(state.shape)} on every axis but {axis}")
    end = as_shape((offset + value.shape[axis],))[0]
    old = state.shape[axis]
    if is_static((old, offset)) and offset > old:
        raise StateError(f"state_update: offset {offset} is past the active length {old} of "
                         f"state {format_shape(state.shape)} on axis {axis} (it would leave a gap)")
    shape = list(state.shape)
    shape[axis] = _max_dim(old, end)
    return tuple(shape), state.dtype


def _max_dim(a, b):
    if is_static((a, b)):
        return max(a, b)
    import sympy

    diff = sympy.simplify(sympy.sympify(b) - sympy.sympify(a))
    if diff.is_nonnegative:
        return b
    if diff.is_nonpositive:
        return a
    return as_shape((sympy.Max(a, b),))[0]


def _state_update_ref(arrays, attrs):
    state, value = arrays
    axis, offset = attrs["axis"], attrs["offset"]
    if offset > state.shape[axis]:
        raise EvaluationError(f"state_update: offset {offset} is past the active length "
                              f"{state.shape[axis]} of the state on axis {axis}")
    end = offset + value.shape[axis]
    shape = list(state.shape)
    shape[axis] = max(shape[axis], end)
    out = np.zeros(shape, state.dtype)
    out[tuple(slice(0, n) for n in state.shape)] = state
    index = [slice(None)] * state.ndim
    index[axis] = slice(offset, end)
    out[tuple(index)] = value
    return out


register(Op("state_update", ATOMIC, "a new version of a state with value written at offset "
            "along axis (growing the active length when it writes past the end)",
            params=("state", "value"), attr_defaults={"axis": 0, "offset": 0},
            infer=_state_update_infer, reference=_state_update_ref))

ATOMIC_OPS: tuple[str, ...] = (
    *UNARY, *BINARY, *SPECIAL_UNARY, *SPECIAL_BINARY, "where", "cast", "sum", "max", "reshape",
    "permute", "expand", "slice",
    "pad", "concat", "gather", "matmul", "iota", "copy_to", "state_update",
    "argsort", "scatter", "random_bits")  # random_bits: registered by ops/random.py
LEAF_OPS: tuple[str, ...] = ("input", "weight", "state", "constant", "dim")
