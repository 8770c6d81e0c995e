"""Reverse mode: ``tg.grad(loss, wrt)`` builds the gradient graphs from the rule tables of
``grad_rules``.

The sweep walks the graph as built, in reverse topological order, as tinygrad's
``gradient.py`` does: each node's cotangents from its users are summed, its rule hands one to
each input, and only nodes on a path to an entry of ``wrt`` are visited. Composites stay in
the forward as they are. One with its own rule (softmax, log_softmax, layer_norm, rms_norm,
attention) uses it, reading the forward's output instead of re-deriving it through exp/sum/div;
any other is differentiated by sweeping its decomposition down to its inputs, so the backward
recomputes only what the rules read and the forward keeps the node a fused kernel may run.
Only float values carry cotangents: an int or bool result (an index, a mask) stops the flow,
and so does ``stop_gradient`` (declared in ``NON_DIFFERENTIABLE``: its decomposition, the
identity, is never swept), the mark torch's ``detach`` and ``no_grad`` import as.
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
    found = _sweep(outs, seeds, set(wrt_list))
    out = []
    for w in wrt_list:
        g = found.get(w)
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


def _sweep(outs: list[Node], seeds: list[Node], targets: set[Node],
           stop: frozenset = frozenset()) -> dict[Node, Node]:
    """The cotangents of ``targets`` given the outputs' ``seeds``; ``stop`` bounds the graph
    (a composite's inputs, when its decomposition is swept)."""
    order = nodes(outs, stop=stop)
    needed: set[Node] = set()
    for n in order:  # on a path to a target: the only nodes whose cotangent matters
        if n in targets or (n not in stop and n.op.name not in NON_DIFFERENTIABLE
                            and any(i in needed for i in n.inputs)):
            needed.add(n)  # (no path runs through an op that passes no cotangent)
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
        if n.op.is_leaf or n in stop:
            continue
        for i, gi in zip(n.inputs, _input_cotangents(n, g, needed)):
            if gi is not None and i in needed and i.dtype.is_float:
                _accumulate(cotangent, i, gi)
    return found


def _input_cotangents(n: Node, g: Node, needed: set[Node]) -> tuple:
    """A composite without its own rule: its decomposition swept down to its inputs, so the
    forward keeps the composite node (a fused kernel may run it) and the backward recomputes
    only what the rules read."""
    if n.op.kind == COMPOSITE and n.op.name not in COMPOSITE_VJP \
            and n.op.name not in NON_DIFFERENTIABLE:
        inner = expand_composite(n.op, n.inputs, n.attrs)
        wanted = {i for i in n.inputs if i in needed and i.dtype.is_float}
        found = _sweep([inner], [g], wanted, frozenset(n.inputs))
        return tuple(found.get(i) for i in n.inputs)
    return _rule(n)(n, g)


def _rule(n: Node):
    name = n.op.name
    if name in NON_DIFFERENTIABLE:  # a composite too: stop_gradient
        return lambda y, g: (None,) * len(y.inputs)
    if n.op.kind == COMPOSITE:
        return COMPOSITE_VJP[name]
    if name in VJP:
        return VJP[name]
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
