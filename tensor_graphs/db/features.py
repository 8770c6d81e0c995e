"""What a kernel call costs in work: floating-point operations, bytes moved, elements made.

The cost model fits measured times against these features (interpolation) and divides them by
the device's peak rates (roofline estimates). They are properties of the computation, not of a
kernel: every kernel covering the same nodes on the same shapes has the same features, so the
one table below is the single source of truth. Composites count the flops of their full
decomposition (cached per op, attributes and input signature).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tensor_graphs.ir import builder
from tensor_graphs.ir.graph import decompose, nodes
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import (
    CAST,
    CONCAT,
    COPY_TO,
    CUMSUM,
    EMBEDDING,
    EXPAND,
    GATHER,
    IOTA,
    MATMUL,
    MAX,
    PAD,
    PERMUTE,
    RESHAPE,
    SLICE,
    STATE_UPDATE,
    SUM,
)
from tensor_graphs.ir.shapes import prod_int

# move or convert data: no flops
MOVEMENT = {RESHAPE, PERMUTE, EXPAND, SLICE, PAD, CONCAT, GATHER, COPY_TO, CAST, IOTA,
            STATE_UPDATE}
REDUCTIONS = {SUM, MAX, CUMSUM}  # one operation per input element
SUBSET_READERS = {GATHER, EMBEDDING, SLICE}  # read about as much as they write


@dataclass(frozen=True)
class Features:
    flops: float  # arithmetic operations (a multiply-add counts 2)
    bytes: float  # bytes read from inputs plus bytes written to the result
    elements: float  # elements of the result

    def __add__(self, other: Features) -> Features:
        return Features(self.flops + other.flops, self.bytes + other.bytes,
                        self.elements + other.elements)


def numel(node: Node) -> int:
    return prod_int(int(d) for d in node.shape)


def nbytes(node: Node) -> int:
    return numel(node) * node.dtype.itemsize


def atomic_flops(node: Node) -> float:
    """Operations of one atomic node: one per result element for elementwise ops, one per input
    element for reductions, 2*M*N*K for a matrix product, none for data movement."""
    name = node.op.name
    if node.op.is_leaf or name in MOVEMENT:
        return 0.0
    if name == MATMUL:
        return 2.0 * numel(node) * int(node.inputs[0].shape[-1])
    if name in REDUCTIONS:
        return float(numel(node.inputs[0]))
    return float(numel(node))  # elementwise (UNARY, BINARY, where) and anything else


def node_flops(node: Node) -> float:
    """Operations of one node; a composite counts its full decomposition."""
    if node.op.is_atomic:
        return atomic_flops(node)
    return _composite_flops(node.op.name, node.attrs,
                            tuple((tuple(i.shape), i.dtype.name) for i in node.inputs), node)


_FLOPS_CACHE: dict = {}  # (op, attrs, input signature) -> flops of the full decomposition


def _composite_flops(op: str, attrs, signature: tuple, node: Node) -> float:
    key = (op, attrs, signature)
    found = _FLOPS_CACHE.get(key)
    if found is None:
        alone = Node.make(node.op, tuple(builder.input(f"in{i}", x.shape, x.dtype)
                                          for i, x in enumerate(node.inputs)), node.attrs)
        found = sum(atomic_flops(n) for n in nodes(decompose(alone)))  # not what feeds it
        _FLOPS_CACHE[key] = found
    return found


def features(covered: Iterable[Node], arguments: Iterable[Node], result: Node) -> Features:
    """The features of one kernel call that computes ``covered`` nodes from ``arguments``."""
    flops = sum(node_flops(n) for n in covered)
    out = nbytes(result)
    if result.op.name == STATE_UPDATE:  # a kept state is appended in place: the value only
        value = result.inputs[1]
        return Features(float(flops), 2.0 * nbytes(value), float(numel(value)))
    if result.op.name in SUBSET_READERS:  # reads rows of a table, not all of it
        moved = sum(min(nbytes(a), out) for a in set(arguments)) + out
    else:
        moved = sum(nbytes(a) for a in set(arguments)) + out
    return Features(float(flops), float(moved), float(numel(result)))
