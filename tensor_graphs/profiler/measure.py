"""Measure one kernel call: check it against the float64 reference, then time it.

As llm.c does before any benchmark, every measurement first computes the kernel's result on
fresh random inputs and compares it with the reference interpreter in float64 (the norm-wise
relative error is recorded with the timing; a generated kernel's row records the accuracy it
was admitted at where that is larger, so plans in other processes know it). Timing: a warm-up
call and a calibration (how many back-to-back calls last at least ``min_sample`` seconds),
then ``repeats`` samples of that many calls; the row keeps the median, min and max seconds
per call; a sample during which our threads waited for a core (another process on it) is
taken again (``CONTENDED``).
``measure_together`` takes the samples of several calls in interleaved rounds, so
alternatives see the same load. A kernel
that raises is recorded as a failure (with its message) so a profiling run moves on and a
resumed run does not retry it.

A GPU kernel's call (and a copy to or from a GPU) is measured the same way through its
``device.DeviceIO``: inputs made on the host and moved to the GPU once, outside the timing;
the result brought back for the check; every sample (and the warm-up and calibration) taken
with the device synchronized before and after, so an asynchronous launch is not timed as free;
a kernel that writes into a given buffer (``writes_out``: torch CUDA kernels, copies) timed
writing into one made once, as the runtime calls it. A kernel on the GPU's memory is timed as
a CUDA graph of ``GRAPH_LAUNCHES`` of its calls, replayed: the GPU's time, which is what a
program's graph pays for it, not its launch from Python (``device`` says why).
A call's row carries its ``hardware`` (the GPU's key for a GPU call), never the CPU's by
default.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tensor_graphs import threads
from tensor_graphs.db.hardware import Hardware
from tensor_graphs.db.store import Measurement
from tensor_graphs.devices import gpu_fault
from tensor_graphs.ir import builder
from tensor_graphs.ir.domains import POSITIVE, input_domains
from tensor_graphs.ir.evaluate import evaluate
from tensor_graphs.ir.graph import substitute
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import STATE, STATE_UPDATE
from tensor_graphs.numerics import relative_error
from tensor_graphs.profiler.device import HOST, device_io


@dataclass(frozen=True)
class Call:
    """What to measure: ``kernel`` computing ``node`` from ``arguments`` (positional), with
    ``attrs`` as keywords; ``signature`` is the database key; ``flops``/``bytes`` its work;
    ``hardware`` the key its row is filed under (None: this machine's CPU)."""

    kernel: object
    node: Node
    arguments: tuple[Node, ...]
    attrs: dict
    signature: str
    flops: float = 0.0
    bytes: float = 0.0
    hardware: Hardware | None = None


# arguments that stay states as leaves: ``state_update`` accepts only a state (or a version
# of one) as its first operand, so as an input leaf every KV-cache append failed its check,
# was recorded as a failure, and decode planned the float64 reference in its place
STATE_OPS = (STATE, STATE_UPDATE)


def region_graph(call: Call) -> tuple[Node, dict[Node, str]]:
    """The computed subgraph with the kernel's distinct arguments as fresh leaves a0, a1, ...
    (an argument passed twice, as in ``x * x``, is one leaf): input leaves, state leaves for
    states and their versions."""
    names: dict[Node, str] = {}
    for arg in call.arguments:
        names.setdefault(arg, f"a{len(names)}")
    leaves = {arg: (builder.state if arg.op.name in STATE_OPS else builder.input)(
        name, arg.shape, arg.dtype) for arg, name in names.items()}
    return substitute(call.node, leaves), names


def random_inputs(call: Call, rng: np.random.Generator) -> dict[Node, np.ndarray]:
    """Per distinct argument: normal floats, zero integers (valid indices and offsets for any
    size), random bools. A float argument a ``log``, ``sqrt``, ... of the call reads is drawn
    in that op's domain (``ir.domains``: positive), as real data is: a generated loop's
    ``logf`` on negative lanes takes glibc's slow path, and timed there ``log(x)`` read 10 ms
    on (256, 4096) for 0.24 ms on positive values."""
    domains = input_domains(call.node, call.arguments)
    out: dict[Node, np.ndarray] = {}
    for a in call.arguments:
        if a in out:
            continue
        shape = tuple(int(d) for d in a.shape)
        if a.dtype.is_float:  # drawn in float32 (or float64) directly: drawing float64 and
            # casting took 4x as long, 10 s of GPT-2's 39 s first profile (230 calls, each with
            # its weights: the LM head's 38.6M values 1.0-1.2 s against 0.3 s)
            np_dtype = np.dtype(a.dtype.np_dtype)
            drawn = np_dtype if np_dtype in (np.float32, np.float64) else np.float32
            values = rng.standard_normal(shape, dtype=drawn)
            if domains.get(a) == POSITIVE:
                np.abs(values, out=values)
            out[a] = values if drawn == np_dtype else values.astype(np_dtype)
        elif a.dtype.name == "bool":
            out[a] = rng.random(shape) < 0.5
        else:
            out[a] = np.zeros(shape, dtype=a.dtype.np_dtype)
    return out


def measure(call: Call, *, repeats: int = 5, min_sample: float = 2e-3, max_seconds: float = 2.0,
            seed: int = 0) -> Measurement:
    """Check, then time one kernel call (see the module doc); never raises for the kernel's
    own failures."""
    return measure_together([call], repeats=repeats, min_sample=min_sample,
                            max_seconds=max_seconds, seed=seed)[0]


def measure_together(calls: list[Call], *, repeats: int = 5, min_sample: float = 2e-3,
                     max_seconds: float = 2.0, seed: int = 0) -> list[Measurement]:
    """``measure`` for several calls, their samples taken in interleaved rounds (one sample
    of each call per round, the order rotating): alternatives compared by the planner (a GEMM,
    the same GEMM with its bias, with its residual add) then see the same load. Measured one
    after another, a burst of other work on this shared 2-core machine made one of them read
    15 % slower than the next, more than the epilogue they differ by. The C kernels use their
    whole team meanwhile (threads.full_team), even while other processes load the cores, and so
    does numpy's own OpenBLAS inside ``numpy_matmul`` (threads.blas_follows_team): in a plan
    both shrink to one thread under load alike, so the rows compare them as a plan runs them."""
    with threads.full_team():
        drawn: dict = {}  # alternatives for one region share its inputs and reference
        timers = [_Timer(c, min_sample, max_seconds, seed, drawn) for c in calls]
        repeats = max(repeats, 1)  # every row has a sample
        for r in range(repeats):
            live = [t for t in timers if t.active(repeats)]
            if not live:
                break
            shift = r % len(live)
            for t in live[shift:] + live[:shift]:
                t.sample()
    return [t.result() for t in timers]


class _Timer:
    """One call being measured: checked against the reference, warmed up and calibrated on
    creation, then one sample per ``sample()``. The calibration's own timing is not a sample:
    taken as each timer is created, it is the one time not interleaved with the other calls,
    and a burst of load that began after it made the planner take an unpacked GEMM whose
    calibration (7.0 ms) had run before the burst while every sample of the packed one read
    11.4 ms. ``max_seconds`` bounds the time spent calling this kernel, not the window's wall
    time: counted from creation, it ran out for the timers created before a window's LM head
    (whose float64 check takes seconds), and GEMMs planned on a single sample."""

    def __init__(self, call: Call, min_sample: float, max_seconds: float, seed: int,
                 drawn: dict | None = None):
        """``drawn``: inputs and float64 references already made for a region (the same node
        and arguments: a kernel's alternatives for it), shared by the timers of one
        ``measure_together``; each timer gets its own copy of the inputs (a kernel may write
        into one). Drawing and evaluating them once per timer was 14 s of GPT-2's 37 s first
        profile."""
        k = call.kernel
        self.base = dict(kernel=k.name, source_hash=k.source_hash, signature=call.signature,
                         flops=call.flops, bytes=call.bytes, hardware=call.hardware)
        self.failure: str | None = None
        self.samples: list[float] = []
        self.error = math.nan
        # a generated kernel's row keeps the accuracy it was admitted at (the worst error its
        # checks showed, ``codegen.admitted``), which a plan in another process reads there
        # (``CostModel.accuracy``) rather than building and verifying the kernel to learn it
        self.admitted = float(k.tolerance) if getattr(k, "generated", False) else math.nan
        self.sync = None
        self.launches = 1  # kernel calls per call of ``fn`` (a CUDA graph holds several)
        try:
            io = device_io(k)
            self.sync = io.sync
            key = (call.node, tuple(call.arguments))
            found = None if drawn is None else drawn.get(key)
            if found is None:
                graph, names = region_graph(call)
                values = random_inputs(call, np.random.default_rng(seed))
                ref = _reference(graph, {names[a]: v for a, v in values.items()})
                if drawn is not None:
                    drawn[key] = ({a: v.copy() for a, v in values.items()}, ref)
            else:
                values = {a: v.copy() for a, v in found[0].items()}
                ref = found[1]
            # inputs go to the kernel's device once, and arguments prepared at bind time (a
            # packed weight) are prepared once, outside the timing, as the runtime does per
            # binding (registry: ``prepare=``)
            placed = {a: io.to_device(v) for a, v in values.items()}
            arrays = k.prepare_arguments([placed[a] for a in call.arguments])
            with np.errstate(all="ignore"):
                made = k.fn(*arrays, **call.attrs)
                got = io.to_host(made)
            if ref is not None:  # (None: the row's error stays unknown)
                if got.shape != ref.shape:
                    raise ValueError(f"result shape {got.shape}, expected {ref.shape}")
                finite = np.isfinite(ref)
                self.error = relative_error(np.where(finite, got, 0),
                                            np.where(finite, ref, 0))
            if io is not HOST and getattr(k, "writes_out", False):
                # as the runtime calls it: into a buffer of the result's device made once (an
                # arena place). Timed making a new result per call, a 64 MB GPU -> host copy
                # read 16.5 ms on an H200 (4.1 GB/s, where 4 MB moved at 13.7 GB/s): a fresh
                # host array per call pays its page faults, which a program's arena does not
                self.fn = lambda: k.fn(*arrays, out=made, **call.attrs)
            else:
                self.fn = lambda: k.fn(*arrays, **call.attrs)
            if io.replay is not None:
                self._graphed(io.replay, got.nbytes)
            start = time.perf_counter()
            self.calls, first = _calls_per_sample(self.fn, min_sample, max_seconds, self.sync)
            self.budget = max_seconds - (time.perf_counter() - start)
            if not self.calls:  # one call took half the budget: it is the only sample
                self.samples.append(first / self.launches)
        except Exception as exc:  # noqa: BLE001 - any kernel failure is recorded, not raised
            self._failed(exc, "checking")

    def _graphed(self, replay, result_bytes: int) -> None:
        """``fn`` replaced by a CUDA graph of ``GRAPH_LAUNCHES`` of its calls (fewer where
        each result is large: a graph keeps what its launches allocate), so a sample times
        the GPU's work as a program's graph replays it; where the launches cannot be captured
        (``device.DeviceIO.replay`` raised) the kernel stays timed launch by launch, as the
        Python loop that must then run its program calls it."""
        launches = max(1, min(GRAPH_LAUNCHES, GRAPH_BYTES // max(result_bytes, 1)))
        try:
            self.fn = replay(self.fn, launches)
        except Exception:  # noqa: BLE001 - not capturable: timed launch by launch
            return
        self.launches = launches

    def active(self, repeats: int) -> bool:
        return (self.failure is None and len(self.samples) < repeats and self.calls > 0
                and (not self.samples or self.budget > 0))

    def sample(self) -> None:
        try:
            # a take retaken for contention is the load's time, not the kernel's: charged is
            # the kept take, so retakes do not cost a kernel its samples (they stop when its
            # budget is out, and after RETAKES)
            seconds, _ = _uncontended_sample(self.fn, self.calls, self.sync, self.budget)
            self.samples.append(seconds / self.launches)
            self.budget -= seconds * self.calls
        except Exception as exc:  # noqa: BLE001
            self._failed(exc, "timing")

    def _failed(self, exc: Exception, doing: str) -> None:
        """The kernel's failure, recorded; a GPU fault (``devices.gpu_fault``) is raised
        instead: it is no kernel's own, and the window's rows are then never filed."""
        fault = gpu_fault(exc, f"{doing} kernel {self.base['kernel']} on "
                               f"{self.base['signature']}")
        if fault is not None:
            raise fault from exc
        self.failure = f"{type(exc).__name__}: {exc}"[:500]

    def result(self) -> Measurement:
        self.fn = None  # the arrays go with it
        if self.failure is not None:
            nan = math.nan
            return Measurement(**self.base, runs=0, median=nan, min=nan, max=nan, error=None,
                               failure=self.failure)
        s = self.samples
        return Measurement(**self.base, runs=len(s), median=float(np.median(s)),
                           min=float(min(s)), max=float(max(s)),
                           error=self.worst())

    def worst(self) -> float | None:
        """The row's error: this call's on its inputs, or a generated kernel's admitted
        accuracy where that is larger; None when neither was measured."""
        known = [e for e in (self.error, self.admitted) if not math.isnan(e)]
        return float(max(known)) if known else None


def _reference(graph: Node, feeds: dict) -> np.ndarray | None:
    """The call's float64 reference, or None where computing it does not fit in memory. A
    composite's reference may need far more than any kernel for it: cumsum's is a masked sum
    over an n x n mask, 64 GiB at n = 262144. Every kernel timed here was checked against the
    reference on small random inputs first (``missing.verified``); failing them here for the
    reference's memory recorded each cumsum kernel as failed at that shape, and the plan took
    the reference itself as the kernel, which then failed the call."""
    try:
        with np.errstate(all="ignore"):
            return evaluate(graph, feeds, dtype="float64")
    except MemoryError:
        return None


def _calls_per_sample(fn, min_sample: float, max_seconds: float, sync=None
                      ) -> tuple[int, float]:
    """(calls per sample, the first sample's seconds per call): a warm-up, then enough calls
    to last ``min_sample`` (found by doubling, so one slow first call does not shrink every
    sample to a single call). 0 calls when the warm-up alone took half of ``max_seconds``:
    that one call is the only sample. ``sync`` waits for a device's queued work (see
    ``_sample``)."""
    start = time.perf_counter()
    fn()  # warm-up (caches, lazy compilation, thread pools)
    if sync is not None:
        sync()
    if time.perf_counter() - start > max_seconds / 2:
        return 0, time.perf_counter() - start
    calls = 1
    while True:
        batch = _sample(fn, calls, sync) * calls
        if batch >= min_sample or time.perf_counter() - start > max_seconds / 4:
            return calls, batch / calls
        calls *= 2


def sample_times(fn, repeats: int, min_sample: float, max_seconds: float,
                 sync=None) -> list[float]:
    """Seconds per call of ``fn`` alone: the first sample as ``_calls_per_sample`` finds it,
    then more of the same length until ``repeats`` samples or ``max_seconds``."""
    start = time.perf_counter()
    calls, first = _calls_per_sample(fn, min_sample, max_seconds, sync)
    samples = [first]
    while calls and len(samples) < repeats and time.perf_counter() < start + max_seconds:
        samples.append(_sample(fn, calls, sync))
    return samples


# A GPU kernel is timed inside a CUDA graph of this many of its calls (``_Timer._graphed``):
# a replay costs the host one launch, so the samples time the GPU's work; at most GRAPH_BYTES
# of results a graph (each launch that allocates keeps its result in the graph's pool)
GRAPH_LAUNCHES = 16
GRAPH_BYTES = 256 << 20

# A sample during which this process's threads waited for a core (runnable, another process
# on it: /proc/self/task/*/schedstat's run delay) for this share of its time or more measured
# the load, not the kernel: it is taken again, up to RETAKES times, after a PAUSE. The C
# kernels run their whole team under the profiler (threads.full_team), and a region waits for
# its slowest thread: at load 5 on 2 cores, 40 samples of a (1, 768) x (768, 3072) int8 GEMV
# read 36-40 us in the 12 where no thread waited and 89-1068 us in the 28 where they waited
# 59-105 % of the sample; rows measured in such a burst (0.4-0.5 ms for any GEMV size) made the
# planner keep float GEMVs its other rows, measured quiet, put at 0.06 ms.
CONTENDED = 0.125
RETAKES = 6
PAUSE = 0.005  # seconds between takes: bursts of other work come and go within tens of ms


def _run_delay() -> float | None:
    """Seconds this process's threads have spent runnable but waiting for a core, or None
    where the kernel does not report it (not Linux, no schedstats)."""
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total * 1e-9


def _uncontended_sample(fn, calls: int, sync=None, budget: float = math.inf
                        ) -> tuple[float, float]:
    """(seconds per call, seconds spent calling): ``_sample``, taken again while this
    process's threads waited for a core ``CONTENDED`` of the sample or more (see above), at
    most ``RETAKES`` times and while ``budget`` lasts; the fastest take. On a GPU (``sync``)
    the host's waits do not time the kernel: one take."""
    (seconds,), (spent,) = uncontended_takes(lambda: [_sample(fn, calls, sync)], [calls],
                                             retake=sync is None, budget=budget)
    return seconds, spent


def uncontended_takes(take: Callable[[], Sequence[float]], calls: Sequence[int], *,
                      retake: bool = True, budget: float = math.inf
                      ) -> tuple[list[float], list[float]]:
    """(each one's seconds per call, each one's seconds spent calling) of ``take``, which
    times ``calls[i]`` calls of several functions at once (seconds per call of each): taken
    again while this process's threads waited for a core ``CONTENDED`` of the take or more,
    at most ``RETAKES`` times and while ``budget`` lasts; each one's fastest take."""
    best, spent = [math.inf] * len(calls), [0.0] * len(calls)
    for n in range(RETAKES + 1):
        before = _run_delay() if retake else None
        seconds = take()
        after = _run_delay() if before is not None else None
        best = [min(b, s) for b, s in zip(best, seconds)]
        took = [s * c for s, c in zip(seconds, calls)]
        spent = [a + t for a, t in zip(spent, took)]
        if after is None or after - before < CONTENDED * sum(took) \
                or n == RETAKES or sum(spent) >= budget:
            break
        time.sleep(PAUSE)
    return best, spent


def _sample(fn, calls: int, sync=None) -> float:
    """Seconds per call of ``calls`` back-to-back calls. With ``sync`` (a GPU's
    ``torch.cuda.synchronize``) the device is drained before the clock starts and waited for
    before it stops: a launch returns before its kernel runs, so without it a sample times
    the launches (or, once the queue is full, a previous sample's kernels)."""
    if sync is not None:
        sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    if sync is not None:
        sync()
    return (time.perf_counter() - t0) / calls
