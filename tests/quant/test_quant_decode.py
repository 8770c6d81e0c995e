"""int8-weight decode: a tiny GPT-2 through tg.nn.Generator(quantize="int8-weight") plans the
C int8 GEMMs, decodes in the native loop, and every step's logits match the float64 reference
of the quantized model run over the whole sequence (no cache)."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs import nn  # noqa: E402
from tensor_graphs.ir.graph import leaves  # noqa: E402
from tensor_graphs.kernels.c import build  # noqa: E402
from tensor_graphs.nn import Generator  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")
VOCAB = 211
NEW = 16


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB,
                                  n_positions=300, initializer_range=0.3, bos_token_id=None,
                                  eos_token_id=None)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _reference(lm, ids: np.ndarray) -> np.ndarray:
    """Logits of the quantized model at every position, float64, from the float weights."""
    y = tg.quantize(nn.GPT2(nn.GPT2Config.from_hf(lm.config))(
        tg.input("input_ids", ids.shape, "int64")))
    state = {k: v.detach().numpy() for k, v in lm.state_dict().items()}
    feeds = {leaf.name: state[leaf.name] for leaf in leaves(y) if leaf.name in state}
    return tg.evaluate(y, {**feeds, "input_ids": ids}, dtype="float64")


@pytest.mark.slow
def test_int8_decode_is_native_and_matches_the_quantized_reference(lm):
    gen = Generator.from_transformers(lm, max_len=64, max_prompt=16, db=":memory:",
                                      quantize="int8-weight")
    used = {s.kernel.name for s in gen.decode.plan.steps if not s.static}
    assert any(k.startswith("c_q8_") for k in used), used
    assert "[int8-weight]" in gen.decode.explain()
    prompt = np.random.default_rng(5).integers(0, VOCAB, (1, 9))
    gen.decode.native = True
    before = gen.decode.stats["native_runs"]
    gen.prefill.bind(**gen._empty)  # noqa: SLF001 - as Generator._tokens starts a prompt
    logits = gen.prefill(input_ids=prompt)[0]
    gen.decode.bind(**{n: gen.prefill.state(n) for n in gen.cache_names})
    tokens, steps = [], []
    for _ in range(NEW):
        token = logits[:, -1].argmax(axis=-1).astype(np.int64)
        tokens.append(int(token[0]))
        logits = gen.decode(input_ids=token[:, None])[0]
        steps.append(np.array(logits[0, -1]))
    assert gen.decode.stats["native_runs"] - before >= NEW - 5, gen.decode.loop
    assert gen.decode.loop.startswith("native loop"), gen.decode.loop
    assert len(set(tokens)) > 4, "weights too weak: greedy tokens barely change"
    ref = _reference(lm, np.concatenate([prompt, np.array([tokens])], axis=1))
    for i, got in enumerate(steps):
        assert relative_error(got, ref[0, prompt.shape[1] + i]) <= 1e-4, i
    # the scheme's error against the float model: the user's choice, far above the kernels'
    float_gen = Generator.from_transformers(lm, max_len=64, max_prompt=16, db=":memory:")
    float_gen.prefill.bind(**float_gen._empty)  # noqa: SLF001
    float_logits = float_gen.prefill(input_ids=prompt)[0][0, -1]
    gen.prefill.bind(**gen._empty)  # noqa: SLF001
    q_logits = gen.prefill(input_ids=prompt)[0][0, -1]
    assert 1e-4 < relative_error(q_logits, float_logits) < 0.1


def test_generator_passes_its_int4_group_size_to_the_scheme(lm):
    """Generator(group_size=) reaches tg.quantize: a 64-deep weight in groups of 16 has 4
    scale rows, in groups of 64 one (the commands and benchmarks set it this way)."""
    def scale_rows(group_size):
        gen = Generator.from_transformers(lm, max_len=16, max_prompt=4, db=":memory:",
                                          profile="never", quantize="int4-weight",
                                          group_size=group_size)
        found = {n.shape[0] for n in tg.ir.graph.nodes(gen.decode._pipeline.outputs)  # noqa: SLF001
                 if n.op.name == "int4_scale" and n.inputs[0].shape[0] == 64}
        return found
    assert scale_rows(16) == {4}
    assert scale_rows(64) == {1}
