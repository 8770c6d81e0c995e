"""torch.nn's recurrent layers (RNN tanh/relu, GRU, LSTM, their cells) through tg.from_torch
and the fluent builders (tg.lstm...): outputs and final states against torch eager in float32
(1e-5, the one error measure), through the planner; a symbolic sequence length unrolled to
max_steps and masked past the actual length; the refusals."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.frontend import from_torch  # noqa: E402
from tensor_graphs.frontend.aten import ATEN  # noqa: E402
from tensor_graphs.frontend.aten.common import UnsupportedOpError  # noqa: E402
from tensor_graphs.frontend.torch_export import import_exported  # noqa: E402
from tensor_graphs.ir.graph import nodes as graph_nodes  # noqa: E402
from tensor_graphs.ir.ops.names import (  # noqa: E402
    GRU_CELL,
    GRU_LAYER,
    LSTM_CELL,
    LSTM_LAYER,
    RNN_CELL,
    RNN_LAYER,
)
from tensor_graphs.numerics import relative_error  # noqa: E402

TOL = 1e-5

# torch's own warnings about its flat weights during export and its projected-LSTM kernel
pytestmark = [pytest.mark.filterwarnings("ignore:The tensor attributes"),
              pytest.mark.filterwarnings("ignore:LSTM with projections")]


def _flat(value) -> list:
    """(output, h_n) / (output, (h_n, c_n)) / (h, c) / h as a list of arrays."""
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _flat(v)]
    return [value.detach().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)]


def _check(module, *args, dynamic_shapes=None, runs=()):
    """Import, compile (the planner) and compare every output and final state with eager, on
    the example and on ``runs`` (other argument tuples, for a dynamic batch)."""
    module.eval()
    prog = from_torch(module, args, dynamic_shapes)
    for call in (args, *runs):
        got = _flat(prog(*call))
        with torch.no_grad():
            ref = _flat(module(*call))
        assert len(got) == len(ref)
        for g, r in zip(got, ref):
            assert g.shape == r.shape
            assert relative_error(g, r) <= TOL, relative_error(g, r)
    return prog


def _ops(module, *args) -> set[str]:
    """The ops of the imported graph (before planning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.export.export(module.eval(), args)
    outputs, *_ = import_exported(exported)
    return {n.op.name for n in graph_nodes([o for o in outputs if isinstance(o, tg.Node)])}


CONFIGS = [  # (module, input shape, initial states given)
    ("LSTM", dict(), (7, 2, 4), False),
    ("LSTM", dict(num_layers=2, bidirectional=True, batch_first=True), (2, 6, 4), True),
    ("LSTM", dict(proj_size=3, bias=False), (5, 3, 4), True),
    ("LSTM", dict(num_layers=3, dropout=0.5, proj_size=2), (4, 2, 4), False),
    ("GRU", dict(num_layers=2, bias=False), (6, 2, 4), True),
    ("GRU", dict(bidirectional=True, batch_first=True), (3, 5, 4), False),
    ("RNN", dict(num_layers=2, dropout=0.3), (5, 2, 4), False),
    ("RNN", dict(nonlinearity="relu", bidirectional=True, num_layers=2), (6, 3, 4), True),
]


def _states(layer, x):
    n = layer.num_layers * (2 if layer.bidirectional else 1)
    batch = x.shape[0 if layer.batch_first else 1]
    out = getattr(layer, "proj_size", 0) or layer.hidden_size
    h0 = torch.randn(n, batch, out)
    if isinstance(layer, nn.LSTM):
        return ((h0, torch.randn(n, batch, layer.hidden_size)),)
    return (h0,)


@pytest.mark.parametrize("kind,options,shape,given", CONFIGS,
                         ids=[f"{k}-{'-'.join(f'{a}={b}' for a, b in o.items()) or 'default'}"
                              f"{'-h0' if g else ''}" for k, o, _, g in CONFIGS])
def test_layer_matches_eager(kind, options, shape, given):
    torch.manual_seed(0)
    layer = getattr(nn, kind)(4, 5, **options)
    x = torch.randn(*shape)
    _check(layer, x, *(_states(layer, x) if given else ()))


def test_layers_map_whole_to_the_recurrent_composites():
    """Each direction of each layer is one *_layer composite (not torch's decomposition into
    a step-by-step graph): the graph says where the recurrence is, the input projection is
    one matmul per layer."""
    x = torch.randn(5, 2, 4)
    assert LSTM_LAYER in _ops(nn.LSTM(4, 5, bidirectional=True), x)
    assert GRU_LAYER in _ops(nn.GRU(4, 5), x)
    assert RNN_LAYER in _ops(nn.RNN(4, 5, nonlinearity="relu"), x)


def test_dynamic_batch():
    torch.manual_seed(0)
    layer = nn.LSTM(4, 5, num_layers=2, batch_first=True)
    batch = torch.export.Dim("batch", max=8)
    _check(layer, torch.randn(3, 6, 4), dynamic_shapes=({0: batch},),
           runs=[(torch.randn(1, 6, 4),), (torch.randn(8, 6, 4),)])


def test_unbatched_input():
    """The modules add the batch axis of one before the ATen op and take it off after."""
    torch.manual_seed(0)
    _check(nn.GRU(4, 5, num_layers=2), torch.randn(6, 4))
    _check(nn.LSTMCell(4, 5), torch.randn(4))


def test_planning_depth_does_not_grow_with_the_sequence():
    """The planner solves a layer's unrolled steps inputs first, not by recursing from the
    output back through every step: a bidirectional GRU of 20 steps, planned within 400
    frames of Python's stack, matches eager (it raised RecursionError at 16 steps, and a
    2-layer one of 32 steps at the default limit)."""
    import inspect
    import sys

    torch.manual_seed(0)
    layer = nn.GRU(2, 2, bidirectional=True, batch_first=True)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 400)
    try:
        _check(layer, torch.randn(1, 20, 2))
    finally:
        sys.setrecursionlimit(limit)


class _Tagger(nn.Module):
    """What a user writes: token ids -> embedding -> 2-layer bidirectional LSTM -> per-token
    class scores."""

    def __init__(self, vocab=20, dim=8, hidden=6, classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, num_layers=2, batch_first=True, bidirectional=True,
                            dropout=0.1)
        self.head = nn.Linear(2 * hidden, classes)

    def forward(self, ids):
        out, _ = self.lstm(self.embed(ids))
        return self.head(out)


def test_embedding_lstm_linear_model():
    torch.manual_seed(0)
    ids = torch.randint(0, 20, (2, 9))
    _check(_Tagger(), ids)


@pytest.mark.parametrize("cell,ops", [
    (lambda: nn.LSTMCell(4, 5), LSTM_CELL),
    (lambda: nn.GRUCell(4, 5, bias=False), GRU_CELL),
    (lambda: nn.RNNCell(4, 5, nonlinearity="relu"), RNN_CELL),
    (lambda: nn.RNNCell(4, 5), RNN_CELL),
], ids=["LSTMCell", "GRUCell-nobias", "RNNCell-relu", "RNNCell-tanh"])
def test_cells(cell, ops):
    torch.manual_seed(0)
    module = cell()
    x = torch.randn(3, 4)
    h = torch.randn(3, 5)
    state = ((h, torch.randn(3, 5)),) if isinstance(module, nn.LSTMCell) else (h,)
    _check(module, x, *state)
    _check(module, x)  # default zero state
    assert ops in _ops(module, x, *state)


# ---------------------------------------------------------------------------- refusals
def test_dropout_in_training_mode_is_refused():
    """torch's dropout between layers is random while training: an exported training-mode
    program is refused, naming the fix; in eval mode (above) it is skipped, as in torch."""
    layer = nn.LSTM(4, 5, num_layers=2, dropout=0.2).train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.export.export(layer, (torch.randn(3, 2, 4),))
    with pytest.raises(tg.ArgumentError, match=r"aten.lstm: nn.LSTM with dropout=0.2.*"
                                               r"module.eval\(\)"):
        from_torch(exported, (torch.randn(3, 2, 4),))


def test_torch_export_fixes_these_ops_sequence_length():
    """Why the importer's length is concrete: torch.export specializes it (a Dim on it is
    torch's own constraint violation). Should this start to export, the importer's refusal
    below becomes reachable, and the layer can be unrolled to the Dim's bound instead
    (the masked unrolling tg.lstm(max_steps=) does)."""
    from torch._dynamo.exc import UserError

    seq = torch.export.Dim("seq", max=16)
    with warnings.catch_warnings(), pytest.raises(UserError, match="specialized it to be a "
                                                                   "constant"):
        warnings.simplefilter("ignore")
        torch.export.export(nn.LSTM(4, 5).eval(), (torch.randn(7, 2, 4),),
                            dynamic_shapes=({0: seq},))


def test_symbolic_sequence_length_is_refused_by_the_importer():
    """torch.export specializes these ops' length today; a program that still carries a
    symbolic one is refused with the layer and the two fixes, not unrolled to a guess."""
    aten = torch.ops.aten
    x = tg.input("x", ("seq", 2, 4))
    zeros = tg.expand(tg.constant(0.0, "float32"), (1, 2, 5))
    params = [tg.weight("w_ih", (20, 4)), tg.weight("w_hh", (20, 5))]
    kwargs = dict(input=x, hx=[zeros, zeros], params=params, has_biases=False, num_layers=1,
                  dropout=0.0, train=False, bidirectional=False, batch_first=False)
    with pytest.raises(UnsupportedOpError, match=r"aten.lstm: nn.LSTM .*symbolic sequence "
                                                 r"length \(seq\).*static sequence length.*"
                                                 r"tg.lstm\(\.\.\., max_steps=N\)"):
        ATEN[aten.lstm.input]((), kwargs)


def test_symbolic_length_without_max_steps_is_refused():
    x = tg.input("x", ("seq", 2, 4))
    params = [tg.weight("w_ih", (15, 4)), tg.weight("w_hh", (15, 5))]
    with pytest.raises(tg.ShapeError, match="gru_layer: the sequence length seq is symbolic; "
                                            "give max_steps="):
        tg.gru(x, params, has_biases=False)


# ---------------------------------------------------------------------------- fluent builders
def _weights(layer):
    names = [f"w{i}" for i in range(len(layer._flat_weights))]
    nodes = [tg.weight(n, tuple(p.shape)) for n, p in zip(names, layer._flat_weights)]
    return nodes, {n: p.detach().numpy() for n, p in zip(names, layer._flat_weights)}


def test_fluent_lstm_over_a_symbolic_length_masks_past_the_length():
    """tg.lstm over a (seq, batch, 4) input unrolls to max_steps; the outputs and the final
    h and c are torch's for each actual length (shorter ones included), and a length past the
    compile bound is refused at the call."""
    torch.manual_seed(0)
    layer = nn.LSTM(4, 5, num_layers=2, bidirectional=True).eval()
    weights, values = _weights(layer)
    x = tg.input("x", ("seq", "batch", 4))
    out, (h, c) = tg.lstm(x, weights, num_layers=2, bidirectional=True, max_steps=6)
    assert out.shape[0] == x.shape[0]
    prog = tg.compile([out, h, c], bounds={"seq": 6, "batch": 3})
    prog.bind(**values)
    for seq in (1, 4, 6):
        X = torch.randn(seq, 3, 4)
        got = prog(x=X.numpy())
        with torch.no_grad():
            ref = _flat(layer(X))
        for g, r in zip(got, ref):
            assert g.shape == r.shape and relative_error(g, r) <= TOL
    with pytest.raises(tg.ShapeError, match="above the bounds"):
        prog(x=np.zeros((7, 3, 4), np.float32))


def test_fluent_gru_float64_is_exact():
    """The recurrence in float64 agrees with torch's float64 to rounding (a wrong gate order
    or bias placement would be off by O(1))."""
    torch.manual_seed(0)
    layer = nn.GRU(3, 4, num_layers=2, batch_first=True, bidirectional=True).double().eval()
    weights = [tg.weight(f"w{i}", tuple(p.shape), "float64")
               for i, p in enumerate(layer._flat_weights)]
    values = {f"w{i}": p.detach().numpy() for i, p in enumerate(layer._flat_weights)}
    X = torch.randn(2, 5, 3, dtype=torch.float64)
    out, h = tg.gru(tg.input("x", (2, 5, 3), "float64"), weights, num_layers=2,
                    bidirectional=True, batch_first=True)
    got = tg.evaluate([out, h], {"x": X.numpy(), **values})
    with torch.no_grad():
        ref = _flat(layer(X))
    for g, r in zip(got, ref):
        assert relative_error(g, r) <= 1e-12


def test_a_weight_list_torch_would_not_make_is_refused():
    x = tg.input("x", (3, 2, 4))
    three = [tg.weight("w_ih", (20, 4)), tg.weight("w_hh", (20, 5)), tg.weight("b_ih", (20,))]
    with pytest.raises(tg.ArgumentError, match=r"lstm: 3 weights do not make 1 layer\(s\) of "
                                               r"1 direction\(s\) with biases"):
        tg.lstm(x, three)
    with pytest.raises(tg.ArgumentError, match="rnn: params must be torch's flat weight list"):
        tg.rnn(x, [])


def test_a_state_of_another_batch_is_refused_not_broadcast():
    x = tg.input("x", (3, 2, 4))
    params = [tg.weight("w_ih", (5, 4)), tg.weight("w_hh", (5, 5))]
    with pytest.raises(tg.ShapeError, match=r"rnn_layer: h must have shape \(2, 5\)"):
        tg.rnn(x, params, tg.input("h0", (1, 1, 5)), has_biases=False)
