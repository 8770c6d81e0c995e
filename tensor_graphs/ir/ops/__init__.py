"""The op table: every op, atomic or composite, registered once by name.

``atomic.py`` holds the ~28 atomic ops with their numpy references; ``composite*.py`` hold the
composites, each defined only by its decomposition.
"""

from __future__ import annotations

from tensor_graphs.errors import TensorGraphsError
from tensor_graphs.ir.node import Op

OPS: dict[str, Op] = {}


def register(op: Op) -> Op:
    if op.name in OPS:
        raise TensorGraphsError(f"an op named '{op.name}' is already registered")
    OPS[op.name] = op
    return op


def unregister(name: str) -> None:
    OPS.pop(name, None)


def get(name: str) -> Op:
    try:
        return OPS[name]
    except KeyError:
        raise TensorGraphsError(f"unknown op '{name}'") from None
