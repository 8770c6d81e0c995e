"""tg.from_torch(module, example_args, train=True, loss_fn=...): a torch module's parameters
trained by a compiled step, next to torch.optim training the same module from the same values
on the same batches."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _batch(step: int):
    rng = np.random.default_rng(step)
    x = rng.standard_normal((12, 6)).astype(np.float32)
    return x, (x[:, :4] > 0).argmax(axis=1).astype(np.int64)  # learnable classes


@pytest.mark.parametrize("loss_fn, target", [
    (F.cross_entropy, lambda y: y),
    (F.mse_loss, lambda y: np.eye(4, dtype=np.float32)[y]),
], ids=["cross_entropy", "mse"])
def test_module_trains_as_torch_trains_it(loss_fn, target):
    module = _mlp()
    reference = copy.deepcopy(module).train()
    x0, y0 = _batch(0)
    trainer = tg.from_torch(module, (torch.from_numpy(x0), torch.from_numpy(target(y0))),
                            train=True, loss_fn=loss_fn,
                            optimizer=tg.optim.AdamW(0.01, weight_decay=0.01))
    assert isinstance(trainer, tg.Trainer)
    assert sorted(trainer.params) == sorted(n for n, _ in module.named_parameters())
    topt = torch.optim.AdamW(reference.parameters(), lr=0.01, weight_decay=0.01)
    losses = []
    for step in range(20):
        x, y = _batch(step)
        ours = trainer.step(x, target(y))
        topt.zero_grad()
        theirs = loss_fn(reference(torch.from_numpy(x)), torch.from_numpy(target(y)))
        theirs.backward()
        topt.step()
        assert abs(ours - theirs.item()) <= 1e-4 * abs(theirs.item()), step
        losses.append(ours)
    assert losses[-1] < losses[0]
    assert trainer.program.stats["planner_runs"] == 1
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    trainer.load_into(module)
    for name, p in reference.named_parameters():
        got = dict(module.named_parameters())[name].detach().numpy()
        assert relative_error(got, p.detach().numpy()) < 1e-5, name
        assert relative_error(got, before[name].numpy()) > 1e-3  # it moved


def test_a_bfloat16_module_trains_with_nothing_to_set():
    """A bfloat16 module's batches and weights cross as bfloat16 (numpy has no bfloat16: torch's
    ``.numpy()`` raised), and its default tolerance is its precision's: the step's float32
    outputs (its optimizer's counters) do not hold it to float32's 1e-5, at which no bfloat16
    kernel has a path. It trains as torch does in bfloat16, and ``load_into`` writes bfloat16."""
    module = _mlp().to(torch.bfloat16)
    reference = copy.deepcopy(module).train()
    x0, y0 = _batch(0)
    as_bf16 = lambda a: torch.from_numpy(a).to(torch.bfloat16)  # noqa: E731
    target = lambda y: np.eye(4, dtype=np.float32)[y]  # noqa: E731
    trainer = tg.from_torch(module, (as_bf16(x0), as_bf16(target(y0))), train=True,
                            loss_fn=F.mse_loss, optimizer=tg.optim.SGD(0.1))
    topt = torch.optim.SGD(reference.parameters(), lr=0.1)
    losses = []
    for step in range(10):
        x, y = _batch(step)
        ours = trainer.step(as_bf16(x), as_bf16(target(y)))
        topt.zero_grad()
        theirs = F.mse_loss(reference(as_bf16(x)), as_bf16(target(y)))
        theirs.backward()
        topt.step()
        assert abs(ours - theirs.item()) <= 0.05 * abs(theirs.item()), step
        losses.append(ours)
    assert losses[-1] < losses[0]
    trainer.load_into(module)
    for name, p in reference.named_parameters():
        got = dict(module.named_parameters())[name]
        assert got.dtype == torch.bfloat16
        assert relative_error(got.float().detach().numpy(), p.float().detach().numpy()) < 0.05


def test_frozen_parameters_and_errors():
    module = _mlp()
    for p in module[0].parameters():
        p.requires_grad_(False)
    x, y = _batch(0)
    trainer = tg.from_torch(module, (torch.from_numpy(x), torch.from_numpy(y)), train=True,
                            loss_fn=F.cross_entropy, optimizer=tg.optim.SGD(0.1))
    assert sorted(trainer.params) == ["2.bias", "2.weight"]
    assert sorted(trainer.frozen) == ["0.bias", "0.weight"]
    first = trainer.weights()["2.weight"].copy()
    trainer.step(x, y)
    assert relative_error(trainer.weights()["2.weight"], first) > 1e-4
    with pytest.raises(tg.FeedError, match="2 positional values|takes 2"):
        trainer.step(x)
    with pytest.raises(tg.ArgumentError, match="loss_fn"):
        tg.from_torch(module, (torch.from_numpy(x), torch.from_numpy(y)), train=True,
                      loss_fn=None, optimizer=tg.optim.SGD(0.1))


@pytest.mark.parametrize("option, says", [
    ({"quantize": "int8-weight"}, "quantize: an option of tg.from_torch for inference"),
    ({"kwargs": {"mask": None}}, "kwargs: an option of tg.from_torch for inference"),
    ({"tolerence": 1e-4}, "tolerence: did you mean tolerance=?"),
])
def test_an_option_training_does_not_take_is_refused_before_the_export(option, says,
                                                                       monkeypatch):
    """It reached tg.compile as a bare TypeError ("compile() got an unexpected keyword
    argument"), after the export had run."""
    from tensor_graphs.frontend import torch_export

    monkeypatch.setattr(torch_export, "_export", lambda *a, **k: pytest.fail("exported"))
    m = torch.nn.Linear(4, 2)
    with pytest.raises(tg.ArgumentError, match="from_torch\\(train=True\\): unknown option") \
            as info:
        tg.from_torch(m, (torch.randn(3, 4), torch.randn(3, 2)), train=True,
                      loss_fn=F.mse_loss, optimizer=tg.optim.SGD(0.1), **option)
    assert says in str(info.value) and "tolerance, seed; and passes on to tg.compile db" \
        in str(info.value)
