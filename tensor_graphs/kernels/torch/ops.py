"""The torch kernels: one function per op on torch tensors (see ``base.torch_kernel``).

Each function has the exact semantics of our op (its numpy reference or its decomposition);
where torch differs, the function says how it bridges the gap, and where it cannot (values
torch leaves undefined), the kernel's ``where`` constraint turns those inputs away.
"""

from __future__ import annotations

import math

from tensor_graphs.devices import torch_device
from tensor_graphs.ir.dtypes import ALL, FLOATS, INTS

# NUMBERS keeps the name NUMERIC here: the decorators below spell it, and a kernel's decorator
# text is part of its source hash (a new spelling would make every stored measurement stale)
from tensor_graphs.ir.dtypes import NUMBERS as NUMERIC
from tensor_graphs.kernels.registry import Occupancy
from tensor_graphs.kernels.torch.base import EXACT, REDUCTION, given, torch_kernel
from tensor_graphs.kernels.torch.convert import Lazy, torch_dtype

torch = Lazy("torch", globals(), "torch")
F = Lazy("torch.nn.functional", globals(), "F")


def _same_dtype(shapes, dtypes, attrs):
    return True if len(set(dtypes)) <= 1 else "inputs must share one dtype"


def _no_symbols(shapes) -> bool:
    return all(isinstance(d, int) for s in shapes for d in s)


# ---------------------------------------------------------------------------- unary atomic
@torch_kernel("neg", dtypes=NUMERIC, tolerance=EXACT, writes_out=True)
def neg(x, *, out=None):
    return torch.neg(x, out=out)


@torch_kernel("exp", writes_out=True)
def exp(x, *, out=None):
    return torch.exp(x, out=out)


@torch_kernel("log", writes_out=True)
def log(x, *, out=None):
    return torch.log(x, out=out)


@torch_kernel("sqrt", writes_out=True)
def sqrt(x, *, out=None):
    return torch.sqrt(x, out=out)


@torch_kernel("reciprocal", writes_out=True)
def reciprocal(x, *, out=None):
    return torch.reciprocal(x, out=out)


@torch_kernel("sin", writes_out=True)
def sin(x, *, out=None):
    return torch.sin(x, out=out)


@torch_kernel("erf", writes_out=True)
def erf(x, *, out=None):
    return torch.erf(x, out=out)


# ---------------------------------------------------------------------------- binary atomic
@torch_kernel("add", dtypes=("bool",) + INTS + FLOATS, writes_out=True)
def add(a, b, *, out=None):
    """a + b; logical or on bool (as our add)."""
    if a.dtype == torch.bool:
        return torch.logical_or(a, b, out=out)
    return torch.add(a, b, out=out)


@torch_kernel("mul", dtypes=("bool",) + INTS + FLOATS, writes_out=True)
def mul(a, b, *, out=None):
    """a * b; logical and on bool (as our mul)."""
    if a.dtype == torch.bool:
        return torch.logical_and(a, b, out=out)
    return torch.mul(a, b, out=out)


@torch_kernel("maximum", dtypes=ALL, tolerance=EXACT, writes_out=True)
def maximum(a, b, *, out=None):
    return torch.maximum(a, b, out=out)


@torch_kernel("pow", "pow", writes_out=True)
def pow_(a, b, *, out=None):
    return torch.pow(a, b, out=out)


@torch_kernel("equal", dtypes=ALL, tolerance=EXACT, writes_out=True)
def equal(a, b, *, out=None):
    return torch.eq(a, b, out=out)


@torch_kernel("less", dtypes=ALL, tolerance=EXACT, writes_out=True)
def less(a, b, *, out=None):
    return torch.lt(a, b, out=out)


@torch_kernel("where", dtypes=None, tolerance=EXACT, writes_out=True)
def where(cond, a, b, *, out=None):
    return torch.where(cond, a, b, out=out)


def _cast_ok(shapes, dtypes, attrs):
    src, dst = dtypes[0], attrs.get("dtype")
    if dst is None:
        return "no target dtype"
    if src.is_float and dst.is_int:
        return "float to int casts are undefined for nan, inf and out-of-range values"
    return True


@torch_kernel("cast", dtypes=None, where=_cast_ok, tolerance=1e-7, writes_out=True)
def cast(x, dtype, *, out=None):
    """Any dtype to bool (nonzero is True, nan too), int or float (rounding to nearest even);
    float to int is left out (C and torch leave nan and out-of-range values undefined)."""
    if out is not None:
        return out.copy_(x)  # the same conversion as .to
    return x.to(torch_dtype(dtype), copy=True)


# ---------------------------------------------------------------------------- reductions
def _axes(x, axis):
    """Our axis attribute (None, an int or a sorted tuple) as a tuple of dims."""
    if axis is None:
        return tuple(range(x.ndim))
    return (axis,) if isinstance(axis, int) else tuple(axis)


@torch_kernel("sum", "sum", dtypes=INTS + FLOATS, tolerance=REDUCTION, writes_out=True)
def sum_(x, axes, keepdims, *, out=None):
    """Sum in x's own dtype (ints wrap as in numpy); axes=() reduces nothing (torch's
    dim=() would reduce everything)."""
    if not axes:
        return x.clone() if out is None else out.copy_(x)
    return torch.sum(x, dim=tuple(axes), keepdim=keepdims, dtype=x.dtype, out=out)


@torch_kernel("max", "max", dtypes=ALL, tolerance=EXACT, writes_out=True)
def max_(x, axes, keepdims, *, out=None):
    """Maximum over axes; nan propagates (torch.amax)."""
    if not axes:
        return x.clone() if out is None else out.copy_(x)
    return torch.amax(x, dim=tuple(axes), keepdim=keepdims, out=out)


@torch_kernel("mean", tolerance=REDUCTION)
def mean(x, axis, keepdims):
    return torch.mean(x, dim=_axes(x, axis), keepdim=keepdims)


@torch_kernel("var", tolerance=REDUCTION)
def var(x, axis, keepdims, correction):
    return torch.var(x, dim=_axes(x, axis), correction=correction, keepdim=keepdims)


@torch_kernel("min", "min", dtypes=ALL, tolerance=EXACT)
def min_(x, axis, keepdims):
    """Minimum over axes; nan propagates (torch.amin)."""
    return torch.amin(x, dim=_axes(x, axis), keepdim=keepdims)


def _arg_extreme(x, axis, keepdims, fn, out):
    if x.dtype == torch.bool:
        x = x.to(torch.uint8)
    if axis is None:  # our reference flattens: keepdims gives shape (1,)
        return fn(x.reshape(-1), dim=0, keepdim=keepdims, out=out)
    return fn(x, dim=axis, keepdim=keepdims, out=out)


def _one_block_per_result(shapes) -> Occupancy:
    """torch's CUDA argmax/argmin reduce each result in one block: on an H200 GPT-2's 50257
    logits took 16.7 us (``kernels/triton/templates/argmax.py`` splits the row). Counted as
    results over the last axis (the shapes alone do not say the axis)."""
    x = shapes[0]
    return Occupancy(max(1, math.prod(x[:-1]) if x else 1))


# (out=: a GPU decode step chooses its token inside the CUDA graph, nn/generate.py)
@torch_kernel("argmax", dtypes=ALL, tolerance=EXACT, writes_out=True,
              cuda_occupancy=_one_block_per_result)
def argmax(x, axis, keepdims, *, out=None):
    """Index of the first maximum; the first nan counts as the maximum (as in numpy)."""
    return _arg_extreme(x, axis, keepdims, torch.argmax, out)


@torch_kernel("argmin", dtypes=ALL, tolerance=EXACT, writes_out=True,
              cuda_occupancy=_one_block_per_result)
def argmin(x, axis, keepdims, *, out=None):
    """Index of the first minimum; the first nan counts as the minimum (as in numpy)."""
    return _arg_extreme(x, axis, keepdims, torch.argmin, out)


@torch_kernel("cumsum", dtypes=INTS + FLOATS, tolerance=REDUCTION)
def cumsum(x, axis):
    """Half floats are summed in float32 and rounded once, as the reference does (CUDA's
    scan would otherwise carry a bfloat16 running sum: 1.3% error over 33 terms)."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return torch.cumsum(x, dim=axis, dtype=torch.float32).to(x.dtype)
    return torch.cumsum(x, dim=axis, dtype=x.dtype)


@torch_kernel("logsumexp", tolerance=REDUCTION)
def logsumexp(x, axis, keepdims):
    return torch.logsumexp(x, dim=_axes(x, axis), keepdim=keepdims)


@torch_kernel("softmax", tolerance=REDUCTION, writes_out=True)
def softmax(x, axis, *, out=None):
    return torch.softmax(x, dim=axis, out=out)


@torch_kernel("log_softmax", tolerance=REDUCTION, writes_out=True)
def log_softmax(x, axis, *, out=None):
    return torch.log_softmax(x, dim=axis, out=out)


# ------------------------------------------------------------------ elementwise composites
@torch_kernel("sub", dtypes=INTS + FLOATS, where=_same_dtype, writes_out=True)
def sub(a, b, *, out=None):
    return torch.sub(a, b, out=out)


@torch_kernel("div", where=_same_dtype, writes_out=True)
def div(a, b, *, out=None):
    return torch.div(a, b, out=out)


@torch_kernel("minimum", dtypes=ALL, where=_same_dtype, tolerance=EXACT, writes_out=True)
def minimum(a, b, *, out=None):
    return torch.minimum(a, b, out=out)


@torch_kernel("abs", "abs", dtypes=NUMERIC, tolerance=EXACT, writes_out=True)
def abs_(x, *, out=None):
    return torch.abs(x, out=out)


@torch_kernel("sign", dtypes=NUMERIC, tolerance=EXACT)
def sign(x):
    """-1, 0 or 1; nan stays nan (torch.sign gives 0 for nan)."""
    s = torch.sign(x)
    return torch.where(torch.isnan(x), x, s) if x.is_floating_point() else s


@torch_kernel("square", dtypes=INTS + FLOATS, writes_out=True)
def square(x, *, out=None):
    return torch.mul(x, x, out=out)


@torch_kernel("rsqrt", writes_out=True)
def rsqrt(x, *, out=None):
    return torch.rsqrt(x, out=out)


@torch_kernel("clamp")
def clamp(x, min, max):  # noqa: A002 - torch's names
    """Clip to [min, max] (either may be None); nan propagates; min > max gives max."""
    return torch.clamp(x, min=min, max=max)


@torch_kernel("relu", dtypes=NUMERIC, tolerance=EXACT)
def relu(x):
    return torch.relu(x)


@torch_kernel("sigmoid", writes_out=True)
def sigmoid(x, *, out=None):
    return torch.sigmoid(x, out=out)


@torch_kernel("tanh", writes_out=True)
def tanh(x, *, out=None):
    return torch.tanh(x, out=out)


@torch_kernel("gelu", writes_out=True)
def gelu(x, approximate, *, out=None):
    """x * Phi(x), erf form ("none") or tanh form ("tanh"), as the node says. The erf form is
    computed as x/2 * erfc(-x/sqrt 2): torch's own, x/2 * (1 + erf(x/sqrt 2)), cancels for
    x < -2 (10 ulps at -2.1 on CUDA, 0 instead of -4.5e-8 at -5.65) and gives nan at +inf.
    Half floats go through float32."""
    if approximate != "none":
        if out is None:
            return F.gelu(x, approximate=approximate)
        return torch._C._nn.gelu(x, approximate=approximate, out=out)  # F.gelu's out variant
    wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if out is None:
        return (wide * 0.5 * torch.special.erfc(wide * -math.sqrt(0.5))).to(x.dtype)
    return torch.mul(wide * 0.5, torch.special.erfc(wide * -math.sqrt(0.5)), out=out)


@torch_kernel("silu")
def silu(x):
    return F.silu(x)


@torch_kernel("elu")
def elu(x, alpha):
    return F.elu(x, alpha=alpha)


@torch_kernel("selu")
def selu(x):
    return torch.selu(x)


@torch_kernel("softplus")
def softplus(x, beta, threshold):
    return F.softplus(x, beta=beta, threshold=threshold)


@torch_kernel("logical_not", dtypes=("bool",), tolerance=EXACT, writes_out=True)
def logical_not(x, *, out=None):
    return torch.logical_not(x, out=out)


@torch_kernel("logical_and", dtypes=("bool",), tolerance=EXACT, writes_out=True)
def logical_and(a, b, *, out=None):
    return torch.logical_and(a, b, out=out)


@torch_kernel("logical_or", dtypes=("bool",), tolerance=EXACT, writes_out=True)
def logical_or(a, b, *, out=None):
    return torch.logical_or(a, b, out=out)


@torch_kernel("greater", dtypes=ALL, where=_same_dtype, tolerance=EXACT, writes_out=True)
def greater(a, b, *, out=None):
    return torch.gt(a, b, out=out)


@torch_kernel("less_equal", dtypes=ALL, where=_same_dtype, tolerance=EXACT, writes_out=True)
def less_equal(a, b, *, out=None):
    return torch.le(a, b, out=out)


@torch_kernel("greater_equal", dtypes=ALL, where=_same_dtype, tolerance=EXACT, writes_out=True)
def greater_equal(a, b, *, out=None):
    return torch.ge(a, b, out=out)


@torch_kernel("not_equal", dtypes=ALL, where=_same_dtype, tolerance=EXACT, writes_out=True)
def not_equal(a, b, *, out=None):
    return torch.ne(a, b, out=out)


@torch_kernel("isnan", dtypes=ALL, tolerance=EXACT)
def isnan(x):
    return torch.isnan(x)


# ---------------------------------------------------------------------------- movement
@torch_kernel("reshape", dtypes=ALL, contiguous=True, view=True, tolerance=EXACT)
def reshape(x, shape):
    """A view (contiguous inputs only, so it never copies)."""
    return x.view(tuple(shape))


@torch_kernel("permute", dtypes=ALL, view=True, tolerance=EXACT)
def permute(x, perm):
    return x.permute(tuple(perm))


@torch_kernel("expand", dtypes=ALL, view=True, tolerance=EXACT)
def expand(x, shape):
    return x.expand(tuple(shape))


def _positive_steps(shapes, dtypes, attrs):
    if any(s < 0 for s in attrs.get("steps", ())):
        return "negative steps (torch views have no negative strides)"
    return True


@torch_kernel("slice", "slice", dtypes=ALL, view=True, where=_positive_steps,
              tolerance=EXACT)
def slice_(x, starts, stops, steps):
    """x[start:stop:step] per axis as a view (positive steps; bounds already normalised)."""
    return x[tuple(slice(a, b, s) for a, b, s in zip(starts, stops, steps))]


@torch_kernel("pad", dtypes=ALL, tolerance=EXACT)
def pad(x, pads, value):
    """Constant padding: our pads are (before, after) per axis; F.pad wants them last axis
    first, flattened."""
    flat = [int(v) for lo_hi in reversed(pads) for v in lo_hi]
    if not any(flat):
        return x.clone()
    return F.pad(x, flat, mode="constant", value=value)


@torch_kernel("concat", dtypes=ALL, where=_same_dtype, tolerance=EXACT)
def concat(*xs, axis):
    """torch.cat of any number of tensors (variadic: concat(*xs)); always a new tensor."""
    return torch.cat(xs, dim=axis)


def _gather_ok(shapes, dtypes, attrs):
    return True if dtypes[1].is_int else "indices must be integers"


@torch_kernel("gather", dtypes=None, where=_gather_ok, tolerance=EXACT)
def gather(x, indices, axis):
    """numpy's take along one axis; an index outside [0, size) raises (IndexError)."""
    if indices.dtype not in (torch.int32, torch.int64):
        indices = indices.to(torch.int64)
    flat = torch.index_select(x, axis, indices.reshape(-1))
    return flat.reshape(x.shape[:axis] + indices.shape + x.shape[axis + 1:])


@torch_kernel("matmul", tolerance=REDUCTION, writes_out=True)
def matmul(a, b, *, out=None):
    if out is not None and min(a.ndim, b.ndim) == 1:  # torch resizes out there (deprecated)
        return out.copy_(torch.matmul(a, b))
    return torch.matmul(a, b, out=out)


def iota_cuda(length, dtype, *, out=None):
    if out is not None:
        return torch.arange(int(length), out=out)
    return torch.arange(int(length), dtype=torch_dtype(dtype), device=torch_device("cuda"))


@torch_kernel("iota", dtypes=None, tolerance=EXACT, cuda=iota_cuda, writes_out=True)
def iota(length, dtype, *, out=None):
    if out is not None:
        return torch.arange(int(length), out=out)
    return torch.arange(int(length), dtype=torch_dtype(dtype))


# ---------------------------------------------------------------------------- nn
def _norm_ok(shapes, dtypes, attrs):
    if len(set(dtypes)) > 1:
        return "x and its weight/bias must share one dtype"
    if len(shapes[0]) == 0:
        return "x needs an axis to normalise"
    return True


def _layer_norm_ok(shapes, dtypes, attrs):
    if dtypes[0].is_low_precision and shapes[0] and shapes[0][-1] == 1:
        return "a size-1 axis normalises to exactly 0; torch's half kernels leave ~1e-7 there"
    return _norm_ok(shapes, dtypes, attrs)


@torch_kernel("layer_norm", where=_layer_norm_ok, tolerance=REDUCTION, writes_out=True)
def layer_norm(x, weight, bias, eps, *, out=None):
    """Over the last axis with weight and bias (biased variance). ``out=`` gets one copy of
    F.layer_norm's result: aten's out variant (``native_layer_norm.out``) is a wrapper that
    runs the same kernel and then copies each of its three results (the rows, mean, rstd),
    three copies where this makes one (a GPU launch each: 50 of a GPT-2 decode token's ~250
    launches on an H200)."""
    y = F.layer_norm(x, x.shape[-1:], weight, bias, eps)
    return y if out is None else out.copy_(y)


@torch_kernel(given("layer_norm", "x", "weight"), "layer_norm_weight", where=_layer_norm_ok,
              tolerance=REDUCTION)
def layer_norm_weight(x, weight, eps):
    return F.layer_norm(x, x.shape[-1:], weight, None, eps)


@torch_kernel(given("layer_norm", "x", "bias"), "layer_norm_bias", where=_layer_norm_ok,
              tolerance=REDUCTION)
def layer_norm_bias(x, bias, eps):
    return F.layer_norm(x, x.shape[-1:], None, bias, eps)


@torch_kernel(given("layer_norm", "x"), "layer_norm_plain", where=_layer_norm_ok,
              tolerance=REDUCTION)
def layer_norm_plain(x, eps):
    return F.layer_norm(x, x.shape[-1:], None, None, eps)


# No CUDA twins: torch's fused CUDA rms_norm (torch 2.11 on an H100) returns a row holding one
# +inf as all NaN, where the reference gives 0 at the finite elements (x * rsqrt(inf)); the
# verifier's nonfinite case refuses it. On a GPU, RMSNorm is a generated Triton row kernel.
@torch_kernel("rms_norm", where=_norm_ok, tolerance=REDUCTION, cuda=False)
def rms_norm(x, weight, eps):
    """x / sqrt(mean(x**2) + eps) * weight over the last axis."""
    return F.rms_norm(x, x.shape[-1:], weight, eps)


@torch_kernel(given("rms_norm", "x"), "rms_norm_plain", where=_norm_ok, tolerance=REDUCTION,
              cuda=False)
def rms_norm_plain(x, eps):
    return F.rms_norm(x, x.shape[-1:], None, eps)


def _linear_ok(shapes, dtypes, attrs):
    if len(set(dtypes)) > 1:
        return "x, weight and bias must share one dtype"
    if len(shapes[1]) != 2:
        return "weight must be 2-D (out_features, in_features)"
    if len(shapes) > 2 and len(shapes[2]) != 1:
        return "bias must be 1-D (out_features,)"
    return True


@torch_kernel("linear", where=_linear_ok, tolerance=REDUCTION)
def linear(x, weight, bias):
    return F.linear(x, weight, bias)


@torch_kernel(given("linear", "x", "weight"), "linear_nobias", where=_linear_ok,
              tolerance=REDUCTION, writes_out=True)
def linear_nobias(x, weight, *, out=None):
    """x @ weight.T: what F.linear computes without a bias (aten's linear is this matmul),
    which also writes into ``out``."""
    if out is not None and x.ndim == 1:  # torch resizes out there (deprecated), as in matmul
        return out.copy_(torch.matmul(x, weight.t()))
    return torch.matmul(x, weight.t(), out=out)


def _embedding_ok(shapes, dtypes, attrs):
    return True if dtypes[0].is_int else "ids must be integers"


@torch_kernel("embedding", dtypes=None, where=_embedding_ok, tolerance=EXACT, writes_out=True)
def embedding(ids, table, *, out=None):
    """Rows of table; an id outside [0, rows) raises (IndexError). ``out=``: the rows are
    selected into it (index_select, as F.embedding does)."""
    if ids.dtype not in (torch.int32, torch.int64):
        ids = ids.to(torch.int64)
    if out is None:
        return F.embedding(ids, table)
    torch.index_select(table, 0, ids.reshape(-1), out=out.view(-1, table.shape[-1]))
    return out


def _attention_ok(shapes, dtypes, attrs):
    q, k, v = shapes[:3]
    if len({len(q), len(k), len(v)}) != 1 or len(q) not in (3, 4):
        return "q, k and v must all be (batch, heads, seq, dim) or (heads, seq, dim)"
    if q[:-3] != k[:-3] or k[:-3] != v[:-3]:
        return "q, k and v must have one batch size (no broadcasting of the batch axis)"
    if len(shapes) > 3:
        if len(shapes[3]) > len(q):
            return "attn_mask has more axes than the scores"
        if not (dtypes[3].is_bool or dtypes[3].is_float):
            return "attn_mask must be bool or float"
    if len(set(dtypes[:3])) > 1:
        return "q, k and v must share one dtype"
    hq, hkv = q[-3], k[-3]
    if isinstance(hq, int) and isinstance(hkv, int) and (hkv == 0 or hq % hkv):
        return "the query heads must be a multiple of the kv heads"
    return True


def _attention(q, k, v, mask, is_causal, scale):
    """Our sdpa through torch's: is_causal combined with a mask becomes one mask (torch
    rejects the pair), and rows with nothing to attend to give 0 (safe softmax)."""
    sq, sk = q.shape[-2], k.shape[-2]
    if mask is not None and mask.is_floating_point() and mask.dtype != q.dtype:
        mask = mask.to(q.dtype)
    empty = None  # rows that attend to nothing, broadcast against the output
    if mask is not None:
        if is_causal:
            causal = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
            mask = mask & causal if mask.dtype == torch.bool else \
                mask.masked_fill(~causal, float("-inf"))
            is_causal = False
        blocked = ~mask if mask.dtype == torch.bool else mask == float("-inf")
        empty = blocked.all(dim=-1, keepdim=True)
    gqa = q.shape[-3] != k.shape[-3]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                         scale=scale, enable_gqa=gqa)
    if empty is not None:  # (not only where empty.any(): reading that waits for the GPU)
        out = torch.where(empty, torch.zeros((), dtype=out.dtype, device=out.device), out)
    return out


@torch_kernel(given("scaled_dot_product_attention", "q", "k", "v"),
              "scaled_dot_product_attention", where=_attention_ok, tolerance=REDUCTION,
              cuda_tolerance=1e-4)
def scaled_dot_product_attention(q, k, v, is_causal, scale):
    """softmax(q k^T * scale) v, causal or not; GQA through enable_gqa."""
    return _attention(q, k, v, None, is_causal, scale)


@torch_kernel("scaled_dot_product_attention", "scaled_dot_product_attention_mask", typed=3,
              where=_attention_ok, tolerance=REDUCTION, cuda_tolerance=1e-4)
def scaled_dot_product_attention_mask(q, k, v, attn_mask, is_causal, scale):
    """With a bool (True = attend) or float (added) mask; fully masked rows give 0."""
    return _attention(q, k, v, attn_mask, is_causal, scale)


@torch_kernel("rotary_embedding", where=_same_dtype)
def rotary_embedding(x, cos, sin):
    """x * cos + rotate_half(x) * sin (Hugging Face's rotate_half convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


@torch_kernel("triu", dtypes=ALL, tolerance=EXACT)
def triu(x, diagonal):
    return torch.triu(x, diagonal)


@torch_kernel("tril", dtypes=ALL, tolerance=EXACT)
def tril(x, diagonal):
    return torch.tril(x, diagonal)


@torch_kernel("tile", dtypes=ALL, tolerance=EXACT)
def tile(x, reps):
    """numpy.tile; always a new tensor (torch.tile of all-ones reps may return x itself)."""
    reps = (reps,) if isinstance(reps, int) else tuple(reps)
    return torch.tile(x, reps).clone() if all(r == 1 for r in reps) else torch.tile(x, reps)


# ---------------------------------------------------------------------------- conv, pooling
def _conv_ok(shapes, dtypes, attrs):
    if len(set(dtypes)) > 1:
        return "x, weight and bias must share one dtype"
    return True


@torch_kernel("conv2d", where=_conv_ok, tolerance=REDUCTION, cuda_tolerance=5e-3)
def conv2d(x, weight, bias, stride, padding, dilation, groups):
    """torch's conv2d. On CUDA, float32 convolutions use TF32 under torch's default settings
    (cudnn.allow_tf32), hence the CUDA kernel's larger tolerance."""
    return F.conv2d(x, weight, bias, stride=stride, padding=padding, dilation=dilation,
                    groups=groups)


@torch_kernel(given("conv2d", "x", "weight"), "conv2d_nobias", where=_conv_ok,
              tolerance=REDUCTION, cuda_tolerance=5e-3)
def conv2d_nobias(x, weight, stride, padding, dilation, groups):
    return F.conv2d(x, weight, None, stride=stride, padding=padding, dilation=dilation,
                    groups=groups)


@torch_kernel("max_pool2d", dtypes=NUMERIC, cuda_dtypes=FLOATS, tolerance=EXACT)
def max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode):
    """Max over windows; nan propagates."""
    return F.max_pool2d(x, kernel_size, stride=stride, padding=padding, dilation=dilation,
                        ceil_mode=ceil_mode)


@torch_kernel("avg_pool2d", tolerance=REDUCTION)
def avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
               divisor_override):
    return F.avg_pool2d(x, kernel_size, stride=stride, padding=padding, ceil_mode=ceil_mode,
                        count_include_pad=count_include_pad, divisor_override=divisor_override)


@torch_kernel("adaptive_avg_pool2d", tolerance=REDUCTION)
def adaptive_avg_pool2d(x, output_size):
    return F.adaptive_avg_pool2d(x, output_size)


_LINEAR_MODES = ("linear", "bilinear", "trilinear")


def _interpolate_ok(shapes, dtypes, attrs):
    mode = attrs.get("mode")
    if mode not in ("nearest", "nearest-exact", "area"):
        return f"mode {mode!r} (torch_interpolate_linear takes the linear modes)"
    if mode.startswith("nearest") and len(shapes[0]) != 4 and dtypes[0].name != "float32":
        return "torch's float64 nearest kernels for 1-d and 3-d inputs round differently"
    return True


@torch_kernel("interpolate", where=_interpolate_ok, tolerance=REDUCTION)
def interpolate(x, size, scale_factor, mode, align_corners, recompute_scale_factor):
    """Nearest, nearest-exact and area resizing (the same source indices and windows as our
    decomposition)."""
    return F.interpolate(x, size=size, scale_factor=scale_factor, mode=mode,
                         align_corners=align_corners,
                         recompute_scale_factor=recompute_scale_factor)


LINEAR_MAX_SIZE = 2048


def _interpolate_linear_ok(shapes, dtypes, attrs):
    if attrs.get("mode") not in _LINEAR_MODES:
        return f"mode {attrs.get('mode')!r} (torch_interpolate takes it)"
    spatial = shapes[0][2:]
    if not all(isinstance(d, int) and d <= LINEAR_MAX_SIZE for d in spatial):
        return (f"spatial sizes up to {LINEAR_MAX_SIZE}: float32 source coordinates lose "
                "~2e-8 per input position, beyond the tolerance past that")
    return True


def _linear_signatures():
    """Verification cases: the generic interpolate cases are all nearest."""
    table = [((1, 2, 7, 5), dict(scale_factor=1.7, mode="bilinear")),
             ((1, 1, 33, 4), dict(size=(65, 3), mode="bilinear", align_corners=True)),
             ((2, 1, 1, 3), dict(size=(2, 7), mode="bilinear")),
             ((1, 3, 1025), dict(scale_factor=1.5, mode="linear")),
             ((1, 1, 2, 3, 4), dict(size=(3, 5, 2), mode="trilinear", align_corners=False))]
    return [{"x": (shape, dt), "attrs": attrs} for dt in FLOATS for shape, attrs in table]


@torch_kernel("interpolate", "interpolate_linear", where=_interpolate_linear_ok,
              tolerance=2e-4, signatures=_linear_signatures)
def interpolate_linear(x, size, scale_factor, mode, align_corners, recompute_scale_factor):
    """Linear, bilinear and trilinear resizing. torch computes the source coordinates in the
    input's dtype, so float32 results drift from the exact weights by ~2e-8 times the input
    size: tolerance 2e-4 up to 2048 positions per axis."""
    return F.interpolate(x, size=size, scale_factor=scale_factor, mode=mode,
                         align_corners=align_corners,
                         recompute_scale_factor=recompute_scale_factor)


def _channel_norm_ok(shapes, dtypes, attrs):
    if len(set(dtypes)) > 1:
        return "x and its parameters must share one dtype"
    return True


@torch_kernel("group_norm", where=_channel_norm_ok, tolerance=REDUCTION)
def group_norm(x, weight, bias, num_groups, eps):
    """torch.group_norm itself: F.group_norm refuses groups of one element, which normalise
    to 0 (+ bias) here."""
    return torch.group_norm(x, num_groups, weight, bias, eps)


@torch_kernel(given("group_norm", "x"), "group_norm_plain", where=_channel_norm_ok,
              tolerance=REDUCTION)
def group_norm_plain(x, num_groups, eps):
    return torch.group_norm(x, num_groups, None, None, eps)


@torch_kernel("batch_norm", where=_channel_norm_ok, tolerance=REDUCTION)
def batch_norm(x, running_mean, running_var, weight, bias, eps):
    """Inference batch norm (running statistics) over channel axis 1."""
    return F.batch_norm(x, running_mean, running_var, weight, bias, training=False, eps=eps)


@torch_kernel(given("batch_norm", "x", "running_mean", "running_var"), "batch_norm_plain",
              where=_channel_norm_ok, tolerance=REDUCTION)
def batch_norm_plain(x, running_mean, running_var, eps):
    return F.batch_norm(x, running_mean, running_var, None, None, training=False, eps=eps)


# ---------------------------------------------------------------------------- losses
@torch_kernel(given("mse_loss", "input", "target"), "mse_loss", where=_same_dtype,
              tolerance=REDUCTION)
def mse_loss(input, target, reduction):  # noqa: A002 - torch's name
    return F.mse_loss(input, target, reduction=reduction)


@torch_kernel(given("l1_loss", "input", "target"), "l1_loss", where=_same_dtype,
              tolerance=REDUCTION)
def l1_loss(input, target, reduction):  # noqa: A002 - torch's name
    return F.l1_loss(input, target, reduction=reduction)

