"""Model configs whose heads do not split the width are refused when the config is made:
GPT-2 with n_embd = 30 and n_head = 4 built a fused qkv of (30, 84) (3 * 4 * 7 columns),
no GPT-2's (transformers refuses the config), and no checkpoint of it binds. Llama's
hidden_size likewise, unless head_dim is given (Qwen3's heads need not split it)."""

from types import SimpleNamespace

import pytest

from tensor_graphs import nn
from tensor_graphs.errors import ArgumentError


def test_gpt2_refuses_n_embd_not_a_multiple_of_n_head():
    with pytest.raises(ArgumentError) as info:
        nn.GPT2Config(n_embd=30, n_head=4, n_layer=1, vocab_size=10)
    msg = str(info.value)
    assert "GPT2Config" in msg and "n_embd=30" in msg and "n_head=4" in msg
    assert "divides" in msg


@pytest.mark.parametrize("heads", [0, -2])
def test_gpt2_refuses_heads_that_are_not_positive(heads):
    with pytest.raises(ArgumentError, match=f"n_head={heads}"):
        nn.GPT2Config(n_embd=32, n_head=heads)


def test_gpt2_from_a_transformers_config_is_refused_the_same_way():
    hf = SimpleNamespace(vocab_size=10, n_positions=8, n_embd=30, n_layer=1, n_head=4,
                         n_inner=None, layer_norm_epsilon=1e-5, activation_function="gelu_new")
    with pytest.raises(ArgumentError, match="n_embd=30.*n_head=4"):
        nn.GPT2Config.from_hf(hf)


def test_gpt2_with_heads_that_split_the_width_builds():
    model = nn.GPT2(nn.GPT2Config(n_embd=32, n_head=4, n_layer=1, vocab_size=10,
                                  n_positions=8))
    assert model.blocks[0].attn.head_dim == 8


def _llama(**kw):
    return nn.LlamaConfig(vocab_size=10, intermediate_size=16, num_hidden_layers=1, **kw)


def test_llama_refuses_hidden_size_not_a_multiple_of_the_heads():
    with pytest.raises(ArgumentError) as info:
        _llama(hidden_size=30, num_attention_heads=4)
    msg = str(info.value)
    assert "LlamaConfig" in msg and "hidden_size=30" in msg and "num_attention_heads=4" in msg
    assert "head_dim" in msg  # the other fix


def test_llama_with_an_explicit_head_dim_need_not_split_the_width():
    """Qwen3 0.6B: hidden 1024, 16 heads of 128 (2048 features): head_dim says it."""
    config = _llama(hidden_size=30, num_attention_heads=4, head_dim=8)
    attn = nn.Llama(config).blocks[0].attn
    assert attn.head_dim == 8 and attn.heads == 4
