"""Vector-Jacobian rules: one row per atomic op (and per composite that keeps its own), as
JAX and tinygrad keep theirs beside the ops.

A rule takes the forward node ``y`` and the cotangent ``g`` of its output (same shape and
dtype) and returns one cotangent per input, or None where none flows (an index, a condition,
a piecewise-constant op). Elementwise ops broadcast implicitly, so every rule of a
broadcasting op sums its cotangents back to the input's shape (``sum_to``); expand's rule is
that sum. The rules are written with the builders, so a gradient is an ordinary graph the
planner sees like any other. ``tensor_graphs.ir.autodiff`` applies them in reverse order.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tensor_graphs.errors import ArgumentError, ShapeError
from tensor_graphs.ir import builder as tg
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops import OPS
from tensor_graphs.ir.ops.elementwise import (
    cos,
    div,
    isnan,
    logical_and,
    logical_not,
    minimum,
    rsqrt,
    sigmoid,
    sub,
)
from tensor_graphs.ir.ops.nn import _safe_softmax
from tensor_graphs.ir.ops.pointwise import trunc
from tensor_graphs.ir.ops.random import dropout_op
from tensor_graphs.ir.ops.reductions import mean, softmax
from tensor_graphs.ir.ops.selection import scatter
from tensor_graphs.ir.shapes import dims_equal, format_shape, numel

Rule = Callable[[Node, Node], tuple]


# ---------------------------------------------------------------------------- helpers
def _is_one(d) -> bool:
    return isinstance(d, int) and d == 1


def sum_to(g: Node, shape: tuple) -> Node:
    """Undo broadcasting: sum ``g`` over the leading axes it gained and over the axes where
    ``shape`` has 1 (a symbolic axis broadcasts only against 1, so those are all there are)."""
    lead = g.ndim - len(shape)
    axes = list(range(lead)) + [lead + i for i, d in enumerate(shape)
                                if _is_one(d) and not _is_one(g.shape[lead + i])]
    if axes:
        g = tg.sum(g, tuple(axes), keepdims=True)
    return tg.reshape(g, shape)


def zeros(shape: tuple, dtype) -> Node:
    """A zero tensor of a shape (an expanded 0-d constant: no memory of its size)."""
    return tg.expand(tg.constant(0.0 if dtype.is_float else 0, dtype), shape)


def _pad(g: Node, pads) -> Node:
    if all(lo == 0 and hi == 0 for lo, hi in pads):
        return g
    return Node.make(OPS["pad"], (g,), {"pads": tuple(tuple(p) for p in pads), "value": 0.0})


def _slice(g: Node, axis: int, start, stop, step: int = 1) -> Node:
    starts = [0] * g.ndim
    stops = list(g.shape)
    steps = [1] * g.ndim
    starts[axis], stops[axis], steps[axis] = start, stop, step
    if step == 1 and start == 0 and dims_equal(stop, g.shape[axis]):
        return g
    return Node.make(OPS["slice"], (g,), {"starts": tuple(starts), "stops": tuple(stops),
                                          "steps": tuple(steps)})


def _keep_shape(x: Node, axes) -> tuple:
    return tuple(1 if i in axes else d for i, d in enumerate(x.shape))


# ---------------------------------------------------------------------------- movement
def _unslice_axis(g: Node, axis: int, dim, start, step: int) -> Node:
    """The adjoint of x[start::step] on one axis: g's elements put back at their places in
    an axis of length ``dim``, zeros elsewhere (pads and a reshape, no scatter)."""
    n = g.shape[axis]
    if isinstance(n, int) and n == 0:
        return _pad(g, [(0, 0)] * axis + [(0, dim)] + [(0, 0)] * (g.ndim - axis - 1))
    if step < 0:
        if not isinstance(n, int):
            raise ShapeError(f"grad of slice: a negative step on the symbolic axis {axis} "
                             f"({n} elements) is not supported")
        g = _slice(g, axis, n - 1, -1, -1)  # reversed: the first element is the lowest place
        start, step = start - (n - 1) * -step, -step
    if step > 1:  # n * step >= dim - start > (n - 1) * step: the spread is cut to fit
        spread = tg.reshape(g, g.shape[:axis] + (n, 1) + g.shape[axis + 1:])
        spread = _pad(spread, [(0, 0)] * (axis + 1) + [(0, step - 1)]
                      + [(0, 0)] * (g.ndim - axis - 1))
        g = tg.reshape(spread, g.shape[:axis] + (n * step,) + g.shape[axis + 1:])
        n = n * step
        if not (isinstance(n, int) and isinstance(dim - start, int) and n <= dim - start):
            g, n = _slice(g, axis, 0, dim - start), dim - start
    pads = [(0, 0)] * g.ndim
    pads[axis] = (start, dim - start - n)
    return _pad(g, pads)


def _slice_rule(y: Node, g: Node):
    (x,) = y.inputs
    a = y.attrs
    for axis, (start, step) in enumerate(zip(a["starts"], a["steps"])):
        if step == 1 and start == 0 and dims_equal(y.shape[axis], x.shape[axis]):
            continue
        g = _unslice_axis(g, axis, x.shape[axis], start, step)
    return (g,)


def _pad_rule(y: Node, g: Node):
    (x,) = y.inputs
    for axis, ((lo, _hi), d) in enumerate(zip(y.attrs["pads"], x.shape)):
        g = _slice(g, axis, lo, lo + d)
    return (g,)


def _concat_rule(y: Node, g: Node):
    axis, offset, out = y.attrs["axis"], 0, []
    for x in y.inputs:
        out.append(_slice(g, axis, offset, offset + x.shape[axis]))
        offset = offset + x.shape[axis]
    return tuple(out)


def _permute_rule(y: Node, g: Node):
    perm = y.attrs["perm"]
    inverse = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
    return (tg.permute(g, inverse),)


def _gather_rule(y: Node, g: Node):
    """Scatter-add into zeros: an embedding's gradient touches only the rows it read."""
    x, idx = y.inputs
    return scatter(zeros(x.shape, x.dtype), idx, g, y.attrs["axis"], "sum"), None


# ---------------------------------------------------------------------------- reductions
def _sum_rule(y: Node, g: Node):
    (x,) = y.inputs
    keep = _keep_shape(x, y.attrs["axes"])
    return (tg.expand(tg.reshape(g, keep), x.shape),)


def _max_rule(y: Node, g: Node):
    """Ties share the cotangent evenly (torch's amax, JAX, tinygrad)."""
    (x,) = y.inputs
    keep = _keep_shape(x, y.attrs["axes"])
    hit = tg.cast(tg.equal(x, tg.reshape(y, keep)), x.dtype)
    count = tg.sum(hit, y.attrs["axes"], keepdims=True)
    return (tg.mul(hit, div(tg.reshape(g, keep), count)),)


# ---------------------------------------------------------------------------- matmul
def _matmul_rule(y: Node, g: Node):
    """ga = g @ b^T, gb = a^T @ g on the operands viewed as matrices (a vector a as a row,
    b as a column), summed over the batch axes an operand was broadcast along. A 2-D operand
    against a batched one folds the batch into the contraction, so a linear layer's weight
    gradient is one (in, rows) @ (rows, out) product, not one per batch element."""
    a, b = y.inputs
    a2 = tg.reshape(a, (1,) + a.shape) if a.ndim == 1 else a
    b2 = tg.reshape(b, b.shape + (1,)) if b.ndim == 1 else b
    g2 = g
    if a.ndim == 1:
        g2 = tg.unsqueeze(g2, -2 if b.ndim > 1 else 0)
    if b.ndim == 1:
        g2 = tg.unsqueeze(g2, -1)
    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    if b2.ndim == 2 and a2.ndim > 2:  # batch folded into the rows
        rows = g2.shape[:-1]
        a_flat = tg.reshape(a2, (numel(rows), k))
        g_flat = tg.reshape(g2, (numel(rows), n))
        gb2 = tg.matmul(tg.transpose(a_flat, 0, 1), g_flat)
    else:
        gb2 = sum_to(tg.matmul(tg.transpose(a2, -1, -2), g2), b2.shape)
    if a2.ndim == 2 and b2.ndim > 2:  # batch folded into the contraction
        batch = numel(b2.shape[:-2])
        bt = tg.reshape(tg.transpose(b2, -1, -2), (batch * n, k))
        gt = tg.permute(g2, (g2.ndim - 2,) + tuple(range(g2.ndim - 2)) + (g2.ndim - 1,))
        ga2 = tg.matmul(tg.reshape(gt, (m, batch * n)), bt)
    else:
        ga2 = sum_to(tg.matmul(g2, tg.transpose(b2, -1, -2)), a2.shape)
    return tg.reshape(ga2, a.shape), tg.reshape(gb2, b.shape)


# ---------------------------------------------------------------------------- elementwise
def _unary(fn: Callable[[Node, Node, Node], Node]) -> Rule:
    """A pointwise rule from d(out) = fn(x, y, g)."""
    return lambda y, g: (fn(y.inputs[0], y, g),)


def _binary(fa, fb) -> Rule:
    """A broadcasting binary rule: each side's cotangent summed back to its shape."""
    def rule(y: Node, g: Node):
        a, b = y.inputs
        return (None if fa is None else sum_to(fa(a, b, y, g), a.shape),
                None if fb is None else sum_to(fb(a, b, y, g), b.shape))
    return rule


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _gauss(x: Node) -> Node:
    return tg.exp(tg.neg(tg.mul(x, x)))


def _pow_base(a, b, y, g):
    """b * a**(b-1); 0 where b == 0 (torch: d/da a**0 is 0 even at a = 0)."""
    d = tg.mul(b, tg.pow(a, sub(b, 1.0)))
    return tg.mul(g, tg.where(tg.equal(b, 0.0), 0.0, d))


def _pow_exponent(a, b, y, g):
    """a**b * log(a); 0 where a == 0 and b >= 0 (torch's convention, not nan)."""
    d = tg.mul(y, tg.log(a))
    return tg.mul(g, tg.where(logical_and(tg.equal(a, 0.0), logical_not(tg.less(b, 0.0))),
                              0.0, d))


def _maximum_side(first: bool):
    """g where this side is larger, g/2 on ties (torch's maximum), 0 elsewhere: selected, not
    multiplied by a 0/1 weight, so an infinite g on the other side (sqrt's at 0, under
    sqrt(relu(x))) gives 0 here, not inf * 0 = nan, as torch's masks give."""
    def f(a, b, y, g):
        mine, other = (a, b) if first else (b, a)
        return tg.where(tg.less(other, mine), g,
                        tg.where(tg.equal(mine, other), tg.mul(g, 0.5), 0.0))
    return f


def _atan2_denominator(a, b):
    return tg.add(tg.mul(a, a), tg.mul(b, b))


def _where_rule(y: Node, g: Node):
    cond, a, b = y.inputs
    return (None, sum_to(tg.where(cond, g, 0.0), a.shape),
            sum_to(tg.where(cond, 0.0, g), b.shape))


def _cast_rule(y: Node, g: Node):
    (x,) = y.inputs
    return (tg.cast(g, x.dtype) if x.dtype.is_float else None,)


def _scatter_rule(y: Node, g: Node):
    """sum: x's cotangent passes, the updates' is gathered; amax/amin: the cotangent of a
    place is shared evenly by x and the updates equal to its result (torch's scatter_reduce)."""
    x, idx, u = y.inputs
    axis, reduce = y.attrs["axis"], y.attrs["reduce"]
    if reduce == "sum":
        return g, None, tg.gather(g, idx, axis)
    if reduce in ("amax", "amin"):
        hit_x = tg.cast(tg.equal(x, y), g.dtype)
        y_at = tg.gather(y, idx, axis)
        hit_u = tg.cast(tg.equal(u, y_at), g.dtype)
        count = tg.add(hit_x, scatter(zeros(x.shape, g.dtype), idx, hit_u, axis, "sum"))
        share = div(g, tg.maximum(count, 1.0))
        return tg.mul(hit_x, share), None, tg.mul(hit_u, tg.gather(share, idx, axis))
    raise ArgumentError(f"grad: scatter with reduce={reduce!r} ({format_shape(x.shape)} "
                        f"{x.dtype.name}) has no gradient rule; use reduce='sum', 'amax' or "
                        f"'amin', or a product of gathered values")


def _state_update_rule(y: Node, g: Node):
    """The written window's cotangent goes to the value; the rest of the old extent's to the
    old version (its overwritten places got nothing from the output)."""
    state, value = y.inputs
    axis, offset = y.attrs["axis"], y.attrs["offset"]
    end = offset + value.shape[axis]
    g_value = _slice(g, axis, offset, end)
    g_old = _slice(g, axis, 0, state.shape[axis])
    shape = [1] * state.ndim
    shape[axis] = state.shape[axis]
    pos = tg.reshape(tg.iota(state.shape[axis]), tuple(shape))
    written = logical_and(logical_not(tg.less(pos, tg.size(offset))),
                             tg.less(pos, tg.size(end)))
    return tg.where(written, 0.0, g_old), g_value


# ---------------------------------------------------------------------------- the table
#  op: its vector-Jacobian rule (y the forward node, g the output's cotangent)
VJP: dict[str, Rule] = {
    # -g
    "neg": _unary(lambda x, y, g: tg.neg(g)),
    # g * e**x, the output reused
    "exp": _unary(lambda x, y, g: tg.mul(g, y)),
    # g / x
    "log": _unary(lambda x, y, g: div(g, x)),
    # g / (2 sqrt(x)), the output reused
    "sqrt": _unary(lambda x, y, g: div(g, tg.mul(y, 2.0))),
    # -g / x**2 = -g * y * y
    "reciprocal": _unary(lambda x, y, g: tg.neg(tg.mul(g, tg.mul(y, y)))),
    # g * cos(x)
    "sin": _unary(lambda x, y, g: tg.mul(g, cos(x))),
    # g * 2/sqrt(pi) * exp(-x**2)
    "erf": _unary(lambda x, y, g: tg.mul(g, tg.mul(_gauss(x), _TWO_OVER_SQRT_PI))),
    # g / (1 + x)
    "log1p": _unary(lambda x, y, g: div(g, tg.add(x, 1.0))),
    # g * e**x = g * (y + 1)
    "expm1": _unary(lambda x, y, g: tg.mul(g, tg.add(y, 1.0))),
    # g / (x ln 2)
    "log2": _unary(lambda x, y, g: div(g, tg.mul(x, math.log(2.0)))),
    # g / (x ln 10)
    "log10": _unary(lambda x, y, g: div(g, tg.mul(x, math.log(10.0)))),
    # g * (1 + tan(x)**2), the output reused
    "tan": _unary(lambda x, y, g: tg.mul(g, tg.add(tg.mul(y, y), 1.0))),
    # -g * 2/sqrt(pi) * exp(-x**2)
    "erfc": _unary(lambda x, y, g: tg.mul(g, tg.mul(_gauss(x), -_TWO_OVER_SQRT_PI))),
    # g to both sides, summed back over broadcast axes
    "add": _binary(lambda a, b, y, g: g, lambda a, b, y, g: g),
    # g * b, g * a
    "mul": _binary(lambda a, b, y, g: tg.mul(g, b), lambda a, b, y, g: tg.mul(g, a)),
    # to the larger side; half to each on ties
    "maximum": _binary(_maximum_side(True), _maximum_side(False)),
    # b a**(b-1) and a**b log(a), with torch's zeros at b = 0 and at a = 0
    "pow": _binary(_pow_base, _pow_exponent),
    # atan2(a, b): b / (a² + b²) and -a / (a² + b²)
    "atan2": _binary(lambda a, b, y, g: div(tg.mul(g, b), _atan2_denominator(a, b)),
                     lambda a, b, y, g: div(tg.neg(tg.mul(g, a)), _atan2_denominator(a, b))),
    # a - trunc(a/b) b: 1 and -trunc(a/b) (torch's rule)
    "fmod": _binary(lambda a, b, y, g: g,
                    lambda a, b, y, g: tg.mul(g, tg.neg(trunc(div(a, b))))),
    # piecewise constant: zero almost everywhere
    "floor_divide": lambda y, g: (None, None),
    "round_half_even": lambda y, g: (None,),
    # the condition gets nothing; each branch its selected places
    "where": _where_rule,
    # float to float: the cotangent cast back (int/bool sources get none)
    "cast": _cast_rule,
    # the cotangent repeated over the reduced axes
    "sum": _sum_rule,
    # to the maxima, ties sharing evenly
    "max": _max_rule,
    # reshaped back
    "reshape": lambda y, g: (tg.reshape(g, y.inputs[0].shape),),
    # the inverse permutation
    "permute": _permute_rule,
    # a sum over the expanded axes
    "expand": lambda y, g: (sum_to(g, y.inputs[0].shape),),
    # put back with pads (a strided slice: interleaved zeros, then pads)
    "slice": _slice_rule,
    # the unpadded window
    "pad": _pad_rule,
    # one slice per operand
    "concat": _concat_rule,
    # scatter-add of the cotangent into zeros (never a one-hot); indices get none
    "gather": _gather_rule,
    # g @ b^T and a^T @ g, batch axes summed back
    "matmul": _matmul_rule,
    # the same value on the other side: placement is the planner's
    "copy_to": lambda y, g: (g,),
    # the window to the value, the rest of the old extent to the old version
    "state_update": _state_update_rule,
    # sum: pass and gather; amax/amin: shared among the ties
    "scatter": _scatter_rule,
}

#  op: why no cotangent flows through it (atomic ops, and the composite that says so)
NON_DIFFERENTIABLE: dict[str, str] = {
    "equal": "a bool result",
    "less": "a bool result",
    "argsort": "an int64 order",
    "iota": "no tensor inputs (indices)",
    "bitwise_and": "int operands only",
    "random_bits": "an int64 result (random words of an int key)",
    "stop_gradient": "the identity whose gradient is zero by definition (torch's detach)",
}


# ---------------------------------------------------------------------------- composite rules
def _given(y: Node) -> dict:
    """A composite node's tensor arguments by parameter name (absent optionals left out)."""
    present = y.attrs.get("args", y.op.params)
    return dict(zip(present, y.inputs))


def _softmax_rule(y: Node, g: Node):
    """y * (g - sum(g y)): two reductions of what the forward kept, no exp recomputed."""
    axis = y.attrs["axis"]
    return (tg.mul(y, sub(g, tg.sum(tg.mul(g, y), axis, keepdims=True))),)


def _log_softmax_rule(y: Node, g: Node):
    """g - softmax(x) * sum(g), softmax read back as exp(y)."""
    axis = y.attrs["axis"]
    return (sub(g, tg.mul(tg.exp(y), tg.sum(g, axis, keepdims=True))),)


def _norm_rule(centered: bool):
    """layer_norm (centered) and rms_norm over the last axis, from the normalised xhat and
    the reciprocal std recomputed (one reduction each), in the forward's compute dtype:
    gx = rstd * (gxh - mean(gxh) - xhat * mean(gxh * xhat)), mean(gxh) only when centered."""
    def rule(y: Node, g: Node):
        args = _given(y)
        x, w, b = args["x"], args.get("weight"), args.get("bias")
        h = x if x.dtype.is_float and not x.dtype.is_low_precision else tg.cast(x, "float32")
        eps = float(y.attrs["eps"])
        if centered:
            h = sub(h, mean(h, axis=-1, keepdims=True))
        rstd = rsqrt(tg.add(mean(tg.mul(h, h), axis=-1, keepdims=True), eps))
        xhat = tg.mul(h, rstd)
        gy = tg.cast(g, h.dtype)
        out = {}
        if b is not None:
            out["bias"] = tg.cast(sum_to(gy, (1,) * (gy.ndim - 1) + b.shape), b.dtype)
        if w is not None:
            out["weight"] = tg.cast(sum_to(tg.mul(gy, xhat), (1,) * (gy.ndim - 1) + w.shape),
                                    w.dtype)
            gy = tg.mul(gy, tg.cast(w, h.dtype))
        inner = tg.mul(xhat, mean(tg.mul(gy, xhat), axis=-1, keepdims=True))
        if centered:
            inner = tg.add(inner, mean(gy, axis=-1, keepdims=True))
        out["x"] = tg.cast(tg.mul(rstd, sub(gy, inner)), x.dtype) if x.dtype.is_float else None
        for k in ("weight", "bias"):
            if k in out:
                out[k] = tg.reshape(out[k], args[k].shape)
        return tuple(out.get(p) for p in y.attrs.get("args", y.op.params))
    return rule


# Activations whose decomposition differentiates to another value than torch's at a kink or
# a tie: their own rules are torch's (through abs's where, |x|' was 1 at 0, so softplus'(0)
# came out 0, not 1/2; relu's tie gave 1/2 at 0, torch 0; clamp's bounds 1/2, torch 1).
def _abs_rule(y: Node, g: Node):
    """g sign(x): 0 at 0 (and at nan), as torch."""
    (x,) = y.inputs
    return (tg.where(tg.less(0.0, x), g, tg.where(tg.less(x, 0.0), tg.neg(g), 0.0)),)


def _relu_rule(y: Node, g: Node):
    """g where x > 0 (torch's threshold_backward: 0 at 0)."""
    return (tg.where(tg.less(0.0, y.inputs[0]), g, 0.0),)


def _clamp_rule(y: Node, g: Node):
    """g where min <= x <= max, bounds included (torch's clamp_backward); 0 at nan."""
    (x,) = y.inputs
    lo, hi = y.attrs.get("min"), y.attrs.get("max")
    inside = logical_not(isnan(x))
    if lo is not None:
        inside = logical_and(inside, logical_not(tg.less(x, lo)))
    if hi is not None:
        inside = logical_and(inside, logical_not(tg.less(hi, x)))
    return (tg.where(inside, g, 0.0),)


def _softplus_rule(y: Node, g: Node):
    """g sigmoid(beta x), g above the threshold where softplus is x itself."""
    (x,) = y.inputs
    bx = tg.mul(x, y.attrs["beta"])
    return (tg.where(tg.less(y.attrs["threshold"], bx), g, tg.mul(g, sigmoid(bx))),)


def _elu_rule(y: Node, g: Node):
    """g where x > 0, else g alpha exp(x): alpha at 0, as torch (1 for alpha 1)."""
    (x,) = y.inputs
    below = tg.mul(g, tg.mul(tg.exp(minimum(x, 0.0)), y.attrs["alpha"]))
    return (tg.where(tg.less(0.0, x), g, below),)


def _dropout_rule(y: Node, g: Node):
    """The cotangent through the same mask, drawn again from the same key and stream (a
    fused kernel regenerates it in the pass that scales g: no mask is stored)."""
    x, key = y.inputs
    return dropout_op(g, key, p=y.attrs["p"], stream=y.attrs["stream"]), None


def _attention_rule(y: Node, g: Node):
    """FlashAttention's backward: the probabilities P recomputed from q and k (the forward
    stays one node, so a fused kernel that never stores P can run it), then
    dV = P^T dO, dS = P * (dO V^T - rowsum(dO V^T * P)), dQ = dS K * scale, dK = dS^T Q * scale,
    and a float mask's cotangent dS summed back to its shape. Grouped-query heads are viewed
    as (..., Hkv, G, Sq, D) as in the forward, so k and v's cotangents sum over the groups."""
    args = _given(y)
    q0, k0, v0, mask = args["q"], args["k"], args["v"], args.get("attn_mask")
    q, k, v = tg.promote(q0, k0, v0)
    sq, sk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    groups = 1
    if q.ndim >= 3 and k.ndim >= 3 and not dims_equal(q.shape[-3], k.shape[-3]):
        hq, hkv = q.shape[-3], k.shape[-3]
        groups = hq // hkv
    qg, kg, vg = q, k, v
    if groups > 1:
        qg = tg.reshape(q, q.shape[:-3] + (hkv, groups, sq, d))
        kg, vg = tg.unsqueeze(k, -3), tg.unsqueeze(v, -3)
    scale = y.attrs["scale"]
    factor = (1.0 / math.sqrt(d) if isinstance(d, int) else rsqrt(tg.size(d, q.dtype))) \
        if scale is None else float(scale)
    scores = tg.mul(tg.matmul(qg, tg.transpose(kg, -1, -2)), factor)
    full = scores.shape if groups == 1 else scores.shape[:-4] + (hq, sq, sk)
    scores = tg.reshape(scores, full)
    allowed = None
    if mask is not None:
        if mask.dtype.is_bool:
            allowed = mask
        else:
            scores = tg.add(scores, tg.cast(mask, scores.dtype))
    if y.attrs["is_causal"]:
        causal = logical_not(tg.less(tg.reshape(tg.iota(sq), (sq, 1)),
                                     tg.reshape(tg.iota(sk), (1, sk))))
        allowed = causal if allowed is None else logical_and(allowed, causal)
    if allowed is not None:
        scores = tg.where(allowed, scores, float("-inf"))
    probs = softmax(scores, axis=-1) if mask is None else _safe_softmax(scores)
    grouped = probs.shape if groups == 1 else probs.shape[:-3] + (hkv, groups, sq, sk)
    pg = tg.reshape(probs, grouped)
    go = tg.cast(g, q.dtype)
    if groups > 1:
        go = tg.reshape(go, go.shape[:-3] + (hkv, groups, sq, go.shape[-1]))
    dv = sum_to(tg.matmul(tg.transpose(pg, -1, -2), go), vg.shape)
    dp = tg.reshape(tg.matmul(go, tg.transpose(vg, -1, -2)), full)
    ds = tg.mul(probs, sub(dp, tg.sum(tg.mul(dp, probs), -1, keepdims=True)))
    dsg = tg.mul(tg.reshape(ds, grouped), factor)
    dq = sum_to(tg.matmul(dsg, kg), qg.shape)
    dk = sum_to(tg.matmul(tg.transpose(dsg, -1, -2), qg), kg.shape)
    out = {"q": tg.cast(tg.reshape(dq, q.shape), q0.dtype),
           "k": tg.cast(tg.reshape(dk, k.shape), k0.dtype),
           "v": tg.cast(tg.reshape(dv, v.shape), v0.dtype)}
    if mask is not None and mask.dtype.is_float:
        out["attn_mask"] = tg.cast(sum_to(ds, mask.shape), mask.dtype)
    return tuple(out.get(p) for p in y.attrs.get("args", y.op.params))


#  composite: its own rule (memory and accuracy); other composites are differentiated
#  through their decomposition
COMPOSITE_VJP: dict[str, Rule] = {
    # g sign(x), 0 at 0
    "abs": _abs_rule,
    # g where x > 0
    "relu": _relu_rule,
    # g inside [min, max], bounds included
    "clamp": _clamp_rule,
    # g sigmoid(beta x), g above the threshold
    "softplus": _softplus_rule,
    # g where x > 0, else g alpha exp(x)
    "elu": _elu_rule,
    # y * (g - sum(g * y)) from the output alone
    "softmax": _softmax_rule,
    # g - exp(y) * sum(g)
    "log_softmax": _log_softmax_rule,
    # rstd * (gxh - mean(gxh) - xhat mean(gxh xhat)); weight and bias summed over rows
    "layer_norm": _norm_rule(centered=True),
    # rstd * (gxh - xhat mean(gxh xhat)); weight summed over rows
    "rms_norm": _norm_rule(centered=False),
    # P recomputed from q, k; dV = P^T dO, dS = P (dP - rowsum(dP P)), dQ = dS K, dK = dS^T Q
    "scaled_dot_product_attention": _attention_rule,
    # the same mask regenerated from the key and stream: g / (1 - p) where kept, else 0
    "dropout": _dropout_rule,
}
