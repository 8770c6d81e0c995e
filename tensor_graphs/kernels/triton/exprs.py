"""Triton expressions of the elementwise atomic ops, with the reference's semantics.

Both renderers (``render.py``, ``rows.py``) write one statement per node of a region through
``node_expr``. Values live in a *compute type*: float16/bfloat16/float32 nodes in float32,
float64 in float64, ints in their own width, bool as ``tl.int1``. A half-precision node's result
is rounded to its dtype after its op (``.to(tl.float16).to(tl.float32)``), which is what the
reference does (numpy computes a float16 op in float32 and rounds once), so additions and
products agree with ``tg.evaluate`` bit for bit and transcendentals within their last bit.

Semantics follow numpy as ``kernels/c/codegen.py``'s C does:
- ``maximum`` propagates NaN (``a > b or a != a ? a : b``, numpy's operand on ties);
- comparisons with NaN are false; ``x != 0`` (a cast to bool) is true for NaN;
- signed integer add/mul/neg wrap around modulo 2**bits (Triton's integer ops do);
- ``sqrt`` and ``reciprocal`` are IEEE (``tl.sqrt_rn``, ``tl.div_rn``), never the GPU's
  approximate instructions; no fused multiply-add (kernels launch with
  ``enable_fp_fusion=False``, as the C kernels compile with ``-ffp-contract=off``);
- exp/log/sin/erf/erfc are libdevice's on a GPU (expf within 2 ulp; ``tl.exp`` is
  ``ex2.approx`` after a rounded multiply, several ulp off for large arguments) and numpy's in
  the interpreter, which cannot call libdevice: the generated module picks at import (the
  interpreter has no erfc: there it is 1 - erf below |x| = 2.5 and erfc's continued fraction
  above (numpy_erf's), not 1 - erf, which loses gelu's tail);
- ``pow`` only with an inlined exponent of 0.5, -1, 1, 2, 3 or 4 (numpy's sqrt, reciprocal and
  square for 0.5, -1, 2; products within an ulp otherwise): a general float pow is libdevice's
  alone, which the interpreter cannot check, and an integer pow's negative exponents raise;
- float -> int casts are not rendered (numpy's out-of-range and NaN results are x86's, which a
  GPU conversion does not give): such a node stays outside the region.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from tensor_graphs.ir.algebra import ELEMENTWISE
from tensor_graphs.ir.dtypes import DType
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import (
    ADD,
    CAST,
    CONSTANT,
    EQUAL,
    ERF,
    ERFC,
    EXP,
    LESS,
    LOG,
    MAXIMUM,
    MUL,
    NEG,
    POW,
    RECIPROCAL,
    SIN,
    SQRT,
    WHERE,
)

# dtype -> (compute type, storage type, AOT signature of a pointer to it)
TYPES: dict[str, tuple[str, str, str]] = {
    "bool": ("tl.int1", "tl.int1", "*i1"),
    "int32": ("tl.int32", "tl.int32", "*i32"),
    "int64": ("tl.int64", "tl.int64", "*i64"),
    "float16": ("tl.float32", "tl.float16", "*fp16"),
    "bfloat16": ("tl.float32", "tl.bfloat16", "*bf16"),
    "float32": ("tl.float32", "tl.float32", "*fp32"),
    "float64": ("tl.float64", "tl.float64", "*fp64"),
}
HALF = frozenset({"float16", "bfloat16"})  # computed in float32, rounded after every op
TRANSCENDENTAL = (EXP, LOG, SIN, ERF, ERFC)  # libdevice on a GPU, numpy in the interpreter
POW_EXPONENTS = (0.5, -1.0, 1.0, 2.0, 3.0, 4.0)  # inlined exponents rendered (see above)


def dtypes() -> frozenset[str]:
    """The dtypes rendered here: bfloat16 only on a real GPU (the interpreter computes it on
    raw bits: 2.5 + 2.0 gave -2.9e-39)."""
    from tensor_graphs.kernels import triton as package

    names = set(TYPES)
    if package.interpreted():
        names.discard("bfloat16")
    return frozenset(names)


def constant_value(node: Node):
    """The one value every element of a 0-d or uniform constant node has, in its dtype (a
    numpy scalar); None for other nodes, empty or non-uniform constants."""
    if node.op.name != CONSTANT or node.dtype.name not in TYPES:
        return None
    arr = np.asarray(node.attrs["value"].array).astype(node.dtype.np_dtype)
    if arr.size == 0:
        return None
    first = arr.reshape(-1)[0]
    if arr.dtype.kind == "f" or node.dtype.name == "bfloat16":
        wide = arr.astype(np.float64)
        f = wide.reshape(-1)[0]
        if math.isnan(f):
            return first if bool(np.isnan(wide).all()) else None
        same = (wide == f) & (np.signbit(wide) == np.signbit(f))
        return first if bool(same.all()) else None
    return first if bool((arr == first).all()) else None


def inlinable(node: Node) -> bool:
    """A 0-d constant of a rendered dtype: a literal in the kernel (larger constants are
    inputs, since their shape takes part in broadcasting)."""
    return node.op.name == CONSTANT and node.ndim == 0 and node.dtype.name in dtypes() \
        and constant_value(node) is not None


def _exponent(node: Node) -> float | None:
    """The inlined exponent of a float pow, when it is one rendered here."""
    e = node.inputs[1]
    if not inlinable(e):
        return None
    v = float(constant_value(e))
    return v if v in POW_EXPONENTS else None


def fusable(node: Node) -> bool:
    """An elementwise atomic op rendered here: its dtype and operands' dtypes are rendered
    dtypes and the op has the reference's semantics in Triton (see the module docstring)."""
    name = node.op.name
    names = dtypes()
    if name not in ELEMENTWISE or node.dtype.name not in names \
            or any(i.dtype.name not in names for i in node.inputs):
        return False
    if name == CAST:
        return not (node.inputs[0].dtype.is_float and node.dtype.is_int)
    if name == POW:
        return node.dtype.is_float and _exponent(node) is not None
    if name == NEG:
        return not node.dtype.is_bool
    return True


def literal(value, d: DType) -> str:
    """A Python literal with exactly this value in dtype ``d`` (the module-level constexpr
    a kernel turns into a scalar of its compute type with ``tl.full``)."""
    if d.is_bool:
        return "1" if bool(value) else "0"
    if d.is_int:
        return repr(int(value))
    v = float(value)  # the dtype's value, exact in float64
    if math.isnan(v):
        return 'float("nan")'
    if math.isinf(v):
        return 'float("inf")' if v > 0 else 'float("-inf")'
    return repr(v)


def compute(d: DType) -> str:
    return TYPES[d.name][0]


def storage(d: DType) -> str:
    return TYPES[d.name][1]


def pointer(d: DType) -> str:
    return TYPES[d.name][2]


def loaded(expr: str, d: DType) -> str:
    """A loaded value in its compute type."""
    return f"{expr}.to(tl.float32)" if d.name in HALF else expr


def rounded(expr: str, d: DType) -> str:
    """A value of a node of dtype ``d`` rounded as the reference rounds it (half: once per
    op, to its dtype)."""
    return f"{expr}.to({storage(d)}).to(tl.float32)" if d.name in HALF else expr


EXACT = frozenset({NEG, MAXIMUM, WHERE, EQUAL, LESS})  # no rounding: a sign, a pick, a truth


def node_expr(n: Node, args: list[str], values: Mapping[Node, object]) -> str:
    """The Triton expression of node ``n`` over its operands' expressions (in compute types),
    rounded as the reference rounds ``n`` (``values``: the inlined constants' values)."""
    e = _op(n, args, values)
    return e if n.op.name in EXACT or n.op.name == CAST else rounded(e, n.dtype)


def _op(n: Node, a: list[str], values: Mapping[Node, object]) -> str:
    name, t = n.op.name, n.dtype
    ct = compute(t)
    if name == CAST:
        return _cast(a[0], n.inputs[0].dtype, t)
    if name == WHERE:
        return f"tl.where({a[0]}, {a[1]}, {a[2]})"
    if name == EQUAL:
        return f"({a[0]} == {a[1]})"
    if name == LESS:
        return f"({a[0]} < {a[1]})"
    if name in TRANSCENDENTAL:
        return f"_{name}({a[0]})"
    if name == SQRT:
        return _sqrt(a[0], ct)
    if name == RECIPROCAL:
        return _reciprocal(a[0], ct)
    if name == NEG:
        return f"(-{a[0]})"
    if name in (ADD, MUL):
        if t.is_bool:
            return f"({a[0]} {'|' if name == ADD else '&'} {a[1]})"
        return f"({a[0]} {'+' if name == ADD else '*'} {a[1]})"
    if name == MAXIMUM:
        if t.is_float:
            return f"_max_nan({a[0]}, {a[1]})"
        return f"({a[0]} | {a[1]})" if t.is_bool else f"tl.maximum({a[0]}, {a[1]})"
    if name == POW:
        return _pow(a[0], float(values[n.inputs[1]]), ct)
    raise AssertionError(f"no Triton for op {name}")  # pragma: no cover - fusable guards


def _sqrt(x: str, ct: str) -> str:
    """IEEE square root: float32's is ``sqrt_rn`` (``tl.sqrt`` is the GPU's approximate
    one); float64's ``tl.sqrt`` is already correctly rounded (sqrt.rn.f64), and ``sqrt_rn``
    takes float32 only."""
    return f"tl.sqrt_rn({x})" if ct == "tl.float32" else f"tl.sqrt({x})"


def _reciprocal(x: str, ct: str) -> str:
    """IEEE 1/x: ``div_rn`` in float32 (``/`` is the GPU's approximate division there),
    ``/`` in float64 (div.rn.f64)."""
    if ct == "tl.float32":
        return f"tl.div_rn(tl.full([], 1.0, {ct}), {x})"
    return f"(tl.full([], 1.0, {ct}) / {x})"


def _pow(x: str, e: float, ct: str) -> str:
    if e == 0.5:
        return _sqrt(x, ct)
    if e == -1.0:
        return _reciprocal(x, ct)
    if e == 1.0:
        return x
    if e == 2.0:
        return f"({x} * {x})"
    if e == 3.0:
        return f"(({x} * {x}) * {x})"
    return f"(({x} * {x}) * ({x} * {x}))"  # 4


def _cast(x: str, src: DType, dst: DType) -> str:
    if dst.is_bool:
        return x if src.is_bool else f"({x} != 0)"
    if dst.name in HALF:  # from a wider value (float32 compute, float64, int): one rounding
        return f"{x}.to({storage(dst)}).to(tl.float32)"
    return f"{x}.to({compute(dst)})"


# The helpers a kernel's ops call: name -> (its ops, its source). A transcendental is numpy's
# function in the interpreter and libdevice's on a GPU, chosen when the module is imported.
HELPERS: dict[str, str] = {
    "_max_nan": """@triton.jit
def _max_nan(a, b):
    # numpy's maximum: NaN in either operand gives NaN; on ties b
    return tl.where((a > b) | (a != a), a, b)
""",
    **{f"_{op}": f"""if INTERPRET:
    @triton.jit
    def _{op}(x):
        return tl.{op}(x)
else:
    @triton.jit
    def _{op}(x):
        return libdevice.{op}(x)
""" for op in TRANSCENDENTAL if op != ERFC},
    "_erfc": """if INTERPRET:
    @triton.jit
    def _erfc(x):
        # no erfc in the interpreter: 1 - erf(x) where |x| < 2.5 (erfc > 4e-4: 3 digits lost at
        # most), else exp(-x^2) / sqrt(pi) / F with F erfc's continued fraction (80 terms,
        # backward), and 2 minus that for x < 0
        a = tl.abs(x)
        b = tl.maximum(tl.minimum(a, 30.0), 2.5)  # erfc(30) underflows; NaN stays NaN
        f = b
        for k in tl.static_range(80, 0, -1):
            f = b + (k * 0.5) / f
        tail = tl.exp(-b * b) * 0.5641895835477563 / f
        return tl.where(a < 2.5, 1.0 - tl.erf(x), tl.where(x < 0, 2.0 - tail, tail))
else:
    @triton.jit
    def _erfc(x):
        return libdevice.erfc(x)
""",
}


def helpers_used(nodes, reductions: bool = False) -> list[str]:
    """The HELPERS the nodes' expressions call (``reductions``: a max reduction's combine)."""
    used = set()
    for n in nodes:
        if n.op.name in TRANSCENDENTAL:
            used.add(f"_{n.op.name}")
        if n.op.name == MAXIMUM and n.dtype.is_float:
            used.add("_max_nan")
    if reductions:
        used.add("_max_nan")
    return sorted(used)


def module_head(title: str, constants: list[tuple[str, str]], helpers: list[str]) -> list[str]:
    """The top of a generated module: imports, the constants as constexprs, the helpers."""
    lines = [f"# generated by tensor_graphs.kernels.triton: {title}",
             "import os", "", "import triton", "import triton.language as tl",
             "from triton.language.extra import libdevice", "",
             'INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")', ""]
    lines += [f"{name} = tl.constexpr({text})" for name, text in constants]
    if constants:
        lines.append("")
    for h in helpers:
        lines += ["", HELPERS[h]]
    return lines


__all__ = ["HALF", "TYPES", "POW_EXPONENTS", "compute", "constant_value", "dtypes", "fusable",
           "helpers_used", "inlinable", "literal", "loaded", "module_head", "node_expr",
           "pointer", "rounded", "storage"]
