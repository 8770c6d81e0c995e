"""Where a measured call's values live, and how its time is waited for.

A CPU kernel takes and returns host arrays and finishes before it returns. A GPU kernel (a
torch CUDA kernel, a generated Triton kernel) takes torch tensors in the GPU's memory and only
*queues* its work: the call returns after the launch, so a clock read around back-to-back
calls would time launches, not the kernel, and every GPU kernel would look as cheap as its
launch. So a GPU call's inputs are made on the host and moved to the GPU once, outside the
timing (``to_device``), its result is brought back for the check against the reference
(``to_host``), and its samples are taken with the device synchronized before and after
(``sync``). A copy between the host and a GPU reads its input where the copy starts
(``copies.placement``): a host array for ``copy_host_to_cuda``, a GPU tensor for
``copy_cuda_to_host``, so each is timed as the real move it makes.

The simulated GPU (``devices.simulated_cuda``) keeps its tensors in host memory and runs torch
ops synchronously: the same path with nothing to wait for (its times are CPU times).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tensor_graphs.devices import cuda_available, simulated_cuda, torch_device
from tensor_graphs.errors import DeviceError
from tensor_graphs.kernels import copy as copies


@dataclass(frozen=True)
class DeviceIO:
    """How to call one kernel: ``to_device`` moves a host input to where it reads it,
    ``to_host`` brings a result back as a numpy array, ``sync`` (or None) waits for the work
    queued so far."""

    to_device: Callable
    to_host: Callable
    sync: Callable[[], None] | None


HOST = DeviceIO(lambda a: a, np.asarray, None)


def on_gpu(kernel) -> bool:
    """Whether ``kernel`` reads or writes a GPU's memory (a GPU kernel, or a copy to or from
    one)."""
    return "cuda" in copies.placement(kernel)


def device_io(kernel) -> DeviceIO:
    """The ``DeviceIO`` of ``kernel``; raises DeviceError for a GPU kernel without a usable
    GPU (real or simulated)."""
    if not on_gpu(kernel):
        return HOST
    if not cuda_available():
        raise DeviceError(f"kernel {kernel.name} runs on a GPU and none is usable here (no "
                          "CUDA-enabled torch or no GPU); measure it on a GPU machine, or set "
                          "TG_SIMULATED_CUDA=1 to exercise the path with CPU timings")
    from tensor_graphs.kernels.torch import convert

    source, _ = copies.placement(kernel)
    where = torch_device("cuda")

    def to_device(a):
        return convert.to_cuda(a, where) if source == "cuda" else a

    sync = None if simulated_cuda() is not None else _synchronize
    return DeviceIO(to_device, convert.to_host, sync)


def _synchronize() -> None:
    import torch

    torch.cuda.synchronize()
