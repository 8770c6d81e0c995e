"""ONNX's neural-network ops: activations, softmax, the norms, Conv and pooling. Whole ops
(LayerNormalization, Gelu, Softmax, Conv) map to our composites so the planner can pick
fused kernels; ONNX's older forms (Softmax's 2-D coercion before opset 13) are spelled out."""

from __future__ import annotations

from tensor_graphs.frontend.onnx.common import Ctx, norm_axis, product, torch_pads
from tensor_graphs.ir import api as tg


def _f(x, v):
    return tg.as_node(float(v), x.dtype)


def _leaky(c: Ctx):
    x = c.t(0)
    return tg.where(tg.less(x, 0), tg.mul(x, _f(x, c.a("alpha", 0.01))), x)


def _prelu(c: Ctx):
    x, slope = c.t(0), c.t(1)
    return tg.where(tg.less(x, 0), tg.mul(x, slope), x)


def _elu(c: Ctx):
    return tg.elu(c.t(0), alpha=c.a("alpha", 1.0))


def _selu(c: Ctx):
    x = c.t(0)
    alpha, gamma = c.a("alpha", 1.67326319217681884765625), c.a("gamma", 1.05070102214813232421875)
    neg = tg.mul(_f(x, alpha), tg.sub(tg.exp(x), _f(x, 1.0)))
    return tg.mul(_f(x, gamma), tg.where(tg.greater(x, 0), x, neg))


def _celu(c: Ctx):
    x = c.t(0)
    alpha = c.a("alpha", 1.0)
    neg = tg.mul(_f(x, alpha), tg.sub(tg.exp(tg.div(x, _f(x, alpha))), _f(x, 1.0)))
    return tg.add(tg.maximum(x, _f(x, 0)), tg.minimum(_f(x, 0), neg))


def _hard_sigmoid(c: Ctx):
    x = c.t(0)
    y = tg.add(tg.mul(x, _f(x, c.a("alpha", 0.2))), _f(x, c.a("beta", 0.5)))
    return tg.minimum(tg.maximum(y, _f(x, 0)), _f(x, 1))


def _hard_swish(c: Ctx):
    x = c.t(0)
    y = tg.add(tg.mul(x, _f(x, 1 / 6)), _f(x, 0.5))
    return tg.mul(x, tg.minimum(tg.maximum(y, _f(x, 0)), _f(x, 1)))


def _softsign(c: Ctx):
    x = c.t(0)
    return tg.div(x, tg.add(tg.abs(x), _f(x, 1)))


def _gelu(c: Ctx):
    return tg.gelu(c.t(0), approximate=c.a("approximate", "none"))


def _mish(c: Ctx):
    x = c.t(0)
    return tg.mul(x, tg.tanh(tg.softplus(x)))


def _thresholded(c: Ctx):
    x = c.t(0)
    return tg.where(tg.greater(x, _f(x, c.a("alpha", 1.0))), x, _f(x, 0))


def _shrink(c: Ctx):
    x = c.t(0)
    lam, bias = c.a("lambd", 0.5), c.a("bias", 0.0)
    out = tg.where(tg.less(x, _f(x, -lam)), tg.add(x, _f(x, bias)), _f(x, 0))
    return tg.where(tg.greater(x, _f(x, lam)), tg.sub(x, _f(x, bias)), out)


def _softmax(fn):
    def mapped(c: Ctx):
        x = c.t(0)
        if c.opset >= 13:
            return fn(x, axis=c.a("axis", -1))
        axis = norm_axis(c.a("axis", 1), x.ndim)  # before 13: over the axes from axis, as 2-D
        lead = 1
        for d in x.shape[:axis]:
            lead = lead * d
        return tg.reshape(fn(tg.reshape(x, (lead, -1)), axis=-1), x.shape)
    return mapped


def _layer_norm(c: Ctx):
    x = c.t(0)
    axis = norm_axis(c.a("axis", -1), x.ndim)
    eps = c.a("epsilon", 1e-5)
    w = c.t(1)
    b = c.t(2) if c.has(2) else None
    if c.outputs > 1:  # the saved statistics asked for: spelled out in float32
        return _layer_norm_stats(c, x, w, b, axis, eps)
    if axis == x.ndim - 1 and w.ndim == 1:
        out = tg.layer_norm(x, w, b, eps=eps)
    else:
        keep = x.shape[:axis]
        flat = tg.reshape(x, (*keep, -1))
        out = tg.reshape(tg.layer_norm(flat, eps=eps), x.shape)
        out = tg.mul(out, w)
        if b is not None:
            out = tg.add(out, b)
    return out


def _layer_norm_stats(c: Ctx, x, w, b, axis: int, eps: float):
    """LayerNormalization with its Mean and InvStdDev outputs (computed in float32, the
    default stash_type, with the reduced axes kept)."""
    axes = tuple(range(axis, x.ndim))
    h = tg.cast(x, "float32") if x.dtype.name != "float32" else x
    mean = tg.mean(h, axis=axes, keepdims=True)
    centered = tg.sub(h, mean)
    inv = tg.rsqrt(tg.add(tg.mean(tg.mul(centered, centered), axis=axes, keepdims=True),
                          tg.as_node(float(eps), h.dtype)))
    out = tg.mul(tg.cast(tg.mul(centered, inv), x.dtype), w)
    if b is not None:
        out = tg.add(out, b)
    return out, mean, inv  # the importer keeps those the node names


def _batch_norm(c: Ctx):
    if c.a("training_mode", 0):
        raise c.refuse("training_mode=1 (import the inference graph)")
    x, scale, bias, mean, var = (c.t(i) for i in range(5))
    return tg.batch_norm(x, mean, var, scale, bias, eps=c.a("epsilon", 1e-5))


def _instance_norm(c: Ctx):
    x, scale, bias = c.t(0), c.t(1), c.t(2)
    axes = tuple(range(2, x.ndim))
    centered = tg.sub(x, tg.mean(x, axis=axes, keepdims=True))
    var = tg.mean(tg.mul(centered, centered), axis=axes, keepdims=True)
    y = tg.mul(centered, tg.rsqrt(tg.add(var, _f(x, c.a("epsilon", 1e-5)))))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return tg.add(tg.mul(y, tg.reshape(scale, shape)), tg.reshape(bias, shape))


def _spatial(c: Ctx, x, kernel):
    """Pads (begin..., end...), strides and dilations of a 2-D window op, auto_pad resolved."""
    n = len(kernel)
    strides = list(c.a("strides", [1] * n))
    dil = list(c.a("dilations", [1] * n))
    pads = list(c.a("pads", [0] * (2 * n)))
    auto = c.a("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * n)
        for i in range(n):
            size = x.shape[2 + i]
            out = -(-size // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - size)
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            pads[i], pads[i + n] = lo, total - lo
    elif auto == "VALID":
        pads = [0] * (2 * n)
    return pads, strides, dil


def _to_2d(x):
    """A 1-D window op's input (N, C, L) as (N, C, 1, L)."""
    return tg.unsqueeze(x, 2)


def _conv(c: Ctx):
    x, w = c.t(0), c.t(1)
    b = c.t(2) if c.has(2) else None
    kernel = list(c.a("kernel_shape", w.shape[2:]))
    pads, strides, dil = _spatial(c, x, kernel)
    return _convolve(c, x, w, b, pads, strides, dil, c.a("group", 1))


def _convolve(c: Ctx, x, w, b, pads, strides, dil, groups):
    """An N-D convolution with ONNX's (begin..., end...) pads on our 2-D composite: 1-D
    through a unit axis, 3-D as a sum of 2-D ones over the kernel's depth (``_conv3d``);
    uneven pads are made explicit first."""
    n = w.ndim - 2
    if n not in (1, 2, 3):
        raise c.refuse(f"a {n}-D convolution (1-D, 2-D and 3-D are mapped)")
    if n == 1:
        out = _convolve(c, _to_2d(x), _to_2d(w), b, [0, pads[0], 0, pads[1]],
                        [1, strides[0]], [1, dil[0]], groups)
        return tg.squeeze(out, 2)
    if n == 3 or pads[:n] != pads[n:]:
        x = tg.pad(x, torch_pads(pads))
        pads = [0] * (2 * n)
    if n == 3:
        return _conv3d(c, x, w, b, strides, dil, groups)
    return tg.conv2d(x, w, b, stride=tuple(strides), padding=tuple(pads[:2]),
                     dilation=tuple(dil), groups=groups)


def _conv3d(c: Ctx, x, w, b, strides, dil, groups):
    """A 3-D convolution of an already padded input: for each kernel depth offset, the
    input's depth slices that offset meets, folded into the batch, through one 2-D
    convolution with that kernel plane; the planes' results summed."""
    batch, ch, depth, h, wd = x.shape
    kd = w.shape[2]
    if not isinstance(depth, int):
        raise c.refuse(f"a 3-D convolution over the symbolic depth {depth} of {x.shape}; "
                       "export the model with a static depth")
    od = (depth - dil[0] * (kd - 1) - 1) // strides[0] + 1
    total = None
    for k in range(kd):
        start = k * dil[0]
        planes = tg.slice_axis(x, 2, start, start + (od - 1) * strides[0] + 1, strides[0])
        planes = tg.reshape(tg.permute(planes, 0, 2, 1, 3, 4), (batch * od, ch, h, wd))
        kernel = tg.squeeze(tg.slice_axis(w, 2, k, k + 1), 2)
        y = tg.conv2d(planes, kernel, stride=tuple(strides[1:]), dilation=tuple(dil[1:]),
                      groups=groups)
        total = y if total is None else tg.add(total, y)
    out = tg.permute(tg.reshape(total, (batch, od, *total.shape[1:])), 0, 2, 1, 3, 4)
    return out if b is None else tg.add(out, tg.reshape(b, (-1, 1, 1, 1)))


def _transpose_pads(target, sizes, strides, extra, k, dil, auto: str, at_least=None) -> list:
    """ConvTranspose's pads for an output of ``target`` sizes (its ``output_shape``, or the
    input's times the stride under SAME_*; the pads attribute is then ignored): the full
    output's excess over the target, cut at both ends, the larger half at the start unless
    auto_pad is SAME_UPPER, as ONNX's spec and ONNX Runtime cut it (cut at the end only,
    every output pixel was shifted by one). ``at_least``: the least excess (0 for an
    output_shape, whose longer output is padded with zeros at the end afterwards)."""
    n = len(sizes)
    total = [strides[i] * (sizes[i] - 1) + extra[i] + (k[i] - 1) * dil[i] + 1 - target[-n + i]
             for i in range(n)]
    total = total if at_least is None else [max(at_least, t) for t in total]
    low = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
    return low + [t - lo for t, lo in zip(total, low)]


def _conv_transpose(c: Ctx):
    """The gradient of a convolution as one: the input spread by the stride (zeros between),
    padded by the dilated kernel less the pads, convolved with the flipped kernel whose
    in and out channels swap within each group; 1-D to 3-D alike."""
    x, w = c.t(0), c.t(1)
    b = c.t(2) if c.has(2) else None
    k = list(c.a("kernel_shape", w.shape[2:]))
    n = len(k)
    sizes = list(x.shape[2:])
    strides = list(c.a("strides", [1] * n))
    dil = list(c.a("dilations", [1] * n))
    extra = list(c.a("output_padding", [0] * n))[:n]
    want = c.a("output_shape")
    want = list(want)[-n:] if want else None
    pads, auto = c.a("pads"), c.a("auto_pad", "NOTSET")
    if want:
        pads = _transpose_pads(want, sizes, strides, extra, k, dil, auto, at_least=0)
    elif pads is None and auto not in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * n)
    elif pads is None:
        pads = _transpose_pads([sizes[i] * strides[i] for i in range(n)], sizes, strides,
                               extra, k, dil, auto)
    for i in range(n):
        x = _spread(x, 2 + i, strides[i])
    edge = [dil[i] * (k[i] - 1) for i in range(n)]
    inner = [edge[i] - pads[i] for i in range(n)] + \
        [edge[i] - pads[i + n] + extra[i] for i in range(n)]
    groups = c.a("group", 1)
    cin, per = w.shape[0], w.shape[1]
    kernel = tg.reshape(w, (groups, cin // groups, per, *k))
    kernel = tg.reshape(tg.permute(kernel, 0, 2, 1, *range(3, 3 + n)),
                        (groups * per, cin // groups, *k))
    for i in range(n):
        kernel = tg.slice_axis(kernel, 2 + i, None, None, -1)
    out = _convolve(c, tg.pad(x, torch_pads(inner)), kernel, b, [0] * (2 * n), [1] * n, dil,
                    groups)
    if want:  # an output_shape beyond what the pads give: zeros after (or cut)
        have = out.shape[2:]
        out = tg.pad(out, torch_pads([0] * n + [want[i] - have[i] for i in range(n)]))
    return out


def _spread(x, axis: int, stride: int):
    """``x`` with ``stride - 1`` zeros between its elements along ``axis``."""
    if stride == 1:
        return x
    shape = tuple(x.shape)
    size = shape[axis]
    y = tg.unsqueeze(x, axis + 1)
    y = tg.pad(y, [0, 0] * (x.ndim - 1 - axis) + [0, stride - 1])
    y = tg.reshape(y, (*shape[:axis], size * stride, *shape[axis + 1:]))
    return tg.slice_axis(y, axis, 0, (size - 1) * stride + 1)


def _pool(maximum: bool):
    def mapped(c: Ctx):
        x = c.t(0)
        kernel = list(c.a("kernel_shape"))
        if len(kernel) not in (1, 2):
            raise c.refuse(f"a {len(kernel)}-D window (1-D and 2-D are mapped)")
        pads, strides, dil = _spatial(c, x, kernel)
        one = len(kernel) == 1
        if one:
            x = _to_2d(x)
            kernel, pads, strides, dil = [1, kernel[0]], [0, pads[0], 0, pads[1]], \
                [1, strides[0]], [1, dil[0]]
        ceil = bool(c.a("ceil_mode", 0))
        # torch's pooling pads at most half a window, evenly; other pads are made explicit
        inside = pads[0] == pads[2] and pads[1] == pads[3] and all(
            2 * pads[i] <= (kernel[i] - 1) * dil[i] + 1 for i in range(2))
        explicit = torch_pads(pads)
        window = {"kernel_size": tuple(kernel), "stride": tuple(strides), "ceil_mode": ceil}
        if maximum:
            out = _max_pool(c, x, pads if inside else None, explicit, dil, window)
        else:
            if any(d != 1 for d in dil):
                raise c.refuse("dilations in AveragePool")
            counted = bool(c.a("count_include_pad", 0))
            if inside:
                out = tg.avg_pool2d(x, padding=(pads[0], pads[1]), count_include_pad=counted,
                                    **window)
            elif ceil:
                raise c.refuse(f"pads {pads} with ceil_mode=1")
            else:  # the mean of the zero-padded windows, over the real elements counted
                out = tg.avg_pool2d(tg.pad(x, explicit), **window)
                if not counted:
                    ones = tg.pad(tg.broadcast_to(tg.as_node(1.0, x.dtype), 1, 1, *x.shape[2:]),
                                  explicit)
                    out = tg.div(out, tg.avg_pool2d(ones, **window))
        if isinstance(out, tuple):  # MaxPool's values and Indices
            return tuple(tg.squeeze(o, 2) for o in out) if one else out
        return tg.squeeze(out, 2) if one else out
    return mapped


def _max_pool(c: Ctx, x, pads, explicit, dil, window):
    """MaxPool on max_pool2d, its pads torch's (``pads``, at most half a window, even) or
    made explicit with -inf (``pads`` None); with its Indices output where the node names
    it (``_flat_indices``)."""
    plane = x.shape[2:]
    if pads is None:
        x = tg.pad(x, explicit, float("-inf"))
    geometry = {"padding": tuple(pads[:2]) if pads else (0, 0), "dilation": tuple(dil), **window}
    out = tg.max_pool2d(x, **geometry)
    if c.outputs < 2:
        return out
    at = tg.max_pool2d_indices(x, **geometry)
    return out, _flat_indices(c, at, plane, x.shape[3], explicit if pads is None else None)


def _flat_indices(c: Ctx, at, plane, width: int, explicit):
    """ONNX's Indices from max_pool2d_indices' place ``at`` in the pooled (H, W) plane, of
    ``width`` columns (the plane padded by ``explicit``, tg.pad's order, where the pads
    were made explicit): the place in the input's own plane, row-major (storage_order 0)
    or column-major (1), offset by (n * C + c) * H * W to index the whole input."""
    h, w = plane
    order = c.a("storage_order", 0)
    if explicit or order:
        top, left = (explicit[2], explicit[0]) if explicit else (0, 0)
        row = tg.sub(tg.floor_divide(at, width), top)
        col = tg.sub(tg.remainder(at, width), left)
        at = tg.add(tg.mul(col, h), row) if order else tg.add(tg.mul(row, w), col)
    batch, ch = at.shape[:2]
    planes = tg.reshape(tg.iota(product([batch, ch])), (batch, ch, 1, 1))
    return tg.add(at, tg.mul(planes, tg.size(h * w)))


def _lp_pool(c: Ctx):
    """(sum of |x|^p over each window)^(1/p): the mean pool of the zero-padded |x|^p times
    the window's size."""
    x = c.t(0)
    kernel = list(c.a("kernel_shape"))
    if len(kernel) not in (1, 2):
        raise c.refuse(f"a {len(kernel)}-D window (1-D and 2-D are mapped)")
    pads, strides, dil = _spatial(c, x, kernel)
    if any(d != 1 for d in dil) or c.a("ceil_mode", 0):
        raise c.refuse("dilations or ceil_mode in LpPool")
    one = len(kernel) == 1
    if one:
        x = _to_2d(x)
        kernel, pads, strides = [1, kernel[0]], [0, pads[0], 0, pads[1]], [1, strides[0]]
    p = float(c.a("p", 2))
    powered = tg.pow(tg.abs(x), _f(x, p))
    powered = tg.pad(powered, torch_pads(pads))
    mean = tg.avg_pool2d(powered, kernel_size=tuple(kernel), stride=tuple(strides))
    out = tg.pow(tg.mul(mean, _f(x, kernel[0] * kernel[1])), _f(x, 1 / p))
    return tg.squeeze(out, 2) if one else out


def _global(fn):
    def mapped(c: Ctx):
        x = c.t(0)
        return fn(x, axis=tuple(range(2, x.ndim)), keepdims=True)
    return mapped


def _rms_norm(c: Ctx):
    x = c.t(0)
    axis = norm_axis(c.a("axis", -1), x.ndim)
    eps = c.a("epsilon", 1e-5)
    w = c.t(1)
    if axis == x.ndim - 1 and w.ndim == 1:
        return tg.rms_norm(x, w, eps=eps)
    flat = tg.reshape(x, (*x.shape[:axis], -1))
    return tg.mul(tg.reshape(tg.rms_norm(flat, eps=eps), x.shape), w)


def _swish(c: Ctx):
    x = c.t(0)
    return tg.mul(x, tg.sigmoid(tg.mul(x, _f(x, c.a("alpha", 1.0)))))


def _swiglu(c: Ctx):
    a, b = c.t(0), c.t(1)
    return tg.mul(tg.mul(a, tg.sigmoid(tg.mul(a, _f(a, c.a("alpha", 1.0))))), b)


def _hardmax(c: Ctx):
    x = c.t(0)
    axis = norm_axis(c.a("axis", -1 if c.opset >= 13 else 1), x.ndim)
    if c.opset < 13:  # before 13: over the axes from axis, as 2-D
        lead = 1
        for d in x.shape[:axis]:
            lead = lead * d
        flat = tg.reshape(x, (lead, -1))
        return tg.reshape(_one_hot_max(flat, 1), x.shape)
    return _one_hot_max(x, axis)


def _one_hot_max(x, axis: int):
    """1 at the first largest element along ``axis``, 0 elsewhere."""
    first = tg.argmax(x, axis=axis, keepdims=True)
    positions = tg.reshape(tg.iota(x.shape[axis]),
                           tuple(-1 if a == axis else 1 for a in range(x.ndim)))
    return tg.cast(tg.equal(positions, first), x.dtype)


def _lp_norm(c: Ctx):
    x = c.t(0)
    axis, p = c.a("axis", -1), c.a("p", 2)
    if p == 1:
        norm = tg.sum(tg.abs(x), axis, keepdims=True)
    elif p == 2:
        norm = tg.sqrt(tg.sum(tg.square(x), axis, keepdims=True))
    else:
        raise c.refuse(f"p={p} (1 and 2 are defined)")
    zero = tg.equal(norm, _f(x, 0))  # ONNX's reference: a zero vector stays zero
    return tg.where(zero, _f(x, 0), tg.div(x, tg.where(zero, _f(x, 1), norm)))


def _group_norm(c: Ctx):
    if c.opset < 21:
        raise c.refuse("opset 18's per-group scale and bias (opset 21 takes them per channel)")
    x = c.t(0)
    return tg.group_norm(x, c.t(1), c.t(2), num_groups=c.a("num_groups"),
                         eps=c.a("epsilon", 1e-5))


def _mvn(c: Ctx):
    x = c.t(0)
    axes = tuple(c.a("axes", [0, 2, 3]))
    centered = tg.sub(x, tg.mean(x, axis=axes, keepdims=True))
    var = tg.mean(tg.mul(centered, centered), axis=axes, keepdims=True)
    return tg.div(centered, tg.add(tg.sqrt(var), _f(x, 1e-9)))


def table() -> dict:
    return {
        "Relu": lambda c: tg.relu(c.t(0)),
        "LeakyRelu": _leaky, "PRelu": _prelu, "Elu": _elu, "Selu": _selu, "Celu": _celu,
        "HardSigmoid": _hard_sigmoid, "HardSwish": _hard_swish,
        "Softplus": lambda c: tg.softplus(c.t(0)), "Softsign": _softsign, "Gelu": _gelu,
        "Mish": _mish, "ThresholdedRelu": _thresholded, "Shrink": _shrink,
        "Softmax": _softmax(tg.softmax), "LogSoftmax": _softmax(tg.log_softmax),
        "LayerNormalization": _layer_norm, "BatchNormalization": _batch_norm,
        "InstanceNormalization": _instance_norm, "Conv": _conv,
        "ConvTranspose": _conv_transpose, "LpPool": _lp_pool,
        "MaxPool": _pool(maximum=True), "AveragePool": _pool(maximum=False),
        "GlobalAveragePool": _global(tg.mean), "GlobalMaxPool": _global(tg.max),
        "RMSNormalization": _rms_norm, "Swish": _swish, "SwiGLU": _swiglu, "Hardmax": _hardmax,
        "LpNormalization": _lp_norm, "GroupNormalization": _group_norm,
        "MeanVarianceNormalization": _mvn,
    }


__all__ = ["table"]
