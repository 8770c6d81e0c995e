"""``tg.quantize(g, "int8-dynamic")`` writes groups into the graph (issue 23's accuracy): the
activation ``dynamic_quant(a, group=32)`` and the weight's scale per (32 rows of K, column),
where 32 divides K; a scale per row and per column where it does not. The compiled program
runs the grouped C kernels and equals the graph's float64 reference; prequantized files hold
the grouped scales."""

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.graph import nodes
from tensor_graphs.ir.ops.names import DEQUANTIZE, DYNAMIC_QUANT
from tensor_graphs.kernels.c import build
from tensor_graphs.numerics import relative_error
from tensor_graphs.rewrite.quantize import prequantized_weights

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")


def _model(k: int):
    x = tg.input("x", (5, k))
    h = tg.linear(x, tg.weight("fc.weight", (64, k)), tg.weight("fc.bias", (64,)))
    return tg.gelu(h) @ tg.weight("proj", (64, 24))


def _weights(rng, k: int):
    w = {"fc.weight": rng.standard_normal((64, k)).astype(np.float32),
         "fc.bias": rng.standard_normal(64).astype(np.float32),
         "proj": rng.standard_normal((64, 24)).astype(np.float32)}
    w["fc.weight"][:, 5] *= 50.0  # an outlier input channel of the weight
    return w


def _groups(y):
    """(dynamic_quant groups, dequantize scale shapes) of a quantized graph."""
    ns = nodes([y])
    return (sorted(n.attrs["group"] for n in ns if n.op.name == DYNAMIC_QUANT),
            sorted(tuple(n.inputs[1].shape) for n in ns if n.op.name == DEQUANTIZE
                   and n.inputs[0].dtype.name == "int8"))


@pytest.mark.parametrize("k, group_size, want", [
    (96, None, ([32, 32], [(2, 24), (3, 64)])),   # groups of 32 along both K
    (48, None, ([0, 32], [(1, 64), (2, 24)])),    # 32 does not divide 48: per row / column
    (96, 64, ([0, 0], [(1, 24), (1, 64)])),       # 64 divides neither 96 nor... 64 = K
])
def test_the_rewrite_writes_the_groups(k, group_size, want):
    y = tg.quantize(_model(k), "int8-dynamic", group_size=group_size)
    assert _groups(y) == want


@pytest.mark.parametrize("k", [96, 48])
def test_the_program_runs_grouped_kernels_and_equals_its_reference(k):
    rng = np.random.default_rng(k)
    weights = _weights(rng, k)
    y = tg.quantize(_model(k), "int8-dynamic")
    prog = tg.compile(y, db=":memory:", profile="never").bind(**weights)
    x = rng.standard_normal((5, k)).astype(np.float32)
    x[:, 7] *= 40.0  # an outlier activation channel
    got = prog(x=x)
    ref = tg.evaluate(y, {"x": x, **weights}, dtype="float64")
    assert relative_error(got, ref) <= 1e-5
    used = [s.kernel.name for s in prog.plan.steps]
    # proj (K = 64) is grouped either way; fc is grouped at K = 96, per row at K = 48
    assert any(n.startswith("c_q8d_g32_matmul") for n in used), used
    assert any(n.startswith("c_q8d_matmul") for n in used) == (k == 48), used


def test_groups_keep_an_outlier_channel_from_coarsening_the_row():
    """One activation channel x40: a scale per row rounds the rest of the row to a few
    steps; a scale per 32 values only its own group's (a quarter of the row)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 128)).astype(np.float32)
    x[:, 7] *= 40.0
    w = rng.standard_normal((128, 32)).astype(np.float32)
    w[7] = 0.0  # the outlier's own product exact: what is left is the rounding of the rest
    y = tg.input("x", x.shape) @ tg.weight("w", w.shape)
    exact = tg.evaluate(y, {"x": x, "w": w}, dtype="float64")

    def err(group_size):
        q = tg.quantize(y, "int8-dynamic", group_size=group_size)
        return relative_error(tg.evaluate(q, {"x": x, "w": w}, dtype="float64"), exact)

    # the outlier's group keeps the row's coarse steps: 32 of 128 values, sqrt(1/4) of the error
    assert err(None) < 0.6 * err(10 ** 6)


def test_prequantized_files_hold_grouped_scales(tmp_path):
    rng = np.random.default_rng(1)
    y, weights = _model(96), _weights(rng, 96)
    stored = prequantized_weights(y, weights, "int8-dynamic")
    assert stored["fc.weight.scale"].shape == (64, 3) and stored["proj.scale"].shape == (2, 24)
    prog = tg.compile(tg.quantize(y, "int8-dynamic", prequantized=True), db=":memory:",
                      profile="never").bind(**stored, **{"fc.bias": weights["fc.bias"]})
    ref = tg.compile(tg.quantize(_model(96), "int8-dynamic"), db=":memory:",
                     profile="never").bind(**weights)
    x = rng.standard_normal((5, 96)).astype(np.float32)
    assert relative_error(prog(x=x), ref(x=x)) <= 1e-6
