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
from tensor_graphs.runtime import values


class State:
    """One kept state: its buffer, the axis that grows and the active length along it. The
    buffer lives on ``device``: a numpy array on the host, a torch tensor on a GPU (where the
    state's consumers run; ``kernels/torch/state.py`` appends to it in place)."""

    def __init__(self, leaf: Node, axis: int, device: str = "cpu"):
        self.leaf = leaf
        self.axis = axis
        self.device = device
        self.on_gpu = device != "cpu"
        self.ndim = leaf.ndim
        self.buffer = None
        self.active = 0
        self._prefix = None  # on a GPU: (buffer, active, the prefix tensor), made once each
        self._layout = None  # on a GPU: the buffer's strides and shape, the prefix's but one

    @property
    def nbytes(self) -> int:
        return values.size_in_bytes(self.buffer) if self.buffer is not None else 0

    def prefix(self):
        if self.on_gpu:  # read twice per decode token (the call's feed, the result's view)
            made = self._prefix
            if made is None or made[0] is not self.buffer or made[1] != self.active:
                made = self._prefix = (self.buffer, self.active,
                                       self.buffer.narrow(self.axis, 0, self.active))
            return made[2]
        index = [slice(None)] * self.buffer.ndim
        index[self.axis] = slice(0, self.active)
        return self.buffer[tuple(index)]

    def reserve(self, like, length: int) -> None:
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
        if self.on_gpu:
            from tensor_graphs.kernels.torch import state as gpu_state

            new = gpu_state.allocate(tuple(shape), like.dtype, self.device)
            self._layout = (new.stride(), new.shape[:self.axis], new.shape[self.axis + 1:])
        else:
            new = storage.allocate(tuple(shape), like.dtype)
        if buf is not None and self.active and new.ndim == buf.ndim:
            keep = [slice(0, n) for n in buf.shape]
            keep[self.axis] = slice(0, self.active)
            new[tuple(keep)] = buf[tuple(keep)]
        self.buffer = new

    def set(self, value, capacity: int = 0) -> None:
        """Make ``value`` the active state (bind, or a version computed out of place). A
        decode token's new version is its buffer grown in place: only its length is read, and
        on a GPU it is the prefix tensor itself where it has the prefix's layout (a ``narrow``
        per state per token cost ~5 us on a slow host, 24 of them a GPT-2 token)."""
        if value.ndim != self.ndim:
            raise StateError(f"state '{self.leaf.name}' {format_shape(self.leaf.shape)} cannot "
                             f"hold an array of shape {format_shape(tuple(value.shape))}")
        if self.buffer is not None and _inside(value, self.buffer):
            self.active = value.shape[self.axis]  # grown in place (so on its device)
            if self.on_gpu:
                strides, head, tail = self._layout
                if value.stride() == strides and value.shape[:self.axis] == head \
                        and value.shape[self.axis + 1:] == tail:
                    self._prefix = (self.buffer, self.active, value)
            return
        if self.on_gpu and not values.is_on(value, self.device):
            value = values.on_device(value, self.device, self.leaf.dtype.np_dtype)
        elif not self.on_gpu and values.is_tensor(value):
            value = values.on_host(value, self.leaf.dtype.np_dtype)
        length = value.shape[self.axis]
        self.active = 0
        self.reserve(value, max(length, capacity))
        self.active = length
        self.prefix()[...] = value

    def view(self):
        """The active state, read-only on the host (later calls append past it; bind replaces
        it); on a GPU the prefix tensor itself (torch has no read-only tensors: do not write
        to it)."""
        v = self.prefix()
        if not self.on_gpu:
            v.flags.writeable = False
        return v


def _inside(value, buffer) -> bool:
    """``value`` is a prefix view of ``buffer`` (it starts where the buffer starts). A decode
    token's is a view made of the buffer (``kernels/torch/state.grown``; the buffer is the
    allocation, offset 0): told by one torch call rather than four, per state per token."""
    if values.is_tensor(buffer):
        if not values.is_tensor(value):
            return False
        if value._base is buffer:
            return value.storage_offset() == 0
        return value.data_ptr() == buffer.data_ptr() and \
            value.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
    return isinstance(value, np.ndarray) and value.base is buffer and \
        value.__array_interface__["data"][0] == buffer.__array_interface__["data"][0]


def kept_states(outputs: list[Node]) -> dict[int, tuple[str, int]]:
    """Output position -> (state name, growing axis) for outputs that are the newest version
    of a state. An older version among the outputs (forks are refused, so it lies on the
    newest one's chain) is an ordinary result: were it kept too, whichever came last in the
    outputs would be the state after the call, losing the newer appends."""
    newest: dict[str, Node] = {}
    for o in outputs:
        if o.op.name == STATE_UPDATE and root_state(o).op.name == STATE:
            name = root_state(o).name
            if name not in newest or _depth(o) > _depth(newest[name]):
                newest[name] = o
    return {i: (root_state(o).name, int(o.attrs["axis"]))
            for i, o in enumerate(outputs)
            if o.op.name == STATE_UPDATE and newest.get(root_state(o).name) is o}


def _depth(version: Node) -> int:
    """How many updates a state's version is from the state."""
    depth = 0
    while version.op.name == STATE_UPDATE:
        version, depth = version.inputs[0], depth + 1
    return depth
