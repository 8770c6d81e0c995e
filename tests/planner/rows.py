"""Database rows that decide a cross-device plan, for the planner's tests (not a test module).

A test states the times that should decide (kernel name, or (kernel name, node) for one value's
copy); ``record`` writes a row for every kernel and copy the planner considers for the graph,
each other kernel at ``other`` seconds, so nothing unmeasured (estimated from built-in rates)
takes part and each plan follows from the rows alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tensor_graphs.db.cost import FREE, CostModel
from tensor_graphs.db.hardware import current
from tensor_graphs.db.store import Measurement
from tensor_graphs.ir.node import Node
from tensor_graphs.planner.search import Planner

SLOW = 1.0  # seconds: a kernel the test does not name is never the cheapest


def planner(outputs: Sequence[Node], db, *, kinds: Mapping[str, object] | None = None,
            **options) -> Planner:
    """A planner for "cuda" over ``db`` (hardware keys from ``kinds``, default this host's
    for both kinds: a simulated second device), tolerance 1e-5, torch/numpy/copy kernels."""
    hardware = dict(kinds or {"cpu": current("cpu"), "cuda": current("cpu")})
    options = {"target": "cuda", "tolerance": 1e-5, "backends": ("torch", "numpy", "copy"),
               **options}
    return Planner(list(outputs), cost=CostModel(db, hardware), **options)


def record(db, outputs: Sequence[Node], times: Mapping, other: float = SLOW,
           **options) -> None:
    """A measured row for every kernel option of every slot of the graph (``planner``'s
    options): ``times[(name, node)]``, else ``times[name]``, else ``other`` seconds (a row is
    keyed by the call's signature: a node's own time is that of every call with its shapes). Planned
    without repeated blocks, so every node's options are this planner's (a block's sub-planner
    asks for the same signatures: shapes, dtypes and attributes)."""
    p = planner(outputs, db, **{**options, "blocks": False})
    p.solve()
    found: dict[tuple, tuple[bool, float]] = {}  # row key -> (named for its node, seconds)
    for slot, listed in list(p._options.items()):  # noqa: SLF001 - every option considered
        for o in [*listed, *p._rejected.get(slot, [])]:  # noqa: SLF001
            if o.kernel is None or o.estimate is FREE or not hasattr(o.kernel, "source_hash"):
                continue
            name, key = o.kernel.name, (o.kernel.name, o.kernel.source_hash, o.signature)
            own = (name, o.slot.node) in times
            if own or key not in found or not found[key][0]:  # a node's own time prevails
                found[key] = (own, times.get((name, o.slot.node), times.get(name, other)))
    for (name, source_hash, sig), (_, seconds) in found.items():
        db.record(Measurement(name, source_hash, sig, 5, seconds, seconds, seconds, 0.0))


def plan(db, outputs: Sequence[Node], times: Mapping, other: float = SLOW, **options):
    """The plan the rows ``times`` decide (see ``record``)."""
    record(db, outputs, times, other, **options)
    made = planner(outputs, db, **options).plan()
    assert all(s.source in ("measured", "free") for s in made.steps), made.explain()
    return made
