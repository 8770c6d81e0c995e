"""The atomic ops against the op table (tests/ops/optable.py): every op x every dtype it
accepts x its cases, against an independent numpy oracle, and against torch (float64 for
floats) where torch has the op, in a separate test that skips alone without torch.

Semantics checked, per dtype of the computation (the table's "dtype" rule):
- float64: norm-wise relative error ||got - ref|| / ||ref|| <= 1e-12 (or exact);
- float32: <= 1e-6 against the float64 result rounded to float32;
- float16/bfloat16: "compute in float32, round once per op": exactly the float32 result
  rounded once;
- ints and bool: exact (ints wrap like numpy and torch);
- nan and +-inf positions always match exactly.
Movement and selection ops (the "exact" rule) are bit-exact in every dtype.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy

import tensor_graphs as tg
from tensor_graphs.ir.ops import OPS
from tests.ops import optable as ot

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # nan/inf inputs on purpose


@pytest.mark.parametrize("row,dtype", ot.params("atomic"))
def test_matches_oracle(row, dtype):
    ot.check_oracle(row, dtype)


@pytest.mark.parametrize("row,dtype", ot.params("atomic", torch=True))
def test_matches_torch(row, dtype):
    torch = pytest.importorskip("torch")
    ot.check_torch(row, dtype, torch)


ELEMENTWISE = [r for r in ot.rows("atomic")
               if r.cases is ot.UNARY_SHAPES or r.cases is ot.BINARY_SHAPES]


@pytest.mark.parametrize("row", ELEMENTWISE, ids=[r.name for r in ELEMENTWISE])
def test_elementwise_rejects_dtypes(row):
    """The table's dtype column is the whole of what each op accepts."""
    op = OPS[row.op]
    for dtype in ot.ALL:
        x = tg.input("x", (3,), dtype)
        if dtype in row.dtypes:
            continue
        if len(op.params) == 1 and dtype in ot.INTS + ("bool",) and row.dtypes == ot.FLOATS:
            # the builder promotes ints to float32; the atomic op itself refuses them
            assert tg.evaluate(row.build(x), {"x": np.ones(3, ot.NP[dtype])}).dtype \
                == np.float32
        with pytest.raises(tg.DTypeError):
            tg.Node.make(op, (x,) * len(op.params))


def test_int_pow_negative_exponent_raises():
    a, b = tg.input("a", (2,), "int32"), tg.input("b", (2,), "int32")
    with pytest.raises(tg.EvaluationError, match="negative"):
        tg.evaluate(a ** b, {"a": np.array([2, 3], np.int32), "b": np.array([1, -1], np.int32)})


def test_where_rejects_a_non_bool_condition():
    with pytest.raises(tg.DTypeError):
        tg.where(tg.input("c", (3,), "int32"), tg.input("a", (3,)), 0.0)


@pytest.mark.parametrize("dtype", ot.ALL)
def test_cast_to_its_own_dtype_is_the_input(dtype):
    a = tg.input("a", (3,), dtype)
    assert tg.cast(a, dtype) is a


def test_cast_float_to_int_truncates_and_to_bool_is_nonzero():
    x = tg.input("x", (6,))
    X = np.array([2.7, -2.7, 0.5, -0.5, 0.0, np.nan], np.float32)
    got = tg.evaluate([x[:5].astype("int32"), x.astype("bool")], {"x": X})
    assert got[0].tolist() == [2, -2, 0, 0, 0]
    assert got[1].tolist() == [True, True, True, True, False, True]


@pytest.mark.parametrize("dtype", ot.ALL)
def test_max_over_an_empty_axis_raises(dtype):
    for shape, axis in [((0, 3), 0), ((2, 0, 3), (0, 1)), ((0,), None), ((3, 0), -1)]:
        with pytest.raises(tg.ShapeError, match="empty"):
            tg.max(tg.input("x", shape, dtype), axis=axis)


def test_gather_out_of_range_raises():
    x, i = tg.input("x", (3, 4)), tg.input("i", (2,), "int64")
    for bad in ([0, 3], [-1, 0]):
        with pytest.raises(tg.EvaluationError, match="out of range"):
            tg.evaluate(tg.gather(x, i), {"x": np.zeros((3, 4), np.float32), "i": np.array(bad)})


@pytest.mark.parametrize("dtype", ot.NUM)
def test_iota_lifted_and_symbolic(dtype):
    for n in (0, 1, 7, 33):
        ot.check_exact(tg.evaluate(tg.iota(n, dtype), {}, dtype="float64"),
                       np.arange(n, dtype=np.float64 if dtype in ot.FLOATS else ot.NP[dtype]))
    seq = tg.input("x", ("seq",))
    y = tg.iota("seq", dtype) + seq.astype(dtype) * 0
    ot.check_exact(tg.evaluate(y, {"x": np.zeros(5, np.float32)}),
                   np.arange(5).astype(ot.NP[dtype]))


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


@pytest.mark.parametrize("dtype", ot.ALL)
def test_copy_to_copies(dtype):
    for shape in [(), (7,), (0, 3), (7, 33)]:
        x = ot.sample(dtype, shape, ot.rng_for("copy", dtype, shape))
        y = tg.copy_to(tg.input("a", shape, dtype), "cuda:0")
        assert y.op.name == "copy_to" and y.attrs["device"] == "cuda:0"
        got = tg.evaluate(y, {"a": x})
        ot.check_exact(got, x)
        assert not np.shares_memory(got, x)


def test_state_update_symbolic_offset():
    s = tg.state("kv", (2, "past", 4))
    y = tg.state_update(s, tg.input("v", (2, 1, 4)), offset="past", axis=1)
    past = sympy.Symbol("past", integer=True, positive=True)
    assert y.shape == (2, past + 1, 4)
    S, V = np.ones((2, 5, 4), np.float32), np.full((2, 1, 4), 7, np.float32)
    got = tg.evaluate(y, {"kv": S, "v": V})
    ot.check_exact(got, np.concatenate([S, V], axis=1))


# ------------------------------------------------------------------------------ float64 lifting
def test_float64_lifting():
    h, b = tg.input("h", (7,), "float16"), tg.input("b", (7,), "bfloat16")
    f, n = tg.input("f", (7,), "float32"), tg.input("n", (7,), "int32")
    H = ot.sample("float16", (7,), ot.rng_for("lift"), "none")
    B = ot.sample("bfloat16", (7,), ot.rng_for("lift2"), "none")
    F = ot.sample("float32", (7,), ot.rng_for("lift3"), "none")
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
    ot.check_close(got[2], F64 / 3.0, 1e-15)
    np.testing.assert_array_equal(got[3], N + 1)
    ot.check_close(got[4], N.astype(np.float64) * 0.1, 1e-15)
    np.testing.assert_array_equal(got[6], H64 < 0.5)
    ot.check_close(got[7], H64.sum(), 1e-15)
    ot.check_close(got[9], np.exp(F64), 1e-15)
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
