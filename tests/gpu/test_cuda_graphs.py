"""CUDA graphs (``runtime/graphs.py``): a GPU program captured once per dims and replayed, its
feeds copied into static places, nothing allocated inside, the graphs of a program in a bounded
LRU, refusals with the reason in ``prog.loop``, and decode with ``tg.nn.Generator``.

Runs on a real GPU, and in CI on the simulated one (see conftest), where the capture is the
stand-in ``graphs.SimulatedGraph``: its replay calls the recorded launches again on the same
buffers, so a replay that read a moved address or a result allocated per call would give
other results than the Python loop. The last test runs on a real GPU only.

The programs are small, so a database whose host is a thousand times slower than a CPU
(``slow_host``) makes the planner put their steps on the GPU, as it would larger ones."""

from __future__ import annotations

import contextlib
import dataclasses
import re

import numpy as np
import pytest
import torch

import tensor_graphs as tg
from tensor_graphs.db import Database
from tensor_graphs.devices import simulated_cuda, torch_device
from tensor_graphs.numerics import relative_error
from tensor_graphs.runtime import graphs
from tensor_graphs.runtime import values as dv
from tests.gpu import tiny

GPU = torch.device(torch_device("cuda"))
SIMULATED = simulated_cuda() is not None


def _rng(seed: int):
    return np.random.default_rng(seed)


def _host(value) -> np.ndarray:
    """A copy on the host of a program's state (a torch tensor on the GPU, real or simulated)."""
    return value.cpu().numpy() if isinstance(value, torch.Tensor) else np.array(value)


def _dense(db, seed: int = 0, **options):
    """tanh(x @ w + b) * 2 on the GPU, weights bound."""
    x = tg.input("x", (32, 64))
    w = tg.weight("w", (64, 64))
    b = tg.weight("b", (64,))
    y = tg.tanh(x @ w + b) * 2.0
    prog = tg.compile(y, device="cuda", db=db, **options)
    weights = {"w": _rng(seed).standard_normal((64, 64)).astype(np.float32) / 8,
               "b": _rng(seed + 1).standard_normal(64).astype(np.float32)}
    prog.bind(**weights)
    return prog, y, weights


def _x(seed: int, rows: int = 32) -> np.ndarray:
    return _rng(100 + seed).standard_normal((rows, 64)).astype(np.float32)


def _reference(y, feeds):
    return tg.evaluate(y, feeds, dtype="float64")


def _twice(prog, **feeds):
    """Two calls: dims met for the first time run in the Python loop, the second captures."""
    prog(**feeds)
    assert prog.loop.startswith("python loop: the program has GPU steps, first call with "
                                "these dims"), prog.loop
    return prog(**feeds)


def test_a_gpu_program_is_captured_once_then_replayed_as_the_python_loop_runs_it(slow_host):
    prog, y, weights = _dense(slow_host)
    plain, _, _ = _dense(slow_host)
    plain.cuda_graphs = False
    loops = ["python loop: the program has GPU steps, first call with these dims",
             "cuda graph: captured", "cuda graph: replayed", "cuda graph: replayed"]
    for call, loop in enumerate(loops):
        X = _x(call)
        got, want = prog(x=X), plain(x=X)
        assert prog.loop.startswith(loop), prog.loop
        np.testing.assert_array_equal(got, want)  # the same kernels on the same values
        assert relative_error(got, _reference(y, {"x": X, **weights})) < 1e-5
    assert prog.stats["graph_captures"] == 1 and prog.stats["graph_runs"] == 3
    assert plain.loop.startswith("python loop: the program has GPU steps and CUDA graphs are "
                                 "off"), plain.loop
    assert plain.stats["graph_runs"] == 0
    assert "loop: cuda graph: replayed" in prog.explain()


def test_feeds_go_to_static_places_and_the_graph_allocates_nothing(slow_host):
    prog, y, weights = _dense(slow_host)
    _twice(prog, x=_x(0))
    exe = prog._last
    split = exe._split()
    (entry,) = exe.graphs.entries.values()
    _, _, outs = exe.bound({})
    staged = [(ins, outs[n]) for n, ins in enumerate(exe.instructions[:split.first])
              if ins.copy_in]
    assert staged and all(buf is not None for _, buf in staged)  # the feed's static place
    arena = exe.arenas["cuda"]
    if isinstance(entry.graph, graphs.SimulatedGraph):
        calls = entry.graph.calls
        assert len(calls) == split.last - split.first  # one launch per step (no views here)
        # every captured launch got its out= place in the arena: nothing allocated inside
        assert all(buf is not None and dv.inside(buf, arena) for *_, buf in calls)
        place = staged[0][1]
        assert any(a.data_ptr() == place.data_ptr() for a in calls[0][2])  # reads the place
    # a feed already on the GPU is copied into the same place, and left as it was
    for seed in (1, 2):
        X = _x(seed)
        fed = torch.from_numpy(X).to(GPU)
        got = prog(x=fed)
        assert prog.loop.startswith("cuda graph: replayed"), prog.loop
        assert relative_error(got, _reference(y, {"x": X, **weights})) < 1e-5
        assert torch.equal(fed, torch.from_numpy(X).to(GPU))
    host = _x(3)  # and a host feed after GPU ones
    assert relative_error(prog(x=host), _reference(y, {"x": host, **weights})) < 1e-5


def test_device_outputs_are_clones_a_later_replay_leaves_alone(slow_host):
    prog, y, weights = _dense(slow_host, outputs="device")
    X = _x(0)
    first = _twice(prog, x=X)
    second = prog(x=_x(1))
    assert prog.loop.startswith("cuda graph: replayed") and isinstance(second, torch.Tensor)
    assert first.data_ptr() != second.data_ptr()
    assert not dv.inside(first, prog._last.arenas["cuda"])
    assert relative_error(first.cpu().numpy(), _reference(y, {"x": X, **weights})) < 1e-5


def test_one_graph_per_dims_in_a_bounded_lru(slow_host):
    x = tg.input("x", ("n", 64))
    w = tg.weight("w", (64, 64))
    y = tg.tanh(x @ w)
    prog = tg.compile(y, device="cuda", db=slow_host, bounds={"n": 16})
    W = _rng(0).standard_normal((64, 64)).astype(np.float32) / 8
    prog.bind(w=W)
    exe = prog._last
    exe.graphs.limit = 3
    seen = []
    for n in (4, 4, 5, 5, 6, 6, 4, 7, 7, 5, 16, 16):
        X = _x(n, rows=n)
        got = prog(x=X)
        assert relative_error(got, _reference(y, {"x": X, "w": W})) < 1e-5
        seen.append(prog.loop.split(":")[1].split()[0].strip(","))
    # a first sighting runs in the Python loop, the second captures; 4 is replayed (and
    # becomes the newest); 7 evicts 5, then 5 (met before) evicts 6, and 16 evicts 4
    assert seen == ["the", "captured", "the", "captured", "the", "captured", "replayed",
                    "the", "captured", "captured", "the", "captured"]
    assert list(exe.graphs.entries) == [(("n", 7),), (("n", 5),), (("n", 16),)]
    assert prog.stats["graph_captures"] == 6 and prog._last is exe  # one plan for every n


def test_rebinding_weights_drops_the_graphs(slow_host):
    prog, y, weights = _dense(slow_host)
    X = _x(0)
    _twice(prog, x=X)
    prog(x=X)
    assert prog.loop.startswith("cuda graph: replayed")
    new = {"w": weights["w"][::-1].copy(), "b": -weights["b"]}
    prog.bind(**new)
    got = prog(x=X)
    assert prog.loop.startswith("cuda graph: captured"), prog.loop  # the old read old weights
    assert relative_error(got, _reference(y, {"x": X, **new})) < 1e-5


def test_dropped_graphs_take_their_pool_with_them():
    """torch refuses to capture into a graph pool whose graphs were all freed ("use_count >
    0", seen on an H200): a program that kept the pool's handle when ``bind`` dropped its
    graphs ran every later call in the Python loop. The simulated GPU has no pools, so
    this checks the handle itself; tests/gpu/test_gpu_runtime.py's rebinding test is the
    real GPU's check."""
    kept = graphs.Graphs()
    kept._pool = object()  # a handle, as new_graph takes it on a real GPU
    kept.clear()
    assert kept._pool is None
    kept._pool = object()
    kept.split([], lambda: "no region")  # a new instruction list drops the graphs too
    assert kept._pool is None


def test_a_host_step_between_gpu_steps_keeps_the_python_loop(slow_host):
    x = tg.input("x", (64, 128))
    w = tg.weight("w", (128, 128))
    a = tg.tanh(x @ w)
    b = tg.tanh(a @ w)  # a is also an output: copied to the host between the GPU steps
    prog = tg.compile([a, b], device="cuda", db=slow_host)
    W = _rng(0).standard_normal((128, 128)).astype(np.float32) / 16
    prog.bind(w=W)
    X = _rng(1).standard_normal((64, 128)).astype(np.float32)
    for _ in range(2):
        got = prog(x=X)
    assert prog.loop == ("python loop: the program has GPU steps and no CUDA graph: "
                         "copy_cuda_to_host runs on the host, or copies to it, between the "
                         "first and the last GPU step"), prog.loop
    ref = _reference([a, b], {"x": X, "w": W})
    assert all(relative_error(g, r) < 1e-5 for g, r in zip(got, ref))
    assert prog.stats["graph_runs"] == 0


def test_a_kernel_without_out_whose_result_leaves_the_graph_keeps_the_python_loop(slow_host):
    x = tg.input("x", (64, 128))
    w = tg.weight("w", (128, 128))
    y = tg.sign(x @ w)
    prog = tg.compile(y, device="cuda", db=slow_host)
    (k,) = [s.kernel for s in prog.plan.steps if s.node.op.name == "sign" and not s.is_copy]
    assert k.device == "cuda" and not k.writes_out and not k.view
    prog.bind(w=_rng(0).standard_normal((128, 128)).astype(np.float32))
    X = _rng(1).standard_normal((64, 128)).astype(np.float32)
    np.testing.assert_array_equal(prog(x=X), np.sign(X.astype(np.float64) @ prog._bound["w"]
                                                     .cpu().numpy().astype(np.float64)))
    assert prog.loop.endswith(f"no CUDA graph: {k.name} allocates its result (no out= place "
                              "in the arena) and the result leaves the graph (an output, or "
                              "read after the last GPU step)"), prog.loop


def _replaced(prog, wrap, last: bool = False):
    """The program with its first GPU step's function wrapped (as tools that time steps do);
    ``last``: the last one's (its result leaves the region)."""
    exe = prog._last
    gpu = [n for n, ins in enumerate(exe.instructions)
           if ins.reads != "cpu" and ins.device != "cpu"]
    n = gpu[-1] if last else gpu[0]
    ins = exe.instructions[n]
    exe.instructions = [*exe.instructions[:n], dataclasses.replace(ins, fn=wrap(ins.fn)),
                        *exe.instructions[n + 1:]]
    return ins.name


def test_a_kernel_that_syncs_is_refused_and_the_call_still_runs(slow_host):
    prog, y, weights = _dense(slow_host)
    calls = []

    def syncing(fn):
        def run(*args, **kw):
            calls.append(float(args[0].abs().max()))  # a value read on the host: a sync
            return fn(*args, **kw)
        return run

    name = _replaced(prog, syncing)
    for seed in (0, 1, 2):
        X = _x(seed)
        before = len(calls)
        got = prog(x=X)
        assert relative_error(got, _reference(y, {"x": X, **weights})) < 1e-5
        if seed == 0:  # a first sighting: the Python loop, no warm-up
            assert len(calls) - before == 1
            continue
        assert prog.loop.startswith("python loop: the program has GPU steps and no CUDA graph "
                                    "at {}: " + f"{name} synchronizes with the host"), prog.loop
        # the warm-up stops at the sync (before the kernel got its value); then the Python
        # loop runs the call, and the next call knows the reason without a warm-up
        assert len(calls) - before == 1
    if SIMULATED:
        assert prog.loop.endswith("a value read on the host (float(tensor))"), prog.loop
    assert prog.stats["graph_runs"] == 0


def test_a_kernel_that_allocates_a_result_leaving_the_graph_is_refused(slow_host):
    prog, y, weights = _dense(slow_host)

    def ignoring_out(fn):
        def run(*args, out=None, **kw):
            return fn(*args, **kw)  # a new tensor: the results are read where the warm-up
        return run  # left them, and a replay would write elsewhere

    name = _replaced(prog, ignoring_out, last=True)
    X = _x(0)
    got = _twice(prog, x=X)
    assert relative_error(got, _reference(y, {"x": X, **weights})) < 1e-5
    assert prog.loop.endswith(f"{name} allocated its result instead of writing into its out= "
                              "place (and the result leaves the graph)"), prog.loop


def test_a_result_allocated_inside_the_graph_is_replayed_through_its_readers(slow_host):
    """A step that ignores its out= place, or has none (torch SDPA, rotary), allocates inside
    the graph; where only later steps of the graph read the result, a graph replays the
    allocation at its captured address and the readers see each call's values (the
    stand-in replays through the value slots: a replay on frozen arguments would hand the
    later steps the warm-up's tensor, and every call the first call's results)."""
    prog, y, weights = _dense(slow_host)
    name = _replaced(prog, lambda fn: lambda *args, out=None, **kw: fn(*args, **kw))
    for seed in range(4):
        X = _x(seed)
        got = prog(x=X)
        assert relative_error(got, _reference(y, {"x": X, **weights})) < 1e-5, seed
    assert prog.loop.startswith("cuda graph: replayed"), prog.loop
    assert prog.stats["graph_captures"] == 1 and prog.stats["graph_runs"] == 3
    (entry,) = prog._last.graphs.entries.values()
    if isinstance(entry.graph, graphs.SimulatedGraph):
        (call,) = [c for c in entry.graph.calls if c[0] == name]
        assert call[4] is not None  # it had a place, and returned a tensor of its own


def test_a_kernel_without_out_inside_the_graph_is_captured(slow_host):
    x = tg.input("x", (64, 128))
    w = tg.weight("w", (128, 128))
    y = tg.tanh(tg.sign(x @ w) @ w)  # sign allocates; only the next matmul reads it
    prog = tg.compile(y, device="cuda", db=slow_host)
    (k,) = [s.kernel for s in prog.plan.steps if s.node.op.name == "sign" and not s.is_copy]
    assert k.device == "cuda" and not k.writes_out and not k.view
    W = _rng(0).standard_normal((128, 128)).astype(np.float32) / 16
    prog.bind(w=W)
    for seed in range(4):
        X = _rng(seed).standard_normal((64, 128)).astype(np.float32)
        want = np.tanh(np.sign(X.astype(np.float64) @ W) @ W)
        assert relative_error(prog(x=X), want) < 1e-5, seed
    assert prog.loop.startswith("cuda graph: replayed"), prog.loop
    assert prog.stats["graph_captures"] == 1 and prog.stats["graph_runs"] == 3


def _transposed(db, head: bool):
    """reshape(permute(tanh(x @ w))): the reshape reads a strided view, made dense by a copy
    inside the region; ``head``: a matmul reads it (it stays inside), else it is the output
    (on the GPU: on the host it would be reshaped there)."""
    x, w = tg.input("x", (32, 64)), tg.weight("w", (64, 64))
    flat = tg.reshape(tg.permute(tg.tanh(x @ w), (1, 0)), (64 * 32,))
    y = flat @ tg.weight("v", (64 * 32, 16)) if head else flat
    prog = tg.compile(y, device="cuda", db=db, outputs="host" if head else "device")
    weights = {"w": _rng(0).standard_normal((64, 64)).astype(np.float32) / 8,
               "v": _rng(1).standard_normal((64 * 32, 16)).astype(np.float32) / 32}
    prog.bind(**({"w": weights["w"]} if not head else weights))
    (k,) = [s.kernel for s in prog.plan.steps if s.node.op.name == "reshape"]
    assert k.device == "cuda" and k.contiguous and k.view, k.name
    return prog, y, weights


def test_a_strided_input_made_dense_inside_the_graph_is_captured(slow_host):
    prog, y, weights = _transposed(slow_host, head=True)
    for seed in range(4):
        X = _x(seed)
        got = prog(x=X)
        assert relative_error(got, _reference(y, {"x": X, **weights})) < 1e-5, seed
    assert prog.loop.startswith("cuda graph: replayed"), prog.loop
    assert prog.stats["graph_captures"] == 1 and prog.stats["graph_runs"] == 3


def test_a_view_of_a_dense_copy_that_leaves_the_graph_is_refused(slow_host):
    prog, y, weights = _transposed(slow_host, head=False)
    for seed in range(3):
        X = _x(seed)
        got = prog(x=X).cpu().numpy()
        assert relative_error(got, _reference(y, {"x": X, "w": weights["w"]})) < 1e-5, seed
    assert prog.loop.endswith("torch_cuda_reshape allocated its result (it is neither a view "
                              "of its inputs nor an in-place append) and the result leaves the "
                              "graph"), prog.loop
    assert prog.stats["graph_runs"] == 0


def test_a_second_input_copied_among_the_gpu_steps_is_staged_before_the_graph(slow_host):
    """tanh(x @ w) * m (MiniLM's ids and attention mask): m's copy to the GPU comes after the
    first GPU step; it runs before the graph, into a place the memory plan keeps from step 0
    (so no earlier GPU step writes there)."""
    x, m = tg.input("x", (32, 64)), tg.input("m", (32, 64))
    w = tg.weight("w", (64, 64))
    y = tg.tanh(x @ w) * m
    prog = tg.compile(y, device="cuda", db=slow_host)
    W = _rng(0).standard_normal((64, 64)).astype(np.float32) / 8
    prog.bind(w=W)
    exe = prog._last
    gpu = [n for n, ins in enumerate(exe.instructions) if ins.reads != "cpu"]
    late = [n for n, ins in enumerate(exe.instructions) if ins.copy_in and n > gpu[0]]
    assert late, [ins.name for ins in exe.instructions]  # the case: a copy among GPU steps
    split = exe._split()
    assert not isinstance(split, str), split
    assert set(late) <= set(split.prefix) and not set(late) & set(split.region)
    placements = prog.memory_plan.placements
    copies = [s for s in prog.concrete_plan.steps if s.is_copy and s.device == "cuda"]
    bufs = prog.memory_plan.liveness.buffers
    assert len(copies) == 2 and all(bufs[placements[s.slot].buffer].first == 0 for s in copies)
    for seed in range(4):
        X, M = _x(seed), _x(seed + 10)
        got = prog(x=X, m=M)
        assert relative_error(got, _reference(y, {"x": X, "m": M, "w": W})) < 1e-5, seed
    assert prog.loop.startswith("cuda graph: replayed"), prog.loop
    assert prog.stats["graph_captures"] == 1 and prog.stats["graph_runs"] == 3


def test_a_capture_that_fails_leaves_the_call_to_the_python_loop(slow_host, monkeypatch):
    prog, y, weights = _dense(slow_host)
    exe = prog._last

    class Failing:
        def capture(self, run, warmed):
            run()  # the steps up to one that CUDA would refuse to capture
            raise RuntimeError("operation not permitted when stream is capturing\ndetails")

    monkeypatch.setattr(exe.graphs, "new_graph", lambda device: Failing())
    X = _x(0)
    got = _twice(prog, x=X)
    assert relative_error(got, _reference(y, {"x": X, **weights})) < 1e-5
    last = exe.instructions[exe._split().last - 1].name
    assert prog.loop.endswith(f"capturing {last} failed: operation not permitted when stream "
                              "is capturing"), prog.loop
    assert prog.stats["graph_runs"] == 0


def test_graphs_off_and_on_again(slow_host):
    prog, y, weights = _dense(slow_host)
    prog.cuda_graphs = False
    X = _x(0)
    off = prog(x=X)
    assert "CUDA graphs are off" in prog.loop and prog.stats["graph_runs"] == 0
    prog.cuda_graphs = True
    on = _twice(prog, x=X)
    assert prog.loop.startswith("cuda graph: captured")
    np.testing.assert_array_equal(on, off)


def test_compile_can_leave_graphs_off(slow_host):
    """``tg.compile(..., cuda_graphs=False)``: the Python loop from the start, as
    ``prog.cuda_graphs = False`` after compiling."""
    prog, y, weights = _dense(slow_host, cuda_graphs=False)
    assert prog.cuda_graphs is False
    X = _x(0)
    for _ in range(3):
        got = prog(x=X)
    assert "CUDA graphs are off" in prog.loop
    assert prog.stats["graph_runs"] == prog.stats["graph_captures"] == 0
    assert relative_error(got, _reference(y, {"x": X, **weights})) < 1e-5
    on, _, _ = _dense(slow_host, cuda_graphs=True)
    assert on.cuda_graphs is True


# ----------------------------------------------------------------------------- decode
def _randn(dtype, *shape):
    return torch.randn(*shape, device=GPU).to(dtype)


def test_the_torch_kernels_of_a_decode_step_write_into_out():
    """A graph captures only steps that write into their place: embedding, the positions'
    iota, layer norm, GELU and the LM head (linear without bias) on the GPU do, in every float
    dtype."""
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = _randn(dtype, 1, 3, 16)
        cases = {
            "torch_cuda_embedding": ((torch.tensor([[3, 0, 7]], device=GPU),
                                      _randn(dtype, 8, 16)), {}),
            "torch_cuda_iota": ((), {"length": 5, "dtype": "int64"}),
            "torch_cuda_layer_norm": ((x, _randn(dtype, 16), _randn(dtype, 16)), {"eps": 1e-5}),
            "torch_cuda_gelu": ((x,), {"approximate": "tanh"}),
            "torch_cuda_linear_nobias": ((x, _randn(dtype, 4, 16)), {}),
        }
        for name, (args, attrs) in cases.items():
            k = tg.kernels.get(name)
            assert k.writes_out, name
            want = k.fn(*args, **attrs)
            buf = torch.full_like(want, 7)
            assert k.fn(*args, **attrs, out=buf) is buf, (name, dtype)
            assert torch.equal(buf, want), (name, dtype)
        erf = tg.kernels.get("torch_cuda_gelu")
        buf = torch.empty_like(x)
        assert erf.fn(x, approximate="none", out=buf) is buf
        assert torch.equal(buf, erf.fn(x, approximate="none"))


def test_layer_norm_into_out_copies_once():
    """aten's ``native_layer_norm.out`` runs the functional kernel, then copies the rows,
    the mean and the rstd into their out tensors: three copy launches per LayerNorm (75 of
    the ~250 GPU launches of a GPT-2 decode token on an H200). The kernel copies the rows
    once."""
    from torch.profiler import profile

    k = tg.kernels.get("torch_cuda_layer_norm")
    x, w, b = _randn(torch.float32, 1, 3, 16), _randn(torch.float32, 16), \
        _randn(torch.float32, 16)
    buf = torch.empty_like(x)
    with profile() as prof:
        k.fn(x, w, b, eps=1e-5, out=buf)
    copies = sum(e.count for e in prof.key_averages() if e.key == "aten::copy_")
    assert copies == 1, copies
    ref = torch.nn.functional.layer_norm(x.double(), (16,), w.double(), b.double(), 1e-5)
    assert torch.allclose(buf.double(), ref, atol=1e-5)


def test_masked_attention_reads_nothing_on_the_host():
    """Fully masked rows are zeroed without first asking whether there are any (bool(t.any())
    waited for the GPU at every masked attention step, and kept it out of CUDA graphs)."""
    k = tg.kernels.get("torch_cuda_scaled_dot_product_attention_mask")
    q, kk, v = _randn(torch.float32, 1, 2, 3, 4), _randn(torch.float32, 1, 2, 5, 4), \
        _randn(torch.float32, 1, 2, 5, 4)
    for causal in (False, True):
        mask = torch.ones(3, 5, dtype=torch.bool, device=GPU)
        mask[1] = False
        if SIMULATED:  # torch's sync debug mode sees nothing on CPU tensors: watch the calls
            with graphs._watch():
                out = k.fn(q, kk, v, mask, is_causal=causal, scale=None)
        else:
            torch.cuda.set_sync_debug_mode("error")
            try:
                out = k.fn(q, kk, v, mask, is_causal=causal, scale=None)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        assert (out[:, :, 1] == 0).all() and out[:, :, 0].abs().sum() > 0


# The two generation tests below plan with torch's kernels only (``TORCH_ONLY``): their subject
# is what is captured when and what replays, which is the same for any kernel, and on the
# simulated GPU the Triton interpreter made them 31 and 36 s (1-2 s with torch's). Triton
# kernels inside graphs: tests/gpu/test_decode_overhead.py's host-work test, test_generate_ahead.py.
TORCH_ONLY = ("torch", "copy")


def test_decode_captures_a_cache_length_met_before_then_replays(slow_host):
    """Graphs per dims value (padding off): one generation meets each cache length once: the
    Python loop, no capture per token.
    The next one meets them again and captures one graph per length; the third replays."""
    from tensor_graphs.nn import Generator

    lm = tiny.gpt2()
    gen = Generator.from_transformers(lm, max_len=48, max_prompt=8, db=slow_host,
                                      device="cuda", backends=TORCH_ONLY)
    decode = gen.decode
    decode._symbolic.graphs.padding = None  # one graph per cache length (padded: below)
    prompt = _rng(3).integers(0, 211, (1, 8))
    expected = tiny.greedy(lm, prompt, 33)
    first = gen(prompt, 33)  # 32 decode steps, past = 8 .. 39
    np.testing.assert_array_equal(first, expected)
    assert decode.stats["graph_captures"] == 0 and decode.stats["graph_runs"] == 0, \
        decode.loop
    assert "first call with these dims" in decode.loop, decode.loop
    second = gen(prompt, 33)  # the same cache lengths, met before: each step captures
    np.testing.assert_array_equal(second, expected)
    assert decode.stats["graph_captures"] == 32 and decode.stats["graph_runs"] == 32, \
        decode.loop
    buffers = {n: decode._states[n].buffer for n in gen.cache_names}
    third = gen(prompt, 33)  # every step replays
    np.testing.assert_array_equal(third, expected)
    assert decode.stats["graph_captures"] == 32 and decode.stats["graph_runs"] == 64
    assert decode.loop.startswith("cuda graph: replayed"), decode.loop
    # the prefill from empty caches: captured on the second generation, replayed on the
    # third (an empty cache's prefix has no data_ptr: once, it was captured every time)
    assert gen.prefill.stats["graph_captures"] == 1, gen.prefill.loop
    assert gen.prefill.loop.startswith("cuda graph: replayed"), gen.prefill.loop
    # the caches were appended in place, inside the graphs: the same buffers throughout
    assert all(decode._states[n].buffer is buffers[n] for n in gen.cache_names)
    exe = decode._last
    entry = next(reversed(exe.graphs.entries.values()))
    if isinstance(entry.graph, graphs.SimulatedGraph):
        appends = [c for c in entry.graph.calls if c[0] == "torch_cuda_state_update"]
        assert len(appends) == len(gen.cache_names)
        roots = {buf.untyped_storage().data_ptr() for buf in buffers.values()}
        assert {c[2][0].untyped_storage().data_ptr() for c in appends} == roots
        # every other launch wrote into its out= place
        assert all(c[4] is not None for c in entry.graph.calls
                   if c[0] != "torch_cuda_state_update")


def _gpt2_decode_replays_bit_for_bit_on_a_real_gpu(tmp_path):
    """GPT-2 124M-shaped decode steps (random weights) at several cache lengths: each one
    through a CUDA graph (captured, then replayed) equals the same step in the Python loop
    bit for bit."""
    from tensor_graphs.nn import Generator

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(bos_token_id=None, eos_token_id=None)  # GPT-2 small
    lm = transformers.GPT2LMHeadModel(cfg).eval()
    path = tmp_path / "gpu.sqlite"
    with Database(path) as db:  # the decode step's work on the GPU, whatever its size
        db.set_calibration(None, {"flops": 1e6, "bytes": 1e6})
    on = Generator.from_transformers(lm, max_len=40, max_prompt=8, db=str(path),
                                     device="cuda")
    off = Generator.from_transformers(lm, max_len=40, max_prompt=8, db=str(path),
                                      device="cuda")
    off.decode.cuda_graphs = False
    on.decode._symbolic.graphs.padding = None  # a graph per cache length, met twice first
    on.prefill.cuda_graphs = off.prefill.cuda_graphs = False  # the same caches to start from
    prompt = _rng(5).integers(0, cfg.vocab_size, (1, 8))
    for round in range(3):  # the Python loop, captures, then replays
        logits = {}
        for gen in (on, off):
            gen.prefill.bind(**gen._empty)
            logits[id(gen)] = _host(gen.prefill(input_ids=prompt)[0])
            gen.decode.bind(**{n: gen.prefill.state(n) for n in gen.cache_names})
        for _ in range(12):  # past = 8 .. 19
            token = logits[id(off)][:, -1].argmax(axis=-1).astype(np.int64)[:, None]
            for gen in (on, off):
                logits[id(gen)] = _host(gen.decode(input_ids=token)[0])
            assert on.decode.loop.startswith("cuda graph" if round else "python loop"), \
                on.decode.loop
            np.testing.assert_array_equal(logits[id(on)], logits[id(off)])
    assert on.decode.stats["graph_captures"] == 12 and on.decode.stats["graph_runs"] == 24


if not SIMULATED:  # (defined only there: the simulated run of this folder allows no skips)
    test_gpt2_decode_replays_bit_for_bit_on_a_real_gpu = \
        _gpt2_decode_replays_bit_for_bit_on_a_real_gpu


# ----------------------------------------------------------------------------- padded graphs
def test_buckets_and_linear_offsets():
    assert [graphs.bucket(n, 107) for n in (0, 1, 16, 17, 32, 33, 64, 65, 106, 107, 200)] == \
        [16, 16, 16, 32, 32, 64, 64, 107, 107, 107, 200]
    assert graphs.bucket(3, 10) == 10  # never past the bound
    assert graphs.bucket(5, 107, "bound") == 107
    import sympy

    past, seq = sympy.Symbol("past"), sympy.Symbol("seq")
    assert graphs._linear(past, ("past",)) == (0, ((0, 1),))
    assert graphs._linear(2 * past + 3, ("past", "seq")) == (3, ((0, 2),))
    assert graphs._linear(past * seq, ("past", "seq")) is None
    assert graphs._linear(past + seq, ("past",)) is None  # seq is not padded


def test_a_long_generation_captures_a_graph_per_bucket_and_replays_the_rest(slow_host):
    """One graph serves many cache lengths: it is captured at a power-of-two bucket of
    ``past`` (the cache viewed at the bucket's length, the append's offset and the positions
    read from the GPU, the keys past ``past`` masked by the model's own mask), so a 64-token
    generation (past 8..70) captures 4 graphs (buckets 16, 32, 64 and the bound, 70) and
    replays every step but each bucket's first; padded to the bound, the one graph at 70
    replays every step of the next generation. Tokens equal transformers' throughout, and
    the caches grow in place."""
    from tensor_graphs.nn import Generator

    lm = tiny.gpt2(n_positions=128)
    gen = Generator.from_transformers(lm, max_len=71, max_prompt=8, db=slow_host,
                                      device="cuda", backends=TORCH_ONLY)
    decode = gen.decode
    prompt = _rng(3).integers(0, 211, (1, 8))
    expected = tiny.greedy(lm, prompt, 64)
    np.testing.assert_array_equal(gen(prompt, 64), expected)  # 63 decode steps
    assert decode.stats["graph_captures"] == 4, decode.loop
    assert decode.stats["graph_runs"] == 63 - 4, decode.loop  # each bucket's first: the loop
    assert re.fullmatch(r"cuda graph: replayed \d+ GPU steps in one launch \(padded: past "
                        r"<= 70\)", decode.loop), decode.loop
    buffers = {n: decode._states[n].buffer for n in gen.cache_names}
    decode._symbolic.graphs.padding = "bound"  # one graph for every length: 70's
    np.testing.assert_array_equal(gen(prompt, 64), expected)  # all replayed
    assert decode.stats["graph_captures"] == 4 and decode.stats["graph_runs"] == 2 * 63 - 4
    assert all(decode._states[n].buffer is buffers[n] for n in gen.cache_names)
    assert all(decode.state(n).shape[2] == 71 for n in gen.cache_names)
    assert decode.loop.endswith("(padded: past <= 70)")


@pytest.mark.slow  # ~35 s on the simulated GPU: the Triton kernels run in the interpreter
def test_a_padded_decode_step_appends_inside_its_attention_and_chains_its_gemvs(
        slow_host, monkeypatch):
    """In a padded graph the Triton decode attention takes over each layer's two cache
    appends (``runtime/appends.py``): they only make the caches' longer views, and the
    attention writes the new rows as it reads them (a GPT-2 token: 24 launches fewer). Each
    block's q/k/v projection, attention, output projection and MLP then run as one persistent
    chain (``runtime/chains.py``). Tokens equal transformers' across two buckets, replayed,
    and the caches hold what torch's appends write."""
    from tensor_graphs.nn import Generator
    from tensor_graphs.runtime import appends, chains

    folded, fold = [], appends.fold
    chained, fold_chains = [], chains.fold

    def counted(instructions, at, rows):
        out = fold(instructions, at, rows)
        folded.append(sum(ins.fn is appends.grown for ins in out))
        return out

    def counted_chains(instructions):
        out = fold_chains(instructions)
        chained.append([ins.name for ins in out if hasattr(ins.fn, "stands_for")])
        return out

    monkeypatch.setattr(appends, "fold", counted)
    monkeypatch.setattr(chains, "fold", counted_chains)
    lm = tiny.gpt2(n_layer=2)
    gens = {backends: Generator.from_transformers(lm, max_len=24, max_prompt=8, db=slow_host,
                                                  device="cuda", backends=backends)
            for backends in (None, TORCH_ONLY)}
    plan = gens[None].decode.plan
    assert sum(s.kernel.name.startswith("triton_decode_attention") for s in plan.steps) == 2
    prompt = _rng(3).integers(0, 211, (1, 8))
    expected = tiny.greedy(lm, prompt, 14)
    for _ in range(2):  # past 8..20: buckets 16 and 20 captured, then replayed
        np.testing.assert_array_equal(gens[None](prompt, 14), expected)
    assert folded.count(4) == 2, folded  # (2 layers x keys and values, in each bucket)
    block = ["ln_matmul_bias", "decode_attention_mask", "matmul_bias_add",
             "ln_matmul_bias_gelu_tanh", "matmul_bias_add"]  # a launch each block
    short = [[re.sub(r"^triton_|_gemv_n\d+k\d+$|_n\d+s\d+$", "", n) for n in names]
             for names in chained]
    assert short.count(block * 2) == 2, short  # (each bucket's capture)
    assert gens[None].decode.stats["graph_runs"] >= 13 + 11, gens[None].decode.loop
    np.testing.assert_array_equal(gens[TORCH_ONLY](prompt, 14), expected)
    for name in gens[None].cache_names:  # (the projections' kernels differ: their rounding)
        got, want = (_host(gens[b].decode.state(name)) for b in (None, TORCH_ONLY))
        assert got.shape == want.shape and relative_error(got, want) < 1e-6, name


@contextlib.contextmanager
def _chains_folded():
    """Per padded capture while the body runs: the names of the steps its chain fold
    (``runtime/chains.fold``) made stand-ins of, in order."""
    from tensor_graphs.runtime import chains

    found, fold = [], chains.fold

    def counted(instructions):
        out = fold(instructions)
        found.append([ins.name for ins in out if hasattr(ins.fn, "stands_for")])
        return out

    chains.fold = counted
    try:
        yield found
    finally:
        chains.fold = fold


@pytest.mark.slow  # ~30 s on the simulated GPU: the Triton kernels run in the interpreter
def test_a_llama_decode_normalizes_in_its_packed_gemvs_and_chains_them(slow_host):
    """A Llama block's RMSNorms feed three and two projections: with its siblings packed
    (one product over the concatenated weights, read back as slices) each norm feeds one
    GEMV that normalizes as it loads (``rms5_``/``rms6_linear_nobias``, the model's eps),
    and the block's attention, o_proj, gate/up, down and the next q/k/v chain as GPT-2's do.
    The packed form wins only because its slices are views, which a CUDA graph does not
    launch (``planner.plan.launches``): costed as kernels they outweighed the launches
    packing saves. Tokens equal transformers'."""
    from tensor_graphs.nn import Generator

    lm = tiny.llama(eps=1e-5)  # (Llama's; transformers' default 1e-6 is rms6_)
    gen = Generator.from_transformers(lm, max_len=16, max_prompt=8, db=slow_host,
                                      device="cuda")
    norm = "rms5_linear_nobias"
    gemvs = [re.sub(r"^triton_|_gemv_n\d+k\d+$", "", s.kernel.name)
             for s in gen.decode.plan.steps if "gemv" in s.kernel.name]
    assert gemvs.count(norm) == 5, gemvs  # per layer q/k/v and gate/up; the LM head
    prompt = _rng(3).integers(0, 211, (1, 8))
    expected = tiny.greedy(lm, prompt, 6)
    with _chains_folded() as chained:
        for _ in range(2):
            np.testing.assert_array_equal(gen(prompt, 6), expected)
    short = [[re.sub(r"^triton_|_gemv_n\d+k\d+$|_n\d+s\d+$", "", n) for n in names]
             for names in chained]
    block = ["decode_attention_mask", "linear_nobias_add", norm, "linear_nobias_add", norm]
    assert short and short[0] == block * 2, short


@pytest.mark.slow  # ~25 s on the simulated GPU: the Triton kernels run in the interpreter
def test_a_chained_batch_decode_copies_a_view_only_after_the_stage_it_reads(slow_host):
    """A batch of two: each row's q, k and v are slices of its projection's row, not dense,
    so their reshapes copy them. A copy is a launch, so the projection's stage must run
    before it: the chain launches what it holds first (``chains._dense_after``). Without
    that the copies read the previous token's projection, left where this one's goes, and
    the tokens drifted from transformers' after the capture (its check saw the own run's
    values there and passed)."""
    from tensor_graphs.nn import Generator

    lm = tiny.gpt2(n_layer=2)
    gen = Generator.from_transformers(lm, max_len=24, max_prompt=8, db=slow_host,
                                      device="cuda", batch=2)
    prompt = _rng(3).integers(0, 211, (2, 8))
    expected = tiny.greedy(lm, prompt, 10)
    with _chains_folded() as chained:
        for _ in range(2):
            np.testing.assert_array_equal(gen(prompt, 10), expected)
    assert chained and len(chained[0]) == 10, chained  # (2 blocks' 5 steps)
    assert gen.decode.stats["graph_runs"] >= 9 + 8, gen.decode.loop


def _unmasked_decode(slow_host, seed: int = 0):
    """q attends over a cache without a mask: a padded graph would read the keys past
    ``past``, so padding must be refused by the capture's check."""
    q = tg.input("q", (1, 2, 1, 16))
    new = tg.input("kv", (1, 2, 1, 16))
    k = tg.state("k", (1, 2, "past", 16))
    k2 = tg.state_update(k, new, offset="past", axis=2)
    y = tg.scaled_dot_product_attention(q, k2, k2)
    prog = tg.compile([y, k2], device="cuda", db=slow_host, bounds={"past": 40})
    prog.bind(k=np.zeros((1, 2, 0, 16), np.float32))
    return prog, y


def test_padding_that_changes_results_is_refused_and_graphs_per_dims_run(slow_host):
    prog, y = _unmasked_decode(slow_host)
    keys = []
    for step in range(12):
        Q = _rng(step).standard_normal((1, 2, 1, 16)).astype(np.float32)
        K = _rng(50 + step).standard_normal((1, 2, 1, 16)).astype(np.float32)
        before = _host(prog.state("k"))
        got, _ = prog(q=Q, kv=K)
        keys.append(K)
        cache = np.concatenate(keys, axis=2)
        np.testing.assert_array_equal(_host(prog.state("k")), cache)
        want = tg.evaluate(y, {"q": Q, "kv": K, "k": before}, dtype="float64")
        assert relative_error(got, want) < 1e-5, (step, prog.loop)
        if step == 1:  # the bucket's second sighting: padding checked, refused
            assert "no padded CUDA graph" in prog.loop and "does not give the call's " \
                "results" in prog.loop, prog.loop
    exe = prog._symbolic
    assert exe.graphs._padding.startswith("padding refused"), exe.graphs._padding
    # the per-dims graphs took over: lengths met once run the Python loop
    assert prog.stats["graph_captures"] == 0 and "first call with these dims" in prog.loop
