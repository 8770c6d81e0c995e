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


def test_a_nan_score_under_a_false_of_a_bool_mask_is_masked_out():
    """The reference applies a bool mask with where(mask, s, -inf): a NaN score under a False
    is -inf like any other there, so the rows stay finite (a float mask adds: NaN + x is NaN,
    and every row is NaN). Every path: plain, flash, few query rows."""
    rng = np.random.default_rng(7)
    q, k, v = (np.ascontiguousarray(x) for x in _heads(rng, 1, 48, 1, 32))
    k[0, 0, 40, 0] = np.nan
    mask = np.ones((1, 1, 48, 48), bool)
    mask[..., 40] = False
    float_mask = np.where(mask, 0.0, -1e4).astype(np.float32)
    for rows in (48, 1):
        qr = np.ascontiguousarray(q[:, :, :rows])
        for flash in (False, True):
            got = c_attention.attention(qr, k, v, mask[..., :rows, :], False, flash)
            assert np.isfinite(got).all()
            assert relative_error(got, _reference(qr, k, v, mask[..., :rows, :])) <= 1e-6
            got = c_attention.attention(qr, k, v, float_mask[..., :rows, :], False, flash)
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


def _tails(rng, b, h, sq, sk):
    """Bool masks whose rows end in runs of False of every kind: causal (tril, and tril over
    a longer cache), right padding per sentence, rows with nothing to attend to, a row whose
    limit is below the rows before it, and True keys after False ones."""
    causal = np.tril(np.ones((sq, sk), bool), sk - sq)
    per_head = rng.random((b, h, sq, sk)) < 0.7
    for i in range(sq):
        per_head[:, :, i, rng.integers(1, sk + 1):] = False
    per_head[0, 0, 5] = False  # nothing to attend to
    per_head[-1, -1, 7, : sk // 2] = True
    per_head[-1, -1, 7, sk // 2:] = False
    keep = np.ones((b, 1, 1, sk), bool)
    keep[-1, ..., sk - 9:] = False
    return {"causal": causal, "causal and padding": causal & keep, "per head": per_head,
            "padding": keep}


@pytest.mark.parametrize("sizes", [(1, 12, 128, 128), (3, 4, 77, 77), (2, 2, 40, 100)])
def test_bool_masks_ending_in_false_keys_skip_them(sizes):
    """The plain kernel skips the keys past a row's last True (mask_limits): GPT-2's causal
    mask as a bool tensor then costs what is_causal does. Every kind of tail, against the
    reference, on one and two threads."""
    b, h, sq, sk = sizes
    rng = np.random.default_rng(10)
    q = rng.standard_normal((b, h, sq, 64)).astype(np.float32)
    k, v = (rng.standard_normal((b, h, sk, 64)).astype(np.float32) for _ in range(2))
    before = threads.get_num_threads()
    try:
        for name, mask in _tails(rng, b, h, sq, sk).items():
            ref = _reference(q, k, v, mask)
            for n in (1, 2):
                threads.set_num_threads(n)
                got = c_attention.attention(q, k, v, mask, False, False)
                assert relative_error(got, ref) <= 1e-6, (name, n)
    finally:
        threads.set_num_threads(before)


def test_skipped_keys_keep_the_references_non_finite_semantics():
    """A NaN in a skipped key's K changes nothing (the reference's where() gives -inf there
    whatever the score); an inf in a skipped key's V makes its column NaN (0 x inf), so a V
    with any non-finite value among the skipped keys is not skipped."""
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((1, 2, 48, 32)).astype(np.float32) for _ in range(3))
    mask = np.tril(np.ones((48, 48), bool))
    k_nan = k.copy()
    k_nan[0, 1, 45, 3] = np.nan
    got = c_attention.attention(q, k_nan, v, mask, False, False)
    ref = _reference(q, k_nan, v, mask)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))  # rows 45-47 see it
    assert np.isfinite(got[0, 1, :45]).all() and np.isfinite(got[0, 0]).all()
    assert relative_error(got[0, :, :45], ref[0, :, :45]) <= 1e-6
    v_inf = v.copy()
    v_inf[0, 1, 45, 3] = np.inf
    got = c_attention.attention(q, k, v_inf, mask, False, False)
    ref = _reference(q, k, v_inf, mask)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    assert np.isnan(got[0, 1, :45, 3]).all() and np.isinf(got[0, 1, 45:, 3]).all()
    assert np.isfinite(got[0, 0]).all()
