"""c_embedding under the native loop: an embedding program runs as one foreign call. A fed id
out of range is refused before anything runs (``ir/index_limits``); one the program holds (a
bound state) stops the runner, so the Python loop raises c_embedding's own error."""

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.kernels.c import build
from tensor_graphs.numerics import relative_error
from tensor_graphs.runtime import native

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")
RNG = np.random.default_rng(11)


@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
def test_embedding_program_runs_natively_and_raises_on_a_bad_id(id_dtype):
    ids = tg.input("ids", (2, "seq"), id_dtype)
    table = tg.weight("table", (40, 16))
    w = tg.weight("w", (16,))
    b = tg.weight("b", (16,))
    y = tg.layer_norm(tg.embedding(ids, table), w, b)
    prog = tg.compile(y, db=":memory:", backends=("c",), bounds={"seq": 8})
    assert [s.kernel.name for s in prog.plan.steps] == ["c_embedding", "c_layer_norm"]
    weights = {"table": RNG.standard_normal((40, 16)).astype(np.float32),
               "w": RNG.standard_normal(16).astype(np.float32),
               "b": RNG.standard_normal(16).astype(np.float32)}
    prog.bind(**weights)

    def run(ids_value):
        got = prog(ids=ids_value)
        ref = tg.evaluate(y, {"ids": ids_value, **weights}, dtype="float64")
        assert relative_error(got, ref) <= 1e-5
        return got

    for _ in range(2):  # the second call records
        run(RNG.integers(0, 40, (2, 5)).astype(id_dtype))
    assert "recorded" in prog.loop, prog.loop
    before = native.counters()
    run(RNG.integers(0, 40, (2, 5)).astype(id_dtype))
    assert prog.loop.startswith("native loop"), prog.loop
    assert native.counters()["runs"] - before["runs"] == 1

    bad = RNG.integers(0, 40, (2, 5)).astype(id_dtype)
    bad[1, 3] = 40
    with pytest.raises(tg.EvaluationError, match=r"input 'ids' holds 40 at \(1, 3\), out of "
                       r"range: it indexes axis 0 of 'table' \(40, 16\) through gather, so its "
                       r"values must be in \[0, 40\) \(nothing ran\)"):
        prog(ids=bad)
    bad[1, 3] = -7
    with pytest.raises(tg.EvaluationError, match="holds -7 at"):
        prog(ids=bad)
    run(RNG.integers(0, 40, (2, 5)).astype(id_dtype))  # the recording still holds
    assert prog.loop.startswith("native loop"), prog.loop


def test_a_bad_id_the_program_holds_stops_the_native_runner():
    """Ids bound as a state are not a call's feed: c_embedding's own check stops the foreign
    call, the Python loop raises its error, and the recording holds for the next call."""
    ids = tg.state("ids", (2, 5), "int64")
    table = tg.weight("table", (40, 16))
    prog = tg.compile(tg.embedding(ids, table), db=":memory:", backends=("c",))
    assert [s.kernel.name for s in prog.plan.steps] == ["c_embedding"]
    good = RNG.integers(0, 40, (2, 5))
    prog.bind(table=RNG.standard_normal((40, 16)).astype(np.float32), ids=good)
    for _ in range(3):
        prog()
    assert prog.loop.startswith("native loop"), prog.loop
    bad = good.copy()
    bad[1, 3] = 40
    prog.bind(ids=bad)
    with pytest.raises(tg.EvaluationError,
                       match="c_embedding: id 40 is out of range for a table of 40 rows"):
        prog()
    prog.bind(ids=good)
    prog()
    assert prog.loop.startswith("native loop"), prog.loop


def test_token_plus_position_embedding_is_one_c_call_natively():
    ids = tg.input("ids", (2, 8), "int64")
    wte = tg.weight("wte", (40, 16))
    wpe = tg.weight("wpe", (8, 16))
    y = tg.softmax(tg.embedding(ids, wte) + wpe)
    # generate=False: a generated add + softmax row kernel would take the add (c_embedding)
    prog = tg.compile(y, db=":memory:", backends=("c",), generate=False)
    assert [s.kernel.name for s in prog.plan.steps] == ["c_embedding_add", "c_softmax"]
    weights = {"wte": RNG.standard_normal((40, 16)).astype(np.float32),
               "wpe": RNG.standard_normal((8, 16)).astype(np.float32)}
    prog.bind(**weights)
    for i in range(4):
        ids_value = RNG.integers(0, 40, (2, 8))
        got = prog(ids=ids_value)
        ref = tg.evaluate(y, {"ids": ids_value, **weights}, dtype="float64")
        assert relative_error(got, ref) <= 1e-5
        if i >= 2:
            assert prog.loop.startswith("native loop"), prog.loop
    bad = RNG.integers(0, 40, (2, 8))
    bad[0, 0] = 99
    with pytest.raises(tg.EvaluationError, match="input 'ids' holds 99 at"):
        prog(ids=bad)
