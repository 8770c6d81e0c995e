"""Recurrent layers (torch.nn's RNN, GRU, LSTM): one cell, and one layer unrolled over time.

Weights have torch's layouts and gate orders, so a module's parameters bind as they are:
``w_ih`` (gates*hidden, input), ``w_hh`` (gates*hidden, hidden or proj), biases
(gates*hidden,), LSTM gates (i, f, g, o), GRU gates (r, z, n), the LSTM projection ``w_hr``
(proj, hidden). Sequences are time-major ``(seq, batch, features)``.

A layer is a composite of its own, not a chain of cell composites: the input projection of
every step is one matmul over the whole sequence (as torch's kernels do), and only the
``h @ w_hh`` product is left inside the recurrence. An LSTM layer's value holds h and c of
every step side by side on the last axis (h first), so the final c is a slice of it, as the
final h is for every kind: the composites stay single-valued.

A sequence of symbolic length is unrolled up to ``max_steps`` with the steps past the actual
length masked: the state stops changing there, so the outputs and the final state are those of
the actual length. The program must be compiled with a bound no larger than ``max_steps``
(``tg.compile(..., bounds={"seq": max_steps})``), which the runtime enforces.
"""

from __future__ import annotations

from collections.abc import Sequence

from tensor_graphs.errors import ArgumentError, ShapeError
from tensor_graphs.ir import builder as tg
from tensor_graphs.ir.composite import composite
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.elementwise import minimum, relu, sigmoid, sub, tanh
from tensor_graphs.ir.ops.nn import linear
from tensor_graphs.ir.shapes import dims_equal, format_shape

__all__ = ["rnn_cell", "gru_cell", "lstm_cell", "rnn_layer", "gru_layer", "lstm_layer",
           "lstm_cell_states", "rnn", "gru", "lstm"]

GATES = {"rnn": 1, "gru": 3, "lstm": 4}  # gate blocks stacked in w_ih / w_hh, torch's order
NONLINEARITIES = ("tanh", "relu")  # an Elman RNN's activation (nn.RNN's nonlinearity)


# ---------------------------------------------------------------------------- checks
def _check(op: str, kind: str, x, h, w_ih, w_hh, b_ih, b_hh, w_hr=None, c=None) -> None:
    """Shapes as torch requires them, with the offending tensor named."""
    gates = GATES[kind]
    if w_ih.ndim != 2 or w_hh.ndim != 2:
        raise ShapeError(f"{op}: w_ih and w_hh must be 2-D ({gates}*hidden, features), got "
                         f"{format_shape(w_ih.shape)} and {format_shape(w_hh.shape)}")
    rows = w_ih.shape[0]
    if not isinstance(rows, int) or rows % gates:
        raise ShapeError(f"{op}: w_ih {format_shape(w_ih.shape)} must have {gates}*hidden rows "
                         f"(the {kind} gates stacked, as in torch)")
    hidden = rows // gates
    out = w_hr.shape[0] if w_hr is not None else hidden
    if not dims_equal(x.shape[-1], w_ih.shape[1]):
        raise ShapeError(f"{op}: the input's last axis ({x.shape[-1]}) must equal w_ih's "
                         f"input size: input {format_shape(x.shape)}, w_ih "
                         f"{format_shape(w_ih.shape)}")
    if not (dims_equal(w_hh.shape[0], rows) and dims_equal(w_hh.shape[1], out)):
        raise ShapeError(f"{op}: w_hh must have shape ({rows}, {out}), got "
                         f"{format_shape(w_hh.shape)}")
    for name, b in (("b_ih", b_ih), ("b_hh", b_hh)):
        if b is not None and (b.ndim != 1 or not dims_equal(b.shape[0], rows)):
            raise ShapeError(f"{op}: {name} must have shape ({rows},), got "
                             f"{format_shape(b.shape)}")
    if w_hr is not None and (w_hr.ndim != 2 or not dims_equal(w_hr.shape[1], hidden)):
        raise ShapeError(f"{op}: w_hr must have shape (proj, {hidden}), got "
                         f"{format_shape(w_hr.shape)}")
    batch = x.shape[-2] if x.ndim >= 2 else None
    for name, s, size in (("h", h, out), ("c", c, hidden)):
        if s is not None and (s.ndim != 2 or not dims_equal(s.shape[-1], size)
                              or (batch is not None and not dims_equal(s.shape[0], batch))):
            raise ShapeError(f"{op}: {name} must have shape ({batch}, {size}) (batch, size) "
                             f"for the input {format_shape(x.shape)}, got "
                             f"{format_shape(s.shape)}")


def _gate(g, k: int, n: int, hidden: int):
    """Gate block k of n along the last axis."""
    return tg.slice_axis(g, -1, k * hidden, (k + 1) * hidden) if n > 1 else g


# ---------------------------------------------------------------------------- one step
def _rnn_step(xp, h, w_hh, b_hh, nonlinearity: str):
    """h' = act(xp + h W_hh^T + b_hh), xp the input's projection with its bias."""
    a = tg.add(xp, linear(h, w_hh, b_hh))
    return tanh(a) if nonlinearity == "tanh" else relu(a)


def _gru_step(xp, h, w_hh, b_hh, hidden: int):
    """torch's GRU: r and z from both projections, n = tanh(xn + r * hn) with hn carrying
    b_hn inside the product with r, h' = n + z * (h - n)."""
    hp = linear(h, w_hh, b_hh)
    r = sigmoid(tg.add(_gate(xp, 0, 3, hidden), _gate(hp, 0, 3, hidden)))
    z = sigmoid(tg.add(_gate(xp, 1, 3, hidden), _gate(hp, 1, 3, hidden)))
    n = tanh(tg.add(_gate(xp, 2, 3, hidden), tg.mul(r, _gate(hp, 2, 3, hidden))))
    return tg.add(n, tg.mul(z, sub(h, n)))


def _lstm_step(xp, h, c, w_hh, b_hh, w_hr, hidden: int):
    """torch's LSTM: gates (i, f, g, o); c' = f c + i g, h' = o tanh(c') (projected by w_hr
    where given)."""
    g = tg.add(xp, linear(h, w_hh, b_hh))
    i, f = sigmoid(_gate(g, 0, 4, hidden)), sigmoid(_gate(g, 1, 4, hidden))
    cand, o = tanh(_gate(g, 2, 4, hidden)), sigmoid(_gate(g, 3, 4, hidden))
    c2 = tg.add(tg.mul(f, c), tg.mul(i, cand))
    h2 = tg.mul(o, tanh(c2))
    if w_hr is not None:
        h2 = linear(h2, w_hr)
    return h2, c2


# ---------------------------------------------------------------------------- cells
def _cell_example(kind: str, gates: int):
    def example():
        args = [tg.input("x", (2, 3)), tg.input("h", (2, 4))]
        if kind == "lstm":
            args.append(tg.input("c", (2, 4)))
        return (*args, tg.input("w_ih", (gates * 4, 3)), tg.input("w_hh", (gates * 4, 4)),
                tg.input("b_ih", (gates * 4,)), tg.input("b_hh", (gates * 4,)))
    return example


@composite(example=_cell_example("rnn", 1))
def rnn_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None, *, nonlinearity="tanh"):
    """One step of an Elman RNN (torch's RNNCell): act(x W_ih^T + b_ih + h W_hh^T + b_hh)."""
    if nonlinearity not in NONLINEARITIES:
        raise ArgumentError(f"rnn_cell: nonlinearity must be one of {NONLINEARITIES}, got "
                            f"{nonlinearity!r}")
    _check("rnn_cell", "rnn", x, h, w_ih, w_hh, b_ih, b_hh)
    return _rnn_step(linear(x, w_ih, b_ih), h, w_hh, b_hh, nonlinearity)


@composite(example=_cell_example("gru", 3))
def gru_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    """One step of a GRU (torch's GRUCell), gates (r, z, n)."""
    _check("gru_cell", "gru", x, h, w_ih, w_hh, b_ih, b_hh)
    return _gru_step(linear(x, w_ih, b_ih), h, w_hh, b_hh, w_ih.shape[0] // 3)


@composite(example=_cell_example("lstm", 4))
def lstm_cell(x, h, c, w_ih, w_hh, b_ih=None, b_hh=None):
    """One step of an LSTM (torch's LSTMCell): the new h and c stacked, (2, batch, hidden).

    One value for both states keeps the cell a single composite; ``out[0]`` is h', ``out[1]``
    is c' (``tg.lstm_cell_states`` splits them)."""
    _check("lstm_cell", "lstm", x, h, w_ih, w_hh, b_ih, b_hh, c=c)
    h2, c2 = _lstm_step(linear(x, w_ih, b_ih), h, c, w_hh, b_hh, None, w_ih.shape[0] // 4)
    return tg.concat([tg.unsqueeze(h2, 0), tg.unsqueeze(c2, 0)], axis=0)


# ---------------------------------------------------------------------------- layers
def _steps(op: str, seq, max_steps) -> int:
    """How many steps to unroll: the length, or max_steps for a symbolic one."""
    if isinstance(seq, int):
        if max_steps is not None and max_steps < seq:
            raise ShapeError(f"{op}: the sequence has {seq} steps, more than max_steps="
                             f"{max_steps}")
        return seq
    if max_steps is None:
        raise ShapeError(f"{op}: the sequence length {seq} is symbolic; give max_steps= (the "
                         "largest length the program will see, also its compile bound) or a "
                         "concrete length")
    if not isinstance(max_steps, int) or max_steps < 1:
        raise ArgumentError(f"{op}: max_steps must be a positive int, got {max_steps!r}")
    return max_steps


def _unroll(op: str, xp, state: tuple, step, reverse: bool, max_steps):
    """Run ``step(xp_t, *state) -> state`` over the sequence (forward or reversed). Returns
    every position's states side by side on the last axis (h first), (seq, batch, width).

    Each step works on (batch, size) states (the input's slice is reshaped inside the
    h @ w_hh product's fused epilogue), and each state's sequence is one concat of the steps'
    (batch, size) states along the rows, reshaped once to (seq, batch, size): no step pays a
    reshape or a concat of its own."""
    seq = xp.shape[0]
    n = _steps(op, seq, max_steps)
    symbolic = not isinstance(seq, int)
    length = tg.size(seq) if symbolic else None
    per_step = []
    for k in range(n):
        if symbolic:
            # step k reads position k (reversed: seq-1-k), clamped into range; past the
            # length the state is kept, so the masked steps change nothing
            at = sub(sub(length, 1), k) if reverse else tg.constant(k, "int64")
            at = minimum(tg.maximum(at, 0), sub(length, 1))
            xt = tg.squeeze(tg.gather(xp, tg.reshape(at, (1,)), axis=0), 0)
        else:
            t = n - 1 - k if reverse else k
            xt = tg.squeeze(tg.slice_axis(xp, 0, t, t + 1), 0)
        new = step(xt, *state)
        if symbolic:
            live = tg.less(tg.constant(k, "int64"), length)
            new = tuple(tg.where(live, a, b) for a, b in zip(new, state))
        state = new
        per_step.append(state)
    if not symbolic and reverse:
        per_step = per_step[::-1]  # position order
    seqs = [tg.reshape(tg.concat([st[i] for st in per_step], axis=0),
                       (n, *state[i].shape)) for i in range(len(state))]
    stacked = tg.concat(seqs, axis=-1) if len(seqs) > 1 else seqs[0]
    if not symbolic:
        return stacked
    if not reverse:
        return tg.slice_axis(stacked, 0, 0, seq)
    # position p was step seq-1-p
    return tg.gather(stacked, sub(sub(length, 1), tg.iota(seq)), axis=0)


def _layer_example(kind: str):
    gates = GATES[kind]

    def example():
        args = [tg.input("x", (5, 2, 3)), tg.input("h0", (2, 4))]
        if kind == "lstm":
            args.append(tg.input("c0", (2, 4)))
        return (*args, tg.input("w_ih", (gates * 4, 3)), tg.input("w_hh", (gates * 4, 4)),
                tg.input("b_ih", (gates * 4,)), tg.input("b_hh", (gates * 4,)))
    return example


def _check_seq(op: str, x) -> None:
    if x.ndim != 3:
        raise ShapeError(f"{op}: the input must be (seq, batch, features) (time-major; "
                         f"transpose a batch-first input), got {format_shape(x.shape)}")


@composite(example=_layer_example("rnn"))
def rnn_layer(x, h0, w_ih, w_hh, b_ih=None, b_hh=None, *, nonlinearity="tanh", reverse=False,
              max_steps=None):
    """One direction of one Elman RNN layer over a (seq, batch, input) sequence: every
    step's h, (seq, batch, hidden); the final h is the last position's (the first's when
    reversed)."""
    _check_seq("rnn_layer", x)
    if nonlinearity not in NONLINEARITIES:
        raise ArgumentError(f"rnn_layer: nonlinearity must be one of {NONLINEARITIES}, got "
                            f"{nonlinearity!r}")
    _check("rnn_layer", "rnn", x, h0, w_ih, w_hh, b_ih, b_hh)
    return _unroll("rnn_layer", linear(x, w_ih, b_ih), (h0,),
                   lambda xt, h: (_rnn_step(xt, h, w_hh, b_hh, nonlinearity),),
                   reverse, max_steps)


@composite(example=_layer_example("gru"))
def gru_layer(x, h0, w_ih, w_hh, b_ih=None, b_hh=None, *, reverse=False, max_steps=None):
    """One direction of one GRU layer over a (seq, batch, input) sequence: every step's h,
    (seq, batch, hidden)."""
    _check_seq("gru_layer", x)
    _check("gru_layer", "gru", x, h0, w_ih, w_hh, b_ih, b_hh)
    hidden = w_ih.shape[0] // 3
    return _unroll("gru_layer", linear(x, w_ih, b_ih), (h0,),
                   lambda xt, h: (_gru_step(xt, h, w_hh, b_hh, hidden),), reverse, max_steps)


@composite(example=_layer_example("lstm"))
def lstm_layer(x, h0, c0, w_ih, w_hh, b_ih=None, b_hh=None, w_hr=None, *, reverse=False,
               max_steps=None):
    """One direction of one LSTM layer over a (seq, batch, input) sequence: every step's h
    and c side by side, (seq, batch, out + hidden) with out the projection's size (hidden
    without one)."""
    _check_seq("lstm_layer", x)
    _check("lstm_layer", "lstm", x, h0, w_ih, w_hh, b_ih, b_hh, w_hr, c=c0)
    hidden = w_ih.shape[0] // 4
    return _unroll("lstm_layer", linear(x, w_ih, b_ih), (h0, c0),
                   lambda xt, h, c: _lstm_step(xt, h, c, w_hh, b_hh, w_hr, hidden),
                   reverse, max_steps)


# ---------------------------------------------------------------------------- whole modules
def lstm_cell_states(state: Node) -> tuple[Node, Node]:
    """``lstm_cell``'s value as torch's (h, c)."""
    return state[0], state[1]


def _last(seq_values: Node, reverse: bool) -> Node:
    """The final state of a direction: the last position's value (the first's reversed)."""
    n = seq_values.shape[0]
    if reverse:
        return tg.squeeze(tg.slice_axis(seq_values, 0, 0, 1), 0)
    return tg.squeeze(tg.slice_axis(seq_values, 0, n - 1, n), 0)


def _layers(op: str, kind: str, x: Node, hx: Sequence[Node], params: Sequence[Node], *,
            has_biases: bool, num_layers: int, bidirectional: bool, batch_first: bool,
            nonlinearity: str, max_steps):
    """torch's multi-layer, optionally bidirectional recurrence over its flat weight list
    (per layer and direction: w_ih, w_hh, [b_ih, b_hh], [w_hr]); returns the output and the
    final states, one (layers*directions, batch, size) tensor per state."""
    x = tg.as_node(x)
    if x.ndim != 3:
        raise ShapeError(f"{op}: the input must be 3-D ((seq, batch, features), or batch-first),"
                         f" got {format_shape(x.shape)}; unsqueeze an unbatched input")
    dirs = 2 if bidirectional else 1
    per = len(params) // (num_layers * dirs) if num_layers * dirs else 0
    base = 4 if has_biases else 2
    if num_layers < 1 or per * num_layers * dirs != len(params) or per not in (base, base + 1) \
            or (per == base + 1 and kind != "lstm"):
        raise ArgumentError(f"{op}: {len(params)} weights do not make {num_layers} layer(s) of "
                            f"{dirs} direction(s) with{'' if has_biases else 'out'} biases "
                            "(torch's flat order: w_ih, w_hh, b_ih, b_hh[, w_hr] per layer "
                            "and direction)")
    if batch_first:
        x = tg.transpose(x, 0, 1)
    states = [list(hx)] if kind != "lstm" else [[hx[0]], [hx[1]]]
    finals: list[list[Node]] = [[] for _ in states]
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            k = layer * dirs + d
            w = list(params[k * per:(k + 1) * per])
            w_ih, w_hh = w[0], w[1]
            b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
            w_hr = w[base] if per == base + 1 else None
            init = [tg.squeeze(tg.slice_axis(s[0], 0, k, k + 1), 0) for s in states]
            reverse = d == 1
            if kind == "lstm":
                values = lstm_layer(x, *init, w_ih, w_hh, b_ih, b_hh, w_hr, reverse=reverse,
                                    max_steps=max_steps)
                width = init[0].shape[-1]
                out = tg.slice_axis(values, -1, 0, width)
                last = _last(values, reverse)
                finals[0].append(tg.slice_axis(last, -1, 0, width))
                finals[1].append(tg.slice_axis(last, -1, width, None))
            else:
                if kind == "rnn":
                    out = rnn_layer(x, *init, w_ih, w_hh, b_ih, b_hh, nonlinearity=nonlinearity,
                                    reverse=reverse, max_steps=max_steps)
                else:
                    out = gru_layer(x, *init, w_ih, w_hh, b_ih, b_hh, reverse=reverse,
                                    max_steps=max_steps)
                finals[0].append(_last(out, reverse))
            outs.append(out)
        x = tg.concat(outs, axis=-1) if dirs > 1 else outs[0]
    if batch_first:
        x = tg.transpose(x, 0, 1)
    stacked = tuple(tg.concat([tg.unsqueeze(f, 0) for f in fs], axis=0) for fs in finals)
    return x, stacked


def _gate_rows(op: str, params: Sequence, gates: int) -> int:
    """The hidden size from the first w_ih (gates*hidden rows), before anything else reads
    the flat list."""
    if not params or tg.as_node(params[0]).ndim != 2:
        raise ArgumentError(f"{op}: params must be torch's flat weight list (w_ih, w_hh, "
                            f"b_ih, b_hh per layer and direction; module._flat_weights), got "
                            f"{len(params)} tensor(s)")
    return tg.as_node(params[0]).shape[0] // gates


def _initial(op: str, x: Node, h0, size: int, n: int, batch_first: bool, what: str) -> Node:
    """The given initial state, checked, or torch's default of zeros."""
    x = tg.as_node(x)
    batch = x.shape[0 if batch_first else 1] if x.ndim == 3 else 1
    if h0 is None:
        return tg.expand(tg.constant(0.0, x.dtype), (n, batch, size))
    h0 = tg.as_node(h0)
    if h0.ndim != 3 or not dims_equal(h0.shape[0], n) or not dims_equal(h0.shape[2], size):
        raise ShapeError(f"{op}: {what} must have shape ({n}, batch, {size}) (layers * "
                         f"directions, batch, size), got {format_shape(h0.shape)}")
    return h0


def rnn(x, params: Sequence[Node], h0=None, *, num_layers: int = 1, has_biases: bool = True,
        bidirectional: bool = False, batch_first: bool = False,
        nonlinearity: str = "tanh", max_steps: int | None = None) -> tuple[Node, Node]:
    """torch.nn.RNN over ``params`` in torch's flat order (``module._flat_weights``):
    (output, h_n). A symbolic sequence length needs ``max_steps`` (see the module doc)."""
    hidden = _gate_rows("rnn", params, 1)
    h0 = _initial("rnn", x, h0, hidden, num_layers * (2 if bidirectional else 1), batch_first,
                  "h0")
    out, (h_n,) = _layers("rnn", "rnn", x, [h0], params, has_biases=has_biases,
                          num_layers=num_layers, bidirectional=bidirectional,
                          batch_first=batch_first, nonlinearity=nonlinearity,
                          max_steps=max_steps)
    return out, h_n


def gru(x, params: Sequence[Node], h0=None, *, num_layers: int = 1, has_biases: bool = True,
        bidirectional: bool = False, batch_first: bool = False,
        max_steps: int | None = None) -> tuple[Node, Node]:
    """torch.nn.GRU over ``params`` in torch's flat order: (output, h_n)."""
    hidden = _gate_rows("gru", params, 3)
    h0 = _initial("gru", x, h0, hidden, num_layers * (2 if bidirectional else 1), batch_first,
                  "h0")
    out, (h_n,) = _layers("gru", "gru", x, [h0], params, has_biases=has_biases,
                          num_layers=num_layers, bidirectional=bidirectional,
                          batch_first=batch_first, nonlinearity="tanh", max_steps=max_steps)
    return out, h_n


def lstm(x, params: Sequence[Node], h0=None, c0=None, *, num_layers: int = 1,
         has_biases: bool = True, bidirectional: bool = False, batch_first: bool = False,
         max_steps: int | None = None) -> tuple[Node, tuple[Node, Node]]:
    """torch.nn.LSTM over ``params`` in torch's flat order (a ``w_hr`` after each layer's
    weights makes it a projected LSTM, torch's ``proj_size``): (output, (h_n, c_n))."""
    hidden = _gate_rows("lstm", params, 4)
    n = num_layers * (2 if bidirectional else 1)
    base = 4 if has_biases else 2
    per = len(params) // n if n else 0
    out_size = tg.as_node(params[base]).shape[0] if per == base + 1 else hidden
    h0 = _initial("lstm", x, h0, out_size, n, batch_first, "h0")
    c0 = _initial("lstm", x, c0, hidden, n, batch_first, "c0")
    out, (h_n, c_n) = _layers("lstm", "lstm", x, [h0, c0], params, has_biases=has_biases,
                              num_layers=num_layers, bidirectional=bidirectional,
                              batch_first=batch_first, nonlinearity="tanh",
                              max_steps=max_steps)
    return out, (h_n, c_n)
