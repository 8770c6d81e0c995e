"""GEMMs in the native loop fitted over dims (runtime/native_dims.py): a program whose GEMM
has rows that change every call (a prompt of any length) runs as one foreign call at rows it
was never sampled at, the generated epilogue GEMMs (c_gemm_ep_*) and the packed ones alike,
gemm.c's own branches on the rows (one thread under 262,144 flops, the threads splitting M
from 512 rows) taken per call; a GEMM whose wrapper branches on the rows is refused."""

import dataclasses

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import build
from tensor_graphs.numerics import relative_error
from tensor_graphs.runtime import native_dims

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")
RNG = np.random.default_rng(29)
K, N = 40, 56
SAMPLED = (4, 5, 6, 7)  # the calls after the prelude's (at 3 rows) record these
UNSAMPLED = (9, 600, 33, 2, 515, 128)  # 600 and 515: gemm.c's split-M path (>= 512 rows)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def scaled_silu():
    """sigmoid(h) * h * s + 0.25 of h = x @ w + b, s one value per row: an epilogue nobody
    hand-fused, so the plan's one step is a generated GEMM."""
    x, w, b = tg.input("x", ("s", K)), tg.weight("w", (K, N)), tg.weight("b", (N,))
    s = tg.input("scale", ("s", 1))
    h = x @ w + b
    return tg.sigmoid(h) * h * s + 0.25, {"w": rand(K, N), "b": rand(N)}, \
        lambda rows: {"x": rand(rows, K), "scale": rand(rows, 1)}


def reshaped_residual():
    """(s, K) @ W + b viewed as (1, s, N), tanh, scaled, plus a (1, s, N) residual: the
    operands' frames are resolved at each call's dims."""
    x, r = tg.input("x", ("s", K)), tg.input("r", (1, "s", N))
    w, b = tg.weight("w", (K, N)), tg.weight("b", (N,))
    h = tg.reshape(x @ w + b, (1, "s", N))
    return tg.tanh(h) * 0.5 + r, {"w": rand(K, N), "b": rand(N)}, \
        lambda rows: {"x": rand(rows, K), "r": rand(1, rows, N)}


def packed_residual():
    """linear(x, W, b) + x: c_packed_linear_add, the hand-written prefill GEMM with its
    residual."""
    x = tg.input("x", ("s", K))
    w, b = tg.weight("w", (K, K)), tg.weight("b", (K,))
    return tg.linear(x, w, b) + x, {"w": rand(K, K), "b": rand(K)}, \
        lambda rows: {"x": rand(rows, K)}


def compiled(graph):
    y, weights, feeds = graph()
    prog = tg.compile(y, db=":memory:", bounds={"s": 640})
    prog.bind(**weights)
    return prog, y, weights, feeds


def gemm_names(prog):
    return [s.kernel.name for s in prog.plan.steps
            if s.kernel.name.startswith(("c_gemm_ep_", "c_packed_"))]


def call(prog, y, weights, feeds):
    got = prog(**feeds)
    want = tg.evaluate(y, {**feeds, **weights}, dtype="float64")
    assert relative_error(got, want) <= 1e-5, prog.loop
    return got


@pytest.mark.parametrize("graph, prefix", [(scaled_silu, "c_gemm_ep_"),
                                           (reshaped_residual, "c_gemm_ep_"),
                                           (packed_residual, "c_packed_linear")])
def test_a_gemm_of_varying_rows_runs_as_one_foreign_call_at_rows_never_sampled(graph, prefix):
    prog, y, weights, feeds = compiled(graph)
    names = gemm_names(prog)
    assert names and all(n.startswith(prefix) for n in names), names
    assert all(s.kernel.view or s.kernel.name in names for s in prog.plan.steps)
    call(prog, y, weights, feeds(3))  # the prelude
    for rows in SAMPLED:
        call(prog, y, weights, feeds(rows))
        assert prog.loop.startswith("python"), prog.loop
    assert "fitted a native loop over dims" in prog.loop, prog.loop
    for rows in UNSAMPLED:
        got = call(prog, y, weights, feeds(rows))
        assert got.shape[-2] == rows
        assert prog.loop.endswith("in one foreign call (fitted over dims)"), (rows, prog.loop)
    assert prog.stats["native_runs"] == len(UNSAMPLED)


def test_a_gemm_whose_wrapper_branches_on_the_rows_is_refused():
    """The generated GEMM's function replaced by one that splits the rows into two C calls
    from 6 rows on (a split-M decided in Python): sampled at 4 to 7 rows, the calls differ, so
    no fit is made and every call keeps the Python loop, with its results."""
    prog, y, weights, feeds = compiled(scaled_silu)
    exe = prog._last  # noqa: SLF001
    (i,) = [i for i, ins in enumerate(exe.instructions)
            if ins.kernel is not None and ins.kernel.name.startswith("c_gemm_ep_")]
    ins = exe.instructions[i]

    def split(x, w, *others, out=None, _fn=ins.fn):
        if x.shape[0] < 6:
            return _fn(x, w, *others, out=out)
        rows, half = x.shape[0], x.shape[0] // 2
        for part in (slice(0, half), slice(half, rows)):  # per-row operands split too
            _fn(x[part], w, *(o[part] if o.shape[0] == rows else o for o in others),
                out=out[part])
        return out

    exe.instructions[i] = dataclasses.replace(ins, fn=split)
    for rows in (3, *SAMPLED, *UNSAMPLED):
        call(prog, y, weights, feeds(rows))
    assert "the C functions called differs between calls at different dims" in prog.loop, \
        prog.loop
    assert prog.stats["native_runs"] == 0


def test_every_kernel_the_table_names_is_registered():
    """A renamed kernel would leave its row behind, and its new name outside (refused)."""
    names = {k.name for k in registry.all()}
    assert set(native_dims.SYMBOLIC_KERNELS) <= names, \
        sorted(set(native_dims.SYMBOLIC_KERNELS) - names)
    made = ("c_fused_0", "c_row_0", "c_gemm_ep_0")  # kernels generated on demand, by prefix
    assert all(native_dims.follows_dims(n) for n in made)
    assert not native_dims.follows_dims("numpy_add")
