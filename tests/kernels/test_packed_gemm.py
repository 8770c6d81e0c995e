"""The packed GEMM (kernels/c/gemm.c): the weight packed once per binding, A packed per call.

Kernel level: against the float64 reference at odd sizes, one row (decode), batched x, bias
and activations, strided and transposed weights (the packer reads strides), NaN/inf. Runtime:
the weight is packed once per binding (not per call), rebinding re-packs, the native loop
replays the calls with the packed buffer, a weight fed as an input is never packed, and
``prog.memory()`` counts the packed copy."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import build, gemm
from tensor_graphs.numerics import relative_error

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")
RNG = np.random.default_rng(11)
SIZES = [(1, 1, 1), (1, 768, 50), (7, 33, 9), (5, 1025, 33), (33, 7, 1025), (13, 300, 37),
         (6, 256, 16), (12, 512, 32), (145, 70, 17), (1, 3, 1025), (2, 300, 40), (4, 257, 31),
         (150, 1000, 50), (15, 40, 48), (11, 64, 31), (19, 520, 64)]
# row-panel edges of 1..7 rows (6 rows a panel, 8 with AVX-512), an MC block edge, K-block
# edges; 1..5 panels of 16 columns (AVX-512 takes them in pairs: odd counts leave one alone,
# a pair's second panel may be partial)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def ref_linear(x, w, b=None):
    y = x.astype(np.float64) @ w.astype(np.float64).T
    return y if b is None else y + b


@pytest.mark.parametrize("m,k,n", SIZES)
def test_matches_float64_reference(m, k, n):
    x, w, b = rand(m, k), rand(n, k), rand(n)
    got = gemm.gemm(x, gemm.pack(w, True), b, linear=True)
    assert got.shape == (m, n) and got.dtype == np.float32
    assert relative_error(got, ref_linear(x, w, b)) < 1e-6
    wt = np.ascontiguousarray(w.T)  # a @ b layout: (k, n)
    got = gemm.gemm(x, gemm.pack(wt, False))
    assert relative_error(got, ref_linear(x, w)) < 1e-6


def test_strided_and_transposed_weights_pack_without_a_copy():
    x = rand(9, 40)
    big = rand(50, 81)
    w = big[:, ::2][:, :40]  # (50, 40), strided along K
    assert not w.flags.c_contiguous
    np.testing.assert_allclose(gemm.gemm(x, gemm.pack(w, True), linear=True),
                               ref_linear(x, w), rtol=1e-4, atol=1e-4)
    # a (N, K) weight given as the transposed view of a (K, N) one, and the reverse
    wkn = rand(40, 23)
    np.testing.assert_allclose(gemm.gemm(x, gemm.pack(wkn.T, True), linear=True),
                               x.astype(np.float64) @ wkn, rtol=1e-4, atol=1e-4)
    wnk = rand(23, 40)
    np.testing.assert_allclose(gemm.gemm(x, gemm.pack(wnk.T, False)),
                               x.astype(np.float64) @ wnk.T, rtol=1e-4, atol=1e-4)


def test_packed_layout_header_and_padding():
    w = rand(7, 21)  # (K, N) = (7, 21): two panels, the second 5 wide
    p = gemm.pack(w, False)
    assert p.ctypes.data % 64 == 0
    assert gemm.packed_shape(p) == (7, 21)
    panels = p[gemm.HEADER:].reshape(2, 7, 16)
    np.testing.assert_array_equal(panels[0], w[:, :16])
    np.testing.assert_array_equal(panels[1, :, :5], w[:, 16:])
    assert not panels[1, :, 5:].any()
    assert p.size == gemm.packed_floats(7, 21)


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh"])
def test_bias_and_activation_epilogues(act):
    x, w, b = rand(2, 3, 50), rand(50, 70), rand(70)  # batched x: all rows in one product
    k = registry.get(f"c_packed_matmul_bias_{act}")
    got = k(x, w, b)
    y = x.astype(np.float64) @ w.astype(np.float64) + b
    torch_like = {"relu": lambda v: np.maximum(v, 0),
                  "gelu": lambda v: tg.evaluate(tg.gelu(tg.input("v", v.shape, "float64")),
                                                {"v": v}),
                  "gelu_tanh": lambda v: tg.evaluate(tg.gelu(tg.input("v", v.shape, "float64"),
                                                             approximate="tanh"), {"v": v})}
    assert relative_error(got, torch_like[act](y)) < 1e-5


@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("m,k,n", [(13, 1025, 40), (600, 70, 37), (530, 1100, 33)])
def test_epilogue_on_every_path(act, m, k, n):
    """The epilogue runs in registers on each tile's last K block: check it on the paths that
    reach it differently (K blocks accumulated first, the threads splitting M, partial
    column tiles), element by element against float64."""
    x, w, b = rand(m, k), rand(k, n), rand(n)
    got = gemm.gemm(x, gemm.pack(w, False), b, act=act)
    y = x.astype(np.float64) @ w.astype(np.float64) + b
    if act is not None:
        v = tg.input("v", y.shape, "float64")
        y = {"relu": lambda: np.maximum(y, 0),
             "gelu": lambda: tg.evaluate(tg.gelu(v), {"v": y}),
             "gelu_tanh": lambda: tg.evaluate(tg.gelu(v, approximate="tanh"), {"v": y})}[act]()
    assert relative_error(got, y) < 1e-6
    np.testing.assert_allclose(got, y, rtol=1e-4, atol=1e-3 * np.sqrt(k))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m,k,n", [(1, 300, 40), (13, 1025, 40), (600, 70, 37), (530, 1100, 33),
                                   (7, 33, 16)])
def test_residual_on_every_path(bias, m, k, n):
    """+ res as each tile is stored: one row (gemv), K blocks accumulated first, the threads
    splitting M, partial column tiles, full tiles; into a poisoned out= buffer."""
    x, w, b, res = rand(m, k), rand(k, n), rand(n), rand(m, n)
    out = np.full((m, n), np.nan, np.float32)
    got = gemm.gemm(x, gemm.pack(w, False), b if bias else None, out=out, res=res)
    assert got is out
    y = x.astype(np.float64) @ w.astype(np.float64) + (b if bias else 0) + res
    assert relative_error(got, y) < 1e-6
    np.testing.assert_allclose(got, y, rtol=1e-4, atol=1e-3 * np.sqrt(k))


def test_residual_kernels_match_their_patterns():
    """linear(x, w, b) + res over a batched x, and the where: res must not broadcast."""
    x, w, b, res = rand(2, 3, 50), rand(70, 50), rand(70), rand(2, 3, 70)
    k = registry.get("c_packed_linear_add")
    assert relative_error(k(x, w, b, res), ref_linear(x, w, b) + res) < 1e-6
    assert "the product's shape" in k.constraint_failure(
        [(2, 3, 50), (70, 50), (70,), (70,)], [tg.float32] * 4)
    assert registry.get("c_packed_linear_nobias_add").constraint_failure(
        [(2, 3, 50), (70, 50), (2, 3, 70)], [tg.float32] * 3) is None


def test_empty_inner_dimension_gives_bias_plus_residual():
    x, w, b, res = np.zeros((3, 0), np.float32), np.zeros((0, 5), np.float32), rand(5), rand(3, 5)
    np.testing.assert_array_equal(gemm.gemm(x, gemm.pack(w, False), b, res=res), b + res)


def test_nan_and_inf_propagate():
    x, w = rand(8, 20), rand(20, 33)
    x[3, 5] = np.nan
    w[7, 30] = np.inf
    got = gemm.gemm(x, gemm.pack(w, False))
    ref = x.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))


def test_empty_inner_dimension_gives_bias():
    x, w, b = np.zeros((3, 0), np.float32), np.zeros((0, 5), np.float32), rand(5)
    np.testing.assert_array_equal(gemm.gemm(x, gemm.pack(w, False), b),
                                  np.broadcast_to(b, (3, 5)))


def test_wrong_packed_shape_is_an_error():
    p = gemm.pack(rand(8, 5), False)
    with pytest.raises(ValueError):
        gemm.gemm(rand(3, 9), p)
    with pytest.raises(TypeError):
        gemm.packed_shape(rand(40))


def test_kernels_declare_their_prepared_weight():
    k = registry.get("c_packed_linear")
    assert set(k.prepare) == {"weight"}
    assert k.prepared_positions(3) == {1: k.prepare["weight"]}
    assert registry.get("c_packed_matmul").prepared_positions(2).keys() == {1}
    x, w, b = rand(4, 10), rand(6, 10), rand(6)  # Kernel.__call__ prepares per call
    assert relative_error(k(x, w, b), ref_linear(x, w, b)) < 1e-6
    with pytest.raises(tg.ArgumentError):
        registry.unregistered(lambda a, b: a @ b, lambda a, b: a @ b, prepare={"c": abs})


# ---------------------------------------------------------------------------- runtime
@pytest.fixture
def only_packed(monkeypatch):
    """Hide the OpenBLAS kernels, so the packed ones are the C candidates (restored after)."""
    for op, found in list(registry._BY_OP.items()):  # noqa: SLF001
        keep = [k for k in found if not k.name.startswith(("c_matmul", "c_linear"))]
        monkeypatch.setitem(registry._BY_OP, op, keep)  # noqa: SLF001


@pytest.fixture
def count_packs(monkeypatch):
    calls = []
    original = gemm.pack

    def counting(w, linear):
        calls.append(w.shape)
        return original(w, linear)

    monkeypatch.setattr(gemm, "pack", counting)
    return calls


def _gpt_like():
    x = tg.input("x", ("s", 48))
    w1, b1 = tg.weight("w1", (48, 96)), tg.weight("b1", (96,))
    w2 = tg.weight("w2", (40, 96))  # (out, in): linear
    h = tg.gelu(x @ w1 + b1, approximate="tanh")
    return tg.linear(h, w2), (w1, b1, w2)


def _reference(x, w1, b1, w2):
    y = tg.linear(tg.gelu(tg.input("x", x.shape, "float64") @ tg.constant(w1.astype(np.float64))
                          + tg.constant(b1.astype(np.float64)), approximate="tanh"),
                  tg.constant(w2.astype(np.float64)))
    return tg.evaluate(y, {"x": x.astype(np.float64)})


def test_runtime_packs_once_per_binding_and_rebinding_repacks(only_packed, count_packs):
    y, _ = _gpt_like()
    prog = tg.compile(y, db=":memory:", backends=("c",), bounds={"s": 16})
    names = [s.kernel.name for s in prog.plan.steps]
    assert any(n.startswith("c_packed_matmul_bias") for n in names), names
    assert "c_packed_linear_nobias" in names, names
    W = dict(w1=rand(48, 96), b1=rand(96), w2=rand(40, 96))
    prog.bind(**W)
    for s in (16, 5, 16, 1, 16):
        x = rand(s, 48)
        got = prog(x=x)
        assert relative_error(got, _reference(x, **W)) < 1e-5
    assert len(count_packs) == 2  # one per weight, once for the binding
    assert "native loop" in prog.loop, prog.loop
    before = prog.memory()["cpu"] if "cpu" in prog.memory() else sum(prog.memory().values())
    packed = 4 * (gemm.packed_floats(48, 96) + gemm.packed_floats(96, 40) + 32)
    weights = 4 * (48 * 96 + 96 + 40 * 96)
    assert before >= weights + packed
    W2 = dict(w1=rand(48, 96), b1=rand(96), w2=rand(40, 96))
    prog.bind(w2=W2["w2"])  # rebinding one weight: the prelude and packing run again
    x = rand(16, 48)
    want = _reference(x, W["w1"], W["b1"], W2["w2"])
    for _ in range(3):  # python loop, recording, native loop: all see the new weight
        assert relative_error(prog(x=x), want) < 1e-5
    assert len(count_packs) == 4
    assert "native loop" in prog.loop, prog.loop


def test_weights_fed_per_call_are_packed_per_call(only_packed, count_packs):
    y, _ = _gpt_like()
    prog = tg.compile(y, db=":memory:", backends=("c",), bounds={"s": 8})
    W = dict(w1=rand(48, 96), b1=rand(96), w2=rand(40, 96))
    x = rand(8, 48)
    for _ in range(2):
        assert relative_error(prog(x=x, **W), _reference(x, **W)) < 1e-5
    assert len(count_packs) == 4  # not cached: the call brings its own weights


def test_a_weight_that_is_an_input_is_never_packed(only_packed):
    x, w = tg.input("x", (8, 32)), tg.input("w", (32, 24))  # w varies per call
    prog = tg.compile(x @ w, db=":memory:", backends=("c", "numpy"))
    assert not any(s.kernel.name.startswith("c_packed") for s in prog.plan.steps)
    X, Wv = rand(8, 32), rand(32, 24)
    assert relative_error(prog(x=X, w=Wv), X.astype(np.float64) @ Wv) < 1e-5


def test_a_weight_computed_from_weights_is_packed_once(only_packed, count_packs, monkeypatch):
    for op in ("matmul", "linear"):  # numpy computes the transpose; only C multiplies
        monkeypatch.setitem(registry._BY_OP, op, [  # noqa: SLF001
            k for k in registry._BY_OP[op] if k.backend == "c"])  # noqa: SLF001
    x, w = tg.input("x", (8, 32)), tg.weight("w", (24, 32))
    y = x @ tg.transpose(w)  # a prelude value (or a rewrite to linear): static either way
    prog = tg.compile(y, db=":memory:", backends=("c", "numpy"))
    assert any(s.kernel.name.startswith("c_packed") for s in prog.plan.steps), prog.explain()
    Wv = rand(24, 32)
    prog.bind(w=Wv)
    for _ in range(3):
        X = rand(8, 32)
        assert relative_error(prog(x=X), X.astype(np.float64) @ Wv.T) < 1e-5
    assert len(count_packs) == 1


def test_planner_rule_static_value():
    from tensor_graphs.ir.graph import is_static

    x, w = tg.input("x", (4, 8)), tg.weight("w", (8, 3))
    assert is_static(w) and is_static(tg.transpose(w)) and is_static(w * 2.0)
    assert not is_static(x) and not is_static(x @ w)
    assert not is_static(tg.weight("v", ("n", 3)))  # depends on the call's dims


def test_profiler_measures_on_the_prepared_weight(count_packs):
    from tensor_graphs.planner.search import signature
    from tensor_graphs.profiler.measure import Call, measure

    x, w = tg.input("x", (16, 64)), tg.weight("w", (48, 64))
    node = tg.linear(x, w)
    k = registry.get("c_packed_linear_nobias")
    m = measure(Call(k, node, (x, w), {}, signature([x, w], node.attrs)), repeats=3)
    assert m.failure is None and m.error < 1e-6 and m.runs >= 1
    assert len(count_packs) == 1  # once, outside the timing


@pytest.mark.parametrize("name", sorted(k.name for k in registry.all()
                                        if k.name.startswith("c_packed_")))
def test_every_packed_kernel_passes_verification(name):
    """Each packed GEMM (epilogues and residual variants included) against its pattern's
    float64 reference on fresh random inputs, with poisoned out= buffers."""
    report = tg.kernels.verify(registry.get(name), seed=7)
    assert report.ok, report.summary()


@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx512f", "-mno-avx2", "-mno-fma")],
                         ids=["avx2", "portable"])
def test_other_instruction_sets_match(flags):
    """gemm.c without AVX-512 (6-row panels, one panel per micro-kernel call; the build here
    takes 8 rows and pairs of panels where the CPU has AVX-512), compiled with those flags and
    called directly on a weight packed by the main build: the packed layout is the same."""
    import ctypes

    from tensor_graphs.kernels.c import lib

    c = build.load_library("tg_gemm_test", lib.source("gemm"), flags)
    fn = c.tg_gemm_packed_f32
    fn.restype = ctypes.c_int
    for m, k, n in ((1, 37, 33), (7, 70, 50), (13, 600, 31), (530, 70, 37)):
        x, w, b, res = rand(m, k), rand(n, k), rand(n), rand(m, n)
        out = np.empty((m, n), np.float32)
        packed = gemm.pack(w, True)
        assert fn(*(ctypes.c_void_p(v.ctypes.data) if isinstance(v, np.ndarray) else v
                    for v in (x, ctypes.c_int64(k), packed, b, res, out, ctypes.c_int64(m),
                              ctypes.c_int64(n), ctypes.c_int64(k), ctypes.c_int(0)))) == 0
        assert relative_error(out, ref_linear(x, w, b) + res) < 1e-6
