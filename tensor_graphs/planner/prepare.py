"""The first pass of tg.compile (``compiler.py`` runs them all): bind the symbolic dims.

Kernels' constraints and costs need numbers, so symbolic dims are bound first (to the values of
this call): every leaf and attribute that mentions a dim is rebuilt with its value, and
hash-consing rebuilds the rest. A graph planned for ``bounds`` keeps its dims (specialized to
no dims, it is itself) and is costed at the bounds. Also: which dims a graph mentions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import sympy

from tensor_graphs.errors import ArgumentError
from tensor_graphs.ir.graph import nodes, specialize_map
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.shapes import (
    MAX_DIM_INT,
    MAX_DIM_INT_TEXT,
    dim_symbol,
    free_symbols,
)


def symbols(outputs: Sequence[Node]) -> set[sympy.Symbol]:
    """The symbolic dims the graph's shapes and attributes mention."""
    found: set[sympy.Symbol] = set()
    for n in nodes(list(outputs)):
        found |= free_symbols(tuple(n.shape))
        for v in n.attrs.values():
            if isinstance(v, (sympy.Basic, tuple)):
                found |= free_symbols(v)
    return found


def check_dims(dims, where: str, meaning: str = "its largest size", least: int = 1) -> dict:
    """``dims`` as the user gave them (dim name -> value), checked: a mapping whose every value
    is an int of ``least`` to ``MAX_DIM_INT`` (numpy's too). ``as_symbols``'s ``int()`` took
    "8" and 8.5 and left -3 to numpy's bare ValueError deep in planning; each is refused here
    as an ``ArgumentError`` naming ``where`` (the call and parameter), the dim and its value,
    and what is expected (``meaning``: what the value stands for). ``least`` is 1 for a bound
    (the largest size a program takes) and 0 for the size of one call, which may be empty as
    a compiled program's call may (``tg.estimate_memory``, ``tg.paths``)."""
    if dims is None:
        return {}
    if not isinstance(dims, Mapping):
        raise ArgumentError(f"{where}: expected a dict of dim name -> {meaning} (e.g. "
                            f"{{'batch': 8}}), got {type(dims).__name__} {dims!r}")
    checked = {}
    for name, value in dims.items():
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
                or not least <= value <= MAX_DIM_INT:
            raise ArgumentError(
                f"{where}: dim {str(name)!r} is {value!r} ({type(value).__name__}); give "
                f"{meaning} as an int of {least} to {MAX_DIM_INT_TEXT} "
                f"(e.g. {{{str(name)!r}: 8}})")
        checked[name] = int(value)
    return checked


def as_symbols(dims: Mapping) -> dict[sympy.Symbol, int]:
    return {(k if isinstance(k, sympy.Symbol) else dim_symbol(str(k))): int(v)
            for k, v in dims.items()}


def specialize(outputs: Sequence[Node], dims: Mapping) -> list[Node]:
    """The graph with every symbolic dim replaced by its value in ``dims``."""
    if not dims:
        return list(outputs)
    mapped = specialize_map(outputs, as_symbols(dims))
    return [mapped[o] for o in outputs]
