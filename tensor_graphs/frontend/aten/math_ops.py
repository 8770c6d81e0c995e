"""ATen arithmetic, elementwise functions, comparisons, reductions and matrix products."""

from __future__ import annotations

import tensor_graphs as tg
from tensor_graphs.errors import ArgumentError
from tensor_graphs.frontend.aten.common import axes, binary, cast, scaled, unary


def _div(a, kw):
    mode = kw.get("rounding_mode")
    if mode is not None:
        raise ArgumentError(f"div: rounding_mode={mode!r} is not supported yet")
    return tg.div(kw["self"], kw["other"])


def _addmm(a, kw):
    product = scaled(tg.matmul(kw["mat1" if "mat1" in kw else "batch1"],
                                kw["mat2" if "mat2" in kw else "batch2"]), kw["alpha"])
    return scaled(kw["self"], kw["beta"]) + product


def _where(cond, a, b):
    return tg.where(cond, a, b)


def table(aten) -> dict:
    return {
        # linear algebra
        aten.linear: lambda a, kw: tg.linear(kw["input"], kw["weight"], kw["bias"]),
        aten.matmul: binary(tg.matmul),
        aten.mm: lambda a, kw: tg.matmul(kw["self"], kw["mat2"]),
        aten.bmm: lambda a, kw: tg.matmul(kw["self"], kw["mat2"]),
        aten.addmm: _addmm,
        aten.baddbmm: _addmm,
        # arithmetic
        aten.add: lambda a, kw: kw["self"] + scaled(kw["other"], kw["alpha"]),
        aten.sub: lambda a, kw: kw["self"] - scaled(kw["other"], kw["alpha"]),
        aten.rsub: lambda a, kw: tg.sub(kw["other"], scaled(kw["self"], kw["alpha"])),
        aten.mul: binary(tg.mul),
        aten.div: _div,
        aten.pow: lambda a, kw: tg.pow(kw["self"], kw["exponent"]),
        aten.neg: unary(tg.neg),
        aten.maximum: binary(tg.maximum),
        aten.minimum: binary(tg.minimum),
        aten.clamp: lambda a, kw: tg.clamp(kw["self"], min=kw["min"], max=kw["max"]),
        aten.clamp_min: lambda a, kw: tg.clamp(kw["self"], min=kw["min"]),
        aten.clamp_max: lambda a, kw: tg.clamp(kw["self"], max=kw["max"]),
        # elementwise functions
        aten.exp: unary(tg.exp),
        aten.log: unary(tg.log),
        aten.sqrt: unary(tg.sqrt),
        aten.rsqrt: unary(tg.rsqrt),
        aten.reciprocal: unary(tg.reciprocal),
        aten.abs: unary(tg.abs),
        aten.sin: unary(tg.sin),
        aten.cos: unary(tg.cos),
        aten.erf: unary(tg.erf),
        aten.square: unary(tg.square),
        aten.tanh: unary(tg.tanh),
        aten.sigmoid: unary(tg.sigmoid),
        aten.relu: unary(tg.relu),
        aten.silu: unary(tg.silu),
        aten.gelu: lambda a, kw: tg.gelu(kw["self"], approximate=kw["approximate"]),
        # comparisons and selection
        aten.eq: binary(tg.equal),
        aten.ne: binary(tg.not_equal),
        aten.lt: binary(tg.less),
        aten.le: binary(tg.less_equal),
        aten.gt: binary(tg.greater),
        aten.ge: binary(tg.greater_equal),
        aten.logical_not: unary(tg.logical_not),
        aten.where: lambda a, kw: _where(kw["condition"], kw["self"], kw["other"]),
        aten.masked_fill: lambda a, kw: _where(kw["mask"], kw["value"], kw["self"]),
        aten.tril: lambda a, kw: tg.tril(kw["self"], diagonal=kw["diagonal"]),
        aten.triu: lambda a, kw: tg.triu(kw["self"], diagonal=kw["diagonal"]),
        # reductions and the softmax family
        aten.sum: lambda a, kw: cast(tg.sum(kw["self"], axis=axes(kw.get("dim")),
                                             keepdims=kw.get("keepdim", False)), kw["dtype"]),
        aten.mean: lambda a, kw: tg.mean(cast(kw["self"], kw["dtype"]),
                                         axis=axes(kw.get("dim")),
                                         keepdims=kw.get("keepdim", False)),
        aten.amax: lambda a, kw: tg.max(kw["self"], axis=axes(kw["dim"]),
                                        keepdims=kw["keepdim"]),
        aten.amin: lambda a, kw: tg.min(kw["self"], axis=axes(kw["dim"]),
                                        keepdims=kw["keepdim"]),
        aten.var.correction: lambda a, kw: tg.var(
            kw["self"], axis=axes(kw["dim"]), keepdims=kw["keepdim"],
            correction=1 if kw["correction"] is None else kw["correction"]),
        aten.cumsum: lambda a, kw: tg.cumsum(cast(kw["self"], kw["dtype"]), axis=kw["dim"]),
        aten.softmax.int: lambda a, kw: tg.softmax(cast(kw["self"], kw["dtype"]),
                                                   axis=kw["dim"]),
        aten._softmax: lambda a, kw: tg.softmax(kw["self"], axis=kw["dim"]),
        aten.log_softmax.int: lambda a, kw: tg.log_softmax(cast(kw["self"], kw["dtype"]),
                                                           axis=kw["dim"]),
        aten._log_softmax: lambda a, kw: tg.log_softmax(kw["self"], axis=kw["dim"]),
    }
