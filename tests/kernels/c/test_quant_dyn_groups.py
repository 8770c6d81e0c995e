"""int8-dynamic with groups (issue 23's accuracy): ``dynamic_quant(a, group=G)`` (a scale per
G values of a row) times a weight with a scale per (G rows of K, column), the C kernels
``c_q8d_g32_*`` (and ``c_q8d_*`` with grouped weight scales) against the float64 reference
of that graph on every instruction path this CPU runs (``TG_INT8_ISA``)."""

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import ShapeError
from tensor_graphs.ir.dtypes import as_dtype
from tensor_graphs.ir.evaluate import evaluate
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import build
from tensor_graphs.kernels.c import quant_dyn as qd
from tensor_graphs.kernels.verify import verify
from tensor_graphs.numerics import relative_error

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")

PATHS = [name for name in qd.ISAS if build.available() and qd.supported(name)]


def _reference(a, q, s, group, bias=None, res=None, gelu=False):
    """The grouped graph in float64: dynamic_quant's and dequantize's decompositions."""
    A, Q, S = tg.input("a", a.shape), tg.input("q", q.shape, "int8"), tg.input("s", s.shape)
    y = tg.dynamic_quant(A, group=group) @ tg.dequantize(Q, S)
    feeds = {"a": a, "q": q, "s": s}
    if bias is not None:
        y = y + tg.input("bias", bias.shape)
        feeds["bias"] = bias
    if gelu:
        y = tg.gelu(y)
    if res is not None:
        y = y + tg.input("res", res.shape)
        feeds["res"] = res
    return evaluate(y, feeds, dtype="float64")


def _rows(rng, m, k):
    """Rows a per-row scale gets wrong: an outlier channel (x100), a zero group, a group at
    +1e3 with a small spread, and plain rows."""
    a = rng.standard_normal((m, k)).astype(np.float32)
    a[0, 3] *= 100.0
    if m > 1:
        a[1, :32] = 0.0
    if m > 2:
        a[2, 32:64] = 1e3 + rng.standard_normal(32)
    return a


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("m, k, n, group, ng", [
    (1, 32, 5, 32, 1), (7, 64, 40, 32, 2), (13, 128, 70, 32, 2), (6, 384, 100, 32, 12),
    (3, 96, 17, 0, 3), (20, 256, 130, 64, 8), (4, 128, 33, 128, 4)])
def test_grouped_gemm_matches_the_reference(path, m, k, n, group, ng):
    """Activation groups of 32/64/128 (0: the row) with weight scales per K / ng rows, bias,
    gelu and a residual, on each path."""
    rng = np.random.default_rng(m * k + n)
    a = _rows(rng, m, k)
    q = rng.integers(-127, 128, (k, n)).astype(np.int8)
    s = (rng.random((ng, n)) * 0.02 + 1e-3).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    ref = _reference(a, q, s, group, bias, res, gelu=True)
    got = qd.gemm(a, qd.pack(q), s, bias, "gelu", res=res, path=qd.ISAS[path], group=group)
    assert relative_error(got, ref) <= 1e-6, path


def test_groups_change_the_values_a_row_scale_gives():
    """The op computes what its name says: an outlier coarsens only its own group."""
    x = np.ones((1, 64), np.float32)
    x[0, 0] = 1000.0
    row = evaluate(tg.dynamic_quant(tg.input("x", x.shape)), {"x": x}, dtype="float64")
    grp = evaluate(tg.dynamic_quant(tg.input("x", x.shape), group=32), {"x": x},
                   dtype="float64")
    assert np.allclose(row[0, 1:], 0.0)  # 1 / (1000 / 127) rounds to 0
    assert np.allclose(grp[0, 32:], 1.0) and np.allclose(grp[0, 1:32], 0.0)
    with pytest.raises(ShapeError, match="group"):
        tg.dynamic_quant(tg.input("x", (2, 48)), group=32)
    with pytest.raises(ShapeError, match="divide"):
        tg.dequantize(tg.input("q", (48, 4), "int8"), tg.input("s", (5, 4)))


@pytest.mark.parametrize("path", PATHS)
def test_grouped_kernels_verify_on_each_path(path, monkeypatch):
    """tg.kernels.verify on fresh random inputs, with TG_INT8_ISA forcing the path."""
    from tensor_graphs.kernels.verify import clear_cache

    monkeypatch.setenv(qd.ENV, path)
    clear_cache()  # reports are cached per kernel, not per path
    for name in ("c_q8d_g32_matmul", "c_q8d_g32_matmul_bias", "c_q8d_g32_matmul_bias_gelu",
                 "c_q8d_g32_matmul_bias_add", "c_q8d_matmul"):
        report = verify(name)
        assert report.ok, (path, report)


def test_grouped_constraints():
    """The kernel takes weight groups that are multiples of 32 and nest with the
    activation's; others are refused by the constraint (and by the C call)."""
    where = registry.get("c_q8d_g32_matmul").where
    f, i = as_dtype("float32"), as_dtype("int8")
    assert where([(3, 128), (128, 4), (4, 4)], [f, i, f], {}) is True
    assert where([(3, 128), (128, 4), (1, 4)], [f, i, f], {}) is True
    assert "scale" in where([(3, 128), (128, 4), (3, 4)], [f, i, f], {})
    assert "groups" in registry.get("c_q8d_matmul").where(
        [(3, 96), (96, 4), (6, 4)], [f, i, f], {})  # weight groups of 16
    a = np.ones((2, 96), np.float32)
    with pytest.raises(ValueError, match="multiple of 32"):
        qd.gemm(a, qd.pack(np.ones((96, 4), np.int8)), np.ones((6, 4), np.float32))
