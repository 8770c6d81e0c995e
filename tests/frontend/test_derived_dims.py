"""What Wav2Vec2's feature encoder over audio of any length needs from the importer: an input
whose size is a derived dim (``10 * Dim("frames")``, what torch.export asks for when strides
divide the length), a strided 1-d convolution over that symbolic length (its output length
``floor((L - d (k-1) - 1) / s) + 1`` simplifies to a polynomial of the dim), and ``flip``
over a symbolic axis (the feature mask's reversed cumsum). One plan serves every length."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import ShapeError
from tensor_graphs.numerics import relative_error

torch = pytest.importorskip("torch")
Dim = torch.export.Dim


class StridedEncoder(torch.nn.Module):
    """Two strided, dilated convolutions and a reversed running sum over the length."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv1d(3, 8, 10, stride=5)
        self.b = torch.nn.Conv1d(8, 4, 3, stride=2, padding=1, dilation=2)

    def forward(self, x):
        h = self.b(torch.relu(self.a(x)))
        return h, x.flip(-1).cumsum(-1).flip(-1)


def test_strided_conv_and_flip_over_a_derived_dim():
    torch.manual_seed(0)
    module = StridedEncoder().eval()
    samples = 10 * Dim("frames", min=4, max=40)
    prog = tg.from_torch(module, (torch.randn(2, 3, 100),), ({2: samples},), db=":memory:")
    for n in (100, 250, 40):
        x = torch.randn(2, 3, n)
        with torch.no_grad():
            ref = module(x)
        got = prog(x)
        for g, r in zip(got, ref):
            assert g.shape == tuple(r.shape)
            assert relative_error(g.astype(np.float64), r.double().numpy()) < 1e-5, n
    assert prog.program.stats["plans"] == 1


def test_a_length_off_the_derived_dim_is_refused_naming_it():
    module = StridedEncoder().eval()
    prog = tg.from_torch(module, (torch.randn(1, 3, 100),),
                         ({2: 10 * Dim("frames", min=4, max=40)},), db=":memory:")
    with pytest.raises(ShapeError, match="frames"):
        prog(torch.randn(1, 3, 105))
