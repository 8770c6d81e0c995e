"""Mixture-of-experts causal LMs (transformers' Mixtral and Qwen2-MoE, tiny random configs)
imported with ``tg.from_torch`` and called as users call them: the default forward
(``use_cache`` left alone, the model's default experts implementation), an attention mask,
padded batches. Routing is a softmax and a topk; dispatch sorts the (token, expert) pairs by
expert, counts them per expert (histc), runs each expert's rows (a grouped matmul) and puts
the rows back (index_put of the inverse permutation): all mapped to argsort, gather and
scatter, so one plan serves every routing. The planned program must match eager within
1e-4, and ``explain()`` must show where its time goes: the routing and dispatch steps."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.frontend.causal_lm import Logits  # noqa: E402
from tests.frontend.causal_lm import masks as _masks  # noqa: E402

pytestmark = pytest.mark.slow

TOL = 1e-4
VOCAB = 97




def _check(model, lengths=(8, 13)):
    torch.manual_seed(0)
    wrapped = Logits(model.eval())
    seq = torch.export.Dim("seq", max=32)
    ids = torch.randint(0, VOCAB, (2, lengths[0]))
    prog = tg.from_torch(wrapped, (ids, torch.ones_like(ids)), ({1: seq}, {1: seq}),
                         db=":memory:")
    for n in lengths:
        ids = torch.randint(0, VOCAB, (2, n))
        for mask in _masks(2, n):
            with torch.no_grad():
                ref = wrapped(ids, mask).double().numpy()
            got = prog(ids, mask)
            assert got.shape == ref.shape == (2, n, VOCAB)
            err = relative_error(got.astype(np.float64), ref)
            assert err < TOL, (n, mask.tolist(), err)
    return prog


def _routing_and_dispatch_explained(prog) -> None:
    """explain() names the steps of routing (topk: the descending argsort) and dispatch (the
    argsort by expert, the gathers of rows, the scatters of histc and of the inverse
    permutation, the experts' matmuls), each with its share of the time."""
    text = prog.explain()
    steps = [line for line in text.splitlines() if "argsort" in line or "scatter" in line]
    assert any("argsort" in line for line in steps), text
    assert any("scatter" in line for line in steps), text
    assert "matmul" in text, text


def _mixtral():
    cfg = transformers.MixtralConfig(
        num_hidden_layers=2, vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64)
    return transformers.MixtralForCausalLM(cfg)


def _qwen2_moe():
    cfg = transformers.Qwen2MoeConfig(
        num_hidden_layers=2, vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
        moe_intermediate_size=48, shared_expert_intermediate_size=80, num_attention_heads=4,
        num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
        max_position_embeddings=64)
    return transformers.Qwen2MoeForCausalLM(cfg)


@pytest.mark.parametrize("build", [_mixtral, _qwen2_moe], ids=["mixtral", "qwen2_moe"])
def test_moe_default_forward_matches_eager_and_explains_dispatch(build):
    prog = _check(build())
    _routing_and_dispatch_explained(prog)


def test_grouped_matmul_rows_past_the_last_offset_are_zero():
    """The grouped product's rows belong to the group their offset range names; rows after
    the last offset (experts that drop tokens) are zero, as transformers' fallback leaves
    them."""
    from tensor_graphs.frontend.aten import lookup

    fn = lookup(torch.ops.aten._grouped_mm.default)
    rng = np.random.default_rng(0)
    xv, wv = rng.standard_normal((7, 5)), rng.standard_normal((3, 5, 4))
    offs = np.array([2, 2, 6], np.int32)
    x, w = tg.input("x", (7, 5), "float64"), tg.input("w", (3, 5, 4), "float64")
    o = tg.input("o", (3,), "int32")
    y = fn((), {"self": x, "mat2": w, "offs": o, "bias": None, "out_dtype": None})
    got = tg.evaluate(y, {"x": xv, "w": wv, "o": offs})
    ref = np.zeros((7, 4))
    ref[0:2] = xv[0:2] @ wv[0]
    ref[2:6] = xv[2:6] @ wv[2]
    assert relative_error(got, ref) < 1e-14
