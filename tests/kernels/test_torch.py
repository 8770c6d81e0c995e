"""The torch backend: every torch kernel against the float64 reference, zero-copy conversion,
CUDA kernels (run only where a GPU is usable) and the copy_to kernels."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.devices import simulated_cuda  # noqa: E402
from tensor_graphs.kernels import copy as copies  # noqa: E402
from tensor_graphs.kernels.torch import _gpu_build, convert, cuda_available  # noqa: E402
from tensor_graphs.kernels.verify import budget  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

CUDA = cuda_available() and simulated_cuda() is None  # a real GPU: these tests move to "cuda"
needs_cuda = pytest.mark.skipif(not CUDA, reason="no usable CUDA GPU")
SIZES = (1, 7, 33)


# ---------------------------------------------------------------------------- helpers
class Feeds:
    """Makes input leaves with random values: ``b((3, 4), "float32", low=0.1)``."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.values: dict[str, np.ndarray] = {}

    def __call__(self, shape, dtype="float32", low=None, high=None, values=None):
        name = f"t{len(self.values)}"
        node = tg.input(name, tuple(shape), dtype)
        np_dtype = node.dtype.np_dtype
        if values is not None:
            arr = np.asarray(values).astype(np_dtype)
        elif node.dtype.is_bool:
            arr = self.rng.random(shape) < 0.5
        elif node.dtype.is_int:
            lo = 0 if node.dtype.name == "uint8" else -9 if low is None else low
            arr = self.rng.integers(lo, 10 if high is None else high, size=shape).astype(np_dtype)
        else:
            if low is not None:
                arr = self.rng.uniform(low, high or low + 3.0, size=shape)
            else:
                arr = self.rng.standard_normal(shape)
            arr = arr.astype(np_dtype)
        self.values[name] = arr
        return node


def rel_error(got, ref) -> float:
    """The project's error measure on the finite part; NaN and inf must sit where the float64
    reference rounded to the output's dtype has them (float32 ``1e30 * 1e30`` is inf while the
    reference holds 1e60), else the error is inf."""
    got = np.asarray(got)
    g = got.astype(np.float64)
    r = np.asarray(ref).astype(np.float64)
    if g.shape != r.shape:
        return float("inf")
    rounded = r
    if got.dtype.kind in "fV":
        with np.errstate(over="ignore"):
            rounded = r.astype(got.dtype).astype(np.float64)
    if (np.isnan(g) != np.isnan(r)).any():
        return float("inf")
    if (np.isinf(g) != np.isinf(rounded)).any() or (g[np.isinf(g)] != rounded[np.isinf(g)]).any():
        return float("inf")
    finite = np.isfinite(r) & np.isfinite(rounded)
    return relative_error(g[finite], r[finite])


def only(nodes, feeds):
    """The feeds of the leaves ``nodes`` reach (evaluate rejects unknown feed names)."""
    names = {n.name for n in tg.nodes(nodes) if n.op.name == "input"}
    return {k: v for k, v in feeds.items() if k in names}


def run_kernel(k, node, feeds):
    """Run kernel ``k`` on the values its pattern binds in ``node``; check it against the
    float64 reference. Returns (output, inputs)."""
    matched = dict(tg.kernels.matching(node, backends=["torch"]))
    assert k in matched, f"{k.name} does not match {tg.format_graph(node)}"
    bound = k.arguments(matched[k])  # a variadic input spread in place
    args = tg.evaluate(bound, only(bound, feeds)) if bound else []
    attrs = {a: node.attrs[a] for a in k.attrs}
    got = k(*args, **attrs)
    ref = tg.evaluate(node, only(node, feeds), dtype="float64")
    assert isinstance(got, np.ndarray), type(got)
    assert got.shape == tuple(node.shape), (k.name, got.shape, node.shape)
    assert got.dtype == node.dtype.np_dtype, (k.name, got.dtype, node.dtype)
    err = rel_error(got, ref)
    allowed = budget(k, got.dtype)  # the tolerance; half outputs add their own rounding
    assert err <= allowed, f"{k.name}: error {err:.3g} > tolerance {allowed:.3g}"
    if not k.view:
        assert not any(np.shares_memory(got, a) for a in args), f"{k.name} aliases an input"
    return got, args


# ---------------------------------------------------------------------------- the cases
F32, F64 = "float32", "float64"
FLOATS = (F32, F64)
INTS = ("uint8", "int8", "int32", "int64")
ALL = ("bool",) + INTS + ("float16", "bfloat16") + FLOATS


def unary(fn, low=None):
    return lambda b, n, dt: [fn(b((n, 5), dt, low=low)), fn(b((3, n, 2), dt, low=low))]


def binary(fn, low=None):
    return lambda b, n, dt: [fn(b((n, 5), dt, low=low), b((5,), dt, low=low)),
                             fn(b((n, 1, 3), dt, low=low), b((2, 1), dt, low=low))]


def reductions(fn):
    return lambda b, n, dt: [fn(b((n, 6, 3), dt), axis=axis)
                             for axis in (None, 0, 1, -1, (0, 2))]


def _sdpa(b, n, dt):
    q, k, v = b((2, 4, n, 8), dt), b((2, 2, n + 3, 8), dt), b((2, 2, n + 3, 8), dt)
    qq, kk, vv = b((1, 3, n, 4), dt), b((1, 3, n, 4), dt), b((1, 3, n, 4), dt)
    return [tg.scaled_dot_product_attention(q, k, v),
            tg.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
            tg.scaled_dot_product_attention(qq, kk, vv, is_causal=True),
            tg.scaled_dot_product_attention(qq[0], kk[0], vv[0])]


def _masked_rows(b, n, sk):
    """A bool mask (n, sk) whose row 0 attends to nothing."""
    mask = b.rng.random((n, sk)) < 0.6
    mask[0] = False
    return mask


def _sdpa_mask(b, n, dt):
    q, k, v = b((2, 4, n, 8), dt), b((2, 2, n + 3, 8), dt), b((2, 2, n + 3, 8), dt)
    bool_mask = b((n, n + 3), "bool", values=_masked_rows(b, n, n + 3))
    add = np.where(_masked_rows(b, n, n + 3), 0.0, -np.inf) + b.rng.standard_normal((n, n + 3))
    float_mask = b((1, 4, n, n + 3), dt, values=np.broadcast_to(add, (1, 4, n, n + 3)))
    f32_mask = b((n, n + 3), F32, values=add)
    return [tg.scaled_dot_product_attention(q, k, v, bool_mask),
            tg.scaled_dot_product_attention(q, k, v, bool_mask, is_causal=True),
            tg.scaled_dot_product_attention(q, k, v, float_mask),
            tg.scaled_dot_product_attention(q, k, v, float_mask, is_causal=True, scale=0.5),
            tg.scaled_dot_product_attention(q, k, v, f32_mask)]


def _conv(bias):
    def make(b, n, dt):
        x = b((2, 4, n + 4, n + 2), dt)
        out = []
        for w_shape, kw in (((6, 4, 3, 3), {}), ((6, 2, 3, 2), dict(groups=2, stride=2,
                                                                     padding=1)),
                            ((3, 4, 2, 3), dict(dilation=(2, 1), padding="same")),
                            ((5, 4, 1, 1), dict(padding="valid"))):
            w = b(w_shape, dt)
            out.append(tg.conv2d(x, w, b((w_shape[0],), dt) if bias else None, **kw))
        out.append(tg.conv2d(b((4, n + 3, 5), dt), b((2, 4, 3, 3), dt),
                             b((2,), dt) if bias else None, padding=1))
        return out
    return make


def _interpolate(b, n, dt):
    x = b((1, 2, n, n + 1), dt)
    out = [tg.interpolate(x, scale_factor=2), tg.interpolate(x, size=(2 * n + 1, 3)),
           tg.interpolate(x, size=(n + 2, 2 * n), mode="nearest-exact"),
           tg.interpolate(x, size=(2, 3), mode="area")]
    if dt == F32:
        out.append(tg.interpolate(b((2, 3, n), dt), size=2 * n + 3))
    return out


def _interpolate_linear(b, n, dt):
    x = b((1, 2, n, n + 1), dt)
    return [tg.interpolate(x, scale_factor=1.7, mode="bilinear"),
            tg.interpolate(x, size=(3, n + 4), mode="bilinear", align_corners=True),
            tg.interpolate(b((2, 3, n), dt), scale_factor=2.5, mode="linear"),
            tg.interpolate(b((1, 1, 2, n, 3), dt), size=(3, 4, 5), mode="trilinear")]


def _layer_norm(which):
    def make(b, n, dt):
        out = []
        for shape in ((n, 8), (2, 3, n)):
            d = shape[-1]
            w = b((d,), dt) if "w" in which else None
            bias = b((d,), dt) if "b" in which else None
            out.append(tg.layer_norm(b(shape, dt), w, bias, eps=1e-3))
        return out
    return make


def _gather(b, n, dt):
    x = b((n, 4, 3), dt)
    return [tg.gather(x, b((5,), "int64", low=0, high=n), axis=0),
            tg.gather(x, b((2, n), "int32", low=0, high=4), axis=1),
            tg.gather(x, b((), "uint8", values=2), axis=2)]


def _pools(kind):
    def make(b, n, dt):
        x = b((2, 3, n + 3, n + 4), dt)
        if kind == "max":
            return [tg.max_pool2d(x, kernel_size=2), tg.max_pool2d(x, kernel_size=3, stride=2,
                                                                   padding=1, ceil_mode=True),
                    tg.max_pool2d(x, kernel_size=(2, 3), dilation=2, padding=1),
                    tg.max_pool2d(b((3, n + 2, 4), dt), kernel_size=2, stride=1)]
        if kind == "avg":
            return [tg.avg_pool2d(x, kernel_size=2),
                    tg.avg_pool2d(x, kernel_size=3, stride=2, padding=1, ceil_mode=True),
                    tg.avg_pool2d(x, kernel_size=3, stride=2, padding=1, ceil_mode=True,
                                  count_include_pad=False),
                    tg.avg_pool2d(x, kernel_size=2, divisor_override=3)]
        return [tg.adaptive_avg_pool2d(x, output_size=(3, 2)),
                tg.adaptive_avg_pool2d(x, output_size=(None, n + 7)),
                tg.adaptive_avg_pool2d(b((3, n + 2, 4), dt), output_size=2)]
    return make


def _rope(b, n, dt):
    return [tg.rotary_embedding(b((2, 3, n, 8), dt), b((n, 8), dt), b((n, 8), dt)),
            tg.rotary_embedding(b((n, 2), dt), b((n, 2), dt), b((1, 2), dt))]


def _cast(b, n, dt):
    x = b((n, 4), dt)
    targets = ["bool", "float32", "float64"] if x.dtype.is_float else ["bool", *INTS, *FLOATS]
    return [tg.cast(x, t) for t in targets if t != dt]


CASES = {
    "neg": (unary(tg.neg), ("int8", "int32", "int64", "float16", "bfloat16") + FLOATS),
    "exp": (unary(tg.exp), FLOATS),
    "log": (unary(tg.log, low=0.1), FLOATS),
    "sqrt": (unary(tg.sqrt, low=0.1), FLOATS),
    "reciprocal": (unary(tg.reciprocal), FLOATS),
    "sin": (unary(tg.sin), FLOATS),
    "erf": (unary(tg.erf), FLOATS),
    # the pointwise families (kernels/torch/pointwise.py); int divisors in [1, 10)
    **{name: (unary(getattr(tg, name), low=0.1 if name in ("log2", "log10") else None), FLOATS)
       for name in ("log1p", "expm1", "log2", "log10", "tan", "erfc", "floor", "ceil", "trunc",
                    "round_half_even")},
    "atan2": (binary(tg.atan2), FLOATS),
    "fmod": (lambda b, n, dt: [tg.fmod(b((n, 5), dt), b((5,), dt, low=1)),
                               tg.fmod(b((n, 1, 3), dt), b((2, 1), dt, low=1))],
             ("int8", "int32", "int64")),
    "floor_divide": (lambda b, n, dt: [tg.floor_divide(b((n, 5), dt), b((5,), dt, low=1)),
                                       tg.floor_divide(b((n, 1, 3), dt), b((2, 1), dt, low=1))],
                     ("int8", "int32", "int64") + FLOATS),
    "bitwise_and": (binary(tg.bitwise_and), ("uint8", "int8", "int32", "int64")),
    "add": (binary(tg.add), ("bool", "int8", "int64") + FLOATS),
    "mul": (binary(tg.mul), ("bool", "uint8", "int32") + FLOATS),
    "maximum": (binary(tg.maximum), ALL),
    "pow": (binary(tg.pow, low=0.2), FLOATS),
    "equal": (binary(tg.equal), ("bool", "int32", "bfloat16", F32)),
    "less": (binary(tg.less), ("uint8", "int64", "float16", F64)),
    "where": (lambda b, n, dt: [tg.where(b((n, 1), "bool"), b((n, 4), dt), b((4,), dt))],
              ("bool", "int8", "bfloat16", F32)),
    "cast": (_cast, ("bool", "int8", "int64", F32, F64)),
    "sum": (reductions(tg.sum), ("int32", "int64") + FLOATS),
    "max": (reductions(tg.max), ("bool", "int8", "float16") + FLOATS),
    "mean": (reductions(tg.mean), FLOATS),
    "var": (lambda b, n, dt: [tg.var(b((n + 2, 6, 3), dt), axis=a, correction=c)
                              for a, c in ((None, 0), (0, 1), ((1, 2), 0))], FLOATS),
    "min": (reductions(tg.min), ("bool", "uint8", "int64") + FLOATS),
    "argmax": (lambda b, n, dt: [tg.argmax(b((n, 6, 3), dt), axis=a, keepdims=kd)
                                 for a in (None, 0, 2) for kd in (False, True)],
               ("bool", "int8", F32)),
    "argmin": (lambda b, n, dt: [tg.argmin(b((n, 6, 3), dt), axis=a, keepdims=kd)
                                 for a in (None, 1) for kd in (False, True)], ("int32", F64)),
    "cumsum": (lambda b, n, dt: [tg.cumsum(b((n, 5), dt), axis=a) for a in (0, 1)],
               ("int64",) + FLOATS),
    "logsumexp": (lambda b, n, dt: [tg.logsumexp(b((n, 5), dt), axis=a, keepdims=kd)
                                    for a in (0, -1) for kd in (False, True)], FLOATS),
    "softmax": (lambda b, n, dt: [tg.softmax(b((n, 5), dt), axis=a) for a in (0, -1)], FLOATS),
    "log_softmax": (lambda b, n, dt: [tg.log_softmax(b((3, n), dt), axis=a) for a in (0, 1)],
                    FLOATS),
    "sub": (binary(tg.sub), ("int32",) + FLOATS),
    "div": (binary(tg.div, low=0.5), FLOATS),
    "minimum": (binary(tg.minimum), ALL),
    "abs": (unary(tg.abs), ("uint8", "int8", "bfloat16") + FLOATS),
    "sign": (unary(tg.sign), ("int8", "float16") + FLOATS),
    "square": (unary(tg.square), ("int32",) + FLOATS),
    "rsqrt": (unary(tg.rsqrt, low=0.1), FLOATS),
    "clamp": (lambda b, n, dt: [tg.clamp(b((n, 5), dt), min=-0.5, max=0.7),
                                tg.clamp(b((n, 5), dt), min=0.1),
                                tg.clamp(b((n, 5), dt), max=-0.2)], FLOATS),
    "relu": (unary(tg.relu), ("int8", "float16", "bfloat16") + FLOATS),
    "sigmoid": (unary(tg.sigmoid), FLOATS),
    "tanh": (unary(tg.tanh), FLOATS),
    "gelu": (lambda b, n, dt: [tg.gelu(b((n, 5), dt)), tg.gelu(b((n, 3), dt), approximate="tanh")],
             FLOATS),
    "silu": (unary(tg.silu), FLOATS),
    "elu": (lambda b, n, dt: [tg.elu(b((n, 5), dt)), tg.elu(b((n, 5), dt), alpha=0.3)], FLOATS),
    "selu": (unary(tg.selu), FLOATS),
    "softplus": (lambda b, n, dt: [tg.softplus(b((n, 5), dt) * 8),
                                   tg.softplus(b((n, 5), dt) * 8, beta=2.0, threshold=5.0)],
                 FLOATS),
    "logical_not": (unary(tg.logical_not), ("bool",)),
    "logical_and": (binary(tg.logical_and), ("bool",)),
    "logical_or": (binary(tg.logical_or), ("bool",)),
    "greater": (binary(tg.greater), ("int8", F32)),
    "less_equal": (binary(tg.less_equal), ("bool", F64)),
    "greater_equal": (binary(tg.greater_equal), ("uint8", "float16")),
    "not_equal": (binary(tg.not_equal), ("int64", "bfloat16", F32)),
    "isnan": (lambda b, n, dt: [tg.isnan(b((n, 4), dt, values=np.where(
        b.rng.random((n, 4)) < 0.3, np.nan, 1.5)))] if dt in FLOATS else
        [tg.isnan(b((n, 4), dt))], ("int32",) + FLOATS),
    "reshape": (lambda b, n, dt: [tg.reshape(b((n, 6), dt), (3, n, 2)),
                                  tg.reshape(b((2, n), dt), (-1,))], ALL),
    "permute": (lambda b, n, dt: [tg.permute(b((n, 6, 2), dt), (2, 0, 1))], ALL),
    "expand": (lambda b, n, dt: [tg.expand(b((n, 1), dt), (n, 5))], ("bool", "int8", F32)),
    "slice": (lambda b, n, dt: [b((n + 4, 6), dt)[1:n + 3:2, ::3],
                                b((n, 5), dt)[:, 1:]], ("int64", F32, F64)),
    "pad": (lambda b, n, dt: [tg.pad(b((n, 3), dt), (1, 2)),
                              tg.pad(b((n, 3), dt), (0, 1, 2, 0), value=1)],
            ("bool", "int8") + FLOATS),
    "gather": (_gather, ("bool", "int32") + FLOATS),
    "concat": (lambda b, n, dt: [tg.concat([b((n, 3), dt), b((2, 3), dt)]),
                                 tg.concat([b((2, i + 1, n), dt) for i in range(9)], axis=1)],
               ("bool", "int8") + FLOATS),
    "matmul": (lambda b, n, dt: [b((n, 5), dt) @ b((5, 3), dt),
                                 b((2, n, 4), dt) @ b((4, n), dt),
                                 b((n,), dt) @ b((3, n, 2), dt),
                                 b((2, 1, 3, n), dt) @ b((n, 4), dt)], FLOATS),
    "iota": (lambda b, n, dt: [tg.iota(n, dt)], ("int64", F32)),
    # the Philox words of a key over the whole int64 range (kernels/torch/random.py)
    "random_bits": (lambda b, n, dt: [tg.random_bits(b((2,), dt, low=-2 ** 62, high=2 ** 62),
                                                     (n, 3), n)], ("int64",)),
    "dropout": (lambda b, n, dt: [tg.dropout(b((n, 5), dt), 0.3, b((2,), "int64", low=-2 ** 62,
                                                                   high=2 ** 62), stream=n)],
                FLOATS),
    "layer_norm": (_layer_norm("wb"), FLOATS),
    "layer_norm_weight": (_layer_norm("w"), FLOATS),
    "layer_norm_bias": (_layer_norm("b"), FLOATS),
    "layer_norm_plain": (_layer_norm(""), FLOATS),
    "rms_norm": (lambda b, n, dt: [tg.rms_norm(b((n, 8), dt), b((8,), dt), eps=1e-4),
                                   tg.rms_norm(b((2, n), dt), b((n,), dt))], FLOATS),
    "rms_norm_plain": (lambda b, n, dt: [tg.rms_norm(b((3, n), dt))], FLOATS),
    "linear": (lambda b, n, dt: [tg.linear(b((n, 5), dt), b((3, 5), dt), b((3,), dt)),
                                 tg.linear(b((2, 3, n), dt), b((4, n), dt), b((4,), dt))],
               FLOATS),
    "linear_nobias": (lambda b, n, dt: [tg.linear(b((n, 5), dt), b((3, 5), dt)),
                                        tg.linear(b((n,), dt), b((2, n), dt))], FLOATS),
    "embedding": (lambda b, n, dt: [tg.embedding(b((2, n), "int64", low=0, high=6),
                                                 b((6, 4), dt)),
                                    tg.embedding(b((n,), "int32", low=0, high=n), b((n, 3), dt)),
                                    tg.embedding(b((n,), "uint8", low=0, high=3),
                                                 b((3, 2), dt))], ("bfloat16", "int8") + FLOATS),
    "scaled_dot_product_attention": (_sdpa, FLOATS),
    "scaled_dot_product_attention_mask": (_sdpa_mask, FLOATS),
    "rotary_embedding": (_rope, FLOATS),
    "triu": (lambda b, n, dt: [tg.triu(b((n, 5), dt)), tg.triu(b((2, n, 3), dt), diagonal=-1)],
             ("bool", F32)),
    "tril": (lambda b, n, dt: [tg.tril(b((n, 5), dt), diagonal=2)], ("int8", F64)),
    "tile": (lambda b, n, dt: [tg.tile(b((n, 2), dt), reps=(2, 3)),
                               tg.tile(b((n,), dt), reps=(3, 1, 2)),
                               tg.tile(b((n, 2), dt), reps=(1, 1))], ("bool", F32)),
    "conv2d": (_conv(True), FLOATS),
    "conv2d_nobias": (_conv(False), FLOATS),
    "max_pool2d": (_pools("max"), ("int32", "bfloat16") + FLOATS),
    "avg_pool2d": (_pools("avg"), FLOATS),
    "adaptive_avg_pool2d": (_pools("adaptive"), FLOATS),
    "interpolate": (_interpolate, FLOATS),
    "interpolate_linear": (_interpolate_linear, FLOATS),
    "group_norm": (lambda b, n, dt: [tg.group_norm(b((2, 6, n), dt), b((6,), dt), b((6,), dt),
                                                   num_groups=3, eps=1e-3)], FLOATS),
    "group_norm_plain": (lambda b, n, dt: [tg.group_norm(b((2, 4, n, 3), dt), num_groups=2)],
                         FLOATS),
    "batch_norm": (lambda b, n, dt: [tg.batch_norm(b((2, 3, n), dt), b((3,), dt),
                                                   b((3,), dt, low=0.5), b((3,), dt),
                                                   b((3,), dt))], FLOATS),
    "batch_norm_plain": (lambda b, n, dt: [tg.batch_norm(b((n, 3, 2, 2), dt), b((3,), dt),
                                                         b((3,), dt, low=0.5))], FLOATS),
    "mse_loss": (lambda b, n, dt: [tg.mse_loss(b((n, 4), dt), b((n, 4), dt), reduction=r)
                                   for r in ("mean", "sum", "none")], FLOATS),
    "l1_loss": (lambda b, n, dt: [tg.l1_loss(b((n, 4), dt), b((n, 4), dt), reduction=r)
                                  for r in ("mean", "sum", "none")], FLOATS),
}


def _label(name: str) -> str:
    """'torch_cuda_tanh' -> 'tanh'."""
    return name.removeprefix("torch_cuda_").removeprefix("torch_")


def _dtypes_to_try(k, dtypes) -> tuple:
    """The case's dtypes, plus float16 and bfloat16 where the kernel takes them and the case
    is a float one."""
    extra = tuple(d for d in ("float16", "bfloat16") if d not in dtypes and F32 in dtypes
                  and k.dtypes is not None and d in {t.name for t in k.dtypes})
    return tuple(dtypes) + extra


def _cpu_kernels():
    return [k for k in tg.kernels.all() if k.backend == "torch" and k.device == "cpu"]


def test_every_torch_kernel_has_a_case():
    names = {_label(k.name) for k in _cpu_kernels()}
    assert names, "no torch kernel registered although torch imports"
    assert names - set(CASES) == set()


@pytest.mark.parametrize("name", [k.name for k in _cpu_kernels()])
def test_torch_kernel_matches_reference(name):
    k = tg.kernels.get(name)
    make, dtypes = CASES[_label(name)]
    for dtype in _dtypes_to_try(k, dtypes):
        for n in SIZES:
            b = Feeds(seed=n)
            ran = 0
            for node in make(b, n, dtype):
                if _turned_away(k, node):
                    continue
                run_kernel(k, node, b.values)
                ran += 1
            assert ran, f"{name}: no case for {dtype}, size {n}"


def _turned_away(k, node) -> bool:
    """The kernel's own constraints decline this node (the case list covers more)."""
    m = next(iter(tg.pat.iter_matches(k.pattern, node, partial=False)), None)
    if m is None or any(v not in m.bindings for v in k.inputs):
        return False
    bound = k.arguments(m)
    return k.constraint_failure([b.shape for b in bound], [b.dtype for b in bound],
                                dict(node.attrs)) is not None


# ---------------------------------------------------------------------------- special values
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 1e-30, 3.0, -2.5, 20.0,
                    -20.0, 88.0, -88.0, 1e4, -1e4])
UNARY_SPECIAL = ["neg", "exp", "log", "sqrt", "reciprocal", "sin", "erf", "abs", "sign", "square",
                 "rsqrt", "relu", "sigmoid", "tanh", "gelu", "silu", "elu", "selu", "softplus",
                 "isnan", "log1p", "expm1", "log2", "log10", "erfc", "floor", "ceil", "trunc",
                 "round_half_even"]


@pytest.mark.parametrize("label", UNARY_SPECIAL)
@pytest.mark.parametrize("dtype", FLOATS)
def test_special_values_propagate_like_the_reference(label, dtype):
    k = tg.kernels.get(f"torch_{label}")
    x = tg.input("x", (len(SPECIAL),), dtype)
    builders = {"gelu": [tg.gelu, lambda v: tg.gelu(v, approximate="tanh")]}
    for fn in builders.get(label, [getattr(tg, label)]):
        node = fn(x)
        with np.errstate(all="ignore"):
            run_kernel(k, node, {"x": SPECIAL.astype(dtype)})


@pytest.mark.parametrize("label", ["add", "mul", "maximum", "minimum", "pow", "sub", "div",
                                   "equal", "less", "greater", "not_equal", "atan2",
                                   "floor_divide"])
def test_special_values_binary(label):
    k = tg.kernels.get(f"torch_{label}")
    a = tg.input("a", (len(SPECIAL), 1), "float32")
    b = tg.input("b", (len(SPECIAL),), "float32")
    with np.errstate(all="ignore"):
        run_kernel(k, getattr(tg, label)(a, b), {"a": SPECIAL[:, None].astype(np.float32),
                                               "b": SPECIAL.astype(np.float32)})


def test_reductions_propagate_nan_and_inf():
    x = np.array([[1.0, np.nan, 3.0], [np.inf, 2.0, -np.inf], [-1.0, 5.0, 5.0]], np.float32)
    node = tg.input("x", (3, 3))
    for label, fn in (("max", lambda v: tg.max(v, 1)), ("min", lambda v: tg.min(v, axis=1)),
                      ("argmax", lambda v: tg.argmax(v, axis=1)),
                      ("argmin", lambda v: tg.argmin(v, axis=1)),
                      ("softmax", tg.softmax), ("logsumexp", tg.logsumexp),
                      ("sum", lambda v: tg.sum(v, 0))):
        with np.errstate(all="ignore"):
            run_kernel(tg.kernels.get(f"torch_{label}"), fn(node), {"x": x})


def test_attention_fully_masked_rows_give_zero():
    k = tg.kernels.get("torch_scaled_dot_product_attention_mask")
    q = tg.input("q", (1, 2, 3, 4))
    mask = tg.input("m", (3, 5), "bool")
    node = tg.scaled_dot_product_attention(q, tg.input("k", (1, 2, 5, 4)),
                                           tg.input("v", (1, 2, 5, 4)), mask)
    rng = np.random.default_rng(3)
    m = np.ones((3, 5), bool)
    m[1] = False
    feeds = {"q": rng.standard_normal((1, 2, 3, 4), np.float32),
             "k": rng.standard_normal((1, 2, 5, 4), np.float32),
             "v": rng.standard_normal((1, 2, 5, 4), np.float32), "m": m}
    got, _ = run_kernel(k, node, feeds)
    assert (got[:, :, 1] == 0).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("params", ["own", "float32"])
def test_layer_norm_writes_into_out_in_every_float_dtype(dtype, params):
    """aten's out variant checks the dtype of its mean/rstd buffers: on the CPU the input's
    (float32 for half inputs with float32 parameters); half inputs given float32 buffers
    raised, so a half program with an arena place for the norm failed."""
    k = tg.kernels.get("torch_layer_norm")
    rng = np.random.default_rng(0)
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    pdt = dt if params == "own" else np.dtype(np.float32)
    x = rng.standard_normal((2, 3, 16)).astype(dt)
    w, b = rng.standard_normal(16).astype(pdt), rng.standard_normal(16).astype(pdt)
    want = k.fn(x, w, b, eps=1e-5)
    out = np.full(want.shape, np.nan, want.dtype)
    assert k.fn(x, w, b, eps=1e-5, out=out) is out
    np.testing.assert_array_equal(out.astype(np.float64), want.astype(np.float64))


# ---------------------------------------------------------------------------- constraints
def test_constraints_turn_away_what_the_kernel_cannot_do():
    x = tg.input("x", (3, 4))
    assert tg.kernels.get("torch_cast").match(tg.cast(x, "int32")) is None  # undefined for nan
    assert tg.kernels.get("torch_cast").match(tg.cast(x, "bool")) is not None
    assert tg.kernels.get("torch_cast").match(tg.cast(x, "float64")) is not None
    assert tg.kernels.get("torch_slice").match(x[::-1]) is None
    assert tg.kernels.get("torch_tanh").match(tg.tanh(tg.input("h", (3,), "bfloat16")))
    assert tg.kernels.get("torch_tanh").match(tg.tanh(tg.input("i", (3,), "int32"))) is None
    gelu = tg.kernels.get("torch_gelu")
    assert gelu.match(tg.gelu(x, approximate="tanh")) is not None  # reads the attribute
    ln = tg.layer_norm(x, tg.input("w", (4,)))
    assert tg.kernels.get("torch_layer_norm_weight").match(ln) is not None
    assert tg.kernels.get("torch_layer_norm_bias").match(ln) is None
    assert tg.kernels.get("torch_layer_norm").match(ln) is None
    with pytest.raises(tg.KernelConstraintError, match="torch_exp"):
        tg.kernels.get("torch_exp")(np.ones(3, np.int32))


def test_symbolic_shapes_match():
    x = tg.input("x", ("batch", 8))
    for node, name in ((tg.softmax(x), "torch_softmax"),
                       (tg.layer_norm(x), "torch_layer_norm_plain"),
                       (tg.var(x, axis=0), "torch_var")):
        assert tg.kernels.get(name).match(node) is not None


# ---------------------------------------------------------------------------- zero copy
def test_numpy_to_torch_shares_memory():
    for dtype in (np.float32, np.float64, np.int8, np.uint8, np.bool_, np.float16,
                  ml_dtypes.bfloat16, np.int64):
        a = np.arange(12).reshape(3, 4).astype(dtype)
        t = convert.to_torch(a)
        assert t.data_ptr() == a.ctypes.data
        back = convert.to_numpy(t)
        assert back.dtype == a.dtype and np.shares_memory(back, a)
        np.testing.assert_array_equal(back, a)


def test_strided_broadcast_and_readonly_views_share_memory():
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    for view in (base[::2, 1::3], base.T, np.broadcast_to(base[0], (4, 10)), base[:, :1]):
        t = convert.to_torch(view)
        assert np.shares_memory(convert.to_numpy(t), base)
        np.testing.assert_array_equal(t.numpy(), view)
    frozen = base.copy()
    frozen.flags.writeable = False
    t = convert.to_torch(frozen)
    assert t.data_ptr() == frozen.ctypes.data
    bf = base.astype(ml_dtypes.bfloat16)[:, ::2]
    tb = convert.to_torch(bf)
    assert tb.dtype == torch.bfloat16 and np.shares_memory(convert.to_numpy(tb), bf)


def test_moving_to_a_device_keeps_strides():
    """verify, the Triton checks and the profiler move inputs to the GPU through to_cuda:
    Tensor.to made strided and broadcast layouts contiguous there, so on a real GPU (not the
    simulated one, whose .to("cpu") is the tensor itself) those trials were dense. "meta"
    stands for another device here: it keeps no values, only layouts."""
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    views = (base[::2, 1::3], base[1:, 2:].T, np.broadcast_to(base[3], (4, 10)), base[:, :1],
             base, base.astype(ml_dtypes.bfloat16)[:, ::2])
    for view in views:
        moved = convert.to_cuda(view, "meta")
        assert moved.device.type == "meta" and tuple(moved.shape) == view.shape
        assert moved.stride() == tuple(s // view.itemsize for s in view.strides), view.strides
        here = convert.to_cuda(view, "cpu")
        assert here.stride() == moved.stride()
        np.testing.assert_array_equal(convert.to_numpy(here), view)


def test_layouts_torch_cannot_view_are_copied_correctly():
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    record = np.zeros(4, dtype=[("a", "f4"), ("b", "i1")])["a"]  # stride 5: not a multiple
    for a in (base[::-1, ::-2], base.astype(">f4"), record):
        t = convert.to_torch(a)
        np.testing.assert_array_equal(t.numpy(), a)
    a = np.arange(10, dtype=np.float32)[::-1]
    out = tg.kernels.get("torch_exp")(a)
    np.testing.assert_allclose(out, np.exp(a), rtol=1e-6)


def test_cpu_kernel_results_are_views_of_torch_results():
    """The result tensor's memory is returned as the array, not copied."""
    k = tg.kernels.get("torch_permute")
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    out = k(a, perm=(2, 0, 1))
    assert np.shares_memory(out, a)  # a view kernel: a view of its input
    frozen = a.copy()
    frozen.flags.writeable = False
    assert not k(frozen, perm=(2, 0, 1)).flags.writeable
    assert tg.kernels.get("torch_reshape").contiguous


def test_kernels_follow_the_one_thread_setting():
    """Kernels never set thread counts; tensor_graphs.threads does, for torch too."""
    from tensor_graphs import threads

    matmul = tg.kernels.get("torch_matmul")
    ones = np.ones((4, 4), np.float32)
    matmul(ones, ones)  # torch is imported by now
    before = threads.get_num_threads()
    try:
        threads.set_num_threads(1)
        matmul(ones, ones)
        assert torch.get_num_threads() == 1
    finally:
        threads.set_num_threads(before)
    assert torch.get_num_threads() == before


def test_torch_imported_late_follows_the_thread_setting(child_env):
    code = ("import numpy as np, tensor_graphs as tg; from tensor_graphs import threads; "
            "threads.set_num_threads(1); "
            "tg.kernels.get('torch_exp')(np.ones(3, np.float32)); "
            "import torch; print(torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=child_env)
    assert out.stdout.strip() == "1"


def test_import_does_not_import_torch(child_env):
    code = ("import sys, tensor_graphs as tg; "
            "assert any(k.backend == 'torch' for k in tg.kernels.all()); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=child_env)
    assert out.stdout.strip() == str(_gpu_build())  # a CPU build of torch is never imported


def test_without_torch_no_torch_kernel_is_registered(child_env):
    code = ("import sys; sys.modules['torch'] = None; import tensor_graphs as tg; "
            "import tensor_graphs.kernels.copy as c; "
            "names = [k.name for k in tg.kernels.all()]; "
            "assert not [n for n in names if n.startswith('torch_')], names; "
            "assert 'copy_same_memory' in names and 'copy_host_to_cuda' not in names; "
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=child_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ---------------------------------------------------------------------------- the seed example
def test_seed_example_tanh_has_numpy_torch_and_c_kernels():
    node = tg.tanh(tg.input("x", (4, 16), "float32"))
    backends = {k.backend for k, _ in tg.kernels.matching(node)}
    assert {"numpy", "torch", "c"} <= backends, backends
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    ref = tg.evaluate(node, {"x": x}, dtype="float64")
    for k, _ in tg.kernels.matching(node):
        if k.device == "cpu":
            assert rel_error(k(x), ref) <= k.tolerance, k.name


# ---------------------------------------------------------------------------- copy kernels
def test_same_memory_copy_is_free_and_zero_copy():
    k = tg.kernels.get("copy_same_memory")
    assert k.backend == "copy" and k.view and copies.cost_hint(k) == 0.0
    x = np.arange(6, dtype=np.float32)
    node = tg.copy_to(tg.input("x", (6,)), "cpu")
    assert k.match(node) is not None
    out = k(x)
    assert np.shares_memory(out, x)
    np.testing.assert_array_equal(out, tg.evaluate(node, {"x": x}))
    assert copies.route("cpu", "cpu") is k
    assert copies.placement(k) == ("cpu", "cpu")
    assert copies.placement(tg.kernels.get("torch_exp")) == ("cpu", "cpu")


def test_copy_kernels_to_cuda_need_cuda():
    node = tg.copy_to(tg.input("x", (6,)), "cuda:0")
    assert tg.kernels.get("copy_same_memory").match(node) is None
    names = {k.name for k in tg.kernels.all() if k.backend == "copy"}
    assert ("copy_host_to_cuda" in names) == cuda_available()  # a real or simulated GPU
    if not cuda_available():
        with pytest.raises(tg.DeviceError, match="cuda"):
            copies.route("cpu", "cuda:0")


# ---------------------------------------------------------------------------- CUDA
@needs_cuda
@pytest.mark.parametrize("name", [k.name for k in _cpu_kernels()])
def test_cuda_kernel_matches_reference(name):
    cuda_name = "torch_cuda_" + name.removeprefix("torch_")
    k = tg.kernels.get(cuda_name)
    assert k.device == "cuda"
    make, dtypes = CASES[_label(name)]
    for dtype in _dtypes_to_try(k, dtypes):
        for n in SIZES:
            b = Feeds(seed=n)
            for node in make(b, n, dtype):
                if _turned_away(k, node):
                    continue
                matched = dict(tg.kernels.matching(node, backends=["torch"]))
                assert k in matched, f"{k.name} does not match {tg.format_graph(node)}"
                bound = k.arguments(matched[k])  # a variadic input spread in place
                args = [convert.to_cuda(a) for a in (tg.evaluate(bound, only(bound, b.values))
                                                     if bound else [])]
                assert k.constraint_failure([a.shape for a in args],
                                            [convert.dtype_of(a) for a in args],
                                            dict(node.attrs)) is None
                out = k.fn(*args, **{a: node.attrs[a] for a in k.attrs})
                assert out.is_cuda
                got = convert.to_host(out)
                ref = tg.evaluate(node, only(node, b.values), dtype="float64")
                assert got.dtype == node.dtype.np_dtype
                err = rel_error(got, ref)
                allowed = budget(k, got.dtype)
                assert err <= allowed, f"{k.name}: error {err:.3g} > {allowed:.3g}"


@needs_cuda
def test_copies_between_host_and_cuda():
    up, down = copies.route("cpu", "cuda:0"), copies.route("cuda:0", "cpu")
    assert (up.name, down.name) == ("copy_host_to_cuda", "copy_cuda_to_host")
    assert copies.placement(up) == ("cpu", "cuda") and copies.placement(down) == ("cuda", "cpu")
    assert copies.cost_hint(up) is None  # measured, like any kernel
    assert copies.route("cuda:0", "cuda:0").name == "copy_same_memory_cuda"
    for dtype in (np.float32, np.int64, np.bool_, ml_dtypes.bfloat16):
        x = (np.arange(12).reshape(3, 4) % 3).astype(dtype)[:, ::2]
        on_gpu = up.fn(x, device="cuda:0")
        assert on_gpu.is_cuda and on_gpu.shape == x.shape
        back = down.fn(on_gpu)
        assert isinstance(back, np.ndarray) and back.dtype == x.dtype
        np.testing.assert_array_equal(back, x)
    node = tg.copy_to(tg.input("x", (3,)), "cuda:0")
    assert up.match(node) is not None and down.match(node) is None
    assert down.match(tg.copy_to(node, "cpu")) is not None


@needs_cuda
def test_cuda_device_capacity():
    d = tg.Device("cuda:0")
    assert d.kind == "cuda" and d.capacity == torch.cuda.get_device_properties(0).total_memory
