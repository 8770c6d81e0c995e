"""The GPU path's tests: they run on a real GPU as they are, and in CI on the simulated one.

``TG_SIMULATED_CUDA=1`` must be set before tensor_graphs is imported, so the main suite runs
this folder in a child process with it set (``tests/test_gpu_simulated.py``); in the main
process itself, without a GPU real or simulated, every test here is skipped."""

from __future__ import annotations

import pytest

from tensor_graphs.devices import cuda_available

pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _needs_a_gpu():
    if not cuda_available():
        pytest.skip("no GPU, real or simulated (tests/test_gpu_simulated.py runs this folder "
                    "with TG_SIMULATED_CUDA=1)")


@pytest.fixture
def slow_host(tmp_path) -> str:
    """A database whose host computes at 1 Mflop/s and 1 MB/s: every step the GPU can run is
    planned there (as GPT-2's decode step is on a real one)."""
    from tensor_graphs.db import Database

    path = tmp_path / "slow-host.sqlite"
    with Database(path) as db:
        db.set_calibration(None, {"flops": 1e6, "bytes": 1e6})
    return str(path)


@pytest.fixture
def copies(monkeypatch):
    """Counts the copy kernels' moves: "to_gpu" (host -> GPU and GPU -> GPU, the program's
    copy steps and ``bind`` alike) and "to_host" (GPU -> host). "where" keeps, per move to
    the GPU, its shape and the runtime's functions that asked for it (a count that differs
    on a real GPU says which path moved more)."""
    import traceback

    from tensor_graphs.kernels import copy as copy_kernels

    counts = {"to_gpu": 0, "to_host": 0, "where": []}
    moved, to_host = copy_kernels._moved, copy_kernels._to_host

    def counted_moved(*args, **kwargs):
        counts["to_gpu"] += 1
        callers = [f.name for f in traceback.extract_stack(limit=9)[:-2]
                   if "tensor_graphs" in f.filename]
        counts["where"].append((tuple(getattr(args[0], "shape", ())), " < ".join(callers[::-1])))
        return moved(*args, **kwargs)

    def counted_to_host(*args, **kwargs):
        counts["to_host"] += 1
        return to_host(*args, **kwargs)

    monkeypatch.setattr(copy_kernels, "_moved", counted_moved)
    monkeypatch.setattr(copy_kernels, "_to_host", counted_to_host)
    return counts
