"""softplus's one definition (its decomposition) keeps torch's tiny values and its threshold:
log1p(e), not log(1 + e), for the e below float32's resolution next to 1. The ATen mappings
of softplus, log_sigmoid and mish use it as it is (no workaround of their own)."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error

torch = pytest.importorskip("torch")
F = torch.nn.functional

# very negative (the tail log(1 + e) rounds to 0), ordinary, and past the threshold (linear)
X = np.array([-40.0, -30.0, -17.0, -9.0, -1.0, 0.0, 0.5, 3.0, 19.0, 25.0], dtype=np.float32)


@pytest.mark.parametrize("beta, threshold", [(1.0, 20.0), (3.0, 20.0), (0.5, 1.0)])
def test_softplus_decomposition_keeps_tiny_values_and_the_threshold(beta, threshold):
    x = tg.input("x", X.shape, "float32")
    got = tg.evaluate(tg.softplus(x, beta=beta, threshold=threshold), {"x": X})  # float32
    ref = F.softplus(torch.tensor(X, dtype=torch.float64), beta=beta,
                     threshold=threshold).numpy()
    assert got.dtype == np.float32
    tail = X * beta < -16
    assert relative_error(got[tail], ref[tail]) < 1e-6  # each ~1e-7..1e-18: not 0
    assert relative_error(got, ref) < 1e-6
    above = X * beta > threshold
    np.testing.assert_array_equal(got[above], X[above])  # torch returns x itself there


class Tails(torch.nn.Module):
    def forward(self, x):
        return F.softplus(x, beta=3.0), F.logsigmoid(-x), F.mish(x)


def test_aten_softplus_log_sigmoid_and_mish_match_torch_in_the_tail():
    x = torch.tensor(X)
    got = tg.from_torch(Tails(), (x,), db=":memory:")(x)
    for g, r in zip(got, Tails()(x.double())):
        r = r.numpy()
        assert relative_error(g.astype(np.float64), r) < 1e-6
        small = np.abs(r) < 1e-8
        assert relative_error(g[small].astype(np.float64), r[small]) < 1e-5
