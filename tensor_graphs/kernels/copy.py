"""copy_to kernels: a value moved to another device is a kernel like any other.

How copies are represented
- A copy kernel has the pattern ``copy_to(x)`` and backend "copy". Its ``where`` constraint
  accepts the node's target (the ``device`` attribute: "cpu", "cuda", "cuda:N") by kind, and
  its ``device`` is the kind of memory its *result* lives in.
- Where the value comes from is not in the graph (the planner decides where each value lives),
  so every copy kernel also has a route, ``placement(kernel) -> (source kind, target kind)``,
  and ``route(source, target)`` names the kernel for a move between two devices. For other
  kernels ``placement`` is ``(kernel.device, kernel.device)``: inputs and result on its device.
- ``cost_hint(kernel)`` is 0.0 for a move within one device's memory (nothing is copied, so
  nothing needs measuring) and None otherwise: the planner costs a real copy from the database
  like any kernel, by its input signature (shape, dtype).

Devices, not backends, own memory: numpy, C and torch-CPU kernels all take and return host
numpy arrays (torch views them without copying), so no copy is ever needed between those
backends. ``copy_same_memory`` covers a ``copy_to`` whose value is already on its target: it
returns its input (a view, zero cost). With a usable GPU (torch with CUDA):
``copy_host_to_cuda`` (numpy array -> torch CUDA tensor), ``copy_cuda_to_host`` (-> numpy),
``copy_cuda_to_cuda`` (between two GPUs) and ``copy_same_memory_cuda``. The cross-device
copies write into ``out=`` (their place in the target's arena) when given, and their results
are C-contiguous; the values are the same bits (``EXACT``).

Host<->GPU copies go through the GPU's staging buffer (``kernels/staging.py``: page-locked
on a real GPU, so a move to the GPU need not wait for it).
"""

from __future__ import annotations

import numpy as np

from tensor_graphs.devices import as_device, torch_device
from tensor_graphs.errors import ArgumentError, DeviceError
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.registry import Kernel, kernel
from tensor_graphs.kernels.staging import SMALL_TO_HOST, staging

EXACT = 1e-12

ROUTES: dict[str, tuple[str, str]] = {}  # kernel name -> (source kind, target kind)
SAME_MEMORY: set[str] = set()  # copies that move nothing (cost 0)


def _kind(device) -> str:
    return str(device).partition(":")[0]


def _to(kind: str):
    """A where-constraint: the copy_to node's target device is of this kind."""

    def target_is(shapes, dtypes, attrs):
        target = attrs.get("device", "cpu")
        return True if _kind(target) == kind else f"copies to {kind}, not to {target!r}"

    target_is.__name__ = f"target_is_{kind}"
    return target_is


def _signatures(target: str):
    """Verification cases with the target device set (the generic copy_to cases go to cpu)."""
    device = "cpu" if target == "cpu" else "cuda:0"
    shapes = [(1,), (7, 33), (1025,), (), (2, 3, 4)]
    return [{"x": (s, dt), "attrs": {"device": device}}
            for dt in ("float32", "bfloat16", "int64", "bool") for s in shapes]


def copy_kernel(name: str, source: str, target: str, same_memory: bool = False,
                writes_out: bool = False):
    """Register ``fn`` as the copy kernel ``name`` for moves from ``source`` to ``target``.
    ``writes_out``: fn takes ``out=`` (its place in the target's arena) and copies into it."""

    def decorate(fn) -> Kernel:
        k = kernel("copy_to", backend="copy", name=name, device=target, where=_to(target),
                   tolerance=EXACT, view=same_memory, writes_out=writes_out,
                   signatures=None if target == "cpu" else _signatures(target))(fn)
        ROUTES[name] = (source, target)
        if same_memory:
            SAME_MEMORY.add(name)
        return k

    return decorate


@copy_kernel("copy_same_memory", "cpu", "cpu", same_memory=True)
def copy_same_memory(x):
    """The value is already in host memory: numpy, C and torch-CPU kernels share it as is."""
    return np.asarray(x)  # the array itself (a numpy scalar becomes a 0-d array)


def _register_cuda() -> None:
    @copy_kernel("copy_same_memory_cuda", "cuda", "cuda", same_memory=True)
    def copy_same_memory_cuda(x):
        """The value is already on this GPU."""
        return x

    @copy_kernel("copy_host_to_cuda", "cpu", "cuda", writes_out=True)
    def copy_host_to_cuda(x, device, *, out=None):
        """numpy array -> torch tensor on the target GPU (viewed as a CPU tensor first), into
        ``out`` (its arena place) when given; C-contiguous either way."""
        return _moved(x, device, out)

    @copy_kernel("copy_cuda_to_host", "cuda", "cpu", writes_out=True)
    def copy_cuda_to_host(x, *, out=None):
        """torch CUDA tensor -> numpy array in host memory: ``out`` when given, else a new
        array numpy owns (a program hands it back without copying it again)."""
        return _to_host(x, out)

    @copy_kernel("copy_cuda_to_cuda", "cuda", "cuda", writes_out=True)
    def copy_cuda_to_cuda(x, device, *, out=None):
        """Between two GPUs (peer to peer where the driver allows)."""
        return _moved(x, device, out)


def _moved(x, device, out=None):
    """x on ``device`` (a GPU), always a new C-contiguous tensor, or ``out`` filled
    (``Tensor.to`` returns x itself when it is already there, and keeps a permuted layout).
    A host array crosses through the GPU's staging buffer; a tensor (another GPU's) directly."""
    from tensor_graphs.kernels.torch import convert

    if not convert.is_tensor(x):
        x = np.asarray(x)
        stage = staging(device)
        if stage.takes(x.dtype):
            return stage.to_gpu(x, device, out)
    return _direct(x, device, out)


def _direct(x, device, out=None):
    """The move without staging (``Tensor.copy_``: synchronous from pageable memory)."""
    from tensor_graphs.kernels.torch import convert

    t = convert.to_torch(x)
    if out is None:
        out = convert.torch.empty(tuple(t.shape), dtype=t.dtype, device=torch_device(device))
    if out.numel():
        out.copy_(t)
    return out


def _to_host(x, out=None) -> np.ndarray:
    """x (a GPU tensor) in host memory: ``out`` filled, or a new array numpy owns."""
    if hasattr(x, "element_size") and x.numel() * x.element_size() >= SMALL_TO_HOST:
        stage = staging(str(x.device))
        if stage.takes(x.dtype):
            return stage.to_host(x, out)
    return _direct_to_host(x, out)


def _direct_to_host(x, out=None) -> np.ndarray:
    """The move back without staging (the driver stages it through its own buffers)."""
    from tensor_graphs.kernels.torch import convert

    if out is None:
        out = np.empty(tuple(x.shape), convert.numpy_dtype(x))
    if out.size:
        convert.to_torch(out).copy_(convert.to_torch(x))
    return out


def _cuda_usable() -> bool:
    try:
        from tensor_graphs.kernels.torch import cuda_available
    except ImportError:  # pragma: no cover - the package is always there
        return False
    return cuda_available()


if _cuda_usable():
    _register_cuda()


def placement(k: Kernel) -> tuple[str, str]:
    """(where the kernel's inputs live, where its result lives), as device kinds."""
    return ROUTES.get(k.name, (k.device, k.device))


def cost_hint(k: Kernel) -> float | None:
    """0.0 for a copy that moves nothing; None when the cost must come from measurements."""
    return 0.0 if k.name in SAME_MEMORY else None


def route(source, target) -> Kernel:
    """The copy kernel that moves a value from device ``source`` to device ``target``
    (Devices or names: "cpu", "cuda:0"). Raises DeviceError when no kernel can."""
    src, dst = as_device(source), as_device(target)
    if src.name == dst.name:
        return route_kind(src.kind, src.kind)
    if src.kind == dst.kind:  # two GPUs
        return _registered("copy_cuda_to_cuda", src.name, dst.name)
    return route_kind(src.kind, dst.kind)


_BY_KINDS = {("cpu", "cpu"): "copy_same_memory", ("cuda", "cuda"): "copy_same_memory_cuda",
             ("cpu", "cuda"): "copy_host_to_cuda", ("cuda", "cpu"): "copy_cuda_to_host"}


def route_kind(source: str, target: str) -> Kernel:
    """The copy kernel between device kinds (the planner's view: "cpu", "cuda"); the same
    kind means the value is already there."""
    return _registered(_BY_KINDS[(source, target)], source, target)


def _registered(name: str, source: str, target: str) -> Kernel:
    try:
        return registry.get(name)
    except ArgumentError:
        raise DeviceError(f"no copy kernel from {source} to {target}: {name} is not "
                          "registered (it needs torch with a usable CUDA GPU)") from None
