"""What a torch training loop adds around ``optimizer.step()``, as tensor_graphs computes it in
the compiled step: gradient clipping by global norm (``max_grad_norm=``), gradient
accumulation over micro-batches (``accumulate=``) and per-parameter groups (the optimizer's
``groups=``). Each is checked against plain torch doing the same (``clip_grad_norm_``,
``(loss / N).backward()`` and ``step()`` every N, ``param_groups``) on a small MLP from the same
initial weights: the weights after several steps agree within 1e-5 relative (float32), as the
other training tests ask. Then the errors a slip gets."""

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
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _batch(i: int) -> tuple:
    rng = np.random.default_rng(100 + i)
    x = rng.standard_normal((8, 6)).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(np.tanh(2.0 * x[:, :4]))


def _trainer(module, optimizer, **options):
    """A trainer of ``module``'s MSE (its parameters by their state-dict names)."""
    return tg.from_torch(module, _batch(0), train=True, loss_fn=F.mse_loss,
                         optimizer=optimizer, **options)


def _backward(module, i: int, scale: float = 1.0) -> None:
    """torch's gradients of micro-batch ``i``'s loss (times ``scale``) added to ``.grad``."""
    x, y = _batch(i)
    (F.mse_loss(module(x), y) * scale).backward()


def _assert_same_weights(trainer, module, reference) -> None:
    trainer.load_into(module)
    for name, p in reference.named_parameters():
        got = dict(module.named_parameters())[name].detach().numpy()
        assert relative_error(got, p.detach().numpy()) < 1e-5, name


CLIP = 0.9  # about the median of the norms: some steps clipped, some not

OPTIMIZERS = [
    (lambda: tg.optim.SGD(0.2, momentum=0.9),
     lambda ps: torch.optim.SGD(ps, lr=0.2, momentum=0.9)),
    (lambda: tg.optim.AdamW(0.02, weight_decay=0.1),
     lambda ps: torch.optim.AdamW(ps, lr=0.02, weight_decay=0.1)),
]


@pytest.mark.parametrize("ours, theirs", OPTIMIZERS, ids=["sgd-momentum", "adamw"])
def test_max_grad_norm_clips_as_clip_grad_norm(ours, theirs):
    module = _mlp()
    reference = copy.deepcopy(module)
    trainer = _trainer(module, ours(), max_grad_norm=CLIP)
    topt = theirs(reference.parameters())
    norms = []
    for i in range(8):
        trainer.step(*_batch(i))
        topt.zero_grad()
        _backward(reference, i)
        norms.append(float(torch.nn.utils.clip_grad_norm_(reference.parameters(), CLIP)))
        topt.step()
    assert min(norms) < CLIP < max(norms)  # steps clipped and steps not
    _assert_same_weights(trainer, module, reference)


@pytest.mark.parametrize("clip", [None, 0.5], ids=["mean", "mean-then-clip"])
def test_accumulate_steps_every_n_calls_with_the_mean_gradient(clip):
    n, steps = 3, 4
    module = _mlp()
    reference = copy.deepcopy(module)
    first = {k: v.detach().clone() for k, v in module.state_dict().items()}
    trainer = _trainer(module, tg.optim.AdamW(0.02, weight_decay=0.1), accumulate=n,
                       max_grad_norm=clip)
    topt = torch.optim.AdamW(reference.parameters(), lr=0.02, weight_decay=0.1)
    norms = []
    for i in range(n * steps):
        trainer.step(*_batch(i))
        _backward(reference, i, 1.0 / n)
        if i < n - 1:  # no step before the n-th micro-batch
            assert trainer.steps == 0
            assert all(np.array_equal(v, first[k].numpy()) for k, v in trainer.weights().items())
        if (i + 1) % n == 0:
            if clip is not None:
                norms.append(float(torch.nn.utils.clip_grad_norm_(reference.parameters(), clip)))
            topt.step()
            topt.zero_grad()
    assert trainer.steps == steps
    assert clip is None or max(norms) > clip  # the mean was clipped
    _assert_same_weights(trainer, module, reference)


def _torch_groups(module, bias_decay: float, head_lr: float, default: dict) -> list[dict]:
    """torch's param_groups for: biases without weight decay, the last layer's weight with a
    learning rate of its own, the rest with the optimizer's arguments ``default``."""
    named = dict(module.named_parameters())
    return [{"params": [named["0.weight"]], **default},
            {"params": [named["0.bias"], named["2.bias"]], "weight_decay": bias_decay},
            {"params": [named["2.weight"]], "lr": head_lr}]


GROUPS = [{"params": ["0.bias", "2.bias"], "weight_decay": 0.0}, {"params": ["2.weight"],
                                                                    "lr": 0.005}]


@pytest.mark.parametrize("ours, theirs", [
    (lambda: tg.optim.SGD(0.1, momentum=0.9, weight_decay=0.05, groups=GROUPS),
     lambda m: torch.optim.SGD(_torch_groups(m, 0.0, 0.005, {}), lr=0.1, momentum=0.9,
                               weight_decay=0.05)),
    (lambda: tg.optim.Adam(0.02, weight_decay=0.05, groups=GROUPS),
     lambda m: torch.optim.Adam(_torch_groups(m, 0.0, 0.005, {}), lr=0.02, weight_decay=0.05)),
    (lambda: tg.optim.AdamW(0.02, weight_decay=0.1, groups=GROUPS),
     lambda m: torch.optim.AdamW(_torch_groups(m, 0.0, 0.005, {}), lr=0.02, weight_decay=0.1)),
], ids=["sgd", "adam", "adamw"])
def test_groups_give_their_parameters_their_lr_and_weight_decay(ours, theirs):
    module = _mlp()
    reference = copy.deepcopy(module)
    trainer = _trainer(module, ours())
    topt = theirs(reference)
    for i in range(8):
        if i == 4:  # a schedule: the optimizer's lr (shared by group 0) and group 1's own
            trainer.set_lr(0.5 * trainer.lr)
            trainer.set_lr(0.002, group=1)
            for g, lr in zip(topt.param_groups, [0.5 * topt.param_groups[0]["lr"]] * 2 + [0.002]):
                g["lr"] = lr
        trainer.step(*_batch(i))
        topt.zero_grad()
        _backward(reference, i)
        topt.step()
    _assert_same_weights(trainer, module, reference)
    assert trainer.program.stats["planner_runs"] == 1


def _loss():
    x, y = tg.input("x", (8, 6)), tg.input("y", (8, 4))
    fc1, fc2 = tg.nn.Linear(6, 16, name="fc1"), tg.nn.Linear(16, 4, name="fc2")
    err = fc2(tg.tanh(fc1(x))) - y
    return (err * err).mean()


@pytest.mark.parametrize("options, says", [
    ({"max_grad_norm": 0.0}, "Trainer: invalid max_grad_norm 0.0; give a float > 0"),
    ({"max_grad_norm": -1.0}, "Trainer: invalid max_grad_norm -1.0; give a float > 0"),
    ({"accumulate": 0}, "Trainer: invalid accumulate 0; give an int >= 1"),
    ({"accumulate": 2.0}, "Trainer: invalid accumulate 2.0; give an int >= 1"),
], ids=["norm-zero", "norm-negative", "accumulate-zero", "accumulate-float"])
def test_bad_clipping_or_accumulation_is_refused(options, says):
    with pytest.raises(tg.ArgumentError, match=f"^{says}"):
        tg.Trainer(_loss(), optimizer=tg.optim.SGD(0.1), **options)


@pytest.mark.parametrize("groups, says", [
    ([{"params": ["fc3.bias"], "weight_decay": 0.0}],
     r"AdamW: groups\[0\] names \['fc3.bias'\], which are not parameters being trained; "
     r"they are \['fc1.bias', 'fc1.weight', 'fc2.bias', 'fc2.weight'\]"),
    ([{"params": ["fc1.bias"]}, {"params": ["fc2.bias", "fc1.bias"], "lr": 0.1}],
     r"AdamW: parameter 'fc1.bias' is given twice in groups \(groups\[0\] and groups\[1\]\)"),
], ids=["unknown-name", "twice"])
def test_a_group_naming_no_parameter_or_one_twice_is_refused(groups, says):
    with pytest.raises(tg.ArgumentError, match=says):
        tg.Trainer(_loss(), optimizer=tg.optim.AdamW(0.01, groups=groups))


@pytest.mark.parametrize("groups, says", [
    ([{"params": ["fc1.bias"], "momentum": 0.5}],
     r"SGD: groups\[0\] sets \['momentum'\]; a group may set only 'lr' and 'weight_decay'"),
    ([{"weight_decay": 0.0}], r"SGD: groups\[0\] must be a dict with 'params'"),
    ([{"params": []}], r"SGD: groups\[0\]\['params'\] must be a non-empty list"),
    ([{"params": ["fc1.bias"], "lr": -1.0}], r"SGD: invalid lr in groups\[0\] -1.0"),
    ({"params": ["fc1.bias"]}, r"SGD: groups must be a list of dicts"),
], ids=["other-key", "no-params", "empty-params", "negative-lr", "not-a-list"])
def test_a_malformed_group_is_refused_by_the_optimizer(groups, says):
    with pytest.raises(tg.ArgumentError, match=says):
        tg.optim.SGD(0.1, groups=groups)


def test_set_lr_of_a_group_that_does_not_exist_is_refused():
    trainer = tg.Trainer(_loss(), optimizer=tg.optim.SGD(0.1, groups=[
        {"params": ["fc1.bias"], "weight_decay": 0.0}]))
    with pytest.raises(tg.ArgumentError, match=r"no parameter group 1; the groups are 0..0"):
        trainer.set_lr(0.01, group=1)
