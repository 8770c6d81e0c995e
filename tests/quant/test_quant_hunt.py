"""Quantization as users misuse it: each case here was accepted silently or failed unclearly.
A ``skip`` pattern naming no weight quantized the weight it was meant to keep float; a graph
quantized twice kept its first scheme under the second's name; ``h @ w.T`` (a tied LM head
written by hand) stayed float; a symbolic K under int4 failed inside a decomposition."""

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import ArgumentError
from tensor_graphs.ir.evaluate import evaluate
from tensor_graphs.ir.graph import nodes
from tensor_graphs.ir.ops.names import EMBEDDING, WEIGHT
from tensor_graphs.kernels.c import build
from tensor_graphs.numerics import relative_error
from tensor_graphs.rewrite.quantize import quantized_weights

SCHEMES = ["int8-weight", "int8-dynamic", "int4-weight", "bf16-weight", "fp16-weight"]


def _mlp():
    x = tg.input("x", (2, 8))
    return tg.linear(x, tg.weight("fc.weight", (6, 8))) @ tg.weight("proj", (6, 4))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_skip_pattern_matching_no_weight_is_refused_naming_it(scheme):
    with pytest.raises(ArgumentError) as info:
        tg.quantize(_mlp(), scheme, skip=["fc"])  # "fc.weight" meant
    msg = str(info.value)
    assert "'fc'" in msg and "'fc.weight'" in msg and "'proj'" in msg and scheme in msg
    assert quantized_weights(tg.quantize(_mlp(), scheme, skip=["fc.*"])) == ["proj"]


@pytest.mark.parametrize("second", SCHEMES)
def test_quantizing_a_quantized_graph_again_is_refused(second):
    once = tg.quantize(_mlp(), "int8-weight")
    with pytest.raises(ArgumentError, match="quantized already.*'fc.weight'"):
        tg.quantize(once, second)
    # a weight left float the first time may still take another scheme
    mixed = tg.quantize(tg.quantize(_mlp(), "int8-weight", skip=["proj"]), second)
    assert quantized_weights(mixed) == ["fc.weight", "proj"]


def test_a_graph_without_a_weight_product_is_refused():
    x = tg.input("x", (3, 2, 8))
    with pytest.raises(ArgumentError, match="nothing to quantize.*3-D"):
        tg.quantize(x @ tg.weight("experts", (3, 8, 4)), "int8-weight")


def test_bf16_weights_are_reported_quantized():
    assert quantized_weights(tg.quantize(_mlp(), "bf16-weight")) == ["fc.weight", "proj"]


def _reference(w_nk, x):
    """float64 numpy: x @ dequantize(quantize(w.T)), a scale per output channel (a row of
    the (N, K) weight)."""
    w = w_nk.astype(np.float64)
    m = np.abs(w).max(axis=1, keepdims=True)
    s = np.where(m == 0, 1.0, m / 127)
    return x.astype(np.float64) @ (np.clip(np.rint(w / s), -127, 127) * s).T


@pytest.mark.parametrize("spell", ["transpose", "T"])
def test_a_weight_read_transposed_is_quantized_as_a_linear(spell):
    x = tg.input("x", (2, 8))
    w = tg.weight("head", (5, 8))
    y = x @ (tg.transpose(w, 0, 1) if spell == "transpose" else w.T)
    q = tg.quantize(y, "int8-weight")
    assert quantized_weights(q) == ["head"]
    rng = np.random.default_rng(0)
    wv = rng.standard_normal((5, 8)).astype(np.float32)
    wv[2] = 0.0  # an all-zero channel: scale 1
    xv = rng.standard_normal((2, 8)).astype(np.float32)
    got = evaluate(q, {"x": xv, "head": wv}, dtype="float64")
    np.testing.assert_allclose(got, _reference(wv, xv), rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(not build.available(), reason="no C compiler")
@pytest.mark.parametrize("scheme", ["int8-weight", "int4-weight", "int8-dynamic"])
def test_a_tied_head_written_as_w_T_saves_and_loads_quantized(tmp_path, scheme):
    """Embedding gathers float rows of the table; the head ``h @ table.T`` reads it
    quantized, as a linear's (N, K) reading (its ``.q``/``.scale`` under the table's name)."""
    ids = tg.input("ids", (1, 3), "int64")
    table = tg.weight("wte", (11, 40))
    y = tg.embedding(ids, table) @ table.T
    q = tg.quantize(y, scheme)
    assert any(n.op.name == EMBEDDING and n.inputs[1].op.name == WEIGHT for n in nodes(q))
    assert quantized_weights(q) == ["wte"]
    rng = np.random.default_rng(1)
    wv = rng.standard_normal((11, 40)).astype(np.float32)
    iv = np.array([[1, 7, 10]])
    ref = evaluate(q, {"ids": iv, "wte": wv}, dtype="float64")
    assert relative_error(ref, evaluate(y, {"ids": iv, "wte": wv}, dtype="float64")) < 0.1
    path = str(tmp_path / "m.safetensors")
    assert tg.save_quantized(path, y, {"wte": wv}, scheme) == ["wte", "wte.q", "wte.scale"]
    loaded = tg.compile(tg.quantize(y, scheme, prequantized=True), db=":memory:")
    loaded.bind_safetensors(path, strict=True)
    assert relative_error(loaded(ids=iv), ref) < 1e-5


def test_int4_of_a_symbolic_k_is_refused_naming_the_weight():
    x = tg.input("x", (2, "K"))
    y = x @ tg.weight("w", ("K", 4))
    with pytest.raises(ArgumentError, match=r"'w'.*symbolic.*int4-weight"):
        tg.quantize(y, "int4-weight")
    with pytest.raises(ArgumentError, match=r"'w'.*symbolic.*prequantized"):
        tg.quantize(y, "int8-weight", prequantized=True)


def test_bf16_rounding_of_subnormal_weights_is_the_cast_not_nan():
    """float32 subnormal weights under bf16-weight: the rounding divided by an ulp down to
    2**-133 as a product with its reciprocal, which overflows float32, so every output of
    the product was NaN. It now equals torch's cast to bfloat16, bit for bit."""
    torch = pytest.importorskip("torch")
    w = np.array([1e-40, -3e-45, 1.4e-45, 2e-38, 1.1754944e-38, 3.3e-39, 0.5, -7.0],
                 np.float32)[:, None]
    want = torch.from_numpy(w).to(torch.bfloat16).float().numpy()
    got = evaluate(tg.bf16_round(tg.constant(w)), {})
    np.testing.assert_array_equal(got, want)
    x = tg.input("x", (2, 8))
    prog = tg.compile(tg.quantize(x @ tg.weight("w", (8, 1)), "bf16-weight"), db=":memory:")
    prog.bind(w=w)
    xv = np.ones((2, 8), np.float32)
    np.testing.assert_allclose(prog(x=xv), xv @ want, rtol=1e-6)
