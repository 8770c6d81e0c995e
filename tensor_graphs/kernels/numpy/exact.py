"""Exact kernels: ``numpy_exact_<op>`` for every op, atomic and composite.

Each evaluates the op's own node with the reference interpreter in float64 and rounds the
result once to the node's dtype, so its error is one rounding: at most 2**-24 relative on
float32 outputs. They are declared with a tolerance of 1e-7, so any tolerance >= 1e-7 on
float32 outputs always has a path, whatever other backends offer. They are slow (the
interpreter expands composites on every call): the planner's last resort, and the oracle a
person can read.
"""

from __future__ import annotations

import inspect

import numpy as np

from tensor_graphs.ir import dtypes as _dtypes
from tensor_graphs.ir.builder import input as _input
from tensor_graphs.ir.builder import state as _state
from tensor_graphs.ir.evaluate import evaluate
from tensor_graphs.ir.node import Node, Op
from tensor_graphs.ir.ops import OPS
from tensor_graphs.kernels.numpy._util import CONCAT_ARITIES, op_pattern, variants, with_signature
from tensor_graphs.kernels.registry import kernel
from tensor_graphs.rewrite import pattern as pat

TOLERANCE = 1e-7


def _to_cpu(shapes, dtypes, attrs):
    device = str(attrs.get("device", "cpu"))
    return True if device == "cpu" else f"computes in host memory; the target is {device}"


def exact_function(op: Op, given: tuple[str, ...], names: tuple[str, ...] | None = None):
    """``fn(*arrays, **attrs)``: the node ``op(arrays, attrs)`` evaluated in float64, rounded
    once to its dtype. ``given`` are the op's tensor parameters present (optional ones may be
    absent), ``names`` the kernel's parameter names (concat: x0, x1, ...)."""
    names = tuple(names or given)
    subset = op.optional and tuple(given) != op.params

    def run(*arrays, **attrs):
        leaves = []
        for name, a in zip(names, arrays):
            dtype = _dtypes.from_numpy(a.dtype)
            make = _state if op.name == "state_update" and name == "state" else _input
            leaves.append(make(name, a.shape, dtype))
        if subset:
            attrs["args"] = tuple(given)
        node = Node.make(op, tuple(leaves), attrs)
        result = evaluate(node, dict(zip(names, arrays)), dtype="float64")
        return np.asarray(result).astype(node.dtype.np_dtype)

    return run


def _source(op: Op) -> str:
    fn = op.decompose or op.reference
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return op.name


def _register(op: Op, given, names, suffix: str, pattern) -> None:
    attrs = {k: v for k, v in op.attr_defaults.items()}
    doc = f"{op.name} by the float64 reference interpreter, rounded once (exact)."
    fn = with_signature(exact_function(op, given, names), names, attrs, doc, source=_source(op))
    kernel(pattern, backend="numpy", name=f"numpy_exact_{op.name}{suffix}", tolerance=TOLERANCE,
           where=_to_cpu if op.name == "copy_to" else None)(fn)


def register_all() -> None:
    """One exact kernel per op and per combination of its optional tensors (concat: per
    arity). Ops registered later (by a user) can call this again: existing names are kept."""
    from tensor_graphs.kernels.registry import _KERNELS

    for op in list(OPS.values()):
        if op.is_leaf:
            continue
        if op.variadic:
            for n in CONCAT_ARITIES:
                names = tuple(f"x{i}" for i in range(n))
                suffix = "" if n == 2 else f"_{n}"
                if f"numpy_exact_{op.name}{suffix}" not in _KERNELS:
                    pattern = pat.OpPat(op.name, tuple(pat.var(v) for v in names))
                    _register(op, names, names, suffix, pattern)
            continue
        for given, suffix in variants(op):
            if f"numpy_exact_{op.name}{suffix}" not in _KERNELS:
                pattern = op.name if not suffix else op_pattern(op, given)
                _register(op, given, given, suffix, pattern)


register_all()
