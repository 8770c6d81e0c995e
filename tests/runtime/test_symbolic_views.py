"""A symbolic program's reshape planned as a copy at the bounds may be a view at other dims."""

import numpy as np

import tensor_graphs as tg


def test_reshape_that_becomes_a_view_is_not_overwritten():
    # At seq=16 the permuted (1, seq, 4, 8) needs a copy to reshape; at seq=1 it is contiguous
    # and numpy returns a view of the first matmul's arena buffer, which the memory plan
    # (made at the bounds) gives to the second matmul's result: that read must not alias it.
    x = tg.input("x", (1, 4, "seq", 8))
    h = x @ tg.weight("u", (8, 8))
    y = tg.reshape(tg.permute(h, (0, 2, 1, 3)), (1, "seq", 32)) @ tg.weight("w", (32, 8))
    rng = np.random.default_rng(0)
    U = rng.standard_normal((8, 8)).astype(np.float32)
    W = rng.standard_normal((32, 8)).astype(np.float32)
    prog = tg.compile(y, db=":memory:", bounds={"seq": 16}).bind(u=U, w=W)
    for seq in (7, 1, 2, 1):
        X = rng.standard_normal((1, 4, seq, 8)).astype(np.float32)
        ref = (X @ U).transpose(0, 2, 1, 3).reshape(1, seq, 32) @ W
        assert tg.numerics.relative_error(prog(x=X), ref) < 1e-5, seq
    assert prog.stats["planner_runs"] == 1
