"""Shapes: tuples of ints and sympy expressions over named dims ("batch", "seq").

A named dim is a positive integer symbol. Int-valued expressions are always stored as Python
ints, so concrete shapes stay plain tuples of ints and comparisons are cheap.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Iterable, Mapping

import sympy

from tensor_graphs.errors import ShapeError

Dim = int | sympy.Expr
Shape = tuple[Dim, ...]


def dim_symbol(name: str) -> sympy.Symbol:
    """The symbol of a named dim; every dim is a positive integer."""
    return sympy.Symbol(name, integer=True, positive=True)


# Size expressions written as text ("2*seq", "floor(seq/2)", as str() prints them) are parsed
# with ast and built here node by node: no Python is evaluated, and no number, power or
# expansion can grow past these bounds, so a hostile graph file cannot hang or exhaust the loader
# (sympy's simplify, which dims_equal calls, multiplies products of sums out).
MAX_DIM_TEXT = 1000  # characters in one size expression
MAX_DIM_NODES = 200  # names, numbers, operators and calls in one size expression
MAX_DIM_INT = 2 ** 62  # largest integer (or numerator/denominator) a size expression may hold
MAX_DIM_INT_TEXT = f"2**{MAX_DIM_INT.bit_length() - 1}"  # how messages write it
MAX_DIM_POWER = 16  # largest exponent of ** (numel((seq, seq)) prints as seq**2)
MAX_DIM_CHOICES = 4  # arguments of all Max and Min calls together (sympy compares every pair)
MAX_DIM_TERMS = 64  # terms the expression has once multiplied out
_DIM_TEXT = re.compile(r"[A-Za-z0-9_+\-*/%(), ]+")  # the characters a size expression may use
_SUM, _PRODUCT = sum, math.prod  # how operands' term counts combine when multiplied out
_DIM_OPERATORS = {  # Python operator: (how it combines two size expressions, term count)
    ast.Add: (operator.add, _SUM), ast.Sub: (operator.sub, _SUM),
    ast.Mult: (operator.mul, _PRODUCT), ast.Div: (operator.truediv, _PRODUCT),
    ast.FloorDiv: (lambda a, b: sympy.floor(a / b), _PRODUCT), ast.Mod: (sympy.Mod, _PRODUCT),
    ast.Pow: (operator.pow, None)}  # base terms ** exponent
_DIM_FUNCTIONS = {  # name as str() prints it: (sympy function, fewest, most arguments, terms)
    "Max": (sympy.Max, 1, MAX_DIM_CHOICES, _SUM), "Min": (sympy.Min, 1, MAX_DIM_CHOICES, _SUM),
    "floor": (sympy.floor, 1, 1, _PRODUCT), "ceiling": (sympy.ceiling, 1, 1, _PRODUCT),
    "Mod": (sympy.Mod, 2, 2, _PRODUCT)}


def _parse(text: str) -> sympy.Expr:
    """A size expression from its text: names, integers, + - * / // % **, Max, Min, floor,
    ceiling and Mod; anything else, or anything past the bounds above, is a ShapeError."""
    def refuse(why: str):
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise ShapeError(f"cannot read dim {shown!r} as a size expression: {why}")

    if len(text) > MAX_DIM_TEXT:
        refuse(f"it is {len(text)} characters long (at most {MAX_DIM_TEXT})")
    if not _DIM_TEXT.fullmatch(text):
        refuse("only names, integers, + - * / // % ** and Max/Min/floor/ceiling/Mod are allowed")
    source = text.strip()
    try:
        tree = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        refuse(f"it does not parse ({type(exc).__name__}: {exc})")
    count = sum(isinstance(n, ast.expr) for n in ast.walk(tree))
    if count > MAX_DIM_NODES:
        refuse(f"it has {count} names, numbers and operations (at most {MAX_DIM_NODES})")
    choices = sum(len(n.args) for n in ast.walk(tree) if isinstance(n, ast.Call)
                  and isinstance(n.func, ast.Name) and n.func.id in ("Max", "Min"))
    if choices > MAX_DIM_CHOICES:
        refuse(f"its Max and Min calls have {choices} arguments (at most {MAX_DIM_CHOICES})")
    done: dict[int, tuple[sympy.Expr, int]] = {}
    stack = [(tree, False)]
    while stack:  # post-order without recursion: a long chain of terms cannot overflow
        node, ready = stack.pop()
        parts = _dim_operands(node, source, refuse)
        if not ready:
            stack.append((node, True))
            stack.extend((p, False) for p in parts)
            continue
        args, terms = zip(*(done.pop(id(p)) for p in parts)) if parts else ((), ())
        size = _dim_terms(node, terms)
        if size > MAX_DIM_TERMS:
            refuse(f"{_segment(source, node)} multiplies out to {size} terms (at most "
                   f"{MAX_DIM_TERMS})")
        try:
            value = _dim_node(node, args)
        except (ArithmeticError, TypeError, ValueError) as exc:  # Mod(seq, 0)
            refuse(f"{_segment(source, node)} cannot be computed ({type(exc).__name__}: {exc})")
        for atom in value.atoms():
            if atom.is_Symbol:
                continue
            if not atom.is_Rational:
                refuse(f"it is not finite ({atom}; a division by zero?)")
            if abs(atom.p) > MAX_DIM_INT or atom.q > MAX_DIM_INT:
                refuse(f"it holds a number larger than {MAX_DIM_INT_TEXT} "
                       f"({_segment(source, node)})")
        done[id(node)] = value, size
    return done[id(tree)][0]


def _dim_terms(node: ast.AST, terms: tuple[int, ...]) -> int:
    if isinstance(node, ast.UnaryOp):
        return terms[0]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        power = node.right.operand if isinstance(node.right, ast.UnaryOp) else node.right
        return terms[0] ** power.value
    if isinstance(node, ast.BinOp):
        return _DIM_OPERATORS[type(node.op)][1](terms)
    if isinstance(node, ast.Call):
        return _DIM_FUNCTIONS[node.func.id][3](terms)
    return 1


def _dim_node(node: ast.AST, args: tuple) -> sympy.Expr:
    if isinstance(node, ast.Name):
        return dim_symbol(node.id)
    if isinstance(node, ast.Constant):
        return sympy.Integer(node.value)
    if isinstance(node, ast.UnaryOp):
        return -args[0] if isinstance(node.op, ast.USub) else args[0]
    if isinstance(node, ast.BinOp):
        return _DIM_OPERATORS[type(node.op)][0](*args)
    return _DIM_FUNCTIONS[node.func.id][0](*args)


def _segment(source: str, node: ast.AST) -> str:
    text = ast.get_source_segment(source, node) or ""
    return text if len(text) <= 40 else text[:37] + "..."


def _dim_operands(node: ast.AST, source: str, refuse) -> list[ast.AST]:
    """The sub-expressions of one syntax-tree node of a size expression, after checking that
    the node belongs to the grammar."""
    if isinstance(node, ast.Name):
        if node.id in _DIM_FUNCTIONS:
            refuse(f"{node.id} is a function, not a dim name")
        return []
    if isinstance(node, ast.Constant):
        if type(node.value) is not int or node.value > MAX_DIM_INT:
            refuse(f"{str(node.value)[:40]} is not an integer from 0 to {MAX_DIM_INT_TEXT}")
        return []
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return [node.operand]
    if isinstance(node, ast.BinOp) and type(node.op) in _DIM_OPERATORS:
        if isinstance(node.op, ast.Pow):
            power = node.right.operand if isinstance(node.right, ast.UnaryOp) else node.right
            if not (isinstance(power, ast.Constant) and type(power.value) is int
                    and power.value <= MAX_DIM_POWER):
                refuse(f"the exponent of {_segment(source, node)} is not an integer from "
                       f"-{MAX_DIM_POWER} to {MAX_DIM_POWER}")
        return [node.left, node.right]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in _DIM_FUNCTIONS and not node.keywords:
        _, fewest, most, _ = _DIM_FUNCTIONS[node.func.id]
        if not fewest <= len(node.args) <= most:
            refuse(f"{node.func.id} takes {fewest} to {most} arguments, got {len(node.args)}")
        return list(node.args)
    refuse(f"{_segment(source, node)!r} is not part of a size expression")
    return []


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


def dim_name(dim) -> str:
    """A dim's name: a symbol's ``name`` (``str()`` runs sympy's printer, ~4 us a symbol,
    which a decode step's dims keys paid twice per token), or the string itself."""
    return getattr(dim, "name", dim)


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
