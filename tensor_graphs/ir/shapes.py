"""Shapes: tuples of ints and sympy expressions over named dims ("batch", "seq").

A named dim is a positive integer symbol. Int-valued expressions are always stored as Python
ints, so concrete shapes stay plain tuples of ints and comparisons are cheap.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

import sympy

from tensor_graphs.errors import ShapeError

Dim = int | sympy.Expr
Shape = tuple[Dim, ...]


def dim_symbol(name: str) -> sympy.Symbol:
    """The symbol of a named dim; every dim is a positive integer."""
    return sympy.Symbol(name, integer=True, positive=True)


_DIM_FUNCTIONS = {"Max": sympy.Max, "Min": sympy.Min, "floor": sympy.floor,
                  "ceiling": sympy.ceiling, "Mod": sympy.Mod}  # as str() prints them


def _parse(text: str) -> sympy.Expr:
    local = {tok: _DIM_FUNCTIONS.get(tok) or dim_symbol(tok)
             for tok in re.findall(r"[A-Za-z_][A-Za-z_0-9]*", text)}
    try:
        return sympy.sympify(text, locals=local)
    except (sympy.SympifyError, SyntaxError, TypeError) as exc:
        raise ShapeError(f"cannot read dim {text!r} as a size expression: {exc}") from None


def as_dim(value) -> Dim:
    """Normalise one dim: int, str name or expression ("seq", "2*seq"), or sympy expression."""
    if isinstance(value, bool):
        raise ShapeError(f"a dim must be an int or a name, not {value!r}")
    if isinstance(value, int) or hasattr(value, "__index__") and not isinstance(value, sympy.Basic):
        value = int(value)
        if value < 0:
            raise ShapeError(f"a dim must be >= 0, got {value}")
        return value
    if isinstance(value, str):
        value = _parse(value)
    if isinstance(value, sympy.Basic):
        value = sympy.sympify(value)
        if value.is_Integer:
            return as_dim(int(value))
        if value.is_number:
            raise ShapeError(f"a dim must be an integer, got {value}")
        return value
    raise ShapeError(f"a dim must be an int or a name, not {value!r}")


def as_shape(shape) -> Shape:
    if isinstance(shape, (int, str, sympy.Basic)):
        shape = (shape,)
    return tuple(as_dim(d) for d in shape)


def is_static(shape: Shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def numel(shape: Iterable[Dim]) -> Dim:
    total: Dim = 1
    for d in shape:
        total = total * d
    return as_dim(total) if not isinstance(total, int) else total


def dims_equal(a: Dim, b: Dim) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return sympy.simplify(sympy.sympify(a) - sympy.sympify(b)) == 0


def format_dim(d: Dim) -> str:
    return str(d)


def format_shape(shape: Shape) -> str:
    inner = ", ".join(format_dim(d) for d in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"


def broadcast_shapes(*shapes: Shape, op: str = "broadcast") -> Shape:
    """Numpy broadcasting; a symbolic dim only broadcasts against 1 or itself."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for axis in range(-rank, 0):
        dims = [s[axis] for s in shapes if len(s) >= -axis]
        chosen: Dim = 1
        for d in dims:
            if isinstance(d, int) and d == 1:
                continue
            if isinstance(chosen, int) and chosen == 1:
                chosen = d
            elif not dims_equal(chosen, d):
                shown = ", ".join(format_shape(s) for s in shapes)
                raise ShapeError(
                    f"{op}: shapes {shown} do not broadcast: axis {axis} has sizes "
                    f"{format_dim(chosen)} and {format_dim(d)} (sizes must match or be 1)"
                )
        out.append(chosen)
    return tuple(out)


def normalize_axis(axis: int, rank: int, op: str) -> int:
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise ShapeError(f"{op}: axis must be an int, got {axis!r}")
    if not -rank <= axis < rank:
        raise ShapeError(f"{op}: axis {axis} is out of range for a tensor of rank {rank}")
    return axis % rank


def normalize_axes(axes, rank: int, op: str) -> tuple[int, ...]:
    """None means all axes; the result is sorted and free of duplicates."""
    if axes is None:
        return tuple(range(rank))
    if isinstance(axes, int):
        axes = (axes,)
    out = sorted(normalize_axis(a, rank, op) for a in axes)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated axis in {tuple(axes)}")
    return tuple(out)


def resolve(value, dims: Mapping[sympy.Symbol, int]):
    """Substitute bound dims into an int, expression, or (nested) tuple of them."""
    if isinstance(value, tuple):
        return tuple(resolve(v, dims) for v in value)
    if isinstance(value, sympy.Basic):
        out = sympy.sympify(value.xreplace(dims))
        if not out.is_Integer:
            missing = sorted(str(s) for s in out.free_symbols)
            raise ShapeError(f"dims {missing} are not bound by any feed; cannot size {value}")
        return int(out)
    return value


def free_symbols(value) -> set[sympy.Symbol]:
    if isinstance(value, tuple):
        out: set[sympy.Symbol] = set()
        for v in value:
            out |= free_symbols(v)
        return out
    if isinstance(value, sympy.Basic):
        return set(value.free_symbols)
    return set()


def ceil_div(a: Dim, b: int) -> Dim:
    if isinstance(a, int):
        return -(-a // b)
    return as_dim(sympy.ceiling(sympy.sympify(a) / b))


def prod_int(values: Iterable[int]) -> int:
    return math.prod(values)
