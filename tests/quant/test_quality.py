"""tg.quality: a GPT-2-shaped model with random weights, int8-weight against float32, as a user
would check a quantized model; the figures are checked against transformers' own (its
perplexity on the same token ids) and against counts made here.

Text: Python's own documentation (``pydoc_data.topics``), as UTF-8 bytes for ids (a vocabulary
of 300 covers them): no download, no tokenizer."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs import nn  # noqa: E402
from tensor_graphs.errors import ArgumentError, ShapeError  # noqa: E402
from tensor_graphs.ir.graph import leaves  # noqa: E402
from tensor_graphs.kernels.c import build  # noqa: E402
from tensor_graphs.nn import Generator  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")
VOCAB = 300


def text(chars: int = 96) -> str:
    from pydoc_data.topics import topics

    return topics["assert"][:chars]


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB,
                                  n_positions=256, initializer_range=0.3, bos_token_id=None,
                                  eos_token_id=None)
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.fixture(scope="module")
def gens(lm):
    opts = dict(max_len=128, max_prompt=16, db=":memory:", profile="never")
    return (Generator.from_transformers(lm, quantize="int8-weight", **opts),
            Generator.from_transformers(lm, **opts))


def torch_perplexity(lm, ids: np.ndarray) -> float:
    with torch.no_grad():
        out = lm(torch.from_numpy(ids[None]), labels=torch.from_numpy(ids[None]))
    return float(torch.exp(out.loss))


@pytest.mark.slow
def test_int8_generator_against_float32(lm, gens, capsys):
    int8, f32 = gens
    prompt = np.random.default_rng(1).integers(0, VOCAB, 8)
    report = tg.quality(int8, f32, prompt, tokens=12, text=text())
    shown = capsys.readouterr().out
    assert "relative error" in shown and "greedy tokens" in shown and "perplexity" in shown
    # the scheme's error on the logits: int8 per-channel changes them, a little
    assert 1e-5 < report.errors[0] < 0.1, report.errors
    ids = np.frombuffer(text().encode(), np.uint8).astype(np.int64)
    assert report.text_tokens == ids.size - 1
    # the float generator's perplexity is transformers' on the same ids
    assert report.perplexity_b == pytest.approx(torch_perplexity(lm, ids), rel=1e-4)
    assert report.perplexity_difference == report.perplexity_a - report.perplexity_b != 0
    # the greedy counts are those of the two generators' own tokens
    mine = int8(prompt, 12)[0, 8:]
    theirs = f32(prompt, 12)[0, 8:]
    assert report.tokens == 12 and report.agree == int((mine == theirs).sum())
    assert report.agreement == report.agree / 12
    assert report.next_agree <= report.text_tokens


def test_a_program_against_itself_and_its_int8_twin(capsys):
    rng = np.random.default_rng(0)
    x = tg.input("x", (4, 32))
    y = tg.relu(x @ tg.weight("w1", (32, 64))) @ tg.weight("w2", (64, 8))
    weights = {"w1": rng.standard_normal((32, 64), np.float32),
               "w2": rng.standard_normal((64, 8), np.float32)}
    f32 = tg.compile([y, tg.exp(x)], db=":memory:", profile="never").bind(**weights)
    int8 = tg.compile([tg.quantize(y, "int8-weight"), tg.exp(x)], db=":memory:",
                      profile="never").bind(**weights)
    feeds = {"x": rng.standard_normal((4, 32), np.float32)}
    same = tg.quality(f32, f32, feeds, show=False)
    assert same.errors == [0.0, 0.0] and same.shapes == [(4, 8), (4, 32)]
    report = tg.quality(int8, f32, feeds)
    assert report.errors[0] == relative_error(int8(**feeds)[0], f32(**feeds)[0]) > 0
    assert report.errors[1] == 0.0  # exp(x) is not quantized
    assert report.tokens is None and report.perplexity_a is None
    assert "output 1 (4, 32)" in capsys.readouterr().out


@pytest.mark.slow
def test_causal_lm_programs_score_a_text_and_decode(lm):
    state = {k: v.detach().numpy() for k, v in lm.state_dict().items()}
    logits = nn.GPT2(nn.GPT2Config.from_hf(lm.config))(tg.input("input_ids", (1, "seq"),
                                                                "int64"))

    def program(graph):
        prog = tg.compile(graph, bounds={"seq": 128}, db=":memory:", profile="never")
        return prog.bind(**{lf.name: state[lf.name] for lf in leaves(graph)
                            if lf.name in state})

    f32, int8 = program(logits), program(tg.quantize(logits, "int8-weight"))
    ids = np.frombuffer(text().encode(), np.uint8).astype(np.int64)
    report = tg.quality(int8, f32, {"input_ids": ids[None, :5]}, tokens=4, text=text(),
                        show=False)
    assert report.perplexity_b == pytest.approx(torch_perplexity(lm, ids), rel=1e-4)
    assert report.text_tokens == ids.size - 1 and report.tokens == 4
    assert 0 < report.errors[0] < 0.1
    with torch.no_grad():
        ref = lm.generate(torch.from_numpy(ids[None, :5]), max_new_tokens=4, do_sample=False,
                          pad_token_id=0, attention_mask=torch.ones(1, 5, dtype=torch.long))
    # b's greedy tokens are transformers' (agreement counts them against a's)
    theirs = tg.nn.quality._decode(f32, ids[None, :5], 4)
    assert theirs == ref[0, 5:].tolist()


def test_generators_built_for_padded_batches_report_as_the_others(lm, gens):
    """``padded=True`` (what tg.generate builds for a padded batch) holds only the programs
    that take ``pad``: quality feeds them no padding and reports what the unpadded pair
    does (it failed with a missing feed 'pad')."""
    opts = dict(max_len=32, max_prompt=8, db=":memory:", profile="never", padded=True)
    padded = (Generator.from_transformers(lm, quantize="int8-weight", **opts),
              Generator.from_transformers(lm, **opts))
    prompt = np.random.default_rng(2).integers(0, VOCAB, 6)
    got = tg.quality(*padded, prompt, tokens=5, text=text(20), show=False)
    want = tg.quality(*gens, prompt, tokens=5, text=text(20), show=False)
    assert got.errors == pytest.approx(want.errors, rel=1e-4) and got.errors[0] > 0
    assert (got.tokens, got.agree, got.text_tokens, got.next_agree) == \
        (want.tokens, want.agree, want.text_tokens, want.next_agree)
    assert got.perplexity_a == pytest.approx(want.perplexity_a, rel=1e-5)


def test_refusals_name_the_fix(gens):
    int8, f32 = gens
    with pytest.raises(ArgumentError, match="two Generators or two programs"):
        tg.quality(int8, lambda **f: None, {}, show=False)
    with pytest.raises(ArgumentError, match="tokenizer"):
        tg.quality(int8, f32, [1, 2], tokens=0, text=[1, VOCAB + 5], show=False)
    with pytest.raises(ShapeError, match="larger max_len"):
        tg.quality(int8, f32, [1, 2], tokens=0, text=list(range(200)), show=False)
    with pytest.raises(ArgumentError, match="tokens"):
        tg.quality(int8, f32, [1, 2], tokens=-1, show=False)


@pytest.mark.slow
def test_tg_quality_command(capsys):
    import json

    from tensor_graphs.cli import main

    status = main(["quality", "gpt2", "--quantize", "int8-weight", "--layers", "1",
                   "--db", ":memory:", "--tokens", "4", "--chars", "40", "-o", "json"])
    rows = {r["measure"]: r["value"] for r in json.loads(capsys.readouterr().out)}
    assert status == 0
    assert 0 < rows["output 0 [1, 1, 50257] relative error"] < 0.1
    assert rows["greedy tokens"] == 4 and 0 <= rows["greedy tokens agreeing"] <= 4
    assert rows["text predictions"] == 39
    assert rows["perplexity difference"] == pytest.approx(
        rows["perplexity (quantized)"] - rows["perplexity (float32)"])
