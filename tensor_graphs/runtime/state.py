"""Program state: a KV cache kept in the program between calls, grown in place.

A ``tg.state`` leaf whose graph returns a new version of it (a ``state_update`` chain as an
output) is state the program keeps: its buffer is allocated once at the largest length the
program's bounds allow along the axis that grows (``kernels.storage``), calls read the active
prefix, the update kernel appends in place, and after the call the active length is the new
version's. Nothing is copied or allocated per decode step while the buffer has room; past it
the buffer doubles (a program without bounds).
"""

from __future__ import annotations

import numpy as np

from tensor_graphs.errors import StateError
from tensor_graphs.ir.graph import root_state
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import STATE, STATE_UPDATE
from tensor_graphs.ir.shapes import format_shape
from tensor_graphs.kernels import storage


class State:
    """One kept state: its buffer, the axis that grows and the active length along it."""

    def __init__(self, leaf: Node, axis: int):
        self.leaf = leaf
        self.axis = axis
        self.buffer: np.ndarray | None = None
        self.active = 0

    def prefix(self) -> np.ndarray:
        index = [slice(None)] * self.buffer.ndim
        index[self.axis] = slice(0, self.active)
        return self.buffer[tuple(index)]

    def reserve(self, like: np.ndarray, length: int) -> None:
        """Room for ``length`` along the axis (keeping the active prefix), shaped like
        ``like`` on the other axes."""
        buf = self.buffer
        fits = buf is not None and buf.dtype == like.dtype and buf.shape[self.axis] >= length \
            and all(a == b for i, (a, b) in enumerate(zip(buf.shape, like.shape))
                    if i != self.axis)
        if fits:
            return
        shape = list(like.shape)
        shape[self.axis] = max(length, 2 * (buf.shape[self.axis] if buf is not None else 0))
        new = storage.allocate(tuple(shape), like.dtype)
        if buf is not None and self.active and new.ndim == buf.ndim:
            keep = [slice(0, n) for n in buf.shape]
            keep[self.axis] = slice(0, self.active)
            new[tuple(keep)] = buf[tuple(keep)]
        self.buffer = new

    def set(self, value: np.ndarray, capacity: int = 0) -> None:
        """Make ``value`` the active state (bind, or a version computed out of place)."""
        if value.ndim != self.leaf.ndim:
            raise StateError(f"state '{self.leaf.name}' {format_shape(self.leaf.shape)} cannot "
                             f"hold an array of shape {format_shape(value.shape)}")
        length = value.shape[self.axis]
        if self.buffer is not None and _inside(value, self.buffer):
            self.active = length  # grown in place
            return
        self.active = 0
        self.reserve(value, max(length, capacity))
        self.active = length
        self.prefix()[...] = value

    def view(self) -> np.ndarray:
        """The active state, read-only (later calls append past it; bind replaces it)."""
        v = self.prefix()
        v.flags.writeable = False
        return v


def _inside(value: np.ndarray, buffer: np.ndarray) -> bool:
    return value.base is buffer and (value.__array_interface__["data"][0]
                                     == buffer.__array_interface__["data"][0])


def kept_states(outputs: list[Node]) -> dict[int, tuple[str, int]]:
    """Output position -> (state name, growing axis) for outputs that are new versions of a
    state."""
    found = {}
    for i, o in enumerate(outputs):
        if o.op.name != STATE_UPDATE:
            continue
        leaf = root_state(o)
        if leaf.op.name == STATE:
            found[i] = (leaf.name, int(o.attrs["axis"]))
    return found
