"""Embedding kernels from ``gather_jit.py`` on the ``embedding`` pattern (torch's kernel's).

ids of any shape and integer dtype, a 2-D float table of any strides; the result is
ids.shape + (dim,). Out-of-range ids give NaN rows (see ``gather_jit``): the reference raises
there, and a GPU kernel can neither raise nor afford a host sync to check first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tensor_graphs.kernels.signatures import Spec
from tensor_graphs.kernels.triton.templates.runtime import (
    EXACT,
    deliver,
    float_dtypes,
    grid_fits,
    interpreted,
    ints,
    jit,
    register_configs,
    target,
)

JIT = "gather_jit"


@dataclass(frozen=True)
class Config:
    block_r: int
    block_d: int
    warps: int

    @property
    def label(self) -> str:
        return f"r{self.block_r}d{self.block_d}"


CONFIGS = (
    Config(4, 256, 4),  # few ids (decode): wide column blocks
    Config(16, 128, 4),  # many ids (prefill)
)


def embedding(cfg: Config, ids, table, out=None):
    d = table.shape[1]
    shape = tuple(ids.shape) + (d,)
    o = target(shape, table, out)
    n = math.prod(ids.shape)
    if n and d:
        flat = ids.reshape(n)
        grid = (programs(cfg, n, d),)
        jit(JIT).embedding[grid](flat, table, o, n, table.shape[0], d, flat.stride(0),
                                 table.stride(0), table.stride(1), BLOCK_R=cfg.block_r,
                                 BLOCK_D=cfg.block_d, num_warps=cfg.warps)
    return deliver(o, out)


def programs(cfg: Config, n: int, d: int) -> int:
    """The launch's programs, all on grid axis 0: a block of ids x a block of columns."""
    return -(-n // cfg.block_r) * -(-d // cfg.block_d)


def _fits(tables: tuple[str, ...], name: str = "", cfg: Config | None = None):
    def fits(shapes, dtypes, attrs):
        if not dtypes[0].is_int:
            return "ids must be integers"
        if dtypes[1].name not in tables:
            return f"the table's dtype must be one of {', '.join(tables)}"
        if len(shapes[1]) != 2:
            return f"the table must be 2-D (rows, dim), got {tuple(shapes[1])}"
        if cfg is None or not ints(*shapes):
            return True
        n, d = math.prod(shapes[0]), shapes[1][1]
        return grid_fits(name, programs(cfg, n, d), tuple(shapes[0]) + (d,))

    return fits


def signatures(tables: tuple[str, ...]):
    def cases():
        table = [((7,), "int64", (33, 5)), ((2, 3), "int32", (7, 4)), ((1,), "int64", (1, 1)),
                 ((5, 1), "int64", (40, 300))]  # blocks of ids x blocks of columns
        if not interpreted():
            table += [((33,), "int64", (1025, 3)), ((1, 128), "int64", (50257, 768))]
        return [{"ids": Spec(i, it, "index", t[0]), "table": (t, dt)}
                for dt in tables for i, it, t in (table if dt == tables[0] else table[:2])]

    return cases


def function(cfg: Config):
    def run(ids, table, *, out=None):
        return embedding(cfg, ids, table, out)

    run.__doc__ = f"Rows of table picked by ids, one Triton kernel ({cfg.label})."
    return run


def register() -> None:
    tables = float_dtypes() + ("float64",)
    register_configs("embedding", JIT, CONFIGS, "triton_embedding", function,
                     lambda cfg, name: {"where": _fits(tables, name, cfg)},
                     dtypes=None, tolerance=EXACT, signatures=signatures(tables))
