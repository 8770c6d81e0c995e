"""``tg run train-char``: a few steps of the character-level transformer through the command
line's own entry point (small sizes): the loss falls and the sample is text of the corpus's
characters."""

from __future__ import annotations

import re

import numpy as np

from tensor_graphs.cli import main
from tensor_graphs.jobs import train_char

FAST = ["--steps", "16", "--batch", "8", "--seq", "16", "--width", "32", "--layers", "1",
        "--heads", "2", "--warmup", "2", "--sample", "60", "--db", ":memory:"]


def test_train_char_loss_falls_and_samples_text(capsys):
    code = main(["run", "train-char", *FAST])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, out + captured.err
    assert "pydoc_data.topics, 464,970 characters, 103 distinct" in out
    curve = [float(v) for v in re.findall(r"\d+: (\d+\.\d+)",
                                          out.split("loss curve")[1].splitlines()[0])]
    assert len(curve) == 16  # every step: a tenth of 16 steps rounds down to 1
    # a uniform guess over 103 characters is ln(103) = 4.63 nats; 16 steps must do better
    assert curve[-1] < curve[0] - 0.3 and curve[-1] < 4.2
    assert re.search(r"validation loss: \d\.\d+ nats/char", out)
    assert "k tokens/s" in captured.err  # the progress lines (stderr is not a terminal)
    sample = out.split("characters after a validation window):\n")[1].split("|", 1)[1]
    chars = set(train_char.Corpus.of(train_char.text()).chars)
    assert len(sample.rstrip("\n")) >= 60 - sample.count("\n")
    assert set(sample) <= chars
    # sixteen steps learn at least the characters' frequencies: mostly letters and spaces
    assert sum(c.isalpha() or c.isspace() for c in sample) >= 0.6 * len(sample)


def test_batches_are_windows_and_their_next_characters():
    corpus = train_char.Corpus.of("abcdefghij" * 40)
    x, y = corpus.batch(np.random.default_rng(0), 3, 5)
    assert x.shape == (3, 5) and y.shape == (15,)
    nxt = y.reshape(3, 5)
    np.testing.assert_array_equal(nxt[:, :-1], x[:, 1:])
    assert corpus.decode(x[0]) in "abcdefghij" * 3
    assert corpus.chars == "abcdefghij" and len(corpus.valid) == 40


def test_schedule_warms_up_then_decays_to_a_tenth():
    o = train_char.Options(steps=100, warmup=10, lr=1.0)
    rates = [train_char.schedule(s, o) for s in range(100)]
    assert rates[0] == 0.1 and rates[9] == 1.0
    assert all(a >= b for a, b in zip(rates[10:], rates[11:]))
    assert abs(train_char.schedule(100, o) - 0.1) < 1e-12
