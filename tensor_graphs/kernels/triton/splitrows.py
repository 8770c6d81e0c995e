"""Triton source for a row region split across programs: several programs per row.

``rows.py`` gives each row one program, which walks the whole row once per level of
reductions. A log-softmax over a 50257-wide vocabulary on 4 rows is then 4 programs on a GPU
of 132 SMs: 2.99x torch's time on an H200. Here each row is cut into ``S`` chunks of ``CHUNK``
elements (the launcher picks S so that rows x S fill about two waves of SMs), and a level of
reductions takes two launches:

- ``part<p>`` (rows x S programs): the chunk's partial reductions of level p + 1, computed from
  the inputs and the per-row values of the levels below (as ``rows.looped``'s pass p), reduced
  over the block's lanes, unrounded, into ``part`` (rows, S, NRED);
- ``combine<p>`` (rows programs): the S partials of each reduction combined (a float32 sum,
  rounded to the node's dtype as the reference rounds; ``max`` NaN-propagating) into ``red``
  (rows, NRED);

then ``final`` (rows x S programs) computes the epilogue over its chunk and stores it. Per-row
values that are not reductions (``1 / sum``, ``x - max``'s max) are computed again from
``red`` in each program that needs them: a few scalar ops. ``red`` and ``part`` are scratch
the launcher allocates per call (float32; float64 for float64 regions): inside a CUDA graph
the pool replays them. The sums combine in another order than ``rows.py``'s lanes do, within
the same tolerance.
"""

from __future__ import annotations

from tensor_graphs.ir.ops.names import SUM
from tensor_graphs.kernels.c import rowgen
from tensor_graphs.kernels.c.rowgen import RowRegion
from tensor_graphs.kernels.triton import exprs, rows
from tensor_graphs.kernels.triton.render import Rendered, constants_of, source_key

SCRATCH = ("red_ptr", "part_ptr", "S", "CHUNK")  # arguments every split kernel takes last


def levels(region: RowRegion) -> int:
    """Levels of dependent reductions: a softmax has 2 (max, then the sum of exps)."""
    return region.level[region.root]


def accumulates_in(region: RowRegion) -> str:
    """The scratch dtype: float64 where a reduction computes in float64, else float32."""
    return "float64" if any(exprs.compute(r.dtype) == "tl.float64"
                            for r in region.reductions) else "float32"


def render(region: RowRegion) -> Rendered:
    """The split module of a row region (see the module docstring)."""
    base = rows.render(region)  # (arguments and constants as the one-program kernels')
    table, knames = constants_of(list(region.consts), region.consts)
    nin = len(region.inputs)
    params = ["out_ptr"] + [f"x{k}_ptr" for k in range(nin)] + ["R", "D"]
    params += [f"z{j}" for j in range(1, rows.MAX_LEADING)]
    for k in range(nin):
        params += [f"s{k}_{j}" for j in range(rows.MAX_LEADING)] + \
            ([f"r{k}"] if base.full[k] else [])
    params += list(SCRATCH)
    signature = ", ".join(params)
    scratch = "*fp64" if accumulates_in(region) == "float64" else "*fp32"
    arguments = base.arguments + (("red_ptr", scratch), ("part_ptr", scratch), ("S", "i32"),
                                  ("CHUNK", "i32"))
    position = {n: k for k, n in enumerate(region.inputs)}
    index = {n: i for i, n in enumerate(region.nodes)}
    slot = {r: j for j, r in enumerate(region.reductions)}
    out, names = [], []
    for p in range(levels(region)):
        out += ["", *_part(region, signature, knames, position, index, slot, p), ""]
        out += ["", *_combine(region, signature, index, slot, p), ""]
        names += [f"part{p}", f"combine{p}"]
    out += ["", *_final(region, signature, knames, position, index, slot), ""]
    names.append("final")
    title = "split " + rowgen.summary(region)
    helpers = exprs.helpers_used(region.nodes, reductions=bool(region.reductions))
    lines = exprs.module_head(title, [("NEG_INF", 'float("-inf")'),
                                      ("NRED", str(len(region.reductions))), *table], helpers)
    source = "\n".join(lines + out)
    return Rendered(source, source_key(source), "split_rows", tuple(names), arguments,
                    base.input_dtypes, base.out_dtype, title, base.full)


def _def(name: str, signature: str) -> list[str]:
    return ["@triton.jit", f"def {name}({signature},",
            "        RANK: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr):"]


def _head(region: RowRegion, knames: dict) -> tuple[list[str], dict]:
    """``rows._head`` for a program of (row, chunk): row = program // S."""
    lines, names = rows._head(region, knames, False)  # noqa: SLF001
    assert lines[:4] == ["    if WIDE:", "        row = tl.program_id(0).to(tl.int64)",
                         "    else:", "        row = tl.program_id(0)"]
    lines = ["    if WIDE:", "        pid = tl.program_id(0).to(tl.int64)", "    else:",
             "        pid = tl.program_id(0)", "    row = pid // S", "    split = pid % S",
             "    start = split * CHUNK", "    stop = tl.minimum(start + CHUNK, D)", *lines[4:]]
    return lines, names


def _per_row(region: RowRegion, upto: int, index: dict, slot: dict, names: dict,
             lines: list[str]) -> None:
    """The reductions of levels 1..``upto`` read from ``red``, and the per-row values of
    levels 0..``upto`` computed from them, in the region's order."""
    for n in region.nodes:
        if n not in region.per_row or region.level[n] > upto:
            continue
        if n.op.name in rowgen.REDUCTIONS:
            lines.append(f"    v{index[n]} = tl.load(red_ptr + row * NRED + {slot[n]})")
        else:
            args = [names[a] for a in n.inputs]
            lines.append(f"    v{index[n]} = {exprs.node_expr(n, args, region.consts)}")
        names[n] = f"v{index[n]}"


def _loop(region: RowRegion, targets, names: dict, position: dict, index: dict,
          lines: list[str]) -> dict:
    """The loop over the program's chunk computing ``targets``; returns the loop's names."""
    computes = rows._closure(targets, region)  # noqa: SLF001
    local = dict(names)
    lines += ["    for j0 in range(start, stop, BLOCK):",
              "        cols = j0 + tl.arange(0, BLOCK)",
              "        if WIDE:",
              "            cols = cols.to(tl.int64)",
              "        mask = cols < stop"]
    for x in rows._loads(computes, targets, region):  # noqa: SLF001
        k = position[x]
        lines.append(rows._load_full(k, x, "cols", "mask", "        ", f"a{k}"))  # noqa: SLF001
        local[x] = f"a{k}"
    for n in computes:
        expr = exprs.node_expr(n, [local[a] for a in n.inputs], region.consts)
        lines.append(f"        w{index[n]} = {expr}")
        local[n] = f"w{index[n]}"
    return local


def _part(region: RowRegion, signature: str, knames: dict, position: dict, index: dict,
          slot: dict, p: int) -> list[str]:
    lines, names = _head(region, knames)
    lines = _def(f"part{p}", signature) + lines
    _per_row(region, p, index, slot, names, lines)
    reduces = [r for r in region.reductions if region.level[r] == p + 1]
    for r in reduces:
        ct = exprs.compute(r.dtype)
        init = f"tl.zeros([BLOCK], {ct})" if r.op.name == SUM else \
            f"tl.full([BLOCK], NEG_INF, {ct})"
        lines.append(f"    acc{index[r]} = {init}")
    local = _loop(region, [r.inputs[0] for r in reduces], names, position, index, lines)
    for r in reduces:
        a = f"acc{index[r]}"
        kept = f"tl.where(mask, {local[r.inputs[0]]}, {rows.ZERO[r.op.name]})"
        step = f"{a} + {kept}" if r.op.name == SUM else f"_max_nan({a}, {kept})"
        lines.append(f"        {a} = {step}")
    for r in reduces:  # the chunk's partial, unrounded
        a = f"acc{index[r]}"
        total = f"tl.sum({a}, axis=0)" if r.op.name == SUM else f"tl.reduce({a}, 0, _max_nan)"
        lines.append(f"    tl.store(part_ptr + (row * S + split) * NRED + {slot[r]}, {total})")
    return lines


def _combine(region: RowRegion, signature: str, index: dict, slot: dict, p: int
             ) -> list[str]:
    """One program per row: BLOCK (>= S) lanes over the row's partials."""
    lines = _def(f"combine{p}", signature) + [
        "    if WIDE:",
        "        row = tl.program_id(0).to(tl.int64)",
        "    else:",
        "        row = tl.program_id(0)",
        "    s = tl.arange(0, BLOCK)",
        "    live = s < S"]
    for r in region.reductions:
        if region.level[r] != p + 1:
            continue
        load = f"tl.load(part_ptr + (row * S + s) * NRED + {slot[r]}, mask=live, " \
               f"other={rows.ZERO[r.op.name]})"
        lines.append(f"    q{index[r]} = {load}")
        lines.append(f"    tl.store(red_ptr + row * NRED + {slot[r]}, "
                     f"{rows._reduce(r, f'q{index[r]}')})")  # noqa: SLF001
    return lines


def _final(region: RowRegion, signature: str, knames: dict, position: dict, index: dict,
           slot: dict) -> list[str]:
    lines, names = _head(region, knames)
    lines = _def("final", signature) + lines
    _per_row(region, levels(region), index, slot, names, lines)
    local = _loop(region, [region.root], names, position, index, lines)
    lines.append(f"        tl.store(out_ptr + row * D + cols, {local[region.root]}"
                 f".to({exprs.storage(region.root.dtype)}), mask=mask)")
    return lines


__all__ = ["SCRATCH", "accumulates_in", "levels", "render"]
