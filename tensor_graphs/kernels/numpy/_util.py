"""Helpers shared by the numpy kernels: low-precision handling, dtype checks, a vectorised erf,
and registration of generated kernel functions (explicit signatures, one per op variant)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from itertools import combinations

import numpy as np

from tensor_graphs.ir import dtypes as _dtypes
from tensor_graphs.ir.node import Op
from tensor_graphs.rewrite import pattern as pat

LOW = (np.dtype(np.float16), _dtypes.bfloat16.np_dtype)
F32 = np.dtype(np.float32)


def up(a: np.ndarray) -> np.ndarray:
    """float16/bfloat16 arrays as float32 (the reference computes in float32 and rounds once)."""
    return a.astype(F32) if a.dtype in LOW else a


def out(value, dtype) -> np.ndarray:
    """A result as a new array of ``dtype`` (numpy may hand back a scalar or an input)."""
    arr = np.asarray(value)
    if arr.dtype != dtype:
        return arr.astype(dtype)
    return arr


def into(value, dtype, dest: np.ndarray | None = None) -> np.ndarray:
    """``out(value, dtype)``, or ``value`` written into ``dest`` (cast as ``astype`` would,
    broadcast) and ``dest`` itself returned: the ``writes_out`` contract (see the registry)."""
    if dest is None:
        return out(value, dtype)
    np.copyto(dest, value, casting="unsafe")
    return dest


def ufunc(fn, dtype, dest: np.ndarray | None, *args, **kw) -> np.ndarray:
    """``fn(*args)`` as ``dtype``, written into ``dest`` when given: straight through the
    ufunc's ``out=`` unless an argument is float16/bfloat16 (those compute in float32 and
    round once, as without ``dest``, so both paths give identical results)."""
    if dest is not None and not any(getattr(a, "dtype", None) in LOW for a in args):
        return fn(*args, out=dest, **kw)
    return into(fn(*(up(a) for a in args), **kw), dtype, dest)


def same_dtype(shapes, dtypes, attrs):
    """A ``where`` constraint: every input has one dtype (mixed dtypes take another path)."""
    if len(set(dtypes)) > 1:
        return f"inputs must share one dtype, got {', '.join(d.name for d in dtypes)}"
    return True


def same_float_dtype(*skip: int):
    """A ``where`` constraint: the inputs not at positions ``skip`` share one dtype."""

    def where(shapes, dtypes, attrs):
        kept = [d for i, d in enumerate(dtypes) if i not in skip]
        if len(set(kept)) > 1:
            return f"float inputs must share one dtype, got {', '.join(d.name for d in kept)}"
        return True

    return where


_SQRT_PI = np.sqrt(np.pi)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function in float64 (relative error < 1e-14), vectorised: the Taylor series
    below |x| = 2.5, the continued fraction of erfc above (backward recurrence, 80 terms)."""
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    result = np.empty_like(a)
    small = a < 2.5  # nan goes to the other branch and stays nan
    s = a[small]
    s2 = s * s
    term, total = s.copy(), s.copy()
    for n in range(1, 60):
        term *= -s2 / n
        total += term / (2 * n + 1)
    result[small] = total * (2.0 / _SQRT_PI)
    b = np.minimum(a[~small], 30.0)  # erfc(30) underflows to 0: inf needs no special case
    f = b.copy()
    for k in range(80, 0, -1):
        f = b + (k / 2.0) / f
    result[~small] = 1.0 - np.exp(-b * b) / _SQRT_PI / f
    return np.copysign(result, x)


def with_signature(fn: Callable, params: Sequence[str], attrs: dict, doc: str = "",
                   source: str = "", varargs: str | None = None,
                   writes_out: bool = False) -> Callable:
    """``fn(*arrays, **attrs)`` presented as ``fn(p1, p2, ..., *varargs, a1=..., ...)``: the
    registry reads the tensor parameters (``varargs``: a variadic input, see the registry) and
    the attributes the kernel takes from the signature; ``writes_out`` adds ``out=None``."""
    empty = inspect.Parameter.empty
    sig = [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params]
    if varargs is not None:
        sig.append(inspect.Parameter(varargs, inspect.Parameter.VAR_POSITIONAL))
    sig += [inspect.Parameter(a, inspect.Parameter.KEYWORD_ONLY,
                              default=empty if d is empty else d) for a, d in attrs.items()]
    if writes_out:
        sig.append(inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, default=None))
    fn.__signature__ = inspect.Signature(sig)
    fn.__doc__ = doc
    fn.source_text = source  # registry.source_hash adds this to the wrapper's own source
    return fn


def variants(op: Op) -> list[tuple[tuple[str, ...], str]]:
    """The tensor-parameter subsets a kernel can cover (a fixed-arity pattern): every subset
    of the optional parameters, each with the kernel-name suffix saying what is absent.
    The full form comes first and has no suffix."""
    optional = [p for p in op.params if p in op.optional]
    out = []
    for k in range(len(optional), -1, -1):
        for kept in combinations(optional, k):
            given = tuple(p for p in op.params if p not in op.optional or p in kept)
            missing = [p for p in optional if p not in kept]
            out.append((given, "_no_" + "_".join(missing) if missing else ""))
    return out


def op_pattern(op: Op, given: Sequence[str], names: Sequence[str] | None = None) -> pat.OpPat:
    """The pattern ``op(given...)``; a subset of the optional tensors is pinned by ``args``."""
    names = list(names or given)
    attrs = {} if tuple(given) == op.params else {"args": tuple(given)}
    return pat.OpPat(op.name, tuple(pat.var(n) for n in names), attrs)

