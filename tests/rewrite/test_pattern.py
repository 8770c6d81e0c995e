"""The pattern language: commutative and associative-commutative matching (every operand order
and grouping), sub-multiset matches with the rest kept, repeated variables, every guard kind,
attribute constraints, binding op patterns, rules, tables and apply."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs import pat
from tensor_graphs.ir.graph import use_counts
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops import OPS

a, b, c, d = (tg.input(n, (3, 4)) for n in "abcd")
n_int = tg.input("n", (3, 4), "int32")
x, y, z = pat.var("x"), pat.var("y"), pat.var("z")


def mk(op: str, *inputs: Node, **attrs) -> Node:
    return Node.make(OPS[op], inputs, attrs)


def bindings(pattern, node, **kw):
    m = pat.match(pattern, node, **kw)
    return None if m is None else m.bindings


# ---------------------------------------------------------------------------- commutativity
@pytest.mark.parametrize("op", ["add", "mul", "maximum", "equal"])
def test_commutative_binary_both_orders(op):
    pattern = pat.op(op, pat.exp(x), y)
    for node in (mk(op, tg.exp(a), b), mk(op, b, tg.exp(a))):
        assert bindings(pattern, node) == {"x": a, "y": b}


@pytest.mark.parametrize("op", ["less", "pow", "matmul"])
def test_non_commutative_one_order(op):
    p, q = tg.input("p", (4, 4)), tg.input("q", (4, 4))
    pattern = pat.op(op, pat.exp(x), y)
    assert bindings(pattern, mk(op, tg.exp(p), q)) == {"x": p, "y": q}
    assert pat.match(pattern, mk(op, q, tg.exp(p))) is None


def test_associative_commutative_every_order_and_grouping():
    pattern = pat.exp(x) * pat.sin(y) * z
    for t0, t1, t2 in itertools.permutations([tg.exp(a), tg.sin(b), c]):
        for node in (mk("mul", mk("mul", t0, t1), t2), mk("mul", t0, mk("mul", t1, t2))):
            m = pat.match(pattern, node)
            assert m.bindings == {"x": a, "y": b, "z": c} and m.rest == ()


def test_pattern_grouping_does_not_matter():
    node = (tg.exp(a) + b) + c
    for pattern in (pat.exp(x) + (y + z), (pat.exp(x) + y) + z, z + (y + pat.exp(x))):
        assert bindings(pattern, node)["x"] is a
        assert {bindings(pattern, node)[k] for k in "yz"} == {b, c}


def test_all_matches_are_enumerated():
    assert len(list(pat.iter_matches(x + y, a + b))) == 2  # x=a,y=b and x=b,y=a
    assert len(list(pat.iter_matches(x + y, a + a))) == 1  # equal terms are interchangeable
    assert len(list(pat.iter_matches(x + y + z, a + b + c))) == 6


# ---------------------------------------------------------------------------- sub-multisets
def test_sub_multiset_with_rest():
    node = (a + tg.exp(c)) + b
    found = {(m.bindings["y"], m.rest) for m in pat.iter_matches(pat.exp(x) + y, node)}
    assert found == {(a, (b,)), (b, (a,))}
    assert all(m.bindings["x"] is c for m in pat.iter_matches(pat.exp(x) + y, node))
    assert pat.match(pat.exp(x) + y, node, partial=False) is None
    assert pat.match(pat.exp(x) + y + z, node).rest == ()


def test_sub_multiset_only_at_the_root():
    assert pat.match(pat.exp(x + y), tg.exp(a + b + c)) is None
    assert bindings(pat.exp(x + y + z), tg.exp(a + (b + c))) is not None
    assert pat.match(pat.exp(x) + pat.exp(y) + z, tg.exp(a) + b) is None  # too few terms


def test_rule_keeps_the_rest():
    rule = pat.rule(pat.exp(x) * pat.exp(y), lambda x, y: tg.exp(x + y))
    assert rule.rewrite(tg.exp(a) * b * tg.exp(c)) is tg.exp(a + c) * b
    assert rule.rewrite(tg.exp(a) * tg.exp(c)) is tg.exp(a + c)


def test_chains_stop_at_other_dtypes():
    node = (a + b).astype("float64") + c.astype("float64")
    assert pat.match(x + y + z, node) is None  # a cast ends the chain: two terms, not three
    assert bindings(x + y, node) is not None


# ---------------------------------------------------------------------------- variables
def test_repeated_variables():
    assert bindings(x + x, a + a) == {"x": a}
    assert pat.match(x + x, a + b) is None
    m = pat.match(x + x, (a + b) + a)
    assert m.bindings == {"x": a} and m.rest == (b,)
    pattern = x * pat.exp(x)
    assert bindings(pattern, a * tg.exp(a)) == {"x": a}
    assert bindings(pattern, tg.exp(a) * a) == {"x": a}
    assert pat.match(pattern, a * tg.exp(b)) is None


def test_every_occurrence_checks_its_guards():
    pattern = pat.var("x", dtype="int") + pat.neg(pat.var("x"))
    assert pat.match(pattern, a + tg.neg(a)) is None  # float: the int guard must hold
    assert bindings(pattern, n_int + tg.neg(n_int)) == {"x": n_int}
    assert bindings(pattern, tg.neg(n_int) + n_int) == {"x": n_int}
    unguarded_first = pat.neg(pat.var("x")) + pat.var("x", dtype="int")
    assert pat.match(unguarded_first, a + tg.neg(a)) is None
    ordered = pat.where(pat.var("c"), pat.var("x"), pat.var("x", dtype="int"))
    assert pat.match(ordered, tg.where(tg.less(a, b), a, a)) is None
    assert bindings(ordered, tg.where(tg.less(a, b), n_int, n_int))["x"] is n_int


@pytest.mark.parametrize("guard, yes, no", [
    (dict(dtype="float32"), a, n_int),
    (dict(dtype=tg.int32), n_int, a),
    (dict(dtype="int"), n_int, a),
    (dict(dtype="float"), tg.input("h", (2,), "bfloat16"), n_int),
    (dict(dtype="bool"), tg.less(a, b), a),
    (dict(dtype=("int8", "float32")), a, n_int),
    (dict(rank=2), a, tg.input("v", (4,))),
    (dict(rank=0), tg.constant(1.0), a),
    (dict(shape=lambda s: s[-1] == 4), a, tg.input("w", (4, 3))),
    (dict(const=2.0), tg.constant(np.full((2, 2), 2.0)), tg.constant(np.array([2.0, 3.0]))),
    (dict(const=2), tg.constant(2, "int8"), a),
    (dict(const=float("nan")), tg.constant(np.array([np.nan, np.nan])), tg.constant(1.0)),
    (dict(where=lambda n: n.op.name == "input"), a, tg.exp(a)),
])
def test_guards(guard, yes, no):
    v = pat.var("v", **guard)
    assert bindings(v, yes) == {"v": yes}
    assert pat.match(v, no) is None
    assert bindings(pat.copy_to(v), tg.copy_to(yes, "cpu")) == {"v": yes}  # below the root


def test_single_use_guard():
    once = tg.exp(a)
    twice = tg.sin(b)
    graph = once + twice * twice
    uses = use_counts(graph)
    pattern = pat.var("v", single_use=True)
    assert bindings(pattern, once, uses=uses) == {"v": once}
    assert pat.match(pattern, twice, uses=uses) is None
    with pytest.raises(tg.ArgumentError, match="use counts"):
        pat.match(pattern, once)
    table = pat.RuleTable("fuse", [
        # exp(v) + w -> sin(v) + w only when exp(v) has no other user (a fusion's condition)
        pat.rule(pat.var("e", single_use=True, where=lambda n: n.op.name == "exp") + y,
                 lambda e, y: tg.sin(e.inputs[0]) + y),
    ])
    assert tg.rewrite.apply(tg.exp(a) + b, table) is tg.sin(a) + b
    shared = tg.exp(a)
    assert tg.rewrite.apply([shared + b, shared], table) == [shared + b, shared]


# ---------------------------------------------------------------------------- constants
def test_constant_patterns():
    assert bindings(pat.exp(x) * 2, tg.exp(a) * 2.0) == {"x": a}
    assert bindings(pat.exp(x) * 2, tg.exp(a) * tg.constant(np.full((3, 4), 2.0, np.float32)))
    assert pat.match(pat.exp(x) * 2, tg.exp(a) * 3.0) is None
    assert pat.match(pat.exp(x) * 2, tg.exp(a) * b) is None
    assert bindings(x * 2, n_int * 2) == {"x": n_int}
    empty = tg.input("e", (0,))
    assert pat.match(x * 1, empty * tg.constant(np.zeros((0,), np.float32))) is None
    assert bindings(pat.where(True, x, y), tg.where(True, a, b)) == {"x": a, "y": b}
    assert pat.constant_equals(tg.constant(np.ones(3, bool)), 1)
    assert not pat.constant_equals(a, 1)


# ---------------------------------------------------------------------------- attributes, bind
def test_attribute_constraints():
    assert bindings(pat.permute(x, perm=(1, 0)), a.T) == {"x": a}
    assert pat.match(pat.permute(x, perm=(0, 1)), a.T) is None
    assert bindings(pat.permute(x, perm=lambda p: p[0] == 1), a.T) == {"x": a}
    assert pat.match(pat.permute(x, perm=lambda p: p[0] == 0), a.T) is None
    assert bindings(pat.cast(x, dtype=tg.float16), a.astype("float16")) == {"x": a}
    assert pat.match(pat.cast(x, dtype=tg.float16), a.astype("bfloat16")) is None
    assert pat.match(pat.reshape(x, perm=(1, 0)), a.reshape(12)) is None  # no such attribute
    assert bindings(pat.sum(x, axes=(1,), keepdims=False), a.sum(axis=1)) == {"x": a}


def test_bind_names_the_matched_node():
    e = tg.exp(a)
    assert bindings(pat.exp(x).bind("e") + y, e + b) == {"x": a, "e": e, "y": b}
    root = e + b
    assert bindings((pat.exp(x) + y).bind("r"), root)["r"] is root
    m = pat.match((pat.exp(x) + y).bind("r"), root + c)  # partial: the whole chain is bound
    assert m.bindings["r"] is root + c and len(m.rest) == 1
    clash = pat.exp(x).bind("n") + pat.sin(y).bind("n")
    assert pat.match(clash, tg.exp(a) + tg.sin(b)) is None
    assert bindings(pat.reshape(pat.reshape(x)).bind("r"), a.reshape(12).reshape(4, 3))["x"] is a


def test_operators_and_names():
    assert (x - y).op == "sub" and (x / y).op == "div" and (x @ y).op == "matmul"
    assert (x ** y).op == "pow" and (-x).op == "neg" and (2 * x).op == "mul"
    assert bindings(x - y, tg.sub(a, b)) == {"x": a, "y": b}  # a composite node
    assert pat.match(x - y, tg.decompose(tg.sub(a, b))) is None
    assert pat.match(pat.concat(x), mk("concat", a, b, axis=0)) is None  # input count
    with pytest.raises(tg.ArgumentError):
        pat.op("no_such_op", x)
    with pytest.raises(AttributeError):
        pat.no_such_op  # noqa: B018
    with pytest.raises(tg.ArgumentError):
        pat.as_pat("x")


# ---------------------------------------------------------------------------- rules, tables
def test_rules_decline_type_changes_and_none():
    to_sum = pat.rule(pat.exp(x), lambda x: x.sum())  # a different shape: declined
    to_f64 = pat.rule(pat.exp(x), lambda x: x.astype("float64"))  # a different dtype
    assert to_sum.rewrite(tg.exp(a)) is None and to_f64.rewrite(tg.exp(a)) is None
    pick_b = pat.rule(pat.exp(x) + y, lambda x, y: tg.sin(x) + y if y is b else None)
    assert pick_b.rewrite(tg.exp(a) + c + b) is tg.sin(a) + b + c  # the second match
    assert pick_b.rewrite(tg.exp(a) + c) is None


def test_tables():
    neg2 = pat.RuleTable("neg2", [pat.rule(pat.neg(pat.neg(x)), lambda x: x)])  # --x -> x
    anything = pat.RuleTable("any", [pat.rule(pat.var("v", const=0.0), lambda v: v)])
    both = neg2 + anything
    assert both.name == "neg2+any" and len(both) == 2 and list(both) == [*neg2, *anything]
    assert both.candidates(tg.neg(a)) == [neg2.rules[0], anything.rules[0]]
    assert both.candidates(tg.exp(a)) == [anything.rules[0]]
    assert "neg2" in repr(neg2)


def test_apply_fixed_point_and_structure():
    neg2 = pat.RuleTable("neg2", [pat.rule(pat.neg(pat.neg(x)), lambda x: x)])  # --x -> x
    g = a
    for _ in range(5):
        g = tg.neg(tg.neg(g))
    assert tg.rewrite.apply(g, neg2) is a
    assert tg.rewrite.apply([g, tg.neg(g)], neg2) == [a, tg.neg(a)]
    assert tg.rewrite.apply(tg.exp(a), neg2) is tg.exp(a)
    with pytest.raises(tg.rewrite.RewriteError, match="neg2"):
        tg.rewrite.apply(g, neg2, max_steps=2)


def test_apply_ping_pong_raises():
    ping_pong = pat.RuleTable("ping_pong", [
        pat.rule(pat.exp(x), lambda x: tg.sin(x)),  # exp(x) -> sin(x)
        pat.rule(pat.sin(x), lambda x: tg.exp(x)),  # sin(x) -> exp(x)
    ])
    with pytest.raises(tg.rewrite.RewriteError, match="fixed point"):
        tg.rewrite.apply(tg.exp(a) + b, ping_pong)


# ---------------------------------------------------------------------------- variadic operands
def test_many_binds_the_tuple_of_a_variadic_nodes_inputs():
    xs = pat.many("xs")
    for count in (1, 2, 5, 9):
        parts = tuple(tg.input(f"v{i}", (2, 3)) for i in range(count))
        node = mk("concat", *parts, axis=0)
        assert bindings(pat.concat(xs), node) == {"xs": parts}
    e = tg.exp(a)
    node = mk("concat", e, b, c, d, axis=0)
    assert bindings(pat.concat(pat.exp(x), xs), node) == {"x": a, "xs": (b, c, d)}
    assert bindings(pat.concat(xs, y), node) == {"xs": (e, b, c), "y": d}
    assert bindings(pat.concat(x, xs, y), node) == {"x": e, "xs": (b, c), "y": d}
    assert pat.match(pat.concat(pat.exp(x), xs), mk("concat", a, b, axis=0)) is None
    assert bindings(pat.concat(pat.many("xs", min=0), x), mk("concat", a, axis=0)) == {
        "xs": (), "x": a}
    assert pat.match(pat.concat(xs, x), mk("concat", a, axis=0)) is None  # min=1
    assert pat.match(pat.concat(pat.many("xs", min=3)), mk("concat", a, b, axis=0)) is None
    assert pat.match(pat.concat(xs, axis=1), mk("concat", a, b, axis=0)) is None  # attrs


def test_many_guards_hold_for_every_element_and_repeats_must_agree():
    node = mk("concat", a, b, n_int.astype("float32"), axis=0)
    assert pat.match(pat.concat(pat.many("xs", where=lambda v: v.op.name == "input")),
                     node) is None
    assert pat.match(pat.concat(pat.many("xs", dtype="float", rank=2)), node) is not None
    assert pat.match(pat.concat(pat.many("xs", rank=1)), node) is None
    uses = use_counts([node])
    assert pat.match(pat.concat(pat.many("xs", single_use=True)), node, uses=uses) is not None
    with pytest.raises(tg.ArgumentError):
        pat.match(pat.concat(pat.many("xs", single_use=True)), node)  # needs use counts
    inner = mk("concat", a, b, axis=1)
    twice = mk("concat", inner, mk("concat", a, b, axis=1), axis=0)
    same = pat.concat(pat.concat(pat.many("xs")), pat.concat(pat.many("xs")))
    assert bindings(same, twice) == {"xs": (a, b)}
    other = mk("concat", inner, mk("concat", b, a, axis=1), axis=0)
    assert pat.match(same, other) is None  # the same nodes, in the same order


def test_many_is_an_operand_of_a_non_associative_op_only():
    with pytest.raises(tg.ArgumentError):
        pat.concat(pat.many("xs"), pat.many("ys"))
    with pytest.raises(tg.ArgumentError):
        pat.add(pat.many("xs"), x)
    with pytest.raises(tg.ArgumentError):
        pat.match(pat.many("xs"), a)
    with pytest.raises(tg.ArgumentError):
        pat.many("xs", min=-1)


def test_a_rule_gets_the_tuple():
    # concat(neg(p), neg(q), ...) -> neg(concat(p, q, ...)): the builder sees a tuple
    def pull(xs):
        if all(v.op.name == "neg" for v in xs):
            return tg.neg(tg.concat([v.inputs[0] for v in xs], axis=0))
        return None

    table = pat.RuleTable("pull", [pat.rule(pat.concat(pat.many("xs")), pull)])
    parts = [tg.neg(tg.input(f"w{i}", (2,))) for i in range(5)]
    out = tg.rewrite.apply(tg.concat(parts, axis=0), table)
    assert out.op.name == "neg" and len(out.inputs[0].inputs) == 5


def test_structural_matching_keeps_chains_as_built():
    a, b, c = (tg.input(n, (3,)) for n in "abc")
    chain = (a + b) + c
    x, y = tg.pat.var("x"), tg.pat.var("y")
    flat = list(tg.pat.iter_matches(x + y, chain, partial=False))
    assert flat == []  # three terms, a two-term pattern: no exact flat match
    built = list(tg.pat.iter_matches(x + y, chain, partial=False, flat=False))
    pairs = {(m.bindings["x"], m.bindings["y"]) for m in built}
    assert pairs == {(a + b, c), (c, a + b)}  # commutative, the inner sum as one operand
    fma = tg.pat.var("p") * tg.pat.var("q") + tg.pat.var("r")
    assert list(tg.pat.iter_matches(fma, c + a * b, partial=False, flat=False))
