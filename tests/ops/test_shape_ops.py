"""triu/tril, tile, split/chunk/stack against torch: exact results in float64 and float32,
fully atomic decompositions, symbolic sizes and one bad input per function."""

import numpy as np
import pytest

import tensor_graphs as tg

torch = pytest.importorskip("torch")


def t(a):
    return torch.from_numpy(np.asarray(a))


def check_exact(y, feeds, ref):
    """Movement and masking are exact: float64 and float32 evaluation equal torch's values."""
    ref = np.asarray(ref)
    got = tg.evaluate(y, feeds, dtype="float64")
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)
    got32 = tg.evaluate(y, feeds)
    np.testing.assert_array_equal(got32, ref.astype(got32.dtype))
    assert all(n.op.is_atomic for n in tg.nodes(tg.decompose(y)))


# ---------------------------------------------------------------------------- triu / tril
@pytest.mark.parametrize("shape", [(1, 1), (4, 4), (3, 7), (7, 3), (2, 3, 5, 4)])
@pytest.mark.parametrize("diagonal", [-3, -1, 0, 1, 2, 9])
@pytest.mark.parametrize("name", ["triu", "tril"])
def test_triu_tril_match_torch(shape, diagonal, name):
    X = np.random.default_rng(0).standard_normal(shape)
    y = getattr(tg, name)(tg.input("x", shape), diagonal=diagonal)
    check_exact(y, {"x": X}, getattr(torch, name)(t(X), diagonal=diagonal).numpy())


def test_triu_tril_symbolic_sizes_and_infinities():
    x = tg.input("x", ("batch", "n", "m"))
    up, low = tg.triu(x, diagonal=1), tg.tril(x, diagonal=-1)
    rng = np.random.default_rng(1)
    for shape in ((2, 3, 5), (1, 6, 6)):
        X = rng.standard_normal(shape)
        X[..., 0, -1], X[..., -1, 0] = np.inf, -np.inf  # masked-out inf gives 0, as in torch
        check_exact(up, {"x": X}, torch.triu(t(X), 1).numpy())
        check_exact(low, {"x": X}, torch.tril(t(X), -1).numpy())


def test_triu_tril_int_and_bool():
    X = np.random.default_rng(2).integers(-5, 5, (4, 5))
    got = tg.evaluate(tg.triu(tg.input("x", (4, 5), "int64")), {"x": X})
    np.testing.assert_array_equal(got, np.triu(X))
    B = X > 0
    got = tg.evaluate(tg.tril(tg.input("b", (4, 5), "bool"), diagonal=1), {"b": B})
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, np.tril(B, 1))


def test_triu_tril_bad_input():
    with pytest.raises(tg.ShapeError, match="at least 2 dims"):
        tg.triu(tg.input("x", (5,)))
    with pytest.raises(tg.ShapeError, match="diagonal"):
        tg.tril(tg.input("x", (5, 5)), diagonal=1.5)


# ---------------------------------------------------------------------------- tile
@pytest.mark.parametrize("shape, reps", [
    ((3,), (2,)), ((3, 4), (2, 3)), ((3, 4), (2,)), ((3, 4), (2, 1, 3)), ((1,), (5, 1)),
    ((2, 1, 3), (1, 4, 2)), ((2, 3), (0, 2)), ((2, 3), (1, 1)), ((4,), 3),
])
def test_tile_matches_torch(shape, reps):
    X = np.random.default_rng(3).standard_normal(shape)
    y = tg.tile(tg.input("x", shape), reps=reps)
    ref = torch.tile(t(X), reps if isinstance(reps, tuple) else (reps,)).numpy()
    check_exact(y, {"x": X}, ref)


def test_tile_symbolic_and_bad_input():
    y = tg.tile(tg.input("x", ("n", 2)), reps=(3, 2))
    assert str(y.shape[0]) == "3*n" and y.shape[1] == 4
    X = np.random.default_rng(4).standard_normal((5, 2))
    check_exact(y, {"x": X}, np.tile(X, (3, 2)))
    with pytest.raises(tg.ShapeError, match="reps"):
        tg.tile(tg.input("x", (2, 3)), reps=(-1, 2))
    with pytest.raises(tg.ShapeError, match="reps"):
        tg.tile(tg.input("x", (2, 3)), reps=(1.5,))


# ---------------------------------------------------------------------------- split / chunk
@pytest.mark.parametrize("shape, arg, axis", [
    ((7, 3), 2, 0), ((7, 3), 7, 0), ((7, 3), 10, 0), ((4, 9), 3, 1), ((4, 9), 4, -1),
    ((7, 3), [2, 0, 5], 0), ((4, 9), (1, 8), -1), ((0, 3), 2, 0),
])
def test_split_matches_torch(shape, arg, axis):
    X = np.random.default_rng(5).standard_normal(shape)
    pieces = tg.split(tg.input("x", shape), arg, axis)
    refs = torch.split(t(X), arg if isinstance(arg, int) else list(arg), dim=axis)
    assert isinstance(pieces, tuple) and len(pieces) == len(refs)
    for p, r in zip(pieces, refs):
        check_exact(p, {"x": X}, r.numpy())


@pytest.mark.parametrize("shape, chunks, axis", [
    ((7, 3), 3, 0), ((6, 3), 4, 0), ((5, 8), 2, 1), ((5, 8), 1, 1), ((2, 3), 5, 0),
    ((0, 3), 3, 0), ((4, 10), 3, -1),
])
def test_chunk_matches_torch(shape, chunks, axis):
    X = np.random.default_rng(6).standard_normal(shape)
    pieces = tg.chunk(tg.input("x", shape), chunks, axis)
    refs = torch.chunk(t(X), chunks, dim=axis)
    assert len(pieces) == len(refs)
    for p, r in zip(pieces, refs):
        check_exact(p, {"x": X}, r.numpy())


def test_split_chunk_symbolic():
    x = tg.input("x", ("batch", "2*seq", 4))
    a, b = tg.chunk(x, 2, axis=1)
    assert str(a.shape[1]) == "seq" and str(b.shape[1]) == "seq"
    X = np.random.default_rng(7).standard_normal((2, 6, 4))
    check_exact(a, {"x": X}, X[:, :3])
    check_exact(b, {"x": X}, X[:, 3:])
    y = tg.input("y", ("seq", 4))
    first, rest = tg.split(y, [1, tg.input("s", ("seq",)).shape[0] - 1])
    Y = np.random.default_rng(8).standard_normal((5, 4))
    check_exact(rest, {"y": Y}, Y[1:])
    check_exact(first, {"y": Y}, Y[:1])
    q, k, v = tg.split(tg.input("qkv", (2, 12)), 4, axis=-1)
    assert q.shape == k.shape == v.shape == (2, 4)


def test_split_chunk_bad_input():
    x = tg.input("x", (6, 4))
    with pytest.raises(tg.ShapeError, match="add up"):
        tg.split(x, [2, 3])
    with pytest.raises(tg.ShapeError, match="positive"):
        tg.split(x, 0)
    with pytest.raises(tg.ShapeError, match="symbolic"):
        tg.split(tg.input("s", ("seq", 4)), 2)
    with pytest.raises(tg.ShapeError, match="chunks"):
        tg.chunk(x, 0)
    with pytest.raises(tg.ShapeError, match="multiple"):
        tg.chunk(tg.input("s", ("seq", 4)), 2)
    with pytest.raises(tg.ShapeError, match="out of range"):
        tg.split(x, 2, axis=2)


# ---------------------------------------------------------------------------- stack
@pytest.mark.parametrize("shape, count, axis", [
    ((3, 4), 2, 0), ((3, 4), 3, 1), ((3, 4), 2, 2), ((3, 4), 4, -1), ((5,), 1, 0), ((), 3, 0),
])
def test_stack_matches_torch(shape, count, axis):
    rng = np.random.default_rng(9)
    Xs = [rng.standard_normal(shape) for _ in range(count)]
    y = tg.stack([tg.input(f"x{i}", shape) for i in range(count)], axis=axis)
    check_exact(y, {f"x{i}": X for i, X in enumerate(Xs)},
                torch.stack([t(X) for X in Xs], dim=axis).numpy())


def test_stack_symbolic_promotes_and_bad_input():
    a, b = tg.input("a", ("n", 2)), tg.input("b", ("n", 2), "float64")
    y = tg.stack([a, b], axis=1)
    assert y.dtype == tg.float64 and y.shape[1:] == (2, 2)
    A, B = np.ones((3, 2), np.float32), np.zeros((3, 2))
    np.testing.assert_array_equal(tg.evaluate(y, {"a": A, "b": B}), np.stack([A, B], 1))
    with pytest.raises(tg.ShapeError, match="one shape"):
        tg.stack([tg.input("a", (3, 2)), tg.input("c", (2, 3))])
    with pytest.raises(tg.ShapeError, match="non-empty"):
        tg.stack([])
    with pytest.raises(tg.ShapeError, match="out of range"):
        tg.stack([a, a], axis=3)
