"""ATen arithmetic, elementwise functions, comparisons, reductions and matrix products."""

from __future__ import annotations

import numpy as np

from tensor_graphs.errors import ArgumentError, ShapeError
from tensor_graphs.frontend.aten import pointwise_ops
from tensor_graphs.frontend.aten.common import (
    Unavailable,
    axes,
    binary,
    cast,
    guarded,
    scalar_dims,
    scaled,
    torch_module,
    unary,
    zero_dim_weak,
)
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.node import Node


def _div(a, kw):
    if kw.get("rounding_mode") is not None:
        return pointwise_ops.div_mode(a, kw)
    return tg.div(*zero_dim_weak(kw["self"], kw["other"]))


def _addmm(a, kw):
    product = scaled(tg.matmul(kw["mat1" if "mat1" in kw else "batch1"],
                                kw["mat2" if "mat2" in kw else "batch2"]), kw["alpha"])
    return scaled(kw["self"], kw["beta"]) + product


def _clamp(x, lo=None, hi=None):
    """torch's clamp, min then max; tensor bounds (clamp.Tensor) are elementwise maximum and
    minimum with the bounds broadcast and the dtype promoted over all three."""
    if not any(isinstance(b, Node) for b in (lo, hi)):
        return tg.clamp(x, min=lo, max=hi)
    x, lo, hi = zero_dim_weak(x, lo, hi)
    if lo is not None:
        x = tg.maximum(*tg.promote(x, lo, op="clamp"))
    if hi is not None:
        x = tg.minimum(*tg.promote(x, hi, op="clamp"))
    return x


def _where(cond, a, b):
    return tg.where(cond, *zero_dim_weak(a, b))


def _add(x, y, alpha):
    """x + alpha * y (sub and rsub: alpha negated), with torch's 0-d promotion."""
    x, y = zero_dim_weak(x, y)
    if alpha == -1:
        return x - y
    return x + scaled(y, alpha)


# ---------------------------------------------------------------------------- activations
def _elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    """torch's elu family: scale * x above 0, scale * alpha * (exp(input_scale * x) - 1)
    below (celu and selu are members)."""
    if input_scale == 1:
        y = tg.elu(x, alpha=float(alpha))
    else:  # exp of the clipped value: the branch not taken never overflows
        y = tg.where(x > 0, x, (tg.exp(tg.minimum(x, 0.0) * input_scale) - 1.0) * alpha)
    return scaled(y, scale)


def _leaky(x, slope):
    return tg.where(x > 0, x, x * slope)


def _hardtanh(x, lo: float, hi: float):
    """torch's hardtanh (relu6, hardsigmoid, hardswish's factor): clamp's values with torch's
    gradient, g strictly inside (lo, hi) and 0 at the bounds, where clamp's passes g; the
    bounds are constants of the select, so no gradient reaches them (nan stays nan)."""
    return tg.where(tg.less_equal(x, lo), lo, tg.where(tg.less_equal(hi, x), hi, x))


def _hardsigmoid(x):
    return _hardtanh(x + 3.0, 0.0, 6.0) / 6.0


def _root(total, power: float):
    """``total ** power`` (a norm's root of a sum of powers) with torch's gradient at a total
    of 0, where the root's own derivative is inf and inf * 0 made nan (F.normalize of a
    padding row, a norm penalty on a zero-initialised weight): the root of 1 is taken there
    and its result replaced by 0, so no gradient flows through the root at 0."""
    zero = tg.equal(total, 0.0)
    safe = tg.where(zero, 1.0, total)
    rooted = tg.sqrt(safe) if power == 0.5 else tg.pow(safe, power)
    return tg.where(zero, 0.0, rooted)


def _rrelu(a, kw):
    if kw["training"]:
        raise ArgumentError("rrelu in training mode samples random slopes: call module.eval() "
                            "before from_torch")
    return _leaky(kw["self"], (kw["lower"] + kw["upper"]) / 2)


def _prelu(a, kw):
    x, w = kw["self"], kw["weight"]
    if x.ndim >= 2 and w.ndim == 1:  # one slope per channel (axis 1), or a single one
        w = tg.reshape(w, (w.shape[0],) + (1,) * (x.ndim - 2))
    elif x.ndim == 0 and w.ndim == 1:  # a 0-d input keeps its shape (one slope)
        w = tg.reshape(w, ())
    return _leaky(x, w)


def _glu(a, kw):
    x, dim = kw["self"], kw["dim"]
    n = x.shape[dim]
    if not isinstance(n, int) or n % 2:
        raise ArgumentError(f"glu: axis {dim} of {x.shape} must be a concrete even size")
    first = tg.slice_axis(x, dim, None, n // 2)
    return first * tg.sigmoid(tg.slice_axis(x, dim, n // 2, None))


def _shrink(kind):
    def fn(a, kw):
        x, lam = kw["self"], kw["lambd"]
        inside = tg.logical_and(x >= -lam, x <= lam)
        if kind == "hard":
            return tg.where(inside, 0.0, x)
        return tg.where(inside, 0.0, x - tg.sign(x) * lam)
    return fn


# ---------------------------------------------------------------------------- reductions
def _extremum(reduce, arg, op):
    """torch.max/min(x, dim): the values taken at the indices it returns, so the gradient
    goes to that one index as torch's does (``reduce``'s, as amax's, shares a tie evenly);
    the first of a tie, and a nan, as torch picks them."""
    def fn(a, kw):
        x, dim, keep = kw["self"], kw["dim"], kw["keepdim"]
        if not isinstance(x, Node) or x.ndim == 0:
            return (reduce(x, axis=dim, keepdims=keep), arg(x, axis=dim, keepdims=keep))
        index = arg(x, axis=dim, keepdims=True)
        values = tg.take_along_axis(x, index, axis=dim)
        if not keep:
            values, index = tg.squeeze(values, dim), tg.squeeze(index, dim)
        return values, index
    return fn


def _correction(kw):
    if "correction" in kw:
        return 1 if kw["correction"] is None else kw["correction"]
    return 1 if kw.get("unbiased", True) else 0


def _var(a, kw):
    """tg.var divides by max(0, n - correction) as torch does (nan or inf when n <= correction)."""
    x, axis, correction = kw["self"], axes(kw.get("dim")), _correction(kw)
    return tg.var(x, axis=axis, keepdims=kw.get("keepdim", False), correction=correction)


def _mean_of(kw):
    return tg.mean(kw["self"], axis=axes(kw.get("dim")), keepdims=kw.get("keepdim", False))


def _vector_norm(a, kw):
    x = cast(kw["self"], kw["dtype"])
    order, axis, keep = kw["ord"], axes(kw["dim"]), kw["keepdim"]
    if order == 2:
        return _root(tg.sum(x * x, axis=axis, keepdims=keep), 0.5)
    if order == 1:
        return tg.sum(tg.abs(x), axis=axis, keepdims=keep)
    if order == float("inf"):
        return tg.max(tg.abs(x), axis=axis, keepdims=keep)
    if order == float("-inf"):
        return tg.min(tg.abs(x), axis=axis, keepdims=keep)
    if order == 0:
        return tg.sum(tg.cast(tg.not_equal(x, 0.0), x.dtype), axis=axis, keepdims=keep)
    return _root(tg.sum(tg.pow(tg.abs(x), float(order)), axis=axis, keepdims=keep),
                 1.0 / order)


def _cdist(a, kw):
    """torch.cdist: the p-norm of every row difference, (..., P, 1, M) - (..., 1, R, M)."""
    x1, x2 = kw["x1"], kw["x2"]
    diff = tg.unsqueeze(x1, -2) - tg.unsqueeze(x2, -3)
    return _vector_norm(a, {"self": diff, "ord": kw["p"], "dim": [-1], "keepdim": False,
                            "dtype": None})


def _pdist(a, kw):
    """torch.pdist: the p-norm distance of every pair of rows i < j, in row-major order of
    the pairs: the full distance matrix gathered at its strict upper triangle."""
    x = kw["self"]
    n = x.shape[0]
    if not isinstance(n, int):
        raise ShapeError(f"pdist: the number of rows of {x.shape} must be concrete")
    full = _cdist(a, {"x1": x, "x2": x, "p": kw["p"]})
    rows, cols = np.triu_indices(n, 1)
    return tg.gather(tg.reshape(full, (-1,)), tg.constant((rows * n + cols).astype(np.int64)),
                     axis=0)


def _softmax_fn(fn, dtype_key=None):
    """softmax / log_softmax; over an empty tensor the result is that empty tensor (torch's
    convention; our max refuses to reduce an empty axis)."""
    def call(a, kw):
        x = cast(kw["self"], kw[dtype_key]) if dtype_key else kw["self"]
        if 0 in tuple(x.shape):
            return x
        return fn(x, axis=kw["dim"])
    return scalar_dims(call)


def _log_sigmoid_forward(a, kw):
    return (-tg.softplus(-kw["self"]),
            Unavailable("log_sigmoid_forward: its buffer output has no tensor_graphs value"))


def _torch_sign(x):
    """torch.sign: 0 at nan (our sign, as numpy's, keeps nan)."""
    if isinstance(x, Node) and x.dtype.is_float:
        return tg.where(tg.isnan(x), 0.0, tg.sign(x))
    return tg.sign(x)


def table(aten) -> dict:
    prims = torch_module().ops.prims  # what torch's reference decompositions produce
    return guarded({
        # linear algebra
        aten.linear: lambda a, kw: tg.linear(kw["input"], kw["weight"], kw["bias"]),
        aten.matmul: binary(tg.matmul),
        aten.mm: lambda a, kw: tg.matmul(kw["self"], kw["mat2"]),
        aten.bmm: lambda a, kw: tg.matmul(kw["self"], kw["mat2"]),
        aten.addmm: _addmm,
        aten.baddbmm: _addmm,
        aten.addbmm: lambda a, kw: scaled(kw["self"], kw["beta"]) + scaled(
            tg.sum(tg.matmul(kw["batch1"], kw["batch2"]), axis=0), kw["alpha"]),
        # arithmetic
        aten.add: lambda a, kw: _add(kw["self"], kw["other"], kw["alpha"]),
        aten.sub: lambda a, kw: _add(kw["self"], kw["other"], -kw["alpha"]),
        aten.rsub: lambda a, kw: _add(kw["other"], kw["self"], -kw["alpha"]),
        aten.mul: binary(tg.mul),
        aten.div: _div,
        aten.pow: lambda a, kw: tg.pow(*zero_dim_weak(kw["self"], kw["exponent"])),
        aten.neg: unary(tg.neg),
        aten.maximum: binary(tg.maximum),
        aten.minimum: binary(tg.minimum),
        aten.clamp: lambda a, kw: _clamp(kw["self"], kw["min"], kw["max"]),
        aten.clamp_min: lambda a, kw: _clamp(kw["self"], lo=kw["min"]),
        aten.clamp_max: lambda a, kw: _clamp(kw["self"], hi=kw["max"]),
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
        aten.hardtanh: lambda a, kw: _hardtanh(kw["self"], float(kw["min_val"]),
                                               float(kw["max_val"])),
        aten.relu6: lambda a, kw: _hardtanh(kw["self"], 0.0, 6.0),
        aten.leaky_relu: lambda a, kw: _leaky(kw["self"], kw["negative_slope"]),
        aten.rrelu: _rrelu,
        aten.prelu: _prelu,
        aten._prelu_kernel: lambda a, kw: _leaky(kw["self"], kw["weight"]),
        aten.elu: lambda a, kw: _elu(kw["self"], kw["alpha"], kw["scale"], kw["input_scale"]),
        aten.celu: lambda a, kw: _elu(kw["self"], kw["alpha"], 1.0, 1.0 / kw["alpha"]),
        aten.selu: unary(tg.selu),
        aten.softplus: lambda a, kw: tg.softplus(kw["self"], beta=float(kw["beta"]),
                                                 threshold=float(kw["threshold"])),
        aten.mish: lambda a, kw: kw["self"] * tg.tanh(tg.softplus(kw["self"])),
        aten.log_sigmoid: lambda a, kw: -tg.softplus(-kw["self"]),
        aten.log_sigmoid_forward: _log_sigmoid_forward,
        aten.hardsigmoid: lambda a, kw: _hardsigmoid(kw["self"]),
        aten.hardswish: lambda a, kw: kw["self"] * _hardsigmoid(kw["self"]),
        aten.threshold: lambda a, kw: tg.where(kw["self"] > kw["threshold"], kw["self"],
                                               kw["value"]),
        aten.glu: _glu,
        aten.softshrink: _shrink("soft"),
        aten.hardshrink: _shrink("hard"),
        aten.sign: lambda a, kw: _torch_sign(kw["self"]),
        aten.addcmul: lambda a, kw: kw["self"] + scaled(kw["tensor1"] * kw["tensor2"],
                                                        kw["value"]),
        aten.addcdiv: lambda a, kw: kw["self"] + scaled(tg.div(kw["tensor1"], kw["tensor2"]),
                                                        kw["value"]),
        aten.lerp: lambda a, kw: kw["self"] + kw["weight"] * (kw["end"] - kw["self"]),
        # comparisons and selection
        aten.eq: binary(tg.equal),
        aten.ne: binary(tg.not_equal),
        aten.lt: binary(tg.less),
        aten.le: binary(tg.less_equal),
        aten.gt: binary(tg.greater),
        aten.ge: binary(tg.greater_equal),
        aten.logical_not: unary(tg.logical_not),
        aten.where: lambda a, kw: _where(kw["condition"], kw["self"], kw["other"]),
        prims.where: lambda a, kw: _where(kw["pred"], kw["a"], kw["b"]),
        aten.masked_fill: lambda a, kw: _where(kw["mask"], kw["value"], kw["self"]),
        aten.tril: lambda a, kw: tg.tril(kw["self"], diagonal=kw["diagonal"]),
        aten.triu: lambda a, kw: tg.triu(kw["self"], diagonal=kw["diagonal"]),
        # reductions and the softmax family
        aten.sum: scalar_dims(lambda a, kw: cast(tg.sum(kw["self"], axis=axes(kw.get("dim")),
                                             keepdims=kw.get("keepdim", False)), kw["dtype"])),
        aten.mean: scalar_dims(lambda a, kw: tg.mean(cast(kw["self"], kw["dtype"]),
                                         axis=axes(kw.get("dim")),
                                         keepdims=kw.get("keepdim", False))),
        aten.amax: scalar_dims(lambda a, kw: tg.max(kw["self"], axis=axes(kw["dim"]),
                                        keepdims=kw["keepdim"])),
        aten.amin: scalar_dims(lambda a, kw: tg.min(kw["self"], axis=axes(kw["dim"]),
                                        keepdims=kw["keepdim"])),
        aten.var: scalar_dims(_var),
        aten.std: scalar_dims(lambda a, kw: tg.sqrt(_var(a, kw))),
        aten.var_mean: scalar_dims(lambda a, kw: (_var(a, kw), _mean_of(kw))),
        aten.std_mean: scalar_dims(lambda a, kw: (tg.sqrt(_var(a, kw)), _mean_of(kw))),
        aten.max.default: lambda a, kw: tg.max(kw["self"]),
        aten.min.default: lambda a, kw: tg.min(kw["self"]),
        aten.max.other: binary(tg.maximum),
        aten.min.other: binary(tg.minimum),
        aten.max.dim: scalar_dims(_extremum(tg.max, tg.argmax, "max")),
        aten.min.dim: scalar_dims(_extremum(tg.min, tg.argmin, "min")),
        aten.argmax: scalar_dims(lambda a, kw: tg.argmax(kw["self"], axis=kw["dim"],
                                             keepdims=kw["keepdim"])),
        aten.argmin: scalar_dims(lambda a, kw: tg.argmin(kw["self"], axis=kw["dim"],
                                             keepdims=kw["keepdim"])),
        aten.prod: scalar_dims(lambda a, kw: tg.prod(cast(kw["self"], kw["dtype"]),
                                                     axis=kw.get("dim"),
                                                     keepdims=kw.get("keepdim", False))),
        aten.logsumexp: scalar_dims(lambda a, kw: tg.logsumexp(
            kw["self"], axis=axes(kw["dim"]), keepdims=kw["keepdim"])),
        aten.linalg_vector_norm: scalar_dims(_vector_norm),
        aten._cdist_forward: _cdist,
        aten._pdist_forward: _pdist,
        aten.cumsum: scalar_dims(lambda a, kw: tg.cumsum(cast(kw["self"], kw["dtype"]),
                                                         axis=kw["dim"])),
        aten.softmax.int: _softmax_fn(tg.softmax, "dtype"),
        aten._softmax: _softmax_fn(tg.softmax),
        aten.log_softmax.int: _softmax_fn(tg.log_softmax, "dtype"),
        aten._log_softmax: _softmax_fn(tg.log_softmax),
    })
