"""``tensor.repeat`` by a symbolic size: DeBERTa-v2's disentangled attention repeats its
relative position embeddings once per batch row (``.repeat(query.size(0) // heads, 1, 1)``),
so a dynamic batch makes the repeat count symbolic. ``tg.tile`` is reshape + expand +
reshape, which take symbolic sizes; it refused any rep that was not an int."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error

torch = pytest.importorskip("torch")

Dim = torch.export.Dim


def _close(got, ref) -> None:
    ref = ref.detach().double().numpy()
    assert got.shape == ref.shape
    assert relative_error(np.asarray(got, np.float64), ref) < 1e-5


def test_repeat_by_the_batch_size():
    class PerRow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(3, 5))

        def forward(self, x):  # x: (batch, 3, 5); the table once per row, then twice
            return x + self.table.repeat(x.size(0), 1, 1).repeat(1, 1, 2)[..., :5]

    torch.manual_seed(0)
    module = PerRow()
    prog = tg.from_torch(module, (torch.randn(2, 3, 5),), ({0: Dim("batch", max=8)},),
                         db=":memory:")
    for b in (1, 2, 5):
        x = torch.randn(b, 3, 5)
        _close(prog(x), module(x))


def test_tile_takes_symbolic_reps_and_refuses_negative_ones():
    x = tg.input("x", (2, 3))
    batch = tg.input("b", ("batch",)).shape[0]
    assert tg.tile(x, reps=(batch, 1)).shape == (2 * batch, 3)
    with pytest.raises(tg.ShapeError, match="reps"):
        tg.tile(x, reps=(-1, 1))


@pytest.mark.slow
def test_deberta_v2_with_a_dynamic_batch():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    vocab = 53
    model = transformers.DebertaV2Model(transformers.DebertaV2Config(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, relative_attention=True,
        position_buckets=16, pos_att_type=["p2c", "c2p"])).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids, mask):
            return self.model(input_ids=ids, attention_mask=mask).last_hidden_state

    wrapped = Hidden()
    batch, seq = Dim("batch", max=4), Dim("seq", max=16)
    ids = torch.randint(0, vocab, (2, 8))
    prog = tg.from_torch(wrapped, (ids, torch.ones_like(ids)),
                         ({0: batch, 1: seq}, {0: batch, 1: seq}), db=":memory:")
    for b, n in ((1, 8), (3, 11)):
        ids, mask = torch.randint(0, vocab, (b, n)), torch.ones(b, n, dtype=torch.int64)
        mask[-1, n - 3:] = 0
        with torch.no_grad():
            ref = wrapped(ids, mask)
        _close(prog(ids, mask), ref)
