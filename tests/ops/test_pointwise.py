"""The pointwise families (ir/ops/pointwise.py) against the op table's oracles and torch, and
the edges where a naive decomposition is wrong in float32: tiny arguments of log1p/expm1/sinh,
floats past int32 and past 2**mantissa in the rounding ops, C's sign rule of fmod against
Python's of remainder, squares that overflow in hypot, shifts past the width."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import DTypeError, EvaluationError
from tensor_graphs.numerics import relative_error
from tests.ops import optable as ot

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # nan/inf inputs on purpose


@pytest.mark.parametrize("row,dtype", ot.params("pointwise"))
def test_matches_oracle(row, dtype):
    ot.check_oracle(row, dtype)


@pytest.mark.parametrize("row,dtype", ot.params("pointwise", torch=True))
def test_matches_torch(row, dtype):
    torch = pytest.importorskip("torch")
    ot.check_torch(row, dtype, torch)


def ev(build, *values, dtype="float32"):
    leaves = [tg.input("abcd"[i], np.shape(v), dtype) for i, v in enumerate(values)]
    return tg.evaluate(build(*leaves), {"abcd"[i]: np.asarray(v, dtype)
                                       for i, v in enumerate(values)})


def rel(got, ref) -> float:
    return abs(float(got) - ref) / abs(ref)


@pytest.mark.parametrize("name,x,fn", [
    ("log1p", 1e-10, math.log1p), ("expm1", 1e-10, math.expm1), ("sinh", 1e-10, math.sinh),
    ("asinh", 1e-10, math.asinh), ("atanh", 1e-10, math.atanh), ("asin", 1e-10, math.asin),
    ("atan", 1e-10, math.atan), ("log1p", -0.9999999, math.log1p),
    ("acos", 0.99999994, math.acos), ("acosh", 1.0000001, math.acosh),
    ("asin", -0.99999994, math.asin), ("atanh", 0.99999994, math.atanh),
    ("sinh", 89.0, math.sinh), ("cosh", -89.0, math.cosh), ("asinh", -1e30, math.asinh),
    ("acosh", 1e30, math.acosh), ("erfc", 9.0, math.erfc), ("exp2", 100.0, lambda v: 2.0 ** v),
    ("log2", 1024.0, math.log2), ("log10", 1e-30, math.log10), ("tan", 1.5707963, math.tan),
])
def test_float32_keeps_its_digits(name, x, fn):
    """float32 within 2 ulps of the float64 value (of the float32 argument) where log(1 + x),
    (e**x - e**-x) / 2, pi/2 - asin(x), 1 - erf(x) or sin / cos would lose them."""
    x32 = np.float32(x)
    got = ev(getattr(tg, name), x32)
    assert got.dtype == np.float32
    assert rel(got, fn(float(x32))) <= 2.4e-7, (name, x, float(got), fn(float(x32)))


def test_the_naive_forms_are_wrong_there():
    """The test above can fail: log(1 + x) and 1 - erf(x) are what it guards against."""
    assert ev(lambda x: tg.log(tg.add(x, 1.0)), np.float32(1e-10)) == 0.0
    assert ev(lambda x: tg.sub(1.0, tg.erf(x)), np.float32(9.0)) == 0.0


def test_rounding_past_int32_and_the_mantissa():
    x = np.array([3e9 + 0.5, -3e9 - 0.5, 2.0 ** 40 + 0.5, 1e20, -1e300, 2.5, -2.5, 0.5],
                 np.float64)
    for fn, ref in ((tg.floor, np.floor), (tg.ceil, np.ceil), (tg.trunc, np.trunc),
                    (tg.round, np.round)):
        np.testing.assert_array_equal(ev(fn, x, dtype="float64"), ref(x))
    assert ev(tg.floor, np.float32(3e9)) == np.float32(3e9)
    assert ev(tg.round, np.float32(0.49999997)) == 0.0  # x + 0.5 rounds up to 1 in float32


def test_zero_signs_follow_torch():
    x = np.array([-0.5, -0.0, 0.3, -0.3], np.float32)
    assert np.signbit(ev(tg.ceil, x)).tolist() == [True, True, False, True]
    assert np.signbit(ev(tg.trunc, x)).tolist() == [True, True, False, True]
    assert np.signbit(ev(tg.round, x)).tolist() == [True, True, False, True]
    assert np.signbit(ev(tg.floor, x)).tolist() == [True, True, False, True]


def test_sign_bits_of_zeros():
    """-0.0 has its sign bit: signbit sees it through 1 / x, copysign moves it, angle ignores
    it (torch's rule)."""
    x = np.array([-0.0, 0.0, -1e-30, np.inf, -np.inf, np.nan], np.float32)
    assert ev(tg.signbit, x).tolist() == [True, False, True, False, True, False]
    got = ev(tg.copysign, np.full(6, 2.0, np.float32), x)
    assert got.tolist() == [-2.0, 2.0, -2.0, 2.0, -2.0, 2.0]
    assert np.signbit(ev(tg.copysign, np.zeros(6, np.float32), x)).tolist() == \
        [True, False, True, False, True, False]
    assert ev(tg.angle, x)[:2].tolist() == [0.0, 0.0]
    f = ev(tg.fmax, np.array([np.nan, 1.0, np.nan], np.float32),
           np.array([2.0, np.nan, np.nan], np.float32))
    assert f[:2].tolist() == [2.0, 1.0] and np.isnan(f[2])


def test_fmod_is_c_remainder_is_python():
    a = np.array([7.5, -7.5, 7.5, -7.5, -6.0], np.float32)
    b = np.array([2.0, 2.0, -2.0, -2.0, 3.0], np.float32)
    assert ev(tg.fmod, a, b).tolist() == [1.5, -1.5, 1.5, -1.5, -0.0]
    assert ev(tg.remainder, a, b).tolist() == [1.5, 0.5, -0.5, -1.5, 0.0]
    ai, bi = np.array([7, -7, 7, -7], np.int32), np.array([2, 2, -2, -2], np.int32)
    assert ev(tg.fmod, ai, bi, dtype="int32").tolist() == [1, -1, 1, -1]
    assert ev(tg.remainder, ai, bi, dtype="int32").tolist() == [1, 1, -1, -1]
    assert ev(tg.floor_divide, ai, bi, dtype="int32").tolist() == [3, -4, -4, 3]
    assert ev(tg.div_trunc, ai, bi, dtype="int32").tolist() == [3, -3, -3, 3]


def test_integer_division_by_zero_is_an_error():
    with pytest.raises(EvaluationError, match="integer division by zero"):
        ev(tg.floor_divide, np.array([1, 2]), np.array([1, 0]), dtype="int64")
    assert np.isinf(ev(tg.floor_divide, np.float32(1.0), np.float32(0.0)))


def test_hypot_does_not_overflow_the_squares():
    got = ev(tg.hypot, np.float32(3e30), np.float32(4e30))
    assert rel(got, 5e30) <= 1.2e-7
    assert rel(ev(tg.hypot, np.float32(3e-30), np.float32(4e-30)), 5e-30) <= 1.2e-7


def test_shifts_past_the_width():
    a = np.array([1, -8, 100, -1], np.int8)
    assert ev(tg.left_shift, a, np.array([7, 1, 8, -1], np.int8), dtype="int8").tolist() \
        == [-128, -16, 0, 0]
    assert ev(tg.right_shift, a, np.array([0, 2, 9, 7], np.int8), dtype="int8").tolist() \
        == [1, -2, 0, -1]


def test_bit_ops_refuse_floats():
    with pytest.raises(DTypeError, match="bitwise_xor"):
        tg.bitwise_xor(tg.input("a", (3,)), tg.input("b", (3,)))


def test_decompositions_are_atomic_and_saved():
    """Every pointwise op decomposes to atomic ops and survives tg.save/tg.load."""
    x = tg.input("x", (5,))
    ys = [tg.floor(x), tg.log1p(x), tg.atan2(x, x), tg.hypot(x, x), tg.nan_to_num(x)]
    for y in ys:
        ot.assert_atomic(y)
    i = tg.input("i", (5,), "int32")
    ys += [tg.bitwise_and(i, i), tg.fmod(i, 3), tg.floor_divide(i, 3), tg.right_shift(i, 2)]
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        for k, y in enumerate(ys):
            path = Path(d) / f"g{k}.json"
            tg.save(y, path)
            assert tg.load(path) is y


UNARY_RANGES = [("trunc", -50, 50), ("floor", -50, 50), ("ceil", -50, 50), ("round", -50, 50),
                ("frac", -50, 50), ("exp2", -8, 8), ("atan", -5, 5), ("asin", -1, 1),
                ("acos", -1, 1), ("sinh", -5, 5), ("cosh", -5, 5), ("asinh", -50, 50),
                ("acosh", 1, 50), ("atanh", -0.99, 0.99), ("logit", 0.01, 0.99),
                ("log1p", -0.9, 5), ("expm1", -3, 3), ("log2", 0.1, 9), ("log10", 0.1, 9),
                ("tan", -1.4, 1.4), ("erfc", -3, 3), ("nan_to_num", -3, 3)]
BINARY_NAMES = ["hypot", "atan2", "xlogy", "remainder", "div_trunc", "fmod", "floor_divide"]


@pytest.mark.parametrize("dtype,tol", [("float16", 2e-3), ("bfloat16", 1.6e-2)])
def test_low_precision_within_a_few_ulps(dtype, tol):
    """float16 and bfloat16 (each op computed in float32, rounded once) within about two of
    their ulps of the same graph lifted to float64: no threshold or constant of the
    decompositions is a float32 one that these dtypes cannot hold."""
    rng = ot.rng_for("pointwise low precision", dtype)
    np_dtype = ot.NP[dtype]
    for name, lo, hi in UNARY_RANGES:
        x = rng.uniform(lo, hi, 64).astype(np_dtype)
        y = getattr(tg, name)(tg.input("x", (64,), dtype))
        got, ref = (tg.evaluate(y, {"x": x}, dtype=d).astype(np.float64)
                    for d in (None, "float64"))
        assert relative_error(got, ref) <= tol, name
    for name in BINARY_NAMES:
        a, b = (rng.uniform(0.5, 9, 64).astype(np_dtype) for _ in range(2))
        y = getattr(tg, name)(tg.input("a", (64,), dtype), tg.input("b", (64,), dtype))
        got, ref = (tg.evaluate(y, {"a": a, "b": b}, dtype=d).astype(np.float64)
                    for d in (None, "float64"))
        assert relative_error(got, ref) <= tol, name
