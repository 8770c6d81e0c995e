"""Generated regions over integers verify: a constant whose siblings are constants too (the
branches of ``where(c, 0, -1)``) is built in the region's own dtype, not float32. Before, such
right kernels were refused and every plan that chose one was made twice."""

import numpy as np

import tensor_graphs as tg


def test_int32_right_shift_plans_once_with_its_generated_kernels_kept():
    a = tg.input("a", (5,), "int32")
    b = tg.input("b", (5,), "int32")
    prog = tg.compile(tg.right_shift(a, b), db=":memory:")
    x = np.array([0, 100, -200, 300, 400], np.int32)
    s = np.array([0, 1, 2, 3, 40], np.int32)
    np.testing.assert_array_equal(prog(a=x, b=s), [0, 50, -50, 37, 0])
    assert prog.stats.get("generated_refused", 0) == 0, prog.stats
    assert prog.stats["planner_runs"] == 1
    assert any(getattr(st.kernel, "generated", False) for st in prog.plan.steps)
