"""A generated kernel's admission is decided once: verification on fresh random inputs must
not refuse a correct kernel now and then (a refusal plans again, ``planner_runs`` 2)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.kernels import generated
from tensor_graphs.kernels.c import codegen as cg

verify_module = importlib.import_module("tensor_graphs.kernels.verify")


def _gelu_bias(n: int = 24):
    x = tg.input("x", (2, 6, n), "float32")
    b = tg.input("b", (6, 1), "float32")
    return tg.gelu(x + b)


def _cancelling(spec, rng, special=False):
    """Fresh inputs where gelu's 1 + erf(x / sqrt 2) cancels: each element's error is far
    above the float floor of 1e-6 the kernel declares, but within its rounding bound."""
    return rng.uniform(-5.0, -2.5, spec.shape).astype(spec.dtype)


def test_error_bound_takes_the_kernels_arguments():
    region = cg.elementwise_region(_gelu_bias())
    kernel = cg.fuse_elementwise(region, register=False)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 24)).astype(np.float32)
    b = rng.standard_normal((6, 1)).astype(np.float32)
    got = kernel.error_bound(x, b)  # as tg.kernels.verify calls it
    np.testing.assert_array_equal(got, cg.rounding_bound(region, [x, b]))


def test_a_correct_kernel_passes_fresh_inputs_that_cancel(monkeypatch):
    region = cg.elementwise_region(_gelu_bias())
    kernel = cg.fuse_elementwise(region, register=False)
    monkeypatch.setattr(verify_module, "draw", _cancelling)
    report = verify_module.verify(kernel, seed=7)
    assert report.ok, report
    assert report.max_rel_error > kernel.tolerance  # the allowance was needed


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_compile_plans_once_whatever_the_fresh_inputs(monkeypatch, seed):
    monkeypatch.setattr(verify_module, "draw", _cancelling)
    verify_module.clear_cache()
    generated._built.clear()  # noqa: SLF001 - verified again in this process
    generated.refused.clear()
    cg.clear_cache()
    prog = tg.compile(_gelu_bias(16 + seed), db=":memory:")
    assert prog.stats["planner_runs"] == 1
    assert "generated_refused" not in prog.stats
    assert any(getattr(s.kernel, "generated", False) for s in prog.plan.steps)


def _noisy(kernel, low: float, high: float):
    """``kernel`` whose result is off by a relative error drawn in [low, high) on each call:
    where fresh inputs land around its declared tolerance, as a real kernel's do."""
    import dataclasses

    rng = np.random.default_rng(1)
    fn = kernel.fn

    def noisy(*args, **kwargs):
        got = np.asarray(fn(*args))
        sign = np.where(rng.random(got.shape) < 0.5, -1.0, 1.0)
        return (got * (1 + rng.uniform(low, high) * sign)).astype(got.dtype)

    return dataclasses.replace(kernel, fn=noisy, error_bound=None, writes_out=False,
                               name=f"{kernel.name}_noisy_{low:g}")


def _declared(tolerance: float):
    return cg.CheckReport(True, 0.0, tolerance, [], "")


def test_an_error_on_the_declared_line_is_admitted_at_its_measured_worst():
    """Fresh errors between 1.2x and 3x the declared 1e-6: admitted every time (it was
    refused whenever one case landed above the line), with the worst as its tolerance."""
    region = cg.elementwise_region(tg.exp(tg.input("x", (8, 33), "float32")) * 0.5)
    base = cg.fuse_elementwise(region, register=False, verify=False)
    kernel = cg.admitted(_noisy(base, 1.2e-6, 3e-6), _declared(1e-6))
    assert 1.2e-6 <= kernel.tolerance <= cg.TOLERANCE_MARGIN * 1e-6


def test_an_error_far_above_the_declared_line_is_refused():
    region = cg.elementwise_region(tg.exp(tg.input("x", (8, 33), "float32")) * 0.5)
    base = cg.fuse_elementwise(region, register=False, verify=False)
    with pytest.raises(tg.KernelVerificationError):
        cg.admitted(_noisy(base, 1e-5, 2e-5), _declared(1e-6))
