"""tg.generate: greedy tokens equal transformers' generate(do_sample=False); decode steps never
plan or grow; bad input is refused before any work."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.nn import Generator  # noqa: E402

VOCAB = 211
NEW = 32


def _gpt2():
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB,
                                  n_positions=300, initializer_range=0.3, bos_token_id=None,
                                  eos_token_id=None)
    return transformers.GPT2LMHeadModel(cfg)


def _qwen3():
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   vocab_size=VOCAB, initializer_range=0.3, bos_token_id=None,
                                   eos_token_id=None)
    return transformers.Qwen3ForCausalLM(cfg)


MODELS = {"gpt2": _gpt2, "qwen3": _qwen3}


@pytest.fixture(scope="module", params=sorted(MODELS))
def lm(request):
    torch.manual_seed(0)
    return MODELS[request.param]().eval()


def _expected(lm, prompt, new):
    with torch.no_grad():
        ids = torch.from_numpy(prompt)
        return lm.generate(ids, max_new_tokens=new, do_sample=False, pad_token_id=0,
                           attention_mask=torch.ones_like(ids)).numpy()


def test_tokens_equal_transformers_greedy(lm):
    prompt = np.random.default_rng(1).integers(0, VOCAB, (1, 9))
    got = tg.generate(lm, prompt, NEW, db=":memory:")
    expected = _expected(lm, prompt, NEW)
    np.testing.assert_array_equal(got, expected)
    assert len(set(got[0, 9:].tolist())) > 4, "weights too weak: greedy tokens barely change"


def test_stream_yields_the_same_tokens_one_at_a_time(lm):
    prompt = np.random.default_rng(2).integers(0, VOCAB, (1, 5))
    steps = tg.generate(lm, torch.from_numpy(prompt), 12, stream=True, db=":memory:")
    first = next(steps)  # produced before the rest are computed
    assert first.shape == (1,)
    tokens = np.concatenate([first, *steps])
    np.testing.assert_array_equal(tokens, _expected(lm, prompt, 12)[0, 5:])


def test_decode_never_plans_and_runs_a_flat_program(lm):
    """One plan for every cache length: the same steps at 8 and at 256 cached tokens."""
    gen = Generator.from_transformers(lm, max_len=260, max_prompt=8, db=":memory:")
    prompt = np.random.default_rng(3).integers(0, VOCAB, (1, 8))
    steps = gen.stream(prompt, 250)
    next(steps)
    sizes = {}
    for _ in steps:
        cached = gen.decode.state(gen.cache_names[0]).shape[2]
        if cached in (9, 257):
            sizes[cached] = (len(gen.decode.plan.steps), gen.decode.stats["plans"])
    assert cached == 8 + 249 and gen.decode.stats["calls"] == 249
    assert sizes[9] == sizes[257] == (sizes[9][0], 1)
    assert gen.decode.stats["planner_runs"] == 1 and gen.prefill.stats["planner_runs"] == 1
    # a second prompt reuses both programs
    np.testing.assert_array_equal(gen(prompt, 6), _expected(lm, prompt, 6))
    assert gen.decode.stats["planner_runs"] == 1 and gen.prefill.stats["plans"] == 1


def test_decode_steps_allocate_nothing_that_grows_with_the_cache(lm):
    """Every step appends to the kept caches in place: no buffer is reallocated, the device's
    allocated bytes stay put, and what a step allocates (its logits, Python bookkeeping) does
    not grow with the number of cached tokens; copying the caches would (a copy of one layer's
    key cache at 200 tokens alone is 51 KB here)."""
    import tracemalloc

    gen = Generator.from_transformers(lm, max_len=240, max_prompt=8, db=":memory:")
    prompt = np.random.default_rng(5).integers(0, VOCAB, (1, 8))
    steps = gen.stream(prompt, 230)
    for _ in range(20):
        next(steps)
    buffers = [gen.decode._states[n].buffer for n in gen.cache_names]
    allocated = tg.Device("cpu").allocated
    one_cache = gen.decode.state(gen.cache_names[0]).nbytes // 20 * 200
    tracemalloc.start()
    try:
        peaks = []
        for _ in range(200):
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            next(steps)
            peaks.append(tracemalloc.get_traced_memory()[1] - before)
    finally:
        tracemalloc.stop()
    assert all(gen.decode._states[n].buffer is b for n, b in zip(gen.cache_names, buffers))
    assert tg.Device("cpu").allocated == allocated
    early, late = np.median(peaks[:20]), np.median(peaks[-20:])
    assert late < early + one_cache / 4, (early, late, one_cache)


def test_stops_at_eos_like_transformers():
    torch.manual_seed(0)
    lm = _gpt2().eval()
    prompt = np.random.default_rng(4).integers(0, VOCAB, (1, 6))
    free = _expected(lm, prompt, 10)[0, 6:]
    eos = int(free[3])  # the 4th greedy token ends the sequence
    lm.generation_config.eos_token_id = eos
    got = tg.generate(lm, prompt, 10, db=":memory:")
    with torch.no_grad():
        ids = torch.from_numpy(prompt)
        ref = lm.generate(ids, max_new_tokens=10, do_sample=False, pad_token_id=0,
                          attention_mask=torch.ones_like(ids)).numpy()
    np.testing.assert_array_equal(got, ref)
    assert got.shape[1] < 16 and got[0, -1] == eos


def test_a_one_token_prompt_and_one_new_token_run_no_decode_step(lm):
    """What follows a lone token (a BOS): the prefill gives the one new token and the cache
    holds one token, so decode never runs; a generator of max_len=1 is still built (its
    decode program bounded at the compiler's least, 1) and refuses a call it cannot hold."""
    prompt = np.array([[5]])
    expected = _expected(lm, prompt, 1)
    np.testing.assert_array_equal(tg.generate(lm, prompt, 1, db=":memory:"), expected)
    gen = Generator.from_transformers(lm, max_len=1, db=":memory:")
    np.testing.assert_array_equal(gen(prompt, 1), expected)
    assert [int(t[0]) for t in gen.stream(prompt, 1)] == [expected[0, 1]]
    assert gen.decode.stats["calls"] == 0
    with pytest.raises(tg.ShapeError, match="need a cache of 2 tokens; it holds 1"):
        gen(prompt, 2)


def test_bad_input_is_refused_before_any_work(lm):
    gen = Generator.from_transformers(lm, max_len=12, max_prompt=6, db=":memory:")
    prompt = np.random.default_rng(5).integers(0, VOCAB, (1, 6))
    gen(prompt, 4)
    name = gen.cache_names[0]
    before = np.array(gen.decode.state(name))
    calls = (gen.prefill.stats["calls"], gen.decode.stats["calls"])
    bad = [
        (tg.ShapeError, "more than the 6", lambda: gen(np.zeros((1, 7), np.int64), 1)),
        (tg.ShapeError, "cache of 13 tokens", lambda: gen(prompt, 8)),
        (tg.ArgumentError, "outside the vocabulary", lambda: gen(prompt + VOCAB, 2)),
        (tg.ArgumentError, "outside the vocabulary", lambda: gen(-prompt - 1, 2)),
        (tg.ArgumentError, "positive int", lambda: gen(prompt, 0)),
        (tg.ShapeError, "batch 1", lambda: gen(np.zeros((2, 3), np.int64), 2)),
        (tg.ShapeError, "integer token ids", lambda: gen(prompt.astype(np.float32), 2)),
        (tg.ShapeError, "prompt is empty", lambda: gen(np.zeros((1, 0), np.int64), 2)),
    ]
    for error, text, call in bad:
        with pytest.raises(error, match=text):
            call()
    with pytest.raises(tg.ShapeError, match="cache of 13 tokens"):
        gen.stream(prompt, 8)  # refused when called, not when first iterated
    assert (gen.prefill.stats["calls"], gen.decode.stats["calls"]) == calls
    np.testing.assert_array_equal(gen.decode.state(name), before)


def test_counts_of_any_integer_type_are_taken_and_limits_name_the_fix(lm, monkeypatch):
    gen = Generator.from_transformers(lm, max_len=np.int64(12), max_prompt=np.int32(6),
                                      db=":memory:")
    prompt = np.random.default_rng(5).integers(0, VOCAB, (1, 6))
    expected = _expected(lm, prompt, 4)
    # a count from NumPy or torch arithmetic, not only a Python int
    np.testing.assert_array_equal(gen(prompt, np.int64(4)), expected)
    np.testing.assert_array_equal(gen(prompt, torch.tensor(4)), expected)
    assert len(list(gen.stream(prompt, np.int64(4)))) == 4
    for slip in (True, 2.0, np.float64(2), torch.tensor([2])):
        with pytest.raises(tg.ArgumentError, match="max_new_tokens must be a positive int"):
            gen(prompt, slip)
    with pytest.raises(tg.ShapeError, match=r"more than the 6 this generator takes "
                       r"\(max_prompt\); build the generator with max_prompt=7 or more"):
        gen(np.zeros((1, 7), np.int64), 1)
    from tensor_graphs import compiler

    def refuse(*args, **kwargs):
        raise AssertionError("compiled before the call was refused")

    monkeypatch.setattr(compiler, "compile", refuse)
    # tg.generate's own max_len: named with what the call needs, before compiling
    with pytest.raises(tg.ShapeError, match=r"6 prompt tokens \+ 5 new ones need a cache of "
                       r"10 tokens; max_len=8 holds fewer \(raise max_len"):
        tg.generate(lm, prompt, 5, max_len=8)
    with pytest.raises(tg.ArgumentError, match="max_len must be a positive int, got 0"):
        tg.generate(lm, prompt, 5, max_len=0)
    with pytest.raises(tg.ShapeError, match="the prompt is empty"):
        tg.generate(lm, np.zeros((1, 0), np.int64), 5)


def test_unsupported_models_and_dtypes_are_named():
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, vocab_size=50, is_decoder=True)
    bert = transformers.BertLMHeadModel(cfg).eval()
    with pytest.raises(tg.ArgumentError, match="model type 'bert' is not supported"):
        tg.generate(bert, np.zeros((1, 3), np.int64), 2)
    torch.manual_seed(0)
    half = _gpt2().to(torch.bfloat16)
    with pytest.raises(tg.DTypeError, match=r"causal_lm.float\(\)"):
        tg.generate(half, np.zeros((1, 3), np.int64), 2)
    with pytest.raises(tg.ShapeError, match="learned"):
        Generator.from_transformers(_gpt2(), max_len=400)
