"""Measuring on a GPU: what the profiler adds for a GPU plan, where the rows are filed, and
that a second compile plans from them.

Runs on a real GPU and under the simulated one (``TG_SIMULATED_CUDA=1``: cuda:0's tensors are
CPU tensors, so CI exercises the same path with CPU timings under the key "cuda|simulated|...").
Shapes are tiny except in the real-GPU-only timing check.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.db import hardware  # noqa: E402
from tensor_graphs.db.cost import CostModel, measured_on  # noqa: E402
from tensor_graphs.db.store import open_db  # noqa: E402
from tensor_graphs.devices import cuda_available, simulated_cuda  # noqa: E402
from tensor_graphs.kernels import registry  # noqa: E402
from tensor_graphs.planner.search import Planner, signature  # noqa: E402
from tensor_graphs.profiler import missing  # noqa: E402
from tensor_graphs.profiler.device import device_io  # noqa: E402
from tensor_graphs.profiler.measure import Call, measure  # noqa: E402

if not cuda_available():
    pytest.skip("needs a GPU, real or simulated (TG_SIMULATED_CUDA=1)", allow_module_level=True)

SIMULATED = simulated_cuda() is not None
CPU, GPU = hardware.current("cpu"), hardware.current("cuda")
COPIES = {"copy_host_to_cuda", "copy_cuda_to_host"}


def test_the_gpus_rows_have_a_key_of_their_own():
    if SIMULATED:  # CPU times, never a real GPU's rows nor this CPU's
        assert GPU.device == "cuda|simulated|" + CPU.device
    else:
        assert GPU.device.startswith("cuda|") and "|sm " in GPU.device
        assert not GPU.device.startswith("cuda|simulated")
    assert GPU.device_key != CPU.device_key


def planner_for(db, outputs, backends=("numpy", "torch", "copy")) -> Planner:
    cost = CostModel(db, {"cpu": CPU, "cuda": GPU})
    planner = Planner(outputs, target="cuda", cost=cost, tolerance=1e-5, backends=backends,
                      generate=False)
    planner.solve()  # every option of every slot
    return planner


def tanh_of_product():
    x, w = tg.input("x", (8, 16)), tg.input("w", (16, 16))
    return x, w, tg.tanh(x @ w)


def test_profile_missing_measures_gpu_kernels_and_copies_on_the_gpu(tmp_path):
    db = open_db(tmp_path / "gpu.sqlite")
    *_, y = tanh_of_product()
    planner = planner_for(db, [y])
    todo = missing.calls_to_measure(planner)
    on_gpu = {o.kernel.name for o in todo if measured_on(o.kernel) == "cuda"}
    assert {"torch_cuda_matmul", "torch_cuda_tanh"} | COPIES <= on_gpu
    added = missing.profile_missing(planner, db, progress=False)
    rows = db.rows()
    # host-side options only where they could win (test_profile_gpu_host.py)
    assert added == len(rows) < len(todo)
    assert {(o.kernel.name, o.signature) for o in todo if not missing.gated(o, planner)} <= \
        {(r.kernel, r.signature) for r in rows}
    for r in rows:  # each checked against the float64 reference before it was timed
        assert r.failure is None and r.runs > 0 and r.min > 0, r
        assert r.error is not None and r.error <= 1e-5, r
        assert r.hardware == (GPU if measured_on(registry.get(r.kernel)) == "cuda" else CPU)
        if r.kernel in COPIES:
            assert r.error == 0.0  # the same bits, moved
    assert on_gpu <= {r.kernel for r in rows if r.hardware == GPU}
    # a second planner finds every option measured but gated ones that could not win, the
    # GPU's under the GPU's key
    again = planner_for(db, [y])
    assert all(missing.gated(o, again) for o in missing.calls_to_measure(again))
    assert missing.could_win(again, {(o.kernel.name, o.signature): o
                                     for o in missing.calls_to_measure(again)}) == set()
    sources = {o.kernel.name: o.estimate.source for opts in again._options.values()
               for o in opts if o.kernel is not None and o.kernel.name in on_gpu}
    assert set(sources) == on_gpu and set(sources.values()) == {"measured"}


@pytest.fixture
def wrong_gpu_tanh():
    """A torch kernel on the GPU that is off by one: verification must catch it on the GPU."""
    name = "test_wrong_cuda_tanh"
    tg.kernel("tanh", backend="torch", device="cuda", name=name)(lambda x: x.tanh() + 1)
    try:
        yield registry.get(name)
    finally:
        registry.unregister(name)
        missing._verified.pop(name, None)


def test_a_wrong_gpu_kernel_gets_a_failure_row_never_a_time(tmp_path, wrong_gpu_tanh):
    db = open_db(tmp_path / "gpu.sqlite")
    x = tg.input("x", (8, 16))
    y = tg.tanh(x)
    planner = planner_for(db, [y])
    assert wrong_gpu_tanh.name in {o.kernel.name for o in missing.calls_to_measure(planner)}
    missing.profile_missing(planner, db, progress=False)
    (row,) = db.rows(wrong_gpu_tanh.name)
    assert row.failure.startswith("verification failed") and row.runs == 0
    assert math.isnan(row.min) and row.hardware == GPU
    again = planner_for(db, [y])
    estimates = [o.estimate for opts in again._options.values() for o in opts
                 if o.kernel is wrong_gpu_tanh]
    assert estimates and all(e.source == "failed" for e in estimates)
    assert wrong_gpu_tanh.name not in again.plan().kernels


@pytest.fixture
def faulting_gpu_tanh():
    """A GPU tanh whose calls raise CUDA's sticky error as torch words it, once ``fault`` is
    set: a real one would leave this process's GPU unusable for every test after it."""
    name = "test_faulting_cuda_tanh"
    state = {"fault": True}

    def run(x):
        if state["fault"]:
            raise RuntimeError("CUDA error: device-side assert triggered\nCUDA kernel errors "
                               "might be asynchronously reported at some other API call")
        return x.tanh()

    tg.kernel("tanh", backend="torch", device="cuda", name=name)(run)
    try:
        yield registry.get(name), state
    finally:
        registry.unregister(name)
        missing._verified.pop(name, None)


def test_a_gpu_fault_stops_the_profile_and_is_filed_as_no_kernels_failure(
        tmp_path, faulting_gpu_tanh, monkeypatch):
    """A device-side assert leaves the process's GPU unusable: every later call fails alike.
    Filed as the failure of the kernel that met it (and of each after it), it would keep
    correct kernels out of every later plan. The profile stops with an error that names the
    kernel and says what to do; no row and no verification outcome is filed for it, so a new
    process verifies and measures it afresh."""
    from tensor_graphs.errors import GPUFaultError
    from tensor_graphs.profiler import shared_verify

    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path / "cache"))  # outcomes filed here
    k, state = faulting_gpu_tanh
    db = open_db(tmp_path / "gpu.sqlite")
    x = tg.input("x", (8, 16))
    planner = planner_for(db, [tg.tanh(x)])
    for _ in range(2):  # the second profile meets the fault again: nothing was filed
        with pytest.raises(GPUFaultError, match=f"verifying kernel {k.name}.*"
                           "CUDA_LAUNCH_BLOCKING=1.*start a new one"):
            missing.profile_missing(planner, db, progress=False)
        assert db.rows(k.name) == []
        assert k.name not in missing._verified
    with pytest.raises(GPUFaultError):
        tg.kernels.verify(k)
    state["fault"] = False  # verified cleanly, then the fault comes while it is timed
    assert shared_verify.check(k) is None
    state["fault"] = True
    with pytest.raises(GPUFaultError, match=f"kernel {k.name} on "):
        measure(_tanh_call(k), repeats=2)
    state["fault"] = False  # a new process's GPU (here: the fault gone) measures it
    missing.profile_missing(planner, db, progress=False)
    (row,) = db.rows(k.name)
    assert row.failure is None and row.runs > 0


_INDEX_PAST_ROWS = """
import sys
import torch
import tensor_graphs as tg
from tensor_graphs.profiler.measure import Call, measure
from tensor_graphs.planner.search import signature

def run(x):  # index 5 of 2 rows: torch's bounds check asserts on the device
    rows = torch.zeros(2, x.shape[-1], device=x.device, dtype=x.dtype)
    return torch.index_select(rows, 0, torch.tensor([5], device=x.device)).expand_as(x) + x
tg.kernel("tanh", backend="torch", device="cuda", name="test_asserting_cuda_tanh")(run)
x = tg.input("x", (8, 16))
y = tg.tanh(x)
try:
    row = measure(Call(tg.kernels.get("test_asserting_cuda_tanh"), y, (x,), {},
                       signature([x], y.attrs)))
except tg.GPUFaultError as exc:
    print("FAULT", exc)
    sys.exit(0)
print("ROW", row.failure)
"""


def test_a_device_side_assert_is_a_gpu_fault_and_a_host_check_the_kernels_own(child_env):
    """A kernel that indexes past its rows, in a child process (a real GPU's fault leaves the
    process's GPU unusable). On a real GPU torch's device-side check asserts: the
    measurement raises GPUFaultError, naming the kernel. On the simulated one torch checks
    the index on the host and raises IndexError: the kernel's own failure, a failure row."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _INDEX_PAST_ROWS], env=child_env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    if SIMULATED:
        assert "ROW IndexError" in proc.stdout, proc.stdout[-3000:]
    else:
        assert "FAULT" in proc.stdout and "test_asserting_cuda_tanh" in proc.stdout \
            and "CUDA_LAUNCH_BLOCKING" in proc.stdout, proc.stdout[-3000:]


def test_compile_profile_missing_on_the_gpu_then_plans_from_the_rows(tmp_path):
    path = tmp_path / "gpu.sqlite"
    x, w, y = tanh_of_product()
    first = tg.compile(y, device="cuda", db=path, profile="missing")
    with open_db(path) as db:
        gpu_rows = {r.kernel for r in db.rows() if r.hardware == GPU}
    assert {"torch_cuda_matmul", "torch_cuda_tanh"} | COPIES <= gpu_rows
    second = tg.compile(y, device="cuda", db=path)
    text = second.explain()
    assert "estimated" not in text and "measured" in text
    assert [s.kernel.name for s in second.plan.steps] == \
        [s.kernel.name for s in first.plan.steps]
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((8, 16)).astype(np.float32)
    ws = rng.standard_normal((16, 16)).astype(np.float32)
    got = np.asarray(second(x=xs, w=ws))
    ref = np.tanh(xs.astype(np.float64) @ ws.astype(np.float64))
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5


def test_a_gpu_call_runs_on_the_gpu_and_its_samples_wait_for_it():
    """Inputs go to the GPU's memory and samples synchronize the device (the simulated GPU's
    memory is the host's and its ops are synchronous: nothing to wait for). On a real GPU, a
    4096^3 float32 product is 137 GFLOP: at least 137 us on any GPU (1 PFLOP/s is past every
    fp32 and TF32 peak), where its launch returns in microseconds; timed without
    synchronizing, hundreds of launches fit in a 2 ms sample before the queue fills."""
    k = registry.get("torch_cuda_matmul")
    io = device_io(k)
    placed = io.to_device(np.ones((2, 2), np.float32))
    assert str(placed.device) == ("cpu" if SIMULATED else "cuda:0")
    assert (io.sync is None) == SIMULATED
    if SIMULATED:
        return
    n = 4096
    a, b = tg.input("a", (n, n)), tg.input("b", (n, n))
    node = a @ b
    row = measure(Call(k, node, (a, b), {}, signature([a, b], node.attrs), hardware=GPU),
                  repeats=3)
    assert row.failure is None and row.error < 1e-5, row
    assert row.min >= 2.0 * n ** 3 / 1e15, row


def test_calibrating_the_gpu_stores_its_rates_under_its_key(tmp_path):
    from tensor_graphs.commands.calibrate import calibrate_gpu

    db = open_db(tmp_path / "gpu.sqlite")
    rates = calibrate_gpu(db, GPU, seconds=0.2)
    # on a real GPU also its SMs ("units"), which the cost of a grid too small to fill it reads
    assert set(rates) == {"flops", "bytes", "link", "link_latency", "launch"} | (
        set() if SIMULATED else {"units"})
    assert all(v > 0 and math.isfinite(v) for v in rates.values())
    assert db.calibration(GPU) == rates and db.calibration(CPU) is None
    if not SIMULATED:  # any GPU of the last decade
        assert rates["flops"] > 1e12 and rates["bytes"] > 1e11 and rates["link"] > 1e9
        assert 1e-7 < rates["launch"] < 1e-4 and rates["link_latency"] < 1e-3
    model = CostModel(db, {"cpu": CPU, "cuda": GPU})
    assert model.overhead(registry.get("torch_cuda_tanh")) == rates["launch"]
    assert model.overhead(registry.get("copy_cuda_to_host")) == rates["link_latency"]
    assert model.rates("cuda")["flops"] == rates["flops"]


@pytest.fixture
def slow_host_tanh():
    """A GPU tanh whose Python side sleeps 2 ms per launch: host work a CUDA graph skips."""
    import time

    name = "test_slow_host_cuda_tanh"

    def run(x):
        time.sleep(2e-3)
        return x.tanh()

    tg.kernel("tanh", backend="torch", device="cuda", name=name)(run)
    try:
        yield registry.get(name)
    finally:
        registry.unregister(name)
        missing._verified.pop(name, None)


def _tanh_call(k) -> Call:
    x = tg.input("x", (64, 64))
    y = tg.tanh(x)
    return Call(k, y, (x,), {}, signature([x], y.attrs), hardware=GPU)


def test_a_gpu_kernel_is_timed_as_a_cuda_graph_replays_it(slow_host_tanh):
    """A GPU program runs as one CUDA graph, where a kernel costs its GPU time, not its launch
    from Python: the profiler times GPU kernels inside a graph of GRAPH_LAUNCHES calls. On a
    real GPU the 2 ms the kernel's Python side sleeps is captured once and never replayed; on
    the simulated one the "graph" calls the launches in turn, so the row is the call's own
    time (not GRAPH_LAUNCHES of them). Copies to and from the host are never captured."""
    from tensor_graphs.profiler import device
    from tensor_graphs.profiler import measure as measuring

    assert device_io(registry.get("torch_cuda_add")).replay is device.graphed
    assert all(device_io(registry.get(name)).replay is None for name in COPIES)
    assert device_io(registry.get("numpy_tanh")).replay is None
    row = measure(_tanh_call(slow_host_tanh), repeats=3, min_sample=4e-3)
    assert row.failure is None and row.runs == 3 and row.error < 1e-6, row
    if SIMULATED:
        assert 2e-3 <= row.min < 2 * 2e-3, row
    else:
        assert row.max < 0.5e-3, row  # a 64x64 tanh: microseconds
    assert measuring.GRAPH_LAUNCHES > 1


def test_a_captured_kernels_tensors_live_as_long_as_its_replay():
    """A graph reads and writes its tensors by address, so what replays it holds the function
    it captured (and the tensors that function holds). Once it returned ``graph.replay``
    alone: a timer's inputs were freed when the timer was made, the next timer's tensors took
    their memory, and on an H200 an embedding's replay read floats as its indices (a
    device-side assert that ended a fresh database's profile of GPT-2 on the GPU)."""
    import gc
    import weakref

    import torch

    from tensor_graphs.devices import torch_device
    from tensor_graphs.profiler import device

    where = torch_device("cuda")
    table = torch.randn(50, 8, device=where)
    ids = torch.randint(0, 50, (16,), device=where)
    out = torch.empty(16, 8, device=where)
    held = weakref.ref(ids)
    replay = device.graphed(lambda ids=ids: torch.index_select(table, 0, ids, out=out), 3)
    expected = table[ids].cpu()
    del ids
    gc.collect()
    assert held() is not None
    out.zero_()
    replay()
    if not SIMULATED:
        torch.cuda.synchronize()
    assert torch.equal(out.cpu(), expected)


def test_a_gpu_kernel_that_cannot_be_captured_is_timed_launch_by_launch(
        slow_host_tanh, monkeypatch):
    """Where the launches cannot be captured (a kernel that waits for the GPU: capture
    raises), the kernel is timed call by call, as the Python loop that then runs its program
    calls it: the host's 2 ms are in the row, once per call. (The simulated GPU cannot
    refuse a capture: the refusal is made here.)"""
    from tensor_graphs.profiler import device

    def refuse(fn, n):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(device, "graphed", refuse)
    row = measure(_tanh_call(slow_host_tanh), repeats=3, min_sample=4e-3)
    assert row.failure is None and row.runs == 3, row
    assert 2e-3 <= row.min < 2 * 2e-3, row


def test_timing_a_view_on_the_gpu_warns_of_nothing():
    """A view's call launches no kernel, so its timing graph is empty, and the warm-up before
    a capture sets torch's sync debug mode: torch warns of both ("The CUDA Graph is empty.
    This usually means that the graph was attempted to be captured on wrong device",
    "Synchronization debug mode is a prototype feature"), which a user's first GPU profile
    printed once per view and per region. Neither is the user's to act on. (The simulated
    GPU calls in turn: neither is met there.)"""
    import warnings

    import torch

    from tensor_graphs.devices import torch_device
    from tensor_graphs.profiler import device

    x = torch.randn(4, 6, device=torch_device("cuda"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        replay = device.graphed(lambda: x.view(6, 4), 3)
        replay()
        if not SIMULATED:
            torch.cuda.synchronize()
    assert [str(w.message) for w in seen] == []


def test_gpu_kernels_are_verified_in_worker_processes_at_once(tmp_path, slow_host_tanh):
    """Before a profile times anything, its registered GPU kernels are verified by spawned
    worker processes together (a Triton kernel's checks compile it, seconds each on a GPU's
    host): each outcome is filed for the profilers of the database, which read it instead of
    verifying again. A kernel only this program registered is left to the profile."""
    from tensor_graphs.profiler import shared_verify

    db = open_db(tmp_path / "gpu.sqlite")
    scope = shared_verify.scope_of(db)
    names = ["torch_cuda_tanh", "torch_cuda_exp", "torch_cuda_add"]
    kernels = [registry.get(n) for n in names] + [slow_host_tanh]
    filed = shared_verify.verify_at_once(kernels, lambda k: GPU, scope, workers=2)
    assert filed == len(names)  # (the test's own kernel: not in the workers' registry)

    def again():
        raise AssertionError("verified again: the worker's outcome was not read")

    for k in kernels[:-1]:
        assert shared_verify.shared(k, GPU, again, scope) is None
    assert shared_verify.shared(slow_host_tanh, GPU, lambda: "checked here", scope) == \
        "checked here"
    assert shared_verify.verify_at_once(kernels, lambda k: GPU, None, workers=2) == 0
    # one worker is no parallelism: nothing is spawned (the profile verifies as it goes)
    assert shared_verify.verify_at_once(kernels[:1], lambda k: GPU, scope, workers=2) == 0


def test_triton_templates_are_verified_in_the_workers_too(tmp_path):
    """A Triton template's verification cases come from a function (its config's, the
    interpreter's): the key its outcome is filed under names the cases, not the function's
    address, so the workers verify it and the profile reads their outcome. (Every Triton
    kernel had no key: GPT-2's first profile on an H200 verified its GEMM and attention
    templates one after another in the profile, 25-38 s each, and did not end in 400 s.)"""
    from tensor_graphs.profiler import shared_verify

    db = open_db(tmp_path / "gpu.sqlite")
    scope = shared_verify.scope_of(db)
    kernels = [registry.get(n) for n in ("triton_embedding_r4d256", "triton_embedding_r16d128")]
    assert all(callable(k.signatures) for k in kernels)  # (the case this test is about)
    assert shared_verify.verify_at_once(kernels, lambda k: GPU, scope, workers=2) == 2

    def again():
        raise AssertionError("verified again: the worker's outcome was not read")

    for k in kernels:
        assert shared_verify.shared(k, GPU, again, scope) is None


def test_a_profile_verifies_its_gpu_kernels_at_once_then_measures(tmp_path, wrong_gpu_tanh,
                                                                   monkeypatch):
    """The first round's registered GPU kernels go to the workers (here two, as a machine
    with four cores would give), the profile then measures them on their filed outcomes,
    and a kernel the workers cannot see (registered by this program) is verified by the
    profile itself: the wrong one still gets its failure row."""
    from tensor_graphs.profiler import shared_verify

    monkeypatch.setattr(shared_verify, "PARALLEL_CORES", 1)
    monkeypatch.setattr(missing, "_verified", {})  # (earlier tests verified torch's tanh)
    filed = []
    at_once = shared_verify.verify_at_once
    monkeypatch.setattr(shared_verify, "verify_at_once",
                        lambda *a, **kw: filed.append(at_once(*a, **kw)) or filed[-1])
    db = open_db(tmp_path / "gpu.sqlite")
    x = tg.input("x", (8, 16))
    y = tg.tanh(x)
    planner = planner_for(db, [y])
    missing.profile_missing(planner, db, progress=False)
    assert filed and filed[0] >= 1, filed  # torch_cuda_tanh at least
    (row,) = db.rows(wrong_gpu_tanh.name)
    assert row.failure.startswith("verification failed") and row.runs == 0
    good = db.rows("torch_cuda_tanh")
    assert good and all(r.failure is None and r.runs > 0 for r in good)


def test_a_script_without_a_main_guard_runs_once_when_workers_verify(tmp_path):
    """The workers are fresh interpreters given their kernels' names, not multiprocessing's
    spawn, which imports the caller's ``__main__`` again in each: a user's script without an
    ``if __name__ == "__main__"`` guard (most notebooks turned scripts) would run whole in
    every worker."""
    import os
    import subprocess
    import sys

    marker, script = tmp_path / "ran.txt", tmp_path / "user_script.py"
    script.write_text(f"""
with open({str(marker)!r}, "a") as f:
    f.write("ran\\n")
from tensor_graphs.db.hardware import current
from tensor_graphs.db.store import open_db
from tensor_graphs.kernels import registry
from tensor_graphs.profiler import shared_verify
db = open_db({str(tmp_path / "gpu.sqlite")!r})
kernels = [registry.get(n) for n in ("torch_cuda_tanh", "torch_cuda_exp")]
print(shared_verify.verify_at_once(kernels, lambda k: current("cuda"),
                                   shared_verify.scope_of(db), workers=2))
""")
    # the script imports this tensor_graphs, installed or a checkout's (a GPU machine runs
    # the tests from a copy of the tree: a script's own folder is first on its path)
    here = str(Path(tg.__file__).resolve().parents[1])
    env = {**os.environ, "TG_SIMULATED_CUDA": os.environ.get("TG_SIMULATED_CUDA", "1"),
           "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "2", done.stdout
    assert marker.read_text() == "ran\n"
