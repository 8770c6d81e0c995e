"""Training: ``tg.Trainer`` compiles a loss, its gradients and an optimizer's step as one
program (``trainer``); ``chars`` is a small character-level transformer and its text, for
``tg run train-char``."""

from tensor_graphs.train.trainer import Trainer

__all__ = ["Trainer"]
