"""What the torch.compile backend's tests share: a backend that records the programs it
makes, Dynamo's caches cleared around each test, and the one error measure on tensors. Not
a test module; imported after a test module's ``importorskip("torch")``."""

from __future__ import annotations

import pytest
import torch

from tensor_graphs.frontend.dynamo import DynamoProgram
from tensor_graphs.numerics import relative_error


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch (Dynamo's caches are per code object and global)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Spy:
    """The registered backend, looked up by name as torch.compile does, recording what it
    returns for each graph Dynamo hands over."""

    def __init__(self):
        self.made = []

    def __call__(self, gm, example_inputs, **kwargs):
        made = torch._dynamo.lookup_backend("tensor_graphs")(gm, example_inputs, **kwargs)
        self.made.append(made)
        return made

    @property
    def ours(self) -> list:
        return [m for m in self.made if isinstance(m, DynamoProgram)]


def err(got, ref) -> float:
    return relative_error(got.detach().double().numpy(), ref.detach().double().numpy())
