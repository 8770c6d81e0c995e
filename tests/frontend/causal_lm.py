"""What the causal-LM tests share: the forward users call (ids and a mask, every other
argument at its default) and the masks they pass (none, left and right padding)."""

import torch


class Logits(torch.nn.Module):
    """ids and a mask -> logits, every other argument of the model at its default."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        return self.model(input_ids=ids, attention_mask=mask).logits


def masks(batch: int, n: int) -> list:
    """No padding, left padding (generation's batches) and right padding (training's)."""
    full = torch.ones(batch, n, dtype=torch.int64)
    left, right = full.clone(), full.clone()
    left[-1, :3] = 0
    right[0, n - 2:] = 0
    return [full, left, right]
