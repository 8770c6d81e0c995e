"""A padded CUDA graph's consecutive GEMV steps run as one persistent kernel.

After a decode block's attention, its output projection (+ the residual), the MLP's two
projections (LayerNorm and the activation fused) and the next block's q/k/v projection are
four GEMVs, each reading the one before's result: four launches a block. On an H200 each of
these launches cost ~2.6 us before its first byte, and a layer's four back to back read their
28 MB at 1.4 TB/s of the 4.8 the memory gives (docs/benchmarks.md). A GEMV kernel whose run
function can be a chain's link (``link``: the Triton GEMV configs,
``kernels/triton/templates/matmul.py``) runs with the others of its run as one
``gemv_chain`` launch: a program per SM, a grid-wide barrier between the GEMVs, each
program loading its next weights before the barrier.

A run is consecutive GEMV steps, with only views between them (a view launches nothing: it
names memory, written or not), launched ``matmul.MAX_CHAIN`` at a time. The barrier orders the
GEMVs as the launches did, so a step may read any earlier one's result and write where an
earlier one read. A step whose arguments the runtime makes dense first (``contiguous``) would
copy a result not yet written: it ends a run. The padded capture runs the call at its own
dims first (without the fold) and compares the results, so a chain that went wrong refuses
the graph (``graphs._capture_padded``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

CHAINS = True  # False: no step is chained (to time a decode without: benchmarks/gpu.py)


def fold(instructions: Sequence) -> list:
    """``instructions`` (a padded region's) with each run of GEMV steps (module docstring)
    calling the stand-ins its kernels make (``fn.chained``: ``matmul.chained``, which launches
    them a chain at a time) instead of the kernels' own runs."""
    out = list(instructions)
    if not CHAINS:
        return out
    run: list[int] = []
    for pos, ins in enumerate([*instructions, None]):
        if ins is not None and _linkable(ins):
            run.append(pos)
            continue
        if ins is not None and run and ins.kernel is not None and ins.kernel.view:
            continue  # views launch nothing: the run goes on past them
        if len(run) > 1:
            stand_ins = instructions[run[0]].fn.chained([instructions[p].fn for p in run])
            for p, fn in zip(run, stand_ins):
                out[p] = dataclasses.replace(out[p], fn=fn)
        run = []
    return out


def _linkable(ins) -> bool:
    """Whether the step calls a chain-capable kernel's own run as it is: no argument made
    dense first, nothing stored besides its result, not in place."""
    fn = getattr(ins.kernel, "fn", None)
    return fn is not None and ins.fn is fn and hasattr(fn, "link") and not ins.contiguous \
        and not ins.also and ins.kernel.inplace is None and not ins.kernel.view
