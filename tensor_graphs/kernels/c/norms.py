"""C row kernels over the last axis (float32): softmax, layer_norm, rms_norm, rotary embedding.

Each writes into ``out=`` when given one (``writes_out``: see the registry)."""

from __future__ import annotations

import numpy as np

from tensor_graphs.ir import api as tg
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.c.lib import F32, I64, P, ptr
from tensor_graphs.kernels.c.unary import where_ok
from tensor_graphs.kernels.registry import kernel

LIB = "norms"
SOURCE = lib.source(LIB)


def _rows(x: np.ndarray) -> tuple[int, int]:
    n = x.shape[-1] if x.ndim else 1
    return (x.size // n if n else 0), n


def _has_axis(shapes, dtypes, attrs):
    if len(shapes[0]) == 0:
        return "needs an input with at least one axis (the last axis is the row)"
    return True


def _params_fit(shapes, dtypes, attrs):
    if len(shapes[0]) == 0:
        return "needs an input with at least one axis (the normalised one)"
    d = shapes[0][-1]
    for s in shapes[1:]:
        if tuple(s) != (d,):
            return f"weight and bias must have shape ({d},) (the last axis of x), got {tuple(s)}"
    return True


def _src(fn):
    fn.source_text = SOURCE
    return fn


@kernel(lambda x: tg.softmax(x), backend="c", name="c_softmax", dtypes=("float32",),
        contiguous=True, where=where_ok(LIB, _has_axis), tolerance=1e-6, writes_out=True)
@_src
def c_softmax(x, *, out=None):
    """softmax over the last axis, one row per thread chunk."""
    out = lib.output(out, x.shape, x.dtype)
    rows, n = _rows(x)
    lib.func(LIB, "tg_softmax_f32", P, P, I64, I64)(ptr(x), ptr(out), rows, n)
    return out


def _layer_norm(x, weight=None, bias=None, eps=1e-5, out=None):
    out = lib.output(out, x.shape, x.dtype)
    rows, n = _rows(x)
    fn = lib.func(LIB, "tg_layer_norm_f32", P, P, P, P, I64, I64, F32)
    fn(ptr(x), ptr(weight),
       ptr(bias), ptr(out), rows, n, float(eps))
    return out


@kernel(lambda x, weight, bias: tg.layer_norm(x, weight, bias), backend="c",
        name="c_layer_norm", dtypes=("float32",), contiguous=True,
        where=where_ok(LIB, _params_fit), tolerance=1e-5,
        writes_out=True)
@_src
def c_layer_norm(x, weight, bias, eps=1e-5, *, out=None):
    """layer_norm over the last axis with weight and bias (two-pass mean/variance)."""
    return _layer_norm(x, weight, bias, eps, out)


def _add_params_fit(shapes, dtypes, attrs):
    if tuple(shapes[0]) != tuple(shapes[1]):
        return f"a and b must have one shape (no broadcasting), got {tuple(shapes[0])} and " \
               f"{tuple(shapes[1])}"
    return _params_fit([shapes[0], *shapes[2:]], dtypes, attrs)


@kernel(lambda a, b, weight, bias: tg.layer_norm(a + b, weight, bias), backend="c",
        name="c_add_layer_norm", dtypes=("float32",), contiguous=True,
        where=where_ok(LIB, _add_params_fit), tolerance=1e-5, writes_out=True)
@_src
def c_add_layer_norm(a, b, weight, bias, eps=1e-5, *, out=None):
    """layer_norm(a + b) with weight and bias: a post-norm block's residual add in the same
    pass over each row, so the sum is never written out and read back."""
    out = lib.output(out, a.shape, a.dtype)
    rows, n = _rows(a)
    fn = lib.func(LIB, "tg_add_layer_norm_f32", P, P, P, P, P, I64, I64, F32)
    fn(ptr(a), ptr(b), ptr(weight), ptr(bias), ptr(out), rows, n, float(eps))
    return out


@kernel(lambda x: tg.layer_norm(x), backend="c", name="c_layer_norm_plain",
        dtypes=("float32",), contiguous=True, where=where_ok(LIB, _params_fit), tolerance=1e-5,
        writes_out=True)
@_src
def c_layer_norm_plain(x, eps=1e-5, *, out=None):
    """layer_norm over the last axis without weight and bias."""
    return _layer_norm(x, None, None, eps, out)


def _rms_norm(x, weight=None, eps=1e-6, out=None):
    out = lib.output(out, x.shape, x.dtype)
    rows, n = _rows(x)
    fn = lib.func(LIB, "tg_rms_norm_f32", P, P, P, I64, I64, F32)
    fn(ptr(x), ptr(weight), ptr(out), rows, n,
       float(eps))
    return out


@kernel(lambda x, weight: tg.rms_norm(x, weight), backend="c", name="c_rms_norm",
        dtypes=("float32",), contiguous=True, where=where_ok(LIB, _params_fit), tolerance=1e-5,
        writes_out=True)
@_src
def c_rms_norm(x, weight, eps=1e-6, *, out=None):
    """rms_norm over the last axis with a weight."""
    return _rms_norm(x, weight, eps, out)


@kernel(lambda x: tg.rms_norm(x), backend="c", name="c_rms_norm_plain", dtypes=("float32",),
        contiguous=True, where=where_ok(LIB, _params_fit), tolerance=1e-5,
        writes_out=True)
@_src
def c_rms_norm_plain(x, eps=1e-6, *, out=None):
    """rms_norm over the last axis without a weight."""
    return _rms_norm(x, None, eps, out)


def _tables(xs: tuple, cs: tuple) -> int | str:
    """How many (seq, d) tables cos or sin of shape ``cs`` holds for x of shape ``xs``: 1
    (shared by every leading axis) or xs[0] (one per batch row, the rest 1: a padded batch's
    own positions); or why neither."""
    want = f"(seq, d) = {xs[-2:]} or ({xs[0]}, 1, ..., seq, d), optionally with leading 1s"
    if len(cs) > len(xs) or not cs or cs[-1] != xs[-1] or \
            (len(cs) > 1 and cs[-2] not in (1, xs[-2])):
        return f"must be {want}, got {cs}"
    lead = (1,) * (len(xs) - len(cs)) + tuple(cs[:-2])
    if all(n == 1 for n in lead):
        return 1
    if lead[0] == xs[0] and all(n == 1 for n in lead[1:]) and len(xs) > 2:
        return xs[0]
    return f"must be {want}, got {cs}"


def _rotary_fits(shapes, dtypes, attrs):
    xs, cs, ss = (tuple(s) for s in shapes)
    if len(xs) < 2 or xs[-1] % 2:
        return f"x must be (..., seq, d) with an even d, got {xs}"
    found = [_tables(xs, cs), _tables(xs, ss)]
    for name, n in zip(("cos", "sin"), found):
        if isinstance(n, str):
            return f"{name} {n}"
    return True if found[0] == found[1] else f"cos and sin must have one layout, got {cs}, {ss}"


@kernel(lambda x, cos, sin: tg.rotary_embedding(x, cos, sin), backend="c", name="c_rotary",
        dtypes=("float32",), contiguous=True, where=where_ok(LIB, _rotary_fits), tolerance=1e-6,
        writes_out=True)
@_src
def c_rotary(x, cos, sin, *, out=None):
    """Rotary embedding (HF rotate_half); cos/sin (seq, d) shared by the leading axes, or
    (batch, 1, ..., seq, d): a table per batch row."""
    seq, d = x.shape[-2], x.shape[-1]
    tables = _tables(x.shape, cos.shape)

    def table(t):  # (tables, seq, d), contiguous
        rows = t.shape[-2] if t.ndim > 1 else 1
        return np.ascontiguousarray(np.broadcast_to(t.reshape(tables, rows, d),
                                                    (tables, seq, d)))

    c, s = table(cos), table(sin)
    out = lib.output(out, x.shape, x.dtype)
    outer = x.size // (seq * d) if seq * d else 0
    fn = lib.func(LIB, "tg_rotary_f32", P, P, P, P, I64, I64, I64, I64)
    fn(ptr(x), ptr(c), ptr(s), ptr(out), outer, seq, d, max(outer // tables, 1))
    return out
