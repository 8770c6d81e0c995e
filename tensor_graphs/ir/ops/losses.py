"""Loss composites following torch.nn.functional (names, argument names, reductions).

The class axis of cross_entropy / nll_loss is axis 1 for (N, C, d1, ...) inputs and axis 0 for
an unbatched (C,) input. A target class is picked with a one-hot mask,
``equal(iota(C), target)``, and a masked sum (there is no take_along_axis atomic): a where,
not a multiply, so a -inf log-probability of another class cannot turn into nan. A target
outside [0, C) picks no class, so each target is also looked up in C zeros (``_in_range``),
whose gather refuses it at run time as torch refuses it.
"""

from __future__ import annotations

from tensor_graphs.errors import ArgumentError, DTypeError, ShapeError
from tensor_graphs.ir import builder as tg
from tensor_graphs.ir.composite import composite
from tensor_graphs.ir.ops.elementwise import abs as _abs
from tensor_graphs.ir.ops.elementwise import div, not_equal, sub
from tensor_graphs.ir.ops.reductions import log_softmax, mean
from tensor_graphs.ir.shapes import dims_equal, format_shape

__all__ = ["mse_loss", "l1_loss", "cross_entropy", "nll_loss", "kl_div"]

_REDUCTIONS = ("none", "mean", "sum")


def _check_reduction(op: str, reduction, allowed=_REDUCTIONS) -> None:
    if reduction not in allowed:
        shown = ", ".join(repr(r) for r in allowed)
        raise ArgumentError(f"{op}: reduction must be one of {shown}, got {reduction!r}")


def _float(x):
    return x if x.dtype.is_float else tg.cast(x, "float32")


def _reduce(loss, reduction):
    if reduction == "sum":
        return tg.sum(loss)
    if reduction == "mean":
        return mean(loss)
    return loss


def _pointwise(op: str, input, target, weight, reduction, fn):  # noqa: A002 - torch's name
    """Shared body of mse_loss / l1_loss: fn(input - target), optionally weighted."""
    _check_reduction(op, reduction)
    input, target = tg.promote(_float(input), _float(target))
    err = fn(sub(input, target))
    if weight is None:
        return _reduce(err, reduction)
    if weight.ndim != input.ndim or not all(dims_equal(a, b)
                                           for a, b in zip(weight.shape, input.shape)):
        raise ShapeError(f"{op}: weight {format_shape(weight.shape)} must have the input's shape "
                         f"{format_shape(input.shape)}")
    err = tg.mul(err, weight)
    if reduction == "mean":  # torch: a weighted mean, sum(w * err) / sum(w)
        return div(tg.sum(err), tg.sum(weight))
    return _reduce(err, reduction)


def _pair_example():
    return (tg.input("input", (3, 4)), tg.input("target", (3, 4)))


@composite(example=_pair_example)
def mse_loss(input, target, weight=None, *, reduction="mean"):  # noqa: A002 - torch's name
    """(input - target)**2, reduced; ``weight`` (the input's shape) gives a weighted mean."""
    return _pointwise("mse_loss", input, target, weight, reduction, lambda d: tg.mul(d, d))


@composite(example=_pair_example)
def l1_loss(input, target, weight=None, *, reduction="mean"):  # noqa: A002 - torch's name
    """|input - target|, reduced; ``weight`` (the input's shape) gives a weighted mean."""
    return _pointwise("l1_loss", input, target, weight, reduction, _abs)


def _class_axis(op: str, input) -> int:  # noqa: A002
    if input.ndim == 0:
        raise ShapeError(f"{op}: the input must be (N, C, d1, ...) or (C,), got a 0-d tensor")
    return 1 if input.ndim >= 2 else 0


def _check_class_target(op: str, input, target, weight, axis: int) -> None:  # noqa: A002
    expected = input.shape[:axis] + input.shape[axis + 1:]
    if target.ndim != len(expected) or not all(dims_equal(a, b)
                                               for a, b in zip(target.shape, expected)):
        raise ShapeError(f"{op}: class-index targets must have shape {format_shape(expected)} "
                         f"for input {format_shape(input.shape)} (the input without its class "
                         f"axis {axis}), got {format_shape(target.shape)}")
    _check_weight(op, weight, input.shape[axis])


def _check_weight(op: str, weight, n_classes) -> None:
    if weight is not None and (weight.ndim != 1 or not dims_equal(weight.shape[0], n_classes)):
        raise ShapeError(f"{op}: weight must have one entry per class, shape ({n_classes},), "
                         f"got {format_shape(weight.shape)}")


def _along_classes(t, input, axis: int):  # noqa: A002
    """A (C,) tensor shaped to broadcast along the class axis of ``input``."""
    return tg.reshape(t, (input.shape[axis],) + (1,) * (input.ndim - axis - 1))


def _in_range(target, valid, n_classes, dtype):
    """0 per target, read from C zeros at the target (at 0 where ignored): the gather's range
    check refuses a class index outside [0, C) when the loss runs, naming the index and C, as
    torch refuses it ("Target 7 is out of bounds"). Without it such a target picked no class
    and counted 0 toward the loss in silence, and a model trained on wrong labels."""
    zeros = tg.expand(tg.cast(0.0, dtype), (n_classes,))
    return tg.gather(zeros, tg.where(valid, target, tg.cast(0, target.dtype)), axis=0)


def _class_nll(logp, target, weight, axis: int, ignore_index: int):
    """Per-element -w[t] * logp[t] (0 where ignored) and the weights w[t] (0 where ignored)."""
    classes = _along_classes(tg.iota(logp.shape[axis], target.dtype), logp, axis)
    onehot = tg.equal(classes, tg.unsqueeze(target, axis))
    valid = not_equal(target, ignore_index)
    picked = tg.add(tg.sum(tg.where(onehot, logp, 0.0), axis),
                    _in_range(target, valid, logp.shape[axis], logp.dtype))
    zero = tg.cast(0.0, logp.dtype)
    if weight is None:
        w = tg.cast(valid, logp.dtype)
    else:
        w_classes = _along_classes(tg.cast(weight, logp.dtype), logp, axis)
        w = tg.where(valid, tg.sum(tg.where(onehot, w_classes, zero), axis), zero)
    loss = tg.where(valid, tg.neg(tg.mul(picked, w) if weight is not None else picked), zero)
    return loss, w, valid


def _check_ignore_index(op: str, ignore_index) -> None:
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise ArgumentError(f"{op}: ignore_index must be an int, got {ignore_index!r}")


def _class_example():
    return (tg.input("input", (3, 5)), tg.input("target", (3,), "int64"))


@composite(example=_class_example)
def nll_loss(input, target, weight=None, *, reduction="mean",  # noqa: A002 - torch's name
             ignore_index=-100):
    """-input[n, target[n]] (input holds log-probabilities), optionally times weight[target].

    Targets equal to ``ignore_index`` contribute 0 and are left out of the mean, which divides
    by the summed weights of the counted targets (their count without ``weight``). A target
    outside [0, C) that is not ``ignore_index`` is refused when the loss runs, as torch's.
    """
    _check_reduction("nll_loss", reduction)
    _check_ignore_index("nll_loss", ignore_index)
    if not target.dtype.is_int:
        raise DTypeError(f"nll_loss: target must hold integer class indices, got "
                         f"{target.dtype.name}")
    axis = _class_axis("nll_loss", input)
    _check_class_target("nll_loss", input, target, weight, axis)
    loss, w, _ = _class_nll(_float(input), target, weight, axis, ignore_index)
    if reduction == "mean":
        return div(tg.sum(loss), tg.sum(w))
    return _reduce(loss, reduction)


@composite(example=_class_example)
def cross_entropy(input, target, weight=None, *, reduction="mean",  # noqa: A002 - torch's name
                  ignore_index=-100, label_smoothing=0.0):
    """Cross entropy of logits ``input`` (N, C, d1, ...) or (C,) against ``target``.

    An integer target holds class indices (shape (N, d1, ...)); it is nll_loss of
    log_softmax(input) along the class axis, with ``ignore_index`` and class ``weight`` as in
    nll_loss. A float target holds class probabilities (the input's shape). With
    ``label_smoothing`` e, the loss mixes (1 - e) of that with e times the uniform target's
    loss, torch's formula.
    """
    _check_reduction("cross_entropy", reduction)
    _check_ignore_index("cross_entropy", ignore_index)
    if not isinstance(label_smoothing, (int, float)) or not 0.0 <= label_smoothing <= 1.0:
        raise ArgumentError(f"cross_entropy: label_smoothing must be a number in "
                                 f"[0, 1], got {label_smoothing!r}")
    if target.dtype.is_bool:
        raise DTypeError("cross_entropy: target must be integer class indices or float "
                         "probabilities, got bool")
    axis = _class_axis("cross_entropy", input)
    input = _float(input)
    logp = log_softmax(input, axis=axis)
    n_classes = input.shape[axis]
    _check_weight("cross_entropy", weight, n_classes)
    # label_smoothing / C: a Python float when C is concrete, a dim leaf when symbolic
    spread_share = label_smoothing / n_classes if isinstance(n_classes, int) else \
        div(label_smoothing, tg.size(n_classes, logp.dtype))
    w_classes = None if weight is None else \
        _along_classes(tg.cast(weight, logp.dtype), logp, axis)

    if target.dtype.is_float:  # class probabilities
        if target.ndim != input.ndim or not all(dims_equal(a, b)
                                                for a, b in zip(target.shape, input.shape)):
            raise ShapeError(f"cross_entropy: probability targets must have the input's shape "
                             f"{format_shape(input.shape)}, got {format_shape(target.shape)}")
        target = tg.cast(target, logp.dtype)
        if label_smoothing:
            target = tg.add(tg.mul(target, 1.0 - label_smoothing), spread_share)
        terms = tg.mul(logp, target)
        if w_classes is not None:
            terms = tg.mul(terms, w_classes)
        return _reduce(tg.neg(tg.sum(terms, axis)), reduction)  # mean: over N, d1, ...

    _check_class_target("cross_entropy", input, target, weight, axis)
    loss, w, valid = _class_nll(logp, target, weight, axis, ignore_index)
    if label_smoothing:
        spread = logp if w_classes is None else tg.mul(logp, w_classes)
        smooth = tg.where(valid, tg.neg(tg.sum(spread, axis)), tg.cast(0.0, logp.dtype))
        loss = tg.add(tg.mul(loss, 1.0 - label_smoothing),
                      tg.mul(smooth, spread_share))
    if reduction == "mean":
        return div(tg.sum(loss), tg.sum(w))
    return _reduce(loss, reduction)


@composite(example=_pair_example)
def kl_div(input, target, *, reduction="mean", log_target=False):  # noqa: A002 - torch's name
    """Pointwise KL divergence with ``input`` in log space: target * (log(target) - input).

    With ``log_target`` the target is in log space too: exp(target) * (target - input).
    Otherwise 0 * log(0) counts as 0 (torch's xlogy). ``reduction``: "none", "sum", "mean"
    (over all elements) or "batchmean" (sum / input.shape[0], the true KL divergence).
    """
    _check_reduction("kl_div", reduction, _REDUCTIONS + ("batchmean",))
    input, target = tg.promote(_float(input), _float(target))
    if log_target:
        loss = tg.mul(tg.exp(target), sub(target, input))
    else:
        zero = tg.cast(0.0, target.dtype)
        xlogx = tg.where(tg.equal(target, zero), zero, tg.mul(target, tg.log(target)))
        loss = sub(xlogx, tg.mul(target, input))
    if reduction == "batchmean":
        total = tg.sum(loss)
        return total if input.ndim == 0 else div(total, tg.size(input.shape[0], total.dtype))
    return _reduce(loss, reduction)
