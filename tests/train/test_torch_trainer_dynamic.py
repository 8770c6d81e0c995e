"""from_torch(train=True, dynamic_shapes=...) takes the forms inference from_torch takes: a
tuple with one entry per value of example_args, or a dict by the forward's parameter names
(and the loss function's for the targets); the export wrapper's ``*values`` never shows."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg

torch = pytest.importorskip("torch")
F = torch.nn.functional
BATCH = torch.export.Dim("batch", max=32) if torch is not None else None


def _trainer(dynamic_shapes, module=None, **options):
    torch.manual_seed(0)
    module = module or torch.nn.Linear(4, 3)
    return tg.from_torch(module, (torch.randn(8, 4), torch.randint(0, 3, (8,))),
                         dynamic_shapes=dynamic_shapes, train=True, loss_fn=F.cross_entropy,
                         optimizer=tg.optim.SGD(0.1), **options)


def _batch(rows: int):
    rng = np.random.default_rng(rows)
    return (rng.standard_normal((rows, 4)).astype(np.float32),
            rng.integers(0, 3, rows).astype(np.int64))


@pytest.mark.parametrize("shapes", [
    ({0: BATCH}, {0: BATCH}),
    [{0: BATCH}, {0: BATCH}],
    {"input": {0: BATCH}, "target": {0: BATCH}},  # Linear.forward's and F.cross_entropy's
], ids=["tuple", "list", "by name"])
def test_dynamic_shapes_per_value_or_by_name(shapes):
    trainer = _trainer(shapes)
    assert {tuple(map(str, i.shape))[0] for i in trainer.inputs.values()} == {"batch"}
    reference = torch.nn.Linear(4, 3)
    reference.load_state_dict({n: torch.from_numpy(v) for n, v in trainer.weights().items()})
    for rows in (5, 32, 11):  # every batch up to the Dim's max
        x, y = _batch(rows)
        want = F.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(y)).item()
        assert abs(trainer.step(x, y) - want) <= 1e-5 * want, rows
        reference.load_state_dict({n: torch.from_numpy(v)
                                   for n, v in trainer.weights().items()})


def test_bounds_name_the_dim():
    """The dims keep their Dim's name, so bounds= overrides it by that name."""
    trainer = _trainer(({0: torch.export.Dim("batch")}, {0: torch.export.Dim("batch")}),
                       bounds={"batch": 64})
    x, y = _batch(64)
    assert np.isfinite(trainer.step(x, y))


def test_a_custom_loss_names_its_targets():
    def loss_fn(logits, labels):
        return F.cross_entropy(logits, labels)

    torch.manual_seed(0)
    trainer = tg.from_torch(torch.nn.Linear(4, 3), (torch.randn(8, 4), torch.randint(0, 3, (8,))),
                            dynamic_shapes={"input": {0: BATCH}, "labels": {0: BATCH}},
                            train=True, loss_fn=loss_fn, optimizer=tg.optim.SGD(0.1))
    assert np.isfinite(trainer.step(*_batch(7)))


def test_wrong_forms_name_what_to_give():
    with pytest.raises(tg.ArgumentError, match=r"dynamic_shapes has 1 entries but example_args "
                       r"holds 2 values .*one entry per value"):
        _trainer((({0: BATCH}, {0: BATCH}),))  # the wrapper's own form: not the caller's
    with pytest.raises(tg.ArgumentError, match=r"names \['x'\], which are neither "
                       r"Linear.forward's inputs \['input'\] nor .* loss_fn \['target'\]"):
        _trainer({"x": {0: BATCH}})
    with pytest.raises(tg.ArgumentError, match="a tuple with one entry per value"):
        _trainer({0: BATCH}.values())
