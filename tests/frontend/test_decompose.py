"""torch's decompositions as the importer's fallback: composites torch hands over whole that
the ATen table does not map (einsum, tile, outer, the losses...) import through torch's own
decomposition of that op alone; composites the table maps stay whole."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402,N812

from tensor_graphs.frontend import UnsupportedOpError, from_torch, import_exported  # noqa: E402
from tensor_graphs.frontend.aten import lookup  # noqa: E402
from tensor_graphs.frontend.decompose import decompose_unmapped  # noqa: E402
from tensor_graphs.ir import graph as ir_graph  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

TOL = 1e-5


def _check(module, *args):
    prog = from_torch(module, args)
    got = prog(*args)
    with torch.no_grad():
        ref = module(*args)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    gots = got if isinstance(got, (tuple, list)) else (got,)
    assert len(gots) == len(refs)
    for g, r in zip(gots, refs):
        assert np.asarray(g).shape == tuple(r.shape)
        assert relative_error(g, r.numpy()) <= TOL, relative_error(g, r.numpy())


class Composites(nn.Module):
    """The composites of issue 21's list, none of them in the ATen table."""

    def forward(self, a, b, v, w, ids):
        return (torch.einsum("bij,bjk->bik", a, b), torch.einsum("ii->i", a[0]),
                torch.tile(v, (2, 3)), a.unflatten(1, (2, 2)), torch.broadcast_to(v, (3, 5)),
                torch.hstack([a[0], b[0][:, :4]]), torch.vstack([v, w]),
                torch.repeat_interleave(v, 2), torch.repeat_interleave(a, 3, dim=1),
                a[0].T, torch.mv(a[0], v[:4]), torch.dot(v, w), torch.outer(v, w),
                torch._weight_norm(a, b[:, :1, :1], 0),
                F.mse_loss(v, w), F.l1_loss(v, w, reduction="sum"), F.smooth_l1_loss(v, w),
                F.huber_loss(v, w, delta=0.5), F.binary_cross_entropy_with_logits(v, w.sigmoid()),
                F.kl_div(F.log_softmax(v, 0), F.softmax(w, 0), reduction="batchmean"),
                F.cross_entropy(a[0], ids), F.nll_loss(F.log_softmax(a[0], 1), ids),
                F.cosine_similarity(a, b[..., :4], dim=-1))


def test_composites_decompose_through_torch():
    torch.manual_seed(0)
    a, b = torch.randn(3, 4, 4), torch.randn(3, 4, 6)
    v, w = torch.randn(5), torch.randn(5)
    args = (a, b, v, w, torch.tensor([1, 0, 3, 2]))
    exported = torch.export.export(Composites(), args)
    missing = {str(n.target) for n in exported.graph.nodes
               if n.op == "call_function" and lookup(n.target) is None}
    assert {"aten.einsum.default", "aten.tile.default", "aten.outer.default"} <= missing
    _check(Composites(), *args)


class MappedWhole(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.norm = nn.Linear(8, 8), nn.LayerNorm(8)

    def forward(self, x):
        return torch.einsum("bi,bj->bij", F.gelu(self.norm(self.fc(x))), x)


def test_composites_the_table_maps_stay_whole():
    """Decomposing einsum must not decompose linear, layer_norm and gelu: the planner finds
    fused kernels for them whole."""
    module, x = MappedWhole().eval(), torch.randn(2, 8)
    exported = torch.export.export(module, (x,))
    decomposed = decompose_unmapped(exported)
    targets = {str(n.target) for n in decomposed.graph.nodes if n.op == "call_function"}
    assert "aten.einsum.default" not in targets
    assert {"aten.linear.default", "aten.layer_norm.default", "aten.gelu.default"} <= targets
    outputs, *_ = import_exported(exported)
    ops = {n.op.name for n in ir_graph.nodes(outputs)}
    assert {"linear", "layer_norm", "gelu"} <= ops
    _check(module, x)


def test_a_program_every_op_of_which_maps_is_not_retraced():
    exported = torch.export.export(nn.Linear(4, 4).eval(), (torch.randn(2, 4),))
    assert decompose_unmapped(exported) is exported


class Unsupported(nn.Module):
    def forward(self, x):
        y = torch.fft.fft(x).real
        z = torch.fft.ifft(y).imag
        return torch.relu(y + z) + torch.fft.fft(z).real


def test_what_remains_unmapped_is_listed_once_per_line_with_advice():
    with pytest.raises(UnsupportedOpError) as info:
        from_torch(Unsupported(), (torch.randn(4, 4),))
    message = str(info.value)
    assert "fft" in message and "test_decompose.py" in message
    lines = [ln for ln in message.splitlines() if ln.startswith("  ")]
    assert len(lines) == len(set(lines)) == len(info.value.ops)
    assert "Rewrite those lines" in message  # advice for the user, not the developers
    assert "tensor_graphs.frontend.aten" not in message
