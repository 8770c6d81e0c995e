"""C attention on BERT/MiniLM's shape: head dim 32, heads permuted out of a projection, a
padding mask of (batch, 1, seq, seq) as bool or as HF's additive float mask (0 / finfo.min).
With AVX-512 the plain kernel adds the mask and takes the row max on the score tiles in
registers, and its exp is exp_row (attention.c); these pin that path to the float64
reference."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs import threads
from tensor_graphs.kernels.c import attention as c_attention
from tensor_graphs.kernels.c import build
from tensor_graphs.numerics import relative_error

pytestmark = pytest.mark.skipif(not build.available(),
                                reason=f"C backend unavailable: {build.unavailable_reason()}")


def _reference(q, k, v, mask, causal=False):
    leaves = [tg.input(n, a.shape, str(a.dtype)) for n, a in zip("qkvm", (q, k, v, mask))]
    y = tg.scaled_dot_product_attention(*leaves, is_causal=causal)
    return tg.evaluate(y, dict(zip("qkvm", (q, k, v, mask))), dtype="float64")


def _heads(rng, b, s, h, d):
    """q, k, v as (b, h, s, d) views of one (b, s, 3 * h * d) projection (strided rows)."""
    qkv = rng.standard_normal((b, s, 3 * h * d)).astype(np.float32)
    return [qkv[:, :, i * h * d:(i + 1) * h * d].reshape(b, s, h, d).transpose(0, 2, 1, 3)
            for i in range(3)]


@pytest.mark.parametrize("flash", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq", [128, 77])
def test_padding_masks_bool_and_additive(seq, causal, flash):
    rng = np.random.default_rng(5)
    b, h, d = 3, 4, 32
    q, k, v = _heads(rng, b, seq, h, d)
    keep = np.ones((b, seq), bool)
    keep[1, seq - 20:] = False  # padded keys of the second sentence
    keep[2, 9:] = False
    bool_mask = np.broadcast_to(keep[:, None, None, :], (b, 1, seq, seq)).copy()
    float_mask = np.where(bool_mask, 0.0, np.finfo(np.float32).min).astype(np.float32)
    for mask in (bool_mask, float_mask):
        got = c_attention.attention(q, k, v, mask, causal, flash)
        assert relative_error(got, _reference(q, k, v, mask, causal)) <= 1e-6
        assert np.isfinite(got).all()


def test_additive_mask_row_of_finfo_min_is_uniform_and_bool_row_is_zero():
    """A query row whose keys are all masked: HF's finfo.min mask gives the scores' softmax
    over all keys (equal shifts), a bool mask gives 0 (the reference's safe softmax)."""
    rng = np.random.default_rng(6)
    q, k, v = _heads(rng, 1, 40, 2, 32)
    bool_mask = np.ones((1, 1, 40, 40), bool)
    bool_mask[..., 3, :] = False
    float_mask = np.where(bool_mask, 0.0, np.finfo(np.float32).min).astype(np.float32)
    for flash in (False, True):
        got = c_attention.attention(q, k, v, float_mask, False, flash)
        assert relative_error(got, _reference(q, k, v, float_mask)) <= 1e-6
        got = c_attention.attention(q, k, v, bool_mask, False, flash)
        np.testing.assert_array_equal(got[:, :, 3], 0.0)
        assert relative_error(got, _reference(q, k, v, bool_mask)) <= 1e-6


def test_nan_in_a_masked_out_key_still_propagates():
    """NaN + (-inf) is NaN in the reference: a NaN score under a False of a bool mask makes
    its row NaN, as for a float mask."""
    rng = np.random.default_rng(7)
    q, k, v = (np.ascontiguousarray(x) for x in _heads(rng, 1, 48, 1, 32))
    k[0, 0, 40, 0] = np.nan
    mask = np.ones((1, 1, 48, 48), bool)
    mask[..., 40] = False
    for flash in (False, True):
        got = c_attention.attention(q, k, v, mask, False, flash)
        assert np.isnan(got).all()


@pytest.mark.parametrize("causal", [False, True])
def test_value_rows_read_in_place_across_key_blocks(causal):
    """With AVX-512 and a value dim that is a multiple of 32, P @ V reads V's rows where they
    are (strided here, GQA) instead of a packed copy; flash's key blocks start mid-V."""
    rng = np.random.default_rng(8)
    q = _heads(rng, 2, 100, 4, 32)[0]
    k, v = _heads(rng, 2, 100, 2, 64)[1:]
    k = np.ascontiguousarray(k[..., :32])
    mask = rng.random((2, 1, 100, 100)) < 0.8
    mask[..., 0] = True
    ref = _reference(q, k, v, mask, causal)
    for flash, block in ((False, 0), (True, 48), (True, 256)):
        got = c_attention.attention(q, k, v, mask, causal, flash, block=block or 256)
        assert relative_error(got, ref) <= 1e-6


@pytest.mark.parametrize("flash", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", [None, "bool", "float"])
@pytest.mark.parametrize("shape", [(8, 12, 12, 128, 32, 32), (4, 8, 4, 77, 32, 48),
                                   (2, 16, 8, 70, 16, 8)])
def test_a_task_per_kv_head(shape, mask, causal, flash):
    """With at least 8 kv heads per thread (MiniLM's 8 x 12), a task is one kv head: its q
    heads and query blocks, K (and V unless read in place) packed into the thread's own
    buffer. GQA, a value dim packed (48, 8) or read in place (32), heads-last output."""
    b, hq, hkv, s, d, dv = shape
    rng = np.random.default_rng(9)
    q = _heads(rng, b, s, hq, d)[0]
    k = _heads(rng, b, s, hkv, d)[1]
    v = _heads(rng, b, s, hkv, dv)[2]
    m = None
    if mask == "bool":
        m = rng.random((b, 1, s, s)) < 0.8
        m[..., 0] = True
    elif mask == "float":
        m = rng.standard_normal((b, 1, s, s)).astype(np.float32)
    before = threads.get_num_threads()
    try:
        for n in (1, 2):
            threads.set_num_threads(n)
            out = np.full((b, s, hq, dv), np.nan, np.float32)
            got = c_attention.attention(q, k, v, m, causal, flash, out=out, heads_last=True)
            ref = _reference(q, k, v, m, causal) if m is not None else _reference_nomask(
                q, k, v, causal)
            assert relative_error(got, ref.transpose(0, 2, 1, 3)) <= 1e-6
    finally:
        threads.set_num_threads(before)


def _reference_nomask(q, k, v, causal):
    leaves = [tg.input(n, a.shape, str(a.dtype)) for n, a in zip("qkv", (q, k, v))]
    y = tg.scaled_dot_product_attention(*leaves, is_causal=causal)
    return tg.evaluate(y, dict(zip("qkv", (q, k, v))), dtype="float64")
