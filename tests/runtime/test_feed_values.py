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
    """An empty prompt failed in softmax's max with no word of the feed that made it (softmax
    of an empty axis is the empty result now, as torch's; max itself still refuses one)."""
    x = tg.input("x", (2, "seq"))
    prog = tg.compile(x.max(axis=1, keepdims=True) * 2.0, db=":memory:", backends=("numpy",))
    prog(x=np.ones((2, 3), np.float32))
    with pytest.raises(tg.ShapeError, match=r"cannot reduce the empty axis.*\(this call binds "
                       r"seq=0 from the feed\(s\) 'x' \(2, seq\): an empty input"):
        prog(x=np.ones((2, 0), np.float32))
    assert prog(x=np.ones((2, 1), np.float32)).shape == (2, 1)


def test_a_slice_of_an_empty_symbolic_axis_is_named_not_a_bare_numpy_error():
    """``x[1:]`` of ``n`` is planned as ``n - 1`` long (a symbolic dim is at least 1): a call
    binding n=0 sized the step's arena view at -1, and numpy's bare "negative dimensions are
    not allowed" ValueError came out, naming neither the step nor the feed."""
    x = tg.input("x", ("n", 4))
    prog = tg.compile(tg.exp(x[1:]) * 2.0, db=":memory:", backends=("numpy",),
                      bounds={"n": 6})
    with pytest.raises(tg.ShapeError, match=r"numpy_slice: its result of shape \(n - 1, 4\) "
                       r"is \(-1, 4\) at n=0: .*\(this call binds n=0 from the feed\(s\) 'x'"):
        prog(x=np.ones((0, 4), np.float32))
    np.testing.assert_allclose(prog(x=np.zeros((3, 4), np.float32)), np.full((2, 4), 2.0))


def test_a_dim_of_zero_that_the_graph_computes_on_is_no_error():
    """A prefill from empty caches binds ``past=0``: nothing to say there."""
    cache = tg.state("cache", ("past", 4))
    x = tg.input("x", ("seq", 4))
    new = tg.state_update(cache, x, offset="past", axis=0)
    prog = tg.compile([new.sum(axis=0), new], db=":memory:", backends=("numpy",))
    prog.bind(cache=np.zeros((0, 4), np.float32))
    total, kept = prog(x=np.ones((3, 4), np.float32))
    np.testing.assert_array_equal(total, np.full(4, 3.0, np.float32))


@pytest.mark.parametrize("given, dtype, held", [
    (np.array([1, 2, 2**32 + 1]), "int32", 2**32 + 1),  # int64 ids for an int32 input
    ([0, 7, -1], "uint8", -1),  # a padding id of -1 for a uint8 input
    (np.array([3, 2**63], np.uint64), "int64", 2**63),
])
def test_an_int_feed_out_of_its_leafs_range_is_refused_not_wrapped(given, dtype, held):
    """The cast that stores a feed in its leaf's dtype wrapped 2**32 + 1 to 1 without a
    word: the call answered for other values than those given. In range it still runs."""
    i = tg.input("i", (3,), dtype)
    prog = tg.compile(i + 1, db=":memory:", backends=("numpy",))
    runs = prog.stats["calls"]
    pattern = rf"feed 'i': input 'i' is {dtype}, .*values given hold {held}, which would wrap"
    with pytest.raises(tg.DTypeError, match=pattern):
        prog(i=given)
    with pytest.raises(tg.DTypeError, match=pattern):
        tg.evaluate(i + 1, {"i": given})
    assert prog.stats["calls"] == runs
    np.testing.assert_array_equal(prog(i=np.array([0, 1, 2])), np.array([1, 2, 3], dtype))


def test_an_int_tensor_out_of_range_is_refused_when_fed_or_bound():
    """A torch tensor is checked through a stand-in of zeros, so its values need their own
    read (on the host) before the cast wraps them."""
    torch = pytest.importorskip("torch")
    i, w = tg.input("i", (2,), "int32"), tg.weight("w", (2,), "uint8")
    prog = tg.compile([i + 1, w + 1], db=":memory:", backends=("numpy",))
    with pytest.raises(tg.DTypeError, match=r"bind: feed 'w': weight 'w' is uint8, .* hold -1"):
        prog.bind(w=torch.tensor([-1, 3]))
    prog.bind(w=torch.tensor([2, 3]))
    with pytest.raises(tg.DTypeError, match=r"feed 'i': input 'i' is int32, .* hold 4294967297"):
        prog(i=torch.tensor([5, 2**32 + 1]))
    ids, ws = prog(i=torch.tensor([5, 6]))
    np.testing.assert_array_equal(ids, [6, 7])
    np.testing.assert_array_equal(ws, [3, 4])


@pytest.mark.parametrize("make", [
    lambda torch: torch.ones(3, dtype=torch.complex64),
    lambda torch: torch.ones(3).to(torch.float8_e4m3fn),
    lambda torch: torch.ones(3, dtype=torch.uint16),
])
def test_a_tensor_of_a_dtype_we_lack_meets_the_feed_check(make):
    """A torch dtype outside ours raised KeyError('complex64') from the stand-in that checks
    it; now it is named as an array of that dtype is."""
    torch = pytest.importorskip("torch")
    value = make(torch)
    prog = tg.compile(tg.input("f", (3,)) * 2.0, db=":memory:", backends=("numpy",))
    name = str(value.dtype).removeprefix("torch.")
    with pytest.raises(tg.DTypeError, match=rf"feed 'f': input 'f' expects float32 \(float\) "
                       rf"data, got {name} values"):
        prog(f=value)


def test_a_tensor_numpy_cannot_hold_is_refused_by_its_dtype():
    torch = pytest.importorskip("torch")
    value = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8)
    prog = tg.compile(tg.input("f", (3,)) * 2.0, db=":memory:", backends=("numpy",))
    with pytest.raises(tg.DTypeError, match=r"dtype torch.quint8 cannot be given .* \.to\(\)"):
        prog(f=value)
