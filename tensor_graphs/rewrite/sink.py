"""Reshapes sink below pointwise ops: ``f(reshape(x)) -> reshape(f(x))``.

An imported model often reshapes a matrix product before its activation: GPT-2's Conv1D is
``addmm(b, h.view(-1, d), W).view(batch, seq, n)`` and its MLP applies GELU to that view. The
fused GEMM kernels match ``gelu(matmul(x, w) + b)``, which the reshape hides. Moved below the
activation, the reshape meets the next layer's ``view(-1, n)`` and the two merge (or vanish,
``pm_movement``), so the GEMM, its bias and its activation become one kernel. A reshape is a
view: moving it costs nothing.

An op commutes with every reshape when it is *pointwise* in its one tensor input: an atomic
unary op or cast, or a composite whose decomposition uses only elementwise atomic ops of that
input and single-element constants (read from the decomposition, the op's one definition).

A binary elementwise op commutes too when its other operand has the full result shape (no
broadcast): ``f(reshape(x), y) -> reshape(f(x, reshape(y, x.shape)))``. GPT-2's residual add
is ``h + addmm(...).view(batch, seq, n)``; sunk, the add reads the product and fuses into its
GEMM's epilogue (``c_packed_matmul_bias_add``), and the residual stream's views merge. Only a
reshape that adds axes sinks this way (the inverse view on ``y`` removes them, so the rule
cannot fire back), and only past a ``y`` that is not a strided view (permute, slice, expand:
its reshape would copy).
"""

from __future__ import annotations

from tensor_graphs.ir import builder
from tensor_graphs.ir.algebra import ELEMENTWISE, STRIDED_VIEWS
from tensor_graphs.ir.node import Node, expand_composite
from tensor_graphs.ir.ops.atomic import BINARY
from tensor_graphs.ir.ops.names import CONSTANT, RESHAPE
from tensor_graphs.rewrite import pattern as pat
from tensor_graphs.rewrite.simplify import pm_movement

_pointwise_cache: dict[tuple, bool] = {}

# Attributes that name axes or sizes of the input: an op carrying one is tied to its input's
# rank and shape, so it cannot move to the other side of a reshape even where its
# decomposition happens to be elementwise (``prod`` over an axis of size 1, a 0-d tensor
# made 1-d: on the 0-d tensor that axis does not exist).
_SHAPE_ATTRS = frozenset({"axis", "axes", "dim", "dims", "perm", "shape", "size", "reps",
                          "kernel_size", "output_size", "diagonal"})


def pointwise(node: Node) -> bool:
    """``node`` applies one function to each element of its single tensor input."""
    if node.op.is_leaf or len(node.inputs) != 1 or node.shape != node.inputs[0].shape:
        return False
    if node.op.is_atomic:
        return node.op.name in ELEMENTWISE
    if _SHAPE_ATTRS.intersection(node.attrs):
        return False
    key = (node.op.name, node.attrs, node.dtype, node.inputs[0].dtype)
    if key not in _pointwise_cache:
        _pointwise_cache[key] = _decomposes_pointwise(node)
    return _pointwise_cache[key]


def _decomposes_pointwise(node: Node) -> bool:
    """Every node between the decomposition's result and the input is elementwise."""
    x = node.inputs[0]
    stack, seen, reached = [expand_composite(node.op, node.inputs, node.attrs)], set(), False
    while stack:
        n = stack.pop()
        if n is x:
            reached = True
            continue
        if n in seen:
            continue
        seen.add(n)
        if not n.op.is_atomic:  # a composite inside: its own decomposition
            stack.append(expand_composite(n.op, n.inputs, n.attrs))
            continue
        if n.op.name == CONSTANT:
            if n.attrs["value"].array.size != 1:
                return False
        elif n.op.name not in ELEMENTWISE:
            return False
        stack.extend(n.inputs)
    return reached


def _sink(u: Node) -> Node:
    x = u.inputs[0].inputs[0]
    return builder.reshape(Node.make(u.op, (x,), u.attrs), u.shape)


def _sinkable_side(u: Node) -> int | None:
    """Which operand of ``u`` is a reshape that adds axes with a full, non-strided operand on
    the other side (both of the result's shape: no broadcast), or None."""
    if not (u.op.is_atomic and u.op.name in BINARY and len(u.inputs) == 2):
        return None
    for side, (p, q) in enumerate((u.inputs, u.inputs[::-1])):
        if (p.op.name == RESHAPE and len(p.inputs[0].shape) < len(p.shape)
                and p.shape == u.shape == q.shape and q.op.name not in STRIDED_VIEWS):
            return side
    return None


def _sinks_binary(u: Node) -> bool:
    return _sinkable_side(u) is not None


def _sink_binary(u: Node) -> Node:
    side = _sinkable_side(u)
    x = u.inputs[side].inputs[0]
    other = builder.reshape(u.inputs[1 - side], x.shape)
    operands = (x, other) if side == 0 else (other, x)
    return builder.reshape(Node.make(u.op, operands, u.attrs), u.shape)


pm_sink = pat.RuleTable("sink", [
    # f(reshape(x)) -> reshape(f(x)) for a pointwise f
    pat.rule(pat.var("u", where=lambda u: pointwise(u) and u.inputs[0].op.name == RESHAPE),
             _sink),
    # f(reshape(x), y) -> reshape(f(x, reshape(y))) for an elementwise f and a full y
    pat.rule(pat.var("u", where=_sinks_binary), _sink_binary),
])


def sink_reshapes(outputs, max_steps: int = 10_000):
    """The graph with reshapes moved below pointwise ops and merged where they meet. Returns
    the structure it was given."""
    return pat.apply(outputs, pm_sink + pm_movement, max_steps=max_steps)


__all__ = ["sink_reshapes", "pm_sink", "pointwise"]
