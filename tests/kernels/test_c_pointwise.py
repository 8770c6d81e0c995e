"""The C kernels of a decode's mask and position steps (kernels/c/pointwise.py, concat.py) give
what the numpy kernels give, bit for bit, on the layouts the verifier does not try: rows
longer than one task (4096 elements), results large enough to run in parallel, inputs read
through negative and non-unit strides, broadcasts on inner and outer axes."""

import numpy as np
import pytest

from tensor_graphs.ir import dtypes
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import build

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")
RNG = np.random.default_rng(19)


def _c(name):
    return registry.get(name).fn


def _np(name):
    return registry.get(name).fn


def _values(shape, dtype):
    if np.dtype(dtype).kind == "f":
        a = RNG.standard_normal(shape).astype(dtype)
        if a.size > 4:
            a.flat[:4] = [np.nan, -np.inf, np.inf, -0.0]
        return a
    return RNG.integers(-50, 50, shape).astype(dtype)


LAYOUTS = [  # (a, b): arrays of the broadcast pair, views included
    lambda d: (_values((3, 70001), d), _values((70001,), d)),  # parallel, rows of 18 tasks
    lambda d: (_values((5000, 1), d), _values((1, 13), d)),  # outer x inner broadcast
    lambda d: (_values((9, 40), d)[::2, ::-3], _values((5, 1), d)),  # negative, step 3
    lambda d: (_values((40, 9), d).T, _values((40, 9), d).T[:, ::-1]),  # transposed
    lambda d: (_values((2, 1, 6, 1), d), _values((3, 1, 7), d)),  # rank 4, both broadcast
    lambda d: (_values((), d), _values((4, 4500), d)),  # a scalar
    lambda d: (_values((1, 1), d), _values((1, 9000), d)),  # a decode mask's row and keys
]


@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ["add", "mul"])
def test_add_mul_bit_for_bit(op, layout, dtype):
    a, b = LAYOUTS[layout](dtype)
    np.testing.assert_array_equal(_c(f"c_{op}")(a, b), _np(f"numpy_{op}")(a, b))


@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
@pytest.mark.parametrize("dtype", ["int32", "int64", "float32", "float64"])
def test_less_bit_for_bit(layout, dtype):
    a, b = LAYOUTS[layout](dtype)
    got = _c("c_less")(a, b)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, _np("numpy_less")(a, b))


@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
@pytest.mark.parametrize("dtype", ["bool", "float16", "float32", "int64", "float64"])
def test_where_bit_for_bit(layout, dtype):
    a, b = LAYOUTS[layout]("float32")
    cond = a < 0.3
    with np.errstate(invalid="ignore"):  # NaN and inf as ints: whatever they become
        x, y = b.astype(dtype), (b * 2).astype(dtype)[..., ::-1]
    got = _c("c_where")(cond, x, y)
    want = _np("numpy_where")(cond, x, y)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.ascontiguousarray(got).view(np.uint8),
                                  np.ascontiguousarray(want).view(np.uint8))  # -0.0, NaN bits


def test_where_writes_into_out_and_reads_two_scalars():
    cond = RNG.standard_normal((1, 100000)) < 0
    inf, zero = np.array(-np.inf, np.float32), np.array(0.0, np.float32)
    out = np.full((1, 100000), np.nan, np.float32)
    assert _c("c_where")(cond, inf, zero, out=out) is out
    np.testing.assert_array_equal(out, np.where(cond, -np.inf, 0.0).astype(np.float32))


@pytest.mark.parametrize("dtype", ["int32", "int64", "float32", "float64"])
def test_iota_bit_for_bit(dtype):
    for n in (0, 1, 7, 100003):
        got = _c("c_iota")(n, dtypes.as_dtype(dtype))
        np.testing.assert_array_equal(got, _np("numpy_iota")(n, dtypes.as_dtype(dtype)))
        assert got.dtype == np.dtype(dtype)


@pytest.mark.parametrize("source", ["int32", "int64", "float32", "float64"])
@pytest.mark.parametrize("target", ["float32", "float64"])
def test_cast_bit_for_bit(source, target):
    x = _values((3, 40000), source)
    if source == "int64":
        x = x * (2 ** 40) + 12345  # rounds in float32
    t = dtypes.as_dtype(target)
    np.testing.assert_array_equal(_c("c_cast")(x, t), _np("numpy_cast")(x, t))


@pytest.mark.parametrize("op", ["sin", "cos"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sin_cos_round_once_from_double(op, dtype):
    x = (RNG.standard_normal(70000) * 3000).astype(dtype)  # large angles: a long decode
    x[:3] = [0.0, np.inf, np.nan]
    with np.errstate(invalid="ignore"):
        got, want = _c(f"c_{op}")(x), _np(f"numpy_{op}")(x)
    if dtype == "float32":
        np.testing.assert_array_equal(got, want)
    else:  # libm's and numpy's double sin may differ in the last bit
        np.testing.assert_allclose(got, want, rtol=4e-16, atol=4e-16)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_bit_for_bit_any_dtype(axis):
    for dtype in ("float32", "int64", "bool", "float16"):
        parts = []
        for n in (1, 5, 2):
            shape = [3, 4, 6]
            shape[axis] = n
            parts.append((RNG.standard_normal(shape) * 9).astype(dtype))
        got = _c("c_concat")(*parts, axis=axis)
        np.testing.assert_array_equal(got, np.concatenate(parts, axis=axis))


def test_concat_large_rows_in_parallel():
    a, b = _values((300, 1000), "float32"), _values((300, 2000), "float32")
    np.testing.assert_array_equal(_c("c_concat")(a, b, axis=1), np.concatenate([a, b], 1))
