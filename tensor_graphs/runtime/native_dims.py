"""The native loop at any dims: recordings at several dims fitted into one table.

A decode step's dims change on every call (the cache grows by one token), so a recording made
for one dims binding (``runtime/native.py``) would never be replayed. Yet the C calls of a
decode step are the same at every length; what changes are some integer arguments (a length,
a stride, the offset at which the new token's keys are written) and some pointers (into the
KV cache). So a program with symbolic dims records its first calls at distinct dims (samples)
and fits every integer argument, every pointer's offset into its memory region and every int
of the blocks the kernels pass, as a polynomial of the dims with integer coefficients,
multilinear in the dims that varied (``c0 + c1 * past``; ``c0 + c1*batch + c2*seq +
c3*batch*seq``). The fitted table replays at any dims: the runner patches each varying slot
from the dims' monomials (``mono``) before it walks the table, and the program rebuilds the
output views at the call's shapes.

Why the fit can be trusted, and where it refuses (the Python loop then runs, with its own
results):

- The samples must make the same C calls (functions, signatures, order), each pointer into
  the same region (the arena, a weight, a kept state's buffer, a per-dims leaf, a buffer a
  kernel allocated, an input, a block), with the same float arguments.
- Each fitted value is checked on ``VALIDATE`` more samples than the fit needs: an argument
  that is not such a polynomial (a size rounded up to a tile, a branch on a length) shows.
  With one varying dim, an integer polynomial of degree <= VALIDATE + 1 (a product of up to
  three extents of a tensor) that agrees with the fitted line at these points is that line.
- Every instruction whose inputs, attributes or result change with the dims runs a kernel of
  ``SYMBOLIC_KERNELS``: kernels whose wrappers compute their C arguments as products of shapes
  and strides with no branch on a size, so what the samples show holds at other dims too.
  Another kernel may choose differently at dims it was not sampled at: refused.
- ``analyze`` refuses programs whose symbolic shapes or attributes are not polynomials of the
  dims (a ``min``, a ``floor``), and gives the domain: every symbolic extent >= 2. Calls and
  samples outside it take the Python loop: at extent 1 numpy and the kernels treat an axis as
  broadcast (strides change), at 0 they skip calls.
- A dim that did not vary over the samples is pinned: another value takes the Python loop.
- Memory a kernel allocated for its result, and per-dims leaves, are replaced by buffers of
  the recording's own (a per-dims leaf rewritten per call); their sizes must not change with
  the dims.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import sympy

from tensor_graphs.ir.shapes import free_symbols
from tensor_graphs.runtime.native import (
    COPY,
    STABLE,
    NotNativeError,
    Sample,
    _data,
    _int64,
    runner,
)

VALIDATE = 2  # samples beyond those the fit needs, on which every fitted value is checked
MAX_VARYING = 2  # dims varying together (2**k monomials: 4 coefficients per value)
MAX_SAMPLES = 2 ** MAX_VARYING + VALIDATE + 4  # then the sampling gives up

_MATMULS = ("", "_bias", "_bias_relu", "_bias_gelu", "_bias_gelu_tanh")  # GEMM kernel names
_LINEARS = ("", "_nobias", "_relu", "_gelu", "_gelu_tanh")  # suffixes (gemm.py, matmul.py)

# Kernels whose C arguments follow the dims: the wrapper computes every argument as a product
# of its inputs' shapes and strides and its attributes, with no branch on a size (at extents
# >= 2), so a fit over samples holds at other dims. An instruction whose inputs, attributes or
# result change with the dims must run one of these (or a view kernel, which makes no C call:
# its view's offset and strides are such products too).
SYMBOLIC_KERNELS: dict[str, str] = {
    # the append of a kept state: the built-in strided copy at offset * stride (native.py)
    "numpy_state_update": "copy block: shape and strides; destination: offset * stride",
    # pointwise.py: the result's shape and per-input element strides, 0 at extent 1
    "c_add": "layout: shape and element strides", "c_mul": "layout: shape and strides",
    "c_less": "layout: shape and strides", "c_where": "layout: shape and strides",
    "c_iota": "length",
    "c_cast": "element count", "c_sin": "element count", "c_cos": "element count",
    # unary.py: x.size, the one size the C loop takes (one shape in, no broadcasting)
    **{f"c_{op}": "element count" for op in (
        "neg", "reciprocal", "sqrt", "exp", "log", "tanh", "tanh_fast", "sigmoid", "erf",
        "relu", "silu", "gelu", "gelu_tanh", "swiglu")},
    # concat.py: rows and bytes per row of each input
    "c_concat": "outer rows, bytes per input row",
    # norms.py: rows = size / last axis, the last axis
    "c_softmax": "rows, row length", "c_layer_norm": "rows, row length",
    "c_layer_norm_plain": "rows, row length", "c_add_layer_norm": "rows, row length",
    "c_rms_norm": "rows, row length", "c_rms_norm_plain": "rows, row length",
    # cos and sin made (seq, d) contiguous (a copy, when one is made, changes size with the
    # dims: refused by the fit), then outer = size / (seq * d), seq, d
    "c_rotary": "outer, seq, head dim",
    # gather.py: index count, outer and inner sizes
    "c_embedding": "ids, rows, row bytes", "c_gather": "indices, outer, size, inner bytes",
    "c_embedding_add": "ids, x rows, rows, dim",
    # attention.py: batch, heads, query and key lengths, head dims and the strides of q, k, v,
    # the mask (its broadcast view) and the result; the scale is 1/sqrt(head dim), fixed
    **{f"c_{flash}attention{mask}{causal}{bshd}": "sizes and strides"
       for flash in ("", "flash_") for mask in ("", "_mask") for causal in ("", "_causal")
       for bshd in ("", "_bshd")},
    # gemm.py (prefill's GEMMs): rows = the product of a's leading dims, K and N the weight's.
    # gemm.c branches on the rows (one row: gemv; under 262,144 flops: one thread; from
    # MSPLIT = 512 rows the threads split M), but on the arguments of the call, so a replay
    # at other rows takes the branch those rows take; K's blocking (KSINGLE) is the weight's
    **{f"c_packed_{core}{suffix}": "rows, K, N; gemm.c branches on its own arguments"
       for core, suffixes in (("matmul", _MATMULS + ("_add", "_bias_add")),
                              ("linear", _LINEARS + ("_add", "_nobias_add")))
       for suffix in suffixes},
    # matmul.py (OpenBLAS): batch, rows, N, K and the batch strides (m*k, k*n, m*n: a product
    # of two varying dims is no multilinear fit at one, refused by the fit); blas.c's gemv at
    # one row is a branch on its own arguments; the 32-bit range is the planner's check, at
    # the bounds
    **{f"c_{core}{suffix}": "batch, rows, N, K, batch strides; blas.c branches on its own"
       for core, suffixes in (("matmul", _MATMULS), ("linear", _LINEARS))
       for suffix in suffixes},
    # quant.py (int8-weight GEMMs): rows = the product of a's leading dims, K and N the
    # weight's; quant.c branches on the rows (one row, one thread under 262,144 flops) on its
    # own arguments, as gemm.c
    **{f"c_q8_matmul{suffix}": "rows, K, N; quant.c branches on its own arguments"
       for suffix in _MATMULS + ("_add", "_bias_add")},
    # quant_dyn.py (int8-dynamic GEMMs, per row and per group of 32): the same arguments,
    # and the instruction path, fixed
    **{f"{prefix}_matmul{suffix}": "rows, K, N; quant_dyn.c branches on its own arguments"
       for prefix in ("c_q8d", "c_q8d_g32") for suffix in _MATMULS + ("_add", "_bias_add")},
}

# Kernel names by prefix, for kernels made on demand
SYMBOLIC_PREFIXES: dict[str, str] = {
    # generated elementwise C (codegen.make_function): the result's dims with the axes every
    # operand walks contiguously merged, and element strides. A merge depends on strides being
    # equal, which at a few dims may hold by coincidence: a fit sampled elsewhere replays the
    # unmerged layout there, which describes the same elements (and a sample at such dims
    # has another block length: refused)
    "c_fused_": "merged dims and element strides",
    # generated GEMM epilogues (gemm_epilogue.make_gemm_function): gemm.c's arguments as the
    # packed kernels', and per operand a row layout whose dims merge where strides chain
    # (operands are made C-contiguous, so that holds at every dims, or for a broadcast at
    # none); the operand pointers and the layouts are blocks, fitted like any int
    "c_gemm_ep_": "rows, K, N; operands' row layouts (merged dims, element strides)",
    # generated row reductions (rowgen.make_row_function): rows and the row's length, then
    # the leading dims merged where every input's strides chain and element strides, as
    # c_fused_ (inputs of any strides: a coincidental merge replays as the unmerged layout)
    "c_row_": "rows, row length, merged leading dims and element strides",
}


def follows_dims(name: str) -> bool:
    """Whether kernel ``name``'s C arguments follow the dims (the two tables above)."""
    return name in SYMBOLIC_KERNELS or name.startswith(tuple(SYMBOLIC_PREFIXES))


class Domain:
    """Where a program's recordings may be fitted and replayed: every symbolic extent of its
    instructions' shapes at least 2 (see the module doc)."""

    def __init__(self, extents: list, symbols: Sequence):
        self._fn = sympy.lambdify(list(symbols), list(extents), "math") if extents else None

    def holds(self, values: Sequence[int]) -> bool:
        return self._fn is None or all(e >= 2 for e in self._fn(*values))


def analyze(instructions: Sequence, symbols: Sequence) -> Domain | str:
    """The domain of a program with symbolic dims, or why its recordings cannot be fitted over
    dims (a shape or attribute that is not a polynomial of the dims, a kernel of
    shape-dependent instructions outside ``SYMBOLIC_KERNELS``)."""
    extents: set = set()
    for ins in instructions:
        shapes = (tuple(ins.shape), *(tuple(s) for s in ins.input_shapes))
        attrs = [v for v in ins.attrs.values() if isinstance(v, (sympy.Basic, tuple))]
        found = free_symbols(shapes) | free_symbols(tuple(attrs))
        if not found:
            continue
        k = ins.kernel
        if k is not None and not k.view and not follows_dims(k.name):
            return (f"{ins.name}'s inputs change with the dims and its C arguments are not known "
                    "to follow them (native_dims.SYMBOLIC_KERNELS)")
        for e in _expressions((*shapes, *attrs)):
            if not e.is_polynomial(*symbols):
                return f"{ins.name} has {e}, not a polynomial of the dims"
        for s in shapes:
            extents.update(d for d in s if isinstance(d, sympy.Basic) and d.free_symbols)
    return Domain(sorted(extents, key=str), symbols)


def _expressions(values) -> list:
    out = []
    for v in values:
        if isinstance(v, tuple):
            out.extend(_expressions(v))
        elif isinstance(v, sympy.Basic) and v.free_symbols:
            out.append(v)
    return out


@dataclass(frozen=True)
class Context:
    """What the program knows that the samples do not: the dims' names, how each per-dims leaf
    (a ``size(past)``) is computed, and the weight binding the samples belong to."""

    symbols: tuple[str, ...]
    dim_leaves: Mapping[int, Callable]  # leaf value index -> its value at the dims' values
    generation: int


# ---------------------------------------------------------------------------- fitting
class _Basis:
    """The monomials of the varying dims and an exact solver of integer coefficients."""

    def __init__(self, samples: Sequence[Sample], symbols: Sequence[str]):
        values = [s.values for s in samples]
        self.values = values
        self.varying = [j for j in range(len(values[0])) if len({v[j] for v in values}) > 1]
        if len(self.varying) > MAX_VARYING:
            names = ", ".join(symbols[j] for j in self.varying)
            raise NotNativeError(f"{len(self.varying)} dims vary together ({names}); at most "
                                 f"{MAX_VARYING} are fitted")
        self.subsets = [c for r in range(len(self.varying) + 1)
                        for c in itertools.combinations(self.varying, r)]
        self.rows = [[math.prod(v[j] for j in sub) for sub in self.subsets] for v in values]
        self.chosen = _independent(self.rows, len(self.subsets))
        self.inverse = None if self.chosen is None else _inverse([self.rows[i]
                                                                  for i in self.chosen])

    @property
    def ready(self) -> bool:
        return self.chosen is not None and len(self.rows) >= len(self.subsets) + VALIDATE

    def solve(self, values: Sequence[int], what: Callable[[], str]) -> int | tuple[int, ...]:
        """An int when every sample agrees, else the coefficients (one per monomial, the
        constant first); raises NotNativeError when no integer multilinear polynomial fits."""
        first = values[0]
        if all(v == first for v in values):
            return first
        picked = [values[i] for i in self.chosen]
        coefs = [sum((c * v for c, v in zip(row, picked)), Fraction(0)) for row in self.inverse]
        if any(c.denominator != 1 for c in coefs):
            raise NotNativeError(f"{what()} takes {list(values)} at dims {self.values}, no "
                                 "integer polynomial of the dims")
        ints = tuple(int(c) for c in coefs)
        for row, v in zip(self.rows, values):
            if sum(c * m for c, m in zip(ints, row)) != v:
                raise NotNativeError(f"{what()} takes {list(values)} at dims {self.values}, "
                                     "not a polynomial of the dims")
        return ints


def _independent(rows: list[list[int]], m: int) -> list[int] | None:
    """Indices of the first ``m`` linearly independent rows, or None."""
    chosen, basis = [], []
    for i, row in enumerate(rows):
        vec = [Fraction(x) for x in row]
        for b in basis:  # reduce against the rows kept (each with a pivot)
            p = next(j for j, x in enumerate(b) if x != 0)
            if vec[p] != 0:
                f = vec[p] / b[p]
                vec = [x - f * y for x, y in zip(vec, b)]
        if any(x != 0 for x in vec):
            basis.append(vec)
            chosen.append(i)
            if len(chosen) == m:
                return chosen
    return None


def _inverse(a: list[list[int]]) -> list[list[Fraction]]:
    n = len(a)
    m = [[Fraction(x) for x in row] + [Fraction(int(i == j)) for j in range(n)]
         for i, row in enumerate(a)]
    for c in range(n):
        p = next(r for r in range(c, n) if m[r][c] != 0)
        m[c], m[p] = m[p], m[c]
        pivot = m[c][c]
        m[c] = [x / pivot for x in m[c]]
        for r in range(n):
            if r != c and m[r][c] != 0:
                f = m[r][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [row[n:] for row in m]


def _same(samples: Sequence[Sample], get: Callable, what: str):
    first = get(samples[0])
    for s in samples[1:]:
        if get(s) != first:
            raise NotNativeError(f"{what} differs between calls at different dims")
    return first


def fit(samples: Sequence[Sample], context: Context) -> DimsRecording | None:
    """One recording for every dims in the samples' domain, or None while more samples are
    needed; raises NotNativeError when the samples cannot be fitted (see the module doc)."""
    basis = _Basis(samples, context.symbols)
    if not basis.ready:
        return None
    return _Fitter(samples, basis, context).build()


class _Fitter:
    def __init__(self, samples: Sequence[Sample], basis: _Basis, context: Context):
        self.samples, self.basis, self.context = samples, basis, context
        self.first = samples[0]
        self.roots: dict[tuple, np.ndarray] = {}  # region key -> the replay's buffer
        self.dim_leaves: list[tuple[np.ndarray, Callable]] = []
        self.patches: list[list[int]] = []
        self.width = len(basis.subsets)

    # -- structure
    def _check_structure(self) -> None:
        s = self.samples
        _same(s, lambda x: x.inputs, "the number of inputs")
        _same(s, lambda x: x.states, "a kept state's buffer")
        _same(s, lambda x: [step[:2] for step in x.steps], "the kernels that ran")
        _same(s, lambda x: x.calls, "the C functions called")
        _same(s, lambda x: [len(b) for b in x.blocks], "the blocks passed to C")
        _same(s, lambda x: [d is None for d in x.block_descs], "the blocks passed to C")
        _same(s, lambda x: len(x.outputs), "the number of outputs")
        for i, step in enumerate(self.first.steps):
            name, view = step[0], step[1]
            if view or follows_dims(name):
                continue
            _same(s, lambda x, i=i: x.steps[i][2:], f"{name}'s inputs, attributes or result "
                  "(its C arguments are not known to follow the dims: "
                  "native_dims.SYMBOLIC_KERNELS)")

    # -- regions
    def _root(self, key: tuple) -> np.ndarray:
        found = self.roots.get(key)
        if found is not None:
            return found
        spans = [s.regions.get(key) for s in self.samples]
        if any(sp is None for sp in spans):
            raise NotNativeError(f"memory {key} is not used at every dims")
        start, end, root = spans[0]
        if key[0] in STABLE:
            if any((sp[0], sp[1]) != (start, end) or sp[2] is not root for sp in spans):
                raise NotNativeError(f"memory {key} moved between calls")
        elif any(sp[1] - sp[0] != end - start for sp in spans):
            raise NotNativeError(f"the size of {key} changes with the dims (a per-call buffer "
                                 "the recording cannot size once)")
        elif key[0] == "leaf" and key[1] in self.context.dim_leaves:
            root = np.empty_like(root)  # rewritten per call with the leaf's value
            self.dim_leaves.append((root, self.context.dim_leaves[key[1]]))
        self.roots[key] = root
        return root

    # -- values
    def _solve(self, values: list[int], what: Callable[[], str]):
        return self.basis.solve(values, what)

    def _place(self, target: int, base: int, fitted, index: int = 0) -> int:
        """The slot's constant value, or 0 with a patch: base + fitted at the call's dims
        (``index``: an input's base added per call)."""
        if isinstance(fitted, int):
            if not index:
                return _int64(base + fitted)
            fitted = (fitted,) + (0,) * (self.width - 1)
        self.patches.append([target, index, _int64(base + fitted[0]), *fitted[1:]])
        return 0

    def _value(self, descs: list[tuple], target: int, what: Callable[[], str]) -> int:
        kind = _same_kind(descs, what)
        if kind == "i":
            return self._place(target, 0, self._solve([d[1] for d in descs], what))
        if kind == "f":
            if any(d[1] != descs[0][1] for d in descs):
                raise NotNativeError(f"{what()} is a float that changes with the dims")
            return descs[0][1]
        if kind == "null":
            return 0
        if any(d[1] != descs[0][1] for d in descs):
            raise NotNativeError(f"{what()} points into different memory at different dims")
        offset = self._solve([d[2] for d in descs], what)
        if kind == "feed":  # an input fed per call: its base is patched in
            return self._place(target, 0, offset, 1 + descs[0][1])
        if kind == "block":
            return self._place(target, _data(self.blocks[descs[0][1]]), offset)
        return self._place(target, _data(self._root(descs[0][1])), offset)

    def build(self) -> DimsRecording:
        self._check_structure()
        first, samples = self.first, self.samples
        self.blocks = [np.array(b, copy=True) for b in first.blocks]
        for b, slots in enumerate(first.block_descs):
            block = self.blocks[b]
            if slots is None:  # elements that are not 8 bytes: the same bytes at every dims
                if any(not np.array_equal(s.blocks[b], block) for s in samples):
                    raise NotNativeError("a block of small ints passed to C changes with the "
                                         "dims")
                continue
            for j in range(len(slots)):
                block[j] = self._value([s.block_descs[b][j] for s in samples],
                                       _data(block) + 8 * j,
                                       lambda b=b, j=j: f"int {j} of block {b}")
        sigs = [COPY] + sorted({sig for _, sig in first.calls if sig != COPY})
        sig_id = {sg: i for i, sg in enumerate(sigs)}
        stride = 2 + max((len(sig[1]) for _, sig in first.calls), default=1)
        table = np.zeros((max(len(first.calls), 1), stride), np.int64)
        base = _data(table)
        for i, (fn, sig) in enumerate(first.calls):
            table[i, 0], table[i, 1] = _int64(fn), sig_id[sig]
            if sig == COPY:
                table[i, 0] = 0
            for k in range(len(sig[1])):
                table[i, 2 + k] = self._value(
                    [s.descs[i][k] for s in samples], base + 8 * (i * stride + 2 + k),
                    lambda i=i, k=k: f"argument {k + 1} of C call {i} ({first.owners[i]})")
        outputs = [self._output(n) for n in range(len(first.outputs))]
        pinned = tuple((j, first.values[j]) for j in range(len(first.values))
                       if j not in self.basis.varying)
        return DimsRecording(self, table, stride, sigs, outputs, pinned)

    def _output(self, n: int) -> tuple:
        outs = [s.outputs[n] for s in self.samples]
        desc0, shape0, _, dtype = outs[0]
        what = lambda: f"output {n}"  # noqa: E731
        if any(o[3] != dtype or len(o[1]) != len(shape0) for o in outs):
            raise NotNativeError("an output's dtype or rank changes with the dims")
        kind = _same_kind([o[0] for o in outs], what)
        # empty at every sample, its shape may still follow the dims: (n, 0) is fitted as
        # such (sample 0's shape was returned at every dims)
        shape = tuple(self._solve([o[1][a] for o in outs], what) for a in range(len(shape0)))
        if kind == "null":
            return (None, 0, shape, (0,) * len(shape0), dtype)
        if kind != "region" or any(o[0][1] != desc0[1] for o in outs):
            raise NotNativeError("an output lies in different memory at different dims")
        offset = self._solve([o[0][2] for o in outs], what)
        strides = tuple(self._solve([o[2][a] for o in outs], what)
                        for a in range(len(shape0)))
        return (self._root(desc0[1]), offset, shape, strides, dtype)


def _same_kind(descs: list[tuple], what: Callable[[], str]) -> str:
    kind = descs[0][0]
    if any(d[0] != kind for d in descs):
        raise NotNativeError(f"{what()} is not the same kind of value at every dims")
    return kind


# ---------------------------------------------------------------------------- replaying
class DimsRecording:
    """A table of C calls fitted over dims: ``run`` replays it at the call's dims in one
    foreign call (the runner patches the varying slots first)."""

    def __init__(self, fitter: _Fitter, table: np.ndarray, stride: int, sigs: list,
                 outputs: list, pinned: tuple):
        first = fitter.first
        self.generation = fitter.context.generation
        self.states = first.states
        self.count = len(first.calls)
        self.table = table
        self.blocks = fitter.blocks
        self.roots = fitter.roots
        self.keep = [s.keep for s in fitter.samples[:1]]  # sample 0's buffers are replayed
        self.dim_leaves = fitter.dim_leaves
        self.subsets = fitter.basis.subsets[1:]  # monomials beyond the constant
        self.pinned = pinned
        width = fitter.width
        self.outputs = [(root, dtype, len(shape)) for root, _, shape, _, dtype in outputs]
        # every output's offset, shape and strides, one row each: constant + coefficients
        # times the monomials, evaluated for all outputs in one product per call
        fields = [f for _, offset, shape, strides, _ in outputs
                  for f in (offset, *shape, *strides)]
        self.fields = np.array([(f, *(0,) * (width - 1)) if isinstance(f, int) else f
                                for f in fields] or [[0] * width], np.int64).reshape(-1, width)
        self._point = np.ones(width, np.int64)  # 1, then the monomials
        rows = fitter.patches
        self.patches = np.array(rows or [[0] * (2 + width)], np.int64)
        self.mono = np.zeros(max(len(self.subsets), 1), np.int64)
        self.bases = np.zeros(1 + max(first.inputs, 1), np.int64)
        self.run_fn = runner(tuple(sigs))
        self._args = (_data(table), self.count, stride, _data(self.patches), len(rows),
                      2 + width, _data(self.bases), _data(self.mono))

    def replays(self, values: Sequence[int]) -> bool:
        return all(values[j] == v for j, v in self.pinned)

    def run(self, values: Sequence[int], inputs: Sequence[np.ndarray]) -> list | int:
        """Replay at the dims ``values`` with these input arrays: the outputs (views of the
        program's memory at the call's shapes), or 1 + the index of a C call that failed."""
        mono = self.mono
        for i, sub in enumerate(self.subsets):
            mono[i] = math.prod(values[j] for j in sub)
        bases = self.bases
        for k, a in enumerate(inputs):
            bases[k + 1] = _data(a)
        for buf, fn in self.dim_leaves:
            buf[...] = fn(values)
        failed = self.run_fn(*self._args)
        if failed:
            return failed
        point = self._point
        point[1:] = mono[:len(point) - 1]
        ints = (self.fields @ point).tolist()
        out, at = [], 0
        for root, dtype, rank in self.outputs:
            offset, shape = ints[at], tuple(ints[at + 1:at + 1 + rank])
            strides = tuple(ints[at + 1 + rank:at + 1 + 2 * rank])
            at += 1 + 2 * rank
            out.append(np.empty(shape, dtype) if root is None else
                       np.ndarray(shape, dtype, buffer=root, offset=offset, strides=strides))
        return out

