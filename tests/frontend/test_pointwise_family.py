"""The pointwise families through tg.from_torch against torch in float32: rounding, integer
division with both sign rules, the special functions on tiny, huge and infinite arguments,
classification, and the bitwise operators on ints and bools (frontend/aten/pointwise_ops.py)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

from tensor_graphs.frontend import from_torch  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

TOL32 = 2e-6  # a few float32 ulps: these ops are within 2 ulps of the float64 value


class Fn(nn.Module):
    def __init__(self, fns):
        super().__init__()
        self.fns = fns

    def forward(self, *xs):
        return tuple(fn(*xs) for fn in self.fns)


def _compare(fns, *args, tol=TOL32):
    module = Fn(fns)
    got = from_torch(module, args)(*[a.numpy() for a in args])
    with torch.no_grad():
        ref = module(*args)
    assert len(got) == len(ref)
    for k, (g, r) in enumerate(zip(got, ref)):
        r = r.numpy()
        what = f"output {k}"
        assert g.shape == r.shape, (what, g.shape, r.shape)
        if r.dtype.kind != "f":
            assert g.dtype == r.dtype, (what, g.dtype, r.dtype)
            np.testing.assert_array_equal(g, r, err_msg=what)
            continue
        assert g.dtype == r.dtype, (what, g.dtype, r.dtype)
        assert np.array_equal(np.isnan(g), np.isnan(r)), (what, g, r)
        assert np.array_equal(np.isinf(g), np.isinf(r)), (what, g, r)
        assert np.array_equal(g[np.isinf(r)], r[np.isinf(r)]), what
        fin = np.isfinite(r)
        assert relative_error(g[fin], r[fin]) <= tol, (what, relative_error(g[fin], r[fin]))


def _values(*extra):
    torch.manual_seed(0)
    x = torch.randn(40) * 3
    x[: len(extra)] = torch.tensor(extra, dtype=torch.float32)
    return x


def test_rounding_and_division():
    x = _values(0.5, -0.5, 1.5, 2.5, -2.5, 3e9, -3e9 - 256, 1e20, float("inf"), float("nan"),
                -0.0, 0.49999997, 7.5, -7.5)
    y = _values(2.0, -2.0, 2.0, -2.0, 3.0, 7.0, -7.0, 3.0, 2.0, 1.0, 0.5, 1.0, 0.0, -0.0)
    unary = [torch.floor, torch.ceil, torch.round, torch.trunc, torch.frac, torch.fix]
    _compare([*[lambda a, b, f=f: f(a) for f in unary],
              lambda a, b: torch.round(a, decimals=2), lambda a, b: torch.round(a, decimals=-1),
              torch.fmod, torch.remainder, torch.floor_divide,
              lambda a, b: torch.div(a, b, rounding_mode="trunc"),
              lambda a, b: torch.div(a, b, rounding_mode="floor"),
              lambda a, b: a % 2.5, lambda a, b: torch.fmod(a, -1.5)], x, y)


def test_integer_division_follows_c_and_python():
    a = torch.tensor([7, -7, 7, -7, 0, 100, -100, 2 ** 40 + 1], dtype=torch.int64)
    b = torch.tensor([2, 2, -2, -2, 5, -3, 7, 3], dtype=torch.int64)
    _compare([torch.fmod, torch.remainder, torch.floor_divide,
              lambda p, q: torch.div(p, q, rounding_mode="trunc"),
              lambda p, q: torch.div(p, q, rounding_mode="floor"),
              lambda p, q: p // q, lambda p, q: p % q, lambda p, q: torch.div(p, q)], a, b)


def test_special_functions_at_tiny_and_huge_arguments():
    x = _values(1e-10, -1e-10, 1e-30, 88.5, -88.5, 20.5, 0.0, -0.0, float("inf"),
                float("-inf"), float("nan"), 1e30, 3.0)
    _compare([torch.log1p, torch.expm1, torch.exp2, torch.sinh, torch.cosh, torch.asinh,
              torch.atan, torch.erfc, torch.special.erfc, torch.tan,
              lambda v: torch.log2(v.abs()), lambda v: torch.log10(v.abs()),
              torch.isinf, torch.isfinite, torch.isnan, torch.isposinf, torch.isneginf,
              torch.nan_to_num, lambda v: torch.nan_to_num(v, nan=1.0, posinf=2.0, neginf=-2.0),
              torch.signbit, torch.sign, torch.angle,
              lambda v: torch.copysign(v.abs() + 1, v),
              lambda v: torch.fmax(v, v.flip(0)), lambda v: torch.fmin(v, -v.flip(0))], x)


def test_inverse_functions_near_their_ends():
    torch.manual_seed(1)
    u = torch.rand(40) * 2.4 - 1.2
    u[:8] = torch.tensor([1.0, -1.0, 1 - 1e-7, -1 + 1e-7, 1e-10, 0.0, float("nan"), 0.5])
    p = torch.rand(40)
    p[:5] = torch.tensor([0.0, 1.0, 1e-10, 1 - 1e-7, 0.5])
    _compare([lambda a, b: torch.asin(a), lambda a, b: torch.acos(a),
              lambda a, b: torch.atanh(a), lambda a, b: torch.acosh(1 + b * 1e3),
              lambda a, b: torch.logit(b), lambda a, b: torch.logit(b, eps=1e-6),
              lambda a, b: torch.xlogy(a, b), lambda a, b: torch.xlogy(torch.zeros_like(a), a),
              torch.atan2, torch.hypot, lambda a, b: torch.hypot(a * 1e30, b * 1e30)], u, p)


def test_bitwise_on_ints_and_bools():
    a = torch.tensor([5, -6, 127, -128, 0, 77, 3, -1], dtype=torch.int8)
    s = torch.tensor([1, 2, 7, 8, 9, 0, 3, 7], dtype=torch.int8)
    _compare([lambda p, q: p & q, lambda p, q: p | q, lambda p, q: p ^ q, lambda p, q: ~p,
              lambda p, q: p << q, lambda p, q: p >> q, lambda p, q: p & 12,
              lambda p, q: torch.bitwise_xor(p, 3), lambda p, q: torch.bitwise_left_shift(p, 2),
              lambda p, q: (p > 0) & (q > 2), lambda p, q: (p > 0) | (q > 2),
              lambda p, q: (p > 0) ^ (q > 2), lambda p, q: ~(p > 0),
              lambda p, q: torch.logical_xor(p, q)], a, s)
    x = torch.tensor([2 ** 40 + 3, -(2 ** 50), 12345678901, -1], dtype=torch.int64)
    y = torch.tensor([2 ** 35 - 1, 255, -2, 63], dtype=torch.int64)
    _compare([lambda p, q: p & q, lambda p, q: p | q, lambda p, q: p ^ q, lambda p, q: ~p,
              lambda p, q: p >> 3, lambda p, q: p << 3], x, y)


# torch functions whose gradient at a bound or a zero the import writes to torch's value:
# hardtanh's family passes nothing at its bounds (clamp's passes g), hardswish is x/3 + 1/2
# at -3 and 1 at 3, and a 2-norm (F.normalize of a padding row) gives 0 at 0, not nan
GRADIENT_CASES = {
    "hardtanh": lambda v: torch.nn.functional.hardtanh(v),
    "relu6": lambda v: torch.nn.functional.relu6(v),
    "hardsigmoid": lambda v: torch.nn.functional.hardsigmoid(v),
    "hardswish": lambda v: torch.nn.functional.hardswish(v),
    "normalize": lambda v: torch.nn.functional.normalize(v.reshape(3, 4), dim=1).reshape(12),
    "norm3": lambda v: torch.linalg.vector_norm(v.reshape(3, 4), 3, dim=1),
}


@pytest.mark.parametrize("name", sorted(GRADIENT_CASES))
def test_imported_gradients_at_bounds_and_zeros_are_torchs(name):
    import tensor_graphs as tg
    from tensor_graphs.frontend.torch_export import import_exported

    xs = np.array([0.0, 0.0, 0.0, 0.0, -3.0, -1.0, 1.0, 3.0, 6.0, -0.5, 0.5, 7.0])
    fn = GRADIENT_CASES[name]
    t = torch.tensor(xs, requires_grad=True)
    out = fn(t)
    g = np.linspace(0.5, 1.5, out.numel()).reshape(tuple(out.shape))
    (ref,) = torch.autograd.grad(out, [t], grad_outputs=torch.tensor(g))
    (y,), (x,), _, _ = import_exported(torch.export.export(Fn([fn]), (t.detach(),)))
    (gx,) = tg.grad(y, [x], seed=tg.input("g", g.shape, "float64"))
    got = tg.evaluate(gx, {x.name: xs, "g": g})
    assert not np.isnan(got).any(), got
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-6, atol=1e-12)  # torch: 1/6 in f32


@pytest.mark.parametrize("which", ["max", "min"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_and_min_over_a_dim_give_the_gradient_to_the_index_torch_returns(which, keepdim):
    """torch.max(x, dim)'s values take the gradient at the one index it returns (the first
    of a tie); ours shared a tie evenly, as amax does."""
    import tensor_graphs as tg
    from tensor_graphs.frontend.torch_export import import_exported

    xs = np.array([[1.0, 1.0, 0.0], [2.0, 3.0, 3.0], [0.0, 0.0, 0.0], [np.nan, 5.0, np.nan]])
    fn = (lambda v: getattr(torch, which)(v, dim=1, keepdim=keepdim))
    t = torch.tensor(xs, requires_grad=True)
    values, index = fn(t)
    g = np.linspace(0.5, 1.5, values.numel()).reshape(tuple(values.shape))
    (ref,) = torch.autograd.grad(values, [t], grad_outputs=torch.tensor(g))
    (y, i), (x,), _, _ = import_exported(torch.export.export(
        Fn([lambda v: fn(v).values, lambda v: fn(v).indices]), (t.detach(),)))
    (gx,) = tg.grad(y, [x], seed=tg.input("g", g.shape, "float64"))
    got_values, got_index, got = tg.evaluate([y, i, gx], {x.name: xs, "g": g})
    np.testing.assert_array_equal(got_index, index.numpy())
    np.testing.assert_array_equal(got_values, values.detach().numpy())
    np.testing.assert_array_equal(got, ref.numpy())
