"""ONNX's neural-network ops: activations, softmax, the norms, Conv and pooling. Whole ops
(LayerNormalization, Gelu, Softmax, Conv) map to our composites so the planner can pick
fused kernels; ONNX's older forms (Softmax's 2-D coercion before opset 13) are spelled out."""

from __future__ import annotations

import numpy as np

from tensor_graphs.frontend.onnx.common import Ctx, norm_axis, product, torch_pads
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.ops.conv import strided_windows, unfolded_conv


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
    mean, centered, var = _moments(h, axes)
    inv = tg.rsqrt(tg.add(var, tg.as_node(float(eps), h.dtype)))
    out = tg.mul(tg.cast(tg.mul(centered, inv), x.dtype), w)
    if b is not None:
        out = tg.add(out, b)
    return out, mean, inv  # the importer keeps those the node names


def _batch_norm(c: Ctx):
    x, scale, bias, mean, var = (c.t(i) for i in range(5))
    eps = c.a("epsilon", 1e-5)
    if c.opset >= 14 and c.a("training_mode", 0):
        return _batch_norm_training(c, x, scale, bias, mean, var, eps)
    if c.opset < 14 and c.outputs > 1:
        raise c.refuse(f"{c.outputs} outputs: before opset 14 the training outputs (mean, "
                       "var, saved_mean, saved_var) are asked so, and ONNX leaves the saved "
                       "statistics unspecified; export at opset 14 or later (training_mode=1)"
                       " or import the inference graph")
    return tg.batch_norm(x, mean, var, scale, bias, eps=eps)


def _batch_norm_training(c: Ctx, x, scale, bias, mean, var, eps: float):
    """training_mode=1: Y normalized by the batch's own mean and population variance (over
    every axis but the channels, in float32 as ONNX computes them for float16; Y in x's
    dtype), and the running statistics moved toward those by 1 - momentum: Y,
    running_mean, running_var."""
    axes = (0, *range(2, x.ndim))
    h = x if x.dtype.name in ("float32", "float64") else tg.cast(x, "float32")
    mean_kept, _, var_kept = _moments(h, axes)
    batch_mean, batch_var = tg.reshape(mean_kept, (-1,)), tg.reshape(var_kept, (-1,))
    y = tg.cast(tg.batch_norm(h, batch_mean, batch_var, scale, bias, eps=eps), x.dtype)
    momentum = c.a("momentum", 0.9)

    def moved(running, current):  # in the running statistics' own dtype (ONNX's U)
        current = tg.cast(current, running.dtype)
        return tg.add(tg.mul(running, _f(running, momentum)),
                      tg.mul(current, _f(current, 1 - momentum)))
    return y, moved(mean, batch_mean), moved(var, batch_var)


def _moments(x, axes):
    """The mean of ``x`` over ``axes`` (kept), ``x`` less it, and the population variance:
    what the norms share."""
    mean = tg.mean(x, axis=axes, keepdims=True)
    centered = tg.sub(x, mean)
    return mean, centered, tg.mean(tg.mul(centered, centered), axis=axes, keepdims=True)


def _instance_norm(c: Ctx):
    x, scale, bias = c.t(0), c.t(1), c.t(2)
    axes = tuple(range(2, x.ndim))
    _, centered, var = _moments(x, axes)
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
    """An N-D convolution with ONNX's (begin..., end...) pads on our conv2d and conv3d
    composites (1-D through a unit axis; symbolic spatial dims: ``unfolded_conv``); uneven
    pads are made explicit first."""
    n = w.ndim - 2
    if n not in (1, 2, 3):
        raise c.refuse(f"a {n}-D convolution (1-D, 2-D and 3-D are mapped)")
    if not _static_plane(x):
        return unfolded_conv(tg.pad(x, torch_pads(pads)), w, b, strides, dil, groups)
    if n == 1:
        out = _convolve(c, _to_2d(x), _to_2d(w), b, [0, pads[0], 0, pads[1]],
                        [1, strides[0]], [1, dil[0]], groups)
        return tg.squeeze(out, 2)
    if n == 3 or pads[:n] != pads[n:]:
        x = tg.pad(x, torch_pads(pads))
        pads = [0] * (2 * n)
    if n == 3:
        return tg.conv3d(x, w, b, stride=tuple(strides), dilation=tuple(dil), groups=groups)
    return tg.conv2d(x, w, b, stride=tuple(strides), padding=tuple(pads[:2]),
                     dilation=tuple(dil), groups=groups)


def _static_plane(x) -> bool:
    """Whether ``x``'s spatial dims (after batch and channels) are all known ints: our
    conv2d and pooling composites compute their window positions from concrete sizes."""
    return all(isinstance(d, int) for d in x.shape[2:])


def _depth_planes(x, start: int, count: int, stride: int):
    """``count`` depth slices of (N, C, D, H, W) from ``start`` by ``stride``, folded into
    the batch, (N * count, C, H, W): one 2-D op then serves every slice."""
    batch, ch, _, h, w = x.shape
    planes = tg.slice_axis(x, 2, start, start + (count - 1) * stride + 1, stride)
    return tg.reshape(tg.permute(planes, 0, 2, 1, 3, 4), (batch * count, ch, h, w))


def _unfold_depth(y, batch, count: int):
    """A 2-D op's (N * count, C, H, W) result over ``_depth_planes`` as (N, C, count, H, W)."""
    return tg.permute(tg.reshape(y, (batch, count, *y.shape[1:])), 0, 2, 1, 3, 4)


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


def _window(c: Ctx, x):
    """A pooling node's kernel, pads (begin..., end...), strides and dilations; windows of
    1 to 3 axes are mapped, a 3-D one over a static depth (it is unrolled at import)."""
    kernel = list(c.a("kernel_shape"))
    if len(kernel) not in (1, 2, 3):
        raise c.refuse(f"a {len(kernel)}-D window over {x.shape} (1-D, 2-D and 3-D are "
                       "mapped)")
    if len(kernel) == 3 and not isinstance(x.shape[2], int):
        raise c.refuse(f"a 3-D window over the symbolic depth {x.shape[2]} of {x.shape}; "
                       "export the model with a static depth")
    pads, strides, dil = _spatial(c, x, kernel)
    if c.a("ceil_mode", 0):  # without it, such a window leaves no output: invalid ONNX
        kernel = _fitted(x, kernel, pads, dil)
    return kernel, pads, strides, dil


def _fitted(x, kernel, pads, dil) -> list:
    """``kernel`` cut, on each static axis where one undilated window spans past the padded
    input, to that input: it covers the same cells, and the pooling composites refuse a
    window larger than their input. EfficientNet's pooler (a window of 1280 over a 7 x 7
    plane, ceil_mode=1) is one: ceil_mode keeps that single window, whose cells past the
    pads ONNX neither reads nor counts."""
    n = len(kernel)
    out = list(kernel)
    for i in range(n):
        size = x.shape[2 + i]
        if isinstance(size, int) and dil[i] == 1 and kernel[i] > size + pads[i] + pads[i + n]:
            out[i] = size + pads[i] + pads[i + n]
    return out


def _pool(maximum: bool):
    def mapped(c: Ctx):
        x = c.t(0)
        geometry = _window(c, x)
        return _max_pool_nd(c, x, *geometry) if maximum else _average_pool(c, x, *geometry)
    return mapped


def _as_2d(kernel, pads, strides, dil):
    """A 1-D window's geometry as a 2-D one over a unit height (``_to_2d``'s input)."""
    return [1, kernel[0]], [0, pads[0], 0, pads[1]], [1, strides[0]], [1, dil[0]]


def _torch_pads(kernel, pads, dil) -> bool:
    """Whether torch's 2-D pooling takes these pads itself: even, at most half a window."""
    return pads[0] == pads[2] and pads[1] == pads[3] and all(
        2 * pads[i] <= (kernel[i] - 1) * dil[i] + 1 for i in range(2))


def _ceil_pads(c: Ctx, x, kernel, pads, strides, dil) -> list:
    """``pads`` with, under ceil_mode=1, each axis' end padded further so its last partial
    window fits: ONNX's output size ceil((L + pads - span) / stride) + 1, one less where
    that window would start past the input and its begin pad (ONNX Runtime's and torch's
    rule). The sizes must be known to count the windows."""
    if not c.a("ceil_mode", 0):
        return list(pads)
    n = len(kernel)
    out = list(pads)
    for i in range(n):
        size = x.shape[2 + i]
        if not isinstance(size, int):
            raise c.refuse(f"ceil_mode=1 over the symbolic spatial dim {size} of {x.shape}; "
                           "export the model with static spatial dims, or ceil_mode=0")
        span = (kernel[i] - 1) * dil[i] + 1
        full = size + pads[i] + pads[i + n]
        count = -(-(full - span) // strides[i]) + 1
        if (count - 1) * strides[i] >= size + pads[i]:
            count -= 1
        out[i + n] += max(0, (count - 1) * strides[i] + span - full)
    return out


def _window_sum(c: Ctx, x, kernel, pads, strides, dil):
    """The sum of each (dilated) window of ``x`` zero-padded by ``pads`` (begin..., end...),
    1-D to 3-D: a convolution with a kernel of ones, the channels folded into the batch so
    one single-channel kernel serves them all."""
    batch, ch = x.shape[:2]
    flat = tg.reshape(x, (product([batch, ch]), 1, *x.shape[2:]))
    ones = tg.broadcast_to(tg.as_node(1.0, x.dtype), 1, 1, *kernel)
    out = _convolve(c, flat, ones, None, pads, strides, dil, 1)
    return tg.reshape(out, (batch, ch, *out.shape[2:]))


def _average_pool(c: Ctx, x, kernel, pads, strides, dil):
    """AveragePool: torch's avg_pool2d where it computes the same (``_torch_average``);
    otherwise the window sums (``_window_sum``) over the elements each window counts: the
    input's (count_include_pad=0), or also the declared pads', never the cells ceil_mode
    adds past them (as ONNX Runtime counts)."""
    counted = bool(c.a("count_include_pad", 0))
    out = _torch_average(c, x, kernel, pads, strides, dil, counted)
    if out is not None:
        return out
    n = len(kernel)
    full = _ceil_pads(c, x, kernel, pads, strides, dil)
    total = _window_sum(c, x, kernel, full, strides, dil)
    mask = tg.broadcast_to(tg.as_node(1.0, x.dtype), 1, 1, *x.shape[2:])
    if counted:  # the declared pads count: ones there, zeros only past them
        mask = tg.pad(mask, torch_pads(pads), 1.0)
        full = [0] * n + [full[i + n] - pads[i + n] for i in range(n)]
    divisor = _window_sum(c, mask, kernel, full, strides, dil)
    return tg.div(total, tg.maximum(divisor, _f(x, 1)))  # a window in the pads only: 0


def _torch_average(c: Ctx, x, kernel, pads, strides, dil, counted: bool):
    """AveragePool on the avg_pool2d composite (its fused kernels) where that computes
    ONNX's: 1-D or 2-D, undilated, pads torch takes, static sizes; None elsewhere."""
    if len(kernel) == 3 or any(d != 1 for d in dil) or not _static_plane(x):
        return None
    one = len(kernel) == 1
    if one:
        kernel, pads, strides, dil = _as_2d(kernel, pads, strides, dil)
    if not _torch_pads(kernel, pads, dil):
        return None
    out = tg.avg_pool2d(_to_2d(x) if one else x, kernel_size=tuple(kernel),
                        stride=tuple(strides), padding=(pads[0], pads[1]),
                        ceil_mode=bool(c.a("ceil_mode", 0)), count_include_pad=counted)
    return tg.squeeze(out, 2) if one else out


def _max_pool_nd(c: Ctx, x, kernel, pads, strides, dil):
    """MaxPool 1-D to 3-D, with its Indices output where the node names it: 1-D through a
    unit height, 3-D as 2-D pools over the depth (``_max_pool3d``)."""
    if len(kernel) == 3:
        return _max_pool3d(c, x, kernel, pads, strides, dil)
    if not _static_plane(x):
        return _max_pool_unfolded(c, x, kernel, pads, strides, dil)
    one = len(kernel) == 1
    if one:
        x = _to_2d(x)
        kernel, pads, strides, dil = _as_2d(kernel, pads, strides, dil)
    out, place = _max_pool2d(c, x, kernel, pads, strides, dil, c.outputs > 1)
    if place is not None:
        out = (out, _flat_indices(c, place, x.shape[2:]))
        return tuple(tg.squeeze(o, 2) for o in out) if one else out
    return tg.squeeze(out, 2) if one else out


def _max_pool_unfolded(c: Ctx, x, kernel, pads, strides, dil):
    """MaxPool over symbolic spatial dims, which max_pool2d refuses: the input padded with
    -inf (ceil_mode's cells too, where the sizes allow counting them), the maximum over its
    windows (``strided_windows``)."""
    if c.outputs > 1:
        raise c.refuse(f"the Indices output over the symbolic spatial dims of {x.shape}; "
                       "export the model with static spatial dims, or without the indices")
    x = tg.pad(x, torch_pads(_ceil_pads(c, x, kernel, pads, strides, dil)), float("-inf"))
    return tg.max(strided_windows(x, kernel, strides, dil), axis=2)


def _max_pool2d(c: Ctx, x, kernel, pads, strides, dil, indices: bool):
    """MaxPool over (N, C, H, W) on max_pool2d: its pads torch's where it takes them,
    else made explicit with -inf (ceil_mode's extra cells too, counted by ONNX's rule,
    which torch's differs from over uneven pads). Returns the maxima and, with ``indices``,
    the place h * W + w of each in the input's own plane (else None)."""
    plane_width = x.shape[3]
    inside = _torch_pads(kernel, pads, dil)
    if not inside:
        x = tg.pad(x, torch_pads(_ceil_pads(c, x, kernel, pads, strides, dil)),
                   float("-inf"))
    geometry = {"kernel_size": tuple(kernel), "stride": tuple(strides),
                "padding": tuple(pads[:2]) if inside else (0, 0), "dilation": tuple(dil),
                "ceil_mode": inside and bool(c.a("ceil_mode", 0))}
    out = tg.max_pool2d(x, **geometry)
    if not indices:
        return out, None
    at = tg.max_pool2d_indices(x, **geometry)
    if inside:
        return out, at
    width = x.shape[3]  # the padded plane's: the place back in the input's own plane
    row = tg.sub(tg.floor_divide(at, width), pads[0])
    col = tg.sub(tg.remainder(at, width), pads[1])
    return out, tg.add(tg.mul(row, plane_width), col)


def _max_pool3d(c: Ctx, x, kernel, pads, strides, dil):
    """MaxPool over a 3-D window: the depth padded with -inf (ceil_mode's extra cells too);
    for each kernel depth offset, the depth slices it meets through one 2-D pool
    (``_max_pool2d``, its own pads and ceil_mode as in 2-D); the maximum over the offsets,
    where Indices are asked the first in window order (ONNX Runtime's)."""
    batch, _, depth, h, w = x.shape
    front, back = _ceil_pads(c, x, kernel[:1], [pads[0], pads[3]], strides[:1], dil[:1])
    x = tg.pad(x, [0, 0, 0, 0, front, back], float("-inf"))
    count = (depth + front + back - dil[0] * (kernel[0] - 1) - 1) // strides[0] + 1
    plane = [pads[1], pads[2], pads[4], pads[5]]
    best = place = None
    for k in range(kernel[0]):
        y, at = _max_pool2d(c, _depth_planes(x, k * dil[0], count, strides[0]), kernel[1:],
                            plane, strides[1:], dil[1:], c.outputs > 1)
        y = _unfold_depth(y, batch, count)
        if at is not None:  # the place in the input's (D, H, W) volume
            rows = np.arange(count) * strides[0] + k * dil[0] - front
            at = tg.add(tg.mul(tg.constant(rows.reshape(1, 1, -1, 1, 1), "int64"), h * w),
                        _unfold_depth(at, batch, count))
        if best is None:
            best, place = y, at
        elif at is None:
            best = tg.maximum(best, y)
        else:  # a tie keeps the earlier offset: the first maximum in window order
            later = tg.greater(y, best)
            best, place = tg.where(later, y, best), tg.where(later, at, place)
    return best if place is None else (best, _flat_indices(c, place, (depth, h, w)))


def _flat_indices(c: Ctx, place, sizes):
    """ONNX's Indices from each maximum's ``place``, its row-major index in the input's
    spatial volume (of ``sizes``): row-major (storage_order 0) or column-major (1, the
    spatial axes reversed), offset by (n * C + c) times the volume to index the whole
    input."""
    sizes = list(sizes)
    if c.a("storage_order", 0):
        coords = []
        for s in sizes[:0:-1]:  # the coordinates from the last axis
            coords.append(tg.remainder(place, s))
            place = tg.floor_divide(place, s)
        coords.append(place)  # now reversed: the last axis first
        place = coords[0]
        for coord, s in zip(coords[1:], sizes[::-1][1:]):
            place = tg.add(tg.mul(place, s), coord)
    batch, ch = place.shape[:2]
    planes = tg.reshape(tg.iota(product([batch, ch])), (batch, ch, *[1] * len(sizes)))
    return tg.add(place, tg.mul(planes, tg.size(product(sizes))))


def _lp_pool(c: Ctx):
    """(sum of |x|^p over each window)^(1/p), 1-D to 3-D, dilated and under ceil_mode as
    AveragePool: the zero-padded window sums of |x|^p (``_window_sum``)."""
    x = c.t(0)
    kernel, pads, strides, dil = _window(c, x)
    p = float(c.a("p", 2))
    total = _window_sum(c, tg.pow(tg.abs(x), _f(x, p)), kernel,
                        _ceil_pads(c, x, kernel, pads, strides, dil), strides, dil)
    return tg.pow(total, _f(x, 1 / p))


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
    _, centered, var = _moments(x, axes)
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
