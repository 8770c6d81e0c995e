"""C int8-dynamic GEMM (``quant_dyn.c``): ``c_q8d_*`` kernels, int8 x int8 -> int32.

The pattern is the quantized graph's own product (``tg.quantize(g, "int8-dynamic")`` writes
it): ``dynamic_quant(a) @ dequantize(q, s)``, the activation's rows quantized at run time and
the weight int8 with a scale per output channel, with the epilogues of the int8-weight GEMM
(``_bias``, ``_bias_relu``/``_gelu``/``_gelu_tanh``, ``_add``, ``_bias_add``). The row
quantization is fused (it reads each activation once, writes int8 rows the GEMM reads from
cache) and reproduces the reference exactly, so the error is the float32 epilogue's.
``q`` is prepared: packed once per binding (``pack``) in 4-deep k groups with its column
sums. The instructions: ``isa()`` (the CPU's widest, or ``TG_INT8_ISA``).
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from tensor_graphs.errors import ShapeError
from tensor_graphs.ir import api as tg
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.c.isa import InstructionPaths
from tensor_graphs.kernels.c.lib import I32, I64, P, ptr
from tensor_graphs.kernels.c.quant import pack_int8
from tensor_graphs.kernels.c.quant_family import Family, register
from tensor_graphs.kernels.registry import Preparation

LIB = "quant_dyn"
SOURCE = lib.source(LIB)
ACTS = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3}
MAGIC = 0x7467713864796E31
ENV = "TG_INT8_ISA"
# instruction sets of the int8 GEMM, widest first -> the code quant_dyn.c takes
ISAS = {
    "avx512-vnni": 3,  # vpdpbusd on 512 bits: 64 multiply-adds an instruction
    "avx-vnni": 2,     # vpdpbusd on 256 bits (VEX)
    "avx2": 1,         # vpmaddubsw + vpmaddwd chains
    "portable": 0,     # C int32 sums, any CPU
}


PATHS = InstructionPaths(LIB, "tg_q8d_isa_supported", ENV, ISAS, "the int8 GEMM")
supported = PATHS.supported  # whether this CPU runs a path (``ISAS``)
isa = PATHS.code  # the path taken now: TG_INT8_ISA's, or the widest this CPU runs
isa_name = PATHS.name


BLOCK = 32  # rows of K per stored column sum: a grouped product's groups are multiples of it
GROUPS = (32,)  # activation groups with kernels (c_q8d_g<G>_*): tg.quantize's GROUP_SIZE


def packed_bytes(k: int, n: int) -> int:
    panels, kp = -(-n // 16), -(-k // 4) * 4
    return 64 + panels * 64 + panels * kp * 16 + -(-k // BLOCK) * panels * 64


def pack(q: np.ndarray) -> np.ndarray:
    """The packed form of an int8 (K, N) weight (read through its strides): a 64-byte aligned
    int8 array with a header, the column sums and 16-column panels in 4-deep k groups."""
    return pack_int8(q, LIB, "tg_q8d_pack", _c_packed_bytes)


def _c_packed_bytes(k: int, n: int) -> int:
    """The bytes tg_q8d_pack writes, as the C side computes them: the buffer is sized by the
    library that fills it, so a layout change in quant_dyn.c that ``packed_bytes`` (memory
    accounting) has not followed cannot overrun the heap (test_quant_dyn_bounds checks that the
    two agree). Not through ``lib.func``: a recorder would refuse its int64 result."""
    fn = lib.library(LIB).tg_q8d_packed_size
    fn.argtypes, fn.restype = [I64, I64], I64
    return int(fn(k, n))


def gemm(a, q, s, bias=None, act=None, out=None, res=None, path: int | None = None,
         group: int = 0):
    """act(dynamic_quant(a, group=group) @ dequantize(q, s) + bias) + res; ``q`` packed
    (``pack``) or (K, N) int8, ``s`` (1, N) or (ng, N) (a scale per K / ng rows); ``path``
    one of ``ISAS``' codes (default ``isa()``)."""
    if q.ndim == 2:  # not prepared: pack for this call
        q = pack(q)
    k = a.shape[-1]
    n = s.shape[-1]
    if s.ndim == 2 and k % s.shape[0]:  # the C side, given k // ng, would read past s
        raise ShapeError(f"C int8-dynamic gemm: weight scales {s.shape} for K = {k}: their "
                         f"{s.shape[0]} rows must divide K (a scale per K / ng rows of the "
                         f"weight), or be one row")
    gw = k // s.shape[0] if s.ndim == 2 and s.shape[0] > 1 else k
    out = lib.output(out, a.shape[:-1] + (n,), np.float32)
    fn = lib.func(LIB, "tg_q8d_gemm", P, I64, P, P, P, P, P, I64, I64, I64, I32, I32, I64, I64)
    fn.restype = ctypes.c_int
    status = fn(ptr(a), k, ptr(q), ptr(s), ptr(bias), ptr(res), ptr(out),
                math.prod(a.shape[:-1]), n, k, ACTS[act], isa() if path is None else path,
                group or k, gw)
    if status == -2:
        raise MemoryError(f"C int8-dynamic gemm: no memory for the quantized rows of a "
                          f"{a.shape} activation")
    if status == -3:
        raise ValueError(f"C int8-dynamic gemm: groups of {group or k} activation values and "
                         f"{gw} weight rows do not fit K = {k} (each a multiple of {BLOCK} "
                         f"dividing K, one a multiple of the other)")
    if status != 0:
        h = q[:24].view(np.int64)
        raise ValueError(f"C int8-dynamic gemm: the weight is packed as (K, N) = "
                         f"({int(h[1])}, {int(h[2])}), the call needs K = {k}, N = {n}")
    return out


def _scale_check(group: int):
    """Scales the kernel takes: (1, N) (per output channel) or (K / gw, N) with gw a multiple
    of BLOCK; with activation groups of ``group`` (0: the row) the smaller of the two groups
    divides the larger."""
    def check(k: int, n: int, shape: tuple) -> str | None:
        if len(shape) != 2 or shape[1] != n or shape[0] < 1 or k % shape[0]:
            return f"the scale must be (1, {n}) or (ng, {n}) with ng dividing K = {k}, got {shape}"
        ga, gw = group or k, k // shape[0]
        small, big = min(ga, gw), max(ga, gw)
        if (ga < k or gw < k) and (small % BLOCK or big % small):
            return (f"groups of {ga} activation values and {gw} weight rows: the kernel "
                    f"needs multiples of {BLOCK}, one dividing the other")
        return None
    return check


def _signatures(has_bias: bool, residual: bool, group: int = 0) -> list[dict]:
    """Verification cases: one row to 13 rows (two 6-row tiles and a part), K not a multiple
    of 4, N across 64-column tasks and 16-column panels; ``offset`` rows (1e3..1e4 with a
    small spread: most of a row quantizes to one value) and ``tiny``/constant rows. With
    activation ``group``s: K of 1 to 4 groups, weight scales per group, per 2 groups and per
    channel."""
    from tensor_graphs.kernels.signatures import Spec

    if group:
        cases = ((1, group, 17, (), "normal", 1), (3, 2 * group, 31, (), "normal", 2),
                 (8, 4 * group, 80, (), "normal", 4), (13, 2 * group, 33, (), "offset", 1),
                 (4, 4 * group, 9, (2,), "normal", 2), (7, group, 47, (), "tiny", 1),
                 (2, 3 * group, 130, (), "normal", 3))
    else:
        cases = tuple(c + (1,) for c in (
            (1, 1, 1, (), "normal"), (1, 33, 17, (), "normal"), (3, 67, 31, (), "normal"),
            (8, 129, 80, (), "normal"), (13, 65, 33, (), "offset"), (4, 17, 9, (2,), "normal"),
            (7, 31, 47, (), "tiny"), (2, 300, 130, (), "normal")))
        cases += ((6, 128, 40, (), "normal", 4),)  # weight scales per 32 rows of K
    out = []
    for m, k, n, lead, values, ng in cases:
        sig = {"a": Spec(lead + (m, k), "float32", values, axes=(len(lead) + 1,)),
               "q": ((k, n), "int8"), "s": ((ng, n), "float32")}
        if has_bias:
            sig["bias"] = ((n,), "float32")
        if residual:
            sig["res"] = (lead + (m, n), "float32")
        out.append(sig)
    return out


_PREP = Preparation(pack, nbytes=lambda shape, dtype: packed_bytes(*map(int, shape)) + 64,
                    name="pack_q8d", strided=True)


def _family(group: int) -> Family:
    """int8-dynamic's kernels for activation groups of ``group`` (0: a scale per row)."""
    act = (lambda a: tg.dynamic_quant(a, group=group)) if group else tg.dynamic_quant
    return Family(
        prefix=f"c_q8d_g{group}" if group else "c_q8d", lib=LIB, weight_args=("q", "s"),
        weight=tg.dequantize, weight_dtype="int8",
        gemm=lambda *args: gemm(*args, group=group), activation=act, prep=_PREP,
        signatures=lambda has_bias, residual: _signatures(has_bias, residual, group),
        source=SOURCE, scale_check=_scale_check(group),
        product=f"dynamic_quant(a{f', group={group}' if group else ''}) @ dequantize(q, s)",
        what=(f"a scale per {group} values of a row, " if group else "rows ")
        + "quantized in the kernel, int8 x int8 -> int32 (VNNI / AVX2 / C, chosen at run "
          "time), scales (a weight's per column or per group of K rows) in the epilogue.")


for _group in (0,) + GROUPS:
    register(_family(_group))
