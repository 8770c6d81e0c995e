"""fp16-weight and int4-weight: the composites' meaning (fp16_round equals a float16 cast;
int4's groups along K, zero groups, saturation, K not a multiple of the group), the C kernels
(kernels/c/quant_lowp.c) on every instruction path against the float64 reference of the
quantized graph, and the schemes end to end on a tiny GPT-2."""

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs import nn
from tensor_graphs.errors import ArgumentError, ShapeError
from tensor_graphs.ir.evaluate import evaluate
from tensor_graphs.ir.graph import leaves
from tensor_graphs.ir.ops.names import WEIGHT
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import build
from tensor_graphs.kernels.c import quant_lowp as ql
from tensor_graphs.kernels.verify import verify
from tensor_graphs.numerics import relative_error

needs_c = pytest.mark.skipif(not build.available(), reason="no C compiler")
PATHS = [name for name in ql.ISAS if not build.available() or ql.supported(name)]


def test_fp16_round_is_the_float16_cast_everywhere():
    """Normal, subnormal, underflowing, overflowing and rounding-boundary values: the graph's
    exact arithmetic equals numpy's cast to float16 (what the kernel stores)."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((61, 9)) * np.exp(rng.uniform(-30, 12, (61, 9)))).astype(
        np.float32)
    w[0, :6] = [65504, 65519.99, 65520, -7e4, 2.0 ** -24 * 0.5, 2.0 ** -24 * 1.5]
    w[1, :4] = [0.0, -0.0, 2.0 ** -14 * (1 - 2.0 ** -12), 1 + 2.0 ** -11]  # ties to even
    got = evaluate(tg.fp16_round(tg.input("w", w.shape)), {"w": w}, dtype="float64")
    with np.errstate(over="ignore"):
        want = w.astype(np.float16).astype(np.float64)
    assert np.array_equal(got, want)


def _int4(w, group_size):
    W = tg.input("w", w.shape)
    s = tg.int4_scale(W, group_size=group_size)
    q = tg.quantize_int4(W, s)
    return evaluate([s, q, tg.dequantize_int4(q, s)], {"w": w}, dtype="float64")


def test_int4_groups_zero_groups_and_saturation():
    """K = 67 with groups of 32: 3 groups of 23, 23 and 21 rows; an all-zero group gets scale
    1 and values 0 (8 stored); each group's largest |w| lands on +-7 exactly."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((67, 5))
    w[23:46, 2] = 0.0  # the middle group of column 2
    s, q, d = _int4(w.astype(np.float32), 32)
    assert s.shape == (3, 5) and q.dtype == np.uint8
    assert s[1, 2] == 1.0 and np.all(q[23:46, 2] == 8) and np.all(d[23:46, 2] == 0)
    w32 = w.astype(np.float32).astype(np.float64)
    for g, (lo, hi) in enumerate(((0, 23), (23, 46), (46, 67))):
        m = np.abs(w32[lo:hi]).max(axis=0)
        np.testing.assert_allclose(s[g], np.where(m > 0, m / 7, 1.0), rtol=1e-6)
        top = np.abs(w32[lo:hi]).argmax(axis=0) + lo
        vals = q[top, range(5)].astype(int) - 8
        assert set(np.abs(vals[m > 0])) == {7}
    assert q.min() >= 1 and q.max() <= 15  # -8 is never written
    err = np.abs(d - w32)
    assert np.all(err <= np.repeat(s, [23, 23, 21], axis=0) / 2 + 1e-12)  # half a step


def test_int4_shapes_are_refused_with_the_fix():
    with pytest.raises(ShapeError, match="groups"):
        tg.dequantize_int4(tg.input("q", (8, 3), "uint8"), tg.input("s", (9, 3)))
    with pytest.raises(ShapeError, match=r"\(ng, N\)"):
        tg.dequantize_int4(tg.input("q", (8, 3), "uint8"), tg.input("s", (2, 4)))
    with pytest.raises(ArgumentError, match="group_size"):
        tg.quantize(tg.input("a", (2, 8)) @ tg.weight("w", (8, 3)), "int4-weight",
                    group_size=0)
    for scheme in ("int8-weight", "fp16-weight", "bf16-weight"):  # no groups: not ignored
        with pytest.raises(ArgumentError, match=f"group_size is for.*{scheme} has none"):
            tg.quantize(tg.input("a", (2, 8)) @ tg.weight("w", (8, 3)), scheme,
                        group_size=16)


def _feeds(rng, m, k, n, ng):
    a = rng.standard_normal((m, k)).astype(np.float32)
    a[0] = 0.0 if m > 1 else a[0]  # a zero row
    w = rng.standard_normal((k, n)).astype(np.float32)
    q = rng.integers(0, 16, (k, n)).astype(np.uint8)  # -8 .. 7: a checkpoint may hold -8
    q[: max(k // 3, 1), 0] = 0  # saturated at -8
    s = (rng.random((ng, n)) * 0.1 + 1e-3).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    return a, w, q, s, bias, res


@needs_c
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("m,k,n,ng", [(1, 1, 1, 1), (1, 768, 80, 24), (1, 67, 31, 3),
                                      (3, 1025, 33, 9), (6, 31, 47, 2), (9, 7, 1025, 1)])
def test_kernels_match_the_quantized_reference_on_every_path(path, m, k, n, ng):
    rng = np.random.default_rng(m * 1000 + k + n)
    a, w, q, s, bias, res = _feeds(rng, m, k, n, ng)
    A, W, B, R = (tg.input("a", a.shape), tg.input("w", w.shape), tg.input("b", bias.shape),
                  tg.input("r", res.shape))
    Q, S = tg.input("q", q.shape, "uint8"), tg.input("s", s.shape)
    code = ql.ISAS[path]
    feeds = {"a": a, "w": w, "q": q, "s": s, "b": bias, "r": res}
    for y, got in (
            (A @ tg.fp16_round(W), lambda: ql.gemm_f16(a, ql.pack_f16(w), path=code)),
            (tg.gelu(A @ tg.fp16_round(W) + B) + R,
             lambda: ql.gemm_f16(a, ql.pack_f16(w), bias, "gelu", res=res, path=code)),
            (A @ tg.dequantize_int4(Q, S), lambda: ql.gemm_i4(a, ql.pack_i4(q), s, path=code)),
            (tg.relu(A @ tg.dequantize_int4(Q, S) + B) + R,
             lambda: ql.gemm_i4(a, q, s, bias, "relu", res=res, path=code))):
        used = {leaf.name for leaf in leaves(y)}
        ref = evaluate(y, {k: v for k, v in feeds.items() if k in used}, dtype="float64")
        assert relative_error(got(), ref) <= 1e-6, (path, m, k, n)


@needs_c
def test_a_forced_path_the_cpu_lacks_is_refused(monkeypatch):
    monkeypatch.setenv(ql.ENV, "sse9")
    with pytest.raises(ArgumentError, match="avx512, avx2, portable"):
        ql.isa()
    monkeypatch.setenv(ql.ENV, "portable")
    assert ql.isa_name() == "portable"


@needs_c
def test_packing_refuses_values_past_a_nibble():
    with pytest.raises(ArgumentError, match="0..15"):
        ql.pack_i4(np.full((4, 3), 16, np.uint8))
    with pytest.raises(ValueError, match="packed as"):
        ql.gemm_i4(np.ones((1, 5), np.float32), ql.pack_i4(np.zeros((4, 3), np.uint8)),
                   np.ones((1, 3), np.float32))


@needs_c
@pytest.mark.parametrize("name", ["c_f16_matmul", "c_f16_matmul_bias_gelu_tanh",
                                  "c_q4_matmul", "c_q4_matmul_bias_add"])
def test_the_verifier_admits_the_kernels(name):
    report = verify(registry.get(name))
    assert report.ok, report


@needs_c
@pytest.mark.parametrize("scheme,kernel,rough", [("fp16-weight", "c_f16_matmul", (1e-6, 2e-3)),
                                                 ("int4-weight", "c_q4_matmul", (1e-2, 0.5))])
def test_tiny_gpt2_end_to_end(scheme, kernel, rough):
    """The quantized program against the float64 reference of the quantized graph (the
    kernels' error), and that graph against the float model (the scheme's own error)."""
    cfg = nn.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=301, n_positions=32)
    y = nn.GPT2(cfg)(tg.input("input_ids", (1, 3), "int64"))
    q = tg.quantize(y, scheme)
    rng = np.random.default_rng(3)
    weights = {w.name: (rng.standard_normal(w.shape) * 0.2).astype(np.float32)
               for w in leaves(y) if w.op.name == WEIGHT}
    feeds = {"input_ids": rng.integers(0, 301, (1, 3))}
    ref = tg.evaluate(q, {**feeds, **weights}, dtype="float64")
    prog = tg.compile(q, db=":memory:")
    prog.bind(**weights)
    assert relative_error(prog(**feeds), ref) <= 1e-4
    float_ref = tg.evaluate(y, {**feeds, **weights}, dtype="float64")
    assert rough[0] < relative_error(ref, float_ref) < rough[1]
    assert f"[{scheme}" in prog.explain()
    assert kernel in prog.explain()


@needs_c
@pytest.mark.parametrize("path", PATHS)
def test_a_whole_program_under_each_forced_path(monkeypatch, path):
    """TG_LOWP_ISA is read at each call: the same bound program on every path matches the
    quantized graph's reference (fp16 and int4 products, a row and several)."""
    rng = np.random.default_rng(7)
    x = tg.input("x", ("rows", 72))
    y = tg.relu(x @ tg.weight("w1", (72, 40)) + tg.weight("b1", (40,))) @ tg.weight("w2",
                                                                                      (40, 9))
    weights = {"w1": rng.standard_normal((72, 40)).astype(np.float32),
               "b1": rng.standard_normal(40).astype(np.float32),
               "w2": rng.standard_normal((40, 9)).astype(np.float32)}
    for scheme, options in (("fp16-weight", {}), ("int4-weight", {"group_size": 24})):
        q = tg.quantize(y, scheme, **options)
        prog = tg.compile(q, db=":memory:", bounds={"rows": 8}).bind(**weights)
        assert any(k in prog.explain() for k in ("c_f16_matmul", "c_q4_matmul"))
        monkeypatch.setenv(ql.ENV, path)
        for rows in (1, 5):
            xv = rng.standard_normal((rows, 72)).astype(np.float32)
            ref = tg.evaluate(q, {"x": xv, **weights}, dtype="float64")
            assert relative_error(prog(x=xv), ref) <= 1e-5, (scheme, path, rows)
        monkeypatch.delenv(ql.ENV)
