"""tg.kernels.verify catches wrong kernels: inaccurate, NaN-dropping, aliasing, input-
modifying, stride-ignoring, half-written, wrong shape or dtype; and passes correct ones."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import KernelVerificationError
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.verify import compare

make = registry.unregistered  # a kernel object the registry does not keep


def test_a_correct_kernel_passes_and_reports_what_it_tried():
    def good_tanh(x):
        return np.tanh(x.astype(np.float64)).astype(x.dtype)

    report = tg.kernels.verify(make("tanh", good_tanh, dtypes=("float32", "float64")), seed=0)
    assert report.ok, str(report)
    assert report.max_rel_error <= 1e-7
    shown = "\n".join(report.shapes)
    for size in ("(1,)", "(7,)", "(7, 33)", "(1025,)"):
        assert size in shown
    assert "strided" in shown and "broadcast" in shown and "special values" in shown
    assert "float64" in shown and "float16" not in shown  # the dtypes it takes


@pytest.mark.parametrize("fn, expected", [
    (lambda x: (np.tanh(x) * (1 + 1e-4)).astype(x.dtype), "relative error"),
    (lambda x: np.nan_to_num(np.tanh(x)), "nan mismatch"),
    (lambda x: np.tanh(x).astype(np.float64), "dtype"),
    (lambda x: np.tanh(x).reshape(-1), "shape"),
])
def test_wrong_kernels_fail(fn, expected):
    def bad_tanh(x):
        return fn(x)

    k = make("tanh", bad_tanh, dtypes=("float32",))
    report = tg.kernels.verify(k, seed=1)
    assert not report.ok
    assert any(expected in f for f in report.failures), report.failures
    with pytest.raises(KernelVerificationError) as info:
        tg.kernels.verify(k, strict=True, seed=1)
    assert "bad_tanh" in str(info.value) and info.value.report is report


def test_aliasing_and_modifying_inputs_are_caught():
    def relu_in_place(x):
        np.maximum(x, 0, out=x)
        return x

    report = tg.kernels.verify(make("relu", relu_in_place, dtypes=("float32",)), seed=0)
    assert not report.ok and any("shares memory" in f for f in report.failures)

    def relu_scribbles(x):
        out = np.maximum(x, 0)
        x[...] = 0
        return out

    report = tg.kernels.verify(make("relu", relu_scribbles, dtypes=("float32",)), seed=0)
    assert not report.ok and any("modified its input" in f for f in report.failures)

    def relu_declared_in_place(x):
        np.maximum(x, 0, out=x)
        return x

    k = make("relu", relu_declared_in_place, dtypes=("float32",), inplace=0)
    assert tg.kernels.verify(k, seed=0).ok


def test_ignoring_strides_is_caught():
    def sin_ignores_strides(x):  # reads memory as if x were contiguous
        raw = np.lib.stride_tricks.as_strided(x, x.shape, np.empty(x.shape, x.dtype).strides)
        return np.sin(raw)

    k = make("sin", sin_ignores_strides, dtypes=("float32",))
    report = tg.kernels.verify(k, seed=0)
    assert not report.ok
    assert all(any(layout in f for layout in ("strided", "broadcast", "transposed"))
               for f in report.failures)
    k = make("sin", sin_ignores_strides, dtypes=("float32",), contiguous=True, tolerance=1e-6)
    assert tg.kernels.verify(k, seed=0).ok  # a contiguous-only kernel is never given strides


def test_unwritten_output_elements_are_caught():
    def exp_forgets_the_last(x):
        out = np.empty_like(x)
        flat = out.reshape(-1)
        flat[:-1] = np.exp(x.reshape(-1)[:-1])
        return out

    report = tg.kernels.verify(make("exp", exp_forgets_the_last, dtypes=("float32",)), seed=0)
    assert not report.ok


def test_a_kernel_whose_constraints_reject_everything_fails():
    def picky_exp(x):
        return np.exp(x)

    k = make("exp", picky_exp, where=lambda shapes, dtypes, attrs: "never")
    report = tg.kernels.verify(k, seed=0)
    assert not report.ok and "no case fits" in report.failures[0]
    assert report.rejected and "never" in report.rejected[0]


def test_constraints_narrow_the_cases():
    def exp_rank2(x):
        return np.exp(x)

    report = tg.kernels.verify(make("exp", exp_rank2, ranks=(2,), dtypes=("float64",)), seed=0)
    assert report.ok
    assert all(re.match(r"x \(\d+, \d+\) float64", s) for s in report.shapes), report.shapes


def test_fused_pattern_from_a_traced_function():
    def fma(a, b, c):
        return a * b + c

    report = tg.kernels.verify(make(lambda a, b, c: a * b + c, fma), seed=0)
    assert report.ok, str(report)
    assert any("(1025" in s or ", 1025)" in s for s in report.shapes)

    def fma_wrong(a, b, c):
        return a * (b + c)

    assert not tg.kernels.verify(make(lambda a, b, c: a * b + c, fma_wrong), seed=0).ok


def test_fused_matmul_pattern_finds_matmul_shapes():
    def mm_bias_gelu(x, w, b):
        return registry.get("numpy_gelu")(x @ w + b, approximate="none")

    k = make(lambda x, w, b: tg.gelu(x @ w + b), mm_bias_gelu)
    report = tg.kernels.verify(k, seed=0)
    assert report.ok, str(report)
    assert any("x (7, 5) float32; w (5, 33) float32; b (33,) float32" in s
               for s in report.shapes)


def test_signatures_hook():
    def rowscale(x, s):
        return x * s[:, None]

    sigs = [{"x": (3, 4), "s": ((3, 1), "float32")}, {"x": ((1, 1025), "float64"),
                                                       "s": ((1, 1), "float64")}]
    k = make(lambda x, s: x * s, lambda x, s: x * s, signatures=sigs)
    report = tg.kernels.verify(k, seed=0)
    assert report.ok, str(report)
    assert "x (3, 4) float32; s (3, 1) float32 [signatures=]" in report.shapes
    assert "x (1, 1025) float64; s (1, 1) float64 [signatures=]" in report.shapes
    del rowscale


def test_reports_are_cached_per_kernel_and_source():
    def cached_tanh(x):
        return np.tanh(x)

    k = make("tanh", cached_tanh, dtypes=("float32",))
    assert tg.kernels.verify(k, seed=5) is tg.kernels.verify(k, seed=5)
    assert tg.kernels.verify("numpy_tanh") is tg.kernels.verify("numpy_tanh")


def test_compare_positions_of_nan_and_inf():
    ref = np.array([1.0, np.nan, np.inf, 2.0])
    assert compare(np.array([1, np.nan, np.inf, 2], np.float32), ref) == (0.0, None)
    assert compare(np.array([1, 0, np.inf, 2], np.float32), ref)[1].startswith("nan mismatch")
    assert compare(np.array([1, np.nan, -np.inf, 2], np.float32), ref)[1].startswith("inf")
    # a float64 value past float32's range is inf once rounded: inf is the right answer
    assert compare(np.array([np.inf], np.float32), np.array([1e39]))[1] is None
    err, problem = compare(np.array([1.0, 2.001]), np.array([1.0, 2.0]))
    assert problem is None and err == pytest.approx(0.001 / np.sqrt(5))


def test_a_kernel_for_an_absent_device_is_not_verified():
    from tensor_graphs.kernels.torch import cuda_available

    if cuda_available():
        pytest.skip("a GPU is present: CUDA kernels are verified on it")

    def cuda_tanh(x):
        return x.tanh()

    report = tg.kernels.verify(make("tanh", cuda_tanh, device="cuda"), seed=0)
    assert report.skipped and not report.ok and not report.results
    assert "not verified" in report.summary()


def test_variadic_kernels_are_verified_on_several_arities():
    for name in ("numpy_concat", "numpy_exact_concat", "torch_concat"):
        if name == "torch_concat" and name not in {k.name for k in tg.kernels.all()}:
            continue  # no torch here
        report = tg.kernels.verify(name, seed=0)
        assert report.ok, report
        counts = {case.split(" [")[0].count("xs[") for case in report.shapes}
        assert {1, 2, 5, 9} <= counts
        assert any("xs[8] (2, 3, 4)" in case for case in report.shapes)
        assert any("strided" in case for case in report.shapes)


def test_a_wrong_variadic_kernel_fails_verification():
    def drops_the_last(*xs, axis):
        return np.concatenate(xs[:2], axis=axis)  # right for one or two inputs only

    report = tg.kernels.verify(make("concat", drops_the_last), seed=0)
    assert not report.ok
    assert any("xs[4]" in f for f in report.failures)

    def good(*xs, axis):
        return np.concatenate(xs, axis=axis)

    assert tg.kernels.verify(make("concat", good, dtypes=("float32",)), seed=0).ok


def test_variadic_signatures_give_a_list_of_shapes():
    def good(*xs, axis):
        return np.concatenate(xs, axis=axis)

    k = make(tg.pat.concat(tg.pat.many("xs", dtype="float")), good,
             signatures=[{"xs": [(2, 3), (4, 3), ((1, 3), "float32")], "attrs": {"axis": 0}}])
    report = tg.kernels.verify(k, seed=0)
    assert report.ok, report
    assert report.shapes[0].startswith("xs[0] (2, 3) float32; xs[1] (4, 3) float32; xs[2]")
    bad = make(tg.pat.concat(tg.pat.many("xs")), good, signatures=[{"xs": (2, 3)}])
    assert not tg.kernels.verify(bad, seed=0).ok  # a variadic entry is a list of shapes


def test_a_fused_variadic_pattern_is_verified_from_templates():
    def concat_exp(a, *xs, axis):  # concat(exp(a), *xs): a fixed input, then the variadic
        return np.concatenate([np.exp(a), *xs], axis=axis)

    k = make(lambda a, *xs: tg.pat.concat(tg.exp(a), *xs), concat_exp)
    assert k.inputs == ("a", "xs") and k.variadic == "xs" and k.fused and k.attrs == ("axis",)
    report = tg.kernels.verify(k, seed=0)
    assert report.ok and report.results, report
    assert report.shapes[0].startswith("a ") and "xs[1]" in report.shapes[0]
