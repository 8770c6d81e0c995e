"""This machine's peak rates and the runtime's dispatch per step, stored in the database for
the cost model's roofline estimates (``db/cost.py``, "estimated"). The dispatch is timed on a
compiled program, so calibration sits above the compiler, with ``tg profile`` that runs it.

A GPU (``calibrate_gpu``, when one is usable) gets its own rates under its own hardware key:
a float32 matrix product's flop rate, a device-to-device copy's bandwidth, the host<->GPU
link's bandwidth and latency, and a kernel's cost in a CUDA graph (a tiny one, replayed as a
program's graph replays its steps); each timed with the device synchronized before and after,
since a launch returns before its work is done. The simulated
GPU is calibrated the same way on small sizes: its rates are the CPU's (under its own key).
"""

from __future__ import annotations

import math
import time

import numpy as np

from tensor_graphs.compiler import compile as compile_graph
from tensor_graphs.devices import simulated_cuda, torch_device
from tensor_graphs.ir import builder
from tensor_graphs.kernels.registry import get
from tensor_graphs.profiler.bandwidth import read_bandwidth
from tensor_graphs.profiler.device import graphed


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
    """Measure this machine's peak rates (float32 matrix product flops, copy bandwidth, the
    read bandwidth its weights stream at: ``profiler/bandwidth.py``) and the runtime's dispatch
    cost per step, and store them in the database for ``hardware``; returns
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
             "dispatch": dispatch_overhead(), "read": read_bandwidth()}
    if db is not None and not db.readonly:
        db.set_calibration(hardware, rates)
    return rates


def calibrate_gpu(db, hardware, seconds: float = 0.5) -> dict:
    """Measure the GPU's rates (see the module doc) and store them in the database for
    ``hardware`` (its key: ``db.hardware.current("cuda")``); returns them: "flops", "bytes"
    (read plus written per second), "link" (host<->GPU bytes per second over a round trip),
    "link_latency" and "launch" (seconds), and on a real GPU "units" (its SMs). Needs torch
    with a usable GPU, or the simulated one."""
    import torch

    device = torch_device("cuda")
    simulated = simulated_cuda() is not None
    sync = (lambda: None) if simulated else torch.cuda.synchronize
    n = 512 if simulated else 4096  # 0.27 / 137 GFLOP: milliseconds on either
    moved = (8 << 20) if simulated else (256 << 20)  # bytes: past every cache
    over_link = (8 << 20) if simulated else (64 << 20)
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    src = torch.ones(moved // 4, device=device)
    dst = torch.empty_like(src)
    # host <-> GPU through the copy kernels (their staging buffer: kernels/staging.py) into
    # buffers made once, as a program runs them (out=: an arena place)
    to_gpu, to_host = get("copy_host_to_cuda").fn, get("copy_cuda_to_host").fn
    host = np.ones(over_link // 4, np.float32)
    host_out = np.zeros(over_link // 4, np.float32)
    on_gpu = torch.ones(over_link // 4, device=device)
    gpu_out = torch.empty_like(on_gpu)
    one = np.ones(1, np.float32)
    one_gpu = torch.zeros(1, device=device)
    tiny = torch.zeros(1, device=device)
    repeat = 50  # back-to-back calls per sample of a latency: what a program's steps pay

    def timed(fn) -> float:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0

    def many(fn):
        def run():
            for _ in range(repeat):
                fn()
        return run

    cases = {  # rate -> (the call, its work in flops or bytes; None: seconds per call)
        "flops": (lambda: torch.mm(a, b), 2.0 * n ** 3),
        "bytes": (lambda: dst.copy_(src), 2.0 * src.numel() * 4),
        "to_gpu": (lambda: to_gpu(host, "cuda", out=gpu_out), float(over_link)),
        "to_host": (lambda: to_host(on_gpu, out=host_out), float(over_link)),
        "link_latency": (many(lambda: to_gpu(one, "cuda", out=one_gpu)), None),
        # a kernel in a CUDA graph, as a GPU program's graph replays its steps (the profiler
        # times GPU kernels so: ``profiler/device.graphed``)
        "launch": (graphed(lambda: tiny.add_(1.0), repeat), None),
    }
    for fn, _ in cases.values():  # warm-up: cuBLAS handles, the caching allocator
        timed(fn)
    best = {name: math.inf for name in cases}
    deadline = time.perf_counter() + seconds
    while True:
        for name, (fn, _) in cases.items():
            best[name] = min(best[name], timed(fn))
        if time.perf_counter() > deadline:
            break
    rates = {"flops": cases["flops"][1] / best["flops"],
             "bytes": cases["bytes"][1] / best["bytes"],
             # a round trip's rate: the cost model has one link rate for both ways
             "link": 2.0 * over_link / (best["to_gpu"] + best["to_host"]),
             "link_latency": best["link_latency"] / repeat, "launch": best["launch"] / repeat}
    if not simulated:  # the SMs a grid can keep busy (the simulated GPU keeps a real one's)
        rates["units"] = torch.cuda.get_device_properties(device).multi_processor_count
    if db is not None and not db.readonly:
        db.set_calibration(hardware, rates)
    return rates
