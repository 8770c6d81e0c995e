"""Host<->GPU copies through a reusable host buffer per GPU: the copy kernels' staging.

The buffer is page-locked on a real GPU. From pageable memory torch's copy is
``cudaMemcpyAsync`` plus a stream synchronize: the host waits for all the GPU work queued
before the copy, and the driver stages the bytes through its own small pinned buffers at
~10-13 GB/s. From pinned memory the move is a DMA at the link's rate that the host need not
wait for (``non_blocking``).
- Host -> GPU, every size: the array is copied into the buffer (so the caller may reuse it at
  once, and any strides or byte order are made dense there), the move is queued, and an event
  recorded after it guards the bytes. No small-copy shortcut: the direct path's synchronize is
  the expensive part of a small copy (the host waits for the GPU to drain), where staging a
  few bytes costs a memcpy and an event record.
- GPU -> host: the result must be on the host when the call returns, so both paths wait;
  below ``SMALL_TO_HOST`` the direct one is kept (latency-bound either way, and it does in C
  what staging would do in Python calls). Larger ones are moved into the buffer, waited for
  through the event and copied into ``out`` or a new array the caller owns, never a view of
  the buffer, which the next copy overwrites.
- Why a ring of regions, each with its own event, rather than one region and one event
  waited on before every copy: a call copies several inputs, and with one event the second
  input's memcpy would wait for the first's DMA, serializing what the ring overlaps (the host
  fills one region while the link moves another). A region is only waited for when the ring
  comes round to its bytes again, so a small buffer is enough. The same ring pipelines a copy
  larger than ``PIECE``: it goes through in pieces, and the buffer stops growing at ``LIMIT``
  (pinned pages are taken from the system and cannot be swapped, so it is not sized by the
  largest weight), growing by powers of two and never shrinking.
- Why a lock rather than a buffer per thread: page-locked memory is scarce and slow to
  allocate (one per thread would multiply it), and one GPU's copies share its copy engines, so
  threads gain little from staging in parallel. The lock is held while a call fills or drains
  the buffer and queues its moves; a host -> GPU call does not wait for its DMA under it.
- The simulated GPU (``devices.simulated_cuda``; the rule ``runtime/graphs.DimsFeed`` follows
  too) has no CUDA and a CPU torch cannot pin: its buffer is ordinary memory and its moves
  synchronous, through the same ring, so CI runs the buffer's reuse, growth, wrapping and
  pieces. Where pinning fails on a real GPU (a memlock limit) the buffer is unpinned likewise.
  A torch tensor given to a move (another GPU's) is copied directly, not staged.
"""

from __future__ import annotations

import threading
import warnings
from collections import deque
from functools import partial

import numpy as np

from tensor_graphs.devices import Device, simulated_cuda, torch_device
from tensor_graphs.ir import dtypes as _dtypes

ALIGN = 256  # bytes: where regions of the staging buffer start (any dtype's view is aligned)
MIN_CAPACITY = 64 << 10  # a staging buffer's first size (bytes)
LIMIT = 16 << 20  # the most a staging buffer grows to: larger copies go through in pieces
PIECE = 4 << 20  # larger copies go in pieces of this size (LIMIT holds four: the host fills
#                  one while the link moves another)
# A GPU -> host copy smaller than this goes directly (see the module doc): both paths wait for
# the GPU, and below it the bytes cost less than the calls staging adds.
SMALL_TO_HOST = 64 << 10


_streams: dict = {}  # torch's raw current-stream ids -> Stream
_lookup = None  # torch's raw current-stream lookup (False: a torch without it)


def current_stream(index: int):
    """GPU ``index``'s current stream, where a copy just went and an event is recorded after
    it. ``torch.cuda.current_stream`` makes a new Stream through a dozen Python calls and
    asks ``torch.cuda.is_available`` on the way, which reads the environment (three reads a
    decode token on an H200, where none is the rule: tests/gpu/test_decode_overhead.py); the
    raw lookup is one call, and each stream is made once. Staging, the CUDA graphs' dims feed
    (``runtime/graphs.DimsFeed``) and the host reader (``runtime/values.HostReader``) use it."""
    import torch

    global _lookup
    if _lookup is None:
        _lookup = getattr(torch._C, "_cuda_getCurrentStream", False)
    if not _lookup:
        return torch.cuda.current_stream(index)
    ids = _lookup(index)
    stream = _streams.get(ids)
    if stream is None:
        if len(_streams) > 64:
            _streams.clear()
        stream = _streams[ids] = torch.cuda.Stream(stream_id=ids[0], device_index=ids[1],
                                                   device_type=ids[2])
    return stream


class Staging:
    """One GPU's host staging buffer: a ring of regions, each guarded by the event recorded
    after the move that uses it (see the module doc). ``pinned``: page-locked memory, and
    the moves are asynchronous (a real GPU); else an ordinary buffer and synchronous moves
    (the simulated GPU, or a host that refused to pin), through the same code."""

    def __init__(self, pinned: bool):
        self.pinned = pinned
        self.capacity = 0
        self.buffer = None  # a torch uint8 CPU tensor of ``capacity`` bytes
        self.host = None  # the same bytes as a numpy array
        self.head = 0  # where the next region starts (unless it must wrap to 0)
        # regions in use, oldest first: [start, end, event or None, finish or None]; the event
        # is recorded after the move that reads or writes the region; ``finish`` (a GPU ->
        # host piece) copies the region out once the event is done
        self.pending: deque[list] = deque()
        self.lock = threading.Lock()
        self._events: list = []  # events of retired regions, recorded again later
        self._dtypes: dict = {}  # numpy or torch dtype -> (numpy dtype, torch dtype)

    def takes(self, dtype) -> bool:
        """Whether values of ``dtype`` (numpy or torch) go through the buffer: the dtypes
        tensor_graphs names (another is copied directly, as before staging)."""
        return self._types(dtype) is not None

    # -- the two directions
    def to_gpu(self, x: np.ndarray, device, out=None):
        """numpy array ``x`` on GPU ``device``: ``out`` filled, or a new C-contiguous tensor.
        Returns once ``x`` is in the staging buffer (``x`` may change after); the move itself
        may still be in flight, ordered before later work on the GPU's current stream."""
        from tensor_graphs.kernels.torch import convert

        np_dtype, t_dtype = self._types(x.dtype)
        shape = x.shape
        if out is None:
            out = convert.torch.empty(shape, dtype=t_dtype, device=torch_device(device))
        n = x.size * np_dtype.itemsize
        if n == 0:
            return out
        index = out.device.index
        with self.lock:
            if n > self.capacity:
                self._reserve(n)
            if n <= PIECE:
                start = self._claim(n)
                part = self.host[start:start + n].view(np_dtype).reshape(shape)
                np.copyto(part, x)
                self._move(out, self.buffer[start:start + n].view(t_dtype).view(shape))
                self.pending.append([start, start + n, self._mark(index), None])
                return out
            whole = out if out.is_contiguous() else convert.torch.empty(
                shape, dtype=t_dtype, device=out.device)
            # (a strided source this large is made dense first: pieces are flat ranges)
            src = (x if x.flags.c_contiguous else np.ascontiguousarray(x)).reshape(-1)
            dst = whole.view(-1)
            step = PIECE // np_dtype.itemsize
            for i in range(0, src.size, step):
                count = min(step, src.size - i)
                size = count * np_dtype.itemsize
                start = self._claim(size)
                np.copyto(self.host[start:start + size].view(np_dtype), src[i:i + count])
                self._move(dst[i:i + count], self.buffer[start:start + size].view(t_dtype))
                self.pending.append([start, start + size, self._mark(index), None])
            if whole is not out:
                out.copy_(whole)
            return out

    def to_host(self, x, out=None) -> np.ndarray:
        """GPU tensor ``x`` in host memory: ``out`` filled, or a new array the caller owns
        (never a view of the staging buffer, which the next copy overwrites)."""
        np_dtype, t_dtype = self._types(x.dtype)
        shape = tuple(x.shape)
        if out is None:
            out = np.empty(shape, np_dtype)
        n = x.numel() * np_dtype.itemsize
        if n == 0:
            return out
        index = x.device.index
        whole = out
        with self.lock:
            if n > self.capacity:
                self._reserve(n)
            finished = False
            try:
                if n <= PIECE:
                    start = self._claim(n)
                    self._move(self.buffer[start:start + n].view(t_dtype).view(shape), x)
                    part = self.host[start:start + n].view(np_dtype).reshape(shape)
                    self.pending.append([start, start + n, self._mark(index),
                                         partial(np.copyto, out, part)])
                else:
                    if not out.flags.c_contiguous:
                        whole = np.empty(shape, np_dtype)
                    src, dst = x.reshape(-1), whole.reshape(-1)
                    if not src.is_contiguous():
                        src = src.contiguous()
                    step = PIECE // np_dtype.itemsize
                    for i in range(0, src.numel(), step):
                        count = min(step, src.numel() - i)
                        size = count * np_dtype.itemsize
                        start = self._claim(size)  # may finish one of the earlier pieces
                        self._move(self.buffer[start:start + size].view(t_dtype),
                                   src[i:i + count])
                        part = self.host[start:start + size].view(np_dtype)
                        self.pending.append([start, start + size, self._mark(index),
                                             partial(np.copyto, dst[i:i + count], part)])
                finished = True
            finally:
                # this call's pieces still in the ring (the newest regions; no other call's
                # has a ``finish`` left): wait for each and copy it out, so none is left for a
                # later call, and after a failure nothing more is written into ``out``
                tail = []
                while self.pending and self.pending[-1][3] is not None:
                    tail.append(self.pending.pop())
                for region in reversed(tail):
                    self._retire(region[2], region[3] if finished else None)
        if whole is not out:
            np.copyto(out, whole)
        return out

    # -- the ring
    def _reserve(self, n: int) -> None:
        """Room for a copy of ``n`` bytes: a buffer of at least ``n`` (up to LIMIT, where
        pieces go through), grown by powers of two and never shrunk."""
        want = MIN_CAPACITY
        while want < min(n, LIMIT):
            want *= 2
        if want <= self.capacity:
            return
        self._drain()  # the old buffer's moves are done before it is dropped
        import torch

        try:
            buffer = torch.empty(want, dtype=torch.uint8, pin_memory=self.pinned)
        except RuntimeError as exc:  # page-locked memory refused (a memlock limit): unpinned
            if not self.pinned:
                raise
            warnings.warn(f"host<->GPU copies are not staged in pinned memory: {exc}",
                          RuntimeWarning, stacklevel=4)
            self.pinned = False
            buffer = torch.empty(want, dtype=torch.uint8)
        self.buffer, self.host, self.capacity, self.head = buffer, buffer.numpy(), want, 0

    def _claim(self, n: int) -> int:
        """The start of a region of ``n`` bytes (n <= capacity) after the last one, or at 0
        when it does not fit before the end; the regions in use that it covers are retired
        first (their moves waited for). Regions are claimed in ring order, so those it covers
        are the oldest: a prefix of ``pending``, where wrapping also retires those in the tail
        it skips."""
        size = -(-n // ALIGN) * ALIGN
        head, start = self.head, self.head
        wrap = start + size > self.capacity
        if wrap:
            start = 0
        end = start + size
        pending = self.pending
        while pending:
            first = pending[0]
            if wrap:
                covered = first[0] >= head or first[0] < end
            else:
                covered = first[0] < end and first[1] > start
            if not covered:
                break
            pending.popleft()
            self._retire(first[2], first[3])
        self.head = end
        return start

    def _retire(self, event, finish) -> None:
        if event is not None:
            event.synchronize()
            self._events.append(event)
        if finish is not None:
            finish()

    def _drain(self) -> None:
        while self.pending:
            region = self.pending.popleft()
            self._retire(region[2], region[3])

    # -- the moves (a test replaces these by a deferred engine to check the guards)
    def _move(self, dst, src) -> None:
        """Queue a copy between the buffer and a GPU tensor: asynchronous from pinned memory
        (on the GPU's current stream), synchronous otherwise."""
        dst.copy_(src, non_blocking=self.pinned)

    def _mark(self, index):
        """An event recorded after the moves queued so far on GPU ``index``'s current stream
        (None where the moves are synchronous: nothing to wait for)."""
        if not self.pinned:
            return None
        import torch

        event = self._events.pop() if self._events else torch.cuda.Event()
        event.record(current_stream(index))
        return event

    def _types(self, dtype):
        """(native numpy dtype, torch dtype) for a numpy or torch dtype; None for one that
        tensor_graphs does not name."""
        found = self._dtypes.get(dtype)
        if found is None:
            from tensor_graphs.kernels.torch import convert

            if type(dtype).__module__ == "torch":
                ours = _dtypes.BY_NAME.get(str(dtype).removeprefix("torch."))
            else:  # (a foreign byte order is swapped by the copy into the buffer)
                ours = _dtypes.from_numpy(np.dtype(dtype).newbyteorder("="))
            found = False if ours is None else (ours.np_dtype, convert.torch_dtype(ours))
            self._dtypes[dtype] = found
        return found or None


_staging: dict[str, Staging] = {}  # torch device ("cuda:0"; the simulated GPU's "cpu")
_staging_lock = threading.Lock()


def staging(device) -> Staging:
    """The staging buffer of GPU ``device`` (a name, a Device or a torch device), made on
    first use: pinned on a real GPU, ordinary memory on the simulated one."""
    key = torch_device(device if isinstance(device, (str, Device)) else str(device))
    found = _staging.get(key)
    if found is None:
        with _staging_lock:
            found = _staging.get(key)
            if found is None:
                found = _staging[key] = Staging(pinned=simulated_cuda() is None)
    return found
