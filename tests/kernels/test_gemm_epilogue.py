"""Generated GEMM epilogues (kernels/c/gemm_epilogue.py): the elementwise region after a
float32 matmul on a static weight, applied to the packed GEMM's tiles before their store.

Graphs as a user writes them (an activation nobody hand-fused, a scale, a residual, a reshape
on either side of the product, symbolic rows) compile to one generated step covering the
matmul and its epilogue, bound to weights, and agree with the float64 reference; a weight fed
per call, and regions a hand-written packed kernel computes, get none; a wrong epilogue is
refused before it runs and the plan is made without it; the profiler times it like any kernel
and a lock file replays it. Kernel level: every kind of operand, every path of the GEMM (one
row, K = 0, K blocks, split M), out= buffers, and the rounding bound."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.graph import decompose, use_counts
from tensor_graphs.kernels import generated
from tensor_graphs.kernels.c import build, gemm
from tensor_graphs.kernels.c import gemm_epilogue as ge
from tensor_graphs.numerics import relative_error

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")
RNG = np.random.default_rng(5)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def gemm_steps(prog):
    return [s for s in prog.plan.steps if s.kernel.name.startswith("c_gemm_ep_")]


def compiled(y, weights, **options):
    prog = tg.compile(y, db=":memory:", **options)
    prog.bind(**weights)
    return prog


def check(prog, y, feeds, weights):
    got = prog(**feeds)
    want = tg.evaluate(y, {**feeds, **weights}, dtype="float64")
    assert relative_error(got, want) <= 1e-5
    return got


def one_generated_gemm(prog, *ops):
    """The plan's one generated GEMM step: it covers the matmul and ``ops``."""
    (step,) = gemm_steps(prog)
    inside = {n.op.name for n in step.nodes}
    assert {"matmul", *ops} <= inside, inside
    assert getattr(step.kernel, "generated", False)
    return step


def region_of(y):
    """(uses, expand, (covers, region)) as the planner's generator sees the graph of ``y``."""
    uses = use_counts(y)
    memo: dict = {}

    def expand(n):
        if n not in memo:
            memo[n] = decompose(n, depth=1)
        return memo[n]

    while not y.op.is_atomic:  # the planner asks at a composite's decomposition root
        y = expand(y)
    return uses, expand, ge.gemm_region(y, uses, expand)


def silu(h):
    return h * tg.sigmoid(h)


def test_bias_then_a_scaled_silu_is_one_generated_step():
    x, w, b = tg.input("x", (64, 96)), tg.weight("w", (96, 200)), tg.weight("b", (200,))
    y = silu(x @ w + b) * 1.5
    W = dict(w=rand(96, 200), b=rand(200))
    prog = compiled(y, W)
    assert len(prog.plan.steps) == 1, prog.explain()
    step = one_generated_gemm(prog, "add", "exp", "mul")
    assert "generated" in prog.explain()
    assert step.kernel.prepare and step.kernel.tolerance <= 1e-5
    check(prog, y, {"x": rand(64, 96)}, W)


def test_linear_with_a_residual_after_a_scaled_activation():
    """torch's (out, in) weight: the transpose is packed with the weight, not run per call."""
    x, r = tg.input("x", (3, 10, 48)), tg.input("r", (3, 10, 40))
    W, b = tg.weight("W", (40, 48)), tg.weight("b", (40,))
    y = tg.gelu(tg.linear(x, W, b), approximate="tanh") * 0.5 + r
    weights = dict(W=rand(40, 48), b=rand(40))
    prog = compiled(y, weights)
    assert len(prog.plan.steps) == 1, prog.explain()
    step = one_generated_gemm(prog, "permute", "add", "mul")
    assert [p.name for p in step.kernel.prepare.values()] == ["pack_linear"]
    check(prog, y, {"x": rand(3, 10, 48), "r": rand(3, 10, 40)}, weights)


def test_a_reshape_between_the_product_and_its_epilogue():
    """GPT-2's Conv1D as torch exports it: (B*T, K) @ W + b viewed as (B, T, N), then the
    activation and the residual: one step, the bias read per column before the reshape and
    a (1, T, N) operand per (t, n) after it."""
    B, T, K, N = 2, 12, 40, 56
    x, r = tg.input("x", (B * T, K)), tg.input("r", (B, T, N))
    pos = tg.input("pos", (1, T, N))
    w, b = tg.weight("w", (K, N)), tg.weight("b", (N,))
    h = tg.reshape(x @ w + b, (B, T, N))
    y = silu(h + pos) * 0.5 + r
    weights = dict(w=rand(K, N), b=rand(N))
    prog = compiled(y, weights)
    assert len(prog.plan.steps) == 1, prog.explain()
    one_generated_gemm(prog, "reshape", "add", "exp")
    check(prog, y, {"x": rand(B * T, K), "r": rand(B, T, N), "pos": rand(1, T, N)}, weights)


def test_a_batched_input_reshaped_to_2d_and_back():
    """x (B, T, K) flattened to rows for the product, tanh(softplus) scaled, viewed as
    (B, T, N) again: the generated step covers the product and the epilogue; the reshapes
    are views around it."""
    B, T, K, N = 2, 7, 33, 20
    x, w, b = tg.input("x", (B, T, K)), tg.weight("w", (K, N)), tg.weight("b", (N,))
    h = tg.reshape(x, (B * T, K)) @ w + b
    y = tg.reshape(tg.tanh(tg.log(1.0 + tg.exp(h))) * 2.0 - 1.0, (B, T, N))
    weights = dict(w=rand(K, N), b=rand(N))
    prog = compiled(y, weights)
    one_generated_gemm(prog, "log", "exp")
    assert all(s.kernel.name.startswith("c_gemm_ep_") or s.kernel.view
               for s in prog.plan.steps), prog.explain()
    check(prog, y, {"x": rand(B, T, K)}, weights)


def test_rows_of_a_symbolic_dim_and_the_native_loop():
    K, N = 40, 56
    x, w, b = tg.input("x", ("s", K)), tg.weight("w", (K, N)), tg.weight("b", (N,))
    s = tg.input("scale", ("s", 1))  # one value per row
    h = x @ w + b
    y = tg.sigmoid(h) * h * s + 0.25
    weights = dict(w=rand(K, N), b=rand(N))
    prog = compiled(y, weights, bounds={"s": 16})
    one_generated_gemm(prog, "exp")
    for rows in (16, 5, 1, 16, 16, 16):
        check(prog, y, {"x": rand(rows, K), "scale": rand(rows, 1)}, weights)
    assert "native loop" in prog.loop, prog.loop


def test_a_reshape_of_symbolic_rows():
    """(s, K) @ W + b viewed as (1, s, N) before the activation and a (1, s, N) residual:
    the frames follow the dims each call binds."""
    K, N = 24, 40
    x, r = tg.input("x", ("s", K)), tg.input("r", (1, "s", N))
    w, b = tg.weight("w", (K, N)), tg.weight("b", (N,))
    h = tg.reshape(x @ w + b, (1, "s", N))
    y = tg.tanh(h) * 0.5 + r
    weights = dict(w=rand(K, N), b=rand(N))
    prog = compiled(y, weights, bounds={"s": 12})
    one_generated_gemm(prog, "reshape", "exp")
    for rows in (12, 7, 1, 12):
        check(prog, y, {"x": rand(rows, K), "r": rand(1, rows, N)}, weights)


def test_a_weight_fed_per_call_gets_no_generated_gemm():
    x, w, b = tg.input("x", (24, 40)), tg.input("w", (40, 56)), tg.weight("b", (56,))
    y = silu(x @ w + b) * 3.0
    weights = dict(b=rand(56))
    prog = compiled(y, weights)
    assert not gemm_steps(prog), prog.explain()
    check(prog, y, {"x": rand(24, 40), "w": rand(40, 56)}, weights)


def test_regions_a_hand_written_packed_kernel_computes_are_left_to_it():
    x, w, b = tg.input("x", (24, 40)), tg.weight("w", (40, 56)), tg.weight("b", (56,))
    r = tg.input("r", (24, 56))
    for y in (x @ w + b, tg.relu(x @ w + b), x @ w + b + r,
              tg.gelu(x @ w + b, approximate="tanh")):  # asked at the mul gelu ends in
        uses, expand, found = region_of(y)
        assert found is not None  # the generator sees the region...
        root = y
        while not root.op.is_atomic:
            root = expand(root)
        assert ge.gemm_candidate(root, uses, expand) is None  # ...and leaves it to c_packed_*
    y = (x @ w + b) * 2.0
    uses, expand, _ = region_of(y)
    cand = ge.gemm_candidate(y, uses, expand)
    assert cand is not None and cand.prepared == (1,) and cand.inputs[:2] == (x, w)


def test_a_product_read_outside_the_region_is_not_fused():
    x, w = tg.input("x", (24, 40)), tg.weight("w", (40, 56))
    h = x @ w
    y = tg.exp(h) * 2.0
    outs = [y, h * 3.0]  # h is also an output's operand: computed once, by its own step
    uses = use_counts(outs)
    assert ge.gemm_region(y, uses, lambda n: decompose(n, depth=1)) is None


def test_a_wrong_epilogue_is_refused_and_planned_without(monkeypatch):
    """The renderer scales every result by 1.01: the check against the float64 reference
    refuses the kernel before it is timed or run, and the plan is made again without it."""
    real = ge.emit_gemm_c

    def buggy(region):
        e = real(region)
        return dataclasses.replace(e, source=e.source.replace("t[j] = v", "t[j] = 1.01f * v"),
                                   key=e.key + "bad")

    monkeypatch.setattr(ge, "emit_gemm_c", buggy)
    monkeypatch.setattr(generated, "refused", {})
    monkeypatch.setattr(generated, "_built", {})
    x, w, b = tg.input("x", (16, 24)), tg.weight("w", (24, 40)), tg.weight("b", (40,))
    y = tg.sigmoid(x @ w + b) * 0.75 - 0.5  # a structure no other test builds
    weights = dict(w=rand(24, 40), b=rand(40))
    prog = compiled(y, weights)
    assert prog.stats["generated_refused"] >= 1
    assert not gemm_steps(prog), prog.explain()
    assert any(name.startswith("c_gemm_ep_") and "disagrees with the reference" in why
               for name, why in generated.refused.items())
    check(prog, y, {"x": rand(16, 24)}, weights)


def _operand_zoo():
    """An epilogue reading every kind of operand: a per-column vector, a per-row vector, a
    0-d value, a full residual, a (1, T, N) table and a bool mask."""
    B, T, K, N = 2, 9, 30, 37
    x, w = tg.input("x", (B, T, K)), tg.weight("w", (K, N))
    col, row = tg.input("col", (N,)), tg.input("row", (B, T, 1))
    scale, res = tg.input("scale", ()), tg.input("res", (B, T, N))
    table, mask = tg.input("table", (1, T, N)), tg.input("mask", (B, T, N), "bool")
    h = x @ w + col
    y = tg.where(mask, tg.tanh(h) * row, h * scale) + res * table
    return y, (x, w, col, row, scale, res, table, mask)


def test_every_operand_kind_verifies_and_runs_every_gemm_path():
    y, leaves = _operand_zoo()
    _, _, (covers, region) = region_of(y)
    kernel = ge.build_gemm_kernel(region)  # checked, then tg.kernels.verify(strict=True)
    assert kernel.tolerance <= 1e-5 and kernel.writes_out and kernel.contiguous
    assert tg.kernels.verify(kernel, seed=3).ok
    order = [region.a, region.w, *region.inputs]
    # one row (the GEMV), K = 0, K in blocks, the split-M path (rows >= 512)
    for B, T, k in ((1, 1, 30), (1, 7, 0), (2, 3, 1025), (65, 8, 3)):
        shapes = {"x": (B, T, k), "w": (k, 37), "col": (37,), "row": (B, T, 1), "scale": (),
                  "res": (B, T, 37), "table": (1, T, 37), "mask": (B, T, 37)}
        feeds = {n.name: (RNG.random(shapes[n.name]) < 0.5) if n.dtype.name == "bool"
                 else rand(*shapes[n.name]) for n in leaves}
        want = _reference(leaves, feeds)
        got = kernel.fn(*(feeds[n.name] for n in order))
        assert got.shape == want.shape
        assert relative_error(got, want) <= kernel.tolerance, (B, T, k)
        packed = gemm.pack(feeds["w"], False)
        out = np.full(want.shape, np.nan, np.float32)
        assert kernel.fn(*(packed if n is region.w else feeds[n.name] for n in order),
                         out=out) is out
        np.testing.assert_array_equal(out, got)


def _reference(leaves, feeds):
    """The zoo's graph in float64 on leaves of the shapes of ``feeds``."""
    x, w, col, row, scale, res, table, mask = (tg.input(n.name, feeds[n.name].shape, n.dtype)
                                               for n in leaves)
    h = x @ w + col
    y = tg.where(mask, tg.tanh(h) * row, h * scale) + res * table
    return tg.evaluate(y, feeds, dtype="float64")


def test_the_rounding_bound_covers_the_kernel():
    y, leaves = _operand_zoo()
    _, _, (covers, region) = region_of(y)
    kernel = ge.build_gemm_kernel(region)
    order = [region.a, region.w, *region.inputs]
    shapes = [tuple(n.shape) for n in order]
    arrays = [(RNG.random(s) < 0.5) if n.dtype.name == "bool" else rand(*s)
              for n, s in zip(order, shapes)]
    got = kernel.fn(*arrays).astype(np.float64)
    want = _reference(leaves, {n.name: a for n, a in zip(order, arrays)})
    bound = ge.gemm_rounding_bound(region, *arrays)
    assert np.isfinite(bound).all() and (bound > 0).all()
    assert (np.abs(got - want) <= bound).all()
    assert np.median(bound / np.maximum(np.abs(want), 1e-3)) < 1e-4  # not vacuous


def test_profiled_like_any_kernel_and_replayed_from_a_lock_file(tmp_path):
    """profile="missing" builds (so verifies) the candidate, times it beside the unfused
    options and records its row under its source hash; a lock file replays the plan."""
    from tensor_graphs.db.store import Database

    db = str(tmp_path / "m.sqlite")
    x, w, b = tg.input("x", (32, 64)), tg.weight("w", (64, 48)), tg.weight("b", (48,))
    y = silu(x @ w + b) * 0.9 + 0.1
    prog = tg.compile(y, db=db, profile="missing")
    assert prog.stats["measured"] > 0
    with Database(db) as d:
        rows = [r for r in d.rows() if r.kernel.startswith("c_gemm_ep_")]
    assert rows and all(r.failure is None and r.error < 1e-5 for r in rows), rows
    names = [s.kernel.name for s in prog.plan.steps]
    prog.save_plan(tmp_path / "plan.json")
    replayed = tg.compile(y, db=db, plan=str(tmp_path / "plan.json"))
    assert replayed.stats["replayed"] == 1
    assert [s.kernel.name for s in replayed.plan.steps] == names
    weights = dict(w=rand(64, 48), b=rand(48))
    replayed.bind(**weights)
    check(replayed, y, {"x": rand(32, 64)}, weights)


def test_a_symbolic_batch_flattened_into_the_rows():
    """A transformer's ``x.view(-1, K) @ W + b`` viewed back as (batch, T, N) under a symbolic
    batch: ``a`` is (T*batch, K), the result (batch, T, N). The kernel solves batch from its
    rows (it was refused: "dims ['batch'] ... are not named by the operands", and planned
    again without it)."""
    K, N, T = 24, 40, 8
    x = tg.input("x", ("batch", T, K))
    w, b = tg.weight("w", (K, N)), tg.weight("b", (N,))
    h = tg.reshape(tg.reshape(x, (x.shape[0] * T, K)) @ w + b, (x.shape[0], T, N))
    y = tg.tanh(h) * 0.5 + 1.0
    weights = dict(w=rand(K, N), b=rand(N))
    prog = compiled(y, weights, bounds={"batch": 4})
    one_generated_gemm(prog, "reshape", "exp")
    assert prog.stats["planner_runs"] == 1 and "generated_refused" not in prog.stats
    for batch in (4, 1, 3):
        check(prog, y, {"x": rand(batch, T, K)}, weights)


def test_rows_that_split_in_several_ways_are_not_offered():
    """(batch*seq, K) @ W viewed as (batch, seq, N) with nothing else naming batch or seq:
    the arrays alone do not say the result's shape, so no generated GEMM is offered."""
    K, N = 24, 40
    x = tg.input("x", ("batch", "seq", K))
    w, b = tg.weight("w", (K, N)), tg.weight("b", (N,))
    rows = x.shape[0] * x.shape[1]
    h = tg.reshape(tg.reshape(x, (rows, K)) @ w + b, (x.shape[0], x.shape[1], N))
    y = tg.tanh(h) * 0.5 + 1.0
    found = ge.gemm_region(*_atomic_root_and_uses(y))
    assert found is not None and found[1].reshaped
    assert not ge.resolvable(found[1])
    weights = dict(w=rand(K, N), b=rand(N))
    prog = compiled(y, weights, bounds={"batch": 2, "seq": 4})
    assert prog.stats["planner_runs"] == 1 and "generated_refused" not in prog.stats
    check(prog, y, {"x": rand(2, 3, K)}, weights)


def _atomic_root_and_uses(y):
    from tensor_graphs.ir.node import expand_composite

    memo = {}

    def expand(n):
        if n not in memo:
            memo[n] = expand_composite(n.op, n.inputs, n.attrs)
        return memo[n]

    root = y
    while not root.op.is_atomic:
        root = expand(root)
    return root, use_counts([y]), expand
