"""tg_gelu_erf (kernels/c/tg_common.h), the float32 exact GELU x Phi(x) of the C backend
(a rational erfcx and a 2^x, no erfc), through the kernels that use it: the elementwise
``c_gelu`` and the packed GEMM's epilogue (``c_packed_matmul_bias_gelu`` with A (M, 1), B all
ones and a zero bias, so each output is exactly gelu(A[i])). Element by element against
0.5 x erfc(-x / sqrt 2) in float64 (no cancellation in the tail): a small relative error for
every x whose result is a normal float32, x ~ -13 included, and the subnormal tail kept (x in
[-14.4, -13.1]), not flushed to 0: a one-element verification case there compared 0 with
-2.3e-41, a relative error of 1."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import build
from tensor_graphs.numerics import relative_error

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")

TINY = float(np.finfo(np.float32).tiny)


def elementwise(x):
    return registry.get("c_gelu")(x)


def gemm_epilogue(x):
    """gelu(x) through the packed GEMM: 40 columns = two full 16-wide tiles and a partial one."""
    b, bias = np.ones((1, 40), np.float32), np.zeros(40, np.float32)
    out = registry.get("c_packed_matmul_bias_gelu")(x.reshape(-1, 1), b, bias)
    np.testing.assert_array_equal(out, np.repeat(out[:, :1], 40, axis=1))
    return out[:, 0]


KERNELS = {"elementwise": elementwise, "gemm_epilogue": gemm_epilogue}
_erfc = np.frompyfunc(math.erfc, 1, 1)


def reference(x):
    xd = x.astype(np.float64)
    return 0.5 * xd * _erfc(-xd / math.sqrt(2)).astype(np.float64)


@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_relative_error_on_a_sweep(kind):
    """Measured 6e-7 on [-3, 0], 3e-7 for x > 0, growing with the rounding of x^2 in the
    exponent (2^-24 x^2 log2(e) / 2) to 5e-6 at x = -13; the old erfc form had 1.6e-5."""
    x = np.linspace(-13.1, 10, 50_001).astype(np.float32)
    got, ref = KERNELS[kind](x), reference(x)
    assert got.dtype == np.float32
    normal = np.abs(ref) >= TINY
    err = np.abs(got.astype(np.float64)[normal] - ref[normal]) / np.abs(ref[normal])
    bound = 1e-6 + 4e-8 * x[normal].astype(np.float64) ** 2  # 7.9e-6 at x = -13.1
    assert (err < bound).all(), (err.max(), x[normal][np.argmax(err / bound)])
    below = ~normal & (x < 0)  # x < -13.05: results under 1.2e-38, kept as subnormals
    assert (np.abs(got[below]) < 2 * TINY).all() and (got[below] < 0).all()


@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_the_subnormal_tail_is_kept(kind):
    """x Phi(x) is subnormal for x in [-14.4, -13.1]: each result within the normal range's
    relative bound (1e-5 at these x, from the rounding of x^2) plus one subnormal spacing of
    the float64 value, and 0 only where the float64 value rounds to 0."""
    x = np.linspace(-15, -13, 100_001).astype(np.float32)
    got, ref = KERNELS[kind](x).astype(np.float64), reference(x)
    spacing = 2.0 ** -149  # the smallest subnormal
    sub = (np.abs(ref) < TINY) & (np.abs(ref) >= spacing)
    assert sub.sum() > 50_000
    excess = np.abs(got - ref)[sub] - 1e-5 * np.abs(ref[sub])
    assert (excess <= spacing).all(), excess.max() / spacing
    assert (got[np.abs(ref) < spacing / 2] == 0).all()


@pytest.mark.parametrize("kind", sorted(KERNELS))
@pytest.mark.parametrize("scale", [1e-3, 0.1, 1.0, 3.0, 10.0, 100.0])
def test_random_inputs_norm_wise(kind, scale):
    x = (np.random.default_rng(7).standard_normal(20_000) * scale).astype(np.float32)
    assert relative_error(KERNELS[kind](x), reference(x)) < 1e-6


@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_special_values(kind):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 1e-30, -14.5, -20.0,
                  -1e6, -3.4e38, 13.3, 1e6, 3.4e38], np.float32)
    got = KERNELS[kind](x)
    assert np.isnan(got[:1]).all() and got[1] == np.inf
    assert np.isnan(got[2])  # -inf * 0, as the float64 reference (0.5 x (1 + erf))
    assert got[3] == 0 and got[4] == 0
    if kind == "elementwise":  # the GEMM adds the +0 bias, so -0 reaches it as +0
        assert not np.signbit(got[3]) and np.signbit(got[4])
    np.testing.assert_array_equal(got[5:8], (x[5:8].astype(np.float64) / 2).astype(np.float32))
    assert (got[8:12] == 0).all()
    np.testing.assert_array_equal(got[12:], x[12:])
