"""Results a caller keeps keep their values. A kept state written over in place (a running
value, an optimizer's parameter) is handed out as a view of its buffer, so the next call
changed last call's result, and ``prog.state`` taken before a call showed the value after it.
A state now remembers the views it handed out, and a call that writes moves it to a copy
first while one of them is alive (``State.keep_shown``): paid only where one is kept. An
append-only state (a KV cache) never needs it: its old prefixes are not written."""

from __future__ import annotations

import numpy as np

import tensor_graphs as tg


def _running_mean():
    s = tg.state("s", (64,), "float32")
    x = tg.input("x", (64,))
    prog = tg.compile(tg.state_update(s, s * 0.5 + x), db=":memory:")
    prog.bind(s=np.zeros(64, np.float32))
    return prog


def _expected(steps: int) -> list[np.ndarray]:
    value, out = np.zeros(64), []
    for i in range(steps):
        value = value * 0.5 + i
        out.append(value.copy())
    return out


def test_kept_results_and_state_views_keep_their_values():
    prog = _running_mean()
    kept = [prog(x=np.full(64, i, np.float32)) for i in range(10)]
    for got, want in zip(kept, _expected(10)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    before = prog.state("s")
    prog(x=np.full(64, 100, np.float32))
    np.testing.assert_allclose(before, _expected(10)[-1], rtol=1e-6)
    prog.bind(s=np.full(64, 7, np.float32))  # bind writes over the prefix too
    np.testing.assert_allclose(before, _expected(10)[-1], rtol=1e-6)
    np.testing.assert_array_equal(prog.state("s"), 7)


def test_results_not_kept_cost_nothing_and_run_natively():
    prog = _running_mean()
    for i in range(3):
        prog(x=np.full(64, i, np.float32))
    state = prog._states["s"]
    buffer, native = state.buffer, prog.stats["native_runs"]
    for i in range(8):
        prog(x=np.full(64, i, np.float32))
    assert state.buffer is buffer  # never moved
    assert prog.stats["native_runs"] - native == 8, prog.loop


def test_an_append_only_state_is_not_moved_for_a_kept_result():
    cache = tg.state("cache", ("past", 4), "float32")
    row = tg.input("row", (1, 4))
    grown = tg.state_update(cache, row, axis=0, offset="past")
    prog = tg.compile(grown, db=":memory:", bounds={"past": 16})
    assert not prog._states["cache"].rewrites
    prog.bind(cache=np.zeros((0, 4), np.float32))
    kept = [prog(row=np.full((1, 4), i, np.float32)) for i in range(6)]
    for i, got in enumerate(kept):
        np.testing.assert_array_equal(got[:, 0], np.arange(i + 1))  # each its own prefix
    assert all(np.shares_memory(kept[0], k) for k in kept)  # one buffer: nothing copied
