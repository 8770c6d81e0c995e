"""tg.generate's generation settings, options and streams: the tokens stay transformers'
generate(do_sample=False)'s under the model's generation_config (repetition_penalty applied,
eos/pad from the call over the config's, a left-padded batch each row's own), and whatever
would make them differ is refused before any compile work: a setting not applied here, an
unknown option, padding that is not on the left, a stream whose cache a later call
overwrote."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.nn import Generator  # noqa: E402
from tensor_graphs.nn import generate as generate_module  # noqa: E402

VOCAB = 211


def _qwen2():
    cfg = transformers.Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=VOCAB, initializer_range=0.3, bos_token_id=None,
                                   eos_token_id=None)
    return transformers.Qwen2ForCausalLM(cfg)


def _mistral_window():
    """Sliding-window attention (a window of 4) with GQA and RoPE."""
    cfg = transformers.MistralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     vocab_size=VOCAB, initializer_range=0.3, sliding_window=4,
                                     bos_token_id=None, eos_token_id=None)
    return transformers.MistralForCausalLM(cfg)


def _gpt2():
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB,
                                  n_positions=64, initializer_range=0.3, bos_token_id=None,
                                  eos_token_id=None)
    return transformers.GPT2LMHeadModel(cfg)


@pytest.fixture
def lm():
    torch.manual_seed(0)
    return _qwen2().eval()


def _expected(lm, prompt, new, **settings):
    settings.setdefault("pad_token_id", 0)
    with torch.no_grad():
        ids = torch.from_numpy(prompt)
        return lm.generate(ids, max_new_tokens=new, do_sample=False,
                           attention_mask=torch.ones_like(ids), **settings).numpy()


@pytest.fixture
def no_compile(monkeypatch):
    """Makes any compile fail the test: a refusal must come before that work."""
    from tensor_graphs import compiler

    def refuse(*args, **kwargs):
        raise AssertionError("compiled before the call was refused")

    monkeypatch.setattr(compiler, "compile", refuse)


# ------------------------------------------------------------------ repetition_penalty
@pytest.mark.parametrize("penalty", [1.05, 1.5, 0.8])
@pytest.mark.parametrize("batch", [1, 2])
def test_repetition_penalty_of_the_generation_config_is_applied_as_transformers(lm, penalty,
                                                                                batch):
    """1.05 is what Qwen2.5-Instruct ships; 0.8 rewards repeats (both branches, score < 0
    multiplied and score > 0 divided, are taken either way)."""
    prompt = np.random.default_rng(1).integers(0, VOCAB, (batch, 8))
    plain = tg.generate(lm, prompt, 24, db=":memory:")
    lm.generation_config.repetition_penalty = penalty
    got = tg.generate(lm, prompt, 24, db=":memory:")
    np.testing.assert_array_equal(got, _expected(lm, prompt, 24))
    assert not np.array_equal(got, plain), "the penalty changes no token here: test too weak"


def test_settings_of_the_call_replace_the_generation_config(lm):
    prompt = np.random.default_rng(2).integers(0, VOCAB, (1, 6))
    free = _expected(lm, prompt, 12)[0, 6:]
    lm.generation_config.repetition_penalty = 1.3
    lm.generation_config.eos_token_id = int(free[2])
    lm.generation_config.pad_token_id = 7
    # the call's None for eos means none, as in transformers
    call = {"repetition_penalty": 1.0, "eos_token_id": None, "pad_token_id": 0}
    got = tg.generate(lm, prompt, 12, db=":memory:", **call)
    np.testing.assert_array_equal(got, _expected(lm, prompt, 12, **call))
    np.testing.assert_array_equal(got[0, 6:], free)
    eos = int(free[4])  # the call's eos ends the row at the 5th token
    got = tg.generate(lm, prompt, 12, eos_token_id=eos, repetition_penalty=1.0, db=":memory:")
    np.testing.assert_array_equal(got, _expected(lm, prompt, 12, eos_token_id=eos,
                                                 repetition_penalty=1.0))
    assert got.shape == (1, 11) and got[0, -1] == eos


def test_a_finished_row_is_padded_with_the_first_eos_when_no_pad_is_set(lm):
    """transformers pads with eos_token_id[0], not the smallest eos id."""
    prompt = np.random.default_rng(3).integers(0, VOCAB, (2, 6))
    free = _expected(lm, prompt, 10)
    eos = int(free[0, 8])  # ends row 0 early, not row 1
    assert eos not in free[1, 6:].tolist()
    unused = min(set(range(VOCAB)) - set(free[:, 6:].ravel().tolist()))
    assert unused < eos
    lm.generation_config.eos_token_id = [eos, unused]
    lm.generation_config.pad_token_id = None
    got = tg.generate(lm, prompt, 10, db=":memory:")
    np.testing.assert_array_equal(got, _expected(lm, prompt, 10, pad_token_id=None))
    assert got[0, -1] == eos


def _padding_the_penalty_may_count(lm):
    """A left-padded batch (ids, mask, padding id) whose padding id is the token the short
    row's prompt gives first: a repetition penalty that counted the padding as that row's
    tokens would push that token down."""
    rng = np.random.default_rng(9)
    short = rng.integers(1, VOCAB, 3)
    with torch.no_grad():
        first = int(lm(torch.from_numpy(short[None])).logits[0, -1].argmax())
    assert first not in short.tolist()
    ids = np.stack([np.concatenate([[first, first], short]), rng.integers(1, VOCAB, 5)])
    mask = np.ones_like(ids)
    mask[0, :2] = 0
    return ids, mask, first


def _penalizing_every_prompt_token(lm, ids, mask, pad_id, new, penalty):
    """transformers' tokens with a penalty over every prompt id, padding included (as
    releases whose generate passed no padding to the penalty applied it)."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    with torch.no_grad():
        return lm.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                           max_new_tokens=new, do_sample=False, pad_token_id=pad_id,
                           logits_processor=[RepetitionPenaltyLogitsProcessor(penalty)]).numpy()


def test_repetition_penalty_counts_a_rows_left_padding_as_transformers_does(lm):
    """The padding is counted (or not) as the installed transformers counts it, from a mask
    or inferred from pad_token_id alike; this one leaves it out, so the padded row's first
    token is its prompt's own."""
    ids, mask, pad_id = _padding_the_penalty_may_count(lm)
    with torch.no_grad():
        expected = lm.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                               max_new_tokens=4, do_sample=False, repetition_penalty=1.3,
                               pad_token_id=pad_id).numpy()
    counted = _penalizing_every_prompt_token(lm, ids, mask, pad_id, 4, 1.3)
    if generate_module._penalty_skips_padding():
        assert expected[0, 5] == pad_id, "the padded row's own first token"
        assert not np.array_equal(expected, counted), "counting the padding changes nothing"
    else:
        np.testing.assert_array_equal(expected, counted)
    got = tg.generate(lm, ids, 4, attention_mask=mask, repetition_penalty=1.3,
                      pad_token_id=pad_id, db=":memory:")
    np.testing.assert_array_equal(got, expected)
    # no mask: transformers infers the padding from pad_token_id, and so does the penalty
    gen = Generator.from_transformers(lm, max_len=8, batch=2, repetition_penalty=1.3,
                                      pad_token_id=pad_id, padded=True, db=":memory:")
    np.testing.assert_array_equal(gen(ids, 4), expected)
    np.testing.assert_array_equal(np.stack(list(gen.stream(ids, 4)), axis=1), expected[:, 5:])


class _IntOnlyPenalty(transformers.generation.logits_process.RepetitionPenaltyLogitsProcessor):
    """The penalty's processor of a release whose prompt_ignore_length was one int for every
    row (and whose generate passed none)."""

    def __init__(self, penalty, prompt_ignore_length=None):
        if prompt_ignore_length is not None and not isinstance(prompt_ignore_length, int):
            raise ValueError("`prompt_ignore_length` has to be a positive integer")
        super().__init__(penalty, prompt_ignore_length)


class _PromptOnlyPenalty(transformers.generation.logits_process.RepetitionPenaltyLogitsProcessor):
    """The penalty's processor of a release before prompt_ignore_length."""

    def __init__(self, penalty):
        super().__init__(penalty)


@pytest.mark.parametrize("older", [_IntOnlyPenalty, _PromptOnlyPenalty])
def test_repetition_penalty_counts_the_padding_under_a_transformers_that_did(lm, monkeypatch,
                                                                             older):
    """Under a transformers whose penalty takes no count of padding per row, its generate
    penalized a padded row's padding ids like the prompt's: so does this one then."""
    from transformers.generation import logits_process

    ids, mask, pad_id = _padding_the_penalty_may_count(lm)
    counted = _penalizing_every_prompt_token(lm, ids, mask, pad_id, 4, 1.3)
    monkeypatch.setattr(logits_process, "RepetitionPenaltyLogitsProcessor", older)
    assert generate_module._penalty_skips_padding() is False
    got = tg.generate(lm, ids, 4, attention_mask=mask, repetition_penalty=1.3,
                      pad_token_id=pad_id, db=":memory:")
    np.testing.assert_array_equal(got, counted)


# ------------------------------------------------------------------ refused settings
ACTIVE = {
    "num_beams": 2, "num_return_sequences": 2, "constraints": ["phrase"],
    "force_words_ids": [[5]], "penalty_alpha": 0.6, "dola_layers": "high",
    "guidance_scale": 1.5, "sequence_bias": {(5,): -1.0}, "encoder_repetition_penalty": 1.1,
    "no_repeat_ngram_size": 3, "encoder_no_repeat_ngram_size": 2, "bad_words_ids": [[5]],
    "min_length": 12, "min_new_tokens": 2, "forced_bos_token_id": 1,
    "forced_eos_token_id": 2, "exponential_decay_length_penalty": (5, 1.5),
    "suppress_tokens": [3], "begin_suppress_tokens": [3], "remove_invalid_values": True,
    "watermarking_config": {"greenlist_ratio": 0.25}, "token_healing": True,
    "stop_strings": ["x"], "max_time": 10.0,
}


@pytest.mark.parametrize("name", sorted(ACTIVE))
def test_a_setting_not_applied_here_is_refused_before_compiling(lm, no_compile, name):
    lm.generation_config.eos_token_id = 5  # min_length/min_new_tokens act only with an eos
    setattr(lm.generation_config, name, ACTIVE[name])
    with pytest.raises(tg.ArgumentError,
                       match=rf"generation_config sets {name}=.*generation_config\.{name} = "):
        tg.generate(lm, np.zeros((1, 4), np.int64), 4)
    setattr(lm.generation_config, name, None)
    with pytest.raises(tg.ArgumentError, match=rf"this call sets {name}=.*leave {name} out"):
        tg.generate(lm, np.zeros((1, 4), np.int64), 4, **{name: ACTIVE[name]})


def test_use_cache_as_transformers_takes_it_is_accepted_and_changes_nothing(lm):
    """A transformers call copied with use_cache=True (or False) was refused as unknown."""
    prompt = np.random.default_rng(6).integers(0, VOCAB, (1, 5))
    want = _expected(lm, prompt, 6)
    for use_cache in (True, False):
        got = tg.generate(lm, prompt, 6, use_cache=use_cache, db=":memory:")
        np.testing.assert_array_equal(got, want)


def test_inactive_values_and_sampling_settings_are_accepted(lm):
    """At these values transformers' greedy generate applies nothing, so neither refuses:
    sampling settings (Qwen2.5-Instruct ships do_sample=True, temperature 0.7, top_p 0.8,
    top_k 20) are for do_sample=True, which tg.generate's greedy decoding replaces."""
    inactive = {"num_beams": 1, "num_return_sequences": 1, "no_repeat_ngram_size": 0,
                "encoder_no_repeat_ngram_size": 0, "encoder_repetition_penalty": 1.0,
                "guidance_scale": 1.0, "repetition_penalty": 1.0, "min_length": 30,
                "min_new_tokens": 3, "suppress_tokens": [], "remove_invalid_values": False,
                "penalty_alpha": 0.6, "top_k": 1, "do_sample": True, "temperature": 0.7,
                "top_p": 0.8, "renormalize_logits": True}  # min_length: no eos, no effect
    for name, value in inactive.items():
        setattr(lm.generation_config, name, value)
    prompt = np.random.default_rng(4).integers(0, VOCAB, (1, 6))
    got = tg.generate(lm, prompt, 10, do_sample=False, no_repeat_ngram_size=0, db=":memory:")
    np.testing.assert_array_equal(got, _expected(lm, prompt, 10))


def test_every_generation_config_setting_is_applied_refused_or_inert_under_greedy():
    """A transformers release that adds a setting fails here until it is sorted into one of
    the three: applied, refused (_REFUSED), or one that changes no greedy token."""
    inert = {
        # sampling only (do_sample=False), lengths (max_length is not read; max_new_tokens
        # is tg.generate's default, not a Generator's setting), beams only
        "max_length", "max_new_tokens", "early_stopping", "length_penalty",
        "num_beam_groups", "diversity_penalty", "low_memory",
        # what generate returns, caching and compiling, token ids for encoder-decoders
        "output_attentions", "output_hidden_states", "output_scores", "output_logits",
        "return_dict_in_generate", "cache_implementation", "cache_config",
        "compile_config", "disable_compile", "max_cache_len", "prefill_chunk_size",
        "continuous_batching_config", "bos_token_id", "decoder_start_token_id",
        "transformers_version", "renormalize_logits",  # log_softmax keeps the argmax
        # assisted decoding: greedy assistance verifies every drafted token (same tokens)
        "assistant_confidence_threshold", "assistant_early_exit", "assistant_lookbehind",
        "target_lookbehind", "num_assistant_tokens", "num_assistant_tokens_schedule",
        "is_assistant", "prompt_lookup_num_tokens", "max_matching_ngram_size", "use_mtp",
        "speculation_type", "assistant_ensemble_weight",
    }
    known = {*generate_module._SETTINGS, *inert}
    fields = {n for n in vars(transformers.GenerationConfig()) if not n.startswith("_")}
    assert fields - known == set()


# ------------------------------------------------------------------ max_new_tokens
def test_max_new_tokens_of_the_generation_config_is_taken_when_the_call_gives_none(lm):
    """As transformers' generate: the call's max_new_tokens, else the generation_config's
    (a checkpoint's generation_config.json may set it), else tg.generate's default of 32."""
    generate = tg.generate
    prompt = np.random.default_rng(10).integers(0, VOCAB, (1, 4))
    lm.generation_config.max_new_tokens = 5
    with torch.no_grad():
        ids = torch.from_numpy(prompt)
        expected = lm.generate(ids, do_sample=False, pad_token_id=0,
                               attention_mask=torch.ones_like(ids)).numpy()
    assert expected.shape == (1, 9)
    np.testing.assert_array_equal(generate(lm, prompt, db=":memory:"), expected)
    assert len(list(generate(lm, prompt, stream=True, db=":memory:"))) == 5
    np.testing.assert_array_equal(generate(lm, prompt, 3, db=":memory:"), expected[:, :7])
    lm.generation_config.max_new_tokens = None
    assert generate(lm, prompt, db=":memory:").shape == (1, 4 + 32)
    lm.generation_config.max_new_tokens = 0
    with pytest.raises(tg.ArgumentError, match=r"the model's generation_config sets "
                       r"max_new_tokens=0.*pass max_new_tokens=N"):
        generate(lm, prompt)


# ------------------------------------------------------------------ options
def test_unknown_options_are_refused_with_the_accepted_ones(lm, no_compile):
    prompt = np.zeros((1, 4), np.int64)
    with pytest.raises(tg.ArgumentError, match=r"unknown option\(s\) no_such.*"
                       r"repetition_penalty.*quantize.*tolerance"):
        tg.generate(lm, prompt, 4, no_such=1)
    with pytest.raises(tg.ArgumentError, match=r"temperature, top_p are sampling settings, "
                       r"and this call decodes greedily: pass do_sample=True"):
        tg.generate(lm, prompt, 4, temperature=0.7, top_p=0.9)
    with pytest.raises(tg.ArgumentError, match=r"max_length: .*give max_new_tokens"):
        tg.generate(lm, prompt, max_length=12)
    with pytest.raises(tg.ArgumentError, match=r"unknown option\(s\) bounds"):
        Generator.from_transformers(lm, max_len=8, bounds={"seq": 4})
    with pytest.raises(tg.ArgumentError, match=r"unknown option\(s\) no_repeat_ngram_size"):
        Generator(None, {}, vocab_size=VOCAB, max_len=8, no_repeat_ngram_size=3)
    with pytest.raises(tg.ArgumentError, match="repetition_penalty must be a positive number"):
        Generator(None, {}, vocab_size=VOCAB, max_len=8, repetition_penalty=0)
    with pytest.raises(tg.ArgumentError, match=r"this call sets typical_p=0.5 \(typical "
                       r"sampling\).*generate\(do_sample=True\)"):
        tg.generate(lm, prompt, 4, do_sample=True, typical_p=0.5)


def test_padding_not_on_the_left_is_refused_before_compiling(lm, no_compile):
    prompt = np.random.default_rng(5).integers(0, VOCAB, (3, 6))
    mask = np.ones_like(prompt)
    mask[1, 4:] = 0  # right padding
    with pytest.raises(tg.ArgumentError, match=r"rows \[1\] padded after a real token.*"
                       r"padding_side = 'left'"):
        tg.generate(lm, prompt, 4, attention_mask=torch.from_numpy(mask))
    mask[1], mask[2, 2] = 1, 0  # a gap
    with pytest.raises(tg.ArgumentError, match=r"rows \[2\] padded after a real token"):
        tg.generate(lm, prompt, 4, attention_mask=mask)
    mask[0] = 0  # padding only, beside the gap: both named
    with pytest.raises(tg.ArgumentError, match=r"rows \[0\] padding only.*; rows \[2\] "
                       "padded after"):
        tg.generate(lm, prompt, 4, attention_mask=mask)
    with pytest.raises(tg.ShapeError, match=r"attention_mask has shape \(6,\)"):
        tg.generate(lm, prompt, 4, attention_mask=mask[0])
    with pytest.raises(tg.ShapeError, match="attention_mask has shape"):
        tg.generate(lm, prompt, 4, attention_mask=mask[:, 1:])


def _ragged(rng, lengths, pad=0):
    """Prompts of ``lengths`` left-padded with ``pad`` to the longest, as tokenizer(...,
    padding=True, padding_side="left") gives them: (ids, attention_mask, the prompts)."""
    prompts = [rng.integers(1, VOCAB, n) for n in lengths]
    width = max(lengths)
    ids = np.full((len(prompts), width), pad)
    mask = np.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):], mask[row, width - len(p):] = p, 1
    return ids, mask, prompts


def test_a_padded_rows_mask_hides_its_padding_but_from_itself():
    """Keys of row b before pad[b] are hidden from its real tokens; a padding query sees its
    own key only, never no key (a row of -inf is NaN in a softmax that does not guard it,
    and the NaN would reach the real tokens through the padding's values in later layers)."""
    from tensor_graphs.ir.evaluate import evaluate
    from tensor_graphs.nn.attention import _offset_causal_mask

    pad = tg.input("pad", (2,), "int64")
    got = evaluate(_offset_causal_mask(3, 2, None, pad), {"pad": np.array([0, 3])})
    seen = got == 0  # (batch, 1, seq, past + seq): query rows at slots 2, 3, 4
    np.testing.assert_array_equal(seen[0, 0], np.tril(np.ones((3, 5), bool), 2))
    np.testing.assert_array_equal(seen[1, 0], [[0, 0, 1, 0, 0],    # slot 2: padding, itself
                                               [0, 0, 0, 1, 0],    # slot 3: first real token
                                               [0, 0, 0, 1, 1]])


@pytest.mark.parametrize("model", ["qwen2", "gpt2", "mistral_window"])
def test_a_left_padded_batch_gives_each_rows_own_tokens(model):
    """Rows of a left-padded batch get transformers' tokens for that batch, which are each
    prompt's own (generated alone): positions count from a row's first real token (RoPE,
    GPT-2's learned table) and no real token attends to padding, in the prompt and the cache
    (a sliding window too). The padded programs are compiled on the first padded call, once;
    calls without padding keep the first programs."""
    torch.manual_seed(0)
    lm = {"qwen2": _qwen2, "gpt2": _gpt2, "mistral_window": _mistral_window}[model]().eval()
    ids, mask, prompts = _ragged(np.random.default_rng(3), [7, 3, 5])
    with torch.no_grad():
        expected = lm.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                               max_new_tokens=9, do_sample=False, pad_token_id=0).numpy()
    gen = Generator.from_transformers(lm, max_len=16, batch=3, db=":memory:")
    got = gen(torch.from_numpy(ids), 9, attention_mask=torch.from_numpy(mask))
    np.testing.assert_array_equal(got, expected)
    for row, prompt in enumerate(prompts):  # each row's tokens: its prompt's alone
        np.testing.assert_array_equal(got[row, 7:], _expected(lm, prompt[None], 9)[0, -9:])
    padded = gen._padded
    tokens = np.stack(list(gen.stream(ids, 9, attention_mask=mask)), axis=1)
    np.testing.assert_array_equal(tokens, expected[:, 7:])
    assert gen._padded is padded  # compiled once
    unpadded = ids[[0, 0, 0]]
    np.testing.assert_array_equal(gen(unpadded, 9), _expected(lm, unpadded, 9))
    assert gen.decode.stats["calls"] == 8 and padded[1].stats["calls"] == 16


def test_an_attention_mask_of_ones_gives_transformers_tokens(lm):
    prompt = np.random.default_rng(5).integers(0, VOCAB, (2, 6))
    got = tg.generate(lm, torch.from_numpy(prompt), 8,
                      attention_mask=torch.ones(2, 6, dtype=torch.long), db=":memory:")
    np.testing.assert_array_equal(got, _expected(lm, prompt, 8))


def _left_padded(pad):
    """Two prompts, the first left-padded with ``pad`` (as tokenizer(..., padding=True,
    padding_side="left") gives them, mask dropped)."""
    prompt = np.random.default_rng(8).integers(1, VOCAB, (2, 6))
    prompt[0, :2] = pad
    return prompt


def test_tg_generate_of_a_padded_batch_compiles_one_pair_which_takes_any_batch(
        lm, monkeypatch):
    """tg.generate knows the padding before it builds: a Generator(padded=True) compiles the
    padded pair only, and that pair takes an unpadded batch too (padding 0)."""
    from tensor_graphs import compiler

    ids, mask, _ = _ragged(np.random.default_rng(4), [6, 4])
    with torch.no_grad():
        expected = lm.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                               max_new_tokens=5, do_sample=False, pad_token_id=0).numpy()
    compiled = []
    real = compiler.compile
    monkeypatch.setattr(compiler, "compile", lambda *a, **k: compiled.append(1) or real(*a, **k))
    np.testing.assert_array_equal(tg.generate(lm, ids, 5, attention_mask=mask, db=":memory:"),
                                  expected)
    assert len(compiled) == 2
    gen = Generator.from_transformers(lm, max_len=12, batch=2, padded=True, db=":memory:")
    unpadded = ids[[0, 0]]
    np.testing.assert_array_equal(gen(unpadded, 5), _expected(lm, unpadded, 5))
    np.testing.assert_array_equal(gen(ids, 5, attention_mask=mask), expected)
    assert len(compiled) == 4 and gen.decode.stats["calls"] == 8


def test_a_model_written_without_padding_still_builds_a_generator():
    """The model protocol before padding: ``model(ids, cache=, last_only=)``; ``pad=`` is
    passed only to the padded programs (and a padded call to such a model says so)."""
    torch.manual_seed(0)
    lm = _gpt2().eval()
    inner = tg.nn.GPT2(tg.nn.GPT2Config.from_hf(lm.config))

    class Unpadded:
        def __call__(self, ids, *, cache=None, last_only=False):
            return inner(ids, cache=cache, last_only=last_only)

    weights = {k: v.detach().numpy() for k, v in lm.state_dict().items()}
    gen = Generator(Unpadded(), weights, vocab_size=VOCAB, max_len=12, db=":memory:")
    prompt = np.random.default_rng(2).integers(1, VOCAB, (1, 5))
    np.testing.assert_array_equal(gen(prompt, 4), _expected(lm, prompt, 4))
    with pytest.raises(tg.ArgumentError, match="needs a model that takes pad="):
        gen(prompt, 4, attention_mask=[[0, 1, 1, 1, 1]])
    np.testing.assert_array_equal(gen(prompt, 4), _expected(lm, prompt, 4))


def test_a_prompt_holding_the_pad_id_without_a_mask_is_padded_as_transformers_infers(lm):
    """transformers infers attention_mask = input_ids != pad_token_id when no mask is given
    (and the pad is no eos): left padding so inferred is taken as it is; a pad id that the
    inference would make right padding or a gap is refused before compiling."""
    prompt = _left_padded(0)
    with torch.no_grad():
        inferred = lm.generate(torch.from_numpy(prompt), max_new_tokens=6, do_sample=False,
                               pad_token_id=0).numpy()
    assert not np.array_equal(inferred, _expected(lm, prompt, 6)), "padding changed nothing"
    np.testing.assert_array_equal(tg.generate(lm, prompt, 6, pad_token_id=0, db=":memory:"),
                                  inferred)
    gap = prompt.copy()
    gap[1, 3] = 0
    from tensor_graphs import compiler

    def refuse(*args, **kwargs):
        raise AssertionError("compiled before the call was refused")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compiler, "compile", refuse)
        with pytest.raises(tg.ArgumentError, match=r"rows \[0, 1\] hold pad_token_id=0 and no "
                           r"attention_mask.*rows \[1\] padded after a real token.*"
                           r"attention_mask=np.ones_like\(input_ids\)"):
            tg.generate(lm, gap, 6, pad_token_id=0)
        lm.generation_config.pad_token_id = 0  # the model's own pad: the same inference
        with pytest.raises(tg.ArgumentError, match="hold pad_token_id=0"):
            tg.generate(lm, gap, 6, stream=True)
    # a mask of ones says they are real tokens; a pad that is an eos infers nothing
    got = tg.generate(lm, gap, 6, attention_mask=np.ones_like(gap), db=":memory:")
    np.testing.assert_array_equal(got, _expected(lm, gap, 6))
    got = tg.generate(lm, gap, 6, eos_token_id=0, db=":memory:")
    np.testing.assert_array_equal(got, _expected(lm, gap, 6, eos_token_id=0))


def test_a_generator_takes_an_attention_mask_and_infers_padding_as_transformers(lm):
    prompt = _left_padded(5)
    gen = Generator.from_transformers(lm, max_len=16, batch=2, pad_token_id=5, db=":memory:")
    with torch.no_grad():
        inferred = lm.generate(torch.from_numpy(prompt), max_new_tokens=4, do_sample=False,
                               pad_token_id=5).numpy()
    np.testing.assert_array_equal(gen(prompt, 4), inferred)
    tokens = gen.stream(prompt, 4)
    np.testing.assert_array_equal(np.stack(list(tokens), axis=1), inferred[:, 6:])
    mask = np.ones_like(prompt)
    mask[0, :2] = 0
    np.testing.assert_array_equal(gen(prompt, 4, attention_mask=torch.from_numpy(mask)),
                                  inferred)
    mask[0, 4] = 0
    with pytest.raises(tg.ArgumentError, match=r"attention_mask has rows \[0\] padded after"):
        gen(prompt, 4, attention_mask=mask)
    expected = _expected(lm, prompt, 4, pad_token_id=5)
    np.testing.assert_array_equal(gen(prompt, 4, attention_mask=np.ones_like(prompt)), expected)
    tokens = gen.stream(prompt, 4, attention_mask=np.ones_like(prompt))
    np.testing.assert_array_equal(np.stack(list(tokens), axis=1), expected[:, 6:])
    unpadded = prompt[1:].repeat(2, axis=0)  # no pad id in it: nothing to infer
    np.testing.assert_array_equal(gen(unpadded, 4), _expected(lm, unpadded, 4))


# ------------------------------------------------------------------ streams
def test_a_stream_whose_cache_a_later_call_overwrote_raises_on_its_next_step():
    torch.manual_seed(0)
    lm = _gpt2().eval()
    gen = Generator.from_transformers(lm, max_len=32, max_prompt=16, db=":memory:")
    a = np.random.default_rng(6).integers(0, VOCAB, (1, 8))
    b = np.random.default_rng(7).integers(0, VOCAB, (1, 5))
    first = gen.stream(a, 10)
    assert int(next(first)[0]) == _expected(lm, a, 1)[0, 8]
    second = gen.stream(b, 10)  # not started: a's cache is intact yet
    assert int(next(first)[0]) == _expected(lm, a, 2)[0, 9]
    tokens = [int(t[0]) for t in second]  # its prefill replaces a's cache
    assert tokens == _expected(lm, b, 10)[0, 5:].tolist()
    with pytest.raises(tg.StateError, match="overwritten by a later call"):
        next(first)
    third = gen.stream(a, 10)
    next(third)
    np.testing.assert_array_equal(gen(b, 4), _expected(lm, b, 4))
    with pytest.raises(tg.StateError, match="one cache"):
        next(third)
    # a refused call does no work, so a stream it interrupts goes on
    fourth = gen.stream(a, 10)
    tokens = [int(next(fourth)[0])]
    with pytest.raises(tg.ShapeError):
        gen(np.zeros((1, 17), np.int64), 2)
    tokens += [int(t[0]) for t in fourth]
    assert tokens == _expected(lm, a, 10)[0, 8:].tolist()
