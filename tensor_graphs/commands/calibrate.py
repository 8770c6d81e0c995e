"""This machine's peak rates and the runtime's dispatch per step, stored in the database for
the cost model's roofline estimates (``db/cost.py``, "estimated"). The dispatch is timed on a
compiled program, so calibration sits above the compiler, with ``tg profile`` that runs it."""

from __future__ import annotations

import math
import time

import numpy as np

from tensor_graphs.compiler import compile as compile_graph
from tensor_graphs.ir import builder
from tensor_graphs.kernels.registry import get


def dispatch_overhead(steps: int = 64, repeats: int = 7) -> float:
    """Seconds the runtime adds per step: a chain of ``steps`` one-element products run as a
    compiled program, minus the kernel calls themselves, per step (median of ``repeats``)."""
    x = y = builder.input("x", (1,))
    for _ in range(steps):
        y = y * x  # nothing for simplify to fold
    prog = compile_graph(y, db=":memory:", backends=("numpy",))
    kernel = get(prog.plan.steps[0].kernel.name).fn
    a = np.ones(1, np.float32)
    per_step = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        prog(x=a)
        t1 = time.perf_counter()
        for _ in range(steps):
            kernel(a, a)
        t2 = time.perf_counter()
        per_step.append(max((t1 - t0) - (t2 - t1), 0.0) / steps)
    return float(np.median(per_step))


def calibrate(db, hardware, seconds: float = 0.3) -> dict:
    """Measure this machine's peak rates (float32 matrix product flops, copy bandwidth) and the
    runtime's dispatch cost per step, and store them in the database for ``hardware``; returns
    the rates."""
    rng = np.random.default_rng(0)
    n = 512
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    src = np.ones(8 << 20, dtype=np.float32)  # 32 MB: past the caches
    dst = np.empty_like(src)
    best_mm, best_copy = math.inf, math.inf
    deadline = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        a @ b
        t1 = time.perf_counter()
        np.copyto(dst, src)
        t2 = time.perf_counter()
        best_mm, best_copy = min(best_mm, t1 - t0), min(best_copy, t2 - t1)
        if t2 > deadline:
            break
    rates = {"flops": 2.0 * n ** 3 / best_mm, "bytes": 2.0 * src.nbytes / best_copy,
             "dispatch": dispatch_overhead()}
    if db is not None and not db.readonly:
        db.set_calibration(hardware, rates)
    return rates
