"""Adam and AdamW, as torch.optim.Adam and torch.optim.AdamW compute them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tensor_graphs.errors import ArgumentError
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.node import Node
from tensor_graphs.optim.base import Optimizer, _Scalars, check_flag, check_number

__all__ = ["Adam", "AdamW"]


class Adam(Optimizer):
    """torch.optim.Adam's step: with ``g`` (plus ``weight_decay * p``: L2, coupled),
    ``m = m + (1 - b1) * (g - m)``, ``v = b2 * v + (1 - b2) * g * g``, and
    ``p - lr / (1 - b1**t) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)`` at step ``t``
    (``amsgrad``: the running maximum of ``v`` in place of ``v``). The bias corrections read
    the count state, so every step runs the same program. Moments are the states
    ``f"{prefix}{param}.exp_avg"``, ``.exp_avg_sq`` and ``.max_exp_avg_sq``, torch's names.
    ``groups``: a learning rate or weight decay of their own for some parameters (Optimizer)."""

    name = "Adam"
    decoupled = False

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *,
                 maximize: bool = False, prefix: str = "optim.",
                 groups: Sequence[Mapping] = ()):
        super().__init__(lr, prefix=prefix, groups=groups)
        if not isinstance(betas, (tuple, list, np.ndarray)) or np.shape(betas)[:1] != (2,):
            raise ArgumentError(f"{self.name}: betas must be a pair (beta1, beta2) of floats "
                                f"in [0, 1), e.g. (0.9, 0.999); got {betas!r}")
        self.betas = (check_number(self.name, "beta at index 0:", betas[0], below_one=True),
                      check_number(self.name, "beta at index 1:", betas[1], below_one=True))
        self.eps = check_number(self.name, "eps", eps)
        self.weight_decay = check_number(self.name, "weight_decay", weight_decay)
        self.amsgrad = check_flag(self.name, "amsgrad", amsgrad)
        self.maximize = check_flag(self.name, "maximize", maximize)

    def _step(self, p: Node, g: Node, s: _Scalars, slot) -> Node:
        b1, b2 = self.betas
        if self.maximize:
            g = -g
        if s.weight_decay:
            if self.decoupled:  # AdamW: the parameter shrinks before the step, apart from g
                p = p * (1.0 - s.lr * s.weight_decay)
            else:
                g = g + s.weight_decay * p
        m = slot("exp_avg", lambda m: m + (1.0 - b1) * (g - m))
        v = slot("exp_avg_sq", lambda v: b2 * v + (1.0 - b2) * (g * g))
        if self.amsgrad:
            v = slot("max_exp_avg_sq", lambda most, v=v: tg.maximum(most, v))
        step_size = s.narrow(s.lr_wide / (1.0 - s.power(b1)))
        denom = tg.sqrt(v) / s.narrow(tg.sqrt(1.0 - s.power(b2))) + self.eps
        return p - step_size * (m / denom)


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay, ``p * (1 - lr * weight_decay)``
    before the Adam step (default 0.01), instead of adding ``weight_decay * p`` to ``g``."""

    name = "AdamW"
    decoupled = True

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, amsgrad: bool = False, *,
                 maximize: bool = False, prefix: str = "optim.",
                 groups: Sequence[Mapping] = ()):
        super().__init__(lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         prefix=prefix, groups=groups)
