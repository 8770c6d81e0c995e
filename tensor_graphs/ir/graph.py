"""Walking graphs: topological order, leaves, full or one-level decomposition, printing.

Every walk is iterative (an explicit stack), so a 2,000-layer chain needs no recursion.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence

import sympy

from tensor_graphs.errors import FeedError, StateError, TensorGraphsError
from tensor_graphs.ir.node import COMPOSITE, Node, expand_composite
from tensor_graphs.ir.ops.names import CONSTANT, DIM, INPUT, STATE, STATE_UPDATE, WEIGHT
from tensor_graphs.ir.shapes import format_shape, free_symbols, resolve

FED_LEAVES = (INPUT, WEIGHT, STATE)  # named leaves: values from outside the graph


def _as_list(outputs) -> list[Node]:
    if isinstance(outputs, Node):
        return [outputs]
    out = list(outputs)
    for o in out:
        if not isinstance(o, Node):
            raise TensorGraphsError(f"expected graph nodes as outputs, got {type(o).__name__}")
    return out


STATIC_LEAVES = (WEIGHT, CONSTANT, DIM)  # leaf kinds fixed for one weight binding


def nodes(*outputs: Node | Iterable[Node], stop: Container[Node] = ()) -> list[Node]:
    """All nodes the outputs depend on, leaves included, inputs before users (deterministic).
    A node in ``stop`` is listed but not entered (what it reads is left out unless reached
    another way): the walks above a boundary (a composite's inputs, a rewrite's placeholders)."""
    roots: list[Node] = []
    for o in outputs:
        roots.extend(_as_list(o))
    order: list[Node] = []
    seen: set[int] = set()
    for root in roots:
        if id(root) in seen:
            continue
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            if node in stop:
                continue
            for child in reversed(node.inputs):
                if id(child) not in seen:
                    stack.append((child, False))
    return order


_STATIC: dict[Node, bool] = {}  # is_static's answers per node (cleared past 200,000)


def is_static(node: Node, inputs_static: bool | None = None) -> bool:
    """Whether ``node``'s value is fixed for one weight binding: a weight, constant or dim
    leaf, or a value computed from such values alone, none of them depending on the call's
    dims (``iota(seq)`` and ``tg.size("seq")`` change with the call's length). A program
    computes a static value once per binding and keeps it with the weights. The one rule of the
    planner (a kernel that prepares a weight at bind time is offered only for static ones),
    the memory plan (what is held with the weights, not in the arena) and the runtime (its
    prelude, which it takes from the memory plan). ``inputs_static``: whether the values a
    plan computes ``node`` from are static, when those are not its graph inputs (a fused
    step reads its region's inputs); then only ``node``'s own dims are checked here."""
    if node.op.is_leaf:
        return node.op.name in STATIC_LEAVES and not _mentions_dims(node)
    if inputs_static is not None:
        return inputs_static and not _mentions_dims(node)
    found = _STATIC.get(node)
    if found is not None:
        return found
    for n in nodes(node, stop=_STATIC):  # inputs first; known nodes are not entered again
        if n not in _STATIC:
            _STATIC[n] = not _mentions_dims(n) and (
                n.op.name in STATIC_LEAVES if n.op.is_leaf else all(_STATIC[i] for i in n.inputs))
    found = _STATIC[node]
    if len(_STATIC) > 200_000:
        _STATIC.clear()
    return found


def _mentions_dims(node: Node) -> bool:
    """Whether the node's shape or an attribute holds a symbolic dim."""
    return bool(free_symbols(tuple(node.shape))) or any(free_symbols(v)
                                                        for v in node.attrs.values())


def leaves(outputs, kinds: tuple[str, ...] = FED_LEAVES) -> list[Node]:
    """The named leaves the outputs need, checked for clashing names and forked states."""
    order = nodes(outputs)
    found: dict[str, Node] = {}
    for n in order:
        if n.op.name in kinds:
            other = found.setdefault(n.name, n)
            if other is not n:
                raise FeedError(
                    f"two different leaves are named '{n.name}': {other.op.name} "
                    f"{format_shape(other.shape)} {other.dtype.name} and {n.op.name} "
                    f"{format_shape(n.shape)} {n.dtype.name}; give them distinct names")
    _check_state_versions(order)
    return list(found.values())


def _check_state_versions(order: list[Node]) -> None:
    """A state's versions form one chain: no version is updated twice."""
    updated: dict[int, Node] = {}
    for n in order:
        if n.op.name == STATE_UPDATE:
            prior = updated.setdefault(id(n.inputs[0]), n)
            if prior is not n:
                raise StateError(
                    f"state '{root_state(n).name}' forks: one version is updated twice; "
                    "chain the updates (update the version the first update returned)")


def root_state(node: Node) -> Node:
    while node.op.name == STATE_UPDATE:
        node = node.inputs[0]
    return node


def decompose(outputs, depth: int | None = None):
    """Expand composite ops into their decompositions: fully (the default) or ``depth`` levels.

    Returns the same structure it was given (one node or a list of nodes).
    """
    single = isinstance(outputs, Node)
    outs = _as_list(outputs)
    level = 0
    while depth is None or level < depth:
        order = nodes(outs)
        if not any(n.op.kind == COMPOSITE for n in order):
            break
        mapping: dict[Node, Node] = {}
        for n in order:
            new_inputs = tuple(mapping[i] for i in n.inputs)
            if n.op.kind == COMPOSITE:
                mapping[n] = expand_composite(n.op, new_inputs, n.attrs)
            elif new_inputs == n.inputs:
                mapping[n] = n
            else:
                mapping[n] = Node.make(n.op, new_inputs, n.attrs, n.name)
        outs = [mapping[o] for o in outs]
        level += 1
    return outs[0] if single else outs


def format_graph(*outputs: Node) -> str:
    """A readable listing: one line per node, ``%3 = add(%1, %2) : (batch, 64) float32``."""
    order = nodes(*outputs)
    ids = {n: i for i, n in enumerate(order)}
    lines = []
    for n in order:
        head = f"%{ids[n]} = {n.op.name}"
        if n.name is not None:
            head += f" {n.name!r}"
        args = ", ".join(f"%{ids[i]}" for i in n.inputs)
        attrs = ", ".join(f"{k}={v}" for k, v in n.attrs.items()
                          if not (n.op.is_leaf and k in ("shape", "dtype")))
        inner = ", ".join(p for p in (args, attrs) if p)
        call = f"({inner})" if inner or not n.op.is_leaf else ""
        lines.append(f"{head}{call} : {format_shape(n.shape)} {n.dtype.name}")
    outs = [f"%{ids[o]}" for out in outputs for o in _as_list(out)]
    lines.append(f"return {', '.join(outs)}")
    return "\n".join(lines)


def substitute(outputs, replacements: dict[Node, Node]):
    """The graph with each key of ``replacements`` replaced by its value; every node above a
    replaced one is rebuilt (hash-consing shares the rest). Returns the structure it was given."""
    single = isinstance(outputs, Node)
    outs = _as_list(outputs)
    mapped: dict[Node, Node] = {}
    for n in nodes(outs):
        if n in replacements:
            mapped[n] = replacements[n]
            continue
        new_inputs = tuple(mapped[i] for i in n.inputs)
        mapped[n] = n if new_inputs == n.inputs else Node.make(n.op, new_inputs, n.attrs, n.name)
    return mapped[outs[0]] if single else [mapped[o] for o in outs]


def use_counts(outputs) -> dict[Node, int]:
    """How many times each node is an input of another node (outputs count once more)."""
    outs = _as_list(outputs)
    counts: dict[Node, int] = {}
    for n in nodes(outs):
        counts.setdefault(n, 0)
        for i in n.inputs:
            counts[i] = counts.get(i, 0) + 1
    for o in outs:
        counts[o] += 1
    return counts


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
