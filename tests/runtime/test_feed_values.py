"""What a call's fed values may hold. Ids are checked before a call runs (``ir/index_limits``):
an input whose values reach a gather's or scatter's indices unchanged must lie in [0, size) of
the axis they pick from, found through composites and reshapes, with a symbolic size read at
the call's dims. An empty input the graph cannot compute on is named with the error."""

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.index_limits import Limit, index_limits

RNG = np.random.default_rng(5)


def test_limits_are_found_through_composites_and_reshapes():
    ids = tg.input("ids", (2, 3), "int64")
    table = tg.weight("table", (10, 4))
    picked = tg.embedding(tg.reshape(tg.permute(ids, (1, 0)), (6,)), table)
    assert index_limits([picked]) == {
        "ids": (Limit("gather", 0, 10, "'table' (10, 4)"),)}


def test_scatter_indices_and_a_symbolic_size():
    x = tg.input("x", ("n", 4))
    where = tg.input("where", (3,), "int64")
    y = tg.scatter(x, where, tg.input("u", (3, 4)), axis=0)
    (limit,) = index_limits([y])["where"]
    assert (limit.op, limit.axis, str(limit.size)) == ("scatter", 0, "n")
    prog = tg.compile(y, db=":memory:", backends=("numpy",))
    X, U = RNG.standard_normal((5, 4)).astype(np.float32), np.ones((3, 4), np.float32)
    prog(x=X, where=np.array([0, 4, 4]), u=U)
    with pytest.raises(tg.EvaluationError, match=r"'where' holds 5 at \(1,\).*in \[0, 5\)"):
        prog(x=X, where=np.array([0, 5, 4]), u=U)


def test_computed_indices_are_left_to_the_ops_own_check():
    """An index the graph computes (a sum, a linear index) is not a feed's values: the
    reference's and kernels' own range checks answer for it."""
    x = tg.input("x", (5, 7))
    i = tg.input("i", (1, 3), "int64")
    assert index_limits([tg.take_along_axis(x, i, axis=1)]) == {}
    assert index_limits([tg.embedding(i + 1, tg.weight("t", (4, 2)))]) == {}
    assert index_limits([tg.tanh(x)]) == {}


def test_a_refused_call_names_the_feed_and_runs_nothing():
    ids = tg.input("ids", (1, "seq"), "int32")
    table = tg.weight("table", (8, 4))
    y = tg.embedding(ids, table) * 2.0
    prog = tg.compile(y, db=":memory:", backends=("numpy",), bounds={"seq": 4})
    T = RNG.standard_normal((8, 4)).astype(np.float32)
    prog.bind(table=T)
    runs = prog.stats["calls"]
    with pytest.raises(tg.EvaluationError, match=r"input 'ids' holds 8 at \(0, 2\), out of "
                       r"range: it indexes axis 0 of 'table' \(8, 4\) through gather"):
        prog(ids=np.array([[0, 7, 8]], np.int32))
    assert prog.stats["calls"] == runs
    np.testing.assert_allclose(prog(ids=np.array([[7, 0]], np.int32)), 2 * T[None, [7, 0]])


def test_an_empty_input_is_named_with_the_error_it_meets():
    """An empty prompt failed in softmax's max with no word of the feed that made it."""
    x = tg.input("x", (2, "seq"))
    prog = tg.compile(tg.softmax(x, axis=1) * 2.0, db=":memory:", backends=("numpy",))
    prog(x=np.ones((2, 3), np.float32))
    with pytest.raises(tg.ShapeError, match=r"cannot reduce the empty axis.*\(this call binds "
                       r"seq=0 from the feed\(s\) 'x' \(2, seq\): an empty input"):
        prog(x=np.ones((2, 0), np.float32))
    assert prog(x=np.ones((2, 1), np.float32)).shape == (2, 1)


def test_a_dim_of_zero_that_the_graph_computes_on_is_no_error():
    """A prefill from empty caches binds ``past=0``: nothing to say there."""
    cache = tg.state("cache", ("past", 4))
    x = tg.input("x", ("seq", 4))
    new = tg.state_update(cache, x, offset="past", axis=0)
    prog = tg.compile([new.sum(axis=0), new], db=":memory:", backends=("numpy",))
    prog.bind(cache=np.zeros((0, 4), np.float32))
    total, kept = prog(x=np.ones((3, 4), np.float32))
    np.testing.assert_array_equal(total, np.full(4, 3.0, np.float32))
