"""Static values read from memory once per call (``CostModel.from_memory``) and the bytes a call
reads at the width its kernel stores them (``db.cost.call_features``).

The profiler times a kernel in a hot loop, where a layer's weight stays in the last-level
cache; a decode of a model whose weights exceed the cache reads each from memory every token.
Here rows say what the hot loop says (a float GEMV on the dequantized weight 20 us, the int8
one 50 us: the int8 kernel's widening costs arithmetic) and the calibration says what the
memory gives; the plan must follow the bytes when the weights stream and the rows when they do
not. Figures are worked out by hand in the comments.
"""

from __future__ import annotations

import pytest

import tensor_graphs as tg
from tensor_graphs.compiler import prepare
from tensor_graphs.db import Database
from tensor_graphs.db.cost import CostModel, Estimate, call_features
from tensor_graphs.db.features import features
from tensor_graphs.db.hardware import current
from tensor_graphs.db.store import Measurement
from tensor_graphs.ir.ops.names import MATMUL
from tensor_graphs.kernels import registry
from tensor_graphs.planner.search import Planner
from tensor_graphs.profiler import bandwidth

K, N = 512, 1024  # a float32 weight of 2 MiB, int8 512 KiB, bfloat16 1 MiB
READ = 1e9  # calibrated read bandwidth, bytes per second
HOT_FLOAT, HOT_LOW = 20e-6, 50e-6  # what the hot loop measured


def graph(scheme: str):
    x = tg.input("x", (1, K))
    w = tg.weight("w", (K, N))
    return prepare([tg.quantize(x @ w, scheme)], {})


def calibrated(tmp_path, cache: float) -> Database:
    db = Database(tmp_path / "rows.sqlite")
    db.set_calibration(current("cpu"), {"flops": 1e12, "bytes": 1e12, "dispatch": 1e-6,
                                        "read": READ, "cache": cache})
    return db


def planner(outputs, db, **options) -> Planner:
    return Planner(outputs, target="cpu", cost=CostModel(db, {"cpu": current("cpu")}),
                   tolerance=1e-5, backends=("c", "numpy"), **options)


def record_hot_rows(db, outputs) -> None:
    """A row for every kernel option: a product's kernels at the hot loop's times (20 us float,
    50 us int8 or bfloat16), everything else 1 us (the static preparation steps decide
    nothing)."""
    p = planner(outputs, db, blocks=False)
    p.solve()
    done = set()
    for listed in list(p._options.values()):  # noqa: SLF001 - every option considered
        for o in listed:
            k = o.kernel
            if k is None or not hasattr(k, "source_hash") or o.estimate.source == "free":
                continue
            key = (k.name, k.source_hash, o.signature)
            if key in done:
                continue
            done.add(key)
            product = any(n.op.name == MATMUL for n in o.covers)
            seconds = (HOT_LOW if k.name.startswith(("c_q8_", "c_bf16_")) else HOT_FLOAT) \
                if product else 1e-6
            db.record(Measurement(k.name, k.source_hash, o.signature, 5, seconds, seconds,
                                  seconds, 0.0))


def product_step(plan):
    (step,) = [s for s in plan.steps if not s.static and any(
        n.op.name == MATMUL for n in s.nodes)]
    return step


@pytest.mark.parametrize("scheme, low, stored", [
    ("int8-weight", "c_q8_matmul", K * N),  # int8: 1 byte a weight (+ scales, panel header)
    ("bf16-weight", "c_bf16_matmul", 2 * K * N),  # bfloat16: 2 bytes a weight
])
def test_streamed_weights_pick_the_kernel_that_reads_fewer_bytes(tmp_path, scheme, low,
                                                                 stored):
    outputs = graph(scheme)
    with calibrated(tmp_path, cache=1e6) as db:  # 2 MiB of weights > 1 MB of cache: streamed
        record_hot_rows(db, outputs)
        p = planner(outputs, db, blocks=True)
        assert p.streams
        step = product_step(p.plan())
    assert step.kernel.name == low, step.kernel.name
    # the 50 us measured + the stored bytes at 1 GB/s (int8 ~0.53 ms, bfloat16 ~1.05 ms);
    # the float GEMV would be 20 us + 2.1 ms
    assert step.estimate.from_memory and step.estimate.source == "measured"
    assert HOT_LOW + stored / READ <= step.estimate.seconds <= HOT_LOW + 1.02 * stored / READ


@pytest.mark.parametrize("scheme", ["int8-weight", "bf16-weight"])
def test_weights_that_fit_the_cache_are_costed_as_measured(tmp_path, scheme):
    outputs = graph(scheme)
    with calibrated(tmp_path, cache=1e9) as db:  # 2 MiB fit: the hot rows are right
        record_hot_rows(db, outputs)
        p = planner(outputs, db, blocks=True)
        assert not p.streams
        step = product_step(p.plan())
    assert not step.kernel.name.startswith(("c_q8_", "c_bf16_")), step.kernel.name
    assert step.estimate == Estimate(HOT_FLOAT, "measured", 1.1)


def test_reading_adds_to_the_estimate_and_keeps_its_source(tmp_path):
    k = registry.get("c_q8_matmul")
    with calibrated(tmp_path, cache=1e6) as db:
        model = CostModel(db, {"cpu": current("cpu")})
        slow = Estimate(5e-3, "measured", 1.2)
        # 1 MB at 1 GB/s: 1 ms more, whatever the estimate (the hot time is from L3)
        assert model.from_memory(k, slow, 1e6) == Estimate(6e-3, "measured", 1.2,
                                                           from_memory=True)
        fast = Estimate(1e-5, "interpolated", 1.5)
        got = model.from_memory(k, fast, 1e6)
        assert got == Estimate(1e-5 + 1e-3, "interpolated", 1.5, from_memory=True)
        assert "weights from memory" in str(got)
        assert model.from_memory(k, fast, 0.0) is fast  # no static input: nothing to stream
        assert model.weights_stream(1.5e6, "cpu") and not model.weights_stream(5e5, "cpu")


def test_kernels_reading_the_same_bytes_keep_their_measured_order(tmp_path):
    """Both float GEMVs read the weight's 2 MiB (the packed one a few bytes more, its panels
    padded): the one measured faster hot stays cheaper (a floor made them tie, and the tie
    went to the slower one)."""
    packed, plain = registry.get("c_packed_matmul"), registry.get("c_matmul")
    with calibrated(tmp_path, cache=1e6) as db:
        model = CostModel(db, {"cpu": current("cpu")})
        fast = model.from_memory(packed, Estimate(40e-6, "measured", 1.1), 4 * K * N + 1024)
        slow = model.from_memory(plain, Estimate(60e-6, "measured", 1.1), 4 * K * N)
    assert fast.seconds < slow.seconds


def test_read_falls_back_to_the_copy_bandwidth_and_cache_to_this_cpus(tmp_path):
    with Database(tmp_path / "rows.sqlite") as db:
        db.set_calibration(current("cpu"), {"flops": 1e12, "bytes": 3e10})
        rates = CostModel(db, {"cpu": current("cpu")}).rates("cpu")
    assert rates["read"] == 3e10
    from tensor_graphs.db.cost import last_level_cache

    assert rates["cache"] == last_level_cache() > 0


def test_call_features_read_prepared_weights_at_their_stored_width():
    x = tg.input("x", (1, K))
    w = tg.weight("w", (K, N))
    rounded = tg.bf16_round(w)
    y = x @ rounded
    plain = features([rounded, y], [x, w], y)
    got, static = call_features(registry.get("c_bf16_matmul"), [rounded, y], [x, w], y)
    # the weight read as bfloat16 (packed: 2 bytes a weight and a 64-byte header), and
    # bf16_round done by the packing at bind time: only the product's 2*K*N flops per call
    assert got.flops == 2 * K * N < plain.flops / 10
    assert static == pytest.approx(2 * K * N, abs=4096)
    assert got.bytes == pytest.approx(plain.bytes - 2 * K * N, abs=4096)
    q = tg.weight("q", (K, N), "int8")
    s = tg.weight("s", (1, N))
    deq = tg.dequantize(q, s)
    z = x @ deq
    got, static = call_features(registry.get("c_q8_matmul"), [deq, z], [x, q, s], z)
    # dequantize reads the scale, which is not prepared: its work stays per call
    assert got.flops == features([deq, z], [x, q, s], z).flops
    assert static == pytest.approx(K * N + 4 * N, abs=4096)
    # an activation is not static: a product of two inputs streams nothing
    a = tg.input("a", (K, N))
    p = x @ a
    assert call_features(registry.get("c_matmul"), [p], [x, a], p)[1] == 0.0


def test_ensure_read_rate_measures_once_and_keeps_the_other_rates(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(bandwidth, "read_bandwidth", lambda: calls.append(1) or 2.5e10)
    hw = current("cpu")
    with Database(tmp_path / "rows.sqlite") as db:
        db.set_calibration(hw, {"flops": 1e11, "bytes": 2e10})
        assert bandwidth.ensure_read_rate(db, hw) == 2.5e10
        assert bandwidth.ensure_read_rate(db, hw) == 2.5e10
        assert db.calibration(hw) == {"flops": 1e11, "bytes": 2e10, "read": 2.5e10}
    assert len(calls) == 1


def test_read_bandwidth_is_a_rate():
    rate = bandwidth.read_bandwidth(n_threads=1, repeats=2, size=8 << 20)
    assert 1e8 < rate < 1e13
