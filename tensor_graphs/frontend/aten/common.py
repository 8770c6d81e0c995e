"""What every ATen table module shares: torch on demand, dtype names, argument helpers."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import sympy

from tensor_graphs.errors import ArgumentError, ShapeError, TensorGraphsError
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.dtypes import promote_pair
from tensor_graphs.ir.node import Node


class UnsupportedOpError(TensorGraphsError):
    """A torch program uses ATen ops with no mapping; ``ops`` lists (op, location) pairs."""

    def __init__(self, message: str, ops: Sequence[tuple[str, str]] = ()):
        super().__init__(message)
        self.ops = list(ops)


class Unavailable:
    """An output of a multi-output ATen op with no tensor_graphs counterpart (max pooling's
    indices, a norm's saved statistics). Exported graphs rarely use them; one that does fails
    when it picks the output (``operator.getitem``) with ``message``."""

    def __init__(self, message: str):
        self.message = message

    def __repr__(self) -> str:
        return f"Unavailable({self.message!r})"


def _unavailable_in(values):
    for v in values:
        if isinstance(v, Unavailable):
            return v
        if isinstance(v, (list, tuple)):
            found = _unavailable_in(v)
            if found is not None:
                return found
    return None


def guarded(table: dict) -> dict:
    """The table with each function raising when it receives an Unavailable output: the
    place a graph actually uses one (picking it with getitem is fine)."""
    def wrap(fn):
        def checked(args, kwargs):
            found = _unavailable_in((*args, *kwargs.values()))
            if found is not None:
                raise ArgumentError(found.message)
            return fn(args, kwargs)
        checked.__wrapped__ = fn
        return checked
    return {key: wrap(fn) for key, fn in table.items()}


def ints(value, n: int | None = None) -> tuple:
    """torch's int-list argument (an int, or a list of ints) as a tuple of n ints."""
    if isinstance(value, (list, tuple)):
        value = tuple(value)
        if n is not None and len(value) == 1:
            value = value * n
        return value
    return (value,) * (n or 1)


def torch_module():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is an optional dependency
        raise ArgumentError("tg.from_torch needs PyTorch: pip install torch") from e
    return torch


def dtype_name(dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    return {"bool": "bool", "float": "float32", "double": "float64", "half": "float16",
            "long": "int64", "int": "int32"}.get(name, name)


def same(x):
    return x


def axes(dim):
    """torch's dim argument (int, list, None or []) as our axis argument."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    return tuple(dim) if isinstance(dim, (list, tuple)) else dim


def cast(x, dtype):
    return x if dtype is None else tg.cast(x, dtype_name(dtype))


def scaled(x, factor):
    return x if factor == 1 else x * factor


def slice_end(value):
    """A slice end of torch's 'to the end' sentinel (sys.maxsize) is None."""
    return None if isinstance(value, int) and value >= 2 ** 62 else value


def unary(fn):
    return lambda a, kw: fn(kw["self"])


_KINDS = ("bool", "int", "float")


def zero_dim_weak(*values) -> tuple:
    """torch's promotion of 0-d tensors next to tensors with dims: a 0-d operand of the
    same kind (or lower) does not widen the result (``x_f32 * torch.tensor(2.0,
    dtype=float64)`` is float32); one of a higher kind promotes with the others. The 0-d
    operands are cast to that dtype here, so our promotion, which counts every tensor
    alike, gives torch's result. A symbolic size (``x * y.shape[0]`` over a dynamic dim) is
    a Python int to torch: the 0-d int64 ``tg.size`` of it here."""
    values = tuple(tg.size(v) if isinstance(v, sympy.Expr) else v for v in values)
    nodes = [v for v in values if isinstance(v, Node)]
    shaped = [v.dtype for v in nodes if v.ndim > 0]
    scalars = [v.dtype for v in nodes if v.ndim == 0]
    if not shaped or not scalars:
        return values
    result = functools.reduce(promote_pair, shaped)
    zero = functools.reduce(promote_pair, scalars)
    if _KINDS.index(zero.kind) > _KINDS.index(result.kind):
        result = promote_pair(result, zero)
    return tuple(tg.cast(v, result) if isinstance(v, Node) and v.ndim == 0
                 and v.dtype != result else v for v in values)


def binary(fn):
    def call(a, kw):
        return fn(*zero_dim_weak(kw["self"], kw["other"]))
    return call


def scalar_dims(fn, key: str = "self", dims: tuple[str, ...] = ("dim",)):
    """``fn`` that also takes torch's 0-d convention: a 0-d tensor accepts dim 0 or -1 (or
    [0]) as if it had one axis of size 1. The tensor becomes 1-d, the dims 0, and each
    tensor result goes back to 0-d (a 0-d reduction keeps its 0-d shape, keepdim or not)."""
    def fn0(a, kw):
        x = kw.get(key)
        if not (hasattr(x, "ndim") and x.ndim == 0) or all(kw.get(d) is None for d in dims):
            return fn(a, kw)
        for d in dims:
            v = kw.get(d)
            picked = list(v) if isinstance(v, (list, tuple)) else [v]
            if v is not None and any(p not in (0, -1) for p in picked):
                raise ShapeError(f"dim {v} is out of range for a 0-d tensor (torch accepts "
                                 "0 and -1)")
        kw = {**kw, key: tg.reshape(x, (1,))}
        for d in dims:
            v = kw.get(d)
            if v is not None:
                kw[d] = [0] * len(v) if isinstance(v, (list, tuple)) else 0
        return _to_0d(fn(a, kw))
    return fn0


def _to_0d(value):
    if isinstance(value, (list, tuple)):
        return type(value)(_to_0d(v) for v in value)
    if hasattr(value, "ndim") and value.ndim == 1:
        return tg.reshape(value, ())
    return value
