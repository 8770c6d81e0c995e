"""nn composites (norms, linear, embedding, attention, rotary embedding) against
torch.nn.functional: float64 evaluation to 1e-9 and float32 evaluation to ~1e-5 (norm-wise
relative error), fully atomic decompositions, symbolic dims and bad inputs."""

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error as rel_err

torch = pytest.importorskip("torch")
F = torch.nn.functional




def t(a):
    return torch.from_numpy(np.array(a))  # a copy, 0-d kept 0-d


def check(y, feeds: dict, torch_fn, tol32: float = 1e-5):
    """y in float64 vs torch float64 (1e-9) and in float32 vs torch float32 (tol32)."""
    got64 = tg.evaluate(y, feeds, dtype="float64")
    args64 = {k: t(v if v.dtype.kind != "f" else v.astype(np.float64)) for k, v in feeds.items()}
    ref64 = torch_fn(**args64).numpy()
    assert np.isfinite(ref64).all()
    assert rel_err(got64, ref64) <= 1e-9
    feeds32 = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in feeds.items()}
    got32 = tg.evaluate(y, feeds32)
    assert got32.dtype == np.float32
    ref32 = torch_fn(**{k: t(v) for k, v in feeds32.items()}).numpy()
    assert rel_err(got32, ref32) <= tol32
    assert_atomic(y)
    return got64


def assert_atomic(y):
    bad = {n.op.name for n in tg.nodes(tg.decompose(y)) if not n.op.is_atomic}
    assert not bad, f"decomposition still holds composites {bad}"


def randn(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float64)


# ---------------------------------------------------------------------------- layer_norm
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 33), (2, 5, 7), (4, 1)])
@pytest.mark.parametrize("params", ["none", "weight", "both"])
def test_layer_norm(shape, params):
    rng = np.random.default_rng(0)
    d = shape[-1]
    x = tg.input("x", shape)
    feeds = {"x": randn(rng, shape)}
    w = b = None
    if params in ("weight", "both"):
        w = tg.weight("w", (d,))
        feeds["w"] = randn(rng, (d,))
    if params == "both":
        b = tg.weight("b", (d,))
        feeds["b"] = randn(rng, (d,))
    y = tg.layer_norm(x, w, b, eps=1e-5)
    check(y, feeds, lambda x, w=None, b=None: F.layer_norm(x, (d,), w, b, eps=1e-5))


@pytest.mark.parametrize("scale", [1e-3, 1e6])
def test_layer_norm_magnitudes(scale):
    rng = np.random.default_rng(1)
    x = tg.input("x", (4, 33))
    feeds = {"x": randn(rng, (4, 33), scale) + 3 * scale}
    check(tg.layer_norm(x, eps=1e-12), feeds,
          lambda x: F.layer_norm(x, (33,), eps=1e-12), tol32=1e-4)


def test_layer_norm_symbolic_seq():
    rng = np.random.default_rng(2)
    x = tg.input("x", ("batch", "seq", 16))
    w, b = tg.weight("w", (16,)), tg.weight("b", (16,))
    y = tg.layer_norm(x, w, b)
    assert y.shape == x.shape
    W, B = randn(rng, (16,)), randn(rng, (16,))
    for batch, seq in ((1, 1), (2, 7), (3, 33)):
        X = randn(rng, (batch, seq, 16))
        got = tg.evaluate(y, {"x": X, "w": W, "b": B}, dtype="float64")
        ref = F.layer_norm(t(X), (16,), t(W), t(B), eps=1e-5).numpy()
        assert rel_err(got, ref) <= 1e-9


def test_layer_norm_float16_computes_in_float32():
    x = tg.input("x", (2, 8), "float16")
    y = tg.layer_norm(x)
    assert y.dtype == tg.float16
    X = (np.arange(16).reshape(2, 8) * 1000.0).astype(np.float16)  # x*x overflows float16
    got = tg.evaluate(y, {"x": X})
    ref = F.layer_norm(t(X).float(), (8,)).numpy()
    assert np.isfinite(got).all() and rel_err(got, ref) < 1e-3


def test_layer_norm_bad_input():
    x = tg.input("x", (3, 8))
    with pytest.raises(tg.ShapeError, match="layer_norm.*weight must have shape"):
        tg.layer_norm(x, tg.weight("w", (4,)))
    with pytest.raises(tg.ShapeError, match="at least one axis"):
        tg.layer_norm(tg.input("s", ()))


# ---------------------------------------------------------------------------- rms_norm
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 33), (2, 5, 7)])
@pytest.mark.parametrize("with_weight", [False, True])
@pytest.mark.parametrize("scale", [1.0, 1e15])
def test_rms_norm(shape, with_weight, scale):
    rng = np.random.default_rng(3)
    d = shape[-1]
    x = tg.input("x", shape)
    feeds = {"x": randn(rng, shape, scale)}
    w = None
    if with_weight:
        w = tg.weight("w", (d,))
        feeds["w"] = randn(rng, (d,))
    y = tg.rms_norm(x, w, eps=1e-6)
    check(y, feeds, lambda x, w=None: F.rms_norm(x, (d,), w, eps=1e-6))


def test_rms_norm_float16_large():
    x = tg.input("x", (3, 8), "float16")
    y = tg.rms_norm(x, tg.weight("w", (8,), "float16"))
    assert y.dtype == tg.float16
    rng = np.random.default_rng(4)
    X, W = (randn(rng, (3, 8)) * 2000).astype(np.float16), randn(rng, (8,)).astype(np.float16)
    got = tg.evaluate(y, {"x": X, "w": W})
    ref = F.rms_norm(t(X).float(), (8,), t(W).float(), eps=1e-6).numpy()
    assert np.isfinite(got).all() and rel_err(got, ref) < 2e-3


def test_rms_norm_bad_input():
    with pytest.raises(tg.ShapeError, match="rms_norm.*weight must have shape"):
        tg.rms_norm(tg.input("x", (3, 8)), tg.weight("w", (8, 1)))


# ---------------------------------------------------------------------------- linear
@pytest.mark.parametrize("xshape,out", [((1,), 1), ((7,), 3), ((5, 33), 7), ((2, 3, 7), 33),
                                        (("batch", 7), 4)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear(xshape, out, with_bias):
    rng = np.random.default_rng(5)
    d = xshape[-1]
    x = tg.input("x", xshape)
    w = tg.weight("w", (out, d))
    concrete = tuple(3 if isinstance(s, str) else s for s in xshape)
    feeds = {"x": randn(rng, concrete), "w": randn(rng, (out, d))}
    b = None
    if with_bias:
        b = tg.weight("b", (out,))
        feeds["b"] = randn(rng, (out,))
    y = tg.linear(x, w, b)
    assert y.shape == x.shape[:-1] + (out,)
    check(y, feeds, lambda x, w, b=None: F.linear(x, w, b))


def test_linear_vector_weight():
    rng = np.random.default_rng(6)
    y = tg.linear(tg.input("x", (4, 7)), tg.weight("w", (7,)))
    feeds = {"x": randn(rng, (4, 7)), "w": randn(rng, (7,))}
    check(y, feeds, lambda x, w: F.linear(x, w))


def test_linear_bad_input():
    with pytest.raises(tg.ShapeError, match="in_features"):
        tg.linear(tg.input("x", (2, 8)), tg.weight("w", (8, 4)))  # (in, out) by mistake
    with pytest.raises(tg.ShapeError, match="bias"):
        tg.linear(tg.input("x", (2, 8)), tg.weight("w", (4, 8)), tg.weight("b", (8,)))


# ---------------------------------------------------------------------------- embedding
@pytest.mark.parametrize("ids_shape,num,dim", [((1,), 1, 1), ((7,), 10, 33), ((2, 7), 33, 7),
                                               ((), 5, 3)])
@pytest.mark.parametrize("id_dtype", ["int64", "int32"])
def test_embedding(ids_shape, num, dim, id_dtype):
    rng = np.random.default_rng(7)
    ids = tg.input("ids", ids_shape, id_dtype)
    table = tg.weight("table", (num, dim))
    feeds = {"ids": rng.integers(0, num, ids_shape).astype(id_dtype),
             "table": randn(rng, (num, dim))}
    y = tg.embedding(ids, table)
    assert y.shape == ids.shape + (dim,)
    check(y, feeds, lambda ids, table: F.embedding(ids.long(), table))


def test_embedding_bad_input():
    with pytest.raises(tg.DTypeError, match="embedding: ids must be integers"):
        tg.embedding(tg.input("ids", (3,)), tg.weight("t", (4, 2)))
    with pytest.raises(tg.ShapeError, match="2-D"):
        tg.embedding(tg.input("ids", (3,), "int64"), tg.weight("t", (4,)))
    y = tg.embedding(tg.input("ids", (2,), "int64"), tg.weight("t", (4, 2)))
    with pytest.raises(tg.EvaluationError, match="out of range"):
        tg.evaluate(y, {"ids": np.array([1, 4]), "t": np.zeros((4, 2), np.float32)})


# ---------------------------------------------------------------------------- attention
def _sdpa_case(rng, b, hq, hkv, sq, sk, d, dv=None):
    dv = dv or d
    shapes = {"q": (b, hq, sq, d), "k": (b, hkv, sk, d), "v": (b, hkv, sk, dv)}
    nodes = {name: tg.input(name, s) for name, s in shapes.items()}
    feeds = {name: randn(rng, s) for name, s in shapes.items()}
    return nodes, feeds


def _torch_sdpa(**kw):
    def fn(q, k, v, mask=None):
        if mask is not None and mask.ndim < 2:  # torch wants a mask of rank >= 2
            mask = mask.reshape(1, -1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, **kw)
    return fn


@pytest.mark.parametrize("b,hq,hkv,sq,sk,d", [
    (1, 1, 1, 1, 1, 1), (2, 3, 3, 7, 7, 8), (1, 4, 2, 7, 33, 16), (2, 8, 1, 5, 3, 4),
    (1, 6, 3, 33, 7, 7)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa(b, hq, hkv, sq, sk, d, is_causal):
    rng = np.random.default_rng(8)
    n, feeds = _sdpa_case(rng, b, hq, hkv, sq, sk, d)
    y = tg.scaled_dot_product_attention(n["q"], n["k"], n["v"], is_causal=is_causal)
    assert y.shape == (b, hq, sq, d)
    check(y, feeds, _torch_sdpa(is_causal=is_causal))


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


@pytest.mark.parametrize("mask_shape", [(7, 33), (1, 1, 7, 33), (2, 1, 7, 33), (4, 7, 33),
                                        (2, 4, 7, 33), (33,)])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_sdpa_masks(mask_shape, kind):
    rng = np.random.default_rng(10)
    n, feeds = _sdpa_case(rng, 2, 4, 2, 7, 33, 8)
    if kind == "bool":
        feeds["mask"] = rng.random(mask_shape) < 0.7
    else:
        feeds["mask"] = randn(rng, mask_shape) * 3
    mask = tg.input("mask", mask_shape, "bool" if kind == "bool" else "float32")
    y = tg.scaled_dot_product_attention(n["q"], n["k"], n["v"], mask, scale=0.3)
    check(y, feeds, _torch_sdpa(scale=0.3))


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
        ref = _torch_sdpa()(**{k: t(v) for k, v in feeds.items()}, mask=t(value)).numpy()
        assert np.isfinite(got).all() and (got[:, :, 2] == 0).all()
        assert rel_err(got, ref) <= 1e-9


def test_sdpa_causal_with_mask_combines():
    rng = np.random.default_rng(12)
    n, feeds = _sdpa_case(rng, 1, 2, 2, 5, 5, 4)
    m = rng.random((5, 5)) < 0.6
    feeds["m"] = m
    y = tg.scaled_dot_product_attention(n["q"], n["k"], n["v"], tg.input("m", (5, 5), "bool"),
                                        is_causal=True)
    got = tg.evaluate(y, feeds, dtype="float64")
    both = t(m & np.tril(np.ones((5, 5), bool)))
    ref = _torch_sdpa()(**{k: t(v) for k, v in feeds.items() if k != "m"}, mask=both).numpy()
    assert rel_err(got, ref) <= 1e-9


def test_sdpa_large_logits():
    rng = np.random.default_rng(13)
    n, feeds = _sdpa_case(rng, 1, 2, 2, 7, 7, 8)
    feeds["q"] = feeds["q"] * 300.0  # scores of order 1e3: exp would overflow unshifted
    y = tg.scaled_dot_product_attention(n["q"], n["k"], n["v"], is_causal=True)
    got = check(y, feeds, _torch_sdpa(is_causal=True), tol32=1e-4)
    assert np.isfinite(got).all()


def test_sdpa_symbolic_seq():
    rng = np.random.default_rng(14)
    q = tg.input("q", ("batch", 4, "seq", 8))
    k = tg.input("k", ("batch", 2, "seq", 8))
    v = tg.input("v", ("batch", 2, "seq", 8))
    y = tg.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert y.shape == q.shape
    assert_atomic(y)
    for batch, seq in ((1, 1), (2, 7), (1, 33)):
        feeds = {"q": randn(rng, (batch, 4, seq, 8)), "k": randn(rng, (batch, 2, seq, 8)),
                 "v": randn(rng, (batch, 2, seq, 8))}
        got = tg.evaluate(y, feeds, dtype="float64")
        ref = _torch_sdpa(is_causal=True)(**{k_: t(v_) for k_, v_ in feeds.items()}).numpy()
        assert rel_err(got, ref) <= 1e-9


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
    got = tg.evaluate(y, feeds, dtype="float64")
    ref = _torch_sdpa()(**{k_: t(v_) for k_, v_ in feeds.items() if k_ != "m"},
                        mask=t(feeds["m"])).numpy()
    assert rel_err(got, ref) <= 1e-9


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
def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _hf_rope(x, cos, sin):
    return x * cos + _rotate_half(x) * sin


def _cos_sin(seq, d, base=10000.0):
    inv = 1.0 / base ** (np.arange(0, d, 2) / d)
    freqs = np.outer(np.arange(seq), inv)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb), np.sin(emb)


@pytest.mark.parametrize("xshape,cshape", [
    ((1, 1, 1, 2), (1, 2)), ((2, 3, 7, 8), (7, 8)), ((1, 2, 33, 16), (1, 1, 33, 16)),
    ((2, 4, 7, 64), (2, 1, 7, 64)), ((7, 2), (7, 2))])
def test_rotary_embedding(xshape, cshape):
    rng = np.random.default_rng(16)
    seq, d = xshape[-2], xshape[-1]
    cos, sin = _cos_sin(seq, d)
    feeds = {"x": randn(rng, xshape), "cos": np.broadcast_to(cos, cshape).copy(),
             "sin": np.broadcast_to(sin, cshape).copy()}
    y = tg.rotary_embedding(tg.input("x", xshape), tg.input("cos", cshape),
                            tg.input("sin", cshape))
    assert y.shape == xshape
    check(y, feeds, _hf_rope)


def test_rotary_embedding_symbolic_seq():
    rng = np.random.default_rng(17)
    y = tg.rotary_embedding(tg.input("x", (1, 2, "seq", 8)), tg.input("cos", ("seq", 8)),
                            tg.input("sin", ("seq", 8)))
    assert_atomic(y)
    for seq in (1, 7):
        cos, sin = _cos_sin(seq, 8)
        feeds = {"x": randn(rng, (1, 2, seq, 8)), "cos": cos, "sin": sin}
        got = tg.evaluate(y, feeds, dtype="float64")
        assert rel_err(got, _hf_rope(*(t(feeds[k]) for k in ("x", "cos", "sin"))).numpy()) \
            <= 1e-9


def test_rotary_embedding_is_a_rotation():
    """Pairs (i, i + D/2) rotate by the angle: the norm of each pair is kept."""
    rng = np.random.default_rng(18)
    cos, sin = _cos_sin(5, 8)
    X = randn(rng, (5, 8))
    y = tg.rotary_embedding(tg.input("x", (5, 8)), tg.constant(cos), tg.constant(sin))
    got = tg.evaluate(y, {"x": X}, dtype="float64")
    pair_norm = lambda a: np.hypot(a[:, :4], a[:, 4:])
    np.testing.assert_allclose(pair_norm(got), pair_norm(X), rtol=1e-12)


def test_rotary_embedding_bad_input():
    with pytest.raises(tg.ShapeError, match="even"):
        tg.rotary_embedding(tg.input("x", (3, 7)), tg.input("c", (3, 7)), tg.input("s", (3, 7)))
    with pytest.raises(tg.ShapeError, match="full head dim"):
        tg.rotary_embedding(tg.input("x", (3, 8)), tg.input("c", (3, 4)), tg.input("s", (3, 4)))
    with pytest.raises(tg.ShapeError):
        tg.rotary_embedding(tg.input("x", (3, 8)), tg.input("c", (4, 8)), tg.input("s", (4, 8)))
