"""profile="missing" for a GPU plan measures a host-side option (a host kernel, a copy that
only reaches one) only where a plan on optimistic times picks it (profiler/missing.gated,
could_win): fewer host rows than measuring every option, the same plan when the rows favour
the GPU, and a host step still measured and planned where the database's rows make it win.

The clock is replaced by a deterministic one shaped like an H100 beside its host
(``fake_time``: GPU kernels 6 us plus their work at HBM rates, copies 15 us plus PCIe,
host kernels 2 us plus their work at a core's rates), so the two profiles see the same times
and their plans can be compared exactly; what is tested is which calls get measured. Runs on
the simulated GPU (``TG_SIMULATED_CUDA=1``, tests/test_gpu_simulated.py) and on a real one.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

pytest.importorskip("torch")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.db import Measurement, hardware  # noqa: E402
from tensor_graphs.db.cost import measured_on  # noqa: E402
from tensor_graphs.db.store import open_db  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402
from tensor_graphs.profiler import missing  # noqa: E402

CPU, GPU = hardware.current("cpu"), hardware.current("cuda")


def fake_time(o) -> float:
    """Seconds of an option's call on an H100 and its host (see the module doc); a host
    kernel runs 1.1-1.6x its roofline, by a factor of its own."""
    f = o.features
    if o.kernel.backend == "copy":
        return 15e-6 + f.bytes / 1e10
    if measured_on(o.kernel) != "cpu":
        return 6e-6 + max(f.flops / 5e13, f.bytes / 2e12)
    jitter = (zlib.crc32(o.kernel.name.encode()) % 5) / 8
    return (2e-6 + max(f.flops / 2e10, f.bytes / 8e9)) * (1.1 + jitter)


class Clock:
    """The rows timed (``rows``); ``slow`` ({kernel name: seconds}) overrides a kernel's
    time."""

    def __init__(self):
        self.rows: list[Measurement] = []
        self.slow: dict[str, float] = {}


@pytest.fixture
def clock(monkeypatch) -> Clock:
    """measure_options on ``fake_time``, every option taken as verified."""
    found = Clock()

    def measure(options, hardware=None, scope=None):
        for i in range(0, len(options), missing.WINDOW):
            window = []
            for o in options[i:i + missing.WINDOW]:
                t = found.slow.get(o.kernel.name) or fake_time(o)
                row = Measurement(o.kernel.name, o.kernel.source_hash, o.signature, 5, t, t,
                                  t, 1e-7, None, missing.hardware_of(o, hardware), 0.0,
                                  o.features.flops, o.features.bytes)
                found.rows.append(row)
                window.append((o, row))
            yield window

    monkeypatch.setattr(missing, "measure_options", measure)
    return found


def block():
    """A pre-norm MLP and a softmax over its scores, with the residual: every op has a GPU
    kernel, and every step a host alternative (copy down, run on the host, copy up)."""
    x = tg.input("x", (4, 16, 64))
    g = tg.weight("g", (64,))
    w1, w2 = tg.weight("w1", (64, 128)), tg.weight("w2", (128, 64))
    h = tg.rms_norm(x, g)
    y = tg.tanh(h @ w1) @ w2 + x
    return tg.softmax(y * 0.125, axis=-1)


def weights(rng) -> dict:
    return {"g": 1 + rng.standard_normal(64).astype(np.float32) / 10,
            "w1": rng.standard_normal((64, 128)).astype(np.float32) / 8,
            "w2": rng.standard_normal((128, 64)).astype(np.float32) / 11}


def profiled(path, every: bool, monkeypatch):
    # raising=False: the test runs, and fails, on the code before the flag existed
    monkeypatch.setattr(missing, "MEASURE_EVERY_HOST", every, raising=False)
    return tg.compile(block(), device="cuda", db=str(path), profile="missing", generate=False)


def host_rows(path) -> list[Measurement]:
    with open_db(path) as db:
        return [r for r in db.rows() if r.hardware == CPU]


def test_host_options_of_a_gpu_plan_are_measured_only_where_they_could_win(tmp_path, clock,
                                                                          monkeypatch):
    every = profiled(tmp_path / "every.sqlite", True, monkeypatch)
    timed_every = len(clock.rows)
    clock.rows.clear()
    some = profiled(tmp_path / "some.sqlite", False, monkeypatch)
    host_every, host_some = host_rows(tmp_path / "every.sqlite"), host_rows(tmp_path /
                                                                          "some.sqlite")
    assert len(host_every) >= 20  # numpy, torch and C kernels at every step
    assert len(host_some) <= len(host_every) / 3, sorted(r.kernel for r in host_some)
    assert len(clock.rows) < timed_every
    # every GPU kernel the full profile measured was measured here too
    timed_some = {(r.kernel, r.signature) for r in clock.rows}
    with open_db(tmp_path / "every.sqlite") as db:
        assert {(r.kernel, r.signature) for r in db.rows() if r.hardware == GPU
                and not r.kernel.startswith("copy_")} <= timed_some
    # the same plan, every step of it measured (a static step, a weight's copy once per
    # binding, is never: see calls_to_measure), its products and tanh on the GPU (the ends
    # go to the host, where the input comes from and the output goes)
    assert [s.kernel.name for s in some.plan.steps] == \
        [s.kernel.name for s in every.plan.steps], some.plan.explain()
    assert some.plan.cost == pytest.approx(every.plan.cost, rel=1e-12)
    assert all(s.static or s.source in ("measured", "free") for s in some.plan.steps), \
        some.plan.explain()
    assert {s.device for s in some.plan.steps
            if not s.is_copy and s.computes in ("matmul", "tanh")} == {"cuda"}
    rng = np.random.default_rng(0)
    ws = weights(rng)
    some.bind(**ws)
    feeds = {"x": rng.standard_normal((4, 16, 64), np.float32)}
    want = tg.evaluate(block(), {**feeds, **ws}, dtype="float64")
    assert relative_error(np.asarray(some(**feeds)), want) <= 1e-5


def test_a_host_step_that_the_rows_make_win_is_measured_and_planned(tmp_path, clock,
                                                                   monkeypatch):
    """The GPU's tanh timed at 2 ms (a slow kernel, a database from a busy GPU): the host
    path (copy down, tanh on the host, copy up) wins on optimistic times, so its kernels are
    measured, and with their rows it wins the plan."""
    monkeypatch.setattr(missing, "MEASURE_EVERY_HOST", False, raising=False)
    path = tmp_path / "gpu.sqlite"
    clock.slow["torch_cuda_tanh"] = 2e-3
    prog = tg.compile(block(), device="cuda", db=str(path), profile="missing", generate=False)
    (tanh_step,) = [s for s in prog.plan.steps if not s.is_copy and s.computes == "tanh"]
    assert tanh_step.device == "cpu" and tanh_step.source == "measured", prog.plan.explain()
    assert tanh_step.kernel.name in {r.kernel for r in host_rows(path)}
    assert all(s.static or s.source in ("measured", "free") for s in prog.plan.steps), \
        prog.plan.explain()
