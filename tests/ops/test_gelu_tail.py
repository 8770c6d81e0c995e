"""gelu's erf form keeps Phi's far tail: the reference is x/2 erfc(-x / sqrt 2), not
x/2 (1 + erf(x / sqrt 2)), whose sum is exactly 0 in float64 from x ~ -8.3 while x Phi(x) is
a normal number down to x ~ -38. Every kernel is checked against that reference, the
verifier's ``tail`` case puts a gelu input there, and a kernel that computes the textbook
form fails it."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.graph import leaves
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import build
from tensor_graphs.kernels.verify import verify
from tensor_graphs.numerics import relative_error

TAIL = [-8.5, -9.0, -12.0, -20.0, -30.0, -37.0]


def _true_gelu(x: float) -> float:
    return 0.5 * x * math.erfc(-x / math.sqrt(2.0))


def test_float64_reference_keeps_the_tail():
    x = tg.input("x", (len(TAIL),), "float64")
    got = np.asarray(tg.evaluate(tg.gelu(x), {"x": np.array(TAIL)}, dtype="float64"))
    want = np.array([_true_gelu(v) for v in TAIL])
    assert (got < 0).all()  # 1 + erf gave exactly -0 at every one of these
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_float32_reference_keeps_the_tail():
    x = tg.input("x", (3,), "float32")
    v = np.array([-9.0, -11.0, -12.5], np.float32)
    got = np.asarray(tg.evaluate(tg.gelu(x), {"x": v}, dtype="float64"))
    np.testing.assert_allclose(got, [_true_gelu(float(t)) for t in v], rtol=1e-12)


def _textbook(x, approximate):
    """x/2 (1 + erf(x / sqrt 2)) in float64, rounded once: exact but for the cancellation."""
    erf = np.frompyfunc(math.erf, 1, 1)
    a = x.astype(np.float64)
    return (a * 0.5 * (1.0 + np.asarray(erf(a / math.sqrt(2.0)), np.float64))).astype(x.dtype)


def test_the_textbook_form_fails_the_tail_case():
    k = registry.unregistered("gelu", _textbook, backend="numpy", name="textbook_gelu",
                              dtypes=("float32", "float64"))
    report = verify(k, seed=3)
    assert not report.ok
    assert any("[tail x]" in f for f in report.failures), report.failures


@pytest.mark.parametrize("name", ["numpy_gelu", "c_gelu", "torch_gelu"])
def test_gelu_kernels_pass_their_tail_case(name):
    if name == "c_gelu" and not build.available():
        pytest.skip("no C compiler")
    if name == "torch_gelu":
        pytest.importorskip("torch")
    report = verify(name, seed=5)
    assert report.ok, report
    tail = [r for r in report.results if "[tail x]" in r.case]
    assert tail and all(r.ok for r in tail)


@pytest.mark.skipif(not build.available(), reason="no C compiler")
def test_generated_c_region_keeps_the_tail():
    """gelu inside a generated loop: its erfc is rendered (erfcf), not split out or dropped."""
    a, r = tg.input("a", (8, 16)), tg.input("r", (16,))
    y = tg.gelu(a) * 1.5 + r * 1e-20
    prog = tg.compile(y, db=":memory:")
    steps = [s for s in prog.plan.steps if getattr(s.kernel, "generated", False)]
    assert len(prog.plan.steps) == 1 and steps
    assert "erfc" in {n.op.name for n in steps[0].nodes}
    rng = np.random.default_rng(0)
    feeds = {"a": rng.uniform(-9.5, -8.5, (8, 16)).astype(np.float32),
             "r": rng.standard_normal(16).astype(np.float32)}
    ref = tg.evaluate(y, feeds, dtype="float64")
    got = np.asarray(prog(**feeds))
    assert relative_error(got, ref) <= 1e-4


def _quant_cases():
    """(name, kernel call, its float64 reference) for the int8, int8-dynamic and float16
    GEMMs with a gelu epilogue (quant.c, quant_dyn.c, quant_lowp.c): the product is ~1e-4
    and the bias puts every output in gelu's tail."""
    from tensor_graphs.kernels.c import quant as cq
    from tensor_graphs.kernels.c import quant_dyn as qd
    from tensor_graphs.kernels.c import quant_lowp as ql

    rng = np.random.default_rng(11)
    m, k, n = 3, 37, 21
    a = (rng.standard_normal((m, k)) * 1e-4).astype(np.float32)
    q = rng.integers(-127, 128, (k, n)).astype(np.int8)
    s = (rng.random((1, n)) * 0.02 + 1e-3).astype(np.float32)
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    bias = rng.uniform(-9.5, -8.5, n).astype(np.float32)
    A, Q, S = tg.input("a", a.shape), tg.input("q", q.shape, "int8"), tg.input("s", s.shape)
    W, B = tg.input("w", w.shape), tg.input("bias", bias.shape)
    feeds = {"a": a, "q": q, "s": s, "w": w, "bias": bias}

    def ref(y):
        used = {leaf.name for leaf in leaves(y)}
        return tg.evaluate(y, {k_: v for k_, v in feeds.items() if k_ in used},
                           dtype="float64")

    return [
        ("c_q8", lambda: cq.gemm(a, cq.pack(q), s, bias, "gelu"),
         lambda: ref(tg.gelu(A @ tg.dequantize(Q, S) + B))),
        ("c_q8d", lambda: qd.gemm(a, qd.pack(q), s, bias, "gelu"),
         lambda: ref(tg.gelu(tg.dynamic_quant(A) @ tg.dequantize(Q, S) + B))),
        ("c_f16", lambda: ql.gemm_f16(a, ql.pack_f16(w), bias, "gelu"),
         lambda: ref(tg.gelu(A @ tg.fp16_round(W) + B))),
    ]


@pytest.mark.skipif(not build.available(), reason="no C compiler")
@pytest.mark.parametrize("which", ["c_q8", "c_q8d", "c_f16"])
def test_quantized_gemm_gelu_keeps_the_tail(which):
    """The quant kernels once computed 1 + erf in double below -5 to match the old
    reference's zeros; against x/2 erfc(..) their float32 tg_gelu_erf is what matches."""
    name, call, reference = next(c for c in _quant_cases() if c[0] == which)
    got, want = np.asarray(call(), np.float64), np.asarray(reference())
    assert (want < 0).all() and (got < 0).all()
    assert relative_error(got, want) <= 1e-4, name
