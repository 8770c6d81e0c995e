"""Triton source for an elementwise region (``codegen.Region``): one program per BLOCK of the
flattened output.

The kernel is shape-generic like the C loop: Python merges the output's axes that are
contiguous for every operand (``codegen._layout``, the C kernels' own rule), and passes the
merged sizes and each input's element strides (0 on broadcast axes), right-aligned in MAX_RANK
slots; the constexpr ``RANK`` selects the index arithmetic (rank 1: the flat index times the
stride, so contiguous and scalar operands cost no division). Every load and the store are
masked; half-precision inputs are loaded into float32 and every op is rounded to its node's
dtype as the reference rounds (``exprs``). ``WIDE`` computes offsets in int64 when the output or
an input spans 2**31 elements or more. Launch parameters (BLOCK, num_warps) are not in the
source: one source serves every configuration (``generate.CONFIGS``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from tensor_graphs.ir.dtypes import DType
from tensor_graphs.kernels.c.codegen import Region
from tensor_graphs.kernels.triton import exprs

MAX_RANK = 4  # merged dims a kernel indexes; more and the odd operands are made contiguous


@dataclass(frozen=True)
class Rendered:
    """A region's Triton module and what launching its kernels needs."""

    source: str
    key: str  # hash of the source: the module's file name
    kind: str  # "elementwise" or "rows"
    kernels: tuple[str, ...]  # the @triton.jit functions a launch picks from
    arguments: tuple[tuple[str, str], ...]  # (name, AOT type) of every runtime argument
    input_dtypes: tuple[DType, ...]
    out_dtype: DType
    summary: str
    full: tuple[bool, ...] = ()  # rows: per input, one value per element of the row


def source_key(source: str) -> str:
    return hashlib.blake2b(source.encode(), digest_size=8).hexdigest()


def summary(region: Region) -> str:
    ops = ", ".join(f"{v} {k}" if v > 1 else k for k, v in region.ops.items())
    ins = ", ".join(n.dtype.name for n in region.inputs)
    return f"{len(region.nodes)} elementwise ops ({ops}) over ({ins}) -> {region.root.dtype.name}"


def constants_of(nodes, values) -> tuple[list[tuple[str, str]], dict]:
    """Module constexprs for the inlined constants (``values``: node -> value) and each
    node's name there."""
    table: list[tuple[str, str]] = []
    names = {}
    for j, n in enumerate(nodes):
        table.append((f"K{j}", exprs.literal(values[n], n.dtype)))
        names[n] = f"K{j}"
    return table, names


def offsets(count: int, indent: str, rank_slots: int, index: str) -> list[str]:
    """Code setting ``o0 .. o{count-1}``, each input's element offset at ``index`` (a flat
    index over the merged dims), for every RANK (constexpr branches): dims are right-aligned in
    ``rank_slots`` slots, sizes ``z1 ..`` and strides ``s{k}_0 ..``."""
    last = rank_slots - 1
    lines = []
    for rank in range(1, rank_slots + 1):
        head = "if" if rank == 1 else "elif" if rank < rank_slots else "else"
        cond = f" RANK == {rank}" if head != "else" else ""
        lines.append(f"{indent}{head}{cond}:")
        body = []
        q = index
        terms: list[list[str]] = [[] for _ in range(count)]
        for depth in range(rank - 1):  # peel the innermost dims off the flat index
            slot = last - depth
            body += [f"i{slot} = {q} % z{slot}", f"q{slot} = {q} // z{slot}"]
            q = f"q{slot}"
            for k in range(count):
                terms[k].append(f"i{slot} * s{k}_{slot}")
        outer = last - (rank - 1)
        for k in range(count):
            body.append(f"o{k} = " + " + ".join([f"{q} * s{k}_{outer}"] + terms[k][::-1]))
        if not body:
            body = ["pass"]
        lines += [f"{indent}    {b}" for b in body]
    return lines


def render(region: Region) -> Rendered:
    """The Triton module of an elementwise region (see the module docstring)."""
    values = {c: exprs.constant_value(c) for c in region.constants}
    table, knames = constants_of(region.constants, values)
    nin = len(region.inputs)
    names: dict = {}
    params = ["out_ptr"] + [f"x{k}_ptr" for k in range(nin)] + ["n"]
    params += [f"z{j}" for j in range(1, MAX_RANK)]
    params += [f"s{k}_{j}" for k in range(nin) for j in range(MAX_RANK)]
    args = [("out_ptr", exprs.pointer(region.root.dtype))]
    args += [(f"x{k}_ptr", exprs.pointer(n.dtype)) for k, n in enumerate(region.inputs)]
    args += [(p, "i32") for p in params[1 + nin:]]
    body = [
        "@triton.jit",
        f"def kernel({', '.join(params)},",
        "           RANK: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr):",
        "    if WIDE:",
        "        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
        "    else:",
        "        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
        "    mask = offs < n",
    ]
    if nin:
        body += offsets(nin, "    ", MAX_RANK, "offs")
    for k, n in enumerate(region.inputs):
        body.append(f"    a{k} = " + exprs.loaded(f"tl.load(x{k}_ptr + o{k}, mask=mask, other=0)",
                                                 n.dtype))
        names[n] = f"a{k}"
    for c in region.constants:
        body.append(f"    c_{knames[c]} = tl.full([], {knames[c]}, {exprs.compute(c.dtype)})")
        names[c] = f"c_{knames[c]}"
    for i, n in enumerate(region.nodes):
        body.append(f"    v{i} = {exprs.node_expr(n, [names[a] for a in n.inputs], values)}")
        names[n] = f"v{i}"
    root = names[region.root]
    body.append(f"    tl.store(out_ptr + offs, {root}.to({exprs.storage(region.root.dtype)}), "
                "mask=mask)")
    title = summary(region)
    lines = exprs.module_head(title, table, exprs.helpers_used(region.nodes)) + ["", *body, ""]
    source = "\n".join(lines)
    return Rendered(source, source_key(source), "elementwise", ("kernel",), tuple(args),
                    tuple(n.dtype for n in region.inputs), region.root.dtype, title)


__all__ = ["MAX_RANK", "Rendered", "offsets", "render", "source_key", "summary"]
