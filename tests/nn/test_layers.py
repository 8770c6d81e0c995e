"""tg.nn layers against numpy (no torch): layouts, weight names, the cache's equivalence."""

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs import nn

RNG = np.random.default_rng(0)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _weights(out, scale=0.5):
    return {leaf.name: _rand(*leaf.shape) * scale for leaf in tg.nodes(out)
            if leaf.op.name == "weight"}


def test_linear_layouts_and_names():
    x = tg.input("x", ("n", 3))
    torch_like = nn.Linear(3, 5, name="fc")
    conv1d = nn.Linear(3, 5, name="c_fc", transposed=True, bias=False)
    assert (torch_like.weight.name, torch_like.weight.shape) == ("fc.weight", (5, 3))
    assert torch_like.bias.name == "fc.bias"
    assert conv1d.weight.shape == (3, 5) and conv1d.bias is None
    W, b, X = _rand(5, 3), _rand(5), _rand(4, 3)
    y1, y2 = tg.evaluate([torch_like(x), conv1d(x)], {"x": X, "fc.weight": W, "fc.bias": b,
                                                       "c_fc.weight": W.T.copy()})
    np.testing.assert_allclose(y1, X @ W.T + b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y2, X @ W.T, rtol=1e-5, atol=1e-6)


def test_mlp_kinds():
    x = tg.input("x", (2, 4))
    X = _rand(2, 4)
    gated = nn.MLP(4, 6, name="mlp", activation="silu", gated=True, bias=False)
    out = gated(x)
    w = _weights(out)
    assert sorted(w) == ["mlp.down_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight"]
    g, u = X @ w["mlp.gate_proj.weight"].T, X @ w["mlp.up_proj.weight"].T
    ref = (g / (1 + np.exp(-g)) * u) @ w["mlp.down_proj.weight"].T
    np.testing.assert_allclose(tg.evaluate(out, {"x": X, **w}), ref, rtol=1e-5, atol=1e-6)
    plain = nn.MLP(4, 6, name="h.mlp", activation="gelu_new", transposed=True)
    assert sorted(_weights(plain(x))) == ["h.mlp.c_fc.bias", "h.mlp.c_fc.weight",
                                          "h.mlp.c_proj.bias", "h.mlp.c_proj.weight"]
    with pytest.raises(tg.ArgumentError, match="activation"):
        nn.MLP(4, 6, name="m", activation="swish2")
    with pytest.raises(tg.ArgumentError, match="names"):
        nn.MLP(4, 6, name="m", gated=True, names=("a", "b"))


def test_attention_with_cache_equals_attention_over_the_whole_sequence():
    # prefill 3 tokens then decode 1 through the cache == the last row of one causal pass
    attn = nn.MultiHeadAttention(16, 4, name="attn", kv_heads=2, rope_theta=100.0,
                                 qk_norm_eps=1e-6)
    x = tg.input("x", ("batch", "seq", 16))
    cache = nn.KVCache(max_len=8)
    full, cached = attn(x), attn(x, cache=cache)
    w = _weights(full)
    X = _rand(2, 4, 16)
    ref = tg.evaluate(full, {"x": X, **w}, dtype="float64")
    outs = [cached, *cache.updates]
    first = tg.evaluate(outs, {"x": X[:, :3], **w, **cache.empty(2)}, dtype="float64")
    states = dict(zip(cache.names(), first[1:]))
    assert states["attn.k_cache"].shape == (2, 2, 3, 4)
    step = tg.evaluate(outs, {"x": X[:, 3:], **w, **states}, dtype="float64")
    np.testing.assert_allclose(first[0], ref[:, :3], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(step[0], ref[:, 3:], rtol=1e-9, atol=1e-9)


def test_rope_angles_follow_positions():
    rope = nn.RotaryEmbedding(8, theta=10000.0)
    cos, sin = rope.cos_sin(nn.positions(3, "past"))
    past = tg.input("p", ("past",))  # binds the dim "past" (= 5) for the interpreter
    c, s, _ = tg.evaluate([cos, sin, past], {"p": np.zeros(5, np.float32)})
    angles = np.arange(5, 8)[:, None] * rope.inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    np.testing.assert_allclose(c, np.cos(angles), atol=1e-5)
    np.testing.assert_allclose(s, np.sin(angles), atol=1e-5)


def test_bad_configurations_are_refused():
    with pytest.raises(tg.ShapeError, match="multiple"):
        nn.MultiHeadAttention(16, 4, name="a", kv_heads=3)
    with pytest.raises(tg.ShapeError, match="even"):
        nn.RotaryEmbedding(7)
    with pytest.raises(tg.ShapeError, match="batch, seq, dim"):
        nn.MultiHeadAttention(16, 4, name="a")(tg.input("x", (3, 16)))
    with pytest.raises(tg.ArgumentError, match="max_len"):
        nn.KVCache(0)
    with pytest.raises(tg.ArgumentError, match="exceeds"):
        nn.KVCache(4).bounds(batch=1, seq=5)
    with pytest.raises(tg.ShapeError, match="input_ids"):
        nn.GPT2(nn.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10))(
            tg.input("ids", (2, 3)))

    with pytest.raises(tg.ArgumentError, match="learned positions"):
        nn.GPT2(nn.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10, n_positions=16))(
            cache=nn.KVCache(32))

    class Scaled:  # a transformers-like config with a RoPE scaled by the run-time length
        model_type, rope_parameters = "llama", {"rope_type": "dynamic", "rope_theta": 5e5}

    with pytest.raises(tg.ArgumentError, match="'dynamic' is not supported"):
        nn.LlamaConfig.from_hf(Scaled())


def test_tied_head_reads_the_embedding():
    cfg = nn.LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=12,
                         num_hidden_layers=1, num_attention_heads=2, tie_word_embeddings=True)
    logits = nn.Llama(cfg)()
    names = {leaf.name for leaf in tg.nodes(logits) if leaf.op.name == "weight"}
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    assert logits.shape[-1] == 11 and str(logits.shape[0]) == "batch"
