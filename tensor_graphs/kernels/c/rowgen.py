"""Generated C for row reductions with their elementwise prologue and epilogue.

Softmax, log-softmax and every norm a user writes by hand (RMSNorm, LayerNorm, ScaleNorm, with
the residual add before them) are one shape of graph: elementwise ops over the full tensor
(the *prologue*), reductions over the last axis (``sum``/``max`` with keepdims; ``mean`` and
``var`` decompose to them), possibly dependent (the variance needs the mean, the softmax's sum
needs the max), and elementwise ops that combine full-row values with the reduced (broadcast)
ones and with per-column inputs such as a weight and a bias (the *epilogue*). Op by op, each
of those is a pass over memory; here the region is one C function: for each row, one pass per
level of dependent reductions over the row (which stays in cache), then one pass that computes
the epilogue and stores the result.

    cand = row_candidate(root, uses, expand)   # a kernels.generated.Candidate, or None
    kernel = cand.build()                      # compiled, checked, verified: a RowKernel

The region is found by ``kernels.generated.grow``; a node joins when it is an elementwise op
``codegen`` can render or a last-axis ``sum``/``max`` with keepdims over a float32/float64
row, and its last dim is the row's (``D``, the root's) or 1 (a per-row value) or it is 0-d.
Every value is then one of two kinds: *full* (one value per element of the row: computed in
the element loops) or *per-row* (a scalar per row: a reduction's result and what is computed
from such results; computed once per row between the passes). A value's *level* is the number
of dependent reductions before it; pass ``p`` computes the full values the level-``p+1``
reductions read, and the last pass (the root's level) the root. A full value computed in one
pass and read in a later one is *materialised* in a row buffer (softmax's exp(x - max),
LayerNorm's x + r), unless it is one cheap op on one row (LayerNorm's x - mean: computed
again, ``recomputed``); the output row itself is the first buffer (``row_buffers``: buffers
are reused once read for the last time), so the usual forms need no scratch. A value nothing
but constants feeds is folded to a literal. Pure elementwise regions are not claimed (``codegen``'s
generator renders them); nor is a region whose root is itself a reduction (a per-row output).
A prologue value also read outside (the residual stream) is an input of ``row_candidate``'s
region and stored beside the root by ``stored_row_candidate``'s (``RowRegion.stored``: its
own output row, the kernel's second output). Rows reached through a reshape (GroupNorm's
``(N, G, C/G*H*W)`` statistics and its per-channel affine after the reshape back) are
``grouped_row_candidate``'s (``Frame``).

Numerics: elementwise ops are ``codegen``'s C expressions (numpy's semantics, each op rounded
to its node's dtype, ``-ffp-contract=off``, never -ffast-math). A reduction accumulates in
explicit lanes (``CHAINS`` GCC vectors of ``LANES`` partial results, combined by a fixed
pairwise tree), so the loop vectorises without reassociation flags, several additions are in
flight, and the order is the same on every run and thread. A float32 row is summed in blocks
of ``BLOCK`` elements: float lanes within a block (16 elements each, as each of numpy's
pairwise accumulators adds 16), double lanes across blocks (where numpy's tree rounds again
at every level); one rounding to float32 at the end. float64 rows keep Neumaier's
compensation per lane. ``max`` propagates NaN as numpy does. The result is checked like
``codegen``'s: ``check_row_kernel``
declares max(float floor, 16x numpy's own error in the region's dtypes) on seeded trials, then
``tg.kernels.verify(strict=True)`` runs the adversarial cases (large and masked logits, rows
far from zero, tiny rows, rows of length 1, odd sizes, strided, broadcast and Fortran-ordered
inputs) before anything is timed or run.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensor_graphs import threads
from tensor_graphs.errors import (
    KernelConstraintError,
    OutOfMemory,
)
from tensor_graphs.ir.algebra import ELEMENTWISE
from tensor_graphs.ir.dtypes import DType
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import (
    ADD,
    CAST,
    ERF,
    EXP,
    LOG,
    MAX,
    MUL,
    POW,
    RECIPROCAL,
    RESHAPE,
    ROUND_HALF_EVEN,
    SIN,
    SQRT,
    SUB,
    SUM,
)
from tensor_graphs.ir.shapes import dims_equal
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import codegen as cg
from tensor_graphs.kernels.c import lib as _clib
from tensor_graphs.rewrite import pattern as pat

LANES = 16  # partial results per vector of a reduction (a GCC vector of that many values)
CHAINS = 4  # independent vectors per reduction, so that several additions are in flight
BLOCK = 1024  # elements computed per block before the lanes take them in: a multiple of
# LANES * CHAINS
PARALLEL_MIN = cg.PARALLEL_MIN  # OpenMP splits the rows from this many elements
COMMON_HEADER = Path(__file__).with_name("tg_common.h")  # the C kernels' thread team
REDUCED_DTYPES = ("float32", "float64")  # the row dtypes a reduction accumulates here
# the elementwise ops a row region takes: those fusion crosses, and rounding half to even (a
# dynamic quantize's round, after its row's absolute max: one kernel, as when it was casts)
ROW_ELEMENTWISE = ELEMENTWISE | {ROUND_HALF_EVEN}
ACCUMULATOR = {"float32": "double", "float64": "double"}  # C type of a sum's lanes


# ---------------------------------------------------------------------------- regions
@dataclass(frozen=True)
class Frame:
    """Rows whose values are also read and written in another shape: GroupNorm normalises
    ``(N, G, C/G * H * W)`` rows (``rows``, the reductions' input shape) and scales them per
    channel after a reshape back to ``(N, C, H, W)`` (``out``, the root's shape). A value
    lives in one of the two *spaces* (a reshape between the two full shapes changes space and
    is the same values in the same order); each input is read in the shape ``reads[k]`` (the
    target of the reshape it is read through, or its own) in space ``spaces[k]``. The kernel
    walks rows of ``rows``; an input is addressed through the two shapes' common refinement
    (``(N, G, C/G, H, W)``), each row as ``split`` x (D / ``split``) elements (a per-channel
    weight varies along the first, not the second), and gathered into a row buffer where it
    is not one dense row."""

    out: tuple[int, ...]
    rows: tuple[int, ...]
    reads: tuple[tuple[int, ...], ...]
    spaces: tuple[str, ...]  # "rows" or "out", per input
    split: int  # the inner size S2 of each row (D = S1 x S2)


@dataclass(frozen=True, eq=False)
class RowRegion:
    """A row region over atomic ops: ``nodes`` in topological order (root last, folded
    constants left out), ``inputs`` in kernel-argument order, ``consts`` the values of inlined
    0-d constants and of nodes only constants feed, ``per_row`` the nodes and inputs with one
    value per row, ``level`` each node's number of dependent reductions before it."""

    root: Node
    nodes: tuple[Node, ...]
    inputs: tuple[Node, ...]
    consts: Mapping[Node, np.generic]
    per_row: frozenset[Node]
    level: Mapping[Node, int]
    stored: tuple[Node, ...] = ()  # full values besides the root it stores (``outputs``)
    frame: Frame | None = None  # rows reached through a reshape (GroupNorm): see ``Frame``

    @property
    def reductions(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.op.name in REDUCTIONS)

    @property
    def ops(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op.name] = counts.get(n.op.name, 0) + 1
        return dict(sorted(counts.items()))


def _last(n: Node):
    return n.shape[-1] if n.ndim else 1


def _is_one(d) -> bool:
    return isinstance(d, int) and d == 1


def _same_dim(a, b) -> bool:
    """dims_equal, without sympy where the dims are the same object, equal or both ints."""
    if a is b or a == b:
        return True
    if isinstance(a, int) and isinstance(b, int):
        return False
    return dims_equal(a, b)


def joins(n: Node, width) -> bool:
    """Whether atomic node ``n`` may be part of a row region whose rows have ``width``
    elements: an elementwise op codegen renders (no integer pow: its negative exponents raise)
    or a last-axis sum/max with keepdims over a full float row; its last dim is ``width``, 1,
    or it is 0-d."""
    name = n.op.name
    if name in REDUCTIONS:
        x = n.inputs[0]
        return (bool(n.attrs.get("keepdims")) and x.ndim >= 1
                and tuple(n.attrs.get("axes", ())) == (x.ndim - 1,)
                and x.dtype.name in REDUCED_DTYPES and n.dtype == x.dtype
                and not _is_one(_last(x)) and _same_dim(_last(x), width))
    if name not in ROW_ELEMENTWISE or name == POW and not n.dtype.is_float:
        return False  # an integer pow's negative exponents raise: not here
    if n.ndim and not (_is_one(_last(n)) or _same_dim(_last(n), width)):
        return False
    return cg.fusable(n)


def row_region(top: Node, boundary: Sequence[Node],
               constant: Callable[[Node], np.generic | None] | None = None,
               stored: Sequence[Node] = ()) -> RowRegion | None:
    """The row region rooted at ``top`` (a root rebuilt over atomic ops, ``generated.rebuilt``)
    that stops at ``boundary``; None when it has no reduction or its root is not a full row.
    ``constant(node)`` is the value of a constant the renderer inlines, or None (default: the
    0-d constants C has a type for; Triton's renderer inlines float16 ones too). ``stored``:
    members also stored, each a full value of the root's shape (else None)."""
    if top.ndim == 0 or _is_one(_last(top)) or top.op.name in REDUCTIONS:
        return None
    members, inputs, consts = row_region_parts(top, boundary, constant)
    width = _last(top)
    per_row = {n for n in (*inputs, *members) if n.ndim == 0 or _is_one(_last(n))}
    for n in inputs:  # an input of another width would broadcast along the row
        if n.ndim and n not in per_row and not _same_dim(_last(n), width):
            return None
    level: dict[Node, int] = {}
    for n in members:
        base = max((level.get(i, 0) for i in n.inputs), default=0)
        level[n] = base + 1 if n.op.name in REDUCTIONS else base
    if top in per_row or not any(n.op.name in REDUCTIONS for n in members):
        return None
    inner = set(members)
    for n in stored:  # a stored value is written row by row beside the root
        if n not in inner or n in per_row or n is top or n.op.name in REDUCTIONS \
                or not storable(n, top):
            return None
    return RowRegion(top, tuple(members), tuple(inputs), consts, frozenset(per_row), level,
                     tuple(stored))


def storable(n: Node, root: Node) -> bool:
    """Whether a row kernel rooted at ``root`` can store ``n`` too: an elementwise value of the
    root's shape (its rows are the root's rows) in a dtype C renders."""
    return (n.op.name in ELEMENTWISE and n.ndim == root.ndim and n.dtype.name in cg.C_TYPES
            and all(_same_dim(a, b) for a, b in zip(n.shape, root.shape)))


def _ints(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def grouped_joins(n: Node, width=None) -> bool:
    """``joins`` for rows reached through a reshape (``Frame``): each node at its own width,
    and reshapes between concrete shapes."""
    if n.op.name == RESHAPE:
        return _ints(n.shape) and _ints(n.inputs[0].shape) and n.dtype.name in cg.C_TYPES
    return joins(n, _last(n.inputs[0]) if n.op.name in REDUCTIONS else _last(n))


def grouped_region(top: Node, boundary: Sequence[Node]) -> RowRegion | None:
    """The row region rooted at ``top`` whose rows are its reductions' input shape and whose
    values are read and written in that shape and in the root's, through reshapes between the
    two (GroupNorm: ``Frame``); None where it has no reshape between them, where a value or an
    input has no single space and shape, or where the two shapes do not nest."""
    if not _ints(top.shape) or top.ndim == 0:
        return None
    members, inputs, consts = row_region_parts(top, boundary)
    if top not in members:
        return None
    reductions = [n for n in members if n.op.name in REDUCTIONS]
    if not reductions or not any(n.op.name == RESHAPE for n in members):
        return None
    rows = tuple(reductions[0].inputs[0].shape)
    out = tuple(top.shape)
    if not _ints(rows) or any(tuple(r.inputs[0].shape) != rows for r in reductions) \
            or math.prod(rows) != math.prod(out) or refinement(rows, out) is None:
        return None
    space = _spaces(members, inputs, consts, reductions, rows, out)
    if space is None or space.get(top) != "out":
        return None
    inner = set(members)
    reads: dict[Node, tuple[Node, ...]] = {}  # input -> its readers
    for n in members:
        for i in n.inputs:
            if i in inputs:
                reads.setdefault(i, ())
                reads[i] += (n,)
    read_shapes, spaces = [], []
    for i in inputs:
        via = {(tuple(r.shape), space[r]) if r.op.name == RESHAPE else (tuple(i.shape), space[r])
               for r in reads.get(i, ())}
        if len(via) != 1:
            return None  # read in two shapes or spaces
        (shape, sp), = via
        if not _ints(shape):
            return None
        read_shapes.append(shape)
        spaces.append(sp)
    for n in members:  # an inner reshape turns one full shape into the other
        if n.op.name == RESHAPE and n.inputs[0] in inner and \
                {tuple(n.shape), tuple(n.inputs[0].shape)} - {rows, out}:
            return None
    per_row = set()
    for n in members:
        if space[n] == "rows" and (n.ndim == 0 or _is_one(_last(n))):
            per_row.add(n)
    refined = refinement(rows, out)
    for i, shape, sp in zip(inputs, read_shapes, spaces):
        if _row_constant(shape, sp, rows, out, refined):
            per_row.add(i)
    level: dict[Node, int] = {}
    for n in members:
        b = max((level.get(i, 0) for i in n.inputs), default=0)
        level[n] = b + 1 if n.op.name in REDUCTIONS else b
    frame = Frame(out, rows, tuple(read_shapes), tuple(spaces), 0)
    full = [(i, shape, sp) for i, shape, sp in zip(inputs, read_shapes, spaces)
            if i not in per_row]
    split = _split(frame, full)
    if split is None:
        return None
    return RowRegion(top, tuple(members), tuple(inputs), consts, frozenset(per_row), level,
                     (), Frame(out, rows, tuple(read_shapes), tuple(spaces), split))


def _spaces(members, inputs, consts, reductions, rows, out) -> dict[Node, str] | None:
    """Each member's space ("rows" or "out", see ``Frame``), spread from the reductions'
    inputs through elementwise ops (one space) and reshapes (a full one changes space);
    None where a member has none or two."""
    space: dict[Node, str] = {}
    for r in reductions:
        space[r] = "rows"
        space[r.inputs[0]] = "rows"
    other = {"rows": "out", "out": "rows"}
    inner = set(members)
    for _ in range(len(members) + 1):
        changed = False
        for n in members:
            linked = [i for i in n.inputs if i in inner]
            if n.op.name == RESHAPE:
                if not linked:
                    continue
                i = linked[0]
                switch = tuple(n.shape) != tuple(i.shape)
                for a, b in ((n, i), (i, n)):
                    if a in space and b not in space:
                        space[b] = other[space[a]] if switch else space[a]
                        changed = True
                continue
            if n.op.name in REDUCTIONS:
                continue
            group = [n, *linked]
            known = {space[g] for g in group if g in space}
            if len(known) > 1:
                return None
            if known:
                (sp,) = known
                for g in group:
                    if g not in space:
                        space[g] = sp
                        changed = True
        if not changed:
            break
    if any(n not in space for n in members):
        return None
    for n in members:  # shapes fit their space
        full = rows if space[n] == "rows" else out
        if n.op.name in REDUCTIONS:
            continue
        shape = tuple(n.shape)
        if len(shape) > len(full) or any(d != 1 and d != f for d, f in
                                         zip(shape[::-1], full[::-1])):
            return None
        if space[n] == "rows" and shape and shape[-1] not in (1, rows[-1]):
            return None
    return space


def _row_constant(shape, sp, rows, out, refined) -> bool:
    """Whether an input read in ``shape`` in space ``sp`` has one value per row."""
    full = rows if sp == "rows" else out
    padded = (1,) * (len(full) - len(shape)) + tuple(shape)
    which = 1 if sp == "rows" else 2
    row_axes = {r[which] for r in refined if r[1] == len(rows) - 1 and r[0] != 1}
    return all(padded[a] == 1 for a in row_axes)


def _split(frame: Frame, full) -> int | None:
    """The S2 of a row (the largest that reads every dense full input in two strides)."""
    refined = refinement(frame.rows, frame.out)
    sizes = [r[0] for r in refined if r[1] == len(frame.rows) - 1]
    for cut in range(len(sizes)):
        s2 = math.prod(sizes[cut:])
        trial = Frame(frame.out, frame.rows, frame.reads, frame.spaces, s2)
        if all(_frame_strides(trial, refined, len(frame.rows) - 1, _dense(i, shape), shape,
                              sp, False) is not None for i, shape, sp in full):
            return s2
    return None


def _dense(node: Node, shape) -> np.ndarray:
    """A C-contiguous array of ``shape`` that owns no memory (for its strides alone)."""
    dt = node.dtype.np_dtype
    strides, step = [], np.dtype(dt).itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return np.lib.stride_tricks.as_strided(np.zeros(1, dt), tuple(shape), tuple(reversed(strides)))


def per_part(region: RowRegion) -> tuple[bool, ...]:
    """Per input of a ``Frame`` region: whether it is full but the same along each row's S2
    axis (a per-channel weight: one value per S1 index) and read in the epilogue only. The
    epilogue then walks a row as S1 x S2 and reads it once per S1 index, where it was
    gathered into a row buffer on every row (GroupNorm (8, 64, 32, 32): two 2048-element
    gathers per row, more than the row's arithmetic)."""
    frame = region.frame
    if frame is None:
        return (False,) * len(region.inputs)
    pass_list, _ = passes(region)
    early = set()
    for p in pass_list[:-1]:
        early |= {i for n in p.computes for i in n.inputs}
        early |= {r.inputs[0] for r in p.reduces or ()}
    refined = refinement(frame.rows, frame.out)
    out = []
    for k, n in enumerate(region.inputs):
        if n in region.per_row or n in early:
            out.append(False)
            continue
        strides = _frame_strides(frame, refined, len(frame.rows) - 1,
                                 _dense(n, frame.reads[k]), frame.reads[k], frame.spaces[k],
                                 False)
        out.append(strides is not None and strides[-1] == 0)
    return tuple(out)


def row_region_parts(top: Node, boundary: Sequence[Node],
                     constant: Callable[[Node], np.generic | None] | None = None):
    """(members, inputs, consts) of the region rooted at ``top`` stopping at ``boundary``:
    post-order (inputs before users), boundary values in first-use order, constants that
    ``constant`` gives a value (default: the 0-d constants C has a type for) inlined, values
    only constants feed folded."""
    if constant is None:
        def constant(b: Node) -> np.generic | None:
            return cg.uniform_value(b) if cg.inlinable(b) else None
    stop = set(boundary)
    order: list[Node] = []
    seen: set[Node] = set()
    found_inputs: list[Node] = []
    stack: list[tuple[Node, bool]] = [(top, False)]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if n in seen:
            continue
        seen.add(n)
        if n in stop or n.op.is_leaf:
            found_inputs.append(n)
            continue
        stack.append((n, True))
        stack.extend((i, False) for i in reversed(n.inputs) if i not in seen)
    consts: dict[Node, np.generic] = {}
    inputs: list[Node] = []
    for b in found_inputs:
        value = constant(b)
        if value is not None:
            consts[b] = value
        else:
            inputs.append(b)
    members: list[Node] = []
    for n in order:
        if n.op.name not in REDUCTIONS and all(i in consts for i in n.inputs):
            consts[n] = _fold(n, consts)
        else:
            members.append(n)
    return members, inputs, consts


def _fold(n: Node, consts: Mapping[Node, np.generic]) -> np.generic:
    """A node only constants feed, evaluated as the reference does in its dtype."""
    args = [np.asarray(consts[i]) for i in n.inputs]
    with np.errstate(all="ignore"):
        value = np.asarray(n.op.reference(args, dict(n.attrs))).astype(n.dtype.np_dtype)
    return value.reshape(()).item() if value.dtype.kind != "f" else value.reshape(())[()]


# ---------------------------------------------------------------------------- passes
@dataclass(frozen=True)
class Pass:
    """One loop over a row: the full values it computes (topological), the materialised ones
    it loads from an earlier pass, the reductions it accumulates (None: the last pass, which
    stores the root)."""

    computes: tuple[Node, ...]
    loads: tuple[Node, ...]
    reduces: tuple[Node, ...] | None


EXPENSIVE = frozenset({EXP, LOG, SIN, ERF, POW, SQRT, RECIPROCAL})  # worth a row buffer


def recomputed(n: Node, region: RowRegion) -> bool:
    """Whether a later pass computes ``n`` again rather than reading it from a row buffer:
    an op that is cheap next to a store and a load (no libm call or division) and reads one
    full row at most (LayerNorm's x - mean: one subtraction from the row of x it reads)."""
    if n.op.name in EXPENSIVE:
        return False
    full = [i for i in n.inputs if i not in region.consts and i not in region.per_row]
    return len(set(full)) <= 1


def passes(region: RowRegion) -> tuple[list[Pass], set[Node]]:
    """The passes over each row and the full values they materialise (see the module
    docstring): pass p serves the reductions of level p + 1, the last pass the root. A value
    a later pass needs is read from a row buffer unless ``recomputed`` says to compute it
    again."""
    last = region.level[region.root]
    by_level: dict[int, list[Node]] = {}
    for r in region.reductions:
        by_level.setdefault(region.level[r], []).append(r)
    made: dict[Node, int] = {}  # full value -> the pass that computes it
    stored: set[Node] = set()
    out: list[Pass] = []
    for p in range(last + 1):
        reduces = tuple(by_level.get(p + 1, ())) if p < last else None
        targets = [r.inputs[0] for r in reduces] if reduces is not None else [region.root]
        computes: list[Node] = []
        loads: list[Node] = []
        seen: set[Node] = set()
        stack: list[tuple[Node, bool]] = [(t, False) for t in reversed(targets)]
        while stack:
            n, done = stack.pop()
            if done:
                computes.append(n)
                made[n] = p
                continue
            if n in seen or n in region.consts or n in region.per_row or n in region.inputs:
                continue
            seen.add(n)
            if n in made and made[n] < p and not recomputed(n, region):
                stored.add(n)  # computed in an earlier pass: kept in a row buffer
                loads.append(n)
                continue
            stack.append((n, True))
            stack.extend((i, False) for i in reversed(n.inputs))
        out.append(Pass(tuple(computes), tuple(loads), reduces))
    return out, stored


@dataclass(frozen=True)
class Moment:
    """A sum of squares of deviations, ``sum((x + sign * w) ** 2)`` with ``x`` the full row
    a first-pass sum reads and ``w`` a per-row value made from first-pass sums (LayerNorm's
    and GroupNorm's ``sum((x - mean) ** 2)``), taken in the first pass as shifted sums:
    with ``d = x - s`` (``s`` the mean of the row's first ``SHIFT_SPAN`` elements) and ``e =
    s + sign * w``, it is ``Q + 2 e T + D e**2`` for ``T = sum(d)``, ``Q = sum(d**2)``,
    exactly, whatever ``w`` is. ``d`` is small next to ``x`` on rows far from zero, so the
    one pass keeps the digits ``E[x**2] - E[x]**2`` loses; T, Q and the combination are
    accumulated and formed in double (float lanes within a block, as every float32 sum)."""

    reduction: Node  # the second pass's sum it replaces
    first: Node  # the first-pass sum of x (its elements lie where the lanes read x)
    w: Node  # the per-row value
    sign: int  # +1: x + w, -1: x - w


SHIFT_SPAN = 64  # elements averaged for a row's shift s: within a spread of the mean


def moments(region: RowRegion, pass_list: Sequence[Pass], stored: set[Node]
            ) -> list[Moment] | None:
    """The second pass's reductions as ``Moment``s, when each of them is one (float32 rows
    of exactly three passes, the middle one computing only their squares, through a
    ``Frame``): the kernel then makes two passes. None otherwise.

    Frames only (GroupNorm): their rows have the region's own length. A shape-generic row
    kernel is also verified on rows of one element, where a LayerNorm's ``(x - mean) *
    rsqrt(var)`` cancels its rounding of ``x - mean`` only when the variance is made from
    the same rounded values (the two-pass way); the shifted sums' variance, closer to
    float64, left that rounding in the result: 1.29e-6 against a declared 1.30e-6."""
    if region.frame is None or len(pass_list) != 3 or not pass_list[1].reduces:
        return None
    first = {r.inputs[0]: r for r in pass_list[0].reduces or () if r.op.name == SUM}
    out = []
    for r in pass_list[1].reduces:
        q = r.inputs[0]
        if r.op.name != SUM or r.dtype.name != "float32" or q.op.name != MUL \
                or q.inputs[0] is not q.inputs[1]:
            return None
        c = q.inputs[0]
        found = None
        if c.op.name in (ADD, SUB):
            a, b = c.inputs
            for x, w, sign in ((a, b, 1 if c.op.name == ADD else -1), (b, a, 1)):
                if x in first and w in region.per_row and region.level.get(w, 0) == 1 \
                        and w not in region.inputs and w.dtype.name == "float32" \
                        and not (c.op.name == SUB and x is b):
                    found = Moment(r, first[x], w, sign)
                    break
        if found is None:
            return None
        out.append(found)
    made = set(pass_list[1].computes)
    if made & stored or made & set(pass_list[2].loads) or made & set(region.stored):
        return None
    squares = {m.reduction.inputs[0] for m in out} | {m.reduction.inputs[0].inputs[0]
                                                        for m in out}
    if not made <= squares | {n for n in made if region.level.get(n, 0) == 0}:
        return None
    return out


# ---------------------------------------------------------------------------- C emission
def _ctype(d: DType) -> str:
    return cg.C_TYPES[d.name][0]


@dataclass(frozen=True)
class Reduction:
    """How a reduction accumulates in C: ``LANES`` partial results in a GCC vector (``a``: its
    name, ``t``: the row's C type), their declaration, their update by a vector ``u`` of
    LANES elements, the merge of another such vector ``b`` into them, the value that leaves a
    lane as it is (what pads a row's last, partial vector), and the lanes' combination by a
    fixed pairwise tree (a statement, then the expression of the node's value); ``open`` and
    ``close`` run at each block's start and end (a float32 sum adds a block's elements in
    float lanes, then those into its double lanes)."""

    declare: Callable[[str, str], str]
    block: Callable[[str, str, str], str]
    merge: Callable[[str, str, str], str]
    identity: Callable[[str], str]
    finish: Callable[[str, str], tuple[str, str]]
    open: Callable[[str, str], str] = lambda a, t: ""  # at each block's start
    close: Callable[[str, str], str] = lambda a, t: ""  # at each block's end


def _vector(t: str) -> tuple[str, str]:
    """The vector type of LANES values of C type ``t`` and its mask type (the prelude's)."""
    return ("tg_vf", "tg_mf") if t == "float" else ("tg_vd", "tg_md")


def _sum_declare(a: str, t: str) -> str:
    if t == "float":
        return f"tg_vd {a} = {{0}};"
    return f"tg_vd {a} = {{0}}, {a}c = {{0}};"


def _sum_open(a: str, t: str) -> str:
    return f"tg_vf {a}f = {{0}};" if t == "float" else ""


def _sum_close(a: str, t: str) -> str:
    return f"{a} += __builtin_convertvector({a}f, tg_vd);" if t == "float" else ""


def _sum_block(a: str, t: str, u: str) -> str:
    if t == "float":  # a block's elements, at most BLOCK / (LANES * CHAINS) per float lane
        return f"{a}f += {u};"
    # Neumaier: the low part each addition loses is kept per lane
    return (f"{{ const tg_vd w = {a} + {u}; "
            f"const tg_md big = TG_ABS({a}) >= TG_ABS({u}); "
            f"{a}c += TG_SELECT(tg_vd, tg_md, big, ({a} - w) + {u}, ({u} - w) + {a}); "
            f"{a} = w; }}")


def _sum_merge(a: str, t: str, b: str) -> str:
    if t == "float":
        return f"{a} += {b};"
    return f"{_sum_block(a, t, b)} {a}c += {b}c;"  # b's sum in a's lanes, then its low parts


def _sum_finish(a: str, t: str) -> tuple[str, str]:
    if t == "float":
        return (f"for (int w = {LANES} / 2; w > 0; w >>= 1) for (int l = 0; l < w; l++) "
                f"{a}[l] += {a}[l + w];", f"(float){a}[0]")
    tree = (f"for (int w = {LANES} / 2; w > 0; w >>= 1) for (int l = 0; l < w; l++) "
            f"{{ {a}[l] += {a}[l + w]; {a}c[l] += {a}c[l + w]; }}")
    # an infinite or NaN sum makes its compensation NaN: the plain sum is the answer there
    return tree, f"({t})(isfinite({a}[0]) ? {a}[0] + {a}c[0] : {a}[0])"


def _max_declare(a: str, t: str) -> str:
    v, _ = _vector(t)
    return f"{v} {a}; for (int l = 0; l < {LANES}; l++) {a}[l] = -({t})INFINITY;"


def _max_block(a: str, t: str, u: str) -> str:
    # numpy: NaN anywhere gives NaN (u > m is false for a NaN m, which is then kept)
    v, m = _vector(t)
    return f"{a} = TG_SELECT({v}, {m}, ({u} > {a}) | ({u} != {u}), {u}, {a});"


def _max_finish(a: str, t: str) -> tuple[str, str]:
    tree = (f"for (int w = {LANES} / 2; w > 0; w >>= 1) for (int l = 0; l < w; l++) "
            f"{{ const {t} u = {a}[l + w]; {a}[l] = (u > {a}[l] || u != u) ? u : {a}[l]; }}")
    return tree, f"{a}[0]"


REDUCTIONS: dict[str, Reduction] = {  # op: how its lanes accumulate
    # float32 rows: float lanes per block, double lanes across blocks (a float lane adds
    # BLOCK / (LANES * CHAINS) = 16 elements of a block, as each of numpy's 8 pairwise
    # accumulators adds 16 of 128; the blocks' sums then add without rounding in double, where
    # numpy's tree rounds log2(n / 128) more times); float64 rows: Neumaier's compensation;
    # 0 pads
    SUM: Reduction(_sum_declare, _sum_block, _sum_merge, lambda t: f"({t})0", _sum_finish,
                   _sum_open, _sum_close),
    # a NaN-propagating select; -inf pads
    MAX: Reduction(_max_declare, _max_block, _max_block, lambda t: f"-({t})INFINITY",
                   _max_finish),
}
# GCC/Clang vector types of LANES values (lane-wise IEEE operations, no reassociation): the
# lanes stay in registers, where GCC neither vectorised an array of lanes with a select (max)
# nor kept one out of memory
VECTOR_PRELUDE = f"""typedef float tg_vf __attribute__((vector_size({LANES} * sizeof(float))));
typedef int32_t tg_mf __attribute__((vector_size({LANES} * sizeof(int32_t))));
typedef double tg_vd __attribute__((vector_size({LANES} * sizeof(double))));
typedef int64_t tg_md __attribute__((vector_size({LANES} * sizeof(int64_t))));
#define TG_SELECT(V, M, m, x, y) ((V)(((M)(x) & (m)) | ((M)(y) & ~(m))))
#define TG_ABS(x) ((tg_vd)((tg_md)(x) & (tg_md){{0}} + 0x7fffffffffffffffLL))
"""


@dataclass(frozen=True)
class RowEmitted:
    """C source of a row region and what calling it needs (``codegen.source_hash`` reads
    ``source`` and ``flags``)."""

    source: str
    symbol: str
    key: str
    input_dtypes: tuple[DType, ...]
    out_dtype: DType
    full: tuple[bool, ...]  # per input: one value per element of the row (else one per row)
    flags: tuple[str, ...] = cg.EXTRA_FLAGS
    passes: int = 0
    buffers: int = 0  # materialised row buffers
    stored_dtypes: tuple[DType, ...] = ()  # the values stored besides the root (``also``)
    frame: Frame | None = None  # rows through a reshape: the call's layout (``frame_layout``)


def row_buffers(region: RowRegion, pass_list: Sequence[Pass], stored: set[Node]
                ) -> dict[Node, str]:
    """Each materialised value's row buffer: ``po`` (the output row, written last by the
    epilogue) or scratch ``m0``, ``m1``, ... A buffer is reused once its value's last reader
    has loaded it: in a pass, every load of element jj precedes every store of element jj, so
    LayerNorm's x + r and x - mean take turns in the output row and need no scratch. A value
    a reduction reads straight from its buffer after the pass's element loop keeps that
    buffer to itself for the whole pass. A value the kernel also stores (``region.stored``)
    is kept in its own output row, ``pe0``, ``pe1``, ..., which nothing else writes."""
    made = {n: k for k, p in enumerate(pass_list) for n in p.computes if n in stored}
    last: dict[Node, float] = {}
    for k, p in enumerate(pass_list):
        direct = {r.inputs[0] for r in p.reduces or ()}
        for n in p.loads:
            last[n] = max(last.get(n, 0), k + (0.5 if n in direct else 0.0))
    slots: list[list] = [["po", region.root.dtype, -1.0]]  # name, dtype, busy until
    out: dict[Node, str] = {n: f"pe{k}" for k, n in enumerate(region.stored) if n in stored}
    for n in sorted(stored, key=lambda n: (made[n], region.nodes.index(n))):
        if n in out:
            continue
        slot = next((s for s in slots if s[1] == n.dtype and s[2] <= made[n]), None)
        if slot is None:
            slot = [f"m{len(slots) - 1}", n.dtype, -1.0]
            slots.append(slot)
        slot[2] = last.get(n, made[n])
        out[n] = slot[0]
    return out


def emit_row_c(region: RowRegion) -> RowEmitted:
    """One C function computing ``region.root`` row by row (see the module docstring).

    ``int f(rows, D, nd, shape, strides, ptrs)``: ``shape`` the ``nd`` (merged) leading dims,
    ``strides`` per input ``nd + 1`` element strides (its leading dims', then the row's),
    ``ptrs`` the inputs, the output and the stored values (each C-contiguous, rows of D).
    Returns 0, or 2 when the row buffers cannot be allocated. A stored value is written in
    the first pass that computes it."""
    pass_list, stored = passes(region)
    shifted = moments(region, pass_list, stored)
    first: dict[Node, int] = {}
    for index, p in enumerate(pass_list):
        for n in p.computes:
            first.setdefault(n, index)
    outputs = {n: f"pe{k}" for k, n in enumerate(region.stored)}
    helpers: set[str] = set()
    names: dict[Node, str] = {}
    for c, v in region.consts.items():
        names[c] = cg.c_literal(v, c.dtype)
    for k, n in enumerate(region.inputs):
        names[n] = f"x{k}"
    for i, n in enumerate(region.nodes):
        names[n] = f"v{i}"
    full = tuple(n not in region.per_row for n in region.inputs)
    part = per_part(region)
    buf = row_buffers(region, pass_list, stored)
    scratch = sorted({b for b in buf.values() if b[0] == "m"}, key=lambda b: int(b[1:]))
    position = {n: k for k, n in enumerate(region.inputs)}

    def expr(n: Node) -> str:
        if n.op.name == RESHAPE:  # (a Frame's) the same values in the same order
            return names[n.inputs[0]]
        return cg._expr(n, [names[i] for i in n.inputs], helpers, region.consts)  # noqa: SLF001

    def source(r: Node) -> str | None:
        """Where a reduction's elements already lie in a row (None: the block buffer)."""
        x = r.inputs[0]
        while x.op.name == RESHAPE and x not in position:  # (a Frame's: the same row)
            x = x.inputs[0]
        if x in position:
            return f"p{position[x]}"
        return buf.get(x)

    def body(p: Pass, indent: str, index: int) -> list[str]:
        used = {i for n in p.computes for i in n.inputs}
        used |= {region.root} if p.reduces is None else {r.inputs[0] for r in p.reduces}
        lines = [f"const {_ctype(n.dtype)} x{k} = p{k}[jj];"
                 for k, n in enumerate(region.inputs) if full[k] and n in used
                 and not (p.reduces is None and part[k])]
        lines += [f"const {_ctype(n.dtype)} {names[n]} = {buf[n]}[jj];" for n in p.loads]
        for n in p.computes:
            lines.append(f"const {_ctype(n.dtype)} {names[n]} = {expr(n)};")
            if n in stored:
                lines.append(f"{buf[n]}[jj] = {names[n]};")
            if n in outputs and first[n] == index and buf.get(n) != outputs[n]:
                lines.append(f"{outputs[n]}[jj] = {names[n]};")
        if p.reduces is None:
            lines.append(f"po[jj] = {names[region.root]};")
        else:  # the elements a reduction reads, for the lanes' loop after this one
            lines += [f"{names[r]}t[jj - j0] = {names[r.inputs[0]]};" for r in p.reduces
                      if source(r) is None]
        return [indent + s for s in lines]

    def block(r: Node, chain: int, at: str) -> str:
        t = _ctype(r.dtype)
        v, _ = _vector(t)
        return (f"{{ {v} u; __builtin_memcpy(&u, {at}, sizeof u); "
                f"{REDUCTIONS[r.op.name].block(f'{names[r]}a{chain}', t, 'u')} }}")

    def padded(r: Node) -> str:
        """The row's last elements, fewer than LANES, padded with the identity."""
        t = _ctype(r.dtype)
        v, _ = _vector(t)
        red = REDUCTIONS[r.op.name]
        return (f"{{ {v} u; for (int l = 0; l < {LANES}; l++) u[l] = k + l < n ? "
                f"{start(r)}[k + l] : {red.identity(t)}; "
                f"{red.block(f'{names[r]}a0', t, 'u')} }}")

    def start(r: Node) -> str:
        return f"{names[r]}t" if source(r) is None else f"({source(r)} + j0)"

    def per_row_values(lv: int) -> list[str]:
        return [f"    const {_ctype(n.dtype)} {names[n]} = {expr(n)};" for n in region.nodes
                if n in region.per_row and region.level[n] == lv
                and n.op.name not in REDUCTIONS]

    out_t = _ctype(region.root.dtype)
    nin = len(region.inputs)
    per = 1 if region.frame is None else 2  # inner strides per input: the row's, or S1's, S2's
    row = ["static void tg_row(int64_t r, int64_t D, int64_t nd, const int64_t *shape, "
           "const int64_t *strides, void *const *ptrs, char *scratch, size_t bb) {",
           "    (void)scratch; (void)bb;"]
    if region.frame is not None:
        row.append("    const int64_t S2 = shape[nd];  /* a row is D / S2 x S2 elements */")
    if nin:
        row += ["    " + " ".join(f"int64_t o{k} = 0;" for k in range(nin)),
                "    int64_t rem = r;",
                "    for (int64_t d = nd - 1; d >= 0; d--) {",
                "        const int64_t i = rem % shape[d];",
                "        rem /= shape[d];",
                "        " + " ".join(f"o{k} += i * strides[{k} * (nd + {per}) + d];"
                                      for k in range(nin)),
                "    }"]
    row.append(f"    {out_t} *restrict po = ({out_t} *)ptrs[{nin}] + r * D;")
    for k, n in enumerate(region.stored):
        t = _ctype(n.dtype)
        row.append(f"    {t} *restrict pe{k} = ({t} *)ptrs[{nin + 1 + k}] + r * D;")
    for j, name in enumerate(scratch):
        t = _ctype(next(n.dtype for n, b in buf.items() if b == name))
        row.append(f"    {t} *restrict {name} = ({t} *)(scratch + (size_t){j} * bb);")
    g = len(scratch)
    for k, n in enumerate(region.inputs):
        t = _ctype(n.dtype)
        if not full[k]:
            row.append(f"    const {t} x{k} = ((const {t} *)ptrs[{k}])[o{k}];")
            continue
        if region.frame is None:
            row += [f"    const {t} *p{k} = (const {t} *)ptrs[{k}] + o{k};",
                    f"    const int64_t s{k} = strides[{k} * (nd + 1) + nd];",
                    f"    if (s{k} != 1) {{ {t} *g = ({t} *)(scratch + (size_t){g} * bb); "
                    f"for (int64_t j = 0; j < D; j++) g[j] = p{k}[j * s{k}]; p{k} = g; }}"]
        elif part[k]:  # one value per S1 index: read in the epilogue's S1 loop
            row += [f"    const {t} *p{k} = (const {t} *)ptrs[{k}] + o{k};",
                    f"    const int64_t t{k} = strides[{k} * (nd + 2) + nd];"]
        else:  # a row of S1 x S2 elements: dense, or gathered
            row += [f"    const {t} *p{k} = (const {t} *)ptrs[{k}] + o{k};",
                    f"    const int64_t t{k} = strides[{k} * (nd + 2) + nd], "
                    f"s{k} = strides[{k} * (nd + 2) + nd + 1];",
                    f"    if (!(s{k} == 1 && (S2 == D || t{k} == S2))) {{ "
                    f"{t} *g = ({t} *)(scratch + (size_t){g} * bb); "
                    f"for (int64_t j1 = 0; j1 < D / S2; j1++) for (int64_t j2 = 0; j2 < S2; "
                    f"j2++) g[j1 * S2 + j2] = p{k}[j1 * t{k} + j2 * s{k}]; p{k} = g; }}"]
        g += 1
    row += per_row_values(0)
    for index, p in enumerate(pass_list):
        if p.reduces is None and any(part):
            row += [f"    /* pass {index}: the epilogue, stored, S1 x S2 */",
                    "    for (int64_t j1 = 0; j1 < D / S2; j1++) {",
                    *(f"        const {_ctype(n.dtype)} x{k} = p{k}[j1 * t{k}];"
                      for k, n in enumerate(region.inputs) if part[k]),
                    *("    " + line for line in cg.IVDEP),
                    "        for (int64_t jj = j1 * S2; jj < (j1 + 1) * S2; jj++) {",
                    *body(p, "            ", index),
                    "        }",
                    "    }"]
            continue
        if p.reduces is None:
            row += [f"    /* pass {index}: the epilogue, stored */",
                    *cg.IVDEP,
                    "    for (int64_t jj = 0; jj < D; jj++) {",
                    *body(p, "        ", index),
                    "    }"]
            continue
        if shifted and index == 1:  # its sums were taken in the first pass: see Moment
            continue
        extra = shifted if shifted and index == 0 else []
        # blocks of BLOCK elements: one plain loop computes them (it vectorises, calls the
        # SIMD libm), then the lanes take them in from where they lie (a row, or the block)
        row.append(f"    /* pass {index}: {len(p.reduces) + 2 * len(extra)} reduction(s) */")
        row += ["    " + REDUCTIONS[r.op.name].declare(f"{names[r]}a{c}", _ctype(r.dtype))
                for r in p.reduces for c in range(CHAINS)]
        row += [f"    {_sum_declare(f'{a}{c}', 'float')}" for a in _moment_lanes(extra, names)
                for c in range(CHAINS)]
        row += [f"    float {names[m.reduction]}s = 0;" for m in extra]
        opened = [f"        {line}" for r in p.reduces for c in range(CHAINS)
                  if (line := REDUCTIONS[r.op.name].open(f"{names[r]}a{c}", _ctype(r.dtype)))]
        opened += [f"        {_sum_open(f'{a}{c}', 'float')}"
                   for a in _moment_lanes(extra, names) for c in range(CHAINS)]
        closed = [f"        {line}" for r in p.reduces for c in range(CHAINS)
                  if (line := REDUCTIONS[r.op.name].close(f"{names[r]}a{c}", _ctype(r.dtype)))]
        closed += [f"        {_sum_close(f'{a}{c}', 'float')}"
                   for a in _moment_lanes(extra, names) for c in range(CHAINS)]
        row += [f"    for (int64_t j0 = 0; j0 < D; j0 += {BLOCK}) {{",
                f"        const int64_t n = D - j0 < {BLOCK} ? D - j0 : {BLOCK};",
                *(f"        {_ctype(r.dtype)} {names[r]}t[{BLOCK}];" for r in p.reduces
                  if source(r) is None), *opened]
        if p.computes or any(source(r) is None for r in p.reduces):
            row += [*("    " + line for line in cg.IVDEP),
                    "        for (int64_t jj = j0; jj < j0 + n; jj++) {",
                    *body(p, "            ", index),
                    "        }"]
        for m in extra:  # the shift: the mean of the row's first elements, in double
            at, sv = start(m.first), f"{names[m.reduction]}s"
            row += ["        if (j0 == 0) {",
                    f"            const int64_t c = n < {SHIFT_SPAN} ? n : {SHIFT_SPAN};",
                    "            double acc = 0;",
                    f"            for (int64_t i = 0; i < c; i++) acc += {at}[i];",
                    f"            {sv} = (float)(acc / (double)c);",
                    "        }",
                    f"        const tg_vf {sv}v = {sv} - (tg_vf){{0}};"]
        step = LANES * CHAINS
        row += ["        int64_t k = 0;",
                f"        for (; k + {step} <= n; k += {step}) {{",
                *(f"            {block(r, c, f'{start(r)} + k + {c * LANES}')}"
                  for r in p.reduces for c in range(CHAINS)),
                *(f"            {_moment_block(m, names, c, f'{start(m.first)} + k + {c * LANES}')}"
                  for m in extra for c in range(CHAINS)),
                "        }",
                f"        for (; k + {LANES} <= n; k += {LANES}) {{",
                *(f"            {block(r, 0, f'{start(r)} + k')}" for r in p.reduces),
                *(f"            {_moment_block(m, names, 0, f'{start(m.first)} + k')}"
                  for m in extra),
                "        }",
                "        if (k < n) {",
                *(f"            {padded(r)}" for r in p.reduces),
                *(f"            {_moment_padded(m, names, start(m.first))}" for m in extra),
                "        }",
                *closed,
                "    }"]
        for r in p.reduces:
            red, t, a = REDUCTIONS[r.op.name], _ctype(r.dtype), f"{names[r]}a"
            w = CHAINS // 2
            while w:  # the chains pairwise, then the lanes pairwise
                row += [f"    {red.merge(f'{a}{c}', t, f'{a}{c + w}')}" for c in range(w)]
                w //= 2
            statement, value = red.finish(f"{a}0", t)
            row += [f"    {statement}", f"    const {t} {names[r]} = {value};"]
        for a in _moment_lanes(extra, names):  # T and Q, kept in double
            w = CHAINS // 2
            while w:
                row += [f"    {_sum_merge(f'{a}{c}', 'float', f'{a}{c + w}')}" for c in range(w)]
                w //= 2
            row.append(f"    {_sum_finish(f'{a}0', 'float')[0]}")
        row += per_row_values(region.level[p.reduces[0]])
        for m in extra:  # Q + 2 e T + D e^2, e = s + sign * w (not below 0: rounding)
            r = names[m.reduction]
            sign = "+" if m.sign > 0 else "-"
            row += [f"    const double {r}e = (double){r}s {sign} (double){names[m.w]};",
                    f"    const double {r}d = {r}Qa0[0] + 2.0 * {r}e * {r}Ta0[0] + "
                    f"(double)D * {r}e * {r}e;",
                    f"    const float {r} = (float)({r}d < 0.0 ? 0.0 : {r}d);"]
        if extra:
            row += per_row_values(region.level[extra[0].reduction])
    row.append("}")
    return _assemble(region, row, full, len(scratch), sum(full),
                     len(pass_list) - (1 if shifted else 0), helpers, part)


def _moment_lanes(extra: Sequence[Moment], names: Mapping[Node, str]) -> list[str]:
    """The lane names of each moment's T and Q sums."""
    return [f"{names[m.reduction]}{which}a" for m in extra for which in ("T", "Q")]


def _moment_block(m: Moment, names: Mapping[Node, str], chain: int, at: str) -> str:
    r = names[m.reduction]
    return (f"{{ tg_vf u; __builtin_memcpy(&u, {at}, sizeof u); const tg_vf d = u - {r}sv; "
            f"{r}Ta{chain}f += d; {r}Qa{chain}f += d * d; }}")


def _moment_padded(m: Moment, names: Mapping[Node, str], at: str) -> str:
    r = names[m.reduction]
    return (f"{{ tg_vf d; for (int l = 0; l < {LANES}; l++) d[l] = k + l < n ? "
            f"{at}[k + l] - {r}s : 0.0f; {r}Ta0f += d; {r}Qa0f += d * d; }}")


def _assemble(region: RowRegion, row: list[str], full: tuple[bool, ...], buffers: int,
              gathers: int, npasses: int, helpers: set[str],
              part: tuple[bool, ...] = ()) -> RowEmitted:
    """The whole source: the C kernels' common header (inlined, so the source hash covers
    it: the team of a parallel region, ``tg_team``), helpers, the row function and the entry
    point that runs rows (in parallel from PARALLEL_MIN elements)."""
    used = cg.math_functions(region.nodes, region.consts.get)
    vector = sorted(used & cg.vector_math_functions())
    lines = [COMMON_HEADER.read_text(), ""]
    if vector:  # libmvec's SIMD variants (see codegen.vector_math_functions)
        lines += ["#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)",
                  *(cg._simd_decl(f) for f in vector), "#endif", ""]  # noqa: SLF001
    lines += [VECTOR_PRELUDE]
    lines += [cg._HELPERS[h] + "\n" for h in sorted(helpers)]  # noqa: SLF001
    lines += row
    nin = len(region.inputs)
    if region.frame is None:
        strided = " + ".join(f"(strides[{k} * (nd + 1) + nd] != 1)"
                             for k in range(nin) if full[k]) or "0"
    else:
        strided = " + ".join(f"!(strides[{k} * (nd + 2) + nd + 1] == 1 && (shape[nd] == D || "
                             f"strides[{k} * (nd + 2) + nd] == shape[nd]))"
                             for k in range(nin) if full[k] and not (part and part[k])) \
            or "0"
    lines += [
        "",
        "int NAME(int64_t rows, int64_t D, int64_t nd, const int64_t *shape, "
        "const int64_t *strides, void *const *ptrs) {",
        "    if (rows <= 0 || D <= 0) return 0;",
        f"    const int64_t nbuf = {buffers} + ({strided} ? {gathers} : 0);",
        "    const size_t bb = ((size_t)D * 8 + 63) & ~(size_t)63;  /* one row buffer */",
        # the process's thread setting, or the calling thread alone while the cores are
        # oversubscribed (a region waits for its slowest thread: tg_common.h, tg_team)
        "    const int team = rows < 2 || rows * D < " + str(PARALLEL_MIN) + " ? 1 : tg_team();",
        "    const int serial = team <= 1;",
        "    char *scratch = NULL;",
        "    if (nbuf) { scratch = (char *)malloc((size_t)team * (size_t)nbuf * bb + 64);"
        " if (!scratch) return 2; }",
        "    if (serial) {",
        "        for (int64_t r = 0; r < rows; r++) tg_row(r, D, nd, shape, strides, ptrs,"
        " scratch, bb);",
        "    } else {",
        "        #pragma omp parallel num_threads(team)",
        "        {",
        "            char *mine = scratch;",
        "#ifdef _OPENMP",
        "            if (mine) mine += (size_t)omp_get_thread_num() * (size_t)nbuf * bb;",
        "#endif",
        "            #pragma omp for schedule(static)",
        "            for (int64_t r = 0; r < rows; r++) tg_row(r, D, nd, shape, strides, ptrs,"
        " mine, bb);",
        "        }",
        "    }",
        "    free(scratch);",
        "    return 0;",
        "}",
        "",
    ]
    template = "\n".join(lines)
    signature = ",".join(n.dtype.name for n in region.inputs) + "->" + ",".join(
        n.dtype.name for n in (region.root, *region.stored))
    if region.frame is not None:  # the Python side's layout: one kernel per frame
        signature += repr(region.frame)
    key = hashlib.blake2b((signature + "\n" + template).encode(), digest_size=6).hexdigest()
    symbol = f"tg_row_{key}"
    source = f"/* generated by tensor_graphs.kernels.c.rowgen: {summary(region)} */\n" \
        + template.replace("int NAME(", f"int {symbol}(", 1)
    flags = cg.flags_for(region.nodes) + (("-lmvec",) if vector else ())
    return RowEmitted(source, symbol, key, tuple(n.dtype for n in region.inputs),
                      region.root.dtype, full, flags, npasses, buffers,
                      tuple(n.dtype for n in region.stored), region.frame)


def summary(region: RowRegion) -> str:
    """What explain() and the source's first line say about the kernel."""
    reductions = [n.op.name for n in region.reductions]
    ops = ", ".join(f"{v} {k}" if v > 1 else k for k, v in region.ops.items()
                    if k not in REDUCTIONS)
    ins = ", ".join(n.dtype.name for n in region.inputs)
    pass_list, stored = passes(region)
    npasses = len(pass_list) - (1 if moments(region, pass_list, stored) else 0)
    also = f", storing {len(region.stored)} more" if region.stored else ""
    return (f"rows: {len(reductions)} reductions ({', '.join(reductions)}) and "
            f"{len(region.nodes) - len(reductions)} elementwise ops ({ops}) in {npasses} "
            f"passes over ({ins}) -> {region.root.dtype.name}{also}")


# ---------------------------------------------------------------------------- calling
def _layout(arrays: Sequence[np.ndarray], shape: tuple[int, ...]
            ) -> tuple[list[int], list[list[int]]]:
    """Merged leading dims and, per input, their element strides (0 where broadcast) and the
    row's stride last. Leading axes contiguous with the previous one for every input merge."""
    rank = len(shape)
    per = []
    for a in arrays:
        lead = rank - a.ndim
        per.append([0 if i < lead or a.shape[i - lead] == 1 else a.strides[i - lead] // a.itemsize
                    for i in range(rank)])
    dims: list[int] = []
    merged: list[list[int]] = [[] for _ in arrays]
    for axis in range(rank - 1):
        size = shape[axis]
        if size == 1:
            continue
        if dims and all(m[-1] == s[axis] * size for m, s in zip(merged, per)):
            dims[-1] *= size
            for m, s in zip(merged, per):
                m[-1] = s[axis]
            continue
        dims.append(size)
        for m, s in zip(merged, per):
            m.append(s[axis])
    width = shape[-1] if rank else 1
    last = [1 if width == 1 else s[-1] for s in per]  # a row of one: any stride reads it
    return dims, [m + [t] for m, t in zip(merged, last)]


def refinement(a: Sequence[int], b: Sequence[int]) -> list[tuple[int, int, int]] | None:
    """The common refinement of two shapes of one size (C order): its axes as (size, axis of
    ``a``, axis of ``b``) they lie in; None where the shapes do not nest (a reshape that mixes
    axes). (N, G, D) and (N, C, H, W), C = G x Cg, D = Cg x H x W: N, G, Cg, H, W."""
    def cuts(shape):
        out, p = [], 1
        for d in shape:
            p *= d
            out.append(p)
        return out

    ca, cb = cuts(a), cuts(b)
    if not ca or ca[-1] != cb[-1]:
        return None
    points = sorted(set(ca) | set(cb))
    out, prev = [], 1
    for p in points:
        if p % prev:
            return None
        ia = next(i for i, c in enumerate(ca) if c >= p)
        ib = next(i for i, c in enumerate(cb) if c >= p)
        out.append((p // prev, ia, ib))
        prev = p
    return out


def _merged(sizes: Sequence[int], strides: Sequence[int]) -> int | None:
    """One stride for consecutive axes read as one (C order), or None where they are not."""
    axes = [(z, s) for z, s in zip(sizes, strides) if z != 1]
    for (_, s0), (z1, s1) in zip(axes, axes[1:]):
        if s0 != s1 * z1:
            return None
    return axes[-1][1] if axes else 0


def frame_layout(frame: Frame, arrays: Sequence[np.ndarray]
                 ) -> tuple[tuple[bool, ...], list[int], list[list[int]]]:
    """(which inputs are made dense first, the rows' leading dims, per input the element
    strides of those dims then of a row's S1 and S2 axes) for arrays of the frame's region
    (see ``Frame``): each read in its shape, broadcast in its space, through the refinement
    of the two spaces."""
    refined = refinement(frame.rows, frame.out)
    lead_axes = len(frame.rows) - 1
    copy: list[bool] = []
    per: list[list[int]] = []
    for a, read, space in zip(arrays, frame.reads, frame.spaces):
        for dense in (False, True):
            strides = _frame_strides(frame, refined, lead_axes, a, read, space, dense)
            if strides is not None:
                break
        else:
            raise KernelConstraintError(f"input {a.shape} cannot be read in rows of {frame.rows}")
        copy.append(dense)
        per.append(strides)
    return tuple(copy), list(frame.rows[:-1]), per


def _frame_strides(frame, refined, lead_axes, a, read, space, dense) -> list[int] | None:
    if dense:
        a = np.ascontiguousarray(a)
    view = a.reshape(read)
    if any(st % view.itemsize for st in view.strides) and view.size:
        return None
    full = frame.rows if space == "rows" else frame.out
    rank = len(full)
    lead = rank - view.ndim
    el = [0 if i < lead or view.shape[i - lead] == 1 else view.strides[i - lead] // view.itemsize
          for i in range(rank)]
    which = 1 if space == "rows" else 2  # the refined axis's axis in this space
    sizes, strides = [], []
    for k, r in enumerate(refined):
        axis = r[which]
        inner = math.prod(z[0] for z in refined[k + 1:] if z[which] == axis)
        sizes.append(r[0])
        strides.append(el[axis] * inner)
    out = []
    for axis in range(lead_axes):  # the rows' leading dims
        idx = [k for k, r in enumerate(refined) if r[1] == axis]
        m = _merged([sizes[k] for k in idx], [strides[k] for k in idx])
        if m is None:
            return None
        out.append(m)
    idx = [k for k, r in enumerate(refined) if r[1] == lead_axes]  # the row: S1 then S2
    z = [sizes[k] for k in idx]
    st = [strides[k] for k in idx]
    cut, p = len(z), 1
    while cut > 0 and p < frame.split:
        cut -= 1
        p *= z[cut]
    if p != frame.split:
        return None
    s1, s2 = _merged(z[:cut], st[:cut]), _merged(z[cut:], st[cut:])
    if s1 is None or s2 is None:
        return None
    return out + [s1, s2]


def shape_failure(emitted: RowEmitted, shapes: Sequence[tuple]) -> str | None:
    """Why inputs of these shapes do not fit the kernel: they must broadcast, and each input
    has the row's length (a full input) or 1 (a per-row input) on the last axis. A kernel
    over a ``Frame`` takes its region's own shapes only (its reshapes name them)."""
    frame = getattr(emitted, "frame", None)  # (Triton's rendered rows have none)
    if frame is not None:
        for k, (s, want) in enumerate(zip(shapes, frame.reads)):
            if math.prod(s) != math.prod(want):
                return (f"input 'x{k}' {tuple(s)} is read as {want}: this kernel takes its "
                        "region's own shapes")
        return None
    try:
        out = np.broadcast_shapes(*(tuple(s) for s in shapes))
    except ValueError:
        return f"input shapes {', '.join(str(tuple(s)) for s in shapes)} do not broadcast"
    if not out:
        return "the result is 0-d: there is no row"
    for k, (s, full) in enumerate(zip(shapes, emitted.full)):
        last = s[-1] if len(s) else 1
        if full and (not len(s) or last != out[-1]):
            return f"input 'x{k}' {tuple(s)} must span the row ({out[-1]} on the last axis)"
        if not full and last != 1:
            return f"input 'x{k}' {tuple(s)} holds one value per row: its last axis must be 1"
    return None


def make_row_function(emitted: RowEmitted, lib: ctypes.CDLL, description: str):
    """The Python function of a compiled row kernel: numpy arrays in (any strides), a new
    array out or the ``out=`` buffer filled (``writes_out``). The call layout is remembered
    per input shapes and strides. A kernel that stores values besides the root writes them
    into ``also=`` (one C-contiguous array of the result's shape each, or None: allocated and
    dropped) and returns the root's array, so a caller that wants the root alone (verify, the
    profiler) calls it as any kernel."""
    cfn = getattr(lib, emitted.symbol)
    cfn.restype = ctypes.c_int
    cfn.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                    ctypes.c_void_p, ctypes.c_void_p]
    in_np = tuple(d.np_dtype for d in emitted.input_dtypes)
    out_np = emitted.out_dtype.np_dtype
    nin = len(in_np)
    extra_np = tuple(d.np_dtype for d in emitted.stored_dtypes)
    ptr_array = ctypes.c_void_p * (nin + 1 + len(extra_np))
    plans: dict[tuple, tuple] = {}

    def plan(arrs):
        why = shape_failure(emitted, [a.shape for a in arrs])
        if why is not None:
            raise KernelConstraintError(f"{description}: {why}")
        if emitted.frame is not None:
            return frame_plan(arrs)
        shape = np.broadcast_shapes(*(a.shape for a in arrs))
        copy = tuple(any(st % a.itemsize for st in a.strides) for a in arrs)
        arrs = [np.ascontiguousarray(a) if c else a for a, c in zip(arrs, copy)]
        dims, strides = _layout(arrs, shape)
        dims_a = np.asarray(dims or [1], np.int64)
        st = np.asarray(strides, np.int64).reshape(-1) if nin else np.zeros(1, np.int64)
        rows = math.prod(shape[:-1])
        if len(plans) >= 256:
            plans.clear()
        return shape, copy, rows, shape[-1], len(dims), dims_a.ctypes.data, st.ctypes.data, \
            (dims_a, st)

    def frame_plan(arrs):
        f = emitted.frame
        copy, dims, strides = frame_layout(f, arrs)
        dims_a = np.asarray([*dims, f.split], np.int64)
        st = np.asarray(strides, np.int64).reshape(-1) if nin else np.zeros(1, np.int64)
        return f.out, copy, math.prod(f.rows[:-1]), f.rows[-1], len(dims), \
            dims_a.ctypes.data, st.ctypes.data, (dims_a, st)

    def run(*arrays, out=None, also=None):
        arrs = cg.checked_arrays(arrays, in_np, description)
        key = tuple((a.shape, a.strides) for a in arrs)
        found = plans.get(key)
        if found is None:
            found = plans[key] = plan(arrs)
        shape, copy, rows, width, nd, dims_p, st_p, blocks = found
        if any(copy):
            arrs = [np.ascontiguousarray(a) if c else a for a, c in zip(arrs, copy)]
        if emitted.frame is not None:  # each read in its reshape's shape (a view: dense)
            arrs = [a.reshape(r) for a, r in zip(arrs, emitted.frame.reads)]
        if out is None:
            out = np.empty(shape, out_np)
        extra = list(also or [None] * len(extra_np))
        for k, (e, t) in enumerate(zip(extra, extra_np)):
            if e is None:
                extra[k] = np.empty(shape, t)
            elif e.shape != out.shape or e.dtype != t or not e.flags.c_contiguous:
                raise KernelConstraintError(f"{description}: stored value {k} needs a "
                                            f"C-contiguous {t} array of shape {shape}, got "
                                            f"{e.dtype} {e.shape}")
        if out.size == 0:
            return out
        ptrs = ptr_array(*[a.ctypes.data for a in arrs], out.ctypes.data,
                         *[e.ctypes.data for e in extra])
        rec = _clib.recording  # the native loop records the call; dims/strides are small blocks
        call = cfn if rec is None else rec.wrap(cfn, blocks)
        if call(rows, width, nd, dims_p, st_p, ptrs):
            raise OutOfMemory(f"{description}: no memory for its row buffers "
                              f"({emitted.buffers} of {width} elements per thread)", "cpu")
        return out

    run.source_text = emitted.source
    run.c_function = cfn
    run.__name__ = f"c_row_{emitted.key}"
    run.__qualname__ = run.__name__
    run.__doc__ = description
    return run


# ---------------------------------------------------------------------------- checking
def trial_shapes(region: RowRegion) -> list[list[tuple[int, ...]]]:
    """Input shapes to check on: the region's own (when small) and variants whose rows have
    1, 7, 33 and 1025 elements and whose other dims are at most 3, broadcasts kept."""
    ins = [cg._concrete_shape(n.shape) for n in region.inputs]  # noqa: SLF001
    if region.frame is not None:  # its reshapes name the shapes: those alone, then strided
        return [ins, ins]
    out = tuple(np.broadcast_shapes(*ins))
    rank = len(out)
    trials = [ins] if math.prod(out) <= 1 << 16 else []
    for last in (1, 7, 33, 1025):
        sizes = [min(d, 3) for d in out[:-1]] + [last]
        trials.append([tuple(1 if d == 1 else sizes[rank - len(s) + j]
                             for j, d in enumerate(s)) for s in ins])
    return trials


def _floor(region: RowRegion) -> float:
    """The smallest tolerance the kernel can declare: its least precise float dtype's."""
    floats = [n.dtype.name for n in (*region.nodes, *region.inputs) if n.dtype.is_float]
    return max((cg.FLOAT_TOLERANCE[d] for d in floats), default=cg.EXACT_TOLERANCE)


def region_graph(region: RowRegion, leaves: Sequence[Node], outputs: bool = False):
    """The region alone over new leaves for its inputs (``ir.graph.substitute`` would rebuild
    the whole graph above them: a block's input that also feeds another input's producer
    would be rebuilt there at the trial's shape, a ShapeError). ``outputs``: the list of the
    root and the stored values instead of the root."""
    built: dict[Node, Node] = dict(zip(region.inputs, leaves))
    for n in region.nodes:
        built[n] = Node.make(n.op, tuple(built.get(i, i) for i in n.inputs), n.attrs, n.name)
    if outputs:
        return [built[region.root], *(built[n] for n in region.stored)]
    return built[region.root]


def check_row_kernel(fn, region: RowRegion, seed: int = 0) -> cg.CheckReport:
    """Run ``fn`` on seeded random inputs of ``trial_shapes`` (every other trial strided) and
    compare with ``tg.evaluate`` of the region: NaN and inf where the float64 or the
    native-dtype evaluation has them, finite values within max(floor, 16x the native-dtype
    evaluation's error against float64) — the tolerance the kernel then declares. A region
    that stores values besides its root is checked on every one of them."""
    from tensor_graphs.ir.builder import input as _input
    from tensor_graphs.ir.evaluate import evaluate
    from tensor_graphs.ir.graph import leaves as leaves_of
    from tensor_graphs.kernels.verify import compare
    from tensor_graphs.numerics import relative_error

    rng = np.random.default_rng(seed)
    errors: list[tuple[float, tuple]] = []
    native = 0.0
    tried = []
    for t, shapes in enumerate(trial_shapes(region)):
        leaves = [_input(f"x{k}", s, n.dtype) for k, (n, s) in
                  enumerate(zip(region.inputs, shapes))]
        graph, *stored = region_graph(region, leaves, outputs=True)
        arrays = [cg._random_array(rng, s, n.dtype, False, t % 2 == 1)  # noqa: SLF001
                  for n, s in zip(region.inputs, shapes)]
        feeds = {leaf.name: a for leaf, a in zip(leaves, arrays)}
        extra = [np.full(graph.shape, np.nan, n.dtype.np_dtype) for n in stored]
        results = [fn(*arrays, also=extra) if extra else fn(*arrays), *extra]
        tried.append(tuple(map(tuple, shapes)))
        for which, (node, got) in enumerate(zip((graph, *stored), results)):
            what = "" if not which else f"stored value {which - 1}: "
            mine = {leaf.name for leaf in leaves_of(node)}
            fed = {k: v for k, v in feeds.items() if k in mine}
            r32, r64 = evaluate(node, fed), evaluate(node, fed, dtype="float64")
            if got.shape != r32.shape or got.dtype != r32.dtype:
                return cg.CheckReport(False, math.inf, 0.0, tried, f"{what}output {got.shape} "
                                      f"{got.dtype}, reference {r32.shape} {r32.dtype}")
            if got.dtype.kind != "f":
                if not np.array_equal(got, r32) and \
                        not np.array_equal(got, r64.astype(got.dtype)):
                    return cg.CheckReport(False, math.inf, 0.0, tried, f"{what}shapes "
                                          f"{shapes}: differs from the reference")
                continue
            error, problem = compare(got, r64, r32)
            if problem is not None:
                return cg.CheckReport(False, math.inf, 0.0, tried,
                                      f"{what}shapes {shapes}: {problem}")
            fin = np.isfinite(r32) & np.isfinite(r64)
            if fin.any():
                native = max(native, relative_error(r32[fin], r64[fin]))
            errors.append((error, tuple(map(tuple, shapes))))
    tolerance = max(_floor(region), 16 * native)
    worst = max((e for e, _ in errors), default=0.0)
    over = [(e, s) for e, s in errors if not e <= tolerance]
    msg = ""
    if over:
        msg = (f"relative error {over[0][0]:.3g} > tolerance {tolerance:.3g} (numpy's own "
               f"error {native:.3g}) at shapes {list(over[0][1])}")
    return cg.CheckReport(not over, worst, tolerance, tried, msg)


# ---------------------------------------------------------------------------- kernels
@dataclass(frozen=True, eq=False, repr=False)
class RowKernel(registry.Kernel):
    """A generated row kernel: a Kernel whose pattern is its region (what ``tg.kernels.verify``
    builds its reference from), shown by the ops inside."""

    summary: str = ""
    generated: bool = True  # explain() shows the ops inside, not a hand kernel's name

    def __repr__(self) -> str:
        return f"<kernel {self.name} ({self.backend}, {self.device}) {self.summary}>"


def region_pattern(region: RowRegion) -> tuple[pat.Pat, tuple[str, ...]]:
    """The region as a pattern: inputs ``x0, x1, ...`` (guarded by dtype), constants and
    folded values ``pat.Const``, reductions with their axes and keepdims, casts with their
    dtype; a node used twice is one named sub-pattern."""
    built: dict[Node, pat.Pat] = {}
    names = []
    for k, n in enumerate(region.inputs):
        built[n] = pat.var(f"x{k}", dtype=n.dtype)
        names.append(f"x{k}")
    for c, v in region.consts.items():
        built[c] = pat.Const(v.item() if isinstance(v, np.generic) else v)
    users: dict[Node, list[Node]] = {}
    for n in region.nodes:
        for i in n.inputs:
            users.setdefault(i, []).append(n)
    for k, n in enumerate(region.nodes):
        keep = ("axes", "keepdims") if n.op.name in REDUCTIONS else \
            ("dtype",) if n.op.name == CAST else ("shape",) if n.op.name == RESHAPE else ()
        p = pat.OpPat(n.op.name, tuple(built[i] for i in n.inputs),
                      {a: n.attrs[a] for a in keep})
        if len(users.get(n, ())) > 1 and not cg._joins_user_chain(n, users[n]):  # noqa: SLF001
            p = p.bind(f"v{k}")
        built[n] = p
    return built[region.root], tuple(names)


def region_signatures(region: RowRegion) -> list[dict]:
    """``trial_shapes`` as ``tg.kernels.verify`` signatures."""
    from tensor_graphs.kernels.signatures import Spec

    return [{f"x{k}": Spec(tuple(s), n.dtype.name, "normal")
             for k, (n, s) in enumerate(zip(region.inputs, shapes))}
            for shapes in trial_shapes(region)]


def build_row_kernel(region: RowRegion, emitted: RowEmitted | None = None,
                     verify: bool = True) -> RowKernel:
    """Compile, check and verify the region's kernel (``KernelVerificationError`` when it
    disagrees with the reference, ``CCompileError`` when it does not compile); not
    registered."""
    from tensor_graphs.kernels.c.build import load_library

    emitted = emitted or emit_row_c(region)
    name = f"c_row_{emitted.key}"
    text = f"generated C {summary(region)}"
    lib = load_library(name, emitted.source, emitted.flags)
    threads.register_library(lib)  # one thread count for OpenMP, OpenBLAS and torch
    fn = make_row_function(emitted, lib, f"{name} ({text})")
    pattern, var_names = region_pattern(region)

    def where(shapes, dts, attrs):
        for k, (d, want) in enumerate(zip(dts, emitted.input_dtypes)):
            if d != want:
                return f"input 'x{k}' must be {want.name}, got {d.name}"
        return shape_failure(emitted, shapes) or True

    kernel = RowKernel(
        name=name, pattern=pattern, backend="c", device="cpu", fn=fn, inputs=var_names,
        signatures=region_signatures(region),
        dtypes=tuple(dict.fromkeys(emitted.input_dtypes)) or None, where=where,
        tolerance=_floor(region), writes_out=True, doc=text,
        source_hash=cg.source_hash(emitted), summary=text)
    if not verify:
        return kernel
    return cg.admitted(kernel, check_row_kernel(fn, region), emitted.source)


# ---------------------------------------------------------------------------- as planner options
_reaching: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # node -> {width: bool}


def reaches_reduction(root: Node, expand: Callable[[Node], Node | None], width,
                      member: Callable[[Node, object], bool] = joins) -> bool:
    """Whether a reduction joins the region rooted at ``root`` through nodes that ``member``
    accepts (``joins``, or another renderer's rule; composites through their decompositions),
    ignoring what is read outside: the cheap test before ``grow``, memoised per node and rule
    (nodes are immutable), so each node of a graph is looked at once however many roots reach
    it."""
    key = width if member is joins else (width, member)
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        n, ready = stack.pop()
        memo = _reaching.setdefault(n, {})
        if key in memo:
            continue
        if n.op.is_leaf:
            memo[key] = False
            continue
        inner = (expand(n),) if not n.op.is_atomic else n.inputs
        if not n.op.is_atomic and inner[0] is None:
            memo[key] = False
            continue
        if n.op.is_atomic and not member(n, width):
            memo[key] = False
            continue
        if n.op.is_atomic and n.op.name in REDUCTIONS:
            memo[key] = True
            continue
        if not ready:
            stack.append((n, True))
            stack.extend((i, False) for i in inner if key not in _reaching.get(i, {}))
            continue
        memo[key] = any(_reaching[i][key] for i in inner)
    return _reaching[root][key]


def row_candidate(root: Node, uses: Mapping[Node, int], expand: Callable[[Node], Node | None]):
    """The planner's generated option at ``root``: the largest row region rooted there (an
    elementwise root over full rows, at least one last-axis reduction inside) whose inner
    values nothing else reads, reaching through composites (mean, var, rsqrt, ...) into their
    decompositions (``kernels.generated.grow``); rendered, not compiled (see
    ``kernels.generated.realize``). None for pure elementwise regions (``codegen``'s) and
    where the region has no reduction."""
    from tensor_graphs.kernels import generated

    inside = _rows_at(root, expand)
    if inside is None:
        return None
    grown = generated.grow(root, uses, expand, inside)
    return None if grown is None else _row_candidate(root, *grown, ())


def stored_row_candidate(root: Node, uses: Mapping[Node, int],
                         expand: Callable[[Node], Node | None]):
    """``row_candidate`` where values inside are also read outside (the residual stream
    ``h = x + r`` a norm reads and the next block reads too): the larger region that stores
    them beside the root (``generated.grow_stored``; the candidate's ``also``), so the add
    and the norm are one kernel. None where nothing inside is read outside."""
    from tensor_graphs.kernels import generated

    inside = _rows_at(root, expand)
    if inside is None:
        return None
    grown = generated.grow_stored(root, uses, expand, inside, lambda n: storable(n, root))
    return None if grown is None else _row_candidate(root, *grown)


def grouped_row_candidate(root: Node, uses: Mapping[Node, int],
                          expand: Callable[[Node], Node | None]):
    """The planner's generated option at ``root`` for rows reached through a reshape: a
    GroupNorm (``tg.group_norm``'s decomposition or a user's own: a reshape to (N, G, rest),
    the statistics over the last axis, the reshape back and a per-channel scale and shift) as
    one kernel over ``Frame`` rows. None where the region has no reshape between its rows and
    its root's shape (``row_candidate``'s regions)."""
    from tensor_graphs.kernels import generated

    if not cg.fusable(root) or root.ndim < 2 or not _ints(root.shape):
        return None
    if not reaches_reduction(root, expand, None, grouped_joins):
        return None
    grown = generated.grow(root, uses, expand, grouped_joins)
    if grown is None:
        return None
    covers, boundary, through = grown
    if not any(n.op.name == RESHAPE for n in covers) or \
            not any(n.op.name in REDUCTIONS for n in covers):
        return None
    top = generated.rebuilt(covers, through)
    region = grouped_region(top, boundary)
    if region is None:
        return None
    emitted = emit_row_c(region)

    def build() -> RowKernel:
        return build_row_kernel(region, emitted)

    return generated.Candidate(
        "rows_grouped", root, covers, region.inputs, f"c_row_{emitted.key}",
        cg.source_hash(emitted), _floor(region), f"generated C {summary(region)}", build,
        computes=top, draft=lambda: build_row_kernel(region, emitted, verify=False))


def _rows_at(root: Node, expand) -> Callable[[Node], bool] | None:
    """The membership rule of the row regions rooted at ``root``, or None where no row
    region roots there (not a full-row elementwise root, or no reduction reachable)."""
    if not cg.fusable(root) or root.ndim == 0 or _is_one(_last(root)):
        return None
    width = _last(root)
    if not reaches_reduction(root, expand, width):  # most roots: no grow needed
        return None
    return lambda n: joins(n, width)


def _row_candidate(root: Node, covers, boundary, through, stored) :
    from tensor_graphs.kernels import generated

    if not any(n.op.name in REDUCTIONS for n in covers):
        return None
    built = generated.rebuilt_map(covers, through)
    region = row_region(built[covers[-1]], boundary, stored=[built[n] for n in stored])
    if region is None:
        return None
    emitted = emit_row_c(region)

    def build() -> RowKernel:
        return build_row_kernel(region, emitted)

    return generated.Candidate(
        "rows", root, covers, region.inputs, f"c_row_{emitted.key}", cg.source_hash(emitted),
        _floor(region), f"generated C {summary(region)}", build, also=tuple(stored),
        computes=built[covers[-1]],  # the profiler's graph: through composites it reached
        draft=lambda: build_row_kernel(region, emitted, verify=False))


__all__ = ["LANES", "REDUCTIONS", "RowRegion", "RowEmitted", "RowKernel", "Pass", "joins",
           "row_region", "passes", "emit_row_c", "make_row_function", "shape_failure",
           "trial_shapes", "check_row_kernel", "region_pattern", "region_signatures",
           "build_row_kernel", "row_candidate", "stored_row_candidate", "storable", "summary",
           "Frame", "grouped_joins", "grouped_region", "grouped_row_candidate", "refinement",
           "frame_layout"]
