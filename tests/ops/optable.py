"""One op table drives the differential tests, the way JAX's ``lax_reference`` and torch's
OpInfo do.

A row (``OpInfo``) holds, for one op or one variant of it: the ``tg.*`` builder, an independent
numpy oracle, optionally the torch function, the dtypes, the cases (shapes, edge shapes among
them, and keywords) and the input domains. The oracles are written here from what each op
means (torch's documented semantics); none calls tensor_graphs, and none copies the reference
implementations of ``tensor_graphs/ir/ops`` (``test_optable.py`` checks that no oracle's code
names ``tg``). ``tests/ops/test_*.py`` parametrize over the rows of their family; the torch
column is compared in separate tests that skip alone when torch is missing, so a numpy-only
install still runs every op-semantics test against the oracles.

How a row's results are compared is its ``check``, a key of ``CHECKS``: the per-dtype
semantics of the atomic ops, bit-exact movement, or the float rule of the composites (float64
to ``tol64``, float32 lifted to float64 to ``tol64`` and, where the row gives ``tol32``, plain
float32 to ``tol32``; ints and bools exactly). Every error is the project's one measure,
``tensor_graphs.numerics.relative_error`` against a float64 oracle.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error

ALL = ("bool", "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64")
INTS = ("uint8", "int8", "int32", "int64")
FLOATS = ("float16", "bfloat16", "float32", "float64")
LOW = ("float16", "bfloat16")
NUM = INTS + FLOATS
NP = {name: getattr(tg, name if name != "bool" else "bool_").np_dtype for name in ALL}
TOL = {"float32": 1e-6, "float64": 1e-12}  # the atomic ops' "dtype" rule
SYMBOLIC_SIZE = 3  # the value a named dim of a case's shape takes when it is drawn


# ------------------------------------------------------------------------------ the table's rows
@dataclass(frozen=True)
class Spec:
    """One case of a row: the shape of each tensor argument (None: an optional one left out;
    a name: a symbolic dim, drawn as SYMBOLIC_SIZE), the keywords given alike to builder, oracle
    and torch function, and, where this case needs other values, its own domain."""

    shapes: tuple
    kwargs: dict
    domain: Any = None

    def __str__(self) -> str:
        kw = "".join(f" {k}={v!r}" for k, v in self.kwargs.items())
        return " ".join(str(s) for s in self.shapes) + kw


def S(*shapes, domain=None, **kwargs) -> Spec:
    return Spec(tuple(None if s is None else tuple(s) for s in shapes), kwargs, domain)


@dataclass(frozen=True)
class OpInfo:
    name: str                       # the row: the op's name, or op_variant
    op: str                         # the op in tensor_graphs.ir.ops.OPS that build makes
    build: Callable                 # (*leaf nodes, **kwargs) -> Node, through tg.*
    oracle: Callable                # (*numpy arrays, **kwargs) -> ndarray; never calls tg
    dtypes: tuple[str, ...]         # the dtypes each case runs in
    cases: Any                      # Specs, or a function of the dtype giving them
    domain: Any = ("any",)          # per input a DOMAINS name or draw function; or one
                                    # function (rng, spec, dtype) -> arrays for the whole case
    torch: Callable | None = None   # (torch, *tensors, **kwargs) -> tensor, None: no such case
    torch_dtypes: tuple[str, ...] | None = None  # where torch is compared (default: dtypes)
    check: str = "dtype"            # one of CHECKS
    tol64: float = 1e-9             # "float": norm-wise error of float64 (and lifted float32)
    tol32: float | None = None      # "float": error of plain float32 against float64, if given
    zero_sign: bool = True          # "dtype"/"exact": -0.0 differs from 0.0
    may_fold: bool = False          # the builder may hand its input back (a no-op cast, slice)
    finite: bool = False            # the oracle must be finite (the case is not vacuous)
    leaves: tuple[str, ...] = ()    # per input: "input" (default) or "state"
    pass_dtype: bool = False        # the builder takes dtype= (a leafless op: iota)
    family: str = ""                # the test module that runs it (set by _family)

    def specs(self, dtype: str) -> list[Spec]:
        return list(self.cases(dtype) if callable(self.cases) else self.cases)


# ------------------------------------------------------------------------------ drawing inputs
def rng_for(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def concrete(shape) -> tuple[int, ...]:
    return tuple(SYMBOLIC_SIZE if isinstance(d, str) else d for d in shape)


def is_float(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" or a.dtype == NP["bfloat16"]


def sample(dtype: str, shape, rng, specials: str = "all", low: int = -100, high: int = 100):
    """Random values of a dtype; floats get nan, +-inf, +-0 and large magnitudes mixed in.

    specials: "all" (nan, +-inf, +-big, +-0), "nocancel" (nan, +-inf, +big: sums whose value
    does not hinge on the summation order), "none".
    """
    shape = tuple(shape)
    n = math.prod(shape)
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if dtype in INTS:
        info = np.iinfo(NP[dtype])
        x = np.asarray(rng.integers(max(low, info.min), min(high, info.max) + 1, shape),
                       NP[dtype])
        if specials == "all" and n >= 4:
            flat = x.reshape(-1)
            flat[rng.choice(n, 2, replace=False)] = (info.min, info.max)
        return x
    x = np.asarray(rng.standard_normal(shape) * 3)
    if specials != "none" and n >= 8:
        big = 6e4 if dtype == "float16" else (1e300 if dtype == "float64" else 1e30)
        extra = [np.nan, np.inf, -np.inf, big]
        extra += [-big, 0.0, -0.0] if specials == "all" else []
        flat = x.reshape(-1)
        flat[rng.choice(n, len(extra), replace=False)] = extra
    return x.astype(NP[dtype])


def _extremes(rng, shape, dtype, spec=None):
    """Normals x3 with nan, +-inf, +-0 and +-40 (exp(40) overflows float16) in up to half the
    places; ints over their whole range with both extremes; bools coin flips."""
    if dtype in INTS:
        info = np.iinfo(NP[dtype])
        x = rng.integers(info.min, info.max, shape, endpoint=True).astype(NP[dtype])
        if x.size >= 2:
            x.reshape(-1)[:2] = (info.min, info.max)
        return x
    if dtype == "bool":
        return rng.random(shape) < 0.5
    x = np.asarray(rng.standard_normal(shape) * 3.0)
    if x.size >= 8:
        extra = [np.nan, np.inf, -np.inf, 0.0, -0.0, 40.0, -40.0][: x.size // 2]
        x.reshape(-1)[rng.choice(x.size, len(extra), replace=False)] = extra
    return x.astype(NP[dtype])


def _normal(scale: float = 1.0, shift: float = 0.0) -> Callable:
    def draw(rng, shape, dtype, spec=None):
        return (rng.standard_normal(shape) * scale + shift).astype(NP[dtype])
    draw.__doc__ = f"normals x{scale:g} {shift:+g}"
    return draw


def _uniform(low: float, high: float) -> Callable:
    def draw(rng, shape, dtype, spec=None):
        return rng.uniform(low, high, shape).astype(NP[dtype])
    return draw


def _ints_small(rng, shape, dtype, spec=None):
    info = np.iinfo(NP[dtype])
    return rng.integers(max(info.min, -3), min(info.max, 3), shape, endpoint=True).astype(
        NP[dtype])


DOMAINS: dict[str, Callable] = {
    # every value class: normals with nan, +-inf, +-0 and the dtype's huge values; ints with
    # their extremes; bools coin flips
    "any": lambda rng, shape, dtype, spec=None: sample(dtype, shape, rng),
    # nan, +-inf and +huge but no -huge: a sum's value does not hinge on the summation order
    "nocancel": lambda rng, shape, dtype, spec=None: sample(dtype, shape, rng, "nocancel"),
    # normals x3 with nan, +-inf, +-0, +-40; ints over their range (the composites' inputs)
    "extremes": _extremes,
    # normals x3 only (no specials): products and running sums stay finite
    "finite": lambda rng, shape, dtype, spec=None: (rng.standard_normal(shape) * 3.0).astype(
        NP[dtype]),
    # the extremes rounded to integers: ties and exact equality happen
    "rounded": lambda rng, shape, dtype, spec=None: np.round(_extremes(rng, shape, dtype)),
    # rounded and quartered: fractional values, nonzero hence True; bools coin flips
    "quarters": lambda rng, shape, dtype, spec=None: _extremes(rng, shape, dtype)
    if dtype == "bool" else (np.round(_extremes(rng, shape, dtype)) * 0.25).astype(NP[dtype]),
    # coin flips, whatever the run's dtype (conditions, masks)
    "bool": lambda rng, shape, dtype, spec=None: rng.random(shape) < 0.5,
    # ints in [-3, 3]: products and squares do not wrap
    "small": _ints_small,
    # standard normals: the nn layers' activations and weights
    "normal": _normal(),
    # uniform in [0.1, 1.1): weights and variances away from zero
    "positive": _uniform(0.1, 1.1),
}


def _domain_fn(d) -> Callable:
    return DOMAINS[d] if isinstance(d, str) else d


def draw(row: OpInfo, spec: Spec, dtype: str) -> list:
    """The case's input values: one array per shape (None where the shape is None)."""
    rng = rng_for(row.name, dtype, str(spec))
    domain = spec.domain if spec.domain is not None else row.domain
    if callable(domain):
        return [None if a is None else np.asarray(a) for a in domain(rng, spec, dtype)]
    out = []
    for i, shape in enumerate(spec.shapes):
        d = domain[min(i, len(domain) - 1)]  # a variadic op repeats the last entry
        out.append(None if shape is None else np.asarray(
            _domain_fn(d)(rng, concrete(shape), dtype, spec)))
    return out


def leaves(dtype: str, arrays, shapes=None, kinds=()):
    """Leaf nodes a, b, c... for the arrays (None stays None), and their feeds: an array of the
    run's dtype makes a leaf of that dtype, any other its own (targets, indices, masks)."""
    nodes, feeds = [], {}
    for i, a in enumerate(arrays):
        if a is None:
            nodes.append(None)
            continue
        name = "abcdefgh"[i]
        shape = a.shape if shapes is None or shapes[i] is None else shapes[i]
        dt = dtype if a.dtype == NP[dtype] else tg.ir.dtypes.from_numpy(a.dtype)
        kind = kinds[i] if i < len(kinds) else "input"
        nodes.append(tg.state(name, shape, dt) if kind == "state" else tg.input(name, shape, dt))
        feeds[name] = a
    return nodes, feeds


def kwargs(row: OpInfo, spec: Spec, dtype: str) -> dict:
    """The keywords of builder, oracle and torch function for one case."""
    return dict(spec.kwargs, dtype=dtype) if row.pass_dtype else spec.kwargs


def build(row: OpInfo, spec: Spec, dtype: str, nodes):
    return row.build(*nodes, **kwargs(row, spec, dtype))


# ------------------------------------------------------------------------------ comparing
def check_close(got, ref, tol: float, what: str = "") -> None:
    """Same shape, same nan and +-inf positions, norm-wise relative error <= tol elsewhere."""
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    g, r = got.astype(np.float64), ref.astype(np.float64)
    assert np.array_equal(np.isnan(g), np.isnan(r)), f"{what}: nan positions differ\n{g}\n{r}"
    inf = np.isinf(r)
    assert np.array_equal(np.isinf(g), inf), f"{what}: inf positions differ\n{g}\n{r}"
    assert np.array_equal(g[inf], r[inf]), f"{what}: inf signs differ"
    fin = np.isfinite(r)
    err = relative_error(g[fin], r[fin])
    assert err <= tol, f"{what}: norm-wise relative error {err:.3g} > {tol:g}"


def check_exact(got, ref, what: str = "", zero_sign: bool = True) -> None:
    """Same dtype, shape and values (nan equals nan; -0.0 differs from 0.0 if zero_sign)."""
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.dtype == ref.dtype, (what, got.dtype, ref.dtype)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    if is_float(got):
        g, r = got.astype(np.float64), ref.astype(np.float64)
        same = (g == r) | (np.isnan(g) & np.isnan(r))
        assert same.all(), f"{what}: values differ at {np.argwhere(~same)[:5].tolist()}"
        if zero_sign:
            assert np.array_equal(np.signbit(g[g == 0]), np.signbit(r[g == 0])), f"{what}: -0.0"
    else:
        assert np.array_equal(got, ref), f"{what}:\n{got}\n{ref}"


def check_dtype_semantics(got, ref_fn, args, dtype: str, what: str = "",
                          zero_sign: bool = True, kwargs=None) -> None:
    """``ref_fn`` is an independent numpy expression; floats are computed per the dtype rule."""
    kwargs = kwargs or {}
    if dtype in LOW:  # compute in float32, round once
        ref = np.asarray(ref_fn(*[a.astype(np.float32) if a.dtype == NP[dtype] else a
                                  for a in args], **kwargs))
        ref = ref.astype(np.float32).astype(NP[dtype]) if ref.dtype.kind == "f" else ref
        check_exact(got, ref, what, zero_sign)
    elif dtype in ("float32", "float64"):
        ref = np.asarray(ref_fn(*[a.astype(np.float64) if a.dtype.kind == "f" else a
                                  for a in args], **kwargs))
        if ref.dtype.kind == "f":
            check_close(got, ref.astype(NP[dtype]), TOL[dtype], what)
            assert got.dtype == NP[dtype], (what, got.dtype)
        else:
            check_exact(got, ref, what)
    else:
        check_exact(got, np.asarray(ref_fn(*args, **kwargs)), what)  # gives the result dtype


def lift(a):
    """float64 values of a float array (the oracle's precision); other arrays unchanged."""
    return a if a is None or not is_float(a) else a.astype(np.float64)


def _check_result(row: OpInfo, got, ref, tol: float, what: str, dtype: str) -> None:
    """The float rule's comparison: bools and ints exactly (dtype included), floats to tol in
    ``dtype`` (the run's, or float64 when lifted)."""
    ref = np.asarray(ref)
    if row.finite:
        assert np.isfinite(ref.astype(np.float64)).all(), f"{what}: the oracle is not finite"
    if ref.dtype.kind in "biu":
        check_exact(got, ref, what)
    else:
        assert got.dtype == NP[dtype], (what, got.dtype, dtype)
        check_close(got, ref, tol, what)


def assert_atomic(y) -> None:
    bad = {n.op.name for n in tg.nodes(tg.decompose(y)) if not n.op.is_atomic}
    assert not bad, f"decomposition still holds composites {bad}"


def check_graph(y, feeds: dict, ref, tol64: float = 1e-9, tol32: float | None = 1e-5) -> None:
    """A hand-built graph (symbolic dims, odd dtypes) against an oracle's float64 ``ref``: its
    float64-lifted evaluation to tol64, its plain evaluation to tol32, and a fully atomic
    decomposition."""
    ref = np.asarray(ref, np.float64)
    got64 = tg.evaluate(y, feeds, dtype="float64")
    assert got64.dtype == np.float64
    check_close(got64, ref, tol64, "float64")
    if tol32 is not None:
        got = tg.evaluate(y, feeds)
        assert got.dtype == y.dtype.np_dtype
        check_close(got, ref, tol32, str(y.dtype))
    assert_atomic(y)


def _dtype_rule(row, spec, dtype, arrays, got, what) -> None:
    check_dtype_semantics(got, row.oracle, arrays, dtype, what, row.zero_sign,
                          kwargs(row, spec, dtype))


def _exact_rule(row, spec, dtype, arrays, got, what) -> None:
    check_exact(got, np.asarray(row.oracle(*arrays, **kwargs(row, spec, dtype))), what,
                row.zero_sign)


def _float_rule(row, spec, dtype, arrays, got, what) -> None:
    ref = np.asarray(row.oracle(*[lift(a) for a in arrays], **kwargs(row, spec, dtype)))
    if dtype == "float64" or dtype not in FLOATS:
        _check_result(row, got, ref, row.tol64, what, "float64")
        return
    assert dtype == "float32", f"{row.name}: the float rule runs float64 and float32, not {dtype}"
    nodes, feeds = leaves(dtype, arrays, spec.shapes, row.leaves)
    lifted = tg.evaluate(build(row, spec, dtype, nodes), feeds, dtype="float64")
    _check_result(row, lifted, ref, row.tol64, what + " (float32 lifted)", "float64")
    if row.tol32 is not None and ref.dtype.kind == "f":
        _check_result(row, got, ref, row.tol32, what + " (float32)", "float32")


CHECKS: dict[str, Callable] = {
    # atomic ops: float64 to 1e-12, float32 to 1e-6 against float64, float16/bfloat16 exactly
    # the float32 result rounded once, ints and bool exactly (wrapping like numpy and torch)
    "dtype": _dtype_rule,
    # movement and selection: every dtype bit for bit
    "exact": _exact_rule,
    # composites: float64 and lifted float32 to tol64, plain float32 to tol32, ints exactly
    "float": _float_rule,
}


def check_oracle(row: OpInfo, dtype: str) -> None:
    """Every case of ``row`` in ``dtype``, evaluated by tg, against the numpy oracle."""
    for spec in row.specs(dtype):
        what = f"{row.name} {dtype} {spec}"
        arrays = draw(row, spec, dtype)
        nodes, feeds = leaves(dtype, arrays, spec.shapes, row.leaves)
        y = build(row, spec, dtype, nodes)
        if not (row.may_fold and y.op.is_leaf):
            assert y.op.name == row.op, (what, y.op.name)
        got = tg.evaluate(y, feeds)
        if all(isinstance(d, int) for d in y.shape):
            assert got.shape == tuple(y.shape), (what, got.shape, y.shape)
        assert got.dtype == y.dtype.np_dtype, (what, got.dtype, y.dtype)
        CHECKS[row.check](row, spec, dtype, arrays, got, what)
        if not y.op.is_atomic:
            assert_atomic(y)


def torch_of(torch, a, lifted: bool = True):
    """A torch tensor of a numpy array (a copy, 0-d kept 0-d); floats float64 when lifted."""
    if a is None:
        return None
    if is_float(a) and (lifted or a.dtype == NP["bfloat16"]):
        return torch.from_numpy(a.astype(np.float64))
    return torch.from_numpy(np.array(a, copy=True))


def check_torch(row: OpInfo, dtype: str, torch) -> None:
    """Every case of ``row`` in ``dtype`` against torch's function: floats lifted to float64
    (to 1e-12 for "dtype", exactly for "exact", to tol64 for "float"), the float rule's plain
    float32 against torch's float32 to tol32, ints and bools exactly."""
    compared = 0
    for spec in row.specs(dtype):
        what = f"{row.name} {dtype} {spec} vs torch"
        arrays = draw(row, spec, dtype)
        ref = row.torch(torch, *[torch_of(torch, a) for a in arrays], **kwargs(row, spec, dtype))
        if ref is None:
            continue  # torch has no such case (the row's torch column says why)
        compared += 1
        ref = ref.numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
        nodes, feeds = leaves(dtype, arrays, spec.shapes, row.leaves)
        y = build(row, spec, dtype, nodes)
        got = tg.evaluate(y, feeds, dtype="float64")
        if ref.dtype.kind != "f":
            check_exact(got, ref.astype(got.dtype), what)
        elif row.check == "exact":
            check_exact(got, ref, what, row.zero_sign)
        else:
            assert got.dtype == np.float64, (what, got.dtype)
            check_close(got, ref, TOL["float64"] if row.check == "dtype" else row.tol64, what)
        if row.check == "float" and dtype == "float32" and row.tol32 is not None:
            ref32 = row.torch(torch, *[torch_of(torch, a, lifted=False) for a in arrays],
                              **kwargs(row, spec, dtype)).numpy()
            got32 = tg.evaluate(y, feeds)
            if ref32.dtype.kind == "f":
                check_close(got32, ref32, row.tol32, what + " (float32)")
    assert compared or not row.specs(dtype), f"{row.name} {dtype}: torch compared no case"


# ------------------------------------------------------------------------------ oracles: atomic
_erf64 = np.vectorize(math.erf, otypes=[np.float64])


def _erf_ref(x):
    return np.asarray(_erf64(x)).astype(x.dtype)


def _wrap(fn):
    """An int expression computed in int64 (Python-exact for our ranges), wrapped to the dtype."""
    def ref(*xs, **kw):
        if xs[0].dtype.kind in "iu":
            return fn(*[x.astype(np.int64) for x in xs], **kw).astype(xs[0].dtype)
        return fn(*xs, **kw)
    return ref


def _bool_or_int(fn_bool, fn):
    return lambda a, b: fn_bool(a, b) if a.dtype == np.bool_ else _wrap(fn)(a, b)


def _nan_max(a, b):
    return np.where(np.isnan(b), b, np.where((a > b) | np.isnan(a), a, b))


def _maximum_ref(a, b):
    if a.dtype == np.bool_:
        return a | b
    return _nan_max(a, b) if a.dtype.kind == "f" else np.where(a > b, a, b)


def _where_ref(c, a, b):
    shape = np.broadcast_shapes(c.shape, a.shape, b.shape)
    return np.choose(np.broadcast_to(c, shape).astype(np.intp),
                     [np.broadcast_to(b, shape), np.broadcast_to(a, shape)])


def _cast_ref(x: np.ndarray, dst: str) -> np.ndarray:
    """Independent: Python's int() truncates toward zero; nonzero is True; ints wrap mod 2**n."""
    if dst == "bool":
        return np.array([bool(v) for v in x.astype(np.float64).ravel()], bool).reshape(x.shape)
    if dst in INTS and is_float(x):
        vals = [int(v) for v in x.astype(np.float64).ravel()]
        return np.array(vals, np.int64).reshape(x.shape).astype(NP[dst])
    if dst in INTS:
        bits = np.iinfo(NP[dst]).bits
        vals = [int(v) % (1 << bits) for v in x.astype(np.int64).ravel()]
        return np.array(vals, np.uint64).reshape(x.shape).astype(NP[dst])
    return x.astype(NP[dst])  # float targets: one direct rounding


def reduced_axes(axis, ndim) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    return tuple(a % ndim for a in ((axis,) if isinstance(axis, int) else axis))


def _sum_ref(v, axis=None, keepdims=False):
    axes = reduced_axes(axis, v.ndim)
    if v.dtype.kind in "iub":  # exact in int64 for these ranges, then wrapped (bool counts)
        out = np.int64 if v.dtype == np.bool_ else v.dtype
        return v.astype(np.int64).sum(axis=axes, keepdims=keepdims).astype(out)
    return np.add.reduce(v, axis=axes, keepdims=keepdims, dtype=v.dtype)


def _max_ref(v, axis=None, keepdims=False):
    """Sort-free: a running maximum that lets nan win."""
    axes = reduced_axes(axis, v.ndim)
    m = np.moveaxis(v, axes, tuple(range(-len(axes), 0)))
    kept = m.shape[:m.ndim - len(axes)]
    m = m.reshape(kept + (math.prod(m.shape[len(kept):]),))
    out = m[..., 0]
    for k in range(1, m.shape[-1]):
        out = np.where(m[..., k] > out, m[..., k], out)
    if m.dtype.kind == "f":
        out = np.where(np.isnan(m).any(-1), np.nan, out).astype(v.dtype)
    if keepdims:
        out = out.reshape(tuple(1 if i in axes else n for i, n in enumerate(v.shape)))
    return out


def _reshape_ref(v, target):
    return v.ravel().reshape(target)


def _permute_ref(v, perm):
    """By index arithmetic, not np.transpose."""
    out = np.empty(tuple(v.shape[p] for p in perm), v.dtype)
    for idx in np.ndindex(*out.shape):
        src = [0] * v.ndim
        for i, p in enumerate(perm):
            src[p] = idx[i]
        out[idx] = v[tuple(src)]
    return out


def _expand_ref(v, target):
    v = v.reshape((1,) * (len(target) - v.ndim) + v.shape)
    for axis, n in enumerate(target):
        if v.shape[axis] != n:
            v = np.concatenate([v] * n, axis=axis) if n else np.take(v, [], axis)
    return v


def _slice_ref(v, index):
    """Element by element from range()."""
    ranges = [range(*s.indices(n)) for s, n in zip(index, v.shape)]
    ranges += [range(n) for n in v.shape[len(index):]]
    out = np.empty(tuple(len(r) for r in ranges), v.dtype)
    for idx in np.ndindex(*out.shape):
        out[idx] = v[tuple(r[i] for r, i in zip(ranges, idx))]
    return out


def _pad_ref(v, pads, value=0.0):
    """torch's F.pad order (last axis first); a negative width crops."""
    widths = [(0, 0)] * v.ndim
    for k in range(len(pads) // 2):
        widths[v.ndim - 1 - k] = (pads[2 * k], pads[2 * k + 1])
    crop = tuple(slice(max(-lo, 0), n - max(-hi, 0)) for n, (lo, hi) in zip(v.shape, widths))
    v = v[crop]
    widths = [(max(lo, 0), max(hi, 0)) for lo, hi in widths]
    out = np.full(tuple(n + lo + hi for n, (lo, hi) in zip(v.shape, widths)), value, v.dtype)
    out[tuple(slice(lo, lo + n) for n, (lo, _) in zip(v.shape, widths))] = v
    return out


def _concat_ref(*xs, axis=0):
    """Each block placed by index."""
    ax = axis % xs[0].ndim
    shape = list(xs[0].shape)
    shape[ax] = sum(x.shape[ax] for x in xs)
    out = np.empty(shape, xs[0].dtype)
    at = 0
    for v in xs:
        idx = [slice(None)] * v.ndim
        idx[ax] = slice(at, at + v.shape[ax])
        out[tuple(idx)] = v
        at += v.shape[ax]
    return out


def _gather_ref(x, i, axis=0):
    ax = axis % x.ndim
    out = np.empty(x.shape[:ax] + i.shape + x.shape[ax + 1:], x.dtype)
    for out_idx in np.ndindex(*out.shape):
        j = i[out_idx[ax:ax + i.ndim]]
        out[out_idx] = x[out_idx[:ax] + (j,) + out_idx[ax + i.ndim:]]
    return out


def _matmul_ref(u, v):
    """As explicit products and sums."""
    u2 = u if u.ndim > 1 else u[None]
    v2 = v if v.ndim > 1 else v[:, None]
    out = (u2[..., :, :, None] * v2[..., None, :, :]).sum(-2)
    if u.ndim == 1:
        out = out[..., 0, :]
    if v.ndim == 1:
        out = out[..., 0]
    return out


def _state_update_ref(s, v, offset, axis):
    out_shape = list(s.shape)
    out_shape[axis] = max(s.shape[axis], offset + v.shape[axis])
    ref = np.zeros(out_shape, s.dtype)
    for idx in np.ndindex(*s.shape):
        ref[idx] = s[idx]
    for idx in np.ndindex(*v.shape):
        j = list(idx)
        j[axis] += offset
        ref[tuple(j)] = v[idx]
    return ref


# ------------------------------------------------------------------------------ atomic rows
UNARY_SHAPES = [S(()), S((1,)), S((7,)), S((33,)), S((0,)), S((3, 0)), S((2, 7))]
BINARY_SHAPES = [S((7,), (7,)), S((1,), (33,)), S((33,), ()), S((7, 1), (1, 33)),
                 S((0, 3), (3,)), S((2, 1, 7), (3, 1)), S((), ())]
RED_CASES = [S((7,), axis=None, keepdims=False), S((33,), axis=0, keepdims=True),
             S((1,), axis=-1, keepdims=False), S((3, 7, 33), axis=(0, 2), keepdims=False),
             S((3, 7, 33), axis=1, keepdims=True), S((3, 7, 33), axis=None, keepdims=True),
             S((0, 3), axis=1, keepdims=False), S((2, 0, 3), axis=(0, 2), keepdims=True),
             S((2, 7), axis=-2, keepdims=False)]
SLICES = [((33,), (slice(2, 30, 3),)), ((33,), (slice(None, None, -1),)),
          ((33,), (slice(-3, 4, -5),)), ((7,), (slice(100, None),)), ((7,), (slice(-100, 3),)),
          ((7, 33), (slice(1, -1), slice(None, None, -7))), ((1,), (slice(0, 1),)),
          ((7,), (slice(5, 2),)), ((0, 7), (slice(None), slice(1, 3))),
          ((7,), (slice(-8, 3, -2),)), ((7,), (slice(-100, None, -1),)),  # start before 0
          ((3, 7, 33), (slice(None), slice(6, None, -2), slice(32, 0, -31)))]
MATMUL_SHAPES = [S((7,), (7,)), S((1, 7), (7, 33)), S((33,), (33, 7)), S((7, 33), (33,)),
                 S((2, 3, 7), (7, 5)), S((3, 1, 4, 7), (2, 7, 5)), S((0, 7), (7, 3)),
                 S((3, 0), (0, 4)), S((1, 1), (1, 1))]


def _ties(rng, spec, dtype):
    """Two operands; where their shapes agree, b repeats half of a (ties and equal values)."""
    sa, sb = (concrete(s) for s in spec.shapes)
    a, b = sample(dtype, sa, rng), sample(dtype, sb, rng)
    if sa == sb and a.size:
        b = b.copy()
        b.reshape(-1)[: b.size // 2] = a.reshape(-1)[: b.size // 2]
    return a, b


def _pow_domain(rng, spec, dtype):
    """Ints: small bases, exponents in [0, 3] (no overflow, no negative exponent)."""
    sa, sb = (concrete(s) for s in spec.shapes)
    if dtype not in INTS:
        return sample(dtype, sa, rng), sample(dtype, sb, rng)
    a, b = sample(dtype, sa, rng, "none", -5, 5), sample(dtype, sb, rng, "none", 0, 3)
    if dtype == "uint8":
        a = sample(dtype, sa, rng, "none", 0, 6)
    return a, b


def _cast_source(rng, spec, dtype):
    """Values each (src, dst) pair defines: float -> int inside the target's range only."""
    src, dst, shape = dtype, spec.kwargs["dst"], concrete(spec.shapes[0])
    if src in FLOATS and dst in INTS:
        info = np.iinfo(NP[dst])
        lo, hi = max(info.min, -1e4), min(info.max, 1e4)
        x = rng.uniform(lo, hi, shape)
        return (x.astype(NP[src]).clip(lo, hi),)  # clip again: rounding may step outside
    if src in FLOATS and dst == "bool":
        x = sample(src, shape, rng)
        if x.size >= 4:
            x.reshape(-1)[:4] = [0.5, -0.25, 0.0, -0.0]
        return (x,)
    if src in INTS and dst in LOW:
        return (sample(src, shape, rng, "none", -2000, 2000),)
    return (sample(src, shape, rng, "all", -3000, 3000),)


def _matmul_domain(rng, spec, dtype):
    """Ints in [-5, 5]; floats with inf and nan but no huge values (they would cancel in an
    order-dependent way)."""
    specials = "none" if dtype in INTS else "nocancel"
    out = []
    for s in spec.shapes:
        v = sample(dtype, concrete(s), rng, specials, -5, 5)
        if dtype in FLOATS:
            v = np.where(np.abs(v.astype(np.float64)) > 100, np.inf, v).astype(v.dtype)
        out.append(v)
    return out


def index(idx_dtype: str) -> Callable:
    """In-range indices along the case's axis of input 0 (zeros where that axis is empty)."""
    def draw(rng, shape, dtype, spec):
        n = concrete(spec.shapes[0])[spec.kwargs.get("axis", 0)]
        idx = rng.integers(0, n, shape) if n else np.zeros(shape, np.int64)
        return idx.astype(NP[idx_dtype])
    return draw


def _pad_cases(dtype: str) -> list[Spec]:
    values = ([0.0, np.nan, -np.inf, 2.5] if dtype in FLOATS else
              {"bool": [True], "uint8": [7], "int8": [-3]}.get(dtype, [0, -5]))
    cases = [S(shape, pads=pads, value=v) for shape, pads in [
        ((7,), (1, 2)), ((2, 7), (0, 0, 3, 1)), ((0, 3), (1, 1, 2, 0)), ((1,), (33, 0)),
        ((2, 3, 4), (1, 0, 0, 2))] for v in values]
    return cases + [S((5, 6), pads=(-1, 2, 0, -2), value=values[0])]  # negative widths crop


def _torch_slice(torch, t, index):
    for axis, s in enumerate(index):  # torch has no negative steps: select the indices
        start, stop, step = s.indices(t.shape[axis])
        t = t.index_select(axis, torch.tensor(list(range(start, stop, step)), dtype=torch.long))
    return t


def _torch_gather(torch, t, j, axis):
    ax = axis % t.ndim
    if j.dtype != torch.int64 or t.shape[ax] == 0:
        return None  # index_select wants int64 indices and a non-empty axis
    picked = torch.index_select(t, ax, j.reshape(-1))
    return picked.reshape(t.shape[:ax] + j.shape + t.shape[ax + 1:])


def _torch_cast(torch, x, dst):
    if x.is_floating_point() and dst in FLOATS:
        return None  # torch rounds float64 -> bfloat16 through float32 (twice)
    target = {"bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8, "int32": torch.int32,
              "int64": torch.int64}.get(dst, torch.float64)
    return x.to(target)


def _torch_sum(torch, t, axis=None, keepdims=False):
    return torch.sum(t, dim=reduced_axes(axis, t.ndim), keepdim=keepdims,
                 dtype=torch.int64 if t.dtype == torch.bool else t.dtype)


def _unary(name, build, oracle, torch_name, dtypes=FLOATS):
    return OpInfo(name, name, build, oracle, dtypes, UNARY_SHAPES,
                  torch=lambda torch, x: torch.special.erf(x) if torch_name == "erf"
                  else getattr(torch, torch_name)(x))


def _binary(name, build, oracle, torch_name, dtypes=ALL, domain=("any", "any")):
    return OpInfo(name, name, build, oracle, dtypes, BINARY_SHAPES, domain=domain,
                  torch=lambda torch, a, b: getattr(torch, torch_name)(a, b))


ATOMIC = [
    _unary("neg", tg.neg, _wrap(lambda x: x * -1), "neg", NUM),
    _unary("exp", tg.exp, lambda x: np.e ** x, "exp"),
    _unary("log", tg.log, np.log, "log"),
    _unary("sqrt", tg.sqrt, lambda x: x ** 0.5, "sqrt"),
    _unary("reciprocal", tg.reciprocal, lambda x: 1 / x, "reciprocal"),
    _unary("sin", tg.sin, np.sin, "sin"),
    _unary("erf", tg.erf, _erf_ref, "erf"),
    _binary("add", tg.add, _bool_or_int(lambda a, b: a | b, lambda a, b: a + b), "add"),
    _binary("mul", tg.mul, _bool_or_int(lambda a, b: a & b, lambda a, b: a * b), "mul"),
    _binary("maximum", tg.maximum, _maximum_ref, "maximum", domain=_ties),
    _binary("pow", tg.pow, _wrap(lambda a, b: a ** b), "pow", NUM, domain=_pow_domain),
    _binary("equal", tg.equal, lambda a, b: a == b, "eq", domain=_ties),
    _binary("less", tg.less, lambda a, b: a < b, "lt", domain=_ties),
    OpInfo("where", "where", tg.where, _where_ref, ALL,
           [S((7,), (7,), (7,)), S((33,), (), (1,)), S((7, 1), (1, 33), (33,)), S((0,), (1,), ()),
            S((), (7,), (7,))], domain=("bool", "any", "any"), check="exact",
           torch=lambda torch, c, a, b: torch.where(c, a, b)),
    OpInfo("cast", "cast", lambda a, dst: tg.cast(a, dst), _cast_ref, ALL,
           [S(shape, dst=dst) for dst in ALL for shape in [(33,), (1,), (0,), (2, 7)]],
           domain=_cast_source, check="exact", may_fold=True, torch=_torch_cast),
    OpInfo("sum", "sum", lambda a, axis, keepdims: tg.sum(a, axis=axis, keepdims=keepdims),
           _sum_ref, ALL, RED_CASES, domain=("nocancel",), torch=_torch_sum),
    # which of two tied zeros (0.0, -0.0) max returns is not specified
    OpInfo("max", "max", lambda a, axis, keepdims: tg.max(a, axis=axis, keepdims=keepdims),
           _max_ref, ALL, RED_CASES,
           zero_sign=False,
           torch=lambda torch, t, axis, keepdims: torch.amax(t, dim=reduced_axes(axis, t.ndim),
                                                     keepdim=keepdims)),
    OpInfo("reshape", "reshape", lambda a, target: a.reshape(target), _reshape_ref, ALL,
           [S((33,), target=(3, 11)), S((2, 7), target=(-1,)), S((3, 0), target=(0, 5)),
            S((1,), target=()), S((), target=(1, 1)), S((2, 3, 7), target=(7, -1, 3)),
            S((4, 6), target=(2, 2, 3, 2))], check="exact",
           torch=lambda torch, t, target: t.reshape(target)),
    OpInfo("permute", "permute", lambda a, perm: a.permute(perm), _permute_ref, ALL,
           [S((7, 33), perm=(1, 0)), S((2, 3, 7), perm=(2, 0, 1)), S((1, 0, 3), perm=(1, 2, 0)),
            S((2, 3, 4, 5), perm=(3, 1, 0, 2))], check="exact",
           torch=lambda torch, t, perm: t.permute(perm)),
    OpInfo("expand", "expand", lambda a, target: a.expand(target), _expand_ref, ALL,
           [S((1,), target=(33,)), S((7, 1), target=(7, 33)), S((1, 1), target=(0, 7)),
            S((3, 1, 1), target=(3, 7, 2)), S((), target=(7,))], check="exact",
           torch=lambda torch, t, target: t.expand(target)),
    OpInfo("slice", "slice", lambda a, index: a[index], _slice_ref, ALL,
           [S(shape, index=index) for shape, index in SLICES], check="exact", may_fold=True,
           torch=_torch_slice),
    OpInfo("pad", "pad", lambda a, pads, value: tg.pad(a, pads, value=value), _pad_ref, ALL,
           _pad_cases, check="exact", torch_dtypes=tuple(d for d in ALL if d != "bool"),
           torch=lambda torch, t, pads, value: torch.nn.functional.pad(t, pads, value=value)),
    OpInfo("concat", "concat", lambda *xs, axis: tg.concat(xs, axis=axis), _concat_ref, ALL,
           [S((7,), (33,), axis=0), S((2, 7), (2, 1), (2, 33), axis=1), S((1, 3), (0, 3), axis=0),
            S((2, 3, 4), (2, 3, 4), (2, 3, 4), axis=-1), S((0,), (0,), axis=0)], check="exact",
           torch=lambda torch, *ts, axis: torch.cat(ts, dim=axis)),
    OpInfo("gather", "gather", lambda a, i, axis: tg.gather(a, i, axis=axis), _gather_ref, ALL,
           [S(shape, idx, axis=axis, domain=("any", index(idx_dtype)))
            for shape, idx, axis in [((33,), (7,), 0), ((7, 33), (2, 3), 1), ((7, 3), (), 0),
                                     ((1, 7), (0,), 1), ((2, 7, 3), (33,), -2),
                                     ((0, 3), (4,), 1)]
            for idx_dtype in ("int64", "int32", "uint8")], check="exact", torch=_torch_gather),
    # torch has no integer matmul of a vector
    OpInfo("matmul", "matmul", tg.matmul, _wrap(_matmul_ref), NUM, MATMUL_SHAPES,
           domain=_matmul_domain,
           torch=lambda torch, a, b: None if not a.is_floating_point() and min(a.ndim, b.ndim) < 2
           else torch.matmul(a, b)),
    OpInfo("iota", "iota", lambda n, dtype: tg.iota(n, dtype),
           lambda n, dtype: np.array(list(range(n)), NP[dtype]), NUM,
           [S(n=n) for n in (0, 1, 7, 33)], check="exact", pass_dtype=True),
    OpInfo("copy_to", "copy_to", lambda a: tg.copy_to(a, "cuda:0"), lambda x: np.array(x), ALL,
           [S(()), S((7,)), S((0, 3)), S((7, 33))], check="exact"),
    OpInfo("state_update", "state_update",
           lambda s, v, offset, axis: tg.state_update(s, v, offset=offset, axis=axis),
           _state_update_ref, ALL,
           [S((2, 7, 4), (2, 1, 4), offset=7, axis=1), S((2, 7, 4), (2, 3, 4), offset=2, axis=1),
            S((7,), (33,), offset=0, axis=0), S((0, 3), (1, 3), offset=0, axis=0),
            S((3, 7), (3, 0), offset=7, axis=1), S((5, 2), (2, 2), offset=4, axis=0)],
           check="exact", leaves=("state", "input")),
]


# ------------------------------------------------------------------------------ oracles: composites
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _gelu(x, approximate="none"):
    """x * Phi(x); the tanh form 0.5 x (1 + tanh(z)) as x * sigmoid(2 z), its value without
    the cancellation of 1 + tanh(z) for x < -4."""
    if approximate == "tanh":
        z = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
        return x * _sigmoid(2.0 * z)
    return 0.5 * x * (1.0 + _erf64(x / math.sqrt(2.0)))


def _gelu_tanh_domain(rng, shape, dtype, spec=None):
    """The extremes with x in (-30, -4) reflected to -x: there tg's 0.5 x (1 + tanh(z)), like
    torch's, cancels to a relative error up to 1e-3 (see test_gelu_tanh_tail); -40 and -inf
    stay (their value is -0.0 and nan in every form)."""
    x = _extremes(rng, shape, dtype)
    return np.where((x < -4) & (x > -30), -x, x).astype(x.dtype)


def _elu(x, alpha=1.0):
    return np.where(x > 0, x, alpha * (np.exp(x) - 1.0))


def _softplus(x, beta=1.0, threshold=20.0):
    return np.where(x * beta > threshold, x, np.log1p(np.exp(beta * x)) / beta)


def _clamp(x, min=None, max=None):  # noqa: A002 - torch's names
    """nan stays nan (np.maximum/np.minimum propagate it); ints clip."""
    if x.dtype.kind in "iu":
        return np.clip(x, min, max)
    if min is not None:
        x = np.maximum(x, min)
    return x if max is None else np.minimum(x, max)


def _mean(x, axis=None, keepdims=False):
    axes = reduced_axes(axis, x.ndim)
    return x.sum(axis=axes, keepdims=keepdims) / math.prod(x.shape[a] for a in axes)


def _var(x, axis=None, keepdims=False, correction=0):
    axes = reduced_axes(axis, x.ndim)
    n = math.prod(x.shape[a] for a in axes)
    dev = x - x.sum(axis=axes, keepdims=True) / n
    return (dev * dev).sum(axis=axes, keepdims=keepdims) / (n - correction)


def _logsumexp(x, axis=-1, keepdims=False):
    """torch's rule: an infinite maximum is not subtracted ([inf, 1] -> inf)."""
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    out = np.log(np.exp(x - m).sum(axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def _softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


# shapes of the composites: unary (U), binary (B), reductions (R)
U = [S((7,)), S((3, 33)), S((1,)), S((0, 4)), S(())]
B = [S((7,), (7,)), S((3, 33), (33,)), S((2, 1, 7), (3, 1)), S((1,), ())]
R = [S((7,)), S((3, 33)), S((2, 7, 5))]
F64_32 = ("float64", "float32")


def _f(name, op, build, oracle, cases, torch=None, domain=("extremes",), dtypes=F64_32, **kw):
    return OpInfo(name, op, build, oracle, dtypes, cases, domain=domain, torch=torch,
                  check="float", **kw)


def _argmax_values(dtype: str) -> list[Spec]:
    """Ties (the first index wins), nan (the first nan wins), infinities; ints and bools take
    |x| clipped to [0, 100] (int32: x, infinities as +-1000), and skip the cases holding nan."""
    rng = rng_for("arg extremes")
    cases = [np.round(rng.standard_normal((3, 33))), rng.standard_normal((7,)),
             np.array([1.0, np.nan, 3.0, np.nan]),
             np.array([[np.inf, 1, np.inf], [-np.inf, -np.inf, 0], [2, 2, 2]]),
             np.array([[np.nan, 1.0], [1.0, np.nan]]), np.zeros((2, 1))]
    out = []
    for x in cases:
        if dtype not in FLOATS:
            if np.isnan(x).any():
                continue
            x = (np.nan_to_num(x, posinf=1000, neginf=-1000) if dtype == "int32"
                 else np.clip(np.abs(x), 0, 100))
        v = x.astype(NP[dtype])
        out.append(S(v.shape, domain=lambda rng, spec, dtype, v=v: (v,)))
    return out


def _np_arg(fn, axis=None, keepdims=False):
    return lambda a: np.asarray(fn(a, axis=axis, keepdims=keepdims) if axis is not None
                                else fn(a)).astype(np.int64)


def _torch_arg(name, axis=None, keepdims=False):
    return lambda torch, t: getattr(torch, name)(t, dim=axis, keepdim=keepdims)


ARG_DTYPES = F64_32 + ("int32", "uint8", "bool")
ARG_TORCH_DTYPES = ARG_DTYPES[:-1]  # torch has no argmax/argmin of a bool tensor


COMPOSITES = [
    _f("sub", "sub", tg.sub, np.subtract, B, lambda torch, a, b: torch.sub(a, b)),
    _f("div", "div", tg.div, lambda a, b: a / b, B, lambda torch, a, b: torch.div(a, b)),
    _f("minimum", "minimum", tg.minimum, np.minimum, B, lambda torch, a, b: torch.minimum(a, b)),
    _f("abs", "abs", tg.abs, np.abs, U, lambda torch, x: torch.abs(x)),
    # numpy's rule: sign(nan) is nan (torch.sign gives 0)
    _f("sign", "sign", tg.sign, np.sign, U,
       lambda torch, x: torch.where(torch.isnan(x), x, torch.sign(x))),
    _f("square", "square", tg.square, lambda x: x * x, U, lambda torch, x: torch.square(x)),
    _f("rsqrt", "rsqrt", tg.rsqrt, lambda x: 1.0 / np.sqrt(x), U, lambda torch, x: torch.rsqrt(x)),
    _f("cos", "cos", tg.cos, np.cos, U, lambda torch, x: torch.cos(x)),
    _f("clamp", "clamp", lambda x: tg.clamp(x, min=-0.5, max=1.25),
       lambda x: _clamp(x, -0.5, 1.25), U, lambda torch, x: torch.clamp(x, -0.5, 1.25)),
    _f("clamp_min", "clamp", lambda x: tg.clamp(x, min=0.3), lambda x: _clamp(x, min=0.3), U,
       lambda torch, x: torch.clamp(x, min=0.3)),
    _f("clamp_max", "clamp", lambda x: tg.clamp(x, max=0.3), lambda x: _clamp(x, max=0.3), U,
       lambda torch, x: torch.clamp(x, max=0.3)),
    _f("relu", "relu", tg.relu, lambda x: np.maximum(x, 0.0), U,
       lambda torch, x: torch.nn.functional.relu(x)),
    _f("sigmoid", "sigmoid", tg.sigmoid, _sigmoid, U, lambda torch, x: torch.sigmoid(x)),
    _f("tanh", "tanh", tg.tanh, np.tanh, U, lambda torch, x: torch.tanh(x)),
    _f("gelu", "gelu", tg.gelu, _gelu, U, lambda torch, x: torch.nn.functional.gelu(x)),
    _f("gelu_tanh", "gelu", lambda x: tg.gelu(x, approximate="tanh"),
       lambda x: _gelu(x, "tanh"), U,
       lambda torch, x: torch.nn.functional.gelu(x, approximate="tanh"),
       domain=(_gelu_tanh_domain,)),
    _f("silu", "silu", tg.silu, lambda x: x * _sigmoid(x), U,
       lambda torch, x: torch.nn.functional.silu(x)),
    _f("elu", "elu", tg.elu, _elu, U, lambda torch, x: torch.nn.functional.elu(x)),
    _f("elu_alpha", "elu", lambda x: tg.elu(x, alpha=0.3), lambda x: _elu(x, 0.3), U,
       lambda torch, x: torch.nn.functional.elu(x, alpha=0.3)),
    _f("selu", "selu", tg.selu, lambda x: SELU_SCALE * _elu(x, SELU_ALPHA), U,
       lambda torch, x: torch.nn.functional.selu(x)),
    _f("softplus", "softplus", tg.softplus, _softplus, U,
       lambda torch, x: torch.nn.functional.softplus(x)),
    _f("softplus_beta", "softplus", lambda x: tg.softplus(x, beta=2.0, threshold=5.0),
       lambda x: _softplus(x, 2.0, 5.0), U,
       lambda torch, x: torch.nn.functional.softplus(x, beta=2.0, threshold=5.0)),
    _f("mean", "mean", tg.mean, _mean, R, lambda torch, x: torch.mean(x)),
    _f("mean_axis", "mean", lambda x: tg.mean(x, axis=-1, keepdims=True),
       lambda x: _mean(x, -1, True), R, lambda torch, x: torch.mean(x, -1, keepdim=True)),
    _f("var", "var", lambda x: tg.var(x, axis=0), lambda x: _var(x, 0), R,
       lambda torch, x: torch.var(x, 0, correction=0)),
    _f("var_unbiased", "var", lambda x: tg.var(x, axis=-1, keepdims=True, correction=1),
       lambda x: _var(x, -1, True, 1), R,
       lambda torch, x: torch.var(x, -1, keepdim=True, correction=1)),
    _f("min", "min", tg.min, np.min, R, lambda torch, x: torch.amin(x)),
    _f("min_axis", "min", lambda x: x.min(axis=-1, keepdims=True),
       lambda x: np.min(x, -1, keepdims=True), R, lambda torch, x: torch.amin(x, -1, True)),
    _f("prod", "prod", lambda x: tg.prod(x, axis=-1), lambda x: np.prod(x, -1), R + [S((33,))],
       lambda torch, x: torch.prod(x, -1), domain=("finite",)),
    _f("prod_all", "prod", tg.prod, np.prod, [S((7,)), S((3, 5)), S((0,)), S((1,))],
       lambda torch, x: torch.prod(x), domain=("finite",)),
    _f("cumsum", "cumsum", lambda x: tg.cumsum(x, axis=-1), lambda x: np.cumsum(x, -1), R,
       lambda torch, x: torch.cumsum(x, -1), domain=("finite",)),
    _f("cumsum0", "cumsum", tg.cumsum, lambda x: np.cumsum(x, 0), R + [S((0, 3))],
       lambda torch, x: torch.cumsum(x, 0), domain=("finite",)),
    _f("logsumexp", "logsumexp", tg.logsumexp, _logsumexp, R,
       lambda torch, x: torch.logsumexp(x, -1)),
    _f("logsumexp0", "logsumexp", lambda x: tg.logsumexp(x, axis=0, keepdims=True),
       lambda x: _logsumexp(x, 0, True), R, lambda torch, x: torch.logsumexp(x, 0, keepdim=True)),
    _f("softmax", "softmax", tg.softmax, _softmax, R,
       lambda torch, x: torch.nn.functional.softmax(x, -1)),
    _f("softmax0", "softmax", lambda x: tg.softmax(x, axis=0), lambda x: _softmax(x, 0), R,
       lambda torch, x: torch.nn.functional.softmax(x, 0)),
    _f("log_softmax", "log_softmax", tg.log_softmax, log_softmax, R,
       lambda torch, x: torch.nn.functional.log_softmax(x, -1)),
    # float inputs with ties, bool results
    _f("greater", "greater", tg.greater, lambda a, b: a > b, B, lambda torch, a, b: torch.gt(a, b),
       domain=("rounded",)),
    _f("less_equal", "less_equal", tg.less_equal, lambda a, b: a <= b, B,
       lambda torch, a, b: torch.le(a, b), domain=("rounded",)),
    _f("greater_equal", "greater_equal", tg.greater_equal, lambda a, b: a >= b, B,
       lambda torch, a, b: torch.ge(a, b), domain=("rounded",)),
    _f("not_equal", "not_equal", tg.not_equal, lambda a, b: a != b, B,
       lambda torch, a, b: torch.ne(a, b), domain=("rounded",)),
    _f("isnan", "isnan", tg.isnan, lambda x: x != x, U, lambda torch, x: torch.isnan(x),
       domain=("rounded",)),
    # fractional values are nonzero, hence True; bool inputs too
    _f("logical_and", "logical_and", tg.logical_and,
       lambda a, b: (a != 0) & (b != 0), B, lambda torch, a, b: torch.logical_and(a, b),
       domain=("quarters",), dtypes=F64_32 + ("bool",)),
    _f("logical_or", "logical_or", tg.logical_or, lambda a, b: (a != 0) | (b != 0), B,
       lambda torch, a, b: torch.logical_or(a, b), domain=("quarters",), dtypes=F64_32 + ("bool",)),
    _f("logical_not", "logical_not", tg.logical_not, lambda x: x == 0, U,
       lambda torch, x: torch.logical_not(x), domain=("quarters",), dtypes=F64_32 + ("bool",)),
    # float and int inputs, int64 results: numpy's tie and nan rules
    _f("argmax", "argmax", lambda x: tg.argmax(x, axis=-1), _np_arg(np.argmax, -1),
       _argmax_values, _torch_arg("argmax", -1), dtypes=ARG_DTYPES,
       torch_dtypes=ARG_TORCH_DTYPES),
    _f("argmax_all", "argmax", tg.argmax, _np_arg(np.argmax), _argmax_values,
       _torch_arg("argmax"), dtypes=ARG_DTYPES,
       torch_dtypes=ARG_TORCH_DTYPES),
    _f("argmin", "argmin", lambda x: tg.argmin(x, axis=0, keepdims=True),
       _np_arg(np.argmin, 0, True), _argmax_values, _torch_arg("argmin", 0, True),
       dtypes=ARG_DTYPES,
       torch_dtypes=ARG_TORCH_DTYPES),
    _f("argmin_all", "argmin", tg.argmin, _np_arg(np.argmin), _argmax_values,
       _torch_arg("argmin"), dtypes=ARG_DTYPES,
       torch_dtypes=ARG_TORCH_DTYPES),
]

# ints: exact against numpy, each dtype's extremes included (no torch column: as before)
I2 = [S((4, 9), (4, 9))]
I1 = [S((4, 9))]
INT_COMPOSITES = [
    _f("abs_int", "abs", tg.abs, np.abs, I1, dtypes=INTS),
    _f("sign_int", "sign", tg.sign, np.sign, I1, dtypes=INTS),
    _f("square_int", "square", tg.square, lambda a: a * a, I1, dtypes=INTS, domain=("small",)),
    _f("sub_int", "sub", tg.sub, np.subtract, I2, dtypes=INTS),
    _f("minimum_int", "minimum", tg.minimum, np.minimum, I2, dtypes=INTS),
    _f("min_int", "min", lambda x: tg.min(x, axis=-1), lambda a: np.min(a, -1), I1, dtypes=INTS),
    _f("min_all_int", "min", tg.min, np.min, I1, dtypes=INTS),
    _f("prod_int", "prod", lambda x: tg.prod(x, axis=-1), lambda a: np.prod(a, -1, dtype=a.dtype),
       I1, dtypes=INTS, domain=("small",)),
    _f("cumsum_int", "cumsum", lambda x: tg.cumsum(x, axis=-1),
       lambda a: np.cumsum(a, -1, dtype=a.dtype), I1, dtypes=INTS),
    _f("relu_int", "relu", tg.relu, lambda a: np.maximum(a, 0), I1, dtypes=INTS),
    _f("clamp_int", "clamp", lambda x: tg.clamp(x, min=-3, max=5), lambda a: np.clip(a, -3, 5),
       I1, dtypes=("int8", "int32", "int64")),
    # -3 as a uint8 scalar would wrap (as in torch): uint8 clamps to [3, 5]
    _f("clamp_uint8", "clamp", lambda x: tg.clamp(x, min=3, max=5), lambda a: np.clip(a, 3, 5),
       I1, dtypes=("uint8",)),
]


# ------------------------------------------------------------------------------ pointwise families
def _py(fn, otype=np.float64):
    """fn per element on Python numbers (ints exact at any width), as a numpy array."""
    def ref(*xs):
        out = np.frompyfunc(fn, len(xs), 1)(*[x.astype(object) if x.dtype.kind in "iu"
                                               else x.astype(np.float64) for x in xs])
        return np.asarray(out).astype(otype)
    return ref


def _int_fmod(p, q):
    r = abs(int(p)) % abs(int(q))  # C: the magnitude of |p| mod |q|, with the sign of p
    return -r if p < 0 else r


def _fmod_ref(a, b):
    if a.dtype.kind in "iu":
        return _wrap(lambda x, y: _py(_int_fmod, np.int64)(x, y))(a, b)
    return _py(lambda p, q: math.fmod(p, q) if q != 0 and not math.isinf(p) else math.nan)(a, b)


def _floor_divide_ref(a, b):
    if a.dtype.kind in "iu":
        return _wrap(lambda x, y: _py(lambda p, q: int(p) // int(q), np.int64)(x, y))(a, b)
    with np.errstate(all="ignore"):
        return np.floor_divide(a, b)  # numpy's float floor division is Python's


def _bitand_ref(a, b):
    return _wrap(lambda x, y: _py(lambda p, q: int(p) & int(q), np.int64)(x, y))(a, b)


def _divisor(rng, shape, dtype, spec=None):
    """A divisor: ints without 0 and -1 (a zero divisor raises; INT_MIN / -1 overflows in C);
    floats with +-0, +-inf and nan (fmod(x, 0) is nan, floor_divide(x, 0) is +-inf)."""
    x = sample(dtype, shape, rng)
    if dtype in INTS:
        x = np.where((x == 0) | (x == -1), 3, x).astype(NP[dtype])
    return x


def _in64(fn):
    """fn in float64, rounded once to the input dtype: the semantics of the special functions."""
    def ref(*xs):
        with np.errstate(all="ignore"):
            return np.asarray(fn(*[x.astype(np.float64) for x in xs])).astype(xs[0].dtype)
    return ref


_erfc64 = np.vectorize(math.erfc, otypes=[np.float64])


def _rounding_values(rng, shape, dtype, spec=None):
    """Halves and quarters (ties of round), values near the integers, 3e9 and 1e20 (floats
    beyond int32 and beyond 2**mantissa), tiny ones, +-0, +-inf and nan."""
    x = np.round(rng.standard_normal(shape) * 8) / 4
    if x.size >= 12:
        extra = [0.5, -0.5, 2.5, -2.5, 3e9 + 0.5, -1e20, 1e-10, -1e-10, -0.0, np.inf, -np.inf,
                 np.nan, 0.49999997, -1.5][: x.size]
        x.reshape(-1)[rng.choice(x.size, len(extra), replace=False)] = extra
    return x.astype(NP[dtype])


POINTWISE_ATOMIC = [
    _unary("log1p", tg.log1p, _in64(np.log1p), "log1p"),
    _unary("expm1", tg.expm1, _in64(np.expm1), "expm1"),
    _unary("log2", tg.log2, _in64(np.log2), "log2"),
    _unary("log10", tg.log10, _in64(np.log10), "log10"),
    # tan of the huge values (1e30, 1e300) is argument reduction's noise in every library
    OpInfo("tan", "tan", tg.tan, _in64(np.tan), FLOATS, UNARY_SHAPES, domain=("extremes",),
           torch=lambda torch, x: torch.tan(x)),
    _unary("erfc", tg.erfc, _in64(_erfc64), "erfc"),
    _binary("atan2", tg.atan2, _in64(np.arctan2), "atan2", FLOATS),
    _binary("fmod", tg.fmod, _fmod_ref, "fmod", NUM, domain=("any", _divisor)),
    _binary("floor_divide", tg.floor_divide, _floor_divide_ref, "floor_divide", NUM,
            domain=("any", _divisor)),
    _binary("bitwise_and", tg.bitwise_and, _bitand_ref, "bitwise_and", INTS),
    OpInfo("round_half_even", "round_half_even", tg.round_half_even, np.rint, FLOATS,
           UNARY_SHAPES, domain=(_rounding_values,), torch=lambda torch, x: torch.round(x)),
]


def _wide_values(rng, shape, dtype, spec=None):
    """Normals x3 with tiny (1e-10, 1e-30), moderate and near-overflow (+-88.5) magnitudes,
    +-0, +-inf and nan: where naive formulas cancel or overflow."""
    x = rng.standard_normal(shape) * 3
    if x.size >= 12:
        extra = [1e-10, -1e-10, 1e-30, -3e-8, 88.5, -88.5, 20.5, -0.0, 0.0, np.inf, -np.inf,
                 np.nan][: x.size]
        x.reshape(-1)[rng.choice(x.size, len(extra), replace=False)] = extra
    return x.astype(NP[dtype])


def _unit_values(rng, shape, dtype, spec=None):
    """Uniform in (-1.2, 1.2) with +-1, 1 - 1e-7 and tiny values (asin, acos, atanh)."""
    x = rng.uniform(-1.2, 1.2, shape)
    if x.size >= 8:
        extra = [1.0, -1.0, 1 - 1e-7, -1 + 1e-7, 1e-10, -1e-10, np.nan, 0.5][: x.size]
        x.reshape(-1)[rng.choice(x.size, len(extra), replace=False)] = extra
    return x.astype(NP[dtype])


def _acosh_values(rng, shape, dtype, spec=None):
    """1 + |normal| x 3 with 1, 1 + 1e-7, 0.5 (nan), 1e9 and 1e30 (past 2**28) and inf."""
    x = 1 + np.abs(rng.standard_normal(shape)) * 3
    if x.size >= 8:
        extra = [1.0, 1 + 1e-7, 0.5, 1e9, 1e30, np.inf, np.nan, -2.0][: x.size]
        x.reshape(-1)[rng.choice(x.size, len(extra), replace=False)] = extra
    return x.astype(NP[dtype])


def _prob_values(rng, shape, dtype, spec=None):
    """(0, 1) with 0, 1, tiny and near-1 values and one outside."""
    x = rng.uniform(0, 1, shape)
    if x.size >= 8:
        extra = [0.0, 1.0, 1e-10, 1 - 1e-7, 0.5, 1.5, -0.25, np.nan][: x.size]
        x.reshape(-1)[rng.choice(x.size, len(extra), replace=False)] = extra
    return x.astype(NP[dtype])


def _hypot_values(rng, spec, dtype):
    """Pairs of huge (1e30, 1e200: the squares overflow), tiny, zero, inf and nan values."""
    a, b = (_wide_values(rng, concrete(s), dtype) for s in spec.shapes)
    if a.size >= 8 and a.shape == b.shape:
        big = 1e30 if dtype == "float32" else 1e200
        a.reshape(-1)[:6] = [big, -big, 1e-30, 0.0, np.inf, np.nan]
        b.reshape(-1)[:6] = [big, 3.0, -1e-30, 0.0, np.nan, np.inf]
    return a, b


def _xlogy_values(rng, spec, dtype):
    """a with zeros, b with nan, 0, negatives and inf."""
    a = np.round(_extremes(rng, concrete(spec.shapes[0]), dtype))
    b = _extremes(rng, concrete(spec.shapes[1]), dtype)
    if a.size >= 6 and a.shape == b.shape:
        a.reshape(-1)[:6] = [0.0, 0.0, 0.0, 2.0, -0.0, 3.0]
        b.reshape(-1)[:6] = [np.nan, 0.0, -1.0, np.inf, 5.0, 0.0]
    return a, b


def _division_values(rng, spec, dtype):
    """Mixed signs (C's and Python's sign rules differ there), exact multiples, ties of the
    quotient; float divisors with +-0 and inf; int divisors never 0 or -1."""
    sa, sb = (concrete(s) for s in spec.shapes)
    if dtype in INTS:
        a = _extremes(rng, sa, dtype)
        return a, _divisor(rng, sb, dtype)
    a = np.round(rng.standard_normal(sa) * 20) / 2
    b = np.round(rng.standard_normal(sb) * 4) / 2
    if a.size >= 8:
        a.reshape(-1)[:8] = [7.5, -7.5, 7.5, -7.5, 6.0, np.inf, 1.0, 1e20][: a.size]
    if b.size >= 8:
        b.reshape(-1)[:8] = [2.0, 2.0, -2.0, -2.0, 0.0, 2.0, np.inf, 3.0][: b.size]
    return a.astype(NP[dtype]), b.astype(NP[dtype])


def _shift_values(rng, spec, dtype):
    """Ints over their range, shifted by -2 .. width + 2 (both ends are torch's special cases)."""
    width = np.dtype(NP[dtype]).itemsize * 8
    a = _extremes(rng, concrete(spec.shapes[0]), dtype)
    low = 0 if dtype == "uint8" else -2
    b = rng.integers(low, width + 3, concrete(spec.shapes[1])).astype(NP[dtype])
    return a, b


def _lshift_ref(a, b):
    width = a.dtype.itemsize * 8
    mask = (1 << width) - 1

    def one(p, q):
        if q < 0 or q >= width:
            return 0
        v = (int(p) << int(q)) & mask  # two's complement: keep the low bits, then the sign
        return v - (1 << width) if a.dtype.kind == "i" and v >> (width - 1) else v
    return _py(one, np.int64)(a, b).astype(a.dtype)


def _rshift_ref(a, b):
    width = a.dtype.itemsize * 8

    def one(p, q):
        if a.dtype.kind == "u":
            return 0 if q >= width else int(p) >> int(q)
        return int(p) >> (width - 1 if q < 0 or q >= width else int(q))  # Python: arithmetic
    return _py(one, np.int64)(a, b).astype(a.dtype)


def _signed_values(rng, shape, dtype, spec=None):
    """Normals with +-0.0, +-inf and nan (nan positive: its sign bit is not observable)."""
    x = rng.standard_normal(shape) * 3
    if x.size >= 6:
        extra = [0.0, -0.0, np.inf, -np.inf, np.nan, -1e-30]
        x.reshape(-1)[rng.choice(x.size, len(extra), replace=False)] = extra
    return np.where(np.isnan(x), np.float64(np.nan), x).astype(NP[dtype])


def _xlogy(a, b):
    with np.errstate(all="ignore"):
        return np.where(np.isnan(b), np.nan, np.where(a == 0, 0.0, a * np.log(b)))


def _logit(x, eps=None):
    if eps is not None:
        x = np.clip(x, eps, 1 - eps)
    with np.errstate(all="ignore"):
        return np.log(x / (1 - x))


def _div_trunc_ref(a, b):
    if a.dtype.kind in "iu":
        def one(p, q):
            r = abs(int(p)) // abs(int(q))
            return r if (p < 0) == (q < 0) else -r
        return _wrap(lambda x, y: _py(one, np.int64)(x, y))(a, b)
    with np.errstate(all="ignore"):
        return np.trunc(a / b)


def _remainder_ref(a, b):
    if a.dtype.kind in "iu":
        return _wrap(lambda x, y: _py(lambda p, q: int(p) % int(q), np.int64)(x, y))(a, b)
    return _py(lambda p, q: math.nan if q == 0 or math.isinf(p) else
               (p % q if not math.isinf(q) else (p if (p < 0) == (q < 0) or p == 0 else q)))(a, b)


def _nan_to_num(x, nan=0.0, posinf=None, neginf=None):
    return np.nan_to_num(x, nan=nan, posinf=posinf, neginf=neginf)


def _round_ref(x, decimals=0):
    return np.round(x, decimals)  # numpy: half to even, x * 10**d / 10**d like torch


P_U = [S((7,)), S((3, 33)), S((1,)), S((0, 4)), S(())]
P_B = [S((7,), (7,)), S((3, 33), (3, 33)), S((2, 1, 7), (3, 1)), S((1,), ())]
P_I1 = [S((4, 9))]
P_I2 = [S((4, 9), (4, 9)), S((9,), ())]
TORCH_ROUND = lambda torch, x, decimals=0: torch.round(x, decimals=decimals)  # noqa: E731

# quant.py: symmetric int8 with per-channel scales (tg.quantize's ops)
def _qscale_ref(a, axis=0):
    m = np.abs(a.astype(np.float64)).max(axis=axis, keepdims=True)
    return np.where(m == 0, 1.0, m / 127.0)


def _dynamic_quant_grouped_ref(x, group):
    """Each run of ``group`` values along the last axis rounded to int8 on its own scale."""
    v = x.astype(np.float64).reshape(*x.shape[:-1], x.shape[-1] // group, group)
    s = _qscale_ref(v, -1)
    return (np.clip(np.rint(v / s), -127, 127) * s).reshape(x.shape)


def _quant_values(rng, spec, dtype):
    """Weights with an all-zero channel and their scales (max |w| / 127 per column): every
    value lands in [-127, 127] and a column's largest value on +-127 exactly."""
    w = rng.standard_normal(concrete(spec.shapes[0])).astype(NP[dtype])
    w[:, -1] = 0
    return w, _qscale_ref(w, 0).astype(NP[dtype])


def _dequant_values(rng, spec, dtype):
    q = rng.integers(-127, 128, concrete(spec.shapes[0])).astype(np.int8)
    return q, (rng.random(concrete(spec.shapes[1])) * 0.1 + 1e-3).astype(NP[dtype])


def _bf16_round_ref(a):
    """To nearest even at bfloat16's 8 bits of mantissa, on the float32 bits (the values are
    drawn exact in float32, so float64 rounds them the same; finite, no overflow)."""
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    up = ((bits >> 16) & 1) + 0x7FFF
    return ((bits + up) >> 16 << 16).astype(np.uint32).view(np.float32).astype(np.float64)


def _float32_exact(rng, spec, dtype):
    """Normals exact in float32 (and so in float64): one rounding to bfloat16 either way."""
    return ((rng.standard_normal(concrete(spec.shapes[0])) * 3).astype(np.float32)
            .astype(NP[dtype]),)


def _quantize_ref(a, b):
    return np.clip(np.rint(a.astype(np.float64) / b), -127, 127).astype(np.int8)


def _i4_rows(k, ng):
    """Each of K's rows' group: ceil(K / ng) rows a group, the last shorter."""
    return np.arange(k) // -(-k // ng)


def _i4_scale_ref(a, group_size=32):
    k = a.shape[0]
    ng = -(-k // group_size)
    rows = _i4_rows(k, ng)
    m = np.stack([np.abs(a[rows == g].astype(np.float64)).max(axis=0) for g in range(ng)])
    return np.where(m == 0, 1.0, m / 7.0)


def _i4_values(rng, spec, dtype):
    """Weights with an all-zero group and their group scales: values land in [-7, 7]."""
    w = rng.standard_normal(concrete(spec.shapes[0])).astype(NP[dtype])
    w[:2, 0] = 0
    ng = concrete(spec.shapes[1])[0]
    return w, _i4_scale_ref(w, -(-w.shape[0] // ng)).astype(NP[dtype])


def _i4_quantize_ref(w, s):
    per_row = s[_i4_rows(w.shape[0], s.shape[0])]
    return (np.clip(np.rint(w.astype(np.float64) / per_row), -7, 7) + 8).astype(np.uint8)


def _i4_dequant_values(rng, spec, dtype):
    q = rng.integers(0, 16, concrete(spec.shapes[0])).astype(np.uint8)
    return q, (rng.random(concrete(spec.shapes[1])) * 0.1 + 1e-3).astype(NP[dtype])


def _gamma_values(rng, shape, dtype, spec=None):
    """Uniform in (-10, 10) with the poles (0, -0, -1, -3), halves, tiny +-1e-30, +-inf, nan
    and a huge 1e30: the reflection below 1/2 and both ends of the series."""
    x = rng.uniform(-10.0, 10.0, shape)
    if x.size >= 12:
        extra = [0.0, -0.0, -1.0, -3.0, -2.5, 0.5, 1e-30, -1e-30, np.inf, -np.inf, np.nan,
                 1e30][: x.size]
        x.reshape(-1)[rng.choice(x.size, len(extra), replace=False)] = extra
    return x.astype(NP[dtype])


def _erfinv_values(rng, shape, dtype, spec=None):
    """Uniform in (-1, 1) with +-1 (+-inf), 1.5 (nan), +-0, values within 1e-7 of +-1."""
    x = rng.uniform(-1.0, 1.0, shape)
    if x.size >= 8:
        extra = [1.0, -1.0, 1.5, 0.0, -0.0, 1 - 6e-8, -1 + 6e-8, np.nan][: x.size]
        x.reshape(-1)[rng.choice(x.size, len(extra), replace=False)] = extra
    return x.astype(NP[dtype])


def _nextafter_values(rng, spec, dtype):
    """Pairs across the dtype's edges: +-0 both ways, powers of two (the spacing halves below
    them), the smallest normal and subnormal, the largest finite, +-inf, nan, equal pairs."""
    a, b = (_wide_values(rng, concrete(s), dtype) for s in spec.shapes)
    if a.size >= 16 and a.shape == b.shape:
        info = np.finfo(NP[dtype])
        pairs = [(0.0, 1.0), (0.0, -1.0), (-0.0, 0.0), (0.0, -0.0), (1.0, 0.0), (-4.0, 0.0),
                 (2.0, 3.0), (info.tiny, 0.0), (info.smallest_subnormal, -1.0),
                 (info.max, np.inf), (np.inf, 0.0), (-np.inf, 1.0), (np.nan, 1.0),
                 (1.0, np.nan), (3.0, 3.0), (-info.tiny, -1.0)]
        a.reshape(-1)[:16], b.reshape(-1)[:16] = zip(*pairs)
    return a, b


def _elementwise(fn):
    return lambda x: np.vectorize(fn, otypes=[np.float64])(x)


def _lgamma_one(v: float) -> float:
    """Python's lgamma; torch's inf at the poles (math raises there) and at +-inf."""
    if math.isnan(v):
        return v
    if math.isinf(v) or (v <= 0 and v == math.floor(v)):
        return math.inf
    return math.lgamma(v)


def _digamma_one(v: float) -> float:
    """mpmath's digamma; torch's edges: -inf at +0, inf at -0, nan at the negative integers
    and -inf, inf at inf."""
    import mpmath

    if math.isnan(v) or v == -math.inf or (v < 0 and v == math.floor(v)):
        return math.nan
    if v == 0:
        return math.copysign(math.inf, -math.copysign(1.0, v))
    if v == math.inf:
        return math.inf
    return float(mpmath.digamma(mpmath.mpf(v)))


def _erfinv_one(v: float) -> float:
    """mpmath's erfinv; nan beyond [-1, 1], +-inf at +-1, -0 kept."""
    import mpmath

    if math.isnan(v) or abs(v) > 1:
        return math.nan
    if abs(v) == 1 or v == 0:
        return math.copysign(math.inf, v) if v else v
    return float(mpmath.erfinv(mpmath.mpf(v)))


POINTWISE = [
    _f("trunc", "trunc", tg.trunc, np.trunc, P_U, lambda torch, x: torch.trunc(x),
       domain=(_rounding_values,), tol32=0.0),
    _f("floor", "floor", tg.floor, np.floor, P_U, lambda torch, x: torch.floor(x),
       domain=(_rounding_values,), tol32=0.0),
    _f("ceil", "ceil", tg.ceil, np.ceil, P_U, lambda torch, x: torch.ceil(x),
       domain=(_rounding_values,), tol32=0.0),
    _f("round", "round", tg.round, _round_ref, P_U, TORCH_ROUND, domain=(_rounding_values,),
       tol32=0.0),
    _f("round_decimals", "round", lambda x, decimals: tg.round(x, decimals=decimals),
       _round_ref, [S((33,), decimals=d) for d in (1, 2, -1, -2)], TORCH_ROUND,
       domain=(_normal(50.0),), tol32=1e-6),
    _f("frac", "frac", tg.frac, lambda x: x - np.trunc(x), P_U, lambda torch, x: torch.frac(x),
       domain=(_rounding_values,), tol32=0.0),
    _f("remainder", "remainder", tg.remainder, _remainder_ref, P_B,
       lambda torch, a, b: torch.remainder(a, b), domain=_division_values, tol32=0.0),
    _f("div_trunc", "div_trunc", tg.div_trunc, _div_trunc_ref, P_B,
       lambda torch, a, b: torch.div(a, b, rounding_mode="trunc"), domain=_division_values,
       tol32=1e-6),  # 1e20 / 3: a float32 quotient rounds
    _f("exp2", "exp2", tg.exp2, lambda x: 2.0 ** x, P_U, lambda torch, x: torch.exp2(x),
       domain=(_wide_values,), tol32=1e-6),
    _f("atan", "atan", tg.atan, np.arctan, P_U, lambda torch, x: torch.atan(x),
       domain=(_wide_values,), tol32=1e-6),
    _f("asin", "asin", tg.asin, np.arcsin, P_U, lambda torch, x: torch.asin(x),
       domain=(_unit_values,), tol32=1e-6),
    _f("acos", "acos", tg.acos, np.arccos, P_U, lambda torch, x: torch.acos(x),
       domain=(_unit_values,), tol32=1e-6),
    _f("sinh", "sinh", tg.sinh, np.sinh, P_U, lambda torch, x: torch.sinh(x),
       domain=(_wide_values,), tol32=1e-6),
    _f("cosh", "cosh", tg.cosh, np.cosh, P_U, lambda torch, x: torch.cosh(x),
       domain=(_wide_values,), tol32=1e-6),
    _f("asinh", "asinh", tg.asinh, np.arcsinh, P_U, lambda torch, x: torch.asinh(x),
       domain=(_wide_values,), tol32=1e-6),
    _f("acosh", "acosh", tg.acosh, np.arccosh, P_U, lambda torch, x: torch.acosh(x),
       domain=(_acosh_values,), tol32=1e-6),
    _f("atanh", "atanh", tg.atanh, np.arctanh, P_U, lambda torch, x: torch.atanh(x),
       domain=(_unit_values,), tol32=1e-6),
    _f("hypot", "hypot", tg.hypot, np.hypot, P_B, lambda torch, a, b: torch.hypot(a, b),
       domain=_hypot_values, tol32=1e-6),
    _f("xlogy", "xlogy", tg.xlogy, _xlogy, P_B, lambda torch, a, b: torch.xlogy(a, b),
       domain=_xlogy_values, tol32=1e-6),
    _f("logit", "logit", tg.logit, _logit, P_U, lambda torch, x: torch.logit(x),
       domain=(_prob_values,), tol32=1e-6),
    _f("logit_eps", "logit", lambda x: tg.logit(x, eps=1e-3), lambda x: _logit(x, 1e-3), P_U,
       lambda torch, x: torch.logit(x, eps=1e-3), domain=(_prob_values,), tol32=1e-6),
    # computed in float64 and rounded once: float32 within its rounding of the float64 value
    _f("lgamma", "lgamma", tg.lgamma, _elementwise(_lgamma_one), P_U,
       lambda torch, x: torch.lgamma(x), domain=(_gamma_values,), tol64=1e-12, tol32=1e-7),
    _f("digamma", "digamma", tg.digamma, _elementwise(_digamma_one), P_U,
       lambda torch, x: torch.digamma(x), domain=(_gamma_values,), tol64=1e-12, tol32=1e-6),
    _f("erfinv", "erfinv", tg.erfinv, _elementwise(_erfinv_one), P_U,
       lambda torch, x: torch.erfinv(x), domain=(_erfinv_values,), tol64=1e-12, tol32=1e-7),
    # bit for bit in the run's dtype (numpy's nextafter in float32 is float32's next value);
    # torch's column in float64 only: the lifted float32 run is still float32's next value,
    # torch's lifted one float64's (float32 against torch: tests/frontend/test_window_ops.py)
    OpInfo("nextafter", "nextafter", tg.nextafter, np.nextafter, F64_32, P_B,
           domain=_nextafter_values, torch=lambda torch, a, b: torch.nextafter(a, b),
           torch_dtypes=("float64",), check="exact"),
    _f("isinf", "isinf", tg.isinf, np.isinf, P_U, lambda torch, x: torch.isinf(x)),
    _f("isfinite", "isfinite", tg.isfinite, np.isfinite, P_U,
       lambda torch, x: torch.isfinite(x)),
    # the defaults (the dtype's largest finite values) differ per dtype: float64 only here
    _f("nan_to_num", "nan_to_num", tg.nan_to_num, _nan_to_num, P_U,
       lambda torch, x: torch.nan_to_num(x), dtypes=("float64",)),
    _f("nan_to_num_values", "nan_to_num",
       lambda x: tg.nan_to_num(x, nan=-1.5, posinf=7.0, neginf=-9.0),
       lambda x: _nan_to_num(x, -1.5, 7.0, -9.0), P_U,
       lambda torch, x: torch.nan_to_num(x, nan=-1.5, posinf=7.0, neginf=-9.0), tol32=0.0),
    _f("logical_xor", "logical_xor", tg.logical_xor, lambda a, b: (a != 0) ^ (b != 0), P_B,
       lambda torch, a, b: torch.logical_xor(a, b), domain=("quarters",),
       dtypes=F64_32 + ("bool",)),
    # -0.0 and nan in both operands: the sign bit of a zero, nan ignored by fmax/fmin
    _f("signbit", "signbit", tg.signbit, np.signbit, P_U, lambda torch, x: torch.signbit(x),
       domain=(_signed_values,)),
    _f("copysign", "copysign", tg.copysign, np.copysign, P_B,
       lambda torch, a, b: torch.copysign(a, b), domain=(_signed_values, _signed_values),
       tol32=0.0),
    _f("fmax", "fmax", tg.fmax, np.fmax, P_B, lambda torch, a, b: torch.fmax(a, b),
       domain=(_signed_values, _signed_values), tol32=0.0),
    _f("fmin", "fmin", tg.fmin, np.fmin, P_B, lambda torch, a, b: torch.fmin(a, b),
       domain=(_signed_values, _signed_values), tol32=0.0),
    # torch's rule: pi below zero only (numpy's angle(-0.0) is pi)
    _f("angle", "angle", tg.angle, lambda x: np.where(x < 0, np.pi, np.where(x >= 0, 0.0, x)),
       P_U, lambda torch, x: torch.angle(x), domain=(_signed_values,), tol32=1e-7),
    # ints: exact against Python's integers, each dtype's extremes included
    _f("trunc_int", "trunc", tg.trunc, lambda a: a, P_I1, lambda torch, x: torch.trunc(x),
       dtypes=INTS),
    _f("remainder_int", "remainder", tg.remainder, _remainder_ref, P_I2,
       lambda torch, a, b: torch.remainder(a, b), domain=_division_values, dtypes=INTS),
    _f("div_trunc_int", "div_trunc", tg.div_trunc, _div_trunc_ref, P_I2,
       lambda torch, a, b: torch.div(a, b, rounding_mode="trunc"), domain=_division_values,
       dtypes=INTS),
    _f("bitwise_or", "bitwise_or", tg.bitwise_or, np.bitwise_or, P_I2,
       lambda torch, a, b: torch.bitwise_or(a, b), dtypes=INTS + ("bool",)),
    _f("bitwise_xor", "bitwise_xor", tg.bitwise_xor, np.bitwise_xor, P_I2,
       lambda torch, a, b: torch.bitwise_xor(a, b), dtypes=INTS + ("bool",)),
    _f("bitwise_not", "bitwise_not", tg.bitwise_not, np.invert, P_I1,
       lambda torch, x: torch.bitwise_not(x), dtypes=INTS + ("bool",)),
    _f("left_shift", "left_shift", tg.left_shift, _lshift_ref, P_I2,
       lambda torch, a, b: torch.bitwise_left_shift(a, b), domain=_shift_values, dtypes=INTS),
    _f("right_shift", "right_shift", tg.right_shift, _rshift_ref, P_I2,
       lambda torch, a, b: torch.bitwise_right_shift(a, b), domain=_shift_values, dtypes=INTS),
    # quant.py (tg.quantize): the scale, the rounding to int8 and back; no torch column
    _f("quant_scale", "quant_scale", lambda a, axis: tg.quant_scale(a, axis=axis), _qscale_ref,
       [S((6, 5), axis=0), S((4, 7), axis=1), S((1, 3), axis=0)],
       domain=lambda rng, spec, dtype: (_quant_values(rng, spec, dtype)[0],)),
    _f("quantize", "quantize", tg.quantize, _quantize_ref, [S((6, 5), (1, 5)), S((9, 2), (1, 2))],
       domain=_quant_values),
    _f("dequantize", "dequantize", tg.dequantize, lambda q, s: q.astype(np.float64) * s,
       [S((6, 5), (1, 5)), S((3, 4), (3, 1)), S((7,), ())], domain=_dequant_values),
    _f("dequantize_grouped", "dequantize", tg.dequantize,  # (ng, N) scale: one per K/ng rows
       lambda q, s: q.astype(np.float64) * np.repeat(s, q.shape[0] // s.shape[0], axis=0),
       [S((6, 5), (3, 5)), S((64, 3), (2, 3))], domain=_dequant_values),
    _f("bf16_round", "bf16_round", tg.bf16_round, _bf16_round_ref, [S((6, 5)), S((33,))],
       domain=_float32_exact),
    _f("dynamic_quant", "dynamic_quant", tg.dynamic_quant,
       lambda x: np.clip(np.rint(x / _qscale_ref(x, -1)), -127, 127) * _qscale_ref(x, -1),
       [S((4, 6)), S((2, 3, 5)), S((7,))],
       domain=lambda rng, spec, dtype: (rng.standard_normal(concrete(spec.shapes[0]))
                                        .astype(NP[dtype]),)),
    _f("dynamic_quant_grouped", "dynamic_quant",  # a scale per `group` values of a row
       lambda x, group: tg.dynamic_quant(x, group=group), _dynamic_quant_grouped_ref,
       [S((4, 64), group=32), S((2, 3, 8), group=4), S((5, 6), group=6)],
       domain=lambda rng, spec, dtype: (rng.standard_normal(concrete(spec.shapes[0]))
                                        .astype(NP[dtype]),)),
    _f("fp16_round", "fp16_round", tg.fp16_round,
       lambda a: a.astype(np.float16).astype(np.float64), [S((6, 5)), S((33,))],
       domain=_float32_exact),
    _f("int4_scale", "int4_scale", lambda a, group_size: tg.int4_scale(a, group_size=group_size),
       _i4_scale_ref, [S((8, 5), group_size=4), S((67, 3), group_size=32), S((3, 2), group_size=8)],
       domain=lambda rng, spec, dtype: (rng.standard_normal(concrete(spec.shapes[0]))
                                        .astype(NP[dtype]),)),
    _f("quantize_int4", "quantize_int4", tg.quantize_int4, _i4_quantize_ref,
       [S((8, 5), (2, 5)), S((67, 3), (3, 3))], domain=_i4_values),
    _f("dequantize_int4", "dequantize_int4", tg.dequantize_int4,
       lambda q, s: (q.astype(np.float64) - 8) * s[_i4_rows(q.shape[0], s.shape[0])],
       [S((8, 5), (2, 5)), S((67, 3), (3, 3))], domain=_i4_dequant_values),
]


# ------------------------------------------------------------------------------ oracles: nn
def _layer_norm(x, w=None, b=None, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    y = y if w is None else y * w
    return y if b is None else y + b


def _rms_norm(x, w=None, eps=1e-6):
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y if w is None else y * w


def _linear(x, w, b=None):
    y = np.einsum("...i,oi->...o", x, w) if w.ndim == 2 else np.einsum("...i,i->...", x, w)
    return y if b is None else y + b


def _sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    """softmax(q k^T * scale + mask) v, each query head on kv head h // (Hq / Hkv); a row with
    every key masked gives zeros."""
    rep = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = np.einsum("...qd,...kd->...qk", q, k) * scale
    keep = np.ones(scores.shape, bool)
    if is_causal:
        keep &= np.tril(np.ones(scores.shape[-2:], bool))
    if mask is not None and mask.dtype == np.bool_:
        keep &= mask
    elif mask is not None:
        scores = scores + mask
    scores = np.where(keep, scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(-1, keepdims=True)
    return np.einsum("...qk,...kd->...qd", e / np.where(total == 0, 1.0, total), v)


def _rotary(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def rope_angles(seq: int, d: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """The (seq, d) cos and sin tables of rotary embeddings (each frequency twice)."""
    inv = 1.0 / base ** (np.arange(0, d, 2) / d)
    emb = np.concatenate([np.outer(np.arange(seq), inv)] * 2, axis=-1)
    return np.cos(emb), np.sin(emb)


def _rope(which: int) -> Callable:
    """cos (0) or sin (1) of input 0's (seq, d), broadcast to the case's shape."""
    def draw(rng, shape, dtype, spec):
        seq, d = concrete(spec.shapes[0])[-2:]
        return np.broadcast_to(rope_angles(seq, d)[which], shape).astype(NP[dtype])
    return draw


def _ids(id_dtype: str) -> Callable:
    """Row indices of the table (input 1)."""
    def draw(rng, shape, dtype, spec):
        return rng.integers(0, spec.shapes[1][0], shape).astype(NP[id_dtype])
    return draw


def _torch_sdpa(torch, q, k, v, mask=None, is_causal=False, **kw):
    if mask is not None and mask.ndim < 2:  # torch wants a mask of rank >= 2
        mask = mask.reshape(1, -1)
    if mask is not None and is_causal:  # torch takes one of the two: combine them
        mask, is_causal = mask & torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(), \
            False
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True, **kw)


def _masked_row(kind: str) -> Callable:
    """A mask of the case's shape whose row 2 hides every key (the rest: 70% kept); float
    masks are 0 where kept and -inf where hidden."""
    def draw(rng, shape, dtype, spec):
        keep = rng.random(shape) < 0.7
        keep[..., 2, :] = False
        return keep if kind == "bool" else np.where(keep, 0.0, -np.inf).astype(NP[dtype])
    return draw


def _torch_rotary(torch, x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _nn(name, op, build, oracle, cases, torch, domain=("normal",), tol32=1e-5, **kw):
    return OpInfo(name, op, build, oracle, F64_32, cases, domain=domain, torch=torch,
                  check="float", tol32=tol32, finite=True, **kw)


SDPA_CASES = [(1, 1, 1, 1, 1, 1), (2, 3, 3, 7, 7, 8), (1, 4, 2, 7, 33, 16), (2, 8, 1, 5, 3, 4),
              (1, 6, 3, 33, 7, 7)]


def qkv_shapes(b, hq, hkv, sq, sk, d):
    return (b, hq, sq, d), (b, hkv, sk, d), (b, hkv, sk, d)


NN = [
    _nn("layer_norm", "layer_norm", lambda x, w=None, b=None, eps=1e-5: tg.layer_norm(
        x, w, b, eps=eps), _layer_norm,
        [S(s, *[(s[-1],)] * n, eps=1e-5) for s in [(1,), (7,), (3, 33), (2, 5, 7), (4, 1)]
         for n in (0, 1, 2)],
        lambda torch, x, w=None, b=None, eps=1e-5: torch.nn.functional.layer_norm(
            x, (x.shape[-1],), w, b, eps=eps)),
    # far from zero: float32's cancellation in x - mean costs accuracy
    _nn("layer_norm_magnitudes", "layer_norm", lambda x, eps: tg.layer_norm(x, eps=eps),
        lambda x, eps: _layer_norm(x, eps=eps),
        [S((4, 33), eps=1e-12, domain=(_normal(scale, 3 * scale),)) for scale in (1e-3, 1e6)],
        lambda torch, x, eps: torch.nn.functional.layer_norm(x, (33,), eps=eps), tol32=1e-4),
    _nn("rms_norm", "rms_norm", lambda x, w=None, eps=1e-6: tg.rms_norm(x, w, eps=eps),
        _rms_norm,
        [S(s, *[(s[-1],)] * n, eps=1e-6, domain=(_normal(scale), "normal"))
         for s in [(1,), (7,), (3, 33), (2, 5, 7)] for n in (0, 1) for scale in (1.0, 1e15)],
        lambda torch, x, w=None, eps=1e-6: torch.nn.functional.rms_norm(
            x, (x.shape[-1],), w, eps=eps)),
    _nn("linear", "linear", tg.linear, _linear,
        [S(xs, (out, xs[-1]), *[(out,)] * n) for xs, out in [
            ((1,), 1), ((7,), 3), ((5, 33), 7), ((2, 3, 7), 33), (("batch", 7), 4)]
         for n in (0, 1)] + [S((4, 7), (7,))],
        lambda torch, x, w, b=None: torch.nn.functional.linear(x, w, b)),
    _nn("embedding", "embedding", tg.embedding, lambda ids, table: table[ids],
        [S(ids, (num, dim), domain=(_ids(id_dtype), "normal"))
         for ids, num, dim in [((1,), 1, 1), ((7,), 10, 33), ((2, 7), 33, 7), ((), 5, 3)]
         for id_dtype in ("int64", "int32")],
        lambda torch, ids, table: torch.nn.functional.embedding(ids.long(), table)),
    _nn("scaled_dot_product_attention", "scaled_dot_product_attention",
        lambda q, k, v, m=None, **kw: tg.scaled_dot_product_attention(q, k, v, m, **kw), _sdpa,
        [S(*qkv_shapes(*c), is_causal=causal) for c in SDPA_CASES for causal in (False, True)]
        + [S(*qkv_shapes(2, 4, 2, 7, 33, 8), mask, scale=0.3,
             domain=("normal",) * 3 + (kind,))
           for mask in [(7, 33), (1, 1, 7, 33), (2, 1, 7, 33), (4, 7, 33), (2, 4, 7, 33), (33,)]
           for kind in ("bool", _normal(3.0))]
        # fully masked rows give zeros; a mask and is_causal combine
        + [S(*qkv_shapes(1, 2, 1, 4, 5, 3), (4, 5), domain=("normal",) * 3 + (_masked_row(kind),))
           for kind in ("bool", "float")]
        + [S(*qkv_shapes(1, 2, 2, 5, 5, 4), (5, 5), is_causal=True,
             domain=("normal",) * 3 + ("bool",))],
        _torch_sdpa),
    # scores of order 1e3: exp would overflow unshifted
    _nn("sdpa_large_logits", "scaled_dot_product_attention",
        lambda q, k, v, **kw: tg.scaled_dot_product_attention(q, k, v, **kw), _sdpa,
        [S(*qkv_shapes(1, 2, 2, 7, 7, 8), is_causal=True, domain=(_normal(300.0), "normal"))],
        _torch_sdpa, tol32=1e-4),
    _nn("rotary_embedding", "rotary_embedding", tg.rotary_embedding, _rotary,
        [S(x, c, c) for x, c in [((1, 1, 1, 2), (1, 2)), ((2, 3, 7, 8), (7, 8)),
                                 ((1, 2, 33, 16), (1, 1, 33, 16)),
                                 ((2, 4, 7, 64), (2, 1, 7, 64)), ((7, 2), (7, 2))]],
        _torch_rotary, domain=("normal", _rope(0), _rope(1))),
]


# ------------------------------------------------------------------------------ oracles: conv
def _two(v) -> tuple[int, int]:
    return tuple(v) if isinstance(v, tuple) else (v, v)


def _batched(fn):
    """An (N, C, ...) oracle that also takes one unbatched (C, ...) input."""
    def run(x, *args, **kw):
        unbatched = x.ndim == fn.rank - 1
        y = fn(x[None] if unbatched else x, *args, **kw)
        return y[0] if unbatched else y
    return run


def _conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    (sh, sw), (dh, dw) = _two(stride), _two(dilation)
    cout, cin_g, kh, kw = w.shape
    if padding == "valid":
        pads = (0, 0, 0, 0)
    elif padding == "same":  # torch: the extra one of an odd total goes after
        th, tw = dh * (kh - 1), dw * (kw - 1)
        pads = (th // 2, th - th // 2, tw // 2, tw - tw // 2)
    else:
        ph, pw = _two(padding)
        pads = (ph, ph, pw, pw)
    xp = np.pad(x, ((0, 0), (0, 0), pads[:2], pads[2:]))
    oh = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((x.shape[0], cout, oh, ow))
    per = cout // groups
    for g in range(groups):
        xs = xp[:, g * cin_g:(g + 1) * cin_g]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh,
                           j * dw:j * dw + sw * (ow - 1) + 1:sw]
                out[:, g * per:(g + 1) * per] += np.einsum(
                    "ncij,oc->noij", patch, w[g * per:(g + 1) * per, :, i, j])
    return out if b is None else out + b[:, None, None]


_conv2d.rank = 4


def _conv3d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """Each kernel offset's strided patch against its weight slice, summed (no 2-d step)."""
    three = (lambda v: tuple(v) if isinstance(v, tuple) else (v, v, v))
    st, dl = three(stride), three(dilation)
    cout, cin_g = w.shape[:2]
    ks = w.shape[2:]
    if padding == "valid":
        pads = [(0, 0)] * 3
    elif padding == "same":  # torch: the extra one of an odd total goes after
        pads = [(t // 2, t - t // 2) for t in (d * (k - 1) for d, k in zip(dl, ks))]
    else:
        pads = [(p, p) for p in three(padding)]
    xp = np.pad(x, [(0, 0), (0, 0), *pads])
    outs = [(xp.shape[2 + i] - dl[i] * (ks[i] - 1) - 1) // st[i] + 1 for i in range(3)]
    out = np.zeros((x.shape[0], cout, *outs))
    per = cout // groups
    for g in range(groups):
        xs = xp[:, g * cin_g:(g + 1) * cin_g]
        for off in np.ndindex(*ks):
            patch = xs[(slice(None), slice(None)) + tuple(
                slice(o * dl[i], o * dl[i] + st[i] * (outs[i] - 1) + 1, st[i])
                for i, o in enumerate(off))]
            out[:, g * per:(g + 1) * per] += np.einsum(
                "ncdij,oc->nodij", patch, w[(slice(g * per, (g + 1) * per), slice(None)) + off])
    return out if b is None else out + b[:, None, None, None]


_conv3d.rank = 5


def _pool_size(n, k, s, p, d, ceil_mode):
    """torch's output length; with ceil_mode the last window must start inside the input or
    its left padding."""
    span = n + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    return out - 1 if ceil_mode and (out - 1) * s >= n + p else out


def _max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    (kh, kw), (ph, pw), (dh, dw) = _two(kernel_size), _two(padding), _two(dilation)
    sh, sw = _two(stride if stride is not None else kernel_size)
    H, W = x.shape[2:]
    oh, ow = (_pool_size(H, kh, sh, ph, dh, ceil_mode), _pool_size(W, kw, sw, pw, dw, ceil_mode))
    out = np.empty(x.shape[:2] + (oh, ow), x.dtype)
    for i in range(oh):
        rows = [r for r in range(i * sh - ph, i * sh - ph + dh * kh, dh) if 0 <= r < H]
        for j in range(ow):
            cols = [c for c in range(j * sw - pw, j * sw - pw + dw * kw, dw) if 0 <= c < W]
            out[:, :, i, j] = x[:, :, rows][:, :, :, cols].max(axis=(-2, -1))  # nan wins
    return out


_max_pool2d.rank = 4


def _avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    (kh, kw), (ph, pw) = _two(kernel_size), _two(padding)
    sh, sw = _two(stride if stride is not None else kernel_size)
    H, W = x.shape[2:]
    oh, ow = _pool_size(H, kh, sh, ph, 1, ceil_mode), _pool_size(W, kw, sw, pw, 1, ceil_mode)
    out = np.empty(x.shape[:2] + (oh, ow))
    for i in range(oh):
        h0, h1 = i * sh - ph, min(i * sh - ph + kh, H + ph)  # the window within the padding
        for j in range(ow):
            w0, w1 = j * sw - pw, min(j * sw - pw + kw, W + pw)
            inside = x[:, :, max(h0, 0):min(h1, H), max(w0, 0):min(w1, W)]
            if divisor_override:
                divisor = divisor_override
            elif count_include_pad:
                divisor = (h1 - h0) * (w1 - w0)
            else:
                divisor = inside.shape[2] * inside.shape[3]
            out[:, :, i, j] = inside.sum(axis=(-2, -1)) / divisor
    return out


_avg_pool2d.rank = 4


def _adaptive_bounds(n_in: int, n_out: int) -> list[tuple[int, int]]:
    return [((i * n_in) // n_out, -(-((i + 1) * n_in) // n_out)) for i in range(n_out)]


def _adaptive_avg(x, outs):
    """Mean over [floor(i * in / out), ceil((i + 1) * in / out)) along each trailing axis."""
    for axis, n_out in zip(range(x.ndim - len(outs), x.ndim), outs):
        parts = [np.take(x, range(a, b), axis).mean(axis, keepdims=True)
                 for a, b in _adaptive_bounds(x.shape[axis], n_out)]
        x = np.concatenate(parts, axis)
    return x


def _adaptive_avg_pool2d(x, output_size):
    outs = _two(output_size)
    return _adaptive_avg(x, tuple(n if o is None else o for n, o in zip(x.shape[-2:], outs)))


def _scan_max_index(x, windows) -> np.ndarray:
    """torch's max-pooling index: per output position, scan its window's (row, col) pairs
    in order, keeping the first strict maximum and moving to every nan; the flat index
    row * W + col of what was kept. ``windows[i][j]`` lists the pairs of output (i, j)."""
    W = x.shape[-1]
    out = np.empty(x.shape[:2] + (len(windows), len(windows[0])), np.int64)
    for i, row in enumerate(windows):
        for j, pairs in enumerate(row):
            best = np.full(x.shape[:2], -np.inf)
            where = np.full(x.shape[:2], pairs[0][0] * W + pairs[0][1], np.int64)
            for r, c in pairs:
                v = x[:, :, r, c]
                take = (v > best) | np.isnan(v)
                best, where = np.where(take, v, best), np.where(take, r * W + c, where)
            out[:, :, i, j] = where
    return out


def _max_pool2d_indices(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    (kh, kw), (ph, pw), (dh, dw) = _two(kernel_size), _two(padding), _two(dilation)
    sh, sw = _two(stride if stride is not None else kernel_size)
    H, W = x.shape[2:]
    oh, ow = (_pool_size(H, kh, sh, ph, dh, ceil_mode), _pool_size(W, kw, sw, pw, dw, ceil_mode))
    return _scan_max_index(x, [[
        [(r, c) for r in range(i * sh - ph, i * sh - ph + dh * kh, dh) if 0 <= r < H
         for c in range(j * sw - pw, j * sw - pw + dw * kw, dw) if 0 <= c < W]
        for j in range(ow)] for i in range(oh)])


_max_pool2d_indices.rank = 4


def _adaptive_sizes(x, output_size):
    return tuple(n if o is None else o for n, o in zip(x.shape[-2:], _two(output_size)))


def _adaptive_max_pool2d(x, output_size):
    rows, cols = (_adaptive_bounds(n, o) for n, o in zip(x.shape[2:], _adaptive_sizes(
        x, output_size)))
    out = np.empty(x.shape[:2] + (len(rows), len(cols)), x.dtype)
    for i, (a, b) in enumerate(rows):
        for j, (c, d) in enumerate(cols):
            out[:, :, i, j] = x[:, :, a:b, c:d].max(axis=(-2, -1))  # nan wins
    return out


_adaptive_max_pool2d.rank = 4


def _adaptive_max_pool2d_indices(x, output_size):
    rows, cols = (_adaptive_bounds(n, o) for n, o in zip(x.shape[2:], _adaptive_sizes(
        x, output_size)))
    return _scan_max_index(x, [[[(r, c) for r in range(a, b) for c in range(e, f)]
                                for e, f in cols] for a, b in rows])


_adaptive_max_pool2d_indices.rank = 4


def _unfold(x, kernel_size, dilation=1, padding=0, stride=1):
    """im2col: row (channel, ki, kj), column (window row, window col), zero padding."""
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = (_two(kernel_size), _two(dilation), _two(padding),
                                              _two(stride))
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    out = np.empty((x.shape[0], x.shape[1], kh, kw, oh, ow), x.dtype)
    for ki in range(kh):
        for kj in range(kw):
            for i in range(oh):
                for j in range(ow):
                    out[:, :, ki, kj, i, j] = xp[:, :, i * sh + ki * dh, j * sw + kj * dw]
    return out.reshape(x.shape[0], x.shape[1] * kh * kw, oh * ow)


_unfold.rank = 4


def _nearest(n_in: int, n_out: int, scale, exact: bool) -> list[int]:
    """torch's source index: floor(dst * s) (nearest-exact: floor((dst + 0.5) * s)), clamped to
    the last, in float32 arithmetic with s = in / out, or 1 / scale_factor when one is given."""
    f32 = np.float32
    s = f32(1.0 / scale) if scale is not None else f32(n_in) / f32(n_out)
    out = []
    for dst in range(n_out):
        pos = (f32(dst) + f32(0.5)) * s if exact else f32(dst) * s
        out.append(min(int(math.floor(f32(pos))), n_in - 1))
    return out


def _linear_resample(x, axis, n_out, scale, align_corners):
    """Each output a blend of its two neighbours at torch's source position."""
    n_in = x.shape[axis]
    parts = []
    for dst in range(n_out):
        if align_corners:
            src = dst * ((n_in - 1) / (n_out - 1)) if n_out > 1 else 0.0
        else:
            s = 1.0 / scale if scale is not None else n_in / n_out
            src = max(s * (dst + 0.5) - 0.5, 0.0)
        i0 = min(int(math.floor(src)), n_in - 1)
        i1 = min(i0 + 1, n_in - 1)
        t = src - i0
        parts.append(np.take(x, [i0], axis) * (1.0 - t) + np.take(x, [i1], axis) * t)
    return np.concatenate(parts, axis)


def _keys_cubic(d: float, a: float = -0.75) -> float:
    """Keys' cubic convolution kernel at distance d (torch's A = -0.75)."""
    d = abs(d)
    if d <= 1:
        return (a + 2) * d ** 3 - (a + 3) * d ** 2 + 1
    if d < 2:
        return a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a
    return 0.0


def _cubic_source(n_in, n_out, scale, align_corners, dst):
    if align_corners:
        return dst * ((n_in - 1) / (n_out - 1)) if n_out > 1 else 0.0
    s = 1.0 / scale if scale else n_in / n_out
    return s * (dst + 0.5) - 0.5  # unclamped for cubic


def _bicubic(x, outs, scales, align_corners):
    """Each output the 4x4 neighbourhood of its source point, weighted by the kernel at the
    distances along both axes; a neighbour outside the input reads the nearest edge."""
    (H, W), (oh, ow) = x.shape[2:], outs
    out = np.zeros(x.shape[:2] + (oh, ow))
    for i in range(oh):
        sy = _cubic_source(H, oh, scales[0], align_corners, i)
        for j in range(ow):
            sx = _cubic_source(W, ow, scales[1], align_corners, j)
            for r in range(math.floor(sy) - 1, math.floor(sy) + 3):
                for c in range(math.floor(sx) - 1, math.floor(sx) + 3):
                    weight = _keys_cubic(sy - r) * _keys_cubic(sx - c)
                    out[:, :, i, j] += weight * x[:, :, min(max(r, 0), H - 1),
                                                  min(max(c, 0), W - 1)]
    return out


def _interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None):
    k = x.ndim - 2
    ins = x.shape[2:]
    if size is not None:
        outs, scales = (size if isinstance(size, tuple) else (size,) * k), (None,) * k
    else:
        sf = scale_factor if isinstance(scale_factor, tuple) else (scale_factor,) * k
        outs = tuple(int(math.floor(n * float(f))) for n, f in zip(ins, sf))
        scales = (None,) * k if recompute_scale_factor else sf
    if mode == "area":
        return _adaptive_avg(x, outs)
    if mode == "bicubic":
        return _bicubic(x, outs, scales, bool(align_corners))
    for axis, n_out, scale in zip(range(2, x.ndim), outs, scales):
        if mode in ("nearest", "nearest-exact"):
            x = np.take(x, _nearest(x.shape[axis], n_out, scale, mode == "nearest-exact"), axis)
        else:
            x = _linear_resample(x, axis, n_out, scale, bool(align_corners))
    return x


def _channel(p, x):
    """A (C,) parameter shaped to broadcast along axis 1 of x."""
    return p.reshape((1, -1) + (1,) * (x.ndim - 2))


def _batch_norm(x, mean, var, w=None, b=None, eps=1e-5):
    y = (x - _channel(mean, x)) / np.sqrt(_channel(var, x) + eps)
    y = y if w is None else y * _channel(w, x)
    return y if b is None else y + _channel(b, x)


def _group_norm(x, w=None, b=None, num_groups=1, eps=1e-5):
    g = x.reshape(x.shape[0], num_groups, -1)
    mu = g.mean(-1, keepdims=True)
    y = ((g - mu) / np.sqrt(((g - mu) ** 2).mean(-1, keepdims=True) + eps)).reshape(x.shape)
    y = y if w is None else y * _channel(w, x)
    return y if b is None else y + _channel(b, x)


CONV_CASES = [  # (x shape, out channels, kernel, stride, padding, dilation, groups, bias)
    ((1, 1, 1, 1), 1, (1, 1), 1, 0, 1, 1, False),           # size 1, 1x1
    ((2, 3, 7, 7), 4, (1, 1), 1, 0, 1, 1, True),            # 1x1
    ((2, 3, 7, 7), 5, (1, 1), 2, 0, 1, 1, False),           # strided 1x1
    ((2, 3, 7, 7), 4, (3, 3), 1, 0, 1, 1, True),            # plain 3x3
    ((2, 3, 7, 7), 4, (3, 3), 1, 1, 1, 1, True),            # "same"-sized by padding
    ((1, 2, 7, 9), 6, (3, 3), 2, 1, 1, 2, True),            # stride 2, groups 2
    ((2, 4, 7, 7), 4, (3, 3), 1, 1, 1, 4, True),            # depthwise
    ((1, 3, 7, 7), 6, (3, 3), 1, 1, 1, 3, False),           # depthwise, multiplier 2
    ((1, 2, 11, 9), 3, (3, 3), 1, 2, 2, 1, True),           # dilation 2
    ((2, 3, 5, 11), 4, (3, 2), (1, 3), (2, 0), (1, 2), 1, True),  # odd everything
    ((1, 4, 13, 6), 8, (5, 3), (3, 2), (1, 2), 1, 2, False),
    ((1, 3, 7, 7), 2, (7, 7), 1, 0, 1, 1, True),            # kernel covers the input
    ((3, 6, 8, 8), 6, (3, 3), 2, 0, 1, 3, True),
    ((1, 2, 6, 6), 4, (2, 4), 1, "same", 1, 1, True),       # even kernel: asymmetric pads
    ((1, 2, 6, 6), 4, (3, 3), 1, "same", 2, 2, False),
    ((1, 2, 6, 7), 4, (3, 3), 1, "valid", 1, 1, True),
    ((3, 7, 5), 4, (3, 3), 1, 0, 1, 1, False),              # unbatched
]
POOL_CASES = [  # (x shape, kernel_size, stride, padding, dilation, ceil_mode)
    ((1, 1, 1, 1), 1, None, 0, 1, False),
    ((2, 3, 8, 8), 2, None, 0, 1, False),
    ((2, 3, 7, 7), 3, 2, 1, 1, False),
    ((1, 2, 7, 9), (3, 2), (2, 1), (1, 1), 1, False),
    ((1, 2, 9, 7), 3, 1, 0, 2, False),
    ((1, 2, 7, 7), 3, 2, 0, 1, True),
    ((1, 2, 8, 11), (2, 3), (2, 3), (1, 1), 1, True),
    ((1, 1, 5, 5), 5, None, 2, 1, False),
    ((2, 2, 6, 10), 4, 3, 2, 1, True),
    ((2, 5, 5), 2, None, 1, 1, False),                      # unbatched
]
ADAPTIVE_MAX_CASES = [((2, 3, 7, 7), (3, 5)), ((1, 2, 5, 5), (7, 9)), ((1, 2, 8, 6), 1),
                      ((1, 2, 9, 6), (None, 4)), ((1, 1, 1, 1), (2, 3)), ((3, 10, 10), (3, 7))]
INTERPOLATE_CASES = [
    ((2, 3, 4, 5), dict(scale_factor=2)),
    ((2, 3, 4, 5), dict(scale_factor=(3, 1))),
    ((1, 2, 4, 5), dict(size=(7, 13))),
    ((1, 2, 9, 6), dict(size=(4, 5))),
    ((1, 2, 10, 26), dict(size=(6, 22))),
    ((1, 2, 5, 5), dict(scale_factor=1.5)),
    ((1, 2, 7, 9), dict(scale_factor=(0.5, 2.5))),
    ((1, 2, 7, 9), dict(scale_factor=1.7, recompute_scale_factor=True)),
    ((1, 2, 7, 9), dict(size=(10, 4), mode="nearest-exact")),
    ((1, 2, 7, 9), dict(scale_factor=1.3, mode="nearest-exact")),
    ((1, 2, 7), dict(size=12)),
    ((1, 2, 3, 4, 5), dict(scale_factor=2)),
    ((2, 3, 4, 5), dict(scale_factor=2, mode="bilinear", align_corners=False)),
    ((1, 2, 7, 9), dict(size=(11, 4), mode="bilinear", align_corners=False)),
    ((1, 2, 7, 9), dict(scale_factor=1.7, mode="bilinear", align_corners=False)),
    ((1, 2, 7, 9), dict(size=(3, 13), mode="bilinear", align_corners=True)),
    ((1, 2, 1, 9), dict(size=(4, 1), mode="bilinear", align_corners=True)),
    ((1, 2, 7), dict(size=15, mode="linear", align_corners=False)),
    ((1, 2, 3, 4, 5), dict(size=(5, 2, 7), mode="trilinear", align_corners=False)),
    ((1, 2, 9, 7), dict(size=(4, 3), mode="area")),
    ((2, 3, 4, 4), dict(size=(5, 7), mode="bicubic", align_corners=False)),
    ((1, 2, 7, 9), dict(scale_factor=1.7, mode="bicubic", align_corners=False)),
    ((1, 2, 7, 9), dict(size=(3, 13), mode="bicubic", align_corners=True)),
    ((1, 2, 1, 9), dict(size=(4, 2), mode="bicubic")),
]


CONV3D_CASES = [  # (x shape, out channels, kernel, stride, padding, dilation, groups, bias)
    ((1, 1, 1, 1, 1), 1, (1, 1, 1), 1, 0, 1, 1, False),     # size 1
    ((2, 4, 5, 6, 6), 6, (2, 3, 3), 1, 0, 1, 1, True),      # a video UNet's temporal kernel
    ((1, 4, 7, 6, 5), 4, (3, 3, 2), (2, 1, 2), (1, 1, 0), (1, 2, 1), 2, False),  # odd all
    ((4, 5, 6, 6), 3, (3, 1, 1), 1, "same", 1, 1, True),    # unbatched, temporal only
    ((1, 2, 6, 5, 5), 4, (2, 2, 2), 1, "same", (2, 1, 1), 2, True),  # even kernel: uneven
    ((1, 3, 4, 4, 4), 3, (4, 1, 1), 1, "valid", 1, 3, False),       # depthwise, full depth
]


def _conv3d_spec(case) -> Spec:
    shape, cout, kernel, stride, padding, dilation, groups, bias = case
    return S(shape, (cout, shape[-4] // groups) + kernel, (cout,) if bias else None,
             stride=stride, padding=padding, dilation=dilation, groups=groups)


def _conv_spec(case) -> Spec:
    shape, cout, (kh, kw), stride, padding, dilation, groups, bias = case
    return S(shape, (cout, shape[-3] // groups, kh, kw), (cout,) if bias else None,
             stride=stride, padding=padding, dilation=dilation, groups=groups)


CONV = [
    _nn("conv2d", "conv2d", lambda x, w, b=None, **kw: tg.conv2d(x, w, b, **kw),
        _batched(_conv2d), [_conv_spec(c) for c in CONV_CASES],
        lambda torch, x, w, b=None, **kw: torch.nn.functional.conv2d(x, w, b, **kw)),
    _nn("conv3d", "conv3d", lambda x, w, b=None, **kw: tg.conv3d(x, w, b, **kw),
        _batched(_conv3d), [_conv3d_spec(c) for c in CONV3D_CASES],
        lambda torch, x, w, b=None, **kw: torch.nn.functional.conv3d(x, w, b, **kw)),
    # x * 1e30 against weights * 1e-20: no scaling step may overflow
    _nn("conv2d_large", "conv2d", lambda x, w, **kw: tg.conv2d(x, w, **kw), _batched(_conv2d),
        [S((1, 2, 6, 6), (3, 2, 3, 3), padding=1, domain=(_normal(1e30), _normal(1e-20)))],
        lambda torch, x, w, **kw: torch.nn.functional.conv2d(x, w, **kw)),
    # max is exact: float64 to 0, float32 to float32's rounding of the inputs
    _nn("max_pool2d", "max_pool2d", lambda x, **kw: tg.max_pool2d(x, **kw),
        _batched(_max_pool2d),
        [S(s, kernel_size=k, stride=st, padding=p, dilation=d, ceil_mode=c)
         for s, k, st, p, d, c in POOL_CASES],
        lambda torch, x, **kw: torch.nn.functional.max_pool2d(x, **kw), tol64=0.0, tol32=1e-7),
    _nn("avg_pool2d", "avg_pool2d", lambda x, **kw: tg.avg_pool2d(x, **kw),
        _batched(_avg_pool2d),
        [S(s, kernel_size=k, stride=st, padding=p, ceil_mode=c, count_include_pad=inc)
         for s, k, st, p, d, c in POOL_CASES if d == 1 for inc in (True, False)]
        + [S((2, 3, 7, 7), kernel_size=3, stride=2, padding=1, divisor_override=4)],
        lambda torch, x, **kw: torch.nn.functional.avg_pool2d(x, **kw)),
    _nn("adaptive_avg_pool2d", "adaptive_avg_pool2d",
        lambda x, output_size: tg.adaptive_avg_pool2d(x, output_size=output_size),
        _adaptive_avg_pool2d,
        [S(s, output_size=o) for s, o in [
            ((2, 3, 7, 7), (3, 5)), ((1, 2, 5, 5), (7, 9)), ((1, 2, 8, 6), 1), ((1, 2, 8, 6), 4),
            ((1, 2, 9, 6), (None, 4)), ((1, 1, 1, 1), (2, 3)), ((3, 10, 10), (3, 7))]],
        lambda torch, x, output_size: torch.nn.functional.adaptive_avg_pool2d(x, output_size)),
    # where the max lies: ties ("rounded" has them, and nan and inf) keep the first, a nan
    # the last, as torch's kernels do
    _nn("max_pool2d_indices", "max_pool2d_indices",
        lambda x, **kw: tg.max_pool2d_indices(x, **kw), _batched(_max_pool2d_indices),
        [S(s, kernel_size=k, stride=st, padding=p, dilation=d, ceil_mode=c)
         for s, k, st, p, d, c in POOL_CASES],
        lambda torch, x, **kw: torch.nn.functional.max_pool2d(x, return_indices=True, **kw)[1],
        domain=("rounded",)),
    _nn("adaptive_max_pool2d", "adaptive_max_pool2d",
        lambda x, output_size: tg.adaptive_max_pool2d(x, output_size=output_size),
        _batched(_adaptive_max_pool2d), [S(s, output_size=o) for s, o in ADAPTIVE_MAX_CASES],
        lambda torch, x, output_size: torch.nn.functional.adaptive_max_pool2d(x, output_size),
        tol64=0.0, tol32=1e-7),
    _nn("adaptive_max_pool2d_indices", "adaptive_max_pool2d_indices",
        lambda x, output_size: tg.adaptive_max_pool2d_indices(x, output_size=output_size),
        _batched(_adaptive_max_pool2d_indices),
        [S(s, output_size=o) for s, o in ADAPTIVE_MAX_CASES],
        lambda torch, x, output_size: torch.nn.functional.adaptive_max_pool2d(
            x, output_size, return_indices=True)[1], domain=("rounded",)),
    _nn("unfold", "unfold", lambda x, **kw: tg.unfold(x, **kw), _batched(_unfold),
        [S(s, **kw) for s, kw in [
            ((2, 3, 7, 9), dict(kernel_size=3, stride=2, padding=1)),
            ((1, 2, 5, 5), dict(kernel_size=(2, 3), dilation=(2, 1))),
            ((0, 2, 5, 5), dict(kernel_size=2)),                         # an empty batch
            ((1, 1, 1, 1), dict(kernel_size=1)),
            ((3, 6, 7), dict(kernel_size=(2, 3), padding=(1, 0), stride=(1, 2)))]],  # unbatched
        lambda torch, x, **kw: torch.nn.functional.unfold(x, **kw), tol64=0.0, tol32=0.0),
    _nn("interpolate", "interpolate", lambda x, **kw: tg.interpolate(x, **kw), _interpolate,
        [S(s, **kw) for s, kw in INTERPOLATE_CASES],
        lambda torch, x, **kw: torch.nn.functional.interpolate(x, **kw)),
    _nn("batch_norm", "batch_norm", lambda *xs, eps: tg.batch_norm(*xs, eps=eps), _batch_norm,
        [S(s, (s[1],), (s[1],), *[(s[1],)] * n, eps=1e-3)
         for s in [(4, 3), (2, 3, 7), (2, 3, 5, 6), (1, 1, 1, 1), (2, 2, 3, 2, 2)]
         for n in (0, 2)],
        lambda torch, x, m, v, w=None, b=None, *, eps: torch.nn.functional.batch_norm(
            x, m, v, w, b, training=False, eps=eps),
        domain=(_normal(3.0, 1.0), "normal", _uniform(0.1, 2.0), "normal", "normal")),
    _nn("group_norm", "group_norm", lambda x, w=None, b=None, **kw: tg.group_norm(x, w, b, **kw),
        _group_norm,
        [S(s, *[(s[1],)] * n, num_groups=g) for s, g in [
            ((2, 4, 3), 2), ((2, 6, 5, 5), 3), ((1, 6, 5, 5), 1), ((2, 6, 4, 4), 6), ((3, 8), 4),
            ((1, 4, 2, 3, 2), 2)] for n in (0, 2)],
        lambda torch, x, w=None, b=None, *, num_groups, eps=1e-5: torch.nn.functional.group_norm(
            x, num_groups, w, b, eps=eps),
        domain=(_normal(5.0, 3.0), "normal", "normal")),
]


# ------------------------------------------------------------------------------ oracles: losses
REDUCTIONS = ("none", "mean", "sum")


def _reduce(loss, reduction):
    return {"none": loss, "sum": loss.sum(), "mean": loss.mean()}[reduction]


def _pointwise_loss(fn):
    def loss(input, target, weight=None, reduction="mean"):  # noqa: A002 - torch's names
        err = fn(input - target)
        if weight is None:
            return _reduce(err, reduction)
        err = err * weight  # the weighted mean divides by the weights' sum
        return err.sum() / weight.sum() if reduction == "mean" else _reduce(err, reduction)
    return loss


def _class_axis(x) -> int:
    return 1 if x.ndim >= 2 else 0


def _nll_loss(input, target, weight=None, reduction="mean", ignore_index=-100):  # noqa: A002
    axis = _class_axis(input)
    w = np.ones(input.shape[axis]) if weight is None else weight
    valid = target != ignore_index
    t = np.where(valid, target, 0).astype(np.int64)
    picked = np.take_along_axis(np.moveaxis(input, axis, -1), t[..., None], -1)[..., 0]
    wt = np.where(valid, w[t], 0.0)
    loss = -wt * picked
    return loss.sum() / wt.sum() if reduction == "mean" else _reduce(loss, reduction)


def _cross_entropy(input, target, weight=None, reduction="mean", ignore_index=-100,  # noqa: A002
                   label_smoothing=0.0):
    """torch's rules: class-index targets mix the nll with the smoothing term -sum_c w_c logp_c
    / C (ignored targets 0, the weighted mean divides both by the targets' weights);
    probability targets are blended toward 1 / C, and their mean divides by the sample count."""
    axis = _class_axis(input)
    n_classes = input.shape[axis]
    logp = log_softmax(input, axis)
    wb = 1.0 if weight is None else _channel(weight, input) if axis == 1 else weight
    if target.dtype.kind in "iu":
        nll = _nll_loss(logp, target, weight, reduction, ignore_index)
        if not label_smoothing:
            return nll
        valid = target != ignore_index
        smooth = np.where(valid, -(logp * wb).sum(axis), 0.0)
        if reduction == "mean":
            w = np.ones(n_classes) if weight is None else weight
            smooth = smooth.sum() / w[np.where(valid, target, 0)][valid].sum()
        else:
            smooth = _reduce(smooth, reduction)
        return (1 - label_smoothing) * nll + smooth * (label_smoothing / n_classes)
    if label_smoothing:
        target = target * (1 - label_smoothing) + label_smoothing / n_classes
    per = -(logp * target * wb).sum(axis)
    return per.sum() / (input.size / n_classes) if reduction == "mean" else _reduce(per,
                                                                                    reduction)


def _kl_div(input, target, reduction="mean", log_target=False):  # noqa: A002
    if log_target:
        pointwise = np.exp(target) * (target - input)
    else:  # 0 * log(0) counts as 0
        safe = np.where(target > 0, target, 1.0)
        pointwise = np.where(target > 0, target * (np.log(safe) - input), -target * input)
    if reduction == "batchmean":
        return pointwise.sum() / input.shape[0]
    return _reduce(pointwise, reduction)


def classes(ignore_frac: float = 0.0) -> Callable:
    """Class indices for input 0 (its axis 1, or 0 when 1-D), a share of them the case's
    ignore_index; at least one target stays counted (a mean over none is nan)."""
    def draw(rng, shape, dtype, spec):
        x_shape = concrete(spec.shapes[0])
        n = x_shape[1 if len(x_shape) >= 2 else 0]
        ignore = spec.kwargs.get("ignore_index", -100)
        t = rng.integers(0, n, shape)
        if ignore_frac:
            t = np.where(rng.random(shape) < ignore_frac, ignore, t)
        if (t == ignore).all():
            t.reshape(-1)[0] = (ignore + 1) % n if 0 <= ignore < n else 0
        return np.asarray(t, np.int64)
    return draw


def _log_probs(rng, shape, dtype, spec):
    """log_softmax of normals along the class axis (nll_loss's input)."""
    x = rng.standard_normal(shape)
    return log_softmax(x, 1 if len(shape) >= 2 else 0).astype(NP[dtype])


def _probs(rng, shape, dtype, spec):
    """Uniform weights normalized along the class axis (probability targets)."""
    p = rng.random(shape)
    return (p / p.sum(axis=1 if len(shape) >= 2 else 0, keepdims=True)).astype(NP[dtype])


def _kl_domain(rng, spec, dtype):
    """Log-probabilities, and target probabilities (one exactly 0) or their logs."""
    shape = concrete(spec.shapes[0])
    inp = log_softmax(rng.standard_normal(shape), -1)
    target = log_softmax(rng.standard_normal(shape), -1)
    if not spec.kwargs["log_target"]:
        target = np.exp(target)
        target.flat[0] = 0.0
    return inp.astype(NP[dtype]), target.astype(NP[dtype])


PAIR_SHAPES = [((1,), (1,)), ((7,), (7,)), ((3, 33), (3, 33)), ((2, 7, 5), (7, 1)), ((), ())]
CLASS_SHAPES = [(1, 1), (7, 3), (5, 33), (2, 7, 4), (3, 5, 2, 3), (7,), (1, 7)]
# ignore_index=0 with a single class would ignore every target (tested on its own)
NLL_CASES = [(s, i) for s in [(1, 1), (5, 33), (2, 7, 4), (7,)] for i in (-100, 0)
             if not (s[1 if len(s) > 1 else 0] == 1 and i == 0)]


def _target_shape(ishape):
    axis = 1 if len(ishape) >= 2 else 0
    return ishape[:axis] + ishape[axis + 1:], ishape[axis]


def _loss(name, op, build, oracle, cases, torch, domain=("normal",)):
    return _nn(name, op, build, oracle, cases, torch, domain=domain)


def _torch_loss(name):
    return lambda torch, *ts, **kw: getattr(torch.nn.functional, name)(*ts, **kw)


def _torch_ce(torch, input, target, weight=None, **kw):  # noqa: A002
    return torch.nn.functional.cross_entropy(input, target, weight, **kw)


def _torch_nll(torch, input, target, weight=None, **kw):  # noqa: A002
    return torch.nn.functional.nll_loss(input, target, weight, **kw)


def _torch_pointwise(name):
    def fn(torch, input, target, weight=None, **kw):  # noqa: A002
        if weight is not None:
            kw["weight"] = weight
        return getattr(torch.nn.functional, name)(input, target, **kw)
    return fn


LOSSES = [
    *[_loss(name, name,
            lambda i, t, w=None, name=name, **kw: getattr(tg, name)(i, t, w, **kw),
            _pointwise_loss(fn),
            [S(i, t, reduction=r) for i, t in PAIR_SHAPES for r in REDUCTIONS]
            + [S((4, 7), (4, 7), (4, 7), reduction=r, domain=("normal", "normal",
                                                              _uniform(0.0, 1.0)))
               for r in REDUCTIONS],
            _torch_pointwise(name))
      for name, fn in (("mse_loss", lambda d: d * d), ("l1_loss", np.abs))],
    _loss("cross_entropy", "cross_entropy",
          lambda i, t, w=None, **kw: tg.cross_entropy(i, t, w, **kw), _cross_entropy,
          [S(s, _target_shape(s)[0], reduction=r, label_smoothing=ls,
             domain=(_normal(2.0), classes()))
           for s in CLASS_SHAPES for r in REDUCTIONS for ls in (0.0, 0.2)]
          + [S((9, 5, 3), (9, 3), *[(5,)] * weighted, reduction=r, ignore_index=ii,
               label_smoothing=ls, domain=("normal", classes(0.3), "positive"))
             for ii in (-100, 2) for r in REDUCTIONS for ls in (0.0, 0.1) for weighted in (0, 1)]
          + [S(s, s, *[(_target_shape(s)[1],)] * weighted, reduction=r, label_smoothing=ls,
               domain=("normal", _probs, "positive"))
             for s in [(7, 3), (2, 5, 4), (5,)] for r in REDUCTIONS for ls in (0.0, 0.3)
             for weighted in (0, 1)],
          _torch_ce),
    # logits of order 1e4 with label smoothing: every term shifted before exp
    _loss("cross_entropy_large", "cross_entropy",
          lambda i, t, **kw: tg.cross_entropy(i, t, **kw), _cross_entropy,
          [S((7, 33), (7,), reduction="none", label_smoothing=0.1,
             domain=(_normal(1e4), classes()))], _torch_ce),
    _loss("nll_loss", "nll_loss", lambda i, t, w=None, **kw: tg.nll_loss(i, t, w, **kw),
          _nll_loss,
          [S(s, _target_shape(s)[0], *[(_target_shape(s)[1],)] * weighted, reduction=r,
             ignore_index=ii, domain=(_log_probs, classes(0.2), "positive"))
           for s, ii in NLL_CASES for r in REDUCTIONS for weighted in (0, 1)],
          _torch_nll),
    _loss("kl_div", "kl_div", lambda i, t, **kw: tg.kl_div(i, t, **kw), _kl_div,
          [S(s, s, reduction=r, log_target=lt) for s in [(1,), (7,), (3, 33), (2, 7, 5)]
           for r in REDUCTIONS + ("batchmean",) for lt in (False, True)],
          _torch_loss("kl_div"), domain=_kl_domain),
]


# ------------------------------------------------------------------------------ shape ops
SHAPE = [
    OpInfo(name, name, lambda x, diagonal, name=name: getattr(tg, name)(x, diagonal=diagonal),
           (lambda x, diagonal: np.triu(x, diagonal)) if name == "triu"
           else (lambda x, diagonal: np.tril(x, diagonal)),
           ("float64", "float32", "int64", "bool"),
           [S(s, diagonal=k) for s in [(1, 1), (4, 4), (3, 7), (7, 3), (2, 3, 5, 4)]
            for k in (-3, -1, 0, 1, 2, 9)], check="exact",
           torch=lambda torch, x, diagonal, name=name: getattr(torch, name)(x, diagonal=diagonal))
    for name in ("triu", "tril")
] + [
    OpInfo("tile", "tile", lambda x, reps: tg.tile(x, reps=reps), lambda x, reps: np.tile(x, reps),
           ("float64", "float32", "int64", "bool"),
           [S(s, reps=r) for s, r in [((3,), (2,)), ((3, 4), (2, 3)), ((3, 4), (2,)),
                                      ((3, 4), (2, 1, 3)), ((1,), (5, 1)), ((2, 1, 3), (1, 4, 2)),
                                      ((2, 3), (0, 2)), ((2, 3), (1, 1)), ((4,), 3)]],
           check="exact",
           torch=lambda torch, x, reps: torch.tile(
               x, reps if isinstance(reps, tuple) else (reps,))),
]


# ------------------------------------------------------------------------------ selection, scatter
def _argsort_ref(x, axis=-1, descending=False):
    """Python's stable sorted() per line: nan after every number ascending, before descending."""
    def key(v: float) -> tuple:
        nan = math.isnan(v)
        return (not nan, 0.0 if nan else -v) if descending else (nan, 0.0 if nan else v)

    moved = np.moveaxis(x, axis, -1)
    out = np.empty(moved.shape, np.int64)
    for line in np.ndindex(*moved.shape[:-1]):
        keys = [key(float(v)) for v in moved[line]]
        out[line] = sorted(range(len(keys)), key=keys.__getitem__)
    return np.moveaxis(out, -1, axis)


def _scatter_ref(x, i, u, axis=0, reduce="sum"):
    """Every update combined into its place, one after another in row-major order."""
    ax = axis % x.ndim
    out = np.array(x, copy=True)
    combine = {"sum": lambda a, b: a + b, "prod": lambda a, b: a * b,
               "amax": lambda a, b: a if a != a else b if b != b else max(a, b),
               "amin": lambda a, b: a if a != a else b if b != b else min(a, b)}[reduce]
    if x.dtype == np.bool_:
        combine = {"sum": lambda a, b: a or b, "prod": lambda a, b: a and b,
                   "amax": lambda a, b: a or b, "amin": lambda a, b: a and b}[reduce]
    for pos in np.ndindex(*u.shape):
        j = i[pos[ax:ax + i.ndim]]
        dest = pos[:ax] + (j,) + pos[ax + i.ndim:]
        out[dest] = combine(out[dest], u[pos])
    return out


def _take_along_ref(x, i, axis=-1):
    """torch.gather: out[p] = x[p with its axis coordinate replaced by i[p]]."""
    ax = axis % x.ndim
    out = np.empty(i.shape, x.dtype)
    for pos in np.ndindex(*i.shape):
        out[pos] = x[pos[:ax] + (int(i[pos]),) + pos[ax + 1:]]
    return out


def _put_along_ref(x, i, v, axis=-1, reduce="replace", include_self=True):
    """torch's scatter/scatter_reduce per element: x[..., i[p], ...] gets v[p] (p row-major)."""
    ax = axis % x.ndim
    out = np.array(x, copy=True)
    landed: dict = {}
    for pos in np.ndindex(*i.shape):
        dest = pos[:ax] + (int(i[pos]),) + pos[ax + 1:]
        landed.setdefault(dest, []).append(v[pos] if v.ndim else v[()])
    for dest, vals in landed.items():
        if reduce == "replace":
            out[dest] = vals[-1]
            continue
        terms = ([x[dest]] if include_self else []) + vals
        if reduce in ("sum", "mean"):
            total = sum(terms[1:], terms[0])
            out[dest] = total / len(terms) if reduce == "mean" else total
        elif reduce == "prod":
            out[dest] = math.prod(terms[1:], start=terms[0])
        else:
            pick = max if reduce == "amax" else min
            out[dest] = np.nan if any(t != t for t in terms) else pick(terms)
    return out


def _index_copy_ref(x, i, u, axis=0):
    """Places written in row-major order of the index: the last writer stays."""
    ax = axis % x.ndim
    out = np.array(x, copy=True)
    for pos in np.ndindex(*u.shape):
        out[pos[:ax] + (i[pos[ax:ax + i.ndim]],) + pos[ax + i.ndim:]] = u[pos]
    return out


def _torch_scatter(torch, x, i, u, axis=0, reduce="sum"):
    ax = axis % x.ndim
    rows = u.reshape(x.shape[:ax] + (-1,) + x.shape[ax + 1:])
    if reduce == "sum":
        return x.index_add(ax, i.reshape(-1), rows)
    return x.index_reduce(ax, i.reshape(-1), rows, reduce, include_self=True)


def _scatter_index(rng, spec, dtype):
    """x, indices with repeats (in range of the axis), updates of the matching shape."""
    sx, si, su = (concrete(s) for s in spec.shapes)
    n = sx[spec.kwargs["axis"] % len(sx)]
    kind = "finite" if spec.kwargs["reduce"] == "prod" else "nocancel"
    x = DOMAINS[kind](rng, sx, dtype)
    u = DOMAINS[kind](rng, su, dtype)
    if dtype in INTS and spec.kwargs["reduce"] == "prod":
        x, u = _ints_small(rng, sx, dtype), _ints_small(rng, su, dtype)
    return x, rng.integers(0, n, si).astype(np.int64), u


def _scatter_cases(dtype):
    shapes = [((7,), (9,), 0), ((5, 4), (2, 3), 0), ((3, 6), (2, 2), 1), ((2, 3, 4), (7,), 2),
              ((4,), (), 0), ((4, 2), (0,), 0)]
    return [S(x, i, x[:a] + i + x[a + 1:], axis=a, reduce=r)
            for x, i, a in shapes for r in ("sum", "prod", "amax", "amin")]


def _along_domain(rng, spec, dtype):
    """x; indices in range of x's axis (repeats included), no larger than x elsewhere; values
    (or none: a scalar fill)."""
    sx, si = concrete(spec.shapes[0]), concrete(spec.shapes[1])
    axis = spec.kwargs["axis"] % len(sx)
    reduce = spec.kwargs.get("reduce", "replace")
    kind = "finite" if reduce in ("prod", "mean") else "nocancel"
    x = DOMAINS[kind](rng, sx, dtype)
    i = rng.integers(0, sx[axis], si).astype(np.int64)
    if len(spec.shapes) == 2:
        return x, i
    return x, i, DOMAINS[kind](rng, concrete(spec.shapes[2]), dtype)


ALONG = [((5, 4), (5, 3), 1), ((5, 4), (7, 4), 0), ((3, 4, 5), (2, 4, 3), 2), ((6,), (9,), 0),
         ((3, 4), (2, 2), 1), ((2, 3), (2, 0), 1)]


def _put_cases(dtype):
    out = []
    for x, i, a in ALONG:
        for reduce in ("replace", "sum", "prod", "amax", "amin", "mean"):
            for include in (True, False) if reduce != "replace" else (True,):
                # values larger than the index on every axis, as torch allows
                out.append(S(x, i, tuple(d + 1 for d in i), axis=a, reduce=reduce,
                             include_self=include))
    return out


def _torch_put(torch, x, i, v, axis, reduce, include_self):
    if reduce == "replace":
        return torch.scatter(x, axis, i, v)
    return torch.scatter_reduce(x, axis, i, v, reduce, include_self=include_self)


SELECTION_ATOMIC = [
    OpInfo("argsort", "argsort", lambda x, axis, descending: tg.argsort(x, axis, descending),
           _argsort_ref, ALL,
           [S(s, axis=a, descending=d) for s, a in [((7,), 0), ((3, 33), 1), ((33, 3), 0),
                                                     ((2, 3, 5), 1), ((1,), 0), ((0, 4), 1)]
            for d in (False, True)],
           domain=("rounded",), check="exact",
           torch_dtypes=tuple(d for d in ALL if d not in ("bfloat16",)),
           torch=lambda torch, x, axis, descending: torch.sort(
               x, dim=axis, descending=descending, stable=True).indices),
    OpInfo("scatter", "scatter", lambda x, i, u, axis, reduce: tg.scatter(x, i, u, axis, reduce),
           _wrap(_scatter_ref), ALL, _scatter_cases, domain=_scatter_index,
           torch_dtypes=tuple(d for d in ALL if d != "bool"), torch=_torch_scatter),
]

SELECTION = [
    OpInfo("take_along_axis", "take_along_axis",
           lambda x, i, axis: tg.take_along_axis(x, i, axis=axis), _take_along_ref, ALL,
           [S(x, i, axis=a) for x, i, a in ALONG], domain=_along_domain, check="exact",
           torch=lambda torch, x, i, axis: torch.gather(x, axis, i)),
    OpInfo("put_along_axis", "put_along_axis",
           lambda x, i, v, **kw: tg.put_along_axis(x, i, v, **kw), _put_along_ref,
           ("float64", "float32"), _put_cases, domain=_along_domain, check="float",
           tol64=1e-12, tol32=1e-6, torch=_torch_put),
    OpInfo("put_along_axis_int", "put_along_axis",
           lambda x, i, v, **kw: tg.put_along_axis(x, i, v, **kw), _wrap(_put_along_ref),
           ("int64", "int32", "uint8"),
           [c for c in _put_cases("int64") if c.kwargs["reduce"] != "mean"],
           domain=_along_domain, check="exact", torch=_torch_put),
    OpInfo("put_along_axis_value", "put_along_axis",
           lambda x, i, axis, reduce: tg.put_along_axis(x, i, 2.5, axis=axis, reduce=reduce),
           lambda x, i, axis, reduce: _put_along_ref(x, i, np.array(2.5, x.dtype), axis, reduce),
           ("float64", "float32"), [S(x, i, axis=a, reduce=r) for x, i, a in ALONG
                                    for r in ("replace", "sum")],
           domain=_along_domain, check="float",
           torch=lambda torch, x, i, axis, reduce: torch.scatter(x, axis, i, 2.5) if
           reduce == "replace" else torch.scatter_add(x, axis, i, torch.full(i.shape, 2.5,
                                                                              dtype=x.dtype))),
    OpInfo("index_copy", "index_copy", lambda x, i, u, axis: tg.index_copy(x, i, u, axis=axis),
           _index_copy_ref, ALL,
           [S(x, i, x[:a] + i + x[a + 1:], axis=a) for x, i, a in
            [((7,), (9,), 0), ((5, 4), (2, 3), 0), ((3, 6), (2, 2), 1), ((2, 3, 4), (7,), 2),
             ((4, 2), (0,), 0)]],
           domain=lambda rng, spec, dtype: _scatter_index(
               rng, S(*spec.shapes, axis=spec.kwargs["axis"], reduce="replace"), dtype),
           check="exact"),
    OpInfo("cumprod", "cumprod", lambda x, axis: tg.cumprod(x, axis=axis),
           lambda x, axis: np.cumprod(x, axis), ("float64", "float32"),
           [S(s, axis=a) for s, a in [((7,), 0), ((3, 9), 1), ((3, 9), 0), ((2, 3, 5), 2),
                                      ((0, 3), 1)]],
           domain=("finite",), check="float", tol32=1e-5,
           torch=lambda torch, x, axis: torch.cumprod(x, axis)),
    OpInfo("cumprod_int", "cumprod", lambda x, axis: tg.cumprod(x, axis=axis),
           lambda x, axis: np.cumprod(x, axis, dtype=x.dtype), ("int64", "int32", "int8"),
           [S((3, 9), axis=1), S((4,), axis=0)], domain=("small",), check="exact",
           torch=lambda torch, x, axis: torch.cumprod(x, axis, dtype=x.dtype)),
    *[OpInfo(name, name, lambda x, axis, keepdims, name=name: getattr(tg, name)(
              x, axis=axis, keepdims=keepdims),
             lambda x, axis, keepdims, name=name: getattr(np, name)(
                 x != 0, axis=reduced_axes(axis, x.ndim), keepdims=keepdims), ALL,
             [S(s, axis=a, keepdims=k) for s, a, k in [((7,), None, False), ((3, 5), 1, True),
                                                        ((3, 5), 0, False), ((0, 4), 0, False),
                                                        ((2, 0), 1, True), ((), None, False)]],
             domain=("quarters",), check="exact",
             torch=lambda torch, x, axis, keepdims, name=name: getattr(torch, name)(
                 x, dim=reduced_axes(axis, x.ndim), keepdim=keepdims))
      for name in ("any", "all")],
]


# ------------------------------------------------------------------------------ rows: recurrent
def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def _affine(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


def _rnn_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None, nonlinearity="tanh"):
    a = _affine(x, w_ih, b_ih) + _affine(h, w_hh, b_hh)
    return np.tanh(a) if nonlinearity == "tanh" else np.maximum(a, 0.0)


def _gru_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    xr, xz, xn = np.split(_affine(x, w_ih, b_ih), 3, axis=-1)
    hr, hz, hn = np.split(_affine(h, w_hh, b_hh), 3, axis=-1)
    r, z = _sig(xr + hr), _sig(xz + hz)
    n = np.tanh(xn + r * hn)
    return (1.0 - z) * n + z * h


def _lstm_hc(x, h, c, w_ih, w_hh, b_ih=None, b_hh=None, w_hr=None):
    i, f, g, o = np.split(_affine(x, w_ih, b_ih) + _affine(h, w_hh, b_hh), 4, axis=-1)
    c2 = _sig(f) * c + _sig(i) * np.tanh(g)
    h2 = _sig(o) * np.tanh(c2)
    return (h2 if w_hr is None else h2 @ w_hr.T), c2


def _unrolled(cell, x, states, reverse):
    """Every position's states (h first) side by side, the cell run forward or backward."""
    out = [None] * len(x)
    for t in (reversed(range(len(x))) if reverse else range(len(x))):
        states = cell(x[t], *states)
        out[t] = np.concatenate(states, axis=-1)
    return np.stack(out)


def _rnn_layer(x, h0, w_ih, w_hh, b_ih=None, b_hh=None, nonlinearity="tanh", reverse=False,
               max_steps=None):
    return _unrolled(lambda xt, h: (_rnn_cell(xt, h, w_ih, w_hh, b_ih, b_hh, nonlinearity),),
                     x, (h0,), reverse)


def _gru_layer(x, h0, w_ih, w_hh, b_ih=None, b_hh=None, reverse=False, max_steps=None):
    return _unrolled(lambda xt, h: (_gru_cell(xt, h, w_ih, w_hh, b_ih, b_hh),), x, (h0,),
                     reverse)


def _lstm_layer(x, h0, c0, w_ih, w_hh, b_ih=None, b_hh=None, w_hr=None, reverse=False,
                max_steps=None):
    return _unrolled(lambda xt, h, c: _lstm_hc(xt, h, c, w_ih, w_hh, b_ih, b_hh, w_hr), x,
                     (h0, c0), reverse)


def _torch_cell(kind):
    """torch's own cell functions (torch.rnn_tanh_cell...), one step."""
    def step(torch, x, h, c, w_ih, w_hh, b_ih, b_hh, w_hr=None, nonlinearity="tanh"):
        if kind == "lstm" and w_hr is not None:  # torch.lstm_cell has no projection
            gates = x @ w_ih.T + h @ w_hh.T + (0 if b_ih is None else b_ih + b_hh)
            i, f, g, o = gates.chunk(4, dim=-1)
            c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            return (torch.sigmoid(o) * torch.tanh(c2)) @ w_hr.T, c2
        if kind == "lstm":
            return torch.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh)
        fn = torch.gru_cell if kind == "gru" else getattr(torch, f"rnn_{nonlinearity}_cell")
        return fn(x, h, w_ih, w_hh, b_ih, b_hh), None
    return step


def _torch_recurrent(kind, layer):
    """The row's torch column: torch's cell, once or over the sequence (torch has no single
    reversed layer: the steps run backward here)."""
    step = _torch_cell(kind)

    def run(torch, x, h, *rest, nonlinearity="tanh", reverse=False, max_steps=None):
        c, rest = (rest[0], rest[1:]) if kind == "lstm" else (None, rest)
        w_ih, w_hh, b_ih, b_hh, *w_hr = (*rest, None, None)[:4] + rest[4:5]
        w_hr = w_hr[0] if w_hr else None
        if not layer:
            h2, c2 = step(torch, x, h, c, w_ih, w_hh, b_ih, b_hh, nonlinearity=nonlinearity)
            return torch.stack([h2, c2]) if kind == "lstm" else h2
        out = [None] * x.shape[0]
        for t in (reversed(range(x.shape[0])) if reverse else range(x.shape[0])):
            h, c = step(torch, x[t], h, c, w_ih, w_hh, b_ih, b_hh, w_hr, nonlinearity)
            out[t] = h if c is None else torch.cat([h, c], dim=-1)
        return torch.stack(out)
    return run


def _cell_cases(gates: int, states: int) -> list[Spec]:
    out = []
    for b, i, hid in [(1, 1, 1), (3, 5, 4), ("batch", 7, 6)]:
        for biases in (True, False):
            bias = [(gates * hid,)] * 2 if biases else [None, None]
            out.append(S((b, i), *[(b, hid)] * states, (gates * hid, i), (gates * hid, hid),
                         *bias))
    return out


def _layer_cases(gates: int, states: int, proj: bool = False) -> list[Spec]:
    out = []
    for t, b, i, hid in [(1, 1, 1, 1), (5, 3, 4, 6), (4, "batch", 3, 5)]:
        for reverse in (False, True):
            for biases in (True, False):
                bias = [(gates * hid,)] * 2 if biases else [None, None]
                out.append(S((t, b, i), *[(b, hid)] * states, (gates * hid, i),
                             (gates * hid, hid), *bias, reverse=reverse))
    # a symbolic length, unrolled up to max_steps and masked past the drawn length
    out.append(S(("seq", 2, 3), *[(2, 4)] * states, (gates * 4, 3), (gates * 4, 4),
                 (gates * 4,), (gates * 4,), reverse=False, max_steps=5))
    out.append(S(("seq", 2, 3), *[(2, 4)] * states, (gates * 4, 3), (gates * 4, 4), None, None,
                 reverse=True, max_steps=4))
    if proj:  # torch's proj_size: h is w_hr's projection of the hidden state
        out += [S((5, 2, 3), (2, 2), (2, 4), (16, 3), (16, 2), (16,), (16,), (2, 4),
                  reverse=reverse) for reverse in (False, True)]
    return out


RECURRENT = [
    _nn(f"rnn_cell_{act}", "rnn_cell",
        lambda *a, nonlinearity=act: tg.rnn_cell(*a, nonlinearity=nonlinearity),
        lambda *a, nonlinearity=act: _rnn_cell(*a, nonlinearity=nonlinearity),
        _cell_cases(1, 1),
        lambda torch, x, h, *w, nonlinearity=act: _torch_recurrent("rnn", False)(
            torch, x, h, *w, nonlinearity=nonlinearity))
    for act in ("tanh", "relu")
] + [
    _nn("gru_cell", "gru_cell", tg.gru_cell, _gru_cell, _cell_cases(3, 1),
        _torch_recurrent("gru", False)),
    _nn("lstm_cell", "lstm_cell", tg.lstm_cell,
        lambda x, h, c, *w: np.stack(_lstm_hc(x, h, c, *w)), _cell_cases(4, 2),
        _torch_recurrent("lstm", False)),
] + [
    _nn(f"rnn_layer_{act}", "rnn_layer",
        lambda *a, nonlinearity=act, **kw: tg.rnn_layer(*a, nonlinearity=nonlinearity, **kw),
        lambda *a, nonlinearity=act, **kw: _rnn_layer(*a, nonlinearity=nonlinearity, **kw),
        _layer_cases(1, 1),
        lambda torch, *a, nonlinearity=act, **kw: _torch_recurrent("rnn", True)(
            torch, *a, nonlinearity=nonlinearity, **kw))
    for act in ("tanh", "relu")
] + [
    _nn("gru_layer", "gru_layer", tg.gru_layer, _gru_layer, _layer_cases(3, 1),
        _torch_recurrent("gru", True)),
    _nn("lstm_layer", "lstm_layer", tg.lstm_layer, _lstm_layer, _layer_cases(4, 2, proj=True),
        _torch_recurrent("lstm", True)),
]


# ------------------------------------------------------------------------------ random
# Philox-4x32-10 written out per block with Python ints (Salmon et al. 2011; Random123's
# constants), independent of the vectorised reference in tensor_graphs/ir/ops/random.py
def _philox_words(key, n, stream):
    seed, step = (int(v) % (1 << 64) for v in np.asarray(key).reshape(-1))
    m = (1 << 32) - 1
    words = []
    for block in range((n + 3) // 4):
        c = [block, stream, step & m, step >> 32]
        k = [seed & m, seed >> 32]
        for _ in range(10):
            p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
            c = [((p1 >> 32) ^ c[1] ^ k[0]) & m, p1 & m, ((p0 >> 32) ^ c[3] ^ k[1]) & m, p0 & m]
            k = [(k[0] + 0x9E3779B9) & m, (k[1] + 0xBB67AE85) & m]
        words += c
    return np.array(words[:n], np.int64)


def _random_bits_ref(key, shape, stream):
    return _philox_words(key, math.prod(shape), stream).reshape(shape)


def _dropped(key, shape, p, stream):
    """Where dropout zeroes: the word below p * 2**32."""
    return _philox_words(key, math.prod(shape), stream).reshape(shape) < round(p * 2 ** 32)


def _dropout_ref(x, key, p, stream):
    kept = x.astype(np.float64) * (1.0 / (1.0 - p))
    return np.where(_dropped(key, x.shape, p, stream), 0.0, kept)


def _torch_dropout(torch, x, key, p, stream):
    """torch's where over the same mask: torch.autograd's gradient of our dropout."""
    drop = torch.from_numpy(_dropped(key.numpy(), tuple(x.shape), p, stream))
    return torch.where(drop, torch.zeros((), dtype=x.dtype), x * (1.0 / (1.0 - p)))


def _key_domain(rng, spec, dtype):
    """The key [seed, step] over the whole int64 range (both 32-bit words of each vary)."""
    key = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, 2, dtype=np.int64)
    return [key]


def _dropout_domain(rng, spec, dtype):
    return [sample(dtype, concrete(spec.shapes[0]), rng, "none")] + _key_domain(rng, spec, dtype)


RANDOM_ATOMIC = [
    OpInfo("random_bits", "random_bits",
           lambda key, shape, stream: tg.random_bits(key, shape, stream), _random_bits_ref,
           ("int64",), [S((2,), shape=s, stream=k) for k, s in enumerate(
               [(7,), (33,), (2, 3, 5), (1,), (0,), (4, 257)])] + [S((2,), shape=(9,),
                                                                    stream=(1 << 32) - 1)],
           domain=_key_domain, check="exact"),
]
RANDOM = [
    OpInfo("dropout", "dropout",
           lambda x, key, p, stream: tg.dropout(x, p, key, stream=stream), _dropout_ref,
           ("float64", "float32"), [S(s, (2,), p=p, stream=k) for k, (s, p) in enumerate(
               [((7,), 0.5), ((33,), 0.1), ((2, 3, 5), 0.9), ((1,), 1 / 3), ((4, 257), 0.25)])],
           domain=_dropout_domain, check="float", tol64=1e-12, tol32=1e-7,
           torch=_torch_dropout),
]


# stop_gradient: its value bit for bit; its gradient is defined, not derived
# (tests/autodiff/test_grad_marks.py runs these rows and checks the gradients against torch)
GRADIENT = [
    OpInfo("stop_gradient", "stop_gradient", tg.stop_gradient, lambda x: x, ALL, U,
           check="exact", torch=lambda torch, x: x.detach()),
]


# ------------------------------------------------------------------------------ the table
def _family(name: str, rows: list[OpInfo]) -> list[OpInfo]:
    return [OpInfo(**{**r.__dict__, "family": name}) for r in rows]


TABLE: list[OpInfo] = (_family("atomic", ATOMIC) + _family("composites", COMPOSITES)
                       + _family("composites", INT_COMPOSITES) + _family("nn", NN)
                       + _family("nn", RECURRENT)
                       + _family("conv", CONV) + _family("losses", LOSSES)
                       + _family("shape", SHAPE) + _family("atomic", SELECTION_ATOMIC)
                       + _family("atomic", POINTWISE_ATOMIC) + _family("pointwise", POINTWISE)
                       + _family("selection", SELECTION)
                       + _family("atomic", RANDOM_ATOMIC) + _family("random", RANDOM)
                       + _family("gradient", GRADIENT))
BY_NAME: dict[str, OpInfo] = {r.name: r for r in TABLE}
assert len(BY_NAME) == len(TABLE), "two rows share a name"

# ops of tensor_graphs.ir.ops.OPS with no row, and why
EXCLUDED = {
    "input": "a leaf: its value is its feed, which every row's cases exercise",
    "weight": "a leaf: evaluated like input, its value is its feed",
    "state": "a leaf: its value is its feed (state_update's row builds one)",
    "constant": "a leaf: its value is its payload (tests/test_ir.py checks constants)",
    "dim": "a leaf: the value of a size expression (mean over a symbolic axis divides by it)",
}


def rows(family: str) -> list[OpInfo]:
    return [r for r in TABLE if r.family == family]


def params(family: str, torch: bool = False) -> list:
    """(row, dtype) pairs of a family for pytest.mark.parametrize, with readable ids; with
    torch, only rows that have a torch column and the dtypes it is compared in."""
    out = []
    for r in rows(family):
        if torch and r.torch is None:
            continue
        for dtype in (r.torch_dtypes or r.dtypes) if torch else r.dtypes:
            out.append(pytest.param(r, dtype, id=f"{r.name}-{dtype}"))
    return out
