"""Persistent chains: a decode step's consecutive GEMVs and decode attentions as one launch.

``chain(links)`` runs its links (``matmul.Link``: a GEMV; ``attention.DecodeLink``: a decode
attention) in order as one kernel (``chain_jit.chain``): a program per SM, a grid-wide barrier
between stages, each program loading its next GEMV's first weights before the barrier where
they are bound, and asking L2 for its share of the GEMV's after that (``L2_PREFETCH``).
``chained(runs)`` makes the stand-ins with which a padded CUDA graph runs a run of such steps
as chains (``runtime/chains.py``): a GPT-2 decode block's attention, output projection, MLP
and the next block's q/k/v projection become one launch.

A link gives the chain its arguments through ``prepare(early) -> Prepared`` and runs alone
through ``alone()``; ``target()`` is the tensor its result is written to, and ``copies()``
says whether preparing it copies an argument (a copy reads it at once, so the stages before
must launch first).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

from tensor_graphs.kernels.triton.templates.runtime import (
    as_tensor,
    deliver,
    interpreted,
    jit,
    pdl,
    torch,
)

JIT = "chain_jit"
MAX_CHAIN = 5  # the most stages a chain runs: a decode block's attention and four GEMVs
SPIN = 1 << 24  # polls of a chain's barrier before it gives up (seconds): never a hung GPU
L2_PREFETCH = True  # each program asks L2 for the next GEMV stage's weights (chain_jit)
_SYNC: dict = {}
_BROKEN: list[str] = []  # why the chain kernel failed to compile or launch here, once it did


@dataclass(frozen=True)
class Prepared:
    """A link's arguments for the chain kernel: its stage tuple and constexprs (kind and
    prefetch first: ``chain_jit``), the tensor it writes, its rows (a GEMV's: the kernel's
    one ``M``; None for an attention) and its norm's eps (the kernel's one ``eps``; None
    without a norm), and its config's warps and pipeline stages."""

    stage: tuple
    constexprs: tuple
    result: object
    rows: int | None
    eps: float | None
    warps: int
    stages: int


def chain_sync(device):
    """The int32 counters of a chain's barriers on ``device``: [arrived, left, failed,
    unused]. Made outside a capture (the first chain call's), kept for the process: a graph
    holds their address. ``failed`` is 1 once a barrier stopped waiting (``chain_failed``)."""
    found = _SYNC.get(str(device))
    if found is None:
        found = _SYNC[str(device)] = torch.zeros(4, dtype=torch.int32, device=device)
    return found


def chain_failed(device) -> bool:
    """Whether a chain's barrier on ``device`` stopped waiting since the counters were made:
    its programs were not all resident at once (a GPU shared with another process's
    kernels), so its results are wrong. Reads the GPU."""
    return bool(chain_sync(device)[2].item())


def chain_programs(device) -> int:
    """A chain's programs: one per GPU unit (SM), each resident for the whole kernel, as its
    barriers need; four in the interpreter, where stages run one at a time (so a program
    still deals several units of each)."""
    if device.type != "cuda" or interpreted():
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def chain(links, programs: int | None = None) -> list:
    """The links in order, each usually reading the result of one before it, as one
    persistent kernel rather than a launch each. Returns each link's result. In the
    interpreter each stage is a launch of its own (``ONLY``). Refuses (ValueError,
    RuntimeError) what it cannot run: no link or more than ``MAX_CHAIN``, GEMVs of different
    rows or norms of different eps, an empty product, no arrival counters inside a
    capture."""
    links = list(links)
    if not 1 <= len(links) <= MAX_CHAIN:
        raise ValueError(f"chain: 1 to {MAX_CHAIN} stages, got {len(links)}")
    device = links[0].target().device
    options = pdl(device)
    prepared = [link.prepare(i > 0 or options["PDL"]) for i, link in enumerate(links)]
    rows = [p.rows for p in prepared if p.rows is not None]
    if len(set(rows)) > 1:
        raise ValueError(f"chain: every GEMV of a chain has the same rows: got {rows}")
    norms = sorted({p.eps for p in prepared if p.eps is not None})
    if len(norms) > 1:  # (the kernel takes one eps: a model's norms share theirs)
        raise ValueError(f"chain: every norm of a chain has the same eps: got {norms}")
    eps = norms[0] if norms else 0.0
    grid = (programs or chain_programs(device),)
    sync = chain_sync(device)
    consts = tuple(p.constexprs for p in prepared)
    stages = tuple(p.stage for p in prepared)
    mod = jit(JIT)
    for only in (range(len(links)) if interpreted() else (-1,)):
        mod.chain[grid](sync, rows[0] if rows else 1, eps, stages, CONSTS=consts,
                        STAGES=len(links), ONLY=only, SPIN=SPIN,
                        L2=L2_PREFETCH and not interpreted(),
                        num_warps=max(p.warps for p in prepared),
                        num_stages=min(p.stages for p in prepared), **options)
    return [deliver(p.result, link.out) for link, p in zip(links, prepared)]


def chained(runs) -> list:
    """Functions standing in for consecutive kernel calls (``runs``: their kernels' run
    functions, each with ``link``) so that each ``MAX_CHAIN`` of them launch as one
    ``chain``: each returns the tensor its result will be in (its out= place) and launches
    nothing but the group's last, which launches the group. A call whose out= place the
    kernel cannot write (another device, layout or dtype) first launches those before it,
    then runs alone; a chain the kernel refuses runs its links one by one, in order. What
    runs between the calls must launch nothing that reads their results
    (``runtime/chains.py`` folds only where that holds)."""
    runs = list(runs)
    if _BROKEN:
        return runs
    out = []
    for start in range(0, len(runs), MAX_CHAIN):
        group = runs[start:start + MAX_CHAIN]
        out += _group(group) if len(group) > 1 else group
    return out


def _group(runs: list) -> list:
    """``chained``'s stand-ins for one launch's calls."""
    pending: list = []

    def launch() -> None:
        links = list(pending)
        pending.clear()
        if not links:
            return
        try:
            chain(links)
        except (ValueError, RuntimeError):  # refused here (rows, counters): one by one
            for link in links:
                link.alone()
        except Exception as exc:  # noqa: BLE001 - Triton's compile errors have no common base
            if not _BROKEN:  # this GPU or Triton cannot build the chain: never tried again
                _BROKEN.append(f"{type(exc).__name__}: {str(exc).strip()[:300]}")
                warnings.warn(f"the persistent chain kernel failed ({_BROKEN[0]}); its "
                              "kernels run one launch each from now on", RuntimeWarning,
                              stacklevel=2)
            for link in links:
                link.alone()

    def member(run, last: bool):
        def step(*args, out=None, **attrs):
            link = run.link(*args, out=out, **attrs)
            if link.copies():  # its copy of an argument reads what the stages before write
                launch()
            c = link.target()
            if out is not None and not _written_in(c, out):
                launch()
                return run(*args, out=out, **attrs)
            pending.append(dataclasses.replace(link, out=c))
            if last:
                launch()
            return c if out is None else out
        step.stands_for, step.flush = run, launch  # (flush: what a copy between needs)
        return step

    return [member(run, i == len(runs) - 1) for i, run in enumerate(runs)]


def _written_in(c, out) -> bool:
    """Whether the kernel writes its result ``c`` in ``out`` itself (``target``: a numpy
    buffer of the simulated GPU is viewed as a tensor), so nothing is copied after it."""
    t = as_tensor(out)
    return t.device == c.device and t.data_ptr() == c.data_ptr()
