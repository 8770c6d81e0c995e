"""State storage: buffers a compiled program owns for its states (a KV cache), and how a
kernel may grow a state's active prefix inside one without copying.

A program keeps each state in a buffer allocated at its maximum length along the axis that
grows, and feeds the state as a view of the active prefix. ``numpy_state_update`` then writes
the new value at its offset *in place* and returns the longer prefix (``grown``), instead of
copying the whole state; for a state that is not such a prefix (a user's array) it copies, as
the reference does. Only buffers registered here are ever written beyond a view's end.
"""

from __future__ import annotations

import weakref

import numpy as np

_owned: dict[int, weakref.ref] = {}


def allocate(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zeroed buffer that state kernels may grow prefixes into."""
    buf = np.zeros(shape, dtype)
    key = id(buf)
    _owned[key] = weakref.ref(buf, lambda _, k=key: _owned.pop(k, None))
    return buf


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def grown(state: np.ndarray, axis: int, length: int) -> np.ndarray | None:
    """``state`` (a prefix view of an owned buffer along ``axis``) extended to ``length``, or
    None when it is not such a view or the buffer has no room."""
    root = _root(state)
    ref = _owned.get(id(root))
    if ref is None or ref() is not root or not state.flags.writeable:
        return None
    shape = list(state.shape)
    shape[axis] = length
    if state.size == 0 and state.shape[axis] != 0:
        return None
    offset = state.ctypes.data - root.ctypes.data
    if offset < 0 or any(s < 0 for s in state.strides):
        return None
    end = offset + sum((n - 1) * s for n, s in zip(shape, state.strides)) + state.itemsize
    if min(shape) > 0 and end > root.nbytes:
        return None  # no room: the caller copies
    return np.ndarray(tuple(shape), state.dtype, buffer=root, offset=offset,
                      strides=state.strides)  # its base is the buffer, so it can grow again
