"""ATen's rounding, special and integer pointwise functions (floor, log1p, atan2, bitwise ops
on integers, ...): the families issue 21 adds, kept apart from math_ops' arithmetic.

Each maps to one op of ir/ops/pointwise.py, whose decomposition follows torch's CPU kernels at
the edges (fmod's sign, xlogy's nan, shifts past the width). torch spells bool logic with the
bitwise operators (``mask_a & mask_b``): on bools they are logical and/or/xor/not, on ints bit
operations. ``div`` with a rounding mode is here too (math_ops' ``div`` calls ``div_mode``).
"""

from __future__ import annotations

import math

from tensor_graphs.frontend.aten.common import binary, guarded, unary
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.pointwise import div_rounded


def div_mode(a, kw):
    """aten.div with its rounding_mode (None, "trunc", "floor")."""
    return div_rounded(kw["self"], kw["other"], kw.get("rounding_mode"))


def _round(a, kw):
    return tg.round(kw["self"], decimals=kw.get("decimals", 0))


def _logit(a, kw):
    eps = kw.get("eps")
    return tg.logit(kw["self"], eps=None if eps is None else float(eps))


def _nan_to_num(a, kw):
    def opt(v):
        return None if v is None else float(v)
    return tg.nan_to_num(kw["self"], nan=0.0 if kw["nan"] is None else float(kw["nan"]),
                         posinf=opt(kw["posinf"]), neginf=opt(kw["neginf"]))


def _signed_inf(sign: float):
    def fn(a, kw):
        x = kw["self"]
        if not (isinstance(x, Node) and x.dtype.is_float):
            return tg.logical_not(tg.equal(x, x))
        return tg.equal(x, sign * math.inf)
    return fn


def _bitwise(fn):
    """A bit op of torch's (tensor or Python scalar) operands, either of which may be the
    scalar (the Scalar_Tensor overloads)."""
    return lambda a, kw: fn(kw["self"], kw["other"])


def table(aten) -> dict:
    bit_ops = {}
    for name, fn in (("and", tg.bitwise_and), ("or", tg.bitwise_or),
                     ("xor", tg.bitwise_xor)):
        packet = getattr(aten, f"bitwise_{name}")
        dunder = getattr(aten, f"__{name}__")
        bit_ops.update({packet.Tensor: _bitwise(fn), packet.Scalar: _bitwise(fn),
                        packet.Scalar_Tensor: _bitwise(fn), dunder.Tensor: _bitwise(fn),
                        dunder.Scalar: _bitwise(fn)})
    for name, fn in (("left", tg.left_shift), ("right", tg.right_shift)):
        packet = getattr(aten, f"bitwise_{name}_shift")
        dunder = getattr(aten, f"__{name[0]}shift__")
        bit_ops.update({packet.Tensor: _bitwise(fn), packet.Tensor_Scalar: _bitwise(fn),
                        packet.Scalar_Tensor: _bitwise(fn), dunder.Tensor: _bitwise(fn),
                        dunder.Scalar: _bitwise(fn)})
    return guarded({
        # rounding
        aten.floor: unary(tg.floor),
        aten.ceil: unary(tg.ceil),
        aten.trunc: unary(tg.trunc),
        aten.fix: unary(tg.trunc),
        aten.round.default: _round,
        aten.round.decimals: _round,
        aten.frac: unary(tg.frac),
        # division
        aten.fmod: binary(tg.fmod),
        aten.remainder.Tensor: binary(tg.remainder),
        aten.remainder.Scalar: binary(tg.remainder),
        aten.remainder.Scalar_Tensor: binary(tg.remainder),
        aten.floor_divide: binary(tg.floor_divide),
        # special functions
        aten.log1p: unary(tg.log1p),
        aten.special_log1p: unary(tg.log1p),
        aten.expm1: unary(tg.expm1),
        aten.special_expm1: unary(tg.expm1),
        aten.log2: unary(tg.log2),
        aten.log10: unary(tg.log10),
        aten.exp2: unary(tg.exp2),
        aten.special_exp2: unary(tg.exp2),
        aten.tan: unary(tg.tan),
        aten.asin: unary(tg.asin),
        aten.arcsin: unary(tg.asin),
        aten.acos: unary(tg.acos),
        aten.arccos: unary(tg.acos),
        aten.atan: unary(tg.atan),
        aten.arctan: unary(tg.atan),
        aten.sinh: unary(tg.sinh),
        aten.cosh: unary(tg.cosh),
        aten.asinh: unary(tg.asinh),
        aten.arcsinh: unary(tg.asinh),
        aten.acosh: unary(tg.acosh),
        aten.arccosh: unary(tg.acosh),
        aten.atanh: unary(tg.atanh),
        aten.arctanh: unary(tg.atanh),
        aten.lgamma: unary(tg.lgamma),
        aten.special_gammaln: unary(tg.lgamma),
        aten.digamma: unary(tg.digamma),
        aten.special_digamma: unary(tg.digamma),
        aten.special_psi: unary(tg.digamma),
        aten.erfinv: unary(tg.erfinv),
        aten.nextafter: binary(tg.nextafter),
        aten.special_erfinv: unary(tg.erfinv),
        aten.atan2.default: binary(tg.atan2),
        aten.arctan2.default: binary(tg.atan2),
        aten.hypot: binary(tg.hypot),
        aten.xlogy: binary(tg.xlogy),
        aten.special_xlogy: binary(tg.xlogy),
        aten.logit: _logit,
        aten.erfc: unary(tg.erfc),
        aten.special_erfc: unary(tg.erfc),
        # classification
        aten.isnan: unary(tg.isnan),
        aten.isinf: unary(tg.isinf),
        aten.isfinite: unary(tg.isfinite),
        aten.isposinf: _signed_inf(1.0),
        aten.isneginf: _signed_inf(-1.0),
        aten.nan_to_num: _nan_to_num,
        aten.signbit: unary(tg.signbit),
        aten.copysign: binary(tg.copysign),
        aten.fmax: binary(tg.fmax),
        aten.fmin: binary(tg.fmin),
        aten.angle: unary(tg.angle),
        # bits and logic (bools: logical ops)
        **bit_ops,
        aten.bitwise_not: unary(tg.bitwise_not),
        aten.logical_xor: binary(tg.logical_xor),
    })
