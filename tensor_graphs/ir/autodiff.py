"""Reverse mode: ``tg.grad(loss, wrt)`` builds the gradient graphs from the rule tables of
``grad_rules``.

Composites stay whole where they carry their own rule (softmax, log_softmax, layer_norm,
rms_norm), so the backward reads the forward's output instead of re-deriving it through
exp/sum/div; every other composite is first replaced by its decomposition (hash-consed, so
the gradient shares the forward's nodes). The sweep then walks the nodes in reverse
topological order, as tinygrad's ``gradient.py`` does: each node's cotangents from its users
are summed, its rule hands one to each input, and only nodes on a path to an entry of ``wrt``
are visited. Only float values carry cotangents: an int or bool result (an index, a mask)
stops the flow.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tensor_graphs.errors import ArgumentError, ShapeError
from tensor_graphs.ir import builder as tg
from tensor_graphs.ir.grad_rules import COMPOSITE_VJP, NON_DIFFERENTIABLE, VJP, zeros
from tensor_graphs.ir.graph import _as_list, nodes
from tensor_graphs.ir.node import COMPOSITE, Node, expand_composite
from tensor_graphs.ir.shapes import dims_equal, format_shape


def grad(outputs: Node | Sequence[Node], wrt: Node | Sequence[Node],
         seed: object = None) -> list[Node]:
    """The gradient of ``outputs`` with respect to each node of ``wrt``: one graph per entry,
    of that entry's shape and dtype (zeros where the outputs do not depend on it).

    ``outputs`` is a scalar loss, or any float nodes with ``seed``: their cotangents (a node or
    array per output, of its shape), giving the vector-Jacobian product ``seed . d outputs``.
    """
    outs = _as_list(outputs)
    wrt_list = [wrt] if isinstance(wrt, Node) else list(wrt)
    seeds = _seeds(outs, seed)
    for w in wrt_list:
        if not isinstance(w, Node):
            raise ArgumentError(f"grad: wrt must hold graph nodes, got {type(w).__name__}")
        if not w.dtype.is_float:
            raise ArgumentError(f"grad: cannot differentiate with respect to {w!r}: its dtype "
                                f"{w.dtype.name} is not a float dtype (indices and masks have no "
                                f"gradient); leave it out of wrt or make it a float tensor")
    lowered, mapping = _lower(outs)
    targets = {mapping[w] for w in wrt_list if w in mapping}
    found = _sweep(lowered, seeds, targets)
    out = []
    for w in wrt_list:
        g = found.get(mapping.get(w))
        out.append(zeros(w.shape, w.dtype) if g is None else g)
    return out


def _seeds(outs: list[Node], seed) -> list[Node]:
    for o in outs:
        if not o.dtype.is_float:
            raise ArgumentError(f"grad: the output {o!r} is {o.dtype.name}; only float outputs "
                                f"have gradients (cast it to a float dtype)")
    if seed is None:
        for o in outs:
            if o.ndim:
                raise ShapeError(f"grad: the output {o!r} has shape {format_shape(o.shape)}, not "
                                 f"a scalar; reduce it (loss.sum(), loss.mean()) or pass seed= "
                                 f"(a cotangent of that shape)")
        return [tg.constant(1.0, o.dtype) for o in outs]
    given = [seed] if isinstance(seed, (Node, np.ndarray, float, int)) else list(seed)
    if len(given) != len(outs):
        raise ArgumentError(f"grad: {len(outs)} output(s) but {len(given)} seed(s); give one "
                            f"cotangent per output")
    result = []
    for o, s in zip(outs, given):
        s = tg.cast(tg.as_node(s, o.dtype), o.dtype)
        if s.ndim == 0 and o.ndim:
            s = tg.expand(s, o.shape)
        if s.ndim != o.ndim or not all(dims_equal(a, b) for a, b in zip(s.shape, o.shape)):
            raise ShapeError(f"grad: the seed {format_shape(s.shape)} must have the output's "
                             f"shape {format_shape(o.shape)} ({o!r})")
        result.append(s)
    return result


def _lower(outs: list[Node]) -> tuple[list[Node], dict[Node, Node]]:
    """The graph with every composite lacking its own rule replaced by its decomposition
    (repeatedly), and each original node's image in it."""
    mapping: dict[Node, Node] = {}
    for n in nodes(outs):
        mapping[n] = _lower_node(n, tuple(mapping[i] for i in n.inputs), mapping)
    return [mapping[o] for o in outs], mapping


def _lower_node(n: Node, inputs: tuple[Node, ...], cache: dict) -> Node:
    if n.op.kind == COMPOSITE and n.op.name not in COMPOSITE_VJP:
        inner = expand_composite(n.op, inputs, n.attrs)
        sub: dict[Node, Node] = {}
        for m in nodes(inner):  # the decomposition may hold composites of its own
            sub[m] = _lower_node(m, tuple(sub[i] for i in m.inputs), cache)
        return sub[inner]
    if inputs == n.inputs:
        return n
    return Node.make(n.op, inputs, n.attrs, n.name)


def _sweep(outs: list[Node], seeds: list[Node], targets: set[Node]) -> dict[Node, Node]:
    order = nodes(outs)
    needed: set[Node] = set()
    for n in order:  # on a path to a target: the only nodes whose cotangent matters
        if n in targets or any(i in needed for i in n.inputs):
            needed.add(n)
    cotangent: dict[Node, Node] = {}
    for o, s in zip(outs, seeds):
        _accumulate(cotangent, o, s)
    found: dict[Node, Node] = {}
    for n in reversed(order):
        g = cotangent.pop(n, None)
        if g is None or n not in needed:
            continue
        if n in targets:
            found[n] = g
        if n.op.is_leaf:
            continue
        for i, gi in zip(n.inputs, _rule(n)(n, g)):
            if gi is not None and i in needed and i.dtype.is_float:
                _accumulate(cotangent, i, gi)
    return found


def _rule(n: Node):
    name = n.op.name
    if n.op.kind == COMPOSITE:
        return COMPOSITE_VJP[name]
    if name in VJP:
        return VJP[name]
    if name in NON_DIFFERENTIABLE:
        return lambda y, g: (None,) * len(y.inputs)
    raise ArgumentError(f"grad: the op {name} ({n!r}) has no gradient rule; add one to "
                        f"tensor_graphs/ir/grad_rules.py (VJP) or declare it in "
                        f"NON_DIFFERENTIABLE")


def _accumulate(cotangent: dict[Node, Node], n: Node, g: Node) -> None:
    if g.dtype != n.dtype:
        g = tg.cast(g, n.dtype)
    if g.ndim != n.ndim or not all(dims_equal(a, b) for a, b in zip(g.shape, n.shape)):
        raise ShapeError(f"grad: the rule of {n.op.name} gave a cotangent of shape "
                         f"{format_shape(g.shape)} for {n!r} (a bug in its rule)")
    prior = cotangent.get(n)
    cotangent[n] = g if prior is None else tg.add(prior, g)
