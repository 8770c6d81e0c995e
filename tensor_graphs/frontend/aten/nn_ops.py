"""ATen neural-network layers: composites torch hands over whole stay whole (the planner
picks fused kernels for them)."""

from __future__ import annotations

import numpy as np

import tensor_graphs as tg
from tensor_graphs.errors import ArgumentError, ShapeError


def _norm_shape(x, normalized_shape, params, fn):
    """torch's norms over the trailing ``normalized_shape`` dims; ours over the last axis:
    more than one trailing dim is flattened into one and back."""
    k = len(normalized_shape)
    if k == 0 or tuple(x.shape[x.ndim - k:]) != tuple(normalized_shape):
        raise ShapeError(f"normalized_shape {tuple(normalized_shape)} is not the trailing "
                         f"dims of the input {x.shape}")
    if k == 1:
        return fn(x, *params)
    flat = tg.reshape(x, tuple(x.shape[:x.ndim - k]) + (-1,))
    y = fn(flat, *(None if p is None else tg.reshape(p, (-1,)) for p in params))
    return tg.reshape(y, x.shape)


def _layer_norm(a, kw):
    return _norm_shape(kw["input"], kw["normalized_shape"], (kw["weight"], kw["bias"]),
                       lambda x, w, b: tg.layer_norm(x, w, b, eps=kw["eps"]))


def _rms_norm(a, kw):
    x, eps = kw["input"], kw["eps"]
    if eps is None:  # torch's default: the dtype's machine epsilon
        eps = float(np.finfo(x.dtype.np_dtype).eps)
    return _norm_shape(x, kw["normalized_shape"], (kw["weight"],),
                       lambda x, w: tg.rms_norm(x, w, eps=eps))


def _sdpa(a, kw):
    if kw["dropout_p"]:
        raise ArgumentError("scaled_dot_product_attention: dropout_p must be 0 (inference)")
    return tg.scaled_dot_product_attention(kw["query"], kw["key"], kw["value"], kw["attn_mask"],
                                           is_causal=kw["is_causal"], scale=kw["scale"])


def _dropout(a, kw):
    if kw["train"] and kw["p"]:
        raise ArgumentError("dropout in training mode: call module.eval() before from_torch")
    return kw["input"]


def _conv2d(a, kw):
    if isinstance(kw["padding"], str):
        raise ArgumentError(f"conv2d: padding={kw['padding']!r} is not supported yet")
    return tg.conv2d(kw["input"], kw["weight"], kw["bias"], stride=tuple(kw["stride"]),
                     padding=tuple(kw["padding"]), dilation=tuple(kw["dilation"]),
                     groups=kw["groups"])


def _upsample(mode):
    def fn(a, kw):
        size, scales = kw.get("output_size"), kw.get("scale_factors")
        return tg.interpolate(kw["input"], size=None if size is None else tuple(size),
                              scale_factor=None if size is not None or scales is None
                              else tuple(scales), mode=mode,
                              align_corners=kw.get("align_corners"))
    return fn


def table(aten) -> dict:
    return {
        # neural-network layers
        aten.layer_norm: _layer_norm,
        aten.rms_norm: _rms_norm,
        aten.embedding: lambda a, kw: tg.embedding(kw["indices"], kw["weight"]),
        aten.scaled_dot_product_attention: _sdpa,
        aten.dropout: _dropout,
        aten.conv2d.default: _conv2d,
        aten.upsample_nearest2d.vec: _upsample("nearest"),
        aten._upsample_nearest_exact2d.vec: _upsample("nearest-exact"),
        aten.upsample_bilinear2d.vec: _upsample("bilinear"),
        aten.group_norm: lambda a, kw: tg.group_norm(kw["input"], kw["weight"], kw["bias"],
                                                     num_groups=kw["num_groups"],
                                                     eps=kw["eps"]),
    }
