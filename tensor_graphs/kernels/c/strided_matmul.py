"""``c_matmul_strided``: a @ b through OpenBLAS, reading both operands through their strides.

A training step's backward multiplies views: ``g @ W^T`` (a permuted weight), ``x^T @ g`` (a
permuted activation), the q, k and v slices of a fused projection, attention's head-permuted
tensors. ``c_matmul`` reads dense operands, so the runtime copies each view first (and a copy
keeps a program out of the native loop); numpy's matmul reads them but calls its own OpenBLAS
once per batch entry, whose workers sleep between calls (OPENBLAS_THREAD_TIMEOUT=4, see
``threads``): (8, 128, 256) @ (256, 256) took 14-64 ms against 0.6-1.1 ms dense. Here one C
call hands BLAS each operand's transpose flag and leading dimension, packs only views BLAS
cannot read (a broadcast or negative stride), batches up to three batch axes (broadcasting as
numpy does) and folds batch axes into the rows where the strides allow, so (8, 128, 256) @
(256, 256) is one GEMM of 1024 rows. Its threads are the C kernels' team, each running
OpenBLAS on one thread (strided_matmul.c says why). The C arguments are the shapes and strides
alone, so the native loop replays a call as it was recorded.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from tensor_graphs.errors import EvaluationError
from tensor_graphs.ir.ops.names import MATMUL
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.c.lib import I64, P, ptr
from tensor_graphs.kernels.c.matmul import blas_flags
from tensor_graphs.kernels.registry import kernel

LIB = "strided_matmul"
SOURCE = lib.source(LIB)
MAX_BATCH_AXES = 3
_INT_MAX = 2**31 - 1
_SYMBOL = {np.dtype(np.float32): "tg_smm_f32", np.dtype(np.float64): "tg_smm_f64"}
_ARGS = (P, P, P, *([I64] * 17))

lib._EXTRA_FLAGS[LIB] = blas_flags  # noqa: SLF001 - links scipy-openblas32 as blas.c does


def _fits(shapes, dtypes, attrs):
    reason = lib.failure(LIB)
    if reason is not None:
        return reason
    if len(set(dtypes)) > 1 or dtypes[0].name not in ("float32", "float64"):
        return f"takes float32 or float64 operands of one dtype, got " \
               f"{', '.join(d.name for d in dtypes)}"
    a, b = (tuple(s) for s in shapes)
    if len(a) < 2 or len(b) < 2:
        return f"needs operands of rank >= 2, got {a} @ {b}"
    if a[-1] != b[-2]:
        return f"inner dims differ: {a} @ {b}"
    try:
        batch = np.broadcast_shapes(a[:-2], b[:-2])
    except ValueError:
        return f"batch dims do not broadcast: {a} @ {b}"
    if sum(1 for e in batch if e != 1) > MAX_BATCH_AXES:
        return f"at most {MAX_BATCH_AXES} batch axes of extent > 1, got {a} @ {b}"
    if max(a[-2], a[-1], b[-1], math.prod(a[:-1])) > _INT_MAX:
        return "a dimension exceeds the 32-bit BLAS's range"
    return True


def _signatures() -> list[dict]:
    """Dense verification cases (the strided ones are in tests/kernels/test_strided_matmul.py:
    a signature draws dense inputs)."""
    out = []
    for a, b, dt in (((1, 1), (1, 1), "float32"), ((7, 33), (33, 9), "float32"),
                     ((2, 5, 64), (64, 17), "float32"), ((3, 4, 8, 16), (3, 4, 16, 8), "float64"),
                     ((2, 1, 6, 7), (3, 7, 5), "float32"), ((1, 1025), (1025, 3), "float64"),
                     ((6, 0), (0, 4), "float32")):
        out.append({"a": (a, dt), "b": (b, dt)})
    return out


_LAYOUTS: dict[tuple, tuple] = {}  # shapes, strides, itemsize -> (result shape, C ints)


def _layout(a: np.ndarray, b: np.ndarray) -> tuple:
    """(result shape, the C call's 17 integer arguments) for a @ b as these views lie."""
    item = a.itemsize
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    nd = len(batch)

    def strides(x):  # element strides over the result's batch axes (0: broadcast)
        lead = nd - (x.ndim - 2)
        own = [s // item for s in x.strides]
        return ([0] * lead + [0 if e == 1 else s for e, s in zip(x.shape[:-2], own[:-2])],
                own[-2], own[-1])

    sa, ars, acs = strides(a)
    sb, brs, bcs = strides(b)
    axes = [(e, x, y) for e, x, y in zip(batch, sa, sb) if e != 1]
    rows = m
    # fold the innermost batch axes into the rows while b is shared and a's rows run on
    while axes and axes[-1][2] == 0 and (rows == 1 or axes[-1][1] == rows * ars):
        e, x, _ = axes.pop()
        ars = x if rows == 1 else ars
        rows *= e
    merged: list[tuple[int, int, int]] = []
    for e, x, y in axes:  # adjacent batch axes that step evenly become one
        if merged and merged[-1][1] == e * x and merged[-1][2] == e * y:
            pe, _, _ = merged.pop()
            merged.append((pe * e, x, y))
        else:
            merged.append((e, x, y))
    merged = [(1, 0, 0)] * (MAX_BATCH_AXES - len(merged)) + merged
    (n0, a0, b0), (n1, a1, b1), (n2, a2, b2) = merged
    args = (rows, n, k, ars, acs, brs, bcs, n0, n1, n2, a0, a1, a2, b0, b1, b2, 0)
    return (*batch, m, n), args


def _aligned(x: np.ndarray) -> np.ndarray:
    """x itself, or a native-order copy where its strides are not whole elements."""
    if x.dtype.isnative and all(s % x.itemsize == 0 for s in x.strides):
        return x
    return np.ascontiguousarray(x, x.dtype.newbyteorder("="))


def _src(fn):
    fn.source_text = SOURCE + "\n/* c_matmul_strided */"
    return fn


@kernel(MATMUL, backend="c", name="c_matmul_strided", where=_fits, signatures=_signatures,
        tolerance=1e-5, writes_out=True)
@_src
def c_matmul_strided(a, b, *, out=None):
    """a @ b, float32/float64, batch axes broadcast (at most three of extent > 1), both
    operands read through their strides (a transposed or sliced view is never copied)."""
    a, b = _aligned(a), _aligned(b)
    key = (a.shape, a.strides, b.shape, b.strides, a.itemsize)
    found = _LAYOUTS.get(key)
    if found is None:
        if len(_LAYOUTS) >= 1024:
            _LAYOUTS.clear()
        found = _LAYOUTS[key] = _layout(a, b)
    shape, args = found
    out = lib.output(out, shape, a.dtype)
    fn = lib.func(LIB, _SYMBOL[a.dtype], *_ARGS)
    if fn.restype is not ctypes.c_int:
        fn.restype = ctypes.c_int
    if fn(ptr(a), ptr(b), ptr(out), *args):
        raise EvaluationError(f"c_matmul_strided: no memory to pack an operand of "
                              f"{a.shape} @ {b.shape}")
    return out

