"""C attention writing its result as (batch, seq, heads, dim): the ``c_*attention*_bshd``
kernels for ``permute(attention, (0, 2, 1, 3))``, so a transformer's reshape back to
(batch, seq, heads * dim) is a view and the program has no copy left (the native loop needs
none)."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import attention as c_attention
from tensor_graphs.kernels.c import build
from tensor_graphs.numerics import relative_error

pytestmark = pytest.mark.skipif(not build.available(),
                                reason=f"C backend unavailable: {build.unavailable_reason()}")



@pytest.fixture(scope="module")
def heads_last_kernels():
    return [k.name for k in registry.all() if k.name.endswith("_bshd")]


@pytest.fixture
def rng():
    return np.random.default_rng(99)


def test_eight_variants_verified(heads_last_kernels):
    assert len(set(heads_last_kernels)) == 8
    for name in heads_last_kernels:
        report = tg.kernels.verify(registry.get(name))
        assert report.ok, report


@pytest.mark.parametrize("flash", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", [None, "bool", "float"])
@pytest.mark.parametrize("shape", [(1, 12, 128, 64, 12), (2, 4, 33, 16, 2), (1, 3, 1, 8, 3)])
def test_heads_last_equals_the_permuted_result(flash, causal, mask, shape, rng):
    b, hq, s, d, hkv = shape
    q = rng.standard_normal((b, hq, s, d)).astype(np.float32)
    k, v = (rng.standard_normal((b, hkv, s, d)).astype(np.float32) for _ in range(2))
    m = None
    if mask == "bool":
        m = rng.random((1, 1, s, s)) < 0.7
        m[..., 0] = True
    elif mask == "float":
        m = rng.standard_normal((b, 1, s, s)).astype(np.float32)
    plain = c_attention.attention(q, k, v, m, causal, flash)
    out = np.full((b, s, hq, d), np.nan, np.float32)
    got = c_attention.attention(q, k, v, m, causal, flash, out=out, heads_last=True)
    assert got is out
    np.testing.assert_array_equal(got, plain.transpose(0, 2, 1, 3))  # the same arithmetic


def test_kernel_against_the_reference_from_strided_projections(rng):
    """GPT-2's layout: q, k, v are heads permuted out of one (1, S, 3 * H * D) projection."""
    qkv = rng.standard_normal((1, 128, 3 * 768)).astype(np.float32)
    q, k, v = (qkv[:, :, i * 768:(i + 1) * 768].reshape(1, 128, 12, 64).transpose(0, 2, 1, 3)
               for i in range(3))
    mask = np.tril(np.ones((128, 128), bool))[None, None]
    k_ = registry.get("c_attention_mask_bshd")
    got = k_.fn(q, k, v, mask)
    assert got.shape == (1, 128, 12, 64) and got.flags.c_contiguous
    leaves = [tg.input(n, a.shape, str(a.dtype)) for n, a in zip("qkvm", (q, k, v, mask))]
    y = tg.scaled_dot_product_attention(*leaves).permute(0, 2, 1, 3)
    ref = tg.evaluate(y, dict(zip("qkvm", (q, k, v, mask))), dtype="float64")
    assert relative_error(got, ref) <= 1e-6


def test_only_the_default_scale_matches():
    """The kernel sees the permute's attributes only, so an explicit scale is left to the
    plain kernels (followed by a copy for the reshape)."""
    q = tg.input("q", (1, 2, 8, 4))
    k = registry.get("c_attention_bshd")
    assert k.match(tg.scaled_dot_product_attention(q, q, q).permute(0, 2, 1, 3)) is not None
    assert k.match(tg.scaled_dot_product_attention(q, q, q, scale=0.5).permute(0, 2, 1, 3)) \
        is None
    assert k.match(tg.scaled_dot_product_attention(q, q, q).permute(0, 2, 3, 1)) is None
    assert k.match(tg.scaled_dot_product_attention(q, q, q, is_causal=True)
                   .permute(0, 2, 1, 3)) is None
    causal = registry.get("c_attention_causal_bshd")
    assert causal.match(tg.scaled_dot_product_attention(q, q, q, is_causal=True)
                        .permute(0, 2, 1, 3)) is not None


def test_transformer_attention_block_plans_without_a_copy(rng):
    """qkv projection -> heads -> attention -> heads back -> output projection: with the
    heads-last kernel the reshape back is a view and the whole program runs natively."""
    x = tg.input("x", (1, 16, 32))
    w_qkv = tg.weight("w_qkv", (32, 96))
    w_o = tg.weight("w_o", (32, 32))
    mask = tg.input("mask", (1, 1, 16, 16), "bool")
    qkv = x @ w_qkv

    def heads(i):
        return qkv[:, :, i * 32:(i + 1) * 32].reshape(1, 16, 4, 8).permute(0, 2, 1, 3)

    a = tg.scaled_dot_product_attention(heads(0), heads(1), heads(2), mask)
    y = a.permute(0, 2, 1, 3).reshape(1, 16, 32) @ w_o
    prog = tg.compile(y, db=":memory:", backends=("c", "numpy"))
    names = [s.kernel.name for s in prog.plan.steps]
    assert any(n.startswith("c_") and n.endswith("attention_mask_bshd") for n in names), names
    weights = {"w_qkv": rng.standard_normal((32, 96)).astype(np.float32),
               "w_o": rng.standard_normal((32, 32)).astype(np.float32)}
    prog.bind(**weights)
    m = np.tril(np.ones((16, 16), bool))[None, None]
    for _ in range(4):
        X = rng.standard_normal((1, 16, 32)).astype(np.float32)
        got = prog(x=X, mask=m)
        ref = tg.evaluate(y, {"x": X, "mask": m, **weights}, dtype="float64")
        assert relative_error(got, ref) <= 1e-5
    assert all(s.kernel.backend == "c" or s.kernel.view for s in prog.plan.steps), names
    assert prog.loop.startswith("native loop"), prog.loop
