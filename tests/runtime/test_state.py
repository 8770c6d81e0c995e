"""Kept state (a KV cache): one buffer, appended in place, one plan for every length."""

import numpy as np
import pytest

import tensor_graphs as tg

RNG = np.random.default_rng(0)


def cache_program(bounds=None):
    kv = tg.state("kv", ("past", 4))
    x = tg.input("x", ("seq", 4))
    new = tg.state_update(kv, x, offset="past", axis=0)
    old_sum = kv.sum(axis=0)  # reads the version before the update
    score = (new @ tg.weight("w", (4, 1))).sum(axis=0)
    prog = tg.compile([score, old_sum, new], db=":memory:", bounds=bounds)
    return prog, [score, old_sum, new]


def test_decode_appends_in_place_with_one_plan():
    prog, outs = cache_program({"past": 30, "seq": 2})
    W = RNG.standard_normal((4, 1)).astype(np.float32)
    prog.bind(w=W, kv=np.zeros((0, 4), np.float32))
    buffer = prog._states["kv"].buffer
    seen = []
    for step in range(6):
        X = RNG.standard_normal((2 if step == 0 else 1, 4)).astype(np.float32)
        before = np.concatenate(seen) if seen else np.zeros((0, 4), np.float32)
        score, old_sum, state = prog(x=X)
        seen.append(X)
        ref = tg.evaluate(outs, {"x": X, "w": W, "kv": before}, dtype="float64")
        assert tg.numerics.relative_error(score, ref[0]) < 1e-5
        np.testing.assert_allclose(old_sum, ref[1], atol=1e-5)
        np.testing.assert_array_equal(state, np.concatenate(seen))
        assert not state.flags.writeable
    assert prog._states["kv"].buffer is buffer  # never reallocated nor copied
    assert buffer.shape == (32, 4)  # past + seq at the bounds
    assert prog.stats["planner_runs"] == 1 and prog.stats["plans"] == 1
    np.testing.assert_array_equal(prog.state("kv"), np.concatenate(seen))
    with pytest.raises(tg.ShapeError, match="past=31"):
        for _ in range(30):
            prog(x=np.ones((1, 4), np.float32))


def test_without_bounds_the_buffer_doubles():
    prog, _ = cache_program()
    prog.bind(w=np.ones((4, 1), np.float32), kv=np.zeros((1, 4), np.float32))
    rows = [np.zeros((1, 4), np.float32)]
    for _ in range(9):
        X = RNG.standard_normal((1, 4)).astype(np.float32)
        rows.append(X)
        _, _, state = prog(x=X)
    np.testing.assert_array_equal(state, np.concatenate(rows))
    assert prog._states["kv"].buffer.shape[0] >= 10


def test_state_errors_are_clear():
    prog, _ = cache_program({"past": 8, "seq": 2})
    prog.bind(w=np.ones((4, 1), np.float32))
    with pytest.raises(tg.FeedError, match="kv"):
        prog(x=np.ones((1, 4), np.float32))
    with pytest.raises(tg.StateError, match="no value"):
        prog.state("kv")
    with pytest.raises(tg.FeedError, match="keeps"):
        prog.state("w")


def test_update_kernel_copies_user_arrays():
    k = tg.kernels.get("numpy_state_update")
    big = np.zeros((6, 4), np.float32)
    view = big[:2]
    out = k.fn(view, np.ones((1, 4), np.float32), axis=0, offset=2)
    assert out.shape == (3, 4) and not np.shares_memory(out, big)
    assert not big[2:].any()  # a user's array is never written past its view


def test_memory_counts_kept_state_at_its_capacity():
    prog, _ = cache_program({"past": 30, "seq": 2})
    planned = prog.memory_plan
    assert planned.state["cpu"] == 30 * 4 * 4  # the state leaf at the bound of past
    expected = planned.total("cpu") - 30 * 4 * 4 + 32 * 4 * 4  # the buffer holds past + seq
    assert prog.memory() == {"cpu": expected}
    prog.bind(w=np.ones((4, 1), np.float32), kv=np.zeros((0, 4), np.float32))
    prog(x=np.ones((2, 4), np.float32))
    assert prog.memory() == {"cpu": expected}  # the active length does not change it
    assert prog._states["kv"].buffer.nbytes == 32 * 4 * 4

    grow, _ = cache_program()  # no bounds: the buffer doubles, memory() says what it holds
    grow.bind(w=np.ones((4, 1), np.float32), kv=np.zeros((3, 4), np.float32))
    grow(x=np.ones((1, 4), np.float32))
    held = grow._states["kv"].buffer.nbytes
    assert held == 6 * 4 * 4
    plan = grow.memory_plan
    assert grow.memory() == {"cpu": plan.total("cpu") - plan.state["cpu"] + held}


def test_a_feed_that_disagrees_with_a_kept_state_on_a_dim_is_refused_by_name():
    """A kept state binds its dims from its own shape (it is not checked as a feed); a feed
    that binds the same dim otherwise is refused, naming both."""
    kv = tg.state("kv", ("past", 4))
    mask = tg.input("mask", ("past",))
    x = tg.input("x", (1, 4))
    new = tg.state_update(kv, x, offset="past", axis=0)
    prog = tg.compile([(kv.sum(axis=1) * mask).sum(), new], db=":memory:",
                      bounds={"past": 8})
    prog.bind(kv=np.ones((3, 4), np.float32))
    total, _ = prog(x=np.ones((1, 4), np.float32), mask=np.ones(3, np.float32))
    assert float(total) == 12.0
    with pytest.raises(tg.ShapeError, match="past"):
        prog(x=np.ones((1, 4), np.float32), mask=np.ones(5, np.float32))


def test_a_gpu_state_is_the_prefix_a_token_grew_and_never_a_stale_view(simulate_gpu):
    """On a GPU, a token's new version that is the buffer's prefix is shown as it is (a
    ``narrow`` per state per token was host work a GPT-2 token spent ~130 us on, on a slow
    host); a view inside the buffer laid out otherwise, or one of a buffer the state no
    longer holds, is not."""
    torch = pytest.importorskip("torch")
    from tensor_graphs.runtime.state import State

    simulate_gpu("1")
    st = State(tg.state("kv", ("past", 4)), 0, "cuda")
    st.set(torch.ones(2, 4), capacity=8)  # bound: copied into a buffer with room for 8
    buf = st.buffer
    grown = torch.as_strided(buf, (3, 4), buf.stride(), 0)  # as ``state_update`` grows it
    st.set(grown)
    assert st.view() is grown and st.buffer is buf and st.active == 3
    across = torch.as_strided(buf, (3, 4), (1, 3), 0)  # starts where the buffer does
    st.set(across)
    assert st.view() is not across and st.view().stride() == buf.stride()
    st.set(torch.arange(40.0).reshape(10, 4))  # past the room: the buffer doubles
    assert st.buffer is not buf and st.buffer.shape == (16, 4)
    assert st.view().data_ptr() == st.buffer.data_ptr()
    np.testing.assert_array_equal(st.view().numpy(), np.arange(40.0).reshape(10, 4))
    st.set(grown)  # the old buffer's prefix: copied into the one held
    assert st.view() is not grown and st.view().data_ptr() == st.buffer.data_ptr()
    np.testing.assert_array_equal(st.view().numpy(), grown.numpy())
