"""Hypothesis builds random expression graphs (elementwise ops, composites, reductions,
reshapes, permutes, slices, matmul, where, concat, pad) next to the same expression computed
directly in numpy (float64); tg.evaluate must agree to a norm-wise relative error of 1e-9."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error as _rel_err

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _close(got, ref, tol: float) -> bool:
    """Norm-wise relative error within ``tol``; a reference that is zero up to rounding
    (logsumexp of a log_softmax, say) is compared absolutely instead."""
    return _rel_err(got, ref) <= tol or float(np.max(np.abs(got - ref), initial=0)) <= 1e-12


def _sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def _softmax(a, axis):
    e = np.exp(a - a.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _logsumexp(a, axis):
    m = a.max(axis, keepdims=True)
    return (np.log(np.exp(a - m).sum(axis, keepdims=True)) + m).squeeze(axis)


UNARY = {
    "neg": (lambda x: -x, np.negative),
    "tanh": (tg.tanh, np.tanh),
    "sigmoid": (tg.sigmoid, _sigmoid),
    "sin": (tg.sin, np.sin),
    "cos": (tg.cos, np.cos),
    "relu": (tg.relu, lambda a: np.maximum(a, 0)),
    "abs": (abs, np.abs),
    "exp_tanh": (lambda x: tg.exp(tg.tanh(x)), lambda a: np.exp(np.tanh(a))),
    "gelu": (tg.gelu, lambda a: a * 0.5 * (1 + _erf(a / math.sqrt(2)))),
    "silu": (tg.silu, lambda a: a * _sigmoid(a)),
    "softplus": (tg.softplus, lambda a: np.where(a > 20, a, np.log1p(np.exp(np.minimum(a, 20))))),
    "square": (tg.square, np.square),
    "sqrt_abs": (lambda x: tg.sqrt(abs(x)), lambda a: np.sqrt(np.abs(a))),
    "affine": (lambda x: x * 0.5 - 1.25, lambda a: a * 0.5 - 1.25),
    "erf": (tg.erf, _erf),
}
BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "div": (lambda a, b: a / (b * b + 1.0), lambda a, b: a / (b * b + 1.0)),
    "maximum": (tg.maximum, np.maximum),
    "minimum": (tg.minimum, np.minimum),
    "where": (lambda a, b: tg.where(tg.less(a, 0.25), a, b),
              lambda a, b: np.where(a < 0.25, a, b)),
    "pow": (lambda a, b: abs(a) ** tg.tanh(b), lambda a, b: np.abs(a) ** np.tanh(b)),
}
LEAF_SHAPES = [(3, 4), (4,), (1, 4), (3, 1), (4, 5), (2, 3, 4), ()]


def _apply_step(data, pool):
    """Draw one operation, apply it to operands from the pool; returns (node, array) or None."""
    kind = data.draw(st.sampled_from(["unary", "unary", "binary", "binary", "reduce", "move",
                                      "matmul", "softmax", "concat", "index"]))
    pick = lambda: pool[data.draw(st.integers(0, len(pool) - 1))]  # noqa: E731
    x, a = pick()
    if kind == "unary":
        name = data.draw(st.sampled_from(sorted(UNARY)))
        fn, ref = UNARY[name]
        return fn(x), ref(a)
    if kind == "binary":
        y, b = pick()
        try:
            np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            return None
        fn, ref = BINARY[data.draw(st.sampled_from(sorted(BINARY)))]
        return fn(x, y), ref(a, b)
    if kind == "matmul":
        y, b = pick()
        if a.ndim == 0 or b.ndim == 0:
            return None
        if a.shape[-1] != (b.shape[-2] if b.ndim > 1 else b.shape[0]):
            return None
        try:
            return x @ y, a @ b
        except ValueError:
            return None
    if a.ndim == 0:
        return None
    axis = data.draw(st.integers(-a.ndim, a.ndim - 1))
    if kind == "reduce":
        keep = data.draw(st.booleans())
        which = data.draw(st.sampled_from(["sum", "max", "mean", "min", "logsumexp", "var"]))
        if which == "logsumexp":
            out = tg.logsumexp(x, axis=axis, keepdims=keep)
            ref = _logsumexp(a, axis)
            return out, (np.expand_dims(ref, axis) if keep else ref)
        if which == "var":
            return tg.var(x, axis=axis, keepdims=keep), a.var(axis, keepdims=keep)
        return getattr(x, which)(axis, keep), getattr(a, which)(axis, keepdims=keep)
    if kind == "softmax":
        if data.draw(st.booleans()):
            return tg.softmax(x, axis=axis), _softmax(a, axis)
        return tg.log_softmax(x, axis=axis), np.log(_softmax(a, axis))
    if kind == "move":
        which = data.draw(st.sampled_from(["reshape", "permute", "slice", "pad", "flip", "T"]))
        if which == "reshape":
            target = data.draw(st.sampled_from([(-1,), (1, -1), (-1, 1), (a.shape[0], -1)]))
            return x.reshape(target), a.reshape(target)
        if which == "permute":
            perm = data.draw(st.permutations(range(a.ndim)))
            return x.permute(*perm), a.transpose(perm)
        if which == "T":
            return x.T, a.T
        if which == "flip":
            index = (slice(None),) * (axis % a.ndim) + (slice(None, None, -1),)
            return x[index], a[index]
        if which == "pad":
            lo, hi = data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))
            value = data.draw(st.sampled_from([0.0, -1.5]))
            return (tg.pad(x, (lo, hi), value=value),
                    np.pad(a, [(0, 0)] * (a.ndim - 1) + [(lo, hi)], constant_values=value))
        n = a.shape[axis]
        start = data.draw(st.integers(0, max(n - 1, 0)))
        step = data.draw(st.sampled_from([1, 2]))
        index = (slice(None),) * (axis % a.ndim) + (slice(start, None, step),)
        return x[index], a[index]
    if kind == "concat":
        y, b = pick()
        ax = axis % a.ndim
        if b.ndim != a.ndim or any(p != q for i, (p, q) in enumerate(zip(a.shape, b.shape))
                                   if i != ax):
            return None
        return tg.concat([x, y], axis=ax), np.concatenate([a, b], axis=ax)
    i = data.draw(st.integers(-a.shape[0], a.shape[0] - 1)) if a.shape[0] else None
    if i is None:
        return None
    return x[i], a[i]




@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_graph_matches_numpy(data):
    n_leaves = data.draw(st.integers(1, 3))
    pool, feeds = [], {}
    for k in range(n_leaves):
        shape = data.draw(st.sampled_from(LEAF_SHAPES))
        seed = data.draw(st.integers(0, 2**32 - 1))
        value = np.random.default_rng(seed).standard_normal(shape)
        node = tg.input(f"x{k}", shape, "float64")
        pool.append((node, value))
        feeds[f"x{k}"] = value
    steps = data.draw(st.integers(1, 8))
    with np.errstate(all="ignore"):
        for _ in range(steps):
            made = _apply_step(data, pool)
            if made is None:
                continue
            node, ref = made
            ref = np.asarray(ref, np.float64)
            assert node.shape == ref.shape, (node, ref.shape)
            if np.isfinite(ref).all() and np.abs(ref).max(initial=0) < 1e6 and ref.size < 5000:
                pool.append((node, ref))
    outputs = [node for node, _ in pool[n_leaves:]] or [pool[0][0]]
    refs = [ref for _, ref in pool[n_leaves:]] or [pool[0][1]]
    used = {n.name for n in tg.nodes(outputs) if n.op.name == "input"}
    got = tg.evaluate(outputs, {k: v for k, v in feeds.items() if k in used})
    for node, g, r in zip(outputs, got, refs):
        assert g.dtype == np.float64 and g.shape == r.shape
        assert _close(g, r, 1e-9), (tg.format_graph(node), g, r)
    # the fully decomposed graph computes the same values
    again = tg.evaluate(tg.decompose(outputs), {k: v for k, v in feeds.items() if k in used})
    for g, h in zip(got, again):
        np.testing.assert_array_equal(g, h)
    # the planned program (any backend, default tolerance) computes the same values too
    prog = tg.compile(outputs, db=":memory:")
    planned = prog(**{k: v for k, v in feeds.items() if k in used})
    for node, p, r in zip(outputs, planned, refs):
        assert p.shape == r.shape
        assert _close(p, r, 1e-6), (tg.format_graph(node), prog.explain())
