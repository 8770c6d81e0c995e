"""Dropout's own gradient rule: the cotangent goes through the same mask, drawn again from the
same key and stream (no mask stored), checked against a central finite difference with the
key fixed (the mask then is), exactly against the mask times 1 / (1 - p), and compiled."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.grad_rules import COMPOSITE_VJP
from tensor_graphs.ir.ops.random import bits_reference, threshold
from tensor_graphs.numerics import relative_error

KEY = np.array([1234567, 89])


def _model(p):
    x = tg.input("x", (6, 17), "float64")
    w = tg.input("w", (17, 5), "float64")
    r = tg.rng(0)
    h = tg.dropout(tg.tanh(x @ w), p, r)
    return x, w, tg.sum(tg.dropout(h, p, r) * h), r


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_gradient_matches_a_finite_difference_with_the_mask_fixed(p):
    x, w, loss, r = _model(p)
    rng = np.random.default_rng(7)
    feeds = {"x": rng.standard_normal((6, 17)), "w": rng.standard_normal((17, 5)) * 0.3,
             "rng": KEY}
    gx, gw = tg.evaluate(tg.grad(loss, [x, w]), feeds)
    for name, g in (("x", gx), ("w", gw)):
        v = rng.standard_normal(feeds[name].shape)
        eps = 1e-6
        up = tg.evaluate(loss, {**feeds, name: feeds[name] + eps * v})
        down = tg.evaluate(loss, {**feeds, name: feeds[name] - eps * v})
        fd = (up - down) / (2 * eps)
        assert relative_error(np.array([np.sum(g * v)]), np.array([fd])) < 1e-7, name


def test_gradient_is_the_same_mask_times_the_scale_and_regenerates_it():
    assert "dropout" in COMPOSITE_VJP
    x = tg.input("x", (4, 33), "float64")
    seed = tg.input("g", (4, 33), "float64")
    y = tg.dropout(x, 0.3, tg.state("rng", (2,), "int64"), stream=5)
    (gx,) = tg.grad(y, [x], seed=seed)
    # the backward is one dropout of the cotangent on the same key and stream, not a stored mask
    assert gx.op.name == "dropout" and gx.inputs[0] is seed and gx.inputs[1] is y.inputs[1]
    assert gx.attrs == y.attrs
    g = np.random.default_rng(0).standard_normal((4, 33))
    got = tg.evaluate(gx, {"g": g, "rng": KEY})
    keep = (bits_reference(KEY, g.size, 5) >= threshold(0.3)).reshape(g.shape)
    assert np.array_equal(got, np.where(keep, g * (1 / 0.7), 0.0))


def test_identity_and_zero_gradients():
    x = tg.input("x", (3,), "float64")
    (g_eval,) = tg.grad(tg.sum(tg.dropout(x, 0.5, training=False)), [x])
    (g_zero,) = tg.grad(tg.sum(tg.dropout(x, 1.0, tg.rng())), [x])
    assert tg.evaluate(g_eval, {}).tolist() == [1.0, 1.0, 1.0]
    assert tg.evaluate(g_zero, {}).tolist() == [0.0, 0.0, 0.0]


def test_compiled_forward_and_backward_draw_one_mask():
    x, w, loss, r = _model(0.4)
    grads = tg.grad(loss, [x, w])
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((6, 17)), "w": rng.standard_normal((17, 5))}
    prog = tg.compile([loss, *grads])
    prog.bind(rng=KEY)
    got = prog(**feeds)
    want = tg.evaluate([loss, *grads], {**feeds, "rng": KEY})
    for a, b in zip(got, want):
        assert relative_error(np.asarray(a), b) < 1e-12
