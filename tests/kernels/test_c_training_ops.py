"""c_sum (kernels/c/reduce_sum.c) and c_cast_bool (bool_cast.c), the sums and the mask cast a
training step's backward makes: against the float64 reference (||got - ref|| / ||ref||), the
registry's verification, and the axes c_sum refuses (not one run)."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import build
from tensor_graphs.kernels.c.bool_cast import c_cast_bool
from tensor_graphs.kernels.c.reduce_sum import c_sum, split
from tensor_graphs.numerics import relative_error

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")
RNG = np.random.default_rng(3)

SUMS = [((8, 128, 256), (0, 1), True), ((1024, 4096), (1,), False), ((1024,), (0,), False),
        ((8, 128, 256), (0,), True), ((3, 1, 700, 1), (1, 2), False), ((5, 3, 2), (-1,), True),
        ((2, 5, 7), (), False), ((4, 0, 3), (1,), True), ((1, 1, 300), (0, 1), True)]


@pytest.mark.parametrize("shape,axes,keep", SUMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sum_matches_float64_reference(shape, axes, keep, dtype):
    x = (RNG.standard_normal(shape) / 2 + 1).astype(dtype)
    want = np.sum(x.astype(np.float64), axis=axes, keepdims=keep)
    got = c_sum(x, axes=axes, keepdims=keep)
    assert got.shape == want.shape and got.dtype == dtype
    if want.size and x.size:
        assert relative_error(got, want) < (1e-7 if dtype == np.float32 else 1e-15)
    else:
        assert np.all(got == 0)


def test_sum_refuses_axes_that_are_not_one_run():
    assert isinstance(split((4, 5, 6), (0, 2)), str)
    assert split((4, 1, 6), (0, 1, 2)) == (1, 24, 1)
    assert split((4, 1, 6), (0, 2)) == (1, 24, 1)  # the axis between has extent 1
    reason = registry.get("c_sum").where([(4, 5, 6)], [tg.float32], {"axes": (0, 2),
                                                                       "keepdims": False})
    assert isinstance(reason, str) and "adjacent" in reason


@pytest.mark.parametrize("name", ["c_sum", "c_cast_bool"])
def test_registry_verification_passes(name):
    report = tg.kernels.verify(registry.get(name))
    assert report.ok and not report.rejected, report


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bool_cast_is_exact(dtype):
    x = RNG.random((7, 301)) < 0.4
    got = c_cast_bool(x, dtype=tg.float32 if dtype == np.float32 else tg.float64)
    assert got.dtype == dtype and np.array_equal(got, x.astype(dtype))
