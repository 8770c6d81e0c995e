"""numpy kernels for the common composite ops (``numpy_<op>``), written directly in numpy.

Each computes what the op's decomposition means, in one pass of numpy calls instead of one
call per atomic op: float16/bfloat16 compute in float32 and round once at the end (so they are
more accurate than the op-by-op reference, never less). Inputs of one dtype only (the
``same_dtype`` constraint); mixed dtypes and the rarer composites take the exact kernels or
the decomposition. Every one writes into ``out=`` when given one (``writes_out``, see the
registry): the elementwise ufuncs, softmax, layer_norm, rms_norm and linear compute straight
into it, the others copy their result there (``_copying``: one more pass). Ops with optional
tensors get one kernel per combination of given tensors (``numpy_layer_norm``,
``numpy_layer_norm_no_bias``, ...): a pattern has a fixed arity.
"""

from __future__ import annotations

import functools
import inspect
import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tensor_graphs.errors import EvaluationError
from tensor_graphs.ir.dtypes import ALL, FLOATS, NUMBERS
from tensor_graphs.ir.ops import OPS
from tensor_graphs.kernels.numpy._util import (
    LOW,
    into,
    op_pattern,
    out,
    same_dtype,
    ufunc,
    up,
    variants,
    with_signature,
)
from tensor_graphs.kernels.registry import kernel

TOL = 1e-6
EXACT = 1e-7  # one rounding
NONE = 1e-12  # no rounding: bit-exact


def numpy_kernel(op: str, dtypes=FLOATS, where=same_dtype, tolerance: float = TOL, **kw):
    register = kernel(op, backend="numpy", name=f"numpy_{op}", dtypes=dtypes, where=where,
                      tolerance=tolerance, writes_out=True, **kw)
    return lambda fn: register(_copying(fn))


def _copying(fn):
    """``fn`` as a ``writes_out`` kernel function: a function that takes ``out`` itself is
    returned as is; any other computes its result and copies it into ``out`` when given one."""
    sig = inspect.signature(fn)
    if "out" in sig.parameters:
        return fn

    @functools.wraps(fn)
    def run(*args, out=None, **kw):
        result = fn(*args, **kw)
        return result if out is None else into(result, out.dtype, out)

    keyword = inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, default=None)
    run.__signature__ = sig.replace(parameters=[*sig.parameters.values(), keyword])
    del run.__wrapped__  # the registry reads run's own signature
    run.source_text = inspect.getsource(fn) + getattr(fn, "source_text", "")
    return run


# ---------------------------------------------------------------------------- elementwise
@numpy_kernel("sub", dtypes=NUMBERS, tolerance=EXACT)
def numpy_sub(a, b, *, out=None):
    """a - b (ints wrap)."""
    with np.errstate(all="ignore"):
        return ufunc(np.subtract, a.dtype, out, a, b)


@numpy_kernel("div", tolerance=EXACT)
def numpy_div(a, b, *, out=None):
    """a / b, correctly rounded (float inputs)."""
    with np.errstate(all="ignore"):
        return ufunc(np.divide, a.dtype, out, a, b)


@numpy_kernel("minimum", dtypes=ALL, tolerance=NONE)
def numpy_minimum(a, b, *, out=None):
    """Elementwise min; nan propagates."""
    return ufunc(np.minimum, a.dtype, out, a, b)


def _compare(name: str, fn, doc: str):
    run = with_signature(lambda a, b, out=None: ufunc(fn, np.bool_, out, a, b), ["a", "b"], {},
                         doc, source=name, writes_out=True)
    numpy_kernel(name, dtypes=ALL, tolerance=NONE)(run)


_compare("greater", np.greater, "a > b.")
_compare("less_equal", np.less_equal, "a <= b (false with nan).")
_compare("greater_equal", np.greater_equal, "a >= b (false with nan).")
_compare("not_equal", np.not_equal, "a != b (true with nan).")


@numpy_kernel("logical_not", dtypes=ALL, tolerance=NONE)
def numpy_logical_not(x):
    """not x (nonzero is true)."""
    return np.asarray(np.logical_not(x != 0))


@numpy_kernel("logical_and", dtypes=ALL, where=None, tolerance=NONE)
def numpy_logical_and(a, b):
    """a and b (nonzero is true)."""
    return np.asarray(np.logical_and(a != 0, b != 0))


@numpy_kernel("logical_or", dtypes=ALL, where=None, tolerance=NONE)
def numpy_logical_or(a, b):
    """a or b (nonzero is true)."""
    return np.asarray(np.logical_or(a != 0, b != 0))


@numpy_kernel("isnan", dtypes=NUMBERS, tolerance=NONE)
def numpy_isnan(x):
    """x is nan."""
    return np.asarray(np.isnan(up(x)))


@numpy_kernel("abs", dtypes=NUMBERS, tolerance=NONE)
def numpy_abs(x, *, out=None):
    """|x| (ints wrap at the minimum, like the reference)."""
    return ufunc(np.abs, x.dtype, out, x)


@numpy_kernel("sign", dtypes=NUMBERS, tolerance=NONE)
def numpy_sign(x):
    """-1, 0 or 1; nan stays nan."""
    return out(np.sign(up(x)), x.dtype)


@numpy_kernel("square", dtypes=NUMBERS, tolerance=EXACT)
def numpy_square(x, *, out=None):
    """x * x (ints wrap)."""
    with np.errstate(all="ignore"):
        return ufunc(np.multiply, x.dtype, out, x, x)


@numpy_kernel("rsqrt")
def numpy_rsqrt(x):
    """1 / sqrt(x)."""
    with np.errstate(all="ignore"):
        return out(1.0 / np.sqrt(up(x)), x.dtype)


@numpy_kernel("cos", tolerance=EXACT)
def numpy_cos(x):
    """cos as the op defines it, sin(pi/2 - x), in float64 and rounded once."""
    return out(np.sin(math.pi / 2 - x.astype(np.float64)), x.dtype)


def _int_bounds(shapes, dtypes, attrs):
    if dtypes[0].is_int and any(isinstance(attrs.get(k), float) for k in ("min", "max")):
        return "float bounds on an int tensor give a float32 result; not handled here"
    return True


@numpy_kernel("clamp", dtypes=NUMBERS, where=_int_bounds, tolerance=EXACT)
def numpy_clamp(x, min, max):  # noqa: A002 - the op's attribute names
    """Clip to [min, max] (either may be None); nan propagates."""
    y = up(x)
    if min is not None:
        y = np.maximum(y, np.asarray(min, y.dtype))
    if max is not None:
        y = np.minimum(y, np.asarray(max, y.dtype))
    return out(y, x.dtype)


@numpy_kernel("relu", dtypes=NUMBERS, tolerance=NONE)
def numpy_relu(x):
    """max(x, 0); nan propagates."""
    return out(np.maximum(up(x), np.zeros((), up(x).dtype)), x.dtype)


def _sigmoid(a):
    e = np.exp(-np.abs(a))
    p = 1.0 / (1.0 + e)
    return np.where(a < 0, e * p, p)


@numpy_kernel("sigmoid")
def numpy_sigmoid(x):
    """1 / (1 + exp(-x)) without overflow (e / (1 + e), e = exp(-|x|))."""
    with np.errstate(all="ignore"):
        return out(_sigmoid(up(x)), x.dtype)


@numpy_kernel("tanh")
def numpy_tanh(x, *, out=None):
    """numpy.tanh."""
    return ufunc(np.tanh, x.dtype, out, x)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_erfc = np.frompyfunc(math.erfc, 1, 1)  # libm's, per element: as fast as a vectorised series


@numpy_kernel("gelu")
def numpy_gelu(x, approximate):
    """x * Phi(x): the erf form as x/2 erfc(-x / sqrt 2) (in float64, rounded once: the
    tail below x = -8.3, where 1 + erf is 0, is kept) or the tanh form."""
    with np.errstate(all="ignore"):
        if approximate == "tanh":
            a = up(x)
            inner = (a + a * a * a * 0.044715) * _SQRT_2_OVER_PI
            return out(a * 0.5 * (1.0 + np.tanh(inner)), x.dtype)
        a = x.astype(np.float64)
        return out(a * 0.5 * np.asarray(_erfc(a * -math.sqrt(0.5)), np.float64), x.dtype)


@numpy_kernel("silu")
def numpy_silu(x):
    """x * sigmoid(x)."""
    with np.errstate(all="ignore"):
        a = up(x)
        return out(a * _sigmoid(a), x.dtype)


def _elu(a, alpha):
    return np.where(a > 0, a, np.expm1(np.minimum(a, 0)) * alpha)


@numpy_kernel("elu")
def numpy_elu(x, alpha):
    """x if x > 0 else alpha * (exp(x) - 1)."""
    with np.errstate(all="ignore"):
        return out(_elu(up(x), alpha), x.dtype)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


@numpy_kernel("selu")
def numpy_selu(x):
    """scale * elu(x, alpha) with the self-normalising constants."""
    with np.errstate(all="ignore"):
        return out(_elu(up(x), _SELU_ALPHA) * _SELU_SCALE, x.dtype)


@numpy_kernel("softplus")
def numpy_softplus(x, beta, threshold):
    """log(1 + exp(beta x)) / beta, x itself above the threshold (overflow-free)."""
    with np.errstate(all="ignore"):
        a = up(x)
        bx = a * beta
        soft = (np.maximum(bx, 0) + np.log1p(np.exp(-np.abs(bx)))) / beta
        return out(np.where(bx > threshold, a, soft), x.dtype)


# ---------------------------------------------------------------------------- reductions
def _axis(axis):
    return tuple(axis) if isinstance(axis, (tuple, list)) else axis


@numpy_kernel("mean")
def numpy_mean(x, axis, keepdims):
    """Arithmetic mean (float16/bfloat16 accumulate in float32)."""
    with np.errstate(all="ignore"):
        return out(np.mean(up(x), axis=_axis(axis), keepdims=keepdims), x.dtype)


@numpy_kernel("var")
def numpy_var(x, axis, keepdims, correction):
    """Variance over max(n - correction, 0) (two-pass; numpy's ddof clamps the same way),
    so n <= correction gives nan or inf as torch does, never a negative variance."""
    with np.errstate(all="ignore"):
        return out(np.var(up(x), axis=_axis(axis), keepdims=keepdims, ddof=correction),
                   x.dtype)


@numpy_kernel("min", dtypes=ALL, tolerance=NONE)
def numpy_min(x, axis, keepdims):
    """Minimum; nan propagates."""
    return out(np.min(up(x), axis=_axis(axis), keepdims=keepdims), x.dtype)


def _arg(fn, x, axis, keepdims):
    a = up(x)
    if axis is None:
        r = fn(a.reshape(-1))
        return np.asarray(r, np.int64).reshape((1,) if keepdims else ())
    return np.asarray(fn(a, axis=axis, keepdims=keepdims), np.int64)


@numpy_kernel("argmax", dtypes=ALL, tolerance=NONE)
def numpy_argmax(x, axis, keepdims):
    """Index of the first maximum (int64); a nan counts as the maximum."""
    return _arg(np.argmax, x, axis, keepdims)


@numpy_kernel("argmin", dtypes=ALL, tolerance=NONE)
def numpy_argmin(x, axis, keepdims):
    """Index of the first minimum (int64); a nan counts as the minimum."""
    return _arg(np.argmin, x, axis, keepdims)


@numpy_kernel("prod", dtypes=NUMBERS)
def numpy_prod(x, axis, keepdims):
    """Product (floats multiply in float64 and round once, ints wrap)."""
    with np.errstate(all="ignore"):
        a = x if x.dtype.kind in "iu" else x.astype(np.float64)
        return out(np.prod(a, axis=_axis(axis), keepdims=keepdims, dtype=a.dtype), x.dtype)


@numpy_kernel("cumsum", dtypes=NUMBERS)
def numpy_cumsum(x, axis):
    """Running sum along an axis (floats accumulate in float64, ints wrap)."""
    if x.dtype.kind in "iu":
        return np.cumsum(x, axis=axis, dtype=x.dtype)
    return out(np.cumsum(x.astype(np.float64), axis=axis), x.dtype)


# The softmax family's max starts at -inf, the identity np.max lacks: over an empty axis it
# is -inf rather than numpy's ValueError, so softmax and log_softmax are empty and logsumexp
# is -inf, as the decompositions say (``ir.ops.reductions._empty``) and torch gives.
@numpy_kernel("logsumexp")
def numpy_logsumexp(x, axis, keepdims):
    """log(sum(exp(x))), shifted by the max; an all -inf row gives -inf."""
    with np.errstate(all="ignore"):
        a = up(x)
        m = np.max(a, axis=axis, keepdims=True, initial=-np.inf)
        m = np.where(np.isnan(m - m), np.zeros((), a.dtype), m)
        r = np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m
        return out(r if keepdims else np.squeeze(r, axis), x.dtype)


@numpy_kernel("softmax")
def numpy_softmax(x, axis, *, out=None):
    """exp(x - max) / sum(exp(x - max)) along an axis."""
    with np.errstate(all="ignore"):
        a = up(x)
        e = np.exp(a - np.max(a, axis=axis, keepdims=True, initial=-np.inf))
        if out is not None and x.dtype not in LOW:
            return np.divide(e, np.sum(e, axis=axis, keepdims=True), out=out)
        return into(e / np.sum(e, axis=axis, keepdims=True), x.dtype, out)


@numpy_kernel("log_softmax")
def numpy_log_softmax(x, axis):
    """x - max - log(sum(exp(x - max))) along an axis."""
    with np.errstate(all="ignore"):
        a = up(x)
        s = a - np.max(a, axis=axis, keepdims=True, initial=-np.inf)
        return out(s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True)), x.dtype)


# ---------------------------------------------------------------------------- nn
def _variants(op_name: str, core, attrs: dict, doc: str, where=same_dtype, dtypes=FLOATS,
              tolerance: float = TOL):
    """Register ``numpy_<op>[_no_...]`` for every combination of given optional tensors."""
    op = OPS[op_name]
    for given, suffix in variants(op):
        def run(*arrays, _given=given, **kw):
            return core(**dict(zip(_given, arrays)), **kw)

        with_signature(run, given, attrs, doc, source=f"{op_name}{suffix}", writes_out=True)
        kernel(op_pattern(op, given), backend="numpy", name=f"numpy_{op_name}{suffix}",
               dtypes=dtypes, where=where, tolerance=tolerance, writes_out=True)(run)


def _direct(x, out) -> bool:
    """Whether a kernel computes straight into ``out`` (given, and x not float16/bfloat16,
    which compute in float32 and round once at the end)."""
    return out is not None and x.dtype not in LOW


def _layer_norm(x, weight=None, bias=None, *, eps, out=None):
    with np.errstate(all="ignore"):
        h = up(x)
        c = h - np.mean(h, axis=-1, keepdims=True)
        d = np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + eps)
        y = np.divide(c, d, out=out if _direct(x, out) else None)
        if weight is not None:
            y = np.multiply(y, up(weight), out=y)
        if bias is not None:
            y = np.add(y, up(bias), out=y)
        return y if y is out else into(y, x.dtype, out)


_variants("layer_norm", _layer_norm, {"eps": 1e-5},
          "(x - mean) / sqrt(var + eps) * weight + bias over the last axis (float32 or "
          "float64 math).")


def _rms_norm(x, weight=None, *, eps, out=None):
    with np.errstate(all="ignore"):
        h = up(x)
        d = np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + eps)
        y = np.divide(h, d, out=out if _direct(x, out) else None)
        if weight is not None:
            y = np.multiply(y, up(weight), out=y)
        return y if y is out else into(y, x.dtype, out)


_variants("rms_norm", _rms_norm, {"eps": 1e-6},
          "x / sqrt(mean(x**2) + eps) * weight over the last axis.")


def _linear(x, weight, bias=None, *, out=None):
    with np.errstate(all="ignore"):
        w = up(weight)
        y = np.matmul(up(x), w.T if w.ndim == 2 else w, out=out if _direct(x, out) else None)
        if bias is not None:
            y = np.add(y, up(bias), out=y)
        return y if y is out else into(y, x.dtype, out)


_variants("linear", _linear, {}, "x @ weight.T + bias with numpy.matmul (BLAS).")


def _int_ids(shapes, dtypes, attrs):
    if not dtypes[0].is_int:
        return f"ids must be ints, got {dtypes[0].name}"
    return True


@kernel("embedding", backend="numpy", name="numpy_embedding", where=_int_ids, tolerance=NONE,
        writes_out=True)
def numpy_embedding(ids, table, *, out=None):
    """Rows of the table picked by ids (numpy.take); an id out of range raises."""
    n = table.shape[0]
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        bad = ids[(ids < 0) | (ids >= n)].flat[0]
        raise EvaluationError(f"numpy_embedding: id {bad} is out of range for a table of "
                              f"{n} rows")
    if out is not None:  # in range (checked): "clip" writes out without a buffered copy
        return np.take(table, ids, axis=0, out=out, mode="clip")
    return np.take(table, ids, axis=0)


def _attention(q, k, v, attn_mask=None, *, is_causal, scale, out=None):
    dtype = q.dtype
    q, k, v = up(q), up(k), up(v)
    sq, sk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    factor = 1.0 / math.sqrt(d) if scale is None else float(scale)
    groups = 1
    if q.ndim >= 3 and k.ndim >= 3 and q.shape[-3] != k.shape[-3]:
        hq, hkv = q.shape[-3], k.shape[-3]
        groups = hq // hkv  # (..., Hkv, G, Sq, D) against (..., Hkv, 1, Sk, D)
        q = q.reshape(q.shape[:-3] + (hkv, groups, sq, d))
        k, v = k[..., None, :, :], v[..., None, :, :]
    with np.errstate(all="ignore"):
        scores = np.matmul(q, np.swapaxes(k, -1, -2)) * np.asarray(factor, q.dtype)
        if groups > 1:
            scores = scores.reshape(scores.shape[:-4] + (hq, sq, sk))
        allowed = None
        if attn_mask is not None:
            if attn_mask.dtype == np.bool_:
                allowed = attn_mask
            else:
                scores = scores + up(attn_mask).astype(scores.dtype)
        if is_causal:
            causal = np.arange(sq)[:, None] >= np.arange(sk)[None, :]
            allowed = causal if allowed is None else np.logical_and(allowed, causal)
        if allowed is not None:
            scores = np.where(allowed, scores, np.asarray(-np.inf, scores.dtype))
        m = np.max(scores, axis=-1, keepdims=True)
        if attn_mask is not None:  # safe softmax: a row with nothing to attend to gives 0
            m = np.where(m == -np.inf, np.zeros((), m.dtype), m)
        e = np.exp(scores - m)
        total = np.sum(e, axis=-1, keepdims=True)
        probs = e / (np.maximum(total, 1) if attn_mask is not None else total)
        if groups > 1:
            probs = probs.reshape(probs.shape[:-3] + (hkv, groups, sq, sk))
        o = np.matmul(probs, v)
    if groups > 1:
        o = o.reshape(o.shape[:-4] + (hq, sq, o.shape[-1]))
    return into(o, dtype, out)


def _qkv_same_dtype(shapes, dtypes, attrs):
    if len(set(dtypes[:3])) > 1:
        return f"q, k, v must share one dtype, got {', '.join(d.name for d in dtypes[:3])}"
    if len(dtypes) > 3 and not (dtypes[3].is_bool or dtypes[3].is_float):
        return f"attn_mask must be bool or float, got {dtypes[3].name}"
    return True


_variants("scaled_dot_product_attention", _attention, {"is_causal": False, "scale": None},
          "softmax(q @ k^T * scale + mask) @ v in numpy, grouped-query heads broadcast.",
          where=_qkv_same_dtype, dtypes=FLOATS + ("bool",))


@numpy_kernel("rotary_embedding")
def numpy_rotary_embedding(x, cos, sin):
    """x * cos + rotate_half(x) * sin (Hugging Face's rotate_half convention)."""
    h = up(x)
    half = h.shape[-1] // 2
    rotated = np.concatenate([-h[..., half:], h[..., :half]], axis=-1)
    with np.errstate(all="ignore"):
        return out(h * up(cos) + rotated * up(sin), x.dtype)


@numpy_kernel("triu", dtypes=ALL, tolerance=NONE)
def numpy_triu(x, diagonal):
    """Upper triangle of the last two axes (numpy.triu)."""
    return np.triu(x, k=diagonal)


@numpy_kernel("tril", dtypes=ALL, tolerance=NONE)
def numpy_tril(x, diagonal):
    """Lower triangle of the last two axes (numpy.tril)."""
    return np.tril(x, k=diagonal)


def _pair(v):
    if isinstance(v, (tuple, list)):
        return (int(v[0]), int(v[-1]))
    return (int(v), int(v))


def _conv2d(x, weight, bias=None, *, stride, padding, dilation, groups, out=None):
    dtype = x.dtype
    h, w = up(x), up(weight)
    unbatched = h.ndim == 3
    if unbatched:
        h = h[None]
    cout, cin_g, kh, kw = w.shape
    (sh, sw), (dh, dw) = _pair(stride), _pair(dilation)
    if isinstance(padding, str):
        total = (0, 0) if padding == "valid" else (dh * (kh - 1), dw * (kw - 1))
        pads = tuple((t // 2, t - t // 2) for t in total)
    else:
        pads = tuple((p, p) for p in _pair(padding))
    hp = np.pad(h, ((0, 0), (0, 0)) + pads)
    win = sliding_window_view(hp, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(2, 3))
    win = win[:, :, ::sh, ::sw, ::dh, ::dw]  # (N, C, OH, OW, KH, KW)
    n, _, oh, ow = win.shape[:4]
    win = win.reshape(n, groups, cin_g, oh, ow, kh, kw)
    wg = w.reshape(groups, cout // groups, cin_g, kh, kw)
    y = np.einsum("ngchwij,gocij->ngohw", win, wg, optimize=True).reshape(n, cout, oh, ow)
    if bias is not None:
        y = y + up(bias)[:, None, None]
    return into(y[0] if unbatched else y, dtype, out)


_variants("conv2d", _conv2d, {"stride": 1, "padding": 0, "dilation": 1, "groups": 1},
          "2-d cross-correlation (torch's conv2d): sliding windows and one einsum.")
