"""ONNX's RNN, GRU and LSTM on our recurrent layers (``ir/ops/recurrent.py``), one
``*_layer`` per direction. ONNX orders the gates differently from torch (LSTM i, o, f, c
against i, f, g, o; GRU z, r, h against r, z, n): the weights' row blocks are reordered here.
ONNX's default GRU (linear_before_reset=0, which no torch layer computes) is unrolled here.
A symbolic sequence length (an export's dynamic axis) is unrolled to its largest value, which
``from_onnx``'s ``dynamic_dims`` gives (the layers' ``max_steps``), the steps past the call's
length masked. An LSTM with peephole weights (P) is unrolled here too. Other forms
(activations, clip, coupled gates, ragged sequence_lens) are refused by name."""

from __future__ import annotations

from tensor_graphs.errors import ShapeError
from tensor_graphs.frontend.onnx.common import Ctx, ints
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.ops.recurrent import _unroll

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


def _max_steps(c: Ctx, seq) -> int | None:
    """How many steps a symbolic sequence length ``seq`` unrolls to: its value at the
    largest values ``dynamic_dims`` gave its dims (None for a concrete length). The plan,
    made at those bounds, assumes the same (a length does not grow as its dims shrink); a
    call longer than it is refused by the program's bound check (or fails on the result's
    shape), never cut short. Without a bound there is no number of steps to unroll: a
    ShapeError naming the node and the dynamic_dims to give."""
    if isinstance(seq, int):
        return None
    names = sorted(str(s) for s in seq.free_symbols)
    missing = [n for n in names if c.bounds.get(n) is None]
    if missing:
        given = {k: v for k, v in c.bounds.items() if v is not None}
        shown = ", ".join([f"{k!r}: {v}" for k, v in given.items()]
                          + [f"{n!r}: N" for n in missing])
        raise ShapeError(
            f"{c.op} node '{c.name}': its sequence length {seq} is symbolic (a dynamic axis "
            f"of the export), and the recurrence is unrolled to the longest sequence the "
            f"program will see, which nothing gives for {missing}; import with that length "
            f"as N: tg.from_onnx(model, dynamic_dims={{{shown}}})")
    return int(seq.xreplace({s: c.bounds[str(s)] for s in seq.free_symbols}))


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
    torch_gru = c.op != "GRU" or bool(c.a("linear_before_reset", 0))
    x, w, r = c.t(0), c.t(1), c.t(2)
    layout = c.a("layout", 0)
    if layout:
        x = tg.transpose(x, 0, 1)  # (batch, seq, in) -> (seq, batch, in)
    seq, batch = x.shape[0], x.shape[1]
    hidden = c.a("hidden_size") or r.shape[-1]
    max_steps = _max_steps(c, seq)
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
            if c.n > 7 and c.has(7):
                peep = tg.squeeze(tg.slice_axis(c.t(7), 0, d, d + 1), 0)
                both = _lstm_peephole(x, h, cell, w_ih, w_hh, b_ih, b_hh, peep, hidden,
                                      reverse, max_steps)
            else:
                both = tg.lstm_layer(x, h, cell, w_ih, w_hh, b_ih, b_hh, reverse=reverse,
                                     max_steps=max_steps)
            y = tg.slice_axis(both, 2, 0, hidden)
            cs.append(tg.slice_axis(tg.slice_axis(both, 2, hidden, None), 0, last,
                                    None if last == -1 else 1))
        elif not torch_gru:  # ONNX's default GRU: the reset gate scales h before R_h
            y = _gru_reset_first(x, h, w_ih, w_hh, b_ih, b_hh, hidden, reverse, max_steps)
        elif c.op == "GRU":
            y = tg.gru_layer(x, h, w_ih, w_hh, b_ih, b_hh, reverse=reverse,
                             max_steps=max_steps)
        else:
            y = tg.rnn_layer(x, h, w_ih, w_hh, b_ih, b_hh, nonlinearity=nonlinearity,
                             reverse=reverse, max_steps=max_steps)
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


def _gru_reset_first(x, h, w_ih, w_hh, b_ih, b_hh, hidden: int, reverse: bool,
                     max_steps: int | None = None):
    """ONNX's GRU with linear_before_reset=0, unrolled: the candidate is
    tanh(x W_n + b_in + (r * h) R_n + b_hn). Weights in torch's order (r, z, n). A symbolic
    length unrolls to ``max_steps`` as the recurrent layers do (``ir/ops/recurrent._unroll``:
    each step reads its position clamped into range, the steps past the length keep h)."""
    xs = tg.matmul(x, tg.transpose(w_ih, 0, 1))  # (seq, batch, 3 * hidden)
    if b_ih is not None:
        xs = tg.add(xs, b_ih)
    r_rz = tg.transpose(tg.slice_axis(w_hh, 0, 0, 2 * hidden), 0, 1)
    r_n = tg.transpose(tg.slice_axis(w_hh, 0, 2 * hidden, None), 0, 1)

    def step(xt, h):
        hr = tg.matmul(h, r_rz)
        if b_hh is not None:
            hr = tg.add(hr, tg.slice_axis(b_hh, 0, 0, 2 * hidden))
        gates = tg.sigmoid(tg.add(tg.slice_axis(xt, 1, 0, 2 * hidden), hr))
        r, z = tg.slice_axis(gates, 1, 0, hidden), tg.slice_axis(gates, 1, hidden, None)
        hn = tg.matmul(tg.mul(r, h), r_n)
        if b_hh is not None:
            hn = tg.add(hn, tg.slice_axis(b_hh, 0, 2 * hidden, None))
        n = tg.tanh(tg.add(tg.slice_axis(xt, 1, 2 * hidden, None), hn))
        return tg.add(n, tg.mul(z, tg.sub(h, n)))  # (1 - z) * n + z * h

    if not isinstance(x.shape[0], int):
        return _unroll("GRU", xs, (h,), lambda xt, h: (step(xt, h),), reverse, max_steps)
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    out = {}
    for t in steps:
        h = step(tg.squeeze(tg.slice_axis(xs, 0, t, t + 1), 0), h)
        out[t] = tg.unsqueeze(h, 0)
    return tg.concat([out[t] for t in range(x.shape[0])], 0)


def _lstm_peephole(x, h, cell, w_ih, w_hh, b_ih, b_hh, peep, hidden: int, reverse: bool,
                   max_steps: int | None = None):
    """An LSTM direction with peephole weights ``peep`` (ONNX's P: i, o, f blocks), which no
    torch layer has, unrolled (``_unroll``, a symbolic length as the layers unroll it): the
    old cell state feeds the input and forget gates, the new one the output gate. Weights
    in torch's gate order (i, f, g, o). Every step's h and c side by side, as
    ``tg.lstm_layer`` gives them."""
    xs = tg.matmul(x, tg.transpose(w_ih, 0, 1))  # (seq, batch, 4 * hidden)
    if b_ih is not None:
        xs = tg.add(xs, b_ih)
    r = tg.transpose(w_hh, 0, 1)
    p_i, p_o, p_f = (tg.slice_axis(peep, 0, k * hidden, (k + 1) * hidden) for k in range(3))

    def gate(g, k):
        return tg.slice_axis(g, 1, k * hidden, (k + 1) * hidden)

    def step(xt, h, cell):
        g = tg.add(xt, tg.matmul(h, r))
        if b_hh is not None:
            g = tg.add(g, b_hh)
        i = tg.sigmoid(tg.add(gate(g, 0), tg.mul(p_i, cell)))
        f = tg.sigmoid(tg.add(gate(g, 1), tg.mul(p_f, cell)))
        cell = tg.add(tg.mul(f, cell), tg.mul(i, tg.tanh(gate(g, 2))))
        o = tg.sigmoid(tg.add(gate(g, 3), tg.mul(p_o, cell)))
        return tg.mul(o, tg.tanh(cell)), cell

    return _unroll("LSTM", xs, (h, cell), step, reverse, max_steps)


def table() -> dict:
    return {"RNN": _recurrent, "GRU": _recurrent, "LSTM": _recurrent}


__all__ = ["table"]
