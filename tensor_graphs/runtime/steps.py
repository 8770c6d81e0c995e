"""Per-instruction times of a compiled program: where a call's time goes, kernel by kernel.

The database times each kernel alone, in a loop on hot buffers; inside a program a kernel
reads what the one before it wrote, so its time there can differ several-fold (a bias add
measured 0.028 ms alone and ran in ~0.2 ms in MiniLM). ``step_times(prog, feeds)`` runs the
program's Python loop with a timer around every instruction and returns the medians, grouped
by kernel and input shapes, largest total first. The native loop and CUDA graphs are off while
it runs (they have no per-step hooks), so the sum is the Python loop's; outside the timed
kernels that adds a few microseconds an instruction. On a GPU each timed instruction
synchronizes before and after (kernels run asynchronously), so the times are each kernel's
own, not the overlapped call's.

    from tensor_graphs.runtime.steps import format_step_times, step_times
    print(format_step_times(step_times(prog, {"x": x}, repeats=7)))
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Mapping
from typing import NamedTuple


class StepTime(NamedTuple):
    kernel: str
    input_shapes: tuple
    count: int  # instructions with this kernel and these input shapes
    seconds: float  # sum of their median times in one call


def _timed(ins, samples: list):
    fn = ins.fn
    sync = _gpu_sync(ins)

    def run(*args, **kw):
        sync()  # a GPU runs kernels asynchronously: time from an idle GPU to a done kernel
        start = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            sync()
            samples.append(time.perf_counter() - start)
    return dataclasses.replace(ins, fn=run)


def _gpu_sync(ins):
    """torch.cuda.synchronize for an instruction that touches a real GPU, else nothing."""
    from tensor_graphs.devices import simulated_cuda

    if "cuda" not in (ins.device, ins.reads) or simulated_cuda() is not None:
        return lambda: None
    import torch

    return torch.cuda.synchronize


def step_times(prog, feeds: Mapping, repeats: int = 5, pause: float = 0.0) -> list[StepTime]:
    """Run ``prog(**feeds)`` once to plan and warm up, then ``repeats`` more times with every
    instruction timed; per (kernel, input shapes), the sum over its instructions of each
    one's median. ``prog``: a ``CompiledGraph`` (``tg.from_torch``'s result has it as
    ``.program``). ``pause``: seconds of sleep before each timed call (thread pools idle, as
    between calls of a real workload)."""
    program = getattr(prog, "program", None) or prog
    program(**feeds)
    exe = program._last  # noqa: SLF001 - the executable the call ran
    original, native, graphs = exe.instructions, program.native, program.cuda_graphs
    samples: list[list[float]] = [[] for _ in original]
    exe.instructions = [_timed(ins, s) for ins, s in zip(original, samples)]
    program.native = program.cuda_graphs = False  # (a graph replays no per-step hooks)
    try:
        for _ in range(repeats):
            if pause:
                time.sleep(pause)
            program(**feeds)
    finally:
        exe.instructions, program.native, program.cuda_graphs = original, native, graphs
    return _grouped(original, samples)


def _grouped(instructions, samples) -> list[StepTime]:
    totals: dict[tuple, list] = {}
    for ins, s in zip(instructions, samples):
        if not s:
            continue
        key = (ins.name, tuple(tuple(str(d) for d in shape) for shape in ins.input_shapes))
        entry = totals.setdefault(key, [0, 0.0])
        entry[0] += 1
        entry[1] += statistics.median(s)
    rows = [StepTime(k[0], k[1], n, t) for k, (n, t) in totals.items()]
    return sorted(rows, key=lambda r: -r.seconds)


def format_step_times(rows: list[StepTime], limit: int | None = 25) -> str:
    """A table: total ms, count, ms each, kernel, input shapes; then the sum."""
    total = sum(r.seconds for r in rows)
    lines = [f"{'total ms':>9} {'n':>4} {'ms each':>8}  kernel / input shapes"]
    for r in rows[:limit]:
        shapes = ", ".join("(" + ", ".join(s) + ")" for s in r.input_shapes)
        lines.append(f"{r.seconds * 1e3:9.3f} {r.count:4d} {r.seconds / r.count * 1e3:8.3f}"
                     f"  {r.kernel} {shapes}")
    lines.append(f"{total * 1e3:9.3f} in {sum(r.count for r in rows)} instructions")
    return "\n".join(lines)
