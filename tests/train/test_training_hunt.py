"""Training-side bugs found by a hunt: each test fails without its fix."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.runtime.weights import read_safetensors_header, write_safetensors


def _frozen_scale_loss():
    """A linear map's squared output scaled by a frozen weight ``F``; only ``W`` trains."""
    x = tg.input("x", (4, 3))
    w, f = tg.weight("W", (3, 2)), tg.weight("F", (2,))
    return ((tg.matmul(x, w) * f) ** 2).mean()


def test_save_writes_the_frozen_weights_the_step_used(tmp_path):
    """save() wrote the caller's array as given at bind: float64 for a float32 weight, and
    whatever the caller wrote into it since, not the values the trainer trained with."""
    trainer = tg.Trainer(_frozen_scale_loss(), params=["W"], optimizer=tg.optim.SGD(0.1))
    scale = np.array([1.0, 2.0])  # float64 for a float32 weight: the program holds a copy
    trainer.bind(W=np.ones((3, 2), np.float32), F=scale)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    trainer.step(x=x)
    scale[:] = 100.0  # the caller reuses its buffer
    path = tmp_path / "model.safetensors"
    trainer.save(path)
    assert read_safetensors_header(path).tensors["F"].dtype == "F32"
    resumed = tg.Trainer(_frozen_scale_loss(), params=["W"], optimizer=tg.optim.SGD(0.1))
    resumed.bind_safetensors(path)
    assert resumed.step(x=x) == trainer.step(x=x)


def test_a_state_the_loss_reads_but_does_not_train_is_bound_with_bind():
    """A tg.state the loss reads, outside params, could not be bound at all: Trainer.bind
    refused it as unknown and step's error named prog.bind, which the user does not hold."""
    x = tg.input("x", (4, 3))
    w, offset = tg.weight("W", (3, 2)), tg.state("offset", (2,), "float32")
    trainer = tg.Trainer(((tg.matmul(x, w) + offset) ** 2).mean(), optimizer=tg.optim.SGD(0.1))
    assert sorted(trainer.params) == ["W"] and sorted(trainer.frozen) == ["offset"]
    trainer.bind(W=np.zeros((3, 2), np.float32), offset=np.array([1.0, -1.0], np.float32))
    assert trainer.step(x=np.ones((4, 3), np.float32)) == 1.0


def test_bind_safetensors_takes_a_rename_mapping(tmp_path):
    """``rename`` as prog.bind_safetensors takes it: a dict failed with "'dict' object is
    not callable" in the check of the file's optimizer states."""
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"model.W": np.full((3, 2), 0.5, np.float32),
                             "F": np.ones(2, np.float32)})
    trainer = tg.Trainer(_frozen_scale_loss(), params=["W"], optimizer=tg.optim.SGD(0.1))
    trainer.bind_safetensors(path, rename={"model.W": "W"})
    np.testing.assert_array_equal(trainer.weights()["W"], np.full((3, 2), 0.5, np.float32))


def test_a_bfloat16_model_with_a_float32_loss_trains_with_nothing_to_set():
    """Mixed precision's usual loss, cross entropy of the logits cast to float32: the default
    tolerance followed the float32 loss, so the bfloat16 layers had no path (NoPathError)."""
    x, y = tg.input("x", (8, 4), "bfloat16"), tg.input("y", (8,), "int64")
    fc = tg.nn.Linear(4, 3, name="fc", dtype="bfloat16")
    trainer = tg.Trainer(tg.cross_entropy(fc(x).astype("float32"), y),
                         optimizer=tg.optim.SGD(0.5))
    rng = np.random.default_rng(0)
    trainer.bind(**{n: rng.standard_normal(p.shape).astype(p.dtype.np_dtype)
                    for n, p in trainer.params.items()})
    batch = {"x": rng.standard_normal((8, 4)).astype(trainer.inputs["x"].dtype.np_dtype),
             "y": rng.integers(0, 3, 8)}
    losses = [trainer.step(**batch) for _ in range(5)]
    assert losses[-1] < losses[0]


def test_a_torch_trainers_feed_errors_say_which_argument():
    """The export wrapper names the values values_0, values_1...: "feed 'values_1' expects
    int64" told the caller, who passed (inputs, labels) by position, nothing about which."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    trainer = tg.from_torch(torch.nn.Linear(4, 3), (torch.randn(8, 4), torch.randint(0, 3, (8,))),
                            train=True, loss_fn=torch.nn.functional.cross_entropy,
                            optimizer=tg.optim.SGD(0.1))
    x = np.zeros((8, 4), np.float32)
    with pytest.raises(tg.errors.DTypeError, match=r"\(example_args\[1\]\).*int64"):
        trainer.step(x, np.zeros(8, np.float32))
    with pytest.raises(tg.errors.ShapeError, match=r"\(example_args\[0\]\)"):
        trainer.step(x[:, :3], np.zeros(8, np.int64))
