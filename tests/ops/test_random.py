"""Philox-4x32-10 bits and dropout: the generator against Random123's published answers, the
op table's rows (an independent per-block oracle, torch's where over the same mask), the C
kernels bit for bit against the reference, the statistics of the masks (keep rate, mean,
independence of sites and steps), the identities (p = 0, eval, p = 1) and the generator's
state advanced in place by a compiled program."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import ArgumentError, DTypeError
from tensor_graphs.ir.ops.random import bits_reference, philox4x32, scale, threshold
from tensor_graphs.kernels import registry
from tests.ops import optable as ot

#  Random123's kat_vectors for philox4x32 10: counter, key -> the four output words
KNOWN = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,words", KNOWN)
def test_philox_known_answers(counter, key, words):
    assert tuple(int(w) for w in philox4x32(counter, key)) == words


@pytest.mark.parametrize("row,dtype", ot.params("random"))
def test_matches_oracle(row, dtype):
    ot.check_oracle(row, dtype)


@pytest.mark.parametrize("row,dtype", ot.params("random", torch=True))
def test_matches_torch(row, dtype):
    torch = pytest.importorskip("torch")
    ot.check_torch(row, dtype, torch)


KEYS = [np.array([0, 0]), np.array([-1, 7]), np.array([2 ** 62 + 12345, 2 ** 40 + 3]),
        np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max])]


@pytest.mark.parametrize("n", [1, 3, 4, 63, 64, 65, 1025, 70001])  # 70001: threaded chunks
@pytest.mark.parametrize("k", range(len(KEYS)))
def test_c_random_bits_is_the_reference_bit_for_bit(n, k):
    key, stream = KEYS[k], [0, 5, 2 ** 32 - 1, 77][k]
    got = tg.kernels.get("c_random_bits").fn(key, (n,), stream)
    assert got.dtype == np.int64 and np.array_equal(got, bits_reference(key, n, stream))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n,p", [(7, 0.5), (1025, 0.1), (70001, 0.9), (130, 1 / 3)])
def test_c_dropout_is_numpy_dropout_bit_for_bit(dtype, n, p):
    x = np.random.default_rng(n).standard_normal(n).astype(dtype)
    key = np.array([n * 7919, 3])
    got = tg.kernels.get("c_dropout").fn(x, key, p, 11)
    want = tg.kernels.get("numpy_dropout").fn(x, key, p, 11)
    assert got.dtype == x.dtype and np.array_equal(got, want)
    assert np.array_equal(got == 0, bits_reference(key, n, 11) < threshold(p))


def test_verification_refuses_a_kernel_drawing_another_stream():
    """A kernel off by one stream is refused: a wrong mask moves whole elements."""
    def wrong(x, key, p, stream):
        return tg.kernels.get("numpy_dropout").fn(x, key, p, stream + 1)

    k = registry.unregistered("dropout", wrong, backend="numpy", dtypes=None,
                              where=lambda s, d, a: d[0].is_float or "floats", tolerance=1e-7)
    report = tg.kernels.verify(k, seed=3)
    assert not report.ok and report.failures


# ------------------------------------------------------------------------------ statistics
N = 200_000


def _drawn(p, key=(5, 0), stream=0, x=None):
    x = np.ones(N, np.float64) if x is None else x
    node = tg.input("x", x.shape, "float64")
    return tg.evaluate(tg.dropout(node, p, tg.state("rng", (2,), "int64"), stream=stream),
                       {"x": x, "rng": np.array(key)})


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_and_mean_within_binomial_bounds(p):
    y = _drawn(p)
    kept = np.count_nonzero(y)
    sigma = math.sqrt(N * p * (1 - p))
    assert abs(kept - N * (1 - p)) < 5 * sigma, (kept, N * (1 - p), sigma)
    assert np.all((y == 0) | (y == np.float64(1.0) * (1 / (1 - p))))
    # the mean of the output is the input's (inverted dropout): within 5 standard errors
    x = np.random.default_rng(1).uniform(0.5, 1.5, N)
    z = _drawn(p, x=x)
    stderr = math.sqrt(p / (1 - p) * np.mean(x * x) / N)
    assert abs(z.mean() - x.mean()) < 5 * stderr


@pytest.mark.parametrize("other", [dict(stream=1), dict(key=(5, 1)), dict(key=(6, 0))])
def test_sites_steps_and_seeds_draw_independent_masks(other):
    """Two masks agree where both keep or both drop: p**2 + (1 - p)**2 of the places when
    independent (a shared or shifted mask would agree everywhere, or at a biased rate)."""
    p = 0.5
    a, b = _drawn(p) != 0, _drawn(p, **other) != 0
    agree = np.count_nonzero(a == b) / N
    assert abs(agree - 0.5) < 5 * math.sqrt(0.25 / N), agree
    assert not np.array_equal(a[1:], b[:-1])  # not the same words shifted by one element


def test_the_same_key_and_stream_draw_the_same_mask():
    assert np.array_equal(_drawn(0.3), _drawn(0.3))


# ------------------------------------------------------------------------------ the builder
def test_identities_and_zeros():
    x = tg.input("x", (3, 4))
    r = tg.rng(0)
    assert tg.dropout(x, 0.0, r) is x
    assert tg.dropout(x, 0.5, r, training=False) is x
    assert tg.dropout(x, 0.5, training=False) is x  # eval needs no generator
    zeros = tg.dropout(x, 1.0, r)
    xs = np.array([[np.inf, -np.inf, np.nan, 1.0]] * 3, np.float32)
    got = tg.evaluate(zeros, {})  # reads nothing: no nan from inf * 0
    assert got.dtype == np.float32 and np.array_equal(got, np.zeros((3, 4), np.float32))
    # p = 1 through the op itself (a graph file may hold one): zeros, no nan either
    op = tg.dropout(x, 0.999, r.state, stream=0)
    one = tg.ir.ops.random.dropout_op(x, r.state, p=1.0, stream=0)
    assert op.op.name == one.op.name == "dropout"
    got = tg.evaluate(one, {"x": xs, "rng": np.array([1, 2])})
    assert np.array_equal(got, np.zeros((3, 4), np.float32))


def test_streams_follow_build_order_and_rebuilding_repeats_them():
    def build():
        r = tg.rng(0)
        x = tg.input("x", (8,))
        return [tg.dropout(x, 0.5, r), tg.dropout(x, 0.5, r), tg.dropout(x, 0.1, r)]

    first, again = build(), build()
    assert [n.attrs["stream"] for n in first] == [0, 1, 2]
    assert first == again  # the same nodes: a rebuilt model draws the same masks
    assert first[0] is not first[1]  # two sites of one tensor are not merged


def test_errors_name_the_op_and_the_fix():
    x = tg.input("x", (3,))
    with pytest.raises(ArgumentError, match=r"dropout: p must be a number in \[0, 1\]"):
        tg.dropout(x, 1.5, tg.rng())
    with pytest.raises(ArgumentError, match="training needs a generator.*tg.rng"):
        tg.dropout(x, 0.5)
    with pytest.raises(DTypeError, match="dropout: x must be a float tensor"):
        tg.dropout(tg.input("i", (3,), "int64"), 0.5, tg.rng())
    with pytest.raises(ArgumentError, match="give stream="):
        tg.dropout(x, 0.5, tg.state("rng", (2,), "int64"))
    with pytest.raises(DTypeError, match=r"int64 tensor of shape \(2,\)"):
        tg.dropout(x, 0.5, tg.state("rng", (2,), "int32"), stream=0)
    with pytest.raises(ArgumentError, match="stream must be an int in"):
        tg.random_bits(tg.state("rng", (2,), "int64"), (3,), 2 ** 32)
    with pytest.raises(ArgumentError, match="seed must be an int"):
        tg.rng(1.5)


def test_a_graph_file_keeps_the_masks(tmp_path):
    r = tg.rng(0)
    x = tg.input("x", (5, 7))
    y = tg.dropout(x, 0.4, r) + tg.dropout(x, 0.2, r)
    tg.save(y, tmp_path / "g.json")
    back = tg.load(tmp_path / "g.json")
    feeds = {"x": np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32),
             "rng": np.array([9, 4])}
    assert np.array_equal(tg.evaluate(back, feeds), tg.evaluate(y, feeds))


# ------------------------------------------------------------------------------ compiled
def test_a_program_advances_its_generator_in_place_and_a_seed_repeats_it():
    r = tg.rng(seed=42)
    x = tg.input("x", (64, 33))
    prog = tg.compile([tg.dropout(x, 0.5, r), r.advance()])
    xs = np.ones((64, 33), np.float32)
    prog.bind(**r.init())
    masks = [prog(x=xs)[0] != 0 for _ in range(3)]
    assert prog.state("rng").tolist() == [42, 3]
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])
    for step, mask in enumerate(masks):  # each step is the reference's words at that step
        assert np.array_equal(~mask, (bits_reference(np.array([42, step]), xs.size, 0)
                                      < threshold(0.5)).reshape(xs.shape))
    prog.bind(**r.init())  # the same seed again: the same masks again
    assert all(np.array_equal(prog(x=xs)[0] != 0, m) for m in masks)
    prog.bind(**r.init(seed=43))
    assert not np.array_equal(prog(x=xs)[0] != 0, masks[0])


def test_the_native_loop_replays_each_step_with_the_advanced_key():
    """c_dropout reads the key through its pointer, and the advance is a C add: the native
    loop runs the step, and its replays draw each step's mask (values read at record time
    would repeat one step's mask)."""
    r = tg.rng(seed=42)
    x = tg.input("x", (256, 1024))
    prog = tg.compile([tg.dropout(x, 0.5, r), r.advance()], backends=["c", "numpy"])
    prog.bind(**r.init())
    xs = np.ones((256, 1024), np.float32)
    for step in range(5):
        y, key = prog(x=xs)
        assert key.tolist() == [42, step + 1]
        want = bits_reference(np.array([42, step]), xs.size, 0) < threshold(0.5)
        assert np.array_equal(y.reshape(-1) == 0, want), step
    assert prog.loop.startswith("native loop"), prog.loop
    assert prog.stats["native_runs"] >= 2


def test_scale_and_threshold():
    assert scale(0.0) == 1.0 and scale(0.5) == 2.0 and scale(1.0) == 0.0
    assert threshold(0.0) == 0 and threshold(1.0) == 2 ** 32 and threshold(0.5) == 2 ** 31
