"""Devices are values: a name ("cpu", "cuda:0") and a capacity in bytes.

A device is memory, not a backend: numpy, C and torch-CPU kernels all run on ``cpu`` and share
its memory (no copies between them); torch-CUDA and Triton kernels would share ``cuda:N``
(``Device.backends`` lists the backends with kernels for a device). A kernel's ``device`` is a
device *kind*; moving a value between devices is a copy_to kernel (``kernels/copy.py``).
Capacity is detected (physical memory, or the cgroup limit when smaller, cgroup v2 or v1; the
GPU's memory) and can be overridden: ``tg.Device("cpu", capacity=8 << 30)``. ``allocated`` is
what allocators report through ``track``, per device name, whichever backend allocated it, so
every ``Device`` value of one device sees one count. Today only programs' arenas report
(runtime/program.py): weights, kept state and buffers kernels allocate for themselves are not
counted (a program's ``memory()`` gives its whole footprint per device).
"""

from __future__ import annotations

import contextlib
import numbers
import os
import threading
import warnings

from tensor_graphs.errors import DeviceError, GPUFaultError

KINDS = ("cpu", "cuda")
_allocated: dict[str, int] = {}
_lock = threading.Lock()
_released: list[tuple[str, int]] = []  # from finalizers, applied under the lock later


class Device:
    """A device: ``kind`` ("cpu"/"cuda"), ``index``, ``capacity`` (bytes), ``allocated``."""

    __slots__ = ("name", "kind", "index", "capacity")

    def __init__(self, name: str = "cpu", capacity: int | None = None):
        if isinstance(name, Device):
            name = name.name
        kind, _, index = str(name).partition(":")
        if kind not in KINDS or (index and not index.isdigit()) or (kind == "cpu" and index):
            raise DeviceError(f"unknown device {name!r}; use 'cpu' or 'cuda:N'")
        idx = int(index or 0)
        if capacity is None:
            capacity = _detect_capacity(kind, idx)
        elif isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral) \
                or capacity <= 0:
            raise DeviceError(f"device capacity must be a positive number of bytes, "
                              f"got {capacity!r}")
        capacity = int(capacity)
        for slot, value in (("name", "cpu" if kind == "cpu" else f"cuda:{idx}"), ("kind", kind),
                            ("index", idx), ("capacity", capacity)):
            object.__setattr__(self, slot, value)

    def __setattr__(self, name, value):
        raise AttributeError("devices are values; make a new one")

    @property
    def allocated(self) -> int:
        """Bytes of the arenas of live programs on this device: what the next program's
        ``OutOfMemory`` check subtracts from capacity. Weights, kept state and buffers kernels
        allocate for themselves are not counted (``prog.memory()`` gives a program's whole
        footprint)."""
        with _lock:
            _apply_released()
            return _allocated.get(self.name, 0)

    @property
    def free(self) -> int:
        """capacity - allocated: what tensor_graphs may still take (other programs aside)."""
        return self.capacity - self.allocated

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends with kernels registered for this device's kind (they share its
        memory): ("c", "numpy", "torch") on a CPU with torch installed."""
        from tensor_graphs.kernels import registry

        return tuple(sorted({k.backend for k in registry.all()
                             if k.device == self.kind and k.backend != "copy"}))

    def __eq__(self, other) -> bool:
        return isinstance(other, Device) and (self.name, self.capacity) == (other.name,
                                                                             other.capacity)

    def __hash__(self) -> int:
        return hash((self.name, self.capacity))

    def __repr__(self) -> str:
        return f"Device({self.name!r}, capacity={self.capacity})"


def release_later(device: str, nbytes: int) -> None:
    """For finalizers: give ``nbytes`` back without taking the lock (a garbage collection can
    run a finalizer while ``track`` holds it, in the same thread); applied at the next
    ``track`` or ``allocated``."""
    _released.append((device, int(nbytes)))


def _apply_released() -> None:
    while _released:
        name, nbytes = _released.pop()
        _allocated[name] = _allocated.get(name, 0) - nbytes


def track(device: Device | str, nbytes: int) -> None:
    """Allocators report what they take (positive) and give back (negative)."""
    name = device.name if isinstance(device, Device) else Device(device).name
    with _lock:
        _apply_released()
        total = _allocated.get(name, 0) + int(nbytes)
        if total < 0:
            raise DeviceError(f"{name}: {-int(nbytes)} bytes given back but only "
                              f"{total - int(nbytes)} were allocated (an allocator frees twice)")
        _allocated[name] = total


def as_device(value: Device | str) -> Device:
    return value if isinstance(value, Device) else Device(value)


SIMULATED = "TG_SIMULATED_CUDA"  # environment: a GPU simulated in host memory (see below)
SIMULATED_CAPACITY = 1 << 30  # the simulated GPU's memory when the variable is just "1"


_UNREAD = object()  # simulated_cuda's memo before the environment is read
_simulated: object = _UNREAD


def simulated_cuda() -> int | None:
    """The capacity of the simulated GPU, or None when there is none.

    Every session but a few has no GPU, yet the GPU path (planning across devices, a torch
    arena per GPU, torch CUDA and Triton kernels, copies) must run in CI. With
    ``TG_SIMULATED_CUDA=1`` (or a capacity in bytes) set before tensor_graphs is imported,
    ``cuda:0`` is a device whose memory is host memory: its tensors are torch CPU tensors,
    torch's CUDA kernels run as CPU ops and Triton kernels run in Triton's interpreter. The
    code paths are the GPU's; only the timings are not (profiling it files CPU times under a
    hardware key of its own, never a real GPU's). The variable wins over a real GPU, so a GPU
    machine can run the simulation too.

    The variable is read once per process (a decode token asked ~50 times, ~0.1 ms of host
    time before each CUDA graph replay); ``reread_environment`` reads it again (tests that
    set it)."""
    global _simulated
    if _simulated is _UNREAD:
        _simulated = _read_simulated()
    return _simulated


def reread_environment() -> None:
    """Forget what ``simulated_cuda`` read: the next call reads ``TG_SIMULATED_CUDA`` again
    (and ``torch_device`` follows it)."""
    global _simulated
    _simulated = _UNREAD
    _torch_devices.clear()


def _read_simulated() -> int | None:
    value = os.environ.get(SIMULATED, "").strip()
    if value in ("", "0"):
        return None
    if value == "1":
        return SIMULATED_CAPACITY
    if not value.isdigit():
        raise DeviceError(f"{SIMULATED}={value!r}: give 1 (a {SIMULATED_CAPACITY >> 30} GiB "
                          "simulated GPU) or the simulated GPU's capacity in bytes")
    return int(value)


def cuda_available() -> bool:
    """A GPU tensor_graphs can run on: a real one (torch with CUDA), or the simulated one."""
    if simulated_cuda() is not None:
        return True
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


_torch_devices: dict[str, str] = {}  # device name -> torch_device's answer (per process)


def torch_device(device: Device | str) -> str:
    """The torch device whose memory holds values of ``device`` ("cpu", "cuda", "cuda:N"):
    itself, except that the simulated GPU's memory is the host's ("cpu")."""
    name = str(device.name if isinstance(device, Device) else device)
    found = _torch_devices.get(name)
    if found is None:
        kind, _, index = name.partition(":")
        found = "cpu" if kind == "cpu" or simulated_cuda() is not None else f"cuda:{index or 0}"
        _torch_devices[name] = found
    return found


def _detect_capacity(kind: str, index: int) -> int:
    if kind == "cuda":
        simulated = simulated_cuda()
        if simulated is not None:
            if index != 0:
                raise DeviceError(f"cuda:{index} does not exist: the simulated GPU is cuda:0")
            return simulated
        if not cuda_available():
            raise DeviceError(f"cuda:{index} is not available here (no CUDA-enabled torch or "
                              "no GPU); plan for 'cpu' instead")
        import torch

        if index >= torch.cuda.device_count():
            raise DeviceError(f"cuda:{index} does not exist: {torch.cuda.device_count()} GPU(s)")
        return int(torch.cuda.get_device_properties(index).total_memory)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max",  # cgroup v2 ("max" when unlimited)
                 "/sys/fs/cgroup/memory/memory.limit_in_bytes"):  # v1 (a huge number)
        try:
            with open(path) as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit():
            return min(physical, int(limit))
    return physical


# CUDA's sticky errors, as torch and Triton word them: after one, every later call on the
# process's GPU fails with the same error, whatever it runs
STICKY_GPU_ERRORS = (
    "device-side assert triggered",  # a kernel's assert (torch's index bounds checks)
    "illegal memory access",  # a read or write outside any allocation
    "unspecified launch failure",  # a kernel that crashed
    "illegal instruction",  # code the GPU cannot run
    "misaligned address",  # a vector access off its alignment
    "hardware stack error",  # a kernel's stack overflowed
)


def gpu_fault(exc: BaseException, doing: str) -> GPUFaultError | None:
    """A ``GPUFaultError`` for ``exc`` when it is one of CUDA's sticky errors, met while
    ``doing`` (what the caller was running, named in the message), else None. Callers that
    record an exception as a kernel's failure (verification, measurement) raise it instead:
    the fault may be an earlier launch's (CUDA reports it at the next call that waits for the
    GPU), and filed it would mark that kernel and every later one as failing, for good."""
    if isinstance(exc, GPUFaultError):
        return exc
    text = str(exc)
    if not any(sticky in text for sticky in STICKY_GPU_ERRORS):
        return None
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return GPUFaultError(
        f"the GPU failed while {doing}: {type(exc).__name__}: {first}. CUDA reports a "
        "kernel's fault at a later call that waits for the GPU, so the kernel at fault may "
        "be one launched before; rerun with CUDA_LAUNCH_BLOCKING=1 to stop at its launch. "
        "This process can no longer use its GPU: start a new one. Nothing was recorded for "
        "the kernels met since (rows measured before are kept).")


@contextlib.contextmanager
def raising_syncs():
    """torch's sync debug mode "error" for the block (a call that waits for the GPU raises:
    a warm-up before a capture finds it there), set back after, without the warning torch
    prints each time it is set ("a prototype feature"), which a user's compile, decode and
    profile printed once per region warmed."""
    import torch

    mode = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype")
        torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Synchronization debug mode")
            torch.cuda.set_sync_debug_mode(mode)
