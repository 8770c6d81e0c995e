"""``prog.trace``: real calls as a Chrome/Perfetto trace, one slice per step per call.

A plan's predicted times come from kernels measured alone; a trace shows where a real call's
time went, in the viewers people already use (chrome://tracing, ui.perfetto.dev: open the
file). The file is the Trace Event Format's JSON object: ``traceEvents`` holds one "X"
(complete) event per call on the calling thread and, nested in it, one per step on the thread
that ran the step, ``ts``/``dur`` in microseconds from the first traced call; ``args`` name the
kernel, its input shapes, result dtype, backend and device.

Where the program's calls run in the native loop (``runtime/native.py``: one foreign call
makes every C call of a call), the traced calls run there too, the runner walking its table
one step's C calls at a time with a clock around each (a ctypes call per step instead of one
per call: the gaps between slices); a step that makes no C call (a view) gets a slice of no
length. Elsewhere (a numpy step, a recording fitted over dims, a GPU program) traced calls
run on the Python loop with a clock around each kernel (as ``runtime/steps.py`` times them),
and the gaps are its dispatch. ``otherData.loop`` says which, and ``loop_outside_trace`` the
loop the program ran before. On a GPU each step synchronizes before and after, so a slice is
that kernel's own time, not the overlapped call's.
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

from tensor_graphs.errors import ArgumentError, TensorGraphsError
from tensor_graphs.files import atomic_write
from tensor_graphs.ir.shapes import format_shape, is_static, resolve
from tensor_graphs.runtime.steps import _gpu_sync

PYTHON_LOOP = ("python loop: each step timed from Python (the program does not run in the "
               "native loop here{why}); gaps between slices are the Python loop's dispatch")
NATIVE_LOOP = ("native loop, one foreign call per step while traced (untraced, the runner "
               "makes every C call of a call in one foreign call); gaps between slices are "
               "a ctypes call each")
WARMUPS = 3  # calls before tracing: plan, then the native loop records on the second


class StepRun(NamedTuple):
    """One step of one traced call."""

    run: int  # which traced call (0-based)
    index: int  # the instruction's position in the program's per-call list
    start: float  # perf_counter seconds
    seconds: float
    thread: int  # native thread id of the thread that ran it
    input_shapes: tuple | None  # the arguments' shapes where the Python loop saw them
    called: bool = True  # False: no kernel call (a view, or a state written in place)


@dataclasses.dataclass
class Timing:
    """What ``timed_runs`` measured: per call (start, seconds, thread) and per step a
    ``StepRun``, with the instructions (kernel names, devices) they ran."""

    calls: list[tuple[float, float, int]]
    steps: list[StepRun]
    instructions: list
    loop: str  # the loop the program ran before tracing (what it uses outside a trace)
    traced: str  # how the traced calls ran (PYTHON_LOOP or NATIVE_LOOP)
    dims: Mapping | None = None  # the dims the traced calls bound (symbol -> int)

    def medians(self) -> dict[int, float]:
        """Median seconds per instruction index over the traced calls."""
        found: dict[int, list[float]] = {}
        for s in self.steps:
            found.setdefault(s.index, []).append(s.seconds)
        return {i: statistics.median(v) for i, v in found.items()}


def _program(prog):
    """The CompiledGraph behind ``prog`` (``tg.from_torch``'s result holds it as ``program``)."""
    return getattr(prog, "program", None) or prog


def _python_timed(n: int, ins, sink):
    """``ins`` with a clock around its kernel (the Python loop calls it)."""
    fn, sync = ins.fn, _gpu_sync(ins)

    def run(*args, **kw):
        sync()
        start = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            sync()
            seconds = time.perf_counter() - start
            sink(n, start, seconds,
                 tuple(tuple(int(d) for d in getattr(a, "shape", ())) for a in args))
    return dataclasses.replace(ins, fn=run)


def _native_stepped(recording, sink):
    """A ``Recording.run`` that walks the table one instruction's calls at a time, timing each
    (the same runner over a slice of the table; the input relocations patched on the first)."""
    pieces: list[tuple[int, int, int]] = []  # (instruction, first record, records)
    for i, step in enumerate(recording.owner_steps):
        if pieces and pieces[-1][0] == step and pieces[-1][1] + pieces[-1][2] == i:
            pieces[-1] = (step, pieces[-1][1], pieces[-1][2] + 1)
        else:
            pieces.append((step, i, 1))
    table = recording.table.ctypes.data
    row = 8 * recording.stride
    patches, bases = recording.patches.ctypes.data, recording.bases.ctypes.data

    def run(inputs) -> int:
        for k, a in enumerate(inputs):
            recording.bases[k + 1] = a.__array_interface__["data"][0]
        npatches = recording.npatches
        for step, first, count in pieces:
            start = time.perf_counter()
            got = recording.run_fn(table + row * first, count, recording.stride, patches,
                                   npatches, 3, bases, None)
            sink(step, start, time.perf_counter() - start, None)
            if got:
                return first + got
            npatches = 0
        return 0
    return run


def _native_recordings(exe) -> list | str:
    """The recordings the native loop replays for ``exe``, or why its calls cannot be timed
    step by step there."""
    last = exe.native.last
    if not last.startswith("native loop"):
        return f": {last}" if last.startswith("python loop") else f" ({last})"
    if "fitted" in last:
        return ": its recording is fitted over dims, which is not split by step"
    found = [v[0] for v in exe.native.recordings.values() if isinstance(v, tuple)]
    if not found or any(len(getattr(r, "owner_steps", ())) != r.count for r in found):
        return ": its recording does not say which step made each C call"
    return found


def timed_runs(prog, feeds: Mapping | None, runs: int) -> Timing:
    """Call ``prog(**feeds)`` to plan and warm up (until the native loop replays, where it
    will and the program keeps no state that calls change), then ``runs`` times with a clock
    around every step: in the native loop where the calls run there, else on the Python
    loop."""
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ArgumentError(f"runs={runs!r}: give a whole number of traced calls, 1 or more")
    program = _program(prog)
    feeds = dict(feeds or {})
    program(**feeds)
    exe = program._last  # noqa: SLF001 - the executable the call ran
    for _ in range(WARMUPS - 1):
        last = exe.native.last
        if not program.native or exe.gpu or program._kept \
                or not last.startswith("python loop") \
                or not ("first call" in last or "recorded" in last or "prelude" in last):
            break
        program(**feeds)
        exe = program._last  # noqa: SLF001
    loop = exe.native.last
    native = _native_recordings(exe)
    original = exe.instructions
    steps: list[StepRun] = []
    current = [0]

    def sink(n: int, start: float, seconds: float, shapes) -> None:
        steps.append(StepRun(current[0], n, start, seconds, threading.get_native_id(), shapes))

    exe.instructions = [_python_timed(n, ins, sink) for n, ins in enumerate(original)]
    flags = program.native, program.cuda_graphs
    patched = native if isinstance(native, list) else []
    for recording in patched:
        recording.run = _native_stepped(recording, sink)
    if not patched:
        program.native = program.cuda_graphs = False  # (neither has per-step hooks)
    calls, seen = [], []
    run = exe.run

    def noting(arrays, dims, *args, **kw):  # the dims each call binds: shapes resolve at them
        seen.append(dims)
        return run(arrays, dims, *args, **kw)

    exe.run = noting
    try:
        for r in range(runs):
            current[0] = r
            start = time.perf_counter()
            program(**feeds)
            calls.append((start, time.perf_counter() - start, threading.get_native_id()))
    finally:
        exe.instructions = original
        del exe.run  # (the class's run again)
        program.native, program.cuda_graphs = flags
        for recording in patched:
            del recording.run  # (the class's run again)
    traced = NATIVE_LOOP if patched else PYTHON_LOOP.format(why=native)
    return Timing(calls, _with_uncalled(steps, calls, len(original)), original, loop, traced,
                  seen[-1] if seen else None)


def _with_uncalled(steps: list[StepRun], calls: list, count: int) -> list[StepRun]:
    """``steps`` plus a zero-length slice for each step of a call that called no kernel (a
    view in the native loop, a state written in place), where it falls in the order: so
    every call has one slice per step."""
    out: list[StepRun] = []
    for run, (start, _, thread) in enumerate(calls):
        mine = {s.index: s for s in steps if s.run == run}
        at = start
        for n in range(count):
            s = mine.get(n)
            if s is None:
                s = StepRun(run, n, at, 0.0, thread, None, False)
            out.append(s)
            at = s.start + s.seconds
    return out


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
                                **_shapes(ins, s.input_shapes, timing.dims),
                                "dtype": str(getattr(ins.dtype, "name", ins.dtype)),
                                **({} if s.called else {"note": "no kernel call (a view, "
                                                        "or a state written in place)"}),
                                "backend": getattr(kernel, "backend", ""),
                                "device": device_name(ins.device)}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"tool": "tensor_graphs prog.trace", "runs": len(timing.calls),
                          "steps_per_run": len(timing.instructions), "loop": timing.traced,
                          "loop_outside_trace": timing.loop}}


def _shapes(ins, actual: tuple | None, dims: Mapping | None) -> dict:
    """The step's input shapes as the plan has them, at the call's dims; a kernel that reads
    a prepared argument (a GEMM's packed weight) gets the shapes it was called with too (the
    Python loop sees them; the native loop sees no arrays)."""
    if actual is None:
        return {"input_shapes": [format_shape(_at(sh, dims)) for sh in ins.input_shapes]}
    planned = [sh if is_static(sh) else got for sh, got in
               zip(tuple(ins.input_shapes) or actual, actual)]
    found = {"input_shapes": [format_shape(sh) for sh in planned]}
    if [tuple(sh) for sh in planned] != [tuple(sh) for sh in actual]:
        found["argument_shapes"] = [format_shape(sh) for sh in actual]
    return found


def _at(shape: tuple, dims: Mapping | None) -> tuple:
    try:
        return resolve(tuple(shape), dims) if dims else tuple(shape)
    except TensorGraphsError:  # (a dim no call bound: shown symbolic)
        return tuple(shape)


def write_trace(prog, path, feeds: Mapping | None = None, runs: int = 3) -> dict:
    """Trace ``runs`` real calls of ``prog`` into ``path`` (JSON, written whole or not at
    all) and return the trace object."""
    program = _program(prog)
    timing = timed_runs(program, feeds, runs)
    trace = trace_events(timing, program.device_name)
    with atomic_write(path, what="trace file") as f:
        json.dump(trace, f)
    return trace
