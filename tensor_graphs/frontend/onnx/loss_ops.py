"""ONNX's training losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss on our
nll_loss (torch's semantics, which ONNX's follow: class axis 1, weights, ignore_index, the
mean divided by the counted weights)."""

from __future__ import annotations

from tensor_graphs.frontend.onnx.common import Ctx
from tensor_graphs.ir import api as tg

# ONNX has no ignored class unless the attribute names one: an index no target can hold
_NO_IGNORE = -(2 ** 62)


def _nll(c: Ctx, log_probs):
    target = c.t(1)
    weight = c.t(2) if c.has(2) else None
    ignore = c.a("ignore_index")
    return tg.nll_loss(log_probs, target, weight, reduction=c.a("reduction", "mean"),
                       ignore_index=_NO_IGNORE if ignore is None else ignore)


def _nll_loss(c: Ctx):
    return _nll(c, c.t(0))


def _softmax_cross_entropy(c: Ctx):
    log_probs = tg.log_softmax(c.t(0), axis=1 if c.t(0).ndim > 1 else 0)
    loss = _nll(c, log_probs)
    return (loss, log_probs) if c.outputs > 1 else loss


def table() -> dict:
    return {"NegativeLogLikelihoodLoss": _nll_loss,
            "SoftmaxCrossEntropyLoss": _softmax_cross_entropy}


__all__ = ["table"]
