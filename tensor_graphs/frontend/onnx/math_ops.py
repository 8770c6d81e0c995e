"""ONNX's arithmetic: pointwise ops, comparisons and logic, casts, reductions, MatMul,
Gemm and Einsum. Shape arithmetic on static values (Shape -> Gather -> Mul -> Concat) folds
here with numpy, symbolic dims included, so a Reshape later sees its shape at import time."""

from __future__ import annotations

import functools
import operator

import numpy as np

from tensor_graphs.errors import ShapeError
from tensor_graphs.frontend.onnx.common import Ctx, Static, dtype_of, fold, ints, product
from tensor_graphs.ir import api as tg

# op -> numpy's function, for static operands (a negated axis in a shape computation)
UNARY_FOLD = {"Neg": np.negative, "Abs": np.abs, "Not": np.logical_not, "Sign": np.sign,
              "Floor": np.floor, "Ceil": np.ceil, "Sqrt": np.sqrt, "Reciprocal": np.reciprocal}


def _unary(fn, static=None):
    def mapped(c: Ctx):
        if static is not None and c.is_static(0) and (
                c.inputs[0].array.dtype != object or static in (np.negative, np.abs)):
            folded = fold(c, static)
            if folded is not None:
                return folded
        return fn(c.t(0))
    return mapped


# op -> our builder of one tensor (no shape arithmetic goes through these)
UNARY = {
    "Abs": tg.abs, "Neg": tg.neg, "Exp": tg.exp, "Log": tg.log, "Sqrt": tg.sqrt,
    "Reciprocal": tg.reciprocal, "Sin": tg.sin, "Cos": tg.cos, "Tan": tg.tan,
    "Tanh": tg.tanh, "Sigmoid": tg.sigmoid, "Erf": tg.erf, "Floor": tg.floor,
    "Ceil": tg.ceil, "Round": tg.round, "Sign": tg.sign, "Asin": tg.asin, "Acos": tg.acos,
    "Atan": tg.atan, "Sinh": tg.sinh, "Cosh": tg.cosh, "Asinh": tg.asinh, "Acosh": tg.acosh,
    "Atanh": tg.atanh, "IsNaN": tg.isnan, "Not": tg.logical_not,
    "BitwiseNot": tg.bitwise_not,
}


def _int_div(a, b):
    """ONNX Div of ints truncates (C's rule); static dims are positive, so // is the same."""
    return a // b if a.dtype == object or b.dtype == object else \
        (np.trunc(a / b).astype(a.dtype) if a.dtype.kind in "iu" else a / b)


def _div(a, b):
    return tg.div_trunc(a, b) if not a.dtype.is_float else tg.div(a, b)


def _pow(a, b):
    """ONNX Pow's result has the base's dtype. An int base with a float exponent is computed
    as ONNX Runtime computes it, in float64 (std::pow), and truncated back to the base's
    dtype: the exponent cast to the base's int dtype would turn x ** 0.5 into x ** 0."""
    if not a.dtype.is_float and b.dtype.is_float:
        return tg.cast(tg.pow(tg.cast(a, "float64"), tg.cast(b, "float64")), a.dtype)
    return tg.pow(a, b if b.dtype == a.dtype else tg.cast(b, a.dtype))


def _pow_static(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pow of static numbers, as ``_pow`` computes it: shape arithmetic takes a root (the
    TorchScript export of a ViT's position grid, ``int(num_positions ** 0.5)``), and a Pow
    left unfolded made the Reshape after it a run-time shape, refused."""
    if a.dtype.kind in "iu" and (b.dtype.kind == "f" or (b < 0).any()):
        return np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)
    return np.power(a, b.astype(a.dtype))


def _pow_mapped(c: Ctx):
    """Folds static numeric operands; symbolic dims (object arrays) stay graph nodes."""
    if not any(c.is_static(i) and c.inputs[i].array.dtype == object for i in range(c.n)):
        folded = fold(c, _pow_static)
        if folded is not None:
            return folded
    return _pow(c.t(0), c.t(1))


def _mod(c: Ctx):
    folded = fold(c, lambda a, b: _same_kind(np.fmod(a, b) if c.a("fmod", 0) else np.mod(a, b),
                                             a))
    if folded is not None:
        return folded
    a, b = c.t(0), c.t(1)
    return tg.fmod(a, b) if c.a("fmod", 0) else tg.remainder(a, b)


def _shift(c: Ctx):
    a, b = c.t(0), c.t(1)
    return tg.left_shift(a, b) if c.a("direction") == "LEFT" else tg.right_shift(a, b)


# op -> (our builder of two tensors, numpy's function for static operands or None)
BINARY = {
    "Add": (tg.add, operator.add),
    "Sub": (tg.sub, operator.sub),
    "Mul": (tg.mul, operator.mul),
    "Div": (_div, _int_div),
    "Equal": (tg.equal, np.equal),
    "Less": (tg.less, np.less),
    "LessOrEqual": (tg.less_equal, np.less_equal),
    "Greater": (tg.greater, np.greater),
    "GreaterOrEqual": (tg.greater_equal, np.greater_equal),
    "And": (tg.logical_and, np.logical_and),
    "Or": (tg.logical_or, np.logical_or),
    "Xor": (tg.logical_xor, np.logical_xor),
    "BitwiseAnd": (tg.bitwise_and, None),
    "BitwiseOr": (tg.bitwise_or, None),
    "BitwiseXor": (tg.bitwise_xor, None),
}


def _binary(fn, static):
    def mapped(c: Ctx):
        if static is not None:
            folded = fold(c, lambda a, b: _same_kind(static(a, b), a))
            if folded is not None:
                return folded
        return fn(c.t(0), c.t(1))
    return mapped


def _same_kind(result, a):
    """numpy widens int64 shape arithmetic on object arrays to object; keep ints ints."""
    result = np.asarray(result)
    if result.dtype == object and a.dtype != object and not Static(result).symbolic:
        return result.astype(a.dtype)
    return result


def _variadic(fn, static):
    def mapped(c: Ctx):
        folded = fold(c, lambda *xs: functools.reduce(static, xs)) if static else None
        if folded is not None:
            return folded
        return functools.reduce(fn, c.tensors())
    return mapped


def _mean(c: Ctx):
    xs = c.tensors()
    return tg.div(functools.reduce(tg.add, xs), float(len(xs)))


def _where(c: Ctx):
    folded = fold(c, np.where)
    return folded if folded is not None else tg.where(c.t(0), c.t(1), c.t(2))


def _cast(c: Ctx):
    to = dtype_of(c.a("to"), f"Cast node '{c.name}'")
    if c.is_static(0) and c.inputs[0].array.dtype == object and to in ("int64", "int32"):
        return c.inputs[0]  # symbolic dims stay dims
    folded = fold(c, lambda a: a.astype(np.dtype(to) if to != "bfloat16" else np.float32)) \
        if to != "bfloat16" else None
    return folded if folded is not None else tg.cast(c.t(0), to)


def _cast_like(c: Ctx):
    return tg.cast(c.t(0), c.t(1).dtype)


def _clip(c: Ctx):
    x = c.t(0)
    if c.opset < 11:
        lo, hi = c.a("min"), c.a("max")
    else:
        lo = c.t(1) if c.has(1) else None
        hi = c.t(2) if c.has(2) else None
    out = x
    if lo is not None:
        out = tg.maximum(out, lo if not isinstance(lo, float) else tg.as_node(lo, x.dtype))
    if hi is not None:
        out = tg.minimum(out, hi if not isinstance(hi, float) else tg.as_node(hi, x.dtype))
    return out


def _isinf(c: Ctx):
    x = c.t(0)
    neg, pos = c.a("detect_negative", 1), c.a("detect_positive", 1)
    if neg and pos:
        return tg.isinf(x)
    inf = float("inf") if pos else float("-inf")
    if not (neg or pos):
        return tg.logical_and(tg.isinf(x), tg.logical_not(tg.isinf(x)))
    return tg.equal(x, tg.as_node(inf, x.dtype))


def reduce_axes(c: Ctx, since_input: int):
    """The axes of a Reduce* node: an attribute before ``since_input``'s opset, the second
    input from it. None: every axis (or none, with noop_with_empty_axes)."""
    if c.opset >= since_input:
        axes = ints(c.s(1, "axes")) if c.has(1) else []
    else:
        axes = list(c.a("axes", []))
    if not axes:
        return "noop" if c.a("noop_with_empty_axes", 0) else None
    return tuple(axes)


def _reduce(fn, since_input: int = 18, pre=None, post=None, empty=None):
    def mapped(c: Ctx):
        x = c.t(0)
        axes = reduce_axes(c, since_input)
        keep = bool(c.a("keepdims", 1))
        if axes == "noop":
            return post(pre(x)) if pre and post else (pre(x) if pre else x)
        v = pre(x) if pre else x
        if empty is not None and any(x.shape[a] == 0 for a in (axes or range(x.ndim))):
            return _empty_reduction(c, x, axes, keep, empty)
        out = fn(v, axis=axes, keepdims=keep)
        return post(out) if post else out
    return mapped


def _mean_keeping_dtype(x, axis, keepdims: bool):
    """ReduceMean of ints is of the input's dtype, the sum divided by the count truncated (as
    ONNX Runtime divides): ``tg.mean`` returned floats, which a graph's later int ops and
    its declared int output did not expect."""
    if x.dtype.is_float:
        return tg.mean(x, axis=axis, keepdims=keepdims)
    count = functools.reduce(operator.mul, (x.shape[a] for a in (axis or range(x.ndim))), 1)
    return tg.div_trunc(tg.sum(x, axis=axis, keepdims=keepdims), tg.size(count, x.dtype.name))


def _empty_reduction(c: Ctx, x, axes, keep: bool, value: float):
    """A reduction over an empty axis: ONNX's identity of the reduction (-inf for a max)."""
    rank = x.ndim
    axes = {a % rank for a in (axes or range(rank))}
    shape = [1 if a in axes else d for a, d in enumerate(x.shape) if keep or a not in axes]
    if x.dtype.is_bool:
        value = value > 0  # max of nothing is False, min of nothing True
    elif not x.dtype.is_float:
        info = np.iinfo(x.dtype.np_dtype)
        value = info.min if value < 0 else info.max
    return tg.broadcast_to(tg.as_node(value, x.dtype), *shape)


def _logsumexp(x, axis, keepdims):
    axes = tuple(range(x.ndim)) if axis is None else axis
    return tg.logsumexp(x, axis=axes, keepdims=keepdims)


def _reduce_prod(c: Ctx):
    folded = fold(c, lambda a, *_: _prod_static(c, a))
    return folded if folded is not None else _reduce(tg.prod)(c)


def _prod_static(c: Ctx, a):
    axes = reduce_axes(c, 18)
    keep = bool(c.a("keepdims", 1))
    if axes == "noop":
        return a
    return np.asarray(np.prod(a, axis=axes, keepdims=keep))


def _arg(fn):
    def mapped(c: Ctx):
        if c.a("select_last_index", 0):
            x = c.t(0)
            axis = c.a("axis", 0) % x.ndim
            rev = tg.slice_axis(x, axis, None, None, -1)
            idx = fn(rev, axis=axis, keepdims=bool(c.a("keepdims", 1)))
            return tg.sub(x.shape[axis] - 1, idx)
        return fn(c.t(0), axis=c.a("axis", 0), keepdims=bool(c.a("keepdims", 1)))
    return mapped


def _matmul(c: Ctx):
    return tg.matmul(c.t(0), c.t(1))


def _gemm(c: Ctx):
    a, b = c.t(0), c.t(1)
    if c.a("transA", 0):
        a = tg.transpose(a, 0, 1)
    if c.a("transB", 0):
        b = tg.transpose(b, 0, 1)
    out = tg.matmul(a, b)
    alpha, beta = c.a("alpha", 1.0), c.a("beta", 1.0)
    if alpha != 1.0:
        out = tg.mul(out, tg.as_node(alpha, out.dtype))
    if c.has(2) and beta != 0.0:
        bias = c.t(2)
        out = tg.add(out, bias if beta == 1.0 else tg.mul(bias, tg.as_node(beta, bias.dtype)))
    return out


def _einsum_error(c: Ctx, equation: str, why: str) -> ShapeError:
    shapes = ", ".join(str(tuple(c.t(i).shape)) for i in range(c.n))
    return ShapeError(f"Einsum node '{c.name}': equation '{equation}' over operands of shapes "
                      f"{shapes}: {why}; the model is invalid (ONNX Runtime refuses it too): "
                      "check the equation where the model is made, and export it again")


def _einsum_terms(c: Ctx, equation: str) -> tuple[list, list]:
    """Each operand's labels and the output's, one label per axis: a letter, or ``...k``
    for the ellipsis' axes, aligned from the right so that they broadcast as numpy's. The
    implicit output (no ``->``) is the ellipsis, then the letters used once, sorted."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != c.n:
        raise _einsum_error(c, equation, f"{len(terms)} operand term(s) for {c.n} input(s)")
    ranks = [c.t(i).ndim for i in range(c.n)]
    spans = [r - len(t.replace("...", "")) if "..." in t else 0 for t, r in zip(terms, ranks)]
    wide = max(spans, default=0)
    labels = []
    for i, (term, rank, span) in enumerate(zip(terms, ranks, spans)):
        head, dots, tail = term.partition("...")
        letters = head + tail
        if span < 0 or (not dots and len(term) != rank) or (letters and not letters.isalpha()):
            raise _einsum_error(c, equation, f"term '{term}' does not label the {rank} axes "
                                f"of input {i} (one letter per axis, '...' for the rest)")
        labels.append(list(head) + [f"...{wide - span + k}" for k in range(span)] + list(tail))
    ellipsis = [f"...{k}" for k in range(wide)]
    if arrow:
        head, dots, tail = rhs.partition("...")
        out = list(head) + (ellipsis if dots else []) + list(tail)
    else:
        letters = [ch for t in terms for ch in t.replace("...", "")]
        out = ellipsis + sorted(ch for ch in set(letters) if letters.count(ch) == 1)
    unknown = [lb for lb in out if not any(lb in t for t in labels)]
    if unknown or len(set(out)) != len(out):
        raise _einsum_error(c, equation, f"the output labels {out} repeat a label or name one "
                            "no input has")
    return labels, out


def _einsum_diagonal(x, labels: list):
    """An operand's repeated label (``ii``) reduced to its diagonal: the axes masked where
    the two positions differ and the second summed away (a mask rather than a gather, so a
    symbolic size works)."""
    labels = list(labels)
    for b in range(len(labels) - 1, 0, -1):
        if labels[b] not in labels[:b]:
            continue
        a = labels.index(labels[b])
        n = x.shape[a]
        pos = [tg.reshape(tg.iota(n), tuple(-1 if k == axis else 1 for k in range(x.ndim)))
               for axis in (a, b)]
        x = tg.sum(tg.where(tg.equal(*pos), x, tg.as_node(0, x.dtype)), b)
        del labels[b]
    return x, labels


def _einsum_sum(x, labels: list, needed: set):
    """Sum away the axes whose label nothing later reads."""
    gone = [k for k, lb in enumerate(labels) if lb not in needed]
    if gone:
        x = tg.sum(x, tuple(gone))
    return x, [lb for lb in labels if lb in needed]


def _einsum_pair(a, la: list, b, lb: list, keep: set):
    """Two operands as one batched matmul: the labels both hold and ``keep`` (the output
    and later operands) needs are its batch axes, those both hold and nothing needs its
    contracted axis, the others its rows and columns. A shared axis of size 1 on one side
    (the ellipsis broadcasting) that is contracted is summed on the other side first."""
    for lab in [lb_ for lb_ in la if lb_ in lb and lb_ not in keep]:
        size_a, size_b = a.shape[la.index(lab)], b.shape[lb.index(lab)]
        if size_a == 1 and size_b != 1:
            a, la = _einsum_sum(a, la, set(la) - {lab})
        elif size_b == 1 and size_a != 1:
            b, lb = _einsum_sum(b, lb, set(lb) - {lab})
    a, la = _einsum_sum(a, la, keep | set(lb))
    b, lb = _einsum_sum(b, lb, keep | set(la))
    batch = [lab for lab in la if lab in lb and lab in keep]
    summed = [lab for lab in la if lab in lb and lab not in keep]
    rows = [lab for lab in la if lab not in lb]
    cols = [lab for lab in lb if lab not in la]
    size = {**{lab: b.shape[lb.index(lab)] for lab in lb},
            **{lab: a.shape[la.index(lab)] for lab in la if a.shape[la.index(lab)] != 1}}
    a = tg.permute(a, *[la.index(lab) for lab in batch + rows + summed])
    b = tg.permute(b, *[lb.index(lab) for lab in batch + summed + cols])
    nb = len(batch)
    a = tg.reshape(a, (*a.shape[:nb], product(a.shape[nb:nb + len(rows)]),
                       product(a.shape[nb + len(rows):])))
    b = tg.reshape(b, (*b.shape[:nb], product(b.shape[nb:nb + len(summed)]),
                       product(b.shape[nb + len(summed):])))
    out = tg.matmul(a, b)
    labels = batch + rows + cols
    return tg.reshape(out, tuple(size[lab] for lab in labels)), labels


def _einsum_sizes(c: Ctx, equation: str, operands: list) -> None:
    """Refuse a label whose static sizes differ between operands (1 broadcasts)."""
    seen: dict = {}
    for x, labels in operands:
        for name, d in zip(labels, x.shape):
            e = seen.setdefault(name, d)
            if isinstance(d, int) and isinstance(e, int) and 1 not in (d, e) and d != e:
                raise _einsum_error(c, equation, f"label '{name}' has sizes {e} and {d}")
            if e == 1:
                seen[name] = d


def _einsum(c: Ctx):
    """numpy's einsum from transposes, diagonal masks, sums and batched matmuls, the
    operands contracted left to right, each axis summed as soon as nothing later reads it."""
    equation = c.a("equation")
    if isinstance(equation, bytes):
        equation = equation.decode()
    labels, out_labels = _einsum_terms(c, equation)
    operands = [_einsum_diagonal(c.t(i), labels[i]) for i in range(c.n)]
    _einsum_sizes(c, equation, operands)
    later = [set(out_labels)]  # what each contraction's result must keep
    for _, lab in reversed(operands[2:]):
        later.insert(0, later[0] | set(lab))
    x, lab = operands[0]
    for (y, other), keep in zip(operands[1:], later):
        x, lab = _einsum_pair(x, lab, y, other, keep)
    x, lab = _einsum_sum(x, lab, set(out_labels))
    return tg.permute(x, *[lab.index(name) for name in out_labels])


def _cumsum(c: Ctx, fn=tg.cumsum):
    x = c.t(0)
    axis = int(ints(c.s(1, "axis"))[0]) % x.ndim
    if c.a("reverse", 0):
        x = tg.slice_axis(x, axis, None, None, -1)
    out = fn(x, axis=axis)
    if c.a("exclusive", 0):  # shifted by one along the axis, the identity first
        one = tg.slice_axis(out, axis, 0, 1)
        start = tg.broadcast_to(tg.as_node(0 if fn is tg.cumsum else 1, x.dtype), *one.shape)
        out = tg.concat([start, tg.slice_axis(out, axis, 0, -1)], axis) \
            if x.shape[axis] != 0 else out
    if c.a("reverse", 0):
        out = tg.slice_axis(out, axis, None, None, -1)
    return out


def table() -> dict:
    out = {name: _unary(fn, UNARY_FOLD.get(name)) for name, fn in UNARY.items()}
    out.update({name: _binary(fn, st) for name, (fn, st) in BINARY.items()})
    out.update({
        "Mod": _mod,
        "Pow": _pow_mapped,
        "BitShift": _shift,
        "Max": _variadic(tg.maximum, np.maximum),
        "Min": _variadic(tg.minimum, np.minimum),
        "Sum": _variadic(tg.add, operator.add),
        "Mean": _mean,
        "Where": _where,
        "Cast": _cast,
        "CastLike": _cast_like,
        "Clip": _clip,
        "IsInf": _isinf,
        "ReduceSum": _reduce(tg.sum, since_input=13),
        "ReduceMean": _reduce(_mean_keeping_dtype),
        "ReduceMax": _reduce(tg.max, empty=float("-inf")),
        "ReduceMin": _reduce(tg.min, empty=float("inf")),
        "ReduceProd": _reduce_prod,
        "ReduceL1": _reduce(tg.sum, pre=tg.abs),
        "ReduceL2": _reduce(tg.sum, pre=tg.square, post=tg.sqrt),
        "ReduceSumSquare": _reduce(tg.sum, pre=tg.square),
        "ReduceLogSum": _reduce(tg.sum, post=tg.log),
        "ReduceLogSumExp": _reduce(_logsumexp, empty=float("-inf")),
        "ArgMax": _arg(tg.argmax),
        "ArgMin": _arg(tg.argmin),
        "MatMul": _matmul,
        "Einsum": _einsum,
        "Gemm": _gemm,
        "CumSum": _cumsum,
        "CumProd": lambda c: _cumsum(c, tg.cumprod),
    })
    return out


__all__ = ["table", "Static"]
