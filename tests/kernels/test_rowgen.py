"""Generated row kernels (kernels/c/rowgen.py): softmax, log-softmax and the norms a user writes
by hand, with their residual adds, as one generated step of a plan, checked against the float64
reference on adversarial rows (offsets of 1e3, logits of +-80, -inf masks, rows of 1 and odd
lengths, non-contiguous inputs); a wrong render is refused and planned without."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.node import expand_composite
from tensor_graphs.ir.ops.names import MAX
from tensor_graphs.kernels import generated
from tensor_graphs.kernels.c import build, rowgen
from tensor_graphs.kernels.verify import compare

pytestmark = pytest.mark.skipif(not build.available(),
                                reason=f"no C compiler: {build.unavailable_reason()}")


# ---------------------------------------------------------------------------- the forms
def softmax(x):
    e = tg.exp(x - tg.max(x, axis=-1, keepdims=True))
    return e / tg.sum(e, axis=-1, keepdims=True)


def log_softmax(x):
    s = x - tg.max(x, axis=-1, keepdims=True)
    return s - tg.log(tg.sum(tg.exp(s), axis=-1, keepdims=True))


def rms_norm(h, w):
    return h * tg.rsqrt(tg.mean(h * h, axis=-1, keepdims=True) + 1e-6) * w


def layer_norm(h, w, b):
    c = h - tg.mean(h, axis=-1, keepdims=True)
    return c * tg.rsqrt(tg.mean(c * c, axis=-1, keepdims=True) + 1e-5) * w + b


def layer_norm_var(h, w, b):
    """The other spelling: var() and a division."""
    mu = tg.mean(h, axis=-1, keepdims=True)
    return (h - mu) / tg.sqrt(tg.var(h, axis=-1, keepdims=True) + 1e-5) * w + b


def scale_norm(h, g):
    return h * g / tg.sqrt(tg.sum(h * h, axis=-1, keepdims=True))


def leaves(shape, dtype="float32"):
    d = shape[-1]
    return (tg.input("x", shape, dtype), tg.input("r", shape, dtype), tg.weight("w", (d,), dtype),
            tg.weight("b", (d,), dtype), tg.weight("g", (), dtype), tg.input("m", shape, dtype))


def form(name, shape, dtype="float32"):
    x, r, w, b, g, m = leaves(shape, dtype)
    return {
        "softmax": lambda: softmax(x),
        "masked scaled softmax": lambda: softmax(x * 0.125 + m),
        "log_softmax": lambda: log_softmax(x),
        "rms_norm + residual": lambda: rms_norm(x + r, w),
        "scale_norm": lambda: scale_norm(x, g),
        "scale_norm + residual": lambda: scale_norm(x + r, g),
        "layer_norm + scaled residual": lambda: layer_norm(x + 0.5 * r, w, b),
        "layer_norm + residual": lambda: layer_norm(x + r, w, b),
        "layer_norm (var) + residual": lambda: layer_norm_var(x + r, w, b),
        "rms_norm": lambda: rms_norm(x, w),
        "layer_norm": lambda: layer_norm(x, w, b),
    }[name]()


# forms no hand kernel covers whole in float32: one generated step at estimated costs
FLOAT32 = ["softmax", "masked scaled softmax", "log_softmax", "rms_norm + residual",
           "scale_norm", "scale_norm + residual", "layer_norm + scaled residual"]
# the norms c_rms_norm, c_layer_norm and c_add_layer_norm compute whole in float32 (ties on
# estimates, which the hand kernel wins): in float64 only the generated kernel is one step
FLOAT64 = ["layer_norm + residual", "layer_norm (var) + residual", "rms_norm", "layer_norm",
           "softmax", "log_softmax"]


# ---------------------------------------------------------------------------- values
def adversarial(name, shape, dtype, rng):
    """Rows far from zero (norms) or large logits with -inf masks (softmaxes)."""
    rows = int(np.prod(shape[:-1]))
    n = shape[-1]
    z = rng.standard_normal((rows, n))
    sign = np.where(np.arange(rows) % 2 == 0, 1.0, -1.0)[:, None]
    if "softmax" in name:
        x = 80.0 * sign + 10.0 * z  # exp(x) of a row without its max: 1e35 and 1e-35
        if name.startswith("masked"):
            masked = rng.random((rows, n)) < 0.4
            masked[np.arange(rows), rng.integers(0, n, rows)] = False  # one finite per row
            m = np.where(masked, -np.inf, 0.0)
            return {"x": x.reshape(shape).astype(dtype), "m": m.reshape(shape).astype(dtype)}
        return {"x": x.reshape(shape).astype(dtype)}
    x = 1e3 * sign + z  # E[x^2] - E[x]^2 loses every digit here
    return {"x": x.reshape(shape).astype(dtype),
            "r": rng.standard_normal(shape).astype(dtype),
            "w": rng.standard_normal(n).astype(dtype), "b": rng.standard_normal(n).astype(dtype),
            "g": np.asarray(rng.uniform(0.5, 2.0), dtype)}


def used(graph, feeds):
    names = {n.name for n in tg.nodes(graph) if n.op.is_leaf}
    return {k: v for k, v in feeds.items() if k in names}


def assert_close(got, graph, feeds, tolerance):
    """NaN and inf where the float64 reference (or the graph in its own dtypes) has them; the
    rest within the tolerance, or within twice the error of numpy evaluating the same graph
    in its own dtypes (float32 rounds x + r far from zero; no kernel can undo that)."""
    feeds = used(graph, feeds)
    ref = tg.evaluate(graph, feeds, dtype="float64")
    own = tg.evaluate(graph, feeds)
    error, problem = compare(got, ref, own)
    assert problem is None, problem
    assert error <= max(tolerance, 2 * compare(own, ref)[0]), error


def run(prog, graph, feeds):
    weights = {k: v for k, v in used(graph, feeds).items() if k in ("w", "b", "g")}
    if weights:
        prog.bind(**weights)
    return prog(**{k: v for k, v in used(graph, feeds).items() if k not in weights})


def generated_steps(prog):
    return [s for s in prog.plan.steps if getattr(s.kernel, "generated", False)]


def row_step(prog):
    """The plan's one step, a generated row kernel."""
    assert len(prog.plan.steps) == 1, prog.explain()
    (step,) = generated_steps(prog)
    assert isinstance(step.kernel, rowgen.RowKernel) and step.kernel.name.startswith("c_row_")
    return step


# ---------------------------------------------------------------------------- plans
@pytest.mark.parametrize("name", FLOAT32)
def test_float32_forms_are_one_generated_step(name):
    shape = (6, 67)
    y = form(name, shape)
    prog = tg.compile(y, db=":memory:")
    step = row_step(prog)
    assert {n.op.name for n in step.nodes} & {"sum", "max"}
    assert "generated: " in prog.explain()
    feeds = adversarial(name, shape, np.float32, np.random.default_rng(0))
    assert_close(run(prog, y, feeds), y, feeds, step.kernel.tolerance)


@pytest.mark.parametrize("name", FLOAT64)
def test_float64_forms_are_one_generated_step(name):
    shape = (5, 33)
    y = form(name, shape, "float64")
    prog = tg.compile(y, db=":memory:")
    step = row_step(prog)
    assert step.kernel.tolerance <= 1e-11
    feeds = adversarial(name, shape, np.float64, np.random.default_rng(1))
    assert_close(run(prog, y, feeds), y, feeds, step.kernel.tolerance)


def test_a_softmax_over_heads_with_a_broadcast_causal_mask():
    b, h, s = 2, 3, 19
    scores, mask = tg.input("s", (b, h, s, s)), tg.input("m", (1, 1, s, s))
    y = softmax(scores * 0.125 + mask)
    prog = tg.compile(y, db=":memory:")
    row_step(prog)
    rng = np.random.default_rng(2)
    feeds = {"s": (rng.standard_normal((b, h, s, s)) * 30 + 80).astype(np.float32),
             "m": np.triu(np.full((s, s), -np.inf, np.float32), 1)[None, None]}
    got = prog(**feeds)
    assert np.all(got[..., np.isinf(feeds["m"][0, 0])] == 0.0)
    assert np.abs(got.sum(-1) - 1).max() < 1e-6
    assert_close(got, y, feeds, 1e-6)


def test_the_residual_stream_read_outside_is_stored_beside_the_norm():
    """h = x + r is also an output: the norm's kernel computes it and stores it as a second
    output (``Step.also``), so the add and the norm are one step, and both outputs match."""
    x, r, _, _, g, _ = leaves((8, 40))
    h = x + r
    outs = [h, scale_norm(h, g)]
    prog = tg.compile(outs, db=":memory:")
    (step,) = generated_steps(prog)
    assert h in step.nodes and step.also == (h,) and len(prog.plan.steps) == 1
    assert "stores 1 more" in prog.explain()
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((8, 40), np.float32),
             "r": rng.standard_normal((8, 40), np.float32)}
    gv = np.asarray(1.5, np.float32)
    prog.bind(g=gv)
    got = prog(**feeds)
    want = tg.evaluate(outs, {**feeds, "g": gv}, dtype="float64")
    assert compare(got[0], want[0])[0] <= 1e-7
    assert compare(got[1], want[1])[0] <= 1e-5


def test_without_stored_regions_the_residual_stream_is_an_input(monkeypatch):
    """The same graph when no generator stores values (the rows_stored row left out): h is
    made by its own step and the norm's region reads it."""
    x, r, _, _, g, _ = leaves((8, 40))
    h = x + r
    outs = [h, scale_norm(h, g)]
    rows = tuple(row for row in generated.generators() if row[0] != "rows_stored")
    monkeypatch.setattr(generated, "generators", lambda: rows)
    prog = tg.compile(outs, db=":memory:")
    (step,) = generated_steps(prog)
    assert h not in step.nodes and any(s.node is h for s in prog.plan.steps)
    assert len(prog.plan.steps) == 2 and step.also == ()


def test_an_input_that_also_feeds_another_input_is_checked_as_the_region_reads_it():
    """x and m = (x @ V) @ W both feed the region (as a block's input and its attention
    output feed GPT-2's residual add and norm): the check builds the region alone over its
    inputs, not the whole graph above them at the trial shapes (x at (3, 1) in x @ V was a
    ShapeError, and every such norm was refused)."""
    x, _, _, _, g, _ = leaves((4, 32))
    m = (x @ tg.weight("V", (32, 32))) @ tg.weight("W", (32, 32))
    y = x * g / tg.sqrt(tg.sum(m * m, axis=-1, keepdims=True))
    prog = tg.compile(y, db=":memory:")
    assert not prog.stats.get("generated_refused"), generated.refused
    (step,) = [s for s in prog.plan.steps if isinstance(s.kernel, rowgen.RowKernel)]
    assert {s.node.op.name for s in step.inputs} >= {"input", "matmul"}
    rng = np.random.default_rng(7)
    weights = {"V": rng.standard_normal((32, 32)).astype(np.float32) / 6,
               "W": rng.standard_normal((32, 32)).astype(np.float32) / 6,
               "g": np.asarray(1.5, np.float32)}
    prog.bind(**weights)
    feeds = {"x": rng.standard_normal((4, 32)).astype(np.float32)}
    assert_close(prog(**feeds), y, {**feeds, **weights}, 1e-5)


def test_a_tie_with_a_hand_kernel_still_offers_the_generated_step():
    """float32 LayerNorm + residual: c_add_layer_norm and the generated kernel cover the same
    region at the same estimated cost; the hand kernel wins the tie, the other is one path."""
    y = form("layer_norm + residual", (4, 32))
    prog = tg.compile(y, db=":memory:")
    assert [s.kernel.name for s in prog.plan.steps] == ["c_add_layer_norm"]
    cheapest = itertools.islice(tg.paths(y, db=":memory:", tolerance=1e-5), 4)
    one_step = [p for p in cheapest
                if len(p.steps) == 1 and isinstance(p.steps[0].kernel, generated.Candidate)]
    assert one_step and one_step[0].cost == pytest.approx(prog.plan.cost)


# ---------------------------------------------------------------------------- shapes, layouts
def test_rows_of_one_odd_lengths_and_strided_inputs_through_one_plan():
    """Planned once for symbolic dims (the mean divides by a dim leaf): rows of 1, 7, 67 and
    1025 elements, and transposed or sliced feeds, run the same generated kernel."""
    x, r, w = tg.input("x", ("n", "d")), tg.input("r", ("n", "d")), tg.weight("w", ("d",))
    y = layer_norm(x + r, w, tg.weight("b", ("d",)))
    prog = tg.compile(y, db=":memory:", bounds={"n": 32, "d": 2048})
    step = row_step(prog)
    rng = np.random.default_rng(4)
    for n, d in ((3, 1), (5, 7), (32, 67), (4, 1025)):
        feeds = adversarial("layer_norm", (n, d), np.float32, rng)
        assert_close(run(prog, y, feeds), y, feeds, step.kernel.tolerance)
        wide = adversarial("layer_norm", (n, 2 * d), np.float32, rng)
        views = {"x": np.asfortranarray(feeds["x"]), "r": wide["r"][:, ::2]}
        strided = {**feeds, **views}
        assert not views["r"].flags.c_contiguous
        assert_close(run(prog, y, strided), y, strided, step.kernel.tolerance)


def expand_of():
    memo = {}

    def expand(n):
        if n not in memo:
            memo[n] = expand_composite(n.op, n.inputs, n.attrs)
        return memo[n]
    return expand


def atomic_root(y, expand):
    while not y.op.is_atomic:
        y = expand(y)
    return y


def candidate(y):
    expand = expand_of()
    return rowgen.row_candidate(atomic_root(y, expand), {}, expand)


def test_the_kernel_reads_broadcast_and_strided_rows_itself():
    y = form("masked scaled softmax", (5, 33))
    cand = candidate(y)
    kernel = generated.realize(cand)
    rng = np.random.default_rng(5)
    base = adversarial("masked scaled softmax", (5, 66), np.float32, rng)
    x, m = base["x"][:, ::2], np.broadcast_to(base["m"][:1, :33], (5, 33))
    got = kernel.fn(x, m)
    assert_close(got, y, {"x": np.ascontiguousarray(x), "m": np.ascontiguousarray(m)},
                 kernel.tolerance)
    out = np.full((5, 33), np.nan, np.float32)
    assert kernel.fn(x, m, out=out) is out and np.array_equal(out, got)


# ---------------------------------------------------------------------------- what it claims
def test_pure_elementwise_regions_and_per_row_roots_are_not_claimed():
    x, r, w, *_ = leaves((4, 16))
    expand = expand_of()
    pointwise = tg.exp(x * 0.5 + r) * w
    assert rowgen.row_candidate(atomic_root(pointwise, expand), {}, expand) is None
    statistic = tg.sum(x * x, axis=-1, keepdims=True) + 1.0  # one value per row: not a row
    assert rowgen.row_candidate(atomic_root(statistic, expand), {}, expand) is None
    across = x - tg.max(x, axis=0, keepdims=True)  # not the last axis
    assert rowgen.row_candidate(atomic_root(across, expand), {}, expand) is None


def region_of(y, width):
    expand = expand_of()
    top = atomic_root(y, expand)
    covers, boundary, through = generated.grow(top, {}, expand,
                                               lambda n: rowgen.joins(n, width))
    return rowgen.row_region(generated.rebuilt(covers, through), boundary)


def test_an_exp_made_in_an_earlier_pass_is_kept_in_the_output_row():
    """softmax: exp(x - max) is made in the sum's pass, kept in the output row (no scratch)
    and read back by the epilogue, not computed again."""
    region = region_of(form("softmax", (4, 16)), 16)
    passes, stored = rowgen.passes(region)
    assert [len(p.reduces) if p.reduces is not None else None for p in passes] == [1, 1, None]
    assert [n.op.name for n in stored] == ["exp"]
    assert [n.op.name for n in passes[2].loads] == ["exp"]
    assert not any(n.op.name == "exp" for n in passes[2].computes)
    assert list(rowgen.row_buffers(region, passes, stored).values()) == ["po"]


def test_layer_norm_keeps_x_plus_r_and_subtracts_the_mean_again():
    """x + r reads two rows: kept (in the output row); x - mean is one subtraction from it:
    computed again in the variance's pass and in the epilogue rather than stored."""
    region = region_of(form("layer_norm + residual", (4, 16)), 16)
    passes, stored = rowgen.passes(region)
    assert [n.op.name for n in stored] == ["add"] and {n.ndim for n in stored} == {2}
    assert rowgen.row_buffers(region, passes, stored) == {next(iter(stored)): "po"}
    centred = [n for p in passes[1:] for n in p.computes
               if n.op.name == "add" and n.inputs[0] in stored]
    assert len(centred) == 2  # once per later pass


# ---------------------------------------------------------------------------- refusal
def test_a_render_without_the_max_subtraction_is_refused_and_planned_without(monkeypatch):
    """The renderer's max gives 0: exp(x) / sum(exp(x)) agrees on unit-scale rows, overflows
    on large logits; verification refuses it before it runs and the plan is made again."""
    right = rowgen.REDUCTIONS[MAX]
    wrong = rowgen.Reduction(right.declare, right.block, right.merge, right.identity,
                             lambda a, t: ("", f"({t})0"))
    monkeypatch.setitem(rowgen.REDUCTIONS, MAX, wrong)
    monkeypatch.setattr(generated, "refused", {})
    monkeypatch.setattr(generated, "_built", {})
    x = tg.input("x", (6, 45))
    y = softmax(x * 0.75 - 0.5)  # a structure no other test builds
    prog = tg.compile(y, db=":memory:")
    assert prog.stats["generated_refused"] >= 1
    assert not any(isinstance(s.kernel, rowgen.RowKernel) for s in prog.plan.steps)
    assert any("failed verification" in why and "logits" in why
               for why in generated.refused.values()), generated.refused
    feeds = adversarial("softmax", (6, 45), np.float32, np.random.default_rng(6))
    assert_close(prog(**feeds), y, feeds, 1e-5)


def test_the_right_render_of_the_same_softmax_is_admitted():
    x = tg.input("x", (6, 45))
    y = softmax(x * 0.75 - 0.5)
    prog = tg.compile(y, db=":memory:")
    row_step(prog)


def test_large_rows_in_parallel_with_row_buffers_and_gathers():
    """(64, 1024): the rows split across threads (when the cores are free), each thread with
    its own scratch (a float64 exp kept apart from the float32 output row) and gather buffers
    (strided and column-major inputs); the same values whatever the layout."""
    z = tg.input("z", (64, 1024), "float64")
    y = tg.cast(softmax(z), "float32")
    prog = tg.compile(y, db=":memory:")
    step = row_step(prog)
    zv = np.random.default_rng(8).standard_normal((64, 1024)) * 30
    got = prog(z=zv)
    assert_close(got, y, {"z": zv}, 1e-6)
    for view in (np.repeat(zv, 2, axis=1)[:, ::2], np.asfortranarray(zv)):
        assert np.array_equal(step.kernel.fn(view), got)
    assert "m0" in step.kernel.fn.source_text  # the float64 exp's buffer
