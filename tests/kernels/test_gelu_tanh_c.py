"""tg_gelu_tanh (kernels/c/tg_common.h), the float32 tanh-GELU of the C backend, through the
kernels that use it: the elementwise ``c_gelu_tanh`` and the packed GEMM's epilogue
(``c_packed_matmul_bias_gelu_tanh`` with A (M, 1), B all ones and a zero bias, so each output
is exactly gelu_tanh(A[i])).

Against two float64 references: the project's (``tg.evaluate``, by the norm-wise relative
error; it computes 0.5 x (1 + tanh(u)), which cancels to 0 below x ~ -7) and the stable
x sigmoid(2u) in float64, element by element: the error may grow with |2u| for x < 0 (the
float32 rounding of u moves exp(2u) by |2u| ulps), never beyond that, down to the subnormal
results near x ~ -10.5, which must not be flushed."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import build
from tensor_graphs.numerics import relative_error

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")

EXTREMES = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 1e-30, -1e-30, 0.5, -0.5,
            -5.0, -7.5, -9.0, -10.0, -10.3, -10.6, -10.9, -11.0, -12.0, -60.0, -100.0, -1e6,
            -1e13, -1e20, -3.4e38, 10.0, 12.0, 60.0, 1e6, 1e13, 1e20, 3.4e38]


def elementwise(x):
    return registry.get("c_gelu_tanh")(x)


def gemm_epilogue(x):
    """gelu_tanh(x) through the packed GEMM: (x (M, 1) @ ones (1, 40) + 0), 40 columns = two
    full 16-wide tiles and a partial one, every column the same."""
    a = x.reshape(-1, 1)
    b, bias = np.ones((1, 40), np.float32), np.zeros(40, np.float32)
    out = registry.get("c_packed_matmul_bias_gelu_tanh")(a, b, bias)
    assert out.shape == (x.size, 40)
    np.testing.assert_array_equal(out, np.repeat(out[:, :1], 40, axis=1))
    return out[:, 0]


KERNELS = {"elementwise": elementwise, "gemm_epilogue": gemm_epilogue}


def project_reference(x):
    v = tg.input("v", x.shape, "float64")
    return tg.evaluate(tg.gelu(v, approximate="tanh"), {"v": x.astype(np.float64)})


def stable_reference(x):
    """x sigmoid(v), v = 2u, in float64 without cancellation; also v."""
    xd = x.astype(np.float64)
    with np.errstate(all="ignore"):
        v = 1.5957691216057308 * (xd + 0.044715 * xd * xd * xd)
        e = np.exp(-np.abs(v))
        return xd * np.where(v < 0, e / (1 + e), 1 / (1 + e)), v


def check_pointwise(x, got):
    """|got - ref| <= 2^-24 (4 + 4 |min(v, 0)|) |ref| + the smallest subnormal."""
    ref, v = stable_reference(x)
    fin = np.isfinite(ref)
    bound = 2.0 ** -24 * (4 + 4 * np.abs(np.minimum(v, 0))) * np.abs(ref) + 2.0 ** -149
    with np.errstate(invalid="ignore"):
        err = np.abs(got.astype(np.float64) - ref)
    bad = fin & ~(err <= bound)
    assert not bad.any(), (f"{bad.sum()} elements off, first x={x[bad][0]!r}: "
                           f"got {got[bad][0]!r}, want {ref[bad][0]!r}")
    return err, ref


@pytest.mark.parametrize("kind", sorted(KERNELS))
@pytest.mark.parametrize("n", [1000, 100_003])  # below and above the OpenMP threshold
def test_fresh_random_inputs(kind, n):
    seed = np.random.SeedSequence().entropy
    x = (np.random.default_rng(seed).standard_normal(n) * 3).astype(np.float32)
    got = KERNELS[kind](x)
    assert got.dtype == np.float32 and got.shape == x.shape
    err = relative_error(got, project_reference(x))
    assert err < 1e-6, f"seed {seed}: norm-wise relative error {err:.2e}"
    check_pointwise(x, got)


@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_dense_sweep(kind):
    x = np.linspace(-20, 20, 400_001, dtype=np.float32)
    got = KERNELS[kind](x)
    assert relative_error(got, project_reference(x)) < 1e-7
    err, ref = check_pointwise(x, got)
    # x > 0: sigmoid(v) in [0.5, 1], nothing ill-conditioned: within 3 ulps
    pos = x > 0
    assert np.max(err[pos] / np.abs(ref[pos])) < 3 * 2.0 ** -23


@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_extreme_values(kind):
    x = np.array(EXTREMES, np.float32)
    got = KERNELS[kind](x)
    with np.errstate(all="ignore"):
        ref = project_reference(x)
    # NaN where the reference has it: NaN, and -inf (-inf * 0)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    assert np.isnan(got[np.isnan(x)]).all() and np.isnan(got[x == -np.inf]).all()
    assert (got[x == np.inf] == np.inf).all()
    big = np.isfinite(x) & (x >= 10)
    np.testing.assert_array_equal(got[big], x[big])  # sigmoid is 1.0f there
    assert (got[np.isfinite(x) & (x <= -11)] == 0).all()  # the result underflows
    tiny = np.abs(x) < 1e-20
    np.testing.assert_array_equal(got[tiny], x[tiny] / 2)
    check_pointwise(x, got)
    # the tail is kept, down to subnormal results, not flushed to 0
    tail = (x <= -10) & (x >= -10.6)
    assert (got[tail] < 0).all()
    assert (np.abs(got[x == np.float32(-10.6)]) < np.finfo(np.float32).tiny).all()


@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_subnormal_tail_sweep(kind):
    """x in [-11, -9.5]: results from ~1e-34 down through the subnormals to 0, each within a
    relative bound or one subnormal spacing of the float64 value."""
    x = np.linspace(-11, -9.5, 150_001, dtype=np.float32)
    got = KERNELS[kind](x)
    err, ref = check_pointwise(x, got)
    sub = np.abs(ref) < np.finfo(np.float32).tiny
    assert sub.sum() > 10_000 and (got[sub & (np.abs(ref) > 2.0 ** -140)] != 0).all()
