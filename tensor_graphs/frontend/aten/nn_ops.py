"""ATen neural-network layers: composites torch hands over whole stay whole (the planner
picks fused kernels for them)."""

from __future__ import annotations

import numpy as np

from tensor_graphs.errors import ArgumentError, ShapeError
from tensor_graphs.frontend.aten.common import (
    Unavailable,
    UnsupportedOpError,
    guarded,
    ints,
)
from tensor_graphs.frontend.aten.random_ops import _generator, training
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.ops.conv import unfolded_conv
from tensor_graphs.ir.ops.nn import attention_with


def _norm_shape(x, normalized_shape, params, fn):
    """torch's norms over the trailing ``normalized_shape`` dims; ours over the last axis:
    more than one trailing dim is flattened into one and back."""
    k = len(normalized_shape)
    if k == 0 or tuple(x.shape[x.ndim - k:]) != tuple(normalized_shape):
        raise ShapeError(f"normalized_shape {tuple(normalized_shape)} is not the trailing "
                         f"dims of the input {x.shape}")
    if k == 1:
        return fn(x, *params)
    flat = tg.reshape(x, tuple(x.shape[:x.ndim - k]) + (-1,))
    y = fn(flat, *(None if p is None else tg.reshape(p, (-1,)) for p in params))
    return tg.reshape(y, x.shape)


def _layer_norm(a, kw):
    return _norm_shape(kw["input"], kw["normalized_shape"], (kw["weight"], kw["bias"]),
                       lambda x, w, b: tg.layer_norm(x, w, b, eps=kw["eps"]))


def _rms_norm(a, kw):
    x, eps = kw["input"], kw["eps"]
    if eps is None:  # torch's default: the dtype's machine epsilon
        eps = float(np.finfo(x.dtype.np_dtype).eps)
    return _norm_shape(x, kw["normalized_shape"], (kw["weight"],),
                       lambda x, w: tg.rms_norm(x, w, eps=eps))


def _sdpa(a, kw):
    q, k, v, mask = kw["query"], kw["key"], kw["value"], kw["attn_mask"]
    # built first in every case: its checks (shapes, heads, mask, dtypes) and their messages
    fused = tg.scaled_dot_product_attention(q, k, v, mask, is_causal=kw["is_causal"],
                                            scale=kw["scale"])
    if not kw["dropout_p"]:
        return fused
    return _attention_dropout(q, k, v, mask, kw["is_causal"], kw["scale"],
                              float(kw["dropout_p"]))


def _attention_dropout(q, k, v, mask, is_causal, scale, p):
    """Attention whose weights are dropped, as torch's math path does it (transformers'
    default attention in training mode passes the attention dropout as ``dropout_p``): the
    op's own decomposition with a dropout of its weights, which fall inside the fused op. The
    dropped weights are drawn from the training generator, as ``nn.Dropout``'s are (without
    one, outside ``from_torch(..., train=True)``, it is refused: inference would drop at
    random)."""
    gen = _generator("scaled_dot_product_attention with dropout_p > 0")
    return attention_with(q, k, v, mask, is_causal=is_causal, scale=scale,
                          weights=lambda w: tg.dropout(w, p, gen))


def _embedding_renorm(a, kw):
    """F.embedding(max_norm=...) writes the looked-up rows of the weight in place before the
    lookup reads them, through an alias (a detached view) of the weight: a mapping would
    read the weight unchanged, so it is refused with what to do."""
    raise UnsupportedOpError(
        f"embedding with max_norm={kw['max_norm']}: torch renormalizes the looked-up rows of "
        "the weight in place (embedding_renorm_) before reading them, a write to the weight "
        "a compiled program does not follow. Renormalize the weight once before export "
        "(with torch.no_grad(): torch.embedding_renorm_(weight, indices, max_norm, "
        "norm_type)) and drop max_norm, or clip the looked-up rows out of place "
        "(torch.renorm)", [("aten::embedding_renorm_", "")])


def _embedding(a, kw):
    """``F.embedding``: the rows of the table. Its ``padding_idx`` and ``scale_grad_by_freq``
    change only the table's gradient, so they matter only in an import for training
    (``training``): there the padding row's gradient is zero, as torch's embedding backward
    gives it (the padding ids' lookups go through ``stop_gradient``), and
    ``scale_grad_by_freq`` is refused. Scaling each lookup's gradient by 1 / its id's count
    needs an op with that rule (a stop_gradient spelling, ``e' + (e - e') s``, turns an inf row
    into nan), and an op of int ids needs its verification cases in
    ``kernels/signatures.py``. torch passes ``padding_idx=-1`` for none (F.embedding made a
    negative one positive before)."""
    ids, table = kw["indices"], kw["weight"]
    out = tg.embedding(ids, table)
    if not training() or not table.dtype.is_float:
        return out
    if kw["scale_grad_by_freq"]:
        raise ArgumentError(
            "embedding(scale_grad_by_freq=True) in training: dividing each lookup's gradient "
            "by its id's count in the batch is not mapped, and without it the gradient would "
            "differ from torch's; train with nn.Embedding(scale_grad_by_freq=False) (torch's "
            "default)")
    pad = kw["padding_idx"]
    if pad is not None and pad >= 0:
        padded = tg.unsqueeze(tg.equal(ids, tg.constant(pad, ids.dtype)), -1)
        out = tg.where(padded, tg.stop_gradient(out), out)
    return out


_BAG_MODES = ("sum", "mean", "max")


def _embedding_bag(a, kw):
    """torch's embedding_bag over 1-D indices and bag offsets (F.embedding_bag makes 2-D
    input so): each entry's bag is the number of offsets at or before it, minus one, and the
    bags are reduced through the (entries, bags) membership matrix: a matmul for sum and
    mean, a masked max for max. Empty bags are 0, as in torch; entries equal to padding_idx
    count nowhere."""
    w, idx, offsets = kw["weight"], kw["indices"], kw["offsets"]
    mode, weights, last = kw["mode"], kw["per_sample_weights"], kw["include_last_offset"]
    pad = kw.get("padding_idx")
    if kw.get("scale_grad_by_freq") and training():
        raise ArgumentError(
            "embedding_bag(scale_grad_by_freq=True) in training: its gradient scaling is "
            "not mapped, and without it the gradient would differ from torch's; train with "
            "nn.EmbeddingBag(scale_grad_by_freq=False) (torch's default)")
    if idx.ndim != 1 or offsets.ndim != 1:
        raise ShapeError(f"embedding_bag: indices {idx.shape} and offsets {offsets.shape} "
                         "must be 1-D")
    n, bags = idx.shape[0], offsets.shape[0] - (1 if last else 0)
    if not isinstance(bags, int):
        raise ShapeError(f"embedding_bag: the number of bags ({offsets.shape[0]} offsets) "
                         "must be concrete")
    starts = tg.slice_axis(offsets, 0, 0, bags) if last else offsets
    position = tg.reshape(tg.iota(n), (n, 1))
    begun = tg.less_equal(tg.reshape(tg.cast(starts, "int64"), (1, bags)), position)
    bag = tg.sum(tg.cast(begun, "int64"), axis=1, keepdims=True) - 1  # (n, 1)
    member = tg.equal(bag, tg.reshape(tg.iota(bags), (1, bags)))  # (n, bags)
    if last:  # entries from the last offset on belong to no bag
        end = tg.slice_axis(tg.cast(offsets, "int64"), 0, bags, bags + 1)
        member = tg.logical_and(member, tg.less(position, tg.reshape(end, (1, 1))))
    if pad is not None:  # a negative padding_idx counts from the end (F.embedding_bag's -1)
        pad = pad % w.shape[0] if isinstance(w.shape[0], int) else pad
        member = tg.logical_and(member, tg.reshape(tg.not_equal(idx, pad), (n, 1)))
    rows = tg.embedding(idx, w)  # (n, d)
    if weights is not None:
        if mode != 0:
            raise ArgumentError("embedding_bag: per_sample_weights need mode='sum' (torch's "
                                f"rule), got mode={_BAG_MODES[mode]!r}")
        rows = rows * tg.reshape(weights, (n, 1))
    counts = tg.sum(tg.cast(member, w.dtype), axis=0)  # (bags,)
    if mode == 2:
        picked = tg.where(tg.unsqueeze(member, 2), tg.unsqueeze(rows, 1), float("-inf"))
        out = tg.where(tg.unsqueeze(counts > 0, 1), tg.max(picked, axis=0), 0.0)
    else:
        out = tg.matmul(tg.permute(tg.cast(member, w.dtype), (1, 0)), rows)
        if mode == 1:
            out = out / tg.unsqueeze(tg.maximum(counts, 1.0), 1)
    extra = Unavailable("embedding_bag: only the bags (output 0) have a tensor_graphs value")
    return (out, extra, extra, extra)


def _same_padding(op, x, weight, dilation, nd):
    """padding="same" (stride 1): total d*(k-1) per spatial dim, the odd one after; returns
    the explicitly padded input (when asymmetric) and the symmetric padding."""
    ks = tuple(weight.shape[2:])
    pad, before, after = [], [], []
    for k, d in zip(ks, dilation):
        if not isinstance(k, int):
            raise ShapeError(f"{op}: padding='same' needs a concrete kernel size, got {ks}")
        total = d * (k - 1)
        pad.append(total // 2)
        before.append(0)
        after.append(total - 2 * (total // 2))
    if any(after):
        extra = []
        for b, a in zip(reversed(before), reversed(after)):
            extra += [b, a]
        x = tg.pad(x, extra)
    return x, tuple(pad)


def _conv(op, x, weight, bias, stride, padding, dilation, groups):
    """torch's conv1d / conv2d / conv3d (batched or not) on our conv2d and conv3d: a 1-d
    convolution is a 2-d one over a height of 1."""
    nd = weight.ndim - 2
    if nd not in (1, 2, 3):
        raise ArgumentError(f"{op}: a {nd}-d convolution (weight {weight.shape}) has no "
                            "tensor_graphs op (1-d, 2-d and 3-d are supported); reshape it "
                            "into conv2d calls")
    if x.ndim not in (nd + 1, nd + 2):
        raise ShapeError(f"{op}: expected a {nd + 2}-d (batched) or {nd + 1}-d input for a "
                         f"weight of shape {weight.shape}, got {x.shape}")
    unbatched = x.ndim == nd + 1
    if unbatched:
        x = tg.unsqueeze(x, 0)
    stride, dilation = ints(stride, nd), ints(dilation, nd)
    if isinstance(padding, str):
        if padding == "valid":
            padding = (0,) * nd
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise ArgumentError(f"{op}: padding='same' needs stride 1 (torch's rule), got "
                                    f"stride={stride}")
            x, padding = _same_padding(op, x, weight, dilation, nd)
        else:
            raise ArgumentError(f"{op}: padding={padding!r} is not supported; use 'valid', "
                                "'same' or ints")
    padding = ints(padding, nd)
    if nd == 3:
        y = tg.conv3d(x, weight, bias, stride=tuple(stride), padding=tuple(padding),
                      dilation=tuple(dilation), groups=groups)
        return tg.squeeze(y, 0) if unbatched else y
    if nd == 1 and not isinstance(x.shape[2], int):
        y = _conv1d_symbolic(op, x, weight, bias, stride[0], padding[0], dilation[0], groups)
        return tg.squeeze(y, 0) if unbatched else y
    if nd == 1:
        x, weight = tg.unsqueeze(x, 2), tg.unsqueeze(weight, 2)
        stride, padding, dilation = (1,) + stride, (0,) + padding, (1,) + dilation
    y = tg.conv2d(x, weight, bias, stride=tuple(stride), padding=tuple(padding),
                  dilation=tuple(dilation), groups=groups)
    if nd == 1:
        y = tg.squeeze(y, 2)
    return tg.squeeze(y, 0) if unbatched else y


def _conv1d_symbolic(op, x, weight, bias, stride, padding, dilation, groups):
    """A 1-d convolution over a named (symbolic) length, which our conv2d cannot take (its
    window positions need concrete sizes): im2col spelled out over the length, as one slice
    per kernel offset (stops are size expressions; a stride is the slices' step), stacked,
    and one grouped matmul (``ir.ops.conv.unfolded_conv``). A strided output length is
    floor((L - d (k-1) - 1) / s) + 1, which sympy simplifies where the length is a multiple
    of the stride (Wav2Vec2's feature encoder over ``10 * Dim("frames")`` samples)."""
    k = weight.shape[2]
    cout, cin = weight.shape[0], x.shape[1]
    if not all(isinstance(v, int) for v in (k, cout, cin)):
        raise ShapeError(f"{op}: the channel and kernel sizes of {x.shape} and {weight.shape} "
                         "must be concrete")
    if padding:
        x = tg.pad(x, (padding, padding))
    return unfolded_conv(x, weight, bias, (stride,), (dilation,), groups)


def _dilate(x, axis, factor):
    """Insert factor-1 zeros between neighbours along an axis (a transposed conv's input)."""
    if factor == 1:
        return x
    n = x.shape[axis]
    y = tg.unsqueeze(x, axis + 1)
    pads = [0, 0] * (y.ndim - axis - 2) + [0, factor - 1]
    y = tg.pad(y, pads)
    shape = tuple(x.shape[:axis]) + (n * factor,) + tuple(x.shape[axis + 1:])
    return tg.slice_axis(tg.reshape(y, shape), axis, None, n * factor - (factor - 1))


def _conv_transpose(op, x, weight, bias, stride, padding, output_padding, groups, dilation):
    """A transposed convolution as a convolution of the stride-dilated, padded input with the
    flipped, in/out-swapped weight."""
    nd = weight.ndim - 2
    if nd not in (1, 2):
        raise ArgumentError(f"{op}: {nd}-d transposed convolution has no tensor_graphs op "
                            "(1-d and 2-d are supported)")
    unbatched = x.ndim == nd + 1
    if unbatched:
        x = tg.unsqueeze(x, 0)
    stride, padding = ints(stride, nd), ints(padding, nd)
    output_padding, dilation = ints(output_padding, nd), ints(dilation, nd)
    ks = tuple(weight.shape[2:])
    if not all(isinstance(k, int) for k in ks) or not isinstance(weight.shape[0], int):
        raise ShapeError(f"{op}: the weight's shape {weight.shape} must be concrete")
    pads = []
    for i in range(nd):
        x = _dilate(x, 2 + i, stride[i])
        edge = dilation[i] * (ks[i] - 1) - padding[i]
        pads.append((edge, edge + output_padding[i]))
    flat = []
    for before, after in reversed(pads):
        flat += [before, after]
    x = tg.pad(x, flat)
    cin, cout_g = weight.shape[0], weight.shape[1]
    w = weight
    for i in range(nd):
        w = tg.slice_axis(w, 2 + i, None, None, -1)
    w = tg.reshape(w, (groups, cin // groups, cout_g) + ks)
    w = tg.permute(w, (0, 2, 1) + tuple(range(3, 3 + nd)))
    w = tg.reshape(w, (groups * cout_g, cin // groups) + ks)
    y = _conv(op, x, w, bias, 1, 0, dilation, groups)
    return tg.squeeze(y, 0) if unbatched else y


def _convolution(a, kw):
    if kw["transposed"]:
        return _conv_transpose("convolution", kw["input"], kw["weight"], kw["bias"],
                               kw["stride"], kw["padding"], kw["output_padding"], kw["groups"],
                               kw["dilation"])
    if any(ints(kw["output_padding"])):
        raise ArgumentError("convolution: output_padding is only meaningful when transposed")
    return _conv("convolution", kw["input"], kw["weight"], kw["bias"], kw["stride"],
                 kw["padding"], kw["dilation"], kw["groups"])


def _conv_fn(op):
    return lambda a, kw: _conv(op, kw["input"], kw["weight"], kw["bias"], kw["stride"],
                               kw["padding"], kw["dilation"], kw["groups"])


def _conv_transpose_fn(op):
    return lambda a, kw: _conv_transpose(op, kw["input"], kw["weight"], kw["bias"],
                                         kw["stride"], kw["padding"], kw["output_padding"],
                                         kw["groups"], kw["dilation"])


# ---------------------------------------------------------------------------- norms
def _stats_unavailable(op):
    return Unavailable(f"{op}: its saved statistics (outputs 1 and 2) have no tensor_graphs "
                       "value; only the normalised output (output 0) is supported")


def _batch_stats(x):
    axes = (0,) + tuple(range(2, x.ndim))
    return tg.mean(x, axis=axes), tg.var(x, axis=axes)


def _batch_norm_value(op, x, weight, bias, mean, var, training, eps):
    if x.ndim < 2 and 0 in tuple(x.shape):  # torch returns an empty input as it is
        return x
    if training or mean is None or var is None:
        if not training:
            raise ArgumentError(f"{op}: inference without running statistics needs "
                                "training=True (batch statistics)")
        mean, var = _batch_stats(x)  # torch normalises with the batch's own statistics
    return tg.batch_norm(x, mean, var, weight, bias, eps=eps)


def _batch_norm(a, kw):
    return _batch_norm_value("batch_norm", kw["input"], kw["weight"], kw["bias"],
                             kw["running_mean"], kw["running_var"], kw["training"], kw["eps"])


def _native_batch_norm(op, training=None):
    def fn(a, kw):
        train = kw.get("training", False) if training is None else training
        y = _batch_norm_value(op, kw["input"], kw["weight"], kw["bias"], kw.get("running_mean"),
                              kw.get("running_var"), train, kw["eps"])
        return (y, _stats_unavailable(op), _stats_unavailable(op))
    return fn


def _instance_norm(a, kw):
    x = kw["input"]
    if not kw["use_input_stats"]:
        return tg.batch_norm(x, kw["running_mean"], kw["running_var"], kw["weight"], kw["bias"],
                             eps=kw["eps"])
    c = x.shape[1]
    if not isinstance(c, int):
        raise ShapeError(f"instance_norm: the channel dim of {x.shape} must be concrete")
    # instance norm is group norm with one channel per group
    return tg.group_norm(x, kw["weight"], kw["bias"], num_groups=c, eps=kw["eps"])


def _native_group_norm(a, kw):
    y = tg.group_norm(kw["input"], kw["weight"], kw["bias"], num_groups=kw["group"],
                      eps=kw["eps"])
    return (y, _stats_unavailable("native_group_norm"), _stats_unavailable("native_group_norm"))


def _native_layer_norm(a, kw):
    y = _layer_norm(a, kw)
    return (y, _stats_unavailable("native_layer_norm"), _stats_unavailable("native_layer_norm"))


# ---------------------------------------------------------------------------- pooling
def _pool(op, nd, fn, x, **attrs):
    """A 1-d or 2-d pool (batched or not) on our 2-d pools: a 1-d pool runs over a height of
    1, so each of its tuple attributes gains a leading neutral value."""
    if x.ndim not in (nd + 1, nd + 2):
        raise ShapeError(f"{op}: expected a {nd + 2}-d (batched) or {nd + 1}-d input, got "
                         f"{x.shape}")
    unbatched = x.ndim == nd + 1
    if unbatched:
        x = tg.unsqueeze(x, 0)
    if nd == 1:
        x = tg.unsqueeze(x, 2)
        neutral = {"kernel_size": 1, "stride": 1, "padding": 0, "dilation": 1,
                   "output_size": 1}
        attrs = {k: (neutral[k],) + tuple(v) if isinstance(v, tuple) and k in neutral else v
                 for k, v in attrs.items()}
    y = fn(x, **attrs)
    if nd == 1:
        y = tg.squeeze(y, 2)
    return tg.squeeze(y, 0) if unbatched else y


def _stride(kw, nd):
    s = kw["stride"]
    return None if s is None or len(s) == 0 else ints(s, nd)


def _ceil_kernel(kw, nd) -> tuple:
    """The pool's kernel, clipped to the padded input along an axis where ``ceil_mode``
    lets torch's one window reach past it: torch gives that axis one output, the window
    clipped at the input's end (EfficientNet's head pools a 7x7 map with a kernel of 1280).
    A window of the padded input's size is that window: same elements, same divisor (with
    or without ``count_include_pad``)."""
    kernel = ints(kw["kernel_size"], nd)
    dilation = ints(kw.get("dilation", 1), nd)
    if not kw["ceil_mode"]:
        return kernel
    sizes = kw["self"].shape[-nd:]
    return tuple(min(k, n + 2 * p) if d == 1 and isinstance(n, int) else k
                 for k, n, p, d in zip(kernel, sizes, ints(kw["padding"], nd), dilation))


def _max_pool(op, nd, indices=False):
    """max_pool1d/2d; with indices, torch's flat positions in each input plane (1-d pools are
    2-d pools over a height of 1, so a position there is the index along the length)."""
    def fn(a, kw):
        attrs = dict(kernel_size=_ceil_kernel(kw, nd),
                     stride=_stride(kw, nd) or ints(kw["kernel_size"], nd),
                     padding=ints(kw["padding"], nd), dilation=ints(kw["dilation"], nd),
                     ceil_mode=kw["ceil_mode"])
        y = _pool(op, nd, tg.max_pool2d, kw["self"], **attrs)
        if not indices:
            return y
        return (y, _pool(op, nd, tg.max_pool2d_indices, kw["self"], **attrs))
    return fn


def _avg_pool(op, nd):
    def fn(a, kw):
        return _pool(op, nd, tg.avg_pool2d, kw["self"],
                     kernel_size=_ceil_kernel(kw, nd),
                     stride=_stride(kw, nd) or ints(kw["kernel_size"], nd),
                     padding=ints(kw["padding"], nd), ceil_mode=kw["ceil_mode"],
                     count_include_pad=kw["count_include_pad"],
                     divisor_override=kw.get("divisor_override"))
    return fn


def _adaptive_avg_pool(op, nd):
    def fn(a, kw):
        size = ints(kw["output_size"], nd)
        if any(s is None for s in size):  # None keeps the input's size
            size = tuple(kw["self"].shape[-nd + i] if s is None else s for i, s in enumerate(size))
        return _pool(op, nd, tg.adaptive_avg_pool2d, kw["self"], output_size=size)
    return fn


def _adaptive_max_pool(op, nd):
    """adaptive_max_pool1d/2d: the values and torch's flat positions of each window's max."""
    def fn(a, kw):
        size = ints(kw["output_size"], nd)
        return tuple(_pool(op, nd, f, kw["self"], output_size=size)
                     for f in (tg.adaptive_max_pool2d, tg.adaptive_max_pool2d_indices))
    return fn


def _max_unpool2d(a, kw):
    """max_unpool1d/2d (torch hands the 1-d one over as a 2-d one of width 1): each value
    written at its flat index into a zero (H, W) plane of output_size; repeated indices keep
    the last writer in row-major order (torch's CPU loop does; the pooling that made the
    indices repeats only one element's place)."""
    x, where, size = kw["self"], kw["indices"], tuple(kw["output_size"])
    if x.ndim not in (3, 4) or tuple(where.shape) != tuple(x.shape) or len(size) != 2:
        raise ShapeError(f"max_unpool2d: expected an (N, C, h, w) or (C, h, w) input and "
                         f"indices of its shape and a 2-d output_size, got {x.shape}, "
                         f"{where.shape} and {size}")
    if not all(isinstance(d, int) for d in (*size, *x.shape[-2:])):
        raise ShapeError(f"max_unpool2d: the planes of {x.shape} and output_size {size} must "
                         "be concrete")
    lead = tuple(x.shape[:-2])
    flat = tg.reshape(x, lead + (x.shape[-2] * x.shape[-1],))
    zeros = tg.expand(tg.constant(0, x.dtype.name), lead + (size[0] * size[1],))
    out = tg.put_along_axis(zeros, tg.reshape(tg.cast(where, "int64"), tuple(flat.shape)),
                            flat, axis=-1)
    return tg.reshape(out, lead + size)


def _im2col(a, kw):
    return tg.unfold(kw["self"], kernel_size=tuple(kw["kernel_size"]),
                     dilation=tuple(kw["dilation"]), padding=tuple(kw["padding"]),
                     stride=tuple(kw["stride"]))


def _upsample(mode):
    def fn(a, kw):
        size, scales = kw.get("output_size"), kw.get("scale_factors")
        return tg.interpolate(kw["input"], size=None if size is None else tuple(size),
                              scale_factor=None if size is not None or scales is None
                              else tuple(scales), mode=mode,
                              align_corners=kw.get("align_corners"))
    return fn


def _upsample_sized(mode):
    """The overloads with a required output_size (after torch's decompositions)."""
    def fn(a, kw):
        return tg.interpolate(kw["self"], size=tuple(kw["output_size"]), mode=mode,
                              align_corners=kw.get("align_corners"))
    return fn


def table(aten) -> dict:
    return guarded({
        # neural-network layers
        aten.layer_norm: _layer_norm,
        aten.native_layer_norm: _native_layer_norm,
        aten.rms_norm: _rms_norm,
        aten.embedding: _embedding,
        aten.embedding_renorm: _embedding_renorm,
        aten._embedding_bag: _embedding_bag,
        aten.embedding_bag: _embedding_bag,
        aten.scaled_dot_product_attention: _sdpa,
        # convolution
        aten.conv1d.default: _conv_fn("conv1d"),
        aten.conv1d.padding: _conv_fn("conv1d"),
        aten.conv2d.default: _conv_fn("conv2d"),
        aten.conv2d.padding: _conv_fn("conv2d"),
        aten.conv3d.default: _conv_fn("conv3d"),
        aten.conv3d.padding: _conv_fn("conv3d"),
        aten.convolution.default: _convolution,
        aten.conv_transpose1d.default: _conv_transpose_fn("conv_transpose1d"),
        aten.conv_transpose2d.input: _conv_transpose_fn("conv_transpose2d"),
        # resampling
        aten.upsample_nearest1d.vec: _upsample("nearest"),
        aten.upsample_nearest2d.vec: _upsample("nearest"),
        aten.upsample_nearest3d.vec: _upsample("nearest"),
        aten._upsample_nearest_exact1d.vec: _upsample("nearest-exact"),
        aten._upsample_nearest_exact2d.vec: _upsample("nearest-exact"),
        aten.upsample_linear1d.vec: _upsample("linear"),
        aten.upsample_bilinear2d.vec: _upsample("bilinear"),
        aten.upsample_trilinear3d.vec: _upsample("trilinear"),
        aten.upsample_bicubic2d.vec: _upsample("bicubic"),
        aten.upsample_nearest1d.default: _upsample_sized("nearest"),
        aten.upsample_nearest2d.default: _upsample_sized("nearest"),
        aten.upsample_linear1d.default: _upsample_sized("linear"),
        aten.upsample_bilinear2d.default: _upsample_sized("bilinear"),
        aten.upsample_bicubic2d.default: _upsample_sized("bicubic"),
        # channel norms
        aten.group_norm: lambda a, kw: tg.group_norm(kw["input"], kw["weight"], kw["bias"],
                                                     num_groups=kw["num_groups"],
                                                     eps=kw["eps"]),
        aten.native_group_norm: _native_group_norm,
        aten.batch_norm: _batch_norm,
        aten._native_batch_norm_legit_no_training: _native_batch_norm(
            "_native_batch_norm_legit_no_training", training=False),
        aten._native_batch_norm_legit.default: _native_batch_norm("_native_batch_norm_legit"),
        aten._native_batch_norm_legit.no_stats: _native_batch_norm(
            "_native_batch_norm_legit", training=True),
        aten.native_batch_norm: _native_batch_norm("native_batch_norm"),
        aten.instance_norm: _instance_norm,
        # pooling
        aten.max_pool1d: _max_pool("max_pool1d", 1),
        aten.max_pool2d: _max_pool("max_pool2d", 2),
        aten.max_pool2d_with_indices: _max_pool("max_pool2d_with_indices", 2, indices=True),
        aten.avg_pool1d: _avg_pool("avg_pool1d", 1),
        aten.avg_pool2d: _avg_pool("avg_pool2d", 2),
        aten.adaptive_avg_pool1d: _adaptive_avg_pool("adaptive_avg_pool1d", 1),
        aten.adaptive_avg_pool2d: _adaptive_avg_pool("adaptive_avg_pool2d", 2),
        aten._adaptive_avg_pool2d: _adaptive_avg_pool("_adaptive_avg_pool2d", 2),
        aten.adaptive_max_pool1d: _adaptive_max_pool("adaptive_max_pool1d", 1),
        aten.adaptive_max_pool2d: _adaptive_max_pool("adaptive_max_pool2d", 2),
        aten.im2col: _im2col,
        aten.max_unpool2d: _max_unpool2d,
    })
