"""Turn the user's graph into the one the planner sees: concrete shapes, simplified.

Kernels' constraints and costs need numbers, so symbolic dims are bound first (to the values of
this call, or to the compile's ``bounds``): every leaf and attribute that mentions a dim is
rebuilt with its value, and hash-consing rebuilds the rest. Then ``tg.simplify`` folds
movement chains, identities and constants, and ``recompose`` folds composites a model spelled
out by hand (RMSNorm as pow/mean/rsqrt) back into their op, so fused kernels match them;
``sink_reshapes`` moves reshapes below pointwise ops (a GEMM's activation after a view).
Leaves keep their names, so feeds still match.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy

from tensor_graphs.ir.graph import nodes
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.shapes import dim_symbol, free_symbols, resolve
from tensor_graphs.rewrite.recompose import recompose
from tensor_graphs.rewrite.simplify import simplify
from tensor_graphs.rewrite.sink import sink_reshapes


def symbols(outputs: Sequence[Node]) -> set[sympy.Symbol]:
    """The symbolic dims the graph's shapes and attributes mention."""
    found: set[sympy.Symbol] = set()
    for n in nodes(list(outputs)):
        found |= free_symbols(tuple(n.shape))
        for v in n.attrs.values():
            if isinstance(v, (sympy.Basic, tuple)):
                found |= free_symbols(v)
    return found


def as_symbols(dims: Mapping) -> dict[sympy.Symbol, int]:
    return {(k if isinstance(k, sympy.Symbol) else dim_symbol(str(k))): int(v)
            for k, v in dims.items()}


def specialize(outputs: Sequence[Node], dims: Mapping) -> list[Node]:
    """The graph with every symbolic dim replaced by its value in ``dims``."""
    mapped = specialize_map(outputs, as_symbols(dims))
    return [mapped[o] for o in outputs]


def specialize_map(roots: Sequence[Node], dims: Mapping, memo: dict | None = None
                   ) -> dict[Node, Node]:
    """Each node under ``roots`` -> its version with ``dims`` (symbol -> int) substituted.
    ``memo`` carries earlier results: the walk stops at nodes it already has."""
    mapped = {} if memo is None else memo
    stack: list[tuple[Node, bool]] = [(r, False) for r in roots]
    while stack:
        n, ready = stack.pop()
        if n in mapped:
            continue
        if not ready:
            stack.append((n, True))
            stack.extend((i, False) for i in n.inputs if i not in mapped)
            continue
        attrs = {k: resolve(v, dims) if isinstance(v, (sympy.Basic, tuple)) else v
                 for k, v in n.attrs.items()}
        inputs = tuple(mapped[i] for i in n.inputs)
        same = inputs == n.inputs and all(attrs[k] is v or attrs[k] == v
                                         for k, v in n.attrs.items())
        mapped[n] = n if same else Node.make(n.op, inputs, attrs, n.name)
    return mapped


def prepare(outputs: Sequence[Node], dims: Mapping) -> list[Node]:
    """Concrete shapes, then simplified and recomposed: what the planner plans."""
    return list(sink_reshapes(recompose(simplify(specialize(outputs, dims)))))


def prepare_symbolic(outputs: Sequence[Node]) -> list[Node]:
    """Simplified with its symbolic dims kept: planned once for bounds, run for any values up
    to them."""
    return list(sink_reshapes(recompose(simplify(list(outputs)))))
