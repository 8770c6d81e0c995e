"""The nine dtypes, their numpy storage types and the promotion rules of the builder.

Atomic ops require operands of one dtype; the builder (``tg.add`` and friends) promotes mixed
operands first with :func:`result_type` and inserts explicit casts, so promotion is visible in
the graph instead of hidden in every kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from tensor_graphs.errors import DTypeError


@dataclass(frozen=True)
class DType:
    name: str
    np_dtype: np.dtype
    kind: str  # "bool" | "int" | "float"
    rank: int  # position within its kind, for widening

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind == "int"

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def is_low_precision(self) -> bool:
        """float16/bfloat16: the reference computes in float32 and rounds once per op."""
        return self.name in ("float16", "bfloat16")

    @property
    def itemsize(self) -> int:
        return self.np_dtype.itemsize

    def __repr__(self) -> str:
        return f"tg.{self.name}"

    def __str__(self) -> str:
        return self.name


bool_ = DType("bool", np.dtype(np.bool_), "bool", 0)
uint8 = DType("uint8", np.dtype(np.uint8), "int", 0)
int8 = DType("int8", np.dtype(np.int8), "int", 0)
int32 = DType("int32", np.dtype(np.int32), "int", 1)
int64 = DType("int64", np.dtype(np.int64), "int", 2)
float16 = DType("float16", np.dtype(np.float16), "float", 0)
bfloat16 = DType("bfloat16", np.dtype(ml_dtypes.bfloat16), "float", 0)
float32 = DType("float32", np.dtype(np.float32), "float", 1)
float64 = DType("float64", np.dtype(np.float64), "float", 2)

ALL: tuple[DType, ...] = (bool_, uint8, int8, int32, int64, float16, bfloat16, float32, float64)
BY_NAME: dict[str, DType] = {d.name: d for d in ALL}
# The dtype groups, defined once, in ALL's order: kernels declare dtypes= with them
FLOATS = tuple(d for d in ALL if d.is_float)
INTS = tuple(d for d in ALL if d.is_int)
NUMBERS = INTS + FLOATS  # every dtype but bool
_BY_NUMPY = {d.np_dtype: d for d in ALL}


def as_dtype(value) -> DType:
    """Accept a DType, its name ("float32"), a numpy dtype or a Python type."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str) and value in BY_NAME:
        return BY_NAME[value]
    if value is bool:
        return bool_
    if value is int:
        return int64
    if value is float:
        return float32
    try:
        found = _BY_NUMPY.get(np.dtype(value))
    except TypeError:
        found = None
    if found is None:
        raise DTypeError(
            f"unsupported dtype {value!r}; use one of: {', '.join(BY_NAME)}"
        )
    return found


def from_numpy(np_dtype: np.dtype) -> DType | None:
    return _BY_NUMPY.get(np.dtype(np_dtype))


def promote_pair(a: DType, b: DType) -> DType:
    """Torch-like promotion within our nine dtypes (uint8 with int8 widens to int32)."""
    if a == b:
        return a
    if a.kind != b.kind:
        order = ("bool", "int", "float")
        return a if order.index(a.kind) > order.index(b.kind) else b
    if a.kind == "float" and a.rank == b.rank:  # float16 with bfloat16
        return float32
    if a.kind == "int" and a.rank == b.rank:  # uint8 with int8
        return int32
    return a if a.rank > b.rank else b


def weak_scalar_dtype(value, other: DType | None) -> DType:
    """The dtype a Python scalar takes next to a tensor of dtype ``other`` (None: no tensor).

    A scalar adopts the tensor's dtype unless it is of a higher kind: ``x_f16 * 2.0`` stays
    float16, ``ids_int32 + 1`` stays int32, ``ids_int64 * 0.5`` becomes float32.
    """
    kind = "bool" if isinstance(value, (bool, np.bool_)) else (
        "int" if isinstance(value, (int, np.integer)) else "float")
    default = {"bool": bool_, "int": int64, "float": float32}[kind]
    if other is None:
        return default
    order = ("bool", "int", "float")
    if order.index(kind) <= order.index(other.kind):
        return other
    return default
