"""Triton source for a row region (``rowgen.RowRegion``): one program per row.

Two kernels share the row's addressing. ``persistent`` holds whole rows in one block
(BLOCK = the next power of two >= D; the launch picks it up to the configuration's limit), ROWS
of them at once ([ROWS, BLOCK]: short rows share a program): each node is one statement in
topological order, a reduction is ``tl.sum``/``tl.reduce`` along the block's rows, a per-row
value a column. ``looped`` runs one loop over the row's blocks per level of dependent
reductions, as ``rowgen``'s passes do, accumulating each reduction in a block of lanes combined
after the loop; full values a later pass needs are computed again from the inputs (the row is
in cache: no row buffers), and the last loop computes the epilogue and stores it. Per-row
values (a reduction's result, what is computed from it, per-row inputs) are scalars.

Sums accumulate in float32 (float64 rows in float64) and a half-precision sum is rounded once
at its end, as numpy sums float16; ``max`` propagates NaN (``exprs``' ``_max_nan`` as the
combine). Elementwise ops are ``exprs.node_expr``. Rows are addressed as ``rowgen`` lays them
out: the leading dims merged (``rowgen._layout``), right-aligned in MAX_LEADING slots with
each input's strides; a full input also has its stride along the row, a per-row input none.
``WIDE`` (the launcher's: an operand reaches 2**31 elements) makes the row index and the
column index int64, so a row read with a stride (a transposed input: column x stride) does
not wrap in int32 either.
"""

from __future__ import annotations

from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import MAX, SUM
from tensor_graphs.kernels.c import rowgen
from tensor_graphs.kernels.c.rowgen import RowRegion
from tensor_graphs.kernels.triton import exprs
from tensor_graphs.kernels.triton.render import Rendered, constants_of, offsets, source_key

MAX_LEADING = 3  # merged leading dims a kernel indexes; more and the inputs are made contiguous
ZERO = {SUM: "0.0", MAX: "NEG_INF"}  # a reduction's identity: what masked lanes hold


def _closure(targets, region: RowRegion) -> list[Node]:
    """The full nodes computing ``targets``, inputs before users (inputs, constants and
    per-row values excluded: those are loaded or already computed)."""
    order: list[Node] = []
    seen: set[Node] = set()
    stack: list[tuple[Node, bool]] = [(t, False) for t in reversed(targets)]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if n in seen or n in region.consts or n in region.per_row or n in region.inputs:
            continue
        seen.add(n)
        stack.append((n, True))
        stack.extend((i, False) for i in reversed(n.inputs))
    return order


def _loads(nodes, targets, region: RowRegion) -> list[Node]:
    """The full inputs that ``nodes`` and ``targets`` read, in argument order."""
    read = set(targets) | {i for n in nodes for i in n.inputs}
    return [x for x in region.inputs if x in read and x not in region.per_row]


def render(region: RowRegion) -> Rendered:
    """The Triton module of a row region (see the module docstring)."""
    consts = list(region.consts)
    table, knames = constants_of(consts, region.consts)
    nin = len(region.inputs)
    full = tuple(n not in region.per_row for n in region.inputs)
    params = ["out_ptr"] + [f"x{k}_ptr" for k in range(nin)] + ["R", "D"]
    params += [f"z{j}" for j in range(1, MAX_LEADING)]
    for k in range(nin):
        params += [f"s{k}_{j}" for j in range(MAX_LEADING)] + ([f"r{k}"] if full[k] else [])
    args = [("out_ptr", exprs.pointer(region.root.dtype))]
    args += [(f"x{k}_ptr", exprs.pointer(n.dtype)) for k, n in enumerate(region.inputs)]
    args += [(p, "i32") for p in params[1 + nin:]]
    position = {n: k for k, n in enumerate(region.inputs)}
    signature = ", ".join(params)
    kernels = [_persistent(region, signature, _head(region, knames, True)),
               _looped(region, signature, _head(region, knames, False), position)]
    title = rowgen.summary(region)
    helpers = exprs.helpers_used(region.nodes, reductions=bool(region.reductions))
    lines = exprs.module_head(title, [("NEG_INF", 'float("-inf")'), *table], helpers)
    source = "\n".join(lines + ["", *kernels[0], "", "", *kernels[1], ""])
    return Rendered(source, source_key(source), "rows", ("persistent", "looped"), tuple(args),
                    tuple(n.dtype for n in region.inputs), region.root.dtype, title, full)


def _head(region: RowRegion, knames: dict, block_of_rows: bool) -> tuple[list[str], dict]:
    """The statements every kernel starts with: its row (a block of ROWS rows for the
    persistent kernel, masked by ``live``), each input's offset there, the constants, the
    per-row inputs (a column of ROWS values); and the names of those values."""
    nin = len(region.inputs)
    if block_of_rows:
        lines = ["    if WIDE:",
                 "        row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)",
                 "    else:",
                 "        row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)",
                 "    live = row < R"]
    else:
        lines = ["    if WIDE:",
                 "        row = tl.program_id(0).to(tl.int64)",
                 "    else:",
                 "        row = tl.program_id(0)"]
    if nin:
        lines += offsets(nin, "    ", MAX_LEADING, "row")
    names = {}
    for c in region.consts:
        lines.append(f"    c_{knames[c]} = tl.full([], {knames[c]}, {exprs.compute(c.dtype)})")
        names[c] = f"c_{knames[c]}"
    for k, n in enumerate(region.inputs):
        if n in region.per_row:
            load = f"tl.load(x{k}_ptr + o{k}, mask=live, other=0)[:, None]" if block_of_rows \
                else f"tl.load(x{k}_ptr + o{k})"
            lines.append(f"    a{k} = " + exprs.loaded(load, n.dtype))
            names[n] = f"a{k}"
    return lines, names


def _def(name: str, signature: str, rows: bool = False) -> list[str]:
    extra = " ROWS: tl.constexpr," if rows else ""
    return ["@triton.jit", f"def {name}({signature},",
            f"        RANK: tl.constexpr, WIDE: tl.constexpr,{extra} BLOCK: tl.constexpr):"]


def _load_full(k: int, n: Node, cols: str, mask: str, indent: str, name: str) -> str:
    return indent + f"{name} = " + exprs.loaded(
        f"tl.load(x{k}_ptr + o{k} + {cols} * r{k}, mask={mask}, other=0)", n.dtype)


def _reduce(r: Node, arg: str, axis: int = 0) -> str:
    """A reduction over a block (of values or of lanes; ``axis`` 1: a block of rows, each
    reduced to a column), rounded to the node's dtype."""
    column = "[:, None]" if axis else ""
    if r.op.name == SUM:
        return exprs.rounded(f"tl.sum({arg}, axis={axis}){column}", r.dtype)
    return f"tl.reduce({arg}, {axis}, _max_nan){column}"


def _persistent(region: RowRegion, signature: str, head: tuple[list[str], dict]
                ) -> list[str]:
    """ROWS whole rows of up to BLOCK elements as one [ROWS, BLOCK] block: short rows share a
    program (a softmax over 128 keys fills 8 warps with 32 rows), long ones have one each."""
    lines, names = head
    lines = _def("persistent", signature, rows=True) + lines + [
        "    cols = tl.arange(0, BLOCK)",
        "    if WIDE:",  # a row read with a stride may reach past 2**31 along the row too
        "        cols = cols.to(tl.int64)",
        "    mask = live[:, None] & (cols < D)[None, :]",
    ]
    for k, n in enumerate(region.inputs):
        if n not in region.per_row:
            lines.append(f"    a{k} = " + exprs.loaded(
                f"tl.load(x{k}_ptr + o{k}[:, None] + cols[None, :] * r{k}, mask=mask, "
                "other=0)", n.dtype))
            names[n] = f"a{k}"
    for i, n in enumerate(region.nodes):
        args = [names[a] for a in n.inputs]
        if n.op.name in rowgen.REDUCTIONS:
            expr = _reduce(n, f"tl.where(mask, {args[0]}, {ZERO[n.op.name]})", axis=1)
        else:
            expr = exprs.node_expr(n, args, region.consts)
        lines.append(f"    v{i} = {expr}")
        names[n] = f"v{i}"
    lines.append(f"    tl.store(out_ptr + row[:, None] * D + cols[None, :], "
                 f"{names[region.root]}.to({exprs.storage(region.root.dtype)}), mask=mask)")
    return lines


def _looped(region: RowRegion, signature: str, head: tuple[list[str], dict],
            position: dict) -> list[str]:
    lines, names = head
    lines = _def("looped", signature) + lines
    index = {n: i for i, n in enumerate(region.nodes)}
    last = region.level[region.root]
    by_level: dict[int, list[Node]] = {}
    for r in region.reductions:
        by_level.setdefault(region.level[r], []).append(r)

    def per_row(level: int) -> None:
        for n in region.nodes:
            if n in region.per_row and n.op.name not in rowgen.REDUCTIONS \
                    and region.level[n] == level:
                lines.append(f"    v{index[n]} = "
                             f"{exprs.node_expr(n, [names[a] for a in n.inputs], region.consts)}")
                names[n] = f"v{index[n]}"

    per_row(0)
    for p in range(last + 1):
        reduces = by_level.get(p + 1, []) if p < last else []
        targets = [r.inputs[0] for r in reduces] if p < last else [region.root]
        computes = _closure(targets, region)
        local = dict(names)  # the pass's full values live in its loop only
        for r in reduces:
            ct = exprs.compute(r.dtype)
            init = f"tl.zeros([BLOCK], {ct})" if r.op.name == SUM else \
                f"tl.full([BLOCK], NEG_INF, {ct})"
            lines.append(f"    acc{index[r]} = {init}")
        lines += ["    for j0 in range(0, D, BLOCK):",
                  f"        cols_{p} = j0 + tl.arange(0, BLOCK)",
                  "        if WIDE:",
                  f"            cols_{p} = cols_{p}.to(tl.int64)",
                  f"        mask_{p} = cols_{p} < D"]
        for x in _loads(computes, targets, region):
            k = position[x]
            lines.append(_load_full(k, x, f"cols_{p}", f"mask_{p}", "        ", f"a{k}_{p}"))
            local[x] = f"a{k}_{p}"
        for n in computes:
            expr = exprs.node_expr(n, [local[a] for a in n.inputs], region.consts)
            lines.append(f"        v{index[n]}_{p} = {expr}")
            local[n] = f"v{index[n]}_{p}"
        for r in reduces:
            a, kept = f"acc{index[r]}", f"tl.where(mask_{p}, {local[r.inputs[0]]}, " \
                                        f"{ZERO[r.op.name]})"
            step = f"{a} + {kept}" if r.op.name == SUM else f"_max_nan({a}, {kept})"
            lines.append(f"        {a} = {step}")
        if p == last:
            lines.append(f"        tl.store(out_ptr + row * D + cols_{p}, {local[region.root]}"
                         f".to({exprs.storage(region.root.dtype)}), mask=mask_{p})")
            continue
        for r in reduces:
            lines.append(f"    v{index[r]} = {_reduce(r, f'acc{index[r]}')}")
            names[r] = f"v{index[r]}"
        per_row(p + 1)
    return lines


def joins(n: Node, width) -> bool:
    """``rowgen.joins`` for Triton: a last-axis sum/max with keepdims over a full float row of
    a rendered dtype (float16 included: it sums in float32), or an elementwise op
    ``exprs.fusable`` renders; its last dim is ``width``, 1, or it is 0-d."""
    if n.op.name in rowgen.REDUCTIONS:
        x = n.inputs[0]
        return (bool(n.attrs.get("keepdims")) and x.ndim >= 1
                and tuple(n.attrs.get("axes", ())) == (x.ndim - 1,)
                and x.dtype.is_float and x.dtype.name in exprs.dtypes() and n.dtype == x.dtype
                and not rowgen._is_one(rowgen._last(x))  # noqa: SLF001
                and rowgen._same_dim(rowgen._last(x), width))  # noqa: SLF001
    if not exprs.fusable(n):
        return False
    return not n.ndim or rowgen._is_one(rowgen._last(n)) \
        or rowgen._same_dim(rowgen._last(n), width)  # noqa: SLF001


__all__ = ["MAX_LEADING", "joins", "render"]
