"""A dynamic dim without a max (torch.export's Dim("b")) is bounded by its example size."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tensor_graphs import from_torch  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402


def test_a_dim_without_a_max_imports_and_runs():
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 3).eval()
    prog = from_torch(m, (torch.randn(5, 4),), ({0: torch.export.Dim("b")},))
    for n in (5, 2):
        x = torch.randn(n, 4)
        with torch.no_grad():
            ref = m(x).double().numpy()
        assert relative_error(np.asarray(prog(x), np.float64), ref) < 1e-6
