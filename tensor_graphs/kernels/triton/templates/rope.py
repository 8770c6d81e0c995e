"""RoPE kernels from ``rope_jit.py`` on the ``rotary_embedding`` pattern (torch's kernel's).

x, cos and sin share one float dtype and broadcast to a shape of rank <= 4 whose last axis (the
head dim) is even; cos and sin cover the whole head dim (``cat(freqs, freqs)``). Two configs:
a few rows per program (decode, short sequences) or many. The programs are on grid axis 0 (CUDA's
axes 1 and 2 stop at 65535 blocks, which the row blocks of ~262k tokens pass).
"""

from __future__ import annotations

from dataclasses import dataclass

from tensor_graphs.kernels.triton.templates.runtime import (
    ELEMENTWISE,
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

JIT = "rope_jit"
MAX_RANK = 4


@dataclass(frozen=True)
class Config:
    block_r: int
    warps: int

    @property
    def label(self) -> str:
        return f"r{self.block_r}"


CONFIGS = (
    Config(4, 2),  # a few rows per program: decode, where C (the rows) is 1
    Config(16, 4),  # prefill: 16 rows per program
)


def rope(cfg: Config, x, cos, sin, out=None):
    shape = tuple(torch.broadcast_shapes(x.shape, cos.shape, sin.shape))
    o = target(shape, x, out)
    if o.numel():
        full = (1,) * (MAX_RANK - len(shape)) + shape
        views = [t.expand(shape).reshape(full) for t in (x, cos, sin)]  # views: 1s prepended
        o4 = o.view(full)
        a, b, c, d = full
        grid = (programs(cfg, full),)
        strides = [s for t in views + [o4] for s in t.stride()]
        jit(JIT).rope[grid](*views, o4, a * b, b, c, d // 2, *strides, BLOCK_R=cfg.block_r,
                            BLOCK_H=next_power_of_2(d // 2), num_warps=cfg.warps)
    return deliver(o, out)


def programs(cfg: Config, full: tuple) -> int:
    """The launch's programs for the (A, B, C, D) shape: a block of rows of each (a, b)."""
    a, b, c, _ = full
    return a * b * -(-c // cfg.block_r)


def _broadcast(*shapes: tuple) -> tuple:
    """numpy's broadcast of shapes that ``fits`` has checked, 1s prepended to rank 4."""
    rank = max(len(s) for s in shapes)
    padded = [(1,) * (rank - len(s)) + s for s in shapes]
    shape = tuple(max(dims) if min(dims) else 0 for dims in zip(*padded))
    return (1,) * (MAX_RANK - rank) + shape


def fits(shapes, dtypes, attrs):
    """One dtype, a broadcast shape of rank <= 4 with an even last axis that cos and sin
    cover."""
    if len(set(dtypes)) > 1:
        return "x, cos and sin must share one dtype"
    x, c, s = (tuple(t) for t in shapes)
    rank = max(len(x), len(c), len(s))
    if rank > MAX_RANK or not x:
        return f"x, cos and sin broadcast to rank 1..{MAX_RANK}, got {x}, {c}, {s}"
    if ints(x, c, s) and (x[-1] % 2 or c[-1:] != x[-1:] or s[-1:] != x[-1:]):
        return f"an even head dim that cos and sin cover: x {x}, cos {c}, sin {s}"
    return True


def fits_grid(name: str, cfg: Config):
    """``fits``, then that the config's launch fits CUDA's grid."""
    def check(shapes, dtypes, attrs):
        why = fits(shapes, dtypes, attrs)
        if why is not True or not ints(*shapes):
            return why
        full = _broadcast(*(tuple(t) for t in shapes))
        return grid_fits(name, programs(cfg, full), shapes[0])

    return check


def signatures(dtypes: tuple[str, ...]):
    def cases():
        table = [((1, 2, 7, 8), (7, 8)), ((2, 33, 4), (33, 4)), ((1, 1, 1, 2), (1, 2)),
                 ((2, 5, 3, 6), (2, 1, 3, 6)), ((3, 10), (3, 10))]
        if not interpreted():
            table += [((1, 1025, 2), (1025, 2)), ((1, 12, 128, 64), (1, 1, 128, 64))]
        return [{"x": (x, dt), "cos": (c, dt), "sin": (c, dt)}
                for dt in dtypes for x, c in (table if dt == dtypes[0] else table[:2])]

    return cases


def function(cfg: Config):
    def run(x, cos, sin, *, out=None):
        return rope(cfg, x, cos, sin, out)

    run.__doc__ = (f"x * cos + rotate_half(x) * sin in fp32, one Triton kernel "
                   f"({cfg.block_r} rows a program).")
    return run


def register() -> None:
    dtypes = float_dtypes()
    register_configs("rotary_embedding", JIT, CONFIGS, "triton_rotary_embedding", function,
                     lambda cfg, name: {"where": fits_grid(name, cfg)},
                     dtypes=dtypes, tolerance=ELEMENTWISE, signatures=signatures(dtypes))
