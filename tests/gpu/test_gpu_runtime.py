"""The runtime on a GPU: one torch arena per GPU, weights moved there once per binding, GPU
feeds used as they are, results on the host or left on the device, early OutOfMemory, and
kept states (KV caches) that never leave the GPU.

Runs on a real GPU, and in CI on the simulated one (``TG_SIMULATED_CUDA=1``: the GPU's tensors
are torch CPU tensors; see conftest). Shapes are large enough that the planner puts the heavy
steps on the GPU with a fresh database, and each test checks that it did."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import tensor_graphs as tg
from tensor_graphs.devices import torch_device
from tensor_graphs.numerics import relative_error

RNG = np.random.default_rng(0)
GPU = torch.device(torch_device("cuda"))


def _program(**options):
    x = tg.input("x", (128, 512))
    w = tg.weight("w", (512, 256))
    b = tg.weight("b", (256,))
    y = tg.tanh(x @ w + b) * 2.0
    prog = tg.compile(y, device="cuda", db=":memory:", **options)
    W = RNG.standard_normal((512, 256)).astype(np.float32) / 16
    B = RNG.standard_normal(256).astype(np.float32)
    return prog, y, {"w": W, "b": B}


def _on_gpu(prog) -> list[str]:
    return [s.kernel.name for s in prog.plan.steps if s.device == "cuda" and not s.is_copy]


def _reference(y, feeds):
    return tg.evaluate(y, {k: np.asarray(v) for k, v in feeds.items()}, dtype="float64")


def _x():
    return RNG.standard_normal((128, 512)).astype(np.float32)


def test_arena_is_one_uint8_tensor_per_gpu_with_256_byte_offsets():
    prog, y, weights = _program()
    assert any("matmul" in k or "linear" in k for k in _on_gpu(prog)), prog.explain()
    mp = prog.memory_plan
    assert mp.alignments["cuda"] == 256 and mp.alignments.get("cpu", 64) == 64
    gpu_buffers = mp.liveness.arena_buffers("cuda")
    assert gpu_buffers and all(mp.buffer_offsets[b.id] % 256 == 0 for b in gpu_buffers)
    assert all(mp.buffer_offsets[b.id] % 64 == 0 for b in mp.liveness.arena_buffers("cpu"))
    before = tg.Device("cuda").allocated
    prog.bind(**weights)
    X = _x()
    got = prog(x=X)
    assert isinstance(got, np.ndarray)
    assert relative_error(got, _reference(y, {"x": X, **weights})) < 1e-5
    arena = prog._last.arenas["cuda"]
    assert arena.dtype == torch.uint8 and arena.ndim == 1 and arena.device == GPU
    assert arena.numel() == mp.arena["cuda"]
    weights_bytes = sum(a.nbytes for a in weights.values())
    assert tg.Device("cuda").allocated - before == mp.arena["cuda"]  # the arena, counted
    assert prog.memory()["cuda:0"] >= mp.arena["cuda"] + weights_bytes
    # every GPU instruction that writes into the arena got a view at its planned offset
    exe = prog._last
    _, _, outs = exe.bound({})
    places = [(ins, buf) for ins, buf in zip(exe.instructions, outs)
              if buf is not None and ins.device == "cuda"]
    assert places
    for ins, buf in places:
        assert buf.untyped_storage().data_ptr() == arena.untyped_storage().data_ptr()
        assert buf.data_ptr() - arena.data_ptr() == ins.place[1]
        assert ins.place[1] % 256 == 0


def test_weights_move_to_the_gpu_once_per_binding(copies):
    prog, y, weights = _program()
    prog.bind(**weights)
    assert copies["to_gpu"] == 2  # w and b, by bind
    assert all(isinstance(v, torch.Tensor) and v.device == GPU for v in prog._bound.values())
    # per binding: the constants the GPU steps read; per call: the input
    constants = sum(s.device == "cuda" and s.node.op.name == "constant"
                    for s in prog.plan.leaves)
    inputs = sum(s.kernel.name == "copy_host_to_cuda" for s in prog.plan.steps
                 if s.inputs[0].node.op.name == "input")
    assert inputs == 1
    X = _x()
    for _ in range(3):
        prog(x=X)
    assert copies["to_gpu"] == 2 + constants + 3 * inputs
    prog.bind(w=weights["w"])
    got = prog(x=X)
    assert copies["to_gpu"] == 2 + constants + 3 * inputs + 1 + constants + inputs, \
        (prog._last.native.last, copies["where"])
    assert relative_error(got, _reference(y, {"x": X, **weights})) < 1e-5


def test_bound_weights_are_what_a_kernel_started_early_may_read():
    """A GEMV launched with PDL loads its first weights before it waits for the kernels
    before it only where they are bound weights (kernels/torch/bound.py): ``bind`` marks the
    tensors it holds on the GPU; a fed input is never marked."""
    from tensor_graphs.kernels.torch import bound

    prog, _, weights = _program()
    fed = torch.from_numpy(_x()).to(GPU)
    prog.bind(**weights)(x=fed)
    held = prog.bound_weights(on_host=False)
    assert held and all(bound.is_weight(t) for t in held.values())
    assert not bound.is_weight(fed)
    # another program's kept state, bound here as a weight: that program's kernels write it
    from tensor_graphs.kernels.torch import state as gpu_state

    cache = gpu_state.allocate(tuple(weights["w"].shape), np.float32, "cuda")
    prog.bind(w=cache)
    assert not bound.is_weight(prog.bound_weights(on_host=False)["w"])


def test_gpu_feeds_are_used_without_a_copy(copies):
    prog, y, weights = _program()
    prog.bind(**weights)
    X = _x()
    fed = torch.from_numpy(X).to(GPU)
    start = dict(copies)
    got = prog(x=fed)
    assert copies["to_gpu"] == start["to_gpu"]  # no copy of x to the GPU
    assert relative_error(got, _reference(y, {"x": X, **weights})) < 1e-5
    assert torch.equal(fed, torch.from_numpy(X).to(GPU))  # the feed is not written


def test_a_gpu_feed_reaches_host_kernels_too():
    """An input read on both devices: the GPU steps take the feed as is, the host steps a
    copy of it on the host."""
    x = tg.input("x", (128, 512))
    w = tg.weight("w", (512, 256))
    big = tg.tanh(x @ w)
    small = tg.sum(x, axis=1, keepdims=True)  # cheap: planned on the host
    prog = tg.compile([big, small], device="cuda", db=":memory:")
    W = RNG.standard_normal((512, 256)).astype(np.float32) / 16
    prog.bind(w=W)
    X = _x()
    got = prog(x=torch.from_numpy(X).to(GPU))
    ref = tg.evaluate([big, small], {"x": X, "w": W}, dtype="float64")
    assert all(relative_error(g, r) < 1e-5 for g, r in zip(got, ref))


def test_outputs_stay_on_the_device_when_asked(copies):
    prog, y, weights = _program(outputs="device")
    assert not any(s.kernel.name == "copy_cuda_to_host" for s in prog.plan.steps)
    prog.bind(**weights)
    X = _x()
    first = prog(x=torch.from_numpy(X).to(GPU))
    assert isinstance(first, torch.Tensor) and first.device == GPU
    assert copies["to_host"] == 0
    ref = _reference(y, {"x": X, **weights})
    assert relative_error(first.cpu().numpy(), ref) < 1e-5
    again = prog(x=torch.from_numpy(_x()).to(GPU))  # a later call leaves the first alone
    assert again.data_ptr() != first.data_ptr()
    assert relative_error(first.cpu().numpy(), ref) < 1e-5
    with pytest.raises(tg.ArgumentError, match="outputs must be one of"):
        tg.compile(y, device="cuda", db=":memory:", outputs="gpu")


def test_out_of_memory_on_a_small_gpu_before_anything_runs():
    x = tg.input("x", (128, 512))
    w = tg.weight("w", (512, 256))
    y = tg.tanh(x @ w)
    need = tg.estimate_memory(y, device="cuda", db=":memory:")
    assert set(need) <= {"cpu", "cuda:0"} and need["cuda:0"] >= 512 * 256 * 4
    before = tg.Device("cuda").allocated  # what programs of earlier tests still hold
    small = tg.Device("cuda", capacity=before + need["cuda:0"] - 1)
    with pytest.raises(tg.OutOfMemory, match="cuda:0") as info:
        tg.compile(y, device=small, db=":memory:")
    assert info.value.device == "cuda:0" and info.value.required == need["cuda:0"]
    assert tg.Device("cuda").allocated == before
    prog = tg.compile(y, device=tg.Device("cuda", capacity=before + need["cuda:0"]),
                      db=":memory:")
    assert prog.memory() == need


def test_the_native_loop_leaves_gpu_programs_to_the_python_loop():
    prog, y, weights = _program()
    prog.bind(**weights)
    prog.cuda_graphs = False  # (with them, a GPU program replays: tests/gpu/test_cuda_graphs.py)
    X = _x()
    for _ in range(3):
        got = prog(x=X)
    assert prog.loop.startswith("python loop: the program has GPU steps")
    assert prog.stats["native_runs"] == 0
    assert relative_error(got, _reference(y, {"x": X, **weights})) < 1e-5


def test_explain_shows_devices_and_copies():
    prog, _, weights = _program()
    text = prog.explain()
    assert "devices: " in text and "cuda:0" in text
    assert "copies: " in text and "cpu -> cuda:0 per call" in text
    assert "copy to cuda" in text


def test_kv_cache_stays_on_the_gpu():
    kv = tg.state("kv", ("past", 64))
    x = tg.input("x", ("seq", 64))
    new = tg.state_update(kv, x, offset="past", axis=0)
    score = tg.tanh(new @ tg.weight("w", (64, 512))).sum(axis=0)
    outs = [score, new]
    prog = tg.compile(outs, device="cuda", db=":memory:", bounds={"past": 30, "seq": 2})
    W = RNG.standard_normal((64, 512)).astype(np.float32) / 8
    prog.bind(w=W, kv=np.zeros((0, 64), np.float32))
    state = prog._states["kv"]
    buffer = state.buffer
    assert isinstance(buffer, torch.Tensor) and buffer.device == GPU
    assert tuple(buffer.shape) == (32, 64)
    rows = []
    for step in range(5):
        X = RNG.standard_normal((2 if step == 0 else 1, 64)).astype(np.float32)
        before = np.concatenate(rows) if rows else np.zeros((0, 64), np.float32)
        got, kept = prog(x=X)
        rows.append(X)
        ref = tg.evaluate(outs, {"x": X, "w": W, "kv": before}, dtype="float64")
        assert relative_error(got, ref[0]) < 1e-5
        assert isinstance(kept, torch.Tensor) and kept.device == GPU  # no copy to the host
        np.testing.assert_array_equal(kept.cpu().numpy(), np.concatenate(rows))
    assert state.buffer is buffer  # appended in place, never reallocated
    assert any(s.kernel.name == "torch_cuda_state_update" for s in prog.plan.steps)


def test_torch_cuda_kernels_write_into_out():
    k = tg.kernels.get("torch_cuda_exp")
    assert k.writes_out
    x = torch.linspace(-2, 2, 12, device=GPU).reshape(3, 4)
    buf = torch.full((3, 4), float("nan"), device=GPU)
    assert k.fn(x, out=buf) is buf
    assert torch.equal(buf, torch.exp(x))
    host = tg.kernels.get("copy_cuda_to_host")
    out = np.empty((3, 4), np.float32)
    assert host.fn(x, out=out) is out and np.array_equal(out, x.cpu().numpy())


def _small_gpu_program(db: str):
    """gelu(x @ w) planned on the GPU (``db``: a slow host's), with torch's kernels."""
    x = tg.input("x", (4, 8))
    w = tg.weight("w", (8, 16))
    y = tg.gelu(x @ w)
    prog = tg.compile(y, device="cuda", db=db, backends=("torch", "copy"))
    assert any(s.device == "cuda" and not s.is_copy for s in prog.plan.steps), prog.explain()
    return prog, y


def test_a_feed_or_weight_that_requires_grad_leaves_the_program_working(slow_host):
    """A tensor that requires grad (a model's output outside ``no_grad``, a ``Parameter``)
    is read outside autograd: copied into the arena as it was, it made autograd record the
    copy on the arena, and every later kernel writing there with ``out=`` failed, numpy
    feeds included, for the program's life (after a CUDA graph was captured too)."""
    prog, y = _small_gpu_program(slow_host)
    W = RNG.standard_normal((8, 16)).astype(np.float32)
    prog.bind(w=torch.nn.Parameter(torch.from_numpy(W).to(GPU)))
    X = RNG.standard_normal((4, 8)).astype(np.float32)
    ref = _reference(y, {"x": X, "w": W})
    plain = torch.from_numpy(X).to(GPU)
    for fed in (plain, plain, plain, plain.clone().requires_grad_(True), X, X,
                torch.nn.Parameter(plain.clone())):
        assert relative_error(prog(x=fed), ref) < 1e-5


def test_threads_sharing_a_gpu_program_get_their_own_results(slow_host):
    """Calls share the program's arenas and kept states: from several threads they run one
    at a time (a web server's pool calling one program got other calls' results, silently:
    15-38 of 60 on the simulated GPU)."""
    from concurrent.futures import ThreadPoolExecutor

    prog, y = _small_gpu_program(slow_host)
    W = RNG.standard_normal((8, 16)).astype(np.float32)
    prog.bind(w=W)
    wrong = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(20):
            X = rng.standard_normal((4, 8)).astype(np.float32)
            if relative_error(prog(x=X), _reference(y, {"x": X, "w": W})) > 1e-5:
                wrong.append(seed)

    with ThreadPoolExecutor(3) as pool:  # (list: a worker's exception is raised here)
        list(pool.map(worker, range(3)))
    assert wrong == []


def test_fed_ids_out_of_range_are_refused_before_the_gpu_runs(slow_host):
    """A token id past the table, fed from the host, is refused by name before any step: on
    a real GPU torch's gather would stop on a device-side assert, which ends the process's
    CUDA context. The program (and the GPU) serve the next call; its kept cache is as the
    last good call left it."""
    cache = tg.state("cache", ("past", 16))
    ids = tg.input("ids", (1, "seq"), "int64")
    rows = tg.embedding(ids, tg.weight("wte", (50, 16)))[0]
    new = tg.state_update(cache, rows, offset="past", axis=0)
    outs = [tg.tanh(new @ tg.weight("w", (16, 32))).sum(axis=0), new]
    prog = tg.compile(outs, device="cuda", db=slow_host, backends=("torch", "copy"),
                      bounds={"past": 16, "seq": 4})
    assert any(s.device == "cuda" and "embedding" in s.kernel.name for s in prog.plan.steps), \
        prog.explain()
    weights = {"wte": RNG.standard_normal((50, 16)).astype(np.float32),
               "w": RNG.standard_normal((16, 32)).astype(np.float32)}
    prog.bind(**weights, cache=np.zeros((0, 16), np.float32))
    good = np.array([[3, 49, 0]])
    first, kept = prog(ids=good)
    kept = kept.cpu().numpy().copy()
    for bad, shown in ((np.array([[3, 50]]), "holds 50 at (0, 1)"),
                       (torch.tensor([[-2]]), "holds -2 at (0, 0)")):
        with pytest.raises(tg.EvaluationError, match=re.escape(
                f"input 'ids' {shown}, out of range: it indexes axis 0 of 'wte' (50, 16) "
                "through gather, so its values must be in [0, 50) (nothing ran)")):
            prog(ids=bad)
        np.testing.assert_array_equal(prog.state("cache").cpu().numpy(), kept)
    got, _ = prog(ids=np.array([[7]]))
    ref = tg.evaluate(outs, {"ids": np.array([[7]]), "cache": kept, **weights},
                      dtype="float64")
    assert relative_error(got, ref[0]) < 1e-5
