"""Recomposition folds hand-spelled composites back into their op, computes the same values as
the spelled-out graph (float64 reference), and leaves look-alikes alone."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error
from tensor_graphs.rewrite.recompose import recompose

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 5, 16))
W = RNG.standard_normal(16)
Y = RNG.standard_normal((3, 5, 16))
FEEDS = {"x": X, "w": W, "y": Y}


def _x():
    return tg.input("x", (3, 5, 16), "float32")


def _w():
    return tg.weight("w", (16,), "float32")


def _ops(graph) -> set[str]:
    return {n.op.name for n in tg.nodes(graph if isinstance(graph, list) else [graph])}


def _folded(y, op: str, **attrs):
    """``y`` recomposed holds ``op`` (with ``attrs``) and computes what ``y`` computes."""
    out = recompose(tg.simplify(y))
    found = [n for n in tg.nodes(out) if n.op.name == op]
    assert found, sorted(_ops(out))
    for k, v in attrs.items():
        assert found[0].attrs[k] == v, found[0].attrs
    feeds = {n.name: FEEDS[n.name] for n in tg.nodes(y) if n.name in FEEDS}
    want = tg.evaluate(y, feeds, dtype="float64")
    got = tg.evaluate(out, feeds, dtype="float64")
    assert relative_error(got, want) <= 1e-6, relative_error(got, want)
    return out


def _untouched(y, op: str):
    out = recompose(tg.simplify(y))
    assert op not in _ops(out), sorted(_ops(out))


def _rms_spellings():
    x, w = _x(), _w()
    eps = 1e-6
    return {
        "pow-mean-rsqrt": w * (x * tg.rsqrt((x ** 2).mean(-1, keepdims=True) + eps)),
        "x*x": x * tg.rsqrt((x * x).mean(-1, keepdims=True) + eps) * w,
        "square": x * tg.rsqrt(tg.square(x).mean(-1, keepdims=True) + eps) * w,
        "sum/n": x * tg.rsqrt((x * x).sum(-1, keepdims=True) / 16.0 + eps) * w,
        "div-sqrt": x / tg.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w,
    }


@pytest.mark.parametrize("spelling", sorted(_rms_spellings()))
def test_rms_norm_spellings_fold_into_rms_norm(spelling):
    out = _folded(_rms_spellings()[spelling], "rms_norm", eps=1e-6)
    assert not {"pow", "mean", "rsqrt", "sqrt"} & _ops(out)


def test_gemma_style_one_plus_weight_is_the_weight():
    x, w = _x(), _w()
    y = x * tg.rsqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * (1.0 + w)
    out = _folded(y, "rms_norm")
    (node,) = [n for n in tg.nodes(out) if n.op.name == "rms_norm"]
    assert node.inputs[1].op.name == "add"  # rms_norm(x, 1 + w)


def test_rms_norm_without_weight_and_with_extra_factor():
    x = _x()
    y = tg.input("y", (3, 5, 16), "float32")
    plain = x * tg.rsqrt((x ** 2).mean(-1, keepdims=True) + 1e-5)
    _folded(plain, "rms_norm", eps=1e-5)
    _folded(plain * y, "rms_norm")  # the chain's other factor stays beside the norm


def test_input_that_is_itself_a_shared_product_folds():
    e = _x()
    x = e * 8.0  # Gemma scales embeddings: the norm's input is a product used twice
    y = x * tg.rsqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * _w() + x
    _folded(y, "rms_norm")


def test_rms_norm_look_alikes_stay():
    x, w = _x(), _w()
    # a mean over another axis, a cube instead of a square, a missing square root
    _untouched(x * tg.rsqrt((x ** 2).mean(1, keepdims=True) + 1e-6) * w, "rms_norm")
    _untouched(x * tg.rsqrt((x ** 3).mean(-1, keepdims=True) + 1e-6) * w, "rms_norm")
    _untouched(x * tg.reciprocal((x ** 2).mean(-1, keepdims=True) + 1e-6) * w, "rms_norm")
    _untouched(x * tg.rsqrt((x ** 2).sum(-1, keepdims=True) / 15.0 + 1e-6) * w, "rms_norm")


SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_tanh(x, c=SQRT_2_OVER_PI, k=0.044715):
    return 0.5 * x * (1.0 + tg.tanh(c * (x + k * x ** 3)))


def test_gpt2_tanh_gelu_formula_folds_into_gelu_tanh():
    out = _folded(_gelu_tanh(_x()), "gelu", approximate="tanh")
    assert not {"pow", "tanh"} & _ops(out)


def test_gelu_constant_rounded_to_float32_still_folds():
    c = float(np.float32(math.sqrt(2.0 / math.pi)))  # the constant as a float32 literal
    assert c != math.sqrt(2.0 / math.pi)
    _folded(_gelu_tanh(_x(), c=c), "gelu", approximate="tanh")


def test_gelu_look_alikes_stay():
    _untouched(_gelu_tanh(_x(), k=0.0447), "gelu")
    _untouched(_gelu_tanh(_x(), c=0.79), "gelu")
    x = _x()
    _untouched(0.5 * x * (1.0 + tg.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 2))),
               "gelu")


def test_erf_gelu_and_silu_fold():
    x = _x()
    _folded(0.5 * x * (1.0 + tg.erf(x / math.sqrt(2.0))), "gelu", approximate="none")
    _folded(x * tg.sigmoid(x), "silu")


def test_layer_norm_spelled_out_folds():
    x, w = _x(), _w()
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    _folded((x - mu) / tg.sqrt(var + 1e-5) * w, "layer_norm", eps=1e-5)


def test_rotate_half_rope_folds_into_rotary_embedding():
    x = tg.input("x", (1, 2, 5, 16), "float32")
    cos = tg.input("cos", (5, 16), "float32")
    sin = tg.input("sin", (5, 16), "float32")
    rotated = tg.concat([-x[..., 8:], x[..., :8]], axis=-1)
    y = x * cos + rotated * sin
    out = recompose(tg.simplify(y))
    assert "rotary_embedding" in _ops(out), sorted(_ops(out))
    feeds = {"x": RNG.standard_normal((1, 2, 5, 16)), "cos": RNG.standard_normal((5, 16)),
             "sin": RNG.standard_normal((5, 16))}
    assert relative_error(tg.evaluate(out, feeds, dtype="float64"),
                          tg.evaluate(y, feeds, dtype="float64")) <= 1e-12
    # the halves swapped the other way is another function
    wrong = tg.concat([x[..., 8:], -x[..., :8]], axis=-1)
    assert "rotary_embedding" not in _ops(recompose(tg.simplify(x * cos + wrong * sin)))


def test_planner_picks_fused_kernels_for_spelled_out_composites():
    x, w = _x(), _w()
    y = _gelu_tanh(x * tg.rsqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * w)
    prog = tg.compile(y, generate=False)  # generated: one row kernel for both (rowgen)
    roots = {s.node.op.name for s in prog.plan.steps}
    assert {"rms_norm", "gelu"} <= roots, roots
    got = prog(x=X.astype(np.float32), w=W.astype(np.float32))
    want = tg.evaluate(y, {"x": X, "w": W}, dtype="float64")
    assert relative_error(got, want) <= 1e-5
