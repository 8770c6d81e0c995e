"""Hypothesis builds random expression graphs (elementwise ops, composites, reductions,
reshapes, permutes, slices, matmul, where, concat, pad) on rank 0-4 inputs, NaN, infinities
and signed zeros among the values in half the leaves, next to the same expression computed by
the op table's numpy oracles (tests/ops/optable.py) and plain numpy for movement, in float64;
tg.evaluate must agree to a norm-wise relative error of 1e-9, NaN for NaN, inf for inf."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error as _rel_err
from tests.ops import optable as ot


def oracle(name: str):
    """The op table's independent numpy oracle of row ``name``."""
    return ot.BY_NAME[name].oracle


def _close(got, ref, tol: float) -> bool:
    """NaN where the reference is NaN, the same infinities, and the finite values within
    ``tol`` norm-wise; a reference that is zero up to rounding (logsumexp of a log_softmax,
    say) is compared absolutely instead."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape or not np.array_equal(np.isnan(got), np.isnan(ref)):
        return False
    inf = np.isinf(ref)
    if not np.array_equal(got[inf], ref[inf]):
        return False
    g, r = got[~np.isnan(ref) & ~inf], ref[~np.isnan(ref) & ~inf]
    return _rel_err(g, r) <= tol or float(np.max(np.abs(g - r), initial=0)) <= 1e-12


UNARY = {
    "neg": (lambda x: -x, oracle("neg")),
    "tanh": (tg.tanh, oracle("tanh")),
    "sigmoid": (tg.sigmoid, oracle("sigmoid")),
    "sin": (tg.sin, oracle("sin")),
    "cos": (tg.cos, oracle("cos")),
    "relu": (tg.relu, oracle("relu")),
    "abs": (abs, oracle("abs")),
    "exp_tanh": (lambda x: tg.exp(tg.tanh(x)), lambda a: oracle("exp")(oracle("tanh")(a))),
    "gelu": (tg.gelu, oracle("gelu")),
    "silu": (tg.silu, oracle("silu")),
    "softplus": (tg.softplus, oracle("softplus")),
    "square": (tg.square, oracle("square")),
    "sqrt_abs": (lambda x: tg.sqrt(abs(x)), lambda a: oracle("sqrt")(oracle("abs")(a))),
    "affine": (lambda x: x * 0.5 - 1.25, lambda a: a * 0.5 - 1.25),
    "erf": (tg.erf, oracle("erf")),
}
BINARY = {
    "add": (lambda a, b: a + b, oracle("add")),
    "sub": (lambda a, b: a - b, oracle("sub")),
    "mul": (lambda a, b: a * b, oracle("mul")),
    "div": (lambda a, b: a / (b * b + 1.0), lambda a, b: oracle("div")(a, b * b + 1.0)),
    "maximum": (tg.maximum, oracle("maximum")),
    "minimum": (tg.minimum, oracle("minimum")),
    "where": (lambda a, b: tg.where(tg.less(a, 0.25), a, b),
              lambda a, b: oracle("where")(oracle("less")(a, np.float64(0.25)), a, b)),
    "pow": (lambda a, b: abs(a) ** tg.tanh(b),
            lambda a, b: oracle("pow")(oracle("abs")(a), oracle("tanh")(b))),
}
LEAF_SHAPES = [(3, 4), (4,), (1, 4), (3, 1), (4, 5), (2, 3, 4), (2, 1, 3, 4), ()]
SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0])


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
            return tg.logsumexp(x, axis=axis, keepdims=keep), oracle("logsumexp")(a, axis, keep)
        if which == "var":
            return tg.var(x, axis=axis, keepdims=keep), a.var(axis, keepdims=keep)
        return getattr(x, which)(axis, keep), oracle(which)(a, axis=axis, keepdims=keep)
    if kind == "softmax":
        if data.draw(st.booleans()):
            return tg.softmax(x, axis=axis), oracle("softmax")(a, axis=axis)
        return tg.log_softmax(x, axis=axis), oracle("log_softmax")(a, axis=axis)
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
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
        value = rng.standard_normal(shape)
        if data.draw(st.booleans()):  # a quarter of the values NaN, +-inf or a signed zero
            value = np.where(rng.random(shape) < 0.25, rng.choice(SPECIALS, shape), value)
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
            finite = ref[np.isfinite(ref)]
            if np.abs(finite).max(initial=0) < 1e6 and ref.size < 5000:
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
