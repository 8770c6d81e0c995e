"""torch.compile(model, backend="tensor_graphs"): Dynamo's graphs planned and run as our
programs, compared with eager torch on the same weights (one error measure, 1e-4)."""

import contextlib
import warnings
from importlib.metadata import entry_points

import pytest

import tensor_graphs  # noqa: F401  (before torch: its thread pools start quiet)

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402,N812

from tensor_graphs.db import Database  # noqa: E402
from tensor_graphs.errors import ArgumentError, TensorGraphsError  # noqa: E402
from tensor_graphs.frontend.aten import UnsupportedOpError  # noqa: E402
from tensor_graphs.frontend.dynamo import (  # noqa: E402
    EagerFallbackWarning,
    tensor_graphs_backend,
)
from tests.frontend.dynamo_spy import Spy, err, fresh_dynamo  # noqa: E402, F401

TOL = 1e-4
OPTIONS = {"db": ":memory:"}


@contextlib.contextmanager
def _no_fallback():
    """A graph our backend cannot take fails the test (the warning becomes an error)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)
        yield


class Block(nn.Module):
    """A pre-norm transformer block in plain torch."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


# ---------------------------------------------------------------------------- registration
def test_entry_point_resolves():
    names = {ep.name: ep for ep in entry_points(group="torch_dynamo_backends")}
    assert "tensor_graphs" in names, "reinstall: pip install -e . (the entry point is new)"
    assert names["tensor_graphs"].load() is tensor_graphs_backend
    assert "tensor_graphs" in torch._dynamo.list_backends()
    assert torch._dynamo.lookup_backend("tensor_graphs") is tensor_graphs_backend


def test_backend_by_name_matches_eager():
    torch.manual_seed(0)
    m = Block().eval()
    x = torch.randn(2, 7, 32)
    compiled = torch.compile(m, backend="tensor_graphs", options=OPTIONS)
    with _no_fallback(), torch.no_grad():
        got = compiled(x)
        ref = m(x)
    assert err(got, ref) <= TOL


def test_a_bfloat16_model_returns_bfloat16_tensors():
    """Outputs go back to torch through the one numpy -> torch conversion, which carries
    bfloat16 (ml_dtypes in numpy). Before, torch.from_numpy raised TypeError on every call of
    a bfloat16 model: the user's torch.compile failed because of us."""
    torch.manual_seed(0)
    m = Block().to(torch.bfloat16).eval()
    x = torch.randn(2, 7, 32, dtype=torch.bfloat16)
    spy = Spy()
    compiled = torch.compile(m, backend=spy, options=OPTIONS)
    with _no_fallback(), torch.no_grad():
        got = compiled(x)
        ref = m(x)
    assert spy.ours and spy.ours[0].calls == 1  # our program ran, not eager torch
    assert got.dtype == torch.bfloat16 and got.shape == ref.shape
    assert err(got, ref) <= 2e-2  # bfloat16's 8 bits of mantissa, rounded differently


# ---------------------------------------------------------------------------- graph breaks
class Broken(nn.Module):
    """Two regions with a graph break between (the print runs in Python, between them)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = Block(), Block()

    def forward(self, x):
        h = self.a(x)
        print("between the blocks")
        return self.b(h).softmax(-1)


def test_graph_break_runs_each_piece_as_our_program(capsys):
    torch.manual_seed(0)
    m = Broken().eval()
    spy = Spy()
    compiled = torch.compile(m, backend=spy, options=OPTIONS)
    x = torch.randn(2, 5, 32)
    with _no_fallback(), torch.no_grad():
        got = compiled(x)
        again = compiled(x + 1)
        ref, ref_again = m(x), m(x + 1)
    assert "between the blocks" in capsys.readouterr().out  # eager Python between our programs
    assert len(spy.made) == 2 and len(spy.ours) == 2  # one program per piece
    assert all(p.calls == 2 for p in spy.ours)
    assert err(got, ref) <= TOL and err(again, ref_again) <= TOL


class PrintsShape(nn.Module):
    """A graph break that reads a shape: Dynamo's first graph returns the size too."""

    def __init__(self):
        super().__init__()
        self.a, self.b = Block(), Block()

    def forward(self, x):
        h = self.a(x)
        print("length", h.shape[1])
        return self.b(h)


def test_a_graph_returning_a_symbolic_size_runs_as_our_program(capsys):
    """At a second length Dynamo makes the size symbolic, and the graph before the break
    returns it for the Python after. Before, such a graph ran in eager torch with a warning
    ("the graph returns the symbolic size s77"): any shape read after a break did that."""
    torch.manual_seed(0)
    m = PrintsShape().eval()
    spy = Spy()
    compiled = torch.compile(m, backend=spy, options=OPTIONS)
    with _no_fallback(), torch.no_grad():
        for n in (5, 9, 12):
            x = torch.randn(2, n, 32)
            assert err(compiled(x), m(x)) <= TOL, n
    assert "length 9" in capsys.readouterr().out
    assert spy.made and len(spy.ours) == len(spy.made)
    assert sum(p.calls for p in spy.ours) == 2 * 3


# ---------------------------------------------------------------------------- dynamic shapes
def test_dynamic_lengths_replan_only_past_the_bound():
    torch.manual_seed(0)
    m = Block().eval()
    spy = Spy()
    compiled = torch.compile(m, backend=spy, options=OPTIONS)
    with _no_fallback(), torch.no_grad():
        for n in (8, 13, 21, 100):
            x = torch.randn(2, n, 32)
            assert err(compiled(x), m(x)) <= TOL, n
    # Dynamo: the first length static, the second a recompile with a symbolic length
    assert len(spy.ours) == 2
    static, dynamic = spy.ours
    assert static.bounds == {} and static.calls == 1
    assert dynamic.calls == 3
    # 13 planned with the bound 64, 21 replayed from that plan, 100 past it: one more plan
    assert dynamic.compiles == 2 and list(dynamic.bounds.values()) == [256]
    assert dynamic.program.stats["planner_runs"] == 1


def test_dynamic_true_one_graph_and_a_fixed_bound():
    torch.manual_seed(0)
    m = Block().eval()
    spy = Spy()
    compiled = torch.compile(m, backend=spy, dynamic=True, options={**OPTIONS, "bound": 40})
    with _no_fallback(), torch.no_grad():
        for n in (6, 11, 40):
            x = torch.randn(3, n, 32)
            assert err(compiled(x), m(x)) <= TOL, n
    (prog,) = spy.ours
    assert prog.compiles == 1 and prog.calls == 3
    assert set(prog.bounds.values()) == {40}
    assert prog.program.stats["planner_runs"] == 1  # every length replays one plan


def test_options_reach_the_planner(tmp_path):
    """profile="missing" measures what the plan lacks into the database the options name."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16)).eval()
    path = tmp_path / "measured.sqlite"
    spy = Spy()
    compiled = torch.compile(m, backend=spy, options={"db": str(path), "profile": "missing",
                                                      "tolerance": 1e-3})
    x = torch.randn(4, 16)
    with _no_fallback(), torch.no_grad():
        assert err(compiled(x), m(x)) <= TOL
    (prog,) = spy.ours
    assert prog.program.stats["measured"] > 0
    assert Database(str(path)).rows()  # the rows landed in that file


@pytest.mark.parametrize("mode, measures", [("max-autotune", True), ("default", False)])
def test_torch_compile_mode_picks_the_profile(tmp_path, monkeypatch, mode, measures):
    """torch.compile takes a mode or options, not both: the mode alone picks the profile
    (the database is then $TG_DB's)."""
    monkeypatch.setenv("TG_DB", str(tmp_path / "db.sqlite"))  # empty: nothing measured yet
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.Tanh()).eval()
    spy = Spy()
    compiled = torch.compile(m, backend=spy, mode=mode)
    x = torch.randn(4, 16)
    with _no_fallback(), torch.no_grad():
        assert err(compiled(x), m(x)) <= TOL
    assert (spy.ours[0].program.stats["measured"] > 0) == measures


def test_numbers_dynamo_passes_as_tensors_are_the_values_of_the_call():
    """dynamic=True passes a norm's eps as a 0-d tensor read with .item(); the program takes
    it as the constant it is, so a large eps (visible in the result) must be the one used.
    Dynamo guards on the attribute, so a changed eps is a new graph, never the old plan."""
    torch.manual_seed(0)
    m = Block().eval()
    spy = Spy()
    compiled = torch.compile(m, backend=spy, dynamic=True, options=OPTIONS)
    x = torch.randn(2, 5, 32)
    with _no_fallback(), torch.no_grad():
        for eps in (0.5, 2.0):
            m.ln1.eps = eps
            assert err(compiled(x), m(x)) <= TOL, eps
    assert len(spy.ours) == 2 and [p.calls for p in spy.ours] == [1, 1]
    assert all(p._scalars for p in spy.ours)  # the eps came as a number, not a weight


# ---------------------------------------------------------------------------- fallbacks
class Bessel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.special.bessel_j0(self.fc(x))


def test_unmapped_op_falls_back_to_eager_with_a_warning():
    torch.manual_seed(0)
    m = Bessel().eval()
    x = torch.randn(4, 8)
    compiled = torch.compile(m, backend="tensor_graphs", options=OPTIONS)
    with pytest.warns(EagerFallbackWarning, match="bessel_j0") as record, torch.no_grad():
        got = compiled(x)
    (warned,) = [w for w in record if w.category is EagerFallbackWarning]
    assert "'fallback': False" in str(warned.message)  # names the option that raises instead
    with torch.no_grad():
        assert err(got, m(x)) == 0  # eager torch ran it


class Writes(nn.Module):
    """Writes an argument and its own counter in place: side effects the caller sees."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x, buf):
        buf[1:].add_(x[1:])  # through a view
        self.count.add_(1)
        return buf * 2 + self.count


def test_in_place_writes_to_inputs_and_buffers_run_eagerly():
    x = torch.randn(3)
    m, twin = Writes(), Writes()
    compiled = torch.compile(m, backend="tensor_graphs", options=OPTIONS)
    bufs, twin_bufs = [torch.zeros(3) for _ in range(2)], [torch.zeros(3) for _ in range(2)]
    with pytest.warns(EagerFallbackWarning, match="writes its inputs in place"), \
            torch.no_grad():
        got = [compiled(x, b) for b in bufs]
    with torch.no_grad():
        ref = [twin(x, b) for b in twin_bufs]
    for g, r, b, tb in zip(got, ref, bufs, twin_bufs):
        assert torch.equal(g, r) and torch.equal(b, tb)  # the writes happened, as in eager
    assert torch.equal(m.count, torch.full((3,), 2.0))


def test_fallback_false_raises_the_import_error():
    m = Bessel().eval()
    compiled = torch.compile(m, backend="tensor_graphs", options={**OPTIONS, "fallback": False})
    with pytest.raises(Exception) as info, torch.no_grad():  # noqa: B017  (Dynamo wraps it)
        compiled(torch.randn(4, 8))
    chain, exc = [], info.value
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__ or getattr(exc, "inner_exception", None)
    found = [e for e in chain if isinstance(e, UnsupportedOpError)]
    assert found and "bessel_j0" in str(found[0])


def test_gradients_fall_back_to_eager():
    torch.manual_seed(0)
    m = Block().eval()
    x = torch.randn(2, 5, 32)
    compiled = torch.compile(m, backend="tensor_graphs", options=OPTIONS)
    with pytest.warns(EagerFallbackWarning, match="no_grad"):
        got = compiled(x)  # grad mode on, parameters require grad
    got.sum().backward()  # eager torch ran: the graph still trains
    assert m.fc.weight.grad is not None


def test_unknown_option_is_named():
    m = Block().eval()
    compiled = torch.compile(m, backend="tensor_graphs", options={"tolerence": 1e-3})
    with pytest.raises(Exception) as info, torch.no_grad():  # noqa: B017  (Dynamo wraps it)
        compiled(torch.randn(2, 5, 32))
    cause = info.value
    while cause is not None and not isinstance(cause, TensorGraphsError):
        cause = cause.__cause__ or getattr(cause, "inner_exception", None)
    assert isinstance(cause, ArgumentError) and "tolerence" in str(cause)
    assert "tolerance" in str(cause)  # and lists the options there are


def test_parameters_changed_in_place_are_seen():
    torch.manual_seed(0)
    m = Block().eval()
    x = torch.randn(2, 5, 32)
    compiled = torch.compile(m, backend="tensor_graphs", options=OPTIONS)
    with _no_fallback(), torch.no_grad():
        compiled(x)
        m.fc.weight.mul_(2.0)  # bound once; the in-place change must reach the program
        assert err(compiled(x), m(x)) <= TOL


# ---------------------------------------------------------------------------- real models
def _gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000,
                                  n_positions=64, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.mark.slow
def test_gpt2_two_layers_default_forward_matches_eager():
    model = _gpt2()
    spy = Spy()
    compiled = torch.compile(model, backend=spy, options=OPTIONS)
    with _no_fallback(), torch.no_grad():
        for n in (9, 14):
            ids = torch.randint(0, 1000, (1, n))
            got, ref = compiled(ids), model(ids)  # default forward: use_cache=True
            assert err(got.logits, ref.logits) <= TOL, n
            # the cache the forward returns: tensors our program computed
            layers = list(zip(got.past_key_values.layers, ref.past_key_values.layers))
            assert len(layers) == 2
            for g, r in layers:
                assert err(g.keys, r.keys) <= TOL and err(g.values, r.values) <= TOL
    assert spy.ours and all(p.calls for p in spy.ours)


@pytest.mark.slow
def test_gpt2_generate_greedy_tokens_match_eager():
    model = _gpt2()
    ids = torch.randint(1, 1000, (1, 7))
    kwargs = dict(max_new_tokens=8, do_sample=False, attention_mask=torch.ones_like(ids),
                  pad_token_id=0)
    ref = model.generate(ids, **kwargs)
    spy = Spy()
    model.forward = torch.compile(model.forward, backend=spy, options=OPTIONS)
    with _no_fallback():
        got = model.generate(ids, **kwargs)
    assert got.tolist() == ref.tolist()
    # prefill, the first decode step, and one graph of symbolic cache length for the rest
    assert sum(p.calls for p in spy.ours) == 8
    assert max(p.compiles for p in spy.ours) == 1  # the cache stayed inside the first bound
    assert [p.program.stats["planner_runs"] for p in spy.ours] == [1, 1, 1]  # not per token


@pytest.mark.slow
def test_llama_generate_of_a_left_padded_batch_runs_our_programs():
    """Llama's decode graph for a left-padded batch holds a size guard that export's solver
    cannot prove over the cache length's range (``min(16 + 16 s, 32 + 32 s) == 16 + 16 s``)
    and a ``torch.sym_sum`` of sizes: every decode step ran in eager torch with a warning.
    After such a refusal the dims are left to export (``Dim.AUTO``), and sym_sum maps."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, vocab_size=97, hidden_size=64,
                                   intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64,
                                   pad_token_id=0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(1, 97, (2, 7))
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0  # the second prompt is 3 tokens shorter, padded left
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    ref = model.generate(ids, **kwargs)
    spy = Spy()
    model.forward = torch.compile(model.forward, backend=spy, options=OPTIONS)
    with _no_fallback():
        got = model.generate(ids, **kwargs)
    assert got.tolist() == ref.tolist()
    assert sum(p.calls for p in spy.ours) == 6  # the prefill and every decode step: ours


@pytest.mark.slow
def test_minilm_shaped_bert_matches_eager():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=1000, hidden_size=384, num_hidden_layers=6,
                                  num_attention_heads=12, intermediate_size=1536,
                                  max_position_embeddings=128)
    model = transformers.BertModel(cfg).eval()
    spy = Spy()
    compiled = torch.compile(model, backend=spy, options=OPTIONS)
    ids = torch.randint(0, 1000, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # padded like a batch of sentences
    with _no_fallback(), torch.no_grad():
        got = compiled(input_ids=ids, attention_mask=mask)
        ref = model(input_ids=ids, attention_mask=mask)
    assert err(got.last_hidden_state, ref.last_hidden_state) <= TOL
    assert err(got.pooler_output, ref.pooler_output) <= TOL
    assert spy.ours and all(p.calls == 1 for p in spy.ours)
