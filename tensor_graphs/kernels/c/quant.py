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
from tensor_graphs.kernels.c.quant_family import Family, register
from tensor_graphs.kernels.registry import Preparation

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
    return pack_int8(q, LIB, "tg_q8_pack", packed_bytes)


def pack_int8(q: np.ndarray, library: str, symbol: str, size) -> np.ndarray:
    """An int8 (K, N) weight packed by the C function ``symbol`` of ``library`` (called with
    the weight, K, N, its strides and the output) into a 64-byte aligned int8 array of
    ``size(K, N)`` bytes; negative strides are copied first."""
    q = np.asarray(q)
    if q.ndim != 2 or q.dtype != np.int8:
        raise TypeError(f"pack: needs a 2-D int8 weight, got {q.shape} {q.dtype}")
    if any(s < 0 for s in q.strides):
        q = np.ascontiguousarray(q)
    k, n = q.shape
    out = lib.aligned(size(k, n), np.int8)
    lib.func(library, symbol, P, I64, I64, I64, I64, P)(
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
    out = lib.aligned(packed_bytes(k, n, 2) // 2, np.uint16)
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


def _bf16_signatures(has_bias: bool, residual: bool) -> list[dict]:
    out = []
    for sig in _signatures(has_bias, residual):
        sig = dict(sig)
        k, n = sig.pop("q")[0]
        sig.pop("s")
        out.append({"a": sig.pop("a"), "wb": ((k, n), "float32"), **sig})
    return out


register(Family(
    prefix="c_q8", lib=LIB, weight_args=("q", "s"), weight=tg.dequantize, weight_dtype="int8",
    gemm=gemm, prep=Preparation(pack, nbytes=lambda shape, dtype: packed_bytes(
        *map(int, shape)) + 64, name="pack_q8", strided=True),
    signatures=_signatures, source=SOURCE, product="a @ dequantize(q, s)",
    what="int8 weight widened in registers, packed once at bind time, scale in the "
         "epilogue."))
register(Family(
    prefix="c_bf16", lib=LIB, weight_args=("wb",), weight=tg.bf16_round,
    weight_dtype="float32", gemm=gemm_bf16,
    prep=Preparation(pack_bf16, nbytes=lambda shape, dtype: packed_bytes(
        *map(int, shape), 2) + 64, name="pack_bf16", strided=True),
    signatures=_bf16_signatures, source=SOURCE, product="a @ bf16_round(wb)",
    what="the weight stored as bfloat16, packed once at bind time, widened in registers "
         "(a shift)."))

# the int8 x int8 kernels (int8-dynamic) and the float16 / int4 ones register with these
from tensor_graphs.kernels.c import quant_dyn, quant_lowp  # noqa: E402,F401
