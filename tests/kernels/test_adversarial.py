"""Adversarial verification cases come from what a pattern computes (its atomic ops), not from
its op's name: every op, and a fused pattern written by hand, gets the value kinds of the
motifs it contains; the drawn values have the structure their kind promises."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.algebra import ELEMENTWISE
from tensor_graphs.ir.graph import nodes
from tensor_graphs.ir.ops import OPS
from tensor_graphs.kernels import adversarial, registry
from tensor_graphs.kernels.numpy.exact import atomic_graph
from tensor_graphs.kernels.signatures import Spec
from tensor_graphs.kernels.verify import Built, build_case, draw, kernel_cases

make = registry.unregistered
VALUE_KINDS = set(adversarial.KINDS)

# what the reference of each op computes decides its kinds (the exact kernels take every op)
EXPECTED = {
    "softmax": {"logits", "masked", "nonfinite"},
    "log_softmax": {"logits", "masked", "nonfinite"},
    "logsumexp": {"logits", "masked", "nonfinite"},
    "cross_entropy": {"logits", "masked", "nonfinite"},
    "scaled_dot_product_attention": {"logits", "masked", "scaled", "nonfinite"},
    "layer_norm": {"offset", "tiny", "nonfinite"},
    "group_norm": {"offset", "tiny", "nonfinite"},  # its rows are reshaped groups
    "var": {"offset", "nonfinite", "cancel"},
    "rms_norm": {"tiny", "nonfinite"},
    "sum": {"cancel", "nonfinite"},
    "mean": {"cancel", "nonfinite"},
    "max": {"nonfinite"},
    "min": {"nonfinite"},
    "int4_scale": {"nonfinite"},  # a max over groups of a padded, reshaped |w|
    "gelu": {"tail"},  # erfc(x * -1/sqrt 2): Phi's far tail, where 1 + erf is 0
}


def kinds_of(k) -> set[str]:
    """The value kinds verify draws for kernel ``k``."""
    built = [(c, b) for c in kernel_cases(k) if isinstance(b := build_case(k, c), Built)]
    found = adversarial.cases(built, lambda c: None, lambda b: atomic_graph(b.root), True)
    return {s.values for c, _ in found for s in c.specs.values()} & VALUE_KINDS


@pytest.mark.parametrize("op", sorted(EXPECTED))
def test_an_op_gets_the_kinds_of_what_it_computes(op):
    assert kinds_of(registry.get(f"numpy_exact_{op}")) == EXPECTED[op]


def test_elementwise_ops_get_no_row_kinds():
    for op in sorted(OPS.values(), key=lambda o: o.name):
        if op.is_leaf:
            continue
        try:
            k = registry.get(f"numpy_exact_{op.name}")
        except tg.errors.ArgumentError:
            continue
        built = [(c, b) for c in kernel_cases(k)[:1] if isinstance(b := build_case(k, c), Built)]
        graph = atomic_graph(built[0][1].root)
        if all(n.op.is_leaf or n.op.name in ELEMENTWISE for n in nodes(graph)):
            assert not kinds_of(k) - {"tail"}, op.name  # tail: the whole tensor, no rows


def test_a_hand_written_fused_pattern_gets_them_too():
    """No op name in sight: a softmax and a layer_norm spelled out as a fused pattern."""

    pat = tg.pat

    def softmax(x):
        e = pat.exp(x - pat.max(x, axes=(1,), keepdims=True))
        return e / pat.sum(e, axes=(1,), keepdims=True)

    def layer_norm(x):
        c = x - pat.mean(x, axis=1, keepdims=True)
        return c * pat.rsqrt(pat.mean(c * c, axis=1, keepdims=True) + 1e-5)

    def soft(x):
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    def norm(x):
        c = x - x.mean(1, keepdims=True)
        return c / np.sqrt((c * c).mean(1, keepdims=True) + np.float32(1e-5))

    assert {"logits", "masked"} <= kinds_of(make(softmax, soft))
    assert {"offset", "tiny"} <= kinds_of(make(layer_norm, norm))

    def norm_one_pass(x):
        m = x.mean(1, keepdims=True)
        return (x - m) / np.sqrt((x * x).mean(1, keepdims=True) - m * m + np.float32(1e-5))

    assert tg.kernels.verify(make(layer_norm, norm), seed=0).ok
    report = tg.kernels.verify(make(layer_norm, norm_one_pass, tolerance=1e-5), seed=0)
    assert not report.ok and all("offset x" in f for f in report.failures), report.failures


def _rows(v: np.ndarray, axes) -> np.ndarray:
    keep = [i for i in range(v.ndim) if i not in axes]
    return np.moveaxis(v, list(axes), range(-len(axes), 0)).reshape(
        math.prod(v.shape[i] for i in keep), -1)


@pytest.mark.parametrize("shape, axes", [((7, 33), (1,)), ((5, 4, 3), (0, 2)), ((9,), (0,)),
                                         ((6, 1), (1,))])
def test_masked_rows_keep_a_finite_value_and_pad_both_ends(shape, axes):
    v = draw(Spec(shape, "float32", "masked", axes=axes), np.random.default_rng(3))
    rows = _rows(v, axes)
    assert np.isfinite(rows).any(axis=1).all()
    assert not np.isnan(rows).any() and not (rows == np.inf).any()
    if rows.shape[1] > 1:
        assert (rows == -np.inf).any()
        lead = rows[1::3, 0] if rows.shape[0] > 1 else rows[:0, 0]
        assert (lead == -np.inf).all()  # left padding: the row starts masked
        if rows.shape[0] > 2:
            assert (rows[2::3, -1] == -np.inf).all()  # right padding


def test_logits_overflow_a_softmax_that_keeps_them():
    v = draw(Spec((8, 33), "float32", "logits", axes=(1,)), np.random.default_rng(0))
    top = v.max(axis=1)
    t = math.log(np.finfo(np.float32).max)
    assert (top[0::4] > 1.2 * t - 10).all() and (top[1::4] < -1.2 * t + 10).all()
    assert (np.ptp(v[2::4], axis=1) > 1.5 * t).all()  # log(softmax) underflows there
    with np.errstate(over="ignore", invalid="ignore"):
        naive = np.exp(v) / np.exp(v).sum(axis=1, keepdims=True)
    assert np.isnan(naive[0::4]).all() and np.isnan(naive[1::4]).all()


def test_offset_rows_are_far_from_zero_and_narrow():
    v = draw(Spec((6, 129), "float32", "offset", axes=(1,)), np.random.default_rng(0))
    v = v.astype(np.float64)
    ratio = np.abs(v.mean(axis=1)) / v.std(axis=1)
    lo, hi = adversarial.SPREAD["float32"]
    assert (ratio > lo / 2).all() and (ratio < hi * 2).all()
    assert (np.abs(v.mean(axis=1)) >= 1e3 * 0.99).all()
    assert adversarial.floor("offset", "float32") == pytest.approx(
        adversarial.FLOOR_ULPS * 2.0 ** -24 * hi)
    assert adversarial.floor("logits", "float32") == 0


def test_cancelling_float16_rows_sum_in_float32_but_not_in_float16():
    v = draw(Spec((4, 256), "float16", "cancel", axes=(1,)), np.random.default_rng(0))
    v = v.astype(np.float16)
    exact = v.astype(np.float64).sum(axis=1)
    assert (np.abs(v).max(axis=1) >= 8192).all() and (np.abs(exact) < 1000).all()
    wide = np.cumsum(v, axis=1, dtype=np.float32)[:, -1]
    assert np.allclose(wide, exact, rtol=2.0 ** -12)  # a float32 accumulator: within budget
    with np.errstate(over="ignore"):
        narrow = np.cumsum(v, axis=1, dtype=np.float16)[:, -1].astype(np.float64)
    assert not np.allclose(narrow, exact, rtol=1e-2)


def test_nonfinite_rows_hold_one_nan_or_inf():
    v = draw(Spec((8, 5), "float32", "nonfinite", axes=(1,)), np.random.default_rng(0))
    assert np.isnan(v[0::4]).sum(axis=1).tolist() == [1, 1]
    assert (v[1::4] == np.inf).sum(axis=1).tolist() == [1, 1]
    assert (v[2::4] == -np.inf).sum(axis=1).tolist() == [1, 1]
    assert np.isfinite(v[3::4]).all()


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_tail_values_are_where_one_plus_erf_cancels_and_gelu_does_not(dtype):
    """All of the tensor in the tail: the textbook gelu's 1 + erf(x / sqrt 2) is 0 there in
    the dtype's arithmetic, while x Phi(x) is a nonzero number of that dtype."""
    v = draw(Spec((6, 7), dtype, "tail"), np.random.default_rng(0)).astype(dtype)
    true = np.array([t / 2 * math.erfc(-t / math.sqrt(2)) for t in v.ravel().tolist()])
    assert (v < 0).all() and (true.astype(dtype) != 0).all()
    erf = np.array([math.erf(t / math.sqrt(2)) for t in v.ravel().tolist()]).astype(dtype)
    assert (erf + np.asarray(1.0, dtype) == 0).all()


def test_shape_and_layout_variants_reach_kernels_with_signatures():
    seen = []

    def swiglu(x, g):
        seen.append((x.shape, x.flags.f_contiguous and not x.flags.c_contiguous))
        return x / (np.float32(1) + np.exp(-x)) * g

    k = make(lambda x, g: tg.silu(x) * g, swiglu, signatures=[{"x": (4, 64), "g": (4, 64)}])
    report = tg.kernels.verify(k, seed=0)
    assert report.ok, report
    shapes = {s for s, _ in seen}
    assert {(4, 1), (5, 67), (1, 1)} <= shapes  # rows of 1, odd sizes, one element
    assert any(fortran for _, fortran in seen)  # column-major inputs


def test_a_variant_the_reference_cannot_evaluate_is_skipped():
    """numpy_slice's stops (5, 33) name sizes that the variants shrink: skipped, not failed."""
    report = tg.kernels.verify("numpy_slice", seed=0)
    assert report.ok, report
    assert any("undefined" in r for r in report.rejected)


def test_a_floored_case_is_reported_apart_from_the_tolerance():
    report = tg.kernels.verify("numpy_layer_norm", seed=0)
    assert report.ok and report.floored > report.tolerance >= report.max_rel_error
    assert "on rows far from zero" in report.summary()


GROUP = 4  # the int4 group and the dynamic_quant group of the scale kernels below


def _int4_scale(hide_nan: bool):
    """int4_scale(w, group_size=GROUP) in numpy; ``hide_nan``: the scale of the old form,
    ``m > 0`` (a NaN max fails it and takes the all-zero group's scale of 1)."""

    def int4_scale(w):
        k, n = w.shape
        ng = -(-k // GROUP)
        g = -(-k // ng)
        padded = np.zeros((ng * g, n), w.dtype)
        padded[:k] = np.abs(w)
        m = padded.reshape(ng, g, n).max(1)
        s = np.where(m > 0, m / 7, 1) if hide_nan else np.where(m == 0, 1, m / 7)
        return s.astype(w.dtype)

    return make(lambda w: tg.int4_scale(w, group_size=GROUP), int4_scale,
                signatures=[{"w": (10, 6)}])  # 3 groups of 4 rows, the last padded


def _grouped_dynamic_quant(hide_nan: bool):
    """dynamic_quant(x, group=GROUP) in numpy; ``hide_nan``: the group max by ``np.nanmax``."""

    def dynamic_quant(x):
        v = x.reshape(*x.shape[:-1], -1, GROUP)
        m = (np.nanmax if hide_nan else np.max)(np.abs(v), axis=-1, keepdims=True)
        s = np.where(m == 0, 1, m / 127).astype(x.dtype)
        return (np.clip(np.round(v / s), -127, 127) * s).reshape(x.shape).astype(x.dtype)

    return make(lambda x: tg.dynamic_quant(x, group=GROUP), dynamic_quant,
                signatures=[{"x": (4, 32)}])


@pytest.mark.parametrize("kernel", [_int4_scale, _grouped_dynamic_quant])
def test_a_nan_hiding_scale_behind_a_reshape_is_refused(kernel):
    """int4_scale and a grouped dynamic_quant take their max over a reshaped (and padded)
    input: the NaN of a ``nonfinite`` case reaches it there too, so a scale that turns a NaN
    group into a finite one fails, and the same kernel with the reference's scale passes."""
    assert tg.kernels.verify(kernel(False), seed=0).ok
    report = tg.kernels.verify(kernel(True), seed=0)
    assert not report.ok and all("nonfinite" in f for f in report.failures), report.failures


@pytest.mark.parametrize("name", ["numpy_exact_int4_scale", "numpy_exact_dynamic_quant",
                                  "c_q8d_g32_matmul"])
def test_the_quantizing_kernels_pass_the_nonfinite_cases(name):
    report = tg.kernels.verify(name, seed=0)
    if report.skipped:
        pytest.skip(report.skipped)
    assert report.ok, report
    assert any("nonfinite" in r.case for r in report.results), report.shapes
