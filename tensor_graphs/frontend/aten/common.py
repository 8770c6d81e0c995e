"""What every ATen table module shares: torch on demand, dtype names, argument helpers."""

from __future__ import annotations

from collections.abc import Sequence

from tensor_graphs.errors import ArgumentError, TensorGraphsError
from tensor_graphs.ir import api as tg


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


def binary(fn):
    return lambda a, kw: fn(kw["self"], kw["other"])
