"""torch's conventions the importer mirrors, one regression test each: what torch accepts
and a user's model relies on, imported and compared with torch."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.frontend import UnsupportedOpError, from_torch  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

TOL = 1e-5


def _check(module, *args, dynamic_shapes=None):
    prog = from_torch(module, args, dynamic_shapes)
    got = prog(*args)
    with torch.no_grad():
        ref = module(*args)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    gots = got if isinstance(got, (tuple, list)) else (got,)
    assert len(gots) == len(refs)
    for g, r in zip(gots, refs):
        assert np.asarray(g).shape == tuple(r.shape)
        assert np.asarray(g).dtype == r.numpy().dtype
        assert relative_error(g, r.numpy()) <= TOL
    return prog


class ScalarDims(nn.Module):
    """A 0-d tensor takes dim 0 and -1 as if it had one axis."""

    def forward(self, x):
        values, where = torch.max(x, dim=0)
        return (x.sum(0), x.sum(-1, keepdim=True), x.mean([0]), x.softmax(-1),
                x.log_softmax(0), x.cumsum(0), values, where, x.argmax(-1), x.amax(0),
                torch.logsumexp(x, 0), x.var(0, correction=0), x.prod(0))


def test_0d_tensors_accept_dim_0_and_minus_1():
    _check(ScalarDims(), torch.tensor(1.5))


class ClampTensors(nn.Module):
    def forward(self, x, lo, hi):
        return (torch.clamp(x, min=lo, max=hi), torch.clamp(x, min=lo),
                torch.clamp_max(x, hi[0]), x.clamp(max=hi))


def test_clamp_with_tensor_bounds():
    torch.manual_seed(0)
    x, lo, hi = torch.randn(4, 5), torch.randn(5) - 0.5, torch.randn(4, 1) + 0.5
    _check(ClampTensors(), x, lo, hi)


class Gather0d(nn.Module):
    def forward(self, x, i):
        return torch.gather(x, 0, i), torch.gather(x, -1, i) * 2


def test_gather_on_0d():
    _check(Gather0d(), torch.tensor(3.25), torch.tensor(0))


class ScalarTensor(nn.Module):
    def forward(self, x):
        return x * torch.scalar_tensor(2.5) + torch.scalar_tensor(1, dtype=torch.float64)


def test_scalar_tensor():
    _check(ScalarTensor(), torch.randn(3))


class SizeArithmetic(nn.Module):
    """Python arithmetic on a dynamic size: torch.export records it as operator, math and
    sym_* calls, not ATen ops."""

    def forward(self, x):
        n = x.shape[0]
        return (x.new_ones(n % 3 + 2), x.new_ones(-(-n // 4) + 1), x.new_ones(torch.sym_max(n, 6)),
                x.new_ones(torch.sym_min(n, 6) + 2), x.new_ones(math.ceil(n / 3) + 1))


def test_size_arithmetic_is_mapped():
    batch = torch.export.Dim("batch", min=2, max=32)
    prog = _check(SizeArithmetic(), torch.randn(10, 3), dynamic_shapes=({0: batch},))
    for n in (3, 7, 17):  # one plan for every length
        y = torch.randn(n, 3)
        for g, r in zip(prog(y), SizeArithmetic()(y)):
            np.testing.assert_array_equal(g, r.numpy())


class UnmappedSizeFunction(nn.Module):
    def forward(self, x):
        return x.new_ones((x.shape[0] & 7) + 2)


def test_unmapped_size_arithmetic_is_refused_as_size_arithmetic():
    batch = torch.export.Dim("batch", min=2, max=32)
    with pytest.raises(UnsupportedOpError) as info:
        from_torch(UnmappedSizeFunction(), (torch.randn(6),), ({0: batch},))
    message = str(info.value)
    assert "arithmetic on symbolic sizes" in message and "and_" in message
    assert "ATen" not in message and "no tensor_graphs equivalent" not in message
    assert "test_conventions.py" in message  # the source line


class Unread(nn.Module):
    """``y`` is used for its (static) shape only, ``z`` not at all."""

    def forward(self, x, y, z):
        return x * 2 + x.new_zeros(y.shape)


def test_an_argument_the_graph_never_reads_is_accepted():
    x, y, z = torch.randn(2, 3), torch.randn(2, 3), torch.randn(5)
    prog = _check(Unread(), x, y, z)
    np.testing.assert_allclose(prog(x, torch.zeros(2, 3), torch.ones(5)), (x * 2).numpy())
    with pytest.raises(tg.ShapeError, match="'z'"):  # still checked like the others
        prog(x, y, torch.ones(4))


class SizeOnly(nn.Module):
    """``y`` is read only for its dynamic length, used as a number."""

    def forward(self, x, y):
        return x * y.shape[0] + x.new_ones(y.shape[0] + 1).sum()


def test_an_argument_read_only_for_its_symbolic_size():
    n = torch.export.Dim("n", min=2, max=32)
    x = torch.randn(3)
    prog = from_torch(SizeOnly(), (x, torch.randn(5)), ({}, {0: n}))
    for length in (2, 5, 11):  # the dim is bound from y at each call
        y = torch.randn(length)
        np.testing.assert_allclose(prog(x, y), SizeOnly()(x, y).numpy(), rtol=1e-6)
