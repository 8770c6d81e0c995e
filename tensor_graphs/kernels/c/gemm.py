"""C float32 GEMM on a weight packed once (``gemm.c``): ``c_packed_*`` kernels.

The weight operand (b (K, N) of ``a @ b``, or torch's (N, K) weight of ``linear``) is declared
a *prepared* argument (``prepare=`` in the registry): ``pack(w, linear)`` re-lays it out once
into 16-column panels (a 64-byte header with its K and N, then the panels, 64-byte aligned),
and the runtime does that once per binding for a weight (or a value computed from weights
only), keeping the packed copy with the weights (``runtime/lower.py`` makes it a prepared
value). The planner only offers these kernels where the weight is such a static value
(``ir.graph.is_static``, checked in ``planner/search.py``), since packing per call would
cost more than the product saves. The kernel function still accepts an unpacked weight (a
2-D array): it packs it for that call, correct but slow, so a direct call,
``Kernel.__call__`` and the verifier need nothing special.

A is packed per call in panels of 8 rows with AVX-512, else 6 (all of K when K <= 768, else
blocks of up to 768 K-rows); an 8 x 32 register-blocked micro-kernel over two panels with
AVX-512, else 6 x 16; OpenMP over N panels, or over blocks of rows when M >= 512.
``c_packed_matmul`` (a @ b), ``_bias`` (+ bias), ``c_packed_linear`` (x @ w.T + b),
``_nobias``, ``_relu``/``_gelu``/``_gelu_tanh`` variants of the bias ones (bias and
activation applied to each C tile as its last K block is stored), and ``_add`` variants of
the four plain ones (+ an operand of the result's shape: the residual add of a transformer
block, read as each tile is stored). ``writes_out``.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from tensor_graphs.errors import TensorGraphsError
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.c.lib import I32, I64, P, ptr
from tensor_graphs.kernels.c.matmul import (
    _signatures,
    epilogue_kernel,
    gemm_constraint,
)
from tensor_graphs.kernels.registry import Preparation, kernel

LIB = "gemm"
SOURCE = lib.source(LIB)
ACTS = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3}
HEADER = 16  # floats before the panels
PANEL = 16  # columns per panel


def packed_floats(k: int, n: int) -> int:
    """Floats the packed form of a (k, n) operand takes, header included."""
    return HEADER + -(-n // PANEL) * k * PANEL


def pack(w: np.ndarray, linear: bool) -> np.ndarray:
    """The packed form of a weight: ``w`` (K, N) for ``a @ w``, or (N, K) for ``linear``
    (``x @ w.T``), float32, read through its strides (a transposed view packs without a copy).
    A 1-D float32 array: a header (int64 magic, K, N, panels), then ceil(N / 16) panels of
    K x 16 floats, zero-padded past N."""
    w = np.asarray(w)
    if w.ndim != 2 or w.dtype != np.float32:
        raise TypeError(f"pack: needs a 2-D float32 weight, got {w.shape} {w.dtype}")
    if any(s < 0 or s % 4 for s in w.strides):
        w = np.ascontiguousarray(w)
    sn, sk = (s // 4 for s in w.strides) if linear else (s // 4 for s in w.strides[::-1])
    n, k = w.shape if linear else w.shape[::-1]
    out = lib.aligned(packed_floats(k, n), np.float32)
    lib.func(LIB, "tg_gemm_pack_b", P, I64, I64, I64, I64, P)(
        w.ctypes.data, k, n, sk, sn, out.ctypes.data)
    return out


def packed_shape(p: np.ndarray) -> tuple[int, int]:
    """(K, N) of a packed operand."""
    h = p[:8].view(np.int64)
    if h[0] != 0x7467676D6D706B31:
        raise TypeError("not a packed GEMM operand")
    return int(h[1]), int(h[2])


def _packed_nbytes(linear: bool):
    def nbytes(shape, dtype) -> int:
        n, k = shape if linear else shape[::-1]
        return 4 * (packed_floats(int(k), int(n)) + 16)
    return nbytes


def gemm(a, w, bias=None, act=None, linear=False, out=None, res=None):
    """act(a @ op(w) + bias) + res with ``w`` packed (``pack``) or a 2-D weight (packed here);
    ``res`` (the result's shape, C-contiguous) is added as each tile is stored."""
    if w.ndim == 2:  # not prepared: pack for this call (correct, slow)
        w = pack(w, linear)
    k = a.shape[-1]
    if out is None:
        n = packed_shape(w)[1]
        out = np.empty(a.shape[:-1] + (n,), np.float32)
    else:  # the caller's buffer has the result's shape (writes_out); C checks the header
        n = out.shape[-1]
    fn = lib.func(LIB, "tg_gemm_packed_f32", P, I64, P, P, P, P, I64, I64, I64, I32)
    fn.restype = ctypes.c_int
    status = fn(ptr(a), k, ptr(w), ptr(bias), ptr(res), ptr(out), math.prod(a.shape[:-1]), n, k,
                ACTS[act])
    if status == -1:
        raise ValueError(f"C packed gemm: the weight is packed as (K, N) = {packed_shape(w)}, "
                         f"the call needs K = {k}, N = {n}")
    if status != 0:
        raise TensorGraphsError("C packed gemm: out of memory")
    return out


def _register(name: str, linear: bool, has_bias: bool, act: str | None, residual=False):
    pattern, run = epilogue_kernel(gemm, linear, has_bias, act,
                                   ", the weight packed once at bind time (8x32 "
                                   "AVX-512 micro-kernel, 6x16 on AVX2).", residual)
    run.source_text = SOURCE + f"\n/* {name} */"
    weight = "weight" if linear else "b"
    prep = Preparation(lambda w: pack(w, linear), nbytes=_packed_nbytes(linear),
                       name="pack_linear" if linear else "pack_matmul", strided=True)
    kernel(pattern, backend="c", name=name, dtypes=("float32",), contiguous=True,
           where=gemm_constraint(LIB, linear, has_bias, packed=True, residual=residual),
           tolerance=1e-5, signatures=_signatures(linear, has_bias, residual), writes_out=True,
           prepare={weight: prep})(run)


_register("c_packed_matmul", False, False, None)
_register("c_packed_matmul_bias", False, True, None)
_register("c_packed_linear", True, True, None)
_register("c_packed_linear_nobias", True, False, None)
for _act in ("relu", "gelu", "gelu_tanh"):
    _register(f"c_packed_matmul_bias_{_act}", False, True, _act)
    _register(f"c_packed_linear_{_act}", True, True, _act)
# + a residual of the product's shape (a transformer block's skip connection)
_register("c_packed_matmul_add", False, False, None, residual=True)
_register("c_packed_matmul_bias_add", False, True, None, residual=True)
_register("c_packed_linear_add", True, True, None, residual=True)
_register("c_packed_linear_nobias_add", True, False, None, residual=True)
