"""triu/tril and tile against the op table (tests/ops/optable.py), split/chunk/stack against
numpy slicing: exact results in every dtype tested, fully atomic decompositions, symbolic sizes
and one bad input per function; the same against torch in separate tests that skip alone
without torch."""

import numpy as np
import pytest

import tensor_graphs as tg
from tests.ops import optable as ot


@pytest.mark.parametrize("row,dtype", ot.params("shape"))
def test_matches_oracle(row, dtype):
    ot.check_oracle(row, dtype)


@pytest.mark.parametrize("row,dtype", ot.params("shape", torch=True))
def test_matches_torch(row, dtype):
    torch = pytest.importorskip("torch")
    ot.check_torch(row, dtype, torch)


def check_exact(y, feeds, ref):
    """Movement and masking are exact: float64 and float32 evaluation equal the reference."""
    ref = np.asarray(ref)
    got = tg.evaluate(y, feeds, dtype="float64")
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)
    got32 = tg.evaluate(y, feeds)
    np.testing.assert_array_equal(got32, ref.astype(got32.dtype))
    ot.assert_atomic(y)


# ---------------------------------------------------------------------------- triu / tril
def test_triu_tril_symbolic_sizes_and_infinities():
    x = tg.input("x", ("batch", "n", "m"))
    up, low = tg.triu(x, diagonal=1), tg.tril(x, diagonal=-1)
    rng = np.random.default_rng(1)
    for shape in ((2, 3, 5), (1, 6, 6)):
        X = rng.standard_normal(shape)
        X[..., 0, -1], X[..., -1, 0] = np.inf, -np.inf  # masked-out inf gives 0, as in torch
        check_exact(up, {"x": X}, ot.BY_NAME["triu"].oracle(X, 1))
        check_exact(low, {"x": X}, ot.BY_NAME["tril"].oracle(X, -1))


def test_triu_tril_bad_input():
    with pytest.raises(tg.ShapeError, match="at least 2 dims"):
        tg.triu(tg.input("x", (5,)))
    with pytest.raises(tg.ShapeError, match="diagonal"):
        tg.tril(tg.input("x", (5, 5)), diagonal=1.5)


# ---------------------------------------------------------------------------- tile
def test_tile_symbolic_and_bad_input():
    y = tg.tile(tg.input("x", ("n", 2)), reps=(3, 2))
    assert str(y.shape[0]) == "3*n" and y.shape[1] == 4
    X = np.random.default_rng(4).standard_normal((5, 2))
    check_exact(y, {"x": X}, ot.BY_NAME["tile"].oracle(X, (3, 2)))
    with pytest.raises(tg.ShapeError, match="reps"):
        tg.tile(tg.input("x", (2, 3)), reps=(-1, 2))
    with pytest.raises(tg.ShapeError, match="reps"):
        tg.tile(tg.input("x", (2, 3)), reps=(1.5,))


# ---------------------------------------------------------------------------- split / chunk
def split_ref(x, arg, axis):
    """torch.split: pieces of ``arg`` elements (the last may be short; an empty axis gives one
    empty piece), or of each size in it."""
    n = x.shape[axis]
    sizes = ([min(arg, n - at) for at in range(0, n, arg)] or [0]) if isinstance(arg, int) \
        else list(arg)
    bounds = np.cumsum([0] + sizes)
    return [np.take(x, range(a, b), axis) for a, b in zip(bounds[:-1], bounds[1:])]


def chunk_ref(x, chunks, axis):
    """torch.chunk: pieces of ceil(n / chunks) elements, as many as that takes (maybe fewer);
    an empty axis gives ``chunks`` empty pieces."""
    n = x.shape[axis]
    return split_ref(x, -(-n // chunks), axis) if n else [x] * chunks


SPLIT_CASES = [((7, 3), 2, 0), ((7, 3), 7, 0), ((7, 3), 10, 0), ((4, 9), 3, 1), ((4, 9), 4, -1),
               ((7, 3), [2, 0, 5], 0), ((4, 9), (1, 8), -1), ((0, 3), 2, 0)]
CHUNK_CASES = [((7, 3), 3, 0), ((6, 3), 4, 0), ((5, 8), 2, 1), ((5, 8), 1, 1), ((2, 3), 5, 0),
               ((0, 3), 3, 0), ((4, 10), 3, -1)]


@pytest.mark.parametrize("shape, arg, axis", SPLIT_CASES)
def test_split(shape, arg, axis):
    X = np.random.default_rng(5).standard_normal(shape)
    pieces = tg.split(tg.input("x", shape), arg, axis)
    refs = split_ref(X, arg, axis)
    assert isinstance(pieces, tuple) and len(pieces) == len(refs)
    for p, r in zip(pieces, refs):
        check_exact(p, {"x": X}, r)


@pytest.mark.parametrize("shape, chunks, axis", CHUNK_CASES)
def test_chunk(shape, chunks, axis):
    X = np.random.default_rng(6).standard_normal(shape)
    pieces = tg.chunk(tg.input("x", shape), chunks, axis)
    refs = chunk_ref(X, chunks, axis)
    assert len(pieces) == len(refs)
    for p, r in zip(pieces, refs):
        check_exact(p, {"x": X}, r)


def test_split_and_chunk_references_match_torch():
    torch = pytest.importorskip("torch")
    for shape, arg, axis in SPLIT_CASES:
        X = np.random.default_rng(5).standard_normal(shape)
        refs = torch.split(torch.from_numpy(X), arg if isinstance(arg, int) else list(arg), axis)
        mine = split_ref(X, arg, axis)
        assert len(mine) == len(refs)
        for m, r in zip(mine, refs):
            np.testing.assert_array_equal(m, r.numpy())
    for shape, chunks, axis in CHUNK_CASES:
        X = np.random.default_rng(6).standard_normal(shape)
        refs = torch.chunk(torch.from_numpy(X), chunks, dim=axis)
        mine = chunk_ref(X, chunks, axis)
        assert len(mine) == len(refs)
        for m, r in zip(mine, refs):
            np.testing.assert_array_equal(m, r.numpy())


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
STACK_CASES = [((3, 4), 2, 0), ((3, 4), 3, 1), ((3, 4), 2, 2), ((3, 4), 4, -1), ((5,), 1, 0),
               ((), 3, 0)]


def stack_ref(xs, axis):
    """Each input placed at its index of the new axis."""
    axis = axis % (xs[0].ndim + 1)
    out = np.empty(xs[0].shape[:axis] + (len(xs),) + xs[0].shape[axis:], xs[0].dtype)
    for i, x in enumerate(xs):
        out[(slice(None),) * axis + (i,)] = x
    return out


@pytest.mark.parametrize("shape, count, axis", STACK_CASES)
def test_stack(shape, count, axis):
    rng = np.random.default_rng(9)
    Xs = [rng.standard_normal(shape) for _ in range(count)]
    y = tg.stack([tg.input(f"x{i}", shape) for i in range(count)], axis=axis)
    check_exact(y, {f"x{i}": X for i, X in enumerate(Xs)}, stack_ref(Xs, axis))


def test_stack_reference_matches_torch():
    torch = pytest.importorskip("torch")
    for shape, count, axis in STACK_CASES:
        rng = np.random.default_rng(9)
        Xs = [rng.standard_normal(shape) for _ in range(count)]
        ref = torch.stack([torch.from_numpy(X) for X in Xs], dim=axis).numpy()
        np.testing.assert_array_equal(stack_ref(Xs, axis), ref)


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
