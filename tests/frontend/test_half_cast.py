"""An explicit cast to a lower precision the user wrote (``x.half()``, ``x.bfloat16()``)
plans at the default tolerance: its rounding is the op itself (exactly rounded arithmetic on
its input), not an error the kernel adds, so the planner does not charge it the half
precision's rounding as it does a product or a sum computed in float16; nor a reshape or a
slice of half values, which round nothing. Arithmetic in float16 after the cast is still
charged, and refused at 1e-5 naming the op and the fix."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg

torch = pytest.importorskip("torch")


class Cast(torch.nn.Module):
    def __init__(self, dtype, then_add: bool = False):
        super().__init__()
        self.dtype, self.then_add = dtype, then_add

    def forward(self, x):
        y = (x * 3.0).to(self.dtype)
        return y + y if self.then_add else y


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_cast_to_half_precision_plans_at_the_default_tolerance(dtype):
    torch.manual_seed(0)
    module = Cast(getattr(torch, dtype))
    x = torch.randn(4, 33)
    got = tg.from_torch(module, (x,), db=":memory:")(x)  # tolerance 1e-5
    ref = module(x).float().numpy()
    assert str(got.dtype) == dtype
    np.testing.assert_array_equal(got.astype(np.float32), ref)  # the same rounding as torch


class Moves(torch.nn.Module):
    def forward(self, x):
        return x.half().reshape(8, 4).t()[1:], (x > 0).half().flatten()


def test_moving_half_precision_values_is_not_charged_a_rounding():
    """A reshape, transpose or slice of float16 values is bit-exact: it rounds nothing."""
    x = torch.randn(4, 8)
    got = tg.from_torch(Moves(), (x,), db=":memory:")(x)
    for g, r in zip(got, Moves()(x)):
        assert g.dtype == np.float16
        np.testing.assert_array_equal(g, r.numpy())


def test_arithmetic_in_half_precision_is_still_charged_its_rounding():
    x = torch.randn(4, 8)
    with pytest.raises(tg.NoPathError, match=r"add.*float16.*tolerance >= 9\.8e-04"):
        tg.from_torch(Cast(torch.float16, then_add=True), (x,), db=":memory:")
