"""The native loop: an all-C program runs as one foreign call; anything else falls back."""

import dataclasses

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import build, codegen
from tensor_graphs.numerics import relative_error
from tensor_graphs.runtime import native

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")
RNG = np.random.default_rng(7)


@pytest.fixture(scope="module", autouse=True)
def binary_c_kernels():
    """Generated-C kernels for a * b and a + b (the C backend has no plain binary kernels),
    unregistered afterwards unless something else had registered them."""
    a, b = tg.input("a", (8,)), tg.input("b", (8,))
    added = []
    for y in (a * b, a + b):
        known = set(registry._KERNELS)  # noqa: SLF001
        k = codegen.fuse_elementwise(y)
        if k.name not in known:
            added.append(k.name)
    yield
    for name in added:
        registry.unregister(name)


def chain(steps, n="n"):
    x = tg.input("x", (n,))
    y = x
    for i in range(steps):
        y = y * x if i % 2 == 0 else y + x
    return y


def feed(n):
    return RNG.uniform(0.1, 0.6, n).astype(np.float32)  # fresh each call; the chain stays finite


def no_python_kernels(prog):
    """Make every instruction's Python function raise: only the native loop can run now."""
    def boom(*args, **kw):
        raise AssertionError("a Python kernel ran")

    for exe in prog._all_executables():
        exe.instructions[:] = [dataclasses.replace(ins, fn=boom) for ins in exe.instructions]


def warm(prog, **feeds):
    """Two calls with these dims: the first plans the prelude, the second records (a program
    with symbolic dims records new dims on first sight, as a sample for the fit over dims
    (runtime/native_dims.py): then the second replays)."""
    for _ in range(2):
        prog(**feeds)
    assert "recorded" in prog.loop or prog.loop.startswith("native loop"), prog.loop


def test_thousand_instructions_in_one_foreign_call():
    y = chain(1000, 16)  # one C kernel per op: not fused into generated loops
    prog = tg.compile(y, db=":memory:", backends=("c",), generate=False)
    assert len(prog.plan) == 1000
    warm(prog, x=feed(16))
    no_python_kernels(prog)
    for _ in range(3):
        X = feed(16)
        before = native.counters()
        got = prog(x=X)
        after = native.counters()
        assert after["runs"] - before["runs"] == 1  # one foreign call
        assert after["called"] - before["called"] == 1000  # which made every C call
        assert prog.loop == "native loop: 1000 C calls in one foreign call"
        assert "native loop: 1000 C calls" in prog.explain()
        ref = tg.evaluate(y, {"x": X}, dtype="float64")
        assert relative_error(got, ref) <= prog.plan.error * 10
        np.testing.assert_array_equal(got, tg.evaluate(y, {"x": X}))  # float32 bit for bit
    assert prog.stats["native_runs"] == 3


def test_native_equals_python_loop_and_results_never_change():
    y = chain(40)
    prog = tg.compile(y, db=":memory:", backends=("c",), bounds={"n": 64})
    warm(prog, x=feed(9))
    X1, X2 = feed(9), feed(9)
    r1 = prog(x=X1)
    assert prog.loop.startswith("native")
    keep = r1.copy()
    r2 = prog(x=X2)
    np.testing.assert_array_equal(r1, keep)  # a later call did not change an earlier result
    assert not np.shares_memory(r1, r2)
    for arena in prog._last.arenas.values():
        assert not np.shares_memory(r1, arena)
    prog.native = False
    np.testing.assert_array_equal(prog(x=X2), r2)
    assert prog.loop.startswith("python loop: the native loop is off")


def test_symbolic_dims_record_once_per_binding():
    y = chain(30)
    prog = tg.compile(y, db=":memory:", backends=("c",), bounds={"n": 64})
    for n in (5, 64):
        warm(prog, x=feed(n))
    for n in (5, 64, 5, 64):
        X = feed(n)
        got = prog(x=X)
        assert prog.loop.startswith("native loop"), prog.loop
        assert got.shape == (n,)
        ref = tg.evaluate(y, {"x": X}, dtype="float64")
        assert relative_error(got, ref) <= prog.plan.error * 10
    assert prog.stats["planner_runs"] == 1
    assert len(prog._last.native.recordings) == 2


def test_weights_rebound_drop_the_recording():
    x = tg.input("x", ("n", 8))
    w = tg.weight("w", (8, 5))
    y = tg.softmax(tg.exp(x @ w))
    prog = tg.compile(y, db=":memory:", backends=("c",), bounds={"n": 8})
    assert {s.kernel.backend for s in prog.plan.steps} == {"c"}
    for W in (RNG.standard_normal((8, 5)), RNG.standard_normal((8, 5))):
        W = W.astype(np.float32)
        prog.bind(w=W)
        warm(prog, x=RNG.standard_normal((3, 8)).astype(np.float32))
        X = RNG.standard_normal((3, 8)).astype(np.float32)
        got = prog(x=X)
        assert prog.loop.startswith("native loop")
        ref = tg.evaluate(y, {"x": X, "w": W}, dtype="float64")
        assert relative_error(got, ref) <= 1e-5


def test_mixed_program_falls_back_and_says_why():
    x = tg.input("x", (6,))
    y = tg.exp(x) * x + x  # a numpy kernel somewhere
    prog = tg.compile(y, db=":memory:", backends=("numpy",))
    for _ in range(3):
        X = feed(6)
        got = prog(x=X)
        np.testing.assert_allclose(got, tg.evaluate(y, {"x": X}), rtol=1e-6)
    assert prog.loop.startswith("python loop: numpy_") and "numpy kernel" in prog.loop
    assert prog.stats["native_runs"] == 0


def test_dense_copy_per_call_falls_back():
    x = tg.input("x", (4, 6))
    y = tg.exp(x.permute(1, 0))  # c_exp needs dense input: the permute is copied per call
    prog = tg.compile(y, db=":memory:", backends=("c", "numpy"))
    assert [s.kernel.name for s in prog.plan.steps] == ["numpy_permute", "c_exp"]
    for _ in range(3):
        X = RNG.standard_normal((4, 6)).astype(np.float32)
        np.testing.assert_allclose(prog(x=X), np.exp(X.T), rtol=1e-6)
    assert "copied to a dense one" in prog.loop


@pytest.mark.parametrize("strided", [False, True])
def test_state_append_under_the_native_loop(strided):
    kv = tg.state("kv", ("past", 4))
    x = tg.input("x", (4, "seq") if strided else ("seq", 4))
    w = tg.weight("w", (4, 3))
    # strided: the appended value is a transposed view, copied with strides by the runner
    new = tg.state_update(kv, x.permute(1, 0) if strided else x, offset="past", axis=0)
    outs = [tg.softmax(new @ w), new]
    prog = tg.compile(outs, db=":memory:", bounds={"past": 16, "seq": 2})
    kinds = {s.kernel.name: s.kernel.backend for s in prog.plan.steps}
    assert kinds.pop("numpy_state_update") == "numpy"
    assert kinds.pop("numpy_permute", "numpy") == "numpy" and set(kinds.values()) == {"c"}
    W = RNG.standard_normal((4, 3)).astype(np.float32)
    prog.bind(w=W)
    start = RNG.standard_normal((1, 4)).astype(np.float32)
    for prompt in range(4):  # each prompt restarts the cache: the dims repeat
        prog.bind(kv=start)
        rows = [start]
        for step in range(3):
            X = RNG.standard_normal((2 if step == 0 else 1, 4)).astype(np.float32)
            before = np.concatenate(rows)
            probs, state = prog(x=np.ascontiguousarray(X.T) if strided else X)
            rows.append(X)
            if prompt >= 2:
                assert prog.loop.startswith("native loop"), prog.loop
            np.testing.assert_array_equal(state, np.concatenate(rows))
            fed = np.ascontiguousarray(X.T) if strided else X
            ref = tg.evaluate(outs, {"x": fed, "w": W, "kv": before}, dtype="float64")
            assert relative_error(probs, ref[0]) <= 1e-5
        np.testing.assert_array_equal(prog.state("kv"), np.concatenate(rows))


def test_a_failing_c_call_raises_the_kernels_error():
    a = tg.input("a", (5,), "int32")
    b = tg.input("b", (5,), "int32")
    y = tg.pow(a, b)
    codegen.fuse_elementwise(y)
    prog = tg.compile(y, db=":memory:", backends=("c",))
    A = np.arange(1, 6, dtype=np.int32)
    warm(prog, a=A, b=np.full(5, 2, np.int32))
    np.testing.assert_array_equal(prog(a=A, b=np.full(5, 3, np.int32)), A ** 3)
    assert prog.loop.startswith("native loop")
    with pytest.raises(tg.EvaluationError, match="negative"):
        prog(a=A, b=np.array([1, 2, -1, 1, 1], np.int32))
    np.testing.assert_array_equal(prog(a=A, b=np.full(5, 2, np.int32)), A ** 2)
    assert prog.loop.startswith("native loop")


def test_runner_source_covers_each_signature():
    sigs = (native.COPY, ("void", ("void *", "int64_t", "float")),
            ("int", ("void *", "int32_t", "double")))
    text = native.runner_source(sigs)
    assert "case 1: ((void (*)(void *, int64_t, float))" in text
    assert "case 2: if (((int (*)(void *, int32_t, double))" in text


def test_recorder_relocates_inputs_and_refuses_temporaries():
    from types import SimpleNamespace

    from tensor_graphs.kernels.c import lib

    exp = lib.func("elementwise", "tg_exp_f32", lib.P, lib.P, lib.I64)
    step = SimpleNamespace(kernel=SimpleNamespace(view=False, name="c_exp", backend="c"))
    arena, x = np.zeros(64, np.float32), np.ones(8, np.float32)
    rec = native.Recorder()
    rec.fixed(arena)
    rec.input(x)
    placed = arena[8:14]
    rec.wrap(exp)(lib.ptr(x[2:]), lib.ptr(placed), 6)
    rec.after(step, {}, [x], [x], placed, placed)
    assert rec.failure is None
    assert rec.relocs == [(("arg", 0, 0), 0, 8)]  # input 0, 8 bytes in: patched per call
    assert rec.records[0][2][1] == lib.ptr(arena) + 32  # fixed memory: an absolute address
    scratch = np.empty(6, np.float32)  # a temporary the kernel made: not replayable
    out = np.empty(6, np.float32)  # the kernel's own result buffer: kept by the recording
    rec.wrap(exp)(lib.ptr(x), lib.ptr(scratch), 6)
    rec.after(step, {}, [x], [x], out, out)
    assert "outside the program's memory" in rec.failure
    with pytest.raises(native.NotNativeError):
        rec.finish([out])


def test_an_output_a_c_kernel_makes_is_a_new_array_each_call_not_a_copy(monkeypatch):
    """Executable.own_outputs: a program output is made by its kernel in an array of its own
    (the native loop relocates it like an input), so a call hands it over without copying it
    out of the arena, and a later call writes a new one. Here a later step reads the first
    output too (through the relocated pointer)."""
    from tensor_graphs.runtime import values

    x, w = tg.input("x", (64, 32)), tg.weight("w", (32, 48))
    h = x @ w
    prog = tg.compile([h, tg.exp(h) * 0.5], db=":memory:")
    weight = RNG.standard_normal((32, 48)).astype(np.float32)
    prog.bind(w=weight)
    copies = []
    real_copy = values.copy
    monkeypatch.setattr(values, "copy", lambda v: copies.append(v.shape) or real_copy(v))
    feeds = [RNG.standard_normal((64, 32)).astype(np.float32) for _ in range(4)]
    got = [prog(x=f) for f in feeds]
    assert prog.loop.startswith("native loop"), prog.loop
    assert all(g[0].flags.owndata and g[0].base is None for g in got)
    for f, (hh, e) in zip(feeds, got):  # each call's result intact after the later ones
        ref = f.astype(np.float64) @ weight
        assert relative_error(hh, ref) <= 1e-5
        assert relative_error(e, np.exp(ref) * 0.5) <= 1e-5
    copies.clear()
    last = prog(x=feeds[0])
    assert prog.loop.startswith("native loop"), prog.loop
    assert prog._last.owned_results == {0, 1}  # noqa: SLF001
    assert copies == [] and last[0] is not got[0][0]
