"""Values on devices: what the runtime does to a value, whichever memory holds it.

A value of a "cpu" slot is a numpy array; a value of a "cuda" slot is a torch tensor on the
GPU (on the simulated GPU, ``devices.simulated_cuda``, a torch CPU tensor). The Python loop
asks the same questions of both: is it dense, make it dense, does it live inside an arena, did
a kernel allocate it; and each device has one arena, a numpy byte buffer on the host and a
torch uint8 tensor on a GPU, viewed at planned offsets. Torch is imported only for a GPU value.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tensor_graphs.devices import torch_device
from tensor_graphs.kernels.staging import current_stream


def _convert():
    from tensor_graphs.kernels.torch import convert

    return convert


_tensor_types: dict[type, bool] = {}  # a type -> whether its values are torch tensors


def is_tensor(value) -> bool:
    """Asked several times per value per call (a decode token: ~170 times): answered once
    per type (``convert.is_tensor_type``)."""
    found = _tensor_types.get(type(value))
    if found is None:
        found = _tensor_types[type(value)] = _convert().is_tensor_type(type(value))
    return found


def is_dense(a) -> bool:
    if is_tensor(a):
        return a.is_contiguous()
    return a.flags.c_contiguous


def dense(a, dtype=None):
    """``a`` as a C-contiguous array or tensor (itself when it already is; 0-d stays 0-d,
    unlike ``np.ascontiguousarray``)."""
    if is_tensor(a):
        if dtype is not None and _convert().dtype_of(a).np_dtype != np.dtype(dtype):
            a = a.to(_convert().torch_dtype(np.dtype(dtype)))
        return a if a.is_contiguous() else a.contiguous()
    a = np.asarray(a, dtype=dtype)
    return a if a.flags.c_contiguous else a.copy(order="C")


def new_arena(device: str, nbytes: int):
    """The arena of ``device`` (a name or kind): numpy bytes on the host, one torch uint8
    tensor on a GPU."""
    if str(device).partition(":")[0] == "cpu":
        return np.empty(nbytes, np.uint8)
    torch = _convert().torch
    return torch.empty(nbytes, dtype=torch.uint8, device=torch_device(device))


def arena_view(arena, offset: int, shape: tuple, dtype: np.dtype):
    """A C-contiguous view of ``shape`` and ``dtype`` at byte ``offset`` in ``arena``."""
    if isinstance(arena, np.ndarray):
        return np.ndarray(shape, dtype, buffer=arena, offset=offset)
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    flat = arena[offset:offset + nbytes].view(_convert().torch_dtype(dtype))
    return flat.view(tuple(shape))


def nbytes(arena) -> int:
    return arena.nbytes if isinstance(arena, np.ndarray) else arena.numel()


def inside(value, arena) -> bool:
    """Whether ``value`` (an array or tensor) shares memory with ``arena``."""
    if is_tensor(arena):
        return is_tensor(value) and value.device == arena.device and \
            value.untyped_storage().data_ptr() == arena.untyped_storage().data_ptr()
    if is_tensor(value):
        return False
    return value.base is not None and np.may_share_memory(value, arena)


def fresh(value) -> bool:
    """Memory of the value's own, allocated for it (not a view of anything)."""
    if is_tensor(value):
        return value._base is None  # noqa: SLF001 - torch's view marker
    return value.flags.owndata and value.base is None


def copy(value):
    """A copy in the same memory (host or GPU)."""
    return value.clone() if is_tensor(value) else value.copy()


def shape_of(value) -> tuple:
    return tuple(value.shape)


_torch_devices: dict[tuple[str, str], object] = {}  # (device, its torch name) -> torch.device


def is_on(value, device: str) -> bool:
    """A tensor in the memory of ``device`` (a GPU name; the simulated GPU's is the host's,
    so there a CPU tensor is on it). Asked per kept state per decode token: the torch
    device is made once per name."""
    if not is_tensor(value):
        return False
    key = (device, torch_device(device))
    found = _torch_devices.get(key)
    if found is None:
        found = _torch_devices[key] = _convert().torch.device(key[1])
    return value.device == found


def on_device(value, device: str, dtype: np.dtype | None = None):
    """``value`` (an array, a tensor, a number) as a C-contiguous tensor on ``device`` (a GPU
    name): a tensor already there is used as is; anything else crosses through the copy
    kernel (``kernels/copy.py``), so every move to a GPU is one kernel's."""
    from tensor_graphs.kernels import copy as copies

    if is_on(value, device):
        return dense(plain(value), dtype)
    if is_tensor(value):
        value = value.detach().cpu()  # (a tensor on another GPU: through the host)
    return copies.route("cpu", device).fn(dense(value, dtype), device=device)


def on_host(value, dtype: np.dtype | None = None) -> np.ndarray:
    """``value`` as a numpy array (a GPU tensor is copied to the host; a CPU tensor viewed)."""
    if is_tensor(value):
        value = _convert().to_host(value)
    return dense(value, dtype) if dtype is not None else np.asarray(value)


def plain(tensor):
    """``tensor`` outside autograd: a feed or bound tensor that requires grad (a model's
    output outside ``no_grad``, a ``Parameter``) written into the arena by ``copy_`` made
    autograd record the copy on the arena, and every later kernel writing there with
    ``out=`` failed ("functions with out=... arguments don't support automatic
    differentiation"), numpy feeds included, for the program's life."""
    return tensor.detach() if tensor.requires_grad else tensor


def retyped(value, dtype: np.dtype):
    """A tensor outside autograd in ``dtype`` (itself when it is both), keeping its device
    and layout."""
    value = plain(value)
    if _numpy_dtype(value) == dtype:
        return value
    return value.to(_convert().torch_dtype(np.dtype(dtype)))


def size_in_bytes(value) -> int:
    if is_tensor(value):
        return value.numel() * value.element_size()
    return value.nbytes


_ZERO = bytes(16)  # the memory of every placeholder: one element of any dtype, read-only
_numpy_dtypes: dict = {}  # torch dtype -> numpy dtype


def placeholder(value):
    """A numpy stand-in with ``value``'s shape and dtype and no memory (a zero at every
    index, read-only), so a tensor feed goes through the same checks as an array without
    leaving its device. Made per kept state per decode token: one numpy call."""
    if not is_tensor(value):
        return value
    shape = tuple(value.shape)
    return np.ndarray(shape, _numpy_dtype(value), buffer=_ZERO, strides=(0,) * len(shape))


def _numpy_dtype(tensor) -> np.dtype:
    """A tensor's numpy dtype, found once per torch dtype."""
    found = _numpy_dtypes.get(tensor.dtype)
    if found is None:
        found = _numpy_dtypes[tensor.dtype] = _convert().numpy_dtype(tensor)
    return found


class HostReader:
    """Small GPU results read on the host later, without waiting for the GPU now.

    A decode loop that copied each token to the host before queueing the next step made the
    host's work per token (~0.4 ms of Python) and the GPU's (~0.6 ms for GPT-2) add up; with
    the token chosen on the GPU and fed back from there, the next step is queued first and the
    host waits only for the copy it reads (``nn/generate.py``). ``start`` queues a copy into
    one of ``slots`` page-locked buffers and records an event after it; the ticket it returns
    waits for that event alone and returns a new array. A slot is taken again only after its
    previous ticket has read it (read then, if its caller had not yet), so reuse never
    overwrites an unread value. An array is its own ticket's value; on the simulated GPU (or
    where the host refuses to pin memory) the copy is plain and synchronous."""

    def __init__(self, slots: int = 2):
        self._slots: list = [None] * slots  # per slot: (buffer, event) or None (unpinned)
        self._tickets: list = [None] * slots  # per slot: the ticket that reads it last
        self._next = 0

    def start(self, value) -> Callable[[], np.ndarray]:
        if not is_tensor(value):
            got = np.array(value)
            return lambda: got
        i, self._next = self._next, (self._next + 1) % len(self._slots)
        previous = self._tickets[i]
        if previous is not None:
            previous()  # its values leave the slot before the slot is written again
        slot = self._slot(i, value)
        if slot is None:
            self._tickets[i] = None
            got = _convert().to_host(value).copy()
            return lambda: got
        buffer, event = slot
        buffer.copy_(value, non_blocking=True)
        event.record(current_stream(value.device.index))
        ticket = self._tickets[i] = _Ticket(buffer, event)
        return ticket

    def _slot(self, i: int, value):
        made = self._slots[i]
        if made is not None and made[0].shape == value.shape and made[0].dtype == value.dtype:
            return made
        if value.device.type == "cpu":  # the simulated GPU's tensors are the host's
            return None
        torch = _convert().torch
        try:
            buffer = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
        except RuntimeError:  # a memlock limit: pageable memory, a synchronous copy
            return None
        made = self._slots[i] = (buffer, torch.cuda.Event())
        return made


class _Ticket:
    """One queued copy to the host: called, waits for it and returns its values (once)."""

    __slots__ = ("buffer", "event", "value")

    def __init__(self, buffer, event):
        self.buffer, self.event, self.value = buffer, event, None

    def __call__(self) -> np.ndarray:
        if self.value is None:
            self.event.synchronize()
            self.value = self.buffer.numpy().copy()
            self.buffer = self.event = None
        return self.value
