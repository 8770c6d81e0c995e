"""Variadic kernels: one pattern (pat.many) for any number of inputs; Kernel.arguments is the
planner's call contract for fixed and variadic kernels alike."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs import pat
from tensor_graphs.errors import ArgumentError, KernelConstraintError
from tensor_graphs.kernels import registry

make = registry.unregistered  # a kernel object the registry does not keep


def cat(*xs, axis):
    return np.concatenate(xs, axis=axis)


def test_three_spellings_of_one_variadic_pattern():
    parts = [tg.input(f"p{i}", (2, 3)) for i in range(9)]
    node = tg.concat(parts, axis=0)
    for pattern in ("concat", lambda *xs: pat.concat(*xs), pat.concat(pat.many("xs"))):
        k = make(pattern, cat)
        assert k.inputs == ("xs",) and k.variadic == "xs" and k.attrs == ("axis",)
        assert registry.describe(k.pattern) == "concat(*xs)"
        m = k.match(node)
        assert m is not None and k.arguments(m) == parts


def test_fixed_kernels_keep_their_contract():
    x, w = tg.input("x", (2, 5)), tg.input("w", (3, 5))
    node = tg.linear(x, w)
    (k, m), = [(k, m) for k, m in tg.kernels.matching(node) if k.name == "numpy_linear_no_bias"]
    assert k.variadic is None
    assert k.arguments(m) == [m.bindings[v] for v in k.inputs] == [x, w]
    assert k.argument_names(2) == list(k.inputs)


def test_constraints_see_one_shape_and_dtype_per_argument():
    seen = []

    def where(shapes, dtypes, attrs):
        seen.append((shapes, dtypes))
        return True if len(shapes) <= 4 else "at most 4 inputs"

    k = make("concat", cat, dtypes=("float32",), ranks=(2,), where=where)
    few = tg.concat([tg.input(f"p{i}", (2, 3)) for i in range(4)], axis=0)
    many = tg.concat([tg.input(f"p{i}", (2, 3)) for i in range(5)], axis=0)
    assert k.match(few) is not None and k.match(many) is None
    assert len(seen[0][0]) == 4 and seen[0][1] == (tg.float32,) * 4
    assert k.constraint_failure([(2, 3)] * 5, [tg.float32] * 5, {"axis": 0}) == "at most 4 inputs"
    reason = k.constraint_failure([(2, 3), (3,)], [tg.float32] * 2, {"axis": 0})
    assert "'xs[1]'" in reason and "rank 1" in reason
    assert "at least 1" in k.constraint_failure([], [], {"axis": 0})
    with pytest.raises(KernelConstraintError, match="float64"):
        k(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float64), axis=0)
    got = k(*[np.full((2, 3), i, np.float32) for i in range(3)], axis=0)
    assert got.shape == (6, 3)


def test_fixed_inputs_before_the_variadic_one():
    def head_rest(h, *rest, axis):
        return np.concatenate([np.exp(h), *rest], axis=axis)

    k = make(lambda h, *rest: pat.concat(tg.exp(h), *rest), head_rest)
    assert k.inputs == ("h", "rest") and k.argument_names(3) == ["h", "rest[0]", "rest[1]"]
    h, r1, r2 = (tg.input(n, (2,)) for n in ("h", "r1", "r2"))
    m = k.match(tg.concat([tg.exp(h), r1, r2]))
    assert m is not None and k.arguments(m) == [h, r1, r2]
    assert k.match(tg.concat([tg.exp(h), r1])) is not None
    assert k.match(tg.concat([h, r1, r2])) is None  # the first input is not exp(...)
    assert "at least 2 inputs (h, *rest)" in k.constraint_failure([(2,)], [tg.float32], {})


def test_registration_errors():
    def no_star(xs, axis):
        return xs

    with pytest.raises(ArgumentError, match=r"\*xs"):
        make("concat", no_star)

    def wrong_star(*parts, axis):
        return parts

    with pytest.raises(ArgumentError, match="must name"):
        make(pat.concat(pat.many("xs")), wrong_star)

    def two(*xs):
        return xs

    with pytest.raises(ArgumentError, match="at most one"):
        make(pat.concat(pat.concat(pat.many("xs")), pat.concat(pat.many("ys"))), two)

    def star_without_many(a, b, *xs, axis):
        return xs

    with pytest.raises(ArgumentError, match="pattern has none"):
        make(pat.concat(pat.var("a"), pat.var("b")), star_without_many)


def test_every_node_of_a_decomposed_conv2d_has_a_kernel():
    """conv2d's im2col makes a 9-input concat: it has kernels now, so every atomic node does."""
    from tensor_graphs.ir.graph import nodes

    x, w = tg.input("x", (1, 2, 6, 6)), tg.input("w", (4, 2, 3, 3))
    graph = tg.decompose(tg.conv2d(x, w))
    concats = [n for n in nodes(graph) if n.op.name == "concat"]
    assert concats and max(len(n.inputs) for n in concats) == 9
    for n in nodes(graph):
        if not n.op.is_leaf:
            assert tg.kernels.matching(n), f"no kernel for {n.op.name}"
    names = {k.name for k, _ in tg.kernels.matching(concats[0])}
    assert {"numpy_concat", "numpy_exact_concat"} <= names
