"""The native loop at dims it never recorded (runtime/native_dims.py): a decode step (one token
against a growing KV cache, its causal mask built per call) runs as one foreign call at every
cache length, equal to the Python loop; whatever cannot be fitted falls back with correct
results and says why."""

import dataclasses
import math

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.shapes import as_dim
from tensor_graphs.kernels.c import build, lib
from tensor_graphs.numerics import relative_error
from tensor_graphs.runtime import native, native_dims

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")
RNG = np.random.default_rng(23)
H, D, VOCAB, MAX = 2, 8, 50, 48


def decode_graph(extra=False):
    """One token (an id) against a KV cache of length ``past``: embedding, q/k/v, append to
    the cache, causal mask (iota, less, where) and attention, then a softmax; ``extra``: one
    more output over an input of symbolic length ``m`` (a second dim, which stays pinned)."""
    ids = tg.input("ids", (1, 1), "int64")
    table = tg.weight("table", (VOCAB, H * D))
    wq, wk, wv = (tg.weight(n, (H * D, H * D)) for n in ("wq", "wk", "wv"))
    x = tg.embedding(ids, table)

    def heads(y):
        return tg.reshape(y, (1, 1, H, D)).permute(0, 2, 1, 3)

    caches = [tg.state(n, (1, H, "past", D)) for n in ("k", "v")]
    k, v = (tg.state_update(c, heads(x @ w), offset="past", axis=2)
            for c, w in zip(caches, (wk, wv)))
    total = as_dim("past") + 1
    row = tg.reshape(tg.size("past"), (1, 1))
    col = tg.reshape(tg.iota(total), (1, total))
    mask = tg.where(tg.less(row, col), tg.constant(-math.inf, "float32"),
                    tg.constant(0.0, "float32"))
    o = tg.scaled_dot_product_attention(heads(x @ wq), k, v, mask)
    y = tg.softmax(tg.reshape(o.permute(0, 2, 1, 3), (1, 1, H * D)))
    outs = [y, k, v]
    if extra:
        z = tg.input("z", ("m",))
        outs.append(z * z)
    return outs


def weights():
    w = {n: (RNG.standard_normal((H * D, H * D)) / 3).astype(np.float32)
         for n in ("wq", "wk", "wv")}
    w["table"] = RNG.standard_normal((VOCAB, H * D)).astype(np.float32)
    return w


def compile_decode(extra=False, **kw):
    outs = decode_graph(extra)
    bounds = {"past": MAX - 1, **({"m": 16} if extra else {})}
    prog = tg.compile(outs, db=":memory:", bounds=bounds, **kw)
    return prog, outs


def start(prog, length):
    cache = {n: RNG.standard_normal((1, H, length, D)).astype(np.float32) for n in ("k", "v")}
    prog.bind(**cache)
    return cache


def step(prog, outs, w, cache, feeds):
    """One call, checked against the float64 reference; returns the new cache."""
    got = prog(**feeds)
    ref = tg.evaluate(outs, {**feeds, **w, **cache}, dtype="float64")
    assert relative_error(got[0], ref[0]) <= 1e-5
    for name, g, r in (("k", got[1], ref[1]), ("v", got[2], ref[2])):  # the appended caches
        np.testing.assert_array_equal(g[:, :, :-1], cache[name])
        assert relative_error(g, r) <= 1e-6
    for g, r in zip(got[3:], ref[3:]):
        assert relative_error(g, r) <= 1e-6
    return {"k": np.array(got[1]), "v": np.array(got[2])}, got


def test_decode_runs_natively_at_every_length_and_equals_the_python_loop():
    prog, outs = compile_decode()
    twin, _ = compile_decode()
    steps = {s.kernel.name for s in prog.plan.steps}
    assert not {"numpy_iota", "numpy_less", "numpy_where"} & steps, steps
    w = weights()
    prog.bind(**w)
    twin.bind(**w)
    twin.native = False
    cache = start(prog, 3)
    twin.bind(**cache)
    loops = []
    for _ in range(24):
        ids = RNG.integers(0, VOCAB, (1, 1))
        new, got = step(prog, outs, w, cache, {"ids": ids})
        expected = twin(ids=ids)
        # the same C calls; bit for bit but for the thread count a GEMM takes (under load the
        # C kernels run on the calling thread alone: another summation order)
        for g, e in zip(got, expected):
            assert relative_error(g, e) <= 1e-6
        cache = new
        loops.append(prog.loop)
    assert prog.state("k").shape == (1, H, 27, D)
    # the prelude, then 4 samples at distinct lengths; every later step is one foreign call
    assert all(lp.startswith("python") for lp in loops[:5])
    assert "fitted a native loop over dims" in loops[4]
    assert all(lp.endswith("in one foreign call (fitted over dims)") for lp in loops[5:]), loops
    assert prog.stats["native_runs"] == 19
    before = native.counters()
    step(prog, outs, w, cache, {"ids": RNG.integers(0, VOCAB, (1, 1))})
    assert native.counters()["runs"] - before["runs"] == 1


def test_a_new_prompt_reuses_the_fit_and_extents_below_two_run_in_python():
    prog, outs = compile_decode()
    w = weights()
    prog.bind(**w)
    for length in (5, 17, 0, 2):  # prompts of several lengths, the same cache buffers
        cache = start(prog, length)
        for _ in range(6):
            cache, _ = step(prog, outs, w, cache, {"ids": RNG.integers(0, VOCAB, (1, 1))})
            past = cache["k"].shape[2] - 1
            python = past < 2 or (length == 5 and past < 10)
            assert prog.loop.startswith("python" if python else "native"), (past, prog.loop)
    # the first prompt: the prelude, 4 samples, 1 native step; then every step but those at
    # past = 0 and 1 (a one-key mask, a one-token cache: extents below 2)
    assert prog.stats["native_runs"] == 1 + 6 + 4 + 6


def test_weights_bound_again_fit_again():
    prog, outs = compile_decode()
    for _ in range(2):
        w = weights()
        prog.bind(**w)
        cache = start(prog, 4)
        for _ in range(7):
            cache, _ = step(prog, outs, w, cache, {"ids": RNG.integers(0, VOCAB, (1, 1))})
        assert prog.loop.endswith("(fitted over dims)"), prog.loop
    assert prog.stats["native_runs"] == 2 * 2


def test_a_dim_that_never_varied_is_pinned():
    prog, outs = compile_decode(extra=True)
    w = weights()
    prog.bind(**w)
    cache = start(prog, 2)
    for i in range(12):
        m = 9 if i != 8 else 11
        feeds = {"ids": RNG.integers(0, VOCAB, (1, 1)),
                 "z": RNG.standard_normal(m).astype(np.float32)}
        cache, got = step(prog, outs, w, cache, feeds)
        assert got[3].shape == (m,)
        native_now = prog.loop.startswith("native")
        assert native_now == (i >= 5 and i != 8), (i, prog.loop)
        if i == 8:
            assert "dims outside those the native loop was fitted over" in prog.loop


def test_a_bad_id_is_refused_and_the_loop_goes_on():
    prog, outs = compile_decode()
    w = weights()
    prog.bind(**w)
    cache = start(prog, 3)
    for _ in range(6):
        cache, _ = step(prog, outs, w, cache, {"ids": RNG.integers(0, VOCAB, (1, 1))})
    assert prog.loop.endswith("(fitted over dims)")
    before = {n: np.array(prog.state(n)) for n in ("k", "v")}
    with pytest.raises(tg.EvaluationError, match=f"'ids' holds {VOCAB + 3} at"):
        prog(ids=np.array([[VOCAB + 3]]))
    cache = {n: np.array(prog.state(n)) for n in ("k", "v")}  # as the failed call left it
    for n in ("k", "v"):  # refused before any step: the caches are untouched
        np.testing.assert_array_equal(cache[n], before[n])
    cache, _ = step(prog, outs, w, cache, {"ids": RNG.integers(0, VOCAB, (1, 1))})
    assert prog.loop.endswith("(fitted over dims)")


def test_a_kernel_not_known_to_follow_the_dims_keeps_the_python_loop(monkeypatch):
    """c_matmul taken out of the table: a kernel nobody audited (every C kernel is now)."""
    kv = tg.state("kv", ("past", 4))
    x = tg.input("x", (1, 4))
    wt = tg.weight("w", (4, 3))
    new = tg.state_update(kv, x, offset="past", axis=0)
    outs = [tg.softmax(new @ wt), new]  # a GEMM of past + 1 rows: c_matmul
    prog = tg.compile(outs, db=":memory:", bounds={"past": 16})
    assert "c_matmul" in {s.kernel.name for s in prog.plan.steps}
    monkeypatch.delitem(native_dims.SYMBOLIC_KERNELS, "c_matmul")
    W = RNG.standard_normal((4, 3)).astype(np.float32)
    prog.bind(w=W, kv=np.zeros((1, 4), np.float32))
    rows = [np.zeros((1, 4), np.float32)]
    for _ in range(8):
        X = RNG.standard_normal((1, 4)).astype(np.float32)
        ref = tg.evaluate(outs, {"x": X, "w": W, "kv": np.concatenate(rows)}, dtype="float64")
        probs, _ = prog(x=X)
        rows.append(X)
        assert relative_error(probs, ref[0]) <= 1e-5
    assert "not known to follow them (native_dims.SYMBOLIC_KERNELS)" in prog.loop, prog.loop
    assert prog.stats["native_runs"] == 0


def test_an_argument_that_is_no_polynomial_of_the_dims_is_refused():
    """A kernel listed as following the dims whose C call gets a length rounded down to a
    multiple of 4: the samples disagree with any line, so the fit is refused, results stay
    right (this is what VALIDATE is for)."""
    prog, outs = compile_decode()
    exe = prog._last  # noqa: SLF001
    def rounding_iota(length, dtype, *, out=None, _fn=None):
        out = _fn(length, dtype, out=out)
        lib.func("pointwise", "tg_iota_i64", lib.P, lib.I64)(lib.ptr(out), length // 4 * 4)
        return out

    found = [i for i, ins in enumerate(exe.instructions) if ins.name == "c_iota"]
    assert found
    for i in found:
        ins = exe.instructions[i]
        exe.instructions[i] = dataclasses.replace(
            ins, fn=lambda *a, _fn=ins.fn, **kw: rounding_iota(*a, _fn=_fn, **kw))
    w = weights()
    prog.bind(**w)
    cache = start(prog, 4)  # sampled at past + 1 = 6, 7, 8, 9: rounded 4, 4, 8, 8
    for _ in range(10):
        cache, _ = step(prog, outs, w, cache, {"ids": RNG.integers(0, VOCAB, (1, 1))})
    assert "not a polynomial of the dims" in prog.loop, prog.loop
    assert prog.stats["native_runs"] == 0


def test_fit_of_two_dims_is_multilinear():
    """The solver fits c0 + c1*a + c2*b + c3*a*b exactly (a size of (a, b) elements) and
    refuses a square."""
    values = [(2, 3), (4, 3), (2, 5), (7, 6), (3, 9), (5, 4)]

    class S:
        def __init__(self, v):
            self.values = v

    basis = native_dims._Basis([S(v) for v in values], ("a", "b"))  # noqa: SLF001
    assert basis.ready
    assert basis.solve([7 + 3 * a * b for a, b in values], str) == (7, 0, 0, 3)
    assert basis.solve([5 for _ in values], str) == 5
    with pytest.raises(native.NotNativeError, match="polynomial"):
        basis.solve([a * a for a, _ in values], lambda: "a square")
