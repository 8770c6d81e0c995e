"""Pinned staging on a real GPU (``kernels/staging.py``, ``Staging``): the buffer is page-locked,
a move to the GPU does not make the host wait for the GPU's queue, and the events keep the
buffer's regions from being rewritten while their moves are still queued. The GPU is kept
busy with ``torch.cuda._sleep`` so the moves really are in flight when the host goes on.

Runs only where torch has a usable CUDA GPU and the simulated one is off; the staging logic
itself runs in CI on the simulated GPU (``tests/gpu/test_copy_staging.py``)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tensor_graphs.devices import simulated_cuda

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or simulated_cuda() is not None,
                                reason="needs a real CUDA GPU (the simulated one cannot pin)")

BUSY = 1 << 30  # GPU cycles torch.cuda._sleep spins: ~0.5 s at ~2 GHz


@pytest.fixture
def staged(monkeypatch):
    """The staging module with a fresh registry of buffers."""
    from tensor_graphs.kernels import staging

    monkeypatch.setattr(staging, "_staging", {})
    return staging


def _kernels():
    import tensor_graphs as tg

    return tg.kernels.get("copy_host_to_cuda").fn, tg.kernels.get("copy_cuda_to_host").fn


def test_the_buffer_is_pinned_and_a_move_to_the_gpu_does_not_wait_for_it(staged):
    to_gpu, _ = _kernels()
    rng = np.random.default_rng(0)
    warm = to_gpu(np.ones(1 << 18, np.float32), device="cuda:0")  # the buffer, pinned once
    stage = staged.staging("cuda:0")
    assert stage.pinned and stage.buffer.is_pinned()
    torch.cuda.synchronize()
    x = rng.standard_normal(1 << 18).astype(np.float32)  # 1 MiB
    want = x.copy()
    torch.cuda._sleep(BUSY)  # the copy queues behind this
    start = time.perf_counter()
    got = to_gpu(x, device="cuda:0")
    host = time.perf_counter() - start
    x[...] = 0  # the caller may reuse its array once the call returned
    assert not stage.pending[-1][2].query()  # the move is still queued behind the sleep
    torch.cuda.synchronize()
    assert host < 0.1, f"the host waited {host:.3f} s for the GPU"
    assert np.array_equal(got.cpu().numpy(), want) and float(warm.sum()) == 1 << 18


def test_queued_moves_keep_their_regions_until_they_ran(staged, monkeypatch):
    """A 64 KiB ring and 24 copies of 8-24 KiB queued behind a busy GPU: the ring comes round
    to regions whose moves have not run, and must wait for them (the host blocks) rather than
    rewrite them; every copy arrives intact. The first copies, which fit, do not wait."""
    for name in ("MIN_CAPACITY", "LIMIT"):
        monkeypatch.setattr(staged, name, 64 << 10)
    monkeypatch.setattr(staged, "PIECE", 16 << 10)
    to_gpu, _ = _kernels()
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(int(rng.integers(2 << 10, 6 << 10))).astype(np.float32)
              for _ in range(24)]
    to_gpu(arrays[0], device="cuda:0")  # the buffer
    torch.cuda.synchronize()
    torch.cuda._sleep(BUSY)
    start = time.perf_counter()
    got = [to_gpu(arrays[i], device="cuda:0") for i in range(2)]
    fitted = time.perf_counter() - start
    got += [to_gpu(a, device="cuda:0") for a in arrays[2:]]
    waited = time.perf_counter() - start
    torch.cuda.synchronize()
    assert fitted < 0.1 < waited, (fitted, waited)
    for g, a in zip(got, arrays):
        assert np.array_equal(g.cpu().numpy(), a)


def test_results_brought_back_through_the_buffer_wait_for_the_gpu(staged, monkeypatch):
    """GPU -> host copies (in pieces too) of values the GPU computes behind a busy queue: the
    host reads them only after the move ran, into arrays it owns."""
    monkeypatch.setattr(staged, "PIECE", 64 << 10)
    _, to_host = _kernels()
    results = []
    for n in (1 << 16, 300_000, 1 << 20):  # 256 KiB, 1.2 MB (in pieces), 4 MiB
        torch.cuda._sleep(BUSY // 8)
        t = torch.arange(n, device="cuda:0", dtype=torch.float32) * 3
        results.append((to_host(t), n))
        out = np.zeros((n // 4, 4), np.float32)[:, ::2]  # a strided out
        assert to_host(t.view(n // 4, 4)[:, ::2], out=out) is out
        assert np.array_equal(out, (np.arange(n, dtype=np.float32) * 3).reshape(-1, 4)[:, ::2])
    stage = staged.staging("cuda:0")
    for got, n in results:
        assert not np.shares_memory(got, stage.host)
        assert np.array_equal(got, np.arange(n, dtype=np.float32) * 3)


def test_bfloat16_and_bool_round_trip_through_pinned_memory(staged):
    import ml_dtypes

    to_gpu, to_host = _kernels()
    rng = np.random.default_rng(2)
    for a in (rng.standard_normal((300, 301)).astype(ml_dtypes.bfloat16),
              rng.random((700, 130)) < 0.5, rng.integers(-9, 9, (64, 1025)).astype(np.int64)):
        back = to_host(to_gpu(a.T, device="cuda:0"))
        assert back.dtype == a.dtype and back.tobytes() == np.ascontiguousarray(a.T).tobytes()
