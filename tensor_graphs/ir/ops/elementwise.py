"""Elementwise composites: arithmetic, comparisons and activations, each a decomposition into
atomic ops that stays finite and exact where the float32 math allows (tanh(50) is 1, not nan).
"""

from __future__ import annotations

import math

from tensor_graphs.errors import ArgumentError
from tensor_graphs.ir import builder as tg
from tensor_graphs.ir.composite import composite


def _x():
    return (tg.input("x", (3, 4)),)


def _ab():
    return (tg.input("a", (3, 4)), tg.input("b", (4,)))


@composite(example=_ab)
def sub(a, b):
    """a - b."""
    return tg.add(a, tg.neg(b))


@composite(example=_ab)
def div(a, b):
    """a / b, true division (ints are promoted to float32)."""
    if not a.dtype.is_float:
        a = tg.cast(a, "float32")
    if not b.dtype.is_float:
        b = tg.cast(b, "float32")
    a, b = tg.promote(a, b)
    return tg.mul(a, tg.reciprocal(b))


@composite(example=lambda: (tg.input("c", (3,), "bool"),))
def logical_not(x):
    """not x, for bool tensors."""
    return tg.equal(tg.cast(x, "bool"), False)


@composite(example=lambda: (tg.input("c", (3,), "bool"), tg.input("d", (3,), "bool")))
def logical_and(a, b):
    """a and b, for bool tensors."""
    return tg.mul(tg.cast(a, "bool"), tg.cast(b, "bool"))


@composite(example=lambda: (tg.input("c", (3,), "bool"), tg.input("d", (3,), "bool")))
def logical_or(a, b):
    """a or b, for bool tensors."""
    return tg.add(tg.cast(a, "bool"), tg.cast(b, "bool"))


@composite(example=_ab)
def greater(a, b):
    """a > b."""
    return tg.less(b, a)


@composite(example=_ab)
def less_equal(a, b):
    """a <= b (false when either is nan)."""
    return logical_or(tg.less(a, b), tg.equal(a, b))


@composite(example=_ab)
def greater_equal(a, b):
    """a >= b (false when either is nan)."""
    return logical_or(tg.less(b, a), tg.equal(a, b))


@composite(example=_ab)
def not_equal(a, b):
    """a != b (true when either is nan)."""
    return logical_not(tg.equal(a, b))


@composite(example=_x)
def isnan(x):
    """x is nan."""
    return not_equal(x, x)


@composite(example=_ab)
def minimum(a, b):
    """Elementwise min; nan propagates."""
    a, b = tg.promote(a, b)
    if a.dtype.is_bool:
        return logical_and(a, b)
    if a.dtype.is_int:  # c - x reverses the order without overflow (-x overflows at -128)
        c = 255 if a.dtype.name == "uint8" else -1
        return sub(c, tg.maximum(sub(c, a), sub(c, b)))
    return tg.neg(tg.maximum(tg.neg(a), tg.neg(b)))


@composite(example=_x)
def abs(x):  # noqa: A001 - torch's name
    """|x|."""
    if x.dtype.is_bool or x.dtype.name == "uint8":
        return x
    return tg.where(tg.less(x, 0), tg.neg(x), x)


@composite(example=_x)
def sign(x):
    """-1, 0 or 1 (nan stays nan)."""
    zero = tg.cast(tg.as_node(0, x.dtype), x.dtype)
    pos = tg.cast(tg.less(zero, x), x.dtype)
    neg_ = tg.cast(tg.less(x, zero), x.dtype)
    out = sub(pos, neg_)
    return tg.where(isnan(x), x, out) if x.dtype.is_float else out


@composite(example=_x)
def square(x):
    """x * x."""
    return tg.mul(x, x)


@composite(example=_x)
def rsqrt(x):
    """1 / sqrt(x)."""
    return tg.reciprocal(tg.sqrt(x))


@composite(example=_x)
def cos(x):
    """Cosine, as sin(pi/2 - x)."""
    x = tg.cast(x, "float32") if not x.dtype.is_float else x
    return tg.sin(sub(math.pi / 2, x))


@composite(example=_x)
def clamp(x, *, min=None, max=None):  # noqa: A002 - torch's names
    """Clip to [min, max]; either bound may be None."""
    if min is not None:
        x = tg.maximum(x, min)
    if max is not None:
        x = minimum(x, max)
    return x


@composite(example=_x)
def relu(x):
    """max(x, 0)."""
    return tg.maximum(x, 0)


@composite(example=_x)
def sigmoid(x):
    """1 / (1 + exp(-x)), as e / (1 + e) with e = exp(x) for x < 0: exp never overflows, so
    float16 sigmoid(-12) is 6.1e-6 (not 0) and sigmoid(+-100) is exactly 1 / tiny."""
    e = tg.exp(tg.neg(abs(x)))
    p = tg.reciprocal(tg.add(e, 1.0))
    return tg.where(tg.less(x, 0), tg.mul(e, p), p)


@composite(example=_x)
def tanh(x):
    """sign(x) * (1 - e) / (1 + e) with e = exp(-2|x|): finite for every finite x."""
    x = tg.cast(x, "float32") if not x.dtype.is_float else x
    e = tg.exp(tg.mul(abs(x), -2.0))
    t = div(sub(1.0, e), tg.add(e, 1.0))
    return tg.where(tg.less(x, 0), tg.neg(t), t)


@composite(example=_x)
def gelu(x, *, approximate="none"):
    """x * Phi(x): approximate="none" the erf form x/2 * erfc(-x / sqrt 2), "tanh" the tanh
    formula (torch's two forms).

    erfc, not 1 + erf(x / sqrt 2): that sum cancels below x ~ -5.9 and is exactly 0 from -8.3
    in float64, where x Phi(x) is still a normal number (-8e-17 at -8.5, nonzero to -38); this
    decomposition is the reference every kernel is checked against, so its tail is the true
    one."""
    if approximate == "tanh":
        inner = tg.mul(tg.add(x, tg.mul(tg.mul(tg.mul(x, x), x), 0.044715)),
                       math.sqrt(2.0 / math.pi))
        return tg.mul(tg.mul(x, 0.5), tg.add(tanh(inner), 1.0))
    if approximate != "none":
        raise ArgumentError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    # atomic erfc by name: ir/ops/pointwise.py, its builder, imports this module
    return tg.mul(tg.mul(x, 0.5), tg._make("erfc", (tg.mul(x, -1.0 / math.sqrt(2.0)),)))


@composite(example=_x)
def silu(x):
    """x * sigmoid(x) (swish)."""
    return tg.mul(x, sigmoid(x))


@composite(example=_x)
def elu(x, *, alpha=1.0):
    """x if x > 0 else alpha * (exp(x) - 1)."""
    return tg.where(tg.less(0.0, x), x, tg.mul(sub(tg.exp(minimum(x, 0.0)), 1.0), alpha))


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


@composite(example=_x)
def selu(x):
    """scale * elu(x, alpha) with the self-normalising constants."""
    return tg.mul(elu(x, alpha=_SELU_ALPHA), _SELU_SCALE)


@composite(example=_x)
def softplus(x, *, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta, linear above threshold (torch's form), overflow-free.
    log1p, not log(1 + e): for beta x below about -16 e is under float32's resolution next
    to 1, and 1 + e rounds it away (softplus(-20) is 2e-9, not 0; log_sigmoid(20) likewise)."""
    bx = tg.mul(x, beta)
    # atomic log1p by name: ir/ops/pointwise.py, its builder, imports this module
    tail = tg._make("log1p", (tg.exp(tg.neg(abs(bx))),))
    soft = div(tg.add(tg.maximum(bx, 0.0), tail), beta)
    return tg.where(tg.less(threshold, bx), x, soft)
