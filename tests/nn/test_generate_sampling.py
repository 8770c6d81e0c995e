"""tg.generate(do_sample=True): the warpers are transformers' own (checked against its
logits processors on random scores), the draws follow the softmax of what they leave (checked
by frequency), and a generator samples from the model's distribution (its first token's
frequencies against transformers' warped softmax of the same prompt). The draws are numpy's:
a seed repeats a generation, and tokens are compared by distribution, never one by one with
torch's."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers.generation import logits_process as lp  # noqa: E402

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.nn import Generator  # noqa: E402
from tensor_graphs.nn.sampling import Sampling  # noqa: E402

VOCAB = 61

WARPERS = [  # (temperature, top_k, top_p, min_p)
    (1.0, None, None, None),
    (0.7, None, None, None),
    (1.3, 10, None, None),
    (1.0, None, 0.8, None),
    (0.5, 20, 0.9, None),
    (1.0, None, None, 0.1),
    (2.0, 30, 0.95, 0.05),
    (1.0, 1, None, None),
    (1.0, None, 0.0, None),
]


def _transformers_scores(scores: np.ndarray, temperature, top_k, top_p, min_p) -> np.ndarray:
    """What transformers' generate(do_sample=True) samples from: its warpers, in its order."""
    s = torch.from_numpy(scores)
    ids = torch.zeros((len(scores), 1), dtype=torch.long)
    if temperature != 1.0:
        s = lp.TemperatureLogitsWarper(temperature)(ids, s)
    if top_k:
        s = lp.TopKLogitsWarper(top_k)(ids, s)
    if top_p is not None and top_p < 1.0:
        s = lp.TopPLogitsWarper(top_p)(ids, s)
    if min_p is not None:
        s = lp.MinPLogitsWarper(min_p)(ids, s)
    return s.numpy()


@pytest.mark.parametrize("warpers", WARPERS)
def test_the_warpers_keep_what_transformers_keeps(warpers):
    rng = np.random.default_rng(0)
    scores = (rng.standard_normal((4, VOCAB)) * 3).astype(np.float32)
    ours = Sampling.checked(*warpers).filtered(scores)
    theirs = _transformers_scores(scores.astype(np.float64), *warpers)
    kept = np.isfinite(theirs)
    np.testing.assert_array_equal(np.isfinite(ours), kept)
    np.testing.assert_allclose(ours[kept], theirs[kept], rtol=1e-12)


def test_the_draws_follow_the_softmax_of_the_kept_scores():
    rng = np.random.default_rng(1)
    scores = rng.standard_normal((1, 12)) * 2
    sampling = Sampling.checked(temperature=1.5, top_k=8)
    kept = sampling.filtered(scores)[0]
    want = np.exp(kept - kept.max())
    want /= want.sum()
    draws = np.concatenate([sampling.choose(scores, rng) for _ in range(20000)])
    freq = np.bincount(draws, minlength=12) / len(draws)
    assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(want))  # nothing top_k removed
    assert np.abs(freq - want).max() < 0.015, (freq, want)


def _qwen2(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1,
                                   vocab_size=VOCAB, initializer_range=0.3, bos_token_id=None,
                                   eos_token_id=None)
    return transformers.Qwen2ForCausalLM(cfg).eval()


def test_a_generator_samples_the_models_warped_distribution():
    """2000 one-token generations from one prompt: the first token's frequencies against the
    softmax of transformers' warped scores for that prompt (repetition penalty included)."""
    lm = _qwen2()
    prompt = np.random.default_rng(2).integers(0, VOCAB, (1, 5))
    settings = dict(temperature=1.7, top_k=12, top_p=0.97)
    gen = Generator.from_transformers(lm, max_len=6, do_sample=True, seed=3,
                                      repetition_penalty=1.2, db=":memory:", **settings)
    draws = np.array([gen(prompt, 1)[0, -1] for _ in range(2000)])
    with torch.no_grad():
        logits = lm(torch.from_numpy(prompt)).logits[:, -1].double()
    penalized = lp.RepetitionPenaltyLogitsProcessor(1.2)(torch.from_numpy(prompt), logits)
    theirs = _transformers_scores(penalized.numpy(), min_p=None, **settings)[0]
    want = np.exp(theirs - theirs.max())
    want /= want.sum()
    freq = np.bincount(draws, minlength=VOCAB) / len(draws)
    assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(want))
    assert 0.5 * np.abs(freq - want).sum() < 0.06  # total variation; ~0.03 expected at 2000


def test_a_seed_repeats_a_generation_and_top_k_1_is_greedy():
    lm = _qwen2()
    prompt = np.random.default_rng(4).integers(0, VOCAB, (2, 4))
    hot = dict(do_sample=True, temperature=3.0, top_k=0, db=":memory:")
    first = tg.generate(lm, prompt, 12, seed=7, **hot)
    np.testing.assert_array_equal(tg.generate(lm, prompt, 12, seed=7, **hot), first)
    assert not np.array_equal(tg.generate(lm, prompt, 12, seed=8, **hot), first)
    greedy = tg.generate(lm, prompt, 12, db=":memory:")
    np.testing.assert_array_equal(tg.generate(lm, prompt, 12, do_sample=True, top_k=1,
                                              seed=0, db=":memory:"), greedy)
    streamed = np.stack(list(tg.generate(lm, prompt, 12, stream=True, seed=7, **hot)), axis=1)
    np.testing.assert_array_equal(streamed, first[:, 4:])


def test_the_models_generation_config_gives_the_warpers_the_call_leaves_out():
    """As transformers: do_sample=True in the call samples with the generation_config's
    temperature/top_k/top_p (its own do_sample is not followed: the default is greedy)."""
    lm = _qwen2()
    prompt = np.random.default_rng(5).integers(0, VOCAB, (1, 4))
    greedy = tg.generate(lm, prompt, 8, db=":memory:")
    lm.generation_config.do_sample, lm.generation_config.top_k = True, 1
    lm.generation_config.temperature = 5.0
    np.testing.assert_array_equal(tg.generate(lm, prompt, 8, db=":memory:"), greedy)
    np.testing.assert_array_equal(tg.generate(lm, prompt, 8, do_sample=True, seed=1,
                                              db=":memory:"), greedy)


@pytest.mark.parametrize("options, message", [
    ({"do_sample": True, "temperature": 0.0}, r"temperature \(> 0"),
    ({"do_sample": True, "top_p": 1.5}, r"top_p must be a number in \[0.0, 1.0\]"),
    ({"do_sample": True, "top_k": -1}, r"top_k must be an int >= 0"),
    ({"do_sample": True, "min_p": "0.1"}, r"min_p must be a number"),
    ({"do_sample": "yes"}, r"do_sample must be True or False"),
    ({"do_sample": True, "seed": 1.5}, r"seed must be an int >= 0"),
    ({"top_k": 5}, r"top_k are sampling settings, and this call decodes greedily"),
    ({"do_sample": True, "epsilon_cutoff": 0.01}, r"sets epsilon_cutoff=0.01 \(epsilon "
                                                   r"sampling\)"),
    ({"do_sample": True, "top_h": 0.5}, r"sets top_h=0.5 \(top-H sampling\)"),
])
def test_bad_sampling_settings_are_refused_before_compiling(options, message, monkeypatch):
    import tensor_graphs.compiler as compiler

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled before the settings were checked")

    monkeypatch.setattr(compiler, "compile", no_compile)
    with pytest.raises(tg.ArgumentError, match=message):
        tg.generate(_qwen2(), np.zeros((1, 4), np.int64), 4, **options)


def test_a_generator_built_without_sampling_refuses_a_warper():
    with pytest.raises(tg.ArgumentError, match=r"temperature are sampling settings and "
                                               r"do_sample is False"):
        Generator(None, {}, vocab_size=VOCAB, max_len=8, temperature=0.5)
