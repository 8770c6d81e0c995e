"""How the templates reach Triton and torch: lazily, through ``kernels/triton``'s ``load``.

Importing tensor_graphs never imports triton or torch: the jit modules (``*_jit.py``, the
``@triton.jit`` functions, beside this file) are imported on a kernel's first call by ``jit``.
Triton decides at decoration time whether a ``@triton.jit`` function is compiled or
interpreted (``TRITON_INTERPRET``), so ``jit`` imports triton through the package's ``load``
first, which switches the interpreter on under the simulated GPU (``TG_SIMULATED_CUDA``, whose
tensors are CPU tensors) and leaves the variable as the user set it on a real GPU; the same
``load`` serves the generated kernels, so the two cannot disagree about the mode. The AOT
compile (``targets.py``) imports the same modules after ``require_compiler``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from tensor_graphs.kernels.torch.convert import Lazy, is_tensor, to_torch
from tensor_graphs.kernels.triton import float_dtypes, interpreted, load

torch = Lazy("torch", globals(), "torch")

HERE = Path(__file__).resolve().parent

# fp32 tl.dot on a GPU with input_precision="tf32" rounds both operands to 10-bit mantissas
# (unit roundoff 2**-11): products lose ~5e-4 each, a norm-wise ~3e-4 on random data. Declared
# with a margin; exact in the interpreter, where tl.dot is numpy's matmul.
TF32 = 2e-3
# fp32 accumulation of exact products (fp16/bf16 operands, or fp32 with "ieee"), online
# softmax: the same bound as torch's reductions (measured below 1e-6 up to 1025 terms).
REDUCTION = 1e-5
ELEMENTWISE = 1e-6  # a few fp32 ulps: RoPE's x * cos +- x' * sin in fp32, rounded once
EXACT = 1e-12  # a gather moves bits


_LOADED: dict = {}


def jit(module: str):
    """The jit module ``module`` (``matmul_jit``...), imported on first use, after triton is
    (``load``: interpreted under the simulated GPU). Kept after the first call: a kernel's host
    side runs at every launch."""
    found = _LOADED.get(module)
    if found is None:
        load()
        found = _LOADED[module] = importlib.import_module(f"{__package__}.{module}")
    return found


def source_text(module: str) -> str:
    """The jit module's source, read without importing it: part of each kernel's source hash,
    so measurements of an edited template stop counting."""
    return (HERE / f"{module}.py").read_text()


def register_configs(pattern, module: str, configs, prefix: str, make_run: Callable,
                     per_config: Callable | None = None, **declared) -> None:
    """Each config of a one-kernel template as a GPU kernel ``<prefix>_<label>`` on
    ``pattern``: ``make_run(cfg)`` its function (``fn(*tensors, **attrs, out=None)``), the jit
    module's source and the config in its hash; ``declared``: the registry's other
    arguments, and ``per_config(cfg, name)`` those that differ by config (a ``where`` naming
    the kernel, an ``occupancy``)."""
    from tensor_graphs.kernels.registry import kernel

    text = source_text(module)
    for cfg in configs:
        name = f"{prefix}_{cfg.label}"
        run = make_run(cfg)
        run.source_text = f"{text}\n# {name}: {cfg}"
        own = per_config(cfg, name) if per_config is not None else {}
        kernel(pattern, backend="triton", name=name, device="cuda", writes_out=True,
               **declared, **own)(run)


def as_tensor(out):
    """``out`` as a torch tensor: itself, or a numpy buffer (the simulated GPU's arena)
    viewed as one."""
    return out if is_tensor(out) else to_torch(out)


def target(shape: tuple, like, out=None, dtype=None):
    """The tensor a kernel writes its result to: ``out`` (a torch tensor, or a numpy buffer
    viewed as one: the simulated GPU's arena is host memory) when it is contiguous memory on
    ``like``'s device, else a new tensor of ``like``'s device and ``dtype`` (default
    ``like``'s: an index result, argmax's, is int64)."""
    dtype = like.dtype if dtype is None else dtype
    if out is not None:
        t = as_tensor(out)
        if t.device == like.device and t.is_contiguous() and t.dtype == dtype:
            return t
    return torch.empty(tuple(shape), dtype=dtype, device=like.device)


def deliver(written, out=None):
    """What a ``writes_out`` kernel returns: ``out`` itself (``written`` copied into it when
    the kernel could not write there), or ``written`` when no ``out`` was given."""
    if out is None:
        return written
    t = as_tensor(out)
    if t.device != written.device or t.data_ptr() != written.data_ptr():
        t.copy_(written)
    return out


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


# Split kernels (decode attention's keys, the GEMV's K) split until their grid has this many
# programs: two waves of an H100's 132 SMs, so no SM idles for want of work
PROGRAMS = 2 * 132

# CUDA launches at most 2**31 - 1 blocks on grid axis 0 and 65535 on axes 1 and 2: every
# template puts its programs on axis 0 (or a bounded count, such as decode's splits, on axis 1)
MAX_PROGRAMS = 2**31 - 1


def grid_fits(name: str, programs: int, shape: tuple) -> bool | str:
    """True when ``programs`` fit CUDA's grid axis 0, else the refusal the planner reads (it
    then takes another kernel on the pattern, torch's)."""
    if programs <= MAX_PROGRAMS:
        return True
    return (f"{name}: shape {tuple(shape)} needs {programs} programs, past CUDA's grid limit of "
            f"{MAX_PROGRAMS} blocks; torch's CUDA kernel on the same pattern covers it")


# Arrival counters of the kernels whose last program finishes a split reduction (the GEMV's
# split-K): int32 zeros per device, each call setting back to 0 what it counted. Buffers are
# never freed (a graph captured with one keeps its address); a larger one is made only outside
# a capture, where memory is the graph's own.
_COUNTERS: dict = {}
MIN_COUNTERS = 1 << 14


def arrival_counters(device, count: int):
    """At least ``count`` zeroed int32 counters on ``device``, or None during a CUDA graph's
    capture when the ones made so far are too few (the caller then launches a second kernel
    to finish, as before). Kernels on a device run in its stream's order (the runtime
    launches on the current stream), so calls never share a counter at the same time."""
    made = _COUNTERS.setdefault(str(device), [])
    if made and made[-1].numel() >= count:
        return made[-1]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    made.append(torch.zeros(max(MIN_COUNTERS, next_power_of_2(count)), dtype=torch.int32,
                            device=device))
    return made[-1]


# Programmatic dependent launch (Hopper on): a kernel launched with it starts while the one
# before it on the stream ends and waits for it in its code (``gdc_wait``), so what it reads
# that no kernel writes (weights) is loaded meanwhile. False turns it off everywhere (to time
# a chain without it: benchmarks/gemv.py)
PDL = True
_PDL_FOUND: dict = {}


def pdl(device) -> dict:
    """The launch options of a kernel that takes ``PDL`` (a constexpr: it waits for the
    kernel before with ``gdc_wait``): ``{"PDL": True, "launch_pdl": True}`` on a real GPU of
    compute capability 9.0 or more with a Triton that has both, else ``{"PDL": False}``
    (the interpreter, older GPUs and Tritons: launched as before)."""
    if not PDL or device.type != "cuda" or interpreted():
        return {"PDL": False}
    index = device.index if device.index is not None else torch.cuda.current_device()
    found = _PDL_FOUND.get(index)
    if found is None:
        found = _PDL_FOUND[index] = torch.cuda.get_device_capability(index)[0] >= 9 \
            and _triton_has_pdl()
    return {"PDL": True, "launch_pdl": True} if found else {"PDL": False}


def _triton_has_pdl() -> bool:
    """``tl.extra.cuda.gdc_wait`` and the ``launch_pdl`` compile option (Triton 3.4 on)."""
    load()
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra import cuda
    except ImportError:
        return False
    return hasattr(cuda, "gdc_wait") and "launch_pdl" in getattr(
        CUDAOptions, "__dataclass_fields__", {})


def ints(*shapes) -> bool:
    """Every dim concrete (constraints are also asked at symbolic shapes)."""
    return all(isinstance(d, int) for s in shapes for d in s)


__all__ = ["ELEMENTWISE", "EXACT", "MAX_PROGRAMS", "PDL", "PROGRAMS", "REDUCTION", "TF32",
           "arrival_counters", "as_tensor", "deliver", "pdl", "register_configs",
           "float_dtypes", "grid_fits", "interpreted", "ints", "jit", "next_power_of_2",
           "source_text", "target", "torch"]
