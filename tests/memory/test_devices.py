"""Memory plans of plans that span devices (no GPU needed: hand-made plans with fake kernels
on a "cuda" kind and copy steps between the kinds): a copied value is a new buffer on its
target, a weight's copy is held with the weights, each device gets its own arena aligned as
the device wants (256 bytes on a GPU, 64 on the host), and OutOfMemory names the device."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.memory import (
    ALIGNMENTS,
    OutOfMemory,
    check_fits,
    lint_memory,
    overlapping_pairs,
    plan_memory,
)
from tensor_graphs.memory.liveness import ARENA, WEIGHT
from tensor_graphs.planner.plan import Plan, Slot, Step
from tensor_graphs.runtime.lower import lint_program, lower


def _kernel(name: str, backend: str, fn) -> SimpleNamespace:
    return SimpleNamespace(name=name, backend=backend, fn=fn, view=False, inplace=None,
                           contiguous=False, writes_out=False, prepare=None, device="cpu")


def _copy(x, **_):
    return np.array(x, copy=True)


COPY = _kernel("fake_copy", "copy", _copy)
GPU_TANH = _kernel("fake_gpu_tanh", "torch", lambda x: np.tanh(x))
ADD = _kernel("fake_add", "numpy", lambda a, b: np.add(a, b))


def cross_device_plan():
    """x (host) -> copied to the GPU -> tanh there -> copied back; + w, a weight that lives on
    the GPU and is copied to the host (once per binding: static)."""
    x = tg.input("x", (3, 5))
    w = tg.weight("w", (3, 5))
    t = tg.tanh(x)
    y = t + w
    steps = (
        Step(COPY, x, "cuda", (Slot(x, "cpu", False),), (), {}, None, 0.0, ""),
        Step(GPU_TANH, t, "cuda", (Slot(x, "cuda", True),), (t,), {}, None, 0.0, ""),
        Step(COPY, t, "cpu", (Slot(t, "cuda", False),), (), {}, None, 0.0, ""),
        Step(COPY, w, "cpu", (Slot(w, "cuda", False),), (), {}, None, 0.0, ""),
        Step(ADD, y, "cpu", (Slot(t, "cpu", True), Slot(w, "cpu", True)), (y,), {}, None,
             0.0, ""),
    )
    plan = Plan(steps, (Slot(y, "cpu", False),), {},
                (Slot(x, "cpu", False), Slot(w, "cuda", False)), (), 1e-6)
    return plan, x, w, t, y


def test_a_copy_fills_the_moved_slot_on_its_target():
    plan, x, w, t, y = cross_device_plan()
    assert [s.slot for s in plan.steps[:3]] == [Slot(x, "cuda", True), Slot(t, "cuda", False),
                                                Slot(t, "cpu", True)]
    mp = plan_memory(plan)  # (a KeyError on the moved slots before copies were keyed so)
    assert lint_memory(mp) == []
    live = mp.liveness
    on = {k: (v.device, v.buffer.kind) for k, v in live.values.items()}
    assert on[Slot(x, "cuda", True)] == ("cuda", ARENA)
    assert on[Slot(t, "cuda", False)] == ("cuda", ARENA)
    assert on[Slot(t, "cpu", True)] == ("cpu", ARENA)
    assert on[Slot(w, "cpu", True)] == ("cpu", WEIGHT)  # a weight's copy: once per binding
    assert Slot(w, "cpu", True) in live.static
    assert set(mp.arena) == {"cpu", "cuda"} and mp.weights == {"cuda": 60, "cpu": 60}
    assert mp.alignments == {"cpu": 64, "cuda": 256} == {k: ALIGNMENTS[k] for k in mp.arena}
    assert mp.arena["cuda"] == 2 * 256 and mp.arena["cpu"] == 2 * 64  # x and t, t and y
    for device in ("cpu", "cuda"):
        bufs = live.arena_buffers(device)
        assert all(mp.buffer_offsets[b.id] % ALIGNMENTS[device] == 0 for b in bufs)
        assert overlapping_pairs(bufs, mp.buffer_offsets) == []
    program = lower(plan, mp)
    assert lint_program(program) == []
    assert [ins.name for ins in program.prelude] == ["fake_copy"]  # w's copy
    assert [(ins.reads, ins.device, ins.copy_in) for ins in program.instructions] == [
        ("cpu", "cuda", True), ("cpu", "cuda", False), ("cpu", "cpu", False),
        ("cpu", "cpu", False)]  # (fake kernels: placement is their device, "cpu")
    assert program.devices[program.outputs[0]] == "cpu"


def test_the_plan_runs_out_of_its_arenas(run_in_arena):
    plan, *_ = cross_device_plan()
    rng = np.random.default_rng(0)
    X, W = rng.standard_normal((2, 3, 5)).astype(np.float32)
    got = run_in_arena(plan, plan_memory(plan), {"x": X, "w": W})
    np.testing.assert_array_equal(got[0], np.tanh(X) + W)


def test_out_of_memory_names_the_device_that_lacks_it():
    plan, *_ = cross_device_plan()
    mp = plan_memory(plan)
    need = mp.totals()
    fits = SimpleNamespace(name="cpu", kind="cpu", capacity=1 << 30, allocated=0)
    small = SimpleNamespace(name="cuda:0", kind="cuda", capacity=need["cuda"] - 1,
                            allocated=0)
    with pytest.raises(OutOfMemory, match="out of memory on cuda:0") as info:
        check_fits(mp, {"cpu": fits, "cuda": small})
    assert info.value.required == need["cuda"]
    check_fits(mp, {"cpu": fits, "cuda": SimpleNamespace(name="cuda:0", kind="cuda",
                                                         capacity=need["cuda"], allocated=0)})
