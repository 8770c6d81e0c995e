"""C int8-weight x float32-activation GEMM (``quant.c``): ``c_q8_*`` kernels.

The pattern is the quantized graph's own product, ``a @ dequantize(q, s)`` (``tg.quantize``
writes it; ``q`` int8 (K, N), ``s`` float32 (1, N), one scale per output channel), with the
packed GEMM's epilogues: ``_bias``, ``_bias_relu``/``_gelu``/``_gelu_tanh`` and the residual
``_add`` of the plain and bias forms. ``q`` is a *prepared* argument: packed once per binding
into 16-column int8 panels (``pack``), kept with the weights, so a decode step streams a
quarter of the float32 weight's bytes. A direct call with an unpacked (K, N) int8 array packs
it for that call (correct, slow), so the verifier needs nothing special. ``writes_out``.
"""

from __future__ import annotations

import ctypes
import math

import ml_dtypes
import numpy as np

from tensor_graphs.ir import api as tg
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.c.lib import I32, I64, P, ptr
from tensor_graphs.kernels.registry import Preparation, kernel

LIB = "quant"
SOURCE = lib.source(LIB)
ACTS = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3}
HEADER = 64  # bytes before the panels
PANEL = 16  # columns per panel
MAGIC = 0x7467713870616B31
BF16 = np.dtype(ml_dtypes.bfloat16)


def packed_bytes(k: int, n: int, itemsize: int = 1) -> int:
    """Bytes the packed form of a (k, n) int8 (or, itemsize 2, bfloat16) operand takes, header
    included."""
    return HEADER + -(-n // PANEL) * k * PANEL * itemsize


def pack(q: np.ndarray) -> np.ndarray:
    """The packed form of an int8 (K, N) weight, read through its strides: a 1-D int8 array,
    64-byte aligned (a header, then ceil(N / 16) panels of K x 16 values, zero past N)."""
    q = np.asarray(q)
    if q.ndim != 2 or q.dtype != np.int8:
        raise TypeError(f"pack: needs a 2-D int8 weight, got {q.shape} {q.dtype}")
    if any(s < 0 for s in q.strides):
        q = np.ascontiguousarray(q)
    k, n = q.shape
    size = packed_bytes(k, n)
    raw = np.empty(size + 64, np.int8)
    skip = -raw.ctypes.data % 64
    out = raw[skip:skip + size]
    lib.func(LIB, "tg_q8_pack", P, I64, I64, I64, I64, P)(
        q.ctypes.data, k, n, q.strides[0], q.strides[1], out.ctypes.data)
    return out


def packed_shape(p: np.ndarray) -> tuple[int, int]:
    """(K, N) of a packed operand."""
    h = p[:24].view(np.int64)
    if h[0] != MAGIC:
        raise TypeError("not a packed int8 operand")
    return int(h[1]), int(h[2])


def pack_bf16(w: np.ndarray) -> np.ndarray:
    """The packed form of ``bf16_round(w)`` for a float32 (K, N) weight (or one already
    bfloat16): its bfloat16 bits in 16-column panels (as ``pack``), a 1-D uint16 array,
    64-byte aligned."""
    w = np.asarray(w)
    if w.ndim != 2 or w.dtype not in (BF16, np.float32):
        raise TypeError(f"pack_bf16: needs a 2-D float32 weight, got {w.shape} {w.dtype}")
    if w.dtype == np.float32:  # rounded to nearest even, as bf16_round's cast
        w = w.astype(BF16)
    if any(s < 0 or s % 2 for s in w.strides):
        w = np.ascontiguousarray(w)
    k, n = w.shape
    size = packed_bytes(k, n, 2) // 2
    raw = np.empty(size + 32, np.uint16)
    skip = (-raw.ctypes.data % 64) // 2
    out = raw[skip:skip + size]
    lib.func(LIB, "tg_bf16_pack", P, I64, I64, I64, I64, P)(
        w.ctypes.data, k, n, w.strides[0] // 2, w.strides[1] // 2, out.ctypes.data)
    return out


def gemm_bf16(a, wb, bias=None, act=None, out=None, res=None):
    """act(a @ bf16_round(wb) + bias) + res; ``wb`` packed (``pack_bf16``) or (K, N)."""
    if wb.ndim == 2:
        n = wb.shape[1]
        wb = pack_bf16(wb)
    else:
        n = int(wb[8:12].view(np.int64)[0])
    k = a.shape[-1]
    out = lib.output(out, a.shape[:-1] + (n,), np.float32)
    fn = lib.func(LIB, "tg_bf16_gemm_f32", P, I64, P, P, P, P, I64, I64, I64, I32)
    fn.restype = ctypes.c_int
    status = fn(ptr(a), k, ptr(wb), ptr(bias), ptr(res), ptr(out), math.prod(a.shape[:-1]), n,
                k, ACTS[act])
    if status != 0:
        raise ValueError(f"C bfloat16 gemm: the weight is not packed as (K, N) = ({k}, {n})")
    return out


def gemm(a, q, s, bias=None, act=None, out=None, res=None):
    """act(a @ (q * s) + bias) + res; ``q`` packed (``pack``) or a (K, N) int8 array."""
    if q.ndim == 2:  # not prepared: pack for this call
        q = pack(q)
    k = a.shape[-1]
    n = s.shape[-1]
    out = lib.output(out, a.shape[:-1] + (n,), np.float32)
    fn = lib.func(LIB, "tg_q8_gemm_f32", P, I64, P, P, P, P, P, I64, I64, I64, I32)
    fn.restype = ctypes.c_int
    status = fn(ptr(a), k, ptr(q), ptr(s), ptr(bias), ptr(res), ptr(out),
                math.prod(a.shape[:-1]), n, k, ACTS[act])
    if status != 0:
        raise ValueError(f"C int8 gemm: the weight is packed as (K, N) = {packed_shape(q)}, "
                         f"the call needs K = {k}, N = {n}")
    return out


def _constraint(has_bias: bool, residual: bool):
    def where(shapes, dtypes, attrs):
        reason = lib.failure(LIB)
        if reason is not None:
            return reason
        a, q, s = (tuple(x) for x in shapes[:3])
        names = [d.name for d in dtypes]
        if names[1] != "int8" or any(d != "float32" for i, d in enumerate(names) if i != 1):
            return f"needs float32 operands and an int8 weight, got {names}"
        if len(a) < 2 or len(q) != 2:
            return f"needs a of rank >= 2 and a 2-D weight, got {a} @ {q}"
        k, n = q
        if a[-1] != k:
            return f"inner dims differ: {a} @ {q}"
        if s != (1, n):
            return f"the scale must have shape (1, {n}) (one per output channel), got {s}"
        if has_bias and tuple(shapes[3]) != (n,):
            return f"bias must have shape ({n},), got {tuple(shapes[3])}"
        if residual and tuple(shapes[-1]) != a[:-1] + (n,):
            return (f"the added operand must have the product's shape {a[:-1] + (n,)}, got "
                    f"{tuple(shapes[-1])}")
        return True
    return where


def _signatures(has_bias: bool, residual: bool) -> list[dict]:
    """Verification cases: one row (decode) to 9 rows, odd K and N, edge panels."""
    out = []
    for m, k, n, lead in ((1, 1, 1, ()), (1, 33, 17, ()), (1, 7, 1025, ()), (3, 67, 31, ()),
                          (8, 129, 40, ()), (5, 1025, 33, ()), (4, 17, 9, (2,)),
                          (9, 31, 47, ())):
        sig = {"a": (lead + (m, k), "float32"), "q": ((k, n), "int8"),
               "s": ((1, n), "float32")}
        if has_bias:
            sig["bias"] = ((n,), "float32")
        if residual:
            sig["res"] = (lead + (m, n), "float32")
        out.append(sig)
    return out


def _gelu(approx):
    return lambda y: tg.gelu(y, approximate=approx)


_ACT_BUILD = {None: lambda y: y, "relu": tg.relu, "gelu": _gelu("none"),
              "gelu_tanh": _gelu("tanh")}


def _register(name: str, has_bias: bool, act: str | None, residual: bool = False) -> None:
    build = _ACT_BUILD[act]
    if has_bias and residual:
        def pattern(a, q, s, bias, res):
            return a @ tg.dequantize(q, s) + bias + res

        def run(a, q, s, bias, res, *, out=None):
            return gemm(a, q, s, bias, act, out, res)
    elif has_bias:
        def pattern(a, q, s, bias):
            return build(a @ tg.dequantize(q, s) + bias)

        def run(a, q, s, bias, *, out=None):
            return gemm(a, q, s, bias, act, out)
    elif residual:
        def pattern(a, q, s, res):
            return a @ tg.dequantize(q, s) + res

        def run(a, q, s, res, *, out=None):
            return gemm(a, q, s, None, act, out, res)
    else:
        def pattern(a, q, s):
            return build(a @ tg.dequantize(q, s))

        def run(a, q, s, *, out=None):
            return gemm(a, q, s, None, act, out)
    run.__doc__ = (f"{act + '(' if act else ''}a @ dequantize(q, s){' + bias' if has_bias else ''}"
                   f"{')' if act else ''}{' + res' if residual else ''}: int8 weight widened in "
                   "registers, packed once at bind time, scale in the epilogue.")
    run.source_text = SOURCE + f"\n/* {name} */"
    prep = Preparation(pack, nbytes=lambda shape, dtype: packed_bytes(*map(int, shape)) + 64,
                       name="pack_q8", strided=True)
    kernel(pattern, backend="c", name=name, contiguous=True,
           where=_constraint(has_bias, residual), tolerance=1e-5,
           signatures=_signatures(has_bias, residual), writes_out=True,
           prepare={"q": prep})(run)


_register("c_q8_matmul", False, None)
_register("c_q8_matmul_bias", True, None)
for _act in ("relu", "gelu", "gelu_tanh"):
    _register(f"c_q8_matmul_bias_{_act}", True, _act)
_register("c_q8_matmul_add", False, None, residual=True)
_register("c_q8_matmul_bias_add", True, None, residual=True)


def _bf16_constraint(has_bias: bool, residual: bool):
    def where(shapes, dtypes, attrs):
        reason = lib.failure(LIB)
        if reason is not None:
            return reason
        a, w = (tuple(x) for x in shapes[:2])
        names = [d.name for d in dtypes]
        if any(d != "float32" for d in names):
            return f"needs float32 operands, got {names}"
        if len(a) < 2 or len(w) != 2 or a[-1] != w[0]:
            return f"needs a (..., K) of rank >= 2 and a (K, N) weight, got {a} @ {w}"
        n = w[1]
        if has_bias and tuple(shapes[2]) != (n,):
            return f"bias must have shape ({n},), got {tuple(shapes[2])}"
        if residual and tuple(shapes[-1]) != a[:-1] + (n,):
            return (f"the added operand must have the product's shape {a[:-1] + (n,)}, got "
                    f"{tuple(shapes[-1])}")
        return True
    return where


def _bf16_signatures(has_bias: bool, residual: bool) -> list[dict]:
    out = []
    for sig in _signatures(has_bias, residual):
        sig = dict(sig)
        k, n = sig.pop("q")[0]
        sig.pop("s")
        out.append({"a": sig.pop("a"), "wb": ((k, n), "float32"), **sig})
    return out


def _register_bf16(name: str, has_bias: bool, act: str | None, residual: bool = False) -> None:
    build = _ACT_BUILD[act]

    def wide(wb):
        return tg.bf16_round(wb)
    if has_bias and residual:
        def pattern(a, wb, bias, res):
            return a @ wide(wb) + bias + res

        def run(a, wb, bias, res, *, out=None):
            return gemm_bf16(a, wb, bias, act, out, res)
    elif has_bias:
        def pattern(a, wb, bias):
            return build(a @ wide(wb) + bias)

        def run(a, wb, bias, *, out=None):
            return gemm_bf16(a, wb, bias, act, out)
    elif residual:
        def pattern(a, wb, res):
            return a @ wide(wb) + res

        def run(a, wb, res, *, out=None):
            return gemm_bf16(a, wb, None, act, out, res)
    else:
        def pattern(a, wb):
            return build(a @ wide(wb))

        def run(a, wb, *, out=None):
            return gemm_bf16(a, wb, None, act, out)
    run.__doc__ = (f"{act + '(' if act else ''}a @ bf16_round(wb)"
                   f"{' + bias' if has_bias else ''}{')' if act else ''}"
                   f"{' + res' if residual else ''}: the weight stored as bfloat16, packed once "
                   "at bind time, widened in registers (a shift).")
    run.source_text = SOURCE + f"\n/* {name} */"
    prep = Preparation(pack_bf16,
                       nbytes=lambda shape, dtype: packed_bytes(*map(int, shape), 2) + 64,
                       name="pack_bf16", strided=True)
    kernel(pattern, backend="c", name=name, contiguous=True,
           where=_bf16_constraint(has_bias, residual), tolerance=1e-5,
           signatures=_bf16_signatures(has_bias, residual), writes_out=True,
           prepare={"wb": prep})(run)


_register_bf16("c_bf16_matmul", False, None)
_register_bf16("c_bf16_matmul_bias", True, None)
for _act in ("relu", "gelu", "gelu_tanh"):
    _register_bf16(f"c_bf16_matmul_bias_{_act}", True, _act)
_register_bf16("c_bf16_matmul_add", False, None, residual=True)
_register_bf16("c_bf16_matmul_bias_add", True, None, residual=True)

# the int8 x int8 kernels (int8-dynamic) register with these
from tensor_graphs.kernels.c import quant_dyn  # noqa: E402,F401
