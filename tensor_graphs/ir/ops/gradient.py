"""``stop_gradient``: a value whose gradient is defined, not derived (JAX's ``stop_gradient``,
torch's ``detach``).

Why an op and not a flag on ``tg.grad``: the mark sits where the model's author put it (a
straight-through estimator, a stop-gradient target, a ``torch.no_grad()`` block, an
embedding's padding row), so it travels with the graph (saved, loaded, imported) and every
``tg.grad`` of it agrees. The value is the decomposition, x itself, and ``tg.compile``'s
simplify removes the mark before planning (``pm_marks``: a compiled program computes values;
its gradients were built before it). The gradient is the rule tables' business
(``ir/grad_rules.py``), which declare that no cotangent passes.
"""

from __future__ import annotations

from tensor_graphs.ir import builder as tg
from tensor_graphs.ir.composite import composite

__all__ = ["stop_gradient"]


@composite(example=lambda: (tg.input("x", (3, 4)),))
def stop_gradient(x):
    """x itself, through which no gradient flows (torch's detach, JAX's stop_gradient).

    Any dtype: an int or bool value carries no gradient anyway, and the torch import marks
    whatever ``detach`` touched."""
    return x
