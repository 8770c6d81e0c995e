"""``tg profile``: fill the database for one graph, then check the planner against reality.

1. Plan the graph from what the database knows now: the *default plan*.
2. Walk every kernel x signature the planner considered (every option of every slot, the
   decompositions' too) and measure those without a row, each checked against the float64
   reference first (``measure``). Rows already there are skipped, so an interrupted run
   resumes where it stopped; a kernel that raises is recorded as a failure and the walk goes
   on. ``budget`` (seconds) stops the walk early. Profilers sharing the database split the
   calls (``missing.Work``); on a read-only database the rows are kept in memory for this
   run's plans (with a warning), not recorded.
3. Re-plan, then walk the paths cheapest-estimated first (``--paths N``): run each end to end
   on random inputs and time it.
4. Report: the best path found against the default plan, predicted against measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from tensor_graphs.commands.calibrate import calibrate, calibrate_gpu
from tensor_graphs.compiler import prepare
from tensor_graphs.db.cost import format_seconds
from tensor_graphs.devices import cuda_available
from tensor_graphs.planner.plan import Plan
from tensor_graphs.planner.prepare import as_symbols
from tensor_graphs.profiler.measure import sample_times
from tensor_graphs.profiler.missing import Work, calls_to_measure
from tensor_graphs.profiler.progress import Progress
from tensor_graphs.runtime.lower import lower
from tensor_graphs.runtime.program import Executable


@dataclass
class PathResult:
    label: str
    plan: Plan
    predicted: float
    measured: float | None = None
    failure: str | None = None


@dataclass
class ProfileReport:
    measured: int = 0  # rows added
    skipped: int = 0  # calls that already had a row
    failures: int = 0
    out_of_budget: int = 0  # calls left unmeasured when the budget ran out
    paths: list[PathResult] = field(default_factory=list)

    def table(self) -> str:
        rows = [("path", "steps", "predicted", "measured", "ratio", "kernels")]
        for p in self.paths:
            measured = format_seconds(p.measured) if p.measured is not None else (p.failure or "-")
            ratio = f"{p.measured / p.predicted:.2f}" if p.measured and p.predicted else "-"
            names = ", ".join(dict.fromkeys(p.plan.kernels))
            rows.append((p.label, str(len(p.plan)), format_seconds(p.predicted), measured, ratio,
                         names[:60] + ("..." if len(names) > 60 else "")))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        head = (f"measured {self.measured} kernel calls ({self.skipped} already in the "
                f"database, {self.failures} failed"
                + (f", {self.out_of_budget} left for lack of budget" if self.out_of_budget
                   else "") + ")")
        best = self.best
        default = next((p for p in self.paths if p.label == "default"), None)
        tail = []
        if best is not None and default is not None and default.measured and best.measured:
            tail.append(f"best path found: {best.label}, {format_seconds(best.measured)} "
                        f"measured vs {format_seconds(default.measured)} for the default plan "
                        f"({default.measured / best.measured:.2f}x)")
        return "\n".join([head, "", *lines, *([""] + tail if tail else [])])

    @property
    def best(self) -> PathResult | None:
        done = [p for p in self.paths if p.measured is not None]
        return min(done, key=lambda p: p.measured) if done else None


def random_feeds(prepared, rng: np.random.Generator) -> dict[str, np.ndarray]:
    from tensor_graphs.ir.graph import leaves

    feeds = {}
    for leaf in leaves(prepared):
        shape = tuple(int(d) for d in leaf.shape)
        if leaf.dtype.is_float:
            feeds[leaf.name] = (0.5 * rng.standard_normal(shape)).astype(leaf.dtype.np_dtype)
        else:
            feeds[leaf.name] = np.zeros(shape, dtype=leaf.dtype.np_dtype)
    return feeds


def run_path(plan: Plan, feeds, dims, repeats: int = 3) -> float:
    exe = Executable(lower(plan))
    samples = sample_times(lambda: exe.run(feeds, dims), repeats, min_sample=0.0,
                           max_seconds=10.0)
    return float(np.median(samples))


def profile(outputs, settings, dims, *, budget: float | None = None, paths: int = 3,
            progress: bool = True, seed: int = 0) -> ProfileReport:
    """Run the walk above for ``outputs`` with a compile's ``settings`` (device, tolerance,
    database); ``dims`` binds symbolic dims."""
    report = ProfileReport()
    db = settings.db
    deadline = None if budget is None else time.monotonic() + budget
    prepared = prepare(outputs, dims)
    planner = settings.planner(prepared, blocks=False)  # every option of every slot
    uncalibrated = [kind for kind in planner.kinds
                    if db.calibration(planner.cost.hardware[kind]) is None
                    and (kind == "cpu" or cuda_available())]
    if uncalibrated:
        db.record_in_memory()  # a read-only database: for this run's plans only (warned)
        for kind in uncalibrated:  # the CPU's rates, and a GPU's under its own key
            (calibrate if kind == "cpu" else calibrate_gpu)(db, planner.cost.hardware[kind])
        planner = settings.planner(prepared, blocks=False)
    default = planner.plan()
    todo = calls_to_measure(planner)
    if todo:
        db.record_in_memory()
    report.skipped = sum(1 for opts in planner._options.values() for o in opts
                         if o.estimate is not None and o.estimate.source == "measured")
    bar = Progress(len(todo), "measuring kernels") if progress else None
    work = Work(db, todo, deadline=deadline, hardware=planner.cost.hardware)
    for window in work:
        for o, m in window:
            db.record(m)
            report.measured += 1
            report.failures += m.failure is not None
            if bar is not None:
                bar.step(o.kernel.name)
    report.skipped += work.by_others
    report.out_of_budget = len(work.pending)
    if bar is not None:
        bar.close()
    planner = settings.planner(prepared, blocks=False)
    rng = np.random.default_rng(seed)
    feeds = random_feeds(prepared, rng)
    results = [PathResult("default", default, default.cost)]
    for i, plan in enumerate(planner.paths()):
        if i >= paths:
            break
        results.append(PathResult("best estimate" if i == 0 else f"path {i + 1}", plan,
                                  plan.cost))
    bar = Progress(len(results), "running paths") if progress else None
    for r in results:
        if deadline is not None and time.monotonic() > deadline and r.label != "default":
            r.failure = "out of budget"
        else:
            try:
                r.measured = run_path(r.plan, feeds, as_symbols(dims))
            except Exception as exc:  # noqa: BLE001 - a failing path is reported, not fatal
                r.failure = f"{type(exc).__name__}: {exc}"[:80]
        if bar is not None:
            bar.step(r.label)
    if bar is not None:
        bar.close()
    report.paths = results
    return report

