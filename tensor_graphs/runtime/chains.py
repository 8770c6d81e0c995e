"""A padded CUDA graph's consecutive GEMV and decode attention steps run as persistent chains.

A decode block's steps on a GPU are its q/k/v projection, its attention (appending the new
key and value rows to the caches: ``runtime/appends.py``), its output projection (+ the
residual) and the MLP's two projections (LayerNorm and the activation fused): five launches a
block, each reading the one before's result. On an H200 each such launch cost ~2.6 us before
its first byte, and a layer's four GEMVs back to back read their 28 MB at 1.4 TB/s of the 4.8
the memory gives (docs/benchmarks.md). A kernel whose run function can be a chain's stage
(``link``: the Triton GEMV configs and decode attention, ``kernels/triton/templates/chain.py``)
runs with the others of its run as one persistent launch: a program per SM, a grid-wide
barrier between stages, each program loading its next weights before the barrier.

A run is consecutive such steps, with only steps that launch nothing between them (views,
and the appends a decode attention took over, which only view the caches with room: a view
names memory, written or not), launched ``chain.MAX_CHAIN`` at a time: a GPT-2 token's
twelve blocks, twelve launches. The barrier orders the stages as the launches did, so a step
may read any earlier one's result and write where an earlier one read. A step whose
arguments the runtime makes dense first (``contiguous``) ends a run when it is a chain's
own (it would copy an argument not yet written); a view that needs dense arguments (a
reshape) is made dense by the fold instead, after launching the stages before it, where an
argument is not (a batch of two's q/k/v slices: their copies read the projection's result,
which must be written by then; a padded capture's check would not see it, its own run
having left the same values there). The padded capture runs the call at its own dims first
(without the fold) and compares the results, so a chain that went wrong otherwise refuses
the graph (``graphs._capture_padded``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tensor_graphs.runtime import values as dv
from tensor_graphs.runtime.graphs import grown

CHAINS = True  # False: no step is chained (to time a decode without: benchmarks/gpu.py)


def fold(instructions: Sequence) -> list:
    """``instructions`` (a padded region's) with each run of chainable steps (module
    docstring) calling the stand-ins their kernels make (``fn.chained``: ``chain.chained``,
    which launches them a chain at a time) instead of the kernels' own runs."""
    out = list(instructions)
    if not CHAINS:
        return out
    run: list[int] = []
    between: list[int] = []  # the run's steps that launch nothing and read dense arguments
    for pos, ins in enumerate([*instructions, None]):
        if ins is not None and _linkable(ins):
            run.append(pos)
            continue
        if ins is not None and run and _launches_nothing(ins):
            if ins.contiguous:
                between.append(pos)
            continue  # the run goes on past it
        if len(run) > 1:
            stand_ins = instructions[run[0]].fn.chained([instructions[p].fn for p in run])
            for p, fn in zip(run, stand_ins):
                out[p] = dataclasses.replace(out[p], fn=fn)
            for q in between:  # the stages before it launched first where it must copy
                before = max(i for i, p in enumerate(run) if p < q)
                out[q] = dataclasses.replace(out[q], contiguous=False,
                                             fn=_dense_after(out[q].fn, stand_ins[before]))
        run, between = [], []
    return out


def _dense_after(fn, member):
    """``fn`` (a view reading dense arguments) making them dense itself, as the runtime did
    before calling it, after launching what its chain holds so far (``member.flush``: the
    stage before it, if a stand-in) where one is not: its copy reads what they write."""
    flush = getattr(member, "flush", None)

    def run(*args, **attrs):
        if not all(dv.is_dense(a) for a in args):
            if flush is not None:
                flush()
            args = [dv.dense(a) for a in args]
        return fn(*args, **attrs)
    return run


def _linkable(ins) -> bool:
    """Whether the step calls a chain-capable run of its kernel (its own, or the one taking
    over appends) as it is: no argument made dense first (it would copy one not yet written:
    a launch of its own), nothing stored besides its result, not in place."""
    return ins.kernel is not None and hasattr(ins.fn, "link") and not ins.contiguous \
        and not ins.also and ins.kernel.inplace is None and not ins.kernel.view


def _launches_nothing(ins) -> bool:
    """A view, or an append whose rows a decode attention writes (``appends.grown``)."""
    return ins.fn is grown or (ins.kernel is not None and ins.kernel.view)
