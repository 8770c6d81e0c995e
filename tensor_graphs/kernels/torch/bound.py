"""Weights bound on a GPU: device tensors that no kernel writes while a call runs.

A kernel launched with programmatic dependent launch (PDL, Hopper on) may start while the
kernels before it still run, and waits for them in its code (``gdc_wait``). Before that wait
it may read only memory that none of them writes: a weight the program holds (``bind`` puts
it there with a copy, which a PDL kernel does not overlap), never an activation, a kept state
or a prelude's result, which kernels of the same stream compute. The GEMV template loads its
first weights before the wait only for a weight marked here (``templates/matmul.py``).
Marked by storage, so a transposed or sliced view of a weight is one too; the mark goes with
the tensor (a weak reference), as ``state.py`` keeps its buffers.
"""

from __future__ import annotations

import weakref

_marked: dict[int, weakref.ref] = {}  # storage address -> a tensor that owns that storage


def mark(tensor) -> None:
    """``tensor`` (a CUDA tensor) holds a bound weight until it is freed."""
    storage = tensor.untyped_storage()
    key = storage.data_ptr()
    if key:  # (a tensor of no elements has address 0: nothing to read early)
        _marked[key] = weakref.ref(tensor, lambda _, k=key: _marked.pop(k, None))


def is_weight(tensor) -> bool:
    """Whether ``tensor`` views the storage of a marked weight that is still alive."""
    key = tensor.untyped_storage().data_ptr()
    ref = _marked.get(key)
    held = ref() if ref is not None else None
    return held is not None and held.untyped_storage().data_ptr() == key
