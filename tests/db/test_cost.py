"""The cost model answered from synthetic rows: every source of an estimate, exact figures.

Each test writes the rows it needs into a real SQLite database (a file under tmp_path) on a
hardware key of its own, calibrated to round rates (1 GFLOP/s, 10 GB/s), and asserts the
predicted seconds and the source label the model gives for a real registered kernel. The
expected figures are worked out by hand in the comments (and, for least-squares fits, by a
closed-form fit written here), never by calling the model's own helpers: a model that scales
the wrong way, picks the wrong neighbours, reads another machine's rows or takes an edited
kernel's rows for its own fails here, not only in a planner test that happens to notice.

Work is roofline seconds at those rates: an (m, 100) @ (100, 100) float32 matmul does 2e4 * m
flops and moves (200 * m + 1e4) * 4 bytes, so it is compute bound and its work is m * 20 us.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.db import Database, Hardware, Measurement, signature_text
from tensor_graphs.db.cost import OVERHEAD, UNCERTAINTY, CostModel, Estimate
from tensor_graphs.db.features import Features, features
from tensor_graphs.kernels import registry

HW = Hardware("test-box", "test-cpu|avx2|2 cores", "numpy 0.0|cc 0")
ELSEWHERE = Hardware("other-box", HW.device, HW.libs)  # its timings transfer here
OTHER_DEVICE = Hardware(HW.machine, "other-cpu|sse4_2|64 cores", HW.libs)
OTHER_LIBS = Hardware(HW.machine, HW.device, "numpy 9.9|cc 0")
RATES = {"flops": 1e9, "bytes": 1e10, "dispatch": 1e-6}
MATMUL = registry.get("numpy_matmul")
NUMPY = OVERHEAD["numpy", "cpu"]  # 3 us: what a numpy kernel call costs beyond its work
US, MS = 1e-6, 1e-3


def matmul(m: int, dtype: str = "float32", batch: tuple[int, ...] = ()):
    """The signature and features of an (*batch, m, 100) @ (100, 100) matmul."""
    a, b = tg.input("a", (*batch, m, 100), dtype), tg.input("b", (100, 100), dtype)
    node = a @ b
    sig = signature_text([(a.shape, dtype), (b.shape, dtype)], node.attrs)
    return sig, features([node], [a, b], node)


def row(m: int, seconds: float, *, median: float | None = None, source_hash: str | None = None,
        hardware: Hardware = HW, when: float = 1.0, failure: str | None = None,
        kernel=MATMUL, dtype: str = "float32", batch: tuple[int, ...] = (),
        work: bool = True) -> Measurement:
    """A row of ``kernel`` on the matmul of ``m`` rows whose fastest sample is ``seconds``."""
    sig, f = matmul(m, dtype, batch)
    if failure is not None:
        seconds = median = math.nan
    return Measurement(kernel.name, source_hash or kernel.source_hash, sig, 5,
                       seconds if median is None else median, seconds, 2 * seconds, 1e-7,
                       failure, hardware, when, f.flops if work else None,
                       f.bytes if work else None)


@pytest.fixture
def db(tmp_path):
    with Database(tmp_path / "cost.sqlite") as d:
        d.set_calibration(HW, RATES)
        yield d


def sig_of(node) -> str:
    return signature_text([(i.shape, i.dtype.name) for i in node.inputs], node.attrs)


def estimate(db, m: int, kernel=MATMUL) -> Estimate:
    """A fresh model's answer for ``kernel`` on the matmul of ``m`` rows."""
    sig, f = matmul(m)
    return CostModel(db, {"cpu": HW}).estimate(kernel, sig, f)


def assert_estimate(got: Estimate, seconds: float, source: str, uncertainty: float) -> None:
    assert (got.source, got.seconds, got.uncertainty) == \
        (source, pytest.approx(seconds, rel=1e-12), pytest.approx(uncertainty, rel=1e-12))


def least_squares(points: list[tuple[float, float]], w: float) -> float:
    """The power law through (work, seconds) points fitted in log-log space, at ``w``: the
    closed-form ordinary least squares line, written out independently of the model."""
    xs = [math.log(p) for p, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    assert 0 <= slope <= 1.3  # inside the model's clamp, so its fit is the plain one
    return math.exp(my + slope * (math.log(w) - mx))


def extrapolated(distance: float) -> float:
    """Uncertainty of a prediction ``distance`` (natural log of work) past the nearest point."""
    return round(UNCERTAINTY["interpolated"] * (1 + distance / 3), 3)


# ------------------------------------------------------------------------------ features
def test_features_count_flops_and_bytes_by_hand():
    sig, f = matmul(50)
    assert f == Features(1e6, 80_000.0, 5_000.0)  # 2*50*100*100; (5e3 + 1e4 + 5e3) * 4 B
    assert json.loads(sig)["inputs"] == [[[50, 100], "float32"], [[100, 100], "float32"]]
    x, v = tg.input("x", (1000, 1000)), tg.input("v", (1000,), "float16")
    s = x + v  # broadcast: each element once; the float16 row costs 2 B an element
    assert features([s], [x, v], s) == Features(1e6, 4e6 + 2e3 + 4e6, 1e6)
    d = x * x  # one array read once, however many times the node uses it
    assert features([d], [x, x], d) == Features(1e6, 8e6, 1e6)
    a, b = tg.input("a", (2, 3)), tg.input("b", (3, 5))
    mm = a @ b  # 2 * M * N * K: K = 3 is a's last axis
    assert features([mm], [a, b], mm) == Features(60.0, (6 + 15 + 10) * 4.0, 10.0)
    y = tg.input("y", (4, 8))
    r = y.sum(axis=1)
    assert features([r], [y], r) == Features(32.0, 128.0 + 16.0, 4.0)  # one op per input
    p = tg.permute(y, (1, 0))
    assert features([p], [y], p) == Features(0.0, 256.0, 32.0)  # movement: no arithmetic
    # softmax decomposes to max 32, neg 4, add 32, exp 32, sum 32, reciprocal 4, mul 32
    sm = tg.softmax(y, axis=-1)
    assert features([sm], [y], sm) == Features(168.0, 256.0, 32.0)
    ids, table = tg.input("ids", (2, 3), "int64"), tg.weight("t", (1000, 64))
    e = tg.embedding(ids, table)  # reads 6 rows of the table, not all 256 kB
    assert features([e], [ids, table], e) == Features(0.0, 1536.0 + 48.0 + 1536.0, 384.0)
    kv, new = tg.state("kv", (2, 5, 4)), tg.input("new", (2, 1, 4))
    u = tg.state_update(kv, new, offset=4, axis=1)  # appended in place: the value only
    assert features([u], [kv, new], u) == Features(0.0, 2 * 32.0, 8.0)


# ------------------------------------------------------------------------------ measured
@pytest.mark.parametrize("median, uncertainty", [
    (4 * MS, UNCERTAINTY["measured"]),  # no spread: the floor, x1.1
    (5 * MS, 1.25),  # median / fastest
    (40 * MS, 2.0),  # a spread of 10 is capped at 2
])
def test_a_row_for_the_signature_is_its_fastest_sample(db, median, uncertainty):
    db.record(row(200, 4 * MS, median=median))
    assert_estimate(estimate(db, 200), 4 * MS, "measured", uncertainty)


def test_measured_prefers_this_machine_then_the_newest_and_ignores_other_devices(db):
    db.record(row(200, 7 * MS, hardware=ELSEWHERE, when=5.0))
    assert estimate(db, 200).seconds == 7 * MS  # another machine's rows transfer
    db.record(row(200, 6 * MS, hardware=HW, when=1.0))
    assert estimate(db, 200).seconds == 6 * MS  # this machine's, though older
    db.record(row(200, 5 * MS, hardware=HW, when=2.0))
    assert estimate(db, 200).seconds == 5 * MS  # the newest of this machine's
    for hw in (OTHER_DEVICE, OTHER_LIBS):  # never used: another device or other libraries
        db.record(row(200, 1 * US, hardware=hw, when=9.0))
        db.record(row(400, 1 * US, hardware=hw, when=9.0))
    assert_estimate(estimate(db, 200), 5 * MS, "measured", UNCERTAINTY["measured"])


def test_only_other_devices_rows_leave_the_roofline_estimate(db):
    db.set_calibration(OTHER_DEVICE, {"flops": 1e12, "bytes": 1e12})
    for hw in (OTHER_DEVICE, OTHER_LIBS):
        db.record(row(200, 1 * US, hardware=hw))
        db.record(row(400, 1 * US, hardware=hw))
    assert_estimate(estimate(db, 200), NUMPY + 4 * MS, "estimated", UNCERTAINTY["estimated"])


def test_a_failure_of_this_kernel_is_never_planned_one_of_an_edited_kernel_is_forgotten(db):
    db.record(row(200, 0.0, failure="ValueError: boom", source_hash="edited-since"))
    db.record(row(100, 1 * MS, source_hash="edited-since"))  # nor interpolated from
    assert_estimate(estimate(db, 200), NUMPY + 4 * MS, "estimated", UNCERTAINTY["estimated"])
    db.record(row(200, 0.0, failure="ValueError: boom"))
    assert_estimate(estimate(db, 200), math.inf, "failed", 1.0)


# ------------------------------------------------------------------------------ interpolated
@pytest.mark.parametrize("m, seconds", [
    (400, NUMPY + (1 * MS - NUMPY) * 8),  # 8x the work: 7.979 ms, not 128 us
    (6, NUMPY + (1 * MS - NUMPY) * 6 / 50),  # 0.12x the work: 122.6 us, not 8.3 ms
])
def test_one_point_scales_linearly_past_the_call_overhead(db, m, seconds):
    db.record(row(50, 1 * MS))  # work 1 ms
    assert_estimate(estimate(db, m), seconds, "interpolated",
                    extrapolated(abs(math.log(m / 50))))


def test_one_fast_point_counts_half_of_it_as_overhead(db):
    db.record(row(50, 4 * US))  # under twice the call overhead: 2 us of it is overhead
    assert_estimate(estimate(db, 400), 2 * US + 2 * US * 8, "interpolated",
                    extrapolated(math.log(8)))


def test_a_power_law_is_followed_inside_and_past_the_points(db):
    # seconds = 1 ms * sqrt(work / 1 ms): work 1, 4, 16 ms take 1, 2, 4 ms
    for m, seconds in ((50, 1 * MS), (200, 2 * MS), (800, 4 * MS)):
        db.record(row(m, seconds))
    assert_estimate(estimate(db, 450), 3 * MS, "interpolated",
                    UNCERTAINTY["interpolated"])  # work 9 ms, between the points
    assert_estimate(estimate(db, 3200), 8 * MS, "interpolated",
                    extrapolated(math.log(4)))  # work 64 ms, 4x past the last point
    assert_estimate(estimate(db, 25), 1 * MS / math.sqrt(2), "interpolated",
                    extrapolated(math.log(2)))  # work 0.5 ms, 2x below the first


def test_the_four_nearest_points_in_log_work_are_fitted(db):
    # query m = 120 (work 2.4 ms); by distance in log work the points rank 100, 200, 50, 400,
    # then 25 and 1600, which lie far off the others' line and must not pull the fit
    times = {50: 1.0 * MS, 100: 2.4 * MS, 200: 3.6 * MS, 400: 8.8 * MS,
             25: 50 * MS, 1600: 0.1 * MS}
    for m, seconds in times.items():
        db.record(row(m, seconds))
    nearest = [(m * 20 * US, times[m]) for m in (50, 100, 200, 400)]
    assert_estimate(estimate(db, 120), least_squares(nearest, 120 * 20 * US), "interpolated",
                    UNCERTAINTY["interpolated"])
    fitted = estimate(db, 120).seconds
    for wrong in ([50, 100, 200], [50, 100, 200, 400, 25], [100, 200, 400, 1600]):
        others = [(m * 20 * US, times[m]) for m in wrong]
        assert abs(least_squares_any(others, 120 * 20 * US) / fitted - 1) > 0.01, wrong


def least_squares_any(points, w):
    """As ``least_squares`` with the model's slope clamp (0 to 1.3)."""
    xs = np.log([p for p, _ in points])
    ys = np.log([t for _, t in points])
    slope = float(np.clip(np.polyfit(xs, ys, 1)[0], 0.0, 1.3))
    return math.exp(float(np.mean(ys - slope * xs)) + slope * math.log(w))


@pytest.mark.parametrize("times, slope", [
    ({50: 1 * MS, 100: 4 * MS, 200: 16 * MS}, 1.3),  # seconds ~ work**2: clamped to 1.3
    ({50: 4 * MS, 100: 2 * MS, 200: 1 * MS}, 0.0),  # faster with more work: flat
])
def test_the_fitted_slope_is_clamped(db, times, slope):
    for m, seconds in times.items():
        db.record(row(m, seconds))
    xs = [math.log(m * 20 * US) for m in times]
    ys = [math.log(t) for t in times.values()]
    intercept = sum(y - slope * x for x, y in zip(xs, ys)) / len(xs)
    w = 150 * 20 * US
    assert_estimate(estimate(db, 150), math.exp(intercept + slope * math.log(w)),
                    "interpolated", UNCERTAINTY["interpolated"])


def test_rows_of_equal_work_count_once_at_their_median(db):
    db.record(row(50, 1 * MS, hardware=HW))
    db.record(row(50, 6 * MS, hardware=ELSEWHERE))
    db.record(row(50, 2 * MS, hardware=HW, when=2.0))  # median of 1, 6, 2 ms: 2 ms
    db.record(row(200, 8 * MS))  # with 2 ms at 1 ms work: slope 1, 2x the work
    assert_estimate(estimate(db, 100), 4 * MS, "interpolated", UNCERTAINTY["interpolated"])


def test_interpolation_reads_only_current_successful_rows_of_the_same_class(db):
    db.record(row(50, 1 * MS))  # the one point to use: 8x the work at m = 400
    distractors = [
        row(100, 1 * US, source_hash="edited-since"),  # an edited kernel's (stale) row
        row(100, 0.0, failure="RuntimeError: bad"),  # a failure
        row(100, 9 * MS, work=False),  # recorded before rows carried their work
        row(100, 0.0),  # no time
        row(100, 1 * US, dtype="float64"),  # another dtype
        row(100, 1 * US, batch=(2,)),  # another rank
        row(100, 1 * US, hardware=OTHER_DEVICE),
        row(100, 1 * US, hardware=OTHER_LIBS),
        row(100, 1 * US, kernel=registry.get("c_matmul")),  # another kernel
    ]
    db.record_many(distractors)
    assert_estimate(estimate(db, 400), NUMPY + (1 * MS - NUMPY) * 8, "interpolated",
                    extrapolated(math.log(8)))


# ------------------------------------------------------------------------------ stale
def test_an_edited_kernels_row_for_the_signature_is_stale(db):
    db.record(row(200, 6 * MS, median=9 * MS, source_hash="edited-since"))
    assert_estimate(estimate(db, 200), 6 * MS, "stale", UNCERTAINTY["stale"])


def test_the_current_kernel_interpolated_beats_its_edited_self_measured(db):
    db.record(row(200, 6 * MS, source_hash="edited-since"))
    db.record(row(100, 1 * MS))  # the current source, half the work
    assert_estimate(estimate(db, 200), NUMPY + (1 * MS - NUMPY) * 2, "interpolated",
                    extrapolated(math.log(2)))


# ------------------------------------------------------------------------------ estimated
def test_no_row_is_the_roofline_at_the_calibrated_rates(db):
    assert_estimate(estimate(db, 200), NUMPY + 4 * MS, "estimated", UNCERTAINTY["estimated"])
    model = CostModel(db, {"cpu": HW})
    x = tg.input("x", (1000, 1000))
    y = x + x  # 1e6 flops (1 ms) and 8 MB moved (0.8 ms at 10 GB/s): compute bound
    z = tg.input("z", (1000, 1000), "float64")
    zz = z * z  # 1e6 flops (1 ms) and 16 MB moved (1.6 ms): memory bound
    for name, node, leaf, seconds in (("numpy_add", y, x, 1 * MS), ("numpy_mul", zz, z, 1.6 * MS)):
        got = model.estimate(registry.get(name), sig_of(node), features([node], [leaf], node))
        assert_estimate(got, NUMPY + seconds, "estimated", UNCERTAINTY["estimated"])


def test_before_calibration_the_built_in_rates_are_used(tmp_path):
    with Database(tmp_path / "uncalibrated.sqlite") as db:  # 50 GFLOP/s, 10 GB/s
        got = estimate(db, 200)  # 4e6 flops: 80 us; 0.2 MB: 20 us
    assert_estimate(got, NUMPY + 80 * US, "estimated", UNCERTAINTY["estimated"])


def test_the_roofline_per_kind_of_kernel(db):
    y = tg.input("y", (500, 200))
    sm = tg.softmax(y, axis=-1)
    f = features([sm], [y], sm)  # 500 * (200 * 5 + 2) = 501,000 flops: 501 us; 0.8 MB: 80 us
    assert f.flops == 501_000
    model = CostModel(db, {"cpu": HW})
    cases = {
        "numpy_softmax": NUMPY + 3 * 501 * US,  # numpy: three whole-array passes
        "c_softmax": OVERHEAD["c", "cpu"] + 501 * US,  # one pass
        "numpy_exact_softmax": 40 * US + 20 * (NUMPY + 3 * 501 * US),  # float64 reference
    }
    for name, seconds in cases.items():
        assert_estimate(model.estimate(registry.get(name), sig_of(sm), f), seconds, "estimated",
                        UNCERTAINTY["estimated"])
    r = tg.reshape(y, (200, 500))
    assert_estimate(model.estimate(registry.get("numpy_reshape"), sig_of(r),
                                   features([r], [y], r)),
                    NUMPY, "estimated", UNCERTAINTY["estimated"])  # a view moves nothing


# ------------------------------------------------------------------------------ the cache
def test_answers_are_cached_until_refresh_sees_a_new_revision(db):
    model = CostModel(db, {"cpu": HW})
    (sig, f), (sig4, f4) = matmul(200), matmul(400)
    db.record(row(100, 2.5 * MS))
    assert model.estimate(MATMUL, sig, f).source == "interpolated"
    one_point = NUMPY + (2.5 * MS - NUMPY) * 4
    assert model.estimate(MATMUL, sig4, f4).seconds == pytest.approx(one_point, rel=1e-12)
    db.record(row(200, 5 * MS))
    assert model.estimate(MATMUL, sig, f).source == "interpolated"  # cached until refresh
    assert model.estimate(MATMUL, sig4, f4).seconds == pytest.approx(one_point, rel=1e-12)
    model.refresh()
    assert_estimate(model.estimate(MATMUL, sig, f), 5 * MS, "measured",
                    UNCERTAINTY["measured"])
    assert_estimate(model.estimate(MATMUL, sig4, f4), 10 * MS, "interpolated",
                    extrapolated(math.log(2)))  # two points now: 2.5 ms per 2 ms of work


def test_an_estimate_reads_as_time_source_and_uncertainty():
    assert str(Estimate(7.979e-3, "interpolated", 2.54)) == "7.98 ms (interpolated, x2.5)"
    assert str(Estimate(4.5e-6, "estimated", 4.0)) == "4.5 us (estimated, x4)"


# ------------------------------------------------------------------------------ a GPU
GPU = Hardware("test-box", "cuda|Test GPU|sm 9.0|driver 1|cuda 13", HW.libs)
GPU_KERNELS = ("test_cost_gpu_tanh", "test_cost_triton_tanh", "copy_host_to_cuda",
               "copy_cuda_to_host")


@pytest.fixture
def gpu_kernels():
    """A GPU's torch and Triton tanh and the host<->GPU copies. On a machine without a GPU the
    copies are registered here as host functions: costing needs only names and routes."""
    from tensor_graphs.kernels import copy as copies

    made = []
    real = {k.name for k in registry.all()}
    for name, backend in (("test_cost_gpu_tanh", "torch"), ("test_cost_triton_tanh", "triton")):
        tg.kernel("tanh", backend=backend, device="cuda", name=name)(lambda x: np.tanh(x))
        made.append(name)
    for name, src, dst in (("copy_host_to_cuda", "cpu", "cuda"),
                           ("copy_cuda_to_host", "cuda", "cpu")):
        if name not in real:
            copies.copy_kernel(name, src, dst)(lambda x: np.array(x))
            made.append(name)
    try:
        yield {name: registry.get(name) for name in GPU_KERNELS}
    finally:
        for name in made:
            registry.unregister(name)
            copies.ROUTES.pop(name, None)


def tanh_call(shape):
    x = tg.input("x", shape)
    y = tg.tanh(x)
    return sig_of(y), features([y], [x], y)


def copy_call(shape, device):
    x = tg.input("x", shape)
    return signature_text([(x.shape, "float32")], {"device": device}), features((), [x], x)


def test_a_gpu_uncalibrated_has_a_datacenter_gpus_rates_and_a_graphs_cost_per_kernel(
        db, gpu_kernels):
    """A GPU kernel costs its work plus what a CUDA graph's replay adds per kernel (3 us),
    torch's and Triton's alike: the launch from Python (torch 5-10 us, Triton's launcher
    20-60 us) is what a graph skips."""
    model = CostModel(db, {"cpu": HW, "cuda": GPU})  # the CPU calibrated, the GPU not
    sig, f = tanh_call((4096, 4096))  # 16.8 M elements: 67 MB in, 67 MB out
    assert f.bytes == 2 * 4096 * 4096 * 4
    flops_at, bytes_at = f.flops / 50e12, f.bytes / 2e12  # 50 TFLOP/s, 2 TB/s
    for name in ("test_cost_gpu_tanh", "test_cost_triton_tanh"):
        assert_estimate(model.estimate(gpu_kernels[name], sig, f),
                        3 * US + max(flops_at, bytes_at), "estimated", UNCERTAINTY["estimated"])
    # on the CPU the same call is the CPU's rates (1 GFLOP/s here): ~2000x slower
    cpu = model.estimate(registry.get("torch_tanh"), sig, f)
    assert cpu.seconds == pytest.approx(6 * US + f.flops / 1e9, rel=1e-12)
    # a tiny call costs its graph node: 3 us on the GPU, as numpy's Python call on the host
    tiny_sig, tiny = tanh_call((4, 16))
    for name in ("test_cost_gpu_tanh", "test_cost_triton_tanh"):
        assert 3 * US < model.estimate(gpu_kernels[name], tiny_sig, tiny).seconds < 3.001 * US
    assert model.rates("cuda")["dispatch"] == RATES["dispatch"]  # the host's runtime loop


def test_a_host_gpu_copy_costs_the_links_latency_and_bandwidth(db, gpu_kernels):
    model = CostModel(db, {"cpu": HW, "cuda": GPU})
    for name, device in (("copy_host_to_cuda", "cuda"), ("copy_cuda_to_host", "cpu")):
        sig, f = copy_call((16384, 16384), device)  # 1 GiB: read once, written once
        got = model.estimate(gpu_kernels[name], sig, f)
        # 15 us latency + 2^30 B over a 12 GB/s link (it crosses once, not read + written)
        assert_estimate(got, 15 * US + 2 ** 30 / 12e9, "estimated", UNCERTAINTY["estimated"])
        assert 0.05 < got.seconds < 0.2  # ~0.1 s before it is measured
        small = model.estimate(gpu_kernels[name], *copy_call((4, 16), device)).seconds
        assert 15 * US < small < 15.1 * US  # a small copy is its latency


def test_a_gpus_calibration_replaces_its_rates_launch_and_link(db, gpu_kernels):
    db.set_calibration(GPU, {"flops": 1e13, "bytes": 1e12, "link": 25e9,
                             "link_latency": 20 * US, "launch": 4 * US})
    model = CostModel(db, {"cpu": HW, "cuda": GPU})
    sig, f = tanh_call((4096, 4096))
    assert_estimate(model.estimate(gpu_kernels["test_cost_gpu_tanh"], sig, f),
                    4 * US + max(f.flops / 1e13, f.bytes / 1e12), "estimated",
                    UNCERTAINTY["estimated"])
    # a Triton kernel in a graph costs what the calibration measured for one (4 us)
    assert model.estimate(gpu_kernels["test_cost_triton_tanh"], sig, f).seconds == \
        pytest.approx(4 * US + max(f.flops / 1e13, f.bytes / 1e12), rel=1e-12)
    got = model.estimate(gpu_kernels["copy_cuda_to_host"], *copy_call((16384, 16384), "cpu"))
    assert got.seconds == pytest.approx(20 * US + 2 ** 30 / 25e9, rel=1e-12)
    assert model.rates("cuda")["dispatch"] == RATES["dispatch"]


def test_gpu_rows_and_copies_are_read_under_the_gpus_key_only(db, gpu_kernels):
    """A GPU kernel's rows, and a copy's either way, are the GPU's: a row of the same call
    under the CPU's key (or another GPU's, or the simulated GPU's) is not its time."""
    simulated = Hardware("test-box", "cuda|simulated|" + HW.device, HW.libs)
    other_gpu = Hardware("test-box", "cuda|Other GPU|sm 8.0|driver 1|cuda 13", HW.libs)
    calls = {"test_cost_gpu_tanh": tanh_call((64, 64)),
             "copy_cuda_to_host": copy_call((64, 64), "cpu"),
             "copy_host_to_cuda": copy_call((64, 64), "cuda")}
    for name, (sig, _) in calls.items():
        k = gpu_kernels[name]
        for hw, seconds in ((HW, 1 * MS), (simulated, 2 * MS), (other_gpu, 3 * MS)):
            db.record(Measurement(name, k.source_hash, sig, 5, seconds, seconds, seconds, 0.0,
                                  hardware=hw))
    model = CostModel(db, {"cpu": HW, "cuda": GPU})
    for name, (sig, f) in calls.items():
        assert model.estimate(gpu_kernels[name], sig, f).source == "estimated"
    for name, (sig, _) in calls.items():
        k = gpu_kernels[name]
        db.record(Measurement(name, k.source_hash, sig, 5, 5 * US, 5 * US, 5 * US, 0.0,
                              hardware=GPU))
    model = CostModel(db, {"cpu": HW, "cuda": GPU})
    for name, (sig, f) in calls.items():
        assert_estimate(model.estimate(gpu_kernels[name], sig, f), 5 * US, "measured",
                        UNCERTAINTY["measured"])
    # and the simulated GPU's model reads the simulated rows only
    model = CostModel(db, {"cpu": HW, "cuda": simulated})
    for name, (sig, f) in calls.items():
        assert model.estimate(gpu_kernels[name], sig, f).seconds == 2 * MS


def test_a_kernel_declaring_a_share_of_the_peak_is_estimated_at_it(db):
    """``efficiency`` (per input dtype): an fp32 Triton GEMM on the FMA units reaches a share
    of the GPU's fp32 peak that cuBLAS does not (an H100: 6-22 TFLOP/s against 42), so its
    unmeasured estimate divides the flops by it, in that dtype only; a bad share is refused."""
    name = "test_cost_share_matmul"
    tg.kernel("matmul", backend="numpy", name=name, dtypes=("float32", "float16"),
              efficiency={"float32": 0.25})(lambda a, b: a @ b)
    try:
        k = registry.get(name)
        assert k.efficiency == {"float32": 0.25}
        model = CostModel(db, {"cpu": HW})
        for dtype, share in (("float32", 0.25), ("float16", 1.0)):
            a, b = tg.input("a", (512, 512), dtype), tg.input("b", (512, 512), dtype)
            y = a @ b
            f = features([y], [a, b], y)
            got = model.estimate(k, sig_of(y), f).seconds - OVERHEAD[("numpy", "cpu")]
            assert got == pytest.approx(
                max(f.flops / share / RATES["flops"], f.bytes / RATES["bytes"]), rel=1e-9)
    finally:
        registry.unregister(name)
    for bad in ({"float32": 0.0}, {"float32": 1.5}):
        with pytest.raises(tg.errors.ArgumentError, match="efficiency"):
            tg.kernel("matmul", backend="numpy", name=name + "_bad", efficiency=bad)(
                lambda a, b: a @ b)


@pytest.fixture
def grid_matmul():
    """A GPU matmul declaring its grid as a 64-row x 64-column tiled kernel would: a program
    per tile, the tile's padding wasted."""
    from tensor_graphs.kernels.registry import Occupancy

    def occupancy(shapes):
        (m, _), (_, n) = shapes
        tiles = -(-m // 64) * -(-n // 64)
        return Occupancy(tiles, m * n / (tiles * 64 * 64))

    name = "test_cost_grid_matmul"
    tg.kernel("matmul", backend="triton", device="cuda", name=name,
              occupancy=occupancy)(lambda a, b: a @ b)
    try:
        yield registry.get(name)
    finally:
        registry.unregister(name)


def gpu_matmul(m: int, n: int, k: int):
    a, b = tg.input("a", (m, k)), tg.input("b", (k, n))
    y = a @ b
    return sig_of(y), features([y], [a, b], y)


def test_a_grid_that_leaves_sms_idle_is_estimated_slower(db, grid_matmul):
    """An unmeasured GPU kernel's roofline is at the share of the SMs its grid keeps busy
    (a GPU's 132 until calibrated) and of its arithmetic that is real: 12 programs are 12/132
    of the flops rate, and of the bandwidth 3 times that (one SM alone streams more than its
    even share); a grid of whole waves, and a CPU kernel, pay nothing."""
    model = CostModel(db, {"cpu": HW, "cuda": GPU})
    sig, f = gpu_matmul(1, 768, 3072)  # 1 x 12 tiles, each 1 row of 64 real
    busy = 12 / 132
    assert_estimate(model.estimate(grid_matmul, sig, f),
                    3 * US + max(f.flops / (busy / 64) / 50e12, f.bytes / (3 * busy) / 2e12),
                    "estimated", UNCERTAINTY["estimated"])
    sig, f = gpu_matmul(64 * 12, 64 * 22, 256)  # 264 tiles: two whole waves, all real
    assert_estimate(model.estimate(grid_matmul, sig, f),
                    3 * US + max(f.flops / 50e12, f.bytes / 2e12), "estimated",
                    UNCERTAINTY["estimated"])
    sig, f = gpu_matmul(64 * 12, 64 * 12, 256)  # 144 tiles: a second wave of 12
    assert model.estimate(grid_matmul, sig, f).seconds == pytest.approx(
        3 * US + max(f.flops / (144 / 264) / 50e12, f.bytes / 2e12), rel=1e-12)
    # the calibration's SM count replaces the default: 12 tiles fill a 12-SM GPU
    db.set_calibration(GPU, {"flops": 50e12, "bytes": 2e12, "units": 12, "launch": 3 * US})
    model = CostModel(db, {"cpu": HW, "cuda": GPU})
    sig, f = gpu_matmul(64, 768, 3072)
    assert model.estimate(grid_matmul, sig, f).seconds == pytest.approx(
        3 * US + max(f.flops / 50e12, f.bytes / 2e12), rel=1e-12)


def test_interpolation_counts_the_grid_of_each_shape(db, grid_matmul):
    """A row measured where the grid filled the GPU predicts a shape that leaves SMs idle as
    that grid's work, not as its flops alone: 1 row of 3072 -> 768 is 12 programs doing 64
    rows' arithmetic, the 768-row one it is fitted from 144 doing only real work."""
    full_sig, full = gpu_matmul(768, 768, 3072)
    db.record(Measurement(grid_matmul.name, grid_matmul.source_hash, full_sig, 5, 1e-3, 1e-3,
                          2e-3, 0.0, hardware=GPU, flops=full.flops, bytes=full.bytes))
    model = CostModel(db, {"cpu": HW, "cuda": GPU})
    sig, f = gpu_matmul(1, 768, 3072)
    got = model.estimate(grid_matmul, sig, f)
    assert got.source == "interpolated"
    w_full = max(full.flops / (144 / 264) / 50e12, full.bytes / 2e12)
    w_one = max(f.flops / (12 / 132 / 64) / 50e12, f.bytes / (3 * 12 / 132) / 2e12)
    overhead = min(3 * US, 0.5 * 1e-3)
    assert got.seconds == pytest.approx(overhead + (1e-3 - overhead) * w_one / w_full, rel=1e-9)
    assert got.seconds > 0.1e-3  # a flops-only scaling would say 1/768 of the row: 1.3 us
