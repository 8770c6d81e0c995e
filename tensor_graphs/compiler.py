"""``tg.compile``, ``tg.paths``, ``tg.count_paths``: the pipeline, read top to bottom.

    graph -> specialize   bind the call's dims (none: kept, planned for bounds)  planner/prepare
          -> simplify     movement chains, identities and constants folded       rewrite/simplify
          -> recompose    hand-spelled composites (RMSNorm...) back into an op   rewrite/recompose
          -> sink         reshapes moved below pointwise ops                      rewrite/sink
          -> siblings     products of one activation by static weights fused     rewrite/siblings
                          (an alternative form: both are planned, the faster runs)
          -> plan         a lock file or the plan cache replayed, else options    planner/
                          per slot and DP within tolerance (profile="missing":
                          measure what has no row first); the generated kernels
                          it chose built and verified (refused: planned again)  planner/realize
          -> memory plan  liveness and arena offsets; OutOfMemory before a run    memory/
          -> lower        the plan as a flat program over numbered values         runtime/lower
          -> program      the Executable a call runs                              runtime/program

``Pipeline.build`` runs the passes in that order, each through ``run_pass``: ``TG_DEBUG=1``
prints each pass's name, size and time to stderr; ``TG_DEBUG=2`` also checks what each pass
hands on (``planner/lint.py``, ``memory.lint_memory``, ``runtime.lower.lint_program``) and
raises ``PassError`` naming the pass that broke it. ``tg.compile`` builds once for a static
graph or for the bounds; a graph with symbolic dims and no bounds is built on its first call
with new dims.

Costs come from the measurement database (``db``: a path, ":memory:", a Database, or None for
``$TG_DB`` / the user cache file) through one cost model per database, shared by every compile
in the process so its in-memory answers are reused.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import numbers
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from tensor_graphs.db import hardware as _hardware
from tensor_graphs.db.cost import CostModel, format_seconds
from tensor_graphs.db.store import Database, open_db
from tensor_graphs.devices import Device, as_device
from tensor_graphs.errors import ArgumentError, PassError, PlanFileError, ShapeError
from tensor_graphs.ir.graph import _as_list, nodes
from tensor_graphs.ir.node import Node
from tensor_graphs.memory import MemoryPlan, check_fits, lint_memory, plan_memory
from tensor_graphs.planner import cache
from tensor_graphs.planner.lint import lint_graph, lint_plan
from tensor_graphs.planner.plan import Plan
from tensor_graphs.planner.prepare import as_symbols, check_dims, specialize, symbols
from tensor_graphs.planner.realize import realize_plan
from tensor_graphs.planner.search import LOW_PRECISION_ROUNDING, Planner
from tensor_graphs.rewrite.recompose import recompose
from tensor_graphs.rewrite.siblings import fuse_siblings, sibling_groups, side_by_side
from tensor_graphs.rewrite.simplify import simplify
from tensor_graphs.rewrite.sink import sink_reshapes
from tensor_graphs.runtime.lower import Program, lint_program, lower
from tensor_graphs.runtime.program import CompiledGraph, Executable

PROFILE_MODES = ("never", "missing")
OUTPUTS = ("host", "device")  # where a program's results come back (tg.compile's outputs=)
DEFAULT_TOLERANCE = 1e-5  # a float32 graph's (see resolve_tolerance)
# which counter of ``prog.stats`` a planner search adds to, per form of the graph searched
# (``_plan``'s ``form``): each counts searches that ran, never corrected after the fact
SEARCHES: dict[Callable | None, str] = {
    None: "planner_runs",  # the graph as the passes hand it on (``prepare``)
    fuse_siblings: "sibling_runs",  # its sibling-fused form, searched beside it (_plan_forms)
}


def cost_model(db: Database, kinds: Sequence[str]) -> CostModel:
    """The database's one cost model, reused by every compile against it and freed with it:
    the database holds it (``db.derived``); a table here kept every ":memory:" one alive."""
    model = db.derived.get("cost_model")
    if model is None:
        model = db.derived["cost_model"] = CostModel(db, {})
    for kind in kinds:
        if kind not in model.hardware:
            model.hardware[kind] = _hardware.current(kind)
    model.refresh()
    return model


def debug_level() -> int:
    """``TG_DEBUG``: unset, "" or "0" is 0; "2" or more is 2 (check every pass); any other
    value is 1 (time every pass; the tg command also shows tracebacks)."""
    value = os.environ.get("TG_DEBUG", "")
    if value in ("", "0"):
        return 0
    return 2 if value.isdigit() and int(value) >= 2 else 1


# What a pass hands on: (its type, its size as TG_DEBUG=1 prints it, its check for TG_DEBUG=2)
PASS_RESULTS: tuple[tuple[type | tuple[type, ...], Callable, Callable], ...] = (
    # specialize, simplify, recompose, sink: the graph's outputs
    ((list, tuple), lambda g: f"{len(nodes(list(g)))} nodes", lint_graph),
    # plan: the steps, aliases and leaves
    (Plan, lambda p: f"{len(p.steps)} steps", lint_plan),
    # memory plan: placements and arena offsets
    (MemoryPlan, lambda m: f"{len(m.liveness.buffers)} buffers", lint_memory),
    # lower: the program record
    (Program, lambda p: f"{len(p.prelude) + len(p.instructions)} instructions", lint_program),
    # program: the executable built on it
    (Executable, lambda e: f"{len(e.prelude) + len(e.instructions)} instructions",
     lambda e: lint_program(e.program)),
)


def run_pass(name: str, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)``, the pass called ``name``. Under ``TG_DEBUG=1`` it prints the
    pass's name, the size of what it handed on and its time to stderr; under ``TG_DEBUG=2`` it
    also checks that result (``PASS_RESULTS``) and raises ``PassError`` naming the pass when it
    is broken, so a bug fails in the pass that made it, not as a wrong result passes later."""
    level = debug_level()
    if not level:
        return fn(*args, **kwargs)
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    seconds = time.perf_counter() - start
    size, check = next((size, check) for kind, size, check in PASS_RESULTS
                       if isinstance(result, kind))
    print(f"tg pass {name:<12} {size(result):>17} {format_seconds(seconds):>10}",
          file=sys.stderr)
    if level >= 2:
        problems = check(result)
        if problems:
            more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
            raise PassError(f"TG_DEBUG=2: the {name} pass handed on a broken "
                            f"{type(result).__name__}: {problems[0]}{more}. This is a bug in "
                            f"the {name} pass: report it with the graph (tg.save) and this "
                            "message")
    return result


class Pipeline:
    """What a compile fixed (device, tolerance, database, profiling, backends, a lock file)
    and its passes: ``build(dims)`` runs them for one binding of the dims."""

    def __init__(self, outputs: list[Node], device, tolerance, db, profile: str,
                 backends: Sequence[str] | None, decisions: Sequence[str] | None = None,
                 bounds: Mapping | None = None, plan_file=None, generate: bool = True,
                 results: str = "host"):
        self.outputs = outputs
        self.generate = bool(generate)
        self.bounds = as_symbols(bounds or {})
        self.device = as_device(device)
        self.kinds = tuple(dict.fromkeys((self.device.kind, "cpu")))
        if results not in OUTPUTS:
            raise ArgumentError(f"outputs must be one of {OUTPUTS} (where results come back: "
                                f"numpy arrays on the host, or tensors left on the device), "
                                f"got {results!r}")
        # the device kind the planner delivers outputs on: the host's numpy arrays, or the
        # target device's memory (torch tensors on a GPU, no copy to the host)
        self.output_kind = self.device.kind if results == "device" else "cpu"
        self.tolerance = resolve_tolerance(tolerance, outputs)
        if profile not in PROFILE_MODES:
            raise ArgumentError(f"profile must be one of {PROFILE_MODES}, got {profile!r}")
        self.profile = profile
        self.db = open_db(db)
        self.backends = None if backends is None else _known_backends(backends)
        self.decisions = None if decisions is None else tuple(decisions)
        self.plan_file = plan_file  # where ``decisions`` came from, for errors

    def build(self, dims: Mapping, stats: dict, symbolic: bool = False,
              fits: bool = True) -> Executable:
        """The passes, top to bottom, for one binding: ``dims`` are the call's values or, with
        ``symbolic``, the bounds a graph is planned for with its dims kept (the result runs
        every call with dims up to them). ``fits``: raise OutOfMemory when the program does
        not fit the device (before anything runs)."""
        dims = as_symbols(dims)
        stats.setdefault(SEARCHES[fuse_siblings], 0)  # (prog.stats names the other counters)
        if not symbolic:
            self._check_bounds(dims)
        if debug_level():
            shown = ", ".join(f"{k}={v}" for k, v in dims.items()) or "no dims"
            print(f"tg compile: {len(self.outputs)} output(s); {shown}"
                  + (" (bounds: symbolic dims kept)" if symbolic else ""), file=sys.stderr)
        graph = prepare(self.outputs, {} if symbolic else dims)  # specialize ... sink
        with self.sharing():  # a profile's generated builds verified once per database
            plan = run_pass("plan", self._plan_forms, graph, dims if symbolic else None, stats)
        at = plan.at(dims) if symbolic else plan  # concrete shapes, steps in the same order
        memory = run_pass("memory plan", plan_memory, at, symbolic=plan)  # static: on plan
        if fits:
            check_fits(memory, self.devices())
        program = run_pass("lower", lower, plan, memory, at)
        stats["plans"] += 1
        return run_pass("program", Executable, program, {self.device.kind: self.device.name})

    def sharing(self) -> contextlib.AbstractContextManager:
        """With profile="missing", the profiling and the generated kernels this compile's
        plan builds go through the verification outcomes its database's profilers share
        (``profiler/shared_verify``); only for this compile, never a later one's."""
        if self.profile != "missing":
            return contextlib.nullcontext()
        from tensor_graphs.profiler import shared_verify

        return shared_verify.sharing(self.db, cost_model(self.db, self.kinds).hardware)

    def devices(self) -> dict[str, Device]:
        """The device each kind of the plan means: the target (with the capacity given), and
        the host for values a GPU plan keeps there."""
        return {"cpu": self.device if self.device.kind == "cpu" else Device("cpu"),
                self.device.kind: self.device}

    def named(self, totals: Mapping[str, int]) -> dict[str, int]:
        """Bytes per device kind as bytes per device name ("cuda" -> "cuda:0")."""
        names = {kind: d.name for kind, d in self.devices().items()}
        return {names.get(kind, kind): n for kind, n in totals.items()}

    def planner(self, prepared: list[Node], blocks: bool = True,
                dims: Mapping | None = None, refused: frozenset[str] = frozenset()) -> Planner:
        """A planner for ``prepared``; ``dims`` are the values a symbolic graph is costed at;
        ``refused``: generated kernels it may not offer."""
        return Planner(prepared, target=self.device.kind, cost=cost_model(self.db, self.kinds),
                       tolerance=self.tolerance, backends=self.backends, blocks=blocks,
                       dims=dims, generate=self.generate, refused=refused,
                       output_device=self.output_kind, progress=True)

    def _plan_forms(self, prepared: list[Node], costed_at: Mapping | None, stats: dict
                    ) -> Plan:
        """``prepared`` planned as it is and with its sibling products fused
        (``rewrite/siblings``: one GEMM over concatenated weights, read back as slices); the
        plan predicted faster runs, the fused one on a tie. Fusing can lose (a sibling's own
        epilogue, a reader copying its slice), so the measured costs decide. A lock file
        replays on the form whose decisions it holds. Each form's searches have their own
        counter (``SEARCHES``): ``planner_runs`` the graph's, ``sibling_runs`` the fused
        form's."""
        if not sibling_groups(prepared):  # (TG_DEBUG lists the pass only where it acts)
            return self._plan(prepared, costed_at, stats)
        fused = run_pass("siblings", fuse_siblings, prepared)
        if self.profile == "missing" and self.decisions is None:
            self._profile_forms(prepared, fused, costed_at, stats)
        if self.decisions is not None:
            try:
                return self._plan(fused, costed_at, stats, fuse_siblings)
            except PlanFileError:
                return self._plan(prepared, costed_at, stats)
        plain = self._plan(prepared, costed_at, stats)
        joined = self._plan(fused, costed_at, stats, fuse_siblings)
        return joined if joined.cost <= plain.cost else plain

    def _profile_forms(self, prepared: list[Node], fused: list[Node],
                       costed_at: Mapping | None, stats: dict) -> None:
        """What both forms lack, measured in one pass with each group's fused and separate
        products side by side (``side_by_side``): measured apart, a burst of load during one
        form's profiling decided between them."""
        from tensor_graphs.profiler.missing import profile_missing

        if costed_at is not None:  # a symbolic graph is measured at the bounds
            prepared = prepare(self.outputs, costed_at)
            fused = fuse_siblings(prepared)
        both = side_by_side(prepared) + list(prepared) + list(fused)
        everything = self.planner(both, blocks=False)
        everything.solve()
        stats["measured"] += profile_missing(everything, self.db)

    def _plan(self, prepared: list[Node], costed_at: Mapping | None, stats: dict,
              form: Callable | None = None) -> Plan:
        """Replay a lock file or a cached plan, else (after measuring what is missing, with
        profile="missing") search; then build the generated kernels the plan chose
        (``planner/realize``): one that fails its checks or is less accurate than the
        tolerance is refused and the plan is made again without it. ``costed_at``: the bounds
        a symbolic graph is costed at; ``form``: the rewrite that made ``prepared`` from the
        graph passes' result (profiling a symbolic graph prepares it concretely again)."""
        refused: dict[str, str] = {}
        while True:
            plan = self._choose(prepared, costed_at, stats, frozenset(refused), form)
            plan, more = realize_plan(plan)
            if not more:
                return plan
            if self.decisions is not None:
                from tensor_graphs.planner.lockfile import FIX

                name, why = next(iter(more.items()))
                raise PlanFileError(f"plan file {self.plan_file} chooses the generated kernel "
                                    f"{name}, which is refused here: {why}; it is not "
                                    f"re-planned ({FIX})")
            refused.update(more)
            stats["generated_refused"] = stats.get("generated_refused", 0) + len(more)

    def _choose(self, prepared: list[Node], costed_at: Mapping | None, stats: dict,
                refused: frozenset[str], form: Callable | None = None) -> Plan:
        def key() -> tuple:
            return cache.key(prepared, self.device.name, self.tolerance, self.backends, self.db,
                             costed_at) + (self.generate, refused, self.output_kind)

        planner = self.planner(prepared, dims=costed_at, refused=refused)
        found = self.decisions or cache.get(key())
        plan = None
        if found is not None:
            try:
                plan = planner.replay(found)
            except PlanFileError as exc:  # refused, never re-planned: see planner/lockfile
                if self.decisions is not None:
                    from tensor_graphs.planner.lockfile import FIX

                    raise PlanFileError(f"plan file {self.plan_file} cannot be replayed as "
                                        f"saved: {exc}; it is refused, not re-planned ({FIX})"
                                        ) from None
                # the cache's plan chose a generated kernel refused since (realize): plan again
                cache.drop(key())
                planner = self.planner(prepared, dims=costed_at, refused=refused)
            else:
                stats["replayed" if self.decisions else "plan_cache_hits"] += 1
        if plan is None:
            if self.profile == "missing":
                from tensor_graphs.profiler.missing import profile_missing

                concrete = prepared if costed_at is None else prepare(self.outputs, costed_at)
                if costed_at is not None and form is not None:
                    concrete = form(concrete)
                everything = self.planner(concrete, blocks=False, refused=refused)
                everything.solve()  # every option it sees
                stats["measured"] += profile_missing(everything, self.db)
                planner = self.planner(prepared, dims=costed_at, refused=refused)
            plan = planner.plan()
            stats[SEARCHES[form]] += 1
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
                             "for; compile again with larger bounds= (tg.compile and "
                             "tg.from_torch take it; or a larger max= in torch.export.Dim)")


def _known_backends(backends: Sequence[str]) -> tuple[str, ...]:
    """``backends`` as a tuple, each a backend kernels are written for: a device's name
    (``backends=["cuda"]``) ended in a NoPathError that blamed the graph."""
    from tensor_graphs.kernels.registry import BACKENDS

    if isinstance(backends, str):
        backends = (backends,)
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise ArgumentError(f"unknown backend(s) {unknown}: the backends are {list(BACKENDS)} "
                            "(a device is chosen with device=, e.g. device='cuda')")
    return tuple(backends)


def prepare(outputs: Sequence[Node], dims: Mapping) -> list[Node]:
    """The graph passes: the graph the planner sees for ``dims`` (none: symbolic dims kept).
    Leaves keep their names, so feeds still match."""
    graph = run_pass("specialize", specialize, outputs, dims)
    graph = run_pass("simplify", simplify, graph)
    graph = run_pass("recompose", recompose, graph)
    return list(run_pass("sink", sink_reshapes, graph))


def resolve_tolerance(tolerance, outputs: Sequence[Node]) -> float:
    """``tolerance`` checked, or where it is None the default for the precision of the
    graph's results: ``DEFAULT_TOLERANCE``, or where every float result is float16 or bfloat16
    (a half-precision model) that dtype's rounding (``LOW_PRECISION_ROUNDING``), as torch's own
    test tolerances grow with the dtype. A half-precision step cannot come closer to the
    float64 reference than its result's rounding, so at 1e-5 a float16 model had no path at
    all. A float32 result keeps 1e-5 for the whole graph: half-precision arithmetic inside a
    float32 model is refused, naming the op and the tolerance it needs."""
    if tolerance is None:
        floats = [o.dtype.name for o in outputs if o.dtype.is_float]
        return min((max(DEFAULT_TOLERANCE, LOW_PRECISION_ROUNDING.get(d, 0.0)) for d in floats),
                   default=DEFAULT_TOLERANCE)
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


def compile(graph, device="cpu", tolerance: float | None = None,  # noqa: A001
            db: Database | str | None = None, profile: str = "never",
            bounds: Mapping[str, int] | None = None, plan: str | None = None,
            backends: Sequence[str] | None = None, generate: bool = True,
            outputs: str = "host", cuda_graphs: bool = True) -> CompiledGraph:
    """Plan ``graph`` for ``device`` and return a program that runs it.

    ``device``: "cpu", "cuda" / "cuda:N" or a ``tg.Device`` (its capacity is what the program
    may take: ``OutOfMemory`` before anything runs). On a GPU, weights and kept states live on
    it (``bind`` moves them there once; ``bind_safetensors`` loads them there), each step runs
    where the planner finds it fastest, values cross through copy steps, and inputs may be
    numpy arrays or torch tensors already on the GPU (never sent through the host).

    - ``tolerance``: the largest norm-wise relative error any step may add (see planner/plan);
      None: 1e-5, or where every float result is float16 or bfloat16, that dtype's
      rounding (2**-10, 2**-7);
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
    - ``backends``: restrict kernels to these backends (e.g. ``("numpy",)``);
    - ``generate``: also offer kernels generated for regions of the graph (fused elementwise
      loops in C: ``kernels/generated``), compiled and verified only when a plan chooses them;
    - ``outputs``: "host" returns numpy arrays; "device" leaves results where the device
      holds them (torch tensors on a GPU: no copy to the host; the same as "host" on the cpu);
    - ``cuda_graphs``: a GPU program's steps between its input and result copies are captured
      as a CUDA graph on a dims' second call and replayed after (no per-step launch cost);
      False keeps the Python loop, as ``prog.cuda_graphs = False`` does later. No effect on
      the cpu.
    """
    if not isinstance(cuda_graphs, bool):
        raise ArgumentError(f"tg.compile(cuda_graphs={cuda_graphs!r}): pass True (capture a "
                            "GPU program's steps as CUDA graphs) or False (the Python loop)")
    bounds = check_dims(bounds, "tg.compile(bounds=...)") or None
    outs, single = _outputs(graph)
    decisions = None
    if plan is not None:
        from tensor_graphs.planner.lockfile import load

        decisions = load(plan, outs, device, resolve_tolerance(tolerance, outs))
    pipeline = Pipeline(outs, device, tolerance, db, profile, backends, decisions, bounds,
                        plan_file=plan, generate=generate, results=outputs)
    prog = CompiledGraph(outs, single, pipeline)
    prog.cuda_graphs = cuda_graphs
    free = symbols(outs)
    dims = as_symbols(bounds or {})
    unknown = sorted(str(s) for s in dims if s not in free)
    if unknown:
        raise ArgumentError(f"bounds name dims {unknown} that the graph does not use; its "
                            f"dims are {sorted(map(str, free)) or 'none'}")
    if free and free <= set(dims):  # one program for every call with dims up to the bounds
        prog.adopt(pipeline.build(dims, prog.stats, symbolic=True))
    elif not free:
        prog.adopt(pipeline.build({}, prog.stats), {})
    return prog  # symbolic dims without bounds: built on each first call with new dims


# tg.compile's keyword options, read once from its signature (so a stand-in a test puts in
# ``compiler.compile`` changes nothing): the one list of them (``compile_options``)
_OPTIONS = tuple(list(inspect.signature(compile).parameters)[1:])


def compile_options(*own: str) -> tuple[str, ...]:
    """The options of ``tg.compile`` a caller passes on to it, less ``own``: those the caller
    sets itself (``tg.generate``'s bounds, ``from_torch``'s device). What a caller that takes
    ``**compile_options`` checks them against, so an option compile gains is taken at once
    and an unknown one is refused before any work, naming those accepted."""
    return tuple(name for name in _OPTIONS if name not in own)


def refuse_unknown_options(where: str, options: Iterable[str], own: Sequence[str],
                           hints: Mapping[str, str] | None = None,
                           sets: Sequence[str] = ()) -> None:
    """The one refusal of an option that ``where`` (an importer, the Trainer) neither takes
    (``own``) nor passes on to ``tg.compile`` (``compile_options``: all but ``own`` and
    ``sets``, those compile options it sets itself), raised before any work: passed on, a
    slip reached compile after the whole import as a bare TypeError naming neither the
    caller nor what it takes. Each unknown name gets the caller's hint (``hints``), else the
    closest option's "did you mean"; then what the caller takes."""
    passed_on = compile_options(*own, *sets)
    unknown = [name for name in options if name not in own and name not in passed_on]
    if not unknown:
        return
    lines = []
    for name in unknown:
        hint = (hints or {}).get(name)
        if hint is None and (close := difflib.get_close_matches(name, [*own, *passed_on], n=1)):
            hint = f"did you mean {close[0]}=?"
        if hint is not None:
            lines.append(f"\n  {name}: {hint}")
    raise ArgumentError(f"{where}: unknown option(s) {', '.join(unknown)}{''.join(lines)}\n"
                        f"{where} takes {', '.join(own)}; and passes on to tg.compile "
                        f"{', '.join(passed_on)}")


def _planner_for(graph, device, tolerance, db, dims, backends, generate,
                 where: str) -> Planner:
    outs, _ = _outputs(graph)
    pipeline = Pipeline(outs, device, tolerance, db, "never", backends, generate=generate)
    free = symbols(outs)
    values = as_symbols(check_dims(dims, where, "its size", least=0))
    missing = sorted(str(s) for s in free - set(values))
    if missing:
        raise ArgumentError(f"the graph has symbolic dims {missing}: give their values, e.g. "
                            f"{missing[0]}=128")
    return pipeline.planner(prepare(outs, values), blocks=False)


def estimate_memory(graph, device="cpu", tolerance: float | None = None, db=None,
                    backends: Sequence[str] | None = None, **dims) -> dict[str, int]:
    """Bytes per device name (arena + weights + state) the graph's plan needs for these dims,
    from the plan alone: nothing runs and nothing is allocated ({"cpu": ..., "cuda:0": ...}
    for a GPU plan, as ``prog.memory()``). A dim may be 0, as a compiled call's may."""
    outs, _ = _outputs(graph)
    pipeline = Pipeline(outs, device, tolerance, db, "never", backends)
    values = as_symbols(check_dims(dims, "tg.estimate_memory", "its size", least=0))
    missing = sorted(str(s) for s in symbols(outs) - set(values))
    if missing:
        raise ArgumentError(f"the graph has symbolic dims {missing}: give their values, e.g. "
                            f"{missing[0]}=128")
    counters = {k: 0 for k in ("planner_runs", "plan_cache_hits", "replayed", "measured",
                               "slots", "options", "estimates", "blocks", "blocks_planned",
                               "block_cache_hits", "plans")}
    # as tg.compile(..., bounds=dims) builds it, without the check that it fits the device
    exe = pipeline.build(values, counters, symbolic=bool(symbols(outs)), fits=False)
    return pipeline.named(exe.memory.totals())


def paths(graph, device="cpu", tolerance: float = 1.0, db=None,
          backends: Sequence[str] | None = None, generate: bool = True,
          **dims) -> Iterator[Plan]:
    """Every valid path for ``graph`` lazily (each a ``Plan``: ``.cost``, ``.kernels``,
    ``.steps``), the cheapest option first at every decision. ``tolerance`` defaults to 1:
    every kernel counts. Paths through generated kernels (``generate``) name them before they
    are built: ``step.kernel`` is a ``kernels.generated.Candidate`` there. A dim may be 0,
    as a compiled call's may."""
    return _planner_for(graph, device, tolerance, db, dims, backends, generate,
                        "tg.paths").paths()


def count_paths(graph, device="cpu", tolerance: float = 1.0, db=None,
                backends: Sequence[str] | None = None, generate: bool = True, **dims) -> int:
    """How many paths ``tg.paths`` yields, counted without enumerating them."""
    return _planner_for(graph, device, tolerance, db, dims, backends, generate,
                        "tg.count_paths").count()
