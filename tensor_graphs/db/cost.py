"""The cost model: how long one kernel call takes, answered from the measurement database.

Every answer is an ``Estimate`` that says where it came from, in order of trust:

1. ``measured``: a row for this kernel (same source hash) and this exact input signature on
   this hardware, its fastest sample (``Measurement.seconds``); its uncertainty is the
   spread of the measured runs (median over fastest).
2. ``interpolated``: no exact row, but the same kernel was measured on other shapes with the
   same dtypes and ranks. Time is fitted against roofline work (``work`` below: the larger of
   flops / peak flop rate and bytes / peak bandwidth) on the nearest measured signatures, as a
   straight line in log-log space (a power law; one point scales linearly past the backend's
   call overhead). Uncertainty grows with the distance to the nearest measurement.
3. ``stale``: only rows of an edited kernel (another source hash) for this signature: a rough
   guide, with a wide uncertainty.
4. ``calibrated``: a generated kernel never measured: the roofline below times the median
   measured/roofline ratio of its generator's measured kernels on this hardware, the ratios'
   spread its uncertainty (``db/generated_cost.py``, which also says what the profiler
   measures from it).
5. ``estimated``: a roofline estimate from the device's peak rates, calibrated once per device
   (``commands/calibrate.py``, stored in the database; built-in defaults per device kind
   before that: a GPU's are a datacenter GPU's, not the CPU's) plus the call's overhead per
   (backend, device kind): a Python call on the CPU, a launch on a GPU. A copy between the
   host and a GPU costs the link's latency plus its bytes at the link's rate (PCIe-like
   until calibrated), so 1 GB costs ~0.08 s before it is measured.

Static values (weights, and what the prelude makes of them) read by a call of a program whose
weights exceed the last-level cache come from memory once per call: ``from_memory`` adds those
bytes, at the width the kernel stores them, over the measured read bandwidth (see its
docstring for why a term on the answer, and why added, not a floor).

Rows are filed and looked up under the hardware key of the device that runs the kernel
(``measured_on``: a host<->GPU copy is the GPU's), so a GPU's rows, and the simulated GPU's
(CPU times under a key of their own), never mix with the CPU's.

A copy within one device's memory costs nothing (``free``). Answers are cached in memory until
the database changes (``refresh``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tensor_graphs.db import generated_cost
from tensor_graphs.db.features import SUBSET_READERS, Features, features, nbytes
from tensor_graphs.ir.graph import is_static
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import CONSTANT
from tensor_graphs.kernels.copy import placement

# Built-in rates per device kind, for a device never calibrated (``commands/calibrate.py``
# stores measured ones): peak flop rate, peak bandwidth (bytes read plus written per second);
# "dispatch" is what the runtime's Python loop spends per step around a kernel call (seconds):
# the host's, so a GPU takes the host's calibrated figure unless its own calibration has one;
# "link": bytes per second across the host<->GPU link, each byte counted once.
DEFAULT_RATES = {
    "cpu": {"flops": 50e9, "bytes": 10e9, "dispatch": 3e-6},  # a modest two-core CPU
    # a datacenter GPU at ~3/4 of an H100's peaks (67 TFLOP/s fp32 without TF32, 3.35 TB/s);
    # the link at ~12 GB/s, as an H200 measured it from pageable host memory (12.7 GB/s host
    # -> GPU and 13.7 back on 4 MB, 9.6 host -> GPU on 64 MB) before copies were staged in
    # pinned memory (kernels/staging.py): a floor until calibrate_gpu measures the staged path
    "cuda": {"flops": 50e12, "bytes": 2e12, "dispatch": 3e-6, "link": 12e9,
             "cache": 50e6,  # an H100's L2
             "units": 132},  # an H100's SMs: a grid of fewer leaves the rest idle
}
# A GPU unit (SM) busy while others idle streams more than its even share of the bandwidth:
# its loads in flight, not the memory, limit it. About 3x (an H100's 3.35 TB/s over 132 SMs
# is 25 GB/s an SM, where one streams ~75), an assumption until the kernel is measured.
UNIT_STREAM = 3.0
# Rates a device's calibration may lack, derived from what it has (``CostModel.rates``):
# "read": bytes per second the runtime's threads read from memory (static values streamed once
# per call, ``from_memory``): measured by ``profiler/bandwidth.py`` (``tg profile``'s
# calibration, or ``profile="missing"`` the first time a program streams), "bytes" before that;
# "cache": bytes of the last-level cache (a program whose static values exceed it reads them
# from memory every call): this CPU's from sysfs (``last_level_cache``) unless stored.
READ_FALLBACK = "bytes"
DEFAULT_CACHE = 32 << 20  # a CPU whose cache sizes sysfs does not give
# Seconds one call costs beyond its work, per (backend, device kind whose rates cost it: see
# ``measured_on``). Where a row is missing, the backend's CPU figure, else DEFAULT_OVERHEAD.
OVERHEAD = {
    ("numpy", "cpu"): 3e-6,  # Python call and numpy's argument handling
    ("c", "cpu"): 2e-6,  # ctypes call, argument checks, the thread team's wake-up
    ("torch", "cpu"): 6e-6,  # torch's dispatcher over numpy views
    ("triton", "cpu"): 20e-6,  # Triton's launcher (the simulated GPU runs it on the host)
    ("copy", "cpu"): 1e-6,  # a move within host memory (a view: costed free anyway)
    # a GPU kernel as a program's CUDA graph replays it (the profiler times them so): the gap
    # to the next kernel and a tiny kernel's ramp, a few us, not the launch from Python (torch
    # 5-10 us, Triton's launcher 20-60 us on an H100's or H200's host), which a graph skips
    ("torch", "cuda"): 3e-6,
    ("triton", "cuda"): 3e-6,
    ("copy", "cuda"): 15e-6,  # a host<->GPU transfer's latency (H200: 13-17 us, tiny copies)
}
DEFAULT_OVERHEAD = 5e-6  # a backend the table does not know
# Calibrated rates that replace an overhead above (``commands/calibrate.calibrate_gpu``)
CALIBRATED_OVERHEAD = {
    ("torch", "cuda"): "launch",  # seconds per tiny kernel in a CUDA graph, back to back
    ("triton", "cuda"): "launch",
    ("copy", "cuda"): "link_latency",  # seconds of a one-element host->GPU copy
}
EXACT_SLOWDOWN = 20.0  # numpy_exact_*: float64 through the reference interpreter
# numpy computes a composite (softmax, attention, a norm) as several whole-array passes, where
# C and torch kernels make one: until measured, its work counts this many times
NUMPY_COMPOSITE_PASSES = 3.0
EXACT_OVERHEAD = 40e-6
UNCERTAINTY = {"measured": 1.1, "interpolated": 1.5, "stale": 3.0, "estimated": 4.0, "free": 1.0}
# "calibrated": its generator's spread (generated_cost.Calibration.uncertainty)
# "failed": the kernel raised or failed verification on this signature; infinite, never chosen


@dataclass(frozen=True)
class Estimate:
    """A predicted time in seconds, where it came from, and a multiplicative uncertainty: the
    true time is expected within ``seconds / uncertainty .. seconds * uncertainty``."""

    seconds: float
    source: str  # measured | interpolated | stale | calibrated | estimated | free | failed
    uncertainty: float
    from_memory: bool = False  # includes its static inputs' bytes at the read bandwidth

    def __str__(self) -> str:
        memory = ", weights from memory" if self.from_memory else ""
        return (f"{format_seconds(self.seconds)} ({self.source}{memory}, "
                f"x{self.uncertainty:.2g})")


FREE = Estimate(0.0, "free", 1.0)


def format_seconds(seconds: float) -> str:
    """A time as a plan or report prints it: "1.23 s" from a second up ("1.6e+03 ms" before),
    "1.23 ms" from a millisecond, else "456 us". The unit is chosen after rounding to the
    three digits shown: 999.6 us printed "1e+03 us"."""
    seconds = float(f"{seconds:.3g}")
    if seconds >= 1.0:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def is_exact_kernel(kernel) -> bool:
    """numpy_exact_* kernels evaluate the reference in float64: correct, and slow."""
    from tensor_graphs.kernels.numpy.exact import ExactFunction

    return isinstance(kernel.fn, ExactFunction)


class CostModel:
    """Answers ``estimate(kernel, signature, features)`` from one database on one machine."""

    def __init__(self, db, hardware):
        self.db = db
        self.hardware = hardware  # {device kind: Hardware}
        self._cache: dict = {}
        self._rows: dict = {}
        self._rates: dict = {}
        self._calibrations: dict = {}  # (name prefix, device kind) -> Calibration | None
        self._accuracy: dict = {}  # (kernel name, source hash) -> largest recorded error
        self.revision = db.revision if db is not None else 0

    def refresh(self) -> None:
        """Forget cached answers when the database has new rows."""
        revision = self.db.revision if self.db is not None else 0
        if revision != self.revision:
            self._cache.clear()
            self._rows.clear()
            self._rates.clear()
            self._calibrations.clear()
            self._accuracy.clear()
            self.revision = revision

    def rates(self, kind: str) -> dict:
        """The device kind's rates: its calibration over the kind's built-in ones; a GPU's
        "dispatch" (the runtime's Python loop, on the host) is the host's unless its own
        calibration measured one."""
        found = self._rates.get(kind)
        if found is None:
            stored = self.db.calibration(self.hardware[kind]) if self.db is not None else None
            found = {**DEFAULT_RATES.get(kind, DEFAULT_RATES["cpu"]), **(stored or {})}
            found.setdefault("read", found[READ_FALLBACK])
            found.setdefault("cache", float(last_level_cache()))
            if kind != "cpu" and "cpu" in self.hardware and "dispatch" not in (stored or {}):
                found["dispatch"] = self.rates("cpu")["dispatch"]
            self._rates[kind] = found
        return found

    def work(self, feats: Features, kind: str) -> float:
        """Roofline seconds: the larger of compute time and memory time at peak rates."""
        rates = self.rates(kind)
        return max(feats.flops / rates["flops"], feats.bytes / rates["bytes"], 1e-12)

    def kernel_work(self, kernel, feats: Features) -> float:
        """Seconds of ``kernel``'s work at the rates of the device that costs it: the roofline,
        or for a copy between host and GPU its bytes across the link (a copy's features count
        the value read and written; it crosses the link once)."""
        kind = measured_on(kernel)
        if crosses_link(kernel):
            return max(feats.bytes / 2 / self.rates(kind)["link"], 1e-12)
        return self.work(feats, kind)

    def as_run(self, kernel, feats: Features, signature: str | None) -> Features:
        """``feats`` as the kernel's roofline sees them at ``signature``: its flops at the
        share of the peak it declares (``efficiency``), and on a device of several units (a
        GPU's SMs) its work over the share of them its grid keeps busy (``occupancy``). A
        unit busy alone streams up to ``UNIT_STREAM`` times its even share of the bandwidth,
        so bytes are slowed less than arithmetic."""
        flops, moved = feats.flops / _efficiency(kernel, signature), feats.bytes
        occupancy = _occupancy(kernel, signature)
        units = self.rates(measured_on(kernel)).get("units") if occupancy else None
        if units and occupancy.programs > 0:
            waves = -(-occupancy.programs // units)
            busy = occupancy.programs / (waves * units)
            flops /= busy * occupancy.useful
            moved /= min(1.0, UNIT_STREAM * busy)
        return Features(flops, moved, feats.elements)

    def overhead(self, kernel) -> float:
        """Seconds one call of ``kernel`` costs beyond its work (``OVERHEAD``), or the
        calibrated figure that replaces it (``CALIBRATED_OVERHEAD``)."""
        key = (kernel.backend, measured_on(kernel))
        rate = CALIBRATED_OVERHEAD.get(key)
        if rate is not None and key[1] in self.hardware:
            found = self.rates(key[1]).get(rate)
            if found is not None:
                return float(found)
        return OVERHEAD.get(key, OVERHEAD.get((kernel.backend, "cpu"), DEFAULT_OVERHEAD))

    def weights_stream(self, static_bytes: float, kind: str) -> bool:
        """Whether a program whose static values (weights bound once, and what the prelude
        makes of them) total ``static_bytes`` reads them from memory on every call on the
        device kind ``kind``: they exceed its last-level cache. A decode walks every weight
        once per token in the same order, which an LRU cache smaller than the walk misses
        entirely; a model that fits keeps them cached between calls (what the profiler's hot
        loop measures), so its plans are costed as measured."""
        return static_bytes > self.rates(kind)["cache"]

    def from_memory(self, kernel, estimate: Estimate, static_bytes: float) -> Estimate:
        """``estimate`` of a call that reads ``static_bytes`` of static values (at the width
        the kernel stores them: ``call_features``) from memory once per call, in a program
        whose weights exceed the cache (``weights_stream``): the estimate plus those bytes at
        the measured read bandwidth ("read").

        Why a term on the answer, not a measurement with the static inputs evicted (a
        cache-flush buffer between samples): whether a weight comes from memory is a property
        of the program (its weights against the cache), not of the call, and one database row
        serves every program that makes the call, so an evicted row would overcharge a small
        model whose weights stay cached, where the hot row is right; flushing a 32 MiB cache
        per sample costs milliseconds and leaves one call per sample, where a 20 us GEMV
        timed alone is mostly the timer and the thread team's wake-up on a loaded machine;
        and a term applies alike to measured, interpolated, calibrated and roofline answers,
        so an int8 kernel measured hot and a float one estimated meet on the same footing.

        Why a sum, not ``max(hot time, bytes / bandwidth)`` (arithmetic overlapped with the
        stream): GPT-2 124M's decodes ran at 2.1-2.7x their bandwidth floor, not at it (a
        one-row GEMV's hot time, its weight from L3, adds to the time its weight takes from
        memory: float32 floor 14.8 + hot GEMVs 6.4 = 21 ms against 31 measured at load 5);
        and under ``max`` every float GEMV of a layer floored to the same bytes, so they tied
        and the tie went to the unpacked GEMV (its weight unpadded, 0.1 % fewer bytes), 40 %
        slower hot: the float32 decode plan took ``c_matmul_bias`` over
        ``c_packed_matmul_bias`` and ran 56.2 against 50.1 ms a token. The sum keeps the
        measured order among kernels that read the same bytes. The cost of not doing this:
        the GPT-2 124M int8-weight decode's measured plan kept float GEMVs (a 9.4 MB layer
        weight timed from the 32 MiB L3 at ~100 GB/s) and ran 1.38x float32, where int8
        everywhere ran 2.6-3.1x."""
        if static_bytes <= 0 or estimate.source in ("free", "failed") or kernel.view \
                or crosses_link(kernel):
            return estimate
        rate = self.rates(measured_on(kernel))["read"]
        return Estimate(estimate.seconds + static_bytes / rate, estimate.source,
                        estimate.uncertainty, from_memory=True)

    def estimate(self, kernel, signature: str, feats: Features) -> Estimate:
        key = (kernel.name, signature)
        found = self._cache.get(key)
        if found is None:
            found = self._estimate(kernel, signature, feats)
            self._cache[key] = found
        return found

    def _estimate(self, kernel, signature: str, feats: Features) -> Estimate:
        hw = self.hardware[measured_on(kernel)]
        stale = None
        if self.db is not None:
            row = self.db.lookup(kernel.name, signature, hw, kernel.source_hash)
            if row is not None and row.failure is not None \
                    and row.source_hash == kernel.source_hash:
                return Estimate(math.inf, "failed", 1.0)  # it raised here: never planned
            if row is not None and row.failure is None and math.isfinite(row.seconds):
                if row.source_hash == kernel.source_hash:
                    spread = row.median / row.seconds if row.seconds > 0 else 1.0
                    return Estimate(row.seconds, "measured",
                                    max(UNCERTAINTY["measured"], min(spread, 2.0)))
                stale = row
            fitted = self._interpolate(kernel, signature, feats)
            if fitted is not None:
                return fitted
        if stale is not None:
            return Estimate(stale.seconds, "stale", UNCERTAINTY["stale"])
        rough = self.roofline(kernel, feats, signature)
        found = self.calibration(kernel)
        if found is None:
            return rough
        return Estimate(rough.seconds * found.ratio, "calibrated", found.uncertainty)

    def accuracy(self, kernel) -> float | None:
        """The largest error ``kernel``'s current rows on its hardware record (for a
        generated kernel, the accuracy it was admitted at: ``profiler/measure.py``), or None
        without one. A generated candidate declares only its float floor before it is built;
        the profiler that measured it built and verified it, and a plan in another process
        reads the result here instead of choosing it, building it and refusing it."""
        if self.db is None:
            return None
        key = (kernel.name, kernel.source_hash)
        if key not in self._accuracy:
            errors = [r.error for r in self.db.rows_for(kernel.name,
                                                        self.hardware[measured_on(kernel)])
                      if r.source_hash == kernel.source_hash and r.failure is None
                      and r.error is not None and math.isfinite(r.error)]
            self._accuracy[key] = max(errors) if errors else None
        return self._accuracy[key]

    def calibration(self, kernel):
        """The ``generated_cost.Calibration`` of a generated kernel's generator on its
        hardware key (cached until the database changes), or None."""
        prefix = generated_cost.family(kernel.name) \
            if getattr(kernel, "generated", False) else None
        if prefix is None:
            return None
        key = (prefix, measured_on(kernel))
        if key not in self._calibrations:
            self._calibrations[key] = generated_cost.generator_calibration(self, kernel)
        return self._calibrations[key]

    def roofline(self, kernel, feats: Features, signature: str | None = None) -> Estimate:
        """The estimate from peak rates alone: overhead plus roofline work, the flops at the
        share of the peak the kernel declares for the signature's dtype (``efficiency``)."""
        # a view moves no data, and on a GPU launches nothing (planner.plan.launches)
        seconds = 0.0 if kernel.view and measured_on(kernel) != "cpu" else self.overhead(kernel)
        if not kernel.view:
            passes = NUMPY_COMPOSITE_PASSES if kernel.backend == "numpy" and \
                _is_composite(kernel) else 1.0
            seconds += passes * self.kernel_work(kernel, self.as_run(kernel, feats, signature))
        if is_exact_kernel(kernel):
            seconds = EXACT_OVERHEAD + EXACT_SLOWDOWN * seconds
        return Estimate(seconds, "estimated", UNCERTAINTY["estimated"])

    def _measured_rows(self, kernel, signature: str) -> list[tuple[float, float]]:
        """(work, seconds) of this kernel's current rows with the same dtypes and ranks."""
        want = _shape_class(signature)
        key = (kernel.name, want)
        found = self._rows.get(key)
        if found is None:
            found = []
            for r in self.db.rows_for(kernel.name, self.hardware[measured_on(kernel)]):
                flops, moved = getattr(r, "flops", None), getattr(r, "bytes", None)
                if (r.source_hash != kernel.source_hash or r.failure is not None
                        or flops is None or moved is None or not r.seconds > 0
                        or _shape_class(r.signature) != want):
                    continue
                found.append((self.kernel_work(kernel, self.as_run(
                    kernel, Features(flops, moved, 0.0), r.signature)), r.seconds))
            self._rows[key] = found
        return found

    def _interpolate(self, kernel, signature: str, feats: Features) -> Estimate | None:
        rows = self._measured_rows(kernel, signature)
        if not rows:
            return None
        w = self.kernel_work(kernel, self.as_run(kernel, feats, signature))
        by_work: dict[float, list[float]] = {}
        for rw, seconds in rows:
            by_work.setdefault(rw, []).append(seconds)
        points = sorted(((rw, float(np.median(ts))) for rw, ts in by_work.items()),
                        key=lambda p: abs(math.log(p[0] / w)))[:4]
        distance = abs(math.log(points[0][0] / w))
        if len(points) == 1:
            (rw, seconds), = points
            overhead = min(self.overhead(kernel), 0.5 * seconds)
            predicted = overhead + (seconds - overhead) * (w / rw)
        else:
            xs = np.log([p[0] for p in points])
            ys = np.log([p[1] for p in points])
            slope, intercept = np.polyfit(xs, ys, 1)
            slope = min(max(slope, 0.0), 1.3)  # time never shrinks with work, nor explodes
            intercept = float(np.mean(ys - slope * xs))
            predicted = math.exp(intercept + slope * math.log(w))
        inside = min(p[0] for p in points) <= w <= max(p[0] for p in points)
        uncertainty = UNCERTAINTY["interpolated"] * (1.0 if inside else 1.0 + distance / 3)
        return Estimate(predicted, "interpolated", round(uncertainty, 3))


def call_features(kernel, covers: Sequence[Node], arguments: Sequence[Node], result: Node
                  ) -> tuple[Features, float]:
    """(the features of one call of ``kernel`` computing ``covers`` from ``arguments``, the
    bytes of static values it reads per call) as the kernel runs it: an argument it prepares at
    bind time (``prepare=``) is read at its prepared width (``Preparation.nbytes``:
    ``c_bf16_matmul``'s float32 weight is streamed as bfloat16, half the bytes), and a covered
    node computed from prepared arguments and constants alone is the preparation's work, done
    once per binding (``c_bf16_matmul``'s ``bf16_round``: 68 flops a weight element in its
    decomposition, per call on paper, 21 times the GEMV's own). ``dequantize(q, s)`` in
    ``c_q8_matmul`` reads the scale ``s``, which is not prepared: it stays per call, as the
    kernel widens every weight per call. The one place these widths are decided: the planner's
    options, the profiler's rows (their work for interpolation) and ``from_memory`` use it."""
    prepared = _prepared(kernel, arguments)
    stored = {a: (prep.nbytes(tuple(int(d) for d in a.shape), a.dtype)
                  if prep is not None and prep.nbytes is not None else nbytes(a))
              for a, prep in prepared.items()}
    at_bind = _bind_time(covers, set(prepared))
    base = features([n for n in covers if n not in at_bind], arguments, result)
    subset = result.op.name in SUBSET_READERS
    out = nbytes(result)
    moved, static = base.bytes, 0.0
    for a in set(arguments):
        width = stored.get(a, nbytes(a))
        read = min(width, out) if subset else width
        if a in stored and not subset:
            moved += width - nbytes(a)
        if is_static(a):
            static += read
    return Features(base.flops, moved, base.elements), float(static)


def _prepared(kernel, arguments: Sequence[Node]) -> dict:
    """Argument node -> its ``Preparation`` (None for a generated kernel's, which re-lays a
    float weight out at its own width) for the arguments ``kernel`` prepares at bind time."""
    positions = getattr(kernel, "prepared_positions", None)
    if positions is not None:
        return {arguments[i]: p for i, p in positions(len(arguments)).items()}
    return {arguments[i]: None for i in getattr(kernel, "prepared", ())}


def _bind_time(covers: Sequence[Node], prepared: set) -> set:
    """The covered nodes computed from ``prepared`` arguments and constants alone."""
    found: set = set()
    if not prepared:
        return found
    for n in covers:  # topological order: inputs first
        if any(i in prepared or i in found for i in n.inputs) and all(
                i in prepared or i in found or i.op.name == CONSTANT for i in n.inputs):
            found.add(n)
    return found


def measured_on(kernel) -> str:
    """The device kind whose hardware key files ``kernel``'s rows and whose rates cost it:
    where it runs, except that a copy between the host and a GPU is the GPU's whichever way it
    goes (the link and the GPU's copy engines set its speed; a host key would mix it with CPU
    rows and let a simulated GPU's copies stand for a real one's)."""
    return next((k for k in placement(kernel) if k != "cpu"), "cpu")


def crosses_link(kernel) -> bool:
    """A copy between the host and a GPU: costed by the link, not by a roofline."""
    source, target = placement(kernel)
    return source != target and "cpu" in (source, target)


def _is_composite(kernel) -> bool:
    from tensor_graphs.ir.ops import OPS

    op = OPS.get(kernel.op) if kernel.op else None
    return op is not None and not op.is_atomic


def _efficiency(kernel, signature: str | None) -> float:
    """The share of the peak flop rate ``kernel`` declares for its first input's dtype in
    ``signature`` (1 where it declares none)."""
    shares = getattr(kernel, "efficiency", None)
    if not shares or not signature:
        return 1.0
    inputs = json.loads(signature).get("inputs", [])
    return shares.get(inputs[0][1], 1.0) if inputs else 1.0


def _occupancy(kernel, signature: str | None):
    """The ``Occupancy`` ``kernel`` declares for the input shapes of ``signature``, or None
    (none declared, no signature, or a dim not concrete)."""
    occupancy = getattr(kernel, "occupancy", None)
    if occupancy is None or not signature:
        return None
    shapes = [tuple(shape) for shape, _ in json.loads(signature).get("inputs", [])]
    if not all(isinstance(d, int) for s in shapes for d in s):
        return None
    return occupancy(shapes)


def _shape_class(signature: str) -> tuple:
    """The dtypes and ranks of a signature's inputs: rows of the same class interpolate."""
    inputs = json.loads(signature).get("inputs", [])
    return tuple((len(shape), dtype) for shape, dtype in inputs)


def last_level_cache() -> int:
    """Bytes of this CPU's largest cache (sysfs: the highest level cpu0 reports), else
    ``DEFAULT_CACHE``."""
    global _LLC
    if _LLC is None:
        _LLC = DEFAULT_CACHE
        base = "/sys/devices/system/cpu/cpu0/cache"
        best = (0, 0)
        try:
            for entry in os.listdir(base):
                if not entry.startswith("index"):
                    continue
                with open(os.path.join(base, entry, "level")) as f:
                    level = int(f.read())
                with open(os.path.join(base, entry, "size")) as f:
                    text = f.read().strip().upper()
                scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
                size = int(text.rstrip("KMG")) * scale
                best = max(best, (level, size))
        except (OSError, ValueError):
            pass
        if best[1] > 0:
            _LLC = best[1]
    return _LLC


_LLC: int | None = None
