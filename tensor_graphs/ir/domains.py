"""Where an op's operands lie in real data, so that made-up inputs land there too.

Timing a kernel on standard normal inputs is right for most ops, and wrong for the ops that
are undefined on half of them: a generated C loop's ``logf`` on a negative lane takes glibc's
slow path (``log(x)`` on (256, 4096) float32: 10 ms on normal inputs, 0.24 ms on positive
ones), while the data a model feeds a log (a softmax, a variance plus eps) never goes there.
The profiler (``profiler/measure.py``) draws the inputs such an operand is computed from in
the op's domain, and verification's single-op cases (``kernels/signatures.py``) draw the
same ops' operands there; this table is the one place the rule is written.

Only the ``POSITIVE`` domain exists so far. Ops defined on an interval (``acosh``,
``atanh``, ``logit``, ...) have no row: their operands keep normal values, except where their
decomposition reaches a row's op (``acosh``'s log), whose operand is traced as any other.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np

from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import (
    ABS,
    ADD,
    CAST,
    CONCAT,
    CONSTANT,
    COPY_TO,
    DIV,
    EXP,
    EXPAND,
    LOG,
    MAX,
    MAXIMUM,
    MEAN,
    MIN,
    MINIMUM,
    MUL,
    PERMUTE,
    POW,
    RECIPROCAL,
    RESHAPE,
    RSQRT,
    SIGMOID,
    SLICE,
    SOFTMAX,
    SOFTPLUS,
    SQRT,
    SQUARE,
    SUM,
    XLOGY,
)

POSITIVE = "positive"  # > 0 (``kernels.signatures.Spec`` values of the same name)


def _always(node: Node) -> bool:
    return True


def _fractional_exponent(node: Node) -> bool:
    """pow's base needs to be positive unless the exponent is a constant of whole numbers
    (a negative base to a whole power is a number)."""
    exponent = node.inputs[1]
    if exponent.op.name != CONSTANT:
        return True
    values = np.asarray(exponent.attrs["value"].array, dtype=np.float64)
    return not bool(np.all(values == np.round(values)))


@dataclass(frozen=True)
class Domain:
    """The operands (positions) of an op that must lie in ``values``, where ``applies``."""

    operands: tuple[int, ...]
    values: str
    applies: Callable[[Node], bool] = _always


# op -> where its operands lie in real data (each row: why values outside are not real data)
DOMAINS: dict[str, Domain] = {
    LOG: Domain((0,), POSITIVE),  # NaN below 0, -inf at 0: a log reads a probability, a norm
    SQRT: Domain((0,), POSITIVE),  # NaN below 0: a sqrt reads a variance or a sum of squares
    RSQRT: Domain((0,), POSITIVE),  # as sqrt, and inf at 0: a norm's 1/sqrt(var + eps)
    POW: Domain((0,), POSITIVE, _fractional_exponent),  # NaN for a negative base, whole
    # exponents aside (x ** 2 of any x is a number)
    XLOGY: Domain((1,), POSITIVE),  # x * log(y): y as log's operand
}

# ops whose result is never negative whatever they read: a domain needs nothing of their inputs
NONNEGATIVE = frozenset({EXP, ABS, SQUARE, SQRT, RSQRT, SIGMOID, SOFTPLUS, SOFTMAX})
# ops whose result is positive when every input is: a domain asks it of their inputs in turn
KEEPS_POSITIVE = frozenset({ADD, MUL, DIV, MAXIMUM, MINIMUM, RECIPROCAL, SUM, MEAN, MAX, MIN,
                            RESHAPE, PERMUTE, EXPAND, SLICE, CONCAT, CAST, COPY_TO})


def _positive(values: np.ndarray) -> bool:
    return bool(np.all(values > 0))


def _nonnegative(values: np.ndarray) -> bool:
    return bool(np.all(values >= 0))


def _any(values: np.ndarray) -> bool:
    return True


# op -> the constant operands after which positive other operands still give a positive
# result (each row: why a constant outside them leaves some lanes <= 0 whatever is drawn);
# a ``KEEPS_POSITIVE`` op without a row reads no constants in practice and asks ``_positive``
CONSTANT_KEEPS: dict[str, Callable[[np.ndarray], bool]] = {
    ADD: _nonnegative,  # x + c with c < 0 is negative for 0 < x < -c
    MUL: _positive,  # x * c with c <= 0 is <= 0 for every positive x
    DIV: _positive,  # x / c and c / x with c <= 0 are <= 0 (inf, NaN at 0) for x > 0
    MINIMUM: _positive,  # min(x, c) is c wherever x exceeds it
    CONCAT: _positive,  # the constant's lanes are in the result as they are
    MAXIMUM: _any,  # max(x, c) >= x: a positive x is enough
}
# single-operand ops a constant may sit under (``x * expand(c)``) that keep its values' signs
_CONSTANT_WRAPPERS = frozenset({RESHAPE, PERMUTE, EXPAND, SLICE, CAST, COPY_TO})


def _constant_values(node: Node, args: set[Node]) -> np.ndarray | None:
    """The values of ``node`` where it is a constant (under reshapes, casts, ...), else None
    (an argument is drawn, whatever it is made of)."""
    while node.op.name in _CONSTANT_WRAPPERS and node.inputs and node not in args:
        node = node.inputs[0]
    if node.op.name != CONSTANT or node in args:
        return None
    return np.asarray(node.attrs["value"].array, dtype=np.float64)


def input_domains(root: Node, arguments: Collection[Node]) -> dict[Node, str]:
    """The arguments of the computation ``root`` (read from ``arguments``) to draw in a
    domain other than normal values: each operand an op of ``DOMAINS`` reads is traced back
    through ``KEEPS_POSITIVE`` ops to the arguments it is made of. An operand made otherwise
    (``x - 3``, ``-x``) is left as it is: no draw of the arguments puts it in the domain."""
    args = set(arguments)
    found: dict[Node, str] = {}
    seen: set[Node] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node in seen or node in args:
            continue
        seen.add(node)
        stack.extend(node.inputs)
        row = DOMAINS.get(node.op.name)
        if row is not None and row.applies(node):
            for k in row.operands:
                if k < len(node.inputs):
                    _require(node.inputs[k], row.values, args, found)
    return found


def _require(node: Node, values: str, args: set[Node], found: dict[Node, str]) -> None:
    """Mark the arguments ``node`` is made of as drawn in ``values`` where that puts it
    there: the trace stops at an op whose constant operand keeps its result out of the
    domain (``x * -2``, ``x + -3``), where a positive draw puts every lane, or most, outside."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in args:
            found[n] = values
        elif n.op.name in NONNEGATIVE or (n.op.name == MUL and n.inputs[0] is n.inputs[1]):
            continue  # never negative already (x * x is a square)
        elif n.op.name in KEEPS_POSITIVE:
            constants = [_constant_values(i, args) for i in n.inputs]
            keeps = CONSTANT_KEEPS.get(n.op.name, _positive)
            if all(c is None or keeps(c) for c in constants):
                stack.extend(i for i, c in zip(n.inputs, constants, strict=True) if c is None)
            # else: a constant puts lanes <= 0 whatever the draw (x * -2): normal values,
            # which at least leave half the lanes in the domain


__all__ = ["CONSTANT_KEEPS", "DOMAINS", "KEEPS_POSITIVE", "NONNEGATIVE", "POSITIVE", "Domain",
           "input_domains"]
