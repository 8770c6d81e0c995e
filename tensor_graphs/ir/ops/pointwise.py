"""The pointwise families torch programs use beyond the activations: rounding, integer
division, the special and inverse trigonometric functions, classification (isinf, nan_to_num)
and bit operations on integers.

The builders of the atomic ops of atomic.py's SPECIAL tables live here (log1p, fmod, atan2,
bitwise_and, ...); everything else is a composite over them and the core ops, written so that
float32 stays within a few ulps of the float64 value: rounding goes through an int64 cast only
below the dtype's integral threshold (3e9 floors exactly), the inverse trigonometric functions
through atan2 of exact differences (1 - x for x near 1), the hyperbolic ones through expm1 and
log1p (sinh(1e-10) is 1e-10, not 0). Rounding half to even is an atomic op of its own
(``round_half_even``): built from int64 casts it was ~40 ops, each a planner slot. Where
torch's CPU kernels define an edge (the sign of fmod, nan in xlogy, shifts past the width)
the decomposition follows them.
"""

from __future__ import annotations

import math

from tensor_graphs.errors import ArgumentError, DTypeError
from tensor_graphs.ir import builder as tg
from tensor_graphs.ir.builder import TensorLike, pattern_aware
from tensor_graphs.ir.composite import composite
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.elementwise import (
    abs,
    div,
    isnan,
    logical_and,
    logical_not,
    logical_or,
    minimum,
    not_equal,
    sub,
)

# float dtype: (mantissa bits, largest finite value); |x| >= 2**bits is an integer already
_FLOAT = {"float16": (10, 65504.0), "bfloat16": (7, 3.3895313892515355e38),
          "float32": (23, 3.4028234663852886e38), "float64": (52, 1.7976931348623157e308)}
_LN2 = math.log(2.0)


# ---------------------------------------------------------------------------- atomic builders
def _unary_atomic(op: str, doc: str):
    def fn(x: TensorLike) -> Node:
        return tg._make(op, (tg._float_input(x),))
    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = doc
    return pattern_aware(op)(fn)


def _binary_atomic(op: str, doc: str, floats: bool = False):
    def fn(a: TensorLike, b: TensorLike) -> Node:
        a, b = tg.promote(a, b, op=op)
        if floats and not a.dtype.is_float:
            a, b = tg.cast(a, "float32"), tg.cast(b, "float32")
        return tg._make(op, (a, b))
    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = doc
    return pattern_aware(op)(fn)


log1p = _unary_atomic("log1p", "log(1 + x), exact for tiny x (ints are promoted to float32).")
expm1 = _unary_atomic("expm1", "e**x - 1, exact for tiny x.")
log2 = _unary_atomic("log2", "Base-2 logarithm.")
log10 = _unary_atomic("log10", "Base-10 logarithm.")
tan = _unary_atomic("tan", "Tangent (radians).")
erfc = _unary_atomic("erfc", "1 - erf(x), without its cancellation for large x.")
round_half_even = _unary_atomic(
    "round_half_even", "x to the nearest integer, halves to the even one (round's kernel).")
atan2 = _binary_atomic("atan2", "The angle of the point (b, a): atan(a / b) in its quadrant.",
                       floats=True)
fmod = _binary_atomic("fmod", "C's remainder: a - trunc(a / b) * b, with the sign of a.")
floor_divide = _binary_atomic("floor_divide", "floor(a / b) by Python's rule (torch's "
                              "floor_divide and div(rounding_mode='floor')).")
_bitwise_and = _binary_atomic("bitwise_and", "a & b bit by bit on ints.")


@pattern_aware("bitwise_and")
def bitwise_and(a: TensorLike, b: TensorLike) -> Node:
    """a & b bit by bit on ints; on bools logical and (mul), which C fusion renders."""
    a, b = tg.promote(a, b, op="bitwise_and")
    return tg.mul(a, b) if a.dtype.is_bool else _bitwise_and(a, b)


def _x():
    return (tg.input("x", (3, 4)),)


def _ab():
    return (tg.input("a", (3, 4)), tg.input("b", (4,)))


def _ints():
    return (tg.input("a", (3, 4), "int32"), tg.input("b", (4,), "int32"))


def _float(x: Node) -> Node:
    return x if x.dtype.is_float else tg.cast(x, "float32")


def _floats(a: Node, b: Node) -> list[Node]:
    return tg.promote(_float(a), _float(b))


def _signed_zero(r: Node, x: Node) -> Node:
    """r, with a zero result taking x's sign (x * 0): torch's floor(-0.5) is -0.0."""
    return tg.where(tg.equal(r, 0), tg.mul(x, 0), r)


def _odd(x: Node, s: Node) -> Node:
    """An odd function's value from s = f(|x|): -s below zero, x itself at +-0."""
    return tg.where(tg.less(x, 0), tg.neg(s), tg.where(tg.equal(x, 0), x, s))


# ---------------------------------------------------------------------------- rounding
@composite(example=_x)
def trunc(x):
    """Round toward zero: through int64 below 2**mantissa (larger floats, inf and nan are
    integral or kept as they are); ints unchanged."""
    if not x.dtype.is_float:
        return x
    t = tg.cast(tg.cast(x, "int64"), x.dtype)
    return _signed_zero(tg.where(tg.less(abs(x), 2.0 ** _FLOAT[x.dtype.name][0]), t, x), x)


@composite(example=_x)
def floor(x):
    """The largest integer <= x (trunc, one lower where that was above x)."""
    t = trunc(x)
    return tg.where(tg.less(x, t), sub(t, 1), t) if x.dtype.is_float else x


@composite(example=_x)
def ceil(x):
    """The smallest integer >= x (-0.0 for x in (-1, 0), as torch)."""
    t = trunc(x)
    return tg.where(tg.less(t, x), tg.add(t, 1), t) if x.dtype.is_float else x


@composite(example=_x)
def round(x, *, decimals=0):  # noqa: A001 - torch's name
    """Round half to even; decimals > 0 rounds x * 10**decimals, < 0 x / 10**-decimals (torch's
    two forms); ints unchanged (decimals 0)."""
    if not x.dtype.is_float:
        if decimals:
            raise DTypeError(f"round: decimals={decimals} needs a float tensor, got "
                             f"{x.dtype.name}")
        return x
    if decimals == 0:
        return round_half_even(x)
    scale = 10.0 ** (decimals if decimals > 0 else -decimals)
    if decimals > 0:
        return div(round_half_even(tg.mul(x, scale)), scale)
    return tg.mul(round_half_even(div(x, scale)), scale)


@composite(example=_x)
def frac(x):
    """x - trunc(x), with x's sign (frac(inf) is nan)."""
    if not x.dtype.is_float:
        raise DTypeError(f"frac: needs a float tensor, got {x.dtype.name}")
    return sub(x, trunc(x))


# ---------------------------------------------------------------------------- division
@composite(example=_ab)
def remainder(a, b):
    """Python's modulo: fmod moved by b where its sign differs from b's (torch's rule; ints
    and floats)."""
    a, b = tg.promote(a, b)
    r = fmod(a, b)
    moved = logical_and(not_equal(r, 0), not_equal(tg.less(r, 0), tg.less(b, 0)))
    return tg.where(moved, tg.add(r, b), r)


@composite(example=_ab)
def div_trunc(a, b):
    """a / b rounded toward zero (torch's div(rounding_mode='trunc')): Python's floor
    quotient, one higher where a / b is negative and not whole; ints stay ints. A float
    quotient that is not finite (b = 0, infinite a) is trunc(a / b)."""
    a, b = tg.promote(a, b)
    q = floor_divide(a, b)
    r = fmod(a, b)
    inexact = logical_and(not_equal(r, 0), not_equal(tg.less(a, 0), tg.less(b, 0)))
    t = tg.where(inexact, tg.add(q, 1), q)
    if not a.dtype.is_float:
        return t
    return tg.where(tg.less(abs(q), math.inf), t, trunc(div(a, b)))


# ---------------------------------------------------------------------------- special functions
@composite(example=_x)
def exp2(x):
    """2**x, as pow(2, x): exact at integers."""
    x = _float(x)
    return tg.pow(tg.cast(tg.as_node(2.0, x.dtype), x.dtype), x)


@composite(example=_x)
def atan(x):
    """atan2(x, 1)."""
    x = _float(x)
    return atan2(x, tg.cast(tg.as_node(1.0, x.dtype), x.dtype))


@composite(example=_x)
def asin(x):
    """atan2(x, sqrt((1 - x)(1 + x))): 1 - x is exact near 1, so asin(1 - 1e-7) keeps its
    digits (nan outside [-1, 1])."""
    x = _float(x)
    return atan2(x, tg.sqrt(tg.mul(sub(1.0, x), tg.add(x, 1.0))))


@composite(example=_x)
def acos(x):
    """2 atan2(sqrt(1 - x), sqrt(1 + x)): exact differences at both ends (acos(-1) = pi)."""
    x = _float(x)
    return tg.mul(atan2(tg.sqrt(sub(1.0, x)), tg.sqrt(tg.add(x, 1.0))), 2.0)


@composite(example=_x)
def sinh(x):
    """(e**x - e**-x) / 2: through expm1 below |x| = 1 (no cancellation for tiny x), as
    h * h / 2 - 1 / (2 h * h) with h = e**(|x| / 2) above (finite up to the overflow of
    sinh itself)."""
    x = _float(x)
    a = abs(x)
    u = expm1(a)
    small = tg.mul(tg.add(u, div(u, tg.add(u, 1.0))), 0.5)
    h = tg.exp(tg.mul(a, 0.5))
    r = tg.reciprocal(h)
    large = sub(tg.mul(tg.mul(h, 0.5), h), tg.mul(tg.mul(r, 0.5), r))
    return _odd(x, tg.where(tg.less(a, 1.0), small, large))


@composite(example=_x)
def cosh(x):
    """(e**x + e**-x) / 2 as h * h / 2 + 1 / (2 h * h), h = e**(|x| / 2): no overflow before
    cosh's own."""
    x = _float(x)
    h = tg.exp(tg.mul(abs(x), 0.5))
    r = tg.reciprocal(h)
    return tg.add(tg.mul(tg.mul(h, 0.5), h), tg.mul(tg.mul(r, 0.5), r))


_HUGE = 2.0 ** 28  # above it asinh(x) = log(2x) to float64 precision (and x * x may overflow)


@composite(example=_x)
def asinh(x):
    """log(|x| + sqrt(x**2 + 1)) as log1p(|x| + x**2 / (1 + sqrt(1 + x**2))), odd; log(2|x|)
    for |x| > 2**28."""
    x = _float(x)
    a = abs(x)
    a2 = tg.mul(a, a)
    small = log1p(tg.add(a, div(a2, tg.add(tg.sqrt(tg.add(a2, 1.0)), 1.0))))
    large = tg.add(tg.log(a), _LN2)
    return _odd(x, tg.where(tg.less(_HUGE, a), large, small))


@composite(example=_x)
def acosh(x):
    """log(x + sqrt(x**2 - 1)) as log1p(t + sqrt(2t + t**2)), t = x - 1 (exact near 1);
    log(2x) above 2**28; nan below 1."""
    x = _float(x)
    t = sub(x, 1.0)
    small = log1p(tg.add(t, tg.sqrt(tg.add(tg.mul(t, 2.0), tg.mul(t, t)))))
    large = tg.add(tg.log(x), _LN2)
    return tg.where(tg.less(_HUGE, x), large, small)


@composite(example=_x)
def atanh(x):
    """log((1 + x) / (1 - x)) / 2 as log1p(2|x| / (1 - |x|)) / 2, odd: +-inf at +-1, nan
    beyond."""
    x = _float(x)
    a = abs(x)
    return _odd(x, tg.mul(log1p(div(tg.mul(a, 2.0), sub(1.0, a))), 0.5))


@composite(example=_ab)
def hypot(a, b):
    """sqrt(a**2 + b**2) as m sqrt(1 + (n / m)**2), m = max(|a|, |b|): no overflow or
    underflow of the squares; inf when either is infinite (nan included), as IEEE."""
    a, b = _floats(a, b)
    a, b = abs(a), abs(b)
    m = tg.maximum(a, b)
    n = minimum(a, b)
    q = div(n, m)
    h = tg.where(tg.equal(m, 0), m, tg.mul(m, tg.sqrt(tg.add(tg.mul(q, q), 1.0))))
    inf = logical_or(tg.equal(a, math.inf), tg.equal(b, math.inf))
    return tg.where(inf, tg.cast(tg.as_node(math.inf, h.dtype), h.dtype), h)


@composite(example=_ab)
def xlogy(a, b):
    """a * log(b), 0 where a = 0 unless b is nan (torch's rule)."""
    a, b = _floats(a, b)
    zero = tg.cast(tg.as_node(0.0, a.dtype), a.dtype)
    return tg.where(isnan(b), b, tg.where(tg.equal(a, 0), zero, tg.mul(a, tg.log(b))))


@composite(example=_x)
def logit(x, *, eps=None):
    """log(x / (1 - x)), x first clamped to [eps, 1 - eps] when eps is given."""
    x = _float(x)
    if eps is not None:
        x = minimum(tg.maximum(x, float(eps)), 1.0 - float(eps))
    return tg.log(div(x, sub(1.0, x)))


# ---------------------------------------------------------------------------- gamma and erfinv
# The gamma family and erfinv are series and iterations rather than one formula: they run in
# float64 and round once to the input's dtype (float32 results are then within an ulp or two;
# ints give float32, as torch's).
def _wide(x: Node) -> Node:
    return tg.cast(_float(x), "float64")


def _narrow(y: Node, x: Node) -> Node:
    return tg.cast(y, _float(x).dtype)


# Lanczos' approximation, g = 7, nine terms (Godfrey's coefficients): Gamma(z) to ~1e-15
_LANCZOS_G = 7.0
_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
            -176.61502916214059, 12.507343278686905, -0.13857109526572012,
            9.9843695780195716e-6, 1.5056327351493116e-7)


def _lgamma_right(z: Node) -> Node:
    """log Gamma(z) for z >= 0.5 (Lanczos)."""
    z = sub(z, 1.0)
    a = tg.as_node(_LANCZOS[0], z.dtype)
    for i, c in enumerate(_LANCZOS[1:], start=1):
        a = tg.add(a, div(c, tg.add(z, float(i))))
    t = tg.add(z, _LANCZOS_G + 0.5)
    return tg.add(sub(tg.mul(tg.add(z, 0.5), tg.log(t)), t),
                  tg.add(tg.log(a), 0.5 * math.log(2 * math.pi)))


def _pi_period(x: Node) -> Node:
    """x - round(x) in [-1/2, 1/2]: |sin(pi x)| and tan(pi x) are those of it, exact in
    float64 (integers give exactly 0, the poles; a tiny x keeps its digits)."""
    return sub(x, round_half_even(x))


@composite(example=_x)
def lgamma(x):
    """log |Gamma(x)|: Lanczos for x >= 0.5, the reflection log(pi / |sin(pi x)|) -
    lgamma(1 - x) below (inf at 0 and the negative integers); inf at +-inf."""
    w = _wide(x)
    left = tg.less(w, 0.5)
    g = _lgamma_right(tg.where(left, sub(1.0, w), w))
    s = abs(tg.sin(tg.mul(_pi_period(w), math.pi)))
    reflected = sub(sub(math.log(math.pi), tg.log(s)), g)
    y = tg.where(left, reflected, g)
    return _narrow(tg.where(tg.equal(abs(w), math.inf), abs(w), y), x)


# psi(y) - log(y) + 1 / (2y) for large y: -sum B_2k / (2k y**2k), k = 1..7 (error < 1e-13
# at y >= 6.5)
_DIGAMMA_SERIES = (1 / 12, -1 / 120, 1 / 252, -1 / 240, 1 / 132, -691 / 32760, 1 / 12)
_DIGAMMA_SHIFT = 6


@composite(example=_x)
def digamma(x):
    """psi(x) = d/dx log Gamma(x): shifted by the recurrence psi(x) = psi(x + 1) - 1 / x to
    x + 6, then the asymptotic series; the reflection psi(1 - x) - pi / tan(pi x) below 0.5.
    torch's edges: -inf at +0, +inf at -0, nan at the negative integers and -inf."""
    w = _wide(x)
    left = tg.less(w, 0.5)
    z = tg.where(left, sub(1.0, w), w)
    shift = tg.as_node(0.0, z.dtype)
    for k in range(_DIGAMMA_SHIFT):
        shift = tg.add(shift, tg.reciprocal(tg.add(z, float(k))))
    y = tg.add(z, float(_DIGAMMA_SHIFT))
    inv2 = tg.reciprocal(tg.mul(y, y))
    series, power = tg.as_node(0.0, z.dtype), inv2
    for c in _DIGAMMA_SERIES:
        series = tg.add(series, tg.mul(power, c))
        power = tg.mul(power, inv2)
    psi = sub(sub(sub(tg.log(y), div(0.5, y)), series), shift)
    r = _pi_period(w)
    reflected = sub(psi, div(math.pi, tan(tg.mul(r, math.pi))))
    out = tg.where(left, reflected, psi)
    pole = logical_and(tg.less(w, 0.0), tg.equal(r, 0.0))  # -1, -2, ... and -inf
    out = tg.where(pole, tg.as_node(math.nan, out.dtype), out)
    out = tg.where(tg.equal(w, 0.0), tg.neg(tg.reciprocal(w)), out)  # -inf at +0, inf at -0
    return _narrow(out, x)


_WINITZKI = 0.147  # erfinv's closed-form first guess (relative error < 2e-3)


@composite(example=_x)
def erfinv(x):
    """The inverse of erf on [-1, 1]: Winitzki's closed form, then three Newton steps on
    erf(v) = |x| (quadratic: 2e-3 -> float64's precision), the residual through erfc above
    1/2 (1 - |x| is exact there, erf(v) - |x| would cancel); odd, +-inf at +-1, nan beyond."""
    w = _wide(x)
    a = abs(w)
    ln = tg.log(tg.mul(sub(1.0, a), tg.add(a, 1.0)))  # log(1 - x**2), exact near 1
    b = tg.add(tg.mul(ln, 0.5), 2.0 / (math.pi * _WINITZKI))
    v = tg.sqrt(sub(tg.sqrt(sub(tg.mul(b, b), div(ln, _WINITZKI))), b))
    high, rest = tg.less(0.5, a), sub(1.0, a)
    for _ in range(3):
        residual = tg.where(high, sub(rest, erfc(v)), sub(tg.erf(v), a))
        v = sub(v, div(residual, tg.mul(tg.exp(tg.neg(tg.mul(v, v))), 2.0 / math.sqrt(math.pi))))
    v = tg.where(tg.equal(a, 1.0), tg.as_node(math.inf, v.dtype), v)
    v = tg.where(tg.less(1.0, a), tg.as_node(math.nan, v.dtype), v)
    return _narrow(_odd(w, v), x)


# float dtype: the exponent of its smallest normal value (below it the spacing stays fixed)
_MIN_EXPONENT = {"float16": -14, "bfloat16": -126, "float32": -126, "float64": -1022}


def _binade(m: Node) -> Node:
    """The exponent e with 2**e <= m < 2**(e+1), for finite m > 0: floor(log2(m)) moved by one
    where log2 rounded across a power of two (exact: the comparisons are with 2**e)."""
    e = floor(log2(m))
    e = tg.where(tg.less(m, exp2(e)), sub(e, 1.0), e)
    return tg.where(logical_not(tg.less(m, exp2(tg.add(e, 1.0)))), tg.add(e, 1.0), e)


@composite(example=_ab)
def nextafter(a, b):
    """The next value of a's dtype after a toward b (C's nextafter): a's magnitude plus or
    minus its spacing 2**(e - mantissa bits) (half that below a power of two, the fixed
    spacing among subnormals); b where a == b, the smallest subnormal toward b from 0, the
    largest finite value toward 0 from +-inf, nan with a nan. Exact: every step is a sum of
    two values of the dtype that is itself one, computed in float64."""
    a, b = _floats(a, b)
    name = a.dtype.name
    bits, largest = _FLOAT[name]
    low = _MIN_EXPONENT[name]
    x, y = tg.cast(a, "float64"), tg.cast(b, "float64")
    m = abs(x)
    finite = tg.less(m, math.inf)
    safe = tg.where(logical_and(finite, tg.less(0.0, m)), m, tg.as_node(1.0, m.dtype))
    e = _binade(safe)
    spacing = exp2(sub(tg.maximum(e, float(low)), float(bits)))
    below = logical_and(tg.equal(safe, exp2(e)), tg.less(float(low), e))  # a power of two
    away = tg.equal(tg.less(x, y), tg.less(0.0, x))  # |a| grows toward b
    step = tg.where(logical_or(away, logical_not(below)), spacing, tg.mul(spacing, 0.5))
    moved = tg.where(away, tg.add(m, step), sub(m, step))
    moved = tg.where(finite, moved, tg.as_node(largest, m.dtype))  # from +-inf toward 0
    out = tg.where(tg.less(x, 0.0), tg.neg(moved), moved)
    tiny = 2.0 ** (low - bits)
    out = tg.where(tg.equal(x, 0.0), tg.where(tg.less(y, 0.0), tg.as_node(-tiny, m.dtype),
                                              tg.as_node(tiny, m.dtype)), out)
    out = tg.where(tg.equal(x, y), y, out)
    out = tg.where(logical_or(isnan(x), isnan(y)), tg.as_node(math.nan, m.dtype), out)
    return tg.cast(out, a.dtype)


# ---------------------------------------------------------------------------- classification
@composite(example=_x)
def isinf(x):
    """x is +inf or -inf (never for ints and bools)."""
    if not x.dtype.is_float:
        return logical_not(tg.equal(x, x))
    return tg.equal(abs(x), math.inf)


@composite(example=_x)
def isfinite(x):
    """x is neither inf nor nan (always for ints and bools)."""
    if not x.dtype.is_float:
        return tg.equal(x, x)
    return tg.less(abs(x), math.inf)


@composite(example=_x)
def nan_to_num(x, *, nan=0.0, posinf=None, neginf=None):
    """nan, +inf and -inf replaced (by default with 0 and the dtype's largest and lowest
    finite values); ints unchanged."""
    if not x.dtype.is_float:
        return x
    big = _FLOAT[x.dtype.name][1]
    y = tg.where(isnan(x), float(nan), x)
    y = tg.where(tg.equal(x, math.inf), big if posinf is None else float(posinf), y)
    return tg.where(tg.equal(x, -math.inf), -big if neginf is None else float(neginf), y)


@composite(example=_x)
def signbit(x):
    """The sign bit: set for negatives and -0.0 (the one zero whose reciprocal is -inf); nan
    counts as positive (its sign bit is not observable through comparisons)."""
    if not x.dtype.is_float:
        return tg.less(x, 0)
    negative_zero = logical_and(tg.equal(x, 0), tg.less(tg.reciprocal(x), 0))
    return logical_or(tg.less(x, 0), negative_zero)


@composite(example=_ab)
def copysign(a, b):
    """|a| with b's sign bit (copysign(1, -0.0) = -1); ints become float32, as in torch."""
    a, b = _floats(a, b)
    m = abs(a)
    return tg.where(signbit(b), tg.neg(m), m)


@composite(example=_ab)
def fmax(a, b):
    """The larger, ignoring nan: nan only where both are (C's fmax; maximum propagates nan)."""
    a, b = tg.promote(a, b)
    if not a.dtype.is_float:
        return tg.maximum(a, b)
    return tg.where(isnan(b), a, tg.where(isnan(a), b, tg.maximum(a, b)))


@composite(example=_ab)
def fmin(a, b):
    """The smaller, ignoring nan: nan only where both are (C's fmin)."""
    a, b = tg.promote(a, b)
    if not a.dtype.is_float:
        return minimum(a, b)
    return tg.where(isnan(b), a, tg.where(isnan(a), b, minimum(a, b)))


@composite(example=_x)
def angle(x):
    """The argument of a real number: pi below zero, 0 at and above it, nan for nan (torch's
    angle of a real tensor; ints become float32)."""
    x = _float(x)
    pi = tg.cast(tg.as_node(math.pi, x.dtype), x.dtype)
    zero = tg.cast(tg.as_node(0.0, x.dtype), x.dtype)
    return tg.where(isnan(x), x, tg.where(tg.less(x, 0), pi, zero))


# ---------------------------------------------------------------------------- bits and logic
def _bits(op: str, *xs: Node) -> None:
    for x in xs:
        if x.dtype.is_float:
            raise DTypeError(f"{op}: needs bool or integer tensors, got {x.dtype.name} "
                             "(bit operations on floats are undefined; cast first)")


@composite(example=_ints)
def bitwise_or(a, b):
    """a | b = a + b - (a & b), exact in wrapping arithmetic; logical or on bools."""
    a, b = tg.promote(a, b)
    _bits("bitwise_or", a, b)
    return tg.add(a, b) if a.dtype.is_bool else sub(tg.add(a, b), _bitwise_and(a, b))


@composite(example=_ints)
def bitwise_xor(a, b):
    """a ^ b = a + b - 2 (a & b), exact in wrapping arithmetic; a != b on bools."""
    a, b = tg.promote(a, b)
    _bits("bitwise_xor", a, b)
    if a.dtype.is_bool:
        return not_equal(a, b)
    return sub(tg.add(a, b), tg.mul(_bitwise_and(a, b), 2))


@composite(example=lambda: (tg.input("a", (3, 4), "int32"),))
def bitwise_not(x):
    """~x = -1 - x (255 - x for uint8); not on bools."""
    _bits("bitwise_not", x)
    if x.dtype.is_bool:
        return logical_not(x)
    return sub(255 if x.dtype.name == "uint8" else -1, x)


def _width(op: str, a: Node) -> int:
    if not a.dtype.is_int:
        raise DTypeError(f"{op}: needs integer tensors, got {a.dtype.name}")
    return a.dtype.itemsize * 8


def _power_of_two(s: Node, low: int, high: int) -> Node:
    """2**clamp(s, low, high) in s's dtype (int pow wraps like a shift)."""
    s = minimum(tg.maximum(s, low), high)
    return tg.pow(tg.cast(tg.as_node(2, s.dtype), s.dtype), s)


@composite(example=_ints)
def left_shift(a, b):
    """a << b, wrapping; 0 where b < 0 or b >= the width (torch's rule)."""
    a, b = tg.promote(a, b)
    bits = _width("left_shift", a)
    out = tg.mul(a, _power_of_two(b, 0, bits - 1))
    outside = logical_or(tg.less(b, 0), logical_not(tg.less(b, bits)))
    return tg.where(outside, tg.cast(tg.as_node(0, a.dtype), a.dtype), out)


@composite(example=_ints)
def right_shift(a, b):
    """a >> b, arithmetic (floor division by 2**b); past the width (or b < 0) signed ints
    give 0 or -1 (their sign), unsigned 0 (torch's rule)."""
    a, b = tg.promote(a, b)
    bits = _width("right_shift", a)
    zero = tg.cast(tg.as_node(0, a.dtype), a.dtype)
    if a.dtype.name == "uint8":
        q = floor_divide(a, _power_of_two(b, 0, bits - 1))
        return tg.where(tg.less(b, bits), q, zero)
    q = floor_divide(a, _power_of_two(b, 0, bits - 2))  # 2**(bits - 1) wraps negative
    sign = tg.where(tg.less(a, 0), tg.cast(tg.as_node(-1, a.dtype), a.dtype), zero)
    return tg.where(logical_and(tg.less(b, bits - 1), logical_not(tg.less(b, 0))), q, sign)


@composite(example=lambda: (tg.input("c", (3,), "bool"), tg.input("d", (3,), "bool")))
def logical_xor(a, b):
    """Exactly one of a, b is nonzero."""
    return not_equal(tg.cast(a, "bool"), tg.cast(b, "bool"))


def div_rounded(a: TensorLike, b: TensorLike, rounding_mode: str | None) -> Node:
    """torch.div's three modes: None true division, "trunc" toward zero, "floor" down."""
    if rounding_mode is None:
        return div(a, b)
    if rounding_mode == "trunc":
        return div_trunc(a, b)
    if rounding_mode == "floor":
        return floor_divide(a, b)
    raise ArgumentError(f"div: rounding_mode must be None, 'trunc' or 'floor', got "
                        f"{rounding_mode!r}")


__all__ = [
    "acos", "acosh", "angle", "asin", "asinh", "atan", "atan2", "atanh", "bitwise_and",
    "bitwise_not", "bitwise_or", "bitwise_xor", "ceil", "copysign", "cosh", "digamma",
    "div_trunc", "erfc", "erfinv", "exp2", "expm1", "floor", "floor_divide", "fmax", "fmin",
    "fmod", "frac", "hypot", "isfinite", "isinf", "left_shift", "lgamma", "log10", "log1p",
    "log2", "logical_xor", "logit", "nan_to_num", "nextafter", "remainder", "right_shift", "round",
    "round_half_even", "signbit", "sinh", "tan", "trunc", "xlogy",
]
