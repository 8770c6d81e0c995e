"""In-place writes through views, as models write them: ``y[:, 1:] = x[:, :-1]`` (BART's and
mBART's ``shift_tokens_right``, which runs when only ``input_ids`` are given), ``y[0] = 7.0``,
``y[:, 1:].mul_(2)``, ``y.view(-1).mul_(3)``.

The exported graph writes the view (``copy_``, ``fill_``, ``mul_``) and reads the base, which
the write changed; the importer's rebinding of a written tensor's name cannot see that, so
such a program is imported in torch's functional form (``slice_scatter``, ``select_scatter``,
``copy``, ``fill``), each of which maps: a step-1 slice of a symbolic axis is one concat.
Before, the writes through ``mul_``/``add_``/``masked_fill_`` were silently lost (wrong
answers) and those through ``copy_``/``fill_`` were refused."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error

torch = pytest.importorskip("torch")

from tests.frontend.causal_lm import Logits  # noqa: E402


def _check(module, x, dynamic_shapes=None, calls=()):
    prog = tg.from_torch(module, (x,), dynamic_shapes, db=":memory:")
    for arg in (x, *calls):
        with torch.no_grad():
            ref = module(arg).double().numpy()
        got = prog(arg)
        assert got.shape == ref.shape
        assert relative_error(np.asarray(got, np.float64), ref) < 1e-6, arg.shape


def _module(write):
    class Writes(torch.nn.Module):
        def forward(self, x):
            y = x.clone()
            write(y, x)
            return y + 0

    return Writes()


def _set(index, value):
    return lambda y, x: y.__setitem__(index, value(x) if callable(value) else value)


ALL = slice(None)
WRITES = {
    # an in-place op on a view changes its base
    "mul_ on a slice": lambda y, x: y[:, 1:].mul_(2),
    "add_ on a row": lambda y, x: y[:, 0].add_(5.0),
    "mul_ on a reshaped view": lambda y, x: y.view(-1).mul_(3.0),
    "masked_fill_ on a slice": lambda y, x: y[1:].masked_fill_(y[1:] > 0, 0.0),
    "add_ on a view of a view": lambda y, x: y[1:].t()[0].add_(3),
    # setitem: copy_ and fill_ into a view
    "shift right": _set((ALL, slice(1, None)), lambda x: x[:, :-1]),
    "fill a prefix": _set((ALL, slice(None, 2)), 5.0),
    "negative bounds": _set((ALL, slice(-3, -1)), lambda x: x[:, :2] * 2),
    "a step of 2": _set((ALL, slice(1, None, 2)), 0.0),
    "a step of 3 from a tensor": _set((ALL, slice(None, None, 3)), lambda x: x[:, :3] + 1),
    "an empty slice": _set((ALL, slice(5, 2)), 1.0),
    "the last column": _set((ALL, -1), lambda x: x[:, 0]),
    "a row": _set((0,), lambda x: x[1]),
}


@pytest.mark.parametrize("name", list(WRITES))
def test_a_write_through_a_view_changes_its_base(name):
    torch.manual_seed(0)
    _check(_module(WRITES[name]), torch.randn(3, 7))


def test_a_view_taken_before_its_base_is_written_sees_the_write():
    class Alias(torch.nn.Module):
        def forward(self, x):
            y = x.clone()
            row = y[0]
            y.mul_(2)
            return row + 0

    _check(Alias(), torch.randn(3, 4))


def test_writes_into_a_symbolic_axis_serve_every_length():
    class Shift(torch.nn.Module):  # BART's shift_tokens_right, with a start token and padding
        def forward(self, x):
            y = x.clone()
            y[:, 1:] = x[:, :-1]
            y[:, 0] = 9.0
            y[:, -2:] = 0.5
            return y

    n = torch.export.Dim("n", min=3, max=32)
    _check(Shift(), torch.randn(2, 8), ({1: n},), calls=[torch.randn(2, 5), torch.randn(2, 17)])


def test_writing_a_view_of_an_input_does_not_write_the_input_but_computes_the_same():
    class WritesInput(torch.nn.Module):
        def forward(self, x):
            x[:, 0] = 0.0
            return x * 2

    x = torch.randn(3, 4)
    prog = tg.from_torch(WritesInput(), (x.clone(),), db=":memory:")
    ref = WritesInput()(x.clone()).double().numpy()
    kept = x.clone()
    assert relative_error(np.asarray(prog(x), np.float64), ref) < 1e-6
    assert torch.equal(x, kept)


@pytest.mark.slow
def test_mbart_shifts_input_ids_into_decoder_inputs():
    """mBART called with ``input_ids`` and a mask only: its decoder inputs are the ids
    shifted right, the last non-pad token wrapped around to the front
    (``shift_tokens_right``: a gather, then writes through two views of a clone; BART's
    writes a zeros tensor the same way)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    vocab = 53
    cfg = dict(vocab_size=vocab, d_model=16, encoder_layers=1, decoder_layers=1,
               encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
               decoder_ffn_dim=32, max_position_embeddings=32, pad_token_id=1, bos_token_id=0,
               eos_token_id=2, decoder_start_token_id=2)

    seq = torch.export.Dim("seq", min=3, max=16)  # mBART: a guard of torch.export
    for model in (transformers.MBartForConditionalGeneration(transformers.MBartConfig(**cfg)),):
        wrapped = Logits(model.eval())
        ids = torch.randint(3, vocab, (2, 6))
        prog = tg.from_torch(wrapped, (ids, torch.ones_like(ids)), ({1: seq}, {1: seq}),
                             db=":memory:")
        for n in (6, 9):
            ids, mask = torch.randint(3, vocab, (2, n)), torch.ones(2, n, dtype=torch.int64)
            mask[1, n - 2:] = 0
            ids[mask == 0] = 1
            with torch.no_grad():
                ref = wrapped(ids, mask).double().numpy()
            assert relative_error(prog(ids, mask).astype(np.float64), ref) < 1e-4, \
                (type(model).__name__, n)


def test_a_write_to_a_buffer_through_a_view_is_refused_not_dropped():
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(4))

        def forward(self, x):
            self.count[:2].add_(1)
            return x + self.count

    from tensor_graphs.frontend import UnsupportedOpError

    with pytest.raises(UnsupportedOpError, match=r"writes buffer 'count' in place"):
        tg.from_torch(Counter(), (torch.randn(4),), db=":memory:")
