"""A gallery of kernels as a generator (or a hurried person) writes them: every wrong one is
refused by ``tg.kernels.verify(strict=True)``, every right one admitted.

Each wrong kernel is right on unit-scale, contiguous, odd-sized inputs — the inputs the
verifier drew before it had adversarial cases (``tensor_graphs/kernels/adversarial.py``) —
and wrong on the data a model meets: large or shifted logits, rows far from zero, tiny rows,
masked (-inf) positions, Fortran-ordered arrays, rows of length 1, sizes the signatures did
not list. All of them but ``REFUSED_BEFORE`` were admitted by the verifier of commit 2877060, before
the adversarial cases; ``test_without_the_adversarial_cases_the_wrong_kernel_passes`` keeps
that true (the plain cases alone admit them), so the gallery stays meaningful.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import KernelVerificationError
from tensor_graphs.kernels import adversarial, registry
from tensor_graphs.kernels.verify import _verify

F32 = ("float32",)


def user_kernel(pattern, **options):
    """``@tg.kernel(pattern, backend="numpy", ...)`` without registering: the Kernel object a
    user's file would add (the registry is left as it was)."""

    def decorate(fn):
        return registry.unregistered(pattern, fn, backend="numpy", **options)

    return decorate


def _softmax(x, axis):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


# ---------------------------------------------------------------------------- wrong kernels
@user_kernel("softmax", dtypes=F32)
def softmax_without_max(x, axis):
    """exp overflows to inf past x = 88.7 (float32): inf / inf is NaN."""
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)


@user_kernel("layer_norm", dtypes=F32, tolerance=1e-5)
def layer_norm_one_pass(x, weight, bias, eps):
    """var = E[x^2] - E[x]^2: cancels catastrophically when the mean is large."""
    m = np.mean(x, axis=-1, keepdims=True)
    var = np.mean(x * x, axis=-1, keepdims=True) - m * m
    return (x - m) / np.sqrt(var + np.float32(eps)) * weight + bias


def _small_eps(shapes, dtypes, attrs):
    return attrs["eps"] <= 1e-5 or "written for the eps of one model family (<= 1e-5)"


@user_kernel("rms_norm", dtypes=F32, where=_small_eps, tolerance=1e-5)
def rms_norm_without_eps(x, weight, eps):
    """Forgets eps: right while mean(x^2) >> eps, wrong on rows near zero."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True)) * weight


@user_kernel("rms_norm", dtypes=F32)
def rms_norm_over_every_axis(x, weight, eps):
    """One RMS for the whole tensor instead of one per row."""
    return x / np.sqrt(np.mean(x * x) + np.float32(eps)) * weight


@user_kernel("log_softmax", dtypes=F32)
def log_softmax_as_log_of_softmax(x, axis):
    """softmax underflows to 0 more than 103 below the max: log(0) = -inf."""
    return np.log(_softmax(x, axis))


@user_kernel("softmax", dtypes=F32, tolerance=1e-5)
def softmax_online_without_inf_guard(x, axis):
    """Online (one-pass) softmax: a row starting with masked (-inf) positions rescales by
    exp(-inf - -inf) = NaN."""
    x = np.moveaxis(x, axis, -1)
    m = np.full(x.shape[:-1], -np.inf, x.dtype)
    s = np.zeros(x.shape[:-1], x.dtype)
    with np.errstate(invalid="ignore"):
        for j in range(x.shape[-1]):
            new = np.maximum(m, x[..., j])
            s = s * np.exp(m - new) + np.exp(x[..., j] - new)
            m = new
        y = np.exp(x - m[..., None]) / s[..., None]
    return np.moveaxis(y, -1, axis)


def _c_strides(x):
    return tuple(int(np.prod(x.shape[i + 1:], dtype=np.int64)) * x.itemsize
                 for i in range(x.ndim))


@user_kernel("softmax", dtypes=F32)
def softmax_reads_memory_in_c_order(x, axis):
    """Skips the copy for 'contiguous' input but reads it in C order: Fortran-ordered input
    (flags.f_contiguous) is read transposed."""
    if x.flags.c_contiguous or x.flags.f_contiguous:
        x = np.lib.stride_tricks.as_strided(x, x.shape, _c_strides(x))
    else:
        x = np.ascontiguousarray(x)
    return _softmax(x, axis)


@user_kernel("sum", dtypes=("float16",))
def sum_accumulated_in_float16(x, axes, keepdims):
    """16 float16 accumulators (a vector register's worth), each adding every 16th element:
    close enough on unit-scale rows, but a partial sum past 65504 is inf."""
    kept = [d for i, d in enumerate(x.shape) if i not in axes]
    rows = np.moveaxis(x, axes, range(-len(axes), 0)).reshape(*kept, -1)
    pad = [(0, 0)] * (rows.ndim - 1) + [(0, -rows.shape[-1] % 16)]
    lanes = np.pad(rows, pad).reshape(*kept, -1, 16)
    acc = np.cumsum(lanes, axis=-2, dtype=np.float16)[..., -1, :]
    total = np.sum(acc, axis=-1, dtype=np.float16)
    return np.expand_dims(total, tuple(axes)) if keepdims else total


@user_kernel("max", dtypes=F32)
def max_skips_nan(x, axes, keepdims):
    """np.nanmax: a NaN in the row vanishes instead of making the maximum NaN."""
    return np.nanmax(x, axis=tuple(axes), keepdims=keepdims)


def _silu(x):
    return x / (np.float32(1) + np.exp(-x))


@user_kernel(lambda x, g: tg.silu(x) * g, dtypes=F32,
             signatures=[{"x": (4, 64), "g": (4, 64)}, {"x": (2, 8, 128), "g": (2, 8, 128)}])
def swiglu_in_pairs(x, g):
    """Works on pairs of elements (as a 2-wide SIMD loop would) and drops the odd one out."""
    out = np.zeros_like(x)
    even = x.shape[-1] - x.shape[-1] % 2
    out[..., :even] = _silu(x[..., :even]) * g[..., :even]
    return out


@user_kernel("softmax", dtypes=F32, ranks=(2,))
def softmax_squeezes_its_input(x, axis):
    """np.squeeze to drop a batch axis of 1: a row of length 1 loses its axis, and the
    softmax runs over the wrong one."""
    y = np.squeeze(x)
    return _softmax(y, -1 if y.ndim < x.ndim else axis).reshape(x.shape)


WRONG = [softmax_without_max, layer_norm_one_pass, rms_norm_without_eps,
         rms_norm_over_every_axis, log_softmax_as_log_of_softmax,
         softmax_online_without_inf_guard, softmax_reads_memory_in_c_order,
         sum_accumulated_in_float16, max_skips_nan, swiglu_in_pairs, softmax_squeezes_its_input]


# ---------------------------------------------------------------------------- right kernels
@user_kernel("layer_norm", dtypes=F32, tolerance=1e-5)
def layer_norm_two_pass(x, weight, bias, eps):
    c = x - np.mean(x, axis=-1, keepdims=True)
    return c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + np.float32(eps)) * weight + bias


@user_kernel("layer_norm", dtypes=F32, tolerance=1e-5)
def layer_norm_welford(x, weight, bias, eps):
    mean = np.zeros(x.shape[:-1], x.dtype)
    m2 = np.zeros(x.shape[:-1], x.dtype)
    for j in range(x.shape[-1]):
        d = x[..., j] - mean
        mean = mean + d / np.float32(j + 1)
        m2 = m2 + d * (x[..., j] - mean)
    var = (m2 / np.float32(x.shape[-1]))[..., None]
    return (x - mean[..., None]) / np.sqrt(var + np.float32(eps)) * weight + bias


@user_kernel("softmax", dtypes=F32)
def softmax_max_subtracted(x, axis):
    return _softmax(x, axis)


@user_kernel("log_softmax", dtypes=F32)
def log_softmax_log_sum_exp(x, axis):
    s = x - np.max(x, axis=axis, keepdims=True)
    return s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True))


@user_kernel("softmax", dtypes=F32, tolerance=1e-5)
def softmax_online(x, axis):
    x = np.moveaxis(x, axis, -1)
    m = np.full(x.shape[:-1], -np.inf, x.dtype)
    s = np.zeros(x.shape[:-1], x.dtype)
    for j in range(x.shape[-1]):
        new = np.maximum(m, x[..., j])
        empty = new == -np.inf  # nothing but masked positions yet: -inf - -inf is NaN
        s = s * np.exp(np.where(empty, 0, m - new)) + np.exp(np.where(empty, -np.inf,
                                                                       x[..., j] - new))
        m = new
    return np.moveaxis(np.exp(x - m[..., None]) / s[..., None], -1, axis)


RIGHT = [layer_norm_two_pass, layer_norm_welford, softmax_max_subtracted,
         log_softmax_log_sum_exp, softmax_online]


# unit-scale rows already tell the whole-tensor RMS from the row's (by ~10%): the adversarial
# rows (scales 1e-5..100) only make the difference larger
REFUSED_BEFORE = {rms_norm_over_every_axis.name}


@pytest.mark.parametrize("kernel", WRONG, ids=[k.name for k in WRONG])
def test_a_wrong_kernel_is_refused(kernel):
    with pytest.raises(KernelVerificationError) as info:
        tg.kernels.verify(kernel, strict=True, seed=0)
    assert kernel.name in str(info.value)


@pytest.mark.parametrize("kernel", RIGHT, ids=[k.name for k in RIGHT])
def test_a_right_kernel_is_admitted(kernel):
    report = tg.kernels.verify(kernel, strict=True, seed=0)
    assert report.ok, str(report)


@pytest.mark.parametrize("kernel", [k for k in WRONG if k.name not in REFUSED_BEFORE],
                         ids=[k.name for k in WRONG if k.name not in REFUSED_BEFORE])
def test_without_the_adversarial_cases_the_wrong_kernel_passes(kernel, monkeypatch):
    """The gallery is meaningful: the plain cases (unit-scale values, the generators' shapes,
    strided and broadcast layouts) admit each of these kernels; the adversarial ones refuse
    it. (``_verify`` directly: nothing enters the report cache.)"""
    monkeypatch.setattr(adversarial, "cases", lambda *args, **kwargs: [])
    report = _verify(kernel, np.random.default_rng(0))
    assert report.ok, str(report)
