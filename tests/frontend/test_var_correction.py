"""torch.var / torch.std with no degree of freedom left, imported: tg.var's reference divides
by max(0, n - correction) as torch does, so the importer maps the call as it is."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

from tensor_graphs.frontend import from_torch  # noqa: E402


class TooFew(nn.Module):
    def forward(self, x):
        return (torch.var(x, dim=1, correction=1),  # a size-1 axis: nan
                torch.var(x[:2, 0], correction=3),  # two spread elements, correction 3: inf
                torch.std(x[:2], dim=0, correction=2),  # n == correction: inf
                torch.var(x[:1], dim=0, keepdim=True, correction=2))  # one element: nan


def test_from_torch_var_of_too_few_matches_torch():
    x = torch.tensor([[1.0], [2.0], [-3.0]])
    got = from_torch(TooFew(), (x,))(x)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # degrees of freedom <= 0
        want = TooFew()(x)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g, w = np.asarray(g), w.numpy()
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)  # nan where nan, inf where inf
