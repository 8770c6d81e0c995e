"""``tg profile``: fill the database for one graph, then check the planner against reality.

1. Plan the graph from what the database knows now: the *default plan*, as ``tg.compile``
   runs it (the generated kernels it chose built; one refused is planned without).
2. Walk every kernel x signature the planner considered (every option of every slot, the
   decompositions' too) and measure those without a row, each checked against the float64
   reference first (``measure``). Rows already there are skipped, so an interrupted run
   resumes where it stopped; a kernel that raises is recorded as a failure and the walk goes
   on. ``budget`` (seconds) stops the walk early. Profilers sharing the database split the
   calls (``missing.Work``); on a read-only database the rows are kept in memory for this
   run's plans (with a warning), not recorded.
3. Re-plan, then take the ``--paths N`` paths of the lowest estimated totals
   (``cheapest_paths``) and time them and the default plan end to end on random inputs, all
   warmed first and sampled in turns (``time_paths``).
4. Report: the best path found against the default plan, predicted against measured; a path
   counts as faster only beyond the samples' spread, and one with the default plan's kernels
   is the default plan, not a speedup over it.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from tensor_graphs.commands.calibrate import calibrate, calibrate_gpu
from tensor_graphs.compiler import prepare
from tensor_graphs.db.cost import format_seconds
from tensor_graphs.devices import cuda_available
from tensor_graphs.errors import TensorGraphsError
from tensor_graphs.planner.plan import COPY, KERNEL, Plan
from tensor_graphs.planner.prepare import as_symbols
from tensor_graphs.planner.realize import realize_plan
from tensor_graphs.profiler.measure import uncontended_takes
from tensor_graphs.profiler.missing import Work, calls_to_measure
from tensor_graphs.progress import Progress
from tensor_graphs.runtime.lower import lower
from tensor_graphs.runtime.program import Executable

# How ``time_paths`` times the paths end to end. Each path is lowered and warmed first (its
# first call loads kernels and makes buffers, its second compiles the native loop), then given
# enough calls per sample to last SAMPLE_SECONDS, and the paths take their samples in turns:
# ROUNDS rounds, each begun by the next path, a round's samples taken together in PIECES turns
# and each the median of its pieces, so a burst of other load or a clock change falls on all
# of them alike and a stall of the machine on none; a round is taken again while other
# processes held our threads off the cores, as kernels are measured. A path's time is its
# samples' median. Whole samples in turn were not alike enough: on a VM whose host's stalls
# the guest cannot see (no run delay, no steal), one plan timed twice read 94 and 354 us in
# one round, 286 and 86 us in another. Timed one after the other, the default plan first,
# three single calls each, a two-kernel path of 10.6 us read 70 us as "default" and 175 us as
# "best estimate", the same kernels (and 1.5-6x apart the other way on other runs).
SAMPLE_SECONDS = 0.005
WARM_CALLS = 3  # calls after the first before a path is sized and timed
ROUNDS = 9
PIECES = 5  # turns a round's samples are taken in, the paths one after the other each turn
MIN_ROUNDS = 3  # rounds taken even when the budget has run out
PATH_SECONDS = 10.0  # at most this much calling per path (a slow path takes fewer samples)
# A path is reported faster than the default plan only when its median is FASTER times below
# the default's or more and their samples' interquartile ranges do not overlap; anything less
# is noise: two timings of one plan differ by a few percent (code and buffer placement).
FASTER = 1.05
# ``cheapest_paths`` ranks this many paths by their estimated totals (the planner enumerates
# paths cheapest option first at each decision, which does not order them by total)
RANKED_PATHS = 2000


@dataclass
class PathResult:
    label: str
    plan: Plan
    predicted: float
    measured: float | None = None  # the samples' median, seconds a call
    failure: str | None = None
    samples: list[float] = field(default_factory=list)  # seconds a call, one per sample
    calls: int = 0  # calls a sample

    @property
    def quartiles(self) -> tuple[float, float] | None:
        """The samples' first and third quartiles (None before any)."""
        if not self.samples:
            return None
        q1, q3 = np.percentile(self.samples, [25, 75])
        return float(q1), float(q3)

    @property
    def spread(self) -> float | None:
        """Half the samples' interquartile range relative to their median: 0.03 is +-3%."""
        q = self.quartiles
        if q is None or not self.measured:
            return None
        return (q[1] - q[0]) / 2 / self.measured


def same_plan(a: Plan, b: Plan) -> bool:
    """Whether two plans run the same kernels, in the same order, on the same devices and
    signatures: the same program, however the planner reached it."""
    def key(plan: Plan) -> tuple:
        return tuple((s.kernel.name, s.device, s.signature) for s in plan.steps)
    return key(a) == key(b)


def clearly_faster(fast: PathResult, slow: PathResult) -> bool:
    """``fast`` measured faster than ``slow`` beyond the noise: by FASTER or more, with the
    third quartile of its samples below the first of ``slow``'s."""
    if not fast.measured or not slow.measured or fast.quartiles is None \
            or slow.quartiles is None:
        return False
    return (slow.measured >= FASTER * fast.measured
            and fast.quartiles[1] < slow.quartiles[0])


@dataclass
class ProfileReport:
    measured: int = 0  # rows added
    skipped: int = 0  # calls that already had a row
    failures: int = 0
    out_of_budget: int = 0  # calls left unmeasured when the budget ran out
    paths: list[PathResult] = field(default_factory=list)

    def table(self) -> str:
        rows = [("path", "steps", "predicted", "measured", "spread", "ratio", "kernels")]
        for p in self.paths:
            measured = format_seconds(p.measured) if p.measured is not None else (p.failure or "-")
            spread = f"+-{p.spread:.0%}" if p.spread is not None else "-"
            ratio = f"{p.measured / p.predicted:.2f}" if p.measured and p.predicted else "-"
            names = ", ".join(dict.fromkeys(p.plan.kernels))
            rows.append((p.label, str(len(p.plan)), format_seconds(p.predicted), measured,
                         spread, ratio, names[:60] + ("..." if len(names) > 60 else "")))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        head = (f"measured {self.measured} kernel calls ({self.skipped} already in the "
                f"database, {self.failures} failed"
                + (f", {self.out_of_budget} left for lack of budget" if self.out_of_budget
                   else "") + ")")
        verdict = self.verdict()
        return "\n".join([head, "", *lines, *(["", verdict] if verdict else [])])

    @property
    def default(self) -> PathResult | None:
        return next((p for p in self.paths if p.label == "default"), None)

    def verdict(self) -> str | None:
        """The report's last line: the best path found against the default plan. A path with
        the default plan's kernels is the default plan (its time against the default's is the
        noise of the timing); another is faster only beyond the noise (``clearly_faster``)."""
        best, default = self.best, self.default
        if best is None or default is None or not default.measured or not best.measured:
            return None
        if best is default or same_plan(best.plan, default.plan):
            twins = [p.label for p in self.paths
                     if p is not default and same_plan(p.plan, default.plan)]
            same = (f"; {', '.join(twins)} {'is' if len(twins) == 1 else 'are'} the same "
                    f"plan" if twins else "")
            return (f"best path found: the default plan, {format_seconds(default.measured)} "
                    f"measured{same}: no other path measured faster")
        ratio = default.measured / best.measured
        if clearly_faster(best, default):
            return (f"best path found: {best.label}, {format_seconds(best.measured)} "
                    f"measured vs {format_seconds(default.measured)} for the default plan "
                    f"({ratio:.2f}x)")
        return (f"best path found: the default plan, {format_seconds(default.measured)} "
                f"measured: no path measured faster beyond the noise ({best.label} "
                f"{format_seconds(best.measured)}, {ratio:.2f}x, within the samples' spread)")

    @property
    def best(self) -> PathResult | None:
        done = [p for p in self.paths if p.measured is not None]
        return min(done, key=lambda p: p.measured) if done else None


def cheapest_paths(planner, n: int, ranked: int = RANKED_PATHS) -> tuple[list[Plan], bool]:
    """The ``n`` paths of the lowest estimated totals (``Plan.cost``), cheapest first, among
    the first ``ranked`` (at least ``n``) ``planner.paths()`` yields, and whether those were
    all of its paths. ``paths()`` takes the cheapest option first at each decision, which
    does not order the paths by their totals: its 8th can be cheaper than its 5th."""
    if n <= 0:
        return [], False
    paths = planner.paths()
    plans = heapq.nsmallest(n, itertools.islice(paths, max(n, ranked)),
                            key=lambda p: p.cost)  # as sorted()[:n]: ties keep their order
    return plans, next(paths, None) is None


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


def _per_call(run, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - start) / calls


def _calls_per_sample(run, sample_seconds: float, path_seconds: float) -> tuple[int, float]:
    """(calls per sample, seconds spent): ``run`` warmed, then as many calls a sample as
    last ``sample_seconds`` at the pace of WARM_CALLS calls timed once warm. The first calls
    are no pace: the first loads kernels and makes buffers, the second records the native
    loop and compiles it (15 ms where a warm call took 65 us: samples sized on them were
    single calls, noise). Warming lasts WARM_CALLS calls and ``sample_seconds``, or a fifth
    of ``path_seconds`` for a slow path (then sized on its warm calls)."""
    start = time.perf_counter()
    run()
    warm, calls = time.perf_counter(), 0
    while (calls < WARM_CALLS or time.perf_counter() - warm < sample_seconds) \
            and time.perf_counter() - start < path_seconds / 5:
        run()
        calls += 1
    pace = (time.perf_counter() - warm) / calls if calls else warm - start
    if pace * WARM_CALLS < path_seconds / 5:
        pace = _per_call(run, WARM_CALLS)
    return max(1, math.ceil(sample_seconds / max(pace, 1e-9))), time.perf_counter() - start


def time_paths(results: list[PathResult], feeds, dims, *, deadline: float | None = None,
               rounds: int = ROUNDS, sample_seconds: float = SAMPLE_SECONDS,
               path_seconds: float = PATH_SECONDS, bar: Progress | None = None) -> None:
    """Time each path of ``results`` end to end on ``feeds`` (its ``samples`` and
    ``measured``, or its ``failure``), as the comment on SAMPLE_SECONDS says: every path
    lowered and warmed before any is timed, then ``rounds`` rounds of one sample a path, each
    round begun by the next path and its samples taken together (``_take_round``). Past
    ``deadline`` only the default plan is still started, and at most MIN_ROUNDS rounds are
    taken."""
    def late() -> bool:
        return deadline is not None and time.monotonic() > deadline

    live = []  # [result, its call, seconds spent calling it]
    for r in results:
        if r.label != "default" and late():
            r.failure = "out of budget"
        else:
            try:
                # a generated kernel the plan chose is built (and verified) first, as a
                # compile builds it (a Candidate is no kernel yet: lowering it failed)
                plan, refused = realize_plan(r.plan)
                if refused:
                    name, why = next(iter(refused.items()))
                    raise TensorGraphsError(f"generated kernel {name} refused: {why}")
                exe = Executable(lower(plan))

                def run(exe=exe):
                    return exe.run(feeds, dims)
                r.calls, spent = _calls_per_sample(run, sample_seconds, path_seconds)
                live.append([r, run, spent])
            except Exception as exc:  # noqa: BLE001 - a failing path is reported, not fatal
                r.failure = f"{type(exc).__name__}: {exc}"[:80]
        if bar is not None:
            bar.step(f"warming {r.label}")
    for k in range(rounds):
        if k >= MIN_ROUNDS and late():
            break
        turn = [e for e in live if e[0].failure is None
                and (not e[0].samples or e[2] < path_seconds)]
        if not turn:
            break
        _take_round(turn[k % len(turn):] + turn[:k % len(turn)])
        if bar is not None:
            bar.step(f"round {k + 1}")
    for r in results:
        if r.failure is None and r.samples:
            r.measured = float(np.median(r.samples))
        elif r.failure is not None:
            r.samples.clear()


class _PathError(Exception):
    """A path's call raised in a round: which path (its index in the round), and what."""

    def __init__(self, index: int, exc: Exception):
        self.index, self.exc = index, exc


def _in_pieces(runs: list, calls: list[int], pieces: int) -> list[float]:
    """Seconds per call of each of ``runs`` over its ``calls``, taken in ``pieces`` turns
    (each run its share of the calls in every turn, so all see the same load): the median of
    its pieces, so that a stall of the machine, which lands in one piece, is not one path's
    time (one of 16 ms read 376 us a call for 56 calls of 84 us)."""
    times: list[list[float]] = [[] for _ in runs]
    for j in range(pieces):
        for i, (run, n) in enumerate(zip(runs, calls)):
            share = n * (j + 1) // pieces - n * j // pieces
            if not share:
                continue
            start = time.perf_counter()
            try:
                for _ in range(share):
                    run()
            except Exception as exc:  # noqa: BLE001 - named to the caller by its path
                raise _PathError(i, exc) from exc
            times[i].append((time.perf_counter() - start) / share)
    return [float(np.median(t)) for t in times]


def _take_round(entries: list[list]) -> None:
    """One sample of each of ``entries`` ([result, its call, seconds spent calling it]),
    taken together (``_in_pieces``) and again while other processes held our threads off the
    cores; a path that raises fails, and the round is taken again without it."""
    while entries:
        calls = [e[0].calls for e in entries]
        try:
            seconds, spent = uncontended_takes(
                functools.partial(_in_pieces, [e[1] for e in entries], calls, PIECES), calls)
        except _PathError as failed:
            exc = failed.exc
            entries.pop(failed.index)[0].failure = f"{type(exc).__name__}: {exc}"[:80]
            continue
        for entry, s, t in zip(entries, seconds, spent):
            entry[0].samples.append(s)
            entry[2] += t
        return


def _as_compiled(settings, prepared, refused: dict[str, str]):
    """(a planner of every option of every slot, its plan as ``tg.compile`` runs it): the
    generated kernels the plan chose built and verified, one refused (it fails to, or is less
    accurate than the tolerance) added to ``refused`` and the graph planned again without it.
    Unbuilt, the default plan failed to run ("'Candidate' object has no attribute ...")."""
    while True:
        planner = settings.planner(prepared, blocks=False, refused=frozenset(refused))
        plan, more = realize_plan(planner.plan())
        if not more:
            return planner, plan
        refused.update(more)


def calls_with_rows(planner) -> set[tuple[str, str]]:
    """The (kernel, signature) calls of the planner's kernel and copy options that have a row
    already (a measurement or a recorded failure): what a run does not measure again. Counted
    per call, as ``calls_to_measure`` lists the work: one call is an option at every slot that
    makes it (a reshape at each layer), and counting options reported more calls "already in
    the database" than it holds rows."""
    return {(o.kernel.name, o.signature) for options in planner._options.values()
            for o in options if o.how in (KERNEL, COPY) and o.estimate is not None
            and o.estimate.source in ("measured", "failed")}


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
    refused: dict[str, str] = {}  # generated kernels refused when built: planned without
    planner, default = _as_compiled(settings, prepared, refused)
    todo = calls_to_measure(planner)
    if todo:
        db.record_in_memory()
    report.skipped = len(calls_with_rows(planner))
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
    while True:  # the cheapest paths, each generated kernel they chose built (or refused)
        planner = settings.planner(prepared, blocks=False, refused=frozenset(refused))
        ranked, _ = cheapest_paths(planner, paths)
        more = {name: why for plan in ranked for name, why in realize_plan(plan)[1].items()}
        if not more:
            break
        refused.update(more)
    rng = np.random.default_rng(seed)
    feeds = random_feeds(prepared, rng)
    results = [PathResult("default", default, default.cost)]
    for i, plan in enumerate(ranked):
        results.append(PathResult("best estimate" if i == 0 else f"path {i + 1}", plan,
                                  plan.cost))
    bar = Progress(len(results) + ROUNDS, "running paths") if progress else None
    time_paths(results, feeds, as_symbols(dims), deadline=deadline, bar=bar)
    if bar is not None:
        bar.close()
    report.paths = results
    return report
