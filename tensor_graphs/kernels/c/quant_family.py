"""One registration for the quantized GEMM kernels: ``<prefix>_matmul<epilogue>`` for each
kind of weight (``Family``) and each epilogue (``EPILOGUES``).

Why one: int8-weight (``c_q8_*``), bf16-weight (``c_bf16_*``), int8-dynamic (``c_q8d_*``),
fp16-weight (``c_f16_*``) and int4-weight (``c_q4_*``) differ only in how the pattern reads
the weight (``dequantize(q, s)``, ``bf16_round(wb)``, ``dequantize_int4(q, s)``),
how it reads the activation (``a``, ``dynamic_quant(a)``), which GEMM runs and how the weight
is packed at bind time; the epilogues, the constraints on the bias and the residual and the
wrappers are the same, and were three near-copies.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from tensor_graphs.ir import api as tg
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.registry import Preparation, kernel
from tensor_graphs.rewrite import pattern as pat

# epilogue suffix -> (a bias, the activation, a residual added after it)
EPILOGUES = (
    ("", False, None, False),                       # a @ W
    ("_bias", True, None, False),                   # a @ W + bias
    ("_bias_relu", True, "relu", False),            # relu(a @ W + bias)
    ("_bias_gelu", True, "gelu", False),            # gelu(a @ W + bias), erf
    ("_bias_gelu_tanh", True, "gelu_tanh", False),  # gelu(a @ W + bias), tanh's formula
    ("_add", False, None, True),                    # a @ W + res
    ("_bias_add", True, None, True),                # a @ W + bias + res
)


def _gelu(approx: str):
    return lambda y: tg.gelu(y, approximate=approx)


# activation -> what the pattern applies
ACT_BUILD = {None: lambda y: y, "relu": tg.relu, "gelu": _gelu("none"),
             "gelu_tanh": _gelu("tanh")}


@dataclass(frozen=True)
class Family:
    """One kind of quantized weight: ``weight(*weight_args)`` is the (K, N) float weight the
    graph multiplies by, ``activation(a)`` the left operand as the graph reads it;
    ``gemm(a, *weight_args, bias, act, out, res)`` computes the product with its epilogue;
    ``prep`` packs ``weight_args[0]`` once per binding; ``signatures(has_bias, residual)`` the
    verification cases."""

    prefix: str
    lib: str  # the C library, whose build failure the constraints report
    weight_args: tuple[str, ...]
    weight: Callable
    weight_dtype: str
    gemm: Callable
    prep: Preparation
    signatures: Callable[[bool, bool], list[dict]]
    source: str
    product: str  # the product as text ("a @ dequantize(q, s)"), for the docstrings
    what: str  # how the kernel computes it, for the docstrings
    activation: Callable = lambda a: a
    # (K, N, the scale's shape) -> None, or why the scale does not fit (default: (1, N), one
    # per output channel)
    scale_check: Callable | None = None


def register(family: Family) -> None:
    """Every epilogue of ``family``."""
    for suffix, has_bias, act, residual in EPILOGUES:
        _register(family, f"{family.prefix}_matmul{suffix}", has_bias, act, residual)


def _register(f: Family, name: str, has_bias: bool, act: str | None, residual: bool) -> None:
    names = ("a", *f.weight_args) + (("bias",) if has_bias else ()) \
        + (("res",) if residual else ())
    v = {n: pat.var(n) for n in names}
    y = f.activation(v["a"]) @ f.weight(*(v[n] for n in f.weight_args))
    if has_bias:
        y = y + v["bias"]
    y = ACT_BUILD[act](y)
    if residual:
        y = y + v["res"]
    nw = len(f.weight_args)

    def run(*args, out=None):
        bias = args[1 + nw] if has_bias else None
        res = args[-1] if residual else None
        return f.gemm(args[0], *args[1:1 + nw], bias, act, out, res)

    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    run.__signature__ = inspect.Signature(
        [inspect.Parameter(n, positional) for n in names]
        + [inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, default=None)])
    run.__doc__ = (f"{act + '(' if act else ''}{f.product}{' + bias' if has_bias else ''}"
                   f"{')' if act else ''}{' + res' if residual else ''}: {f.what}")
    run.__name__ = run.__qualname__ = name
    run.source_text = f.source + f"\n/* {name} */"
    kernel(y, backend="c", name=name, contiguous=True,
           where=_constraint(f, has_bias, residual), tolerance=1e-5,
           signatures=f.signatures(has_bias, residual), writes_out=True,
           prepare={f.weight_args[0]: f.prep})(run)


def _constraint(f: Family, has_bias: bool, residual: bool):
    nw = len(f.weight_args)

    def where(shapes, dtypes, attrs):
        reason = lib.failure(f.lib)
        if reason is not None:
            return reason
        a, w = tuple(shapes[0]), tuple(shapes[1])
        names = [d.name for d in dtypes]
        if names[1] != f.weight_dtype or any(d != "float32" for i, d in enumerate(names)
                                             if i != 1):
            return f"needs float32 operands and a {f.weight_dtype} weight, got {names}"
        if len(a) < 2 or len(w) != 2:
            return f"needs a of rank >= 2 and a 2-D weight, got {a} @ {w}"
        k, n = w
        if a[-1] != k:
            return f"inner dims differ: {a} @ {w}"
        if nw == 2 and f.scale_check is not None:
            why = f.scale_check(k, n, tuple(shapes[2]))
            if why is not None:
                return why
        elif nw == 2 and tuple(shapes[2]) != (1, n):
            return (f"the scale must have shape (1, {n}) (one per output channel), got "
                    f"{tuple(shapes[2])}")
        if has_bias and tuple(shapes[1 + nw]) != (n,):
            return f"bias must have shape ({n},), got {tuple(shapes[1 + nw])}"
        if residual and tuple(shapes[-1]) != a[:-1] + (n,):
            return (f"the added operand must have the product's shape {a[:-1] + (n,)}, got "
                    f"{tuple(shapes[-1])}")
        return True
    return where
