"""ONNX's Attention (opset 23 on): 3-D or 4-D inputs, a past cache appended, boolean or
additive masks (shorter masks padded), causal and sliding-window frontiers offset by the
cache, per-batch valid lengths, grouped KV heads, softcap and the qk output modes, as ONNX's
reference computes them (a row with every key masked gives zeros, not NaN)."""

from __future__ import annotations

import math

from tensor_graphs.frontend.onnx.common import Ctx, dtype_of
from tensor_graphs.ir import api as tg

_NEG_INF = float("-inf")


def _heads(x, n: int):
    """(B, S, n * d) -> (B, n, S, d)."""
    b, s, hidden = x.shape
    return tg.permute(tg.reshape(x, (b, s, n, hidden // n)), 0, 2, 1, 3)


def _c(x, v):
    return tg.as_node(float(v), x.dtype)


def _positions(sq, skv):
    """(i, j) index grids of shape (sq, 1) and (1, skv)."""
    return tg.reshape(tg.iota(sq), (-1, 1)), tg.reshape(tg.iota(skv), (1, -1))


def _frontier(q, allowed):
    return tg.where(allowed, _c(q, 0.0), _c(q, _NEG_INF))


def _offset_grid(i, offset):
    """i + offset: a scalar offset, or one per batch as (B, 1, 1, 1)."""
    if isinstance(offset, int):
        return tg.add(i, offset) if offset else i
    return tg.add(tg.reshape(i, (1, 1, *i.shape)), tg.reshape(offset, (-1, 1, 1, 1)))


def _attention(c: Ctx):
    q, k, v = c.t(0), c.t(1), c.t(2)
    mask = c.t(3) if c.has(3) else None
    past_k = c.t(4) if c.has(4) else None
    past_v = c.t(5) if c.has(5) else None
    nonpad = c.t(6) if c.has(6) else None
    three = q.ndim == 3
    if three:
        q = _heads(q, c.a("q_num_heads"))
        k = _heads(k, c.a("kv_num_heads"))
        v = _heads(v, c.a("kv_num_heads"))
    scale = c.a("scale")
    scale = 1 / math.sqrt(q.shape[3]) if scale is None else scale
    root = _c(q, math.sqrt(scale))
    if past_k is not None:
        k, v = tg.concat([past_k, k], 2), tg.concat([past_v, v], 2)
    present_k, present_v = k, v
    sq, skv = q.shape[2], k.shape[2]
    past = past_k.shape[2] if past_k is not None else 0

    bias = None
    if mask is not None and mask.shape[-1] != skv:  # a shorter mask: the rest masked
        fill = False if mask.dtype.is_bool else _NEG_INF
        mask = tg.pad(mask, [0, skv - mask.shape[-1]], fill)
    if mask is not None:
        bias = _frontier(q, mask) if mask.dtype.is_bool else mask
    offset = past
    if nonpad is not None and past_k is None:
        offset = tg.sub(tg.cast(nonpad, "int64"), sq)
    i, j = _positions(sq, skv)
    if c.a("is_causal", 0):
        causal = _frontier(q, tg.less_equal(j, _offset_grid(i, offset)))
        bias = causal if bias is None else tg.add(bias, causal)
    left, right = c.a("left_window_size", -1), c.a("right_window_size", -1)
    if left >= 0 or right >= 0:
        woff = past if nonpad is None or past_k is not None else offset
        diff = tg.sub(_offset_grid(i, woff), j)
        allowed = tg.equal(diff, diff)
        if left >= 0:
            allowed = tg.logical_and(allowed, tg.less_equal(diff, left))
        if right >= 0:
            allowed = tg.logical_and(allowed, tg.less_equal(tg.neg(diff), right))
        window = _frontier(q, allowed)
        bias = window if bias is None else tg.add(bias, window)
    if nonpad is not None:
        valid = tg.less(tg.reshape(tg.iota(skv), (1, -1)),
                        tg.reshape(tg.cast(nonpad, "int64"), (-1, 1)))
        padding = tg.reshape(_frontier(q, valid), (-1, 1, 1, skv))
        bias = padding if bias is None else tg.add(bias, padding)

    qh, kvh = q.shape[1], k.shape[1]
    if qh != kvh:  # grouped heads: each KV head serves qh / kvh query heads in a row
        reps = qh // kvh

        def repeat(x):
            b, h, s, d = x.shape
            return tg.reshape(tg.broadcast_to(tg.unsqueeze(x, 2), b, h, reps, s, d),
                              (b, h * reps, s, d))
        k, v = repeat(k), repeat(v)

    qk = tg.matmul(tg.mul(q, root), tg.transpose(tg.mul(k, root), -1, -2))
    softcap = c.a("softcap", 0.0)
    if softcap and softcap > 0:
        qk = tg.mul(tg.tanh(tg.div(qk, _c(qk, softcap))), _c(qk, softcap))
    scores = qk if bias is None else tg.add(qk, bias)
    precision = c.a("softmax_precision")
    if precision is not None:
        scores = tg.cast(scores, dtype_of(precision, f"Attention node '{c.name}'"))
    if bias is None:
        probs = tg.softmax(scores, axis=-1)
    else:
        probs = _masked_softmax(scores)
        dead = tg.equal(tg.max(bias, -1, keepdims=True), _c(bias, _NEG_INF))
        probs = tg.where(dead, _c(probs, 0.0), probs)
    probs = tg.cast(probs, q.dtype)
    mode = c.a("qk_matmul_output_mode", 0)
    qk_out = {2: scores, 3: probs}.get(mode, qk)
    out = tg.matmul(probs, v)
    if three:
        b, h, s, d = out.shape
        out = tg.reshape(tg.permute(out, 0, 2, 1, 3), (b, s, h * d))
    return out, present_k, present_v, tg.cast(qk_out, q.dtype)


def _masked_softmax(x):
    """Softmax that leaves a row of -inf as zeros (ONNX's reference)."""
    top = tg.max(x, -1, keepdims=True)
    top = tg.where(tg.equal(top, _c(x, _NEG_INF)), _c(x, 0.0), top)
    e = tg.exp(tg.sub(x, top))
    total = tg.sum(e, -1, keepdims=True)
    total = tg.where(tg.equal(total, _c(total, 0.0)), _c(total, 1.0), total)
    return tg.div(e, total)


def _rotary(c: Ctx):
    """RotaryEmbedding (opset 23): the first rotary_embedding_dim features of each head
    rotated by the cached angles of each position, halves or interleaved pairs."""
    x, cos, sin = c.t(0), c.t(1), c.t(2)
    four = x.ndim == 4
    h = tg.permute(x, 0, 2, 1, 3) if four else x  # (B, S, H, D) or (B, S, hidden)
    if not four:
        b, s, hidden = h.shape
        heads = c.a("num_heads")
        h = tg.reshape(h, (b, s, heads, hidden // heads))
    dim = c.a("rotary_embedding_dim", 0) or h.shape[3]
    rot, keep = tg.slice_axis(h, 3, 0, dim), tg.slice_axis(h, 3, dim, None)
    if c.has(3):  # the caches' rows of each position
        ids = c.t(3)
        cos, sin = tg.gather(cos, ids, 0), tg.gather(sin, ids, 0)
    cos, sin = tg.unsqueeze(cos, 2), tg.unsqueeze(sin, 2)
    interleaved = bool(c.a("interleaved", 0))
    if interleaved:
        x1, x2 = tg.slice_axis(rot, 3, 0, None, 2), tg.slice_axis(rot, 3, 1, None, 2)
    else:
        x1, x2 = tg.slice_axis(rot, 3, 0, dim // 2), tg.slice_axis(rot, 3, dim // 2, None)
    real = tg.sub(tg.mul(cos, x1), tg.mul(sin, x2))
    imag = tg.add(tg.mul(sin, x1), tg.mul(cos, x2))
    if interleaved:
        rot = tg.reshape(tg.concat([tg.unsqueeze(real, -1), tg.unsqueeze(imag, -1)], -1),
                         rot.shape)
    else:
        rot = tg.concat([real, imag], -1)
    out = tg.concat([rot, keep], -1) if keep.shape[3] != 0 else rot
    return tg.permute(out, 0, 2, 1, 3) if four else tg.reshape(out, x.shape)


def table() -> dict:
    return {"Attention": _attention, "RotaryEmbedding": _rotary}


__all__ = ["table"]
