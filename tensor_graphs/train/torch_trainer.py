"""``tg.from_torch(module, example_args, train=True, loss_fn=..., optimizer=...)``: a
``Trainer`` for a PyTorch module's parameters.

The module and its loss are exported together (a wrapper whose forward returns
``loss_fn(module(*inputs), *targets)``), so the importer gives one graph from the inputs and
targets to the loss, over the module's parameters and buffers as weights; the trainer then
differentiates and updates it like any tensor_graphs model. Why export the loss with the
module: the loss is torch code the user already has (``F.cross_entropy``, a custom mix), and
torch.export maps it the same way as the module. Parameters that ``requires_grad`` are trained;
buffers and frozen parameters stay weights. Dropout follows the module's own mode, as in torch:
in training mode (``module.train()``, a new module's mode) each dropout draws from one
generator (``tg.rng``, seeded by ``seed=``, advanced by every step), after ``module.eval()`` it
is off. Batch norm is exported in eval mode, as ``tg.from_torch`` does (its running statistics
read, not updated).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tensor_graphs.errors import ArgumentError, FeedError
from tensor_graphs.frontend.aten.random_ops import training_rng
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.graph import nodes, substitute
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import WEIGHT
from tensor_graphs.train.trainer import Trainer

__all__ = ["TorchTrainer", "trainer_from_torch"]

PREFIX = "module."  # the wrapper's attribute holding the user's module
RNG = "rng"  # the state of the generator the module's dropouts draw from


class TorchTrainer(Trainer):
    """A Trainer whose parameters are a torch module's, by its state-dict names.
    ``step(*args)`` takes the module's inputs and the loss's targets in the order of
    ``example_args``; ``load_into(module)`` copies the trained values back into the module."""

    def step(self, *args, **batch) -> float:
        if args:
            if len(args) != len(self.arg_names):
                raise FeedError(f"Trainer.step: {len(args)} positional values, the exported "
                                f"call takes {len(self.arg_names)} ({', '.join(self.arg_names)}:"
                                " the module's inputs, then the loss's targets)")
            batch.update((n, _numpy(a)) for n, a in zip(self.arg_names, args)
                         if n in self.inputs)
        return super().step(**batch)

    def load_into(self, module) -> None:
        """Write the trained parameters into ``module`` (``load_state_dict``, not strict:
        buffers and frozen parameters are the module's own)."""
        torch = _torch()
        state = {n: torch.from_numpy(v) for n, v in self.weights().items()}
        missing = sorted(set(state) - set(module.state_dict()))
        if missing:
            raise ArgumentError(f"load_into: the module has no {missing}; give the module "
                                "this trainer was made from")
        module.load_state_dict(state, strict=False)


def trainer_from_torch(module, example_args: Sequence, *, loss_fn: Callable, optimizer,
                       targets: int = 1, dynamic_shapes=None, **options) -> TorchTrainer:
    """The Trainer of ``loss_fn(module(*inputs), *targets)``: ``example_args`` holds the
    module's inputs followed by ``targets`` target tensors (torch tensors or arrays of the
    batch's shapes). ``options`` go to ``tg.Trainer`` (device, tolerance, bounds, db, the
    dropouts' ``seed``...)."""
    torch = _torch()
    from tensor_graphs.frontend.torch_export import _export, import_exported

    if not callable(loss_fn):
        raise ArgumentError("from_torch(train=True): give loss_fn=, a function (output, "
                            "*targets) -> scalar tensor, e.g. torch.nn.functional.cross_entropy")
    args = tuple(torch.as_tensor(a) if isinstance(a, np.ndarray) else a for a in
                 (example_args if isinstance(example_args, (tuple, list)) else (example_args,)))
    if not 0 <= targets < len(args):
        raise ArgumentError(f"from_torch(train=True): targets={targets} but example_args holds "
                            f"{len(args)} values; the module needs at least one input")
    n_inputs = len(args) - targets

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = module

        def forward(self, *values):
            return loss_fn(self.module(*values[:n_inputs]), *values[n_inputs:])

        def train(self, mode=True):  # the export's eval(): the module's own mode decides
            return self

    trained = {PREFIX + n for n, p in module.named_parameters() if p.requires_grad}
    if not trained:
        raise ArgumentError(f"from_torch(train=True): {type(module).__name__} has no parameter "
                            "that requires grad; nothing would train")
    modes = {m: m.training for m in module.modules()}
    for m in module.modules():  # batch norm reads its running statistics, as in inference
        if isinstance(m, torch.nn.modules.batchnorm._NormBase):
            m.eval()
    try:
        exported = _export(WithLoss(), args, dynamic_shapes)
    finally:
        for m, training in modes.items():
            m.training = training
    with training_rng(tg.rng(name=RNG)):
        outputs, inputs, weights, bounds = import_exported(exported)
    loss = outputs[0] if len(outputs) == 1 and isinstance(outputs[0], Node) else None
    if loss is None or loss.ndim:
        raise ArgumentError("from_torch(train=True): loss_fn must return one scalar tensor "
                            "(reduction='mean' or 'sum')")
    # the wrapper's names without its prefix: the module's own state-dict names
    renamed = {}
    for leaf in nodes(loss):
        if leaf.op.name == WEIGHT and leaf.name.startswith(PREFIX):
            renamed[leaf] = tg.weight(leaf.name[len(PREFIX):], tuple(leaf.shape), leaf.dtype)
    loss = substitute(loss, renamed)
    values = {n[len(PREFIX):]: v for n, v in weights.items()}
    params = [n[len(PREFIX):] for n in sorted(trained)
              if any(lf.name == n[len(PREFIX):] for lf in renamed.values())]
    used = {str(s) for n in nodes(loss) for d in n.shape for s in getattr(d, "free_symbols",
                                                                          ())}
    if bounds and "bounds" not in options and used:
        options["bounds"] = {k: v for k, v in bounds.items() if k in used}
    trainer = TorchTrainer(loss, params, optimizer=optimizer, **options)
    trainer.arg_names = [getattr(i, "name", None) for i in inputs]
    trainer.bind(**{n: v for n, v in values.items() if n in trainer.params or n in trainer.frozen})
    return trainer


def _numpy(value):
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _torch():
    import torch

    return torch
