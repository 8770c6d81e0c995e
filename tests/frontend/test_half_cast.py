"""An explicit cast to a lower precision the user wrote (``x.half()``, ``x.bfloat16()``)
plans at the default tolerance: its rounding is the op itself (exactly rounded arithmetic on
its input), not an error the kernel adds, so the planner does not charge it the half
precision's rounding as it does a product or a sum computed in float16; nor a reshape or a
slice of half values, which round nothing. Arithmetic in float16 after the cast is still
charged: refused at 1e-5 naming the op and the fix, planned at the default tolerance of a
model whose results are float16 (its rounding); a float32 model's bfloat16 arithmetic is
refused at its default."""

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
    """At 1e-5, asked for, a sum in float16 is refused naming the op and the fix; left at the
    default, a model whose results are float16 plans at float16's rounding (its dtype's
    accuracy, as torch's tests allow)."""
    x = torch.randn(4, 8)
    module = Cast(torch.float16, then_add=True)
    with pytest.raises(tg.NoPathError, match=r"add.*float16.*tolerance >= 9\.8e-04"):
        tg.from_torch(module, (x,), db=":memory:", tolerance=1e-5)
    got = tg.from_torch(module, (x,), db=":memory:")(x)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, module(x).numpy())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_precision_module_imports_and_runs_with_nothing_to_set(dtype):
    """``from_torch`` on a module in float16 or bfloat16 (numpy has no bfloat16: its weights
    and inputs cross as ml_dtypes arrays): planned at the dtype's own accuracy by default, and
    as close to the float64 reference as torch's own run in that dtype."""
    torch.manual_seed(0)
    tdt = getattr(torch, dtype)
    module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                 torch.nn.Linear(32, 8)).to(tdt)
    x = torch.randn(3, 16).to(tdt)
    prog = tg.from_torch(module, (x,), db=":memory:")
    got = np.asarray(prog(x)).astype(np.float64)
    with torch.no_grad():
        theirs = module(x).double().numpy()
        ref = module.double()(x.double()).numpy()
    ours_err, torch_err = (tg.numerics.relative_error(a, ref) for a in (got, theirs))
    assert ours_err <= max(2 * torch_err, 4 * (2.0 ** -10 if dtype == "float16" else 2.0 ** -7))
