"""Argmax over the last axis from ``argmax_jit.py``: a row split over many programs.

A decode step ends by choosing its token, the argmax of 50257 logits (GPT-2) in one row. torch's
CUDA argmax reduces a row in one block: on an H200 it took 16.7 us a token, of a step's ~580.
Here the row is split into chunks over enough programs to fill the GPU, and the last chunk of
a row to finish picks among the chunks' answers (counted in ``arrival_counters``; a second
kernel does it where no counters can be made, inside a CUDA graph's capture), as the GEMV's
last split adds its parts.

Pattern ``argmax(x, axis, keepdims)`` over x's last axis (``axis=None`` on a 1-D x), any float
dtype, any strides; int64 indices, numpy's rule (the first maximum; a NaN counts as the
maximum).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tensor_graphs.kernels.registry import Occupancy
from tensor_graphs.kernels.signatures import Spec
from tensor_graphs.kernels.triton.templates.runtime import (
    EXACT,
    PROGRAMS,
    arrival_counters,
    deliver,
    float_dtypes,
    grid_fits,
    interpreted,
    ints,
    jit,
    next_power_of_2,
    register_configs,
    target,
    torch,
)

JIT = "argmax_jit"
COMBINE_WARPS = 4
MAX_LENGTH = 2**31 - 1  # indices are int32 inside the kernel


@dataclass(frozen=True)
class Config:
    block: int  # a program's lanes: the row is read BLOCK values at a time
    max_splits: int
    warps: int

    @property
    def label(self) -> str:
        return f"b{self.block}s{self.max_splits}"


CONFIGS = (
    Config(1024, 64, 4),  # a vocabulary row (32k-150k): up to 64 chunks of 1024+
    Config(4096, 16, 8),  # fewer, longer chunks: less to pick among at the end
)


def splits_for(cfg: Config, rows: int, n: int) -> tuple[int, int]:
    """(splits, values per split): enough splits for ``PROGRAMS`` programs in all, at most the
    config's, each a whole number of blocks and none empty."""
    blocks = max(1, -(-n // cfg.block))
    want = max(1, min(cfg.max_splits, blocks, -(-PROGRAMS // max(1, rows))))
    chunk = -(-blocks // want) * cfg.block
    return max(1, -(-n // chunk)), chunk


def argmax(cfg: Config, x, axis, keepdims, out=None):
    n = x.shape[-1] if x.ndim else 1
    lead = tuple(x.shape[:-1])
    shape = lead + (1,) if keepdims else lead
    if axis is None and keepdims:  # the reference flattens: keepdims gives (1,)
        shape = (1,)
    o = target(shape, x, out, torch.int64)
    rows = math.prod(lead)
    if rows:
        x2 = x.reshape(rows, n)  # a view unless the leading axes cannot merge
        splits, chunk = splits_for(cfg, rows, n)
        mod = jit(JIT)
        counters = None if splits == 1 else arrival_counters(x.device, rows)
        part_v = part_i = o
        if splits > 1:
            part_v = torch.empty(rows * splits, dtype=torch.float32, device=x.device)
            part_i = torch.empty(rows * splits, dtype=torch.int32, device=x.device)
        mod.argmax_split[(rows, splits)](
            x2, o, part_v, part_i, o if counters is None else counters, n, chunk,
            x2.stride(0), x2.stride(1), BLOCK=cfg.block, BLOCK_S=split_block(cfg),
            FINISH=splits == 1, LAST_PICKS=counters is not None, num_warps=cfg.warps)
        if splits > 1 and counters is None:
            mod.argmax_combine[(rows,)](part_v, part_i, o, splits, n,
                                        BLOCK_S=split_block(cfg), num_warps=COMBINE_WARPS)
    return deliver(o, out)


def split_block(cfg: Config) -> int:
    """The pick's block over a row's chunks: every split of the config at once."""
    return max(2, next_power_of_2(cfg.max_splits))


def occupancy(cfg: Config):
    def of(shapes) -> Occupancy:
        x = tuple(shapes[0])
        rows, n = math.prod(x[:-1]), (x[-1] if x else 1)
        return Occupancy(max(1, rows * splits_for(cfg, rows, n)[0]))

    return of


def constraint(dtypes: tuple[str, ...], name: str = "", cfg: Config | None = None):
    def fits(shapes, dts, attrs):
        x = tuple(shapes[0])
        if dts[0].name not in dtypes:
            return f"dtype {dts[0].name}; accepts {', '.join(dtypes)}"
        axis = attrs.get("axis")
        if axis is None:
            if len(x) != 1:
                return (f"axis=None flattens a {len(x)}-D input; this kernel reduces the last "
                        "axis (torch's kernel covers it)")
        elif len(x) == 0 or axis not in (len(x) - 1, -1):
            return f"reduces the last axis only, got axis {axis} of a {len(x)}-D input"
        if not ints(x):
            return True
        if x[-1] == 0:
            return "argmax of an empty axis has no index"
        if x[-1] > MAX_LENGTH:
            return f"rows up to {MAX_LENGTH} values (int32 indices), got {x[-1]}"
        if cfg is None:
            return True
        rows = math.prod(x[:-1])
        return grid_fits(name, rows, x)

    return fits


def signatures(dtypes: tuple[str, ...]):
    """Verification cases: tiny in the interpreter (still several chunks a row), a vocabulary
    row on a GPU; ties everywhere in half of them (the first maximum must win)."""
    def cases():
        table = [((7,), None, False, "normal"), ((3, 50), 1, True, "ties"),
                 ((2, 3, 300), -1, False, "normal"), ((1, 5000), 1, False, "ties"),
                 ((4, 1), -1, True, "normal"), ((9,), 0, True, "ties")]
        if not interpreted():
            table += [((1, 50257), -1, False, "normal"), ((128, 50257), -1, False, "ties")]
        return [{"x": Spec(shape, dt, values), "attrs": {"axis": axis, "keepdims": keep}}
                for dt in dtypes
                for shape, axis, keep, values in (table if dt == dtypes[0] else table[:4])]

    return cases


def function(cfg: Config):
    def run(x, axis, keepdims, *, out=None):
        return argmax(cfg, x, axis, keepdims, out)

    run.__doc__ = (f"Index of the first maximum over the last axis (a NaN counts as the "
                   f"maximum), the row split over programs ({cfg.label}).")
    return run


def register() -> None:
    dtypes = float_dtypes()
    register_configs("argmax", JIT, CONFIGS, "triton_argmax", function,
                     lambda cfg, name: {"where": constraint(dtypes, name, cfg),
                                        "occupancy": occupancy(cfg)},
                     dtypes=None, tolerance=EXACT, signatures=signatures(dtypes))
