"""Estimates of generated kernels never measured, calibrated from those that were.

A generator offers a kernel at every node (the maximal region rooted there), each a compile, a
verification and a timing before its first row: GPT-2 2-layer's fresh-database profile took 314
calls with generation against 249 without. Measuring only some of them needs estimates of the
others that are neither optimistic nor arbitrary: left on the roofline (peak rates), the
sub-regions of a measured region beat it on paper, since every generated kernel runs slower than
its roofline, and plans picked kernels nobody had timed. Here an unmeasured generated kernel is
estimated as its roofline times the **median measured/roofline ratio** of the kernels of the
same generator (named alike: ``family``) measured on the same hardware key, with the ratios'
spread as its uncertainty (``Calibration``). Fewer than ``MIN_KERNELS`` measured kernels of the
generator: the ratio still applies, with the roofline's own uncertainty.

The profiler measures a generated kernel only where its **optimistic** estimate
(``optimistic``: seconds / uncertainty) could put it in the plan (``profiler/missing.py``), and
a plan on calibrated estimates then picks a measured kernel wherever the optimistic one did.
The same rule (``gated``) holds the host-side kernels of a GPU plan: a kernel on the host and
the copies between host and GPU, offered at every step ("copy to the host, run there, copy
back"). Such a step pays two copies (13-17 us tiny, 40-150 us at GPT-2 124M's (1,128,768) on
an H100) against GPU kernels of 6-50 us, so it almost never wins; measured all the same, 144
of the 232 rows of GPT-2 124M's first GPU profile were host kernels.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from tensor_graphs.db.features import Features
from tensor_graphs.kernels.copy import placement

MIN_KERNELS = 3  # measured kernels of a generator before its ratios' spread is trusted
SPREAD_QUANTILE = 0.9  # the uncertainty covers this share of the measured kernels' ratios
LEAST_UNCERTAINTY = 1.5  # a calibrated estimate is never trusted closer (interpolation's)
MOST_UNCERTAINTY = 4.0  # nor looser than the roofline's own
_HASHED = re.compile(r"^(.*_)[0-9a-f]{8,}$")  # a generated kernel's name: prefix + source hash


def family(name: str) -> str | None:
    """The name prefix the kernels of one generator share (``c_fused_``, ``c_row_``,
    ``c_gemm_ep_``, ``triton_row_``...), or None for a name without a source hash."""
    found = _HASHED.match(name)
    return found.group(1) if found else None


@dataclass(frozen=True)
class Calibration:
    """How one generator's measured kernels ran against their rooflines on one hardware key:
    ``ratio`` (median measured / roofline seconds over their rows), ``uncertainty`` (the
    ``SPREAD_QUANTILE`` of the rows' |log(ratio / median)|, as a factor, within
    [LEAST_UNCERTAINTY, MOST_UNCERTAINTY]; MOST_UNCERTAINTY under ``MIN_KERNELS`` kernels),
    ``kernels`` and ``rows`` measured."""

    ratio: float
    uncertainty: float
    kernels: int
    rows: int


def calibrate(points: list[tuple[str, float, float]]) -> Calibration | None:
    """The calibration of (kernel name, measured seconds, roofline seconds) rows, or None
    without a usable row."""
    ratios = [m / r for _, m, r in points if m > 0 and r > 0 and math.isfinite(m / r)]
    if not ratios:
        return None
    logs = np.log(ratios)
    center = float(np.median(logs))
    kernels = len({name for name, m, r in points if m > 0 and r > 0})
    if kernels < MIN_KERNELS:
        spread = MOST_UNCERTAINTY
    else:
        deviation = float(np.quantile(np.abs(logs - center), SPREAD_QUANTILE))
        spread = min(max(math.exp(deviation), LEAST_UNCERTAINTY), MOST_UNCERTAINTY)
    return Calibration(math.exp(center), spread, kernels, len(ratios))


def generator_calibration(cost, kernel) -> Calibration | None:
    """``kernel``'s generator's calibration from ``cost``'s database (its rows under the
    hardware key that files ``kernel``), or None: not a generated kernel, nothing measured."""
    prefix = family(kernel.name) if getattr(kernel, "generated", False) else None
    if prefix is None or cost.db is None:
        return None
    from tensor_graphs.db.cost import measured_on

    hw = cost.hardware[measured_on(kernel)]
    points = []
    for row in cost.db.rows_named(prefix, hw):
        if row.flops is None or row.bytes is None or not row.seconds > 0:
            continue
        roofline = cost.roofline(kernel, Features(row.flops, row.bytes, 0.0)).seconds
        points.append((row.kernel, row.seconds, roofline))
    return calibrate(points)


# the estimates an optimistic plan divides by their uncertainty, per kind of gated kernel
RELAXED = {
    "generated": ("calibrated", "estimated"),  # an interpolation of its own rows: as it is
    "host": ("interpolated", "stale", "estimated"),  # anything but its own row here
}


def host_side(kernel, target: str | None) -> bool:
    """Whether ``kernel`` is a host-side option of a plan for ``target``: the target is a GPU
    and the kernel runs on the host or copies to or from it. None: no target (nothing is)."""
    return target not in (None, "cpu") and "cpu" in placement(kernel)


def gated(kernel, target: str | None) -> bool:
    """Whether the profiler measures ``kernel`` only where a plan on optimistic times picks it
    (``profiler/missing.could_win``): a generated kernel, or a host-side kernel of a plan for
    GPU ``target`` (see the module doc). ``target`` None: generated kernels only."""
    return bool(getattr(kernel, "generated", False)) or host_side(kernel, target)


def optimistic(kernel, estimate, target: str | None = None):
    """The least time ``estimate`` of ``kernel`` allows in a plan for ``target``: a gated
    kernel's estimate (``gated``; a generated kernel's calibrated or roofline one, a host-side
    kernel's anything but a row of its own here) divided by its uncertainty; anything else
    (a measurement, a hand kernel on the target) as it is."""
    kind = "generated" if getattr(kernel, "generated", False) else \
        "host" if host_side(kernel, target) else None
    if kind is None or estimate.source not in RELAXED[kind]:
        return estimate
    return type(estimate)(estimate.seconds / estimate.uncertainty, estimate.source,
                          estimate.uncertainty, estimate.from_memory)


class Optimistic:
    """``cost`` (a ``CostModel``) with every unmeasured gated kernel of a plan for ``target``
    at its optimistic time (``optimistic``; ``target`` None: generated kernels only): what
    the profiler plans with to find the gated kernels that could win."""

    def __init__(self, cost, target: str | None = None):
        self.cost, self.target = cost, target

    def __getattr__(self, name: str):
        return getattr(self.cost, name)

    def estimate(self, kernel, signature: str, feats: Features):
        return optimistic(kernel, self.cost.estimate(kernel, signature, feats), self.target)
