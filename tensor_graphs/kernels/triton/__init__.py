"""Triton kernels rendered from the generated-kernel regions: device "cuda", backend "triton".

The regions of ``kernels/c/codegen.py`` (elementwise) and ``kernels/c/rowgen.py`` (row
reductions with their prologue and epilogue) are backend-neutral sets of IR nodes. This package
renders the same region objects as Triton source (``render.py``, ``rows.py``), writes it to a
file named by its hash and imports it (``build.py``: Triton refuses code made with ``exec``),
checks each kernel against the float64 reference before it is ever timed (``check.py``) and
offers one planner candidate per launch configuration (``generate.py``, rows of
``kernels.generated.generators()``). ``aot.py`` compiles every kernel and configuration ahead of
time for a GPU target (``tg kernels compile --arch sm_90``), which needs no GPU.

Without a GPU, ``TG_SIMULATED_CUDA=1`` makes "cuda:0" a device in host memory: its tensors are
torch CPU tensors and these kernels run in Triton's interpreter, which must be switched on
(``TRITON_INTERPRET=1``) before triton is imported and before a kernel is decorated: ``load``
does that. The interpreter computes with numpy, so bfloat16 (which it gets wrong) is not
rendered there.
"""

from __future__ import annotations

import functools
import importlib.util
import os

from tensor_graphs.devices import simulated_cuda

INTERPRET = "TRITON_INTERPRET"  # Triton's switch to its interpreter (kernels on CPU tensors)


@functools.lru_cache(maxsize=1)
def installed() -> bool:
    """Whether triton and torch can be imported (neither is imported here)."""
    try:
        return all(importlib.util.find_spec(m) is not None for m in ("triton", "torch"))
    except (ImportError, ValueError):
        return False


def interpreted() -> bool:
    """Whether kernels run in Triton's interpreter: the GPU is the simulated one."""
    return simulated_cuda() is not None


def usable() -> bool:
    """Whether Triton kernels can run here: triton installed and a GPU, real or simulated
    (a real one is asked of torch only when torch was built for one)."""
    if not installed():
        return False
    if interpreted():
        return True
    from tensor_graphs.kernels import torch as torch_kernels

    return torch_kernels.cuda_available()


def load():
    """The triton module, imported with the interpreter switched on when the GPU is
    simulated (the switch is read when triton is imported: its own library kernels, tl.sum
    and the like, are decorated then; and when a kernel is decorated). A triton imported
    earlier without the switch cannot run interpreted kernels: ``DeviceError`` says so."""
    if interpreted():
        os.environ[INTERPRET] = "1"
    import triton

    if interpreted():
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(triton.language.sum, InterpretedFunction):
            from tensor_graphs.errors import DeviceError

            raise DeviceError("triton was imported before the simulated GPU switched on its "
                              "interpreter, so its kernels cannot run on CPU tensors: import "
                              f"tensor_graphs before triton, or set {INTERPRET}=1 with "
                              "TG_SIMULATED_CUDA=1")
    return triton


if interpreted():  # before anything imports triton (torch's compiler may, later)
    os.environ.setdefault(INTERPRET, "1")


__all__ = ["INTERPRET", "installed", "interpreted", "load", "usable"]
