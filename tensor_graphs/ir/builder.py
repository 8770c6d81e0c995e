"""Builder functions for leaves and atomic ops: argument normalisation, dtype promotion and
numpy/torch-style conveniences (negative axes, -1 in reshape, torch's F.pad order, indexing).

Every function returns a hash-consed Node; promotion shows up as explicit cast nodes.
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Sequence

import numpy as np
import sympy

from tensor_graphs.errors import (
    ArgumentError,
    DTypeError,
    ShapeError,
    StateError,
)
from tensor_graphs.ir import dtypes
from tensor_graphs.ir.dtypes import DType, as_dtype
from tensor_graphs.ir.node import ConstValue, Node
from tensor_graphs.ir.ops import (
    OPS,
    atomic,  # noqa: F401  (registers the atomic ops)
)
from tensor_graphs.ir.ops.names import SLICE
from tensor_graphs.ir.shapes import (
    Dim,
    as_dim,
    as_shape,
    ceil_div,
    dims_equal,
    format_shape,
    normalize_axes,
    normalize_axis,
    numel,
)

Scalar = int | float | bool
TensorLike = Node | Scalar | np.ndarray


def _make(op: str, inputs=(), **attrs) -> Node:
    return Node.make(OPS[op], tuple(inputs), attrs)


# ---------------------------------------------------------------------------- leaves
def _leaf(kind: str, name: str, shape, dtype) -> Node:
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"tg.{kind}: a name (non-empty str) is required, got {name!r}")
    return Node.make(OPS[kind], (), {"shape": as_shape(shape), "dtype": as_dtype(dtype)}, name=name)


def input(name: str, shape, dtype="float32") -> Node:  # noqa: A001 - the public name
    """A value fed at every call; str dims ("batch") are symbolic."""
    return _leaf("input", name, shape, dtype)


def weight(name: str, shape, dtype="float32") -> Node:
    """A persistent value, bound once (a model parameter)."""
    return _leaf("weight", name, shape, dtype)


def state(name: str, shape, dtype="float32") -> Node:
    """A persistent, mutable value such as a KV cache; a str dim is its active length."""
    return _leaf("state", name, shape, dtype)


_scalar_constants: dict[tuple, Node] = {}


def constant(value, dtype=None) -> Node:
    """A value baked into the graph. Python floats default to float32, ints to int64."""
    if type(value) in (bool, int, float):  # the common case: skip array hashing
        key = (type(value), value.hex() if isinstance(value, float) else value,
               None if dtype is None else as_dtype(dtype).name)
        found = _scalar_constants.get(key)
        if found is None:
            if len(_scalar_constants) > 4096:
                _scalar_constants.clear()
            found = _scalar_constants[key] = _constant(value, dtype)
        return found
    return _constant(value, dtype)


def _constant(value, dtype) -> Node:
    if isinstance(value, Node):
        raise ArgumentError("tg.constant takes a numpy value or Python scalar, not a node")
    array = np.asarray(value)
    if dtype is None:
        if array.dtype.kind == "f" and not isinstance(value, np.ndarray):
            dtype = dtypes.float32  # Python floats and lists of them
        elif array.dtype.kind in "iu" and not isinstance(value, np.ndarray):
            dtype = dtypes.int64
        else:
            dtype = dtypes.from_numpy(array.dtype)
            if dtype is None:
                raise DTypeError(f"tg.constant: unsupported numpy dtype {array.dtype}")
    dtype = as_dtype(dtype)
    if array.dtype.kind not in "biuf" and dtypes.from_numpy(array.dtype) is None:  # bf16: "V"
        raise DTypeError(f"tg.constant: cannot make a constant from a {array.dtype} value")
    if dtype.is_float and array.dtype.kind in "fV" and array.dtype.itemsize < 8:
        stored = array if array.dtype == dtype.np_dtype else array.astype(dtype.np_dtype)
    elif dtype.is_float:
        stored = array.astype(np.float64)  # exact Python values, so float64 evaluation is exact
    else:
        stored = array.astype(dtype.np_dtype)
    return Node.make(OPS["constant"], (), {"value": ConstValue(stored), "dtype": dtype})


def size(expr, dtype="int64") -> Node:
    """A 0-d tensor holding a (possibly symbolic) size, e.g. ``tg.size("seq")``."""
    dim = as_dim(expr)
    if isinstance(dim, int):
        return constant(dim, dtype)
    return Node.make(OPS["dim"], (), {"expr": dim, "dtype": as_dtype(dtype)})


def as_node(value: TensorLike, like: DType | None = None) -> Node:
    """A node for a tensor-like value; a Python scalar adopts the dtype ``like`` (weakly)."""
    if isinstance(value, Node):
        return value
    if isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating)) and not \
            isinstance(value, np.ndarray):
        if isinstance(value, np.generic):
            return constant(np.asarray(value))
        return constant(value, dtypes.weak_scalar_dtype(value, like))
    if isinstance(value, (np.ndarray, list, tuple)):
        return constant(np.asarray(value) if not isinstance(value, np.ndarray) else value)
    raise ArgumentError(f"expected a tensor (node, numpy array or Python scalar), "
                            f"got {type(value).__name__}")


def promote(*values: TensorLike, op: str = "op") -> list[Node]:
    """Nodes of one common dtype; Python scalars adopt the tensors' dtype where it holds them."""
    strong = [v.dtype for v in values if isinstance(v, Node)]
    strong += [as_node(v).dtype for v in values if isinstance(v, (np.ndarray, list, tuple))]
    if strong:
        common = strong[0]
        for d in strong[1:]:
            common = dtypes.promote_pair(common, d)
        for v in values:
            if not isinstance(v, (Node, np.ndarray, list, tuple)):
                common = dtypes.promote_pair(common, dtypes.weak_scalar_dtype(v, common))
    else:
        common = None
        for v in values:
            d = dtypes.weak_scalar_dtype(v, None)
            common = d if common is None else dtypes.promote_pair(common, d)
    return [cast(as_node(v, common), common) for v in values]


# ---------------------------------------------------------------------------- elementwise
def pattern_aware(op: str):
    """Called with a pattern (``tg.pat`` object), the builder builds the pattern ``op(...)``
    instead of a node: that is how ``@tg.kernel(lambda a, b: tg.exp(a) * b)`` traces the
    reference graph it implements."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if builtins.any(getattr(a, "is_pattern", False) for a in (*args, *kwargs.values())):
                from tensor_graphs.ir.pattern import op as pattern_op

                return pattern_op(op, *args, **kwargs)
            return fn(*args, **kwargs)
        return call
    return wrap


def _float_input(x: TensorLike) -> Node:
    x = as_node(x)
    return x if x.dtype.is_float else cast(x, dtypes.float32)


@pattern_aware("neg")
def neg(x: TensorLike) -> Node:
    """-x."""
    return _make("neg", (as_node(x),))


@pattern_aware("exp")
def exp(x: TensorLike) -> Node:
    """e**x (ints are promoted to float32)."""
    return _make("exp", (_float_input(x),))


@pattern_aware("log")
def log(x: TensorLike) -> Node:
    """Natural logarithm."""
    return _make("log", (_float_input(x),))


@pattern_aware("sqrt")
def sqrt(x: TensorLike) -> Node:
    """Square root."""
    return _make("sqrt", (_float_input(x),))


@pattern_aware("reciprocal")
def reciprocal(x: TensorLike) -> Node:
    """1/x."""
    return _make("reciprocal", (_float_input(x),))


@pattern_aware("sin")
def sin(x: TensorLike) -> Node:
    """Sine."""
    return _make("sin", (_float_input(x),))


@pattern_aware("erf")
def erf(x: TensorLike) -> Node:
    """The error function."""
    return _make("erf", (_float_input(x),))


def _binary(op: str):
    def fn(a: TensorLike, b: TensorLike) -> Node:
        return _make(op, promote(a, b, op=op))
    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = OPS[op].doc
    return pattern_aware(op)(fn)


add = _binary("add")
mul = _binary("mul")
maximum = _binary("maximum")
equal = _binary("equal")
less = _binary("less")


@pattern_aware("pow")
def pow(a: TensorLike, b: TensorLike) -> Node:  # noqa: A001 - the public name
    """a ** b; an int tensor to a float power becomes float."""
    a, b = promote(a, b, op="pow")
    return _make("pow", (a, b))


@pattern_aware("where")
def where(cond: TensorLike, a: TensorLike, b: TensorLike) -> Node:
    """cond ? a : b elementwise; cond must be bool."""
    cond = as_node(cond)
    if not cond.dtype.is_bool:
        raise DTypeError(f"where: the condition must be bool, got {cond.dtype.name} "
                         "(compare it with tg.equal/tg.less or cast with .astype(bool))")
    a, b = promote(a, b, op="where")
    return _make("where", (cond, a, b))


def cast(x: TensorLike, dtype) -> Node:
    """Convert to another dtype; a no-op when the dtype already matches."""
    x, dtype = as_node(x), as_dtype(dtype)
    return x if x.dtype == dtype else _make("cast", (x,), dtype=dtype)


# ---------------------------------------------------------------------------- reductions
def sum(x: TensorLike, axis=None, keepdims: bool = False) -> Node:  # noqa: A001
    """Sum over axes (all when None); bool sums count in int64."""
    x = as_node(x)
    if x.dtype.is_bool:
        x = cast(x, dtypes.int64)
    axes = normalize_axes(axis, x.ndim, "sum")
    if not axes:
        return x
    return _make("sum", (x,), axes=axes, keepdims=bool(keepdims))


def max(x: TensorLike, axis=None, keepdims: bool = False) -> Node:  # noqa: A001
    """Maximum over axes (all when None); nan propagates."""
    x = as_node(x)
    axes = normalize_axes(axis, x.ndim, "max")
    if not axes:
        return x
    return _make("max", (x,), axes=axes, keepdims=bool(keepdims))


# ---------------------------------------------------------------------------- movement
def _shape_args(args, fn: str) -> tuple:
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def reshape(x: TensorLike, *shape) -> Node:
    """Row-major reshape; one -1 is inferred; accepts a tuple or varargs."""
    x = as_node(x)
    shape = _shape_args(shape, "reshape")
    minus = [i for i, d in enumerate(shape) if isinstance(d, int) and d == -1]
    if len(minus) > 1:
        raise ShapeError(f"reshape: only one -1 allowed, got {shape}")
    if minus:
        known = numel(as_shape(tuple(d for i, d in enumerate(shape) if i != minus[0])))
        total = numel(x.shape)
        if isinstance(total, int) and isinstance(known, int):
            if known == 0 or total % known:
                raise ShapeError(f"reshape: cannot reshape {format_shape(x.shape)} to {shape}")
            inferred = total // known
        else:
            inferred = sympy.cancel(sympy.sympify(total) / sympy.sympify(known))
            if not (inferred.is_integer or isinstance(inferred, sympy.Symbol)) or \
                    sympy.fraction(inferred)[1] != 1:
                raise ShapeError(f"reshape: cannot infer -1 reshaping {format_shape(x.shape)} "
                                 f"to {shape}")
        shape = tuple(inferred if i == minus[0] else d for i, d in enumerate(shape))
    shape = as_shape(shape)
    if len(shape) == x.ndim and builtins.all(dims_equal(a, b) for a, b in zip(shape, x.shape)):
        return x
    return _make("reshape", (x,), shape=shape)


def permute(x: TensorLike, *axes) -> Node:
    """Reorder axes; accepts a tuple or varargs, negative axes allowed."""
    x = as_node(x)
    perm = tuple(normalize_axis(a, x.ndim, "permute") for a in _shape_args(axes, "permute"))
    if perm == tuple(range(x.ndim)) and len(perm) == x.ndim:
        return x
    return _make("permute", (x,), perm=perm)


def transpose(x: TensorLike, a: int = -2, b: int = -1) -> Node:
    """Swap two axes."""
    x = as_node(x)
    perm = list(range(x.ndim))
    a, b = normalize_axis(a, x.ndim, "transpose"), normalize_axis(b, x.ndim, "transpose")
    perm[a], perm[b] = perm[b], perm[a]
    return permute(x, tuple(perm))


def expand(x: TensorLike, *shape) -> Node:
    """Broadcast to a shape (torch's expand: -1 keeps a size, new leading axes allowed)."""
    x = as_node(x)
    shape = _shape_args(shape, "expand")
    if len(shape) < x.ndim:
        raise ShapeError(f"expand: target {shape} has fewer axes than {format_shape(x.shape)}")
    lead = len(shape) - x.ndim
    target = as_shape(tuple(x.shape[i - lead] if isinstance(d, int) and d == -1 else d
                            for i, d in enumerate(shape)))
    if lead:
        x = reshape(x, (1,) * lead + x.shape)
    if builtins.all(dims_equal(a, b) for a, b in zip(target, x.shape)):
        return x
    return _make("expand", (x,), shape=target)


broadcast_to = expand


def unsqueeze(x: TensorLike, axis: int) -> Node:
    """Insert a size-1 axis."""
    x = as_node(x)
    axis = normalize_axis(axis, x.ndim + 1, "unsqueeze")
    return reshape(x, x.shape[:axis] + (1,) + x.shape[axis:])


def squeeze(x: TensorLike, axis=None) -> Node:
    """Drop size-1 axes (all of them, or the given ones). A one-element window of a symbolic
    axis (``x[i:i+1]``, which numpy empties when the axis has at most i elements) squeezed is
    ``x[i]``: see ``_as_index``."""
    x = as_node(x)
    axes = [i for i, d in enumerate(x.shape) if d == 1] if axis is None else \
        normalize_axes(axis, x.ndim, "squeeze")
    for a in axes:
        if x.shape[a] != 1:
            x = _as_index(x, a) or x
        if x.shape[a] != 1:
            raise ShapeError(f"squeeze: axis {a} of {format_shape(x.shape)} has size "
                             f"{x.shape[a]}, not 1")
    return reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def _as_index(x: Node, axis: int) -> Node | None:
    """``x``, a slice whose window on the symbolic ``axis`` is the one element at an int
    index i, clamped as ``_window`` clamps it (Min(i + 1, n) - Min(i, n) elements), as the
    same slice reading that axis as getitem's ``x[i]`` does: one element from Min(i, n), a
    call with at most i elements failing; None for any other node. Squeezing the axis takes
    that element, which needs the axis longer than i (numpy's squeeze of an empty axis
    raises; torch's select, a slice then a squeeze, guards it): without this, ``x[:, 3]`` of
    a torch export over a dynamic axis could not be built."""
    if x.op.name != SLICE or x.attrs["steps"][axis] != 1:
        return None
    src = x.inputs[0]
    dim, start, stop = src.shape[axis], x.attrs["starts"][axis], x.attrs["stops"][axis]
    if isinstance(dim, int) or isinstance(start, int):
        return None
    n = sympy.sympify(dim)
    for part in sympy.sympify(start).args:  # Min(i, n): i; Max(0, n - k): -k
        i = part if part.is_Integer else part - n
        if not i.is_Integer or int(i) == -1:
            continue
        i = int(i)
        if _window(i, i + 1, dim, axis, src.shape) != (start, stop):
            continue
        at = _clamp(i, dim) if i >= 0 else as_dim(n + i)  # as getitem's x[i]
        starts, stops = list(x.attrs["starts"]), list(x.attrs["stops"])
        starts[axis], stops[axis] = at, as_dim(at + 1)
        return _make("slice", (src,), starts=tuple(starts), stops=tuple(stops),
                     steps=x.attrs["steps"])
    return None


def flatten(x: TensorLike, start: int = 0, end: int = -1) -> Node:
    """Merge axes start..end into one."""
    x = as_node(x)
    if x.ndim == 0:
        return reshape(x, (1,))
    s, e = normalize_axis(start, x.ndim, "flatten"), normalize_axis(end, x.ndim, "flatten")
    return reshape(x, x.shape[:s] + (numel(x.shape[s:e + 1]),) + x.shape[e + 1:])


def _bound(value, dim: Dim, default, op: str):
    """Normalise one slice bound against a (possibly symbolic) dim: a concrete dim clamps
    numpy-style; on a symbolic one a negative int counts from the end, unclamped (what
    ``_window`` does with a bound beside a symbolic one)."""
    if value is None:
        return default
    value = as_dim(value) if not (isinstance(value, int) and value < 0) else value
    if isinstance(value, int) and isinstance(dim, int):
        return builtins.min(builtins.max(value + dim if value < 0 else value, 0), dim)
    if isinstance(value, int) and value < 0:
        return as_dim(dim + value)
    return value


def _clamp(value: int, dim: Dim) -> Dim:
    """An int slice bound on the symbolic axis ``dim`` where numpy puts it at every length:
    ``Min(value, dim)``, or from the end ``Max(dim + value, 0)`` for a negative one."""
    if value >= 0:
        return as_dim(sympy.Min(value, dim)) if value else 0
    return as_dim(sympy.Max(sympy.sympify(dim) + value, 0))


def _window(start, stop, dim: Dim, axis: int, shape) -> tuple[Dim, Dim]:
    """(start, stop) of ``x[start:stop]`` (a positive step) on the symbolic axis ``dim``, as
    numpy clamps int bounds at every length the axis takes: ``x[:8]`` is ``x[0:Min(8, n)]``,
    of Min(8, n) elements, not 8 (which at n = 5 the kernel's view did not have: the plan
    made at the bounds expected 8 rows, and the call failed after planning). The start is
    kept at most the stop, so the length is never negative and never shrinks as the dim
    grows (the arena is laid out at the bounds). A symbolic bound ("seq - 1", "seq"; torch's
    export guards the ones it writes) is taken as in range and the other bound as given, as
    before: the sizes torch derived from it assume as much.

    The stop is written as the start plus the length where that makes the length one term:
    ``x[2:]``, ``x[:-2]`` and ``x[1:-1]`` all have Max(0, n - 2) elements, the same
    expression, so their results add and concatenate as numpy's do. Every bound and length
    holds at most four Min/Max choices, as many as a saved graph reads back
    (``shapes.MAX_DIM_CHOICES``).

    A start counted from the end with a stop counted from the start (``x[-3:5]``) is
    refused: its length, Min(5, n) - Min(5, Max(0, n - 3)), rises and then falls as n grows
    (3 at n = 5, 0 from n = 8), more than a saved size holds and more than a plan at the
    bounds may assume."""
    n = sympy.sympify(dim)
    start, stop = (int(v) if isinstance(v, np.integer) else v for v in (start, stop))
    known = (int, type(None))
    if not (isinstance(start, known) and isinstance(stop, known)):
        return _bound(start, dim, 0, "slice"), _bound(stop, dim, dim, "slice")
    lo, hi = start, stop
    if not lo:  # from the start of the axis
        return 0, dim if hi is None else _clamp(hi, dim)
    if hi is None:  # to the end: Max(0, n - a) elements, or the last Min(a, n)
        first = _clamp(lo, dim)
        size = sympy.Max(0, n - lo) if lo > 0 else sympy.Min(-lo, n)
        return first, as_dim(first + size)
    if (lo >= 0) == (hi >= 0):  # both from the start, or both from the end
        return _clamp(builtins.min(lo, hi), dim), _clamp(hi, dim)
    if lo > 0:  # x[a:-b]: Max(0, n - b - a) elements from Min(a, n)
        first = _clamp(lo, dim)
        return first, as_dim(first + sympy.Max(0, n + hi - lo))
    if hi == 0:
        return 0, 0
    raise ShapeError(
        f"slice: x[{start}:{stop}] on the symbolic axis {axis} ({dim}) of "
        f"{format_shape(shape)} starts {-lo} from the end and stops at {hi} from the start, "
        f"so its length (Min({hi}, {dim}) - Min({hi}, Max(0, {dim} - {-lo}))) rises and "
        f"then falls as {dim} grows, which tensor_graphs does not plan; slice with both "
        f"bounds counted from the same end (x[-{-lo}:] where {dim} is never above {hi}), or "
        f"give axis {axis} a static size")


def slice_axis(x: TensorLike, axis: int, start=None, stop=None, step: int = 1) -> Node:
    """x[..., start:stop:step, ...] on one axis; bounds may be symbolic."""
    x = as_node(x)
    axis = normalize_axis(axis, x.ndim, "slice")
    return _slice(x, {axis: builtins.slice(start, stop, step)})


def _slice(x: Node, per_axis: dict) -> Node:
    starts, stops, steps = [], [], []
    for axis, dim in enumerate(x.shape):
        s = per_axis.get(axis, builtins.slice(None))
        step = 1 if s.step is None else s.step
        if not isinstance(step, int) or step == 0:
            raise ShapeError(f"slice: step must be a non-zero int, got {step!r}")
        if isinstance(dim, int) and builtins.all(isinstance(v, (int, type(None)))
                                                 for v in (s.start, s.stop)):
            start, stop, step = s.indices(dim)
        elif step > 0:
            start, stop = _window(s.start, s.stop, dim, axis, x.shape)
        else:
            raise ShapeError(f"slice: a negative step on the symbolic axis {axis} ({dim}) is "
                             "not supported; flip a concrete axis instead")
        starts.append(start)
        stops.append(stop)
        steps.append(step)
    if builtins.all(a == 0 and st == 1 and dims_equal(c, d)
                    for a, c, st, d in zip(starts, stops, steps, x.shape)):
        return x
    return _make("slice", (x,), starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))


def getitem(x: Node, index) -> Node:
    """Numpy indexing: ints, slices (any step), None, Ellipsis and one int-tensor index (a
    gather; a numpy array or list index may hold negative indices). As in numpy, when the ints
    and the tensor index are not next to each other, the tensor index's axes come first."""
    x = as_node(x)
    if not isinstance(index, tuple):
        index = (index,)
    if builtins.sum(1 for i in index if i is Ellipsis) > 1:
        raise ShapeError("an index can only have a single ellipsis ('...')")
    used = builtins.sum(1 for i in index if i is not None and i is not Ellipsis)
    if used > x.ndim:
        raise ShapeError(f"too many indices ({used}) for a tensor of shape {format_shape(x.shape)}")
    fill = (builtins.slice(None),) * (x.ndim - used)
    at = next((k for k, i in enumerate(index) if i is Ellipsis), None)
    index = index + fill if at is None else index[:at] + fill + index[at + 1:]
    # one entry per index item: ("new",), ("keep", axis), ("int", axis) or ("tensor", axis)
    per_axis, entries, gathers, axis = {}, [], [], 0
    for item in index:
        if item is None:
            entries.append(("new",))
            continue
        dim = x.shape[axis]
        if isinstance(item, (Node, np.ndarray, list)):
            gathers.append((axis, _tensor_index(item, dim, axis)))
            entries.append(("tensor", axis))
        elif isinstance(item, builtins.slice):
            per_axis[axis] = item
            entries.append(("keep", axis))
        elif isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)):
            item = int(item)
            if isinstance(dim, int) and not -dim <= item < dim:
                raise ShapeError(f"index {item} is out of range for axis {axis} of size {dim}")
            start = item + dim if item < 0 else item
            if not isinstance(dim, int) and item > 0:
                # x[i] on a symbolic axis: the one element from Min(i, dim), both bounds
                # symbolic so the builder takes them as they are (a saved graph rebuilds the
                # same node; int bounds i, i + 1 would be clamped as a window's, to nothing at
                # a length of at most i); there the call fails, as numpy's x[i] raises
                start = _clamp(item, dim)
            per_axis[axis] = builtins.slice(start, as_dim(start + 1) if not isinstance(start, int)
                                            else start + 1, 1)
            entries.append(("int", axis))
        else:
            raise ShapeError(f"unsupported index {item!r}; use ints, slices, None, ... or one "
                             "int tensor")
        axis += 1
    if len(gathers) > 1:
        raise ShapeError("only one tensor index is supported; gather axes one at a time")
    y = _slice(x, per_axis)
    if not gathers:
        return reshape(y, tuple(1 if e[0] == "new" else y.shape[e[1]]
                                for e in entries if e[0] != "int"))
    g_axis, idx = gathers[0]
    y = gather(y, idx, axis=g_axis)
    k = idx.ndim

    def y_axes(a: int) -> list[int]:  # the axes of the gathered y that hold x's axis a
        return list(range(g_axis, g_axis + k)) if a == g_axis else [a if a < g_axis else a + k - 1]

    advanced = [p for p, e in enumerate(entries) if e[0] in ("int", "tensor")]
    adjacent = advanced == list(range(advanced[0], advanced[-1] + 1))
    order: list[int] = [] if adjacent else y_axes(g_axis)  # y's axes in output order
    shape: list = [y.shape[a] for a in order]
    for e in entries:
        if e[0] == "new":
            shape.append(1)
        elif e[0] == "keep" or (e[0] == "tensor" and adjacent):
            order += y_axes(e[1])
            shape += [y.shape[a] for a in y_axes(e[1])]
    dropped = [y_axes(e[1])[0] for e in entries if e[0] == "int"]  # size 1, moved last
    return reshape(permute(y, tuple(order + dropped)), tuple(shape))


def _tensor_index(item, dim: Dim, axis: int) -> Node:
    """A tensor index as a node; constant (numpy/list) indices are checked and made >= 0."""
    if isinstance(item, Node):
        return item
    arr = np.asarray(item)
    if arr.size == 0 and arr.dtype.kind == "f":
        arr = arr.astype(np.int64)  # x[[]]
    if arr.dtype.kind in "iu" and arr.size:
        if isinstance(dim, int):
            if arr.min() < -dim or arr.max() >= dim:
                bad = arr[(arr < -dim) | (arr >= dim)].flat[0]
                raise ShapeError(f"index {bad} is out of range for axis {axis} of size {dim}")
            arr = np.where(arr < 0, arr + dim, arr).astype(arr.dtype)
        elif arr.min() < 0:
            raise ShapeError(f"negative indices on the symbolic axis {axis} ({dim}) are not "
                             "supported")
    return as_node(arr)


def pad(x: TensorLike, pad: Sequence[int], value: float = 0.0) -> Node:
    """torch.nn.functional.pad order: (last_before, last_after, 2nd_last_before, ...);
    negative pads crop."""
    x = as_node(x)
    pad = tuple(pad)
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise ShapeError(f"pad: {pad} must hold pairs for at most {x.ndim} axes")
    pads = [[0, 0] for _ in range(x.ndim)]
    for k in range(len(pad) // 2):
        pads[x.ndim - 1 - k] = [pad[2 * k], pad[2 * k + 1]]
    crops = {a: builtins.slice(-lo if lo < 0 else 0, hi if hi < 0 else None)
             for a, (lo, hi) in enumerate(pads) if (isinstance(lo, int) and lo < 0)
             or (isinstance(hi, int) and hi < 0)}
    if crops:
        x = _slice(x, crops)
        pads = [[builtins.max(lo, 0) if isinstance(lo, int) else lo,
                 builtins.max(hi, 0) if isinstance(hi, int) else hi] for lo, hi in pads]
    if builtins.all(lo == 0 and hi == 0 for lo, hi in pads):
        return x
    value = x.dtype.np_dtype.type(value).item() if not x.dtype.is_float else float(value)
    return _make("pad", (x,), pads=tuple(tuple(as_dim(v) for v in p) for p in pads), value=value)


def concat(xs: Sequence[TensorLike], axis: int = 0) -> Node:
    """Join tensors along an existing axis."""
    xs = promote(*xs, op="concat")
    if not xs:
        raise ShapeError("concat: needs at least one tensor")
    axis = normalize_axis(axis, xs[0].ndim, "concat")
    return xs[0] if len(xs) == 1 else _make("concat", xs, axis=axis)


cat = concat


def gather(x: TensorLike, indices: TensorLike, axis: int = 0) -> Node:
    """numpy.take along one axis: out.shape = x.shape[:axis] + idx.shape + x.shape[axis+1:]."""
    x = as_node(x)
    indices = as_node(indices)
    if not indices.dtype.is_int:
        raise DTypeError(f"gather: indices must have an int dtype, got {indices.dtype.name}")
    return _make("gather", (x, indices), axis=normalize_axis(axis, x.ndim, "gather"))


@pattern_aware("matmul")
def matmul(a: TensorLike, b: TensorLike) -> Node:
    """Matrix product with numpy's batching and broadcasting."""
    return _make("matmul", promote(a, b, op="matmul"))


def iota(length, dtype="int64") -> Node:
    """0, 1, ..., length-1; length may be a named dim."""
    return _make("iota", (), length=as_dim(length), dtype=as_dtype(dtype))


def arange(start, stop=None, step=1, dtype=None) -> Node:
    """torch.arange; int bounds may be named dims ("seq") when the step is positive."""
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ShapeError("arange: step must not be 0")
    kinds_float = builtins.any(isinstance(v, float) for v in (start, stop, step))
    dtype = as_dtype(dtype or ("float32" if kinds_float else "int64"))
    if kinds_float:
        n = builtins.max(int(np.ceil((stop - start) / step)), 0)
    elif builtins.all(isinstance(v, (int, np.integer)) for v in (start, stop)):
        n = len(range(int(start), int(stop), int(step)))
    else:
        lo, hi = (v if isinstance(v, (int, np.integer)) else as_dim(v) for v in (start, stop))
        if step < 0:
            raise ShapeError("arange: a negative step with symbolic bounds is not supported")
        n = as_dim(ceil_div(hi - lo, step) if step != 1 else hi - lo)
    out = iota(n, dtype)
    if step != 1:
        out = mul(out, step)
    if not (isinstance(start, (int, float, np.integer, np.floating)) and start == 0):
        out = add(out, start if isinstance(start, (int, float, np.integer, np.floating))
                  else size(start, dtype))
    return cast(out, dtype)


def copy_to(x: TensorLike, device: str) -> Node:
    """The same value on another device."""
    return _make("copy_to", (as_node(x),), device=str(device))


def state_update(state: Node, value: TensorLike, offset=0, axis: int = 0) -> Node:
    """A new version of ``state`` with ``value`` written at ``offset`` along ``axis``.

    Reads of the old version stay reads of the old version; use the returned node for reads
    after the update and return it as an output of the program.
    """
    if not isinstance(state, Node):
        raise StateError("state_update: the first argument must be a tg.state node")
    value = cast(as_node(value, state.dtype), state.dtype)
    axis = normalize_axis(axis, state.ndim, "state_update")
    return _make("state_update", (state, value), axis=axis, offset=as_dim(offset))


def all_dims_static(x: Node) -> bool:
    return builtins.all(isinstance(d, int) for d in x.shape)
