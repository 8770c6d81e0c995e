"""nn composites (norms, linear, embedding, attention, rotary embedding) against the op table
(tests/ops/optable.py): float64 evaluation to 1e-9 and float32 evaluation to ~1e-5 (norm-wise
relative error) against an independent numpy oracle, the same against torch.nn.functional in a
separate test that skips alone without torch; fully atomic decompositions, symbolic dims and
bad inputs."""

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error as rel_err
from tests.ops import optable as ot

LAYER_NORM = ot.BY_NAME["layer_norm"].oracle
RMS_NORM = ot.BY_NAME["rms_norm"].oracle
SDPA = ot.BY_NAME["scaled_dot_product_attention"].oracle
ROTARY = ot.BY_NAME["rotary_embedding"].oracle


@pytest.mark.parametrize("row,dtype", ot.params("nn"))
def test_matches_oracle(row, dtype):
    ot.check_oracle(row, dtype)


@pytest.mark.parametrize("row,dtype", ot.params("nn", torch=True))
def test_matches_torch(row, dtype):
    torch = pytest.importorskip("torch")
    ot.check_torch(row, dtype, torch)


def randn(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float64)


# ---------------------------------------------------------------------------- layer_norm
def test_layer_norm_symbolic_seq():
    rng = np.random.default_rng(2)
    x = tg.input("x", ("batch", "seq", 16))
    w, b = tg.weight("w", (16,)), tg.weight("b", (16,))
    y = tg.layer_norm(x, w, b)
    assert y.shape == x.shape
    W, B = randn(rng, (16,)), randn(rng, (16,))
    for batch, seq in ((1, 1), (2, 7), (3, 33)):
        X = randn(rng, (batch, seq, 16))
        ot.check_graph(y, {"x": X, "w": W, "b": B}, LAYER_NORM(X, W, B, eps=1e-5))


def test_layer_norm_float16_computes_in_float32():
    x = tg.input("x", (2, 8), "float16")
    y = tg.layer_norm(x)
    assert y.dtype == tg.float16
    X = (np.arange(16).reshape(2, 8) * 1000.0).astype(np.float16)  # x*x overflows float16
    got = tg.evaluate(y, {"x": X})
    ref = LAYER_NORM(X.astype(np.float64))
    assert np.isfinite(got).all() and rel_err(got, ref) < 1e-3


def test_layer_norm_bad_input():
    x = tg.input("x", (3, 8))
    with pytest.raises(tg.ShapeError, match="layer_norm.*weight must have shape"):
        tg.layer_norm(x, tg.weight("w", (4,)))
    with pytest.raises(tg.ShapeError, match="at least one axis"):
        tg.layer_norm(tg.input("s", ()))


# ---------------------------------------------------------------------------- rms_norm
def test_rms_norm_float16_large():
    x = tg.input("x", (3, 8), "float16")
    y = tg.rms_norm(x, tg.weight("w", (8,), "float16"))
    assert y.dtype == tg.float16
    rng = np.random.default_rng(4)
    X, W = (randn(rng, (3, 8)) * 2000).astype(np.float16), randn(rng, (8,)).astype(np.float16)
    got = tg.evaluate(y, {"x": X, "w": W})
    ref = RMS_NORM(X.astype(np.float64), W.astype(np.float64), eps=1e-6)
    assert np.isfinite(got).all() and rel_err(got, ref) < 2e-3


def test_rms_norm_bad_input():
    with pytest.raises(tg.ShapeError, match="rms_norm.*weight must have shape"):
        tg.rms_norm(tg.input("x", (3, 8)), tg.weight("w", (8, 1)))


# ---------------------------------------------------------------------------- linear
def test_linear_bad_input():
    with pytest.raises(tg.ShapeError, match="in_features"):
        tg.linear(tg.input("x", (2, 8)), tg.weight("w", (8, 4)))  # (in, out) by mistake
    with pytest.raises(tg.ShapeError, match="bias"):
        tg.linear(tg.input("x", (2, 8)), tg.weight("w", (4, 8)), tg.weight("b", (8,)))


# ---------------------------------------------------------------------------- embedding
def test_embedding_bad_input():
    with pytest.raises(tg.DTypeError, match="embedding: ids must be integers"):
        tg.embedding(tg.input("ids", (3,)), tg.weight("t", (4, 2)))
    with pytest.raises(tg.ShapeError, match="2-D"):
        tg.embedding(tg.input("ids", (3,), "int64"), tg.weight("t", (4,)))
    y = tg.embedding(tg.input("ids", (2,), "int64"), tg.weight("t", (4, 2)))
    with pytest.raises(tg.EvaluationError, match="out of range"):
        tg.evaluate(y, {"ids": np.array([1, 4]), "t": np.zeros((4, 2), np.float32)})


# ---------------------------------------------------------------------------- attention
def _sdpa_case(rng, b, hq, hkv, sq, sk, d):
    shapes = dict(zip("qkv", ot.qkv_shapes(b, hq, hkv, sq, sk, d)))
    nodes = {name: tg.input(name, s) for name, s in shapes.items()}
    feeds = {name: randn(rng, s) for name, s in shapes.items()}
    return nodes, feeds


def test_sdpa_causal_is_top_left():
    """is_causal with Sq != Sk is tril(ones(Sq, Sk)), as torch documents."""
    rng = np.random.default_rng(9)
    for sq, sk in ((3, 7), (7, 3)):
        n, feeds = _sdpa_case(rng, 1, 2, 2, sq, sk, 4)
        causal = tg.evaluate(tg.scaled_dot_product_attention(n["q"], n["k"], n["v"],
                                                              is_causal=True), feeds, "float64")
        mask = tg.constant(np.tril(np.ones((sq, sk), bool)))
        masked = tg.evaluate(tg.scaled_dot_product_attention(n["q"], n["k"], n["v"], mask),
                             feeds, "float64")
        assert rel_err(causal, masked) <= 1e-12


def test_sdpa_fully_masked_rows_give_zero():
    rng = np.random.default_rng(11)
    n, feeds = _sdpa_case(rng, 1, 2, 1, 4, 5, 3)
    bool_mask = np.ones((4, 5), bool)
    bool_mask[2] = False
    float_mask = np.where(bool_mask, 0.0, -np.inf)
    for name, value, dtype in (("m", bool_mask, "bool"), ("mf", float_mask, "float32")):
        mask = tg.input(name, (4, 5), dtype)
        y = tg.scaled_dot_product_attention(n["q"], n["k"], n["v"], mask)
        got = tg.evaluate(y, {**feeds, name: value}, dtype="float64")
        assert np.isfinite(got).all() and (got[:, :, 2] == 0).all()
        assert rel_err(got, SDPA(feeds["q"], feeds["k"], feeds["v"], value)) <= 1e-9


def test_sdpa_symbolic_seq():
    rng = np.random.default_rng(14)
    q = tg.input("q", ("batch", 4, "seq", 8))
    k = tg.input("k", ("batch", 2, "seq", 8))
    v = tg.input("v", ("batch", 2, "seq", 8))
    y = tg.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert y.shape == q.shape
    for batch, seq in ((1, 1), (2, 7), (1, 33)):
        feeds = {"q": randn(rng, (batch, 4, seq, 8)), "k": randn(rng, (batch, 2, seq, 8)),
                 "v": randn(rng, (batch, 2, seq, 8))}
        ot.check_graph(y, feeds, SDPA(feeds["q"], feeds["k"], feeds["v"], is_causal=True))


def test_sdpa_symbolic_kv_length_with_mask():
    """Decode-style: one query against a cache of symbolic length with a padding mask."""
    rng = np.random.default_rng(15)
    q = tg.input("q", (1, 4, 1, 8))
    k = tg.input("k", (1, 1, "ctx", 8))
    v = tg.input("v", (1, 1, "ctx", 8))
    m = tg.input("m", (1, 1, 1, "ctx"), "bool")
    y = tg.scaled_dot_product_attention(q, k, v, m)
    feeds = {"q": randn(rng, (1, 4, 1, 8)), "k": randn(rng, (1, 1, 9, 8)),
             "v": randn(rng, (1, 1, 9, 8)), "m": rng.random((1, 1, 1, 9)) < 0.8}
    feeds["m"][..., 0] = True
    ot.check_graph(y, feeds, SDPA(feeds["q"], feeds["k"], feeds["v"], feeds["m"]))


def test_sdpa_gqa_does_not_copy_kv():
    n, _ = _sdpa_case(np.random.default_rng(0), 1, 8, 2, 3, 3, 4)
    y = tg.decompose(tg.scaled_dot_product_attention(n["q"], n["k"], n["v"]))
    ops = [x for x in tg.nodes(y) if x.op.name in ("expand", "concat", "gather")]
    assert not ops, ops


def test_sdpa_bad_input():
    q, k, v = tg.input("q", (1, 3, 4, 8)), tg.input("k", (1, 2, 4, 8)), tg.input("v", (1, 2, 4, 8))
    with pytest.raises(tg.ShapeError, match="multiple of the kv heads"):
        tg.scaled_dot_product_attention(q, k, v)
    q = tg.input("q2", (1, 4, 4, 8))
    with pytest.raises(tg.ShapeError, match="same head dim"):
        tg.scaled_dot_product_attention(q, tg.input("k2", (1, 2, 4, 6)), v)
    with pytest.raises(tg.ShapeError, match="same sequence length"):
        tg.scaled_dot_product_attention(q, k, tg.input("v2", (1, 2, 5, 8)))
    with pytest.raises(tg.ShapeError, match="attn_mask"):
        tg.scaled_dot_product_attention(q, k, v, tg.input("m", (4, 5), "bool"))
    with pytest.raises(tg.DTypeError, match="attn_mask must be bool"):
        tg.scaled_dot_product_attention(q, k, v, tg.input("mi", (4, 4), "int64"))
    with pytest.raises(tg.DTypeError, match="float tensor"):
        tg.scaled_dot_product_attention(tg.input("qi", (1, 4, 4, 8), "int64"), k, v)


# ---------------------------------------------------------------------------- rotary
def test_rotary_embedding_symbolic_seq():
    rng = np.random.default_rng(17)
    y = tg.rotary_embedding(tg.input("x", (1, 2, "seq", 8)), tg.input("cos", ("seq", 8)),
                            tg.input("sin", ("seq", 8)))
    for seq in (1, 7):
        cos, sin = ot.rope_angles(seq, 8)
        feeds = {"x": randn(rng, (1, 2, seq, 8)), "cos": cos, "sin": sin}
        ot.check_graph(y, feeds, ROTARY(feeds["x"], cos, sin))


def test_rotary_embedding_is_a_rotation():
    """Pairs (i, i + D/2) rotate by the angle: the norm of each pair is kept."""
    rng = np.random.default_rng(18)
    cos, sin = ot.rope_angles(5, 8)
    X = randn(rng, (5, 8))
    y = tg.rotary_embedding(tg.input("x", (5, 8)), tg.constant(cos), tg.constant(sin))
    got = tg.evaluate(y, {"x": X}, dtype="float64")
    pair_norm = lambda a: np.hypot(a[:, :4], a[:, 4:])  # noqa: E731
    np.testing.assert_allclose(pair_norm(got), pair_norm(X), rtol=1e-12)


def test_rotary_embedding_bad_input():
    with pytest.raises(tg.ShapeError, match="even"):
        tg.rotary_embedding(tg.input("x", (3, 7)), tg.input("c", (3, 7)), tg.input("s", (3, 7)))
    with pytest.raises(tg.ShapeError, match="full head dim"):
        tg.rotary_embedding(tg.input("x", (3, 8)), tg.input("c", (3, 4)), tg.input("s", (3, 4)))
    with pytest.raises(tg.ShapeError):
        tg.rotary_embedding(tg.input("x", (3, 8)), tg.input("c", (4, 8)), tg.input("s", (4, 8)))
