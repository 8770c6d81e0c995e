"""A kept state's new version written over the old one in place (``lower._overwrites``,
``program._overwrite``): an optimizer's parameters and moments are updated without copying
the whole state twice per step, and only where nothing later reads the old version."""

from __future__ import annotations

import types

import numpy as np

import tensor_graphs as tg
from tensor_graphs.kernels import storage
from tensor_graphs.runtime.program import _overwrite


def _sgd_program():
    s = tg.state("s", (64, 32), "float32")
    g = tg.input("g", (64, 32), "float32")
    return tg.compile(tg.state_update(s, s - 0.5 * g))


def test_an_overwritten_state_runs_in_the_native_loop():
    """A copy of the state refused the native loop ("the state update copied the state");
    written in place, the step is C calls and a recorded copy into the state's buffer."""
    prog = _sgd_program()
    rng = np.random.default_rng(0)
    s0 = rng.standard_normal((64, 32)).astype(np.float32)
    gs = [rng.standard_normal((64, 32)).astype(np.float32) for _ in range(4)]
    prog.bind(s=s0)
    first = prog(g=gs[0])
    for g in gs[1:]:
        prog(g=g)
    assert prog.loop.startswith("native loop"), prog.loop
    assert prog.stats["native_runs"] >= 1
    expect = s0 - 0.5 * sum(gs)
    assert np.abs(prog.state("s") - expect).max() < 1e-5
    assert np.shares_memory(first, prog.state("s"))  # one buffer throughout


def test_the_old_version_read_after_the_update_is_not_overwritten():
    """``s + 1`` reads the old version; whatever the order of the steps, it sees the value
    from before the call."""
    s = tg.state("s", (5,), "float64")
    prog = tg.compile([tg.state_update(s, s * 2.0), s + 1.0])
    prog.bind(s=np.arange(5.0))
    for k in range(3):
        new, old_plus_one = prog()
        np.testing.assert_array_equal(old_plus_one, np.arange(5.0) * 2 ** k + 1)
        np.testing.assert_array_equal(new, np.arange(5.0) * 2 ** (k + 1))


def test_a_state_fed_by_the_caller_is_never_written():
    prog = _sgd_program()
    prog.bind(s=np.zeros((64, 32), np.float32))
    mine = np.ones((64, 32), np.float32)
    new = prog(g=np.ones((64, 32), np.float32), s=mine)
    np.testing.assert_array_equal(mine, 1.0)  # the caller's array is left as it was
    np.testing.assert_array_equal(new, 0.5)


def _owned_state():
    buf = storage.allocate((4, 3), np.float64)
    return buf, buf[0:4]  # the active prefix, as a program feeds its kept state


def test_overwrite_refuses_a_state_a_later_value_shares_memory_with():
    buf, state = _owned_state()
    value = np.full((4, 3), 7.0)
    alias = state.reshape(12)  # a view of the old version, still to be read
    ins = types.SimpleNamespace(args=(0, 1), overwrite=(2,))
    attrs = {"axis": 0, "offset": 0}
    assert not _overwrite(ins, attrs, [state, value, alias])
    assert not buf.any()
    assert _overwrite(ins, attrs, [state, value, None])  # that value dropped: in place
    np.testing.assert_array_equal(buf, 7.0)


def test_overwrite_refuses_a_partial_write_and_a_foreign_array():
    buf, state = _owned_state()
    ins = types.SimpleNamespace(args=(0, 1), overwrite=())
    assert not _overwrite(ins, {"axis": 0, "offset": 1}, [state, np.ones((3, 3)), None])
    assert not _overwrite(ins, {"axis": 0, "offset": 0}, [state, np.ones((2, 3)), None])
    foreign = np.zeros((4, 3))
    assert not _overwrite(ins, {"axis": 0, "offset": 0}, [foreign, np.ones((4, 3)), None])
    assert not buf.any() and not foreign.any()
