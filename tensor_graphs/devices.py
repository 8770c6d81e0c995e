"""Devices are values: a name ("cpu", "cuda:0") and a capacity in bytes.

A device is memory, not a backend: numpy, C and torch-CPU kernels all run on ``cpu`` and share
its memory (no copies between them); torch-CUDA and Triton kernels would share ``cuda:N``.
Capacity is detected (physical memory, or the cgroup limit when smaller; the GPU's memory) and
can be overridden: ``tg.Device("cpu", capacity=8 << 30)``.
"""

from __future__ import annotations

import os
import threading

from tensor_graphs.errors import DeviceError

KINDS = ("cpu", "cuda")
_allocated: dict[str, int] = {}
_lock = threading.Lock()


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
        elif not isinstance(capacity, int) or capacity <= 0:
            raise DeviceError(f"device capacity must be a positive number of bytes, "
                              f"got {capacity!r}")
        for slot, value in (("name", "cpu" if kind == "cpu" else f"cuda:{idx}"), ("kind", kind),
                            ("index", idx), ("capacity", capacity)):
            object.__setattr__(self, slot, value)

    def __setattr__(self, name, value):
        raise AttributeError("devices are values; make a new one")

    @property
    def allocated(self) -> int:
        """Bytes tensor_graphs currently holds on this device (arenas, weights, state)."""
        return _allocated.get(self.name, 0)

    def __eq__(self, other) -> bool:
        return isinstance(other, Device) and (self.name, self.capacity) == (other.name,
                                                                             other.capacity)

    def __hash__(self) -> int:
        return hash((self.name, self.capacity))

    def __repr__(self) -> str:
        return f"Device({self.name!r}, capacity={self.capacity})"


def track(device: Device, nbytes: int) -> None:
    """Allocators report what they take (positive) and give back (negative)."""
    with _lock:
        _allocated[device.name] = _allocated.get(device.name, 0) + nbytes


def as_device(value: Device | str) -> Device:
    return value if isinstance(value, Device) else Device(value)


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _detect_capacity(kind: str, index: int) -> int:
    if kind == "cuda":
        if not cuda_available():
            raise DeviceError(f"cuda:{index} is not available here (no CUDA-enabled torch or "
                              "no GPU); plan for 'cpu' instead")
        import torch

        if index >= torch.cuda.device_count():
            raise DeviceError(f"cuda:{index} does not exist: {torch.cuda.device_count()} GPU(s)")
        return int(torch.cuda.get_device_properties(index).total_memory)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit.isdigit():
            return min(physical, int(limit))
    except OSError:
        pass
    return physical
