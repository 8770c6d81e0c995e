"""C matrix products through OpenBLAS from the ``scipy-openblas32`` wheel, with fused epilogues.

``c_matmul`` (a @ b), ``c_matmul_bias`` (a @ b + bias) and ``c_linear`` (x @ w.T + b, torch's
(out, in) weight layout, no transposed copy) call ``cblas_sgemm``/``dgemm`` once (or once per
batch entry for batched operands with equal batch dims; each writes into ``out=`` when given
one, ``writes_out``); ``*_relu``, ``*_gelu`` and
``*_gelu_tanh`` apply the activation and the bias in one pass over the output. The library
links ``libscipy_openblas.so`` by path with an rpath, so no system BLAS is needed.
"""

from __future__ import annotations

import math

import numpy as np

from tensor_graphs.errors import CCompileError
from tensor_graphs.ir import api as tg
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.c.lib import I32, I64, P, ptr
from tensor_graphs.kernels.c.unary import where_ok
from tensor_graphs.kernels.registry import kernel

LIB = "blas"
SOURCE = lib.source(LIB)
ACTS = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3}
_INT_MAX = 2**31 - 1


def blas_flags() -> tuple[str, ...]:
    """Compiler flags for the scipy-openblas32 headers and library."""
    try:
        import scipy_openblas32 as ob
    except ImportError:
        raise CCompileError("the C BLAS kernels need the scipy-openblas32 package "
                            "(pip install scipy-openblas32)") from None
    lib_dir = ob.get_lib_dir()
    return (f"-I{ob.get_include_dir()}", f"{lib_dir}/lib{ob.get_library()}.so",
            f"-Wl,-rpath,{lib_dir}")


lib._EXTRA_FLAGS[LIB] = blas_flags


def _past_int32(*dims) -> bool:
    """Whether a concrete dim is past the 32-bit BLAS's range. A symbolic one (constraints
    are also asked at a graph's symbolic shapes) is not decided: the call's shapes are."""
    return any(isinstance(d, int) and d > _INT_MAX for d in dims)


def plan_matmul(a_shape, b_shape):
    """(batch, m, n, k, sa, sb, sc, out_shape) for a @ b, or a reason string."""
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    if len(a_shape) < 2 or len(b_shape) < 2:
        return f"needs operands of rank >= 2, got {a_shape} @ {b_shape}"
    k, n = b_shape[-2], b_shape[-1]
    if a_shape[-1] != k:
        return f"inner dims differ: {a_shape} @ {b_shape}"
    if len(b_shape) == 2:  # one gemm over all of a's rows
        m = math.prod(a_shape[:-1])
        plan = (1, m, n, k, 0, 0, 0, a_shape[:-1] + (n,))
    elif a_shape[:-2] == b_shape[:-2]:
        m = a_shape[-2]
        plan = (math.prod(a_shape[:-2]), m, n, k, m * k, k * n, m * n, a_shape[:-1] + (n,))
    else:
        return (f"batch dims must be equal (or b 2-D); no broadcasting of batch dims: "
                f"{a_shape} @ {b_shape}")
    if _past_int32(plan[1], n, k):
        return "a dimension exceeds the 32-bit BLAS's range"
    return plan


def plan_linear(x_shape, w_shape):
    x_shape, w_shape = tuple(x_shape), tuple(w_shape)
    if len(x_shape) < 1 or len(w_shape) != 2:
        return f"needs x of rank >= 1 and a 2-D weight (out, in), got {x_shape}, {w_shape}"
    n, k = w_shape
    if x_shape[-1] != k:
        return f"x's last axis must equal the weight's in_features: {x_shape}, {w_shape}"
    m = math.prod(x_shape[:-1])
    if _past_int32(m, n, k):
        return "a dimension exceeds the 32-bit BLAS's range"
    return (1, m, n, k, 0, 0, 0, x_shape[:-1] + (n,))


def gemm_constraint(lib_name: str, linear: bool, has_bias: bool, packed: bool = False,
                    residual: bool = False):
    """The ``where`` of a GEMM kernel: library ``lib_name`` builds, the shapes plan (see
    ``plan_linear`` / ``plan_matmul``), the bias fits; ``packed``: the weight is 2-D;
    ``residual``: the last operand has the result's shape (added, not broadcast)."""
    def fits(shapes, dtypes, attrs):
        if packed and len(shapes[1]) != 2:
            return f"the weight must be 2-D (it is packed once), got {tuple(shapes[1])}"
        plan = (plan_linear if linear else plan_matmul)(shapes[0], shapes[1])
        if isinstance(plan, str):
            return plan
        if has_bias and tuple(shapes[2]) != (plan[2],):
            return f"bias must have shape ({plan[2]},), got {tuple(shapes[2])}"
        if residual and tuple(shapes[-1]) != tuple(plan[7]):
            return (f"the added operand must have the product's shape {tuple(plan[7])}, "
                    f"got {tuple(shapes[-1])}")
        return True

    return where_ok(lib_name, fits)


def gemm(a, b, bias=None, act=None, linear=False, out=None):
    plan = (plan_linear if linear else plan_matmul)(a.shape, b.shape)
    batch, m, n, k, sa, sb, sc, out_shape = plan
    out = lib.output(out, out_shape, a.dtype)
    suffix = "f32" if a.dtype == np.float32 else "f64"
    fn = lib.func(LIB, f"tg_gemm_{suffix}", P, P, P, P, I64, I64, I64, I64, I64, I64, I64, I32,
                  I32)
    fn(ptr(a), ptr(b), ptr(bias), ptr(out),
       batch, m, n, k, sa, sb, sc, int(linear), ACTS[act])
    return out


def _gelu(approx):
    return lambda y: tg.gelu(y, approximate=approx)


_ACT_BUILD = {None: lambda y: y, "relu": tg.relu, "gelu": _gelu("none"),
              "gelu_tanh": _gelu("tanh")}


def epilogue_kernel(gemm_fn, linear: bool, has_bias: bool, act: str | None, how: str,
                    residual: bool = False):
    """The pattern and the function of one GEMM kernel with its epilogue (bias, activation,
    then ``residual``: + an operand of the result's shape): ``act(x @ weight.T + bias) [+ res]``
    for ``linear``, else ``act(a @ b + bias) [+ res]``; ``gemm_fn(a, b, bias, act, linear, out
    [, res])`` computes it. Shared by the OpenBLAS and the packed GEMMs."""
    build = _ACT_BUILD[act]
    if linear:
        product = ((lambda x, weight, bias: build(tg.linear(x, weight, bias))) if has_bias
                   else (lambda x, weight: build(tg.linear(x, weight))))
    else:
        product = ((lambda a, b, bias: build(a @ b + bias)) if has_bias
                   else (lambda a, b: build(a @ b)))
    pattern = product
    if residual:
        if linear:
            pattern = ((lambda x, weight, bias, res: product(x, weight, bias) + res) if has_bias
                       else (lambda x, weight, res: product(x, weight) + res))
        else:
            pattern = ((lambda a, b, bias, res: product(a, b, bias) + res) if has_bias
                       else (lambda a, b, res: product(a, b) + res))

    if has_bias and residual:
        def run(a, b, bias, res, *, out=None):
            return gemm_fn(a, b, bias, act, linear, out, res)
    elif has_bias:
        def run(a, b, bias, *, out=None):
            return gemm_fn(a, b, bias, act, linear, out)
    elif residual:
        def run(a, b, res, *, out=None):
            return gemm_fn(a, b, None, act, linear, out, res)
    else:
        def run(a, b, *, out=None):
            return gemm_fn(a, b, None, act, linear, out)

    what = "x @ weight.T" if linear else "a @ b"
    run.__doc__ = (f"{act + '(' if act else ''}{what}{' + bias' if has_bias else ''}"
                   f"{')' if act else ''}{' + res' if residual else ''}{how}")
    return pattern, run


def _register(name: str, linear: bool, has_bias: bool, act: str | None):
    pattern, run = epilogue_kernel(gemm, linear, has_bias, act,
                                   " through OpenBLAS, epilogue fused.")
    run.source_text = SOURCE + f"\n/* {name} */"
    kernel(pattern, backend="c", name=name, dtypes=("float32", "float64"), contiguous=True,
           where=gemm_constraint(LIB, linear, has_bias), tolerance=1e-5,
           signatures=_signatures(linear, has_bias), writes_out=True)(run)


def _signatures(linear: bool, has_bias: bool, residual: bool = False) -> list[dict]:
    """Verification cases (m, k, n) at sizes 1, 7, 33, 1025, batched, and float64;
    ``residual``: with ``res`` of the result's shape."""
    out = []
    for m, k, n, lead, dt in ((1, 1, 1, (), "float32"), (7, 33, 9, (), "float32"),
                              (5, 1025, 33, (), "float32"), (33, 7, 1025, (2,), "float32"),
                              (7, 33, 9, (3,), "float64"), (1, 33, 1025, (3,), "float32"),
                              (1, 1025, 7, (), "float64")):  # one row: gemv
        a = (lead + (m, k), dt)
        b = ((n, k) if linear else (k, n), dt)
        sig = {"x": a, "weight": b} if linear else {"a": a, "b": b}
        if has_bias:
            sig["bias"] = ((n,), dt)
        if residual:
            sig["res"] = (lead + (m, n), dt)
        out.append(sig)
    return out


_register("c_matmul", False, False, None)
_register("c_matmul_bias", False, True, None)
_register("c_linear", True, True, None)
_register("c_linear_nobias", True, False, None)
for _act in ("relu", "gelu", "gelu_tanh"):
    _register(f"c_matmul_bias_{_act}", False, True, _act)
    _register(f"c_linear_{_act}", True, True, _act)


def raw_sgemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """OpenBLAS's sgemm alone (for benchmarks): a (m, k) @ b (k, n), float32, contiguous."""
    m, k = a.shape
    n = b.shape[1]
    out = np.empty((m, n), dtype=np.float32)
    lib.func(LIB, "tg_raw_sgemm", P, P, P, I64, I64, I64)(ptr(a), ptr(b),
                                                          ptr(out), m, n, k)
    return out
