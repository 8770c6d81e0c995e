"""The ops issue 21's OpInfo measure found refused, imported as users write them: max pooling
with return_indices (1-d and 2-d) and max_unpool, adaptive max pooling, F.unfold (im2col, an
empty batch included), bicubic interpolation, diagonal_scatter, lgamma/digamma/erfinv,
nextafter, and torch's empty-tensor conventions of gather, batch_norm and var. Each is
compared with torch: indices exactly (ties and nan take torch's kernels' rule), values by the
one error measure."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402,N812

from tensor_graphs.frontend import from_torch  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

TOL = 1e-6


def _check(module, *args):
    got = from_torch(module, args)(*args)
    with torch.no_grad():
        ref = module(*args)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    gots = got if isinstance(got, (tuple, list)) else (got,)
    assert len(gots) == len(refs)
    for g, r in zip(gots, refs):
        g, r = np.asarray(g), r.numpy()
        assert g.shape == r.shape and g.dtype == r.dtype, (g.shape, g.dtype, r.shape, r.dtype)
        if r.dtype.kind != "f":
            np.testing.assert_array_equal(g, r)
            continue
        assert np.array_equal(np.isnan(g), np.isnan(r)) and np.array_equal(
            g[np.isinf(r)], r[np.isinf(r)])
        finite = np.isfinite(r)
        assert relative_error(g[finite], r[finite]) <= TOL


def _ties(*shape, seed=0):
    """Small integers (ties in most windows), a nan and a -inf: where torch's index rule
    shows (the first maximum, the last nan)."""
    x = torch.from_numpy(np.random.default_rng(seed).integers(-2, 3, shape).astype(np.float32))
    x.view(-1)[3] = float("nan")
    x.view(-1)[-2] = float("-inf")
    return x


class Pool(nn.Module):
    def __init__(self, fn, **kw):
        super().__init__()
        self.fn, self.kw = fn, kw

    def forward(self, x):
        return self.fn(x, return_indices=True, **self.kw)


@pytest.mark.parametrize("kw", [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), ceil_mode=True),
])
def test_max_pool2d_with_indices(kw):
    _check(Pool(F.max_pool2d, **kw), _ties(2, 3, 7, 8))
    _check(Pool(F.max_pool2d, **kw), _ties(3, 7, 8, seed=1))  # unbatched


def test_max_pool1d_with_indices():
    _check(Pool(F.max_pool1d, kernel_size=3, stride=2, padding=1, ceil_mode=True),
           _ties(2, 3, 11))


@pytest.mark.parametrize("size", [(3, 4), 1, (None, 5), (9, 2)])
def test_adaptive_max_pool2d(size):
    _check(Pool(F.adaptive_max_pool2d, output_size=size), _ties(2, 3, 7, 8))


def test_adaptive_max_pool1d():
    _check(Pool(F.adaptive_max_pool1d, output_size=4), _ties(2, 3, 11))
    _check(Pool(F.adaptive_max_pool1d, output_size=4), _ties(3, 11))


class PoolUnpool(nn.Module):
    """SegNet's decoder: the encoder's pooling indices place the values back."""

    def forward(self, x):
        y, where = F.max_pool2d(x, 3, stride=2, padding=1, return_indices=True)
        z, at = F.max_pool1d(x.flatten(2), 2, return_indices=True)
        return (F.max_unpool2d(y, where, 3, stride=2, padding=1, output_size=x.shape[-2:]),
                F.max_unpool1d(z, at, 2))


def test_max_unpool_places_pooled_values_back():
    _check(PoolUnpool(), torch.randn(2, 3, 7, 8))


class Unfold(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, x):
        return F.unfold(x, **self.kw)


@pytest.mark.parametrize("shape", [(2, 3, 7, 9), (0, 1, 5, 5), (3, 6, 7)])
def test_unfold(shape):
    x = torch.randn(*shape)
    _check(Unfold(kernel_size=(2, 3), dilation=(2, 1), padding=1, stride=(1, 2)), x)


class Bicubic(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, x):
        return F.interpolate(x, mode="bicubic", **self.kw)


@pytest.mark.parametrize("kw", [dict(size=(5, 9)), dict(scale_factor=1.7),
                                dict(size=(3, 4), align_corners=True)])
def test_bicubic(kw):
    _check(Bicubic(**kw), torch.randn(2, 3, 6, 7))


class DiagonalScatter(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, x, src):
        return torch.diagonal_scatter(x, src, **self.kw)


@pytest.mark.parametrize("shape,kw", [
    ((4, 5), {}),
    ((4, 5), dict(offset=2)),
    ((4, 5), dict(offset=-3)),
    ((2, 3, 4), dict(offset=1, dim1=2, dim2=0)),
    ((3, 2), dict(offset=5)),  # an empty diagonal: nothing written
])
def test_diagonal_scatter(shape, kw):
    x = torch.randn(*shape)
    src = torch.randn_like(torch.diagonal(x, **kw))
    _check(DiagonalScatter(**kw), x, src)


class Special(nn.Module):
    def forward(self, x, p):
        return torch.lgamma(x), torch.digamma(x), torch.erfinv(p), torch.special.gammaln(x)


def test_lgamma_digamma_erfinv():
    x = torch.tensor([-2.5, -1.0, -0.0, 0.0, 1e-30, -1e-30, 0.5, 1.0, 1.4616, 2.0, 7.3, 1e30,
                      float("inf"), float("-inf"), float("nan")])
    p = torch.tensor([-1.0, -0.999, -0.3, -0.0, 0.0, 1e-20, 0.5, 0.99999994, 1.0, 1.5,
                      float("nan"), 0.9, -0.7, 0.1, 0.2])
    _check(Special(), x, p)


class NextAfter(nn.Module):
    def forward(self, a, b):
        return torch.nextafter(a, b)


def test_nextafter_float32():
    """float32's next value, bit for bit: the spacing halves below a power of two, subnormals
    and zeros, the largest finite from inf."""
    tiny = float(np.finfo(np.float32).tiny)
    a = torch.tensor([0.0, -0.0, 1.0, -4.0, 2.5, tiny, 1e-45, 3.4028235e38, float("inf"),
                      float("nan"), 7.0, -1.5])
    b = torch.tensor([-1.0, 0.0, 0.0, 0.0, 3.0, 0.0, -1.0, float("inf"), 0.0, 1.0, 7.0,
                      float("-inf")])
    got = from_torch(NextAfter(), (a, b))(a, b)
    ref = torch.nextafter(a, b).numpy()
    np.testing.assert_array_equal(np.asarray(got).view(np.int32), ref.view(np.int32))


class EmptyConventions(nn.Module):
    def forward(self, x, index, empty, rows):
        return (torch.gather(x, 0, index),
                F.batch_norm(empty, torch.zeros(0), torch.ones(0), training=False),
                torch.std(rows, dim=0), torch.var(x[:1], correction=2))


def test_empty_gather_index_empty_batch_norm_and_var_of_too_few():
    """torch skips gather's rank check for an empty index, returns an empty batch_norm input
    as it is, and divides a variance by max(0, n - correction): nan, not -0, over an empty
    axis or one element with correction 2."""
    _check(EmptyConventions(), torch.randn(5), torch.zeros(2, 0, dtype=torch.long),
           torch.zeros(0), torch.zeros(0, 3))
