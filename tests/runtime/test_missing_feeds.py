"""A compiled call missing an input raises the FeedError tg.evaluate gives (one rule,
``ir.evaluate.require_feeds``), on the Python loop and once the native loop has recorded."""

import numpy as np
import pytest

import tensor_graphs as tg


def message(y, feeds):
    with pytest.raises(tg.FeedError) as exc:
        tg.evaluate(y, feeds)
    return str(exc.value)


def test_with_bounds_and_no_feeds():
    x, w = tg.input("x", ("batch", 8)), tg.weight("w", (8, 16))
    y = x @ w
    W = np.ones((8, 16), np.float32)
    prog = tg.compile(y, db=":memory:", bounds={"batch": 4}).bind(w=W)
    expected = message(y, {"w": W})
    assert expected.startswith("missing feed(s): x (batch, 8) float32; give each an array")
    with pytest.raises(tg.FeedError) as exc:
        prog()
    assert str(exc.value) == expected


def test_on_the_native_loop():
    x, t, w = tg.input("x", (2, 8)), tg.input("t", (2, 16)), tg.weight("w", (8, 16))
    y = x @ w + t
    W, X, T = (np.ones(s, np.float32) for s in [(8, 16), (2, 8), (2, 16)])
    prog = tg.compile(y, db=":memory:", backends=("c",)).bind(w=W)
    for _ in range(3):
        np.testing.assert_allclose(prog(x=X, t=T), X @ W + T)
    assert prog.loop.startswith("native loop"), prog.loop
    for feeds in ({}, {"x": X}, {"t": T}):
        with pytest.raises(tg.FeedError) as exc:
            prog(**feeds)
        assert str(exc.value) == message(y, {"w": W, **feeds})
    np.testing.assert_allclose(prog(x=X, t=T), X @ W + T)  # still runs, natively
    assert prog.loop.startswith("native loop"), prog.loop
