"""transformers causal LMs called as users call them: default ``use_cache=True`` (a
``DynamicCache`` whose layers start from an empty 1-D tensor that ``aten.cat`` skips), an
attention mask, padded batches. The module returns the logits only, so the cache tensors the
forward builds are not outputs of the program.

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


class WholeOutput(torch.nn.Module):
    """ids -> the model's whole output object (its DynamicCache included): what torch.export
    cannot carry out of a graph."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids)


def test_a_forward_returning_the_cache_object_is_refused_with_the_fix():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB,
                                  n_positions=32, bos_token_id=0, eos_token_id=0)
    module = WholeOutput(transformers.GPT2LMHeadModel(cfg).eval())
    with pytest.raises(tg.ArgumentError, match=r"WholeOutput.forward returns a .*DynamicCache"
                                                r".*\.logits.*use_cache=False"):
        tg.from_torch(module, (torch.randint(0, VOCAB, (1, 8)),), db=":memory:")
