"""State on the GPU: a kept state's device buffer, and ``state_update`` appending into it.

A program keeps a ``tg.state`` (a KV cache) where its consumers run: on a GPU its buffer is a
torch tensor allocated once at the largest length along the axis that grows (``allocate``),
calls read the active prefix (a ``narrow`` view), and ``torch_cuda_state_update`` writes the new
rows in place and returns the longer prefix (``grown``), so a decode step copies nothing but the
new rows and never leaves the GPU. Anything that is not such a prefix (a user's tensor, a write
inside the prefix, a buffer without room) is copied, as the reference does, so older versions
read in the same call stay intact. The host's counterpart is ``kernels/storage.py``.
"""

from __future__ import annotations

import weakref

from tensor_graphs.devices import torch_device
from tensor_graphs.kernels.registry import kernel
from tensor_graphs.kernels.torch.base import EXACT
from tensor_graphs.kernels.torch.convert import Lazy, torch_dtype

torch = Lazy("torch", globals(), "torch")

_owned: dict[int, weakref.ref] = {}  # storage address -> the buffer tensor that owns it


def allocate(shape: tuple[int, ...], dtype, device: str = "cuda"):
    """A zeroed device buffer (``dtype``: ours, numpy's or torch's) that ``state_update`` may
    grow prefixes into."""
    if not isinstance(dtype, torch.dtype):
        dtype = torch_dtype(dtype)
    buf = torch.zeros(tuple(shape), dtype=dtype, device=torch_device(device))
    key = buf.untyped_storage().data_ptr()
    _owned[key] = weakref.ref(buf, lambda _, k=key: _owned.pop(k, None))
    return buf


def owner(t):
    """The owned buffer whose memory ``t`` views, or None."""
    ref = _owned.get(t.untyped_storage().data_ptr())
    root = ref() if ref is not None else None
    if root is None or root.untyped_storage().data_ptr() != t.untyped_storage().data_ptr():
        return None
    return root


def grown(state, axis: int, length: int):
    """``state`` (a prefix view of an owned buffer along ``axis``) extended to ``length``, or
    None when it is not such a view or the buffer has no room."""
    root = owner(state)
    if root is None:
        return None
    shape = list(state.shape)
    shape[axis] = length
    if state.numel() == 0 and state.shape[axis] != 0:
        return None
    strides = state.stride()
    if any(s < 0 for s in strides):
        return None
    offset = state.storage_offset()
    end = offset + sum((n - 1) * s for n, s in zip(shape, strides)) + 1
    if min(shape, default=1) > 0 and end > root.numel():
        return None  # no room: the caller copies
    return torch.as_strided(root, tuple(shape), strides, offset)


def state_update(state, value, axis, offset):
    """A new version of the state with ``value`` written at ``offset`` along ``axis`` (may
    grow it): in place for the prefix of a buffer the program keeps, else a new tensor."""
    if offset == state.shape[axis]:
        longer = grown(state, axis, offset + value.shape[axis])
        if longer is not None:
            longer.narrow(axis, offset, value.shape[axis]).copy_(value)
            return longer
    end = offset + value.shape[axis]
    shape = list(state.shape)
    shape[axis] = max(shape[axis], end)
    out = torch.zeros(shape, dtype=state.dtype, device=state.device)
    out[tuple(slice(0, n) for n in state.shape)] = state
    out.narrow(axis, offset, value.shape[axis]).copy_(value)
    return out


def _same_dtype(shapes, dtypes, attrs):
    return True if len(set(dtypes)) <= 1 else "inputs must share one dtype"


def register() -> None:
    """The GPU's state_update kernel (registered only where a GPU is usable)."""
    kernel("state_update", backend="torch", name="torch_cuda_state_update", device="cuda",
           where=_same_dtype, tolerance=EXACT)(state_update)
