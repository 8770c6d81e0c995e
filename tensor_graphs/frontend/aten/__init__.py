"""The ATen table: one mapping from an op overload (or its packet) to
``fn(args, kwargs) -> value`` built from our ops, split by domain.

Table functions receive ``args`` (the positional arguments, fx nodes replaced by their
values) and ``kwargs``: every argument of the overload's schema by name, defaults filled
in. Python operators on sizes (``operator.mul`` on ``sym_size`` results) receive only
``args``. Each domain module has ``table(aten) -> dict``; a key in two modules is an error.
"""

from __future__ import annotations

from collections.abc import Callable

from tensor_graphs.frontend.aten import index_ops, math_ops, nn_ops, shape_ops
from tensor_graphs.frontend.aten.common import UnsupportedOpError, torch_module

MODULES = (math_ops, nn_ops, shape_ops, index_ops)


def build_table() -> dict:
    aten = torch_module().ops.aten
    table: dict = {}
    for module in MODULES:
        part = module.table(aten)
        twice = set(part) & set(table)
        if twice:
            raise RuntimeError(f"{module.__name__} maps ATen ops mapped elsewhere: {twice}")
        table.update(part)
    return table


ATEN: dict = build_table()


def lookup(target) -> Callable | None:
    """The table function for an fx node's target (an overload, else its packet)."""
    fn = ATEN.get(target)
    if fn is None and hasattr(target, "overloadpacket"):
        fn = ATEN.get(target.overloadpacket)
    return fn


__all__ = ["ATEN", "MODULES", "UnsupportedOpError", "build_table", "lookup"]
