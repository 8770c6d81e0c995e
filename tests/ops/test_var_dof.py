"""var with no degree of freedom left (n <= correction, an empty axis): the reference divides
by max(n - correction, 0) as torch and numpy do, so it is nan for a constant row and inf for a
spread one, never the -0 or negative value that dividing by n - correction < 0 gave."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tensor_graphs as tg

torch = pytest.importorskip("torch")

# (row values, correction): n == correction and n < correction, constant and spread rows
CASES = [
    ([5.0], 1),  # one element, correction 1: 0 / 0
    ([5.0], 2),  # one element, correction 2: 0 / max(-1, 0)
    ([1.0, 2.0], 2),  # spread, n == correction: 0.5 / 0
    ([1.0, 2.0], 3),  # spread, n < correction: inf, not -0.5
    ([3.0, 3.0], 3),  # constant, n < correction: nan, not -0
    ([], 0),  # empty: 0 / 0
    ([], 1),  # empty, correction 1: nan, not -0
    ([1.0, 2.0, 4.0], 1),  # an ordinary row stays as it was
]


def _torch_var(values, correction, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about degrees of freedom <= 0
        return torch.var(torch.tensor(values, dtype=dtype), correction=correction).numpy()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("values, correction", CASES)
def test_reference_matches_torch(values, correction, dtype):
    x = tg.input("x", (len(values),), dtype)
    got = tg.evaluate(tg.var(x, correction=correction),
                      {"x": np.asarray(values, dtype)}, dtype="float64")
    want = _torch_var(values, correction, getattr(torch, dtype))
    np.testing.assert_allclose(np.asarray(got, np.float64), want.astype(np.float64),
                               rtol=1e-6)  # torch's float32 accumulation
    if not np.isnan(want):
        assert np.signbit(got) == np.signbit(want)  # never -0


def test_std_of_too_few_is_nan_or_inf():
    x = tg.input("x", (2, 1), "float32")
    std = tg.sqrt(tg.var(x, axis=0, correction=3))
    got = tg.evaluate(std, {"x": np.array([[1.0], [2.0]], np.float32)}, dtype="float64")
    assert np.isposinf(got).all()


def test_symbolic_rows_shorter_than_the_correction():
    """A symbolic axis: the importer's static special case never reached it."""
    x = tg.input("x", (3, "n"), "float32")
    v = tg.var(x, axis=1, correction=2)
    rows = np.array([[7.0], [1.0], [-2.0]], np.float32)
    got = tg.evaluate(v, {"x": rows}, dtype="float64")
    assert np.isnan(got).all()
