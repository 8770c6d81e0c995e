"""Calibrated estimates of generated kernels never measured (db/generated_cost.py), exact
figures from rows written into a real database.

The hardware key is calibrated to round rates (1 GFLOP/s, 10 GB/s) and a C call costs 2 us
beyond its work, so a kernel that moves ``b`` bytes with few flops has the roofline
2 us + b / 1e10 s. Measured kernels of one generator are planted at chosen multiples of their
rooflines; the expected estimate of another kernel of that generator is worked out here from
those multiples, never by calling the module's helpers.
"""

from __future__ import annotations

import math

import pytest

import tensor_graphs as tg
from tensor_graphs.db import Database, Hardware, Measurement, signature_text
from tensor_graphs.db import generated_cost as gc
from tensor_graphs.db.cost import OVERHEAD, UNCERTAINTY, CostModel
from tensor_graphs.db.features import Features
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.generated import Candidate

HW = Hardware("test-box", "test-cpu|avx2|2 cores", "numpy 0.0|cc 0")
OTHER_DEVICE = Hardware(HW.machine, "other-cpu|sse4_2|64 cores", HW.libs)
RATES = {"flops": 1e9, "bytes": 1e10, "dispatch": 1e-6}
C = OVERHEAD["c", "cpu"]  # 2 us
X = tg.input("x", (1000, 1000))
SIG = signature_text([((1000, 1000), "float32")], {})


def candidate(name: str) -> Candidate:
    """A generated kernel as the planner offers it (nothing built)."""
    y = tg.tanh(X)
    return Candidate("elementwise", y, (y,), (X,), name, name, 1e-6, "test", lambda: None)


def roofline(mb: float) -> float:
    """Seconds of a call moving ``mb`` MB with 1e3 flops: memory bound at 10 GB/s."""
    return C + mb * 1e6 / 1e10


def row(kernel: str, mb: float, ratio: float, *, hardware: Hardware = HW,
        failure: str | None = None, work: bool = True) -> Measurement:
    """A row of ``kernel`` moving ``mb`` MB whose fastest sample is ``ratio`` x its roofline."""
    seconds = math.nan if failure else ratio * roofline(mb)
    sig = signature_text([((int(mb * 1e3), 250), "float32")], {})
    return Measurement(kernel, kernel, sig, 5, seconds, seconds, seconds, 1e-7, failure,
                       hardware, 1.0, 1e3 if work else None, mb * 1e6 if work else None)


@pytest.fixture
def db(tmp_path):
    with Database(tmp_path / "generated.sqlite") as d:
        d.set_calibration(HW, RATES)
        d.set_calibration(OTHER_DEVICE, RATES)
        yield d


def estimate(db, kernel, mb: float = 8.0):
    return CostModel(db, {"cpu": HW}).estimate(kernel, SIG, Features(1e3, mb * 1e6, 1e6))


def assert_estimate(got, seconds: float, source: str, uncertainty: float) -> None:
    assert (got.source, got.seconds, got.uncertainty) == \
        (source, pytest.approx(seconds, rel=1e-12), pytest.approx(uncertainty, rel=1e-12))


def test_the_family_is_the_name_without_its_source_hash():
    assert gc.family("c_fused_0123abcd4567") == "c_fused_"
    assert gc.family("c_gemm_ep_653d030e18d9") == "c_gemm_ep_"
    assert gc.family("triton_row_0011223344556677") == "triton_row_"
    assert gc.family("c_add") is None and gc.family("c_packed_linear") is None


def test_a_generator_never_measured_is_on_the_roofline(db):
    db.record(row("c_row_00000000000a", 4.0, 3.0))  # another generator's kernel
    assert_estimate(estimate(db, candidate("c_fused_00000000000f")), roofline(8.0),
                    "estimated", UNCERTAINTY["estimated"])


def test_the_median_ratio_of_the_generators_measured_kernels_scales_the_roofline(db):
    for name, mb, ratio in (("c_fused_000000000001", 1.0, 2.0),
                            ("c_fused_000000000002", 4.0, 3.0),
                            ("c_fused_000000000003", 16.0, 5.0)):
        db.record(row(name, mb, ratio))
    # ignored: another generator, another device, a failure, a row without its work
    db.record(row("c_row_00000000000a", 4.0, 50.0))
    db.record(row("c_fused_000000000004", 4.0, 50.0, hardware=OTHER_DEVICE))
    db.record(row("c_fused_000000000005", 4.0, 50.0, failure="verification failed"))
    db.record(row("c_fused_000000000006", 4.0, 50.0, work=False))
    # |log(ratio / 3)|: log 1.5, 0, log(5/3); their 0.9 quantile (numpy's linear) lies 0.8 of
    # the way from log 1.5 to log(5/3): 1.5 * (10/9) ** 0.8
    assert_estimate(estimate(db, candidate("c_fused_00000000000f")), 3.0 * roofline(8.0),
                    "calibrated", 1.5 * (10 / 9) ** 0.8)


def test_under_three_kernels_the_ratio_applies_with_the_rooflines_uncertainty(db):
    db.record(row("c_fused_000000000001", 1.0, 2.0))
    db.record(row("c_fused_000000000002", 4.0, 8.0))
    db.record(row("c_fused_000000000002", 2.0, 8.0))  # one kernel at two shapes: one kernel
    # the median of the logs of 2, 8, 8: log 8
    assert_estimate(estimate(db, candidate("c_fused_00000000000f")), 8.0 * roofline(8.0),
                    "calibrated", UNCERTAINTY["estimated"])


def test_a_close_spread_is_still_trusted_no_closer_than_interpolation(db):
    for i in range(1, 5):
        db.record(row(f"c_fused_00000000000{i}", float(i), 2.0))
    assert_estimate(estimate(db, candidate("c_fused_00000000000f")), 2.0 * roofline(8.0),
                    "calibrated", gc.LEAST_UNCERTAINTY)


def test_the_kernels_own_row_and_hand_kernels_are_not_calibrated(db):
    for i in range(1, 4):
        db.record(row(f"c_fused_00000000000{i}", float(i), 3.0))
    own = candidate("c_fused_000000000002")
    got = CostModel(db, {"cpu": HW}).estimate(
        own, signature_text([((2000, 250), "float32")], {}), Features(1e3, 2e6, 1e6))
    assert (got.source, got.seconds) == ("measured", pytest.approx(3.0 * roofline(2.0)))
    hand = registry.get("c_tanh")  # named by no hash: the roofline, whatever c_fused_ ran
    assert_estimate(estimate(db, hand), roofline(8.0), "estimated", UNCERTAINTY["estimated"])


def test_new_rows_recalibrate_after_a_refresh(db):
    model = CostModel(db, {"cpu": HW})
    kernel = candidate("c_fused_00000000000f")
    feats = Features(1e3, 8e6, 1e6)
    assert model.estimate(kernel, SIG, feats).source == "estimated"
    for i in range(1, 4):
        db.record(row(f"c_fused_00000000000{i}", float(i), 4.0))
    model.refresh()
    assert model.estimate(kernel, SIG, feats).seconds == pytest.approx(4.0 * roofline(8.0))


def test_the_optimistic_time_divides_unmeasured_generated_estimates_only(db):
    for name, mb, ratio in (("c_fused_000000000001", 1.0, 2.0),
                            ("c_fused_000000000002", 4.0, 3.0),
                            ("c_fused_000000000003", 16.0, 5.0)):
        db.record(row(name, mb, ratio))
    cost = gc.Optimistic(CostModel(db, {"cpu": HW}))
    feats = Features(1e3, 8e6, 1e6)
    got = cost.estimate(candidate("c_fused_00000000000f"), SIG, feats)
    spread = 1.5 * (10 / 9) ** 0.8
    assert_estimate(got, 3.0 * roofline(8.0) / spread, "calibrated", spread)
    fresh = cost.estimate(candidate("c_row_00000000000f"), SIG, feats)  # never measured
    assert_estimate(fresh, roofline(8.0) / UNCERTAINTY["estimated"], "estimated",
                    UNCERTAINTY["estimated"])
    hand = cost.estimate(registry.get("c_tanh"), SIG, feats)
    assert_estimate(hand, roofline(8.0), "estimated", UNCERTAINTY["estimated"])
    own = cost.estimate(candidate("c_fused_000000000002"),
                        signature_text([((4000, 250), "float32")], {}), feats)
    assert own.source == "measured" and own.seconds == pytest.approx(3.0 * roofline(4.0))
    assert cost.rates("cpu") == CostModel(db, {"cpu": HW}).rates("cpu")  # the rest delegates


def test_a_plan_on_a_calibrated_step_says_it_rests_on_estimates(tmp_path):
    """explain() counts calibrated steps with the estimated ones: nobody timed them."""
    from tensor_graphs.db import current

    path = tmp_path / "plan.sqlite"
    with Database(path) as d:  # three elementwise kernels measured on this machine
        for i in range(1, 4):
            d.record(row(f"c_fused_00000000000{i}", float(i), 3.0, hardware=current()))
    x = tg.input("x", (64, 300))
    y = tg.tanh(tg.sigmoid(x * 1.5 + 0.25) * 2.0)
    prog = tg.compile(y, db=str(path))
    sources = [s.source for s in prog.plan.steps]
    assert sources == ["calibrated"], prog.explain()  # the chain, one generated step
    assert "1 of 1 steps rest on estimates" in prog.explain()
