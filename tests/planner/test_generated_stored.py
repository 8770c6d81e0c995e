"""Generated kernels with several outputs (kernels/generated.py ``grow_stored``, the
``rows_stored`` generator, ``Step.also``): a value inside a region that is also read outside
(the residual stream a norm reads and the next block reads too) is stored by the region's
kernel beside its root, in a buffer of its own, instead of cutting the region there."""

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.graph import use_counts
from tensor_graphs.ir.node import expand_composite
from tensor_graphs.kernels import generated
from tensor_graphs.numerics import relative_error

pytestmark = pytest.mark.skipif(not tg.kernels.c.available(), reason="no C compiler")

D = 256


def rms_norm(h, w):
    """A user's own RMSNorm, Gemma's spelling: a division by the root and a (1 + w) scale."""
    return h / tg.sqrt(tg.mean(h * h, axis=-1, keepdims=True) + 1e-6) * (w + 1.0)


def block(x, r, w, wo):
    """A pre-norm residual block: h = x + r is normalised AND read by the next residual."""
    h = x + r
    y = rms_norm(h, w)
    return h, y, h + tg.matmul(y, wo)


def feeds(rows, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((rows, D), np.float32),
            "r": rng.standard_normal((rows, D), np.float32) * 0.5,
            "w": rng.standard_normal(D).astype(np.float32),
            "wo": (rng.standard_normal((D, D)) / 16).astype(np.float32)}


def graph(rows=64):
    x, r = tg.input("x", (rows, D)), tg.input("r", (rows, D))
    w, wo = tg.input("w", (D,)), tg.input("wo", (D, D))
    return block(x, r, w, wo)


def without_stored(monkeypatch):
    rows = tuple(row for row in generated.generators() if row[0] != "rows_stored")
    monkeypatch.setattr(generated, "generators", lambda: rows)


def stored_steps(prog):
    return [s for s in prog.plan.steps if any(a is not None for a in s.also)]


def check(prog, outs, values, tol=1e-5):
    single = not isinstance(outs, (list, tuple))
    got = prog(**values)
    want = tg.evaluate(outs, values, dtype="float64")
    for g, w in zip([got] if single else got, [want] if single else want):
        assert relative_error(g, w) <= tol


def test_residual_and_rms_norm_are_one_generated_step_storing_the_stream(monkeypatch):
    h, y, out = graph()
    prog = tg.compile(out, db=":memory:")
    (step,) = stored_steps(prog)
    assert step.also == (h,) and h in step.nodes
    assert {n.op.name for n in step.nodes} >= {"add", "sum", "sqrt"}
    assert not any(s.node is h for s in prog.plan.steps)  # no step of its own
    check(prog, out, feeds(64))
    with monkeypatch.context() as m:  # the plan that cuts the region at h
        without_stored(m)
        split = tg.compile(out, db=":memory:")
    assert not stored_steps(split) and any(s.node is h for s in split.plan.steps)
    assert len(prog.plan.steps) < len(split.plan.steps)
    assert prog.plan.cost < split.plan.cost


def test_every_output_matches_the_reference_and_has_its_own_buffer():
    h, y, out = graph()
    prog = tg.compile([h, y, out], db=":memory:")
    (step,) = stored_steps(prog)
    check(prog, [h, y, out], feeds(64, 1))
    live = prog.memory_plan.liveness
    (hk,) = [k for k in live.values if k.node is h]
    (yk,) = [k for k in live.values if k.node is step.node]
    assert live.values[hk].buffer is not live.values[yk].buffer
    assert live.values[hk].buffer.first == live.values[yk].buffer.first


def test_runs_natively_after_recording():
    h, y, out = graph(32)
    prog = tg.compile(out, db=":memory:")
    assert stored_steps(prog)
    values = feeds(32, 2)
    for _ in range(3):
        check(prog, out, values)
    assert prog.loop.startswith("native loop"), prog.loop


def test_lock_file_replays_the_stored_value(tmp_path):
    h, y, out = graph(16)
    prog = tg.compile(out, db=":memory:")
    (step,) = stored_steps(prog)
    assert any(d.startswith("also:") for d in prog.plan.decisions)
    prog.save_plan(tmp_path / "plan.json")
    again = tg.compile(out, db=":memory:", plan=str(tmp_path / "plan.json"))
    assert again.stats["replayed"] == 1
    assert [s.kernel.name for s in stored_steps(again)] == [step.kernel.name]
    check(again, out, feeds(16, 3))


def test_profiled_and_measured(tmp_path):
    """profile="missing" builds (verifies) and times the stored candidate like any kernel;
    measurement then decides (on a loaded machine c_add + a norm may win)."""
    from tensor_graphs.db.store import open_db

    h, y, out = graph(32)
    path = str(tmp_path / "m.sqlite")
    estimated = tg.compile(out, db=":memory:")
    (step,) = stored_steps(estimated)
    prog = tg.compile(out, db=path, profile="missing")
    rows = [r for r in open_db(path).rows() if r.kernel == step.kernel.name]
    assert rows and all(r.ok for r in rows)
    assert all(s.source == "measured" for s in stored_steps(prog))
    check(prog, out, feeds(32, 4))


def test_symbolic_rows():
    x, r = tg.input("x", ("n", D)), tg.input("r", ("n", D))
    w, wo = tg.input("w", (D,)), tg.input("wo", (D, D))
    h, y, out = block(x, r, w, wo)
    prog = tg.compile(out, db=":memory:", bounds={"n": 48})
    assert stored_steps(prog)
    for n in (1, 7, 48):
        check(prog, out, feeds(n, n))


def test_a_stored_value_feeding_the_regions_own_input_is_planned_without():
    """y = rms_norm(h + h @ wo): the region rooted at y would store h, which the product it
    reads is computed from: no order runs that kernel, so it is not in the plan."""
    x, r = tg.input("x", (16, D)), tg.input("r", (16, D))
    w, wo = tg.input("w", (D,)), tg.input("wo", (D, D))
    h = x + r
    y = rms_norm(h + tg.matmul(h, wo), w)
    prog = tg.compile(y, db=":memory:")
    for s in stored_steps(prog):
        assert all(i.node is not h for i in s.inputs)
    check(prog, y, feeds(16, 5))


def test_the_gpu_generators_store_nothing():
    """Only the C row generator stores values: the Triton renderers are not offered regions
    with several outputs (their regions stop at a value read outside)."""
    kinds = {kind for name, kind, _ in generated.generators()
             if name in ("rows_stored", "rows_grouped")}
    assert kinds == {"cpu"}
    h, y, out = graph(8)
    uses = use_counts([out])
    memo = {}

    def expand(n):
        if n not in memo:
            memo[n] = expand_composite(n.op, n.inputs, n.attrs)
        return memo[n]

    found = generated.candidates(y, uses, expand)
    assert any(c.also == (h,) for c in found)
    assert all(not c.also for c in found if c.device != "cpu")
