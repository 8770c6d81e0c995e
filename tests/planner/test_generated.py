"""Generated kernels as planner options (kernels/generated.py, planner/realize.py): regions
of the graph offered beside the registered kernels, built and verified only when chosen."""

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.graph import use_counts
from tensor_graphs.ir.node import Node
from tensor_graphs.kernels import generated
from tensor_graphs.kernels.c import codegen
from tensor_graphs.numerics import relative_error

pytestmark = pytest.mark.skipif(not tg.kernels.c.available(), reason="no C compiler")


def chain(x, n=12):
    """An elementwise chain nobody hand-fused: tanh, affine and sigmoid in turn."""
    y = x
    for i in range(n):
        y = (tg.tanh(y * 1.01 + 0.1), y * 0.9 + 0.05, tg.sigmoid(y))[i % 3]
    return y


def generated_steps(prog):
    return [s for s in prog.plan.steps if getattr(s.kernel, "generated", False)]


def check(prog, out, feeds):
    got = prog(**feeds)
    want = tg.evaluate(out, feeds, dtype="float64")
    assert relative_error(got, want) <= 1e-5


def test_a_chain_nobody_fused_is_one_generated_step():
    x = tg.input("x", (64, 300))
    y = chain(x)
    prog = tg.compile(y, db=":memory:")
    assert len(prog.plan.steps) == 1
    (step,) = generated_steps(prog)
    assert step.kernel.name.startswith("c_fused_")
    assert "generated: " in prog.explain() and "tanh" not in step.kernel.name
    check(prog, y, {"x": np.random.default_rng(0).standard_normal((64, 300), np.float32)})


def test_without_generation_the_chain_runs_op_by_op():
    x = tg.input("x", (64, 300))
    y = chain(x)
    prog = tg.compile(y, db=":memory:", generate=False)
    assert not generated_steps(prog) and len(prog.plan.steps) > 1
    check(prog, y, {"x": np.random.default_rng(1).standard_normal((64, 300), np.float32)})


def test_a_region_reaches_through_a_composite_input():
    """add(gelu(a), r): gelu is a composite with a hand kernel; one loop computes both."""
    a, r = tg.input("a", (32, 128)), tg.input("r", (128,))
    y = tg.gelu(a) * 1.5 + r
    prog = tg.compile(y, db=":memory:")
    (step,) = generated_steps(prog)
    assert len(prog.plan.steps) == 1
    assert {n.op.name for n in step.nodes} >= {"erfc", "mul", "add"}
    rng = np.random.default_rng(2)
    check(prog, y, {"a": rng.standard_normal((32, 128), np.float32),
                    "r": rng.standard_normal(128).astype(np.float32)})


def test_a_value_read_twice_is_made_once():
    """exp(x) feeds two outputs: neither region may recompute it, nor hide it inside."""
    x = tg.input("x", (16, 40))
    e = tg.exp(x * 0.5)
    outs = [tg.tanh(e) + 1.0, e * e - 2.0]
    prog = tg.compile(outs, db=":memory:")
    covered = [n for s in generated_steps(prog) for n in s.nodes]
    assert len(covered) == len(set(covered))
    assert sum(1 for s in prog.plan.steps for n in s.nodes if n is e) == 1
    feeds = {"x": np.random.default_rng(3).standard_normal((16, 40), np.float32)}
    got = prog(**feeds)
    for g, w in zip(got, tg.evaluate(outs, feeds, dtype="float64")):
        assert relative_error(g, w) <= 1e-5


def test_a_generator_bug_is_refused_and_planned_without(monkeypatch):
    """The renderer emits exp(x) + 0.001: the check against the float64 reference refuses
    the kernel before it is ever timed or run, and the plan is made again without it."""
    real = codegen._expr

    def buggy(n, args, helpers, values):
        text = real(n, args, helpers, values)
        return f"({text} + 0.001f)" if n.op.name == "exp" else text

    monkeypatch.setattr(codegen, "_expr", buggy)
    monkeypatch.setattr(generated, "refused", {})
    monkeypatch.setattr(generated, "_built", {})
    codegen.clear_cache()
    try:
        x = tg.input("x", (8, 50))
        y = tg.exp(x * 0.25 + 0.5) * 3.0  # a structure no other test builds
        prog = tg.compile(y, db=":memory:")
        assert prog.stats["generated_refused"] >= 1
        assert not [n for s in generated_steps(prog) for n in s.nodes if n.op.name == "exp"]
        assert any("disagrees with the reference" in why for why in generated.refused.values())
        check(prog, y, {"x": np.random.default_rng(4).standard_normal((8, 50), np.float32)})
    finally:
        codegen.clear_cache()


def test_paths_and_counts_include_generated_kernels():
    x = tg.input("x", (4, 16))
    y = tg.exp(x) * 2.0 + 1.0
    with_gen = tg.count_paths(y, db=":memory:")
    without = tg.count_paths(y, db=":memory:", generate=False)
    assert with_gen > without
    found = [p for p in tg.paths(y, db=":memory:")
             if any(isinstance(s.kernel, generated.Candidate) for s in p.steps)]
    assert found and min(len(p.steps) for p in found) == 1


def test_profiled_generated_kernels_are_measured_and_replayed_from_a_lock_file(tmp_path):
    db = str(tmp_path / "m.sqlite")
    x = tg.input("x", (32, 64))
    y = chain(x, 6) - 0.5  # sub decomposes to add(y, neg(0.5)): a value only inside it
    prog = tg.compile(y, db=db, profile="missing")
    (step,) = generated_steps(prog)
    assert prog.stats["measured"] > 0
    again = tg.compile(y, db=db)
    assert [s.source for s in generated_steps(again)] == ["measured"]
    prog.save_plan(tmp_path / "plan.json")
    replayed = tg.compile(y, db=db, plan=str(tmp_path / "plan.json"))
    assert replayed.stats["replayed"] == 1
    assert [s.kernel.name for s in replayed.plan.steps] == [step.kernel.name]
    check(replayed, y, {"x": np.random.default_rng(5).standard_normal((32, 64), np.float32)})


def test_a_candidate_builds_its_own_source_not_a_twins_built_earlier(tmp_path):
    """x * 1.37 + 0.29 and 0.29 + x * 1.37 share a structural digest (the add commutes) but
    not their C source, nor so their names. Built after its twin (an earlier compile of the
    process), the candidate is the kernel of its own source: the rows a profiler files for it
    are found again. It was the twin, its rows filed under the twin's name: the plan went on
    an estimate, and every later ``tg profile`` of the graph in that process measured it
    again (a resume measured 1 call, not 0)."""
    x = tg.input("x", (8, 24))
    y = x * 1.37 + 0.29
    twin = Node.make(y.op, y.inputs[::-1], y.attrs)

    def candidate(root):
        return next(c for c in generated.candidates(root, use_counts([root]), lambda n: None,
                                                    "cpu") if c.generator == "elementwise")

    first, cand = generated.realize(candidate(twin)), candidate(y)
    assert first.name != cand.name  # twins: one digest, two sources
    built = generated.realize(cand)
    assert (built.name, built.source_hash) == (cand.name, cand.source_hash)
    prog = tg.compile(y, db=str(tmp_path / "m.sqlite"), profile="missing")
    assert [s.source for s in generated_steps(prog)] == ["measured"]  # its row, found


def test_symbolic_dims():
    x = tg.input("x", ("batch", 96))
    y = chain(x, 5)
    prog = tg.compile(y, db=":memory:", bounds={"batch": 16})
    assert generated_steps(prog)
    for b in (1, 7, 16):
        check(prog, y, {"x": np.random.default_rng(b).standard_normal((b, 96), np.float32)})


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_special_check_values_are_made_without_warnings_in_every_float_dtype(dtype):
    """A check's special values include a large finite one per dtype: 1e300 overflowed
    float16 and printed numpy's RuntimeWarning to a user compiling a float16 model."""
    import warnings

    from tensor_graphs.ir import dtypes

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = codegen._random_array(np.random.default_rng(0), (400,), dtypes.as_dtype(dtype),
                                  True, False).astype(np.float64)
    finite = np.abs(a[np.isfinite(a)])
    assert finite.max() == pytest.approx(codegen.BIG[dtype], rel=0.01)
