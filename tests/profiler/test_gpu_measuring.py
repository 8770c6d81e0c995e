"""The profiler's GPU path without a GPU: synchronized samples, which calls a GPU adds, and the
hardware key each row is filed under.

A GPU queues work and returns from the launch: ``AsyncDevice`` below does the same with a
worker thread, so a sample that does not wait for the device reads the launches' time. The
GPU's kernels are host functions registered for device "cuda" (as the planner's own
cross-device test does), measured through a host ``DeviceIO``; tests/gpu runs the same path
on a real or simulated GPU.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.db import Hardware
from tensor_graphs.db.cost import CostModel
from tensor_graphs.db.hardware import current
from tensor_graphs.db.store import open_db
from tensor_graphs.kernels import copy as copies
from tensor_graphs.kernels import registry
from tensor_graphs.planner.search import Planner, signature
from tensor_graphs.profiler import measure, missing
from tensor_graphs.profiler.device import HOST, DeviceIO
from tensor_graphs.profiler.measure import Call, measure_together

WORK = 2e-3  # seconds of device work per call of the asynchronous kernel


class AsyncDevice:
    """A device that runs queued work after what is already queued: ``launch`` returns at
    once, ``sync`` waits until everything queued so far is done (a clock, no thread: a
    profiler that never waits leaves nothing to drain)."""

    def __init__(self):
        self.busy_until = time.perf_counter()

    def launch(self, seconds: float) -> None:
        self.busy_until = max(self.busy_until, time.perf_counter()) + seconds

    def sync(self) -> None:
        while (left := self.busy_until - time.perf_counter()) > 0:
            time.sleep(left)


def async_call(device: AsyncDevice):
    """A kernel call whose work runs on ``device``: a launch that returns x at once."""

    def launch(x):
        device.launch(WORK)
        return x

    k = type("Kernel", (), dict(name="test_async_identity", source_hash="0", fn=staticmethod(
        launch), prepare_arguments=staticmethod(lambda arrays: arrays)))()
    x = tg.input("x", (4,))
    return Call(k, x, (x,), {}, signature([x], {}))


@pytest.mark.parametrize("synchronized", [True, False])
def test_a_device_sample_waits_for_the_work_it_queued(monkeypatch, synchronized):
    """With the device's sync around every sample, a call measures its work (2 ms); a
    profiler that read the clock around the launches alone would see microseconds, and a
    GPU kernel would look as cheap as its launch."""
    device = AsyncDevice()
    io = DeviceIO(HOST.to_device, HOST.to_host, device.sync if synchronized else None)
    monkeypatch.setattr(measure, "device_io", lambda k: io)
    (row,) = measure_together([async_call(device)], repeats=3, min_sample=5e-3,
                              max_seconds=1.0)
    assert row.failure is None and row.runs == 3
    if synchronized:
        assert row.min >= 0.9 * WORK
    else:  # the failure the sync prevents: launches timed, not the work
        assert row.min < 0.5 * WORK


GPU = Hardware("test-box", "cuda|Test GPU|sm 9.0|driver 1|cuda 13", current("cpu").libs)


@pytest.fixture
def gpu_tanh():
    """A GPU tanh and the host<->GPU copies as host functions (where the real copies are
    registered, a GPU machine, they are used), unregistered afterwards."""
    made = []
    real = {k.name for k in registry.all()}
    tg.kernel("tanh", backend="torch", device="cuda", name="test_prof_gpu_tanh")(
        lambda x: np.tanh(x))
    made.append("test_prof_gpu_tanh")
    for name, src, dst in (("copy_host_to_cuda", "cpu", "cuda"),
                           ("copy_cuda_to_host", "cuda", "cpu"),
                           ("copy_same_memory_cuda", "cuda", "cuda")):
        if name not in real:
            copies.copy_kernel(name, src, dst, same_memory=src == dst)(
                lambda x, device=None: np.array(x))
            made.append(name)
    try:
        yield set(made)
    finally:
        for name in made:
            registry.unregister(name)
            copies.ROUTES.pop(name, None)
            copies.SAME_MEMORY.discard(name)
            missing._verified.pop(name, None)


def planner_for(db, shape=(4, 16)) -> Planner:
    x = tg.input("x", shape)
    cost = CostModel(db, {"cpu": current("cpu"), "cuda": GPU})
    planner = Planner([tg.tanh(x)], target="cuda", cost=cost, tolerance=1e-5,
                      backends=("numpy", "torch", "copy"), generate=False)
    planner.solve()  # every option of every slot it visits
    return planner


GPU_CALLS = {"test_prof_gpu_tanh", "copy_host_to_cuda", "copy_cuda_to_host"}


def test_gpu_kernels_and_copies_are_measured_only_where_a_gpu_is_usable(monkeypatch, gpu_tanh):
    db = open_db(":memory:")
    monkeypatch.setattr(missing, "cuda_available", lambda: False)
    names = {o.kernel.name for o in missing.calls_to_measure(planner_for(db))}
    assert "numpy_tanh" in names and not names & GPU_CALLS
    monkeypatch.setattr(missing, "cuda_available", lambda: True)
    names = {o.kernel.name for o in missing.calls_to_measure(planner_for(db))}
    assert GPU_CALLS <= names  # a copy that moves nothing is free: never measured
    assert "copy_same_memory_cuda" not in names


def fake_gpu(monkeypatch, made: set[str]) -> None:
    """The GPU's kernels made here are host functions: usable, called on the host, verified
    (real copies, on a machine with a GPU, go through their own device IO)."""
    real_io = measure.device_io
    monkeypatch.setattr(missing, "cuda_available", lambda: True)
    monkeypatch.setattr(measure, "device_io", lambda k: HOST if k.name in made else real_io(k))
    for name in made:
        monkeypatch.setitem(missing._verified, name, None)


def test_gpu_rows_are_filed_under_the_gpus_key_and_planned_from(monkeypatch, gpu_tanh):
    fake_gpu(monkeypatch, gpu_tanh)
    db = open_db(":memory:")
    planner = planner_for(db)
    added = missing.profile_missing(planner, db, progress=False)
    assert added == len(db.rows())
    for r in db.rows():
        assert r.failure is None and r.runs > 0
        on_gpu = r.kernel in GPU_CALLS or r.kernel.startswith("torch_cuda_")  # real, if any
        assert r.hardware == (GPU if on_gpu else current("cpu")), r.kernel
    rows = {r.kernel: r for r in db.rows()}
    assert GPU_CALLS <= set(rows)
    sig = signature([tg.input("x", (4, 16))], {"device": "cuda"})
    assert rows["copy_host_to_cuda"].signature == sig  # called with its target, keyed by it
    # a second planner finds every option measured (the copies under the GPU's key too) but
    # the host-side ones that could not win (missing.gated)
    planner.cost.refresh()
    again = planner_for(db)
    left = {(o.kernel.name, o.signature): o for o in missing.calls_to_measure(again)}
    assert all(missing.gated(o, again) for o in left.values())
    assert missing.could_win(again, left) == set()
    sources = {o.kernel.name: o.estimate.source for opts in again._options.values()
               for o in opts if o.kernel is not None}
    assert all(sources[n] == "measured" for n in GPU_CALLS)


def test_a_profiler_measures_another_devices_calls_while_the_gpus_are_held(monkeypatch,
                                                                          gpu_tanh):
    """Claims are per hardware key: with the GPU's calls held by another live profiler, the
    CPU's are measured first; the GPU's are taken over once that lease expires."""
    fake_gpu(monkeypatch, gpu_tanh)
    db = open_db(":memory:")
    planner = planner_for(db)
    todo = missing.calls_to_measure(planner)
    gpu_items = [(o.kernel.name, o.kernel.source_hash, o.signature) for o in todo
                 if o.kernel.name in GPU_CALLS]
    assert db.claim(gpu_items, "other-host:1:x", 1.0, hardware=GPU) == \
        ["claimed"] * len(gpu_items)
    order = []
    start = time.monotonic()
    for window in missing.Work(db, todo, lease=5.0, hardware=planner.cost.hardware):
        for o, m in window:
            db.record(m)
            order.append((o.kernel.name, time.monotonic() - start))
    names = [n for n, _ in order]
    assert set(names) == {o.kernel.name for o in todo}
    first_gpu = min(i for i, n in enumerate(names) if n in GPU_CALLS)
    assert all(n not in GPU_CALLS for n in names[:first_gpu])
    assert first_gpu == len(todo) - len(gpu_items)  # every CPU call before the held ones
    assert order[first_gpu][1] >= 0.9  # taken over after the other profiler's lease
