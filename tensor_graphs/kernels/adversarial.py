"""Adversarial verification cases: the inputs that break the usual mistakes of kernel writers.

Unit-scale random inputs admit a softmax that never subtracts its row max and a layer_norm
that computes the variance in one pass (E[x^2] - E[x]^2). Which inputs break which mistakes
follows from what a pattern computes, so the cases come from the atomic ops its reference
decomposes to, not from a list of ops: ``MOTIFS`` is one small table (a dataflow shape in the
atomic graph -> the value kinds its inputs get), applied by one loop in ``cases``, and every
op, fused pattern or generated region that contains the shape gets the cases.

Value kinds (``Spec.values``; drawn by ``draw``; rows are the reduced axes of the motif):

- ``logits``: rows shifted by +-1.2..2 T (T = log of the largest float, 88.7 below float64,
  709.8 for it), so a softmax without the max subtracted overflows (inf / inf) or underflows
  (0 / 0); rows spread by T / 2, so log(softmax) underflows to log(0) = -inf.
- ``masked``: normal values with -inf positions, at least one finite one per row: 40% of
  the positions scattered, or a run at the start (left padding) or at the end (right
  padding); the reference gives 0 (softmax) or -inf (log_softmax) there.
- ``scaled``: normal values times sqrt(T), for inputs that reach the softmax through a matmul
  (attention's q and k): logits of the order of T.
- ``offset``: rows at +-1e3..1e4 with a spread R times smaller (R: 300..3000 in float32,
  1e6..1e7 in float64): E[x^2] - E[x]^2 loses all of its digits, x - mean loses log10(R).
- ``tiny``: rows scaled by 1, 1e-5, 100, 1e-3, and constant rows (a power of two): mean(x^2)
  and the variance far below eps, so a kernel that forgets eps is off by orders of magnitude
  (or 0 / 0), and a kernel that normalises over the wrong axes mixes scales.
- ``nonfinite``: normal values with one NaN, +inf or -inf in three rows of four, for every
  reduction, also one that reads its input through views (int4_scale's max over padded,
  reshaped groups): they propagate as the reference says (no nanmax, no fmax, no clamping).
- ``cancel``: float16/bfloat16 rows of normal / 2 + 1 with an eighth of the positions in pairs
  +-L, L in 8192..16384: a float32 accumulator keeps the small terms (to ~1e-5), a float16
  one overflows or loses them.
- ``tail``: the whole tensor in [-9.5, -8.5] ([-4.9, -4.0] in float16), for an input that
  reaches erfc scaled by a negative constant (gelu's x/2 erfc(-x / sqrt 2)): x Phi(x) is
  -1e-17 .. -1e-20 there, and 1 + erf(x / sqrt 2), the textbook form, is exactly 0 in float64
  (and in float32 from -5.9), so a kernel that computes it is off by 100 %. Mixed with
  ordinary values the tail would not register in a norm-wise error: the case is all tail.

Besides values, ``cases`` adds shapes and a layout to every kernel (unless ``contiguous``):
rows of length 1 (the last axis, and every axis of that size, mapped to 1), odd sizes (every
size mapped to the next prime: 64 -> 67, 7 -> 11), a single element, and Fortran-ordered
inputs (``layout="transposed"``). Sizes that attributes also name (reshape targets) may not
build: such variants are skipped, as are variants the kernel's constraints reject.

A correct float32 kernel cannot do better than rounding its row statistic once: on ``offset``
rows a two-pass or Welford layer_norm is off by about u * R (u = 2**-24), while the one-pass
variance is off by u * R**2, which is 100 % or NaN. ``floor`` is the error such a case allows
(``FLOOR_ULPS * u * R_max``, 1e-2 in float32); a wrong algorithm misses it by orders of
magnitude. The other kinds need no floor: a correct kernel is as exact on them as on unit
values (a max-subtracted softmax of shifted rows subtracts exactly).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from tensor_graphs.ir.algebra import ELEMENTWISE
from tensor_graphs.ir.graph import nodes
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import (
    CAST,
    CONSTANT,
    ERFC,
    EXP,
    EXPAND,
    MATMUL,
    MAX,
    MUL,
    NEG,
    PAD,
    PERMUTE,
    RESHAPE,
    SLICE,
    SQRT,
    SUM,
)
from tensor_graphs.kernels.signatures import FLOATS, Case, Spec

LOW = ("float16", "bfloat16")
KINDS = ("logits", "masked", "scaled", "offset", "tiny", "cancel", "nonfinite", "tail")
SPREAD = {"float64": (1e6, 1e7), "float32": (1e3, 1e4), "float16": (10.0, 30.0),
          "bfloat16": (10.0, 30.0)}  # R of ``offset``: the row's |mean| / its spread
FLOOR_ULPS = 16  # an offset case allows FLOOR_ULPS * u * R_max (u: the arithmetic's roundoff)
MASKED = 0.4  # the share of -inf positions in ``masked`` rows
TAIL = {"float16": (-4.9, -4.0)}  # ``tail``'s range (else TAIL_RANGE): float16's Phi(-9) is 0
TAIL_RANGE = (-9.5, -8.5)
SIZED = (8, 20000)  # the elements of a case the variants start from (small, not trivial)
SHAPES = ("rows of 1", "odd sizes", "one element")  # the shape variants' labels


# ---------------------------------------------------------------------------- motifs
@dataclass(frozen=True)
class Motif:
    """A dataflow shape in a pattern's atomic graph, and the value kinds it calls for.
    ``find(graph)`` returns (leaf, row axes in the leaf's coordinates or None: all axes)."""

    name: str
    find: Callable[[Node], list[tuple[Node, tuple | None]]]
    kinds: tuple[str, ...]
    dtypes: tuple[str, ...] = FLOATS  # the leaf dtypes the kinds are drawn for


def _frontier(node: Node) -> list[Node]:
    """The nodes that feed ``node`` through elementwise ops only: leaves, reductions, matmuls,
    views (``node`` itself excluded; broadcasting right-aligns their axes with its axes)."""
    out, seen, stack = [], set(), list(node.inputs)
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.op.name in ELEMENTWISE:
            stack.extend(n.inputs)
        else:
            out.append(n)
    return out


def _named(n: Node) -> bool:
    return n.op.is_leaf and n.name is not None


def _under(n: Node) -> list[Node]:
    """The named leaves ``n`` depends on (in any way)."""
    return [m for m in nodes(n) if _named(m)]


def _row_axes(reduction: Node, leaf: Node) -> tuple:
    """The reduction's axes in the coordinates of a leaf that reaches it elementwise."""
    shift = reduction.inputs[0].ndim - leaf.ndim
    return tuple(a - shift for a in reduction.attrs["axes"] if a - shift >= 0)


def _through(reduction: Node, feeder: Node) -> list[tuple[Node, tuple | None]]:
    """The leaves behind ``feeder`` with their row axes: its own axes when it is a leaf,
    the whole tensor (None) when views stand between (group_norm's reshape)."""
    if _named(feeder):
        return [(feeder, _row_axes(reduction, feeder))]
    return [(leaf, None) for leaf in _under(feeder)]


def _shifted_exp(graph: Node, direct: bool) -> list[tuple[Node, tuple | None]]:
    """exp(x - max(x)): the inputs that reach the exp elementwise (``direct``), or through
    another op such as attention's q @ k^T (not ``direct``)."""
    out = []
    for e in nodes(graph):
        if e.op.name != EXP:
            continue
        feed = _frontier(e)
        m = next((n for n in feed if n.op.name == MAX), None)
        if m is None:
            continue
        for n in feed:
            if direct and _named(n):
                out.append((n, _row_axes(m, n)))
            elif not direct and not _named(n) and n is not m and n.op.name != MAX:
                ahead = {id(x) for x in feed}
                out += [(leaf, None) for leaf in _under(n) if id(leaf) not in ahead
                        and _reaches_matmul(n)]
    return out


def _reaches_matmul(n: Node) -> bool:
    return any(m.op.name == MATMUL for m in nodes(n))


def _centered_square(graph: Node) -> list[tuple[Node, tuple | None]]:
    """sum((x - mean(x))**2): the leaves that feed both the square and the inner sum."""
    out = []
    for p in nodes(graph):
        if p.op.name != MUL or p.inputs[0] is not p.inputs[1]:
            continue
        feed = _frontier(p)
        for s in feed:
            if s.op.name == SUM:
                inner = {id(n) for n in _frontier(s)}
                for f in feed:
                    if id(f) in inner:
                        out += _through(s, f)
    return out


def _sqrt_of_sum(graph: Node) -> list[tuple[Node, tuple | None]]:
    """x / sqrt(sum(...) / n + eps): the leaves under the sum, by its rows."""
    out = []
    for q in nodes(graph):
        if q.op.name != SQRT:
            continue
        for s in _frontier(q):
            if s.op.name == SUM:
                for f in _frontier(s):
                    if f.op.name not in (SUM, MAX):  # layer_norm's mean: x is found directly
                        out += _through(s, f)
    return out


def _reduced(graph: Node) -> list[tuple[Node, tuple | None]]:
    """sum or max over axes of an elementwise function of an input, or of views of one
    (every reduction; int4_scale's max over a padded, reshaped |w|, a grouped dynamic_quant's
    over its reshaped rows): a NaN-hiding scale stays visible behind a view too."""
    out = []
    for r in nodes(graph):
        if r.op.name in (SUM, MAX):
            out += _behind(r.inputs[0], tuple(a % max(r.inputs[0].ndim, 1)
                                              for a in r.attrs["axes"]))
    return out


def _behind(node: Node, axes: tuple | None) -> list[tuple[Node, tuple | None]]:
    """The named leaves whose values reach ``node`` through elementwise ops and the views of
    ``VIEW_AXES``, each with ``axes`` (of ``node``) in its own coordinates (None: unknown,
    the whole tensor)."""
    out, seen, stack = [], set(), [(node, axes)]
    while stack:
        n, ax = stack.pop()
        if (id(n), ax) in seen:
            continue
        seen.add((id(n), ax))
        step = VIEW_AXES.get(n.op.name, _aligned if n.op.name in ELEMENTWISE else None)
        if _named(n):
            out.append((n, ax))
        elif step is not None:
            stack += [(x, None if ax is None else step(n, x, ax)) for x in n.inputs]
    return out


def _aligned(n: Node, x: Node, axes: tuple) -> tuple:
    """``n``'s axes in the coordinates of an input it broadcasts (right-aligned)."""
    shift = n.ndim - x.ndim
    return tuple(a - shift for a in axes if a - shift >= 0)


def _reshaped(n: Node, x: Node, axes: tuple) -> tuple | None:
    """The input axes a reshape's ``axes`` hold: reshape merges and splits runs of axes whose
    sizes have equal products, and an axis of a run maps to the whole run (a split K -> (K / G,
    G) reduced over G: rows along K). None for symbolic sizes."""
    src, dst = tuple(x.shape), tuple(n.shape)
    if not all(isinstance(d, int) for d in src + dst):
        return None
    before, after = _prefix(src), _prefix(dst)
    ends = sorted(set(before) & set(after))  # the products where both shapes end a run

    def run(prefix: list[int], i: int) -> int:
        return bisect_left(ends, prefix[i + 1])

    runs = {run(after, a) for a in axes}
    return tuple(i for i in range(len(src)) if run(before, i) in runs)


def _prefix(shape: tuple) -> list[int]:
    return [math.prod(shape[:i]) for i in range(len(shape) + 1)]


# views whose axes map onto their input's: how a reduction's rows read in the input's axes
VIEW_AXES: dict[str, Callable[[Node, Node, tuple], tuple | None]] = {
    # a run of axes merged or split: the whole run (int4_scale, grouped dynamic_quant)
    RESHAPE: _reshaped,
    # output axis i is input axis perm[i]
    PERMUTE: lambda n, x, axes: tuple(n.attrs["perm"][a] for a in axes),
    # pad and slice keep every axis (int4_scale pads its last group's rows)
    PAD: lambda n, x, axes: axes,
    SLICE: lambda n, x, axes: axes,
    # broadcast: right-aligned, as elementwise ops
    EXPAND: _aligned,
}


def _summed(graph: Node) -> list[tuple[Node, tuple | None]]:
    """sum(x) of an input itself, or of it cast (mean of float16 sums in float32): how it
    accumulates is the kernel's choice."""
    out = []
    for s in nodes(graph):
        if s.op.name == SUM:
            x = s.inputs[0]
            while x.op.name == CAST:
                x = x.inputs[0]
            if _named(x):
                out.append((x, _row_axes(s, x)))
    return out


def _erfc_tail(graph: Node) -> list[tuple[Node, tuple | None]]:
    """erfc(c x) with c < 0, or erfc(-x): the inputs x, as whole tensors (gelu's tail)."""
    out = []
    for e in nodes(graph):
        if e.op.name != ERFC:
            continue
        u = e.inputs[0]
        if u.op.name == NEG and _named(u.inputs[0]):
            out.append((u.inputs[0], None))
        elif u.op.name == MUL:
            for c, x in (u.inputs, u.inputs[::-1]):
                if c.op.name == CONSTANT and _named(x) and bool(np.all(
                        np.asarray(c.attrs["value"].array, np.float64) < 0)):
                    out.append((x, None))
    return out


MOTIFS = (
    # softmax, log_softmax, logsumexp, cross_entropy, attention's mask: exp(x - max(x))
    Motif("shifted exp", lambda g: _shifted_exp(g, True), ("logits", "masked")),
    # attention's q and k: they reach that exp through q @ k^T, as large logits
    Motif("logits of a matmul", lambda g: _shifted_exp(g, False), ("scaled",)),
    # layer_norm, var, group_norm: a sum of squares of x - mean(x)
    Motif("variance", _centered_square, ("offset",)),
    # layer_norm, rms_norm, group_norm: x divided by sqrt(a row statistic + eps)
    Motif("normalised", _sqrt_of_sum, ("tiny",)),
    # every reduction: NaN and +-inf propagate as the reference has them (no nanmax, fmax)
    Motif("reduction", _reduced, ("nonfinite",)),
    # sum, mean of float16/bfloat16: the accumulator's precision and range
    Motif("low-precision sum", _summed, ("cancel",), LOW),
    # gelu (erf form): Phi's far tail, where 1 + erf cancels to 0 and erfc does not
    Motif("erfc tail", _erfc_tail, ("tail",)),
)


# ---------------------------------------------------------------------------- cases
def cases(cases_built: list[tuple[Case, object]], build: Callable[[Case], object | None],
          graph_of: Callable[[object], Node], contiguous: bool) -> list[tuple[Case, object]]:
    """The adversarial cases for a kernel whose plain cases are ``cases_built`` ((Case, Built)
    pairs): each motif's kinds on the first small plain case where the motif finds inputs of
    its dtypes, then shape and layout variants of the first small case. ``build(case)`` builds
    a case (None when the pattern or the constraints refuse it), ``graph_of(built)`` gives its
    atomic graph."""
    base = [(c, b) for c, b in cases_built if _sized(c)]
    if not base:
        return []
    out: list[tuple[Case, object]] = []
    for motif in MOTIFS:  # the one loop over the table
        for case, built in base:
            found = _inputs(motif, case, built, graph_of(built))
            if not found:
                continue
            for kind in motif.kinds:
                specs = {n: replace(s, values=kind, axes=found[n]) if n in found else s
                         for n, s in case.specs.items()}
                dtype = case.specs[next(iter(found))].dtype
                out.append((Case(specs, dict(case.attrs), case.note, adversarial=(
                    f"{kind} {', '.join(found)}"), floor=floor(kind, dtype)), built))
            break
    return out + _shape_cases(base, build, _row(*base[0], graph_of), contiguous)


def _row(case: Case, built, graph_of) -> int | None:
    """The length of the case's rows: the first reduced axis a motif finds (a softmax's keys,
    a norm's features), whatever the input's dtype (attention's bool mask)."""
    names = {id(leaf): name for name, leaf in built.leaves.items()}
    graph = graph_of(built)
    for motif in MOTIFS:
        for leaf, axes in motif.find(graph):
            if axes and id(leaf) in names:
                return case.specs[names[id(leaf)]].shape[axes[-1]]
    return None


def _inputs(motif: Motif, case: Case, built, graph: Node) -> dict[str, tuple | None]:
    """The case's inputs the motif finds (of its dtypes), with their row axes."""
    names = {id(leaf): name for name, leaf in built.leaves.items()}
    found: dict[str, tuple | None] = {}
    for leaf, axes in motif.find(graph):
        name = names.get(id(leaf))
        spec = case.specs.get(name) if name is not None else None
        if spec is not None and spec.dtype in motif.dtypes and name not in found:
            found[name] = axes
    return found


def _shape_cases(base, build, row: int | None, contiguous: bool) -> list[tuple[Case, object]]:
    """Rows of 1 (the reduced axis, else the last), odd sizes and one element from the first
    small case; column-major inputs on the first small case with a matrix."""
    out = []
    case = base[0][0]
    if row is None:
        row = next((s.shape[-1] for s in case.specs.values() if s.shape), 1)
    sizes = {d for s in case.specs.values() for d in s.shape if d > 1}
    for label, mapping in zip(SHAPES, ({row: 1}, {d: _next_prime(d) for d in sizes},
                                       {d: 1 for d in sizes})):
        if not mapping or all(k == v for k, v in mapping.items()):
            continue
        variant = Case({n: _resize(s, mapping) for n, s in case.specs.items()},
                       dict(case.attrs), case.note, adversarial=label)
        b = build(variant)
        if b is not None:
            out.append((variant, b))
    if not contiguous:
        for case, built in base:
            if any(_dims_over_one(s.shape) >= 2 for s in case.specs.values()):
                out.append((Case(dict(case.specs), dict(case.attrs), case.note,
                                 layout="transposed"), built))
                break
    return out


def _sized(c: Case) -> bool:
    total = sum(math.prod(s.shape) for s in c.specs.values())
    return SIZED[0] <= total <= SIZED[1]


def _dims_over_one(shape) -> int:
    return sum(1 for d in shape if d > 1)


def _resize(s: Spec, mapping: dict[int, int]) -> Spec:
    shape = tuple(mapping.get(d, d) for d in s.shape)
    return replace(s, shape=shape, high=mapping.get(s.high, s.high))


def _next_prime(n: int) -> int:
    p = n + 1
    while p < 3 or any(p % q == 0 for q in range(2, int(p ** 0.5) + 1)):
        p += 1
    return p


def floor(kind: str, dtype: str) -> float:
    """The error a correct kernel may show on a case of this kind (see the module docstring):
    nonzero for ``offset``, whose rows no algorithm that rounds its mean once gets exactly."""
    if kind != "offset":
        return 0.0
    return FLOOR_ULPS * _unit(dtype) * SPREAD[dtype][1]


def _unit(dtype: str) -> float:
    """The unit roundoff of a kernel's arithmetic on ``dtype`` inputs (float16 and bfloat16
    compute in float32)."""
    return 2.0 ** -53 if dtype == "float64" else 2.0 ** -24


def _log_max(dtype: str) -> float:
    """T: exp(x) overflows past it in the arithmetic of ``dtype`` inputs."""
    return math.log(np.finfo(np.float64 if dtype == "float64" else np.float32).max)


# ---------------------------------------------------------------------------- values
def _rows(shape: tuple, axes: tuple | None) -> tuple[int, int, Callable]:
    """(rows, row length, put) for a tensor seen as rows along ``axes`` (None: one row of
    every element): ``put`` turns a (rows, length) array into ``shape``."""
    nd = len(shape)
    along = list(range(nd)) if axes is None else sorted({a % nd for a in axes}) if nd else []
    order = [i for i in range(nd) if i not in along] + along
    length = math.prod(shape[i] for i in along)
    rows = math.prod(shape) // max(length, 1) if length else 0

    def put(m: np.ndarray) -> np.ndarray:
        return m.reshape([shape[i] for i in order]).transpose(np.argsort(order)) if nd \
            else m.reshape(())

    return rows, length, put


def draw(spec: Spec, rng: np.random.Generator) -> np.ndarray:
    """float64 values of an adversarial kind (the caller rounds them to the spec's dtype)."""
    rows, n, put = _rows(spec.shape, spec.axes)
    z = rng.standard_normal((rows, n))
    j = np.arange(rows)[:, None]
    t = _log_max(spec.dtype)
    if spec.values == "logits":
        shift = rng.uniform(1.2, 2.0, (rows, 1)) * t
        shift = np.select([j % 4 == 0, j % 4 == 1, j % 4 == 2],
                          [shift, -shift, 0.0], rng.uniform(0.5, 1.0, (rows, 1)) * t)
        spread = np.select([j % 4 == 2, j % 4 == 3], [t / 2, t / 8], 1.0)
        v = shift + spread * z
    elif spec.values == "masked":  # scattered, then left padding, then right padding
        keys = rng.random((rows, n))
        kept = keys == keys.max(axis=1, keepdims=True)
        cut = rng.integers(1, max(n, 2), (rows, 1))  # 1..n-1 positions padded
        at = np.arange(n)[None, :]
        masked = np.select([j % 3 == 0, j % 3 == 1], [(keys < MASKED) & ~kept, at < cut],
                           at >= n - cut)
        v = np.where(masked & (n > 1), -np.inf, z)
    elif spec.values == "scaled":
        v = math.sqrt(t) * z
    elif spec.values == "offset":
        lo, hi = SPREAD[spec.dtype]
        mean = np.where(j % 2 == 0, 1.0, -1.0) * 10.0 ** rng.uniform(3, 4, (rows, 1))
        ratio = 10.0 ** rng.uniform(math.log10(lo), math.log10(hi), (rows, 1))
        v = mean + np.abs(mean) / ratio * z
    elif spec.values == "tiny":
        scale = np.choose(j % 5, [1.0, 1e-5, 100.0, 1e-3, 0.0])
        constant = 2.0 ** rng.integers(-2, 3, (rows, 1)) * np.where(j % 2 == 0, 1.0, -1.0)
        v = np.where(j % 5 == 4, constant, scale * z)
    elif spec.values == "nonfinite":  # one NaN, +inf or -inf in three rows of four
        at = rng.integers(0, max(n, 1), (rows, 1)) == np.arange(n)[None, :]
        v = np.where(at & (j % 4 < 3), np.choose(j % 4, [np.nan, np.inf, -np.inf, 0.0]), z)
    elif spec.values == "tail":
        lo, hi = TAIL.get(spec.dtype, TAIL_RANGE)
        v = rng.uniform(lo, hi, (rows, n))
    elif spec.values == "cancel":
        v = z * 0.5 + 1.0
        pairs = n // 16
        if pairs:
            where = np.argsort(rng.random((rows, n)), axis=1)
            big = 8192.0 + 128.0 * rng.integers(0, 64, (rows, pairs))
            np.put_along_axis(v, where[:, :pairs], big, axis=1)
            np.put_along_axis(v, where[:, pairs:2 * pairs], -big, axis=1)
    else:
        raise ValueError(f"unknown adversarial value kind {spec.values!r}")
    return put(v)
