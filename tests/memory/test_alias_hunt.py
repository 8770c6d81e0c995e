"""Aliasing bugs found by a hunt through the public API: results that silently took another
value's bytes. Each test compares a program's results with the float64 reference."""

from __future__ import annotations

import numpy as np

import tensor_graphs as tg
from tensor_graphs.ir.evaluate import evaluate
from tensor_graphs.numerics import relative_error


def test_an_output_of_a_states_old_version_is_not_its_new_one():
    """The kept state's new version was written into its buffer before the other results
    were copied out, so an output viewing the old version (the state itself, a transpose)
    returned the new one."""
    w = tg.state("w", (3, 4))
    g = tg.input("g", (3, 4))
    outs = [tg.state_update(w, w - 0.1 * g, offset=0, axis=0), w, w.T]
    prog = tg.compile(outs, db=":memory:")
    rng = np.random.default_rng(0)
    current = rng.standard_normal((3, 4)).astype(np.float32)
    prog.bind(w=current)
    for _ in range(3):
        grad = rng.standard_normal((3, 4)).astype(np.float32)
        got = prog(g=grad)
        ref = evaluate(outs, {"w": current, "g": grad}, dtype="float64")
        for a, b in zip(got, ref):
            assert relative_error(a, b) < 1e-5
        current = np.array(got[0])


def test_an_older_version_of_a_state_among_the_outputs_is_not_the_one_kept():
    """Every new version among the outputs was kept, the last listed winning: with the
    newest listed first the state lost the second append, and the next call wrote over the
    rows of the newest version it had returned."""
    kv = tg.state("kv", ("past", 2))
    x = tg.input("x", ("seq", 2))
    first = tg.state_update(kv, x, offset="past", axis=0)
    second = tg.state_update(first, x * 2.0, offset="past + seq", axis=0)
    prog = tg.compile([second, first], db=":memory:")
    prog.bind(kv=np.zeros((0, 2), np.float32))
    newest, _ = prog(x=np.ones((1, 2), np.float32))
    held = np.array(newest)
    prog(x=np.full((1, 2), 3.0, np.float32))
    np.testing.assert_array_equal(newest, held)
    np.testing.assert_array_equal(prog.state("kv")[:, 0], [1.0, 2.0, 3.0, 6.0])


def test_an_empty_output_of_a_fitted_native_loop_has_the_calls_shape():
    """The native loop fitted over dims returned an empty output at the shape of its first
    sample, (3, 0) for every later call, while its other outputs followed the dims."""
    x = tg.input("x", ("n", 1))
    prog = tg.compile([x * 2.0, x[:, 1:]], db=":memory:", bounds={"n": 8})
    for n in (8, 3, 5, 3, 8, 2, 5, 6, 7):
        doubled, empty = prog(x=np.ones((n, 1), np.float32))
        assert doubled.shape == (n, 1) and empty.shape == (n, 0), prog.loop
    assert "fitted over dims" in prog.loop


def test_the_estimate_counts_what_out_of_memory_refuses():
    """A result viewing an input (a broadcast) is copied out whole by every call and the
    OutOfMemory check counted it, but ``tg.estimate_memory`` and ``prog.memory()`` left it
    out: they said {} for a graph the check refused for 4 MB."""
    x = tg.input("x", (512, 512))
    out = tg.expand(x[:1], (2048, 512))
    need = 2048 * 512 * 4
    assert tg.estimate_memory(out, db=":memory:") == {"cpu": need}
    assert tg.compile(out, db=":memory:").memory() == {"cpu": need}
    small = tg.Device("cpu", capacity=need - 1)
    try:
        tg.compile(out, db=":memory:", device=small)
    except tg.OutOfMemory as exc:
        assert exc.required == need
    else:
        raise AssertionError("a device one byte short took the program")
