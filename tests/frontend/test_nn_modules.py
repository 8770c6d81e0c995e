"""torch.nn's own modules, built as a user builds them, imported and compared with eager."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

from tensor_graphs.frontend import from_torch  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

TOL = 1e-5


def _check(module, *args):
    module.eval()
    prog = from_torch(module, args)
    got = prog(*args)
    with torch.no_grad():
        ref = module(*args)
    if isinstance(ref, tuple):  # MultiheadAttention: (output, averaged weights)
        ref, got = ref[0], got[0]
    assert got.shape == tuple(ref.shape)
    assert relative_error(got, ref.numpy()) <= TOL


@pytest.mark.parametrize("options", [
    {},
    {"norm_first": True, "activation": "gelu"},
    {"batch_first": False},
])
def test_transformer_encoder_layer(options):
    """It stopped at aten.unflatten (the packed in-projection); torch's decomposition of it
    is a view."""
    torch.manual_seed(0)
    options = {"batch_first": True, **options}
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, **options)
    _check(layer, torch.randn(2, 5, 16))


def test_transformer_decoder_layer_and_stack():
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.1, batch_first=True)
    _check(layer, torch.randn(2, 5, 16), torch.randn(2, 7, 16))
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, batch_first=True),
                                    num_layers=2, enable_nested_tensor=False)
    _check(encoder, torch.randn(2, 6, 16))


def test_multihead_attention():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    _check(nn.MultiheadAttention(16, 4, batch_first=True), x, x, x)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_rows(mode):
    torch.manual_seed(0)
    _check(nn.EmbeddingBag(20, 8, mode=mode), torch.randint(0, 20, (3, 4)))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_offsets_padding_and_empty_bags(mode):
    torch.manual_seed(0)
    ids = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 7])
    offsets = torch.tensor([0, 2, 2, 5])  # bag 1 is empty
    _check(nn.EmbeddingBag(10, 6, mode=mode, padding_idx=4), ids, offsets)
    bag = nn.EmbeddingBag(10, 6, mode=mode, include_last_offset=True)
    _check(bag, ids, torch.tensor([0, 3, 3, 10]))  # the last offset closes the last bag


def test_embedding_bag_per_sample_weights():
    torch.manual_seed(0)

    class Weighted(nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = nn.EmbeddingBag(10, 6, mode="sum")

        def forward(self, ids, offsets, weights):
            return self.bag(ids, offsets, per_sample_weights=weights)

    ids = torch.tensor([1, 2, 4, 5, 4, 3])
    _check(Weighted(), ids, torch.tensor([0, 2, 4]), torch.rand(6))

