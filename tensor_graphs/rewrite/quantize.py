"""``tg.quantize``: a graph's matmul/linear weights rewritten to a low-precision scheme.

Why a rewrite and not a kernel option: quantizing changes the numbers, so it is the user's
choice of model, not the planner's choice of how to compute one. The rewritten graph says
exactly what is computed (its float64 reference is the quantized model's), and the planner
then chooses kernels for it under the tolerance as for any graph: a quantized kernel's
measured error is against that reference.

A weight here is a float ``tg.weight`` leaf of rank 2 read by a product as its right operand:
``a @ w`` (w (K, N)) or ``linear(x, w, b)`` (w (N, K), torch's layout). Each becomes
``a @ dequantize(quantize(w', s), s)`` (int8-dynamic: ``dynamic_quant(a) @ ...``, the rows
of ``a`` quantized at run time, each with its own scale) with ``w'`` the (K, N) view
(``permute(w)`` for a linear) and ``s = quant_scale(w', axis=0)``, one scale per output
channel. ``quantize`` and ``quant_scale`` read weights only, so the runtime computes them
once per binding (the prelude, ``ir.graph.is_static``) from the float weights the user
binds; a kernel matching
``a @ dequantize(q, s)`` then packs ``q`` once more at bind time. Other readers of the same
weight keep the float tensor: GPT-2's tied embedding still gathers float rows while its LM
head reads int8.

``skip``: weight names (``fnmatch`` patterns) left in float, e.g. ``["lm_head.weight"]``.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from tensor_graphs.errors import ArgumentError
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.graph import nodes
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import DYNAMIC_QUANT, LINEAR, MATMUL, WEIGHT

# scheme -> (what it does to one (K, N) weight view (the product's right operand), what it
# does to the activation (the left operand))
SCHEMES = {
    # symmetric int8, one scale per output channel (column of the (K, N) view)
    "int8-weight": (lambda w: tg.dequantize(*_int8(w)), lambda a: a),
    # the same weights, and each activation row quantized at run time with its own scale:
    # the product is int8 x int8 summed in int32, times both scales
    "int8-dynamic": (lambda w: tg.dequantize(*_int8(w)), lambda a: tg.dynamic_quant(a)),
    # bfloat16 storage: w rounded to bfloat16 (to nearest even), a float result
    "bf16-weight": (lambda w: tg.bf16_round(w), lambda a: a),
}


def _int8(w: Node) -> tuple[Node, Node]:
    s = tg.quant_scale(w, axis=0)
    return tg.quantize(w, s), s


def _weight(node: Node, skip) -> bool:
    """A float weight leaf of rank 2 whose name no ``skip`` pattern matches."""
    return (node.op.name == WEIGHT and node.ndim == 2 and node.dtype.is_float
            and not any(fnmatchcase(node.name, p) for p in skip))


def _float(a: Node) -> bool:
    """An activation a scheme may quantize: float, with a row (rank >= 1)."""
    return a.dtype.is_float and a.ndim >= 1


def _own(a: Node, w: Node) -> Node:
    """The activation as this product reads it; a run-time quantization gets a node of its
    own, named after the weight (``<weight>:rows``). Why: products of one input (attention's
    q, k and v) would otherwise share one ``dynamic_quant`` node, and a kernel may fuse a node
    only when nothing else reads it, so each would run as a float GEMM on the shared
    quantize-dequantize's float result; quantizing the rows once per product costs O(rows x K)
    against the product's O(rows x K x N)."""
    if a.op.name != DYNAMIC_QUANT:
        return a
    return Node.make(a.op, a.inputs, a.attrs, f"{w.name}:rows")


def quantize(outputs, scheme="int8-weight", *, skip=()):
    """``outputs`` (a node, or a list/tuple/dict of nodes) with the weights of their matmuls
    and linears in ``scheme`` (``SCHEMES``); returns the same structure. Weights named by a
    ``skip`` pattern stay float.

    ``tg.quantize(x, scale)`` with a node as the second argument is the ``quantize`` op
    (``ir/ops/quant.py``): one public name for the op and for the rewrite that writes it."""
    if isinstance(scheme, Node):
        return tg.quantize(outputs, scheme)
    if scheme not in SCHEMES:
        raise ArgumentError(f"quantize: unknown scheme {scheme!r}; known: {sorted(SCHEMES)}")
    if isinstance(skip, str):
        skip = (skip,)
    make, act = SCHEMES[scheme]
    if isinstance(outputs, dict):
        keys, outs = list(outputs), list(outputs.values())
    elif isinstance(outputs, Node):
        keys, outs = None, [outputs]
    else:
        keys, outs = None, list(outputs)
    for o in outs:
        if not isinstance(o, Node):
            raise ArgumentError(f"quantize: needs graph nodes (a tg.compile'd program is "
                                f"quantized by quantizing its graph first), got "
                                f"{type(o).__name__}")
    mapped: dict[Node, Node] = {}  # old node -> its rewritten graph, inputs first
    for n in nodes(outs):
        ins = tuple(mapped[i] for i in n.inputs)
        if n.op.name == MATMUL and _weight(ins[1], skip) and _float(ins[0]):
            mapped[n] = tg.matmul(_own(act(ins[0]), ins[1]), make(ins[1]))
        elif n.op.name == LINEAR and len(ins) >= 2 and _weight(ins[1], skip) \
                and _float(ins[0]):
            y = tg.matmul(_own(act(ins[0]), ins[1]), make(tg.transpose(ins[1], 0, 1)))
            mapped[n] = y if len(ins) < 3 else y + ins[2]
        else:
            mapped[n] = n if ins == n.inputs else Node.make(n.op, ins, n.attrs, n.name)
    new = [mapped[o] for o in outs]
    if keys is not None:
        return dict(zip(keys, new))
    if isinstance(outputs, Node):
        return new[0]
    return type(outputs)(new) if isinstance(outputs, tuple) else list(new)


def quantized_weights(outputs) -> list[str]:
    """Names of the weights ``outputs`` read through ``quantize`` (for reports)."""
    from tensor_graphs.ir.ops.names import QUANTIZE
    found = []
    for n in nodes(outputs if isinstance(outputs, (list, tuple)) else [outputs]):
        if n.op.name == QUANTIZE:
            found += [leaf.name for leaf in nodes([n.inputs[0]]) if leaf.op.name == WEIGHT]
    return sorted(set(found))
