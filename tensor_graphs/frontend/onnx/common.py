"""What every ONNX table module shares: the node context a mapping reads its inputs and
attributes through, static (import-time) values, and the dtype table."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import sympy

from tensor_graphs.errors import ArgumentError, DTypeError, TensorGraphsError
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.graph import nodes as graph_nodes
from tensor_graphs.ir.node import Node


class UnsupportedOpError(TensorGraphsError):
    """An ONNX model uses ops (or op forms) with no mapping; ``ops`` lists (op, node) pairs."""

    def __init__(self, message: str, ops: Sequence[tuple[str, str]] = ()):
        super().__init__(message)
        self.ops = list(ops)


class StaticInputError(ArgumentError):
    """A graph input an op needs at import time (a Reshape's shape, a Slice's starts): the
    graph cannot be built without its value; ``names`` lists those inputs."""

    def __init__(self, message: str, names: Sequence[str] = ()):
        super().__init__(message)
        self.names = list(names)


# ONNX TensorProto data type -> our dtype name (others are refused by name)
DTYPES = {
    1: "float32",   # FLOAT
    2: "uint8",     # UINT8
    3: "int8",      # INT8
    6: "int32",     # INT32
    7: "int64",     # INT64
    9: "bool",      # BOOL
    10: "float16",  # FLOAT16
    11: "float64",  # DOUBLE
    16: "bfloat16",  # BFLOAT16
}


def dtype_of(code: int, where: str) -> str:
    name = DTYPES.get(int(code))
    if name is None:
        import onnx

        # a code no ONNX dtype has (a corrupt file) is named by its number: protobuf's
        # Name() raised a bare ValueError for it, from inside this error
        known = int(code) in onnx.TensorProto.DataType.values()
        what = onnx.TensorProto.DataType.Name(int(code)) if known else \
            f"code {int(code)} (no ONNX dtype: the file is corrupt, or from a newer onnx)"
        raise DTypeError(f"{where}: ONNX dtype {what} has no tensor_graphs counterpart "
                         f"(supported: {', '.join(DTYPES.values())})")
    return name


class Static:
    """A value known when the graph is built: an initializer, a Constant, or what shape
    arithmetic (Shape -> Gather -> Concat) computes from them. ``array`` may be an object
    array holding symbolic dims (sympy expressions). ``weight`` names the initializer it is,
    so used as a tensor it becomes that weight, bound once."""

    __slots__ = ("array", "weight")

    def __init__(self, array, weight: str | None = None):
        self.array = np.asarray(array)
        self.weight = weight

    @property
    def symbolic(self) -> bool:
        return self.array.dtype == object and any(
            isinstance(v, sympy.Expr) and not v.is_Integer for v in self.array.flat)


def as_tensor(value, weights: dict | None = None) -> Node:
    """A value as a graph node: an initializer becomes its ``tg.weight``; a constant a
    ``tg.constant``; symbolic dims ``tg.size`` of each, joined."""
    if isinstance(value, Node):
        return value
    if not isinstance(value, Static):
        return tg.as_node(value)
    if value.weight is not None and weights is not None:
        node = weights.get(value.weight)
        if node is None:
            arr = value.array
            node = weights[value.weight] = tg.weight(value.weight, arr.shape, arr.dtype.name)
        return node
    arr = value.array
    if arr.dtype == object:
        if not value.symbolic:
            return tg.constant(arr.astype(np.int64))
        parts = [tg.reshape(tg.size(sympy.sympify(v)), (1,)) for v in arr.flat]
        flat = tg.concat(parts, 0) if parts else tg.constant(np.zeros(0, np.int64))
        return tg.reshape(flat, arr.shape)
    return tg.constant(arr)


def ints(values) -> list:
    """An int64 static array as Python ints (sympy dims kept)."""
    out = []
    for v in np.asarray(values).reshape(-1):
        if isinstance(v, sympy.Expr):
            out.append(int(v) if v.is_Integer else v)
        else:
            out.append(int(v))
    return out


def product(dims):
    """The product of sizes, symbolic ones kept (1 for none): a flattened axis' length."""
    out = 1
    for d in dims:
        out = out * d
    return out


def torch_pads(pads) -> list:
    """ONNX's pads (begin..., end...) of the trailing axes in tg.pad's order: the last
    axis' (before, after) first."""
    n = len(pads) // 2
    flat = []
    for i in range(n - 1, -1, -1):
        flat += [pads[i], pads[i + n]]
    return flat


def norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


class Ctx:
    """One ONNX node as a mapping sees it: its inputs (graph nodes, Static values, or None
    for an omitted optional input), its attributes (decoded), the opset of its domain."""

    def __init__(self, op: str, name: str, opset: int, inputs: list, attrs: dict,
                 weights: dict, sources: dict, outputs: int = 1, bounds: dict | None = None,
                 not_one: dict | None = None):
        self.op, self.name, self.opset = op, name, opset
        self.outputs = outputs  # how many of the node's outputs the graph names
        self.inputs, self.attrs = inputs, attrs
        self._weights = weights  # initializer name -> its tg.weight, made once
        self._sources = sources  # graph input leaf -> its ONNX name (for StaticInputError)
        # symbolic dim name -> the largest value from_onnx's dynamic_dims gave it (None: not
        # given): what a mapping that must size something by a dim's largest value reads (a
        # recurrence unrolled over a dynamic sequence)
        self.bounds = dict(bounds or {})
        # symbolic dim name -> the node whose mapping assumed it is not 1 (an axes-less
        # Squeeze): the program refuses a call where it is (``OnnxProgram``)
        self.not_one = {} if not_one is None else not_one

    @property
    def n(self) -> int:
        return len(self.inputs)

    def has(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def t(self, i: int) -> Node:
        """Input ``i`` as a tensor."""
        return as_tensor(self.inputs[i], self._weights)

    def tensors(self) -> list:
        return [self.t(i) for i in range(self.n) if self.has(i)]

    def is_static(self, i: int) -> bool:
        return isinstance(self.inputs[i], Static)

    def all_static(self) -> bool:
        return all(v is None or isinstance(v, Static) for v in self.inputs)

    def s(self, i: int, what: str = "") -> np.ndarray:
        """Input ``i``'s value at import time (a shape, axes, a bound): it must be an
        initializer, a Constant or shape arithmetic, not a value computed at run time."""
        v = self.inputs[i]
        if isinstance(v, Static):
            return v.array
        source = self._sources.get(v)
        label = f"input {i}" + (f" ({what})" if what else "")
        if source is not None:
            raise StaticInputError(
                f"{self.op} node '{self.name}': its {label} is the graph input '{source}', "
                "whose value the graph's shapes depend on; give it when importing: "
                f"tg.from_onnx(..., constants={{'{source}': value}})", [source])
        found = [self._sources[n] for n in graph_nodes([v]) if n in self._sources]
        if found:  # computed from graph inputs: known once they are
            raise StaticInputError(
                f"{self.op} node '{self.name}': its {label} is computed at run time from the "
                f"graph input(s) {found}, and the graph's shapes depend on it; if those "
                "inputs are fixed (a shape fed as an input), give them when importing: "
                "tg.from_onnx(..., constants={name: value})", found)
        raise UnsupportedOpError(
            f"{self.op} node '{self.name}': its {label} is computed from run-time data, "
            "so the result's shape would depend on the data; tensor_graphs needs it known "
            "when the graph is built", [(self.op, self.name)])

    def a(self, name: str, default=None):
        return self.attrs.get(name, default)

    def refuse(self, why: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"{self.op} node '{self.name}' (opset {self.opset}): {why}",
                                  [(self.op, self.name)])


# the most elements an op folds at import time: shape arithmetic is tiny, weights are not
FOLD_LIMIT = 4096


def fold(c: Ctx, fn):
    """``fn`` over the inputs' static arrays when every input is static (shape arithmetic),
    else None: the mapping then builds graph nodes."""
    if not c.all_static() or not c.inputs:
        return None
    if sum(v.array.size for v in c.inputs if v is not None) > FOLD_LIMIT:
        return None  # weights stay weights (bound once), not constants folded from them
    return Static(np.asarray(fn(*[None if v is None else v.array for v in c.inputs])))
