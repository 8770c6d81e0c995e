"""Optimizers as graphs over state (``tg.optim.SGD``, ``Adam``, ``AdamW``).

``opt.update(params, grads)`` returns an ``Updates``: the new versions of the parameters, of
the optimizer's moments and of its step count, all ``tg.state`` the compiled program keeps
between calls, so one call of the program is one step and nothing is planned per step::

    opt = tg.optim.AdamW(1e-3)
    up = opt.update({"w": w}, {"w": tg.input("dw", w.shape, w.dtype)})
    prog = tg.compile(up.outputs)
    prog.bind(w=w0, **up.state_init())
    prog(dw=g)                        # one step; prog.state("w") is the new value
    prog.bind(**up.lr_value(1e-4))    # a schedule: no re-plan

What a torch loop adds around ``step()`` is built into the same graph: ``groups=[{"params":
["fc.bias"], "weight_decay": 0.0}]`` (torch's param_groups: a learning rate or weight decay of
their own), ``update(..., max_grad_norm=1.0)`` (``clip_grad_norm_``) and ``update(...,
accumulate=4)`` (a step every 4 calls, with the mean gradient); ``tg.Trainer`` takes the last
two as its own options.
"""

from tensor_graphs.optim.adam import Adam, AdamW
from tensor_graphs.optim.base import Optimizer, Updates
from tensor_graphs.optim.sgd import SGD

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "Updates"]
