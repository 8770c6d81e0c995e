"""Generated C: one loop for any elementwise subgraph, compiled, verified and registered on demand.

    region = elementwise_region(root)      # the maximal elementwise subgraph rooted at a node
    k = fuse_elementwise(root)             # emit C, compile, verify, register: a Kernel
    y = k(*[feeds for region.inputs])      # numpy in, numpy out (numpy broadcasting)

A *region* is the largest set of elementwise atomic ops (neg exp log sqrt reciprocal sin erf
add mul maximum pow equal less where cast) reachable from the root through inputs, stopping at
leaves, at non-elementwise ops (matmul, reductions, movement) and at nodes of a dtype the
generator has no C type for (float16, bfloat16). What it stops at becomes a kernel input, except
constants whose elements are all equal: those are inlined as C literals. Nodes used outside the
region are recomputed inside it (pass ``uses=`` to make shared nodes inputs instead).

The emitted C is shape-generic: one function per region *structure*, called with the output
shape and per-input strides in elements (0 on broadcast axes), computed in Python from numpy's
broadcasting of the actual arguments, after merging axes that are contiguous for every operand.
The loop runs over tiles of at most TILE elements of the innermost axis (OpenMP-parallel above
PARALLEL_MIN elements); an input whose innermost stride is not 1 (broadcast or strided) is
first gathered into a per-tile buffer, so the loop body always reads unit-stride arrays and
vectorises. Each op is one C statement on locals; the output is written once, contiguous.

Semantics follow numpy (the reference) exactly where it matters:
- ``maximum`` propagates NaN (``a > b || a != a ? a : b``, numpy's own choice of operand on
  ties, so ``maximum(-0.0, 0.0)`` is ``0.0`` as in numpy); ``fmax`` does not and is not used.
- comparisons with NaN are false (C's own rule); ``where`` is ``c ? a : b``.
- signed integer add/mul/neg wrap around modulo 2**bits (computed in the unsigned type: no
  undefined behaviour); integer ``pow`` is square-and-multiply modulo 2**bits, and a negative
  exponent raises ``EvaluationError`` as the reference does.
- ``cast`` float -> int truncates toward zero; NaN, inf and out-of-range values give what
  numpy gives on x86-64 (INT_MIN of the 32-bit conversion for int32/int8/uint8 — whose low 8
  bits are kept — and of the 64-bit conversion for int64), on every platform, never C's
  undefined behaviour. int -> int narrows modulo 2**bits; anything -> bool is ``x != 0`` (NaN is
  true); bool -> anything is 0/1.
- float32 ops use the float32 C functions (expf, logf, sqrtf, sinf, erff, powf); float32
  constants are rounded to float32 once, as ``tg.evaluate`` does without ``dtype="float64"``.
- compiled without -ffast-math and with ``-ffp-contract=off``: no fused multiply-add may change
  a rounding, an overflow to inf, or a NaN.
Results therefore agree with the float32 (or float64) numpy evaluation of the same graph bit for
bit except where glibc's transcendental functions round differently from numpy's (<= a few ULP).

Every kernel is checked before it is registered (see ``check_kernel``), and kept per structural
digest of its region (and per C source, so one structure at different shapes shares one kernel
and one compiled library).
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import sympy

from tensor_graphs.errors import (
    ArgumentError,
    EvaluationError,
    KernelConstraintError,
    KernelVerificationError,
    ShapeError,
)
from tensor_graphs.ir import dtypes as _dt
from tensor_graphs.ir.dtypes import DType
from tensor_graphs.ir.graph import decompose, substitute
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.atomic import BINARY, UNARY
from tensor_graphs.ir.shapes import broadcast_shapes
from tensor_graphs.kernels import registry
from tensor_graphs.rewrite import pattern as pat
from tensor_graphs.rewrite.algebra import ASSOCIATIVE_COMMUTATIVE

ELEMENTWISE = frozenset({*UNARY, *BINARY, "where", "cast"})
TRANSCENDENTAL = frozenset({"exp", "log", "sin", "erf", "pow"})  # glibc may differ by ULPs

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

TILE = 1024  # elements of the innermost axis per tile (and per gather buffer)
PARALLEL_MIN = 1 << 16  # OpenMP splits the tiles across threads from this many elements
EXTRA_FLAGS = ("-ffp-contract=off",)  # no FMA contraction: roundings and overflows as numpy's
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
    return (node.op.name in ELEMENTWISE and node.dtype in SUPPORTED_DTYPES
            and all(i.dtype in SUPPORTED_DTYPES for i in node.inputs))


def uniform_value(node: Node):
    """The one value every element of a constant node has in its own dtype (None otherwise)."""
    if node.op.name != "constant" or node.dtype not in SUPPORTED_DTYPES:
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


def elementwise_region(root: Node, inputs: Sequence[Node] | None = None, *,
                       uses: Mapping[Node, int] | None = None,
                       decompose_composites: bool = True) -> Region:
    """The maximal elementwise subgraph rooted at ``root``.

    It stops at leaves, non-elementwise ops and unsupported dtypes, and at ``inputs`` when
    given (explicit boundaries), and with ``uses`` (use counts of the whole graph) at nodes with
    more than one user. A composite root is decomposed first (``decompose_composites``); the
    region's inputs are then nodes of the decomposed graph.
    """
    if not isinstance(root, Node):
        raise ArgumentError(f"elementwise_region: expected a graph node, got "
                            f"{type(root).__name__}")
    if decompose_composites and not (root.op.is_atomic or root.op.is_leaf):
        root = decompose(root)
    if not fusable(root):
        why = (f"its dtype {root.dtype.name} has no C type here" if root.op.name in ELEMENTWISE
               else "it is not an elementwise atomic op")
        raise ArgumentError(f"elementwise_region: cannot fuse at {root.op.name} "
                            f"{tuple(root.shape)} {root.dtype.name}: {why} (elementwise ops: "
                            f"{', '.join(sorted(ELEMENTWISE))})")
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
    consts = tuple(n for n in boundary if n not in stop and uniform_value(n) is not None)
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


_UNARY_C = {"exp": "exp", "log": "log", "sqrt": "sqrt", "sin": "sin", "erf": "erf"}


def _expr(n: Node, args: list[str], helpers: set[str]) -> str:
    """The C expression of one op over its operands' C expressions."""
    name, T = n.op.name, n.dtype
    src = n.inputs[0].dtype
    ct, ut = _ctype(T), _utype(T)
    if name == "cast":
        return _cast_expr(args[0], src, T, helpers)
    if name == "where":
        return f"({args[0]} ? {args[1]} : {args[2]})"
    if name in ("equal", "less"):
        return f"(({ct})({args[0]} {'==' if name == 'equal' else '<'} {args[1]}))"
    a = args[0]
    if name in _UNARY_C:
        fn = _UNARY_C[name] + ("f" if T.name == "float32" else "")
        return f"{fn}({a})"
    if name == "reciprocal":
        return f"({'1.0f' if T.name == 'float32' else '1.0'} / {a})"
    if name == "neg":
        return f"(-{a})" if T.is_float else f"(({ct})({ut})(0u - ({ut}){a}))"
    b = args[1]
    if name in ("add", "mul"):
        if T.is_bool:
            return f"({a} {'|' if name == 'add' else '&'} {b})"
        if T.is_float:
            return f"({a} {'+' if name == 'add' else '*'} {b})"
        return f"(({ct})({ut})(({ut}){a} {'+' if name == 'add' else '*'} ({ut}){b}))"
    if name == "maximum":
        if T.is_float:  # numpy: NaN in either operand gives NaN; on ties b (as np.maximum)
            return f"(({a} > {b} || {a} != {a}) ? {a} : {b})"
        return f"({a} > {b} ? {a} : {b})"
    if name == "pow":
        if T.is_float:
            return f"{'powf' if T.name == 'float32' else 'pow'}({a}, {b})"
        helpers.add("ipow")
        return f"(({ct})({ut})tg_ipow((uint64_t)(int64_t){a}, {b} < 0 ? 0u : (uint64_t){b}))"
    raise ArgumentError(f"codegen: no C for op {name}")  # pragma: no cover - ELEMENTWISE guards


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
    key: str  # hash of the source: one kernel and one library per distinct source
    input_dtypes: tuple[DType, ...]
    out_dtype: DType
    const_shapes: tuple[tuple[int, ...], ...]
    checks_pow: bool  # returns 1 when an integer pow met a negative exponent
    var_names: dict[Node, str] = field(default_factory=dict, compare=False)


def emit_c(region: Region) -> Emitted:
    """One C function computing ``region.root`` from ``region.inputs`` (see module docstring)."""
    names: dict[Node, str] = {}
    for k, n in enumerate(region.inputs):
        names[n] = f"x{k}"
    helpers: set[str] = set()
    for c in region.constants:
        names[c] = c_literal(uniform_value(c), c.dtype)
    body: list[str] = []
    for i, n in enumerate(region.nodes):
        expr = _expr(n, [names[a] for a in n.inputs], helpers)
        var = f"v{i}"
        body.append(f"const {_ctype(n.dtype)} {var} = {expr};")
        if n.op.name == "pow" and not n.dtype.is_float:
            body.append(f"if ({names[n.inputs[1]]} < 0) bad = 1;")
        names[n] = var
    checks_pow = any(n.op.name == "pow" and not n.dtype.is_float for n in region.nodes)
    nin = len(region.inputs)
    tile = TILE if nin <= 8 else 256
    out_t = _ctype(region.root.dtype)
    lines = ["#include <stdint.h>", "#include <math.h>", ""]
    lines += [_HELPERS[h] + "\n" for h in sorted(helpers)]
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
        f"    #pragma omp parallel for schedule(static) if (n >= {PARALLEL_MIN})"
        + (" reduction(|:bad)" if checks_pow else ""),
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
    lines += [
        f"        {out_t} *restrict po = out + row * inner + j0;",
        "        for (int64_t j = 0; j < len; j++) {",
    ]
    for k, n in enumerate(region.inputs):
        lines.append(f"            const {_ctype(n.dtype)} x{k} = p{k}[j];")
    lines += ["            " + s for s in body]
    lines += [
        f"            po[j] = {names[region.root]};",
        "        }",
        "        }",
        "    }",
        "    return bad;",
        "}",
        "",
    ]
    template = "\n".join(lines)
    key = hashlib.blake2b(template.encode(), digest_size=6).hexdigest()
    symbol = f"tg_fused_{key}"
    source = f"/* generated by tensor_graphs.kernels.c.codegen: {_summary(region)} */\n" \
        + template.replace("int NAME(", f"int {symbol}(", 1)
    return Emitted(source, symbol, key, tuple(n.dtype for n in region.inputs),
                   region.root.dtype, tuple(tuple(int(d) for d in c.shape)
                                            for c in region.constants),
                   checks_pow, names)


def _summary(region: Region) -> str:
    ops = ", ".join(f"{k}x{v}" if v > 1 else k for k, v in region.ops.items())
    ins = ", ".join(f"{n.dtype.name}" for n in region.inputs)
    return f"{len(region.nodes)} elementwise ops ({ops}) over ({ins}) -> {region.root.dtype.name}"


# ---------------------------------------------------------------------------- patterns
def region_pattern(region: Region) -> tuple[pat.Pat, tuple[str, ...]]:
    """The region as a pattern: inputs become ``x0, x1, ...`` (guarded by dtype), inlined
    constants variables that accept only a constant of the same dtype, shape and value (not
    kernel arguments), ops ``OpPat``s (cast keeps its dtype attribute)."""
    built: dict[Node, pat.Pat] = {}
    names = []
    for k, n in enumerate(region.inputs):
        name = f"x{k}"
        built[n] = pat.var(name, dtype=n.dtype)
        names.append(name)
    used: set[str] = set(names)
    for c in region.constants:
        value = uniform_value(c)
        label = repr(value.item())
        if label in used:
            label = f"{label}:{c.dtype.name}"
        if c.ndim:
            label = f"{label}{tuple(int(d) for d in c.shape)}"
        used.add(label)
        built[c] = pat.var(label, where=_same_constant(c.dtype, tuple(c.shape), value))
    users: dict[Node, list[Node]] = {}
    for n in region.nodes:
        for i in n.inputs:
            users.setdefault(i, []).append(n)
    for k, n in enumerate(region.nodes):
        attrs = {"dtype": n.attrs["dtype"]} if n.op.name == "cast" else {}
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


def _same_constant(dtype: DType, shape: tuple, value):
    def accepts(node: Node) -> bool:
        if node.op.name != "constant" or node.dtype != dtype or tuple(node.shape) != shape:
            return False
        other = uniform_value(node)
        if other is None:
            return False
        if dtype.is_float:
            if np.isnan(value):
                return bool(np.isnan(other))
            return bool(other == value and np.signbit(other) == np.signbit(value))
        return bool(other == value)
    return accepts


# ---------------------------------------------------------------------------- calling
def _layout(arrays: Sequence[np.ndarray], shape: tuple[int, ...]):
    """Merged output dims and per-input element strides (0 where broadcast)."""
    strides = []
    for a in arrays:
        view = np.broadcast_to(a, shape)
        strides.append([s // a.itemsize for s in view.strides])
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


def make_function(emitted: Emitted, lib: ctypes.CDLL, description: str):
    """The Python function of a compiled region: numpy arrays in, a new array out."""
    cfn = getattr(lib, emitted.symbol)
    cfn.restype = ctypes.c_int
    cfn.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                    ctypes.c_void_p]
    in_np = tuple(d.np_dtype for d in emitted.input_dtypes)
    out_np = emitted.out_dtype.np_dtype
    const_shapes = emitted.const_shapes
    nin = len(in_np)
    ptr_array = ctypes.c_void_p * (nin + 1)

    def fused(*arrays):
        if len(arrays) != nin:
            raise KernelConstraintError(f"{description}: takes {nin} inputs, got {len(arrays)}")
        arrs = []
        for k, (a, want) in enumerate(zip(arrays, in_np)):
            a = np.asarray(a)
            if a.dtype != want:
                raise KernelConstraintError(f"{description}: input x{k} must be {want}, "
                                            f"got {a.dtype}")
            if any(s % a.itemsize for s in a.strides):
                a = np.ascontiguousarray(a)
            arrs.append(a)
        try:
            shape = np.broadcast_shapes(*(a.shape for a in arrs), *const_shapes)
        except ValueError:
            shown = ", ".join(str(a.shape) for a in arrs)
            raise KernelConstraintError(f"{description}: input shapes {shown} do not "
                                        "broadcast") from None
        out = np.empty(shape, out_np)
        if out.size == 0:
            return out
        dims, strides = _layout(arrs, shape)
        shp = np.asarray(dims, np.int64)
        st = np.asarray(strides, np.int64).reshape(-1) if nin else np.zeros(1, np.int64)
        ptrs = ptr_array(*(a.ctypes.data for a in arrs), out.ctypes.data)
        rc = cfn(out.size, len(dims), shp.ctypes.data, st.ctypes.data, ptrs)
        if rc:
            raise EvaluationError(f"{description}: pow: integers to negative integer powers "
                                  "are undefined")
        return out

    fused.source_text = emitted.source
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


def _random_array(rng, shape, d: DType, special: bool, strided: bool):
    full = tuple(shape[:-1]) + (2 * shape[-1],) if strided and shape else tuple(shape)
    if d.is_bool:
        a = np.asarray(rng.random(full) < 0.5)
    elif d.is_int:
        info = np.iinfo(d.np_dtype)
        lo, hi = (max(info.min, -20), min(info.max, 20)) if not special else (info.min, info.max)
        a = np.asarray(rng.integers(lo, hi, size=full, endpoint=True)).astype(d.np_dtype)
    else:
        a = np.asarray(rng.standard_normal(full) * 2).astype(d.np_dtype)
        a[a == 0] = 0.5  # never zeros
        if special and a.size:
            big = 3e38 if d.name == "float32" else 1e300
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
    comparison, a cast or an overflow). Finite float outputs by norm-wise relative error
    against the float64 evaluation, within max(floor, 16x the error of the native-precision
    evaluations): the tolerance the kernel then declares."""
    from tensor_graphs.ir.evaluate import evaluate
    from tensor_graphs.numerics import relative_error

    rng = np.random.default_rng(seed)
    out_dt = region.root.dtype
    worst = 0.0
    native_worst = 0.0
    shapes_tried = []
    for t, shapes in enumerate(_trial_shapes(region)):
        for special in (False, True):
            strided = t % 2 == 1
            leaves = [_leaf_for(k, n, s) for k, (n, s) in enumerate(zip(region.inputs, shapes))]
            graph = substitute(region.root, dict(zip(region.inputs, leaves)))
            arrays = [_random_array(rng, s, n.dtype, special, strided)
                      for n, s in zip(region.inputs, shapes)]
            feeds = {leaf.name: a for leaf, a in zip(leaves, arrays)}
            try:
                r32 = evaluate(graph, feeds)
                r64 = evaluate(graph, feeds, dtype="float64")
            except EvaluationError:  # integer pow with a negative exponent: both must refuse
                try:
                    fn(*arrays)
                except EvaluationError:
                    arrays = [np.where(a < 0, 0, a).astype(a.dtype)
                              if a.dtype.kind in "iu" else a for a in arrays]
                    feeds = {leaf.name: a for leaf, a in zip(leaves, arrays)}
                    r32 = evaluate(graph, feeds)
                    r64 = evaluate(graph, feeds, dtype="float64")
                else:
                    return CheckReport(False, math.inf, 0.0, shapes_tried,
                                       "the reference raised (integer pow with a negative "
                                       "exponent) but the kernel did not")
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
                bad = ~finite & ~_elementwise_ok(got, r32, r64, rr)
            else:
                bad = ~_elementwise_ok(got, r32, r64, rr)
            if bad.any():
                i = tuple(np.argwhere(bad)[0])
                return CheckReport(False, math.inf, 0.0, shapes_tried,
                                   f"element {i} differs: kernel {got[i]}, reference "
                                   f"{r32[i]} ({out_dt.name}) / {r64[i]} (float64), inputs "
                                   f"{[_at(a, i, got.shape) for a in arrays]}")
            if out_dt.is_float and finite.any():
                worst = max(worst, relative_error(got[finite], r64[finite]))
                native_worst = max(native_worst, relative_error(r32[finite], r64[finite]),
                                   relative_error(rr[finite], r64[finite]))
    if not out_dt.is_float:
        return CheckReport(True, 0.0, EXACT_TOLERANCE, shapes_tried)
    tolerance = max(FLOAT_TOLERANCE[out_dt.name], 16 * native_worst)
    ok = worst <= tolerance
    msg = "" if ok else (f"relative error {worst:.3g} > tolerance {tolerance:.3g} ({out_dt.name} "
                         f"evaluations in numpy: {native_worst:.3g})")
    return CheckReport(ok, worst, tolerance, shapes_tried, msg)


def _at(a: np.ndarray, index: tuple, shape: tuple):
    return np.broadcast_to(a, shape)[index]


def _leaf_for(k: int, n: Node, shape) -> Node:
    from tensor_graphs.ir.builder import input as _input

    return _input(f"x{k}", shape, n.dtype)


# ---------------------------------------------------------------------------- fusing
_lock = threading.RLock()
_by_digest: dict[bytes, registry.Kernel] = {}
_by_source: dict[str, registry.Kernel] = {}
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
                     verify: bool = True) -> registry.Kernel:
    """A C kernel ("c_fused_<hash>") computing the elementwise region rooted at ``root``.

    Emits one C loop, compiles it (``kernels.c.build``, cached on disk), checks it against
    ``tg.evaluate`` on fresh inputs (``check_kernel``; ``KernelVerificationError`` when it
    disagrees) and registers it, so ``tg.kernels.matching`` finds it wherever the same
    subgraph occurs. The kernel takes the region's inputs (``elementwise_region(root).inputs``)
    positionally, in that order. Kernels are cached per structural digest of the region and
    per generated source: asking again returns the same Kernel without compiling.
    Raises ``CCompileError`` when the C compiler fails or is missing.
    """
    region = root if isinstance(root, Region) else elementwise_region(root, inputs, uses=uses)
    digest = region_digest(region)
    with _lock:
        found = _by_digest.get(digest)
        if found is not None:
            stats["digest_hits"] += 1
            if register and registry._KERNELS.get(found.name) is not found:  # noqa: SLF001
                registry.register(found, replace=True)
            return found
        emitted = emit_c(region)
        found = _by_source.get(emitted.key)
        if found is not None:
            stats["source_hits"] += 1
            _by_digest[digest] = found
            if register and registry._KERNELS.get(found.name) is not found:  # noqa: SLF001
                registry.register(found, replace=True)
            return found
        kernel = _build(region, emitted, verify, digest)
        stats["generated"] += 1
        _by_source[emitted.key] = kernel
        _by_digest[digest] = kernel
        if register:
            registry.register(kernel, replace=True)
        return kernel


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

    def match(self, node: Node, uses=None) -> pat.Match | None:
        if node.op.name != self.op:
            return None
        if self.pattern_size <= MAX_PATTERN_MATCH:
            return super().match(node, uses)
        try:
            region = elementwise_region(node, decompose_composites=False)
        except ArgumentError:
            return None
        if region_digest(region) != self.region_digest:
            return None
        bindings = dict(zip(self.inputs, region.inputs))
        if self.constraint_failure([b.shape for b in region.inputs],
                                   [b.dtype for b in region.inputs], dict(node.attrs)):
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


def _build(region: Region, emitted: Emitted, verify: bool, digest: bytes) -> FusedKernel:
    from tensor_graphs.kernels.c.build import load_library

    name = f"c_fused_{emitted.key}"
    pattern, var_names = region_pattern(region)
    size = pattern_size(pattern, MAX_PATTERN_MATCH)
    text = registry.describe(pattern) if size <= MAX_PATTERN_MATCH else "(pattern too large to "\
        "print)"
    summary = f"generated C: {_summary(region)}"
    description = f"{name} ({summary})"
    lib = load_library(name, emitted.source, EXTRA_FLAGS)
    fn = make_function(emitted, lib, description)
    tolerance = EXACT_TOLERANCE if not region.root.dtype.is_float else \
        FLOAT_TOLERANCE[region.root.dtype.name]
    if verify:
        report = check_kernel(fn, region)
        if not report.ok:
            raise KernelVerificationError(f"{description} disagrees with the reference: "
                                          f"{report.message}\npattern: {text[:2000]}\n"
                                          f"{emitted.source}")
        tolerance = report.tolerance
    in_dtypes = emitted.input_dtypes
    const_shapes = emitted.const_shapes

    def where(shapes, dts, attrs):
        for k, (d, want) in enumerate(zip(dts, in_dtypes)):
            if d != want:
                return f"input 'x{k}' must be {want.name}, got {d.name}"
        try:
            broadcast_shapes(*shapes, *const_shapes, op=name)
        except ShapeError as e:
            return str(e)
        return True

    return FusedKernel(
        name=name, pattern=pattern, backend="c", device="cpu", fn=fn, inputs=var_names,
        dtypes=tuple(dict.fromkeys(in_dtypes)) or None, where=where, tolerance=tolerance,
        doc=f"{summary}: {text if len(text) <= 1000 else text[:1000] + '...'}",
        source_hash=registry.source_hash(fn), region_digest=digest, pattern_size=size,
        summary=summary)


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


__all__ = ["ELEMENTWISE", "SUPPORTED_DTYPES", "Region", "Emitted", "CheckReport", "fusable",
           "uniform_value", "elementwise_region", "emit_c", "c_literal", "region_pattern",
           "region_digest", "check_kernel", "evaluate_rounded", "fuse_elementwise", "make_function",
           "cached_kernels", "clear_cache", "stats", "FusedKernel", "pattern_size"]
