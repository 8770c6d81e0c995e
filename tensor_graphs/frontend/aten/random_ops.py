"""ATen's random ops: dropout and its variants.

In eval mode (``train=False``, or ``p = 0``) dropout is the identity. In training mode it maps
to ``tg.dropout`` drawing from the generator that ``tg.from_torch(..., train=True)`` imports
the module under (``training_rng``): each site gets its own stream, in graph order. The masks
are ours (Philox-4x32-10, ``ir/ops/random.py``), not torch's: the same in distribution, not
bit for bit. Without a generator (a plain ``tg.from_torch`` of a module exported in training
mode) a training-mode dropout is refused, since inference would otherwise drop at random.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from tensor_graphs.errors import ArgumentError
from tensor_graphs.frontend.aten.common import guarded
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.ops.random import Rng, dropout, random_bits, threshold

_RNG: ContextVar[Rng | None] = ContextVar("tensor_graphs_training_rng", default=None)


@contextmanager
def training_rng(rng: Rng) -> Iterator[Rng]:
    """Import for training under ``rng``: training-mode dropouts draw from it (one stream per
    site), and the mappings that only matter to ``tg.grad`` mark the graph (``training``)."""
    token = _RNG.set(rng)
    try:
        yield rng
    finally:
        _RNG.reset(token)


def training() -> bool:
    """Whether this import is for training (``tg.from_torch(train=True)`` imports under its
    generator, ``training_rng``). Mappings that only change gradients (``detach`` as
    ``stop_gradient``, an embedding's ``padding_idx``; its ``scale_grad_by_freq`` refused)
    act only then: an inference graph stays as it was, and so do its digests, plan caches
    and lock files."""
    return _RNG.get() is not None


def _generator(op: str) -> Rng:
    rng = _RNG.get()
    if rng is None:
        raise ArgumentError(f"{op} in training mode: train it with tg.from_torch(module, args, "
                            "train=True, loss_fn=..., optimizer=...), or call module.eval() "
                            "before from_torch for inference")
    return rng


def _dropout(a, kw):
    if not (kw["train"] and kw["p"]):
        return kw["input"]
    return dropout(kw["input"], float(kw["p"]), _generator("dropout"))


def _native_dropout(a, kw):
    """(output, keep mask): the mask from the same words as the output."""
    x, p = kw["input"], float(kw["p"])
    if kw["train"] is False or p == 0.0:
        return x, tg.expand(tg.constant(True), x.shape)
    rng = _generator("native_dropout")
    stream = rng.stream()
    out = dropout(x, p, rng.state, stream=stream)
    words = random_bits(rng.state, x.shape, stream)
    return out, tg.logical_not(tg.less(words, tg.constant(threshold(p), "int64")))


def _feature_dropout(a, kw):
    """Whole channels (axis 1) zeroed, torch's Dropout1d/2d/3d: x times a dropout of ones over
    (batch, channels, 1, ...), broadcast."""
    x, p = kw["input"], float(kw["p"])
    if not (kw["train"] and p):
        return x
    if x.ndim < 2:
        raise ArgumentError(f"feature_dropout: the input {tuple(x.shape)} needs a batch and a "
                            "channel axis")
    ones = tg.expand(tg.constant(1.0, x.dtype), tuple(x.shape[:2]) + (1,) * (x.ndim - 2))
    return tg.mul(x, dropout(ones, p, _generator("feature_dropout")))


def _unsupported(op: str, why: str):
    def mapping(a, kw):
        if kw["train"] and kw["p"]:
            raise ArgumentError(f"{op} in training mode: {why}; call module.eval() before "
                                "from_torch, or use nn.Dropout")
        return kw["input"]
    return mapping


def table(aten) -> dict:
    return guarded({
        aten.dropout: _dropout,
        aten.native_dropout: _native_dropout,
        aten.feature_dropout: _feature_dropout,
        aten.alpha_dropout: _unsupported("alpha_dropout", "SELU's alpha dropout is not mapped"),
        aten.feature_alpha_dropout: _unsupported("feature_alpha_dropout",
                                                 "SELU's alpha dropout is not mapped"),
    })
