"""ATen's recurrent layers (aten.lstm, aten.gru, aten.rnn_tanh, aten.rnn_relu): torch.export
hands each over whole, with its flat weights; they map to the recurrence over the sequence.

Mapped whole (not left to torch's decomposition), each direction of each layer stays one
``*_layer`` composite (``ir/ops/recurrent.py``): the input projection of the whole sequence is
one matmul and the graph says where a recurrence is. torch.export fixes the sequence length
of these ops (it specializes a dynamic one), so the length is concrete here; a symbolic one
is refused, naming the fix, rather than unrolled to a guess.
"""

from __future__ import annotations

from tensor_graphs.errors import ArgumentError
from tensor_graphs.frontend.aten.common import UnsupportedOpError, guarded
from tensor_graphs.ir import api as tg

_MODULES = {"lstm": "nn.LSTM", "gru": "nn.GRU", "rnn_tanh": "nn.RNN", "rnn_relu": "nn.RNN"}


def _checked(op: str, kw: dict) -> None:
    """torch's own rules the graph cannot follow: dropout between layers while training,
    and a sequence whose length is not fixed."""
    if kw["train"] and kw["dropout"] and kw["num_layers"] > 1:
        raise ArgumentError(f"aten.{op}: {_MODULES[op]} with dropout={kw['dropout']} between "
                            "its layers runs in training mode (random dropout masks); call "
                            "module.eval() before exporting (dropout is then skipped, as in "
                            "torch)")
    x = kw["input"]
    axis = 1 if kw["batch_first"] and x.ndim == 3 else 0
    seq = x.shape[axis]
    if not isinstance(seq, int):
        raise UnsupportedOpError(
            f"aten.{op}: {_MODULES[op]} over the input {tuple(map(str, x.shape))} with a "
            f"symbolic sequence length ({seq}): the recurrence is unrolled over a concrete "
            "length. Export it with a static sequence length (leave that dim out of "
            f"dynamic_shapes), or build it with tg.{op.split('_')[0]}(..., max_steps=N), which "
            "masks the steps past the actual length", [(f"aten::{op}.input", str(seq))])


def _layers(op: str, kind: str, **extra):
    def fn(a, kw):
        _checked(op, kw)
        hx = list(kw["hx"]) if isinstance(kw["hx"], (list, tuple)) else [kw["hx"]]
        x = kw["input"]  # 3-D: nn.RNN/GRU/LSTM unsqueeze an unbatched input before the op
        options = dict(num_layers=kw["num_layers"], has_biases=kw["has_biases"],
                       bidirectional=kw["bidirectional"], batch_first=kw["batch_first"])
        if kind == "lstm":
            out, states = tg.lstm(x, list(kw["params"]), hx[0], hx[1], **options)
        else:
            builder = tg.gru if kind == "gru" else tg.rnn
            out, h_n = builder(x, list(kw["params"]), hx[0], **options, **extra)
            states = (h_n,)
        return (out, *states)
    return fn


def _cell(kind: str, nonlinearity: str = "tanh"):
    """nn.RNNCell / GRUCell / LSTMCell: one step (the module unsqueezes an unbatched input)."""
    def fn(a, kw):
        x, w_ih, w_hh, b_ih, b_hh = (kw[k] for k in ("input", "w_ih", "w_hh", "b_ih", "b_hh"))
        if kind == "lstm":
            h, c = kw["hx"]
            return tg.lstm_cell_states(tg.lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh))
        if kind == "gru":
            return tg.gru_cell(x, kw["hx"], w_ih, w_hh, b_ih, b_hh)
        return tg.rnn_cell(x, kw["hx"], w_ih, w_hh, b_ih, b_hh, nonlinearity=nonlinearity)
    return fn


def table(aten) -> dict:
    return guarded({
        aten.lstm.input: _layers("lstm", "lstm"),
        aten.gru.input: _layers("gru", "gru"),
        aten.rnn_tanh.input: _layers("rnn_tanh", "rnn", nonlinearity="tanh"),
        aten.rnn_relu.input: _layers("rnn_relu", "rnn", nonlinearity="relu"),
        aten.lstm_cell.default: _cell("lstm"),
        aten.gru_cell.default: _cell("gru"),
        aten.rnn_tanh_cell.default: _cell("rnn", "tanh"),
        aten.rnn_relu_cell.default: _cell("rnn", "relu"),
    })
