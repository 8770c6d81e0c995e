"""Reduction composites: mean/var over possibly symbolic axes, min/argmax/argmin with numpy's
nan and tie rules, prod as a tree of products, cumsum, and the softmax family."""

from __future__ import annotations

from tensor_graphs.errors import ShapeError
from tensor_graphs.ir import builder as tg
from tensor_graphs.ir.composite import composite
from tensor_graphs.ir.ops.elementwise import div, isnan, logical_not, logical_or, sub
from tensor_graphs.ir.shapes import normalize_axes, numel


def _x():
    return (tg.input("x", (3, 4)),)


def _float(x):
    return x if x.dtype.is_float else tg.cast(x, "float32")


def _accumulator(x):
    """float16/bfloat16 sums overflow at 65504 and round every step: accumulate in float32."""
    return tg.cast(x, "float32") if x.dtype.is_low_precision else x


def _empty(x, axis, op: str) -> bool:
    """Whether an axis the softmax family reduces is statically empty (a 0 dim, or a symbolic
    one specialized to 0). max has no value there (numpy and torch refuse it too), but the
    results do without it, as torch's: softmax and log_softmax of an empty axis are empty,
    logsumexp is log(0) = -inf. Symbolic dims that turn out 0 at run time meet the same
    rule where a call specializes (no bounds, ``tg.evaluate``) or in the kernels (numpy's
    start their max at -inf)."""
    return any(x.shape[a] == 0 for a in normalize_axes(axis, x.ndim, op))


def _count(x, axes, dtype):
    """The number of reduced elements as a tensor (a dim leaf when symbolic)."""
    return tg.size(numel(x.shape[a] for a in axes), dtype)


@composite(example=_x)
def mean(x, *, axis=None, keepdims=False):
    """Arithmetic mean over axes (all when None); float16/bfloat16 accumulate in float32."""
    x = _float(x)
    axes = normalize_axes(axis, x.ndim, "mean")
    acc = _accumulator(x)
    out = div(tg.sum(acc, axes, keepdims), _count(acc, axes, acc.dtype))
    return tg.cast(out, x.dtype)


@composite(example=_x)
def var(x, *, axis=None, keepdims=False, correction=0):
    """Variance over axes: the sum of squared deviations divided by max(n - correction, 0);
    float16/bfloat16 accumulate in float32.

    max(.., 0) as torch and numpy divide: with no degree of freedom left (n <= correction, an
    empty axis) the variance is nan for a constant row (0 / 0) and inf otherwise, never the
    negative value or -0 that n - correction < 0 would give."""
    x = _float(x)
    axes = normalize_axes(axis, x.ndim, "var")
    acc = _accumulator(x)
    centered = sub(acc, mean(acc, axis=axes, keepdims=True))
    total = tg.sum(tg.mul(centered, centered), axes, keepdims)
    dof = tg.maximum(sub(_count(acc, axes, acc.dtype), float(correction)), 0.0)
    return tg.cast(div(total, dof), x.dtype)


@composite(example=_x)
def min(x, *, axis=None, keepdims=False):  # noqa: A001 - torch's name
    """Minimum over axes; nan propagates."""
    axes = normalize_axes(axis, x.ndim, "min")
    if x.dtype.is_bool:
        return logical_not(tg.max(logical_not(x), axes, keepdims))
    if x.dtype.is_int:  # c - x reverses the order without overflow (-x overflows at -128)
        c = 255 if x.dtype.name == "uint8" else -1
        return sub(c, tg.max(sub(c, x), axes, keepdims))
    return tg.neg(tg.max(tg.neg(x), axes, keepdims))


def _arg_extreme(x, axis, keepdims, pick_max: bool):
    """First index of the extreme value; a nan counts as the extreme (numpy's rule)."""
    if axis is None:
        x, axis = tg.reshape(x, (-1,)), 0
    n = x.shape[axis]
    ext = tg.max(x, axis, True) if pick_max else min(x, axis=axis, keepdims=True)
    hit = tg.equal(x, ext)
    if x.dtype.is_float:
        hit = logical_or(hit, isnan(x))
    shape = [1] * x.ndim
    shape[axis] = n
    index = tg.reshape(tg.iota(n, "int64"), tuple(shape))
    big = tg.size(n, "int64")
    return min(tg.where(hit, index, big), axis=axis, keepdims=keepdims)


@composite(example=_x)
def argmax(x, *, axis=None, keepdims=False):
    """Index of the first maximum (int64); a nan counts as the maximum."""
    return _arg_extreme(x, axis, keepdims, True)


@composite(example=_x)
def argmin(x, *, axis=None, keepdims=False):
    """Index of the first minimum (int64); a nan counts as the minimum."""
    return _arg_extreme(x, axis, keepdims, False)


@composite(example=_x)
def prod(x, *, axis=None, keepdims=False):
    """Product over axes, as a balanced tree of pairwise products (axes must be concrete)."""
    if x.dtype.is_bool:
        x = tg.cast(x, "int64")
    axes = normalize_axes(axis, x.ndim, "prod")
    kept_shape = tuple(1 if a in axes else d for a, d in enumerate(x.shape))
    rest = [a for a in range(x.ndim) if a not in axes]
    x = tg.permute(x, tuple(rest + list(axes)))
    n = numel(x.shape[len(rest):])
    if not isinstance(n, int):
        raise ShapeError(f"prod: the reduced axes must be concrete, got size {n}")
    x = tg.reshape(x, x.shape[:len(rest)] + (n,))
    if n == 0:
        x, n = tg.pad(x, (0, 1), value=1), 1
    while n > 1:
        if n % 2:
            x, n = tg.pad(x, (0, 1), value=1), n + 1
        half = n // 2
        x = tg.mul(tg.slice_axis(x, -1, 0, half), tg.slice_axis(x, -1, half, n))
        n = half
    return tg.reshape(x, kept_shape if keepdims else x.shape[:-1])


@composite(example=_x)
def cumsum(x, *, axis=0):
    """Running sum along an axis: out[i] = sum(x[j] for j <= i), as a masked sum."""
    if x.dtype.is_bool:
        x = tg.cast(x, "int64")
    n = x.shape[axis]
    moved = tg.unsqueeze(tg.transpose(x, axis, -1), -2)  # (..., 1, n): j on the last axis
    i = tg.reshape(tg.iota(n), (n, 1))
    j = tg.reshape(tg.iota(n), (1, n))
    total = tg.sum(tg.where(tg.less(i, j), tg.cast(0, x.dtype), moved), -1)  # (..., n)
    return tg.transpose(total, axis, -1)


@composite(example=_x)
def logsumexp(x, *, axis=-1, keepdims=False):
    """log(sum(exp(x))), shifted by the max; an all -inf row gives -inf."""
    x = _float(x)
    if _empty(x, axis, "logsumexp"):
        return tg.log(tg.sum(tg.exp(x), axis, keepdims))
    m = tg.max(x, axis, True)
    safe = tg.where(isnan(sub(m, m)), tg.cast(0.0, x.dtype), m)  # m = +-inf: shift by 0
    out = tg.add(tg.log(tg.sum(tg.exp(sub(x, safe)), axis, True)), safe)
    return out if keepdims else tg.squeeze(out, axis)


@composite(example=_x)
def softmax(x, *, axis=-1):
    """exp(x - max) / sum(exp(x - max)) along an axis."""
    x = _float(x)
    if _empty(x, axis, "softmax"):
        return x
    e = tg.exp(sub(x, tg.max(x, axis, True)))
    return div(e, tg.sum(e, axis, True))


@composite(example=_x)
def log_softmax(x, *, axis=-1):
    """x - logsumexp(x) along an axis."""
    x = _float(x)
    if _empty(x, axis, "log_softmax"):
        return x
    shifted = sub(x, tg.max(x, axis, True))
    return sub(shifted, tg.log(tg.sum(tg.exp(shifted), axis, True)))

