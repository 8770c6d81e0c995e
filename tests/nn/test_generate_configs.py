"""Model settings that change the attention: Mistral's and Qwen2's sliding windows, GPT-2's
unscaled and layer-scaled scores. Each model decodes the tokens of transformers'
generate(do_sample=False) with the same (random) weights; ignoring the setting changes them."""

import os
from types import SimpleNamespace

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs import nn  # noqa: E402

VOCAB = 211
PROMPT, NEW = 9, 20


def _mistral(window):
    cfg = transformers.MistralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     vocab_size=VOCAB, initializer_range=0.3,
                                     sliding_window=window, bos_token_id=None,
                                     eos_token_id=None)
    return transformers.MistralForCausalLM(cfg)


def _qwen2_second_layer_slides():
    cfg = transformers.Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=VOCAB, initializer_range=0.3,
                                   use_sliding_window=True, sliding_window=3,
                                   max_window_layers=1, bos_token_id=None, eos_token_id=None)
    assert cfg.layer_types == ["full_attention", "sliding_attention"]
    return transformers.Qwen2ForCausalLM(cfg)


def _gpt2(**options):
    cfg = transformers.GPT2Config(n_embd=64, n_layer=3, n_head=4, vocab_size=VOCAB,
                                  n_positions=64, initializer_range=0.3, bos_token_id=None,
                                  eos_token_id=None, **options)
    return transformers.GPT2LMHeadModel(cfg)


MODELS = {
    "mistral_window_4": lambda: _mistral(4),
    "qwen2_sliding_layer": _qwen2_second_layer_slides,
    "gpt2_inverse_layer_scale": lambda: _gpt2(scale_attn_by_inverse_layer_idx=True),
    "gpt2_unscaled": lambda: _gpt2(scale_attn_weights=False),
    "gpt2_reorder_and_upcast": lambda: _gpt2(reorder_and_upcast_attn=True),  # rounding only
}


def _expected(lm, prompt, new):
    with torch.no_grad():
        ids = torch.from_numpy(prompt)
        return lm.generate(ids, max_new_tokens=new, do_sample=False, pad_token_id=0,
                           attention_mask=torch.ones_like(ids)).numpy()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_tokens_equal_transformers_greedy(name):
    torch.manual_seed(0)
    lm = MODELS[name]().eval()
    prompt = np.random.default_rng(1).integers(0, VOCAB, (1, PROMPT))
    got = tg.generate(lm, prompt, NEW, db=":memory:")
    np.testing.assert_array_equal(got, _expected(lm, prompt, NEW))
    assert len(set(got[0, PROMPT:].tolist())) > 4, "weights too weak: greedy tokens barely change"


@pytest.mark.parametrize("name", ["mistral_window_4", "qwen2_sliding_layer"])
def test_windowed_logits_without_a_cache_equal_transformers(name):
    """The model called without a cache (one forward over the whole sequence) masks keys
    older than the window too."""
    torch.manual_seed(0)
    lm = MODELS[name]().eval()
    model = nn.Llama(nn.LlamaConfig.from_hf(lm.config))
    prog = tg.compile(model(), bounds={"batch": 1, "seq": 16}, db=":memory:")
    prog.bind(**{k: v.detach().numpy() for k, v in lm.state_dict().items()})
    ids = np.random.default_rng(2).integers(0, VOCAB, (1, 12))
    with torch.no_grad():
        ref = lm(torch.from_numpy(ids)).logits.numpy()
    got = prog(input_ids=ids)[0]
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()


def test_a_window_no_shorter_than_the_cache_keeps_the_plain_decode_graph():
    """Mistral's default window (4096) hides nothing in a shorter cache: its decode graph is
    the one without a window, node for node (and so is its plan)."""

    def decode_graph(window):
        config = nn.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                                num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, sliding_window=window)
        token = tg.input("input_ids", (1, 1), "int64")
        return tg.structural_hash(nn.Llama(config)(token, cache=nn.KVCache(24)))

    assert decode_graph(24) == decode_graph(4096) == decode_graph(None)
    assert decode_graph(23) != decode_graph(None)


def test_attention_kinds_other_than_full_and_sliding_are_refused():
    config = SimpleNamespace(model_type="qwen3", vocab_size=VOCAB, hidden_size=64,
                             intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                             hidden_act="silu", use_sliding_window=True, sliding_window=8,
                             layer_types=["full_attention", "chunked_attention"])
    with pytest.raises(tg.ArgumentError, match="chunked_attention"):
        nn.LlamaConfig.from_hf(config)
    config.layer_types = ["sliding_attention"]  # one name for two layers
    with pytest.raises(tg.ArgumentError, match="each of the 2 layers"):
        nn.LlamaConfig.from_hf(config)
    config.layer_types, config.sliding_window = None, 0
    with pytest.raises(tg.ArgumentError, match="sliding_window=0"):
        nn.LlamaConfig.from_hf(config)
