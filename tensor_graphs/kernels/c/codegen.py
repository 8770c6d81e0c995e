"""Generated C: one loop for any elementwise subgraph, compiled, verified and registered on demand.

    region = elementwise_region(root)      # the maximal elementwise subgraph rooted at a node
    k = fuse_elementwise(root)             # emit C, compile, check, register: a Kernel
    y = k(*arrays)                         # one array per region.inputs, numpy broadcasting

A *region* is the largest set of elementwise atomic ops (neg exp log sqrt reciprocal sin erf
erfc log1p expm1 add mul maximum pow equal less where cast: ``RENDERED``) reachable from the
root through inputs, stopping at leaves, at non-elementwise ops (matmul, reductions, movement)
and at nodes of a dtype the generator has no C type for (float16, bfloat16: not generated).
What it stops at becomes a kernel input, except 0-d constants (Python scalars in the graph),
which are inlined as C literals. Nodes used outside the region are recomputed inside it (pass
``uses=`` to make shared nodes inputs instead). A composite root is decomposed first.

The emitted C is shape-generic: one function per region *structure* and dtypes, called with
the output shape and per-input strides in elements (0 on broadcast axes) that Python derives
from numpy's broadcasting of the actual arguments, after merging axes that are contiguous for
every operand. The loop runs over tiles of at most TILE elements of the innermost axis
(OpenMP-parallel from PARALLEL_MIN elements, on the C kernels' team ``tg_team``: the thread
setting, or the calling thread alone while the cores are oversubscribed); an input whose
innermost stride is not 1 (broadcast or strided) is first gathered into a per-tile buffer, so
the loop body reads unit-stride arrays and vectorises. Each op is one C statement on locals;
the output is written once, contiguous. On x86-64 with GCC and glibc, exp/log/sin/erf/erfc/pow/
log1p/expm1 are declared ``simd`` so the loop calls libmvec's vector versions (what math.h does
only under -ffast-math; NaN and inf stay IEEE, accuracy a few ULP, measured by the checks). A
transcendental the loop cannot call as a vector function keeps the whole loop scalar, and one op
the renderer lacks cuts the region in two with a step between (softplus's log1p did both: Mish
ran as four steps, no faster than the unfused plan).

Semantics follow numpy (the reference) exactly where it matters:
- ``maximum`` propagates NaN (``a > b || a != a ? a : b``, numpy's own choice of operand on
  ties, so ``maximum(-0.0, 0.0)`` is ``0.0`` as in numpy); ``fmax`` does not and is not used.
- comparisons with NaN are false (C's own rule); ``where`` is ``c ? a : b``.
- signed integer add/mul/neg wrap around modulo 2**bits (computed in the unsigned type: no
  undefined behaviour); integer ``pow`` is square-and-multiply modulo 2**bits, and a negative
  exponent raises ``EvaluationError`` as the reference does.
- float ``pow`` with an inlined exponent of 0.5, 2 or -1 is sqrt, x*x and 1/x, as numpy
  computes a scalar exponent (``pow(-inf, 0.5)`` is nan there, inf in C).
- ``cast`` float -> int truncates toward zero; NaN, inf and out-of-range values give what
  numpy gives on x86-64 (INT_MIN of the 32-bit conversion for int32/int8/uint8 — whose low 8
  bits are kept — and of the 64-bit conversion for int64), on every platform, never C's
  undefined behaviour. int -> int narrows modulo 2**bits; anything -> bool is ``x != 0`` (NaN is
  true); bool -> anything is 0/1.
- float32 ops use the float32 C functions (expf, logf, sqrtf, sinf, erff, powf, log1pf); float32
  constants are rounded to float32 once, as ``tg.evaluate`` does without ``dtype="float64"``.
- never -ffast-math; ``-ffp-contract=off`` (no fused multiply-add may change a rounding, an
  overflow to inf or a NaN), and ``-ftrapping-math`` for regions with a float -> int cast (see
  FLOAT_TO_INT_FLAGS).
Results therefore agree with the float32 (or float64) numpy evaluation of the same graph bit for
bit except where the transcendental functions round differently from numpy's (a few ULP).

``fuse_elementwise`` checks every kernel before registering it: ``check_kernel`` (three
references, exact where exactness is possible; it sets the declared tolerance) and then the
project's ``tg.kernels.verify(strict=True)``. Both also accept an error within
``rounding_bound`` (the kernel's ``error_bound``): where the data make a region cancel, no
constant tolerance covers a correct kernel. Kernels are kept per structural digest of the
region and per C source (one structure at several shapes is one kernel and one library).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import math
import platform
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import sympy

from tensor_graphs import threads
from tensor_graphs.errors import (
    ArgumentError,
    EvaluationError,
    KernelConstraintError,
    KernelVerificationError,
    ShapeError,
)
from tensor_graphs.ir import dtypes as _dt
from tensor_graphs.ir.algebra import ASSOCIATIVE_COMMUTATIVE, ELEMENTWISE
from tensor_graphs.ir.dtypes import DType
from tensor_graphs.ir.graph import decompose
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import (
    ADD,
    CAST,
    CONSTANT,
    EQUAL,
    ERF,
    ERFC,
    EXP,
    EXPM1,
    LESS,
    LOG,
    LOG1P,
    MAXIMUM,
    MUL,
    NEG,
    POW,
    RECIPROCAL,
    ROUND_HALF_EVEN,
    SIN,
    SQRT,
    WHERE,
)
from tensor_graphs.ir.shapes import broadcast_shapes, dims_equal
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import lib as _clib
from tensor_graphs.rewrite import pattern as pat

TRANSCENDENTAL = frozenset({EXP, LOG, SIN, ERF, ERFC, POW, LOG1P, EXPM1})  # glibc: ULPs off
# what this renderer computes: the elementwise atomic ops, and of the special functions those
# glibc computes as vector functions too (softplus, log_sigmoid and asinh decompose to log1p;
# without it a Mish region stopped there and ran as four steps), and rounding half to even
# (C's rint, exact: a quantize's round, in the loop that divides by the scale and clamps)
RENDERED = ELEMENTWISE | {LOG1P, EXPM1, ROUND_HALF_EVEN}

# dtype -> (C type, unsigned C type of the same width for wrap-around arithmetic)
C_TYPES: dict[str, tuple[str, str]] = {
    "bool": ("uint8_t", "uint8_t"),
    "uint8": ("uint8_t", "uint8_t"),
    "int8": ("int8_t", "uint8_t"),
    "int32": ("int32_t", "uint32_t"),
    "int64": ("int64_t", "uint64_t"),
    "float32": ("float", "float"),
    "float64": ("double", "double"),
}
SUPPORTED_DTYPES = tuple(_dt.BY_NAME[n] for n in C_TYPES)  # float16/bfloat16: no C type here

COMMON_HEADER = Path(__file__).with_name("tg_common.h")  # inlined: the source hash covers it
TILE = 1024  # elements of the innermost axis per tile (and per gather buffer)
PARALLEL_MIN = 1 << 16  # OpenMP splits the tiles across threads from this many elements
EXTRA_FLAGS = ("-ffp-contract=off",)  # no FMA contraction: roundings and overflows as numpy's
# GCC only (flags_for): a ``where`` is C's ?:, which GCC turns into a branch; where two selects
# test one condition (tanh's sign: abs(x) first, the sign of the result last) jump threading
# copied everything between them into both arms, and the vectoriser, computing both arms of
# every select, ran the copies too: two expf and two divisions per tanh, one more expf and
# division per Mish (GCC 12; (16, 1024) float32 Mish 24.6 -> 19.8 us, tanh 7.5 -> 3.7 us).
GCC_FLAGS = ("-fno-thread-jumps",)
# build.py compiles with -fno-trapping-math (it lets GCC vectorise selects), under which GCC
# rewrites (float)(int)x as trunc(x): -0.0 instead of +0.0 for x in (-1, 0), so 1/that is -inf.
# Regions that cast float -> int are compiled with -ftrapping-math instead (slower selects).
FLOAT_TO_INT_FLAGS = ("-ftrapping-math",)
# GCC ignores the block-scope restrict pointers and versions the element loop on a run-time
# overlap check: an output 4 to 60 bytes past an input took a scalar copy of the loop, and
# scalar logf/expf round differently from libmvec's, so a result's bits depended on where the
# allocator put the output. ivdep drops the check: by the writes_out contract (registry) an
# output never overlaps an input.
IVDEP = ("#if defined(__GNUC__) && !defined(__clang__)", "        #pragma GCC ivdep", "#endif")
FLOAT_TOLERANCE = {"float32": 1e-6, "float64": 1e-12}  # floors of the declared tolerance
EXACT_TOLERANCE = 1e-12  # int and bool outputs: checked exactly; the registry wants a number > 0


# ---------------------------------------------------------------------------- regions
@dataclass(frozen=True, eq=False)
class Region:
    """An elementwise subgraph: ``nodes`` in topological order (``root`` last), ``inputs`` in
    kernel-argument order, ``constants`` inlined as literals. Unpacks as ``nodes, inputs``."""

    root: Node
    nodes: tuple[Node, ...]
    inputs: tuple[Node, ...]
    constants: tuple[Node, ...] = ()

    def __iter__(self):
        return iter((self.nodes, self.inputs))

    @property
    def ops(self) -> dict[str, int]:
        """How many nodes of each op the region has."""
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op.name] = counts.get(n.op.name, 0) + 1
        return dict(sorted(counts.items()))


def fusable(node: Node) -> bool:
    """An elementwise atomic op whose dtype and operand dtypes have a C type here."""
    return (node.op.name in RENDERED and node.dtype in SUPPORTED_DTYPES
            and all(i.dtype in SUPPORTED_DTYPES for i in node.inputs))


def uniform_value(node: Node):
    """The one value every element of a constant node has in its own dtype (None otherwise)."""
    if node.op.name != CONSTANT or node.dtype not in SUPPORTED_DTYPES:
        return None
    arr = np.asarray(node.attrs["value"].array).astype(node.dtype.np_dtype)
    if arr.size == 0:
        return None
    first = arr.flat[0]
    if arr.dtype.kind == "f":
        if np.isnan(first):
            return first if bool(np.isnan(arr).all()) else None
        same = (arr == first) & (np.signbit(arr) == np.signbit(first))
        return first if bool(same.all()) else None
    return first if bool((arr == first).all()) else None


def inlinable(node: Node) -> bool:
    """A 0-d constant of a supported dtype (what the builder makes of Python scalars): it
    becomes a C literal and a ``pat.Const`` of its stored value. Larger constants, even
    uniform ones, are kernel inputs (their shape takes part in broadcasting)."""
    return node.op.name == CONSTANT and node.ndim == 0 and node.dtype in SUPPORTED_DTYPES


def elementwise_region(root: Node, inputs: Sequence[Node] | None = None, *,
                       uses: Mapping[Node, int] | None = None,
                       decompose_composites: bool = True,
                       fusable: Callable[[Node], bool] = fusable,
                       inlinable: Callable[[Node], bool] = inlinable) -> Region:
    """The maximal elementwise subgraph rooted at ``root``.

    It stops at leaves, non-elementwise ops and unsupported dtypes, and at ``inputs`` when
    given (explicit boundaries), and with ``uses`` (use counts of the whole graph) at nodes with
    more than one user. A composite root is decomposed first (``decompose_composites``); the
    region's inputs are then nodes of the decomposed graph. ``fusable`` and ``inlinable`` say
    which nodes another backend renders (Triton's: float16 too) and which constants it inlines.
    """
    if not isinstance(root, Node):
        raise ArgumentError(f"elementwise_region: expected a graph node, got "
                            f"{type(root).__name__}")
    if decompose_composites and not (root.op.is_atomic or root.op.is_leaf):
        root = decompose(root)
    if not fusable(root):
        why = (f"its dtype {root.dtype.name} has no C type here" if root.op.name in RENDERED
               else "it is not an elementwise atomic op")
        raise ArgumentError(f"elementwise_region: cannot fuse at {root.op.name} "
                            f"{tuple(root.shape)} {root.dtype.name}: {why} (elementwise ops: "
                            f"{', '.join(sorted(RENDERED))})")
    stop = set(inputs or ())

    def inside(n: Node) -> bool:
        if n is root:
            return True
        if n in stop or not fusable(n):
            return False
        return uses is None or uses.get(n, 1) <= 1

    order: list[Node] = []
    boundary: list[Node] = []
    seen: set[Node] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:  # iterative post-order: inputs before users, first-use order for boundaries
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if n in seen:
            continue
        seen.add(n)
        if not inside(n):
            boundary.append(n)
            continue
        stack.append((n, True))
        stack.extend((i, False) for i in reversed(n.inputs) if i not in seen)
    consts = tuple(n for n in boundary if n not in stop and inlinable(n))
    ins = tuple(n for n in boundary if n not in consts)
    if inputs is not None:  # explicit inputs keep the caller's order (those the region reaches)
        reached = set(ins)
        ins = tuple(n for n in inputs if n in reached) + tuple(n for n in ins if n not in stop)
    return Region(root, tuple(order), ins, consts)


# ---------------------------------------------------------------------------- C emission
def _ctype(d: DType) -> str:
    return C_TYPES[d.name][0]


def _utype(d: DType) -> str:
    return C_TYPES[d.name][1]


def c_literal(value, d: DType) -> str:
    """A C expression of type ``d`` with exactly this value."""
    ct = _ctype(d)
    if d.is_float:
        v = float(value)
        suffix = "f" if d.name == "float32" else ""
        if math.isnan(v):
            return f"(({ct})NAN)"
        if math.isinf(v):
            return f"(({ct})INFINITY)" if v > 0 else f"(-({ct})INFINITY)"
        return f"({v.hex()}{suffix})"
    if d.is_bool:
        return f"(({ct}){int(bool(value))})"
    v = int(value)
    if d.name == "int64" and v == -(2 ** 63):
        return "((int64_t)(-9223372036854775807LL - 1))"
    if d.name == "int32" and v == -(2 ** 31):
        return "((int32_t)(-2147483647 - 1))"
    return f"(({ct}){v}{'LL' if d.name == 'int64' else ''})"


_UNARY_C = {EXP: "exp", LOG: "log", SQRT: "sqrt", SIN: "sin", ERF: "erf", ERFC: "erfc",
            LOG1P: "log1p", EXPM1: "expm1", ROUND_HALF_EVEN: "rint"}

# ---------------------------------------------------------------------------- vector math
VECTOR_MATH = True  # use glibc's libmvec (SIMD exp/log/sin/erf/pow) where it links and loads
_VECTOR_BASES = ("exp", "log", "sin", "erf", "erfc", "pow", "log1p", "expm1")  # log1p, expm1:
# glibc >= 2.35; where the probe finds none, those loops stay scalar (and correct)
_VECTOR_CANDIDATES = {  # C name: (base function, C type, arity)
    **{b + "f": (b, "float", 1 + (b == "pow")) for b in _VECTOR_BASES},
    **{b: (b, "double", 1 + (b == "pow")) for b in _VECTOR_BASES}}
_vector_found: frozenset[str] | None = None


def _simd_decl(fn: str) -> str:
    _, ct, arity = _VECTOR_CANDIDATES[fn]
    args = ", ".join([ct] * arity)
    return f'__attribute__((__simd__("notinbranch"))) extern {ct} {fn}({args});'


def vector_math_functions() -> frozenset[str]:
    """The libm functions whose libmvec SIMD variants build, load and agree with numpy here
    (x86-64 glibc with GCC; empty elsewhere). Declaring them ``simd`` lets GCC vectorise a
    loop that calls them — what glibc's math.h does only under -ffast-math. libmvec keeps
    IEEE special values (NaN, inf) and is within a few ULP; the verification measures it."""
    global _vector_found
    if _vector_found is not None:
        return _vector_found
    found: set[str] = set()
    if VECTOR_MATH and platform.machine() in ("x86_64", "AMD64") and _is_gcc():
        for fn in _VECTOR_CANDIDATES:
            if _probe_vector(fn):
                found.add(fn)
    _vector_found = frozenset(found)
    return _vector_found


def _probe_vector(fn: str) -> bool:
    from tensor_graphs.errors import CCompileError
    from tensor_graphs.kernels.c.build import load_library

    base, ct, arity = _VECTOR_CANDIDATES[fn]
    binary = arity == 2
    src = "\n".join([
        "#include <math.h>", _simd_decl(fn),
        f"void tg_probe(const {ct} *restrict a, {ct} *restrict o, long n) {{",
        f"    for (long i = 0; i < n; i++) o[i] = {fn}(a[i]{', a[i]' if binary else ''});",
        "}", ""])
    try:
        lib = load_library(f"tg_mvec_probe_{fn}", src, ("-lmvec",))
    except (CCompileError, OSError):
        return False
    np_t = np.float32 if ct == "float" else np.float64
    a = np.linspace(0.1, 3.0, 64).astype(np_t)
    a[:3] = (np.nan, np.inf, 1.0)
    o = np.empty_like(a)
    f = lib.tg_probe
    f.restype = None
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    f(a.ctypes.data, o.ctypes.data, a.size)
    wide = a.astype(np.float64)
    with np.errstate(all="ignore"):
        ref = {"exp": np.exp, "log": np.log, "sin": np.sin, "pow": lambda v: np.power(v, v),
               "log1p": np.log1p, "expm1": np.expm1,
               "erf": np.vectorize(math.erf, otypes=[np.float64]),
               "erfc": np.vectorize(math.erfc, otypes=[np.float64])}[base](wide)
        close = np.isclose(o.astype(np.float64), ref, rtol=1e-5, equal_nan=True)
    return bool(close.all())


def _expr(n: Node, args: list[str], helpers: set[str],
          consts: Mapping[Node, object] | None = None) -> str:
    """The C expression of one op over its operands' C expressions (``consts``: the values
    of inlined constants)."""
    name, t = n.op.name, n.dtype
    src = n.inputs[0].dtype
    ct, ut = _ctype(t), _utype(t)
    if name == CAST:
        return _cast_expr(args[0], src, t, helpers)
    if name == WHERE:
        return f"({args[0]} ? {args[1]} : {args[2]})"
    if name in (EQUAL, LESS):
        return f"(({ct})({args[0]} {'==' if name == EQUAL else '<'} {args[1]}))"
    a = args[0]
    if name in _UNARY_C:
        fn = _UNARY_C[name] + ("f" if t.name == "float32" else "")
        return f"{fn}({a})"
    if name == RECIPROCAL:
        return f"({'1.0f' if t.name == 'float32' else '1.0'} / {a})"
    if name == NEG:
        return f"(-{a})" if t.is_float else f"(({ct})({ut})(0u - ({ut}){a}))"
    b = args[1]
    if name in (ADD, MUL):
        if t.is_bool:
            return f"({a} {'|' if name == ADD else '&'} {b})"
        if t.is_float:
            return f"({a} {'+' if name == ADD else '*'} {b})"
        return f"(({ct})({ut})(({ut}){a} {'+' if name == ADD else '*'} ({ut}){b}))"
    if name == MAXIMUM:
        if t.is_float:  # numpy: NaN in either operand gives NaN; on ties b (as np.maximum)
            return f"(({a} > {b} || {a} != {a}) ? {a} : {b})"
        return f"({a} > {b} ? {a} : {b})"
    if name == POW:
        if t.is_float:
            e = (consts or {}).get(n.inputs[1])
            if e is not None and float(e) in _POW_AS:  # numpy's scalar-exponent fast paths
                return _POW_AS[float(e)](a, t)
            return f"{'powf' if t.name == 'float32' else 'pow'}({a}, {b})"
        helpers.add("ipow")
        return f"(({ct})({ut})tg_ipow((uint64_t)(int64_t){a}, {b} < 0 ? 0u : (uint64_t){b}))"
    raise ArgumentError(f"codegen: no C for op {name}")  # pragma: no cover - RENDERED guards


# numpy computes power with a scalar exponent of 0.5, 2 or -1 as sqrt, square, reciprocal:
# pow(-inf, 0.5) is then nan (C's pow gives inf) and pow(-0.0, 0.5) is -0.0 (C: +0.0).
_POW_AS = {
    0.5: lambda a, t: f"sqrt{'f' if t.name == 'float32' else ''}({a})",
    2.0: lambda a, t: f"({a} * {a})",
    -1.0: lambda a, t: f"({'1.0f' if t.name == 'float32' else '1.0'} / {a})",
}


def _cast_expr(a: str, src: DType, dst: DType, helpers: set[str]) -> str:
    ct, ut = _ctype(dst), _utype(dst)
    if dst.is_bool:
        return f"(({ct})({a} != 0))"
    if src.is_bool or dst.is_float:
        return f"(({ct}){a})"
    if src.is_float:  # float -> int: truncation, x86-64 numpy's value when out of range
        if dst.name == "int64":
            helpers.add("f2i64")
            return f"tg_f2i64((double){a})"
        helpers.add("f2i32")
        if dst.name == "int32":
            return f"tg_f2i32((double){a})"
        return f"(({ct})({ut})(uint32_t)tg_f2i32((double){a}))"
    return f"(({ct})({ut}){a})"  # int -> int: modulo 2**bits


_HELPERS = {
    "f2i32": """static inline int32_t tg_f2i32(double x) {
    /* truncation toward zero; NaN/inf/out of range -> INT32_MIN (x86 cvttsd2si, numpy) */
    return (x > -2147483649.0 && x < 2147483648.0) ? (int32_t)x : (int32_t)(-2147483647 - 1);
}""",
    "f2i64": """static inline int64_t tg_f2i64(double x) {
    return (x >= -9223372036854775808.0 && x < 9223372036854775808.0)
        ? (int64_t)x : (int64_t)(-9223372036854775807LL - 1);
}""",
    "ipow": """static inline uint64_t tg_ipow(uint64_t base, uint64_t e) {
    uint64_t r = 1;  /* modulo 2**64, hence modulo 2**bits of every narrower type */
    while (e) { if (e & 1u) r *= base; base *= base; e >>= 1; }
    return r;
}""",
}


@dataclass(frozen=True)
class Emitted:
    """C source of a region and what calling it needs."""

    source: str
    symbol: str
    key: str  # hash of the source and dtypes (bool and uint8 share a C type, not a kernel)
    input_dtypes: tuple[DType, ...]
    out_dtype: DType
    checks_pow: bool  # returns 1 when an integer pow met a negative exponent
    flags: tuple[str, ...] = EXTRA_FLAGS  # extra compiler flags for this source
    var_names: dict[Node, str] = field(default_factory=dict, compare=False)


def emit_c(region: Region) -> Emitted:
    """One C function computing ``region.root`` from ``region.inputs`` (see module docstring)."""
    names: dict[Node, str] = {}
    for k, n in enumerate(region.inputs):
        names[n] = f"x{k}"
    helpers: set[str] = set()
    for c in region.constants:
        names[c] = c_literal(uniform_value(c), c.dtype)
    body: list[list[str]] = []  # per node: its statements
    values = {c: uniform_value(c) for c in region.constants}
    for i, n in enumerate(region.nodes):
        expr = _expr(n, [names[a] for a in n.inputs], helpers, values)
        var = f"v{i}"
        body.append([f"const {_ctype(n.dtype)} {var} = {expr};"])
        if n.op.name == POW and not n.dtype.is_float:
            body[-1].append(f"if ({names[n.inputs[1]]} < 0) bad = 1;")
        names[n] = var
    checks_pow = any(n.op.name == POW and not n.dtype.is_float for n in region.nodes)
    nin = len(region.inputs)
    tile = TILE if nin <= 8 else 256
    out_t = _ctype(region.root.dtype)
    used = math_functions(region.nodes, inlined_value(region))
    vector = sorted(used & vector_math_functions())
    lines = ["#include <stdint.h>", "#include <math.h>", ""]
    if vector:  # libmvec's SIMD variants (see vector_math_functions)
        lines += ["#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)",
                  *(_simd_decl(f) for f in vector), "#endif", ""]
    lines += [_HELPERS[h] + "\n" for h in sorted(helpers)]
    lines = [COMMON_HEADER.read_text(), ""] + lines  # the thread team: tg_team
    lines.append("int NAME(int64_t n, int64_t nd, const int64_t *shape, const int64_t *strides, "
                 "void *const *ptrs) {")
    lines.append("    if (n <= 0) return 0;")
    for k, n in enumerate(region.inputs):
        t = _ctype(n.dtype)
        lines.append(f"    const {t} *const in{k} = (const {t} *)ptrs[{k}];")
    lines.append(f"    {out_t} *const out = ({out_t} *)ptrs[{nin}];")
    lines += [
        "    const int64_t inner = shape[nd - 1];",
        f"    const int64_t per_row = (inner + {tile} - 1) / {tile};",
        "    const int64_t ntiles = (n / inner) * per_row;",
        "    int bad = 0;",
    ]
    pragma = ("    #pragma omp parallel for schedule(static) num_threads(team)"
              + (" reduction(|:bad)" if checks_pow else ""))
    head = len(lines)
    lines += [
        "    for (int64_t t = 0; t < ntiles; t++) {",
        "        const int64_t row = t / per_row;",
        f"        const int64_t j0 = (t - row * per_row) * {tile};",
        f"        const int64_t len = inner - j0 < {tile} ? inner - j0 : {tile};",
    ]
    if nin:
        lines.append("        " + " ".join(f"int64_t o{k} = 0;" for k in range(nin)))
        lines += [
            "        int64_t rem = row;",
            "        for (int64_t d = nd - 2; d >= 0; d--) {",
            "            const int64_t i = rem % shape[d];",
            "            rem /= shape[d];",
            "            " + " ".join(f"o{k} += i * strides[{k} * nd + d];" for k in range(nin)),
            "        }",
        ]
    for k, n in enumerate(region.inputs):
        t = _ctype(n.dtype)
        lines += [
            f"        const int64_t s{k} = strides[{k} * nd + nd - 1];",
            f"        const {t} *q{k} = in{k} + o{k} + j0 * s{k};",
            f"        {t} b{k}[{tile}];",
            f"        if (s{k} == 0) {{ const {t} c = q{k}[0]; "
            f"for (int64_t j = 0; j < len; j++) b{k}[j] = c; q{k} = b{k}; }}",
            f"        else if (s{k} != 1) {{ for (int64_t j = 0; j < len; j++) "
            f"b{k}[j] = q{k}[j * s{k}]; q{k} = b{k}; }}",
        ]
    lines.append("        {")
    for k, n in enumerate(region.inputs):
        lines.append(f"        const {_ctype(n.dtype)} *restrict p{k} = q{k};")
    lines.append(f"        {out_t} *restrict po = out + row * inner + j0;")
    lines += _element_loops(region, body, names, calls_at(region, vector), tile)
    lines += [
        "        }",
        "    }",
    ]
    # small calls skip OpenMP entirely: even a parallel region switched off by an if clause
    # costs about half a microsecond (the native loop runs thousands of such calls)
    # the team: the thread setting, or the calling thread alone while other processes keep
    # the cores busy (a region waits for its slowest thread: tg_common.h, tg_team)
    loop = lines[head:]
    lines[head:] = [f"    const int team = n < {PARALLEL_MIN} ? 1 : tg_team();",
                    "    if (team <= 1) {", *loop, "    } else {", pragma, *loop, "    }"]
    lines += [
        "    return bad;",
        "}",
        "",
    ]
    template = "\n".join(lines)
    signature = ",".join(n.dtype.name for n in region.inputs) + "->" + region.root.dtype.name
    key = hashlib.blake2b((signature + "\n" + template).encode(), digest_size=6).hexdigest()
    symbol = f"tg_fused_{key}"
    source = f"/* generated by tensor_graphs.kernels.c.codegen: {_summary(region)} */\n" \
        + template.replace("int NAME(", f"int {symbol}(", 1)
    flags = flags_for(region.nodes) + (("-lmvec",) if vector else ())
    return Emitted(source, symbol, key, tuple(n.dtype for n in region.inputs),
                   region.root.dtype, checks_pow, flags, names)


MAX_STAGE_BUFFERS = 16  # values one tile keeps between staged loops (each TILE elements)


def calls_at(region: Region, vector: Sequence[str]) -> list[int]:
    """The positions in ``region.nodes`` of the nodes the loop computes with a call of a
    vector math function (``vector``: the libmvec functions the source declares)."""
    exponent = inlined_value(region)
    return [i for i, n in enumerate(region.nodes)
            if math_functions([n], exponent) & set(vector)]


def stages(region: Region, calls: Sequence[int]) -> list[range]:
    """The element loop split after each vector call (``calls``), as ranges of node positions;
    one range where fewer than two calls are made or the values crossing from stage to stage
    would need more than MAX_STAGE_BUFFERS buffers.

    Why: the region is one chain of dependent operations (Mish: exp, log1p, exp and a
    division in a row), so in one loop each vector waits out every call's latency, and a
    libmvec call is a few dozen instructions the out-of-order window cannot see past. A loop
    per stage over the tile (in L1) makes consecutive calls independent: (16, 1024) float32
    Mish in C by hand 24.7 -> 15.3 ns per 16 elements. Whole vectors give the single loop's
    bits; a tile's tail (under one vector) may take another libm variant (scalar, 8 lanes) in
    one stage than in another, within the few ULP the checks allow, never depending on where
    the arrays lie."""
    whole = [range(len(region.nodes))]
    if len(calls) < 2:
        return whole
    bounds = [0] + [c + 1 for c in calls if c + 1 < len(region.nodes)] + [len(region.nodes)]
    split = [range(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    return split if len(_crossing(region, split)) <= MAX_STAGE_BUFFERS else whole


def _crossing(region: Region, split: Sequence[range]) -> list[int]:
    """The node positions whose values a later stage reads (kept in a per-tile buffer)."""
    position = {n: i for i, n in enumerate(region.nodes)}
    stage_of = {i: s for s, r in enumerate(split) for i in r}
    out = set()
    for i, n in enumerate(region.nodes):
        for a in n.inputs:
            j = position.get(a)
            if j is not None and stage_of[j] != stage_of[i]:
                out.add(j)
    return sorted(out)


def _element_loops(region: Region, body: Sequence[Sequence[str]], names: Mapping[Node, str],
                   calls: Sequence[int], tile: int) -> list[str]:
    """The loops over one tile's elements (``stages``): each reads the inputs it uses from
    ``p{k}``, the values of earlier stages from buffers ``t{i}``, and stores the values later
    stages read; the last stores the root in ``po``."""
    split = stages(region, calls)
    crossing = _crossing(region, split) if len(split) > 1 else []
    position = {n: i for i, n in enumerate(region.nodes)}
    inputs = {n: k for k, n in enumerate(region.inputs)}
    out = [f"        {_ctype(region.nodes[i].dtype)} t{i}[{tile}];" for i in crossing]
    for r in split:
        reads_in: set[int] = set()
        reads_buf: set[int] = set()
        for i in r:
            for a in region.nodes[i].inputs:
                if a in inputs:
                    reads_in.add(inputs[a])
                elif a in position and position[a] not in r:
                    reads_buf.add(position[a])
        last = r[-1] == len(region.nodes) - 1
        out += [*IVDEP, "        for (int64_t j = 0; j < len; j++) {"]
        out += [f"            const {_ctype(region.inputs[k].dtype)} x{k} = p{k}[j];"
                for k in sorted(reads_in)]
        out += [f"            const {_ctype(region.nodes[i].dtype)} v{i} = t{i}[j];"
                for i in sorted(reads_buf)]
        out += ["            " + line for i in r for line in body[i]]
        out += [f"            t{i}[j] = v{i};" for i in crossing if i in r]
        if last:
            out.append(f"            po[j] = {names[region.root]};")
        out.append("        }")
    return out


def float_to_int_flags(nodes: Sequence[Node]) -> tuple[str, ...]:
    """FLOAT_TO_INT_FLAGS when a region's nodes cast a float to an int, else none."""
    casts = any(n.op.name == CAST and n.inputs[0].dtype.is_float and n.dtype.is_int
                for n in nodes)
    return FLOAT_TO_INT_FLAGS if casts else ()


def flags_for(nodes: Sequence[Node]) -> tuple[str, ...]:
    """The compiler flags of a generated elementwise or row region's C (see EXTRA_FLAGS and
    GCC_FLAGS)."""
    return EXTRA_FLAGS + (GCC_FLAGS if _is_gcc() else ()) + float_to_int_flags(nodes)


def _is_gcc() -> bool:
    """The C compiler is GCC (clang also defines __GNUC__ but takes other flags and has no
    libmvec declarations of its own)."""
    from tensor_graphs.kernels.c import build

    version = build.compiler_version().lower()
    return "clang" not in version and ("gcc" in version or "free software" in version)


def math_functions(nodes: Sequence[Node], exponent: Callable[[Node], object]) -> set[str]:
    """The libm functions C made from ``nodes`` calls (expf, pow, ...): the elementwise, row
    and GEMM-epilogue renderers all emit ``_expr``'s C. ``exponent(node)`` is the value of a
    constant inlined as a literal (None otherwise): pow by 0.5, 2 or -1 calls nothing."""
    out = set()
    for n in nodes:
        base = _UNARY_C.get(n.op.name) or ("pow" if n.op.name == POW else None)
        if n.op.name == POW:
            value = exponent(n.inputs[1])
            if value is not None and float(value) in _POW_AS:
                base = None
        if base and base != "sqrt" and n.dtype.is_float:
            out.add(base + ("f" if n.dtype.name == "float32" else ""))
    return out


def inlined_value(region) -> Callable[[Node], object]:
    """``math_functions``' exponent for a region (elementwise or GEMM epilogue) whose
    ``constants`` are inlined as literals."""
    return lambda n: uniform_value(n) if n in region.constants else None


def _summary(region: Region) -> str:
    ops = ", ".join(f"{v} {k}" if v > 1 else k for k, v in region.ops.items())
    ins = ", ".join(f"{n.dtype.name}" for n in region.inputs)
    return f"{len(region.nodes)} elementwise ops ({ops}) over ({ins}) -> {region.root.dtype.name}"


# ---------------------------------------------------------------------------- patterns
def region_pattern(region: Region) -> tuple[pat.Pat, tuple[str, ...]]:
    """The region as a pattern: inputs become ``x0, x1, ...`` (guarded by dtype), inlined
    constants ``pat.Const`` of their stored value, ops ``OpPat``s (cast keeps its dtype
    attribute; a node used twice is one named sub-pattern, so matching stays linear)."""
    built: dict[Node, pat.Pat] = {}
    names = []
    for k, n in enumerate(region.inputs):
        name = f"x{k}"
        built[n] = pat.var(name, dtype=n.dtype)
        names.append(name)
    for c in region.constants:
        built[c] = pat.Const(np.asarray(c.attrs["value"].array).reshape(()).item(), c.dtype)
    users: dict[Node, list[Node]] = {}
    for n in region.nodes:
        for i in n.inputs:
            users.setdefault(i, []).append(n)
    for k, n in enumerate(region.nodes):
        attrs = {"dtype": n.attrs["dtype"]} if n.op.name == CAST else {}
        p = pat.OpPat(n.op.name, tuple(built[i] for i in n.inputs), attrs)
        if len(users.get(n, ())) > 1 and not _joins_user_chain(n, users[n]):
            p = p.bind(f"v{k}")  # shared: matched once, not once per path to it
        built[n] = p
    return built[region.root], tuple(names)


def _joins_user_chain(n: Node, users: list[Node]) -> bool:
    """True when ``n`` is a term-chain link of a user (add into add, same dtype): matching
    flattens such chains, so ``n`` cannot be a named sub-pattern there."""
    return n.op.name in ASSOCIATIVE_COMMUTATIVE and any(
        u.op.name == n.op.name and u.dtype == n.dtype for u in users)


# ---------------------------------------------------------------------------- calling
def _layout(arrays: Sequence[np.ndarray], shape: tuple[int, ...]):
    """Merged output dims and per-input element strides (0 where broadcast): axes that are
    contiguous with the previous one for every operand become one."""
    rank = len(shape)
    strides = []
    for a in arrays:
        lead = rank - a.ndim
        strides.append([0 if i < lead or a.shape[i - lead] == 1
                        else a.strides[i - lead] // a.itemsize for i in range(rank)])
    dims: list[int] = []
    merged: list[list[int]] = [[] for _ in arrays]
    for axis, size in enumerate(shape):
        if size == 1:
            continue
        if dims and all(m[-1] == s[axis] * size for m, s in zip(merged, strides)):
            dims[-1] *= size  # contiguous with the previous axis for every operand: merge
            for m, s in zip(merged, strides):
                m[-1] = s[axis]
            continue
        dims.append(size)
        for m, s in zip(merged, strides):
            m.append(s[axis])
    if not dims:
        dims = [1]
        merged = [[0] for _ in arrays]
    return dims, merged


def checked_arrays(arrays: Sequence, dtypes: Sequence[np.dtype],
                   description: str) -> list[np.ndarray]:
    """A generated kernel's arguments as arrays, one per input of the listed dtypes; anything
    else is a ``KernelConstraintError`` naming the kernel (every generated C renderer calls
    this before handing pointers to C, which would read any bytes it is given)."""
    if len(arrays) != len(dtypes):
        raise KernelConstraintError(f"{description}: takes {len(dtypes)} inputs, got "
                                    f"{len(arrays)}")
    arrs = [a if type(a) is np.ndarray else np.asarray(a) for a in arrays]
    for k, (a, want) in enumerate(zip(arrs, dtypes)):
        if a.dtype != want:
            raise KernelConstraintError(f"{description}: input x{k} must be {want}, got "
                                        f"{a.dtype}")
    return arrs


def make_function(emitted: Emitted, lib: ctypes.CDLL, description: str):
    """The Python function of a compiled region: numpy arrays in, a new array out (or the
    ``out=`` buffer filled: ``writes_out``, see the registry). The call layout (output shape,
    merged dims, strides) is remembered per input shapes and strides."""
    cfn = getattr(lib, emitted.symbol)
    cfn.restype = ctypes.c_int
    cfn.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                    ctypes.c_void_p]
    in_np = tuple(d.np_dtype for d in emitted.input_dtypes)
    out_np = emitted.out_dtype.np_dtype
    nin = len(in_np)
    ptr_array = ctypes.c_void_p * (nin + 1)
    plans: dict[tuple, tuple] = {}

    def plan(arrs):
        try:
            shape = np.broadcast_shapes(*(a.shape for a in arrs))
        except ValueError:
            shown = ", ".join(str(a.shape) for a in arrs)
            raise KernelConstraintError(f"{description}: input shapes {shown} do not "
                                        "broadcast") from None
        copy = tuple(any(st % a.itemsize for st in a.strides) for a in arrs)
        arrs = [np.ascontiguousarray(a) if c else a for a, c in zip(arrs, copy)]
        dims, strides = _layout(arrs, shape)
        st = np.asarray(strides, np.int64).reshape(-1) if nin else np.zeros(1, np.int64)
        if len(plans) >= 256:
            plans.clear()
        dims_a = np.asarray(dims, np.int64)
        return shape, copy, len(dims), dims_a.ctypes.data, st.ctypes.data, (dims_a, st)

    def fused(*arrays, out=None):
        arrs = checked_arrays(arrays, in_np, description)
        key = tuple((a.shape, a.strides) for a in arrs)
        found = plans.get(key)
        if found is None:
            found = plans[key] = plan(arrs)
        shape, copy, nd, dims_p, st_p, _ = found  # (the arrays keep the pointers valid)
        if any(copy):
            arrs = [np.ascontiguousarray(a) if c else a for a, c in zip(arrs, copy)]
        if out is None:
            out = np.empty(shape, out_np)
        if out.size == 0:
            return out
        ptrs = ptr_array(*[a.ctypes.data for a in arrs], out.ctypes.data)
        rec = _clib.recording  # the native loop records the call; dims/strides are small blocks
        call = cfn if rec is None else rec.wrap(cfn, found[5])
        if call(out.size, nd, dims_p, st_p, ptrs):
            raise EvaluationError(f"{description}: pow: integers to negative integer powers "
                                  "are undefined")
        return out

    fused.source_text = emitted.source
    fused.c_function = cfn  # int f(n, nd, shape*, strides*, void *ptrs[nin + 1]): 0 or 1
    fused.__name__ = f"c_fused_{emitted.key}"
    fused.__qualname__ = fused.__name__
    fused.__doc__ = description
    return fused


# ---------------------------------------------------------------------------- verification
@dataclass
class CheckReport:
    ok: bool
    max_rel_error: float
    tolerance: float
    shapes: list = field(default_factory=list)
    message: str = ""


def _concrete_shape(shape) -> tuple[int, ...]:
    out = []
    for d in shape:
        if isinstance(d, int):
            out.append(d)
        else:
            out.append(int(sympy.sympify(d).subs({s: 3 for s in d.free_symbols})))
    return tuple(out)


def _trial_shapes(region: Region) -> list[list[tuple[int, ...]]]:
    """Input shapes to verify on: the region's own (shrunk when large) and variants whose
    last axis is 1, 7, 33 and 1025, keeping every operand's broadcast pattern."""
    ins = [_concrete_shape(n.shape) for n in region.inputs]
    consts = [_concrete_shape(c.shape) for c in region.constants]
    out = broadcast_shapes(*ins, *consts) if ins or consts else ()
    rank = len(out)
    fixed = [False] * rank  # axes a constant pins (its size there is not 1)
    for cs in consts:
        for j, d in enumerate(cs):
            if d != 1:
                fixed[rank - len(cs) + j] = True

    def variant(sizes):
        res = []
        for s in ins:
            res.append(tuple(1 if d == 1 else sizes[rank - len(s) + j]
                             for j, d in enumerate(s)))
        return res

    trials = []
    if math.prod(out) <= 1 << 18:
        trials.append(ins)
    if rank:
        for last in (1, 7, 33, 1025):
            sizes = [out[j] if fixed[j] else min(out[j], 3) for j in range(rank)]
            if not fixed[-1]:
                sizes[-1] = last
            trials.append(variant(sizes))
    return trials or [ins]


# a large finite value of each float dtype among a check's special values
BIG = {"float64": 1e300, "float32": 3e38, "bfloat16": 3e38, "float16": 6e4}


def _random_array(rng, shape, d: DType, special: bool, strided: bool):
    full = tuple(shape[:-1]) + (2 * shape[-1],) if strided and shape else tuple(shape)
    if d.is_bool:
        a = np.asarray(rng.random(full) < 0.5)
    elif d.is_int:
        info = np.iinfo(d.np_dtype)
        if special:
            a = np.asarray(rng.integers(info.min, info.max, size=full, endpoint=True))
        else:
            a = np.asarray(rng.integers(1, 20, size=full) * rng.choice([-1, 1], size=full)
                           if info.min < 0 else rng.integers(1, 20, size=full))
        a = a.astype(d.np_dtype)
    else:
        a = np.asarray(rng.standard_normal(full) * 2).astype(d.np_dtype)
        a[a == 0] = 0.5  # never zeros
        if special and a.size:
            big = BIG.get(d.name, 3e38)  # (1e300 overflowed float16 with a RuntimeWarning)
            picks = np.array([np.nan, np.inf, -np.inf, big, -big, -0.0, 1e-30], d.np_dtype)
            mask = rng.random(full) < 0.15
            a[mask] = rng.choice(picks, size=int(mask.sum()))
    if strided and shape:
        a = a[..., ::2]
    return a


def evaluate_rounded(region: Region, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The region evaluated op by op in float64 and rounded to each node's dtype after every
    op: IEEE arithmetic for + * / sqrt (double rounding is harmless at these widths) and
    correctly rounded transcendentals — the float32 result an ideal libm gives. A second
    native-precision reference next to numpy's own float32 functions, whose last-bit choices
    differ from glibc's and, through an ill-conditioned graph, can land far from both."""
    vals: dict[Node, np.ndarray] = dict(zip(region.inputs, (np.asarray(a) for a in arrays)))
    for c in region.constants:
        vals[c] = np.asarray(c.attrs["value"].array).astype(c.dtype.np_dtype)
    with np.errstate(all="ignore"):
        for n in region.nodes:
            args = [vals[i].astype(np.float64) if vals[i].dtype.kind == "f" else vals[i]
                    for i in n.inputs]
            vals[n] = np.asarray(n.op.reference(args, dict(n.attrs))).astype(n.dtype.np_dtype)
    return vals[region.root]


# ---------------------------------------------------------------------------- rounding bound
# A correct kernel's float result can sit arbitrarily far from the float64 reference in the
# norm-wise measure when the region cancels (exp(x) * 0.75 - 0.125 at x near log(1/6)): no
# constant tolerance covers every input. ``rounding_bound`` bounds the difference per element
# from the region's own ops, so verification can tell such data from a wrong kernel.
LIBM_ULPS = 4.0  # libmvec's accuracy goal (measured here: erff 3.99, logf 3.8); scalar libm <= 3
ROUNDING_ULPS = {  # op: its float result's own rounding error, in ulps of that result
    ADD: 0.5, MUL: 0.5, SQRT: 0.5, RECIPROCAL: 0.5,  # IEEE: correctly rounded
    CAST: 0.5,  # to a narrower float (0 when the value fits)
    NEG: 0.0, MAXIMUM: 0.0, WHERE: 0.0,  # exact: a sign flip or a pick
    ROUND_HALF_EVEN: 0.0,  # an integer: exact
    **dict.fromkeys(TRANSCENDENTAL, LIBM_ULPS),  # libm, libmvec (pow by 0.5, 2, -1: IEEE)
}


def _erf_moved(v, e, r):
    """erf (and erfc, its complement) is 2/sqrt(pi)·exp(-t²)-Lipschitz on [|a| - e, |a| + e]."""
    near = np.maximum(np.abs(v[0]) - e[0], 0.0)
    return 2.0 / math.sqrt(math.pi) * np.exp(-near * near) * e[0]


def _pow_moved(v, e, r):
    """a**b = exp(b·log a) is monotone in b·log a, which is bilinear in (b, log a): its
    extremes over the box a ± e_a, b ± e_b sit at the corners (a > 0; a box reaching a <= 0,
    or a < 0 with an uncertain exponent, can give nan or inf: unbounded)."""
    (a, b), (ea, eb) = v, e
    a, b = a.astype(np.float64), b.astype(np.float64)
    worst = np.zeros(np.broadcast_shapes(a.shape, b.shape))
    for sa in (-1.0, 1.0):
        for sb in (-1.0, 1.0):
            worst = np.maximum(worst, np.abs(np.power(a + sa * ea, b + sb * eb) - r))
    unbounded = (ea >= np.abs(a)) & (ea > 0) | (a < 0) & (eb > 0)
    return np.where(unbounded, np.inf, worst)


def _flips(v, e, r):
    """A comparison may come out either way where its operands are closer than their errors
    (NaN differences count as close)."""
    return (~(np.abs(v[0].astype(np.float64) - v[1]) > e[0] + e[1])).astype(np.float64)


def _where_moved(v, e, r):
    """A condition that may flip can give the other branch: off by |a - b| more."""
    c, a, b = v
    picked = np.where(c, e[1], e[2])
    flipped = np.maximum(e[1], e[2]) + np.abs(a.astype(np.float64) - b)
    return np.where(e[0] > 0, flipped, picked)


def _cast_moved(n: Node, v, e, r):
    src, dst = n.inputs[0].dtype, n.dtype
    if dst.is_bool:  # x != 0: may flip where |x| is within its error of 0
        return (~(np.abs(v[0].astype(np.float64)) > e[0])).astype(np.float64)
    if src.is_float and dst.is_int:  # truncation: off by up to 1 more where a cut is in reach
        x = v[0].astype(np.float64)
        return np.where(np.trunc(x - e[0]) != np.trunc(x + e[0]), e[0] + 1.0, 0.0)
    return e[0]


_MOVED = {  # op: (node, operand values, their error bounds, exact result) -> the result's error
    NEG: lambda n, v, e, r: e[0],
    EXP: lambda n, v, e, r: np.abs(r) * np.expm1(e[0]),  # exp(a + e) - exp(a), the larger
    LOG: lambda n, v, e, r: np.where(v[0] > e[0], -np.log1p(-e[0] / v[0]), np.inf),
    LOG1P: lambda n, v, e, r: np.where(  # log's rule at 1 + a (the lower side, the larger)
        v[0] + 1.0 > e[0], -np.log1p(-e[0] / (v[0] + 1.0)), np.inf),
    EXPM1: lambda n, v, e, r: np.abs(r + 1.0) * np.expm1(e[0]),  # exp's: e**a (e**e - 1)
    SQRT: lambda n, v, e, r: r - np.sqrt(np.maximum(v[0] - e[0], 0.0)),  # the lower side
    RECIPROCAL: lambda n, v, e, r: np.where(  # |1/a' - 1/a| = |a' - a| / |a a'|
        np.abs(v[0]) > e[0], e[0] / (np.abs(v[0]) * (np.abs(v[0]) - e[0])), np.inf),
    SIN: lambda n, v, e, r: np.minimum(np.abs(np.cos(v[0])) * e[0] + e[0] ** 2 / 2, 2.0),
    ERF: lambda n, v, e, r: _erf_moved(v, e, r),
    ERFC: lambda n, v, e, r: _erf_moved(v, e, r),
    ADD: lambda n, v, e, r: np.maximum(*e) if n.dtype.is_bool else e[0] + e[1],  # or: 0/1
    MUL: lambda n, v, e, r: np.maximum(*e) if n.dtype.is_bool else (
        np.abs(v[0]) * e[1] + np.abs(v[1]) * e[0] + e[0] * e[1]),  # exact for intervals
    MAXIMUM: lambda n, v, e, r: np.maximum(*e),  # |max(a', b') - max(a, b)| <= the larger
    POW: lambda n, v, e, r: _pow_moved(v, e, r),
    EQUAL: lambda n, v, e, r: _flips(v, e, r),
    LESS: lambda n, v, e, r: _flips(v, e, r),
    WHERE: lambda n, v, e, r: _where_moved(v, e, r),
    CAST: _cast_moved,
    # an integer: off by up to 1 more where a half-integer (a tie) is in reach, else exact
    ROUND_HALF_EVEN: lambda n, v, e, r: np.where(
        np.rint(v[0] - e[0]) != np.rint(v[0] + e[0]), e[0] + 1.0, 0.0),
}


def _exact_values(region: Region, arrays: Sequence[np.ndarray]) -> dict[Node, np.ndarray]:
    """Every node of the region as ``tg.evaluate(dtype="float64")`` computes it (float nodes
    in float64, casts to float not rounded; int and bool nodes in their dtypes)."""
    vals: dict[Node, np.ndarray] = dict(zip(region.inputs, (np.asarray(a) for a in arrays)))
    for c in region.constants:  # as stored (0.1 stays 0.1; the C literal is its float32)
        stored = np.asarray(c.attrs["value"].array)
        vals[c] = stored.astype(np.float64 if c.dtype.is_float else c.dtype.np_dtype)
    with np.errstate(all="ignore"):
        for n in region.nodes:
            args = [vals[i].astype(np.float64) if vals[i].dtype.kind == "f" else vals[i]
                    for i in n.inputs]
            if n.op.name == CAST and n.dtype.is_float:
                vals[n] = args[0].astype(np.float64)
            else:
                out = np.asarray(n.op.reference(args, dict(n.attrs)))
                vals[n] = out.astype(np.float64 if n.dtype.is_float else n.dtype.np_dtype)
    return vals


def rounding_bound(region: Region, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Per output element, a bound on |kernel(*arrays) - tg.evaluate(..., dtype="float64")|.

    Each op's error is what its operands' errors can move it by (``_MOVED``: exact interval
    bounds, not derivatives, so cancellation and large errors are covered) plus its own
    rounding (``ROUNDING_ULPS`` ulps of the result in the node's dtype). Inputs are exact (the
    kernel and the reference read the same values); an inlined constant is off by its
    rounding to the node's dtype (the reference keeps the stored 0.1, the C literal is 0.1f).
    The bound is taken twice, for the kernel in the region's dtypes and for the float64
    reference's own roundings, and summed. A comparison, cast or ``where`` that rounding may
    decide is covered (both outcomes); where nothing finite bounds an element (an
    intermediate that overflows, a log whose argument's error reaches 0) the bound is inf.
    Integer wrap-around is not modelled: int errors come only from float -> int casts."""
    vals = _exact_values(region, arrays)
    total: np.ndarray | float = 0.0
    for lifted in (False, True):  # the kernel's roundings, then the float64 reference's
        err: dict[Node, np.ndarray] = {n: np.zeros(np.shape(vals[n])) for n in region.inputs}
        with np.errstate(all="ignore"):  # an inf literal (a -inf mask value) is exact
            for c in region.constants:
                literal = vals[c].astype(np.float64 if lifted else c.dtype.np_dtype)
                exact = literal.astype(np.float64) == vals[c]
                err[c] = np.where(exact, 0.0, np.abs(literal.astype(np.float64) - vals[c]))
            for n in region.nodes:
                v, e, r = [vals[i] for i in n.inputs], [err[i] for i in n.inputs], vals[n]
                moved = _MOVED[n.op.name](n, v, e, r) if any(x.any() for x in e) else 0.0
                moved = np.broadcast_to(np.asarray(moved, np.float64), np.shape(r))
                if n.dtype.is_float:
                    dt = np.float64 if lifted else n.dtype.np_dtype
                    ulp = np.spacing((np.abs(r) + moved).astype(dt)).astype(np.float64)
                    moved = moved + ROUNDING_ULPS[n.op.name] * ulp
                elif n.dtype.is_bool:
                    moved = np.minimum(moved, 1.0)
                err[n] = np.where(np.isnan(moved), np.inf, moved)
        total = total + err[region.root]
    return np.broadcast_to(np.asarray(total, np.float64), np.shape(vals[region.root]))


def error_bound(region: Region) -> Callable:
    """A kernel's ``error_bound(*arrays)`` (what ``tg.kernels.verify`` calls with the
    kernel's arguments): ``rounding_bound`` of ``region`` over them. verify passed the
    arguments one by one to ``rounding_bound(region, arrays)``, so the allowance it exists
    for raised a TypeError (two inputs) or bounded the wrong values (one input) exactly on
    the fresh inputs that needed it, and a correct kernel was refused now and then."""
    return functools.partial(_bound_of_arguments, region)


def _bound_of_arguments(region: Region, *arrays: np.ndarray) -> np.ndarray:
    return rounding_bound(region, arrays)


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    b = np.asarray(b)
    if a.dtype.kind != "f":
        b = b.astype(a.dtype)
    eq = a == b
    if a.dtype.kind == "f":
        eq |= np.isnan(a) & np.isnan(b)
    return eq


def _elementwise_ok(got, *refs) -> np.ndarray:
    """Per element: equal to one of the references (NaN equals NaN)."""
    ok = np.zeros(got.shape, bool)
    for r in refs:
        ok |= _same(got, r)
    return ok


def check_kernel(fn, region: Region, seed: int = 0) -> CheckReport:
    """Run ``fn`` on fresh random inputs of several shapes (1, 7, 33, 1025 on the last axis,
    broadcast and strided operands, NaN/inf/huge values) and compare with ``tg.evaluate`` of
    the region. Int/bool outputs and non-finite values element by element: each equals the
    native-dtype evaluation, the float64 one or ``evaluate_rounded`` (rounding may decide a
    comparison, a cast or an overflow); where a transcendental result reaches a float -> int
    or bool step, up to 1% of the elements (at least one) may differ from all three, since
    glibc and numpy may round exp/log/sin/erf/pow differently in the last bit. Finite float
    outputs by norm-wise relative error against the float64 evaluation, within max(floor, 16x
    the error of the native-precision evaluations) — the tolerance the kernel then declares —
    or, on data that make the region cancel, within the trial's ``rounding_bound`` (the rule
    ``tg.kernels.verify`` applies to fresh inputs, so the two never disagree on a correct
    kernel)."""
    from tensor_graphs.ir.evaluate import evaluate
    from tensor_graphs.kernels.verify import bound_error
    from tensor_graphs.numerics import relative_error

    rng = np.random.default_rng(seed)
    out_dt = region.root.dtype
    ulp_sensitive = _rounding_decides(region)
    worst = 0.0
    native_worst = 0.0
    shapes_tried = []
    errors = []  # (error, rounding-bound figure, shapes, special) per float trial
    for t, shapes in enumerate(_trial_shapes(region)):
        for special in (False, True):
            strided = t % 2 == 1
            leaves = [_leaf_for(k, n, s) for k, (n, s) in enumerate(zip(region.inputs, shapes))]
            graph = _on_leaves(region, leaves)
            arrays = [_random_array(rng, s, n.dtype, special, strided)
                      for n, s in zip(region.inputs, shapes)]
            refs = None
            for _attempt in range(2):  # integer pow with a negative exponent: both must refuse
                feeds = {leaf.name: a for leaf, a in zip(leaves, arrays)}
                try:
                    refs = evaluate(graph, feeds), evaluate(graph, feeds, dtype="float64")
                    break
                except EvaluationError:
                    try:
                        fn(*arrays)
                    except EvaluationError:
                        arrays = [np.where(a < 0, 0, a).astype(a.dtype)
                                  if a.dtype.kind in "iu" else a for a in arrays]
                        continue
                    return CheckReport(False, math.inf, 0.0, shapes_tried,
                                       "the reference raised (integer pow with a negative "
                                       "exponent) but the kernel did not")
            if refs is None:
                continue
            r32, r64 = refs
            got = fn(*arrays)
            shapes_tried.append(tuple(tuple(s) for s in shapes))
            if got.shape != r32.shape or got.dtype != r32.dtype:
                return CheckReport(False, math.inf, 0.0, shapes_tried,
                                   f"output {got.shape} {got.dtype}, reference {r32.shape} "
                                   f"{r32.dtype}")
            rr = evaluate_rounded(region, arrays)
            if out_dt.is_float:
                finite = np.isfinite(got) & np.isfinite(r32) & np.isfinite(r64) \
                    & np.isfinite(rr)
                ok = _elementwise_ok(got, r32, r64, rr)
                with np.errstate(all="ignore"):  # finite where float64 is not (the native
                    for r in (r32, rr):           # dtype's rounding decided): close to native
                        ok |= np.isfinite(got) & (np.abs(got - r) <= 1e-4 * np.abs(r))
                bad = ~finite & ~ok
            else:
                bad = np.asarray(~_elementwise_ok(got, r32, r64, rr))
                if ulp_sensitive and bad.sum() <= max(1, bad.size // 100):
                    bad = np.zeros_like(bad)  # a last-bit difference of expf & co. moved a cut
            if bad.any():
                i = tuple(np.argwhere(bad)[0])
                return CheckReport(False, math.inf, 0.0, shapes_tried,
                                   f"element {i} differs: kernel {got[i]}, reference "
                                   f"{r32[i]} ({out_dt.name}) / {r64[i]} (float64), inputs "
                                   f"{[_at(a, i, got.shape) for a in arrays]}")
            if out_dt.is_float and finite.any():
                error = relative_error(got[finite], r64[finite])
                worst = max(worst, error)
                native_worst = max(native_worst, relative_error(r32[finite], r64[finite]),
                                   relative_error(rr[finite], r64[finite]))
                bound = np.broadcast_to(rounding_bound(region, arrays), got.shape)[finite]
                errors.append((error, bound_error(bound, got[finite], r64[finite]),
                               shapes_tried[-1], special))
    if not out_dt.is_float:
        return CheckReport(True, 0.0, _floor(region), shapes_tried)
    tolerance = max(_floor(region), 16 * native_worst)
    # a trial passes within the tolerance or within its own rounding bound, as in kernels.verify
    over = [t for t in errors if not t[0] <= max(tolerance, t[1])]
    msg = ""
    if over:
        error, allowed, shapes, special = over[0]
        msg = (f"relative error {error:.3g} > tolerance {tolerance:.3g} ({out_dt.name} "
               f"evaluations in numpy: {native_worst:.3g}) and > {allowed:.3g}, the rounding "
               f"bound of its ops on those inputs (shapes {list(shapes)}"
               f"{', with NaN/inf' if special else ''})")
    return CheckReport(not over, worst, tolerance, shapes_tried, msg)


def _floor(region: Region) -> float:
    """The smallest tolerance a region's output can declare: that of the least precise float
    dtype it computes in (a float64 or int64 result of float32 work is float32-accurate
    against the float64 reference); integer-only regions are exact."""
    floats = [n.dtype.name for n in (*region.nodes, *region.inputs) if n.dtype.is_float]
    return max((FLOAT_TOLERANCE[d] for d in floats), default=EXACT_TOLERANCE)


def _rounding_decides(region: Region) -> bool:
    """True when a transcendental float result (glibc's and numpy's may differ in the last
    bit) reaches a float -> int/bool step (cast or comparison), which can turn that bit into
    a different integer or truth value."""
    tainted: set[Node] = set()
    for n in region.nodes:
        if n.op.name in TRANSCENDENTAL and n.dtype.is_float or any(i in tainted
                                                                  for i in n.inputs):
            if n.dtype.is_float:
                tainted.add(n)
            elif any(i in tainted and i.dtype.is_float for i in n.inputs):
                return True
            else:
                tainted.add(n)
    return False


def _on_leaves(region: Region, leaves: Sequence[Node]) -> Node:
    """The region's root rebuilt over ``leaves`` in place of its inputs. Only the region's own
    nodes are rebuilt: ``substitute`` walks the whole graph below the root, and rebuilt a
    symbolic reshape under an input (GPT-2's (1, seq, 64) under a matmul) on a leaf of the
    trial's concrete shape, which failed."""
    built: dict[Node, Node] = dict(zip(region.inputs, leaves))
    for n in region.nodes:
        inputs = tuple(built.get(i, i) for i in n.inputs)
        built[n] = n if inputs == n.inputs else Node.make(n.op, inputs, n.attrs, n.name)
    return built[region.root]


def _at(a: np.ndarray, index: tuple, shape: tuple):
    return np.broadcast_to(a, shape)[index]


def _leaf_for(k: int, n: Node, shape) -> Node:
    from tensor_graphs.ir.builder import input as _input

    return _input(f"x{k}", shape, n.dtype)


# ---------------------------------------------------------------------------- kernels
MAX_PATTERN_MATCH = 4096  # larger expanded patterns are matched by region digest instead


@dataclass(frozen=True, eq=False, repr=False)
class FusedKernel(registry.Kernel):
    """A generated kernel: a Kernel that also knows its region's structural digest.

    Matching uses the pattern (so the region is found inside larger elementwise graphs) unless
    the pattern, written out as a tree, is larger than MAX_PATTERN_MATCH nodes (sub-patterns
    shared through an add/mul/maximum chain cannot be named, and pattern matching would take
    exponential time there): then the maximal elementwise region at the node must have the
    same digest."""

    region_digest: bytes = b""
    pattern_size: int = 0
    summary: str = ""
    # error_bound(*arrays): per element, how far a correct kernel may be from the float64
    # reference (rounding_bound of its region); tg.kernels.verify allows that much
    error_bound: Callable | None = None
    generated: bool = True  # explain() shows the ops inside, not a hand kernel's name

    def match(self, node: Node, uses=None, dims=None) -> pat.Match | None:
        if node.op.name != self.op:
            return None
        if self.pattern_size <= MAX_PATTERN_MATCH:
            m = super().match(node, uses, dims)
            if m is None:
                return None
            # a Const stands for a 0-d constant here; a larger uniform constant matched
            # elsewhere would broadcast the node beyond what the kernel computes
            try:
                shape = broadcast_shapes(*(m.bindings[v].shape for v in self.inputs))
            except ShapeError:
                return None
            same = len(shape) == node.ndim and all(dims_equal(a, b)
                                                   for a, b in zip(shape, node.shape))
            return m if same else None
        try:
            region = elementwise_region(node, decompose_composites=False)
        except ArgumentError:
            return None
        if region_digest(region) != self.region_digest:
            return None
        bindings = dict(zip(self.inputs, region.inputs))
        if self.constraint_failure([registry.concrete(b.shape, dims) for b in region.inputs],
                                   [b.dtype for b in region.inputs],
                                   registry.concrete_attrs(node.attrs, dims)):
            return None
        return pat.Match(bindings)

    def __repr__(self) -> str:
        text = registry.describe(self.pattern) if self.pattern_size <= 64 else self.summary
        return f"<kernel {self.name} ({self.backend}, {self.device}) {text}>"


def pattern_size(p: pat.Pat, limit: int = 1 << 20) -> int:
    """Nodes of the pattern written out as a tree (named sub-patterns once), up to ``limit``."""
    seen: set[str] = set()
    total, stack = 0, [p]
    while stack and total <= limit:
        q = stack.pop()
        total += 1
        if isinstance(q, pat.OpPat):
            if q.name is not None:
                if q.name in seen:
                    continue
                seen.add(q.name)
            stack.extend(q.inputs)
    return total


# ---------------------------------------------------------------------------- fusing
_lock = threading.RLock()
_by_digest: dict[bytes, registry.Kernel] = {}
_by_source: dict[str, registry.Kernel] = {}
_key_of: dict[str, str] = {}  # kernel name -> source key
_verified: set[str] = set()  # kernel names admitted by check_kernel and kernels.verify
stats = {"generated": 0, "digest_hits": 0, "source_hits": 0}


def region_digest(region: Region) -> bytes:
    """The structural digest of a region: inputs as numbered placeholders, constants by value,
    leaf names ignored (``rewrite.canonical.digests(named=False)``)."""
    from tensor_graphs.rewrite.canonical import digests

    table = digests(region.root, named=False,
                    placeholders={n: k for k, n in enumerate(region.inputs)})
    return table[region.root]


def fuse_elementwise(root: Node | Region, inputs: Sequence[Node] | None = None, *,
                     uses: Mapping[Node, int] | None = None, register: bool = True,
                     verify: bool = True, emitted: Emitted | None = None) -> FusedKernel:
    """A C kernel ("c_fused_<hash>") computing the elementwise region rooted at ``root``.

    Emits one C loop, compiles it (``kernels.c.build``, cached on disk), checks it (with
    ``verify``: ``check_kernel`` against ``tg.evaluate``, which also sets the declared
    tolerance, then ``tg.kernels.verify(strict=True)``; ``KernelVerificationError`` when
    either disagrees) and registers it, so ``tg.kernels.matching`` finds it wherever the same
    subgraph occurs. The kernel takes the region's inputs (``elementwise_region(root).inputs``)
    positionally, in that order. Kernels are cached per structural digest of the region and
    per generated source: asking again returns the same Kernel without compiling (or checking
    again). ``emitted``: the region's source, already emitted (``emit_c``) by a caller that
    named something after it (a planner candidate): the kernel of that source, never the
    digest's, whose source may differ (``a + b`` and ``b + a`` share a digest), or the
    profiler files the candidate's rows under the twin's name and never finds them. Raises
    ``CCompileError`` when the C compiler fails or is missing.
    """
    region = root if isinstance(root, Region) else elementwise_region(root, inputs, uses=uses)
    digest = region_digest(region)
    with _lock:
        kernel = _by_digest.get(digest) if emitted is None else None
        if kernel is not None:
            stats["digest_hits"] += 1
            key = _key_of[kernel.name]
        else:
            emitted = emitted or emit_c(region)
            key = emitted.key
            kernel = _by_source.get(key)
            if kernel is not None:
                stats["source_hits"] += 1
            else:
                kernel = _build(region, emitted, digest)
                stats["generated"] += 1
                _key_of[kernel.name] = key
        if verify and kernel.name not in _verified:
            kernel = _admit(kernel, region)
        _by_source[key] = kernel
        _by_digest[digest] = kernel
        for d, k in list(_by_digest.items()):  # an admitted kernel replaces its draft
            if k.name == kernel.name:
                _by_digest[d] = kernel
        if register and registry._KERNELS.get(kernel.name) is not kernel:  # noqa: SLF001
            registry.register(kernel, replace=True)
        return kernel


def _admit(kernel: FusedKernel, region: Region) -> FusedKernel:
    """Check a kernel (own check, then the project's verify) and declare its tolerance."""
    kernel = admitted(kernel, check_kernel(kernel.fn, region), kernel.fn.source_text)
    _verified.add(kernel.name)
    return kernel


def admitted(kernel, report: CheckReport, source: str = ""):
    """A generated kernel after its renderer's own check (``report``): with the tolerance
    that check declared, once the project's ``tg.kernels.verify`` on fresh random inputs has
    passed it too, or with the worst error those inputs showed where it lies within
    ``TOLERANCE_MARGIN`` of the declaration (``near_tolerance``): a kernel on the line is
    admitted every time, at its measured accuracy, not refused now and then.
    ``KernelVerificationError`` (its message ending in ``source``) when either refuses: the
    one admission every generated renderer (C elementwise, rows, GEMM epilogues; Triton)
    uses."""
    if not report.ok:
        raise KernelVerificationError(f"{kernel.name} ({kernel.summary}) disagrees with the "
                                      f"reference: {report.message}"
                                      + (f"\n{source}" if source else ""))
    kernel = dataclasses.replace(kernel, tolerance=report.tolerance)
    from tensor_graphs.kernels.verify import verification_error
    from tensor_graphs.kernels.verify import verify as project_verify

    checked = project_verify(kernel)
    if checked.ok:
        return kernel
    worst = near_tolerance(checked, kernel.tolerance)
    if worst is None:
        raise verification_error([checked])
    # the accuracy the planner uses is the worst the fresh inputs showed, never less
    return dataclasses.replace(kernel, tolerance=worst)


# How far above its declared tolerance a generated kernel's error on verify's fresh random
# inputs may land and still be admitted, with that error as its tolerance. The declaration is
# a measurement on seeded trials (16x numpy's error, or 4x a GEMM's own), and fresh inputs
# scatter around it: a correct softmax row kernel reached 0.92 of it in 400 seeds, so a fixed
# line refused the same kernel now and then and the compile planned again. Bugs the verifier
# exists for are orders of magnitude off, or non-finite, or fail cases judged by a floor of
# their own (rows far from zero), which this leaves alone.
TOLERANCE_MARGIN = 4.0


def near_tolerance(report, tolerance: float) -> float | None:
    """The worst error of ``report`` (a failed ``tg.kernels.verify`` report) where its only
    failures are errors within ``TOLERANCE_MARGIN`` of ``tolerance`` on cases judged by that
    tolerance alone (no floor, own-dtype or rounding-bound allowance above it); else None."""
    failed = [r for r in report.results if not r.ok]
    if not failed or report.skipped or len(failed) != len(report.failures):
        return None
    for r in failed:
        if not (math.isfinite(r.error) and r.allowed == tolerance
                and r.message.startswith("relative error")
                and r.error <= TOLERANCE_MARGIN * tolerance):
            return None
    return float(max(r.error for r in failed))


def region_signatures(region: Region) -> list[dict]:
    """Input shapes and dtypes for ``tg.kernels.verify`` (``signatures=``): the trial shapes
    of ``check_kernel`` (last axis 1, 7, 33, 1025, broadcast patterns kept); int inputs of a
    region with an integer pow draw positive values (negative exponents raise)."""
    from tensor_graphs.kernels.signatures import Spec

    int_pow = any(n.op.name == POW and n.dtype.is_int for n in region.nodes)
    out = []
    for shapes in _trial_shapes(region):
        sig = {}
        for k, (n, shape) in enumerate(zip(region.inputs, shapes)):
            values = "positive" if int_pow and n.dtype.is_int else "normal"
            sig[f"x{k}"] = Spec(tuple(shape), n.dtype.name, values)
        out.append(sig)
    return out


def _build(region: Region, emitted: Emitted, digest: bytes) -> FusedKernel:
    from tensor_graphs.kernels.c.build import load_library

    name = f"c_fused_{emitted.key}"
    pattern, var_names = region_pattern(region)
    size = pattern_size(pattern, MAX_PATTERN_MATCH)
    text = registry.describe(pattern) if size <= MAX_PATTERN_MATCH else "(pattern too large to "\
        "print)"
    summary = f"generated C: {_summary(region)}"
    description = f"{name} ({summary})"
    lib = load_library(name, emitted.source, emitted.flags)
    threads.register_library(lib)  # one thread count for OpenMP, OpenBLAS and torch
    fn = make_function(emitted, lib, description)
    tolerance = _floor(region)  # until check_kernel measures it
    in_dtypes = emitted.input_dtypes
    where = broadcast_constraint(name, in_dtypes)
    return FusedKernel(
        name=name, pattern=pattern, backend="c", device="cpu", fn=fn, inputs=var_names,
        signatures=region_signatures(region),
        dtypes=tuple(dict.fromkeys(in_dtypes)) or None, where=where, tolerance=tolerance,
        writes_out=True,
        doc=f"{summary}: {text if len(text) <= 1000 else text[:1000] + '...'}",
        source_hash=source_hash(emitted), region_digest=digest, pattern_size=size,
        summary=summary, error_bound=error_bound(region))


def broadcast_constraint(name: str, in_dtypes: Sequence[DType]) -> Callable:
    """An elementwise region kernel's ``where``: its inputs of the dtypes it was rendered for,
    whose shapes broadcast (symbolic dims too); the C and Triton renderers share it."""

    def where(shapes, dts, attrs):
        for k, (d, want) in enumerate(zip(dts, in_dtypes)):
            if d != want:
                return f"input 'x{k}' must be {want.name}, got {d.name}"
        try:
            broadcast_shapes(*shapes, op=name)
        except ShapeError as e:
            return str(e)
        return True

    return where


def source_hash(emitted: Emitted) -> str:
    """The kernel's source hash (the database's key for its measurements): its C source and
    compiler flags, known before compiling, so a planner candidate and the kernel built from
    it share their rows."""
    text = emitted.source + "\n" + " ".join(emitted.flags)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


# ---------------------------------------------------------------------------- as planner options
def _computes(node: Node) -> bool:
    """A fusable node that reads a value, not only constants (a region is rooted at a value)."""
    return fusable(node) and not all(inlinable(i) for i in node.inputs)


def _fold(node: Node) -> Node:
    """An op on 0-d constants alone (``sub``'s decomposition leaves ``neg(0.5)`` inside it) as
    the 0-d constant it computes, in its own dtype: one more C literal, not a kernel input that
    a step of its own would make."""
    if not fusable(node) or node.ndim or not node.inputs \
            or not all(inlinable(i) for i in node.inputs):
        return node
    from tensor_graphs.ir.builder import constant
    from tensor_graphs.ir.evaluate import evaluate

    return constant(np.asarray(evaluate(node, {})), node.dtype)


def elementwise_candidate(root: Node, uses: Mapping[Node, int],
                          expand: Callable[[Node], Node | None]):
    """The planner's generated option at ``root``: the largest elementwise region rooted there
    whose inner values nothing else reads, reaching through composite inputs that decompose to
    elementwise ops (``kernels.generated.grow``), rendered as C (not compiled: see
    ``kernels.generated.realize``). None when the region would be the root alone."""
    from tensor_graphs.kernels import generated

    if not _computes(root):
        return None
    grown = generated.grow(root, uses, expand, fusable)
    if grown is None:
        return None
    covers, boundary, through = grown
    top = generated.rebuilt(covers, through, _fold)
    if top.op.is_leaf:  # folded to a constant: the region reads no value
        return None
    region = elementwise_region(top, [b for b in boundary if not inlinable(b)],
                                decompose_composites=False)
    emitted = emit_c(region)

    def build() -> FusedKernel:  # the kernel of this source: the candidate's name and rows
        return fuse_elementwise(region, register=False, emitted=emitted)

    return generated.Candidate(
        "elementwise", root, covers, region.inputs, f"c_fused_{emitted.key}",
        source_hash(emitted), _floor(region), f"generated C: {_summary(region)}", build,
        computes=top, draft=lambda: fuse_elementwise(region, register=False, verify=False,
                                                     emitted=emitted))


def cached_kernels() -> list[registry.Kernel]:
    """Every kernel generated in this process (registered or not)."""
    with _lock:
        return list(dict.fromkeys(_by_source.values()))


def clear_cache() -> None:
    """Forget generated kernels (and unregister them); compiled libraries stay on disk."""
    with _lock:
        for k in _by_source.values():
            if registry._KERNELS.get(k.name) is k:  # noqa: SLF001
                registry.unregister(k.name)
        _by_digest.clear()
        _by_source.clear()
        _key_of.clear()
        _verified.clear()


__all__ = ["ELEMENTWISE", "RENDERED", "SUPPORTED_DTYPES", "Region", "Emitted", "CheckReport",
           "fusable", "uniform_value", "elementwise_region", "emit_c", "c_literal",
           "region_pattern",
           "region_digest", "check_kernel", "evaluate_rounded", "rounding_bound", "error_bound",
           "fuse_elementwise", "make_function", "admitted", "near_tolerance", "TOLERANCE_MARGIN",
           "flags_for", "float_to_int_flags",
           "cached_kernels", "clear_cache", "stats",
           "FusedKernel", "pattern_size", "source_hash", "elementwise_candidate"]
