"""``tg.from_torch(module, example_args, train=True, loss_fn=..., optimizer=...)``: a
``Trainer`` for a PyTorch module's parameters.

The module and its loss are exported together (a wrapper whose forward returns
``loss_fn(module(*inputs), *targets)``), so the importer gives one graph from the inputs and
targets to the loss, over the module's parameters and buffers as weights; the trainer then
differentiates and updates it like any tensor_graphs model. Why export the loss with the
module: the loss is torch code the user already has (``F.cross_entropy``, a custom mix), and
torch.export maps it the same way as the module. Parameters that ``requires_grad`` are trained;
buffers and frozen parameters stay weights. A parameter tied under several names (GPT-2's token
table and LM head) is one trained weight under its first name, as ``named_parameters()`` lists
it: its gradient is the sum over every use, as torch's. ``dynamic_shapes`` takes the forms
inference ``from_torch`` takes (a tuple with an entry per value of ``example_args``, or a dict
by the forward's and the loss's parameter names), translated for the wrapper. Dropout follows
the module's own mode, as in torch: in training mode (``module.train()``, a new module's mode)
each dropout (``scaled_dot_product_attention``'s ``dropout_p`` too) draws from one generator
(``tg.rng``, seeded by ``seed=``, advanced by every step), after ``module.eval()`` it is off.
Batch norm is exported in eval mode, as ``tg.from_torch`` does (its running statistics read,
not updated). What torch's autograd does not differentiate, tg.grad does not either: the
wrapper is exported with grad enabled, so the forward's ``torch.no_grad()`` blocks come as
regions, inlined with what they computed detached (``frontend/grad_regions.py``), and the
import is one for training, where ``detach`` is a ``tg.stop_gradient`` and an embedding's
``padding_idx`` row gets no gradient, as in torch (``scale_grad_by_freq`` is refused).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from tensor_graphs.errors import ArgumentError, FeedError, TensorGraphsError
from tensor_graphs.frontend.aten.random_ops import training_rng
from tensor_graphs.frontend.grad_regions import inline_grad_regions
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.graph import nodes, substitute
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import WEIGHT
from tensor_graphs.kernels.torch.convert import to_host, to_torch
from tensor_graphs.train.trainer import Trainer

__all__ = ["TorchTrainer", "trainer_from_torch"]

PREFIX = "module."  # the wrapper's attribute holding the user's module
RNG = "rng"  # the state of the generator the module's dropouts draw from


class TorchTrainer(Trainer):
    """A Trainer whose parameters are a torch module's, by its state-dict names.
    ``step(*args)`` takes the module's inputs and the loss's targets in the order of
    ``example_args``; ``load_into(module)`` copies the trained values back into the module."""

    aliases: dict[str, str] = {}  # each other name of a tied parameter -> the trained one's

    def step(self, *args, **batch) -> float:
        if args:
            if len(args) != len(self.arg_names):
                raise FeedError(f"Trainer.step: {len(args)} positional values, the exported "
                                f"call takes {len(self.arg_names)} ({', '.join(self.arg_names)}:"
                                " the module's inputs, then the loss's targets)")
            batch.update((n, to_host(a)) for n, a in zip(self.arg_names, args)
                         if n in self.inputs)
        try:
            return super().step(**batch)
        except TensorGraphsError as exc:
            raise type(exc)(_with_positions(str(exc), self.arg_names)) from None

    def load_into(self, module) -> None:
        """Write the trained parameters into ``module`` (``load_state_dict``, not strict:
        buffers and frozen parameters are the module's own). A tied parameter is written under
        each of its names: one copy into the shared tensor, or each copy where a module unties
        them."""
        trained = {n: to_torch(v) for n, v in self.weights().items()}  # bfloat16 too
        state = {**trained, **{n: trained[first] for n, first in self.aliases.items()
                               if first in trained}}
        missing = sorted(set(state) - set(module.state_dict()))
        if missing:
            raise ArgumentError(f"load_into: the module has no {missing}; give the module "
                                "this trainer was made from")
        module.load_state_dict(state, strict=False)


def _with_positions(message: str, names: Sequence[str | None]) -> str:
    """``message`` with each of the export wrapper's input names followed by its position in
    ``example_args``: the wrapper's ``forward(*values)`` names them values_0, values_1...,
    which the caller, who passed them by position, never wrote."""
    for i, name in enumerate(names):
        if name:
            message = message.replace(f"'{name}'", f"'{name}' (example_args[{i}])", 1)
    return message


# what ``options`` may hold beside tg.compile's: tg.Trainer's own (compile's others pass on)
_TRAINER_OPTIONS = ("max_grad_norm", "accumulate", "device", "tolerance", "seed")


def _check_options(options: Mapping) -> None:
    """Refuse an option the Trainer does not take before anything is exported: one of
    inference's (``quantize=``, ``weights=``, ``kwargs=``) or a slip reached compile as a
    bare TypeError, after the export."""
    from tensor_graphs.compiler import refuse_unknown_options
    from tensor_graphs.frontend.torch_export import _OWN_OPTIONS

    refuse_unknown_options(
        "from_torch(train=True)", options,
        ("loss_fn", "optimizer", "targets", "dynamic_shapes", *_TRAINER_OPTIONS),
        dict.fromkeys(_OWN_OPTIONS, "an option of tg.from_torch for inference, not train=True"))


def trainer_from_torch(module, example_args: Sequence, *, loss_fn: Callable, optimizer,
                       targets: int = 1, dynamic_shapes=None, **options) -> TorchTrainer:
    """The Trainer of ``loss_fn(module(*inputs), *targets)``: ``example_args`` holds the
    module's inputs followed by ``targets`` target tensors (torch tensors or arrays of the
    batch's shapes). ``options`` go to ``tg.Trainer`` (device, tolerance, bounds, db, the
    dropouts' ``seed``, ``max_grad_norm``, ``accumulate``...); the optimizer's ``groups=``
    name parameters by their state-dict names (``"0.bias"``)."""
    _check_options(options)
    torch = _torch()
    from tensor_graphs.frontend.torch_export import _dim_names, _export, import_exported

    if not callable(loss_fn):
        raise ArgumentError("from_torch(train=True): give loss_fn=, a function (output, "
                            "*targets) -> scalar tensor, e.g. torch.nn.functional.cross_entropy")
    args = tuple(torch.as_tensor(a) if isinstance(a, np.ndarray) else a for a in
                 (example_args if isinstance(example_args, (tuple, list)) else (example_args,)))
    if not 0 <= targets < len(args):
        raise ArgumentError(f"from_torch(train=True): targets={targets} but example_args holds "
                            f"{len(args)} values; the module needs at least one input")
    n_inputs = len(args) - targets
    shapes = _wrapper_shapes(module, loss_fn, args, n_inputs, dynamic_shapes)

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = module

        def forward(self, *values):
            return loss_fn(self.module(*values[:n_inputs]), *values[n_inputs:])

        def train(self, mode=True):  # the export's eval(): the module's own mode decides
            return self

    aliases, trained = _parameter_names(module)
    if not trained:
        raise ArgumentError(f"from_torch(train=True): {type(module).__name__} has no parameter "
                            "that requires grad; nothing would train")
    modes = {m: m.training for m in module.modules()}
    for m in module.modules():  # batch norm reads its running statistics, as in inference
        if isinstance(m, torch.nn.modules.batchnorm._NormBase):
            m.eval()
    try:
        wrapper = WithLoss()
        exported = inline_grad_regions(_export(wrapper, args, shapes, grad=True))
    finally:
        for m, training in modes.items():
            m.training = training
    user = [s for s in exported.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    with training_rng(tg.rng(name=RNG)):
        outputs, inputs, weights, bounds = import_exported(
            exported, _dim_names(wrapper, args, shapes, user))
    loss = outputs[0] if len(outputs) == 1 and isinstance(outputs[0], Node) else None
    if loss is None or loss.ndim:
        raise ArgumentError("from_torch(train=True): loss_fn must return one scalar tensor "
                            "(reduction='mean' or 'sum')")

    def own(name: str) -> str:  # the module's state-dict name; a tied parameter's first
        name = name[len(PREFIX):] if name.startswith(PREFIX) else name
        return aliases.get(name, name)

    # torch.export keeps a placeholder per name of a tied parameter and reads whichever it
    # picks: each becomes the one weight of the first name (hash-consed: one leaf)
    loss = substitute(loss, {leaf: tg.weight(own(leaf.name), tuple(leaf.shape), leaf.dtype)
                             for leaf in nodes(loss) if leaf.op.name == WEIGHT})
    values = {own(n): v for n, v in weights.items()}
    read = {leaf.name for leaf in nodes(loss) if leaf.op.name == WEIGHT}
    params = sorted(trained & read)
    unread = sorted(trained - read)
    if unread:  # torch.optim skips them too (no .grad): said, never dropped in silence
        warnings.warn(f"from_torch(train=True): the loss does not read {unread} "
                      f"({type(module).__name__}'s parameters that require grad); they are "
                      "left unchanged, as torch.optim leaves a parameter whose .grad is None",
                      stacklevel=3)
    if not params:
        raise ArgumentError(f"from_torch(train=True): the loss reads none of "
                            f"{type(module).__name__}'s parameters that require grad "
                            f"({sorted(trained)}); nothing would train")
    used = {str(s) for n in nodes(loss) for d in n.shape for s in getattr(d, "free_symbols",
                                                                          ())}
    if used and (bounds or options.get("bounds")):  # the caller's bounds= override the Dims'
        options["bounds"] = {**{k: v for k, v in bounds.items() if k in used},
                             **(options.get("bounds") or {})}
    trainer = TorchTrainer(loss, params, optimizer=optimizer, **options)
    trainer.arg_names = [getattr(i, "name", None) for i in inputs]
    trainer.aliases = {n: first for n, first in aliases.items() if n != first}
    trainer.bind(**{n: v for n, v in values.items() if n in trainer.params or n in trainer.frozen})
    return trainer


def _parameter_names(module) -> tuple[dict[str, str], set[str]]:
    """Every name of each of ``module``'s parameters -> its first name (the one
    ``named_parameters()`` keeps), and the first names of those that require grad. Why every
    name: a tied parameter is one tensor under several names, and torch.export may read it
    under any of them (GPT-2's table under ``lm_head.weight``); trained under its first name
    only, a use under another would read a frozen copy."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    trained: set[str] = set()
    for name, p in module.named_parameters(remove_duplicate=False):
        aliases[name] = first.setdefault(id(p), name)
        if p.requires_grad:
            trained.add(aliases[name])
    return aliases, trained


def _wrapper_shapes(module, loss_fn, args: tuple, n_inputs: int, dynamic_shapes):
    """The export wrapper's ``dynamic_shapes`` from the caller's. The caller names the values
    as inference ``from_torch`` does: a sequence with one entry per value of ``example_args``
    (the module's inputs, then the targets), or a mapping by the forward's parameter names and
    the loss function's for the targets (``F.cross_entropy``'s ``target``). The wrapper takes
    them all as ``forward(*values)``, whose one entry torch wants as the tuple of all: the
    caller never sees that wrapper."""
    if dynamic_shapes is None:
        return None
    owner = f"{type(module).__name__}.forward"
    if isinstance(dynamic_shapes, Mapping):
        return (tuple(_shapes_by_name(module, loss_fn, args, n_inputs, dynamic_shapes)),)
    if not isinstance(dynamic_shapes, (tuple, list)):
        raise ArgumentError(f"from_torch(train=True): dynamic_shapes must be a tuple with one "
                            f"entry per value of example_args or a dict by parameter name, got "
                            f"{type(dynamic_shapes).__name__}")
    if len(dynamic_shapes) != len(args):
        raise ArgumentError(
            f"from_torch(train=True): dynamic_shapes has {len(dynamic_shapes)} entries but "
            f"example_args holds {len(args)} values ({n_inputs} input(s) of {owner}, then "
            f"{len(args) - n_inputs} target(s)); give one entry per value, e.g. "
            f"({', '.join(['{0: batch}'] * len(args))}), None for a static one")
    return (tuple(dynamic_shapes),)


def _shapes_by_name(module, loss_fn, args: tuple, n_inputs: int, by_name: Mapping) -> list:
    """One ``dynamic_shapes`` entry per value from a mapping naming the forward's parameters
    and the loss function's target parameters; a name of neither is refused with both lists
    (torch would otherwise fail on the wrapper's ``values``)."""
    owner = f"{type(module).__name__}.forward"
    inputs = _bound_names(module.forward, args[:n_inputs], owner)
    output, *targets = _bound_names(loss_fn, (None, *args[n_inputs:]), "loss_fn")
    if output[1] is not None:  # loss_fn(*values): the output is the first of them
        targets = [(output[0], output[1] - 1)]
    both = sorted({n for n, _ in inputs} & {n for n, _ in targets})
    if both:
        raise ArgumentError(f"from_torch(train=True): dynamic_shapes names {both}, a parameter "
                            f"of both {owner} and loss_fn; give a tuple with one entry per "
                            "value of example_args instead")
    known = [n for n, _ in inputs] + [n for n, _ in targets]
    unknown = sorted(set(by_name) - set(known))
    if unknown:
        raise ArgumentError(
            f"from_torch(train=True): dynamic_shapes names {unknown}, which are neither "
            f"{owner}'s inputs {[n for n, _ in inputs]} nor the targets' parameters of loss_fn "
            f"{[n for n, _ in targets]}; or give a tuple with one entry per value of "
            "example_args")
    specs: list = []
    for name, count in inputs + targets:
        spec = by_name.get(name)
        if count is None:
            specs.append(spec)
        elif spec is None:
            specs.extend([None] * count)
        elif isinstance(spec, (tuple, list)) and len(spec) == count:
            specs.extend(spec)
        else:  # a *args parameter: a sequence with one entry per value it took
            raise ArgumentError(f"from_torch(train=True): dynamic_shapes['{name}'] is for a "
                                f"*args parameter that took {count} values: give a tuple of "
                                f"{count} entries")
    return specs


def _bound_names(fn, values: tuple, owner: str) -> list[tuple[str, int | None]]:
    """(parameter name, how many values a ``*args`` parameter took, else None) for each
    parameter ``values`` bind to by position, in order."""
    try:
        signature = inspect.signature(fn)
        bound = signature.bind_partial(*values).arguments
    except (TypeError, ValueError) as exc:
        raise ArgumentError(f"from_torch(train=True): dynamic_shapes by name needs {owner}'s "
                            f"parameter names ({exc}); give a tuple with one entry per value "
                            "of example_args instead") from None
    return [(n, len(v) if signature.parameters[n].kind == inspect.Parameter.VAR_POSITIONAL
             else None) for n, v in bound.items()]


def _torch():
    import torch

    return torch
