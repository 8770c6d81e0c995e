"""profile="missing" measures a generated kernel only where an optimistic plan picks it
(profiler/missing.py, db/generated_cost.py): fewer calls than measuring every candidate, the
same plan, and no step of it left unmeasured.

The clock is replaced by a deterministic one (``fake_time``: every kernel a multiple of its
roofline, generated ones 2.4-3.6x, registered ones 1.1-1.6x), so the two profiles see the same
times and their plans can be compared exactly; what is tested is which calls get measured."""

from __future__ import annotations

import shutil
import zlib

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.db import Measurement
from tensor_graphs.numerics import relative_error
from tensor_graphs.profiler import missing

pytestmark = pytest.mark.skipif(not tg.kernels.c.available(), reason="no C compiler")


def fake_time(o) -> float:
    """Seconds of an option's call: its work at 20 GFLOP/s and 8 GB/s plus 2 us, times a
    factor of its own (generated kernels run further from the roofline)."""
    f = o.features
    base = 2e-6 + max(f.flops / 2e10, f.bytes / 8e9)
    jitter = (zlib.crc32(o.kernel.name.encode()) % 5) / 4  # 0 .. 1
    generated = getattr(o.kernel, "generated", False)
    return base * ((2.4 + 1.2 * jitter) if generated else (1.1 + 0.5 * jitter))


@pytest.fixture
def clock(monkeypatch):
    """measure_options on ``fake_time``; returns the (kernel, generated) of every call."""
    calls: list[tuple[str, bool]] = []

    def measure(options, hardware=None, scope=None):
        for i in range(0, len(options), missing.WINDOW):
            window = []
            for o in options[i:i + missing.WINDOW]:
                t = fake_time(o)
                calls.append((o.kernel.name, bool(getattr(o.kernel, "generated", False))))
                window.append((o, Measurement(
                    o.kernel.name, o.kernel.source_hash, o.signature, 5, t, t, t, 1e-7, None,
                    missing.hardware_of(o, hardware), 0.0, o.features.flops,
                    o.features.bytes)))
            yield window

    monkeypatch.setattr(missing, "measure_options", measure)
    return calls


def graph():
    """A linear layer with an epilogue nobody hand-fused, then a chain of elementwise ops and
    a softmax: every node roots a generated candidate (its maximal region)."""
    x, w, b = tg.input("x", (64, 96)), tg.weight("w", (96, 128)), tg.weight("b", (128,))
    h = x @ w + b
    y = tg.sigmoid(h) * h * 1.702
    for i in range(6):
        y = (tg.tanh(y * 1.01 + 0.1), y * 0.9 + 0.05, tg.sigmoid(y))[i % 3]
    return tg.softmax(y * 0.5, axis=-1)


def profiled(tmp_path, name: str, every: bool, monkeypatch):
    monkeypatch.setattr(missing, "MEASURE_EVERY_GENERATED", every)
    y = graph()
    prog = tg.compile(y, db=str(tmp_path / f"{name}.sqlite"), profile="missing")
    return prog, y


def test_generated_kernels_are_measured_only_where_they_could_win(tmp_path, clock,
                                                                  monkeypatch):
    every, y = profiled(tmp_path, "every", True, monkeypatch)
    measured_every = list(clock)
    clock.clear()
    some, _ = profiled(tmp_path, "some", False, monkeypatch)
    generated_every = {n for n, g in measured_every if g}
    generated_some = {n for n, g in clock if g}
    registered = {n for n, g in measured_every if not g}
    assert len(generated_every) >= 8  # every node's maximal region: a kernel each
    assert generated_some < generated_every and len(generated_some) <= len(generated_every) / 2
    assert {n for n, g in clock if not g} == registered  # registered kernels: all measured
    assert some.stats["measured"] == len(clock) < every.stats["measured"]
    # the same plan, every step of it measured
    assert [s.kernel.name for s in some.plan.steps] == [s.kernel.name for s in every.plan.steps]
    assert some.plan.cost == pytest.approx(every.plan.cost, rel=1e-12)
    assert all(s.source in ("measured", "free") for s in some.plan.steps), some.plan.explain()
    assert any(getattr(s.kernel, "generated", False) for s in some.plan.steps)
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((96, 128), np.float32) / 10,
               "b": rng.standard_normal(128).astype(np.float32)}
    some.bind(**weights)
    feeds = {"x": rng.standard_normal((64, 96), np.float32)}
    want = tg.evaluate(y, {**feeds, **weights}, dtype="float64")
    assert relative_error(some(**feeds), want) <= 1e-5


def chain():
    """Elementwise ops only: every node roots one more c_fused_ candidate, a prefix of the
    chain (one generator)."""
    y = tg.input("x", (256, 512))
    for i in range(9):
        y = (tg.tanh(y * 1.01 + 0.1), y * 0.9 + 0.05, tg.sigmoid(y))[i % 3]
    return y


def test_a_measured_region_beats_its_unmeasured_sub_regions_once_calibrated(tmp_path, clock,
                                                                            monkeypatch):
    """Why the estimates are calibrated: measuring only the first plan's generated kernel
    (the whole chain) leaves its sub-regions unmeasured. On their rooflines (calibration
    switched off) a sub-region and registered kernels beat the measured chain, which ran at
    its real multiple of its roofline, and the plan picks a kernel nobody timed; calibrated
    by that multiple, the sub-regions lose."""
    first = missing.could_win
    rounds: list[set] = []

    def one_round(planner, left):
        rounds.append(first(planner, left) if not rounds else set())
        return rounds[-1]

    monkeypatch.setattr(missing, "could_win", one_round)
    path = str(tmp_path / "first.sqlite")
    tg.compile(chain(), db=path, profile="missing")
    assert len(rounds) == 2 and len(rounds[0]) == 1  # the whole chain, measured alone
    calibrated = tg.compile(chain(), db=path, profile="never")
    assert all(s.source in ("measured", "free") for s in calibrated.plan.steps), \
        calibrated.plan.explain()
    from tensor_graphs.db.cost import CostModel

    monkeypatch.setattr(CostModel, "calibration", lambda self, kernel: None)
    copy = tmp_path / "copy.sqlite"  # a database opened afresh: no cost model cached with it
    shutil.copy(path, copy)
    rough = tg.compile(chain(), db=str(copy), profile="never")
    unmeasured = [s.kernel.name for s in rough.plan.steps if s.source == "estimated"]
    assert unmeasured and all(n.startswith("c_fused_") for n in unmeasured), \
        rough.plan.explain()


def test_every_generated_call_reads_its_arguments_and_nothing_else():
    """A row region that reached through a composite was called on the planner's root, whose
    graph holds the composite, not the argument found inside it (the attention's output): the
    profiler's graph then read the block's weights as well, and `tg profile block` filed 4
    such kernels as failed (FeedError), never to be planned."""
    from tensor_graphs.compiler import _planner_for
    from tensor_graphs.demo import transformer_block
    from tensor_graphs.ir.graph import leaves
    from tensor_graphs.profiler.measure import region_graph

    planner = _planner_for(transformer_block(), "cpu", None, ":memory:", {"batch": 1, "seq": 8},
                           None, True, "test")
    planner.solve()
    calls = [missing.call_of(o) for o in missing.calls_to_measure(planner)
             if getattr(o.kernel, "generated", False)]
    rows = [c for c in calls if c.kernel.name.startswith("c_row_")]
    assert rows, [c.kernel.name for c in calls]
    for call in calls:
        graph, names = region_graph(call)
        assert sorted(lf.name for lf in leaves([graph])) == sorted(names.values()), \
            call.kernel.name
