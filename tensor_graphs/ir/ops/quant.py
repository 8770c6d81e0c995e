"""Quantization composites: symmetric int8 with per-channel scales, and bfloat16 rounding.

Their decompositions are their meaning, so the float64 reference of a quantized graph says
exactly what a quantized kernel must compute (the int8 values and the scales are part of the
graph, not a kernel's private detail):

- ``quant_scale(w, axis=a)``: max |w| over axis ``a`` (kept, size 1) / 127, and 1 where that
  max is 0 (an all-zero channel quantizes to zeros, not to 0 / 0).
- ``quantize(x, scale)``: round half to even of x / scale, clamped to [-127, 127], as int8
  (symmetric: -128 is never used, so negating a channel stays exact).
- ``dequantize(q, scale)``: q as the scale's dtype times the scale (broadcast).
- ``dynamic_quant(x)``: x's rows (the last axis) quantized and back, each with its own scale:
  ``dequantize(quantize(x, s), s)``, ``s = quant_scale(x, axis=-1)``. What "int8-dynamic"
  does to a product's activation at run time; one op, so a kernel can take the float rows and
  quantize them itself (``c_q8d_*``) while the graph still says exactly which int8 values
  and scales it must use.
- ``bf16_round(w)``: w rounded to bfloat16 and back (a float result: a kernel may store the
  weight as bfloat16 bits, exactly what the graph computes).

A per-output-channel weight of ``a @ w`` (w of shape (K, N)) has its scale over axis 0, shape
(1, N): the factor leaves the K-sum, which is what lets a kernel apply it once per output.
"""

from __future__ import annotations

from tensor_graphs.errors import DTypeError, ShapeError
from tensor_graphs.ir import builder as tg
from tensor_graphs.ir.composite import composite
from tensor_graphs.ir.ops.elementwise import abs as _abs
from tensor_graphs.ir.ops.elementwise import clamp, div
from tensor_graphs.ir.ops.names import BF16_ROUND, DEQUANTIZE, DYNAMIC_QUANT
from tensor_graphs.ir.ops.pointwise import floor, log2
from tensor_graphs.ir.ops.pointwise import round as _round
from tensor_graphs.ir.shapes import format_shape

# scheme_of: for explain()
__all__ = ["quant_scale", "quantize", "dequantize", "dynamic_quant", "bf16_round"]

QMAX = 127  # symmetric int8: [-127, 127]


def _wq():
    return (tg.input("q", (5, 3), "int8"), tg.input("scale", (1, 3)))


def _ws():
    return (tg.input("w", (5, 3)), tg.input("scale", (1, 3)))


@composite(example=lambda: (tg.input("w", (5, 3)),))
def quant_scale(w, *, axis=0):
    """The symmetric int8 scale of each channel: max |w| over ``axis`` / 127 (1 for an
    all-zero channel), ``axis`` kept with size 1 so it broadcasts against ``w``."""
    if not w.dtype.is_float:
        raise DTypeError(f"quant_scale: needs a float tensor, got {w.dtype.name} "
                         f"{format_shape(w.shape)} (quantize float weights)")
    m = tg.max(_abs(w), axis, keepdims=True)
    return tg.where(tg.less(0.0, m), div(m, float(QMAX)), 1.0)


@composite(example=_ws)
def quantize(x, scale):
    """int8(clamp(round_half_even(x / scale), -127, 127)); ``scale`` broadcasts against x."""
    if not x.dtype.is_float or scale.dtype != x.dtype:
        raise DTypeError(f"quantize: needs a float tensor and a scale of its dtype, got "
                         f"{x.dtype.name} {format_shape(x.shape)} and {scale.dtype.name} "
                         f"{format_shape(scale.shape)}")
    q = clamp(_round(div(x, scale)), min=-float(QMAX), max=float(QMAX))
    return tg.cast(q, "int8")


@composite(example=_wq)
def dequantize(q, scale):
    """q * scale in the scale's dtype; q int8, ``scale`` broadcasting against it."""
    if q.dtype.name != "int8" or not scale.dtype.is_float:
        raise DTypeError(f"dequantize: needs int8 values and a float scale, got "
                         f"{q.dtype.name} {format_shape(q.shape)} and {scale.dtype.name} "
                         f"{format_shape(scale.shape)}")
    if scale.ndim > q.ndim:
        raise ShapeError(f"dequantize: the scale {format_shape(scale.shape)} has more axes "
                         f"than the values {format_shape(q.shape)}")
    return tg.mul(tg.cast(q, scale.dtype), scale)


@composite(example=lambda: (tg.input("x", (4, 6)),))
def dynamic_quant(x):
    """x with each row (the last axis) quantized to symmetric int8 with its own scale and
    back: dequantize(quantize(x, s), s), s = quant_scale(x, axis=-1) (an all-zero row: scale
    1). int8-dynamic's activations, quantized at run time."""
    if not x.dtype.is_float or x.ndim < 1:
        raise DTypeError(f"dynamic_quant: needs a float tensor with a last axis, got "
                         f"{x.dtype.name} {format_shape(x.shape)}")
    s = quant_scale(x, axis=x.ndim - 1)
    return dequantize(quantize(x, s), s)


@composite(example=lambda: (tg.input("w", (5, 3)),))
def bf16_round(w):
    """w rounded to bfloat16's 8 significant bits (to nearest even) in w's own dtype: a weight
    stored as bfloat16. Written in exact arithmetic, not as casts, so the float64 reference
    rounds too (it lifts a cast to bfloat16 to float64, which would not round): with
    ulp = 2**(floor(log2|w|) - 7) (the exponent corrected by exact comparisons, whatever
    log2 rounds to near a power of two), round_half_even(w / ulp) * ulp; 0 stays 0. Finite
    normal weights; a value past bfloat16's range is not rounded to inf."""
    if not w.dtype.is_float:
        raise DTypeError(f"bf16_round: needs a float tensor, got {w.dtype.name} "
                         f"{format_shape(w.shape)}")
    ax = _abs(w)
    zero = tg.equal(ax, 0.0)
    safe = tg.where(zero, 1.0, ax)
    e = floor(log2(safe))
    e = tg.where(tg.less(safe, tg.pow(2.0, e)), tg.add(e, -1.0), e)
    e = tg.where(tg.less(safe, tg.pow(2.0, tg.add(e, 1.0))), e, tg.add(e, 1.0))
    ulp = tg.pow(2.0, tg.add(e, -7.0))
    return tg.where(zero, w, tg.mul(_round(div(w, ulp)), ulp))


def scheme_of(inside, inputs) -> str:
    """The quantization scheme a plan step computes with, for ``explain()`` ('' for none):
    a step whose kernel covers a ``dequantize`` reads int8 weights; one that reads a
    ``dequantize``'s result gets the weight dequantized (once per binding where static)."""
    if any(n.op.name == DYNAMIC_QUANT for n in inside):
        return "int8-dynamic"
    for n in inside:
        if n.op.name == DEQUANTIZE and n.inputs[0].dtype.name == "int8":
            return "int8-weight"
        if _bf16_weight(n):
            return "bf16-weight"
    for n in inputs:
        if n.op.name == DYNAMIC_QUANT:
            return "int8-dynamic, dequantized"
        if n.op.name == DEQUANTIZE and n.inputs[0].dtype.name == "int8":
            return "int8-weight, dequantized"
        if _bf16_weight(n):
            return "bf16-weight, widened"
    return ""


def _bf16_weight(n) -> bool:
    """A weight rounded to bfloat16 for a product (tg.quantize's "bf16-weight")."""
    return n.op.name == BF16_ROUND
