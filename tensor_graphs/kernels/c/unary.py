"""C elementwise kernels: unary ops (float32 vectorised, float64 via libm), SwiGLU, fast tanh,
and the pointwise families' special functions, rounding, atan2 and fmod (in pointwise.c).

Each takes contiguous inputs of one dtype and returns a new array of the same shape, or writes
into ``out=`` (``writes_out``: see the registry). The
float32 math (exp, tanh, sigmoid, erf, gelu) is branch-free C in ``tg_common.h`` that GCC
vectorises; ``c_tanh_fast`` is a Pade approximation (no exp) with a declared tolerance of 1e-3.
"""

from __future__ import annotations

import numpy as np

from tensor_graphs.ir import api as tg
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.c.lib import I64, P, ptr
from tensor_graphs.kernels.registry import kernel

LIB = "elementwise"
SOURCE = lib.source(LIB)
_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


def where_ok(lib_name: str, extra=None):
    """A ``where`` constraint: the library builds, all inputs share a dtype, then ``extra``."""

    def where(shapes, dtypes, attrs):
        reason = lib.failure(lib_name)
        if reason is not None:
            return reason
        if len(set(dtypes)) > 1:
            return (f"inputs must share one dtype, got "
                    f"{', '.join(sorted({d.name for d in dtypes}))}")
        return True if extra is None else extra(shapes, dtypes, attrs)

    return where


def same_shape(shapes, dtypes, attrs):
    if len({tuple(s) for s in shapes}) > 1:
        return f"inputs must have one shape (no broadcasting), got {list(map(tuple, shapes))}"
    return True


def _unary(symbol: str):
    def run(x, *, out=None):
        out = lib.output(out, x.shape, x.dtype)
        fn = lib.func(LIB, f"tg_{symbol}_{_SUFFIX[x.dtype]}", P, P, I64)
        fn(ptr(x), ptr(out), x.size)
        return out

    run.source_text = SOURCE
    run.__doc__ = f"{symbol} in C (float32 vectorised, float64 through libm)."
    return run


# op or pattern, kernel name, C symbol
_UNARY = [
    ("neg", "c_neg", "neg"),
    ("reciprocal", "c_reciprocal", "reciprocal"),
    ("sqrt", "c_sqrt", "sqrt"),
    ("exp", "c_exp", "exp"),
    ("log", "c_log", "log"),
    ("tanh", "c_tanh", "tanh"),
    ("sigmoid", "c_sigmoid", "sigmoid"),
    ("erf", "c_erf", "erf"),
    ("relu", "c_relu", "relu"),
    ("silu", "c_silu", "silu"),
    (lambda x: tg.gelu(x), "c_gelu", "gelu"),
    (lambda x: tg.gelu(x, approximate="tanh"), "c_gelu_tanh", "gelu_tanh"),
]

for _pattern, _name, _symbol in _UNARY:
    kernel(_pattern, backend="c", name=_name, dtypes=("float32", "float64"), contiguous=True,
           where=where_ok(LIB), tolerance=1e-6, writes_out=True)(_unary(_symbol))


def _fast_tanh(x, *, out=None):
    out = lib.output(out, x.shape, x.dtype)
    lib.func(LIB, "tg_tanh_fast_f32", P, P, I64)(ptr(x), ptr(out), x.size)
    return out


_fast_tanh.source_text = SOURCE
_fast_tanh.__doc__ = "tanh by a Pade (7, 6) approximation: no exp, |error| <= 1e-4."
kernel("tanh", backend="c", name="c_tanh_fast", dtypes=("float32",), contiguous=True,
       where=where_ok(LIB), tolerance=1e-3, writes_out=True)(_fast_tanh)


def _swiglu(a, b, *, out=None):
    out = lib.output(out, a.shape, a.dtype)
    fn = lib.func(LIB, f"tg_swiglu_{_SUFFIX[a.dtype]}", P, P, P, I64)
    fn(ptr(a), ptr(b), ptr(out), a.size)
    return out


_swiglu.source_text = SOURCE
_swiglu.__doc__ = "silu(a) * b (SwiGLU's gate), same-shape contiguous inputs."
kernel(lambda a, b: tg.silu(a) * b, backend="c", name="c_swiglu",
       dtypes=("float32", "float64"), contiguous=True, where=where_ok(LIB, same_shape),
       tolerance=1e-6, writes_out=True)(_swiglu)


# ---------------------------------------------------------------------------- pointwise families
# log1p ... erfc and atan2 through double, rounded once; floor/ceil/trunc/round and fmod exact
# (pointwise.c). A model that uses them keeps an all-C program (the native loop replays C only).
PW_LIB = "pointwise"
PW_SOURCE = lib.source(PW_LIB)


def _pw_unary(symbol: str):
    def run(x, *, out=None):
        out = lib.output(out, x.shape, x.dtype)
        lib.func(PW_LIB, f"tg_{symbol}_{_SUFFIX[x.dtype]}", P, P, I64)(ptr(x), ptr(out), x.size)
        return out

    run.source_text = PW_SOURCE + f"\n/* {symbol} */"
    run.__doc__ = f"{symbol} in C (float32 through double, rounded once)."
    return run


def _pw_binary(symbol: str):
    def run(a, b, *, out=None):
        out = lib.output(out, a.shape, a.dtype)
        fn = lib.func(PW_LIB, f"tg_{symbol}_{_SUFFIX[a.dtype]}", P, P, P, I64)
        fn(ptr(a), ptr(b), ptr(out), a.size)
        return out

    run.source_text = PW_SOURCE + f"\n/* {symbol} */"
    run.__doc__ = f"{symbol} in C of same-shape contiguous inputs."
    return run


# op or pattern, kernel name, C symbol, tolerance (1e-12: bit-exact, 1e-7: one rounding)
_POINTWISE = [
    ("log1p", "c_log1p", "log1p", 1e-7),
    ("expm1", "c_expm1", "expm1", 1e-7),
    ("log2", "c_log2", "log2", 1e-7),
    ("log10", "c_log10", "log10", 1e-7),
    ("tan", "c_tan", "tan", 1e-7),
    ("erfc", "c_erfc", "erfc", 1e-7),
    ("floor", "c_floor", "floor", 1e-12),
    ("ceil", "c_ceil", "ceil", 1e-12),
    ("trunc", "c_trunc", "trunc", 1e-12),
    ("round_half_even", "c_round_half_even", "round", 1e-12),  # (C's rint: halves to even)
]
for _pattern, _name, _symbol, _tol in _POINTWISE:
    kernel(_pattern, backend="c", name=_name, dtypes=("float32", "float64"), contiguous=True,
           where=where_ok(PW_LIB), tolerance=_tol, writes_out=True)(_pw_unary(_symbol))
for _op, _tol in (("atan2", 1e-7), ("fmod", 1e-12)):
    kernel(_op, backend="c", name=f"c_{_op}", dtypes=("float32", "float64"), contiguous=True,
           where=where_ok(PW_LIB, same_shape), tolerance=_tol, writes_out=True)(_pw_binary(_op))
