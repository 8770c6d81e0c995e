"""Edges of from_torch: a dynamic dim without a max or below its min, state a forward writes in
place, wrong arguments, and the module's training mode left as it was."""

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


class _Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        self.count.add_(1)
        return x * self.count


def test_an_in_place_write_to_a_buffer_is_refused_not_dropped():
    """Eager gives x * 1, then x * 2: a program that dropped the write gave x * 1 forever."""
    from tensor_graphs.frontend.aten import UnsupportedOpError

    with pytest.raises(UnsupportedOpError, match="writes buffer 'count' in place"):
        from_torch(_Counter(), (torch.ones(2),))


def test_a_wrong_argument_is_refused_in_the_words_of_its_kind():
    """The shape refused prints as a shape ((4, 8), not ('3', '8')), the dtype fix is the
    argument's own (a tensor has no ``astype``), and a length above the bounds says where
    they are set (a Dim's max, or bounds=)."""
    from tensor_graphs.errors import DTypeError, ShapeError

    torch.manual_seed(0)
    m = torch.nn.Linear(8, 3).eval()
    prog = from_torch(m, (torch.randn(3, 8),))
    with pytest.raises(ShapeError, match=r"has shape \(4, 8\); the exported module takes "
                                         r"\(3, 8\)$"):
        prog(torch.randn(4, 8))
    with pytest.raises(DTypeError, match=r"x\.to\(torch\.float32\)"):
        prog(torch.randn(3, 8, dtype=torch.float64))
    with pytest.raises(DTypeError, match=r"x\.astype\('float32'\)"):
        prog(np.zeros((3, 8), np.float64))
    dynamic = from_torch(m, (torch.randn(3, 8),), ({0: torch.export.Dim("b", max=4)},))
    with pytest.raises(ShapeError, match=r"bounds=.*from_torch.*torch\.export\.Dim"):
        dynamic(torch.randn(5, 8))


class _Branches(torch.nn.Module):
    def forward(self, x):
        if x.shape[1] >= 4:  # export resolves it from the Dim's min
            return x.sum(1)
        return x.mean(1)


def test_a_size_below_the_dims_min_is_refused_as_torch_refuses_it():
    """The program holds the branch export traced for s >= 4: at 3 it summed where eager
    averages, silently. Export's own 2 (no dynamic dim is 0 or 1) is not held to a call, as
    torch does not hold it: one row runs."""
    from tensor_graphs.errors import ShapeError

    m = _Branches()
    prog = from_torch(m, (torch.randn(2, 8),), ({1: torch.export.Dim("s", min=4, max=64)},))
    np.testing.assert_allclose(prog(torch.ones(2, 4)), [4.0, 4.0])
    with pytest.raises(ShapeError, match=r"axis 1 \(s\) is 3, below the 4 torch\.export allows"):
        prog(torch.ones(2, 3))
    plain = from_torch(torch.nn.Linear(4, 3).eval(), (torch.randn(5, 4),),
                       ({0: torch.export.Dim.AUTO},))
    assert plain(torch.randn(1, 4)).shape == (1, 3)


def test_from_torch_leaves_the_module_in_the_mode_it_was_in():
    """It exports in eval mode; a model snapshotted mid-training went on training with
    dropout silently off."""
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5),
                              torch.nn.Linear(8, 2))
    net.train()
    net[2].eval()  # each submodule's own mode comes back
    from_torch(net, (torch.randn(4, 8),))
    assert [m.training for m in net.modules()] == [True, True, True, False]
