"""tg.from_torch's keyword inputs and the program's keyword calls.

A module's keyword inputs are given as torch.export's ``kwargs=`` (an attention mask,
``use_cache=False``), their dims named in ``dynamic_shapes`` like the positional ones; the
program binds a call's arguments to the forward's parameters as Python would, whichever way
the example gave them. An option neither from_torch nor tg.compile takes (a module input
given as ``attention_mask=m``) is refused before the export, which takes minutes on a large
model (it was compile's raw TypeError once export and import had run)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.frontend import torch_export  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

TOL = 1e-5


class Masked(nn.Module):
    """x and an optional mask, a scale given by name: a forward with keyword inputs."""

    def __init__(self, d=8):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x, mask=None, scale=1.0):
        y = self.fc(x) * scale
        return y if mask is None else y * mask.unsqueeze(-1)


def _masked_inputs(n=6):
    torch.manual_seed(0)
    x = torch.randn(2, n, 8)
    mask = torch.ones(2, n)
    mask[1, n // 2:] = 0
    return x, mask


def test_an_unknown_option_is_refused_before_the_export(monkeypatch):
    """Checked against tg.compile's own options (``compiler.compile_options``), whatever
    stands in ``compiler.compile`` (here one that takes any keyword)."""
    from tensor_graphs import compiler

    def no_export(*args, **kwargs):
        raise AssertionError("exported before the options were checked")

    monkeypatch.setattr(torch_export, "_export", no_export)
    monkeypatch.setattr(compiler, "compile", no_export)
    x, mask = _masked_inputs()
    with pytest.raises(tg.ArgumentError) as info:
        tg.from_torch(Masked(), (x,), attention_mask=mask, mask=mask, db=":memory:")
    message = str(info.value)
    assert "unknown option(s) attention_mask, mask" in message
    # the forward's own parameter: an input, given in the wrong place
    assert "mask: a parameter of Masked.forward" in message and "kwargs={'mask': ...}" in message
    assert "kwargs" in message and "tolerance" in message and "db" in message  # the accepted
    with pytest.raises(tg.ArgumentError, match="tolerence: did you mean tolerance="):
        tg.from_torch(Masked(), (x,), tolerence=1e-3)
    with pytest.raises(tg.ArgumentError, match="loss_fn: an option of .*train=True"):
        tg.from_torch(Masked(), (x,), loss_fn=torch.nn.functional.mse_loss)
    with pytest.raises(tg.ArgumentError, match="dict of parameter name"):
        tg.from_torch(Masked(), (x,), kwargs=[mask])
    with pytest.raises(tg.ArgumentError, match="do not fit Masked.forward.*multiple values"):
        tg.from_torch(Masked(), (x, mask), kwargs={"mask": mask})


def test_keyword_inputs_export_with_their_dims_and_run_as_torch_runs_them():
    m = Masked().eval()
    x, mask = _masked_inputs()
    seq = torch.export.Dim("seq", max=16)
    # a dict of dims names the keyword input too; "scale", left out, is static
    prog = tg.from_torch(m, (x,), {"x": {1: seq}, "mask": {1: seq}},
                         kwargs={"mask": mask, "scale": 2.0}, db=":memory:")
    assert [leaf.name for leaf in prog._inputs[:2]] == ["x", "mask"]
    assert str(prog._inputs[1].shape[1]) == "seq"  # the Dim's name, on the keyword input
    for n in (6, 11):
        x, mask = _masked_inputs(n)
        with torch.no_grad():
            ref = m(x, mask=mask, scale=2.0).numpy()
        # by name, by position, the constant repeated or left out: the same program
        for got in (prog(x, mask=mask), prog(x, mask), prog(x=x, mask=mask, scale=2.0),
                    prog(mask=mask.numpy(), x=x.numpy())):
            assert relative_error(got, ref) <= TOL
    with pytest.raises(tg.ArgumentError, match="'scale' was 2.0 when the module was exported"):
        prog(x, mask=mask, scale=3.0)
    with pytest.raises(tg.ArgumentError, match=r"missing argument\(s\) 'mask'.*\(x, \*, mask, "
                                               r"scale=2.0\)"):
        prog(x)


class Pair(nn.Module):
    def forward(self, ids, mask, /, bias=None):
        out = ids.float() * mask
        return out if bias is None else out + bias


def test_the_program_binds_keywords_to_the_forward_as_python_does():
    m = Pair()
    ids, mask = torch.arange(6).reshape(2, 3), torch.ones(2, 3)
    prog = tg.from_torch(m, (ids, mask), db=":memory:")
    np.testing.assert_array_equal(prog(ids, mask), m(ids, mask).numpy())
    with pytest.raises(tg.ArgumentError, match="'ids' is positional-only in Pair.forward"):
        prog(ids=ids, mask=mask)
    with pytest.raises(tg.ArgumentError, match=r"'bias'\) was not given when Pair.forward was "
                                               r"exported.*kwargs=\{'bias': \.\.\.\}"):
        prog(ids, mask, torch.zeros(2, 3))
    with pytest.raises(tg.ArgumentError, match="Pair.forward has no parameter 'extra'"):
        prog(ids, mask, extra=1)


def test_a_program_exported_on_positions_takes_names():
    class Out(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, input_ids, attention_mask):
            return self.fc(input_ids) * attention_mask

    m = Out().eval()
    x, mask = torch.randn(2, 4), torch.ones(2, 1)
    prog = tg.from_torch(m, (x, mask), db=":memory:")
    with torch.no_grad():
        ref = m(x, mask).numpy()
    assert relative_error(prog(input_ids=x, attention_mask=mask), ref) <= TOL
    assert relative_error(prog(x, attention_mask=mask), ref) <= TOL
    with pytest.raises(tg.ArgumentError, match="multiple values for argument 'input_ids'"):
        prog(x, input_ids=x, attention_mask=mask)
    with pytest.raises(tg.ArgumentError, match=r"missing argument\(s\) 'attention_mask'"):
        prog(input_ids=x)
    with pytest.raises(tg.ArgumentError, match="Out.forward has no parameter 'mask'"):
        prog(x, mask=mask)
    with pytest.raises(tg.ShapeError, match="'attention_mask' has shape"):
        prog(x, attention_mask=torch.ones(3, 1))


class Cached(nn.Module):
    """GPT-2's order: the cache second, the mask after it."""

    def forward(self, ids, cache=None, mask=None):
        start = cache.get_seq_length() if cache is not None else 0
        return ids + start if mask is None else (ids + start) * mask


class Nested(nn.Module):
    """Keyword inputs holding a dict and a list of tensors (PixArt's added_cond_kwargs)."""

    def forward(self, x, extra=None, pair=None):
        return x * extra["a"].sum() + extra["b"].mean() + pair[0].sum() * pair[1].sum()


def test_a_dict_or_list_argument_left_out_of_dynamic_shapes_stays_static():
    """A dynamic_shapes dict naming only x: the dict and list arguments were filled in as
    None, which torch.export refuses for a container ("is a dict, but dynamic_shapes[...]
    is not"); they are now static in their own structure."""
    torch.manual_seed(0)
    extra = {"a": torch.randn(2), "b": torch.randn(5)}
    pair = [torch.randn(2), torch.randn(3)]
    batch = torch.export.Dim("batch", max=16)
    prog = tg.from_torch(Nested(), (torch.randn(3, 4),), {"x": {0: batch}},
                         kwargs={"extra": extra, "pair": pair}, db=":memory:")
    for n in (1, 7):
        x = torch.randn(n, 4)
        ref = Nested()(x, extra, pair).numpy()
        assert relative_error(prog(x, extra=extra, pair=pair), ref) <= TOL


def test_a_failed_export_says_where_the_positional_examples_went():
    ids = torch.arange(6).reshape(2, 3)
    with pytest.raises(AttributeError, match="get_seq_length") as info:
        tg.from_torch(Cached(), (ids, torch.ones_like(ids)), db=":memory:")
    notes = "\n".join(getattr(info.value, "__notes__", ()))
    assert "example_args bound to Cached.forward as ids=a Tensor of shape (2, 3) " \
           "torch.int64, cache=a Tensor of shape (2, 3)" in notes
    assert "kwargs={'attention_mask': mask}" in notes
    prog = tg.from_torch(Cached(), (ids,), kwargs={"mask": torch.ones_like(ids)}, db=":memory:")
    np.testing.assert_array_equal(prog(ids, mask=torch.ones_like(ids) * 2), ids.numpy() * 2)


transformers = pytest.importorskip("transformers")


def _padded(vocab, n=10):
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (2, n))
    mask = torch.ones(2, n, dtype=torch.int64)
    mask[1, n - 4:] = 0
    return ids, mask


def test_bert_takes_its_attention_mask_by_name():
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                  intermediate_size=64, vocab_size=97)
    model = transformers.BertModel(cfg).eval()
    ids, mask = _padded(97)
    seq = torch.export.Dim("seq", max=16)
    prog = tg.from_torch(model, (), {"input_ids": {1: seq}, "attention_mask": {1: seq}},
                         kwargs={"input_ids": ids, "attention_mask": mask}, db=":memory:")
    for n in (10, 13):
        ids, mask = _padded(97, n)
        with torch.no_grad():
            ref = model(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
        for got in (prog(input_ids=ids, attention_mask=mask), prog(ids, mask),
                    prog(ids, attention_mask=mask)):
            assert relative_error(got["last_hidden_state"], ref) <= TOL


def test_gpt2_exports_with_its_cache_by_default_and_without_it_when_told():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=97, n_positions=32)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids, mask = _padded(97)
    with torch.no_grad():
        ref = model(ids, attention_mask=mask)
    # the default use_cache=True: the logits and the DynamicCache, as the model returns them
    got = tg.from_torch(model, (ids,), kwargs={"attention_mask": mask},
                        db=":memory:")(ids, attention_mask=mask)
    assert isinstance(got.past_key_values, type(ref.past_key_values))
    assert relative_error(got.logits, ref.logits.numpy()) <= TOL
    prog = tg.from_torch(model, (ids,), kwargs={"attention_mask": mask, "use_cache": False},
                         db=":memory:")
    got = prog(ids, attention_mask=mask)
    assert list(got.keys()) == ["logits"]
    assert relative_error(got["logits"], ref.logits.numpy()) <= TOL
