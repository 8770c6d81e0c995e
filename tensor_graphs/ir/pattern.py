"""Patterns as data: ``Var``, ``Many``, ``Const`` and ``OpPat`` and their builders ``var``,
``many`` and ``op``. They live in the IR, below the rewriter, because the builders trace a
kernel's pattern (``builder.pattern_aware``, ``composite``) when given one; matching them
against graphs, rules and rule tables are the rewriter's (``rewrite/pattern.py``, which
re-exports these as ``tg.pat``). The language is described there.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tensor_graphs.errors import ArgumentError
from tensor_graphs.ir import dtypes
from tensor_graphs.ir.algebra import ASSOCIATIVE_COMMUTATIVE
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops import OPS
from tensor_graphs.ir.ops.names import CONSTANT


class Pat:
    """Base of pattern nodes; operators build OpPats."""

    is_pattern = True  # tg.* builders given a pattern build a pattern (see builder.pattern_aware)

    def __add__(self, o): return OpPat("add", (self, as_pat(o)))  # noqa: E704
    def __radd__(self, o): return OpPat("add", (as_pat(o), self))  # noqa: E704
    def __sub__(self, o): return OpPat("sub", (self, as_pat(o)))  # noqa: E704
    def __rsub__(self, o): return OpPat("sub", (as_pat(o), self))  # noqa: E704
    def __mul__(self, o): return OpPat("mul", (self, as_pat(o)))  # noqa: E704
    def __rmul__(self, o): return OpPat("mul", (as_pat(o), self))  # noqa: E704
    def __truediv__(self, o): return OpPat("div", (self, as_pat(o)))  # noqa: E704
    def __rtruediv__(self, o): return OpPat("div", (as_pat(o), self))  # noqa: E704
    def __matmul__(self, o): return OpPat("matmul", (self, as_pat(o)))  # noqa: E704
    def __pow__(self, o): return OpPat("pow", (self, as_pat(o)))  # noqa: E704
    def __neg__(self): return OpPat("neg", (self,))  # noqa: E704
    __hash__ = object.__hash__


@dataclass(frozen=True, eq=False)
class Var(Pat):
    """Binds any node that passes its guards."""

    name: str
    dtype: object = None  # a DType/name, a tuple of them, or a kind: "float", "int", "bool"
    rank: int | None = None
    shape: Callable | None = None  # predicate on the node's shape
    const: object = None  # the node must be a constant whose elements all equal this
    single_use: bool = False  # the node has exactly one user in the graph
    where: Callable | None = None  # any predicate on the node

    def accepts(self, node: Node, uses: Mapping[Node, int] | None) -> bool:
        if self.dtype is not None and not dtype_accepts(self.dtype, node.dtype):
            return False
        if self.rank is not None and node.ndim != self.rank:
            return False
        if self.shape is not None and not self.shape(node.shape):
            return False
        if self.const is not None and not constant_equals(node, self.const):
            return False
        if self.single_use:
            if uses is None:
                raise ArgumentError(f"pattern variable '{self.name}' needs use counts "
                                    "(single_use); match through apply() or pass uses=")
            if uses.get(node, 0) != 1:
                return False
        return self.where is None or bool(self.where(node))


@dataclass(frozen=True, eq=False)
class Many(Pat):
    """A variadic operand: binds the tuple of the node's inputs it covers (at least ``min``),
    each passing the guards of ``each`` (a Var named like the Many)."""

    name: str
    min: int = 1
    each: Var | None = None  # per-element guards (dtype, rank, shape, const, single_use, where)

    def accepts(self, nodes_: Sequence[Node], uses: Mapping[Node, int] | None) -> bool:
        if len(nodes_) < self.min:
            return False
        return self.each is None or builtins.all(self.each.accepts(n, uses) for n in nodes_)


@dataclass(frozen=True, eq=False)
class Const(Pat):
    """A constant node whose every element equals ``value`` (any dtype, any broadcast shape).
    ``dtype``: what building the pattern gives it (a generated region's own constant), where no
    operand beside it says (``where(c, 0, 1)`` over int32); matching ignores it."""

    value: float | int | bool
    dtype: dtypes.DType | None = None


@dataclass(frozen=True, eq=False)
class OpPat(Pat):
    """An op applied to sub-patterns; ``attrs`` maps a name to a value or a predicate."""

    op: str
    inputs: tuple[Pat, ...] = ()
    attrs: Mapping[str, object] = field(default_factory=dict)
    name: str | None = None  # bind the matched node itself under this name

    def bind(self, name: str) -> OpPat:
        return OpPat(self.op, self.inputs, self.attrs, name)


def var(name: str, **guards) -> Var:
    """A pattern variable; guards: dtype, rank, shape, const, single_use, where."""
    return Var(name, **guards)


def many(name: str, min: int = 1, **guards) -> Many:  # noqa: A002 - reads as min=
    """A variadic operand binding a tuple of nodes (see the module docstring); the guards are
    ``var``'s and hold for every element."""
    if not isinstance(min, int) or isinstance(min, bool) or min < 0:
        raise ArgumentError(f"pat.many: min must be a non-negative int, got {min!r}")
    return Many(name, min, Var(name, **guards) if guards else None)


def as_pat(value) -> Pat:
    if isinstance(value, Pat):
        return value
    if isinstance(value, (bool, int, float, np.number)):
        return Const(value.item() if isinstance(value, np.generic) else value)
    raise ArgumentError(f"cannot use {value!r} in a pattern; use pat.var, a scalar or pat.<op>")


def op(name: str, *inputs, **attrs) -> OpPat:
    """``op("reshape", x, shape=...)``: the op ``name`` over sub-patterns."""
    if name not in OPS:
        raise ArgumentError(f"unknown op '{name}' in a pattern")
    made = tuple(as_pat(i) for i in inputs)
    check_many(name, made)
    return OpPat(name, made, attrs)


def check_many(op_name: str, inputs: Sequence[Pat]) -> None:
    """An OpPat's inputs hold at most one Many, and none under an associative-commutative op."""
    count = sum(isinstance(i, Many) for i in inputs)
    if count > 1:
        raise ArgumentError(f"pattern {op_name}(...) has {count} pat.many operands; at most one "
                            "can say how many inputs it covers")
    if count and op_name in ASSOCIATIVE_COMMUTATIVE:
        raise ArgumentError(f"pat.many cannot be an operand of '{op_name}': an associative-"
                            "commutative chain is matched as a multiset of terms")


def dtype_accepts(want, got: dtypes.DType) -> bool:
    """A ``Var``'s dtype guard (a DType or name, a kind "float"/"int"/"bool", or a tuple of
    them) against a node's dtype; matching a chain's terms asks it once for all of them."""
    if isinstance(want, (tuple, list, set, frozenset)):
        return any(dtype_accepts(w, got) for w in want)
    if want in ("float", "int", "bool"):
        return got.kind == want
    return dtypes.as_dtype(want) == got


def constant_equals(node: Node, value) -> bool:
    """True when ``node`` is a constant whose every element equals ``value``."""
    if node.op.name != CONSTANT:
        return False
    arr = node.attrs["value"].array
    if arr.dtype.kind == "f" and isinstance(value, float) and value != value:
        return bool(np.isnan(arr).all())
    return arr.size > 0 and bool(np.all(arr.astype(np.float64) == value))
