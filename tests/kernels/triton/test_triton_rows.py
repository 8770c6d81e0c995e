"""The Triton row renderer: rowgen's regions (softmax, log-softmax, norms with their residual
adds) as one program per row, persistent or looped, checked against the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.graph import use_counts
from tensor_graphs.kernels.triton import generate
from tensor_graphs.kernels.triton.build import Config
from tests.kernels.triton.common import DTYPES, agrees, atomic_root, run, within

PERSISTENT = Config(1024, 2, 2048)  # rows up to 2048 in one block
LOOPED = Config(16, 2, 8)  # rows longer than 8 in blocks of 16: the looped kernel


def found(y, expand):
    return generate.row_region(atomic_root(y, expand), use_counts([y]), expand)


def kernel(y, expand, config, verify=True):
    got = found(y, expand)
    assert got is not None, "no row region"
    _covers, region, _top, rendered = got
    return generate.build_rows(region, rendered, config, verify=verify), region


def softmax(dt, d=33):
    return tg.softmax(tg.input("x", (3, d), dt), axis=-1)


def log_softmax(dt, d=33):
    return tg.log_softmax(tg.input("x", (3, d), dt))


def layer_norm_residual(dt, d=33):
    x, r = tg.input("x", (2, 3, d), dt), tg.input("r", (2, 3, d), dt)
    w, b = tg.input("w", (d,), dt), tg.input("b", (d,), dt)
    return tg.layer_norm(x + r, w, b)


def rms_norm_residual(dt, d=33):
    x, r = tg.input("x", (3, d), dt), tg.input("r", (3, d), dt)
    return tg.rms_norm(x + r, tg.input("w", (d,), dt))


def scale_norm(dt, d=33):  # x * g / ||x||: one sum and a per-row input
    x, g = tg.input("x", (3, d), dt), tg.input("g", (3, 1), dt)
    return x * g / tg.sqrt(tg.sum(x * x, axis=-1, keepdims=True) + 1e-5)


GALLERY = {"softmax": softmax, "log_softmax": log_softmax,
           "layer_norm_residual": layer_norm_residual, "rms_norm_residual": rms_norm_residual,
           "scale_norm": scale_norm}


def fresh(region, rng):
    return {n.name: (rng.standard_normal(tuple(n.shape)) * 2).astype(n.dtype.np_dtype)
            for n in region.inputs}


@pytest.mark.parametrize("config", [PERSISTENT, LOOPED], ids=["persistent", "looped"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(GALLERY))
def test_gallery_rows_pass_their_checks(name, dtype, config, expand):
    """Building checks the kernel on rows of 1, 7, 33 and 1025 elements (strided every other
    trial) and runs tg.kernels.verify(strict=True) (large and masked logits, rows far from
    zero, broadcast and transposed inputs); fresh inputs then agree with float64."""
    y = GALLERY[name](dtype)
    k, region = kernel(y, expand, config)
    assert (k.backend, k.device, k.writes_out) == ("triton", "cuda", True)
    feeds = fresh(region, np.random.default_rng(5))
    got = run(k, *[feeds[n.name] for n in region.inputs])
    ref = tg.evaluate(y, feeds, dtype="float64")
    within(k, got, ref, dtype)


@pytest.mark.parametrize("config", [PERSISTENT, LOOPED], ids=["persistent", "looped"])
def test_float64_rows_sum_in_float64(config, expand):
    y = layer_norm_residual("float64")
    k, region = kernel(y, expand, config)
    assert k.tolerance <= 1e-12
    feeds = fresh(region, np.random.default_rng(6))
    feeds["x"] = feeds["x"] + 1e4  # far from zero: float32 sums would lose the variance
    got = run(k, *[feeds[n.name] for n in region.inputs])
    ref = tg.evaluate(y, feeds, dtype="float64")
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-12


@pytest.mark.parametrize("config", [PERSISTENT, LOOPED], ids=["persistent", "looped"])
def test_max_propagates_nan_and_masked_logits_give_zeros(config, expand):
    y = softmax("float32", d=21)
    k, _ = kernel(y, expand, config, verify=False)
    x = np.random.default_rng(7).standard_normal((3, 21)).astype(np.float32)
    x[0, 5] = np.nan  # a NaN anywhere in a row makes the whole row NaN
    x[1, :20] = -np.inf  # one live logit: probability 1
    x[2, 3] = 80.0  # large: exp would overflow without the max subtracted
    got = run(k, x)
    assert np.isnan(got[0]).all()
    np.testing.assert_array_equal(got[1], np.eye(21, dtype=np.float32)[20])
    agrees(got[2], tg.evaluate(y, {"x": x}, dtype="float64")[2])


@pytest.mark.parametrize("d", [1, 2, 17, 64])
def test_rows_of_one_and_odd_lengths_through_both_kernels(d, expand):
    """One kernel serves every row length (the softmax has no constant of its width; the
    norm's 1/D is the graph's own): both launches give the reference's values."""
    norm = rms_norm_residual("float32", d=max(d, 2))
    for config in (PERSISTENT, LOOPED):
        k, region = kernel(softmax("float32", d=5), expand, config, verify=False)
        x = np.random.default_rng(d).standard_normal((3, d)).astype(np.float32)
        e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
        agrees(run(k, x), e / e.sum(-1, keepdims=True))
        k, region = kernel(norm, expand, config, verify=False)
        feeds = fresh(region, np.random.default_rng(d))
        got = run(k, *[feeds[n.name] for n in region.inputs])
        agrees(got, tg.evaluate(norm, feeds, dtype="float64"))


@pytest.mark.parametrize("config", [Config(16, 2, 32), *generate.ROW_CONFIGS[2:]],
                         ids=["block16_persist32", "narrow"])
def test_rows_longer_than_persist_are_looped_whatever_the_loop_block(config, expand):
    """Every configuration loops in blocks below its persist limit: a row past the limit
    must run the looped kernel (it ran the persistent one at the loop's BLOCK, reading the
    first BLOCK columns: a log-softmax over 50257 gave garbage under every ROW_CONFIG)."""
    d = 2 * config.persist + 3
    y = log_softmax("float32", d=d)
    k, _ = kernel(y, expand, config, verify=False)
    x = np.random.default_rng(d).standard_normal((3, d)).astype(np.float32)
    agrees(run(k, x), tg.evaluate(y, {"x": x}, dtype="float64"))


def test_strided_broadcast_and_many_leading_dims_are_read_in_place(expand):
    """A transposed input, a weight broadcast along rows, a per-row input from a column
    slice, and four leading dims (more than the kernel indexes: copied contiguous)."""
    x, g = tg.input("x", (2, 2, 3, 2, 9), "float32"), tg.input("g", (2, 2, 3, 2, 1), "float32")
    y = tg.softmax(x * g, axis=-1)
    for config in (PERSISTENT, LOOPED):
        k, region = kernel(y, expand, config, verify=False)
        rng = np.random.default_rng(8)
        xv = rng.standard_normal((9, 2, 3, 2, 2)).astype(np.float32).transpose(4, 3, 2, 1, 0)
        gv = rng.standard_normal((2, 2, 3, 2, 4)).astype(np.float32)[..., 1:2]
        feeds = {"x": xv, "g": gv}
        got = run(k, *[feeds[n.name] for n in region.inputs])
        agrees(got, tg.evaluate(y, feeds, dtype="float64"))


def test_each_configuration_is_its_own_candidate(expand):
    y = layer_norm_residual("float32", d=768)
    root = y
    while not root.op.is_atomic:
        root = expand(root)
    uses = use_counts([y])
    cands = [generate.row_candidate(root, uses, expand, config=c) for c in generate.ROW_CONFIGS]
    assert len({c.name for c in cands}) == len(generate.ROW_CONFIGS)
    assert all((c.backend, c.device, c.generator.startswith("triton_rows")) ==
               ("triton", "cuda", True) for c in cands)
    assert all(len(c.inputs) == 4 for c in cands)  # x, r, w, b: one kernel, no x + r step


def test_wide_offsets_widen_the_column_index_too(expand, monkeypatch):
    """Past 2**31 elements (WIDE, taken here from 64 elements on) rows and columns are int64:
    a transposed input is read at column x its stride along the row, which wrapped in int32
    while only the row index was widened. Values through both kernels, as without WIDE."""
    from tensor_graphs.kernels.triton import build

    monkeypatch.setattr(build, "WIDE", 64)
    x = tg.input("x", (3, 40), "float32")
    y = tg.softmax(x * 2.0, axis=-1)
    xv = np.random.default_rng(9).standard_normal((40, 3)).astype(np.float32).T  # stride 3
    for config in (PERSISTENT, LOOPED):
        k, _ = kernel(y, expand, config, verify=False)
        agrees(run(k, xv), tg.evaluate(y, {"x": xv}, dtype="float64"))
    _covers, _region, _top, rendered = found(y, expand)
    persistent, looped = rendered.source.split("def looped")
    assert "    if WIDE:\n        cols = cols.to(tl.int64)" in persistent
    assert "        if WIDE:\n            cols_0 = cols_0.to(tl.int64)" in looped
