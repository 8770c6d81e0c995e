"""Kernels: verified implementations of patterns on backends (numpy, C, torch, ...).

``tg.kernel`` registers one; ``tg.kernels.all()`` lists them; ``tg.kernels.verify`` checks one
against the float64 reference; ``tg.kernels.load`` admits a file of kernels after verifying it.
"""

from tensor_graphs.kernels.registry import (  # noqa: F401
    Kernel,
    all,
    describe,
    for_op,
    get,
    kernel,
    matching,
    register,
    unregister,
)
