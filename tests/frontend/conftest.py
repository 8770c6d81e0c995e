"""Shared helpers of the PyTorch-import tests."""

import pytest


@pytest.fixture
def randomize_norms():
    """Give eval-mode norms non-trivial running statistics and affine parameters (fresh
    modules have mean 0, var 1, weight 1, bias 0, which would hide mistakes)."""
    nn = pytest.importorskip("torch.nn")

    def randomize(module):
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._NormBase):
                if m.track_running_stats:
                    m.running_mean.uniform_(-0.5, 0.5)
                    m.running_var.uniform_(0.5, 2.0)
                if m.affine:
                    m.weight.data.uniform_(0.5, 1.5)
                    m.bias.data.uniform_(-0.3, 0.3)
        return module

    return randomize
