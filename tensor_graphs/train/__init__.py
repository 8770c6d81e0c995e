"""Training: ``tg.Trainer`` compiles a loss, its gradients and an optimizer's step as one
program (``trainer``); ``torch_trainer`` makes one for a PyTorch module's parameters
(``tg.from_torch(module, args, train=True, loss_fn=..., optimizer=...)``)."""

from tensor_graphs.train.trainer import Trainer

__all__ = ["Trainer"]
