"""Which fed integer inputs index into which axes, so a call checks them before it runs.

A gather or scatter index outside [0, size) is an error of the call (the ops' references
raise), but a kernel on a GPU cannot raise one: torch's index kernels stop on a device-side
assert, which ends the process's CUDA context, and a Triton gather reads NaN rows. So a
program checks a fed index on the host before any step runs, wherever the index is an
input's values carried unchanged to a gather or scatter (token ids into an embedding table).
The same check then holds on every device, names the feed rather than a kernel, and a call it
refuses has written nothing (no kept state half-updated).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tensor_graphs.errors import EvaluationError
from tensor_graphs.ir.graph import nodes
from tensor_graphs.ir.node import COMPOSITE, Node, expand_composite
from tensor_graphs.ir.ops.names import INPUT
from tensor_graphs.ir.shapes import Dim, format_shape, resolve

# op -> (its indices' operand, the operand whose ``axis`` the indices pick from)
INDEXED_BY = {
    "gather": (1, 0),   # out = x[..., indices, ...]: each index < x.shape[axis]
    "scatter": (1, 0),  # updates land at x[..., indices, ...]: the same bound
}
# ops whose output holds only values of their first operand (reordered, repeated, a part)
CARRIES = frozenset({"reshape", "permute", "expand", "slice"})


@dataclass(frozen=True)
class Limit:
    """An input's values index ``axis`` (of size ``size``) of ``of`` through ``op``."""

    op: str
    axis: int
    size: Dim
    of: str

    def bound(self, dims: Mapping) -> int:
        return int(resolve(self.size, dims)) if not isinstance(self.size, int) else self.size


def index_limits(outputs: Sequence[Node]) -> dict[str, tuple[Limit, ...]]:
    """Input name -> the limits its values must keep, for each integer input the graph
    carries unchanged to a gather's or scatter's indices (through composites too)."""
    order = nodes(outputs)
    users = _users(order)
    found = {}
    for leaf in order:
        if leaf.op.name == INPUT and leaf.dtype.is_int:
            limits, _ = _reached(leaf, users)
            if limits:
                found[leaf.name] = tuple(dict.fromkeys(limits))
    return found


def check_indices(name: str, value: np.ndarray, limits: Sequence[Limit],
                  dims: Mapping) -> None:
    """Raise EvaluationError where ``value`` (the host array fed as ``name``) leaves one of
    its limits."""
    if value.size == 0:
        return
    lo, hi = int(value.min()), int(value.max())
    for limit in limits:
        size = limit.bound(dims)
        if lo >= 0 and hi < size:
            continue
        bad = (value < 0) | (value >= size)
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise EvaluationError(
            f"input '{name}' holds {int(value[at])} at {at}, out of range: it indexes axis "
            f"{limit.axis} of {limit.of} through {limit.op}, so its values must be in "
            f"[0, {size}) (nothing ran)")


def _users(order: Sequence[Node]) -> dict[int, list[tuple[Node, int]]]:
    users: dict[int, list[tuple[Node, int]]] = {}
    for node in order:
        for pos, i in enumerate(node.inputs):
            users.setdefault(id(i), []).append((node, pos))
    return users


def _reached(start: Node, users: Mapping) -> tuple[list[Limit], set[int]]:
    """The limits ``start``'s values meet in the graph ``users`` describes, and the ids of
    the nodes that carry them unchanged (``start`` included)."""
    limits, carried, stack = [], {id(start)}, [start]
    while stack:
        value = stack.pop()
        for user, pos in users.get(id(value), ()):
            carries = False
            if user.op.name in INDEXED_BY and pos == INDEXED_BY[user.op.name][0]:
                x = user.inputs[INDEXED_BY[user.op.name][1]]
                axis = user.attrs["axis"]
                of = f"'{x.name}' {format_shape(x.shape)}" if x.name else \
                    f"a {format_shape(x.shape)} value"
                limits.append(Limit(user.op.name, axis, x.shape[axis], of))
            elif user.op.name in CARRIES and pos == 0:
                carries = True
            elif user.op.kind == COMPOSITE:
                inner = expand_composite(user.op, user.inputs, user.attrs)
                more, inside = _reached(value, _users(nodes(inner, stop=set(user.inputs))))
                limits.extend(more)
                carries = id(inner) in inside
            if carries and id(user) not in carried:
                carried.add(id(user))
                stack.append(user)
    return limits, carried
