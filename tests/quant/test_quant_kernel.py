"""The C int8-weight GEMM (kernels/c/quant.c) against the float64 reference of the quantized
graph (``a @ dequantize(q, s)`` with its epilogues), on fresh random inputs: one row (decode)
to 8 rows, odd K and N (edge panels), packed once as the runtime does and unpacked."""

import numpy as np
import pytest

from tensor_graphs.ir import api as tg
from tensor_graphs.ir.dtypes import as_dtype
from tensor_graphs.ir.evaluate import evaluate
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import build
from tensor_graphs.kernels.c import quant as cq
from tensor_graphs.kernels.verify import verify
from tensor_graphs.numerics import relative_error

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")

ACTS = {None: lambda y: y, "relu": tg.relu, "gelu": lambda y: tg.gelu(y),
        "gelu_tanh": lambda y: tg.gelu(y, approximate="tanh")}


def _case(rng, m, k, n, lead=()):
    a = rng.standard_normal(lead + (m, k)).astype(np.float32)
    q = rng.integers(-127, 128, (k, n)).astype(np.int8)
    s = (rng.random((1, n)) * 0.02 + 1e-3).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal(lead + (m, n)).astype(np.float32)
    return a, q, s, bias, res


def _reference(a, q, s, bias=None, res=None, act=None):
    """The quantized graph evaluated in float64 (its semantics: dequantize's decomposition)."""
    A, Q, S = tg.input("a", a.shape), tg.input("q", q.shape, "int8"), tg.input("s", s.shape)
    y = A @ tg.dequantize(Q, S)
    feeds = {"a": a, "q": q, "s": s}
    if bias is not None:
        y = y + tg.input("bias", bias.shape)
        feeds["bias"] = bias
    y = ACTS[act](y)
    if res is not None:
        y = y + tg.input("res", res.shape)
        feeds["res"] = res
    return evaluate(y, feeds, dtype="float64")


@pytest.mark.parametrize("m", range(1, 9))
@pytest.mark.parametrize("k,n", [(1, 1), (7, 3), (33, 17), (129, 47), (771, 45)])
def test_q8_gemm_matches_the_quantized_reference(m, k, n):
    rng = np.random.default_rng(1000 * m + k + n)
    a, q, s, bias, res = _case(rng, m, k, n)
    packed = cq.pack(q)  # once, as the runtime's bind-time preparation
    ref = _reference(a, q, s)
    assert relative_error(cq.gemm(a, packed, s), ref) <= 1e-6
    assert relative_error(cq.gemm(a, q, s), ref) <= 1e-6  # unprepared: packed per call
    ref = _reference(a, q, s, bias, res)
    assert relative_error(cq.gemm(a, packed, s, bias, res=res), ref) <= 1e-6


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh"])
def test_q8_epilogues(act):
    rng = np.random.default_rng(7)
    for m, k, n in ((1, 65, 33), (5, 31, 70)):
        a, q, s, bias, _ = _case(rng, m, k, n)
        got = registry.get(f"c_q8_matmul_bias_{act}")(a, q, s, bias)
        assert relative_error(got, _reference(a, q, s, bias, act=act)) <= 1e-5


def test_q8_batched_rows_and_out():
    """Leading dims are rows; out= is written in place (the arena's contract)."""
    rng = np.random.default_rng(3)
    a, q, s, bias, res = _case(rng, 3, 41, 19, lead=(2,))
    out = np.full((2, 3, 19), np.nan, np.float32)
    got = registry.get("c_q8_matmul_bias_add")(a, q, s, bias, res, out=out)
    assert got is out
    assert relative_error(out, _reference(a, q, s, bias, res)) <= 1e-6


def test_q8_nan_propagates():
    rng = np.random.default_rng(4)
    a, q, s, _, _ = _case(rng, 2, 20, 18)
    a[1, 3] = np.nan
    got = cq.gemm(a, cq.pack(q), s)
    assert np.isnan(got[1]).all() and np.isfinite(got[0]).all()


def test_q8_wrong_packing_is_refused():
    rng = np.random.default_rng(5)
    a, q, s, _, _ = _case(rng, 1, 16, 8)
    with pytest.raises(ValueError, match="packed as"):
        cq.gemm(a[:, :8], cq.pack(q), s)  # K differs from the packed weight's


def test_q8_kernels_verify():
    for name in ("c_q8_matmul", "c_q8_matmul_bias", "c_q8_matmul_bias_gelu_tanh",
                 "c_q8_matmul_add", "c_q8_matmul_bias_add", "c_bf16_matmul",
                 "c_bf16_matmul_bias_gelu_tanh", "c_bf16_matmul_bias_add"):
        report = verify(name)
        assert report.ok, report


def test_q8_constraints_name_the_problem():
    where = registry.get("c_q8_matmul").where
    f, i = as_dtype("float32"), as_dtype("int8")
    assert where([(1, 8), (8, 4), (1, 4)], [f, i, f], {}) is True
    assert "scale" in where([(1, 8), (8, 4), (4,)], [f, i, f], {})
    assert "inner dims" in where([(1, 7), (8, 4), (1, 4)], [f, i, f], {})
    assert "int8" in where([(1, 8), (8, 4), (1, 4)], [f, f, f], {})


@pytest.mark.parametrize("m", [1, 2, 5, 8])
@pytest.mark.parametrize("k,n", [(1, 1), (33, 17), (771, 45)])
def test_bf16_gemm_matches_the_reference(m, k, n):
    """bf16-weight: a @ bf16_round(w), the weight stored as bfloat16 bits, against the float64
    reference of that graph (which rounds w to bfloat16 exactly as the packing does)."""
    rng = np.random.default_rng(10 * m + k + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias, res = (rng.standard_normal(n).astype(np.float32),
                 rng.standard_normal((m, n)).astype(np.float32))
    A, W = tg.input("a", a.shape), tg.input("w", w.shape)
    B, R = tg.input("bias", bias.shape), tg.input("res", res.shape)
    y = A @ tg.bf16_round(W)
    ref = evaluate(y + B + R, {"a": a, "w": w, "bias": bias, "res": res}, dtype="float64")
    assert relative_error(cq.gemm_bf16(a, cq.pack_bf16(w), bias, res=res), ref) <= 1e-6
    ref = evaluate(y, {"a": a, "w": w}, dtype="float64")
    assert relative_error(registry.get("c_bf16_matmul")(a, w), ref) <= 1e-6
    # the rounding is the graph's: the unrounded product is far off at this tolerance
    assert relative_error(a.astype(np.float64) @ w, ref) > 1e-4 or k * n < 64


@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx512f", "-mno-avx2", "-mno-fma")],
                         ids=["avx2", "portable"])
def test_other_instruction_sets_match(flags):
    """quant.c's AVX2 and portable paths (the build here takes AVX-512 where the CPU has it),
    compiled with those flags and called directly: int8 and bfloat16, one row and several."""
    import ctypes

    from tensor_graphs.kernels.c import lib

    c = build.load_library("tg_quant_test", lib.source("quant"), flags)
    q8 = c.tg_q8_gemm_f32
    bf = c.tg_bf16_gemm_f32
    for f in (q8, bf):
        f.restype = ctypes.c_int
    rng = np.random.default_rng(11)
    for m, k, n in ((1, 37, 33), (6, 70, 19)):
        a, q, s, bias, res = _case(rng, m, k, n)
        out = np.empty((m, n), np.float32)
        packed = cq.pack(q)
        assert q8(ctypes.c_void_p(a.ctypes.data), ctypes.c_int64(k),
                  ctypes.c_void_p(packed.ctypes.data), ctypes.c_void_p(s.ctypes.data),
                  ctypes.c_void_p(bias.ctypes.data), ctypes.c_void_p(res.ctypes.data),
                  ctypes.c_void_p(out.ctypes.data), ctypes.c_int64(m), ctypes.c_int64(n),
                  ctypes.c_int64(k), ctypes.c_int(3)) == 0
        assert relative_error(out, _reference(a, q, s, bias, res, act="gelu_tanh")) <= 1e-5
        w = rng.standard_normal((k, n)).astype(np.float32)
        packed = cq.pack_bf16(w)
        assert bf(ctypes.c_void_p(a.ctypes.data), ctypes.c_int64(k),
                  ctypes.c_void_p(packed.ctypes.data), None, None,
                  ctypes.c_void_p(out.ctypes.data), ctypes.c_int64(m), ctypes.c_int64(n),
                  ctypes.c_int64(k), ctypes.c_int(0)) == 0
        W = tg.input("w", w.shape)
        ref = evaluate(tg.input("a", a.shape) @ tg.bf16_round(W), {"a": a, "w": w},
                       dtype="float64")
        assert relative_error(out, ref) <= 1e-6
