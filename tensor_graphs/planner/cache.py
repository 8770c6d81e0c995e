"""The plan cache: decisions of plans already made in this process, by what decides them.

A key is (the prepared graph's structure, device, tolerance, backends, database object and
its revision). The structure is an ordered digest: ops, attributes, shapes, dtypes and which input
feeds which position, with leaf names left out, so two graphs that differ only in names share
a plan. Operand order is kept (unlike ``structural_hash``, which sorts commutative operands):
a hit replays the stored decisions by walking the new graph in the same order (no cost
lookups, no search). A new measurement changes the database revision, so plans made before it
are not reused.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

from tensor_graphs.ir.graph import nodes
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import CONSTANT, DIM

LIMIT = 256
_plans: OrderedDict[tuple, tuple[str, ...]] = OrderedDict()


def key(prepared: Sequence[Node], device: str, tolerance: float, backends, db,
        bounds=None) -> tuple:
    """``bounds``: the dims a symbolic graph is costed at. The database is keyed by its
    object (``open_db`` gives one per file): by the path it was opened with, "m.sqlite" of
    another folder at the same revision replayed the plan the first one's rows decided."""
    costed_at = tuple(sorted((str(k), int(v)) for k, v in (bounds or {}).items()))
    return (structure(prepared), device, tolerance, backends, db.instance, db.revision,
            costed_at)


def structure(outputs: Sequence[Node]) -> str:
    """An ordered digest of the graph with leaf names abstracted (see the module doc)."""
    order = nodes(list(outputs))
    index = {n: i for i, n in enumerate(order)}
    h = hashlib.blake2b(digest_size=16)
    for n in order:
        named = n.op.is_leaf and n.op.name not in (CONSTANT, DIM)
        attrs = () if named else hash(n.attrs)  # exact values (constants by their bytes)
        h.update(repr((n.op.name, attrs, tuple(map(str, n.shape)), n.dtype.name,
                       tuple(index[i] for i in n.inputs))).encode())
    h.update(repr([index[o] for o in outputs]).encode())
    return h.hexdigest()


def get(k: tuple) -> tuple[str, ...] | None:
    found = _plans.get(k)
    if found is not None:
        _plans.move_to_end(k)
    return found


def put(k: tuple, decisions: Sequence[str]) -> None:
    _plans[k] = tuple(decisions)
    while len(_plans) > LIMIT:
        _plans.popitem(last=False)


def drop(k: tuple) -> None:
    """Forget a plan that no longer replays (a kernel it chose was refused since)."""
    _plans.pop(k, None)


def clear() -> None:
    _plans.clear()
