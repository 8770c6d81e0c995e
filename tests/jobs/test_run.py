"""``tg run``: the main job end to end, through the command line's own entry point."""

import os

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


def test_run_help_lists_the_models(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    assert "minilm" in text and "gpt2" in text and "measurement" in text
