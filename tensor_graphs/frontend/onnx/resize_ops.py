"""ONNX's Resize (opset 11 on), and the deprecated Upsample as ONNX Runtime runs it, as one
matrix product per resized axis. Each mode (nearest, linear, cubic, with antialias),
coordinate transformation and option is linear in the data along an axis, so its weights
are computed once here with numpy, as ONNX's reference computes each output position (its
formulas, edge padding, exclude_outside), and applied as a constant (out, in) matrix: the
resized axes' sizes must be static; an axis kept at its size (a dynamic batch) may be
symbolic."""

from __future__ import annotations

import math

import numpy as np

from tensor_graphs.frontend.onnx.common import Ctx, ints
from tensor_graphs.ir import api as tg


def _nearest(ratio, scale, mode):
    if float(ratio).is_integer():
        return np.array([0.0, 1.0])
    return np.array({"round_prefer_floor": [ratio <= 0.5, ratio > 0.5],
                     "round_prefer_ceil": [ratio < 0.5, ratio >= 0.5],
                     "floor": [1, 0], "ceil": [0, 1]}[mode], dtype=np.float64)


def _cubic(ratio, scale, a):
    r = ratio
    return np.array([
        ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
        ((a + 2) * r - (a + 3)) * r * r + 1,
        ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
        ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1) - 4 * a,
    ])


def _cubic_antialias(ratio, scale, a):
    scale = min(scale, 1.0)

    def coeff(x):
        x = abs(x)
        if x <= 1:
            return (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1
        return a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a if x < 2 else 0.0
    start = int(np.floor(-2 / scale) + 1)
    out = np.array([coeff(scale * (i - ratio)) for i in range(start, 2 - start)])
    return out / out.sum()


def _linear(ratio, scale):
    return np.array([1 - ratio, ratio])


def _linear_antialias(ratio, scale):
    scale = min(scale, 1.0)
    start = int(np.floor(-1 / scale) + 1)
    args = (np.arange(start, start + 2 - 2 * start) - ratio) * scale
    out = np.clip(1 - np.abs(args), 0, 1)
    return out / out.sum()


def _source(x, size_in, scale, size_out, mode, roi):
    """Where output position ``x`` samples the input (None: outside a crop's roi), as ONNX
    Runtime computes it, in float32 as it does: a nearest pick on a boundary depends on it
    ((1 + 0.5) / 0.6 is 2.5 in float32, 2.4999999 in float64). align_corners,
    tf_crop_and_resize and pytorch_half_pixel span the output's integer length
    (``size_out``), as ONNX Runtime and torch do; ONNX's reference spans ``scale * size_in``,
    which differs when that is no integer (F.interpolate(scale_factor=1.5,
    align_corners=True)) and agrees with neither."""
    f = np.float32
    x, scale, n_in, n_out = f(x), f(scale), f(size_in), f(size_out)
    half = f(0.5)
    if mode == "align_corners":
        return 0.0 if size_out == 1 else float(x * (n_in - 1) / (n_out - 1))
    if mode == "asymmetric":
        return float(x / scale)
    if mode == "tf_half_pixel_for_nn":  # opset 11 only
        return float((x + half) / scale)
    if mode == "tf_crop_and_resize":
        lo, hi = f(roi[0]), f(roi[1])
        at = f(0.5 * (float(lo) + float(hi)) * (size_in - 1)) if size_out == 1 else \
            lo * (n_in - 1) + x * (hi - lo) * (n_in - 1) / (n_out - 1)
        return None if at < 0 or at > n_in - 1 else float(at)
    if mode == "pytorch_half_pixel":
        return 0.0 if size_out == 1 else float((x + half) / scale - half)
    if mode == "half_pixel":
        return float((x + half) / scale - half)
    if mode == "half_pixel_symmetric":  # spans scale * size_in; the sum in float64, as there
        offset = n_in / f(2) * (f(1) - n_out / (scale * n_in))
        return float(f(float(offset) + (float(x) + 0.5) / float(scale) - 0.5))
    raise ValueError(mode)


def weights(size_in: int, size_out: int, scale: float, coeffs, coordinate: str,
            exclude_outside: bool, roi=None) -> tuple[np.ndarray, np.ndarray]:
    """(out, in) weights and the (out,) positions outside a crop (extrapolated)."""
    m = np.zeros((size_out, size_in))
    outside = np.zeros(size_out, dtype=bool)
    for x in range(size_out):
        at = _source(float(x), size_in, scale, size_out, coordinate, roi)
        if at is None:
            outside[x] = True
            continue
        base = math.floor(at)
        ratio = 1.0 if float(at).is_integer() else at - base
        c = np.array(coeffs(ratio, scale), dtype=np.float64)
        n = len(c)
        pad = math.ceil(n / 2)
        centre = at + pad
        window = range(max(0, base + pad - n - 1), min(size_in + 2 * pad, base + pad + n + 2))
        idx = sorted(sorted(window, key=lambda i: (abs(centre - i), i))[:n])
        idx = [i - pad for i in idx]
        if exclude_outside:
            c = np.where([0 <= i < size_in for i in idx], c, 0.0)
            c = c / c.sum()
        for i, w in zip(idx, c):
            m[x, min(max(i, 0), size_in - 1)] += w
    return m, outside


def _concrete(c: Ctx, x, axes) -> None:
    """Refuse, naming the axes, a resize of symbolic ones: its (out, in) weights are built
    from the sizes. Axes kept at their size (a dynamic batch or channel) may be symbolic."""
    named = [a for a in axes if not isinstance(x.shape[a], int)]
    if named:
        raise c.refuse(
            f"it resizes the symbolic axis(es) {named} of {x.shape} (the weights are built "
            "per size); export the model with static sizes for those axes")


def _resize(c: Ctx):
    if c.opset < 11:
        raise c.refuse("Resize before opset 11 (scales only, no coordinate modes)")
    x = c.t(0)
    if not x.dtype.is_float:
        raise c.refuse(f"a {x.dtype.name} input (float inputs are mapped)")
    rank = x.ndim
    axes = [a % rank for a in c.a("axes", list(range(rank)))]
    roi = c.s(1, "roi").astype(np.float64).reshape(-1) if c.has(1) else np.zeros(0)
    scales = c.s(2, "scales").astype(np.float64).reshape(-1) if c.has(2) and \
        c.s(2, "scales").size else None
    sizes = ints(c.s(3, "sizes")) if c.n > 3 and c.has(3) else None
    full_scale = [1.0] * rank
    out_size = list(x.shape)
    if sizes is not None:
        # an axis whose size is kept (a symbolic batch, Shape -> Concat'ed back) is not
        # resized; the weights of the others are built from their concrete sizes
        kept = {a for i, a in enumerate(axes) if sizes[i] == x.shape[a]}
        _concrete(c, x, [a for a in axes if a not in kept])
        if any(not isinstance(sizes[i], int) for i, a in enumerate(axes) if a not in kept):
            raise c.refuse(f"sizes {sizes} computed from symbolic dims for the static axes "
                           f"of {x.shape}; export the model with static sizes")
        policy = c.a("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            _concrete(c, x, axes)  # one ratio over every listed axis
            ratio = [np.float32(sizes[i]) / np.float32(x.shape[a]) for i, a in enumerate(axes)]
            one = min(ratio) if policy == "not_larger" else max(ratio)
            sizes = [int(one * np.float32(x.shape[a]) + 0.5) for a in axes]
            ratio = [float(one)] * len(axes)
        else:
            # float32, as ONNX Runtime divides: the scale is what half_pixel divides by
            ratio = [1.0 if a in kept else float(np.float32(sizes[i]) / np.float32(x.shape[a]))
                     for i, a in enumerate(axes)]
        for i, a in enumerate(axes):
            full_scale[a], out_size[a] = ratio[i], sizes[i]
    elif scales is not None:
        _concrete(c, x, [a for i, a in enumerate(axes) if not math.isclose(scales[i], 1.0)])
        for i, a in enumerate(axes):
            full_scale[a] = float(scales[i])
            if not math.isclose(full_scale[a], 1.0):  # floor(scale * size) in float32
                out_size[a] = int(np.float32(full_scale[a]) * np.float32(x.shape[a]))
    else:
        raise c.refuse("neither scales nor sizes")
    mode = c.a("mode", "nearest")
    nearest = c.a("nearest_mode", "round_prefer_floor")
    if mode not in ("nearest", "linear", "cubic") or nearest not in (
            "round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
        raise c.refuse(f"mode '{mode}' with nearest_mode '{nearest}' (ONNX has the modes "
                       "nearest, linear and cubic, and the nearest_modes round_prefer_floor, "
                       "round_prefer_ceil, floor and ceil); export the model with one of those")
    antialias = bool(c.a("antialias", 0))
    a = c.a("cubic_coeff_a", -0.75)
    coeffs = {
        "nearest": lambda r, s: _nearest(r, s, nearest),
        "linear": _linear_antialias if antialias else _linear,
        "cubic": (lambda r, s: _cubic_antialias(r, s, a)) if antialias else
                 (lambda r, s: _cubic(r, s, a)),
    }[mode]
    coordinate = c.a("coordinate_transformation_mode", "half_pixel")
    known = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
             "asymmetric", "tf_crop_and_resize"] + (["tf_half_pixel_for_nn"] if c.opset < 13
                                                    else [])
    if coordinate not in known:
        raise c.refuse(f"coordinate_transformation_mode '{coordinate}' (opset {c.opset} has "
                       f"{', '.join(known)}); export the model with one of those")
    return _resample(c, x, axes, full_scale, out_size, coeffs, coordinate,
                     bool(c.a("exclude_outside", 0)), roi, c.a("extrapolation_value", 0.0))


def _resample(c: Ctx, x, axes, full_scale, out_size, coeffs, coordinate, exclude_outside=False,
              roi=None, extrapolate=0.0):
    """``x`` resized on each of ``axes`` whose size or scale changes: one constant (out,
    in) weight matrix per axis, applied as a matmul on that axis moved last."""
    rank = x.ndim
    out = x
    for i, ax in enumerate(axes):
        axis_roi = (roi[i], roi[len(axes) + i]) if roi is not None and roi.size else (0.0, 1.0)
        if math.isclose(full_scale[ax], 1.0) and out_size[ax] == x.shape[ax] and \
                (coordinate != "tf_crop_and_resize" or axis_roi == (0.0, 1.0)):
            continue
        _concrete(c, x, [ax])  # a crop of a symbolic axis
        m, outside = weights(x.shape[ax], out_size[ax], full_scale[ax], coeffs, coordinate,
                             exclude_outside, axis_roi)
        moved = tg.transpose(out, ax, -1) if ax != rank - 1 else out
        moved = tg.matmul(moved, tg.constant(m.T.astype(x.dtype.np_dtype)))
        if outside.any():
            moved = tg.add(moved, tg.constant((outside * extrapolate).astype(x.dtype.np_dtype)))
        out = tg.transpose(moved, ax, -1) if ax != rank - 1 else moved
    return out


def _upsample(c: Ctx):
    """The deprecated Upsample (opset 7's scales attribute, 9's scales input) as ONNX
    Runtime runs it: Resize with asymmetric coordinates, the output floor(scale * size),
    nearest picking the floor of the source position (its ceiling where the axis shrinks)."""
    x = c.t(0)
    scales = c.a("scales") if c.opset < 9 else c.s(1, "scales")
    scales = [float(v) for v in np.asarray(scales, dtype=np.float64).reshape(-1)]
    mode = c.a("mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear") or not x.dtype.is_float:
        raise c.refuse(f"mode '{mode}' on a {x.dtype.name} input (float inputs in modes "
                       "nearest and linear are mapped)")
    if len(scales) != x.ndim:
        raise c.refuse(f"{len(scales)} scales for the {x.ndim} axes of {x.shape}")
    axes = [a for a, s in enumerate(scales) if not math.isclose(s, 1.0)]
    _concrete(c, x, axes)
    out_size = [int(np.float32(s) * np.float32(d)) if a in axes else d
                for a, (s, d) in enumerate(zip(scales, x.shape))]
    if mode == "nearest":
        def coeffs(r, s):
            return _nearest(r, s, "floor" if s >= 1 else "ceil")
    else:
        coeffs = _linear
    return _resample(c, x, axes, scales, out_size, coeffs, "asymmetric")


def table() -> dict:
    return {"Resize": _resize, "Upsample": _upsample}


__all__ = ["table", "weights"]
