"""``tg.Trainer``: a loss, its gradients and an optimizer's step compiled as one program.

Why one program: the planner then sees the forward, the backward and the update together
(fused and generated kernels apply to all three, the memory plan keeps alive only what the
backward reads), and a step is one call with nothing planned per step. The model's weights are
written as ``tg.weight`` leaves (what ``tg.nn`` layers declare, so the same model code serves
inference and training); the trainer turns the trained ones into ``tg.state`` leaves of the
same names, which the optimizer's program updates in place::

    model = tg.nn.GPT2(tg.nn.GPT2Config(vocab_size=96, n_embd=64, n_layer=2, n_head=4))
    logits = model(tg.input("ids", (8, 64), "int64"))
    loss = tg.cross_entropy(logits.reshape((-1, 96)), tg.input("targets", (8 * 64,), "int64"))
    trainer = tg.Trainer(loss, optimizer=tg.optim.AdamW(1e-3))   # every float weight trained
    trainer.bind(**initial_weights)
    for ids, targets in batches:
        print(trainer.step(ids=ids, targets=targets))
    trainer.save("model.safetensors")
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from tensor_graphs.compiler import compile as compile_graph
from tensor_graphs.compiler import estimate_memory as estimate
from tensor_graphs.compiler import resolve_tolerance
from tensor_graphs.errors import (
    ArgumentError,
    FeedError,
    ShapeError,
    StateError,
    TensorGraphsError,
)
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.autodiff import grad
from tensor_graphs.ir.grad_rules import zeros
from tensor_graphs.ir.graph import leaves, nodes, substitute
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import INPUT, STATE, WEIGHT
from tensor_graphs.ir.ops.random import advance, check_sites, initial, rng_states
from tensor_graphs.ir.shapes import format_shape
from tensor_graphs.optim.base import Optimizer, check_accumulate, check_max_grad_norm
from tensor_graphs.runtime.weights import (
    read_safetensors,
    read_safetensors_header,
    renamer,
    write_safetensors,
)

__all__ = ["Trainer"]

OPTIMIZER_KEY = "tensor_graphs.optimizer"  # metadata: the optimizer whose states a file holds


class Trainer:
    """One training step as one compiled program: ``step(**batch)`` runs the loss, its
    gradients (``tg.grad``) and ``optimizer``'s update, and returns the loss as a float.

    ``loss``: a float scalar over the model's weights and the batch's ``tg.input`` leaves.
    ``params``: what is trained, as leaves (``tg.weight`` or ``tg.state``) or their names;
    None trains every float weight the loss reads (the others stay frozen, bound with
    ``bind`` like any weight). ``extra``: more nodes the step returns (an accuracy, the
    logits), read with ``last``. ``seed``: where the generators of the loss's dropouts
    (``tg.rng``) start; the step advances them in place, so each step draws new masks and
    the same seed draws the same ones again. ``device``, ``tolerance`` (None: the default
    for the parameters' precision, as ``tg.compile``'s for its results) and
    ``compile_options`` go to ``tg.compile`` (``bounds=`` for a batch with symbolic dims,
    ``db=``, ``profile=``).

    What a torch training loop adds around ``optimizer.step()``, computed in the step's
    program (``Optimizer.update``): ``max_grad_norm`` clips the gradients by their global
    2-norm as ``torch.nn.utils.clip_grad_norm_(params, max_grad_norm)`` does before the step;
    ``accumulate=N`` makes each ``step`` call a micro-batch and changes the weights on every
    N-th, with the mean of the N gradients (torch's ``(loss / N).backward()`` on each and
    ``optimizer.step()`` after the N-th); clipping then applies to that mean. Per-parameter
    learning rates and weight decays are the optimizer's ``groups=``.

    A parameter the loss does not read is an ``ArgumentError`` (a misspelt or wrong layer's
    weight would otherwise train nothing in silence). One it reads only through indices or
    masks (no gradient reaches it) is kept as it is with a warning, as torch.optim skips a
    parameter whose ``.grad`` is None.
    """

    def __init__(self, loss: Node, params: Sequence[Node | str] | None = None, *,
                 optimizer: Optimizer, device="cpu", tolerance: float | None = None,
                 extra: Sequence[Node] = (), seed: int = 0,
                 max_grad_norm: float | None = None, accumulate: int = 1, **compile_options):
        _check_loss(loss)
        if not isinstance(optimizer, Optimizer):
            raise ArgumentError(f"Trainer: optimizer must be a tg.optim optimizer "
                                f"(tg.optim.AdamW(1e-3), ...), got {type(optimizer).__name__}")
        # before the backward is built: a slip here is said at once
        max_grad_norm = check_max_grad_norm("Trainer", max_grad_norm)
        accumulate = check_accumulate("Trainer", accumulate)
        extra = list(extra)
        check_sites([loss, *extra])  # two dropouts sharing a mask: before the backward reuses it
        by_name = {leaf.name: leaf for leaf in leaves([loss, *extra])}
        chosen = _chosen(params, by_name, loss)
        # the trained weights become states of the same names: the program updates them. A
        # 0-d one (CLIP's logit_scale) is held as (1,), since a state_update writes along an
        # axis, and read as () where the loss read it; bind, weights and save speak ()
        held = {leaf: tg.state(leaf.name, tuple(leaf.shape) or (1,), leaf.dtype)
                for leaf in chosen if leaf.op.name == WEIGHT or leaf.ndim == 0}
        as_state = {leaf: state if leaf.ndim else tg.reshape(state, ())
                    for leaf, state in held.items()}
        loss, *extra = substitute([loss, *extra], as_state) if as_state else [loss, *extra]
        self.params: dict[str, Node] = {leaf.name: held.get(leaf, leaf) for leaf in chosen}
        self._scalars: set[str] = {leaf.name for leaf in chosen if leaf.ndim == 0}
        gradients = dict(zip(self.params, grad(loss, list(self.params.values()))))
        flowing = {n: g for n, g in gradients.items() if not _is_zeros(g)}
        stuck = sorted(set(gradients) - set(flowing))
        if stuck:
            warnings.warn(f"Trainer: no gradient reaches {stuck} (the loss reads them only "
                          "through indices, masks or comparisons); they are left unchanged",
                          stacklevel=2)
        if not flowing:
            raise ArgumentError(f"Trainer: no gradient reaches any parameter {sorted(gradients)}; "
                                "nothing would train")
        self.updates = optimizer.update(self.params, flowing, max_grad_norm=max_grad_norm,
                                        accumulate=accumulate)
        self.optimizer = optimizer
        self.loss, self.extra = loss, extra
        self.outputs: list[Node] = [loss, *extra, *self.updates.outputs]
        generators = rng_states(self.outputs)
        self.rngs = {s.name: initial(seed) for s in generators}
        self.outputs += [advance(s) for s in generators]  # one step further per call
        # by default the precision of what trains (the parameters), not of the step's every
        # output: a bfloat16 model's optimizer still counts its steps in float32, and its loss
        # is often taken in float32 (logits.float(), as transformers does), which at 1e-5
        # left its bfloat16 layers no path at all
        tolerance = resolve_tolerance(tolerance, list(self.params.values()))
        self.program = compile_graph(self.outputs, device=device, tolerance=tolerance,
                                     **compile_options)
        self.program.bind(**self.updates.state_init(), **self.rngs)
        self.inputs: dict[str, Node] = {lf.name: lf for lf in leaves(self.outputs)
                                        if lf.op.name == INPUT}
        self._optim_states = set(self.updates.init) | set(self.rngs)  # resumed together
        self.frozen: dict[str, Node] = _frozen(self.outputs, {*self.params, *self._optim_states})
        self._bound: set[str] = set()  # the parameters and frozen weights given values
        self._compile = dict(device=device, tolerance=tolerance,
                             **{k: v for k, v in compile_options.items()
                                if k in ("db", "backends")})
        self.last: list[np.ndarray] = []  # the extra outputs of the last step

    # ------------------------------------------------------------------------ values
    def bind(self, **values) -> Trainer:
        """Initial values of the parameters and frozen weights (and, to resume, the
        optimizer's states by their names: ``optim.<param>.exp_avg``, ``optim.step``).
        Binding a parameter again restarts it from that value; the optimizer's moments carry
        on unless bound too."""
        unknown = sorted(set(values) - set(self.params) - set(self.frozen)
                         - self._optim_states)
        if unknown:
            raise FeedError(f"Trainer.bind: {unknown} are neither parameters nor frozen "
                            f"weights; parameters: {sorted(self.params)}, frozen: "
                            f"{sorted(self.frozen) or 'none'}"
                            + (f" (the batch's inputs {sorted(set(unknown) & set(self.inputs))}"
                               " are fed to step())" if set(unknown) & set(self.inputs) else ""))
        held = {n: self._held(n, v) for n, v in values.items()}
        try:
            self.program.bind(**held)
        except TensorGraphsError as exc:  # the program's "bind: ..." said once, as the trainer
            raise type(exc)(f"Trainer.bind: {str(exc).removeprefix('bind: ')}") from None
        self._bound.update(values)
        return self

    def _held(self, name: str, value):
        """A parameter's ``value`` checked against the shape the loss declares and given as
        the program holds it: a 0-d one as (1,) (see __init__; the (1,) of
        ``trainer.params[name].shape`` is taken too: one value either way)."""
        if name not in self.params:
            return value
        shape = tuple(np.shape(value))
        declared = () if name in self._scalars else tuple(self.params[name].shape)
        if shape != declared and not (name in self._scalars and shape == (1,)):
            raise ShapeError(f"Trainer.bind: parameter '{name}' has shape "
                             f"{format_shape(shape)}, the loss declares {format_shape(declared)}")
        if name not in self._scalars:
            return value
        return value.reshape(1) if hasattr(value, "reshape") else np.reshape(value, (1,))

    def bind_safetensors(self, path, *, strict: bool = False, rename=None) -> Trainer:
        """Bind every parameter and frozen weight the file holds, by name (``rename`` as in
        ``prog.bind_safetensors``); the optimizer's states too where the file holds them
        (a checkpoint written by ``save(path, optimizer=True)``). Weights already bound may be
        missing from the file; any other missing one raises before anything is bound."""
        self._check_optimizer(path, rename)
        leaves_wanted = {**self.params, **self.frozen}
        wanted = {n: (() if n in self._scalars else tuple(lf.shape), lf.dtype)
                  for n, lf in leaves_wanted.items()}
        by_name = {lf.name: lf for lf in leaves(self.outputs)}
        wanted.update((n, (tuple(by_name[n].shape), by_name[n].dtype))
                      for n in self._optim_states)
        bound = (self._bound & set(leaves_wanted)) | self._optim_states
        arrays = read_safetensors(path, wanted, strict=strict, rename=rename, optional=bound)
        return self.bind(**arrays)

    def _check_optimizer(self, path, rename) -> None:
        """Optimizer states resume only the optimizer that saved them: an AdamW checkpoint's
        learning rate and count bound into an SGD trainer changed its learning rate in
        silence, and moments of another rule mean nothing to this one. The optimizer is
        known from the file's metadata (``save`` records it); without it (another writer),
        states under this optimizer's prefix that it does not keep tell."""
        header = read_safetensors_header(path)
        rename = renamer(rename)  # a mapping as prog.bind_safetensors takes it, too
        names = {rename(n) if rename is not None else n for n in header.tensors} - {None}
        saved_by = (header.metadata or {}).get(OPTIMIZER_KEY)
        prefix, mine = self.optimizer.prefix, self.optimizer.name
        foreign = sorted(n for n in names - self._optim_states - set(self.params)
                         - set(self.frozen) if n.startswith(prefix))
        other = saved_by is not None and saved_by != mine and bool(names & self._optim_states)
        if not (other or foreign):
            return
        held = (f"the optimizer states of {saved_by}" if saved_by is not None and saved_by != mine
                else f"optimizer states this {mine} does not keep ({foreign[:4]}"
                     + (" ..." if len(foreign) > 4 else "") + ")")
        raise ArgumentError(
            f"Trainer.bind_safetensors: {path} holds {held}; this trainer's optimizer is "
            f"{mine}, whose learning rate, count and moments they would replace. Resume with "
            f"the optimizer that saved them, or load the parameters only: "
            f"trainer.bind_safetensors(path, rename=lambda n: None if "
            f"n.startswith({prefix!r}) else n)")

    def weights(self) -> dict[str, np.ndarray]:
        """The parameters' current values (copies, by name, in the shapes the loss declares)."""
        self._check_bound("Trainer.weights")
        values = {name: np.array(self.program.state(name)) for name in self.params}
        return {name: v.reshape(()) if name in self._scalars else v for name, v in values.items()}

    def save(self, path, *, optimizer: bool = False) -> None:
        """The parameters and the frozen weights bound, as a safetensors file that
        ``bind_safetensors`` (or a model's ``prog.bind_safetensors``) reads back; with
        ``optimizer``, the optimizer's states too, to resume training. Written atomically: an
        error leaves no half-written file (any file there before stays as it was)."""
        self._check_bound("Trainer.save")
        # the frozen weights as the program holds them (cast to the leaf's dtype when bound),
        # not the caller's arrays, which may have changed since or be of another dtype
        frozen = self.program.bound_weights(sorted(self._bound & set(self.frozen)))
        arrays: dict[str, np.ndarray] = {**frozen, **self.weights()}
        if optimizer:
            arrays.update((n, np.array(self.program.state(n)))
                          for n in sorted(self._optim_states))
        write_safetensors(path, arrays,
                          metadata={OPTIMIZER_KEY: self.optimizer.name} if optimizer else None)

    def _check_bound(self, what: str) -> None:
        """Every parameter has a value (the optimizer's states have theirs from the start)."""
        unbound = sorted(set(self.params) - self._bound)
        if unbound:
            raise StateError(f"{what}: parameter(s) {unbound} have no value yet: "
                             "trainer.bind(" + ", ".join(f"{n}=..." for n in unbound) + ")")

    # ------------------------------------------------------------------------ steps
    def step(self, **batch) -> float:
        """One training step on ``batch`` (the loss's inputs by name); returns the loss
        before this step's update, as torch's ``loss.item()`` after ``backward``. With
        ``accumulate=N`` a call is one micro-batch and the weights change on every N-th."""
        other = sorted(set(batch) - set(self.inputs))
        if other:
            raise FeedError(f"Trainer.step: {other} are not inputs of the loss; feed only the "
                            f"batch's inputs {sorted(self.inputs)} (parameters and weights go "
                            "to bind())")
        unbound = sorted((set(self.params) | set(self.frozen)) - self._bound)
        if unbound:  # before the program's own error, which names prog.bind
            raise FeedError(f"Trainer.step: parameter(s) or frozen weight(s) {unbound} are not "
                            "bound: call trainer.bind(" + ", ".join(f"{n}=..." for n in unbound)
                            + ") or trainer.bind_safetensors(path) first")
        try:
            out = self.program(**batch)
        except TensorGraphsError as exc:
            raise type(exc)(f"Trainer.step: {exc}") from None
        self.last = [np.asarray(o) for o in out[1:1 + len(self.extra)]]
        return float(np.asarray(out[0]))

    @property
    def lr(self) -> float:
        """The learning rate the next step uses (an optimizer state, there from the start);
        that of the parameters in none of the optimizer's ``groups``."""
        return float(self.program.state(self.updates.lr_name())[0])

    def set_lr(self, lr: float, group: int | None = None) -> None:
        """A new learning rate from the next step on (a schedule): written into its state,
        nothing is planned again. ``group``: that of the optimizer's ``groups[group]`` with an
        ``lr`` of its own (the others share the optimizer's, which None sets)."""
        self.program.bind(**self.updates.lr_value(lr, group))

    @property
    def steps(self) -> int:
        """Steps taken (the optimizer's count, there from the start): with ``accumulate=N``,
        the weights' updates, one per N calls."""
        return int(self.program.state(self.updates.count)[0])

    # ------------------------------------------------------------------------ memory
    def memory(self) -> dict[str, int]:
        """Bytes per device the training step's plan holds: arena (activations kept for the
        backward, gradients, reused after their last use) + frozen weights + states
        (parameters, moments); as ``prog.memory()``."""
        return self.program.memory()

    def estimate_memory(self, **dims) -> dict[str, int]:
        """``tg.estimate_memory`` of the whole step (forward, backward and update) for these
        dims: from the plan alone, nothing allocated."""
        return estimate(self.outputs, **self._compile, **dims)


def _check_loss(loss) -> None:
    if not isinstance(loss, Node):
        raise ArgumentError(f"Trainer: loss must be a graph node, got {type(loss).__name__}")
    if loss.ndim or not loss.dtype.is_float:
        raise ShapeError(f"Trainer: the loss must be a float scalar, got {loss.dtype.name} "
                         f"{format_shape(loss.shape)}; reduce it (loss.mean())")


def _frozen(outputs: Sequence[Node], own: set[str]) -> dict[str, Node]:
    """The leaves bound once and never trained: the weights not trained, and the states the
    step reads but neither the parameters nor the optimizer's (a state the loss reads and
    nothing updates is a constant, which ``bind`` must take: it refused it as unknown)."""
    return {lf.name: lf for lf in leaves(outputs)
            if lf.op.name == WEIGHT or (lf.op.name == STATE and lf.name not in own)}


def _chosen(params, by_name: Mapping[str, Node], loss: Node) -> list[Node]:
    """The trained leaves: those given (nodes or names), or every float weight the loss
    reads; each a float weight or state the loss reads."""
    if params is None:
        found = [lf for lf in by_name.values() if lf.op.name == WEIGHT and lf.dtype.is_float]
        if not found:
            raise ArgumentError("Trainer: the loss reads no float tg.weight to train; pass "
                                "params=[...] (weights or states)")
        return found
    if isinstance(params, (Node, str)):
        params = [params]
    read = set(nodes(loss))
    chosen: list[Node] = []
    for p in params:
        leaf = by_name.get(p) if isinstance(p, str) else p
        if not isinstance(leaf, Node):
            known = sorted(n for n, lf in by_name.items() if lf.op.name in (WEIGHT, STATE))
            raise ArgumentError(f"Trainer: parameter {p!r} is not a weight the loss reads; its "
                                f"weights are {known or 'none'}")
        if leaf.op.name not in (WEIGHT, STATE):
            raise ArgumentError(f"Trainer: parameter {leaf!r} is a {leaf.op.name}; parameters "
                                "are tg.weight or tg.state leaves")
        if leaf not in read:
            raise ArgumentError(f"Trainer: the loss does not read parameter '{leaf.name}' "
                                f"{format_shape(leaf.shape)}; leave it out of params or use it "
                                "in the loss")
        if leaf in chosen:
            raise ArgumentError(f"Trainer: parameter '{leaf.name}' is given twice")
        chosen.append(leaf)
    if not chosen:
        raise ArgumentError("Trainer: params is empty; give the weights to train")
    return chosen


def _is_zeros(g: Node) -> bool:
    """Whether a gradient is tg.grad's "nothing reached it" (its zeros node: hash-consed, so
    the same node)."""
    return g is zeros(tuple(g.shape), g.dtype)
