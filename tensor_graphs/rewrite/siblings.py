"""Sibling products fused: several products of one activation by static weights become one.

A transformer projects one activation several times: BERT's and Llama's Q, K and V, Llama's
SwiGLU gate and up. Each is a GEMM (a GEMV in decode) reading the same rows; one GEMM over the
weights concatenated along N reads them once, wakes the thread team once and splits a wider
N among the threads. GPT-2 ships its Q, K and V that way (``c_attn``) and its attention reads
them as slices of the one product, so the form after this rewrite is one the kernels already
take: ``linear(x, concat(w_i), concat(b_i))`` (or ``x @ concat(w_i) + concat(b_i)``) and a
slice of its last axis per sibling, a view (the attention kernels read rows by stride).

The concatenated weight reads weights only, so it is static (``ir.graph.is_static``): the
runtime makes it once per binding in the prelude, and the packed GEMM packs it from there
(the three packed weights it replaces are not made; the concatenation itself is not kept
after packing, ``runtime/lower``'s ``kept``). Where a weight is already rewritten
(``tg.quantize``: ``dequantize(quantize(w, s), s)``, ``bf16_round(w)``), the concatenation
goes below the per-column ops, so the fused weight is the scheme applied to the concatenated
weight (per output channel, that is the same numbers) and the quantized kernels still match.

Whether it pays is the planner's question, not this module's: a sibling that had a fused
epilogue of its own (an activation only it applies) loses it, and a reader that wants dense
rows copies its slice. ``tg.compile`` plans the graph with and without this rewrite and runs
the one predicted faster (``compiler.Pipeline``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tensor_graphs.errors import TensorGraphsError
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.graph import is_static, nodes
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import (
    ADD,
    BF16_ROUND,
    CAST,
    DEQUANTIZE,
    DYNAMIC_QUANT,
    LINEAR,
    MATMUL,
    PERMUTE,
    QUANT_SCALE,
    QUANTIZE,
)

# Ops whose output column j depends only on column j of their column-partitioned inputs, so
# op(concat(a_i), concat(b_i)) == concat(op(a_i, b_i)) along that axis: the concatenation of
# rewritten weights moves below them and the rewrite's form survives (the rule per op).
COLUMNWISE = {
    DEQUANTIZE: "elementwise",  # q * s, s one scale per column
    QUANTIZE: "elementwise",  # round(w / s), s one scale per column
    BF16_ROUND: "elementwise",  # each element rounded alone
    CAST: "elementwise",  # each element converted alone
    QUANT_SCALE: "reduces",  # max |w| over attrs["axis"]: columnwise when that is another axis
    PERMUTE: "moves",  # the column axis moves to perm[axis] of the input
}


@dataclass(frozen=True)
class Sibling:
    """One product of the shared activation ``x`` by a static weight."""

    root: Node  # the value the rest of the graph reads: the product, or its bias add
    x: Node  # the activation (the product's left operand)
    weight: Node  # (K, N) operand of a matmul, or (N, K) of a linear
    bias: Node | None  # static, broadcasting along the last axis only
    linear: bool

    @property
    def n(self) -> int:
        return self.weight.shape[0 if self.linear else 1]

    def key(self) -> tuple:
        """Siblings of one key fuse: same activation, form, dtypes, K, bias presence and
        weight rewriting (a quantized and a float weight are not concatenated)."""
        k = self.weight.shape[1 if self.linear else 0]
        bias = None if self.bias is None else (self.bias.ndim, self.bias.dtype)
        return (_activation(self.x), self.linear, self.weight.dtype, k, bias, _form(self.weight))


def fuse_siblings(outputs):
    """``outputs`` with every group of sibling products (two or more of one activation by
    static rank-2 weights, with their static bias adds) computed as one product over the
    concatenated weights and read back as slices; the graph itself where there are none.
    Returns the structure it was given."""
    groups = sibling_groups(outputs)
    if not groups:
        return outputs
    group_of = {s.root: g for g in groups for s in g}
    single = isinstance(outputs, Node)
    outs = [outputs] if single else list(outputs)
    mapped: dict[Node, Node] = {}
    for n in nodes(outs):  # inputs first: a group is fused over its rebuilt activation
        if n in mapped:
            continue
        group = group_of.get(n)
        if group is not None:
            mapped.update(_fused(group, mapped))
            if n in mapped:
                continue
        ins = tuple(mapped[i] for i in n.inputs)
        mapped[n] = n if ins == n.inputs else Node.make(n.op, ins, n.attrs, n.name)
    new = [mapped[o] for o in outs]
    return new[0] if single else type(outputs)(new) if isinstance(outputs, tuple) else new


def side_by_side(outputs) -> list[Node]:
    """Per group, its fused product (over the group's own activation) followed by the
    siblings it replaces: outputs for one profiling pass over both forms, so each group's one
    GEMM and its separate GEMMs are measured next to each other (in the same interleaved
    rounds), not minutes apart, where a burst of other work on the machine would decide."""
    out: list[Node] = []
    for group in sibling_groups(outputs):
        pieces = _fused(group, {s.x: s.x for s in group})
        if pieces:
            out.append(next(iter(pieces.values())).inputs[0])
            out.extend(s.root for s in group)
    return out


def sibling_groups(outputs) -> list[list[Sibling]]:
    """The groups ``fuse_siblings`` fuses, each in graph order (the order of the slices)."""
    found = [s for s in _siblings(outputs)]
    by_key: dict[tuple, list[Sibling]] = {}
    for s in found:
        by_key.setdefault(s.key(), []).append(s)
    return [g for g in by_key.values() if len(g) > 1]


def _siblings(outputs) -> list[Sibling]:
    order = nodes(outputs)
    users: dict[Node, list[Node]] = {}
    for n in order:
        for i in n.inputs:
            users.setdefault(i, []).append(n)
    outs = set(outputs if isinstance(outputs, (list, tuple)) else [outputs])
    found = []
    for n in order:
        if n.op.name == LINEAR and len(n.inputs) in (2, 3):
            x, w = n.inputs[:2]
            b = n.inputs[2] if len(n.inputs) == 3 else None
            if _weight(w) and not is_static(x) and (b is None or _bias(b, w.shape[0])):
                found.append(Sibling(n, x, w, b, True))
        elif n.op.name == MATMUL and len(n.inputs) == 2:
            x, w = n.inputs
            if not _weight(w) or is_static(x) or x.ndim < 1:
                continue
            bias, root = None, n
            readers = users.get(n, [])
            if len(readers) == 1 and n not in outs and readers[0].op.name == ADD:
                add = readers[0]
                other = add.inputs[1] if add.inputs[0] is n else add.inputs[0]
                if add.shape == n.shape and add.dtype == n.dtype and _bias(other, w.shape[1]):
                    bias, root = other, add
            found.append(Sibling(root, x, w, bias, False))
    return found


def _activation(x: Node):
    """What makes two products' left operands one activation: the node, except that
    ``tg.quantize``'s int8-dynamic gives each product its own ``dynamic_quant`` of the same
    rows (named after the weight, so a kernel can fuse it): those are one activation here,
    and the fused product reads the first."""
    if x.op.name == DYNAMIC_QUANT:
        return (x.op.name, x.inputs, x.attrs)
    return x


def _weight(w: Node) -> bool:
    """A static float rank-2 operand with concrete sizes."""
    return (w.ndim == 2 and w.dtype.is_float and all(isinstance(d, int) for d in w.shape)
            and is_static(w))


def _bias(b: Node, n: int) -> bool:
    """A static bias of the product's N columns that broadcasts along the last axis only:
    (N,) or (1, ..., 1, N)."""
    return (b.ndim >= 1 and b.shape[-1] == n and all(d == 1 for d in b.shape[:-1])
            and b.dtype.is_float and is_static(b))


def _form(w: Node) -> tuple:
    """The ops above the weight's leaves, leaves and sizes abstracted: weights rewritten the
    same way (``tg.quantize``'s ops, a transpose) fuse; others do not."""
    out = []
    for n in nodes(w):
        if n.op.is_leaf:
            out.append((n.op.name, n.dtype))
        else:
            attrs = tuple(sorted((k, repr(v)) for k, v in n.attrs.items()
                                 if k not in ("shape", "starts", "stops")))
            out.append((n.op.name, n.dtype, attrs, len(n.inputs)))
    return tuple(out)


def _fused(group: Sequence[Sibling], mapped: dict[Node, Node]) -> dict[Node, Node]:
    """Each sibling's root -> its slice of the one product over the joined weights, built on
    the rebuilt activation (``mapped``: old node -> new); weights and biases are static, so no
    rewrite reaches them and they are taken as they are."""
    first = group[0]
    weight = join([s.weight for s in group], 0 if first.linear else 1)
    bias = None
    if first.bias is not None:
        bias = join([s.bias for s in group], first.bias.ndim - 1)
    x = mapped[first.x]
    if first.linear:
        product = tg.linear(x, weight, bias)
    else:
        product = tg.matmul(x, weight)
        if bias is not None:
            product = tg.add(product, bias)
    out, start = {}, 0
    for s in group:
        piece = tg.slice_axis(product, -1, start, start + s.n)
        start += s.n
        if piece.shape != s.root.shape or piece.dtype != s.root.dtype:
            return {}  # (cannot happen for the forms above; never a wrong substitution)
        out[s.root] = piece
    return out


def join(parts: Sequence[Node], axis: int) -> Node:
    """``concat(parts, axis)``, with the concatenation moved below the ops of ``COLUMNWISE``
    the parts share (same op and attributes; operands that are not partitioned along
    ``axis`` identical), so ``dequantize(quantize(w_i, s_i), s_i)`` joins as
    ``dequantize(quantize(W, S), S)`` and stays a form the quantized kernels match."""
    head = parts[0]
    rule = COLUMNWISE.get(head.op.name)
    same = all(p.op is head.op and p.attrs == head.attrs
               and len(p.inputs) == len(head.inputs) for p in parts)
    if rule is None or not same or head.op.is_leaf:
        return tg.concat(list(parts), axis)
    if rule == "reduces" and head.attrs.get("axis") % head.ndim == axis % head.ndim:
        return tg.concat(list(parts), axis)
    inner = head.attrs["perm"][axis] if rule == "moves" else axis
    inputs = []
    for j in range(len(head.inputs)):
        operands = [p.inputs[j] for p in parts]
        if all(o is operands[0] for o in operands):
            inputs.append(operands[0])  # one operand for all (a scalar constant)
        elif all(o.ndim == head.ndim for o in operands) or rule == "moves":
            inputs.append(join(operands, inner))
        else:
            return tg.concat(list(parts), axis)
    try:
        joined = Node.make(head.op, tuple(inputs), head.attrs, None)
    except TensorGraphsError:  # operands that do not join (shapes that no longer broadcast)
        return tg.concat(list(parts), axis)
    want = list(head.shape)
    want[axis] = sum(p.shape[axis] for p in parts)
    if tuple(joined.shape) != tuple(want) or joined.dtype != head.dtype:
        return tg.concat(list(parts), axis)
    return joined
