"""Edge cases of the fluent API through tg.compile's CPU pipeline, each once a wrong result
or an unclear failure."""

import numpy as np
import pytest

import tensor_graphs as tg


def _along_ids() -> np.ndarray:
    ids = np.zeros((6, 1), np.int64)
    ids[0], ids[2] = 5, -1  # one past its row, and numpy's "last" (torch refuses both)
    return ids


def test_take_along_axis_refuses_an_index_past_its_row():
    """Gathered from x flattened at a linear index, an index past its row's end read the
    next row's element (and -1 the previous row's last) with no error, fed or computed."""
    x, i = tg.input("x", (6, 5)), tg.input("i", (6, 1), dtype="int64")
    values = np.arange(30, dtype=np.float32).reshape(6, 5)
    for indices, fed in ((i, _along_ids()), (i + 1, _along_ids() - 1)):
        prog = tg.compile(tg.take_along_axis(x, indices, axis=-1))
        with pytest.raises(tg.EvaluationError, match="out of range"):
            prog(x=values, i=fed)
    ok = np.full((6, 1), 4, np.int64)
    prog = tg.compile(tg.take_along_axis(x, i, axis=-1))
    np.testing.assert_array_equal(prog(x=values, i=ok), np.take_along_axis(values, ok, 1))


@pytest.mark.parametrize("reduce", ["replace", "sum"])
def test_put_along_axis_refuses_an_index_past_its_row(reduce):
    """The scatter twin: an index past its row's end wrote into the next row."""
    x, i, v = tg.input("x", (6, 5)), tg.input("i", (6, 1), dtype="int64"), tg.input("v", (6, 1))
    prog = tg.compile(tg.put_along_axis(x, i, v, axis=1, reduce=reduce))
    with pytest.raises(tg.EvaluationError, match="out of range"):
        prog(x=np.zeros((6, 5), np.float32), i=_along_ids(), v=np.ones((6, 1), np.float32))
