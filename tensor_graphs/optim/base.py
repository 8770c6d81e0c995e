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

from collections.abc import Mapping, Sequence
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
    group_lrs: tuple[str, ...] = ()

    @property
    def outputs(self) -> list[Node]:
        """The new versions to compile as outputs (a state is kept only when returned)."""
        return list(self.states.values())

    def state_init(self) -> dict[str, np.ndarray]:
        """Fresh copies of the optimizer's initial states, for ``prog.bind(**...)``."""
        return {name: value.copy() for name, value in self.init.items()}

    def lr_value(self, lr: float, group: int | None = None) -> dict[str, np.ndarray]:
        """The binding that sets the learning rate: ``prog.bind(**updates.lr_value(1e-4))``;
        ``group``: that of the optimizer's ``groups[group]`` (see ``lr_name``)."""
        _check_lr(lr)
        return {self.lr_name(group): np.array([lr], self.lr_dtype.np_dtype)}

    def lr_name(self, group: int | None = None) -> str:
        """The state holding a learning rate: None the optimizer's, an int that of its
        ``groups[group]``. A group without an ``lr`` of its own shares the optimizer's state,
        so a schedule setting the optimizer's sets that group's too, as it would in torch."""
        if group is None:
            name = self.lr
        elif isinstance(group, int) and not isinstance(group, bool) \
                and 0 <= group < len(self.group_lrs):
            name = self.group_lrs[group]
        else:
            raise ArgumentError(f"optimizer: no parameter group {group!r}; the groups are "
                                f"0..{len(self.group_lrs) - 1}" if self.group_lrs else
                                f"optimizer: no parameter group {group!r}; the optimizer has "
                                "no groups= (give group=None)")
        if name not in self.init:
            raise ArgumentError(f"optimizer: no parameter reads the learning rate '{name}' "
                                "(every parameter is in a group with an lr of its own); set a "
                                "group's: group=0..")
        return name


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


def check_max_grad_norm(owner: str, value) -> float | None:
    """``max_grad_norm`` as a float > 0, or None (no clipping). 0 would zero every gradient
    and a negative one flip it: either is a slip, not a clipping."""
    if value is None:
        return None
    if not _real(value) or not 0.0 < value < np.inf:
        raise ArgumentError(f"{owner}: invalid max_grad_norm {value!r}; give a float > 0 (the "
                            "largest global 2-norm the gradients keep, e.g. 1.0), or None not "
                            "to clip")
    return float(value)


def check_accumulate(owner: str, value) -> int:
    """``accumulate`` as an int >= 1 (1: every call is a step)."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)) \
            or value < 1:
        raise ArgumentError(f"{owner}: invalid accumulate {value!r}; give an int >= 1, the "
                            "number of micro-batches (calls) whose mean gradient makes one "
                            "step (1: no accumulation)")
    return int(value)


_GROUP_KEYS = ("params", "lr", "weight_decay")


@dataclass(frozen=True)
class _Group:
    """One of ``groups=``: the parameters (by key) whose learning rate or weight decay differ
    from the optimizer's (None: the optimizer's)."""

    params: tuple[str, ...]
    lr: float | None = None
    weight_decay: float | None = None


def _check_groups(owner: str, groups) -> tuple[_Group, ...]:
    """``groups`` written as torch's ``param_groups`` less the default group (the optimizer's
    own arguments): ``[{"params": [names], "lr": ..., "weight_decay": ...}]``. Only the
    learning rate and the weight decay may differ; the parameters' names are checked by
    ``update``, which knows them."""
    if isinstance(groups, (str, Mapping)) or not isinstance(groups, (list, tuple)):
        raise ArgumentError(f"{owner}: groups must be a list of dicts, e.g. [{{'params': "
                            f"['fc.bias'], 'weight_decay': 0.0}}], got {groups!r}")
    checked = []
    for i, group in enumerate(groups):
        if not isinstance(group, Mapping) or "params" not in group:
            raise ArgumentError(f"{owner}: groups[{i}] must be a dict with 'params' (the "
                                f"parameters' names), got {group!r}")
        other = sorted(set(group) - set(_GROUP_KEYS))
        if other:
            raise ArgumentError(f"{owner}: groups[{i}] sets {other}; a group may set only 'lr' "
                                "and 'weight_decay' (the others apply to every parameter)")
        names = (group["params"],) if isinstance(group["params"], str) else group["params"]
        if not isinstance(names, (list, tuple)) or not names \
                or not all(isinstance(n, str) for n in names):
            raise ArgumentError(f"{owner}: groups[{i}]['params'] must be a non-empty list of "
                                f"parameter names, got {group['params']!r}")
        lr, decay = group.get("lr"), group.get("weight_decay")
        checked.append(_Group(
            tuple(names),
            None if lr is None else check_number(owner, f"lr in groups[{i}]", lr),
            None if decay is None else check_number(owner, f"weight_decay in groups[{i}]",
                                                    decay)))
    return tuple(checked)


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
    optimizers in one program need different prefixes. ``groups``: torch's parameter groups,
    for what differs per parameter (no weight decay for biases and norms, a smaller learning
    rate for a pretrained body): ``[{"params": ["fc.bias", "ln.weight"], "weight_decay": 0.0},
    {"params": ["head.weight"], "lr": 1e-4}]``, parameters by ``update``'s keys (a trainer's
    parameter names); a parameter in no group takes the optimizer's arguments. A group's own
    ``lr`` is the state ``f"{prefix}group{i}.lr"`` (a schedule sets it with
    ``lr_value(lr, group=i)``).
    """

    name = "optimizer"
    weight_decay = 0.0  # each subclass's own argument; a group's overrides it

    def __init__(self, lr: float, *, prefix: str = "optim.", groups: Sequence[Mapping] = ()):
        _check_lr(lr)
        if not isinstance(prefix, str):
            raise ArgumentError(f"{self.name}: prefix must be a str (the start of the "
                                f"optimizer's state names, e.g. 'optim.'), got {prefix!r}")
        self.lr = float(lr)
        self.prefix = prefix
        self.groups = _check_groups(self.name, groups)

    def update(self, params: Mapping[str, Node], grads: Mapping[str, Node], *,
               max_grad_norm: float | None = None, accumulate: int = 1) -> Updates:
        """The step's graphs for ``params`` (``tg.state`` leaves of static shape, by key) given
        ``grads`` (any nodes of the same shapes and dtypes, by the same keys). A parameter
        without a gradient is left as it is, as torch.optim skips one whose ``.grad`` is None;
        the count still advances.

        ``accumulate``: each call is a micro-batch, and the step's gradient the mean of
        ``accumulate`` calls' (what torch gives for ``(loss / accumulate).backward()`` on each
        and ``step()`` after the last): the sums are the states ``f"{prefix}{param}.grad_sum"``,
        the calls since the last step ``f"{prefix}micro_step"``, and every other state keeps
        its value except on each ``accumulate``-th call. ``max_grad_norm``: the gradients (the
        mean, with ``accumulate``) scaled by ``min(1, max_grad_norm / (norm + 1e-6))``, ``norm``
        their 2-norm over all parameters, as ``torch.nn.utils.clip_grad_norm_`` before
        ``step()``. Both are computed in the graph: the program stays one call per batch, with
        nothing computed on the host between calls."""
        params, grads = dict(params), dict(grads)
        _check(self.name, params, grads)
        if not grads:
            raise ArgumentError(f"{self.name}.update: no gradients given; pass grads for some "
                                f"of the parameters {sorted(params)}")
        max_grad_norm = check_max_grad_norm(f"{self.name}.update", max_grad_norm)
        accumulate = check_accumulate(f"{self.name}.update", accumulate)
        group_of = self._group_of(params)
        lr_dtype = float64 if any(p.dtype == float64 for p in params.values()) else float32
        kept = _Kept()
        # float32 as torch keeps state["step"] (whole numbers exact to 2**24 steps): a C
        # kernel adds it, where an int64 add ran in numpy and kept the step from the native loop
        count = kept.leaf(f"{self.prefix}step", (1,), float32)
        t = count + 1  # this step's number, 1 on the first step (torch.optim's count)
        if accumulate > 1:
            grads = self._accumulated(params, grads, accumulate, kept)
        if max_grad_norm is not None:
            grads = _clipped(grads, max_grad_norm)
        new_params: dict[str, Node] = {}
        for key, g in grads.items():
            p = params[key]
            lr_name, lr, decay = self._hyper(group_of.get(key))
            scalars = _Scalars(kept.leaf(lr_name, (1,), lr_dtype, lr), count, t, p.dtype, decay)

            def slot(what: str, update, p=p) -> Node:
                """The moment ``what`` of ``p``: its current version, zero at first;
                ``update(old) -> new`` gives the version this step keeps."""
                leaf = kept.leaf(f"{self.prefix}{p.name}.{what}", tuple(p.shape), p.dtype)
                new = update(leaf)
                kept.write(leaf, new)
                return new

            new_params[key] = kept.write(p, self._step(p, g, scalars, slot))
        kept.write(count, t)
        return Updates(new_params, kept.states, self._hyper(None)[0], count.name, kept.init,
                       lr_dtype, tuple(self._hyper(i)[0] for i in range(len(self.groups))))

    def _hyper(self, group: int | None) -> tuple[str, float, float]:
        """Group ``group``'s (None: the optimizer's own) learning-rate state, that learning
        rate's initial value and the weight decay. A group without an ``lr`` shares the
        optimizer's state, so a schedule that sets it sets theirs too."""
        own = _Group(()) if group is None else self.groups[group]
        lr_name, lr = ((f"{self.prefix}lr", self.lr) if own.lr is None
                       else (f"{self.prefix}group{group}.lr", own.lr))
        return lr_name, lr, self.weight_decay if own.weight_decay is None else own.weight_decay

    def _group_of(self, params: Mapping[str, Node]) -> dict[str, int]:
        """Each grouped parameter's key -> its group's index. A name that is no parameter (a
        typo, a frozen weight) would otherwise leave the parameter meant in the default group
        in silence; one named twice has no one learning rate."""
        found: dict[str, int] = {}
        for i, group in enumerate(self.groups):
            unknown = sorted(set(group.params) - set(params))
            if unknown:
                raise ArgumentError(f"{self.name}: groups[{i}] names {unknown}, which are not "
                                    f"parameters being trained; they are {sorted(params)}")
            for key in group.params:
                if key in found:
                    raise ArgumentError(f"{self.name}: parameter '{key}' is given twice in "
                                        f"groups (groups[{found[key]}] and groups[{i}]); put it "
                                        "in one group")
                found[key] = i
        return found

    def _accumulated(self, params: dict[str, Node], grads: dict[str, Node], accumulate: int,
                     kept: _Kept) -> dict[str, Node]:
        """The mean of the last ``accumulate`` calls' gradients, by key, and ``kept`` gated to
        write the step's states only on the call that completes them. The sums restart at
        zero after that call; the optimizer's step is computed on every call (what it costs
        is the update's elementwise work, small beside the forward and the backward) but kept
        on that one only, so the program stays one plan with no branch."""
        micro = kept.leaf(f"{self.prefix}micro_step", (1,), float32)
        calls = micro + 1
        last = tg.equal(calls, float(accumulate))
        kept.write(micro, tg.where(last, 0.0, calls))
        means: dict[str, Node] = {}
        for key, g in grads.items():
            held = kept.leaf(f"{self.prefix}{params[key].name}.grad_sum", tuple(g.shape),
                             g.dtype)
            total = held + g
            kept.write(held, tg.where(last, 0.0, total))
            means[key] = total / float(accumulate)
        kept.gate = last  # after the sums and the call count: those change on every call
        return means

    def _step(self, p: Node, g: Node, s: _Scalars, slot) -> Node:
        raise NotImplementedError


class _Kept:
    """The states a step reads and writes: ``init``, the optimizer's own states' initial
    values (the parameters are the caller's), and ``states``, each state's new version. With
    a ``gate`` (accumulation's last micro-batch) a state is written its new value on the
    calls where the gate is true and its old one on the others."""

    def __init__(self):
        self.init: dict[str, np.ndarray] = {}
        self.states: dict[str, Node] = {}
        self.gate: Node | None = None

    def leaf(self, name: str, shape: tuple, dtype: DType, value: float = 0.0) -> Node:
        """The optimizer's state ``name``, starting at ``value`` everywhere."""
        self.init.setdefault(name, np.full(shape, value, dtype.np_dtype))
        return tg.state(name, shape, dtype)

    def write(self, leaf: Node, new: Node) -> Node:
        """``leaf``'s version after this call: ``new``, or ``leaf`` itself where gated off."""
        if self.gate is not None:
            new = tg.where(self.gate, new, leaf)
        self.states[leaf.name] = written = tg.state_update(leaf, new)
        return written


def _clipped(grads: dict[str, Node], max_norm: float) -> dict[str, Node]:
    """``grads`` scaled as ``torch.nn.utils.clip_grad_norm_(params, max_norm)`` scales them:
    by ``min(1, max_norm / (norm + 1e-6))``, ``norm`` the 2-norm of all of them together
    (torch's norm of the per-parameter norms, the same number). The squares are summed in
    float32 at least (a bfloat16 sum of squares loses the norm's digits), float64 where a
    gradient is."""
    wide = float64 if any(g.dtype == float64 for g in grads.values()) else float32
    squares = [tg.sum(tg.cast(g, wide) * tg.cast(g, wide)) for g in grads.values()]
    total = squares[0]
    for square in squares[1:]:
        total = total + square
    scale = tg.minimum(max_norm / (tg.sqrt(total) + 1e-6), 1.0)
    return {key: g * tg.cast(scale, g.dtype) for key, g in grads.items()}


class _Scalars:
    """The step's scalars in one parameter's dtype, shape (1,) (they broadcast): the learning
    rate, the count before this step and this step's number, cast once per dtype; and its
    weight decay, a float (its group's). Scalars made of scalars (the bias corrections) are
    computed ``wide``: in float32 at least, as torch computes them in double, then
    ``narrow``-ed to the parameter's dtype. In bfloat16 0.999 rounds to 1.0, so
    ``1 - beta2**t`` was 0 and Adam never moved a bf16 parameter."""

    def __init__(self, lr: Node, count: Node, t: Node, dtype: DType, weight_decay: float):
        self.lr = tg.cast(lr, dtype)
        self.weight_decay = weight_decay  # the parameter's group's, else the optimizer's
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
