"""Generated GEMM epilogues: the elementwise region after a matmul, fused into the packed GEMM.

    cand = gemm_candidate(root, uses, expand)   # a kernels.generated.Candidate, or None
    kernel = cand.build()                       # compiled, checked, verified: a GemmKernel

The hand-written packed kernels (``gemm.py``) fuse a bias, relu/gelu/gelu_tanh and a residual
add into the GEMM's store. Anything else after a product — a SiLU, a scale, an activation
nobody wrote, a residual after a scaled activation — ran as the GEMM and then a pass over its
(M, N) result, written and read back. Here the elementwise region rooted at a node that reads
a float32 ``a @ w`` (``w`` 2-D, read once per binding: the planner offers the candidate only
where it is static; ``a @ permute(W)``, ``linear``'s form, packs W directly) becomes the tile
epilogue of ``gemm.c``: applied to each tile row's 16 lanes as its last K block leaves the
accumulators, before the row's one store, so the product never goes through memory. A region
a registered packed kernel computes from the same arguments (a bias, relu/gelu, a residual)
is left to it: the same core and store, nothing to win for a compile.

The region is found by ``kernels.generated.grow`` with the elementwise ``inside`` test of
``codegen`` widened by *row reshapes* (a reshape whose input and result both have the root's
element count and last dim: the (B*T, N) product of ``x.view(-1, K) @ W`` viewed as (B, T, N),
bias and activation on either side) and by the one matmul (and its transposed weight) it
fuses; ``grow`` keeps only what nothing outside reads, so the product must be read by the
region alone. Every value of the region then lives in a *frame*: a full shape (the root's
element count, last dim N) whose rows are the GEMM's rows, or, for a broadcast value, the frame
of the ops that read it. An operand is loaded at the tile lane (row, col) through its frame:
the row's multi-index over the frame's leading dims (merged where the operand's strides allow:
a per-column vector, a per-row vector, a full operand and a scalar are one dim) times its
strides, plus the column when its last dim is N. 0-d constants are C literals.

The C is ``gemm.c``'s text compiled after a generated ``tg_gemm_gen_row`` (the hook
TG_GEMM_GENERATED) and an entry point taking the operands' pointers and their row layouts; the
lane loop is a ``#pragma omp simd`` over the 16 lanes (libmvec for exp/log/sin/erf/pow where
``codegen`` found it agrees with numpy). It is compiled with gemm.c's flags (FMA contraction
allowed: the epilogue reads a product that already carries the K-sum's rounding, and the
rounding bound below counts each op's rounding separately, which a contraction only lowers).

Checks before anything is timed or run (``build``): ``check_gemm_kernel`` on seeded trials
(1, 7, 13, 150 and 515 rows and the region's own, N 1 to 1025 where no reshape pins them, K 1
to 1025: the one-row, edge-tile, K-blocked, two-MC-block and split-M paths of the GEMM; the
epilogue's operands get NaN/inf in one trial) against ``tg.evaluate`` in float64, the
tolerance declared from the measured error (max(float32 floor, 4x the worst); accepted within
16x numpy's own float32 error), then ``tg.kernels.verify(strict=True)``. Where the data make
the epilogue cancel, both accept an error within ``gemm_rounding_bound``: the product's
worst-case K-sum bound gamma_K |a| @ |w|, carried through the epilogue's ops as
``codegen.rounding_bound`` does.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import sympy

from tensor_graphs import threads
from tensor_graphs.errors import KernelConstraintError, ShapeError
from tensor_graphs.ir.dtypes import DType
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import CAST, CONSTANT, MATMUL, PERMUTE, POW, RESHAPE
from tensor_graphs.ir.shapes import broadcast_shapes, free_symbols, numel
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import codegen as cg
from tensor_graphs.kernels.c import gemm
from tensor_graphs.kernels.c import lib as _clib
from tensor_graphs.kernels.c.lib import I64, P
from tensor_graphs.rewrite import pattern as pat

LANES = gemm.PANEL  # a tile row: the columns of one packed panel (NR in gemm.c)
DECLARED = 1e-5  # the error a candidate declares before its checks (as the packed kernels do)
FLOOR = cg.FLOAT_TOLERANCE["float32"]  # the least tolerance a float32 kernel declares
U32 = 2.0 ** -24  # float32 unit roundoff
U64 = 2.0 ** -53


# ---------------------------------------------------------------------------- regions
@dataclass(frozen=True, eq=False)
class GemmRegion:
    """A matmul and the elementwise region after it, over atomic ops (``rebuilt``)."""

    root: Node  # the region's root (float32, full)
    product: Node  # the matmul: a @ w, or a @ permute(w) when ``linear``
    a: Node  # kernel argument 0: (..., K)
    w: Node  # kernel argument 1: (K, N), or (N, K) when ``linear``
    linear: bool
    nodes: tuple[Node, ...]  # the epilogue: elementwise ops and row reshapes, root last
    inputs: tuple[Node, ...]  # its other operands: kernel arguments 2, 3, ...
    constants: tuple[Node, ...]  # 0-d constants, inlined
    frames: dict  # epilogue node -> its frame (leading 1s dropped)
    loads: tuple[tuple[int, tuple, bool], ...]  # (input index, frame, varies along N)
    uses: dict  # (node, operand position) -> load index, for the epilogue's input reads

    @property
    def reshaped(self) -> bool:
        """Whether a row reshape is inside (frames then follow the graph's shapes, not the
        result's broadcast)."""
        return any(n.op.name == RESHAPE for n in self.nodes)

    @property
    def ops(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            if n.op.name != RESHAPE:
                counts[n.op.name] = counts.get(n.op.name, 0) + 1
        return dict(sorted(counts.items()))


def _strip(shape: Sequence) -> tuple:
    """A frame: the shape without its leading 1s (they index nothing)."""
    shape = tuple(shape)
    i = 0
    while i < len(shape) - 1 and isinstance(shape[i], int) and shape[i] == 1:
        i += 1
    return shape[i:]


def _eq(a, b) -> bool:
    """Two dims equal: sympy keeps products of symbols canonical, so ``==`` decides when
    they are; the expansion otherwise, remembered (the same element counts meet at every
    root: ``dims_equal`` simplifies, ~0.6 ms a call, and took GPT-2's compile from 2.7 to
    5.1 s)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return a == b or _expanded_equal(a, b)


@functools.lru_cache(maxsize=4096)
def _expanded_equal(a, b) -> bool:
    return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0


def _same(a: Sequence, b: Sequence) -> bool:
    return len(a) == len(b) and all(_eq(x, y) for x, y in zip(a, b))


class _Full:
    """Whether a node has the root's element count and last dim (memoised per region)."""

    def __init__(self, root: Node):
        self.total, self.width = _numel(root), root.shape[-1]
        self.memo: dict[Node, bool] = {}

    def __call__(self, n: Node) -> bool:
        found = self.memo.get(n)
        if found is None:
            found = self.memo[n] = n.ndim >= 1 and _eq(n.shape[-1], self.width) \
                and _eq(_numel(n), self.total)
        return found


_numels: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # node -> element count


def _numel(n: Node):
    found = _numels.get(n)
    if found is None:
        found = _numels[n] = numel(n.shape)
    return found


def _row_reshape(n: Node, full: _Full) -> bool:
    """A reshape that keeps the rows: its input and result are both full."""
    return n.op.name == RESHAPE and full(n) and full(n.inputs[0])


def _product_of(n: Node, expand) -> Node | None:
    """The matmul ``n`` is, or the one a composite decomposes to (``linear`` without bias)."""
    if n.op.name == MATMUL:
        return n
    if not n.op.is_atomic and not n.op.is_leaf:
        d = expand(n)
        if d is not None and d.op.name == MATMUL:
            return d
    return None


def _packable(m: Node) -> bool:
    """A float32 a @ w the packed GEMM computes: a of rank >= 2, w 2-D."""
    a, w = m.inputs
    return (m.dtype.name == a.dtype.name == w.dtype.name == "float32" and a.ndim >= 2
            and w.ndim == 2)


def _transposed(w: Node) -> bool:
    """permute(W, (1, 0)) of a 2-D W: ``linear``'s weight, packed from W directly."""
    return w.op.name == PERMUTE and w.ndim == 2 and tuple(w.attrs["perm"]) == (1, 0)


_reaching: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # node -> bool


def reaches_product(root: Node, expand) -> bool:
    """Whether a packable product is below ``root`` through elementwise ops and reshapes
    (composites through their decompositions), ignoring uses and shapes: the cheap test
    before the walk and ``grow``, memoised per node (nodes are immutable), so each node of a
    graph is looked at once however many roots reach it."""
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        n, ready = stack.pop()
        if n in _reaching:
            continue
        if n.op.is_leaf:
            _reaching[n] = False
            continue
        m = _product_of(n, expand)
        if m is not None:
            _reaching[n] = _packable(m)
            continue
        inner = n.inputs if n.op.is_atomic else (expand(n),)
        if n.op.is_atomic and not (cg.fusable(n) or n.op.name == RESHAPE) or None in inner:
            _reaching[n] = False
            continue
        if not ready:
            stack.append((n, True))
            stack.extend((i, False) for i in inner if i not in _reaching)
            continue
        _reaching[n] = any(_reaching[i] for i in inner)
    return _reaching[root]


def _products(root: Node, expand, joins: Callable[[Node], bool], full: _Full) -> list[Node]:
    """Full packable products the region may reach (nearest first), ignoring uses: the nodes
    ``grow`` is then asked to take in. Breadth first over joining nodes, as grow walks, and
    no further than grow goes (``MAX_NODES``)."""
    from tensor_graphs.kernels.generated import MAX_NODES

    found: list[Node] = []
    seen: set[Node] = set()
    queue = deque([root])
    while queue and len(seen) < MAX_NODES:
        n = queue.popleft()
        if n in seen:
            continue
        seen.add(n)
        m = _product_of(n, expand)
        if m is not None:
            if _packable(m) and full(n) and n not in found:
                found.append(n)
            continue
        if n is not root and not joins(n):
            continue
        queue.extend(n.inputs if n.op.is_atomic else (expand(n),))
    return found


def _joins(n: Node, expand, inside: Callable[[Node], bool]) -> bool:
    if n.op.is_leaf:
        return False
    if n.op.is_atomic:
        return inside(n)
    d = expand(n)
    return d is not None and _joins(d, expand, inside)


def gemm_region(root: Node, uses: Mapping[Node, int], expand
                ) -> tuple[tuple[Node, ...], GemmRegion] | None:
    """(covers, region): the matmul and the elementwise region rooted at ``root`` that one
    GEMM with a generated epilogue computes, or None (see the module docstring)."""
    from tensor_graphs.kernels import generated

    if not cg.fusable(root) or root.dtype.name != "float32" or root.ndim == 0 \
            or all(cg.inlinable(i) for i in root.inputs) or not reaches_product(root, expand):
        return None
    full = _Full(root)

    def epilogue(n: Node) -> bool:
        return cg.fusable(n) or _row_reshape(n, full)

    for p in _products(root, expand, lambda n: _joins(n, expand, epilogue), full)[:2]:
        m = _product_of(p, expand)
        a, b = m.inputs
        weight = b.inputs[0] if _transposed(b) else None
        # the GEMM's operands stay outside, and so do the decompositions a composite operand
        # (a layer_norm) stands for: grow asks ``inside`` about its decomposition's root
        operands = {x for x in (a, b, weight) if x is not None}
        for x in list(operands):
            while x is not None and not x.op.is_atomic and not x.op.is_leaf:
                x = expand(x)
                if x is not None:
                    operands.add(x)

        def inside(n: Node, m=m, b=b, weight=weight, operands=operands) -> bool:
            if n is m or (n is b and weight is not None):
                return True
            return n not in operands and epilogue(n)

        grown = generated.grow(root, uses, expand, inside)
        if grown is None:
            continue
        covers, boundary, through = grown
        if m not in covers:
            continue  # the product is read outside: not this one
        top = generated.rebuilt(covers, through, cg._fold)  # noqa: SLF001
        found = _region(top, m, full, set(boundary), b in covers)
        if found is not None:
            return covers, found
    return None


def _region(top: Node, m: Node, full: _Full, boundary: set[Node], linear: bool
            ) -> GemmRegion | None:
    """The region over ``top`` (rebuilt; ``boundary``: the values it reads) with its frames
    and loads; ``linear``: the weight's permute is inside. None where a broadcast value would
    be read in two frames, or the epilogue reads the GEMM's own operands."""
    if not full(top):
        return None  # the product broadcasts into a larger result
    product = _find(top, m)
    if product is None:
        return None
    a, b = product.inputs
    w = b.inputs[0] if linear else b
    order: list[Node] = []
    inputs: list[Node] = []
    constants: list[Node] = []
    seen: set[Node] = set()
    stack: list[tuple[Node, bool]] = [(top, False)]
    while stack:  # post-order: operands before users
        n, ready = stack.pop()
        if ready:
            order.append(n)
            continue
        if n in seen:
            continue
        seen.add(n)
        if n is product:
            continue
        if n.op.is_leaf or n in boundary:
            if cg.inlinable(n):
                constants.append(n)
            else:
                inputs.append(n)
            continue
        stack.append((n, True))
        stack.extend((i, False) for i in reversed(n.inputs) if i not in seen)
    if any(i in (a, b, w) for i in inputs) or any(n.op.name == POW and n.dtype.is_int
                                                  for n in order):
        return None  # its own operands as epilogue operands; integer pow (may raise)
    frames: dict[Node, tuple] = {top: _strip(top.shape)}
    loads: list[tuple[int, tuple, bool]] = []
    use_of: dict[tuple[Node, int], int] = {}
    index = {n: k for k, n in enumerate(inputs)}
    for n in reversed(order):  # users before operands: each node's frame is known
        frame = frames[n]
        for pos, i in enumerate(n.inputs):
            if i is product or i in constants:
                continue
            want = _strip(i.shape) if (n.op.name == RESHAPE or full(i)) else frame
            if i in index:
                varies = i.ndim >= 1 and not (isinstance(i.shape[-1], int) and i.shape[-1] == 1)
                key = (index[i], want, varies)
                found = next((u for u, ld in enumerate(loads) if ld[0] == key[0]
                              and ld[2] == varies and _same(ld[1], want)), None)
                if found is None:
                    loads.append(key)
                    found = len(loads) - 1
                use_of[(n, pos)] = found
            elif i in frames:
                if not _same(frames[i], want):
                    return None  # a broadcast value read in two frames
            else:
                frames[i] = want
    return GemmRegion(top, product, a, w, linear, tuple(order), tuple(inputs),
                      tuple(constants), frames, tuple(loads), use_of)


def _find(top: Node, m: Node) -> Node | None:
    """The rebuilt matmul under ``top``: ``m`` itself (rebuilt keeps nodes whose inputs it did
    not change), found by identity."""
    stack, seen = [top], set()
    while stack:
        n = stack.pop()
        if n is m:
            return n
        if n in seen or n.op.is_leaf or n.op.name == MATMUL:
            continue
        seen.add(n)
        stack.extend(n.inputs)
    return None


# ---------------------------------------------------------------------------- C emission
@dataclass(frozen=True)
class GemmEmitted:
    """The C source of one GEMM epilogue and what calling it needs."""

    source: str
    symbol: str
    key: str  # hash of the source, the weight's layout and the frames: the kernel's identity
    flags: tuple[str, ...]
    load_dtypes: tuple[DType, ...]


def emit_gemm_c(region: GemmRegion) -> GemmEmitted:
    """``gemm.c`` with ``tg_gemm_gen_row`` computing ``region``'s epilogue on a tile row."""
    helpers: set[str] = set()
    values = {c: cg.uniform_value(c) for c in region.constants}
    names: dict[Node, str] = {c: cg.c_literal(values[c], c.dtype) for c in region.constants}
    names[region.product] = "p"
    body: list[str] = []
    for i, n in enumerate(region.nodes):
        args = [names[x] if (n, pos) not in region.uses else f"x{region.uses[(n, pos)]}"
                for pos, x in enumerate(n.inputs)]
        if n.op.name == RESHAPE:  # a row reshape moves no lane: the same value
            names[n] = args[0]
            continue
        body.append(f"const {cg._ctype(n.dtype)} v{i} = "  # noqa: SLF001
                    f"{cg._expr(n, args, helpers, values)};")  # noqa: SLF001
        names[n] = f"v{i}"
    root_value = names[region.root]
    load_types = [cg._ctype(region.inputs[k].dtype) for k, _, _ in region.loads]  # noqa: SLF001
    used = cg.math_functions(region.nodes, cg.inlined_value(region))
    vector = sorted(used & cg.vector_math_functions())
    lines = ["#include <stdint.h>", "#include <math.h>", ""]
    if vector:
        lines += ["#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)",
                  *(cg._simd_decl(f) for f in vector), "#endif", ""]  # noqa: SLF001
    lines += [cg._HELPERS[h] + "\n" for h in sorted(helpers)]  # noqa: SLF001
    lines += [
        "/* a generated epilogue's operands: one pointer per load, and per load its row",
        " * layout at meta + meta[load]: nd, then nd dims and nd element strides */",
        "typedef struct { void *const *ptrs; const int64_t *meta; } tg_gen_args;",
        "",
        "/* the element offset of row `row` in a load's layout (row-major over its dims) */",
        "static inline __attribute__((always_inline)) int64_t tg_gen_off(const int64_t *m,",
        "                                                                int64_t row) {",
        "    const int64_t nd = m[0];",
        "    if (nd == 1) return row * m[2];",
        "    int64_t off = 0;",
        "    for (int64_t d = nd; d >= 1; d--) {",
        "        const int64_t i = row % m[d];",
        "        row /= m[d];",
        "        off += i * m[nd + d];",
        "    }",
        "    return off;",
        "}",
        "",
        "/* not inlined: gemm.c calls it from 30-odd inlined micro-kernel variants; inlined,",
        " * the library took 6.5 s to compile instead of 4.1, and ran no faster (the tile row",
        " * is in memory either way: (128 x 768) @ (768 x 3072) + scaled SiLU 9.3 vs 9.1 ms) */",
        "static __attribute__((noinline)) void tg_gemm_gen_row(",
        "        const void *gen, float *restrict t, int64_t row, int64_t col, int cols) {",
        "    const tg_gen_args *g = (const tg_gen_args *)gen;",
    ]
    for u, ((_k, _frame, varies), ct) in enumerate(zip(region.loads, load_types)):
        lines.append(f"    const {ct} *q{u} = (const {ct} *)g->ptrs[{u}] + "
                     f"tg_gen_off(g->meta + g->meta[{u}], row){' + col' if varies else ''};")
        if not varies:
            lines.append(f"    const {ct} x{u} = q{u}[0];")

    def loop(source: str) -> list[str]:
        out = ["        #pragma omp simd aligned(t : 32)",
               f"        for (int j = 0; j < {LANES}; j++) {{",
               "            const float p = t[j];"]
        for u, (_k, _f, varies) in enumerate(region.loads):
            if varies:
                out.append(f"            const {load_types[u]} x{u} = {source.format(u=u)}[j];")
        out += ["            " + s for s in body]
        out += [f"            t[j] = {root_value};", "        }"]
        return out

    lines += [f"    if (cols == {LANES}) {{", *loop("q{u}"), "    } else {"]
    for u, (_k, _f, varies) in enumerate(region.loads):
        if varies:  # the tile's columns only: the operand ends at column N
            ct = load_types[u]
            lines += [f"        {ct} b{u}[{LANES}];",
                      f"        for (int j = 0; j < cols; j++) b{u}[j] = q{u}[j];",
                      f"        for (int j = cols; j < {LANES}; j++) b{u}[j] = 0;"]
    lines += [*loop("b{u}"), "    }", "}", "", "#define TG_GEMM_GENERATED 1", ""]
    prelude = "\n".join(lines)
    entry = "\n".join([
        "",
        f"_Static_assert(NR == {LANES}, \"the generated lane loop is one panel wide\");",
        "",
        "/* C (m, n) = the epilogue of A (m, k), row stride lda, @ the packed weight */",
        "int NAME(const float *a, int64_t lda, const float *packed, float *c, int64_t m,",
        "         int64_t n, int64_t k, void *const *ptrs, const int64_t *meta) {",
        "    const tg_gen_args g = {ptrs, meta};",
        "    return gemm_packed(a, lda, packed, NULL, NULL, c, m, n, k, ACT_NONE, &g);",
        "}",
        ""])
    template = prelude + "\n" + gemm.SOURCE + "\n" + entry
    flags = cg.float_to_int_flags(region.nodes) + (("-lmvec",) if vector else ())
    structure = _structure(region)
    key = hashlib.blake2b((structure + "\n" + " ".join(flags) + "\n" + template).encode(),
                          digest_size=6).hexdigest()
    symbol = f"tg_gemm_ep_{key}"
    source = f"/* generated by tensor_graphs.kernels.c.gemm_epilogue: {summary(region)} */\n" \
        + template.replace("int NAME(", f"int {symbol}(", 1)
    return GemmEmitted(source, symbol, key, flags,
                       tuple(region.inputs[k].dtype for k, _, _ in region.loads))


def _structure(region: GemmRegion) -> str:
    """What the kernel's identity holds besides its C: the weight's layout, the operands'
    dtypes, and where a reshape fixes them, the frames (their shapes are the graph's)."""
    text = f"linear={region.linear};inputs=" + ",".join(n.dtype.name for n in region.inputs)
    if region.reshaped:
        text += ";frames=" + ";".join(f"{k}:{tuple(map(str, f))}" for k, f, _ in region.loads)
        text += f";root={tuple(map(str, region.root.shape))}"
    return text


def summary(region: GemmRegion) -> str:
    ops = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in region.ops.items())
    shapes = f"{_shape(region.a.shape)} @ {_shape(region.w.shape)}{'.T' if region.linear else ''}"
    return f"GEMM {shapes} + epilogue ({ops or 'no op'}) over {len(region.inputs)} operand(s)"


def _shape(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


# ---------------------------------------------------------------------------- calling
def _binding(nodes: Sequence[Node], shapes: Sequence[tuple]) -> dict:
    """The symbols the kernel's arguments' shapes name, bound from the actual shapes: a dim
    that is a lone symbol binds it, and a dim that is an expression of one symbol not bound
    yet is solved for it (``a`` read as ``(8*batch, K)``, a transformer's ``x.view(-1, K)``
    under a symbolic batch, binds ``batch`` for the ``(batch, 8, N)`` the epilogue's
    reshape names; ``(batch*seq, K)`` does once ``seq`` is bound by another operand)."""
    bound: dict = {}
    pending: list[tuple] = []
    for n, s in zip(nodes, shapes):
        for d, v in zip(n.shape, s):
            if isinstance(d, sympy.Symbol):
                bound[d] = int(v)
            elif not isinstance(d, int):
                pending.append((d, int(v)))
    while pending:
        left = []
        for d, v in pending:
            e = sympy.sympify(d).xreplace(bound)
            free = e.free_symbols
            solved = _solve(e, next(iter(free)), v) if len(free) == 1 else None
            if solved is not None:
                bound[next(iter(free))] = solved
            elif free:
                left.append((d, v))
        if len(left) == len(pending):
            break
        pending = left
    return bound


@functools.lru_cache(maxsize=1024)
def _solve(expr, symbol, value: int) -> int | None:
    """The one non-negative integer ``symbol`` at which ``expr`` is ``value``, else None."""
    try:
        found = sympy.solve(sympy.Eq(expr, value), symbol)
    except (NotImplementedError, TypeError, ValueError):  # floor() and the like: not solved
        return None
    ints = [int(x) for x in found if x.is_Integer and x >= 0]
    return ints[0] if len(ints) == 1 and len(found) == 1 else None


def resolvable(region: GemmRegion) -> bool:
    """Whether every dim the region's reshapes and frames name follows from its arguments'
    shapes (the kernel is called with arrays alone): tried at the trial dims. A result
    ``(batch, seq, N)`` of ``a`` read as ``(batch*seq, K)`` with nothing else naming either
    does not (its rows split in several ways): such a region is not offered."""
    if not region.reshaped:
        return True
    args = [region.a, region.w, *region.inputs]
    wanted = free_symbols(tuple(d for n in (region.root, *_all_nodes(region))
                                for d in n.shape)) | free_symbols(
        tuple(d for _k, f, _v in region.loads for d in f))
    for shapes in trial_shapes(region)[:1]:
        if not wanted <= set(_binding(args, shapes)):
            return False
    return True


def _resolve(shape: Sequence, bound: Mapping) -> tuple[int, ...]:
    out = []
    for d in shape:
        if isinstance(d, int):
            out.append(d)
            continue
        v = sympy.sympify(sympy.sympify(d).xreplace(bound))  # a lone symbol gives the int
        if not v.is_Integer:
            raise KernelConstraintError(f"dims {sorted(map(str, v.free_symbols))} of "
                                        f"{_shape(shape)} are not named by the operands")
        out.append(int(v))
    return tuple(out)


class _Layout:
    """One call's shapes resolved: the result, the rows, and each load's row layout."""

    def __init__(self, region: GemmRegion, a_shape, kn: tuple[int, int],
                 others: Sequence[np.ndarray], out_shape):
        k, n = kn
        if a_shape[-1] != k:
            raise KernelConstraintError(f"the weight is ({k}, {n}) as K x N, but a is "
                                        f"{_shape(a_shape)}")
        rows = math.prod(a_shape[:-1])
        args = [region.a, region.w, *region.inputs]
        shapes = [tuple(a_shape), (n, k) if region.linear else (k, n),
                  *(tuple(o.shape) for o in others)]
        if region.reshaped:  # frames follow the graph's shapes at these dims
            bound = _binding(args, shapes)
            result = _resolve(region.root.shape, bound)
            frames = [_resolve(f, bound) for _, f, _ in region.loads]
        else:  # every frame is the result's: the operands broadcast into it
            try:
                result = tuple(broadcast_shapes(tuple(a_shape[:-1]) + (n,), *shapes[2:]))
            except ShapeError as e:
                raise KernelConstraintError(str(e)) from None
            frames = [_strip(result)] * len(region.loads)
        if out_shape is not None and math.prod(out_shape) != math.prod(result):
            raise KernelConstraintError(f"out= has shape {_shape(out_shape)}, the result "
                                        f"{_shape(result)}")
        self.shape = tuple(out_shape) if out_shape is not None else result
        if math.prod(result) != rows * n or (result and result[-1] != n):
            raise KernelConstraintError(f"the result {_shape(result)} is not the product's "
                                        f"{rows} rows of {n}")
        self.m, self.n, self.k = rows, n, k
        meta: list[int] = [0] * len(region.loads)
        for u, ((idx, _f, varies), frame) in enumerate(zip(region.loads, frames)):
            meta[u] = len(meta)
            meta += _row_layout(others[idx], frame, varies, rows, n)
        self.meta = np.asarray(meta or [0], np.int64)


def _row_layout(x: np.ndarray, frame: tuple, varies: bool, rows: int, n: int) -> list[int]:
    """[nd, dims..., strides...] of operand ``x`` read in ``frame`` (rows x n)."""
    if not frame or frame[-1] != n or math.prod(frame[:-1]) != rows:
        raise KernelConstraintError(f"frame {_shape(frame)} is not {rows} rows of {n}")
    shape = tuple(x.shape)
    while len(shape) > len(frame):
        if shape[0] != 1:
            raise KernelConstraintError(f"an operand of shape {_shape(x.shape)} does not "
                                        f"broadcast to {_shape(frame)}")
        shape = shape[1:]
    lead = len(frame) - len(shape)
    steps = [s // x.itemsize for s in x.strides[len(x.shape) - len(shape):]]
    strides = []
    for axis, size in enumerate(frame):
        j = axis - lead
        if j < 0 or shape[j] == 1:
            strides.append(0)
        elif shape[j] == size:
            strides.append(steps[j])
        else:
            raise KernelConstraintError(f"an operand of shape {_shape(x.shape)} does not "
                                        f"broadcast to {_shape(frame)}")
    if varies and n > 1 and strides[-1] != 1:
        raise KernelConstraintError("an operand varying along N must be contiguous there")
    if not varies and shape and shape[-1] != 1:
        raise KernelConstraintError(f"an operand of shape {_shape(x.shape)} must be 1 wide "
                                    "on the last axis here")
    dims: list[int] = []
    steps_out: list[int] = []
    for size, st in zip(frame[:-1], strides[:-1]):
        if size == 1:
            continue
        if dims and steps_out[-1] == st * size:
            dims[-1] *= size
            steps_out[-1] = st
            continue
        dims.append(size)
        steps_out.append(st)
    if not dims:
        dims, steps_out = [rows], [0]
    return [len(dims), *dims, *steps_out]


def make_gemm_function(emitted: GemmEmitted, lib: ctypes.CDLL, region: GemmRegion,
                       description: str):
    """The Python function of a compiled epilogue GEMM: ``fn(a, w, *operands, out=None)``
    with ``w`` packed (``gemm.pack``) or 2-D (packed for this call, correct but slow: what a
    direct call and the verifier use)."""
    cfn = getattr(lib, emitted.symbol)
    cfn.restype = ctypes.c_int
    cfn.argtypes = [P, I64, P, P, I64, I64, I64, P, P]
    nin = len(region.inputs)
    want = [n.dtype.np_dtype for n in region.inputs]
    loads = region.loads
    ptr_array = ctypes.c_void_p * max(len(loads), 1)
    layouts: dict[tuple, _Layout] = {}
    linear = region.linear

    def run(a, w, *others, out=None):
        if len(others) != nin:
            raise KernelConstraintError(f"{description}: takes {nin + 2} arguments, got "
                                        f"{len(others) + 2}")
        a = np.asarray(a)
        if a.dtype != np.float32 or a.ndim < 2:
            raise KernelConstraintError(f"{description}: a must be float32 of rank >= 2, got "
                                        f"{a.shape} {a.dtype}")
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        if w.ndim == 2:  # not prepared: pack for this call
            w = gemm.pack(np.asarray(w), linear)
        others = [o if type(o) is np.ndarray and o.flags.c_contiguous
                  else np.ascontiguousarray(o) for o in others]
        for k, (o, d) in enumerate(zip(others, want)):
            if o.dtype != d:
                raise KernelConstraintError(f"{description}: operand {k + 2} must be {d}, got "
                                            f"{o.dtype}")
        key = (a.shape, w.shape, *((o.shape, o.strides) for o in others),
               None if out is None else out.shape)
        lay = layouts.get(key)
        if lay is None:
            if len(layouts) >= 256:
                layouts.clear()
            lay = layouts[key] = _Layout(region, a.shape, gemm.packed_shape(w), others,
                                         None if out is None else out.shape)
        if out is None:
            out = np.empty(lay.shape, np.float32)
        if out.size == 0:
            return out
        ptrs = ptr_array(*[_clib.ptr(others[k]) for k, _, _ in loads])
        rec = _clib.recording
        call = cfn if rec is None else rec.wrap(cfn, (lay.meta,))
        status = call(_clib.ptr(a), lay.k, _clib.ptr(w), _clib.ptr(out), lay.m, lay.n, lay.k,
                      ptrs, lay.meta.ctypes.data)
        if status == -1:
            raise KernelConstraintError(f"{description}: the weight is packed as (K, N) = "
                                        f"{gemm.packed_shape(w)}, the call needs K = {lay.k}")
        if status != 0:
            raise MemoryError(f"{description}: out of memory")
        return out

    run.source_text = emitted.source
    run.__name__ = run.__qualname__ = f"c_gemm_ep_{emitted.key}"
    run.__doc__ = description
    return run


# ---------------------------------------------------------------------------- checking
def _instantiate(region: GemmRegion, shapes: Sequence[tuple]) -> tuple[Node, list[Node]]:
    """The region over fresh leaves ``x0, x1, ...`` of the given (concrete) shapes, a
    reshape's target resolved at the dims those shapes bind: (root, leaves)."""
    from tensor_graphs.ir.builder import input as _input

    args = [region.a, region.w, *region.inputs]
    bound = _binding(args, shapes)
    leaves = [_input(f"x{k}", tuple(s), n.dtype) for k, (n, s) in enumerate(zip(args, shapes))]
    built: dict[Node, Node] = dict(zip(args, leaves))
    order = _all_nodes(region)
    for n in order:
        if n in built:
            continue
        attrs = dict(n.attrs)
        if n.op.name == RESHAPE:
            attrs["shape"] = _resolve(attrs["shape"], bound)
        built[n] = Node.make(n.op, tuple(built.get(i, i) for i in n.inputs), attrs)
    return built[region.root], leaves


def _all_nodes(region: GemmRegion) -> list[Node]:
    """The matmul (and its permute), then the epilogue: operands before users."""
    b = region.product.inputs[1]
    return ([b] if region.linear else []) + [region.product, *region.nodes]


def trial_shapes(region: GemmRegion) -> list[list[tuple[int, ...]]]:
    """Argument shapes to check on. Without a reshape: the region's own (when small) and
    variants of (rows, N, K) = (1, 33, 7), (7, 1, 33), (7, 33, 1025), (515, 17, 20),
    (150, 20, 600) and (13, 1025, 1): one row (the GEMV path), edge tiles, K blocks, the
    split-M path, two blocks of rows with two K blocks, a wide N, every operand's broadcast
    pattern kept. With one: the region's dims (symbols at 3, 1 and
    5: the frames move with them) at K = its own, 1, 33 and 1025."""
    args = [region.a, region.w, *region.inputs]
    own = [cg._concrete_shape(n.shape) for n in args]  # noqa: SLF001
    k_own = own[0][-1]
    trials = []
    if not region.reshaped:
        rows_own = math.prod(own[0][:-1])
        if rows_own * own[0][-1] * (own[1][0] * own[1][1] // max(k_own, 1)) <= 1 << 26:
            trials.append(own)
        out = cg._concrete_shape(region.root.shape)  # noqa: SLF001
        rank = len(out)
        free = [j for j in range(rank - 1) if out[j] != 1]  # the axes rows may spread over
        for rows, n, k in ((1, 33, 7), (7, 1, 33), (7, 33, 1025), (515, 17, 20),
                           (150, 20, 600), (13, 1025, 1)):
            sizes = [min(d, 2) for d in out[:-1]] + [n]
            if free:
                rest = math.prod(sizes[j] for j in free[:-1])
                sizes[free[-1]] = max(rows // rest, 1)
            trials.append(_variant(region, sizes, k))
        return trials
    symbols = sorted(set().union(*(sympy.sympify(d).free_symbols for n in args
                                   for d in n.shape if not isinstance(d, int))), key=str)
    for value in ((3, 1, 5) if symbols else (None,)):
        bound = {s: value for s in symbols}
        base = [tuple(int(sympy.sympify(d).xreplace(bound)) for d in n.shape) for n in args]
        if any(v < 0 for s in base for v in s):
            continue
        for k in dict.fromkeys((base[0][-1], 1, 33, 1025)):
            shapes = list(base)
            shapes[0] = base[0][:-1] + (k,)
            shapes[1] = (base[1][0], k) if region.linear else (k, base[1][1])
            trials.append(shapes)
    return trials


def _variant(region: GemmRegion, sizes: list[int], k: int) -> list[tuple[int, ...]]:
    """Argument shapes for a result of ``sizes`` (rank of the root) and inner dim ``k``:
    each operand's dims right-aligned to the result, a 1 kept a 1."""
    rank = len(sizes)
    n = sizes[-1]

    def aligned(s: Sequence, last: int) -> tuple[int, ...]:  # right-aligned, a 1 kept a 1
        out = []
        for j, d in enumerate(s):
            axis = last - len(s) + 1 + j
            out.append(1 if axis < 0 or (isinstance(d, int) and d == 1) else sizes[axis])
        return tuple(out)

    shapes = [aligned(region.a.shape[:-1], rank - 2) + (k,), (n, k) if region.linear else (k, n)]
    shapes += [aligned(x.shape, rank - 1) for x in region.inputs]
    return shapes


def _draw(rng, shape, dtype: DType, special: bool) -> np.ndarray:
    return cg._random_array(rng, shape, dtype, special, False)  # noqa: SLF001


def check_gemm_kernel(fn, region: GemmRegion, seed: int = 0) -> cg.CheckReport:
    """Run ``fn`` on seeded inputs of ``trial_shapes`` (the epilogue's operands with NaN and
    inf in one trial) and compare with ``tg.evaluate`` of the region in float64: NaN and inf
    where the float64 or the float32 evaluation has them, the rest by norm-wise relative
    error within max(float32 floor, 16x numpy's own float32 error) or within the trial's
    ``gemm_rounding_bound``. The tolerance it declares is what it measured: max(float32
    floor, 4x its worst error). Not 16x numpy's: an epilogue that cancels amplifies the
    product's K-sum rounding in any float32 evaluation (tanh(softplus(h)) * 2 - 1: numpy's
    own error 1.3e-6, this kernel's 1.2e-6), and a declared 2.1e-5 was refused by a plan
    made for 1e-5 whose unfused steps declare 1e-5 each."""
    from tensor_graphs.ir.evaluate import evaluate
    from tensor_graphs.kernels.verify import bound_error, compare
    from tensor_graphs.numerics import relative_error

    rng = np.random.default_rng(seed)
    args = [region.a, region.w, *region.inputs]
    errors: list[tuple[float, float, tuple]] = []
    native = 0.0
    tried = []
    for t, shapes in enumerate(trial_shapes(region)):
        try:
            graph, leaves = _instantiate(region, shapes)
        except ShapeError as e:
            return cg.CheckReport(False, math.inf, 0.0, tried, f"shapes {shapes}: {e}")
        special = t == 1 and bool(region.inputs)
        arrays = [_draw(rng, s, n.dtype, special and k >= 2)
                  for k, (n, s) in enumerate(zip(args, shapes))]
        feeds = {leaf.name: x for leaf, x in zip(leaves, arrays)}
        with np.errstate(all="ignore"):
            r32, r64 = evaluate(graph, feeds), evaluate(graph, feeds, dtype="float64")
            got = fn(*arrays)
        tried.append(tuple(map(tuple, shapes)))
        if got.shape != r32.shape or got.dtype != r32.dtype:
            return cg.CheckReport(False, math.inf, 0.0, tried, f"output {got.shape} "
                                  f"{got.dtype}, reference {r32.shape} {r32.dtype}")
        error, problem = compare(got, r64, r32)
        if problem is not None:
            return cg.CheckReport(False, math.inf, 0.0, tried, f"shapes {shapes}: {problem}")
        fin = np.isfinite(r32) & np.isfinite(r64)
        if fin.any():
            native = max(native, relative_error(r32[fin], r64[fin]))
        allowed = bound_error(gemm_rounding_bound(region, *arrays), got, r64)
        errors.append((error, allowed, tuple(map(tuple, shapes))))
    accepted = max(FLOOR, 16 * native)
    worst = max((e for e, _, _ in errors), default=0.0)
    over = [x for x in errors if not x[0] <= max(accepted, x[1])]
    msg = ""
    if over:
        e, allowed, shapes = over[0]
        msg = (f"relative error {e:.3g} > {accepted:.3g} (16x numpy's float32 error "
               f"{native:.3g}) and > {allowed:.3g}, the rounding bound on those inputs, "
               f"at shapes {list(shapes)}")
    return cg.CheckReport(not over, worst, max(FLOOR, 4 * worst), tried, msg)


def gemm_rounding_bound(region: GemmRegion, *arrays) -> np.ndarray:
    """Per output element, a bound on |kernel(*arrays) - the float64 reference|: the product
    off by at most gamma_K (|a| @ |w|) (gamma_K = K u / (1 - K u), any summation order, FMA or
    not), each epilogue op's own rounding and what its operands' errors move it by
    (``codegen``'s interval rules), for the float32 kernel and the float64 reference both."""
    arrays = [np.asarray(x) for x in arrays]
    shapes = [tuple(x.shape) for x in arrays]
    graph, leaves = _instantiate(region, shapes)
    by_leaf = dict(zip(leaves, arrays))
    order = _graph_nodes(graph, set(leaves))
    vals: dict[Node, np.ndarray] = {leaf: by_leaf[leaf] for leaf in leaves}
    with np.errstate(all="ignore"):
        for n in order:
            if n.op.name == CONSTANT:
                stored = np.asarray(n.attrs["value"].array)
                vals[n] = stored.astype(np.float64 if n.dtype.is_float else n.dtype.np_dtype)
                continue
            ins = [vals[i].astype(np.float64) if vals[i].dtype.kind == "f" else vals[i]
                   for i in n.inputs]
            if n.op.name == CAST and n.dtype.is_float:
                vals[n] = ins[0].astype(np.float64)
            else:
                r = np.asarray(n.op.reference(ins, dict(n.attrs)))
                vals[n] = r.astype(np.float64 if n.dtype.is_float else n.dtype.np_dtype)
    total: np.ndarray | float = 0.0
    for u in (U32, U64):
        lifted = u == U64
        err: dict[Node, np.ndarray] = {leaf: np.zeros(vals[leaf].shape) for leaf in leaves}
        with np.errstate(all="ignore"):
            for n in order:
                r = vals[n]
                if n.op.name == CONSTANT:
                    literal = r.astype(np.float64 if lifted else n.dtype.np_dtype) \
                        if n.dtype.is_float else r
                    exact = literal.astype(np.float64) == r
                    err[n] = np.where(exact, 0.0, np.abs(literal.astype(np.float64) - r))
                    continue
                e = [err[i] for i in n.inputs]
                if n.op.name in (RESHAPE, PERMUTE):
                    err[n] = np.asarray(n.op.reference([e[0]], dict(n.attrs)), np.float64)
                    continue
                if n.op.name == MATMUL:
                    a, w = (np.abs(vals[i].astype(np.float64)) for i in n.inputs)
                    k = a.shape[-1]
                    gamma = k * u / (1 - k * u) if k * u < 1 else math.inf
                    moved = gamma * (a @ w)
                    ea, ew = e
                    if ea.any() or ew.any():
                        moved = moved + ea @ (w + ew) + a @ ew
                    err[n] = np.where(np.isnan(moved), np.inf, moved)
                    continue
                v = [vals[i] for i in n.inputs]
                moved = cg._MOVED[n.op.name](n, v, e, r) if any(  # noqa: SLF001
                    np.asarray(x).any() for x in e) else 0.0
                moved = np.broadcast_to(np.asarray(moved, np.float64), np.shape(r))
                if n.dtype.is_float:
                    dt = np.float64 if lifted else n.dtype.np_dtype
                    ulp = np.spacing((np.abs(r) + moved).astype(dt)).astype(np.float64)
                    moved = moved + cg.ROUNDING_ULPS[n.op.name] * ulp
                elif n.dtype.is_bool:
                    moved = np.minimum(moved, 1.0)
                err[n] = np.where(np.isnan(moved), np.inf, moved)
        total = total + err[graph]
    return np.broadcast_to(np.asarray(total, np.float64), np.shape(vals[graph]))


def _graph_nodes(root: Node, leaves: set[Node]) -> list[Node]:
    """Non-leaf nodes (and constants) under ``root`` down to ``leaves``, operands first."""
    order: list[Node] = []
    seen: set[Node] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        n, ready = stack.pop()
        if ready:
            order.append(n)
            continue
        if n in seen or n in leaves:
            continue
        seen.add(n)
        stack.append((n, True))
        stack.extend((i, False) for i in reversed(n.inputs))
    return order


# ---------------------------------------------------------------------------- kernels
@dataclass(frozen=True, eq=False, repr=False)
class GemmKernel(registry.Kernel):
    """A generated GEMM with its epilogue: its pattern is the region at the shapes it was
    checked at (what ``tg.kernels.verify`` builds its reference from)."""

    summary: str = ""
    error_bound: Callable | None = None  # gemm_rounding_bound of its region
    generated: bool = True  # explain() shows the ops inside, not a hand kernel's name

    def __repr__(self) -> str:
        return f"<kernel {self.name} ({self.backend}, {self.device}) {self.summary}>"


def region_pattern(region: GemmRegion) -> tuple[pat.Pat, tuple[str, ...]]:
    """The region as a pattern over ``x0`` (a), ``x1`` (the weight) and ``x2, ...`` (the
    epilogue's operands); a reshape keeps its target at the dims of the first trial (what
    verify's cases are then drawn at)."""
    graph, leaves = _instantiate(region, trial_shapes(region)[0])
    names = tuple(leaf.name for leaf in leaves)
    built: dict[Node, pat.Pat] = {leaf: pat.var(leaf.name, dtype=leaf.dtype) for leaf in leaves}
    order = _graph_nodes(graph, set(leaves))
    users: dict[Node, list[Node]] = {}
    for n in order:
        for i in n.inputs:
            users.setdefault(i, []).append(n)
    keep = {CAST: ("dtype",), RESHAPE: ("shape",), PERMUTE: ("perm",)}
    for k, n in enumerate(order):
        if n.op.name == CONSTANT:
            built[n] = pat.Const(np.asarray(n.attrs["value"].array).reshape(()).item())
            continue
        attrs = {a: n.attrs[a] for a in keep.get(n.op.name, ())}
        p = pat.OpPat(n.op.name, tuple(built[i] for i in n.inputs), attrs)
        if len(users.get(n, ())) > 1 and not cg._joins_user_chain(n, users[n]):  # noqa: SLF001
            p = p.bind(f"v{k}")
        built[n] = p
    return built[graph], names


def region_signatures(region: GemmRegion) -> list[dict]:
    """``trial_shapes`` as ``tg.kernels.verify`` signatures (those its pattern builds)."""
    from tensor_graphs.kernels.signatures import Spec

    args = [region.a, region.w, *region.inputs]
    trials = trial_shapes(region)
    if region.reshaped:  # the pattern's reshape pins the dims of the first trial
        first = trials[0]
        trials = [t for t in trials if t[2:] == first[2:] and t[0][:-1] == first[0][:-1]]
    return [{f"x{k}": Spec(tuple(s), n.dtype.name, "normal")
             for k, (n, s) in enumerate(zip(args, shapes))} for shapes in trials]


def _where(region: GemmRegion):
    dts = [region.a.dtype, region.w.dtype, *(n.dtype for n in region.inputs)]

    def where(shapes, dtypes_, attrs):
        for k, (d, want) in enumerate(zip(dtypes_, dts)):
            if d != want:
                return f"input 'x{k}' must be {want.name}, got {d.name}"
        a_shape, w_shape = tuple(shapes[0]), tuple(shapes[1])
        if len(a_shape) < 2 or len(w_shape) != 2:
            return f"needs a of rank >= 2 and a 2-D weight, got {a_shape} and {w_shape}"
        kn = (w_shape[1], w_shape[0]) if region.linear else w_shape
        others = [_Shaped(tuple(s), _c_strides(tuple(s), 4), 4) for s in shapes[2:]]
        try:  # C-order strides, as a contiguous kernel's operands have them
            _Layout(region, a_shape, kn, others, None)
        except (KernelConstraintError, ShapeError) as e:
            return str(e)
        return True

    return where


class _Shaped(NamedTuple):
    """What ``_row_layout`` reads of an operand, for ``where`` (shapes only)."""

    shape: tuple
    strides: tuple
    itemsize: int


def _c_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    out, step = [], itemsize
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


def build_gemm_kernel(region: GemmRegion, emitted: GemmEmitted | None = None,
                      verify: bool = True) -> GemmKernel:
    """Compile, check and verify the region's kernel (``KernelVerificationError`` when it
    disagrees with the reference, ``CCompileError`` when it does not compile); not
    registered."""
    from tensor_graphs.kernels.c.build import load_library

    emitted = emitted or emit_gemm_c(region)
    name = f"c_gemm_ep_{emitted.key}"
    text = f"generated C {summary(region)}"
    lib = load_library(name, emitted.source, emitted.flags)
    threads.register_library(lib)  # one thread count for OpenMP, OpenBLAS and torch
    fn = make_gemm_function(emitted, lib, region, f"{name} ({text})")
    pattern, names = region_pattern(region)
    prep = registry.Preparation(lambda w, _linear=region.linear: gemm.pack(w, _linear),
                                nbytes=gemm._packed_nbytes(region.linear),  # noqa: SLF001
                                name="pack_linear" if region.linear else "pack_matmul",
                                strided=True)
    kernel = GemmKernel(
        name=name, pattern=pattern, backend="c", device="cpu", fn=fn, inputs=names,
        signatures=region_signatures(region), where=_where(region), tolerance=DECLARED,
        contiguous=True, writes_out=True, doc=text, source_hash=cg.source_hash(emitted),
        prepare={names[1]: prep}, summary=text,
        error_bound=functools.partial(gemm_rounding_bound, region))
    if not verify:
        return kernel
    return cg.admitted(kernel, check_gemm_kernel(fn, region))


# ---------------------------------------------------------------------------- as planner options
_composites: list = [None, -1, {}]  # [the uses mapping it was made for, its size then,
# decomposition root -> the composite it decomposes] (the planner asks at such roots)


def _composite_of(root: Node, uses: Mapping[Node, int], expand) -> Node | None:
    """The graph's composite whose decomposition ``root`` is (gelu's, for the mul at its
    root), or None. The map is made once per graph (per ``uses``), again when the planner
    has added nodes to ``uses`` since (decompositions it expanded)."""
    if _composites[0] is not uses or (root not in _composites[2]
                                      and _composites[1] != len(uses)):
        found = {}
        for n in list(uses):  # expanding may add the decomposition's nodes to uses
            if not n.op.is_atomic and not n.op.is_leaf:
                d = expand(n)
                if d is not None:
                    found[d] = n
        _composites[:] = [uses, len(uses), found]
    return _composites[2].get(root)


def _covered_by_hand_kernel(root: Node, uses: Mapping[Node, int], expand,
                            covers: Sequence[Node], args: Sequence[Node]) -> bool:
    """A registered packed kernel already computes this region from the same arguments (a
    bias, a residual, relu/gelu): same core, same store, nothing to win by compiling. Asked at
    the root and at the composites it is the decomposition of (``c_packed_*_gelu_tanh``
    matches the gelu, the planner asks this generator at the mul its formula ends in).
    Symbolic dims are taken at 2 for the kernels' constraints (only the structure matters)."""
    def plain(n: Node) -> Node:  # x @ permute(W) and linear(x, W) read the same weight
        return n.inputs[0] if _transposed(n) else n

    dims = dict.fromkeys(free_symbols(tuple(d for n in (*covers, *args) for d in n.shape)), 2)
    want = {plain(n) for n in args}
    node: Node | None = root
    while node is not None:
        try:
            found = registry.matching(node, uses, dims=dims or None)
        except (ShapeError, TypeError):  # a constraint that cannot decide at these dims
            found = []
        if any(k.prepare and {plain(n) for n in k.arguments(m)} == want for k, m in found):
            return True
        node = _composite_of(node, uses, expand)
    return False


def gemm_candidate(root: Node, uses: Mapping[Node, int], expand: Callable[[Node], Node | None]):
    """The planner's generated option at ``root``: a float32 matmul and the elementwise region
    after it (through row reshapes), as one packed GEMM whose tile store applies the region;
    arguments (a, w, the region's other operands), ``w`` prepared once per binding. Rendered,
    not compiled (see ``kernels.generated.realize``). None where no product qualifies."""
    from tensor_graphs.kernels import generated

    found = gemm_region(root, uses, expand)
    if found is None:
        return None
    covers, region = found
    args = (region.a, region.w, *region.inputs)
    if not resolvable(region):
        return None
    if _covered_by_hand_kernel(root, uses, expand, covers, args):
        return None
    emitted = emit_gemm_c(region)

    def build() -> GemmKernel:
        return build_gemm_kernel(region, emitted)

    return generated.Candidate(
        "gemm_epilogue", root, covers, args, f"c_gemm_ep_{emitted.key}",
        cg.source_hash(emitted), DECLARED, f"generated C {summary(region)}", build,
        computes=region.root, prepared=(1,), contiguous=True,
        draft=lambda: build_gemm_kernel(region, emitted, verify=False))


__all__ = ["GemmRegion", "GemmEmitted", "GemmKernel", "gemm_region", "emit_gemm_c",
           "make_gemm_function", "trial_shapes", "check_gemm_kernel", "gemm_rounding_bound",
           "region_pattern", "region_signatures", "build_gemm_kernel", "resolvable",
           "gemm_candidate", "summary"]
