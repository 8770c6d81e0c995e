"""Devices: names, detected and overridden capacity, allocation tracking, errors."""

from __future__ import annotations

import gc
import io
import os

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs import devices
from tensor_graphs.kernels.torch import cuda_available


def test_cpu_device_is_a_value():
    d = tg.Device("cpu")
    assert (d.name, d.kind, d.index) == ("cpu", "cpu", 0)
    assert isinstance(d.capacity, int) and d.capacity > 0
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert d.capacity <= physical
    assert d == tg.Device("cpu") and hash(d) == hash(tg.Device("cpu"))
    assert tg.Device(d) == d and devices.as_device("cpu") == d and devices.as_device(d) is d
    with pytest.raises(AttributeError):
        d.capacity = 1
    assert "cpu" in repr(d)


def test_capacity_override():
    d = tg.Device("cpu", capacity=8 << 30)
    assert d.capacity == 8 << 30
    assert d != tg.Device("cpu")  # a different budget is a different value
    assert tg.Device("cpu", capacity=np.int64(1 << 20)).capacity == 1 << 20
    for bad in (0, -1, 1.5, True, "8G"):
        with pytest.raises(tg.DeviceError, match="capacity"):
            tg.Device("cpu", capacity=bad)


def test_capacity_follows_the_cgroup_limit(monkeypatch):
    limit = 1 << 30

    def fake_open(path, *args, **kwargs):
        if path == "/sys/fs/cgroup/memory.max":
            return io.StringIO(f"{limit}\n")
        raise OSError(path)

    monkeypatch.setattr(devices, "open", fake_open, raising=False)
    assert tg.Device("cpu").capacity == limit

    def unlimited(path, *args, **kwargs):
        if path == "/sys/fs/cgroup/memory.max":
            return io.StringIO("max\n")
        if path == "/sys/fs/cgroup/memory/memory.limit_in_bytes":
            return io.StringIO(f"{limit // 2}\n")  # cgroup v1
        raise OSError(path)

    monkeypatch.setattr(devices, "open", unlimited, raising=False)
    assert tg.Device("cpu").capacity == limit // 2


@pytest.mark.parametrize("name", ["tpu", "cuda:x", "cpu:1", "", "cuda:-1", "gpu:0"])
def test_unknown_device(name):
    with pytest.raises(tg.DeviceError, match="unknown device"):
        tg.Device(name)


@pytest.mark.skipif(cuda_available(), reason="this machine has a usable GPU")
def test_cuda_unavailable_says_so():
    with pytest.raises(tg.DeviceError, match=r"cuda:0 is not available here.*'cpu'"):
        tg.Device("cuda:0")
    with pytest.raises(tg.DeviceError, match="not available"):
        tg.Device("cuda")


def test_simulated_gpu_is_cuda0_in_host_memory(simulate_gpu):
    """TG_SIMULATED_CUDA makes cuda:0 a device whose tensors live in host memory, so the GPU
    path runs in CI; a capacity may be given, anything else is refused by name."""
    from tensor_graphs import devices

    simulate = simulate_gpu
    simulate("1")
    d = tg.Device("cuda")
    assert (d.name, d.capacity) == ("cuda:0", devices.SIMULATED_CAPACITY)
    assert devices.torch_device(d) == "cpu" and devices.cuda_available()
    with pytest.raises(tg.DeviceError, match="simulated GPU is cuda:0"):
        tg.Device("cuda:1")
    simulate(str(3 << 20))
    assert tg.Device("cuda:0").capacity == 3 << 20
    simulate("lots")
    with pytest.raises(tg.DeviceError, match="TG_SIMULATED_CUDA='lots'"):
        tg.Device("cuda")
    simulate(None)
    assert devices.torch_device("cuda:1") == "cuda:1" and devices.torch_device("cpu") == "cpu"


@pytest.mark.skipif(not cuda_available() or bool(os.environ.get("TG_SIMULATED_CUDA")),
                    reason="no usable CUDA GPU")
def test_cuda_device():
    import torch

    d = tg.Device("cuda")
    assert (d.name, d.kind, d.index) == ("cuda:0", "cuda", 0)
    assert d.capacity == torch.cuda.get_device_properties(0).total_memory
    assert tg.Device("cuda:0", capacity=1 << 30).capacity == 1 << 30
    with pytest.raises(tg.DeviceError, match="does not exist"):
        tg.Device(f"cuda:{torch.cuda.device_count()}")
    assert "torch" in d.backends


def test_allocated_is_tracked_per_device_for_every_backend():
    d = tg.Device("cpu")
    small = tg.Device("cpu", capacity=1 << 20)  # the same memory, another budget
    before = d.allocated
    devices.track(d, 1000)  # say, a numpy arena
    devices.track("cpu", 24)  # and a torch-CPU buffer: one count for the device
    try:
        assert d.allocated == small.allocated == before + 1024
        assert d.free == d.capacity - d.allocated
    finally:
        devices.track(d, -1024)
    assert d.allocated == before
    with pytest.raises(tg.DeviceError, match="given back"):
        devices.track(d, -(before + 1))
    assert d.allocated == before


def test_backends_share_the_cpu():
    backends = tg.Device("cpu").backends
    assert "numpy" in backends and "copy" not in backends
    if "torch" in {k.backend for k in tg.kernels.all()}:
        assert "torch" in backends


def test_allocated_counts_arenas_not_weights():
    """What ``Device.allocated`` says it counts: a program's arena, on first run; its bound
    weights are in ``prog.memory()``, not in the device's count."""
    x = tg.input("x", (64, 32))
    w = tg.weight("w", (32, 48))
    prog = tg.compile(tg.tanh(x @ w) + 1.0, db=":memory:")
    d = tg.Device("cpu")
    gc.collect()  # earlier tests' programs give their arenas back now, not mid-test
    gc.disable()
    try:
        before = d.allocated
        weights = np.ones((32, 48), np.float32)
        prog.bind(w=weights)
        assert d.allocated == before  # binding weights reports nothing
        prog(x=np.ones((64, 32), np.float32))
        arena = prog.memory_plan.arena["cpu"]
        assert arena > 0 and d.allocated - before == arena
    finally:
        gc.enable()
    assert prog.memory()["cpu"] >= arena + weights.nbytes


@pytest.mark.parametrize("message", [
    "CUDA error: device-side assert triggered\nCompile with `TORCH_USE_CUDA_DSA`",
    "CUDA error: an illegal memory access was encountered",
    "Triton Error [CUDA]: an illegal memory access was encountered",
    "CUDA error: unspecified launch failure",
    "CUDA error: misaligned address",
])
def test_cudas_sticky_errors_are_gpu_faults(message):
    """After these the process's GPU context is unusable: raised, never a kernel's failure."""
    fault = devices.gpu_fault(RuntimeError(message), "timing kernel k on (2, 3)")
    assert isinstance(fault, tg.errors.GPUFaultError)
    text = str(fault)
    assert "timing kernel k on (2, 3)" in text and message.splitlines()[0] in text
    assert "CUDA_LAUNCH_BLOCKING=1" in text
    assert devices.gpu_fault(fault, "again") is fault


@pytest.mark.parametrize("exc", [
    RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),  # the next call may fit
    IndexError("index out of range in self"),  # the CPU's bounds check: the kernel's own
    ValueError("result shape (2,), expected (3,)"),
])
def test_other_errors_are_the_kernels_own(exc):
    assert devices.gpu_fault(exc, "checking kernel k") is None
