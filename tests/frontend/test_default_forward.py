"""transformers causal LMs called as users call them: default ``use_cache=True`` (a
``DynamicCache`` whose layers start from an empty 1-D tensor that ``aten.cat`` skips), an
attention mask, padded batches. A module that returns the logits only leaves the cache
tensors the forward builds out of the program's outputs; the model itself returns its cache,
a DynamicCache (an EncoderDecoderCache for T5) of torch tensors, as torch's does.

Also torch's legacy ``cat`` rule itself: 1-D size-0 tensors are skipped whatever the others'
rank, any other empty tensor must match as usual."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import ShapeError
from tensor_graphs.frontend.aten import lookup
from tensor_graphs.numerics import relative_error

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.frontend.causal_lm import Logits  # noqa: E402
from tests.frontend.causal_lm import masks as _masks  # noqa: E402

TOL = 1e-5
VOCAB = 97




def _check(model, lengths=(8, 13)) -> None:
    torch.manual_seed(0)
    wrapped = Logits(model.eval())
    seq = torch.export.Dim("seq", max=32)
    ids = torch.randint(0, VOCAB, (2, lengths[0]))
    prog = tg.from_torch(wrapped, (ids, torch.ones_like(ids)), ({1: seq}, {1: seq}),
                         db=":memory:")
    # the program computes the logits alone: no present keys/values leak into its outputs
    assert len(prog.program(ids=ids.numpy(), mask=torch.ones_like(ids).numpy())) == 1
    for n in lengths:
        ids = torch.randint(0, VOCAB, (2, n))
        for mask in _masks(2, n):
            with torch.no_grad():
                ref = wrapped(ids, mask).double().numpy()
            got = prog(ids, mask)
            assert isinstance(got, np.ndarray) and got.shape == ref.shape == (2, n, VOCAB)
            err = relative_error(got.astype(np.float64), ref)
            assert err < TOL, (n, mask.tolist(), err)


def test_gpt2_default_forward_with_mask_and_padding():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                                  n_positions=64, bos_token_id=0, eos_token_id=0)
    _check(transformers.GPT2LMHeadModel(cfg))


def test_qwen3_default_forward_with_mask_and_padding():
    cfg = transformers.Qwen3Config(num_hidden_layers=2, vocab_size=VOCAB, hidden_size=64,
                                   intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=64)
    _check(transformers.Qwen3ForCausalLM(cfg))


def test_llama_default_forward_with_mask_and_padding():
    cfg = transformers.LlamaConfig(num_hidden_layers=2, vocab_size=VOCAB, hidden_size=64,
                                   intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    _check(transformers.LlamaForCausalLM(cfg))


# ---------------------------------------------------------------------------- torch's cat rule
class CatAfterEmpty(torch.nn.Module):
    """What DynamicCache does: an empty 1-D tensor (here of another dtype) joined to a rank-3
    one on a negative axis."""

    def __init__(self, dtype):
        super().__init__()
        self.register_buffer("empty", torch.zeros(0, dtype=dtype))

    def forward(self, x):
        return torch.cat([self.empty, x, self.empty], dim=-2) * 2


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cat_skips_1d_empty_tensors_and_promotes_over_them(dtype):
    module = CatAfterEmpty(getattr(torch, dtype))
    x = torch.randn(2, 3, 4)
    prog = tg.from_torch(module, (x,), db=":memory:")
    ref = module(x)
    got = prog(x)
    assert got.dtype == np.dtype(dtype) and str(ref.dtype) == f"torch.{dtype}"
    assert got.shape == tuple(ref.shape) == (2, 3, 4)
    assert relative_error(got.astype(np.float64), ref.double().numpy()) < TOL


def test_cat_joins_other_empty_tensors_as_usual():
    cat = lookup(torch.ops.aten.cat.default)
    x = tg.input("x", (2, 3), "float32")
    assert cat((), {"tensors": [tg.input("e", (2, 0), "float32"), x], "dim": 1}).shape == (2, 3)
    assert cat((), {"tensors": [tg.input("z", (0, 3), "float32"), x], "dim": 0}).shape == (2, 3)
    with pytest.raises(ShapeError):  # an empty 2-D tensor is not skipped: ranks must match
        cat((), {"tensors": [tg.input("z", (0, 3), "float32"),
                             tg.input("y", (2, 3, 4), "float32")], "dim": 0})


def _gpt2(layers=2):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=32, n_head=2, vocab_size=VOCAB,
                                  n_positions=32, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _cache_tensors(cache) -> list:
    """A DynamicCache's (or an EncoderDecoderCache's) tensors, layer by layer."""
    caches = [cache.self_attention_cache, cache.cross_attention_cache] \
        if hasattr(cache, "cross_attention_cache") else [cache]
    return [t for c in caches for layer in c.layers for t in (layer.keys, layer.values)]


def _same_output(got, ref) -> None:
    """The model's output object, its cache included, as torch computes it."""
    assert type(got) is type(ref) and type(got.past_key_values) is type(ref.past_key_values)
    assert relative_error(got.logits.astype(np.float64), ref.logits.double().numpy()) < TOL
    mine, theirs = _cache_tensors(got.past_key_values), _cache_tensors(ref.past_key_values)
    assert len(mine) == len(theirs) > 0
    for a, b in zip(mine, theirs):
        assert isinstance(a, torch.Tensor) and a.shape == b.shape
        assert relative_error(a.double().numpy(), b.double().numpy()) < TOL


def test_a_causal_lm_called_with_its_defaults_returns_its_cache():
    """use_cache=True left alone: the program returns the logits and a DynamicCache that
    torch's model continues from, as from its own; the next call leaves it as it was."""
    model = _gpt2()
    ids = torch.randint(0, VOCAB, (1, 8))
    prog = tg.from_torch(model, (ids,), db=":memory:")
    with torch.no_grad():
        ref = model(ids)
    got = prog(ids)
    _same_output(got, ref)
    kept = [t.clone() for t in _cache_tensors(got.past_key_values)]
    prog(torch.randint(0, VOCAB, (1, 8)))
    assert all(torch.equal(a, b) for a, b in zip(kept, _cache_tensors(got.past_key_values)))
    step = torch.randint(0, VOCAB, (1, 1))
    with torch.no_grad():
        ours = model(step, past_key_values=got.past_key_values).logits
        theirs = model(step, past_key_values=ref.past_key_values).logits
    assert relative_error(ours.double().numpy(), theirs.double().numpy()) < TOL


def test_a_decode_step_takes_the_cache_and_returns_the_longer_one():
    model = _gpt2()
    ids, step = torch.randint(0, VOCAB, (1, 8)), torch.randint(0, VOCAB, (1, 1))

    def prefill():
        with torch.no_grad():
            return model(ids).past_key_values

    decode = tg.from_torch(model, (step,), kwargs={"past_key_values": prefill()},
                           db=":memory:")
    with torch.no_grad():
        ref = model(step, past_key_values=prefill())
    got = decode(step, past_key_values=prefill())
    _same_output(got, ref)
    assert got.past_key_values.layers[0].keys.shape[2] == 9


def test_an_encoder_decoder_called_with_its_defaults_returns_its_cache():
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                num_heads=4, decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    ids, start = torch.randint(0, VOCAB, (1, 7)), torch.randint(0, VOCAB, (1, 3))
    prog = tg.from_torch(model, (ids,), kwargs={"decoder_input_ids": start}, db=":memory:")
    with torch.no_grad():
        ref = model(ids, decoder_input_ids=start)
    _same_output(prog(ids, decoder_input_ids=start), ref)


class Box:
    """An object torch.export knows nothing of."""

    def __init__(self, t):
        self.t = t


class ReturnsBox(torch.nn.Module):
    def forward(self, x):
        return Box(x * 2)


def test_a_forward_returning_an_unknown_object_is_refused_with_the_fix():
    with pytest.raises(tg.ArgumentError, match=r"ReturnsBox.forward returns a .*Box, which "
                                                r"torch.export cannot carry.*tensors only"):
        tg.from_torch(ReturnsBox(), (torch.randn(2, 3),), db=":memory:")


def test_a_cache_of_layers_transformers_cannot_flatten_is_refused_with_the_fix():
    """Mamba's default call returns a DynamicCache of its own layers, which transformers'
    flattening refuses with a bare RuntimeError; the refusal names the fix, and the fix
    imports it."""
    torch.manual_seed(0)
    cfg = transformers.MambaConfig(vocab_size=VOCAB, hidden_size=32, state_size=8,
                                   num_hidden_layers=1, expand=2, conv_kernel=4)
    model = transformers.MambaForCausalLM(cfg).eval()
    ids = torch.randint(0, VOCAB, (1, 6))
    with pytest.raises(tg.ArgumentError, match=r"MambaForCausalLM.forward returns a "
                                                r"DynamicCache.*'use_cache': False"):
        tg.from_torch(model, (ids,), db=":memory:")
    prog = tg.from_torch(model, (ids,), kwargs={"use_cache": False}, db=":memory:")
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits.double().numpy()
    assert relative_error(prog(ids)["logits"].astype(np.float64), ref) < TOL
