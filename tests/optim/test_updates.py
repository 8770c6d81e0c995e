"""The optimizers' graphs without torch: what ``update`` returns, the states it asks for, its
errors (each names the optimizer, the parameter and the fix), and an SGD step by hand."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.ops.names import STATE_UPDATE


def _params(dtype="float32"):
    return {"w": tg.state("w", (3, 2), dtype), "b": tg.state("b", (2,), dtype)}


def _grads(dtype="float32"):
    return {"w": tg.input("gw", (3, 2), dtype), "b": tg.input("gb", (2,), dtype)}


def test_adam_states_and_their_initial_values():
    up = tg.optim.Adam(0.01).update(_params(), _grads())
    assert set(up.states) == {"w", "b", "optim.w.exp_avg", "optim.w.exp_avg_sq",
                              "optim.b.exp_avg", "optim.b.exp_avg_sq", "optim.step"}
    assert all(n.op.name == STATE_UPDATE for n in up.outputs)
    assert set(up.params) == {"w", "b"} and up.params["w"] is up.states["w"]
    init = up.state_init()
    assert set(init) == {"optim.lr", "optim.step", "optim.w.exp_avg", "optim.w.exp_avg_sq",
                         "optim.b.exp_avg", "optim.b.exp_avg_sq"}
    assert init["optim.lr"].dtype == np.float32 and init["optim.lr"][0] == np.float32(0.01)
    assert init["optim.step"].tolist() == [0] and init["optim.step"].dtype == np.float32
    assert init["optim.w.exp_avg"].shape == (3, 2) and not init["optim.w.exp_avg"].any()
    init["optim.w.exp_avg"][0, 0] = 5  # a copy each time: binding twice starts from zero again
    assert not up.state_init()["optim.w.exp_avg"].any()


def test_sgd_without_momentum_keeps_no_buffer_and_prefix_names_states():
    up = tg.optim.SGD(0.1, prefix="opt2/").update(_params(), _grads())
    assert set(up.states) == {"w", "b", "opt2/step"} and up.lr == "opt2/lr"


def test_float64_parameters_get_a_float64_learning_rate():
    up = tg.optim.SGD(0.1).update(_params("float64"), _grads("float64"))
    assert up.lr_dtype == tg.float64 and up.lr_value(0.2)["optim.lr"].dtype == np.float64


def test_sgd_step_by_hand_and_a_parameter_without_gradient_stays():
    """Two steps of momentum SGD against the formula; ``b`` has no gradient and keeps its
    value, as torch.optim skips a parameter whose .grad is None."""
    params = _params("float64")
    up = tg.optim.SGD(0.5, momentum=0.9).update(params, {"w": tg.input("gw", (3, 2),
                                                                       "float64")})
    assert "b" not in up.states and "optim.b.momentum_buffer" not in up.init
    prog = tg.compile(up.outputs)
    w0 = np.arange(6.0).reshape(3, 2)
    prog.bind(w=w0, **up.state_init())
    g1, g2 = np.full((3, 2), 1.0), np.full((3, 2), 2.0)
    prog(gw=g1)
    prog(gw=g2)
    buf = 0.9 * g1 + g2
    np.testing.assert_allclose(prog.state("w"), w0 - 0.5 * g1 - 0.5 * buf, rtol=1e-12)
    np.testing.assert_allclose(prog.state("optim.w.momentum_buffer"), buf, rtol=1e-12)
    assert prog.state("optim.step").tolist() == [2]


@pytest.mark.parametrize("build, error, words", [
    (lambda: tg.optim.SGD(-1.0), tg.ArgumentError, "learning rate"),
    (lambda: tg.optim.SGD(0.1, nesterov=True), tg.ArgumentError, "nesterov needs momentum"),
    (lambda: tg.optim.SGD(0.1, momentum=0.9, dampening=0.1, nesterov=True), tg.ArgumentError,
     "dampening 0"),
    (lambda: tg.optim.SGD(0.1, momentum=-0.5), tg.ArgumentError, "momentum"),
    (lambda: tg.optim.Adam(0.1, betas=(0.9, 1.0)), tg.ArgumentError, "beta at index 1"),
    (lambda: tg.optim.AdamW(0.1, eps=-1.0), tg.ArgumentError, "eps"),
    (lambda: tg.optim.Adam(0.1, weight_decay=-0.1), tg.ArgumentError, "weight_decay"),
])
def test_invalid_hyperparameters(build, error, words):
    with pytest.raises(error, match=words):
        build()


@pytest.mark.parametrize("params, grads, error, words", [
    ({"w": tg.weight("w", (3, 2))}, {"w": tg.input("gw", (3, 2))}, tg.ArgumentError,
     "parameter 'w' is a weight; parameters must be tg.state"),
    ({"w": tg.state("w", ("n", 2))}, {"w": tg.input("gw", ("n", 2))}, tg.ShapeError,
     "symbolic shape"),
    ({"w": tg.state("w", (3,), "int64")}, {"w": tg.input("gw", (3,), "int64")}, tg.DTypeError,
     "only float parameters"),
    ({"w": tg.state("w", (3, 2))}, {"w": tg.input("gw", (2, 3))}, tg.ShapeError,
     r"gradient of 'w' has shape \(2, 3\), the parameter \(3, 2\)"),
    ({"w": tg.state("w", (3, 2))}, {"w": tg.input("gw", (3, 2), "float64")}, tg.DTypeError,
     "cast the gradient"),
    ({"w": tg.state("w", (3, 2))}, {"v": tg.input("gv", (3, 2))}, tg.ArgumentError,
     r"gradients \['v'\] have no parameter"),
    ({"w": tg.state("w", (3, 2))}, {}, tg.ArgumentError, "no gradients given"),
    ({"w": tg.state("w", (3, 2)), "w2": tg.state("w", (3, 2))},
     {"w": tg.input("gw", (3, 2))}, tg.ArgumentError, "same state 'w'"),
    ({"w": tg.state("w", (3, 2))}, {"w": np.zeros((3, 2), np.float32)}, tg.ArgumentError,
     "give a graph node"),
    ({"s": tg.state("s", ())}, {"s": tg.input("gs", ())}, tg.ShapeError,
     r"parameter 's' is 0-d.*tg.state\('s', \(1,\), 'float32'\).*tg.Trainer"),
])
def test_update_errors_name_the_parameter_and_the_fix(params, grads, error, words):
    with pytest.raises(error, match=words) as info:
        tg.optim.Adam(0.1).update(params, grads)
    assert str(info.value).startswith("Adam.update:")


def test_lr_value_checks_the_rate():
    up = tg.optim.SGD(0.1).update(_params(), _grads())
    with pytest.raises(tg.ArgumentError, match="learning rate"):
        up.lr_value(float("nan"))
