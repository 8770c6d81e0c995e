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
(``TRITON_INTERPRET=1``) before triton is imported and before a kernel is decorated. This
module is the one place that knows it, for the generated kernels and the hand-written templates
(``templates/``) alike: ``load`` imports triton that way, ``float_dtypes`` leaves out what the
interpreter computes wrong (bfloat16), and ``require_compiler`` refuses an ahead-of-time compile
in a process whose triton is the interpreter's.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

from tensor_graphs.devices import simulated_cuda
from tensor_graphs.errors import DeviceError

INTERPRET = "TRITON_INTERPRET"  # Triton's switch to its interpreter (kernels on CPU tensors)
FP_FUSION = "TRITON_DEFAULT_FP_FUSION"  # 3.9 warns while unset; kernels that must not fuse
# multiply-adds (the generated ones) say enable_fp_fusion=False at launch and compile
FLOAT_DTYPES = ("float32", "float16", "bfloat16")
# the interpreter computes these on raw bits (bfloat16 2.5 + 2.0 gave -2.9e-39): not run there
WRONG_IN_INTERPRETER = frozenset({"bfloat16"})


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


def float_dtypes() -> tuple[str, ...]:
    """The float dtypes Triton kernels take here: all on a real GPU, those the interpreter
    computes right on the simulated one (tests and registrations ask, so neither offers a
    kernel the interpreter would get wrong)."""
    if interpreted():
        return tuple(d for d in FLOAT_DTYPES if d not in WRONG_IN_INTERPRETER)
    return FLOAT_DTYPES


def load():
    """The triton module, imported with the interpreter switched on when the GPU is
    simulated (the switch is read when triton is imported: its own library kernels, tl.sum
    and the like, are decorated then; and when a kernel is decorated). A triton imported
    earlier without the switch cannot run interpreted kernels: ``DeviceError`` says so."""
    if interpreted():
        os.environ[INTERPRET] = "1"
    os.environ.setdefault(FP_FUSION, "1")  # Triton's default, said aloud (see FP_FUSION)
    import triton

    if interpreted() and not _library_interpreted(triton):
        raise DeviceError("triton was imported before the simulated GPU switched on its "
                          "interpreter, so its kernels cannot run on CPU tensors: import "
                          f"tensor_graphs before triton, or set {INTERPRET}=1 with "
                          "TG_SIMULATED_CUDA=1")
    return triton


def require_compiler():
    """The triton module for ahead-of-time compiles (``aot.py``): Triton's compiler cannot
    compile kernels that call its library functions as the interpreter decorated them (``tl.sum``
    fails with "'value' object has no attribute 'dtype'"), so a process running the interpreter
    is refused with the way out instead of failing every compile."""
    env = os.environ.get(INTERPRET, "0") not in ("", "0")
    if interpreted() or env or ("triton" in sys.modules and _library_interpreted(load())):
        why = ("the simulated GPU (TG_SIMULATED_CUDA) runs Triton's interpreter" if
               interpreted() else f"{INTERPRET} is set" if env else
               f"triton was imported with {INTERPRET} set")
        raise DeviceError(f"ahead-of-time Triton compiles need Triton's compiler, and {why} "
                          "in this process: run it in a process without TG_SIMULATED_CUDA and "
                          f"{INTERPRET} (env -u TG_SIMULATED_CUDA -u {INTERPRET} tg kernels "
                          "compile --arch sm_90)")
    return load()


def _library_interpreted(triton) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(triton.language.sum, InterpretedFunction)


if interpreted():  # before anything imports triton (torch's compiler may, later)
    os.environ.setdefault(INTERPRET, "1")


__all__ = ["FLOAT_DTYPES", "INTERPRET", "WRONG_IN_INTERPRETER", "float_dtypes", "installed",
           "interpreted", "load", "require_compiler", "usable"]
