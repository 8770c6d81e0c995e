"""C attention with few query rows (decoding against a KV cache): K and V read in place from
the cache's active prefix (strided along its length), no packing. Against the float64
reference: grouped-query heads, causal, bool and float masks, heads-last output, NaN and
fully masked rows."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.kernels.c import attention as c_attention
from tensor_graphs.kernels.c import build
from tensor_graphs.numerics import relative_error

pytestmark = pytest.mark.skipif(not build.available(),
                                reason=f"C backend unavailable: {build.unavailable_reason()}")


def _reference(q, k, v, mask=None, causal=False):
    arrays = [q, k, v] + ([] if mask is None else [mask])
    leaves = [tg.input(n, a.shape, str(a.dtype)) for n, a in zip("qkvm", arrays)]
    y = tg.scaled_dot_product_attention(*leaves, is_causal=causal)
    return tg.evaluate(y, dict(zip("qkvm", arrays)), dtype="float64")


def _cache(rng, b, h, length, d, capacity=300):
    """The active prefix of a (b, h, capacity, d) cache: strided along its length axis."""
    full = rng.standard_normal((b, h, capacity, d)).astype(np.float32)
    return full[:, :, :length]


@pytest.mark.parametrize("sq", [1, 2, 4])
@pytest.mark.parametrize("mask", [None, "bool", "float"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_last", [False, True])
@pytest.mark.parametrize("flash", [False, True])
def test_few_rows_against_a_kv_cache(sq, mask, causal, heads_last, flash):
    rng = np.random.default_rng(sq)
    b, hq, hkv, d, sk = 2, 6, 2, 64, 137
    q = rng.standard_normal((b, hq, sq, d)).astype(np.float32)
    k, v = _cache(rng, b, hkv, sk, d), _cache(rng, b, hkv, sk, d)
    m = None
    if mask == "bool":
        m = rng.random((b, 1, sq, sk)) < 0.8
        m[..., 0] = True
    elif mask == "float":
        m = rng.standard_normal((1, hq, sq, sk)).astype(np.float32)
    got = c_attention.attention(q, k, v, m, causal, flash, heads_last=heads_last)
    want = _reference(q, k, v, m, causal)
    if heads_last:
        want = want.transpose(0, 2, 1, 3)
    assert got.shape == want.shape
    assert relative_error(got, want) < 1e-6


def test_fully_masked_row_gives_zero_and_nan_propagates():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 1, 16)).astype(np.float32)
    k = rng.standard_normal((1, 2, 9, 16)).astype(np.float32)
    v = rng.standard_normal((1, 2, 9, 16)).astype(np.float32)
    m = np.ones((1, 2, 1, 9), bool)
    m[0, 1] = False  # head 1 sees nothing: 0, as the reference's safe softmax
    got = c_attention.attention(q, k, v, m)
    np.testing.assert_array_equal(got[0, 1], 0.0)
    np.testing.assert_allclose(got[0, 0], _reference(q, k, v, m)[0, 0], rtol=1e-5, atol=1e-6)
    k[0, 0, 3, 5] = np.nan
    got = c_attention.attention(q, k, v, m)
    assert np.isnan(got[0, 0]).all() and not np.isnan(got[0, 1]).any()


@pytest.mark.parametrize(("hq", "hkv", "sq", "sk", "d", "dv"), [
    (7, 7, 1, 301, 64, 64),  # rows a thread takes in threes leave a remainder of one
    (5, 1, 2, 3, 12, 20),  # fewer than four keys; dims that are not vector multiples
    (3, 3, 1, 70, 12, 20),  # four keys at a time with dims that are not vector multiples
    (4, 2, 3, 6, 8, 24),  # causal rows whose key limits differ within a group of three
    (9, 3, 1, 130, 40, 8),
])
@pytest.mark.parametrize("causal", [False, True])
def test_few_rows_in_groups_of_rows(hq, hkv, sq, sk, d, dv, causal):
    """attention_few_rows takes a thread's rows three at a time, their keys in turn: every
    remainder of rows, keys and dims against the reference."""
    rng = np.random.default_rng(hq * sk + d)
    q = rng.standard_normal((1, hq, sq, d)).astype(np.float32)
    k = _cache(rng, 1, hkv, sk, d, capacity=sk + 5)
    v = _cache(rng, 1, hkv, sk, dv, capacity=sk + 5)
    m = rng.random((1, hq, sq, sk)) < 0.7
    m[..., 0] = True
    for mask in (None, m):
        got = c_attention.attention(q, k, v, mask, causal)
        assert relative_error(got, _reference(q, k, v, mask, causal)) < 1e-6
