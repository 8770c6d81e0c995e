"""Immutable, hash-consed graph nodes and the op descriptor they point to.

``Node.make`` returns the existing node when the same (op, inputs, attrs) was built before and
is still alive, so structurally identical expressions are one object: CSE is free, and Python
``==``/``hash`` keep identity semantics so nodes can live in dicts and sets.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import sympy

from tensor_graphs.errors import DecompositionError, TensorGraphsError
from tensor_graphs.ir.dtypes import DType
from tensor_graphs.ir.shapes import Shape, format_shape

LEAF, ATOMIC, COMPOSITE = "leaf", "atomic", "composite"


@dataclass(frozen=True, eq=False)
class Op:
    """An operation: its name, kind and rule hooks (JAX-style: one object, several rules).

    - ``infer(inputs, attrs) -> (shape, dtype)`` for leaves and atomic ops;
    - ``reference(arrays, attrs) -> ndarray`` (atomic ops): the one numpy semantics;
    - ``decompose(*inputs, **attrs) -> Node`` (composite ops): the one definition.
    """

    name: str
    kind: str
    doc: str
    params: tuple[str, ...] = ()  # tensor parameters, in order
    attr_defaults: Mapping[str, object] = field(default_factory=dict)
    infer: Callable | None = None
    reference: Callable | None = None
    decompose: Callable | None = None
    optional: tuple[str, ...] = ()  # tensor parameters that may be None
    variadic: bool = False  # concat: any number of tensor inputs

    @property
    def is_atomic(self) -> bool:
        return self.kind != COMPOSITE

    @property
    def is_leaf(self) -> bool:
        return self.kind == LEAF

    def __repr__(self) -> str:
        return f"Op({self.name}, {self.kind})"


def _key(value):
    """A hashable, exact key for an attribute value: -0.0 differs from 0.0, NaN equals NaN."""
    if isinstance(value, bool):
        return ("b", value)  # True must not share a key with 1
    if isinstance(value, float):
        return ("f", value.hex())
    if isinstance(value, tuple):
        return ("t",) + tuple(_key(v) for v in value)
    if isinstance(value, DType):
        return ("d", value.name)
    return value


def freeze(value):
    """Make an attribute value immutable: lists become tuples, numpy scalars Python scalars."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return ConstValue(value)
    if isinstance(value, sympy.Basic) and value.is_Integer:
        return int(value)
    return value


class Attrs(Mapping):
    """An immutable mapping of attribute name to value, hashable by exact value."""

    __slots__ = ("_dict", "_key")

    def __init__(self, items: Mapping | None = None):
        d = {k: freeze(v) for k, v in (items or {}).items()}
        object.__setattr__(self, "_dict", d)
        object.__setattr__(self, "_key", tuple(sorted((k, _key(v)) for k, v in d.items())))

    def __getitem__(self, name):
        return self._dict[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._dict)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other) -> bool:
        return isinstance(other, Attrs) and self._key == other._key

    def __setattr__(self, name, value):
        raise AttributeError("Attrs are immutable")

    def replace(self, **changes) -> Attrs:
        return Attrs({**self._dict, **changes})

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k}={v!r}" for k, v in self._dict.items()) + "}"


class ConstValue:
    """A read-only numpy array that hashes and compares by dtype, shape and exact bytes."""

    __slots__ = ("array", "_hash")

    def __init__(self, array: np.ndarray):
        arr = np.array(array, copy=True, order="C")
        arr.setflags(write=False)
        self.array = arr
        self._hash = hash((arr.dtype.str, arr.shape, arr.tobytes()))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return (isinstance(other, ConstValue) and self._hash == other._hash
                and self.array.dtype == other.array.dtype
                and self.array.shape == other.array.shape
                and self.array.tobytes() == other.array.tobytes())

    def __repr__(self) -> str:
        if self.array.size <= 8:
            return np.array2string(self.array, separator=", ")
        return f"<{self.array.dtype} array {self.array.shape}>"


_table: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_lock = threading.RLock()
_tracing = threading.local()


class Node:
    """One value of a graph: op, inputs, attrs, shape, dtype (and name for named leaves)."""

    __slots__ = ("op", "inputs", "attrs", "shape", "dtype", "name", "__weakref__")

    op: Op
    inputs: tuple[Node, ...]
    attrs: Attrs
    shape: Shape
    dtype: DType
    name: str | None

    def __init__(self, *args, **kwargs):
        raise TypeError("nodes are built with tg functions (tg.input, tg.add, ...), not Node()")

    @staticmethod
    def make(op: Op, inputs: tuple[Node, ...] = (), attrs: Mapping | None = None,
             name: str | None = None) -> Node:
        """The node for (op, inputs, attrs[, name]): an existing one if it is still alive."""
        attrs = attrs if isinstance(attrs, Attrs) else Attrs(attrs)
        inputs = tuple(inputs)
        key = (op.name, inputs, attrs, name)
        with _lock:
            found = _table.get(key)
            if found is not None:
                return found
        if op.kind == COMPOSITE:
            shape, dtype = _trace_composite(op, inputs, attrs)
        else:
            shape, dtype = op.infer(inputs, attrs)
        node = object.__new__(Node)
        for slot, value in (("op", op), ("inputs", inputs), ("attrs", attrs),
                            ("shape", tuple(shape)), ("dtype", dtype), ("name", name)):
            object.__setattr__(node, slot, value)
        with _lock:
            return _table.setdefault(key, node)

    def __setattr__(self, name, value):
        raise AttributeError("nodes are immutable; build a new one instead")

    def __delattr__(self, name):
        raise AttributeError("nodes are immutable")

    def __reduce__(self):
        raise TypeError("nodes do not pickle; use tg.save / tg.load")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        label = f"{self.op.name} {self.name!r}" if self.name is not None else self.op.name
        return f"<{label} {format_shape(self.shape)} {self.dtype.name}>"

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        first = self.shape[0]
        if not isinstance(first, int):
            raise TypeError(f"len() of a tensor whose first dim is symbolic ({first})")
        return first

    def __iter__(self):
        raise TypeError("graph nodes are not iterable; slice them with x[i] instead")

    # The fluent API: each method is a thin call into ir.api (imported at the end of this file).
    def __add__(self, other): return api.add(self, other)  # noqa: E704
    def __radd__(self, other): return api.add(other, self)  # noqa: E704
    def __sub__(self, other): return api.sub(self, other)  # noqa: E704
    def __rsub__(self, other): return api.sub(other, self)  # noqa: E704
    def __mul__(self, other): return api.mul(self, other)  # noqa: E704
    def __rmul__(self, other): return api.mul(other, self)  # noqa: E704
    def __truediv__(self, other): return api.div(self, other)  # noqa: E704
    def __rtruediv__(self, other): return api.div(other, self)  # noqa: E704
    def __matmul__(self, other): return api.matmul(self, other)  # noqa: E704
    def __rmatmul__(self, other): return api.matmul(other, self)  # noqa: E704
    def __pow__(self, other): return api.pow(self, other)  # noqa: E704
    def __rpow__(self, other): return api.pow(other, self)  # noqa: E704
    def __neg__(self): return api.neg(self)  # noqa: E704
    def __abs__(self): return api.abs(self)  # noqa: E704
    def __lt__(self, other): return api.less(self, other)  # noqa: E704
    def __le__(self, other): return api.less_equal(self, other)  # noqa: E704
    def __gt__(self, other): return api.greater(self, other)  # noqa: E704
    def __ge__(self, other): return api.greater_equal(self, other)  # noqa: E704
    def __invert__(self): return api.logical_not(self)  # noqa: E704
    def __and__(self, other): return api.logical_and(self, other)  # noqa: E704
    def __or__(self, other): return api.logical_or(self, other)  # noqa: E704
    __hash__ = object.__hash__  # identity: == is deliberately not elementwise (use tg.equal)
    __array_ufunc__ = None  # numpy defers to the reflected operators: np.float32(2) * x

    def __getitem__(self, index): return api.getitem(self, index)  # noqa: E704
    def reshape(self, *shape): return api.reshape(self, *shape)  # noqa: E704
    def permute(self, *axes): return api.permute(self, *axes)  # noqa: E704
    def transpose(self, a: int, b: int): return api.transpose(self, a, b)  # noqa: E704
    def expand(self, *shape): return api.expand(self, *shape)  # noqa: E704
    def astype(self, dtype): return api.cast(self, dtype)  # noqa: E704
    def sum(self, axis=None, keepdims=False): return api.sum(self, axis, keepdims)  # noqa: E704
    def max(self, axis=None, keepdims=False): return api.max(self, axis, keepdims)  # noqa: E704
    def min(self, axis=None, keepdims=False):  # composites take attrs by keyword
        return api.min(self, axis=axis, keepdims=keepdims)

    def mean(self, axis=None, keepdims=False):
        return api.mean(self, axis=axis, keepdims=keepdims)

    def unsqueeze(self, axis: int): return api.unsqueeze(self, axis)  # noqa: E704
    def squeeze(self, axis=None): return api.squeeze(self, axis)  # noqa: E704
    def flatten(self, start: int = 0, end: int = -1): return api.flatten(self, start, end)  # noqa: E704

    @property
    def T(self) -> Node:  # noqa: N802 - numpy's name
        return api.permute(self, tuple(reversed(range(self.ndim))))


def _trace_composite(op: Op, inputs: tuple[Node, ...], attrs: Attrs):
    """Shape and dtype of a composite node, from its decomposition (the one source of truth)."""
    stack = getattr(_tracing, "stack", None)
    if stack is None:
        stack = _tracing.stack = []
    if op.name in stack:
        chain = " -> ".join(stack[stack.index(op.name):] + [op.name])
        raise DecompositionError(
            f"composite op '{op.name}' uses itself in its decomposition ({chain}); "
            "a decomposition may only use other ops")
    stack.append(op.name)
    try:
        out = expand_composite(op, inputs, attrs)
    except DecompositionError:
        raise
    except TensorGraphsError as exc:
        shown = ", ".join(f"{format_shape(i.shape)} {i.dtype.name}" for i in inputs)
        raise type(exc)(f"{op.name}({shown}): {exc}") from None
    except Exception as exc:  # a bad attribute value, or a bug in the definition
        shown = ", ".join(f"{format_shape(i.shape)} {i.dtype.name}" for i in inputs)
        raise DecompositionError(f"{op.name}({shown}) with {dict(attrs)}: its decomposition "
                                 f"raised {type(exc).__name__}: {exc}") from exc
    finally:
        stack.pop()
    return out.shape, out.dtype


def expand_composite(op: Op, inputs: tuple[Node, ...], attrs: Attrs) -> Node:
    """One level of decomposition: call the op's definition with its tensors and attributes."""
    args = list(inputs)
    if op.optional:
        present = attrs.get("args", op.params)
        it = iter(inputs)
        args = [next(it) if p in present else None for p in op.params]
        kwargs = {k: v for k, v in attrs.items() if k != "args"}
    else:
        kwargs = dict(attrs)
    out = op.decompose(*args, **kwargs)
    if not isinstance(out, Node):
        raise DecompositionError(f"decomposition of '{op.name}' returned {type(out).__name__}, "
                                 "expected a node")
    return out


from tensor_graphs.ir import api  # noqa: E402  (the fluent methods call into it)
