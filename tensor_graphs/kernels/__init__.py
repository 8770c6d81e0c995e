"""Kernels: verified implementations of patterns on backends (numpy, C, torch, ...).

``tg.kernel`` registers one; ``tg.kernels.all()`` lists them; ``tg.kernels.verify`` checks one
against the float64 reference; ``tg.kernels.load`` admits a file of kernels after verifying it.
"""

# Backends register their kernels on import; the C backend compiles nothing until first use.
from tensor_graphs.kernels import numpy  # noqa: F401  (first: the fallback)

# isort: split
from tensor_graphs.kernels import c  # noqa: F401

# isort: split
# torch is optional: without it tensor_graphs.kernels.torch registers nothing (and it never
# imports torch itself until a torch kernel runs). copy registers the copy_to kernels.
from tensor_graphs.kernels import torch  # noqa: F401

# isort: split
from tensor_graphs.kernels.triton import templates  # noqa: F401  (with triton and a GPU)

# isort: split
from tensor_graphs.kernels import copy  # noqa: F401
from tensor_graphs.kernels.loading import load, prompt  # noqa: F401,E402
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
from tensor_graphs.kernels.verify import VerificationReport, verify  # noqa: F401,E402
