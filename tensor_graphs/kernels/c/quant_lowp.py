"""C float16-weight and group-wise int4-weight GEMMs (``quant_lowp.c``): ``c_f16_*`` and
``c_q4_*`` kernels, the weight widened in registers.

The patterns are the quantized graphs' own products (``tg.quantize`` writes them):
``a @ fp16_round(wf)`` (fp16-weight; ``wf`` the float32 weight, packed once per binding as
float16, exactly ``fp16_round``'s values) and ``a @ dequantize_int4(q, s)`` (int4-weight;
``q`` uint8 (K, N) holding int4 + 8, ``s`` float32 (ng, N), a scale per group of rows along
K and output channel; ``q`` packed once per binding two values a byte), each with the packed
GEMM's epilogues. A direct call with an unpacked weight packs it for that call (correct,
slow), so the verifier needs nothing special. The instructions: ``isa()`` (the CPU's
widest, or ``TG_LOWP_ISA``).
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from tensor_graphs.errors import ArgumentError
from tensor_graphs.ir import api as tg
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.c.isa import InstructionPaths
from tensor_graphs.kernels.c.lib import I32, I64, P, ptr
from tensor_graphs.kernels.c.quant_family import Family, register
from tensor_graphs.kernels.registry import Preparation

LIB = "quant_lowp"
SOURCE = lib.source(LIB)
ACTS = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3}
HEADER = 64  # bytes before the panels
PANEL = 16  # columns per panel
F16_MAGIC = 0x7467663136706B31
I4_MAGIC = 0x7467693470616B31
ENV = "TG_LOWP_ISA"
# paths of the float16 / int4 GEMM, widest first -> the code quant_lowp.c takes
ISAS = {
    "avx512": 2,    # 16 lanes: vcvtph2ps zmm, vpmovsxbd zmm
    "avx2": 1,      # 8 lanes, AVX2 + FMA + F16C
    "portable": 0,  # C, a software float16 conversion
}


PATHS = InstructionPaths(LIB, "tg_lowp_isa_supported", ENV, ISAS, "the float16/int4 GEMM")
supported = PATHS.supported  # whether this CPU runs a path (``ISAS``)
isa = PATHS.code  # the path taken now: TG_LOWP_ISA's, or the widest this CPU runs
isa_name = PATHS.name


def packed_bytes(k: int, n: int, kind: str) -> int:
    """Bytes the packed (k, n) weight takes, header included: float16 2 a value, int4 1/2
    (K padded to a multiple of 8)."""
    panel = k * 2 * PANEL if kind == "f16" else -(-k // 8) * 64
    return HEADER + -(-n // PANEL) * panel


def _packed(panels: np.ndarray, k: int, n: int, magic: int) -> np.ndarray:
    """A 64-byte aligned uint8 array: the header, then ``panels``' bytes."""
    body = panels.reshape(-1).view(np.uint8)
    out = lib.aligned(HEADER + body.size, np.uint8)
    header = np.zeros(HEADER // 8, np.int64)
    header[:4] = (magic, k, n, -(-n // PANEL))
    out[:HEADER] = header.view(np.uint8)
    out[HEADER:] = body
    return out


def _panels(x: np.ndarray, fill) -> np.ndarray:
    """(K, N) -> (ceil(N / 16), K, 16), columns past N ``fill``."""
    k, n = x.shape
    p = -(-n // PANEL)
    full = np.full((k, p * PANEL), fill, x.dtype)
    full[:, :n] = x
    return np.ascontiguousarray(full.reshape(k, p, PANEL).transpose(1, 0, 2))


def pack_f16(w: np.ndarray) -> np.ndarray:
    """The packed form of ``fp16_round(w)`` for a float32 (K, N) weight (or one already
    float16): its float16 bits (numpy's cast: to nearest even, subnormals, inf past 65504's
    rounding range, as ``fp16_round``) in 16-column panels."""
    w = np.asarray(w)
    if w.ndim != 2 or w.dtype not in (np.float16, np.float32):
        raise TypeError(f"pack_f16: needs a 2-D float32 weight, got {w.shape} {w.dtype}")
    with np.errstate(over="ignore"):
        h = w.astype(np.float16)
    return _packed(_panels(h, 0), *w.shape, F16_MAGIC)


def pack_i4(q: np.ndarray) -> np.ndarray:
    """The packed form of a uint8 (K, N) int4 weight (values + 8, 0..15): per 16-column panel,
    blocks of 8 rows (K padded with 8s, value 0), 64 bytes a block: column c's little-endian
    uint32 lane holds row j's value in bits 4j..4j+3."""
    q = np.asarray(q)
    if q.ndim != 2 or q.dtype != np.uint8:
        raise TypeError(f"pack_i4: needs a 2-D uint8 weight (int4 + 8), got {q.shape} "
                        f"{q.dtype}")
    if q.size and int(q.max()) > 15:
        raise ArgumentError(f"int4 weight: values are held as v + 8 in 0..15 (v in -8..7), "
                            f"got {int(q.max())}: a prequantized '<name>.q' holds int8 "
                            f"values in -8..7 (rewrite.quantize.prequantized_weights writes "
                            f"them)")
    k, n = q.shape
    kp = -(-k // 8) * 8
    full = np.full((kp, n), 8, np.uint8)
    full[:k] = q
    p = _panels(full, 8)  # (panels, kp, 16)
    blocks = p.reshape(p.shape[0], kp // 8, 8, PANEL).transpose(0, 1, 3, 2).astype(np.uint32)
    lanes = (blocks << (4 * np.arange(8, dtype=np.uint32))).sum(axis=-1, dtype=np.uint32)
    return _packed(np.ascontiguousarray(lanes.astype("<u4")), k, n, I4_MAGIC)


def _header(p: np.ndarray) -> tuple[int, int, int]:
    h = p[:24].view(np.int64)
    return int(h[0]), int(h[1]), int(h[2])


def gemm_f16(a, wf, bias=None, act=None, out=None, res=None, path: int | None = None):
    """act(a @ fp16_round(wf) + bias) + res; ``wf`` packed (``pack_f16``) or (K, N)."""
    k = a.shape[-1]
    if wf.ndim == 2:
        wf = pack_f16(wf)
    n = _header(wf)[2]
    out = lib.output(out, a.shape[:-1] + (n,), np.float32)
    fn = lib.func(LIB, "tg_f16_gemm", P, P, P, P, P, I64, I64, I64, I32, I32)
    fn.restype = ctypes.c_int
    status = fn(ptr(a), ptr(wf), ptr(bias), ptr(res), ptr(out), math.prod(a.shape[:-1]), n,
                k, ACTS[act], isa() if path is None else path)
    if status != 0:
        raise ValueError(f"C float16 gemm: the weight is packed as (K, N) = "
                         f"{_header(wf)[1:]}, the call needs K = {k}, N = {n}")
    return out


def gemm_i4(a, q, s, bias=None, act=None, out=None, res=None, path: int | None = None):
    """act(a @ dequantize_int4(q, s) + bias) + res; ``q`` packed (``pack_i4``) or (K, N)
    uint8."""
    if q.ndim == 2:
        q = pack_i4(q)
    k = a.shape[-1]
    ng, n = s.shape
    out = lib.output(out, a.shape[:-1] + (n,), np.float32)
    fn = lib.func(LIB, "tg_i4_gemm", P, P, P, I64, P, P, P, I64, I64, I64, I32, I32)
    fn.restype = ctypes.c_int
    status = fn(ptr(a), ptr(q), ptr(s), ng, ptr(bias), ptr(res), ptr(out),
                math.prod(a.shape[:-1]), n, k, ACTS[act], isa() if path is None else path)
    if status == -2:
        raise MemoryError(f"C int4 gemm: no memory for the scales of a ({k}, {n}) weight")
    if status != 0:
        raise ValueError(f"C int4 gemm: the weight is packed as (K, N) = {_header(q)[1:]}, "
                         f"the call needs K = {k}, N = {n}")
    return out


def _i4_scale(k: int, n: int, shape: tuple) -> str | None:
    """The (ng, N) group scale: ng groups of ceil(K / ng) rows, none empty."""
    if len(shape) != 2 or shape[1] != n:
        return f"the int4 scale must have shape (groups, {n}), got {shape}"
    ng = shape[0]
    if not 1 <= ng <= max(k, 1) or (k and (ng - 1) * -(-k // ng) >= k):
        return f"{ng} groups do not divide K = {k} (ceil(K / groups) rows a group, none empty)"
    return None


# verification cases: (rows, K, N, groups, leading axes, the activation's values): one row
# (decode) to 9, K a multiple of the group and not (67 = 23 + 23 + 21, 1025 = 9 x 114 - 1),
# edge panels (N 1, 17, 31, 47), and "tiny" rows (zero and constant rows among them)
CASES = ((1, 1, 1, 1, ()), (1, 64, 17, 2, ()), (1, 7, 1025, 1, ()), (3, 67, 31, 3, ()),
         (8, 128, 40, 4, ()), (5, 1025, 33, 9, ()), (4, 32, 9, 1, (2,)), (9, 31, 47, 2, ()))


def _signatures(has_bias: bool, residual: bool, kind: str) -> list[dict]:
    from tensor_graphs.kernels.signatures import Spec

    out = []
    for i, (m, k, n, ng, lead) in enumerate(CASES):
        values = "tiny" if i % 3 == 2 else "normal"
        sig = {"a": Spec(lead + (m, k), "float32", values, axes=(len(lead) + 1,))}
        if kind == "f16":
            sig["wf"] = ((k, n), "float32")
        else:
            sig["q"] = Spec((k, n), "uint8", "index", high=16)  # every nibble, -8 included
            sig["s"] = ((ng, n), "float32")
        if has_bias:
            sig["bias"] = ((n,), "float32")
        if residual:
            sig["res"] = (lead + (m, n), "float32")
        out.append(sig)
    return out


register(Family(
    prefix="c_f16", lib=LIB, weight_args=("wf",), weight=tg.fp16_round,
    weight_dtype="float32", gemm=gemm_f16,
    prep=Preparation(pack_f16, nbytes=lambda shape, dtype: packed_bytes(
        *map(int, shape), "f16") + 64, name="pack_f16", strided=True),
    signatures=lambda b, r: _signatures(b, r, "f16"), source=SOURCE,
    product="a @ fp16_round(wf)",
    what="the weight stored as float16, packed once at bind time, widened in registers "
         "(vcvtph2ps where the CPU has F16C, chosen at run time)."))
register(Family(
    prefix="c_q4", lib=LIB, weight_args=("q", "s"), weight=tg.dequantize_int4,
    weight_dtype="uint8", gemm=gemm_i4, scale_check=_i4_scale,
    prep=Preparation(pack_i4, nbytes=lambda shape, dtype: packed_bytes(
        *map(int, shape), "i4") + 64, name="pack_i4", strided=True),
    signatures=lambda b, r: _signatures(b, r, "i4"), source=SOURCE,
    product="a @ dequantize_int4(q, s)",
    what="int4 weights two a byte, packed once at bind time, unpacked in registers, each "
         "group's sum times its scales (AVX-512 / AVX2 / C, chosen at run time)."))
