"""Kernel verification: a kernel is admitted only after it matches the float64 reference.

    report = tg.kernels.verify(kernel)         # or a kernel's name
    report.ok, report.max_rel_error, report.shapes, report.failures
    tg.kernels.verify(kernel, strict=True)     # raises tg.KernelVerificationError

For each case (``kernels.signatures``: shapes of sizes 1, 7, 33 and 1025, broadcasting, every
dtype the kernel takes, the attributes' common forms; a variadic kernel at 1, 2, 5 and 9
inputs) the verifier builds the kernel's pattern
as a graph — pattern variables become ``tg.input`` leaves of the case's shapes and dtypes —,
skips the case when the kernel does not match it (its constraints reject it), draws fresh
random inputs (never zeros; ints in range where they index), evaluates the graph with the
reference interpreter in float64 and calls the kernel. Where the constraints allow, one case
also runs with strided (non-contiguous) inputs, one with a broadcast (stride-0) input and one
with column-major (Fortran-ordered) inputs; for elementwise patterns one case mixes NaN,
+-inf, -0.0 and large magnitudes into the float inputs.

Adversarial cases (``kernels.adversarial``) then give every kernel the inputs that break the
usual mistakes, chosen from the atomic ops its reference decomposes to, so a new op or a
generated region gets them without code of its own: an exp of a max-shifted value (softmax,
log_softmax, logsumexp, attention, cross_entropy) gets rows shifted by +-1.2..2 log(FLT_MAX)
and spread by half that ("logits": a softmax without the max subtracted overflows, log of a
softmax underflows to -inf) and -inf masked positions, scattered or as left/right padding,
with one finite value per row ("masked"), and the inputs reaching it through a matmul (q, k)
get logits of that size ("scaled"); a sum of squares of x - mean(x) (layer_norm, var,
group_norm) gets rows at +-1e3..1e4 with a spread 1e3..1e4 times smaller in float32 ("offset":
one-pass E[x^2] - E[x]^2 loses every digit); a division by sqrt(a row statistic) (norms) gets
rows far below eps and constant rows ("tiny": a forgotten eps, a wrong axis); every sum or
max reduction gets a NaN, +inf or -inf in most rows ("nonfinite": nanmax, fmax); a float16
or bfloat16 sum gets large terms that cancel ("cancel": a float16 accumulator overflows); an
input reaching erfc through a negative scale (gelu) gets Phi's far tail ("tail": the textbook
x/2 (1 + erf(x / sqrt 2)) is 0 there, the reference x/2 erfc(-x / sqrt 2) is not).
Every kernel also gets rows of length 1, every size moved to the next prime (64 -> 67) and a
single element, derived from its first small case. An "offset" case allows the error a correct
float32 algorithm shows on such rows (``Case.floor``, 16 * 2**-24 * 1e4 = 1e-2), which the
one-pass variance misses by orders of magnitude (or NaN).

Checks on each call: the result is an array of the node's shape and dtype (a numpy scalar
stands for a 0-d array, as numpy returns them); it shares no memory
with an input (unless the kernel is declared ``view=True``, input 0, or ``inplace=i``, input
i); the inputs are unchanged; NaN and +-inf sit where the reference (rounded to the output
dtype) has them, or where the same graph evaluated in its own dtypes has them (an overflow
inside a fused float32 pattern); and the finite part agrees by the one error measure of the
project, the norm-wise relative error ``||got - ref|| / ||ref||``. The heap is poisoned (a
block of 0xFF bytes, NaN as floats, freed just before the call) so a kernel that leaves part
of a freshly allocated output unwritten is likely to show NaNs.

A kernel declared ``writes_out`` (see the registry) is called a second time in each case with
``out=`` a poisoned buffer (NaN for floats, 0xFF bytes otherwise) of the result's shape and
dtype: it must return that very buffer, leave its inputs alone and hold exactly what the first
call returned (NaN where it returned NaN); with column-major inputs it need only be as close
to the reference (torch rounds those 1 ulp differently into a row-major out). For an
``inplace=i`` kernel whose input i has the result's shape and dtype, a third call passes a
copy of input i both as input i and as ``out``: the same result must come back in that buffer.

Tolerance: the declared tolerance bounds the error on float32 and float64 outputs. A float16
or bfloat16 output cannot be closer to the float64 reference than its own rounding: there the
verifier allows at least 2 * unit roundoff (2**-10, 2**-7). And no output need be closer than
the pattern evaluated in its own dtypes (per-op rounding, the reference interpreter without
float64): float16 rounds after every op, and some data make a pattern ill-conditioned
(``a * b + c`` with ``a * b`` close to ``-c``). So a case passes when its error is within the
largest of the tolerance, that low-precision floor, an adversarial case's floor and twice
the own-dtype evaluation's error. A kernel that carries ``error_bound(*inputs)`` (generated
C kernels: a per-element bound, from the rounding of each op of its region, on its distance
from the float64 reference) is also allowed that bound in the same measure (``bound_error``):
where the data make the pattern cancel (exp(x) * 0.75 - 0.125 at x near log(1/6)) no
constant tolerance covers a correct kernel, and libm's last bits differ from numpy's, so twice
numpy's error does not either.

Reports are cached in memory per kernel (its name, source hash and the Kernel object, which
holds its constraints and tolerance) and seed: a kernel is verified once per process.
``seed=None`` draws fresh inputs (once).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import ml_dtypes
import numpy as np

from tensor_graphs.devices import cuda_available, gpu_fault, torch_device
from tensor_graphs.errors import (
    ArgumentError,
    KernelConstraintError,
    KernelVerificationError,
    TensorGraphsError,
)
from tensor_graphs.ir import builder as _builder
from tensor_graphs.ir import dtypes as _dtypes
from tensor_graphs.ir.algebra import ELEMENTWISE
from tensor_graphs.ir.composite import _normalize_axis_attr
from tensor_graphs.ir.evaluate import evaluate
from tensor_graphs.ir.graph import decompose, nodes
from tensor_graphs.ir.node import COMPOSITE, Node
from tensor_graphs.ir.ops import OPS
from tensor_graphs.ir.ops.names import CAST, STATE, WHERE
from tensor_graphs.kernels import adversarial, registry
from tensor_graphs.kernels import signatures as sig
from tensor_graphs.kernels.numpy.exact import atomic_graph
from tensor_graphs.kernels.signatures import Case, Spec
from tensor_graphs.numerics import relative_error
from tensor_graphs.rewrite import pattern as pat

LOW_PRECISION_BUDGET = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
BIG = {"float16": 6.0e4, "bfloat16": 1.0e30, "float32": 1.0e30, "float64": 1.0e300}


@dataclass
class CaseResult:
    case: str
    error: float
    ok: bool
    message: str = ""
    seconds: float = 0.0
    allowed: float = 0.0  # the error this case was allowed (see "Tolerance" above)


@dataclass
class VerificationReport:
    """What ``verify`` tried and found. ``shapes``: the cases run (inputs, attrs, layout);
    ``failures``: one line per failed case; ``rejected``: cases the constraints declined."""

    kernel: str
    backend: str
    tolerance: float
    ok: bool = True
    max_rel_error: float = 0.0
    shapes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    results: list[CaseResult] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    skipped: str | None = None  # why nothing ran (no device for it)
    seconds: float = 0.0
    by_dtype: dict[str, float] = field(default_factory=dict)  # max error per output dtype
    floored: float = 0.0  # max error on adversarial cases judged by their floor (Case.floor)

    def summary(self) -> str:
        if self.skipped:
            return f"{self.kernel}: not verified ({self.skipped})"
        verdict = "ok" if self.ok else "FAILED"
        low = {d: e for d, e in self.by_dtype.items() if d in LOW_PRECISION_BUDGET}
        extra = "".join(f", {d} {e:.2g}" for d, e in low.items())
        if self.floored:
            extra += f", {self.floored:.2g} on rows far from zero"
        return (f"{self.kernel}: {verdict}, max relative error {self.max_rel_error:.3g} "
                f"(tolerance {self.tolerance:g}{extra}) over {len(self.results)} cases, "
                f"{self.seconds:.2f} s")

    def __str__(self) -> str:
        lines = [self.summary()]
        lines += [f"  - {f}" for f in self.failures[:10]]
        if len(self.failures) > 10:
            lines.append(f"  ... and {len(self.failures) - 10} more failures")
        return "\n".join(lines)


_CACHE: dict[tuple, tuple[registry.Kernel, VerificationReport]] = {}


def clear_cache() -> None:
    _CACHE.clear()


def verify(kernel, strict: bool = False, seed: int | None = None) -> VerificationReport:
    """Check ``kernel`` (a Kernel or a registered name) against the float64 reference; see the
    module docstring. ``strict=True`` raises KernelVerificationError (with ``.report``)."""
    k = registry.get(kernel) if isinstance(kernel, str) else kernel
    if not isinstance(k, registry.Kernel):
        raise ArgumentError(f"verify: expected a kernel or a kernel name, got {kernel!r}")
    key = (k.name, k.source_hash, seed, id(k))  # id: the same name with other constraints
    found = _CACHE.get(key)
    if found is None:
        found = _CACHE[key] = (k, _verify(k, np.random.default_rng(seed)))  # k kept: id stays
    report = found[1]
    if strict and not report.ok:
        raise verification_error([report])
    return report


def verification_error(reports: list[VerificationReport]) -> KernelVerificationError:
    """One KernelVerificationError for failed reports (``.report``: the first, ``.reports``)."""
    parts = []
    for r in reports:
        detail = r.skipped or "; ".join(r.failures[:3]) or "no failure recorded"
        parts.append(f"kernel {r.kernel} ({r.backend}) failed verification: {detail}")
    hint = ("fix the kernel, declare a larger tolerance= if the error is expected, or narrow "
            "its constraints (dtypes=, ranks=, where=) to the inputs it handles")
    err = KernelVerificationError("\n".join(parts) + f"\n({hint})")
    err.report = reports[0]
    err.reports = list(reports)
    return err


# ---------------------------------------------------------------------------- building cases
@dataclass
class Built:
    root: Node
    leaves: dict[str, Node]  # case input name -> leaf
    bound: list[Node]  # the kernel's arguments, in order, as matched (Kernel.arguments)


def build_case(k: registry.Kernel, case: Case) -> Built | str:
    """The case's graph for the kernel's pattern, or why it does not fit (a string)."""
    leaves = {}
    for name, spec in case.specs.items():
        make = _builder.state if spec.leaf == STATE else _builder.input
        try:
            leaves[name] = make(name, spec.shape, spec.dtype)
        except TensorGraphsError as exc:
            return f"bad signature for '{name}': {exc}"
    try:
        root = instantiate(k.pattern, leaves, case.attrs)
    except TensorGraphsError as exc:
        return f"the pattern does not build: {exc}"
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        return f"the pattern does not build: {type(exc).__name__}: {exc}"
    if any(not isinstance(d, int) for d in root.shape):
        return "symbolic result shape"
    m = k.match(root)
    if m is None:
        reason = None
        try:
            bound = [leaves[v] for v in k.argument_names(_count(k, leaves))]
            reason = k.constraint_failure([b.shape for b in bound], [b.dtype for b in bound],
                                          dict(root.attrs))
        except KeyError:
            pass
        return f"rejected: {reason or 'the pattern does not match'}"
    return Built(root, leaves, k.arguments(m))


def _count(k: registry.Kernel, leaves: dict[str, Node]) -> int:
    """How many arguments a case's leaves give ``k`` (a variadic input: its elements)."""
    if k.variadic is None:
        return len(k.inputs)
    return len(k.inputs) - 1 + _elements(k.variadic, leaves)


def _elements(name: str, leaves: dict) -> int:
    count = 0
    while registry.element_name(name, count) in leaves:
        count += 1
    return count


def instantiate(p: pat.Pat, leaves: dict[str, Node], root_attrs: dict, _root: bool = True,
                like=None, _memo: dict | None = None) -> Node:
    """The graph a pattern describes: variables are ``leaves``, scalars constants of their
    siblings' dtype, ops built with their attributes (the pattern's fixed values win over
    ``root_attrs``; predicates keep the case's value, or the op's default, and are checked by
    matching; a predicate with an ``example`` gives that value: an interior op's attribute
    no case sets)."""
    if isinstance(p, pat.Var):
        if p.name not in leaves:
            raise ArgumentError(f"no input for pattern variable '{p.name}'")
        return leaves[p.name]
    if isinstance(p, pat.Const):
        return _builder.constant(p.value, p.dtype or like or _dtypes.float32)
    if not isinstance(p, pat.OpPat):
        raise ArgumentError(f"cannot build pattern {p!r}")
    if any(isinstance(c, pat.Many) for c in p.inputs):  # its elements: xs[0], xs[1], ...
        spread = []
        for c in p.inputs:
            if isinstance(c, pat.Many):
                spread += [pat.Var(registry.element_name(c.name, i))
                           for i in range(_elements(c.name, leaves))]
            else:
                spread.append(c)
        p = pat.OpPat(p.op, tuple(spread), p.attrs, p.name)
    children: list[Node | None] = [None] * len(p.inputs)
    memo = {} if _memo is None else _memo  # a sub-pattern shared in a DAG is built once
    for i, c in enumerate(p.inputs):
        if not isinstance(c, pat.Const):
            if id(c) not in memo:
                memo[id(c)] = instantiate(c, leaves, root_attrs, False, _memo=memo)
            children[i] = memo[id(c)]
    typed = children[1:] if p.op == WHERE else children  # where: not the bool condition
    dtype = next((c.dtype for c in typed if c is not None), None)
    for i, c in enumerate(p.inputs):
        if isinstance(c, pat.Const):
            children[i] = instantiate(c, leaves, root_attrs, False, dtype)
    attrs = {k: getattr(v, "example", v) for k, v in p.attrs.items()
             if not (callable(v) and not isinstance(v, _dtypes.DType))
             or hasattr(v, "example")}
    if _root:
        attrs = {**{k: v for k, v in root_attrs.items() if k not in attrs}, **attrs}
    op = OPS.get(p.op)
    if op is None:
        raise ArgumentError(f"unknown op '{p.op}' in the pattern")
    if op.kind == COMPOSITE:
        full = {k: v for k, v in op.attr_defaults.items() if k not in attrs}
        full.update(attrs)
        if "axis" in full and children:
            full["axis"] = _normalize_axis_attr(full["axis"], children[0].ndim, op.name)
        if op.optional and tuple(full.get("args", op.params)) == op.params:
            full.pop("args", None)
        missing = [k for k, v in full.items() if v is _EMPTY]
        if missing:
            raise ArgumentError(f"{op.name}: attribute(s) {missing} need a value")
        return Node.make(op, tuple(children), full)
    full = {**op.attr_defaults, **attrs}
    return Node.make(op, tuple(children), full)


_EMPTY = __import__("inspect").Parameter.empty


def kernel_cases(k: registry.Kernel) -> list[Case]:
    """Every case verify tries for ``k`` (before the constraints' verdicts)."""
    root = k.pattern
    single = isinstance(root, pat.OpPat) and not any(isinstance(i, pat.OpPat)
                                                    for i in root.inputs)
    if k.signatures is not None:
        cases = sig.from_signatures(k)
    elif single and root.op in sig.GENERATORS:
        cases = sig.op_cases(k)
    else:
        cases = []
    if not cases and isinstance(root, pat.OpPat):
        cases = sig.template_cases(k, lambda c: _or_none(build_case(k, c)))
    return cases


def _or_none(built):
    return built if isinstance(built, Built) else None


def _with_variants(k: registry.Kernel, cases: list[tuple[Case, Built]]) -> list[tuple]:
    """Add the layout variants (strided, broadcast) and special values (elementwise)."""
    out = list(cases)
    if not cases:
        return out
    main = cases[0][0].specs and next(iter(cases[0][0].specs.values())).dtype

    def pick(pred):
        for c, b in cases:
            if pred(c):
                return c, b
        return None

    def sized(c):
        total = sig._elements(c.specs.values())
        return 8 <= total <= 20000 and all(s.dtype == main or s.dtype in ("bool", "int64",
                                           "int32") for s in c.specs.values())

    if not k.contiguous:
        base = pick(lambda c: sized(c) and any(len(s.shape) >= 1 and s.shape[-1] > 1
                                               for s in c.specs.values()))
        if base is not None:
            out.append((_replace(base[0], layout="strided"), base[1]))
        base = pick(lambda c: sized(c) and any(len(s.shape) >= 1 and s.shape[0] > 1
                                               for s in c.specs.values()))
        if base is not None:
            out.append((_replace(base[0], layout="broadcast"), base[1]))
    if _is_elementwise(cases[0][1].root):
        floats = [(c, b) for c, b in cases if sized(c)
                  and any(s.dtype in sig.FLOATS for s in c.specs.values())]
        for c, b in floats[:1]:
            out.append((_replace(c, special=True), b))
        low = [(c, b) for c, b in cases if any(s.dtype == "float16" for s in c.specs.values())]
        for c, b in low[:1]:
            out.append((_replace(c, special=True), b))
    out += adversarial.cases(cases, lambda c: _or_none(build_case(k, c)),
                             lambda b: atomic_graph(b.root), k.contiguous)
    unique, seen = [], set()
    for c, b in out:  # a variant may repeat a plain case (a single element, say)
        key = (tuple(c.specs.items()), repr(sorted(b.root.attrs.items())), c.layout, c.special)
        if key not in seen:
            seen.add(key)
            unique.append((c, b))
    return unique


def _replace(c: Case, **changes) -> Case:
    return replace(c, specs=dict(c.specs), attrs=dict(c.attrs), **changes)


def _is_elementwise(root: Node) -> bool:
    """Only elementwise atomic ops (no float-to-int cast: NaN has no int value)."""
    for n in nodes(decompose(root)):
        if n.op.is_leaf:
            continue
        if n.op.name not in ELEMENTWISE:
            return False
        if n.op.name == CAST and n.dtype.is_int and n.inputs[0].dtype.is_float:
            return False
    return True


# ---------------------------------------------------------------------------- values
def draw(spec: Spec, rng: np.random.Generator, special: bool = False) -> np.ndarray:
    """Fresh random values for one input (never zeros but in adversarial kinds; see Spec)."""
    dtype = _dtypes.as_dtype(spec.dtype)
    shape = spec.shape
    if spec.values in adversarial.KINDS and dtype.is_float:
        with np.errstate(over="ignore"):
            return np.asarray(adversarial.draw(spec, rng)).astype(dtype.np_dtype)
    if dtype.is_bool:
        return np.asarray(rng.random(shape) < 0.6)
    if dtype.is_int:
        if spec.values == "index":
            v = rng.integers(0, max(spec.high, 1), shape)
        elif dtype.name == "uint8" or spec.values in ("positive", "near_one"):
            v = rng.integers(1, 10, shape)
        else:
            v = rng.integers(1, 10, shape) * rng.choice([-1, 1], shape)
        return np.asarray(v).astype(dtype.np_dtype)
    if spec.values == "ties":
        v = rng.choice([-3.0, -2.0, -1.0, 1.0, 2.0, 3.0], shape)
    elif spec.values == "halves":  # every other value a multiple of 1/2: rounding's ties
        v = np.where(rng.random(shape) < 0.5, rng.integers(-8, 9, shape) / 2.0,
                     rng.standard_normal(shape) * 4.0)
    elif spec.values == "near_one":
        v = rng.uniform(0.6, 1.4, shape) * rng.choice([-1.0, 1.0], shape)
    elif spec.values == "index":
        v = rng.integers(0, max(spec.high, 1), shape).astype(np.float64)
    else:
        v = rng.standard_normal(shape)
        v = np.where(np.abs(v) < 0.05, np.copysign(0.05, v) + v, v)
        if spec.values == "positive":
            v = np.abs(v)
        elif spec.values == "biased":
            v = v * 0.5 + 1.0
    if special and v.size:
        big = BIG[dtype.name]
        mask = rng.random(shape) < 0.25
        picks = rng.choice(np.array([np.nan, np.inf, -np.inf, big, -big, 1e4, -1e4, -0.0]),
                           shape)
        v = np.where(mask, picks, v)
    with np.errstate(over="ignore"):
        return np.asarray(v).astype(dtype.np_dtype)


def _layout(a: np.ndarray, layout: str, first: bool) -> tuple[np.ndarray, np.ndarray]:
    """(what the kernel gets, what the reference gets)."""
    if layout == "strided" and a.ndim >= 1 and a.shape[-1] > 1:
        buf = np.empty(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        buf[..., 1::2] = a  # garbage-free neighbours: the same values, shifted
        buf[..., 0::2] = a
        return buf[..., ::2], a
    if layout == "broadcast" and first and a.ndim >= 1 and a.shape[0] > 1:
        view = np.broadcast_to(a[:1], a.shape)
        return view, np.ascontiguousarray(view)
    if layout == "transposed" and first and a.ndim >= 2:
        return np.asfortranarray(a), a  # column-major: the last axis is the slow one
    return a, a


# ---------------------------------------------------------------------------- comparing
def compare(got: np.ndarray, ref: np.ndarray, alt: np.ndarray | None = None
            ) -> tuple[float, str | None]:
    """(error, problem) of ``got`` against the float64 reference ``ref``.

    NaN and +-inf must sit where ``ref`` rounded to got's dtype has them — or where ``alt``
    (the reference evaluated in the graph's own dtypes) has them: a float32 ``a * b + c`` whose
    product overflows is inf + -inf = nan in float32 but finite in float64. The finite part is
    compared by norm-wise relative error, less half a subnormal step per element (the spacing
    of got's dtype near zero)."""
    g = np.asarray(got).astype(np.float64)
    r = np.asarray(ref).astype(np.float64)
    if got.dtype.kind in "fV":
        with np.errstate(over="ignore"):
            rounded = np.asarray(ref).astype(got.dtype).astype(np.float64)
    else:
        rounded = r
    kind_g, kind_r = _classes(g), _classes(rounded)
    bad = kind_g != kind_r
    if alt is not None:
        bad &= kind_g != _classes(np.asarray(alt).astype(np.float64))
    if bad.any():
        i = _first(bad)
        what = "nan" if np.isnan(g[i]) or np.isnan(r[i]) else "inf"
        return np.inf, f"{what} mismatch at index {i}: got {g[i]!r}, reference {r[i]!r}"
    fin = (kind_g == 0) & (kind_r == 0)
    gf, rf = g[fin], r[fin]
    if gf.size == 0:
        return 0.0, None
    scale = np.max(np.abs(rf))
    if scale == 0:
        diff = np.max(np.abs(gf))
        return (0.0 if diff == 0 else np.inf), None
    err = relative_error(gf / scale, rf / scale)  # scaled: no overflow at 1e300
    if err > 0 and got.dtype.kind in "fV":  # subnormals carry less precision: half a step off
        floor = 0.5 * float(ml_dtypes.finfo(got.dtype).smallest_subnormal) * np.sqrt(gf.size)
        err = max(0.0, err - floor / scale / float(np.linalg.norm(rf / scale)))
    return err, None


def bound_error(bound: np.ndarray, got: np.ndarray, ref: np.ndarray) -> float:
    """The error measure of ``compare`` that a per-element bound on |got - ref| guarantees:
    ``||bound|| / ||ref||`` over the elements both hold finite (0 when that is not finite,
    so an unbounded element excuses nothing)."""
    g = np.asarray(got).astype(np.float64)
    r = np.asarray(ref).astype(np.float64)
    fin = np.isfinite(g) & np.isfinite(r)
    rf = r[fin]
    scale = float(np.max(np.abs(rf))) if rf.size else 0.0
    if scale == 0:
        return 0.0
    b = np.broadcast_to(np.asarray(bound, np.float64), r.shape)[fin]
    with np.errstate(all="ignore"):
        figure = float(np.linalg.norm(b / scale) / np.linalg.norm(rf / scale))
    return figure if math.isfinite(figure) else 0.0


def _classes(a: np.ndarray) -> np.ndarray:
    """0 finite, 1 nan, 2 +inf, 3 -inf."""
    out = np.zeros(a.shape, np.int8)
    out[np.isnan(a)] = 1
    out[a == np.inf] = 2
    out[a == -np.inf] = 3
    return out


def _first(mask: np.ndarray):
    idx = np.argwhere(mask)[0]
    return tuple(int(i) for i in idx)


def _worst(got: np.ndarray, ref: np.ndarray) -> str:
    g, r = got.astype(np.float64), ref.astype(np.float64)
    with np.errstate(invalid="ignore"):
        d = np.where(np.isfinite(g) & np.isfinite(r), np.abs(g - r), 0.0)
    if d.size == 0:
        return ""
    i = np.unravel_index(int(np.argmax(d)), d.shape)
    return f" (largest difference at index {tuple(map(int, i))}: got {g[i]:.9g}, " \
           f"reference {r[i]:.9g})"


def budget(k: registry.Kernel, dtype: np.dtype) -> float:
    low = LOW_PRECISION_BUDGET.get(_dtypes.from_numpy(dtype).name, 0.0) \
        if _dtypes.from_numpy(dtype) is not None else 0.0
    return max(k.tolerance, low)


# ---------------------------------------------------------------------------- running
class _NoDeviceError(Exception):
    """The kernel's device is not on this machine: it cannot be verified here."""


def _placement(k: registry.Kernel) -> tuple[str, str]:
    """(where the kernel's inputs live, where its result lives): copies move between them."""
    try:
        from tensor_graphs.kernels.copy import placement
    except ImportError:  # pragma: no cover - copy is part of the package
        return k.device, k.device
    return placement(k)


def _device_io(k: registry.Kernel):
    """(move an input to where the kernel reads it, bring a result back to numpy, call)."""
    source, target = (_kind(d) for d in _placement(k))
    if "cuda" not in (source, target):
        return (lambda a: a), _to_numpy, lambda args, attrs: k(*args, **attrs)
    try:
        from tensor_graphs.kernels.torch import convert
    except ImportError as exc:
        raise _NoDeviceError(f"{k.device} kernels need torch ({exc})") from None
    if not cuda_available():
        raise _NoDeviceError("no CUDA device on this machine")

    def to_device(a):
        return convert.to_cuda(a, torch_device("cuda")) if source == "cuda" else a

    def call(args, attrs):  # Kernel.__call__ checks numpy dtypes: check, then call fn
        reason = k.constraint_failure([tuple(a.shape) for a in args],
                                      [convert.dtype_of(a) for a in args], attrs)
        if reason is not None:
            raise KernelConstraintError(f"kernel {k.name} ({k.backend}): {reason}")
        return k.fn(*args, **{n: v for n, v in attrs.items() if n in k.attrs})

    return to_device, _to_numpy, call


def _kind(device) -> str:
    return str(device).partition(":")[0]


def _to_numpy(value):
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.startswith("torch"):
        from tensor_graphs.kernels.torch import convert

        return convert.to_host(value)
    return value


def _poison(nbytes: int) -> None:
    if nbytes > 0:
        block = np.empty(nbytes, np.uint8)
        block.fill(0xFF)
        del block


def _verify(k: registry.Kernel, rng: np.random.Generator) -> VerificationReport:
    start = time.perf_counter()
    report = VerificationReport(k.name, k.backend, k.tolerance)
    try:
        io = _device_io(k)
    except _NoDeviceError as exc:
        report.ok, report.skipped = False, str(exc)
        return report
    try:
        raw = kernel_cases(k)
    except TensorGraphsError as exc:
        report.ok = False
        report.failures.append(f"cannot make inputs for it: {exc}")
        return report
    built, seen = [], set()
    for case in raw:
        b = build_case(k, case)
        if isinstance(b, str):
            report.rejected.append(f"{case.describe()}: {b}")
            continue
        key = (case.describe(), tuple(sorted((n, repr(v)) for n, v in b.root.attrs.items())))
        if key in seen:
            continue
        seen.add(key)
        built.append((case, b))
    if not built:
        report.ok = False
        shown = "; ".join(report.rejected[:3]) or "no signatures"
        report.failures.append(
            f"no case fits the kernel's pattern and constraints ({len(raw)} tried: {shown}); "
            "give the kernel signatures=[{input: shape, ...}] to say what it accepts")
        report.seconds = time.perf_counter() - start
        return report
    for case, b in _with_variants(k, built):
        result = _run_case(k, case, b, rng, *io)
        if result is None:
            report.rejected.append(f"{case.describe()}: the reference is undefined there")
            continue
        report.results.append(result)
        report.shapes.append(result.case)
        out = b.root.dtype.name
        if case.floor > 0:  # its own allowance: the error says how far from zero its rows are
            report.floored = max(report.floored, result.error)
        else:
            report.by_dtype[out] = max(report.by_dtype.get(out, 0.0), result.error)
        if not result.ok:
            report.ok = False
            report.failures.append(f"{result.case}: {result.message}")
    judged = [e for d, e in report.by_dtype.items() if d not in LOW_PRECISION_BUDGET]
    report.max_rel_error = max(judged or report.by_dtype.values() or [report.floored])
    report.seconds = time.perf_counter() - start
    return report


def _run_case(k, case: Case, b: Built, rng, to_device, from_device, call
              ) -> CaseResult | None:
    """The verdict on one case; None when a shape variant has no reference (a slice whose
    bounds the new sizes pass)."""
    label = case.describe()
    values, feeds = {}, {}
    first = True
    names = k.argument_names(len(b.bound))
    writes = {names[k.inplace]} if k.inplace is not None else set()
    for name, spec in case.specs.items():
        raw = draw(spec, rng, case.special)
        given, fed = _layout(raw, case.layout, first and name not in writes)
        if case.layout == "broadcast" and given is not raw:
            first = False
        values[name], feeds[name] = given, fed
    by_leaf = {id(leaf): name for name, leaf in b.leaves.items()}
    try:
        ref = evaluate(atomic_graph(b.root), feeds, dtype="float64")
        inputs = []
        for node in b.bound:
            name = by_leaf.get(id(node))
            inputs.append(values[name] if name is not None else
                          evaluate(node, {n: feeds[n] for n in feeds}))
    except TensorGraphsError as exc:
        if case.adversarial in adversarial.SHAPES:  # sizes an attribute also names: n/a
            return None
        return CaseResult(label, np.inf, False, f"the reference failed: {exc}")
    attrs = dict(b.root.attrs)
    saved = [np.array(a, copy=True) for a in inputs]
    shape = tuple(b.root.shape)
    want = b.root.dtype.np_dtype
    args = [to_device(a) for a in inputs]
    _poison(int(np.prod(shape, dtype=np.int64)) * want.itemsize)
    t0 = time.perf_counter()
    try:
        with np.errstate(all="ignore"):
            got = call(args, attrs)
    except Exception as exc:  # noqa: BLE001 - any failure of the kernel is a finding
        _raise_gpu_fault(exc, k, label)
        return CaseResult(label, np.inf, False, f"raised {type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - t0
    try:
        got = from_device(got)
    except Exception as exc:  # noqa: BLE001 - the GPU's own errors surface where it is waited for
        _raise_gpu_fault(exc, k, label)
        raise
    if isinstance(got, np.generic) and shape == ():  # numpy's 0-d results are scalars
        got = np.asarray(got)
    if not isinstance(got, np.ndarray):
        return CaseResult(label, np.inf, False,
                          f"returned {type(got).__name__}, not a numpy array")
    if got.shape != shape:
        return CaseResult(label, np.inf, False,
                          f"returned shape {got.shape}, expected {shape}")
    if got.dtype != want:
        return CaseResult(label, np.inf, False,
                          f"returned dtype {got.dtype}, expected {want}")
    for i, a in enumerate(inputs):
        if (k.view and i == 0) or k.inplace == i:
            continue
        if _shares(got, a):
            return CaseResult(label, np.inf, False,
                              f"the result shares memory with input '{names[i]}'; return a "
                              "new array (or declare view=True / inplace=)")
    for i, (a, s) in enumerate(zip(inputs, saved)):
        if k.inplace != i and not _same_bytes(a, s):
            return CaseResult(label, np.inf, False, f"modified its input '{names[i]}'")
    native = None

    def own_dtypes():  # the reference evaluated in the graph's own dtypes (no float64)
        nonlocal native
        if native is None:
            try:
                native = np.asarray(evaluate(atomic_graph(b.root), feeds))
            except TensorGraphsError:
                native = ref
        return native

    err, problem = compare(got, ref)
    if problem is not None and got.dtype.kind in "fV":
        err, problem = compare(got, ref, own_dtypes())
    if problem is not None:
        return CaseResult(label, err, False, problem, seconds)
    allowed = max(budget(k, got.dtype), case.floor)  # floor: adversarial data's own
    if got.dtype.kind in "fV" and not err <= allowed:
        # as far off as the graph evaluated in its own dtypes is allowed (twice): float16
        # rounding, or data that make the pattern ill-conditioned (a*b + c with a*b ~ -c)
        allowed = max(allowed, 2.0 * compare(own_dtypes(), ref)[0])
    bound = getattr(k, "error_bound", None)  # a kernel's own rounding bound (generated C)
    if bound is not None and got.dtype.kind in "fV" and not err <= allowed:
        allowed = max(allowed, bound_error(bound(*inputs), got, ref))
    if not err <= allowed:
        return CaseResult(label, err, False, f"relative error {err:.3g} > tolerance "
                          f"{allowed:.3g}{_worst(got, ref)}", seconds, allowed)
    if k.writes_out and "cuda" not in {_kind(d) for d in _placement(k)}:  # out: numpy
        close = None
        if case.layout == "transposed":  # torch rounds column-major inputs differently into
            def close(buf):  # a row-major out (1 ulp): there out need only be as accurate
                e, p = compare(buf, ref)
                if p is not None and buf.dtype.kind in "fV":
                    e, p = compare(buf, ref, own_dtypes())
                return p or (None if e <= allowed else f"relative error {e:.3g} > {allowed:.3g}")
        problem = _check_out(k, call, args, attrs, inputs, saved, got, names, close)
        if problem is not None:
            return CaseResult(label, err, False, problem, seconds, allowed)
    return CaseResult(label, err, True, "", seconds, allowed)


def _raise_gpu_fault(exc: Exception, k: registry.Kernel, case: str) -> None:
    """A GPU fault is raised, never a finding: it says nothing of this kernel's correctness
    (``devices.gpu_fault``), and verification outcomes are filed for good."""
    fault = gpu_fault(exc, f"verifying kernel {k.name} ({case})")
    if fault is not None:
        raise fault from exc


def poisoned(shape: tuple, dtype: np.dtype) -> np.ndarray:
    """A C-contiguous buffer of garbage: NaN for floats, 0xFF bytes otherwise."""
    buf = np.empty(shape, dtype)
    if dtype.kind in "fc" or dtype == _dtypes.bfloat16.np_dtype:
        buf.fill(np.nan)
    else:
        buf.reshape(-1).view(np.uint8).fill(0xFF)
    return buf


def _check_out(k, call, args, attrs, inputs, saved, want: np.ndarray, names,
               close=None) -> str | None:
    """Why the ``out=`` calls of a ``writes_out`` kernel break the contract, or None.
    ``close(out)``: instead of the same values as the call without out, a verdict on out."""
    trials = [("out=<poisoned buffer>", list(args), poisoned(want.shape, want.dtype))]
    i = k.inplace
    if i is not None and i < len(inputs) and isinstance(inputs[i], np.ndarray) \
            and inputs[i].shape == want.shape and inputs[i].dtype == want.dtype:
        buf = np.array(inputs[i], order="C", copy=True)
        trial_args = list(args)
        trial_args[i] = buf
        trials.append((f"out=<a copy of input '{names[i]}'> passed as that input", trial_args,
                       buf))
    for what, trial_args, buf in trials:
        try:
            with np.errstate(all="ignore"):
                got = call(trial_args, {**attrs, "out": buf})
        except Exception as exc:  # noqa: BLE001 - any failure of the kernel is a finding
            _raise_gpu_fault(exc, k, what)
            return f"with {what}: raised {type(exc).__name__}: {exc}"
        if got is not buf:
            kind = type(got).__name__
            return (f"with {what}: returned a different {kind} (writes_out kernels must "
                    "write into out and return out itself)")
        for j, (a, s) in enumerate(zip(inputs, saved)):
            if trial_args[j] is a and not _same_bytes(a, s):
                return f"with {what}: modified its input '{names[j]}'"
        if close is not None:
            problem = close(buf)
            if problem is not None:
                return f"with {what}: {problem}"
        elif not _identical(buf, want):
            bad = _first(~_equal_mask(buf, want)) if buf.ndim else ()
            return (f"with {what}: out holds other values than the call without out "
                    f"returned (first at index {bad}: {buf[bad]!r} instead of {want[bad]!r})")
    return None


def _equal_mask(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "fcV" or a.dtype == _dtypes.bfloat16.np_dtype:
        x, y = a.astype(np.float64), b.astype(np.float64)
        return (x == y) | (np.isnan(x) & np.isnan(y))
    return np.asarray(a == b)


def _identical(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.all(_equal_mask(a, b)))


def _shares(a: np.ndarray, b: np.ndarray) -> bool:
    try:
        return bool(np.shares_memory(a, b, max_work=10_000))
    except np.exceptions.TooHardError:
        return bool(np.may_share_memory(a, b))


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
