"""Gradients of composites, driven by the op table's rows: the composites with their own rule
(softmax, log_softmax, layer_norm, rms_norm) and a selection differentiated through their
decomposition (attention, the activations, reductions, linear, embedding, losses), against
torch.autograd and finite differences in float64; and checks that the own rules are the ones
used (the backward reads the forward's softmax, not an exp/sum/div re-derivation).
"""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.grad_rules import COMPOSITE_VJP
from tests.autodiff.gradcheck import check_case
from tests.ops import optable as ot

torch = pytest.importorskip("torch")

#  row of the op table: the inputs differentiated (None: every float input)
ROWS = {
    "softmax": None,                 # own rule
    "softmax0": None,                # own rule, another axis
    "log_softmax": None,             # own rule
    "layer_norm": None,              # own rule, with and without weight and bias
    "layer_norm_magnitudes": None,   # own rule, values of 1e-3 and 1e6 (their own draws)
    "rms_norm": None,                # own rule, values up to 1e15 (their own draws)
    "scaled_dot_product_attention": None,  # decomposition: GQA, masks, causal
    "gelu": None,
    "gelu_tanh": None,
    "silu": None,
    "sigmoid": None,
    "tanh": None,
    "softplus": None,                # own rule (torch's 1/2 at 0)
    "softplus_beta": None,           # own rule, beta and threshold
    "abs": None,                     # own rule (torch's 0 at 0)
    "relu": None,                    # own rule (torch's 0 at 0)
    "clamp": None,                   # own rule (torch's g at the bounds)
    "clamp_min": None,
    "elu": None,                     # own rule (torch's alpha at 0)
    "elu_alpha": None,
    "mean_axis": None,
    "var_unbiased": None,
    "logsumexp": None,
    "linear": None,
    "embedding": None,
    "rotary_embedding": None,
    "cross_entropy": (0,),           # torch has no gradient for the class weights
    "mse_loss": (0, 1),
    "dropout": None,                 # own rule: the mask regenerated from the key (torch: where)
}
KEEP_DRAW = {"layer_norm_magnitudes", "rms_norm"}  # scales are the point


def _cases():
    out = []
    for name in ROWS:
        row = ot.BY_NAME[name]
        for spec in row.specs("float64"):
            if any(d == 0 for s in spec.shapes if s is not None for d in ot.concrete(s)):
                continue  # an empty tensor has nothing to check
            out.append(pytest.param(row, spec, id=f"{name}-{spec}"))
    return out


def _arrays(row, spec):
    drawn = ot.draw(row, spec, "float64")
    rng = ot.rng_for("grad", row.name, str(spec))
    if row.name in KEEP_DRAW:
        return drawn
    return [a if a is None or a.dtype.kind != "f" else rng.standard_normal(a.shape)
            for a in drawn]


@pytest.mark.parametrize("row,spec", _cases())
def test_composite_gradient(row, spec):
    arrays = _arrays(row, spec)
    floats = [i for i, a in enumerate(arrays) if a is not None and a.dtype.kind == "f"]
    wrt = floats if ROWS[row.name] is None else [i for i in ROWS[row.name] if i in floats]
    check_case(lambda *n: ot.build(row, spec, "float64", n), arrays, {}, wrt,
               lambda t, *ts: row.torch(t, *ts, **spec.kwargs),
               tol=1e-8, seed_key=ot.rng_for(row.name, str(spec)).integers(1 << 30))


@pytest.mark.parametrize("op", sorted(COMPOSITE_VJP))
def test_own_rules_have_rows(op):
    assert any(ot.BY_NAME[name].op == op for name in ROWS)


def test_softmax_backward_reads_the_forward_output():
    """softmax's rule: y * (g - sum(g y)); no exp or max of x in the backward."""
    x = tg.input("x", (4, 9), "float64")
    y = tg.softmax(x, axis=-1)
    (gx,) = tg.grad(y, [x], seed=tg.input("g", (4, 9), "float64"))
    ops = [n.op.name for n in tg.nodes(gx)]
    assert "softmax" in ops and "exp" not in ops and "max" not in ops, ops


_KEY = np.array([5, 0], np.int64)


def _dropped(shape):
    from tensor_graphs.ir.ops.random import bits_reference, threshold

    n = int(np.prod(shape))
    return (bits_reference(_KEY, n, 0) < threshold(0.3)).reshape(tuple(shape))


#  composite with its own rule: (build from x, the same in torch, the mean of x's rows);
#  x is (64, 256) float32
OWN = {
    "layer_norm": (tg.layer_norm, lambda torch, t: torch.nn.functional.layer_norm(t, (256,)),
                   100.0),
    "rms_norm": (tg.rms_norm, lambda torch, t: torch.nn.functional.rms_norm(t, (256,)), 100.0),
    "softmax": (lambda x: tg.softmax(x * 30.0), lambda torch, t: torch.softmax(t * 30.0, -1),
                100.0),
    "log_softmax": (lambda x: tg.log_softmax(x * 30.0),
                    lambda torch, t: torch.log_softmax(t * 30.0, -1), 100.0),
    # q = k = v: x as (2, 4, 32, 64), causal
    "scaled_dot_product_attention": (
        lambda x: tg.scaled_dot_product_attention(*[x.reshape(2, 4, 32, 64)] * 3,
                                                  is_causal=True).reshape(64, 256),
        lambda torch, t: torch.nn.functional.scaled_dot_product_attention(
            *[t.reshape(2, 4, 32, 64)] * 3, is_causal=True).reshape(64, 256), 0.0),
    # the activations with torch's values at their kinks (their rules: ir/grad_rules.py)
    "abs": (tg.abs, lambda torch, t: t.abs(), 0.0),
    "relu": (tg.relu, lambda torch, t: torch.relu(t), 0.0),
    "clamp": (lambda x: tg.clamp(x, min=-0.5, max=0.5),
              lambda torch, t: t.clamp(-0.5, 0.5), 0.0),
    "softplus": (tg.softplus, lambda torch, t: torch.nn.functional.softplus(t), 0.0),
    "elu": (tg.elu, lambda torch, t: torch.nn.functional.elu(t), 0.0),
    # of x * x (a backward that reads x), a fixed key: torch's where over the same mask
    "dropout": (lambda x: tg.dropout(x * x, 0.3, tg.constant(_KEY), stream=0),
                lambda torch, t: torch.where(torch.from_numpy(_dropped(t.shape)), 0.0,
                                             t * t / 0.7), 0.0),
}


# rules that are not smaller but one node a fused kernel runs in one pass (the mask drawn
# again as it scales: c_dropout), where the decomposition's backward is words, select, scale
ONE_PASS = {"dropout"}
# rules kept for torch's value at a kink, where the decomposition's differs; no larger
KINKS = {"abs", "relu", "clamp", "softplus", "elu"}


def _float32_backward(build, xs, g):
    x = tg.input("x", xs.shape)
    (gx,) = tg.grad(build(x), [x], seed=tg.input("g", xs.shape))
    return tg.evaluate(gx, {"x": xs, "g": g}), len(tg.nodes(tg.decompose(gx)))


@pytest.mark.parametrize("op", sorted(OWN))
def test_own_rule_is_smaller_and_as_accurate_as_the_decomposition(op, monkeypatch):
    """In float32 against torch's float64 gradient: the own rule's backward has fewer values
    (layer_norm 26 nodes vs 35 through its decomposition, softmax 17 vs 29, attention with a
    bool mask 49 vs 72) and an error no worse than the decomposition's."""
    assert op in COMPOSITE_VJP and sorted(OWN) == sorted(COMPOSITE_VJP)
    build, torch_fn, offset = OWN[op]
    rng = np.random.default_rng(5)
    xs = (offset + rng.standard_normal((64, 256))).astype(np.float32)
    g = rng.standard_normal((64, 256)).astype(np.float32)
    t = torch.tensor(xs.astype(np.float64), requires_grad=True)
    (ref,) = torch.autograd.grad(torch_fn(torch, t), [t],
                                 grad_outputs=torch.tensor(g, dtype=torch.float64))
    own, own_nodes = _float32_backward(build, xs, g)
    monkeypatch.delitem(COMPOSITE_VJP, op)
    dec, dec_nodes = _float32_backward(build, xs, g)
    own_err = tg.numerics.relative_error(own, ref.numpy())
    dec_err = tg.numerics.relative_error(dec, ref.numpy())
    assert own_nodes < dec_nodes or (op in ONE_PASS and own_nodes == dec_nodes) \
        or (op in KINKS and own_nodes <= dec_nodes), (own_nodes, dec_nodes)
    assert own_err <= 2 * dec_err + 1e-6, (own_err, dec_err)


# (our graph of x, torch's): at kinks, ties and zeros, where a decomposition's derivative
# differed from torch's (softplus'(0) was 0, abs'(0) 1, relu'(0) 1/2, clamp's bounds 1/2) or
# was nan (sqrt of a relu, through maximum's 0/1 weight times sqrt's inf)
KINK_CASES = {
    "abs": (tg.abs, lambda torch, t: t.abs()),
    "relu": (tg.relu, lambda torch, t: torch.relu(t)),
    "clamp": (lambda x: tg.clamp(x, min=-1.0, max=1.0), lambda torch, t: t.clamp(-1.0, 1.0)),
    "softplus": (tg.softplus, lambda torch, t: torch.nn.functional.softplus(t)),
    "softplus_beta": (lambda x: tg.softplus(x, beta=2.0, threshold=2.0),
                      lambda torch, t: torch.nn.functional.softplus(t, 2.0, 2.0)),
    "elu": (tg.elu, lambda torch, t: torch.nn.functional.elu(t)),
    "log_sigmoid": (lambda x: -tg.softplus(-x),
                    lambda torch, t: torch.nn.functional.logsigmoid(t)),
    "sqrt_relu": (lambda x: tg.sqrt(tg.relu(x)), lambda torch, t: torch.sqrt(torch.relu(t))),
}


@pytest.mark.parametrize("name", sorted(KINK_CASES))
def test_gradients_at_kinks_and_zeros_are_torchs(name):
    build, torch_fn = KINK_CASES[name]
    xs = np.array([-2.0, -1.0, -0.5, 0.0, 0.0, 0.5, 1.0, 2.0, 25.0])
    g = np.linspace(0.5, 1.5, xs.size)
    x = tg.input("x", xs.shape, "float64")
    (gx,) = tg.grad(build(x), [x], seed=tg.input("g", xs.shape, "float64"))
    got = tg.evaluate(gx, {"x": xs, "g": g})
    t = torch.tensor(xs, requires_grad=True)
    (ref,) = torch.autograd.grad(torch_fn(torch, t), [t], grad_outputs=torch.tensor(g))
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-12, atol=0)
