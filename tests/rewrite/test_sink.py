"""Reshapes sink below pointwise ops, computing the same values (float64 reference), and stay
above everything that is not pointwise."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error
from tensor_graphs.rewrite.sink import pointwise, sink_reshapes

RNG = np.random.default_rng(0)


def _x(shape=(2, 6, 8)):
    return tg.input("x", shape, "float32")


@pytest.mark.parametrize("fn", [tg.exp, tg.tanh, tg.sigmoid, tg.silu, tg.gelu,
                                lambda v: tg.gelu(v, approximate="tanh"), tg.relu, tg.erf,
                                lambda v: v.astype("float64")])
def test_pointwise_ops_are_recognised(fn):
    assert pointwise(fn(_x()))


@pytest.mark.parametrize("fn", [lambda v: tg.softmax(v, axis=-1),
                                lambda v: tg.layer_norm(v),
                                lambda v: tg.sum(v, axis=1),
                                lambda v: v + tg.input("y", (2, 6, 8), "float32"),
                                lambda v: v * tg.constant(np.arange(8.0, dtype=np.float32)),
                                lambda v: tg.reshape(v, (12, 8))])
def test_other_ops_are_not_pointwise(fn):
    assert not pointwise(fn(_x()))


def test_a_gemm_activation_after_a_view_meets_its_gemm():
    """GPT-2's Conv1D: addmm on a 2-D view, viewed back, GELU, viewed 2-D for the next addmm.
    After sinking the GELU reads the addmm and the two views are gone."""
    x = _x((2, 6, 8))
    w1, b1 = tg.weight("w1", (8, 16), "float32"), tg.weight("b1", (16,), "float32")
    w2 = tg.weight("w2", (16, 8), "float32")
    h = tg.reshape(tg.reshape(x, (12, 8)) @ w1 + b1, (2, 6, 16))
    act = tg.gelu(h, approximate="tanh")
    out = tg.reshape(tg.reshape(act, (12, 16)) @ w2, (2, 6, 8))
    sunk = sink_reshapes(out)
    gelu = next(n for n in tg.nodes(sunk) if n.op.name == "gelu")
    assert gelu.inputs[0].op.name == "add" and gelu.shape == (12, 16)
    assert sum(n.op.name == "reshape" for n in tg.nodes(sunk)) == 2  # x's view, the result's
    feeds = {"x": RNG.standard_normal((2, 6, 8)), "w1": RNG.standard_normal((8, 16)),
             "b1": RNG.standard_normal(16), "w2": RNG.standard_normal((16, 8))}
    ref = tg.evaluate(out, feeds, dtype="float64")
    assert relative_error(tg.evaluate(sunk, feeds, dtype="float64"), ref) < 1e-15


def test_non_pointwise_ops_keep_their_reshape():
    x = _x()
    r = tg.reshape(x, (12, 8))
    out = tg.softmax(r, axis=-1)
    assert sink_reshapes(out) is out


def test_a_reshape_used_elsewhere_stays_for_its_other_users():
    x = _x()
    r = tg.reshape(x, (12, 8))
    outs = sink_reshapes([tg.exp(r), tg.softmax(r, axis=-1)])
    assert outs[0].op.name == "reshape" and outs[0].inputs[0].op.name == "exp"
    assert outs[1].inputs[0] is r
    feeds = {"x": RNG.standard_normal((2, 6, 8))}
    for got, want in zip(outs, [tg.exp(r), tg.softmax(r, axis=-1)]):
        np.testing.assert_array_equal(tg.evaluate(got, feeds), tg.evaluate(want, feeds))


def test_symbolic_shapes_sink_too():
    x = tg.input("x", ("seq", 8), "float32")
    r = tg.reshape(x, (1, x.shape[0], 8))
    out = sink_reshapes(tg.silu(r))
    assert out.op.name == "reshape" and out.inputs[0].op.name == "silu"
    assert out.shape == r.shape


def test_a_residual_add_after_a_view_reads_its_gemm():
    """GPT-2's residual: h + addmm(...).view(batch, seq, n). Sunk, the add reads the product
    (fusable into its GEMM) and the residual stream takes the inverse view."""
    x = _x((2, 6, 8))
    w, b = tg.weight("w", (8, 8), "float32"), tg.weight("b", (8,), "float32")
    mm = tg.reshape(x, (12, 8)) @ w + b
    h1 = x + tg.reshape(mm, (2, 6, 8))
    h2 = tg.reshape(tg.reshape(h1, (12, 8)) @ w + b, (2, 6, 8)) + h1
    sunk = sink_reshapes(h2)
    assert sunk.op.name == "reshape" and sunk.inputs[0].op.name == "add"
    adds = [n for n in tg.nodes(sunk) if n.op.name == "add" and n.shape == (12, 8)
            and any(i.op.name == "add" and i.inputs[0].op.name == "matmul" or
                    i.op.name == "add" and i.inputs[1].op.name == "matmul" for i in n.inputs)]
    assert len(adds) == 2  # both residual adds read their product's bias add directly
    feeds = {"x": RNG.standard_normal((2, 6, 8)), "w": RNG.standard_normal((8, 8)),
             "b": RNG.standard_normal(8)}
    ref = tg.evaluate(h2, feeds, dtype="float64")
    assert relative_error(tg.evaluate(sunk, feeds, dtype="float64"), ref) < 1e-15


@pytest.mark.parametrize("other", [
    lambda: tg.permute(tg.input("y", (2, 8, 6), "float32"), (0, 2, 1)),  # strided: would copy
    lambda: tg.input("y", (8,), "float32"),                              # broadcast
])
def test_binary_sinking_keeps_strided_and_broadcast_operands(other):
    out = tg.reshape(tg.input("x", (12, 8), "float32"), (2, 6, 8)) * other()
    assert sink_reshapes(out) is out


def test_a_reshape_that_removes_axes_does_not_sink_through_a_binary_op():
    x = tg.input("x", (2, 6, 8), "float32")
    out = tg.reshape(x, (12, 8)) + tg.input("y", (12, 8), "float32")
    assert sink_reshapes(out) is out


def test_a_reshaped_operand_that_broadcasts_does_not_sink():
    x = tg.input("x", (2, 6, 6), "float32")
    out = tg.reshape(x, (2, 1, 6, 6)) + tg.input("y", (2, 4, 6, 6), "float32")
    assert sink_reshapes(out) is out


@pytest.mark.parametrize("keepdims", [True, False])
def test_a_reduction_over_an_axis_of_size_one_keeps_its_reshape(keepdims):
    """``prod`` over the one axis of a 0-d tensor made 1-d decomposes to elementwise ops (the
    axis has size 1), but its ``axis`` names an axis the 0-d tensor lacks: moved past the
    reshape it raised a ShapeError (torch's ``prod(x, 0, keepdim=True)`` of a 0-d x)."""
    x = tg.input("x", (), "float32")
    y = tg.prod(tg.reshape(x, (1,)), axis=0, keepdims=keepdims)
    assert not pointwise(y)
    (out,) = sink_reshapes((y,))
    value = np.array(1.5, dtype=np.float32)
    got = tg.compile(out, db=":memory:")(x=value)
    ref = np.prod(value.reshape(1), axis=0, keepdims=keepdims)
    assert got.shape == y.shape == ref.shape and relative_error(got, ref) == 0
