"""``c_sum``: the atomic ``sum`` over one run of adjacent axes, float32/float64, in C.

A training step's backward is full of sums (a bias's gradient over batch and sequence, a
broadcast's cotangent summed back, the loss over its rows); with only numpy's and torch's
kernels for them the step could not run in the native loop, and torch's sums ran on torch's
own thread pool between ours. The axes summed must be adjacent once axes of extent 1 are left
out (every sum ``tg.grad`` makes: leading axes, or the last); other sums keep the numpy kernel.
Accumulated in double and rounded once (reduce_sum.c).
"""

from __future__ import annotations

import math

import numpy as np

from tensor_graphs.ir.ops.names import SUM
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.c.lib import I64, P, ptr
from tensor_graphs.kernels.registry import kernel

LIB = "reduce_sum"
SOURCE = lib.source(LIB)
_SYMBOL = {np.dtype(np.float32): "tg_sum_f32", np.dtype(np.float64): "tg_sum_f64"}


def split(shape: tuple, axes) -> tuple[int, int, int] | str:
    """(outer, summed, inner) element counts of a sum of ``shape`` over ``axes``, or why the
    axes are not one run (axes of extent 1 may sit anywhere)."""
    summed = sorted({a % len(shape) for a in axes}) if shape else []
    real = [a for a in summed if shape[a] != 1]
    if real and real[-1] - real[0] + 1 != len(real) and any(
            shape[a] != 1 for a in range(real[0], real[-1] + 1) if a not in real):
        return f"sums over axes {tuple(axes)} of {tuple(shape)}, not one run of adjacent axes"
    if not real:
        return 1, 1, math.prod(shape)
    return (math.prod(shape[:real[0]]), math.prod(shape[a] for a in real),
            math.prod(shape[real[-1] + 1:]))


def _fits(shapes, dtypes, attrs):
    reason = lib.failure(LIB)
    if reason is not None:
        return reason
    if dtypes[0].name not in ("float32", "float64"):
        return f"takes float32/float64, got {dtypes[0].name}"
    found = split(tuple(shapes[0]), attrs.get("axes", ()))
    return found if isinstance(found, str) else True


def _signatures() -> list[dict]:
    out = []
    for shape, axes, keep, dt in (((8, 16, 33), (0, 1), True, "float32"),
                                  ((33, 300), (1,), False, "float32"),
                                  ((1025,), (0,), False, "float32"),
                                  ((4, 7, 5), (0,), True, "float64"),
                                  ((3, 1, 9, 1), (1, 2), False, "float32"),
                                  ((2, 3, 600), (2,), True, "float64"),
                                  ((5, 0, 3), (1,), False, "float32")):
        out.append({"x": (shape, dt), "axes": axes, "keepdims": keep})
    return out


def _src(fn):
    fn.source_text = SOURCE + "\n/* c_sum */"
    return fn


@kernel(SUM, backend="c", name="c_sum", contiguous=True, where=_fits, signatures=_signatures,
        tolerance=1e-6, writes_out=True)
@_src
def c_sum(x, axes, keepdims, *, out=None):
    """Sum over adjacent axes (extent-1 axes anywhere), float32/float64, in double."""
    outer, summed, inner = split(x.shape, axes)
    norm = {a % x.ndim for a in axes} if x.ndim else set()
    shape = tuple(1 if i in norm else e for i, e in enumerate(x.shape) if keepdims or i not in norm)
    out = lib.output(out, shape, x.dtype)
    if out.size:
        lib.func(LIB, _SYMBOL[x.dtype], P, P, I64, I64, I64)(ptr(x), ptr(out), outer, summed,
                                                             inner)
    return out
