"""``c_cast_bool``: bool to float32/float64 in C (cross entropy's mask of counted targets), so
a training step's graph has a C kernel for every cast it makes and can run in the native loop
(``pointwise.c_cast`` casts numbers only). Exact: 0 or 1."""

from __future__ import annotations

import numpy as np

from tensor_graphs.ir import dtypes
from tensor_graphs.ir.ops.names import CAST
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.c.lib import I64, P, ptr
from tensor_graphs.kernels.registry import kernel

LIB = "bool_cast"
SOURCE = lib.source(LIB)
_SYMBOL = {np.dtype(np.float32): "tg_cast_bool_f32", np.dtype(np.float64): "tg_cast_bool_f64"}


def _fits(shapes, dtypes, attrs):
    reason = lib.failure(LIB)
    if reason is not None:
        return reason
    target = getattr(attrs.get("dtype"), "name", None)
    if dtypes[0].name != "bool" or target not in ("float32", "float64"):
        return f"casts bool to float32/float64, not {dtypes[0].name} to {target}"
    return True


def _signatures() -> list[dict]:
    return [{"x": (shape, "bool"), "attrs": {"dtype": dtypes.as_dtype(dt)}}
            for shape, dt in (((1,), "float32"), ((1024,), "float32"), ((7, 33), "float64"),
                              ((3, 0), "float32"), ((300_000,), "float32"))]


def _src(fn):
    fn.source_text = SOURCE + "\n/* c_cast_bool */"
    return fn


@kernel(CAST, backend="c", name="c_cast_bool", contiguous=True, where=_fits,
        signatures=_signatures, tolerance=1e-12, writes_out=True)
@_src
def c_cast_bool(x, dtype, *, out=None):
    """bool to float32/float64: 1 where true, 0 where false."""
    target = dtype.np_dtype
    out = lib.output(out, x.shape, target)
    if out.size:
        lib.func(LIB, _SYMBOL[np.dtype(target)], P, P, I64)(ptr(x), ptr(out), x.size)
    return out
