"""Training with dropout: tg.Trainer's seed, the generator advanced by every step in place,
runs reproducible from the seed and different across seeds, a model with dropout training,
and tg.from_torch(train=True) mapping torch's training-mode dropout (equal to torch at p = 0,
where nothing is random; in distribution otherwise, since the generators differ)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.frontend.aten.random_ops import training_rng
from tensor_graphs.ir.ops.random import bits_reference, threshold

IN, HID, OUT, ROWS = 6, 32, 4, 24


def _batch(step: int):
    rng = np.random.default_rng(step)
    x = rng.standard_normal((ROWS, IN)).astype(np.float32)
    return x, (x[:, :OUT] > 0).argmax(axis=1).astype(np.int64)  # learnable classes


def _weights():
    rng = np.random.default_rng(0)
    return {"w1": (rng.standard_normal((IN, HID)) * 0.4).astype(np.float32),
            "w2": (rng.standard_normal((HID, OUT)) * 0.3).astype(np.float32)}


def _trainer(p: float, seed: int = 0, **options):
    r = tg.rng()
    x, y = tg.input("x", (ROWS, IN)), tg.input("y", (ROWS,), "int64")
    h = tg.dropout(tg.relu(x @ tg.weight("w1", (IN, HID))), p, r)
    loss = tg.cross_entropy(h @ tg.weight("w2", (HID, OUT)), y)
    trainer = tg.Trainer(loss, optimizer=tg.optim.AdamW(0.02), seed=seed, **options)
    return trainer.bind(**_weights())


def _run(trainer, steps: int) -> list[float]:
    return [trainer.step(x=x, y=y) for x, y in map(_batch, range(steps))]


def test_a_model_with_dropout_trains_and_the_generator_advances_in_place():
    trainer = _trainer(0.3, seed=11)
    losses = _run(trainer, 40)
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses
    assert trainer.program.state("rng").tolist() == [11, 40]  # one step per call, on the state
    assert trainer.program.stats["planner_runs"] == 1


def test_a_seed_reproduces_a_run_and_another_seed_differs():
    a, b, c = _run(_trainer(0.5, seed=1), 6), _run(_trainer(0.5, seed=1), 6), \
        _run(_trainer(0.5, seed=2), 6)
    assert a == b
    assert a[0] != c[0] and a != c


def test_each_step_draws_a_new_mask():
    """The extra output h: its zeros are step's mask (the reference's words at that step)."""
    r = tg.rng()
    x = tg.input("x", (ROWS, IN))
    h = tg.dropout(x @ tg.weight("w1", (IN, HID)), 0.5, r)
    loss = tg.mean(h * h)
    trainer = tg.Trainer(loss, optimizer=tg.optim.SGD(0.0), seed=5, extra=[h])
    trainer.bind(w1=np.ones((IN, HID), np.float32))
    xs = np.ones((ROWS, IN), np.float32)
    masks = []
    for step in range(3):
        trainer.step(x=xs)
        masks.append(trainer.last[0] == 0)
        want = bits_reference(np.array([5, step]), ROWS * HID, 0) < threshold(0.5)
        assert np.array_equal(masks[-1].reshape(-1), want), step
    assert not np.array_equal(masks[0], masks[1])


def test_a_symbolic_batch_draws_the_reference_mask_at_every_length():
    """One plan for every batch up to the bound: the words follow the element index of the
    batch actually fed (the program's shape, bound at each call)."""
    r = tg.rng()
    x = tg.input("x", ("batch", IN))
    h = tg.dropout(tg.tanh(x @ tg.weight("w1", (IN, HID))), 0.2, r)
    trainer = tg.Trainer(tg.mean(h * h), optimizer=tg.optim.SGD(0.01), seed=3,
                         bounds={"batch": 64}, extra=[h])
    trainer.bind(w1=np.full((IN, HID), 0.1, np.float32))
    for step, rows in enumerate([5, 64, 17]):
        trainer.step(x=np.ones((rows, IN), np.float32))
        want = bits_reference(np.array([3, step]), rows * HID, 0) < threshold(0.2)
        assert np.array_equal(trainer.last[0].reshape(-1) == 0, want), rows
    assert trainer.program.stats["planner_runs"] == 1


def test_p_zero_is_the_model_without_dropout():
    assert _run(_trainer(0.0), 5) == _run(_trainer(0.0, seed=9), 5)
    trainer = _trainer(0.0)
    assert trainer.rngs == {}  # nothing random: no generator state at all


def test_the_generator_resumes_from_a_checkpoint(tmp_path):
    first = _trainer(0.4, seed=3)
    _run(first, 3)
    first.save(tmp_path / "ckpt.safetensors", optimizer=True)
    tail = [first.step(x=x, y=y) for x, y in map(_batch, range(3, 6))]
    resumed = _trainer(0.4, seed=99).bind_safetensors(tmp_path / "ckpt.safetensors")
    assert resumed.program.state("rng").tolist() == [3, 3]
    assert [resumed.step(x=x, y=y) for x, y in map(_batch, range(3, 6))] == tail


# ------------------------------------------------------------------------------ from torch
torch = pytest.importorskip("torch")
F = torch.nn.functional


def _module(p: float):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HID), torch.nn.ReLU(), torch.nn.Dropout(p),
                               torch.nn.Linear(HID, OUT))


def _from_torch(module, **options):
    x0, y0 = _batch(0)
    return tg.from_torch(module, (torch.from_numpy(x0), torch.from_numpy(y0)), train=True,
                         loss_fn=F.cross_entropy, optimizer=tg.optim.AdamW(0.01), **options)


def test_from_torch_at_p_zero_matches_torch_exactly():
    module = _module(0.0)
    reference = copy.deepcopy(module).train()
    trainer = _from_torch(module)
    topt = torch.optim.AdamW(reference.parameters(), lr=0.01)
    for step in range(10):
        x, y = _batch(step)
        ours = trainer.step(x, y)
        topt.zero_grad()
        theirs = F.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(y))
        theirs.backward()
        topt.step()
        assert abs(ours - theirs.item()) <= 1e-5 * abs(theirs.item()), step


def test_from_torch_maps_training_dropout_to_ours():
    trainer = _from_torch(_module(0.3), seed=4)
    assert trainer.rngs and sorted(trainer.rngs) == ["rng"]
    losses = [trainer.step(*_batch(s)) for s in range(40)]
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), losses
    assert trainer.program.state("rng").tolist() == [4, 40]
    again = _from_torch(_module(0.3), seed=4)
    assert [again.step(*_batch(s)) for s in range(5)] == losses[:5]
    # the module's eval mode turns dropout off, as in torch: no generator
    assert _from_torch(_module(0.3).eval()).rngs == {}


def test_native_dropout_gives_the_output_and_its_keep_mask():
    from tensor_graphs.frontend.torch_export import import_exported

    class Drop(torch.nn.Module):
        def forward(self, x):
            return torch.ops.aten.native_dropout(x, 0.25, True)

    with torch.no_grad():
        exported = torch.export.export(Drop(), (torch.randn(40, 50),))
    with training_rng(tg.rng()):
        (out, keep), _, _, _ = import_exported(exported)
    xs = np.random.default_rng(0).uniform(1.0, 2.0, (40, 50)).astype(np.float32)
    got_out, got_keep = tg.evaluate([out, keep], {"x": xs, "rng": np.array([1, 0])})
    assert got_keep.dtype == np.bool_ and np.array_equal(got_out != 0, got_keep)
    assert np.allclose(got_out[got_keep], xs[got_keep] / 0.75)
    assert 0.65 < got_keep.mean() < 0.85


def test_feature_dropout_zeroes_whole_channels():
    from tensor_graphs.frontend.torch_export import import_exported

    class Channels(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = torch.nn.Dropout2d(0.5)

        def forward(self, x):
            return self.drop(x)

    with torch.no_grad():
        exported = torch.export.export(Channels().train(), (torch.randn(4, 64, 3, 5),))
    with training_rng(tg.rng()):
        (out,), _, _, _ = import_exported(exported)
    xs = np.random.default_rng(0).uniform(1.0, 2.0, (4, 64, 3, 5)).astype(np.float32)
    got = tg.evaluate(out, {"x": xs, "rng": np.array([2, 0])})
    zero = (got == 0).reshape(4, 64, 15)
    assert np.array_equal(zero.all(axis=2), zero.any(axis=2))  # a channel is dropped whole
    assert 0.3 < zero.all(axis=2).mean() < 0.7
    kept = ~zero.all(axis=2)
    assert np.allclose(got.reshape(4, 64, 15)[kept], 2 * xs.reshape(4, 64, 15)[kept])



def test_two_generators_of_one_name_are_refused():
    """Each tg.rng of a name starts at stream 0: two of them would give two sites one mask."""
    x = tg.input("x", (ROWS, IN))
    h = tg.dropout(x @ tg.weight("w1", (IN, HID)), 0.5, tg.rng())
    out = tg.dropout(h @ tg.weight("w2", (HID, OUT)), 0.5, tg.rng())  # a second tg.rng()
    h2 = tg.dropout(x @ tg.weight("w1", (IN, HID)), 0.5, tg.rng())
    assert h2 is h  # the same site built again is the same node: no clash
    with pytest.raises(tg.ArgumentError, match="draw stream 0 of the generator state"):
        tg.Trainer(tg.mean(out), optimizer=tg.optim.SGD(0.1))
