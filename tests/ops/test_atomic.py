"""The atomic ops, table-driven: every op x every dtype it accepts x several shapes, against an
independent numpy expression and against torch (float64 for floats) where torch has the op.

Semantics checked, per dtype of the computation:
- float64: norm-wise relative error ||got - ref|| / ||ref|| <= 1e-12 (or exact);
- float32: <= 1e-6 against the float64 result rounded to float32;
- float16/bfloat16: "compute in float32, round once per op": exactly the float32 result
  rounded once;
- ints and bool: exact (ints wrap like numpy and torch);
- nan and +-inf positions always match exactly.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import sympy

import tensor_graphs as tg
from tensor_graphs.ir.ops import OPS
from tensor_graphs.ir.ops.atomic import ATOMIC_OPS
from tensor_graphs.numerics import relative_error as rel_err

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # nan/inf inputs on purpose

ALL = ("bool", "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64")
INTS = ("uint8", "int8", "int32", "int64")
FLOATS = ("float16", "bfloat16", "float32", "float64")
LOW = ("float16", "bfloat16")
NUM = INTS + FLOATS
NP = {name: getattr(tg, name if name != "bool" else "bool_").np_dtype for name in ALL}
TORCH = {"bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8, "int32": torch.int32,
         "int64": torch.int64, "float16": torch.float16, "bfloat16": torch.bfloat16,
         "float32": torch.float32, "float64": torch.float64}
TOL = {"float32": 1e-6, "float64": 1e-12}


# ------------------------------------------------------------------------------ inputs
def rng_for(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


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


# ------------------------------------------------------------------------------ checks


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
    err = rel_err(g[fin], r[fin])
    assert err <= tol, f"{what}: norm-wise relative error {err:.3g} > {tol:g}"


def check_exact(got, ref, what: str = "", zero_sign: bool = True) -> None:
    """Same dtype, shape and values (nan equals nan; -0.0 differs from 0.0 if zero_sign)."""
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.dtype == ref.dtype, (what, got.dtype, ref.dtype)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    if got.dtype.kind == "f" or got.dtype == NP["bfloat16"]:
        g, r = got.astype(np.float64), ref.astype(np.float64)
        same = (g == r) | (np.isnan(g) & np.isnan(r))
        assert same.all(), f"{what}: values differ at {np.argwhere(~same)[:5].tolist()}"
        if zero_sign:
            assert np.array_equal(np.signbit(g[g == 0]), np.signbit(r[g == 0])), f"{what}: -0.0"
    else:
        assert np.array_equal(got, ref), f"{what}:\n{got}\n{ref}"


def check_dtype_semantics(got, ref_fn, args, dtype: str, what: str = "",
                          zero_sign: bool = True) -> None:
    """``ref_fn`` is an independent numpy expression; floats are computed per the dtype rule."""
    if dtype in LOW:  # compute in float32, round once
        ref = np.asarray(ref_fn(*[a.astype(np.float32) if a.dtype == NP[dtype] else a
                                  for a in args]))
        ref = ref.astype(np.float32).astype(NP[dtype]) if ref.dtype.kind == "f" else ref
        check_exact(got, ref, what, zero_sign)
    elif dtype in ("float32", "float64"):
        ref = np.asarray(ref_fn(*[a.astype(np.float64) if a.dtype.kind == "f" else a
                                  for a in args]))
        if ref.dtype.kind == "f":
            check_close(got, ref.astype(NP[dtype]), TOL[dtype], what)
            assert got.dtype == NP[dtype], (what, got.dtype)
        else:
            check_exact(got, ref, what)
    else:
        check_exact(got, np.asarray(ref_fn(*args)), what)  # ref_fn gives the result dtype


def torch_of(a: np.ndarray, lift: bool = True):
    """A torch tensor of a numpy array; floats become float64 (the torch oracle's precision)."""
    if a.dtype.kind == "f" or a.dtype == NP["bfloat16"]:
        return torch.from_numpy(a.astype(np.float64))
    return torch.from_numpy(np.array(a, copy=True))


def check_torch(node, feeds, torch_fn, args, what: str = "") -> None:
    """Against torch: floats in float64 (evaluate lifts), ints and bool exactly."""
    ref = torch_fn(*[torch_of(a) for a in args])
    ref = ref.numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    got = tg.evaluate(node, feeds, dtype="float64")
    if ref.dtype.kind == "f":
        assert got.dtype == np.float64, (what, got.dtype)
        check_close(got, ref, 1e-12, what + " vs torch")
    else:
        check_exact(got, ref.astype(got.dtype), what + " vs torch")


def leaves(dtype: str, *arrays):
    names = "abcdefgh"
    nodes = [tg.input(names[i], a.shape, dtype if a.dtype == NP[dtype] else
                      tg.ir.dtypes.from_numpy(a.dtype)) for i, a in enumerate(arrays)]
    return nodes, {names[i]: a for i, a in enumerate(arrays)}


# ------------------------------------------------------------------------------ elementwise
_erf64 = np.vectorize(math.erf, otypes=[np.float64])


def _erf_ref(x):
    return np.asarray(_erf64(x)).astype(x.dtype)


def _wrap(fn):
    """An int expression computed in int64 (Python-exact for our ranges), wrapped to the dtype."""
    def ref(*xs):
        if xs[0].dtype.kind in "iu":
            return fn(*[x.astype(np.int64) for x in xs]).astype(xs[0].dtype)
        return fn(*xs)
    return ref


#  name: (builder, independent numpy expression, torch function, dtypes)
UNARY = {
    "neg": (tg.neg, _wrap(lambda x: x * -1), torch.neg, NUM),
    "exp": (tg.exp, lambda x: np.e ** x, torch.exp, FLOATS),
    "log": (tg.log, np.log, torch.log, FLOATS),
    "sqrt": (tg.sqrt, lambda x: x ** 0.5 if x.dtype.kind == "f" else np.sqrt(x), torch.sqrt,
             FLOATS),
    "reciprocal": (tg.reciprocal, lambda x: 1 / x, torch.reciprocal, FLOATS),
    "sin": (tg.sin, np.sin, torch.sin, FLOATS),
    "erf": (tg.erf, _erf_ref, torch.special.erf, FLOATS),
}
UNARY_SHAPES = [(), (1,), (7,), (33,), (0,), (3, 0), (2, 7)]


@pytest.mark.parametrize("name,dtype", [(n, d) for n, v in UNARY.items() for d in v[3]])
def test_unary(name, dtype):
    build, ref_fn, torch_fn, _ = UNARY[name]
    for shape in UNARY_SHAPES:
        x = sample(dtype, shape, rng_for(name, dtype, shape))
        (a,), feeds = leaves(dtype, x)
        y = build(a)
        assert y.op.name == name and y.dtype.name == dtype and y.shape == shape
        what = f"{name} {dtype} {shape}"
        check_dtype_semantics(tg.evaluate(y, feeds), ref_fn, (x,), dtype, what)
        check_torch(y, feeds, torch_fn, (x,), what)


def _bool_or_int(fn_bool, fn):
    return lambda a, b: fn_bool(a, b) if a.dtype == np.bool_ else _wrap(fn)(a, b)


BINARY = {
    "add": (tg.add, _bool_or_int(lambda a, b: a | b, lambda a, b: a + b), torch.add, ALL),
    "mul": (tg.mul, _bool_or_int(lambda a, b: a & b, lambda a, b: a * b), torch.mul, ALL),
    "maximum": (tg.maximum, lambda a, b: np.where((a > b) | np.isnan(a) if a.dtype.kind == "f"
                                                  else a > b, a, b)
                if a.dtype != np.bool_ else a | b, torch.maximum, ALL),
    "pow": (tg.pow, _wrap(lambda a, b: a ** b), torch.pow, NUM),
    "equal": (tg.equal, lambda a, b: a == b, torch.eq, ALL),
    "less": (tg.less, lambda a, b: a < b, torch.lt, ALL),
}
BINARY_SHAPES = [((7,), (7,)), ((1,), (33,)), ((33,), ()), ((7, 1), (1, 33)), ((0, 3), (3,)),
                 ((2, 1, 7), (3, 1)), ((), ())]


def _nan_max(a, b):
    return np.where(np.isnan(b), b, np.where((a > b) | np.isnan(a), a, b))


BINARY["maximum"] = (tg.maximum, lambda a, b: a | b if a.dtype == np.bool_ else (
    _nan_max(a, b) if a.dtype.kind == "f" else np.where(a > b, a, b)), torch.maximum, ALL)


@pytest.mark.parametrize("name,dtype", [(n, d) for n, v in BINARY.items() for d in v[3]])
def test_binary(name, dtype):
    build, ref_fn, torch_fn, _ = BINARY[name]
    for sa, sb in BINARY_SHAPES:
        rng = rng_for(name, dtype, sa, sb)
        if name == "pow" and dtype in INTS:  # small bases, exponents >= 0: no overflow
            a, b = sample(dtype, sa, rng, "none", -5, 5), sample(dtype, sb, rng, "none", 0, 3)
            if dtype == "uint8":
                a = sample(dtype, sa, rng, "none", 0, 6)
        else:
            a, b = sample(dtype, sa, rng), sample(dtype, sb, rng)
            if name in ("equal", "less", "maximum") and sa == sb and a.size:  # some ties
                b = b.copy()
                b.reshape(-1)[: b.size // 2] = a.reshape(-1)[: b.size // 2]
        (na, nb), feeds = leaves(dtype, a, b)
        y = build(na, nb)
        out_dtype = "bool" if name in ("equal", "less") else dtype
        assert (y.op.name, y.dtype.name) == (name, out_dtype)
        assert y.shape == np.broadcast_shapes(sa, sb)
        what = f"{name} {dtype} {sa} {sb}"
        check_dtype_semantics(tg.evaluate(y, feeds), ref_fn, (a, b), dtype, what)
        check_torch(y, feeds, torch_fn, (a, b), what)


def test_int_pow_negative_exponent_raises():
    a, b = tg.input("a", (2,), "int32"), tg.input("b", (2,), "int32")
    with pytest.raises(tg.EvaluationError, match="negative"):
        tg.evaluate(a ** b, {"a": np.array([2, 3], np.int32), "b": np.array([1, -1], np.int32)})


@pytest.mark.parametrize("name", list(UNARY) + list(BINARY))
def test_elementwise_rejects_dtypes(name):
    accepted = (UNARY.get(name) or BINARY[name])[3]
    op = OPS[name]
    for dtype in ALL:
        x = tg.input("x", (3,), dtype)
        if dtype in accepted:
            continue
        if name in UNARY and dtype in INTS + ("bool",) and accepted == FLOATS:
            # the builder promotes ints to float32; the atomic op itself refuses them
            assert tg.evaluate(UNARY[name][0](x), {"x": np.ones(3, NP[dtype])}).dtype \
                == np.float32
        with pytest.raises(tg.DTypeError):
            tg.Node.make(op, (x,) * len(op.params))


@pytest.mark.parametrize("dtype", ALL)
def test_where(dtype):
    for sc, sa, sb in [((7,), (7,), (7,)), ((33,), (), (1,)), ((7, 1), (1, 33), (33,)),
                       ((0,), (1,), ()), ((), (7,), (7,))]:
        rng = rng_for("where", dtype, sc, sa, sb)
        c, a, b = sample("bool", sc, rng), sample(dtype, sa, rng), sample(dtype, sb, rng)
        (nc, na, nb), feeds = leaves(dtype, c, a, b)
        y = tg.where(nc, na, nb)
        assert y.dtype.name == dtype and y.shape == np.broadcast_shapes(sc, sa, sb)
        what = f"where {dtype} {sc} {sa} {sb}"
        ref = np.choose(np.broadcast_to(c, y.shape).astype(np.intp),
                        [np.broadcast_to(b, y.shape), np.broadcast_to(a, y.shape)])
        check_exact(tg.evaluate(y, feeds), ref, what)
        check_torch(y, feeds, torch.where, (c, a, b), what)
    with pytest.raises(tg.DTypeError):
        tg.where(tg.input("c", (3,), "int32"), tg.input("a", (3,)), 0.0)


# ------------------------------------------------------------------------------ cast
def _cast_source(src: str, dst: str, rng, shape):
    if src in FLOATS and dst in INTS:  # float -> int is defined inside the target range only
        info = np.iinfo(NP[dst])
        lo, hi = max(info.min, -1e4), min(info.max, 1e4)
        x = rng.uniform(lo, hi, shape)
        return x.astype(NP[src]).clip(lo, hi)  # clip again: rounding may step outside
    if src in FLOATS and dst == "bool":
        x = sample(src, shape, rng)
        if x.size >= 4:
            x.reshape(-1)[:4] = [0.5, -0.25, 0.0, -0.0]
        return x
    if src in INTS and dst in LOW:
        return sample(src, shape, rng, "none", -2000, 2000)
    return sample(src, shape, rng, "all", -3000, 3000)


def _cast_ref(x: np.ndarray, dst: str) -> np.ndarray:
    """Independent: Python's int() truncates toward zero; nonzero is True; ints wrap mod 2**n."""
    if dst == "bool":
        return np.array([bool(v) for v in x.astype(np.float64).ravel()], bool).reshape(x.shape)
    if dst in INTS and (x.dtype.kind == "f" or x.dtype == NP["bfloat16"]):
        vals = [int(v) for v in x.astype(np.float64).ravel()]
        return np.array(vals, np.int64).reshape(x.shape).astype(NP[dst])
    if dst in INTS:
        bits = np.iinfo(NP[dst]).bits
        vals = [int(v) % (1 << bits) for v in x.astype(np.int64).ravel()]
        return np.array(vals, np.uint64).reshape(x.shape).astype(NP[dst])
    return x.astype(NP[dst])  # float targets: one direct rounding


@pytest.mark.parametrize("src", ALL)
def test_cast(src):
    for dst in ALL:
        for shape in [(33,), (1,), (0,), (2, 7)]:
            x = _cast_source(src, dst, rng_for("cast", src, dst, shape), shape)
            (a,), feeds = leaves(src, x)
            y = tg.cast(a, dst)
            assert y.dtype.name == dst and y.shape == shape
            if src == dst:
                assert y is a
                continue
            assert y.op.name == "cast"
            what = f"cast {src}->{dst} {shape}"
            check_exact(tg.evaluate(y, feeds), _cast_ref(x, dst), what)
            if src in FLOATS and dst in FLOATS:
                continue  # torch rounds float64 -> bfloat16 through float32 (twice)
            ref = torch_of(x).to(TORCH[dst] if dst not in FLOATS else torch.float64).numpy()
            got = tg.evaluate(y, feeds, dtype="float64")
            check_exact(got, ref.astype(got.dtype), what + " vs torch")


def test_cast_float_to_int_truncates_and_to_bool_is_nonzero():
    x = tg.input("x", (6,))
    X = np.array([2.7, -2.7, 0.5, -0.5, 0.0, np.nan], np.float32)
    got = tg.evaluate([x[:5].astype("int32"), x.astype("bool")], {"x": X})
    assert got[0].tolist() == [2, -2, 0, 0, 0]
    assert got[1].tolist() == [True, True, True, True, False, True]


# ------------------------------------------------------------------------------ reductions
RED_CASES = [((7,), None, False), ((33,), 0, True), ((1,), -1, False), ((3, 7, 33), (0, 2), False),
             ((3, 7, 33), 1, True), ((3, 7, 33), None, True), ((0, 3), 1, False),
             ((2, 0, 3), (0, 2), True), ((2, 7), -2, False)]


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    return tuple(a % ndim for a in ((axis,) if isinstance(axis, int) else axis))


@pytest.mark.parametrize("dtype", ALL)
def test_sum(dtype):
    for shape, axis, keep in RED_CASES:
        x = sample(dtype, shape, rng_for("sum", dtype, shape, axis), "nocancel")
        (a,), feeds = leaves(dtype, x)
        y = tg.sum(a, axis=axis, keepdims=keep)
        out_dtype = "int64" if dtype == "bool" else dtype  # bool sums count
        assert y.op.name == "sum" and y.dtype.name == out_dtype
        axes = _axes(axis, len(shape))

        def ref(v, axes=axes, keep=keep, out=NP[out_dtype]):
            if v.dtype.kind in "iub":  # exact in int64 for these ranges, then wrapped
                return v.astype(np.int64).sum(axis=axes, keepdims=keep).astype(out)
            return np.add.reduce(v, axis=axes, keepdims=keep, dtype=v.dtype)

        what = f"sum {dtype} {shape} axis={axis} keepdims={keep}"
        got = tg.evaluate(y, feeds)
        assert got.shape == np.sum(x, axis=axes, keepdims=keep).shape
        check_dtype_semantics(got, ref, (x,), dtype, what)
        check_torch(y, feeds, lambda t, axes=axes, keep=keep: torch.sum(
            t, dim=axes, keepdim=keep, dtype=t.dtype if dtype != "bool" else torch.int64),
            (x,), what)


@pytest.mark.parametrize("dtype", ALL)
def test_max(dtype):
    for shape, axis, keep in RED_CASES:
        axes = _axes(axis, len(shape))
        if any(shape[i] == 0 for i in axes):
            with pytest.raises(tg.ShapeError, match="empty"):
                tg.max(tg.input("x", shape, dtype), axis=axis)
            continue
        x = sample(dtype, shape, rng_for("max", dtype, shape, axis))
        (a,), feeds = leaves(dtype, x)
        y = tg.max(a, axis=axis, keepdims=keep)
        assert y.op.name == "max" and y.dtype.name == dtype

        def ref(v, axes=axes, keep=keep):  # sort-free: a max that lets nan win
            m = np.moveaxis(v, axes, tuple(range(-len(axes), 0)))
            kept = m.shape[:m.ndim - len(axes)]
            m = m.reshape(kept + (math.prod(m.shape[len(kept):]),))
            out = m[..., 0]
            for k in range(1, m.shape[-1]):
                out = np.where(m[..., k] > out, m[..., k], out)
            if m.dtype.kind == "f":
                out = np.where(np.isnan(m).any(-1), np.nan, out).astype(v.dtype)
            if keep:
                shape = list(v.shape)
                for i in axes:
                    shape[i] = 1
                out = out.reshape(shape)
            return out

        what = f"max {dtype} {shape} axis={axis} keepdims={keep}"
        # which of two tied zeros (0.0, -0.0) max returns is not specified
        check_dtype_semantics(tg.evaluate(y, feeds), ref, (x,), dtype, what, zero_sign=False)
        check_torch(y, feeds, lambda t, axes=axes, keep=keep: torch.amax(t, dim=axes,
                                                                          keepdim=keep),
                    (x,), what)


# ------------------------------------------------------------------------------ movement
def _movement(dtype, build, ref_fn, torch_fn, x, what):
    (a,), feeds = leaves(dtype, x)
    y = build(a)
    got = tg.evaluate(y, feeds)
    ref = np.asarray(ref_fn(x))
    check_exact(got, ref, what)
    assert y.shape == ref.shape and y.dtype.name == dtype
    if torch_fn is not None:
        check_torch(y, feeds, torch_fn, (x,), what)
    return y


@pytest.mark.parametrize("dtype", ALL)
def test_reshape(dtype):
    for shape, target in [((33,), (3, 11)), ((2, 7), (-1,)), ((3, 0), (0, 5)), ((1,), ()),
                          ((), (1, 1)), ((2, 3, 7), (7, -1, 3)), ((4, 6), (2, 2, 3, 2))]:
        x = sample(dtype, shape, rng_for("reshape", dtype, shape))
        y = _movement(dtype, lambda a, t=target: a.reshape(t),
                      lambda v, t=target: v.ravel().reshape(t),
                      lambda t_, t=target: t_.reshape(t), x, f"reshape {dtype} {shape}->{target}")
        assert y.op.name == "reshape"


@pytest.mark.parametrize("dtype", ALL)
def test_permute(dtype):
    for shape, perm in [((7, 33), (1, 0)), ((2, 3, 7), (2, 0, 1)), ((1, 0, 3), (1, 2, 0)),
                        ((2, 3, 4, 5), (3, 1, 0, 2))]:
        x = sample(dtype, shape, rng_for("permute", dtype, shape))

        def ref(v, perm=perm):  # by index arithmetic, not np.transpose
            out = np.empty(tuple(v.shape[p] for p in perm), v.dtype)
            for idx in np.ndindex(*out.shape):
                src = [0] * v.ndim
                for i, p in enumerate(perm):
                    src[p] = idx[i]
                out[idx] = v[tuple(src)]
            return out

        y = _movement(dtype, lambda a, p=perm: a.permute(p), ref,
                      lambda t, p=perm: t.permute(p), x, f"permute {dtype} {shape} {perm}")
        assert y.op.name == "permute"


@pytest.mark.parametrize("dtype", ALL)
def test_expand(dtype):
    for shape, target in [((1,), (33,)), ((7, 1), (7, 33)), ((1, 1), (0, 7)),
                          ((3, 1, 1), (3, 7, 2)), ((), (7,))]:
        x = sample(dtype, shape, rng_for("expand", dtype, shape))

        def ref(v, target=target):
            v = v.reshape((1,) * (len(target) - v.ndim) + v.shape)
            for axis, n in enumerate(target):
                if v.shape[axis] != n:
                    v = np.concatenate([v] * n, axis=axis) if n else np.take(v, [], axis)
            return v

        _movement(dtype, lambda a, t=target: a.expand(t), ref, lambda t_, t=target:
                  t_.expand(t), x, f"expand {dtype} {shape}->{target}")


SLICES = [((33,), (slice(2, 30, 3),)), ((33,), (slice(None, None, -1),)),
          ((33,), (slice(-3, 4, -5),)), ((7,), (slice(100, None),)), ((7,), (slice(-100, 3),)),
          ((7, 33), (slice(1, -1), slice(None, None, -7))), ((1,), (slice(0, 1),)),
          ((7,), (slice(5, 2),)), ((0, 7), (slice(None), slice(1, 3))),
          ((7,), (slice(-8, 3, -2),)), ((7,), (slice(-100, None, -1),)),  # start before 0
          ((3, 7, 33), (slice(None), slice(6, None, -2), slice(32, 0, -31)))]


@pytest.mark.parametrize("dtype", ALL)
def test_slice(dtype):
    for shape, index in SLICES:
        x = sample(dtype, shape, rng_for("slice", dtype, shape))

        def ref(v, index=index):  # element by element from range()
            ranges = [range(*s.indices(n)) for s, n in zip(index, v.shape)]
            ranges += [range(n) for n in v.shape[len(index):]]
            out = np.empty(tuple(len(r) for r in ranges), v.dtype)
            for idx in np.ndindex(*out.shape):
                out[idx] = v[tuple(r[i] for r, i in zip(ranges, idx))]
            return out

        def torch_fn(t, index=index):
            for axis, s in enumerate(index):  # torch has no negative steps: flip first
                start, stop, step = s.indices(t.shape[axis])
                idx = torch.tensor(list(range(start, stop, step)), dtype=torch.long)
                t = t.index_select(axis, idx)
            return t

        y = _movement(dtype, lambda a, i=index: a[i], ref, torch_fn, x,
                      f"slice {dtype} {shape} {index}")
        assert y.op.name in ("slice", "input")


@pytest.mark.parametrize("dtype", ALL)
def test_pad(dtype):
    values = {"bool": [True], "uint8": [7], "int8": [-3]}.get(dtype, [0, -5]) if dtype not in \
        FLOATS else [0.0, np.nan, -np.inf, 2.5]
    for shape, pads in [((7,), (1, 2)), ((2, 7), (0, 0, 3, 1)), ((0, 3), (1, 1, 2, 0)),
                        ((1,), (33, 0)), ((2, 3, 4), (1, 0, 0, 2))]:
        for value in values:
            x = sample(dtype, shape, rng_for("pad", dtype, shape))

            def ref(v, pads=pads, value=value):
                widths = [(0, 0)] * v.ndim
                for k in range(len(pads) // 2):
                    widths[v.ndim - 1 - k] = (pads[2 * k], pads[2 * k + 1])
                out = np.full(tuple(n + lo + hi for n, (lo, hi) in zip(v.shape, widths)),
                              value, v.dtype)
                out[tuple(slice(lo, lo + n) for n, (lo, _) in zip(v.shape, widths))] = v
                return out

            torch_fn = None if dtype == "bool" else (
                lambda t, p=pads, v=value: torch.nn.functional.pad(t, p, value=v))
            y = _movement(dtype, lambda a, p=pads, v=value: tg.pad(a, p, value=v), ref, torch_fn,
                          x, f"pad {dtype} {shape} {pads} {value}")
            assert y.op.name == "pad"


def test_pad_negative_crops():
    x = tg.input("x", (5, 6), "float64")
    X = np.arange(30.0).reshape(5, 6)
    got = tg.evaluate(tg.pad(x, (-1, 2, 0, -2)), {"x": X})
    ref = torch.nn.functional.pad(torch.from_numpy(X), (-1, 2, 0, -2)).numpy()
    check_exact(got, ref)


@pytest.mark.parametrize("dtype", ALL)
def test_concat(dtype):
    for shapes, axis in [([(7,), (33,)], 0), ([(2, 7), (2, 1), (2, 33)], 1), ([(1, 3), (0, 3)], 0),
                         ([(2, 3, 4), (2, 3, 4), (2, 3, 4)], -1), ([(0,), (0,)], 0)]:
        rng = rng_for("concat", dtype, shapes)
        xs = [sample(dtype, s, rng) for s in shapes]
        nodes, feeds = leaves(dtype, *xs)
        y = tg.concat(nodes, axis=axis)
        ref = np.empty(y.shape, NP[dtype])  # independent: place each block
        at = 0
        ax = axis % len(shapes[0])
        for v in xs:
            idx = [slice(None)] * v.ndim
            idx[ax] = slice(at, at + v.shape[ax])
            ref[tuple(idx)] = v
            at += v.shape[ax]
        what = f"concat {dtype} {shapes} {axis}"
        check_exact(tg.evaluate(y, feeds), ref, what)
        check_torch(y, feeds, lambda *ts, axis=axis: torch.cat(ts, dim=axis), xs, what)


@pytest.mark.parametrize("dtype", ALL)
def test_gather(dtype):
    for shape, idx_shape, axis in [((33,), (7,), 0), ((7, 33), (2, 3), 1), ((7, 3), (), 0),
                                   ((1, 7), (0,), 1), ((2, 7, 3), (33,), -2), ((0, 3), (4,), 1)]:
        rng = rng_for("gather", dtype, shape, idx_shape)
        x = sample(dtype, shape, rng)
        n = shape[axis]
        idx = rng.integers(0, n, idx_shape) if n else np.zeros(idx_shape, np.int64)
        for idx_dtype in ("int64", "int32", "uint8"):
            i = idx.astype(NP[idx_dtype])
            (a, b), feeds = leaves(dtype, x, i)
            y = tg.gather(a, b, axis=axis)
            ax = axis % len(shape)
            ref = np.empty(shape[:ax] + idx_shape + shape[ax + 1:], x.dtype)
            for out_idx in np.ndindex(*ref.shape):
                j = i[out_idx[ax:ax + len(idx_shape)]]
                ref[out_idx] = x[out_idx[:ax] + (j,) + out_idx[ax + len(idx_shape):]]
            what = f"gather {dtype} {shape} idx {idx_shape} {idx_dtype} axis={axis}"
            check_exact(tg.evaluate(y, feeds), ref, what)
            if idx_dtype == "int64" and n:
                check_torch(y, feeds, lambda t, j, ax=ax, s=idx_shape: torch.index_select(
                    t, ax, j.reshape(-1)).reshape(t.shape[:ax] + s + t.shape[ax + 1:]), (x, i),
                    what)


def test_gather_out_of_range_raises():
    x, i = tg.input("x", (3, 4)), tg.input("i", (2,), "int64")
    for bad in ([0, 3], [-1, 0]):
        with pytest.raises(tg.EvaluationError, match="out of range"):
            tg.evaluate(tg.gather(x, i), {"x": np.zeros((3, 4), np.float32), "i": np.array(bad)})


MATMUL_SHAPES = [((7,), (7,)), ((1, 7), (7, 33)), ((33,), (33, 7)), ((7, 33), (33,)),
                 ((2, 3, 7), (7, 5)), ((3, 1, 4, 7), (2, 7, 5)), ((0, 7), (7, 3)),
                 ((3, 0), (0, 4)), ((1, 1), (1, 1))]


@pytest.mark.parametrize("dtype", NUM)
def test_matmul(dtype):
    for sa, sb in MATMUL_SHAPES:
        rng = rng_for("matmul", dtype, sa, sb)
        specials = "none" if dtype in INTS else "nocancel"
        a, b = (sample(dtype, s, rng, specials, -5, 5) for s in (sa, sb))
        if dtype in FLOATS:  # inf/nan only; big magnitudes would cancel order-dependently
            a, b = (np.where(np.abs(v.astype(np.float64)) > 100, np.inf, v).astype(v.dtype)
                    for v in (a, b))
        (na, nb), feeds = leaves(dtype, a, b)
        y = na @ nb
        assert y.op.name == "matmul" and y.dtype.name == dtype

        def ref(u, v):  # as explicit products and sums
            u2 = u if u.ndim > 1 else u[None]
            v2 = v if v.ndim > 1 else v[:, None]
            out = (u2[..., :, :, None] * v2[..., None, :, :]).sum(-2)
            if u.ndim == 1:
                out = out[..., 0, :]
            if v.ndim == 1:
                out = out[..., 0]
            return out

        what = f"matmul {dtype} {sa} @ {sb}"
        got = tg.evaluate(y, feeds)
        assert got.shape == np.matmul(a, b).shape
        check_dtype_semantics(got, _wrap(ref), (a, b), dtype, what)
        if dtype not in INTS or min(a.ndim, b.ndim) > 1:
            check_torch(y, feeds, torch.matmul, (a, b), what)


@pytest.mark.parametrize("dtype", NUM)
def test_iota(dtype):
    for n in (0, 1, 7, 33):
        y = tg.iota(n, dtype)
        assert y.op.name == "iota" and y.shape == (n,) and y.dtype.name == dtype
        check_exact(tg.evaluate(y, {}), np.array(list(range(n)), NP[dtype]), f"iota {n}")
        check_exact(tg.evaluate(y, {}, dtype="float64"),
                    np.arange(n, dtype=np.float64 if dtype in FLOATS else NP[dtype]))
    seq = tg.input("x", ("seq",))
    y = tg.iota("seq", dtype) + seq.astype(dtype) * 0
    check_exact(tg.evaluate(y, {"x": np.zeros(5, np.float32)}), np.arange(5).astype(NP[dtype]))


def test_arange():
    seq = tg.input("x", ("seq",))
    for args in [(5,), (1, 10, 3), (5, 0, -1), (2, 2), (3, 1), (0.0, 1.0, 0.25), (0.5, 3),
                 (-3, 4, 2), ("seq",), (2, "seq"), (1, "seq", 2), ("seq", "2*seq")]:
        y = tg.arange(*args)
        symbolic = any(isinstance(a, str) for a in args)
        feeds = {"x": np.zeros(6, np.float32)} if symbolic else {}
        got = tg.evaluate(y + seq.sum().astype(y.dtype) * 0 if symbolic else y, feeds)
        ref = np.arange(*[{"seq": 6, "2*seq": 12}.get(a, a) if isinstance(a, str) else a
                          for a in args])
        assert got.tolist() == ref.tolist(), args
        assert y.dtype.name == ("float32" if ref.dtype.kind == "f" else "int64")
    assert tg.arange(4, dtype="float16").dtype == tg.float16
    with pytest.raises(tg.ShapeError):
        tg.arange(0, 5, 0)


@pytest.mark.parametrize("dtype", ALL)
def test_copy_to(dtype):
    for shape in [(), (7,), (0, 3), (7, 33)]:
        x = sample(dtype, shape, rng_for("copy", dtype, shape))
        (a,), feeds = leaves(dtype, x)
        y = tg.copy_to(a, "cuda:0")
        assert y.op.name == "copy_to" and y.attrs["device"] == "cuda:0"
        got = tg.evaluate(y, feeds)
        check_exact(got, x, f"copy_to {dtype} {shape}")
        assert not np.shares_memory(got, x)


@pytest.mark.parametrize("dtype", ALL)
def test_state_update(dtype):
    for shape, vshape, offset, axis in [((2, 7, 4), (2, 1, 4), 7, 1), ((2, 7, 4), (2, 3, 4), 2, 1),
                                        ((7,), (33,), 0, 0), ((0, 3), (1, 3), 0, 0),
                                        ((3, 7), (3, 0), 7, 1), ((5, 2), (2, 2), 4, 0)]:
        rng = rng_for("state", dtype, shape, vshape)
        s, v = sample(dtype, shape, rng), sample(dtype, vshape, rng)
        state = tg.state("s", shape, dtype)
        y = tg.state_update(state, tg.input("v", vshape, dtype), offset=offset, axis=axis)
        end = offset + vshape[axis]
        out_shape = list(shape)
        out_shape[axis] = max(shape[axis], end)
        assert y.op.name == "state_update" and y.shape == tuple(out_shape)
        ref = np.zeros(out_shape, NP[dtype])
        for idx in np.ndindex(*shape):
            ref[idx] = s[idx]
        for idx in np.ndindex(*vshape):
            j = list(idx)
            j[axis] += offset
            ref[tuple(j)] = v[idx]
        check_exact(tg.evaluate(y, {"s": s, "v": v}), ref, f"state_update {dtype} {shape}")


def test_state_update_symbolic_offset():
    s = tg.state("kv", (2, "past", 4))
    y = tg.state_update(s, tg.input("v", (2, 1, 4)), offset="past", axis=1)
    past = sympy.Symbol("past", integer=True, positive=True)
    assert y.shape == (2, past + 1, 4)
    S, V = np.ones((2, 5, 4), np.float32), np.full((2, 1, 4), 7, np.float32)
    got = tg.evaluate(y, {"kv": S, "v": V})
    check_exact(got, np.concatenate([S, V], axis=1))


def test_table_covers_every_atomic_op():
    tested = set(UNARY) | set(BINARY) | {"where", "cast", "sum", "max", "reshape", "permute",
                                          "expand", "slice", "pad", "concat", "gather", "matmul",
                                          "iota", "copy_to", "state_update"}
    assert set(ATOMIC_OPS) <= tested, set(ATOMIC_OPS) - tested
    for name in ATOMIC_OPS:
        assert OPS[name].is_atomic and OPS[name].reference is not None


# ------------------------------------------------------------------------------ float64 lifting
def test_float64_lifting():
    h, b = tg.input("h", (7,), "float16"), tg.input("b", (7,), "bfloat16")
    f, n = tg.input("f", (7,), "float32"), tg.input("n", (7,), "int32")
    H = sample("float16", (7,), rng_for("lift"), "none")
    B = sample("bfloat16", (7,), rng_for("lift2"), "none")
    F = sample("float32", (7,), rng_for("lift3"), "none")
    N = np.arange(7, dtype=np.int32) - 3
    feeds = {"h": H, "b": B, "f": F, "n": N}
    outs = [h * 3.1, h + b, f / 3.0, n + 1, n.astype("float16") * 0.1, tg.iota(7, "float32"),
            tg.less(h, 0.5), h.sum(), (n * 2).astype("int64"), tg.exp(f)]
    got = tg.evaluate(outs, feeds, dtype="float64")
    assert [g.dtype for g in got] == [np.float64] * 3 + [np.int32, np.float64, np.float64,
                                                          np.bool_, np.float64, np.int64,
                                                          np.float64]
    H64, B64, F64 = (v.astype(np.float64) for v in (H, B, F))
    c31 = 3.1  # Python float constants are exact under lifting
    np.testing.assert_array_equal(got[0], H64 * c31)
    np.testing.assert_array_equal(got[1], H64 + B64)
    check_close(got[2], F64 / 3.0, 1e-15)
    np.testing.assert_array_equal(got[3], N + 1)
    check_close(got[4], N.astype(np.float64) * 0.1, 1e-15)
    np.testing.assert_array_equal(got[6], H64 < 0.5)
    check_close(got[7], H64.sum(), 1e-15)
    check_close(got[9], np.exp(F64), 1e-15)
    # a float64 feed of a float32 leaf keeps its float64 values when lifted (the oracle for
    # float32 graphs fed float64 data), and is rounded to float32 when not
    x = tg.input("x", (3,))
    X = np.array([0.1, 1 / 3, 1e-40])
    assert tg.evaluate(x * 1.0, {"x": X}, dtype="float64").tolist() == X.tolist()
    assert tg.evaluate(x * 1.0, {"x": X}).tolist() == X.astype(np.float32).tolist()
    plain = tg.evaluate(outs, feeds)  # without lifting each dtype is kept
    assert [g.dtype.name for g in plain[:5]] == ["float16", "float32", "float32", "int32",
                                                  "float16"]
    assert plain[1].dtype == np.float32  # float16 + bfloat16 promotes to float32
