"""Host<->GPU copies through a GPU's staging buffer (``kernels/staging.py``, ``Staging``).

On a real GPU the buffer is pinned and the moves asynchronous; on the simulated one (CI) it is
ordinary memory and the moves synchronous, through the same ring: these tests check its reuse,
growth, wrapping, pieces, ``out=``, dtypes and layouts. ``Deferred`` stands in for a GPU
stream whose moves run late (only when an event is waited for), so the events that guard the
buffer's regions are checked here too: a region reused before its move ran would corrupt the
copy. ``tests/kernels/test_copy_staging_pinned.py`` checks pinning on a real GPU."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest
import torch

import tensor_graphs as tg
from tensor_graphs.devices import simulated_cuda, torch_device
from tensor_graphs.kernels import staging as staged

GPU = torch.device(torch_device("cuda:0"))


def _copy(name: str):
    """The copy kernel's function, looked up when called: without a GPU the main suite
    imports this file to skip it, and no copy kernel is registered."""
    return lambda *args, **kwargs: tg.kernels.get(name).fn(*args, **kwargs)


TO_GPU, TO_HOST = _copy("copy_host_to_cuda"), _copy("copy_cuda_to_host")

DTYPES = (np.float32, ml_dtypes.bfloat16, np.int64, np.bool_, np.int8)


@pytest.fixture
def ring(monkeypatch):
    """A fresh staging registry, and a small ring: 4 KiB at first, growing to 16 KiB, copies
    over 4 KiB in pieces (so a few small arrays wrap it and go through in pieces)."""
    monkeypatch.setattr(staged, "_staging", {})
    monkeypatch.setattr(staged, "MIN_CAPACITY", 4096)
    monkeypatch.setattr(staged, "LIMIT", 16384)
    monkeypatch.setattr(staged, "PIECE", 4096)
    monkeypatch.setattr(staged, "SMALL_TO_HOST", 1024)


def _array(rng, shape, dtype) -> np.ndarray:
    if np.dtype(dtype) == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if np.dtype(dtype).kind in "iu":
        return np.asarray(rng.integers(-100, 100, shape).astype(dtype))
    return np.asarray(rng.standard_normal(shape).astype(dtype))


def _same(got, want) -> bool:
    got = got.cpu().numpy() if isinstance(got, torch.Tensor) and got.dtype != torch.bfloat16 \
        else got
    if isinstance(got, torch.Tensor):  # bfloat16: compare the bits
        got = got.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    want = np.asarray(want)
    return got.shape == want.shape and got.dtype == want.dtype and \
        np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def _on_gpu(a: np.ndarray):
    t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) \
        if a.dtype == ml_dtypes.bfloat16 else torch.from_numpy(a)
    return t.to(GPU)


def test_the_buffer_is_pinned_exactly_on_a_real_gpu():
    stage = staged.staging("cuda:0")
    TO_GPU(np.ones(10, np.float32), device="cuda:0")
    assert stage is staged.staging("cuda") is staged.staging(tg.Device("cuda:0"))
    assert stage.pinned is (simulated_cuda() is None)
    assert stage.buffer.is_pinned() is stage.pinned


def test_copies_reuse_one_buffer_and_it_grows_by_powers_of_two_only(monkeypatch):
    monkeypatch.setattr(staged, "_staging", {})
    rng = np.random.default_rng(0)
    stage = staged.staging("cuda:0")
    assert stage.capacity == 0  # made on first use
    small = [_array(rng, (10, 6), np.float32) for _ in range(5)]  # 240 bytes
    got = [TO_GPU(a, device="cuda:0") for a in small]
    assert stage.capacity == staged.MIN_CAPACITY
    first = stage.buffer.data_ptr()
    assert stage.head == 5 * staged.ALIGN  # five regions, one after the other
    big = _array(rng, (100, 1000), np.float32)  # 400 KB: the buffer grows to 512 KiB
    got.append(TO_GPU(big, device="cuda:0"))
    assert stage.capacity == 512 << 10 and stage.buffer.data_ptr() != first
    grown = stage.buffer.data_ptr()
    got.append(TO_GPU(small[0], device="cuda:0"))
    assert stage.capacity == 512 << 10 and stage.buffer.data_ptr() == grown  # never shrunk
    back = TO_HOST(got[5])  # a GPU -> host copy of 400 KB shares the buffer
    assert stage.buffer.data_ptr() == grown
    assert not np.shares_memory(back, stage.host)
    for g, a in zip(got, [*small, big, small[0]]):
        assert _same(g, a)
    assert _same(back, big)


def test_a_copy_beyond_the_limit_goes_through_in_pieces_and_the_buffer_stops_at_it(ring):
    rng = np.random.default_rng(1)
    stage = staged.staging("cuda:0")
    for dtype in DTYPES:
        a = _array(rng, (37, 301), dtype)  # 11 kB (int8) to 89 kB (int64)
        g = TO_GPU(a, device="cuda:0")
        back = TO_HOST(g)
        assert stage.capacity == 16384 >= stage.head
        assert _same(g, a) and _same(back, a), np.dtype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trips_of_any_size_layout_and_out(ring, dtype):
    """Sizes around the ring's (wrapping it, in pieces), 0-d and empty arrays, strided and
    transposed sources on either side, ``out=`` on either side, foreign byte order."""
    rng = np.random.default_rng(2)
    stage = staged.staging("cuda:0")
    results = []
    for shape in ((), (0,), (0, 5), (1,), (7, 33), (130,), (1000,), (3, 700), (5000,),
                  (9, 1111)):
        a = _array(rng, shape, dtype)
        results.append((TO_GPU(a, device="cuda:0"), a))
        if a.ndim == 2:
            t = a.T  # a transposed source, and a strided one
            results.append((TO_GPU(t, device="cuda:0"), t))
            s = a[::2, 1::3]
            results.append((TO_GPU(s, device="cuda:0"), s))
        out = torch.full(shape, 7, dtype=results[-1][0].dtype, device=GPU)
        assert TO_GPU(a, device="cuda:0", out=out) is out
        results.append((out, a))
        back = np.zeros(shape, a.dtype)
        assert TO_HOST(_on_gpu(a), out=back) is back
        assert _same(back, a)
        if a.ndim == 2:  # a transposed GPU tensor into a strided host array
            host = np.zeros((a.shape[1] * 2, a.shape[0]), a.dtype)[::2]
            assert TO_HOST(_on_gpu(a).T, out=host) is host
            assert _same(host, a.T)
            new = TO_HOST(_on_gpu(a).T)
            assert new.flags.c_contiguous and _same(new, a.T)
            assert not np.shares_memory(new, stage.host)
    if np.dtype(dtype).itemsize > 1:
        a = _array(rng, (3, 999), dtype).astype(np.dtype(dtype).newbyteorder(">"))
        results.append((TO_GPU(a, device="cuda:0"), a.astype(np.dtype(dtype))))
    for got, want in results:  # read after the buffer was reused many times over
        assert isinstance(got, torch.Tensor) and got.device == GPU
        assert got.is_contiguous() and _same(got, want), want.shape


def test_a_result_brought_back_is_not_the_buffer_a_later_copy_overwrites(ring):
    rng = np.random.default_rng(3)
    stage = staged.staging("cuda:0")
    arrays = [_array(rng, (600,), np.float32) for _ in range(12)]  # 2400 bytes each: wraps
    gpu = [_on_gpu(a) for a in arrays]
    back = [TO_HOST(g) for g in gpu]
    for b, a in zip(back, arrays):
        assert not np.shares_memory(b, stage.host) and b.flags.owndata
        assert _same(b, a)
    zero = np.zeros((0, 3), np.float32)
    assert TO_HOST(_on_gpu(zero), out=zero) is zero


class Deferred(staged.Staging):
    """A stream whose moves run only when an event recorded after them is waited for (or the
    stream is synchronized): what a GPU's asynchronous DMA may do. A region of the buffer that
    is written before its move ran makes that move copy the wrong bytes."""

    def __init__(self):
        super().__init__(pinned=False)
        self.queue: list = []  # (dst, src), in order
        self.ran = 0  # moves run so far
        self.waits = 0  # events waited for

    def _move(self, dst, src) -> None:
        self.queue.append((dst, src))

    def _mark(self, index):
        return Event(self, len(self.queue))

    def run(self, upto: int) -> None:
        while self.ran < upto:
            dst, src = self.queue[self.ran]
            dst.copy_(src)
            self.ran += 1

    def synchronize(self) -> None:
        self.run(len(self.queue))


class Event:
    def __init__(self, stream: Deferred, upto: int):
        self.stream, self.upto = stream, upto

    def synchronize(self) -> None:
        self.stream.waits += 1
        self.stream.run(self.upto)


def test_a_region_is_rewritten_only_after_its_move_ran(ring, monkeypatch):
    """Moves to the GPU left in flight: the copies that follow write the buffer only where
    the moves have run, waiting (on the region's event) only where the ring comes round to a
    region still in flight; copies back wait for their own moves before reading."""
    stream = Deferred()
    monkeypatch.setitem(staged._staging, torch_device("cuda:0"), stream)
    rng = np.random.default_rng(4)
    first = [_array(rng, (100,), np.float32) for _ in range(3)]
    got = [(TO_GPU(a, device="cuda:0"), a.copy()) for a in first]
    assert stream.waits == 0 and stream.ran == 0  # in flight: nothing waited for
    for n in (700, 300, 2000, 1, 5000, 900, 1024, 3):  # wraps, grows, goes in pieces
        for dtype in (np.float32, ml_dtypes.bfloat16, np.bool_):
            a = _array(rng, (n,), dtype)
            got.append((TO_GPU(a, device="cuda:0"), a.copy()))
            a[...] = 0  # the caller's array may change once the call returned
    assert stream.waits > 0 and stream.ran < len(stream.queue)
    source = _array(rng, (3000,), np.int64)  # back to the host in pieces, behind the moves
    back = TO_HOST(_on_gpu(source))
    assert _same(back, source)
    stream.synchronize()
    for g, a in got:
        assert _same(g, a), (a.shape, a.dtype)


def test_a_wrap_waits_for_the_regions_it_skips_and_those_it_covers(monkeypatch):
    """A 4 KiB ring: A [0, 3072) and C [3072, 3584); D (2 KiB) wraps to [0, 2048), so A's
    move must run first, C's not yet; E (2304 bytes) does not fit after D and wraps again:
    it skips C's bytes and covers D's, whose move must run before E is written (C's, older
    and in the ring's path, is waited for first)."""
    monkeypatch.setattr(staged, "_staging", {})
    for name in ("MIN_CAPACITY", "LIMIT", "PIECE"):
        monkeypatch.setattr(staged, name, 4096)
    stream = Deferred()
    monkeypatch.setitem(staged._staging, torch_device("cuda:0"), stream)
    rng = np.random.default_rng(6)
    arrays = [rng.integers(0, 256, n).astype(np.uint8) for n in (3072, 512, 2048, 2304)]
    got = []
    for a, ran in zip(arrays, (0, 0, 1, 3)):
        got.append(TO_GPU(a, device="cuda:0"))
        assert stream.ran == ran, (a.size, stream.ran)  # the moves run before each copy
    assert stream.head == 2304
    stream.synchronize()
    for g, a in zip(got, arrays):
        assert _same(g, a), a.size


class Slow(staged.Staging):
    """Moves that let other threads run first (as a DMA's launch releases the GIL)."""

    def _move(self, dst, src) -> None:
        time.sleep(1e-4)
        dst.copy_(src)


def test_threads_copy_through_one_buffer(ring, monkeypatch):
    """Several threads copying both ways at once through a small ring, switching inside each
    copy: the lock keeps each copy's regions its own until its move has read them."""
    monkeypatch.setitem(staged._staging, torch_device("cuda:0"), Slow(pinned=False))
    errors: list = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(25):
            a = _array(rng, (int(rng.integers(1, 3000)),), np.float32)
            g = TO_GPU(a, device="cuda:0")
            if not _same(g, a) or not _same(TO_HOST(g), a):
                errors.append(seed)

    with ThreadPoolExecutor(4) as pool:  # (list: a worker's exception is raised here)
        list(pool.map(work, range(4)))
    assert not errors


def test_a_program_with_two_inputs_stages_both_and_keeps_earlier_results(monkeypatch):
    """A call copies two inputs through the buffer and its result back; a second call's copies
    reuse the buffer without touching the first call's result."""
    monkeypatch.setattr(staged, "_staging", {})
    rng = np.random.default_rng(5)
    x, z = tg.input("x", (128, 512)), tg.input("z", (128, 256))
    w = tg.weight("w", (512, 256))
    y = tg.tanh(x @ w + z) * 2.0
    prog = tg.compile(y, device="cuda", db=":memory:")
    moves = [s for s in prog.plan.steps if s.kernel.name == "copy_host_to_cuda"]
    assert len(moves) >= 2, prog.explain()
    W = rng.standard_normal((512, 256)).astype(np.float32) / 16
    prog.bind(w=W)
    stage = staged.staging("cuda:0")
    claimed = []
    claim = staged.Staging._claim
    monkeypatch.setattr(staged.Staging, "_claim",
                        lambda self, n: claimed.append(n) or claim(self, n))
    calls = []
    for _ in range(2):
        X = rng.standard_normal((128, 512)).astype(np.float32)
        Z = rng.standard_normal((128, 256)).astype(np.float32)
        claimed.clear()
        calls.append((prog(x=X, z=Z), X, Z))
        # both inputs went through the buffer, and the result (128 KiB) came back through it
        assert sorted(claimed) == [128 * 256 * 4, 128 * 256 * 4, 128 * 512 * 4], claimed
    for got, X, Z in calls:
        want = np.tanh(X.astype(np.float64) @ W + Z) * 2.0
        assert not np.shares_memory(got, stage.host)
        assert np.max(np.abs(got - want)) < 1e-4
