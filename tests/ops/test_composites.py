"""The elementwise and reduction composites, table-driven: each op's full decomposition (only
atomic ops) evaluated in float64 against torch / torch.nn.functional on fresh random inputs
(norm-wise relative error <= 1e-9, nan and +-inf positions equal), int/bool variants against
numpy exactly, and float32 soundness where a naive formula overflows."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.ops import OPS

torch = pytest.importorskip("torch")
F = torch.nn.functional
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # nan/inf inputs on purpose


def rng_for(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def floats(shape, rng, specials: bool = True, scale: float = 3.0) -> np.ndarray:
    """Normal values; with specials, nan, +-inf, +-0 and +-40 (exp overflows in float16)."""
    x = np.asarray(rng.standard_normal(shape) * scale)
    n = x.size
    if specials and n >= 8:
        extra = [np.nan, np.inf, -np.inf, 0.0, -0.0, 40.0, -40.0]
        x.reshape(-1)[rng.choice(n, min(n // 2, len(extra)), replace=False)] = \
            extra[: min(n // 2, len(extra))]
    return x


def check_close(got, ref, tol: float, what: str = "") -> None:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    assert np.array_equal(np.isnan(got), np.isnan(ref)), f"{what}: nan positions\n{got}\n{ref}"
    inf = np.isinf(ref)
    assert np.array_equal(np.isinf(got), inf), f"{what}: inf positions\n{got}\n{ref}"
    assert np.array_equal(got[inf], ref[inf]), f"{what}: inf signs"
    fin = np.isfinite(ref)
    num, den = np.linalg.norm(got[fin] - ref[fin]), np.linalg.norm(ref[fin])
    err = 0.0 if num == 0 else (num / den if den else math.inf)
    assert err <= tol, f"{what}: norm-wise relative error {err:.3g} > {tol:g}"


def t64(a):
    return torch.from_numpy(np.asarray(a, np.float64))


def nargs(k):
    return lambda *xs: xs[:k]


# name: (builder over nodes, torch reference over float64 tensors, input shapes, specials ok)
U = [(7,), (3, 33), (1,), (0, 4), ()]
B = [((7,), (7,)), ((3, 33), (33,)), ((2, 1, 7), (3, 1)), ((1,), ())]
R = [(7,), (3, 33), (2, 7, 5)]
FLOAT_TABLE = {
    "sub": (tg.sub, torch.sub, B, True),
    "div": (tg.div, torch.div, B, True),
    "minimum": (tg.minimum, torch.minimum, B, True),
    "abs": (tg.abs, torch.abs, U, True),
    # numpy's rule: sign(nan) is nan (torch.sign gives 0)
    "sign": (tg.sign, lambda t: torch.from_numpy(np.asarray(np.sign(t.numpy()))), U, True),
    "square": (tg.square, torch.square, U, True),
    "rsqrt": (tg.rsqrt, torch.rsqrt, U, True),
    "cos": (tg.cos, torch.cos, U, True),
    "clamp": (lambda x: tg.clamp(x, min=-0.5, max=1.25), lambda t: torch.clamp(t, -0.5, 1.25),
              U, True),
    "clamp_min": (lambda x: tg.clamp(x, min=0.3), lambda t: torch.clamp(t, min=0.3), U, True),
    "clamp_max": (lambda x: tg.clamp(x, max=0.3), lambda t: torch.clamp(t, max=0.3), U, True),
    "relu": (tg.relu, F.relu, U, True),
    "sigmoid": (tg.sigmoid, torch.sigmoid, U, True),
    "tanh": (tg.tanh, torch.tanh, U, True),
    "gelu": (tg.gelu, F.gelu, U, True),
    "gelu_tanh": (lambda x: tg.gelu(x, approximate="tanh"),
                  lambda t: F.gelu(t, approximate="tanh"), U, True),
    "silu": (tg.silu, F.silu, U, True),
    "elu": (tg.elu, F.elu, U, True),
    "elu_alpha": (lambda x: tg.elu(x, alpha=0.3), lambda t: F.elu(t, alpha=0.3), U, True),
    "selu": (tg.selu, F.selu, U, True),
    "softplus": (tg.softplus, F.softplus, U, True),
    "softplus_beta": (lambda x: tg.softplus(x, beta=2.0, threshold=5.0),
                      lambda t: F.softplus(t, beta=2.0, threshold=5.0), U, True),
    "mean": (tg.mean, torch.mean, R, True),
    "mean_axis": (lambda x: tg.mean(x, axis=-1, keepdims=True),
                  lambda t: torch.mean(t, -1, keepdim=True), R, True),
    "var": (lambda x: tg.var(x, axis=0), lambda t: torch.var(t, 0, correction=0), R, True),
    "var_unbiased": (lambda x: tg.var(x, axis=-1, keepdims=True, correction=1),
                     lambda t: torch.var(t, -1, keepdim=True, correction=1), R, True),
    "min": (tg.min, torch.amin, R, True),
    "min_axis": (lambda x: x.min(axis=-1, keepdims=True), lambda t: torch.amin(t, -1, True),
                 R, True),
    "prod": (lambda x: tg.prod(x, axis=-1), lambda t: torch.prod(t, -1), R + [(33,)], False),
    "prod_all": (tg.prod, torch.prod, [(7,), (3, 5), (0,), (1,)], False),
    "cumsum": (lambda x: tg.cumsum(x, axis=-1), lambda t: torch.cumsum(t, -1), R, False),
    "cumsum0": (tg.cumsum, lambda t: torch.cumsum(t, 0), R + [(0, 3)], False),
    "logsumexp": (tg.logsumexp, lambda t: torch.logsumexp(t, -1), R, True),
    "logsumexp0": (lambda x: tg.logsumexp(x, axis=0, keepdims=True),
                   lambda t: torch.logsumexp(t, 0, keepdim=True), R, True),
    "softmax": (tg.softmax, lambda t: F.softmax(t, -1), R, True),
    "softmax0": (lambda x: tg.softmax(x, axis=0), lambda t: F.softmax(t, 0), R, True),
    "log_softmax": (tg.log_softmax, lambda t: F.log_softmax(t, -1), R, True),
}
BOOL_TABLE = {  # float inputs, bool outputs
    "greater": (tg.greater, torch.gt, B),
    "less_equal": (tg.less_equal, torch.le, B),
    "greater_equal": (tg.greater_equal, torch.ge, B),
    "not_equal": (tg.not_equal, torch.ne, B),
    "isnan": (tg.isnan, torch.isnan, U),
    "logical_and": (tg.logical_and, torch.logical_and, B),
    "logical_or": (tg.logical_or, torch.logical_or, B),
    "logical_not": (tg.logical_not, torch.logical_not, U),
}
ARG_TABLE = {  # float inputs, int64 outputs, numpy's tie and nan rules
    "argmax": (lambda x: tg.argmax(x, axis=-1), lambda a: np.argmax(a, -1)),
    "argmax_all": (tg.argmax, np.argmax),
    "argmin": (lambda x: tg.argmin(x, axis=0, keepdims=True),
               lambda a: np.argmin(a, 0, keepdims=True)),
    "argmin_all": (tg.argmin, np.argmin),
}


def _shapes(shapes):
    return [s if isinstance(s[0] if s else None, tuple) else (s,) for s in shapes]


def _inputs(name, shapes, specials, with_ties=False):
    rng = rng_for(name, shapes)
    xs = [floats(s, rng, specials) for s in shapes]
    if with_ties:  # repeat values so ties and exact equality happen
        xs = [np.round(x) for x in xs]
    return xs


def _graph(build, xs, dtype="float64"):
    nodes = [tg.input("abc"[i], x.shape, dtype) for i, x in enumerate(xs)]
    return build(*nodes), {"abc"[i]: x.astype(dtype) for i, x in enumerate(xs)}


@pytest.mark.parametrize("name", FLOAT_TABLE)
def test_float64_against_torch(name):
    build, ref_fn, shapes, specials = FLOAT_TABLE[name]
    for shape in _shapes(shapes):
        if name.startswith(("min", "logsumexp", "softmax", "log_softmax")) and 0 in shape:
            continue
        xs = _inputs(name, shape, specials)
        y, feeds = _graph(build, xs)
        assert y.dtype.name == "float64"
        got = tg.evaluate(y, feeds)
        ref = ref_fn(*[t64(x) for x in xs]).numpy()
        check_close(got, ref, 1e-9, f"{name} {shape}")
        # float32 leaves evaluated with dtype="float64" lift to the same float64 computation
        y32, feeds32 = _graph(build, xs, "float32")
        lifted = tg.evaluate(y32, feeds32, dtype="float64")
        ref32 = ref_fn(*[t64(x.astype(np.float32)) for x in xs]).numpy()
        check_close(lifted, ref32, 1e-9, f"{name} {shape} (float32 lifted)")


@pytest.mark.parametrize("name", BOOL_TABLE)
def test_bool_results_against_torch(name):
    build, ref_fn, shapes = BOOL_TABLE[name]
    for shape in _shapes(shapes):
        xs = _inputs(name, shape, True, with_ties=True)
        if name.startswith("logical"):  # fractional values are nonzero, hence True
            xs = [x * 0.25 for x in xs]
        y, feeds = _graph(build, xs)
        assert y.dtype.name == "bool" and not y.op.is_atomic
        got = tg.evaluate(y, feeds)
        ref = ref_fn(*[t64(x) for x in xs]).numpy()
        assert got.dtype == np.bool_ and np.array_equal(got, ref), (name, shape, got, ref)
    if name.startswith("logical"):  # bool inputs
        bs = [rng_for(name).random(7) < 0.5 for _ in range(len(shapes[0]) if isinstance(
            shapes[0][0], tuple) else 1)]
        y, feeds = _graph(build, bs, "bool")
        ref = ref_fn(*[torch.from_numpy(b) for b in bs]).numpy()
        assert np.array_equal(tg.evaluate(y, feeds), ref)


@pytest.mark.parametrize("name", ARG_TABLE)
def test_arg_extremes_like_numpy(name):
    build, ref_fn = ARG_TABLE[name]
    rng = rng_for(name)
    cases = [np.round(rng.standard_normal((3, 33))),  # many ties: the first index wins
             rng.standard_normal((7,)), np.array([1.0, np.nan, 3.0, np.nan]),
             np.array([[np.inf, 1, np.inf], [-np.inf, -np.inf, 0], [2, 2, 2]]),
             np.array([[np.nan, 1.0], [1.0, np.nan]]), np.zeros((2, 1))]
    for x in cases:
        for dtype in ("float64", "float32", "int32", "uint8", "bool"):
            if dtype not in ("float64", "float32"):
                if np.isnan(x).any():
                    continue
                v = np.clip(np.abs(x), 0, 100).astype(dtype) if dtype != "int32" else \
                    np.nan_to_num(x).astype(dtype)
            else:
                v = x.astype(dtype)
            y, feeds = _graph(build, [v], dtype)
            got = tg.evaluate(y, feeds)
            ref = np.asarray(ref_fn(v))
            assert y.dtype.name == "int64" and got.dtype == np.int64
            assert got.shape == ref.shape and np.array_equal(got, ref), (name, dtype, v, got)


# ------------------------------------------------------------------------------ ints and bools
INT_TABLE = {  # exact against numpy on int dtypes (including each dtype's extremes)
    "abs": (tg.abs, np.abs, 1),
    "sign": (tg.sign, np.sign, 1),
    "square": (tg.square, lambda a: a * a, 1),
    "sub": (tg.sub, np.subtract, 2),
    "minimum": (tg.minimum, np.minimum, 2),
    "min": (lambda x: tg.min(x, axis=-1), lambda a: np.min(a, -1), 1),
    "min_all": (tg.min, np.min, 1),
    "prod": (lambda x: tg.prod(x, axis=-1), lambda a: np.prod(a, -1, dtype=a.dtype), 1),
    "cumsum": (lambda x: tg.cumsum(x, axis=-1), lambda a: np.cumsum(a, -1, dtype=a.dtype), 1),
    "relu": (tg.relu, lambda a: np.maximum(a, 0), 1),
    "clamp": (lambda x: tg.clamp(x, min=-3, max=5), lambda a: np.clip(a, -3, 5), 1),
}


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int32", "int64"])
@pytest.mark.parametrize("name", INT_TABLE)
def test_ints_exact(name, dtype):
    build, ref_fn, arity = INT_TABLE[name]
    info = np.iinfo(dtype)
    rng = rng_for(name, dtype)
    small = name in ("prod", "square")
    lo, hi = (max(info.min, -3), min(info.max, 3)) if small else (info.min, info.max)
    xs = [rng.integers(lo, hi, (4, 9), endpoint=True).astype(dtype) for _ in range(arity)]
    if not small:
        xs[0][0, :2] = (info.min, info.max)
    if name == "clamp" and dtype == "uint8":  # -3 as a uint8 scalar wraps (as in torch)
        build, ref_fn = (lambda x: tg.clamp(x, min=3, max=5)), (lambda a: np.clip(a, 3, 5))
    y, feeds = _graph(build, xs, dtype)
    got = tg.evaluate(y, feeds)
    ref = np.asarray(ref_fn(*xs))
    assert got.dtype == ref.dtype and np.array_equal(got, ref), (name, dtype, xs, got, ref)


def test_bool_reductions_and_minimum():
    b = np.array([[True, False, True], [True, True, True]])
    x = tg.input("b", (2, 3), "bool")
    got = tg.evaluate([tg.min(x, axis=1), tg.min(x), tg.minimum(x, x[0]), tg.argmin(x, axis=1),
                       tg.prod(x, axis=1), tg.cumsum(x, axis=1)], {"b": b})
    np.testing.assert_array_equal(got[0], [False, True])
    assert got[1].item() is False or got[1] == np.False_
    np.testing.assert_array_equal(got[2], b & b[0])
    np.testing.assert_array_equal(got[3], np.argmin(b, 1))
    np.testing.assert_array_equal(got[4], np.prod(b, 1))
    np.testing.assert_array_equal(got[5], np.cumsum(b, 1))


# ------------------------------------------------------------------------------ float32 soundness
def ev(build, values, dtype="float32"):
    x = tg.input("x", np.shape(values), dtype)
    return tg.evaluate(build(x), {"x": np.asarray(values, dtype)})


def test_float32_soundness():
    assert ev(tg.tanh, [50.0, -50.0, 1e30, -1e30]).tolist() == [1.0, -1.0, 1.0, -1.0]
    s = ev(tg.sigmoid, [100.0, -100.0, 1e30, -1e30, 0.0])
    assert np.isfinite(s).all()
    assert s[0] == 1.0 and s[2] == 1.0 and s[3] == 0.0 and s[4] == 0.5
    exact = np.float32(1 / (1 + math.exp(100.0)))  # 3.7e-44: a float32 subnormal
    assert abs(float(s[1]) - float(exact)) <= 1.5e-45
    sm = ev(tg.softmax, [[1000.0, 0.0], [-1000.0, 0.0], [3.0e38, 3.0e38]])
    np.testing.assert_array_equal(sm, [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    assert np.isfinite(ev(tg.log_softmax, [[1000.0, 0.0]])).all()
    assert ev(tg.softplus, [100.0]).tolist() == [100.0]
    assert ev(lambda x: tg.softplus(x, threshold=1e9), [100.0, -100.0]).tolist() == [100.0, 0.0]
    lse = ev(tg.logsumexp, [[-np.inf, -np.inf], [1000.0, 1000.0], [np.inf, 1.0], [-np.inf, 2.0]])
    assert lse[0] == -np.inf and lse[2] == np.inf and lse[3] == 2.0
    assert lse[1] == np.float32(1000.0 + math.log(2.0))
    assert np.isfinite(ev(tg.silu, [-100.0, 100.0, -1e30])).all()
    assert ev(tg.elu, [-1e30]).tolist() == [-1.0]
    gelu = ev(lambda x: tg.gelu(x, approximate="tanh"), [50.0, -50.0, 10.0])
    assert gelu.tolist() == [50.0, -0.0, 10.0]
    assert ev(tg.gelu, [50.0, -50.0]).tolist() == [50.0, -0.0]
    assert ev(lambda x: tg.var(x, axis=0), [1e4 + 1, 1e4 + 2, 1e4 + 3])[()] == np.float32(2 / 3)


def test_float16_sigmoid_does_not_overflow():
    # exp(12) overflows float16; the decomposition must not form it
    got = ev(tg.sigmoid, [-12.0, -15.0, 12.0], "float16")
    ref = torch.sigmoid(torch.tensor([-12.0, -15.0, 12.0], dtype=torch.float64)).numpy()
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=2e-3, atol=2 ** -25)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_mean_and_var_accumulate_in_float32(dtype):
    x = tg.input("x", (40000,), dtype)  # a float16 running sum would pass 65504
    X = (np.arange(40000) % 4 + 1).astype(dtype)  # 1, 2, 3, 4, ...: mean 2.5, var 1.25
    got = tg.evaluate([tg.mean(x), tg.var(x), x.mean(0, keepdims=True)], {"x": X})
    assert [g.dtype for g in got] == [X.dtype] * 3
    assert got[0] == 2.5 and got[1] == 1.25 and got[2].tolist() == [2.5]


@pytest.mark.parametrize("dtype,tol", [("float16", 1e-2), ("bfloat16", 5e-2),
                                       ("float32", 1e-5)])
@pytest.mark.parametrize("name", ["sigmoid", "tanh", "gelu", "gelu_tanh", "silu", "elu",
                                  "softplus", "softmax", "log_softmax", "logsumexp", "var",
                                  "cos", "div", "mean"])
def test_low_precision_close_to_float64(name, dtype, tol):
    build, ref_fn, shapes, _ = FLOAT_TABLE[name]
    shape = _shapes(shapes)[1]
    xs = [np.clip(x, -8, 8) for x in _inputs(name, shape, False)]
    if name == "div":
        xs[1] = np.sign(xs[1]) * (np.abs(xs[1]) + 0.5)
    y, feeds = _graph(build, xs, dtype)
    got = tg.evaluate(y, feeds)
    assert got.dtype == getattr(tg, dtype).np_dtype
    exact = [x.astype(dtype).astype(np.float64) for x in xs]
    check_close(got.astype(np.float64), ref_fn(*[t64(x) for x in exact]).numpy(), tol,
                f"{name} {dtype}")


# ------------------------------------------------------------------------------ decompositions
COMPOSITES = ["sub", "div", "abs", "sign", "square", "rsqrt", "cos", "clamp", "relu", "sigmoid",
              "tanh", "gelu", "silu", "elu", "selu", "softplus", "minimum", "greater",
              "less_equal", "greater_equal", "not_equal", "logical_and", "logical_or",
              "logical_not", "isnan", "mean", "var", "min", "argmax", "argmin", "prod", "cumsum",
              "logsumexp", "softmax", "log_softmax"]


def _build(name):
    """One node of op ``name`` on fresh leaves, and feeds for it."""
    rng = rng_for("decompose", name)
    if name.startswith("logical"):
        a, b = tg.input("p", (3, 5), "bool"), tg.input("q", (5,), "bool")
        feeds = {"p": rng.random((3, 5)) < 0.5, "q": rng.random(5) < 0.5}
    else:
        a, b = tg.input("a", (3, 5)), tg.input("b", (5,))
        feeds = {"a": rng.standard_normal((3, 5)).astype(np.float32),
                 "b": rng.standard_normal(5).astype(np.float32)}
    fn = getattr(tg, name)
    two = len(OPS[name].params) == 2
    y = fn(a, b) if two else fn(a)
    if not two:
        feeds.pop("b" if "b" in feeds else "q")
    return y, feeds


@pytest.mark.parametrize("name", COMPOSITES)
def test_decomposition_is_atomic(name):
    op = OPS[name]
    assert not op.is_atomic and op.kind == "composite" and op.decompose is not None
    assert op.reference is None  # defined by its decomposition only
    y, feeds = _build(name)
    assert y.op is op
    full = tg.decompose(y)
    kinds = {n.op.name for n in tg.nodes(full)}
    assert all(OPS[k].is_atomic for k in kinds), kinds
    assert name not in kinds
    assert tg.decompose(full) is full  # already atomic: nothing to do
    one = tg.decompose(y, depth=1)
    assert y not in tg.nodes(one) and one.shape == y.shape and one.dtype == y.dtype
    inner = {n.op.name for n in tg.nodes(one) if not n.op.is_atomic}
    for n in tg.nodes(one):
        if n.op.name == name:  # the op may appear on other inputs, never on its own
            assert n.inputs != y.inputs or n.attrs != y.attrs
    ref = tg.evaluate(y, feeds)
    for g in (full, one):
        got = tg.evaluate(g, feeds)
        assert got.dtype == ref.dtype and np.array_equal(got, ref, equal_nan=got.dtype.kind == "f")
    assert tg.decompose([y, y], depth=1) == [one, one]
    if not inner:  # one level was everything
        assert one is full


def test_depth_one_expands_exactly_one_level():
    x = tg.input("x", (4,))
    y = tg.tanh(x)
    one = tg.decompose(y, depth=1)
    names = {n.op.name for n in tg.nodes(one)}
    assert "tanh" not in names
    assert {"abs", "div", "sub"} <= names  # tanh's own definition uses these composites
    two = tg.decompose(y, depth=2)
    assert not ({"abs", "div", "sub"} & {n.op.name for n in tg.nodes(two)})
    assert tg.decompose(y, depth=0) is y


def test_is_atomic_flags():
    for name in COMPOSITES:
        assert OPS[name].is_atomic is False
    for name in ("add", "mul", "exp", "sum", "max", "reshape", "gather", "matmul", "cast"):
        assert OPS[name].is_atomic is True
    x = tg.input("x", (3,))
    assert x.op.is_atomic and x.op.is_leaf and not tg.sigmoid(x).op.is_atomic
