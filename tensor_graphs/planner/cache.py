"""The plan cache: decisions of plans already made in this process, by what decides them.

A key is (structural hash of the prepared graph, its shapes and dtypes — the hash covers them —,
device, tolerance, backends, database file and revision). Leaf names are abstracted by the
structural hash, so two graphs that differ only in names share a plan; a hit replays the
stored decisions on the new graph (no cost lookups, no search). A new measurement changes the
database revision, so plans made before it are not reused.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from tensor_graphs.ir.node import Node
from tensor_graphs.rewrite.canonical import structural_hash

LIMIT = 256
_plans: OrderedDict[tuple, tuple[str, ...]] = OrderedDict()


def key(prepared: Sequence[Node], device: str, tolerance: float, backends, db) -> tuple:
    return (structural_hash(list(prepared)), device, tolerance, backends, db.path, db.revision)


def get(k: tuple) -> tuple[str, ...] | None:
    found = _plans.get(k)
    if found is not None:
        _plans.move_to_end(k)
    return found


def put(k: tuple, decisions: Sequence[str]) -> None:
    _plans[k] = tuple(decisions)
    while len(_plans) > LIMIT:
        _plans.popitem(last=False)


def clear() -> None:
    _plans.clear()
