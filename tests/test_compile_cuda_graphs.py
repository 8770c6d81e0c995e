"""``tg.compile``'s ``cuda_graphs`` option on any machine: it sets the program's attribute and
refuses what is not a bool (the GPU behaviour: tests/gpu/test_cuda_graphs.py)."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg


def _y():
    return tg.tanh(tg.input("x", (4, 8))) * 2.0


@pytest.mark.parametrize("on", [True, False])
def test_the_option_sets_the_programs_attribute(on):
    prog = tg.compile(_y(), db=":memory:", cuda_graphs=on)
    assert prog.cuda_graphs is on
    x = np.ones((4, 8), np.float32)
    np.testing.assert_allclose(prog(x=x), np.tanh(x) * 2.0, rtol=1e-6)  # no effect on the cpu


def test_the_default_captures():
    assert tg.compile(_y(), db=":memory:").cuda_graphs is True


@pytest.mark.parametrize("value", ["no", 0, None])
def test_a_non_bool_is_refused_with_the_fix(value):
    with pytest.raises(tg.ArgumentError, match=r"cuda_graphs=.*pass True .* or False"):
        tg.compile(_y(), db=":memory:", cuda_graphs=value)
