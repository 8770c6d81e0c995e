"""numpy <-> torch without copies, and torch imported only when first used.

``to_torch`` views a numpy array as a CPU tensor (``torch.from_numpy``: same memory, any
non-negative strides, read-only arrays too); ``to_numpy`` views a CPU tensor as an array
(``Tensor.numpy``: same memory). bfloat16 travels as its 16 bits (an int16 view on both sides,
ml_dtypes' bfloat16 in numpy), so it is zero-copy too. Only arrays torch cannot describe are
copied: negative strides (``x[::-1]``), strides that are not a multiple of the item size, and
non-native byte order.

Importing torch costs seconds, so this package never imports it at ``import tensor_graphs``:
``torch`` here is a stand-in that imports the real module on first attribute access (the first
torch kernel call) and then replaces itself in the namespace that holds it. At that moment the
process-wide thread setting (``tensor_graphs.threads``) is applied to torch too; the kernels
never set thread counts themselves.
"""

from __future__ import annotations

import importlib
import warnings

import ml_dtypes
import numpy as np

from tensor_graphs.errors import DTypeError
from tensor_graphs.ir import dtypes as _dtypes

_BF16 = np.dtype(ml_dtypes.bfloat16)


class Lazy:
    """A module imported on first attribute access; it then replaces this stand-in under
    ``name`` in ``namespace`` (a module's globals), so later lookups cost nothing extra."""

    def __init__(self, module: str, namespace: dict, name: str):
        self._module, self._namespace, self._name = module, namespace, name

    def __getattr__(self, attr: str):
        module = importlib.import_module(self._module)
        if self._module.split(".")[0] == "torch":
            _on_torch_import()
        self._namespace[self._name] = module
        return getattr(module, attr)


_torch_ready = False


def _on_torch_import() -> None:
    """torch was just imported: it follows the thread count the user asked tensor_graphs for
    (tensor_graphs.threads.sync_torch); otherwise it keeps its own."""
    global _torch_ready
    if _torch_ready:
        return
    _torch_ready = True
    try:
        from tensor_graphs import threads
    except ImportError:  # pragma: no cover - threads is part of the package
        return
    threads.sync_torch()


torch = Lazy("torch", globals(), "torch")


_tensor_types: dict[type, bool] = {}  # a type -> whether its values are torch tensors


def is_tensor_type(kind: type) -> bool:
    """Whether values of ``kind`` are torch tensors: ``torch.Tensor`` and its subclasses
    (``nn.Parameter``, whose module is ``torch.nn.parameter``, was read as an array), told
    without importing torch and answered once per type."""
    found = _tensor_types.get(kind)
    if found is None:
        found = _tensor_types[kind] = any(k.__name__ == "Tensor" and k.__module__ == "torch"
                                          for k in kind.__mro__)
    return found


def is_tensor(value) -> bool:
    return is_tensor_type(type(value))


def to_torch(a):
    """A CPU tensor sharing memory with numpy array ``a`` (tensors pass through unchanged)."""
    global _readonly_seen
    if type(a) is not np.ndarray:
        if is_tensor(a):
            return a
        a = np.asarray(a)
    if a.dtype == _BF16:
        return to_torch(a.view(np.int16)).view(torch.bfloat16)
    if not a.flags.writeable and not _readonly_seen:
        # torch warns once per process that it cannot mark the tensor read-only; the kernels
        # never write to their inputs, so that first warning is silenced (and there is no other)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = _from_numpy(a)
        _readonly_seen = True
        return out
    return _from_numpy(a)


_readonly_seen = False


def _from_numpy(a: np.ndarray):
    try:
        return torch.from_numpy(a)
    except (ValueError, TypeError, RuntimeError):
        # negative strides (x[::-1]), strides that are not a multiple of the item size, or a
        # foreign byte order: torch cannot view these, so they are copied
        return torch.from_numpy(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("=")))


def to_numpy(t) -> np.ndarray:
    """A numpy array sharing memory with CPU tensor ``t``."""
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(_BF16)
    return t.numpy()


def to_host(value) -> np.ndarray:
    """Any tensor (CPU or CUDA) or array as a numpy array on the host (a copy from a GPU)."""
    if is_tensor(value):
        return to_numpy(value.detach().cpu())
    return np.asarray(value)


def to_cuda(value, device="cuda"):
    """A numpy array (or tensor) on torch device ``device`` (``"cuda"``, ``"cuda:1"``; the
    simulated GPU's is ``"cpu"``) with its strides kept, gaps and broadcast (stride-0) axes
    included. ``Tensor.to`` makes such a layout contiguous on another device, so kernels
    verified through it on a real GPU were never given the strided and broadcast inputs
    they are checked with on the simulated one (where ``.to("cpu")`` is the tensor itself)."""
    t = to_torch(value)
    if t.is_contiguous() or t.numel() == 0:
        return t.to(str(device))
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))  # the elements t reaches
    flat = torch.as_strided(t, (span,), (1,))  # from t's own storage offset
    return torch.as_strided(flat.to(str(device)), tuple(t.shape), t.stride())


def torch_dtype(dtype):
    """The torch dtype of one of our dtypes (a DType, its name or a numpy dtype)."""
    return getattr(torch, _TORCH_NAMES[_dtypes.as_dtype(dtype).name])


_TORCH_NAMES = {"bool": "bool", "uint8": "uint8", "int8": "int8", "int32": "int32",
                "int64": "int64", "float16": "float16", "bfloat16": "bfloat16",
                "float32": "float32", "float64": "float64"}


def numpy_dtype(value) -> np.dtype:
    """The numpy dtype of a numpy array or a torch tensor (ml_dtypes' for bfloat16). A torch
    dtype we do not have (complex64, uint16, float8_e4m3fn) is the one numpy or ml_dtypes
    gives it, so a feed of it meets the checks an array of it meets (a DTypeError naming the
    feed and the dtype it expects), not a KeyError here."""
    if is_tensor(value):
        name = str(value.dtype).removeprefix("torch.")
        if name not in _dtypes.BY_NAME:
            return _foreign_dtype(value.dtype, name)
    return dtype_of(value).np_dtype


def _foreign_dtype(dtype, name: str) -> np.dtype:
    """numpy's dtype for a torch dtype outside ours, else ml_dtypes' (the float8 kinds), else
    a DTypeError: a tensor numpy cannot describe at all (complex32, quantized)."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except (TypeError, RuntimeError):
        pass
    if isinstance(getattr(ml_dtypes, name, None), type):
        return np.dtype(getattr(ml_dtypes, name))
    raise DTypeError(f"a torch tensor of dtype {dtype} cannot be given to tensor_graphs (no "
                     f"numpy dtype holds it); convert it with .to() to one of "
                     f"{', '.join(_dtypes.BY_NAME)}")


def dtype_of(value) -> _dtypes.DType:
    """Our dtype of a numpy array or a torch tensor."""
    if is_tensor(value):
        return _dtypes.BY_NAME[str(value.dtype).removeprefix("torch.")]
    return _dtypes.as_dtype(np.asarray(value).dtype)
