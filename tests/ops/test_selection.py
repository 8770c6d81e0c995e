"""The selection and scatter ops against the op table (tests/ops/optable.py, family
"selection"): torch's gather and scatter family (take_along_axis, put_along_axis with every
reduce and include_self), index_copy's last writer, cumprod, any and all, each against an
independent numpy oracle and, where torch has the op, against torch."""

from __future__ import annotations

import pytest

from tests.ops import optable as ot

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # nan/inf inputs on purpose


@pytest.mark.parametrize("row,dtype", ot.params("selection"))
def test_matches_oracle(row, dtype):
    ot.check_oracle(row, dtype)


@pytest.mark.parametrize("row,dtype", ot.params("selection", torch=True))
def test_matches_torch(row, dtype):
    torch = pytest.importorskip("torch")
    ot.check_torch(row, dtype, torch)
