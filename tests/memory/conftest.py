"""The memory tests' oracle (the ``run_in_arena`` fixture): a slow reference runner that
executes a plan with every transient value at its planned place in one numpy arena per device
(CPU plans), and a sketch of what an arena runtime does. It is test code, so it lives here and
not in the package (it runs plans with the runtime's leaf values, above the memory layer).

Per step it calls the kernel, then copies the result into the result's arena bytes (a view
result is instead rebuilt from the arena at the planned offset and strides, and must equal
what the kernel returned); ``contiguous`` kernels get strided inputs densified into their
planned scratch buffers. With ``poison`` every buffer is overwritten with 0xFF bytes (NaN for
floats) right after its last use, so a value read after its planned lifetime shows up.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

from tensor_graphs.memory.liveness import ARENA
from tensor_graphs.memory.plan import MemoryPlan
from tensor_graphs.planner.plan import Plan
from tensor_graphs.runtime.program import leaf_value


def arena_array(arena: np.ndarray, offset: int, shape, dtype, strides=None) -> np.ndarray:
    """The array at ``offset`` (bytes) in ``arena`` (C-contiguous unless ``strides``)."""
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    if 0 in shape:
        return np.empty(shape, dtype)
    return np.ndarray(shape, dtype, buffer=arena, offset=offset, strides=strides)


def _run_in_arena(plan: Plan, memory_plan: MemoryPlan, arrays: Mapping[str, np.ndarray],
                 dims: Mapping | None = None, poison: bool = True) -> list[np.ndarray]:
    """Run ``plan`` with transients in arenas laid out by ``memory_plan``; returns copies of
    the outputs. Raises AssertionError when a view kernel's result is not where the memory
    plan says it is."""
    dims = dims or {}
    live = memory_plan.liveness
    arenas = {d: np.zeros(size, np.uint8) for d, size in memory_plan.arena.items()}
    offsets = memory_plan.buffer_offsets
    values: dict = {}
    for s in plan.leaves:
        key = plan.resolve(s)
        values[key] = leaf_value(key.node, arrays, dims)
    dying: dict[int, list] = {}
    scratch: dict[tuple, object] = {}
    for b in live.arena_buffers():
        dying.setdefault(b.last, []).append(b)
        if b.scratch:
            scratch[(b.first, b.node)] = b
    with np.errstate(all="ignore"):
        for pos, (step, (key, ins)) in enumerate(zip(plan.steps, live.steps)):
            if key in values:
                continue
            args = [values[k] for k in ins]
            if step.kernel.contiguous:
                for j, (k, a) in enumerate(zip(ins, args)):
                    if a.flags.c_contiguous:
                        continue
                    b = scratch.get((pos, k.node))
                    if b is None:  # a view kernel that copies, or static: no scratch planned
                        args[j] = np.ascontiguousarray(a)
                        continue
                    d = arena_array(arenas[b.device], offsets[b.id], a.shape, a.dtype)
                    d[...] = a
                    args[j] = d
            out = np.asarray(step.kernel.fn(*args, **dict(step.attrs)))
            p = memory_plan.placements[key]
            v = live.values[key]
            if p.kind != ARENA:
                values[key] = out
            else:
                dtype = step.node.dtype.np_dtype
                arr = arena_array(arenas[p.device], p.offset, step.node.shape, dtype, p.strides)
                if v.view_of is not None:
                    assert out.shape == arr.shape and np.array_equal(out, arr, equal_nan=True), \
                        f"step {pos} ({step}): the view is not where the memory plan puts it"
                else:
                    arr[...] = out
                values[key] = arr
            if poison:
                for b in dying.get(pos, ()):
                    start = offsets[b.id]
                    arenas[b.device][start:start + b.nbytes] = 0xFF
    return [np.array(values[plan.resolve(o)], copy=True) for o in plan.outputs]


@pytest.fixture(scope="session")
def run_in_arena():
    """``run_in_arena(plan, memory_plan, arrays, dims=None, poison=True)``: the plan's outputs
    computed out of arenas laid out by the memory plan (see the module docstring)."""
    return _run_in_arena
