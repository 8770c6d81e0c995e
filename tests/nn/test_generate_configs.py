"""Model settings that change the attention: Mistral's and Qwen2's sliding windows, GPT-2's
unscaled and layer-scaled scores, scaled RoPE (llama3, linear, yarn; the others refused). Each
model decodes the tokens of transformers' generate(do_sample=False) with the same (random)
weights; ignoring the setting changes them."""

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


# ------------------------------------------------------------------------------ scaled RoPE
# Scaled RoPE (transformers' rope_parameters / rope_scaling): the types whose frequencies are
# fixed at build time. original_max_position_embeddings is small (16) so that the prompt
# (20 tokens) and the generation (40) run past it, where the scaling is what it is for.
ORIGINAL, LONG_PROMPT = 16, 20
ROPES = {
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
}
_FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {}),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 16}),
}


def _scaled(family, rope_type, rope=None):
    """A two-layer GQA model (4 query heads, 2 kv heads) of ``family`` with ``rope_type``'s
    scaling, or the RoPE parameters ``rope`` (max_position_embeddings = 4 * ORIGINAL, the
    ratio yarn's factor states)."""
    config_cls, model_cls, extra = _FAMILIES[family]
    rope = rope or {**ROPES[rope_type], "rope_theta": 500.0}
    cfg = config_cls(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                     initializer_range=0.3, max_position_embeddings=4 * ORIGINAL,
                     rope_parameters=rope, bos_token_id=None, eos_token_id=None, **extra)
    torch.manual_seed(0)
    return model_cls(cfg).eval()


SCALED = ["llama:llama3", "llama:linear", "qwen3:yarn", "mistral:linear", "qwen2:llama3"]


@pytest.mark.parametrize("spec", SCALED)
def test_scaled_rope_tokens_equal_transformers_greedy(spec):
    """A prompt longer than original_max_position_embeddings, then as many new tokens: the
    prefill and decode programs choose transformers' greedy tokens."""
    lm = _scaled(*spec.split(":"))
    prompt = np.random.default_rng(3).integers(0, VOCAB, (1, LONG_PROMPT))
    got = tg.generate(lm, prompt, NEW, db=":memory:")
    np.testing.assert_array_equal(got, _expected(lm, prompt, NEW))
    assert len(set(got[0, LONG_PROMPT:].tolist())) > 4, "weights too weak: tokens barely change"


@pytest.mark.parametrize("spec", ["llama:llama3", "llama:linear", "qwen3:yarn"])
def test_scaled_rope_logits_equal_transformers(spec):
    """The logits of a 40-token sequence (past original_max_position_embeddings) within the
    project's error measure of transformers'; the same model unscaled is far from them, so the
    scaling is what brings them there."""
    from dataclasses import replace

    from tensor_graphs.numerics import relative_error

    family, rope_type = spec.split(":")
    lm = _scaled(family, rope_type)
    config = nn.LlamaConfig.from_hf(lm.config)
    assert config.rope_scaling is not None and config.rope_scaling.rope_type == rope_type
    weights = {k: v.detach().numpy() for k, v in lm.state_dict().items()}
    ids = np.random.default_rng(2).integers(0, VOCAB, (1, 2 * LONG_PROMPT))
    with torch.no_grad():
        ref = lm(torch.from_numpy(ids)).logits.numpy()
    errors = []
    for cfg in (config, replace(config, rope_scaling=None)):
        prog = tg.compile(nn.Llama(cfg)(), bounds={"batch": 1, "seq": 48}, db=":memory:")
        prog.bind(**weights)
        errors.append(relative_error(prog(input_ids=ids), ref))
    assert errors[0] <= 1e-5, errors
    assert errors[1] > 1e-2, errors


# Released configs' RoPE (sizes only, no weights): Llama 3.1 8B, Llama 3.2 1B, a linear
# fine-tune, Qwen3's 128k YaRN, DeepSeek-style YaRN (mscale, untruncated ramp).
_RELEASED = [
    (transformers.LlamaConfig, dict(hidden_size=4096, num_attention_heads=32,
                                    max_position_embeddings=131072, rope_parameters={
                                        **ROPES["llama3"], "original_max_position_embeddings":
                                        8192, "rope_theta": 500000.0})),
    (transformers.LlamaConfig, dict(hidden_size=2048, num_attention_heads=32,
                                    max_position_embeddings=131072, rope_parameters={
                                        **ROPES["llama3"], "factor": 32.0,
                                        "original_max_position_embeddings": 8192,
                                        "rope_theta": 500000.0})),
    (transformers.LlamaConfig, dict(hidden_size=4096, num_attention_heads=32,
                                    rope_scaling={"type": "linear", "factor": 2.0})),
    (transformers.Qwen3Config, dict(hidden_size=4096, num_attention_heads=32, head_dim=128,
                                    max_position_embeddings=131072, rope_parameters={
                                        **ROPES["yarn"], "original_max_position_embeddings":
                                        32768, "rope_theta": 1e6})),
    (transformers.LlamaConfig, dict(hidden_size=64, num_attention_heads=4,
                                    max_position_embeddings=64, rope_parameters={
                                        **ROPES["yarn"], "rope_theta": 500.0, "truncate": False,
                                        "mscale": 0.707, "mscale_all_dim": 1.0,
                                        "beta_fast": 16})),
]


@pytest.mark.parametrize("case", range(len(_RELEASED)))
def test_scaled_rope_frequencies_equal_transformers(case):
    """The frequencies and attention factor of each type at released models' sizes equal
    transformers' but for an ulp (torch's float32 power is not always correctly rounded)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config_cls, options = _RELEASED[case]
    cfg = config_cls(**options)
    ref, factor = ROPE_INIT_FUNCTIONS[cfg.rope_parameters["rope_type"]](cfg)
    ours = nn.LlamaConfig.from_hf(cfg)
    rope = nn.RotaryEmbedding(cfg.head_dim, ours.rope_theta, ours.rope_scaling)
    np.testing.assert_allclose(rope.inv_freq, ref.numpy(), rtol=2.5e-7, atol=0)
    assert rope.attention_factor == factor


def _refusal(rope_type, **rope):
    return SimpleNamespace(model_type="llama", vocab_size=VOCAB, hidden_size=64,
                           intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, rms_norm_eps=1e-6, hidden_act="silu",
                           max_position_embeddings=64, rope_theta=5e5,
                           rope_scaling={"rope_type": rope_type, **rope})


@pytest.mark.parametrize("rope_type, says", [
    ("dynamic", r"max_position_embeddings \(64\).*tg.from_torch cannot.*at most 64, set "
                r"config.rope_parameters = \{'rope_type': 'default', 'rope_theta': 500000.0\}"),
    ("longrope", r"short and long.*tg.from_torch cannot.*run this model in transformers"),
    ("proportional", r"tg.from_torch\(model, ...\) may import"),
])
def test_rope_types_not_built_are_refused_with_the_fix(rope_type, says):
    """Types not built (those whose frequencies follow the run-time length, and any other)
    are refused, each naming what is supported and what to do instead."""
    supported = r"supported: default \(unscaled\), linear, llama3, yarn"
    with pytest.raises(tg.ArgumentError, match=f"'{rope_type}' is not supported \\({supported}"):
        nn.LlamaConfig.from_hf(_refusal(rope_type, factor=2.0))
    with pytest.raises(tg.ArgumentError, match=says):
        nn.LlamaConfig.from_hf(_refusal(rope_type, factor=2.0))


def test_rope_refusals_name_missing_parameters_and_per_layer_rope():
    with pytest.raises(tg.ArgumentError, match="llama3 RoPE parameters lack low_freq_factor"):
        nn.LlamaConfig.from_hf(_refusal("llama3", factor=8.0, high_freq_factor=4.0))
    with pytest.raises(tg.ArgumentError, match="per layer type"):
        nn.LlamaConfig.from_hf(SimpleNamespace(**{**vars(_refusal("default")), "rope_scaling": {
            "full_attention": {"rope_type": "default"},
            "sliding_attention": {"rope_type": "linear", "factor": 2.0}}}))


def test_dynamic_rope_within_max_position_embeddings_is_the_default_as_the_refusal_says():
    """The fix the 'dynamic' refusal names: up to max_position_embeddings tokens transformers'
    dynamic NTK scaling leaves the default frequencies, so the model with its config's RoPE
    set to the default decodes transformers' tokens."""
    lm = _scaled("llama", None, {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 500.0})
    prompt = np.random.default_rng(1).integers(0, VOCAB, (1, LONG_PROMPT))
    expected = _expected(lm, prompt, NEW)  # 40 tokens, within max_position_embeddings (64)
    with pytest.raises(tg.ArgumentError, match="'dynamic' is not supported.*set config."
                                               "rope_parameters = {'rope_type': 'default'"):
        tg.generate(lm, prompt, NEW, db=":memory:")
    lm.config.rope_parameters = {"rope_type": "default", "rope_theta": 500.0}
    np.testing.assert_array_equal(tg.generate(lm, prompt, NEW, db=":memory:"), expected)
