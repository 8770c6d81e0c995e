"""``stop_gradient`` (tensor_graphs/ir/ops/gradient.py), torch's ``detach``: its value is its
input, bit for bit in every dtype (the op table's "gradient" rows, against numpy and torch),
and no gradient flows through it, as none flows through ``detach`` (a straight-through
estimator, a detached norm, a stop-gradient target: against torch.autograd in float64,
||got - ref|| / ||ref||). Compiling drops the mark (simplify), so a program plans as if it were
not there; it is saved and loaded with the graph."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.grad_rules import NON_DIFFERENTIABLE, zeros
from tensor_graphs.numerics import relative_error
from tests.ops import optable as ot

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("row,dtype", ot.params("gradient"))
def test_the_value_is_the_input(row, dtype):
    ot.check_oracle(row, dtype)


@pytest.mark.parametrize("row,dtype", ot.params("gradient", torch=True))
def test_the_value_is_torchs(row, dtype):
    ot.check_torch(row, dtype, torch)


def _data(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((6, 5)), "w": rng.standard_normal((5, 4)),
            "g": rng.standard_normal((6, 4))}


def _grads(build, data) -> list[np.ndarray]:
    """tg.grad of <g, build(x @ w)> with respect to x and w, in float64."""
    x, w = tg.input("x", (6, 5), "float64"), tg.input("w", (5, 4), "float64")
    seed = tg.input("g", (6, 4), "float64")
    return tg.evaluate(tg.grad(build(x @ w), [x, w], seed=seed), data)


def _torch_grads(build, data) -> list[np.ndarray]:
    x, w = (torch.tensor(data[k], requires_grad=True) for k in ("x", "w"))
    out = build(x @ w)
    return [t.numpy() for t in torch.autograd.grad(out, [x, w], torch.tensor(data["g"]))]


# (ours of h, torch's of h): models that mark with detach
DETACHED = {
    # a straight-through round: the forward rounds, the backward is the identity
    "straight_through": (lambda h: h + tg.stop_gradient(tg.round(h * 4.0) / 4.0 - h),
                         lambda h: h + (torch.round(h * 4.0) / 4.0 - h).detach()),
    # rows divided by their norm taken as a constant
    "detached_norm": (lambda h: h / tg.stop_gradient(tg.sqrt((h * h).sum(-1, keepdims=True))),
                      lambda h: h / h.norm(dim=-1, keepdim=True).detach()),
    # a stop-gradient target: only the first factor is differentiated
    "target": (lambda h: h * tg.tanh(tg.stop_gradient(h)), lambda h: h * torch.tanh(h.detach())),
    # a stop on one path, the other around it
    "around": (lambda h: tg.exp(tg.stop_gradient(h)) * h + h * h,
               lambda h: torch.exp(h.detach()) * h + h * h),
}


@pytest.mark.parametrize("name", sorted(DETACHED))
def test_gradients_through_stop_gradient_are_torchs_through_detach(name):
    ours, theirs = DETACHED[name]
    data = _data()
    got, ref = _grads(ours, data), _torch_grads(theirs, data)
    for g, r in zip(got, ref):
        assert relative_error(g, r) <= 1e-12, name


def test_stop_gradient_passes_nothing_and_is_declared():
    """No cotangent reaches what only a stop_gradient reads (tg.grad's zeros); the rule tables
    say so, so the sweep never enters its identity. Any dtype may be marked."""
    x = tg.input("x", (3,), "float64")
    (g,) = tg.grad((tg.stop_gradient(x) * x).sum(), [x])
    np.testing.assert_array_equal(tg.evaluate(g, {"x": np.array([1.0, -2.0, 3.0])}),
                                  [1.0, -2.0, 3.0])
    (none,) = tg.grad(tg.stop_gradient(tg.exp(x)).sum(), [x])
    assert none is zeros((3,), tg.float64)
    assert "stop_gradient" in NON_DIFFERENTIABLE
    assert tg.stop_gradient(tg.input("ids", (3,), "int64")).dtype == tg.int64


def test_compiled_gradients_match_and_the_mark_is_dropped():
    """A step's gradients compiled agree with the interpreter's; the program is planned from
    the graph without the mark (simplify drops it), as if written without it."""
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((6, 5)), "w": rng.standard_normal((5, 4))}
    x, w = tg.input("x", (6, 5), "float64"), tg.input("w", (5, 4), "float64")
    h = x @ w
    loss = (h * tg.stop_gradient(tg.tanh(h))).sum()
    grads = tg.grad(loss, [x, w])
    want = tg.evaluate([loss, *grads], feeds)
    prog = tg.compile([loss, *grads], db=":memory:")
    for a, b in zip(prog(**feeds), want):
        assert relative_error(a, b) <= 1e-12
    assert "stop_gradient" not in {n.op.name for n in tg.nodes(tg.simplify([loss, *grads]))}
    assert tg.simplify(loss) is tg.simplify((h * tg.tanh(h)).sum())


def test_the_mark_is_saved_and_loaded(tmp_path):
    """The mark travels with the graph: the loaded graph's gradient is the saved one's."""
    x = tg.input("x", (4,), "float64")
    y = (x * tg.stop_gradient(tg.exp(x))).sum()
    path = tmp_path / "marked.json"
    tg.save(y, path)
    loaded = tg.load(path)
    xs = np.array([0.5, -1.0, 2.0, 0.0])
    (ga,) = tg.evaluate(tg.grad(y, [x]), {"x": xs})
    (gb,) = tg.evaluate(tg.grad(loaded, [tg.input("x", (4,), "float64")]), {"x": xs})
    np.testing.assert_array_equal(ga, gb)
    np.testing.assert_allclose(ga, np.exp(xs), rtol=1e-15)
