"""The torch backend (optional): kernels that call torch ops, on the CPU and on CUDA.

Conventions
- ``torch_<op>`` kernels run on device "cpu" and take and return numpy arrays like every CPU
  kernel; numpy and torch share host memory, so the arrays are viewed as tensors and the result
  tensor as an array without copies (``convert.py``). numpy, C and torch-CPU kernels therefore
  mix freely in one plan with no copy between them.
- ``torch_cuda_<op>`` kernels run on device "cuda" and take and return torch CUDA tensors, so a
  chain of them stays on the GPU; values cross between host and GPU only through the copy_to
  kernels (``tensor_graphs.kernels.copy``: ``copy_host_to_cuda``, ``copy_cuda_to_host``).
  They are registered only when a GPU is usable. ``Kernel.__call__`` checks numpy dtypes, so
  callers run CUDA kernels through ``kernel.fn`` after checking ``kernel.constraint_failure``
  with ``convert.dtype_of`` (the runtime and the verifier know a kernel's device).
- Kernels never set thread counts: ``tensor_graphs.threads`` holds the one setting, and it is
  applied to torch when torch is first imported (``convert.Lazy``).

Importing this package never imports torch (seconds at startup): the CPU kernels are
registered when torch is installed and import it on first call. The CUDA kernels need to know
whether a GPU is usable, which means importing torch, so that question is asked only of a torch
build made for a GPU (CUDA or ROCm), read from ``torch/version.py`` without importing it.
Without torch, nothing here is registered and importing ``tensor_graphs.kernels`` still works.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys

from tensor_graphs.devices import simulated_cuda


def available() -> bool:
    """True when torch is installed (it is imported only when a kernel first runs)."""
    if "torch" in sys.modules:
        return sys.modules["torch"] is not None
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def _gpu_build() -> bool:
    """Whether the installed torch was built for a GPU, without importing it."""
    try:
        spec = importlib.util.find_spec("torch")
        folder = list(spec.submodule_search_locations or [])[0]
        with open(os.path.join(folder, "version.py")) as f:
            text = f.read()
    except (ImportError, ValueError, OSError, IndexError, AttributeError):
        return True  # cannot tell: ask torch itself
    return re.search(r"^(cuda|hip)\b[^=\n]*=\s*['\"]", text, re.M) is not None


def cuda_available() -> bool:
    """True when torch can run on a GPU here (imports torch only for a GPU build of it), or
    the simulated GPU is on (``devices.simulated_cuda``: its tensors are CPU tensors)."""
    if not available():
        return False
    if simulated_cuda() is not None:
        return True
    if "torch" not in sys.modules and not _gpu_build():
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


if available():
    from tensor_graphs.kernels.torch import base as _base

    _base.CUDA = cuda_available()
    from tensor_graphs.kernels.torch import ops as _ops  # noqa: F401  (registers the kernels)
    from tensor_graphs.kernels.torch import pointwise as _pointwise  # noqa: F401
    from tensor_graphs.kernels.torch import random as _random  # noqa: F401  (Philox on device)

    if _base.CUDA:
        from tensor_graphs.kernels.torch import state as _state

        _state.register()  # kept states (KV caches) appended in place on the GPU
