"""``profile="missing"``: measure every kernel call a plan considered that has no row.

The planner has already listed every option of every slot it visited; the calls worth
measuring are its kernel options whose estimate is not a measurement on this hardware (one per
kernel and signature). The float64-reference kernels (numpy_exact_*) are measured only where a
slot has nothing else. Each kernel is verified (``tg.kernels.verify``) before its first
measurement; one that fails verification is recorded as a failure and never measured.

The calls go in the graph's order (a slot's options, and those of the slots next to it, side by
side) and are timed ``WINDOW`` at a time in interleaved rounds (``measure_together``), so a
fused kernel and the unfused steps it competes with are measured under the same load.
"""

from __future__ import annotations

from tensor_graphs.db.cost import is_exact_kernel
from tensor_graphs.db.store import Measurement
from tensor_graphs.planner.plan import KERNEL, Option
from tensor_graphs.planner.search import Planner
from tensor_graphs.profiler.measure import Call, measure_together
from tensor_graphs.profiler.progress import Progress

_verified: dict[str, str | None] = {}  # kernel name -> None when it passed, else the reason
WINDOW = 8  # calls timed together in interleaved rounds (their arrays are alive together)


def calls_to_measure(planner: Planner) -> list[Option]:
    """The planner's kernel options without a measurement, one per (kernel, signature), in the
    order of the slots (bottom-up: a node's options next to those of its inputs)."""
    found: dict[tuple[str, str], Option] = {}
    for options in planner._options.values():
        alternatives = [o for o in options if o.how == KERNEL]
        for o in alternatives:
            if o.estimate.source in ("measured", "free") or o.kernel.device != "cpu":
                continue
            if is_exact_kernel(o.kernel) and len(alternatives) > 1:
                continue
            found.setdefault((o.kernel.name, o.signature), o)
    return list(found.values())


def verified(kernel) -> str | None:
    """None when ``kernel`` passes verification (cached per process), else why not."""
    if kernel.name not in _verified:
        from tensor_graphs.kernels.verify import verify

        try:
            report = verify(kernel)
            _verified[kernel.name] = None if report.ok else report.summary()
        except Exception as exc:  # noqa: BLE001 - a broken kernel is recorded, not fatal
            _verified[kernel.name] = f"{type(exc).__name__}: {exc}"
    return _verified[kernel.name]


def call_of(o: Option) -> Call:
    args = tuple(n.node for n in o.needs)
    return Call(o.kernel, o.slot.node, args, dict(o.attrs), o.signature,
                o.features.flops, o.features.bytes)


def measure_options(options: list[Option]):
    """Verify each option's kernel (once per process), then measure the calls ``WINDOW`` at a
    time in interleaved rounds; yields (option, Measurement) per window, in order. A kernel
    that fails verification gives a failure row and is never timed."""
    nan = float("nan")
    for i in range(0, len(options), WINDOW):
        window = options[i:i + WINDOW]
        failures = {id(o): verified(o.kernel) for o in window}
        timed = [o for o in window if failures[id(o)] is None]
        rows = dict(zip(map(id, timed), measure_together([call_of(o) for o in timed])))
        yield [(o, rows.get(id(o)) or Measurement(
            o.kernel.name, o.kernel.source_hash, o.signature, 0, nan, nan, nan, None,
            f"verification failed: {failures[id(o)]}")) for o in window]


def profile_missing(planner: Planner, db, progress: bool = True) -> int:
    """Measure and record what the planner's options miss; returns how many rows were added."""
    if db.readonly:
        return 0
    todo = calls_to_measure(planner)
    bar = Progress(len(todo), "profiling") if progress else None
    added = 0
    for window in measure_options(todo):
        for o, m in window:
            db.record(m)
            added += 1
            if bar is not None:
                bar.step(o.kernel.name)
    if bar is not None:
        bar.close()
    return added
