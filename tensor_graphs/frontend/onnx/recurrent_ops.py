"""ONNX's RNN, GRU and LSTM on our recurrent layers (``ir/ops/recurrent.py``), one
``*_layer`` per direction. ONNX orders the gates differently from torch (LSTM i, o, f, c
against i, f, g, o; GRU z, r, h against r, z, n): the weights' row blocks are reordered here.
Forms the layers do not compute (other activations, clip, peepholes, coupled gates, GRU's
default linear_before_reset=0, ragged sequence_lens) are refused by name."""

from __future__ import annotations

from tensor_graphs.frontend.onnx.common import Ctx, ints
from tensor_graphs.ir import api as tg

# op -> (gate blocks per weight, ONNX's blocks in torch's gate order, default activations)
_KINDS = {
    "RNN": (1, [0], ["Tanh"]),
    "GRU": (3, [1, 0, 2], ["Sigmoid", "Tanh"]),
    "LSTM": (4, [0, 2, 3, 1], ["Sigmoid", "Tanh", "Tanh"]),
}


def _blocks(w, gates: int, order: list, hidden: int):
    """Row blocks of ``w`` (gates * hidden rows) in torch's gate order."""
    parts = [tg.slice_axis(w, 0, g * hidden, (g + 1) * hidden) for g in order]
    return parts[0] if len(parts) == 1 else tg.concat(parts, 0)


def _recurrent(c: Ctx):
    gates, order, default = _KINDS[c.op]
    acts = list(c.a("activations", []))
    directions = 2 if c.a("direction", "forward") == "bidirectional" else 1
    nonlinearity = "tanh"
    if c.op == "RNN" and acts and acts[0] == "Relu" and directions == 1:
        nonlinearity, acts = "relu", []
    if acts and acts != default * directions:
        raise c.refuse(f"activations {acts} (the defaults {default} are mapped)")
    if c.a("clip") is not None:
        raise c.refuse("clip")
    if c.a("input_forget", 0):
        raise c.refuse("input_forget=1")
    if c.op == "GRU" and not c.a("linear_before_reset", 0):
        raise c.refuse("linear_before_reset=0 (the reset gate before the recurrent product; "
                       "torch's GRU, linear_before_reset=1, is mapped)")
    if c.op == "LSTM" and c.n > 7 and c.has(7):
        raise c.refuse("peephole weights P")
    x, w, r = c.t(0), c.t(1), c.t(2)
    layout = c.a("layout", 0)
    if layout:
        x = tg.transpose(x, 0, 1)  # (batch, seq, in) -> (seq, batch, in)
    seq, batch = x.shape[0], x.shape[1]
    hidden = c.a("hidden_size") or r.shape[-1]
    if c.has(4):
        lengths = ints(c.s(4, "sequence_lens"))
        if any(n != seq for n in lengths):
            raise c.refuse(f"sequence_lens {lengths} shorter than the sequence ({seq})")

    def state(i):
        if not c.has(i):
            return None
        s = c.t(i)
        return tg.transpose(s, 0, 1) if layout else s  # (num_dir, batch, hidden)

    h0, c0 = state(5), state(6) if c.op == "LSTM" else None
    zeros = tg.broadcast_to(tg.as_node(0.0, x.dtype), batch, hidden)
    ys, hs, cs = [], [], []
    for d in range(directions):
        wd, rd = tg.squeeze(tg.slice_axis(w, 0, d, d + 1), 0), \
            tg.squeeze(tg.slice_axis(r, 0, d, d + 1), 0)
        w_ih, w_hh = _blocks(wd, gates, order, hidden), _blocks(rd, gates, order, hidden)
        b_ih = b_hh = None
        if c.has(3):
            bd = tg.squeeze(tg.slice_axis(c.t(3), 0, d, d + 1), 0)
            b_ih = _blocks(tg.slice_axis(bd, 0, 0, gates * hidden), gates, order, hidden)
            b_hh = _blocks(tg.slice_axis(bd, 0, gates * hidden, None), gates, order, hidden)
        h = tg.squeeze(tg.slice_axis(h0, 0, d, d + 1), 0) if h0 is not None else zeros
        reverse = c.a("direction", "forward") == "reverse" or d == 1
        last = 0 if reverse else -1
        if c.op == "LSTM":
            cell = tg.squeeze(tg.slice_axis(c0, 0, d, d + 1), 0) if c0 is not None else zeros
            both = tg.lstm_layer(x, h, cell, w_ih, w_hh, b_ih, b_hh, reverse=reverse)
            y = tg.slice_axis(both, 2, 0, hidden)
            cs.append(tg.slice_axis(tg.slice_axis(both, 2, hidden, None), 0, last,
                                    None if last == -1 else 1))
        elif c.op == "GRU":
            y = tg.gru_layer(x, h, w_ih, w_hh, b_ih, b_hh, reverse=reverse)
        else:
            y = tg.rnn_layer(x, h, w_ih, w_hh, b_ih, b_hh, nonlinearity=nonlinearity,
                             reverse=reverse)
        ys.append(tg.unsqueeze(y, 1))  # (seq, 1, batch, hidden)
        hs.append(tg.slice_axis(y, 0, last, None if last == -1 else 1))
    y = ys[0] if directions == 1 else tg.concat(ys, 1)
    y_h = hs[0] if directions == 1 else tg.concat(hs, 0)
    y_c = (cs[0] if directions == 1 else tg.concat(cs, 0)) if cs else None
    if layout:
        y = tg.permute(y, 2, 0, 1, 3)
        y_h = tg.transpose(y_h, 0, 1)
        y_c = tg.transpose(y_c, 0, 1) if y_c is not None else None
    return (y, y_h, y_c) if c.op == "LSTM" else (y, y_h)


def table() -> dict:
    return {"RNN": _recurrent, "GRU": _recurrent, "LSTM": _recurrent}


__all__ = ["table"]
