"""The ATen table: one mapping from an op overload (or its packet) to
``fn(args, kwargs) -> value`` built from our ops, split by domain.

Table functions receive ``args`` (the positional arguments, fx nodes replaced by their
values) and ``kwargs``: every argument of the overload's schema by name, defaults filled
in. Python operators on sizes (``operator.mul`` on ``sym_size`` results) receive only
``args``. Each domain module has ``table(aten) -> dict``; a key in two modules is an error.
"""

from __future__ import annotations

from collections.abc import Callable

from tensor_graphs.frontend.aten import (
    index_ops,
    math_ops,
    nn_ops,
    pointwise_ops,
    random_ops,
    recurrent_ops,
    select_ops,
    shape_ops,
)
from tensor_graphs.frontend.aten.common import UnsupportedOpError, torch_module

MODULES = (math_ops, nn_ops, shape_ops, index_ops, pointwise_ops, select_ops,
           recurrent_ops, random_ops)


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
NAMED: dict = dict(select_ops.NAMED)  # libraries' custom ops, by schema name


def lookup(target) -> Callable | None:
    """The table function for an fx node's target (an overload, else its packet). An
    in-place op (``relu_``, ``add_``) maps through its functional form; the importer then
    makes the mutated tensor's name stand for the result (``mutates``). A library's custom
    op (``torch.library``) is found by its schema name in ``NAMED``."""
    fn = ATEN.get(target)
    if fn is None and hasattr(target, "overloadpacket"):
        fn = ATEN.get(target.overloadpacket)
    if fn is None and mutates(target):
        functional = getattr(torch_module().ops.aten, target.overloadpacket.__name__[:-1],
                             None)
        overload = getattr(functional, target._overloadname, None) if functional else None
        fn = lookup(overload) if overload is not None else None
    if fn is None and hasattr(target, "_schema"):
        fn = NAMED.get(target._schema.name)
    if fn is None and hasattr(target, "_schema") and target._schema.name.startswith("prims::"):
        fn = _prim(target)
    return fn


# prims whose meaning differs from the ATen op of their name
_PRIMS_DIFFER = {
    "div",  # prims.div truncates integer operands; aten.div divides exactly
}


def _prim(target) -> Callable | None:
    """A ``prims`` op (what torch's reference decompositions produce: prims.abs, prims.mul)
    through the mapped ATen overload of its name with the same arguments, in order. A prim's
    inputs already have one dtype (the decomposition promoted them), so the ATen mapping's
    promotion has nothing to do."""
    name = target._schema.name.removeprefix("prims::")
    packet = getattr(torch_module().ops.aten, name, None)
    if packet is None or name in _PRIMS_DIFFER:
        return None
    names = [a.name for a in target._schema.arguments]
    for name in packet.overloads():
        overload = getattr(packet, name)
        if [a.name for a in overload._schema.arguments] == names:
            fn = ATEN.get(overload) or ATEN.get(packet)
            if fn is not None:
                return fn
    return None


def mutates(target) -> bool:
    """An in-place ATen op: its name ends in '_' and it writes its first argument."""
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.name.endswith("_") or not schema.arguments:
        return False
    alias = schema.arguments[0].alias_info
    return alias is not None and alias.is_write


def writes_values(target) -> bool:
    """An in-place op that changes its tensor's values, not only its view of them: torch
    tags ``detach_``, ``unsqueeze_``, ``transpose_``... ``inplace_view`` (they rewrite the
    tensor's metadata and leave the storage as it was), so tensors sharing that storage
    are unchanged by them. transformers' sliding-window cache layers ``detach_`` a fresh
    ``torch.tensor`` and read it through ``.to``: no write for a view to miss."""
    if not mutates(target):
        return False
    tag = getattr(torch_module().Tag, "inplace_view", None)
    return tag is None or tag not in getattr(target, "tags", ())


__all__ = ["ATEN", "MODULES", "UnsupportedOpError", "build_table", "lookup", "mutates",
           "writes_values"]
