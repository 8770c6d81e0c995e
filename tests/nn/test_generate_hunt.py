"""Config settings real checkpoints carry, read as transformers' modeling code reads them:
bias flags a model type's code ignores are ignored here too, every activation transformers
names that is one fixed function decodes its tokens, and what is not built is refused naming
the setting and the fix, before any weight is read."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.nn import Generator  # noqa: E402

VOCAB = 211
PROMPT, NEW = 9, 12

_FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
}


def _llama_like(family, **options):
    config_cls, model_cls = _FAMILIES[family]
    cfg = config_cls(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                     initializer_range=0.3, bos_token_id=None, eos_token_id=None, **options)
    torch.manual_seed(0)
    return model_cls(cfg).eval()


def _gpt2(**options):
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB,
                                  n_positions=24, initializer_range=0.3, bos_token_id=None,
                                  eos_token_id=None, **options)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _assert_greedy_tokens_equal(lm):
    prompt = np.random.default_rng(1).integers(0, VOCAB, (1, PROMPT))
    with torch.no_grad():
        ids = torch.from_numpy(prompt)
        expected = lm.generate(ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                               attention_mask=torch.ones_like(ids)).numpy()
    np.testing.assert_array_equal(tg.generate(lm, prompt, NEW, db=":memory:"), expected)


@pytest.mark.parametrize("family, flag", [("mistral", "attention_bias"), ("mistral", "mlp_bias"),
                                          ("qwen2", "mlp_bias"), ("qwen3", "mlp_bias")])
def test_bias_flags_the_model_types_code_ignores_are_ignored(family, flag):
    """Mistral's and Qwen2's projections never have a bias flag (Qwen2's q/k/v biases are
    always there), Qwen3's MLP none: a config carrying one (a config.json written for another
    type) builds the model transformers builds, not one refused for biases it never had."""
    lm = _llama_like(family, **{flag: True}, **({"head_dim": 16} if family == "qwen3" else {}))
    assert not any(name.endswith(".bias") and ("mlp" in name or "o_proj" in name)
                   for name in lm.state_dict())
    _assert_greedy_tokens_equal(lm)


@pytest.mark.parametrize("family, activation", [("gpt2", "quick_gelu"), ("gpt2", "gelu_fast"),
                                                ("llama", "swish"), ("llama", "relu2")])
def test_transformers_activations_decode_its_tokens(family, activation):
    """ACT2FN's names for fixed functions (an alias of silu, GELU's tanh form spelled
    another way, x * sigmoid(1.702 x), relu squared) are built rather than refused."""
    lm = _gpt2(activation_function=activation) if family == "gpt2" else \
        _llama_like(family, hidden_act=activation)
    _assert_greedy_tokens_equal(lm)


@pytest.mark.parametrize("family, setting, activation", [
    ("llama", "hidden_act", "mish"), ("gpt2", "activation_function", "prelu")])
def test_an_activation_not_built_is_refused_naming_the_setting_before_the_weights(
        family, setting, activation):
    """The refusal names the config's setting and what is built, and comes before the
    weights are read: a bfloat16 model is not told to convert weights it could not run."""
    lm = _gpt2(activation_function=activation) if family == "gpt2" else \
        _llama_like(family, hidden_act=activation)
    lm = lm.to(torch.bfloat16)
    with pytest.raises(tg.ArgumentError, match=f"{setting}='{activation}' is not built "
                                               r"\(built: .*quick_gelu"):
        tg.generate(lm, np.zeros((1, 3), np.int64), 2)


def test_a_gpt2_cache_past_its_positions_names_max_len():
    """A Generator has no prompt yet: the refusal of its max_len says to lower max_len, not
    only to shorten a prompt."""
    with pytest.raises(tg.ShapeError, match=r"cache of 30 tokens \(max_len\) outruns GPT-2's "
                                            r"24 learned positions.*give max_len <= 24"):
        Generator.from_transformers(_gpt2(), max_len=30)
