"""A call whose float64 reference does not fit in memory (cumsum's reference is a masked sum
over an n x n mask: 64 GiB at n = 262144, more than CI's machine has; here the allocation's
failure is made to happen at a small n) is timed with its error unknown, not recorded as the
kernel's failure: every cumsum kernel was marked failed at that shape, and the plan took the
reference itself as the kernel, which failed the call."""

from __future__ import annotations

import tensor_graphs as tg
from tensor_graphs.kernels import registry
from tensor_graphs.planner.search import signature
from tensor_graphs.profiler import measure
from tensor_graphs.profiler.measure import Call, measure_together


def _too_large(*args, **kwargs):
    raise MemoryError("Unable to allocate 64.0 GiB for an array with shape (262144, 262144)")


def test_a_reference_too_large_for_memory_leaves_the_kernel_timed(monkeypatch):
    x = tg.input("x", (4096,))
    root = tg.cumsum(x, axis=0)
    call = Call(registry.get("numpy_cumsum"), root, (x,), {"axis": 0}, signature([x], {}))
    checked = measure_together([call], repeats=2, min_sample=1e-4, max_seconds=0.5)[0]
    assert checked.failure is None and checked.error is not None and checked.error < 1e-6
    monkeypatch.setattr(measure, "evaluate", _too_large)
    (row,) = measure_together([call], repeats=2, min_sample=1e-4, max_seconds=0.5)
    assert row.failure is None and row.runs == 2 and row.error is None
    assert row.seconds > 0
