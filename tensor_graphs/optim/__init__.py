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
"""

from tensor_graphs.optim.adam import Adam, AdamW
from tensor_graphs.optim.base import Optimizer, Updates
from tensor_graphs.optim.sgd import SGD

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "Updates"]
