"""numpy kernels for the pointwise families (ir/ops/pointwise.py): the atomic special functions
and integer division of atomic.py's SPECIAL tables, and the rounding and classification
composites in one numpy call each (their decompositions take five to fifteen atomic ops).

The special functions compute in float64 and round once (numpy's float32 tan and log1p are
not correctly rounded); fmod, floor_divide and bitwise_and are exact in every dtype, and an
integer zero divisor raises as the reference does. The rounding kernels are bit-exact: numpy's
floor/ceil/trunc/rint keep the sign of zero and pass inf and nan, as the decompositions do.
"""

from __future__ import annotations

import math

import numpy as np

from tensor_graphs.errors import EvaluationError
from tensor_graphs.ir.dtypes import FLOATS, INTS, NUMBERS
from tensor_graphs.kernels.numpy._util import into, same_dtype, ufunc, with_signature
from tensor_graphs.kernels.registry import kernel
from tensor_graphs.kernels.signatures import BINARY_SHAPES, UNARY_SHAPES, OpCase, S, generator
from tensor_graphs.kernels.signatures import FLOATS as FLOAT_NAMES
from tensor_graphs.kernels.signatures import INTS as INT_NAMES
from tensor_graphs.kernels.signatures import NUMBERS as NUMBER_NAMES

NONE = 1e-12  # no rounding: bit-exact
EXACT = 1e-7  # one rounding of a float64 value

_erfc = np.frompyfunc(math.erfc, 1, 1)


def _wide(fn):
    """fn computed in float64 (a float16/bfloat16/float32 input rounds once at the end)."""
    def run(*xs):
        return fn(*(np.asarray(x, np.float64) for x in xs))
    run.__name__ = getattr(fn, "__name__", "fn")
    return run


# ---------------------------------------------------------------------------- atomic
def _register_unary(name: str, fn, doc: str) -> None:
    def run(x, out=None):
        with np.errstate(all="ignore"):
            return into(fn(x), x.dtype, out)

    with_signature(run, ["x"], {}, doc, source=f"{name}: {fn.__name__}", writes_out=True)
    kernel(name, backend="numpy", name=f"numpy_{name}", dtypes=FLOATS, tolerance=EXACT,
           writes_out=True)(run)


for _name, _fn, _doc in (
    ("log1p", _wide(np.log1p), "log(1 + x) in float64, rounded once."),
    ("expm1", _wide(np.expm1), "e**x - 1 in float64, rounded once."),
    ("log2", _wide(np.log2), "log2 in float64, rounded once."),
    ("log10", _wide(np.log10), "log10 in float64, rounded once."),
    ("tan", _wide(np.tan), "tan in float64, rounded once."),
    ("erfc", _wide(lambda x: np.asarray(_erfc(x), np.float64)),
     "erfc with math.erfc per element (float64), rounded once."),
):
    _register_unary(_name, _fn, _doc)


def _divisor_check(name: str, a, b) -> None:
    if a.dtype.kind in "iu" and np.any(b == 0):
        raise EvaluationError(f"numpy_{name}: integer division by zero")


def _atan2(a, b, out=None):
    with np.errstate(all="ignore"):
        return into(np.arctan2(np.asarray(a, np.float64), np.asarray(b, np.float64)),
                    a.dtype, out)


def _fmod(a, b, out=None):
    _divisor_check("fmod", a, b)
    with np.errstate(all="ignore"):
        return ufunc(np.fmod, a.dtype, out, a, b)


def _floor_divide(a, b, out=None):
    _divisor_check("floor_divide", a, b)
    with np.errstate(all="ignore"):
        return ufunc(np.floor_divide, a.dtype, out, a, b)


def _bitwise_and(a, b, out=None):
    return ufunc(np.bitwise_and, a.dtype, out, a, b)


for _name, _fn, _dtypes, _tol, _doc in (
    ("atan2", _atan2, FLOATS, EXACT, "atan2 in float64, rounded once."),
    ("fmod", _fmod, NUMBERS, NONE, "C's fmod with numpy (exact)."),
    # a float quotient rounds in the input's dtype, the reference's maybe in float64
    ("floor_divide", _floor_divide, NUMBERS, EXACT, "Python's floor division with numpy."),
    ("bitwise_and", _bitwise_and, INTS, NONE, "a & b with numpy."),
):
    with_signature(_fn, ["a", "b"], {}, _doc, source=_name, writes_out=True)
    kernel(_name, backend="numpy", name=f"numpy_{_name}", dtypes=_dtypes, where=same_dtype,
           tolerance=_tol, writes_out=True)(_fn)


# ---------------------------------------------------------------------------- composites
def _rounding(name: str, fn, doc: str) -> None:
    def run(x, out=None):
        with np.errstate(all="ignore"):
            return ufunc(fn, x.dtype, out, x)

    with_signature(run, ["x"], {}, doc, source=f"{name}: {fn.__name__}", writes_out=True)
    kernel(name, backend="numpy", name=f"numpy_{name}", dtypes=FLOATS, tolerance=NONE,
           writes_out=True)(run)


for _name, _fn, _doc in (
    ("floor", np.floor, "floor with numpy."),
    ("ceil", np.ceil, "ceil with numpy."),
    ("trunc", np.trunc, "trunc with numpy."),
    ("round_half_even", np.rint, "half to even with numpy's rint."),
):
    _rounding(_name, _fn, _doc)


def numpy_round(x, decimals, *, out=None):
    """Half to even with numpy.rint; decimals: torch's scale, round, unscale (in float64, as
    the reference checks it)."""
    with np.errstate(all="ignore"):
        if decimals == 0:
            return ufunc(np.rint, x.dtype, out, x)
        v = np.asarray(x, np.float64)
        scale = 10.0 ** abs(decimals)
        r = np.rint(v * scale) / scale if decimals > 0 else np.rint(v / scale) * scale
        return into(r, x.dtype, out)


kernel("round", backend="numpy", name="numpy_round", dtypes=FLOATS, tolerance=EXACT,
       writes_out=True)(numpy_round)


def numpy_isinf(x, *, out=None):
    """isinf with numpy."""
    return ufunc(np.isinf, np.bool_, out, x)


def numpy_isfinite(x, *, out=None):
    """isfinite with numpy."""
    return ufunc(np.isfinite, np.bool_, out, x)


kernel("isinf", backend="numpy", name="numpy_isinf", dtypes=FLOATS, tolerance=NONE,
       writes_out=True)(numpy_isinf)
kernel("isfinite", backend="numpy", name="numpy_isfinite", dtypes=FLOATS, tolerance=NONE,
       writes_out=True)(numpy_isfinite)


# ---------------------------------------------------------------------------- verification
# which values each op is verified on: the logarithms on their domain, the rest on normals
# (ints draw small nonzero values, so no integer division by zero); shifts by 0..width+1
_UNARY_VALUES = {"log1p": "positive", "log2": "positive", "log10": "positive",
                 "acosh": "positive"}


def _unary_cases(values: str):
    def gen(dt, arity):
        return [OpCase((S(s, dt, values),)) for s in UNARY_SHAPES]
    return gen


def _binary_cases(dt, arity):
    return [OpCase((S(a, dt), S(b, dt))) for a, b in BINARY_SHAPES]


for _op in ("log1p", "expm1", "log2", "log10", "tan", "erfc", "exp2", "atan", "asin", "acos",
            "sinh", "cosh", "asinh", "acosh", "atanh", "logit", "frac", "isinf",
            "isfinite", "nan_to_num"):
    generator(_op)(_unary_cases(_UNARY_VALUES.get(_op, "normal")))
for _op in ("trunc", "floor", "ceil"):
    generator(_op, dtypes=NUMBER_NAMES)(_unary_cases("normal"))
generator("round_half_even", dtypes=FLOAT_NAMES)(_unary_cases("halves"))  # ties, both ways
generator("atan2", "hypot", "xlogy")(_binary_cases)
generator("fmod", "floor_divide", "remainder", "div_trunc", dtypes=NUMBER_NAMES)(_binary_cases)
generator("bitwise_and", dtypes=INT_NAMES)(_binary_cases)
generator("bitwise_or", "bitwise_xor", "logical_xor", dtypes=INT_NAMES + ("bool",))(_binary_cases)
generator("bitwise_not", dtypes=INT_NAMES + ("bool",))(_unary_cases("normal"))


@generator("round", dtypes=FLOAT_NAMES)
def _round_cases(dt, arity):
    return [OpCase((S(s, dt),), {"decimals": (0, 2, -1)[i % 3]})
            for i, s in enumerate(UNARY_SHAPES)]


@generator("left_shift", "right_shift", dtypes=INT_NAMES)
def _shift_cases(dt, arity):
    width = np.dtype(dt).itemsize * 8
    return [OpCase((S(a, dt), S(b, dt, "index", width + 2))) for a, b in BINARY_SHAPES]
