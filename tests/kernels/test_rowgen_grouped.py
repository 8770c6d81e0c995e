"""Generated row kernels over rows reached through a reshape (kernels/c/rowgen.py ``Frame``,
the ``rows_grouped`` generator): GroupNorm's statistics over (N, G, C/G * H * W) and its
per-channel scale and shift after the reshape back are one generated step, for
``tg.group_norm`` and for a GroupNorm a user writes by hand, checked against float64."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.kernels import generated
from tensor_graphs.kernels.c import build, rowgen
from tensor_graphs.numerics import relative_error

pytestmark = pytest.mark.skipif(not build.available(),
                                reason=f"no C compiler: {build.unavailable_reason()}")


def hand_group_norm(x, w, b, groups, eps=1e-5):
    """A user's own GroupNorm: var() and a division, the affine through reshapes of (C,)."""
    n, c, h, wd = x.shape
    g = tg.reshape(x, (n, groups, c // groups * h * wd))
    mu = tg.mean(g, axis=-1, keepdims=True)
    y = tg.reshape((g - mu) / tg.sqrt(tg.var(g, axis=-1, keepdims=True) + eps), x.shape)
    return y * tg.reshape(w, (c, 1, 1)) + tg.reshape(b, (c, 1, 1))


def leaves(shape):
    return tg.input("x", shape), tg.input("w", (shape[1],)), tg.input("b", (shape[1],))


def feeds(shape, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": (rng.standard_normal(shape) * 3 + 50).astype(np.float32),  # far from zero
            "w": rng.standard_normal(shape[1]).astype(np.float32),
            "b": rng.standard_normal(shape[1]).astype(np.float32)}


def generated_steps(prog):
    return [s for s in prog.plan.steps if getattr(s.kernel, "generated", False)]


def check(prog, y, values, tol=1e-5):
    got = prog(**values)
    assert relative_error(got, tg.evaluate(y, values, dtype="float64")) <= tol


SHAPES = [((8, 64, 32, 32), 32), ((1, 6, 5, 3), 3), ((2, 4, 7, 1), 4), ((3, 8, 2, 2), 1),
          ((2, 6, 3, 5), 6)]


@pytest.mark.parametrize("shape,groups", SHAPES, ids=[str(s) for s, _ in SHAPES])
@pytest.mark.parametrize("form", ["tg.group_norm", "by hand"])
def test_group_norm_is_one_generated_step(shape, groups, form):
    x, w, b = leaves(shape)
    y = tg.group_norm(x, w, b, num_groups=groups) if form == "tg.group_norm" \
        else hand_group_norm(x, w, b, groups)
    prog = tg.compile(y, db=":memory:")
    (step,) = prog.plan.steps
    assert step.kernel.generated and step.kernel.name.startswith("c_row_")
    assert {n.op.name for n in step.nodes} >= {"reshape", "sum", "mul", "add"}
    check(prog, y, feeds(shape, groups))


def test_group_norm_then_silu_is_one_step_and_strided_inputs_are_read():
    """A diffusion UNet's norm + activation; x fed as a transposed view (not dense)."""
    shape = (2, 8, 6, 6)
    x, w, b = leaves(shape)
    y = tg.silu(tg.group_norm(x, w, b, num_groups=4))
    prog = tg.compile(y, db=":memory:")
    assert len(prog.plan.steps) == 1 and generated_steps(prog)
    values = feeds(shape, 7)
    check(prog, y, values)
    values["x"] = np.ascontiguousarray(values["x"].transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    assert not values["x"].flags.c_contiguous
    check(prog, y, values)


def test_the_frame_reads_a_per_channel_weight_in_two_strides():
    """(N, G, D) rows and (N, C, H, W) values: a row is Cg x (H * W) elements, a weight
    (C,) read as (C, 1, 1) varies along the first only (stride 1, then 0)."""
    shape, groups = (2, 8, 3, 4), 4
    x, w, b = leaves(shape)
    y = tg.group_norm(x, w, b, num_groups=groups)
    cand = next(c for c in _candidates(y) if c.generator == "rows_grouped")
    kernel = cand.build()
    assert kernel.tolerance <= 1e-5
    frame = rowgen.Frame(shape, (2, 4, 24), ((2, 4, 24), (8, 1, 1)), ("rows", "out"), 12)
    copy, lead, strides = rowgen.frame_layout(frame, [np.zeros(shape, np.float32),
                                                      np.zeros(8, np.float32)])
    assert lead == [2, 4] and copy == (False, False)
    assert strides == [[96, 24, 12, 1], [0, 2, 1, 0]]
    assert rowgen.refinement((2, 4, 24), shape) == [(2, 0, 0), (4, 1, 1), (2, 2, 1), (3, 2, 2),
                                                    (4, 2, 3)]
    assert rowgen.refinement((2, 3), (3, 2)) is None  # a reshape that mixes axes


def test_a_wrong_frame_stride_is_refused(monkeypatch):
    """The renderer's layout reads the weight with a wrong stride: the check against the
    float64 reference refuses the kernel, and the plan is made without it."""
    real = rowgen._frame_strides

    def wrong(frame, refined, lead_axes, a, read, space, dense):
        out = real(frame, refined, lead_axes, a, read, space, dense)
        if out is not None and space == "out" and a.ndim == 1:
            out = out[:-2] + [0, 0]  # the weight's first value for every channel
        return out

    monkeypatch.setattr(rowgen, "_frame_strides", wrong)
    monkeypatch.setattr(generated, "refused", {})
    monkeypatch.setattr(generated, "_built", {})
    shape = (2, 6, 3, 3)
    x, w, b = leaves(shape)
    y = tg.group_norm(x, w, b, num_groups=3) * 1.25  # a structure no other test builds
    prog = tg.compile(y, db=":memory:")
    assert prog.stats["generated_refused"] >= 1
    assert any("disagrees with the reference" in why for why in generated.refused.values())
    assert not any(s.kernel.name.startswith("c_row_") for s in prog.plan.steps)
    check(prog, y, feeds(shape, 3))


def test_symbolic_batch_is_left_to_the_other_kernels():
    """The frame's reshapes name concrete shapes: a symbolic batch is not offered one, and
    the plan still computes GroupNorm."""
    x, w, b = tg.input("x", ("n", 8, 4, 4)), tg.input("w", (8,)), tg.input("b", (8,))
    y = tg.group_norm(x, w, b, num_groups=4)
    prog = tg.compile(y, db=":memory:", bounds={"n": 4})
    assert not any(s.kernel.name.startswith("c_row_") and "reshape" in
                   {n.op.name for n in s.nodes} for s in prog.plan.steps)
    for n in (1, 3):
        check(prog, y, feeds((n, 8, 4, 4), n))


def _candidates(y):
    from tensor_graphs.ir.graph import use_counts
    from tensor_graphs.ir.node import expand_composite

    memo: dict = {}  # the planner's decompositions are the same nodes every time

    def expand(n):
        if n not in memo:
            memo[n] = expand_composite(n.op, n.inputs, n.attrs)
        return memo[n]

    d = expand(y)
    return generated.candidates(d, use_counts([d]), expand, "cpu")


def test_a_per_channel_weight_is_read_once_per_channel_not_gathered():
    """The weight and bias are the same along H * W: the epilogue walks a row as Cg x
    (H * W) and reads them once per channel (they were gathered into a row buffer on every
    row, 0.23 ms of GroupNorm (8, 64, 32, 32)'s 0.25), strided views too."""
    shape, groups = (2, 8, 3, 4), 4
    x, w, b = leaves(shape)
    y = tg.group_norm(x, w, b, num_groups=groups)
    cand = next(c for c in _candidates(y) if c.generator == "rows_grouped")
    kernel = cand.build()
    source = kernel.fn.source_text
    assert "S1 x S2" in source
    assert source.count("g[j1 * S2 + j2]") == 1  # x alone may be gathered (a strided view)
    values = feeds(shape, 11)
    want = tg.evaluate(y, values, dtype="float64")
    wide = {"w": np.repeat(values["w"], 2), "b": np.repeat(values["b"], 3)}
    got = kernel.fn(values["x"], wide["w"][::2], wide["b"][::3])
    assert relative_error(got, want) <= kernel.tolerance


@pytest.mark.parametrize("kind", ["offset", "near-constant", "ramp"])
def test_group_norm_statistics_in_one_pass_keep_their_digits(kind, monkeypatch):
    """The variance comes from shifted sums taken in the statistics' one pass (then one
    pass normalises and scales): rows far from zero, near-constant rows and rows whose
    first elements are far from their mean (the shift) stay as close to float64 as the
    two-pass kernel's (the float32 mean's own rounding is the same in both)."""
    shape, groups = (2, 8, 16, 16), 4
    x, w, b = leaves(shape)
    y = tg.group_norm(x, w, b, num_groups=groups)
    cand = next(c for c in _candidates(y) if c.generator == "rows_grouped")
    assert "in 2 passes" in cand.summary
    one = cand.build()
    with monkeypatch.context() as m:
        m.setattr(rowgen, "moments", lambda *a: None)
        two = next(c for c in _candidates(y) if c.generator == "rows_grouped").build()
    assert "in 3 passes" in two.summary
    rng = np.random.default_rng(4)
    values = feeds(shape, 4)
    base = rng.standard_normal(shape)
    if kind == "offset":
        values["x"] = (3e3 + base * 0.5).astype(np.float32)
    elif kind == "near-constant":
        values["x"] = (-7.0 + base * 1e-4).astype(np.float32)
    else:  # sorted rows: the first elements (the shift's) are the lowest
        flat = np.sort(base.reshape(2, groups, -1), axis=-1) * 4 + 100
        values["x"] = flat.reshape(shape).astype(np.float32)
    want = tg.evaluate(y, values, dtype="float64")
    errors = [relative_error(k.fn(values["x"], values["w"], values["b"]), want)
              for k in (one, two)]
    assert errors[0] <= 1.1 * errors[1] + one.tolerance, (kind, errors)
