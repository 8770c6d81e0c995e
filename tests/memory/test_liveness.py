"""Unit tests of the memory planner on hand-made plans (fake kernels with chosen view/inplace
/contiguous flags) and on small compiled graphs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.memory import (
    OutOfMemory,
    analyze,
    assign_offsets,
    check_fits,
    max_live_lower_bound,
    overlapping_pairs,
    plan_memory,
    static_keys,
)
from tensor_graphs.memory.liveness import Buffer, reshape_strides
from tensor_graphs.planner.plan import Plan, Slot, Step

VIEW_OPS = ("reshape", "permute", "expand", "slice")


def fake_plan(outputs, inplace=(), contiguous=()):
    """A plan running every atomic node of ``outputs`` with its numpy reference: view ops are
    view kernels, ops in ``inplace`` may overwrite input 0, ops in ``contiguous`` need dense
    inputs."""
    outputs = outputs if isinstance(outputs, list) else [outputs]
    leaves, steps = [], []
    for node in tg.nodes(outputs):
        if node.op.kind == "leaf":
            leaves.append(Slot(node, "cpu", False))
            continue
        assert node.op.kind == "atomic", node

        def fn(*arrays, _op=node.op, **attrs):
            return np.asarray(_op.reference(list(arrays), attrs))

        kernel = SimpleNamespace(
            name=f"fake_{node.op.name}", backend="numpy", fn=fn,
            view=node.op.name in VIEW_OPS, inplace=0 if node.op.name in inplace else None,
            contiguous=node.op.name in contiguous)
        steps.append(Step(kernel, node, "cpu", tuple(Slot(i, "cpu", False) for i in node.inputs),
                          (node,), dict(node.attrs), None, 0.0, ""))
    return Plan(tuple(steps), tuple(Slot(o, "cpu", False) for o in outputs), {},
                tuple(leaves), (), 1e-6)


def key(node):
    return Slot(node, "cpu", False)


@pytest.fixture
def check(run_in_arena):
    """``check(plan, feeds, mp=None)``: the memory plan's buffers never overlap, and running
    out of its arena gives the reference's results; returns the memory plan."""
    def check(plan, feeds, mp=None):
        mp = mp or plan_memory(plan)
        bufs = mp.liveness.arena_buffers()
        assert overlapping_pairs(bufs, mp.buffer_offsets) == []
        got = run_in_arena(plan, mp, feeds)
        want = tg.evaluate([s.node for s in plan.outputs], feeds)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6)
        return mp
    return check


def test_view_aliases_and_extends_lifetime(check):
    x = tg.input("x", (4, 6))
    a = tg.exp(x)                    # step 0
    r = a.reshape((6, 4))            # step 1: view of a
    p = r.permute(1, 0)              # step 2: view of a view
    b = tg.exp(x) * 2.0 + 0.0        # unrelated work in between
    y = p + b.permute(1, 0).reshape((6, 4)).permute(1, 0)  # p read late
    plan = fake_plan(y)
    live = analyze(plan)
    va, vr, vp = live.values[key(a)], live.values[key(r)], live.values[key(p)]
    assert vr.buffer is va.buffer and vp.buffer is va.buffer
    assert vr.view_of == key(a) and vp.view_of == key(r)
    last_p = max(i for i, (_, ins) in enumerate(live.steps) if key(p) in ins)
    assert va.buffer.last == last_p > va.last
    assert vp.strides == (1, 4) and not vp.contiguous
    mp = check(plan, {"x": np.random.default_rng(0).standard_normal((4, 6))})
    assert mp.placements[key(p)].alias_of == key(a)
    assert mp.placements[key(p)].strides == (4, 16)


def test_outputs_live_to_the_end_and_leaves_stay_outside(check):
    x = tg.input("x", (8, 8))
    w = tg.weight("w", (8, 8))
    h = tg.exp(x)
    out1 = -h                         # an output made early
    y = tg.exp(tg.exp(out1 + w))
    plan = fake_plan([out1, y])
    live = analyze(plan)
    assert live.values[key(out1)].buffer.last == live.end == len(plan.steps)
    assert live.values[key(x)].buffer.kind == "input"
    assert live.values[key(w)].buffer.kind == "weight"
    arena_nodes = {b.node for b in live.arena_buffers()}
    assert x not in arena_nodes and w not in arena_nodes
    mp = check(plan, {"x": np.ones((8, 8)), "w": np.ones((8, 8))})
    assert mp.weights == {"cpu": 8 * 8 * 4} and mp.inputs == {"cpu": 8 * 8 * 4}
    assert mp.arena["cpu"] >= 2 * 256  # out1 and y's last inputs overlap y


def test_view_of_an_output_source_and_output_view(check):
    x = tg.input("x", (4, 4))
    a = tg.exp(x)
    v = a.reshape((16,))  # an output that is a view: its source lives to the end
    y = tg.exp(a) + 1.0
    plan = fake_plan([v, y])
    live = analyze(plan)
    assert live.values[key(a)].buffer.last == live.end
    check(plan, {"x": np.ones((4, 4))})


def test_inplace_reuses_a_dying_input(check):
    x = tg.input("x", (16, 16))
    a = tg.exp(x)
    b = -a          # a dies here: neg may write into a's buffer
    c = -b          # b dies here too: a chain reuses one buffer
    y = c + x
    plan = fake_plan(y, inplace=("neg",))
    live = analyze(plan)
    va, vb, vc = (live.values[key(n)] for n in (a, b, c))
    assert vb.buffer is va.buffer and vc.buffer is va.buffer
    assert vb.inplace_of == key(a) and vc.inplace_of == key(b)
    assert va.buffer.last == max(i for i, (_, ins) in enumerate(live.steps) if key(c) in ins)
    mp = check(plan, {"x": np.random.default_rng(1).standard_normal((16, 16))})
    assert mp.placements[key(c)].alias_of == key(a)
    assert mp.arena["cpu"] == 2 * 16 * 16 * 4  # a/b/c share; y needs its own


def test_inplace_refused_when_the_input_lives_on(check):
    x = tg.input("x", (16, 16))
    a = tg.exp(x)
    b = -a
    y = b + a               # a is read after b: no in-place
    s = tg.exp(x).reshape((256,))
    t = -s                  # s is a view of a live value... of its own exp: fine, but
    z = t.reshape((16, 16)) + tg.exp(x)  # exp(x) is hash-consed with a: it lives on
    plan = fake_plan([y, z], inplace=("neg",))
    live = analyze(plan)
    assert live.values[key(b)].buffer is not live.values[key(a)].buffer
    assert live.values[key(t)].inplace_of is None
    check(plan, {"x": np.ones((16, 16))})


def test_inplace_refused_for_outputs_leaves_and_other_sizes(check):
    x = tg.input("x", (8,))
    a = tg.exp(x)
    b = -a                        # a is an output: kept
    c = -x                        # a leaf: never overwritten
    d = tg.exp(x).reshape((2, 4))[0]  # a (4,) view of an (8,) buffer
    e = -d                        # not the whole buffer
    plan = fake_plan([a, b + c, e], inplace=("neg",))
    live = analyze(plan)
    for n in (b, c, e):
        assert live.values[key(n)].inplace_of is None
    check(plan, {"x": np.arange(8.0)})


def test_strided_input_of_a_contiguous_kernel_gets_scratch(check):
    x = tg.input("x", (4, 8))
    a = tg.exp(x)
    t = a.permute(1, 0)
    y = -t
    plan = fake_plan(y, contiguous=("neg",))
    live = analyze(plan)
    scratch = [b for b in live.arena_buffers() if b.scratch]
    assert len(scratch) == 1 and scratch[0].nbytes == 4 * 8 * 4
    assert scratch[0].first == scratch[0].last == 2
    check(plan, {"x": np.random.default_rng(2).standard_normal((4, 8))})
    assert not [b for b in analyze(plan, scratch=False).buffers if b.scratch]


def test_reshape_that_must_copy_gets_its_own_buffer(check):
    x = tg.input("x", (4, 6))
    a = tg.exp(x)
    y = a.permute(1, 0).reshape((24,)) + 1.0   # numpy copies here
    plan = fake_plan(y)
    live = analyze(plan)
    r = next(k for k in live.values if k.node.op.name == "reshape")
    assert live.values[r].view_of is None and live.values[r].buffer.kind == "arena"
    check(plan, {"x": np.random.default_rng(3).standard_normal((4, 6))})


@pytest.mark.parametrize("shape,perm,new", [
    ((2, 3, 4), (0, 1, 2), (6, 4)), ((2, 3, 4), (1, 0, 2), (3, 8)), ((2, 3, 4), (1, 0, 2), (24,)),
    ((2, 1, 4), (1, 0, 2), (8,)), ((3, 4), (1, 0), (4, 3, 1)), ((1, 5, 1), (2, 1, 0), (5,)),
    ((2, 3, 4), (2, 0, 1), (4, 6)), ((2, 3, 4), (2, 0, 1), (2, 2, 6)), ((0, 3), (1, 0), (0,))])
def test_reshape_strides_agree_with_numpy(shape, perm, new):
    a = np.zeros(shape).transpose(perm)
    strides = tuple(s // 8 for s in a.strides)
    got = reshape_strides(a.shape, strides, new)
    r = a.reshape(new)
    if np.shares_memory(a, r) or a.size == 0:
        assert got is not None
        if r.size:
            assert all(g * 8 == s for g, s, d in zip(got, r.strides, r.shape) if d != 1)
    else:
        assert got is None


def test_static_prelude_counts_as_weights(check):
    x = tg.input("x", (4, 8))
    w = tg.weight("w", (8, 4))
    wt = w.permute(1, 0)             # a view of a weight: no bytes
    w2 = -w                          # a prelude result: stored with the weights
    y = (x @ w2) + (x @ wt.permute(1, 0))
    plan = fake_plan(y)
    assert key(w2) in static_keys(plan) and key(wt) in static_keys(plan)
    mp = plan_memory(plan)
    assert mp.placements[key(w2)].kind == "weight"
    assert mp.weights["cpu"] == 2 * 8 * 4 * 4
    assert all(b.node is not w2 for b in mp.liveness.arena_buffers())
    check(plan, {"x": np.ones((4, 8)), "w": np.ones((8, 4))}, mp)
    mp2 = plan_memory(plan, static_keys=set())  # everything per call
    assert mp2.placements[key(w2)].kind == "arena"


def test_arena_strategies_and_bounds():
    def buf(i, n, first, last):
        return Buffer(i, "cpu", n, first, last, "arena", None)

    bufs = [buf(0, 100, 0, 1), buf(1, 64, 1, 2), buf(2, 100, 2, 3), buf(3, 10, 0, 3),
            buf(4, 0, 0, 3)]
    offsets, size, name = assign_offsets(bufs)
    assert overlapping_pairs(bufs, offsets) == []
    assert all(o % 64 == 0 for o in offsets.values())
    lb = max_live_lower_bound(bufs, 64)
    assert lb == 128 + 64 + 64 and size == lb  # buffers 0 and 2 share
    with pytest.raises(ValueError):
        assign_offsets(bufs, strategies=["nope"])
    assert assign_offsets([])[:2] == ({}, 0)


def test_compiled_graph_and_out_of_memory(run_in_arena):
    x = tg.input("x", (64, 64))
    w = tg.weight("w", (64, 64))
    y = tg.relu(x @ w) @ w
    prog = tg.compile(y, db=":memory:")
    mp = plan_memory(prog.concrete_plan)
    assert mp.totals()["cpu"] == mp.arena["cpu"] + mp.weights["cpu"] + mp.prepared.get("cpu", 0)
    assert mp.weights["cpu"] >= 64 * 64 * 4
    big = tg.Device("cpu", capacity=1 << 40)
    check_fits(mp, {"cpu": big})
    small = tg.Device("cpu", capacity=1000)
    with pytest.raises(OutOfMemory) as info:
        check_fits(mp, {"cpu": small})
    err = info.value
    assert isinstance(err, tg.TensorGraphsError)
    assert err.device == "cpu" and err.required == mp.total("cpu")
    assert err.available == 1000 - small.allocated
    assert len(err.largest) == 3 and err.largest[0].nbytes == 64 * 64 * 4
    text = str(err)
    assert "cpu" in text and "(64, 64) float32" in text and "capacity" in text
    assert "smaller batch" in text
    check_fits(mp, {})  # no cpu device given: nothing checked
    with pytest.raises(OutOfMemory):
        check_fits(mp, {"cpu:any": small})  # found by its kind
    feeds = {"x": np.random.default_rng(4).standard_normal((64, 64)).astype(np.float32),
             "w": np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)}
    got = run_in_arena(prog.concrete_plan, mp, feeds)[0]
    np.testing.assert_allclose(got, prog(**feeds), rtol=1e-5, atol=1e-4)


def test_a_result_viewing_an_input_or_a_constant_is_counted_as_the_call_copies_it():
    """A broadcast of a (2, 3) input to 240 TB compiled (no arena value: nothing counted)
    and failed in the call with numpy's MemoryError; a call copies such a result out
    whole, so the compile's check counts it (and a small one fits as before)."""
    x = tg.input("x", (2, 3), "float32")
    for huge in (tg.broadcast_to(x, 10**7, 10**6, 2, 3),
                 tg.broadcast_to(tg.constant(np.float32(1.0)), 10**7, 10**6)):
        with pytest.raises(OutOfMemory, match="results copied out of views 240.0 TB|"
                                              "results copied out of views 40.0 TB"):
            tg.compile(huge, db=":memory:", device=tg.Device("cpu", capacity=1 << 40))
    prog = tg.compile(tg.broadcast_to(x, 4, 2, 3), db=":memory:")
    assert plan_memory(prog.concrete_plan).results == {"cpu": 4 * 2 * 3 * 4}
    np.testing.assert_array_equal(prog(x=np.ones((2, 3), np.float32)), np.ones((4, 2, 3)))


def test_symbolic_shapes_are_refused():
    from tensor_graphs.errors import ArgumentError

    x = tg.input("x", ("n", 4))
    plan = fake_plan(tg.exp(x))
    with pytest.raises(ArgumentError, match="bounds"):
        plan_memory(plan)
