"""``prog.trace``: real calls as a Chrome/Perfetto trace, one slice per step per call.

A plan's predicted times come from kernels measured alone; a trace shows where a real call's
time went, in the viewers people already use (chrome://tracing, ui.perfetto.dev: open the
file). The file is the Trace Event Format's JSON object: ``traceEvents`` holds one "X"
(complete) event per call on the calling thread and, nested in it, one per step on the thread
that ran the step, ``ts``/``dur`` in microseconds from the first traced call; ``args`` name the
kernel, its input shapes, result dtype, backend and device.

The native loop (``runtime/native.py``) runs every C step of a call in one foreign call whose
C runner has no per-step clock, so traced calls run on the Python loop (as
``runtime/steps.py`` times them) and the trace's ``otherData.loop`` says so, with the loop
the program uses outside tracing. Gaps between step slices are the Python loop's dispatch:
outside tracing the native loop spends nanoseconds there. On a GPU each step synchronizes
before and after, so a slice is that kernel's own time, not the overlapped call's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import threading
import time
from collections.abc import Mapping
from typing import NamedTuple

from tensor_graphs.errors import ArgumentError
from tensor_graphs.files import atomic_write
from tensor_graphs.ir.shapes import format_shape, is_static
from tensor_graphs.runtime.steps import _gpu_sync

TRACED_LOOP = ("python loop: traced calls run each step from Python so each has a clock "
               "(the native loop makes all C calls in one foreign call, with no per-step "
               "hook); gaps between slices are the Python loop's dispatch")


class StepRun(NamedTuple):
    """One step of one traced call."""

    run: int  # which traced call (0-based)
    index: int  # the instruction's position in the program's per-call list
    start: float  # perf_counter seconds
    seconds: float
    thread: int  # native thread id of the thread that ran it
    input_shapes: tuple
    dtype: str


@dataclasses.dataclass
class Timing:
    """What ``timed_runs`` measured: per call (start, seconds, thread) and per step a
    ``StepRun``, with the instructions (kernel names, devices) they ran."""

    calls: list[tuple[float, float, int]]
    steps: list[StepRun]
    instructions: list
    loop: str  # the loop the program ran before tracing (what it uses outside a trace)

    def medians(self) -> dict[int, float]:
        """Median seconds per instruction index over the traced calls."""
        found: dict[int, list[float]] = {}
        for s in self.steps:
            found.setdefault(s.index, []).append(s.seconds)
        return {i: statistics.median(v) for i, v in found.items()}


def _program(prog):
    """The CompiledGraph behind ``prog`` (``tg.from_torch``'s result holds it as ``program``)."""
    return getattr(prog, "program", None) or prog


def timed_runs(prog, feeds: Mapping | None, runs: int) -> Timing:
    """Call ``prog(**feeds)`` once to plan and warm up, then ``runs`` times on the Python loop
    with a clock around every step."""
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ArgumentError(f"runs={runs!r}: give a whole number of traced calls, 1 or more")
    program = _program(prog)
    feeds = dict(feeds or {})
    program(**feeds)
    exe = program._last  # noqa: SLF001 - the executable the call ran
    loop = exe.native.last
    original = exe.instructions
    steps: list[StepRun] = []
    current = [0]

    def timed(n: int, ins):
        fn, sync = ins.fn, _gpu_sync(ins)
        dtype = str(getattr(ins.dtype, "name", ins.dtype))

        def run(*args, **kw):
            sync()
            start = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                sync()
                seconds = time.perf_counter() - start
                shapes = tuple(tuple(int(d) for d in getattr(a, "shape", ())) for a in args)
                steps.append(StepRun(current[0], n, start, seconds,
                                     threading.get_native_id(), shapes, dtype))
        return dataclasses.replace(ins, fn=run)

    exe.instructions = [timed(n, ins) for n, ins in enumerate(original)]
    native, graphs = program.native, program.cuda_graphs
    program.native = program.cuda_graphs = False  # (neither has per-step hooks)
    calls = []
    try:
        for r in range(runs):
            current[0] = r
            start = time.perf_counter()
            program(**feeds)
            calls.append((start, time.perf_counter() - start, threading.get_native_id()))
    finally:
        exe.instructions, program.native, program.cuda_graphs = original, native, graphs
    return Timing(calls, steps, original, loop)


def trace_events(timing: Timing, device_name=lambda kind: kind) -> dict:
    """The Trace Event Format object of ``timing`` (see the module doc)."""
    pid = os.getpid()
    origin = min((c[0] for c in timing.calls), default=0.0)

    def us(t: float) -> float:
        return round(t * 1e6, 3)

    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                           "args": {"name": "tensor_graphs program"}}]
    threads = sorted({c[2] for c in timing.calls} | {s.thread for s in timing.steps})
    main = timing.calls[0][2] if timing.calls else None
    for tid in threads:
        name = "caller" if tid == main else f"thread {tid}"
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": name}})
    for run, (start, seconds, tid) in enumerate(timing.calls):
        events.append({"name": "call", "cat": "call", "ph": "X", "pid": pid, "tid": tid,
                       "ts": us(start - origin), "dur": us(seconds),
                       "args": {"run": run, "steps": sum(s.run == run for s in timing.steps)}})
    for s in timing.steps:
        ins = timing.instructions[s.index]
        kernel = ins.kernel
        events.append({"name": ins.name, "cat": getattr(kernel, "backend", "step"), "ph": "X",
                       "pid": pid, "tid": s.thread, "ts": us(s.start - origin),
                       "dur": us(s.seconds),
                       "args": {"kernel": ins.name, "step": s.index, "run": s.run,
                                **_shapes(ins, s.input_shapes),
                                "dtype": s.dtype,
                                "backend": getattr(kernel, "backend", ""),
                                "device": device_name(ins.device)}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"tool": "tensor_graphs prog.trace", "runs": len(timing.calls),
                          "steps_per_run": len(timing.instructions), "loop": TRACED_LOOP,
                          "loop_outside_trace": timing.loop}}


def _shapes(ins, actual: tuple) -> dict:
    """The step's input shapes as the plan has them; a kernel that reads a prepared argument
    (a GEMM's packed weight) gets the shapes it was called with too."""
    planned = [sh if is_static(sh) else got for sh, got in
               zip(tuple(ins.input_shapes) or actual, actual)]
    found = {"input_shapes": [format_shape(sh) for sh in planned]}
    if [tuple(sh) for sh in planned] != [tuple(sh) for sh in actual]:
        found["argument_shapes"] = [format_shape(sh) for sh in actual]
    return found


def write_trace(prog, path, feeds: Mapping | None = None, runs: int = 3) -> dict:
    """Trace ``runs`` real calls of ``prog`` into ``path`` (JSON, written whole or not at
    all) and return the trace object."""
    program = _program(prog)
    timing = timed_runs(program, feeds, runs)
    trace = trace_events(timing, program.device_name)
    with atomic_write(path) as f:
        json.dump(trace, f)
    return trace
