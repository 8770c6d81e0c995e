"""The C gather and embedding kernels (kernels/c/gather.py): bit-exact against the float64
reference on fresh random inputs, every id dtype and shape, empty ids, out-of-range ids raise
the numpy kernels' kind of error without writing, and the parallel path."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs import threads
from tensor_graphs.errors import EvaluationError, KernelConstraintError
from tensor_graphs.ir import dtypes as tg_dtypes
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import build

pytestmark = pytest.mark.skipif(not build.available(),
                                reason=f"C backend unavailable: {build.unavailable_reason()}")

FLOATS = ("float32", "float64", "float16", "bfloat16")
ID_SHAPES = [(), (1,), (7,), (2, 3), (1, 128), (3, 4, 5)]


@pytest.fixture
def rng():
    return np.random.default_rng(2024)


def np_dtype(name):
    return tg_dtypes.as_dtype(name).np_dtype


def reference(build_fn, names, arrays, **attrs):
    leaves = [tg.input(n, a.shape, tg_dtypes.from_numpy(a.dtype).name)
              for n, a in zip(names, arrays)]
    return tg.evaluate(build_fn(*leaves, **attrs), dict(zip(names, arrays)), dtype="float64")


def table(rng, rows, dim, dtype):
    return rng.standard_normal((rows, dim)).astype(np_dtype(dtype))


@pytest.mark.parametrize("ids_shape", ID_SHAPES)
@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_embedding_matches_reference(ids_shape, id_dtype, dtype, rng):
    t = table(rng, 50, 6, dtype)
    ids = rng.integers(0, 50, ids_shape).astype(id_dtype)
    got = registry.get("c_embedding")(ids, t)
    ref = reference(tg.embedding, ("ids", "table"), (ids, t))
    assert got.shape == ids_shape + (6,) and got.dtype == t.dtype
    np.testing.assert_array_equal(got.astype(np.float64), ref)  # rows copied, bit-exact
    np.testing.assert_array_equal(got.view(np.uint8), np.take(t, ids, 0).view(np.uint8))


def test_embedding_writes_into_out_and_hits_first_and_last_rows(rng):
    t = table(rng, 9, 5, "float32")
    ids = np.array([[0, 8, 8], [3, 0, 1]], np.int64)
    out = np.full((2, 3, 5), np.nan, np.float32)
    got = registry.get("c_embedding")(ids, t, out=out)
    assert got is out
    np.testing.assert_array_equal(out, t[ids])


@pytest.mark.parametrize("ids_shape", [(0,), (2, 0), (0, 3)])
@pytest.mark.parametrize("rows", [0, 4])
def test_empty_ids(ids_shape, rows, rng):
    t = table(rng, rows, 3, "float32")
    for dt in ("int32", "int64"):
        got = registry.get("c_embedding")(np.zeros(ids_shape, dt), t)
        assert got.shape == ids_shape + (3,) and got.dtype == np.float32


def test_empty_rows_of_zero_width(rng):
    t = np.zeros((5, 0), np.float32)
    got = registry.get("c_embedding")(np.array([1, 4], np.int64), t)
    assert got.shape == (2, 0)
    with pytest.raises(EvaluationError, match="id 5 is out of range for a table of 5 rows"):
        registry.get("c_embedding")(np.array([1, 5], np.int64), t)


@pytest.mark.parametrize("bad", [-1, 50, 2**31 - 1, -2**31])
@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
def test_out_of_range_id_raises_and_writes_nothing(bad, id_dtype, rng):
    t = table(rng, 50, 4, "float32")
    ids = rng.integers(0, 50, (3, 7)).astype(id_dtype)
    ids[1, 5] = bad
    out = np.full((3, 7, 4), 7.0, np.float32)
    with pytest.raises(EvaluationError,
                       match=rf"c_embedding: id {bad} is out of range for a table of 50 rows"):
        registry.get("c_embedding")(ids, t, out=out)
    assert (out == 7.0).all()  # checked before anything is written


def test_int64_id_beyond_int32_is_out_of_range(rng):
    t = table(rng, 50, 4, "float32")
    ids = np.array([1, 2**32 + 3], np.int64)  # would wrap to 3 if narrowed
    with pytest.raises(EvaluationError, match=f"id {2**32 + 3} is out of range"):
        registry.get("c_embedding")(ids, t)


def test_same_error_kind_as_numpy_embedding(rng):
    t = table(rng, 10, 4, "float32")
    ids = np.array([3, 12], np.int64)
    with pytest.raises(EvaluationError) as c_err:
        registry.get("c_embedding")(ids, t)
    with pytest.raises(EvaluationError) as np_err:
        registry.get("numpy_embedding")(ids, t)
    assert str(c_err.value).replace("c_", "numpy_", 1) == str(np_err.value)


@pytest.mark.parametrize("nthreads", [1, 2])
def test_parallel_rows(nthreads, rng):
    """Above the parallel threshold (128 KiB) the rows are split between threads."""
    before = threads.get_num_threads()
    threads.set_num_threads(nthreads)
    try:
        t = table(rng, 1000, 768, "float32")
        ids = rng.integers(0, 1000, (4, 129)).astype(np.int64)
        got = registry.get("c_embedding")(ids, t)
        np.testing.assert_array_equal(got, t[ids])
        ids[3, 128] = 1000  # the last id: still caught before anything runs in parallel
        with pytest.raises(EvaluationError, match="id 1000 is out of range"):
            registry.get("c_embedding")(ids, t)
    finally:
        threads.set_num_threads(before)


def test_constraints(rng):
    k = registry.get("c_embedding")
    t = table(rng, 10, 4, "float32")
    with pytest.raises(KernelConstraintError, match="int32 or int64"):
        k(np.array([1, 2], np.int8), t)
    with pytest.raises(KernelConstraintError, match="float tensor"):
        k(np.array([1, 2], np.int64), np.arange(40, dtype=np.int32).reshape(10, 4))
    with pytest.raises(KernelConstraintError, match="contiguous"):
        k(np.array([1, 2], np.int64), np.asfortranarray(t))


# ----------------------------------------------------------------------------- gather
GATHER = [((33, 7), (5,), 0), ((7, 33), (2, 3), 1), ((1025,), (7,), 0), ((2, 3, 4), (9,), 2),
          ((2, 3, 4), (), 1), ((4, 5, 6, 3), (2, 2), 2), ((6, 300), (1, 2, 3), 0)]


@pytest.mark.parametrize("x_shape,idx_shape,axis", GATHER)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int8", "int64",
                                   "bool"])
@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
def test_gather_matches_reference(x_shape, idx_shape, axis, dtype, id_dtype, rng):
    x = (rng.standard_normal(x_shape) * 50).astype(np_dtype(dtype))
    idx = rng.integers(0, x_shape[axis], idx_shape).astype(id_dtype)
    got = registry.get("c_gather")(x, idx, axis=axis)
    want = np.take(x, idx, axis=axis)
    assert got.shape == want.shape and got.dtype == x.dtype
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    if dtype in ("float32", "int64"):
        ref = reference(lambda a, i: tg.gather(a, i, axis=axis), ("x", "indices"), (x, idx))
        np.testing.assert_array_equal(got.astype(np.float64), ref)


def test_gather_out_of_range_and_empty(rng):
    k = registry.get("c_gather")
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    with pytest.raises(EvaluationError, match="c_gather: index -1 is out of range for axis 1 "
                                              "of size 4"):
        k(x, np.array([0, -1], np.int32), axis=1)
    with pytest.raises(EvaluationError, match="index 5 is out of range for axis 2 of size 5"):
        k(x, np.array([[5]], np.int64), axis=2)
    got = k(x, np.zeros((0, 2), np.int64), axis=1)
    assert got.shape == (3, 0, 2, 5)


@pytest.mark.parametrize("name", ["c_embedding", "c_gather", "c_embedding_add"])
def test_verifier_admits(name):
    report = tg.kernels.verify(registry.get(name))
    assert report.ok, report
    assert registry.get(name).backend == "c" and registry.get(name).writes_out


# ----------------------------------------------------------------------------- embedding + x
ADD_CASES = [((7,), (7, 5)), ((2, 3), (2, 3, 5)), ((2, 3), (1, 3, 5)), ((2, 3), (3, 5)),
             ((4, 33), (5,)), ((1, 128), (1, 128, 5)), ((), (5,)), ((3, 1), (1, 5))]


@pytest.mark.parametrize("ids_shape,x_shape", ADD_CASES)
@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_embedding_add_matches_reference(ids_shape, x_shape, id_dtype, dtype, rng):
    k = registry.get("c_embedding_add")
    t = table(rng, 40, 5, dtype)
    ids = rng.integers(0, 40, ids_shape).astype(id_dtype)
    x = rng.standard_normal(x_shape).astype(dtype)
    got = k(ids, t, x)
    want = t[ids] + x  # one rounding of the exact sum, as the reference
    assert got.shape == ids_shape + (5,) and got.dtype == t.dtype
    np.testing.assert_array_equal(got, want)
    ref = reference(lambda i, w, y: tg.embedding(i, w) + y, ("ids", "table", "x"), (ids, t, x))
    np.testing.assert_array_equal(got, ref.astype(dtype))


def test_embedding_add_nan_inf_and_out(rng):
    t = table(rng, 6, 4, "float32")
    t[2, 1] = np.nan
    t[3, 0] = np.inf
    x = rng.standard_normal((3, 4)).astype(np.float32)
    x[1, 0] = -np.inf
    ids = np.array([2, 3, 3], np.int64)
    out = np.full((3, 4), 5.0, np.float32)
    got = registry.get("c_embedding_add")(ids, t, x, out=out)
    assert got is out
    with np.errstate(invalid="ignore"):
        want = t[ids] + x
    np.testing.assert_array_equal(out, want)  # nan, inf + -inf = nan, inf
    assert np.isnan(out[0, 1]) and np.isnan(out[1, 0]) and out[2, 0] == np.inf


def test_embedding_add_bad_id_and_empty(rng):
    k = registry.get("c_embedding_add")
    t = table(rng, 6, 4, "float32")
    x = rng.standard_normal((4,)).astype(np.float32)
    out = np.full((2, 4), 5.0, np.float32)
    with pytest.raises(EvaluationError, match="c_embedding_add: id 6 is out of range for a "
                                              "table of 6 rows"):
        k(np.array([0, 6], np.int32), t, x, out=out)
    assert (out == 5.0).all()
    assert k(np.zeros((0,), np.int64), t, x).shape == (0, 4)


def test_embedding_add_constraints(rng):
    k = registry.get("c_embedding_add")
    t = table(rng, 6, 4, "float32")
    ids = np.array([1, 2], np.int64)
    with pytest.raises(KernelConstraintError, match="trailing part"):
        k(ids, t, np.zeros((3, 4), np.float32))  # 3 rows do not repeat over 2
    with pytest.raises(KernelConstraintError, match="must both be float32"):
        k(ids, t, np.zeros((2, 4), np.float64))
    with pytest.raises(KernelConstraintError, match="must both be float32"):
        k(ids, t.astype(np.float16), np.zeros((2, 4), np.float16))


def test_embedding_add_parallel(rng):
    before = threads.get_num_threads()
    threads.set_num_threads(2)
    try:
        t = table(rng, 1000, 768, "float32")
        ids = rng.integers(0, 1000, (4, 128)).astype(np.int64)
        x = rng.standard_normal((128, 768)).astype(np.float32)
        np.testing.assert_array_equal(registry.get("c_embedding_add")(ids, t, x), t[ids] + x)
    finally:
        threads.set_num_threads(before)
