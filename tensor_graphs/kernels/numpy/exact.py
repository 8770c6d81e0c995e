"""Exact kernels: ``numpy_exact_<op>`` for every op, atomic and composite.

Each evaluates the op's own node with the reference interpreter in float64 and rounds the
result once to the node's dtype, so its error is one rounding: at most 2**-24 relative on
float32 outputs. They are declared with a tolerance of 1e-7, so any tolerance >= 1e-7 on
float32 outputs always has a path, whatever other backends offer. They are slow (float64,
one numpy call per atomic op of the decomposition, which is cached per node): the planner's
last resort, and the oracle a person can read.
"""

from __future__ import annotations

import hashlib
import inspect
from collections import OrderedDict
from pathlib import Path

import numpy as np

from tensor_graphs.ir import dtypes as _dtypes
from tensor_graphs.ir.builder import input as _input
from tensor_graphs.ir.builder import state as _state
from tensor_graphs.ir.evaluate import evaluate
from tensor_graphs.ir.graph import decompose
from tensor_graphs.ir.graph import nodes as graph_nodes
from tensor_graphs.ir.node import Node, Op
from tensor_graphs.ir.ops import OPS
from tensor_graphs.kernels.numpy._util import op_pattern, variants, with_signature
from tensor_graphs.kernels.registry import kernel

TOLERANCE = 1e-7


def _to_cpu(shapes, dtypes, attrs):
    device = str(attrs.get("device", "cpu"))
    return True if device == "cpu" else f"computes in host memory; the target is {device}"


class ExactFunction:
    """``fn(*arrays, **attrs)``: the node ``op(arrays, attrs)`` evaluated in float64, rounded
    once to its dtype. ``given`` are the op's tensor parameters present (optional ones may be
    absent), ``names`` the kernel's parameter names. A variadic op (concat) takes any number of
    arrays, named x0, x1, ... for the interpreter.

    A class rather than a closure: the registry hashes a kernel function's source, and
    re-reading this file for each of a hundred exact kernels took a quarter of a second at
    import; ``source_text`` (the op's defining module, hashed once per file) stands in."""

    def __init__(self, op: Op, given: tuple[str, ...], names: tuple[str, ...] | None = None):
        self.op, self.given, self.names = op, tuple(given), tuple(names or given)
        self.subset = bool(op.optional) and self.given != op.params
        self.__qualname__ = self.__name__ = f"numpy_exact_{op.name}"

    def __call__(self, *arrays, **attrs):
        names = tuple(f"x{i}" for i in range(len(arrays))) if self.op.variadic else self.names
        leaves = []
        for name, a in zip(names, arrays):
            dtype = _dtypes.from_numpy(a.dtype)
            make = _state if self.op.name == "state_update" and name == "state" else _input
            leaves.append(make(name, a.shape, dtype))
        if self.subset:
            attrs["args"] = self.given
        node = Node.make(self.op, tuple(leaves), attrs)
        graph = atomic_graph(node)
        # a decomposition may leave an input unread (an index_copy of no indices is x)
        read = {n.name for n in graph_nodes(graph) if n.op.is_leaf}
        feeds = {k: a for k, a in zip(names, arrays) if k in read}
        result = evaluate(graph, feeds, dtype="float64")
        return np.asarray(result).astype(node.dtype.np_dtype)


def exact_function(op: Op, given: tuple[str, ...], names: tuple[str, ...] | None = None):
    """An ExactFunction for ``op`` with the tensors ``given``."""
    return ExactFunction(op, given, names)


_ATOMIC: OrderedDict[Node, Node] = OrderedDict()
_ATOMIC_SIZE = 256


def atomic_graph(node: Node) -> Node:
    """``decompose(node)``, remembered for the last few hundred nodes: expanding a composite
    costs more than evaluating it on small inputs, and kernels run on the same nodes again."""
    found = _ATOMIC.get(node)
    if found is None:
        found = _ATOMIC[node] = decompose(node)
        if len(_ATOMIC) > _ATOMIC_SIZE:
            _ATOMIC.popitem(last=False)
    else:
        _ATOMIC.move_to_end(node)
    return found


_FILE_DIGESTS: dict[str, str] = {}


def _source(op: Op) -> str:
    """What identifies the op's meaning for the kernel's source hash: a digest of the file that
    defines its decomposition (or reference) and of this one, read once per file."""
    parts = [op.name]
    for fn in (op.decompose or op.reference, ExactFunction.__call__):
        try:
            path = inspect.getsourcefile(fn) or ""
        except TypeError:
            path = ""
        if path not in _FILE_DIGESTS:
            try:
                data = Path(path).read_bytes()
            except OSError:
                data = path.encode()
            _FILE_DIGESTS[path] = hashlib.blake2b(data, digest_size=8).hexdigest()
        parts.append(_FILE_DIGESTS[path])
    return ":".join(parts)


def _register(op: Op, given, names, suffix: str, pattern) -> None:
    attrs = {k: v for k, v in op.attr_defaults.items()}
    doc = f"{op.name} by the float64 reference interpreter, rounded once (exact)."
    fixed, star = (names, None) if not op.variadic else ((), names[0])
    fn = with_signature(exact_function(op, given, names), fixed, attrs, doc, source=_source(op),
                        varargs=star)
    kernel(pattern, backend="numpy", name=f"numpy_exact_{op.name}{suffix}", tolerance=TOLERANCE,
           where=_to_cpu if op.name == "copy_to" else None)(fn)


def register_all() -> None:
    """One exact kernel per op and per combination of its optional tensors (a variadic op:
    one kernel for any number of inputs, ``op(*xs)``). Ops registered later (by a user) can
    call this again: existing names are kept."""
    from tensor_graphs.kernels.registry import _KERNELS

    for op in list(OPS.values()):
        if op.is_leaf:
            continue
        if op.variadic:
            if f"numpy_exact_{op.name}" not in _KERNELS:
                _register(op, op.params, op.params, "", op.name)
            continue
        for given, suffix in variants(op):
            if f"numpy_exact_{op.name}{suffix}" not in _KERNELS:
                pattern = op.name if not suffix else op_pattern(op, given)
                _register(op, given, given, suffix, pattern)


register_all()
