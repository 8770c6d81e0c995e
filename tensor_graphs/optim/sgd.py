"""Stochastic gradient descent with momentum, as torch.optim.SGD computes it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tensor_graphs.errors import ArgumentError
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.node import Node
from tensor_graphs.optim.base import Optimizer, _real, _Scalars, check_flag, check_number

__all__ = ["SGD"]


class SGD(Optimizer):
    """torch.optim.SGD's step: ``g + weight_decay * p``, then with ``momentum`` a buffer
    ``b = momentum * b + (1 - dampening) * g`` (``b = g`` on the first step; nesterov steps
    along ``g + momentum * b``), and ``p - lr * step``. The buffer is the state
    ``f"{prefix}{param}.momentum_buffer"`` (kept only with momentum), torch's name for it.
    ``groups``: a learning rate or weight decay of their own for some parameters (Optimizer)."""

    name = "SGD"

    def __init__(self, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 dampening: float = 0.0, nesterov: bool = False, *, maximize: bool = False,
                 prefix: str = "optim.", groups: Sequence[Mapping] = ()):
        super().__init__(lr, prefix=prefix, groups=groups)
        self.momentum = check_number("SGD", "momentum", momentum)
        self.weight_decay = check_number("SGD", "weight_decay", weight_decay)
        if not _real(dampening) or dampening != dampening:  # any value, as torch takes it
            raise ArgumentError(f"SGD: invalid dampening {dampening!r}; give a float (the "
                                "share of the gradient the buffer leaves out, usually 0)")
        self.dampening = float(dampening)
        self.nesterov = check_flag("SGD", "nesterov", nesterov)
        self.maximize = check_flag("SGD", "maximize", maximize)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ArgumentError(f"SGD: nesterov needs momentum > 0 and dampening 0 (got "
                                f"momentum={momentum}, dampening={dampening}), as in torch")

    def _step(self, p: Node, g: Node, s: _Scalars, slot) -> Node:
        if self.maximize:
            g = -g
        if s.weight_decay:
            g = g + s.weight_decay * p
        if self.momentum:
            mu, keep = self.momentum, 1.0 - self.dampening

            def advance(b: Node) -> Node:
                later = mu * b + (keep * g if keep != 1.0 else g)
                if not self.dampening:  # the zero buffer makes the first step's b = g
                    return later
                return tg.where(tg.equal(s.count, 0), g, later)  # b = g, undamped, at first

            b = slot("momentum_buffer", advance)
            g = g + mu * b if self.nesterov else b
        return p - s.lr * g
