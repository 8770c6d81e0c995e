"""Decode in the native loop: a GPT-2-style and a Qwen3-style model decode with every step after
the first few run as one foreign call (the native loop fitted over the growing cache length,
runtime/native_dims.py), giving the Python loop's tokens and logits."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tensor_graphs.kernels.c import build  # noqa: E402
from tensor_graphs.nn import Generator  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")
VOCAB = 211
NEW = 24


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


@pytest.fixture(scope="module", params=["gpt2", "qwen3"])
def gen(request):
    torch.manual_seed(0)
    lm = {"gpt2": _gpt2, "qwen3": _qwen3}[request.param]().eval()
    return Generator.from_transformers(lm, max_len=80, max_prompt=16, db=":memory:")


def _decode(gen: Generator, prompt: np.ndarray, native: bool) -> tuple[list, list, list]:
    """Greedy tokens, each step's logits and which loop ran it."""
    gen.decode.native = native
    gen.prefill.bind(**gen._empty)  # noqa: SLF001 - as Generator._tokens starts a prompt
    logits = gen.prefill(input_ids=prompt)[0]
    gen.decode.bind(**{n: gen.prefill.state(n) for n in gen.cache_names})
    tokens, steps, loops = [], [], []
    for _ in range(NEW):
        token = logits[:, -1].argmax(axis=-1).astype(np.int64)
        tokens.append(int(token[0]))
        logits = gen.decode(input_ids=token[:, None])[0]
        steps.append(np.array(logits))
        loops.append(gen.decode.loop)
    return tokens, steps, loops


def test_decode_plan_is_all_c(gen):
    """The mask (iota, less, where) and the rotary tables (cast, mul, concat, cos, sin) run C
    kernels: only views and the cache appends are not C, and those the native loop handles."""
    others = {s.kernel.name for s in gen.decode.plan.steps
              if s.kernel.backend != "c" and not s.kernel.view}
    assert others <= {"numpy_state_update"}, others


def test_decode_runs_natively_and_equals_the_python_loop(gen):
    prompt = np.random.default_rng(5).integers(0, VOCAB, (1, 9))
    tokens, logits, _ = _decode(gen, prompt, native=False)
    before = gen.decode.stats["native_runs"]
    got_tokens, got_logits, loops = _decode(gen, prompt, native=True)
    assert got_tokens == tokens
    assert len(set(tokens)) > 4, "weights too weak: greedy tokens barely change"
    for g, e in zip(got_logits, logits):
        assert relative_error(g, e) <= 1e-6
    runs = gen.decode.stats["native_runs"] - before
    assert runs >= NEW - 5, loops  # the first few calls sample the dims, the rest are native
    assert all(lp.endswith("(fitted over dims)") for lp in loops[5:]), loops
    # a second prompt of another length: no new samples, native from its first step
    prompt = np.random.default_rng(6).integers(0, VOCAB, (1, 4))
    tokens, logits, _ = _decode(gen, prompt, native=False)
    got_tokens, got_logits, loops = _decode(gen, prompt, native=True)
    assert got_tokens == tokens
    for g, e in zip(got_logits, logits):
        assert relative_error(g, e) <= 1e-6
    assert all(lp.startswith("native loop") for lp in loops), loops


def test_stream_decodes_natively(gen):
    prompt = np.random.default_rng(7).integers(0, VOCAB, (1, 6))
    gen.decode.native = True
    list(gen.stream(prompt, NEW))  # fits the native loop (unless an earlier test did)
    before = gen.decode.stats["native_runs"]
    tokens = np.concatenate(list(gen.stream(prompt, NEW)))
    gen.decode.native = False
    np.testing.assert_array_equal(tokens, np.concatenate(list(gen.stream(prompt, NEW))))
    gen.decode.native = True
    assert gen.decode.stats["native_runs"] - before == NEW - 1  # every decode step
