"""from_torch(train=True) on tied parameters (one tensor under several names: GPT-2's token
table and LM head, most transformers LMs): trained once, its gradient the sum over every use,
next to torch.optim on a copy; written back under each name. A parameter that requires grad
but ends up untrained is named in a warning, never dropped in silence."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error

torch = pytest.importorskip("torch")
F = torch.nn.functional


class Tied(torch.nn.Module):
    def __init__(self, unused: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(20, 8)
        self.head = torch.nn.Linear(8, 20, bias=False)
        self.head.weight = self.emb.weight
        self.mid = torch.nn.Linear(8, 8)
        if unused:
            self.spare = torch.nn.Linear(8, 8)  # in no forward: torch.optim skips it

    def forward(self, ids):
        return self.head(torch.tanh(self.mid(self.emb(ids))))


def _ids(step: int):
    rng = np.random.default_rng(step)
    return torch.from_numpy(rng.integers(0, 20, 16)), torch.from_numpy(rng.integers(0, 20, 16))


def _train_alike(trainer, reference, topt, batches) -> None:
    """A step of ours and of torch's optimizer on ``reference`` per batch: equal losses."""
    for step, (ids, y) in enumerate(batches):
        ours = trainer.step(ids, y)
        topt.zero_grad()
        theirs = F.cross_entropy(reference(ids), y)
        theirs.backward()
        topt.step()
        assert abs(ours - theirs.item()) <= 1e-5 * theirs.item(), step


def test_a_tied_weight_trains_once_with_both_uses_gradients():
    module = Tied()
    reference = copy.deepcopy(module)
    trainer = tg.from_torch(module, _ids(0), train=True, loss_fn=F.cross_entropy,
                            optimizer=tg.optim.SGD(0.5))
    assert sorted(trainer.params) == ["emb.weight", "mid.bias", "mid.weight"]
    assert trainer.frozen == {}
    _train_alike(trainer, reference, torch.optim.SGD(reference.parameters(), 0.5),
                 [_ids(step) for step in range(6)])
    before = module.emb.weight.detach().clone()
    trainer.load_into(module)
    assert module.head.weight is module.emb.weight  # still one tensor, under both names
    assert relative_error(module.emb.weight.detach().numpy(), before.numpy()) > 1e-2
    for name, p in reference.named_parameters():
        got = module.get_parameter(name).detach().numpy()
        assert relative_error(got, p.detach().numpy()) < 1e-5, name
    state = module.state_dict()
    assert torch.equal(state["emb.weight"], state["head.weight"])


def test_load_into_writes_every_name_of_a_tied_parameter():
    """A module whose copies are untied gets the trained value under each name."""
    module = Tied()
    trainer = tg.from_torch(module, _ids(0), train=True, loss_fn=F.cross_entropy,
                            optimizer=tg.optim.SGD(0.5))
    trainer.step(*_ids(1))
    untied = Tied()
    untied.head.weight = torch.nn.Parameter(untied.emb.weight.detach().clone())
    trainer.load_into(untied)
    trained = trainer.weights()["emb.weight"]
    assert np.array_equal(untied.emb.weight.detach().numpy(), trained)
    assert np.array_equal(untied.head.weight.detach().numpy(), trained)


def test_a_parameter_left_untrained_is_named_in_a_warning():
    module = Tied(unused=True)
    with pytest.warns(UserWarning, match=r"does not read \['spare.bias', 'spare.weight'\].*"
                                         r"left unchanged"):
        trainer = tg.from_torch(module, _ids(0), train=True, loss_fn=F.cross_entropy,
                                optimizer=tg.optim.SGD(0.5))
    assert "spare.weight" not in trainer.params and "spare.weight" not in trainer.frozen


def test_gpt2s_tied_table_trains_as_transformers_and_torch_train_it():
    """GPT-2 2-layer, AdamW, next to torch on a copy: the losses and every weight (the tied
    table included) agree within float32 noise."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = transformers.GPT2LMHeadModel(cfg)

        def forward(self, ids):
            return self.lm(input_ids=ids, use_cache=False).logits.reshape(-1, 64)

    module = Logits().train()
    reference = copy.deepcopy(module)
    rng = np.random.default_rng(0)
    batches = [(torch.from_numpy(rng.integers(0, 64, (2, 16))),
                torch.from_numpy(rng.integers(0, 64, 32))) for _ in range(5)]
    trainer = tg.from_torch(module, batches[0], train=True, loss_fn=F.cross_entropy,
                            optimizer=tg.optim.AdamW(1e-2))
    table = "lm.transformer.wte.weight"
    assert table in trainer.params and "lm.lm_head.weight" not in trainer.params
    assert trainer.frozen.keys() <= {n for n, _ in module.named_buffers()}
    _train_alike(trainer, reference, torch.optim.AdamW(reference.parameters(), lr=1e-2),
                 batches)
    trainer.load_into(module)
    assert module.lm.lm_head.weight is module.lm.transformer.wte.weight
    for name, p in reference.named_parameters():
        got, want = module.get_parameter(name).detach().numpy(), p.detach().numpy()
        if name.endswith("attn.c_attn.bias"):  # the key bias: no gradient, AdamW scales noise
            got, want = np.delete(got, np.s_[32:64]), np.delete(want, np.s_[32:64])
        assert relative_error(got, want) < 1e-4, name
