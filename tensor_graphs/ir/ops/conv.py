"""Convolution, pooling, interpolation and the channel norms (NCHW).

The spatial ops are movement ops plus one matmul or reduction:

- sliding windows (conv2d, max/avg pooling): pad once, take one strided slice per kernel offset
  and stack the slices on a new axis: im2col's (N, C, KH*KW, OH, OW) patches, without a gather;
- resampling along an axis is a constant built from the concrete sizes: an (out, in) matrix
  (adaptive average pooling, linear interpolation) or an index array (nearest).

Batch and channel dims may be named (symbolic); spatial dims must be concrete, because window
positions, matrices and index arrays are computed from them.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from tensor_graphs.errors import ArgumentError, DTypeError, ShapeError
from tensor_graphs.ir import builder as tg
from tensor_graphs.ir.composite import composite
from tensor_graphs.ir.ops.elementwise import div, isnan, logical_and, rsqrt, sub
from tensor_graphs.ir.ops.reductions import mean
from tensor_graphs.ir.ops.reductions import min as reduce_min
from tensor_graphs.ir.ops.shape_ops import stack
from tensor_graphs.ir.shapes import dims_equal, format_shape, is_static, numel

__all__ = [
    "conv2d", "conv3d", "max_pool2d", "max_pool2d_indices", "avg_pool2d", "adaptive_avg_pool2d",
    "adaptive_max_pool2d", "adaptive_max_pool2d_indices", "unfold", "interpolate", "batch_norm",
    "group_norm",
]


# ---------------------------------------------------------------------------- argument checks
def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _pair(value, name: str, op: str, low: int = 1) -> tuple[int, int]:
    """An int or a pair of ints (torch's _pair), each >= low."""
    if _is_int(value):
        value = (value, value)
    elif isinstance(value, tuple) and len(value) == 1 and _is_int(value[0]):
        value = (value[0], value[0])
    if not (isinstance(value, tuple) and len(value) == 2 and all(_is_int(v) for v in value)):
        raise ShapeError(f"{op}: {name} must be an int or a pair of ints, got {value!r}")
    if any(v < low for v in value):
        raise ShapeError(f"{op}: {name} must be >= {low}, got {value!r}")
    return int(value[0]), int(value[1])


def _triple(value, name: str, op: str, low: int = 1) -> tuple[int, int, int]:
    """An int or a triple of ints (torch's _triple), each >= low."""
    if _is_int(value):
        value = (value,) * 3
    elif isinstance(value, tuple) and len(value) == 1 and _is_int(value[0]):
        value = (value[0],) * 3
    if not (isinstance(value, tuple) and len(value) == 3 and all(_is_int(v) for v in value)):
        raise ShapeError(f"{op}: {name} must be an int or a triple of ints, got {value!r}")
    if any(v < low for v in value):
        raise ShapeError(f"{op}: {name} must be >= {low}, got {value!r}")
    return tuple(int(v) for v in value)


def _float(x, op: str):
    if not x.dtype.is_float:
        raise DTypeError(f"{op}: expected a float tensor, got {x.dtype.name} "
                         f"{format_shape(x.shape)}; cast it with .astype('float32') first")
    return x


def _batched(x, op: str):
    """A 4-d (N, C, H, W) view of a 3-d (C, H, W) or 4-d input, and the function undoing it."""
    if x.ndim == 4:
        return x, lambda y: y
    if x.ndim == 3:
        return tg.unsqueeze(x, 0), lambda y: tg.squeeze(y, 0)
    raise ShapeError(f"{op}: expected an (N, C, H, W) or (C, H, W) input, got "
                     f"{format_shape(x.shape)}")


def _spatial(x, op: str, count: int = 2) -> tuple[int, ...]:
    dims = tuple(x.shape[-count:])
    if not all(isinstance(d, int) for d in dims):
        raise ShapeError(f"{op}: the spatial dims of {format_shape(x.shape)} must be concrete "
                         "ints (window positions and resampling constants are computed from "
                         "them); only the batch and channel dims may be named: keep the "
                         "height and width static (import once per resolution, e.g. "
                         "dynamic_shapes naming the batch only)")
    return dims


def _channel_param(p, c, name: str, op: str, rank: int):
    """A per-channel (C,) tensor, reshaped to broadcast against an (N, C, ...) tensor."""
    if p.ndim != 1 or not dims_equal(p.shape[0], c):
        raise ShapeError(f"{op}: {name} must have shape ({c},) (one value per channel of the "
                         f"input), got {format_shape(p.shape)}")
    return tg.reshape(p, (c,) + (1,) * (rank - 2))


# ---------------------------------------------------------------------------- sliding windows
def _out_size(size: int, k: int, s: int, d: int, pad_lo: int, pad_hi: int,
              ceil_mode: bool = False) -> int:
    """torch's pooling_output_shape: windows that start inside the input or the left padding."""
    span = size + pad_lo + pad_hi - d * (k - 1) - 1
    if span < 0:
        return 0
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + pad_lo:
        out -= 1
    return out


def _padded_windows(x, kernel, stride, dilation, pads, out, value):
    """(N, C, KH*KW, OH, OW): the windows of x padded with ``value``, kernel offset on axis 2.

    ``pads`` are (top, left); the bottom/right padding is whatever the last window needs.
    """
    (kh, kw), (sh, sw), (dh, dw), (top, left), (oh, ow) = kernel, stride, dilation, pads, out
    h, w = x.shape[-2:]
    bottom = max((oh - 1) * sh + dh * (kh - 1) + 1 - h - top, 0)
    right = max((ow - 1) * sw + dw * (kw - 1) + 1 - w - left, 0)
    xp = tg.pad(x, (left, right, top, bottom), value=value)
    parts = []
    for i in range(kh):
        for j in range(kw):
            h0, w0 = i * dh, j * dw
            part = xp[:, :, h0:h0 + (oh - 1) * sh + 1:sh, w0:w0 + (ow - 1) * sw + 1:sw]
            parts.append(tg.unsqueeze(part, 2))
    return tg.concat(parts, axis=2)


def _conv_example():
    return (tg.input("x", (1, 2, 5, 5)), tg.weight("w", (4, 2, 3, 3)), tg.weight("b", (4,)))


@composite(example=_conv_example)
def conv2d(x, weight, bias=None, *, stride=1, padding=0, dilation=1, groups=1):
    """2-d cross-correlation (torch's conv2d) as im2col: pad, one strided slice per kernel
    offset, one (grouped) matmul with the flattened weight.

    x (N, C, H, W) or (C, H, W), weight (Cout, C/groups, KH, KW), bias (Cout,); padding is an
    int, a pair, "valid" or "same" (stride 1).
    """
    op = "conv2d"
    x4, undo = _batched(_float(x, op), op)
    if weight.ndim != 4 or not is_static(weight.shape):
        raise ShapeError(f"{op}: weight must have a concrete shape (out_channels, "
                         f"in_channels/groups, KH, KW), got {format_shape(weight.shape)}")
    cout, cin_g, kh, kw = weight.shape
    if not _is_int(groups) or groups < 1:
        raise ShapeError(f"{op}: groups must be a positive int, got {groups!r}")
    c = x4.shape[1]
    if cout % groups:
        raise ShapeError(f"{op}: out_channels {cout} (weight {format_shape(weight.shape)}) is "
                         f"not divisible by groups={groups}")
    if not dims_equal(c, cin_g * groups):
        raise ShapeError(f"{op}: input {format_shape(x.shape)} has {c} channels, but weight "
                         f"{format_shape(weight.shape)} with groups={groups} expects "
                         f"{cin_g * groups} (weight.shape[1] * groups)")
    if kh < 1 or kw < 1:
        raise ShapeError(f"{op}: the kernel {format_shape(weight.shape)} is empty")
    stride = _pair(stride, "stride", op)
    dilation = _pair(dilation, "dilation", op)
    h, w = _spatial(x4, op)
    if isinstance(padding, str):
        if padding == "valid":
            pads = ((0, 0), (0, 0))
        elif padding == "same":
            if stride != (1, 1):
                raise ShapeError(f"{op}: padding='same' needs stride 1, got stride={stride}; "
                                 "give explicit padding for strided convolutions")
            total = (dilation[0] * (kh - 1), dilation[1] * (kw - 1))
            pads = tuple((t // 2, t - t // 2) for t in total)
        else:
            raise ShapeError(f"{op}: padding must be an int, a pair, 'valid' or 'same', "
                             f"got {padding!r}")
    else:
        ph, pw = _pair(padding, "padding", op, low=0)
        pads = ((ph, ph), (pw, pw))
    out = tuple(_out_size(n, k, s, d, lo, hi) for n, k, s, d, (lo, hi)
                in zip((h, w), (kh, kw), stride, dilation, pads))
    if min(out) < 1:
        raise ShapeError(f"{op}: input {format_shape(x.shape)} padded by {pads} is smaller than "
                         f"the kernel ({kh}, {kw}) with dilation {dilation}; pad the input or "
                         "use a smaller kernel")
    cols = _padded_windows(x4, (kh, kw), stride, dilation, (pads[0][0], pads[1][0]), out, 0.0)
    n, k, length = x4.shape[0], kh * kw, out[0] * out[1]
    if groups == 1:
        y = tg.matmul(tg.reshape(weight, (cout, cin_g * k)),
                      tg.reshape(cols, (n, cin_g * k, length)))
    else:
        y = tg.matmul(tg.reshape(weight, (groups, cout // groups, cin_g * k)),
                      tg.reshape(cols, (n, groups, cin_g * k, length)))
    y = tg.reshape(y, (n, cout) + out)
    if bias is not None:
        y = tg.add(y, _channel_param(bias, cout, "bias", op, 4))
    return undo(y)


def _conv3d_example():
    return (tg.input("x", (1, 2, 4, 5, 5)), tg.weight("w", (4, 2, 2, 3, 3)),
            tg.weight("b", (4,)))


@composite(example=_conv3d_example)
def conv3d(x, weight, bias=None, *, stride=1, padding=0, dilation=1, groups=1):
    """3-d cross-correlation (torch's conv3d: video models' temporal layers) as one conv2d
    over the output frames: each output frame's depth window (one strided slice of the
    depth-padded input per kernel depth offset) is stacked into the channels, per group, as
    the weight's depth offsets are, so the planner sees one conv2d over N * D_out images.

    x (N, C, D, H, W) or (C, D, H, W), weight (Cout, C/groups, KD, KH, KW), bias (Cout,);
    padding is an int, a triple, "valid" or "same" (stride 1)."""
    op = "conv3d"
    _float(x, op)
    if x.ndim not in (4, 5):
        raise ShapeError(f"{op}: expected an (N, C, D, H, W) or (C, D, H, W) input, got "
                         f"{format_shape(x.shape)}")
    x5 = x if x.ndim == 5 else tg.unsqueeze(x, 0)
    if weight.ndim != 5 or not is_static(weight.shape):
        raise ShapeError(f"{op}: weight must have a concrete shape (out_channels, "
                         f"in_channels/groups, KD, KH, KW), got {format_shape(weight.shape)}")
    cout, cin_g, kd = weight.shape[:3]
    if not _is_int(groups) or groups < 1:
        raise ShapeError(f"{op}: groups must be a positive int, got {groups!r}")
    n, c = x5.shape[:2]
    if not dims_equal(c, cin_g * groups):
        raise ShapeError(f"{op}: input {format_shape(x.shape)} has {c} channels, but weight "
                         f"{format_shape(weight.shape)} with groups={groups} expects "
                         f"{cin_g * groups} (weight.shape[1] * groups)")
    (depth,) = _spatial(x5, op, 3)[:1]
    stride = _triple(stride, "stride", op)
    dilation = _triple(dilation, "dilation", op)
    if padding == "same":  # torch: the extra one of an odd total goes after
        if stride != (1, 1, 1):
            raise ShapeError(f"{op}: padding='same' needs stride 1, got stride={stride}; "
                             "give explicit padding for strided convolutions")
        total = dilation[0] * (kd - 1)
        depth_pads, plane_pads = (total // 2, total - total // 2), "same"
    elif padding == "valid":
        depth_pads, plane_pads = (0, 0), 0
    elif isinstance(padding, str):
        raise ShapeError(f"{op}: padding must be an int, a triple, 'valid' or 'same', got "
                         f"{padding!r}")
    else:
        pads = _triple(padding, "padding", op, low=0)
        depth_pads, plane_pads = (pads[0], pads[0]), pads[1:]
    frames = _out_size(depth, kd, stride[0], dilation[0], *depth_pads)
    if frames < 1:
        raise ShapeError(f"{op}: input {format_shape(x.shape)} padded by {depth_pads} along "
                         f"its depth is shorter than the kernel's depth {kd} with dilation "
                         f"{dilation[0]}")
    xp = tg.pad(x5, (0, 0, 0, 0) + depth_pads)
    stop = (frames - 1) * stride[0] + 1
    windows = tg.concat([tg.unsqueeze(xp[:, :, k * dilation[0]:k * dilation[0] + stop:stride[0]],
                                      1) for k in range(kd)], axis=1)  # (N, KD, C, F, H, W)
    h, w = x5.shape[3:]
    windows = tg.reshape(windows, (n, kd, groups, cin_g, frames, h, w))
    images = tg.reshape(tg.permute(windows, (0, 4, 2, 1, 3, 5, 6)),
                        (n * frames, groups * kd * cin_g, h, w))
    kernel = tg.reshape(tg.permute(weight, (0, 2, 1, 3, 4)),
                        (cout, kd * cin_g) + tuple(weight.shape[3:]))
    y = conv2d(images, kernel, bias, stride=stride[1:], padding=plane_pads,
               dilation=dilation[1:], groups=groups)
    y = tg.permute(tg.reshape(y, (n, frames, cout) + tuple(y.shape[2:])), (0, 2, 1, 3, 4))
    return y if x.ndim == 5 else tg.squeeze(y, 0)


def strided_windows(x, kernel, strides, dil):
    """The windows of an already padded (N, C, *spatial) as (N, C, K, *out), K the kernel's
    offsets in row-major order: one strided slice per offset, so a symbolic spatial dim
    (an audio length, an image exported with dynamic height and width) needs no window
    positions computed from its size, only floor((size - span) / stride) + 1 outputs.
    What the importers use where conv2d and the pools refuse a symbolic spatial dim."""
    outs = [(size - d * (k - 1) - 1) // s + 1
            for size, k, s, d in zip(x.shape[2:], kernel, strides, dil)]
    parts = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        y = x
        for i, o in enumerate(offset):
            start = o * dil[i]
            y = tg.slice_axis(y, 2 + i, start, start + (outs[i] - 1) * strides[i] + 1,
                              strides[i])
        parts.append(y)
    return stack(parts, 2)


def unfolded_conv(x, w, b, strides, dil, groups):
    """A 1-D to 3-D convolution of an already padded input whose spatial dims may be
    symbolic, which conv2d refuses: its windows (``strided_windows``) times the kernel, one
    batched matmul of (groups, out/groups, in/groups * K) by (N, groups, in/groups * K,
    positions)."""
    batch, cin = x.shape[:2]
    cout, kernel = w.shape[0], list(w.shape[2:])
    k = math.prod(kernel)
    cols = strided_windows(x, kernel, strides, dil)
    out = cols.shape[3:]
    cols = tg.reshape(cols, (batch, groups, cin // groups * k, math.prod(out)))
    y = tg.matmul(tg.reshape(w, (groups, cout // groups, cin // groups * k)), cols)
    y = tg.reshape(y, (batch, cout, *out))
    return y if b is None else tg.add(y, tg.reshape(b, (-1,) + (1,) * len(out)))


def _pool_geometry(x4, op, kernel_size, stride, padding, dilation, ceil_mode):
    kernel = _pair(kernel_size, "kernel_size", op)
    stride = kernel if stride is None or stride == () else _pair(stride, "stride", op)
    padding = _pair(padding, "padding", op, low=0)
    dilation = _pair(dilation, "dilation", op)
    for p, k, d in zip(padding, kernel, dilation):
        if p > (d * (k - 1) + 1) // 2:
            raise ShapeError(f"{op}: padding {padding} must be at most half the (dilated) "
                             f"kernel size {kernel}, or a window could lie in the padding only")
    h, w = _spatial(x4, op)
    out = tuple(_out_size(n, k, s, d, p, p, bool(ceil_mode)) for n, k, s, d, p
                in zip((h, w), kernel, stride, dilation, padding))
    if min(out) < 1:
        raise ShapeError(f"{op}: input {format_shape(x4.shape)} padded by {padding} is smaller "
                         f"than the window {kernel} (dilation {dilation})")
    return kernel, stride, padding, dilation, out


def _pool_example():
    return {"x": tg.input("x", (1, 2, 6, 6)), "kernel_size": 2}


@composite(example=_pool_example)
def max_pool2d(x, *, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Maximum over sliding windows (torch's max_pool2d): pad with -inf, one strided slice per
    window offset, max over the offsets; nan propagates. stride defaults to kernel_size."""
    op = "max_pool2d"
    x4, undo = _batched(x, op)
    if x.dtype.is_bool:
        raise DTypeError(f"{op}: bool input is not accepted; cast it to an int or float dtype")
    kernel, stride, padding, dilation, out = _pool_geometry(
        x4, op, kernel_size, stride, padding, dilation, ceil_mode)
    low = float("-inf") if x.dtype.is_float else int(np.iinfo(x.dtype.np_dtype).min)
    windows = _padded_windows(x4, kernel, stride, dilation, padding, out, low)
    return undo(tg.max(windows, 2))


def _lowest(x, op: str):
    if x.dtype.is_bool:
        raise DTypeError(f"{op}: bool input is not accepted; cast it to an int or float dtype")
    return float("-inf") if x.dtype.is_float else int(np.iinfo(x.dtype.np_dtype).min)


def _window_positions(hw, kernel, stride, dilation, pads, out) -> np.ndarray:
    """(KH*KW, OH, OW): the flat index h * W + w of each window element in the input's
    (H, W) plane, -1 where it lies in the padding (the layout of ``_padded_windows``)."""
    (h, w), (kh, kw), (sh, sw), (dh, dw), (top, left), (oh, ow) = (
        hw, kernel, stride, dilation, pads, out)
    rows = (np.arange(oh) * sh - top)[None, :] + (np.arange(kh) * dh)[:, None]  # (KH, OH)
    cols = (np.arange(ow) * sw - left)[None, :] + (np.arange(kw) * dw)[:, None]  # (KW, OW)
    r, c = rows[:, None, :, None], cols[None, :, None, :]
    inside = (r >= 0) & (r < h) & (c >= 0) & (c < w)
    return np.where(inside, r * w + c, -1).reshape(kh * kw, oh, ow).astype(np.int64)


def _argmax_index(windows, positions: np.ndarray):
    """torch's max-pooling index over windows (N, C, K, OH, OW) whose elements lie at
    ``positions`` (K, OH, OW; -1: padding): the position of the first maximum in window
    order, or of the last nan where the window has one, as torch's kernels scan
    (``val > maxval || isnan(val)``). Window order is row-major, so the first (last) in
    window order is the smallest (largest) position."""
    inside = tg.constant(positions >= 0)
    where = tg.constant(positions, "int64")
    top = tg.max(windows, 2, keepdims=True)
    hit = logical_and(inside, tg.equal(windows, top))
    first = reduce_min(tg.where(hit, where, tg.constant(np.iinfo(np.int64).max, "int64")),
                       axis=2)
    if not windows.dtype.is_float:
        return first
    last_nan = tg.max(tg.where(logical_and(inside, isnan(windows)), where,
                               tg.constant(-1, "int64")), 2)
    return tg.where(tg.less(last_nan, 0), first, last_nan)


@composite(example=_pool_example)
def max_pool2d_indices(x, *, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Where each max_pool2d window's maximum lies (torch's return_indices=True, int64): the
    flat index h * W + w in the input's (H, W) plane of the window's first maximum, or of its
    last nan where it has one (the rule of torch's kernels)."""
    op = "max_pool2d_indices"
    x4, undo = _batched(x, op)
    low = _lowest(x, op)
    kernel, stride, padding, dilation, out = _pool_geometry(
        x4, op, kernel_size, stride, padding, dilation, ceil_mode)
    windows = _padded_windows(x4, kernel, stride, dilation, padding, out, low)
    positions = _window_positions(x4.shape[-2:], kernel, stride, dilation, padding, out)
    return undo(_argmax_index(windows, positions))


@composite(example=lambda: {"x": tg.input("x", (1, 2, 5, 5)), "kernel_size": 2})
def unfold(x, *, kernel_size, dilation=1, padding=0, stride=1):
    """Sliding local blocks as columns (torch's F.unfold, im2col): (N, C, H, W) -> (N,
    C*KH*KW, L), a column per window position in row-major order, channel-major rows; the
    zero-padded windows as in conv2d, without the matmul."""
    op = "unfold"
    x4, undo = _batched(x, op)
    if x.dtype.is_bool:
        raise DTypeError(f"{op}: bool input is not accepted; cast it to an int or float dtype")
    kernel = _pair(kernel_size, "kernel_size", op)
    dilation, stride = _pair(dilation, "dilation", op), _pair(stride, "stride", op)
    pads = _pair(padding, "padding", op, low=0)
    h, w = _spatial(x4, op)
    out = tuple(_out_size(n, k, s, d, p, p) for n, k, s, d, p
                in zip((h, w), kernel, stride, dilation, pads))
    if min(out) < 1:
        raise ShapeError(f"{op}: input {format_shape(x.shape)} padded by {pads} is smaller than "
                         f"the block {kernel} (dilation {dilation}); pad it or use a smaller "
                         "kernel_size")
    cols = _padded_windows(x4, kernel, stride, dilation, pads, out, 0)
    n, c = x4.shape[0], x4.shape[1]
    return undo(tg.reshape(cols, (n, c * kernel[0] * kernel[1], out[0] * out[1])))


def _avg_divisor(size, k, s, p, out, count_include_pad):
    """torch's per-window divisor along one axis: the window clipped to the padded input, or
    to the input itself when padding does not count."""
    start = np.arange(out) * s - p
    end = np.minimum(start + k, size + p)
    counts = end - start
    if not count_include_pad:
        counts = np.minimum(end, size) - np.maximum(start, 0)
    return counts


@composite(example=_pool_example)
def avg_pool2d(x, *, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """Mean over sliding windows (torch's avg_pool2d): zero-pad, one strided slice per window
    offset, sum, divide by the window size (a constant per output position when padding or
    ceil_mode make windows differ)."""
    op = "avg_pool2d"
    x4, undo = _batched(_float(x, op), op)
    kernel, stride, padding, _, out = _pool_geometry(
        x4, op, kernel_size, stride, padding, 1, ceil_mode)
    total = tg.sum(_padded_windows(x4, kernel, stride, (1, 1), padding, out, 0.0), 2)
    if divisor_override is not None:
        if not _is_int(divisor_override) or divisor_override == 0:
            raise ShapeError(f"{op}: divisor_override must be a non-zero int, got "
                             f"{divisor_override!r}")
        return undo(div(total, float(divisor_override)))
    rows, cols = (_avg_divisor(n, k, s, p, o, count_include_pad) for n, k, s, p, o
                  in zip(x4.shape[-2:], kernel, stride, padding, out))
    divisor = np.maximum(np.outer(rows, cols), 1).astype(np.float64)  # empty window: sum is 0
    if np.all(divisor == divisor.flat[0]):
        return undo(div(total, float(divisor.flat[0])))
    return undo(div(total, tg.constant(divisor, x.dtype)))


# ---------------------------------------------------------------------------- resampling
def _adaptive_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in): row i averages input [floor(i*in/out), ceil((i+1)*in/out))."""
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        start, end = (i * n_in) // n_out, -(-((i + 1) * n_in) // n_out)
        m[i, start:end] = 1.0 / (end - start)
    return m


def _along(x, matrix: np.ndarray, axis: int):
    """Apply an (out, in) matrix along one axis of x (a constant in x's dtype)."""
    axis = axis % x.ndim
    if matrix.shape[0] == matrix.shape[1] and np.array_equal(matrix, np.eye(matrix.shape[0])):
        return x
    if axis == x.ndim - 2:
        return tg.matmul(tg.constant(matrix, x.dtype), x)
    right = tg.constant(np.ascontiguousarray(matrix.T), x.dtype)
    if axis == x.ndim - 1:
        return tg.matmul(x, right)
    return tg.transpose(tg.matmul(tg.transpose(x, axis, -1), right), axis, -1)


def _output_size(output_size, hw, op: str) -> tuple[int, int]:
    if _is_int(output_size) or output_size is None:
        output_size = (output_size, output_size)
    if not (isinstance(output_size, tuple) and len(output_size) == 2):
        raise ShapeError(f"{op}: output_size must be an int or a pair (None keeps a size), "
                         f"got {output_size!r}")
    out = tuple(n if o is None else o for o, n in zip(output_size, hw))
    if not all(_is_int(o) and o >= 1 for o in out):
        raise ShapeError(f"{op}: output sizes must be positive ints, got {output_size!r}")
    return out


@composite(example=lambda: {"x": tg.input("x", (1, 2, 5, 7)), "output_size": (2, 3)})
def adaptive_avg_pool2d(x, *, output_size):
    """Average over adaptive windows (torch's adaptive_avg_pool2d) as P_h @ x @ P_w^T, with
    constant averaging matrices P (out, in) built from the concrete sizes."""
    op = "adaptive_avg_pool2d"
    x4, undo = _batched(_float(x, op), op)
    hw = _spatial(x4, op)
    oh, ow = _output_size(output_size, hw, op)
    y = _along(x4, _adaptive_matrix(hw[0], oh), -2)
    return undo(_along(y, _adaptive_matrix(hw[1], ow), -1))


def _adaptive_index(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, k): the input positions of each adaptive window [floor(i*in/out),
    ceil((i+1)*in/out)), k the longest window's length; a shorter window repeats its last
    position (which changes neither its maximum nor where the first or last one lies)."""
    start = np.arange(n_out) * n_in // n_out
    end = -(-(np.arange(1, n_out + 1) * n_in) // n_out)
    k = int((end - start).max())
    return np.minimum(start[:, None] + np.arange(k)[None, :], end[:, None] - 1)


def _adaptive_windows(x, op: str, output_size):
    """(N, C, KH*KW, OH, OW) adaptive windows of an (N, C, H, W) input, gathered with constant
    index arrays, and their positions (K, OH, OW) in the (H, W) plane."""
    h, w = _spatial(x, op)
    oh, ow = _output_size(output_size, (h, w), op)
    rows, cols = _adaptive_index(h, oh), _adaptive_index(w, ow)  # (OH, KH), (OW, KW)
    kh, kw = rows.shape[1], cols.shape[1]
    y = tg.gather(x, tg.constant(rows.reshape(-1)), axis=2)
    y = tg.gather(y, tg.constant(cols.reshape(-1)), axis=3)  # (N, C, OH*KH, OW*KW)
    y = tg.reshape(y, (x.shape[0], x.shape[1], oh, kh, ow, kw))
    y = tg.reshape(tg.permute(y, (0, 1, 3, 5, 2, 4)), (x.shape[0], x.shape[1], kh * kw, oh, ow))
    positions = rows.T[:, None, :, None] * w + cols.T[None, :, None, :]  # (KH, KW, OH, OW)
    return y, positions.reshape(kh * kw, oh, ow).astype(np.int64)


@composite(example=lambda: {"x": tg.input("x", (1, 2, 5, 7)), "output_size": (2, 3)})
def adaptive_max_pool2d(x, *, output_size):
    """Maximum over adaptive windows (torch's adaptive_max_pool2d): window i of an axis
    covers [floor(i*in/out), ceil((i+1)*in/out)); the windows are gathered with constant
    index arrays and reduced; nan propagates."""
    op = "adaptive_max_pool2d"
    _lowest(x, op)
    x4, undo = _batched(x, op)
    windows, _ = _adaptive_windows(x4, op, output_size)
    return undo(tg.max(windows, 2))


@composite(example=lambda: {"x": tg.input("x", (1, 2, 5, 7)), "output_size": (2, 3)})
def adaptive_max_pool2d_indices(x, *, output_size):
    """Where each adaptive_max_pool2d window's maximum lies (int64, torch's
    return_indices=True): the flat index h * W + w of the first maximum, or of the last nan
    where the window has one."""
    op = "adaptive_max_pool2d_indices"
    _lowest(x, op)
    x4, undo = _batched(x, op)
    windows, positions = _adaptive_windows(x4, op, output_size)
    return undo(_argmax_index(windows, positions))


_LINEAR = {"linear": 1, "bilinear": 2, "trilinear": 3, "bicubic": 2}  # mode: spatial dims
_MODES = ("nearest", "nearest-exact", "area", *_LINEAR)
_CUBIC_A = -0.75  # torch's (and OpenCV's) cubic convolution constant


def _nearest_index(n_in: int, n_out: int, scale, exact: bool) -> np.ndarray:
    """torch's source index of each output position: floor(dst * s), or floor((dst + 0.5) * s)
    for nearest-exact, clamped to in - 1, computed in float32 exactly as torch's kernels do
    with s = float32(in) / float32(out), or float32(1 / scale_factor) when one is given.

    (torch's float64 kernels for 1-d and 3-d inputs use another rounding and differ from this
    in rare sizes; its 2-d kernels and all float32 kernels agree with it.)
    """
    if scale is None:
        s = np.float32(n_in) / np.float32(n_out)
    else:
        s = np.float32(1.0 / scale)
    pos = (np.arange(n_out, dtype=np.float32) + np.float32(0.5 if exact else 0.0)) * s
    idx = np.floor(pos.astype(np.float32)).astype(np.int64)
    return np.minimum(idx, n_in - 1)


def _nearest_along(x, idx: np.ndarray, axis: int):
    """x gathered along ``axis`` by a constant index array; integer upsampling (each element
    repeated k times) is a reshape + expand instead, and the identity is x itself."""
    n_in, n_out = x.shape[axis], len(idx)
    if n_out == n_in and np.array_equal(idx, np.arange(n_in)):
        return x
    if n_out % n_in == 0 and np.array_equal(idx, np.arange(n_out) // (n_out // n_in)):
        k = n_out // n_in
        shape = x.shape[:axis + 1] + (1,) + x.shape[axis + 1:]
        y = tg.expand(tg.reshape(x, shape), shape[:axis + 1] + (k,) + shape[axis + 2:])
        return tg.reshape(y, x.shape[:axis] + (n_out,) + x.shape[axis + 1:])
    return tg.gather(x, tg.constant(idx), axis=axis)


def _linear_matrix(n_in: int, n_out: int, scale, align_corners: bool) -> np.ndarray:
    """(n_out, n_in) linear interpolation weights with torch's source-index rule."""
    dst = np.arange(n_out, dtype=np.float64)
    if align_corners:
        src = dst * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
    else:
        s = 1.0 / scale if scale is not None and scale > 0 else n_in / n_out
        src = np.maximum(s * (dst + 0.5) - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    frac = src - i0
    m = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    np.add.at(m, (rows, i0), 1.0 - frac)
    np.add.at(m, (rows, i1), frac)
    return m


def _cubic_matrix(n_in: int, n_out: int, scale, align_corners: bool) -> np.ndarray:
    """(n_out, n_in) bicubic weights with torch's rule: the source index unclamped (cubic),
    four taps at floor(src) - 1 .. + 2 weighted by Keys' cubic convolution (A = -0.75), a tap
    outside the input reading its nearest edge."""
    dst = np.arange(n_out, dtype=np.float64)
    if align_corners:
        src = dst * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
    else:
        s = 1.0 / scale if scale is not None and scale > 0 else n_in / n_out
        src = s * (dst + 0.5) - 0.5
    base = np.floor(src)
    t = src - base
    a = _CUBIC_A

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    m = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    for k, w in enumerate((far(t + 1), near(t), near(1 - t), far(2 - t))):
        np.add.at(m, (rows, np.clip(base.astype(np.int64) - 1 + k, 0, n_in - 1)), w)
    return m


def _as_tuple(value, count: int, name: str, kind, op: str) -> tuple | None:
    if value is None:
        return None
    if not isinstance(value, tuple):
        value = (value,) * count
    if len(value) != count or not all(isinstance(v, kind) and not isinstance(v, bool)
                                      for v in value):
        raise ShapeError(f"{op}: {name} must be one value or {count} values for an input with "
                         f"{count} spatial dims, got {value!r}")
    return value


@composite(example=lambda: {"x": tg.input("x", (1, 2, 3, 4)), "scale_factor": 2})
def interpolate(x, *, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None):
    """Resize the spatial dims (torch's interpolate): "nearest"/"nearest-exact" gather with
    constant index arrays (reshape + expand for integer factors), "linear"/"bilinear"/
    "trilinear", "bicubic" and "area" apply constant (out, in) matrices along each spatial
    axis (bicubic is separable: torch's 4x4 taps are the product of two 4-tap rows)."""
    op = "interpolate"
    if mode not in _MODES:
        raise ArgumentError(f"{op}: mode {mode!r} is not supported; use one of {_MODES}")
    spatial = x.ndim - 2
    if spatial not in (1, 2, 3):
        raise ShapeError(f"{op}: expected an (N, C, *spatial) input with 1 to 3 spatial dims, "
                         f"got {format_shape(x.shape)}")
    if mode in _LINEAR and _LINEAR[mode] != spatial:
        raise ShapeError(f"{op}: mode {mode!r} needs {_LINEAR[mode]} spatial dims, got "
                         f"{format_shape(x.shape)}")
    if align_corners is not None and mode not in _LINEAR:
        raise ArgumentError(f"{op}: align_corners only applies to the linear modes, not "
                                f"{mode!r}")
    dims = _spatial(x, op, spatial)
    if (size is None) == (scale_factor is None):
        raise ShapeError(f"{op}: give exactly one of size and scale_factor")
    if size is not None:
        out = _as_tuple(size, spatial, "size", (int, np.integer), op)
        scales = (None,) * spatial
    else:
        scales = _as_tuple(scale_factor, spatial, "scale_factor", (int, float), op)
        out = tuple(int(math.floor(n * float(s))) for n, s in zip(dims, scales))
        if recompute_scale_factor:
            scales = (None,) * spatial
    if not all(o >= 1 for o in out):
        raise ShapeError(f"{op}: output size {out} of input {format_shape(x.shape)} must be "
                         "positive")
    if mode != "nearest" and mode != "nearest-exact" and not x.dtype.is_float:
        raise DTypeError(f"{op}: mode {mode!r} needs a float input, got {x.dtype.name}")
    for axis, n_in, n_out, scale in zip(range(2, x.ndim), dims, out, scales):
        if mode in ("nearest", "nearest-exact"):
            x = _nearest_along(x, _nearest_index(n_in, n_out, scale, mode != "nearest"), axis)
        elif mode == "area":
            x = _along(x, _adaptive_matrix(n_in, n_out), axis)
        elif mode == "bicubic":
            x = _along(x, _cubic_matrix(n_in, n_out, scale, bool(align_corners)), axis)
        else:
            x = _along(x, _linear_matrix(n_in, n_out, scale, bool(align_corners)), axis)
    return x


# ---------------------------------------------------------------------------- channel norms
def _bn_example():
    return (tg.input("x", (2, 3, 4, 4)), tg.weight("m", (3,)), tg.weight("v", (3,)),
            tg.weight("w", (3,)), tg.weight("b", (3,)))


@composite(example=_bn_example)
def batch_norm(x, running_mean, running_var, weight=None, bias=None, *, eps=1e-5):
    """Inference batch norm over the channel axis 1 (torch's batch_norm, training=False):
    (x - mean) * (rsqrt(var + eps) * weight) + bias."""
    op = "batch_norm"
    x = _float(x, op)
    if x.ndim < 2:
        raise ShapeError(f"{op}: expected an (N, C, ...) input, got {format_shape(x.shape)}")
    c, rank = x.shape[1], x.ndim
    m = _channel_param(running_mean, c, "running_mean", op, rank)
    scale = rsqrt(tg.add(running_var, eps))
    if weight is not None:
        _channel_param(weight, c, "weight", op, rank)
        scale = tg.mul(scale, weight)
    y = tg.mul(sub(x, m), _channel_param(scale, c, "running_var", op, rank))
    if bias is not None:
        y = tg.add(y, _channel_param(bias, c, "bias", op, rank))
    return y


@composite(example=lambda: {"x": tg.input("x", (2, 4, 3)), "num_groups": 2})
def group_norm(x, weight=None, bias=None, *, num_groups, eps=1e-5):
    """Normalise each group of channels of each sample over (channels in the group, spatial)
    (torch's group_norm), then scale and shift per channel."""
    op = "group_norm"
    x = _float(x, op)
    if x.ndim < 2:
        raise ShapeError(f"{op}: expected an (N, C, ...) input, got {format_shape(x.shape)}")
    c = x.shape[1]
    if not _is_int(num_groups) or num_groups < 1:
        raise ShapeError(f"{op}: num_groups must be a positive int, got {num_groups!r}")
    if not isinstance(c, int) or c % num_groups:
        raise ShapeError(f"{op}: the {c} channels of {format_shape(x.shape)} must be a concrete "
                         f"multiple of num_groups={num_groups}")
    group = tg.reshape(x, (x.shape[0], num_groups, numel((c // num_groups,) + x.shape[2:])))
    centered = sub(group, mean(group, axis=-1, keepdims=True))
    variance = mean(tg.mul(centered, centered), axis=-1, keepdims=True)
    y = tg.reshape(tg.mul(centered, rsqrt(tg.add(variance, eps))), x.shape)
    if weight is not None:
        y = tg.mul(y, _channel_param(weight, c, "weight", op, x.ndim))
    if bias is not None:
        y = tg.add(y, _channel_param(bias, c, "bias", op, x.ndim))
    return y
