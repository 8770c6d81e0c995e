"""Quantization composites: symmetric int8 with per-channel scales, and bfloat16 rounding.

Their decompositions are their meaning, so the float64 reference of a quantized graph says
exactly what a quantized kernel must compute (the int8 values and the scales are part of the
graph, not a kernel's private detail):

- ``quant_scale(w, axis=a)``: max |w| over axis ``a`` (kept, size 1) / 127, and 1 where that
  max is 0 (an all-zero channel quantizes to zeros, not to 0 / 0). A channel holding NaN
  gets a NaN scale and one holding +-inf an infinite one, so its dequantized values are NaN
  (x / inf is 0 but for the inf, 0 * inf NaN) wherever the float weight's product is not
  finite: a corrupted weight stays visible through quantization rather than taking the
  all-zero channel's scale of 1 and turning into zeros or finite noise.
- ``quantize(x, scale)``: round half to even of x / scale, clamped to [-127, 127], as int8
  (symmetric: -128 is never used, so negating a channel stays exact).
- ``dequantize(q, scale)``: q as the scale's dtype times the scale (broadcast); a (K, N)
  q with an (ng, N) scale, 1 < ng < K dividing K: a scale per group of K / ng rows (the
  grouped int8 weight of "int8-dynamic").
- ``dynamic_quant(x, group=G)``: x's rows (the last axis) quantized and back, each with its
  own scale: ``dequantize(quantize(x, s), s)``, ``s = quant_scale(x, axis=-1)``; with a
  group G (dividing the row's length) a scale per G consecutive values of a row: the same
  over the (..., K / G, G) view. What "int8-dynamic" does to a product's activation at run
  time; one op, so a kernel can take the float rows and quantize them itself (``c_q8d_*``)
  while the graph still says exactly which int8 values and scales it must use.
- ``bf16_round(w)``: w rounded to bfloat16 and back (a float result: a kernel may store the
  weight as bfloat16 bits, exactly what the graph computes); ``fp16_round(w)`` the same for
  IEEE float16 (subnormals, and inf past its range, as a cast gives).
- ``int4_scale(w, group_size=G)``, ``quantize_int4(w, s)``, ``dequantize_int4(q, s)``:
  group-wise symmetric int4 of a (K, N) weight: a scale per (group of rows along K, output
  channel), shape (ng, N), ng = ceil(K / G); the values in [-7, 7], held in the graph as
  uint8 v + 8 (the nibble a kernel packs two a byte; a checkpoint's -8 is 0); a group holding
  NaN or +-inf gets a NaN or infinite scale, as ``quant_scale``'s channel. The groups
  are ceil(K / ng) rows each, the last shorter, so the scale's shape alone says where a
  group starts (G when G divides K, the case of every model's hidden sizes): a kernel
  matching ``dequantize_int4`` needs no attribute.

A per-output-channel weight of ``a @ w`` (w of shape (K, N)) has its scale over axis 0, shape
(1, N): the factor leaves the K-sum, which is what lets a kernel apply it once per output.
"""

from __future__ import annotations

from tensor_graphs.errors import DTypeError, ShapeError
from tensor_graphs.ir import builder as tg
from tensor_graphs.ir.composite import composite
from tensor_graphs.ir.ops.elementwise import abs as _abs
from tensor_graphs.ir.ops.elementwise import clamp, div
from tensor_graphs.ir.ops.names import (
    BF16_ROUND,
    DEQUANTIZE,
    DEQUANTIZE_INT4,
    DYNAMIC_QUANT,
    FP16_ROUND,
)
from tensor_graphs.ir.ops.pointwise import floor, log2
from tensor_graphs.ir.ops.pointwise import round as _round
from tensor_graphs.ir.shapes import dims_equal, format_shape

# scheme_of: for explain()
__all__ = ["quant_scale", "quantize", "dequantize", "dynamic_quant", "bf16_round", "fp16_round",
           "int4_scale", "quantize_int4", "dequantize_int4"]

QMAX = 127  # symmetric int8: [-127, 127]
QMAX4 = 7  # symmetric int4: [-7, 7] (-8 unused, as -128 for int8)
INT4_OFFSET = 8  # int4 values are held as uint8 v + 8: the nibble a kernel packs
F16_MAX_ROUND = 65520.0  # |w| from here rounds to inf in float16 (65504 + half its ulp)
BF16_MAX_ROUND = (2.0 - 2.0 ** -8) * 2.0 ** 127  # the same for bfloat16 (its max + half an ulp)


def _wq():
    return (tg.input("q", (5, 3), "int8"), tg.input("scale", (1, 3)))


def _ws():
    return (tg.input("w", (5, 3)), tg.input("scale", (1, 3)))


def _scale(m, qmax: int):
    """m / qmax, 1 where m is 0. Why ``m == 0`` and not ``0 < m``: NaN fails every comparison,
    so the test for the all-zero channel must be the one a NaN max fails, or the NaN would
    take the scale of 1 and quantize to finite values."""
    return tg.where(tg.equal(m, 0.0), 1.0, div(m, float(qmax)))


@composite(example=lambda: (tg.input("w", (5, 3)),))
def quant_scale(w, *, axis=0):
    """The symmetric int8 scale of each channel: max |w| over ``axis`` / 127 (1 for an
    all-zero channel only: a NaN max stays NaN and an infinite one inf, so a non-finite
    weight makes its channel's product non-finite, as in the float model), ``axis`` kept with
    size 1 so it broadcasts against ``w``."""
    if not w.dtype.is_float:
        raise DTypeError(f"quant_scale: needs a float tensor, got {w.dtype.name} "
                         f"{format_shape(w.shape)} (quantize float weights)")
    m = tg.max(_abs(w), axis, keepdims=True)
    return _scale(m, QMAX)


@composite(example=_ws)
def quantize(x, scale):
    """int8(clamp(round_half_even(x / scale), -127, 127)); ``scale`` broadcasts against x."""
    if not x.dtype.is_float or scale.dtype != x.dtype:
        raise DTypeError(f"quantize: needs a float tensor and a scale of its dtype, got "
                         f"{x.dtype.name} {format_shape(x.shape)} and {scale.dtype.name} "
                         f"{format_shape(scale.shape)}")
    q = clamp(_round(div(x, scale)), min=-float(QMAX), max=float(QMAX))
    return tg.cast(q, "int8")


def _grouped_scale(q, scale) -> bool:
    """A (K, N) value with an (ng, N) scale, 1 < ng < K: a scale per group of rows (which
    plain broadcasting would reject)."""
    return (q.ndim == 2 and scale.ndim == 2 and dims_equal(q.shape[1], scale.shape[1])
            and isinstance(scale.shape[0], int) and isinstance(q.shape[0], int)
            and 1 < int(scale.shape[0]) < int(q.shape[0]))


@composite(example=_wq)
def dequantize(q, scale):
    """q * scale in the scale's dtype; q int8, ``scale`` broadcasting against it, or for a
    (K, N) q an (ng, N) scale, ng dividing K: a scale per K / ng rows (int8-dynamic's
    grouped weights)."""
    if q.dtype.name != "int8" or not scale.dtype.is_float:
        raise DTypeError(f"dequantize: needs int8 values and a float scale, got "
                         f"{q.dtype.name} {format_shape(q.shape)} and {scale.dtype.name} "
                         f"{format_shape(scale.shape)}")
    if scale.ndim > q.ndim:
        raise ShapeError(f"dequantize: the scale {format_shape(scale.shape)} has more axes "
                         f"than the values {format_shape(q.shape)}")
    if _grouped_scale(q, scale):
        k, ng = int(q.shape[0]), int(scale.shape[0])
        if k % ng:
            raise ShapeError(f"dequantize: an ({ng}, N) scale of a (K, N) = "
                             f"{format_shape(q.shape)} weight is a scale per K / {ng} rows: "
                             f"{ng} must divide K = {k}")
        return tg.mul(tg.cast(q, scale.dtype), _expand_groups(scale, k))
    return tg.mul(tg.cast(q, scale.dtype), scale)


@composite(example=lambda: (tg.input("x", (4, 6)),))
def dynamic_quant(x, *, group=0):
    """x with each row (the last axis) quantized to symmetric int8 with its own scale and
    back: dequantize(quantize(x, s), s), s = quant_scale(x, axis=-1) (an all-zero row: scale
    1; a row holding NaN or +-inf: NaN, as its float product). int8-dynamic's activations,
    quantized at run time. ``group`` G > 0: a scale per G consecutive values of a row instead
    (G dividing the row): one outlier channel then coarsens the steps of its G - 1
    neighbours only, not of the whole row (0: the row)."""
    if not x.dtype.is_float or x.ndim < 1:
        raise DTypeError(f"dynamic_quant: needs a float tensor with a last axis, got "
                         f"{x.dtype.name} {format_shape(x.shape)}")
    k = x.shape[-1]
    if isinstance(group, bool) or not isinstance(group, int) or group < 0 \
            or (group and not (isinstance(k, int) and k % group == 0)):
        raise ShapeError(f"dynamic_quant: group must be 0 (a scale per row) or a size "
                         f"dividing the row's {k} values, got {group!r}")
    if group and group != k:
        v = tg.reshape(x, *x.shape[:-1], k // group, group)
        s = quant_scale(v, axis=v.ndim - 1)
        return tg.reshape(dequantize(quantize(v, s), s), *x.shape)
    s = quant_scale(x, axis=x.ndim - 1)
    return dequantize(quantize(x, s), s)


def _overflow(w, rounded, limit: float):
    """``rounded`` where |w| < limit, else w * inf: +-inf past the format's range and for
    +-inf, NaN for NaN (which fails the comparison)."""
    return tg.where(tg.less(_abs(w), limit), rounded, tg.mul(w, float("inf")))


def _round_bits(w, bits: int, emin: float | None = None):
    """w rounded to ``bits`` fraction bits (to nearest even): ulp = 2**(e - bits), e the
    exponent of |w| (floor(log2|w|) corrected by exact comparisons, whatever log2 rounds to
    near a power of two; floored at ``emin``: subnormals), round_half_even(w / ulp) * ulp
    (exact: ulp is a power of two); 0 stays 0. Where w is tiny (a float32 subnormal: ulp down
    to 2**-133) both are scaled by 2**64 before dividing, exactly, since a division is a
    product with the reciprocal and 1 / 2**-133 overflows float32 (a bf16-weight's
    subnormal weights turned every output into NaN)."""
    ax = _abs(w)
    zero = tg.equal(ax, 0.0)
    safe = tg.where(zero, 1.0, ax)
    e = floor(log2(safe))
    e = tg.where(tg.less(safe, tg.pow(2.0, e)), tg.add(e, -1.0), e)
    e = tg.where(tg.less(safe, tg.pow(2.0, tg.add(e, 1.0))), e, tg.add(e, 1.0))
    if emin is not None:
        e = tg.maximum(e, emin)
    ulp = tg.pow(2.0, tg.add(e, -float(bits)))
    lift = tg.where(tg.less(e, -64.0), 2.0 ** 64, 1.0)
    return tg.where(zero, w, tg.mul(_round(div(tg.mul(w, lift), tg.mul(ulp, lift))), ulp))


@composite(example=lambda: (tg.input("w", (5, 3)),))
def bf16_round(w):
    """w rounded to bfloat16's 8 significant bits (to nearest even) in w's own dtype: a weight
    stored as bfloat16. Written in exact arithmetic, not as casts, so the float64 reference
    rounds too (it lifts a cast to bfloat16 to float64, which would not round): with
    ulp = 2**(floor(log2|w|) - 7) (the exponent corrected by exact comparisons, whatever
    log2 rounds to near a power of two), round_half_even(w / ulp) * ulp; 0 stays 0. Past
    bfloat16's range (|w| >= its max + half an ulp) inf, and +-inf and NaN stay themselves, as
    the cast a kernel stores gives (``_round_bits`` alone turns inf into inf / inf = NaN)."""
    if not w.dtype.is_float:
        raise DTypeError(f"bf16_round: needs a float tensor, got {w.dtype.name} "
                         f"{format_shape(w.shape)}")
    return _overflow(w, _round_bits(w, 7, emin=-126.0), BF16_MAX_ROUND)


@composite(example=lambda: (tg.input("w", (5, 3)),))
def fp16_round(w):
    """w rounded to IEEE float16 (10 fraction bits, to nearest even) in w's own dtype: a
    weight stored as float16. Exact arithmetic as ``bf16_round`` (a cast would not round in
    the float64 reference), with float16's subnormals (the exponent floored at -14: steps of
    2**-24 below 2**-14) and its overflow (|w| >= 65520, half a step past 65504, gives inf),
    so it equals numpy's ``astype(float16)`` on every float32 value."""
    if not w.dtype.is_float:
        raise DTypeError(f"fp16_round: needs a float tensor, got {w.dtype.name} "
                         f"{format_shape(w.shape)}")
    return _overflow(w, _round_bits(w, 10, emin=-14.0), F16_MAX_ROUND)


def _groups(k: int, ng: int) -> int:
    """Rows a group of ``ng`` holds along K: ceil(K / ng), the last group shorter."""
    return -(-k // ng)


def _group_count(k: int, group_size: int) -> int:
    """ng for a requested group size: ceil(K / G). Its groups of ceil(K / ng) <= G rows leave
    none empty ((ng - 1) < K / G rows of groups of at most G)."""
    return -(-k // group_size)


def _expand_groups(scale, k: int):
    """The (ng, N) scale repeated over its groups' rows: (K, N)."""
    ng, n = scale.shape
    g = _groups(k, int(ng))
    rows = tg.broadcast_to(tg.reshape(scale, int(ng), 1, n), (int(ng), g, n))
    return tg.reshape(rows, int(ng) * g, n)[:k]


def _int4_shapes(op: str, x, scale):
    if x.ndim != 2 or scale.ndim != 2 or scale.shape[1] != x.shape[1]:
        raise ShapeError(f"{op}: needs a (K, N) weight and an (ng, N) scale, got "
                         f"{format_shape(x.shape)} and {format_shape(scale.shape)}")
    k, ng = int(x.shape[0]), int(scale.shape[0])
    if not 1 <= ng <= k or (ng - 1) * _groups(k, ng) >= k:
        raise ShapeError(f"{op}: {ng} groups do not divide K = {k} rows (groups of "
                         f"ceil(K / ng) rows, none empty); int4_scale gives the scale")


def _w2():
    return (tg.input("w", (8, 3)), tg.input("scale", (2, 3)))


@composite(example=lambda: (tg.input("w", (8, 3)),))
def int4_scale(w, *, group_size=32):
    """The symmetric int4 scale of each (group of rows, column) of a (K, N) weight: max |w|
    over the group / 7 (1 for an all-zero group; NaN or inf for a group holding NaN or +-inf,
    as ``quant_scale``), shape (ng, N), ng = ceil(K / group_size)
    groups of ceil(K / ng) rows (the last shorter)."""
    if not w.dtype.is_float or w.ndim != 2:
        raise DTypeError(f"int4_scale: needs a float (K, N) weight, got {w.dtype.name} "
                         f"{format_shape(w.shape)}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ShapeError(f"int4_scale: group_size must be a positive int, got {group_size!r}")
    k, n = int(w.shape[0]), int(w.shape[1])
    ng = _group_count(k, group_size)
    g = _groups(k, ng)
    padded = tg.pad(_abs(w), (0, 0, 0, ng * g - k))
    m = tg.max(tg.reshape(padded, ng, g, n), 1)
    return _scale(m, QMAX4)


@composite(example=_w2)
def quantize_int4(w, scale):
    """uint8(clamp(round_half_even(w / s), -7, 7) + 8), s the (ng, N) group scale repeated
    over its group's rows: the int4 values offset by 8 (the nibble a kernel stores, 1..15)."""
    if not w.dtype.is_float or scale.dtype != w.dtype:
        raise DTypeError(f"quantize_int4: needs a float weight and a scale of its dtype, got "
                         f"{w.dtype.name} {format_shape(w.shape)} and {scale.dtype.name} "
                         f"{format_shape(scale.shape)}")
    _int4_shapes("quantize_int4", w, scale)
    q = clamp(_round(div(w, _expand_groups(scale, int(w.shape[0])))), min=-float(QMAX4),
              max=float(QMAX4))
    return tg.cast(tg.add(q, float(INT4_OFFSET)), "uint8")


@composite(example=lambda: (tg.input("q", (8, 3), "uint8"), tg.input("scale", (2, 3))))
def dequantize_int4(q, scale):
    """(q - 8) * s in the scale's dtype, s the (ng, N) group scale repeated over its group's
    rows; q uint8 (K, N), int4 values offset by 8 (0..15: a loaded checkpoint may use -8)."""
    if q.dtype.name != "uint8" or not scale.dtype.is_float:
        raise DTypeError(f"dequantize_int4: needs uint8 values (int4 + 8) and a float scale, "
                         f"got {q.dtype.name} {format_shape(q.shape)} and {scale.dtype.name} "
                         f"{format_shape(scale.shape)}")
    _int4_shapes("dequantize_int4", q, scale)
    v = tg.add(tg.cast(q, scale.dtype), -float(INT4_OFFSET))
    return tg.mul(v, _expand_groups(scale, int(q.shape[0])))


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
        if n.op.name == FP16_ROUND:
            return "fp16-weight"
        if n.op.name == DEQUANTIZE_INT4:
            return "int4-weight"
    for n in inputs:
        if n.op.name == DYNAMIC_QUANT:
            return "int8-dynamic, dequantized"
        if n.op.name == DEQUANTIZE and n.inputs[0].dtype.name == "int8":
            return "int8-weight, dequantized"
        if _bf16_weight(n):
            return "bf16-weight, widened"
        if n.op.name == FP16_ROUND:
            return "fp16-weight, widened"
        if n.op.name == DEQUANTIZE_INT4:
            return "int4-weight, dequantized"
    return ""


def _bf16_weight(n) -> bool:
    """A weight rounded to bfloat16 for a product (tg.quantize's "bf16-weight")."""
    return n.op.name == BF16_ROUND
