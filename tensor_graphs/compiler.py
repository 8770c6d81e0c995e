"""``tg.compile``, ``tg.paths``, ``tg.count_paths``: the pipeline, read top to bottom.

    graph -> bind dims (the call's, or the bounds) -> simplify      planner/prepare.py
          -> plan-cache lookup (replay the cached decisions)        planner/cache.py
          -> else: options per slot, DP within tolerance            planner/search.py
          -> profile="missing": measure what has no row, re-plan    profiler/
          -> flat instruction list over numbered values             runtime/program.py

Costs come from the measurement database (``db``: a path, ":memory:", a Database, or None for
``$TG_DB`` / the user cache file) through one cost model per database, shared by every compile
in the process so its in-memory answers are reused.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping, Sequence

from tensor_graphs.db import hardware as _hardware
from tensor_graphs.db.cost import CostModel
from tensor_graphs.db.store import Database, open_db
from tensor_graphs.devices import as_device
from tensor_graphs.errors import ArgumentError, PlanFileError, ShapeError
from tensor_graphs.ir.graph import _as_list
from tensor_graphs.ir.node import Node
from tensor_graphs.planner import cache
from tensor_graphs.planner.plan import Plan
from tensor_graphs.planner.prepare import as_symbols, prepare, prepare_symbolic, symbols
from tensor_graphs.planner.search import Planner
from tensor_graphs.runtime.program import CompiledGraph

PROFILE_MODES = ("never", "missing")
DEFAULT_TOLERANCE = 1e-5
_cost_models: dict[int, CostModel] = {}


def cost_model(db: Database, kinds: Sequence[str]) -> CostModel:
    model = _cost_models.get(id(db))
    if model is None or model.db is not db:
        model = _cost_models[id(db)] = CostModel(db, {})
    for kind in kinds:
        if kind not in model.hardware:
            model.hardware[kind] = _hardware.current(kind)
    model.refresh()
    return model


class PlanSettings:
    """What a compile fixed (device, tolerance, database, profiling, backends, a lock file);
    called with dims, it returns the plan for them."""

    def __init__(self, outputs: list[Node], device, tolerance, db, profile: str,
                 backends: Sequence[str] | None, decisions: Sequence[str] | None = None,
                 bounds: Mapping | None = None, plan_file=None):
        self.outputs = outputs
        self.bounds = as_symbols(bounds or {})
        self.device = as_device(device)
        self.kinds = tuple(dict.fromkeys((self.device.kind, "cpu")))
        self.tolerance = _check_tolerance(tolerance)
        if profile not in PROFILE_MODES:
            raise ArgumentError(f"profile must be one of {PROFILE_MODES}, got {profile!r}")
        self.profile = profile
        self.db = open_db(db)
        self.backends = None if backends is None else tuple(backends)
        self.decisions = None if decisions is None else tuple(decisions)
        self.plan_file = plan_file  # where ``decisions`` came from, for errors

    def planner(self, prepared: list[Node], blocks: bool = True,
                dims: Mapping | None = None) -> Planner:
        """A planner for ``prepared``; ``dims`` are the values a symbolic graph is costed at."""
        return Planner(prepared, target=self.device.kind, cost=cost_model(self.db, self.kinds),
                       tolerance=self.tolerance, backends=self.backends, blocks=blocks,
                       dims=dims)

    def __call__(self, dims: Mapping, stats: dict) -> Plan:
        """The plan for these dims (the graph specialized to them)."""
        dims = as_symbols(dims)
        self._check_bounds(dims)
        return self._plan(prepare(self.outputs, dims), None, dims, stats)

    def symbolic(self, bounds: Mapping, stats: dict) -> tuple[Plan, Plan]:
        """The plan of the graph with its symbolic dims kept, costed at ``bounds``, and the same
        plan at the bounds (for memory planning)."""
        bounds = as_symbols(bounds)
        plan = self._plan(prepare_symbolic(self.outputs), bounds, bounds, stats)
        return plan, plan.at(bounds)

    def _plan(self, prepared: list[Node], costed_at: Mapping | None, dims: Mapping,
              stats: dict) -> Plan:
        """Replay a lock file or a cached plan, else (after measuring what is missing, with
        profile="missing") search."""
        def key() -> tuple:
            return cache.key(prepared, self.device.name, self.tolerance, self.backends, self.db,
                             costed_at)

        planner = self.planner(prepared, dims=costed_at)
        found = self.decisions or cache.get(key())
        if found is not None:
            try:
                plan = planner.replay(found)
            except PlanFileError as exc:  # refused, never re-planned: see planner/lockfile
                if self.decisions is None:
                    raise
                from tensor_graphs.planner.lockfile import FIX

                raise PlanFileError(f"plan file {self.plan_file} cannot be replayed as saved: "
                                    f"{exc}; it is refused, not re-planned ({FIX})") from None
            stats["replayed" if self.decisions else "plan_cache_hits"] += 1
        else:
            if self.profile == "missing":
                from tensor_graphs.profiler.missing import profile_missing

                concrete = prepared if costed_at is None else prepare(self.outputs, dims)
                everything = self.planner(concrete, blocks=False)  # every option it sees
                everything.solve()
                stats["measured"] += profile_missing(everything, self.db)
                planner = self.planner(prepared, dims=costed_at)  # with the new rows
            plan = planner.plan()
            stats["planner_runs"] += 1
            cache.put(key(), plan.decisions)
        for name in ("slots", "options", "estimates", "blocks", "blocks_planned",
                     "block_cache_hits"):
            stats[name] += planner.stats[name]
        return plan

    def check_bounds(self, dims: Mapping) -> None:
        self._check_bounds(as_symbols(dims))

    def _check_bounds(self, dims: Mapping) -> None:
        over = [f"{s}={dims[s]} (bound {b})" for s, b in self.bounds.items()
                if s in dims and dims[s] > b]
        if over:
            raise ShapeError(f"{', '.join(over)}: above the bounds this program was compiled "
                             "for; compile again with larger bounds=")


def _check_tolerance(tolerance) -> float:
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real) \
            or not tolerance > 0:
        raise ArgumentError(f"tolerance must be a positive number (a norm-wise relative error "
                            f"such as 1e-5), got {tolerance!r}")
    return float(tolerance)


def _outputs(graph) -> tuple[list[Node], bool]:
    outs = _as_list(graph)
    if not outs or not all(isinstance(o, Node) for o in outs):
        raise ArgumentError("compile: give a node or a list of nodes (the graph's outputs)")
    return outs, isinstance(graph, Node)


def compile(graph, device="cpu", tolerance: float = DEFAULT_TOLERANCE,  # noqa: A001
            db: Database | str | None = None, profile: str = "never",
            bounds: Mapping[str, int] | None = None, plan: str | None = None,
            backends: Sequence[str] | None = None) -> CompiledGraph:
    """Plan ``graph`` for ``device`` and return a program that runs it.

    - ``tolerance``: the largest norm-wise relative error any step may add (see planner/plan);
    - ``db``: the measurement database (default ``$TG_DB`` or the user cache file);
    - ``profile``: "never" plans from what the database knows; "missing" first measures every
      kernel call the plan considers that has no row (split with other processes profiling
      the same file; on a read-only database kept in memory for this process, with a
      warning), then plans;
    - ``bounds``: largest values of symbolic dims: planned now, and any smaller values reuse
      that plan's decisions (replayed: no search, ``prog.stats["planner_runs"]`` stays 1);
      a larger value raises ShapeError. Without bounds, a graph with symbolic dims is planned
      on its first call, once per distinct dims;
    - ``plan``: a lock file from ``prog.save_plan``: reused without re-planning; a file that
      cannot be replayed as saved within ``tolerance`` raises ``PlanFileError`` (see
      planner/lockfile);
    - ``backends``: restrict kernels to these backends (e.g. ``("numpy",)``).
    """
    outs, single = _outputs(graph)
    decisions = None
    if plan is not None:
        from tensor_graphs.planner.lockfile import load

        decisions = load(plan, outs, device, _check_tolerance(tolerance))
    settings = PlanSettings(outs, device, tolerance, db, profile, backends, decisions, bounds,
                            plan_file=plan)
    prog = CompiledGraph(outs, single, settings)
    free = symbols(outs)
    dims = as_symbols(bounds or {})
    unknown = sorted(str(s) for s in dims if s not in free)
    if unknown:
        raise ArgumentError(f"bounds name dims {unknown} that the graph does not use; its "
                            f"dims are {sorted(map(str, free)) or 'none'}")
    if free and free <= set(dims):
        prog._plan_symbolic(dims)
    elif free <= set(dims):
        prog._executable(dims)
    return prog


def _planner_for(graph, device, tolerance, db, dims, backends) -> Planner:
    outs, _ = _outputs(graph)
    settings = PlanSettings(outs, device, tolerance, db, "never", backends)
    free = symbols(outs)
    values = as_symbols(dims)
    missing = sorted(str(s) for s in free - set(values))
    if missing:
        raise ArgumentError(f"the graph has symbolic dims {missing}: give their values, e.g. "
                            f"{missing[0]}=128")
    return settings.planner(prepare(outs, values), blocks=False)


def estimate_memory(graph, device="cpu", tolerance: float = DEFAULT_TOLERANCE, db=None,
                    backends: Sequence[str] | None = None, **dims) -> dict[str, int]:
    """Bytes per device (arena + weights + state) the graph's plan needs for these dims, from
    the plan alone: nothing runs and nothing is allocated."""
    from tensor_graphs.memory import plan_memory

    outs, _ = _outputs(graph)
    settings = PlanSettings(outs, device, tolerance, db, "never", backends)
    values = as_symbols(dims)
    missing = sorted(str(s) for s in symbols(outs) - set(values))
    if missing:
        raise ArgumentError(f"the graph has symbolic dims {missing}: give their values, e.g. "
                            f"{missing[0]}=128")
    if symbols(outs):  # as tg.compile(..., bounds=dims) plans it
        return plan_memory(settings.symbolic(values, _counters())[1]).totals()
    return plan_memory(settings(values, _counters())).totals()


def _counters() -> dict:
    return {k: 0 for k in ("planner_runs", "plan_cache_hits", "replayed", "measured", "slots",
                           "options", "estimates", "blocks", "blocks_planned",
                           "block_cache_hits")}


def paths(graph, device="cpu", tolerance: float = 1.0, db=None,
          backends: Sequence[str] | None = None, **dims) -> Iterator[Plan]:
    """Every valid path for ``graph`` lazily (each a ``Plan``: ``.cost``, ``.kernels``,
    ``.steps``), the cheapest option first at every decision. ``tolerance`` defaults to 1:
    every kernel counts."""
    return _planner_for(graph, device, tolerance, db, dims, backends).paths()


def count_paths(graph, device="cpu", tolerance: float = 1.0, db=None,
                backends: Sequence[str] | None = None, **dims) -> int:
    """How many paths ``tg.paths`` yields, counted without enumerating them."""
    return _planner_for(graph, device, tolerance, db, dims, backends).count()
