"""What every optimizer shares: the update graph's record (``Updates``), the scalar states
(learning rate, step count), and the checks of parameters and gradients.

An optimizer step is a graph over ``tg.state``: each parameter and each moment is a state
whose new version (a ``state_update`` over its whole length) the compiled program keeps, so
the values never leave the program between calls and one call is one step. The learning rate
and the step count are states too, of shape (1,): a schedule binds a new learning rate and the
count grows inside the program, so no step changes a dim, a constant or a weight, and nothing
is planned again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from tensor_graphs.errors import ArgumentError, DTypeError, ShapeError
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.dtypes import DType, float32, float64
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import STATE
from tensor_graphs.ir.shapes import dims_equal, format_shape, is_static

__all__ = ["Optimizer", "Updates"]


@dataclass(frozen=True)
class Updates:
    """One optimizer step as graphs: compile ``outputs`` (with whatever else the step returns,
    a loss say), bind the parameters' values and ``state_init()``, then each call is a step.

    ``params``: the caller's key -> the parameter's new version. ``states``: state name -> its
    new version, for every state the step changes (parameters, moments, the count); these are
    what the program keeps. ``lr`` and ``count``: the names of the learning-rate and step-count
    states (the learning rate is read, never written: binding a new one writes into its
    buffer, which changes no plan and keeps the native loop's recording). ``init``: the
    optimizer's own states' initial values (moments zero, count 0, the learning rate given),
    the parameters' excluded: they are the caller's.
    """

    params: dict[str, Node]
    states: dict[str, Node]
    lr: str
    count: str
    init: dict[str, np.ndarray] = field(repr=False)
    lr_dtype: DType = float32

    @property
    def outputs(self) -> list[Node]:
        """The new versions to compile as outputs (a state is kept only when returned)."""
        return list(self.states.values())

    def state_init(self) -> dict[str, np.ndarray]:
        """Fresh copies of the optimizer's initial states, for ``prog.bind(**...)``."""
        return {name: value.copy() for name, value in self.init.items()}

    def lr_value(self, lr: float) -> dict[str, np.ndarray]:
        """The binding that sets the learning rate: ``prog.bind(**updates.lr_value(1e-4))``."""
        _check_lr(lr)
        return {self.lr: np.array([lr], self.lr_dtype.np_dtype)}


def _check_lr(lr: float) -> None:
    if not _real(lr) or not lr >= 0.0:
        raise ArgumentError(f"optimizer: invalid learning rate {lr!r}; give a float >= 0")


def _real(value) -> bool:
    """A plain number (numpy's too), not a bool: True as a momentum or an eps is a mistake."""
    return isinstance(value, (int, float, np.integer, np.floating)) \
        and not isinstance(value, (bool, np.bool_))


def check_number(owner: str, what: str, value, below_one: bool = False) -> float:
    """``value`` as a float: a real number >= 0 (and < 1 with ``below_one``: a decay rate).
    Anything else (a str, None, nan, a bool) is an ``ArgumentError`` naming ``owner``'s
    argument, not a TypeError from a comparison."""
    if not _real(value) or not (0.0 <= value < 1.0 if below_one else value >= 0.0):
        raise ArgumentError(f"{owner}: invalid {what} {value!r}; give a float "
                            + ("in [0, 1)" if below_one else ">= 0"))
    return float(value)


def check_flag(owner: str, what: str, value) -> bool:
    """``value``, a bool: "no" or 0.9 passed for ``nesterov=`` would be taken as true."""
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentError(f"{owner}: {what} must be True or False, got {value!r}")
    return bool(value)


class Optimizer:
    """A rule that turns parameters and their gradients into the next step's values.

    Subclasses give ``_step(p, g, scalars, slot)`` for one parameter: its new value, after
    writing their moments' new versions with ``slot``. ``prefix`` names the optimizer's own
    states (``f"{prefix}lr"``, ``f"{prefix}step"``, ``f"{prefix}{param}.exp_avg"``); two
    optimizers in one program need different prefixes.
    """

    name = "optimizer"

    def __init__(self, lr: float, *, prefix: str = "optim."):
        _check_lr(lr)
        if not isinstance(prefix, str):
            raise ArgumentError(f"{self.name}: prefix must be a str (the start of the "
                                f"optimizer's state names, e.g. 'optim.'), got {prefix!r}")
        self.lr = float(lr)
        self.prefix = prefix

    def update(self, params: Mapping[str, Node], grads: Mapping[str, Node]) -> Updates:
        """The step's graphs for ``params`` (``tg.state`` leaves of static shape, by key) given
        ``grads`` (any nodes of the same shapes and dtypes, by the same keys). A parameter
        without a gradient is left as it is, as torch.optim skips one whose ``.grad`` is None;
        the count still advances."""
        params, grads = dict(params), dict(grads)
        _check(self.name, params, grads)
        if not grads:
            raise ArgumentError(f"{self.name}.update: no gradients given; pass grads for some "
                                f"of the parameters {sorted(params)}")
        lr_dtype = float64 if any(p.dtype == float64 for p in params.values()) else float32
        lr = tg.state(f"{self.prefix}lr", (1,), lr_dtype)
        # float32 as torch keeps state["step"] (whole numbers exact to 2**24 steps): a C
        # kernel adds it, where an int64 add ran in numpy and kept the step from the native loop
        count = tg.state(f"{self.prefix}step", (1,), float32)
        t = count + 1  # this step's number, 1 on the first step (torch.optim's count)
        init = {lr.name: np.array([self.lr], lr_dtype.np_dtype),
                count.name: np.zeros(1, np.float32)}
        states: dict[str, Node] = {}
        new_params: dict[str, Node] = {}
        for key, g in grads.items():
            p = params[key]
            scalars = _Scalars(lr, count, t, p.dtype)

            def slot(what: str, update, p=p) -> Node:
                """The moment ``what`` of ``p``: its current version, zero at first;
                ``update(old) -> new`` gives the version this step keeps."""
                leaf = tg.state(f"{self.prefix}{p.name}.{what}", tuple(p.shape), p.dtype)
                init[leaf.name] = np.zeros(tuple(p.shape), p.dtype.np_dtype)
                new = update(leaf)
                states[leaf.name] = tg.state_update(leaf, new)
                return new

            new_params[key] = states[p.name] = tg.state_update(p, self._step(p, g, scalars,
                                                                              slot))
        states[count.name] = tg.state_update(count, t)
        return Updates(new_params, states, lr.name, count.name, init, lr_dtype)

    def _step(self, p: Node, g: Node, s: _Scalars, slot) -> Node:
        raise NotImplementedError


class _Scalars:
    """The step's scalars in one parameter's dtype, shape (1,) (they broadcast): the learning
    rate, the count before this step and this step's number, cast once per dtype. Scalars
    made of scalars (the bias corrections) are computed ``wide``: in float32 at least, as
    torch computes them in double, then ``narrow``-ed to the parameter's dtype. In bfloat16
    0.999 rounds to 1.0, so ``1 - beta2**t`` was 0 and Adam never moved a bf16 parameter."""

    def __init__(self, lr: Node, count: Node, t: Node, dtype: DType):
        self.lr = tg.cast(lr, dtype)
        self.count = count
        self.t = tg.cast(t, dtype)
        self.dtype = dtype
        self.wide = dtype if dtype.itemsize >= 4 else float32
        self.lr_wide = tg.cast(lr, self.wide)
        self._t_wide = tg.cast(t, self.wide)

    def power(self, base: float) -> Node:
        """``base ** t`` (the bias corrections' decay after t steps), in the ``wide`` dtype."""
        return tg.pow(tg.constant(np.array([base], self.wide.np_dtype)), self._t_wide)

    def narrow(self, x: Node) -> Node:
        """A ``wide`` scalar in the parameter's dtype, to meet its tensors."""
        return x if self.wide == self.dtype else tg.cast(x, self.dtype)


def _check(name: str, params: dict[str, Node], grads: dict[str, Node]) -> None:
    """Parameters are float states of static shape; each gradient matches its parameter."""
    extra = sorted(set(grads) - set(params))
    if extra:
        raise ArgumentError(f"{name}.update: gradients {extra} have no parameter; the "
                            f"parameters are {sorted(params)}")
    seen: dict[str, str] = {}
    for key, p in params.items():
        if not isinstance(p, Node) or p.op.name != STATE:
            what = p.op.name if isinstance(p, Node) else type(p).__name__
            raise ArgumentError(f"{name}.update: parameter '{key}' is a {what}; parameters must "
                                "be tg.state leaves, which the program updates in place "
                                f"(tg.state('{key}', shape, dtype))")
        if not is_static(p.shape):
            raise ShapeError(f"{name}.update: parameter '{key}' has symbolic shape "
                             f"{format_shape(p.shape)}; a parameter's shape must be fixed")
        if p.ndim == 0:  # its new version is a state_update, which writes along an axis
            raise ShapeError(f"{name}.update: parameter '{key}' is 0-d; a state is updated "
                             f"along an axis, so hold it as tg.state('{p.name}', (1,), "
                             f"'{p.dtype.name}') and read it as .reshape(()) in the loss "
                             "(tg.Trainer does this for a 0-d weight)")
        if not p.dtype.is_float:
            raise DTypeError(f"{name}.update: parameter '{key}' is {p.dtype.name}; only float "
                             "parameters can be optimized")
        if p.name in seen:
            raise ArgumentError(f"{name}.update: parameters '{seen[p.name]}' and '{key}' are the "
                                f"same state '{p.name}'; give each once")
        seen[p.name] = key
    for key, g in grads.items():
        p = params[key]
        if not isinstance(g, Node):
            raise ArgumentError(f"{name}.update: the gradient of '{key}' is a "
                                f"{type(g).__name__}; give a graph node (tg.input or tg.grad)")
        if g.ndim != p.ndim or not all(dims_equal(a, b) for a, b in zip(g.shape, p.shape)):
            raise ShapeError(f"{name}.update: the gradient of '{key}' has shape "
                             f"{format_shape(g.shape)}, the parameter {format_shape(p.shape)}; "
                             "they must be equal")
        if g.dtype != p.dtype:
            raise DTypeError(f"{name}.update: the gradient of '{key}' is {g.dtype.name}, the "
                             f"parameter {p.dtype.name}; cast the gradient "
                             f"(g.astype('{p.dtype.name}'))")
