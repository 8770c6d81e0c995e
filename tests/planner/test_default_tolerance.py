"""The default tolerance follows the precision of the graph's results: 1e-5 for float32, the
dtype's rounding where every float result is float16 or bfloat16 (a half-precision model
plans with nothing to set), and 1e-5 again as soon as one float result is float32."""

from __future__ import annotations

import numpy as np
import pytest
from ml_dtypes import bfloat16

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error

RNG = np.random.default_rng(0)


@pytest.mark.parametrize(("dtype", "tolerance"), [
    ("float32", 1e-5), ("float16", 2.0 ** -10), ("bfloat16", 2.0 ** -7)])
def test_a_graph_plans_at_its_results_precision(dtype, tolerance):
    h = tg.input("h", (8, 128), dtype)
    prog = tg.compile(tg.exp(h) * 2.0 - 1.0, db=":memory:")
    assert prog.plan.tolerance == tolerance
    x = RNG.standard_normal((8, 128)).astype(np.float32)
    feed = x.astype(bfloat16 if dtype == "bfloat16" else dtype)
    got = prog(h=feed)
    assert got.dtype == feed.dtype
    ref = np.exp(feed.astype(np.float64)) * 2.0 - 1.0
    # a few roundings of the result's dtype; float32 within the tolerance itself
    assert relative_error(got.astype(np.float64), ref) <= 4 * tolerance


def test_one_float32_result_keeps_the_float32_default():
    h = tg.input("h", (4, 16), "float16")
    wide = h.astype("float32")
    with pytest.raises(tg.NoPathError, match=r"float16.*tolerance >= 9\.8e-04"):
        tg.compile([h + h, wide * 3.0], db=":memory:")
    assert tg.compile([wide * 3.0], db=":memory:").plan.tolerance == 1e-5
    # no float result at all (an index): the float32 default
    assert tg.compile(tg.argmax(wide, axis=1), db=":memory:").plan.tolerance == 1e-5


def test_an_explicit_tolerance_wins():
    h = tg.input("h", (4, 16), "float16")
    with pytest.raises(tg.NoPathError, match=r"add.*float16.*tolerance >= 9\.8e-04"):
        tg.compile(h + h, db=":memory:", tolerance=1e-5)
    assert tg.compile(h + h, db=":memory:", tolerance=1e-2).plan.tolerance == 1e-2
    with pytest.raises(tg.ArgumentError, match="positive number"):
        tg.compile(h + h, db=":memory:", tolerance=0.0)
