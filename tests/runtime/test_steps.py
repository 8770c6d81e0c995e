"""Per-instruction times: every instruction timed once per call, grouped, results unchanged."""

import numpy as np

import tensor_graphs as tg
from tensor_graphs.runtime.steps import format_step_times, step_times


def test_step_times_cover_every_instruction_and_leave_the_program_as_it_was():
    x = tg.input("x", (4, 8))
    w = tg.weight("w", (8, 8))
    y = tg.tanh(x @ w) + tg.exp(x @ w)
    prog = tg.compile(y, db=":memory:", backends=("numpy",))
    rng = np.random.default_rng(0)
    wv, xv = rng.standard_normal((8, 8)), rng.standard_normal((4, 8))
    prog.bind(w=wv.astype(np.float32))
    feeds = {"x": xv.astype(np.float32)}
    before = prog(**feeds)
    rows = step_times(prog, feeds, repeats=3)
    assert sum(r.count for r in rows) == len(prog._last.instructions)  # noqa: SLF001
    assert all(r.seconds >= 0 for r in rows)
    assert [r.seconds for r in rows] == sorted((r.seconds for r in rows), reverse=True)
    assert {r.kernel for r in rows} >= {"numpy_tanh", "numpy_exp"}
    np.testing.assert_array_equal(prog(**feeds), before)  # the instructions are restored
    text = format_step_times(rows)
    assert "numpy_tanh" in text and "instructions" in text.splitlines()[-1]
