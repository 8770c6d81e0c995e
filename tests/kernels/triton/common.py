"""What the generated Triton kernels' tests share: the dtypes run here, the one error measure
with a half-precision result's rounding, and a kernel called on GPU tensors."""

from __future__ import annotations

import numpy as np

from tensor_graphs.kernels import triton as package
from tensor_graphs.kernels.verify import LOW_PRECISION_BUDGET
from tensor_graphs.numerics import relative_error

# bfloat16 on a real GPU only: the interpreter computes it on raw bits
DTYPES = list(package.float_dtypes())


def agrees(got, ref, tolerance: float = 1e-6) -> None:
    """Norm-wise, as kernels are judged: libdevice's exp and log are a few ulp from numpy's."""
    err = relative_error(got, ref)
    assert err <= tolerance, err


def within(k, got, ref, dtype: str) -> None:
    """The kernel's declared tolerance, plus the rounding a float16/bfloat16 result may add
    (what the planner allows it: ``verify.LOW_PRECISION_BUDGET``)."""
    agrees(got, ref, max(k.tolerance, LOW_PRECISION_BUDGET.get(dtype, 0.0)))


def atomic_root(y, expand):
    """The node the planner offers candidates at: ``y`` decomposed down to an atomic op."""
    root = y
    while not root.op.is_atomic:
        root = expand(root)
    return root


def run(k, *arrays, out=None):
    """``k`` called on the arrays moved to the GPU (the host under the simulated one), its
    result (a torch tensor) brought back as a numpy array."""
    import torch

    from tensor_graphs.devices import torch_device
    from tensor_graphs.kernels.torch import convert

    dev = torch_device("cuda")
    with np.errstate(all="ignore"):
        res = k.fn(*(convert.to_torch(a).to(dev) for a in arrays), out=out)
    assert isinstance(res, torch.Tensor)
    return convert.to_host(res)
