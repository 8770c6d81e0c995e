"""Measure one kernel call: check it against the float64 reference, then time it.

As llm.c does before any benchmark, every measurement first computes the kernel's result on
fresh random inputs and compares it with the reference interpreter in float64 (the norm-wise
relative error is recorded with the timing). Timing: a warm-up call, then ``repeats`` samples,
each timing enough back-to-back calls to last at least ``min_sample`` seconds; the row keeps
the median, min and max seconds per call. A kernel that raises is recorded as a failure (with
its message) so a profiling run moves on and a resumed run does not retry it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from tensor_graphs.db.store import Measurement
from tensor_graphs.ir import builder
from tensor_graphs.ir.evaluate import evaluate
from tensor_graphs.ir.graph import substitute
from tensor_graphs.ir.node import Node
from tensor_graphs.numerics import relative_error


@dataclass(frozen=True)
class Call:
    """What to measure: ``kernel`` computing ``node`` from ``arguments`` (positional), with
    ``attrs`` as keywords; ``signature`` is the database key; ``flops``/``bytes`` its work."""

    kernel: object
    node: Node
    arguments: tuple[Node, ...]
    attrs: dict
    signature: str
    flops: float = 0.0
    bytes: float = 0.0


def region_graph(call: Call) -> tuple[Node, dict[Node, str]]:
    """The computed subgraph with the kernel's distinct arguments as fresh input leaves a0,
    a1, ... (an argument passed twice, as in ``x * x``, is one leaf)."""
    names: dict[Node, str] = {}
    for arg in call.arguments:
        names.setdefault(arg, f"a{len(names)}")
    leaves = {arg: builder.input(name, arg.shape, arg.dtype) for arg, name in names.items()}
    return substitute(call.node, leaves), names


def random_inputs(call: Call, rng: np.random.Generator) -> dict[Node, np.ndarray]:
    """Per distinct argument: normal floats, zero integers (valid indices and offsets for any
    size), random bools."""
    out: dict[Node, np.ndarray] = {}
    for a in call.arguments:
        if a in out:
            continue
        shape = tuple(int(d) for d in a.shape)
        if a.dtype.is_float:
            out[a] = rng.standard_normal(shape).astype(a.dtype.np_dtype)
        elif a.dtype.name == "bool":
            out[a] = rng.random(shape) < 0.5
        else:
            out[a] = np.zeros(shape, dtype=a.dtype.np_dtype)
    return out


def measure(call: Call, *, repeats: int = 5, min_sample: float = 2e-3, max_seconds: float = 2.0,
            seed: int = 0) -> Measurement:
    """Check, then time one kernel call (see the module doc); never raises for the kernel's
    own failures."""
    k = call.kernel
    base = dict(kernel=k.name, source_hash=k.source_hash, signature=call.signature,
                flops=call.flops, bytes=call.bytes)
    try:
        rng = np.random.default_rng(seed)
        graph, names = region_graph(call)
        values = random_inputs(call, rng)
        # arguments prepared at bind time (a packed weight) are prepared once, outside the
        # timing, as the runtime does per binding (registry: ``prepare=``)
        arrays = k.prepare_arguments([values[a] for a in call.arguments])
        with np.errstate(all="ignore"):
            ref = evaluate(graph, {names[a]: v for a, v in values.items()}, dtype="float64")
            got = k.fn(*arrays, **call.attrs)
        got = np.asarray(got)
        if got.shape != ref.shape:
            raise ValueError(f"result shape {got.shape}, expected {ref.shape}")
        finite = np.isfinite(ref)
        error = relative_error(np.where(finite, got, 0), np.where(finite, ref, 0))
        samples = _time(lambda: k.fn(*arrays, **call.attrs), repeats, min_sample, max_seconds)
    except Exception as exc:  # noqa: BLE001 - any kernel failure is recorded, not raised
        nan = math.nan
        return Measurement(**base, runs=0, median=nan, min=nan, max=nan, error=None,
                           failure=f"{type(exc).__name__}: {exc}"[:500])
    return Measurement(**base, runs=len(samples), median=float(np.median(samples)),
                       min=float(min(samples)), max=float(max(samples)),
                       error=None if math.isnan(error) else float(error))


def _time(fn, repeats: int, min_sample: float, max_seconds: float) -> list[float]:
    """Seconds per call: a warm-up, then enough calls per sample to last ``min_sample`` (found
    by doubling, so one slow first call does not shrink every sample to a single call)."""
    start = time.perf_counter()
    fn()  # warm-up (caches, lazy compilation, thread pools)
    if time.perf_counter() - start > max_seconds / 2:
        return [time.perf_counter() - start]
    calls, batch = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        batch = time.perf_counter() - t0
        if batch >= min_sample or time.perf_counter() - start > max_seconds / 4:
            break
        calls *= 2
    samples = [batch / calls]
    deadline = start + max_seconds
    while len(samples) < repeats and time.perf_counter() < deadline:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls)
    return samples
