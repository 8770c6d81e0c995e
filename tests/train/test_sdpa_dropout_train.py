"""scaled_dot_product_attention with dropout_p > 0 (transformers' default attention in training
mode): imported as its decomposition with the attention weights dropped by the training
generator. The masks are ours, not torch's, so the checks are exact against the generator's
own words (which weights drop, the kept ones scaled, the gradients torch gives for that mask),
against the eager attention of the same model (which drops the same weights through
nn.Dropout), and a real config training."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.frontend.aten.random_ops import training_rng
from tensor_graphs.ir import graph
from tensor_graphs.ir.ops.random import bits_reference, threshold

torch = pytest.importorskip("torch")
F = torch.nn.functional

B, HQ, HKV, SQ, SK, D = 2, 4, 2, 5, 7, 8
P = 0.3
KEY = np.array([3, 1])  # the generator's state: seed 3, step 1


class Attention(torch.nn.Module):
    def __init__(self, mask=None, is_causal=False, scale=None):
        super().__init__()
        self.mask, self.is_causal, self.scale = mask, is_causal, scale

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, self.mask, dropout_p=P,
                                              is_causal=self.is_causal, scale=self.scale,
                                              enable_gqa=True)


def _import(module, q, k, v):
    from tensor_graphs.frontend.torch_export import import_exported

    with torch.no_grad():
        exported = torch.export.export(module, (q, k, v))
    with training_rng(tg.rng()):
        (out,), _, weights, _ = import_exported(exported)
    return out, weights  # the mask, where the module holds one


def _qkv(dv=D):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((B, HQ, SQ, D)).astype(np.float32),
            rng.standard_normal((B, HKV, SK, D)).astype(np.float32),
            rng.standard_normal((B, HKV, SK, dv)).astype(np.float32))


def _weights(q, k, mask=None, is_causal=False, scale=None):
    """torch's attention weights without dropout, grouped-query heads repeated."""
    k = k.repeat_interleave(HQ // HKV, dim=1)
    scores = q @ k.transpose(-1, -2) * (scale or D ** -0.5)
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask
    if is_causal:
        scores = scores.masked_fill(~torch.ones(SQ, SK, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(scores, -1).nan_to_num(0.0)


def _dropped(shape) -> np.ndarray:
    """The weights the generator drops: stream 0 (the first site) at KEY, element order."""
    n = int(np.prod(shape))
    return (bits_reference(KEY, n, 0) < threshold(P)).reshape(shape)


MASKS = {
    "causal": dict(is_causal=True),
    "bool mask": dict(mask=torch.rand(SQ, SK, generator=torch.Generator().manual_seed(1)) > 0.3),
    "float mask and scale": dict(mask=torch.randn(B, 1, SQ, SK), scale=0.2),
}


@pytest.mark.parametrize("case", list(MASKS))
def test_the_weights_drop_by_the_generators_mask_and_the_rest_scale(case):
    """v = the identity: the output is the attention weights after dropout, element for
    element: 0 where the generator's word is below the threshold, weight / (1 - p) elsewhere."""
    opts = MASKS[case]
    q, k, _ = _qkv()
    eye = np.broadcast_to(np.eye(SK, dtype=np.float32), (B, HKV, SK, SK)).copy()
    module = Attention(**opts)
    out, weights = _import(module, *map(torch.from_numpy, (q, k, eye)))
    got = tg.evaluate(out, {"q": q, "k": k, "v": eye, "rng": KEY, **weights})
    weights = _weights(torch.from_numpy(q), torch.from_numpy(k), **opts).numpy()
    dropped = _dropped(weights.shape)
    want = np.where(dropped, 0.0, weights / (1 - P))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    live = weights > 0
    assert abs(dropped[live].mean() - P) < 4 * np.sqrt(P * (1 - P) / live.sum())


def test_the_gradients_are_torchs_for_the_same_mask():
    """Through the decomposition tg.grad gives what torch's autograd gives for attention whose
    weights are dropped by the same mask (grouped-query k and v included)."""
    q, k, v = _qkv()
    out, _ = _import(Attention(is_causal=True), *map(torch.from_numpy, (q, k, v)))
    cot = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    leaves = {lf.name: lf for lf in graph.leaves(out)}
    loss = tg.sum(out * tg.constant(cot))
    grads = tg.evaluate(tg.grad(loss, [leaves["q"], leaves["k"], leaves["v"]]),
                        {"q": q, "k": k, "v": v, "rng": KEY})
    tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
    weights = _weights(tq, tk, is_causal=True)
    keep = torch.from_numpy(~_dropped(tuple(weights.shape)))
    want = (weights * keep / (1 - P)) @ tv.repeat_interleave(HQ // HKV, dim=1)
    (want * torch.from_numpy(cot)).sum().backward()
    np.testing.assert_allclose(tg.evaluate(out, {"q": q, "k": k, "v": v, "rng": KEY}),
                               want.detach().numpy(), rtol=1e-5, atol=1e-5)
    for got, t in zip(grads, (tq, tk, tv)):
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_without_a_training_generator_it_is_refused_with_the_fix():
    """Inference from_torch of a module left in training mode: dropping at random would be
    wrong, so the message says to train it or call eval()."""
    q, k, v = map(torch.from_numpy, _qkv())
    with pytest.raises(tg.ArgumentError, match=r"scaled_dot_product_attention with "
                       r"dropout_p > 0 in training mode.*train=True.*module\.eval\(\)"):
        tg.from_torch(Attention(is_causal=True), (q, k, v))


def _gpt2(impl: str):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=50, n_positions=32,
                                  attn_pdrop=0.2, resid_pdrop=0.1, embd_pdrop=0.1,
                                  attn_implementation=impl)
    return transformers.GPT2LMHeadModel(cfg).train()


class Logits(torch.nn.Module):
    def __init__(self, lm, vocab):
        super().__init__()
        self.lm, self.vocab = lm, vocab

    def forward(self, ids):
        return self.lm(input_ids=ids, use_cache=False).logits.reshape(-1, self.vocab)


def _batches(vocab, n, shape=(2, 16)):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, shape)
    return [(ids, np.roll(ids, -1, axis=1).reshape(-1)) for _ in range(n)]


def test_gpt2_trains_the_same_with_its_default_sdpa_attention_as_with_eager():
    """transformers' sdpa attention hands dropout_p to the op; its eager attention runs
    nn.Dropout on the weights at the same place in the graph, so both draw the same masks from
    the generator: the same losses, step after step, with every dropout of the model on."""
    runs = []
    for impl in ("sdpa", "eager"):
        ids, target = _batches(50, 1)[0]
        trainer = tg.from_torch(Logits(_gpt2(impl), 50),
                                (torch.from_numpy(ids), torch.from_numpy(target)), train=True,
                                loss_fn=F.cross_entropy, optimizer=tg.optim.AdamW(3e-3), seed=2)
        runs.append([trainer.step(i, t) for i, t in _batches(50, 4)])
    np.testing.assert_allclose(runs[0], runs[1], rtol=1e-5)
    assert runs[0][-1] < runs[0][0]


def test_bert_with_attention_dropout_trains_on_its_default_attention():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=32, attention_probs_dropout_prob=0.2,
                                  hidden_dropout_prob=0.1)
    bert = transformers.BertForMaskedLM(cfg).train()
    assert bert.config._attn_implementation == "sdpa"
    ids, target = _batches(40, 1)[0]
    trainer = tg.from_torch(Logits(bert, 40), (torch.from_numpy(ids), torch.from_numpy(target)),
                            train=True, loss_fn=F.cross_entropy, optimizer=tg.optim.AdamW(3e-3))
    losses = [trainer.step(i, t) for i, t in _batches(40, 8)]
    assert np.isfinite(losses).all()
    assert np.mean(losses[-2:]) < np.mean(losses[:2]), losses
