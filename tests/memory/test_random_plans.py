"""Hypothesis: random graphs (elementwise ops, views, matmul, reductions) compiled with
tg.compile; their memory plans never overlap two live buffers, fit in the arena, sit between
the max-live lower bound and no reuse, and running the plan out of the arena (freed buffers
poisoned) gives the program's results. Plus the GPT-2-style graphs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensor_graphs as tg
from tensor_graphs.demo import gpt2_style, random_feeds
from tensor_graphs.memory import overlapping_pairs, plan_memory
from tensor_graphs.numerics import relative_error

UNARY = [tg.tanh, tg.relu, tg.exp, lambda x: -x, lambda x: x * 0.5 - 1.0, tg.sigmoid]
BINARY = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b, tg.maximum]
SHAPES = [(3, 4), (4,), (1, 4), (3, 1), (4, 5), (2, 3, 4), (2, 4, 3)]


def _step(data, pool):
    kind = data.draw(st.sampled_from(["unary", "binary", "binary", "reduce", "view", "view",
                                      "matmul", "softmax"]))
    x = pool[data.draw(st.integers(0, len(pool) - 1))]
    shape = x.shape
    if kind == "unary":
        return data.draw(st.sampled_from(UNARY))(x)
    if kind == "binary":
        y = pool[data.draw(st.integers(0, len(pool) - 1))]
        try:
            np.broadcast_shapes(shape, y.shape)
        except ValueError:
            return None
        return data.draw(st.sampled_from(BINARY))(x, y)
    if kind == "matmul":
        y = pool[data.draw(st.integers(0, len(pool) - 1))]
        if len(shape) == 0 or len(y.shape) < 2 or shape[-1] != y.shape[-2]:
            return None
        try:
            return x @ y
        except tg.TensorGraphsError:
            return None
    if len(shape) == 0:
        return None
    axis = data.draw(st.integers(0, len(shape) - 1))
    if kind == "reduce":
        keep = data.draw(st.booleans())
        return x.sum(axis, keep) if data.draw(st.booleans()) else x.max(axis, keep)
    if kind == "softmax":
        return tg.softmax(x, axis=axis)
    which = data.draw(st.sampled_from(["reshape", "permute", "slice", "T", "flip", "expand"]))
    if which == "reshape":
        return x.reshape(data.draw(st.sampled_from([(-1,), (1, -1), (-1, 1), (shape[0], -1)])))
    if which == "permute":
        return x.permute(*data.draw(st.permutations(range(len(shape)))))
    if which == "T":
        return x.T
    if which == "expand":
        if 1 not in shape:
            return None
        return tg.expand(x, tuple(3 if d == 1 else d for d in shape))
    step = data.draw(st.sampled_from([1, 2] if which == "slice" else [-1]))
    start = data.draw(st.integers(0, max(shape[axis] - 1, 0))) if step > 0 else None
    return x[(slice(None),) * axis + (slice(start, None, step),)]


def _check(plan, mp):
    live = mp.liveness
    for device, size in mp.arena.items():
        bufs = live.arena_buffers(device)
        assert overlapping_pairs(bufs, mp.buffer_offsets) == []
        for b in bufs:
            assert mp.buffer_offsets[b.id] % mp.alignment == 0
            assert mp.buffer_offsets[b.id] + b.nbytes <= size
        assert mp.lower_bound[device] <= size <= mp.no_reuse[device]
    for pos, (key, ins) in enumerate(live.steps):  # every read buffer is live when read
        for k in ins:
            b = live.values[k].buffer
            assert b.first <= pos <= b.last, (pos, k, b)
        assert live.values[key].buffer.first <= pos
    for out in plan.outputs:
        b = live.values[plan.resolve(out)].buffer
        assert b.kind != "arena" or b.last == live.end


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_graph_memory_plan(run_in_arena, data):
    n_leaves = data.draw(st.integers(1, 3))
    pool, feeds = [], {}
    for k in range(n_leaves):
        shape = data.draw(st.sampled_from(SHAPES))
        kind = data.draw(st.sampled_from(["input", "input", "weight"]))
        make = tg.input if kind == "input" else tg.weight
        pool.append(make(f"x{k}", shape))
        feeds[f"x{k}"] = np.random.default_rng(k).standard_normal(shape).astype(np.float32)
    for _ in range(data.draw(st.integers(1, 10))):
        made = _step(data, pool)
        if made is not None and made.ndim <= 4 and all(d <= 64 for d in made.shape):
            pool.append(made)
    n_out = data.draw(st.integers(1, 2))
    outputs = pool[n_leaves:][-n_out:] or [pool[0]]
    used = {n.name for n in tg.nodes(outputs) if n.op.kind == "leaf" and n.name}
    feeds = {k: v for k, v in feeds.items() if k in used}
    backends = data.draw(st.sampled_from([None, ("numpy",)]))
    prog = tg.compile(outputs, db=":memory:", backends=backends)
    plan = prog.concrete_plan
    mp = plan_memory(plan)
    _check(plan, mp)
    got = run_in_arena(plan, mp, feeds)
    want = prog(**feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        if np.isfinite(w).all():
            assert relative_error(g, w) <= 1e-6, plan.explain()


def test_small_gpt2_runs_out_of_its_arena(run_in_arena):
    y = gpt2_style(2, d_model=64, heads=4, vocab=97, n_ctx=32)
    for backends in (None, ("numpy",)):
        prog = tg.compile(y, db=":memory:", bounds={"batch": 2, "seq": 16}, backends=backends)
        mp = plan_memory(prog.concrete_plan)
        _check(prog.concrete_plan, mp)
        feeds = random_feeds(y, {"batch": 2, "seq": 16})
        feeds["ids"] = np.random.default_rng(0).integers(0, 97, (2, 16))
        got = run_in_arena(prog.concrete_plan, mp, feeds, {"batch": 2, "seq": 16})[0]
        assert relative_error(got, prog(**feeds)) <= 1e-6
        assert mp.ratio("cpu") <= 1.5


@pytest.mark.slow
def test_gpt2_small_arena_near_the_lower_bound():
    prog = tg.compile(gpt2_style(12), db=":memory:", bounds={"batch": 1, "seq": 128})
    mp = plan_memory(prog.concrete_plan)
    _check(prog.concrete_plan, mp)
    assert mp.lower_bound["cpu"] <= mp.arena["cpu"] <= 1.5 * mp.lower_bound["cpu"]
    assert mp.arena["cpu"] < mp.no_reuse["cpu"]
    assert 124e6 * 4 <= mp.weights["cpu"] <= 130e6 * 4  # GPT-2 small's parameters, once
