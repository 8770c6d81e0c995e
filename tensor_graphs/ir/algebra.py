"""Algebraic facts about ops that canonical form, matching, rules and the passes share: which
binary ops are commutative, which are also associative, and how to flatten and rebuild their
chains; which atomic ops work element by element, and which views are strided."""

from __future__ import annotations

from collections.abc import Sequence

from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.atomic import BINARY, UNARY
from tensor_graphs.ir.ops.names import (
    ADD,
    CAST,
    EQUAL,
    ERFC,
    EXPAND,
    MAXIMUM,
    MUL,
    PERMUTE,
    SLICE,
    WHERE,
)

ASSOCIATIVE_COMMUTATIVE = frozenset({ADD, MUL, MAXIMUM})
COMMUTATIVE = ASSOCIATIVE_COMMUTATIVE | {EQUAL}
# atomic ops computed element by element with broadcasting (sinking and C fusion cross them);
# of the special functions erfc alone: gelu's decomposition has it, so fusion renders it
ELEMENTWISE = frozenset({*UNARY, *BINARY, WHERE, CAST, ERFC})
# views whose result is usually not dense (a consumer that needs dense input copies)
STRIDED_VIEWS = frozenset({PERMUTE, SLICE, EXPAND})


def chain_terms(node: Node, stop=()) -> list[Node]:
    """The operands of the maximal same-op chain rooted at an associative-commutative node,
    left to right: ``(a + b) + (c + d)`` gives ``[a, b, c, d]``. Iterative, so long chains work.
    A child joins the chain when it is the same op with the same dtype (casts end chains) and
    is not in ``stop`` (a region's boundary)."""
    op = node.op.name
    terms: list[Node] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if n is node or (n.op.name == op and n.dtype == node.dtype and n not in stop):
            stack.extend(reversed(n.inputs))
        else:
            terms.append(n)
    return terms


def build_chain(op: str, terms: Sequence[Node]) -> Node:
    """A left-deep binary chain ``((t0 op t1) op t2) ...`` with the builder's rules."""
    from tensor_graphs.ir import builder

    fn = {ADD: builder.add, MUL: builder.mul, MAXIMUM: builder.maximum}[op]
    out = terms[0]
    for t in terms[1:]:
        out = fn(out, t)
    return out
