"""Neural-network composites: norms, linear, embedding, attention, rotary embedding.

Names, argument names and layouts follow ``torch.nn.functional`` (linear weights ``(out, in)``,
attention ``(batch, heads, seq, dim)``) with one deliberate difference: the norms work over the
last axis and take optional weight/bias instead of a ``normalized_shape``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tensor_graphs.errors import DTypeError, ShapeError
from tensor_graphs.ir import builder as tg
from tensor_graphs.ir import dtypes
from tensor_graphs.ir.composite import composite
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.elementwise import div, logical_and, logical_not, rsqrt, sub
from tensor_graphs.ir.ops.reductions import mean, softmax
from tensor_graphs.ir.shapes import broadcast_shapes, dims_equal, format_shape

__all__ = [
    "layer_norm",
    "rms_norm",
    "linear",
    "embedding",
    "scaled_dot_product_attention",
    "rotary_embedding",
]


def _result_dtype(*nodes):
    """The dtype ordinary arithmetic on these tensors gives (ints become float32)."""
    out = None
    for n in nodes:
        if n is None:
            continue
        d = n.dtype if n.dtype.is_float else dtypes.float32
        out = d if out is None else dtypes.promote_pair(out, d)
    return out


def _compute_input(x):
    """The norms compute in float32 at least: float16 x*x overflows at |x| > 256."""
    if not x.dtype.is_float or x.dtype.is_low_precision:
        return tg.cast(x, dtypes.float32)
    return x


def _check_param(op: str, what: str, p, x) -> None:
    if p is None:
        return
    if p.ndim != 1 or not dims_equal(p.shape[0], x.shape[-1]):
        raise ShapeError(f"{op}: {what} must have shape ({x.shape[-1]},) (the last axis of the "
                         f"input {format_shape(x.shape)}), got {format_shape(p.shape)}")


def _norm_example():
    return (tg.input("x", (2, 8)), tg.input("w", (8,)), tg.input("b", (8,)))


@composite(example=_norm_example)
def layer_norm(x, weight=None, bias=None, *, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis (biased variance).

    float16/bfloat16 inputs are normalised in float32 and rounded once at the end, as torch does.
    """
    if x.ndim == 0:
        raise ShapeError("layer_norm: the input must have at least one axis (the normalised one)")
    _check_param("layer_norm", "weight", weight, x)
    _check_param("layer_norm", "bias", bias, x)
    out_dtype = _result_dtype(x, weight, bias)
    h = _compute_input(x)
    centered = sub(h, mean(h, axis=-1, keepdims=True))
    variance = mean(tg.mul(centered, centered), axis=-1, keepdims=True)
    y = tg.mul(centered, rsqrt(tg.add(variance, float(eps))))
    if weight is not None:
        y = tg.mul(y, weight)
    if bias is not None:
        y = tg.add(y, bias)
    return tg.cast(y, out_dtype)


@composite(example=lambda: _norm_example()[:2])
def rms_norm(x, weight=None, *, eps=1e-6):
    """x / sqrt(mean(x**2) + eps) * weight over the last axis (torch's F.rms_norm).

    float16/bfloat16 inputs are normalised in float32 and rounded once at the end.
    """
    if x.ndim == 0:
        raise ShapeError("rms_norm: the input must have at least one axis (the normalised one)")
    _check_param("rms_norm", "weight", weight, x)
    out_dtype = _result_dtype(x, weight)
    h = _compute_input(x)
    y = tg.mul(h, rsqrt(tg.add(mean(tg.mul(h, h), axis=-1, keepdims=True), float(eps))))
    if weight is not None:
        y = tg.mul(y, weight)
    return tg.cast(y, out_dtype)


@composite(example=lambda: (tg.input("x", (2, 8)), tg.input("w", (4, 8)), tg.input("b", (4,))))
def linear(x, weight, bias=None):
    """x @ weight.T + bias, with weight (out_features, in_features) as in torch."""
    if x.ndim == 0 or weight.ndim not in (1, 2):
        raise ShapeError(f"linear: need an input of rank >= 1 and a weight of shape "
                         f"(out_features, in_features), got {format_shape(x.shape)} and "
                         f"{format_shape(weight.shape)}")
    if not dims_equal(weight.shape[-1], x.shape[-1]):
        raise ShapeError(f"linear: the input's last axis ({x.shape[-1]}) must equal the weight's "
                         f"in_features: input {format_shape(x.shape)}, weight "
                         f"{format_shape(weight.shape)} (weights are (out, in), as in torch)")
    y = tg.matmul(x, tg.transpose(weight, 0, 1) if weight.ndim == 2 else weight)
    if bias is not None:
        if bias.ndim > 1 or (bias.ndim == 1 and weight.ndim == 2
                             and not dims_equal(bias.shape[0], weight.shape[0])):
            raise ShapeError(f"linear: bias must have shape ({weight.shape[0]},) to match weight "
                             f"{format_shape(weight.shape)}, got {format_shape(bias.shape)}")
        y = tg.add(y, bias)
    return y


@composite(example=lambda: (tg.input("ids", (2, 3), "int64"), tg.input("table", (10, 4))))
def embedding(ids, table):
    """Rows of ``table`` (num_embeddings, dim) picked by integer ``ids``: a gather on axis 0.

    The output has shape ids.shape + (dim,); an id outside [0, num_embeddings) raises at
    evaluation (EvaluationError).
    """
    if not ids.dtype.is_int:
        raise DTypeError(f"embedding: ids must be integers, got {ids.dtype.name} "
                         f"(cast with .astype('int64'))")
    if table.ndim != 2:
        raise ShapeError(f"embedding: the table must be 2-D (num_embeddings, dim), got "
                         f"{format_shape(table.shape)}")
    return tg.gather(table, ids, axis=0)


def _safe_softmax(scores):
    """Softmax over the last axis whose fully masked (all -inf) rows give 0 instead of nan.

    Such a row's max is -inf; shifting it by 0 makes every exp 0. Any other row's sum is >= 1
    (its max contributes exp(0) = 1), so dividing by max(sum, 1) changes only the masked rows.
    """
    m = tg.max(scores, -1, True)
    m = tg.where(tg.equal(m, float("-inf")), tg.cast(0.0, scores.dtype), m)
    e = tg.exp(sub(scores, m))
    return div(e, tg.maximum(tg.sum(e, -1, True), 1.0))


def _attention_example():
    return (tg.input("q", (1, 4, 3, 8)), tg.input("k", (1, 2, 5, 8)), tg.input("v", (1, 2, 5, 8)),
            tg.input("mask", (3, 5), "bool"))


def attention_with(q, k, v, attn_mask=None, *, is_causal=False, scale=None,
                   weights: Callable[[Node], Node] | None = None) -> Node:
    """``scaled_dot_product_attention``'s decomposition, the one definition of its semantics,
    with ``weights`` applied to the attention weights (..., Hq, Sq, Sk) between the softmax
    and the product with v: training's attention dropout (``dropout_p``) falls there, inside
    the fused op, so the frontend writes the attention out through this."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim < 2:
            raise ShapeError(f"scaled_dot_product_attention: {name} must be (..., seq, dim), got "
                             f"{format_shape(t.shape)}")
        if not t.dtype.is_float:
            raise DTypeError(f"scaled_dot_product_attention: {name} must be a float tensor, got "
                             f"{t.dtype.name}")
    shapes = f"q {format_shape(q.shape)}, k {format_shape(k.shape)}, v {format_shape(v.shape)}"
    if not dims_equal(q.shape[-1], k.shape[-1]):
        raise ShapeError(f"scaled_dot_product_attention: q and k need the same head dim (last "
                         f"axis): {shapes}")
    if not dims_equal(k.shape[-2], v.shape[-2]):
        raise ShapeError(f"scaled_dot_product_attention: k and v need the same sequence length "
                         f"(axis -2): {shapes}")
    q, k, v = tg.promote(q, k, v)
    sq, sk, d = q.shape[-2], k.shape[-2], q.shape[-1]

    groups = 1
    if q.ndim >= 3 and k.ndim >= 3 and v.ndim >= 3:
        hq, hkv = q.shape[-3], k.shape[-3]
        if not dims_equal(k.shape[-3], v.shape[-3]):
            raise ShapeError(f"scaled_dot_product_attention: k and v need the same number of "
                             f"heads (axis -3): {shapes}")
        if not dims_equal(hq, hkv):
            if not (isinstance(hq, int) and isinstance(hkv, int)) or hkv == 0 or hq % hkv:
                raise ShapeError(f"scaled_dot_product_attention: q has {hq} heads and k/v "
                                 f"{hkv}; grouped-query attention needs the query heads to be a "
                                 f"multiple of the kv heads: {shapes}")
            groups = hq // hkv
    if groups > 1:  # (..., Hq, Sq, D) -> (..., Hkv, G, Sq, D); k, v -> (..., Hkv, 1, Sk, D)
        q = tg.reshape(q, q.shape[:-3] + (hkv, groups, sq, d))
        k, v = tg.unsqueeze(k, -3), tg.unsqueeze(v, -3)

    if scale is None:
        factor = 1.0 / math.sqrt(d) if isinstance(d, int) else rsqrt(tg.size(d, q.dtype))
    else:
        factor = float(scale)
    scores = tg.mul(tg.matmul(q, tg.transpose(k, -1, -2)), factor)
    if groups > 1:
        scores = tg.reshape(scores, scores.shape[:-4] + (hq, sq, sk))

    allowed = None
    if attn_mask is not None:
        try:
            full = broadcast_shapes(scores.shape, attn_mask.shape)
        except ShapeError:
            full = None
        if full is None or len(full) != scores.ndim or \
                not all(dims_equal(a, b) for a, b in zip(full, scores.shape)):
            raise ShapeError(f"scaled_dot_product_attention: attn_mask "
                             f"{format_shape(attn_mask.shape)} must broadcast to the scores' "
                             f"shape {format_shape(scores.shape)} (..., heads, Sq, Sk); {shapes}")
        if attn_mask.dtype.is_bool:
            allowed = attn_mask
        elif attn_mask.dtype.is_float:
            scores = tg.add(scores, tg.cast(attn_mask, scores.dtype))
        else:
            raise DTypeError(f"scaled_dot_product_attention: attn_mask must be bool (True = "
                             f"attend) or float (added to the scores), got "
                             f"{attn_mask.dtype.name}")
    if is_causal:
        row = tg.reshape(tg.iota(sq), (sq, 1))
        col = tg.reshape(tg.iota(sk), (1, sk))
        causal = logical_not(tg.less(row, col))  # key j <= query i
        allowed = causal if allowed is None else logical_and(allowed, causal)
    if allowed is not None:
        scores = tg.where(allowed, scores, float("-inf"))

    if attn_mask is None:
        probs = softmax(scores, axis=-1)  # a causal row always keeps key 0
    else:
        probs = _safe_softmax(scores)
    if weights is not None:
        probs = weights(probs)
    if groups > 1:
        probs = tg.reshape(probs, probs.shape[:-3] + (hkv, groups, sq, sk))
    out = tg.matmul(probs, v)
    if groups > 1:
        out = tg.reshape(out, out.shape[:-4] + (hq, sq, out.shape[-1]))
    return out


@composite(example=_attention_example)
def scaled_dot_product_attention(q, k, v, attn_mask=None, *, is_causal=False, scale=None):
    """softmax(q @ k^T * scale + mask) @ v over (batch..., heads, seq, dim) tensors.

    - ``scale`` defaults to 1/sqrt(q.shape[-1]).
    - Grouped-query attention: when k/v have fewer heads than q (Hq a multiple of Hkv), query
      head h uses kv head h // (Hq // Hkv), as torch's ``enable_gqa=True``. q is viewed as
      (..., Hkv, G, Sq, D) so k/v are broadcast, never copied.
    - ``attn_mask`` broadcasts to (..., Hq, Sq, Sk): bool True = attend, float = added to the
      scores. A row with nothing to attend to gives 0 (torch's safe softmax), not nan.
    - ``is_causal``: query i attends keys j <= i (torch's top-left tril, also when Sq != Sk);
      unlike torch it may be combined with ``attn_mask`` (both must allow a position).
    """
    return attention_with(q, k, v, attn_mask, is_causal=is_causal, scale=scale)


def _rope_example():
    return (tg.input("x", (1, 2, 3, 8)), tg.input("cos", (3, 8)), tg.input("sin", (3, 8)))


@composite(example=_rope_example)
def rotary_embedding(x, cos, sin):
    """Rotary position embedding in Hugging Face's ``rotate_half`` convention.

    ``out = x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = concat(-x2, x1)`` where
    x1, x2 are the first and second halves of the last axis (head dim D, even). So dims i and
    i + D/2 form a rotation pair (not the interleaved pairs 2i, 2i+1 of the original RoFormer
    code). ``cos`` and ``sin`` cover the full head dim, i.e. the frequencies repeated twice as
    ``cat(freqs, freqs)`` (HF's layout), and broadcast to x, e.g. (seq, D) or (batch, 1, seq, D)
    for x of shape (batch, heads, seq, D).
    """
    d = x.shape[-1] if x.ndim else None
    if d is None or not isinstance(d, int) or d % 2:
        raise ShapeError(f"rotary_embedding: the last axis of x (the head dim) must be a "
                         f"concrete even size, got x {format_shape(x.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.ndim == 0 or not dims_equal(t.shape[-1], d):
            raise ShapeError(f"rotary_embedding: {name} {format_shape(t.shape)} must cover the "
                             f"full head dim {d} of x {format_shape(x.shape)} (HF layout: "
                             f"cat(freqs, freqs) on the last axis)")
    half = d // 2
    x1 = tg.slice_axis(x, -1, 0, half)
    x2 = tg.slice_axis(x, -1, half, d)
    rotated = tg.concat([tg.neg(x2), x1], axis=-1)
    return tg.add(tg.mul(x, cos), tg.mul(rotated, sin))
